/* kernels_avx2.c — AVX2 + FMA + F16C matmul kernels (8 lanes). Every function
 * carries a target attribute; the dispatcher only calls them after CPUID says
 * the CPU has these features (isa.c). Column tails are done in scalar code. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "backend/cpu/kernels.h"

#define T256 __attribute__((target("avx2,fma,f16c")))
#define UNROLL _Pragma("GCC unroll 4")
#define INL static inline __attribute__((always_inline)) T256

INL float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INL __m256 ld_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
INL __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
INL __m256 ld_f32(const float *p) { return _mm256_loadu_ps(p); }
INL float sc_bf16(const uint16_t *p) { return ms_bf16_to_f32(*p); }
INL float sc_f16(const uint16_t *p) { return ms_f16_to_f32(*p); }
INL float sc_f32(const float *p) { return *p; }

/* FP8 e4m3 -> F16 pattern (value * 2^-8, exact) for 16 bytes; see kernels_avx512.c. */
INL __m256i f8_to_h16_16(const uint8_t *p) {
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)), 7);
    return _mm256_and_si256(h, _mm256_set1_epi16((short)0xbf80));
}

INL __m256 fp4_mag(void) { return _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f); }
INL float e8m0(uint8_t e) {
    uint32_t u = e == 0xff ? 0x7fc00000u : e == 0 ? 0x00400000u : (uint32_t)e << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- decode (n == 1) ---- */

#define GEMV_PLAIN(NAME, T, LD, SC)                                                                          \
    INL void NAME##_rows(const T *w, int64_t K, const float *x, float *out, const int NR) {               \
        __m256 a0[4], a1[4];                                                                              \
        UNROLL for (int i = 0; i < NR; i++) a0[i] = a1[i] = _mm256_setzero_ps();                                 \
        int64_t k = 0;                                                                                    \
        for (; k + 16 <= K; k += 16) {                                                                    \
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);                          \
            UNROLL for (int i = 0; i < NR; i++) {                                                                \
                a0[i] = _mm256_fmadd_ps(LD(w + i * K + k), x0, a0[i]);                                    \
                a1[i] = _mm256_fmadd_ps(LD(w + i * K + k + 8), x1, a1[i]);                                \
            }                                                                                             \
        }                                                                                                 \
        UNROLL for (int i = 0; i < NR; i++) {                                                                    \
            float s = hsum(_mm256_add_ps(a0[i], a1[i]));                                                  \
            for (int64_t c = k; c < K; c++) s += SC(w + i * K + c) * x[c];                                \
            out[i] = s;                                                                                   \
        }                                                                                                 \
    }                                                                                                     \
    T256 static void NAME##_gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) { \
        const int64_t K = w->cols;                                                                        \
        const T *base = (const T *)w->data;                                                               \
        float o[4];                                                                                       \
        int64_t r = r0;                                                                                   \
        /* short rows: one at a time keeps one linear stream (see kernels_avx512.c) */                 \
        for (; r + 4 <= r1 && K > 4096; r += 4) {                                                         \
            NAME##_rows(base + r * K, K, x, o, 4);                                                        \
            for (int i = 0; i < 4; i++) y[r + i] = acc ? y[r + i] + o[i] : o[i];                          \
        }                                                                                                 \
        for (; r < r1; r++) {                                                                             \
            NAME##_rows(base + r * K, K, x, o, 1);                                                        \
            y[r] = acc ? y[r] + o[0] : o[0];                                                              \
        }                                                                                                 \
    }

GEMV_PLAIN(bf16, uint16_t, ld_bf16, sc_bf16)
GEMV_PLAIN(f16, uint16_t, ld_f16, sc_f16)
GEMV_PLAIN(f32, float, ld_f32, sc_f32)

INL void f8_rows(const ms_qmat *w, int64_t r, const float *x, float *out, const int NR) {
    const int64_t K = w->cols;
    const uint8_t *p[4];
    int64_t sr[4];
    float tail[4];
    UNROLL for (int i = 0; i < NR; i++) {
        p[i] = (const uint8_t *)w->data + (r + i) * K;
        sr[i] = w->scale ? (r + i) / w->brow : 0;
    }
    const int64_t bc = w->scale ? w->bcol : K;
    __m256 a[4];
    UNROLL for (int i = 0; i < NR; i++) a[i] = _mm256_setzero_ps(), tail[i] = 0;
    for (int64_t c0 = 0, cb = 0; c0 < K; c0 += bc, cb++) {
        int64_t c1 = c0 + bc < K ? c0 + bc : K;
        __m256 b0[4], b1[4];
        UNROLL for (int i = 0; i < NR; i++) b0[i] = b1[i] = _mm256_setzero_ps();
        int64_t k = c0;
        for (; k + 16 <= c1; k += 16) {
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
            UNROLL for (int i = 0; i < NR; i++) {
                __m256i h = f8_to_h16_16(p[i] + k);
                b0[i] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), x0, b0[i]);
                b1[i] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), x1, b1[i]);
            }
        }
        UNROLL for (int i = 0; i < NR; i++) {
            float s = mm_scale_at(w, sr[i], cb);
            /* x is pre-scaled by MM_F8_XSCALE = 2^64; the F16 patterns are value * 2^-8 */
            a[i] = _mm256_fmadd_ps(_mm256_add_ps(b0[i], b1[i]), _mm256_set1_ps(s * 0x1p-56f), a[i]);
            float t = 0;
            for (int64_t c = k; c < c1; c++) t += ms_fp8_e4m3_to_f32(p[i][c]) * x[c];
            tail[i] += t * (s * 0x1p-64f);
        }
    }
    UNROLL for (int i = 0; i < NR; i++) out[i] = hsum(a[i]) + tail[i];
}

T256 static void f8_gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    float o[4];
    int64_t r = r0;
    for (; r + 4 <= r1 && w->cols > 4096; r += 4) {
        f8_rows(w, r, x, o, 4);
        for (int i = 0; i < 4; i++) y[r + i] = acc ? y[r + i] + o[i] : o[i];
    }
    for (; r < r1; r++) {
        f8_rows(w, r, x, o, 1);
        y[r] = acc ? y[r] + o[0] : o[0];
    }
}

/* even/odd lanes of 16 consecutive floats */
INL void deinterleave(const float *x, __m256 *xe, __m256 *xo) {
    __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
    *xe = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0x88)), 0xD8));
    *xo = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0xDD)), 0xD8));
}

/* x rewritten once per call (f4_x_prep): per 32 columns the lanes deinterleave() makes
 * of its two halves, xe0 xo0 xe1 xo1 (8 floats each), so a row reads them with plain loads
 * and computes the same sums. */
static int64_t f4_x_need(const ms_qmat *w) { return w->dtype == MS_DT_F4 ? w->cols : 0; }
T256 static void f4_x_prep(const ms_qmat *w, const float *x, float *xs) {
    for (int64_t k = 0; k + 32 <= w->cols; k += 32) {
        __m256 e0, o0, e1, o1;
        deinterleave(x + k, &e0, &o0);
        deinterleave(x + k + 16, &e1, &o1);
        _mm256_storeu_ps(xs + k, e0), _mm256_storeu_ps(xs + k + 8, o0);
        _mm256_storeu_ps(xs + k + 16, e1), _mm256_storeu_ps(xs + k + 24, o1);
    }
}

#define F4_PF 3072 /* prefetch distance per weight stream, bytes (a line per 64) */

/* e2m1 decode with one permute and two integer ops per 8 values: the table holds
 * mag[j] ^ (j << 28) (j = 0..7, the bit pattern of a float; never used as one before the xor),
 * so permute(table, u) ^ (u << 28) for a lane u whose bits 0-3 are the nibble is mag[u & 7]
 * with bit 31 = bit 3 of u: the bits 28-30 the shift brings cancel the table's, and the
 * bits of u above 3 leave through the shift (so the low nibble of a byte needs no mask).
 * Bit for bit the values of the and/shift/or decode it replaced (-0 for nibble 8 included). */
INL __m256i fp4_xtab(void) {
    const __m256i mag = _mm256_castps_si256(fp4_mag());
    return _mm256_xor_si256(mag, _mm256_slli_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), 28));
}
INL __m256 fp4_xval(__m256i u, __m256i xtab) {
    return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_permutevar8x32_epi32(xtab, u), _mm256_slli_epi32(u, 28)));
}
/* 8 E8M0 scales -> floats (e8m0() of each) */
INL __m256 e8m0_8(const uint8_t *s) {
    __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s));
    __m256i u = _mm256_slli_epi32(e, 23);
    u = _mm256_blendv_epi8(u, _mm256_set1_epi32(0x00400000), _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
    u = _mm256_blendv_epi8(u, _mm256_set1_epi32(0x7fc00000), _mm256_cmpeq_epi32(e, _mm256_set1_epi32(0xff)));
    return _mm256_castsi256_ps(u);
}

/* MXFP4 rows r..r+NR-1 against the rewritten x (f4_x_prep). Per 32 columns
 * b = lo0 * xe0 + hi0 * xo0 + lo1 * xe1 + hi1 * xo1 (in that order), then a += b * scale
 * (scale 1 without scales: the same sum as a + b); the scales of 8 blocks are decoded at once. */
INL void f4_rows(const ms_qmat *w, int64_t r, const float *xp, float *out, const int NR) {
    const int64_t K = w->cols;
    const __m256i xtab = fp4_xtab();
    const uint8_t *p[4], *s[4];
    const int64_t nsc = K / 32;
    float sb[4][8] __attribute__((aligned(32)));
    UNROLL for (int i = 0; i < NR; i++) {
        p[i] = (const uint8_t *)w->data + (r + i) * (K / 2);
        s[i] = w->scale ? (const uint8_t *)w->scale + ((r + i) / w->brow) * nsc : NULL;
        if (!s[i]) _mm256_store_ps(sb[i], _mm256_set1_ps(1.0f));
    }
    __m256 a[4];
    UNROLL for (int i = 0; i < NR; i++) a[i] = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < nsc; g0 += 8) {
        const int ng = nsc - g0 < 8 ? (int)(nsc - g0) : 8;
        UNROLL for (int i = 0; i < NR; i++) {
            if (!s[i]) continue;
            if (ng == 8) _mm256_store_ps(sb[i], e8m0_8(s[i] + g0));
            else
                for (int j = 0; j < ng; j++) sb[i][j] = e8m0(s[i][g0 + j]);
        }
        for (int j = 0; j < ng; j++) {
            const int64_t k = (g0 + j) * 32;
            __m256 xe0 = _mm256_loadu_ps(xp + k), xo0 = _mm256_loadu_ps(xp + k + 8);
            __m256 xe1 = _mm256_loadu_ps(xp + k + 16), xo1 = _mm256_loadu_ps(xp + k + 24);
            if ((j & 3) == 0) UNROLL for (int i = 0; i < NR; i++) _mm_prefetch((const char *)(p[i] + k / 2 + F4_PF), _MM_HINT_T0);
            UNROLL for (int i = 0; i < NR; i++) {
                __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p[i] + k / 2)));
                __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p[i] + k / 2 + 8)));
                __m256 b = _mm256_mul_ps(fp4_xval(v0, xtab), xe0);
                b = _mm256_fmadd_ps(fp4_xval(_mm256_srli_epi32(v0, 4), xtab), xo0, b);
                b = _mm256_fmadd_ps(fp4_xval(v1, xtab), xe1, b);
                b = _mm256_fmadd_ps(fp4_xval(_mm256_srli_epi32(v1, 4), xtab), xo1, b);
                a[i] = _mm256_fmadd_ps(b, _mm256_broadcast_ss(&sb[i][j]), a[i]);
            }
        }
    }
    UNROLL for (int i = 0; i < NR; i++) out[i] = hsum(a[i]);
}

/* x: the rewritten x. 4 rows per pass, one accumulator each (the grouping does not change a row's sum). */
T256 static void f4_gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    float o[4];
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        f4_rows(w, r, x, o, 4);
        for (int i = 0; i < 4; i++) y[r + i] = acc ? y[r + i] + o[i] : o[i];
    }
    for (; r < r1; r++) {
        f4_rows(w, r, x, o, 1);
        y[r] = acc ? y[r] + o[0] : o[0];
    }
}

/* Q8 (core/qmat.h): int8 values, one BF16 scale per 32 along a row. */
static int q8_fast(const ms_qmat *w) {
    return w->cols % 32 == 0 && w->scale && w->brow == 1 && w->bcol == 32 && w->scale_dtype == MS_DT_BF16;
}
INL __m256 ld_q8(const int8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }

INL void q8_rows(const ms_qmat *w, int64_t r, const float *x, float *out, const int NR) {
    const int64_t K = w->cols, nb = K / 32;
    const int8_t *p[4];
    const uint16_t *s[4];
    UNROLL for (int i = 0; i < NR; i++) {
        p[i] = (const int8_t *)w->data + (r + i) * K;
        s[i] = (const uint16_t *)w->scale + (r + i) * nb;
    }
    __m256 a[4];
    UNROLL for (int i = 0; i < NR; i++) a[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t k = b * 32;
        __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
        __m256 x2 = _mm256_loadu_ps(x + k + 16), x3 = _mm256_loadu_ps(x + k + 24);
        UNROLL for (int i = 0; i < NR; i++) {
            __m256 t = _mm256_mul_ps(ld_q8(p[i] + k), x0);
            t = _mm256_fmadd_ps(ld_q8(p[i] + k + 8), x1, t);
            t = _mm256_fmadd_ps(ld_q8(p[i] + k + 16), x2, t);
            t = _mm256_fmadd_ps(ld_q8(p[i] + k + 24), x3, t);
            a[i] = _mm256_fmadd_ps(t, _mm256_set1_ps(ms_bf16_to_f32(s[i][b])), a[i]);
        }
    }
    UNROLL for (int i = 0; i < NR; i++) out[i] = hsum(a[i]);
}

T256 static void q8_gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    float o[4];
    int64_t r = r0;
    for (; r + 4 <= r1 && w->cols > 4096; r += 4) {
        q8_rows(w, r, x, o, 4);
        for (int i = 0; i < 4; i++) y[r + i] = acc ? y[r + i] + o[i] : o[i];
    }
    for (; r < r1; r++) {
        q8_rows(w, r, x, o, 1);
        y[r] = acc ? y[r] + o[0] : o[0];
    }
}

/* I4 (core/qmat.h, compressed-tensors pack-quantized): the bytes of the int32 words,
 * low nibble = even column, value (u - uz) * scale (uz 8, or the zero point); one BF16 scale per bcol (a
 * multiple of 32) along a row. Even/odd columns against deinterleaved x, as F4. */
static int i4_fast(const ms_qmat *w) {
    return w->cols % 32 == 0 && w->scale && w->brow == 1 && w->bcol >= 32 && w->bcol % 32 == 0 && w->cols % w->bcol == 0 &&
           w->scale_dtype == MS_DT_BF16;
}
/* (u - uz) as floats; uz the group's unsigned zero point (8: symmetric) */
INL __m256 i4_val(__m256i u, __m256i uz) { return _mm256_cvtepi32_ps(_mm256_sub_epi32(u, uz)); }

INL void i4_rows(const ms_qmat *w, int64_t r, const float *x, float *out, const int NR) {
    const int64_t K = w->cols, ng = K / w->bcol, gb = w->bcol / 32;
    const uint8_t *p[4];
    const uint16_t *s[4];
    UNROLL for (int i = 0; i < NR; i++) {
        p[i] = (const uint8_t *)w->data + (r + i) * (K / 2);
        s[i] = (const uint16_t *)w->scale + (r + i) * ng;
    }
    const __m256i m15 = _mm256_set1_epi32(15);
    __m256 a[4];
    UNROLL for (int i = 0; i < NR; i++) a[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m256 b[4];
        __m256i z[4];
        UNROLL for (int i = 0; i < NR; i++) b[i] = _mm256_setzero_ps(), z[i] = _mm256_set1_epi32(ms_i4_zero(w, r + i, g));
        for (int64_t k = g * w->bcol, ke = k + gb * 32; k < ke; k += 32) {
            __m256 xe0, xo0, xe1, xo1;
            deinterleave(x + k, &xe0, &xo0);
            deinterleave(x + k + 16, &xe1, &xo1);
            UNROLL for (int i = 0; i < NR; i++) {
                __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p[i] + k / 2)));
                __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p[i] + k / 2 + 8)));
                __m256 t = _mm256_mul_ps(i4_val(_mm256_and_si256(v0, m15), z[i]), xe0);
                t = _mm256_fmadd_ps(i4_val(_mm256_srli_epi32(v0, 4), z[i]), xo0, t);
                t = _mm256_fmadd_ps(i4_val(_mm256_and_si256(v1, m15), z[i]), xe1, t);
                b[i] = _mm256_add_ps(b[i], _mm256_fmadd_ps(i4_val(_mm256_srli_epi32(v1, 4), z[i]), xo1, t));
            }
        }
        UNROLL for (int i = 0; i < NR; i++) a[i] = _mm256_fmadd_ps(b[i], _mm256_set1_ps(ms_bf16_to_f32(s[i][g])), a[i]);
    }
    UNROLL for (int i = 0; i < NR; i++) out[i] = hsum(a[i]);
}

T256 static void i4_gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    float o[4];
    int64_t r = r0;
    /* compute-bound like F4: 4 rows share each deinterleaved x */
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

T256 static void gemv(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc) {
    switch (w->dtype) {
    case MS_DT_F32: f32_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_BF16: bf16_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_F16: f16_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_F8_E4M3: f8_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_F4: f4_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_Q8: q8_gemv(w, x, y, r0, r1, acc); break;
    case MS_DT_I4: i4_gemv(w, x, y, r0, r1, acc); break;
    default: break;
    }
}

/* ---- prefill: tile dequantization ---- */

T256 static void dequant(const ms_qmat *w, int64_t r0, int nr, int64_t c0, int kc, float *buf, int ld) {
    const int64_t K = w->cols;
    switch (w->dtype) {
    case MS_DT_BF16:
    case MS_DT_F16:
        for (int i = 0; i < nr; i++) {
            float *o = buf + (int64_t)i * ld;
            const uint16_t *p = (const uint16_t *)w->data + (r0 + i) * K + c0;
            int k = 0;
            if (w->dtype == MS_DT_BF16) {
                for (; k + 8 <= kc; k += 8) _mm256_storeu_ps(o + k, ld_bf16(p + k));
                for (; k < kc; k++) o[k] = ms_bf16_to_f32(p[k]);
            } else {
                for (; k + 8 <= kc; k += 8) _mm256_storeu_ps(o + k, ld_f16(p + k));
                for (; k < kc; k++) o[k] = ms_f16_to_f32(p[k]);
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
                float s = mm_scale_at(w, sr, cb);
                __m256 sv = _mm256_set1_ps(s * 256.0f);
                for (; c + 16 <= ce; c += 16) {
                    __m256i h = f8_to_h16_16(p + c);
                    _mm256_storeu_ps(o + (c - c0), _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), sv));
                    _mm256_storeu_ps(o + (c - c0) + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), sv));
                }
                for (; c < ce; c++) o[c - c0] = ms_fp8_e4m3_to_f32(p[c]) * s;
            }
        }
        return;
    case MS_DT_Q8:
        if (!q8_fast(w) || c0 % 32 || kc % 32) break;
        for (int i = 0; i < nr; i++) {
            float *o = buf + (int64_t)i * ld;
            const int8_t *p = (const int8_t *)w->data + (r0 + i) * K;
            const uint16_t *sc = (const uint16_t *)w->scale + (r0 + i) * (K / 32);
            for (int k = 0; k < kc; k += 8) {
                int64_t c = c0 + k;
                _mm256_storeu_ps(o + k, _mm256_mul_ps(ld_q8(p + c), _mm256_set1_ps(ms_bf16_to_f32(sc[c / 32]))));
            }
        }
        return;
    case MS_DT_I4:
        if (!i4_fast(w) || c0 % 32 || kc % 32) break;
        for (int i = 0; i < nr; i++) {
            float *o = buf + (int64_t)i * ld;
            const uint8_t *p = (const uint8_t *)w->data + (r0 + i) * (K / 2);
            const uint16_t *sc = (const uint16_t *)w->scale + (r0 + i) * (K / w->bcol);
            for (int k = 0; k < kc; k += 16) {
                int64_t c = c0 + k;
                __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + c / 2)));
                __m256i zv = _mm256_set1_epi32(ms_i4_zero(w, r0 + i, c / w->bcol));
                __m256 lo = i4_val(_mm256_and_si256(v, _mm256_set1_epi32(15)), zv), hi = i4_val(_mm256_srli_epi32(v, 4), zv);
                __m256 sv = _mm256_set1_ps(ms_bf16_to_f32(sc[c / w->bcol]));
                __m256 ul = _mm256_unpacklo_ps(lo, hi), uh = _mm256_unpackhi_ps(lo, hi);
                _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_permute2f128_ps(ul, uh, 0x20), sv));
                _mm256_storeu_ps(o + k + 8, _mm256_mul_ps(_mm256_permute2f128_ps(ul, uh, 0x31), sv));
            }
        }
        return;
    case MS_DT_F4: {
        if (!f4_fast(w) || c0 % 32 || kc % 32) break;
        const __m256i xtab = fp4_xtab();
        for (int i = 0; i < nr; i++) {
            float *o = buf + (int64_t)i * ld;
            const uint8_t *p = (const uint8_t *)w->data + (r0 + i) * (K / 2);
            for (int k = 0; k < kc; k += 16) {
                int64_t c = c0 + k;
                __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + c / 2)));
                __m256 lo = fp4_xval(v, xtab), hi = fp4_xval(_mm256_srli_epi32(v, 4), xtab);
                __m256 sv = _mm256_set1_ps(mm_scale_at(w, (r0 + i) / (w->scale ? w->brow : 1), c / 32));
                __m256 ul = _mm256_unpacklo_ps(lo, hi), uh = _mm256_unpackhi_ps(lo, hi);
                _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_permute2f128_ps(ul, uh, 0x20), sv));
                _mm256_storeu_ps(o + k + 8, _mm256_mul_ps(_mm256_permute2f128_ps(ul, uh, 0x31), sv));
            }
        }
        return;
    }
    default: break;
    }
    mm_dequant_scalar(w, r0, nr, c0, kc, buf, ld);
}

/* ---- prefill: F32 tile x tokens, 4 tokens x 2 rows of accumulators ---- */

INL void micro(const float *buf, int ld, const float *x, int64_t ldx, int kc, float *y, int64_t ldy, int acc,
               const int NT, const int NR) {
    __m256 c[4][2];
    UNROLL for (int t = 0; t < NT; t++)
        UNROLL for (int r = 0; r < NR; r++) c[t][r] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= kc; k += 8) {
        __m256 xv[4];
        UNROLL for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_ps(x + t * ldx + k);
        UNROLL for (int r = 0; r < NR; r++) {
            __m256 wv = _mm256_loadu_ps(buf + r * ld + k);
            UNROLL for (int t = 0; t < NT; t++) c[t][r] = _mm256_fmadd_ps(wv, xv[t], c[t][r]);
        }
    }
    UNROLL for (int t = 0; t < NT; t++)
        UNROLL for (int r = 0; r < NR; r++) {
            float s = hsum(c[t][r]);
            for (int kk = k; kk < kc; kk++) s += buf[r * ld + kk] * x[t * ldx + kk];
            float *yo = y + t * ldy + r;
            *yo = acc ? *yo + s : s;
        }
}

T256 static void tile(const float *buf, int ld, int nr, const float *x, int64_t ldx, int nt, int kc, float *y,
                      int64_t ldy, int acc) {
    for (int t = 0; t < nt; t += 4) {
        int mt = nt - t < 4 ? nt - t : 4;
        for (int r = 0; r < nr; r += 2) {
            int mr = nr - r < 2 ? nr - r : 2;
            const float *b = buf + (int64_t)r * ld, *xt = x + t * ldx;
            float *yt = y + t * ldy + r;
#define MICRO(A, B) micro(b, ld, xt, ldx, kc, yt, ldy, acc, A, B)
            switch (mt * 2 + mr) {
            case 4 * 2 + 2: MICRO(4, 2); break;
            case 4 * 2 + 1: MICRO(4, 1); break;
            case 3 * 2 + 2: MICRO(3, 2); break;
            case 3 * 2 + 1: MICRO(3, 1); break;
            case 2 * 2 + 2: MICRO(2, 2); break;
            case 2 * 2 + 1: MICRO(2, 1); break;
            case 1 * 2 + 2: MICRO(1, 2); break;
            default: MICRO(1, 1); break;
            }
#undef MICRO
        }
    }
}

const mm_kernels ms_kernels_avx2 = {
    .gemv_ok = gemv_ok,
    .gemv = gemv,
    .dequant = dequant,
    .tile = tile,
    .x_need = f4_x_need,
    .x_prep = f4_x_prep,
    .dot = ms_k256_dot,
    .axpy = ms_k256_axpy,
    .rmsnorm = ms_k256_rmsnorm,
    .softmax = ms_k256_softmax,
    .swiglu = ms_k256_swiglu,
};
#endif
