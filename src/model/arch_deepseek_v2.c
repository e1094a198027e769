/* arch_deepseek_v2.c — DeepSeek-V2 / V2-Lite / V2.5 (DeepseekV2ForCausalLM):
 * DeepSeek-V3's MLA (q_a/q_b with q_lora_rank, or q_proj without; interleaved
 * RoPE over qk_rope_head_dim) and shared experts, first_k_dense_replace dense
 * layers, but a softmax router without a correction bias: topk_method
 * "greedy" (plain top-k of the scores) or "group_limited_greedy" (top-k within
 * the topk_group groups whose best expert scores highest, MS_ROUTER_SOFTMAX_GROUP),
 * the scores never renormalised (transformers' DeepseekV2Moe ignores
 * norm_topk_prob), times routed_scaling_factor. The softmax scale is
 * 1/sqrt(qk_head_dim) with any RoPE scaling: DeepseekV2Attention has no YaRN
 * mscale term (the cos/sin attention factor stays). Tensor names are DeepSeek
 * V3's, so the bind is arch_deepseek_v3.c's. transformers: models/deepseek_v2. */
#include <math.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

extern const ms_arch ms_arch_deepseek_v3;

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    const char *method = "greedy", *scoring = "softmax";
    int rc = ms_json_opt_string(j, "topk_method", &method, where, err);
    if (!rc) rc = ms_json_opt_string(j, "scoring_func", &scoring, where, err);
    if (rc) return rc;
    if (strcmp(scoring, "softmax"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: scoring_func \"%.40s\" is not supported (softmax)", where, scoring);
    int greedy = !strcmp(method, "greedy");
    if (!greedy && strcmp(method, "group_limited_greedy"))
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: topk_method \"%.40s\" is not supported (greedy, group_limited_greedy)", where, method);
    if ((rc = ms_arch_deepseek_v3.configure(j, c, where, err))) return rc;
    c->router = greedy ? MS_ROUTER_SOFTMAX : MS_ROUTER_SOFTMAX_GROUP;
    c->router_bias = 0;
    c->norm_topk_prob = 0;
    if (greedy) c->n_group = c->topk_group = 1;
    c->attn_scale = 1.0 / sqrt((double)(c->qk_nope_dim + c->qk_rope_dim));
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_mlp[l] == MS_MLP_MOE && c->shared_inter < 1)
            return ms_fail(err, MS_ERR_FORMAT, "%s: deepseek_v2 MoE layers need n_shared_experts >= 1", where);
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) { return ms_arch_deepseek_v3.bind(b, m); }

const ms_arch ms_arch_deepseek_v2 = {"deepseek_v2", configure, bind};
