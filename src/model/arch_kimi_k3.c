/* arch_kimi_k3.c — Kimi K3 (KimiK3ForConditionalGeneration): a vision tower
 * plus the Kimi Linear text model of the official K3 code. The text model's
 * hyper-parameters are under "text_config" (model_type kimi_linear) and its
 * tensors under "language_model."; everything it adds over Kimi Linear
 * (SiTU, Attention Residuals, the MLA output gate, latent routed experts, the
 * lower-bounded KDA gate with a full-rank output gate, MXFP4 experts) is a
 * config option of arch_kimi_linear.c, which this file wraps. The vision
 * tower is not loaded: its tensors are ignored and the image placeholder
 * token is rejected by the engine.
 * Reference: shared/reference/kimi-k3 (modeling_kimi_k3.py, modeling_kimi_linear.py). */
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

extern const ms_arch ms_arch_kimi_linear;

/* j is text_config (config.c descends into it for multimodal checkpoints and
 * reads media_placeholder_token_id from the top level). */
static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    const char *tmt = NULL;
    int rc = ms_json_opt_string(j, "model_type", &tmt, where, err);
    if (rc) return rc;
    if (tmt && !strcmp(tmt, "kimi_k3"))
        return ms_fail(err, MS_ERR_FORMAT, "%s: kimi_k3 needs the text model's config in a \"text_config\" object",
                       where);
    if (tmt && strcmp(tmt, "kimi_linear"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: text_config.model_type \"%.64s\" is not supported (kimi_linear)",
                       where, tmt);
    if ((rc = ms_arch_kimi_linear.configure(j, c, where, err))) return rc;
    /* the official router renormalises only when more than one expert is chosen */
    if (c->top_k == 1) c->norm_topk_prob = 0;
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) {
    snprintf(b->prefix, sizeof b->prefix, "language_model.");
    return ms_arch_kimi_linear.bind(b, m);
}

const ms_arch ms_arch_kimi_k3 = {"kimi_k3", configure, bind};
