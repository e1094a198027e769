/* be_cpu_moe.c — the CPU backend's router: every kind the config knows, per
 * token, as transformers computes it (contract in core/backend.h). */
#include <math.h>
#include <string.h>

#include "backend/cpu/be_cpu.h"

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

/* PhiMoE's sparsemixer at inference (top-2): per round, the best remaining logit m; the softmax over the
 * remaining logits s with (m - s) / max(|s|, m) <= 2 eps (float, as torch computes it) gives its weight.
 * fixed (or NULL): the two ids given (an observer's forced choice), weighed by the same rule. */
static void sparsemixer(const float *logits, int E, float eps, const int32_t *fixed, float *scratch, int *ids,
                        float *w) {
    float *masked = scratch;
    for (int round = 0; round < 2; round++) {
        int best = fixed ? fixed[round] : -1; /* fixed: the ids given, weighed by the same rule */
        for (int i = 0; i < E && !fixed; i++) {
            if (round && i == ids[0]) continue;
            if (best < 0 || logits[i] > logits[best]) best = i;
        }
        float m = logits[best];
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < E; i++) {
            float f = fabsf(logits[i]) > m ? fabsf(logits[i]) : m;
            int out = (round && i == ids[0]) || (m - logits[i]) / f > 2.0f * eps;
            masked[i] = out ? -INFINITY : logits[i];
            if (!out && masked[i] > mx) mx = masked[i];
        }
        for (int i = 0; i < E; i++)
            if (masked[i] != -INFINITY) sum += exp((double)masked[i] - mx);
        ids[round] = best;
        w[round] = (float)(exp((double)masked[best] - mx) / sum);
    }
}

/* ids[k]: fixed[k] when given, else the top k of v[n] */
static void pick(const float *v, int n, int k, int *ids, const int32_t *fixed) {
    if (fixed) for (int i = 0; i < k; i++) ids[i] = fixed[i];
    else topk(v, n, k, ids);
}

/* Route one token: logits [E] → ids[k], weights[k] (transformers' router math).
 * fixed: the token's ids given (a hash-routed layer's table row, or ids an observer forced),
 * only weighed as the router weighs its own choice; or NULL. */
static void route_one(const ms_config *c, const float *logits, const float *bias, const int32_t *fixed, float *scratch,
                      int *ids, float *w) {
    int E = (int)ms_router_width(c), K = (int)c->top_k;
    float *scores = scratch, *choice = scratch + E;
    if (c->router == MS_ROUTER_SQRTSOFTPLUS) { /* DeepSeek-V4: sqrt(softplus), always renormalized */
        for (int i = 0; i < E; i++) {
            float x = logits[i];
            scores[i] = sqrtf(x > 20.0f ? x : log1pf(expf(x)));
            choice[i] = scores[i] + (bias ? bias[i] : 0.0f);
        }
        pick(choice, E, K, ids, fixed);
        double sum = 0;
        for (int i = 0; i < K; i++) sum += (w[i] = scores[ids[i]]);
        for (int i = 0; i < K; i++) w[i] = (float)(w[i] / (sum + 1e-20)) * (float)c->routed_scale;
        return;
    }
    if (c->router == MS_ROUTER_SPARSEMIXER) { /* top-2 by construction (the config checks K == 2) */
        sparsemixer(logits, E, (float)c->router_jitter, fixed, scores, ids, w);
        return;
    }
    if (c->router == MS_ROUTER_SOFTMAX) {
        memcpy(scores, logits, (size_t)E * 4);
        ms_softmax(scores, E);
        pick(scores, E, K, ids, fixed);
    } else if (c->router == MS_ROUTER_SOFTMAX_BIAS) {
        memcpy(scores, logits, (size_t)E * 4);
        ms_softmax(scores, E);
        for (int i = 0; i < E; i++) choice[i] = scores[i] + (bias ? bias[i] : 0.0f);
        pick(choice, E, K, ids, fixed);
    } else if (c->router == MS_ROUTER_SOFTMAX_GROUP) { /* groups ranked by their best score (DeepSeek-V2) */
        memcpy(scores, logits, (size_t)E * 4);
        ms_softmax(scores, E);
        memcpy(choice, scores, (size_t)E * 4);
        int G = (int)c->n_group;
        if (G > 1) {
            int per = E / G, gid[4096];
            float gs[4096];
            unsigned char keep[4096] = {0};
            for (int g = 0; g < G; g++) {
                gs[g] = choice[g * per];
                for (int i = 1; i < per; i++) gs[g] = choice[g * per + i] > gs[g] ? choice[g * per + i] : gs[g];
            }
            topk(gs, G, (int)c->topk_group, gid);
            for (int i = 0; i < c->topk_group; i++) keep[gid[i]] = 1;
            for (int g = 0; g < G; g++)
                if (!keep[g])
                    for (int i = 0; i < per; i++) choice[g * per + i] = -INFINITY;
        }
        pick(choice, E, K, ids, fixed);
    } else if (c->router == MS_ROUTER_SOFTMAX_GROUP2) { /* groups ranked by their two best scores (Mistral 4) */
        memcpy(scores, logits, (size_t)E * 4);
        ms_softmax(scores, E);
        memcpy(choice, scores, (size_t)E * 4);
        int G = (int)c->n_group;
        if (G > 1 && !fixed) {
            int per = E / G, gid[4096];
            float gs[4096];
            unsigned char keep[4096] = {0};
            for (int g = 0; g < G; g++) {
                int t2[2];
                topk(choice + g * per, per, 2, t2);
                gs[g] = choice[g * per + t2[0]] + choice[g * per + t2[1]];
            }
            topk(gs, G, (int)c->topk_group, gid);
            for (int i = 0; i < c->topk_group; i++) keep[gid[i]] = 1;
            for (int g = 0; g < G; g++)
                if (!keep[g])
                    for (int i = 0; i < per; i++) choice[g * per + i] = -INFINITY;
        }
        pick(choice, E, K, ids, fixed);
    } else if (c->router == MS_ROUTER_TOPK_SOFTMAX) {
        pick(logits, E, K, ids, fixed);
        for (int i = 0; i < K; i++) w[i] = logits[ids[i]];
        ms_softmax(w, K);
        return;
    } else {
        for (int i = 0; i < E; i++) {
            scores[i] = ms_sigmoid(logits[i]);
            choice[i] = scores[i] + (bias ? bias[i] : 0.0f);
        }
        int G = (int)c->n_group;
        if (G > 1 && !fixed) {
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
        pick(choice, E, K, ids, fixed);
    }
    double sum = 0;
    for (int i = 0; i < K; i++) {
        w[i] = scores[ids[i]];
        sum += w[i];
    }
    if (c->norm_topk_prob) {
        float den = (float)(sum + (c->router == MS_ROUTER_SIGMOID || c->router == MS_ROUTER_SOFTMAX_GROUP2 ? 1e-20 : 0.0));
        for (int i = 0; i < K; i++) w[i] /= den;
    }
    for (int i = 0; i < K; i++) w[i] *= (float)c->routed_scale;
}

void ms_route_host(const ms_route_args *a, float *scratch) {
    const ms_config *c = a->c;
    int64_t E = ms_router_width(c), K = c->top_k;
    for (int t = 0; t < a->n; t++)
        route_one(c, a->logits + t * E, a->bias, a->fixed ? a->fixed + t * K : NULL, scratch, a->ids + t * K,
                  a->w + t * K);
}

void ms_cpu_route(ms_backend *be, const ms_route_args *a) {
    ms_route_host(a, cpu_thread_buf(cpu_of(be), 0)); /* 2E floats */
}
