#!/usr/bin/env python3
"""Routing statistics of an expert trace (src/io/expert_trace.h format) recorded with --expert-trace.

usage: routing_skew.py TRACE [TOPK]
Counts only single-token acquires (exactly TOPK experts, default: the most common acquire size, i.e.
decode steps; prefill acquires are unions over many tokens). Prints JSON: per store layer the share of
uses carried by the busiest 1/8 and 1/4 of the experts, the max/min use ratio, the normalized entropy
of the use distribution (1 = uniform) and the reuse at +1 token (share of a step's experts the same
layer used on the step before) against what independent uniform routing gives (TOPK / experts).
"""
import collections, json, math, sys

lines = open(sys.argv[1]).read().split("\n")
assert lines[0].startswith("moonshine-expert-trace"), "not an expert trace"
_, L, _, E = lines[1].split()
L, E = int(L), int(E)
acq = [(int(t[1]), [int(x) for x in t[3:]]) for t in (l.split() for l in lines[2:] if l.startswith("a "))]
sizes = collections.Counter(len(ids) for _, ids in acq)
K = int(sys.argv[2]) if len(sys.argv) > 2 else sizes.most_common(1)[0][0]
use = [[0] * E for _ in range(L)]
prev = [None] * L
reuse = [[0, 0] for _ in range(L)]
steps = 0
for li, ids in acq:
    if len(ids) != K:
        prev[li] = None  # a prefill acquire breaks the token sequence
        continue
    steps += 1
    for e in ids:
        use[li][e] += 1
    if prev[li] is not None:
        reuse[li][0] += len(set(ids) & prev[li])
        reuse[li][1] += K
    prev[li] = set(ids)
out = {"trace": sys.argv[1], "layers": L, "experts": E, "topk": K, "decode_acquires": steps, "per_layer": []}
for li in range(L):
    u = sorted(use[li], reverse=True)
    tot = sum(u)
    p = [x / tot for x in u if x]
    ent = -sum(x * math.log(x) for x in p) / math.log(E)
    out["per_layer"].append({
        "layer": li, "uses": tot,
        "top_eighth_share": round(sum(u[:max(1, E // 8)]) / tot, 3),
        "top_quarter_share": round(sum(u[:max(1, E // 4)]) / tot, 3),
        "max_over_min": round(u[0] / u[-1], 1) if u[-1] else None,
        "entropy_norm": round(ent, 3),
        "reuse_next_token": round(reuse[li][0] / reuse[li][1], 3) if reuse[li][1] else None,
        "reuse_by_chance": round(K / E, 3)})
print(json.dumps(out, indent=1))
