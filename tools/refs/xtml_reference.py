#!/usr/bin/python3
"""Render a corpus of chat requests with Kimi K3's reference encoder (encoding_k3.py).

usage: xtml_reference.py CORPUS.json REFERENCE_DIR
       xtml_reference.py --random SEED COUNT REFERENCE_DIR
CORPUS.json is a list of {"name", "request"} or {"name", "raw"}; a request is
the JSON object `moonshine render` reads, a raw one is that object as JSON text
(parsed here with json.loads, so duplicate keys and number lexemes count). Prints a JSON list of {"name", "text"} or
{"name", "error"} (the encoder raised). The request -> encoder parameter
mapping is the one documented in src/text/xtml.h, written here independently.
With --random, COUNT random requests (mixing every feature, valid and not) are
generated from SEED and printed with their renders as {"name", "request", ...}.
REFERENCE_DIR holds the official Kimi K3 files (encoding_k3.py). tools/refs/regen.sh
runs both forms into tests/data/xtml/reference_{corpus,random}.json, which test_xtml reads.
"""
import json
import random
import sys

sys.path.insert(0, sys.argv[-1])
from encoding_k3 import build_chat_segments  # noqa: E402

_ABSENT = object()


def render(req):
    if not isinstance(req, dict) or not isinstance(req.get("messages"), list):
        raise ValueError("request must be an object with a messages list")
    kw = req.get("chat_template_kwargs")
    kw = dict(kw) if kw is not None else {}
    if "thinking" in kw:
        thinking = bool(kw.pop("thinking"))
    elif "enable_thinking" in kw:
        thinking = bool(kw["enable_thinking"])
    else:
        thinking = True
    if "thinking_effort" not in kw:
        kw["thinking_effort"] = kw.get("reasoning_effort", "max")
    image_prompts = kw.pop("image_prompts", None)
    segs = build_chat_segments(
        req["messages"],
        tools=req.get("tools"),
        add_generation_prompt=bool(req.get("add_generation_prompt", False)),
        thinking=thinking,
        image_prompts=image_prompts,
        **kw,
    )
    return "".join(s.text for s in segs)


def random_cases(seed, count):
    R = random.Random(seed)

    def rstr():
        return R.choice(["", " ", "hi", "a\"b&c", "ü😀", "\n\t x \n", "<|open|>", "0", "1.5", "true", "null", "{\"x\": 1}", "[1, 2]", "   ", "\u2028"])
    def rval(d=0):
        k = R.randrange(9 if d < 2 else 6)
        if k == 0: return None
        if k == 1: return True
        if k == 2: return False
        if k == 3: return R.randrange(-5, 100)
        if k == 4: return R.choice([0.5, 1.0, -0.0, 1e-7, 1e21, 3.14159])
        if k == 5: return rstr()
        if k == 6: return [rval(d+1) for _ in range(R.randrange(3))]
        if k == 7: return {(rstr() or "k"): rval(d+1) for _ in range(R.randrange(3))}
        return rstr()
    def rargs():
        k = R.randrange(6)
        if k == 0: return json.dumps({rstr() or "k": rval() for _ in range(R.randrange(4))})
        if k == 1: return {rstr() or "k": rval() for _ in range(R.randrange(4))}
        if k == 2: return R.choice(["", " ", "{bad", "{\"a\":1", "null", "[1]", "{\"a\": NaN}"])
        if k == 3: return None
        return json.dumps({"q": rstr(), "n": R.randrange(10)})
    def rcall(i):
        c = {"type": "function", "function": {"name": R.choice(["f", "g", "a\"b"]), "arguments": rargs()}}
        if R.random() < 0.7: c["id"] = R.choice(["c1", "c2", "c3", 7])
        if R.random() < 0.1: c = {"name": "flat", "arguments": rargs(), "id": "c9"}
        return c
    def rmsg():
        role = R.choice(["user", "user", "assistant", "assistant", "tool", "system", "developer"])
        m = {"role": role}
        if R.random() < 0.9: m["content"] = R.choice([rstr(), None, [{"type": "text", "text": rstr()}, {"type": "image"}]])
        if R.random() < 0.2: m["name"] = R.choice([rstr(), 3, True])
        if role == "assistant":
            if R.random() < 0.6: m["reasoning_content"] = R.choice([rstr(), None, ""])
            if R.random() < 0.2: m["reasoning"] = rstr()
            if R.random() < 0.5: m["tool_calls"] = [rcall(i) for i in range(R.randrange(1, 4))]
        if role == "tool":
            if R.random() < 0.7: m["tool_call_id"] = R.choice(["c1", "c2", "c3", 7, "zz"])
            if R.random() < 0.3: m["name"] = R.choice(["f", "x"])
        if role == "system" and R.random() < 0.2: m["tools"] = [{"function": {"name": "z", "b": 1, "a": [2]}}]
        return m
    cases = []
    for i in range(count):
        req = {"messages": [rmsg() for _ in range(R.randrange(1, 7))]}
        if R.random() < 0.5: req["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": {"y": [1, {"b": 2, "a": 1}]}}}}]
        if R.random() < 0.7: req["add_generation_prompt"] = R.random() < 0.7
        kw = {}
        for key, vals in [("thinking", [True, False]), ("thinking_effort", ["low", "high", "max", None, "medium"]), ("tool_choice", ["required", "none", "auto"]),
                          ("response_format", [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"schema": {"b": 1, "a": 2}}}, "json_object", {"type": "text"}]),
                          ("reasoning_effort", ["low", "high"])]:
            if R.random() < 0.3: kw[key] = R.choice(vals)
        if kw or R.random() < 0.5: req["chat_template_kwargs"] = kw
        cases.append({"name": str(i), "request": req})
    return cases


def main():
    if sys.argv[1] == "--random":
        corpus = random_cases(int(sys.argv[2]), int(sys.argv[3]))
    else:
        with open(sys.argv[1], encoding="utf-8") as f:
            corpus = json.load(f)
    out = []
    for case in corpus:
        try:
            req = json.loads(case["raw"]) if "raw" in case else case["request"]
            out.append({"name": case["name"], "text": render(req)})
            if "request" in case:
                out[-1]["request"] = case["request"]
        except Exception as e:  # the encoder raising is a result too
            out.append({"name": case["name"], "error": f"{type(e).__name__}: {e}"})
            if "request" in case:
                out[-1]["request"] = case["request"]
    json.dump(out, sys.stdout)


main()
