/* kda_block.h — one Kimi Delta Attention (KDA) token mixer as the model sees
 * it: its config, weights and decode state (the math: ops/kda.h; the CPU
 * implementation: backend/cpu/kda_block.c). Projections, short convolutions,
 * decay gate, delta rule, gated RMSNorm, o_proj.
 *
 * The input is the layer's normalised hidden rows (after input_layernorm);
 * the output is what the residual adds. Weights are ms_qmat views in their
 * stored dtype; the block never copies them. Variants are config options:
 * the decay gate (softplus, Kimi Linear; lower bound, Kimi K3) and the output
 * gate (low rank g_b(g_a(x)), Kimi Linear; full rank g_proj(x), Kimi K3). */
#ifndef MS_KDA_BLOCK_H
#define MS_KDA_BLOCK_H

#include <stdint.h>

#include "model/blocks.h"
#include "ops/kda.h"

typedef struct ms_kda_config {
    int hidden;          /* model width */
    int heads;           /* KDA heads (q, k and v alike) */
    int head_dim;        /* dk = dv */
    int conv_kernel;     /* short_conv_kernel_size, 1..16 */
    ms_decay_kind decay; /* MS_DECAY_SOFTPLUS or MS_DECAY_LOWER_BOUND */
    float lower_bound;   /* gate_lower_bound when decay is MS_DECAY_LOWER_BOUND */
    int full_rank_gate;  /* 1: g_proj [H*d, hidden]; 0: g_a [d, hidden], g_b [H*d, d] */
    float norm_eps;      /* o_norm epsilon (rms_norm_eps) */
} ms_kda_config;

/* Decode state of one KDA layer: the last K-1 inputs of the three
 * convolutions and the F32 recurrent state. All zeros = a fresh sequence.
 * conv and S are backend memory (the engine allocates them through
 * be->ops->alloc, resets them with zero); this struct only describes them. */
typedef struct ms_kda_state {
    float *conv;  /* [3][H*d][K-1]: q, k, v */
    float *S;     /* [H][d][d] */
    int64_t conv_len, S_len; /* element counts */
} ms_kda_state;

/* Check cfg and that every weight the config needs is present with its
 * shape. Errors: MS_ERR_ARG (config), MS_ERR_SHAPE naming the weight. */
int ms_kda_check(const ms_kda_config *cfg, const ms_kda_weights *w, ms_err *err);

/* Element counts of the state for cfg: conv 3 * H*d * (K-1), S H * d * d. */
static inline void ms_kda_state_lens(const ms_kda_config *c, int64_t *conv_len, int64_t *S_len) {
    *conv_len = 3 * (int64_t)c->heads * c->head_dim * (c->conv_kernel - 1);
    *S_len = (int64_t)c->heads * c->head_dim * c->head_dim;
}

/* The forward itself is a backend op (core/backend.h kda_forward; the CPU
 * implementation and its host-memory state helpers: backend/cpu/linear_attn.h). */

#endif
