/* be_cpu_attn.c — the CPU backend's attention ops: GQA (sinks, sliding window)
 * and MLA in its absorbed and expanded forms (contracts in core/backend.h).
 * Heads are split across the pool; each thread works in its own scratch. */
#include <math.h>
#include <string.h>

#include "backend/cpu/be_cpu.h"

static inline float dot(const float *a, const float *b, int64_t n) { return ms_dot(a, b, n); }

/* ---------------- GQA ---------------- */

typedef struct {
    cpu_backend *b;
    const ms_attn_gqa_args *a;
} gqa_job;

static void gqa_head(void *ctx, int h, int tid) {
    gqa_job *j = ctx;
    const ms_attn_gqa_args *g = j->a;
    int64_t kvh = h / (g->H / g->KV), kd = g->KV * g->hd, vtot = g->KV * g->vd;
    float *sc = cpu_thread_buf(j->b, tid);
    for (int t = 0; t < g->n; t++) {
        int64_t p = g->n_past + t;
        int64_t s0 = g->window > 0 && p - g->window + 1 > 0 ? p - g->window + 1 : 0;
        const float *qv = g->q + ((int64_t)t * g->H + h) * g->hd;
        float mx = g->sinks ? g->sinks[h] : -INFINITY;
        for (int64_t s = s0; s <= p; s++) {
            sc[s - s0] = dot(qv, g->k + s * kd + kvh * g->hd, g->hd) * g->scale;
            if (sc[s - s0] > mx) mx = sc[s - s0];
        }
        /* softmax over the keys, with the sink logit (if any) in the denominator only */
        int64_t n_keys = p - s0 + 1;
        double sum = g->sinks ? exp((double)g->sinks[h] - mx) : 0.0;
        for (int64_t s = 0; s < n_keys; s++) {
            sc[s] = expf(sc[s] - mx);
            sum += sc[s];
        }
        float inv = (float)(1.0 / sum);
        float *o = g->out + ((int64_t)t * g->H + h) * g->vd;
        memset(o, 0, (size_t)g->vd * sizeof *o);
        for (int64_t s = s0; s <= p; s++) ms_axpy(o, sc[s - s0] * inv, g->v + s * vtot + kvh * g->vd, g->vd);
    }
}

int ms_cpu_attn_gqa(ms_backend *be, const ms_attn_gqa_args *a, ms_err *err) {
    cpu_backend *b = cpu_of(be);
    if (a->n_past + a->n > b->max_ctx || a->KV < 1 || a->H % a->KV)
        return ms_fail(err, MS_ERR_ARG, "GQA attention: %lld positions with scratch for %lld, %lld heads over %lld",
                       (long long)(a->n_past + a->n), (long long)b->max_ctx, (long long)a->H, (long long)a->KV);
    gqa_job j = {b, a};
    ms_pool_run(b->pool, (int)a->H, gqa_head, &j);
    return MS_OK;
}

/* ---------------- MLA (absorbed) ----------------
 * kv_b rows for head h: [h*(nope+v), h*(nope+v)+nope) are W_UK (k_nope = W_UK c),
 * the next v rows are W_UV (v = W_UV c). Scores use q_lat = W_UKᵀ q_nope against
 * the cached normalized latent c; the output is W_UV (Σ p c). Mathematically
 * equal to transformers' expanded form (DeepseekV3Attention.forward). */

typedef struct {
    cpu_backend *b;
    const ms_attn_mla_args *a;
} mla_job;

static const int32_t *sel_row(const ms_attn_mla_args *a, int64_t t, int *cnt) {
    *cnt = a->sel_count[t];
    return a->sel + t * a->sel_width;
}

static void mla_head(void *ctx, int h, int tid) {
    mla_job *j = ctx;
    const ms_attn_mla_args *a = j->a;
    int64_t lora = a->lora, rope = a->rope, nope = a->nope, vd = a->vd;
    int64_t qk = nope + rope, lw = lora + rope, H = a->H, n = a->n;
    float *sc = cpu_thread_buf(j->b, tid);
    float *qlat = sc + j->b->max_ctx; /* [n, lora]: q_lat, then o_lat */
    float *row = qlat + j->b->max_batch * lora;
    const float *lat = a->latent;
    int64_t r0 = h * (nope + vd);
    memset(qlat, 0, (size_t)(n * lora) * 4);
    for (int64_t r = 0; r < nope; r++) {
        ms_qmat_row(a->kv_b, r0 + r, row);
        for (int64_t t = 0; t < n; t++) ms_axpy(qlat + t * lora, a->q[(t * H + h) * qk + r], row, lora);
    }
    for (int64_t t = 0; t < n; t++) {
        int64_t p = a->n_past + t;
        float *ql = qlat + t * lora;
        const float *qpe = a->q + (t * H + h) * qk + nope;
        /* DSA layers attend to the indexer's selection (ascending positions), others to 0..p */
        int cnt = (int)(p + 1);
        const int32_t *sel = a->sel ? sel_row(a, t, &cnt) : NULL;
        for (int64_t si = 0; si < cnt; si++) {
            const float *ls = lat + (sel ? sel[si] : si) * lw;
            sc[si] = (dot(ql, ls, lora) + dot(qpe, ls + lora, rope)) * a->scale;
        }
        ms_softmax(sc, cnt);
        memset(ql, 0, (size_t)lora * 4); /* becomes o_lat */
        for (int64_t si = 0; si < cnt; si++) {
            const float *ls = lat + (sel ? sel[si] : si) * lw;
            ms_axpy(ql, sc[si], ls, lora);
        }
    }
    ms_qmat wuv;
    if (ms_qmat_row_range(a->kv_b, r0 + nope, vd, &wuv)) {
        /* W_UV as a view: the fast matmul, written per token into the head's slot */
        for (int64_t t = 0; t < n; t++) ms_matmul(NULL, a->out + (t * H + h) * vd, qlat + t * lora, 1, &wuv);
    } else {
        for (int64_t i = 0; i < vd; i++) {
            ms_qmat_row(a->kv_b, r0 + nope + i, row);
            for (int64_t t = 0; t < n; t++) a->out[(t * H + h) * vd + i] = dot(row, qlat + t * lora, lora);
        }
    }
}

/* ---------------- MLA (expanded) ----------------
 * The same attention computed as transformers writes it: per head, the cached
 * latents are up-projected into k_nope = W_UK c and v = W_UV c (kv_b rows
 * [h*(nope+v), (h+1)*(nope+v)), one matmul per block of MS_MLA_KEY_BLOCK
 * cached positions), scores are q_nope·k_nope + q_pe·k_pe, the output
 * Σ p v. Keys are taken block by block with a running (online) softmax, so
 * the scratch per thread is bounded by the block, not by the context. DSA
 * layers attend to their selection (ascending positions: one cursor per
 * token walks it block by block); blocks no token selects are skipped. */

static void mla_head_expanded(void *ctx, int h, int tid) {
    mla_job *j = ctx;
    const ms_attn_mla_args *a = j->a;
    int64_t lora = a->lora, rope = a->rope, nope = a->nope, vd = a->vd;
    int64_t qk = nope + rope, lw = lora + rope, H = a->H, n = a->n, dkv = nope + vd;
    int64_t T = a->n_past + n, KB = MS_MLA_KEY_BLOCK, B = j->b->max_batch;
    float *xl = cpu_thread_buf(j->b, tid); /* [KB, lora] the block's latents, contiguous */
    float *kvb = xl + KB * lora;      /* [KB, nope + vd] their k_nope | v */
    float *sc = kvb + KB * dkv;       /* [KB] scores of one token */
    float *mx = sc + KB, *sum = mx + B; /* [n] running max and denominator per token */
    int32_t *cur = (int32_t *)(sum + B); /* [n] DSA: next index into the token's selection */
    const float *lat = a->latent;
    int dsa = a->sel != NULL;
    ms_qmat w;
    ms_qmat_row_range(a->kv_b, h * dkv, dkv, &w); /* checked by the caller (contract) */
    for (int64_t t = 0; t < n; t++) {
        mx[t] = -INFINITY;
        sum[t] = 0;
        cur[t] = 0;
        memset(a->out + (t * H + h) * vd, 0, (size_t)vd * 4);
    }
    for (int64_t b0 = 0; b0 < T; b0 += KB) {
        int64_t nb = T - b0 < KB ? T - b0 : KB, b1 = b0 + nb;
        if (dsa) { /* skip a block that no token selects */
            int need = 0;
            for (int64_t t = 0; t < n && !need; t++) {
                int cnt;
                const int32_t *sel = sel_row(a, t, &cnt);
                need = cur[t] < cnt && sel[cur[t]] < b1;
            }
            if (!need) continue;
        }
        for (int64_t i = 0; i < nb; i++) memcpy(xl + i * lora, lat + (b0 + i) * lw, (size_t)lora * 4);
        ms_matmul(NULL, kvb, xl, (int)nb, &w);
        for (int64_t t = 0; t < n; t++) {
            int64_t p = a->n_past + t;
            const float *qn = a->q + (t * H + h) * qk, *qpe = qn + nope;
            int cnt = 0;
            const int32_t *sel = dsa ? sel_row(a, t, &cnt) : NULL;
            /* this block's keys of token t: k of them, from selection index i0 or position b0 */
            int64_t k = 0, i0 = cur[t];
            if (dsa) {
                while (i0 + k < cnt && sel[i0 + k] < b1) k++;
            } else if (p >= b0) {
                k = (p < b1 - 1 ? p : b1 - 1) - b0 + 1;
            }
            if (k == 0) continue;
            float bm = -INFINITY;
            for (int64_t i = 0; i < k; i++) {
                int64_t s = sel ? sel[i0 + i] : b0 + i;
                sc[i] = (dot(qn, kvb + (s - b0) * dkv, nope) + dot(qpe, lat + s * lw + lora, rope)) * a->scale;
                if (sc[i] > bm) bm = sc[i];
            }
            float *o = a->out + (t * H + h) * vd;
            float m_new = bm > mx[t] ? bm : mx[t];
            if (mx[t] > -INFINITY && m_new > mx[t]) { /* rescale what was accumulated under the old max */
                float f = expf(mx[t] - m_new);
                sum[t] *= f;
                for (int64_t i = 0; i < vd; i++) o[i] *= f;
            }
            mx[t] = m_new;
            for (int64_t i = 0; i < k; i++) {
                int64_t s = sel ? sel[i0 + i] : b0 + i;
                float pw = expf(sc[i] - m_new);
                sum[t] += pw;
                ms_axpy(o, pw, kvb + (s - b0) * dkv + nope, vd);
            }
            cur[t] = (int32_t)(i0 + k);
        }
    }
    for (int64_t t = 0; t < n; t++) {
        float *o = a->out + (t * H + h) * vd, inv = sum[t] > 0 ? 1.0f / sum[t] : 0.0f;
        for (int64_t i = 0; i < vd; i++) o[i] *= inv;
    }
}

int ms_cpu_attn_mla(ms_backend *be, const ms_attn_mla_args *a, ms_err *err) {
    cpu_backend *b = cpu_of(be);
    if (a->n_past + a->n > b->max_ctx || a->n > b->max_batch)
        return ms_fail(err, MS_ERR_ARG, "MLA attention: %lld positions, %d tokens with scratch for %lld, %lld",
                       (long long)(a->n_past + a->n), a->n, (long long)b->max_ctx, (long long)b->max_batch);
    if (a->expanded) {
        ms_qmat w;
        for (int64_t h = 0; h < a->H; h++)
            if (!ms_qmat_row_range(a->kv_b, h * (a->nope + a->vd), a->nope + a->vd, &w))
                return ms_fail(err, MS_ERR_ARG, "MLA expanded form: kv_b rows of head %lld cannot be viewed in place",
                               (long long)h);
    }
    mla_job j = {b, a};
    ms_pool_run(b->pool, (int)a->H, a->expanded ? mla_head_expanded : mla_head, &j);
    return MS_OK;
}
