/* arch_mistral4.c — Mistral 4 (Mistral4ForCausalLM, Mistral Small 4): DeepSeek-V3's
 * MLA (q_a/q_b with q_lora_rank, or q_proj; interleaved RoPE over qk_rope_head_dim
 * per rope_interleave, YaRN; the softmax scale 1/sqrt(qk_head_dim) times DeepSeek's
 * YaRN mscale^2 for mscale_all_dim, as transformers 5.17's yarn_apply_mscale), the queries scaled per
 * position by Llama 4's 1 + llama_4_scaling_beta log(1 + floor(p /
 * original_max_position_embeddings)) (rope_parameters), first_k_dense_replace dense
 * layers, shared experts, and a softmax router without a correction bias: groups
 * ranked by the sum of their two best scores (MS_ROUTER_SOFTMAX_GROUP2), top-k of
 * the kept groups, the scores renormalised per norm_topk_prob, times
 * routed_scaling_factor. The FFN binds as
 * DeepSeek V3's (ms_bind_ffn: routed experts per expert or fused).
 * transformers: models/mistral4. */

#include "model/arch_common.h"
#include "model/model.h"

extern const ms_arch ms_arch_deepseek_v3;

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    double beta = 0;
    int64_t orig = 0;
    int rc = ms_arch_deepseek_v3.configure(j, c, where, err);
    if (rc) return rc;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (!cJSON_IsObject(rp)) rp = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (cJSON_IsObject(rp) &&
        ((rc = ms_json_opt_double(rp, "llama_4_scaling_beta", &beta, where, err)) ||
         (rc = ms_json_opt_int(rp, "original_max_position_embeddings", 1, INT64_C(1) << 40, &orig, where, err))))
        return rc;
    if (beta != 0 && orig < 1)
        return ms_fail(err, MS_ERR_FORMAT, "%s: llama_4_scaling_beta needs rope_parameters.original_max_position_embeddings",
                       where);
    c->q_pos_beta = beta;
    c->q_pos_len = orig;
    c->router = MS_ROUTER_SOFTMAX_GROUP2;
    c->router_bias = 0;
    if (c->n_group > 1) {
        if (c->n_experts % c->n_group || c->topk_group > c->n_group || c->n_experts / c->n_group < 2 ||
            c->top_k > c->topk_group * (c->n_experts / c->n_group))
            return ms_fail(err, MS_ERR_FORMAT,
                           "%s: n_group must divide n_routed_experts into groups of >= 2, topk_group <= n_group, "
                           "and num_experts_per_tok fit the kept groups",
                           where);
    }
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_mla, ms_bind_ffn); }

const ms_arch ms_arch_mistral4 = {"mistral4", configure, bind};
