/* backend.c — which ops a model needs (ms_backend_require), and the ops composed
 * of other ops (ms_moe_experts_composed). */
#include <stddef.h>

#include "core/backend.h"

static int any_attn(const ms_config *c, ms_attn_kind k) {
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_attn[l] == k) return 1;
    return 0;
}
static int always(const ms_config *c) { return 1; }
static int has_gqa(const ms_config *c) { return any_attn(c, MS_ATTN_GQA); }
static int has_mla(const ms_config *c) { return any_attn(c, MS_ATTN_MLA); }
static int has_moe(const ms_config *c) { return c->n_experts > 0; }
static int has_zero_experts(const ms_config *c) { return c->n_zero_experts > 0; }
static int has_kda(const ms_config *c) { return any_attn(c, MS_ATTN_KDA); }
static int has_gdn(const ms_config *c) { return any_attn(c, MS_ATTN_GDN); }
static int has_mhc(const ms_config *c) { return c->hc_mult > 1; }
static int has_mhc_mean(const ms_config *c) { return c->hc_mult > 1 && !c->hc_head_weighted; }
static int has_mhc_weighted(const ms_config *c) { return c->hc_mult > 1 && c->hc_head_weighted; }
static int has_dsa(const ms_config *c) {
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_dsa[l]) return 1;
    return 0;
}
static int has_cattn(const ms_config *c) { return any_attn(c, MS_ATTN_COMPRESSED); }
static int has_compressor(const ms_config *c) {
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_attn[l] == MS_ATTN_COMPRESSED && c->layer_compress[l]) return 1;
    return 0;
}
static int has_attn_res(const ms_config *c) { return c->attn_res_block > 0; }
static int has_layernorm(const ms_config *c) { return c->layernorm; }
static int has_clip_qkv(const ms_config *c) { return c->clip_qkv > 0; }

/* One op: its name (as the error says it), where it sits in the table, and
 * whether a model of config c calls it. */
typedef struct {
    const char *name;
    size_t offset;
    int (*needed)(const ms_config *c);
} op_need;

#define OP(field, pred) {#field, offsetof(ms_backend_ops, field), pred}
static const op_need k_needs[] = {
    OP(alloc, always),        OP(free, always),          OP(upload, always),       OP(download, always),
    OP(copy, always),         OP(zero, always),          OP(copy_rows, always),    OP(sync, always),
    OP(place_qmat, always),   OP(place_vec, always),     OP(destroy, always),      OP(workspace_bytes, always),
    OP(reserve, always),      OP(matmul, always),        OP(matmul_many, always),  OP(rmsnorm, always),
    OP(add_bias, always),     OP(add, always),           OP(scale, always),        OP(mul_sigmoid, always),
    OP(rope, always),         OP(glu, always),           OP(embed, always),        OP(attn_gqa, has_gqa),
    OP(attn_mla, has_mla),    OP(route, has_moe),        OP(gather_rows, has_moe), OP(scatter_add_rows, has_moe),
    OP(add_bias_any, has_moe), OP(split_gate_up, has_moe), OP(add_gated_rows, has_moe), OP(moe_experts, has_moe),
    OP(scale_add_rows, has_zero_experts), OP(kda_forward, has_kda), OP(gdn_forward, has_gdn),
    OP(dsa_index, has_dsa),    OP(dsa_recheck, has_dsa),
    OP(compress_append, has_compressor), OP(attn_compressed, has_cattn),
    OP(mhc_pre, has_mhc),      OP(mhc_post, has_mhc),      OP(mhc_expand, has_mhc),
    OP(mhc_head_mean, has_mhc_mean), OP(mhc_head_weighted, has_mhc_weighted),
    OP(attn_res_mix, has_attn_res), OP(layernorm, has_layernorm), OP(clamp, has_clip_qkv),
};
#undef OP

int ms_backend_require(const ms_backend *be, const ms_config *c, ms_err *err) {
    if (!be || !be->ops) return ms_fail(err, MS_ERR_ARG, "no backend");
    for (size_t i = 0; i < sizeof k_needs / sizeof *k_needs; i++) {
        if (!k_needs[i].needed(c)) continue;
        const void *fn = *(void *const *)((const char *)be->ops + k_needs[i].offset);
        if (!fn)
            return ms_fail(err, MS_ERR_UNSUPPORTED, "the %s backend has no %s op, which this model needs", be->name,
                           k_needs[i].name);
    }
    return MS_OK;
}

/* One routed expert over the m gathered rows a->xs -> a->ys. */
static void expert_ffn(ms_backend *be, const ms_moe_args *a, const ms_expert_view *v, int m) {
    int64_t I = v->down.cols, D = v->down.rows; /* hidden, or the latent width */
    if (!v->up.data) { /* fused, interleaved gate/up rows */
        be->ops->matmul(be, a->u, a->xs, m, &v->gate, 0);
        if (v->gate_bias) be->ops->add_bias_any(be, a->u, v->gate_bias, v->bias_dtype, m, 2 * I);
        be->ops->split_gate_up(be, a->g, a->u, m, I);
    } else {
        be->ops->matmul(be, a->g, a->xs, m, &v->gate, 0);
        be->ops->matmul(be, a->u, a->xs, m, &v->up, 0);
        if (v->gate_bias) be->ops->add_bias_any(be, a->g, v->gate_bias, v->bias_dtype, m, I);
        if (v->up_bias) be->ops->add_bias_any(be, a->u, v->up_bias, v->bias_dtype, m, I);
    }
    be->ops->glu(be, a->act, a->g, a->u, (int64_t)m * I);
    be->ops->matmul(be, a->ys, a->g, m, &v->down, 0);
    if (v->down_bias) be->ops->add_bias_any(be, a->ys, v->down_bias, v->bias_dtype, m, D);
}

void ms_moe_experts_composed(ms_backend *be, const ms_moe_args *a) {
    for (int u = 0; u < a->nu; u++)
        /* rows in blocks of max_batch: a hash-routed token can pick one expert in several slots */
        for (int b = a->off[u]; b < a->off[u + 1]; b += a->max_batch) {
            int m = a->off[u + 1] - b < a->max_batch ? a->off[u + 1] - b : a->max_batch;
            be->ops->gather_rows(be, a->xs, a->in, a->tok + b, m, a->D);
            expert_ffn(be, a, &a->views[u], m);
            be->ops->scatter_add_rows(be, a->acc, a->ys, a->tok + b, a->w + b, m, a->D);
        }
}
