#!/bin/sh
# Decode A/B of moonshine against llama.cpp on the same weights, interleaved (issue 17).
#
#   LLAMA_BENCH=/path/to/llama-bench tools/bench_llama_ab.sh CASE [CASE...]
#   CASE = LABEL=MODEL_DIR[+MOONSHINE_FLAGS]@GGUF   (flags: comma-separated, e.g.
#          mx_q8tier=/m/q3_mxfp4+--static-dtype,q8,--cpu-activations,q8@/g/q3_mxfp4_moe.gguf)
#
# Per case and per thread count (THREADS, default "1 2"): one untimed run of each side (page cache,
# warm-up), then PAIRS (3) pairs, moonshine then llama.cpp:
#   moonshine bench MODEL_DIR --prompt-tokens 16 --gen-tokens GEN --threads T FLAGS
#   llama-bench -m GGUF -p 0 -n GEN -d 16 -t T -r 1 -o jsonl        (decode after 16 tokens, as ours)
# and prints one JSON line per pair (both decode tok/s, the ratio moonshine / llama.cpp, the load
# average before the pair) and one summary line per case and thread count (median ratio, min, max).
# The machine is shared and noisy: read the ratios of runs taken side by side, not absolute tok/s.
# Before each case both sides' files are evicted from the page cache and read back the same way
# (dd iflag=nocache, then cat; RECACHE=0 skips it): how a file entered the page cache changes
# how fast it streams (on the Zen 4 VM the freshly written checkpoint's head read at 21-24 GB/s
# on one core, the freshly quantized GGUF's at 25-28, both 25-28 once re-read alike).
# GGUF files: tools/gguf_from_synth.py (BF16), then llama-quantize. Environment: MOONSHINE
# (build/moonshine), LLAMA_BENCH (required), THREADS, PAIRS, GEN (48), RECACHE (1). Logs go to
# build/bench_llama/.
set -u
[ $# -ge 1 ] || { echo "usage: LLAMA_BENCH=BIN $0 LABEL=MODEL_DIR[+FLAGS]@GGUF ..." >&2; exit 2; }
cd "$(dirname "$0")/.." || exit 2
ms=${MOONSHINE:-build/moonshine}
lb=${LLAMA_BENCH:?set LLAMA_BENCH to the llama-bench binary}
THREADS=${THREADS:-"1 2"}; PAIRS=${PAIRS:-3}; GEN=${GEN:-48}; RECACHE=${RECACHE:-1}
out=build/bench_llama; mkdir -p "$out" || exit 2
num() { printf '%s\n' "$1" | sed -n "s/.*\"$2\": *\([0-9.eE+-]*\).*/\1/p" | head -n 1; }
for c in "$@"; do
  label=${c%%=*}; rest=${c#*=}; gguf=${rest##*@}; spec=${rest%@*}
  dir=${spec%%+*}; flags=""; [ "$dir" != "$spec" ] && flags=$(printf '%s' "${spec#*+}" | tr ',' ' ')
  [ -d "$dir" ] && [ -f "$gguf" ] || { echo "$0: $label: $dir or $gguf missing" >&2; exit 2; }
  if [ "$RECACHE" = 1 ]; then
    for f in "$dir"/*.safetensors "$gguf"; do dd if="$f" iflag=nocache count=0 status=none; done
    cat "$dir"/*.safetensors "$gguf" > /dev/null
  fi
  for t in $THREADS; do
    # shellcheck disable=SC2086
    msrun() { "$ms" bench "$dir" --prompt-tokens 16 --gen-tokens "$GEN" --threads "$t" $flags 2>>"$out/moonshine.log" | tail -n 1; }
    lbrun() { "$lb" -m "$gguf" -p 0 -n "$GEN" -d 16 -t "$t" -r 1 -o jsonl 2>>"$out/llama.log" | tail -n 1; }
    msrun >/dev/null; lbrun >/dev/null
    ratios=""
    i=0
    while [ $i -lt "$PAIRS" ]; do
      i=$((i+1))
      load=$(cut -d' ' -f1 /proc/loadavg)
      a=$(msrun); b=$(lbrun)
      ta=$(num "$a" decode_tok_s); tb=$(num "$b" avg_ts)
      [ -n "$ta" ] && [ -n "$tb" ] || { echo "$0: $label t=$t: no figure (see $out/*.log)" >&2; exit 1; }
      r=$(awk -v a="$ta" -v b="$tb" 'BEGIN{printf "%.3f", a/b}')
      ratios="$ratios $r"
      printf '{"case":"%s","threads":%s,"pair":%d,"load1":%s,"moonshine_tok_s":%s,"moonshine_tok_per_cpu_s":%s,"llama_tok_s":%s,"ratio":%s}\n' \
        "$label" "$t" $i "$load" "$ta" "$(num "$a" decode_tok_per_cpu_s)" "$tb" "$r" | tee -a "$out/runs.jsonl"
    done
    ld=$(cut -d' ' -f1-3 /proc/loadavg)
    printf '%s\n' $ratios | sort -n | awk -v l="$label" -v t="$t" -v ld="$ld" \
      '{v[NR]=$1} END{m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2;
        printf "{\"case\":\"%s\",\"threads\":%s,\"median_ratio\":%.3f,\"min\":%s,\"max\":%s,\"load_after\":\"%s\"}\n", l, t, m, v[1], v[NR], ld}' \
      | tee -a "$out/summary.jsonl"
  done
done
