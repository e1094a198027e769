#!/bin/sh
# The chat checks of `make test`: synthesize two tiny Qwen3-MoE models carrying the real Qwen3
# tokenizer and chat template (random weights: the text is noise, the conversation mechanics are
# not), then run scripted sessions of `moonshine chat` (tests/chat/test_chat.py); then the trained
# demo model against transformers (tests/chat/test_demo.py) and the progress line (tests/chat/test_progress.py).
# env: MOONSHINE (the CLI, default build/moonshine; e.g. build/asan/moonshine).
set -eu
CLI=${MOONSHINE:-build/moonshine}
W=build/tmp/chat-test
TOK=build/tmp/chat-tokenizer/qwen3
mkdir -p "$W" "$TOK"
[ -f "$TOK/tokenizer.json" ] || { gzip -dc tests/data/tokenizers/qwen3/tokenizer.json.gz > "$TOK/tokenizer.json.tmp" && mv "$TOK/tokenizer.json.tmp" "$TOK/tokenizer.json"; }
cp tests/data/tokenizers/qwen3/tokenizer_config.json "$TOK/"
# the same model with 8 experts: another model identity (for the refusal of foreign state)
sed 's/"num_experts": 4/"num_experts": 8/' tests/chat/tiny_qwen3.json > "$W/other.json"
build/moonshine synth --config tests/chat/tiny_qwen3.json --out "$W/model" --tokenizer "$TOK" --seed 1 >/dev/null
build/moonshine synth --config "$W/other.json" --out "$W/other" --tokenizer "$TOK" --seed 2 >/dev/null
out=$(MOONSHINE="$CLI" /usr/bin/python3 tests/chat/test_chat.py "$W/model" "$W/other" "$W/work" 2>&1) && rc=0 || rc=$?
line=$(printf '%s\n' "$out" | tail -n 1)
if [ $rc -ne 0 ]; then printf '%s\n' "$out"; echo "FAIL chat ($line)"; exit 1; fi
echo "chat: $line"
# the trained demo model vs transformers' renders, tokenizations and greedy replies (tests/chat/test_demo.py)
out=$(MOONSHINE="$CLI" /usr/bin/python3 tests/chat/test_demo.py models/demo 2>&1) && rc=0 || rc=$?
line=$(printf '%s\n' "$out" | tail -n 1)
if [ $rc -ne 0 ]; then printf '%s\n' "$out"; echo "FAIL demo ($line)"; exit 1; fi
echo "chat: $line"
# the progress line on a pseudo-terminal, silent on a pipe (tests/chat/test_progress.py)
out=$(MOONSHINE="$CLI" /usr/bin/python3 tests/chat/test_progress.py build/tmp/progress-test 2>&1) && rc=0 || rc=$?
line=$(printf '%s\n' "$out" | tail -n 1)
if [ $rc -ne 0 ]; then printf '%s\n' "$out"; echo "FAIL progress ($line)"; exit 1; fi
echo "chat: $line"
