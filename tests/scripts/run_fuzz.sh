#!/bin/sh
# Run each libFuzzer target for a bounded time from its seed corpus (tests/fuzz/corpus/NAME).
secs=$1; shift
st=0
for f in "$@"; do
    name=$(basename "$f")
    work=build/fuzz/corpus/$name; mkdir -p "$work"
    seeds=tests/fuzz/corpus/$name
    [ -d "$seeds" ] || seeds=""
    echo "fuzz $name for ${secs}s"
    if ! "$f" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=0 "$work" $seeds >build/fuzz/$name.log 2>&1; then
        tail -n 40 build/fuzz/$name.log; echo "FUZZ FINDING in $name (log: build/fuzz/$name.log)"; st=1
    fi
done
exit $st
