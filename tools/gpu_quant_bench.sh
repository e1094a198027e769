#!/bin/bash
# The quantized-expert GPU figures of docs/gpu.md ("Quantized experts on the H200"), in one device
# call: the decode routed-expert kernels against the device copy (gpubench --routed), then
# synthetic Qwen3-30B-A3B checkpoints of 2 and 8 layers with FP8 and MXFP4 experts and the
# Kimi-Linear-48B-A3B 4-layer shape with MXFP4 experts, each benched with this tree's kernels and
# with the earlier ones (the A/B switches, same binary, interleaved).
#
#   tools/gpu_quant_bench.sh [BIN_DIR]     (BIN_DIR holds moonshine and gpubench; default build, build/gpu-cuda)
#
# Environment: OUT_DIR (synth checkpoints, default /tmp/gqb), LAYERS ("2 8"), T (timeout per step, 120).
# Prints one line per measurement (the bench's JSON fields that matter, or the error).
set -u
BIN=${1:-}
MS=${BIN:+$BIN/moonshine}; MS=${MS:-build/moonshine}
GB=${BIN:+$BIN/gpubench}; GB=${GB:-build/gpu-cuda/gpubench}
D=${OUT_DIR:-/tmp/gqb}; T=${T:-120}
mkdir -p "$D"
# the earlier kernels: hi + lo FP8 prefill, element-wise dequantization, 4-warp gate + up blocks
OLD="MS_GPU_FP8_GEMM=split MS_GPU_DEQ=old MS_GPU_QX=old"
for a in "bf16 128 8 2048 768" "f8_e4m3 128 8 2048 768" "mxfp4 128 8 2048 768" "mxfp4 64 8 2304 1024"; do
    for v in new old; do
        if [ $v = old ]; then e=$OLD; else e=; fi
        echo "routed $a $v: $(env $e timeout 60 $GB --routed $a 2>&1 | grep -E 'moe_routed|gpubench' | cut -c1-260)"
    done
done
fields='"prefill_tok_s":[0-9.]*\|"decode_tok_s":[0-9.]*\|"bw_fraction":[0-9.]*\|"achieved_gb_s":[0-9.]*\|rror.*'
bench() { # bench MODEL ENV...: pp512 + tg128
    local m=$1
    shift
    env "$@" timeout "$T" "$MS" bench "$m" --backend cuda --prompt-tokens 512 --gen-tokens 128 --threads 2 2>&1 |
        grep -o "$fields" | tr '\n' ' '
}
synth() { # synth CONFIG OUT EXPERT_DTYPE
    [ -f "$2/config.json" ] || timeout "$T" "$MS" synth --config "$1" --out "$2" --seed 1 --dtype bf16 \
        --expert-dtype "$3" --shard-mib 4096 > /dev/null 2>&1 || echo "synth $2 failed"
}
for L in ${LAYERS:-2 8}; do
    jq ".num_hidden_layers = $L" tools/configs/qwen3_30b_a3b_3layers.json > "$D/q3_$L.json"
    for dt in fp8 mxfp4; do
        synth "$D/q3_$L.json" "$D/q3_${L}_$dt" $dt
        for rep in 1 2; do
            echo "qwen3 $L layers $dt new: $(bench "$D/q3_${L}_$dt")"
            echo "qwen3 $L layers $dt old: $(bench "$D/q3_${L}_$dt" $OLD)"
        done
    done
done
synth tools/configs/kimi_linear_48b_4layers.json "$D/kimi_linear_4_mxfp4" mxfp4
for rep in 1 2; do
    echo "kimi-linear 4 layers mxfp4 new: $(bench "$D/kimi_linear_4_mxfp4")"
    echo "kimi-linear 4 layers mxfp4 old: $(bench "$D/kimi_linear_4_mxfp4" $OLD)"
done
