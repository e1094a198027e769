#!/bin/sh
# make demo: one chat turn with the trained demo model (models/demo), the same kind of turn with its
# experts streamed from disk through a 1 MiB cache, then the model served over the OpenAI API and asked
# once with the curl line printed (DEMO_PORT, default 8000). env: MOONSHINE (default build/moonshine).
set -eu
M=${MOONSHINE:-build/moonshine}
PORT=${DEMO_PORT:-8000}
say() { if [ -t 1 ]; then printf '\n\033[1m%s\033[0m\n' "$*"; else printf '\n%s\n' "$*"; fi; }
say "\$ moonshine chat models/demo --prompt \"What is the opposite of big?\" --temperature 0 --stats"
"$M" chat models/demo --prompt "What is the opposite of big?" --temperature 0 --stats
say "\$ moonshine chat models/demo --prompt \"What is a doctor?\" --temperature 0 --stats --expert-cache-mib 1"
"$M" chat models/demo --prompt "What is a doctor?" --temperature 0 --stats --expert-cache-mib 1 2>&1 |
    grep -v '^moonshine chat: experts streamed\|^experts: '
say "Serve it (OpenAI API; the web chat page is at http://localhost:$PORT/):"
echo "build/moonshine-server models/demo --port $PORT &"
CURL="curl -s localhost:$PORT/v1/chat/completions -H 'Content-Type: application/json' -d '{\"messages\":[{\"role\":\"user\",\"content\":\"What is the opposite of happy?\"}],\"max_tokens\":64,\"temperature\":0}'"
echo "$CURL"
"$M" serve models/demo --port "$PORT" 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
i=0
until curl -sf "localhost:$PORT/health" >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -gt 100 ] || ! kill -0 $pid 2>/dev/null; then echo "demo: the server did not start on port $PORT (busy? set DEMO_PORT)" >&2; exit 1; fi
    sleep 0.1
done
eval "$CURL"
echo
