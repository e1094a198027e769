/* blocks_bind.c — tensor names and shapes of the shared blocks. Arch files
 * call these with their prefixes; shapes come from the config only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/model.h"

int ms_bind_trunk(ms_binder *b, ms_model *m, const char *embed, const char *final_norm, const char *lm_head) {
    const ms_config *c = b->cfg;
    ms_bind_mat(b, &m->embed, MS_W_EMBED, c->vocab, c->hidden, "%s", embed);
    ms_bind_vec(b, &m->final_norm, MS_W_NORM, c->hidden, 0, "%s", final_norm);
    if (c->tie_embeddings && !ms_bind_has(b, "%s.weight", lm_head)) m->lm_head = m->embed;
    else ms_bind_mat(b, &m->lm_head, MS_W_EMBED, c->vocab, c->hidden, "%s", lm_head);
    return b->rc;
}

/* pfx: e.g. "model.layers.3." — names below are relative to it. */
int ms_bind_gqa(ms_binder *b, ms_model *m, int layer, const char *pfx) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[layer];
    int64_t kvh = c->layer_kv_heads[layer] ? c->layer_kv_heads[layer] : c->n_kv_heads;
    int64_t vd = c->v_head_dim ? c->v_head_dim : c->head_dim;
    /* attn_out_gate: q_proj also yields a gate of head_dim per head */
    int64_t qd = c->n_heads * c->head_dim * (c->attn_out_gate ? 2 : 1), kd = kvh * c->head_dim, vtot = kvh * vd;
    ms_bind_mat(b, &L->wq, MS_W_MATRIX, qd, c->hidden, "%sself_attn.q_proj", pfx);
    ms_bind_mat(b, &L->wk, MS_W_MATRIX, kd, c->hidden, "%sself_attn.k_proj", pfx);
    ms_bind_mat(b, &L->wv, MS_W_MATRIX, vtot, c->hidden, "%sself_attn.v_proj", pfx);
    ms_bind_mat(b, &L->wo, MS_W_MATRIX, c->hidden, c->n_heads * vd, "%sself_attn.o_proj", pfx);
    if (c->attn_bias) {
        ms_bind_vec(b, &L->bq, MS_W_VECTOR, qd, 0, "%sself_attn.q_proj.bias", pfx);
        ms_bind_vec(b, &L->bk, MS_W_VECTOR, kd, 0, "%sself_attn.k_proj.bias", pfx);
        ms_bind_vec(b, &L->bv, MS_W_VECTOR, vtot, 0, "%sself_attn.v_proj.bias", pfx);
    }
    if (c->qk_norm == MS_QKNORM_HEAD) {
        ms_bind_vec(b, &L->q_norm, MS_W_NORM, c->head_dim, 0, "%sself_attn.q_norm.weight", pfx);
        ms_bind_vec(b, &L->k_norm, MS_W_NORM, c->head_dim, 0, "%sself_attn.k_norm.weight", pfx);
    } else if (c->qk_norm == MS_QKNORM_FULL) {
        ms_bind_vec(b, &L->q_norm, MS_W_NORM, qd, 0, "%sself_attn.q_norm.weight", pfx);
        ms_bind_vec(b, &L->k_norm, MS_W_NORM, kd, 0, "%sself_attn.k_norm.weight", pfx);
    }
    return b->rc;
}

int ms_bind_mla_at(ms_binder *b, ms_model *m, int layer, const char *apfx) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[layer];
    int64_t qk = c->qk_nope_dim + c->qk_rope_dim;
    if (c->q_lora_rank > 0) {
        ms_bind_mat(b, &L->q_a, MS_W_MATRIX, c->q_lora_rank, c->hidden, "%sq_a_proj", apfx);
        ms_bind_vec(b, &L->q_a_norm, MS_W_NORM, c->q_lora_rank, 0, "%sq_a_layernorm.weight", apfx);
        ms_bind_mat(b, &L->q_b, MS_W_MATRIX, c->n_heads * qk, c->q_lora_rank, "%sq_b_proj", apfx);
    } else {
        ms_bind_mat(b, &L->wq, MS_W_MATRIX, c->n_heads * qk, c->hidden, "%sq_proj", apfx);
    }
    ms_bind_mat(b, &L->kv_a, MS_W_MATRIX, c->kv_lora_rank + c->qk_rope_dim, c->hidden,
                "%skv_a_proj_with_mqa", apfx);
    ms_bind_vec(b, &L->kv_a_norm, MS_W_NORM, c->kv_lora_rank, 0, "%skv_a_layernorm.weight", apfx);
    ms_bind_mat(b, &L->kv_b, MS_W_MATRIX, c->n_heads * (c->qk_nope_dim + c->v_head_dim), c->kv_lora_rank,
                "%skv_b_proj", apfx);
    ms_bind_mat(b, &L->wo, MS_W_MATRIX, c->hidden, c->n_heads * c->v_head_dim, "%so_proj", apfx);
    if (c->mla_out_gate)
        ms_bind_mat(b, &L->mla_gate, MS_W_MATRIX, c->n_heads * c->v_head_dim, c->hidden, "%sg_proj", apfx);
    return b->rc;
}

int ms_bind_mla(ms_binder *b, ms_model *m, int layer, const char *pfx) {
    char a[200];
    snprintf(a, sizeof a, "%sself_attn.", pfx);
    return ms_bind_mla_at(b, m, layer, a);
}

int ms_bind_attn_res(ms_binder *b, struct ms_attn_res *out, const char *pfx) {
    const ms_config *c = b->cfg;
    ms_bind_vec(b, &out->norm, MS_W_NORM, c->hidden, 0, "%snorm.weight", pfx);
    ms_qmat v;
    const int64_t shape[2] = {1, c->hidden};
    out->proj = NULL;
    if (ms_bind_tensor(b, &v, MS_W_VECTOR, 2, shape, 1, c->hidden, 0, "%sproj.weight", pfx) || !b->ck) return b->rc;
    out->proj = ms_bind_alloc(b, (size_t)c->hidden * sizeof *out->proj);
    if (!out->proj) return b->rc;
    ms_to_f32(out->proj, v.data, v.dtype, c->hidden);
    return MS_OK;
}

int ms_bind_latent_moe(ms_binder *b, ms_model *m, int layer, const char *pfx) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[layer];
    ms_bind_mat(b, &L->lat_down, MS_W_MATRIX, c->expert_hidden, c->hidden, "%srouted_expert_down_proj", pfx);
    ms_bind_mat(b, &L->lat_up, MS_W_MATRIX, c->hidden, c->expert_hidden, "%srouted_expert_up_proj", pfx);
    if (c->latent_moe_norm)
        ms_bind_vec(b, &L->lat_norm, MS_W_NORM, c->expert_hidden, 0, "%srouted_expert_norm.weight", pfx);
    return b->rc;
}

int ms_bind_mlp(ms_binder *b, ms_model *m, int layer, const char *pfx, int64_t inter, const char *gate,
                const char *up, const char *down) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[layer];
    ms_bind_mat(b, &L->gate, MS_W_MATRIX, inter, c->hidden, "%s%s", pfx, gate);
    ms_bind_mat(b, &L->up, MS_W_MATRIX, inter, c->hidden, "%s%s", pfx, up);
    ms_bind_mat(b, &L->down, MS_W_MATRIX, c->hidden, inter, "%s%s", pfx, down);
    return b->rc;
}

int ms_bind_router(ms_binder *b, ms_model *m, int layer, const char *weight, const char *bias) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[layer];
    ms_bind_mat(b, &L->router, MS_W_ROUTER, c->n_experts, c->hidden, "%s", weight);
    if (bias) ms_bind_vec(b, &L->router_bias, MS_W_VECTOR, c->n_experts, 0, "%s", bias);
    return b->rc;
}

static const ms_tensor *find_rel(ms_binder *b, const char *rel) {
    char name[400];
    snprintf(name, sizeof name, "%s%s", b->prefix, rel);
    return ms_checkpoint_find(b->ck, name);
}

/* ms_bind_experts with patterns formatted with (layer, expert) when with_layer, else (expert). */
static int bind_experts(ms_binder *b, ms_model *m, int layer, const char *gate_fmt, const char *up_fmt,
                        const char *down_fmt, int with_layer) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[layer];
    if (b->rc) return b->rc;
    if (b->ck) {
        L->experts = calloc((size_t)c->n_experts, sizeof *L->experts);
        L->expert_tensors = calloc((size_t)c->n_experts * MS_EXPERT_TENSORS, sizeof *L->expert_tensors);
        if (!L->experts || !L->expert_tensors) return b->rc = ms_fail(b->err, MS_ERR_NOMEM, "out of memory");
    }
    const char *fmts[3] = {gate_fmt, up_fmt, down_fmt};
    for (int e = 0; e < c->n_experts && !b->rc; e++) {
        ms_expert_view tmp, *v = b->ck ? &L->experts[e] : &tmp;
        ms_qmat *mats[3] = {&v->gate, &v->up, &v->down};
        for (int k = 0; k < 3 && !b->rc; k++) {
            char base[200];
            if (with_layer) snprintf(base, sizeof base, fmts[k], layer, e);
            else snprintf(base, sizeof base, fmts[k], e);
            int64_t eh = c->expert_hidden ? c->expert_hidden : c->hidden;
            int64_t rows = k < 2 ? c->moe_inter : eh, cols = k < 2 ? eh : c->moe_inter;
            ms_bind_mat(b, mats[k], MS_W_EXPERT, rows, cols, "%s", base);
            if (b->ck && !b->rc) {
                /* MXFP4 (compressed-tensors): weight_packed + weight_scale; else weight (+ weight_scale_inv) */
                int f4 = mats[k]->dtype == MS_DT_F4 || mats[k]->dtype == MS_DT_I4; /* and INT4 pack-quantized */
                char rel[260];
                snprintf(rel, sizeof rel, "%s.%s", base, f4 ? "weight_packed" : "weight");
                L->expert_tensors[e * MS_EXPERT_TENSORS + 3 * k] = find_rel(b, rel);
                snprintf(rel, sizeof rel, "%s.%s", base, f4 ? "weight_scale" : "weight_scale_inv");
                L->expert_tensors[e * MS_EXPERT_TENSORS + 3 * k + 1] = find_rel(b, rel);
                if (mats[k]->zero) { /* asymmetric INT4 */
                    snprintf(rel, sizeof rel, "%s.weight_zero_point", base);
                    L->expert_tensors[e * MS_EXPERT_TENSORS + 3 * k + 2] = find_rel(b, rel);
                }
            }
        }
    }
    return b->rc;
}

int ms_bind_experts(ms_binder *b, ms_model *m, int layer, const char *gate_fmt, const char *up_fmt,
                    const char *down_fmt) {
    return bind_experts(b, m, layer, gate_fmt, up_fmt, down_fmt, 1);
}

int ms_bind_layer_experts(ms_binder *b, ms_model *m, int layer, const char *gate_fmt, const char *up_fmt,
                          const char *down_fmt) {
    return bind_experts(b, m, layer, gate_fmt, up_fmt, down_fmt, 0);
}

int ms_bind_dense_mlp(ms_binder *b, ms_model *m, int layer, const char *pfx) {
    return ms_bind_mlp(b, m, layer, pfx, b->cfg->inter, "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj");
}

int ms_bind_shared_experts(ms_binder *b, ms_model *m, int layer, const char *pfx) {
    const ms_config *c = b->cfg;
    if (!c->shared_inter) return b->rc;
    return ms_bind_mlp(b, m, layer, pfx, c->shared_inter, "mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj",
                       "mlp.shared_experts.down_proj");
}

int ms_bind_gated_shared_expert(ms_binder *b, ms_model *m, int layer, const char *pfx) {
    const ms_config *c = b->cfg;
    if (!c->shared_inter) return b->rc;
    ms_bind_mlp(b, m, layer, pfx, c->shared_inter, "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                "mlp.shared_expert.down_proj");
    return ms_bind_mat(b, &m->layers[layer].shared_gate, MS_W_ROUTER, 1, c->hidden, "%smlp.shared_expert_gate", pfx);
}

int ms_bind_sparse_moe(ms_binder *b, ms_model *m, int layer, const char *pfx, const char *bias) {
    char w[160], bn[200], g[200], u[200], d[200];
    snprintf(w, sizeof w, "%sblock_sparse_moe.gate", pfx);
    if (bias) snprintf(bn, sizeof bn, "%sblock_sparse_moe.%s", pfx, bias);
    ms_bind_router(b, m, layer, w, bias ? bn : NULL);
    snprintf(g, sizeof g, "%sblock_sparse_moe.experts.%%d.w1", pfx);
    snprintf(u, sizeof u, "%sblock_sparse_moe.experts.%%d.w3", pfx);
    snprintf(d, sizeof d, "%sblock_sparse_moe.experts.%%d.w2", pfx);
    return ms_bind_layer_experts(b, m, layer, g, u, d);
}

int ms_bind_routed_moe(ms_binder *b, ms_model *m, int layer, const char *pfx) {
    const ms_config *c = b->cfg;
    char w[160], bias[200], g[200];
    snprintf(w, sizeof w, "%smlp.gate", pfx);
    snprintf(bias, sizeof bias, "%smlp.gate.e_score_correction_bias", pfx);
    ms_bind_router(b, m, layer, w, c->router_bias ? bias : NULL);
    ms_bind_shared_experts(b, m, layer, pfx);
    snprintf(g, sizeof g, "%smlp.experts", pfx);
    return ms_bind_experts_at(b, m, layer, g);
}

int ms_bind_experts_at(ms_binder *b, ms_model *m, int layer, const char *base) {
    char g[200], u[200], d[200];
    /* transformers 5 modules: fused (save_pretrained of a family without a conversion mapping) */
    if (b->ck && !ms_bind_has(b, "%s.0.gate_proj.weight", base) && !ms_bind_has(b, "%s.0.gate_proj.weight_packed", base) &&
        ms_bind_has(b, "%s.gate_up_proj", base)) {
        snprintf(g, sizeof g, "%s.gate_up_proj", base);
        snprintf(d, sizeof d, "%s.down_proj", base);
        return ms_bind_fused_experts(b, m, layer, g, d);
    }
    /* the layer is already in base: the patterns take the expert alone (a lone "%2$d" without
     * "%1$" is undefined, and fortified glibc aborts on it) */
    snprintf(g, sizeof g, "%s.%%d.gate_proj", base);
    snprintf(u, sizeof u, "%s.%%d.up_proj", base);
    snprintf(d, sizeof d, "%s.%%d.down_proj", base);
    return bind_experts(b, m, layer, g, u, d, 0);
}

int ms_bind_layer_norms(ms_binder *b, ms_model *m, int layer, const char *pfx) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[layer];
    ms_bind_vec(b, &L->attn_norm, MS_W_NORM, c->hidden, 0, "%sinput_layernorm.weight", pfx);
    ms_bind_vec(b, &L->ffn_norm, MS_W_NORM, c->hidden, 0, "%spost_attention_layernorm.weight", pfx);
    return b->rc;
}

int ms_bind_ffn(ms_binder *b, ms_model *m, int layer, const char *pfx) {
    const ms_config *c = b->cfg;
    if (c->layer_mlp[layer] == MS_MLP_DENSE) return ms_bind_dense_mlp(b, m, layer, pfx);
    return ms_bind_routed_moe(b, m, layer, pfx);
}

int ms_bind_layers(ms_binder *b, ms_model *m, const char *layers, ms_layer_binder *attn, ms_layer_binder *ffn) {
    const ms_config *c = b->cfg;
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        char p[160];
        snprintf(p, sizeof p, "%s.%d.", layers, l);
        ms_bind_layer_norms(b, m, l, p);
        attn(b, m, l, p);
        ffn(b, m, l, p);
    }
    return b->rc;
}

int ms_bind_decoder(ms_binder *b, ms_model *m, ms_layer_binder *attn, ms_layer_binder *ffn) {
    ms_bind_trunk(b, m, "model.embed_tokens", "model.norm.weight", "lm_head");
    return ms_bind_layers(b, m, "model.layers", attn, ffn);
}

/* src [E, r, c] -> dst [E, c, r], elements of es bytes. */
static void transpose_last2(uint8_t *dst, const uint8_t *src, int64_t E, int64_t r, int64_t c, size_t es) {
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < c; j++)
                memcpy(dst + ((e * c + j) * r + i) * es, src + ((e * r + i) * c + j) * es, es);
}

int ms_bind_fused_experts(ms_binder *b, ms_model *m, int layer, const char *gate_up, const char *down) {
    const ms_config *c = b->cfg;
    ms_layer *L = &m->layers[layer];
    const int64_t E = c->n_experts, D = c->hidden, I = c->moe_inter;
    if (b->rc) return b->rc;
    if (!b->ck) {
        ms_qmat tmp;
        ms_bind_tensor(b, &tmp, MS_W_EXPERT, 3, (int64_t[]){E, D, 2 * I}, E * D, 2 * I, 0, "%s", gate_up);
        ms_bind_tensor(b, &tmp, MS_W_EXPERT, 3, (int64_t[]){E, I, D}, E * I, D, 0, "%s", down);
        return b->rc;
    }
    if (D == I)
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED,
                               "%s: fused experts with moe_intermediate_size equal to hidden_size (%lld): the layout "
                               "cannot be told from the shapes",
                               down, (long long)D);
    char n1[400], n2[400];
    snprintf(n1, sizeof n1, "%s%s", b->prefix, gate_up);
    snprintf(n2, sizeof n2, "%s%s", b->prefix, down);
    const ms_tensor *dn = ms_checkpoint_find(b->ck, n2);
    if (!dn || dn->ndim != 3)
        return b->rc = ms_fail(b->err, MS_ERR_FORMAT, "missing tensor \"%s\" (expected [%lld, %lld, %lld] or [%lld, %lld, %lld])",
                               n2, (long long)E, (long long)D, (long long)I, (long long)E, (long long)I, (long long)D);
    const int linear = dn->shape[1] == D && dn->shape[2] == I;
    const ms_tensor *gu = ms_bind_find(b, n1, 3, linear ? (int64_t[]){E, 2 * I, D} : (int64_t[]){E, D, 2 * I});
    dn = ms_bind_find(b, n2, 3, linear ? (int64_t[]){E, D, I} : (int64_t[]){E, I, D});
    if (b->rc) return b->rc;
    if (gu->dtype != dn->dtype || (gu->dtype != MS_DT_BF16 && gu->dtype != MS_DT_F16 && gu->dtype != MS_DT_F32))
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s is not supported for fused experts",
                               gu->name, ms_dtype_name(gu->dtype));
    const size_t es = (size_t)ms_dtype_bits(gu->dtype) / 8;
    const uint8_t *g = gu->data, *d = dn->data;
    if (!linear) { /* published layout: one transposed copy of both, owned by the layer */
        uint8_t *own = malloc((size_t)(E * 3 * I * D) * es);
        if (!own) return b->rc = ms_fail(b->err, MS_ERR_NOMEM, "out of memory transposing the experts of layer %d", layer);
        transpose_last2(own, g, E, D, 2 * I, es);
        transpose_last2(own + (size_t)(E * 2 * I * D) * es, d, E, I, D, es);
        L->owned = own;
        g = own;
        d = own + (size_t)(E * 2 * I * D) * es;
    }
    L->experts = calloc((size_t)E, sizeof *L->experts);
    if (!L->experts) return b->rc = ms_fail(b->err, MS_ERR_NOMEM, "out of memory");
    for (int64_t e = 0; e < E; e++) {
        ms_expert_view *v = &L->experts[e];
        const uint8_t *ge = g + (size_t)(e * 2 * I * D) * es;
        v->gate = (ms_qmat){.dtype = gu->dtype, .rows = I, .cols = D, .data = ge};
        v->up = (ms_qmat){.dtype = gu->dtype, .rows = I, .cols = D, .data = ge + (size_t)(I * D) * es};
        v->down = (ms_qmat){.dtype = gu->dtype, .rows = D, .cols = I, .data = d + (size_t)(e * D * I) * es};
    }
    return b->rc;
}
