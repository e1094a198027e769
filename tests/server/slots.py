#!/usr/bin/env python3
"""Parallel slots against a running moonshine-server (tests/server/run.sh starts it), loopback only.

usage: slots.py PORT [KDA_PORT]
The server must run with --slots 3 --max-queue 2 --ctx 4096 over the tiny Qwen3 model (no key).
Cases: concurrent streamed greedy requests give the text of the same requests one at a time (and were
decoded in batches); more clients than slots + queue get 503 with Retry-After; a disconnect mid-stream
frees its slot; a deadline before the first token gives 504 and the same request sent again resumes
(tokens reused > 0); a deadline after the first token ends the reply with finish_reason "length";
GET /slots and the slot gauges of /metrics. With KDA_PORT (a server over a KDA + MLA model, whose state
cannot roll back: snapshots), the deadline-and-resume case runs there too. Every loop is bounded in count and time. Prints one line
per case and "N passed, N failed".
"""
import http.client
import json
import math
import re
import socket
import sys
import threading
import time

import tally

PORT = int(sys.argv[1])
KDA_PORT = int(sys.argv[2]) if len(sys.argv) > 2 else 0
JSON = {"Content-Type": "application/json"}
SLOTS, QUEUE = 3, 2


def case(name):
    """A case (tally.case): after it every slot must be idle again within 30 s."""
    def idle():
        assert wait_idle(30), "the slots did not empty after the case"
    return tally.case(name, after=idle)


def req(method, path, body=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    try:
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers=JSON if body is not None else {})
        r = c.getresponse()
        return r.status, r.read(), r
    finally:
        c.close()


def get_json(path):
    st, data, _ = req("GET", path, timeout=10)
    assert st == 200, (path, st, data[:200])
    return json.loads(data)


def metric(name):
    st, data, _ = req("GET", "/metrics", timeout=10)
    m = re.search(rb"^" + name.encode() + rb" ([0-9.e+-]+)$", data, re.M)
    assert m, name
    return float(m.group(1))


def wait_idle(limit):
    end = time.time() + limit
    while time.time() < end:
        h = get_json("/health")
        if h["queued"] == 0:
            return True
        time.sleep(0.05)
    return False


def stream_text(body, out, i):
    """A streamed completion: its text and finish_reason (into out[i])."""
    st, data, _ = req("POST", "/v1/completions", dict(body, stream=True))
    assert st == 200, data[:300]
    text, fin = "", None
    for line in data.decode().split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            ch = json.loads(line[6:])
            assert "error" not in ch, ch
            for c in ch["choices"]:
                text += c.get("text", "")
                fin = c.get("finish_reason") or fin
    out[i] = (text, fin)


def prompt_ids(first, n):
    return [first] + [(i * 7919 + first) % 150000 + 100 for i in range(n - 1)]


@case("--slots 3: 5 concurrent streamed greedy requests = the same requests one at a time")
def concurrent_equal():
    bodies = [{"prompt": prompt_ids(20 + k, 8 + 13 * k), "max_tokens": 24, "temperature": 0} for k in range(5)]
    alone = [None] * 5
    for k, b in enumerate(bodies):
        stream_text(b, alone, k)
    rows0, steps0 = metric("moonshine_sched_decode_rows_total"), metric("moonshine_sched_decode_steps_total")
    together = [None] * 5
    th = [threading.Thread(target=stream_text, args=(b, together, k)) for k, b in enumerate(bodies)]
    for t in th:
        t.start()
    for t in th:
        t.join(120)
    assert all(t is not None for t in together), "a request did not finish"
    for k in range(5):
        assert together[k] == alone[k], f"request {k}: {together[k]!r} != alone {alone[k]!r}"
    rows, steps = metric("moonshine_sched_decode_rows_total") - rows0, metric("moonshine_sched_decode_steps_total") - steps0
    assert rows >= 5 * 23 and rows / steps > 1.2, f"not batched: {rows} rows in {steps} decode steps"
    return f"(mean decode batch {rows / steps:.2f})"


def open_stream(body):
    """A raw streamed request; returns the socket once the first chunk came (the request holds a slot)."""
    data = json.dumps(dict(body, stream=True)).encode()
    s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(data)).encode() + b"\r\n\r\n" + data)
    got = b""
    end = time.time() + 60
    while b"data: " not in got and time.time() < end:
        b = s.recv(65536)
        if not b:
            break
        got += b
    assert b" 200 " in got.split(b"\r\n")[0] and b"data: " in got, got[:300]
    return s


def busy():
    return get_json("/slots")["busy"]


def wait_busy(n, limit=10):
    end = time.time() + limit
    while time.time() < end:
        if busy() == n:
            return True
        time.sleep(0.02)
    return False


@case("a disconnect mid-stream frees its slot at the next step")
def disconnect_frees():
    c0 = metric("moonshine_generations_cancelled_total")
    s = open_stream({"prompt": "Hello", "max_tokens": 3000, "temperature": 1, "seed": 1})
    sl = get_json("/slots")
    assert sl["busy"] == 1 and sl["n_slots"] == SLOTS and len(sl["slots"]) == SLOTS, sl
    busy_slot = [x for x in sl["slots"] if x["state"] != "idle"]
    assert len(busy_slot) == 1 and busy_slot[0]["state"] in ("prefill", "decode") and busy_slot[0]["age_s"] >= 0, sl
    assert metric("moonshine_slots_busy") == 1 and metric("moonshine_slots") == SLOTS
    s.close()
    t0 = time.time()
    assert wait_busy(0, 5), "the slot is still busy after the disconnect"
    assert metric("moonshine_generations_cancelled_total") == c0 + 1
    return f"(freed in {(time.time() - t0) * 1000:.0f} ms)"


@case("rollback model: a prefix another slot is decoding is copied, not prefilled again")
def shared_prefix():
    common = [1000 + (i * 37) % 5000 for i in range(300)]
    before = metric("moonshine_sched_shared_prefixes_total")
    s = open_stream({"prompt": common + [11, 12, 13], "max_tokens": 3000, "temperature": 1, "seed": 3})
    try:
        st, data, _ = req("POST", "/v1/completions", {"prompt": common + [21, 22], "max_tokens": 2, "temperature": 0})
        assert st == 200, data[:300]
        u = json.loads(data)["usage"]
        got = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        assert got == len(common), f"cached {got} of the {len(common)} tokens the other slot holds"
        assert metric("moonshine_sched_shared_prefixes_total") == before + 1
    finally:
        s.close()
    return f"({got} tokens copied from the busy slot)"


@case("more clients than slots + queue: 503 with Retry-After; the queued ones are served")
def backpressure():
    socks = []
    try:
        for k in range(SLOTS):
            socks.append(open_stream({"prompt": f"Busy {k}", "max_tokens": 3000, "temperature": 1, "seed": k}))
        assert wait_busy(SLOTS), "the slots are not all busy"
        # QUEUE more wait for a slot (non-stream, short), then the next ones are refused
        out = [None] * QUEUE

        def one(i):
            st, data, _ = req("POST", "/v1/completions", {"prompt": f"Queued {i}", "max_tokens": 2, "temperature": 0})
            out[i] = st
        th = [threading.Thread(target=one, args=(i,)) for i in range(QUEUE)]
        for t in th:
            t.start()
        end = time.time() + 10
        while get_json("/health")["queued"] < SLOTS + QUEUE and time.time() < end:
            time.sleep(0.02)
        assert get_json("/slots")["queued"] == QUEUE
        refused = 0
        for i in range(3):
            st, data, r = req("POST", "/v1/completions", {"prompt": "One too many", "max_tokens": 2})
            assert st == 503, (st, data[:200])
            # Retry-After: the waiting requests' time to get a slot at the measured mean time per request
            mean = metric("moonshine_request_slot_seconds_mean")
            want = min(3600, max(1, math.ceil(QUEUE * mean / SLOTS - 1e-9)))
            assert mean > 0, "no request time measured yet"
            assert r.getheader("Retry-After") == str(want), (r.getheaders(), mean, want)
            err = json.loads(data)["error"]
            assert err["code"] == "server_busy" and "--max-queue 2" in err["message"], err
            assert f"retry in {want} s" in err["message"], err
            refused += 1
    finally:
        for s in socks:
            s.close()
    for t in th:
        t.join(60)
    assert out == [200] * QUEUE, out
    return f"({refused} refused, Retry-After {want} s at {mean:.3f} s per request)"


def measure(body):
    t0 = time.time()
    st, data, _ = req("POST", "/v1/completions", body)
    assert st == 200, data[:300]
    return time.time() - t0, json.loads(data)


def deadline_resume():
    # a 400-token prefill's time bounds a 1600-token one's from below (attention grows faster than linearly);
    # 1.5 times it covers at least one 256-token chunk
    d0 = metric("moonshine_deadline_before_first_token_total")
    t1, _ = measure({"prompt": prompt_ids(31, 400), "max_tokens": 1})
    N = 1600
    long_p = prompt_ids(32, N)
    for stream in (False, True):
        p = long_p if not stream else prompt_ids(33, N)
        st, data, r = req("POST", "/v1/completions", {"prompt": p, "max_tokens": 4, "temperature": 0, "stream": stream,
                                                      "deadline_s": max(0.05, t1 * 1.5)})
        assert st == 504, (stream, st, data[:300])
        assert r.getheader("Content-Type").startswith("application/json")
        err = json.loads(data)["error"]
        assert err["code"] == "deadline_exceeded" and err["type"] == "timeout_error", err
        ev = err["prompt_tokens_evaluated"]
        assert 0 < ev < N and err["prompt_tokens_reused"] == 0 and err["retry_resumes"] is True, err
        assert err["elapsed_s"] >= err["deadline_s"] and f"{ev} of the prompt's {N} tokens" in err["message"], err
        _, res = measure({"prompt": p, "max_tokens": 4, "temperature": 0})
        cached = res["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= ev, f"the retry reused {cached} tokens, {ev} were evaluated"
    assert metric("moonshine_deadline_before_first_token_total") == d0 + 2
    return f"({ev} of {N} evaluated by the deadline of {t1 * 1.5:.2f} s, reused by the retry)"


case("deadline before the first token: 504 naming the tokens evaluated; the retry resumes from them")(deadline_resume)
if KDA_PORT:
    PORT, KDA_PORT = KDA_PORT, PORT
    case("KDA + MLA (snapshots): a deadline mid-prefill keeps the evaluated prefix; the retry resumes")(deadline_resume)

    @case("KDA + MLA: an edited earlier message restores the message-boundary checkpoint before the edit")
    def boundary_checkpoint():
        sysmsg = "You answer in one word, checkpoint test. " * 8
        m1 = [{"role": "system", "content": sysmsg}, {"role": "user", "content": "What colour is the sea on a sunny day?"},
              {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "And the sky at night?"}]
        m2 = json.loads(json.dumps(m1))
        m2[1]["content"] = "What colour is the sea on a stormy day?"
        ids1 = json.loads(req("POST", "/tokenize", {"messages": m1})[1])["tokens"]
        ids2 = json.loads(req("POST", "/tokenize", {"messages": m2})[1])["tokens"]
        div = next(i for i in range(min(len(ids1), len(ids2))) if ids1[i] != ids2[i])
        # the server's rule (session/generate.h): a special token after a plain one, >= 16 after the last
        # checkpoint (the Qwen3 tokenizer's special added tokens are ids 151643..151656); this prompt is shorter than
        # --checkpoint-every (a multiple of the 256 chunk), so those are all
        sp = lambda t: 151643 <= t <= 151656  # noqa: E731  (the special ones; <tool_call>, <think>... are not)
        want, last = 0, 0
        for q in range(1, div + 1):
            if q - last >= 16 and sp(ids2[q]) and not sp(ids2[q - 1]):
                want = last = q
        assert want > 0, "no boundary before the edit"
        before = metric("moonshine_prefix_cache_checkpoints_total")
        body = {"messages": m1, "max_tokens": 2, "temperature": 0}
        st, data, _ = req("POST", "/v1/chat/completions", body)
        assert st == 200, data[:300]
        assert metric("moonshine_prefix_cache_checkpoints_total") > before, "no checkpoint saved"
        st, data, _ = req("POST", "/v1/chat/completions", dict(body, messages=m2))
        assert st == 200, data[:300]
        got = json.loads(data)["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert got == want, f"reused {got} tokens; the checkpoint before the edit (at {div}) is at {want}"
        return f"edit at token {div} of {len(ids2)}: restored the checkpoint at {got}"
    PORT, KDA_PORT = KDA_PORT, PORT


@case("deadline after the first token: finish_reason length, deadline_exceeded true")
def deadline_after():
    d0 = metric("moonshine_deadline_after_first_token_total")
    t, _ = measure({"prompt": "Short", "max_tokens": 2})
    for stream in (False, True):
        body = {"prompt": "Short", "max_tokens": 3000, "temperature": 1, "seed": 5, "deadline_s": max(0.3, 4 * t)}
        if not stream:
            st, data, _ = req("POST", "/v1/completions", body)
            assert st == 200, data[:300]
            res = json.loads(data)
            assert res["choices"][0]["finish_reason"] == "length" and res.get("deadline_exceeded") is True, res
            assert 0 < res["usage"]["completion_tokens"] < 3000, res["usage"]
        else:
            st, data, _ = req("POST", "/v1/completions", dict(body, stream=True))
            assert st == 200
            last = [json.loads(x[6:]) for x in data.decode().split("\n") if x.startswith("data: {")][-1]
            assert last["choices"][0]["finish_reason"] == "length" and last.get("deadline_exceeded") is True, last
    st, data, _ = req("POST", "/v1/completions", {"prompt": "x", "deadline_s": -1})
    assert st == 400 and json.loads(data)["error"]["param"] == "deadline_s", data[:200]
    assert metric("moonshine_deadline_after_first_token_total") == d0 + 2


tally.finish()
