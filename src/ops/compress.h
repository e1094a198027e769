/* compress.h — KV window compression (DeepSeek-V4 compressors, transformers
 * 5.17 DeepseekV4HCACompressor / DeepseekV4CSACompressor / DeepseekV4Indexer).
 *
 * A window of `rate` consecutive tokens becomes one entry of `dim` channels.
 * Each token row carries w*dim projected values kv and gate logits gate (w = 1
 * plain, w = 2 overlapping); ape [rate, w*dim] is added to the gate logits by
 * slot. Plain: slots are the window's rows, channel c of row r: kv[r][c],
 * gate[r][c] + ape[r][c]. Overlapping: 2*rate slots, first the previous
 * window's rows' first halves (kv[r][c], gate[r][c] + ape[r][c], absent for the
 * first window), then this window's rows' second halves (kv[r][dim + c],
 * gate[r][dim + c] + ape[r][dim + c]). Per channel, the entry is the softmax
 * (over the slots) of the gate logits weighting kv, then RMSNorm with weight
 * norm [dim] and eps. RoPE is the caller's. */
#ifndef MS_COMPRESS_H
#define MS_COMPRESS_H

#include "util/err.h"

/* cur_kv, cur_gate: [rate, w*dim] rows of this window; prev_kv, prev_gate: the
 * previous window's rows (overlapping only; NULL for the first window). out:
 * [dim]. Errors: MS_ERR_ARG (rate < 1, dim < 1, missing arrays). */
int ms_compress_pool(const float *cur_kv, const float *cur_gate, const float *prev_kv, const float *prev_gate,
                     const float *ape, const float *norm, int rate, int dim, int overlap, float eps, float *out,
                     ms_err *err);

#endif
