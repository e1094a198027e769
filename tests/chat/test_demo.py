#!/usr/bin/env python3
"""The trained demo model (models/demo) against what transformers 5.17 produced on the GPU machine
(tools/demo/train.py wrote models/demo/renders.json and samples.json there):
  * every chat of renders.json through `moonshine render` == apply_chat_template's string, and
    `moonshine tokenize` of it == the transformers tokenizer's ids;
  * every text of renders.json's tokenize cases: our ids == transformers' == HF tokenizers' ids, and
    `moonshine detokenize` gives the text back where transformers' decode did;
  * every prompt of samples.json through `moonshine chat --temperature 0` (CPU, and experts streamed
    through a 1 MiB cache): the same completion ids as transformers' greedy generate, ending at the
    end-of-turn token (finish_reason "stop"), i.e. the model stops by itself.
usage: test_demo.py [MODEL_DIR]   env: MOONSHINE (default build/moonshine). Last line: "N passed, 0 failed".
"""
import json, os, subprocess, sys

M = os.environ.get("MOONSHINE", "build/moonshine")
D = sys.argv[1] if len(sys.argv) > 1 else "models/demo"
ok = bad = 0


def check(cond, what):
    global ok, bad
    if cond:
        ok += 1
    else:
        bad += 1
        print("FAIL", what)


def run(args, data=b""):
    p = subprocess.run([M] + args, input=data, capture_output=True, timeout=120)
    if p.returncode:
        print("command failed:", args, p.stderr.decode(errors="replace")[-400:])
    return p.stdout


ref = json.load(open(os.path.join(D, "renders.json"), encoding="utf-8"))
for r in ref["renders"]:
    req = json.dumps({"messages": r["messages"], "add_generation_prompt": r["add_generation_prompt"]}).encode()
    got = run(["render", D], req).decode("utf-8")
    check(got == r["rendered"], f"render {r['messages']!r}: {got!r} != {r['rendered']!r}")
    ids = json.loads(run(["tokenize", D], r["rendered"].encode()) or b"null")
    check(ids == r["ids"], f"tokenize render {r['rendered']!r}: {ids} != {r['ids']}")
for t in ref["tokenize"]:
    ids = json.loads(run(["tokenize", D], t["text"].encode()) or b"null")
    check(ids == t["ids"] == t["hf_tokenizers_ids"], f"tokenize {t['text']!r}: {ids} != {t['ids']}")
    if t["ids"]:
        back = run(["detokenize", D], json.dumps(t["ids"]).encode()).decode("utf-8")
        check(back == t["decoded"], f"detokenize {t['ids']}: {back!r} != {t['decoded']!r}")

samples = json.load(open(os.path.join(D, "samples.json"), encoding="utf-8"))
for extra in ([], ["--expert-cache-mib", "1"]):
    for s in samples:
        out = run(["chat", D, "--prompt", s["prompt"], "--temperature", "0", "--max-tokens", "64", "--json",
                   "--json-ids"] + extra)
        o = json.loads(out or b"{}")
        check(o.get("completion_ids") == s["ids"], f"chat {extra} {s['prompt']!r}: {o.get('completion_ids')} != {s['ids']}")
        check(o.get("content") == s["reply"], f"chat {extra} {s['prompt']!r}: {o.get('content')!r} != {s['reply']!r}")
        check(s["stopped"] and o.get("finish_reason") == "stop", f"chat {extra} {s['prompt']!r}: did not stop by itself")
print(f"demo model: {ok} passed, {bad} failed")
sys.exit(1 if bad else 0)
