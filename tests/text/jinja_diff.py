#!/usr/bin/python3
"""Differential test: moonshine's Jinja interpreter against Debian's python3-jinja2.

Every case (a template and its variables) is rendered twice:
  * by jinja2 configured as transformers' apply_chat_template configures it
    (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
    the `generation` tag, tojson = json.dumps(ensure_ascii=False, ...),
    raise_exception, strftime_now; variables messages/tools/documents/
    add_generation_prompt/special tokens/kwargs), and
  * by `moonshine render DIR` with DIR holding the template as chat_template.jinja.
Outputs must be byte-identical, or both must fail.

Cases: tests/text/jinja_cases.py (small templates, one construct each) and the
real chat templates of tests/data/tokenizers with extra conversations
(tests/text/chat_convs.py).

usage: jinja_diff.py [--moonshine PATH] [--verbose] [--only SUBSTRING]
       jinja_diff.py --emit FILE   write the cases with jinja2's results as JSON
                                   (tests/unit/test_jinja_diff.c renders them in-process)
"""
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import chat_convs  # noqa: E402
import jinja_cases  # noqa: E402


class GenerationTag(Extension):
    """transformers' AssistantTracker tag, rendering its body in place."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

    def _gen(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[GenerationTag, jinja2.ext.loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
ENV.globals["strftime_now"] = strftime_now

SPECIAL_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


def special_tokens(tok_config):
    out = {}
    for k in SPECIAL_KEYS:
        v = tok_config.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[k] = v
    return out  # transformers 5.17 passes no additional_special_tokens (see gen_transformers_renders.py)


_COMPILED = {}


def reference(template, request, tok_config):
    try:
        if not request["messages"]:
            raise ValueError("Cannot apply chat template to an empty conversation.")
        if template not in _COMPILED:
            try:
                _COMPILED[template] = ENV.from_string(template)
            except Exception as e:
                _COMPILED[template] = e
        t = _COMPILED[template]
        if isinstance(t, Exception):
            raise t
        kw = {**special_tokens(tok_config), **request.get("chat_template_kwargs", {})}
        return True, t.render(messages=request["messages"], tools=request.get("tools"), documents=None,
                              add_generation_prompt=request.get("add_generation_prompt", False), **kw)
    except Exception as e:  # any failure: moonshine must fail too
        return False, f"{type(e).__name__}: {e}"


def moonshine(exe, tmpdir, template, request, tok_config):
    with open(os.path.join(tmpdir, "chat_template.jinja"), "w", encoding="utf-8", newline="") as f:
        f.write(template)
    with open(os.path.join(tmpdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tok_config, f, ensure_ascii=False)
    r = subprocess.run([exe, "render", tmpdir], input=json.dumps(request, ensure_ascii=False).encode("utf-8"),
                       capture_output=True, timeout=20)
    if r.returncode == 0:
        return True, r.stdout.decode("utf-8", errors="surrogateescape")
    return False, r.stderr.decode("utf-8", errors="replace").strip()


def all_cases():
    for i, (tpl, variables) in enumerate(jinja_cases.CASES):
        v = dict(variables)
        msgs = v.pop("messages", jinja_cases.DEFAULT_MESSAGES)
        yield f"case{i}", tpl, {"messages": msgs, "chat_template_kwargs": v}, jinja_cases.TOK_CONFIG
    for name, tpl, req, tok_config in chat_convs.cases(os.path.join(ROOT, "tests", "data", "tokenizers")):
        yield name, tpl, req, tok_config


def main():
    args = sys.argv[1:]
    exe = os.path.join(ROOT, "build", "moonshine")
    if "--moonshine" in args:
        exe = args[args.index("--moonshine") + 1]
    exe = os.environ.get("MOONSHINE", exe)
    only = args[args.index("--only") + 1] if "--only" in args else None
    verbose = "--verbose" in args
    if "--emit" in args:
        out = []
        for name, tpl, req, tok_config in all_cases():
            ok, text = reference(tpl, req, tok_config)
            out.append({"name": name, "template": tpl, "request": json.dumps(req, ensure_ascii=False),
                        "tokenizer_config": tok_config, "ok": ok, "output": text})
        dest = args[args.index("--emit") + 1]
        data = json.dumps(out, ensure_ascii=False)
        if dest == "-":
            sys.stdout.write(data)
        else:
            with open(dest, "w", encoding="utf-8") as f:
                f.write(data)
        return 0
    n = bad = errs = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, tpl, req, tok_config in all_cases():
            if only and only not in name:
                continue
            n += 1
            ok_r, out_r = reference(tpl, req, tok_config)
            ok_m, out_m = moonshine(exe, tmp, tpl, req, tok_config)
            errs += not ok_r
            same = (ok_r and ok_m and out_r == out_m) or (not ok_r and not ok_m)
            if not same:
                bad += 1
                print(f"DIFF {name}: template {tpl[:300]!r}\n  vars {json.dumps(req, ensure_ascii=False)[:300]}")
                print(f"  jinja2:    {'ok ' if ok_r else 'ERR'} {out_r[:400]!r}")
                print(f"  moonshine: {'ok ' if ok_m else 'ERR'} {out_m[:400]!r}")
            elif verbose:
                print(f"same {name}: {'ok' if ok_r else 'both fail: ' + out_r[:80] + ' / ' + out_m[:80]}")
    print(f"jinja differential: {n} renders ({errs} expected errors), {bad} differ")
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
