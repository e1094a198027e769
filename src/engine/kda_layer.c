/* kda_layer.c — linear-attention token-mixer layers in the engine (KDA and the
 * gated DeltaNet): the model config's kda_* / gdn_* fields to a block config,
 * and the sublayer call (the backend's kda_forward / gdn_forward) over the
 * layer's state, which engine.c allocates through the backend. */
#include "engine/engine_internal.h"

void ms_kda_config_of(const ms_config *c, ms_kda_config *out) {
    out->hidden = (int)c->hidden;
    out->heads = (int)c->kda_heads;
    out->head_dim = (int)c->kda_head_dim;
    out->conv_kernel = (int)c->kda_conv;
    out->decay = c->kda_lower_bound_gate ? MS_DECAY_LOWER_BOUND : MS_DECAY_SOFTPLUS;
    out->lower_bound = (float)c->kda_lower_bound;
    out->full_rank_gate = c->kda_full_rank_gate;
    out->norm_eps = (float)c->rms_eps;
}

int ms_attn_kda(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    ms_kda_config kc;
    ms_kda_config_of(&e->m->cfg, &kc);
    int64_t D = e->m->cfg.hidden;
    for (int i = 0; i < e->n_seqs; i++) { /* the whole block per sequence, over its own state */
        const ms_fwd_seq *sq = &e->seqs[i];
        int rc = e->be->ops->kda_forward(e->be, &kc, &e->w->layers[layer].kda, &sq->e->kda[layer],
                                         e->xn + (int64_t)sq->row * D, sq->n, out + (int64_t)sq->row * D, err);
        if (rc) return ms_wrap(err, "layer %d", layer);
    }
    return MS_OK;
}

void ms_gdn_config_of(const ms_config *c, ms_gdn_config *out) {
    out->hidden = (int)c->hidden;
    out->k_heads = (int)c->gdn_k_heads;
    out->v_heads = (int)c->gdn_v_heads;
    out->k_dim = (int)c->gdn_k_dim;
    out->v_dim = (int)c->gdn_v_dim;
    out->conv_kernel = (int)c->kda_conv;
    out->norm_eps = (float)c->rms_eps;
}

int ms_attn_gdn(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    ms_gdn_config gc;
    ms_gdn_config_of(&e->m->cfg, &gc);
    int64_t D = e->m->cfg.hidden;
    for (int i = 0; i < e->n_seqs; i++) {
        const ms_fwd_seq *sq = &e->seqs[i];
        int rc = e->be->ops->gdn_forward(e->be, &gc, &e->w->layers[layer].gdn, &sq->e->kda[layer],
                                         e->xn + (int64_t)sq->row * D, sq->n, out + (int64_t)sq->row * D, err);
        if (rc) return ms_wrap(err, "layer %d", layer);
    }
    return MS_OK;
}
