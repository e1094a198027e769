#!/usr/bin/python3
"""Model outputs with known meaning, for the output-parser tests.

usage: outparse_reference.py TOKENIZERS_DIR KIMI_K2_TEMPLATE
Renders assistant messages (reasoning, content, tool calls) with the official
chat templates -- DeepSeek V3 and Qwen3 from TOKENIZERS_DIR/*/tokenizer_config.json,
Kimi K2 Thinking from KIMI_K2_TEMPLATE -- through python3-jinja2 with the
settings transformers uses, and cuts out what the model itself generates
(the rendering after the generation prompt, without the end-of-turn token).
GLM and harmony ship no template here: their texts are written from the
published formats (GLM-4.5 / GLM-4.7 templates, OpenAI's harmony spec).
Prints a JSON list of {name, format, start_in_reasoning, text, expect}.
tools/refs/regen.sh runs it into tests/data/outparse_cases.json, which test_outparse
and test_server_api read.
"""
import json
import sys

import jinja2

TOK, KIMI = sys.argv[1], sys.argv[2]


def env():
    e = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    return e


def template(name):
    if name == "kimi_k2":
        return env().from_string(open(KIMI, encoding="utf-8").read())
    cfg = json.load(open(f"{TOK}/{name}/tokenizer_config.json", encoding="utf-8"))
    return env().from_string(cfg["chat_template"])


def generated(tname, msgs, assistant, eos, **kw):
    t = template(tname)
    prompt = t.render(messages=msgs, add_generation_prompt=True, bos_token="<BOS>", **kw)
    full = t.render(messages=msgs + [assistant], add_generation_prompt=False, bos_token="<BOS>", **kw)
    assert full.startswith(prompt), (tname, prompt[-80:], full[-200:])
    out = full[len(prompt):]
    for e in eos:
        if out.endswith(e):
            out = out[: -len(e)]
            break
    return prompt, out


CASES = []


def add(name, fmt, text, content, reasoning, calls, start_in_reasoning=False):
    CASES.append({"name": name, "format": fmt, "start_in_reasoning": start_in_reasoning, "text": text,
                  "expect": {"content": content, "reasoning": reasoning, "tool_calls": calls}})


ARGSETS = [
    ("get_weather", {"city": "Paris", "unit": "celsius"}),
    ("search", {"query": "C streaming parsers }{ \"quoted\"", "limit": 5, "filters": {"lang": ["en", "fr"], "safe": True}}),
    ("write_file", {"path": "/tmp/ü.txt", "content": "line1\nline2 😀 <b>bold</b>", "append": False, "mode": None}),
    ("noop", {}),
]


def calls_of(idx):
    return [{"id": f"call_{i}", "type": "function", "function": {"name": ARGSETS[i][0], "arguments": ARGSETS[i][1]}} for i in idx]


def expect_calls(calls, kimi=False):
    out = []
    for i, c in enumerate(calls):
        e = {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        if kimi:
            e["id"] = c["id"]
        out.append(e)
    return out


USER = [{"role": "user", "content": "Hello, please help."}]
VARIANTS = [
    ("content_only", "Sure — here is the answer: 42. ✓", None, []),
    ("reasoning_content", "The answer is 42.", "Let me think.\nSix times seven is 42 </not a marker>.", []),
    ("one_call", "", "I need the weather.", [0]),
    ("content_and_calls", "Checking three things.", None, [0, 1, 2]),
    ("empty_args", "", "Nothing to pass.", [3]),
]

# --- Qwen3 ---
for vname, content, reasoning, idx in VARIANTS:
    calls = calls_of(idx)
    a = {"role": "assistant", "content": content}
    if reasoning is not None:
        a["reasoning_content"] = reasoning
    if calls:
        a["tool_calls"] = [dict(c, function=dict(c["function"])) for c in calls]
    _, text = generated("qwen3", USER, a, ["<|im_end|>\n"])
    add("qwen3_" + vname, "qwen3", text, content, reasoning or "", expect_calls(calls))
# Qwen3 with thinking disabled: the prompt carries the empty think block
p, text = generated("qwen3", USER, {"role": "assistant", "content": "No thinking."}, ["<|im_end|>\n"], enable_thinking=False)
add("qwen3_thinking_disabled", "qwen3", text.replace("<think>\n\n</think>\n\n", "", 1) if p.endswith("</think>\n\n") else text,
    "No thinking.", "", [])
# a thinking model whose prompt opens <think>: the output starts inside reasoning
add("qwen3_prompt_opened_think", "qwen3", "The user greets me.\n</think>\n\nHello!", "Hello!", "The user greets me.", [],
    start_in_reasoning=True)

# --- DeepSeek V3 (arguments are strings in its template) ---
for vname, content, reasoning, idx in VARIANTS:
    if reasoning is not None and not idx:
        continue
    calls = calls_of(idx)
    if calls:
        a = {"role": "assistant", "content": None,
             "tool_calls": [dict(c, function=dict(c["function"], arguments=json.dumps(c["function"]["arguments"], ensure_ascii=False))) for c in calls]}
        _, text = generated("deepseek_v3", USER, a, ["<｜end▁of▁sentence｜>"])
        # its template closes the section (and the turn) after every call but the first;
        # a model stops at the end-of-sentence token, so drop those
        text = text.replace("<｜end▁of▁sentence｜>", "")
        add("deepseek_v3_" + vname, "deepseek_v3", text, "", "", expect_calls(calls))
    else:
        _, text = generated("deepseek_v3", USER, {"role": "assistant", "content": content}, ["<｜end▁of▁sentence｜>"])
        add("deepseek_v3_" + vname, "deepseek_v3", text, content, "", [])
# DeepSeek R1 (same markers): its template opens <think> in the prompt
add("deepseek_r1_reasoning", "deepseek_v3", "Reason about it.\n</think>\n\nFinal answer ✓", "Final answer ✓",
    "Reason about it.", [], start_in_reasoning=True)
# DeepSeek V3.1 (its template writes NAME<｜tool▁sep｜>ARGS; thinking mode opens <think> in the prompt)
for vname, content, reasoning, idx in VARIANTS:
    calls = calls_of(idx)
    t = ""
    if reasoning is not None:
        t += reasoning + "</think>"
    t += content
    if calls:
        t += "<｜tool▁calls▁begin｜>" + "".join(
            "<｜tool▁call▁begin｜>" + c["function"]["name"] + "<｜tool▁sep｜>" + json.dumps(c["function"]["arguments"], ensure_ascii=False) + "<｜tool▁call▁end｜>"
            for c in calls) + "<｜tool▁calls▁end｜>"
    add("deepseek_v31_" + vname, "deepseek_v31", t, content, reasoning or "", expect_calls(calls),
        start_in_reasoning=reasoning is not None)

# --- Kimi K2 Thinking ---
for vname, content, reasoning, idx in VARIANTS:
    calls = calls_of(idx)
    for i, c in enumerate(calls):
        c["id"] = f"functions.{c['function']['name']}:{i}"
    a = {"role": "assistant", "content": content, "reasoning_content": reasoning or ""}
    if calls:
        a["tool_calls"] = calls
    _, text = generated("kimi_k2", USER, a, ["<|im_end|>"])
    # the template keeps reasoning only after the last assistant message without tool calls
    add("kimi_k2_" + vname, "kimi_k2", text, content, (reasoning or "") if calls else "", expect_calls(calls, kimi=True))

# --- GLM (4.5/4.6 write newlines between parts, 4.7/5 do not) ---
for style in ("glm45", "glm47"):
    nl = "\n" if style == "glm45" else ""
    for vname, content, reasoning, idx in VARIANTS:
        calls = calls_of(idx)
        t = ("<think>" + reasoning + "</think>" if reasoning is not None else "<think></think>") + nl + content
        for c in calls:
            t += nl + "<tool_call>" + c["function"]["name"] + nl
            for k, v in c["function"]["arguments"].items():
                t += "<arg_key>" + k + "</arg_key>" + nl + "<arg_value>" + (v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)) + "</arg_value>" + nl
            t += "</tool_call>"
        add(f"{style}_{vname}", "glm", t, content, reasoning or "", expect_calls(calls))

# --- gpt-oss harmony (the prompt ends with <|start|>assistant) ---
for vname, content, reasoning, idx in VARIANTS:
    calls = calls_of(idx)
    t = ""
    if reasoning is not None:
        t += "<|channel|>analysis<|message|>" + reasoning + "<|end|><|start|>assistant"
    if calls:
        if content:
            t += "<|channel|>commentary<|message|>" + content + "<|end|><|start|>assistant"
        for i, c in enumerate(calls):
            if i % 2 == 0:
                t += "<|channel|>commentary to=functions." + c["function"]["name"] + " <|constrain|>json<|message|>"
            else:  # the recipient may also come before the channel
                t += " to=functions." + c["function"]["name"] + "<|channel|>commentary json<|message|>"
            t += json.dumps(c["function"]["arguments"]) + "<|call|>"
            if i + 1 < len(calls):
                t += "<|start|>assistant"
    else:
        t += "<|channel|>final<|message|>" + content + "<|return|>"
    add("harmony_" + vname, "harmony", t, content, reasoning or "", expect_calls(calls))

# --- Kimi K3 XTML, rendered by its reference encoder (encoding_k3.py next to the K2 template) ---
sys.path.insert(0, KIMI.rsplit("/", 1)[0])
from encoding_k3 import build_chat_segments  # noqa: E402


def k3(msgs, **kw):
    return "".join(s.text for s in build_chat_segments(msgs, **kw))


for thinking in (True, False):
    for vname, content, reasoning, idx in VARIANTS:
        calls = calls_of(idx)
        a = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        if calls:
            a["tool_calls"] = calls
        prompt = k3(USER, add_generation_prompt=True, thinking=thinking, thinking_effort="high")
        full = k3(USER + [a], add_generation_prompt=False, thinking=thinking, thinking_effort="high")
        assert full.startswith(prompt)
        text = full[len(prompt):]
        if not thinking:  # the prompt opened the response; the rendering repeats the message head
            head = '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>'
            assert prompt.endswith(head) and full[len(prompt) - len(head):].startswith(head)
        if text.endswith("<|end_of_msg|>"):
            text = text[: -len("<|end_of_msg|>")]
        add(f"xtml_{'think' if thinking else 'nothink'}_{vname}", "xtml", text, content,
            (reasoning or "") if thinking else "", expect_calls(calls), start_in_reasoning=thinking)
# arguments that are not JSON travel as a raw block
a = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"city": "Par'}}]}
prompt = k3(USER, add_generation_prompt=True)
text = k3(USER + [a], add_generation_prompt=False)[len(prompt):]
CASES.append({"name": "xtml_raw_json_block", "format": "xtml", "start_in_reasoning": True, "text": text,
              "expect": {"content": "", "reasoning": "", "tool_calls": [{"name": "f", "arguments_raw": '{"city": "Par'}]}})

json.dump(CASES, sys.stdout, ensure_ascii=False)
