/* arch_softmax_gqa.c — two GQA families with softmax routers, each with its
 * own configure and bind over the shared blocks:
 *   hunyuan_v1_moe  Hunyuan-A13B: per-head q/k RMSNorm (query_layernorm /
 *                   key_layernorm) applied after RoPE (cfg qk_norm_after_rope),
 *                   softmax top-k renormalised, router mlp.gate.wg, a shared MLP
 *                   mlp.shared_mlp of intermediate_size x num_shared_expert on
 *                   every layer, experts of moe_intermediate_size (else
 *                   intermediate_size); per-layer lists (num_experts, moe_topk,
 *                   moe_intermediate_size, num_shared_expert) must be uniform;
 *                   RoPE "dynamic" with alpha: theta x alpha^(hd / (hd - 2)).
 *                   Cross-layer attention (use_cla) is refused.
 *                   transformers: models/hunyuan_v1_moe.
 *   ernie4_5_moe    ERNIE 4.5 MoE: interleaved RoPE (GLM style), softmax router
 *                   whose choice adds mlp.moe_statics.e_score_correction_bias
 *                   [1, E] (MS_ROUTER_SOFTMAX_BIAS), weights renormalised,
 *                   shared experts of moe_intermediate_size x
 *                   moe_num_shared_experts, MoE layers (l + 1) % moe_layer_interval
 *                   == 0 within [moe_layer_start_index, moe_layer_end_index],
 *                   tied embeddings by default. use_bias is refused.
 *                   transformers: models/ernie4_5_moe. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"
#include "core/qmat.h"

/* key: an integer, or a list of one integer repeated (per-layer values that must agree); *out
 * unchanged when absent or null. */
static int uniform_int(const cJSON *j, const char *key, int64_t lo, int64_t hi, int64_t *out, const char *where,
                       ms_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (!cJSON_IsArray(v)) return ms_json_opt_int(j, key, lo, hi, out, where, err);
    int64_t first = 0;
    int n = 0;
    for (const cJSON *e = v->child; e; e = e->next, n++) {
        if (!ms_json_is_int(e, lo, hi)) return ms_fail(err, MS_ERR_FORMAT, "%s: %s[%d] out of range", where, key, n);
        if (n && (int64_t)e->valuedouble != first)
            return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: %s differs between layers (not supported)", where, key);
        first = (int64_t)e->valuedouble;
    }
    if (!n) return ms_fail(err, MS_ERR_FORMAT, "%s: %s is an empty list", where, key);
    *out = first;
    return MS_OK;
}

static int configure_hunyuan(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t n_shared = 1;
    int cla = 0, rc;
    c->n_experts = 1;
    c->top_k = 1;
    c->moe_inter = c->inter; /* experts of intermediate_size unless moe_intermediate_size says otherwise */
    if ((rc = uniform_int(j, "num_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = uniform_int(j, "moe_topk", 1, 4096, &c->top_k, where, err)) ||
        (rc = uniform_int(j, "moe_intermediate_size", 1, INT32_MAX, &c->moe_inter, where, err)) ||
        (rc = uniform_int(j, "num_shared_expert", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_bool(j, "use_cla", &cla, where, err)))
        return rc;
    if (cla) return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: cross-layer attention (use_cla) is not supported", where);
    if (c->inter < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing intermediate_size", where);
    c->router = MS_ROUTER_SOFTMAX;
    c->norm_topk_prob = 1;
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0;
    c->qk_norm = MS_QKNORM_HEAD;
    c->qk_norm_after_rope = 1;
    c->o_bias = c->attn_bias;
    c->shared_inter = c->inter * (n_shared > 0 ? n_shared : 1); /* transformers' shared_mlp is always there */
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    double theta = 10000.0, alpha = 0;
    if ((rc = ms_json_opt_double(j, "rope_theta", &theta, where, err))) return rc;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (!cJSON_IsObject(rp)) rp = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (cJSON_IsObject(rp)) {
        if ((rc = ms_json_opt_double(rp, "rope_theta", &theta, where, err)) ||
            (rc = ms_json_opt_double(rp, "alpha", &alpha, where, err)))
            return rc;
    }
    if (alpha > 0) { /* DynamicNTKAlphaRotary: a larger base, computed once */
        if (c->head_dim < 4) return ms_fail(err, MS_ERR_FORMAT, "%s: head_dim too small for RoPE alpha", where);
        theta *= pow(alpha, (double)c->head_dim / (double)(c->head_dim - 2));
        rc = ms_rope_parse(NULL, theta, c->max_pos, c->head_dim, MS_ROPE_HALF, &c->rope, where, err);
    } else {
        rc = ms_config_rope(j, c, c->head_dim, MS_ROPE_HALF, where, err);
    }
    if (rc) return rc;
    c->attn_scale = 1.0 / sqrt((double)c->head_dim);
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = MS_MLP_MOE;
    }
    return MS_OK;
}

/* Hunyuan's attention: GQA with o_proj biased along with q/k/v, q/k norms named query_/key_layernorm. */
static int attn_hunyuan(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[l];
    ms_bind_mat(b, &L->wq, MS_W_MATRIX, c->n_heads * c->head_dim, c->hidden, "%sself_attn.q_proj", p);
    ms_bind_mat(b, &L->wk, MS_W_MATRIX, c->n_kv_heads * c->head_dim, c->hidden, "%sself_attn.k_proj", p);
    ms_bind_mat(b, &L->wv, MS_W_MATRIX, c->n_kv_heads * c->head_dim, c->hidden, "%sself_attn.v_proj", p);
    ms_bind_mat(b, &L->wo, MS_W_MATRIX, c->hidden, c->n_heads * c->head_dim, "%sself_attn.o_proj", p);
    if (c->attn_bias) {
        ms_bind_vec(b, &L->bq, MS_W_VECTOR, c->n_heads * c->head_dim, 0, "%sself_attn.q_proj.bias", p);
        ms_bind_vec(b, &L->bk, MS_W_VECTOR, c->n_kv_heads * c->head_dim, 0, "%sself_attn.k_proj.bias", p);
        ms_bind_vec(b, &L->bv, MS_W_VECTOR, c->n_kv_heads * c->head_dim, 0, "%sself_attn.v_proj.bias", p);
        ms_bind_vec(b, &L->bo, MS_W_VECTOR, c->hidden, 0, "%sself_attn.o_proj.bias", p);
    }
    ms_bind_vec(b, &L->q_norm, MS_W_NORM, c->head_dim, 0, "%sself_attn.query_layernorm.weight", p);
    ms_bind_vec(b, &L->k_norm, MS_W_NORM, c->head_dim, 0, "%sself_attn.key_layernorm.weight", p);
    return b->rc;
}

/* Router mlp.gate.wg, the shared MLP mlp.shared_mlp on every layer, experts mlp.experts. */
static int ffn_hunyuan(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    char w[160];
    snprintf(w, sizeof w, "%smlp.gate.wg", p);
    ms_bind_router(b, m, l, w, NULL);
    ms_bind_mlp(b, m, l, p, c->shared_inter, "mlp.shared_mlp.gate_proj", "mlp.shared_mlp.up_proj",
                "mlp.shared_mlp.down_proj");
    snprintf(w, sizeof w, "%smlp.experts", p);
    return ms_bind_experts_at(b, m, l, w);
}

static int bind_hunyuan(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, attn_hunyuan, ffn_hunyuan); }

static int configure_ernie(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t n_shared = 0, start = 1, end = -1, interval = 1;
    int use_bias = 0, rc;
    if ((rc = ms_json_int(j, "moe_num_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_int(j, "moe_k", 1, 4096, &c->top_k, where, err)) ||
        (rc = ms_json_opt_int(j, "moe_num_shared_experts", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_int(j, "moe_layer_start_index", 0, MS_MAX_LAYERS, &start, where, err)) ||
        (rc = ms_json_opt_int(j, "moe_layer_end_index", -1, MS_MAX_LAYERS, &end, where, err)) ||
        (rc = ms_json_opt_int(j, "moe_layer_interval", 1, MS_MAX_LAYERS, &interval, where, err)) ||
        (rc = ms_json_opt_bool(j, "use_bias", &use_bias, where, err)))
        return rc;
    if (use_bias) return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: use_bias (biased projections) is not supported", where);
    if (!cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings")) c->tie_embeddings = 1; /* the class default */
    if (end < 0) end = c->n_layers - 1;
    c->router = MS_ROUTER_SOFTMAX_BIAS;
    c->router_bias = 1;
    c->norm_topk_prob = 1; /* divided by max(sum, moe_norm_min): the sum of softmax scores is never that small */
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0;
    c->attn_bias = 0;
    c->shared_inter = n_shared * c->moe_inter;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_INTERLEAVED, where, err))) return rc;
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = ((l + 1) % interval == 0 && l >= start && l <= end) ? MS_MLP_MOE : MS_MLP_DENSE;
        if (c->layer_mlp[l] == MS_MLP_DENSE && c->inter < 1)
            return ms_fail(err, MS_ERR_FORMAT, "%s: dense layers need intermediate_size", where);
    }
    return MS_OK;
}

/* mlp.moe_statics.e_score_correction_bias [1, E] (or [E]) as an F32 copy. */
static int bind_ernie_bias(ms_binder *b, ms_layer *L, const char *pfx) {
    const ms_config *c = b->cfg;
    char name[160], full[300];
    snprintf(name, sizeof name, "%smlp.moe_statics.e_score_correction_bias", pfx);
    snprintf(full, sizeof full, "%s%s", b->prefix, name);
    const ms_tensor *t = b->ck ? ms_checkpoint_find(b->ck, full) : NULL;
    if (t && t->ndim == 1) return ms_bind_vec(b, &L->router_bias, MS_W_VECTOR, c->n_experts, 0, "%s", name);
    ms_qmat v;
    const int64_t shape[2] = {1, c->n_experts};
    if (ms_bind_tensor(b, &v, MS_W_VECTOR, 2, shape, 1, c->n_experts, 0, "%s", name) || !b->ck) return b->rc;
    L->router_bias = ms_bind_alloc(b, (size_t)c->n_experts * sizeof *L->router_bias);
    if (!L->router_bias) return b->rc;
    ms_to_f32(L->router_bias, v.data, v.dtype, c->n_experts);
    return MS_OK;
}

static int ffn_ernie(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    char w[160];
    if (c->layer_mlp[l] == MS_MLP_DENSE) return ms_bind_dense_mlp(b, m, l, p);
    snprintf(w, sizeof w, "%smlp.gate", p);
    ms_bind_router(b, m, l, w, NULL);
    bind_ernie_bias(b, &m->layers[l], p);
    ms_bind_shared_experts(b, m, l, p);
    snprintf(w, sizeof w, "%smlp.experts", p);
    return ms_bind_experts_at(b, m, l, w);
}

static int bind_ernie(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_gqa, ffn_ernie); }

const ms_arch ms_arch_hunyuan_v1_moe = {"hunyuan_v1_moe", configure_hunyuan, bind_hunyuan};
const ms_arch ms_arch_ernie4_5_moe = {"ernie4_5_moe", configure_ernie, bind_ernie};
