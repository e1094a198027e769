"""Real chat templates (tests/data/tokenizers) and chat-template-style templates
written for this test, each rendered over a set of conversations.

cases(tokdir) yields (name, template, request, tokenizer_config)."""
import json
import os

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city; returns °C.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
        "threshold": {"type": "number", "default": 0.5}},
        "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "top_k": {"type": "integer"}},
                   "required": ["q"]}}}

CONVS = {
    "plain": [{"role": "user", "content": "What is 2+2?"}],
    "system_multi": [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a color."}],
    "two_systems": [
        {"role": "system", "content": "Rule one."}, {"role": "system", "content": "Rule two."},
        {"role": "user", "content": "ok?"}],
    "reasoning_multi": [
        {"role": "user", "content": "Think then answer: 3*7?"},
        {"role": "assistant", "content": "21", "reasoning_content": "3 times 7 is 21."},
        {"role": "user", "content": "And 3*8?"},
        {"role": "assistant", "content": "24", "reasoning_content": "3*8 = 24.\n"},
        {"role": "user", "content": "And 3*9?"}],
    "think_in_content": [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nhidden steps\n</think>\n\nvisible answer"},
        {"role": "user", "content": "Q2"}],
    "tool_roundtrip": [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Paris and Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "{\"temp\": 17.5}"},
        {"role": "assistant", "content": "Paris 21°C, Zürich 17.5°C."},
        {"role": "user", "content": "Thanks! 😀"}],
    "tool_roundtrip_str": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": {"q": "paris weather"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
        {"role": "assistant", "content": "<think>\nboth agree\n</think>\n\nSunny, 21°C."},
        {"role": "user", "content": "<tool_response>not really a tool</tool_response>"}],
    "tool_dict_args": [
        {"role": "user", "content": "Search for cats"},
        {"role": "assistant", "content": "Let me search.", "reasoning_content": "user wants cats",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": {"q": "cats", "top_k": 3}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cats are mammals"}],
    "tool_pending": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "threshold": 0.25, "days": 2}}}]},
        {"role": "tool", "content": "<tool_response>rain</tool_response>"}],
    "unicode_ws": [
        {"role": "system", "content": "  spaced system\n\n"},
        {"role": "user", "content": "日本語のテキスト\t\ttabs  and   spaces\r\nCRLF"},
        {"role": "assistant", "content": "  \n"},
        {"role": "user", "content": "emoji 👨‍👩‍👧 🇫🇷 and \"quotes\" 'single' \\ backslash"}],
    "content_parts": [
        {"role": "system", "content": [{"type": "text", "text": "Parts system."}]},
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image", "url": "x.png"}, "raw string part"]},
        {"role": "assistant", "content": [{"type": "text", "text": " I see. "}]},
        {"role": "user", "content": "ok"}],
    "empty_messages": [],
    "bad_role": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}],
}

KWARGS = [{}, {"enable_thinking": False}, {"enable_thinking": True}]

# Templates in the style of widely used chat templates, written for this test.
STYLE_TEMPLATES = {
    "chatml": (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    "alternating_strict": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
        "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
        "{% set system_message = false %}{% endif %}"
        "{% for message in loop_messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
        "{% else %}{% set content = message['content'] %}{% endif %}"
        "{% if message['role'] == 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' }}"
        "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"),
    "tools_header": """{%- set date_string = "26 Jul 2024" %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- bos_token }}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message | default(false) %}
    {{- "You have access to the following functions.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
""",
    "macro_render": """{%- macro render_content(content) -%}
{%- if content is string -%}{{ content | trim }}
{%- elif content is iterable -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- else -%}{{ content }}{%- endif -%}
{%- endmacro -%}
{%- macro tool_sig(t) -%}
{{ t.function.name }}({% for name, p in t.function.parameters.properties | items %}{{ name }}: {{ p.type }}{% if p.default is defined %} = {{ p.default | tojson }}{% endif %}{% if not loop.last %}, {% endif %}{% endfor %})
{%- endmacro -%}
{{ bos_token }}
{%- if tools %}
<tools>
{% for t in tools %}
- {{ tool_sig(t) }}: {{ t.function.description | default('no description') }}
{% endfor %}
</tools>
{% endif %}
{%- for m in messages %}
<turn role="{{ m.role }}"{% if m.tool_call_id is defined %} id="{{ m.tool_call_id }}"{% endif %}>
{%- if m.reasoning_content and enable_thinking | default(true) %}
<think>{{ m.reasoning_content | trim }}</think>
{%- endif %}
{{ render_content(m.content) }}
{%- for tc in m.tool_calls | default([]) %}
<call name="{{ tc.function.name }}">{{ tc.function.arguments if tc.function.arguments is string else tc.function.arguments | tojson(sort_keys=true) }}</call>
{%- endfor %}
</turn>
{%- endfor %}
{%- if add_generation_prompt %}
<turn role="assistant">{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}
{%- endif %}
""",
    "namespace_state": """{%- set ns = namespace(sys='', last_user=-1, n_tool=0, seen=[]) -%}
{%- for m in messages -%}
  {%- if m.role == 'system' -%}{%- set ns.sys = ns.sys ~ (m.content if not ns.sys else '\\n' ~ m.content) -%}
  {%- elif m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}
  {%- elif m.role == 'tool' -%}{%- set ns.n_tool = ns.n_tool + 1 -%}{%- endif -%}
  {%- set ns.seen = ns.seen + [m.role] -%}
{%- endfor -%}
[sys={{ ns.sys | tojson }}][last_user={{ ns.last_user }}][tools={{ ns.n_tool }}][roles={{ ns.seen | unique | join('/') }}]
{% for m in messages if m.role != 'system' -%}
{{ loop.index }}. {{ m.role | capitalize }}{{ ' (latest)' if loop.index0 + (messages|length - loop.length) == ns.last_user else '' }}: {{ (m.content or '') | replace('\\n', ' ') | truncate(30) }}
{% else -%}
(no turns)
{% endfor -%}
{{ messages | selectattr('role', 'equalto', 'assistant') | map(attribute='content') | select | list | length }} assistant replies
{%- if add_generation_prompt %}

Assistant:{% endif %}""",
}

# Constructs of tool-schema renderers (recursive macros over JSON schemas), of
# templates with content-part lists, and of strict tool-call-id checks.
STYLE_TEMPLATES["schema_macros"] = """{%- macro ts_type(spec, nullable=false) -%}
{%- if spec is not mapping -%}any
{%- elif spec.type is defined and spec.type is not string -%}{%- for t in spec.type -%}{{ ts_type({'type': t}) }}{{ ' | ' if not loop.last }}{%- endfor -%}
{%- elif spec.enum is defined -%}{{ spec.enum | map('tojson') | join(' | ') }}
{%- elif spec.type == 'array' -%}{%- if spec['items'] is defined -%}{{ ts_type(spec['items']) }}[]{%- else -%}any[]{%- endif -%}
{%- elif spec.type == 'object' -%}{
{%- for name, sub in (spec.properties | default({})) | dictsort %} {{ name }}{{ '?' if name not in (spec.required | default([])) }}: {{ ts_type(sub) }};{% endfor %} }
{%- elif spec.type in ['integer', 'number'] -%}number
{%- elif spec.type == 'string' -%}string
{%- elif spec.type == 'boolean' -%}boolean
{%- else -%}any{%- endif -%}
{%- if nullable %} | null{% endif -%}
{%- endmacro -%}
{%- macro render_tools(tools) -%}
namespace functions {
{% for tool in tools %}
{%- set fn = tool.function if tool.function is defined else tool %}
// {{ fn.description | default('') | replace('\\n', ' ') }}
type {{ fn.name }} = (_: {{ ts_type(fn.parameters) }}) => any;
{% endfor -%}
} // namespace functions
{%- endmacro -%}
<|start|>system<|message|>Knowledge cutoff: 2024-06
Reasoning: {{ reasoning_effort | default('medium') }}
{%- if tools %}

{{ render_tools(tools) }}
{%- endif %}<|end|>
{%- set last = namespace(tool=none) %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}
{%- if m.reasoning_content and loop.last %}<|start|>assistant<|channel|>analysis<|message|>{{ m.reasoning_content }}<|end|>{% endif %}
{%- for tc in m.tool_calls | default([]) %}
{%- set last.tool = tc.function.name %}<|start|>assistant to=functions.{{ tc.function.name }}<|channel|>commentary json<|message|>{{ tc.function.arguments if tc.function.arguments is string else tc.function.arguments | tojson }}<|call|>
{%- endfor %}
{%- if m.content %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>{% endif %}
{%- elif m.role == 'tool' %}
{%- if last.tool is none %}{{ raise_exception('tool result without a preceding tool call') }}{% endif %}<|start|>functions.{{ last.tool }} to=assistant<|channel|>commentary<|message|>{{ m.content | tojson if m.content is not string else m.content }}<|end|>
{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""

STYLE_TEMPLATES["parts_and_ids"] = """{%- macro visible(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable and content is not mapping -%}
{%- for item in content -%}{%- if item is mapping and item.type == 'text' -%}{{ item.text }}{%- elif item is string -%}{{ item }}{%- endif -%}{%- endfor -%}
{%- elif content is none -%}
{%- else -%}{{ content }}{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- if tools %}<|tools|>{{ tools | tojson(separators=(',', ':')) }}<|/tools|>{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<|user|>{{ visible(m.content) }}{{ ' /nothink' if enable_thinking is defined and not enable_thinking and loop.index0 == ns.last_user }}
{%- elif m.role == 'assistant' %}<|assistant|>
{%- set rc = m.reasoning_content if m.reasoning_content is string else '' %}
{%- if loop.index0 > ns.last_user and rc %}<think>{{ rc.strip() }}</think>{% endif %}
{{- visible(m.content).strip() }}
{%- if m.tool_calls is defined and m.tool_calls is not none and m.tool_calls | length > 0 %}
{%- for tc in m.tool_calls %}
{%- set f = tc.function if tc.function is defined else tc %}
<|call|>{{ f.name }}
{%- if f.arguments is mapping %}{% for k, v in f.arguments.items() %}
<arg>{{ k }}={{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg>
{%- endfor %}{% else %}
<raw>{{ f.arguments }}</raw>{% endif %}
{%- if tc.id is defined and tc.id | length != 6 and tc.id[:5] != 'call_' %}{{ raise_exception('bad tool call id ' ~ tc.id) }}{% endif %}
{%- endfor %}
{%- endif %}
{%- elif m.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|observations|>{% endif %}
<obs{{ ' id=' ~ m.tool_call_id if m.tool_call_id is defined }}>{{ visible(m.content) }}</obs>
{%- elif m.role == 'system' %}<|system|>{{ visible(m.content) | trim }}
{%- else %}{{ raise_exception('Unknown role: ' ~ m.role) }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}"""


def _conv_request(msgs, tools, agp, kw):
    req = {"messages": msgs, "add_generation_prompt": agp, "chat_template_kwargs": kw}
    if tools is not None:
        req["tools"] = tools
    return req


def cases(tokdir):
    for tok in ["deepseek_v3", "qwen3", "gptoss"]:
        cfg_path = os.path.join(tokdir, tok, "tokenizer_config.json")
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
        tpl = cfg.get("chat_template")
        if not isinstance(tpl, str):
            continue
        small_cfg = {k: v for k, v in cfg.items() if k != "added_tokens_decoder"}
        for cname, msgs in CONVS.items():
            for tools in (None, [WEATHER_TOOL, SEARCH_TOOL]):
                for agp in (True, False):
                    for kw in KWARGS:
                        name = f"{tok}/{cname}/{'tools' if tools else 'notools'}/agp={agp}/{json.dumps(kw)}"
                        yield name, tpl, _conv_request(msgs, tools, agp, kw), small_cfg
    style_cfg = {"bos_token": "<s>", "eos_token": "</s>"}
    for sname, tpl in STYLE_TEMPLATES.items():
        for cname, msgs in CONVS.items():
            for tools in (None, [WEATHER_TOOL, SEARCH_TOOL]):
                for agp in (True, False):
                    for kw in KWARGS[:2]:
                        name = f"style-{sname}/{cname}/{'tools' if tools else 'notools'}/agp={agp}/{json.dumps(kw)}"
                        yield name, tpl, _conv_request(msgs, tools, agp, kw), style_cfg
