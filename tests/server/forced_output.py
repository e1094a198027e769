#!/usr/bin/python3
"""A model output with known meaning for the server's tool-call and reasoning checks.

usage: forced_output.py TOKENIZER_CONFIG OUT_TEXT OUT_EXPECT_JSON
Renders one assistant turn (reasoning, content, two tool calls) with the model's
official chat template (tokenizer_config.json's chat_template, Qwen3) through
python3-jinja2 with transformers' settings, and keeps what the model itself would
generate: the rendering after the generation prompt, up to and including the
end-of-turn token. moonshine-server --test-forced-output emits exactly these
tokens; the SDK test expects the message below back.
"""
import json
import sys

import jinja2

cfg_path, out_text, out_expect = sys.argv[1:4]


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
t = env.from_string(json.load(open(cfg_path, encoding="utf-8"))["chat_template"])

user = [{"role": "user", "content": "What is the weather in Paris and in Zürich?"}]
calls = [
    {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": [1, 2]}}},
]
assistant = {"role": "assistant", "content": "Let me check both cities.",
             "reasoning_content": "The user wants two forecasts.\nI will call get_weather twice.", "tool_calls": calls}
prompt = t.render(messages=user, add_generation_prompt=True)
full = t.render(messages=user + [assistant], add_generation_prompt=False)
assert full.startswith(prompt)
out = full[len(prompt):]
assert out.endswith("<|im_end|>\n"), out[-40:]
out = out[:-1]  # the model stops at <|im_end|> (an EOS id); the newline is the template's
open(out_text, "w", encoding="utf-8").write(out)
json.dump({"content": assistant["content"], "reasoning_content": assistant["reasoning_content"],
           "tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]},
          open(out_expect, "w", encoding="utf-8"), ensure_ascii=False)
