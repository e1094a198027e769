/* test_mhc.c — manifold-constrained hyper-connections against a float64
 * implementation written from the transformers 5.17 reference math
 * (Glm5NextTextHyperConnection / DeepseekV4HyperConnection, the hyper heads). */
#include <stdint.h>

#include "io/safetensors.h"
#include "ops/mhc.h"
#include "test.h"
#include "util/dtype.h"
#include "util/threadpool.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static double urand(void) { return ms_test_urand(&rng_state); }
static double nrand(void) { return sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand()); }

static double sig(double x) { return 1 / (1 + exp(-x)); }

/* reference Sinkhorn on logits (double) */
static void ref_sinkhorn(double *m, int n, int iters, double eps) {
    for (int i = 0; i < n; i++) {
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < n; j++) mx = fmax(mx, m[i * n + j]);
        for (int j = 0; j < n; j++) s += exp(m[i * n + j] - mx);
        for (int j = 0; j < n; j++) m[i * n + j] = exp(m[i * n + j] - mx) / s + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int i = 0; i < n; i++) {
                double s = 0;
                for (int j = 0; j < n; j++) s += m[i * n + j];
                for (int j = 0; j < n; j++) m[i * n + j] /= s + eps;
            }
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += m[i * n + j];
            for (int i = 0; i < n; i++) m[i * n + j] /= s + eps;
        }
    }
}

TEST(sinkhorn_is_doubly_stochastic_and_matches) {
    ms_err err = {0};
    for (int n = 1; n <= 6; n++)
        for (int iters = 1; iters <= 20; iters += 19) {
            float m[36];
            double r[36];
            for (int i = 0; i < n * n; i++) m[i] = (float)(2 * nrand()), r[i] = m[i];
            CHECK(ms_mhc_sinkhorn(m, n, iters, 1e-6f, &err) == MS_OK);
            ref_sinkhorn(r, n, iters, 1e-6);
            double e = 0;
            for (int i = 0; i < n * n; i++) e = fmax(e, fabs(m[i] - r[i]));
            CHECK_MSG(e < 1e-6, "n %d iters %d: %g", n, iters, e);
            if (iters == 20) { /* converged: rows and columns sum to ~1 */
                for (int i = 0; i < n; i++) {
                    double rs = 0, cs = 0;
                    for (int j = 0; j < n; j++) rs += m[i * n + j], cs += m[j * n + i];
                    CHECK_NEAR(rs, 1.0, 1e-3);
                    CHECK_NEAR(cs, 1.0, 1e-5);
                }
            }
        }
    float one = 3;
    CHECK(ms_mhc_sinkhorn(&one, 1, 0, 1e-6f, &err) == MS_ERR_ARG);
}

typedef struct {
    int hc, dim, iters;
    double hc_eps, norm_eps;
    const double *fn, *base, *scale; /* fn [(2+hc)*hc, hc*dim] */
} ref_hc;

/* one token: streams [hc*dim] -> collapsed [dim], post [hc], comb [hc*hc] */
static void ref_pre(const ref_hc *h, const float *x, double *collapsed, double *post, double *comb) {
    int hc = h->hc, D = h->dim, mix = (2 + hc) * hc, F = hc * D;
    double ss = 0;
    for (int i = 0; i < F; i++) ss += (double)x[i] * x[i];
    double r = 1 / sqrt(ss / F + h->norm_eps);
    double m[mix], pre[hc];
    for (int o = 0; o < mix; o++) {
        double a = 0;
        for (int i = 0; i < F; i++) a += h->fn[(size_t)o * F + i] * (x[i] * r);
        m[o] = a;
    }
    for (int i = 0; i < hc; i++) {
        pre[i] = sig(m[i] * h->scale[0] + h->base[i]) + h->hc_eps;
        post[i] = 2 * sig(m[hc + i] * h->scale[1] + h->base[hc + i]);
    }
    for (int i = 0; i < hc * hc; i++) comb[i] = m[2 * hc + i] * h->scale[2] + h->base[2 * hc + i];
    ref_sinkhorn(comb, hc, h->iters, h->hc_eps);
    for (int c = 0; c < D; c++) {
        double s = 0;
        for (int i = 0; i < hc; i++) s += pre[i] * x[i * D + c];
        collapsed[c] = s;
    }
}

static void run_hc(int hc, int dim, int n, int bf16, ms_pool *pool) {
    int mix = (2 + hc) * hc, F = hc * dim;
    double *fn = malloc(sizeof(double) * mix * F), base[mix], scale[3];
    float *fn32 = malloc(sizeof(float) * mix * F);
    uint16_t *fn16 = malloc(sizeof(uint16_t) * mix * F);
    float basef[mix], scalef[3];
    for (int i = 0; i < mix * F; i++) {
        float v = (float)(0.3 * nrand());
        fn16[i] = ms_f32_to_bf16(v);
        fn32[i] = bf16 ? ms_bf16_to_f32(fn16[i]) : v;
        fn[i] = fn32[i];
    }
    for (int i = 0; i < mix; i++) basef[i] = (float)(0.5 * nrand()), base[i] = basef[i];
    for (int i = 0; i < 3; i++) scalef[i] = (float)(1 + 0.3 * nrand()), scale[i] = scalef[i];
    ms_qmat q = {.dtype = bf16 ? MS_DT_BF16 : MS_DT_F32, .rows = mix, .cols = F, .data = bf16 ? (void *)fn16 : (void *)fn32};
    ms_mhc h = {.hc = hc, .dim = dim, .fn = &q, .base = basef, .scale = scalef, .sinkhorn_iters = 5, .hc_eps = 1e-6f,
                .norm_eps = 1e-6f};
    ref_hc r = {.hc = hc, .dim = dim, .iters = 5, .hc_eps = 1e-6, .norm_eps = 1e-6, .fn = fn, .base = base, .scale = scale};
    float *x = malloc(sizeof(float) * n * F), *col = malloc(sizeof(float) * n * dim), *post = malloc(sizeof(float) * n * hc);
    float *comb = malloc(sizeof(float) * n * hc * hc), *y = malloc(sizeof(float) * n * dim), *out = malloc(sizeof(float) * n * F);
    for (int i = 0; i < n * F; i++) x[i] = (float)(3 * nrand());
    for (int i = 0; i < n * dim; i++) y[i] = (float)nrand();
    ms_err err = {0};
    CHECK(ms_mhc_pre(pool, &h, x, n, col, post, comb, &err) == MS_OK);
    ms_mhc_post(x, y, post, comb, n, hc, dim, out);
    double e_col = 0, e_post = 0, e_comb = 0, e_out = 0, e_head = 0;
    double rc[dim], rp[hc], rm[hc * hc];
    float *head = malloc(sizeof(float) * n * dim);
    ms_mhc_head_mean(x, n, hc, dim, head);
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * F;
        ref_pre(&r, xt, rc, rp, rm);
        for (int c = 0; c < dim; c++) e_col = fmax(e_col, fabs(col[t * dim + c] - rc[c]) / (1 + fabs(rc[c])));
        for (int i = 0; i < hc; i++) e_post = fmax(e_post, fabs(post[t * hc + i] - rp[i]));
        for (int i = 0; i < hc * hc; i++) e_comb = fmax(e_comb, fabs(comb[t * hc * hc + i] - rm[i]));
        for (int j = 0; j < hc; j++)
            for (int c = 0; c < dim; c++) {
                /* new stream j = post_j * y + sum_i comb[i][j] * stream_i  (comb transposed, as the reference) */
                double v = rp[j] * y[t * dim + c];
                for (int i = 0; i < hc; i++) v += rm[i * hc + j] * xt[i * dim + c];
                e_out = fmax(e_out, fabs(out[(size_t)t * F + j * dim + c] - v) / (1 + fabs(v)));
            }
        for (int c = 0; c < dim; c++) {
            double s = 0;
            for (int i = 0; i < hc; i++) s += xt[i * dim + c];
            e_head = fmax(e_head, fabs(head[t * dim + c] - s / hc));
        }
    }
    CHECK_MSG(e_col < 1e-5 && e_post < 1e-5 && e_comb < 1e-5 && e_out < 1e-5 && e_head < 1e-5,
              "hc %d dim %d bf16 %d: collapsed %g post %g comb %g out %g head %g", hc, dim, bf16, e_col, e_post, e_comb,
              e_out, e_head);
    /* wrong fn shape is refused */
    ms_qmat badq = q;
    badq.rows = mix - 1;
    h.fn = &badq;
    CHECK(ms_mhc_pre(pool, &h, x, n, col, post, comb, &err) == MS_ERR_SHAPE);
    free(fn), free(fn32), free(fn16), free(x), free(col), free(post), free(comb), free(y), free(out), free(head);
}

TEST(hyper_connection_matches_float64) {
    ms_pool *pool = ms_pool_create(2);
    run_hc(2, 64, 5, 1, pool); /* the glm5_next fixture's hc_mult and width, bf16 fn as stored */
    run_hc(4, 48, 3, 0, NULL); /* deepseek_v4's default hc_mult */
    run_hc(1, 16, 2, 0, pool);
    run_hc(3, 7, 4, 1, NULL);
    ms_pool_destroy(pool);
}

TEST(weighted_hyper_head_matches_float64) {
    int hc = 4, dim = 24, n = 3, F = hc * dim;
    float fn[hc * F], base[hc], scale[1] = {0.8f}, x[n * F], out[n * dim];
    for (int i = 0; i < hc * F; i++) fn[i] = (float)(0.2 * nrand());
    for (int i = 0; i < hc; i++) base[i] = (float)(0.3 * nrand());
    for (int i = 0; i < n * F; i++) x[i] = (float)(2 * nrand());
    ms_qmat q = {.dtype = MS_DT_F32, .rows = hc, .cols = F, .data = fn};
    ms_err err = {0};
    CHECK(ms_mhc_head_weighted(NULL, &q, base, scale, hc, dim, 1e-6f, 1e-6f, x, n, out, &err) == MS_OK);
    double e = 0;
    for (int t = 0; t < n; t++) {
        const float *xt = x + t * F;
        double ss = 0;
        for (int i = 0; i < F; i++) ss += (double)xt[i] * xt[i];
        double r = 1 / sqrt(ss / F + 1e-6), pre[hc];
        for (int i = 0; i < hc; i++) {
            double m = 0;
            for (int c = 0; c < F; c++) m += (double)fn[i * F + c] * xt[c] * r;
            pre[i] = sig(m * scale[0] + base[i]) + 1e-6;
        }
        for (int c = 0; c < dim; c++) {
            double v = 0;
            for (int i = 0; i < hc; i++) v += pre[i] * xt[i * dim + c];
            e = fmax(e, fabs(out[t * dim + c] - v) / (1 + fabs(v)));
        }
    }
    CHECK_MSG(e < 1e-5, "weighted head differs by %g", e);
    float ex[2 * 3 * 5], xx[2 * 5];
    for (int i = 0; i < 10; i++) xx[i] = (float)i;
    ms_mhc_expand(xx, 2, 3, 5, ex);
    CHECK(ex[0] == 0 && ex[5] == 0 && ex[10] == 0 && ex[15] == 5 && ex[29] == 9);
    CHECK(ms_mhc_head_weighted(NULL, &q, base, scale, hc + 1, dim, 1e-6f, 1e-6f, x, n, out, &err) == MS_ERR_SHAPE);
}

/* transformers' own modules (tools/gen_dsa_mhc_refs.py: Glm5NextTextHyperConnection,
 * DeepseekV4HyperConnection — identical — DeepseekV4HyperHead, Glm5NextTextHyperHead),
 * float64 with random parameters, outputs stored as float32. */
static const ms_tensor *need(const ms_checkpoint *ck, const char *set, const char *name) {
    char full[64];
    snprintf(full, sizeof full, "%s.%s", set, name);
    const ms_tensor *t = ms_checkpoint_find(ck, full);
    CHECK_MSG(t != NULL, "missing %s", full);
    return t;
}

static double maxdiff(const float *a, const ms_tensor *b) {
    double e = 0;
    const float *bf = b->data;
    for (uint64_t i = 0; i < b->nelem; i++) e = fmax(e, fabs(a[i] - bf[i]) / (1 + fabs(bf[i])));
    return e;
}

TEST(matches_transformers_modules) {
    ms_checkpoint ck;
    ms_err err = {0};
    int rc = ms_checkpoint_open("tests/data/mhc_ref.safetensors", &ck, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    if (rc) return;
    const char *sets[] = {"a", "b", "c"};
    for (int si = 0; si < 3; si++) {
        const char *S = sets[si];
        const ms_tensor *meta = need(&ck, S, "meta"), *eps = need(&ck, S, "eps"), *fn = need(&ck, S, "fn");
        const ms_tensor *base = need(&ck, S, "base"), *scale = need(&ck, S, "scale"), *x = need(&ck, S, "x");
        const ms_tensor *y = need(&ck, S, "y"), *post = need(&ck, S, "post"), *comb = need(&ck, S, "comb");
        const ms_tensor *col = need(&ck, S, "collapsed"), *nw = need(&ck, S, "new"), *hfn = need(&ck, S, "head_fn");
        const ms_tensor *hb = need(&ck, S, "head_base"), *hs = need(&ck, S, "head_scale");
        const ms_tensor *hw = need(&ck, S, "head_weighted"), *hm = need(&ck, S, "head_mean");
        if (!(meta && eps && fn && base && scale && x && y && post && comb && col && nw && hfn && hb && hs && hw && hm))
            break;
        const int32_t *m = meta->data;
        int hc = m[0], dim = m[1], iters = m[2], n = (int)x->shape[0];
        CHECK(fn->dtype == MS_DT_BF16 && fn->shape[0] == (2 + hc) * hc && fn->shape[1] == hc * dim);
        ms_qmat q = {.dtype = fn->dtype, .rows = fn->shape[0], .cols = fn->shape[1], .data = fn->data};
        ms_mhc h = {.hc = hc, .dim = dim, .fn = &q, .base = base->data, .scale = scale->data, .sinkhorn_iters = iters,
                    .hc_eps = ((const float *)eps->data)[0], .norm_eps = 1e-6f};
        float o_col[n * dim], o_post[n * hc], o_comb[n * hc * hc], o_new[n * hc * dim], o_hw[n * dim], o_hm[n * dim];
        CHECK(ms_mhc_pre(NULL, &h, x->data, n, o_col, o_post, o_comb, &err) == MS_OK);
        ms_mhc_post(x->data, y->data, o_post, o_comb, n, hc, dim, o_new);
        ms_qmat hq = {.dtype = hfn->dtype, .rows = hfn->shape[0], .cols = hfn->shape[1], .data = hfn->data};
        CHECK(ms_mhc_head_weighted(NULL, &hq, hb->data, hs->data, hc, dim, h.hc_eps, 1e-6f, x->data, n, o_hw, &err) ==
              MS_OK);
        ms_mhc_head_mean(x->data, n, hc, dim, o_hm);
        double e[6] = {maxdiff(o_col, col), maxdiff(o_post, post), maxdiff(o_comb, comb), maxdiff(o_new, nw),
                       maxdiff(o_hw, hw), maxdiff(o_hm, hm)};
        for (int i = 0; i < 6; i++)
            CHECK_MSG(e[i] < 2e-6, "set %s (hc %d, iters %d): output %d differs by %g", S, hc, iters, i, e[i]);
    }
    ms_checkpoint_close(&ck);
}

TEST_MAIN()
