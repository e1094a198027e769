/* attn_mla.h — MLA's absorbed latent attention of one decode token with the keys split over
 * many blocks (attn_mla.cu), called by backend_gpu.cu's attn_mla after q_lat = W_UK^T q_nope. */
#ifndef MS_GPU_ATTN_MLA_H
#define MS_GPU_ATTN_MLA_H

#include <stddef.h>
#include <stdint.h>

#include "backend/gpu/gpu.h"

/* Floats of scratch ms_gpu_mla_decode needs for H heads of latent width lora (any key count:
 * the splits are capped, so the scratch never grows with the context). */
size_t ms_gpu_mla_decode_scratch(int64_t H, int64_t lora);

/* o_lat[h] = softmax_s(scale [q_lat[h], q_pe[h]] . latent[s]) latent[s][:lora] for one query token
 * at position n_past, over the keys 0..n_past (sel NULL) or the sel_count[0] rows sel[0..] of the
 * latent cache (device arrays). pos_dev (device int64, or NULL): the position is *pos_dev, read
 * by the kernel (the replayable step), and n_past an upper bound of it that sizes the grid. q: the token's [H][qk] query (q_pe at nope..qk); latent: the
 * cache rows [lora + rope]; scr: ms_gpu_mla_decode_scratch floats of device memory. Each block
 * takes a split of the keys (a running softmax per warp); the head's last block to arrive
 * merges the splits. lora <= 1024. Enqueued on g's stream. */
int ms_gpu_mla_decode(ms_gpu *g, float *olat, const float *qlat, const float *q, const float *latent,
                      const int32_t *sel, const int32_t *sel_count, int64_t sel_width, int64_t n_past,
                      const int64_t *pos_dev, int64_t H, int64_t lora, int64_t rope, int64_t nope, float scale, float *scr, ms_err *err);

#endif
