/* arch_classic_moe.c — four GQA MoE families whose blocks are all shared
 * ones, each with its own configure and bind:
 *   mixtral    Mixtral 8x7B / 8x22B: GQA, full RoPE, no q/k norm; router
 *              softmax over the top-k logits; experts
 *              block_sparse_moe.experts.E.{w1,w3,w2} of width intermediate_size.
 *              transformers: models/mixtral.
 *   qwen2_moe  Qwen1.5-MoE / Qwen2-57B-A14B: GQA with q/k/v biases (qkv_bias),
 *              softmax router (norm_topk_prob, default off), one shared expert
 *              scaled by sigmoid(shared_expert_gate x), decoder_sparse_step /
 *              mlp_only_layers dense layers. transformers: models/qwen2_moe.
 *   olmoe      OLMoE: GQA with RMSNorm over the whole q and k projections,
 *              softmax router without renormalisation (norm_topk_prob), experts
 *              of width intermediate_size. transformers: models/olmoe.
 *   flex_olmo  FlexOlmo: OLMoE with OLMo-2's norm placement, after each
 *              sublayer instead of before (cfg post_norm).
 *              transformers: models/flex_olmo.
 * Sliding-window attention (Mixtral, Qwen2 use_sliding_window) and OLMoE's
 * clip_qkv are refused. */
#include <stdio.h>

#include "model/arch_common.h"
#include "model/model.h"

/* The GQA + full rotate-half RoPE part all three share. */
static int gqa_rope(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int rc;
    if ((rc = ms_arch_check_gqa(c, where, err))) return rc;
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_HALF, where, err))) return rc;
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0;
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = MS_MLP_MOE;
    }
    return MS_OK;
}

/* A sliding_window that is set (not null, not 0) is refused: these binds run full attention. */
static int no_window(const cJSON *j, const char *key, const char *where, ms_err *err) {
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, key);
    if (w && !cJSON_IsNull(w) && !cJSON_IsFalse(w) && !(cJSON_IsNumber(w) && w->valuedouble == 0))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: %s is not supported (full attention only)", where, key);
    return MS_OK;
}

static int configure_mixtral(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int rc;
    if ((rc = ms_json_int(j, "num_local_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = no_window(j, "sliding_window", where, err)))
        return rc;
    c->moe_inter = c->inter; /* experts use intermediate_size */
    c->router = MS_ROUTER_TOPK_SOFTMAX;
    if ((rc = gqa_rope(j, c, where, err))) return rc;
    return ms_arch_check_moe(c, where, err);
}

static int ffn_mixtral(ms_binder *b, ms_model *m, int l, const char *p) { return ms_bind_sparse_moe(b, m, l, p, NULL); }

static int bind_mixtral(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_gqa, ffn_mixtral); }

static int configure_qwen2_moe(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t step = 1;
    int qkv_bias = 1, rc;
    if ((rc = ms_json_int(j, "num_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "decoder_sparse_step", 1, MS_MAX_LAYERS, &step, where, err)) ||
        (rc = ms_json_opt_int(j, "shared_expert_intermediate_size", 0, 1 << 24, &c->shared_inter, where, err)) ||
        (rc = ms_json_opt_bool(j, "qkv_bias", &qkv_bias, where, err)))
        return rc;
    int sw = 0;
    if ((rc = ms_json_opt_bool(j, "use_sliding_window", &sw, where, err))) return rc;
    if (sw) return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: use_sliding_window is not supported (full attention only)", where);
    c->router = MS_ROUTER_SOFTMAX;
    c->attn_bias = qkv_bias;
    c->shared_expert_gate = c->shared_inter > 0;
    if ((rc = gqa_rope(j, c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    uint8_t mlp_only[MS_MAX_LAYERS] = {0};
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers");
    if (mo && !cJSON_IsNull(mo)) {
        if (!cJSON_IsArray(mo)) return ms_fail(err, MS_ERR_FORMAT, "%s: mlp_only_layers must be a list", where);
        for (const cJSON *e = mo->child; e; e = e->next) {
            if (!ms_json_is_int(e, 0, c->n_layers - 1))
                return ms_fail(err, MS_ERR_FORMAT, "%s: mlp_only_layers entry out of range", where);
            mlp_only[(int)e->valuedouble] = 1;
        }
    }
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_mlp[l] = (!mlp_only[l] && (l + 1) % step == 0) ? MS_MLP_MOE : MS_MLP_DENSE;
        if (c->layer_mlp[l] == MS_MLP_DENSE && c->inter < 1)
            return ms_fail(err, MS_ERR_FORMAT, "%s: dense layers need intermediate_size", where);
    }
    return MS_OK;
}

static int ffn_qwen2_moe(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    char w[160];
    if (c->layer_mlp[l] == MS_MLP_DENSE) return ms_bind_dense_mlp(b, m, l, p);
    snprintf(w, sizeof w, "%smlp.gate", p);
    ms_bind_router(b, m, l, w, NULL);
    ms_bind_gated_shared_expert(b, m, l, p);
    return ms_bind_experts(b, m, l, "model.layers.%d.mlp.experts.%d.gate_proj",
                           "model.layers.%d.mlp.experts.%d.up_proj", "model.layers.%d.mlp.experts.%d.down_proj");
}

static int bind_qwen2_moe(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_gqa, ffn_qwen2_moe); }

static int configure_olmoe(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int rc;
    if ((rc = ms_json_int(j, "num_experts", 1, 65536, &c->n_experts, where, err))) return rc;
    const cJSON *clip = cJSON_GetObjectItemCaseSensitive(j, "clip_qkv");
    if (clip && !cJSON_IsNull(clip)) return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: clip_qkv is not supported", where);
    c->moe_inter = c->inter; /* experts use intermediate_size */
    c->router = MS_ROUTER_SOFTMAX;
    c->qk_norm = MS_QKNORM_FULL;
    if ((rc = gqa_rope(j, c, where, err))) return rc;
    return ms_arch_check_moe(c, where, err);
}

static int bind_olmoe(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_gqa, ms_bind_routed_moe); }

/* FlexOlmo: OLMoE's blocks with the norms after each sublayer (cfg post_norm): no input norms,
 * post_attention_layernorm on the attention output and post_feedforward_layernorm on the MoE
 * output, each before its residual add. */
static int configure_flex_olmo(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int rc = configure_olmoe(j, c, where, err);
    c->post_norm = 1;
    return rc;
}

static int bind_flex_olmo(ms_binder *b, ms_model *m) {
    const ms_config *c = b->cfg;
    ms_bind_trunk(b, m, "model.embed_tokens", "model.norm.weight", "lm_head");
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        char p[64];
        snprintf(p, sizeof p, "model.layers.%d.", l);
        ms_layer *L = &m->layers[l];
        ms_bind_vec(b, &L->attn_post_norm, MS_W_NORM, c->hidden, 0, "%spost_attention_layernorm.weight", p);
        ms_bind_vec(b, &L->ffn_post_norm, MS_W_NORM, c->hidden, 0, "%spost_feedforward_layernorm.weight", p);
        ms_bind_gqa(b, m, l, p);
        ms_bind_routed_moe(b, m, l, p);
    }
    return b->rc;
}

const ms_arch ms_arch_mixtral = {"mixtral", configure_mixtral, bind_mixtral};
const ms_arch ms_arch_flex_olmo = {"flex_olmo", configure_flex_olmo, bind_flex_olmo};
const ms_arch ms_arch_qwen2_moe = {"qwen2_moe", configure_qwen2_moe, bind_qwen2_moe};
const ms_arch ms_arch_olmoe = {"olmoe", configure_olmoe, bind_olmoe};
