#!/usr/bin/env python3
"""Hostile traffic against a running moonshine-server (tests/server/run.sh starts it), loopback only.

usage: hostile.py PORT PID KEY [--no-rss | --rss-margin-mib M]  (M: 4 by default; the ASan build's small quarantine needs more)
The server must run with --api-key KEY --max-connections 1000 --header-timeout-s 2 --body-timeout-s 2
--max-body-mib 1 --ctx 4096 over the tiny Qwen3 model. Every loop is bounded in count and time; after
each case the server must still answer /health. Prints one line per case and "N passed, N failed".
"""
import http.client
import json
import os
import re
import select
import socket
import sys
import time

import tally

PORT, PID, KEY = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
CHECK_RSS = "--no-rss" not in sys.argv
RSS_MARGIN_KIB = int(sys.argv[sys.argv.index("--rss-margin-mib") + 1]) * 1024 if "--rss-margin-mib" in sys.argv else 4096
AUTH = {"Authorization": "Bearer " + KEY}
JSON = {"Content-Type": "application/json", **AUTH}


def case(name):
    """A case (tally.case): after it the server must still answer /health (assert_alive)."""
    return tally.case(name, after=lambda: assert_alive())


def conn(timeout=10):
    return http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)


def req(method, path, body=None, headers=None, timeout=10):
    c = conn(timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return r.status, data, r
    finally:
        c.close()


def health_ms():
    t0 = time.perf_counter()
    st, data, _ = req("GET", "/health", timeout=5)
    assert st == 200, st
    return (time.perf_counter() - t0) * 1000, json.loads(data)


def assert_alive():
    health_ms()


def raw(payload, read_timeout=5, shut=False):
    """Send bytes on a fresh socket; return everything read until the server closes or the timeout."""
    s = socket.create_connection(("127.0.0.1", PORT), timeout=read_timeout)
    try:
        s.sendall(payload)
        if shut:
            s.shutdown(socket.SHUT_WR)
        out = b""
        end = time.time() + read_timeout
        while time.time() < end:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            out += b
        return out
    finally:
        s.close()


def status_of(resp):
    m = re.match(rb"HTTP/1\.[01] (\d+)", resp)
    return int(m.group(1)) if m else None


def metric(name):
    st, data, _ = req("GET", "/metrics", headers=AUTH)
    assert st == 200
    for line in data.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def wait_idle(limit=5.0):
    end = time.time() + limit
    while time.time() < end:
        if health_ms()[1]["queued"] == 0:
            return True
        time.sleep(0.02)
    return False


def err(st, data, want_status, fragment):
    assert st == want_status, f"status {st} (want {want_status}): {data[:300]!r}"
    msg = json.loads(data)["error"]["message"]
    assert fragment in msg, f"{msg!r} lacks {fragment!r}"
    assert os.getcwd() not in msg and "build/" not in msg, f"a server path in {msg!r}"


CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]


@case("malformed and truncated JSON -> 400")
def _():
    err(*req("POST", CHAT, '{"messages": [', JSON)[:2], 400, "not valid JSON")
    err(*req("POST", CHAT, '{"messages": [{"role": "user", "content": "x"}]} trailing', JSON)[:2], 400, "trailing bytes")
    err(*req("POST", CHAT, '', JSON)[:2], 400, "empty")
    # a Content-Length the client never fills, then a hang-up: the server drops it
    out = raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 500\r\n\r\n{\"messages\"", read_timeout=0.3)
    assert out == b"", out[:200]


@case("wrong types and huge numbers -> 400 naming the field")
def _():
    for body, frag in [({"messages": "hi"}, "'messages' must be an array"),
                       ({"messages": HELLO, "temperature": "hot"}, "'temperature' must be a number"),
                       ({"messages": HELLO, "max_tokens": 1e308}, "'max_tokens' must be in"),
                       ({"messages": HELLO, "seed": 1e300}, "'seed' must be in"),
                       ({"messages": HELLO, "top_k": 2 ** 70}, "'top_k' must be in"),
                       ({"messages": [{"role": 5, "content": "x"}]}, "messages[0].role"),
                       ({"messages": HELLO, "stop": [1]}, "'stop[0]' must be a string")]:
        err(*req("POST", CHAT, body, JSON)[:2], 400, frag)
    err(*req("POST", CHAT, '{"messages":[{"role":"user","content":"x"}],"temperature":1e999}', JSON)[:2], 400, "'temperature' must be in")
    err(*req("POST", "/v1/completions", {"prompt": [1, 2 ** 40]}, JSON)[:2], 400, "'prompt[1]' must be a token id")
    err(*req("POST", "/detokenize", {"tokens": [1, -3]}, JSON)[:2], 400, "'tokens[1]' must be a token id")


@case("bodies past the limit, with Content-Length and chunked -> 413 (dropped, not kept)")
def _():
    big = 1024 * 1024 + 10
    err(*req("POST", CHAT, b" " * big, JSON)[:2], 413, "exceeds the limit")
    # far past it (limit + 64 MiB): answered from the headers alone
    out = raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 1000000000000\r\n\r\n")
    assert status_of(out) == 413 and b"exceeds the limit" in out, out[:300]
    # chunked, no Content-Length: 2 MiB in 64 KiB chunks, then the end; the excess is dropped, not kept
    s = socket.create_connection(("127.0.0.1", PORT), timeout=5)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"10000\r\n" + b" " * 65536 + b"\r\n"
    for _ in range(32):
        s.sendall(chunk)
    s.sendall(b"0\r\n\r\n")
    out = s.recv(65536)
    s.close()
    assert status_of(out) == 413 and b"exceeds the limit" in out, out[:300]


@case("deep nesting -> 400 'nested too deeply (limit 64)'")
def _():
    body = '{"messages":' + "[" * 100000 + "]" * 100000 + "}"
    err(*req("POST", CHAT, body, JSON)[:2], 400, "nested too deeply (limit 64)")


@case("invalid UTF-8 and NUL bytes -> 400")
def _():
    err(*req("POST", CHAT, b'{"messages":[{"role":"user","content":"\xff\xfe"}]}', JSON)[:2], 400, "not valid UTF-8")
    err(*req("POST", CHAT, b'{"messages":[{"role":"user","content":"\xed\xa0\x80"}]}', JSON)[:2], 400, "not valid UTF-8")
    err(*req("POST", CHAT, b'{"messages":[{"role":"user","content":"a\x00b"}]}', JSON)[:2], 400, "NUL byte")


@case("keys: missing/wrong -> 401, right -> 200, /health needs none")
def _():
    st, data, r = req("GET", "/v1/models")
    err(st, data, 401, "didn't provide an API key")
    assert r.getheader("WWW-Authenticate") == "Bearer"
    err(*req("GET", "/v1/models", headers={"Authorization": "Bearer " + KEY + "x"})[:2], 401, "Incorrect API key")
    err(*req("GET", "/v1/models", headers={"Authorization": "Basic " + KEY})[:2], 401, "Incorrect API key")
    err(*req("POST", CHAT, {"messages": HELLO}, {"Content-Type": "application/json"})[:2], 401, "API key")
    assert req("GET", "/v1/models", headers=AUTH)[0] == 200
    assert req("GET", "/metrics", headers=AUTH)[0] == 200
    assert req("GET", "/health")[0] == 200


@case("cross-origin simple requests never generate; CORS preflight refused; foreign Host 403")
def _():
    before = metric("moonshine_generations_total")
    body = json.dumps({"messages": HELLO, "max_tokens": 2})
    # a page's <form>/fetch "simple" POST: text/plain, with and without an Origin
    err(*req("POST", CHAT, body, {"Content-Type": "text/plain", **AUTH})[:2], 415, "Content-Type must be application/json")
    err(*req("POST", CHAT, body, {"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://evil.example"})[:2],
        403, "CORS is off")
    err(*req("POST", CHAT, body, {"Content-Type": "text/plain", "Origin": "http://evil.example", **AUTH})[:2], 403, "CORS is off")
    err(*req("OPTIONS", CHAT, None, {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})[:2], 403, "CORS is off")
    err(*req("OPTIONS", CHAT, None, {"Access-Control-Request-Method": "POST"})[:2], 403, "preflight refused")
    err(*req("GET", "/v1/models", None, {"Host": "evil.example", **AUTH})[:2], 403, "DNS-rebinding")
    err(*req("GET", "/v1/models", None, {"Host": "127.0.0.1.evil.example:80", **AUTH})[:2], 403, "DNS-rebinding")
    assert req("GET", "/v1/models", None, {"Host": "localhost:%d" % PORT, **AUTH})[0] == 200
    assert req("GET", "/v1/models", None, {"Host": "[::1]:%d" % PORT, **AUTH})[0] == 200
    assert metric("moonshine_generations_total") == before, "a refused request ran a generation"


@case("idle connections: 900 open, /health stays fast, the header deadline closes them")
def _():
    socks = []
    try:
        for _ in range(900):
            socks.append(socket.create_connection(("127.0.0.1", PORT), timeout=5))
        time.sleep(0.2)
        lat = sorted(health_ms()[0] for _ in range(20))
        assert lat[-1] < 100, f"/health took {lat[-1]:.1f} ms with 900 idle connections"
        # past the deadline (2 s) every idle socket is closed by the server
        time.sleep(2.6)
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except (ConnectionResetError, BrokenPipeError):
                closed += 1
            except BlockingIOError:
                pass
        assert closed == len(socks), f"{len(socks) - closed} idle connections still open after the deadline"
        return f"/health p50 {lat[10]:.1f} ms, max {lat[-1]:.1f} ms"
    finally:
        for s in socks:
            s.close()


@case("connection cap: past --max-connections a clear 503; /health still answered")
def _():
    socks = []
    try:
        for _ in range(1010):
            socks.append(socket.create_connection(("127.0.0.1", PORT), timeout=5))
        time.sleep(0.2)
        last = socks[-1]
        last.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n")
        out = last.recv(65536)
        assert status_of(out) == 503 and b"too many open connections" in out, out[:300]
        socks[-2].sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        out = socks[-2].recv(65536)
        assert status_of(out) == 200, out[:200]
    finally:
        for s in socks:
            s.close()
    time.sleep(0.3)


@case("slowloris: 200 connections sending a byte a second; /health fast; closed at the deadline")
def _():
    line = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 64
    socks = [socket.create_connection(("127.0.0.1", PORT), timeout=5) for _ in range(200)]
    lat, alive = [], list(socks)
    try:
        for t in range(5):  # 5 s at most
            for s in list(alive):
                try:
                    s.send(line[t:t + 1])
                except (BrokenPipeError, ConnectionResetError):
                    alive.remove(s)
            lat.append(health_ms()[0])
            time.sleep(1)
        lat.sort()
        assert lat[-1] < 100, f"/health took {lat[-1]:.1f} ms under slowloris"
        # the header deadline (2 s) ended them although bytes kept coming
        still = 0
        for s in socks:
            s.setblocking(False)
            try:
                still += s.recv(1) != b""
            except (ConnectionResetError, BrokenPipeError):
                pass
            except BlockingIOError:
                still += 1
        assert still == 0, f"{still} slowloris connections outlived the header deadline"
        return f"/health max {lat[-1]:.1f} ms"
    finally:
        for s in socks:
            s.close()


@case("slow body: headers then a trickle; closed at the body deadline")
def _():
    s = socket.create_connection(("127.0.0.1", PORT), timeout=5)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{")
    t0 = time.time()
    closed = False
    for _ in range(5):
        time.sleep(1)
        try:
            s.send(b" ")
            s.setblocking(False)
            closed = s.recv(1) == b""
            s.setblocking(True)
        except BlockingIOError:
            s.setblocking(True)
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        if closed:
            break
    s.close()
    assert closed, "a trickling body outlived the body deadline"
    return f"closed after {time.time() - t0:.1f} s"


@case("pipelining: three requests in one write, three answers in order")
def _():
    one = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    models = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n"
    out = raw(one + models + one.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"), read_timeout=3)
    sts = [int(x) for x in re.findall(rb"HTTP/1\.1 (\d+)", out)]
    assert sts == [200, 200, 200], sts
    assert out.index(b'"status"') < out.index(b'"object":"list"'), "answers out of order"


@case("half-close after a request: the answer still comes")
def _():
    out = raw(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", shut=True, read_timeout=3)
    assert status_of(out) == 200, out[:200]
    # a generation whose client half-closes counts as gone (docs/server.md); the server lives on
    body = json.dumps({"messages": HELLO, "max_tokens": 3}).encode()
    raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAuthorization: Bearer "
        + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body, shut=True, read_timeout=3)
    assert wait_idle()


@case("disconnect mid-stream stops the generation")
def _():
    before = metric("moonshine_generations_cancelled_total")
    body = json.dumps({"messages": HELLO, "max_tokens": 3000, "stream": True, "temperature": 1, "seed": 1}).encode()
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAuthorization: Bearer "
              + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    s.close()
    assert wait_idle(), "the stream kept generating after the client left"
    assert metric("moonshine_generations_cancelled_total") == before + 1


@case("disconnect mid-prefill stops the prefill")
def _():
    # a 4000-token prompt (another first token each time: no prefix reuse); its prefill time is estimated
    # from a timed 1000-token one (ASan builds are ~25x slower)
    def prompt(first, n=4000):
        return [first] + [(i * 7919) % 150000 + 100 for i in range(n - 1)]
    t0 = time.time()
    st, data, _ = req("POST", "/v1/completions", {"prompt": prompt(11, 1000), "max_tokens": 1}, JSON, timeout=60)
    assert st == 200, data[:200]
    full = (time.time() - t0) * 4  # a lower bound: attention grows faster than linearly
    gen0 = metric("moonshine_generation_tokens_total")
    body = json.dumps({"prompt": prompt(12), "max_tokens": 50}).encode()
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAuthorization: Bearer "
              + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(min(0.2, full / 5))
    assert health_ms()[1]["queued"] == 1, "the request is not running"
    s.close()
    t1 = time.time()
    assert wait_idle(full + 5)
    left = time.time() - t1
    assert metric("moonshine_generation_tokens_total") - gen0 <= 1, "tokens were generated for a client that left"
    if full > 0.2:
        assert left < 0.5 * full, f"the prefill ran on after the hang-up ({left:.2f} s of a {full:.2f} s prefill)"
    return f"full prefill ~{full:.2f} s (4 x 1000 tokens), done {left:.2f} s after the hang-up"


@case("tokenize / detokenize round trip; /metrics is Prometheus text")
def _():
    st, data, _ = req("POST", "/tokenize", {"prompt": "The tide came in."}, JSON)
    t = json.loads(data)
    assert st == 200 and t["count"] == len(t["tokens"]) > 0 and t["max_model_len"] == 4096, data
    st, data, _ = req("POST", "/detokenize", {"tokens": t["tokens"]}, JSON)
    assert st == 200 and json.loads(data)["prompt"] == "The tide came in.", data
    st, data, _ = req("POST", "/tokenize", {"messages": HELLO}, JSON)
    n = json.loads(data)["count"]
    st, data, _ = req("POST", CHAT, {"messages": HELLO, "max_tokens": 1}, JSON)
    assert json.loads(data)["usage"]["prompt_tokens"] == n
    st, data, r = req("GET", "/metrics", headers=AUTH)
    assert r.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    text = data.decode()
    for name in ["moonshine_requests_total{", "moonshine_time_to_first_token_seconds_bucket{le=\"+Inf\"}",
                 "moonshine_inter_token_latency_seconds_count", "moonshine_queue_length", "moonshine_prompt_tokens_total",
                 "moonshine_prefix_cache_hits_total", "moonshine_engine_tokens_total"]:
        assert name in text, f"/metrics lacks {name}"
    for line in text.splitlines():
        assert line.startswith("#") or re.match(r"^[a-z_]+(\{[^}]*\})? [0-9.e+-]+$", line), f"bad line {line!r}"


def rss_kib():
    with open(f"/proc/{PID}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@case(f"RSS flat across 1,000 small requests (margin {RSS_MARGIN_KIB // 1024} MiB after 300 warm-up)")
def _():
    c = conn()

    def small(i):
        k = i % 5
        if k == 0:
            c.request("GET", "/health")
        elif k == 1:
            c.request("GET", "/v1/models", headers=AUTH)
        elif k == 2:
            c.request("POST", CHAT, body='{"messages": [', headers=JSON)
        elif k == 3:
            c.request("POST", "/tokenize", body=json.dumps({"prompt": "hello %d" % i}), headers=JSON)
        else:
            c.request("POST", "/v1/completions", body=json.dumps({"prompt": [1, 2, 3, i % 1000], "max_tokens": 1}), headers=JSON)
        r = c.getresponse()
        r.read()
        assert r.status in (200, 400), r.status
    for i in range(300):
        small(i)
    if not CHECK_RSS:
        return "RSS not checked (sanitizer build)"
    a = rss_kib()
    t0 = time.time()
    for i in range(1000):
        small(i)
    b = rss_kib()
    c.close()
    assert b - a < RSS_MARGIN_KIB, f"RSS grew {b - a} KiB over 1,000 requests (margin {RSS_MARGIN_KIB} KiB)"
    return f"RSS {a} -> {b} KiB ({b - a:+d}), {1000 / (time.time() - t0):.0f} req/s"


tally.finish()
