/* backend_cpu.c — the CPU backend's memory, planning and dense ops, and its ops
 * table (the attention, MoE and block ops are in be_cpu_*.c, the linear-attention
 * mixers in kda_block.c and gdn_block.c). Buffers are host memory, so memory ops
 * are memcpy/memset; every op runs now, on the calling thread and the pool. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/be_cpu.h"
#include "backend/cpu/linear_attn.h"

#define MAX2(a, b) ((a) > (b) ? (a) : (b))

/* ---- memory ---- */

static int cpu_alloc(ms_backend *be, size_t bytes, void **out, ms_err *err) {
    *out = calloc(bytes ? bytes : 1, 1);
    if (!*out) return ms_fail(err, MS_ERR_NOMEM, "out of memory allocating %.1f MiB", (double)bytes / 1048576.0);
    return MS_OK;
}
static void cpu_free(ms_backend *be, void *p) { free(p); }
static int cpu_upload(ms_backend *be, void *dst, const void *src, size_t bytes, ms_err *err) {
    if (bytes) memmove(dst, src, bytes);
    return MS_OK;
}
static int cpu_download(ms_backend *be, void *dst, const void *src, size_t bytes, ms_err *err) {
    if (bytes) memmove(dst, src, bytes);
    return MS_OK;
}
static void cpu_copy(ms_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}
static void cpu_zero(ms_backend *be, void *dst, size_t bytes) {
    if (bytes) memset(dst, 0, bytes);
}
static void cpu_copy_rows(ms_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                          int64_t rows, int64_t width) {
    for (int64_t r = 0; r < rows; r++) memmove(dst + r * dst_stride, src + r * src_stride, (size_t)width * 4);
}
static int cpu_sync(ms_backend *be, ms_err *err) { return MS_OK; }
static int cpu_place_qmat(ms_backend *be, const ms_qmat *host, ms_qmat *out, ms_err *err) {
    *out = *host;
    return MS_OK;
}
static int cpu_place_vec(ms_backend *be, const float *host, int64_t n, const float **out, ms_err *err) {
    *out = host;
    return MS_OK;
}
static void cpu_destroy(ms_backend *be) {
    if (!be) return;
    free(cpu_of(be)->th_buf);
    free(be);
}

/* ---- planning ---- */

/* The model dimensions the per-thread scratch depends on (merged by max when
 * one backend serves several models). */
static cpu_scratch_dims dims_of(const ms_config *c) {
    int64_t qdim = MAX2(c->head_dim, c->qk_nope_dim + c->qk_rope_dim), vdim = MAX2(c->head_dim, c->v_head_dim);
    int64_t ares_blocks = c->attn_res_block > 0 ? (c->n_layers + c->attn_res_block - 1) / c->attn_res_block : 0;
    cpu_scratch_dims d;
    d.lora = MAX2(c->kv_lora_rank, 1);
    d.row = MAX2(MAX2(c->kv_lora_rank, c->hidden), MAX2(qdim, vdim)) + 16;
    d.mla_block = c->kv_lora_rank > 0 ? c->kv_lora_rank + c->qk_nope_dim + c->v_head_dim : 0;
    d.small = MAX2(2 * ms_router_width(c) + 64, c->hidden + ares_blocks + 64); /* router 2E floats, AttnRes */
    d.ca_window = d.ca_rate = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_attn[l] != MS_ATTN_COMPRESSED) continue;
        d.ca_window = MAX2(d.ca_window, MAX2(c->layer_window[l], 1));
        int64_t r = c->layer_compress[l];
        if (r && (!d.ca_rate || r < d.ca_rate)) d.ca_rate = r;
    }
    return d;
}

static size_t stride_of(const cpu_scratch_dims *d, int64_t T, int64_t B) {
    /* attention: scores [T] + latent queries [B * kv_lora] + rows */
    size_t s = (size_t)T + (size_t)B * (size_t)d->lora + 2 * (size_t)d->row + 1024;
    if (d->mla_block > 0) { /* MLA expanded prefill: latent block, K/V block, scores, per-token stats */
        size_t kb = MS_MLA_KEY_BLOCK, need = kb * (size_t)d->mla_block + kb + 3 * (size_t)B + 64;
        if (s < need) s = need;
    }
    if (s < (size_t)d->small) s = (size_t)d->small;
    if (d->ca_window > 0) { /* compressed attention: key list, scores, indexer queue (ms_cpu_cattn_scratch) */
        size_t need = ms_cpu_cattn_scratch(d->ca_window, d->ca_rate ? T / d->ca_rate + 1 : 0);
        if (s < need) s = need;
    }
    return s;
}

size_t ms_cpu_th_stride(const ms_config *c, int64_t max_ctx, int64_t max_batch) {
    cpu_scratch_dims d = dims_of(c);
    return stride_of(&d, max_ctx, max_batch);
}

uint64_t ms_backend_cpu_workspace_bytes(const ms_config *c, int64_t max_ctx, int64_t max_batch, int threads) {
    return (uint64_t)(threads > 0 ? threads : 1) * ms_cpu_th_stride(c, max_ctx, max_batch) * 4;
}

static uint64_t cpu_workspace_bytes(const ms_backend *be, const ms_config *c, int64_t max_ctx, int64_t max_batch) {
    return ms_backend_cpu_workspace_bytes(c, max_ctx, max_batch, ((const cpu_backend *)be)->n_threads);
}

static int cpu_reserve(ms_backend *be, const ms_config *c, int64_t max_ctx, int64_t max_batch, ms_err *err) {
    cpu_backend *b = cpu_of(be);
    cpu_scratch_dims d = dims_of(c), m = b->dims;
    m.lora = MAX2(m.lora, d.lora), m.row = MAX2(m.row, d.row), m.mla_block = MAX2(m.mla_block, d.mla_block);
    m.small = MAX2(m.small, d.small);
    m.ca_window = MAX2(m.ca_window, d.ca_window);
    if (d.ca_rate && (!m.ca_rate || d.ca_rate < m.ca_rate)) m.ca_rate = d.ca_rate;
    int64_t T = MAX2(b->max_ctx, max_ctx), B = MAX2(b->max_batch, max_batch);
    size_t stride = stride_of(&m, T, B);
    if (b->th_buf && stride <= b->th_stride && T == b->max_ctx && B == b->max_batch) {
        b->dims = m; /* the scratch is big enough: record the merged sizes the ops check against */
        return MS_OK;
    }
    float *p = calloc((size_t)b->n_threads * stride, 4);
    if (!p)
        return ms_fail(err, MS_ERR_NOMEM, "out of memory for %d x %.1f MiB of CPU scratch", b->n_threads,
                       (double)stride * 4 / 1048576.0);
    free(b->th_buf);
    b->th_buf = p;
    b->th_stride = stride;
    b->dims = m;
    b->max_ctx = T;
    b->max_batch = B;
    return MS_OK;
}

/* ---- dense math ---- */

static void cpu_matmul(ms_backend *be, float *y, const float *x, int n, const ms_qmat *w, int acc) {
    if (acc) ms_matmul_acc(cpu_of(be)->pool, y, x, n, w);
    else ms_matmul(cpu_of(be)->pool, y, x, n, w);
}
static void cpu_matmul_many(ms_backend *be, const ms_matmul_job *jobs, int count) {
    ms_matmul_many(cpu_of(be)->pool, jobs, count);
}
static void cpu_rmsnorm(ms_backend *be, float *y, const float *x, const float *w, int64_t rows, int64_t d, float eps) {
    ms_rmsnorm(y, x, w, (int)rows, (int)d, eps);
}
/* LayerNorm per row, the mean and variance accumulated in double. */
static void cpu_layernorm(ms_backend *be, float *y, const float *x, const float *w, const float *b, int64_t rows,
                          int64_t d, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; i++) mean += xr[i];
        mean /= (double)d;
        for (int64_t i = 0; i < d; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        float inv = (float)(1.0 / sqrt(var / (double)d + (double)eps)), m = (float)mean;
        for (int64_t i = 0; i < d; i++) yr[i] = (xr[i] - m) * inv * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    }
}
static void cpu_clamp(ms_backend *be, float *x, float lo, float hi, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
}
static void cpu_add_bias(ms_backend *be, float *x, const float *b, int64_t rows, int64_t d) {
    for (int64_t t = 0; t < rows; t++)
        for (int64_t i = 0; i < d; i++) x[t * d + i] += b[i];
}
static void cpu_add(ms_backend *be, float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}
static void cpu_scale(ms_backend *be, float *x, float s, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}
static void cpu_mul_sigmoid(ms_backend *be, float *x, const float *g, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= ms_sigmoid(g[i]);
}
static void cpu_rope(ms_backend *be, const ms_rope *r, float *x, int n, int64_t tok_stride, int64_t heads,
                     int64_t head_stride, int64_t offset, int64_t pos0, float sign) {
    float cs[512], sn[512];
    for (int t = 0; t < n; t++) {
        ms_rope_cos_sin(r, pos0 + t, cs, sn);
        if (sign != 1.0f)
            for (int i = 0; i < r->dim / 2; i++) sn[i] *= sign;
        for (int64_t h = 0; h < heads; h++) ms_rope_apply(r, x + t * tok_stride + h * head_stride + offset, cs, sn);
    }
}
static void cpu_glu(ms_backend *be, const ms_glu *a, float *gate, float *up, int64_t n) {
    if (a->kind == MS_ACT_SITU) ms_situ_glu(gate, gate, up, n, a->beta, a->linear_beta);
    else ms_swiglu_param(gate, up, n, a->limit, a->alpha, a->up_offset);
}
static void cpu_embed(ms_backend *be, float *x, const ms_qmat *table, const int32_t *tokens, int n) {
    for (int t = 0; t < n; t++) ms_qmat_row(table, tokens[t], x + (int64_t)t * table->cols);
}

/* ---- MoE data movement ---- */

static void cpu_gather_rows(ms_backend *be, float *dst, const float *src, const int *rows, int m, int64_t d) {
    for (int i = 0; i < m; i++) memcpy(dst + (int64_t)i * d, src + (int64_t)rows[i] * d, (size_t)d * 4);
}
static void cpu_scatter_add_rows(ms_backend *be, float *dst, const float *src, const int *rows, const float *w, int m,
                                 int64_t d) {
    for (int i = 0; i < m; i++) {
        float wi = w[i], *o = dst + (int64_t)rows[i] * d;
        const float *y = src + (int64_t)i * d;
        for (int64_t k = 0; k < d; k++) o[k] += wi * y[k];
    }
}
static void cpu_scale_add_rows(ms_backend *be, float *dst, const float *src, const int *rows, const float *w, int m,
                               int64_t d) {
    for (int i = 0; i < m; i++) {
        float wi = w[i], *o = dst + (int64_t)rows[i] * d;
        const float *x = src + (int64_t)rows[i] * d;
        for (int64_t k = 0; k < d; k++) o[k] += wi * x[k];
    }
}
static void cpu_add_bias_any(ms_backend *be, float *x, const void *bias, ms_dtype dt, int64_t m, int64_t d) {
    float *b = cpu_thread_buf(cpu_of(be), 0); /* d <= the scratch row (>= hidden, 2 * inter is not: chunk it) */
    size_t cap = cpu_of(be)->th_stride;
    for (int64_t k0 = 0; k0 < d; k0 += (int64_t)cap) {
        int64_t kn = d - k0 < (int64_t)cap ? d - k0 : (int64_t)cap;
        ms_to_f32(b, (const uint8_t *)bias + (size_t)k0 * (size_t)ms_dtype_bits(dt) / 8, dt, kn);
        for (int64_t i = 0; i < m; i++)
            for (int64_t k = 0; k < kn; k++) x[i * d + k0 + k] += b[k];
    }
}
static void cpu_split_gate_up(ms_backend *be, float *g, float *u, int64_t m, int64_t I) {
    for (int64_t i = 0; i < m * I; i++) {
        g[i] = u[2 * i];
        u[i] = u[2 * i + 1]; /* in place: reads run ahead of writes */
    }
}
static void cpu_add_gated_rows(ms_backend *be, float *y, const float *x, const float *s, int64_t rows, int64_t d) {
    for (int64_t t = 0; t < rows; t++) {
        float g = ms_sigmoid(s[t]);
        for (int64_t k = 0; k < d; k++) y[t * d + k] += g * x[t * d + k];
    }
}

/* ---- linear attention (kda_block.c, gdn_block.c) ---- */

static int cpu_kda_forward(ms_backend *be, const ms_kda_config *c, const ms_kda_weights *w, ms_kda_state *st,
                           const float *x, int n, float *out, ms_err *err) {
    return ms_kda_forward(cpu_of(be)->pool, c, w, st, x, n, out, MS_KDA_AUTO, err);
}
static int cpu_gdn_forward(ms_backend *be, const ms_gdn_config *c, const ms_gdn_weights *w, ms_kda_state *st,
                           const float *x, int n, float *out, ms_err *err) {
    return ms_gdn_forward(cpu_of(be)->pool, c, w, st, x, n, out, MS_KDA_AUTO, err);
}

/* ---- hyper-connections (ops/mhc.c) ---- */

static int cpu_mhc_pre(ms_backend *be, const ms_mhc *h, const float *streams, int n, float *collapsed, float *post,
                       float *comb, ms_err *err) {
    return ms_mhc_pre(cpu_of(be)->pool, h, streams, n, collapsed, post, comb, err);
}
static void cpu_mhc_post(ms_backend *be, const float *in, const float *y, const float *post, const float *comb, int n,
                         int hc, int dim, float *out) {
    ms_mhc_post(in, y, post, comb, n, hc, dim, out);
}
static void cpu_mhc_expand(ms_backend *be, const float *x, int n, int hc, int dim, float *out) {
    ms_mhc_expand(x, n, hc, dim, out);
}
static void cpu_mhc_head_mean(ms_backend *be, const float *streams, int n, int hc, int dim, float *out) {
    ms_mhc_head_mean(streams, n, hc, dim, out);
}
static int cpu_mhc_head_weighted(ms_backend *be, const ms_qmat *fn, const float *base, const float *scale, int hc,
                                 int dim, float hc_eps, float norm_eps, const float *streams, int n, float *out,
                                 ms_err *err) {
    return ms_mhc_head_weighted(cpu_of(be)->pool, fn, base, scale, hc, dim, hc_eps, norm_eps, streams, n, out, err);
}

static const ms_backend_ops k_cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .copy_rows = cpu_copy_rows,
    .sync = cpu_sync,
    .place_qmat = cpu_place_qmat,
    .place_vec = cpu_place_vec,
    .destroy = cpu_destroy,
    .workspace_bytes = cpu_workspace_bytes,
    .reserve = cpu_reserve,
    .matmul = cpu_matmul,
    .matmul_many = cpu_matmul_many,
    .rmsnorm = cpu_rmsnorm,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .scale = cpu_scale,
    .mul_sigmoid = cpu_mul_sigmoid,
    .rope = cpu_rope,
    .glu = cpu_glu,
    .embed = cpu_embed,
    .attn_gqa = ms_cpu_attn_gqa,
    .attn_mla = ms_cpu_attn_mla,
    .route = ms_cpu_route,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .scale_add_rows = cpu_scale_add_rows,
    .add_bias_any = cpu_add_bias_any,
    .split_gate_up = cpu_split_gate_up,
    .add_gated_rows = cpu_add_gated_rows,
    .moe_experts = ms_moe_experts_composed,
    .kda_forward = cpu_kda_forward,
    .gdn_forward = cpu_gdn_forward,
    .dsa_index = ms_cpu_dsa_index,
    .dsa_recheck = ms_cpu_dsa_recheck,
    .compress_append = ms_cpu_compress_append,
    .attn_compressed = ms_cpu_attn_compressed,
    .mhc_pre = cpu_mhc_pre,
    .mhc_post = cpu_mhc_post,
    .mhc_expand = cpu_mhc_expand,
    .mhc_head_mean = cpu_mhc_head_mean,
    .mhc_head_weighted = cpu_mhc_head_weighted,
    .attn_res_mix = ms_cpu_attn_res_mix,
    .layernorm = cpu_layernorm,
    .clamp = cpu_clamp,
};

int ms_backend_cpu_create(ms_pool *pool, ms_backend **out, ms_err *err) {
    cpu_backend *b = calloc(1, sizeof *b);
    if (!b) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    b->base.ops = &k_cpu_ops;
    b->base.name = "cpu";
    b->base.host_memory = 1;
    b->base.impl = b;
    b->pool = pool;
    b->n_threads = ms_pool_size(pool);
    if (b->n_threads < 1) b->n_threads = 1;
    *out = &b->base;
    return MS_OK;
}
