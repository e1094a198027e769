/* ops_fast.c — vectorized elementwise/reduction ops of ops.h (rmsnorm,
 * softmax, swiglu, dot, axpy) with runtime dispatch; the scalar path is the
 * reference twins in ops_ref.c. exp is evaluated with a Cephes-style
 * polynomial after range reduction (max error ~2 ulp over the clamped range). */
#include "backend/cpu/kernels.h"

/* ---- scalar dot/axpy (the scalar ISA's entries) ---- */

float ms_dot_ref(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return (float)s;
}

void ms_axpy_ref(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

float ms_dot(const float *a, const float *b, int64_t n) { return ms_cpu_kernels()->dot(a, b, n); }
void ms_axpy(float *y, float a, const float *x, int64_t n) { ms_cpu_kernels()->axpy(y, a, x, n); }
void ms_rmsnorm(float *y, const float *x, const float *w, int n, int d, float eps) {
    ms_cpu_kernels()->rmsnorm(y, x, w, n, d, eps);
}
void ms_softmax(float *x, int d) { ms_cpu_kernels()->softmax(x, d); }
void ms_swiglu(float *out, const float *gate, const float *up, int64_t n) { ms_cpu_kernels()->swiglu(out, gate, up, n); }

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* ---------------- AVX-512 ---------------- */
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define I512 static inline __attribute__((always_inline)) T512

I512 __mmask16 m16(int64_t left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1); }

/* e^x for x in lanes; below -103 gives 0, above 88.7 gives +inf */
I512 __m512 exp512(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.7228391f), lo = _mm512_set1_ps(-103.972084f);
    __mmask16 over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
    x = _mm512_max_ps(lo, _mm512_min_ps(hi, x)); /* operand order keeps NaN */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512 y = _mm512_scalef_ps(p, n);
    return _mm512_mask_mov_ps(y, over, _mm512_set1_ps(INFINITY));
}

T512 float ms_k512_dot(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i < n; i += 16) {
        __mmask16 m = m16(n - i);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

T512 void ms_k512_axpy(float *y, float a, const float *x, int64_t n) {
    __m512 av = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
        _mm512_storeu_ps(y + i + 16, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16)));
    }
    for (; i < n; i += 16) {
        __mmask16 m = m16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

T512 void ms_k512_rmsnorm(float *y, const float *x, const float *w, int n, int d, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (int64_t)t * d;
        float *yt = y + (int64_t)t * d;
        double ss = (double)ms_k512_dot(xt, xt, d);
        __m512 inv = _mm512_set1_ps((float)(1.0 / sqrt(ss / d + eps)));
        for (int i = 0; i < d; i += 16) {
            __mmask16 m = m16(d - i);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xt + i), inv);
            if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
            _mm512_mask_storeu_ps(yt + i, m, v);
        }
    }
}

T512 void ms_k512_softmax(float *x, int d) {
    if (d <= 0) return;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < d; i += 16) mv = _mm512_mask_max_ps(mv, m16(d - i), mv, _mm512_maskz_loadu_ps(m16(d - i), x + i));
    float mx = _mm512_reduce_max_ps(mv);
    __m512 mb = _mm512_set1_ps(mx), s = _mm512_setzero_ps();
    for (int i = 0; i < d; i += 16) {
        __mmask16 m = m16(d - i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mb));
        e = _mm512_maskz_mov_ps(m, e);
        _mm512_mask_storeu_ps(x + i, m, e);
        s = _mm512_add_ps(s, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(s));
    for (int i = 0; i < d; i += 16) {
        __mmask16 m = m16(d - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
    }
}

T512 void ms_k512_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = m16(n - i);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u));
    }
}

/* ---------------- AVX2 ---------------- */
#define T256 __attribute__((target("avx2,fma,f16c")))
#define I256 static inline __attribute__((always_inline)) T256

I256 float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

I256 __m256 exp256(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.7228391f), lo = _mm256_set1_ps(-103.972084f);
    __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    x = _mm256_max_ps(lo, _mm256_min_ps(hi, x)); /* operand order keeps NaN */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n in two steps so that n down to -150 stays exact (subnormal results) */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
}

T256 float ms_k256_dot(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

T256 void ms_k256_axpy(float *y, float a, const float *x, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

T256 void ms_k256_rmsnorm(float *y, const float *x, const float *w, int n, int d, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (int64_t)t * d;
        float *yt = y + (int64_t)t * d;
        double ss = (double)ms_k256_dot(xt, xt, d);
        float invs = (float)(1.0 / sqrt(ss / d + eps));
        __m256 inv = _mm256_set1_ps(invs);
        int i = 0;
        for (; i + 8 <= d; i += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xt + i), inv);
            if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
            _mm256_storeu_ps(yt + i, v);
        }
        for (; i < d; i++) yt[i] = xt[i] * invs * (w ? w[i] : 1.0f);
    }
}

T256 void ms_k256_softmax(float *x, int d) {
    if (d <= 0) return;
    float mx = -INFINITY;
    int i = 0;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= d; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    float tmp[8];
    _mm256_storeu_ps(tmp, mv);
    for (int k = 0; k < 8; k++) mx = tmp[k] > mx ? tmp[k] : mx;
    for (; i < d; i++) mx = x[i] > mx ? x[i] : mx;
    __m256 mb = _mm256_set1_ps(mx), s = _mm256_setzero_ps();
    float st = 0;
    for (i = 0; i + 8 <= d; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mb));
        _mm256_storeu_ps(x + i, e);
        s = _mm256_add_ps(s, e);
    }
    for (; i < d; i++) st += (x[i] = expf(x[i] - mx));
    float inv = 1.0f / (hsum256(s) + st);
    __m256 iv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= d; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), iv));
    for (; i < d; i++) x[i] *= inv;
}

T256 void ms_k256_swiglu(float *out, const float *gate, const float *up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
        __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u));
    }
    for (; i < n; i++) out[i] = ms_silu(gate[i]) * up[i];
}

#endif
