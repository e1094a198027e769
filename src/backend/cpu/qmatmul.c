/* qmatmul.c — the Q8-activation path's quantizer, its scalar kernels (the
 * reference the SIMD tables are tested against) and the per-ISA table lookup.
 * matmul.c plans and runs the jobs. */
#include <math.h>
#include <string.h>

#include "backend/cpu/qkern.h"

int ms_qk_ok(const ms_qmat *w) {
    if (w->cols <= 0 || w->cols % 32) return 0;
    switch (w->dtype) {
    case MS_DT_F4:
        return !w->scale || (w->bcol == 32 && w->brow >= 1 && (w->scale_dtype == MS_DT_F8_E8M0 || w->scale_dtype == MS_DT_U8));
    case MS_DT_I4:
        return w->scale && w->brow == 1 && w->scale_dtype == MS_DT_BF16 && w->bcol >= 32 && w->bcol <= 512 &&
               (w->bcol & (w->bcol - 1)) == 0 && w->cols % w->bcol == 0;
    case MS_DT_Q8: return w->scale && w->brow == 1 && w->bcol == 32 && w->scale_dtype == MS_DT_BF16;
    default: return 0;
    }
}

/* v rounded to nearest even (|v| <= 2^22): adding and taking away 1.5 * 2^23 rounds in the
 * FPU's default mode, without a libm call (the build has no -ffast-math to fold it). */
static inline int rne(float v) { return (int)((v + 0x1.8p23f) - 0x1.8p23f); }

void ms_qk_quant(const float *x, int64_t K, int gb, qk_layout lay, int8_t *q, int8_t *q2, float *d, float *m) {
    const int64_t kp = (K + QK_PAD - 1) / QK_PAD * QK_PAD;
    for (int64_t b = 0; b < kp / 32; b++) {
        /* the block's two halves in the group layout (qk_pos) */
        const int64_t o0 = (b / gb) * (32 * gb) + (b % gb) * 16, o1 = o0 + 16 * gb;
        int8_t *h0 = q + o0, *h1 = q + o1;
        if (b * 32 >= K) {
            memset(h0, 0, 16), memset(h1, 0, 16);
            if (q2) memset(q2 + o0, 0, 16), memset(q2 + o1, 0, 16);
            d[b] = m[b] = 0;
            continue;
        }
        const float *xb = x + b * 32;
        float amax = 0;
        int nonfinite = 0;
        for (int j = 0; j < 32; j++) {
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
            nonfinite |= !(a <= 3.4028235e38f);
        }
        if (nonfinite) {
            memset(h0, 0, 16), memset(h1, 0, 16);
            if (q2) memset(q2 + o0, 0, 16), memset(q2 + o1, 0, 16);
            d[b] = m[b] = NAN;
            continue;
        }
        float id = amax > 0 ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < 16; i++) {
            for (int h = 0; h < 2; h++) {
                float v = xb[lay == QK_DEINT ? 2 * i + h : 16 * h + i] * id;
                int e = rne(v);
                e = e > 127 ? 127 : e < -127 ? -127 : e;
                (h ? h1 : h0)[i] = (int8_t)e;
                if (q2) {
                    int l = rne((v - (float)e) * 256.0f);
                    l = l > 127 ? 127 : l < -127 ? -127 : l;
                    q2[(h ? o1 : o0) + i] = (int8_t)l;
                    sum += 256 * e + l;
                } else sum += e;
            }
        }
        d[b] = q2 ? amax / 127.0f * 0x1p-8f : amax / 127.0f;
        m[b] = d[b] * (float)sum;
    }
}

/* The weight's integer of column j of block b of row r, and the block's scale. */
static int wq_at(const ms_qmat *w, int64_t r, int64_t c) {
    switch (w->dtype) {
    case MS_DT_F4: {
        static const int8_t k_e2m1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
        uint8_t b = ((const uint8_t *)w->data)[r * (w->cols / 2) + c / 2];
        return k_e2m1x2[(c & 1) ? b >> 4 : b & 15];
    }
    case MS_DT_I4: {
        uint8_t b = ((const uint8_t *)w->data)[r * (w->cols / 2) + c / 2];
        return (int)((c & 1) ? b >> 4 : b & 15) - ms_i4_zero(w, r, c / w->bcol);
    }
    case MS_DT_Q8: return ((const int8_t *)w->data)[r * w->cols + c];
    default: return 0;
    }
}

static float ws_at(const ms_qmat *w, int64_t r, int64_t b) {
    if (w->dtype == MS_DT_F4) return 0.5f * (w->scale ? mm_scale_at(w, r / w->brow, b) : 1.0f);
    return mm_scale_at(w, r, b * 32 / w->bcol);
}

static void gemv_scalar(const ms_qmat *w, const qk_act *a, float *y, int64_t r0, int64_t r1, int acc) {
    const int64_t nb = w->cols / 32;
    const qk_layout lay = ms_qk_layout(w);
    for (int64_t r = r0; r < r1; r++) {
        float s = 0;
        for (int64_t b = 0; b < nb; b++) {
            int32_t dot = 0;
            for (int j = 0; j < 32; j++) {
                int64_t p = qk_pos(b, j, 1, lay);
                dot += wq_at(w, r, b * 32 + j) * (a->q2 ? 256 * a->q[p] + a->q2[p] : a->q[p]);
            }
            s += ws_at(w, r, b) * a->d[b] * (float)dot;
        }
        y[r] = acc ? y[r] + s : s;
    }
}

const qk_kernels ms_qk_scalar = {.gb = 1, .gemv = gemv_scalar};

const qk_kernels *ms_qk_for(ms_cpu_isa isa) {
    switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case MS_ISA_AVX512_VNNI: return &ms_qk_avx512vnni;
    case MS_ISA_AVX512: return &ms_qk_avx512;
    case MS_ISA_AVX_VNNI: return &ms_qk_avxvnni;
    case MS_ISA_AVX2: return &ms_qk_avx2;
#endif
    default: return &ms_qk_scalar;
    }
}
