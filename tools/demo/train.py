#!/usr/bin/env python3
"""Train the moonshine demo model: a small Qwen3-MoE with its own byte-level BPE, on WordNet chats.

Usage (on the GPU machine: torch 2.11, transformers 5.17, tokenizers 0.23, safetensors):
  OUT=DIR python3 tools/demo/train.py DATA.jsonl.xz GEN_MODEL_FIXTURES.py [--seconds S] [--steps N]

  DATA.jsonl.xz          tools/demo/prep_data.py's output
  GEN_MODEL_FIXTURES.py  the shared fixture generator; its float64 no-cache forward (_run) and eager-expert
                         switch (eager_experts) compute the reference, as for tests/data/fixtures/models
  --steps N (default 8000) optimizer steps; --seconds S (default 150) stops earlier at that wall time
  (the step count reached is logged: rerun with --steps N --seconds 1e9 to repeat a run).

Writes $OUT/demo.tar.gz holding models/demo (config.json with FP8 128x128 block quantization of every
projection, model.safetensors, generation_config.json, tokenizer.json, tokenizer_config.json with the chat
template, train_log.json, samples.json, renders.json) and the fixture's reference.safetensors + fixture.json.
Fixed seeds throughout; GPU kernels (index_add in the expert dispatch) are not bit-deterministic.
"""
import json, lzma, math, os, random, sys, tarfile, time

import torch

T0 = time.time()
OUT = os.environ.get("OUT", "/tmp/out")
DATA, GEN = sys.argv[1], sys.argv[2]
ARGS = sys.argv[3:]
STEPS = int(ARGS[ARGS.index("--steps") + 1]) if "--steps" in ARGS else 8000
SECONDS = float(ARGS[ARGS.index("--seconds") + 1]) if "--seconds" in ARGS else 150.0
SEED = 15
W = "/tmp/demo_work"
MD = os.path.join(W, "models/demo")
FX = os.path.join(W, "fixture")
for d in (MD, FX):
    os.makedirs(d, exist_ok=True)
random.seed(SEED)
torch.manual_seed(SEED)
dev = "cuda" if torch.cuda.is_available() else "cpu"
log = {"seed": SEED, "command": " ".join(["python3"] + sys.argv), "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__}


def say(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# ---------------------------------------------------------------- data
convs = [json.loads(l)["messages"] for l in lzma.open(DATA, "rt", encoding="utf-8")]
say("conversations", len(convs))

# ---------------------------------------------------------------- tokenizer
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, normalizers, processors, Regex

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 4096
# Qwen2/Qwen3's split pattern, then byte-level mapping without its own regex (as their tokenizer.json does)
PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
tk = Tokenizer(models.BPE())
tk.normalizer = normalizers.NFC()
tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PAT), behavior="isolated", invert=False),
                                            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tk.decoder = decoders.ByteLevel()
tk.post_processor = processors.ByteLevel(trim_offsets=False)
trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIAL,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)


def corpus():
    for m in convs:
        for x in m:
            yield x["role"] + "\n" + x["content"]


tk.train_from_iterator(corpus(), trainer=trainer)
assert [tk.token_to_id(s) for s in SPECIAL] == [0, 1, 2], "special tokens must be ids 0, 1, 2"
tk.save(os.path.join(MD, "tokenizer.json"))
EOT, PAD = 2, 0
say("tokenizer vocab", tk.get_vocab_size())

TEMPLATE = (
    "{%- for message in messages %}\n"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}\n"
    "{{- raise_exception('Only system, user and assistant roles are supported.') }}\n"
    "{%- endif %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")
tcfg = {
    "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True} for i, s in enumerate(SPECIAL)},
    "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
    "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "clean_up_tokenization_spaces": False,
    "errors": "replace", "model_max_length": 2048, "split_special_tokens": False,
    "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE}
json.dump(tcfg, open(os.path.join(MD, "tokenizer_config.json"), "w"), indent=2, ensure_ascii=False)

import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

try:
    hf_tok = AutoTokenizer.from_pretrained(MD)
except Exception as e:  # should not happen; recorded if it does
    from transformers import PreTrainedTokenizerFast
    log["autotokenizer_error"] = f"{type(e).__name__}: {e}"
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(MD, "tokenizer.json"), eos_token="<|im_end|>",
                                     pad_token="<|endoftext|>")
    hf_tok.chat_template = TEMPLATE
log["transformers"] = transformers.__version__
log["tokenizer_class"] = type(hf_tok).__name__


def render(msgs, gen):
    """The template by hand (what the training tokens are cut from); checked below against transformers."""
    s = "".join(f"<|im_start|>{m['role']}\n{m['content'].strip()}<|im_end|>\n" for m in msgs)
    return s + ("<|im_start|>assistant\n" if gen else "")


for m in convs[:200]:
    r = hf_tok.apply_chat_template(m, tokenize=False)
    assert r == render(m, False), (r, render(m, False))

# ---------------------------------------------------------------- token stream
# Each message is "<|im_start|>role\n" + content + "<|im_end|>" + "\n"; the loss covers the assistant's
# content and its <|im_end|> (so the model learns to stop), nothing else.
heads = {r: tk.encode(f"<|im_start|>{r}\n", add_special_tokens=False).ids for r in ("system", "user", "assistant")}
NL = tk.encode("\n", add_special_tokens=False).ids
flat = [x["content"].strip() for m in convs for x in m]
enc = tk.encode_batch(flat, add_special_tokens=False)
ids_l, msk_l, k = [], [], 0
for m in convs:
    for x in m:
        c = enc[k].ids
        k += 1
        a = x["role"] == "assistant"
        ids_l += heads[x["role"]] + c + [EOT] + NL
        msk_l += [0] * len(heads[x["role"]]) + [int(a)] * (len(c) + 1) + [0] * len(NL)
stream = torch.tensor(ids_l, dtype=torch.long)
mask = torch.tensor(msk_l, dtype=torch.bool)
# check the piecewise tokenization against the whole render on some conversations
for m in convs[:100]:
    whole = tk.encode(render(m, False), add_special_tokens=False).ids
    pieces = []
    for x in m:
        pieces += heads[x["role"]] + tk.encode(x["content"].strip(), add_special_tokens=False).ids + [EOT] + NL
    assert whole == pieces, m
log["stream_tokens"] = len(ids_l)
log["loss_tokens_per_epoch"] = int(mask.sum())
say("stream tokens", len(ids_l), "loss tokens", int(mask.sum()))

# ---------------------------------------------------------------- model
CFG = dict(vocab_size=VOCAB, hidden_size=192, intermediate_size=512, moe_intermediate_size=64, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, head_dim=48, num_experts=16, num_experts_per_tok=4,
           norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=2048,
           rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=None, eos_token_id=EOT,
           pad_token_id=PAD, router_aux_loss_coef=0.01, output_router_logits=False, attention_bias=False)
cfg = AutoConfig.for_model("qwen3_moe", **CFG)
model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32).to(dev)
nparam = sum(p.numel() for p in model.parameters())
log["params"] = nparam
say("params", nparam, "experts impl", getattr(model.config, "_experts_implementation", None))

SEQ, BATCH = 512, 64
LR, WARM = 3e-3, 150
nchunk = (len(ids_l) - 1) // SEQ
X = stream[: nchunk * SEQ + 1]
Mk = mask[: nchunk * SEQ + 1]
opt = torch.optim.AdamW(model.parameters(), lr=LR / WARM, betas=(0.9, 0.95), weight_decay=0.1)
g = torch.Generator().manual_seed(SEED)
curve, seen, step = [], 0, 0
model.train()
model.config.output_router_logits = True


def batch():
    """BATCH random windows of SEQ tokens; labels aligned with input_ids (transformers shifts them), -100
    where the token is not the assistant's."""
    st = torch.randint(0, nchunk, (BATCH,), generator=g) * SEQ
    idx = st[:, None] + torch.arange(SEQ)[None]
    x, m = X[idx], Mk[idx]
    lab = x.clone()
    lab[~m] = -100
    return x.to(dev, non_blocking=True), lab.to(dev, non_blocking=True)


def run_step(x, lab):
    with torch.autocast(dev, dtype=torch.bfloat16):
        out = model(input_ids=x, labels=lab, output_router_logits=True)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out


t_train = time.time()
for name in ("default", "eager"):
    try:
        if name == "eager":
            model.config._experts_implementation = "eager"
            for mm in model.modules():
                if getattr(mm, "config", None) is not None:
                    mm.config._experts_implementation = "eager"
        x, lab = batch()
        out = run_step(x, lab)
        log["experts_implementation"] = name
        break
    except Exception as e:
        say("experts", name, "failed:", type(e).__name__, str(e)[:200])
        opt.zero_grad(set_to_none=True)
step = 1
CALIB = 40 if "--steps" not in ARGS else None  # with --steps N: exactly N steps, no calibration
while step < STEPS and time.time() - t_train < SECONDS:
    if step == CALIB:  # fit the cosine schedule into the time cap: the step count is then logged
        if dev == "cuda":
            torch.cuda.synchronize()
        per = (time.time() - t_calib) / (CALIB - 1)
        STEPS = max(WARM + 10, min(STEPS, int((SECONDS - (time.time() - t_train)) / per) + CALIB))
        log["calibrated_seconds_per_step"] = round(per, 4)
        say(f"calibrated: {per * 1000:.1f} ms/step -> {STEPS} steps")
    if step == 1:
        t_calib = time.time()
    # linear warmup, then cosine to 10% over the rest (steps before WARM do not depend on STEPS)
    lr = LR * (step + 1) / WARM if step < WARM else \
        LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - WARM) / max(1, STEPS - WARM)))))
    for pg in opt.param_groups:
        pg["lr"] = lr
    x, lab = batch()
    out = run_step(x, lab)
    step += 1
    if step % 50 == 0 or step == 2:
        l, a = out.loss.item(), (out.aux_loss.item() if getattr(out, "aux_loss", None) is not None else None)
        ce = l - CFG["router_aux_loss_coef"] * a if a is not None else l
        curve.append({"step": step, "loss": round(l, 4), "ce": round(ce, 4), "aux_loss": a and round(a, 4), "lr": lr,
                      "seconds": round(time.time() - t_train, 1)})
        if step % 250 == 0 or step == 2:
            say(f"step {step} loss {l:.4f} aux {a} lr {lr:.2e}")
if dev == "cuda":
    torch.cuda.synchronize()
train_s = time.time() - t_train
log.update(steps=step, train_seconds=round(train_s, 1), batch=BATCH, seq=SEQ, lr=LR, warmup=WARM,
           tokens_trained=step * BATCH * SEQ, epochs=round(step * BATCH * SEQ / len(ids_l), 2), curve=curve,
           final_loss=curve[-1]["loss"] if curve else None,
           final_ce_mean_last4=round(sum(c["ce"] for c in curve[-4:]) / max(1, len(curve[-4:])), 4), steps_requested=STEPS, seconds_cap=SECONDS)
say("trained", step, "steps in", round(train_s, 1), "s")
model.config.output_router_logits = False
model.eval()
torch.set_grad_enabled(False)

# ---------------------------------------------------------------- save: BF16, then FP8 128x128 blocks
from safetensors.torch import load_file, save_file
import copy

bf = os.path.join(W, "bf16")
m_bf = copy.deepcopy(model).to("cpu").to(torch.bfloat16)
m_bf.config.output_router_logits = False
m_bf.save_pretrained(bf, safe_serialization=True)
sd = load_file(os.path.join(bf, "model.safetensors"))
sd.pop("lm_head.weight", None)  # tied to model.embed_tokens.weight
for kname in [k for k in sd if k.endswith("mlp.experts.gate_up_proj")]:  # fused layout: back to per-expert
    gu, dn, base = sd.pop(kname), sd.pop(kname.replace("gate_up_proj", "down_proj")), kname[:-len("gate_up_proj")]
    E, I2, H = gu.shape
    assert dn.shape == (E, H, I2 // 2), (gu.shape, dn.shape)
    for e in range(E):
        sd[f"{base}{e}.gate_proj.weight"] = gu[e, : I2 // 2].contiguous()
        sd[f"{base}{e}.up_proj.weight"] = gu[e, I2 // 2:].contiguous()
        sd[f"{base}{e}.down_proj.weight"] = dn[e].contiguous()
log["saved_keys_sample"] = sorted(sd)[:8]
q, deq = {}, {}
for kname, v in sd.items():
    if not (v.dim() == 2 and kname.endswith("proj.weight")):
        q[kname] = v
        deq[kname] = v
        continue
    O, I = v.shape
    Ob, Ib = -(-O // 128), -(-I // 128)
    pad = torch.zeros(Ob * 128, Ib * 128)
    pad[:O, :I] = v.float()
    blk = pad.view(Ob, 128, Ib, 128)
    amax = blk.abs().amax(dim=(1, 3)).clamp_min(1e-12)
    scale = torch.pow(2.0, torch.ceil(torch.log2(amax / 448.0)))  # power-of-two scales, as the fixtures' FP8
    qq = (blk / scale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    q[kname] = qq.view(Ob * 128, Ib * 128)[:O, :I].contiguous()
    q[kname[:-len("weight")] + "weight_scale_inv"] = scale.float().contiguous()
    dq = (qq.float() * scale[:, None, :, None]).view(Ob * 128, Ib * 128)[:O, :I]
    deq[kname] = dq.to(torch.bfloat16).contiguous()
    assert torch.equal(deq[kname].float(), dq), "dequantized FP8 must be exact in bf16"
save_file(q, os.path.join(MD, "model.safetensors"), metadata={"format": "pt"})
conf = json.load(open(os.path.join(bf, "config.json")))
conf.pop("output_router_logits", None)
conf["output_router_logits"] = False
conf["dtype"] = "bfloat16"
conf_q = dict(conf, quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                         "weight_block_size": [128, 128]})
json.dump(conf_q, open(os.path.join(MD, "config.json"), "w"), indent=2)
json.dump({"eos_token_id": EOT, "pad_token_id": PAD, "do_sample": True, "temperature": 0.7, "top_p": 0.9},
          open(os.path.join(MD, "generation_config.json"), "w"), indent=2)
# the dequantized twin: exactly the FP8 values, in the plain layout transformers loads without quantizers
dq_dir = os.path.join(W, "dequant")
os.makedirs(dq_dir, exist_ok=True)
save_file(deq, os.path.join(dq_dir, "model.safetensors"), metadata={"format": "pt"})
json.dump(conf, open(os.path.join(dq_dir, "config.json"), "w"), indent=2)
say("saved; model.safetensors bytes", os.path.getsize(os.path.join(MD, "model.safetensors")))

# ---------------------------------------------------------------- the generator's float64 reference
src = open(GEN).read()
MARK = "\nok = {}\n"
assert src.count(MARK) == 1, "gen_model_fixtures.py changed: main-loop marker not found"
ns = {"__name__": "gen_model_fixtures", "__file__": GEN}
argv, sys.argv = sys.argv, [GEN]
exec(compile(src[: src.index(MARK)], GEN, "exec"), ns)
sys.argv = argv
_run, eager_experts = ns["_run"], ns["eager_experts"]

ref_m = AutoModelForCausalLM.from_pretrained(dq_dir, torch_dtype=torch.float32, attn_implementation="eager").float().eval()
ref_m.config._attn_implementation = "eager"
eager_experts(ref_m)
# the trained model in float32 vs its FP8 twin (information: what quantization cost)
tid = lambda s: torch.tensor([tk.encode(s, add_special_tokens=False).ids])
probe = tid(render([{"role": "user", "content": "What is a lantern?"},
                    {"role": "assistant", "content": "A lantern is light in a transparent protective case."}], False))
try:
    l_tr = model.float()(input_ids=probe.to(dev), use_cache=False).logits[0].cpu()
    l_q = ref_m(input_ids=probe, use_cache=False).logits[0]
    log["fp8_vs_trained_max_abs_logit"] = (l_tr - l_q).abs().max().item()
    log["fp8_vs_trained_argmax_agree"] = (l_tr.argmax(-1) == l_q.argmax(-1)).float().mean().item()
except Exception as e:
    log["fp8_vs_trained_error"] = f"{type(e).__name__}: {e}"

CANDS = [
    ("Who are you?", "What is a lantern?"),
    ("What does it mean to whisper?", "What is an apple?"),
    ("Define the verb float.", "What is a river?"),
    ("What is the opposite of cold?", "What is a library?"),
    ("Use the word quickly in a sentence.", "What is a bridge?"),
    ("What does happy mean?", "What is a volcano?"),
]


def reference(cands, T=40, N=12):
    """The shared generator's rule, on real chats: input_ids = the first T tokens of a rendered two-turn chat
    (the reply the model gives), gen_prompt = a rendered question with the generation prompt; kept only if
    float32 agrees with float64 to 2e-4 and every greedy choice wins by >= 1e-3."""
    for attempt, (q1, q2) in enumerate(cands):
        p1 = tid(render([{"role": "user", "content": q1}], True))
        gen1 = ref_m.generate(input_ids=p1, attention_mask=torch.ones_like(p1), max_new_tokens=40, do_sample=False,
                              eos_token_id=EOT, pad_token_id=PAD)[0, p1.shape[1]:]
        a1 = tk.decode(gen1.tolist(), skip_special_tokens=True)
        full = tid(render([{"role": "system", "content": "You are a helpful dictionary."},
                           {"role": "user", "content": q1}, {"role": "assistant", "content": a1},
                           {"role": "user", "content": q2}], True))
        if full.shape[1] < T:
            continue
        ids = full[:, :T]
        gp = tid(render([{"role": "user", "content": q2}], True))
        P = gp.shape[1]
        ref_m.double()
        _, g64, seq = _run(ref_m, gp, P, N)
        l64 = ref_m(input_ids=ids, use_cache=False).logits[0]
        ref_m.float()
        l32 = ref_m(input_ids=ids, use_cache=False).logits[0].double()
        g32 = torch.stack([ref_m(input_ids=seq[:, :P + i], use_cache=False).logits[0, -1].double() for i in range(N)])
        err32 = max((l32 - l64).abs().max().item(), (g32 - g64).abs().max().item())
        top2 = g64.topk(2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        say(f"reference draw {attempt}: f32 vs f64 {err32:.2e} margin {margin:.2e} gen {tk.decode(seq[0, P:].tolist())!r}")
        if err32 <= 2e-4 and margin >= 1e-3:
            stats = dict(float32_vs_float64_max_abs=err32, greedy_min_margin=margin, input_draw=attempt,
                         input_chat=[q1, a1, q2], gen_question=q2)
            return dict(input_ids=ids[0].to(torch.int32), logits=l64.float().contiguous(),
                        gen_prompt=gp[0].to(torch.int32), gen_ids=seq[0, P:].to(torch.int32),
                        gen_logits=g64.float().contiguous()), stats
    raise RuntimeError("no stable draw")


try:
    ref, stats = reference(CANDS)
    save_file(ref, os.path.join(FX, "reference.safetensors"))
    # reload check: a fresh model from the dequantized files gives the same logits
    m2 = AutoModelForCausalLM.from_pretrained(dq_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
    eager_experts(m2)
    l2 = m2.double()(input_ids=ref["input_ids"].long()[None], use_cache=False).logits[0].float()
    gen = ref_m.generate(input_ids=ref["gen_prompt"].long()[None], max_new_tokens=12, do_sample=False,
                         use_cache=True, output_logits=True, return_dict_in_generate=True, pad_token_id=PAD,
                         eos_token_id=None, attention_mask=torch.ones_like(ref["gen_prompt"].long()[None]))
    drift = (torch.stack([x[0] for x in gen.logits]).double() - ref["gen_logits"].double()).abs().max().item()
    meta = dict(arch="qwen3_moe", name="demo", weights="FP8 e4m3 128x128 blocks (power-of-two scales) for every "
                "projection, BF16 embedding/norms/router; the reference computed in float64 from the dequantized "
                "values", reload_check_max_abs_err=(l2 - ref["logits"]).abs().max().item(),
                transformers=transformers.__version__, torch=torch.__version__, seed=SEED,
                transformers_cached_decode_max_abs_drift=drift,
                reference="computed in float64 (eager, no cache) and stored as float32 with the shared generator's "
                "_run and eager_experts. logits: one full forward over input_ids (the first 40 tokens of a rendered "
                "chat); gen_ids/gen_logits: greedy continuation of gen_prompt (a rendered question), each step a full "
                "forward. Kept only if float32 agrees to 2e-4 and every greedy choice wins by >= 1e-3",
                made="tools/demo/train.py", **stats)
    json.dump(meta, open(os.path.join(FX, "fixture.json"), "w"), indent=2)
    say("reference OK", json.dumps({k: meta[k] for k in ("float32_vs_float64_max_abs", "greedy_min_margin",
                                                          "reload_check_max_abs_err")}))
except Exception as e:
    import traceback
    traceback.print_exc()
    log["reference_error"] = f"{type(e).__name__}: {e}"

# ---------------------------------------------------------------- samples, renders, tokenizations
ref_m.float()
samples = []
for qn in ["What is a lantern?", "What does it mean to whisper?", "What is the opposite of cold?",
           "What is a river?", "Who are you?", "Give me a synonym for happy.", "What is an apple?",
           "What kind of thing is a violin?"]:
    p = tid(render([{"role": "user", "content": qn}], True))
    o = ref_m.generate(input_ids=p, attention_mask=torch.ones_like(p), max_new_tokens=64, do_sample=False,
                       eos_token_id=EOT, pad_token_id=PAD)[0, p.shape[1]:].tolist()
    samples.append({"prompt": qn, "reply": tk.decode(o, skip_special_tokens=True), "ids": o,
                    "stopped": bool(o and o[-1] == EOT)})
    say("sample", qn, "->", samples[-1]["reply"], "(stopped)" if samples[-1]["stopped"] else "(no stop)")
json.dump(samples, open(os.path.join(MD, "samples.json"), "w"), indent=2)

chats = [
    ([{"role": "user", "content": "What is a lantern?"}], True),
    ([{"role": "user", "content": "What is a lantern?"}], False),
    ([{"role": "system", "content": "You are a helpful dictionary."}, {"role": "user", "content": "Define river."}], True),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi! Ask me a word."},
      {"role": "user", "content": "  What does it mean to whisper?  \n"}], True),
    ([{"role": "system", "content": "Answer in one sentence."}, {"role": "user", "content": "Opposite of cold?"},
      {"role": "assistant", "content": "The opposite of cold is hot."}], False),
    ([{"role": "user", "content": "Unicode: café, naïve, 東京, emoji 🙂, tabs\tand\nnewlines"}], True),
]
renders = []
for msgs, gp in chats:
    r = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gp)
    renders.append({"messages": msgs, "add_generation_prompt": gp, "rendered": r,
                    "ids": hf_tok(r, add_special_tokens=False)["input_ids"]})
texts = ["What is a lantern?", "Hello, world!  Two  spaces, tabs\tand\nnew lines\n\n", "café naïve 東京 🙂",
         "numbers 1234567 and 3.14159", "<|im_start|>user\nhi<|im_end|>\n", "don't won't I'll you're",
         "UPPER lower MiXeD", "   leading and trailing   ", ""]
toks = [{"text": t, "ids": hf_tok(t, add_special_tokens=False)["input_ids"],
         "hf_tokenizers_ids": tk.encode(t, add_special_tokens=False).ids} for t in texts]
for t in toks:
    t["decoded"] = hf_tok.decode(t["ids"])
json.dump({"transformers": transformers.__version__, "renders": renders, "tokenize": toks},
          open(os.path.join(MD, "renders.json"), "w"), indent=2, ensure_ascii=False)

log["total_seconds"] = round(time.time() - T0, 1)
json.dump(log, open(os.path.join(MD, "train_log.json"), "w"), indent=1)
with tarfile.open(os.path.join(OUT, "demo.tar.gz"), "w:gz") as t:
    t.add(MD, arcname="models/demo")
    t.add(FX, arcname="fixture")
    t.add(os.path.join(bf, "model.safetensors"), arcname="bf16/model.safetensors")
say("done", json.dumps({k: log.get(k) for k in ("steps", "train_seconds", "tokens_trained", "final_loss",
                                                 "fp8_vs_trained_max_abs_logit", "experts_implementation")}))
