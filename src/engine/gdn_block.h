/* gdn_block.h — one gated DeltaNet token mixer (Qwen3-Next's linear
 * attention): fused projections, one causal depthwise convolution over
 * [q | k | v], per-head decay gate, delta rule with grouped q/k heads, gated
 * RMSNorm with SiLU(z), out_proj; with the decode state it carries. The math
 * is in ops/kda.h (the gated DeltaNet is its per-head-decay form).
 *
 * Per token, with Hk key heads, Hv value heads (r = Hv / Hk), dk, dv:
 *   in_proj_qkvz x: per key head g, [q (dk), k (dk), v (r*dv), z (r*dv)];
 *                   value head h = g*r + j takes the j-th dv slice of group g
 *   in_proj_ba x:   per key head g, [b (r), a (r)]
 *   (or split, Qwen3.5: in_proj_qkv x = [q all heads | k all heads | v all heads],
 *    in_proj_z x, in_proj_b x, in_proj_a x, each head-major)
 *   [q|k|v] = silu(conv1d over time) (channels: all q heads, all k heads, all v heads)
 *   beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)
 *   o = delta rule (q, k L2-normalised, q scaled by dk^-0.5; v head h reads qk head h / r)
 *   out = out_proj(rmsnorm(o) * norm_w * silu(z))     (norm_w plain, not 1 + w)
 *
 * The input is the layer's normalised hidden rows; the output is what the
 * residual adds. Weights are ms_qmat views in their stored dtype. This header
 * is what the model sees (config, weights); the CPU implementation is
 * backend/cpu/gdn_block.c. */
#ifndef MS_GDN_BLOCK_H
#define MS_GDN_BLOCK_H

#include <stdint.h>

#include "engine/kda_block.h"
#include "model/blocks.h"
#include "ops/kda.h"

typedef struct ms_gdn_config {
    int hidden;          /* model width */
    int k_heads, v_heads; /* Hk, Hv (Hv a multiple of Hk) */
    int k_dim, v_dim;    /* dk, dv (1..1024) */
    int conv_kernel;     /* 1..16 */
    float norm_eps;      /* gated RMSNorm epsilon (rms_norm_eps) */
} ms_gdn_config;

/* True when w holds the split projections (in_qkv, in_z, in_b, in_a) rather
 * than the fused in_qkvz / in_ba. */
static inline int ms_gdn_split(const ms_gdn_weights *w) { return !w->in_qkvz.data && w->in_qkv.data; }

/* Check cfg and every weight's presence and shape (either projection layout). Errors: MS_ERR_ARG
 * (config), MS_ERR_SHAPE / MS_ERR_UNSUPPORTED naming the weight. */
int ms_gdn_check(const ms_gdn_config *cfg, const ms_gdn_weights *w, ms_err *err);

/* The decode state is an ms_kda_state (conv: [C][K-1] with C = 2*Hk*dk +
 * Hv*dv; S: [Hv][dk][dv]), element counts: */
static inline void ms_gdn_state_lens(const ms_gdn_config *c, int64_t *conv_len, int64_t *S_len) {
    *conv_len = (2 * (int64_t)c->k_heads * c->k_dim + (int64_t)c->v_heads * c->v_dim) * (c->conv_kernel - 1);
    *S_len = (int64_t)c->v_heads * c->k_dim * c->v_dim;
}
/* Bytes of that state (for memory plans). */
uint64_t ms_gdn_state_bytes(const ms_gdn_config *cfg);

/* The forward is a backend op (core/backend.h gdn_forward; the CPU
 * implementation: backend/cpu/gdn_block.c, declared in backend/cpu/linear_attn.h). */

#endif
