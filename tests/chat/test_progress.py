#!/usr/bin/env python3
"""The progress line (src/cli/progress.c) seen through a pseudo-terminal, and its silence otherwise.

Synthesizes a ~100 MB Qwen3-MoE checkpoint, then packs its experts and reads its static tier into
memory (run --static-load read), and has models/demo answer a 1159-token prompt in chat, each with
stderr on a pty: the
line must be redrawn in place (several '\\r' updates), its percentages must rise to 100.0%, and it
shows MB/s and (before the end) an ETA. The same commands with stderr on a pipe must print no
progress at all. usage: test_progress.py WORKDIR   env: MOONSHINE. Last line: "N passed, 0 failed".
"""
import json, os, pty, re, select, shutil, subprocess, sys

M = os.environ.get("MOONSHINE", "build/moonshine")
W = sys.argv[1]
ok = bad = 0


def check(cond, what):
    global ok, bad
    if cond:
        ok += 1
    else:
        bad += 1
        print("FAIL", what)


def on_pty(args):
    """Run args with stderr on a pty (stdout on a pipe); the bytes written to the terminal."""
    master, slave = pty.openpty()
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        r, _, _ = select.select([master], [], [], 60)
        if not r:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    p.wait(timeout=120)
    p.stdout.read()
    os.close(master)
    return p.returncode, out.decode("utf-8", "replace")


def updates(term, what):
    """The percentages of the redraws of `what: P%` in order."""
    return [float(x) for x in re.findall(r"\r\x1b\[K" + re.escape(what) + r":\s+([0-9.]+)%", term)]


shutil.rmtree(W, ignore_errors=True)
os.makedirs(W)
cfg = json.load(open("tests/data/fixtures/models/qwen3_moe/config.json"))
cfg.update(hidden_size=512, num_hidden_layers=4, num_local_experts=32, moe_intermediate_size=512, vocab_size=1024,
           head_dim=64, num_attention_heads=8, num_key_value_heads=2)
json.dump(cfg, open(os.path.join(W, "config.json"), "w"))
model = os.path.join(W, "model")
rc, term = on_pty([M, "synth", "--config", os.path.join(W, "config.json"), "--out", model, "--seed", "1",
                   "--expert-dtype", "fp8"])
check(rc == 0, f"synth rc {rc}")
u = updates(term, "synth")
check(len(u) >= 3, f"synth: {len(u)} redraws of the progress line: {term[-300:]!r}")
check(u == sorted(u) and u and u[-1] == 100.0, f"synth: percentages not rising to 100: {u}")
check("MB/s" in term and "ETA" in term, f"synth: no MB/s or ETA: {term[-300:]!r}")
check(term.endswith("\n") or term.endswith("\r\n"), "synth: the line is not ended")
store = os.path.join(W, "store")
rc, term = on_pty([M, "pack", model, "--out", store])
check(rc == 0, f"pack rc {rc}")
u = updates(term, "pack")
check(len(u) >= 2 and u[-1] == 100.0 and u == sorted(u), f"pack: {u}")
# the static tier read into memory (--static-load read): at least its final line
rc, term = on_pty([M, "run", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "1", "--static-load", "read"])
u = updates(term, "static tier")
check(rc == 0 and u and u[-1] == 100.0, f"static tier: rc {rc} {u} {term[-300:]!r}")
# chat: a prompt of 1159 tokens (models/demo) is prefilled in pieces with the line on a terminal; the
# reply's first logits are the same bytes as the one-piece prefill on a pipe
q = " ".join(open("tools/demo/questions.txt").read().split("\n")) * 4
args = ["chat", "models/demo", "--prompt", q, "--temperature", "0", "--max-tokens", "4", "--json"]
lt, lp = os.path.join(W, "logits_tty.bin"), os.path.join(W, "logits_pipe.bin")
rc, term = on_pty([M] + args + ["--logits-out", lt])
u = updates(term, "prefill")
check(rc == 0 and len(u) >= 3 and u[0] == 0.0 and u[-1] == 100.0 and u == sorted(u), f"chat prefill: rc {rc} {u}")
check("tok/s" in term and "1159 tokens" in term, f"chat prefill line: {term[-300:]!r}")
p = subprocess.run([M] + args + ["--logits-out", lp], capture_output=True)
check(p.returncode == 0 and b"\r" not in p.stderr, f"chat on a pipe: {p.stderr[-200:]!r}")
check(open(lt, "rb").read() == open(lp, "rb").read() and os.path.getsize(lt) > 0,
      "chat: the pieced prefill's logits differ from the one-piece prefill's")
# not a terminal: nothing
p = subprocess.run([M, "synth", "--config", os.path.join(W, "config.json"), "--out", model + "2", "--seed", "1",
                    "--expert-dtype", "fp8"], capture_output=True)
check(p.returncode == 0 and b"%" not in p.stderr and b"\r" not in p.stderr, f"synth on a pipe: {p.stderr[-200:]!r}")
p = subprocess.run([M, "pack", model, "--out", store + "2"], capture_output=True)
check(p.returncode == 0 and b"\r" not in p.stderr, f"pack on a pipe: {p.stderr[-200:]!r}")
shutil.rmtree(W, ignore_errors=True)
print(f"progress: {ok} passed, {bad} failed")
sys.exit(1 if bad else 0)
