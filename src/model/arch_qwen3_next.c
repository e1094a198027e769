/* arch_qwen3_next.c — Qwen3-Next: gated DeltaNet linear-attention layers
 * (engine/gdn_block.h) mixed with gated full attention per layer_types
 * (default: every 4th layer full), and the Qwen MoE (softmax router,
 * norm_topk_prob) with one shared expert scaled by sigmoid(shared_expert_gate x).
 * Full attention: GQA with per-head q/k RMSNorm, partial rotary (rotate_half
 * over the first head_dim * partial_rotary_factor dims, default 0.25), and
 * q_proj producing [query, gate] per head; the attention output is multiplied
 * by sigmoid(gate) before o_proj. Every Qwen3NextRMSNorm (input/post-attention
 * layernorms, q/k norms, the final norm) stores zero-centred weights and
 * scales by (1 + w): the binder turns those F32 copies into 1 + w. The gated
 * DeltaNet's output norm (RMSNormGated) scales by w as stored.
 * transformers: models/qwen3_next/modeling_qwen3_next.py; checkpoint layout:
 * model.layers.N.linear_attn.{in_proj_qkvz,in_proj_ba,conv1d,A_log,dt_bias,norm,
 * out_proj}, model.layers.N.self_attn.*, model.layers.N.mlp.{gate,experts.E.*,
 * shared_expert.*,shared_expert_gate}. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

/* rotary dims: ms_arch_rotary_dim, with transformers' Qwen3-Next default factor 0.25 */
static int rotary_dim(const cJSON *j, const ms_config *c, int64_t *rd, const char *where, ms_err *err) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    int given = cJSON_GetObjectItemCaseSensitive(j, "rotary_dim") ||
                cJSON_GetObjectItemCaseSensitive(j, "partial_rotary_factor") ||
                (cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "partial_rotary_factor"));
    if (given) return ms_arch_rotary_dim(j, c, rd, where, err);
    *rd = (int64_t)(c->head_dim * 0.25);
    return MS_OK;
}

static int layer_types(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (!arr || cJSON_IsNull(arr)) { /* transformers' default: full attention every 4th layer */
        for (int l = 0; l < c->n_layers; l++) c->layer_attn[l] = (l + 1) % 4 ? MS_ATTN_GDN : MS_ATTN_GQA;
        return MS_OK;
    }
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != c->n_layers)
        return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types must be a list of num_hidden_layers (%lld) names", where,
                       (long long)c->n_layers);
    int l = 0;
    for (const cJSON *v = arr->child; v; v = v->next, l++) {
        if (cJSON_IsString(v) && !strcmp(v->valuestring, "linear_attention")) c->layer_attn[l] = MS_ATTN_GDN;
        else if (cJSON_IsString(v) && !strcmp(v->valuestring, "full_attention")) c->layer_attn[l] = MS_ATTN_GQA;
        else
            return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types[%d] must be \"linear_attention\" or \"full_attention\"",
                           where, l);
    }
    return MS_OK;
}

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t step = 1;
    const char *act = "silu";
    int rc;
    /* transformers' Qwen3NextConfig defaults for keys a config may leave out */
    if (!cJSON_GetObjectItemCaseSensitive(j, "head_dim")) c->head_dim = 256;
    if (!cJSON_GetObjectItemCaseSensitive(j, "norm_topk_prob")) c->norm_topk_prob = 1;
    if (!cJSON_GetObjectItemCaseSensitive(j, "num_experts_per_tok")) c->top_k = 10;
    if (!cJSON_GetObjectItemCaseSensitive(j, "moe_intermediate_size")) c->moe_inter = 512;
    c->n_experts = 512;
    c->shared_inter = 512;
    c->gdn_k_heads = 16, c->gdn_v_heads = 32, c->gdn_k_dim = 128, c->gdn_v_dim = 128, c->kda_conv = 4;
    if ((rc = ms_json_opt_int(j, "num_experts", 0, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "decoder_sparse_step", 1, MS_MAX_LAYERS, &step, where, err)) ||
        (rc = ms_json_opt_int(j, "shared_expert_intermediate_size", 0, 1 << 24, &c->shared_inter, where, err)) ||
        (rc = ms_json_opt_int(j, "linear_num_key_heads", 1, 65536, &c->gdn_k_heads, where, err)) ||
        (rc = ms_json_opt_int(j, "linear_num_value_heads", 1, 65536, &c->gdn_v_heads, where, err)) ||
        (rc = ms_json_opt_int(j, "linear_key_head_dim", 1, 1024, &c->gdn_k_dim, where, err)) ||
        (rc = ms_json_opt_int(j, "linear_value_head_dim", 1, 1024, &c->gdn_v_dim, where, err)) ||
        (rc = ms_json_opt_int(j, "linear_conv_kernel_dim", 1, 16, &c->kda_conv, where, err)) ||
        (rc = ms_json_opt_string(j, "hidden_act", &act, where, err)))
        return rc;
    if (strcmp(act, "silu"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu)", where, act);
    if (c->gdn_v_heads % c->gdn_k_heads)
        return ms_fail(err, MS_ERR_FORMAT, "%s: linear_num_value_heads %lld must be a multiple of linear_num_key_heads %lld",
                       where, (long long)c->gdn_v_heads, (long long)c->gdn_k_heads);
    if (c->gdn_v_heads * c->gdn_v_dim > (1 << 24) || c->gdn_k_heads * c->gdn_k_dim > (1 << 24))
        return ms_fail(err, MS_ERR_FORMAT, "%s: linear attention width is too large", where);
    if (c->n_heads < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing num_attention_heads", where);
    c->router = MS_ROUTER_SOFTMAX;
    c->qk_norm = MS_QKNORM_HEAD;
    c->attn_out_gate = 1;
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0;
    c->shared_expert_gate = c->shared_inter > 0;
    if ((rc = ms_arch_check_gqa(c, where, err))) return rc;
    int64_t rd;
    if ((rc = rotary_dim(j, c, &rd, where, err)) || (rc = ms_config_rope(j, c, rd, MS_ROPE_HALF, where, err)))
        return rc;
    c->attn_scale = 1.0 / sqrt((double)c->head_dim);
    if ((rc = layer_types(j, c, where, err))) return rc;
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
    int any_moe = 0;
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_mlp[l] = (!mlp_only[l] && c->n_experts > 0 && (l + 1) % step == 0) ? MS_MLP_MOE : MS_MLP_DENSE;
        any_moe |= c->layer_mlp[l] == MS_MLP_MOE;
        if (c->layer_mlp[l] == MS_MLP_DENSE && c->inter < 1)
            return ms_fail(err, MS_ERR_FORMAT, "%s: dense layers need intermediate_size", where);
    }
    if (any_moe && (rc = ms_arch_check_moe(c, where, err))) return rc;
    return MS_OK;
}

/* A Qwen3NextRMSNorm weight w as the 1 + w the norm multiplies by (load mode only). */
static void zero_centred(float *w, int64_t n) {
    for (int64_t i = 0; w && i < n; i++) w[i] += 1.0f;
}

static int bind_gdn(ms_binder *b, ms_gdn_weights *w, const char *pfx) {
    const ms_config *c = b->cfg;
    const int64_t Kd = c->gdn_k_heads * c->gdn_k_dim, Vd = c->gdn_v_heads * c->gdn_v_dim, D = c->hidden;
    const int64_t C = 2 * Kd + Vd, K = c->kda_conv, Hv = c->gdn_v_heads;
    if (c->gdn_split) { /* Qwen3.5: [q | k | v], z, b, a as separate matrices */
        ms_bind_mat(b, &w->in_qkv, MS_W_MATRIX, 2 * Kd + Vd, D, "%sin_proj_qkv", pfx);
        ms_bind_mat(b, &w->in_z, MS_W_MATRIX, Vd, D, "%sin_proj_z", pfx);
        ms_bind_mat(b, &w->in_b, MS_W_MATRIX, Hv, D, "%sin_proj_b", pfx);
        ms_bind_mat(b, &w->in_a, MS_W_MATRIX, Hv, D, "%sin_proj_a", pfx);
    } else {
        ms_bind_mat(b, &w->in_qkvz, MS_W_MATRIX, 2 * Kd + 2 * Vd, D, "%sin_proj_qkvz", pfx);
        ms_bind_mat(b, &w->in_ba, MS_W_MATRIX, 2 * Hv, D, "%sin_proj_ba", pfx);
    }
    const int64_t conv_shape[3] = {C, 1, K}, hs[1] = {Hv}, ds[1] = {c->gdn_v_dim};
    ms_bind_tensor(b, &w->conv, MS_W_VECTOR, 3, conv_shape, C, K, 0, "%sconv1d.weight", pfx);
    ms_bind_tensor(b, &w->A_log, MS_W_VECTOR, 1, hs, 1, Hv, 0, "%sA_log", pfx);
    ms_bind_tensor(b, &w->dt_bias, MS_W_VECTOR, 1, hs, 1, Hv, 0, "%sdt_bias", pfx);
    ms_bind_tensor(b, &w->norm, MS_W_NORM, 1, ds, 1, c->gdn_v_dim, 0, "%snorm.weight", pfx);
    ms_bind_mat(b, &w->out_proj, MS_W_MATRIX, D, Vd, "%sout_proj", pfx);
    if (b->ck && !b->rc && ms_bind_has(b, "%sconv1d.bias", pfx))
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "%sconv1d.bias: a conv1d bias is not supported", pfx);
    return b->rc;
}

/* Bind the Qwen3-Next text model whose modules are under tm ("model." for
 * Qwen3NextForCausalLM, "model.language_model." for a multimodal wrapper such as
 * Qwen3.5's): tm embed_tokens, layers.N.*, norm, and the head "lm_head". The
 * gated DeltaNet projections are fused or split per cfg->gdn_split. Also the
 * bind of arch_qwen3_5_moe.c. */
int ms_bind_qwen3_next_text(ms_binder *b, ms_model *m, const char *tm) {
    const ms_config *c = b->cfg;
    char e[96], fn[96], ge[160], ue[160], de[160];
    snprintf(e, sizeof e, "%sembed_tokens", tm);
    snprintf(fn, sizeof fn, "%snorm.weight", tm);
    snprintf(ge, sizeof ge, "%slayers.%%d.mlp.experts.%%d.gate_proj", tm);
    snprintf(ue, sizeof ue, "%slayers.%%d.mlp.experts.%%d.up_proj", tm);
    snprintf(de, sizeof de, "%slayers.%%d.mlp.experts.%%d.down_proj", tm);
    ms_bind_trunk(b, m, e, fn, "lm_head");
    zero_centred(m->final_norm, c->hidden);
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        char p[96], a[128], w[128];
        snprintf(p, sizeof p, "%slayers.%d.", tm, l);
        ms_layer *L = &m->layers[l];
        ms_bind_vec(b, &L->attn_norm, MS_W_NORM, c->hidden, 0, "%sinput_layernorm.weight", p);
        ms_bind_vec(b, &L->ffn_norm, MS_W_NORM, c->hidden, 0, "%spost_attention_layernorm.weight", p);
        zero_centred(L->attn_norm, c->hidden);
        zero_centred(L->ffn_norm, c->hidden);
        if (c->layer_attn[l] == MS_ATTN_GDN) {
            snprintf(a, sizeof a, "%slinear_attn.", p);
            bind_gdn(b, &L->gdn, a);
        } else {
            ms_bind_gqa(b, m, l, p);
            zero_centred(L->q_norm, c->head_dim);
            zero_centred(L->k_norm, c->head_dim);
        }
        if (c->layer_mlp[l] == MS_MLP_DENSE) {
            ms_bind_dense_mlp(b, m, l, p);
            continue;
        }
        snprintf(w, sizeof w, "%smlp.gate", p);
        ms_bind_router(b, m, l, w, NULL);
        ms_bind_gated_shared_expert(b, m, l, p);
        ms_bind_experts(b, m, l, ge, ue, de);
    }
    return b->rc;
}

static int bind(ms_binder *b, ms_model *m) { return ms_bind_qwen3_next_text(b, m, "model."); }

const ms_arch ms_arch_qwen3_next = {"qwen3_next", configure, bind};
