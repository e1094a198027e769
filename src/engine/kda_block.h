/* kda_block.h — one Kimi Delta Attention (KDA) token mixer: projections, short
 * convolutions, decay gate, delta rule, gated RMSNorm, o_proj, with the
 * decode state it carries (see ops/kda.h for the math).
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
 * convolutions and the F32 recurrent state. All zeros = a fresh sequence. */
typedef struct ms_kda_state {
    float *conv;  /* [3][H*d][K-1]: q, k, v */
    float *S;     /* [H][d][d] */
    int64_t conv_len, S_len; /* element counts */
} ms_kda_state;

/* Check cfg and that every weight the config needs is present with its
 * shape. Errors: MS_ERR_ARG (config), MS_ERR_SHAPE naming the weight. */
int ms_kda_check(const ms_kda_config *cfg, const ms_kda_weights *w, ms_err *err);

/* Allocate a zeroed state for cfg (free with ms_kda_state_free). MS_ERR_NOMEM. */
int ms_kda_state_init(ms_kda_state *st, const ms_kda_config *cfg, ms_err *err);
void ms_kda_state_reset(ms_kda_state *st);
void ms_kda_state_free(ms_kda_state *st);

typedef enum ms_kda_mode {
    MS_KDA_AUTO = 0,      /* chunked for n > 1, recurrent for n = 1 */
    MS_KDA_CHUNKED = 1,   /* chunked form for every call */
    MS_KDA_RECURRENT = 2, /* token-by-token recurrence for every call */
} ms_kda_mode;

/* out[n, hidden] = the KDA mixer over x[n, hidden] (n >= 1 new tokens that
 * follow whatever st has seen), updating st. Work is done in slices of at most
 * 1024 tokens so scratch stays bounded; out may not alias x.
 * Errors: as ms_kda_check, MS_ERR_NOMEM. */
int ms_kda_forward(ms_pool *pool, const ms_kda_config *cfg, const ms_kda_weights *w, ms_kda_state *st,
                   const float *x, int n, float *out, ms_kda_mode mode, ms_err *err);

#endif
