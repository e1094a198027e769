/* arch_longcat_flash.c — LongCat-Flash (LongcatFlashForCausalLM). Each of its
 * num_layers decoder layers is two engine layers (sublayers s = 0, 1, as the
 * KV cache counts them): MLA attention (DeepSeek V3's, interleaved RoPE) and a
 * dense SwiGLU MLP (mlps.s, ffn_hidden_size) each; and one MoE per decoder
 * layer, shortcut-connected: it reads sublayer 0's normed FFN input and its
 * output joins sublayer 1's FFN output (config layer_shortcut: engine layer 2i
 * holds the router and experts, 2i + 1 adds the held output). The router
 * (mlp.router.classifier, F32 in transformers) takes a softmax over
 * n_routed_experts + zero_expert_num choices, picks the top moe_topk of the
 * scores plus e_score_correction_bias, and weighs each by its score times
 * routed_scaling_factor (no renormalisation); choices past the routed experts
 * are zero-computation experts, the identity (ms_router_width, engine/moe.c).
 * The MLA's LoRA scaling (q and both q parts by sqrt(hidden / q_lora_rank), the
 * normed kv latent by sqrt(hidden / kv_lora_rank)) is folded into the
 * q_a_layernorm and kv_a_layernorm weights (F32 copies) at load.
 * transformers: models/longcat_flash/modular_longcat_flash.py. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t layers = 0;
    int router_bias = 0, interleave = 1, rc;
    const char *act = "silu";
    if ((rc = ms_json_int(j, "num_layers", 1, MS_MAX_LAYERS / 2, &layers, where, err)) ||
        (rc = ms_json_int(j, "q_lora_rank", 1, 1 << 20, &c->q_lora_rank, where, err)) ||
        (rc = ms_json_int(j, "kv_lora_rank", 1, 1 << 20, &c->kv_lora_rank, where, err)) ||
        (rc = ms_json_int(j, "qk_nope_head_dim", 0, 1 << 16, &c->qk_nope_dim, where, err)) ||
        (rc = ms_json_int(j, "qk_rope_head_dim", 2, 1024, &c->qk_rope_dim, where, err)) ||
        (rc = ms_json_int(j, "v_head_dim", 1, 1 << 16, &c->v_head_dim, where, err)) ||
        (rc = ms_json_int(j, "n_routed_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "zero_expert_num", 0, 65536, &c->n_zero_experts, where, err)) ||
        (rc = ms_json_int(j, "moe_topk", 1, 4096, &c->top_k, where, err)) ||
        (rc = ms_json_int(j, "ffn_hidden_size", 1, 1 << 24, &c->inter, where, err)) ||
        (rc = ms_json_int(j, "expert_ffn_hidden_size", 1, 1 << 24, &c->moe_inter, where, err)) ||
        (rc = ms_json_opt_bool(j, "router_bias", &router_bias, where, err)) ||
        (rc = ms_json_opt_bool(j, "rope_interleave", &interleave, where, err)) ||
        (rc = ms_json_opt_string(j, "hidden_act", &act, where, err)))
        return rc;
    if (strcmp(act, "silu"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu)", where, act);
    if (router_bias) return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: router_bias (a classifier bias) is not supported", where);
    if (c->n_heads < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing num_attention_heads", where);
    if (c->top_k > c->n_experts + c->n_zero_experts)
        return ms_fail(err, MS_ERR_FORMAT, "%s: moe_topk %lld exceeds the %lld experts", where, (long long)c->top_k,
                       (long long)(c->n_experts + c->n_zero_experts));
    c->n_layers = 2 * layers; /* two attention sublayers per decoder layer (num_hidden_layers is 2 * num_layers) */
    c->router = MS_ROUTER_SOFTMAX_BIAS;
    c->router_bias = 1;
    c->norm_topk_prob = 0;
    c->n_group = c->topk_group = 1;
    if ((rc = ms_config_rope(j, c, c->qk_rope_dim, interleave ? MS_ROPE_INTERLEAVED : MS_ROPE_HALF, where, err)))
        return rc;
    c->attn_scale = 1.0 / sqrt((double)(c->qk_nope_dim + c->qk_rope_dim));
    c->mla_norm_eps = 1e-6; /* the MLA latent norms use DeepseekV3RMSNorm's default eps */
    if (c->rope.yarn && c->rope.mscale_all_dim != 0 && c->rope.factor > 1) {
        double ms = 0.1 * c->rope.mscale_all_dim * log(c->rope.factor) + 1.0;
        c->attn_scale *= ms * ms;
    }
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_MLA;
        c->layer_mlp[l] = l % 2 ? MS_MLP_DENSE : MS_MLP_MOE;
        c->layer_shortcut[l] = l % 2 ? 2 : 1;
    }
    return MS_OK;
}

static void scale_vec(float *v, int64_t n, double s) {
    for (int64_t i = 0; v && i < n; i++) v[i] = (float)(v[i] * s);
}

static int bind(ms_binder *b, ms_model *m) {
    const ms_config *c = b->cfg;
    const int64_t W = ms_router_width(c);
    const double sq = sqrt((double)c->hidden / (double)c->q_lora_rank);
    const double skv = sqrt((double)c->hidden / (double)c->kv_lora_rank);
    ms_bind_trunk(b, m, "model.embed_tokens", "model.norm.weight", "lm_head");
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        const int i = l / 2, s = l % 2;
        char p[64], a[96], f[96], g[128], u[128], d[128];
        ms_layer *L = &m->layers[l];
        snprintf(p, sizeof p, "model.layers.%d.", i);
        ms_bind_vec(b, &L->attn_norm, MS_W_NORM, c->hidden, 0, "%sinput_layernorm.%d.weight", p, s);
        ms_bind_vec(b, &L->ffn_norm, MS_W_NORM, c->hidden, 0, "%spost_attention_layernorm.%d.weight", p, s);
        snprintf(a, sizeof a, "%sself_attn.%d.", p, s);
        ms_bind_mla_at(b, m, l, a);
        scale_vec(L->q_a_norm, c->q_lora_rank, sq);
        scale_vec(L->kv_a_norm, c->kv_lora_rank, skv);
        snprintf(f, sizeof f, "%smlps.%d.", p, s);
        ms_bind_mlp(b, m, l, f, c->inter, "gate_proj", "up_proj", "down_proj");
        if (s) continue;
        ms_bind_mat(b, &L->router, MS_W_ROUTER, W, c->hidden, "%smlp.router.classifier", p);
        ms_bind_vec(b, &L->router_bias, MS_W_VECTOR, W, 0, "%smlp.router.e_score_correction_bias", p);
        snprintf(g, sizeof g, "%smlp.experts.%%d.gate_proj", p);
        snprintf(u, sizeof u, "%smlp.experts.%%d.up_proj", p);
        snprintf(d, sizeof d, "%smlp.experts.%%d.down_proj", p);
        ms_bind_layer_experts(b, m, l, g, u, d);
    }
    return b->rc;
}

const ms_arch ms_arch_longcat_flash = {"longcat_flash", configure, bind};
