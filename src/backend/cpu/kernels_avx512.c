/* kernels_avx512.c — AVX-512 (F/BW/VL/DQ + FMA + F16C) matmul kernels.
 * Every function carries a target attribute; the dispatcher only calls them
 * after CPUID says the CPU has these features (isa.c). */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "backend/cpu/kernels.h"

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define UNROLL _Pragma("GCC unroll 4")
#define UNROLL8 _Pragma("GCC unroll 8")
#define INL static inline __attribute__((always_inline)) T512

/* ---- element loaders: 16 (or fewer, masked) weights -> 16 F32 lanes ---- */

INL __mmask16 tail_mask(int64_t left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1); }

INL __m512 ld_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
INL __m512 ld_bf16_m(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
INL __m512 ld_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
INL __m512 ld_f16_m(const uint16_t *p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
INL __m512 ld_f32(const float *p) { return _mm512_loadu_ps(p); }
INL __m512 ld_f32_m(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

/* FP8 e4m3 -> F16 bit pattern (value * 2^-8, exact, subnormals included) -> F32.
 * Sign-extend to 16 bits, shift the 7 exponent/mantissa bits under the F16
 * exponent, keep the sign. 0x7f/0xff (NaN in e4m3fn) decode as +-480. */
INL __m512i f8_to_h16_32(__m256i b) {
    __m512i h = _mm512_slli_epi16(_mm512_cvtepi8_epi16(b), 7);
    return _mm512_and_si512(h, _mm512_set1_epi16((short)0xbf80));
}
INL __m512 ld_f8_m(const uint8_t *p, __mmask16 m) { /* 16 values * 2^-8 */
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(m, p)), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16((short)0xbf80)));
}

INL __m512 fp4_table(void) {
    return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f,
                          -4.0f, -6.0f);
}

/* ---- decode (n == 1) ---- */

/* Row-group choice for decode (measured on Zen 4, one core streaming from DRAM):
 * while x fits comfortably in L1 (K <= 4096), one row at a time keeps the whole
 * task one linear stream, which the hardware prefetcher follows at full speed;
 * several short rows in flight interleave streams and run at half the rate. For
 * long rows x no longer stays in L1, and 8 rows share each x load instead. */
#define GEMV_ONE_ROW_MAX_K 4096

/* NR rows of a 16-bit or F32 dtype, streamed once. */
#define GEMV_PLAIN(NAME, T, LD, LDM)                                                                         \
    INL void NAME##_rows(const T *w, int64_t K, const float *x, float *out, const int NR) {               \
        __m512 a0[8], a1[8];                                                                              \
        UNROLL8 for (int i = 0; i < NR; i++) a0[i] = a1[i] = _mm512_setzero_ps();                         \
        int64_t k = 0;                                                                                    \
        for (; k + 32 <= K; k += 32) {                                                                    \
            __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);                         \
            UNROLL8 for (int i = 0; i < NR; i++) {                                                        \
                a0[i] = _mm512_fmadd_ps(LD(w + i * K + k), x0, a0[i]);                                    \
                a1[i] = _mm512_fmadd_ps(LD(w + i * K + k + 16), x1, a1[i]);                               \
            }                                                                                             \
        }                                                                                                 \
        for (; k < K; k += 16) {                                                                          \
            __mmask16 m = tail_mask(K - k);                                                               \
            __m512 x0 = _mm512_maskz_loadu_ps(m, x + k);                                                  \
            UNROLL8 for (int i = 0; i < NR; i++) a0[i] = _mm512_fmadd_ps(LDM(w + i * K + k, m), x0, a0[i]); \
        }                                                                                                 \
        UNROLL8 for (int i = 0; i < NR; i++) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(a0[i], a1[i]));  \
    }                                                                                                     \
    T512 static void NAME##_gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) { \
        const int64_t K = w->cols;                                                                        \
        const T *base = (const T *)w->data;                                                               \
        float o[8];                                                                                       \
        int64_t r = r0;                                                                                   \
        if (K > GEMV_ONE_ROW_MAX_K)                                                                       \
            for (; r + 8 <= r1; r += 8) {                                                                 \
                NAME##_rows(base + r * K, K, x, o, 8);                                                    \
                for (int i = 0; i < 8; i++) y[r + i] = acc ? y[r + i] + o[i] : o[i];                      \
            }                                                                                             \
        for (; r < r1; r++) {                                                                             \
            NAME##_rows(base + r * K, K, x, o, 1);                                                        \
            y[r] = acc ? y[r] + o[0] : o[0];                                                              \
        }                                                                                                 \
    }


/* BF16 decode. It gives the sums GEMV_PLAIN's form above would (a0 lane i: column i of each 32,
 * a1: column 16 + i, FMA in column order, a 16-wide masked tail into a0, reduce(a0 + a1)).
 * One 64-byte load gives 32 BF16 weights; v << 16 is the F32 of the even columns, v & 0xffff0000
 * of the odd ones, against x rewritten once per call into even/odd halves per 32 columns
 * (bfe_x_prep, f4_x_prep's layout; the tail past the last full 32 stays in column order).
 * Lane j of the even accumulator sums exactly the products lane 2j (mod 16) of that form's
 * a0 / a1 sums, in the same order, and likewise the odd one, so two permutes at the end give
 * a0 and a1 bit for bit; the tail and the reduction are that form's (tests/unit/test_bf16dot.c
 * checks the bytes against a scalar emulation of it). Per 32 columns: 1 load, a shift and an
 * and instead of two widening (cross-lane) loads and two shifts. */
static int64_t f4_x_need(const ms_qmat *w);
T512 static void f4_x_prep(const ms_qmat *w, const float *x, float *xs);
static int64_t bfe_x_need(const ms_qmat *w) { return w->dtype == MS_DT_BF16 ? w->cols : f4_x_need(w); }
T512 static void bfe_x_prep(const ms_qmat *w, const float *x, float *xs) {
    f4_x_prep(w, x, xs); /* full groups of 32 */
    if (w->dtype == MS_DT_BF16)
        for (int64_t k = w->cols / 32 * 32; k < w->cols; k++) xs[k] = x[k];
}

INL void bfe_rows(const uint16_t *w, int64_t K, const float *xs, float *out, const int NR) {
    __m512 e[8], o[8];
    UNROLL8 for (int i = 0; i < NR; i++) e[i] = o[i] = _mm512_setzero_ps();
    const __m512i hm = _mm512_set1_epi32((int)0xffff0000u);
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512 xe = _mm512_loadu_ps(xs + k), xo = _mm512_loadu_ps(xs + k + 16);
        UNROLL8 for (int i = 0; i < NR; i++) {
            __m512i v = _mm512_loadu_si512(w + i * K + k);
            e[i] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), xe, e[i]);
            o[i] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hm)), xo, o[i]);
        }
    }
    /* a0 lane i: column i of each 32 (even: e lane i/2, odd: o lane i/2); a1 lane i: column 16 + i */
    const __m512i i0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i i1 = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    __m512 a0[8], a1[8];
    UNROLL8 for (int i = 0; i < NR; i++) {
        a0[i] = _mm512_permutex2var_ps(e[i], i0, o[i]);
        a1[i] = _mm512_permutex2var_ps(e[i], i1, o[i]);
    }
    for (; k < K; k += 16) {
        __mmask16 m = tail_mask(K - k);
        __m512 x0 = _mm512_maskz_loadu_ps(m, xs + k);
        UNROLL8 for (int i = 0; i < NR; i++) a0[i] = _mm512_fmadd_ps(ld_bf16_m(w + i * K + k, m), x0, a0[i]);
    }
    UNROLL8 for (int i = 0; i < NR; i++) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(a0[i], a1[i]));
}

/* The avx512 gemv for BF16: rows [r0, r1) against xs = bfe_x_prep's rewrite of x. */
T512 static void bfe_gemv(const ms_qmat *w, const float *xs, float *y, int64_t r0, int64_t r1, int acc) {
    const int64_t K = w->cols;
    const uint16_t *base = (const uint16_t *)w->data;
    float o[8];
    int64_t r = r0;
    if (K > GEMV_ONE_ROW_MAX_K)
        for (; r + 8 <= r1; r += 8) {
            bfe_rows(base + r * K, K, xs, o, 8);
            for (int i = 0; i < 8; i++) y[r + i] = acc ? y[r + i] + o[i] : o[i];
        }
    for (; r < r1; r++) {
        bfe_rows(base + r * K, K, xs, o, 1);
        y[r] = acc ? y[r] + o[0] : o[0];
    }
}
GEMV_PLAIN(f16, uint16_t, ld_f16, ld_f16_m)
GEMV_PLAIN(f32, float, ld_f32, ld_f32_m)

/* FP8 e4m3 with 2-D block scales. Each byte becomes an F16 bit pattern (sign-extend to
 * 16 bits, shift the exponent/mantissa under the F16 exponent, keep the sign: exactly
 * value * 2^-8, e4m3 subnormals included) and vcvtph2ps makes it F32, a normal number
 * for every code. x arrives pre-scaled by 2^64 (MM_F8_XSCALE, done once per call by
 * matmul.c), so every product is value * x * 2^56; each column block's partial dot is
 * multiplied by scale * 2^-56 into the row sum. (This kernel used to read the bytes as
 * F32 patterns, value * 2^-120: every product and sum here is that one's times 2^112,
 * so the results are the same, but e4m3 subnormals were F32 subnormals there and each
 * FMA meeting one took a microcode assist on this VM's Zen 4: 35x slower on random
 * codes.) 0x7f/0xff (NaN in e4m3fn) read as +-480. */
INL __m512 f8_raw16(__m128i b) {
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16((short)0xbf80)));
}

INL void f8_rows(const ms_qmat *w, int64_t r, const float *x, float *out, const int NR) {
    const int64_t K = w->cols;
    const uint8_t *p[4];
    int64_t sr[4];
    UNROLL for (int i = 0; i < NR; i++) {
        p[i] = (const uint8_t *)w->data + (r + i) * K;
        sr[i] = w->scale ? (r + i) / w->brow : 0;
    }
    const int64_t bc = w->scale ? w->bcol : K;
    __m512 a[4];
    UNROLL for (int i = 0; i < NR; i++) a[i] = _mm512_setzero_ps();
    for (int64_t c0 = 0, cb = 0; c0 < K; c0 += bc, cb++) {
        int64_t c1 = c0 + bc < K ? c0 + bc : K;
        __m512 b0[4], b1[4];
        UNROLL for (int i = 0; i < NR; i++) b0[i] = b1[i] = _mm512_setzero_ps();
        int64_t k = c0;
        for (; k + 32 <= c1; k += 32) {
            __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
            UNROLL for (int i = 0; i < NR; i++) {
                b0[i] = _mm512_fmadd_ps(f8_raw16(_mm_loadu_si128((const __m128i *)(p[i] + k))), x0, b0[i]);
                b1[i] = _mm512_fmadd_ps(f8_raw16(_mm_loadu_si128((const __m128i *)(p[i] + k + 16))), x1, b1[i]);
            }
        }
        for (; k < c1; k += 16) {
            __mmask16 m = tail_mask(c1 - k);
            __m512 x0 = _mm512_maskz_loadu_ps(m, x + k);
            UNROLL for (int i = 0; i < NR; i++) b0[i] = _mm512_fmadd_ps(f8_raw16(_mm_maskz_loadu_epi8(m, p[i] + k)), x0, b0[i]);
        }
        UNROLL for (int i = 0; i < NR; i++)
            a[i] = _mm512_fmadd_ps(_mm512_add_ps(b0[i], b1[i]), _mm512_set1_ps(mm_scale_at(w, sr[i], cb) * 0x1p-56f), a[i]);
    }
    UNROLL for (int i = 0; i < NR; i++) out[i] = _mm512_reduce_add_ps(a[i]);
}

T512 static void f8_gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    float o[4];
    int64_t r = r0;
    for (; r + 4 <= r1 && w->cols > GEMV_ONE_ROW_MAX_K; r += 4) {
        f8_rows(w, r, x, o, 4);
        for (int i = 0; i < 4; i++) y[r + i] = acc ? y[r + i] + o[i] : o[i];
    }
    for (; r < r1; r++) {
        f8_rows(w, r, x, o, 1);
        y[r] = acc ? y[r] + o[0] : o[0];
    }
}

/* MXFP4: 16 bytes = 32 values; low nibbles are the even columns, high nibbles
 * the odd ones. x is split into even/odd lanes once per group of rows. */
/* 16 E8M0 scale bytes (fewer when m says so) -> F32 2^(e-127); 0 -> 2^-127, 0xff -> NaN, as the reference. */
INL __m512 e8m0_16(const uint8_t *s, __mmask16 m) {
    __m512i e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, s));
    __m512i u = _mm512_slli_epi32(e, 23);
    u = _mm512_mask_mov_epi32(u, _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()), _mm512_set1_epi32(0x00400000));
    u = _mm512_mask_mov_epi32(u, _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(0xff)), _mm512_set1_epi32(0x7fc00000));
    return _mm512_castsi512_ps(u);
}

#define F4_PF 3072 /* bytes of prefetch distance per weight stream (f4_gemv) */

/* x rewritten once per call (f4_x_prep): per 32 columns, the 16 even ones, then the 16
 * odd ones: the lanes the kernel used to make with two permutes per 32, so the sums are the same
 * operations on the same values; a row then reads x from L1 with plain loads. */
static int64_t f4_x_need(const ms_qmat *w) { return w->dtype == MS_DT_F4 ? w->cols : 0; }
T512 static void f4_x_prep(const ms_qmat *w, const float *x, float *xs) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int64_t k = 0; k + 32 <= w->cols; k += 32) {
        __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
        _mm512_storeu_ps(xs + k, _mm512_permutex2var_ps(x0, ie, x1));
        _mm512_storeu_ps(xs + k + 16, _mm512_permutex2var_ps(x0, io, x1));
    }
}

/* MXFP4 rows r..r+NR-1 against the rewritten x: lo/hi nibbles through a 16-entry
 * permute, b = hi * xo + lo * xe per lane, then a += b * scale per 32 columns. */
INL void f4_rows_p(const ms_qmat *w, int64_t r, const float *xp, float *out, const int NR) {
    const int64_t K = w->cols;
    const __m512 tab = fp4_table();
    const uint8_t *p[4], *s[4];
    const int64_t nsc = K / 32;
    float sb[4][16] __attribute__((aligned(64)));
    UNROLL for (int i = 0; i < NR; i++) {
        p[i] = (const uint8_t *)w->data + (r + i) * (K / 2);
        s[i] = w->scale ? (const uint8_t *)w->scale + ((r + i) / w->brow) * nsc : NULL;
        if (!s[i]) _mm512_store_ps(sb[i], _mm512_set1_ps(1.0f));
    }
    __m512 a[4];
    UNROLL for (int i = 0; i < NR; i++) a[i] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < nsc; g0 += 16) {
        int ng = nsc - g0 < 16 ? (int)(nsc - g0) : 16;
        UNROLL for (int i = 0; i < NR; i++)
            if (s[i]) _mm512_store_ps(sb[i], e8m0_16(s[i] + g0, tail_mask(ng)));
        for (int j = 0; j < ng; j++) {
            int64_t k = (g0 + j) * 32;
            __m512 xe = _mm512_loadu_ps(xp + k), xo = _mm512_loadu_ps(xp + k + 16);
            if ((j & 3) == 0) UNROLL for (int i = 0; i < NR; i++) _mm_prefetch((const char *)(p[i] + k / 2 + F4_PF), _MM_HINT_T0);
            UNROLL for (int i = 0; i < NR; i++) {
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p[i] + k / 2)));
                __m512 lo = _mm512_permutexvar_ps(v, tab), hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab);
                __m512 b = _mm512_fmadd_ps(hi, xo, _mm512_mul_ps(lo, xe));
                a[i] = _mm512_fmadd_ps(b, _mm512_set1_ps(sb[i][j]), a[i]);
            }
        }
    }
    UNROLL for (int i = 0; i < NR; i++) out[i] = _mm512_reduce_add_ps(a[i]);
}

/* x is the rewritten x (f4_x_prep). 4 rows at a time (one accumulator per row: 4 chains
 * hide the FMA latency; the sum of a row is the same whatever the grouping), each
 * stream prefetched F4_PF bytes ahead, a line per 64 bytes: the hardware prefetcher
 * alone left 4 interleaved streams at ~5.7 GB/s from DRAM, with it ~10.7 (kernel
 * 14.7 GB/s from cache; one Zen 4 core, min of 2000 calls). */
#define F4_NR 4
T512 static void f4_gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    float o[4];
    int64_t r = r0;
    for (; r + F4_NR <= r1; r += F4_NR) {
        f4_rows_p(w, r, x, o, F4_NR);
        for (int i = 0; i < F4_NR; i++) y[r + i] = acc ? y[r + i] + o[i] : o[i];
    }
    for (; r < r1; r++) {
        f4_rows_p(w, r, x, o, 1);
        y[r] = acc ? y[r] + o[0] : o[0];
    }
}

/* Q8 (core/qmat.h): int8 values, one BF16 scale per 32 along a row. Each
 * block's partial dot (two 16-lane products) is scaled into the row sum. */
static int q8_fast(const ms_qmat *w) {
    return w->cols % 32 == 0 && w->scale && w->brow == 1 && w->bcol == 32 && w->scale_dtype == MS_DT_BF16;
}
INL __m512 ld_q8(const int8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }

INL void q8_rows(const ms_qmat *w, int64_t r, const float *x, float *out, const int NR) {
    const int64_t K = w->cols, nb = K / 32;
    const int8_t *p[4];
    const uint16_t *s[4];
    UNROLL for (int i = 0; i < NR; i++) {
        p[i] = (const int8_t *)w->data + (r + i) * K;
        s[i] = (const uint16_t *)w->scale + (r + i) * nb;
    }
    __m512 a[4];
    UNROLL for (int i = 0; i < NR; i++) a[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t k = b * 32;
        __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
        UNROLL for (int i = 0; i < NR; i++) {
            __m512 t = _mm512_fmadd_ps(ld_q8(p[i] + k + 16), x1, _mm512_mul_ps(ld_q8(p[i] + k), x0));
            a[i] = _mm512_fmadd_ps(t, _mm512_set1_ps(ms_bf16_to_f32(s[i][b])), a[i]);
        }
    }
    UNROLL for (int i = 0; i < NR; i++) out[i] = _mm512_reduce_add_ps(a[i]);
}

T512 static void q8_gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    float o[4];
    int64_t r = r0;
    for (; r + 4 <= r1 && w->cols > GEMV_ONE_ROW_MAX_K; r += 4) {
        q8_rows(w, r, x, o, 4);
        for (int i = 0; i < 4; i++) y[r + i] = acc ? y[r + i] + o[i] : o[i];
    }
    for (; r < r1; r++) {
        q8_rows(w, r, x, o, 1);
        y[r] = acc ? y[r] + o[0] : o[0];
    }
}

/* I4 (core/qmat.h, compressed-tensors pack-quantized): 16 bytes = 32 values, low
 * nibble = even column, value (u - uz) * scale (uz 8, or the zero point), one BF16 scale per bcol (a multiple
 * of 32) along a row. Even/odd columns against x split once per 32, as F4. */
static int i4_fast(const ms_qmat *w) {
    return w->cols % 32 == 0 && w->scale && w->brow == 1 && w->bcol >= 32 && w->bcol % 32 == 0 && w->cols % w->bcol == 0 &&
           w->scale_dtype == MS_DT_BF16;
}
/* (u - uz) as floats; uz the group's unsigned zero point (8: symmetric) */
INL __m512 i4_val(__m512i u, __m512i uz) { return _mm512_cvtepi32_ps(_mm512_sub_epi32(u, uz)); }

INL void i4_rows(const ms_qmat *w, int64_t r, const float *x, float *out, const int NR) {
    const int64_t K = w->cols, ng = K / w->bcol, gb = w->bcol / 32;
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i m15 = _mm512_set1_epi32(15);
    const uint8_t *p[4];
    const uint16_t *s[4];
    UNROLL for (int i = 0; i < NR; i++) {
        p[i] = (const uint8_t *)w->data + (r + i) * (K / 2);
        s[i] = (const uint16_t *)w->scale + (r + i) * ng;
    }
    __m512 a[4];
    UNROLL for (int i = 0; i < NR; i++) a[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m512 b[4];
        __m512i z[4];
        UNROLL for (int i = 0; i < NR; i++) b[i] = _mm512_setzero_ps(), z[i] = _mm512_set1_epi32(ms_i4_zero(w, r + i, g));
        for (int64_t k = g * w->bcol, ke = k + gb * 32; k < ke; k += 32) {
            __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
            __m512 xe = _mm512_permutex2var_ps(x0, ie, x1), xo = _mm512_permutex2var_ps(x0, io, x1);
            UNROLL for (int i = 0; i < NR; i++) {
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p[i] + k / 2)));
                __m512 t = _mm512_mul_ps(i4_val(_mm512_and_si512(v, m15), z[i]), xe);
                b[i] = _mm512_add_ps(b[i], _mm512_fmadd_ps(i4_val(_mm512_srli_epi32(v, 4), z[i]), xo, t));
            }
        }
        UNROLL for (int i = 0; i < NR; i++) a[i] = _mm512_fmadd_ps(b[i], _mm512_set1_ps(ms_bf16_to_f32(s[i][g])), a[i]);
    }
    UNROLL for (int i = 0; i < NR; i++) out[i] = _mm512_reduce_add_ps(a[i]);
}

T512 static void i4_gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    float o[4];
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        i4_rows(w, r, x, o, 4);
        for (int i = 0; i < 4; i++) y[r + i] = acc ? y[r + i] + o[i] : o[i];
    }
    for (; r < r1; r++) {
        i4_rows(w, r, x, o, 1);
        y[r] = acc ? y[r] + o[0] : o[0];
    }
}

static int f4_fast(const ms_qmat *w) {
    return w->cols % 32 == 0 &&
           (!w->scale || (w->bcol == 32 && w->brow >= 1 && (w->scale_dtype == MS_DT_F8_E8M0 || w->scale_dtype == MS_DT_U8)));
}
static int f8_fast(const ms_qmat *w) {
    return !w->scale || (w->brow >= 1 && w->bcol >= 1 &&
                         (w->scale_dtype == MS_DT_F32 || w->scale_dtype == MS_DT_BF16 || w->scale_dtype == MS_DT_F16));
}

static int gemv_ok(const ms_qmat *w) {
    switch (w->dtype) {
    case MS_DT_F32:
    case MS_DT_BF16:
    case MS_DT_F16: return 1;
    case MS_DT_F8_E4M3: return f8_fast(w);
    case MS_DT_F4: return f4_fast(w);
    case MS_DT_Q8: return q8_fast(w);
    case MS_DT_I4: return i4_fast(w);
    default: return 0;
    }
}

T512 static void gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    switch (w->dtype) {
    case MS_DT_F32: f32_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_BF16: bfe_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_F16: f16_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_F8_E4M3: f8_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_F4: f4_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_Q8: q8_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_I4: i4_gemv(w, x, y, r0, r1, acc); break;
    default: break;
    }
}

/* ---- prefill: tile dequantization ---- */

T512 static void dequant(const ms_qmat *w, int64_t r0, int nr, int64_t c0, int kc, float *buf, int ld) {
    const int64_t K = w->cols;
    switch (w->dtype) {
    case MS_DT_F32:
    case MS_DT_BF16:
    case MS_DT_F16:
        for (int i = 0; i < nr; i++) {
            float *o = buf + (int64_t)i * ld;
            for (int k = 0; k < kc; k += 16) {
                __mmask16 m = tail_mask(kc - k);
                int64_t off = (r0 + i) * K + c0 + k;
                __m512 v = w->dtype == MS_DT_F32    ? ld_f32_m((const float *)w->data + off, m)
                           : w->dtype == MS_DT_BF16 ? ld_bf16_m((const uint16_t *)w->data + off, m)
                                                    : ld_f16_m((const uint16_t *)w->data + off, m);
                _mm512_mask_storeu_ps(o + k, m, v);
            }
        }
        return;
    case MS_DT_F8_E4M3:
        if (!f8_fast(w)) break;
        for (int i = 0; i < nr; i++) {
            float *o = buf + (int64_t)i * ld;
            const uint8_t *p = (const uint8_t *)w->data + (r0 + i) * K;
            int64_t sr = w->scale ? (r0 + i) / w->brow : 0, bc = w->scale ? w->bcol : K;
            for (int64_t c = c0; c < c0 + kc;) {
                int64_t cb = c / bc, ce = (cb + 1) * bc;
                if (ce > c0 + kc) ce = c0 + kc;
                __m512 sv = _mm512_set1_ps(mm_scale_at(w, sr, cb) * 256.0f);
                for (; c < ce; c += 16) {
                    __mmask16 m = tail_mask(ce - c);
                    _mm512_mask_storeu_ps(o + (c - c0), m, _mm512_mul_ps(ld_f8_m(p + c, m), sv));
                }
            }
        }
        return;
    case MS_DT_Q8:
        if (!q8_fast(w) || c0 % 32 || kc % 32) break;
        for (int i = 0; i < nr; i++) {
            float *o = buf + (int64_t)i * ld;
            const int8_t *p = (const int8_t *)w->data + (r0 + i) * K;
            const uint16_t *sc = (const uint16_t *)w->scale + (r0 + i) * (K / 32);
            for (int k = 0; k < kc; k += 32) {
                int64_t c = c0 + k;
                __m512 sv = _mm512_set1_ps(ms_bf16_to_f32(sc[c / 32]));
                _mm512_storeu_ps(o + k, _mm512_mul_ps(ld_q8(p + c), sv));
                _mm512_storeu_ps(o + k + 16, _mm512_mul_ps(ld_q8(p + c + 16), sv));
            }
        }
        return;
    case MS_DT_I4: {
        if (!i4_fast(w) || c0 % 32 || kc % 32) break;
        const __m512i i0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const __m512i i1 = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        for (int i = 0; i < nr; i++) {
            float *o = buf + (int64_t)i * ld;
            const uint8_t *p = (const uint8_t *)w->data + (r0 + i) * (K / 2);
            const uint16_t *sc = (const uint16_t *)w->scale + (r0 + i) * (K / w->bcol);
            for (int k = 0; k < kc; k += 32) {
                int64_t c = c0 + k;
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + c / 2)));
                __m512i zv = _mm512_set1_epi32(ms_i4_zero(w, r0 + i, c / w->bcol));
                __m512 lo = i4_val(_mm512_and_si512(v, _mm512_set1_epi32(15)), zv), hi = i4_val(_mm512_srli_epi32(v, 4), zv);
                __m512 sv = _mm512_set1_ps(ms_bf16_to_f32(sc[c / w->bcol]));
                _mm512_storeu_ps(o + k, _mm512_mul_ps(_mm512_permutex2var_ps(lo, i0, hi), sv));
                _mm512_storeu_ps(o + k + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo, i1, hi), sv));
            }
        }
        return;
    }
    case MS_DT_F4: {
        if (!f4_fast(w) || c0 % 32 || kc % 32) break;
        const __m512 tab = fp4_table();
        const __m512i i0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const __m512i i1 = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        for (int i = 0; i < nr; i++) {
            float *o = buf + (int64_t)i * ld;
            const uint8_t *p = (const uint8_t *)w->data + (r0 + i) * (K / 2);
            for (int k = 0; k < kc; k += 32) {
                int64_t c = c0 + k;
                __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + c / 2)));
                __m512 lo = _mm512_permutexvar_ps(v, tab), hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab);
                __m512 sv = _mm512_set1_ps(mm_scale_at(w, (r0 + i) / (w->scale ? w->brow : 1), c / 32));
                _mm512_storeu_ps(o + k, _mm512_mul_ps(_mm512_permutex2var_ps(lo, i0, hi), sv));
                _mm512_storeu_ps(o + k + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo, i1, hi), sv));
            }
        }
        return;
    }
    default: break;
    }
    mm_dequant_scalar(w, r0, nr, c0, kc, buf, ld);
}

/* ---- prefill: F32 tile x tokens, 4 tokens x 4 rows of accumulators ---- */

INL void micro(const float *buf, int ld, const float *x, int64_t ldx, int kc, float *y, int64_t ldy, int acc,
               const int NT, const int NR) {
    __m512 c[4][4];
    UNROLL for (int t = 0; t < NT; t++)
        UNROLL for (int r = 0; r < NR; r++) c[t][r] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= kc; k += 16) {
        __m512 xv[4];
        UNROLL for (int t = 0; t < NT; t++) xv[t] = _mm512_loadu_ps(x + t * ldx + k);
        UNROLL for (int r = 0; r < NR; r++) {
            __m512 wv = _mm512_loadu_ps(buf + r * ld + k);
            UNROLL for (int t = 0; t < NT; t++) c[t][r] = _mm512_fmadd_ps(wv, xv[t], c[t][r]);
        }
    }
    if (k < kc) {
        __mmask16 m = tail_mask(kc - k);
        __m512 xv[4];
        UNROLL for (int t = 0; t < NT; t++) xv[t] = _mm512_maskz_loadu_ps(m, x + t * ldx + k);
        UNROLL for (int r = 0; r < NR; r++) {
            __m512 wv = _mm512_maskz_loadu_ps(m, buf + r * ld + k);
            UNROLL for (int t = 0; t < NT; t++) c[t][r] = _mm512_fmadd_ps(wv, xv[t], c[t][r]);
        }
    }
    UNROLL for (int t = 0; t < NT; t++)
        UNROLL for (int r = 0; r < NR; r++) {
            float s = _mm512_reduce_add_ps(c[t][r]);
            float *yo = y + t * ldy + r;
            *yo = acc ? *yo + s : s;
        }
}

T512 static void tile(const float *buf, int ld, int nr, const float *x, int64_t ldx, int nt, int kc, float *y,
                      int64_t ldy, int acc) {
    for (int t = 0; t < nt; t += 4) {
        int mt = nt - t < 4 ? nt - t : 4;
        for (int r = 0; r < nr; r += 4) {
            int mr = nr - r < 4 ? nr - r : 4;
            const float *b = buf + (int64_t)r * ld, *xt = x + t * ldx;
            float *yt = y + t * ldy + r;
#define MICRO(A, B) micro(b, ld, xt, ldx, kc, yt, ldy, acc, A, B)
            switch (mt * 4 + mr) {
            case 4 * 4 + 4: MICRO(4, 4); break;
            case 4 * 4 + 3: MICRO(4, 3); break;
            case 4 * 4 + 2: MICRO(4, 2); break;
            case 4 * 4 + 1: MICRO(4, 1); break;
            case 3 * 4 + 4: MICRO(3, 4); break;
            case 3 * 4 + 3: MICRO(3, 3); break;
            case 3 * 4 + 2: MICRO(3, 2); break;
            case 3 * 4 + 1: MICRO(3, 1); break;
            case 2 * 4 + 4: MICRO(2, 4); break;
            case 2 * 4 + 3: MICRO(2, 3); break;
            case 2 * 4 + 2: MICRO(2, 2); break;
            case 2 * 4 + 1: MICRO(2, 1); break;
            case 1 * 4 + 4: MICRO(1, 4); break;
            case 1 * 4 + 3: MICRO(1, 3); break;
            case 1 * 4 + 2: MICRO(1, 2); break;
            default: MICRO(1, 1); break;
            }
#undef MICRO
        }
    }
}

/* ---- BF16 dot products (AVX512_BF16, the MS_ACT_BF16 activations) ---- */

/* BF16 weights against x rounded to BF16 (round to nearest even, once per call into
 * scratch: bf_x_prep), vdpbf16ps: each F32 lane gets the exact products of a column
 * pair added in (DAZ/FTZ, as the instruction does). Results differ from the F32
 * kernels by the rounding of x (|x - bf16(x)| <= 2^-9 |x|) and the summation order.
 * Other dtypes take the avx512 kernels unchanged. */
#define TBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")))
#define INLBF static inline __attribute__((always_inline)) TBF

static int64_t bf_x_need(const ms_qmat *w) {
    if (w->dtype == MS_DT_BF16) return (w->cols + 31) / 32 * 16; /* 2 BF16 per float, padded to 32 */
    return f4_x_need(w);
}
/* x (cols floats) -> BF16 in xs, zeros up to a multiple of 32; F4 as the avx512 table. */
TBF static void bf_x_prep(const ms_qmat *w, const float *x, float *xs) {
    if (w->dtype != MS_DT_BF16) {
        f4_x_prep(w, x, xs);
        return;
    }
    const int64_t K = w->cols;
    uint16_t *xb = (uint16_t *)xs;
    for (int64_t k = 0; k < K; k += 32) {
        __m512 x0 = _mm512_maskz_loadu_ps(tail_mask(K - k), x + k);
        __m512 x1 = K - k > 16 ? _mm512_maskz_loadu_ps(tail_mask(K - k - 16), x + k + 16) : _mm512_setzero_ps();
        _mm512_storeu_si512(xb + k, (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
    }
}

INLBF __m512bh ld_bh(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); }

/* NR rows of BF16 weights (row stride K) against xb, 64 columns a step. */
INLBF void bfd_rows(const uint16_t *w, int64_t K, const uint16_t *xb, float *out, const int NR) {
    __m512 a0[8], a1[8];
    UNROLL8 for (int i = 0; i < NR; i++) a0[i] = a1[i] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        __m512bh x0 = ld_bh(xb + k), x1 = ld_bh(xb + k + 32);
        UNROLL8 for (int i = 0; i < NR; i++) {
            a0[i] = _mm512_dpbf16_ps(a0[i], ld_bh(w + i * K + k), x0);
            a1[i] = _mm512_dpbf16_ps(a1[i], ld_bh(w + i * K + k + 32), x1);
        }
    }
    for (; k < K; k += 32) {
        __mmask32 m = K - k >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << (K - k)) - 1);
        __m512bh x0 = ld_bh(xb + k); /* zeros past K */
        UNROLL8 for (int i = 0; i < NR; i++)
            a0[i] = _mm512_dpbf16_ps(a0[i], (__m512bh)_mm512_maskz_loadu_epi16(m, w + i * K + k), x0);
    }
    UNROLL8 for (int i = 0; i < NR; i++) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(a0[i], a1[i]));
}

/* mm_kernels.gemv for a BF16 w against x = bf_x_prep's BF16 scratch: rows [r0, r1). */
TBF static void bfd_gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    const int64_t K = w->cols;
    const uint16_t *base = (const uint16_t *)w->data, *xb = (const uint16_t *)x;
    float o[8];
    int64_t r = r0;
    if (K > 2 * GEMV_ONE_ROW_MAX_K) /* x is half the bytes: one row at a time up to twice the K */
        for (; r + 8 <= r1; r += 8) {
            bfd_rows(base + r * K, K, xb, o, 8);
            for (int i = 0; i < 8; i++) y[r + i] = acc ? y[r + i] + o[i] : o[i];
        }
    for (; r < r1; r++) {
        bfd_rows(base + r * K, K, xb, o, 1);
        y[r] = acc ? y[r] + o[0] : o[0];
    }
}

/* ms_kernels_avx512bf16.gemv: BF16 on vdpbf16ps, every other dtype the avx512 gemv. */
T512 static void gemv_bf(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    if (w->dtype == MS_DT_BF16) bfd_gemv(w, x, y, r0, r1, acc);
    else gemv(w, x, y, r0, r1, acc);
}

const mm_kernels ms_kernels_avx512bf16 = {
    .gemv_ok = gemv_ok,
    .gemv = gemv_bf,
    .dequant = dequant,
    .tile = tile,
    .x_need = bf_x_need,
    .x_prep = bf_x_prep,
    .dot = ms_k512_dot,
    .axpy = ms_k512_axpy,
    .rmsnorm = ms_k512_rmsnorm,
    .softmax = ms_k512_softmax,
    .swiglu = ms_k512_swiglu,
};

const mm_kernels ms_kernels_avx512 = {
    .gemv_ok = gemv_ok,
    .gemv = gemv,
    .dequant = dequant,
    .tile = tile,
    .x_need = bfe_x_need,
    .x_prep = bfe_x_prep,
    .dot = ms_k512_dot,
    .axpy = ms_k512_axpy,
    .rmsnorm = ms_k512_rmsnorm,
    .softmax = ms_k512_softmax,
    .swiglu = ms_k512_swiglu,
};
#endif
