/* arch_kimi_k25.c — Kimi K2.5 / K2.6 (Kimi_K25ForConditionalGeneration), text
 * model only: a MoonViT vision tower and projector (not read; images are not
 * supported) in front of a DeepSeek-V3 text model (arch_deepseek_v3.c: MLA,
 * group-limited sigmoid router with e_score_correction_bias, shared experts,
 * first_k_dense_replace dense layers), whose routed experts are published as
 * INT4 compressed-tensors pack-quantized (symmetric, groups of 32; bound as
 * I4 views by ms_bind_mat; the quantization_config in text_config, or at the
 * top level, which config.c then applies to the text model).
 * Config: the text model's under text_config (model_type kimi_k2 or
 * deepseek_v3; transformers reads kimi_k2 as deepseek_v3).
 * Tensor layouts accepted, found by the embedding's name:
 *   language_model.model.layers.N.*   the published checkpoint (remote code)
 *   language_model.model.blocks.N.*   what transformers 5.17 save_pretrained writes
 *   model.language_model.layers.N.*   transformers' module names
 * with language_model.lm_head (first two) or lm_head (third).
 * transformers: models/kimi_k25/modular_kimi_k25.py. */
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

extern const ms_arch ms_arch_deepseek_v3;

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    const char *tmt = NULL;
    int rc = ms_json_opt_string(j, "model_type", &tmt, where, err);
    if (rc) return rc;
    if (tmt && !strcmp(tmt, "kimi_k25"))
        return ms_fail(err, MS_ERR_FORMAT, "%s: kimi_k25 needs the text model's config in a \"text_config\" object",
                       where);
    if (tmt && strcmp(tmt, "kimi_k2") && strcmp(tmt, "deepseek_v3"))
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: text_config.model_type \"%.64s\" is not supported (kimi_k2, deepseek_v3)", where, tmt);
    return ms_arch_deepseek_v3.configure(j, c, where, err);
}

static int bind(ms_binder *b, ms_model *m) {
    const char *layers = "model.layers";
    if (ms_bind_has(b, "model.language_model.embed_tokens.weight")) { /* transformers' module names */
        ms_bind_trunk(b, m, "model.language_model.embed_tokens", "model.language_model.norm.weight", "lm_head");
        layers = "model.language_model.layers";
    } else { /* the published layout (spec mode writes this one) */
        snprintf(b->prefix, sizeof b->prefix, "language_model.");
        ms_bind_trunk(b, m, "model.embed_tokens", "model.norm.weight", "lm_head");
        if (ms_bind_has(b, "model.blocks.0.input_layernorm.weight")) layers = "model.blocks";
    }
    return ms_bind_layers(b, m, layers, ms_bind_mla, ms_bind_ffn);
}

const ms_arch ms_arch_kimi_k25 = {"kimi_k25", configure, bind};
