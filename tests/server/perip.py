#!/usr/bin/env python3
"""--max-connections-per-ip against a running moonshine-server (tests/server/run.sh starts it with
--max-connections-per-ip 4), loopback only: 4 idle connections from 127.0.0.1 are fine, the 5th from
that address gets 503 too_many_connections (naming the flag) while /health is still answered from it;
a client from another loopback address (127.0.0.2) is served meanwhile; once the 4 close, 127.0.0.1
is served again. Bounded in count and time. usage: perip.py PORT"""
import json
import re
import socket
import sys
import time

import tally

PORT = int(sys.argv[1])


def check(cond, what):
    tally.check(cond, what, "FAIL perip:")


def ask(path, src="127.0.0.1"):
    s = socket.socket()
    s.settimeout(10)
    s.bind((src, 0))
    s.connect(("127.0.0.1", PORT))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
    s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), head.decode(errors="replace"), body


idle = []
for _ in range(4):
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    idle.append(s)
time.sleep(0.2)
st, head, body = ask("/v1/models")
check(st == 503 and "too_many_connections" in body.decode() and "--max-connections-per-ip 4" in body.decode()
      and "Retry-After" in head, f"the 5th connection from 127.0.0.1: {st} {body[:200]!r}")
st, _, body = ask("/health")
check(st == 200 and json.loads(body)["status"] == "ok", f"/health past the per-address cap: {st}")
st, _, body = ask("/v1/models", src="127.0.0.2")
check(st == 200, f"another address (127.0.0.2) is served: {st} {body[:200]!r}")
for s in idle:
    s.close()
ok = False
for _ in range(50):  # the server sees the closes within a poll
    st, _, _ = ask("/v1/models")
    if st == 200:
        ok = True
        break
    time.sleep(0.1)
check(ok, "127.0.0.1 is served again once its idle connections closed")
st, _, body = ask("/metrics")
m = re.search(rb"^moonshine_connections_refused_per_ip_total (\d+)$", body, re.M)
check(st == 200 and m and int(m.group(1)) >= 1, "the per-address refusals are counted")
tally.finish()
