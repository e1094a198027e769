/* attention.c — GQA (standard KV cache) and MLA (compressed latent cache,
 * absorbed form) attention sublayers. Both are causal over the sequence's
 * cache; heads are split across the pool. */
#include <math.h>
#include <string.h>

#include "engine/engine_internal.h"

static float dot(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static float *thread_buf(ms_engine *e, int tid) { return e->th_buf + (size_t)tid * e->th_stride; }

/* ---------------- GQA ---------------- */

typedef struct {
    ms_engine *e;
    int layer, n;
} attn_job;

static void gqa_head(void *ctx, int h, int tid) {
    attn_job *j = ctx;
    ms_engine *e = j->e;
    const ms_config *c = &e->m->cfg;
    int64_t hd = c->head_dim, KV = c->n_kv_heads, H = c->n_heads;
    int64_t kvh = h / (H / KV), kd = KV * hd;
    const float *K = e->k_cache[j->layer], *V = e->v_cache[j->layer];
    float *sc = thread_buf(e, tid);
    float scale = (float)c->attn_scale;
    for (int t = 0; t < j->n; t++) {
        int64_t p = e->n_past + t;
        const float *qv = e->q + ((int64_t)t * H + h) * hd;
        for (int64_t s = 0; s <= p; s++) sc[s] = dot(qv, K + s * kd + kvh * hd, hd) * scale;
        ms_softmax(sc, (int)(p + 1));
        float *o = e->att + ((int64_t)t * H + h) * hd;
        memset(o, 0, (size_t)hd * sizeof *o);
        for (int64_t s = 0; s <= p; s++) {
            const float *vv = V + s * kd + kvh * hd;
            float w = sc[s];
            for (int64_t i = 0; i < hd; i++) o[i] += w * vv[i];
        }
    }
}

static void add_bias(float *y, const float *b, int n, int64_t d) {
    if (!b) return;
    for (int t = 0; t < n; t++)
        for (int64_t i = 0; i < d; i++) y[t * d + i] += b[i];
}

int ms_attn_gqa(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->m->layers[layer];
    int64_t H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, qd = H * hd, kd = KV * hd;
    float *q = e->q, *k = e->kv, *v = e->kv + (int64_t)n * kd;
    ms_matmul(e->pool, q, e->xn, n, &L->wq);
    ms_matmul(e->pool, k, e->xn, n, &L->wk);
    ms_matmul(e->pool, v, e->xn, n, &L->wv);
    add_bias(q, L->bq, n, qd);
    add_bias(k, L->bk, n, kd);
    add_bias(v, L->bv, n, kd);
    float eps = (float)c->rms_eps;
    if (c->qk_norm == MS_QKNORM_HEAD) {
        ms_rmsnorm(q, q, L->q_norm, (int)(n * H), (int)hd, eps);
        ms_rmsnorm(k, k, L->k_norm, (int)(n * KV), (int)hd, eps);
    } else if (c->qk_norm == MS_QKNORM_FULL) {
        ms_rmsnorm(q, q, L->q_norm, n, (int)qd, eps);
        ms_rmsnorm(k, k, L->k_norm, n, (int)kd, eps);
    }
    float cs[512], sn[512];
    for (int t = 0; t < n; t++) {
        int64_t p = e->n_past + t;
        ms_rope_cos_sin(&c->rope, p, cs, sn);
        for (int64_t h = 0; h < H; h++) ms_rope_apply(&c->rope, q + t * qd + h * hd, cs, sn);
        for (int64_t h = 0; h < KV; h++) ms_rope_apply(&c->rope, k + t * kd + h * hd, cs, sn);
        memcpy(e->k_cache[layer] + p * kd, k + t * kd, (size_t)kd * 4);
        memcpy(e->v_cache[layer] + p * kd, v + t * kd, (size_t)kd * 4);
    }
    attn_job j = {e, layer, n};
    ms_pool_run(e->pool, (int)H, gqa_head, &j);
    ms_matmul(e->pool, out, e->att, n, &L->wo);
    return MS_OK;
}

/* ---------------- MLA (absorbed) ----------------
 * kv_b rows for head h: [h*(nope+v), h*(nope+v)+nope) are W_UK (k_nope = W_UK c),
 * the next v rows are W_UV (v = W_UV c). Scores use q_lat = W_UKᵀ q_nope against
 * the cached normalized latent c; the output is W_UV (Σ p c). Mathematically
 * equal to transformers' expanded form (DeepseekV3Attention.forward). */

static void mla_head(void *ctx, int h, int tid) {
    attn_job *j = ctx;
    ms_engine *e = j->e;
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->m->layers[j->layer];
    int64_t lora = c->kv_lora_rank, rope = c->qk_rope_dim, nope = c->qk_nope_dim, vd = c->v_head_dim;
    int64_t qk = nope + rope, lw = lora + rope, H = c->n_heads, n = j->n;
    float *sc = thread_buf(e, tid);
    float *qlat = sc + e->max_ctx;            /* [n, lora]: q_lat, then o_lat */
    float *row = qlat + (int64_t)e->max_batch * lora;
    const float *lat = e->latent[j->layer];
    float scale = (float)c->attn_scale;
    int64_t r0 = h * (nope + vd);
    memset(qlat, 0, (size_t)(n * lora) * 4);
    for (int64_t r = 0; r < nope; r++) {
        ms_qmat_row(&L->kv_b, r0 + r, row);
        for (int64_t t = 0; t < n; t++) {
            float qv = e->q[(t * H + h) * qk + r];
            float *ql = qlat + t * lora;
            for (int64_t i = 0; i < lora; i++) ql[i] += qv * row[i];
        }
    }
    for (int64_t t = 0; t < n; t++) {
        int64_t p = e->n_past + t;
        float *ql = qlat + t * lora;
        const float *qpe = e->q + (t * H + h) * qk + nope;
        /* DSA layers attend to the indexer's selection (ascending positions), others to 0..p */
        int cnt = (int)(p + 1);
        const int32_t *sel = c->layer_dsa[j->layer] ? ms_dsa_engine_row(e, (int)t, &cnt) : NULL;
        for (int64_t si = 0; si < cnt; si++) {
            const float *ls = lat + (sel ? sel[si] : si) * lw;
            sc[si] = (dot(ql, ls, lora) + dot(qpe, ls + lora, rope)) * scale;
        }
        ms_softmax(sc, cnt);
        memset(ql, 0, (size_t)lora * 4); /* becomes o_lat */
        for (int64_t si = 0; si < cnt; si++) {
            const float *ls = lat + (sel ? sel[si] : si) * lw;
            float w = sc[si];
            for (int64_t i = 0; i < lora; i++) ql[i] += w * ls[i];
        }
    }
    for (int64_t i = 0; i < vd; i++) {
        ms_qmat_row(&L->kv_b, r0 + nope + i, row);
        for (int64_t t = 0; t < n; t++) e->att[(t * H + h) * vd + i] = dot(row, qlat + t * lora, lora);
    }
}

int ms_attn_mla(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->m->layers[layer];
    int64_t lora = c->kv_lora_rank, rope = c->qk_rope_dim, nope = c->qk_nope_dim, H = c->n_heads;
    int64_t qk = nope + rope, lw = lora + rope;
    float eps = (float)c->rms_eps;
    if (c->q_lora_rank > 0) {
        ms_matmul(e->pool, e->kv, e->xn, n, &L->q_a);
        ms_rmsnorm(e->kv, e->kv, L->q_a_norm, n, (int)c->q_lora_rank, eps);
        ms_matmul(e->pool, e->q, e->kv, n, &L->q_b);
        int rc = c->layer_dsa[layer] ? ms_dsa_engine_select(e, layer, n, e->kv, err) : MS_OK;
        if (rc) return rc;
    } else {
        ms_matmul(e->pool, e->q, e->xn, n, &L->wq);
    }
    ms_matmul(e->pool, e->kv, e->xn, n, &L->kv_a);
    float cs[512], sn[512];
    for (int t = 0; t < n; t++) {
        int64_t p = e->n_past + t;
        float *dst = e->latent[layer] + p * lw, *src = e->kv + t * lw;
        ms_rmsnorm(dst, src, L->kv_a_norm, 1, (int)lora, eps);
        memcpy(dst + lora, src + lora, (size_t)rope * 4);
        ms_rope_cos_sin(&c->rope, p, cs, sn);
        ms_rope_apply(&c->rope, dst + lora, cs, sn);
        for (int64_t h = 0; h < H; h++) ms_rope_apply(&c->rope, e->q + (t * H + h) * qk + nope, cs, sn);
    }
    attn_job j = {e, layer, n};
    ms_pool_run(e->pool, (int)H, mla_head, &j);
    ms_matmul(e->pool, out, e->att, n, &L->wo);
    return MS_OK;
}
