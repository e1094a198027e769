/* test_qmatmul.c — the Q8-activation path (ms_cpu_set_activations MS_ACT_Q8, and MS_ACT_Q16: two planes):
 * MXFP4 (E8M0 and U8 scales, brow 2), INT4 (groups 32 and 128) and Q8
 * weights. (1) Every ISA the CPU has (scalar, AVX2, AVX-VNNI, AVX-512, AVX-512
 * VNNI) against the scalar Q8 path, decode and prefill, on pools of 1 and 3
 * threads, also through ms_matmul_many. (2) The scalar Q8 path against the F32
 * reference (ms_matmul_ref) within the bound the activation rounding allows:
 * |x - d q| <= d / 2 per element, so |y_q8 - y| <= sum_c |w_c| d_b(c) / 2 (plus
 * F32 rounding). (3) Other dtypes (BF16, FP8) on a Q8 pool stay bit-identical to
 * an F32 pool. */
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/qkern.h"
#include "ops/ops.h"
#include "test.h"

static uint64_t g_rng = 0x5DEECE66Dull;
static uint32_t rnd(void) { return (uint32_t)(ms_test_xorshift(&g_rng) >> 16); }
static float frand(void) { return (float)((rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0); }

typedef struct {
    const char *name;
    ms_dtype dt, sdt;
    int brow, bcol; /* 0: no scale */
} variant;

static const variant k_variants[] = {
    {"f4-e8m0", MS_DT_F4, MS_DT_F8_E8M0, 1, 32},   /* gpt-oss blocks/scales */
    {"f4-u8", MS_DT_F4, MS_DT_U8, 1, 32},          /* compressed-tensors weight_packed/weight_scale */
    {"f4-e8m0-brow2", MS_DT_F4, MS_DT_F8_E8M0, 2, 32},
    {"i4-bf16-32", MS_DT_I4, MS_DT_BF16, 1, 32},
    {"i4-bf16-128", MS_DT_I4, MS_DT_BF16, 1, 128},
    {"q8-bf16-32", MS_DT_Q8, MS_DT_BF16, 1, 32},
};

static void *make_weight(const variant *v, int64_t rows, int64_t cols, ms_qmat *w) {
    size_t dbytes = (size_t)(rows * cols * ms_dtype_bits(v->dt) / 8);
    int64_t sr = v->brow ? (rows + v->brow - 1) / v->brow : 0, sc = v->bcol ? (cols + v->bcol - 1) / v->bcol : 0;
    size_t sbytes = v->brow ? (size_t)(sr * sc * ms_dtype_bits(v->sdt) / 8) : 0;
    uint8_t *mem = malloc(dbytes + sbytes + 64);
    size_t soff = (dbytes + 63) & ~(size_t)63;
    for (size_t i = 0; i < dbytes; i++) mem[i] = (uint8_t)rnd();
    if (v->dt == MS_DT_Q8)
        for (size_t i = 0; i < dbytes; i++) mem[i] = (uint8_t)(int8_t)((int)(rnd() % 255) - 127);
    for (int64_t i = 0; i < sr * sc; i++) {
        if (v->sdt == MS_DT_BF16) ((uint16_t *)(mem + soff))[i] = ms_f32_to_bf16(0.001f * (1 + (rnd() & 255)));
        else mem[soff + i] = (uint8_t)(120 + rnd() % 12);
    }
    *w = (ms_qmat){.dtype = v->dt, .rows = rows, .cols = cols, .data = mem};
    if (v->brow) w->scale = mem + soff, w->scale_dtype = v->sdt, w->brow = v->brow, w->bcol = v->bcol;
    return mem;
}

static int g_isas[8], g_nisa;
static void setup_isas(void) {
    g_nisa = 0;
    for (int i = 0; i <= MS_ISA_AVX512_VNNI; i++)
        if (ms_cpu_isa_supported((ms_cpu_isa)i)) g_isas[g_nisa++] = i;
}

static ms_pool *qpool(int isa, int threads, int act) {
    static ms_pool *pools[8][4][8];
    if (!pools[isa][threads][act]) {
        pools[isa][threads][act] = ms_pool_create(threads);
        CHECK(ms_cpu_set_isa(pools[isa][threads][act], (ms_cpu_isa)isa, NULL) == MS_OK);
        CHECK(ms_cpu_set_activations(pools[isa][threads][act], (ms_cpu_act)act, NULL) == MS_OK);
    }
    return pools[isa][threads][act];
}

/* sum_c |w[r,c]| |x[t,c]| (the F32 rounding scale) and the activation-rounding bound. */
static void bounds(const ms_qmat *w, const float *x, int n, double *mag, double *qb) {
    float *row = malloc((size_t)w->cols * sizeof *row);
    for (int64_t r = 0; r < w->rows; r++) {
        ms_qmat_row(w, r, row);
        for (int t = 0; t < n; t++) {
            const float *xt = x + (int64_t)t * w->cols;
            double m = 0, q = 0;
            for (int64_t b = 0; b < w->cols / 32; b++) {
                double amax = 0, wsum = 0;
                for (int j = 0; j < 32; j++) {
                    double a = fabs(xt[b * 32 + j]);
                    if (a > amax) amax = a;
                    wsum += fabs(row[b * 32 + j]);
                    m += fabs((double)row[b * 32 + j] * xt[b * 32 + j]);
                }
                q += wsum * amax / 127 / 2;
            }
            mag[(int64_t)t * w->rows + r] = m, qb[(int64_t)t * w->rows + r] = q;
        }
    }
    free(row);
}

/* act: MS_ACT_Q8, or MS_ACT_Q16 (two planes: the bound is 1/128 of Q8's, a full unit amax / (127 * 256)
 * per element for the q2 clamp at ties, plus the F32 rounding of x * 127 / amax). */
static void run_case_act(const variant *v, int64_t rows, int64_t cols, int n, int threads, int act) {
    ms_qmat w;
    void *mem = make_weight(v, rows, cols, &w);
    int64_t ny = (int64_t)n * rows;
    float *x = malloc((size_t)(n * cols) * sizeof *x), *ref = malloc((size_t)ny * sizeof *ref);
    float *sq = malloc((size_t)ny * sizeof *sq), *y = malloc((size_t)ny * sizeof *y), *y0 = malloc((size_t)ny * sizeof *y0);
    double *mag = malloc((size_t)ny * sizeof *mag), *qb = malloc((size_t)ny * sizeof *qb);
    for (int64_t i = 0; i < n * cols; i++) x[i] = frand() * 4 * (i % 97 == 0 ? 30 : 1); /* some outliers */
    for (int64_t i = 0; i < cols && n > 1; i++) x[cols + i] = 0;                          /* token 1: all zero */
    ms_matmul_ref(ref, x, n, &w);
    bounds(&w, x, n, mag, qb);
    if (act == MS_ACT_Q16)
        for (int64_t i = 0; i < ny; i++) qb[i] /= 128;
    ms_matmul(qpool(MS_ISA_SCALAR, 1, act), sq, x, n, &w);
    int bad = 0;
    for (int64_t i = 0; i < ny && bad < 3; i++)
        if (!(fabs((double)sq[i] - ref[i]) <= qb[i] * 1.0001 + 4e-6 * mag[i] + 1e-30)) {
            bad++;
            CHECK_MSG(0, "%s %lldx%lld n=%d scalar %s y[%lld]=%.9g f32 %.9g bound %g", v->name, (long long)rows,
                      (long long)cols, n, ms_cpu_act_name((ms_cpu_act)act), (long long)i, sq[i], ref[i], qb[i]);
        }
    if (!bad) CHECK(1);
    for (int ii = 0; ii < g_nisa; ii++) {
        ms_pool *pool = qpool(g_isas[ii], threads, act);
        for (int acc = 0; acc < 2; acc++) {
            for (int64_t i = 0; i < ny; i++) y[i] = y0[i] = acc ? frand() : NAN;
            if (acc) ms_matmul_acc(pool, y, x, n, &w);
            else ms_matmul(pool, y, x, n, &w);
            bad = 0;
            for (int64_t i = 0; i < ny && bad < 3; i++) {
                double want = (double)sq[i] + (acc ? y0[i] : 0);
                if (!(fabs(y[i] - want) <= 4e-6 * mag[i] + 1e-6 * fabs(want) + 1e-30)) {
                    bad++;
                    CHECK_MSG(0, "%s isa=%s %s %lldx%lld n=%d acc=%d pool=%d: y[%lld]=%.9g scalar %.9g (mag %g)", v->name,
                              ms_cpu_isa_name((ms_cpu_isa)g_isas[ii]), ms_cpu_act_name((ms_cpu_act)act), (long long)rows, (long long)cols, n, acc,
                              ms_pool_size(pool), (long long)i, y[i], want, mag[i]);
                }
            }
            if (!bad) CHECK(1);
        }
    }
    free(x), free(ref), free(sq), free(y), free(y0), free(mag), free(qb), free(mem);
}
static void run_case(const variant *v, int64_t rows, int64_t cols, int n, int threads) {
    run_case_act(v, rows, cols, n, threads, MS_ACT_Q8);
    run_case_act(v, rows, cols, n, threads, MS_ACT_Q16);
}

TEST(q8_activations_every_isa) {
    setup_isas();
    printf("isas:");
    for (int i = 0; i < g_nisa; i++) printf(" %s", ms_cpu_isa_name((ms_cpu_isa)g_isas[i]));
    printf("\n");
    static const int64_t rows_l[] = {1, 7, 130};
    static const int64_t cols_l[] = {32, 96, 128, 160, 640, 4224};
    static const int n_l[] = {1, 3, 17};
    for (size_t vi = 0; vi < sizeof k_variants / sizeof *k_variants; vi++) {
        const variant *v = &k_variants[vi];
        for (size_t ri = 0; ri < 3; ri++)
            for (size_t ci = 0; ci < 6; ci++)
                for (size_t ni = 0; ni < 3; ni++) {
                    int64_t rows = rows_l[ri], cols = cols_l[ci];
                    if (v->bcol > 32 && cols % v->bcol) continue;
                    if (rows * cols * n_l[ni] > 130 * 4224 * 3) continue;
                    run_case(v, rows, cols, n_l[ni], (ri + ci + ni) % 2 ? 3 : 1);
                }
        run_case(v, 130, 4224, 40, 3);
    }
}

/* Several jobs in one run (the routed experts of a step), mixed dtypes: each equals its lone matmul. */
TEST(q8_activations_many) {
    setup_isas();
    enum { NJ = 24 };
    for (int ii = 0; ii < 2 * g_nisa; ii++) {
        ms_pool *pool = qpool(g_isas[ii / 2], 2, ii % 2 ? MS_ACT_Q16 : MS_ACT_Q8);
        ms_matmul_job jobs[NJ];
        ms_qmat ws[NJ];
        void *mems[NJ];
        float *want[NJ];
        for (int i = 0; i < NJ; i++) {
            const variant *v = &k_variants[i % (sizeof k_variants / sizeof *k_variants)];
            int64_t rows = 1 + (i * 7) % 40, cols = 128 * (1 + i % 3);
            int n = i % 4 == 0 ? 5 : 1;
            mems[i] = make_weight(v, rows, cols, &ws[i]);
            float *x = malloc((size_t)(n * cols) * sizeof *x), *y = malloc((size_t)(n * rows) * sizeof *y);
            want[i] = malloc((size_t)(n * rows) * sizeof *want[i]);
            for (int64_t e = 0; e < n * cols; e++) x[e] = frand();
            ms_matmul(pool, want[i], x, n, &ws[i]);
            jobs[i] = (ms_matmul_job){.y = y, .x = x, .n = n, .w = &ws[i], .acc = 0};
        }
        ms_matmul_many(pool, jobs, NJ);
        int bad = 0;
        for (int i = 0; i < NJ; i++) {
            for (int64_t e = 0; e < jobs[i].n * ws[i].rows; e++) bad += memcmp(&jobs[i].y[e], &want[i][e], 4) != 0;
            free((void *)jobs[i].x), free(jobs[i].y), free(want[i]), free(mems[i]);
        }
        CHECK_MSG(bad == 0, "isa %s act %d: %d outputs differ", ms_cpu_isa_name((ms_cpu_isa)g_isas[ii / 2]), ii % 2, bad);
    }
}

/* The dtypes the Q8 path does not take run the F32 kernels unchanged on a Q8 pool; a
 * non-finite activation block makes its rows NaN. */
TEST(q8_activations_other_dtypes_and_nan) {
    setup_isas();
    ms_err err = {0};
    CHECK(ms_cpu_set_activations(NULL, MS_ACT_Q8, &err) == MS_ERR_ARG);
    CHECK(ms_cpu_act_parse("q8") == MS_ACT_Q8 && ms_cpu_act_parse("f32") == MS_ACT_F32 && ms_cpu_act_parse("i8") == -1);
    CHECK(ms_cpu_act_parse("q16") == MS_ACT_Q16 && ms_cpu_act_parse("q16+bf16") == MS_ACT_Q16_BF16);
    CHECK(ms_cpu_act_default(MS_ISA_SCALAR) == MS_ACT_F32 && ms_cpu_act_default(MS_ISA_AVX2) == MS_ACT_Q16 &&
          ms_cpu_act_default(MS_ISA_AVX512_VNNI) == MS_ACT_Q16);
    CHECK(ms_cpu_set_activations(qpool(MS_ISA_SCALAR, 1, MS_ACT_Q16), (ms_cpu_act)5, &err) == MS_ERR_ARG);
    CHECK(ms_cpu_activations_of(qpool(MS_ISA_SCALAR, 1, MS_ACT_Q16)) == MS_ACT_Q16);
    CHECK(ms_cpu_activations_of(NULL) == MS_ACT_F32);
    enum { R = 33, C = 256 };
    uint16_t *wb = malloc(R * C * 2);
    for (int i = 0; i < R * C; i++) wb[i] = ms_f32_to_bf16(frand());
    ms_qmat w = {.dtype = MS_DT_BF16, .rows = R, .cols = C, .data = wb};
    float x[3 * C], a[3 * R], b[3 * R];
    for (int i = 0; i < 3 * C; i++) x[i] = frand();
    for (int ii = 0; ii < g_nisa; ii++)
        for (int n = 1; n <= 3; n += 2) {
            ms_matmul(qpool(g_isas[ii], 3, MS_ACT_F32), a, x, n, &w);
            ms_matmul(qpool(g_isas[ii], 3, MS_ACT_Q8), b, x, n, &w);
            CHECK(memcmp(a, b, sizeof(float) * n * R) == 0);
        }
    free(wb);
    ms_qmat q;
    void *mem = make_weight(&k_variants[0], 5, 64, &q);
    for (int i = 0; i < 64; i++) x[i] = 1;
    x[40] = INFINITY;
    for (int ii = 0; ii < 2 * g_nisa; ii++) {
        ms_matmul(qpool(g_isas[ii / 2], 1, ii % 2 ? MS_ACT_Q16 : MS_ACT_Q8), a, x, 1, &q);
        int nan = 1;
        for (int r = 0; r < 5; r++) nan &= isnan(a[r]);
        CHECK_MSG(nan, "isa %s: an infinite activation must give NaN rows", ms_cpu_isa_name((ms_cpu_isa)g_isas[ii / 2]));
    }
    free(mem);
}

/* Q16 is a decode path: a prefill (n > 1) on a Q16 pool runs the F32 tiles, bit for bit an F32 pool's. */
TEST(q16_prefill_is_f32) {
    setup_isas();
    for (size_t vi = 0; vi < sizeof k_variants / sizeof *k_variants; vi++) {
        ms_qmat w;
        void *mem = make_weight(&k_variants[vi], 37, 256, &w);
        float x[5 * 256], a[5 * 37], b[5 * 37];
        for (int i = 0; i < 5 * 256; i++) x[i] = frand();
        for (int ii = 0; ii < g_nisa; ii++) {
            ms_matmul(qpool(g_isas[ii], 3, MS_ACT_F32), a, x, 5, &w);
            ms_matmul(qpool(g_isas[ii], 3, MS_ACT_Q16), b, x, 5, &w);
            CHECK_MSG(memcmp(a, b, sizeof a) == 0, "%s isa %s", k_variants[vi].name, ms_cpu_isa_name((ms_cpu_isa)g_isas[ii]));
        }
        free(mem);
    }
}

/* Each ISA's quantizer gives exactly ms_qk_quant's integers, scales and sums (zero, tiny,
 * huge and non-finite blocks, both layouts, a ragged tail). */
TEST(q8_quant_identical) {
    setup_isas();
    enum { K = 32 * 37 };
    static float x[K];
    static int8_t qa[K + QK_PAD], qb[K + QK_PAD], q2a[K + QK_PAD], q2b[K + QK_PAD];
    static float da[K / 32 + 4], db[K / 32 + 4], ma[K / 32 + 4], mb[K / 32 + 4];
    for (int i = 0; i < K; i++) x[i] = frand() * (i < 320 ? 1e-30f : i < 640 ? 1e30f : 3.0f);
    for (int i = 640; i < 672; i++) x[i] = 0;
    x[700] = NAN, x[760] = -INFINITY;
    for (int i = 800; i < 832; i++) x[i] = (float)(i - 816) * 0.5f; /* ties to even */
    for (int ii = 0; ii < g_nisa; ii++) {
        const qk_kernels *k = ms_qk_for((ms_cpu_isa)g_isas[ii]);
        if (!k->quant) continue;
        for (int lay = 0; lay < 4; lay++) { /* layouts 0, 1; & 2: two planes */
            memset(qa, 0x55, sizeof qa), memset(qb, 0x55, sizeof qb);
            memset(q2a, 0x55, sizeof q2a), memset(q2b, 0x55, sizeof q2b);
            ms_qk_quant(x, K, k->gb, (qk_layout)(lay & 1), qa, lay & 2 ? q2a : NULL, da, ma);
            k->quant(x, K, k->gb, (qk_layout)(lay & 1), qb, lay & 2 ? q2b : NULL, db, mb);
            int nb = (K + QK_PAD - 1) / QK_PAD * QK_PAD / 32;
            CHECK_MSG(memcmp(qa, qb, (size_t)nb * 32) == 0 && memcmp(da, db, (size_t)nb * 4) == 0 &&
                          memcmp(ma, mb, (size_t)nb * 4) == 0 && memcmp(q2a, q2b, (size_t)nb * 32) == 0,
                      "isa %s layout %d", ms_cpu_isa_name((ms_cpu_isa)g_isas[ii]), lay);
        }
    }
}

TEST_MAIN()
