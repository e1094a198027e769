/* config.h — the model description parsed from a checkpoint's config.json.
 *
 * One flat struct covers every supported family; an architecture file
 * (src/model/arch_*.c) fills the family-specific fields and the per-layer
 * schedule. Everything the engine needs to size buffers and pick blocks is
 * here: no dimension is hard-coded anywhere else. */
#ifndef MS_CONFIG_H
#define MS_CONFIG_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "model/rope.h"
#include "util/err.h"

#define MS_MAX_LAYERS 512

/* GDN: gated DeltaNet (one decay per head, grouped q/k heads; engine/gdn_block.h).
 * COMPRESSED: shared-KV MQA over a sliding window plus compressed KV entries (engine/compressed_attn.c). */
typedef enum { MS_ATTN_GQA = 1, MS_ATTN_MLA = 2, MS_ATTN_KDA = 3, MS_ATTN_GDN = 4, MS_ATTN_COMPRESSED = 5 } ms_attn_kind;
typedef enum { MS_MLP_DENSE = 1, MS_MLP_MOE = 2 } ms_mlp_kind;
/* SOFTMAX: softmax over all experts, then top-k; SIGMOID: sigmoid scores (+ correction
 * bias for the choice), group-limited top-k; TOPK_SOFTMAX: top-k of the logits, then
 * softmax over the k chosen (gpt-oss). */
/* SQRTSOFTPLUS: scores sqrt(softplus(logit)) (+ correction bias for the choice), plain top-k. */
/* SOFTMAX_BIAS (LongCat-Flash, ERNIE 4.5): softmax scores, top-k of scores + e_score_correction_bias, weights
 * the scores (renormalised per norm_topk_prob) times routed_scale. */
/* SOFTMAX_GROUP (DeepSeek-V2 group_limited_greedy): softmax scores; with n_group > 1 only the topk_group
 * groups whose best score is highest stay candidates; top-k of the candidates, weights the scores
 * (renormalised per norm_topk_prob) times routed_scale. */
/* SPARSEMIXER (PhiMoE, inference form, top-2): expert 1 the best logit, weighed by the softmax over the
 * logits within router_jitter of the best (relative: (max - s) / max(|s|, max) <= 2 router_jitter);
 * expert 2 the best of the others, weighed the same way over the others; no renormalisation. */
/* SOFTMAX_GROUP2 (Mistral 4): softmax scores; with n_group > 1 only the topk_group groups whose two best
 * scores sum highest stay candidates; top-k of the candidates, weights the scores (renormalised per
 * norm_topk_prob, + 1e-20) times routed_scale. */
typedef enum {
    MS_ROUTER_SOFTMAX = 1, MS_ROUTER_SIGMOID = 2, MS_ROUTER_TOPK_SOFTMAX = 3, MS_ROUTER_SQRTSOFTPLUS = 4,
    MS_ROUTER_SOFTMAX_BIAS = 5, MS_ROUTER_SOFTMAX_GROUP = 6, MS_ROUTER_SPARSEMIXER = 7, MS_ROUTER_SOFTMAX_GROUP2 = 8
} ms_router_kind;
/* Where q/k RMSNorm applies: none, per head (head_dim), or over all heads' projection. */
typedef enum { MS_QKNORM_NONE = 0, MS_QKNORM_HEAD = 1, MS_QKNORM_FULL = 2 } ms_qknorm_kind;
/* Gated MLP activation: SwiGLU with the config's act_limit / act_alpha / act_up_offset (plain
 * silu(gate) * up by default; see ms_swiglu_param), or SiTU (Kimi K3):
 * beta tanh(gate/beta) sigmoid(gate) * (linear_beta tanh(up/linear_beta) when linear_beta > 0, else up). */
typedef enum { MS_ACT_SILU = 0, MS_ACT_SITU = 2 } ms_act_kind;

#define MS_CT_MAX_PATTERNS 16
#define MS_CT_PATTERN_LEN 160

typedef struct ms_config {
    char model_type[64];
    const struct ms_arch *arch;
    /* trunk */
    int64_t vocab, hidden, n_layers, max_pos;
    double rms_eps;
    int tie_embeddings;
    /* attention (GQA) */
    int64_t n_heads, n_kv_heads, head_dim;
    int attn_bias;              /* q/k/v biases */
    ms_qknorm_kind qk_norm;
    /* attention (MLA) */
    int64_t q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
    double attn_scale;          /* softmax scale incl. YaRN mscale^2 */
    /* position-dependent query scale (Llama 4 / Mistral 4 llama_4_scaling_beta): MLA queries at position p
     * times 1 + q_pos_beta log(1 + floor(p / q_pos_len)); q_pos_beta 0: none */
    double q_pos_beta;
    int64_t q_pos_len;
    double mla_norm_eps;        /* eps of the MLA q_a / kv_a latent norms (0: rms_eps) */
    /* linear attention (KDA layers, MS_ATTN_KDA) */
    int64_t kda_heads, kda_head_dim, kda_conv;
    int kda_lower_bound_gate;   /* 1: gate_lower_bound form (Kimi K3); 0: softplus form */
    double kda_lower_bound;
    int kda_full_rank_gate;     /* 1: g_proj; 0: g_a_proj / g_b_proj */
    /* gated DeltaNet layers (MS_ATTN_GDN); the conv kernel is kda_conv */
    int64_t gdn_k_heads, gdn_v_heads, gdn_k_dim, gdn_v_dim;
    int gdn_split;              /* projections stored split (in_proj_qkv/z/b/a, Qwen3.5), not fused (in_proj_qkvz/ba) */
    int attn_out_gate;          /* GQA: q_proj rows hold [query hd, gate hd] per head; att *= sigmoid(gate) */
    int attn_gate_proj;         /* GQA: att *= sigmoid(gate_proj x), its own [heads * v_head_dim, hidden] matrix
                                 * (AFMoE; bound as ms_layer mla_gate) */
    int shared_expert_gate;     /* MoE: shared experts' output *= sigmoid(shared_expert_gate x) */
    ms_rope rope;
    /* DeepSeek Sparse Attention: MLA layers with a lightning indexer (ops/dsa.h) */
    int64_t dsa_heads, dsa_head_dim, dsa_topk, dsa_kpool;
    int dsa_kpool_tail;         /* KPool: always select the query's incomplete pool */
    int dsa_rope_interleaved;   /* indexer RoPE layout: 1 interleaved (GLM-MoE-DSA), 0 half split (V3.2) */
    int dsa_chain_shared;       /* a shared layer passes its reused selection on (see ms_dsa_share_plan) */
    uint8_t layer_dsa[MS_MAX_LAYERS]; /* 0: plain attention; 1: own indexer; 2: reuses an earlier selection */
    /* manifold-constrained hyper-connections (ops/mhc.h): hc_mult residual streams (<= 1: plain residual) */
    int64_t hc_mult, hc_sinkhorn_iters;
    double hc_eps;
    int hc_head_weighted;       /* final stream collapse: learned weights (hc_head) instead of the mean */
    /* compressed attention (MS_ATTN_COMPRESSED): per layer compress rate (0: sliding window only) and
     * whether the layer's entries overlap two windows and are picked by a lightning indexer (CSA) */
    uint8_t layer_compress[MS_MAX_LAYERS];
    uint8_t layer_csa[MS_MAX_LAYERS];
    int64_t o_groups, o_lora_rank;             /* grouped low-rank output projection */
    uint8_t layer_hash[MS_MAX_LAYERS];          /* MoE layer routed by a token-id -> experts table */
    /* GQA per-layer variations (0 = the model-wide value) */
    ms_rope rope_alt;                           /* a second RoPE (per layer type), see layer_rope */
    int32_t layer_kv_heads[MS_MAX_LAYERS];
    int32_t layer_window[MS_MAX_LAYERS];        /* sliding window: keys within the last W positions; 0 = full */
    uint8_t layer_rope[MS_MAX_LAYERS];          /* 0: rope, 1: rope_alt */
    uint8_t layer_sinks[MS_MAX_LAYERS];         /* per-head sink logit joins the softmax */
    double v_scale;                             /* values multiplied by this before caching (0 = 1) */
    int qk_norm_after_rope;                     /* per-head q/k norms apply after RoPE (Hunyuan), not before */
    /* residual stream scales (Granite; 0 = 1): embeddings times embed_scale, every sublayer's output times
     * residual_scale before its residual add, the final normed hidden times logit_scale before lm_head */
    double embed_scale, residual_scale, logit_scale;
    /* post_norm (FlexOlmo): a sublayer reads the residual itself (no input norm) and its output is
     * RMS-normed (ms_layer attn_post_norm / ffn_post_norm) before the residual add */
    int post_norm;
    /* layernorm (DBRX): the layer and final norms are LayerNorms (ms_layer attn_norm_b / ffn_norm_b and
     * ms_model final_norm_b their optional biases), eps rms_eps; clip_qkv (DBRX): GQA q, k, v clamped to
     * [-clip_qkv, clip_qkv] after their projections (0: none) */
    int layernorm;
    double clip_qkv;
    int o_bias;                                 /* o_proj has a bias */
    /* parallel_block (Cohere): the layer's FFN reads the attention's normed input, both outputs added to the
     * residual (x + attn(norm x) + ffn(norm x)); ffn_norm unused. moe_out_scale (0 = 1): a MoE layer's whole
     * output (routed + shared) times this (Cohere's shared_expert_combination_strategy "average": 0.5) */
    int parallel_block;
    double moe_out_scale;
    /* feed-forward */
    int64_t inter;              /* dense MLP width */
    int64_t moe_inter;          /* routed expert width */
    int64_t shared_inter;       /* shared experts' total width (0: none) */
    int64_t n_experts, top_k, n_group, topk_group;
    /* zero-computation experts (LongCat-Flash): router choices n_experts .. n_experts + n_zero_experts - 1
     * are the identity (their weight times the FFN input); the router is ms_router_width wide */
    int64_t n_zero_experts;
    /* shortcut-connected MoE (LongCat-Flash): 1 on a layer whose MoE (router and experts bound on it)
     * runs beside its dense MLP (gate/up/down of width inter) on the same normed input, its output
     * held; 2 on the next layer, which adds the held output to its FFN output; 0 otherwise */
    uint8_t layer_shortcut[MS_MAX_LAYERS];
    int64_t expert_hidden;      /* width routed experts read and write: hidden, or the latent width
                                   (routed_expert_hidden_size) when latent_moe */
    int latent_moe;             /* routed experts between routed_expert_down_proj / up_proj */
    int latent_moe_norm;        /* RMSNorm (routed_expert_norm) on the latent expert sum */
    ms_act_kind act;            /* activation of the dense MLP and shared experts (SILU or SITU) */
    double situ_beta, situ_linear_beta; /* SiTU parameters (linear_beta 0: none) */
    int mla_out_gate;           /* MLA: attn_out *= sigmoid(g_proj x) before o_proj */
    int64_t attn_res_block;     /* Attention Residuals block size (0: plain residual stream) */
    int64_t media_token;        /* image placeholder token of a multimodal checkpoint (-1: none) */
    ms_router_kind router;
    int router_bias;            /* e_score_correction_bias present */
    int norm_topk_prob;
    double routed_scale;
    int router_logit_bias;      /* router Linear has a bias (gpt-oss) */
    double router_jitter;       /* MS_ROUTER_SPARSEMIXER's jitter_eps */
    int expert_bias;            /* experts' projections have biases */
    ms_act_kind expert_act;
    /* SwiGLU (MS_ACT_SILU, dense MLP and experts alike): out = (u + act_up_offset) g sigmoid(act_alpha g)
     * with g = gate, u = up, first clamped to g <= act_limit, |u| <= act_limit when act_limit > 0.
     * Plain (the default): 0, 1, 0. gpt-oss: swiglu_limit (7), 1.702, 1. GLM-5-Next and DeepSeek-V4:
     * swiglu_limit (10), 1, 0. */
    double act_limit, act_alpha, act_up_offset;
    /* weights */
    int fp8;                    /* quantization_config fp8 */
    int fp8_block[2];
    char quant_method[32];      /* "mxfp4", "compressed-tensors": bound by the architecture; "" otherwise */
    int mxfp4_packed;           /* compressed-tensors mxfp4-pack-quantized (weight_packed + weight_scale) */
    int int4_packed;            /* compressed-tensors pack-quantized INT4, per group (qmat.h I4):
                                 * weight_packed I32 [rows, cols/8] + weight_scale [rows, cols/group] + weight_shape */
    int int4_group;             /* its group size (Kimi K2: 32) */
    int int4_asym;              /* its weights.symmetric is false: + weight_zero_point I32 [ceil(rows/8),
                                 * cols/group] per matrix (qmat.h I4 zero) */
    /* compressed-tensors: which modules the config groups quantize (ms_config_ct_quantized) */
    int n_ct_targets, n_ct_ignore;
    char ct_targets[MS_CT_MAX_PATTERNS][MS_CT_PATTERN_LEN];
    char ct_ignore[MS_CT_MAX_PATTERNS][MS_CT_PATTERN_LEN];
    /* per-layer schedule */
    uint8_t layer_attn[MS_MAX_LAYERS];
    uint8_t layer_mlp[MS_MAX_LAYERS];
    int64_t bos_id, eos_id;
} ms_config;

/* Parse config.json text (at most a few MiB) into c: common fields, then the
 * architecture's own (selected by model_type). `where` names the file. */
int ms_config_parse(const char *json, size_t len, const char *where, ms_config *c, ms_err *err);
/* compressed-tensors: whether module `name` (a Linear's name, without ".weight") is
 * quantized by the config groups: it matches a target ("Linear", which every Linear
 * matches, "re:REGEX" or an exact name) and no ignore entry ("re:REGEX" matched at
 * the start of the name as Python's re.match does, or an exact name), as
 * compressed_tensors' match_name does. 0 when the config has no compressed-tensors
 * groups. */
int ms_config_ct_quantized(const ms_config *c, const char *name);
/* Read DIR/config.json and parse it. */
int ms_config_load(const char *dir, ms_config *c, ms_err *err);

/* Helpers for architecture files. */
int ms_config_rope(const cJSON *j, ms_config *c, int64_t rotary_dim, ms_rope_layout layout, const char *where,
                   ms_err *err);

/* Router output width: the routed experts plus the zero-computation ones. */
static inline int64_t ms_router_width(const ms_config *c) { return c->n_experts + c->n_zero_experts; }

#endif
