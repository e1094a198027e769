#!/usr/bin/python3
"""moonshine-chat against moonshine-server.

usage: chat_check.py SAVED_JSON CHAT_STDOUT BASE_URL MODEL
SAVED_JSON is what `/save` wrote after a scripted conversation at temperature 0.
Checks the roles (system, then user/assistant turns), that every assistant reply
was printed, and that each equals the server's greedy reply to the same messages
(max_tokens 5): the interactive client and the server generate the same text.
Prints "N passed, N failed".
"""
import json
import sys
import urllib.request

import tally

saved, out_path, base, model = sys.argv[1:5]
msgs = json.load(open(saved, encoding="utf-8"))["messages"]
out = open(out_path, encoding="utf-8").read()

tally.check([m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"], f"roles {[m['role'] for m in msgs]}")
for i, m in enumerate(msgs):
    if m["role"] != "assistant":
        continue
    tally.check(m["content"] in out, f"reply {i} not printed")
    body = json.dumps({"model": model, "messages": msgs[:i], "max_tokens": 5, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/chat/completions", body, {"Content-Type": "application/json"})
    got = json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"]
    tally.check(got == m["content"], f"reply {i}: chat {m['content']!r} vs server {got!r}")
tally.finish()
