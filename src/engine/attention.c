/* attention.c — GQA (standard KV cache) and MLA (compressed latent cache;
 * absorbed form for decode and short chunks, expanded form for long prefill
 * chunks) attention sublayers. Both are causal over the sequence's
 * cache; heads are split across the pool. */
#include <math.h>
#include <string.h>

#include "engine/engine_internal.h"

static inline float dot(const float *a, const float *b, int64_t n) { return ms_dot(a, b, n); }

static float *thread_buf(ms_engine *e, int tid) { return e->th_buf + (size_t)tid * e->th_stride; }

/* ---------------- GQA ---------------- */

typedef struct {
    ms_engine *e;
    int layer, n;
} attn_job;

/* Per-layer GQA shape: kv heads, value dim, window (see ms_config). */
typedef struct {
    int64_t H, KV, hd, vd, kd, vtot, window;
    const ms_rope *rope;
    const float *sinks;
} gqa_shape;

static gqa_shape gqa_shape_of(const ms_engine *e, int layer) {
    const ms_config *c = &e->m->cfg;
    gqa_shape g;
    g.H = c->n_heads;
    g.KV = c->layer_kv_heads[layer] ? c->layer_kv_heads[layer] : c->n_kv_heads;
    g.hd = c->head_dim;
    g.vd = c->v_head_dim ? c->v_head_dim : c->head_dim;
    g.kd = g.KV * g.hd;
    g.vtot = g.KV * g.vd;
    g.window = c->layer_window[layer];
    g.rope = c->layer_rope[layer] ? &c->rope_alt : &c->rope;
    g.sinks = e->m->layers[layer].sinks;
    return g;
}

static void gqa_head(void *ctx, int h, int tid) {
    attn_job *j = ctx;
    ms_engine *e = j->e;
    gqa_shape g = gqa_shape_of(e, j->layer);
    int64_t kvh = h / (g.H / g.KV);
    const float *K = e->k_cache[j->layer], *V = e->v_cache[j->layer];
    float *sc = thread_buf(e, tid);
    float scale = (float)e->m->cfg.attn_scale;
    for (int t = 0; t < j->n; t++) {
        int64_t p = e->n_past + t;
        int64_t s0 = g.window > 0 && p - g.window + 1 > 0 ? p - g.window + 1 : 0;
        const float *qv = e->q + ((int64_t)t * g.H + h) * g.hd;
        float mx = g.sinks ? g.sinks[h] : -INFINITY;
        for (int64_t s = s0; s <= p; s++) {
            sc[s - s0] = dot(qv, K + s * g.kd + kvh * g.hd, g.hd) * scale;
            if (sc[s - s0] > mx) mx = sc[s - s0];
        }
        /* softmax over the keys, with the sink logit (if any) in the denominator only */
        int64_t n_keys = p - s0 + 1;
        double sum = g.sinks ? exp((double)g.sinks[h] - mx) : 0.0;
        for (int64_t s = 0; s < n_keys; s++) {
            sc[s] = expf(sc[s] - mx);
            sum += sc[s];
        }
        float inv = (float)(1.0 / sum);
        float *o = e->att + ((int64_t)t * g.H + h) * g.vd;
        memset(o, 0, (size_t)g.vd * sizeof *o);
        for (int64_t s = s0; s <= p; s++) ms_axpy(o, sc[s - s0] * inv, V + s * g.vtot + kvh * g.vd, g.vd);
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
    gqa_shape g = gqa_shape_of(e, layer);
    int64_t qd = g.H * g.hd;
    float *q = e->q, *k = e->kv, *v = e->kv + (int64_t)n * g.kd;
    ms_matmul(e->pool, q, e->xn, n, &L->wq);
    ms_matmul(e->pool, k, e->xn, n, &L->wk);
    ms_matmul(e->pool, v, e->xn, n, &L->wv);
    add_bias(q, L->bq, n, c->attn_out_gate ? 2 * qd : qd);
    add_bias(k, L->bk, n, g.kd);
    add_bias(v, L->bv, n, g.vtot);
    if (c->attn_out_gate) /* rows [query hd, gate hd] per head: gate to gate_buf, queries packed in place */
        for (int64_t r = 0; r < n * g.H; r++) {
            memcpy(e->gate_buf + r * g.hd, q + r * 2 * g.hd + g.hd, (size_t)g.hd * 4);
            memmove(q + r * g.hd, q + r * 2 * g.hd, (size_t)g.hd * 4);
        }
    float eps = (float)c->rms_eps;
    if (c->qk_norm == MS_QKNORM_HEAD) {
        ms_rmsnorm(q, q, L->q_norm, (int)(n * g.H), (int)g.hd, eps);
        ms_rmsnorm(k, k, L->k_norm, (int)(n * g.KV), (int)g.hd, eps);
    } else if (c->qk_norm == MS_QKNORM_FULL) {
        ms_rmsnorm(q, q, L->q_norm, n, (int)qd, eps);
        ms_rmsnorm(k, k, L->k_norm, n, (int)g.kd, eps);
    }
    if (c->v_scale != 0 && c->v_scale != 1)
        for (int64_t i = 0; i < n * g.vtot; i++) v[i] *= (float)c->v_scale;
    float cs[512], sn[512];
    for (int t = 0; t < n; t++) {
        int64_t p = e->n_past + t;
        ms_rope_cos_sin(g.rope, p, cs, sn);
        for (int64_t h = 0; h < g.H; h++) ms_rope_apply(g.rope, q + t * qd + h * g.hd, cs, sn);
        for (int64_t h = 0; h < g.KV; h++) ms_rope_apply(g.rope, k + t * g.kd + h * g.hd, cs, sn);
        memcpy(e->k_cache[layer] + p * g.kd, k + t * g.kd, (size_t)g.kd * 4);
        memcpy(e->v_cache[layer] + p * g.vtot, v + t * g.vtot, (size_t)g.vtot * 4);
    }
    attn_job j = {e, layer, n};
    ms_pool_run(e->pool, (int)g.H, gqa_head, &j);
    if (c->attn_out_gate) /* gated attention (Qwen3-Next): att *= sigmoid(gate) */
        for (int64_t i = 0; i < n * g.H * g.vd; i++) e->att[i] *= ms_sigmoid(e->gate_buf[i]);
    ms_matmul(e->pool, out, e->att, n, &L->wo);
    add_bias(out, L->bo, n, c->hidden);
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
        for (int64_t t = 0; t < n; t++) ms_axpy(qlat + t * lora, e->q[(t * H + h) * qk + r], row, lora);
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
            ms_axpy(ql, sc[si], ls, lora);
        }
    }
    ms_qmat wuv;
    if (ms_qmat_row_range(&L->kv_b, r0 + nope, vd, &wuv)) {
        /* W_UV as a view: the fast matmul, written per token into the head's slot */
        for (int64_t t = 0; t < n; t++) ms_matmul(NULL, e->att + (t * H + h) * vd, qlat + t * lora, 1, &wuv);
    } else {
        for (int64_t i = 0; i < vd; i++) {
            ms_qmat_row(&L->kv_b, r0 + nope + i, row);
            for (int64_t t = 0; t < n; t++) e->att[(t * H + h) * vd + i] = dot(row, qlat + t * lora, lora);
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
    attn_job *j = ctx;
    ms_engine *e = j->e;
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->m->layers[j->layer];
    int64_t lora = c->kv_lora_rank, rope = c->qk_rope_dim, nope = c->qk_nope_dim, vd = c->v_head_dim;
    int64_t qk = nope + rope, lw = lora + rope, H = c->n_heads, n = j->n, dkv = nope + vd;
    int64_t T = e->n_past + n, KB = MS_MLA_KEY_BLOCK, B = e->max_batch;
    float *xl = thread_buf(e, tid);   /* [KB, lora] the block's latents, contiguous */
    float *kvb = xl + KB * lora;      /* [KB, nope + vd] their k_nope | v */
    float *sc = kvb + KB * dkv;       /* [KB] scores of one token */
    float *mx = sc + KB, *sum = mx + B; /* [n] running max and denominator per token */
    int32_t *cur = (int32_t *)(sum + B); /* [n] DSA: next index into the token's selection */
    const float *lat = e->latent[j->layer];
    float scale = (float)c->attn_scale;
    int dsa = c->layer_dsa[j->layer] != 0;
    ms_qmat w;
    ms_qmat_row_range(&L->kv_b, h * dkv, dkv, &w); /* checked by mla_choose_expanded */
    for (int64_t t = 0; t < n; t++) {
        mx[t] = -INFINITY;
        sum[t] = 0;
        cur[t] = 0;
        memset(e->att + (t * H + h) * vd, 0, (size_t)vd * 4);
    }
    for (int64_t b0 = 0; b0 < T; b0 += KB) {
        int64_t nb = T - b0 < KB ? T - b0 : KB, b1 = b0 + nb;
        if (dsa) { /* skip a block that no token selects */
            int need = 0;
            for (int64_t t = 0; t < n && !need; t++) {
                int cnt;
                const int32_t *sel = ms_dsa_engine_row(e, (int)t, &cnt);
                need = cur[t] < cnt && sel[cur[t]] < b1;
            }
            if (!need) continue;
        }
        for (int64_t i = 0; i < nb; i++) memcpy(xl + i * lora, lat + (b0 + i) * lw, (size_t)lora * 4);
        ms_matmul(NULL, kvb, xl, (int)nb, &w);
        for (int64_t t = 0; t < n; t++) {
            int64_t p = e->n_past + t;
            const float *qn = e->q + (t * H + h) * qk, *qpe = qn + nope;
            int cnt = 0;
            const int32_t *sel = dsa ? ms_dsa_engine_row(e, (int)t, &cnt) : NULL;
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
                sc[i] = (dot(qn, kvb + (s - b0) * dkv, nope) + dot(qpe, lat + s * lw + lora, rope)) * scale;
                if (sc[i] > bm) bm = sc[i];
            }
            float *o = e->att + (t * H + h) * vd;
            float m_new = bm > mx[t] ? bm : mx[t];
            if (mx[t] > -INFINITY && m_new > mx[t]) { /* rescale what was accumulated under the old max */
                float a = expf(mx[t] - m_new);
                sum[t] *= a;
                for (int64_t i = 0; i < vd; i++) o[i] *= a;
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
        float *o = e->att + (t * H + h) * vd, inv = sum[t] > 0 ? 1.0f / sum[t] : 0.0f;
        for (int64_t i = 0; i < vd; i++) o[i] *= inv;
    }
}

/* Whether layer's chunk of n tokens (at n_past) runs in the expanded form.
 * Multiply-adds per head, with P = Σ_t keys attended by token t (p + 1, or the
 * DSA selection's size) and T = n_past + n cached positions:
 *   absorbed: n·lora·(nope + vd)       q_lat = W_UKᵀ q_nope and W_UV o_lat, per token
 *           + P·(2·lora + rope)        scores against [c, k_pe] and Σ p·c over the latent width
 *   expanded: T·lora·(nope + vd)       k_nope, v = kv_b c for every cached position
 *           + P·(nope + rope + vd)     scores and Σ p·v at head width
 * With DeepSeek's lora 512, nope/rope/v 128/64/128 a key costs 1088 absorbed
 * vs 320 expanded, but expanded pays (T - n)·131072 more up front: decode
 * (n = 1) always stays absorbed, a prefill from an empty cache always expands
 * (T = n), and a chunk appended to a long context expands once
 * P·768 > (T - n)·131072, i.e. roughly n·(n_past + n/2) > 170·n_past. */
static int mla_choose_expanded(ms_engine *e, int layer, int n) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->m->layers[layer];
    if (e->mla_form == MS_MLA_ABSORBED || n < 2) return 0;
    int64_t lora = c->kv_lora_rank, rope = c->qk_rope_dim, nope = c->qk_nope_dim, vd = c->v_head_dim;
    int64_t dkv = nope + vd, T = e->n_past + n;
    ms_qmat w;
    for (int64_t h = 0; h < c->n_heads; h++) /* block-scaled rows must start at a scale block */
        if (!ms_qmat_row_range(&L->kv_b, h * dkv, dkv, &w)) return 0;
    if (e->mla_form == MS_MLA_EXPANDED) return 1;
    double P = 0;
    for (int t = 0; t < n; t++) {
        int cnt = e->n_past + t + 1;
        if (c->layer_dsa[layer]) ms_dsa_engine_row(e, t, &cnt);
        P += cnt;
    }
    double absorbed = (double)n * lora * dkv + P * (double)(2 * lora + rope);
    double expanded = (double)T * lora * dkv + P * (double)(nope + rope + vd);
    return expanded < absorbed;
}

int ms_attn_mla(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->m->layers[layer];
    int64_t lora = c->kv_lora_rank, rope = c->qk_rope_dim, nope = c->qk_nope_dim, H = c->n_heads;
    int64_t qk = nope + rope, lw = lora + rope;
    float eps = (float)(c->mla_norm_eps > 0 ? c->mla_norm_eps : c->rms_eps);
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
    int expanded = mla_choose_expanded(e, layer, n);
    e->stats.mla_chunks++;
    e->stats.mla_expanded += (uint64_t)expanded;
    ms_pool_run(e->pool, (int)H, expanded ? mla_head_expanded : mla_head, &j);
    if (c->mla_out_gate) { /* gated MLA (Kimi K3): att *= sigmoid(g_proj x) */
        int64_t w = H * c->v_head_dim;
        ms_matmul(e->pool, e->gate_buf, e->xn, n, &L->mla_gate);
        for (int64_t i = 0; i < n * w; i++) e->att[i] *= ms_sigmoid(e->gate_buf[i]);
    }
    ms_matmul(e->pool, out, e->att, n, &L->wo);
    return MS_OK;
}
