/* ops_ref.c — portable scalar implementations (the reference twins). */
#include <math.h>
#include <string.h>

#include "ops/ops.h"

uint64_t ms_qmat_bytes(const ms_qmat *w) {
    uint64_t n = (uint64_t)w->rows * (uint64_t)w->cols;
    uint64_t b = n * (uint64_t)ms_dtype_bits(w->dtype) / 8;
    if (w->scale) {
        uint64_t sr = (uint64_t)((w->rows + w->brow - 1) / w->brow), sc = (uint64_t)((w->cols + w->bcol - 1) / w->bcol);
        b += sr * sc * (uint64_t)ms_dtype_bits(w->scale_dtype) / 8;
    }
    if (w->dtype == MS_DT_I4 && w->zero && w->bcol > 0)
        b += (uint64_t)((w->rows + 7) / 8) * (uint64_t)((w->cols + w->bcol - 1) / w->bcol) * 4;
    return b;
}

static inline float scale_at(const ms_qmat *w, int64_t sr, int64_t sc) {
    int64_t ncol = (w->cols + w->bcol - 1) / w->bcol;
    int64_t i = sr * ncol + sc;
    switch (w->scale_dtype) {
    case MS_DT_F32: return ((const float *)w->scale)[i];
    case MS_DT_BF16: return ms_bf16_to_f32(((const uint16_t *)w->scale)[i]);
    case MS_DT_F16: return ms_f16_to_f32(((const uint16_t *)w->scale)[i]);
    case MS_DT_F8_E8M0:
    case MS_DT_U8: return ms_e8m0_to_f32(((const uint8_t *)w->scale)[i]);
    default: return NAN;
    }
}

void ms_to_f32(float *out, const void *src, ms_dtype dt, int64_t n) {
    switch (dt) {
    case MS_DT_F32: memcpy(out, src, (size_t)n * 4); break;
    case MS_DT_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = ms_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case MS_DT_F16:
        for (int64_t i = 0; i < n; i++) out[i] = ms_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case MS_DT_F8_E4M3:
        for (int64_t i = 0; i < n; i++) out[i] = ms_fp8_e4m3_to_f32(((const uint8_t *)src)[i]);
        break;
    default:
        for (int64_t i = 0; i < n; i++) out[i] = NAN;
    }
}

int ms_qmat_row_range(const ms_qmat *w, int64_t r0, int64_t nrows, ms_qmat *out) {
    if (r0 < 0 || nrows < 0 || r0 + nrows > w->rows) return 0;
    if (w->scale && r0 % w->brow) return 0;
    if (w->dtype == MS_DT_I4 && w->zero && r0 % 8) return 0;
    *out = *w;
    out->rows = nrows;
    out->data = (const uint8_t *)w->data + (size_t)((uint64_t)r0 * (uint64_t)w->cols * (uint64_t)ms_dtype_bits(w->dtype) / 8);
    if (w->scale) {
        int64_t ncol = (w->cols + w->bcol - 1) / w->bcol;
        out->scale = (const uint8_t *)w->scale + (size_t)((r0 / w->brow) * ncol * (ms_dtype_bits(w->scale_dtype) / 8));
    }
    if (w->dtype == MS_DT_I4 && w->zero) out->zero = (const uint32_t *)w->zero + (r0 / 8) * ((w->cols + w->bcol - 1) / w->bcol);
    return 1;
}

void ms_qmat_row(const ms_qmat *w, int64_t r, float *out) {
    int64_t C = w->cols;
    switch (w->dtype) {
    case MS_DT_F32:
    case MS_DT_BF16:
    case MS_DT_F16:
        ms_to_f32(out, (const uint8_t *)w->data + (size_t)(r * C * (ms_dtype_bits(w->dtype) / 8)), w->dtype, C);
        break;
    case MS_DT_F8_E4M3: { /* one scale per block of bcol columns (the same products as per value) */
        const uint8_t *row = (const uint8_t *)w->data + r * C;
        const int64_t bc = w->scale ? w->bcol : C;
        for (int64_t c0 = 0; c0 < C; c0 += bc) {
            const float s = w->scale ? scale_at(w, r / w->brow, c0 / w->bcol) : 1.0f;
            for (int64_t c = c0; c < C && c < c0 + bc; c++) out[c] = ms_fp8_e4m3_to_f32(row[c]) * s;
        }
        break;
    }
    case MS_DT_Q8: {
        const int8_t *row = (const int8_t *)w->data + r * C;
        for (int64_t c0 = 0; c0 < C; c0 += w->bcol) {
            const float s = scale_at(w, r / w->brow, c0 / w->bcol);
            for (int64_t c = c0; c < C && c < c0 + w->bcol; c++) out[c] = (float)row[c] * s;
        }
        break;
    }
    case MS_DT_I4: {
        /* the little-endian bytes of the int32 words: low nibble = even column, value u - uz */
        const uint8_t *row = (const uint8_t *)w->data + r * (C / 2);
        for (int64_t c = 0; c < C; c += 2) {
            uint8_t b = row[c / 2];
            out[c] = (float)((int)(b & 15) - ms_i4_zero(w, r, c / w->bcol)) * scale_at(w, r / w->brow, c / w->bcol);
            out[c + 1] = (float)((int)(b >> 4) - ms_i4_zero(w, r, (c + 1) / w->bcol)) *
                         scale_at(w, r / w->brow, (c + 1) / w->bcol);
        }
        break;
    }
    case MS_DT_F4: {
        const uint8_t *row = (const uint8_t *)w->data + r * (C / 2);
        for (int64_t c = 0; c < C; c += 2) {
            float s = scale_at(w, r / w->brow, c / w->bcol);
            uint8_t b = row[c / 2];
            out[c] = ms_fp4_e2m1_table[b & 15] * s;
            out[c + 1] = ms_fp4_e2m1_table[b >> 4] * s;
        }
        break;
    }
    default:
        for (int64_t c = 0; c < C; c++) out[c] = NAN;
    }
}

/* the smallest BF16 value >= f (f >= 0 finite); NaN stays NaN */
static uint16_t bf16_up(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f)) return 0x7fc0;
    uint16_t h = (uint16_t)(u >> 16);
    return (u & 0xffffu) ? (uint16_t)(h + 1) : h;
}

static float block_amax(const float *x, int64_t n) {
    float a = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = fabsf(x[i]);
        if (!(v <= a)) a = v; /* NaN sticks */
        if (isnan(a)) break;
    }
    return isinf(a) ? NAN : a;
}

void ms_quant_q8_row(const float *x, int64_t n, int8_t *q, uint16_t *scale) {
    for (int64_t b0 = 0, bi = 0; b0 < n; b0 += MS_Q8_BLOCK, bi++) {
        int64_t len = n - b0 < MS_Q8_BLOCK ? n - b0 : MS_Q8_BLOCK;
        uint16_t s = bf16_up(block_amax(x + b0, len) / 127.0f);
        scale[bi] = s;
        float d = ms_bf16_to_f32(s);
        for (int64_t i = 0; i < len; i++) {
            float v = d > 0 ? roundf(x[b0 + i] / d) : 0.0f;
            q[b0 + i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : isnan(v) ? 0 : v);
        }
    }
}

void ms_quant_fp8_row(const float *x, int64_t n, uint8_t *q, uint16_t *scale) {
    for (int64_t b0 = 0, bi = 0; b0 < n; b0 += MS_Q8_BLOCK, bi++) {
        int64_t len = n - b0 < MS_Q8_BLOCK ? n - b0 : MS_Q8_BLOCK;
        uint16_t s = bf16_up(block_amax(x + b0, len) / 448.0f);
        scale[bi] = s;
        float d = ms_bf16_to_f32(s);
        for (int64_t i = 0; i < len; i++) q[b0 + i] = d > 0 ? ms_f32_to_fp8_e4m3(x[b0 + i] / d) : 0;
    }
}

void ms_quant_i4_row(const float *x, int64_t n, int group, int32_t *packed, uint16_t *scale) {
    memset(packed, 0, (size_t)(n / 8) * sizeof *packed);
    for (int64_t g0 = 0, gi = 0; g0 < n; g0 += group, gi++) {
        int64_t len = n - g0 < group ? n - g0 : group;
        uint16_t s = ms_f32_to_bf16(block_amax(x + g0, len) / 7.5f);
        scale[gi] = s;
        float d = ms_bf16_to_f32(s);
        for (int64_t i = 0; i < len; i++) {
            float v = d > 0 ? nearbyintf(x[g0 + i] / d) : 0.0f;
            int q = v > 7 ? 7 : v < -8 ? -8 : isnan(v) ? 0 : (int)v;
            int64_t c = g0 + i;
            packed[c / 8] |= (int32_t)((uint32_t)(q + 8) << (4 * (c % 8)));
        }
    }
}

void ms_quant_i4z_row(const float *x, int64_t n, int group, int32_t *packed, uint16_t *scale, int8_t *zp) {
    memset(packed, 0, (size_t)(n / 8) * sizeof *packed);
    for (int64_t g0 = 0, gi = 0; g0 < n; g0 += group, gi++) {
        int64_t len = n - g0 < group ? n - g0 : group;
        float lo = 0, hi = 0;
        for (int64_t i = 0; i < len; i++) {
            float v = x[g0 + i];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        uint16_t s = ms_f32_to_bf16((hi - lo) / 15.0f);
        float d = ms_bf16_to_f32(s);
        int z = 0;
        if (d > 0 && isfinite(d)) {
            float zf = nearbyintf(-8.0f - lo / d);
            z = zf > 7 ? 7 : zf < -8 ? -8 : (int)zf;
        }
        scale[gi] = s;
        zp[gi] = (int8_t)z;
        for (int64_t i = 0; i < len; i++) {
            float v = d > 0 && isfinite(d) ? nearbyintf(x[g0 + i] / d) + (float)z : (float)z;
            int q = v > 7 ? 7 : v < -8 ? -8 : isnan(v) ? z : (int)v;
            int64_t c = g0 + i;
            packed[c / 8] |= (int32_t)((uint32_t)(q + 8) << (4 * (c % 8)));
        }
    }
}

void ms_matmul_ref(float *y, const float *x, int n, const ms_qmat *w) {
    float row[w->cols > 0 ? w->cols : 1];
    for (int64_t r = 0; r < w->rows; r++) {
        ms_qmat_row(w, r, row);
        for (int t = 0; t < n; t++) {
            const float *xt = x + (int64_t)t * w->cols;
            double acc = 0;
            for (int64_t c = 0; c < w->cols; c++) acc += (double)row[c] * xt[c];
            y[(int64_t)t * w->rows + r] = (float)acc;
        }
    }
}

void ms_rmsnorm_ref(float *y, const float *x, const float *w, int n, int d, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (int64_t)t * d;
        float *yt = y + (int64_t)t * d;
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)xt[i] * xt[i];
        float inv = (float)(1.0 / sqrt(ss / d + eps));
        for (int i = 0; i < d; i++) yt[i] = xt[i] * inv * (w ? w[i] : 1.0f);
    }
}

void ms_layernorm(float *y, const float *x, const float *w, const float *b, int n, int d, float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (int64_t)t * d;
        float *yt = y + (int64_t)t * d;
        double mean = 0, var = 0;
        for (int i = 0; i < d; i++) mean += xt[i];
        mean /= d;
        for (int i = 0; i < d; i++) var += (xt[i] - mean) * (xt[i] - mean);
        var /= d;
        float inv = (float)(1.0 / sqrt(var + eps));
        for (int i = 0; i < d; i++)
            yt[i] = (float)(xt[i] - mean) * inv * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    }
}

void ms_softmax_ref(float *x, int d) {
    float m = -INFINITY;
    for (int i = 0; i < d; i++) m = x[i] > m ? x[i] : m;
    double s = 0;
    for (int i = 0; i < d; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    float inv = (float)(1.0 / s);
    for (int i = 0; i < d; i++) x[i] *= inv;
}

void ms_swiglu_ref(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = ms_silu(gate[i]) * up[i];
}
