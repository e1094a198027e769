/* mhc.c — manifold-constrained hyper-connections (see mhc.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/mhc.h"

static void rows_norm(float *m, int n, float eps) {
    for (int i = 0; i < n; i++) {
        float s = 0;
        for (int j = 0; j < n; j++) s += m[i * n + j];
        for (int j = 0; j < n; j++) m[i * n + j] /= s + eps;
    }
}

static void cols_norm(float *m, int n, float eps) {
    for (int j = 0; j < n; j++) {
        float s = 0;
        for (int i = 0; i < n; i++) s += m[i * n + j];
        for (int i = 0; i < n; i++) m[i * n + j] /= s + eps;
    }
}

int ms_mhc_sinkhorn(float *m, int n, int iters, float eps, ms_err *err) {
    if (n < 1 || n > 1024 || iters < 1 || !m)
        return ms_fail(err, MS_ERR_ARG, "mhc sinkhorn: bad size %d or iterations %d", n, iters);
    for (int i = 0; i < n; i++) {
        ms_softmax(m + i * n, n);
        for (int j = 0; j < n; j++) m[i * n + j] += eps;
    }
    cols_norm(m, n, eps);
    for (int it = 1; it < iters; it++) {
        rows_norm(m, n, eps);
        cols_norm(m, n, eps);
    }
    return MS_OK;
}

static int check_fn(const ms_qmat *fn, int rows, int hc, int dim, const char *what, ms_err *err) {
    if (!fn || fn->rows != rows || fn->cols != (int64_t)hc * dim)
        return ms_fail(err, MS_ERR_SHAPE, "mhc: %s is [%lld, %lld], expected [%d, %lld]", what,
                       fn ? (long long)fn->rows : -1LL, fn ? (long long)fn->cols : -1LL, rows, (long long)hc * dim);
    return MS_OK;
}

/* r[t] = 1 / sqrt(mean(x_t^2) + eps) over the flattened streams */
static void inv_rms(const float *x, int n, int64_t d, float eps, float *r) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * d;
        double ss = 0;
        for (int64_t i = 0; i < d; i++) ss += (double)xt[i] * xt[i];
        r[t] = (float)(1.0 / sqrt(ss / (double)d + eps));
    }
}

static void collapse(const float *streams, const float *w, int hc, int dim, float *out) {
    for (int c = 0; c < dim; c++) out[c] = 0;
    for (int i = 0; i < hc; i++) {
        const float *s = streams + (size_t)i * dim;
        for (int c = 0; c < dim; c++) out[c] += w[i] * s[c];
    }
}

int ms_mhc_pre(ms_pool *pool, const ms_mhc *h, const float *streams, int n, float *collapsed, float *post,
               float *comb, ms_err *err) {
    if (!h || h->hc < 1 || h->hc > 64 || h->dim < 1 || !h->base || !h->scale || h->sinkhorn_iters < 1)
        return ms_fail(err, MS_ERR_ARG, "mhc: bad hyper-connection description");
    int hc = h->hc, dim = h->dim, mix = (2 + hc) * hc;
    int rc = check_fn(h->fn, mix, hc, dim, "fn", err);
    if (rc) return rc;
    if (n < 0) return ms_fail(err, MS_ERR_ARG, "mhc: negative token count %d", n);
    if (n == 0) return MS_OK;
    if (!streams || !collapsed || !post || !comb) return ms_fail(err, MS_ERR_ARG, "mhc: missing buffer");
    float *m = malloc(sizeof(float) * ((size_t)n * mix + (size_t)n));
    if (!m) return ms_fail(err, MS_ERR_NOMEM, "mhc: no memory for %d x %d mixes", n, mix);
    float *r = m + (size_t)n * mix;
    ms_matmul(pool, m, streams, n, h->fn);
    inv_rms(streams, n, (int64_t)hc * dim, h->norm_eps, r);
    for (int t = 0; t < n; t++) {
        float *mt = m + (size_t)t * mix;
        float pre[hc];
        for (int i = 0; i < mix; i++) mt[i] *= r[t];
        for (int i = 0; i < hc; i++) {
            pre[i] = ms_sigmoid(mt[i] * h->scale[0] + h->base[i]) + h->hc_eps;
            post[(size_t)t * hc + i] = 2.0f * ms_sigmoid(mt[hc + i] * h->scale[1] + h->base[hc + i]);
        }
        float *ct = comb + (size_t)t * hc * hc;
        for (int i = 0; i < hc * hc; i++) ct[i] = mt[2 * hc + i] * h->scale[2] + h->base[2 * hc + i];
        ms_mhc_sinkhorn(ct, hc, h->sinkhorn_iters, h->hc_eps, NULL);
        collapse(streams + (size_t)t * hc * dim, pre, hc, dim, collapsed + (size_t)t * dim);
    }
    free(m);
    return MS_OK;
}

void ms_mhc_post(const float *in, const float *y, const float *post, const float *comb, int n, int hc, int dim,
                 float *out) {
    for (int t = 0; t < n; t++) {
        const float *it = in + (size_t)t * hc * dim, *yt = y + (size_t)t * dim;
        const float *pt = post + (size_t)t * hc, *ct = comb + (size_t)t * hc * hc;
        float *ot = out + (size_t)t * hc * dim;
        for (int j = 0; j < hc; j++) {
            float *oj = ot + (size_t)j * dim;
            for (int c = 0; c < dim; c++) oj[c] = pt[j] * yt[c];
            for (int i = 0; i < hc; i++) {
                float w = ct[i * hc + j];
                const float *si = it + (size_t)i * dim;
                for (int c = 0; c < dim; c++) oj[c] += w * si[c];
            }
        }
    }
}

void ms_mhc_expand(const float *x, int n, int hc, int dim, float *out) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < hc; i++) memcpy(out + ((size_t)t * hc + i) * dim, x + (size_t)t * dim, sizeof(float) * dim);
}

void ms_mhc_head_mean(const float *streams, int n, int hc, int dim, float *out) {
    for (int t = 0; t < n; t++) {
        const float *st = streams + (size_t)t * hc * dim;
        float *ot = out + (size_t)t * dim;
        for (int c = 0; c < dim; c++) {
            float s = 0;
            for (int i = 0; i < hc; i++) s += st[(size_t)i * dim + c];
            ot[c] = s / (float)hc;
        }
    }
}

int ms_mhc_head_weighted(ms_pool *pool, const ms_qmat *fn, const float *base, const float *scale, int hc, int dim,
                         float hc_eps, float norm_eps, const float *streams, int n, float *out, ms_err *err) {
    if (hc < 1 || hc > 64 || dim < 1 || !base || !scale || n < 0)
        return ms_fail(err, MS_ERR_ARG, "mhc head: bad arguments (hc %d, dim %d, n %d)", hc, dim, n);
    int rc = check_fn(fn, hc, hc, dim, "hc_head fn", err);
    if (rc) return rc;
    if (n == 0) return MS_OK;
    if (!streams || !out) return ms_fail(err, MS_ERR_ARG, "mhc head: missing buffer");
    float *m = malloc(sizeof(float) * ((size_t)n * hc + (size_t)n));
    if (!m) return ms_fail(err, MS_ERR_NOMEM, "mhc head: no memory");
    float *r = m + (size_t)n * hc;
    ms_matmul(pool, m, streams, n, fn);
    inv_rms(streams, n, (int64_t)hc * dim, norm_eps, r);
    for (int t = 0; t < n; t++) {
        float pre[hc];
        for (int i = 0; i < hc; i++) pre[i] = ms_sigmoid(m[(size_t)t * hc + i] * r[t] * scale[0] + base[i]) + hc_eps;
        collapse(streams + (size_t)t * hc * dim, pre, hc, dim, out + (size_t)t * dim);
    }
    free(m);
    return MS_OK;
}
