/* verify_choices.c — the discrete choices of verify's teacher-forced forwards, recorded and
 * compared (contract in verify_choices.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "cli/verify_choices.h"

void ms_vc_init(ms_vc_log *g, const ms_model *m, double rel, int margins) {
    *g = (ms_vc_log){.m = m, .rel = rel, .margins = margins};
}

void ms_vc_free(ms_vc_log *g) {
    free(g->r), free(g->ids), free(g->scratch), free(g->from_ix);
    *g = (ms_vc_log){0};
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* 1 when the router of layer `layer` picks another set from logits l than the sorted set want[k]. */
static int route_differs(const ms_vc_log *g, int layer, const float *l, const int32_t *want, int k) {
    const ms_config *c = &g->m->cfg;
    const int64_t W = ms_router_width(c), K = c->top_k;
    float *scr = g->scratch + W, *w = g->scratch + 3 * W;
    int *ids = (int *)(g->scratch + 3 * W + K);
    ms_route_args a = {.c = c, .logits = l, .bias = g->m->layers[layer].router_bias, .n = 1, .ids = ids, .w = w};
    ms_route_host(&a, scr);
    int32_t s[K > 0 ? K : 1];
    for (int64_t i = 0; i < K; i++) s[i] = ids[i];
    qsort(s, (size_t)K, sizeof *s, cmp_i32);
    return K != k || memcmp(s, want, (size_t)k * sizeof *s) != 0;
}

/* The router margin of one choice (verify_choices.h), its chosen set sorted in want[k]. */
static double expert_margin(const ms_vc_log *g, const ms_choice *c, const int32_t *want, int k) {
    const int64_t W = c->n_scores;
    float *l = g->scratch;
    double scale = 0;
    for (int64_t i = 0; i < W; i++) scale = fmax(scale, fabs(c->scores[i]));
    if (!(scale > 0)) scale = 1;
    /* the scores shifted by b: chosen down b/2, the others up b/2 */
#define SHIFTED(b)                                                                                          \
    do {                                                                                                    \
        for (int64_t i = 0; i < W; i++) {                                                                   \
            const int in = bsearch(&(int32_t){(int32_t)i}, want, (size_t)k, sizeof *want, cmp_i32) != NULL; \
            l[i] = (float)(c->scores[i] + (in ? -0.5 : 0.5) * (b));                                         \
        }                                                                                                   \
    } while (0)
    double lo = 0, hi = 1e-6 * scale;
    for (;; hi *= 2) { /* the smallest power-of-two multiple that changes it, else no margin */
        if (hi > 1e6 * scale) return INFINITY;
        SHIFTED(hi);
        if (route_differs(g, c->layer, l, want, k)) break;
        lo = hi;
    }
    for (int it = 0; it < 40; it++) {
        double mid = 0.5 * (lo + hi);
        SHIFTED(mid);
        if (route_differs(g, c->layer, l, want, k)) hi = mid;
        else lo = mid;
    }
#undef SHIFTED
    return hi;
}

static const ms_vc_rec *forced_choice(const ms_vc_log *g, const ms_vc_rec *k);

int ms_vc_observe(void *ctx, const ms_choice *c, int32_t *force) {
    ms_vc_log *g = ctx;
    if (g->oom) return 0;
    if (g->n == g->cap) {
        int64_t cap = g->cap ? 2 * g->cap : 256;
        ms_vc_rec *r = realloc(g->r, (size_t)cap * sizeof *r);
        if (!r) goto oom;
        g->r = r, g->cap = cap;
    }
    if (g->n_ids + c->n_chosen > g->cap_ids) {
        int64_t cap = g->cap_ids ? 2 * g->cap_ids : 4096;
        while (cap < g->n_ids + c->n_chosen) cap *= 2;
        int32_t *ids = realloc(g->ids, (size_t)cap * sizeof *ids);
        if (!ids) goto oom;
        g->ids = ids, g->cap_ids = cap;
    }
    int32_t *set = g->ids + g->n_ids;
    memcpy(set, c->chosen, (size_t)c->n_chosen * sizeof *set);
    qsort(set, (size_t)c->n_chosen, sizeof *set, cmp_i32);
    ms_vc_rec r = {.fwd = g->fwd, .kind = c->kind, .layer = c->layer, .pos = c->pos, .off = g->n_ids, .n = c->n_chosen};
    if (g->margins) {
        double ss = 0;
        const float *lb = c->kind == MS_CHOICE_EXPERTS ? g->m->layers[c->layer].router_lbias : NULL;
        for (int i = 0; i < c->n_scores; i++) {
            double v = (double)c->scores[i] - (lb && i < g->m->cfg.n_experts ? lb[i] : 0);
            ss += v * v;
        }
        const double rms = c->n_scores ? sqrt(ss / c->n_scores) : 0;
        if (c->kind == MS_CHOICE_EXPERTS) {
            const int64_t W = c->n_scores, K = g->m->cfg.top_k;
            if (!g->scratch && !(g->scratch = malloc((size_t)(3 * W + 2 * K) * sizeof(float)))) goto oom;
            r.margin = expert_margin(g, c, set, c->n_chosen);
            r.bound = 4 * g->rel * rms;
        } else {
            double lo = INFINITY, hi = -INFINITY;
            for (int i = 0; i < c->n_scores; i++) {
                const int in = bsearch(&(int32_t){i}, set, (size_t)c->n_chosen, sizeof *set, cmp_i32) != NULL;
                if (in) lo = fmin(lo, c->scores[i]);
                else hi = fmax(hi, c->scores[i]);
            }
            r.margin = lo - hi;
            r.bound = 4 * sqrt(g->m->cfg.dsa_kpool > 1 ? 4.0 : 3.0) * g->rel * rms;
        }
    }
    g->n_ids += c->n_chosen;
    g->r[g->n++] = r;
    const ms_vc_rec *f = g->from ? forced_choice(g, &r) : NULL;
    if (f && f->n == r.n && memcmp(g->from->ids + f->off, set, (size_t)r.n * sizeof *set)) {
        memcpy(force, g->from->ids + f->off, (size_t)r.n * sizeof *force); /* sorted: ascending candidates */
        g->forced++;
        return 1;
    }
    return 0;
oom:
    g->oom = 1;
    return 0;
}

/* record order: (kind, layer, pos), then the forward, then the record's place in the log */
typedef struct {
    const ms_vc_rec *r;
    int64_t i;
} vc_ix;

static int site_cmp(const ms_vc_rec *a, const ms_vc_rec *b) {
    if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
    if (a->layer != b->layer) return a->layer < b->layer ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

static int ix_cmp(const void *x, const void *y) {
    const vc_ix *a = x, *b = y;
    int k = site_cmp(a->r, b->r);
    if (k) return k;
    if (a->r->fwd != b->r->fwd) return a->r->fwd < b->r->fwd ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

static vc_ix *sorted_log(const ms_vc_log *g) {
    vc_ix *x = malloc((size_t)(g->n > 0 ? g->n : 1) * sizeof *x);
    if (!x) return NULL;
    for (int64_t i = 0; i < g->n; i++) x[i] = (vc_ix){&g->r[i], i};
    qsort(x, (size_t)g->n, sizeof *x, ix_cmp);
    return x;
}

/* The record of x[n] (sorted_log) in effect at forward fwd for the site of k: the last one of the
 * same (kind, layer, pos) made at a forward <= fwd; NULL if none. */
static const ms_vc_rec *in_effect(const vc_ix *x, int64_t n, const ms_vc_rec *k, int fwd) {
    int64_t lo = 0, hi = n; /* the first entry after (site, fwd, any place) */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        int c = site_cmp(x[mid].r, k);
        if (c < 0 || (c == 0 && x[mid].r->fwd <= fwd)) lo = mid + 1;
        else hi = mid;
    }
    return lo > 0 && !site_cmp(x[lo - 1].r, k) ? x[lo - 1].r : NULL;
}

/* causal order: the forward, then the layer, a layer's DSA selection before its experts */
static int causal_cmp(const void *x, const void *y) {
    const ms_vc_rec *a = &((const ms_vc_flip *)x)->ref, *b = &((const ms_vc_flip *)y)->ref;
    if (a->fwd != b->fwd) return a->fwd < b->fwd ? -1 : 1;
    if (a->layer != b->layer) return a->layer < b->layer ? -1 : 1;
    int ka = a->kind == MS_CHOICE_DSA ? 0 : 1, kb = b->kind == MS_CHOICE_DSA ? 0 : 1;
    if (ka != kb) return ka - kb;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

int ms_vc_force_from(ms_vc_log *g, const ms_vc_log *ref) {
    free(g->from_ix);
    g->from = NULL;
    if (!(g->from_ix = sorted_log(ref))) return -1;
    g->from = ref;
    return 0;
}

static const ms_vc_rec *forced_choice(const ms_vc_log *g, const ms_vc_rec *k) {
    return in_effect((const vc_ix *)g->from_ix, g->from->n, k, k->fwd);
}

int ms_vc_compare(const ms_vc_log *ref, const ms_vc_log *got, ms_vc_flip **flips, int *n_flips, int *unmatched,
                  int64_t *compared) {
    vc_ix *a = sorted_log(ref), *b = sorted_log(got);
    ms_vc_flip *f = malloc((size_t)(ref->n + got->n > 0 ? ref->n + got->n : 1) * sizeof *f);
    *flips = NULL, *n_flips = 0, *unmatched = 0, *compared = 0;
    if (!a || !b || !f) {
        free(a), free(b), free(f);
        return -1;
    }
    int nf = 0;
    /* every (site, forward) either log chose at, once: the two choices in effect there */
    for (int side = 0; side < 2; side++) {
        const vc_ix *x = side ? b : a;
        const int64_t nx = side ? got->n : ref->n;
        for (int64_t i = 0; i < nx; i++) {
            const ms_vc_rec *k = x[i].r;
            if (i + 1 < nx && !site_cmp(x[i + 1].r, k) && x[i + 1].r->fwd == k->fwd) continue; /* the last of its forward */
            const ms_vc_rec *ra = in_effect(a, ref->n, k, k->fwd), *rb = in_effect(b, got->n, k, k->fwd);
            if (side && ra && ra->fwd == k->fwd) continue; /* seen from ref's side */
            if (!ra || !rb) {
                (*unmatched)++;
                continue;
            }
            (*compared)++;
            if (ra->n != rb->n || memcmp(ref->ids + ra->off, got->ids + rb->off, (size_t)ra->n * sizeof(int32_t))) {
                f[nf] = (ms_vc_flip){*ra, 0};
                f[nf++].ref.fwd = k->fwd;
            }
        }
    }
    qsort(f, (size_t)nf, sizeof *f, causal_cmp);
    for (int i = 0; i < nf; i++)
        f[i].first = f[i].ref.fwd == f[0].ref.fwd && f[i].ref.layer == f[0].ref.layer && f[i].ref.kind == f[0].ref.kind;
    free(a), free(b);
    *flips = f, *n_flips = nf;
    return 0;
}

int ms_vc_judge(const ms_vc_flip *f, int n, int unmatched) {
    int bad = unmatched > 0;
    for (int i = 0; i < n; i++)
        if (!(f[i].ref.margin <= f[i].ref.bound)) bad = 1;
    return bad;
}
