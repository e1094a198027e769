/* arch_afmoe.c — Arcee AFMoE (AfmoeForCausalLM: Trinity): GQA with per-head q/k
 * RMSNorm, an output gate of its own (att *= sigmoid(self_attn.gate_proj x), cfg
 * attn_gate_proj), sliding-window layers with RoPE and NoPE full layers (layer_types,
 * default every global_attn_every_n_layers-th layer full), norms before and after
 * each sublayer (input_layernorm / post_attention_layernorm, pre_mlp_layernorm /
 * post_mlp_layernorm: cfg post_norm with the input norms kept), num_dense_layers
 * dense layers, then MoE: sigmoid scores, top-k of scores + mlp.expert_bias, weights
 * the scores renormalised (+ 1e-20) times route_scale, shared experts of
 * num_shared_experts x moe_intermediate_size, router mlp.router.gate; mup_enabled
 * scales the embeddings by sqrt(hidden_size). transformers: models/afmoe. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t n_dense = 1, n_shared = 2, every = 4, window = 1024;
    double scale = 1.0;
    int mup = 0, rc;
    if ((rc = ms_json_int(j, "num_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "num_dense_layers", 0, MS_MAX_LAYERS, &n_dense, where, err)) ||
        (rc = ms_json_opt_int(j, "num_shared_experts", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_int(j, "global_attn_every_n_layers", 1, MS_MAX_LAYERS, &every, where, err)) ||
        (rc = ms_json_opt_double(j, "route_scale", &scale, where, err)) ||
        (rc = ms_json_opt_bool(j, "mup_enabled", &mup, where, err)))
        return rc;
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    if (cJSON_IsNull(w)) window = 0;
    else if ((rc = ms_json_opt_int(j, "sliding_window", 1, INT32_MAX, &window, where, err))) return rc;
    c->router = MS_ROUTER_SIGMOID;
    c->router_bias = 1;
    c->n_group = c->topk_group = 1;
    c->norm_topk_prob = 1;
    c->routed_scale = scale;
    c->shared_inter = n_shared * c->moe_inter;
    c->qk_norm = MS_QKNORM_HEAD;
    c->attn_gate_proj = 1;
    c->post_norm = 1;
    if (mup) c->embed_scale = sqrt((double)c->hidden);
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_HALF, where, err))) return rc;
    if ((rc = ms_arch_mlp_layer_types(j, c, n_dense, where, err))) return rc;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (lt && !cJSON_IsNull(lt) && (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers))
        return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types must be a list of num_hidden_layers names", where);
    const cJSON *lv = cJSON_IsArray(lt) ? lt->child : NULL;
    memset(&c->rope_alt, 0, sizeof c->rope_alt); /* the full layers are NoPE: a RoPE of no rotary dims */
    c->rope_alt.layout = MS_ROPE_HALF;
    for (int l = 0; l < c->n_layers; l++) {
        int sliding = (l + 1) % every != 0; /* AfmoeConfig's default schedule */
        if (lv) {
            if (cJSON_IsString(lv) && !strcmp(lv->valuestring, "sliding_attention")) sliding = 1;
            else if (cJSON_IsString(lv) && !strcmp(lv->valuestring, "full_attention")) sliding = 0;
            else return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types[%d] must be \"full_attention\" or \"sliding_attention\"",
                                where, l);
            lv = lv->next;
        }
        if (sliding && window < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: sliding_attention layers need sliding_window", where);
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_window[l] = sliding ? (int32_t)window : 0;
        c->layer_rope[l] = !sliding;
    }
    return MS_OK;
}

/* The four norms, GQA with q/k norms and the output gate, the FFN. */
static int attn(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[l];
    ms_bind_vec(b, &L->attn_post_norm, MS_W_NORM, c->hidden, 0, "%spost_attention_layernorm.weight", p);
    ms_bind_vec(b, &L->ffn_post_norm, MS_W_NORM, c->hidden, 0, "%spost_mlp_layernorm.weight", p);
    ms_bind_mat(b, &L->mla_gate, MS_W_MATRIX, c->n_heads * c->head_dim, c->hidden, "%sself_attn.gate_proj", p);
    return ms_bind_gqa(b, m, l, p);
}

static int ffn(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    char w[160], bias[160];
    if (c->layer_mlp[l] == MS_MLP_DENSE) return ms_bind_dense_mlp(b, m, l, p);
    snprintf(w, sizeof w, "%smlp.router.gate", p);
    snprintf(bias, sizeof bias, "%smlp.expert_bias", p);
    ms_bind_router(b, m, l, w, bias);
    ms_bind_shared_experts(b, m, l, p);
    snprintf(w, sizeof w, "%smlp.experts", p);
    return ms_bind_experts_at(b, m, l, w);
}

/* input_layernorm and pre_mlp_layernorm are the input norms (ms_layer attn_norm / ffn_norm). */
static int bind(ms_binder *b, ms_model *m) {
    const ms_config *c = b->cfg;
    char p[96];
    if (ms_bind_trunk(b, m, "model.embed_tokens", "model.norm.weight", "lm_head")) return b->rc;
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        ms_layer *L = &m->layers[l];
        snprintf(p, sizeof p, "model.layers.%d.", l);
        ms_bind_vec(b, &L->attn_norm, MS_W_NORM, c->hidden, 0, "%sinput_layernorm.weight", p);
        ms_bind_vec(b, &L->ffn_norm, MS_W_NORM, c->hidden, 0, "%spre_mlp_layernorm.weight", p);
        if (!attn(b, m, l, p)) ffn(b, m, l, p);
    }
    return b->rc;
}

const ms_arch ms_arch_afmoe = {"afmoe", configure, bind};
