/* engine.c — state allocation and the layer loop (prefill and decode). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

#define MAX2(a, b) ((a) > (b) ? (a) : (b))

uint64_t ms_engine_state_bytes_per_token(const ms_model *m) {
    const ms_config *c = &m->cfg;
    uint64_t b = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_attn[l] == MS_ATTN_GQA) b += 2 * (uint64_t)(c->n_kv_heads * c->head_dim) * 4;
        else if (c->layer_attn[l] == MS_ATTN_MLA) b += (uint64_t)(c->kv_lora_rank + c->qk_rope_dim) * 4;
    }
    return b;
}

static void *zalloc(size_t n, int *failed) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) *failed = 1;
    return p;
}

int ms_engine_create(ms_model *m, const ms_engine_opts *opts, ms_engine **out, ms_err *err) {
    const ms_config *c = &m->cfg;
    ms_engine *e = calloc(1, sizeof *e);
    if (!e) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    e->m = m;
    e->pool = opts ? opts->pool : NULL;
    e->n_threads = ms_pool_size(e->pool);
    e->max_ctx = opts && opts->max_ctx > 0 ? opts->max_ctx : 4096;
    if (e->max_ctx > c->max_pos) e->max_ctx = (int)c->max_pos;
    e->max_batch = opts && opts->max_batch > 0 ? opts->max_batch : 256;
    e->experts = opts ? opts->experts : NULL;
    int rc;
    if (!e->experts) {
        if ((rc = ms_resident_experts_create(m, &e->own_experts, err))) {
            free(e);
            return rc;
        }
        e->experts = e->own_experts;
    }
    int f = 0;
    size_t L = (size_t)c->n_layers, T = (size_t)e->max_ctx, B = (size_t)e->max_batch;
    e->k_cache = zalloc(L * sizeof(float *), &f);
    e->v_cache = zalloc(L * sizeof(float *), &f);
    e->latent = zalloc(L * sizeof(float *), &f);
    e->kda = zalloc(L * sizeof *e->kda, &f);
    for (size_t l = 0; !f && l < L; l++) {
        if (c->layer_attn[l] == MS_ATTN_GQA) {
            size_t kd = (size_t)(c->n_kv_heads * c->head_dim);
            e->k_cache[l] = zalloc(T * kd * 4, &f);
            e->v_cache[l] = zalloc(T * kd * 4, &f);
        } else if (c->layer_attn[l] == MS_ATTN_MLA) {
            e->latent[l] = zalloc(T * (size_t)(c->kv_lora_rank + c->qk_rope_dim) * 4, &f);
        } else if (c->layer_attn[l] == MS_ATTN_KDA) {
            ms_kda_config kc;
            ms_kda_config_of(c, &kc);
            if (ms_kda_state_init(&e->kda[l], &kc, NULL)) f = 1;
        }
    }
    int64_t H = c->n_heads, qdim = MAX2(c->head_dim, c->qk_nope_dim + c->qk_rope_dim);
    int64_t vdim = MAX2(c->head_dim, c->v_head_dim);
    int64_t kvw = MAX2(2 * c->n_kv_heads * c->head_dim, MAX2(c->kv_lora_rank + c->qk_rope_dim, c->q_lora_rank));
    int64_t inter = MAX2(c->inter, MAX2(c->moe_inter, c->shared_inter));
    e->x = zalloc(B * c->hidden * 4, &f);
    e->xn = zalloc(B * c->hidden * 4, &f);
    e->q = zalloc(B * H * qdim * 4, &f);
    e->kv = zalloc(B * kvw * 4, &f);
    e->att = zalloc(B * H * vdim * 4, &f);
    e->tmp = zalloc(B * c->hidden * 4, &f);
    e->g = zalloc(B * inter * 4, &f);
    e->u = zalloc(B * inter * 4, &f);
    e->xs = zalloc(B * c->hidden * 4, &f);
    e->ys = zalloc(B * c->hidden * 4, &f);
    if (c->n_experts) {
        e->rlog = zalloc(B * c->n_experts * 4, &f);
        e->topk_ids = zalloc(B * c->top_k * sizeof(int), &f);
        e->topk_w = zalloc(B * c->top_k * 4, &f);
        e->ex_count = zalloc((size_t)c->n_experts * sizeof(int) + 4, &f);
        e->ex_tokens = zalloc(B * c->top_k * sizeof(int), &f);
        e->ex_w = zalloc(B * c->top_k * 4, &f);
    }
    /* per thread: scores [max_ctx] + latent query [B * kv_lora] + row [max(kv_lora, hidden, hd)] + 2 rope vectors */
    size_t row = (size_t)MAX2(MAX2(c->kv_lora_rank, c->hidden), MAX2(qdim, vdim)) + 16;
    e->th_stride = T + B * (size_t)MAX2(c->kv_lora_rank, 1) + 2 * row + 1024;
    if (e->th_stride < 2 * (size_t)c->n_experts + 64) e->th_stride = 2 * (size_t)c->n_experts + 64; /* router scratch */
    e->th_buf = zalloc((size_t)e->n_threads * e->th_stride * 4, &f);
    if (f) {
        ms_engine_destroy(e);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory allocating engine state (context %zu, batch %zu, %.1f MiB of cache)",
                       T, B, (double)T * (double)ms_engine_state_bytes_per_token(m) / 1048576.0);
    }
    *out = e;
    return MS_OK;
}

void ms_engine_destroy(ms_engine *e) {
    if (!e) return;
    for (int l = 0; e->k_cache && l < e->m->cfg.n_layers; l++) {
        free(e->k_cache[l]);
        free(e->v_cache[l]);
        free(e->latent[l]);
        if (e->kda) ms_kda_state_free(&e->kda[l]);
    }
    free(e->kda);
    free(e->k_cache);
    free(e->v_cache);
    free(e->latent);
    float *bufs[] = {e->x, e->xn, e->q, e->kv, e->att, e->tmp, e->g, e->u, e->xs, e->ys, e->rlog, e->topk_w, e->ex_w, e->th_buf};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(e->topk_ids);
    free(e->ex_count);
    free(e->ex_tokens);
    if (e->own_experts) e->own_experts->ops->destroy(e->own_experts);
    free(e);
}

void ms_engine_reset(ms_engine *e) {
    e->n_past = 0;
    for (int l = 0; e->kda && l < e->m->cfg.n_layers; l++) ms_kda_state_reset(&e->kda[l]);
}
int ms_engine_n_past(const ms_engine *e) { return e->n_past; }
const ms_engine_stats *ms_engine_get_stats(const ms_engine *e) { return &e->stats; }

void ms_rope_apply(const ms_rope *r, float *x, const float *cs, const float *sn) {
    int h = r->dim / 2;
    if (r->layout == MS_ROPE_INTERLEAVED) {
        for (int i = 0; i < h; i++) {
            float a = x[2 * i], b = x[2 * i + 1];
            x[2 * i] = a * cs[i] - b * sn[i];
            x[2 * i + 1] = b * cs[i] + a * sn[i];
        }
    } else {
        for (int i = 0; i < h; i++) {
            float a = x[i], b = x[i + h];
            x[i] = a * cs[i] - b * sn[i];
            x[i + h] = b * cs[i] + a * sn[i];
        }
    }
}

/* One chunk of n <= max_batch tokens. */
static int forward_chunk(ms_engine *e, const int32_t *tokens, int n, float *logits, int all_logits, ms_err *err) {
    ms_model *m = e->m;
    const ms_config *c = &m->cfg;
    int64_t D = c->hidden;
    for (int t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= c->vocab)
            return ms_fail(err, MS_ERR_ARG, "token id %d is out of range [0, %lld)", tokens[t], (long long)c->vocab);
        ms_qmat_row(&m->embed, tokens[t], e->x + (int64_t)t * D);
    }
    int rc = MS_OK;
    for (int l = 0; l < c->n_layers && !rc; l++) {
        const ms_layer *L = &m->layers[l];
        ms_rmsnorm(e->xn, e->x, L->attn_norm, n, (int)D, (float)c->rms_eps);
        if (c->layer_attn[l] == MS_ATTN_MLA) rc = ms_attn_mla(e, l, n, e->tmp, err);
        else if (c->layer_attn[l] == MS_ATTN_KDA) rc = ms_attn_kda(e, l, n, e->tmp, err);
        else rc = ms_attn_gqa(e, l, n, e->tmp, err);
        if (rc) break;
        for (int64_t i = 0; i < n * D; i++) e->x[i] += e->tmp[i];
        ms_rmsnorm(e->xn, e->x, L->ffn_norm, n, (int)D, (float)c->rms_eps);
        if (c->layer_mlp[l] == MS_MLP_MOE) rc = ms_ffn_moe(e, l, n, e->tmp, err);
        else rc = ms_ffn_dense(e, &L->gate, &L->up, &L->down, n, e->xn, e->tmp, 0);
        if (rc) break;
        for (int64_t i = 0; i < n * D; i++) e->x[i] += e->tmp[i];
    }
    if (rc) return rc;
    e->n_past += n;
    e->stats.tokens += (uint64_t)n;
    if (!logits) return MS_OK;
    if (all_logits) {
        ms_rmsnorm(e->xn, e->x, m->final_norm, n, (int)D, (float)c->rms_eps);
        ms_matmul(e->pool, logits, e->xn, n, &m->lm_head);
    } else {
        ms_rmsnorm(e->xn, e->x + (int64_t)(n - 1) * D, m->final_norm, 1, (int)D, (float)c->rms_eps);
        ms_matmul(e->pool, logits, e->xn, 1, &m->lm_head);
    }
    return MS_OK;
}

int ms_engine_forward(ms_engine *e, const int32_t *tokens, int n, float *logits, int all_logits, ms_err *err) {
    if (n <= 0) return ms_fail(err, MS_ERR_ARG, "forward needs at least one token");
    if ((int64_t)e->n_past + n > e->max_ctx)
        return ms_fail(err, MS_ERR_LIMIT, "context full: %d + %d tokens exceed the allocated %d", e->n_past, n, e->max_ctx);
    int64_t V = e->m->cfg.vocab;
    for (int s = 0; s < n; s += e->max_batch) {
        int k = n - s < e->max_batch ? n - s : e->max_batch;
        int last = s + k == n;
        float *lg = NULL;
        if (logits && all_logits) lg = logits + (int64_t)s * V;
        else if (logits && last) lg = logits;
        int rc = forward_chunk(e, tokens + s, k, lg, all_logits, err);
        if (rc) return rc;
    }
    return MS_OK;
}
