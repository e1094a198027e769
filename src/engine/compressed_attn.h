/* compressed_attn.h — a compressed-attention layer (DeepSeek-V4's
 * CSA / HCA blocks, transformers 5.17 DeepseekV4Attention): shared-KV MQA over
 * a sliding window of per-token keys plus compressed KV entries, one per
 * window of `rate` tokens. HCA pools each window; CSA pools overlapping pairs
 * of windows and lets a lightning indexer pick index_topk entries per query.
 * The pooling math is ms_compress_pool (ops/compress.h); the layer itself runs
 * in engine/compressed_attn.c. */
#ifndef MS_COMPRESSED_ATTN_H
#define MS_COMPRESSED_ATTN_H

#include "model/blocks.h" /* ms_compressor_weights, ms_cattn_weights */
#include "ops/ops.h"

#endif
