#!/bin/sh
# Per unique fixture dir and dtype: verify with --static-dtype D, then pack --static D into a
# temporary store and verify with --static-store; the two JSON lines must be identical.
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
same=0; diff=0
for sd in q8 fp8; do
  for d in $(cat tests/fixtures.list tests/fixtures-extra.list | grep -v '^#' | awk 'NF{print $1}' | awk '!s[$0]++'); do
    a=$(./build/moonshine verify $d --static-dtype $sd 2>/dev/null)
    rm -rf "$tmp/s"; ./build/moonshine pack $d --static $sd --out "$tmp/s" >/dev/null 2>&1
    b=$(./build/moonshine verify $d --static-store "$tmp/s" 2>/dev/null)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then same=$((same+1)); else diff=$((diff+1)); echo "DIFFERENT $sd $d"; fi
  done
done
echo "static store vs requantized at load: $same identical, $diff different"
[ $diff -eq 0 ]
