# Usage (where torch is installed): python3 tools/gen_topk_ties.py  -> $OUT/topk_ties.safetensors
# torch.topk on the CPU, float64, over causal index-score rows full of exact ties, exactly as the DSA
# indexers call it: scores [1, S, T] with the future masked by adding finfo.min, k = min(topk, T).
# Which of several equal scores torch keeps is an artifact of its implementation (libstdc++
# nth_element / partial_sort over (value, index) pairs); the engine must pick the same ones to
# reproduce the references, so the test compares against these recorded choices.
# Stored compactly: row i's valid scores are codes[offsets[i]:offsets[i+1]] / 2.
import os
import torch
from safetensors.torch import save_file

OUT = os.environ.get("OUT", "/tmp/out")
g = torch.Generator().manual_seed(5)
rows, lens, valid, ks, sel = [], [], [], [], []
MAXT, MAXK = 1100, 40
cases = [(T, k) for T in (3, 8, 9, 12, 17, 40, 41, 64, 100, 257, 640, 1030) for k in (1, 2, 5, 8, 16, 17)]
cases += [(1030, 16), (1100, 17), (2000, 8)]  # k * 64 <= T: the partial_sort path
for T, k in cases:
    if T > MAXT:
        continue
    for palette in (3, 7):
        s = torch.randint(-1, palette - 1, (1, T, T), generator=g).double().clamp_min(0) * 0.5  # many exact zeros
        mask = torch.triu(torch.full((T, T), torch.finfo(torch.float64).min, dtype=torch.float64), diagonal=1)
        sc = s + mask[None]
        kk = min(k, T)
        idx = sc.topk(kk, dim=-1).indices[0]  # [T, kk]
        pick = sorted(set(range(T)) - set(range(0, T, max(1, T // 6))))[:4] + [T - 1]  # a few rows of each
        for p in pick:
            rows.append((s[0, p, :p + 1] * 2).to(torch.uint8))  # values are multiples of 0.5
            lens.append(T)
            valid.append(p + 1)
            ks.append(kk)
            out = torch.full((MAXK,), -1, dtype=torch.int32)
            out[:kk] = idx[p].to(torch.int32)
            sel.append(out)
save_file({"codes": torch.cat(rows), "offsets": torch.tensor([0] + [len(r) for r in rows]).cumsum(0).to(torch.int64), "fwd_len": torch.tensor(lens, dtype=torch.int32),
           "valid": torch.tensor(valid, dtype=torch.int32), "k": torch.tensor(ks, dtype=torch.int32),
           "torch_topk": torch.stack(sel)}, os.path.join(OUT, "topk_ties.safetensors"),
          metadata={"torch": torch.__version__})
print("rows", len(rows), "torch", torch.__version__)
