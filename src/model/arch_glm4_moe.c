/* arch_glm4_moe.c — GLM-4.5/4.6/4.7 MoE: GQA with partial rotary
 * (rotate_half on the first dims), optional per-head q/k norm and q/k/v bias,
 * sigmoid router with correction bias and group-limited top-k, shared
 * experts, first_k_dense_replace. transformers: models/glm4_moe. */
#include "model/arch_common.h"
#include "model/model.h"

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t first_dense = 0, n_shared = 0;
    int qk_norm = 0;
    int rc;
    if ((rc = ms_json_int(j, "n_routed_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "n_shared_experts", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_int(j, "first_k_dense_replace", 0, MS_MAX_LAYERS, &first_dense, where, err)) ||
        (rc = ms_json_opt_bool(j, "use_qk_norm", &qk_norm, where, err)))
        return rc;
    c->router = MS_ROUTER_SIGMOID;
    c->router_bias = 1;
    c->qk_norm = qk_norm ? MS_QKNORM_HEAD : MS_QKNORM_NONE;
    c->shared_inter = n_shared * c->moe_inter;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_HALF, where, err))) return rc;
    if (first_dense > 0 && c->inter < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing intermediate_size", where);
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = l >= first_dense ? MS_MLP_MOE : MS_MLP_DENSE;
    }
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_gqa, ms_bind_ffn); }

const ms_arch ms_arch_glm4_moe = {"glm4_moe", configure, bind};
