/* arch_deepseek_v4.c — DeepSeek-V4: compressed attention per layer_types
 * (sliding_attention; compressed_sparse_attention: overlapping windows picked
 * by a lightning indexer; heavily_compressed_attention: plain windows), shared
 * K=V MQA with attention sinks, partial interleaved RoPE on the trailing dims,
 * grouped low-rank output projection; MoE with sqrt-softplus routing or, on
 * "hash_moe" layers, a frozen token-id -> experts table; clamped SwiGLU; hc_mult
 * residual streams (mHC) collapsed by a learned hyper head.
 * The checkpoint uses DeepSeek's own names (attn.wq_a, ffn.experts.N.w1, ...).
 * transformers: models/deepseek_v4/modeling_deepseek_v4.py. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

static int names(const cJSON *j, const char *key, const char *const *opts, int nopt, uint8_t *out, int n,
                 const char *where, ms_err *err) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != n)
        return ms_fail(err, MS_ERR_FORMAT, "%s: %s must be a list of num_hidden_layers (%d) names", where, key, n);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        int k = -1;
        for (int o = 0; o < nopt && k < 0; o++)
            if (cJSON_IsString(v) && !strcmp(v->valuestring, opts[o])) k = o;
        if (k < 0) return ms_fail(err, MS_ERR_FORMAT, "%s: %s[%d] is not a supported layer type", where, key, i);
        out[i++] = (uint8_t)k;
    }
    return MS_OK;
}

static int rope_of(const cJSON *j, const char *kind, ms_config *c, ms_rope *r, const char *where, ms_err *err) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const cJSON *sub = rp ? cJSON_GetObjectItemCaseSensitive(rp, kind) : NULL;
    if (!cJSON_IsObject(sub)) return ms_fail(err, MS_ERR_FORMAT, "%s: rope_parameters.%s is missing", where, kind);
    double prf = 1.0;
    int rc = ms_json_opt_double(sub, "partial_rotary_factor", &prf, where, err);
    if (rc) return rc;
    if (!(prf > 0 && prf <= 1))
        return ms_fail(err, MS_ERR_FORMAT, "%s: rope_parameters.%s.partial_rotary_factor %g must be in (0, 1]", where,
                       kind, prf);
    int64_t dim = (int64_t)((double)c->head_dim * prf);
    return ms_rope_parse(sub, 10000.0, c->max_pos, dim, MS_ROPE_INTERLEAVED, r, where, err);
}

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t n_shared = 1, win = 0, csa_rate = 4, hca_rate = 128;
    const char *act = "silu", *score = "sqrtsoftplus";
    int rc;
    c->hc_mult = 4, c->hc_sinkhorn_iters = 20, c->hc_eps = 1e-6, c->act_limit = 10.0;
    const cJSON *rates = cJSON_GetObjectItemCaseSensitive(j, "compress_rates");
    if (rates && ((rc = ms_json_opt_int(rates, "compressed_sparse_attention", 1, 1 << 16, &csa_rate, where, err)) ||
                  (rc = ms_json_opt_int(rates, "heavily_compressed_attention", 1, 1 << 16, &hca_rate, where, err))))
        return rc;
    if ((rc = ms_json_int(j, "q_lora_rank", 1, 1 << 20, &c->q_lora_rank, where, err)) ||
        (rc = ms_json_int(j, "o_groups", 1, 1 << 12, &c->o_groups, where, err)) ||
        (rc = ms_json_int(j, "o_lora_rank", 1, 1 << 20, &c->o_lora_rank, where, err)) ||
        (rc = ms_json_int(j, "sliding_window", 1, 1 << 20, &win, where, err)) ||
        (rc = ms_json_int(j, "n_routed_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "n_shared_experts", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_int(j, "index_n_heads", 1, 1024, &c->dsa_heads, where, err)) ||
        (rc = ms_json_opt_int(j, "index_head_dim", 2, 4096, &c->dsa_head_dim, where, err)) ||
        (rc = ms_json_opt_int(j, "index_topk", 1, 1 << 20, &c->dsa_topk, where, err)) ||
        (rc = ms_json_opt_int(j, "hc_mult", 1, 64, &c->hc_mult, where, err)) ||
        (rc = ms_json_opt_int(j, "hc_sinkhorn_iters", 1, 1000, &c->hc_sinkhorn_iters, where, err)) ||
        (rc = ms_json_opt_double(j, "hc_eps", &c->hc_eps, where, err)) ||
        (rc = ms_json_opt_double(j, "swiglu_limit", &c->act_limit, where, err)) ||
        (rc = ms_json_opt_string(j, "scoring_func", &score, where, err)) ||
        (rc = ms_json_opt_string(j, "hidden_act", &act, where, err)))
        return rc;
    if (strcmp(act, "silu"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu)", where, act);
    if (strcmp(score, "sqrtsoftplus"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: scoring_func \"%s\" is not supported (sqrtsoftplus)", where, score);
    if (c->n_heads < 1 || c->head_dim < 2) return ms_fail(err, MS_ERR_FORMAT, "%s: missing num_attention_heads or head_dim", where);
    if (c->n_kv_heads > 1) return ms_fail(err, MS_ERR_FORMAT, "%s: num_key_value_heads must be 1 (shared K=V)", where);
    if ((c->n_heads * c->head_dim) % c->o_groups)
        return ms_fail(err, MS_ERR_FORMAT, "%s: o_groups %lld must divide num_attention_heads * head_dim", where,
                       (long long)c->o_groups);
    if (csa_rate > 255 || hca_rate > 255)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: compress rates above 255 are not supported", where);
    if (!(c->hc_eps >= 0) || !(c->act_limit >= 0))
        return ms_fail(err, MS_ERR_FORMAT, "%s: hc_eps and swiglu_limit must be >= 0", where);
    int n = (int)c->n_layers;
    static const char *const attn_types[] = {"sliding_attention", "compressed_sparse_attention",
                                             "heavily_compressed_attention"};
    static const char *const mlp_types[] = {"moe", "hash_moe"};
    uint8_t at[MS_MAX_LAYERS];
    if ((rc = names(j, "layer_types", attn_types, 3, at, n, where, err)) ||
        (rc = names(j, "mlp_layer_types", mlp_types, 2, c->layer_hash, n, where, err)))
        return rc;
    int any_csa = 0;
    for (int l = 0; l < n; l++) {
        c->layer_attn[l] = MS_ATTN_COMPRESSED;
        c->layer_mlp[l] = MS_MLP_MOE;
        c->layer_window[l] = (int32_t)win;
        c->layer_sinks[l] = 1;
        c->layer_csa[l] = at[l] == 1;
        c->layer_compress[l] = (uint8_t)(at[l] == 1 ? csa_rate : at[l] == 2 ? hca_rate : 0);
        c->layer_rope[l] = at[l] == 0; /* sliding-only layers: the "main" RoPE (rope_alt) */
        any_csa |= at[l] == 1;
    }
    if (any_csa && (c->dsa_heads < 1 || c->dsa_head_dim < 2 || c->dsa_topk < 1))
        return ms_fail(err, MS_ERR_FORMAT, "%s: compressed_sparse_attention needs index_n_heads, index_head_dim, "
                       "index_topk", where);
    c->router = MS_ROUTER_SQRTSOFTPLUS;
    c->shared_inter = n_shared * c->moe_inter;
    c->hc_head_weighted = 1;
    if ((rc = ms_arch_check_moe(c, where, err))) return rc;
    if ((rc = rope_of(j, "compress", c, &c->rope, where, err)) || (rc = rope_of(j, "main", c, &c->rope_alt, where, err)))
        return rc;
    if (c->rope.dim > c->head_dim || (any_csa && c->rope.dim > c->dsa_head_dim))
        return ms_fail(err, MS_ERR_FORMAT, "%s: rotary dims exceed the head dims", where);
    c->qk_rope_dim = c->rope.dim;
    c->attn_scale = 1.0 / sqrt((double)c->head_dim);
    return MS_OK;
}

static void bind_hc(ms_binder *b, const ms_config *c, ms_qmat *fn, float **base, float **scale, const char *p,
                    const char *site) {
    int64_t mix = (2 + c->hc_mult) * c->hc_mult;
    const int64_t fs[2] = {mix, c->hc_mult * c->hidden};
    ms_bind_tensor(b, fn, MS_W_MATRIX, 2, fs, mix, c->hc_mult * c->hidden, 0, "%shc_%s_fn", p, site);
    ms_bind_vec(b, base, MS_W_VECTOR, mix, 0, "%shc_%s_base", p, site);
    ms_bind_vec(b, scale, MS_W_VECTOR, 3, 0, "%shc_%s_scale", p, site);
}

/* A 2-D tensor as an F32 copy the model owns. */
static void bind_f32_2d(ms_binder *b, float **out, int64_t rows, int64_t cols, const char *name) {
    ms_qmat v = {0};
    const int64_t shape[2] = {rows, cols};
    *out = NULL;
    if (ms_bind_tensor(b, &v, MS_W_VECTOR, 2, shape, rows, cols, 0, "%s", name) || !b->ck) return;
    *out = ms_bind_alloc(b, (size_t)(rows * cols) * sizeof(float));
    if (*out) ms_to_f32(*out, v.data, v.dtype, rows * cols);
}

static void bind_comp(ms_binder *b, ms_compressor_weights *w, int rate, int64_t dim, int overlap, const char *p) {
    const ms_config *c = b->cfg;
    int64_t wd = (overlap ? 2 : 1) * dim;
    char name[200];
    ms_bind_mat(b, &w->wkv, MS_W_MATRIX, wd, c->hidden, "%swkv", p);
    ms_bind_mat(b, &w->wgate, MS_W_MATRIX, wd, c->hidden, "%swgate", p);
    snprintf(name, sizeof name, "%sape", p);
    bind_f32_2d(b, &w->ape, rate, wd, name);
    ms_bind_vec(b, &w->norm, MS_W_NORM, dim, 0, "%snorm.weight", p);
}

/* tid2eid [vocab, top_k] I64 (or I32) → int32 copy, every id checked. Load mode only. */
static void bind_hash(ms_binder *b, ms_layer *L, const char *p) {
    const ms_config *c = b->cfg;
    if (b->rc || !b->ck) return;
    char name[200];
    snprintf(name, sizeof name, "%s%sffn.gate.tid2eid", b->prefix, p);
    const ms_tensor *t = ms_checkpoint_find(b->ck, name);
    if (!t) {
        b->rc = ms_fail(b->err, MS_ERR_FORMAT, "tensor \"%s\" is missing (hash-routed layer)", name);
        return;
    }
    if (t->ndim != 2 || t->shape[0] != c->vocab || t->shape[1] != c->top_k ||
        (t->dtype != MS_DT_I64 && t->dtype != MS_DT_I32) || !t->data) {
        b->rc = ms_fail(b->err, MS_ERR_FORMAT, "tensor \"%s\": expected I64 [%lld, %lld]", name, (long long)c->vocab,
                        (long long)c->top_k);
        return;
    }
    int64_t n = c->vocab * c->top_k;
    L->hash_ids = ms_bind_alloc(b, (size_t)n * sizeof(int32_t));
    if (!L->hash_ids) return;
    for (int64_t i = 0; i < n; i++) {
        int64_t v;
        if (t->dtype == MS_DT_I64) memcpy(&v, (const char *)t->data + 8 * i, 8);
        else {
            int32_t v32;
            memcpy(&v32, (const char *)t->data + 4 * i, 4);
            v = v32;
        }
        if (v < 0 || v >= c->n_experts) {
            b->rc = ms_fail(b->err, MS_ERR_FORMAT, "tensor \"%s\": expert id %lld at %lld is out of range [0, %lld)",
                            name, (long long)v, (long long)i, (long long)c->n_experts);
            return;
        }
        L->hash_ids[i] = (int32_t)v;
    }
}

static int bind(ms_binder *b, ms_model *m) {
    const ms_config *c = b->cfg;
    ms_bind_trunk(b, m, "model.embed_tokens", "model.norm.weight", "head");
    if (c->hc_mult > 1) {
        const int64_t fs[2] = {c->hc_mult, c->hc_mult * c->hidden};
        ms_bind_tensor(b, &m->hc_head_fn, MS_W_MATRIX, 2, fs, c->hc_mult, c->hc_mult * c->hidden, 0,
                       "model.hc_head.hc_fn");
        ms_bind_vec(b, &m->hc_head_base, MS_W_VECTOR, c->hc_mult, 0, "model.hc_head.hc_base");
        ms_bind_vec(b, &m->hc_head_scale, MS_W_VECTOR, 1, 0, "model.hc_head.hc_scale");
    }
    int64_t H = c->n_heads, hd = c->head_dim, G = c->o_groups, R = c->o_lora_rank;
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        char p[64], a[128];
        snprintf(p, sizeof p, "model.layers.%d.", l);
        ms_layer *L = &m->layers[l];
        ms_bind_vec(b, &L->attn_norm, MS_W_NORM, c->hidden, 0, "%sattn_norm.weight", p);
        ms_bind_vec(b, &L->ffn_norm, MS_W_NORM, c->hidden, 0, "%sffn_norm.weight", p);
        if (c->hc_mult > 1) {
            bind_hc(b, c, &L->hc_attn_fn, &L->hc_attn_base, &L->hc_attn_scale, p, "attn");
            bind_hc(b, c, &L->hc_ffn_fn, &L->hc_ffn_base, &L->hc_ffn_scale, p, "ffn");
        }
        ms_bind_mat(b, &L->q_a, MS_W_MATRIX, c->q_lora_rank, c->hidden, "%sattn.wq_a", p);
        ms_bind_vec(b, &L->q_a_norm, MS_W_NORM, c->q_lora_rank, 0, "%sattn.q_norm.weight", p);
        ms_bind_mat(b, &L->q_b, MS_W_MATRIX, H * hd, c->q_lora_rank, "%sattn.wq_b", p);
        ms_bind_mat(b, &L->ca.wkv, MS_W_MATRIX, hd, c->hidden, "%sattn.wkv", p);
        ms_bind_vec(b, &L->ca.kv_norm, MS_W_NORM, hd, 0, "%sattn.norm.weight", p);
        ms_bind_mat(b, &L->ca.wo_a, MS_W_MATRIX, G * R, H * hd / G, "%sattn.wo_a", p);
        ms_bind_mat(b, &L->ca.wo_b, MS_W_MATRIX, c->hidden, G * R, "%sattn.wo_b", p);
        ms_bind_vec(b, &L->sinks, MS_W_VECTOR, H, 0, "%sattn.attn_sink", p);
        int rate = c->layer_compress[l];
        if (rate) {
            snprintf(a, sizeof a, "%sattn.compressor.", p);
            bind_comp(b, &L->ca.comp, rate, hd, c->layer_csa[l], a);
        }
        if (c->layer_csa[l]) {
            snprintf(a, sizeof a, "%sattn.indexer.compressor.", p);
            bind_comp(b, &L->ca.icomp, rate, c->dsa_head_dim, 1, a);
            ms_bind_mat(b, &L->ca.iwq_b, MS_W_MATRIX, c->dsa_heads * c->dsa_head_dim, c->q_lora_rank,
                        "%sattn.indexer.wq_b", p);
            ms_bind_mat(b, &L->ca.iweights, MS_W_MATRIX, c->dsa_heads, c->hidden, "%sattn.indexer.weights_proj", p);
        }
        char w[96], bias[96];
        snprintf(w, sizeof w, "%sffn.gate", p);
        snprintf(bias, sizeof bias, "%sffn.gate.bias", p);
        ms_bind_router(b, m, l, w, c->layer_hash[l] ? NULL : bias);
        if (c->layer_hash[l]) bind_hash(b, L, p);
        if (c->shared_inter)
            ms_bind_mlp(b, m, l, p, c->shared_inter, "ffn.shared_experts.w1", "ffn.shared_experts.w3",
                        "ffn.shared_experts.w2");
        ms_bind_experts(b, m, l, "model.layers.%d.ffn.experts.%d.w1", "model.layers.%d.ffn.experts.%d.w3",
                        "model.layers.%d.ffn.experts.%d.w2");
    }
    return b->rc;
}

const ms_arch ms_arch_deepseek_v4 = {"deepseek_v4", configure, bind};
