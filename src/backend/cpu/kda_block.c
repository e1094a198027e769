/* kda_block.c — the CPU implementation of the KDA token mixer (config and
 * weights: engine/kda_block.h; contract: backend/cpu/linear_attn.h). */
#include "backend/cpu/linear_attn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { KDA_SLICE = 1024, KDA_CHUNK = 64 };

static int want_mat(const ms_qmat *m, int64_t rows, int64_t cols, const char *name, ms_err *err) {
    if (!m->data) return ms_fail(err, MS_ERR_SHAPE, "KDA weight %s: missing", name);
    if (m->rows != rows || m->cols != cols)
        return ms_fail(err, MS_ERR_SHAPE, "KDA weight %s: [%lld, %lld], want [%lld, %lld]", name, (long long)m->rows,
                       (long long)m->cols, (long long)rows, (long long)cols);
    return MS_OK;
}

static int want_vec(const ms_qmat *m, int64_t n, const char *name, ms_err *err) {
    if (!m->data) return ms_fail(err, MS_ERR_SHAPE, "KDA weight %s: missing", name);
    if (m->rows * m->cols != n)
        return ms_fail(err, MS_ERR_SHAPE, "KDA weight %s: %lld elements, want %lld", name,
                       (long long)(m->rows * m->cols), (long long)n);
    if (m->dtype != MS_DT_F32 && m->dtype != MS_DT_BF16 && m->dtype != MS_DT_F16)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "KDA weight %s: dtype %s (want F32, BF16 or F16)", name,
                       ms_dtype_name(m->dtype));
    return MS_OK;
}

int ms_kda_check(const ms_kda_config *c, const ms_kda_weights *w, ms_err *err) {
    if (!c || !w) return ms_fail(err, MS_ERR_ARG, "KDA: NULL config or weights");
    if (c->hidden < 1 || c->heads < 1 || c->head_dim < 1 || c->head_dim > 1024 || c->conv_kernel < 1 ||
        c->conv_kernel > 16 || (int64_t)c->heads * c->head_dim > (1 << 24))
        return ms_fail(err, MS_ERR_ARG, "KDA config: hidden %d, heads %d, head_dim %d, conv kernel %d", c->hidden,
                       c->heads, c->head_dim, c->conv_kernel);
    if (c->decay != MS_DECAY_SOFTPLUS && c->decay != MS_DECAY_LOWER_BOUND)
        return ms_fail(err, MS_ERR_ARG, "KDA config: unknown decay gate %d", (int)c->decay);
    if (c->decay == MS_DECAY_LOWER_BOUND && !(c->lower_bound < 0 && isfinite(c->lower_bound)))
        return ms_fail(err, MS_ERR_ARG, "KDA config: gate_lower_bound %g must be finite and negative", c->lower_bound);
    if (!(c->norm_eps >= 0)) return ms_fail(err, MS_ERR_ARG, "KDA config: norm eps %g", c->norm_eps);
    const int64_t H = c->heads, d = c->head_dim, C = H * d, D = c->hidden, K = c->conv_kernel;
    int rc;
    if ((rc = want_mat(&w->q_proj, C, D, "q_proj", err)) || (rc = want_mat(&w->k_proj, C, D, "k_proj", err)) ||
        (rc = want_mat(&w->v_proj, C, D, "v_proj", err)) || (rc = want_mat(&w->q_conv, C, K, "q_conv1d", err)) ||
        (rc = want_mat(&w->k_conv, C, K, "k_conv1d", err)) || (rc = want_mat(&w->v_conv, C, K, "v_conv1d", err)) ||
        (rc = want_mat(&w->f_a, d, D, "f_a_proj", err)) || (rc = want_mat(&w->f_b, C, d, "f_b_proj", err)) ||
        (rc = want_vec(&w->A_log, H, "A_log", err)) || (rc = want_mat(&w->b_proj, H, D, "b_proj", err)) ||
        (rc = want_vec(&w->o_norm, d, "o_norm", err)) || (rc = want_mat(&w->o_proj, D, C, "o_proj", err)))
        return rc;
    if (w->dt_bias.data && (rc = want_vec(&w->dt_bias, C, "dt_bias", err))) return rc;
    if (c->full_rank_gate) {
        if ((rc = want_mat(&w->g_proj, C, D, "g_proj", err))) return rc;
    } else if ((rc = want_mat(&w->g_a, d, D, "g_a_proj", err)) || (rc = want_mat(&w->g_b, C, d, "g_b_proj", err))) {
        return rc;
    }
    return MS_OK;
}

int ms_kda_state_init(ms_kda_state *st, const ms_kda_config *c, ms_err *err) {
    memset(st, 0, sizeof *st);
    ms_kda_state_lens(c, &st->conv_len, &st->S_len);
    st->conv = calloc((size_t)st->conv_len + 1, sizeof *st->conv);
    st->S = calloc((size_t)st->S_len, sizeof *st->S);
    if (!st->conv || !st->S) {
        ms_kda_state_free(st);
        return ms_fail(err, MS_ERR_NOMEM, "KDA state: %lld floats", (long long)(st->conv_len + st->S_len));
    }
    return MS_OK;
}

void ms_kda_state_reset(ms_kda_state *st) {
    if (st->conv) memset(st->conv, 0, (size_t)st->conv_len * sizeof *st->conv);
    if (st->S) memset(st->S, 0, (size_t)st->S_len * sizeof *st->S);
}

void ms_kda_state_free(ms_kda_state *st) {
    free(st->conv);
    free(st->S);
    st->conv = st->S = NULL;
}

int ms_kda_forward(ms_pool *pool, const ms_kda_config *c, const ms_kda_weights *w, ms_kda_state *st,
                   const float *x, int n, float *out, ms_kda_mode mode, ms_err *err) {
    int rc = ms_kda_check(c, w, err);
    if (rc) return rc;
    if (!st || !st->S || !st->conv || !x || !out || n < 1)
        return ms_fail(err, MS_ERR_ARG, "KDA forward: bad state/input (n %d)", n);
    const int H = c->heads, d = c->head_dim, C = H * d, K = c->conv_kernel;
    if (st->S_len != (int64_t)H * d * d || st->conv_len != 3 * (int64_t)C * (K - 1))
        return ms_fail(err, MS_ERR_ARG, "KDA forward: state was made for another config");
    const int slice = n < KDA_SLICE ? n : KDA_SLICE;
    /* scratch: q, k, v, f (-> g), gate, o: [slice, C] each; low-rank tmp [slice, d]; beta [slice, H] */
    size_t per = (size_t)slice;
    float *buf = malloc((6 * per * C + per * d + per * H) * sizeof *buf);
    if (!buf) return ms_fail(err, MS_ERR_NOMEM, "KDA forward: scratch for %d tokens", slice);
    float *q = buf, *k = q + per * C, *v = k + per * C, *g = v + per * C, *gate = g + per * C, *o = gate + per * C;
    float *lr = o + per * C, *beta = lr + per * d;
    float *cs_q = st->conv, *cs_k = cs_q + (size_t)C * (K - 1), *cs_v = cs_k + (size_t)C * (K - 1);
    for (int t0 = 0; t0 < n && !rc; t0 += slice) {
        const int m = n - t0 < slice ? n - t0 : slice;
        const float *xs = x + (size_t)t0 * c->hidden;
        ms_matmul(pool, q, xs, m, &w->q_proj);
        ms_matmul(pool, k, xs, m, &w->k_proj);
        ms_matmul(pool, v, xs, m, &w->v_proj);
        if ((rc = ms_short_conv(pool, q, C, q, C, m, C, &w->q_conv, cs_q, 1, err)) ||
            (rc = ms_short_conv(pool, k, C, k, C, m, C, &w->k_conv, cs_k, 1, err)) ||
            (rc = ms_short_conv(pool, v, C, v, C, m, C, &w->v_conv, cs_v, 1, err)))
            break;
        ms_matmul(pool, lr, xs, m, &w->f_a);
        ms_matmul(pool, g, lr, m, &w->f_b);
        if ((rc = ms_decay_gate(pool, g, C, m, H, d, &w->A_log, w->dt_bias.data ? &w->dt_bias : NULL, c->decay,
                                c->lower_bound, err)))
            break;
        ms_matmul(pool, beta, xs, m, &w->b_proj);
        ms_sigmoid_rows(beta, H, m, H);
        ms_delta_args a = {
            .n = m, .n_qk_heads = H, .n_v_heads = H, .dk = d, .dv = d, .q = q, .k = k, .v = v, .g = g,
            .beta = beta, .ld_q = C, .ld_k = C, .ld_v = C, .ld_g = C, .ld_beta = H, .g_per_head = 0,
            .qk_l2norm = 1, .l2_eps = 1e-6f, .scale = 1.0f / sqrtf((float)d), .o = o, .ld_o = C,
        };
        int chunked = mode == MS_KDA_CHUNKED || (mode == MS_KDA_AUTO && m > 1);
        rc = chunked ? ms_delta_chunked(pool, &a, st->S, KDA_CHUNK, err) : ms_delta_recurrent(pool, &a, st->S, err);
        if (rc) break;
        if (c->full_rank_gate) {
            ms_matmul(pool, gate, xs, m, &w->g_proj);
        } else {
            ms_matmul(pool, lr, xs, m, &w->g_a);
            ms_matmul(pool, gate, lr, m, &w->g_b);
        }
        if ((rc = ms_gated_rmsnorm(o, o, gate, (int64_t)m * H, d, &w->o_norm, c->norm_eps, MS_GATE_SIGMOID, err)))
            break;
        ms_matmul(pool, out + (size_t)t0 * c->hidden, o, m, &w->o_proj);
    }
    free(buf);
    return rc ? ms_wrap(err, "KDA forward") : MS_OK;
}
