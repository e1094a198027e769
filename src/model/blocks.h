/* blocks.h — the weights of the non-GQA/MLA token mixers a layer binds:
 * KDA (Kimi Delta Attention), gated DeltaNet (Qwen3-Next) and DeepSeek-V4
 * compressed attention. Views in their stored dtype, as the binder builds
 * them (src/model); the blocks that run them are in src/engine
 * (kda_block.h, gdn_block.h, compressed_attn.h). */
#ifndef MS_MODEL_BLOCKS_H
#define MS_MODEL_BLOCKS_H

#include "core/qmat.h"

/* KDA (engine/kda_block.h). */
typedef struct ms_kda_weights {
    ms_qmat q_proj, k_proj, v_proj; /* [H*d, hidden] */
    ms_qmat q_conv, k_conv, v_conv; /* [H*d, K] (conv1d weights [H*d, 1, K]) */
    ms_qmat f_a, f_b;               /* [d, hidden], [H*d, d] */
    ms_qmat A_log;                  /* H elements (zero padding stripped by the binder) */
    ms_qmat dt_bias;                /* H*d elements; data NULL when absent */
    ms_qmat b_proj;                 /* [H, hidden] */
    ms_qmat g_a, g_b;               /* low-rank output gate */
    ms_qmat g_proj;                 /* full-rank output gate */
    ms_qmat o_norm;                 /* [d] */
    ms_qmat o_proj;                 /* [hidden, H*d] */
} ms_kda_weights;

/* Gated DeltaNet (engine/gdn_block.h). The input projections come in one of
 * two layouts: fused per key-head group (Qwen3-Next: in_qkvz, in_ba) or split
 * (Qwen3.5: in_qkv, in_z, in_b, in_a, with in_qkvz.data NULL). */
typedef struct ms_gdn_weights {
    ms_qmat in_qkvz;     /* [2*Hk*dk + 2*Hv*dv, hidden] */
    ms_qmat in_ba;       /* [2*Hv, hidden] */
    ms_qmat in_qkv;      /* split: [2*Hk*dk + Hv*dv, hidden], rows [q all heads | k all heads | v all heads] */
    ms_qmat in_z;        /* split: [Hv*dv, hidden] */
    ms_qmat in_b, in_a;  /* split: [Hv, hidden] each */
    ms_qmat conv;        /* [2*Hk*dk + Hv*dv, K] (conv1d weight [C, 1, K]) */
    ms_qmat A_log;       /* Hv elements */
    ms_qmat dt_bias;     /* Hv elements */
    ms_qmat norm;        /* [dv] gated RMSNorm weight */
    ms_qmat out_proj;    /* [hidden, Hv*dv] */
} ms_gdn_weights;

/* Compressed attention (engine/compressed_attn.h). */
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
