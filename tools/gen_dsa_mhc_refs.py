# Usage (on the GPU machine, where torch and transformers are installed):
#   python3 tools/gen_dsa_mhc_refs.py GEN_MODEL_FIXTURES_PY FIXTURE_DIR
# 1. Module-level references for mHC: transformers' Glm5NextTextHyperConnection /
#    DeepseekV4HyperConnection / DeepseekV4HyperHead with random float64 parameters
#    and inputs -> $OUT/mhc_ref.safetensors (inputs and outputs stored as float32).
# 2. How close the DSA top-k decisions of the stored fixtures come to a tie: the
#    smallest gap between the k-th and (k+1)-th valid index score over every query
#    of every indexer call (float64, the fixtures' own inputs).
# 3. More DSA fixtures made exactly like GEN_MODEL_FIXTURES_PY (the generator of tests/data/fixtures/models)
#    (other seeds, top-k, layer schedules, shared indexers) -> $OUT/fixtures_dsa.tgz.
import os, sys, json, tarfile, types
import torch
from safetensors.torch import save_file

OUT = os.environ.get("OUT", "/tmp/out")
GEN, FIXDIR = sys.argv[1], sys.argv[2]
torch.set_grad_enabled(False)

# ---------- 1. mHC module references ----------
def mhc_refs():
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4
    from transformers.models.glm5_next import modeling_glm5_next as g5
    g = torch.Generator().manual_seed(99)
    out = {}
    for name, hc, dim, iters, eps in (("a", 2, 64, 5, 1e-6), ("b", 4, 48, 20, 1e-6), ("c", 3, 16, 1, 1e-3)):
        cfg = types.SimpleNamespace(hc_mult=hc, hc_sinkhorn_iters=iters, hc_eps=eps, rms_norm_eps=1e-6, hidden_size=dim)
        mods = {"glm5": g5.Glm5NextTextHyperConnection(cfg), "v4": v4.DeepseekV4HyperConnection(cfg)}
        mix = (2 + hc) * hc
        fn = (0.1 * torch.randn(mix, hc * dim, generator=g)).to(torch.bfloat16).double()
        base = (0.5 * torch.randn(mix, generator=g)).float().double()
        scale = (1 + 0.3 * torch.randn(3, generator=g)).float().double()
        x = (2 * torch.randn(1, 5, hc, dim, generator=g)).float().double()
        y = torch.randn(1, 5, dim, generator=g).float().double()
        res = {}
        for k, m in mods.items():
            m.double()
            m.fn.copy_(fn), m.base.copy_(base), m.scale.copy_(scale)
            post, comb, collapsed = m(x)
            # the decoder layer's expand step, written as the reference writes it
            new = post.unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), x)
            res[k] = (post, comb, collapsed, new)
        assert all(torch.equal(a, b) for a, b in zip(res["glm5"], res["v4"])), "glm5 and v4 mHC differ"
        post, comb, collapsed, new = res["glm5"]
        head = v4.DeepseekV4HyperHead(cfg).double()
        head.hc_fn.copy_((0.1 * torch.randn(hc, hc * dim, generator=g)).to(torch.bfloat16).double())
        head.hc_base.copy_((0.3 * torch.randn(hc, generator=g)).float().double())
        head.hc_scale.copy_((1 + 0.2 * torch.randn(1, generator=g)).float().double())
        hw = head(x)
        hm = g5.Glm5NextTextHyperHead()(x)
        meta = torch.tensor([hc, dim, iters], dtype=torch.int32)
        f = lambda t: t.float().contiguous()
        out.update({f"{name}.meta": meta, f"{name}.eps": torch.tensor([eps], dtype=torch.float32),
                    f"{name}.fn": fn.to(torch.bfloat16).contiguous(), f"{name}.base": f(base), f"{name}.scale": f(scale),
                    f"{name}.x": f(x[0]), f"{name}.y": f(y[0]), f"{name}.post": f(post[0]), f"{name}.comb": f(comb[0]),
                    f"{name}.collapsed": f(collapsed[0]), f"{name}.new": f(new[0]),
                    f"{name}.head_fn": head.hc_fn.to(torch.bfloat16).contiguous(), f"{name}.head_base": f(head.hc_base),
                    f"{name}.head_scale": f(head.hc_scale), f"{name}.head_weighted": f(hw[0]), f"{name}.head_mean": f(hm[0])})
    save_file(out, os.path.join(OUT, "mhc_ref.safetensors"))
    print("mhc refs:", len(out), "tensors")

# ---------- 2. tie margins of the DSA top-k decisions ----------
GAPS = []
_topk = torch.Tensor.topk
def topk_probe(self, k, dim=-1, largest=True, sorted=True):
    r = _topk(self, k, dim=dim, largest=largest, sorted=sorted)
    if self.dim() == 3 and self.dtype == torch.float64 and k < self.shape[-1]:
        v = self.sort(dim=-1, descending=True).values
        valid = v[..., k] > -1e300  # the (k+1)-th is a real candidate (not a causal/invalid fill)
        if valid.any():
            gap = (v[..., k - 1] - v[..., k])[valid]
            GAPS.append((gap.min().item(), int((gap == 0).sum().item()), int(valid.sum().item())))
    return r

def tie_probe(gen_ns):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    torch.Tensor.topk = topk_probe
    try:
        for name in sorted(os.listdir(FIXDIR)):
            d = os.path.join(FIXDIR, name)
            try:
                m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
            except Exception:
                m = AutoModelForImageTextToText.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
            gen_ns["eager_experts"](m)
            m = m.double().eval()
            ref = load_file(os.path.join(d, "reference.safetensors"))
            GAPS.clear()
            l = m(input_ids=ref["input_ids"].long()[None], use_cache=False).logits[0]
            err = (l.float() - ref["logits"]).abs().max().item()
            P = ref["gen_prompt"].shape[0]
            seq = torch.cat([ref["gen_prompt"], ref["gen_ids"]]).long()[None]
            for i in range(ref["gen_ids"].shape[0]):
                m(input_ids=seq[:, :P + i], use_cache=False)
            mg = min(g[0] for g in GAPS) if GAPS else None
            ties = sum(g[1] for g in GAPS)
            print(f"tie probe {name}: logits err {err:.2e}; {len(GAPS)} top-k calls, min gap at the cut {mg}, exact ties {ties}")
    finally:
        torch.Tensor.topk = _topk
    # torch's own choice among exact ties (CPU, float64), for the record
    x = torch.zeros(1, 1, 40, dtype=torch.float64)
    x[0, 0, [3, 17, 30]] = 1.0
    print("torch.topk(8) among ties, zeros with 3 ones at 3,17,30:", _topk(x, 8, dim=-1).indices.tolist())

# ---------- 3. more fixtures ----------
def more_fixtures(ns):
    M, common, mla = ns["M"], ns["common"], ns["mla"]
    A = ns["ARCH"]
    A.clear()
    A["deepseek_v32_s2"] = (4242, lambda: M(common(layers=3), mla(64), model_type="deepseek_v32",
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=2.5, n_group=2, topk_group=1,
        norm_topk_prob=True, first_k_dense_replace=1, index_n_heads=2, index_head_dim=32, index_topk=5))
    A["glm_moe_dsa_shared"] = (777, lambda: M(common(layers=4), mla(64), model_type="glm_moe_dsa",
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
        index_n_heads=4, index_head_dim=16, index_topk=6, indexer_types=["full", "shared", "shared", "full"]))
    A["glm5_next_s2"] = (31337, lambda: dict(model_type="glm5_next", text_config=M(common(layers=4), mla(64),
        qk_rope_head_dim=0, qk_nope_head_dim=24, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
        topk_group=1, index_n_heads=2, index_head_dim=16, index_topk=6, linear_head_dim=16, linear_num_heads=4, hc_mult=3,
        hc_sinkhorn_iters=7, index_kpool=3, layer_types=["linear_attention", "deepseek_sparse_attention",
        "deepseek_sparse_attention", "linear_attention"], indexer_types=["full", "full", "shared", "full"],
        mlp_layer_types=["dense", "sparse", "sparse", "dense"]), vision_config=dict(depth=1, hidden_size=32, num_heads=2,
        out_hidden_size=64, intermediate_size=64)))
    import copy
    from safetensors.torch import load_file
    work = ns["WORK"]
    for arch, (seed, fn) in list(A.items()):
        try:
            ns["SEED"] = seed
            A[arch] = fn
            model = ns["build"](arch)
            d = os.path.join(work, arch)
            copy.deepcopy(model).to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
            meta = dict(arch=arch.rsplit("_", 1)[0] if not arch.startswith("glm_moe") else "glm_moe_dsa",
                        weights="bfloat16 in the file; the reference computed in float64 from the same values",
                        made_by="tools/gen_dsa_mhc_refs.py via gen_model_fixtures.py build/finish "
                                "(the generator of tests/data/fixtures/models)")
            f = os.path.join(d, "model.safetensors")
            sd = load_file(f)
            if any(k.startswith("model.visual.") for k in sd):
                save_file({k: v for k, v in sd.items() if not k.startswith("model.visual.")}, f, metadata={"format": "pt"})
                meta["note"] = "vision tower tensors (model.visual.*) removed from the file; the text model is complete"
            GAPS.clear()
            torch.Tensor.topk = topk_probe
            try:
                ns["finish"](arch, model, d, meta)
            finally:
                torch.Tensor.topk = _topk
            print(f"   {arch}: min top-k gap {min((g[0] for g in GAPS), default=None)}, ties {sum(g[1] for g in GAPS)}")
        except Exception as e:
            import traceback
            print(f"== {arch}: FAILED {type(e).__name__}: {e}")
            traceback.print_exc(limit=6)
    with tarfile.open(os.path.join(OUT, "fixtures_dsa.tgz"), "w:gz") as t:
        for arch in A:
            if os.path.isdir(os.path.join(work, arch)):
                t.add(os.path.join(work, arch), arcname=arch)

if __name__ == "__main__":
    import transformers
    print("transformers", transformers.__version__, "torch", torch.__version__)
    src = open(GEN).read()
    ns = {"__name__": "gen"}
    sys.argv = [GEN, "none"]  # define everything, generate nothing
    exec(compile(src, GEN, "exec"), ns)
    for step in (mhc_refs, lambda: tie_probe(ns), lambda: more_fixtures(ns)):
        try:
            step()
        except Exception as e:
            import traceback
            traceback.print_exc()
