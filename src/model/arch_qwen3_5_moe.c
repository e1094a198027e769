/* arch_qwen3_5_moe.c — Qwen3.5 MoE (Qwen3.5-35B-A3B, -122B-A10B, -397B-A17B),
 * text model only. The same blocks as Qwen3-Next (arch_qwen3_next.c: gated
 * DeltaNet layers mixed with gated full attention per layer_types, (1 + w)
 * RMSNorms, softmax router with renormalised top-k, one sigmoid-gated shared
 * expert), with one difference: the gated DeltaNet's input projections are
 * stored split (linear_attn.in_proj_qkv [q all heads | k all heads | v all
 * heads], in_proj_z, in_proj_b, in_proj_a) instead of fused per key-head group.
 * RoPE: the text positions of an image-free prompt are equal on the three
 * M-RoPE axes, so the interleaved mrope_section split is plain partial
 * rotate-half RoPE over head_dim * partial_rotary_factor dims.
 * Two model_types:
 *   qwen3_5_moe       Qwen3_5MoeForConditionalGeneration as published: the
 *                     text config under text_config, text weights under
 *                     model.language_model., lm_head; the vision tower
 *                     (model.visual.*) and the MTP head (mtp.*) are not read.
 *   qwen3_5_moe_text  Qwen3_5MoeForCausalLM (what transformers saves for the
 *                     text model alone): weights under model.
 * Images are not supported. transformers: models/qwen3_5_moe/modular_qwen3_5_moe.py
 * (and qwen3_5/modular_qwen3_5.py for the gated DeltaNet). */
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

extern const ms_arch ms_arch_qwen3_next;
int ms_bind_qwen3_next_text(ms_binder *b, ms_model *m, const char *tm);

/* j is the text model's config (text_config of a qwen3_5_moe checkpoint; config.c descends into it). */
static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    const char *tmt = NULL;
    int rc = ms_json_opt_string(j, "model_type", &tmt, where, err);
    if (rc) return rc;
    if (tmt && strcmp(tmt, "qwen3_5_moe_text"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: text model_type \"%.64s\" is not supported (qwen3_5_moe_text)",
                       where, tmt);
    /* Qwen3.5 MoE has no dense layers and always renormalises the top-k weights */
    if (cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers") || cJSON_GetObjectItemCaseSensitive(j, "decoder_sparse_step"))
        return ms_fail(err, MS_ERR_FORMAT, "%s: qwen3_5_moe has no mlp_only_layers / decoder_sparse_step", where);
    if ((rc = ms_arch_qwen3_next.configure(j, c, where, err))) return rc;
    c->norm_topk_prob = 1;
    c->gdn_split = 1;
    return MS_OK;
}

static int bind_multimodal(ms_binder *b, ms_model *m) { return ms_bind_qwen3_next_text(b, m, "model.language_model."); }
static int bind_text(ms_binder *b, ms_model *m) { return ms_bind_qwen3_next_text(b, m, "model."); }

const ms_arch ms_arch_qwen3_5_moe = {"qwen3_5_moe", configure, bind_multimodal};
const ms_arch ms_arch_qwen3_5_moe_text = {"qwen3_5_moe_text", configure, bind_text};
