#!/bin/sh
# Run each unit test binary; each prints "N passed, N failed" on its last line.
pass=0; fail=0; bad=""
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    p=$(printf '%s' "$line" | sed -E 's/^([0-9]+) passed.*/\1/'); f=$(printf '%s' "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    [ -n "$p" ] || p=0; [ -n "$f" ] || f=0
    if [ $rc -ne 0 ] || [ "$f" -ne 0 ] || [ -z "$line" ]; then
        printf '%s\n' "$out"; echo "FAIL $t (rc=$rc)"; bad="$bad $t"; [ "$f" -eq 0 ] && f=1
    else
        echo "ok   $t ($p checks)"
    fi
    pass=$((pass + p)); fail=$((fail + f))
done
echo "unit: $pass passed, $fail failed"
[ -z "$bad" ]
