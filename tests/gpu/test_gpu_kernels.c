/* test_gpu_kernels.c — the kernels of gpu.h against their twins on random inputs of real shapes:
 * matmul (ms_matmul_ref), rmsnorm (ms_rmsnorm_ref), RoPE (model/rope.c), activations, the
 * routers, GQA attention and the expert FFN (the CPU backend's glu / route / attn_gqa). The
 * tolerances are derived as test_gpu.c's head says. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "backend/gpu/gpu.h"
#include "engine/engine_internal.h"
#include "model/config.h"
#include "ops/ops.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/gpu/backend_gpu.h"
#include "backend/cpu/linear_attn.h"
#include "test.h"
#include "test_gpu.h"

/* The experts' activation on the CPU backend (u may be clamped): gpt-oss's clamped SwiGLU
 * (alpha, up offset 1) or SwiGLU with an optional limit. */
static void cpu_act(int clamped, float lim, float alpha, float *g, float *u, int64_t n) {
    ms_glu a = {.kind = MS_ACT_SILU, .limit = lim, .alpha = clamped ? alpha : 1.0f, .up_offset = clamped ? 1.0f : 0.0f};
    cpu()->ops->glu(cpu(), &a, g, u, n);
}

static void *dup_dev(const void *h, size_t bytes) {
    void *d = NULL;
    ms_err err = {0};
    if (ms_gpu_alloc(gpu(), bytes, &d, &err) || ms_gpu_upload(gpu(), d, h, bytes, &err)) {
        fprintf(stderr, "test_gpu: device buffer: %s\n", err.msg);
        exit(1);
    }
    return d;
}
static void *alloc_dev(size_t bytes) {
    void *d = NULL;
    ms_err err = {0};
    if (ms_gpu_alloc(gpu(), bytes, &d, &err)) {
        fprintf(stderr, "test_gpu: device buffer: %s\n", err.msg);
        exit(1);
    }
    return d;
}
static void get(void *h, const void *d, size_t bytes) {
    ms_err err = {0};
    int rc = ms_gpu_download(gpu(), h, d, bytes, &err);
    CHECK_MSG(rc == MS_OK, "download: %s", err.msg);
}

/* ------------------------------------------------------------ matmul */

static void check_matmul(const wkind *k, int64_t rows, int64_t cols, int n) {
    ms_err err = {0};
    ms_qmat w = make_w(k, rows, cols), dw;
    int rc = ms_gpu_qmat_upload(gpu(), &w, &dw, &err);
    CHECK_MSG(rc == MS_OK, "%s upload: %s", k->name, err.msg);
    if (rc) return;
    float *x = randv((int64_t)n * cols, 1.0f), *y0 = randv((int64_t)n * rows, 1.0f);
    float *ref = malloc((size_t)(n * rows) * 4), *got = malloc((size_t)(n * rows) * 4);
    double *l1 = malloc((size_t)(n * rows) * 8);
    ms_matmul_ref(ref, x, n, &w);
    l1_rows(&w, x, n, l1);
    float *dx = dup_dev(x, (size_t)(n * cols) * 4), *dy = alloc_dev((size_t)(n * rows) * 4);
    double bound = dot_bound(cols);
    for (int pass = 0; pass < 3; pass++) { /* 0: vector kernel, 1: generic kernel, 2: accumulate */
        if (pass == 2) ms_gpu_upload(gpu(), dy, y0, (size_t)(n * rows) * 4, &err);
        rc = pass == 1 ? ms_gpu_matmul_generic(gpu(), dy, dx, n, &dw, 0, &err)
                       : ms_gpu_matmul(gpu(), dy, dx, n, &dw, pass == 2, &err);
        CHECK_MSG(rc == MS_OK, "%s matmul: %s", k->name, err.msg);
        get(got, dy, (size_t)(n * rows) * 4);
        double worst = 0;
        int64_t bad = 0, at = -1;
        for (int64_t i = 0; i < n * rows; i++) {
            double want = ref[i] + (pass == 2 ? y0[i] : 0.0);
            double tol = bound * l1[i] + (pass == 2 ? fabs(want) * U32 * 2 : 0) + 1e-30;
            double e = fabs(got[i] - want) / tol;
            if (!(e <= 1.0)) bad++, at = at < 0 ? i : at;
            if (e > worst || isnan(e)) worst = e;
        }
        printf("  matmul %-30s [%6lld x %5lld] n=%-2d %-7s max err/bound %.3f\n", k->name, (long long)rows,
               (long long)cols, n, pass == 0 ? "vector" : pass == 1 ? "generic" : "acc", worst);
        CHECK_MSG(bad == 0, "%s [%lld x %lld] n=%d pass %d: %lld elements out of bound, first %lld: gpu %g cpu %g", k->name,
                  (long long)rows, (long long)cols, n, pass, (long long)bad, (long long)at, at >= 0 ? got[at] : 0.0,
                  at >= 0 ? ref[at] : 0.0);
    }
    ms_gpu_free(gpu(), dx), ms_gpu_free(gpu(), dy);
    ms_gpu_qmat_free(gpu(), &dw);
    free(x), free(y0), free(ref), free(got), free(l1);
    free_w(&w);
}

TEST(matmul_dtypes_real_shapes) {
    SKIP_UNLESS_SELECTED("matmul_dtypes_real_shapes");
    const wkind *all[] = {&K_F32, &K_F16, &K_BF16, &K_FP8, &K_FP8B, &K_F4};
    for (int i = 0; i < 6; i++) {
        check_matmul(all[i], 2048, 7168, 1); /* expert gate/up at hidden 7168 */
        check_matmul(all[i], 7168, 2048, 1); /* expert down */
        check_matmul(all[i], 1024, 2304, 3); /* hidden 2304, expert width 1024, small batch */
        check_matmul(all[i], 2880, 2880, 8); /* gpt-oss: 2880 = 22.5 FP8 blocks */
    }
}

TEST(matmul_odd_shapes) {
    SKIP_UNLESS_SELECTED("matmul_odd_shapes");
    check_matmul(&K_FP8, 1001, 7000, 1);  /* rows, cols not block multiples; row bytes not 16-aligned */
    check_matmul(&K_FP8B, 333, 2896, 2);  /* 16-aligned rows, partial last block */
    check_matmul(&K_BF16, 333, 7001, 1);  /* odd cols */
    check_matmul(&K_F16, 7, 4100, 5);
    check_matmul(&K_F32, 1, 3, 1);
    check_matmul(&K_F4, 1001, 2912, 11);  /* 91 scale groups; 11 tokens: 8 + 3 */
    check_matmul(&K_BF16, 129, 64, 8);
}

/* MS_GPU_MV_U=4 (a context opened with it: 4 chunks per lane a round for one token's rows of
 * more than 256 chunks) against one opened with MS_GPU_MV_U=2: the same bits (a lane's chunks in the same
 * order), on o_proj's 2048 x 4096 and wider rows of every vector dtype, and rows of 256 chunks
 * or fewer (untouched). */
TEST(matmul_mv_u4) {
    SKIP_UNLESS_SELECTED("matmul_mv_u4");
    ms_gpu *g4 = NULL, *g2 = NULL;
    ms_err err = {0};
    setenv("MS_GPU_MV_U", "4", 1);
    int rc = ms_gpu_open(0, &g4, &err);
    setenv("MS_GPU_MV_U", "2", 1);
    if (!rc) rc = ms_gpu_open(0, &g2, &err);
    unsetenv("MS_GPU_MV_U");
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    if (rc) {
        if (g4) ms_gpu_close(g4);
        return;
    }
    const struct { const wkind *k; int64_t rows, cols; } cs[] = {
        {&K_BF16, 2048, 4096}, {&K_BF16, 777, 7168}, {&K_BF16, 64, 2056}, {&K_F16, 300, 4104}, {&K_F32, 100, 2052},
        {&K_FP8, 512, 7168}, {&K_FP8B, 200, 8192}, {&K_F4, 100, 16384}, {&K_BF16, 512, 2048}};
    for (int c = 0; c < (int)(sizeof cs / sizeof cs[0]); c++) {
        ms_qmat w = make_w(cs[c].k, cs[c].rows, cs[c].cols), d1, d4;
        CHECK(ms_gpu_qmat_upload(g2, &w, &d1, &err) == MS_OK);
        CHECK(ms_gpu_qmat_upload(g4, &w, &d4, &err) == MS_OK);
        float *x = randv(cs[c].cols, 1.0f), *a = malloc((size_t)cs[c].rows * 4), *b = malloc((size_t)cs[c].rows * 4);
        void *x1, *y1, *x4, *y4;
        CHECK(ms_gpu_alloc(g2, (size_t)cs[c].cols * 4, &x1, &err) == MS_OK);
        CHECK(ms_gpu_alloc(g2, (size_t)cs[c].rows * 4, &y1, &err) == MS_OK);
        CHECK(ms_gpu_alloc(g4, (size_t)cs[c].cols * 4, &x4, &err) == MS_OK);
        CHECK(ms_gpu_alloc(g4, (size_t)cs[c].rows * 4, &y4, &err) == MS_OK);
        CHECK(ms_gpu_upload(g2, x1, x, (size_t)cs[c].cols * 4, &err) == MS_OK);
        CHECK(ms_gpu_upload(g4, x4, x, (size_t)cs[c].cols * 4, &err) == MS_OK);
        CHECK(ms_gpu_matmul(g2, (float *)y1, (const float *)x1, 1, &d1, 0, &err) == MS_OK);
        CHECK(ms_gpu_matmul(g4, (float *)y4, (const float *)x4, 1, &d4, 0, &err) == MS_OK);
        CHECK(ms_gpu_download(g2, a, y1, (size_t)cs[c].rows * 4, &err) == MS_OK);
        CHECK(ms_gpu_download(g4, b, y4, (size_t)cs[c].rows * 4, &err) == MS_OK);
        int64_t diff = 0;
        for (int64_t i = 0; i < cs[c].rows; i++) diff += memcmp(&a[i], &b[i], 4) != 0;
        printf("  matmul MS_GPU_MV_U=4 %-24s [%5lld x %5lld]: %lld of %lld rows differ\n", cs[c].k->name,
               (long long)cs[c].rows, (long long)cs[c].cols, (long long)diff, (long long)cs[c].rows);
        CHECK_MSG(diff == 0, "MS_GPU_MV_U=4 %s [%lld x %lld]: %lld rows differ", cs[c].k->name, (long long)cs[c].rows,
                  (long long)cs[c].cols, (long long)diff);
        ms_gpu_free(g2, x1), ms_gpu_free(g2, y1), ms_gpu_free(g4, x4), ms_gpu_free(g4, y4);
        ms_gpu_qmat_free(g2, &d1), ms_gpu_qmat_free(g4, &d4);
        free(x), free(a), free(b), free_w(&w);
    }
    ms_gpu_close(g4), ms_gpu_close(g2);
}

TEST(matmul_vocab_rows) {
    SKIP_UNLESS_SELECTED("matmul_vocab_rows");
    check_matmul(&K_BF16, 151936, 2048, 1); /* Qwen3 vocab head */
    check_matmul(&K_FP8, 129280, 1024, 1);  /* DeepSeek vocab rows (cols cut to keep the CPU twin short) */
}

TEST(matmul_errors) {
    SKIP_UNLESS_SELECTED("matmul_errors");
    ms_err err = {0};
    ms_qmat bad = {.dtype = MS_DT_I32, .rows = 4, .cols = 4, .data = (void *)1};
    float *d = alloc_dev(64);
    CHECK(ms_gpu_matmul(gpu(), d, d, 1, &bad, 0, &err) == MS_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "I32") != NULL);
    ms_qmat f4 = {.dtype = MS_DT_F4, .rows = 4, .cols = 48, .data = (void *)1, .scale = (void *)1,
                  .scale_dtype = MS_DT_F8_E8M0, .brow = 1, .bcol = 32};
    CHECK(ms_gpu_matmul(gpu(), d, d, 1, &f4, 0, &err) == MS_ERR_UNSUPPORTED);
    ms_qmat ok = {.dtype = MS_DT_F32, .rows = 4, .cols = 4, .data = d};
    CHECK(ms_gpu_matmul(gpu(), d, d, 0, &ok, 0, &err) == MS_ERR_ARG);
    ms_gpu_free(gpu(), d);
}

/* Q8 (the requantized static tier) and I4 (INT4 experts, symmetric and with zero points)
 * through matmul_q.cu, on by default: placed without any opt-in (MS_GPU_QUANT_KERNELS is gone:
 * set, it changes nothing), the zero points uploaded with the view, and every shape against
 * ms_matmul_ref through the vector, generic and accumulate passes. */
TEST(matmul_q_int4_no_optin) {
    SKIP_UNLESS_SELECTED("matmul_q_int4_no_optin");
    ms_err err = {0};
    unsetenv("MS_GPU_QUANT_KERNELS");
    const wkind *all[] = {&K_I4, &K_I4Z, &K_Q8};
    for (int i = 0; i < 3; i++) {
        ms_qmat w = make_w(all[i], 64, 64), dw;
        int rc = ms_gpu_qmat_upload(gpu(), &w, &dw, &err);
        CHECK_MSG(rc == MS_OK, "%s: %s", all[i]->name, err.msg);
        if (!rc) {
            CHECK(!w.zero == !dw.zero && (!dw.zero || dw.zero != w.zero));
            if (w.zero) { /* the device copy of the zero points is the host's */
                uint32_t z[8 * 2];
                get(z, dw.zero, sizeof z);
                CHECK(memcmp(z, w.zero, sizeof z) == 0);
            }
            ms_gpu_qmat_free(gpu(), &dw);
        }
        free_w(&w);
    }
}

TEST(matmul_q_dtypes_real_shapes) {
    SKIP_UNLESS_SELECTED("matmul_q_dtypes_real_shapes");
    const wkind *all[] = {&K_Q8, &K_Q8F, &K_I4, &K_I4H, &K_I4Z};
    for (int i = 0; i < 5; i++) {
        check_matmul(all[i], 2048, 7168, 1); /* Kimi K2 expert gate/up (INT4), an MLA projection (Q8) */
        check_matmul(all[i], 7168, 2048, 1);
        check_matmul(all[i], 1024, 2304, 3);
        check_matmul(all[i], 4096, 4096, 8);
    }
    check_matmul(&K_Q8, 151936, 2048, 1); /* a Q8 vocab head */
}

TEST(matmul_q_odd_shapes) {
    SKIP_UNLESS_SELECTED("matmul_q_odd_shapes");
    check_matmul(&K_Q8, 1001, 7000, 1); /* 7000 = 218.75 blocks: partial last block, rows not 16-byte multiples */
    check_matmul(&K_Q8, 333, 2896, 2);  /* 16-byte rows, partial last block of 16 */
    check_matmul(&K_Q8, 7, 33, 5);      /* one full block and one of 1 */
    check_matmul(&K_Q8F, 129, 64, 11);  /* 11 tokens: 8 + 3 */
    check_matmul(&K_I4, 1001, 2904, 11); /* cols % 32 != 0: generic */
    check_matmul(&K_I4G8, 333, 1024, 2); /* groups of 8: generic */
    check_matmul(&K_I4H, 5, 8, 1);
    check_matmul(&K_I4Z, 1001, 2904, 3);  /* zero points: 125.25 row words, a partial group, generic */
    check_matmul(&K_I4ZH, 13, 7168, 2);   /* zero points with F16 scales per 128 */
}

/* ------------------------------------------------------------ rmsnorm */

TEST(rmsnorm) {
    SKIP_UNLESS_SELECTED("rmsnorm");
    const int dims[] = {7168, 2304, 1000, 128};
    for (int di = 0; di < 4; di++) {
        int d = dims[di], n = 5;
        float *x = randv((int64_t)n * d, 3.0f), *w = randv(d, 1.0f), *ref = malloc((size_t)n * d * 4),
              *got = malloc((size_t)n * d * 4);
        ms_rmsnorm_ref(ref, x, w, n, d, 1e-6f);
        float *dx = dup_dev(x, (size_t)n * d * 4), *dw = dup_dev(w, (size_t)d * 4);
        ms_err err = {0};
        /* in place, like the engine's q/k norms */
        CHECK(ms_gpu_rmsnorm(gpu(), dx, dx, dw, n, d, 1e-6f, &err) == MS_OK);
        get(got, dx, (size_t)n * d * 4);
        /* sum of squares: (d/256 + 8 + 3) u relative (256 threads, 2 tree levels of warps);
         * 1/sqrt halves it, +3 roundings for sqrt, divide and the two products */
        double rel = ((d / 256.0 + 11) / 2 + 4) * U32, worst = 0;
        int bad = 0;
        for (int64_t i = 0; i < (int64_t)n * d; i++) {
            double e = fabs(got[i] - ref[i]) / (rel * fabs(ref[i]) + 1e-30);
            if (!(e <= 1)) bad++;
            if (e > worst) worst = e;
        }
        printf("  rmsnorm d=%-5d max err/bound %.3f\n", d, worst);
        CHECK_MSG(bad == 0, "rmsnorm d=%d: %d elements out of bound", d, bad);
        ms_gpu_free(gpu(), dx), ms_gpu_free(gpu(), dw);
        free(x), free(w), free(ref), free(got);
    }
}

/* --------------------------------------------------------------- RoPE */

static void check_rope(const char *what, const char *json, double theta, int64_t max_pos, int rot, int head,
                       int rot_off, int heads, ms_rope_layout layout, int64_t pos0) {
    ms_err err = {0};
    ms_rope r;
    cJSON *j = json ? cJSON_Parse(json) : NULL;
    int rc = ms_rope_parse(j, theta, max_pos, rot, layout, &r, what, &err);
    cJSON_Delete(j);
    CHECK_MSG(rc == MS_OK, "%s: %s", what, err.msg);
    if (rc) return;
    int n = 3;
    int64_t ts = (int64_t)heads * head;
    float *x = randv(n * ts, 1.0f), *ref = malloc((size_t)(n * ts) * 4), *got = malloc((size_t)(n * ts) * 4);
    memcpy(ref, x, (size_t)(n * ts) * 4);
    float cs[512], sn[512], inv[512];
    for (int t = 0; t < n; t++) {
        ms_rope_cos_sin(&r, pos0 + t, cs, sn);
        for (int h = 0; h < heads; h++) ms_rope_apply(&r, ref + t * ts + (int64_t)h * head + rot_off, cs, sn);
    }
    for (int i = 0; i < rot / 2; i++) inv[i] = (float)r.inv_freq[i];
    float *dx = dup_dev(x, (size_t)(n * ts) * 4), *dinv = dup_dev(inv, (size_t)rot / 2 * 4);
    rc = ms_gpu_rope(gpu(), dx, n, ts, heads, head, rot_off, rot, layout == MS_ROPE_INTERLEAVED, dinv, r.attn_factor,
                     pos0, &err);
    CHECK_MSG(rc == MS_OK, "%s: %s", what, err.msg);
    get(got, dx, (size_t)(n * ts) * 4);
    /* same float angle, cos/sin in double, the same four roundings: differences come only
     * from the device's double cos/sin (<= 1 ulp double) flipping a float rounding: 2 u */
    double worst = 0;
    int bad = 0;
    for (int64_t i = 0; i < n * ts; i++) {
        double tol = 2 * U32 * (fabs(ref[i]) + fabs(x[i]) + 1e-30) * (r.attn_factor > 1 ? r.attn_factor : 1);
        double e = fabs(got[i] - ref[i]) / tol;
        if (!(e <= 1)) bad++;
        if (e > worst) worst = e;
    }
    printf("  rope %-44s pos %-7lld max err/bound %.3f\n", what, (long long)pos0, worst);
    CHECK_MSG(bad == 0, "%s: %d elements out of bound", what, bad);
    ms_gpu_free(gpu(), dx), ms_gpu_free(gpu(), dinv);
    free(x), free(ref), free(got);
}

TEST(rope_layouts_partial_yarn) {
    SKIP_UNLESS_SELECTED("rope_layouts_partial_yarn");
    for (int p = 0; p < 2; p++) {
        int64_t pos0 = p ? 100000 : 5;
        check_rope("half split, full, theta 1e6 (qwen3)", NULL, 1e6, 40960, 128, 128, 0, 4, MS_ROPE_HALF, pos0);
        check_rope("half split, partial 64 of 128 (glm4)", NULL, 1e6, 131072, 64, 128, 0, 4, MS_ROPE_HALF, pos0);
        check_rope("interleaved, yarn 40, rope dims after nope (dsv3)",
                   "{\"rope_type\":\"yarn\",\"factor\":40,\"beta_fast\":32,\"beta_slow\":1,\"mscale\":1.0,"
                   "\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096}",
                   10000, 163840, 64, 192, 128, 3, MS_ROPE_INTERLEAVED, pos0);
        check_rope("half split, yarn 32, no truncate (gpt-oss)",
                   "{\"rope_type\":\"yarn\",\"factor\":32.0,\"beta_fast\":32.0,\"beta_slow\":1.0,"
                   "\"truncate\":false,\"original_max_position_embeddings\":4096}",
                   150000, 131072, 64, 64, 0, 8, MS_ROPE_HALF, pos0);
    }
}

/* ------------------------------------------------------------ activations */

TEST(glu_variants) {
    SKIP_UNLESS_SELECTED("glu_variants");
    int64_t n = 3 * 2048 + 7;
    for (int v = 0; v < 3; v++) {
        float *gt = randv(n, 4.0f), *up = randv(n, 4.0f), *ref = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
        float *g2 = malloc((size_t)n * 4), *u2 = malloc((size_t)n * 4);
        memcpy(g2, gt, (size_t)n * 4), memcpy(u2, up, (size_t)n * 4);
        int clamped = v == 2;
        float lim = v == 0 ? 0.0f : 7.0f, alpha = 1.702f;
        cpu_act(clamped, lim, alpha, g2, u2, n);
        memcpy(ref, g2, (size_t)n * 4);
        float *dg = dup_dev(gt, (size_t)n * 4), *du = dup_dev(up, (size_t)n * 4);
        ms_err err = {0};
        CHECK(ms_gpu_glu(gpu(), dg, dg, du, n, clamped ? MS_GPU_ACT_CLAMPED_SWIGLU : MS_GPU_ACT_SWIGLU, lim, alpha,
                         &err) == MS_OK);
        get(got, dg, (size_t)n * 4);
        /* CUDA's expf within 2 ulp, then <= 4 roundings; the CPU's vector swiglu within 2e-6 */
        double worst = 0;
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double e = fabs(got[i] - ref[i]) / ((8 * U32 + 2e-6) * fabs(ref[i]) + 1e-37);
            if (!(e <= 1)) bad++;
            if (e > worst) worst = e;
        }
        printf("  glu %-24s max err/bound %.3f\n", v == 0 ? "swiglu" : v == 1 ? "swiglu limit 7" : "clamped (gpt-oss)",
               worst);
        CHECK_MSG(bad == 0, "glu variant %d: %d out of bound", v, bad);
        ms_gpu_free(gpu(), dg), ms_gpu_free(gpu(), du);
        free(gt), free(up), free(ref), free(got), free(g2), free(u2);
    }
}

/* ------------------------------------------------------------- router */

static void check_route_on(ms_gpu *gg, const char *what, ms_gpu_router kind, int E, int K, int G, int TG, int norm,
                           float scale, int with_bias) {
    int n = 32;
    float *lg = randv((int64_t)n * E, 2.0f), *bias = with_bias ? randv(E, 0.3f) : NULL;
    if (G <= 1) /* token 5: a NaN hidden state (every logit NaN); token 6: half the logits NaN */
        for (int e = 0; e < E; e++) lg[5 * E + e] = NAN, lg[6 * E + e] = e % 2 ? NAN : lg[6 * E + e];
    for (int e = 0; e < E; e++) /* tokens 7, 8: many exact ties (logits on a coarse grid; all equal) */
        lg[7 * E + e] = roundf(lg[7 * E + e]), lg[8 * E + e] = 0.25f;
    int32_t *gid = malloc((size_t)n * K * 4);
    float *gw = malloc((size_t)n * K * 4), *scratch = malloc((size_t)E * 8), rw[64];
    int rid[64];
    float *dl = dup_dev(lg, (size_t)n * E * 4), *db = bias ? dup_dev(bias, (size_t)E * 4) : NULL;
    int32_t *did = alloc_dev((size_t)n * K * 4);
    float *dw = alloc_dev((size_t)n * K * 4);
    ms_gpu_route_cfg c = {kind, E, K, G, TG, norm, scale};
    ms_err err = {0};
    /* the uploads above ran on gpu()'s stream; gg may be the second context, whose stream does not wait for
     * them (an asynchronous pageable upload may still be landing: all 32 tokens' ids differed once) */
    CHECK(ms_gpu_sync(gpu(), &err) == MS_OK);
    int rc = ms_gpu_route(gg, did, dw, dl, db, n, &c, &err);
    CHECK_MSG(rc == MS_OK, "%s: %s", what, err.msg);
    CHECK(ms_gpu_sync(gg, &err) == MS_OK); /* gg's stream is not the one get() downloads on */
    get(gid, did, (size_t)n * K * 4);
    get(gw, dw, (size_t)n * K * 4);
    int id_bad = 0, w_bad = 0;
    double worst = 0;
    for (int t = 0; t < n; t++) {
        ms_config rc_;
        memset(&rc_, 0, sizeof rc_);
        rc_.router = (ms_router_kind)kind, rc_.n_experts = E, rc_.top_k = K, rc_.n_group = G, rc_.topk_group = TG;
        rc_.norm_topk_prob = norm, rc_.routed_scale = scale;
        ms_route_args ra = {.c = &rc_, .logits = lg + (int64_t)t * E, .bias = bias, .n = 1, .ids = rid, .w = rw};
        cpu()->ops->route(cpu(), &ra);
        for (int k = 0; k < K; k++) {
            if (gid[t * K + k] != rid[k]) id_bad++;
            /* probabilities: expf (2 ulp) and sums of E terms in float on the GPU vs the
             * CPU's vector softmax: (E/256 + 16) u relative, x4 for the normalization */
            double tol = 4 * (E / 256.0 + 16) * U32 * fabs(rw[k]) + 1e-30;
            double e = fabs(gw[t * K + k] - rw[k]) / tol;
            if (isnan(rw[k]) && isnan(gw[t * K + k])) e = 0; /* NaN in, NaN weights out on both */
            if (!(e <= 1)) w_bad++;
            if (e > worst) worst = e;
        }
    }
    printf("  route %-40s %s ids %s, weights max err/bound %.3f\n", what, gg == gpu() ? "" : "(legacy)",
           id_bad ? "DIFFER" : "equal", worst);
    CHECK_MSG(id_bad == 0, "%s: %d expert ids differ", what, id_bad);
    CHECK_MSG(w_bad == 0, "%s: %d weights out of bound", what, w_bad);
    ms_gpu_free(gpu(), dl), ms_gpu_free(gpu(), db), ms_gpu_free(gpu(), did), ms_gpu_free(gpu(), dw);
    free(lg), free(bias), free(gid), free(gw), free(scratch);
}

/* A second context on the earlier kernels (MS_GPU_LEGACY_DECODE=1 while it opens): the block router. */
static ms_gpu *g_lgpu;
static ms_gpu *legacy_gpu(void) {
    if (g_lgpu) return g_lgpu;
    ms_err err = {0};
    setenv("MS_GPU_LEGACY_DECODE", "1", 1);
    int rc = ms_gpu_open(0, &g_lgpu, &err);
    unsetenv("MS_GPU_LEGACY_DECODE");
    if (rc) {
        fprintf(stderr, "test_gpu: cannot open GPU 0: %s\n", err.msg);
        exit(1);
    }
    return g_lgpu;
}
/* the one-warp router (the default for softmax, top-k softmax and ungrouped sigmoid) and the block router */
static void check_route(const char *what, ms_gpu_router kind, int E, int K, int G, int TG, int norm, float scale,
                        int with_bias) {
    check_route_on(gpu(), what, kind, E, K, G, TG, norm, scale, with_bias);
    check_route_on(legacy_gpu(), what, kind, E, K, G, TG, norm, scale, with_bias);
}

TEST(router_kinds) {
    SKIP_UNLESS_SELECTED("router_kinds");
    check_route("sigmoid, 8 of 256, groups 4 of 8 (dsv3)", MS_GPU_ROUTER_SIGMOID, 256, 8, 8, 4, 1, 2.5f, 1);
    check_route("sigmoid, 8 of 384, no groups (kimi)", MS_GPU_ROUTER_SIGMOID, 384, 8, 1, 1, 1, 2.827f, 1);
    check_route("sigmoid, 8 of 160, groups 1 of 1, no norm", MS_GPU_ROUTER_SIGMOID, 160, 8, 1, 1, 0, 1.0f, 0);
    check_route("softmax, 8 of 128, norm (qwen3)", MS_GPU_ROUTER_SOFTMAX, 128, 8, 1, 1, 1, 1.0f, 0);
    check_route("softmax, 10 of 512, no norm", MS_GPU_ROUTER_SOFTMAX, 512, 10, 1, 1, 0, 1.0f, 0);
    check_route("top-k softmax, 4 of 32 (gpt-oss)", MS_GPU_ROUTER_TOPK_SOFTMAX, 32, 4, 1, 1, 0, 1.0f, 0);
    check_route("softmax, 32 of 1024 (the limits)", MS_GPU_ROUTER_SOFTMAX, 1024, 32, 1, 1, 1, 1.0f, 0);
    check_route("top-k softmax, 8 of 200", MS_GPU_ROUTER_TOPK_SOFTMAX, 200, 8, 1, 1, 0, 1.0f, 0);
    ms_err err = {0};
    ms_gpu_route_cfg bad = {MS_GPU_ROUTER_SIGMOID, 256, 8, 7, 4, 1, 1.0f};
    float *d = alloc_dev(4096);
    CHECK(ms_gpu_route(gpu(), (int32_t *)d, d, d, NULL, 1, &bad, &err) == MS_ERR_ARG);
    ms_gpu_free(gpu(), d);
}

/* ---------------------------------------------------------- attention */

/* The attention kernels by MS_GPU_ATTN mode (read when a context opens): 0 the default (the
 * decode kernel, its splits combined by the last block), 1 "combine" (the same kernel, the
 * combine as its own launch), 2 "old" (the earlier split kernel). Each mode's context is opened
 * once (device memory is shared between them; streams are not: callers sync gpu() first). */
static ms_gpu *attn_ctx(int mode) {
    static ms_gpu *ctx[3];
    static const char *word[3] = {NULL, "combine", "old"};
    if (!mode) return gpu();
    if (ctx[mode]) return ctx[mode];
    const char *prev = getenv("MS_GPU_ATTN");
    char keep[64] = "";
    if (prev) snprintf(keep, sizeof keep, "%s", prev);
    setenv("MS_GPU_ATTN", word[mode], 1);
    ms_err err = {0};
    if (ms_gpu_open(0, &ctx[mode], &err)) {
        fprintf(stderr, "test_gpu: GPU context (MS_GPU_ATTN=%s): %s\n", word[mode], err.msg);
        exit(1);
    }
    if (prev) setenv("MS_GPU_ATTN", keep, 1);
    else unsetenv("MS_GPU_ATTN");
    return ctx[mode];
}

/* One attention case against the CPU twin (a CPU backend reserved for ctx keys when the shared one
 * is too small), in every mode of attn_ctx, and for one token also through ms_gpu_attn_gqa_at at a
 * device position with the grid of a larger bound (ctx - 1 + bound_extra). The default and
 * "combine" modes must give the same bits (one function combines in both), and a second run of
 * the default the same bits again. */
static void check_attn_b(const char *what, int H, int KV, int hd, int vd, int window, int with_sinks, int64_t ctx,
                         int n, int64_t bound_extra) {
    int64_t pos0 = ctx - n, kd = (int64_t)KV * hd, vt = (int64_t)KV * vd;
    float *q = randv((int64_t)n * H * hd, 1.0f), *k = randv(ctx * kd, 1.0f), *v = randv(ctx * vt, 1.0f);
    float *sinks = with_sinks ? randv(H, 2.0f) : NULL;
    size_t ob = (size_t)n * H * vd * 4;
    float *ref = malloc(ob), *got = malloc(ob), *first = malloc(ob);
    float scale = 1.0f / sqrtf((float)hd);
    ms_attn_gqa_args ga = {.out = ref, .q = q, .k = k, .v = v, .n = n, .n_past = pos0, .H = H, .KV = KV, .hd = hd,
                           .vd = vd, .window = window, .sinks = sinks, .scale = scale};
    ms_err cerr = {0};
    ms_backend *cb = cpu(), *own = NULL;
    if (ctx > 9000) {
        ms_config cc;
        memset(&cc, 0, sizeof cc);
        cc.hidden = 8192, cc.head_dim = 512, cc.v_head_dim = 512, cc.n_layers = 1;
        CHECK_MSG(ms_backend_cpu_create(NULL, &own, &cerr) == MS_OK &&
                      own->ops->reserve(own, &cc, ctx + 1, 32, &cerr) == MS_OK,
                  "CPU backend for %lld keys: %s", (long long)ctx, cerr.msg);
        cb = own;
    }
    CHECK_MSG(cb->ops->attn_gqa(cb, &ga, &cerr) == MS_OK, "CPU attention: %s", cerr.msg);
    if (own) own->ops->destroy(own);
    float *dq = dup_dev(q, (size_t)n * H * hd * 4), *dk = dup_dev(k, (size_t)(ctx * kd) * 4),
          *dv = dup_dev(v, (size_t)(ctx * vt) * 4), *ds = sinks ? dup_dev(sinks, (size_t)H * 4) : NULL,
          *dout = alloc_dev(ob);
    int64_t hpos = pos0, *dpos = dup_dev(&hpos, 8);
    ms_gpu_attn_cfg c = {H, KV, hd, vd, window, scale};
    float *dscr = alloc_dev(ms_gpu_attn_scratch_floats(n, &c) * 4);
    /* out = sum_s p_s v_s with |v| <= vmax: a relative error e_s of each p_s moves it by
     * at most max_s e_s * vmax. Scores: the GPU sums q.k in one lane (the earlier kernel) or
     * as per-lane chains of 4-16 terms and a 5-6 level tree (the decode kernel), either within
     * (hd + 3) u sum|q_i k_i| <= (hd + 3) u hd qmax kmax, times scale; e_s <= 2 |dscore| + the
     * exp/rescaling roundings (8 u); the value sums run over at most keys/4 keys per lane chain
     * (the decode kernel: keys / (8 splits) per lane, + 8 warps + 64 splits; the rescales one per
     * tile of 32 keys) ((keys/4 + 16) u); the CPU twin's float sums over keys add as much. */
    double vmax = 0;
    for (int64_t i = 0; i < ctx * vt; i++) vmax = fmax(vmax, fabs(v[i]));
    double qk = 0;
    for (int64_t i = 0; i < (int64_t)n * H * hd; i++) qk = fmax(qk, fabs(q[i]));
    double kmax = 0;
    for (int64_t i = 0; i < ctx * kd; i++) kmax = fmax(kmax, fabs(k[i]));
    double keys = window > 0 && window < ctx ? window : (double)ctx;
    double ds_ = (hd + 3) * U32 * hd * qk * kmax * scale;
    double tol = (2 * ds_ + 2 * (keys / 4 + 16) * U32 + 8 * U32) * vmax;
    CHECK(ms_gpu_sync(gpu(), &cerr) == MS_OK);
    static const char *mname[3] = {"default", "combine", "old"};
    for (int run = 0; run < (n == 1 ? 8 : 4); run++) {
        const int mode = run % 4 == 3 ? 0 : run % 4, at = run >= 4; /* modes 0 1 2 0, then the same at pos_dev */
        ms_gpu *g = attn_ctx(mode);
        ms_err err = {0};
        int rc = at ? ms_gpu_attn_gqa_at(g, dout, dq, dk, dv, ds, pos0 + bound_extra, dpos, &c, dscr, &err)
                    : ms_gpu_attn_gqa(g, dout, dq, dk, dv, ds, n, pos0, &c, dscr, &err);
        CHECK_MSG(rc == MS_OK, "%s (%s%s): %s", what, mname[mode], at ? ", device position" : "", err.msg);
        rc = ms_gpu_download(g, got, dout, ob, &err);
        CHECK_MSG(rc == MS_OK, "download: %s", err.msg);
        double worst = 0;
        int bad = 0;
        for (int64_t i = 0; i < (int64_t)n * H * vd; i++) {
            double e = fabs(got[i] - ref[i]) / tol;
            if (!(e <= 1)) bad++;
            if (e > worst) worst = e;
        }
        if (run % 4 == 0) memcpy(first, got, ob);
        else if (run % 4 != 2)
            CHECK_MSG(!memcmp(first, got, ob), "%s: %s%s not bit-identical to the default", what,
                      run % 4 == 1 ? "combine" : "a second default run", at ? " (device position)" : "");
        if (run % 4 != 3)
            printf("  attn %-44s ctx %-6lld n=%d %-7s%s max err/bound %.3f (bound %.2e)\n", what, (long long)ctx, n,
                   mname[mode], at ? " at" : "   ", worst, tol);
        CHECK_MSG(bad == 0, "%s (%s%s): %d outputs out of bound", what, mname[mode], at ? ", device position" : "",
                  bad);
    }
    ms_gpu_free(gpu(), dq), ms_gpu_free(gpu(), dk), ms_gpu_free(gpu(), dv), ms_gpu_free(gpu(), ds),
        ms_gpu_free(gpu(), dout), ms_gpu_free(gpu(), dscr), ms_gpu_free(gpu(), dpos);
    free(q), free(k), free(v), free(sinks), free(ref), free(got), free(first);
}
static void check_attn(const char *what, int H, int KV, int hd, int vd, int window, int with_sinks, int64_t ctx, int n) {
    check_attn_b(what, H, KV, hd, vd, window, with_sinks, ctx, n, 255);
}

TEST(attention_gqa) {
    SKIP_UNLESS_SELECTED("attention_gqa");
    check_attn("64 q / 4 kv heads, hd 128 (qwen3 235B)", 64, 4, 128, 128, 0, 0, 1000, 1);
    check_attn("64 / 8, hd 64, sinks, window 128 (gpt-oss)", 64, 8, 64, 64, 128, 1, 700, 3);
    check_attn("64 / 8, hd 64, sinks, full (gpt-oss)", 64, 8, 64, 64, 0, 1, 700, 1);
    check_attn("16 / 2, qk 192, v 128", 16, 2, 192, 128, 0, 0, 8192, 1);
    check_attn("8 / 8, hd 256, window 4096", 8, 8, 256, 256, 4096, 0, 5000, 2);
    check_attn("4 / 1, hd 96, 1 key", 4, 1, 96, 96, 0, 1, 1, 1);
    check_attn("32 / 32 (MHA), hd 128, 5 tokens", 32, 32, 128, 128, 0, 0, 300, 5);
    check_attn("8 / 1, qk 512, v 512, window 33", 8, 1, 512, 512, 33, 1, 2000, 4);
    check_attn("2 / 1, qk 64, v 32", 2, 1, 64, 32, 0, 0, 77, 1);
}

/* The decode kernel's shapes (attn_decode.cu): key counts around its tiles (32 keys a block
 * step at 8 heads per block) and splits (1 .. 64), real GQA groups and head dims, sinks,
 * windows, a group that is not a power of two, prefill chunks of 16 tokens, 40000 keys. */
TEST(attention_decode) {
    SKIP_UNLESS_SELECTED("attention_decode");
    static const int64_t short_keys[] = {1, 2, 31, 32, 33, 100, 640, 700};
    for (size_t i = 0; i < sizeof short_keys / sizeof short_keys[0]; i++)
        check_attn("32 / 4, hd 128 (qwen3 30B-A3B)", 32, 4, 128, 128, 0, 0, short_keys[i], 1);
    check_attn("32 / 4, hd 128, 4096 keys", 32, 4, 128, 128, 0, 0, 4096, 1);
    check_attn("32 / 4, hd 128, 40000 keys", 32, 4, 128, 128, 0, 0, 40000, 1);
    check_attn("64 / 8, hd 128, 640 keys", 64, 8, 128, 128, 0, 0, 640, 1);
    check_attn("64 / 8, hd 128, sinks, 40000 keys", 64, 8, 128, 128, 0, 1, 40000, 1);
    check_attn("64 / 8, hd 64, sinks, window 128, 40000 keys", 64, 8, 64, 64, 128, 1, 40000, 1);
    check_attn("64 / 8, hd 64, sinks, window 128, 129 keys", 64, 8, 64, 64, 128, 1, 129, 1);
    check_attn("8 / 1, hd 256, sinks", 8, 1, 256, 256, 0, 1, 640, 1);
    check_attn("8 / 1, hd 256, window 1000", 8, 1, 256, 256, 1000, 0, 3000, 1);
    check_attn("8 / 1, hd 64, 1 key", 8, 1, 64, 64, 0, 0, 1, 1);
    check_attn("8 / 1, hd 64, sinks, window 17", 8, 1, 64, 64, 17, 1, 900, 1);
    check_attn("12 / 1, hd 128 (group of 12: 8 + 4 padded)", 12, 1, 128, 128, 0, 1, 777, 1);
    check_attn("6 / 2, hd 128 (group of 3)", 6, 2, 128, 128, 0, 0, 333, 1);
    check_attn("16 / 1, hd 128 (group of 16: two blocks)", 16, 1, 128, 128, 0, 0, 640, 1);
    check_attn("16 / 16, qk 192, v 128 (MLA expanded)", 16, 16, 192, 128, 0, 0, 2000, 1);
    check_attn("32 / 4, hd 128, prefill 16 tokens", 32, 4, 128, 128, 0, 0, 4096, 16);
    check_attn("64 / 8, hd 64, sinks, window 128, 16 tokens", 64, 8, 64, 64, 128, 1, 1000, 16);
    check_attn("8 / 1, hd 256, 9 tokens from the start", 8, 1, 256, 256, 0, 1, 9, 9);
    check_attn_b("32 / 4, hd 128, bound 64 splits above", 32, 4, 128, 128, 0, 0, 513, 1, 40000);
}

/* ---------------------------------------------------------- expert FFN */

/* h = act(gate, up) at (g, u) and its worst change over the box [g +- dg] x [u +- du]. */
static double act_at(int clamped, float lim, float alpha, double g, double u) {
    if (clamped) {
        double gg = g < lim ? g : lim, uu = u < -lim ? -lim : u > lim ? lim : u;
        return (uu + 1) * gg / (1 + exp(-alpha * gg));
    }
    if (lim > 0) g = g > lim ? lim : g, u = u > lim ? lim : u < -lim ? -lim : u;
    return g / (1 + exp(-g)) * u;
}
static double act_sens(int clamped, float lim, float alpha, double g, double u, double dg, double du) {
    double h = act_at(clamped, lim, alpha, g, u), m = 0;
    for (int a = -1; a <= 1; a += 2)
        for (int b = -1; b <= 1; b += 2) m = fmax(m, fabs(act_at(clamped, lim, alpha, g + a * dg, u + b * du) - h));
    return m + 8 * U32 * fabs(h); /* + the activation's own roundings */
}

static void check_experts(const char *what, const wkind *kd, int k, int64_t D, int64_t I, int fused, int clamped,
                          float lim, int biases) {
    ms_err err = {0};
    ms_qmat gate[8], up[8], down[8];
    ms_gpu_expert ex[8];
    uint16_t *gb[8], *ub[8], *db[8];
    float alpha = 1.702f;
    float *x = randv(D, 1.0f), *wts = malloc((size_t)k * 4);
    for (int e = 0; e < k; e++) wts[e] = (float)unif();
    memset(ex, 0, sizeof ex);
    for (int e = 0; e < k; e++) {
        gate[e] = make_w(kd, fused ? 2 * I : I, D);
        down[e] = make_w(kd, D, I);
        if (!fused) up[e] = make_w(kd, I, D);
        CHECK(ms_gpu_qmat_upload(gpu(), &gate[e], &ex[e].gate, &err) == MS_OK);
        CHECK(ms_gpu_qmat_upload(gpu(), &down[e], &ex[e].down, &err) == MS_OK);
        if (!fused) CHECK(ms_gpu_qmat_upload(gpu(), &up[e], &ex[e].up, &err) == MS_OK);
        gb[e] = ub[e] = db[e] = NULL;
        if (biases) {
            int64_t gbn = fused ? 2 * I : I;
            gb[e] = malloc((size_t)gbn * 2), ub[e] = malloc((size_t)I * 2), db[e] = malloc((size_t)D * 2);
            for (int64_t i = 0; i < gbn; i++) gb[e][i] = ms_f32_to_bf16(gauss() * 0.5f);
            for (int64_t i = 0; i < I; i++) ub[e][i] = ms_f32_to_bf16(gauss() * 0.5f);
            for (int64_t i = 0; i < D; i++) db[e][i] = ms_f32_to_bf16(gauss() * 0.5f);
            ex[e].gate_bias = dup_dev(gb[e], (size_t)gbn * 2);
            if (!fused) ex[e].up_bias = dup_dev(ub[e], (size_t)I * 2);
            ex[e].down_bias = dup_dev(db[e], (size_t)D * 2);
            ex[e].bias_dtype = MS_DT_BF16;
        }
    }
    /* twin: engine/moe.c expert_ffn (scalar matmuls, the CPU backend's activation) + the weighted sum */
    double *ref = calloc((size_t)D, 8), *tol = calloc((size_t)D, 8);
    float *gg = malloc((size_t)2 * I * 4), *uu = malloc((size_t)I * 4), *yy = malloc((size_t)D * 4);
    double *gl1 = malloc((size_t)2 * I * 8), *ul1 = malloc((size_t)I * 8), *dl1 = malloc((size_t)D * 8);
    double *dh = malloc((size_t)I * 8);
    float *hrow = malloc((size_t)I * 4), *drow = malloc((size_t)I * 4);
    for (int e = 0; e < k; e++) {
        ms_matmul_ref(gg, x, 1, &gate[e]);
        l1_rows(&gate[e], x, 1, gl1);
        if (!fused) ms_matmul_ref(uu, x, 1, &up[e]), l1_rows(&up[e], x, 1, ul1);
        float *g = malloc((size_t)I * 4), *u = malloc((size_t)I * 4);
        for (int64_t i = 0; i < I; i++) {
            int64_t gi = fused ? 2 * i : i, ui = fused ? 2 * i + 1 : i;
            float bg = biases ? ms_bf16_to_f32(gb[e][gi]) : 0, bu = biases ? ms_bf16_to_f32(fused ? gb[e][ui] : ub[e][i]) : 0;
            g[i] = gg[gi] + bg;
            u[i] = (fused ? gg[ui] : uu[i]) + bu;
            double dg = dot_bound(D) * gl1[gi] + U32 * fabs(g[i]), du = dot_bound(D) * (fused ? gl1[ui] : ul1[i]) + U32 * fabs(u[i]);
            dh[i] = act_sens(clamped, lim, alpha, g[i], u[i], dg, du);
        }
        cpu_act(clamped, lim, alpha, g, u, I);
        memcpy(hrow, g, (size_t)I * 4);
        ms_matmul_ref(yy, hrow, 1, &down[e]);
        l1_rows(&down[e], hrow, 1, dl1);
        for (int64_t d = 0; d < D; d++) {
            double b = biases ? ms_bf16_to_f32(db[e][d]) : 0;
            ms_qmat_row(&down[e], d, drow);
            double prop = 0;
            for (int64_t i = 0; i < I; i++) prop += fabs((double)drow[i]) * dh[i];
            ref[d] += (double)wts[e] * (yy[d] + b);
            tol[d] += wts[e] * (prop + dot_bound(I) * dl1[d] + 2 * U32 * fabs(yy[d] + b)) + 2 * U32 * fabs(ref[d]);
        }
        free(g), free(u);
    }
    float *dx = dup_dev(x, (size_t)D * 4), *dwt = dup_dev(wts, (size_t)k * 4), *dout = alloc_dev((size_t)D * 4);
    float *scr = alloc_dev(ms_gpu_expert_scratch_floats(k, I, D) * 4), *got = malloc((size_t)D * 4);
    int rc = ms_gpu_expert_ffn(gpu(), dout, dx, k, ex, dwt, clamped ? MS_GPU_ACT_CLAMPED_SWIGLU : MS_GPU_ACT_SWIGLU,
                               lim, alpha, scr, 0, &err);
    CHECK_MSG(rc == MS_OK, "%s: %s", what, err.msg);
    get(got, dout, (size_t)D * 4);
    double worst = 0;
    int bad = 0;
    for (int64_t d = 0; d < D; d++) {
        double e = fabs(got[d] - ref[d]) / (tol[d] + 1e-30);
        if (!(e <= 1)) bad++;
        if (e > worst) worst = e;
    }
    printf("  experts %-44s k=%d max err/bound %.3f\n", what, k, worst);
    CHECK_MSG(bad == 0, "%s: %d outputs out of bound", what, bad);
    for (int e = 0; e < k; e++) {
        ms_gpu_qmat_free(gpu(), &ex[e].gate), ms_gpu_qmat_free(gpu(), &ex[e].down);
        if (!fused) ms_gpu_qmat_free(gpu(), &ex[e].up), free_w(&up[e]);
        free_w(&gate[e]), free_w(&down[e]);
        ms_gpu_free(gpu(), (void *)ex[e].gate_bias), ms_gpu_free(gpu(), (void *)ex[e].up_bias),
            ms_gpu_free(gpu(), (void *)ex[e].down_bias);
        free(gb[e]), free(ub[e]), free(db[e]);
    }
    ms_gpu_free(gpu(), dx), ms_gpu_free(gpu(), dwt), ms_gpu_free(gpu(), dout), ms_gpu_free(gpu(), scr);
    free(x), free(wts), free(ref), free(tol), free(gg), free(uu), free(yy), free(gl1), free(ul1), free(dl1), free(dh),
        free(hrow), free(drow), free(got);
}

TEST(expert_ffn) {
    SKIP_UNLESS_SELECTED("expert_ffn");
    check_experts("bf16, hidden 7168, width 2048 (dsv3 shape)", &K_BF16, 8, 7168, 2048, 0, 0, 0.0f, 0);
    check_experts("fp8 128x128 f32 scales, 7168 / 2048", &K_FP8, 8, 7168, 2048, 0, 0, 0.0f, 0);
    check_experts("fp8 bf16 scales, 2304 / 1024, swiglu limit 7", &K_FP8B, 6, 2304, 1024, 0, 0, 7.0f, 0);
    check_experts("mxfp4 fused gate_up, biases, clamped (gpt-oss)", &K_F4, 4, 2880, 2880, 1, 1, 7.0f, 1);
    check_experts("bf16 fused gate_up, biases, clamped", &K_BF16, 4, 2880, 2880, 1, 1, 7.0f, 1);
}

/* INT4 experts (Kimi K2: hidden 7168, width 2048) through ms_gpu_expert_ffn, the bound of
 * check_experts: symmetric BF16 scales per 32, zero points, and zero points with F16 scales per
 * 128, fused gate_up, biases and the clamped activation. */
TEST(expert_ffn_int4) {
    SKIP_UNLESS_SELECTED("expert_ffn_int4");
    check_experts("int4 bf16 1x32, 7168 / 2048 (kimi k2 shape)", &K_I4, 4, 7168, 2048, 0, 0, 0.0f, 0);
    check_experts("int4 asym bf16 1x32, 7168 / 2048", &K_I4Z, 2, 7168, 2048, 0, 0, 7.0f, 0);
    check_experts("int4 asym f16 1x128 fused gate_up, biases, clamped", &K_I4ZH, 3, 1024, 640, 1, 1, 7.0f, 1);
}

TEST_GPU_RUNNER(test_gpu_run_kernels)
