/* arch_glm5_next.c — GLM-5-Next (GLM 5.3 Flash), text model only: KDA layers
 * (the Kimi block, lower-bound decay gate) mixed with NoPE MLA layers carrying
 * a KPool DSA indexer (ops/dsa.h) per layer_types, the DeepSeek-style MoE with
 * clamped SwiGLU (swiglu_limit), and hc_mult residual streams joined by
 * manifold-constrained hyper-connections around every sublayer, collapsed by a
 * plain mean before the final norm (ops/mhc.h).
 * The checkpoint is multimodal: config under text_config, text weights under
 * model.language_model.; the vision tower (model.visual.*) is not read, so a
 * file without it loads. Images are not supported.
 * transformers: models/glm5_next/modeling_glm5_next.py. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

static int schedule(const cJSON *j, const char *key, const char *a, const char *b, const char *b2, uint8_t ka,
                    uint8_t kb, uint8_t *out, int n, int *found, const char *where, ms_err *err) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, key);
    *found = 0;
    if (!arr || cJSON_IsNull(arr)) return MS_OK;
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != n)
        return ms_fail(err, MS_ERR_FORMAT, "%s: %s must be a list of num_hidden_layers (%d) names", where, key, n);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        if (cJSON_IsString(v) && !strcmp(v->valuestring, a)) out[i] = ka;
        else if (cJSON_IsString(v) && (!strcmp(v->valuestring, b) || (b2 && !strcmp(v->valuestring, b2)))) out[i] = kb;
        else return ms_fail(err, MS_ERR_FORMAT, "%s: %s[%d] must be \"%s\" or \"%s\"", where, key, i, a, b);
        i++;
    }
    *found = 1;
    return MS_OK;
}

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t n_shared = 1;
    const char *act = "silu";
    double lb = -5.0;
    int rc;
    c->hc_mult = 4, c->hc_sinkhorn_iters = 20, c->hc_eps = 1e-6, c->act_limit = 10.0;
    c->kda_heads = 64, c->kda_head_dim = 128, c->kda_conv = 4;
    if ((rc = ms_json_int(j, "q_lora_rank", 1, 1 << 20, &c->q_lora_rank, where, err)) ||
        (rc = ms_json_int(j, "kv_lora_rank", 1, 1 << 20, &c->kv_lora_rank, where, err)) ||
        (rc = ms_json_int(j, "qk_nope_head_dim", 1, 1 << 16, &c->qk_nope_dim, where, err)) ||
        (rc = ms_json_opt_int(j, "qk_rope_head_dim", 0, 0, &c->qk_rope_dim, where, err)) ||
        (rc = ms_json_int(j, "v_head_dim", 1, 1 << 16, &c->v_head_dim, where, err)) ||
        (rc = ms_json_int(j, "n_routed_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "n_shared_experts", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_int(j, "linear_num_heads", 1, 65536, &c->kda_heads, where, err)) ||
        (rc = ms_json_opt_int(j, "linear_head_dim", 1, 1024, &c->kda_head_dim, where, err)) ||
        (rc = ms_json_opt_int(j, "linear_conv_kernel_dim", 1, 16, &c->kda_conv, where, err)) ||
        (rc = ms_json_opt_int(j, "hc_mult", 1, 64, &c->hc_mult, where, err)) ||
        (rc = ms_json_opt_int(j, "hc_sinkhorn_iters", 1, 1000, &c->hc_sinkhorn_iters, where, err)) ||
        (rc = ms_json_opt_double(j, "hc_eps", &c->hc_eps, where, err)) ||
        (rc = ms_json_opt_double(j, "swiglu_limit", &c->act_limit, where, err)) ||
        (rc = ms_json_opt_string(j, "hidden_act", &act, where, err)))
        return rc;
    if (strcmp(act, "silu"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu)", where, act);
    if (c->n_heads < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing num_attention_heads", where);
    if (c->n_kv_heads > 0 && c->n_kv_heads != c->n_heads)
        return ms_fail(err, MS_ERR_FORMAT, "%s: num_key_value_heads must equal num_attention_heads", where);
    const cJSON *lbj = cJSON_GetObjectItemCaseSensitive(j, "linear_lower_bound");
    if (lbj && !cJSON_IsNull(lbj) && (rc = ms_json_opt_double(j, "linear_lower_bound", &lb, where, err))) return rc;
    if (lbj && cJSON_IsNull(lbj)) {
        c->kda_lower_bound_gate = 0; /* softplus decay */
    } else {
        if (!(lb < 0 && isfinite(lb)))
            return ms_fail(err, MS_ERR_FORMAT, "%s: linear_lower_bound %g must be negative", where, lb);
        c->kda_lower_bound_gate = 1;
        c->kda_lower_bound = lb;
    }
    if (!(c->hc_eps >= 0) || !(c->act_limit >= 0))
        return ms_fail(err, MS_ERR_FORMAT, "%s: hc_eps and swiglu_limit must be >= 0", where);
    /* schedules; transformers' defaults: KDA except every 4th layer, 3 dense MLP layers first */
    int found;
    if ((rc = schedule(j, "layer_types", "linear_attention", "deepseek_sparse_attention", "full_attention",
                       MS_ATTN_KDA, MS_ATTN_MLA, c->layer_attn, (int)c->n_layers, &found, where, err)))
        return rc;
    if (!found)
        for (int l = 0; l < c->n_layers; l++) c->layer_attn[l] = l % 4 != 3 ? MS_ATTN_KDA : MS_ATTN_MLA;
    if ((rc = schedule(j, "mlp_layer_types", "dense", "sparse", NULL, MS_MLP_DENSE, MS_MLP_MOE, c->layer_mlp,
                       (int)c->n_layers, &found, where, err)))
        return rc;
    if (!found)
        for (int l = 0; l < c->n_layers; l++) c->layer_mlp[l] = l < 3 ? MS_MLP_DENSE : MS_MLP_MOE;
    int any_moe = 0, any_dense = 0;
    for (int l = 0; l < c->n_layers; l++) {
        any_moe |= c->layer_mlp[l] == MS_MLP_MOE;
        any_dense |= c->layer_mlp[l] == MS_MLP_DENSE;
    }
    c->router = MS_ROUTER_SIGMOID;
    c->router_bias = 1;
    c->shared_inter = n_shared * c->moe_inter;
    if (any_moe && (rc = ms_arch_check_moe(c, where, err))) return rc;
    if (any_dense && c->inter < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing intermediate_size", where);
    /* NoPE MLA: c->rope stays zero; scaling qk_head_dim^-0.5 */
    c->attn_scale = 1.0 / sqrt((double)(c->qk_nope_dim + c->qk_rope_dim));
    /* KPool indexer (index_kpool, default 16); a shared layer must follow a full one directly */
    return ms_arch_dsa_configure(j, c, 0, 0, 16, where, err);
}

static void bind_hc(ms_binder *b, const ms_config *c, ms_qmat *fn, float **base, float **scale, const char *p,
                    const char *site) {
    int64_t mix = (2 + c->hc_mult) * c->hc_mult;
    const int64_t fs[2] = {mix, c->hc_mult * c->hidden};
    ms_bind_tensor(b, fn, MS_W_MATRIX, 2, fs, mix, c->hc_mult * c->hidden, 0, "%shc_%s_fn", p, site);
    ms_bind_vec(b, base, MS_W_VECTOR, mix, 0, "%shc_%s_base", p, site);
    ms_bind_vec(b, scale, MS_W_VECTOR, 3, 0, "%shc_%s_scale", p, site);
}

static int bind(ms_binder *b, ms_model *m) {
    const ms_config *c = b->cfg;
    ms_bind_trunk(b, m, "model.language_model.embed_tokens", "model.language_model.norm.weight", "lm_head");
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        char p[96], a[128];
        snprintf(p, sizeof p, "model.language_model.layers.%d.", l);
        ms_layer *L = &m->layers[l];
        ms_bind_vec(b, &L->attn_norm, MS_W_NORM, c->hidden, 0, "%sinput_layernorm.weight", p);
        ms_bind_vec(b, &L->ffn_norm, MS_W_NORM, c->hidden, 0, "%spost_attention_layernorm.weight", p);
        if (c->hc_mult > 1) {
            bind_hc(b, c, &L->hc_attn_fn, &L->hc_attn_base, &L->hc_attn_scale, p, "attn");
            bind_hc(b, c, &L->hc_ffn_fn, &L->hc_ffn_base, &L->hc_ffn_scale, p, "ffn");
        }
        if (c->layer_attn[l] == MS_ATTN_KDA) {
            snprintf(a, sizeof a, "%sself_attn.", p);
            ms_bind_kda(b, m, l, a);
        } else {
            ms_bind_mla(b, m, l, p);
            if (c->layer_dsa[l] == 1) {
                snprintf(a, sizeof a, "%sself_attn.indexer.", p);
                ms_bind_dsa(b, m, l, a);
            }
        }
        if (c->layer_mlp[l] == MS_MLP_DENSE) {
            ms_bind_dense_mlp(b, m, l, p);
            continue;
        }
        char w[128], bias[160];
        snprintf(w, sizeof w, "%smlp.gate", p);
        snprintf(bias, sizeof bias, "%smlp.gate.e_score_correction_bias", p);
        ms_bind_router(b, m, l, w, bias);
        ms_bind_shared_experts(b, m, l, p);
        ms_bind_experts(b, m, l, "model.language_model.layers.%d.mlp.experts.%d.gate_proj",
                        "model.language_model.layers.%d.mlp.experts.%d.up_proj",
                        "model.language_model.layers.%d.mlp.experts.%d.down_proj");
    }
    return b->rc;
}

const ms_arch ms_arch_glm5_next = {"glm5_next", configure, bind};
