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
 * for the indexer), all in backend memory. The projections, norms and RoPE are
 * backend ops, the compressors and the attention core the backend's
 * compress_append / attn_compressed. */
#include <stdio.h>
#include <stdlib.h>

#include "engine/engine_internal.h"

typedef struct { /* [be] buffers unless said */
    float *win;               /* [W, hd] ring: key of position p at p % W */
    float *craw_kv, *craw_g;  /* [2*rate, cw] ring of raw compressor rows */
    float *comp;              /* [T/rate + 1, hd] entries */
    float *iraw_kv, *iraw_g;  /* [2*rate, 2*ihd] indexer rows */
    float *icomp;             /* [T/rate + 1, ihd] indexer entries */
    int64_t n_comp;           /* [host] entries closed so far */
} ca_layer;

struct ms_cattn_state {
    ca_layer *L;
    float *qr, *kvc, *pk, *pg, *iq, *iw, *att, *og, *gin, *go; /* [be] chunk scratch */
};

#define MAX2(a, b) ((a) > (b) ? (a) : (b))

static int any_compressed(const ms_config *c) {
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_attn[l] == MS_ATTN_COMPRESSED) return 1;
    return 0;
}

int ms_cattn_engine_init(ms_engine *e, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    if (!any_compressed(c)) return MS_OK;
    struct ms_cattn_state *s = calloc(1, sizeof *s);
    if (!s || !(s->L = calloc((size_t)c->n_layers, sizeof *s->L))) {
        free(s);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory for the compressed-attention state");
    }
    e->cattn = s;
    return MS_OK;
}

int ms_cattn_engine_buffers(ms_engine *e, const ms_config *c, size_t T, size_t B, ms_buf_spec *b, int n) {
    if (!any_compressed(c)) return n;
    struct ms_cattn_state *s = e ? e->cattn : NULL;
    size_t hd = (size_t)c->head_dim, H = (size_t)c->n_heads;
    size_t ihd = (size_t)MAX2(c->dsa_head_dim, 1), ih = (size_t)MAX2(c->dsa_heads, 1);
    size_t cw_max = 2 * MAX2(hd, ihd);
#define P(f) (s ? (void **)&(f) : NULL)
#define STATE(f, floats) (n = ms_buf_add(b, n, P(f), (floats) * 4, 1, 0))
#define SCRATCH(f, floats) (n = ms_buf_add(b, n, P(f), (floats) * 4, 0, 0))
    for (int l = 0; l < c->n_layers; l++) { /* window keys, raw rows, entries */
        if (c->layer_attn[l] != MS_ATTN_COMPRESSED) continue;
        if (e && e->staged && (l < e->l0 || l >= e->l1)) continue; /* another stage's layer */
        size_t W = (size_t)MAX2(c->layer_window[l], 1), rate = c->layer_compress[l];
        int first = n;
        STATE(s->L[l].win, W * hd);
        if (!rate) continue;
        size_t cw = (c->layer_csa[l] ? 2 : 1) * hd, ne = T / rate + 1;
        STATE(s->L[l].craw_kv, 2 * rate * cw);
        STATE(s->L[l].craw_g, 2 * rate * cw);
        STATE(s->L[l].comp, ne * hd);
        if (c->layer_csa[l]) {
            STATE(s->L[l].iraw_kv, 2 * rate * 2 * ihd);
            STATE(s->L[l].iraw_g, 2 * rate * 2 * ihd);
            STATE(s->L[l].icomp, ne * ihd);
        }
        for (int i = first; b && i < n; i++) b[i].layer = l; /* the placement's per-layer state */
    }
    size_t G = (size_t)MAX2(c->o_groups, 1), R = (size_t)c->o_lora_rank;
    SCRATCH(s->qr, B * (size_t)c->q_lora_rank);
    SCRATCH(s->kvc, B * hd);
    SCRATCH(s->pk, B * cw_max);
    SCRATCH(s->pg, B * cw_max);
    SCRATCH(s->iq, B * ih * ihd);
    SCRATCH(s->iw, B * ih);
    SCRATCH(s->att, B * H * hd);
    SCRATCH(s->og, B * G * R);
    SCRATCH(s->gin, B * H * hd / G + 1);
    SCRATCH(s->go, B * R + 1);
#undef P
#undef STATE
#undef SCRATCH
    return n;
}

void ms_cattn_engine_free(ms_engine *e) {
    struct ms_cattn_state *s = e->cattn;
    if (!s) return;
    free(s->L);
    free(s);
    e->cattn = NULL;
}

void ms_cattn_engine_reset(ms_engine *e) {
    struct ms_cattn_state *s = e->cattn;
    for (int l = 0; s && l < e->m->cfg.n_layers; l++) s->L[l].n_comp = 0;
}

/* Append the raw rows of positions pos0..pos0+n-1 (backend compress_append) and count
 * the entries whose window closes. */
static int compress_rows(ms_engine *e, const ms_compressor_weights *w, float *raw_kv, float *raw_g, float *entries,
                         const float *pk, const float *pg, int rate, int64_t dim, int overlap, int64_t pos0, int n,
                         int64_t *n_comp, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    ms_compress_args a = {.raw_kv = raw_kv, .raw_g = raw_g, .entries = entries, .kv = pk, .g = pg, .ape = w->ape,
                          .norm = w->norm, .rope = &c->rope, .rate = rate, .overlap = overlap, .n = n, .dim = dim,
                          .pos0 = pos0, .eps = (float)c->rms_eps};
    int rc = e->be->ops->compress_append(e->be, &a, err);
    if (rc) return rc;
    for (int t = 0; t < n; t++)
        if ((pos0 + t + 1) % rate == 0) *n_comp = (pos0 + t) / rate + 1;
    return MS_OK;
}

/* One sequence's rows: xn [n, hidden] at the sequence engine e's positions, into out [n, hidden];
 * q [n, H * hd] scratch (the lead's query rows); the rest is e's own state and scratch. */
static int compressed_seq(ms_engine *e, int layer, int n, const float *xn, float *q, float *out, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *Lw = &e->w->layers[layer];
    const ms_cattn_weights *w = &Lw->ca;
    struct ms_cattn_state *s = e->cattn;
    ms_backend *be = e->be;
    if (!s) return ms_fail(err, MS_ERR_ARG, "layer %d: compressed attention without its state", layer);
    ca_layer *L = &s->L[layer];
    int64_t H = c->n_heads, hd = c->head_dim, W = MAX2(c->layer_window[layer], 1), pos0 = e->n_past;
    int rate = c->layer_compress[layer], csa = c->layer_csa[layer];
    const ms_rope *rope = c->layer_rope[layer] ? &c->rope_alt : &c->rope;
    float eps = (float)c->rms_eps;
    /* queries: RoPE on each head's trailing rope dims */
    be->ops->matmul(be, s->qr, xn, n, &Lw->q_a, 0);
    be->ops->rmsnorm(be, s->qr, s->qr, Lw->q_a_norm, n, c->q_lora_rank, eps);
    be->ops->matmul(be, q, s->qr, n, &Lw->q_b, 0);
    be->ops->rmsnorm(be, q, q, NULL, n * H, hd, eps);
    be->ops->rope(be, rope, q, n, H * hd, H, hd, hd - rope->dim, pos0, 1.0f);
    /* the shared key = value */
    be->ops->matmul(be, s->kvc, xn, n, &w->wkv, 0);
    be->ops->rmsnorm(be, s->kvc, s->kvc, w->kv_norm, n, hd, eps);
    be->ops->rope(be, rope, s->kvc, n, hd, 1, hd, hd - rope->dim, pos0, 1.0f);
    /* compressed entries closing in this chunk */
    int rc;
    if (rate) {
        be->ops->matmul(be, s->pk, xn, n, &w->comp.wkv, 0);
        be->ops->matmul(be, s->pg, xn, n, &w->comp.wgate, 0);
        int64_t nc = L->n_comp;
        if ((rc = compress_rows(e, &w->comp, L->craw_kv, L->craw_g, L->comp, s->pk, s->pg, rate, hd, csa, pos0, n, &nc,
                                err)))
            return ms_wrap(err, "layer %d compressor", layer);
        if (csa) {
            int64_t ihd = c->dsa_head_dim, nci = L->n_comp;
            be->ops->matmul(be, s->pk, xn, n, &w->icomp.wkv, 0);
            be->ops->matmul(be, s->pg, xn, n, &w->icomp.wgate, 0);
            if ((rc = compress_rows(e, &w->icomp, L->iraw_kv, L->iraw_g, L->icomp, s->pk, s->pg, rate, ihd, 1, pos0,
                                    n, &nci, err)))
                return ms_wrap(err, "layer %d indexer compressor", layer);
            be->ops->matmul(be, s->iq, s->qr, n, &w->iwq_b, 0);
            be->ops->rope(be, &c->rope, s->iq, n, c->dsa_heads * ihd, c->dsa_heads, ihd, ihd - c->rope.dim, pos0,
                          1.0f);
            be->ops->matmul(be, s->iw, xn, n, &w->iweights, 0);
        }
        L->n_comp = nc;
    }
    ms_cattn_args a = {.out = s->att, .q = q, .kv = s->kvc, .win = L->win, .comp = L->comp, .iq = s->iq,
                       .iw = s->iw, .icomp = L->icomp, .sinks = Lw->sinks, .n = n, .csa = csa, .pos0 = pos0, .H = H,
                       .hd = hd, .window = W, .rate = rate, .n_comp = rate ? L->n_comp : 0,
                       .idx_heads = c->dsa_heads, .idx_dim = c->dsa_head_dim, .topk = c->dsa_topk,
                       .fwd_len = e->fwd_len, .scale = (float)c->attn_scale};
    if ((rc = be->ops->attn_compressed(be, &a, err))) return ms_wrap(err, "layer %d", layer);
    /* the output's rope dims rotate back by -p */
    be->ops->rope(be, rope, s->att, n, H * hd, H, hd, hd - rope->dim, pos0, -1.0f);
    /* keep the last W keys */
    for (int t = n - W > 0 ? (int)(n - W) : 0; t < n; t++)
        be->ops->copy(be, L->win + ((pos0 + t) % W) * hd, s->kvc + (int64_t)t * hd, (size_t)hd * 4);
    /* grouped low-rank output projection */
    int64_t G = c->o_groups, R = c->o_lora_rank, ig = H * hd / G;
    for (int64_t g = 0; g < G; g++) {
        ms_qmat wg;
        if (!ms_qmat_row_range(&w->wo_a, g * R, R, &wg))
            return ms_fail(err, MS_ERR_UNSUPPORTED, "layer %d: wo_a group %lld cannot be viewed in place", layer,
                           (long long)g);
        be->ops->copy_rows(be, s->gin, ig, s->att + g * ig, H * hd, n, ig);
        be->ops->matmul(be, s->go, s->gin, n, &wg, 0);
        be->ops->copy_rows(be, s->og + g * R, G * R, s->go, R, n, R);
    }
    be->ops->matmul(be, out, s->og, n, &w->wo_b, 0);
    return MS_OK;
}

/* The whole sublayer per sequence (its window, rings and entries are per-sequence state). */
int ms_attn_compressed(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    for (int i = 0; i < e->n_seqs; i++) {
        const ms_fwd_seq *sq = &e->seqs[i];
        int rc = compressed_seq(sq->e, layer, sq->n, e->xn + (int64_t)sq->row * c->hidden,
                                e->q + (int64_t)sq->row * c->n_heads * c->head_dim, out + (int64_t)sq->row * c->hidden,
                                err);
        if (rc) return rc;
    }
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
        if (e->staged && (l < e->l0 || l >= e->l1)) continue; /* another stage engine's */
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
                                           .cap_rows = e->max_ctx / (P[i].per ? P[i].per : 1) + 1, .no_truncate = why,
                                           .be = e->be};
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
