/* kda_bind.c — tensor names and shapes of a KDA token mixer (Kimi Linear,
 * Kimi K3): projections, short convolutions [C, 1, K], forget gate (f_a, f_b,
 * A_log, dt_bias), beta (b_proj), output gate (g_a/g_b or g_proj), o_norm,
 * o_proj. Shapes come from the config's kda_* fields. */
#include <stdio.h>
#include <string.h>

#include "model/arch.h"
#include "model/model.h"

/* The real Kimi K3 checkpoint stores A_log as F32[128] for 96 heads, zero
 * padded: accept a longer 1-D A_log when every element past the first H is
 * zero, and view the first H. Anything else is an error naming the element. */
static int bind_padded_a_log(ms_binder *b, ms_qmat *out, const ms_tensor *t, int64_t H, const char *name) {
    if (t->dtype != MS_DT_F32 && t->dtype != MS_DT_BF16 && t->dtype != MS_DT_F16)
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s (expected F32, BF16 or F16)", name,
                               ms_dtype_name(t->dtype));
    int64_t n = t->shape[0];
    int esz = ms_dtype_bits(t->dtype) / 8;
    for (int64_t i = H; i < n; i++) {
        float v;
        ms_to_f32(&v, (const uint8_t *)t->data + i * esz, t->dtype, 1);
        if (v != 0.0f)
            return b->rc = ms_fail(b->err, MS_ERR_SHAPE,
                                   "tensor \"%s\": %lld elements for %lld heads; the padding must be zero but element "
                                   "%lld is %g",
                                   name, (long long)n, (long long)H, (long long)i, (double)v);
    }
    b->bound_bytes += t->nbytes;
    if (b->bound) b->bound[t - b->ck->tensors] = 1;
    memset(out, 0, sizeof *out);
    out->dtype = t->dtype;
    out->rows = 1;
    out->cols = H;
    out->data = t->data;
    return MS_OK;
}

int ms_bind_kda(ms_binder *b, ms_model *m, int layer, const char *pfx) {
    const ms_config *c = b->cfg;
    ms_kda_weights *w = &m->layers[layer].kda;
    const int64_t H = c->kda_heads, d = c->kda_head_dim, C = H * d, D = c->hidden, K = c->kda_conv;
    ms_bind_mat(b, &w->q_proj, MS_W_MATRIX, C, D, "%sq_proj", pfx);
    ms_bind_mat(b, &w->k_proj, MS_W_MATRIX, C, D, "%sk_proj", pfx);
    ms_bind_mat(b, &w->v_proj, MS_W_MATRIX, C, D, "%sv_proj", pfx);
    const int64_t conv_shape[3] = {C, 1, K};
    ms_bind_tensor(b, &w->q_conv, MS_W_VECTOR, 3, conv_shape, C, K, 0, "%sq_conv1d.weight", pfx);
    ms_bind_tensor(b, &w->k_conv, MS_W_VECTOR, 3, conv_shape, C, K, 0, "%sk_conv1d.weight", pfx);
    ms_bind_tensor(b, &w->v_conv, MS_W_VECTOR, 3, conv_shape, C, K, 0, "%sv_conv1d.weight", pfx);
    ms_bind_mat(b, &w->f_a, MS_W_MATRIX, d, D, "%sf_a_proj", pfx);
    ms_bind_mat(b, &w->f_b, MS_W_MATRIX, C, d, "%sf_b_proj", pfx);
    /* A_log: [1, 1, H, 1] in the transformers layout, [H] in the original one */
    if (b->ck && ms_bind_has(b, "%sA_log", pfx)) {
        char name[220];
        snprintf(name, sizeof name, "%s%sA_log", b->prefix, pfx);
        const ms_tensor *t = ms_checkpoint_find(b->ck, name);
        int64_t s4[4] = {1, 1, H, 1}, s1[1] = {H};
        if (t && t->ndim == 1 && t->shape[0] > H) bind_padded_a_log(b, &w->A_log, t, H, name);
        else if (t && t->ndim == 1) ms_bind_tensor(b, &w->A_log, MS_W_VECTOR, 1, s1, 1, H, 0, "%sA_log", pfx);
        else ms_bind_tensor(b, &w->A_log, MS_W_VECTOR, 4, s4, 1, H, 0, "%sA_log", pfx);
    } else {
        int64_t s4[4] = {1, 1, H, 1};
        ms_bind_tensor(b, &w->A_log, MS_W_VECTOR, 4, s4, 1, H, 0, "%sA_log", pfx);
    }
    const int64_t cs[1] = {C}, ds[1] = {d};
    ms_bind_tensor(b, &w->dt_bias, MS_W_VECTOR, 1, cs, 1, C, 0, "%sdt_bias", pfx);
    ms_bind_mat(b, &w->b_proj, MS_W_MATRIX, H, D, "%sb_proj", pfx);
    if (c->kda_full_rank_gate) {
        ms_bind_mat(b, &w->g_proj, MS_W_MATRIX, C, D, "%sg_proj", pfx);
    } else {
        ms_bind_mat(b, &w->g_a, MS_W_MATRIX, d, D, "%sg_a_proj", pfx);
        ms_bind_mat(b, &w->g_b, MS_W_MATRIX, C, d, "%sg_b_proj", pfx);
    }
    ms_bind_tensor(b, &w->o_norm, MS_W_NORM, 1, ds, 1, d, 0, "%so_norm.weight", pfx);
    ms_bind_mat(b, &w->o_proj, MS_W_MATRIX, D, C, "%so_proj", pfx);
    return b->rc;
}
