/* arch_sigmoid_gqa.c — three GQA families with DeepSeek-V3's MoE (sigmoid
 * scores + e_score_correction_bias for the choice, group-limited top-k,
 * norm_topk_prob, routed_scaling_factor, shared experts mlp.shared_experts),
 * rotate_half RoPE, each with its own configure and bind over the shared blocks:
 *   dots1       dots.llm1: per-head q/k RMSNorm, first_k_dense_replace dense
 *               layers, sliding-window layers per layer_types (or from
 *               max_window_layers on). transformers: models/dots1.
 *   exaone_moe  K-EXAONE: EXAONE-4 attention (per-head q/k norm; with a
 *               sliding_window, the "sliding_attention" layers use it and RoPE
 *               while the full layers are NoPE), dense/MoE schedule from
 *               mlp_layer_types (or first_k_dense_replace), num_experts and
 *               num_shared_experts; the correction bias at mlp.e_score_correction_bias.
 *               transformers: models/exaone_moe.
 *   solar_open  Solar Open: Llama attention (q/k/v biases per attention_bias,
 *               o_proj without), partial rotary (default 1.0), MoE on every
 *               layer. transformers: models/solar_open.
 *   hy_v3       Hy3 (HYV3ForCausalLM): Apertus attention (per-head q/k
 *               RMSNorm before RoPE), sigmoid router with the correction bias
 *               mlp.expert_bias (router mlp.router.gate, shared mlp.shared_mlp: the
 *               published names 5.17 saves; or transformers' mlp.gate,
 *               mlp.e_score_correction_bias, mlp.shared_experts), plain top-k (no groups), always
 *               renormalised (+1e-20), times router_scaling_factor; shared
 *               experts of num_shared_experts x moe_intermediate_size; dense/MoE
 *               schedule from mlp_layer_types (default: layer 0 dense).
 *               transformers: models/hy_v3. */
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

/* The DeepSeek-V3 router and shared experts; GQA with rotate_half RoPE over rotary dims. */
static int sigmoid_gqa(const cJSON *j, ms_config *c, int64_t n_shared, const char *where, ms_err *err) {
    int rc;
    c->router = MS_ROUTER_SIGMOID;
    c->router_bias = 1;
    c->shared_inter = n_shared * c->moe_inter;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_HALF, where, err))) return rc;
    for (int l = 0; l < c->n_layers; l++) c->layer_attn[l] = MS_ATTN_GQA;
    return MS_OK;
}

/* sliding_window: 0 when null, def (the config class's default) when absent. */
static int window_of(const cJSON *j, int64_t def, int64_t *w, const char *where, ms_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    *w = v ? 0 : def;
    if (!v || cJSON_IsNull(v)) return MS_OK;
    return ms_json_opt_int(j, "sliding_window", 1, INT32_MAX, w, where, err);
}

/* layer_types (when present): 1 per "sliding_attention" layer in sliding[], 0 per "full_attention".
 * *have: whether the list was there. */
static int layer_types(const cJSON *j, const ms_config *c, uint8_t *sliding, int *have, const char *where, ms_err *err) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    *have = 0;
    if (!lt || cJSON_IsNull(lt)) return MS_OK;
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
        return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types must be a list of num_hidden_layers (%lld) names", where,
                       (long long)c->n_layers);
    int l = 0;
    for (const cJSON *v = lt->child; v; v = v->next, l++) {
        if (cJSON_IsString(v) && !strcmp(v->valuestring, "sliding_attention")) sliding[l] = 1;
        else if (cJSON_IsString(v) && !strcmp(v->valuestring, "full_attention")) sliding[l] = 0;
        else return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types[%d] must be \"full_attention\" or \"sliding_attention\"", where, l);
    }
    *have = 1;
    return MS_OK;
}

static int configure_dots1(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t first_dense = 0, n_shared = 0, window = 0, max_window_layers = 62;
    int rc, have = 0;
    if ((rc = ms_json_int(j, "n_routed_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "n_shared_experts", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_int(j, "first_k_dense_replace", 0, MS_MAX_LAYERS, &first_dense, where, err)) ||
        (rc = ms_json_opt_int(j, "max_window_layers", 0, INT32_MAX, &max_window_layers, where, err)) ||
        (rc = window_of(j, 4096, &window, where, err)))
        return rc;
    c->qk_norm = MS_QKNORM_HEAD;
    if ((rc = sigmoid_gqa(j, c, n_shared, where, err)) || (rc = ms_arch_mlp_layer_types(j, c, first_dense, where, err)))
        return rc;
    uint8_t sliding[MS_MAX_LAYERS] = {0};
    if ((rc = layer_types(j, c, sliding, &have, where, err))) return rc;
    for (int l = 0; l < c->n_layers; l++) {
        int s = have ? sliding[l] : window > 0 && l >= max_window_layers; /* Dots1Config's default schedule */
        if (s && window < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: sliding_attention layers need sliding_window", where);
        c->layer_window[l] = s ? (int32_t)window : 0;
    }
    return MS_OK;
}

static int configure_exaone_moe(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t first_dense = 1, n_shared = 1, window = 0;
    int rc, have = 0;
    if ((rc = ms_json_int(j, "num_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "num_shared_experts", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_int(j, "first_k_dense_replace", 0, MS_MAX_LAYERS, &first_dense, where, err)) ||
        (rc = window_of(j, 4096, &window, where, err)))
        return rc;
    c->qk_norm = MS_QKNORM_HEAD;
    if ((rc = sigmoid_gqa(j, c, n_shared, where, err)) || (rc = ms_arch_mlp_layer_types(j, c, first_dense, where, err)))
        return rc;
    uint8_t sliding[MS_MAX_LAYERS] = {0};
    if ((rc = layer_types(j, c, sliding, &have, where, err))) return rc;
    if (!have && window > 0) { /* Exaone4Config's schedule from an integer sliding_window_pattern */
        int64_t pat = 4;
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "sliding_window_pattern");
        if (p && !cJSON_IsNull(p) && !ms_json_is_int(p, 1, MS_MAX_LAYERS))
            return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: give layer_types for a sliding_window_pattern that is not an integer",
                           where);
        if (p && !cJSON_IsNull(p)) pat = (int64_t)p->valuedouble;
        for (int l = 0; l < c->n_layers; l++) sliding[l] = (l + 1) % pat != 0;
    }
    /* with a sliding window the full layers are NoPE: their RoPE (rope_alt) has no rotary dims */
    memset(&c->rope_alt, 0, sizeof c->rope_alt);
    c->rope_alt.layout = MS_ROPE_HALF;
    for (int l = 0; l < c->n_layers; l++) {
        if (sliding[l] && window < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: sliding_attention layers need sliding_window", where);
        c->layer_window[l] = sliding[l] ? (int32_t)window : 0;
        c->layer_rope[l] = window > 0 && !sliding[l];
    }
    return MS_OK;
}

static int configure_solar_open(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t n_shared = 1;
    int rc;
    if ((rc = ms_json_int(j, "n_routed_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "n_shared_experts", 0, 1024, &n_shared, where, err)))
        return rc;
    if ((rc = sigmoid_gqa(j, c, n_shared, where, err))) return rc;
    for (int l = 0; l < c->n_layers; l++) c->layer_mlp[l] = MS_MLP_MOE;
    return MS_OK;
}

static int configure_hy_v3(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t n_shared = 1;
    double scale = 2.826; /* HYV3Config's default */
    int rc;
    if ((rc = ms_json_int(j, "num_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "num_shared_experts", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_double(j, "router_scaling_factor", &scale, where, err)))
        return rc;
    if (!(scale > 0)) return ms_fail(err, MS_ERR_FORMAT, "%s: router_scaling_factor must be positive", where);
    c->qk_norm = MS_QKNORM_HEAD;
    c->o_bias = c->attn_bias; /* LlamaAttention: o_proj's bias follows attention_bias */
    if ((rc = sigmoid_gqa(j, c, n_shared, where, err)) || (rc = ms_arch_mlp_layer_types(j, c, 1, where, err)))
        return rc;
    c->n_group = c->topk_group = 1; /* HYV3TopKRouter: plain top-k of sigmoid + bias */
    c->norm_topk_prob = 1;
    c->routed_scale = scale;
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_gqa, ms_bind_ffn); }

/* K-EXAONE: the correction bias is mlp.e_score_correction_bias (what transformers saves and the published
 * checkpoint holds), or mlp.gate.e_score_correction_bias. */
static int ffn_exaone_moe(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    char w[160], bias[200];
    if (c->layer_mlp[l] == MS_MLP_DENSE) return ms_bind_dense_mlp(b, m, l, p);
    snprintf(w, sizeof w, "%smlp.gate", p);
    if (ms_bind_has(b, "%smlp.gate.e_score_correction_bias", p))
        snprintf(bias, sizeof bias, "%smlp.gate.e_score_correction_bias", p);
    else
        snprintf(bias, sizeof bias, "%smlp.e_score_correction_bias", p);
    ms_bind_router(b, m, l, w, bias);
    ms_bind_shared_experts(b, m, l, p);
    snprintf(w, sizeof w, "%smlp.experts", p);
    return ms_bind_experts_at(b, m, l, w);
}

static int bind_exaone_moe(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_gqa, ffn_exaone_moe); }

/* Hy3: ms_bind_gqa plus o_proj's bias when attention_bias (LlamaAttention's o_proj has one then). */
static int attn_hy_v3(ms_binder *b, ms_model *m, int l, const char *p) {
    if (ms_bind_gqa(b, m, l, p) || !b->cfg->o_bias) return b->rc;
    return ms_bind_vec(b, &m->layers[l].bo, MS_W_VECTOR, b->cfg->hidden, 0, "%sself_attn.o_proj.bias", p);
}

/* Hy3's MoE under the published names transformers 5.17 saves (router mlp.router.gate, bias mlp.expert_bias,
 * shared mlp.shared_mlp; what spec mode records), or transformers' module names (mlp.gate,
 * mlp.e_score_correction_bias, mlp.shared_experts). */
static int ffn_hy_v3(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    char w[160];
    if (c->layer_mlp[l] == MS_MLP_DENSE) return ms_bind_dense_mlp(b, m, l, p);
    if (b->ck && !ms_bind_has(b, "%smlp.router.gate.weight", p)) return ffn_exaone_moe(b, m, l, p);
    char bias[160];
    snprintf(w, sizeof w, "%smlp.router.gate", p);
    snprintf(bias, sizeof bias, "%smlp.expert_bias", p);
    ms_bind_router(b, m, l, w, bias);
    if (c->shared_inter)
        ms_bind_mlp(b, m, l, p, c->shared_inter, "mlp.shared_mlp.gate_proj", "mlp.shared_mlp.up_proj",
                    "mlp.shared_mlp.down_proj");
    snprintf(w, sizeof w, "%smlp.experts", p);
    return ms_bind_experts_at(b, m, l, w);
}

static int bind_hy_v3(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, attn_hy_v3, ffn_hy_v3); }

const ms_arch ms_arch_dots1 = {"dots1", configure_dots1, bind};
const ms_arch ms_arch_exaone_moe = {"exaone_moe", configure_exaone_moe, bind_exaone_moe};
const ms_arch ms_arch_solar_open = {"solar_open", configure_solar_open, bind};
const ms_arch ms_arch_hy_v3 = {"hy_v3", configure_hy_v3, bind_hy_v3};
