#!/bin/sh
# A/B decode benchmark of two moonshine binaries on the issue-6 shapes (docs/performance.md):
#   qwen3_3l  tools/configs/qwen3_30b_a3b_3layers.json  (Qwen3-30B-A3B, 3 layers, 4.8 GB BF16)
#   dsmla_4l  tools/configs/deepseek_mla_4layers.json   (DeepSeek MLA at V2-Lite proportions, 4.5 GB)
#
#   tools/bench_ab.sh OLD_BIN NEW_BIN
#
# Synthesizes both into build/synth/NAME with OLD_BIN (moonshine synth --seed 1 --shard-mib 2048, as in
# docs/performance.md; skipped when build/synth/NAME/.bench_ab-stamp says it was made from the same
# config), then per shape runs `moonshine bench` alternately OLD, NEW, OLD, NEW, ... (PAIRS pairs)
# with the same flags (after WARMUP untimed OLD runs that settle the page cache) and prints one JSON
# object: per shape each run's decode_tok_s and decode_tok_per_cpu_s, the NEW/OLD ratio of each pair
# and the median of those ratios, plus the load average before and after. On the shared machine
# wall-clock tok/s moves 2-4x with the other users' load; the CPU-time ratio is the steadier one.
# Every bench line goes to build/bench_ab/runs.jsonl, bench's stderr to build/bench_ab/bench.log.
# Environment: PAIRS (3), WARMUP (1), PROMPT_TOKENS (16), GEN_TOKENS (48), THREADS (2), BENCH_FLAGS (extra flags
# for both binaries, e.g. "--static-load read"), SHAPES ("qwen3_3l dsmla_4l").
set -u
if [ $# -ne 2 ]; then
    echo "usage: $0 OLD_BIN NEW_BIN" >&2
    exit 2
fi
abspath() { case "$1" in /*) printf '%s\n' "$1";; *) printf '%s/%s\n' "$PWD" "$1";; esac; }
old=$(abspath "$1"); new=$(abspath "$2")
for b in "$old" "$new"; do [ -x "$b" ] || { echo "$0: $b: not executable" >&2; exit 2; }; done
cd "$(dirname "$0")/.." || exit 2
PAIRS=${PAIRS:-3}; WARMUP=${WARMUP:-1}; PROMPT_TOKENS=${PROMPT_TOKENS:-16}; GEN_TOKENS=${GEN_TOKENS:-48}; THREADS=${THREADS:-2}
BENCH_FLAGS=${BENCH_FLAGS:-}; SHAPES=${SHAPES:-"qwen3_3l dsmla_4l"}
flags="--prompt-tokens $PROMPT_TOKENS --gen-tokens $GEN_TOKENS --threads $THREADS${BENCH_FLAGS:+ $BENCH_FLAGS}"
out=build/bench_ab
mkdir -p "$out" build/synth || exit 2
runs=$out/runs.jsonl
: > "$runs"
: > "$out/bench.log"
t_start=$(date +%s)

config_of() {
    case "$1" in
    qwen3_3l) echo tools/configs/qwen3_30b_a3b_3layers.json;;
    dsmla_4l) echo tools/configs/deepseek_mla_4layers.json;;
    *) echo "$0: unknown shape $1" >&2; return 1;;
    esac
}

for shape in $SHAPES; do
    cfg=$(config_of "$shape") || exit 2
    dir=build/synth/$shape
    stamp="$(sha256sum < "$cfg" | cut -c1-64) --seed 1 --shard-mib 2048"
    if [ "$(cat "$dir/.bench_ab-stamp" 2>/dev/null)" != "$stamp" ]; then
        echo "bench_ab: synth $shape ($cfg)" >&2
        rm -rf "$dir"
        "$old" synth --config "$cfg" --out "$dir" --seed 1 --shard-mib 2048 >&2 || exit 1
        echo "$stamp" > "$dir/.bench_ab-stamp"
    fi
done
t_synth=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)

for shape in $SHAPES; do
    i=0
    while [ $i -lt "$WARMUP" ]; do
        i=$((i+1))
        echo "bench_ab: $shape warm-up $i" >&2
        # shellcheck disable=SC2086
        "$old" bench "build/synth/$shape" $flags >/dev/null 2>>"$out/bench.log" || {
            echo "$0: $old bench build/synth/$shape $flags failed (see $out/bench.log)" >&2; exit 1; }
    done
    i=0
    while [ $i -lt "$PAIRS" ]; do
        i=$((i+1))
        for side in old new; do
            if [ $side = old ]; then bin=$old; else bin=$new; fi
            echo "bench_ab: $shape pair $i $side" >&2
            # shellcheck disable=SC2086  # $flags word-splits on purpose
            line=$("$bin" bench "build/synth/$shape" $flags 2>>"$out/bench.log") || {
                echo "$0: $bin bench build/synth/$shape $flags failed (see $out/bench.log)" >&2; exit 1; }
            printf '{"shape":"%s","pair":%d,"side":"%s","bench":%s}\n' "$shape" $i $side "$line" >> "$runs"
        done
    done
done
t_end=$(date +%s)
load1=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$runs" "$old" "$new" "$flags" $((t_synth - t_start)) $((t_end - t_synth)) "$load0" "$load1" <<'EOF'
import json, statistics, sys
runs, old, new, flags, synth_s, bench_s, load0, load1 = sys.argv[1:9]
rows = [json.loads(l) for l in open(runs)]
shapes = {}
for r in rows:
    s = shapes.setdefault(r["shape"], {"old": [], "new": [], "old_cpu": [], "new_cpu": []})
    s[r["side"]].append(r["bench"]["decode_tok_s"])
    s[r["side"] + "_cpu"].append(r["bench"]["decode_tok_per_cpu_s"])
res = {}
for name, s in shapes.items():
    ratios = [n / o for o, n in zip(s["old"], s["new"])]
    cpu_ratios = [n / o for o, n in zip(s["old_cpu"], s["new_cpu"])]
    res[name] = {
        "old_decode_tok_s": s["old"], "new_decode_tok_s": s["new"],
        "ratios_new_over_old": [round(x, 4) for x in ratios],
        "median_ratio_new_over_old": round(statistics.median(ratios), 4),
        "old_decode_tok_per_cpu_s": s["old_cpu"], "new_decode_tok_per_cpu_s": s["new_cpu"],
        "median_cpu_ratio_new_over_old": round(statistics.median(cpu_ratios), 4),
    }
head = {"old": old, "new": new, "bench_flags": flags, "synth_s": int(synth_s), "bench_s": int(bench_s),
        "loadavg_before": load0, "loadavg_after": load1}
print("{" + json.dumps(head)[1:-1] + ',\n "shapes": {' + ",".join(
    "\n  %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in res.items()) + "}}")
EOF
