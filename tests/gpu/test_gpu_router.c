/* test_gpu_router.c — ms_gpu_router_route's one-launch kernel (matmul.cu rr1_kernel: a block per
 * router row, the last block routes) over the router geometries of the families, against the CPU
 * (ms_matmul_ref for the logits, the CPU backend's route of the GPU's own logits for the ids and
 * weights), on the default kernel and on MS_GPU_ROUTER=old. Runs under MS_GPU_TEST_ONLY=router. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gpu.h"
#include "model/config.h"
#include "ops/ops.h"
#include "test.h"
#include "test_gpu.h"

/* got vs ref elementwise within rel |ref| + abs (NaN matches NaN); prints the worst ratio */
static void rt_cmpv(const char *what, const float *got, const float *ref, int64_t n, double rel, double abs_) {
    double worst = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double tol = rel * fabs(ref[i]) + abs_, d = fabs((double)got[i] - ref[i]);
        double e = tol > 0 ? d / tol : (d == 0 ? 0 : INFINITY);
        if (isnan(ref[i]) && isnan(got[i])) e = 0;
        if (!(e <= 1)) bad++;
        if (e > worst) worst = e;
    }
    printf("  %-68s weights max err/bound %.3f\n", what, worst);
    CHECK_MSG(bad == 0, "%s: %lld of %lld weights out of bound", what, (long long)bad, (long long)n);
}

/* Two contexts of device 0 for the router kernel: the default (0) and MS_GPU_ROUTER=old while it
 * opens (1); open for the rest of the run. */
static ms_gpu *g_rctx[2];
static ms_gpu *gpu_ctx(int old) {
    if (g_rctx[old]) return g_rctx[old];
    ms_err err = {0};
    if (old) setenv("MS_GPU_ROUTER", "old", 1);
    int rc = ms_gpu_open(0, &g_rctx[old], &err);
    if (old) unsetenv("MS_GPU_ROUTER");
    if (rc) {
        fprintf(stderr, "test_gpu: GPU context: %s\n", err.msg);
        exit(1);
    }
    return g_rctx[old];
}
/* ms_gpu_router_route's kernel over the router geometries of the families (64 / 128 / 256 / 384 experts,
 * hidden 2048 / 4096 / 7168, top-k 1..16, BF16 and FP8 rows; softmax, top-k softmax, sigmoid +
 * bias) and on the edges of its rank split (E 8, 96 and 1024), on the default kernel and on the
 * earlier one (MS_GPU_ROUTER=old): logits within the dot-product bound of the CPU's matmul, ids
 * identical to the CPU's route of the GPU's own logits, weights within the route bound; the
 * default kernel run twice gives the same bits (ids, weights, logits). Every third case ties
 * the rows 8 ways or more (16 distinct rows repeated), every seventh puts a NaN in all but 2 rows
 * (top-k softmax). */
TEST(router_route_geometry) {
    SKIP_UNLESS_SELECTED("router_route_geometry");
    ms_backend *C = cpu();
    const int Es[] = {64, 128, 256, 384}, Ks[] = {1, 2, 4, 6, 8, 12, 16};
    const int64_t Ds[] = {2048, 4096, 7168};
    const ms_router_kind kinds[] = {MS_ROUTER_SOFTMAX, MS_ROUTER_TOPK_SOFTMAX, MS_ROUTER_SIGMOID};
    struct { int E, K; int64_t D; const wkind *k; ms_router_kind kind; int mode; } cs[96];
    int nc = 0, seq = 0;
    for (int ei = 0; ei < 4; ei++)
        for (int di = 0; di < 3; di++)
            for (int ki = (ei + di) % 2; ki < 7; ki += 2) { /* K 1, 4, 8, 16 or 2, 6, 12 by turns */
                int m = seq % 7 == 6 ? 2 : seq % 3 == 2 ? 1 : 0;
                cs[nc].E = Es[ei], cs[nc].K = Ks[ki], cs[nc].D = Ds[di], cs[nc].k = seq % 4 == 3 && !m ? &K_FP8 : &K_BF16;
                /* NaN logits with the top-k softmax (as backend_router_route): a softmax over them is NaN throughout */
                cs[nc].kind = m == 2 ? MS_ROUTER_TOPK_SOFTMAX : kinds[(seq + seq / 3) % 3], cs[nc].mode = m, nc++, seq++;
            }
    /* the rank split's edges: E = 8 (32 lanes per expert), 96 (not a power of two), 1024 (an expert
     * per thread and more) */
    cs[nc].E = 8, cs[nc].K = 2, cs[nc].D = 4096, cs[nc].k = &K_BF16, cs[nc].kind = MS_ROUTER_SOFTMAX, cs[nc].mode = 0, nc++;
    cs[nc].E = 96, cs[nc].K = 7, cs[nc].D = 2048, cs[nc].k = &K_BF16, cs[nc].kind = MS_ROUTER_SIGMOID, cs[nc].mode = 1, nc++;
    cs[nc].E = 1024, cs[nc].K = 32, cs[nc].D = 1024, cs[nc].k = &K_BF16, cs[nc].kind = MS_ROUTER_SOFTMAX, cs[nc].mode = 1, nc++;
    cs[nc].E = 1024, cs[nc].K = 16, cs[nc].D = 2048, cs[nc].k = &K_FP8, cs[nc].kind = MS_ROUTER_TOPK_SOFTMAX, cs[nc].mode = 0, nc++;
    for (int ci = 0; ci < nc; ci++) {
        const int E = cs[ci].E, K = cs[ci].K, mode = cs[ci].mode;
        const int64_t D = cs[ci].D;
        ms_config c;
        memset(&c, 0, sizeof c);
        c.router = cs[ci].kind, c.n_experts = E, c.top_k = K, c.n_group = 1, c.topk_group = 1;
        c.norm_topk_prob = ci % 2, c.routed_scale = ci % 5 == 0 ? 2.5f : 1.0f;
        ms_qmat w = make_w(cs[ci].k, E, D);
        if (mode && cs[ci].k == &K_BF16) {
            uint16_t *wd = (uint16_t *)w.data;
            for (int r = 16; mode == 1 && r < E; r++) memcpy(wd + (int64_t)r * D, wd + (int64_t)(r % 16) * D, (size_t)D * 2);
            for (int r = 0; mode == 2 && r < E; r++)
                if (r != 5 && r != 17) wd[(int64_t)r * D + (r * 13) % D] = 0x7fc0;
        }
        float *x = randv(D, 1.0f), *bias = randv(E, 0.3f), *ref = malloc((size_t)E * 4);
        if (mode == 1)
            for (int i = 16; i < E; i++) bias[i] = bias[i % 16];
        double *l1 = malloc((size_t)E * 8);
        ms_matmul_ref(ref, x, 1, &w);
        l1_rows(&w, x, 1, l1);
        char nm[128];
        snprintf(nm, sizeof nm, "router_route %s %d of %d, %s %lld%s", cs[ci].kind == MS_ROUTER_SOFTMAX ? "softmax"
                 : cs[ci].kind == MS_ROUTER_SIGMOID ? "sigmoid + bias" : "top-k softmax", K, E,
                 cs[ci].k == &K_FP8 ? "fp8" : "bf16", (long long)D, mode == 1 ? ", ties" : mode == 2 ? ", NaN" : "");
        float *first_l = NULL, *first_w = NULL;
        int first_id[64];
        for (int run = 0; run < 3; run++) { /* default, default again, MS_GPU_ROUTER=old */
            ms_gpu *gg = run < 2 ? gpu_ctx(0) : gpu_ctx(1);
            ms_err err = {0};
            ms_qmat dw;
            CHECK(ms_gpu_qmat_upload(gg, &w, &dw, &err) == MS_OK);
            void *p[5];
            size_t sz[5] = {(size_t)D * 4, (size_t)E * 4, (size_t)E * 4, 64 * 4, 64 * 4};
            const void *hp[5] = {x, bias, ref, ref, ref};
            for (int i = 0; i < 5; i++) {
                CHECK(ms_gpu_alloc(gg, sz[i], &p[i], &err) == MS_OK);
                CHECK(ms_gpu_upload(gg, p[i], hp[i], i < 3 ? sz[i] : (size_t)(E < 64 ? E : 64) * 4, &err) == MS_OK);
            }
            /* the one-launch kernel itself (MS_ERR_UNSUPPORTED would send the backend op to the two ops) */
            ms_gpu_route_cfg rc_ = {(ms_gpu_router)c.router, E, K, 1, 1, c.norm_topk_prob ? 1 : 0, (float)c.routed_scale};
            CHECK_MSG(ms_gpu_router_route(gg, (int32_t *)p[4], p[3], p[2], p[0], &dw, p[1], &rc_, &err) == MS_OK,
                      "%s: ms_gpu_router_route: %s", nm, err.msg);
            float *gl = malloc((size_t)E * 4), gw[64], rw[64];
            int gid[64], rid[64];
            CHECK(ms_gpu_download(gg, gl, p[2], (size_t)E * 4, &err) == MS_OK);
            CHECK(ms_gpu_download(gg, gw, p[3], (size_t)K * 4, &err) == MS_OK);
            CHECK(ms_gpu_download(gg, gid, p[4], (size_t)K * 4, &err) == MS_OK);
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
            char rn[160];
            snprintf(rn, sizeof rn, "%s%s", nm, run == 1 ? " (again)" : run == 2 ? " (old)" : "");
            if (run != 1) printf("  %-68s logits max err/bound %.3f, ids %s\n", rn, worst, idbad ? "DIFFER" : "equal");
            CHECK_MSG(lbad == 0, "%s: %d logits out of bound", rn, lbad);
            CHECK_MSG(idbad == 0, "%s: %d ids differ", rn, idbad);
            rt_cmpv(rn, gw, rw, K, 4 * (E / 256.0 + 16) * U32 + 2e-6, 1e-30);
            if (run == 0) {
                first_l = gl, gl = NULL, first_w = malloc((size_t)K * 4);
                memcpy(first_w, gw, (size_t)K * 4), memcpy(first_id, gid, (size_t)K * 4);
            } else if (run == 1) {
                CHECK_MSG(!memcmp(first_l, gl, (size_t)E * 4) && !memcmp(first_w, gw, (size_t)K * 4) &&
                              !memcmp(first_id, gid, (size_t)K * 4),
                          "%s: a second run differs", rn);
            }
            for (int i = 0; i < 5; i++) ms_gpu_free(gg, p[i]);
            ms_gpu_qmat_free(gg, &dw);
            free(gl);
        }
        free(first_l), free(first_w);
        free(x), free(bias), free(ref), free(l1), free_w(&w);
    }
}

TEST_GPU_RUNNER(test_gpu_run_router)
