/* arch_qwen3_vl_moe.c — Qwen3-VL MoE (Qwen3-VL-30B-A3B, -235B-A22B), text model
 * only: the Qwen3-MoE text blocks (arch_qwen3_moe.c: GQA with per-head q/k
 * RMSNorm, rotate-half RoPE, softmax router, here always renormalised) under
 * model.language_model., lm_head, and the routed experts stored fused per layer
 * (mlp.experts.gate_up_proj / down_proj; ms_bind_fused_experts takes both the
 * published and transformers' layout). RoPE: the text positions of an
 * image-free prompt are equal on the three interleaved M-RoPE axes, so it is
 * plain RoPE. The vision tower (model.visual.*) is not read; images (and the
 * deepstack features they add to early layers) are not supported.
 * transformers: models/qwen3_vl_moe/modular_qwen3_vl_moe.py. */
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

extern const ms_arch ms_arch_qwen3_moe;

/* j is text_config (config.c descends into it). */
static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    const char *tmt = NULL;
    int rc = ms_json_opt_string(j, "model_type", &tmt, where, err);
    if (rc) return rc;
    if (tmt && !strcmp(tmt, "qwen3_vl_moe"))
        return ms_fail(err, MS_ERR_FORMAT, "%s: qwen3_vl_moe needs the text model's config in a \"text_config\" object",
                       where);
    if (tmt && strcmp(tmt, "qwen3_vl_moe_text"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: text_config.model_type \"%.64s\" is not supported (qwen3_vl_moe_text)",
                       where, tmt);
    if ((rc = ms_arch_qwen3_moe.configure(j, c, where, err))) return rc;
    c->norm_topk_prob = 1; /* Qwen3VLMoeTextTopKRouter always renormalises */
    return MS_OK;
}

static int ffn(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    char w[200], gu[200], dn[200];
    if (c->layer_mlp[l] == MS_MLP_DENSE) return ms_bind_dense_mlp(b, m, l, p);
    snprintf(w, sizeof w, "%smlp.gate", p);
    snprintf(gu, sizeof gu, "%smlp.experts.gate_up_proj", p);
    snprintf(dn, sizeof dn, "%smlp.experts.down_proj", p);
    ms_bind_router(b, m, l, w, NULL);
    return ms_bind_fused_experts(b, m, l, gu, dn);
}

static int bind(ms_binder *b, ms_model *m) {
    ms_bind_trunk(b, m, "model.language_model.embed_tokens", "model.language_model.norm.weight", "lm_head");
    return ms_bind_layers(b, m, "model.language_model.layers", ms_bind_gqa, ffn);
}

const ms_arch ms_arch_qwen3_vl_moe = {"qwen3_vl_moe", configure, bind};
