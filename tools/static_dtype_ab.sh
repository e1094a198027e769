#!/bin/sh
# Interleaved A/B of the static tier dtype: moonshine bench MODEL_DIR (default the qwen3_3l synth), stored vs q8, three times.
cd "$(dirname "$0")/.."
M=${1:-/work/main/build/synth/qwen3_3l}
for i in 1 2 3; do
  for sd in stored q8; do
    echo "run $i $sd $(./build/moonshine bench $M --prompt-tokens 32 --gen-tokens 32 --threads 2 --static-dtype $sd 2>/dev/null)"
  done
done
