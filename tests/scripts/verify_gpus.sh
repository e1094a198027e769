#!/bin/sh
# moonshine verify on every fixture line (tests/fixtures.list, tests/fixtures-demo.list) with the
# model split over a device list: tests/scripts/verify_gpus.sh GPUS [FLAGS...], e.g.
#   tests/scripts/verify_gpus.sh 0,0 --backend cuda          (two stages on one GPU)
#   tests/scripts/verify_gpus.sh 2 --backend cuda --experts-split layer
#   tests/scripts/verify_gpus.sh 3 --backend cpu              (CPU backends as the devices)
# Lines with streaming flags are skipped (--gpus holds every expert resident); a configuration the
# split or the backend refuses by name ("not supported", "does not run") counts as refused, not failed.
gpus=${1:?usage: verify_gpus.sh GPUS [FLAGS...]}; shift
pass=0; fail=0; refused=0; skipped=0
for list in tests/fixtures.list tests/fixtures-demo.list; do
while read -r dir flags; do
    case "$dir" in ''|'#'*) continue;; esac
    case "$flags" in *--expert-cache-mib*|*--io*|*--store*|*--cache-policy*) skipped=$((skipped+1)); continue;; esac
    out=$(${MOONSHINE:-./build/moonshine} verify $dir $flags --gpus "$gpus" "$@" 2>&1); rc=$?
    if [ $rc -eq 0 ]; then pass=$((pass+1)); echo "ok   $(printf '%s\n' "$out" | tail -n 1)"
    elif printf '%s' "$out" | grep -q "not supported\|does not run"; then refused=$((refused+1)); echo "refused $dir: $(printf '%s\n' "$out" | grep "not supported\|does not run" | head -n 1)"
    else fail=$((fail+1)); echo "FAIL $dir $flags --gpus $gpus $*"; printf '%s\n' "$out" | tail -n 5; fi
done < $list
done
echo "verify --gpus $gpus $*: $pass passed, $fail failed, $refused refused, $skipped skipped (streaming lines)"
[ $fail -eq 0 ]
