/* moe.c — feed-forward sublayers: dense SwiGLU MLP, routed MoE (router,
 * expert-major computation through the expert source), shared experts, and
 * the resident expert source. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/comm.h"
#include "engine/device_experts.h"
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
    ms_matmul_job gu[2] = {{e->g, in, n, gate, 0}, {e->u, in, n, up, 0}}; /* one pass (one launch on a device) */
    be->ops->matmul_many(be, gu, 2);
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
    int64_t E = ms_router_width(c), K = c->top_k;
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Decode lookahead: apply the next MoE layer's router to this layer's FFN input and
 * prefetch the experts it picks, so their reads overlap this layer's compute. Only
 * for sources that prefetch (streaming); uses rlog/xs and the routing lists, free once
 * this layer is routed. */
int ms_moe_lookahead(ms_engine *e, int layer, int n, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    int K = (int)c->top_k;
    int next = -1;
    for (int l = layer + 1; l < e->l1 && next < 0; l++) /* within this engine's stage */
        if (c->layer_mlp[l] == MS_MLP_MOE) next = l;
    if (next < 0) return MS_OK;
    /* hybrid: a CPU layer's experts come from the host source */
    ms_expert_source *src = ms_hybrid_layer(e, next) ? ms_hybrid_host(e) : e->experts;
    if (n != 1 || !src->ops->prefetch || K > MS_LOOKAHEAD_MAX_K) return MS_OK;
    /* a source that holds guesses back asks for few of them: no router pass, no download */
    if (!ms_experts_wants_prefetch(src, next)) return MS_OK;
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
    int nk = 0; /* zero-computation experts have nothing to prefetch */
    for (int i = 0; i < K; i++)
        if (e->h_ids[i] < c->n_experts) e->la_ids[nk++] = e->h_ids[i];
    for (int i = nk; i < K; i++) e->la_ids[i] = -1;
    e->la_layer = next;
    ms_experts_prefetch(src, next, nk, e->la_ids);
    return MS_OK;
}

/* The expert-major lists of the routing in e->h_ids / e->h_w (n tokens): a counting sort of
 * (token, slot) pairs by key into ex_count (offsets [W + 1], W = ms_router_width: the
 * zero-computation experts E..W-1 sort after the routed ones), ex_tokens, ex_w; the keys of
 * the routed experts present into ex_uniq, in order. rank: NULL (key = expert id), or [E] the
 * key of each routed expert (expert parallelism: by (home device, id), so each device's experts
 * are one run of the lists). Lookahead accounting and stats. Returns the unique count. */
int ms_moe_build_lists(ms_engine *e, int layer, int n, const int *rank) {
    const ms_config *c = &e->m->cfg;
    int E = (int)c->n_experts, K = (int)c->top_k, W = (int)ms_router_width(c);
#define KEY(x) (rank && (x) < E ? rank[x] : (x))
    int *cnt = e->ex_count, *pos = e->ex_pos, *uniq = e->ex_uniq;
    memset(cnt, 0, (size_t)(W + 1) * sizeof *cnt);
    for (int i = 0; i < n * K; i++) cnt[KEY(e->h_ids[i]) + 1]++;
    for (int x = 0; x < W; x++) cnt[x + 1] += cnt[x];
    memcpy(pos, cnt, (size_t)W * sizeof *pos);
    for (int i = 0; i < n * K; i++) {
        int x = KEY(e->h_ids[i]);
        e->ex_tokens[pos[x]] = i / K;
        e->ex_w[pos[x]] = e->h_w[i];
        pos[x]++;
    }
    int nu = 0; /* uniq: keys in order */
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
#undef KEY
    return nu;
}

/* Zero-computation experts: keys E..W-1 of the lists (after the routed experts; per token in
 * ascending id), each pair acc[t] += w * in[t] in list order, one scale_add_rows of be. */
void ms_moe_zero_experts(ms_engine *e, ms_backend *be, const float *in, float *acc, int64_t D) {
    const ms_config *c = &e->m->cfg;
    int E = (int)c->n_experts, W = (int)ms_router_width(c);
    if (W == E) return;
    int q0 = e->ex_count[E], m = e->ex_count[W] - q0;
    if (m > 0) be->ops->scale_add_rows(be, acc, in, e->ex_tokens + q0, e->ex_w + q0, m, D);
}

/* ms_engine_observe_choices (a host-memory backend): each token's routed experts reported; where the
 * observer forces other ids, the chunk is weighed again with the ids given (h_fixed). */
static int observe_route(ms_engine *e, const ms_layer *L, int layer, int n, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const int64_t W = ms_router_width(c), K = c->top_k;
    int forced = 0;
    for (int t = 0; t < n; t++) {
        ms_choice ch = {.kind = MS_CHOICE_EXPERTS, .layer = layer, .pos = (int64_t)e->seqs[0].e->n_past + t,
                        .scores = e->rlog + t * W, .n_scores = (int)W, .chosen = (const int32_t *)e->h_ids + t * K,
                        .n_chosen = (int)K};
        int32_t *f = e->h_fixed + t * K;
        if (e->choice_fn(e->choice_ctx, &ch, f)) forced = 1;
        else memcpy(f, e->h_ids + t * K, (size_t)K * sizeof *f);
    }
    if (!forced) return MS_OK;
    ms_backend *be = e->be;
    ms_route_args a = {.c = c, .logits = e->rlog, .bias = L->router_bias, .fixed = e->h_fixed, .n = n,
                       .ids = e->topk_ids, .w = e->topk_w};
    be->ops->route(be, &a);
    int rc = be->ops->download(be, e->h_ids, e->topk_ids, (size_t)(n * K) * sizeof(int), err);
    if (!rc) rc = be->ops->download(be, e->h_w, e->topk_w, (size_t)(n * K) * 4, err);
    return rc;
}

/* The routed experts of layer over n tokens through host lists: the router's ids
 * downloaded, expert-major lists (counting sort of (token, slot) pairs by expert),
 * acquired in groups from the expert source, run by the backend's moe_experts. */
static int moe_lists(ms_engine *e, int layer, int n, const float *in, float *acc, int64_t D, const ms_glu *act,
                     ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->w->layers[layer];
    ms_backend *be = e->be;
    int E = (int)c->n_experts;
    int rc = ms_moe_route(e, L, e->xn, n, e->chunk_tokens, e->topk_ids, e->topk_w, err);
    if (rc) return ms_wrap(err, "layer %d router", layer);
    if (e->choice_fn && !L->hash_ids && e->n_seqs == 1 && (rc = observe_route(e, L, layer, n, err))) return rc;
    /* split over devices (expert parallelism): keys by the expert's rank in (home device, id)
     * order, so each device's experts are one run of the lists */
    const int *home = NULL; /* expert parallelism: where each expert runs (its home, or here when replicated here) */
    int *rank = NULL, *inv = NULL;
    if (e->staged && e->stages->expert_home) {
        const int *h = e->stages->expert_home + (int64_t)layer * E;
        const uint32_t *devs = e->stages->expert_devs ? e->stages->expert_devs + (int64_t)layer * E : NULL;
        int *run = e->ex_rank + 2 * E;
        rank = e->ex_rank, inv = e->ex_rank + E;
        for (int x = 0; x < E; x++) run[x] = devs && (devs[x] >> e->stage & 1u) ? e->stage : h[x];
        home = run;
        int r = 0;
        for (int d = 0; d < e->stages->n; d++)
            for (int x = 0; x < E; x++)
                if (home[x] == d) inv[r] = x, rank[x] = r++;
        if (r != E) return ms_fail(err, MS_ERR_ARG, "layer %d: %d of %d experts have a home device", layer, r, E);
    }
#define EXPERT(k) (inv && (k) < E ? inv[k] : (k))
    int nu = ms_moe_build_lists(e, layer, n, rank);
    int *cnt = e->ex_count, *uniq = e->ex_uniq;
    ms_expert_view *views = e->ex_views;
    be->ops->zero(be, acc, (size_t)(n * D) * 4);
    /* this device's run of the lists (all of them without expert parallelism), then each other
     * device's: its tokens' rows sent there, its experts run there, the sum sent back and added */
    int n_dev = home ? e->stages->n : 1;
    for (int step = 0; step < n_dev; step++) {
        int d = home ? (e->stage + step) % n_dev : 0; /* local first */
        int u0 = 0, u1 = nu;
        if (home) {
            while (u0 < nu && home[EXPERT(uniq[u0])] != d) u0++;
            for (u1 = u0; u1 < nu && home[EXPERT(uniq[u1])] == d;) u1++;
        }
        if (u1 == u0) continue;
        ms_engine *x = home ? e->stage_e[d] : e; /* the engine whose backend, experts and scratch run the run */
        ms_backend *xb = x->be;
        const float *xin = in;
        float *xacc = acc;
        double t_remote = x != e ? now_s() : 0;
        if (x != e) { /* dispatch: the chunk's rows to device d (its FFN input and sum buffers are free now) */
            float *rin = c->latent_moe ? x->lat_in : x->xn;
            xacc = c->latent_moe ? x->lat_out : x->tmp;
            rc = e->stages->comm->ops->copy(e->stages->comm, d, rin, e->stage, in, (size_t)(n * D) * 4, err);
            if (rc) return ms_wrap(err, "layer %d: tokens to device %d", layer, d);
            xin = rin;
            ms_stage_activate(e, d); /* device d's kernels */
            xb->ops->zero(xb, xacc, (size_t)(n * D) * 4);
        }
        int ids[1024];
        /* a bounded expert cache serves at most max_acquire experts at once: groups, in expert order
         * (the same accumulation order as one acquire, so results do not depend on the cache size) */
        int group = x->experts->max_acquire > 0 ? x->experts->max_acquire : u1 - u0;
        if (group > (int)(sizeof ids / sizeof *ids)) group = (int)(sizeof ids / sizeof *ids);
        for (int g0 = u0; g0 < u1; g0 += group) {
            int gn = u1 - g0 < group ? u1 - g0 : group;
            for (int u = 0; u < gn; u++) ids[u] = EXPERT(uniq[g0 + u]);
            if ((rc = ms_experts_acquire(x->experts, layer, gn, ids, views, err))) return rc;
            if (g0 == 0 && x == e && (rc = ms_moe_lookahead(e, layer, n, err))) return rc;
            /* the group's pairs: key uniq[g0 + u] holds pairs cnt[k]..cnt[k + 1) */
            for (int u = 0; u < gn; u++) e->ex_off[u] = cnt[uniq[g0 + u]];
            e->ex_off[gn] = cnt[uniq[g0 + gn - 1] + 1];
            ms_moe_args ma = {.in = xin, .acc = xacc, .D = D, .act = act, .nu = gn, .views = views, .off = e->ex_off,
                              .tok = e->ex_tokens, .w = e->ex_w, .max_batch = e->max_batch, .xs = x->xs, .g = x->g,
                              .u = x->u, .ys = x->ys};
            xb->ops->moe_experts(xb, &ma);
            ms_experts_release(x->experts, layer);
        }
        if (x != e) { /* combine: device d's weighted sum back, added to this device's */
            if ((rc = xb->ops->sync(xb, err))) return rc;
            x->stats.remote_experts_s += now_s() - t_remote;
            rc = e->stages->comm->ops->copy(e->stages->comm, e->stage, e->ys, d, xacc, (size_t)(n * D) * 4, err);
            if (rc) return ms_wrap(err, "layer %d: expert sums from device %d", layer, d);
            ms_stage_activate(e, e->stage);
            be->ops->add(be, acc, e->ys, (int64_t)n * D);
        }
    }
    ms_moe_zero_experts(e, be, in, acc, D); /* after every routed expert, as the lists order them */
#undef EXPERT
    return MS_OK;
}

/* Decode with streamed experts (a device source) where the backend has the fused routed kernels:
 * layer's one token routed as ms_ffn_moe routes resident decode (router_route where the backend
 * has it), its ids downloaded (the source needs them; the weights stay on the device), its K distinct experts
 * acquired in one call in ascending id (the lists' order), and moe_experts_routed run over this
 * call's views (per_call) with each slot's rank among the K ids as its id: the ascending order,
 * and so the sum, of the resident decode, without the lists' per-expert launches. Then the
 * lookahead (after the launch: it reuses the routing buffers; its download waits for the
 * kernels) and the release. A backend that refuses the call (MS_ERR_UNSUPPORTED) gets the
 * lists over the same acquire, and the lists from then on (e->no_routed_stream). */
static int moe_stream_routed(ms_engine *e, int layer, const float *in, float *acc, int64_t D, const ms_glu *act,
                             ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->w->layers[layer];
    ms_backend *be = e->be;
    int K = (int)c->top_k;
    /* routed as the resident decode routes (the same router op, so the same weights) */
    ms_route_args ra = {.c = c, .logits = e->rlog, .bias = L->router_bias, .n = 1, .ids = e->topk_ids, .w = e->topk_w};
    if (be->ops->router_route && !L->router_lbias) {
        be->ops->router_route(be, &ra, e->xn, &L->router);
    } else {
        be->ops->matmul(be, e->rlog, e->xn, 1, &L->router, 0);
        if (L->router_lbias) be->ops->add_bias(be, e->rlog, L->router_lbias, 1, ms_router_width(c));
        be->ops->route(be, &ra);
    }
    /* the ids only (one host sync): the kernels read the weights where route wrote them; the lists'
     * weights (ex_w) are filled below only if the lists run */
    double t0 = now_s();
    int rc = be->ops->download(be, e->h_ids, e->topk_ids, (size_t)K * sizeof(int), err);
    if (rc) return ms_wrap(err, "layer %d router", layer);
    double t1 = now_s();
    int nu = ms_moe_build_lists(e, layer, 1, NULL);
    int *cnt = e->ex_count, *uniq = e->ex_uniq;
    ms_expert_view *views = e->ex_views;
    rc = ms_experts_acquire(e->experts, layer, nu, uniq, views, err);
    double t2 = now_s();
    e->stats.route_wait_s += t1 - t0, e->stats.acquire_s += t2 - t1;
    if (rc) return rc;
    int routed = 0;
    if (nu == K) { /* distinct ids: slot j's rank = its expert's index in uniq */
        int rank[32];
        for (int j = 0; j < K; j++) {
            rank[j] = 0;
            for (int q = 0; q < K; q++) rank[j] += e->h_ids[q] < e->h_ids[j];
        }
        rc = be->ops->upload(be, e->topk_ids, rank, (size_t)K * sizeof *rank, err);
        ms_moe_routed_args ma = {.in = in, .acc = acc, .D = D, .act = act, .ids = e->topk_ids, .w = e->topk_w,
                                 .K = K, .E = nu, .all = views, .per_call = 1};
        if (!rc) rc = be->ops->moe_experts_routed(be, &ma, err);
        if (rc == MS_ERR_UNSUPPORTED) rc = MS_OK, e->no_routed_stream = 1;
        else if (!rc) routed = 1;
    } else {
        e->no_routed_stream = 1;
    }
    if (!rc && !routed) /* the lists over this acquire (one group: nu <= max_acquire), with the weights */
        rc = be->ops->download(be, e->h_w, e->topk_w, (size_t)K * 4, err);
    if (!rc && !routed) {
        for (int i = 0, *pos = e->ex_pos; i < K; i++) pos[e->h_ids[i]] = cnt[e->h_ids[i]];
        for (int i = 0, *pos = e->ex_pos; i < K; i++) e->ex_w[pos[e->h_ids[i]]++] = e->h_w[i]; /* as built */
        for (int u = 0; u < nu; u++) e->ex_off[u] = cnt[uniq[u]];
        e->ex_off[nu] = cnt[uniq[nu - 1] + 1];
        be->ops->zero(be, acc, (size_t)D * 4);
        ms_moe_args ma = {.in = in, .acc = acc, .D = D, .act = act, .nu = nu, .views = views, .off = e->ex_off,
                          .tok = e->ex_tokens, .w = e->ex_w, .max_batch = e->max_batch, .xs = e->xs, .g = e->g,
                          .u = e->u, .ys = e->ys};
        be->ops->moe_experts(be, &ma);
    }
    double t3 = now_s();
    if (!rc) rc = ms_moe_lookahead(e, layer, 1, err);
    e->stats.lookahead_s += now_s() - t3;
    ms_experts_release(e->experts, layer);
    return rc ? ms_wrap(err, "layer %d experts", layer) : MS_OK;
}

/* The routed experts' rows: they read *in and sum into *acc, rows of the returned width D:
 * the hidden stream (in = e->xn, acc = out), or the latent width between
 * routed_expert_down_proj and up_proj (Kimi K3: in = lat_down e->xn, queued here; acc = e->lat_out). */
int64_t ms_moe_io(ms_engine *e, const ms_layer *L, int n, float *out, const float **in, float **acc) {
    const ms_config *c = &e->m->cfg;
    *in = e->xn;
    *acc = out;
    if (!c->latent_moe) return c->hidden;
    e->be->ops->matmul(e->be, e->lat_in, e->xn, n, &L->lat_down, 0);
    *in = e->lat_in;
    *acc = e->lat_out;
    return c->expert_hidden;
}

/* Latent MoE (ms_moe_io's latent rows): the experts' sum acc [n, expert_hidden] through its norm
 * (latent_moe_norm; in place) and up projection into out [n, hidden]. Nothing otherwise. */
void ms_moe_latent_up(ms_engine *e, const ms_layer *L, int n, float *acc, float *out) {
    const ms_config *c = &e->m->cfg;
    if (!c->latent_moe) return;
    if (c->latent_moe_norm) e->be->ops->rmsnorm(e->be, acc, acc, L->lat_norm, n, c->expert_hidden, (float)c->rms_eps);
    e->be->ops->matmul(e->be, out, acc, n, &L->lat_up, 0);
}

int ms_ffn_moe(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    if (ms_hybrid_layer(e, layer)) return ms_hybrid_ffn_moe(e, layer, n, out, err); /* experts on the CPU */
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->w->layers[layer];
    ms_backend *be = e->be;
    int E = (int)c->n_experts, K = (int)c->top_k;
    const float *in;
    float *acc;
    int64_t D = ms_moe_io(e, L, n, out, &in, &acc);
    ms_glu act = ms_moe_glu(c, c->expert_act);
    int rc, routed = 0;
    /* decode with resident experts on a backend that routes on the device: no host round trip */
    if (n == 1 && be->ops->moe_experts_routed && e->experts == e->own_experts && !L->hash_ids && L->experts &&
        !e->no_routed && !c->n_zero_experts && !(e->staged && e->stages->expert_home)) { /* split experts: the lists dispatch them */
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
    /* decode with streamed experts on the device: the fused routed kernels over the acquired slots */
    if (!routed && n == 1 && be->ops->moe_experts_routed && !e->no_routed_stream && ms_is_device_experts(e->experts) &&
        !ms_device_experts_lists(e->experts) && e->experts->max_acquire >= K && K <= 32 && !L->hash_ids &&
        !c->n_zero_experts && !e->choice_fn && !e->staged) {
        if ((rc = moe_stream_routed(e, layer, in, acc, D, &act, err))) return rc;
        routed = 1;
    }
    if (!routed && (rc = moe_lists(e, layer, n, in, acc, D, &act, err))) return rc;
    ms_moe_latent_up(e, L, n, acc, out);
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

static const ms_expert_source_ops k_resident_ops = {resident_acquire, NULL, NULL, resident_destroy, NULL};

int ms_resident_experts_create(ms_model *m, ms_expert_source **out, ms_err *err) {
    resident_source *r = calloc(1, sizeof *r);
    if (!r) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    r->base.ops = &k_resident_ops;
    r->m = m;
    *out = &r->base;
    return MS_OK;
}
