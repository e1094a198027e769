#!/bin/sh
# Run each libFuzzer target on its seed corpus (tests/fuzz/corpus/NAME: every
# input must pass), then mutate from it with seed FUZZ_SEED (default 1) for at
# most RUNS inputs and SECS seconds. A finding fails the run, except for targets
# named in FUZZ_OPEN (space-separated), which have a known open finding
# (tests/fuzz/open/README.md): theirs are reported, not fatal.
secs=$1; runs=$2; shift 2
seed=${FUZZ_SEED:-1}
st=0
for f in "$@"; do
    name=$(basename "$f")
    work=build/fuzz/corpus/$name; rm -rf "$work"; mkdir -p "$work"
    seeds=tests/fuzz/corpus/$name
    [ -d "$seeds" ] || seeds=""
    open=0
    for o in $FUZZ_OPEN; do [ "$o" = "$name" ] && open=1; done
    if [ -n "$seeds" ] && ! "$f" -runs=0 -timeout=10 -rss_limit_mb=2048 "$seeds" >build/fuzz/$name.seeds.log 2>&1; then
        tail -n 40 build/fuzz/$name.seeds.log; echo "FUZZ SEED CORPUS FAILS in $name"; st=1; continue
    fi
    echo "fuzz $name: seeds pass; mutating with seed $seed, at most $runs runs / ${secs}s"
    if ! "$f" -seed="$seed" -runs="$runs" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
         -print_final_stats=0 -artifact_prefix=build/fuzz/ "$work" $seeds >build/fuzz/$name.log 2>&1; then
        tail -n 20 build/fuzz/$name.log
        if [ $open = 1 ]; then
            echo "FUZZ FINDING in $name (known open finding, see tests/fuzz/open/README.md; not fatal)"
        else
            echo "FUZZ FINDING in $name (log: build/fuzz/$name.log)"; st=1
        fi
    fi
done
exit $st
