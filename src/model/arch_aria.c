/* arch_aria.c — Aria (Rhymes AI), text model: AriaTextForCausalLM (aria_text) and the
 * text part of the multimodal AriaForConditionalGeneration (aria: text_config, tensors
 * under model.language_model.; the vision tower and projector are ignored). Llama
 * attention (head_dim, q/k/v/o biases per attention_bias, rotate_half RoPE), MoE on
 * every layer: router mlp.router [moe_num_experts, hidden], top-moe_topk of the
 * logits then a softmax over them (MS_ROUTER_TOPK_SOFTMAX); routed experts of
 * intermediate_size stored as grouped-GEMM weights mlp.experts.fc1.weight
 * [E, hidden, 2 I] (silu half, then the multiplied half) and fc2.weight [E, I, hidden]
 * (the transposed layout of ms_bind_fused_experts: one resident transposed copy), or
 * mlp.experts.gate_up_proj / down_proj where a checkpoint holds them so;
 * shared experts mlp.shared_experts of intermediate_size x moe_num_shared_experts.
 * transformers: models/aria. */
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t n_shared = 2;
    int rc;
    c->n_experts = 8, c->top_k = 2; /* AriaTextConfig's defaults */
    if ((rc = ms_json_opt_int(j, "moe_num_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "moe_topk", 1, 4096, &c->top_k, where, err)) ||
        (rc = ms_json_opt_int(j, "moe_num_shared_experts", 0, 1024, &n_shared, where, err)))
        return rc;
    if (c->inter < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing intermediate_size", where);
    c->moe_inter = c->inter; /* AriaExperts: fc1 [hidden, 2 intermediate_size] */
    c->shared_inter = n_shared * c->inter;
    c->router = MS_ROUTER_TOPK_SOFTMAX;
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0;
    c->o_bias = c->attn_bias;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_HALF, where, err))) return rc;
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = MS_MLP_MOE;
    }
    return MS_OK;
}

/* The multimodal wrapper: j is its text_config. */
static int configure_aria(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    const char *tmt = NULL;
    int rc = ms_json_opt_string(j, "model_type", &tmt, where, err);
    if (rc) return rc;
    if (tmt && !strcmp(tmt, "aria"))
        return ms_fail(err, MS_ERR_FORMAT, "%s: aria needs the text model's config in a \"text_config\" object", where);
    if (tmt && strcmp(tmt, "aria_text"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: text_config.model_type \"%.64s\" is not supported (aria_text)", where,
                       tmt);
    return configure(j, c, where, err);
}

static int attn(ms_binder *b, ms_model *m, int l, const char *p) {
    if (ms_bind_gqa(b, m, l, p) || !b->cfg->o_bias) return b->rc;
    return ms_bind_vec(b, &m->layers[l].bo, MS_W_VECTOR, b->cfg->hidden, 0, "%sself_attn.o_proj.bias", p);
}

static int ffn(ms_binder *b, ms_model *m, int l, const char *p) {
    char w[200], gu[200], dn[200];
    snprintf(w, sizeof w, "%smlp.router", p);
    int gemm = !b->ck || ms_bind_has(b, "%smlp.experts.fc1.weight", p); /* else a converted gate_up_proj / down_proj */
    snprintf(gu, sizeof gu, "%smlp.experts.%s", p, gemm ? "fc1.weight" : "gate_up_proj");
    snprintf(dn, sizeof dn, "%smlp.experts.%s", p, gemm ? "fc2.weight" : "down_proj");
    ms_bind_router(b, m, l, w, NULL);
    ms_bind_shared_experts(b, m, l, p);
    return ms_bind_fused_experts(b, m, l, gu, dn);
}

static int bind_text(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, attn, ffn); }

static int bind_aria(ms_binder *b, ms_model *m) {
    ms_bind_trunk(b, m, "model.language_model.embed_tokens", "model.language_model.norm.weight", "lm_head");
    return ms_bind_layers(b, m, "model.language_model.layers", attn, ffn);
}

const ms_arch ms_arch_aria_text = {"aria_text", configure, bind_text};
const ms_arch ms_arch_aria = {"aria", configure_aria, bind_aria};
