#!/bin/sh
# moonshine verify on every fixture the engine supports (tests/fixtures.list, then the trained
# demo model's lines in tests/fixtures-demo.list, then the requantized static tiers of
# tests/fixtures-static.list), with the extra flags each line gives.
# Lines: FIXTURE_DIR [FLAGS...]. Arguments: the lists to run instead of those three.
pass=0; fail=0
for list in ${*:-tests/fixtures.list tests/fixtures-demo.list tests/fixtures-static.list}; do
while read -r dir flags; do
    case "$dir" in ''|'#'*) continue;; esac
    out=$(${MOONSHINE:-./build/moonshine} verify $dir $flags 2>&1); rc=$?
    if [ $rc -eq 0 ]; then pass=$((pass+1)); echo "ok   $out"
    else fail=$((fail+1)); echo "FAIL $dir $flags"; printf '%s\n' "$out" | tail -n 5; fi
done < $list
done
echo "fixtures: $pass passed, $fail failed"
[ $fail -eq 0 ]
