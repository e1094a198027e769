#!/usr/bin/env python3
"""Drive a running moonshine-server with C concurrent clients; print one JSON line.

usage: tools/bench_serve.py --url http://127.0.0.1:8000 [--clients 1,8] [--requests 2]
                            [--prompt-tokens 16] [--max-tokens 32] [--rounds 1] [--api-key KEY]

For each client count C of --clients: C threads, each sending --requests streamed /v1/completions
requests one after another (a prompt of --prompt-tokens random token ids of its own, --max-tokens,
temperature 0, stream_options.include_usage). Rounds run every C once, the order reversed every
other round (a noisy shared machine then moves all of them alike). Per C (median over rounds):
  requests_per_s        requests finished / wall time of the C clients
  decode_tok_s          aggregate: completion tokens after each request's first / wall time
  per_client_decode_tok_s  each client's (tokens after the first) / (its time after first tokens), mean
  ttft_p50_s, ttft_p99_s   request sent -> first token chunk, over all requests of the round
  expert_read_bytes_per_token  /metrics moonshine_expert_read_bytes_total delta / generated tokens
                        (streamed experts only; else null)
  experts_acquired_per_token   /metrics moonshine_engine_experts_acquired_total delta / generated tokens
                        (unique experts per layer and step, summed: what one read per step serves)
  mean_decode_batch     /metrics decode rows / decode steps (how many slots decoded together)
and speedup_vs_first: decode_tok_s over the first C's, per round, median (cpu_speedup_vs_first likewise
for decode tok per server CPU-second, with --pid). Python stdlib only.
"""
import argparse
import http.client
import json
import os
import random
import re
import statistics
import sys
import threading
import time
import urllib.parse


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per round")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--vocab", type=int, default=150000, help="prompt ids are drawn below this")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--pid", type=int, default=0, help="the server's pid (same machine): adds its CPU seconds and "
                    "decode tok per CPU-second")
    return ap.parse_args()


A = parse_args()
U = urllib.parse.urlparse(A.url)
HOST, PORT = U.hostname, U.port or 80
HDR = {"Content-Type": "application/json"}
if A.api_key:
    HDR["Authorization"] = "Bearer " + A.api_key


def conn():
    return http.client.HTTPConnection(HOST, PORT, timeout=A.timeout)


def metrics():
    c = conn()
    try:
        c.request("GET", "/metrics", headers=HDR)
        r = c.getresponse()
        text = r.read().decode()
    finally:
        c.close()
    out = {}
    for name in ("moonshine_expert_read_bytes_total", "moonshine_engine_experts_acquired_total",
                 "moonshine_generation_tokens_total", "moonshine_sched_decode_rows_total",
                 "moonshine_sched_decode_steps_total", "moonshine_slots"):
        m = re.search(r"^" + name + r" ([0-9.e+-]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else None
    return out


def cpu_s():
    """The server's user + system CPU seconds (/proc/PID/stat), or None."""
    if not A.pid:
        return None
    with open(f"/proc/{A.pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def one_request(rng):
    """One streamed completion: (t_sent, t_first, t_end, completion_tokens)."""
    body = {"prompt": [rng.randrange(100, A.vocab) for _ in range(A.prompt_tokens)], "max_tokens": A.max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    c = conn()
    t0 = time.perf_counter()
    t_first = None
    n = 0
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body), headers=HDR)
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                    continue
                d = json.loads(ev[6:])
                if "error" in d:
                    raise RuntimeError(d["error"].get("message"))
                if d.get("choices") and t_first is None:
                    t_first = time.perf_counter()
                if d.get("usage"):
                    n = d["usage"]["completion_tokens"]
    finally:
        c.close()
    t1 = time.perf_counter()
    return t0, t_first if t_first is not None else t1, t1, n


def run_c(C, seed):
    res = [[] for _ in range(C)]
    errs = []

    def client(i):
        rng = random.Random(seed * 1000 + i)
        try:
            for _ in range(A.requests):
                res[i].append(one_request(rng))
        except Exception as e:  # noqa: BLE001
            errs.append(repr(e))

    m0 = metrics()
    c0 = cpu_s()
    th = [threading.Thread(target=client, args=(i,)) for i in range(C)]
    t0 = time.perf_counter()
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    c1 = cpu_s()
    m1 = metrics()
    if errs:
        raise SystemExit(f"bench_serve: {len(errs)} client(s) failed: {errs[0]}")
    allr = [r for rs in res for r in rs]
    ttft = sorted(r[1] - r[0] for r in allr)
    after_first = sum(max(r[3] - 1, 0) for r in allr)
    per_client = []
    for rs in res:
        tok = sum(max(r[3] - 1, 0) for r in rs)
        t = sum(r[2] - r[1] for r in rs)
        per_client.append(tok / t if t > 0 else 0.0)

    def d(k):
        return None if m0[k] is None or m1[k] is None else m1[k] - m0[k]
    gen = d("moonshine_generation_tokens_total") or sum(r[3] for r in allr)
    rb, ea, rows, steps = (d("moonshine_expert_read_bytes_total"), d("moonshine_engine_experts_acquired_total"),
                           d("moonshine_sched_decode_rows_total"), d("moonshine_sched_decode_steps_total"))

    def pct(p):
        return ttft[min(len(ttft) - 1, int(round(p / 100 * (len(ttft) - 1))))]
    return {
        "requests": len(allr), "wall_s": wall, "requests_per_s": len(allr) / wall,
        "completion_tokens": sum(r[3] for r in allr),
        "decode_tok_s": after_first / wall, "per_client_decode_tok_s": statistics.mean(per_client),
        "server_cpu_s": c1 - c0 if c0 is not None else None,
        "decode_tok_per_cpu_s": after_first / (c1 - c0) if c0 is not None and c1 > c0 else None,
        "ttft_p50_s": pct(50), "ttft_p99_s": pct(99),
        "expert_read_bytes_per_token": rb / gen if rb is not None and gen else None,
        "experts_acquired_per_token": ea / gen if ea is not None and gen else None,
        "mean_decode_batch": rows / steps if rows and steps else None,
    }


def main():
    cs = [int(x) for x in A.clients.split(",") if x]
    slots = metrics()["moonshine_slots"]
    rounds = {c: [] for c in cs}
    for r in range(A.rounds):
        order = cs if r % 2 == 0 else cs[::-1]
        for c in order:
            rounds[c].append(run_c(c, r * 7 + c))
    out = {"url": A.url, "slots": slots, "prompt_tokens": A.prompt_tokens, "max_tokens": A.max_tokens,
           "requests_per_client": A.requests, "rounds": A.rounds, "by_clients": {}}
    for c in cs:
        rs = rounds[c]
        agg = {k: (statistics.median([x[k] for x in rs]) if rs[0][k] is not None else None) for k in rs[0]}
        agg["decode_tok_s_rounds"] = [x["decode_tok_s"] for x in rs]
        agg["speedup_vs_first"] = statistics.median(
            [rs[i]["decode_tok_s"] / rounds[cs[0]][i]["decode_tok_s"] for i in range(len(rs))])
        if agg["decode_tok_per_cpu_s"] is not None:
            agg["cpu_speedup_vs_first"] = statistics.median(
                [rs[i]["decode_tok_per_cpu_s"] / rounds[cs[0]][i]["decode_tok_per_cpu_s"] for i in range(len(rs))])
        if agg["expert_read_bytes_per_token"] is not None and rounds[cs[0]][0]["expert_read_bytes_per_token"]:
            agg["expert_read_bytes_ratio_vs_first"] = statistics.median(
                [rs[i]["expert_read_bytes_per_token"] / rounds[cs[0]][i]["expert_read_bytes_per_token"] for i in range(len(rs))])
        out["by_clients"][str(c)] = agg
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
