/* moe.c — feed-forward sublayers: dense SwiGLU MLP, routed MoE (router,
 * expert-major computation through the expert source), shared experts, and
 * the resident expert source. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

/* The gated activation of kind (the config's act for dense MLPs and shared
 * experts, expert_act for routed experts) over g (gate) and u (up), into g;
 * u may be clamped in place. One SwiGLU, parameterized by the config (plain,
 * gpt-oss's clamped (up + 1) form, GLM-5-Next / DeepSeek-V4's clamp), or SiTU. */
static void glu_act(const ms_config *c, ms_act_kind kind, float *g, float *u, int64_t n) {
    if (kind == MS_ACT_SITU) ms_situ_glu(g, g, u, n, (float)c->situ_beta, (float)c->situ_linear_beta);
    else ms_swiglu_param(g, u, n, (float)c->act_limit, (float)c->act_alpha, (float)c->act_up_offset);
}

int ms_ffn_dense(ms_engine *e, const ms_qmat *gate, const ms_qmat *up, const ms_qmat *down, int n, const float *in,
                 float *out, int accumulate) {
    int64_t I = gate->rows;
    ms_matmul(e->pool, e->g, in, n, gate);
    ms_matmul(e->pool, e->u, in, n, up);
    glu_act(&e->m->cfg, e->m->cfg.act, e->g, e->u, (int64_t)n * I);
    if (accumulate) ms_matmul_acc(e->pool, out, e->g, n, down);
    else ms_matmul(e->pool, out, e->g, n, down);
    return MS_OK;
}

/* Indices of the k largest of v[0..n) into idx (descending; ties: lower index first). */
static void topk(const float *v, int n, int k, int *idx) {
    for (int i = 0; i < k; i++) idx[i] = -1;
    for (int j = 0; j < n; j++) {
        if (isnan(v[j])) continue;
        int pos = k;
        while (pos > 0 && (idx[pos - 1] < 0 || v[j] > v[idx[pos - 1]])) pos--;
        if (pos >= k) continue;
        memmove(idx + pos + 1, idx + pos, (size_t)(k - pos - 1) * sizeof *idx);
        idx[pos] = j;
    }
    /* fewer than k non-NaN values (a NaN hidden state): fill with the lowest unused indices, never -1 */
    for (int i = 0, j = 0; i < k && j < n; i++) {
        if (idx[i] >= 0) continue;
        for (;; j++) {
            int used = 0;
            for (int q = 0; q < k; q++) used |= idx[q] == j;
            if (!used) break;
        }
        if (j < n) idx[i] = j++;
    }
}

/* Route one token: logits [E] → ids[k], weights[k] (transformers' router math).
 * fixed: the token's row of a hash-routed layer's table (ids given, only weighed), or NULL. */
static void route(const ms_config *c, const float *logits, const float *bias, const int32_t *fixed, float *scratch,
                  int *ids, float *w) {
    int E = (int)c->n_experts, K = (int)c->top_k;
    float *scores = scratch, *choice = scratch + E;
    if (c->router == MS_ROUTER_SQRTSOFTPLUS) { /* DeepSeek-V4: sqrt(softplus), always renormalized */
        for (int i = 0; i < E; i++) {
            float x = logits[i];
            scores[i] = sqrtf(x > 20.0f ? x : log1pf(expf(x)));
            choice[i] = scores[i] + (bias ? bias[i] : 0.0f);
        }
        if (fixed) for (int i = 0; i < K; i++) ids[i] = fixed[i];
        else topk(choice, E, K, ids);
        double sum = 0;
        for (int i = 0; i < K; i++) sum += (w[i] = scores[ids[i]]);
        for (int i = 0; i < K; i++) w[i] = (float)(w[i] / (sum + 1e-20)) * (float)c->routed_scale;
        return;
    }
    if (c->router == MS_ROUTER_SOFTMAX) {
        memcpy(scores, logits, (size_t)E * 4);
        ms_softmax(scores, E);
        topk(scores, E, K, ids);
    } else if (c->router == MS_ROUTER_TOPK_SOFTMAX) {
        topk(logits, E, K, ids);
        for (int i = 0; i < K; i++) w[i] = logits[ids[i]];
        ms_softmax(w, K);
        return;
    } else {
        for (int i = 0; i < E; i++) {
            scores[i] = ms_sigmoid(logits[i]);
            choice[i] = scores[i] + (bias ? bias[i] : 0.0f);
        }
        int G = (int)c->n_group;
        if (G > 1) {
            int per = E / G, gid[4096];
            float gs[4096];
            for (int g = 0; g < G; g++) {
                int t2[2];
                topk(choice + g * per, per, 2, t2);
                gs[g] = choice[g * per + t2[0]] + choice[g * per + t2[1]];
            }
            topk(gs, G, (int)c->topk_group, gid);
            unsigned char keep[4096] = {0};
            for (int i = 0; i < c->topk_group; i++) keep[gid[i]] = 1;
            for (int g = 0; g < G; g++)
                if (!keep[g])
                    for (int i = 0; i < per; i++) choice[g * per + i] = -INFINITY;
        }
        topk(choice, E, K, ids);
    }
    double sum = 0;
    for (int i = 0; i < K; i++) {
        w[i] = scores[ids[i]];
        sum += w[i];
    }
    if (c->norm_topk_prob) {
        float den = (float)(sum + (c->router == MS_ROUTER_SIGMOID ? 1e-20 : 0.0));
        for (int i = 0; i < K; i++) w[i] /= den;
    }
    for (int i = 0; i < K; i++) w[i] *= (float)c->routed_scale;
}

static void add_bias_rows(float *y, const void *bias, ms_dtype dt, int m, int64_t d) {
    if (!bias) return;
    float *b = malloc((size_t)d * sizeof *b);
    if (!b) abort();
    ms_to_f32(b, bias, dt, d);
    for (int i = 0; i < m; i++)
        for (int64_t k = 0; k < d; k++) y[(int64_t)i * d + k] += b[k];
    free(b);
}


/* One routed expert over the m gathered rows e->xs → e->ys. */
static void expert_ffn(ms_engine *e, const ms_expert_view *v, int m) {
    const ms_config *c = &e->m->cfg;
    int64_t I = v->down.cols, D = v->down.rows; /* hidden, or the latent width */
    if (!v->up.data) { /* fused, interleaved gate/up rows */
        ms_matmul(e->pool, e->u, e->xs, m, &v->gate);
        add_bias_rows(e->u, v->gate_bias, v->bias_dtype, m, 2 * I);
        for (int64_t i = 0; i < (int64_t)m * I; i++) {
            e->g[i] = e->u[2 * i];
            e->u[i] = e->u[2 * i + 1]; /* in place: reads run ahead of writes */
        }
    } else {
        ms_matmul(e->pool, e->g, e->xs, m, &v->gate);
        ms_matmul(e->pool, e->u, e->xs, m, &v->up);
        add_bias_rows(e->g, v->gate_bias, v->bias_dtype, m, I);
        add_bias_rows(e->u, v->up_bias, v->bias_dtype, m, I);
    }
    glu_act(c, c->expert_act, e->g, e->u, (int64_t)m * I);
    ms_matmul(e->pool, e->ys, e->g, m, &v->down);
    add_bias_rows(e->ys, v->down_bias, v->bias_dtype, m, D);
}

/* Decode lookahead: apply the next MoE layer's router to this layer's FFN input and
 * prefetch the experts it picks, so their reads overlap this layer's compute. Only
 * for sources that prefetch (streaming); uses rlog/th_buf, free once routed. */
static void lookahead_prefetch(ms_engine *e, int layer, int n) {
    const ms_config *c = &e->m->cfg;
    int K = (int)c->top_k;
    if (n != 1 || !e->experts->ops->prefetch || K > MS_LOOKAHEAD_MAX_K) return;
    int next = -1;
    for (int l = layer + 1; l < c->n_layers && next < 0; l++)
        if (c->layer_mlp[l] == MS_MLP_MOE) next = l;
    if (next < 0) return;
    const ms_layer *N = &e->m->layers[next];
    float w[MS_LOOKAHEAD_MAX_K];
    /* the next router sees the residual normed by ITS layer's FFN norm: re-norm this
     * layer's FFN input with that weight (the residual itself moves little in one layer) */
    const float *la_in = e->xn;
    if (e->ffn_in && N->ffn_norm) {
        ms_rmsnorm(e->xs, e->ffn_in, N->ffn_norm, 1, (int)c->hidden, (float)c->rms_eps);
        la_in = e->xs;
    }
    ms_matmul(e->pool, e->rlog, la_in, 1, &N->router);
    if (N->router_lbias)
        for (int x = 0; x < c->n_experts; x++) e->rlog[x] += N->router_lbias[x];
    const int32_t *fixed = N->hash_ids ? N->hash_ids + (int64_t)e->chunk_tokens[0] * K : NULL;
    route(c, e->rlog, N->router_bias, fixed, e->th_buf, e->la_ids, w);
    e->la_layer = next;
    ms_experts_prefetch(e->experts, next, K, e->la_ids);
}

int ms_ffn_moe(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->m->layers[layer];
    int E = (int)c->n_experts, K = (int)c->top_k;
    /* experts read `in` and sum into `acc`, rows of D: the hidden stream, or the
     * latent width between routed_expert_down_proj and up_proj (Kimi K3) */
    int64_t D = c->latent_moe ? c->expert_hidden : c->hidden;
    const float *in = e->xn;
    float *acc = out;
    if (c->latent_moe) {
        ms_matmul(e->pool, e->lat_in, e->xn, n, &L->lat_down);
        in = e->lat_in;
        acc = e->lat_out;
    }
    ms_matmul(e->pool, e->rlog, e->xn, n, &L->router);
    if (L->router_lbias)
        for (int t = 0; t < n; t++)
            for (int x = 0; x < E; x++) e->rlog[(int64_t)t * E + x] += L->router_lbias[x];
    float *scratch = e->th_buf; /* 2E floats, before any threaded use */
    for (int t = 0; t < n; t++)
        route(c, e->rlog + (int64_t)t * E, L->router_bias,
              L->hash_ids ? L->hash_ids + (int64_t)e->chunk_tokens[t] * K : NULL, scratch, e->topk_ids + t * K,
              e->topk_w + t * K);
    /* expert-major lists: counting sort of (token, slot) pairs by expert */
    int *cnt = e->ex_count;
    memset(cnt, 0, (size_t)(E + 1) * sizeof *cnt);
    for (int i = 0; i < n * K; i++) cnt[e->topk_ids[i] + 1]++;
    for (int x = 0; x < E; x++) cnt[x + 1] += cnt[x];
    int *pos = malloc((size_t)E * sizeof *pos);
    int *uniq = malloc((size_t)E * sizeof *uniq);
    ms_expert_view *views = malloc((size_t)E * sizeof *views);
    if (!pos || !uniq || !views) {
        free(pos), free(uniq), free(views);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory routing layer %d", layer);
    }
    memcpy(pos, cnt, (size_t)E * sizeof *pos);
    for (int i = 0; i < n * K; i++) {
        int x = e->topk_ids[i];
        e->ex_tokens[pos[x]] = i / K;
        e->ex_w[pos[x]] = e->topk_w[i];
        pos[x]++;
    }
    int nu = 0;
    for (int x = 0; x < E; x++)
        if (cnt[x + 1] > cnt[x]) uniq[nu++] = x;
    /* lookahead accounting: how many of this token's experts the previous layer predicted */
    if (n == 1 && e->la_layer == layer) {
        for (int i = 0; i < K; i++)
            for (int j = 0; j < K; j++) e->stats.lookahead_correct += e->topk_ids[i] == e->la_ids[j];
        e->stats.lookahead_predicted += (uint64_t)K;
    }
    e->la_layer = -1;
    e->stats.experts_acquired += (uint64_t)nu;
    e->stats.expert_activations += (uint64_t)n * K;
    memset(acc, 0, (size_t)(n * D) * 4);
    /* a bounded expert cache serves at most max_acquire experts at once: groups, in expert order
     * (the same accumulation order as one acquire, so results do not depend on the cache size) */
    int group = e->experts->max_acquire > 0 ? e->experts->max_acquire : nu;
    for (int g0 = 0; g0 < nu; g0 += group) {
        int gn = nu - g0 < group ? nu - g0 : group;
        int rc = ms_experts_acquire(e->experts, layer, gn, uniq + g0, views, err);
        if (rc) {
            free(pos), free(uniq), free(views);
            return rc;
        }
        if (g0 == 0) lookahead_prefetch(e, layer, n);
        for (int u = 0; u < gn; u++) {
            /* rows in blocks of max_batch: a hash-routed token can pick one expert in several slots */
            int x = uniq[g0 + u];
            for (int b = cnt[x]; b < cnt[x + 1]; b += e->max_batch) {
                int m = cnt[x + 1] - b < e->max_batch ? cnt[x + 1] - b : e->max_batch;
                for (int i = 0; i < m; i++)
                    memcpy(e->xs + (int64_t)i * D, in + (int64_t)e->ex_tokens[b + i] * D, (size_t)D * 4);
                expert_ffn(e, &views[u], m);
                for (int i = 0; i < m; i++) {
                    float w = e->ex_w[b + i], *o = acc + (int64_t)e->ex_tokens[b + i] * D;
                    const float *y = e->ys + (int64_t)i * D;
                    for (int64_t d = 0; d < D; d++) o[d] += w * y[d];
                }
            }
        }
        ms_experts_release(e->experts, layer);
    }
    free(pos), free(uniq), free(views);
    if (c->latent_moe) {
        if (c->latent_moe_norm) ms_rmsnorm(acc, acc, L->lat_norm, n, (int)D, (float)c->rms_eps);
        ms_matmul(e->pool, out, acc, n, &L->lat_up);
    }
    if (c->shared_inter && c->shared_expert_gate) { /* out += sigmoid(shared_expert_gate x) * shared(x) */
        ms_ffn_dense(e, &L->gate, &L->up, &L->down, n, e->xn, e->ys, 0);
        ms_matmul(e->pool, e->rlog, e->xn, n, &L->shared_gate); /* [n, 1]; router logits are used up */
        for (int t = 0; t < n; t++) {
            float s = ms_sigmoid(e->rlog[t]), *o = out + (int64_t)t * c->hidden;
            const float *y = e->ys + (int64_t)t * c->hidden;
            for (int64_t d = 0; d < c->hidden; d++) o[d] += s * y[d];
        }
    } else if (c->shared_inter) {
        ms_ffn_dense(e, &L->gate, &L->up, &L->down, n, e->xn, out, 1);
    }
    return MS_OK;
}

/* ---------------- resident expert source ---------------- */

typedef struct {
    ms_expert_source base;
    ms_model *m;
} resident_source;

static int resident_acquire(ms_expert_source *s, int layer, int n, const int *ids, ms_expert_view *views, ms_err *err) {
    resident_source *r = (resident_source *)s;
    const ms_layer *L = &r->m->layers[layer];
    if (!L->experts) return ms_fail(err, MS_ERR_ARG, "layer %d has no routed experts", layer);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= r->m->cfg.n_experts)
            return ms_fail(err, MS_ERR_ARG, "expert %d of layer %d is out of range", ids[i], layer);
        views[i] = L->experts[ids[i]];
    }
    return MS_OK;
}

static void resident_destroy(ms_expert_source *s) { free(s); }

static const ms_expert_source_ops k_resident_ops = {resident_acquire, NULL, NULL, resident_destroy};

int ms_resident_experts_create(ms_model *m, ms_expert_source **out, ms_err *err) {
    resident_source *r = calloc(1, sizeof *r);
    if (!r) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    r->base.ops = &k_resident_ops;
    r->m = m;
    *out = &r->base;
    return MS_OK;
}
