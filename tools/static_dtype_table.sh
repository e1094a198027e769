#!/bin/sh
# one verify per unique fixture dir (first line's flags ignored: plain resident) per dtype
cd "$(dirname "$0")/.."
for sd in q8 fp8; do
  cat tests/fixtures.list tests/fixtures-extra.list | grep -v '^#' | awk 'NF{print $1}' | awk '!s[$0]++' | while read d; do
    out=$(./build/moonshine verify $d --static-dtype $sd 2>/dev/null); echo "$d $out"
  done
done
