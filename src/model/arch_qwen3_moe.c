/* arch_qwen3_moe.c — Qwen3 MoE: GQA with per-head q/k RMSNorm, full RoPE
 * (rotate_half), softmax router with optional top-k renormalisation, no
 * shared experts. transformers: models/qwen3_moe/modeling_qwen3_moe.py. */
#include "model/arch_common.h"
#include "model/model.h"

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t step = 1;
    int rc;
    /* transformers 5 writes num_local_experts; earlier checkpoints num_experts */
    if ((rc = ms_json_opt_int(j, "num_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "num_local_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "decoder_sparse_step", 1, MS_MAX_LAYERS, &step, where, err)))
        return rc;
    if (c->n_experts < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing num_experts", where);
    c->router = MS_ROUTER_SOFTMAX;
    c->qk_norm = MS_QKNORM_HEAD;
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_HALF, where, err))) return rc;
    uint8_t mlp_only[MS_MAX_LAYERS] = {0};
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers");
    if (mo && !cJSON_IsNull(mo)) {
        if (!cJSON_IsArray(mo)) return ms_fail(err, MS_ERR_FORMAT, "%s: mlp_only_layers must be a list", where);
        for (const cJSON *e = mo->child; e; e = e->next) {
            if (!ms_json_is_int(e, 0, c->n_layers - 1))
                return ms_fail(err, MS_ERR_FORMAT, "%s: mlp_only_layers entry out of range", where);
            mlp_only[(int)e->valuedouble] = 1;
        }
    }
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = (!mlp_only[l] && (l + 1) % step == 0) ? MS_MLP_MOE : MS_MLP_DENSE;
        if (c->layer_mlp[l] == MS_MLP_DENSE && c->inter < 1)
            return ms_fail(err, MS_ERR_FORMAT, "%s: dense layers need intermediate_size", where);
    }
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_gqa, ms_bind_ffn); }

const ms_arch ms_arch_qwen3_moe = {"qwen3_moe", configure, bind};
