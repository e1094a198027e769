/* test_gpu_backend.c — the GPU backend (backend_gpu.h) op by op against the CPU backend on the
 * same inputs: dense and quantized matmuls, the GEMMs, routing, fused and routed experts,
 * attention, linear attention, DSA, compressed attention and mHC. The tolerances are derived as
 * test_gpu.c's head says. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "backend/gpu/gpu.h"
#include "model/config.h"
#include "ops/ops.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/gpu/backend_gpu.h"
#include "backend/cpu/linear_attn.h"
#include "test.h"
#include "test_gpu.h"

/* ---------------------------------------------- the GPU backend against the CPU backend */

static ms_backend *g_gbe;
ms_backend *gbe(void) {
    if (g_gbe) return g_gbe;
    ms_err err = {0};
    if (ms_backend_gpu_create(0, &g_gbe, &err)) {
        fprintf(stderr, "test_gpu: GPU backend: %s\n", err.msg);
        exit(1);
    }
    ms_config c;
    memset(&c, 0, sizeof c);
    c.n_heads = 64, c.head_dim = 128;
    CHECK(g_gbe->ops->reserve(g_gbe, &c, 4096, 16, &err) == MS_OK);
    return g_gbe;
}
/* A GPU backend opened with environment variable var set to val (the A/B switches are read when
 * a context opens), reserved as gbe(); cached in *slot. */
static ms_backend *env_gbe(ms_backend **slot, const char *var, const char *val) {
    if (*slot) return *slot;
    ms_err err = {0};
    setenv(var, val, 1);
    int rc = ms_backend_gpu_create(0, slot, &err);
    unsetenv(var);
    if (rc) {
        fprintf(stderr, "test_gpu: GPU backend: %s\n", err.msg);
        exit(1);
    }
    ms_config c;
    memset(&c, 0, sizeof c);
    c.n_heads = 64, c.head_dim = 128;
    CHECK((*slot)->ops->reserve(*slot, &c, 4096, 16, &err) == MS_OK);
    return *slot;
}
/* A second GPU backend on the earlier decode kernels (MS_GPU_LEGACY_DECODE=1 while it opens):
 * the routed experts in four launches, the block router, the loop add_rmsnorm, router and route apart. */
static ms_backend *g_lbe;
static ms_backend *legacy_gbe(void) { return env_gbe(&g_lbe, "MS_GPU_LEGACY_DECODE", "1"); }
/* A third with the routed experts' early down (MS_GPU_RX=early while it opens). */
static ms_backend *g_xbe;
static ms_backend *early_gbe(void) { return env_gbe(&g_xbe, "MS_GPU_RX", "early"); }
float *bup(const float *h, int64_t n) {
    void *d = NULL;
    ms_err err = {0};
    if (gbe()->ops->alloc(gbe(), (size_t)n * 4, &d, &err) || gbe()->ops->upload(gbe(), d, h, (size_t)n * 4, &err)) {
        fprintf(stderr, "test_gpu: backend buffer: %s\n", err.msg);
        exit(1);
    }
    return (float *)d;
}
float *bget(const float *d, int64_t n) {
    float *h = malloc((size_t)n * 4);
    ms_err err = {0};
    int rc = gbe()->ops->download(gbe(), h, d, (size_t)n * 4, &err);
    CHECK_MSG(rc == MS_OK, "download: %s", err.msg);
    return h;
}
static float *dupv(const float *h, int64_t n) {
    float *c = malloc((size_t)n * 4);
    memcpy(c, h, (size_t)n * 4);
    return c;
}
double maxabs(const float *v, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(v[i]));
    return m;
}
/* got vs ref elementwise within rel |ref| + abs; prints the worst ratio */
void cmpv(const char *what, const float *got, const float *ref, int64_t n, double rel, double abs_) {
    double worst = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double tol = rel * fabs(ref[i]) + abs_, d = fabs((double)got[i] - ref[i]);
        double e = tol > 0 ? d / tol : (d == 0 ? 0 : INFINITY);
        if (isnan(ref[i]) && isnan(got[i])) e = 0;
        if (!(e <= 1)) bad++;
        if (e > worst) worst = e;
    }
    printf("  backend %-52s max err/bound %.3f%s\n", what, worst, rel == 0 && abs_ == 0 ? " (exact)" : "");
    CHECK_MSG(bad == 0, "%s: %lld of %lld out of bound", what, (long long)bad, (long long)n);
}
void gfree(void *d) { gbe()->ops->free(gbe(), d); }
/* the device copy of a buffer := the host one */
void same(float *d, const float *h, int64_t n) {
    ms_err err = {0};
    CHECK(gbe()->ops->upload(gbe(), d, h, (size_t)n * 4, &err) == MS_OK);
}

TEST(backend_dense) {
    SKIP_UNLESS_SELECTED("backend_dense");
    ms_backend *C = cpu(), *G = gbe();
    ms_err err = {0};
    /* matmul in every dtype, n past the kernel's 8 tokens per pass: any summation order is within N u sum|terms| */
    const wkind *kinds[] = {&K_F32, &K_BF16, &K_FP8, &K_F4};
    for (int ki = 0; ki < 4; ki++) {
        int64_t rows = 333, cols = 1024;
        int n = 11;
        ms_qmat w = make_w(kinds[ki], rows, cols), dw;
        CHECK(G->ops->place_qmat(G, &w, &dw, &err) == MS_OK);
        float *x = randv((int64_t)n * cols, 1.0f), *ref = malloc((size_t)n * rows * 4);
        float *dx = bup(x, (int64_t)n * cols), *dy = bup(ref, (int64_t)n * rows);
        C->ops->matmul(C, ref, x, n, &w, 0);
        G->ops->matmul(G, dy, dx, n, &dw, 0);
        float *got = bget(dy, (int64_t)n * rows);
        double *l1 = malloc((size_t)n * rows * 8);
        l1_rows(&w, x, n, l1);
        double worst = 0;
        int bad = 0;
        for (int64_t i = 0; i < (int64_t)n * rows; i++) {
            double e = fabs(got[i] - ref[i]) / ((dot_bound(cols) + cols * U32) * l1[i] + 1e-30);
            if (!(e <= 1)) bad++;
            worst = fmax(worst, e);
        }
        printf("  backend matmul %-44s n=%d max err/bound %.3f\n", kinds[ki]->name, n, worst);
        CHECK_MSG(bad == 0, "backend matmul %s: %d out of bound", kinds[ki]->name, bad);
        gfree(dx), gfree(dy), free(x), free(ref), free(got), free(l1), free_w(&w);
    }
    /* elementwise ops: single roundings, equal on both (exact) */
    int64_t rows = 7, d = 2304, n = rows * d;
    float *x = randv(n, 1.0f), *y = randv(n, 1.0f), *b = randv(d, 1.0f), *gs = randv(rows, 2.0f);
    float *dx = bup(x, n), *dy = bup(y, n), *db = bup(b, d), *dgs = bup(gs, rows);
    float *hx = dupv(x, n), *hy = dupv(y, n);
    C->ops->add_bias(C, hx, b, rows, d), G->ops->add_bias(G, dx, db, rows, d);
    float *got = bget(dx, n);
    cmpv("add_bias", got, hx, n, 0, 0), free(got);
    C->ops->add(C, hy, hx, n), G->ops->add(G, dy, dx, n);
    got = bget(dy, n), cmpv("add", got, hy, n, 0, 0), free(got);
    C->ops->scale(C, hx, 0.37f, n), G->ops->scale(G, dx, 0.37f, n);
    got = bget(dx, n), cmpv("scale", got, hx, n, 0, 0), free(got);
    /* sigmoid: expf within 2 ulp (CUDA) and 1 (glibc), <= 3 more roundings each side */
    C->ops->mul_sigmoid(C, hx, hy, n), G->ops->mul_sigmoid(G, dx, dy, n);
    got = bget(dx, n), cmpv("mul_sigmoid", got, hx, n, 10 * U32, 1e-37), free(got);
    same(dx, hx, n), same(dy, hy, n); /* each op from equal inputs: earlier ops' roundings differ */
    C->ops->add_gated_rows(C, hy, hx, gs, rows, d), G->ops->add_gated_rows(G, dy, dx, dgs, rows, d);
    got = bget(dy, n), cmpv("add_gated_rows", got, hy, n, 0, 10 * U32 * (maxabs(hy, n) + maxabs(hx, n))), free(got);
    /* rmsnorm: sums of squares in any order (d u), 1/sqrt and the scaling; the CPU's vector kernel 2e-6 */
    same(dy, hy, n);
    C->ops->rmsnorm(C, hx, hy, b, rows, d, 1e-6f), G->ops->rmsnorm(G, dx, dy, db, rows, d, 1e-6f);
    got = bget(dx, n), cmpv("rmsnorm", got, hx, n, (d / 2.0 + 8) * U32 + 2e-6, 1e-30), free(got);
    /* layernorm (DBRX, PhiMoE): mean and variance summed in double on both, then a few float roundings
     * (a fused multiply-add or not) of terms up to |x - m| inv |w| + |b|; clamp: exact */
    same(dy, hy, n);
    C->ops->layernorm(C, hx, hy, b, b, rows, d, 1e-5f), G->ops->layernorm(G, dx, dy, db, db, rows, d, 1e-5f);
    got = bget(dx, n), cmpv("layernorm", got, hx, n, 8 * U32, 8 * U32 * (8 * maxabs(b, d) + 1)), free(got);
    same(dy, hy, n);
    C->ops->clamp(C, hy, -0.5f, 0.75f, n), G->ops->clamp(G, dy, -0.5f, 0.75f, n);
    got = bget(dy, n), cmpv("clamp", got, hy, n, 0, 0), free(got);
    same(dy, hy, n);
    /* copy_rows in place (the gated-attention compaction): exact */
    memcpy(hx, x, (size_t)n * 4);
    G->ops->upload(G, dx, x, (size_t)n * 4, &err);
    C->ops->copy_rows(C, hx, 64, hx, 128, n / 128, 64), G->ops->copy_rows(G, dx, 64, dx, 128, n / 128, 64);
    got = bget(dx, n), cmpv("copy_rows (in place)", got, hx, n / 2, 0, 0), free(got);
    /* split_gate_up in place, gather / scatter-add with a repeated row (in order), add_bias_any */
    memcpy(hx, x, (size_t)n * 4), G->ops->upload(G, dx, x, (size_t)n * 4, &err);
    C->ops->split_gate_up(C, hy, hx, rows, d / 2), G->ops->split_gate_up(G, dy, dx, rows, d / 2);
    got = bget(dy, n / 2), cmpv("split_gate_up (gate)", got, hy, n / 2, 0, 0), free(got);
    got = bget(dx, n / 2), cmpv("split_gate_up (up)", got, hx, n / 2, 0, 0), free(got);
    int ri[5] = {3, 0, 3, 6, 1};
    float rw[5] = {0.5f, -1.25f, 0.75f, 2.0f, 0.1f};
    memcpy(hx, x, (size_t)n * 4), G->ops->upload(G, dx, x, (size_t)n * 4, &err);
    C->ops->gather_rows(C, hy, hx, ri, 5, d), G->ops->gather_rows(G, dy, dx, ri, 5, d);
    got = bget(dy, 5 * d), cmpv("gather_rows", got, hy, 5 * d, 0, 0), free(got);
    C->ops->scatter_add_rows(C, hx, hy, ri, rw, 5, d), G->ops->scatter_add_rows(G, dx, dy, ri, rw, 5, d);
    /* each += may be one fused multiply-add on the GPU: u |w y| per step */
    got = bget(dx, n), cmpv("scatter_add_rows (repeated row)", got, hx, n, 0, 5 * 2 * U32 * 2 * (maxabs(x, n) + 2 * maxabs(hy, 5 * d))), free(got);
    uint16_t *bb = malloc((size_t)d * 2);
    for (int64_t i = 0; i < d; i++) bb[i] = ms_f32_to_bf16(gauss());
    ms_qmat bq = {.dtype = MS_DT_BF16, .rows = 1, .cols = d, .data = bb}, dbq;
    CHECK(G->ops->place_qmat(G, &bq, &dbq, &err) == MS_OK);
    same(dx, hx, n);
    C->ops->add_bias_any(C, hx, bb, MS_DT_BF16, rows, d), G->ops->add_bias_any(G, dx, dbq.data, MS_DT_BF16, rows, d);
    got = bget(dx, n), cmpv("add_bias_any (bf16)", got, hx, n, 0, 0), free(got);
    /* glu: SwiGLU (CPU vector kernel 2e-6), gpt-oss's form, SiTU (tanhf 2 ulp on the GPU) */
    ms_glu acts[3] = {{.kind = MS_ACT_SILU, .limit = 7.0f, .alpha = 1.0f},
                      {.kind = MS_ACT_SILU, .limit = 7.0f, .alpha = 1.702f, .up_offset = 1.0f},
                      {.kind = MS_ACT_SITU, .beta = 2.0f, .linear_beta = 3.0f}};
    const char *an[3] = {"glu swiglu limit 7", "glu gpt-oss clamped", "glu situ"};
    for (int a = 0; a < 3; a++) {
        float *g0 = randv(n, 4.0f), *u0 = randv(n, 4.0f), *dg = bup(g0, n), *du = bup(u0, n);
        C->ops->glu(C, &acts[a], g0, u0, n), G->ops->glu(G, &acts[a], dg, du, n);
        got = bget(dg, n), cmpv(an[a], got, g0, n, 16 * U32 + (a == 0 ? 2e-6 : 0), 1e-30), free(got);
        gfree(dg), gfree(du), free(g0), free(u0);
    }
    /* rope: backwards (sign -1), at an offset inside strided heads: the same float formula */
    ms_rope r;
    memset(&r, 0, sizeof r);
    r.dim = 64, r.layout = MS_ROPE_INTERLEAVED, r.attn_factor = 1.0;
    for (int i = 0; i < 32; i++) r.inv_freq[i] = pow(10000.0, -2.0 * i / 64);
    memcpy(hx, x, (size_t)n * 4), G->ops->upload(G, dx, x, (size_t)n * 4, &err);
    C->ops->rope(C, &r, hx, rows, d, 8, 288, 100, 5000, -1.0f), G->ops->rope(G, &r, dx, rows, d, 8, 288, 100, 5000, -1.0f);
    got = bget(dx, n), cmpv("rope (sign -1, offset, strides)", got, hx, n, 0, 4 * U32 * maxabs(x, n)), free(got);
    /* embed: rows of a BF16 and an FP8 block-scaled table for host ids (dequantization is exact) */
    const wkind *tk[2] = {&K_BF16, &K_FP8};
    for (int i = 0; i < 2; i++) {
        ms_qmat t = make_w(tk[i], 1000, 512), dt;
        CHECK(G->ops->place_qmat(G, &t, &dt, &err) == MS_OK);
        int32_t ids[6] = {0, 999, 5, 5, 128, 300};
        float *e1 = malloc(6 * 512 * 4), *de = bup(e1, 6 * 512);
        C->ops->embed(C, e1, &t, ids, 6), G->ops->embed(G, de, &dt, ids, 6);
        got = bget(de, 6 * 512), cmpv(i ? "embed (fp8 block scales)" : "embed (bf16)", got, e1, 6 * 512, 0, 0), free(got);
        gfree(de), free(e1), free_w(&t);
    }
    CHECK(G->ops->sync(G, &err) == MS_OK);
    gfree(dx), gfree(dy), gfree(db), gfree(dgs), free(x), free(y), free(b), free(gs), free(hx), free(hy), free(bb);
}

/* The prefill GEMMs (backend/gpu/gemm.cu): matmul / matmul_many at and above the
 * threshold, and the grouped routed experts, against the CPU backend. The GEMM path
 * sums in F32 on tensor cores in an order of its own (truncating adds: 2u per add),
 * so a dot product of N terms is within (2N + 16) u sum|terms|; the weight's BF16
 * pair carries 2^-18 of each value where hi + lo is not exact (FP8 or Q8 with F32 scales; Q8 with
 * BF16 scales is exact: 7 + 8 significant bits). */
static double split_err(const wkind *k) {
    return (k->dt == MS_DT_F8_E4M3 || k->dt == MS_DT_Q8) && k->sdt == MS_DT_F32 ? 0x1p-18 : 0;
}
/* backend_gemm_mma: check_gemm_moe asserts that the call went through gemm_mma.cu's kernel, and
 * the activations' BF16 parts there carry g_moe_xerr of each value (3 parts: 0, exact; 2: 2^-16;
 * 1: 2^-8: the rounding of what the earlier parts leave) in both stages. */
static int g_moe_want_mma;
static double g_moe_xerr;
static int g_dense_want_mma; /* check_gemm_dense asserts the kernel ran (MS_GPU_DENSE_MMA=1) */

static void check_gemm_dense(const wkind *k, int64_t rows, int64_t cols, int n, int acc) {
    ms_backend *C = cpu(), *G = gbe();
    ms_err err = {0};
    ms_qmat w = make_w(k, rows, cols), dw;
    CHECK(G->ops->place_qmat(G, &w, &dw, &err) == MS_OK);
    float *x = randv((int64_t)n * cols, 1.0f), *ref = randv((int64_t)n * rows, 1.0f);
    float *y0 = dupv(ref, (int64_t)n * rows);
    float *dx = bup(x, (int64_t)n * cols), *dy = bup(ref, (int64_t)n * rows);
    uint64_t d0, m0, d1, m1, q0 = ms_backend_gpu_gemm_mma_calls(G);
    ms_backend_gpu_gemm_calls(G, &d0, &m0);
    C->ops->matmul(C, ref, x, n, &w, acc);
    G->ops->matmul(G, dy, dx, n, &dw, acc);
    float *got = bget(dy, (int64_t)n * rows);
    ms_backend_gpu_gemm_calls(G, &d1, &m1);
    CHECK_MSG(!g_dense_want_mma || ms_backend_gpu_gemm_mma_calls(G) == q0 + 1, "gemm %s n=%d: not through the mma kernel",
              k->name, n);
    double *l1 = malloc((size_t)n * rows * 8);
    l1_rows(&w, x, n, l1);
    double worst = 0;
    int bad = 0;
    for (int64_t i = 0; i < (int64_t)n * rows; i++) {
        double tol = ((2.0 * cols + 16) * U32 + dot_bound(cols) + cols * U32 + split_err(k)) * l1[i] +
                     (acc ? 2 * U32 * (fabs(y0[i]) + fabs(ref[i])) : 0) + 1e-30;
        double e = fabs(got[i] - ref[i]) / tol;
        if (!(e <= 1)) bad++;
        worst = fmax(worst, e);
    }
    printf("  backend gemm %-36s [%5lld x %5lld] n=%-3d%s max err/bound %.3f\n", k->name, (long long)rows,
           (long long)cols, n, acc ? " acc" : "    ", worst);
    CHECK_MSG(d1 == d0 + 1, "gemm %s n=%d: the product did not run through the GEMM", k->name, n);
    CHECK_MSG(bad == 0, "gemm %s [%lld x %lld] n=%d: %d out of bound", k->name, (long long)rows, (long long)cols, n, bad);
    gfree(dx), gfree(dy), free(x), free(ref), free(y0), free(got), free(l1), free_w(&w);
}

/* Routed experts of one layer (E experts of D x I, n tokens, K distinct experts per
 * token; dup: token 0 also takes its first expert twice, as hash routing may) through
 * the GPU's moe_experts (grouped) and the CPU backend's (composed). Bound normwise:
 * two products of D and I terms, the activation's sensitivity below 8. */
static void check_gemm_moe(const char *what, const wkind *k, int E, int K, int n, int64_t D, int64_t I, int fused,
                           int biases, float limit, int hot) {
    ms_backend *C = cpu(), *G = gbe();
    ms_err err = {0};
    ms_qmat *hw = calloc((size_t)E * 3, sizeof *hw), *dwv = calloc((size_t)E * 3, sizeof *dwv);
    ms_expert_view *hv = calloc((size_t)E, sizeof *hv), *dv = calloc((size_t)E, sizeof *dv);
    uint16_t **hb = calloc((size_t)E * 3, sizeof *hb);
    for (int e = 0; e < E; e++) {
        hw[3 * e] = make_w(k, fused ? 2 * I : I, D), hw[3 * e + 2] = make_w(k, D, I);
        if (!fused) hw[3 * e + 1] = make_w(k, I, D);
        for (int m = 0; m < 3; m++)
            if (m != 1 || !fused) CHECK(G->ops->place_qmat(G, &hw[3 * e + m], &dwv[3 * e + m], &err) == MS_OK);
        hv[e].gate = hw[3 * e], hv[e].up = hw[3 * e + 1], hv[e].down = hw[3 * e + 2];
        dv[e].gate = dwv[3 * e], dv[e].up = dwv[3 * e + 1], dv[e].down = dwv[3 * e + 2];
        if (biases) {
            int64_t len[3] = {fused ? 2 * I : I, fused ? 0 : I, D};
            const void **hp[3] = {&hv[e].gate_bias, &hv[e].up_bias, &hv[e].down_bias};
            const void **dp[3] = {&dv[e].gate_bias, &dv[e].up_bias, &dv[e].down_bias};
            for (int m = 0; m < 3; m++) {
                if (!len[m]) continue;
                hb[3 * e + m] = malloc((size_t)len[m] * 2);
                for (int64_t i = 0; i < len[m]; i++) hb[3 * e + m][i] = ms_f32_to_bf16(gauss() * 0.5f);
                ms_qmat bq = {.dtype = MS_DT_BF16, .rows = 1, .cols = len[m], .data = hb[3 * e + m]}, dbq;
                CHECK(G->ops->place_qmat(G, &bq, &dbq, &err) == MS_OK);
                *hp[m] = hb[3 * e + m], *dp[m] = dbq.data;
            }
            hv[e].bias_dtype = dv[e].bias_dtype = MS_DT_BF16;
        }
    }
    /* routing: K distinct experts per token (hot: expert 0 for every token), weights in (0, 1) */
    int P = n * K + 1, *ids = malloc((size_t)P * 4), *cnt = calloc((size_t)E + 1, 4);
    int *tok = malloc((size_t)P * 4), *off = malloc((size_t)(E + 1) * 4), *pos = malloc((size_t)E * 4);
    float *wp = malloc((size_t)P * 4), *w = malloc((size_t)P * 4);
    int *ptok = malloc((size_t)P * 4);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            int x, again;
            do {
                x = hot && j == 0 ? 0 : (int)(rnd() % (uint64_t)E), again = 0;
                for (int q = 0; q < j; q++) again |= ids[t * K + q] == x;
            } while (again);
            ids[t * K + j] = x, ptok[t * K + j] = t, wp[t * K + j] = (float)unif();
        }
    ids[n * K] = ids[0], ptok[n * K] = 0, wp[n * K] = 0.5f; /* token 0 twice in one expert */
    for (int i = 0; i < P; i++) cnt[ids[i] + 1]++;
    for (int x = 0; x < E; x++) cnt[x + 1] += cnt[x];
    memcpy(pos, cnt, (size_t)E * 4);
    for (int i = 0; i < P; i++) tok[pos[ids[i]]] = ptok[i], w[pos[ids[i]]] = wp[i], pos[ids[i]]++;
    int nu = 0;
    ms_expert_view *hu = calloc((size_t)E, sizeof *hu), *du = calloc((size_t)E, sizeof *du);
    for (int x = 0; x < E; x++)
        if (cnt[x + 1] > cnt[x]) off[nu] = cnt[x], hu[nu] = hv[x], du[nu] = dv[x], nu++;
    off[nu] = P;
    ms_glu act = {.kind = MS_ACT_SILU, .limit = limit, .alpha = 1.0f};
    int mb = 64; /* the composed op's row blocks */
    float *x = randv((int64_t)n * D, 1.0f), *ref = calloc((size_t)n * D, 4);
    float *hxs = malloc((size_t)mb * D * 4), *hg = malloc((size_t)mb * 2 * I * 4), *hu2 = malloc((size_t)mb * 2 * I * 4),
          *hys = malloc((size_t)mb * D * 4);
    ms_moe_args ca = {.in = x, .acc = ref, .D = D, .act = &act, .nu = nu, .views = hu, .off = off, .tok = tok, .w = w,
                      .max_batch = mb, .xs = hxs, .g = hg, .u = hu2, .ys = hys};
    C->ops->moe_experts(C, &ca);
    float *dx = bup(x, (int64_t)n * D), *dacc = bup(ref, (int64_t)n * D);
    G->ops->zero(G, dacc, (size_t)n * D * 4);
    float *zs = calloc((size_t)(mb * 4 * I + 2 * mb * D), 4), *scr = bup(zs, (int64_t)mb * 4 * I + 2 * mb * D);
    free(zs);
    ms_moe_args ga = ca; /* the composed op's scratch (unused by the grouped path) */
    ga.in = dx, ga.acc = dacc, ga.views = du, ga.xs = scr, ga.g = scr + mb * D, ga.u = scr + mb * D + mb * 2 * I,
    ga.ys = scr + mb * D + mb * 4 * I;
    uint64_t d0, m0, d1, m1, q0 = ms_backend_gpu_gemm_mma_calls(G);
    ms_backend_gpu_gemm_calls(G, &d0, &m0);
    G->ops->moe_experts(G, &ga);
    float *got = bget(dacc, (int64_t)n * D);
    ms_backend_gpu_gemm_calls(G, &d1, &m1);
    uint64_t q1 = ms_backend_gpu_gemm_mma_calls(G);
    CHECK(G->ops->sync(G, &err) == MS_OK);
    double scale = maxabs(ref, (int64_t)n * D) + 1e-30, worst = 0;
    double tol = (8 * ((2.0 * D + 16) * U32 + (2.0 * I + 16) * U32 + 2 * split_err(k) + 2 * g_moe_xerr) + (K + 2) * 4 * U32) *
                 scale * 4;
    int bad = 0;
    for (int64_t i = 0; i < (int64_t)n * D; i++) {
        double e = fabs((double)got[i] - ref[i]) / tol;
        if (!(e <= 1)) bad++;
        worst = fmax(worst, e);
    }
    printf("  backend gemm experts %-40s n=%-4d E=%d K=%d max err/bound %.3f (max |acc| %.3g)\n", what, n, E, K, worst,
           scale);
    CHECK_MSG(m1 == m0 + 1, "gemm experts %s: did not run grouped", what);
    CHECK_MSG(!g_moe_want_mma || q1 == q0 + 1, "gemm experts %s: did not run through the mma kernel", what);
    CHECK_MSG(bad == 0, "gemm experts %s: %d out of bound", what, bad);
    gfree(dx), gfree(dacc), gfree(scr);
    for (int e = 0; e < E; e++) {
        for (int m = 0; m < 3; m++) free(hb[3 * e + m]);
        free_w(&hw[3 * e]), free_w(&hw[3 * e + 2]);
        if (!fused) free_w(&hw[3 * e + 1]);
    }
    free(hw), free(dwv), free(hv), free(dv), free(hb), free(ids), free(cnt), free(tok), free(off), free(pos), free(wp),
        free(w), free(ptok), free(hu), free(du), free(x), free(ref), free(hxs), free(hg), free(hu2), free(hys), free(got);
}

TEST(backend_gemm) {
    SKIP_UNLESS_SELECTED("backend_gemm");
    ms_backend *G = gbe();
    ms_err err = {0};
    CHECK(ms_backend_gpu_gemm_min(G, 2, 2, 2) == MS_OK); /* every n >= 2 through the GEMMs */
    setenv("MS_GPU_MOE_MMA", "0", 1); /* the BLAS path (backend_gemm_mma checks gemm_mma.cu's) */
    const wkind *all[] = {&K_F32, &K_F16, &K_BF16, &K_FP8, &K_FP8B, &K_F4};
    int ns[] = {2, 17, 40, 67};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++) check_gemm_dense(all[i], 333, 1024, ns[j], j == 2);
    check_gemm_dense(&K_FP8, 1001, 2896, 40, 0); /* partial scale blocks, rows not a block multiple */
    check_gemm_dense(&K_BF16, 129, 7001, 9, 1);  /* odd columns */
    check_gemm_dense(&K_F4, 2880, 2880, 33, 0);
    check_gemm_dense(&K_BF16, 151936, 256, 5, 0); /* vocabulary rows */
    /* matmul_many (q, k, v of a GQA layer): each job through the GEMM */
    {
        ms_backend *C = cpu();
        int n = 24;
        int64_t cols = 512, rws[3] = {512, 128, 128};
        ms_qmat w[3], dw[3];
        float *x = randv((int64_t)n * cols, 1.0f), *dx = bup(x, (int64_t)n * cols);
        float *ref[3], *dy[3];
        ms_matmul_job cj[3], gj[3];
        for (int q = 0; q < 3; q++) {
            w[q] = make_w(&K_BF16, rws[q], cols);
            CHECK(G->ops->place_qmat(G, &w[q], &dw[q], &err) == MS_OK);
            ref[q] = calloc((size_t)n * rws[q], 4), dy[q] = bup(ref[q], (int64_t)n * rws[q]);
            cj[q] = (ms_matmul_job){ref[q], x, n, &w[q], 0}, gj[q] = (ms_matmul_job){dy[q], dx, n, &dw[q], 0};
        }
        uint64_t d0, m0, d1, m1;
        ms_backend_gpu_gemm_calls(G, &d0, &m0);
        C->ops->matmul_many(C, cj, 3), G->ops->matmul_many(G, gj, 3);
        ms_backend_gpu_gemm_calls(G, &d1, &m1);
        CHECK_MSG(d1 == d0 + 3, "matmul_many: %llu of 3 jobs through the GEMM", (unsigned long long)(d1 - d0));
        for (int q = 0; q < 3; q++) {
            float *got = bget(dy[q], (int64_t)n * rws[q]);
            double *l1 = malloc((size_t)n * rws[q] * 8);
            l1_rows(&w[q], x, n, l1);
            int bad = 0;
            double worst = 0;
            for (int64_t i = 0; i < (int64_t)n * rws[q]; i++) {
                double e = fabs(got[i] - ref[q][i]) / (((2.0 * cols + 16) * U32 + dot_bound(cols) + cols * U32) * l1[i] + 1e-30);
                if (!(e <= 1)) bad++;
                worst = fmax(worst, e);
            }
            printf("  backend gemm matmul_many job %d [%lld x %lld] n=%d max err/bound %.3f\n", q, (long long)rws[q],
                   (long long)cols, n, worst);
            CHECK_MSG(bad == 0, "matmul_many job %d: %d out of bound", q, bad);
            free(got), free(l1), gfree(dy[q]), free(ref[q]), free_w(&w[q]);
        }
        gfree(dx), free(x);
    }
    /* grouped experts: every dtype, fused gate_up with biases and a SwiGLU limit, an expert with
     * more rows than one item holds (1100 tokens all in expert 0: two items, two size classes) */
    check_gemm_moe("bf16 (qwen3 shape, 128 experts)", &K_BF16, 128, 8, 64, 2048, 768, 0, 0, 0.0f, 0);
    check_gemm_moe("fp8 f32 128x128 scales", &K_FP8, 16, 4, 40, 512, 384, 0, 0, 0.0f, 0);
    check_gemm_moe("fp8 bf16 scales", &K_FP8B, 16, 4, 40, 512, 256, 0, 0, 0.0f, 0);
    /* FP8 in the row-block form (above: rows a multiple of 128) with fused gate_up, biases and a
     * limit; and inter rows of a partial block (320: the hi + lo form) */
    check_gemm_moe("fp8 fused gate_up, biases, limit 7 (row blocks)", &K_FP8, 8, 4, 33, 384, 192, 1, 1, 7.0f, 0);
    check_gemm_moe("fp8 partial row block (hi + lo)", &K_FP8, 8, 2, 21, 256, 320, 0, 0, 0.0f, 0);
    check_gemm_moe("f16", &K_F16, 8, 2, 33, 256, 128, 0, 0, 0.0f, 0);
    check_gemm_moe("mxfp4 fused gate_up, biases, limit 7", &K_F4, 8, 4, 40, 320, 128, 1, 1, 7.0f, 0);
    check_gemm_moe("bf16 biases, limit 7", &K_BF16, 8, 2, 17, 256, 96, 0, 1, 7.0f, 0);
    check_gemm_moe("bf16, one hot expert (1100 rows)", &K_BF16, 6, 2, 1100, 128, 64, 0, 0, 0.0f, 1);
    unsetenv("MS_GPU_MOE_MMA");
    CHECK(ms_backend_gpu_gemm_min(G, 16, 48, 4) == MS_OK); /* back near the defaults for the other tests */
}

/* The prefill GEMM of Q8 weights (the requantized static tier, --static-dtype q8): dequantized to
 * BF16 hi + lo as FP8 (exact with BF16 scales), every n >= 2 through it; MS_GPU_TEST_ONLY=matmul_q
 * selects it with the Q8 matvec tests. */
TEST(matmul_q_gemm) {
    SKIP_UNLESS_SELECTED("matmul_q_gemm");
    ms_backend *G = gbe();
    CHECK(ms_backend_gpu_gemm_min(G, 2, 2, 2) == MS_OK);
    int ns[] = {2, 17, 40, 67};
    for (int j = 0; j < 4; j++) check_gemm_dense(&K_Q8, 333, 1024, ns[j], j == 2);
    check_gemm_dense(&K_Q8F, 129, 1024, 17, 0);
    check_gemm_dense(&K_Q8, 1001, 2896, 40, 0); /* partial last scale block */
    check_gemm_dense(&K_Q8, 77, 7001, 9, 1);   /* odd columns: the element-wise dequantization */
    check_gemm_dense(&K_Q8, 151936, 256, 5, 0); /* vocabulary rows */
    CHECK(ms_backend_gpu_gemm_min(G, 16, 48, 4) == MS_OK); /* back near the defaults for the other tests */
}

/* The grouped experts through gemm_mma.cu's kernel (MS_GPU_MOE_MMA=all): BF16, FP8 (F32 and BF16
 * 128 x 128 scales, fused gate_up with biases and a limit), MXFP4 (fused, biases, limit), a hot
 * expert of 1100 pairs (two items, partial pair tiles), the Qwen3 shape; then the faster forms of
 * 2 and 1 activation parts (MS_GPU_MOE_PARTS) on the same shapes, each with its own bound, and
 * tiles of 32 and 16 pairs forced (MS_GPU_MOE_NT). */
TEST(backend_gemm_mma) {
    SKIP_UNLESS_SELECTED("backend_gemm_mma");
    ms_backend *G = gbe();
    CHECK(ms_backend_gpu_gemm_min(G, 2, 2, 2) == MS_OK);
    setenv("MS_GPU_MOE_MMA", "all", 1);
    static const double xerr[3] = {0, 0x1p-16, 0x1p-8};
    static const char *parts[3] = {"3", "2", "1"};
    static const char *nts[3] = {"auto", "32", "16"}; /* pairs per tile: the kernel's choice, then each forced */
    for (int pi = 0; pi < 3; pi++) {
        setenv("MS_GPU_MOE_PARTS", parts[pi], 1);
        if (pi) setenv("MS_GPU_MOE_NT", nts[pi], 1);
        if (pi == 1) setenv("MS_GPU_MOE_MMA_DB", "1", 1); /* the double-buffered form on this pass */
        else unsetenv("MS_GPU_MOE_MMA_DB");
        g_moe_want_mma = 1, g_moe_xerr = xerr[pi];
        printf("  mma kernel, %s activation parts, tiles of %s pairs%s\n", parts[pi], nts[pi], pi == 1 ? ", double-buffered" : "");
        if (pi == 0) { /* dense matmuls through the kernel (MS_GPU_DENSE_MMA=1), the check_gemm_dense bound */
            setenv("MS_GPU_DENSE_MMA", "1", 1);
            g_dense_want_mma = 1;
            const wkind *dk[4] = {&K_BF16, &K_FP8, &K_FP8B, &K_F4};
            int dn[4] = {2, 17, 40, 67};
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) check_gemm_dense(dk[i], 333, 1024, dn[j], j == 2);
            check_gemm_dense(&K_F4, 1440, 2880, 33, 0);
            check_gemm_dense(&K_FP8, 1024, 2048, 96, 1);
            g_dense_want_mma = 0;
            check_gemm_dense(&K_FP8, 1001, 2896, 40, 0); /* columns not a multiple of 32: the BLAS path */
            unsetenv("MS_GPU_DENSE_MMA");
        }
        if (pi == 0) { /* the Qwen3-30B-A3B expert shape (12 experts), the gpt-oss one */
            check_gemm_moe("mma bf16 (qwen3 shape)", &K_BF16, 12, 8, 40, 2048, 768, 0, 0, 0.0f, 0);
            check_gemm_moe("mma fp8 f32 128x128 scales (qwen3 shape)", &K_FP8, 12, 8, 48, 2048, 768, 0, 0, 0.0f, 0);
            check_gemm_moe("mma mxfp4 (gpt-oss shape 2880)", &K_F4, 2, 2, 9, 2880, 2880, 1, 1, 7.0f, 0);
        }
        check_gemm_moe("mma fp8 f32 128x128 scales", &K_FP8, 16, 4, 40, 512, 384, 0, 0, 0.0f, 0);
        check_gemm_moe("mma fp8 bf16 scales", &K_FP8B, 16, 4, 40, 512, 256, 0, 0, 0.0f, 0);
        check_gemm_moe("mma fp8 fused gate_up, biases, limit 7", &K_FP8, 8, 4, 33, 384, 192, 1, 1, 7.0f, 0);
        check_gemm_moe("mma mxfp4 fused gate_up, biases, limit 7", &K_F4, 8, 4, 40, 320, 128, 1, 1, 7.0f, 0);
        check_gemm_moe("mma bf16 biases, limit 7", &K_BF16, 8, 2, 17, 256, 96, 0, 1, 7.0f, 0);
        check_gemm_moe("mma bf16, one hot expert (1100 rows)", &K_BF16, 6, 2, 1100, 128, 64, 0, 0, 0.0f, 1);
        check_gemm_moe("mma fp8, one hot expert (1100 rows)", &K_FP8B, 6, 2, 1100, 256, 128, 0, 0, 0.0f, 1);
    }
    g_moe_want_mma = 0, g_moe_xerr = 0;
    unsetenv("MS_GPU_MOE_PARTS");
    unsetenv("MS_GPU_MOE_NT");
    /* a layout the kernel refuses (inter 320: a partial FP8 row block) keeps the earlier path */
    check_gemm_moe("mma refused: fp8 partial row block (hi + lo)", &K_FP8, 8, 2, 21, 256, 320, 0, 0, 0.0f, 0);
    unsetenv("MS_GPU_MOE_MMA");
    CHECK(ms_backend_gpu_gemm_min(G, 16, 48, 4) == MS_OK);
}

TEST(backend_route) {
    SKIP_UNLESS_SELECTED("backend_route");
    ms_backend *C = cpu(), *G = gbe();
    /* Z: zero-computation experts past the E routed ones (the router is E + Z wide) */
    struct { const char *what; ms_router_kind k; int E, K, G_, TG, norm, fixed; float scale; int Z; } cs[] = {
        {"route sigmoid groups (device kernel)", MS_ROUTER_SIGMOID, 256, 8, 8, 4, 1, 0, 2.5f, 0},
        {"route softmax (device kernel)", MS_ROUTER_SOFTMAX, 128, 8, 1, 1, 1, 0, 1.0f, 0},
        {"route sqrt-softplus (host)", MS_ROUTER_SQRTSOFTPLUS, 256, 6, 1, 1, 1, 0, 1.5f, 0},
        {"route sqrt-softplus hash ids (host)", MS_ROUTER_SQRTSOFTPLUS, 256, 6, 1, 1, 1, 1, 1.5f, 0},
        /* LongCat-Flash: 512 routed + 256 zero-computation experts, top 12 of softmax + bias */
        {"route softmax + bias, zero experts (host)", MS_ROUTER_SOFTMAX_BIAS, 512, 12, 1, 1, 0, 0, 6.0f, 256},
        {"route softmax, zero experts (host)", MS_ROUTER_SOFTMAX, 128, 8, 1, 1, 1, 0, 1.0f, 64},
    };
    for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++) {
        ms_config c;
        memset(&c, 0, sizeof c);
        c.router = cs[ci].k, c.n_experts = cs[ci].E, c.top_k = cs[ci].K, c.n_group = cs[ci].G_;
        c.topk_group = cs[ci].TG, c.norm_topk_prob = cs[ci].norm, c.routed_scale = cs[ci].scale;
        c.n_zero_experts = cs[ci].Z;
        int n = 20, E = cs[ci].E + cs[ci].Z, K = cs[ci].K;
        float *lg = randv((int64_t)n * E, 2.0f), *bias = randv(E, 0.3f), *w = malloc((size_t)n * K * 4);
        int *ids = malloc((size_t)n * K * 4), *gid = malloc((size_t)n * K * 4);
        int32_t *fx = malloc((size_t)n * K * 4);
        for (int i = 0; i < n * K; i++) fx[i] = (int32_t)(rnd() % (uint64_t)E);
        float *dl = bup(lg, (int64_t)n * E), *dbias = bup(bias, E), *dw = bup(w, (int64_t)n * K);
        float *did = bup(w, (int64_t)n * K);
        ms_route_args a = {.c = &c, .logits = lg, .bias = bias, .fixed = cs[ci].fixed ? fx : NULL, .n = n, .ids = ids, .w = w};
        C->ops->route(C, &a);
        ms_route_args b = a;
        b.logits = dl, b.bias = dbias, b.ids = (int *)did, b.w = dw;
        G->ops->route(G, &b);
        float *gw = bget(dw, (int64_t)n * K);
        ms_err err = {0};
        CHECK(G->ops->download(G, gid, did, (size_t)n * K * 4, &err) == MS_OK);
        int idbad = 0;
        for (int i = 0; i < n * K; i++) idbad += gid[i] != ids[i];
        CHECK_MSG(idbad == 0, "%s: %d ids differ", cs[ci].what, idbad);
        cmpv(cs[ci].what, gw, w, (int64_t)n * K, 4 * (E / 256.0 + 16) * U32 + 2e-6, 1e-30);
        gfree(dl), gfree(dbias), gfree(dw), gfree(did);
        free(lg), free(bias), free(w), free(ids), free(gid), free(fx), free(gw);
    }
}

/* scale_add_rows (zero-computation experts: acc[t] += w * x[t] per (token, weight) pair, in
 * order; a token repeats, once per zero expert it picked) against the CPU backend: LongCat-Flash's
 * hidden 6144 and odd 1001, more pairs than one launch takes (ROW_BATCH 256). Each += may be one
 * fused multiply-add on the GPU: per pair at most u (|acc| + |w x|) apart (|acc| grows by |w x| <= 2 |x|
 * a pair), r pairs of a row. */
TEST(backend_zero_experts) {
    SKIP_UNLESS_SELECTED("backend_zero_experts");
    ms_backend *C = cpu(), *G = gbe();
    const int64_t ds[] = {6144, 1001};
    for (size_t di = 0; di < sizeof ds / sizeof *ds; di++) {
        int64_t d = ds[di];
        int n = 160, Z = 4, m = 0, reps = 0;
        int *tok = malloc((size_t)n * Z * sizeof *tok), *per = calloc((size_t)n, sizeof *per);
        float *w = malloc((size_t)n * Z * 4);
        for (int z = 0; z < Z; z++) /* expert-major lists: zero expert z's tokens in order */
            for (int t = 0; t < n; t++)
                if (rnd() % 8 < 5) tok[m] = t, w[m] = (float)unif() * 2.0f, per[t]++, m++;
        for (int t = 0; t < n; t++) reps = per[t] > reps ? per[t] : reps;
        float *x = randv((int64_t)n * d, 1.0f), *acc = randv((int64_t)n * d, 3.0f);
        float *dx = bup(x, (int64_t)n * d), *dacc = bup(acc, (int64_t)n * d);
        C->ops->scale_add_rows(C, acc, x, tok, w, m, d);
        G->ops->scale_add_rows(G, dacc, dx, tok, w, m, d);
        float *got = bget(dacc, (int64_t)n * d);
        char what[96];
        snprintf(what, sizeof what, "scale_add_rows (d %lld, %d pairs, <= %d a row)", (long long)d, m, reps);
        cmpv(what, got, acc, (int64_t)n * d, 0, 2 * reps * U32 * (maxabs(acc, (int64_t)n * d) + 2.0 * (reps + 1) * maxabs(x, (int64_t)n * d))),
        free(got);
        /* x unchanged */
        got = bget(dx, (int64_t)n * d), cmpv("scale_add_rows (its input)", got, x, (int64_t)n * d, 0, 0), free(got);
        gfree(dx), gfree(dacc);
        free(tok), free(per), free(w), free(x), free(acc);
    }
}

/* router_route (the router matmul and the routing in one launch) on the fused and the legacy
 * backend: the logits against the CPU's matmul (the dot-product bound), then the CPU's route of
 * the GPU's own logits (so near ties cannot flip on rounding): ids identical, weights within the
 * route bound. Softmax (Qwen3 128 x 2048 BF16), top-k softmax (gpt-oss 32 x 2880 BF16), ungrouped
 * sigmoid with a correction bias (Kimi 384 x 2304 F32), FP8 rows, and a grouped sigmoid (the two
 * ops) */
TEST(backend_router_route) {
    SKIP_UNLESS_SELECTED("backend_router_route");
    ms_backend *C = cpu();
    /* mode 1: the rows repeat 16 distinct rows (every logit tied 8 ways: the top 8 all tie);
     * mode 2: 30 of the 32 rows hold a NaN (NaN logits: the 2 numbers, then the lowest NaN indices) */
    struct { const char *what; const wkind *k; ms_router_kind kind; int E, K, G_, TG, norm, D; float scale; int mode; } cs[] = {
        {"router_route softmax 8 of 128, bf16 2048", &K_BF16, MS_ROUTER_SOFTMAX, 128, 8, 1, 1, 1, 2048, 1.0f, 0},
        {"router_route top-k softmax 4 of 32, bf16 2880", &K_BF16, MS_ROUTER_TOPK_SOFTMAX, 32, 4, 1, 1, 0, 2880, 1.0f, 0},
        {"router_route sigmoid 8 of 384 + bias, f32 2304", &K_F32, MS_ROUTER_SIGMOID, 384, 8, 1, 1, 1, 2304, 2.8f, 0},
        {"router_route softmax 6 of 64, fp8 1024", &K_FP8, MS_ROUTER_SOFTMAX, 64, 6, 1, 1, 0, 1024, 1.0f, 0},
        {"router_route sigmoid groups 4 of 8 (two ops)", &K_BF16, MS_ROUTER_SIGMOID, 256, 8, 8, 4, 1, 1024, 2.5f, 0},
        {"router_route softmax 8 of 128, 8-way ties", &K_BF16, MS_ROUTER_SOFTMAX, 128, 8, 1, 1, 1, 2048, 1.0f, 1},
        {"router_route sigmoid 8 of 256 + bias, 8-way ties", &K_BF16, MS_ROUTER_SIGMOID, 256, 8, 1, 1, 1, 1024, 2.5f, 1},
        {"router_route top-k softmax 4 of 32, 30 NaN logits", &K_BF16, MS_ROUTER_TOPK_SOFTMAX, 32, 4, 1, 1, 0, 2880, 1.0f, 2},
    };
    for (int leg = 0; leg < 2; leg++)
        for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++) {
            ms_backend *G = leg ? legacy_gbe() : gbe();
            ms_err err = {0};
            ms_config c;
            memset(&c, 0, sizeof c);
            c.router = cs[ci].kind, c.n_experts = cs[ci].E, c.top_k = cs[ci].K, c.n_group = cs[ci].G_;
            c.topk_group = cs[ci].TG, c.norm_topk_prob = cs[ci].norm, c.routed_scale = cs[ci].scale;
            int E = cs[ci].E, K = cs[ci].K;
            int64_t D = cs[ci].D;
            ms_qmat w = make_w(cs[ci].k, E, D), dw;
            uint16_t *wd = (uint16_t *)w.data; /* modes 1, 2: BF16 rows */
            for (int r = 16; cs[ci].mode == 1 && r < E; r++) memcpy(wd + (int64_t)r * D, wd + (int64_t)(r % 16) * D, (size_t)D * 2);
            for (int r = 0; cs[ci].mode == 2 && r < E; r++)
                if (r != 5 && r != 17) wd[(int64_t)r * D + (r * 13) % D] = 0x7fc0;
            CHECK(G->ops->place_qmat(G, &w, &dw, &err) == MS_OK);
            float *x = randv(D, 1.0f), *bias = randv(E, 0.3f), *ref = malloc((size_t)E * 4);
            if (cs[ci].mode == 1) /* the bias repeats with the rows: choices tie as the logits do */
                for (int i = 16; i < E; i++) bias[i] = bias[i % 16];
            double *l1 = malloc((size_t)E * 8);
            ms_matmul_ref(ref, x, 1, &w);
            l1_rows(&w, x, 1, l1);
            float *dx = bup(x, D), *dbias = bup(bias, E), *dl = bup(ref, E), *dwt = bup(ref, 64), *did = bup(ref, 64);
            ms_route_args a = {.c = &c, .logits = dl, .bias = dbias, .n = 1, .ids = (int *)did, .w = dwt};
            CHECK(gbe()->ops->sync(gbe(), &err) == MS_OK); /* bup's stream is gbe()'s */
            G->ops->router_route(G, &a, dx, &dw);
            CHECK(G->ops->sync(G, &err) == MS_OK);
            float *gl = bget(dl, E), *gw = bget(dwt, K);
            int gid[64], rid[64];
            float rw[64];
            CHECK(G->ops->download(G, gid, did, (size_t)K * 4, &err) == MS_OK);
            double worst = 0;
            int lbad = 0;
            for (int i = 0; i < E; i++) {
                double e = fabs((double)gl[i] - ref[i]) / (dot_bound(D) * l1[i] + 1e-30);
                if (isnan(ref[i]) && isnan(gl[i])) e = 0;
                if (!(e <= 1)) lbad++;
                if (e > worst) worst = e;
            }
            ms_route_args h = {.c = &c, .logits = gl, .bias = bias, .n = 1, .ids = rid, .w = rw};
            C->ops->route(C, &h);
            int idbad = 0;
            for (int i = 0; i < K; i++) idbad += gid[i] != rid[i];
            char nm[128];
            snprintf(nm, sizeof nm, "%s%s", cs[ci].what, leg ? " (legacy)" : "");
            printf("  backend %-60s logits max err/bound %.3f, ids %s\n", nm, worst, idbad ? "DIFFER" : "equal");
            CHECK_MSG(lbad == 0, "%s: %d logits out of bound", nm, lbad);
            CHECK_MSG(idbad == 0, "%s: %d ids differ", nm, idbad);
            cmpv(nm, gw, rw, K, 4 * (E / 256.0 + 16) * U32 + 2e-6, 1e-30);
            gfree(dx), gfree(dbias), gfree(dl), gfree(dwt), gfree(did);
            free(x), free(bias), free(ref), free(l1), free(gl), free(gw), free_w(&w);
        }
}

/* the decode fusions against the CPU's composition: add_rmsnorm (add, then rmsnorm), qk_norm_rope
 * (rmsnorm of each head, then rope), matmul_many over matrices of different rows in one launch,
 * moe_experts_routed (the routed experts from device ids) against ms_moe_experts_composed */
TEST(backend_fused) {
    SKIP_UNLESS_SELECTED("backend_fused");
    ms_backend *C = cpu(), *G = gbe();
    ms_err err = {0};
    float *got;
    /* the register kernel (widths of 4 up to 4 x 512 float4, NV 1..8) and the loop kernel (2050, 20000,
     * and everything on the legacy backend) */
    int64_t widths[] = {2048, 7168, 2880, 512, 16384, 2050, 20000};
    for (int leg = 0; leg < 2; leg++)
        for (int wi = 0; wi < 7; wi++) {
            ms_backend *B = leg ? legacy_gbe() : G;
            int64_t rows = 3, d = widths[wi], n = rows * d;
            float *x = randv(n, 1.0f), *y = randv(n, 1.0f), *w = randv(d, 1.0f), *xn = malloc((size_t)n * 4);
            void *p[4];
            float *hp[4] = {x, y, w, x};
            int64_t np[4] = {n, n, d, n};
            for (int i = 0; i < 4; i++) {
                CHECK(B->ops->alloc(B, (size_t)np[i] * 4, &p[i], &err) == MS_OK);
                CHECK(B->ops->upload(B, p[i], hp[i], (size_t)np[i] * 4, &err) == MS_OK);
            }
            float *dx = p[0], *dy = p[1], *dw = p[2], *dxn = p[3];
            C->ops->add(C, x, y, n), C->ops->rmsnorm(C, xn, x, w, rows, d, 1e-6f);
            B->ops->add_rmsnorm(B, dx, dy, dxn, dw, rows, d, 1e-6f);
            char nm[96];
            got = malloc((size_t)n * 4);
            CHECK(B->ops->download(B, got, dx, (size_t)n * 4, &err) == MS_OK);
            snprintf(nm, sizeof nm, "add_rmsnorm %s d %lld (sum)", leg ? "legacy" : "", (long long)d);
            cmpv(nm, got, x, n, 0, 0);
            CHECK(B->ops->download(B, got, dxn, (size_t)n * 4, &err) == MS_OK);
            snprintf(nm, sizeof nm, "add_rmsnorm %s d %lld (norm)", leg ? "legacy" : "", (long long)d);
            cmpv(nm, got, xn, n, (d / 2.0 + 8) * U32 + 2e-6, 1e-30);
            free(got);
            for (int i = 0; i < 4; i++) B->ops->free(B, p[i]);
            free(x), free(y), free(w), free(xn);
        }
    /* q 32 heads, k 4 heads of 128, 2 tokens at 700.., rope half-split on all 128 dims */
    int64_t H = 32, KV = 4, hd = 128;
    int nt = 2;
    ms_rope r;
    memset(&r, 0, sizeof r);
    r.dim = 128, r.layout = MS_ROPE_HALF, r.attn_factor = 1.0;
    for (int i = 0; i < 64; i++) r.inv_freq[i] = pow(1e6, -2.0 * i / 128);
    float *q = randv(nt * H * hd, 1.0f), *k = randv(nt * KV * hd, 1.0f), *wq = randv(hd, 1.0f), *wk = randv(hd, 1.0f);
    float *dq = bup(q, nt * H * hd), *dk = bup(k, nt * KV * hd), *dwq = bup(wq, hd), *dwk = bup(wk, hd);
    C->ops->rmsnorm(C, q, q, wq, nt * H, hd, 1e-6f), C->ops->rmsnorm(C, k, k, wk, nt * KV, hd, 1e-6f);
    C->ops->rope(C, &r, q, nt, H * hd, H, hd, 0, 700, 1.0f), C->ops->rope(C, &r, k, nt, KV * hd, KV, hd, 0, 700, 1.0f);
    G->ops->qk_norm_rope(G, &r, dq, H, dwq, dk, KV, dwk, nt, hd, 1e-6f, 700);
    got = bget(dq, nt * H * hd), cmpv("qk_norm_rope (q)", got, q, nt * H * hd, 200 * U32 + 2e-6, 1e-6), free(got);
    got = bget(dk, nt * KV * hd), cmpv("qk_norm_rope (k)", got, k, nt * KV * hd, 200 * U32 + 2e-6, 1e-6), free(got);
    gfree(dq), gfree(dk), gfree(dwq), gfree(dwk), free(q), free(k), free(wq), free(wk);
    /* matmul_many: 3 BF16 jobs of 520, 64 and 64 rows over one x, one launch */
    {
        int64_t cols = 1024, rr[3] = {520, 64, 64};
        ms_qmat wm[3], dm[3];
        float *xx = randv(cols, 1.0f), *dxx = bup(xx, cols), *ref[3], *dyy[3];
        ms_matmul_job jc[3], jg[3];
        for (int i = 0; i < 3; i++) {
            wm[i] = make_w(&K_BF16, rr[i], cols);
            CHECK(G->ops->place_qmat(G, &wm[i], &dm[i], &err) == MS_OK);
            ref[i] = malloc((size_t)rr[i] * 4);
            void *p = NULL;
            CHECK(G->ops->alloc(G, (size_t)rr[i] * 4, &p, &err) == MS_OK);
            dyy[i] = p;
            jc[i] = (ms_matmul_job){ref[i], xx, 1, &wm[i], 0}, jg[i] = (ms_matmul_job){dyy[i], dxx, 1, &dm[i], 0};
        }
        C->ops->matmul_many(C, jc, 3), G->ops->matmul_many(G, jg, 3);
        for (int i = 0; i < 3; i++) {
            got = bget(dyy[i], rr[i]);
            cmpv(i ? "matmul_many (64-row job)" : "matmul_many (520-row job)", got, ref[i], rr[i], 1e-5, 1e-4);
            free(got), free(ref[i]), gfree(dyy[i]), free_w(&wm[i]);
        }
        gfree(dxx), free(xx);
    }
    /* moe_experts_routed: 16 BF16 experts of D 512, I 256, 4 chosen, SwiGLU limit 7 */
    {
        int E = 16, K = 4;
        int64_t D = 512, I = 256;
        ms_expert_view hv[16], gv[16];
        for (int e = 0; e < E; e++) {
            memset(&hv[e], 0, sizeof hv[e]), memset(&gv[e], 0, sizeof gv[e]);
            hv[e].gate = make_w(&K_BF16, I, D), hv[e].up = make_w(&K_BF16, I, D), hv[e].down = make_w(&K_BF16, D, I);
            CHECK(G->ops->place_qmat(G, &hv[e].gate, &gv[e].gate, &err) == MS_OK);
            CHECK(G->ops->place_qmat(G, &hv[e].up, &gv[e].up, &err) == MS_OK);
            CHECK(G->ops->place_qmat(G, &hv[e].down, &gv[e].down, &err) == MS_OK);
        }
        int ids[4] = {11, 2, 7, 3}, sorted[4] = {2, 3, 7, 11}, tok[4] = {0, 0, 0, 0}, off[5] = {0, 1, 2, 3, 4};
        float wts[4] = {0.4f, 0.3f, 0.2f, 0.1f}, sw[4] = {0.3f, 0.1f, 0.2f, 0.4f};
        ms_expert_view sv[4];
        for (int i = 0; i < K; i++) sv[i] = hv[sorted[i]];
        ms_glu act = {.kind = MS_ACT_SILU, .limit = 7.0f, .alpha = 1.0f};
        float *in = randv(D, 1.0f), *acc = calloc((size_t)D, 4), *xs = malloc((size_t)D * 4), *ys = malloc((size_t)D * 4);
        float *g = malloc((size_t)2 * I * 4), *u = malloc((size_t)2 * I * 4);
        ms_moe_args ma = {.in = in, .acc = acc, .D = D, .act = &act, .nu = K, .views = sv, .off = off, .tok = tok,
                          .w = sw, .max_batch = 1, .xs = xs, .g = g, .u = u, .ys = ys};
        C->ops->moe_experts(C, &ma);
        float *din = bup(in, D), *dacc = bup(in, D), *dwt = bup(wts, K);
        void *did = NULL;
        CHECK(G->ops->alloc(G, 16, &did, &err) == MS_OK && G->ops->upload(G, did, ids, 16, &err) == MS_OK);
        ms_moe_routed_args ra = {.in = din, .acc = dacc, .D = D, .act = &act, .ids = did, .w = dwt, .K = K, .E = E, .all = gv};
        CHECK_MSG(G->ops->moe_experts_routed(G, &ra, &err) == MS_OK, "moe_experts_routed: %s", err.msg);
        got = bget(dacc, D), cmpv("moe_experts_routed (4 of 16 bf16 experts)", got, acc, D, 1e-4, 1e-4 * maxabs(acc, D)), free(got);
        gfree(din), gfree(dacc), gfree(dwt), gfree(did);
        for (int e = 0; e < E; e++) free_w(&hv[e].gate), free_w(&hv[e].up), free_w(&hv[e].down);
        free(in), free(acc), free(xs), free(ys), free(g), free(u);
    }
    CHECK(G->ops->sync(G, &err) == MS_OK);
}

/* moe_experts_routed in every dtype and layout, fused (two launches) and legacy (four), against
 * the CPU backend's composition over the same experts in ascending id (ms_moe_experts_composed):
 * separate and fused interleaved gate_up, F32/BF16/F16 biases, the Qwen3 shape (D 2048, I 768, 8 of
 * 16), FP8 with F32 and BF16 128x128 scales (a partial block), MXFP4 (E8M0 per 32), F16, F32, and a
 * width the vector kernel refuses (the four-launch path). Bound: the summation-order bound of the
 * down dot over K I terms plus the propagated gate/up error, as 1e-4 of the output's scale. On the
 * default backend the early down (MS_GPU_RX=early, early_gbe) runs the same call too: bit-identical. */
static void check_routed(ms_backend *G, const char *what, const wkind *k, int64_t D, int64_t I, int E, int K,
                         int fused, ms_dtype bias_dt, int clamped) {
    ms_backend *C = cpu();
    ms_err err = {0};
    ms_expert_view *hv = calloc((size_t)E, sizeof *hv), *gv = calloc((size_t)E, sizeof *gv);
    void **hb = calloc((size_t)E * 3, sizeof *hb);
    int bsz = bias_dt == MS_DT_F32 ? 4 : 2;
    for (int e = 0; e < E; e++) {
        hv[e].gate = make_w(k, fused ? 2 * I : I, D), hv[e].down = make_w(k, D, I);
        if (!fused) hv[e].up = make_w(k, I, D);
        CHECK(G->ops->place_qmat(G, &hv[e].gate, &gv[e].gate, &err) == MS_OK);
        CHECK(G->ops->place_qmat(G, &hv[e].down, &gv[e].down, &err) == MS_OK);
        if (!fused) CHECK(G->ops->place_qmat(G, &hv[e].up, &gv[e].up, &err) == MS_OK);
        if (bias_dt != MS_DT_INVALID) {
            int64_t n[3] = {fused ? 2 * I : I, fused ? 0 : I, D};
            for (int b = 0; b < 3; b++) {
                if (!n[b]) continue;
                float *f = randv(n[b], 0.5f);
                void *h = malloc((size_t)n[b] * bsz);
                for (int64_t i = 0; i < n[b]; i++) {
                    if (bias_dt == MS_DT_F32) ((float *)h)[i] = f[i];
                    else if (bias_dt == MS_DT_BF16) ((uint16_t *)h)[i] = ms_f32_to_bf16(f[i]);
                    else ((uint16_t *)h)[i] = ms_f32_to_f16(f[i]);
                }
                void *d = NULL;
                CHECK(G->ops->alloc(G, (size_t)n[b] * bsz, &d, &err) == MS_OK);
                CHECK(G->ops->upload(G, d, h, (size_t)n[b] * bsz, &err) == MS_OK);
                hb[3 * e + b] = h;
                const void **hs = b == 0 ? &hv[e].gate_bias : b == 1 ? &hv[e].up_bias : &hv[e].down_bias;
                const void **gs = b == 0 ? &gv[e].gate_bias : b == 1 ? &gv[e].up_bias : &gv[e].down_bias;
                *hs = h, *gs = d;
                free(f);
            }
            hv[e].bias_dtype = gv[e].bias_dtype = bias_dt;
        }
    }
    /* K distinct ids in a scrambled order, their weights */
    int ids[32], sorted[32], tok[32] = {0}, off[33];
    float wts[32], sw[32];
    for (int i = 0; i < K; i++) ids[i] = (int)((i * 7 + 3) % E);
    for (int i = 0; i < K; i++) wts[i] = 0.05f + (float)unif();
    for (int i = 0; i < K; i++) sorted[i] = ids[i];
    for (int i = 1; i < K; i++)
        for (int j = i; j > 0 && sorted[j] < sorted[j - 1]; j--) {
            int t = sorted[j];
            sorted[j] = sorted[j - 1], sorted[j - 1] = t;
        }
    ms_expert_view sv[32];
    for (int i = 0; i < K; i++) {
        sv[i] = hv[sorted[i]];
        for (int j = 0; j < K; j++)
            if (ids[j] == sorted[i]) sw[i] = wts[j];
        off[i] = i;
    }
    off[K] = K;
    ms_glu act = {.kind = MS_ACT_SILU, .limit = 7.0f, .alpha = clamped ? 1.702f : 1.0f, .up_offset = clamped ? 1.0f : 0.0f};
    float *in = randv(D, 1.0f), *acc = calloc((size_t)D, 4), *xs = malloc((size_t)D * 4), *ys = malloc((size_t)D * 4);
    float *gbuf = malloc((size_t)2 * I * 4), *ubuf = malloc((size_t)2 * I * 4);
    ms_moe_args ma = {.in = in, .acc = acc, .D = D, .act = &act, .nu = K, .views = sv, .off = off, .tok = tok,
                      .w = sw, .max_batch = 1, .xs = xs, .g = gbuf, .u = ubuf, .ys = ys};
    C->ops->moe_experts(C, &ma);
    void *din = NULL, *dacc = NULL, *dwt = NULL, *did = NULL;
    CHECK(G->ops->alloc(G, (size_t)D * 4, &din, &err) == MS_OK && G->ops->upload(G, din, in, (size_t)D * 4, &err) == MS_OK);
    CHECK(G->ops->alloc(G, (size_t)D * 4, &dacc, &err) == MS_OK);
    CHECK(G->ops->alloc(G, 128, &dwt, &err) == MS_OK && G->ops->upload(G, dwt, wts, (size_t)K * 4, &err) == MS_OK);
    CHECK(G->ops->alloc(G, 128, &did, &err) == MS_OK && G->ops->upload(G, did, ids, (size_t)K * 4, &err) == MS_OK);
    ms_moe_routed_args ra = {.in = din, .acc = dacc, .D = D, .act = &act, .ids = did, .w = dwt, .K = K, .E = E, .all = gv};
    CHECK_MSG(G->ops->moe_experts_routed(G, &ra, &err) == MS_OK, "%s: %s", what, err.msg);
    float *got = malloc((size_t)D * 4);
    CHECK(G->ops->download(G, got, dacc, (size_t)D * 4, &err) == MS_OK);
    if (G == gbe()) { /* MS_GPU_RX=early over the same device buffers: the same bits */
        ms_backend *T = early_gbe();
        void *dacc2 = NULL;
        CHECK(G->ops->alloc(G, (size_t)D * 4, &dacc2, &err) == MS_OK);
        ms_moe_routed_args rb = ra;
        rb.acc = dacc2;
        CHECK_MSG(T->ops->moe_experts_routed(T, &rb, &err) == MS_OK, "%s (early): %s", what, err.msg);
        float *got2 = malloc((size_t)D * 4);
        CHECK(T->ops->download(T, got2, dacc2, (size_t)D * 4, &err) == MS_OK);
        int64_t ndiff = 0;
        for (int64_t d = 0; d < D; d++) ndiff += memcmp(&got[d], &got2[d], 4) != 0;
        CHECK_MSG(ndiff == 0, "%s: MS_GPU_RX=early differs from the default kernels in %lld of %lld outputs", what,
                  (long long)ndiff, (long long)D);
        free(got2), G->ops->free(G, dacc2);
    }
    /* per_call (streamed experts): this call's K views in ascending id, each slot's id its rank
     * among the K: the resident call's sum bit for bit, twice (the table buffer reused) */
    ms_expert_view pv[32];
    int rank[32];
    for (int i = 0; i < K; i++) pv[i] = gv[sorted[i]];
    for (int j = 0; j < K; j++) {
        rank[j] = 0;
        for (int q = 0; q < K; q++) rank[j] += ids[q] < ids[j];
    }
    void *drk = NULL;
    CHECK(G->ops->alloc(G, 128, &drk, &err) == MS_OK && G->ops->upload(G, drk, rank, (size_t)K * 4, &err) == MS_OK);
    ms_moe_routed_args rp = ra;
    rp.ids = drk, rp.E = K, rp.all = pv, rp.per_call = 1;
    float *got2 = malloc((size_t)D * 4);
    for (int rep = 0; rep < 2; rep++) {
        G->ops->zero(G, dacc, (size_t)D * 4);
        CHECK_MSG(G->ops->moe_experts_routed(G, &rp, &err) == MS_OK, "%s per_call: %s", what, err.msg);
        CHECK(G->ops->download(G, got2, dacc, (size_t)D * 4, &err) == MS_OK);
        CHECK_MSG(!memcmp(got, got2, (size_t)D * 4), "%s: per_call differs from the resident call", what);
    }
    free(got2);
    G->ops->free(G, drk);
    cmpv(what, got, acc, D, 1e-4, 1e-4 * maxabs(acc, D));
    free(got);
    G->ops->free(G, din), G->ops->free(G, dacc), G->ops->free(G, dwt), G->ops->free(G, did);
    for (int e = 0; e < E; e++) {
        free_w(&hv[e].gate), free_w(&hv[e].down);
        if (!fused) free_w(&hv[e].up);
        for (int b = 0; b < 3; b++) free(hb[3 * e + b]);
        if (gv[e].gate_bias) G->ops->free(G, (void *)gv[e].gate_bias);
        if (gv[e].up_bias) G->ops->free(G, (void *)gv[e].up_bias);
        if (gv[e].down_bias) G->ops->free(G, (void *)gv[e].down_bias);
    }
    free(hv), free(gv), free(hb), free(in), free(acc), free(xs), free(ys), free(gbuf), free(ubuf);
}

TEST(backend_routed_experts) {
    SKIP_UNLESS_SELECTED("backend_routed_experts");
    for (int leg = 0; leg < 2; leg++) {
        ms_backend *G = leg ? legacy_gbe() : gbe();
        const char *p = leg ? "legacy" : "fused";
        char w[96];
#define RX(desc, k, D, I, E, K, fu, bdt, cl) \
    snprintf(w, sizeof w, "routed %s: %s", p, desc), check_routed(G, w, k, D, I, E, K, fu, bdt, cl)
        RX("bf16 qwen3 shape 8 of 16", &K_BF16, 2048, 768, 16, 8, 0, MS_DT_INVALID, 0);
        RX("fp8 f32 128x128, 8 of 16", &K_FP8, 2048, 768, 16, 8, 0, MS_DT_INVALID, 0);
        RX("fp8 bf16 128x128, I 320 (partial block)", &K_FP8B, 512, 320, 12, 3, 0, MS_DT_INVALID, 0);
        RX("mxfp4 fused gate_up, bf16 biases, clamped", &K_F4, 576, 320, 12, 4, 1, MS_DT_BF16, 1);
        RX("mxfp4 separate, 6 of 16", &K_F4, 1024, 512, 16, 6, 0, MS_DT_INVALID, 0);
        RX("mxfp4 qwen3 shape, 8 of 8", &K_F4, 2048, 768, 8, 8, 0, MS_DT_INVALID, 0);
        RX("fp8 7168 x 256, 2 of 4 (4 chunks a lane)", &K_FP8, 7168, 256, 4, 2, 0, MS_DT_INVALID, 0);
        RX("fp8 256 x 2048, 8 of 8 (a long virtual down row)", &K_FP8, 256, 2048, 8, 8, 0, MS_DT_INVALID, 0);
        RX("bf16 fused gate_up, f32 biases", &K_BF16, 512, 256, 8, 2, 1, MS_DT_F32, 0);
        RX("f16 separate, f16 biases", &K_F16, 256, 128, 8, 3, 0, MS_DT_F16, 0);
        RX("f32 separate, 1 of 4", &K_F32, 256, 96, 4, 1, 0, MS_DT_INVALID, 0);
        RX("f32 I 36, 3 of 4", &K_F32, 256, 36, 4, 3, 0, MS_DT_INVALID, 0);
        RX("bf16 I 100 (not a vector width)", &K_BF16, 256, 100, 8, 4, 0, MS_DT_INVALID, 0);
        RX("bf16 32 of 64", &K_BF16, 256, 128, 64, 32, 0, MS_DT_INVALID, 0);
#undef RX
    }
    ms_err err = {0};
    CHECK(gbe()->ops->sync(gbe(), &err) == MS_OK);
}

/* INT4 routed experts (compressed-tensors pack-quantized, core/qmat.h I4; Kimi K2 / K2.5):
 * decode through moe_experts_routed (fused two launches and the legacy four) and prefill
 * through the grouped GEMMs (hi + lo BF16 parts, exact for BF16 / F16 group scales), on the
 * Kimi K2 expert shape (hidden 7168, inter 2048), the Qwen3 shape with zero points
 * (asymmetric), F16 scales per 128 with a partial group, groups of 8 and an inter width the
 * vector kernel refuses; bounds as check_routed / check_gemm_moe (split_err 0: exact parts). */
TEST(backend_int4_routed_experts) {
    SKIP_UNLESS_SELECTED("backend_int4_routed_experts");
    for (int leg = 0; leg < 2; leg++) {
        ms_backend *G = leg ? legacy_gbe() : gbe();
        const char *p = leg ? "legacy" : "fused";
        char w[128];
#define RX(desc, k, D, I, E, K, fu, bdt, cl) \
    snprintf(w, sizeof w, "routed %s: %s", p, desc), check_routed(G, w, k, D, I, E, K, fu, bdt, cl)
        RX("int4 kimi k2 shape 7168 x 2048, 4 of 8", &K_I4, 7168, 2048, 8, 4, 0, MS_DT_INVALID, 0);
        RX("int4 asym qwen3 shape 2048 x 768, 8 of 16", &K_I4Z, 2048, 768, 16, 8, 0, MS_DT_INVALID, 0);
        RX("int4 asym f16 1x128, fused gate_up, bf16 biases, clamped", &K_I4ZH, 512, 384, 8, 3, 1, MS_DT_BF16, 1);
        RX("int4 f16 1x128, I 320 (partial group)", &K_I4H, 384, 320, 8, 2, 0, MS_DT_INVALID, 0);
        RX("int4 groups of 8 (generic kernel)", &K_I4G8, 256, 128, 8, 2, 0, MS_DT_F32, 0);
        RX("int4 I 200 (not a vector width)", &K_I4, 256, 200, 8, 4, 0, MS_DT_INVALID, 0);
        RX("int4 asym I 200, 1 of 4", &K_I4Z, 256, 200, 4, 1, 0, MS_DT_INVALID, 0);
#undef RX
    }
    ms_err err = {0};
    CHECK(gbe()->ops->sync(gbe(), &err) == MS_OK);
}

TEST(backend_int4_gemm) {
    SKIP_UNLESS_SELECTED("backend_int4_gemm");
    ms_backend *G = gbe();
    CHECK(ms_backend_gpu_gemm_min(G, 2, 2, 2) == MS_OK); /* every n >= 2 through the GEMMs */
    check_gemm_dense(&K_I4, 333, 1024, 40, 1);
    check_gemm_dense(&K_I4Z, 1001, 2048, 17, 0);
    check_gemm_dense(&K_I4ZH, 129, 2944, 9, 0); /* 23 groups of 128 */
    check_gemm_moe("int4 kimi k2 shape (7168 x 2048)", &K_I4, 8, 2, 17, 7168, 2048, 0, 0, 0.0f, 0);
    check_gemm_moe("int4 asym qwen3 shape (2048 x 768)", &K_I4Z, 16, 4, 40, 2048, 768, 0, 0, 0.0f, 0);
    check_gemm_moe("int4 asym f16 1x128 fused gate_up, biases, limit 7, I 320", &K_I4ZH, 8, 4, 33, 384, 320, 1, 1, 7.0f, 0);
    check_gemm_moe("int4 groups of 8, I 200", &K_I4G8, 8, 2, 21, 256, 200, 0, 0, 0.0f, 0);
    check_gemm_moe("int4 one hot expert (300 rows)", &K_I4, 6, 2, 300, 128, 64, 0, 0, 0.0f, 1);
    CHECK(ms_backend_gpu_gemm_min(G, 16, 48, 4) == MS_OK); /* back near the defaults for the other tests */
}

TEST(backend_attention) {
    SKIP_UNLESS_SELECTED("backend_attention");
    ms_backend *C = cpu(), *G = gbe();
    ms_err err = {0};
    /* GQA prefill past one launch's 16 tokens, window and sinks; the bound of check_attn */
    {
        int H = 16, KV = 4, hd = 64, vd = 64, window = 40, n = 21;
        int64_t ctx = 300, pos0 = ctx - n, kd = (int64_t)KV * hd, vt = (int64_t)KV * vd;
        float *q = randv((int64_t)n * H * hd, 1.0f), *k = randv(ctx * kd, 1.0f), *v = randv(ctx * vt, 1.0f);
        float *sinks = randv(H, 2.0f), *ref = malloc((size_t)n * H * vd * 4);
        float *dq = bup(q, (int64_t)n * H * hd), *dk = bup(k, ctx * kd), *dv = bup(v, ctx * vt), *ds = bup(sinks, H);
        float *dout = bup(ref, (int64_t)n * H * vd);
        float scale = 1.0f / sqrtf((float)hd);
        ms_attn_gqa_args a = {.out = ref, .q = q, .k = k, .v = v, .n = n, .n_past = pos0, .H = H, .KV = KV, .hd = hd,
                              .vd = vd, .window = window, .sinks = sinks, .scale = scale};
        CHECK(C->ops->attn_gqa(C, &a, &err) == MS_OK);
        ms_attn_gqa_args b = a;
        b.out = dout, b.q = dq, b.k = dk, b.v = dv, b.sinks = ds;
        CHECK_MSG(G->ops->attn_gqa(G, &b, &err) == MS_OK, "%s", err.msg);
        float *got = bget(dout, (int64_t)n * H * vd);
        double ds_ = (hd + 3) * U32 * hd * maxabs(q, (int64_t)n * H * hd) * maxabs(k, ctx * kd) * scale;
        double tol = (2 * ds_ + 2 * (window / 4.0 + 16) * U32 + 8 * U32) * maxabs(v, ctx * vt);
        cmpv("attn_gqa prefill 21 tokens, window 40, sinks", got, ref, (int64_t)n * H * vd, 0, tol);
        gfree(dq), gfree(dk), gfree(dv), gfree(ds), gfree(dout);
        free(q), free(k), free(v), free(sinks), free(ref), free(got);
    }
    /* MLA: absorbed (decode and a chunk, with a DSA-style selection) and expanded, against the
     * CPU's absorbed form. First-order bound: q_lat = W_UK^T q_nope (nope terms), scores over
     * lora + rope terms, p relative error 2 dscore + the exp / sum roundings (keys u), o_lat in
     * units of the latent, then W_UV o_lat (lora terms); each sum within (terms) u sum|terms|. */
    for (int form = 0; form < 3; form++) {
        int64_t H = 4, lora = 64, rope = 16, nope = 32, vdm = 32, qk = nope + rope, lw = lora + rope;
        int n = form == 0 ? 1 : 18;
        int64_t ctx = 100, pos0 = ctx - n;
        ms_qmat kvb = make_w(&K_BF16, H * (nope + vdm), lora), dkvb;
        CHECK(G->ops->place_qmat(G, &kvb, &dkvb, &err) == MS_OK);
        float *q = randv((int64_t)n * H * qk, 1.0f), *lat = randv(ctx * lw, 1.0f), *ref = malloc((size_t)n * H * vdm * 4);
        float *dq = bup(q, (int64_t)n * H * qk), *dl = bup(lat, ctx * lw), *dout = bup(ref, (int64_t)n * H * vdm);
        int32_t *sel = NULL, *cnt = NULL;
        int64_t sw = 24;
        if (form == 2) { /* every other position up to p, at most sw of them */
            sel = malloc((size_t)n * sw * 4), cnt = malloc((size_t)n * 4);
            for (int t = 0; t < n; t++) {
                int64_t p = pos0 + t, c = 0;
                for (int64_t s = p % 2; s <= p && c < sw; s += 2) sel[t * sw + c++] = (int32_t)s;
                cnt[t] = (int32_t)c;
            }
        }
        float scale = 1.0f / sqrtf((float)qk);
        ms_attn_mla_args a = {.out = ref, .q = q, .latent = lat, .kv_b = &kvb, .n = n, .n_past = pos0, .H = H,
                              .lora = lora, .rope = rope, .nope = nope, .vd = vdm, .scale = scale, .sel = sel,
                              .sel_count = cnt, .sel_width = sw};
        CHECK(C->ops->attn_mla(C, &a, &err) == MS_OK);
        ms_attn_mla_args b = a;
        b.out = dout, b.q = dq, b.latent = dl, b.kv_b = &dkvb, b.expanded = form == 1;
        CHECK_MSG(G->ops->attn_mla(G, &b, &err) == MS_OK, "%s", err.msg);
        float *got = bget(dout, (int64_t)n * H * vdm);
        double qm = maxabs(q, (int64_t)n * H * qk), cm = maxabs(lat, ctx * lw), wm = 0;
        float *row = malloc((size_t)lora * 4);
        for (int64_t r = 0; r < kvb.rows; r++) {
            ms_qmat_row(&kvb, r, row);
            wm = fmax(wm, maxabs(row, lora));
        }
        double Aq = nope * qm * wm, dq_ = 2 * nope * U32 * Aq;
        double S = lora * Aq * cm + rope * qm * cm, dsc = scale * (2 * lw * U32 * S + lora * dq_ * cm);
        double dol = (2 * dsc + (ctx + 16) * U32) * cm;
        double tol = lora * wm * dol + 2 * lora * U32 * lora * wm * cm;
        const char *what = form == 0 ? "attn_mla absorbed, decode" : form == 1 ? "attn_mla expanded, 18 tokens"
                                                                              : "attn_mla absorbed, 18 tokens, selection";
        cmpv(what, got, ref, (int64_t)n * H * vdm, 0, tol);
        gfree(dq), gfree(dl), gfree(dout), free(q), free(lat), free(ref), free(got), free(sel), free(cnt), free(row);
        free_w(&kvb);
    }
    /* Attention Residuals: scores in double on both; the softmax (CPU vector kernel 2e-6) and the mix */
    {
        int nb = 3, n = 5;
        int64_t d = 1024, bs = 16 * d;
        float *blocks = randv(nb * bs, 1.0f), *cur = randv(n * d, 1.0f), *nm = randv(d, 0.1f), *pj = randv(d, 0.1f);
        float *ref = malloc((size_t)n * d * 4);
        float *dbk = bup(blocks, nb * bs), *dc = bup(cur, n * d), *dn = bup(nm, d), *dp = bup(pj, d), *dout = bup(ref, n * d);
        C->ops->attn_res_mix(C, ref, blocks, nb, bs, cur, n, d, nm, pj, 1e-6f);
        G->ops->attn_res_mix(G, dout, dbk, nb, bs, dc, n, d, dn, dp, 1e-6f);
        float *got = bget(dout, n * d);
        double vm = fmax(maxabs(blocks, nb * bs), maxabs(cur, n * d));
        cmpv("attn_res_mix, 3 blocks", got, ref, n * d, 0, ((nb + 8) * 4 * U32 + 4e-6) * (nb + 1) * vm);
        gfree(dbk), gfree(dc), gfree(dn), gfree(dp), gfree(dout), free(blocks), free(cur), free(nm), free(pj), free(ref), free(got);
    }
}

/* ------------------------------ linear attention, DSA, compressed attention, mHC */

/* an F32 weight from host values (owned by the caller) */
static ms_qmat qm(float *v, int64_t rows, int64_t cols) {
    ms_qmat w = {.dtype = MS_DT_F32, .rows = rows, .cols = cols, .data = v};
    return w;
}
static ms_qmat placed(const ms_qmat *w) {
    ms_qmat d = *w;
    ms_err err = {0};
    if (w->data) CHECK_MSG(gbe()->ops->place_qmat(gbe(), w, &d, &err) == MS_OK, "place: %s", err.msg);
    return d;
}
static float *onesv(int64_t n, float s) { /* 1 + s * gauss: norm weights */
    float *v = randv(n, s);
    for (int64_t i = 0; i < n; i++) v[i] += 1.0f;
    return v;
}

/* KDA (both decay gates, both output gates) and the gated DeltaNet: a 20-token prefill (the
 * CPU's chunked form, the GPU's recurrence) then two decode steps (both recurrent), outputs and
 * the final state. First-order bound: each output is a chain of F32 sums (the input projection
 * D terms, the recurrence 2 dk terms per token seen, carried with factors <= 1, the norm dk and
 * the output projection C terms), relative error (D + 2 T dk + dk + C) u per side at O(1)
 * gates; x 8 for the chain's condition (the L2 norms, the gated norm's 1 / rms, the chunked
 * form's triangular solve). */
TEST(backend_linear) {
    SKIP_UNLESS_SELECTED("backend_linear");
    ms_backend *C = cpu(), *G = gbe();
    ms_err err = {0};
    for (int variant = 0; variant < 5; variant++) { /* 3: KDA at head dim 128 (the decode kernel's 4 blocks a head); 4: DeltaNet, value dim 32 (k_delta_tile) */
        const int D = 256, T1 = 20, T = T1 + 2;
        int64_t conv_len, S_len, out_n = (int64_t)T * D;
        float *x = randv(out_n, 1.0f), *ref = calloc((size_t)out_n, 4), *dx = bup(x, out_n), *dout = bup(ref, out_n);
        float *bufs[32];
        int nb = 0;
#define HV(n, s) (bufs[nb++] = randv((n), (s)))
        const char *what;
        int dk, Cw;
        ms_kda_config kc = {0};
        ms_gdn_config gc = {0};
        ms_kda_weights kw = {0}, dkw;
        ms_gdn_weights gw = {0}, dgw;
        const int kda = variant != 2 && variant != 4, lb = variant == 1;
        if (kda) {
            const int H = variant == 3 ? 2 : 4, d = variant == 3 ? 128 : 32, K = 4, Cc = H * d;
            kc = (ms_kda_config){D, H, d, K, lb ? MS_DECAY_LOWER_BOUND : MS_DECAY_SOFTPLUS, -5.0f, lb, 1e-6f};
            kw.q_proj = qm(HV(Cc * D, 0.06f), Cc, D), kw.k_proj = qm(HV(Cc * D, 0.06f), Cc, D);
            kw.v_proj = qm(HV(Cc * D, 0.06f), Cc, D);
            kw.q_conv = qm(HV(Cc * K, 0.5f), Cc, K), kw.k_conv = qm(HV(Cc * K, 0.5f), Cc, K);
            kw.v_conv = qm(HV(Cc * K, 0.5f), Cc, K);
            kw.f_a = qm(HV(d * D, 0.06f), d, D), kw.f_b = qm(HV(Cc * d, 0.2f), Cc, d);
            kw.A_log = qm(HV(H, 0.5f), 1, H), kw.dt_bias = qm(HV(Cc, 0.5f), 1, Cc);
            kw.b_proj = qm(HV(H * D, 0.06f), H, D);
            if (lb) kw.g_proj = qm(HV(Cc * D, 0.06f), Cc, D);
            else kw.g_a = qm(HV(d * D, 0.06f), d, D), kw.g_b = qm(HV(Cc * d, 0.2f), Cc, d);
            kw.o_norm = qm(bufs[nb++] = onesv(d, 0.1f), 1, d), kw.o_proj = qm(HV(D * Cc, 0.06f), D, Cc);
            dkw = kw;
            ms_qmat *src = &kw.q_proj, *dst = &dkw.q_proj;
            for (size_t i = 0; i < sizeof kw / sizeof kw.q_proj; i++) dst[i] = placed(&src[i]);
            ms_kda_state_lens(&kc, &conv_len, &S_len);
            what = lb ? "kda_forward (lower-bound gate, full-rank gate)"
                 : variant == 3 ? "kda_forward (softplus, low-rank gate, head dim 128)"
                                : "kda_forward (softplus, low-rank gate)";
            dk = d, Cw = Cc;
        } else {
            const int Hk = 2, Hv = 4, k = 32, v = variant == 4 ? 32 : 24, K = 4;
            const int64_t Kd = Hk * k, Vd = Hv * v, Cc = 2 * Kd + Vd, P = 2 * Kd + 2 * Vd;
            gc = (ms_gdn_config){D, Hk, Hv, k, v, K, 1e-6f};
            gw.in_qkvz = qm(HV(P * D, 0.06f), P, D), gw.in_ba = qm(HV(2 * Hv * D, 0.06f), 2 * Hv, D);
            gw.conv = qm(HV(Cc * K, 0.5f), Cc, K), gw.A_log = qm(HV(Hv, 0.5f), 1, Hv);
            gw.dt_bias = qm(HV(Hv, 0.5f), 1, Hv), gw.norm = qm(bufs[nb++] = onesv(v, 0.1f), 1, v);
            gw.out_proj = qm(HV(D * Vd, 0.06f), D, Vd);
            dgw = gw;
            ms_qmat *src = &gw.in_qkvz, *dst = &dgw.in_qkvz;
            for (size_t i = 0; i < sizeof gw / sizeof gw.in_qkvz; i++) dst[i] = placed(&src[i]);
            ms_gdn_state_lens(&gc, &conv_len, &S_len);
            what = variant == 4 ? "gdn_forward (2 key heads, 4 value heads, value dim 32)"
                                : "gdn_forward (2 key heads, 4 value heads)";
            dk = k, Cw = (int)Vd;
        }
#undef HV
        ms_kda_state hs = {calloc((size_t)conv_len + 1, 4), calloc((size_t)S_len, 4), conv_len, S_len};
        float *z = calloc((size_t)(conv_len + S_len + 1), 4);
        ms_kda_state ds = {bup(z, conv_len + 1), bup(z, S_len), conv_len, S_len};
        int steps[3] = {T1, 1, 1}, t0 = 0;
        for (int s = 0; s < 3; s++) {
            int n = steps[s], rc1, rc2;
            if (kda) {
                rc1 = C->ops->kda_forward(C, &kc, &kw, &hs, x + (int64_t)t0 * D, n, ref + (int64_t)t0 * D, &err);
                rc2 = G->ops->kda_forward(G, &kc, &dkw, &ds, dx + (int64_t)t0 * D, n, dout + (int64_t)t0 * D, &err);
            } else {
                rc1 = C->ops->gdn_forward(C, &gc, &gw, &hs, x + (int64_t)t0 * D, n, ref + (int64_t)t0 * D, &err);
                rc2 = G->ops->gdn_forward(G, &gc, &dgw, &ds, dx + (int64_t)t0 * D, n, dout + (int64_t)t0 * D, &err);
            }
            CHECK_MSG(rc1 == MS_OK && rc2 == MS_OK, "%s: %s", what, err.msg);
            t0 += n;
        }
        double rel = 8 * (D + 2.0 * T * dk + dk + Cw) * U32;
        float *got = bget(dout, out_n);
        char name[160];
        snprintf(name, sizeof name, "%s, out", what);
        cmpv(name, got, ref, out_n, 0, rel * maxabs(ref, out_n));
        float *gS = bget(ds.S, S_len);
        snprintf(name, sizeof name, "%s, state", what);
        cmpv(name, gS, hs.S, S_len, 0, rel * maxabs(hs.S, S_len));
        free(got), free(gS), free(z), free(hs.conv), free(hs.S), gfree(ds.conv), gfree(ds.S);
        gfree(dx), gfree(dout), free(x), free(ref);
        for (int i = 0; i < nb; i++) free(bufs[i]);
    }
}

/* The DSA indexer (per-token keys with both RoPE layouts, KPool with its tail): a 20-token
 * chunk and a decode step, then a re-check of an earlier query in a longer forward. The
 * prepared keys and queries within the LayerNorm / RoPE roundings (D u); the selections
 * identical (the GPU's scores, within (H D + H) u of the CPU's, pass through the CPU's own
 * torch.topk emulation; exact ties, the relu's zeros, are exact on both). */
TEST(backend_dsa) {
    SKIP_UNLESS_SELECTED("backend_dsa");
    ms_backend *C = cpu(), *G = gbe();
    ms_err err = {0};
    for (int variant = 0; variant < 3; variant++) {
        ms_dsa_cfg cfg = {.n_heads = 4, .head_dim = 32, .rope_dims = variant == 2 ? 0 : 16,
                          .rope_layout = variant == 1 ? MS_DSA_ROPE_INTERLEAVED : MS_DSA_ROPE_HALF, .topk = 8,
                          .kpool = variant == 2 ? 4 : 1, .kpool_tail = 1, .ln_eps = 1e-6f};
        const int H = cfg.n_heads, D = cfg.head_dim, W = ms_dsa_row_width(&cfg), cap = 64, kp = variant == 2 ? 4 : 1;
        ms_rope rope;
        memset(&rope, 0, sizeof rope);
        rope.dim = 16, rope.layout = MS_ROPE_HALF, rope.attn_factor = 1.0;
        for (int i = 0; i < 8; i++) rope.inv_freq[i] = pow(10000.0, -2.0 * i / 16);
        float *ape = randv(kp * D, 0.5f), *lnw = onesv(D, 0.1f), *lnb = randv(D, 0.1f);
        ms_dsa_cache hc;
        CHECK(ms_dsa_cache_init(&hc, &cfg, ape, cap, &err) == MS_OK);
        float *zero = calloc((size_t)cap * D, 4);
        ms_dsa_cache dc = {.head_dim = D, .kpool = kp, .len = 0, .cap = cap, .keys = bup(zero, cap * D),
                           .gates = bup(zero, cap * D), .pooled = bup(zero, cap * D), .ape = bup(ape, kp * D)};
        float *dlnw = bup(lnw, D), *dlnb = bup(lnb, D);
        int steps[2] = {20, 1};
        int64_t pos0 = 0;
        int bad = 0;
        double qerr = 0;
        for (int s = 0; s < 2; s++) {
            int n = steps[s];
            float *q = randv((int64_t)n * H * D, 1.0f), *k = randv((int64_t)n * D, 1.0f), *g = randv((int64_t)n * D, 1.0f);
            float *w = randv((int64_t)n * H, 1.0f);
            for (int i = 0; i < n * H; i += 3) w[i] = -fabsf(w[i]); /* negative weights: scores of both signs */
            float *dq = bup(q, (int64_t)n * H * D), *dk = bup(k, (int64_t)n * D), *dg = bup(g, (int64_t)n * D);
            float *dw = bup(w, (int64_t)n * H);
            int32_t *i1 = malloc((size_t)n * W * 4), *i2 = malloc((size_t)n * W * 4), c1[32], c2[32];
            uint8_t a1[32], a2[32];
            ms_dsa_index_args a = {.cfg = &cfg, .cache = &hc, .q = q, .k = k, .g = kp > 1 ? g : NULL, .w = w,
                                   .k_norm_w = lnw, .k_norm_b = lnb, .rope = &rope, .n = n, .pos0 = pos0,
                                   .fwd_len = pos0 + n, .idx = i1, .count = c1, .ambiguous = a1};
            CHECK_MSG(C->ops->dsa_index(C, &a, &err) == MS_OK, "cpu dsa_index: %s", err.msg);
            ms_dsa_index_args b = a;
            b.cache = &dc, b.q = dq, b.k = dk, b.g = kp > 1 ? dg : NULL, b.w = dw, b.k_norm_w = dlnw, b.k_norm_b = dlnb;
            b.idx = i2, b.count = c2, b.ambiguous = a2;
            CHECK_MSG(G->ops->dsa_index(G, &b, &err) == MS_OK, "gpu dsa_index: %s", err.msg);
            float *gq = bget(dq, (int64_t)n * H * D);
            for (int64_t i = 0; i < (int64_t)n * H * D; i++) qerr = fmax(qerr, fabs(gq[i] - q[i]));
            for (int t = 0; t < n; t++) {
                bad += c1[t] != c2[t] || memcmp(i1 + t * W, i2 + t * W, (size_t)W * 4) || a1[t] != a2[t];
            }
            if (s == 1) { /* re-check position 5 (prepared queries of the first chunk are gone: use this one at 5) */
                int32_t r1[32], r2[32], n1 = 0, n2 = 0;
                CHECK(C->ops->dsa_recheck(C, &cfg, &hc, q, w, 5, 40, r1, &n1, &err) == MS_OK);
                CHECK_MSG(G->ops->dsa_recheck(G, &cfg, &dc, dq, dw, 5, 40, r2, &n2, &err) == MS_OK, "%s", err.msg);
                bad += n1 != n2 || memcmp(r1, r2, (size_t)n1 * 4);
            }
            free(gq), gfree(dq), gfree(dk), gfree(dg), gfree(dw), free(q), free(k), free(g), free(w), free(i1), free(i2);
            pos0 += n;
        }
        CHECK(dc.len == hc.len);
        float *gk = bget(kp > 1 ? dc.pooled : dc.keys, (hc.len / kp) * D);
        const char *what = variant == 0 ? "dsa_index half rope" : variant == 1 ? "dsa_index interleaved rope" : "dsa_index kpool 4, tail";
        char name[128];
        snprintf(name, sizeof name, "%s: %s", what, kp > 1 ? "pooled keys" : "cache keys");
        cmpv(name, gk, kp > 1 ? hc.pooled : hc.keys, (hc.len / kp) * D, 0, 4 * (D + 8) * U32 * 8);
        printf("  backend %-52s selections %s, queries max err %.2e\n", what, bad ? "DIFFER" : "identical", qerr);
        CHECK_MSG(bad == 0, "%s: %d selections differ", what, bad);
        CHECK(qerr <= 4 * 8 * U32 * 8);
        ms_dsa_cache_free(&hc);
        gfree(dc.keys), gfree(dc.gates), gfree(dc.pooled), gfree(dc.ape), gfree(dlnw), gfree(dlnb);
        free(ape), free(lnw), free(lnb), free(zero);
    }
}

/* DeepSeek V4: the compressors (plain and overlapping, a chunk that closes two windows then
 * one that closes a third across the call boundary) and the attention core (HCA, CSA with the
 * indexer's choice). Entries: softmax weights in double on both, the RMSNorm over dim terms
 * and the RoPE (dim u). Attention: scores hd terms, the exp / sum roundings, the mix over the
 * keys (keys u), as attn_gqa's bound. */
TEST(backend_compressed) {
    SKIP_UNLESS_SELECTED("backend_compressed");
    ms_backend *C = NULL, *G = gbe();
    ms_err err = {0};
    const int rate = 4, Wn = 8, H = 4, hd = 64, IH = 2, ihd = 32, topk = 3;
    { /* a CPU backend of its own, reserved for a compressed layer (its key window and entries) */
        ms_config c;
        memset(&c, 0, sizeof c);
        c.n_layers = 1, c.layer_attn[0] = MS_ATTN_COMPRESSED, c.layer_window[0] = Wn, c.layer_compress[0] = rate;
        c.hidden = 64, c.head_dim = hd, c.n_heads = H;
        CHECK(ms_backend_cpu_create(NULL, &C, &err) == MS_OK);
        CHECK_MSG(C->ops->reserve(C, &c, 9000, 32, &err) == MS_OK, "%s", err.msg);
    }
    ms_rope rope;
    memset(&rope, 0, sizeof rope);
    rope.dim = 16, rope.layout = MS_ROPE_INTERLEAVED, rope.attn_factor = 1.0;
    for (int i = 0; i < 8; i++) rope.inv_freq[i] = pow(10000.0, -2.0 * i / 16);
    for (int overlap = 0; overlap < 2; overlap++) {
        const int64_t dim = hd, cw = (overlap ? 2 : 1) * dim, ne = 8;
        float *ape = randv(rate * cw, 0.5f), *nrm = onesv(dim, 0.1f), *dape = bup(ape, rate * cw), *dn = bup(nrm, dim);
        float *z = calloc((size_t)(2 * rate * cw + ne * dim), 4);
        float *hk = calloc((size_t)(2 * rate * cw), 4), *hg = calloc((size_t)(2 * rate * cw), 4), *he = calloc((size_t)(ne * dim), 4);
        float *dk = bup(z, 2 * rate * cw), *dg = bup(z, 2 * rate * cw), *de = bup(z, ne * dim);
        int steps[2] = {10, 3};
        int64_t pos0 = 0;
        for (int s = 0; s < 2; s++) {
            int n = steps[s];
            float *kv = randv(n * cw, 1.0f), *g = randv(n * cw, 1.0f), *dkv = bup(kv, n * cw), *dgg = bup(g, n * cw);
            ms_compress_args a = {.raw_kv = hk, .raw_g = hg, .entries = he, .kv = kv, .g = g, .ape = ape, .norm = nrm,
                                  .rope = &rope, .rate = rate, .overlap = overlap, .n = n, .dim = dim, .pos0 = pos0,
                                  .eps = 1e-6f};
            CHECK(C->ops->compress_append(C, &a, &err) == MS_OK);
            ms_compress_args b = a;
            b.raw_kv = dk, b.raw_g = dg, b.entries = de, b.kv = dkv, b.g = dgg, b.ape = dape, b.norm = dn;
            CHECK_MSG(G->ops->compress_append(G, &b, &err) == MS_OK, "%s", err.msg);
            gfree(dkv), gfree(dgg), free(kv), free(g);
            pos0 += n;
        }
        float *got = bget(de, 3 * dim);
        cmpv(overlap ? "compress_append overlapping, 3 windows" : "compress_append plain, 3 windows", got, he, 3 * dim, 0,
             (dim + 2 * rate + 16) * 4 * U32 * maxabs(he, 3 * dim));
        free(got);
        got = bget(dk, 2 * rate * cw);
        cmpv("compress_append rings", got, hk, 2 * rate * cw, 0, 0);
        free(got), gfree(dape), gfree(dn), gfree(dk), gfree(dg), gfree(de), free(ape), free(nrm), free(z), free(hk), free(hg), free(he);
    }
    for (int csa = 0; csa < 2; csa++) {
        const int n = csa ? 6 : 1;
        const int64_t pos0 = 30, NC = (pos0 + n) / rate;
        float *q = randv((int64_t)n * H * hd, 0.3f), *kv = randv((int64_t)n * hd, 1.0f), *win = randv(Wn * hd, 1.0f);
        float *comp = randv(NC * hd, 1.0f), *iq = randv((int64_t)n * IH * ihd, 1.0f), *iw = randv((int64_t)n * IH, 1.0f);
        float *icomp = randv(NC * ihd, 1.0f), *sinks = randv(H, 1.0f), *ref = calloc((size_t)n * H * hd, 4);
        ms_cattn_args a = {.out = ref, .q = q, .kv = kv, .win = win, .comp = comp, .iq = iq, .iw = iw, .icomp = icomp,
                           .sinks = sinks, .n = n, .csa = csa, .pos0 = pos0, .H = H, .hd = hd, .window = Wn,
                           .rate = rate, .n_comp = NC, .idx_heads = IH, .idx_dim = ihd, .topk = topk,
                           .fwd_len = pos0 + n, .scale = 1.0f / sqrtf((float)hd)};
        CHECK_MSG(C->ops->attn_compressed(C, &a, &err) == MS_OK, "cpu: %s", err.msg);
        ms_cattn_args b = a;
        b.out = bup(ref, (int64_t)n * H * hd), b.q = bup(q, (int64_t)n * H * hd), b.kv = bup(kv, (int64_t)n * hd);
        b.win = bup(win, Wn * hd), b.comp = bup(comp, NC * hd), b.iq = bup(iq, (int64_t)n * IH * ihd);
        b.iw = bup(iw, (int64_t)n * IH), b.icomp = bup(icomp, NC * ihd), b.sinks = bup(sinks, H);
        CHECK_MSG(G->ops->attn_compressed(G, &b, &err) == MS_OK, "gpu: %s", err.msg);
        float *got = bget(b.out, (int64_t)n * H * hd);
        double km = fmax(fmax(maxabs(kv, n * hd), maxabs(win, Wn * hd)), maxabs(comp, NC * hd));
        double dsc = (hd + 3) * U32 * hd * maxabs(q, (int64_t)n * H * hd) * km * b.scale;
        double tol = (2 * dsc + (Wn + NC + 16) * U32 + 8 * U32) * km * 2;
        cmpv(csa ? "attn_compressed CSA 6 tokens, top-3 entries" : "attn_compressed HCA decode", got, ref,
             (int64_t)n * H * hd, 0, tol);
        free(got);
        gfree(b.out), gfree((void *)b.q), gfree((void *)b.kv), gfree((void *)b.win), gfree((void *)b.comp);
        gfree((void *)b.iq), gfree((void *)b.iw), gfree((void *)b.icomp), gfree((void *)b.sinks);
        free(q), free(kv), free(win), free(comp), free(iq), free(iw), free(icomp), free(sinks), free(ref);
    }
    C->ops->destroy(C);
}

/* mHC: pre (fn through the matmul's bound, the sigmoid / Sinkhorn roundings), post, expand,
 * the two hyper heads. */
TEST(backend_mhc) {
    SKIP_UNLESS_SELECTED("backend_mhc");
    ms_backend *C = cpu(), *G = gbe();
    ms_err err = {0};
    const int hc = 4, dim = 512, n = 5, mix = (2 + hc) * hc;
    float *fnv = randv((int64_t)mix * hc * dim, 0.02f), *base = randv(mix, 0.5f), *scale = randv(3, 0.5f);
    float *st = randv((int64_t)n * hc * dim, 1.0f);
    ms_qmat fn = qm(fnv, mix, hc * dim), dfn = placed(&fn);
    float *dbase = bup(base, mix), *dscale = bup(scale, 3), *dst = bup(st, (int64_t)n * hc * dim);
    ms_mhc h = {.hc = hc, .dim = dim, .fn = &fn, .base = base, .scale = scale, .sinkhorn_iters = 20, .hc_eps = 1e-6f,
                .norm_eps = 1e-6f};
    float *col = malloc((size_t)n * dim * 4), *post = malloc((size_t)n * hc * 4), *comb = malloc((size_t)n * hc * hc * 4);
    CHECK(C->ops->mhc_pre(C, &h, st, n, col, post, comb, &err) == MS_OK);
    ms_mhc hd_ = h;
    hd_.fn = &dfn, hd_.base = dbase, hd_.scale = dscale;
    float *dcol = bup(col, (int64_t)n * dim), *dpost = bup(post, n * hc), *dcomb = bup(comb, n * hc * hc);
    CHECK_MSG(G->ops->mhc_pre(G, &hd_, dst, n, dcol, dpost, dcomb, &err) == MS_OK, "%s", err.msg);
    /* m = r fn x: hc*dim terms (dot_bound); sigmoid / softmax / 20 Sinkhorn sweeps: O(iters hc) roundings */
    double dm = (dot_bound(hc * dim) + 4 * U32) * 0.02 * 4 * sqrt((double)hc * dim) * fmax(fabs(scale[0]), fmax(fabs(scale[1]), fabs(scale[2])));
    float *g1 = bget(dcol, (int64_t)n * dim), *g2 = bget(dpost, n * hc), *g3 = bget(dcomb, n * hc * hc);
    cmpv("mhc_pre collapsed", g1, col, (int64_t)n * dim, 0, (dm + 16 * U32) * hc * maxabs(st, (int64_t)n * hc * dim) * 2);
    cmpv("mhc_pre post", g2, post, n * hc, 0, (dm + 16 * U32) * 2 * 2);
    cmpv("mhc_pre comb (Sinkhorn, 20 sweeps)", g3, comb, n * hc * hc, 0, (8 * dm + 40 * 2 * hc * U32) * 4);
    free(g1), free(g2), free(g3);
    /* post / expand / mean: single roundings or hc-term sums from equal inputs */
    same(dpost, post, n * hc), same(dcomb, comb, n * hc * hc);
    float *y = randv((int64_t)n * dim, 1.0f), *dy = bup(y, (int64_t)n * dim), *out = malloc((size_t)n * hc * dim * 4);
    float *dout = bup(st, (int64_t)n * hc * dim);
    C->ops->mhc_post(C, st, y, post, comb, n, hc, dim, out), G->ops->mhc_post(G, dst, dy, dpost, dcomb, n, hc, dim, dout);
    float *g4 = bget(dout, (int64_t)n * hc * dim);
    cmpv("mhc_post", g4, out, (int64_t)n * hc * dim, 0, (hc + 2) * 2 * U32 * 4 * maxabs(st, (int64_t)n * hc * dim)), free(g4);
    C->ops->mhc_expand(C, y, n, hc, dim, out), G->ops->mhc_expand(G, dy, n, hc, dim, dout);
    g4 = bget(dout, (int64_t)n * hc * dim), cmpv("mhc_expand", g4, out, (int64_t)n * hc * dim, 0, 0), free(g4);
    C->ops->mhc_head_mean(C, st, n, hc, dim, col), G->ops->mhc_head_mean(G, dst, n, hc, dim, dcol);
    g4 = bget(dcol, (int64_t)n * dim), cmpv("mhc_head_mean", g4, col, (int64_t)n * dim, 0, 0), free(g4);
    ms_qmat hfn = qm(randv((int64_t)hc * hc * dim, 0.02f), hc, hc * dim), dhfn = placed(&hfn);
    CHECK(C->ops->mhc_head_weighted(C, &hfn, base, scale, hc, dim, 1e-6f, 1e-6f, st, n, col, &err) == MS_OK);
    CHECK_MSG(G->ops->mhc_head_weighted(G, &dhfn, dbase, dscale, hc, dim, 1e-6f, 1e-6f, dst, n, dcol, &err) == MS_OK, "%s",
              err.msg);
    g4 = bget(dcol, (int64_t)n * dim);
    cmpv("mhc_head_weighted", g4, col, (int64_t)n * dim, 0, (dm + 16 * U32) * hc * maxabs(st, (int64_t)n * hc * dim) * 2);
    free(g4);
    CHECK(G->ops->sync(G, &err) == MS_OK);
    gfree(dbase), gfree(dscale), gfree(dst), gfree(dcol), gfree(dpost), gfree(dcomb), gfree(dy), gfree(dout);
    free(fnv), free(base), free(scale), free(st), free(col), free(post), free(comb), free(y), free(out), free((void *)hfn.data);
}

/* The GPU backend with Q8 / I4 weights: the embedding (qview, exact) and the matmul /
 * matmul_many ops against the CPU backend's on the same placed weights (a Q8 static tier's
 * embedding, head and projections; INT4 matrices, symmetric and with zero points). */
TEST(matmul_q_backend) {
    SKIP_UNLESS_SELECTED("matmul_q_backend");
    ms_backend *C = cpu(), *G = gbe();
    ms_err err = {0};
    const wkind *tk[3] = {&K_Q8, &K_I4, &K_I4Z};
    for (int i = 0; i < 3; i++) {
        const int64_t V = 1000, D = 512;
        ms_qmat t = make_w(tk[i], V, D), dt;
        int rc = G->ops->place_qmat(G, &t, &dt, &err);
        CHECK_MSG(rc == MS_OK, "%s place: %s", tk[i]->name, err.msg);
        if (rc) {
            free_w(&t);
            continue;
        }
        int32_t ids[6] = {0, 999, 5, 5, 128, 300};
        float *e1 = malloc(6 * D * 4), *de = bup(e1, 6 * D), *got;
        C->ops->embed(C, e1, &t, ids, 6), G->ops->embed(G, de, &dt, ids, 6);
        got = bget(de, 6 * D), cmpv(i == 2 ? "embed (int4 asym)" : i ? "embed (int4)" : "embed (q8)", got, e1, 6 * D, 0, 0), free(got);
        /* y = W x, 3 tokens, through matmul and through matmul_many (two jobs on the same W) */
        float *x = randv(3 * D, 1.0f), *y1 = malloc(3 * V * 4), *dx = bup(x, 3 * D), *dy = bup(y1, 3 * V),
              *dy2 = bup(y1, 3 * V);
        double *l1 = malloc(3 * V * 8);
        C->ops->matmul(C, y1, x, 3, &t, 0);
        G->ops->matmul(G, dy, dx, 3, &dt, 0);
        ms_matmul_job jobs[2] = {{.y = dy2, .x = dx, .n = 3, .w = &dt, .acc = 0}, {.y = dy2, .x = dx, .n = 3, .w = &dt, .acc = 1}};
        G->ops->matmul_many(G, jobs, 2);
        l1_rows(&t, x, 3, l1);
        for (int pass = 0; pass < 2; pass++) { /* matmul; matmul_many (y = 2 W x: twice the bound, one more rounding) */
            got = bget(pass ? dy2 : dy, 3 * V);
            double worst = 0;
            int bad = 0;
            for (int64_t k = 0; k < 3 * V; k++) {
                double want = (pass ? 2.0 : 1.0) * y1[k];
                double tol = (pass ? 2.0 : 1.0) * (dot_bound(D) + D * U32) * l1[k] + (pass ? 2 * U32 * fabs(want) : 0) + 1e-30;
                double e = fabs(got[k] - want) / tol;
                if (!(e <= 1)) bad++;
                worst = fmax(worst, e);
            }
            printf("  backend %-12s %-28s n=3 max err/bound %.3f\n", pass ? "matmul_many" : "matmul", tk[i]->name, worst);
            CHECK_MSG(bad == 0, "backend %s %s: %d out of bound", pass ? "matmul_many" : "matmul", tk[i]->name, bad);
            free(got);
        }
        gfree(de), gfree(dx), gfree(dy), gfree(dy2), free(e1), free(x), free(y1), free(l1), free_w(&t);
    }
    CHECK(G->ops->sync(G, &err) == MS_OK);
}

TEST_GPU_RUNNER(test_gpu_run_backend)
