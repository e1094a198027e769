/* ops.h — the CPU compute primitives every architecture is built from.
 *
 * Activations are F32, row-major. Weights are ms_qmat views onto the
 * checkpoint's bytes in their stored dtype; kernels dequantize on the fly.
 * Shapes are given as [tokens, features] unless stated. Every function that
 * takes a pool may split work across it; a NULL pool runs single-threaded. */
#ifndef MS_OPS_H
#define MS_OPS_H

#include <stdint.h>

#include "util/dtype.h"
#include "core/qmat.h"
#include "util/threadpool.h"

/* y[t, r] = sum_c w[r, c] * x[t, c] for t < n. y is [n, w->rows], x is [n, w->cols].
 * Rows are split across the pool. */
void ms_matmul(ms_pool *pool, float *y, const float *x, int n, const ms_qmat *w);
/* Same, accumulating: y += w x. */
void ms_matmul_acc(ms_pool *pool, float *y, const float *x, int n, const ms_qmat *w);
/* Several matmuls in one pool run (one barrier instead of one per matmul: the
 * routed experts of a decode step, gate and up projections of one input, ...).
 * Same result as calling ms_matmul (acc 0) / ms_matmul_acc (acc 1) on each job
 * in order, provided no job's y overlaps another job's y or x. */
typedef struct ms_matmul_job {
    float *y;
    const float *x;
    int n;
    const ms_qmat *w;
    int acc;
} ms_matmul_job;
void ms_matmul_many(ms_pool *pool, const ms_matmul_job *jobs, int count);
/* Scalar reference (single-threaded, no SIMD): the twin every fast kernel is tested against. */
void ms_matmul_ref(float *y, const float *x, int n, const ms_qmat *w);

/* y[i] = x[i] / sqrt(mean(x^2) + eps) * (w ? w[i] : 1) for each of n rows of d. w: F32 view.
 * y may equal x. Vectorized (backend/cpu/ops_fast.c); ms_rmsnorm_ref is the scalar twin. */
void ms_rmsnorm(float *y, const float *x, const float *w, int n, int d, float eps);
void ms_rmsnorm_ref(float *y, const float *x, const float *w, int n, int d, float eps);
/* LayerNorm with optional weight and bias (F32). */
void ms_layernorm(float *y, const float *x, const float *w, const float *b, int n, int d, float eps);
/* In-place numerically stable softmax over d (vectorized; ms_softmax_ref is the scalar twin). */
void ms_softmax(float *x, int d);
void ms_softmax_ref(float *x, int d);
static inline float ms_silu(float x);
/* out[i] = silu(gate[i]) * up[i]; out may equal gate or up (vectorized; ms_swiglu_ref is the scalar twin). */
void ms_swiglu(float *out, const float *gate, const float *up, int64_t n);
void ms_swiglu_ref(float *out, const float *gate, const float *up, int64_t n);
/* sum_i a[i] * b[i] (F32 accumulation in vector lanes), e.g. a query against a cached key. */
float ms_dot(const float *a, const float *b, int64_t n);
float ms_dot_ref(const float *a, const float *b, int64_t n);
/* y[i] += a * x[i], e.g. accumulating a weighted cached value. */
void ms_axpy(float *y, float a, const float *x, int64_t n);
void ms_axpy_ref(float *y, float a, const float *x, int64_t n);
/* SiTU gated activation (Kimi K3), in F32: out[i] = beta tanh(gate[i]/beta) sigmoid(gate[i])
 * * u, u = linear_beta tanh(up[i]/linear_beta) when linear_beta > 0, else up[i]. beta > 0.
 * out may alias gate or up (ops/act.c). */
void ms_situ_glu(float *out, const float *gate, const float *up, int64_t n, float beta, float linear_beta);
/* Parameterized SwiGLU in F32, in place: with limit > 0, g[i] = min(g[i], limit) and u[i] clamped to
 * [-limit, limit] (u is modified; NaN stays NaN, as torch.clamp), then
 * g[i] = (u[i] + up_offset) * g[i] * sigmoid(alpha * g[i]). alpha = 1, up_offset = 0 runs ms_swiglu
 * (silu(g) * u) exactly; gpt-oss's experts use alpha 1.702, up_offset 1. */
void ms_swiglu_param(float *g, float *u, int64_t n, float limit, float alpha, float up_offset);

#include <math.h>
static inline float ms_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float ms_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

#endif
