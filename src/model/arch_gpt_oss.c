/* arch_gpt_oss.c — gpt-oss: GQA with q/k/v/o biases, per-head attention sinks,
 * alternating sliding/full layers (layer_types), YaRN RoPE (rotate_half), a
 * router Linear with bias choosing top-k logits then softmax over them, and
 * fused experts (interleaved gate/up rows, biases, clamped SwiGLU). Experts
 * are MXFP4 (_blocks/_scales, the official format) or BF16 stored transposed
 * ([E, in, out], x @ W). transformers: models/gpt_oss. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t window = 0;
    int rc;
    if ((rc = ms_json_int(j, "num_local_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "sliding_window", 0, INT64_C(1) << 30, &window, where, err)))
        return rc;
    c->moe_inter = c->inter; /* experts use intermediate_size */
    c->router = MS_ROUTER_TOPK_SOFTMAX;
    c->router_logit_bias = 1;
    c->expert_bias = 1;
    /* clamped SwiGLU: (up + 1) * g * sigmoid(1.702 g), g = min(gate, limit), up clamped to ±limit */
    c->expert_act = MS_ACT_SILU;
    c->act_alpha = 1.702;
    c->act_up_offset = 1.0;
    c->act_limit = 7.0;
    if ((rc = ms_json_opt_double(j, "swiglu_limit", &c->act_limit, where, err))) return rc;
    if (!(c->act_limit > 0)) return ms_fail(err, MS_ERR_FORMAT, "%s: swiglu_limit must be > 0", where);
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0;
    c->attn_bias = 1;
    c->o_bias = 1;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if (c->hidden % 32 || c->moe_inter % 32)
        return ms_fail(err, MS_ERR_FORMAT, "%s: hidden_size and intermediate_size must be multiples of 32", where);
    if ((rc = ms_arch_gqa_rope(j, c, MS_ROPE_HALF, where, err))) return rc;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (lt && (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers))
        return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types must list %lld layer types", where, (long long)c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = MS_MLP_MOE;
        c->layer_sinks[l] = 1;
        const cJSON *t = lt ? cJSON_GetArrayItem(lt, l) : NULL;
        if (t && (!cJSON_IsString(t) || (strcmp(t->valuestring, "sliding_attention") && strcmp(t->valuestring, "full_attention"))))
            return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types[%d] must be sliding_attention or full_attention", where, l);
        if (t && !strcmp(t->valuestring, "sliding_attention")) {
            if (window < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: sliding layers need sliding_window", where);
            c->layer_window[l] = (int32_t)window;
        }
    }
    return MS_OK;
}

/* A fused expert tensor (full name), shape-checked and counted as bound. */
static const ms_tensor *fused(ms_binder *b, const char *name, int ndim, const int64_t *shape) {
    return b->rc ? NULL : ms_bind_find(b, name, ndim, shape);
}

/* BF16/F16/F32 experts stored [E, in, out]: transposed copies [E, out, in] in the
 * stored dtype (this layout is a conversion artifact; the official checkpoints are MXFP4). */
static void *transpose_experts(const ms_tensor *t, int64_t E, int64_t in, int64_t out) {
    size_t es = (size_t)ms_dtype_bits(t->dtype) / 8;
    uint8_t *dst = malloc((size_t)(E * in * out) * es);
    if (!dst) return NULL;
    const uint8_t *src = t->data;
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = 0; i < in; i++)
            for (int64_t o = 0; o < out; o++)
                memcpy(dst + ((e * out + o) * in + i) * es, src + ((e * in + i) * out + o) * es, es);
    return dst;
}

static void bind_experts(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[l];
    int64_t E = c->n_experts, D = c->hidden, I = c->moe_inter;
    char n1[200], n2[200];
    if (!b->ck) { /* spec mode (synth): the BF16 fused layout */
        ms_qmat tmp;
        ms_bind_tensor(b, &tmp, MS_W_EXPERT, 3, (int64_t[]){E, D, 2 * I}, E * D, 2 * I, 0, "%smlp.experts.gate_up_proj", p);
        ms_bind_tensor(b, &tmp, MS_W_EXPERT, 3, (int64_t[]){E, I, D}, E * I, D, 0, "%smlp.experts.down_proj", p);
        ms_bind_tensor(b, &tmp, MS_W_VECTOR, 2, (int64_t[]){E, 2 * I}, E, 2 * I, 0, "%smlp.experts.gate_up_proj_bias", p);
        ms_bind_tensor(b, &tmp, MS_W_VECTOR, 2, (int64_t[]){E, D}, E, D, 0, "%smlp.experts.down_proj_bias", p);
        return;
    }
    L->experts = calloc((size_t)E, sizeof *L->experts);
    if (!L->experts) {
        b->rc = ms_fail(b->err, MS_ERR_NOMEM, "out of memory");
        return;
    }
    snprintf(n1, sizeof n1, "%s%smlp.experts.gate_up_proj_bias", b->prefix, p);
    const ms_tensor *gub = fused(b, n1, 2, (int64_t[]){E, 2 * I});
    snprintf(n1, sizeof n1, "%s%smlp.experts.down_proj_bias", b->prefix, p);
    const ms_tensor *db = fused(b, n1, 2, (int64_t[]){E, D});
    snprintf(n1, sizeof n1, "%s%smlp.experts.gate_up_proj_blocks", b->prefix, p);
    if (!b->rc && ms_checkpoint_find(b->ck, n1)) { /* MXFP4 */
        const ms_tensor *gu = fused(b, n1, 4, (int64_t[]){E, 2 * I, D / 32, 16});
        snprintf(n2, sizeof n2, "%s%smlp.experts.gate_up_proj_scales", b->prefix, p);
        const ms_tensor *gus = fused(b, n2, 3, (int64_t[]){E, 2 * I, D / 32});
        snprintf(n1, sizeof n1, "%s%smlp.experts.down_proj_blocks", b->prefix, p);
        const ms_tensor *dn = fused(b, n1, 4, (int64_t[]){E, D, I / 32, 16});
        snprintf(n2, sizeof n2, "%s%smlp.experts.down_proj_scales", b->prefix, p);
        const ms_tensor *dns = fused(b, n2, 3, (int64_t[]){E, D, I / 32});
        if (b->rc) return;
        const ms_tensor *u8[4] = {gu, gus, dn, dns};
        for (int i = 0; i < 4; i++)
            if (u8[i]->dtype != MS_DT_U8) {
                b->rc = ms_fail(b->err, MS_ERR_FORMAT, "tensor \"%s\": MXFP4 blocks/scales must be U8, found %s",
                                u8[i]->name, ms_dtype_name(u8[i]->dtype));
                return;
            }
        for (int64_t e = 0; e < E; e++) {
            ms_expert_view *v = &L->experts[e];
            v->gate = (ms_qmat){MS_DT_F4, 2 * I, D, (const uint8_t *)gu->data + e * 2 * I * D / 2, MS_DT_F8_E8M0,
                                (const uint8_t *)gus->data + e * 2 * I * D / 32, 1, 32, NULL};
            v->down = (ms_qmat){MS_DT_F4, D, I, (const uint8_t *)dn->data + e * D * I / 2, MS_DT_F8_E8M0,
                                (const uint8_t *)dns->data + e * D * I / 32, 1, 32, NULL};
        }
    } else {
        snprintf(n1, sizeof n1, "%s%smlp.experts.gate_up_proj", b->prefix, p);
        const ms_tensor *gu = fused(b, n1, 3, (int64_t[]){E, D, 2 * I});
        snprintf(n1, sizeof n1, "%s%smlp.experts.down_proj", b->prefix, p);
        const ms_tensor *dn = fused(b, n1, 3, (int64_t[]){E, I, D});
        if (b->rc) return;
        if (gu->dtype != dn->dtype || (gu->dtype != MS_DT_BF16 && gu->dtype != MS_DT_F16 && gu->dtype != MS_DT_F32)) {
            b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s is not supported for experts", gu->name,
                            ms_dtype_name(gu->dtype));
            return;
        }
        size_t es = (size_t)ms_dtype_bits(gu->dtype) / 8;
        uint8_t *tg = transpose_experts(gu, E, D, 2 * I), *td = transpose_experts(dn, E, I, D);
        uint8_t *own = malloc((size_t)(E * 3 * I * D) * es);
        if (!tg || !td || !own) {
            free(tg), free(td), free(own);
            b->rc = ms_fail(b->err, MS_ERR_NOMEM, "out of memory transposing experts of layer %d", l);
            return;
        }
        memcpy(own, tg, (size_t)(E * 2 * I * D) * es);
        memcpy(own + (size_t)(E * 2 * I * D) * es, td, (size_t)(E * I * D) * es);
        free(tg), free(td);
        L->owned = own;
        for (int64_t e = 0; e < E; e++) {
            ms_expert_view *v = &L->experts[e];
            v->gate = (ms_qmat){.dtype = gu->dtype, .rows = 2 * I, .cols = D, .data = own + (size_t)(e * 2 * I * D) * es};
            v->down = (ms_qmat){.dtype = gu->dtype, .rows = D, .cols = I,
                                .data = own + (size_t)(E * 2 * I * D + e * I * D) * es};
        }
    }
    if (b->rc) return;
    if (gub->dtype != db->dtype || (gub->dtype != MS_DT_BF16 && gub->dtype != MS_DT_F32 && gub->dtype != MS_DT_F16)) {
        b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": bias dtype %s", gub->name, ms_dtype_name(gub->dtype));
        return;
    }
    size_t bs = (size_t)ms_dtype_bits(gub->dtype) / 8;
    for (int64_t e = 0; e < E; e++) {
        ms_expert_view *v = &L->experts[e];
        v->gate_bias = (const uint8_t *)gub->data + (size_t)(e * 2 * I) * bs;
        v->down_bias = (const uint8_t *)db->data + (size_t)(e * D) * bs;
        v->bias_dtype = gub->dtype;
    }
}

/* GQA with o_proj's bias and the per-head sinks. */
static int attn(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[l];
    ms_bind_gqa(b, m, l, p);
    ms_bind_vec(b, &L->bo, MS_W_VECTOR, c->hidden, 0, "%sself_attn.o_proj.bias", p);
    ms_bind_vec(b, &L->sinks, MS_W_VECTOR, c->n_heads, 0, "%sself_attn.sinks", p);
    return b->rc;
}

/* Router mlp.router with its logit bias, then the fused experts. */
static int ffn(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    char w[160];
    snprintf(w, sizeof w, "%smlp.router", p);
    ms_bind_router(b, m, l, w, NULL);
    ms_bind_vec(b, &m->layers[l].router_lbias, MS_W_VECTOR, c->n_experts, 0, "%smlp.router.bias", p);
    bind_experts(b, m, l, p);
    return b->rc;
}

static int bind(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, attn, ffn); }

const ms_arch ms_arch_gpt_oss = {"gpt_oss", configure, bind};
