/* arch_minimax_m2.c — MiniMax M2: GQA with RMSNorm over the whole q and k
 * projections (all heads together), partial rotary, sigmoid router with
 * correction bias and renormalised top-k, experts w1/w3/w2 of width
 * intermediate_size, every layer MoE. transformers: models/minimax_m2. */
#include <math.h>
#include <stdio.h>

#include "model/arch_common.h"
#include "model/model.h"

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int rc;
    if ((rc = ms_json_int(j, "num_local_experts", 1, 65536, &c->n_experts, where, err))) return rc;
    c->moe_inter = c->inter; /* experts use intermediate_size */
    c->router = MS_ROUTER_SIGMOID;
    c->router_bias = 1;
    c->norm_topk_prob = 1;
    c->routed_scale = 1.0;
    c->n_group = c->topk_group = 1;
    c->qk_norm = MS_QKNORM_FULL;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    int64_t rd;
    if ((rc = ms_arch_rotary_dim(j, c, &rd, where, err)) || (rc = ms_config_rope(j, c, rd, MS_ROPE_HALF, where, err)))
        return rc;
    c->attn_scale = 1.0 / sqrt((double)c->head_dim);
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = MS_MLP_MOE;
    }
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) {
    const ms_config *c = b->cfg;
    ms_bind_trunk(b, m, "model.embed_tokens", "model.norm.weight", "lm_head");
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        char p[64], w[96], bias[128];
        snprintf(p, sizeof p, "model.layers.%d.", l);
        ms_layer *L = &m->layers[l];
        ms_bind_vec(b, &L->attn_norm, MS_W_NORM, c->hidden, 0, "%sinput_layernorm.weight", p);
        ms_bind_vec(b, &L->ffn_norm, MS_W_NORM, c->hidden, 0, "%spost_attention_layernorm.weight", p);
        ms_bind_gqa(b, m, l, p);
        snprintf(w, sizeof w, "%sblock_sparse_moe.gate", p);
        snprintf(bias, sizeof bias, "%sblock_sparse_moe.e_score_correction_bias", p);
        ms_bind_router(b, m, l, w, bias);
        ms_bind_experts(b, m, l, "model.layers.%d.block_sparse_moe.experts.%d.w1",
                        "model.layers.%d.block_sparse_moe.experts.%d.w3", "model.layers.%d.block_sparse_moe.experts.%d.w2");
    }
    return b->rc;
}

const ms_arch ms_arch_minimax_m2 = {"minimax_m2", configure, bind};
