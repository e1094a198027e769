/* arch_glm4_moe_lite.c — GLM-4.7-Flash (Glm4MoeLiteForCausalLM): DeepSeek-V3
 * MLA attention (interleaved RoPE over qk_rope_head_dim) and GLM-4.5's
 * sigmoid router with e_score_correction_bias, groups and shared experts, the
 * dense/MoE schedule given per layer by mlp_layer_types ("dense" | "sparse",
 * default one dense layer then MoE). Tensor names are DeepSeek V3's, so the
 * bind is arch_deepseek_v3.c's. transformers: models/glm4_moe_lite. */
#include "model/arch_common.h"
#include "model/model.h"

extern const ms_arch ms_arch_deepseek_v3;

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    if (cJSON_GetObjectItemCaseSensitive(j, "first_k_dense_replace"))
        return ms_fail(err, MS_ERR_FORMAT, "%s: glm4_moe_lite gives its schedule as mlp_layer_types, not first_k_dense_replace",
                       where);
    int rc = ms_arch_deepseek_v3.configure(j, c, where, err);
    if (rc) return rc;
    return ms_arch_mlp_layer_types(j, c, 1, where, err); /* transformers' default: ["dense"] + ["sparse"] * (n - 1) */
}

static int bind(ms_binder *b, ms_model *m) { return ms_arch_deepseek_v3.bind(b, m); }

const ms_arch ms_arch_glm4_moe_lite = {"glm4_moe_lite", configure, bind};
