/* qkern_avx512.c — Q8-activation kernels (qkern.h), AVX-512: with AVX512_VNNI
 * (vpdpbusd) and without (AVX512BW vpmaddubsw + vpmaddwd). A group is 4 blocks:
 * one 64-byte register of the blocks' first halves and one of their second
 * halves, so each int32 lane of the dot holds one block's partial sum (lanes
 * 4i..4i+3 block i). The weights enter the unsigned side as small offset
 * integers u = wq + off (MXFP4 12, INT4 8, Q8 128 with VNNI); the row sum takes
 * off * sum_b sw_b * m_b back out (INT4 with zero points: sum_b sw_b * uz_b * m_b). Without VNNI, Q8 (u up to 255 would saturate
 * vpmaddubsw) multiplies |wq| by the activation with wq's sign instead. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/qkern.h"

#define TBW __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define TVN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))

#define GB 4
/* prefetch distance in weight bytes (a line per 64 bytes read; Q8 half of it): MXFP4
 * from DRAM on one core went from ~10-11.5 to 15-17 GB/s (min of 2000 calls) */
#ifndef QK_PF
#define QK_PF 3072
#endif

/* The first n (1..16) bytes / BF16 values at p, the rest 0. A partial masked load cost ~150
 * cycles a row on this VM's Zen 4 (the 2048x768 shape ran at half the rate); a row's tail is
 * copied instead. */
static inline __attribute__((always_inline)) TBW __m128i ld_bytes16(const uint8_t *p, int n) {
    if (n == 16) return _mm_loadu_si128((const __m128i *)p);
    /* 8 (a row of 24 blocks: K = 768): one 8-byte load, the upper half zero. The copy below
     * cost ~20% of the 2048x768 q8 decode (its 16-byte reload of the bytes just stored waits
     * for them; perf annotate). */
    if (n == 8) return _mm_loadl_epi64((const __m128i *)p);
    uint8_t b[16] = {0};
    memcpy(b, p, (size_t)n);
    return _mm_loadu_si128((const __m128i *)b);
}
static inline __attribute__((always_inline)) TBW __m256i ld_bf16x16(const uint16_t *p, int n) {
    if (n == 16) return _mm256_loadu_si256((const __m256i *)p);
    if (n == 8) return _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)p));
    uint16_t b[16] = {0};
    memcpy(b, p, (size_t)n * 2);
    return _mm256_loadu_si256((const __m256i *)b);
}
/* n (1..16) E8M0 bytes -> F32 2^(e-127) (0 -> 2^-127, 0xff -> NaN), lanes past n 0. */
#define E8M0_16(s, n)                                                                                                \
    ({                                                                                                             \
        __m512i e_ = _mm512_cvtepu8_epi32(ld_bytes16((s), (n)));                                                   \
        __m512i u_ = _mm512_slli_epi32(e_, 23);                                                                    \
        u_ = _mm512_mask_mov_epi32(u_, _mm512_cmpeq_epi32_mask(e_, _mm512_setzero_si512()), _mm512_set1_epi32(0x00400000)); \
        u_ = _mm512_mask_mov_epi32(u_, _mm512_cmpeq_epi32_mask(e_, _mm512_set1_epi32(0xff)), _mm512_set1_epi32(0x7fc00000)); \
        /* lanes past n: 0, not 2^-127 (an F32 subnormal: a multiply meeting one takes a microcode assist) */   \
        _mm512_castsi512_ps(_mm512_maskz_mov_epi32((__mmask16)((1u << (n)) - 1), u_));                           \
    })
#define BF16_16(p, n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(ld_bf16x16((p), (n))), 16))

#define DOT_VN(acc, u, a) _mm512_dpbusd_epi32((acc), (u), (a))
#define DOT_BW(acc, u, a) _mm512_add_epi32((acc), _mm512_madd_epi16(_mm512_maddubs_epi16((u), (a)), _mm512_set1_epi16(1)))
/* signed w x signed a for |w| <= 128 without VNNI: |w| against a with w's sign */
#define DOTS_BW(acc, w, a)                                                                                       \
    DOT_BW((acc), _mm512_abs_epi8(w), _mm512_mask_sub_epi8((a), _mm512_movepi8_mask(w), _mm512_setzero_si512(), (a)))


/* The lanes of group gi's four block scales (16 blocks of scales a pass: gi 0..3), loaded instead
 * of a broadcast and an add per group. */
static const int32_t k_sel[4][16] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
    {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7},
    {8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11},
    {12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15}};

#define QROW(NAME, TGT, DOTU, DOTS, FMT_ID)                                                                       \
    static inline __attribute__((always_inline)) TGT void NAME(const ms_qmat *w, const qk_act *a, int64_t r, float *out, \
                                                              const int NT, const int PL) {                      \
        const int64_t K = w->cols, nb = K / 32;                                                                    \
        __m512 acc[4], corr[4], sd[4];                                                                             \
        for (int t = 0; t < NT; t++) acc[t] = corr[t] = _mm512_setzero_ps();                                       \
        const __m512i lo4 = _mm512_set1_epi8(0x0f);                                                                \
        const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0)); \
        const uint8_t *wp = (const uint8_t *)w->data;                                                              \
        const uint8_t *s8 = NULL;                                                                                  \
        const uint16_t *s16 = NULL;                                                                                \
        int gsh = 0;                                                                                               \
        if (FMT_ID == 0) {                                                                                         \
            wp += r * (K / 2);                                                                                     \
            if (w->scale) s8 = (const uint8_t *)w->scale + (r / w->brow) * nb;                                      \
        } else if (FMT_ID == 1) {                                                                                  \
            wp += r * (K / 2);                                                                                     \
            s16 = (const uint16_t *)w->scale + r * (K / w->bcol);                                                  \
            while ((32 << gsh) < w->bcol) gsh++;                                                                   \
        } else {                                                                                                   \
            wp += r * K;                                                                                           \
            s16 = (const uint16_t *)w->scale + r * nb;                                                             \
        }                                                                                                          \
        const __m512i gidx = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), gsh); \
        for (int64_t b0 = 0; b0 < nb; b0 += 16) {                                                                  \
            int nbl = nb - b0 < 16 ? (int)(nb - b0) : 16;                                                          \
            __m512 sw;                                                                                             \
            if (FMT_ID == 0) sw = _mm512_mul_ps(s8 ? E8M0_16(s8 + b0, nbl) : _mm512_set1_ps(1.0f), _mm512_set1_ps(0.5f)); \
            else if (FMT_ID == 1) {                                                                                \
                int ng = (int)(((nb - b0) + (1 << gsh) - 1) >> gsh);                                               \
                if (ng > 16) ng = 16;                                                                              \
                __m512 g = BF16_16(s16 + (b0 >> gsh), ng);                                \
                sw = _mm512_permutexvar_ps(gidx, g);                                                               \
            } else sw = BF16_16(s16 + b0, nbl);                                                                     \
            __m512 swc = sw; /* INT4 zero points: sw_b * uz_b (off 1 below) */                                    \
            if (FMT_ID == 1 && w->zero) {                                                                          \
                float zb[16];                                                                                      \
                qk_i4_zeros(w, r, b0, nbl, 16, zb);                                                                \
                swc = _mm512_mul_ps(sw, _mm512_loadu_ps(zb));                                                      \
            }                                                                                                      \
            for (int t = 0; t < NT; t++) {                                                                         \
                sd[t] = _mm512_mul_ps(sw, _mm512_loadu_ps(a[t].d + b0));                                 \
                if (FMT_ID != 2 || DOTS == 0) corr[t] = _mm512_fmadd_ps(swc, _mm512_loadu_ps(a[t].m + b0), corr[t]); \
            }                                                                                                      \
            for (int gi = 0; gi * GB < nbl; gi++) {                                                                \
                const int64_t b = b0 + gi * GB;                                                                    \
                const int nbg = nbl - gi * GB < GB ? nbl - gi * GB : GB;                                           \
                __m512i dv[4], u0, u1;                                                                             \
                if (FMT_ID != 2) _mm_prefetch((const char *)(wp + b * 16 + QK_PF), _MM_HINT_T0);                   \
                else _mm_prefetch((const char *)(wp + b * 32 + QK_PF / 2), _MM_HINT_T0),                           \
                     _mm_prefetch((const char *)(wp + b * 32 + QK_PF / 2 + 64), _MM_HINT_T0);                      \
                if (FMT_ID != 2) {                                                                                 \
                    __m512i wb = _mm512_maskz_loadu_epi8(nbg == GB ? ~(__mmask64)0 : (((__mmask64)1 << (16 * nbg)) - 1), wp + b * 16); \
                    __m512i lo = _mm512_and_si512(wb, lo4), hi = _mm512_and_si512(_mm512_srli_epi16(wb, 4), lo4);  \
                    if (FMT_ID == 0) lo = _mm512_shuffle_epi8(lut, lo), hi = _mm512_shuffle_epi8(lut, hi);          \
                    u0 = lo, u1 = hi;                                                                              \
                } else {                                                                                           \
                    __mmask64 m0 = nbg >= 2 ? ~(__mmask64)0 : (((__mmask64)1 << 32) - 1);                           \
                    __mmask64 m1 = nbg == 4 ? ~(__mmask64)0 : nbg == 3 ? (((__mmask64)1 << 32) - 1) : 0;            \
                    __m512i wa = _mm512_maskz_loadu_epi8(m0, wp + b * 32), wc = _mm512_maskz_loadu_epi8(m1, wp + b * 32 + 64); \
                    u0 = _mm512_permutex2var_epi64(wa, _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), wc);           \
                    u1 = _mm512_permutex2var_epi64(wa, _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15), wc);         \
                    if (!DOTS) {                                                                                   \
                        const __m512i x80 = _mm512_set1_epi8((char)0x80);                                          \
                        u0 = _mm512_xor_si512(u0, x80), u1 = _mm512_xor_si512(u1, x80);                            \
                    }                                                                                              \
                }                                                                                                  \
                const __m512i sel = _mm512_load_si512((const void *)k_sel[gi]);                                    \
                for (int t = 0; t < NT; t++) {                                                                     \
                    const int8_t *aq = a[t].q + b * 32;                                                            \
                    __m512i a0 = _mm512_loadu_si512(aq), a1 = _mm512_loadu_si512(aq + 64);                          \
                    if (FMT_ID == 2 && DOTS) dv[t] = DOTS_BW(DOTS_BW(_mm512_setzero_si512(), u0, a0), u1, a1);     \
                    else dv[t] = DOTU(DOTU(_mm512_setzero_si512(), u0, a0), u1, a1);                               \
                    if (PL == 2) { /* (dot(w, q) << 8) + dot(w, q2) */                                             \
                        const int8_t *aq2 = a[t].q2 + b * 32;                                                      \
                        __m512i c0 = _mm512_loadu_si512(aq2), c1 = _mm512_loadu_si512(aq2 + 64);                   \
                        __m512i hi8 = _mm512_slli_epi32(dv[t], 8);                                                 \
                        if (FMT_ID == 2 && DOTS) dv[t] = DOTS_BW(DOTS_BW(hi8, u0, c0), u1, c1);                    \
                        else dv[t] = DOTU(DOTU(hi8, u0, c0), u1, c1);                                              \
                    }                                                                                              \
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dv[t]), _mm512_permutexvar_ps(sel, sd[t]), acc[t]); \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        const float off = FMT_ID == 0 ? 12.0f : FMT_ID == 1 ? (w->zero ? 1.0f : 8.0f) : DOTS ? 0.0f : 128.0f;       \
        for (int t = 0; t < NT; t++) out[t] = _mm512_reduce_add_ps(_mm512_fnmadd_ps(corr[t], _mm512_set1_ps(off), acc[t])); \
    }

QROW(f4_row_vn, TVN, DOT_VN, 0, 0)
QROW(i4_row_vn, TVN, DOT_VN, 0, 1)
QROW(q8_row_vn, TVN, DOT_VN, 0, 2)
QROW(f4_row_bw, TBW, DOT_BW, 0, 0)
QROW(i4_row_bw, TBW, DOT_BW, 0, 1)
QROW(q8_row_bw, TBW, DOT_BW, 1, 2)

/* One row or (gemm) up to 4 tokens per row: the expanded weights of a group are used by
 * every token, each token's sums kept apart (the same operations per token as gemv).
 * PL: 1 or 2 activation planes (qk_act q2), the same for every token of a call. */
#define QROWS(F4, I4, Q8, W, A, R, S, NT, PL)                                                                  \
    do {                                                                                                        \
        if ((W)->dtype == MS_DT_F4) F4((W), (A), (R), (S), (NT), (PL));                                         \
        else if ((W)->dtype == MS_DT_I4) I4((W), (A), (R), (S), (NT), (PL));                                    \
        else Q8((W), (A), (R), (S), (NT), (PL));                                                                \
    } while (0)
#define QGEMV(NAME, TGT, F4, I4, Q8)                                                                            \
    TGT static void NAME(const ms_qmat *w, const qk_act *a, float *y, int64_t r0, int64_t r1, int acc) {        \
        float s;                                                                                                \
        const int two = a->q2 != NULL;                                                                          \
        for (int64_t r = r0; r < r1; r++) {                                                                     \
            if (two) QROWS(F4, I4, Q8, w, a, r, &s, 1, 2);                                                      \
            else QROWS(F4, I4, Q8, w, a, r, &s, 1, 1);                                                          \
            y[r] = acc ? y[r] + s : s;                                                                          \
        }                                                                                                       \
    }                                                                                                           \
    TGT static void NAME##_mm(const ms_qmat *w, const qk_act *a, int nt, float *y, int64_t ldy, int64_t r0,     \
                              int64_t r1, int acc) {                                                            \
        float s[4];                                                                                             \
        const int two = a->q2 != NULL;                                                                          \
        for (int t0 = 0; t0 < nt; t0 += 4) {                                                                    \
            int m = nt - t0 < 4 ? nt - t0 : 4;                                                                  \
            for (int64_t r = r0; r < r1; r++) {                                                                 \
                if (m == 4) {                                                                                   \
                    if (two) QROWS(F4, I4, Q8, w, a + t0, r, s, 4, 2);                                          \
                    else QROWS(F4, I4, Q8, w, a + t0, r, s, 4, 1);                                              \
                } else                                                                                          \
                    for (int t = 0; t < m; t++) {                                                               \
                        if (two) QROWS(F4, I4, Q8, w, a + t0 + t, r, s + t, 1, 2);                              \
                        else QROWS(F4, I4, Q8, w, a + t0 + t, r, s + t, 1, 1);                                  \
                    }                                                                                           \
                for (int t = 0; t < m; t++) {                                                                   \
                    float *yo = y + (int64_t)(t0 + t) * ldy + r;                                                \
                    *yo = acc ? *yo + s[t] : s[t];                                                              \
                }                                                                                               \
            }                                                                                                   \
        }                                                                                                       \
    }
QGEMV(gemv_vn, TVN, f4_row_vn, i4_row_vn, q8_row_vn)
QGEMV(gemv_bw, TBW, f4_row_bw, i4_row_bw, q8_row_bw)

/* ms_qk_quant in 16-lane registers: the same max, the same x * (127 / amax) products,
 * rounded to nearest even by vcvtps2dq (the default MXCSR mode, as the scalar rounding),
 * so the same integers, scales and sums (q2: the same (v - q) * 256, exact). */
TBW static void quant(const float *x, int64_t K, int gb, qk_layout lay, int8_t *q, int8_t *q2, float *d, float *m) {
    const int64_t kp = (K + QK_PAD - 1) / QK_PAD * QK_PAD;
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    for (int64_t b = 0; b < kp / 32; b++) {
        const int64_t o0 = (b / gb) * (32 * gb) + (b % gb) * 16, o1 = o0 + 16 * gb;
        int8_t *h0 = q + o0, *h1 = q + o1;
        if (b * 32 >= K) {
            memset(h0, 0, 16), memset(h1, 0, 16);
            if (q2) memset(q2 + o0, 0, 16), memset(q2 + o1, 0, 16);
            d[b] = m[b] = 0;
            continue;
        }
        __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
        __m512 a0 = _mm512_and_ps(x0, absm), a1 = _mm512_and_ps(x1, absm);
        __mmask16 fin = _mm512_cmp_ps_mask(a0, _mm512_set1_ps(3.4028235e38f), _CMP_LE_OQ) &
                        _mm512_cmp_ps_mask(a1, _mm512_set1_ps(3.4028235e38f), _CMP_LE_OQ);
        if (fin != 0xffff) {
            memset(h0, 0, 16), memset(h1, 0, 16);
            if (q2) memset(q2 + o0, 0, 16), memset(q2 + o1, 0, 16);
            d[b] = m[b] = NAN;
            continue;
        }
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        __m512 id = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
        __m512 e = lay == QK_DEINT ? _mm512_permutex2var_ps(x0, ie, x1) : x0;
        __m512 o = lay == QK_DEINT ? _mm512_permutex2var_ps(x0, io, x1) : x1;
        __m512 ve = _mm512_mul_ps(e, id), vo = _mm512_mul_ps(o, id);
        __m512i qe = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(ve), lim), nlim);
        __m512i qo = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(vo), lim), nlim);
        _mm_storeu_si128((__m128i *)h0, _mm512_cvtepi32_epi8(qe));
        _mm_storeu_si128((__m128i *)h1, _mm512_cvtepi32_epi8(qo));
        __m512i sum = _mm512_add_epi32(qe, qo);
        if (q2) {
            const __m512 k256 = _mm512_set1_ps(256.0f);
            __m512i le = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(ve, _mm512_cvtepi32_ps(qe)), k256));
            __m512i lo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(vo, _mm512_cvtepi32_ps(qo)), k256));
            le = _mm512_max_epi32(_mm512_min_epi32(le, lim), nlim), lo = _mm512_max_epi32(_mm512_min_epi32(lo, lim), nlim);
            _mm_storeu_si128((__m128i *)(q2 + o0), _mm512_cvtepi32_epi8(le));
            _mm_storeu_si128((__m128i *)(q2 + o1), _mm512_cvtepi32_epi8(lo));
            sum = _mm512_add_epi32(_mm512_slli_epi32(sum, 8), _mm512_add_epi32(le, lo));
            d[b] = amax / 127.0f * 0x1p-8f;
        } else d[b] = amax / 127.0f;
        m[b] = d[b] * (float)_mm512_reduce_add_epi32(sum);
    }
}

const qk_kernels ms_qk_avx512vnni = {.gb = GB, .gemv = gemv_vn, .gemm = gemv_vn_mm, .quant = quant};
const qk_kernels ms_qk_avx512 = {.gb = GB, .gemv = gemv_bw, .gemm = gemv_bw_mm, .quant = quant};
#endif
