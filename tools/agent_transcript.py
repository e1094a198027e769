#!/usr/bin/env python3
"""A scripted 10-turn agent transcript through moonshine-server: prefix reuse per turn.

usage: tools/agent_transcript.py [--server "build/moonshine serve"] [--cli build/moonshine]
                                 [--archs gqa,mla,kda,dsa] [--turns 10] [--threads 1]
                                 [--work build/tmp/agent-transcript] [--check]

For each architecture a random-weight model is synthesized with the real Qwen3 tokenizer and
chat template (GQA: qwen3_moe, MLA: deepseek_v3, KDA: kimi_linear (KDA + MLA layers), DSA:
deepseek_v32). The server runs with --test-forced-output: every reply is one the model family
would write (reasoning, a sentence, a tool call), rendered from the official template with
python3-jinja2, so the transcript is meaningful although the weights are noise. The client
is an agent loop: each reply's message goes back as the server returned it (content,
reasoning_content, tool_calls), then a tool result; at turns 4 and 8 a new user message
follows the tool result (the Qwen3 template then drops the reasoning of the earlier turns:
the render changes bytes inside the conversation).

Per turn it reports the prompt tokens, the tokens the server reused (usage cached_tokens),
and what they should be:
  common   the common prefix of this render and what the server held after the previous
           turn (its canonical prompt + the reply's ids), matched on the tokens' bytes as
           the server matches (session/generate.h ms_gen_align): for a model that rolls back,
           cached must equal it;
  floor    for a model that cannot, the longest snapshot it should hold that is a prefix of
           the prompt (the prefill checkpoints of the earlier turns, every K tokens and at
           message boundaries, the prompt ends and the reply ends): cached must be at least it;
and the time to the first token on this server (warm) and on a second server with no
prefix cache, cleared by an unrelated request before each turn (cold).
Prints one JSON object per architecture and, last, a markdown table. --check exits 1 when
a rule above does not hold.
"""
import argparse
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import jinja2

ap = argparse.ArgumentParser()
ap.add_argument("--server", default="build/moonshine serve")
ap.add_argument("--cli", default="build/moonshine")
ap.add_argument("--archs", default="gqa,mla,kda,dsa")
ap.add_argument("--turns", type=int, default=10)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--work", default="build/tmp/agent-transcript")
ap.add_argument("--check", action="store_true")
args = ap.parse_args()

ARCHS = {
    "gqa": ("qwen3_moe", "tests/server/tiny_qwen3.json"),
    "mla": ("deepseek_v3", "tests/data/fixtures/models/deepseek_v3/config.json"),
    "kda": ("kimi_linear", "tests/data/fixtures/models/kimi_linear/config.json"),
    "dsa": ("deepseek_v32", "tests/data/fixtures/models/deepseek_v32/config.json"),
}
W = args.work
TOK = os.path.join(W, "tokenizer")
os.makedirs(TOK, exist_ok=True)
if not os.path.exists(os.path.join(TOK, "tokenizer.json")):
    with gzip.open("tests/data/tokenizers/qwen3/tokenizer.json.gz") as f, open(os.path.join(TOK, "tokenizer.json"), "wb") as o:
        o.write(f.read())
shutil.copy("tests/data/tokenizers/qwen3/tokenizer_config.json", TOK)
TOKJ = json.load(open(os.path.join(TOK, "tokenizer.json"), encoding="utf-8"))
TEMPLATE_SRC = json.load(open(os.path.join(TOK, "tokenizer_config.json"), encoding="utf-8"))["chat_template"]

# ---- token bytes (byte-level BPE: GPT-2's byte <-> unicode map), specials ----
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
U2B = {chr(c): b for b, c in zip(bs, cs)}
TBYTES = {i: bytes(U2B[ch] for ch in t) for t, i in TOKJ["model"]["vocab"].items()}
SPECIAL = set()
for a in TOKJ["added_tokens"]:
    TBYTES[a["id"]] = a["content"].encode()
    if a["special"]:
        SPECIAL.add(a["id"])


def align(known, prompt):
    """ms_gen_align: (k_used, p_used), the longest pair of token prefixes with the same bytes that
    end on a boundary of both, within the longest common byte prefix; a special token matches
    only itself."""
    x = 0
    while x < len(known) and x < len(prompt) and known[x] == prompt[x]:
        x += 1
    ka = pa = x
    if x == len(known) or x == len(prompt):
        return ka, pa
    y = x
    ox = oy = 0
    while True:
        if ox == 0 and oy == 0:
            ka, pa = x, y
            if x == len(known) or y == len(prompt):
                return ka, pa
            if known[x] == prompt[y]:
                x += 1
                y += 1
                continue
        if x == len(known) or y == len(prompt):
            return ka, pa
        if known[x] in SPECIAL or prompt[y] in SPECIAL:
            return ka, pa
        bx, by = TBYTES[known[x]], TBYTES[prompt[y]]
        k = min(len(bx) - ox, len(by) - oy)
        if bx[ox:ox + k] != by[oy:oy + k]:
            return ka, pa
        ox += k
        oy += k
        if ox == len(bx):
            x, ox = x + 1, 0
        if oy == len(by):
            y, oy = y + 1, 0


def checkpoints(ids, every):
    """The server's prefill checkpoint positions of a prompt (session/generate.h)."""
    gap = max(16, every // 16)
    out, last = [], 0
    for q in range(1, len(ids)):
        if every and q % every == 0:
            out.append(q)
            last = q
        elif q - last >= gap and ids[q] in SPECIAL and ids[q - 1] not in SPECIAL:
            out.append(q)
            last = q
    return out


# ---- the transcript ----
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(jinja2.exceptions.TemplateError(m))
TEMPLATE = env.from_string(TEMPLATE_SRC)
TOOLS = [{"type": "function", "function": {
    "name": "search", "description": "Search the project's documentation and return the best matching passages.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "what to look for"},
                                                    "limit": {"type": "integer", "description": "passages to return"}},
                   "required": ["query"]}}}]
SYSTEM = ("You are a careful engineering assistant working on a C inference engine. Use the search tool to find "
          "facts before you answer, cite what you found, and keep answers short. " * 4)
QUESTIONS = ["How does the prefix cache survive a restart?", "Now check how checkpoints are bounded.",
             "And what happens to a corrupt state file?"]
# the reply the model family writes (forced): reasoning, a sentence, one tool call; ends at <|im_end|>
_u = [{"role": "user", "content": QUESTIONS[0]}]
_a = {"role": "assistant", "content": "Let me search the documentation.",
      "reasoning_content": "The user asks about the engine.\nI should search the documentation first, then answer.",
      "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "prefix cache restart", "limit": 3}}}]}
_p = TEMPLATE.render(messages=_u, tools=TOOLS, add_generation_prompt=True)
_f = TEMPLATE.render(messages=_u + [_a], tools=TOOLS, add_generation_prompt=False)
assert _f.startswith(_p) and _f.endswith("<|im_end|>\n")
FORCED = _f[len(_p):-1]
open(os.path.join(W, "forced.txt"), "w", encoding="utf-8").write(FORCED)
RESULT = ("Passage {k}: the cache keeps snapshots of the causal state keyed by token ids; state files are written "
          "atomically and checked before use; eviction is least recently used by bytes. (turn {t})")

procs = []


def start(model, log, extra):
    f = open(log, "w")
    p = subprocess.Popen(args.server.split() + [model, "--port", "0", "--threads", str(args.threads), "--ctx", "4096",
                                                "--parser", "qwen3", "--slots", "1", "--model-name", "m",
                                                "--test-forced-output", os.path.join(W, "forced.txt"), *extra],
                         stderr=f, stdout=subprocess.DEVNULL)
    procs.append(p)
    for _ in range(600):
        txt = open(log).read()
        m = re.search(r"listening on http://[0-9.]+:(\d+)", txt)
        if m:
            ck = re.search(r"prefill checkpoints every (\d+) tokens", txt)
            return p, int(m.group(1)), "prefix reuse rollback" in txt, int(ck.group(1)) if ck else 0
        if p.poll() is not None:
            break
        time.sleep(0.1)
    sys.exit("agent_transcript: the server did not start:\n" + open(log).read())


def post(port, path, body, stream=False):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def tokenize(port, messages):
    with post(port, "/tokenize", {"messages": messages, "tools": TOOLS}) as r:
        return json.load(r)["tokens"]


def turn(port, messages):
    """A streamed chat turn: (assistant message as received, usage, ttft seconds)."""
    t0 = time.monotonic()
    ttft, msg, calls, usage = None, {"role": "assistant", "content": "", "reasoning_content": ""}, {}, None
    with post(port, "/v1/chat/completions", {"messages": messages, "tools": TOOLS, "max_tokens": 256, "temperature": 0,
                                             "stream": True, "stream_options": {"include_usage": True}}, True) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            usage = j.get("usage") or usage
            for c in j.get("choices", []):
                d = c.get("delta", {})
                if ttft is None and (d.get("content") or d.get("reasoning_content") or d.get("tool_calls")):
                    ttft = time.monotonic() - t0
                msg["content"] += d.get("content") or ""
                msg["reasoning_content"] += d.get("reasoning_content") or ""
                for tc in d.get("tool_calls") or []:
                    x = calls.setdefault(tc["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                    x["id"] += tc.get("id") or ""
                    x["function"]["name"] += (tc.get("function") or {}).get("name") or ""
                    x["function"]["arguments"] += (tc.get("function") or {}).get("arguments") or ""
    if calls:
        msg["tool_calls"] = [calls[k] for k in sorted(calls)]
    if not msg["content"]:
        msg["content"] = None
    return msg, usage, ttft


def run_arch(arch):
    mt, cfg_path = ARCHS[arch]
    cfg = json.load(open(cfg_path, encoding="utf-8"))
    cfg.update(vocab_size=151936, max_position_embeddings=8192, bos_token_id=151643, eos_token_id=151645)
    cp = os.path.join(W, f"{arch}.json")
    json.dump(cfg, open(cp, "w"))
    model = os.path.join(W, arch)
    subprocess.run([args.cli, "synth", "--config", cp, "--out", model, "--tokenizer", TOK, "--seed", "3"], check=True,
                   stdout=subprocess.DEVNULL)
    warm, wport, rollback, every = start(model, os.path.join(W, f"{arch}-warm.log"), [])
    cold, cport, _, _ = start(model, os.path.join(W, f"{arch}-cold.log"), ["--prefix-cache-entries", "0"])
    with post(wport, "/tokenize", {"prompt": FORCED}) as r:
        forced = json.load(r)["tokens"]
    fed = forced[:-1] if forced[-1] == 151645 else forced  # the EOS ends the reply, it is not fed
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    rows, known, entries, ok = [], None, [], True
    for t in range(1, args.turns + 1):
        ids = tokenize(wport, messages)
        if known is None:
            k = p = 0
        else:
            k, p = align(known, ids)
        canon = (known[:k] if known else []) + ids[p:]
        common = min(k, len(canon) - 1)
        floor = max([len(e) for e in entries if len(e) <= len(canon) - 1 and canon[:len(e)] == e] + [0])
        with post(cport, "/v1/completions", {"prompt": [100 + t, 200, 300], "max_tokens": 1}) as r:  # clear the cold slot
            r.read()
        _, cu, cold_ttft = turn(cport, messages)
        msg, u, warm_ttft = turn(wport, messages)
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        good = cached == common if rollback else cached >= floor
        ok &= good and (cu.get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0
        rows.append({"turn": t, "prompt_tokens": u["prompt_tokens"], "cached": cached, "common": common,
                     "floor": None if rollback else floor, "ttft_warm_s": round(warm_ttft, 4),
                     "ttft_cold_s": round(cold_ttft, 4), "ok": good})
        # what the server holds now: the canonical prompt, its checkpoints (the part it fed), its end, the reply
        if not rollback:
            entries += [canon[:q] for q in checkpoints(canon, every) if q > cached]
            entries.append(canon)
        known = canon + fed
        if not rollback:
            entries.append(known)
        messages.append(msg)
        for k_, tc in enumerate(msg.get("tool_calls") or []):
            messages.append({"role": "tool", "tool_call_id": tc["id"],
                             "content": "\n".join(RESULT.format(k=j, t=t) for j in range(6))})
        if t % 4 == 0:
            messages.append({"role": "user", "content": QUESTIONS[(t // 4) % len(QUESTIONS)]})
    for p_ in (warm, cold):
        p_.send_signal(signal.SIGTERM)
        p_.wait(timeout=120)
    tw = sum(r["ttft_warm_s"] for r in rows[1:])
    tc_ = sum(r["ttft_cold_s"] for r in rows[1:])
    out = {"arch": arch, "model_type": mt, "rollback": rollback, "checkpoint_every": every or None, "turns": rows,
           "reused_tokens": sum(r["cached"] for r in rows), "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
           "ttft_cold_over_warm_turns_2_on": round(tc_ / tw, 2) if tw else None, "ok": ok}
    print(json.dumps(out), flush=True)
    return out


results = []
try:
    for a in args.archs.split(","):
        results.append(run_arch(a))
finally:
    for p_ in procs:
        if p_.poll() is None:
            p_.kill()
            p_.wait()
print("\n| turn | " + " | ".join(f"{r['arch']} ({r['model_type']}) prompt / cached / expected / TTFT warm, cold ms" for r in results) + " |")
print("| --- |" + " --- |" * len(results))
for i in range(args.turns):
    cells = []
    for r in results:
        x = r["turns"][i]
        exp = x["common"] if r["rollback"] else f"≥{x['floor']}"
        cells.append(f"{x['prompt_tokens']} / {x['cached']} / {exp} / {x['ttft_warm_s'] * 1000:.0f}, {x['ttft_cold_s'] * 1000:.0f}")
    print(f"| {i + 1} | " + " | ".join(cells) + " |")
sys.exit(0 if not args.check or all(r["ok"] for r in results) else 1)
