/* test_bf16dot.c — the BF16-activation matvec (ms_cpu_set_activations MS_ACT_BF16,
 * vdpbf16ps). (1) On an AVX-512 pool of a CPU with AVX512_BF16, BF16 decode against
 * the exact dot with x rounded to BF16 (double sums), within the F32 summation bound,
 * for row lengths with and without a tail and the 8-row path (K > 8192), on 1 and 3
 * threads and through ms_matmul_many; and the rounding is visible (not the F32 path).
 * (2) Everywhere else (AVX2, scalar, prefill n > 1, other dtypes) a BF16 pool gives
 * the F32 pool's bytes, and a Q8+BF16 pool the Q8 pool's on MXFP4. (3) Names. (4) The
 * F32-activation AVX-512 BF16 decode gives exactly the sums of its documented form
 * (kernels_avx512.c: a0 lane i column i of each 32, a1 column 16 + i, FMA in column order, a
 * masked 16-wide tail into a0, _mm512_reduce_add_ps of a0 + a1), emulated here in scalar C; the
 * AVX2 one likewise (8-lane a0 / a1 over 16 columns, its hsum). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "ops/ops.h"
#include "test.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) { return (uint32_t)(ms_test_xorshift(&g_rng) >> 16); }
static float frand(void) { return (float)((rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0); }

static ms_pool *bpool(int isa, int threads, int act) {
    static ms_pool *pools[8][4][4];
    if (!pools[isa][threads][act]) {
        pools[isa][threads][act] = ms_pool_create(threads);
        CHECK(ms_cpu_set_isa(pools[isa][threads][act], (ms_cpu_isa)isa, NULL) == MS_OK);
        CHECK(ms_cpu_set_activations(pools[isa][threads][act], (ms_cpu_act)act, NULL) == MS_OK);
    }
    return pools[isa][threads][act];
}

static int takes_bf16dot(int isa) { return ms_cpu_isa_base((ms_cpu_isa)isa) == MS_ISA_AVX512 && ms_cpu_has_avx512bf16(); }

TEST(bf16_names) {
    CHECK(ms_cpu_act_parse("bf16") == MS_ACT_BF16 && ms_cpu_act_parse("q8+bf16") == MS_ACT_Q8_BF16);
    CHECK(!strcmp(ms_cpu_act_name(MS_ACT_BF16), "bf16") && !strcmp(ms_cpu_act_name(MS_ACT_Q8_BF16), "q8+bf16"));
    CHECK(ms_cpu_act_parse("bf16+q8") == -1);
    ms_err err = {0};
    ms_pool *p = ms_pool_create(1);
    CHECK(ms_cpu_set_activations(p, (ms_cpu_act)5, &err) == MS_ERR_ARG && ms_cpu_set_activations(p, (ms_cpu_act)7, &err) == MS_ERR_ARG);
    CHECK(ms_cpu_set_activations(p, MS_ACT_Q8_BF16, &err) == MS_OK && ms_cpu_activations_of(p) == MS_ACT_Q8_BF16);
    ms_pool_destroy(p);
}

static void bf16_case(int64_t R, int64_t C) {
    uint16_t *wb = malloc((size_t)(R * C) * 2);
    float *x = malloc((size_t)(3 * C) * sizeof *x), *a = malloc((size_t)(3 * R) * sizeof *a);
    float *b = malloc((size_t)(3 * R) * sizeof *b);
    for (int64_t i = 0; i < R * C; i++) wb[i] = ms_f32_to_bf16(frand());
    for (int64_t i = 0; i < 3 * C; i++) x[i] = frand();
    ms_qmat w = {.dtype = MS_DT_BF16, .rows = R, .cols = C, .data = wb};
    for (int isa = 0; isa <= MS_ISA_AVX512_VNNI; isa++) {
        if (!ms_cpu_isa_supported((ms_cpu_isa)isa)) continue;
        for (int th = 1; th <= 3; th += 2) {
            ms_matmul(bpool(isa, th, MS_ACT_F32), a, x, 1, &w);
            ms_matmul(bpool(isa, th, MS_ACT_BF16), b, x, 1, &w);
            if (!takes_bf16dot(isa)) {
                CHECK_MSG(!memcmp(a, b, (size_t)R * sizeof *a), "isa %s: bf16 pool differs from f32", ms_cpu_isa_name((ms_cpu_isa)isa));
            } else {
                int bad = 0, differ = 0;
                for (int64_t r = 0; r < R; r++) {
                    double s = 0, mag = 0;
                    for (int64_t c = 0; c < C; c++) {
                        double p = (double)ms_bf16_to_f32(wb[r * C + c]) * ms_bf16_to_f32(ms_f32_to_bf16(x[c]));
                        s += p, mag += fabs(p);
                    }
                    if (fabs(b[r] - s) > (double)(C / 16 + 16) * 0x1p-24 * mag) bad++;
                    differ += a[r] != b[r];
                }
                CHECK_MSG(bad == 0, "isa %s K %lld threads %d: %d rows off the BF16-rounded dot",
                          ms_cpu_isa_name((ms_cpu_isa)isa), (long long)C, th, bad);
                CHECK_MSG(differ > 0, "isa %s K %lld: no row differs from F32 (bf16 path not taken?)",
                          ms_cpu_isa_name((ms_cpu_isa)isa), (long long)C);
            }
            /* ms_matmul_many: the same bytes as ms_matmul on the same pool */
            float c2[2 * 64];
            ms_matmul_job jobs[2] = {{.y = c2, .x = x, .n = 1, .w = &w}, {.y = c2 + 64, .x = x + C, .n = 1, .w = &w}};
            if (R <= 64) {
                ms_matmul_many(bpool(isa, th, MS_ACT_BF16), jobs, 2);
                CHECK(!memcmp(c2, b, (size_t)R * sizeof *b));
            }
            /* prefill keeps the F32 tiles */
            ms_matmul(bpool(isa, th, MS_ACT_F32), a, x, 3, &w);
            ms_matmul(bpool(isa, th, MS_ACT_BF16), b, x, 3, &w);
            CHECK(!memcmp(a, b, (size_t)(3 * R) * sizeof *a));
        }
    }
    free(wb), free(x), free(a), free(b);
}

TEST(bf16_decode_shapes) {
    bf16_case(37, 2048); /* 64-column steps only */
    bf16_case(21, 96);   /* a 32-column tail */
    bf16_case(19, 40);   /* a partial (masked) tail */
    bf16_case(13, 8230); /* K > 8192: 8 rows at a time, then single rows; partial tail */
}

/* MXFP4 on a BF16 pool: the F32 pool's bytes; on a Q8+BF16 pool: the Q8 pool's. */
TEST(bf16_other_dtypes) {
    enum { R = 24, C = 256 };
    uint8_t *wd = malloc(R * C / 2), *sc = malloc(R * C / 32);
    for (int i = 0; i < R * C / 2; i++) wd[i] = (uint8_t)rnd();
    for (int i = 0; i < R * C / 32; i++) sc[i] = (uint8_t)(120 + rnd() % 10);
    ms_qmat w = {.dtype = MS_DT_F4, .rows = R, .cols = C, .data = wd, .scale = sc, .scale_dtype = MS_DT_F8_E8M0, .brow = 1, .bcol = 32};
    float x[C], a[R], b[R];
    for (int i = 0; i < C; i++) x[i] = frand();
    for (int isa = 0; isa <= MS_ISA_AVX512_VNNI; isa++) {
        if (!ms_cpu_isa_supported((ms_cpu_isa)isa)) continue;
        ms_matmul(bpool(isa, 1, MS_ACT_F32), a, x, 1, &w);
        ms_matmul(bpool(isa, 1, MS_ACT_BF16), b, x, 1, &w);
        CHECK(!memcmp(a, b, sizeof a));
        ms_matmul(bpool(isa, 1, MS_ACT_Q8), a, x, 1, &w);
        ms_matmul(bpool(isa, 1, MS_ACT_Q8_BF16), b, x, 1, &w);
        CHECK(!memcmp(a, b, sizeof a));
    }
    free(wd), free(sc);
}

/* GCC's _mm512_reduce_add_ps tree (avx512fintrin.h) */
static float reduce16(const float *v) {
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = v[i + 8] + v[i];
    for (int i = 0; i < 4; i++) s4[i] = s8[i + 4] + s8[i];
    float t0 = s4[0] + s4[2], t1 = s4[1] + s4[3];
    return t0 + t1;
}

static float bf16_row_form(const uint16_t *w, const float *x, int64_t K) {
    float a0[16] = {0}, a1[16] = {0}, v[16];
    int64_t k = 0;
    for (; k + 32 <= K; k += 32)
        for (int i = 0; i < 16; i++) {
            a0[i] = fmaf(ms_bf16_to_f32(w[k + i]), x[k + i], a0[i]);
            a1[i] = fmaf(ms_bf16_to_f32(w[k + 16 + i]), x[k + 16 + i], a1[i]);
        }
    for (; k < K; k += 16)
        for (int i = 0; i < 16; i++) a0[i] = k + i < K ? fmaf(ms_bf16_to_f32(w[k + i]), x[k + i], a0[i]) : fmaf(0.0f, 0.0f, a0[i]);
    for (int i = 0; i < 16; i++) v[i] = a0[i] + a1[i];
    return reduce16(v);
}

TEST(bf16_f32_decode_bits) {
    static const int64_t shapes[][2] = {{37, 2048}, {21, 96}, {19, 40}, {17, 4128}, {13, 4100}, {9, 8}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int64_t R = shapes[si][0], C = shapes[si][1];
        uint16_t *wb = malloc((size_t)(R * C) * 2);
        float *x = malloc((size_t)C * sizeof *x), *y = malloc((size_t)R * sizeof *y);
        for (int64_t i = 0; i < R * C; i++) wb[i] = ms_f32_to_bf16(frand());
        for (int64_t i = 0; i < C; i++) x[i] = frand();
        ms_qmat w = {.dtype = MS_DT_BF16, .rows = R, .cols = C, .data = wb};
        for (int isa = MS_ISA_AVX512; isa <= MS_ISA_AVX512_VNNI; isa += MS_ISA_AVX512_VNNI - MS_ISA_AVX512) {
            if (!ms_cpu_isa_supported((ms_cpu_isa)isa)) continue;
            ms_matmul(bpool(isa, 3, MS_ACT_F32), y, x, 1, &w);
            int bad = 0;
            for (int64_t r = 0; r < R; r++) {
                float e = bf16_row_form(wb + r * C, x, C);
                bad += memcmp(&e, &y[r], 4) != 0;
            }
            CHECK_MSG(bad == 0, "isa %s K %lld: %d rows differ from the documented sums", ms_cpu_isa_name((ms_cpu_isa)isa),
                      (long long)C, bad);
        }
        free(wb), free(x), free(y);
    }
}

/* The AVX2 form: a0 lane i column i of each 16, a1 column 8 + i, hsum (kernels_avx2.c) of a0 + a1;
 * shapes without a scalar tail (K % 16 == 0: its contraction is the compiler's). */
static float bf16_row_form8(const uint16_t *w, const float *x, int64_t K) {
    float a0[8] = {0}, a1[8] = {0}, v[8], s4[4];
    for (int64_t k = 0; k + 16 <= K; k += 16)
        for (int i = 0; i < 8; i++) {
            a0[i] = fmaf(ms_bf16_to_f32(w[k + i]), x[k + i], a0[i]);
            a1[i] = fmaf(ms_bf16_to_f32(w[k + 8 + i]), x[k + 8 + i], a1[i]);
        }
    for (int i = 0; i < 8; i++) v[i] = a0[i] + a1[i];
    for (int i = 0; i < 4; i++) s4[i] = v[i] + v[i + 4];
    float t0 = s4[0] + s4[2], t1 = s4[1] + s4[3];
    return t0 + t1;
}

TEST(bf16_f32_decode_bits_avx2) {
    if (!ms_cpu_isa_supported(MS_ISA_AVX2)) return;
    static const int64_t shapes[][2] = {{37, 2048}, {21, 96}, {17, 4128}, {9, 16}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int64_t R = shapes[si][0], C = shapes[si][1];
        uint16_t *wb = malloc((size_t)(R * C) * 2);
        float *x = malloc((size_t)C * sizeof *x), *y = malloc((size_t)R * sizeof *y);
        for (int64_t i = 0; i < R * C; i++) wb[i] = ms_f32_to_bf16(frand());
        for (int64_t i = 0; i < C; i++) x[i] = frand();
        ms_qmat w = {.dtype = MS_DT_BF16, .rows = R, .cols = C, .data = wb};
        ms_matmul(bpool(MS_ISA_AVX2, 3, MS_ACT_F32), y, x, 1, &w);
        int bad = 0;
        for (int64_t r = 0; r < R; r++) {
            float e = bf16_row_form8(wb + r * C, x, C);
            bad += memcmp(&e, &y[r], 4) != 0;
        }
        CHECK_MSG(bad == 0, "avx2 K %lld: %d rows differ from the documented sums", (long long)C, bad);
        free(wb), free(x), free(y);
    }
}

TEST_MAIN()
