/* arch_minimax_m2.c — MiniMax M2: GQA with RMSNorm over the whole q and k
 * projections (all heads together), partial rotary, sigmoid router with
 * correction bias and renormalised top-k, experts w1/w3/w2 of width
 * intermediate_size, every layer MoE. transformers: models/minimax_m2. */
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
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_HALF, where, err))) return rc;
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = MS_MLP_MOE;
    }
    return MS_OK;
}

static int ffn(ms_binder *b, ms_model *m, int l, const char *p) {
    return ms_bind_sparse_moe(b, m, l, p, "e_score_correction_bias");
}

static int bind(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_gqa, ffn); }

const ms_arch ms_arch_minimax_m2 = {"minimax_m2", configure, bind};
