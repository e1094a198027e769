/* placement.c — layers and routed experts over several devices, and the per-device
 * ledger (engine/placement.h). */
#include "engine/placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan.h"

static double mib(uint64_t b) { return (double)b / 1048576.0; }

/* Bytes a stage of layers [i, j) adds to its device. */
static uint64_t seg_bytes(const uint64_t *prefix, int i, int j) { return prefix[j] - prefix[i]; }

/* A device's load as the split minimizes it: total / budget, or total when no budget is known. */
static double load_of(uint64_t total, uint64_t budget) { return budget ? (double)total / (double)budget : (double)total; }

void ms_placement_free(ms_placement *p) {
    if (!p) return;
    free(p->layer_dev), free(p->expert_home), free(p->expert_devs);
    memset(p, 0, sizeof *p);
}

/* The experts' homes and replicas (SHARDED), or each layer's experts on its device (WITH_LAYER,
 * after the split); fills the ledger's expert lines. */
static void place_experts(const ms_place_input *in, ms_placement *p, int with_layer) {
    int L = in->n_layers, E = in->n_experts, N = p->n_dev;
    for (int d = 0; d < N; d++) p->dev[d].expert_bytes = 0, p->dev[d].n_experts_home = p->dev[d].n_replicas = 0;
    int *order = E > 0 ? malloc((size_t)E * sizeof *order) : NULL;
    for (int l = 0; l < L; l++) {
        uint64_t xb = in->expert_bytes ? in->expert_bytes[l] : 0;
        for (int e = 0; e < E; e++) {
            int64_t k = (int64_t)l * E + e;
            if (!xb) { p->expert_home[k] = -1, p->expert_devs[k] = 0; continue; }
            int h = with_layer ? p->layer_dev[l] : (int)(((int64_t)e + (int64_t)l * E) % N);
            p->expert_home[k] = h;
            p->expert_devs[k] = 1u << h;
        }
        if (!xb || with_layer || in->replicate_hot <= 0 || N == 1 || !order) continue;
        /* the replicate_hot hottest of the layer (selection by heat, then lower id) on every device */
        for (int e = 0; e < E; e++) order[e] = e;
        const double *hl = in->heat ? in->heat + (int64_t)l * E : NULL;
        for (int r = 0; r < in->replicate_hot; r++) {
            int best = r;
            for (int j = r + 1; j < E; j++) {
                double hb = hl ? hl[order[best]] : 0, hj = hl ? hl[order[j]] : 0;
                if (hj > hb || (hj == hb && order[j] < order[best])) best = j;
            }
            int t = order[r]; order[r] = order[best]; order[best] = t;
            p->expert_devs[(int64_t)l * E + order[r]] = (N >= 32 ? 0xffffffffu : (1u << N) - 1);
        }
    }
    free(order);
    for (int l = 0; l < L; l++) {
        uint64_t xb = in->expert_bytes ? in->expert_bytes[l] : 0;
        for (int e = 0; xb && e < E; e++) {
            int64_t k = (int64_t)l * E + e;
            for (int d = 0; d < N; d++) {
                if (!(p->expert_devs[k] & (1u << d))) continue;
                p->dev[d].expert_bytes += xb;
                if (d == p->expert_home[k]) p->dev[d].n_experts_home++;
                else p->dev[d].n_replicas++;
            }
        }
    }
}

int ms_placement_make(const ms_place_input *in, int n_dev, const uint64_t *budgets, ms_placement *p, ms_err *err) {
    memset(p, 0, sizeof *p);
    int L = in->n_layers, E = in->n_experts, N = n_dev;
    if (N < 1 || N > MS_MAX_DEVICES) return ms_fail(err, MS_ERR_ARG, "placement: %d devices (1..%d)", N, MS_MAX_DEVICES);
    if (L < 1 || !in->layer_static) return ms_fail(err, MS_ERR_ARG, "placement: the model has no layers");
    if (E < 0 || in->replicate_hot < 0 || (E > 0 && in->replicate_hot > E))
        return ms_fail(err, MS_ERR_ARG, "placement: replicating the %d hottest of %d experts per layer",
                       in->replicate_hot, E);
    p->n_dev = N, p->n_layers = L, p->n_experts = E;
    size_t LE = (size_t)L * (size_t)(E > 0 ? E : 1);
    p->layer_dev = calloc((size_t)L, sizeof *p->layer_dev);
    p->expert_home = calloc(LE, sizeof *p->expert_home);
    p->expert_devs = calloc(LE, sizeof *p->expert_devs);
    uint64_t *prefix = calloc((size_t)L + 1, sizeof *prefix);
    double *f = malloc((size_t)(N + 1) * (size_t)(L + 1) * sizeof *f);
    int *cut = malloc((size_t)(N + 1) * (size_t)(L + 1) * sizeof *cut);
    if (!p->layer_dev || !p->expert_home || !p->expert_devs || !prefix || !f || !cut) {
        free(prefix), free(f), free(cut);
        ms_placement_free(p);
        return ms_fail(err, MS_ERR_NOMEM, "placement: out of memory");
    }
    int with_layer = in->split == MS_EXPERTS_WITH_LAYER;
    for (int d = 0; d < N; d++) p->dev[d].budget = budgets ? budgets[d] : 0;
    if (!with_layer) place_experts(in, p, 0);
    /* a layer's bytes on its stage's device: static weights, causal state, and (WITH_LAYER) its experts */
    for (int l = 0; l < L; l++) {
        uint64_t b = in->layer_static[l] + (in->layer_state ? in->layer_state[l] : 0);
        if (with_layer && in->expert_bytes) b += in->expert_bytes[l] * (uint64_t)E;
        prefix[l + 1] = prefix[l] + b;
    }
    /* what each device holds whatever its layers: workspace, allowance, experts (SHARDED),
     * the embedding (device 0), the head (the last device; a tied head a copy when N > 1) */
    uint64_t fixed[MS_MAX_DEVICES];
    for (int d = 0; d < N; d++) {
        fixed[d] = in->workspace_bytes + in->overhead_bytes + (with_layer ? 0 : p->dev[d].expert_bytes);
        if (d == 0) fixed[d] += in->embed_bytes + in->state0_bytes;
        if (d == N - 1 && !(in->head_tied && N == 1)) fixed[d] += in->head_bytes;
    }
    /* contiguous stages, device order, minimizing the largest load: f[d][j] = the best largest
     * load of devices 0..d-1 holding layers [0, j). Stages are non-empty when there are at least
     * as many layers as devices. */
    int need = L >= N;
#define F(d, j) f[(size_t)(d) * (size_t)(L + 1) + (size_t)(j)]
#define C(d, j) cut[(size_t)(d) * (size_t)(L + 1) + (size_t)(j)]
    for (int j = 0; j <= L; j++) F(0, j) = j == 0 ? 0.0 : -1.0;
    for (int d = 1; d <= N; d++) {
        for (int j = 0; j <= L; j++) {
            F(d, j) = -1.0, C(d, j) = -1;
            for (int i = 0; i <= j; i++) {
                if (F(d - 1, i) < 0 || (need && i == j)) continue;
                double c = load_of(fixed[d - 1] + seg_bytes(prefix, i, j), p->dev[d - 1].budget);
                double v = F(d - 1, i) > c ? F(d - 1, i) : c;
                if (F(d, j) < 0 || v < F(d, j)) F(d, j) = v, C(d, j) = i;
            }
        }
    }
    for (int d = N, j = L; d >= 1; d--) {
        int i = C(d, j);
        p->dev[d - 1].layer_begin = i, p->dev[d - 1].layer_end = j;
        for (int l = i; l < j; l++) p->layer_dev[l] = d - 1;
        j = i;
    }
#undef F
#undef C
    free(f), free(cut);
    if (with_layer) place_experts(in, p, 1);
    for (int d = 0; d < N; d++) {
        ms_dev_ledger *g = &p->dev[d];
        g->static_bytes = g->state_bytes = 0;
        for (int l = g->layer_begin; l < g->layer_end; l++) {
            g->static_bytes += in->layer_static[l];
            g->state_bytes += in->layer_state ? in->layer_state[l] : 0;
        }
        if (d == 0) g->static_bytes += in->embed_bytes, g->state_bytes += in->state0_bytes;
        if (d == N - 1 && !(in->head_tied && N == 1)) g->static_bytes += in->head_bytes;
        g->workspace_bytes = in->workspace_bytes;
        g->overhead_bytes = in->overhead_bytes;
        g->total = g->static_bytes + g->expert_bytes + g->state_bytes + g->workspace_bytes + g->overhead_bytes;
        p->total += g->total;
    }
    free(prefix);
    return MS_OK;
}

static const char *dev_name(const char *const *names, int d, char *buf, size_t cap) {
    if (names && names[d]) return names[d];
    snprintf(buf, cap, "device %d", d);
    return buf;
}

void ms_placement_format(const ms_placement *p, const char *const *names, char *buf, size_t cap) {
    size_t o = 0;
    if (cap) buf[0] = 0;
    for (int d = 0; d < p->n_dev && o < cap; d++) {
        const ms_dev_ledger *g = &p->dev[d];
        char nb[32], bb[48];
        if (g->budget) snprintf(bb, sizeof bb, " of %.1f MiB", mib(g->budget));
        else bb[0] = 0;
        char lb[32];
        if (g->layer_end > g->layer_begin) snprintf(lb, sizeof lb, "layers %d..%d", g->layer_begin, g->layer_end - 1);
        else snprintf(lb, sizeof lb, "no layers");
        int k = snprintf(buf + o, cap - o,
                         "%-10s %s: static %.1f, experts %.1f (%d home, %d replicas), state %.1f, "
                         "workspace %.1f, overhead %.1f = %.1f MiB%s\n",
                         dev_name(names, d, nb, sizeof nb), lb, mib(g->static_bytes),
                         mib(g->expert_bytes), g->n_experts_home, g->n_replicas, mib(g->state_bytes),
                         mib(g->workspace_bytes), mib(g->overhead_bytes), mib(g->total), bb);
        if (k < 0) break;
        o += (size_t)k;
    }
}

void ms_placement_json(const ms_placement *p, char *buf, size_t cap) {
    size_t o = 0;
    if (!cap) return;
    buf[0] = 0;
    o += (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < p->n_dev && o < cap; d++) {
        const ms_dev_ledger *g = &p->dev[d];
        int k = snprintf(buf + o, cap - o,
                         "%s{\"device\":%d,\"layer_begin\":%d,\"layer_end\":%d,\"static_bytes\":%llu,"
                         "\"expert_bytes\":%llu,\"experts_home\":%d,\"expert_replicas\":%d,\"state_bytes\":%llu,"
                         "\"workspace_bytes\":%llu,\"overhead_bytes\":%llu,\"total_bytes\":%llu,\"budget_bytes\":%llu}",
                         d ? "," : "", d, g->layer_begin, g->layer_end, (unsigned long long)g->static_bytes,
                         (unsigned long long)g->expert_bytes, g->n_experts_home, g->n_replicas,
                         (unsigned long long)g->state_bytes, (unsigned long long)g->workspace_bytes,
                         (unsigned long long)g->overhead_bytes, (unsigned long long)g->total,
                         (unsigned long long)g->budget);
        if (k < 0) break;
        o += (size_t)k;
    }
    if (o + 2 <= cap) buf[o] = ']', buf[o + 1] = 0;
}

int ms_placement_check(const ms_placement *p, const char *const *names, ms_err *err) {
    int bad = -1;
    uint64_t sum_budget = 0;
    int known = 1;
    for (int d = 0; d < p->n_dev; d++) {
        if (!p->dev[d].budget) known = 0;
        sum_budget += p->dev[d].budget;
        if (bad < 0 && p->dev[d].budget && p->dev[d].total > p->dev[d].budget) bad = d;
    }
    if (bad < 0) return MS_OK;
    char ledger[2048], nb[32], sum[160] = "";
    ms_placement_format(p, names, ledger, sizeof ledger);
    if (known && p->total > sum_budget)
        snprintf(sum, sizeof sum, "; all %d devices together need %.1f MiB of %.1f MiB (short by %.1f MiB)", p->n_dev,
                 mib(p->total), mib(sum_budget), mib(p->total - sum_budget));
    const ms_dev_ledger *g = &p->dev[bad];
    return ms_fail(err, MS_ERR_NOMEM, "the placement does not fit: %s needs %.1f MiB but has %.1f MiB (short by %.1f MiB)%s:\n%s",
                   dev_name(names, bad, nb, sizeof nb), mib(g->total), mib(g->budget), mib(g->total - g->budget), sum,
                   ledger);
}

int ms_parse_device_list(const char *s, int *ids, int cap, ms_err *err) {
    if (!s || !*s) return ms_fail(err, MS_ERR_ARG, "--gpus: empty device list");
    if (!strchr(s, ',')) { /* a count */
        char *end;
        long n = strtol(s, &end, 10);
        if (*end || n < 1 || n > cap)
            return ms_fail(err, MS_ERR_ARG, "--gpus \"%s\": expected a device count 1..%d or a list like 0,1", s, cap);
        for (int i = 0; i < n; i++) ids[i] = i;
        return (int)n;
    }
    int n = 0;
    const char *q = s;
    while (*q) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q || v < 0 || v > 1023 || (*end && *end != ','))
            return ms_fail(err, MS_ERR_ARG, "--gpus \"%s\": item %d is not a device id", s, n + 1);
        if (n == cap) return ms_fail(err, MS_ERR_ARG, "--gpus \"%s\": more than %d devices", s, cap);
        ids[n++] = (int)v;
        q = *end ? end + 1 : end;
        if (*end && !*q) return ms_fail(err, MS_ERR_ARG, "--gpus \"%s\": a trailing comma", s);
    }
    return n;
}

void ms_place_input_free(ms_place_input *in) {
    free((void *)in->layer_static), free((void *)in->layer_state), free((void *)in->expert_bytes);
    memset(in, 0, sizeof *in);
}

int ms_place_input_of(const ms_model *m, ms_backend *be, int context, int max_batch, int slots,
                      ms_expert_split split, int replicate_hot, ms_place_input *in, ms_err *err) {
    memset(in, 0, sizeof *in);
    const ms_config *c = &m->cfg;
    int L = c->n_layers;
    uint64_t *ls = calloc((size_t)(L > 0 ? L : 1), sizeof *ls), *st = calloc((size_t)(L > 0 ? L : 1), sizeof *st);
    uint64_t *xb = calloc((size_t)(L > 0 ? L : 1), sizeof *xb);
    if (!ls || !st || !xb) {
        free(ls), free(st), free(xb);
        return ms_fail(err, MS_ERR_NOMEM, "placement: out of memory");
    }
    ms_model_place_bytes(m, ls, xb, &in->embed_bytes, &in->head_bytes, &in->head_tied);
    uint64_t other = 0, workspace = 0;
    ms_engine_opts eo = {.max_ctx = context, .max_batch = max_batch, .backend = be};
    ms_engine_layer_state_bytes(m, &eo, st, &other, &workspace);
    int k = slots > 1 ? slots : 1;
    for (int l = 0; l < L; l++) st[l] *= (uint64_t)k;
    in->n_layers = L;
    in->n_experts = (int)c->n_experts;
    in->layer_static = ls, in->layer_state = st, in->expert_bytes = xb;
    in->state0_bytes = other * (uint64_t)k;
    in->workspace_bytes = workspace * (uint64_t)k;
    in->overhead_bytes = MS_PLAN_OVERHEAD;
    in->split = split;
    in->replicate_hot = replicate_hot;
    return MS_OK;
}

void ms_stages_of(const ms_placement *p, ms_backend *const *bes, struct ms_comm *comm, int expert_parallel,
                  int *begin, int *end, ms_stages *out) {
    for (int d = 0; d < p->n_dev; d++) begin[d] = p->dev[d].layer_begin, end[d] = p->dev[d].layer_end;
    *out = (ms_stages){.n = p->n_dev, .bes = bes, .comm = comm, .layer_begin = begin, .layer_end = end,
                       .expert_home = expert_parallel && p->n_experts > 0 ? p->expert_home : NULL,
                       .expert_devs = expert_parallel && p->n_experts > 0 ? p->expert_devs : NULL};
}
