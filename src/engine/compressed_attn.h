/* compressed_attn.h — weights of a compressed-attention layer (DeepSeek-V4's
 * CSA / HCA blocks, transformers 5.17 DeepseekV4Attention): shared-KV MQA over
 * a sliding window of per-token keys plus compressed KV entries, one per
 * window of `rate` tokens. HCA pools each window; CSA pools overlapping pairs
 * of windows and lets a lightning indexer pick index_topk entries per query.
 * The pooling math is ms_compress_pool (ops/compress.h); the layer itself runs
 * in engine/compressed_attn.c. */
#ifndef MS_COMPRESSED_ATTN_H
#define MS_COMPRESSED_ATTN_H

#include "ops/ops.h"

/* One window compressor: kv/gate projections [w*dim, hidden] (w = 2 when the
 * entries overlap two windows, else 1), the learned position bias ape
 * [rate, w*dim] (F32 copy) and the entries' RMSNorm weight [dim]. */
typedef struct ms_compressor_weights {
    ms_qmat wkv, wgate;
    float *ape;
    float *norm;
} ms_compressor_weights;

typedef struct ms_cattn_weights {
    ms_qmat wkv;              /* [head_dim, hidden] the shared key = value */
    float *kv_norm;           /* [head_dim] */
    ms_qmat wo_a;             /* [o_groups * o_lora_rank, n_heads * head_dim / o_groups] */
    ms_qmat wo_b;             /* [hidden, o_groups * o_lora_rank] */
    ms_compressor_weights comp;   /* layer_compress > 0 */
    /* CSA lightning indexer (layer_csa) */
    ms_compressor_weights icomp;  /* at index_head_dim, overlapping */
    ms_qmat iwq_b;            /* [index_n_heads * index_head_dim, q_lora_rank] */
    ms_qmat iweights;         /* [index_n_heads, hidden] */
} ms_cattn_weights;

#endif
