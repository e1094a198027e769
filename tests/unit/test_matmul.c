/* test_matmul.c — every weight dtype x every CPU dispatch path (scalar, AVX2,
 * AVX-512 where the CPU has them) of ms_matmul / ms_matmul_acc against the
 * scalar reference ms_matmul_ref, over odd shapes, with and without scales,
 * single-threaded and on a pool. Tolerance is relative to sum |w||x|. */
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "ops/ops.h"
#include "test.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    return (uint32_t)(ms_test_xorshift(&g_rng) >> 16);
}
static float frand(void) { return (float)((rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0); }

typedef struct {
    const char *name;
    ms_dtype dt, sdt;
    int brow, bcol; /* 0: no scale */
} variant;

static const variant k_variants[] = {
    {"f32", MS_DT_F32, 0, 0, 0},
    {"bf16", MS_DT_BF16, 0, 0, 0},
    {"f16", MS_DT_F16, 0, 0, 0},
    {"f8", MS_DT_F8_E4M3, 0, 0, 0},
    {"f8-f32scale-128", MS_DT_F8_E4M3, MS_DT_F32, 128, 128},
    {"f8-bf16scale-128", MS_DT_F8_E4M3, MS_DT_BF16, 128, 128},
    {"f8-f32scale-3x48", MS_DT_F8_E4M3, MS_DT_F32, 3, 48},
    {"f4-e8m0", MS_DT_F4, MS_DT_F8_E8M0, 1, 32},
};

/* The requantized static tier (--static-dtype q8|fp8): run by their own test, at the end of
 * the file, so the random data of the tests above stays what it was. */
static const variant k_qvariants[] = {
    {"q8-bf16-1x32", MS_DT_Q8, MS_DT_BF16, 1, 32},           /* ms_quant_q8_row's layout: the fast kernels */
    {"q8-f32-2x48", MS_DT_Q8, MS_DT_F32, 2, 48},             /* another block layout: the scalar dequantization */
    {"f8-bf16scale-1x32", MS_DT_F8_E4M3, MS_DT_BF16, 1, 32}, /* ms_quant_fp8_row's layout */
};

/* INT4 compressed-tensors pack-quantized (core/qmat.h I4): its own test at the end as well. */
static const variant k_i4variants[] = {
    {"i4-bf16-1x32", MS_DT_I4, MS_DT_BF16, 1, 32},   /* Kimi K2's layout: the fast kernels */
    {"i4-bf16-1x128", MS_DT_I4, MS_DT_BF16, 1, 128}, /* group 128: fast where cols % 128 == 0, else scalar */
    {"i4-f32-1x32", MS_DT_I4, MS_DT_F32, 1, 32},     /* F32 scales: the scalar dequantization */
};

/* Fills a weight of the variant; returns the allocation (data and scale in one). */
static void *make_weight(const variant *v, int64_t rows, int64_t cols, ms_qmat *w) {
    int64_t nel = rows * cols;
    size_t dbytes = (size_t)(nel * ms_dtype_bits(v->dt) / 8);
    int64_t sr = v->brow ? (rows + v->brow - 1) / v->brow : 0, sc = v->bcol ? (cols + v->bcol - 1) / v->bcol : 0;
    size_t sbytes = v->brow ? (size_t)(sr * sc * ms_dtype_bits(v->sdt) / 8) : 0;
    uint8_t *mem = malloc(dbytes + sbytes + 64);
    size_t soff = (dbytes + 63) & ~(size_t)63;
    for (int64_t i = 0; i < nel; i++) {
        float f = frand();
        switch (v->dt) {
        case MS_DT_F32: ((float *)mem)[i] = f; break;
        case MS_DT_BF16: ((uint16_t *)mem)[i] = ms_f32_to_bf16(f); break;
        case MS_DT_F16: ((uint16_t *)mem)[i] = ms_f32_to_f16(f); break;
        case MS_DT_Q8: ((int8_t *)mem)[i] = (int8_t)((int)(rnd() % 255) - 127); break;
        case MS_DT_F8_E4M3: {
            uint8_t b;
            do b = (uint8_t)rnd(); while ((b & 0x7f) == 0x7f); /* no NaN codes */
            mem[i] = b;
            break;
        }
        default: break;
        }
    }
    if (v->dt == MS_DT_F4 || v->dt == MS_DT_I4)
        for (size_t i = 0; i < dbytes; i++) mem[i] = (uint8_t)rnd();
    for (int64_t i = 0; i < sr * sc; i++) {
        if (v->sdt == MS_DT_F32) ((float *)(mem + soff))[i] = 0.5f + (rnd() & 1023) / 1024.0f;
        else if (v->sdt == MS_DT_BF16) ((uint16_t *)(mem + soff))[i] = ms_f32_to_bf16(0.001f * (1 + (rnd() & 255)));
        else mem[soff + i] = (uint8_t)(120 + rnd() % 12);
    }
    *w = (ms_qmat){.dtype = v->dt, .rows = rows, .cols = cols, .data = mem};
    if (v->brow) w->scale = mem + soff, w->scale_dtype = v->sdt, w->brow = v->brow, w->bcol = v->bcol;
    return mem;
}

/* sum_c |w[r,c]| |x[t,c]| for the tolerance */
static void magnitude(const ms_qmat *w, const float *x, int n, double *mag) {
    float *row = malloc((size_t)w->cols * sizeof *row);
    for (int64_t r = 0; r < w->rows; r++) {
        ms_qmat_row(w, r, row);
        for (int t = 0; t < n; t++) {
            double m = 0;
            for (int64_t c = 0; c < w->cols; c++) m += fabs((double)row[c] * x[(int64_t)t * w->cols + c]);
            mag[(int64_t)t * w->rows + r] = m;
        }
    }
    free(row);
}

static int g_isas[3], g_nisa;

static double g_xscale = 4; /* activation magnitude */

/* A pool of `threads` (1..3) whose kernels use `isa` (made once, kept for the run). */
static ms_pool *isa_pool(int isa, int threads) {
    static ms_pool *pools[3][4];
    if (!pools[isa][threads]) {
        pools[isa][threads] = ms_pool_create(threads);
        CHECK(ms_cpu_set_isa(pools[isa][threads], (ms_cpu_isa)isa, NULL) == MS_OK);
    }
    return pools[isa][threads];
}

static void run_case(const variant *v, int64_t rows, int64_t cols, int n, int threads) {
    ms_qmat w;
    void *mem = make_weight(v, rows, cols, &w);
    float *x = malloc((size_t)(n * cols) * sizeof *x), *ref = malloc((size_t)(n * rows) * sizeof *ref);
    float *y = malloc((size_t)(n * rows) * sizeof *y), *y0 = malloc((size_t)(n * rows) * sizeof *y0);
    double *mag = malloc((size_t)(n * rows) * sizeof *mag);
    for (int64_t i = 0; i < n * cols; i++) x[i] = (float)(frand() * g_xscale);
    ms_matmul_ref(ref, x, n, &w);
    magnitude(&w, x, n, mag);
    for (int ii = 0; ii < g_nisa; ii++) {
        ms_pool *pool = isa_pool(g_isas[ii], threads);
        for (int acc = 0; acc < 2; acc++) {
            for (int64_t i = 0; i < n * rows; i++) y[i] = y0[i] = acc ? frand() : NAN;
            if (acc) ms_matmul_acc(pool, y, x, n, &w);
            else ms_matmul(pool, y, x, n, &w);
            int bad = 0;
            for (int64_t i = 0; i < n * rows && bad < 3; i++) {
                double want = (double)ref[i] + (acc ? y0[i] : 0), tol = 2e-6 * mag[i] + 1e-6 * fabs(want) + 1e-37;
                if (!(fabs(y[i] - want) <= tol)) {
                    bad++;
                    CHECK_MSG(0, "%s isa=%s rows=%lld cols=%lld n=%d acc=%d pool=%d: y[%lld]=%.9g want %.9g (mag %g)",
                              v->name, ms_cpu_isa_name((ms_cpu_isa)g_isas[ii]), (long long)rows, (long long)cols, n,
                              acc, ms_pool_size(pool), (long long)i, y[i], want, mag[i]);
                }
            }
            if (!bad) CHECK(1);
        }
    }
    free(x), free(ref), free(y), free(y0), free(mag), free(mem);
}

static void setup_isas(void) {
    g_nisa = 0;
    /* the F32 kernel families (the VNNI levels run the same F32 kernels: test_qmatmul.c covers them) */
    for (int i = 0; i <= MS_ISA_AVX512; i++)
        if (ms_cpu_isa_supported((ms_cpu_isa)i)) g_isas[g_nisa++] = i;
}

TEST(isa_selection) {
    ms_err err = {0};
    setup_isas();
    ms_pool *p = ms_pool_create(2), *q = ms_pool_create(1);
    CHECK(ms_cpu_isa_of(p) == ms_cpu_isa_active() && ms_cpu_isa_of(NULL) == ms_cpu_isa_active());
    CHECK(ms_cpu_isa_active() <= ms_cpu_isa_best());
    CHECK(ms_cpu_set_isa(p, MS_ISA_SCALAR, &err) == MS_OK);
    CHECK(ms_cpu_isa_of(p) == MS_ISA_SCALAR && ms_cpu_isa_of(q) == ms_cpu_isa_active()); /* per pool */
    CHECK(ms_cpu_set_isa(p, (ms_cpu_isa)7, &err) == MS_ERR_ARG);
    CHECK(ms_cpu_set_isa(NULL, MS_ISA_SCALAR, &err) == MS_ERR_ARG);
    if (!ms_cpu_isa_supported(MS_ISA_AVX512)) CHECK(ms_cpu_set_isa(p, MS_ISA_AVX512, &err) == MS_ERR_UNSUPPORTED);
    if (!ms_cpu_isa_supported(MS_ISA_AVX512_VNNI)) CHECK(ms_cpu_set_isa(p, MS_ISA_AVX512_VNNI, &err) == MS_ERR_UNSUPPORTED);
    CHECK(ms_cpu_isa_supported(MS_ISA_SCALAR) && !ms_cpu_isa_supported((ms_cpu_isa)9));
    CHECK(ms_cpu_isa_base(MS_ISA_AVX512_VNNI) == MS_ISA_AVX512 && ms_cpu_isa_base(MS_ISA_AVX_VNNI) == MS_ISA_AVX2);
    CHECK(ms_cpu_set_isa(p, ms_cpu_isa_best(), &err) == MS_OK && ms_cpu_isa_of(p) == ms_cpu_isa_best());
    ms_pool_destroy(p), ms_pool_destroy(q);
    CHECK(ms_cpu_isa_parse("avx2") == MS_ISA_AVX2 && ms_cpu_isa_parse("nope") == -1);
    CHECK(ms_cpu_isa_parse("avx512vnni") == MS_ISA_AVX512_VNNI && ms_cpu_isa_parse("avxvnni") == MS_ISA_AVX_VNNI);
    printf("cpu isa: best %s\n", ms_cpu_isa_name(ms_cpu_isa_best()));
}

TEST(matmul_all_dtypes_all_isas) {
    setup_isas();
    static const int64_t rows_l[] = {1, 7, 130};
    static const int64_t cols_l[] = {32, 96, 160, 4160, 33, 1001};
    static const int n_l[] = {1, 3, 17, 64};
    for (size_t vi = 0; vi < sizeof k_variants / sizeof *k_variants; vi++) {
        const variant *v = &k_variants[vi];
        for (size_t ri = 0; ri < 3; ri++)
            for (size_t ci = 0; ci < 6; ci++)
                for (size_t ni = 0; ni < 4; ni++) {
                    int64_t rows = rows_l[ri], cols = cols_l[ci];
                    int n = n_l[ni];
                    if (v->dt == MS_DT_F4 && cols % 32) continue;
                    if (rows * cols * n > 130 * 4160 * 3) continue; /* keep the test short */
                    run_case(v, rows, cols, n, (ri + ci + ni) % 2 ? 3 : 1);
                }
        /* the big-n case once per dtype */
        run_case(v, 130, 4160, 64, 3);
    }
}

/* FP8 decode reads weights as value * 2^-120 and pre-scales x: tiny and huge
 * activations must still match the reference to F32 accuracy. */
TEST(matmul_f8_activation_range) {
    setup_isas();
    static const double scales[] = {1e-25, 1e-8, 1e12};
    for (int si = 0; si < 3; si++) {
        g_xscale = scales[si];
        for (size_t vi = 3; vi < 7; vi++) { /* the f8 variants */
            run_case(&k_variants[vi], 7, 160, 1, 1);
            run_case(&k_variants[vi], 7, 4160, 1, 1);
            run_case(&k_variants[vi], 7, 160, 3, 1);
        }
    }
    g_xscale = 4;
}

/* ms_matmul_many: a mixed batch (every variant, decode and prefill, acc 0/1,
 * more jobs than one pool run takes) equals the reference job by job. */
TEST(matmul_many_batch) {
    setup_isas();
    enum { NJ = 70 };
    ms_matmul_job jobs[NJ];
    ms_qmat ws[NJ];
    void *mems[NJ];
    float *y0[NJ], *ref[NJ];
    double *mag[NJ];
    for (int ii = 0; ii < g_nisa; ii++) {
        ms_pool *pool = isa_pool(g_isas[ii], 2);
        for (int i = 0; i < NJ; i++) {
            const variant *v = &k_variants[i % (sizeof k_variants / sizeof *k_variants)];
            int64_t rows = 1 + (i * 7) % 40, cols = (i % 5 == 0) ? 4160 : 32 * (1 + i % 6);
            int n = i % 3 == 0 ? 3 : 1, acc = i % 2;
            mems[i] = make_weight(v, rows, cols, &ws[i]);
            float *x = malloc((size_t)(n * cols) * sizeof *x), *y = malloc((size_t)(n * rows) * sizeof *y);
            y0[i] = malloc((size_t)(n * rows) * sizeof *y0[i]);
            ref[i] = malloc((size_t)(n * rows) * sizeof *ref[i]);
            mag[i] = malloc((size_t)(n * rows) * sizeof *mag[i]);
            for (int64_t e = 0; e < n * cols; e++) x[e] = frand() * 4;
            for (int64_t e = 0; e < n * rows; e++) y[e] = y0[i][e] = acc ? frand() : NAN;
            ms_matmul_ref(ref[i], x, n, &ws[i]);
            magnitude(&ws[i], x, n, mag[i]);
            jobs[i] = (ms_matmul_job){.y = y, .x = x, .n = n, .w = &ws[i], .acc = acc};
        }
        ms_matmul_many(pool, jobs, NJ);
        int bad = 0;
        for (int i = 0; i < NJ; i++) {
            for (int64_t e = 0; e < jobs[i].n * ws[i].rows; e++) {
                double want = (double)ref[i][e] + (jobs[i].acc ? y0[i][e] : 0);
                if (!(fabs(jobs[i].y[e] - want) <= 2e-6 * mag[i][e] + 1e-6 * fabs(want) + 1e-37)) bad++;
            }
            free((void *)jobs[i].x), free(jobs[i].y), free(y0[i]), free(ref[i]), free(mag[i]), free(mems[i]);
        }
        CHECK_MSG(bad == 0, "isa %s: %d outputs off", ms_cpu_isa_name((ms_cpu_isa)g_isas[ii]), bad);
    }
}

TEST(matmul_zero_shapes) {
    setup_isas();
    float x[4] = {1, 2, 3, 4}, y[4] = {5, 5, 5, 5};
    uint16_t d[1] = {0};
    ms_qmat w = {.dtype = MS_DT_BF16, .rows = 2, .cols = 0, .data = d};
    for (int ii = 0; ii < g_nisa; ii++) {
        ms_pool *pool = isa_pool(g_isas[ii], 1);
        for (int i = 0; i < 4; i++) y[i] = 5;
        ms_matmul_acc(pool, y, x, 2, &w);
        CHECK(y[0] == 5 && y[3] == 5);
        ms_matmul(pool, y, x, 2, &w);
        CHECK(y[0] == 0 && y[3] == 0);
    }
    for (int i = 0; i < 4; i++) y[i] = 5;
    ms_matmul(NULL, y, x, 2, &w); /* no pool: the process's ISA */
    CHECK(y[0] == 0 && y[3] == 0);
}

TEST_MAIN()

/* Q8 and the FP8 requantization layout, every ISA, against the scalar twin (ms_matmul_ref). */
TEST(matmul_q8_all_isas) {
    setup_isas();
    static const int64_t rows_l[] = {1, 7, 130};
    static const int64_t cols_l[] = {32, 96, 160, 4160, 33, 1001};
    static const int n_l[] = {1, 3, 17, 64};
    for (size_t vi = 0; vi < sizeof k_qvariants / sizeof *k_qvariants; vi++) {
        const variant *v = &k_qvariants[vi];
        for (size_t ri = 0; ri < 3; ri++)
            for (size_t ci = 0; ci < 6; ci++)
                for (size_t ni = 0; ni < 4; ni++) {
                    int64_t rows = rows_l[ri], cols = cols_l[ci];
                    int n = n_l[ni];
                    if (rows * cols * n > 130 * 4160 * 3) continue;
                    run_case(v, rows, cols, n, (ri + ci + ni) % 2 ? 3 : 1);
                }
        run_case(v, 130, 4160, 64, 3);
        run_case(v, 9, 8192, 1, 2); /* long rows: the 4-row decode groups */
    }
}

/* ms_quant_q8_row / ms_quant_fp8_row: the block contract of core/qmat.h. */
TEST(quant_rows_contract) {
    enum { N = 32 * 7 + 5 };
    float x[N], back[N];
    int8_t q[N];
    uint8_t f8[N];
    uint16_t sc[8], sf[8];
    for (int trial = 0; trial < 50; trial++) {
        double mag = trial % 5 == 0 ? 1e-30 : trial % 5 == 1 ? 1e6 : 0.05;
        for (int i = 0; i < N; i++) x[i] = (float)(frand() * mag);
        if (trial == 3) for (int i = 32; i < 64; i++) x[i] = 0; /* an all-zero block */
        ms_quant_q8_row(x, N, q, sc);
        ms_quant_fp8_row(x, N, f8, sf);
        ms_qmat w = {.dtype = MS_DT_Q8, .rows = 1, .cols = N, .data = q, .scale = sc, .scale_dtype = MS_DT_BF16,
                     .brow = 1, .bcol = 32};
        ms_qmat_row(&w, 0, back);
        int bad = 0;
        for (int b = 0; b * 32 < N; b++) {
            float amax = 0;
            for (int i = b * 32; i < N && i < b * 32 + 32; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
            float d = ms_bf16_to_f32(sc[b]), df = ms_bf16_to_f32(sf[b]);
            if (!(d >= amax / 127.0f && d <= amax / 127.0f * (1 + 1.0f / 64))) bad++;
            if (!(df >= amax / 448.0f && df <= amax / 448.0f * (1 + 1.0f / 64))) bad++;
            for (int i = b * 32; i < N && i < b * 32 + 32; i++) {
                if (q[i] < -127 || fabsf(back[i] - x[i]) > d * 0.5f * (1 + 1e-6f) + 1e-45f) bad++;
                /* E4M3: 3 mantissa bits, relative step 2^-3 at worst (normals), subnormal step 2^-9 * d */
                float v = ms_fp8_e4m3_to_f32(f8[i]) * df;
                if (fabsf(v - x[i]) > fabsf(x[i]) / 16 * (1 + 1e-6f) + df * 0x1p-10f * (1 + 1e-6f) + 1e-45f) bad++;
            }
        }
        CHECK_MSG(bad == 0, "trial %d: %d contract violations", trial, bad);
    }
}


/* INT4 (I4), every ISA, decode and prefill, against the scalar twin (ms_matmul_ref). */
TEST(matmul_i4_all_isas) {
    setup_isas();
    static const int64_t rows_l[] = {1, 7, 130};
    static const int64_t cols_l[] = {32, 96, 160, 4160, 40, 1000};
    static const int n_l[] = {1, 3, 17, 64};
    for (size_t vi = 0; vi < sizeof k_i4variants / sizeof *k_i4variants; vi++) {
        const variant *v = &k_i4variants[vi];
        for (size_t ri = 0; ri < 3; ri++)
            for (size_t ci = 0; ci < 6; ci++)
                for (size_t ni = 0; ni < 4; ni++) {
                    int64_t rows = rows_l[ri], cols = cols_l[ci];
                    int n = n_l[ni];
                    if (rows * cols * n > 130 * 4160 * 3) continue;
                    run_case(v, rows, cols, n, (ri + ci + ni) % 2 ? 3 : 1);
                }
        run_case(v, 130, 4160, 64, 3);
        run_case(v, 9, 8192, 1, 2);
    }
}

/* ms_quant_i4_row: compressed-tensors' symmetric INT4 (scale amax / 7.5, q in [-8, 7],
 * packed per pack_to_int32) and its round trip through ms_qmat_row. */
TEST(quant_i4_row_contract) {
    enum { N = 32 * 5 };
    float x[N], back[N];
    int32_t pk[N / 8];
    uint16_t sc[N / 32];
    for (int trial = 0; trial < 30; trial++) {
        for (int i = 0; i < N; i++) x[i] = (float)(frand() * (trial % 3 == 0 ? 1e-20 : 0.05));
        if (trial == 4) for (int i = 32; i < 64; i++) x[i] = 0;
        ms_quant_i4_row(x, N, 32, pk, sc);
        ms_qmat w = {.dtype = MS_DT_I4, .rows = 1, .cols = N, .data = pk, .scale = sc, .scale_dtype = MS_DT_BF16,
                     .brow = 1, .bcol = 32};
        ms_qmat_row(&w, 0, back);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            int u = (int)(((uint32_t)pk[i / 8] >> (4 * (i % 8))) & 15);
            float d = ms_bf16_to_f32(sc[i / 32]);
            if (back[i] != (float)(u - 8) * d) bad++;
            if (fabsf(back[i] - x[i]) > d * 0.5f * (1 + 1e-6f) + d * (7.5f / 7.0f - 1.0f) * 8 + 1e-45f) bad++;
        }
        CHECK_MSG(bad == 0, "trial %d: %d contract violations", trial, bad);
    }
}
