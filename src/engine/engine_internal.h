/* engine_internal.h — the engine's private state shared by its blocks. */
#ifndef MS_ENGINE_INTERNAL_H
#define MS_ENGINE_INTERNAL_H

#include "engine/engine.h"

struct ms_engine {
    ms_model *m;
    ms_pool *pool;
    ms_expert_source *experts;
    ms_expert_source *own_experts; /* created here when none was given */
    int max_ctx, max_batch, n_threads;
    int n_past;
    /* causal state, per layer: GQA k/v [max_ctx, kv_heads*head_dim];
     * MLA latent [max_ctx, kv_lora + rope] (normalized latent, roped k_pe) */
    float **k_cache, **v_cache, **latent;
    ms_kda_state *kda;   /* [n_layers]: conv + recurrent state of KDA layers (unused entries zero) */
    /* activations for a chunk of up to max_batch tokens */
    float *x;      /* [B, hidden] residual stream */
    float *xn;     /* [B, hidden] normed input of a sublayer */
    float *q;      /* [B, H * qdim] */
    float *kv;     /* [B, max(2*KV*hd, lora+rope, q_lora)] */
    float *att;    /* [B, H * vdim] attention output before o_proj */
    float *tmp;    /* [B, hidden] */
    /* FFN scratch */
    float *g, *u;  /* [B, max inter] */
    float *xs, *ys;/* [B, hidden] gathered rows for one expert */
    float *rlog;   /* [B, n_experts] router logits */
    int *topk_ids; /* [B, top_k] */
    float *topk_w; /* [B, top_k] */
    int *ex_count, *ex_tokens; float *ex_w; /* expert-major routing lists */
    /* per-thread scratch for attention */
    float *th_buf; size_t th_stride;
    ms_engine_stats stats;
};

/* Sublayers: read e->xn [n, hidden], write the sublayer output into out [n, hidden]. */
int ms_attn_gqa(ms_engine *e, int layer, int n, float *out, ms_err *err);
int ms_attn_mla(ms_engine *e, int layer, int n, float *out, ms_err *err);
int ms_attn_kda(ms_engine *e, int layer, int n, float *out, ms_err *err);
/* The KDA block config of a model config (engine/kda_layer.c). */
void ms_kda_config_of(const ms_config *c, ms_kda_config *out);
int ms_ffn_dense(ms_engine *e, const ms_qmat *gate, const ms_qmat *up, const ms_qmat *down, int n, const float *in,
                 float *out, int accumulate);
int ms_ffn_moe(ms_engine *e, int layer, int n, float *out, ms_err *err);

/* Rotate one vector of rope->dim dims in place. */
void ms_rope_apply(const ms_rope *r, float *x, const float *cos, const float *sin);

#endif
