#!/usr/bin/env python3
"""The prefix cache's disk tier (session/prefix_cache.h) through moonshine-server: a restarted
server on the same --prefix-cache-dir serves a hit for a conversation it saw before; the
directory is 0700 and its files 0600; a corrupt file and another model's file are removed
with a log line, never loaded; the TTFT of a ~4K-token conversation after a restart, disk
hit vs cold prefill (printed: docs/performance.md).
usage: prefix_disk.py SERVER MODEL OTHER_MODEL WORKDIR [--ttft]"""
import json, os, re, shutil, signal, stat, subprocess, sys, time, urllib.request

import tally

SERVER, MODEL, OTHER, W = sys.argv[1:5]
TTFT = "--ttft" in sys.argv
procs = []


@__import__("atexit").register
def _kill():
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def check(cond, what):
    tally.check(cond, what, "FAIL prefix_disk:")


def start(model, d, log, extra=()):
    f = open(log, "w")
    p = subprocess.Popen(SERVER.split() + [model, "--port", "0", "--threads", "1", "--ctx", "4096", "--parser", "qwen3",
                                           "--prefix-cache-dir", d, *extra], stderr=f, stdout=subprocess.DEVNULL)
    procs.append(p)
    for _ in range(600):
        txt = open(log).read()
        m = re.search(r"listening on http://[0-9.]+:(\d+)", txt)
        if m:
            return p, int(m.group(1))
        if p.poll() is not None:
            break
        time.sleep(0.1)
    print(open(log).read())
    raise SystemExit("FAIL prefix_disk: server did not start")


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)


def chat(port, messages, max_tokens=6, stream=False):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        if not stream:
            j = json.load(r)
            return j["choices"][0]["message"].get("content") or "", j["usage"], None
        ttft, text, usage = None, "", None
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if j.get("usage"):
                usage = j["usage"]
            for c in j.get("choices", []):
                d = c.get("delta", {})
                if ttft is None and (d.get("content") or d.get("reasoning_content")):
                    ttft = time.monotonic() - t0
                text += d.get("content") or ""
        return text, usage, ttft


def cached(u):
    return (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".mss"))


D = os.path.join(W, "pcache")
shutil.rmtree(W, ignore_errors=True)
os.makedirs(W)
# 1. a conversation, a restart, its next turn
p, port = start(MODEL, D, f"{W}/a.log")
m1 = [{"role": "system", "content": "You are a terse assistant. " * 20}, {"role": "user", "content": "Name three colours."}]
reply, u1, _ = chat(port, m1)
stop(p)
check(stat.S_IMODE(os.stat(D).st_mode) == 0o700, "the directory is 0700")
fs = files(D)
check(len(fs) >= 1, f"files written ({fs})")
check(all(stat.S_IMODE(os.stat(os.path.join(D, f)).st_mode) == 0o600 for f in fs), "files are 0600")
p, port = start(MODEL, D, f"{W}/b.log")
m2 = m1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And three more."}]
_, u2, _ = chat(port, m2)
check(cached(u2) >= u1["prompt_tokens"], f"restart: {cached(u2)} of {u2['prompt_tokens']} tokens from disk "
      f"(the first turn's prompt had {u1['prompt_tokens']})")
print(f"restart-and-hit: turn 2 reused {cached(u2)} of {u2['prompt_tokens']} prompt tokens "
      f"(turn 1: {u1['prompt_tokens']} + {u1['completion_tokens']} generated)")
stop(p)
# 2. corrupt files (a flipped byte in the state: header intact, found at use) and a cut one (found at the scan)
fs = files(D)
cut, corrupt = fs[0], fs[1:]
for c in corrupt:
    with open(os.path.join(D, c), "r+b") as f:
        f.seek(-9, 2)
        b = f.read(1)
        f.seek(-9, 2)
        f.write(bytes([b[0] ^ 0x5A]))
with open(os.path.join(D, cut), "r+b") as f:
    f.truncate(os.path.getsize(os.path.join(D, cut)) - 8)
# 3. another model's file
D2 = os.path.join(W, "other-cache")
p, port = start(OTHER, D2, f"{W}/other.log")
chat(port, m1)
stop(p)
foreign = files(D2)
for f in foreign:
    shutil.copy(os.path.join(D2, f), os.path.join(D, "f" + f[1:]))
p, port = start(MODEL, D, f"{W}/c.log")
_, u3, _ = chat(port, m2)
check(u3["prompt_tokens"] > 0, "a request still runs")
stop(p)
log = open(f"{W}/c.log").read()
check("saved by another model: removed, not loaded" in log, "a foreign file is refused with a log line")
check(not any(os.path.exists(os.path.join(D, "f" + f[1:])) for f in foreign), "the foreign files are removed")
check(re.search(re.escape(cut) + r": cut or extended.*removed, not loaded", log) is not None, "the cut file is removed at the scan")
check(re.search(r": [^\n]*(checksum|CRC)[^\n]*: removed, not loaded", log) is not None, "a corrupt file is removed at use")
check(cached(u3) == 0 or cached(u3) < u2["prompt_tokens"], "no corrupt state was loaded")
print(f"corrupt/foreign: {log.count('removed, not loaded')} files removed with a log line")
# 4. TTFT of a ~4K-token conversation: cold vs a restarted server with a disk hit
if TTFT:
    D3 = os.path.join(W, "ttft")
    long = [{"role": "system", "content": " ".join(f"fact {i}: the value of item {i} is {i * 7 % 101}." for i in range(200))},
            {"role": "user", "content": "Which item has value 3?"}]
    p, port = start(MODEL, D3, f"{W}/t1.log")
    reply, u, cold = chat(port, long, max_tokens=4, stream=True)
    stop(p)
    p, port = start(MODEL, D3, f"{W}/t2.log")
    turn = long + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Thanks."}]
    _, u2, warm = chat(port, turn, max_tokens=4, stream=True)
    stop(p)
    check(cached(u2) >= u["prompt_tokens"], f"ttft: disk hit of {cached(u2)} tokens")
    print(f"ttft: {u2['prompt_tokens']}-token conversation, cold {cold:.3f} s ({u['prompt_tokens']} tokens prefilled), "
          f"restarted with a disk hit {warm:.3f} s ({cached(u2)} cached): {cold / warm:.1f}x")
tally.finish()
