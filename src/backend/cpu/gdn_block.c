/* gdn_block.c — the CPU implementation of the gated DeltaNet token mixer
 * (config and weights: engine/gdn_block.h; contract: backend/cpu/linear_attn.h). */
#include "backend/cpu/linear_attn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { GDN_SLICE = 1024, GDN_CHUNK = 64 };

static int want_mat(const ms_qmat *m, int64_t rows, int64_t cols, const char *name, ms_err *err) {
    if (!m->data) return ms_fail(err, MS_ERR_SHAPE, "gated DeltaNet weight %s: missing", name);
    if (m->rows != rows || m->cols != cols)
        return ms_fail(err, MS_ERR_SHAPE, "gated DeltaNet weight %s: [%lld, %lld], want [%lld, %lld]", name,
                       (long long)m->rows, (long long)m->cols, (long long)rows, (long long)cols);
    return MS_OK;
}

static int want_vec(const ms_qmat *m, int64_t n, const char *name, ms_err *err) {
    if (!m->data) return ms_fail(err, MS_ERR_SHAPE, "gated DeltaNet weight %s: missing", name);
    if (m->rows * m->cols != n)
        return ms_fail(err, MS_ERR_SHAPE, "gated DeltaNet weight %s: %lld elements, want %lld", name,
                       (long long)(m->rows * m->cols), (long long)n);
    if (m->dtype != MS_DT_F32 && m->dtype != MS_DT_BF16 && m->dtype != MS_DT_F16)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "gated DeltaNet weight %s: dtype %s (want F32, BF16 or F16)", name,
                       ms_dtype_name(m->dtype));
    return MS_OK;
}

int ms_gdn_check(const ms_gdn_config *c, const ms_gdn_weights *w, ms_err *err) {
    if (!c || !w) return ms_fail(err, MS_ERR_ARG, "gated DeltaNet: NULL config or weights");
    if (c->hidden < 1 || c->k_heads < 1 || c->v_heads < 1 || c->v_heads % c->k_heads || c->k_dim < 1 ||
        c->k_dim > 1024 || c->v_dim < 1 || c->v_dim > 1024 || c->conv_kernel < 1 || c->conv_kernel > 16 ||
        (int64_t)c->v_heads * c->v_dim > (1 << 24) || (int64_t)c->k_heads * c->k_dim > (1 << 24))
        return ms_fail(err, MS_ERR_ARG,
                       "gated DeltaNet config: hidden %d, key heads %d x %d, value heads %d x %d (a multiple of the "
                       "key heads), conv kernel %d",
                       c->hidden, c->k_heads, c->k_dim, c->v_heads, c->v_dim, c->conv_kernel);
    if (!(c->norm_eps >= 0)) return ms_fail(err, MS_ERR_ARG, "gated DeltaNet config: norm eps %g", c->norm_eps);
    const int64_t Kd = (int64_t)c->k_heads * c->k_dim, Vd = (int64_t)c->v_heads * c->v_dim, D = c->hidden;
    int rc;
    if (ms_gdn_split(w)) {
        if ((rc = want_mat(&w->in_qkv, 2 * Kd + Vd, D, "in_proj_qkv", err)) ||
            (rc = want_mat(&w->in_z, Vd, D, "in_proj_z", err)) ||
            (rc = want_mat(&w->in_b, c->v_heads, D, "in_proj_b", err)) ||
            (rc = want_mat(&w->in_a, c->v_heads, D, "in_proj_a", err)))
            return rc;
    } else if ((rc = want_mat(&w->in_qkvz, 2 * Kd + 2 * Vd, D, "in_proj_qkvz", err)) ||
               (rc = want_mat(&w->in_ba, 2 * (int64_t)c->v_heads, D, "in_proj_ba", err)))
        return rc;
    if ((rc = want_mat(&w->conv, 2 * Kd + Vd, c->conv_kernel, "conv1d", err)) ||
        (rc = want_vec(&w->A_log, c->v_heads, "A_log", err)) ||
        (rc = want_vec(&w->dt_bias, c->v_heads, "dt_bias", err)) ||
        (rc = want_vec(&w->norm, c->v_dim, "norm", err)) || (rc = want_mat(&w->out_proj, D, Vd, "out_proj", err)))
        return rc;
    return MS_OK;
}

static int64_t conv_channels(const ms_gdn_config *c) {
    return 2 * (int64_t)c->k_heads * c->k_dim + (int64_t)c->v_heads * c->v_dim;
}

uint64_t ms_gdn_state_bytes(const ms_gdn_config *c) {
    return ((uint64_t)conv_channels(c) * (uint64_t)(c->conv_kernel - 1) +
            (uint64_t)c->v_heads * c->k_dim * c->v_dim) * 4 + 4;
}

int ms_gdn_state_init(ms_kda_state *st, const ms_gdn_config *c, ms_err *err) {
    memset(st, 0, sizeof *st);
    if (!c || c->conv_kernel < 1 || c->v_heads < 1 || c->k_dim < 1 || c->v_dim < 1)
        return ms_fail(err, MS_ERR_ARG, "gated DeltaNet state: bad config");
    ms_gdn_state_lens(c, &st->conv_len, &st->S_len);
    st->conv = calloc((size_t)st->conv_len + 1, sizeof *st->conv);
    st->S = calloc((size_t)st->S_len, sizeof *st->S);
    if (!st->conv || !st->S) {
        ms_kda_state_free(st);
        return ms_fail(err, MS_ERR_NOMEM, "gated DeltaNet state: %lld floats", (long long)(st->conv_len + st->S_len));
    }
    return MS_OK;
}

/* Split m rows of the fused projections into qkv [m, C] ([q all | k all | v all]),
 * z [m, Vd], b and a [m, Hv] (see the layout in gdn_block.h). */
static void split_rows(const ms_gdn_config *c, int m, const float *qkvz, const float *ba, float *qkv, float *z,
                       float *b, float *a) {
    const int Hk = c->k_heads, Hv = c->v_heads, r = Hv / Hk, dk = c->k_dim, dv = c->v_dim;
    const int64_t Kd = (int64_t)Hk * dk, Vd = (int64_t)Hv * dv, C = 2 * Kd + Vd, P = 2 * Kd + 2 * Vd;
    const int64_t grp = 2 * (int64_t)dk + 2 * (int64_t)r * dv;
    for (int t = 0; t < m; t++) {
        const float *src = qkvz + t * P, *sba = ba + (int64_t)t * 2 * Hv;
        float *dq = qkv + t * C, *dz = z + t * Vd;
        for (int g = 0; g < Hk; g++) {
            const float *s = src + g * grp;
            memcpy(dq + (int64_t)g * dk, s, (size_t)dk * 4);
            memcpy(dq + Kd + (int64_t)g * dk, s + dk, (size_t)dk * 4);
            memcpy(dq + 2 * Kd + (int64_t)g * r * dv, s + 2 * dk, (size_t)r * dv * 4);
            memcpy(dz + (int64_t)g * r * dv, s + 2 * dk + (int64_t)r * dv, (size_t)r * dv * 4);
            for (int j = 0; j < r; j++) {
                b[(int64_t)t * Hv + g * r + j] = sba[g * 2 * r + j];
                a[(int64_t)t * Hv + g * r + j] = sba[g * 2 * r + r + j];
            }
        }
    }
}

int ms_gdn_forward(ms_pool *pool, const ms_gdn_config *c, const ms_gdn_weights *w, ms_kda_state *st, const float *x,
                   int n, float *out, ms_kda_mode mode, ms_err *err) {
    int rc = ms_gdn_check(c, w, err);
    if (rc) return rc;
    if (!st || !st->S || !st->conv || !x || !out || n < 1)
        return ms_fail(err, MS_ERR_ARG, "gated DeltaNet forward: bad state/input (n %d)", n);
    const int Hk = c->k_heads, Hv = c->v_heads, dk = c->k_dim, dv = c->v_dim;
    const int64_t Kd = (int64_t)Hk * dk, Vd = (int64_t)Hv * dv, C = 2 * Kd + Vd, P = 2 * Kd + 2 * Vd;
    if (st->S_len != (int64_t)Hv * dk * dv || st->conv_len != C * (c->conv_kernel - 1))
        return ms_fail(err, MS_ERR_ARG, "gated DeltaNet forward: state was made for another config");
    const int slice = n < GDN_SLICE ? n : GDN_SLICE;
    const size_t per = (size_t)slice;
    /* scratch: qkvz [slice, P], ba [slice, 2Hv], qkv [slice, C], z and o [slice, Vd], b and a [slice, Hv] */
    float *buf = malloc(per * ((size_t)P + 2 * (size_t)Hv + (size_t)C + 2 * (size_t)Vd + 2 * (size_t)Hv) * sizeof *buf);
    if (!buf) return ms_fail(err, MS_ERR_NOMEM, "gated DeltaNet forward: scratch for %d tokens", slice);
    float *qkvz = buf, *ba = qkvz + per * P, *qkv = ba + per * 2 * Hv, *z = qkv + per * C, *o = z + per * Vd;
    float *b = o + per * Vd, *a = b + per * Hv;
    for (int t0 = 0; t0 < n && !rc; t0 += slice) {
        const int m = n - t0 < slice ? n - t0 : slice;
        const float *xs = x + (size_t)t0 * c->hidden;
        if (ms_gdn_split(w)) { /* split projections write the rows in the order the block uses */
            ms_matmul(pool, qkv, xs, m, &w->in_qkv);
            ms_matmul(pool, z, xs, m, &w->in_z);
            ms_matmul(pool, b, xs, m, &w->in_b);
            ms_matmul(pool, a, xs, m, &w->in_a);
        } else {
            ms_matmul(pool, qkvz, xs, m, &w->in_qkvz);
            ms_matmul(pool, ba, xs, m, &w->in_ba);
            split_rows(c, m, qkvz, ba, qkv, z, b, a);
        }
        if ((rc = ms_short_conv(pool, qkv, C, qkv, C, m, (int)C, &w->conv, st->conv, 1, err))) break;
        if ((rc = ms_decay_gate(pool, a, Hv, m, Hv, 1, &w->A_log, &w->dt_bias, MS_DECAY_SOFTPLUS, 0.0f, err))) break;
        ms_sigmoid_rows(b, Hv, m, Hv);
        ms_delta_args da = {
            .n = m, .n_qk_heads = Hk, .n_v_heads = Hv, .dk = dk, .dv = dv, .q = qkv, .k = qkv + Kd,
            .v = qkv + 2 * Kd, .g = a, .beta = b, .ld_q = C, .ld_k = C, .ld_v = C, .ld_g = Hv, .ld_beta = Hv,
            .g_per_head = 1, .qk_l2norm = 1, .l2_eps = 1e-6f, .scale = 1.0f / sqrtf((float)dk), .o = o, .ld_o = Vd,
        };
        int chunked = mode == MS_KDA_CHUNKED || (mode == MS_KDA_AUTO && m > 1);
        rc = chunked ? ms_delta_chunked(pool, &da, st->S, GDN_CHUNK, err) : ms_delta_recurrent(pool, &da, st->S, err);
        if (rc) break;
        if ((rc = ms_gated_rmsnorm(o, o, z, (int64_t)m * Hv, dv, &w->norm, c->norm_eps, MS_GATE_SILU, err))) break;
        ms_matmul(pool, out + (size_t)t0 * c->hidden, o, m, &w->out_proj);
    }
    free(buf);
    return rc ? ms_wrap(err, "gated DeltaNet forward") : MS_OK;
}
