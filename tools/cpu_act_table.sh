#!/bin/sh
# The error of each --cpu-activations mode on every fixture run (issue 17: "the q8-activation
# error is reported per fixture"). Runs `moonshine verify DIR FLAGS --cpu-activations A` for A in
# f32 and each MODE on every line of tests/fixtures.list, tests/fixtures-extra.list and
# tests/fixtures-demo.list (the lines `make fixtures` and tests/scripts/logits_identical.sh run),
# and prints a Markdown table: per run the prompt-logits and generated-logits max abs error against
# the transformers reference of each mode, whether the greedy ids match, and verify's verdict
# (tolerance 1e-3). Rows where the modes give the same figures are identical by construction (q8
# only changes MXFP4 / INT4 / Q8 weights, bf16 only BF16 weights' decode matvecs). Read-only; exit 0.
#   tools/cpu_act_table.sh [MOONSHINE_BIN [MODE...]]   (default build/moonshine, modes: q8)
cd "$(dirname "$0")/.." || exit 2
bin=${1:-build/moonshine}
[ $# -gt 0 ] && shift
modes=${*:-q8}
field() { printf '%s\n' "$1" | sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p"; }
hdr="| fixture run | f32 logits / gen err |"; sep="| --- | --- |"
for m in $modes; do hdr="$hdr $m logits / gen err | $m ids match | $m verdict |"; sep="$sep --- | --- | --- |"; done
echo "$hdr"; echo "$sep"
for list in tests/fixtures.list tests/fixtures-extra.list tests/fixtures-demo.list; do
  while read -r dir flags; do
    case "$dir" in ''|'#'*) continue;; esac
    # shellcheck disable=SC2086
    f=$("$bin" verify "$dir" $flags --cpu-activations f32 2>/dev/null </dev/null | tail -n 1)
    row=$(printf '| `%s%s` | %s / %s |' "${dir#tests/}" "${flags:+ $flags}" \
      "$(field "$f" logits_max_abs_err)" "$(field "$f" gen_logits_max_abs_err)")
    for m in $modes; do
      # shellcheck disable=SC2086
      q=$("$bin" verify "$dir" $flags --cpu-activations "$m" 2>/dev/null </dev/null | tail -n 1)
      ok=$(field "$q" ok); [ "$ok" = true ] && v=pass || v=FAIL
      row="$row $(field "$q" logits_max_abs_err) / $(field "$q" gen_logits_max_abs_err) | $(field "$q" gen_ids_match) | $v |"
    done
    printf '%s\n' "$row"
  done < "$list"
done
