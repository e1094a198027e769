#!/bin/sh
# Run each libFuzzer target from its seed corpus (tests/fuzz/corpus/NAME) with a
# fixed seed for at most RUNS inputs and SECS seconds. The fixed seed and a fresh
# work corpus make `make check` reproducible: what passed here passes in CI
# (set FUZZ_SEED to explore new inputs; findings are kept under build/fuzz).
secs=$1; runs=$2; shift 2
seed=${FUZZ_SEED:-1}
st=0
for f in "$@"; do
    name=$(basename "$f")
    work=build/fuzz/corpus/$name; rm -rf "$work"; mkdir -p "$work"
    seeds=tests/fuzz/corpus/$name
    [ -d "$seeds" ] || seeds=""
    echo "fuzz $name: seed $seed, at most $runs runs / ${secs}s"
    if ! "$f" -seed="$seed" -runs="$runs" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
         -print_final_stats=0 -artifact_prefix=build/fuzz/ "$work" $seeds >build/fuzz/$name.log 2>&1; then
        tail -n 40 build/fuzz/$name.log; echo "FUZZ FINDING in $name (log: build/fuzz/$name.log)"; st=1
    fi
done
exit $st
