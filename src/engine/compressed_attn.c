/* compressed_attn.c — the compressed-attention sublayer (engine/compressed_attn.h,
 * transformers 5.17 DeepseekV4Attention) and its decode state.
 *
 * Per token at position p: q_resid = RMSNorm(q_a x); q = unweighted per-head
 * RMSNorm(q_b q_resid), RoPE (interleaved) on each head's trailing rope dims;
 * one shared key = value kv = RoPE(RMSNorm(wkv x)). A query attends (scale
 * head_dim^-0.5, per-head sink logit in the denominator) to the keys of the
 * last `window` positions and to compressed entries: entry w pools window
 * [w*rate, (w+1)*rate) (ops/compress.h; CSA also the previous window's first
 * halves), RoPE'd at position w*rate, visible to p once (w+1)*rate <= p+1. HCA
 * attends to every visible entry; CSA to the index_topk best visible entries by
 * the lightning indexer  sum_h w_h H^-1/2 relu(D^-1/2 q_h . k_w)  with torch.topk's
 * tie choices over the row of all entries of the forward (ops/dsa.h). The
 * output's rope dims are rotated back by -p, heads are projected per group
 * (wo_a) and mixed (wo_b).
 *
 * State per layer (decode is incremental and reproduces a full recompute):
 * the last `window` keys, the raw projections of the current and previous
 * window (2*rate rows), and every compressed entry (one per rate tokens, also
 * for the indexer). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "ops/compress.h"
#include "ops/dsa.h"

typedef struct {
    float *win;               /* [W, hd] ring: key of position p at p % W */
    float *craw_kv, *craw_g;  /* [2*rate, cw] ring of raw compressor rows */
    float *comp;              /* [T/rate + 1, hd] entries */
    float *iraw_kv, *iraw_g;  /* [2*rate, 2*ihd] indexer rows */
    float *icomp;             /* [T/rate + 1, ihd] indexer entries */
    int64_t n_comp;
} ca_layer;

struct ms_cattn_state {
    ca_layer *L;
    float *qr, *kvc, *pk, *pg, *iq, *iw, *att, *og, *gin, *go, *sc, *isc, *keyw;
    int64_t max_entries;      /* room in isc / sel / work: max_ctx / min rate + 1 */
    int32_t *sel;
    ms_dsa_qel *work;
};

#define MAX2(a, b) ((a) > (b) ? (a) : (b))

int ms_cattn_engine_init(ms_engine *e, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    int any = 0;
    for (int l = 0; l < c->n_layers; l++) any |= c->layer_attn[l] == MS_ATTN_COMPRESSED;
    if (!any) return MS_OK;
    struct ms_cattn_state *s = calloc(1, sizeof *s);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "out of memory for the compressed-attention state");
    e->cattn = s;
    size_t T = (size_t)e->max_ctx, B = (size_t)e->max_batch, hd = (size_t)c->head_dim, H = (size_t)c->n_heads;
    size_t ihd = (size_t)MAX2(c->dsa_head_dim, 1), ih = (size_t)MAX2(c->dsa_heads, 1);
    int f = !(s->L = calloc((size_t)c->n_layers, sizeof *s->L));
    size_t maxw = 1, maxe = 1, cw_max = 2 * MAX2(hd, ihd);
    for (int l = 0; !f && l < c->n_layers; l++) {
        if (c->layer_attn[l] != MS_ATTN_COMPRESSED) continue;
        ca_layer *L = &s->L[l];
        size_t W = (size_t)MAX2(c->layer_window[l], 1), rate = c->layer_compress[l];
        maxw = MAX2(maxw, W);
        f |= !(L->win = calloc(W * hd, 4));
        if (rate) {
            size_t cw = (c->layer_csa[l] ? 2 : 1) * hd, ne = T / rate + 1;
            maxe = MAX2(maxe, ne);
            f |= !(L->craw_kv = calloc(2 * rate * cw, 4)) || !(L->craw_g = calloc(2 * rate * cw, 4)) ||
                 !(L->comp = calloc(ne * hd, 4));
            if (c->layer_csa[l])
                f |= !(L->iraw_kv = calloc(2 * rate * 2 * ihd, 4)) || !(L->iraw_g = calloc(2 * rate * 2 * ihd, 4)) ||
                     !(L->icomp = calloc(ne * ihd, 4));
        }
    }
    size_t G = (size_t)MAX2(c->o_groups, 1), R = (size_t)c->o_lora_rank;
    f = f || !(s->qr = malloc(B * (size_t)c->q_lora_rank * 4)) || !(s->kvc = malloc(B * hd * 4)) ||
        !(s->pk = malloc(B * cw_max * 4)) || !(s->pg = malloc(B * cw_max * 4)) ||
        !(s->iq = malloc(B * ih * ihd * 4)) || !(s->iw = malloc(B * ih * 4)) || !(s->att = malloc(B * H * hd * 4)) ||
        !(s->og = malloc(B * G * R * 4)) || !(s->gin = malloc(B * H * hd / G * 4 + 4)) ||
        !(s->go = malloc(B * R * 4 + 4)) || !(s->sc = malloc((maxw + maxe + 2) * 4)) ||
        !(s->isc = malloc((maxe + 2) * 4)) || !(s->keyw = malloc((maxw + maxe + 2) * sizeof(float *))) ||
        !(s->sel = malloc((maxe + 2) * 4)) || !(s->work = malloc((maxe + 2) * sizeof *s->work));
    if (f) return ms_fail(err, MS_ERR_NOMEM, "out of memory for the compressed-attention state (context %zu)", T);
    s->max_entries = (int64_t)maxe;
    return MS_OK;
}

void ms_cattn_engine_free(ms_engine *e) {
    struct ms_cattn_state *s = e->cattn;
    if (!s) return;
    for (int l = 0; s->L && l < e->m->cfg.n_layers; l++) {
        ca_layer *L = &s->L[l];
        free(L->win), free(L->craw_kv), free(L->craw_g), free(L->comp), free(L->iraw_kv), free(L->iraw_g),
            free(L->icomp);
    }
    free(s->L), free(s->qr), free(s->kvc), free(s->pk), free(s->pg), free(s->iq), free(s->iw), free(s->att);
    free(s->og), free(s->gin), free(s->go), free(s->sc), free(s->isc), free(s->keyw), free(s->sel), free(s->work);
    free(s);
    e->cattn = NULL;
}

void ms_cattn_engine_reset(ms_engine *e) {
    struct ms_cattn_state *s = e->cattn;
    for (int l = 0; s && l < e->m->cfg.n_layers; l++) s->L[l].n_comp = 0;
}

/* RoPE on the trailing r->dim dims of x [d]; sign -1 rotates back. */
static void rope_tail(const ms_rope *r, float *x, int64_t d, int64_t pos, float sign) {
    float cs[512], sn[512];
    ms_rope_cos_sin(r, pos, cs, sn);
    for (int i = 0; i < r->dim / 2; i++) sn[i] *= sign;
    ms_rope_apply(r, x + d - r->dim, cs, sn);
}

/* Append the raw rows of positions pos0..pos0+n-1 and emit every entry whose window closes. */
static int compress_rows(const ms_config *c, const ms_compressor_weights *w, float *raw_kv, float *raw_g,
                         float *entries, const float *pk, const float *pg, int rate, int64_t dim, int overlap,
                         int64_t pos0, int n, int64_t *n_comp, ms_err *err) {
    int64_t cw = (overlap ? 2 : 1) * dim;
    for (int t = 0; t < n; t++) {
        int64_t p = pos0 + t, slot = p % (2 * rate);
        memcpy(raw_kv + slot * cw, pk + (int64_t)t * cw, (size_t)cw * 4);
        memcpy(raw_g + slot * cw, pg + (int64_t)t * cw, (size_t)cw * 4);
        if ((p + 1) % rate) continue;
        int64_t win = p / rate;
        const float *ck = raw_kv + (win % 2) * rate * cw, *cg = raw_g + (win % 2) * rate * cw;
        const float *pk0 = NULL, *pg0 = NULL;
        if (overlap && win > 0) pk0 = raw_kv + ((win - 1) % 2) * rate * cw, pg0 = raw_g + ((win - 1) % 2) * rate * cw;
        float *out = entries + win * dim;
        int rc = ms_compress_pool(ck, cg, pk0, pg0, w->ape, w->norm, rate, (int)dim, overlap, (float)c->rms_eps, out,
                                  err);
        if (rc) return rc;
        rope_tail(&c->rope, out, dim, win * rate, 1.0f);
        *n_comp = win + 1;
    }
    return MS_OK;
}

int ms_attn_compressed(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *Lw = &e->m->layers[layer];
    const ms_cattn_weights *w = &Lw->ca;
    struct ms_cattn_state *s = e->cattn;
    if (!s) return ms_fail(err, MS_ERR_ARG, "layer %d: compressed attention without its state", layer);
    ca_layer *L = &s->L[layer];
    int64_t H = c->n_heads, hd = c->head_dim, W = MAX2(c->layer_window[layer], 1), pos0 = e->n_past;
    int rate = c->layer_compress[layer], csa = c->layer_csa[layer];
    const ms_rope *rope = c->layer_rope[layer] ? &c->rope_alt : &c->rope;
    float eps = (float)c->rms_eps;
    /* queries */
    ms_matmul(e->pool, s->qr, e->xn, n, &Lw->q_a);
    ms_rmsnorm(s->qr, s->qr, Lw->q_a_norm, n, (int)c->q_lora_rank, eps);
    ms_matmul(e->pool, e->q, s->qr, n, &Lw->q_b);
    ms_rmsnorm(e->q, e->q, NULL, n * (int)H, (int)hd, eps);
    for (int t = 0; t < n; t++)
        for (int64_t h = 0; h < H; h++) rope_tail(rope, e->q + ((int64_t)t * H + h) * hd, hd, pos0 + t, 1.0f);
    /* the shared key = value */
    ms_matmul(e->pool, s->kvc, e->xn, n, &w->wkv);
    ms_rmsnorm(s->kvc, s->kvc, w->kv_norm, n, (int)hd, eps);
    for (int t = 0; t < n; t++) rope_tail(rope, s->kvc + (int64_t)t * hd, hd, pos0 + t, 1.0f);
    /* compressed entries closing in this chunk */
    int rc;
    if (rate) {
        ms_matmul(e->pool, s->pk, e->xn, n, &w->comp.wkv);
        ms_matmul(e->pool, s->pg, e->xn, n, &w->comp.wgate);
        int64_t nc = L->n_comp;
        if ((rc = compress_rows(c, &w->comp, L->craw_kv, L->craw_g, L->comp, s->pk, s->pg, rate, hd, csa, pos0, n, &nc,
                                err)))
            return ms_wrap(err, "layer %d compressor", layer);
        if (csa) {
            int64_t ihd = c->dsa_head_dim, nci = L->n_comp;
            ms_matmul(e->pool, s->pk, e->xn, n, &w->icomp.wkv);
            ms_matmul(e->pool, s->pg, e->xn, n, &w->icomp.wgate);
            if ((rc = compress_rows(c, &w->icomp, L->iraw_kv, L->iraw_g, L->icomp, s->pk, s->pg, rate, ihd, 1, pos0,
                                    n, &nci, err)))
                return ms_wrap(err, "layer %d indexer compressor", layer);
            ms_matmul(e->pool, s->iq, s->qr, n, &w->iwq_b);
            for (int t = 0; t < n; t++)
                for (int64_t h = 0; h < c->dsa_heads; h++)
                    rope_tail(&c->rope, s->iq + ((int64_t)t * c->dsa_heads + h) * ihd, ihd, pos0 + t, 1.0f);
            ms_matmul(e->pool, s->iw, e->xn, n, &w->iweights);
        }
        L->n_comp = nc;
    }
    int64_t NC = rate ? L->n_comp : 0;
    float scale = (float)c->attn_scale;
    for (int t = 0; t < n; t++) {
        int64_t p = pos0 + t, s0 = p - W + 1 > 0 ? p - W + 1 : 0;
        int nk = 0;
        for (int64_t j = s0; j <= p; j++)
            ((const float **)s->keyw)[nk++] = j >= pos0 ? s->kvc + (j - pos0) * hd : L->win + (j % W) * hd;
        if (rate) {
            int64_t vis = (p + 1) / rate < NC ? (p + 1) / rate : NC;
            if (!csa) {
                for (int64_t x = 0; x < vis; x++) ((const float **)s->keyw)[nk++] = L->comp + x * hd;
            } else if (NC > 0) {
                int64_t IH = c->dsa_heads, ihd = c->dsa_head_dim;
                float ws = 1.0f / sqrtf((float)IH), ss = 1.0f / sqrtf((float)ihd);
                for (int64_t x = 0; x < vis; x++) {
                    float acc = 0;
                    for (int64_t h = 0; h < IH; h++) {
                        float d = ms_dot(s->iq + ((int64_t)t * IH + h) * ihd, L->icomp + x * ihd, ihd);
                        acc += (d > 0 ? d : 0) * ss * (s->iw[(int64_t)t * IH + h] * ws);
                    }
                    s->isc[x] = acc;
                }
                /* torch.topk's tie choices depend on the row length: that of the whole forward (fwd_len),
                 * whose later entries are masked for this query anyway */
                int64_t NT = e->fwd_len / rate > NC ? e->fwd_len / rate : NC;
                if (NT > s->max_entries) NT = s->max_entries;
                int64_t k = c->dsa_topk < NT ? c->dsa_topk : NT;
                int64_t cnt = ms_dsa_topk(s->isc, vis, NT, k, s->work, s->sel, NULL);
                for (int64_t i = 0; i < cnt; i++) ((const float **)s->keyw)[nk++] = L->comp + (int64_t)s->sel[i] * hd;
            }
        }
        const float *const *keys = (const float *const *)s->keyw;
        for (int64_t h = 0; h < H; h++) {
            const float *qv = e->q + ((int64_t)t * H + h) * hd;
            float mx = Lw->sinks ? Lw->sinks[h] : -INFINITY;
            for (int i = 0; i < nk; i++) {
                s->sc[i] = ms_dot(qv, keys[i], hd) * scale;
                if (s->sc[i] > mx) mx = s->sc[i];
            }
            double den = Lw->sinks ? exp((double)Lw->sinks[h] - mx) : 0.0;
            for (int i = 0; i < nk; i++) {
                s->sc[i] = expf(s->sc[i] - mx);
                den += s->sc[i];
            }
            float *o = s->att + ((int64_t)t * H + h) * hd;
            memset(o, 0, (size_t)hd * 4);
            for (int i = 0; i < nk; i++) ms_axpy(o, (float)(s->sc[i] / den), keys[i], hd);
            rope_tail(rope, o, hd, p, -1.0f);
        }
    }
    /* keep the last W keys */
    for (int t = n - W > 0 ? (int)(n - W) : 0; t < n; t++)
        memcpy(L->win + ((pos0 + t) % W) * hd, s->kvc + (int64_t)t * hd, (size_t)hd * 4);
    /* grouped low-rank output projection */
    int64_t G = c->o_groups, R = c->o_lora_rank, ig = H * hd / G;
    for (int64_t g = 0; g < G; g++) {
        ms_qmat wg;
        if (!ms_qmat_row_range(&w->wo_a, g * R, R, &wg))
            return ms_fail(err, MS_ERR_UNSUPPORTED, "layer %d: wo_a group %lld cannot be viewed in place", layer,
                           (long long)g);
        for (int t = 0; t < n; t++) memcpy(s->gin + (int64_t)t * ig, s->att + (int64_t)t * H * hd + g * ig, (size_t)ig * 4);
        ms_matmul(e->pool, s->go, s->gin, n, &wg);
        for (int t = 0; t < n; t++) memcpy(s->og + (int64_t)t * G * R + g * R, s->go + (int64_t)t * R, (size_t)R * 4);
    }
    ms_matmul(e->pool, out, s->og, n, &w->wo_b);
    return MS_OK;
}

/* ---- state parts (engine/state.c): the key window and raw-row rings (whole), the
 * entries closed so far (one row per rate positions) ---- */
int ms_cattn_engine_parts(const ms_engine *e, ms_state_part *parts, int n, int cap) {
    struct ms_cattn_state *s = e->cattn;
    if (!s) return n;
    const ms_config *c = &e->m->cfg;
    const char *why = "a compressed-attention layer's rings (key window, raw compressor rows)";
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_attn[l] != MS_ATTN_COMPRESSED) continue;
        ca_layer *L = &s->L[l];
        uint64_t hd = (uint64_t)c->head_dim, ihd = (uint64_t)MAX2(c->dsa_head_dim, 1);
        uint64_t W = (uint64_t)MAX2(c->layer_window[l], 1), rate = c->layer_compress[l];
        uint64_t cw = (c->layer_csa[l] ? 2 : 1) * hd;
        struct { const char *tag; void *data; uint64_t bytes; int64_t per; } P[] = {
            {"win", L->win, W * hd * 4, 0},
            {"raw_kv", L->craw_kv, 2 * rate * cw * 4, 0},
            {"raw_g", L->craw_g, 2 * rate * cw * 4, 0},
            {"comp", L->comp, hd * 4, (int64_t)rate},
            {"iraw_kv", L->iraw_kv, 2 * rate * 2 * ihd * 4, 0},
            {"iraw_g", L->iraw_g, 2 * rate * 2 * ihd * 4, 0},
            {"icomp", L->icomp, ihd * 4, (int64_t)rate},
        };
        for (size_t i = 0; i < sizeof P / sizeof *P; i++) {
            if (!P[i].data) continue; /* HCA without an indexer, or no compressor */
            if (parts && n < cap) {
                parts[n] = (ms_state_part){.kind = P[i].per ? MS_PART_ROWS : MS_PART_FIXED, .data = P[i].data,
                                           .row_bytes = P[i].bytes, .per = P[i].per ? P[i].per : 1,
                                           .cap_rows = e->max_ctx / (P[i].per ? P[i].per : 1) + 1, .no_truncate = why};
                snprintf(parts[n].name, sizeof parts[n].name, "L%d.ca.%s", l, P[i].tag);
            }
            n++;
        }
    }
    return n;
}

void ms_cattn_engine_restored(ms_engine *e, int64_t n_past) {
    struct ms_cattn_state *s = e->cattn;
    for (int l = 0; s && l < e->m->cfg.n_layers; l++)
        if (e->m->cfg.layer_attn[l] == MS_ATTN_COMPRESSED && e->m->cfg.layer_compress[l])
            s->L[l].n_comp = n_past / e->m->cfg.layer_compress[l];
}
