#!/usr/bin/env python3
"""Reference renders from Hugging Face transformers' apply_chat_template.

Runs where transformers is installed (the GPU machine; needs no files beyond
this directory): builds two in-memory tokenizers whose special tokens are set
like published tokenizer_config.json files (AddedToken objects / plain strings,
additional_special_tokens), then renders with apply_chat_template:
  * a probe template printing the variables transformers passes,
  * every small template of jinja_cases.py (variables as template kwargs),
  * every chat-style template of chat_convs.py over its conversations.
Writes $OUT/transformers_renders.json (committed as tests/text/transformers_renders.json.gz, gzip -9n); tests/unit/test_chat_template.c checks
moonshine against it.

usage: OUT=DIR python3 tests/text/gen_transformers_renders.py
"""
import json
import os
import sys

import transformers
from tokenizers import Tokenizer, models

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import chat_convs  # noqa: E402
import jinja_cases  # noqa: E402

PROBE = ("{{ tools is defined }}|{{ tools }}|{{ documents is defined }}|{{ documents }}|{{ add_generation_prompt }}|"
         "{{ bos_token is defined }}:{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token is defined }}|"
         "{{ sep_token is defined }}|{{ additional_special_tokens is defined }}|{{ enable_thinking is defined }}|"
         "{{ messages|length }}")

# tokenizer_config.json special-token members, as two published configs write them
CONFIGS = {
    "addedtoken": {"bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>"},
                   "eos_token": {"__type": "AddedToken", "content": "<｜end▁of▁sentence｜>"},
                   "pad_token": {"__type": "AddedToken", "content": "<｜end▁of▁sentence｜>"}, "unk_token": None},
    "strings": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]},
}


def make_tokenizer(cfg):
    vocab = {"[UNK]": 0}
    kw = {}
    for k, v in cfg.items():
        if isinstance(v, dict):
            v = v["content"]
        if isinstance(v, str):
            vocab.setdefault(v, len(vocab))
            kw[k] = v
        elif isinstance(v, list):
            for t in v:
                vocab.setdefault(t, len(vocab))
            kw[k] = v
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **kw)


def render(hf, tpl, msgs, tools, agp, kw):
    try:
        return {"rendered": hf.apply_chat_template(msgs, tools=tools, add_generation_prompt=agp, tokenize=False,
                                                   chat_template=tpl, **kw)}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    out_dir = os.environ.get("OUT", "/tmp/out")
    res = {"transformers": transformers.__version__, "configs": CONFIGS, "renders": []}
    toks = {name: make_tokenizer(cfg) for name, cfg in CONFIGS.items()}
    tools2 = [chat_convs.WEATHER_TOOL, chat_convs.SEARCH_TOOL]
    for cname, hf in toks.items():
        for conv in ("plain", "empty_messages"):
            for tools in (None, tools2):
                for agp in (True, False):
                    for kw in chat_convs.KWARGS:
                        req = chat_convs._conv_request(chat_convs.CONVS[conv], tools, agp, kw)
                        r = {"name": f"probe/{cname}/{conv}/{bool(tools)}/{agp}/{json.dumps(kw)}", "config": cname,
                             "template": PROBE, "request": json.dumps(req, ensure_ascii=False)}
                        r.update(render(hf, PROBE, chat_convs.CONVS[conv], tools, agp, kw))
                        res["renders"].append(r)
    hf = toks["strings"]
    for i, (tpl, variables) in enumerate(jinja_cases.CASES):
        v = dict(variables)
        msgs = v.pop("messages", jinja_cases.DEFAULT_MESSAGES)
        req = {"messages": msgs, "chat_template_kwargs": v}
        r = {"name": f"case{i}", "config": "strings", "template": tpl, "request": json.dumps(req, ensure_ascii=False)}
        r.update(render(hf, tpl, msgs, None, False, v))
        res["renders"].append(r)
    for sname, tpl in chat_convs.STYLE_TEMPLATES.items():
        for conv, msgs in chat_convs.CONVS.items():
            for tools in (None, tools2):
                for agp in (True, False):
                    kw = {"enable_thinking": False} if agp else {}
                    req = chat_convs._conv_request(msgs, tools, agp, kw)
                    r = {"name": f"style-{sname}/{conv}/{bool(tools)}/{agp}", "config": "addedtoken", "template": tpl,
                         "request": json.dumps(req, ensure_ascii=False)}
                    r.update(render(toks["addedtoken"], tpl, msgs, tools, agp, kw))
                    res["renders"].append(r)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "transformers_renders.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, ensure_ascii=False, indent=0)
    print(len(res["renders"]), "renders,", sum("error" in r for r in res["renders"]), "errors")


if __name__ == "__main__":
    main()
