/* qkern_avx2.c — Q8-activation kernels (qkern.h), 256-bit: AVX-VNNI (vpdpbusd)
 * and plain AVX2 (vpmaddubsw + vpmaddwd). A group is 2 blocks: one 32-byte
 * register of the blocks' first halves and one of their second halves (int32
 * lanes 4i..4i+3 hold block i). MXFP4 and INT4 enter the unsigned side as
 * offset integers (12, 8; INT4 with zero points: its zero point per block) taken
 * back out through m (plain AVX2: the two halves' vpmaddubsw pairs summed in int16, then one
 * vpmaddwd per plane); Q8 uses the offset 128 with
 * VNNI and the sign trick (|w| against a with w's sign) on AVX2, where
 * vpmaddubsw would saturate. Block scales: 8 at a time, SIMD for full octets. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/qkern.h"

#define TA2 __attribute__((target("avx2,fma,f16c")))
#define TAV __attribute__((target("avx2,fma,f16c,avxvnni")))

#define GB 2
#define QK_PF 3072 /* prefetch distance in weight bytes (Q8: half), as the AVX-512 kernels */

#define DOT_AV(acc, u, a) _mm256_dpbusd_avx_epi32((acc), (u), (a))
#define DOT_A2(acc, u, a) _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (a)), _mm256_set1_epi16(1)))
#define DOTS_A2(acc, w, a) DOT_A2((acc), _mm256_abs_epi8(w), _mm256_sign_epi8((a), (w)))

static inline float hsum8(__m256 v) __attribute__((always_inline, target("avx2,fma")));
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The weight scales of blocks [b0, b0 + n) of row r (n <= 8; the rest 0), as qkern.h's sw. */
static inline void scales8(const ms_qmat *w, int64_t r, int64_t b0, int n, float *o) __attribute__((always_inline));
static inline void scales8(const ms_qmat *w, int64_t r, int64_t b0, int n, float *o) {
    for (int i = 0; i < 8; i++) {
        if (i >= n) {
            o[i] = 0;
            continue;
        }
        int64_t b = b0 + i;
        o[i] = w->dtype == MS_DT_F4 ? 0.5f * (w->scale ? mm_scale_at(w, r / w->brow, b) : 1.0f)
                                    : mm_scale_at(w, r, b * 32 / w->bcol);
    }
}

/* The lanes of group gi's two block scales (8 blocks of scales a pass: gi 0..3), loaded instead of
 * built from gi in registers (a vmovd / vpshufd / vinserti128 chain per group). */
static const int32_t k_sel[4][8] __attribute__((aligned(32))) = {
    {0, 0, 0, 0, 1, 1, 1, 1}, {2, 2, 2, 2, 3, 3, 3, 3}, {4, 4, 4, 4, 5, 5, 5, 5}, {6, 6, 6, 6, 7, 7, 7, 7}};

#define QROW(NAME, TGT, DOTU, DOTS, FMT_ID, FUSE)                                                                     \
    static inline __attribute__((always_inline)) TGT float NAME(const ms_qmat *w, const qk_act *a, int64_t r, const int PL) { \
        const int64_t K = w->cols, nb = K / 32;                                                                    \
        __m256 acc = _mm256_setzero_ps(), corr = _mm256_setzero_ps();                                              \
        const __m256i lo4 = _mm256_set1_epi8(0x0f);                                                                \
        const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16, \
                                             18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);                               \
        const uint8_t *wp = (const uint8_t *)w->data + (FMT_ID == 2 ? r * K : r * (K / 2));                        \
        const uint8_t *s8 = FMT_ID == 0 && w->scale ? (const uint8_t *)w->scale + (r / w->brow) * nb : NULL;       \
        const int s16ok = FMT_ID == 2 || (FMT_ID == 1 && w->bcol == 32);                                           \
        const uint16_t *s16 = s16ok ? (const uint16_t *)w->scale + r * nb : NULL;                             \
        float swb[8] __attribute__((aligned(32)));                                                                 \
        for (int64_t b0 = 0; b0 < nb; b0 += 8) {                                                                   \
            int nbl = nb - b0 < 8 ? (int)(nb - b0) : 8;                                                            \
            __m256 sw;                                                                                             \
            if (nbl == 8 && FMT_ID == 0 && s8) {                                                                   \
                __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s8 + b0)));                     \
                __m256i u = _mm256_slli_epi32(e, 23);                                                              \
                u = _mm256_blendv_epi8(u, _mm256_set1_epi32(0x00400000), _mm256_cmpeq_epi32(e, _mm256_setzero_si256())); \
                u = _mm256_blendv_epi8(u, _mm256_set1_epi32(0x7fc00000), _mm256_cmpeq_epi32(e, _mm256_set1_epi32(0xff))); \
                sw = _mm256_mul_ps(_mm256_castsi256_ps(u), _mm256_set1_ps(0.5f));                                  \
            } else if (nbl == 8 && s16ok) {                                                                  \
                sw = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s16 + b0))), 16)); \
            } else {                                                                                               \
                scales8(w, r, b0, nbl, swb);                                                                       \
                sw = _mm256_load_ps(swb);                                                                          \
            }                                                                                                      \
            __m256 dd = _mm256_loadu_ps(a->d + b0), mm = _mm256_loadu_ps(a->m + b0); /* padded with zeros */     \
            __m256 sd = _mm256_mul_ps(sw, dd);                                                                     \
            __m256 swc = sw; /* INT4 zero points: sw_b * uz_b (off 1 below) */                                    \
            if (FMT_ID == 1 && w->zero) {                                                                          \
                float zb[8];                                                                                       \
                qk_i4_zeros(w, r, b0, nbl, 8, zb);                                                                 \
                swc = _mm256_mul_ps(sw, _mm256_loadu_ps(zb));                                                      \
            }                                                                                                      \
            if (FMT_ID != 2 || DOTS == 0) corr = _mm256_fmadd_ps(swc, mm, corr);                                  \
            for (int gi = 0; gi * GB < nbl; gi++) {                                                                \
                const int64_t b = b0 + gi * GB;                                                                    \
                const int two = nbl - gi * GB >= 2;                                                                \
                const int8_t *aq = a->q + b * 32;                                                                  \
                if ((gi & 1) == 0) {                                                                               \
                    if (FMT_ID != 2) _mm_prefetch((const char *)(wp + b * 16 + QK_PF), _MM_HINT_T0);               \
                    else _mm_prefetch((const char *)(wp + b * 32 + QK_PF / 2), _MM_HINT_T0),                       \
                         _mm_prefetch((const char *)(wp + b * 32 + QK_PF / 2 + 64), _MM_HINT_T0);                  \
                }                                                                                                  \
                __m256i a0 = _mm256_loadu_si256((const __m256i *)aq), a1 = _mm256_loadu_si256((const __m256i *)(aq + 32)), dv; \
                if (FMT_ID != 2) {                                                                                 \
                    __m256i wb = two ? _mm256_loadu_si256((const __m256i *)(wp + b * 16))                          \
                                     : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(wp + b * 16)));    \
                    __m256i lo = _mm256_and_si256(wb, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(wb, 4), lo4);  \
                    if (FMT_ID == 0) lo = _mm256_shuffle_epi8(lut, lo), hi = _mm256_shuffle_epi8(lut, hi);          \
                    if (FUSE) { /* vpmaddubsw pairs of both halves summed in int16 (<= 4 * 24 * 127), one vpmaddwd */ \
                        __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, a0), _mm256_maddubs_epi16(hi, a1));   \
                        if (PL == 2) {                                                                             \
                            const int8_t *aq2 = a->q2 + b * 32;                                                    \
                            __m256i c0 = _mm256_loadu_si256((const __m256i *)aq2), c1 = _mm256_loadu_si256((const __m256i *)(aq2 + 32)); \
                            __m256i p2 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, c0), _mm256_maddubs_epi16(hi, c1)); \
                            dv = _mm256_add_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(256)), _mm256_madd_epi16(p2, _mm256_set1_epi16(1))); \
                        } else dv = _mm256_madd_epi16(p, _mm256_set1_epi16(1));                                    \
                    } else {                                                                                       \
                        dv = DOTU(DOTU(_mm256_setzero_si256(), lo, a0), hi, a1);                                   \
                        if (PL == 2) { /* (dot(w, q) << 8) + dot(w, q2) */                                         \
                            const int8_t *aq2 = a->q2 + b * 32;                                                    \
                            __m256i c0 = _mm256_loadu_si256((const __m256i *)aq2), c1 = _mm256_loadu_si256((const __m256i *)(aq2 + 32)); \
                            dv = DOTU(DOTU(_mm256_slli_epi32(dv, 8), lo, c0), hi, c1);                             \
                        }                                                                                          \
                    }                                                                                              \
                } else {                                                                                           \
                    __m256i wa = _mm256_loadu_si256((const __m256i *)(wp + b * 32));                               \
                    __m256i wc = two ? _mm256_loadu_si256((const __m256i *)(wp + b * 32 + 32)) : _mm256_setzero_si256(); \
                    __m256i u0 = _mm256_permute2x128_si256(wa, wc, 0x20), u1 = _mm256_permute2x128_si256(wa, wc, 0x31); \
                    const __m256i x80 = _mm256_set1_epi8((char)0x80);                                              \
                    if (!DOTS) u0 = _mm256_xor_si256(u0, x80), u1 = _mm256_xor_si256(u1, x80);                     \
                    if (DOTS) dv = DOTS_A2(DOTS_A2(_mm256_setzero_si256(), u0, a0), u1, a1);                       \
                    else dv = DOTU(DOTU(_mm256_setzero_si256(), u0, a0), u1, a1);                                  \
                    if (PL == 2) {                                                                                 \
                        const int8_t *aq2 = a->q2 + b * 32;                                                        \
                        __m256i c0 = _mm256_loadu_si256((const __m256i *)aq2), c1 = _mm256_loadu_si256((const __m256i *)(aq2 + 32)); \
                        if (DOTS) dv = DOTS_A2(DOTS_A2(_mm256_slli_epi32(dv, 8), u0, c0), u1, c1);                 \
                        else dv = DOTU(DOTU(_mm256_slli_epi32(dv, 8), u0, c0), u1, c1);                            \
                    }                                                                                              \
                }                                                                                                  \
                __m256i sel = _mm256_load_si256((const __m256i *)k_sel[gi]);                                       \
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dv), _mm256_permutevar8x32_ps(sd, sel), acc);             \
            }                                                                                                      \
        }                                                                                                          \
        const float off = FMT_ID == 0 ? 12.0f : FMT_ID == 1 ? (w->zero ? 1.0f : 8.0f) : DOTS ? 0.0f : 128.0f;       \
        return hsum8(acc) - off * hsum8(corr);                                                                     \
    }

QROW(f4_row_av, TAV, DOT_AV, 0, 0, 0)
QROW(i4_row_av, TAV, DOT_AV, 0, 1, 0)
QROW(q8_row_av, TAV, DOT_AV, 0, 2, 0)
QROW(f4_row_a2, TA2, DOT_A2, 0, 0, 1)
QROW(i4_row_a2, TA2, DOT_A2, 0, 1, 1)
QROW(q8_row_a2, TA2, DOT_A2, 1, 2, 0)

#define QGEMV(NAME, TGT, F4, I4, Q8)                                                                            \
    TGT static void NAME(const ms_qmat *w, const qk_act *a, float *y, int64_t r0, int64_t r1, int acc) {        \
        const int two = a->q2 != NULL;                                                                          \
        for (int64_t r = r0; r < r1; r++) {                                                                     \
            float s = two ? (w->dtype == MS_DT_F4 ? F4(w, a, r, 2) : w->dtype == MS_DT_I4 ? I4(w, a, r, 2) : Q8(w, a, r, 2)) \
                          : (w->dtype == MS_DT_F4 ? F4(w, a, r, 1) : w->dtype == MS_DT_I4 ? I4(w, a, r, 1) : Q8(w, a, r, 1)); \
            y[r] = acc ? y[r] + s : s;                                                                          \
        }                                                                                                       \
    }
QGEMV(gemv_av, TAV, f4_row_av, i4_row_av, q8_row_av)
QGEMV(gemv_a2, TA2, f4_row_a2, i4_row_a2, q8_row_a2)

/* even/odd lanes of 16 consecutive floats (as kernels_avx2.c's deinterleave) */
static inline __attribute__((always_inline)) TA2 void deint16(const float *x, __m256 *e, __m256 *o) {
    __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
    *e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0x88)), 0xD8));
    *o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x0, x1, 0xDD)), 0xD8));
}
/* 16 int32 in two registers (each within [-127, 127]) -> 16 bytes, in order */
static inline __attribute__((always_inline)) TA2 __m128i pack16(__m256i a, __m256i b) {
    __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
    return _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

/* ms_qk_quant in 8-lane registers: the same max, products and round-to-nearest-even
 * (vcvtps2dq in the default mode), so the same integers, scales and sums (q2: the same
 * (v - q) * 256, exact). */
TA2 static void quant(const float *x, int64_t K, int gb, qk_layout lay, int8_t *q, int8_t *q2, float *d, float *m) {
    const int64_t kp = (K + QK_PAD - 1) / QK_PAD * QK_PAD;
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), big = _mm256_set1_ps(3.4028235e38f);
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    for (int64_t b = 0; b < kp / 32; b++) {
        const int64_t o0 = (b / gb) * (32 * gb) + (b % gb) * 16, o1 = o0 + 16 * gb;
        int8_t *h0 = q + o0, *h1 = q + o1;
        if (b * 32 >= K) {
            memset(h0, 0, 16), memset(h1, 0, 16);
            if (q2) memset(q2 + o0, 0, 16), memset(q2 + o1, 0, 16);
            d[b] = m[b] = 0;
            continue;
        }
        const float *xb = x + b * 32;
        __m256 v[4];
        if (lay == QK_DEINT) deint16(xb, &v[0], &v[2]), deint16(xb + 16, &v[1], &v[3]);
        else
            for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(xb + 8 * i);
        __m256 mx = _mm256_setzero_ps();
        int fin = 0xff;
        for (int i = 0; i < 4; i++) {
            __m256 a = _mm256_and_ps(v[i], absm);
            fin &= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_LE_OQ));
            mx = _mm256_max_ps(mx, a);
        }
        if (fin != 0xff) {
            memset(h0, 0, 16), memset(h1, 0, 16);
            if (q2) memset(q2 + o0, 0, 16), memset(q2 + o1, 0, 16);
            d[b] = m[b] = NAN;
            continue;
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        __m256 id = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
        __m256i qi[4], li[4], sum = _mm256_setzero_si256(), sum2 = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            __m256 vi = _mm256_mul_ps(v[i], id);
            qi[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(vi), lim), nlim);
            sum = _mm256_add_epi32(sum, qi[i]);
            if (q2) {
                li[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(vi, _mm256_cvtepi32_ps(qi[i])), _mm256_set1_ps(256.0f)));
                li[i] = _mm256_max_epi32(_mm256_min_epi32(li[i], lim), nlim);
                sum2 = _mm256_add_epi32(sum2, li[i]);
            }
        }
        _mm_storeu_si128((__m128i *)h0, pack16(qi[0], qi[1]));
        _mm_storeu_si128((__m128i *)h1, pack16(qi[2], qi[3]));
        if (q2) {
            _mm_storeu_si128((__m128i *)(q2 + o0), pack16(li[0], li[1]));
            _mm_storeu_si128((__m128i *)(q2 + o1), pack16(li[2], li[3]));
            sum = _mm256_add_epi32(_mm256_slli_epi32(sum, 8), sum2);
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        d[b] = q2 ? amax / 127.0f * 0x1p-8f : amax / 127.0f;
        m[b] = d[b] * (float)_mm_cvtsi128_si32(s4);
    }
}

const qk_kernels ms_qk_avxvnni = {.gb = GB, .gemv = gemv_av, .quant = quant};
const qk_kernels ms_qk_avx2 = {.gb = GB, .gemv = gemv_a2, .quant = quant};
#endif
