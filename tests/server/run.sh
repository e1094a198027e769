#!/bin/sh
# The server checks of `make test`: synthesize a tiny Qwen3-MoE model carrying the real Qwen3
# tokenizer and chat template (random weights: the text is noise, the protocol is not), start
# moonshine-server twice on free ports (sampling, and --test-forced-output with a tool-call/
# reasoning output rendered by the official template), and run the OpenAI Node SDK against them.
# Then moonshine-chat runs a scripted conversation whose replies must equal the server's.
# env: MOONSHINE_SERVER (default build/moonshine-server; e.g. "build/asan/moonshine serve"),
#      MOONSHINE_CHAT (default build/moonshine-chat),
#      MOONSHINE (the CLI for render/tokenize, default build/moonshine).
set -eu
SERVER=${MOONSHINE_SERVER:-build/moonshine-server}
CLI=${MOONSHINE:-build/moonshine}
W=build/tmp/server-test
SDK=tests/server/sdk
mkdir -p "$W" build/tokenizers/qwen3
command -v node >/dev/null || { echo "FAIL server: node is missing (tools/install-deps.sh installs it)"; exit 1; }
if [ ! -f "$SDK/node_modules/openai/package.json" ] || [ ! -f "$SDK/node_modules/@anthropic-ai/sdk/package.json" ] ||
   [ ! -f "$SDK/node_modules/puppeteer-core/package.json" ] || [ ! -f "$SDK/node_modules/ajv-formats/package.json" ] ||
   [ ! -f "$SDK/node_modules/@langchain/openai/package.json" ] || [ ! -f "$SDK/node_modules/@ai-sdk/openai/package.json" ]; then
    (cd "$SDK" && npm ci --no-audit --no-fund --loglevel=error) || { echo "FAIL server: npm ci in $SDK failed"; exit 1; }
fi
TOK=build/tokenizers/qwen3
[ -f "$TOK/tokenizer.json" ] || { gzip -dc tests/data/tokenizers/qwen3/tokenizer.json.gz > "$TOK/tokenizer.json.tmp" && mv "$TOK/tokenizer.json.tmp" "$TOK/tokenizer.json"; }
cp tests/data/tokenizers/qwen3/tokenizer_config.json "$TOK/"
MODEL=$W/tiny_qwen3
"$CLI" synth --config tests/server/tiny_qwen3.json --out "$MODEL" --tokenizer "$TOK" --seed 1 >/dev/null
# a KDA + MLA model (recurrent state: no rollback, prefix reuse through state snapshots)
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['vocab_size']=151936; json.dump(c,open(sys.argv[2],'w'))" \
    tests/data/fixtures/models/kimi_linear/config.json "$W/kda.json"
"$CLI" synth --config "$W/kda.json" --out "$W/tiny_kda" --tokenizer "$TOK" --seed 2 >/dev/null
python3 tests/server/forced_output.py "$MODEL/tokenizer_config.json" "$W/forced.txt" "$W/forced.json"

pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; for p in $pids; do wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

# start NAME ARGS...: a server on a free port; sets PORT
start() {
    name=$1; shift
    log=$W/$name.log
    : > "$log"
    env ${START_ENV:-} $SERVER "${DIR:-$MODEL}" --port 0 --threads 1 --ctx 4096 --model-name tiny-qwen3 "$@" 2> "$log" &
    pids="$pids $!"
    i=0
    while ! grep -q "listening on" "$log"; do
        i=$((i + 1))
        if [ $i -gt 300 ] || ! kill -0 "$!" 2>/dev/null; then echo "FAIL server: $name did not start"; cat "$log"; exit 1; fi
        sleep 0.1
    done
    PORT=$(sed -n 's/.*listening on http:\/\/[0-9.]*:\([0-9]*\).*/\1/p' "$log")
}
start sampling --max-body-mib 2
P1=$PORT
start forced --test-forced-output "$W/forced.txt"
P2=$PORT
DIR=$W/tiny_kda start kda --parser qwen3
P3=$PORT
# under ASan the hostile server's quarantine is kept small, so that its RSS shows what is held (hostile.py's RSS case)
case "$SERVER" in *asan*) START_ENV="ASAN_OPTIONS=${ASAN_OPTIONS:-}:quarantine_size_mb=4:thread_local_quarantine_size_kb=64" ;; esac
START_ENV=${START_ENV:-} start hostile --api-key hostile-test-key --max-connections 1000 --header-timeout-s 2 --body-timeout-s 2 --max-body-mib 1
P4=$PORT
P4PID=$!
START_ENV=
start slots --slots 3 --max-queue 2
P5=$PORT
start perip --max-connections-per-ip 4
P6=$PORT
rc=0
BASE=http://127.0.0.1:$P1/v1 FORCED_BASE=http://127.0.0.1:$P2/v1 KDA_BASE=http://127.0.0.1:$P3/v1 FORCED_EXPECT=$W/forced.json MODEL_NAME=tiny-qwen3 \
    MOONSHINE=$CLI MODEL_DIR=$MODEL node "$SDK/test.mjs" > "$W/sdk.out" 2>&1 || rc=$?
# the Anthropic Messages and OpenAI Responses endpoints with the official SDKs (tests/server/sdk/agent.mjs)
BASE=http://127.0.0.1:$P1/v1 FORCED_BASE=http://127.0.0.1:$P2/v1 FORCED_EXPECT=$W/forced.json MODEL_NAME=tiny-qwen3 \
    KEY_BASE=http://127.0.0.1:$P4 KEY_VALUE=hostile-test-key MOONSHINE=$CLI MODEL_DIR=$MODEL \
    node "$SDK/agent.mjs" >> "$W/sdk.out" 2>&1 || rc=$?
# the built-in chat page in headless Chromium (tests/server/sdk/web.mjs; screenshot build/tmp/server-test/web.png)
CHROMIUM=${CHROMIUM:-$(command -v chromium || true)}
if [ -z "$CHROMIUM" ]; then echo "FAIL server: chromium is missing (tools/install-deps.sh installs it)" >> "$W/sdk.out"; rc=1
else
    BASE=http://127.0.0.1:$P1/v1 FORCED_BASE=http://127.0.0.1:$P2/v1 KEY_BASE=http://127.0.0.1:$P4 KEY_VALUE=hostile-test-key \
        MODEL_NAME=tiny-qwen3 CHROMIUM=$CHROMIUM SHOT=$W/web.png timeout 180 node "$SDK/web.mjs" >> "$W/sdk.out" 2>&1 || rc=$?
fi
# hostile traffic (tests/server/hostile.py): loopback only, bounded; under ASan RSS with a wider margin (its small quarantine)
case "$SERVER" in *asan*) RSS="--rss-margin-mib 16" ;; *) RSS= ;; esac
timeout 120 python3 tests/server/hostile.py "$P4" "$P4PID" hostile-test-key $RSS > "$W/hostile.out" 2>&1 || rc=$?
cat "$W/hostile.out" >> "$W/sdk.out"
# structured output through LangChain and the Vercel AI SDK (tests/server/sdk/frameworks.mjs)
BASE=http://127.0.0.1:$P1/v1 MODEL_NAME=tiny-qwen3 timeout 300 node "$SDK/frameworks.mjs" >> "$W/sdk.out" 2>&1 || rc=$?
# 100 json_schema completions of varied schemas, validated by Ajv (tests/server/sdk/schemas.mjs), on the slots server
case "$SERVER" in *asan*) PER_SCHEMA=3 ;; *) PER_SCHEMA=10 ;; esac # ASan: 30 of the 100 (3-5x slower)
BASE=http://127.0.0.1:$P5/v1 MODEL_NAME=tiny-qwen3 PER_SCHEMA=$PER_SCHEMA timeout 300 node "$SDK/schemas.mjs" >> "$W/sdk.out" 2>&1 || rc=$?
# parallel slots (tests/server/slots.py): batching = one at a time, 503 past slots + queue, disconnects, deadlines
timeout 120 python3 tests/server/slots.py "$P5" "$P3" > "$W/slots.out" 2>&1 || rc=$?
cat "$W/slots.out" >> "$W/sdk.out"
# the per-address connection cap (tests/server/perip.py)
timeout 60 python3 tests/server/perip.py "$P6" >> "$W/sdk.out" 2>&1 || rc=$?
# moonshine-chat: a scripted conversation, saved, compared with the server's replies
CHAT=${MOONSHINE_CHAT:-build/moonshine-chat}
printf '/system Be brief.\nHello there\nAnd again\n/save %s\n/quit\n' "$W/chat.json" |
    $CHAT "$MODEL" --max-tokens 5 --temperature 0 --threads 1 --ctx 512 > "$W/chat.out" 2> "$W/chat.log" || rc=$?
python3 tests/server/chat_check.py "$W/chat.json" "$W/chat.out" "http://127.0.0.1:$P1/v1" tiny-qwen3 >> "$W/sdk.out" 2>&1 || rc=$?
if grep -q "ERROR: \|runtime error" "$W/chat.log"; then cat "$W/chat.log"; rc=1; fi
# the prefix cache's disk tier: restart-and-hit, corrupt and foreign files, TTFT after a restart (tests/server/prefix_disk.py)
timeout 600 python3 tests/server/prefix_disk.py "$SERVER" "$W/tiny_kda" "$MODEL" "$W/prefix-disk" --ttft >> "$W/sdk.out" 2>&1 || rc=$?
cleanup
pids=""
for n in sampling forced kda hostile slots perip; do
    if grep -q "ERROR: \|runtime error" "$W/$n.log"; then echo "FAIL server: $n log:"; cat "$W/$n.log"; rc=1; fi
done
line=$(grep -E '^[0-9]+ passed' "$W/sdk.out" | tr '\n' ' ')
if [ $rc -ne 0 ]; then cat "$W/sdk.out"; echo "FAIL server ($line)"; exit 1; fi
echo "server: $line"
