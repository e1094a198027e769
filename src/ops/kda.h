/* kda.h — gated delta-rule linear attention: Kimi Delta Attention (KDA,
 * per-channel decay) and the gated DeltaNet (one decay per head), as F32 ops.
 *
 * The layer around these ops (projections, o_proj) is matmuls the caller
 * does. One KDA layer, per token t and value head h (qk head hq = h / (Hv/Hk)):
 *
 *   q,k,v   = silu(causal depthwise conv over time of the projections)   ms_short_conv
 *   g[t,h]  = log decay per key channel (or per head)                     ms_decay_gate
 *             softplus:    -exp(A_log[h]) * softplus(f + dt_bias)
 *             lower bound: lb * sigmoid(exp(A_log[h]) * (f + dt_bias))    (Kimi K3)
 *   beta    = sigmoid(b)                                                  ms_sigmoid_inplace
 *   q,k     = x / sqrt(sum x^2 + eps) (eps 1e-6); q *= scale (1/sqrt(dk))
 *   S       = diag(exp g_t) S                       S: [Hv, dk, dv] F32
 *   S      += k (beta (v - S^T k))^T                (delta rule)
 *   o       = S^T q                                 ms_delta_recurrent / ms_delta_chunked
 *   out     = rmsnorm(o) * w * sigmoid(gate)        ms_gated_rmsnorm (gate: low-rank
 *             g_b(g_a(x)) in Kimi Linear, full-rank g_proj(x) in Kimi K3, silu in Qwen3-Next)
 *
 * The chunked form (WY representation, chunks of `chunk` tokens) gives the same
 * result as stepping token by token, up to F32 rounding; every decay factor
 * it uses is a product of per-step factors exp(g) <= 1, so strong decays
 * cannot overflow. Heads are split across the pool; the pool's ISA
 * (backend/cpu/cpu.h ms_cpu_set_isa) picks the AVX2 or the portable kernels. */
#ifndef MS_KDA_H
#define MS_KDA_H

#include <stdint.h>

#include "ops/ops.h"
#include "util/err.h"

/* ---- causal depthwise short convolution with carried state ---- */

/* y[t, c] = act(sum_{j<K} w[c, j] * x[t - (K-1) + j, c]) for t < n, c < channels,
 * where inputs before t = 0 come from state (the previous K-1 inputs of each
 * channel, oldest first; zeros for a fresh sequence). On return state holds
 * the last K-1 inputs (of state ++ x), ready for the next call; n = 1 is the
 * decode step. x: [n, ld_x] (channel c at x[t*ld_x + c]); y: [n, ld_y]; y may
 * be x (same ld) for an in-place update. w: [channels, K] elements of any
 * dtype ms_to_f32 reads (a [channels, 1, K] conv1d weight is the same bytes),
 * w->rows == channels and w->cols == K. state: [channels, K-1] F32.
 * silu: 1 applies SiLU (Kimi's ShortConvolution / hidden_act "silu"), 0 none.
 * Errors: MS_ERR_ARG / MS_ERR_SHAPE for bad sizes, K outside 1..16. */
int ms_short_conv(ms_pool *pool, float *y, int64_t ld_y, const float *x, int64_t ld_x, int n, int channels,
                  const ms_qmat *w, float *state, int silu, ms_err *err);

/* ---- forget gate and beta ---- */

typedef enum ms_decay_kind {
    MS_DECAY_SOFTPLUS = 0,    /* -exp(A_log[h]) * softplus(f + dt_bias); softplus(x) = x for x > 20 */
    MS_DECAY_LOWER_BOUND = 1, /* lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias)) */
} ms_decay_kind;

/* In place over f: [n, ld] rows, each holding heads * width values at
 * f[t*ld + h*width + c] (width = dk for KDA's per-channel decay, 1 for the
 * gated DeltaNet's per-head decay), replaced by the log decay g above.
 * A_log: exactly `heads` elements (the caller strips any zero padding; NULL
 * means A = 1, allowed only with MS_DECAY_LOWER_BOUND). dt_bias: heads*width
 * elements or NULL. Computation in F32 as the references do (softplus as
 * transformers writes it: x > 20 ? x : log(1 + exp(x))); rows split across the pool.
 * Errors: MS_ERR_ARG / MS_ERR_SHAPE. */
int ms_decay_gate(ms_pool *pool, float *f, int64_t ld, int n, int heads, int width, const ms_qmat *A_log,
                  const ms_qmat *dt_bias, ms_decay_kind kind, float lower_bound, ms_err *err);

/* x[t*ld + i] = sigmoid(x[t*ld + i]) for t < n, i < width (beta = sigmoid(b_proj x)). */
void ms_sigmoid_rows(float *x, int64_t ld, int n, int width);

/* ---- the delta rule ---- */

/* Inputs of one call over n tokens. Token t of head h reads
 *   q[t*ld_q + hq*dk .. +dk), k likewise, v[t*ld_v + h*dv ..), beta[t*ld_beta + h],
 *   g[t*ld_g + h*dk ..) (per-channel) or g[t*ld_g + h] (g_per_head),
 * and writes o[t*ld_o + h*dv .. +dv). q, k are left unchanged (normalisation
 * and scaling happen on copies). */
typedef struct ms_delta_args {
    int n;                 /* tokens, >= 1 */
    int n_qk_heads;        /* heads of q and k (Hk) */
    int n_v_heads;         /* heads of v, g, beta, o and the state (Hv, a multiple of Hk) */
    int dk, dv;            /* head sizes, 1..1024 */
    const float *q, *k, *v, *g, *beta;
    int64_t ld_q, ld_k, ld_v, ld_g, ld_beta;
    int g_per_head;        /* 1: g holds one log decay per (token, head); 0: dk per head */
    int qk_l2norm;         /* 1: q, k <- x / sqrt(sum x^2 + l2_eps) first */
    float l2_eps;          /* 1e-6 in the references */
    float scale;           /* q multiplier after normalisation (dk^-0.5 in the references) */
    float *o;
    int64_t ld_o;
} ms_delta_args;

/* Token-by-token recurrence (the defined result; the decode path with n = 1).
 * state: [Hv, dk, dv] F32, S[h][i][j] = state[(h*dk + i)*dv + j]; read as the
 * initial state (zeros for a fresh sequence) and overwritten with the final one.
 * Errors: MS_ERR_ARG for inconsistent sizes/strides (nothing is written). */
int ms_delta_recurrent(ms_pool *pool, const ms_delta_args *a, float *state, ms_err *err);

/* The same result by the chunked (WY/UT-transform) form over chunks of `chunk`
 * tokens (1..256; 64 is the usual choice); the last chunk may be shorter.
 * Same state contract as ms_delta_recurrent. Errors: as ms_delta_recurrent,
 * MS_ERR_NOMEM when scratch cannot be allocated. */
int ms_delta_chunked(ms_pool *pool, const ms_delta_args *a, float *state, int chunk, ms_err *err);

/* Scalar single-threaded reference twin of ms_delta_recurrent (no SIMD), for tests. */
int ms_delta_recurrent_ref(const ms_delta_args *a, float *state, ms_err *err);

/* ---- gated RMSNorm on the output ---- */

typedef enum ms_gate_act { MS_GATE_SIGMOID = 0, MS_GATE_SILU = 1 } ms_gate_act;

/* For each of rows rows of d values (x[r*d ..], gate[r*d ..], y[r*d ..]; a
 * token's heads are consecutive rows):
 *   y = x / sqrt(mean(x^2) + eps) * w * act(gate)
 * w: d elements (any dtype ms_to_f32 reads), or NULL for ones. y may be x.
 * Errors: MS_ERR_ARG / MS_ERR_SHAPE. */
int ms_gated_rmsnorm(float *y, const float *x, const float *gate, int64_t rows, int d, const ms_qmat *w, float eps,
                     ms_gate_act act, ms_err *err);

#endif
