/* arch_phimoe.c — Phi-3.5-MoE (PhimoeForCausalLM): LayerNorms with bias (cfg
 * layernorm, eps rms_norm_eps), Llama attention with q/k/v/o biases per
 * attention_bias and head_dim = hidden / heads, rotate_half RoPE, an optional
 * sliding window on every layer, top-2 sparsemixer routing in its inference form
 * (MS_ROUTER_SPARSEMIXER, jitter router_jitter_noise), Mixtral's experts of
 * intermediate_size (w1 gate, w3 up, w2 down) and an optional lm_head bias
 * (lm_head_bias). Tensor names as transformers 5 saves them
 * (mlp.router, mlp.experts.E.w1) or as the published checkpoint has them
 * (block_sparse_moe.gate, block_sparse_moe.experts.E.w1), or fused
 * (mlp.experts.gate_up_proj / down_proj, ms_bind_fused_experts). RoPE scaling other
 * than YaRN (the published "longrope") is refused by the RoPE parser by name.
 * transformers: models/phimoe. */
#include <stdio.h>

#include "model/arch_common.h"
#include "model/model.h"

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int rc, lm_bias = 0, attn_bias = 1;
    double jitter = 0.01;
    int64_t window = 0;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    if ((rc = ms_json_int(j, "num_local_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_double(j, "router_jitter_noise", &jitter, where, err)) ||
        (rc = ms_json_opt_bool(j, "lm_head_bias", &lm_bias, where, err)) ||
        (rc = ms_json_opt_bool(j, "attention_bias", &attn_bias, where, err)) ||
        (sw && !cJSON_IsNull(sw) && (rc = ms_json_opt_int(j, "sliding_window", 0, INT32_MAX, &window, where, err))))
        return rc;
    if (c->top_k != 2)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: sparsemixer routing takes num_experts_per_tok 2, not %lld", where,
                       (long long)c->top_k);
    if (!(jitter >= 0)) return ms_fail(err, MS_ERR_FORMAT, "%s: router_jitter_noise must not be negative", where);
    if (c->n_heads < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing num_attention_heads", where);
    if (!cJSON_GetObjectItemCaseSensitive(j, "head_dim")) c->head_dim = c->hidden / c->n_heads;
    c->moe_inter = c->inter;
    c->router = MS_ROUTER_SPARSEMIXER;
    c->router_jitter = jitter;
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0;
    c->layernorm = 1;
    c->attn_bias = attn_bias;
    c->o_bias = attn_bias;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_HALF, where, err))) return rc;
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = MS_MLP_MOE;
        c->layer_window[l] = (int32_t)window;
    }
    (void)lm_bias; /* the bias is bound when the checkpoint has it (lm_head.bias) */
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) {
    const ms_config *c = b->cfg;
    ms_bind_trunk(b, m, "model.embed_tokens", "model.norm.weight", "lm_head");
    ms_bind_vec(b, &m->final_norm_b, MS_W_VECTOR, c->hidden, 1, "model.norm.bias");
    ms_bind_vec(b, &m->lm_head_b, MS_W_VECTOR, c->vocab, 1, "lm_head.bias");
    int published = ms_bind_has(b, "model.layers.0.block_sparse_moe.gate.weight");
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        char p[64], w[96], g[128], u[128], d[128];
        snprintf(p, sizeof p, "model.layers.%d.", l);
        ms_layer *L = &m->layers[l];
        ms_bind_layer_norms(b, m, l, p);
        ms_bind_vec(b, &L->attn_norm_b, MS_W_VECTOR, c->hidden, 1, "%sinput_layernorm.bias", p);
        ms_bind_vec(b, &L->ffn_norm_b, MS_W_VECTOR, c->hidden, 1, "%spost_attention_layernorm.bias", p);
        ms_bind_gqa(b, m, l, p);
        if (c->o_bias) ms_bind_vec(b, &L->bo, MS_W_VECTOR, c->hidden, 0, "%sself_attn.o_proj.bias", p);
        const char *moe = published ? "block_sparse_moe" : "mlp";
        snprintf(w, sizeof w, "%s%s.%s", p, moe, published ? "gate" : "router");
        ms_bind_router(b, m, l, w, NULL);
        if (!published && !ms_bind_has(b, "%smlp.experts.0.w1.weight", p) && ms_bind_has(b, "%smlp.experts.gate_up_proj", p)) {
            snprintf(g, sizeof g, "%smlp.experts.gate_up_proj", p); /* fused, as transformers 5 may save them */
            snprintf(d, sizeof d, "%smlp.experts.down_proj", p);
            ms_bind_fused_experts(b, m, l, g, d);
            continue;
        }
        snprintf(g, sizeof g, "%s%s.experts.%%d.w1", p, moe);
        snprintf(u, sizeof u, "%s%s.experts.%%d.w3", p, moe);
        snprintf(d, sizeof d, "%s%s.experts.%%d.w2", p, moe);
        ms_bind_layer_experts(b, m, l, g, u, d);
    }
    return b->rc;
}

const ms_arch ms_arch_phimoe = {"phimoe", configure, bind};
