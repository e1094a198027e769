#!/usr/bin/python3
"""Render a corpus of chat requests with Kimi K3's reference encoder (encoding_k3.py).

usage: xtml_reference.py CORPUS.json REFERENCE_DIR
CORPUS.json is a list of {"name", "request"} or {"name", "raw"}; a request is
the JSON object `moonshine render` reads, a raw one is that object as JSON text
(parsed here with json.loads, so duplicate keys and number lexemes count). Prints a JSON list of {"name", "text"} or
{"name", "error"} (the encoder raised). The request -> encoder parameter
mapping is the one documented in src/text/xtml.h, written here independently.
"""
import json
import sys

sys.path.insert(0, sys.argv[2])
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


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        corpus = json.load(f)
    out = []
    for case in corpus:
        try:
            req = json.loads(case["raw"]) if "raw" in case else case["request"]
            out.append({"name": case["name"], "text": render(req)})
        except Exception as e:  # the encoder raising is a result too
            out.append({"name": case["name"], "error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout)


main()
