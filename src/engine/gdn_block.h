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
 *   [q|k|v] = silu(conv1d over time) (channels: all q heads, all k heads, all v heads)
 *   beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)
 *   o = delta rule (q, k L2-normalised, q scaled by dk^-0.5; v head h reads qk head h / r)
 *   out = out_proj(rmsnorm(o) * norm_w * silu(z))     (norm_w plain, not 1 + w)
 *
 * The input is the layer's normalised hidden rows; the output is what the
 * residual adds. Weights are ms_qmat views in their stored dtype. */
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

/* Check cfg and every weight's presence and shape. Errors: MS_ERR_ARG
 * (config), MS_ERR_SHAPE / MS_ERR_UNSUPPORTED naming the weight. */
int ms_gdn_check(const ms_gdn_config *cfg, const ms_gdn_weights *w, ms_err *err);

/* The decode state is an ms_kda_state (conv: [C][K-1] with C = 2*Hk*dk +
 * Hv*dv; S: [Hv][dk][dv]); reset and free it with ms_kda_state_reset/free.
 * Allocates a zeroed state for cfg. Errors: MS_ERR_ARG, MS_ERR_NOMEM. */
int ms_gdn_state_init(ms_kda_state *st, const ms_gdn_config *cfg, ms_err *err);
/* Bytes of that state (for memory plans). */
uint64_t ms_gdn_state_bytes(const ms_gdn_config *cfg);

/* out[n, hidden] = the mixer over x[n, hidden] (n >= 1 tokens following what
 * st has seen), updating st. Slices of at most 1024 tokens bound the scratch;
 * mode as for KDA (AUTO: chunked for n > 1, recurrent for n = 1). out may not
 * alias x. Errors: as ms_gdn_check, MS_ERR_ARG (state of another config),
 * MS_ERR_NOMEM. */
int ms_gdn_forward(ms_pool *pool, const ms_gdn_config *cfg, const ms_gdn_weights *w, ms_kda_state *st, const float *x,
                   int n, float *out, ms_kda_mode mode, ms_err *err);

#endif
