#!/bin/sh
# Bit-identity of the CPU logits against a recorded baseline.
#
#   tests/scripts/logits_identical.sh --record BASE_DIR [MOONSHINE]   record a baseline
#   tests/scripts/logits_identical.sh BASE_DIR [MOONSHINE]            compare with it (cmp)
#
# For every line of tests/fixtures.list and then tests/fixtures-extra.list (FIXTURE_DIR [FLAGS],
# run exactly as tests/scripts/run_fixtures.sh runs them, streamed variants included), runs
#   MOONSHINE verify FIXTURE_DIR FLAGS --dump-logits FILE
# (MOONSHINE defaults to $MOONSHINE, then ./build/moonshine). The n-th line (1-based, comments and
# blank lines skipped, both lists counted together) is BASE_DIR/<n>.bin: the raw little-endian F32
# logits verify computed (40 prefill rows, then 12 greedy-step rows). --record also writes
# BASE_DIR/index.txt ("n verify_rc FIXTURE_DIR FLAGS" per line); a compare checks each line against
# it, so an edited list or a changed verify exit status shows up as a failure, not as a silent
# comparison of the wrong fixtures. Prints one line per fixture and 'N passed, N failed';
# exits 1 on any difference.
record=0
if [ "$1" = --record ]; then record=1; shift; fi
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 [--record] BASE_DIR [MOONSHINE]" >&2
    exit 2
fi
abspath() { case "$1" in /*) printf '%s\n' "$1";; *) printf '%s/%s\n' "$PWD" "$1";; esac; }
base=$(abspath "$1")
bin=${2:-${MOONSHINE:-./build/moonshine}}
case "$bin" in */*) bin=$(abspath "$bin");; esac
cd "$(dirname "$0")/../.." || exit 2
[ -x "$bin" ] || command -v "$bin" >/dev/null || { echo "$0: $bin: not executable" >&2; exit 2; }

if [ $record -eq 1 ]; then
    mkdir -p "$base" || exit 2
    : > "$base/index.txt" || exit 2
else
    [ -f "$base/index.txt" ] || { echo "$0: $base/index.txt missing (record with --record first)" >&2; exit 2; }
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/logits_identical.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM

n=0; pass=0; fail=0
for list in tests/fixtures.list tests/fixtures-extra.list; do
    while read -r dir flags; do
        case "$dir" in ''|'#'*) continue;; esac
        n=$((n+1))
        out=$tmp/$n.bin
        [ $record -eq 1 ] && out=$base/$n.bin
        rm -f "$out"
        # word-split $flags on purpose, as run_fixtures.sh does
        # shellcheck disable=SC2086
        msg=$("$bin" verify $dir $flags --dump-logits "$out" 2>&1 </dev/null); rc=$?
        line="$n $rc $dir${flags:+ $flags}"
        what="$dir${flags:+ $flags}"
        if [ ! -s "$out" ]; then
            fail=$((fail+1)); echo "FAIL $n $what: no logits written (verify rc=$rc)"
            printf '%s\n' "$msg" | tail -n 3 | sed 's/^/     /'
            [ $record -eq 1 ] && echo "$line" >> "$base/index.txt"
            continue
        fi
        if [ $record -eq 1 ]; then
            echo "$line" >> "$base/index.txt"
            pass=$((pass+1))
            note=; [ $rc -ne 0 ] && note=", verify rc=$rc"
            echo "rec  $n $what ($(wc -c < "$out") bytes$note)"
            continue
        fi
        want=$(sed -n "${n}p" "$base/index.txt")
        if [ "$want" != "$line" ]; then
            fail=$((fail+1)); echo "FAIL $n $what: index.txt has \"$want\", this run is \"$line\""
        elif [ ! -f "$base/$n.bin" ]; then
            fail=$((fail+1)); echo "FAIL $n $what: $base/$n.bin missing"
        elif c=$(cmp "$base/$n.bin" "$out" 2>&1); then
            pass=$((pass+1)); echo "same $n $what"
        else
            fail=$((fail+1)); echo "DIFF $n $what: $c"
        fi
    done < $list
done
if [ $record -eq 0 ]; then
    recorded=$(wc -l < "$base/index.txt")
    if [ "$recorded" -ne $n ]; then
        fail=$((fail+1)); echo "FAIL the baseline has $recorded fixtures, the lists $n"
    fi
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
