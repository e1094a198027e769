#!/usr/bin/python3
"""Scripted sessions of `moonshine chat` over a tiny random-weight Qwen3-MoE model that
carries the real Qwen3 tokenizer and chat template (tests/data/tokenizers/qwen3).

References no one here wrote: every turn's prompt ids must equal Debian's python3-jinja2
rendering of the whole conversation with the official template (configured as transformers'
apply_chat_template, tests/text/jinja_diff.py) tokenized by the tokenizer (itself checked
against Hugging Face tokenizers on tests/data/fixtures/text/tok_dev.json); the cached count
must be the longest common prefix of that prompt with the tokens the engine holds.

usage: test_chat.py MODEL_DIR OTHER_MODEL_DIR WORKDIR   (env MOONSHINE: the CLI binary)
Prints "N passed, 0 failed" last; exits 1 on the first failure.
"""
import json
import os
import pty
import re
import select
import shutil
import stat
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "text"))
import jinja_diff  # noqa: E402  (transformers' jinja2 environment)

EXE = os.environ.get("MOONSHINE", os.path.join(ROOT, "build", "moonshine")).split()
MODEL, OTHER, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
BASE = ["--threads", "1", "--max-tokens", "10", "--no-history"]
PASSED = 0


def check(cond, what):
    global PASSED
    if not cond:
        print(f"FAIL: {what}")
        print("0 passed, 1 failed")
        sys.exit(1)
    PASSED += 1


def chat(lines, *flags, expect_rc=0, base=None):
    """Run one non-interactive session; returns the JSON objects it printed."""
    r = subprocess.run(EXE + ["chat", MODEL, "--json"] + (base or BASE) + list(flags), input="".join(lines).encode(),
                       capture_output=True, timeout=120)
    err = r.stderr.decode(errors="replace")
    check(r.returncode == expect_rc, f"chat {flags}: exit {r.returncode}, expected {expect_rc}; stderr: {err}")
    check("runtime error" not in err and "ERROR: " not in err, f"sanitizer report: {err}")
    return [json.loads(l) for l in r.stdout.decode().splitlines() if l.strip()]


TOK_CONFIG = json.load(open(os.path.join(MODEL, "tokenizer_config.json"), encoding="utf-8"))
TEMPLATE = jinja_diff.ENV.from_string(TOK_CONFIG["chat_template"])


def reference_ids(messages, tools=None):
    text = TEMPLATE.render(messages=messages, tools=tools, documents=None, add_generation_prompt=True,
                           **jinja_diff.special_tokens(TOK_CONFIG))
    r = subprocess.run(EXE + ["tokenize", MODEL], input=text.encode(), capture_output=True, timeout=60)
    check(r.returncode == 0, f"tokenize: {r.stderr.decode(errors='replace')}")
    return json.loads(r.stdout)


def lcp(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def assistant(turn):
    m = {"role": "assistant", "content": turn["content"]}
    if turn["reasoning_content"] is not None:
        m["reasoning_content"] = turn["reasoning_content"]
    return m


# ---- 1. a multi-turn greedy session: byte-identical prompts and prefix reuse ----
users = ["Hello there", "Two lines:\nfirst\nsecond", "Unicode: héllo wörld\n— 你好 🌍"]
# one line; a """ block; a line continued by a trailing backslash
lines = ["Hello there\n", '"""\nTwo lines:\nfirst\nsecond\n"""\n', "Unicode: héllo wörld\\\n— 你好 🌍\n"]
system = "You are terse."
turns = chat(lines, "--temperature", "0", "--json-ids", "--system", system)
check(len(turns) == 3 and all("content" in t for t in turns), f"3 turns, got {turns}")
messages = [{"role": "system", "content": system}]
history = []
for i, t in enumerate(turns):
    messages.append({"role": "user", "content": users[i]})
    ref = reference_ids(messages)
    check(t["prompt_ids"] == ref, f"turn {i + 1}: prompt ids differ from jinja2 + tokenizer\n{t['prompt_ids']}\n{ref}")
    u = t["usage"]
    check(u["prompt_tokens"] == len(ref), f"turn {i + 1}: prompt_tokens {u['prompt_tokens']} != {len(ref)}")
    want_cached = min(lcp(history, ref), len(ref) - 1)
    check(u["prompt_tokens_details"]["cached_tokens"] == want_cached,
          f"turn {i + 1}: cached {u['prompt_tokens_details']['cached_tokens']}, the common prefix is {want_cached}")
    if i:
        prev = turns[i - 1]
        check(want_cached >= len(prev["prompt_ids"]), f"turn {i + 1}: the previous prompt is not reused")
    # forwarded: the prompt's suffix, then one decode step per sampled id but the last
    n_out = len(t["completion_ids"])
    check(u["completion_tokens"] == n_out, "completion_tokens == sampled ids")
    check(u["forwarded_tokens"] == len(ref) - want_cached + n_out - 1,
          f"turn {i + 1}: forwarded {u['forwarded_tokens']}, expected {len(ref) - want_cached} + {n_out - 1}")
    history = ref + t["completion_ids"][:-1]
    messages.append(assistant(t))

# ---- 2. reproducible: greedy, and sampled with a seed ----
QUICK = os.environ.get("CHAT_TEST_QUICK") == "1"  # the sanitizer run: fewer sessions, no terminal
if not QUICK:
    again = chat(lines, "--temperature", "0", "--json-ids", "--system", system)
    check([t["completion_ids"] for t in again] == [t["completion_ids"] for t in turns], "greedy replies differ between runs")
    s1 = chat(lines[:2], "--temperature", "0.9", "--top-p", "0.95", "--seed", "11", "--json-ids")
    s2 = chat(lines[:2], "--temperature", "0.9", "--top-p", "0.95", "--seed", "11", "--json-ids")
    s3 = chat(lines[:2], "--temperature", "0.9", "--top-p", "0.95", "--seed", "12", "--json-ids")
    check([t["completion_ids"] for t in s1] == [t["completion_ids"] for t in s2], "same seed, different replies")
    check([t["completion_ids"] for t in s1] != [t["completion_ids"] for t in s3], "another seed, the same replies")
    one = chat([], "--temperature", "0", "--json-ids", "--system", system, "--prompt", users[0])
    check(len(one) == 1 and one[0]["completion_ids"] == turns[0]["completion_ids"], "--prompt differs from the first line")

# ---- 3. /save, then /load in a new process: bit-identical next-token logits ----
os.makedirs(WORK, exist_ok=True)
save = os.path.join(WORK, "conv.json")
la, lb = os.path.join(WORK, "a.logits"), os.path.join(WORK, "b.logits")
for p in (save, save + ".state"):
    if os.path.exists(p):
        os.remove(p)
a = chat([lines[0], f"/save {save}\n", lines[1]], "--temperature", "0", "--json-ids", "--logits-out", la)
check(a[1]["command"] == "save" and a[1]["ok"], f"save: {a[1]}")
check(os.path.exists(save) and os.path.exists(save + ".state"), "save wrote FILE and FILE.state")
check(all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in (save, save + ".state") if os.path.exists(f)),
      "/save files are 0600")
saved = json.load(open(save, encoding="utf-8"))
check(saved["messages"] == [{"role": "user", "content": users[0]}, assistant(a[0])], "saved messages")
b = chat([f"/load {save}\n", "/stats\n", lines[1], "/stats\n"], "--temperature", "0", "--json-ids", "--logits-out", lb)
check(b[0]["command"] == "load" and b[0]["ok"], f"load: {b[0]}")
# /stats after /load counts the loaded turn and the state it brought, then the next turn on top
st0, st1 = b[1], b[3]
b = [b[0], b[2]]
m0 = re.search(r"^turns (\d+);.*; loaded: (\d+) turns, (\d+) tokens of state", st0.get("message", ""))
check(st0.get("command") == "stats" and m0 is not None, f"/stats after /load: {st0}")
n_state = len(a[0]["prompt_ids"]) + len(a[0]["completion_ids"]) - 1  # the last sampled id is not fed
check(m0 is not None and (int(m0.group(1)), int(m0.group(2)), int(m0.group(3))) == (1, 1, n_state),
      f"/stats after /load: {st0.get('message')} (expected turns 1, loaded 1 turn, {n_state} tokens of state)")
m1 = re.search(r"^turns (\d+);.*; loaded: 1 turns, (\d+) tokens", st1.get("message", ""))
check(m1 is not None and int(m1.group(1)) == 2, f"/stats after /load and a turn: {st1.get('message')}")
A, B = open(la, "rb").read(), open(lb, "rb").read()
check(len(A) == 2 * len(B) and len(B) > 0, f"logits sizes {len(A)} {len(B)}")
check(A[len(B):] == B, "next-token logits after /load are not bit-identical to the saving session's")
check(b[1]["completion_ids"] == a[2]["completion_ids"], "the reply after /load differs")
check(b[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == a[2]["usage"]["prompt_tokens_details"]["cached_tokens"]
      and b[1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(a[0]["prompt_ids"]),
      "the loaded state is not reused as the prefix")
check(b[1]["prompt_ids"] == a[2]["prompt_ids"], "prompt after /load")

# ---- 4. corrupt or foreign files are refused, the session continues untouched ----
def variant(name, mutate_json=None, mutate_state=None, state_from=None):
    d = os.path.join(WORK, name)
    os.makedirs(d, exist_ok=True)
    j = json.load(open(save, encoding="utf-8"))
    if mutate_json:
        mutate_json(j)
    f = os.path.join(d, "conv.json")
    with open(f, "w", encoding="utf-8") as fh:
        json.dump(j, fh)
    st = open(state_from or save + ".state", "rb").read()
    if mutate_state:
        st = mutate_state(bytearray(st))
    with open(os.path.join(d, "conv.json.state"), "wb") as fh:
        fh.write(st)
    return f


def flip(at):
    def m(b):
        b[at] ^= 0x40
        return bytes(b)
    return m


# a state file of another conversation (different tokens) for the binding check
other_save = os.path.join(WORK, "other.json")
chat(["Something else entirely\n", f"/save {other_save}\n"], "--temperature", "0")
# a state of another model (different config: another identity)
foreign = os.path.join(WORK, "foreign.json")
r = subprocess.run(EXE + ["chat", OTHER, "--json", "--temperature", "0"] + BASE, input=f"Hi\n/save {foreign}\n".encode(),
                   capture_output=True, timeout=120)
check(r.returncode == 0, f"other model session: {r.stderr.decode(errors='replace')}")
cases = [
    ("state_flip", variant("state_flip", mutate_state=flip(-5)), "checksum"),
    ("state_cut", variant("state_cut", mutate_state=lambda b: bytes(b[: len(b) // 2])), ""),
    ("json_model", variant("json_model", mutate_json=lambda j: j.update(model_id="0" * 64)), "another model"),
    ("json_role", variant("json_role", mutate_json=lambda j: j["messages"][0].update(role="wizard")), "role"),
    ("json_content", variant("json_content", mutate_json=lambda j: j["messages"][1].update(content=7)), "content"),
    ("json_path", variant("json_path", mutate_json=lambda j: j["state"].update(file="../conv.json.state")), "plain file"),
    ("json_version", variant("json_version", mutate_json=lambda j: j.update(version=99)), "version"),
    ("other_state", variant("other_state", state_from=other_save + ".state"), "not the"),
    ("foreign_model", foreign, "another model"),
    ("missing", os.path.join(WORK, "does-not-exist.json"), ""),
]
garbage = os.path.join(WORK, "garbage.json")
with open(garbage, "wb") as fh:
    fh.write(b'{"format": "moonshine-chat", "version": 1, "messages": [')
cases.append(("garbage", garbage, ""))
clean = chat(lines[:2], "--temperature", "0", "--json-ids")
# one session: a turn, every refused load, a turn that must be exactly the clean session's second
script = [lines[0]] + [f"/load {path}\n" for _, path, _ in cases] + [lines[1]]
out = chat(script, "--temperature", "0", "--json-ids", expect_rc=1)
check(len(out) == len(cases) + 2, f"refused loads: {len(out)} outputs")
for k, (name, path, words) in enumerate(cases):
    o = out[1 + k]
    check(o.get("command") == "load" and o["ok"] is False, f"{name}: not refused: {o}")
    msg = o["error"]
    check(words.lower() in msg.lower() and len(msg) > 10, f"{name}: message does not say why: {msg}")
check(out[-1]["completion_ids"] == clean[1]["completion_ids"] and out[-1]["prompt_ids"] == clean[1]["prompt_ids"]
      and out[-1]["usage"] == clean[1]["usage"], "the session changed after refused loads")

# ---- 5. slash commands: /reset keeps the system message and reuses its prefix; /system ----
r = chat([lines[0], "/reset\n", lines[0]], "--temperature", "0", "--json-ids", "--system", system)
check(r[1]["command"] == "reset" and r[2]["prompt_ids"] == r[0]["prompt_ids"], "/reset: the next prompt is not the first")
check(r[2]["completion_ids"] == r[0]["completion_ids"], "/reset: a different reply to the same prompt")
r = chat(["/system Be kind.\n", lines[0]], "--temperature", "0", "--json-ids")
check(r[1]["prompt_ids"] == reference_ids([{"role": "system", "content": "Be kind."},
                                          {"role": "user", "content": users[0]}]), "/system prompt")

# ---- 6. the terminal REPL: Ctrl-C stops a reply, not the program; history file ----
def repl():
    state = os.path.abspath(os.path.join(WORK, "xdg"))
    shutil.rmtree(state, ignore_errors=True)
    env = dict(os.environ, XDG_STATE_HOME=state, TERM="dumb")
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(EXE[0], EXE + ["chat", MODEL, "--threads", "1", "--temperature", "0", "--no-color"], env)
    out = b""

    def read_until(token, limit=60):
        nonlocal out
        end = time.time() + limit
        while token not in out and time.time() < end:
            r_, _, _ = select.select([fd], [], [], 0.2)
            if r_:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    break
        return token in out

    check(read_until(b"> "), f"REPL prompt: {out!r}")
    # the random tiny model may end a reply (end-of-turn token) before the signal lands on a
    # loaded machine: then the turn is complete and the next one is tried, a few times at most
    interrupted, turns = False, 0
    for attempt in range(5):
        line = b"Tell me a long story %d" % attempt
        os.write(fd, line + b"\r")
        check(read_until(line + b"\r\n"), f"line not taken: {out!r}")
        start = out.index(line + b"\r\n") + len(line) + 2
        out = out[start:]
        end = time.time() + 60
        while len(out) < 8 and time.time() < end:  # the reply is streaming (up to the whole context)
            read_until(b"\0", 0.2)
        os.kill(pid, 2)
        turns += 1
        read_until(b"[interrupted]", 10)
        if b"[interrupted]" in out:
            interrupted = True
            break
        check(b"> " in out, f"neither [interrupted] nor a finished reply: {out[-300:]!r}")
        out = out[out.rindex(b"> "):]
    check(interrupted, f"Ctrl-C did not stop the reply in 5 turns: {out[-300:]!r}")
    out = out[out.index(b"[interrupted]"):]
    check(read_until(b"> "), f"no prompt after Ctrl-C: {out!r}")
    os.write(fd, b"/stats\r")
    stats = b"turns %d;" % turns
    check(read_until(stats), f"/stats after an interrupted turn: {out[-300:]!r}")
    out = out[out.index(stats):]
    check(read_until(b"> "), f"no prompt after /stats: {out!r}")
    # libedit prints the prompt, then switches the terminal to raw mode: a ^D typed into the
    # cooked terminal in between would become a literal byte, so give it a moment first
    time.sleep(0.5)
    os.write(fd, b"\x04")  # Ctrl-D
    end, status = time.time() + 60, None
    while time.time() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        read_until(b"\0", 0.2)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        check(False, f"Ctrl-D did not end the session: {out[-300:]!r}")
    os.close(fd)
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"exit status {status}")
    hist = os.path.join(state, "moonshine", "history")
    check(os.path.isfile(hist) and stat.S_IMODE(os.stat(hist).st_mode) == 0o600, "history file 0600")
    check(stat.S_IMODE(os.stat(os.path.dirname(hist)).st_mode) == 0o700, "history directory 0700")
    h = open(hist, "rb").read()
    check(b"long\\040story" in h and b"/stats" in h, f"history content: {h!r}")


# ---- 7. constrained replies and tool-result turns ----
def constrained_and_tools():
    os.makedirs(WORK, exist_ok=True)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
              "required": ["name", "n"]}
    sp = os.path.join(WORK, "schema.json")
    json.dump(schema, open(sp, "w"))
    # --json-schema: every reply parses and validates (random weights: nothing but the mask steers them)
    out = chat(["one\n", "two\n", "three\n"], "--temperature", "0.8", "--seed", "5", "--json-schema", sp,
               base=["--threads", "1", "--max-tokens", "600", "--no-history"])
    check(len(out) == 3, f"3 constrained turns: {out}")
    for t in out:
        check(t["finish_reason"] == "stop", f"a constrained reply ended by {t['finish_reason']}")
        v = json.loads(t["content"])
        check(isinstance(v, dict) and set(v) <= {"name", "n", "tags"} and {"name", "n"} <= set(v), f"keys {v}")
        check(isinstance(v["name"], str) and len(v["name"]) <= 8 and isinstance(v["n"], int) and not isinstance(v["n"], bool),
              f"values {v}")
        check(all(x in ("a", "b") for x in v.get("tags", [])) and len(v.get("tags", [])) <= 2, f"tags {v}")
    # an unsupported keyword is refused before the model loads, by name and pointer
    bad = os.path.join(WORK, "bad.json")
    json.dump({"type": "object", "properties": {"z": {"type": "string", "pattern": "x"}}}, open(bad, "w"))
    r = subprocess.run(EXE + ["chat", MODEL, "--json-schema", bad, "--prompt", "x"] + BASE, capture_output=True, timeout=60)
    check(r.returncode == 2 and b"/properties/z/pattern" in r.stderr, f"bad schema: {r.returncode} {r.stderr!r}")
    # --grammar forcing a Qwen3 tool call, --tools, and /tool answering it: the tool-result turn's
    # prompt is the official template's rendering of user, assistant tool call, tool result
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    tp, gp = os.path.join(WORK, "tools.json"), os.path.join(WORK, "call.gbnf")
    json.dump(tools, open(tp, "w"))
    open(gp, "w").write('root ::= "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"" [a-z]{1,6} "\\"}}\\n</tool_call>"\n')
    long = ["--threads", "1", "--max-tokens", "100", "--no-history"]
    out = chat(["Weather in Paris?\n", '/tool {"temp": 21}\n', "/tool @x nothing left\n"], "--temperature", "0", "--json-ids",
               "--tools", tp, "--grammar", gp, expect_rc=1, base=long)
    check(len(out) == 3, f"tool session: {out}")
    first, second = out[0], out[1]
    check(len(first["tool_calls"]) == 1 and first["tool_calls"][0]["function"]["name"] == "get_weather", f"call {first}")
    call = first["tool_calls"][0]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    check(first["prompt_ids"] == reference_ids(messages, tools), "the first prompt (with tools) differs from jinja2's")
    messages.append({"role": "assistant", "content": first["content"] or "", "tool_calls": [call]})
    messages.append({"role": "tool", "tool_call_id": call["id"], "name": "get_weather", "content": '{"temp": 21}'})
    check(second["prompt_ids"] == reference_ids(messages, tools), "the tool-result prompt differs from jinja2's")
    check(second["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(first["prompt_ids"]), "the tool turn reuses the prefix")
    check(out[2].get("command") == "tool" and not out[2]["ok"], f"/tool @x (no such call): {out[2]}")
    bad_id = chat(["Weather?\n", "/tool @nope x\n"], "--temperature", "0", "--tools", tp, "--grammar", gp, expect_rc=1, base=long)
    check(bad_id[1].get("command") == "tool" and "nope" in bad_id[1]["error"], f"/tool @nope: {bad_id[1]}")


constrained_and_tools()


if not QUICK:
    repl()
print(f"{PASSED} passed, 0 failed")
