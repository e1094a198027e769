#!/usr/bin/python3
"""An independent reader of moonshine state files, written from docs/state.md.

usage: state_reference.py STATE_FILE MODEL_DIR [STATE_FILE MODEL_DIR ...]

Checks the layout with Python's struct, the header's and every section's CRC32C
with crcmod's predefined 'crc-32c' (Debian python3-crcmod), recomputes the model
identity with hashlib's SHA-256 from config.json and the SafeTensors headers
(parsed with json), and the sizes of the GQA / MLA cache sections from
config.json. Prints one JSON line per file: {"ok", "error", "model_id",
"file_model_id", "n_past", "tokens", "sections": [{"name", "offset", "size",
"crc32c"}]}. test_state.c compares it with the C implementation.
"""
import hashlib
import json
import os
import struct
import sys

import crcmod.predefined

crc32c = crcmod.predefined.mkCrcFun("crc-32c")


def model_identity(model_dir):
    cfg = open(os.path.join(model_dir, "config.json"), "rb").read()
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for f in files:
        with open(os.path.join(model_dir, f), "rb") as fp:
            (n,) = struct.unpack("<Q", fp.read(8))
            hdr = json.loads(fp.read(n))
        for name, t in hdr.items():
            if name != "__metadata__":
                tensors[name] = (t["dtype"], t["shape"])
    h = hashlib.sha256()
    h.update(b"moonshine-id-v1\0" + struct.pack("<Q", len(cfg)) + cfg)
    for name in sorted(tensors, key=lambda s: s.encode()):
        dtype, shape = tensors[name]
        h.update(name.encode() + b"\0" + dtype.encode() + b"\0" + struct.pack("<I", len(shape)))
        h.update(b"".join(struct.pack("<q", d) for d in shape))
    return h.hexdigest(), json.loads(cfg)


def read(path, model_dir):
    b = open(path, "rb").read()
    out = {"ok": False, "error": None}
    if len(b) < 104 or b[:8] != b"MSSTATE\0":
        return dict(out, error="bad magic or short")
    version, ns, hb, fb = struct.unpack_from("<IIQQ", b, 8)
    file_id = b[32:64].hex()
    n_past, ctx_needed, saved_ctx, nt = struct.unpack_from("<qqqq", b, 64)
    hcrc, reserved = struct.unpack_from("<II", b, 96)
    out.update(file_model_id=file_id, n_past=n_past)
    if version != 1 or fb != len(b) or reserved:
        return dict(out, error="version, size or reserved field")
    tab = 104 + (4 * nt + 7) // 8 * 8
    if hb != tab + 72 * ns or hb > len(b) or nt != n_past or ctx_needed < n_past:
        return dict(out, error="header sizes")
    if crc32c(b[:96] + b"\0\0\0\0" + b[100:hb]) != hcrc:
        return dict(out, error="header crc")
    out["tokens"] = list(struct.unpack_from("<%di" % nt, b, 104))
    secs, at = [], hb
    for i in range(ns):
        e = b[tab + 72 * i: tab + 72 * (i + 1)]
        name = e[:48].split(b"\0")[0].decode()
        off, size, crc, res = struct.unpack_from("<QQII", e, 48)
        if off != at or off + size > len(b) or res or crc32c(b[off:off + size]) != crc:
            return dict(out, error="section %s" % name)
        if any(b[off + size: off + (size + 7) // 8 * 8]):
            return dict(out, error="padding of %s" % name)
        at = off + (size + 7) // 8 * 8
        secs.append({"name": name, "offset": off, "size": size, "crc32c": "%08x" % crc})
    if at != len(b):
        return dict(out, error="trailing bytes")
    out["sections"] = secs
    mid, cfg = model_identity(model_dir)
    out["model_id"] = mid
    # per-position caches of attention layers: n_past rows of the widths config.json gives
    cfg = cfg.get("text_config", cfg)
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kvh = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    for s in secs:
        tag = s["name"].split(".", 1)[-1]
        if tag == "latent":
            want = n_past * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4
        elif tag == "k" and "kv_lora_rank" not in cfg and cfg.get("model_type") not in ("mimo_v2_flash",):
            want = n_past * kvh * hd * 4
        else:
            continue
        if s["size"] != want:
            return dict(out, error="section %s: %d bytes, config says %d" % (s["name"], s["size"], want))
    out["ok"] = True
    return out


if __name__ == "__main__":
    for i in range(1, len(sys.argv) - 1, 2):
        print(json.dumps(read(sys.argv[i], sys.argv[i + 1])))
