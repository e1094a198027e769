/* arch_glm4_moe_lite.c — GLM-4.7-Flash (Glm4MoeLiteForCausalLM): DeepSeek-V3
 * MLA attention (interleaved RoPE over qk_rope_head_dim) and GLM-4.5's
 * sigmoid router with e_score_correction_bias, groups and shared experts, the
 * dense/MoE schedule given per layer by mlp_layer_types ("dense" | "sparse",
 * default one dense layer then MoE). Tensor names are DeepSeek V3's, so the
 * bind is arch_deepseek_v3.c's. transformers: models/glm4_moe_lite. */
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

extern const ms_arch ms_arch_deepseek_v3;

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    if (cJSON_GetObjectItemCaseSensitive(j, "first_k_dense_replace"))
        return ms_fail(err, MS_ERR_FORMAT, "%s: glm4_moe_lite gives its schedule as mlp_layer_types, not first_k_dense_replace",
                       where);
    int rc = ms_arch_deepseek_v3.configure(j, c, where, err);
    if (rc) return rc;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "mlp_layer_types");
    if (arr && !cJSON_IsNull(arr) && (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != c->n_layers))
        return ms_fail(err, MS_ERR_FORMAT, "%s: mlp_layer_types must be a list of num_hidden_layers (%lld) names", where,
                       (long long)c->n_layers);
    const cJSON *v = cJSON_IsArray(arr) ? arr->child : NULL;
    for (int l = 0; l < c->n_layers; l++, v = v ? v->next : NULL) {
        int dense = l == 0; /* transformers' default: ["dense"] + ["sparse"] * (n - 1) */
        if (v) {
            if (cJSON_IsString(v) && !strcmp(v->valuestring, "dense")) dense = 1;
            else if (cJSON_IsString(v) && !strcmp(v->valuestring, "sparse")) dense = 0;
            else return ms_fail(err, MS_ERR_FORMAT, "%s: mlp_layer_types[%d] must be \"dense\" or \"sparse\"", where, l);
        }
        c->layer_mlp[l] = dense ? MS_MLP_DENSE : MS_MLP_MOE;
        if (dense && c->inter < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: dense layers need intermediate_size", where);
    }
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) { return ms_arch_deepseek_v3.bind(b, m); }

const ms_arch ms_arch_glm4_moe_lite = {"glm4_moe_lite", configure, bind};
