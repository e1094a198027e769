/* arch_glm4v_moe.c — GLM-4.5V / GLM-4.6V (Glm4vMoeForConditionalGeneration), text model:
 * GLM-4.5's MoE blocks (sigmoid router with correction bias and groups, shared experts,
 * first_k_dense_replace) under model.language_model., Glm4 attention (q/k/v biases per
 * attention_bias, no q/k norm) with M-RoPE over the partial rotary dims in the half
 * (rotate_half) layout, which for text positions (equal on all three axes) is the plain
 * partial RoPE. The vision tower is ignored. transformers: models/glm4v_moe. */
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

extern const ms_arch ms_arch_glm4_moe;

/* j is text_config (config.c descends into it). */
static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    const char *tmt = NULL;
    int rc = ms_json_opt_string(j, "model_type", &tmt, where, err);
    if (rc) return rc;
    if (tmt && !strcmp(tmt, "glm4v_moe"))
        return ms_fail(err, MS_ERR_FORMAT, "%s: glm4v_moe needs the text model's config in a \"text_config\" object", where);
    if (tmt && strcmp(tmt, "glm4v_moe_text"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: text_config.model_type \"%.64s\" is not supported (glm4v_moe_text)",
                       where, tmt);
    if ((rc = ms_arch_glm4_moe.configure(j, c, where, err))) return rc;
    c->qk_norm = MS_QKNORM_NONE; /* Glm4vMoeTextConfig has no use_qk_norm: a stray key is not read */
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) {
    if (ms_bind_trunk(b, m, "model.language_model.embed_tokens", "model.language_model.norm.weight", "lm_head"))
        return b->rc;
    return ms_bind_layers(b, m, "model.language_model.layers", ms_bind_gqa, ms_bind_ffn);
}

const ms_arch ms_arch_glm4v_moe = {"glm4v_moe", configure, bind};
