/* arch_dbrx.c — DBRX (DbrxForCausalLM): LayerNorms without bias (cfg layernorm,
 * eps 1e-5, torch's default), GQA from one fused Wqkv [D + 2 KV hd, D] (bound as
 * three row views) clamped to [-clip_qkv, clip_qkv] (cfg clip_qkv),
 * rotate_half RoPE over head_dim = d_model / n_heads with attn_config.rope_theta,
 * softmax router top-k normalised by the p-norm of moe_normalize_expert_weights
 * (1: the sum; null: none; other p refused), experts stored as three
 * [E x ffn_hidden_size, D] parameters ffn.experts.mlp.w1 (gate), v1 (up), w2 (down,
 * transposed: bound as one transposed copy owned by the layer, as the published
 * Qwen3-VL layout is). The config's names (d_model, n_layers, n_heads,
 * max_seq_len, attn_config, ffn_config) are transformers' DbrxConfig's.
 * transformers: models/dbrx. The experts' transposed copy is resident: --expert-cache-mib
 * (streaming) does not take them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

const char *const ms_dbrx_key_aliases[] = {"hidden_size", "d_model", "num_hidden_layers", "n_layers",
                                        "num_attention_heads", "n_heads", "max_position_embeddings", "max_seq_len",
                                        NULL, NULL};

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    const cJSON *ac = cJSON_GetObjectItemCaseSensitive(j, "attn_config");
    const cJSON *fc = cJSON_GetObjectItemCaseSensitive(j, "ffn_config");
    if (!cJSON_IsObject(ac) || !cJSON_IsObject(fc))
        return ms_fail(err, MS_ERR_FORMAT, "%s: dbrx needs attn_config and ffn_config objects", where);
    int64_t kv = 1, ffn = 3584, experts = 4, top_k = 1;
    double theta = 10000.0, clip = 0, p = 1.0;
    int rc;
    const cJSON *cl = cJSON_GetObjectItemCaseSensitive(ac, "clip_qkv");
    const cJSON *pn = cJSON_GetObjectItemCaseSensitive(fc, "moe_normalize_expert_weights");
    if ((rc = ms_json_opt_int(ac, "kv_n_heads", 1, 65536, &kv, where, err)) ||
        (rc = ms_json_opt_double(ac, "rope_theta", &theta, where, err)) ||
        (cl && !cJSON_IsNull(cl) && (rc = ms_json_opt_double(ac, "clip_qkv", &clip, where, err))) ||
        (rc = ms_json_opt_int(fc, "ffn_hidden_size", 1, INT32_MAX, &ffn, where, err)) ||
        (rc = ms_json_opt_int(fc, "moe_num_experts", 1, 65536, &experts, where, err)) ||
        (rc = ms_json_opt_int(fc, "moe_top_k", 1, 4096, &top_k, where, err)) ||
        (pn && !cJSON_IsNull(pn) && (rc = ms_json_opt_double(fc, "moe_normalize_expert_weights", &p, where, err))))
        return rc;
    if (pn && cJSON_IsNull(pn)) p = 0;
    if (p != 0 && p != 1)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: moe_normalize_expert_weights %g is not supported (1 or null)", where, p);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(fc, "ffn_act_fn"), *an = NULL;
    if (cJSON_IsObject(act)) an = cJSON_GetObjectItemCaseSensitive(act, "name");
    if (an && (!cJSON_IsString(an) || strcmp(an->valuestring, "silu")))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: ffn_act_fn other than silu is not supported", where);
    if (clip < 0) return ms_fail(err, MS_ERR_FORMAT, "%s: clip_qkv must not be negative", where);
    if (c->n_heads < 1 || c->hidden % c->n_heads)
        return ms_fail(err, MS_ERR_FORMAT, "%s: d_model must be a multiple of n_heads", where);
    c->n_kv_heads = kv;
    c->head_dim = c->hidden / c->n_heads;
    c->inter = c->moe_inter = ffn;
    c->n_experts = experts;
    c->top_k = top_k;
    c->router = MS_ROUTER_SOFTMAX;
    c->norm_topk_prob = p == 1;
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0;
    c->layernorm = 1;
    c->rms_eps = 1e-5; /* nn.LayerNorm's default eps: DbrxConfig has no norm eps */
    c->clip_qkv = clip;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "rope_parameters")))
        rc = ms_config_rope(j, c, c->head_dim, MS_ROPE_HALF, where, err);
    else
        rc = ms_rope_parse(NULL, theta, c->max_pos, c->head_dim, MS_ROPE_HALF, &c->rope, where, err);
    if (rc) return rc;
    c->attn_scale = 1.0 / sqrt((double)c->head_dim);
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = MS_MLP_MOE;
    }
    return MS_OK;
}

/* Rows [r0, r0 + n) of a float view (F32, BF16, F16) as a view. */
static ms_qmat row_view(const ms_qmat *w, int64_t r0, int64_t n) {
    size_t es = (size_t)ms_dtype_bits(w->dtype) / 8;
    return (ms_qmat){.dtype = w->dtype, .rows = n, .cols = w->cols, .data = (const uint8_t *)w->data + (size_t)(r0 * w->cols) * es};
}

static int float_view(ms_binder *b, const ms_qmat *w, const char *what, int layer) {
    if (w->dtype == MS_DT_BF16 || w->dtype == MS_DT_F16 || w->dtype == MS_DT_F32) return MS_OK;
    return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "layer %d %s: dtype %s is not supported (F32, BF16, F16)", layer,
                           what, ms_dtype_name(w->dtype));
}

static int bind_experts(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[l];
    const int64_t E = c->n_experts, I = c->moe_inter, D = c->hidden;
    ms_qmat w1, v1, w2; /* nn.Parameters (no ".weight"), each [E * I, D] */
    const int64_t shape[2] = {E * I, D};
    ms_bind_tensor(b, &w1, MS_W_EXPERT, 2, shape, E * I, D, 0, "%sffn.experts.mlp.w1", p);
    ms_bind_tensor(b, &v1, MS_W_EXPERT, 2, shape, E * I, D, 0, "%sffn.experts.mlp.v1", p);
    ms_bind_tensor(b, &w2, MS_W_EXPERT, 2, shape, E * I, D, 0, "%sffn.experts.mlp.w2", p);
    if (b->rc || !b->ck) return b->rc;
    if (float_view(b, &w1, "experts w1", l) || float_view(b, &v1, "experts v1", l) || float_view(b, &w2, "experts w2", l))
        return b->rc;
    const size_t es = (size_t)ms_dtype_bits(w2.dtype) / 8;
    uint8_t *own = malloc((size_t)(E * I * D) * es);
    L->experts = calloc((size_t)E, sizeof *L->experts);
    if (!own || !L->experts) {
        free(own);
        return b->rc = ms_fail(b->err, MS_ERR_NOMEM, "out of memory transposing the experts of layer %d", l);
    }
    L->owned = own;
    const uint8_t *src = w2.data;
    for (int64_t e = 0; e < E; e++) /* w2 rows e*I..: [I, D] -> down [D, I] */
        for (int64_t i = 0; i < I; i++)
            for (int64_t d = 0; d < D; d++)
                memcpy(own + ((e * D + d) * I + i) * es, src + ((e * I + i) * D + d) * es, es);
    for (int64_t e = 0; e < E; e++) {
        ms_expert_view *v = &L->experts[e];
        v->gate = row_view(&w1, e * I, I);
        v->up = row_view(&v1, e * I, I);
        v->down = (ms_qmat){.dtype = w2.dtype, .rows = D, .cols = I, .data = own + (size_t)(e * D * I) * es};
    }
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) {
    const ms_config *c = b->cfg;
    const int64_t D = c->hidden, hd = c->head_dim, KV = c->n_kv_heads;
    ms_bind_trunk(b, m, "transformer.wte", "transformer.norm_f.weight", "lm_head");
    ms_bind_vec(b, &m->final_norm_b, MS_W_VECTOR, D, 1, "transformer.norm_f.bias");
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        char p[64], w[128];
        snprintf(p, sizeof p, "transformer.blocks.%d.", l);
        ms_layer *L = &m->layers[l];
        ms_bind_vec(b, &L->attn_norm, MS_W_NORM, D, 0, "%snorm_attn_norm.norm_1.weight", p);
        ms_bind_vec(b, &L->attn_norm_b, MS_W_VECTOR, D, 1, "%snorm_attn_norm.norm_1.bias", p);
        ms_bind_vec(b, &L->ffn_norm, MS_W_NORM, D, 0, "%snorm_attn_norm.norm_2.weight", p);
        ms_bind_vec(b, &L->ffn_norm_b, MS_W_VECTOR, D, 1, "%snorm_attn_norm.norm_2.bias", p);
        ms_qmat qkv;
        ms_bind_mat(b, &qkv, MS_W_MATRIX, D + 2 * KV * hd, D, "%snorm_attn_norm.attn.Wqkv", p);
        if (!b->rc && b->ck && !float_view(b, &qkv, "Wqkv", l)) {
            L->wq = row_view(&qkv, 0, D);
            L->wk = row_view(&qkv, D, KV * hd);
            L->wv = row_view(&qkv, D + KV * hd, KV * hd);
        }
        ms_bind_mat(b, &L->wo, MS_W_MATRIX, D, D, "%snorm_attn_norm.attn.out_proj", p);
        snprintf(w, sizeof w, "%sffn.router.layer", p);
        ms_bind_router(b, m, l, w, NULL);
        bind_experts(b, m, l, p);
    }
    return b->rc;
}

const ms_arch ms_arch_dbrx = {"dbrx", configure, bind};
