/* linear_attn.h — the CPU implementation of the linear-attention token mixers
 * (KDA: kda_block.c, gated DeltaNet: gdn_block.c) behind the backend's
 * kda_forward / gdn_forward ops, and host-memory state helpers for callers
 * that run them directly (benchmarks, unit tests). Config, weights and the
 * state struct: engine/kda_block.h, engine/gdn_block.h. */
#ifndef MS_LINEAR_ATTN_H
#define MS_LINEAR_ATTN_H

#include "engine/gdn_block.h"
#include "engine/kda_block.h"
#include "util/threadpool.h"

/* Allocate a zeroed host state for cfg (free with ms_kda_state_free). MS_ERR_NOMEM. */
int ms_kda_state_init(ms_kda_state *st, const ms_kda_config *cfg, ms_err *err);
void ms_kda_state_reset(ms_kda_state *st);
void ms_kda_state_free(ms_kda_state *st);
/* The same for a gated DeltaNet layer (reset / free with ms_kda_state_*).
 * Errors: MS_ERR_ARG, MS_ERR_NOMEM. */
int ms_gdn_state_init(ms_kda_state *st, const ms_gdn_config *cfg, ms_err *err);

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

/* out[n, hidden] = the gated DeltaNet mixer over x[n, hidden] (n >= 1 tokens
 * following what st has seen), updating st. Slices of at most 1024 tokens
 * bound the scratch; mode as for KDA. out may not alias x. Errors: as
 * ms_gdn_check, MS_ERR_ARG (state of another config), MS_ERR_NOMEM. */
int ms_gdn_forward(ms_pool *pool, const ms_gdn_config *cfg, const ms_gdn_weights *w, ms_kda_state *st, const float *x,
                   int n, float *out, ms_kda_mode mode, ms_err *err);

#endif
