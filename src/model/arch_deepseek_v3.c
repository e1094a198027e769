/* arch_deepseek_v3.c — DeepSeek V3 (and R1, V3.1): MLA + sigmoid-routed MoE
 * with group-limited top-k, shared experts, first_k_dense_replace dense layers.
 * transformers: models/deepseek_v3/modeling_deepseek_v3.py. */
#include <math.h>

#include "model/arch_common.h"
#include "model/model.h"

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t first_dense = 0, n_shared = 0, freq = 1;
    int interleave = 1;
    int rc;
    if ((rc = ms_json_opt_int(j, "q_lora_rank", 0, 1 << 20, &c->q_lora_rank, where, err)) ||
        (rc = ms_json_int(j, "kv_lora_rank", 1, 1 << 20, &c->kv_lora_rank, where, err)) ||
        (rc = ms_json_int(j, "qk_nope_head_dim", 0, 1 << 16, &c->qk_nope_dim, where, err)) ||
        (rc = ms_json_int(j, "qk_rope_head_dim", 2, 1024, &c->qk_rope_dim, where, err)) ||
        (rc = ms_json_int(j, "v_head_dim", 1, 1 << 16, &c->v_head_dim, where, err)) ||
        (rc = ms_json_int(j, "n_routed_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "n_shared_experts", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_int(j, "first_k_dense_replace", 0, MS_MAX_LAYERS, &first_dense, where, err)) ||
        (rc = ms_json_opt_int(j, "moe_layer_freq", 1, MS_MAX_LAYERS, &freq, where, err)) ||
        (rc = ms_json_opt_bool(j, "rope_interleave", &interleave, where, err)))
        return rc;
    if (c->n_heads < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing num_attention_heads", where);
    c->router = MS_ROUTER_SIGMOID;
    c->router_bias = 1;
    c->shared_inter = n_shared * c->moe_inter;
    if ((rc = ms_arch_check_moe(c, where, err))) return rc;
    if (first_dense > 0 && c->inter < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing intermediate_size", where);
    rc = ms_config_rope(j, c, c->qk_rope_dim, interleave ? MS_ROPE_INTERLEAVED : MS_ROPE_HALF, where, err);
    if (rc) return rc;
    c->attn_scale = 1.0 / sqrt((double)(c->qk_nope_dim + c->qk_rope_dim));
    c->mla_norm_eps = 1e-6; /* transformers builds q_a_layernorm / kv_a_layernorm with the default eps, not rms_norm_eps */
    if (c->rope.yarn && c->rope.mscale_all_dim != 0 && c->rope.factor > 1) {
        double ms = 0.1 * c->rope.mscale_all_dim * log(c->rope.factor) + 1.0;
        c->attn_scale *= ms * ms;
    }
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_MLA;
        c->layer_mlp[l] = (l >= first_dense && l % freq == 0) ? MS_MLP_MOE : MS_MLP_DENSE;
    }
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_mla, ms_bind_ffn); }

const ms_arch ms_arch_deepseek_v3 = {"deepseek_v3", configure, bind};
