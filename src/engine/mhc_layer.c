/* mhc_layer.c — manifold-constrained hyper-connections in the engine's layer
 * loop (ops/mhc.h): with hc_mult > 1 the residual is hc_mult streams per
 * token; each sublayer reads their learned collapse (then its usual norm) and
 * its output is mixed back into every stream; the streams' mean is the final
 * hidden state (GLM-5-Next's hyper head). The streams are backend memory; the
 * math is the backend's mhc_* ops. */
#include <stdlib.h>

#include "engine/engine_internal.h"

typedef struct ms_mhc_state {
    int hc;
    float *s, *s2;   /* [be] [B, hc, hidden] the streams, and the next ones */
    float *col;      /* [be] [B, hidden] collapsed sublayer input */
    float *post;     /* [be] [B, hc] */
    float *comb;     /* [be] [B, hc, hc] */
} ms_mhc_state;

int ms_mhc_engine_init(ms_engine *e, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    if (c->hc_mult <= 1) return MS_OK;
    ms_mhc_state *s = calloc(1, sizeof *s);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "out of memory for the hyper-connection state");
    e->mhc = s;
    s->hc = (int)c->hc_mult;
    return MS_OK;
}

int ms_mhc_engine_buffers(ms_engine *e, const ms_config *c, size_t T, size_t B, ms_buf_spec *b, int n) {
    if (c->hc_mult <= 1) return n;
    ms_mhc_state *s = e ? e->mhc : NULL;
    size_t D = (size_t)c->hidden, H = (size_t)c->hc_mult;
#define P(f) (s ? (void **)&(f) : NULL)
    n = ms_buf_add(b, n, P(s->s), sizeof(float) * B * H * D, 0, 0);
    n = ms_buf_add(b, n, P(s->s2), sizeof(float) * B * H * D, 0, 0);
    n = ms_buf_add(b, n, P(s->col), sizeof(float) * B * D, 0, 0);
    n = ms_buf_add(b, n, P(s->post), sizeof(float) * B * H, 0, 0);
    n = ms_buf_add(b, n, P(s->comb), sizeof(float) * B * H * H, 0, 0);
#undef P
    return n;
}

void ms_mhc_engine_free(ms_engine *e) {
    free(e->mhc);
    e->mhc = NULL;
}

void ms_mhc_engine_begin(ms_engine *e, int n) {
    e->be->ops->mhc_expand(e->be, e->x, n, e->mhc->hc, (int)e->m->cfg.hidden, e->mhc->s);
}

int ms_mhc_engine_pre(ms_engine *e, int layer, int ffn, int n, const float **collapsed, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->w->layers[layer];
    ms_mhc_state *s = e->mhc;
    ms_mhc h = {.hc = s->hc, .dim = (int)c->hidden, .fn = ffn ? &L->hc_ffn_fn : &L->hc_attn_fn,
                .base = ffn ? L->hc_ffn_base : L->hc_attn_base, .scale = ffn ? L->hc_ffn_scale : L->hc_attn_scale,
                .sinkhorn_iters = (int)c->hc_sinkhorn_iters, .hc_eps = (float)c->hc_eps,
                .norm_eps = (float)c->rms_eps};
    int rc = e->be->ops->mhc_pre(e->be, &h, s->s, n, s->col, s->post, s->comb, err);
    if (rc) return ms_wrap(err, "layer %d %s hyper-connection", layer, ffn ? "feed-forward" : "attention");
    *collapsed = s->col;
    return MS_OK;
}

void ms_mhc_engine_post(ms_engine *e, int n, const float *y) {
    ms_mhc_state *s = e->mhc;
    e->be->ops->mhc_post(e->be, s->s, y, s->post, s->comb, n, s->hc, (int)e->m->cfg.hidden, s->s2);
    float *t = s->s;
    s->s = s->s2;
    s->s2 = t;
}

float *ms_mhc_engine_streams(ms_engine *e) { return e->mhc ? e->mhc->s : NULL; }

int ms_mhc_engine_end(ms_engine *e, int n, ms_err *err) {
    const ms_model *m = e->w;
    const ms_config *c = &e->m->cfg;
    if (!c->hc_head_weighted) {
        e->be->ops->mhc_head_mean(e->be, e->mhc->s, n, e->mhc->hc, (int)c->hidden, e->x);
        return MS_OK;
    }
    int rc = e->be->ops->mhc_head_weighted(e->be, &m->hc_head_fn, m->hc_head_base, m->hc_head_scale, e->mhc->hc,
                                           (int)c->hidden, (float)c->hc_eps, (float)c->rms_eps, e->mhc->s, n, e->x,
                                           err);
    return rc ? ms_wrap(err, "hyper head") : MS_OK;
}
