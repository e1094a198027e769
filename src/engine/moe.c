/* moe.c — feed-forward sublayers: dense SwiGLU MLP, routed MoE (router,
 * expert-major computation through the expert source), shared experts, and
 * the resident expert source. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/hybrid_experts.h"

/* The gated activation of kind (the config's act for dense MLPs and shared
 * experts, expert_act for routed experts): one SwiGLU parameterized by the
 * config (plain, gpt-oss's clamped (up + 1) form, GLM-5-Next / DeepSeek-V4's
 * clamp), or SiTU. */
ms_glu ms_moe_glu(const ms_config *c, ms_act_kind kind) {
    ms_glu a = {.kind = kind, .limit = (float)c->act_limit, .alpha = (float)c->act_alpha,
                .up_offset = (float)c->act_up_offset, .beta = (float)c->situ_beta,
                .linear_beta = (float)c->situ_linear_beta};
    return a;
}

int ms_ffn_dense(ms_engine *e, const ms_qmat *gate, const ms_qmat *up, const ms_qmat *down, int n, const float *in,
                 float *out, int accumulate) {
    ms_backend *be = e->be;
    int64_t I = gate->rows;
    ms_glu act = ms_moe_glu(&e->m->cfg, e->m->cfg.act);
    be->ops->matmul(be, e->g, in, n, gate, 0);
    be->ops->matmul(be, e->u, in, n, up, 0);
    be->ops->glu(be, &act, e->g, e->u, (int64_t)n * I);
    be->ops->matmul(be, out, e->g, n, down, accumulate);
    return MS_OK;
}

/* Router logits [n, E] of layer L's router over x, its Linear bias added, routed
 * into ids/w [n, K] (backend memory) and downloaded into e->h_ids / e->h_w.
 * tokens: the chunk's ids (hash-routed layers look their experts up by token). */
int ms_moe_route(ms_engine *e, const ms_layer *L, const float *x, int n, const int32_t *tokens, int *ids, float *w,
                 ms_err *err) {
    const ms_config *c = &e->m->cfg;
    ms_backend *be = e->be;
    int64_t E = c->n_experts, K = c->top_k;
    be->ops->matmul(be, e->rlog, x, n, &L->router, 0);
    if (L->router_lbias) be->ops->add_bias(be, e->rlog, L->router_lbias, n, E);
    const int32_t *fixed = NULL;
    if (L->hash_ids) { /* hash routing: the table stays host memory (also in placed models) */
        for (int t = 0; t < n; t++) memcpy(e->h_fixed + t * K, L->hash_ids + tokens[t] * K, (size_t)K * 4);
        fixed = e->h_fixed;
    }
    ms_route_args a = {.c = c, .logits = e->rlog, .bias = L->router_bias, .fixed = fixed, .n = n, .ids = ids, .w = w};
    be->ops->route(be, &a);
    int rc = be->ops->download(be, e->h_ids, ids, (size_t)(n * K) * sizeof(int), err);
    if (!rc) rc = be->ops->download(be, e->h_w, w, (size_t)(n * K) * 4, err);
    return rc;
}

/* Decode lookahead: apply the next MoE layer's router to this layer's FFN input and
 * prefetch the experts it picks, so their reads overlap this layer's compute. Only
 * for sources that prefetch (streaming); uses rlog/xs and the routing lists, free once
 * this layer is routed. */
int ms_moe_lookahead(ms_engine *e, int layer, int n, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    int K = (int)c->top_k;
    int next = -1;
    for (int l = layer + 1; l < c->n_layers && next < 0; l++)
        if (c->layer_mlp[l] == MS_MLP_MOE) next = l;
    if (next < 0) return MS_OK;
    /* hybrid: a CPU layer's experts come from the host source */
    ms_expert_source *src = ms_hybrid_layer(e, next) ? ms_hybrid_host(e) : e->experts;
    if (n != 1 || !src->ops->prefetch || K > MS_LOOKAHEAD_MAX_K) return MS_OK;
    const ms_layer *N = &e->w->layers[next];
    /* the next router sees the residual normed by ITS layer's FFN norm: re-norm this
     * layer's FFN input with that weight (the residual itself moves little in one layer) */
    const float *la_in = e->xn;
    if (e->ffn_in && N->ffn_norm) {
        e->be->ops->rmsnorm(e->be, e->xs, e->ffn_in, N->ffn_norm, 1, c->hidden, (float)c->rms_eps);
        la_in = e->xs;
    }
    /* this layer's expert-major lists are built, its ids no longer needed: reuse them */
    int rc = ms_moe_route(e, N, la_in, 1, e->chunk_tokens, e->topk_ids, e->topk_w, err);
    if (rc) return rc;
    memcpy(e->la_ids, e->h_ids, (size_t)K * sizeof(int));
    e->la_layer = next;
    ms_experts_prefetch(src, next, K, e->la_ids);
    return MS_OK;
}

/* The expert-major lists of the routing in e->h_ids / e->h_w (n tokens): a counting sort
 * of (token, slot) pairs by expert into ex_count (offsets [E + 1]), ex_tokens, ex_w, the
 * unique experts into ex_uniq; lookahead accounting and stats. Returns the unique count. */
int ms_moe_build_lists(ms_engine *e, int layer, int n) {
    const ms_config *c = &e->m->cfg;
    int E = (int)c->n_experts, K = (int)c->top_k;
    /* expert-major lists: counting sort of (token, slot) pairs by expert */
    int *cnt = e->ex_count, *pos = e->ex_pos, *uniq = e->ex_uniq;
    memset(cnt, 0, (size_t)(E + 1) * sizeof *cnt);
    for (int i = 0; i < n * K; i++) cnt[e->h_ids[i] + 1]++;
    for (int x = 0; x < E; x++) cnt[x + 1] += cnt[x];
    memcpy(pos, cnt, (size_t)E * sizeof *pos);
    for (int i = 0; i < n * K; i++) {
        int x = e->h_ids[i];
        e->ex_tokens[pos[x]] = i / K;
        e->ex_w[pos[x]] = e->h_w[i];
        pos[x]++;
    }
    int nu = 0;
    for (int x = 0; x < E; x++)
        if (cnt[x + 1] > cnt[x]) uniq[nu++] = x;
    /* lookahead accounting: how many of this token's experts the previous layer predicted */
    if (n == 1 && e->la_layer == layer) {
        for (int i = 0; i < K; i++)
            for (int j = 0; j < K; j++) e->stats.lookahead_correct += e->h_ids[i] == e->la_ids[j];
        e->stats.lookahead_predicted += (uint64_t)K;
    }
    e->la_layer = -1;
    e->stats.experts_acquired += (uint64_t)nu;
    e->stats.expert_activations += (uint64_t)n * K;
    return nu;
}

/* The routed experts of layer over n tokens through host lists: the router's ids
 * downloaded, expert-major lists (counting sort of (token, slot) pairs by expert),
 * acquired in groups from the expert source, run by the backend's moe_experts. */
static int moe_lists(ms_engine *e, int layer, int n, const float *in, float *acc, int64_t D, const ms_glu *act,
                     ms_err *err) {
    const ms_layer *L = &e->w->layers[layer];
    ms_backend *be = e->be;
    int rc = ms_moe_route(e, L, e->xn, n, e->chunk_tokens, e->topk_ids, e->topk_w, err);
    if (rc) return ms_wrap(err, "layer %d router", layer);
    int nu = ms_moe_build_lists(e, layer, n);
    int *cnt = e->ex_count, *uniq = e->ex_uniq;
    ms_expert_view *views = e->ex_views;
    be->ops->zero(be, acc, (size_t)(n * D) * 4);
    /* a bounded expert cache serves at most max_acquire experts at once: groups, in expert order
     * (the same accumulation order as one acquire, so results do not depend on the cache size) */
    int group = e->experts->max_acquire > 0 ? e->experts->max_acquire : nu;
    for (int g0 = 0; g0 < nu; g0 += group) {
        int gn = nu - g0 < group ? nu - g0 : group;
        if ((rc = ms_experts_acquire(e->experts, layer, gn, uniq + g0, views, err))) return rc;
        if (g0 == 0 && (rc = ms_moe_lookahead(e, layer, n, err))) return rc;
        /* the group's pairs: expert uniq[g0 + u] holds pairs cnt[x]..cnt[x + 1) */
        for (int u = 0; u < gn; u++) e->ex_off[u] = cnt[uniq[g0 + u]];
        e->ex_off[gn] = cnt[uniq[g0 + gn - 1] + 1];
        ms_moe_args ma = {.in = in, .acc = acc, .D = D, .act = act, .nu = gn, .views = views, .off = e->ex_off,
                          .tok = e->ex_tokens, .w = e->ex_w, .max_batch = e->max_batch, .xs = e->xs, .g = e->g,
                          .u = e->u, .ys = e->ys};
        be->ops->moe_experts(be, &ma);
        ms_experts_release(e->experts, layer);
    }
    return MS_OK;
}

int ms_ffn_moe(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    if (ms_hybrid_layer(e, layer)) return ms_hybrid_ffn_moe(e, layer, n, out, err); /* experts on the CPU */
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->w->layers[layer];
    ms_backend *be = e->be;
    int E = (int)c->n_experts, K = (int)c->top_k;
    /* experts read `in` and sum into `acc`, rows of D: the hidden stream, or the
     * latent width between routed_expert_down_proj and up_proj (Kimi K3) */
    int64_t D = c->latent_moe ? c->expert_hidden : c->hidden;
    const float *in = e->xn;
    float *acc = out;
    if (c->latent_moe) {
        be->ops->matmul(be, e->lat_in, e->xn, n, &L->lat_down, 0);
        in = e->lat_in;
        acc = e->lat_out;
    }
    ms_glu act = ms_moe_glu(c, c->expert_act);
    int rc, routed = 0;
    /* decode with resident experts on a backend that routes on the device: no host round trip */
    if (n == 1 && be->ops->moe_experts_routed && e->experts == e->own_experts && !L->hash_ids && L->experts &&
        !e->no_routed) {
        ms_route_args ra = {.c = c, .logits = e->rlog, .bias = L->router_bias, .n = 1, .ids = e->topk_ids,
                            .w = e->topk_w};
        if (be->ops->router_route && !L->router_lbias) {
            be->ops->router_route(be, &ra, e->xn, &L->router);
        } else {
            be->ops->matmul(be, e->rlog, e->xn, 1, &L->router, 0);
            if (L->router_lbias) be->ops->add_bias(be, e->rlog, L->router_lbias, 1, E);
            be->ops->route(be, &ra);
        }
        ms_moe_routed_args ma = {.in = in, .acc = acc, .D = D, .act = &act, .ids = e->topk_ids, .w = e->topk_w,
                                 .K = K, .E = E, .all = L->experts};
        int rrc = be->ops->moe_experts_routed(be, &ma, err);
        if (rrc && rrc != MS_ERR_UNSUPPORTED) return ms_wrap(err, "layer %d experts", layer);
        if (!rrc) {
            e->stats.experts_acquired += (uint64_t)K;
            e->stats.expert_activations += (uint64_t)K;
            e->la_layer = -1;
            routed = 1;
        } else {
            e->no_routed = 1; /* this backend takes the lists: from now on without asking */
        }
    }
    if (!routed && (rc = moe_lists(e, layer, n, in, acc, D, &act, err))) return rc;
    if (c->latent_moe) {
        if (c->latent_moe_norm) be->ops->rmsnorm(be, acc, acc, L->lat_norm, n, D, (float)c->rms_eps);
        be->ops->matmul(be, out, acc, n, &L->lat_up, 0);
    }
    if (c->shared_inter && c->shared_expert_gate) { /* out += sigmoid(shared_expert_gate x) * shared(x) */
        ms_ffn_dense(e, &L->gate, &L->up, &L->down, n, e->xn, e->ys, 0);
        be->ops->matmul(be, e->rlog, e->xn, n, &L->shared_gate, 0); /* [n, 1]; router logits are used up */
        be->ops->add_gated_rows(be, out, e->ys, e->rlog, n, c->hidden);
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
