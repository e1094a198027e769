#!/bin/bash
# What ran on the GPU machine (one H200; torch 2.11, transformers 5.17, tokenizers 0.23; no network) to train
# models/demo. C holds tools/demo/train.py, the prepared data (tools/demo/prep_data.py's wordnet_chat.jsonl.xz)
# and a copy of the shared fixture generator gen_model_fixtures.py (its float64 reference functions).
C=${C:-/tmp/p}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 TOKENIZERS_PARALLELISM=true
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, torch.cuda.get_device_name(0))'
timeout 225 python3 "$C/train.py" "$C/wordnet_chat.jsonl.xz" "$C/gen_model_fixtures.py" --seconds ${SECONDS_CAP:-125} \
    > "$OUT/train_out.txt" 2>&1
echo "train rc=$?"
grep -v -i "warn" "$OUT/train_out.txt" | tail -60
ls -la "$OUT"
