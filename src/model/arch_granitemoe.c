/* arch_granitemoe.c — IBM Granite MoE (granitemoe: Granite 3.0/3.1 MoE) and
 * GraniteMoeShared (granitemoeshared): GQA with head_dim = hidden / heads,
 * rotate_half RoPE, softmax over the top-k router logits (MS_ROUTER_TOPK_SOFTMAX),
 * experts of intermediate_size stored fused per layer
 * (block_sparse_moe.input_linear [E, 2I, H]: gate rows then up rows;
 * output_linear [E, H, I]), and four multipliers, as config fields the engine
 * applies: embedding_multiplier (embed_scale), attention_multiplier (the softmax
 * scale itself), residual_multiplier (residual_scale: every sublayer's output
 * before its residual add) and logits_scaling (logit_scale = 1 / logits_scaling).
 * GraniteMoeShared adds a dense shared MLP of shared_intermediate_size
 * (shared_mlp.input_linear [2S, H], gate rows then up rows; output_linear [H, S])
 * beside the experts. GraniteMoeSWA (granitemoe_swa) is GraniteMoeShared (shared MLP
 * off by default) with GraniteSWA's attention: per-layer sliding windows
 * (layer_types; default every fourth layer from 0 full), a learnable per-head sink
 * logit in every layer's softmax (self_attn.sinks; transformers' sigmoid(lse - sink)
 * output scale is the same thing), and per-layer RoPE bases layer_rope_theta where 0
 * is NoPE (any other base than rope_theta is refused); the experts and router under
 * either name form (input_linear / output_linear and router.layer, or
 * experts.gate_up_proj / down_proj and router.weight). transformers:
 * models/granitemoe, models/granitemoeshared, models/granitemoe_swa. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

static int configure_common(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    double em = 1.0, am = 0, rm = 1.0, ls = 1.0;
    const char *pe = "rope";
    int rc;
    if ((rc = ms_json_int(j, "num_local_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_double(j, "embedding_multiplier", &em, where, err)) ||
        (rc = ms_json_opt_double(j, "attention_multiplier", &am, where, err)) ||
        (rc = ms_json_opt_double(j, "residual_multiplier", &rm, where, err)) ||
        (rc = ms_json_opt_double(j, "logits_scaling", &ls, where, err)) ||
        (rc = ms_json_opt_string(j, "position_embedding_type", &pe, where, err)))
        return rc;
    if (strcmp(pe, "rope"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: position_embedding_type \"%.32s\" is not supported (rope)", where, pe);
    if (!(ls > 0) || !(em > 0) || !(rm > 0) || am < 0)
        return ms_fail(err, MS_ERR_FORMAT, "%s: embedding_multiplier, residual_multiplier and logits_scaling must be "
                       "positive, attention_multiplier not negative", where);
    if (c->n_heads < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing num_attention_heads", where);
    c->head_dim = c->hidden / c->n_heads; /* GraniteMoeAttention: hidden_size // num_heads */
    c->moe_inter = c->inter;
    c->router = MS_ROUTER_TOPK_SOFTMAX;
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0;
    c->embed_scale = em;
    c->residual_scale = rm;
    c->logit_scale = 1.0 / ls;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_HALF, where, err))) return rc;
    if (am > 0) c->attn_scale = am;
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = MS_MLP_MOE;
    }
    return MS_OK;
}

static int configure_granitemoe(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    return configure_common(j, c, where, err);
}

static int configure_granitemoeshared(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int rc = configure_common(j, c, where, err);
    if (!rc) rc = ms_json_opt_int(j, "shared_intermediate_size", 0, INT32_MAX, &c->shared_inter, where, err);
    return rc;
}

/* sliding_window (default 128), layer_types (default: layer i full when i % 4 == 0), layer_rope_theta. */
static int configure_granitemoe_swa(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t window = 128;
    int rc = configure_granitemoeshared(j, c, where, err);
    if (rc) return rc;
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    if (cJSON_IsNull(w)) window = 0;
    else if ((rc = ms_json_opt_int(j, "sliding_window", 1, INT32_MAX, &window, where, err))) return rc;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(j, "layer_rope_theta");
    if (lt && !cJSON_IsNull(lt) && (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers))
        return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types must be a list of num_hidden_layers names", where);
    if (th && !cJSON_IsNull(th) && (!cJSON_IsArray(th) || cJSON_GetArraySize(th) != c->n_layers))
        return ms_fail(err, MS_ERR_FORMAT, "%s: layer_rope_theta must be a list of num_hidden_layers numbers", where);
    const cJSON *lv = cJSON_IsArray(lt) ? lt->child : NULL, *tv = cJSON_IsArray(th) ? th->child : NULL;
    memset(&c->rope_alt, 0, sizeof c->rope_alt); /* NoPE layers: a RoPE of no rotary dims */
    c->rope_alt.layout = MS_ROPE_HALF;
    for (int l = 0; l < c->n_layers; l++) {
        int sliding = l % 4 != 0;
        if (lv) {
            if (cJSON_IsString(lv) && !strcmp(lv->valuestring, "sliding_attention")) sliding = 1;
            else if (cJSON_IsString(lv) && !strcmp(lv->valuestring, "full_attention")) sliding = 0;
            else return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types[%d] must be \"full_attention\" or \"sliding_attention\"",
                                where, l);
            lv = lv->next;
        }
        if (sliding && window < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: sliding_attention layers need sliding_window", where);
        c->layer_window[l] = sliding ? (int32_t)window : 0;
        c->layer_sinks[l] = 1;
        if (tv) {
            if (!cJSON_IsNumber(tv)) return ms_fail(err, MS_ERR_FORMAT, "%s: layer_rope_theta[%d] is not a number", where, l);
            double t = tv->valuedouble;
            if (t == 0) c->layer_rope[l] = 1;
            else if (fabs(t - c->rope.theta) > 1e-9 * c->rope.theta)
                return ms_fail(err, MS_ERR_UNSUPPORTED,
                               "%s: layer_rope_theta[%d] = %g: a RoPE base other than rope_theta (%g) or 0 (NoPE) is not "
                               "supported",
                               where, l, t, c->rope.theta);
            tv = tv->next;
        }
    }
    c->o_bias = c->attn_bias; /* LlamaAttention: o_proj's bias follows attention_bias */
    return MS_OK;
}

/* A fused [2S, H] gate-then-up Linear as two views (L->gate, L->up) and its [H, S] down. */
static int bind_shared_mlp(ms_binder *b, ms_layer *L, const char *pfx) {
    const ms_config *c = b->cfg;
    const int64_t S = c->shared_inter, D = c->hidden;
    ms_qmat gu;
    ms_bind_mat(b, &gu, MS_W_MATRIX, 2 * S, D, "%sshared_mlp.input_linear", pfx);
    ms_bind_mat(b, &L->down, MS_W_MATRIX, D, S, "%sshared_mlp.output_linear", pfx);
    if (b->rc || !b->ck) return b->rc;
    if (gu.dtype != MS_DT_BF16 && gu.dtype != MS_DT_F16 && gu.dtype != MS_DT_F32)
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "%sshared_mlp.input_linear: dtype %s is not supported", pfx,
                               ms_dtype_name(gu.dtype));
    const size_t half = (size_t)(S * D) * (size_t)ms_dtype_bits(gu.dtype) / 8;
    L->gate = (ms_qmat){.dtype = gu.dtype, .rows = S, .cols = D, .data = gu.data};
    L->up = (ms_qmat){.dtype = gu.dtype, .rows = S, .cols = D, .data = (const uint8_t *)gu.data + half};
    return MS_OK;
}

static int ffn(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    char w[200], gu[200], dn[200];
    snprintf(w, sizeof w, "%sblock_sparse_moe.router.layer", p);
    ms_bind_router(b, m, l, w, NULL);
    snprintf(gu, sizeof gu, "%sblock_sparse_moe.input_linear.weight", p);
    snprintf(dn, sizeof dn, "%sblock_sparse_moe.output_linear.weight", p);
    ms_bind_fused_experts(b, m, l, gu, dn);
    if (c->shared_inter) bind_shared_mlp(b, &m->layers[l], p);
    return b->rc;
}

static int bind(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, ms_bind_gqa, ffn); }

/* GraniteMoeSWA: the router and the experts each under the older name (granitemoe's router.layer,
 * input_linear / output_linear) or the newer (router.weight, experts.gate_up_proj / down_proj);
 * spec mode records the older. */
static int ffn_swa(ms_binder *b, ms_model *m, int l, const char *p) {
    char w[200], gu[200], dn[200];
    int old_router = !b->ck || ms_bind_has(b, "%sblock_sparse_moe.router.layer.weight", p);
    int old_experts = !b->ck || ms_bind_has(b, "%sblock_sparse_moe.input_linear.weight", p);
    snprintf(w, sizeof w, "%sblock_sparse_moe.router%s", p, old_router ? ".layer" : "");
    ms_bind_router(b, m, l, w, NULL);
    snprintf(gu, sizeof gu, "%sblock_sparse_moe.%s", p, old_experts ? "input_linear.weight" : "experts.gate_up_proj");
    snprintf(dn, sizeof dn, "%sblock_sparse_moe.%s", p, old_experts ? "output_linear.weight" : "experts.down_proj");
    ms_bind_fused_experts(b, m, l, gu, dn);
    if (b->cfg->shared_inter) bind_shared_mlp(b, &m->layers[l], p);
    return b->rc;
}

/* GQA with the per-head sinks (and o_proj's bias with attention_bias). */
static int attn_swa(ms_binder *b, ms_model *m, int l, const char *p) {
    ms_layer *L = &m->layers[l];
    if (ms_bind_gqa(b, m, l, p)) return b->rc;
    if (b->cfg->o_bias) ms_bind_vec(b, &L->bo, MS_W_VECTOR, b->cfg->hidden, 0, "%sself_attn.o_proj.bias", p);
    return ms_bind_vec(b, &L->sinks, MS_W_VECTOR, b->cfg->n_heads, 0, "%sself_attn.sinks", p);
}

static int bind_swa(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, attn_swa, ffn_swa); }

const ms_arch ms_arch_granitemoe = {"granitemoe", configure_granitemoe, bind};
const ms_arch ms_arch_granitemoeshared = {"granitemoeshared", configure_granitemoeshared, bind};
const ms_arch ms_arch_granitemoe_swa = {"granitemoe_swa", configure_granitemoe_swa, bind_swa};
