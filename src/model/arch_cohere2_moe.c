/* arch_cohere2_moe.c — Cohere Command A MoE (Cohere2MoeForCausalLM): Cohere2's parallel
 * block (x + attn(norm x) + ffn(norm x), one input_layernorm per layer: cfg
 * parallel_block), the norm a LayerNorm without bias (layer_norm_eps) or, when
 * rms_norm_eps is set, an RMSNorm; GQA (head_dim, q/k/v/o biases per attention_bias)
 * with interleaved RoPE on the sliding-window layers (and on the dense prefix layers
 * when prefix_dense_sliding_window_pattern is 1) and NoPE full layers; layer_types
 * (default: every sliding_window_pattern-th layer full), mlp_layer_types (dense layers
 * of prefix_dense_intermediate_size); the router mlp.gate takes the top-k logits
 * and weighs them by a softmax over the k (expert_selection_fn "softmax") or by
 * their sigmoids, renormalised per norm_topk_prob ("sigmoid"); experts of
 * intermediate_size (mlp.experts); shared experts mlp.shared_experts of
 * num_shared_experts x intermediate_size, added to the routed sum, the whole halved
 * for shared_expert_combination_strategy "average" (cfg moe_out_scale); logits times
 * logit_scale; embeddings tied by default. transformers: models/cohere2_moe. */
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t n_shared = 0, pattern = 4, prefix_pattern = 1, prefix_inter = 0, window = 4096;
    double ls = 0.0625, ln_eps = 1e-5;
    const char *comb = "average", *sel = "softmax";
    int rc, tie = 1;
    if ((rc = ms_json_int(j, "num_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "num_shared_experts", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_int(j, "sliding_window_pattern", 1, MS_MAX_LAYERS, &pattern, where, err)) ||
        (rc = ms_json_opt_int(j, "prefix_dense_sliding_window_pattern", 1, MS_MAX_LAYERS, &prefix_pattern, where, err)) ||
        (rc = ms_json_opt_int(j, "prefix_dense_intermediate_size", 1, INT32_MAX, &prefix_inter, where, err)) ||
        (rc = ms_json_opt_double(j, "logit_scale", &ls, where, err)) ||
        (rc = ms_json_opt_double(j, "layer_norm_eps", &ln_eps, where, err)) ||
        (rc = ms_json_opt_string(j, "shared_expert_combination_strategy", &comb, where, err)) ||
        (rc = ms_json_opt_string(j, "expert_selection_fn", &sel, where, err)) ||
        (rc = ms_json_opt_bool(j, "tie_word_embeddings", &tie, where, err)))
        return rc;
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    if (cJSON_IsNull(w)) window = 0;
    else if ((rc = ms_json_opt_int(j, "sliding_window", 1, INT32_MAX, &window, where, err))) return rc;
    if (strcmp(comb, "average") && strcmp(comb, "sum"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: shared_expert_combination_strategy \"%.32s\" is not supported (average, sum)",
                       where, comb);
    if (!strcmp(sel, "softmax")) c->router = MS_ROUTER_TOPK_SOFTMAX;
    else if (!strcmp(sel, "sigmoid")) c->router = MS_ROUTER_SIGMOID; /* the top-k logits are the top-k sigmoids */
    else return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: expert_selection_fn \"%.32s\" is not supported (softmax, sigmoid)", where, sel);
    if (c->inter < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing intermediate_size", where);
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(j, "rms_norm_eps");
    if (!re || cJSON_IsNull(re)) { /* Cohere2MoeLayerNorm: mean-centred, no bias */
        if (!(ln_eps > 0 && ln_eps < 1)) return ms_fail(err, MS_ERR_FORMAT, "%s: layer_norm_eps out of range", where);
        c->layernorm = 1;
        c->rms_eps = ln_eps;
    }
    c->tie_embeddings = tie; /* Cohere2MoeConfig: tied unless told otherwise */
    c->moe_inter = c->inter; /* Cohere2MoeExperts (MixtralExperts): intermediate_size */
    c->shared_inter = n_shared * c->inter;
    if (prefix_inter > 0) c->inter = prefix_inter;
    c->moe_out_scale = n_shared > 0 && !strcmp(comb, "average") ? 0.5 : 0;
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0;
    c->router_bias = 0;
    if (c->router == MS_ROUTER_TOPK_SOFTMAX) c->norm_topk_prob = 0;
    c->parallel_block = 1;
    c->logit_scale = ls;
    c->o_bias = c->attn_bias;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_INTERLEAVED, where, err))) return rc;
    if ((rc = ms_arch_mlp_layer_types(j, c, 0, where, err))) return rc;
    int n_prefix = 0; /* the leading dense layers (Cohere2MoeConfig's first_k_dense_replace) */
    while (n_prefix < c->n_layers && c->layer_mlp[n_prefix] == MS_MLP_DENSE) n_prefix++;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (lt && !cJSON_IsNull(lt) && (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers))
        return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types must be a list of num_hidden_layers names", where);
    const cJSON *lv = cJSON_IsArray(lt) ? lt->child : NULL;
    memset(&c->rope_alt, 0, sizeof c->rope_alt); /* NoPE layers: a RoPE of no rotary dims */
    c->rope_alt.layout = MS_ROPE_INTERLEAVED;
    for (int l = 0; l < c->n_layers; l++) {
        int sliding = l < n_prefix ? (l + 1) % prefix_pattern != 0 : (l - n_prefix + 1) % pattern != 0;
        if (lv) {
            if (cJSON_IsString(lv) && !strcmp(lv->valuestring, "sliding_attention")) sliding = 1;
            else if (cJSON_IsString(lv) && !strcmp(lv->valuestring, "full_attention")) sliding = 0;
            else return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types[%d] must be \"full_attention\" or \"sliding_attention\"",
                                where, l);
            lv = lv->next;
        }
        if (sliding && window < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: sliding_attention layers need sliding_window", where);
        int force_rope = c->layer_mlp[l] == MS_MLP_DENSE && prefix_pattern == 1;
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_window[l] = sliding ? (int32_t)window : 0;
        c->layer_rope[l] = !sliding && !force_rope;
    }
    return MS_OK;
}

static int attn(ms_binder *b, ms_model *m, int l, const char *p) {
    ms_layer *L = &m->layers[l];
    ms_bind_vec(b, &L->attn_norm, MS_W_NORM, b->cfg->hidden, 0, "%sinput_layernorm.weight", p);
    if (ms_bind_gqa(b, m, l, p) || !b->cfg->o_bias) return b->rc;
    return ms_bind_vec(b, &L->bo, MS_W_VECTOR, b->cfg->hidden, 0, "%sself_attn.o_proj.bias", p);
}

static int ffn(ms_binder *b, ms_model *m, int l, const char *p) {
    char w[160];
    if (b->cfg->layer_mlp[l] == MS_MLP_DENSE) return ms_bind_dense_mlp(b, m, l, p);
    snprintf(w, sizeof w, "%smlp.gate", p);
    ms_bind_router(b, m, l, w, NULL);
    ms_bind_shared_experts(b, m, l, p);
    snprintf(w, sizeof w, "%smlp.experts", p);
    return ms_bind_experts_at(b, m, l, w);
}

/* One norm per layer (input_layernorm), no post_attention_layernorm: its own loop. */
static int bind(ms_binder *b, ms_model *m) {
    char p[96];
    if (ms_bind_trunk(b, m, "model.embed_tokens", "model.norm.weight", "lm_head")) return b->rc;
    for (int l = 0; l < b->cfg->n_layers && !b->rc; l++) {
        snprintf(p, sizeof p, "model.layers.%d.", l);
        if (!attn(b, m, l, p)) ffn(b, m, l, p);
    }
    return b->rc;
}

const ms_arch ms_arch_cohere2_moe = {"cohere2_moe", configure, bind};
