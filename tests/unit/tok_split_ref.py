#!/usr/bin/env python3
"""Reference splitter for test_tok_split: the matches of each pattern in each
text, found by Python's `regex` module (python3-regex; version 1 semantics for
patterns with class intersection &&, as Rust regex and tiktoken read them).

stdin: {"patterns": [str, ...], "texts": [str, ...]}
stdout: [[[[start_byte, end_byte], ...] for each text] for each pattern]
Empty matches are left out (tokenizers drops empty pieces)."""
import json
import sys

import regex

req = json.load(sys.stdin)
out = []
for pat in req["patterns"]:
    rx = regex.compile(pat, regex.V1 if "&&" in pat else regex.V0)
    per = []
    for t in req["texts"]:
        b = [0]
        for ch in t:
            b.append(b[-1] + len(ch.encode("utf-8")))
        per.append([[b[m.start()], b[m.end()]] for m in rx.finditer(t) if m.end() > m.start()])
    out.append(per)
json.dump(out, sys.stdout)
