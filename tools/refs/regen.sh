#!/bin/sh
# Regenerate the reference outputs in tests/data that are computed by other projects' own code:
#   tests/data/swiglu_reference.json      tools/refs/swiglu_reference.py: the clamped SwiGLU of
#                                         transformers 5.17's gpt-oss, GLM-5-Next and DeepSeek-V4 sources
#   tests/data/outparse_cases.json        tools/refs/outparse_reference.py: assistant turns rendered with
#                                         the official chat templates (DeepSeek V3, Qwen3 from
#                                         tests/data/tokenizers; Kimi K2 Thinking's template)
#   tests/data/xtml/reference_corpus.json tools/refs/xtml_reference.py: tests/data/xtml/conversations.json
#   tests/data/xtml/reference_random.json rendered by Kimi K3's encoding_k3.py (and 300 random requests)
# The tests read these files; only this script needs the sources, which are not part of the
# repository (they are other projects' code: read them, do not copy them).
#
# usage: tools/refs/regen.sh REFERENCE_DIR
# REFERENCE_DIR holds transformers-5.17/models/ (Hugging Face transformers 5.17.0 sources) and
# kimi-k3/ (the official Kimi K3 remote-code files with encoding_k3.py, and Kimi K2 Thinking's
# kimi_k2_thinking_chat_template.jinja). A part whose sources are missing is skipped with a
# message; the files it would write are left as they are. Needs python3 and python3-jinja2.
# After regenerating, `git diff tests/data` shows whether anything changed.
set -u
REF=${1:?usage: tools/refs/regen.sh REFERENCE_DIR}
[ -d "$REF" ] && REF=$(cd "$REF" && pwd)
cd "$(dirname "$0")/../.." || exit 1
status=0

# gen NAME OUTFILE COMMAND...: run COMMAND, write its stdout to OUTFILE only if it succeeds
gen() {
    name=$1 out=$2
    shift 2
    if "$@" > "$out.tmp.$$"; then
        mv "$out.tmp.$$" "$out" && echo "wrote $out ($name)"
    else
        rm -f "$out.tmp.$$"
        echo "FAIL $name: $*" >&2
        status=1
    fi
}

TF=$REF/transformers-5.17/models
if [ -d "$TF/gpt_oss" ] && [ -d "$TF/glm5_next" ] && [ -d "$TF/deepseek_v4" ]; then
    gen swiglu tests/data/swiglu_reference.json python3 tools/refs/swiglu_reference.py "$TF"
else
    echo "skipped swiglu: $TF (transformers 5.17 sources of gpt_oss, glm5_next, deepseek_v4) not found"
fi

K2=$REF/kimi-k3/kimi_k2_thinking_chat_template.jinja
if [ -f "$K2" ]; then
    gen outparse tests/data/outparse_cases.json python3 tools/refs/outparse_reference.py tests/data/tokenizers "$K2"
else
    echo "skipped outparse: $K2 (Kimi K2 Thinking's chat template) not found"
fi

K3=$REF/kimi-k3
if [ -f "$K3/encoding_k3.py" ]; then
    gen xtml-corpus tests/data/xtml/reference_corpus.json \
        python3 tools/refs/xtml_reference.py tests/data/xtml/conversations.json "$K3"
    gen xtml-random tests/data/xtml/reference_random.json \
        python3 tools/refs/xtml_reference.py --random 20261129 300 "$K3"
else
    echo "skipped xtml: $K3/encoding_k3.py (Kimi K3's chat encoder) not found"
fi
exit $status
