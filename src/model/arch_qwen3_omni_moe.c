/* arch_qwen3_omni_moe.c — Qwen3-Omni MoE (Qwen3-Omni-30B-A3B), the thinker's text model:
 * the Qwen3-MoE blocks (GQA with per-head q/k RMSNorm, softmax router renormalised per
 * norm_topk_prob, decoder_sparse_step / mlp_only_layers), M-RoPE that is the plain RoPE
 * for text positions (equal on all three axes). The published checkpoint
 * (Qwen3OmniMoeForConditionalGeneration, qwen3_omni_moe) keeps the text config at
 * thinker_config.text_config (config.c descends into it) and the tensors under
 * thinker.model. / thinker.lm_head; the thinker saved alone
 * (Qwen3OmniMoeThinkerForConditionalGeneration, qwen3_omni_moe_thinker) has its
 * text_config at the top and the tensors under model. / lm_head. The audio tower,
 * the vision tower, the talker and code2wav are ignored. transformers:
 * models/qwen3_omni_moe. */
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

extern const ms_arch ms_arch_qwen3_moe;

/* j is the thinker's text_config (config.c descends into it). */
static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    const char *tmt = NULL;
    int rc = ms_json_opt_string(j, "model_type", &tmt, where, err);
    if (rc) return rc;
    if (tmt && strcmp(tmt, "qwen3_omni_moe_text"))
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: %s needs the thinker's text model config (thinker_config.text_config, model_type "
                       "qwen3_omni_moe_text); found model_type \"%.64s\"",
                       where, c->model_type, tmt);
    return ms_arch_qwen3_moe.configure(j, c, where, err);
}

/* The tensors under thinker. (the published layout; what synth records) or at the top (the thinker alone). */
static int bind(ms_binder *b, ms_model *m) {
    const char *p = (!b->ck || ms_bind_has(b, "thinker.model.embed_tokens.weight")) ? "thinker." : "";
    char emb[64], norm[64], head[64], layers[64];
    snprintf(emb, sizeof emb, "%smodel.embed_tokens", p);
    snprintf(norm, sizeof norm, "%smodel.norm.weight", p);
    snprintf(head, sizeof head, "%slm_head", p);
    snprintf(layers, sizeof layers, "%smodel.layers", p);
    if (ms_bind_trunk(b, m, emb, norm, head)) return b->rc;
    return ms_bind_layers(b, m, layers, ms_bind_gqa, ms_bind_ffn);
}

const ms_arch ms_arch_qwen3_omni_moe = {"qwen3_omni_moe", configure, bind};
const ms_arch ms_arch_qwen3_omni_moe_thinker = {"qwen3_omni_moe_thinker", configure, bind};
