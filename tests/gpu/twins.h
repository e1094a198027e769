/* twins.h — CPU twins for GPU ops whose CPU code is static inside the engine.
 *
 * engine/moe.c (route, topk) and engine/attention.c (gqa_head) keep
 * their math in static functions; the engine is not ours to reshape in this
 * change, so these are line-by-line transcriptions of those functions (same
 * operation order, same float/double choices, same ops.h primitives). Keep
 * them in step with the engine: a change there must be mirrored here. */
#ifndef MS_GPU_TWINS_H
#define MS_GPU_TWINS_H

#include <math.h>
#include <string.h>

#include "ops/ops.h"

/* engine/moe.c topk: indices of the k largest of v[0..n) (descending; ties: lower index first). */
static void twin_topk(const float *v, int n, int k, int *idx) {
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

/* engine/moe.c route (softmax, sigmoid group-limited, top-k softmax kinds). kind: 1 softmax,
 * 2 sigmoid, 3 top-k softmax. scratch: 2E floats. */
static void twin_route(int kind, int E, int K, int n_group, int topk_group, int norm_topk, float routed_scale,
                       const float *logits, const float *bias, float *scratch, int *ids, float *w) {
    float *scores = scratch, *choice = scratch + E;
    if (kind == 1) {
        memcpy(scores, logits, (size_t)E * 4);
        ms_softmax(scores, E);
        twin_topk(scores, E, K, ids);
    } else if (kind == 3) {
        twin_topk(logits, E, K, ids);
        for (int i = 0; i < K; i++) w[i] = logits[ids[i]];
        ms_softmax(w, K);
        return;
    } else {
        for (int i = 0; i < E; i++) {
            scores[i] = ms_sigmoid(logits[i]);
            choice[i] = scores[i] + (bias ? bias[i] : 0.0f);
        }
        int G = n_group;
        if (G > 1) {
            int per = E / G, gid[4096];
            float gs[4096];
            for (int g = 0; g < G; g++) {
                int t2[2];
                twin_topk(choice + g * per, per, 2, t2);
                gs[g] = choice[g * per + t2[0]] + choice[g * per + t2[1]];
            }
            twin_topk(gs, G, topk_group, gid);
            unsigned char keep[4096] = {0};
            for (int i = 0; i < topk_group; i++) keep[gid[i]] = 1;
            for (int g = 0; g < G; g++)
                if (!keep[g])
                    for (int i = 0; i < per; i++) choice[g * per + i] = -INFINITY;
        }
        twin_topk(choice, E, K, ids);
    }
    double sum = 0;
    for (int i = 0; i < K; i++) {
        w[i] = scores[ids[i]];
        sum += w[i];
    }
    if (norm_topk) {
        float den = (float)(sum + (kind == 2 ? 1e-20 : 0.0));
        for (int i = 0; i < K; i++) w[i] /= den;
    }
    for (int i = 0; i < K; i++) w[i] *= routed_scale;
}

/* The experts' activation, into g (u may be clamped): the engine's ms_swiglu_param (ops/act.c)
 * for gpt-oss's clamped variant (alpha, up offset 1); for SwiGLU with an optional limit, the
 * same clamps and then ms_swiglu_ref, the scalar twin of the ms_swiglu that ms_swiglu_param calls. */
static void twin_expert_act(int clamped, float lim, float alpha, float *g, float *u, int64_t n) {
    if (clamped) {
        ms_swiglu_param(g, u, n, lim, alpha, 1.0f);
        return;
    }
    if (lim > 0)
        for (int64_t i = 0; i < n; i++) {
            if (g[i] > lim) g[i] = lim;
            u[i] = u[i] > lim ? lim : u[i] < -lim ? -lim : u[i];
        }
    ms_swiglu_ref(g, g, u, n);
}

/* engine/attention.c gqa_head for one head h of token t at position p: q [H*hd] of
 * that token, caches rows of KV*hd / KV*vd, out [vd]. sc: scratch of p+1 floats. */
static void twin_gqa_head(int H, int KV, int hd, int vd, int window, float scale, const float *sinks, const float *K,
                          const float *V, const float *q_tok, int h, int64_t p, float *sc, float *o) {
    int64_t kvh = h / (H / KV), kd = (int64_t)KV * hd, vtot = (int64_t)KV * vd;
    int64_t s0 = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    const float *qv = q_tok + (int64_t)h * hd;
    float mx = sinks ? sinks[h] : -INFINITY;
    for (int64_t s = s0; s <= p; s++) {
        sc[s - s0] = ms_dot(qv, K + s * kd + kvh * hd, hd) * scale;
        if (sc[s - s0] > mx) mx = sc[s - s0];
    }
    int64_t n_keys = p - s0 + 1;
    double sum = sinks ? exp((double)sinks[h] - mx) : 0.0;
    for (int64_t s = 0; s < n_keys; s++) {
        sc[s] = expf(sc[s] - mx);
        sum += sc[s];
    }
    float inv = (float)(1.0 / sum);
    memset(o, 0, (size_t)vd * sizeof *o);
    for (int64_t s = s0; s <= p; s++) ms_axpy(o, sc[s - s0] * inv, V + s * vtot + kvh * vd, vd);
}

#endif
