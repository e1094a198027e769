/* kernels.h — internal to src/backend/cpu: the per-ISA kernel table the
 * dispatchers (matmul.c, ops_fast.c) call through. Not a public interface. */
#ifndef MS_BACKEND_CPU_KERNELS_H
#define MS_BACKEND_CPU_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "ops/ops.h"

/* Rows of a dequantized tile (the tile buffer is MM_RB x MM_KC floats). */
#define MM_RB 16
#define MM_KC 2048
/* FP8 decode kernels take x * 2^64 so that value * 2^-120 weight reads never underflow. */
#define MM_F8_XSCALE 0x1p64f

typedef struct mm_kernels {
    /* Whether gemv handles w (dtype and scale layout); otherwise the tile path is used for n == 1 too. */
    int (*gemv_ok)(const ms_qmat *w);
    /* n == 1: y[r] = (acc ? y[r] : 0) + dot(row r of w, x) for r in [r0, r1).
     * For F8_E4M3 weights x must be given pre-multiplied by MM_F8_XSCALE. */
    void (*gemv)(const ms_qmat *w, const float *x, float *y, int64_t r0, int64_t r1, int acc);
    /* Dequantize rows [r0, r0+nr) x cols [c0, c0+kc) of w (scales applied) into
     * buf[i * ld + k]. nr <= MM_RB, kc <= MM_KC; c0 and kc are multiples of 32
     * except at the end of a row. */
    void (*dequant)(const ms_qmat *w, int64_t r0, int nr, int64_t c0, int kc, float *buf, int ld);
    /* y[t*ldy + r] = (acc ? y : 0) + sum_k buf[r*ld + k] * x[t*ldx + k] for r < nr, t < nt, k < kc. */
    void (*tile)(const float *buf, int ld, int nr, const float *x, int64_t ldx, int nt, int kc, float *y,
                 int64_t ldy, int acc);
    /* Optional (NULL: none): floats of scratch gemv wants x rewritten into for w (0: none),
     * and the rewrite (x[w->cols] -> xs); gemv then gets xs in place of x. F8 is not done this
     * way (matmul.c pre-scales x for every table). */
    int64_t (*x_need)(const ms_qmat *w);
    void (*x_prep)(const ms_qmat *w, const float *x, float *xs);
    /* Vector primitives (see ops.h for contracts). */
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n);
    void (*rmsnorm)(float *y, const float *x, const float *w, int n, int d, float eps);
    void (*softmax)(float *x, int d);
    void (*swiglu)(float *out, const float *gate, const float *up, int64_t n);
} mm_kernels;

extern const mm_kernels ms_kernels_scalar;
extern const mm_kernels ms_kernels_avx2;
extern const mm_kernels ms_kernels_avx512;
/* avx512 with the BF16 matvec on vdpbf16ps against BF16-rounded x (MS_ACT_BF16 on a CPU
 * with AVX512_BF16); every other kernel is avx512's. */
extern const mm_kernels ms_kernels_avx512bf16;

/* The table for the process's ISA (initializes dispatch on first use), for
 * the kernels run on `pool` (cpu.h ms_cpu_isa_of), and for one ISA (which
 * the CPU must support). */
const mm_kernels *ms_cpu_kernels(void);
const mm_kernels *ms_cpu_kernels_of(const ms_pool *pool);
const mm_kernels *ms_cpu_kernels_for(ms_cpu_isa isa);
/* The matmul table for `pool`: ms_cpu_kernels_of, or ms_kernels_avx512bf16 when its
 * activations include BF16, its ISA is an AVX-512 level and the CPU has AVX512_BF16. */
const mm_kernels *ms_cpu_mm_kernels_of(const ms_pool *pool);

/* Scale of block (sr, sc) of w as F32 (1 when w has no scale). */
static inline float mm_scale_at(const ms_qmat *w, int64_t sr, int64_t sc) {
    if (!w->scale) return 1.0f;
    int64_t ncol = (w->cols + w->bcol - 1) / w->bcol;
    int64_t i = sr * ncol + sc;
    switch (w->scale_dtype) {
    case MS_DT_F32: return ((const float *)w->scale)[i];
    case MS_DT_BF16: return ms_bf16_to_f32(((const uint16_t *)w->scale)[i]);
    case MS_DT_F16: return ms_f16_to_f32(((const uint16_t *)w->scale)[i]);
    case MS_DT_F8_E8M0:
    case MS_DT_U8: {
        uint8_t e = ((const uint8_t *)w->scale)[i];
        uint32_t u = e == 0xff ? 0x7fc00000u : e == 0 ? 0x00400000u : (uint32_t)e << 23;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: return NAN;
    }
}

/* Vector ops per ISA (ops_fast.c), referenced from the tables. */
float ms_k512_dot(const float *a, const float *b, int64_t n);
void ms_k512_axpy(float *y, float a, const float *x, int64_t n);
void ms_k512_rmsnorm(float *y, const float *x, const float *w, int n, int d, float eps);
void ms_k512_softmax(float *x, int d);
void ms_k512_swiglu(float *out, const float *gate, const float *up, int64_t n);
float ms_k256_dot(const float *a, const float *b, int64_t n);
void ms_k256_axpy(float *y, float a, const float *x, int64_t n);
void ms_k256_rmsnorm(float *y, const float *x, const float *w, int n, int d, float eps);
void ms_k256_softmax(float *x, int d);
void ms_k256_swiglu(float *out, const float *gate, const float *up, int64_t n);

/* Scalar dequantization of rows [r0, r0+nr) x cols [c0, c0+kc) (any dtype, any
 * scale layout) into buf[i*ld + k]; the fallback every ISA may call. */
void mm_dequant_scalar(const ms_qmat *w, int64_t r0, int nr, int64_t c0, int kc, float *buf, int ld);

#endif
