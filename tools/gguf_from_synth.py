#!/usr/bin/env python3
"""Write a BF16 GGUF of a BF16 Qwen3-MoE safetensors checkpoint, for the llama.cpp comparison.

    python3 tools/gguf_from_synth.py MODEL_DIR OUT.gguf

Why: the issue-17 comparison runs llama.cpp's llama-bench on the same weights as `moonshine bench`
(a `moonshine synth --dtype bf16 --expert-dtype bf16` checkpoint of
tools/configs/qwen3_30b_a3b_3layers.json). llama.cpp's convert_hf_to_gguf.py needs torch; this
script needs only the Python standard library. It maps the Qwen3-MoE tensor names to llama.cpp's
`qwen3moe` names, stacks each layer's experts into one [E, out, in] tensor per projection, copies
BF16 bytes unchanged (1-D norm weights become F32, as llama.cpp's converter writes them) and
writes `tokenizer.ggml.model = "none"` with the vocabulary size, so llama.cpp makes dummy tokens:
llama-bench only feeds random token ids. Quantized variants are then made with llama-quantize
(`--tensor-type ffn_.*_exps=q8_0` on a BF16 base, or the Q8_0 / MXFP4_MOE presets).
Contract: only qwen3_moe checkpoints whose tensors are all BF16; anything else is refused with
the offending name. The output is written to OUT.gguf.tmp and renamed.
"""
import json
import os
import struct
import sys

GGML_F32, GGML_BF16 = 0, 30
ALIGN = 32


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    hdr.pop("__metadata__", None)
    return 8 + n, hdr


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    # vtype: 4 = u32, 6 = f32, 8 = string
    out = gguf_str(key) + struct.pack("<I", vtype)
    if vtype == 4:
        out += struct.pack("<I", value)
    elif vtype == 6:
        out += struct.pack("<f", value)
    elif vtype == 8:
        out += gguf_str(value)
    else:
        raise ValueError(vtype)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gguf_from_synth.py MODEL_DIR OUT.gguf")
    mdir, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(mdir, "config.json")))
    if cfg.get("model_type") != "qwen3_moe":
        sys.exit("gguf_from_synth: %s: model_type %r is not qwen3_moe" % (mdir, cfg.get("model_type")))
    # name -> (file, data offset, dtype, shape, begin, end)
    src = {}
    for fn in sorted(os.listdir(mdir)):
        if not fn.endswith(".safetensors"):
            continue
        p = os.path.join(mdir, fn)
        base, hdr = read_header(p)
        for name, t in hdr.items():
            if t["dtype"] != "BF16":
                sys.exit("gguf_from_synth: %s: dtype %s (only BF16 is converted)" % (name, t["dtype"]))
            src[name] = (p, base + t["data_offsets"][0], base + t["data_offsets"][1], t["shape"])
    L, E = cfg["num_hidden_layers"], cfg["num_experts"]
    # (gguf name, ggml type, ggml dims, [source tensor names in order])
    tensors = []

    def plain(gname, hname):
        if hname not in src:
            sys.exit("gguf_from_synth: missing tensor %s" % hname)
        shape = src[hname][3]
        tensors.append((gname, GGML_F32 if len(shape) == 1 else GGML_BF16, list(reversed(shape)), [hname]))

    plain("token_embd.weight", "model.embed_tokens.weight")
    plain("output_norm.weight", "model.norm.weight")
    plain("output.weight", "lm_head.weight")
    for i in range(L):
        p = "model.layers.%d." % i
        b = "blk.%d." % i
        plain(b + "attn_norm.weight", p + "input_layernorm.weight")
        plain(b + "attn_q.weight", p + "self_attn.q_proj.weight")
        plain(b + "attn_k.weight", p + "self_attn.k_proj.weight")
        plain(b + "attn_v.weight", p + "self_attn.v_proj.weight")
        plain(b + "attn_output.weight", p + "self_attn.o_proj.weight")
        plain(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight")
        plain(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight")
        plain(b + "ffn_norm.weight", p + "post_attention_layernorm.weight")
        plain(b + "ffn_gate_inp.weight", p + "mlp.gate.weight")
        for proj, g in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            names = [p + "mlp.experts.%d.%s.weight" % (e, proj) for e in range(E)]
            for n in names:
                if n not in src:
                    sys.exit("gguf_from_synth: missing tensor %s" % n)
            shape = src[names[0]][3]
            tensors.append((b + g + ".weight", GGML_BF16, list(reversed(shape)) + [E], names))

    meta = [
        kv("general.architecture", 8, "qwen3moe"),
        kv("general.name", 8, os.path.basename(os.path.normpath(mdir))),
        kv("general.alignment", 4, ALIGN),
        kv("qwen3moe.block_count", 4, L),
        kv("qwen3moe.context_length", 4, cfg["max_position_embeddings"]),
        kv("qwen3moe.embedding_length", 4, cfg["hidden_size"]),
        kv("qwen3moe.feed_forward_length", 4, cfg["intermediate_size"]),
        kv("qwen3moe.expert_feed_forward_length", 4, cfg["moe_intermediate_size"]),
        kv("qwen3moe.attention.head_count", 4, cfg["num_attention_heads"]),
        kv("qwen3moe.attention.head_count_kv", 4, cfg["num_key_value_heads"]),
        kv("qwen3moe.attention.key_length", 4, cfg["head_dim"]),
        kv("qwen3moe.attention.value_length", 4, cfg["head_dim"]),
        kv("qwen3moe.rope.freq_base", 6, float(cfg["rope_theta"])),
        kv("qwen3moe.attention.layer_norm_rms_epsilon", 6, float(cfg["rms_norm_eps"])),
        kv("qwen3moe.expert_count", 4, E),
        kv("qwen3moe.expert_used_count", 4, cfg["num_experts_per_tok"]),
        kv("qwen3moe.vocab_size", 4, cfg["vocab_size"]),
        kv("tokenizer.ggml.model", 8, "none"),
    ]

    def nbytes(t):
        n = 1
        for d in t[2]:
            n *= d
        return n * (4 if t[1] == GGML_F32 else 2)

    infos, off = [], 0
    for t in tensors:
        infos.append(gguf_str(t[0]) + struct.pack("<I", len(t[2])) +
                     b"".join(struct.pack("<Q", d) for d in t[2]) + struct.pack("<IQ", t[1], off))
        off += (nbytes(t) + ALIGN - 1) // ALIGN * ALIGN
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
        for m in meta:
            f.write(m)
        for i in infos:
            f.write(i)
        f.write(b"\0" * ((-f.tell()) % ALIGN))
        handles = {}
        for t in tensors:
            start = f.tell()
            for n in t[3]:
                p, b0, b1, _ = src[n]
                h = handles.get(p) or handles.setdefault(p, open(p, "rb"))
                h.seek(b0)
                data = h.read(b1 - b0)
                if t[1] == GGML_F32:  # BF16 -> F32: the BF16 bits are the high half
                    data = b"".join(b"\0\0" + data[j:j + 2] for j in range(0, len(data), 2))
                f.write(data)
            assert f.tell() - start == nbytes(t), t[0]
            f.write(b"\0" * ((-f.tell()) % ALIGN))
        for h in handles.values():
            h.close()
    os.replace(tmp, out)
    print(json.dumps({"out": out, "tensors": len(tensors), "bytes": os.path.getsize(out)}))


if __name__ == "__main__":
    main()
