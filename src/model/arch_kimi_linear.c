/* arch_kimi_linear.c — Kimi Linear (Kimi-Linear-48B-A3B): KDA layers mixed
 * with MLA layers (NoPE: no rotary embedding anywhere) per layer_types /
 * linear_attn_config, and the DeepSeek-style MoE (sigmoid router with
 * e_score_correction_bias, group-limited top-k, shared experts) after
 * first_k_dense_replace dense layers (or per mlp_layer_types). The optional
 * KDA variants of Kimi K3 (linear_attn_config.gate_lower_bound,
 * use_full_rank_gate) and the other options of the official K3 text config
 * (SiTU, Attention Residuals, the MLA output gate, latent routed experts; see
 * k3_options) are read here too: arch_kimi_k3.c wraps this file.
 * transformers: models/kimi_linear/modeling_kimi_linear.py; checkpoint layout:
 * model.layers.N.self_attn.*, model.layers.N.block_sparse_moe.* with experts
 * w1 (gate), w3 (up), w2 (down). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

/* Mark layers listed (1-indexed) in linear_attn_config[key] as kind. */
static int mark_layers(const cJSON *lac, const char *key, ms_config *c, uint8_t kind, const char *where, ms_err *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(lac, key);
    if (!a || cJSON_IsNull(a)) return MS_OK;
    if (!cJSON_IsArray(a)) return ms_fail(err, MS_ERR_FORMAT, "%s: linear_attn_config.%s must be a list", where, key);
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        if (!ms_json_is_int(v, 1, c->n_layers))
            return ms_fail(err, MS_ERR_FORMAT, "%s: linear_attn_config.%s holds a layer outside 1..%lld", where, key,
                           (long long)c->n_layers);
        c->layer_attn[(int)v->valuedouble - 1] = kind;
    }
    return MS_OK;
}

/* A list of num_hidden_layers strings; each must be one of two names. */
static int string_schedule(const cJSON *j, const char *key, const char *a, const char *b, uint8_t ka, uint8_t kb,
                           uint8_t *out, int n, int *found, const char *where, ms_err *err) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, key);
    *found = 0;
    if (!arr || cJSON_IsNull(arr)) return MS_OK;
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != n)
        return ms_fail(err, MS_ERR_FORMAT, "%s: %s must be a list of num_hidden_layers (%d) names", where, key, n);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        if (cJSON_IsString(v) && !strcmp(v->valuestring, a)) out[i] = ka;
        else if (cJSON_IsString(v) && !strcmp(v->valuestring, b)) out[i] = kb;
        else return ms_fail(err, MS_ERR_FORMAT, "%s: %s[%d] must be \"%s\" or \"%s\"", where, key, i, a, b);
        i++;
    }
    *found = 1;
    return MS_OK;
}

/* An optional number that may be JSON null (the official configs write null for "off"). */
static int opt_num(const cJSON *j, const char *key, double *out, int *present, const char *where, ms_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    *present = 0;
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return ms_fail(err, MS_ERR_FORMAT, "%s: %s must be a number or null", where, key);
    *out = v->valuedouble;
    *present = 1;
    return MS_OK;
}

/* SiTU: beta tanh(g/beta) sigmoid(g) * linear_beta tanh(u/linear_beta). As the
 * official code: a missing or zero beta is 1, a missing linear_beta means u as is. */
static int situ_params(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    double beta = 0, lbeta = 0;
    int has_b, has_lb, rc;
    if ((rc = opt_num(j, "activation_situ_beta", &beta, &has_b, where, err)) ||
        (rc = opt_num(j, "activation_situ_linear_beta", &lbeta, &has_lb, where, err)))
        return rc;
    if (!has_b || beta == 0) beta = 1.0;
    if (!(beta > 0)) return ms_fail(err, MS_ERR_FORMAT, "%s: activation_situ_beta %g must be positive", where, beta);
    if (has_lb && !(lbeta > 0))
        return ms_fail(err, MS_ERR_FORMAT, "%s: activation_situ_linear_beta %g must be positive or null", where, lbeta);
    c->situ_beta = beta;
    c->situ_linear_beta = has_lb ? lbeta : 0;
    return MS_OK;
}

/* The Kimi K3 options of the official KimiLinearConfig, all off when absent or
 * null: Attention Residuals (attn_res_block_size), the MLA output gate
 * (mla_use_output_gate), latent routed experts (routed_expert_hidden_size,
 * latent_moe_use_norm). */
static int k3_options(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    double v = 0;
    int has, rc, gate = 0, lnorm = 0;
    if ((rc = opt_num(j, "attn_res_block_size", &v, &has, where, err))) return rc;
    if (has) {
        if (!(v >= 1 && v <= MS_MAX_LAYERS && v == floor(v)))
            return ms_fail(err, MS_ERR_FORMAT, "%s: attn_res_block_size %g must be an integer in [1, %d]", where, v,
                           MS_MAX_LAYERS);
        c->attn_res_block = (int64_t)v;
    }
    if ((rc = opt_num(j, "routed_expert_hidden_size", &v, &has, where, err))) return rc;
    if (has) {
        if (!(v >= 1 && v <= (1 << 24) && v == floor(v)))
            return ms_fail(err, MS_ERR_FORMAT, "%s: routed_expert_hidden_size %g must be a positive integer", where, v);
        c->latent_moe = 1;
        c->expert_hidden = (int64_t)v;
    }
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(j, "mla_use_output_gate");
    if (g && !cJSON_IsNull(g) && (rc = ms_json_opt_bool(j, "mla_use_output_gate", &gate, where, err))) return rc;
    const cJSON *ln = cJSON_GetObjectItemCaseSensitive(j, "latent_moe_use_norm");
    if (ln && !cJSON_IsNull(ln) && (rc = ms_json_opt_bool(j, "latent_moe_use_norm", &lnorm, where, err))) return rc;
    c->mla_out_gate = gate;
    c->latent_moe_norm = c->latent_moe && lnorm;
    return MS_OK;
}

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t n_shared = 0, first_dense = 1, top_k = 0, n_group = 0;
    int renorm = -1;
    const char *act = "silu";
    int rc;
    if ((rc = ms_json_opt_int(j, "q_lora_rank", 0, 1 << 20, &c->q_lora_rank, where, err)) ||
        (rc = ms_json_int(j, "kv_lora_rank", 1, 1 << 20, &c->kv_lora_rank, where, err)) ||
        (rc = ms_json_int(j, "qk_nope_head_dim", 0, 1 << 16, &c->qk_nope_dim, where, err)) ||
        (rc = ms_json_int(j, "qk_rope_head_dim", 0, 1024, &c->qk_rope_dim, where, err)) ||
        (rc = ms_json_int(j, "v_head_dim", 1, 1 << 16, &c->v_head_dim, where, err)) ||
        (rc = ms_json_opt_int(j, "num_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "num_experts_per_token", 1, 4096, &top_k, where, err)) ||
        (rc = ms_json_opt_int(j, "num_expert_group", 1, 4096, &n_group, where, err)) ||
        (rc = ms_json_opt_bool(j, "moe_renormalize", &renorm, where, err)) ||
        (rc = ms_json_opt_int(j, "num_shared_experts", 0, 1024, &n_shared, where, err)) ||
        (rc = ms_json_opt_int(j, "first_k_dense_replace", 0, MS_MAX_LAYERS, &first_dense, where, err)) ||
        (rc = ms_json_opt_int(j, "model_max_length", 1, INT64_C(1) << 40, &c->max_pos, where, err)) ||
        (rc = ms_json_opt_string(j, "hidden_act", &act, where, err)))
        return rc;
    if (!strcmp(act, "situ")) {
        c->act = c->expert_act = MS_ACT_SITU;
        if ((rc = situ_params(j, c, where, err))) return rc;
    } else if (strcmp(act, "silu")) {
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu, situ)", where, act);
    }
    if ((rc = k3_options(j, c, where, err))) return rc;
    if (c->n_heads < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing num_attention_heads", where);
    if (top_k) c->top_k = top_k;
    if (n_group) c->n_group = n_group;
    if (n_group && !cJSON_GetObjectItemCaseSensitive(j, "topk_group")) c->topk_group = n_group;
    /* transformers' KimiLinearConfig defaults: norm_topk_prob True */
    if (renorm >= 0) c->norm_topk_prob = renorm;
    else if (!cJSON_GetObjectItemCaseSensitive(j, "norm_topk_prob")) c->norm_topk_prob = 1;

    /* KDA dimensions: linear_attn_config, else the flattened linear_* keys */
    const cJSON *lac = cJSON_GetObjectItemCaseSensitive(j, "linear_attn_config");
    if (lac && !cJSON_IsNull(lac) && !cJSON_IsObject(lac))
        return ms_fail(err, MS_ERR_FORMAT, "%s: linear_attn_config must be an object", where);
    c->kda_heads = 32, c->kda_head_dim = 128, c->kda_conv = 4;
    if ((rc = ms_json_opt_int(j, "linear_num_heads", 1, 65536, &c->kda_heads, where, err)) ||
        (rc = ms_json_opt_int(j, "linear_head_dim", 1, 1024, &c->kda_head_dim, where, err)) ||
        (rc = ms_json_opt_int(j, "linear_conv_kernel_dim", 1, 16, &c->kda_conv, where, err)))
        return rc;
    double lb = NAN;
    int full_gate = 0;
    if (cJSON_IsObject(lac)) {
        if ((rc = ms_json_opt_int(lac, "num_heads", 1, 65536, &c->kda_heads, where, err)) ||
            (rc = ms_json_opt_int(lac, "head_dim", 1, 1024, &c->kda_head_dim, where, err)) ||
            (rc = ms_json_opt_int(lac, "short_conv_kernel_size", 1, 16, &c->kda_conv, where, err)) ||
            (rc = ms_json_opt_double(lac, "gate_lower_bound", &lb, where, err)) ||
            (rc = ms_json_opt_bool(lac, "use_full_rank_gate", &full_gate, where, err)))
            return rc;
    }
    if (!isnan(lb)) {
        if (!(lb < 0 && isfinite(lb)))
            return ms_fail(err, MS_ERR_FORMAT, "%s: linear_attn_config.gate_lower_bound %g must be negative", where, lb);
        c->kda_lower_bound_gate = 1;
        c->kda_lower_bound = lb;
    }
    c->kda_full_rank_gate = full_gate;

    /* attention schedule: layer_types, else kda_layers/full_attn_layers, else every 4th full */
    int found = 0;
    if ((rc = string_schedule(j, "layer_types", "linear_attention", "full_attention", MS_ATTN_KDA, MS_ATTN_MLA,
                              c->layer_attn, (int)c->n_layers, &found, where, err)))
        return rc;
    if (!found && cJSON_IsObject(lac) && cJSON_GetObjectItemCaseSensitive(lac, "kda_layers") &&
        cJSON_GetObjectItemCaseSensitive(lac, "full_attn_layers")) {
        memset(c->layer_attn, 0, sizeof c->layer_attn);
        if ((rc = mark_layers(lac, "full_attn_layers", c, MS_ATTN_MLA, where, err)) ||
            (rc = mark_layers(lac, "kda_layers", c, MS_ATTN_KDA, where, err)))
            return rc;
        for (int l = 0; l < c->n_layers; l++)
            if (!c->layer_attn[l])
                return ms_fail(err, MS_ERR_FORMAT, "%s: layer %d is in neither kda_layers nor full_attn_layers", where,
                               l + 1);
        found = 1;
    }
    if (!found)
        for (int l = 0; l < c->n_layers; l++) c->layer_attn[l] = (l && l % 4 == 0) ? MS_ATTN_MLA : MS_ATTN_KDA;
    if ((rc = string_schedule(j, "mlp_layer_types", "dense", "sparse", MS_MLP_DENSE, MS_MLP_MOE, c->layer_mlp,
                              (int)c->n_layers, &found, where, err)))
        return rc;
    if (!found)
        for (int l = 0; l < c->n_layers; l++) c->layer_mlp[l] = l < first_dense ? MS_MLP_DENSE : MS_MLP_MOE;

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
    if ((int64_t)c->kda_heads * c->kda_head_dim > (1 << 24))
        return ms_fail(err, MS_ERR_FORMAT, "%s: KDA width %lld x %lld is too large", where, (long long)c->kda_heads,
                       (long long)c->kda_head_dim);
    /* MLA without rotary embedding: c->rope stays zero (dim 0), the rope part of k is shared as is */
    c->attn_scale = 1.0 / sqrt((double)(c->qk_nope_dim + c->qk_rope_dim));
    c->mla_norm_eps = 1e-6; /* q_a_layernorm / kv_a_layernorm are built without the config's eps */
    return MS_OK;
}

static int bind(ms_binder *b, ms_model *m) {
    const ms_config *c = b->cfg;
    ms_bind_trunk(b, m, "model.embed_tokens", "model.norm.weight", "lm_head");
    if (c->attn_res_block) ms_bind_attn_res(b, &m->out_res, "model.output_attn_res_");
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        char p[64], a[96], f[96];
        snprintf(p, sizeof p, "model.layers.%d.", l);
        ms_layer *L = &m->layers[l];
        ms_bind_vec(b, &L->attn_norm, MS_W_NORM, c->hidden, 0, "%sinput_layernorm.weight", p);
        ms_bind_vec(b, &L->ffn_norm, MS_W_NORM, c->hidden, 0, "%spost_attention_layernorm.weight", p);
        if (c->attn_res_block) {
            snprintf(a, sizeof a, "%sself_attention_res_", p);
            ms_bind_attn_res(b, &L->attn_res, a);
            snprintf(a, sizeof a, "%smlp_res_", p);
            ms_bind_attn_res(b, &L->mlp_res, a);
        }
        if (c->layer_attn[l] == MS_ATTN_KDA) {
            snprintf(a, sizeof a, "%sself_attn.", p);
            ms_bind_kda(b, m, l, a);
        } else {
            ms_bind_mla(b, m, l, p);
        }
        /* the feed-forward lives under block_sparse_moe. (original layout) or mlp. */
        const char *ff = "block_sparse_moe.";
        if (b->ck && !ms_bind_has(b, "%sblock_sparse_moe.%s.weight", p,
                                  c->layer_mlp[l] == MS_MLP_DENSE ? "gate_proj" : "gate"))
            ff = "mlp.";
        snprintf(f, sizeof f, "%s%s", p, ff);
        if (c->layer_mlp[l] == MS_MLP_DENSE) {
            ms_bind_mlp(b, m, l, f, c->inter, "gate_proj", "up_proj", "down_proj");
            continue;
        }
        char w[128], bias[128], g[160], u[160], d[160];
        snprintf(w, sizeof w, "%sgate", f);
        snprintf(bias, sizeof bias, "%sgate.e_score_correction_bias", f);
        ms_bind_router(b, m, l, w, bias);
        if (c->shared_inter)
            ms_bind_mlp(b, m, l, f, c->shared_inter, "shared_experts.gate_proj", "shared_experts.up_proj",
                        "shared_experts.down_proj");
        if (c->latent_moe) ms_bind_latent_moe(b, m, l, f);
        snprintf(g, sizeof g, "model.layers.%%d.%sexperts.%%d.w1", ff);
        snprintf(u, sizeof u, "model.layers.%%d.%sexperts.%%d.w3", ff);
        snprintf(d, sizeof d, "model.layers.%%d.%sexperts.%%d.w2", ff);
        ms_bind_experts(b, m, l, g, u, d);
    }
    return b->rc;
}

const ms_arch ms_arch_kimi_linear = {"kimi_linear", configure, bind};
