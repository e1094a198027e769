/* device_experts.c — the device expert source (contract in device_experts.h). */
#include "engine/device_experts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/plan.h"
#include "engine/streaming.h"
#include "io/prefetch_gate.h"

#define N_ROLES 12 /* the 9 of every expert, then the INT4 zero points (absent: skipped) */
#define ROLE_ALIGN 256 /* as the GPU backend's placed weights */
#define ROLE_PAD 16    /* slack past each role (vector loads), as place_qmat allocates */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mat_bytes(const ms_qmat *q) {
    return ((uint64_t)q->rows * (uint64_t)q->cols * (uint64_t)ms_dtype_bits(q->dtype) + 7) / 8;
}
static uint64_t scale_bytes(const ms_qmat *q) {
    if (!q->scale || q->brow < 1 || q->bcol < 1) return 0;
    uint64_t r = (uint64_t)((q->rows + q->brow - 1) / q->brow), c = (uint64_t)((q->cols + q->bcol - 1) / q->bcol);
    return (r * c * (uint64_t)ms_dtype_bits(q->scale_dtype) + 7) / 8;
}

/* Bytes of an I4 view's packed zero points (core/qmat.h), 0 without. */
static uint64_t zero_bytes(const ms_qmat *q) {
    if (q->dtype != MS_DT_I4 || !q->zero || q->bcol < 1) return 0;
    return (uint64_t)((q->rows + 7) / 8) * (uint64_t)((q->cols + q->bcol - 1) / q->bcol) * 4;
}

/* Role r of v (gate, gate scale, up, up scale, down, down scale, the three biases, the gate /
 * up / down INT4 zero points): the pointer's address in v and its bytes. */
static const void **role_ref(ms_expert_view *v, int r, uint64_t *len) {
    if (r >= 9) {
        ms_qmat *z = r == 9 ? &v->gate : r == 10 ? &v->up : &v->down;
        *len = zero_bytes(z);
        return &z->zero;
    }
    ms_qmat *q = r < 2 ? &v->gate : r < 4 ? &v->up : &v->down;
    switch (r) {
    case 0: case 2: case 4: *len = q->data ? mat_bytes(q) : 0; return &q->data;
    case 1: case 3: case 5: *len = scale_bytes(q); return &q->scale;
    case 6: *len = (uint64_t)v->gate.rows * ms_dtype_bits(v->bias_dtype) / 8; return &v->gate_bias;
    case 7: *len = (uint64_t)v->up.rows * ms_dtype_bits(v->bias_dtype) / 8; return &v->up_bias;
    default: *len = (uint64_t)v->down.rows * ms_dtype_bits(v->bias_dtype) / 8; return &v->down_bias;
    }
}

static uint64_t role_span(uint64_t len) { return (len + ROLE_PAD + ROLE_ALIGN - 1) / ROLE_ALIGN * ROLE_ALIGN; }

static uint64_t view_bytes(const ms_expert_view *v0) {
    ms_expert_view v = *v0;
    uint64_t t = 0, len;
    for (int r = 0; r < N_ROLES; r++) {
        const void **p = role_ref(&v, r, &len);
        if (*p && len) t += role_span(len);
    }
    return t;
}

uint64_t ms_device_expert_slot_bytes(const ms_model *m) {
    uint64_t best = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int64_t e = 0; m->layers[l].experts && e < m->cfg.n_experts; e++) {
            uint64_t b = view_bytes(&m->layers[l].experts[e]);
            if (b > best) best = b;
        }
    return best;
}

typedef struct pin_rec { int layer, slot; } pin_rec;

typedef struct dev_src {
    ms_expert_source base;
    ms_model *m;
    ms_backend *be;
    ms_expert_source *inner;
    ms_ecache c;
    uint8_t *arena; /* backend memory: n_slots x slot_bytes */
    uint64_t slot_bytes;
    int n_slots;
    ms_expert_view *views; /* [n_slots] the device view of each READY slot */
    ms_expert_view *hviews; /* [n_slots] host views of one inner acquire */
    int *ids, *slots;       /* [n_slots] one acquire's misses */
    pin_rec *pins;
    int n_pins, cap_pins;
    void *pinned; /* the host cache page-locked through be (unregistered at destroy) */
    int prefetch_all, always_guess, lists;
    uint64_t chances; /* wants_prefetch calls while the gate was closed (measured) */
    ms_pf_gate gate; /* lookahead guesses judged, read time measured (io/prefetch_gate.h) */
    ms_device_experts_stats st;
} dev_src;

static int pin(dev_src *D, int layer, int slot, ms_err *err) {
    if (D->n_pins == D->cap_pins) {
        int nc = D->cap_pins ? 2 * D->cap_pins : 256;
        pin_rec *p = realloc(D->pins, (size_t)nc * sizeof *p);
        if (!p) return ms_fail(err, MS_ERR_NOMEM, "device expert cache: out of memory");
        D->pins = p;
        D->cap_pins = nc;
    }
    D->pins[D->n_pins++] = (pin_rec){layer, slot};
    D->c.slots[slot].pins++;
    return MS_OK;
}

int ms_device_expert_upload(ms_backend *be, const ms_expert_view *hv, void *slot, uint64_t slot_bytes,
                            ms_expert_view *dv, uint64_t *uploaded, ms_err *err) {
    *dv = *hv;
    uint8_t *base = slot;
    uint64_t off = 0, len;
    for (int r = 0; r < N_ROLES; r++) {
        const void **p = role_ref(dv, r, &len);
        if (!*p || !len) continue;
        if (off + role_span(len) > slot_bytes)
            return ms_fail(err, MS_ERR_SHAPE, "%llu bytes do not fit a device slot of %llu",
                           (unsigned long long)(off + role_span(len)), (unsigned long long)slot_bytes);
        int rc = be->ops->upload(be, base + off, *p, (size_t)len, err);
        if (rc) return rc;
        *p = base + off;
        off += role_span(len);
        if (uploaded) *uploaded += len;
    }
    return MS_OK;
}

/* Every role of host view hv into slot: the device view dv (hv with its pointers moved). */
static int upload_view(dev_src *D, int layer, int expert, int slot, const ms_expert_view *hv, ms_expert_view *dv,
                       ms_err *err) {
    int rc = ms_device_expert_upload(D->be, hv, D->arena + (uint64_t)slot * D->slot_bytes, D->slot_bytes, dv,
                                     &D->st.upload_bytes, err);
    if (rc) return ms_wrap(err, "layer %d expert %d: uploading into device slot %d", layer, expert, slot);
    D->st.uploads++;
    return MS_OK;
}

/* One expert of a fill landed in the host cache: its upload is queued at once (the
 * backend's stream copies it while the host waits for the next read). */
typedef struct fill_ctx {
    dev_src *D;
    int layer;
    const int *ids, *slots;
    double upload_s; /* host time queuing the uploads */
} fill_ctx;

static int on_ready(void *ctx, int i, const ms_expert_view *hv, ms_err *err) {
    fill_ctx *f = ctx;
    double t0 = now_s();
    int rc = upload_view(f->D, f->layer, f->ids[i], f->slots[i], hv, &f->D->views[f->slots[i]], err);
    f->upload_s += now_s() - t0;
    return rc;
}

/* Load the nm missed experts ids[] of layer into their assigned slots[]: host views from the
 * inner source in groups of its max_acquire, uploaded, fenced, released. From a streaming
 * inner source each expert's upload is queued as its read lands (copies of one expert
 * overlap the reads of the next); from another source after the group's acquire. */
static int fill(dev_src *D, int layer, int nm, const int *ids, const int *slots, ms_err *err) {
    int group = D->inner->max_acquire > 0 ? D->inner->max_acquire : nm;
    int streamed = ms_is_streaming_source(D->inner);
    for (int g = 0; g < nm; g += group) {
        int k = nm - g < group ? nm - g : group;
        ms_stream_stats h0 = {0}, h1 = {0};
        if (streamed) ms_streaming_stats(D->inner, &h0);
        fill_ctx f = {.D = D, .layer = layer, .ids = ids + g, .slots = slots + g};
        double t0 = now_s();
        int rc = streamed ? ms_streaming_acquire_each(D->inner, layer, k, ids + g, D->hviews, on_ready, &f, err)
                          : ms_experts_acquire(D->inner, layer, k, ids + g, D->hviews, err);
        for (int j = 0; j < k && !rc && !streamed; j++)
            rc = on_ready(&f, j, &D->hviews[j], err);
        double t1 = now_s();
        D->st.inner_s += t1 - t0 - f.upload_s;
        if (rc) { /* uploads queued before the failure may still read the host slots */
            ms_err ignored = {0};
            D->be->ops->sync(D->be, &ignored);
            ms_experts_release(D->inner, layer);
            return rc;
        }
        if (streamed) { /* the drive time of one expert: this acquire's reads ran together */
            ms_streaming_stats(D->inner, &h1);
            uint64_t hm = h1.misses - h0.misses;
            if (hm) ms_pf_gate_read(&D->gate, (t1 - t0 - f.upload_s) / (double)hm);
        }
        /* the uploads may still read the host slots (page-locked memory): the inner source may
         * read other experts into them once released */
        rc = D->be->ops->sync(D->be, err);
        ms_experts_release(D->inner, layer);
        D->st.upload_s += f.upload_s + (now_s() - t1);
        if (rc) return rc;
        for (int j = 0; j < k; j++) D->c.slots[slots[g + j]].state = MS_SLOT_READY;
    }
    return MS_OK;
}

static int d_acquire(ms_expert_source *s, int layer, int n, const int *ids, ms_expert_view *views, ms_err *err) {
    dev_src *D = (dev_src *)s;
    const ms_config *c = &D->m->cfg;
    if (layer < 0 || layer >= c->n_layers || !D->m->layers[layer].experts)
        return ms_fail(err, MS_ERR_ARG, "acquire: layer %d has no routed experts", layer);
    if (n < 0 || n > D->n_slots)
        return ms_fail(err, MS_ERR_NOMEM,
                       "acquire: layer %d asks for %d experts at once but the device expert cache holds %d (acquire "
                       "in groups of at most %d)",
                       layer, n, D->n_slots, D->n_slots);
    int pins_before = D->n_pins, nm = 0, rc = MS_OK;
    int slot_of[n > 0 ? n : 1];
    ms_pf_gate_judge(&D->gate, layer, n, ids, now_s());
    ms_ecache_step(&D->c, layer);
    for (int i = 0; i < n && !rc; i++) {
        int e = ids[i], sl = -1;
        if (e < 0 || e >= c->n_experts) {
            rc = ms_fail(err, MS_ERR_ARG, "acquire: layer %d expert id %d out of range [0, %lld)", layer, e,
                         (long long)c->n_experts);
            break;
        }
        int r = ms_ecache_request(&D->c, layer, e, &sl);
        if (r < 0) {
            rc = ms_fail(err, MS_ERR_NOMEM,
                         "acquire: layer %d expert %d: all %d device expert slots are pinned (unreleased acquires)",
                         layer, e, D->n_slots);
            break;
        }
        if (r == 0) D->ids[nm] = e, D->slots[nm++] = sl;
        slot_of[i] = sl;
        rc = pin(D, layer, sl, err);
        if (rc && r == 0) ms_ecache_drop(&D->c, sl), nm--;
    }
    if (!rc && nm) rc = fill(D, layer, nm, D->ids, D->slots, err);
    if (rc) {
        for (int j = 0; j < nm; j++)
            if (D->c.slots[D->slots[j]].state == MS_SLOT_LOADING) ms_ecache_drop(&D->c, D->slots[j]);
        for (int i = pins_before; i < D->n_pins; i++) D->c.slots[D->pins[i].slot].pins--;
        D->n_pins = pins_before;
        return rc;
    }
    for (int i = 0; i < n; i++) views[i] = D->views[slot_of[i]];
    return MS_OK;
}

static void d_release(ms_expert_source *s, int layer) {
    dev_src *D = (dev_src *)s;
    int k = 0;
    for (int i = 0; i < D->n_pins; i++) {
        if (D->pins[i].layer == layer) D->c.slots[D->pins[i].slot].pins--;
        else D->pins[k++] = D->pins[i];
    }
    D->n_pins = k;
}

/* Lookahead: the host cache reads what the device does not hold, while this layer computes,
 * when the gate finds the guesses worth their drive time (device_experts.h). */
static void d_prefetch(ms_expert_source *s, int layer, int n, const int *ids) {
    dev_src *D = (dev_src *)s;
    if (layer < 0 || layer >= D->m->cfg.n_layers || !D->m->layers[layer].experts || n < 1) return;
    int want[n], k = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < D->m->cfg.n_experts && ms_ecache_lookup(&D->c, layer, ids[i]) < 0)
            want[k++] = ids[i];
    if (!k) return;
    int open = ms_pf_gate_guess(&D->gate, layer, k, want, now_s());
    if (open || D->prefetch_all) ms_experts_prefetch(D->inner, layer, k, want);
}

/* The lookahead's guess for layer is worth making: always while the gate forwards or is still
 * measuring (warming up), one chance in MS_DEVICE_GUESS_SAMPLE while it holds measured guesses back. */
static int d_wants_prefetch(ms_expert_source *s, int layer) {
    dev_src *D = (dev_src *)s;
    if (D->prefetch_all || D->always_guess) return 1;
    double need = 0;
    if (ms_pf_gate_open(&D->gate, &need) || need <= 0) return 1;
    return D->chances++ % MS_DEVICE_GUESS_SAMPLE == 0;
}

static void d_destroy(ms_expert_source *s) {
    dev_src *D = (dev_src *)s;
    if (!D) return;
    if (D->pinned && D->be->ops->host_unregister) D->be->ops->host_unregister(D->be, D->pinned);
    if (D->arena) D->be->ops->free(D->be, D->arena);
    ms_ecache_free(&D->c);
    free(D->views), free(D->hviews), free(D->ids), free(D->slots), free(D->pins);
    free(D);
}

static const ms_expert_source_ops k_dev_ops = {d_acquire, d_release, d_prefetch, d_destroy, d_wants_prefetch};

int ms_is_device_experts(const ms_expert_source *s) { return s && s->ops == &k_dev_ops; }

int ms_device_experts_lists(const ms_expert_source *s) { return ms_is_device_experts(s) && ((const dev_src *)s)->lists; }

ms_expert_source *ms_device_experts_inner(const ms_expert_source *s) { return ((const dev_src *)s)->inner; }

void ms_device_experts_stats_get(const ms_expert_source *s, ms_device_experts_stats *out) {
    const dev_src *D = (const dev_src *)s;
    *out = D->st;
    out->requests = D->c.st.requests;
    out->hits = D->c.st.hits;
    out->misses = D->c.st.misses;
    out->evictions = D->c.st.evictions;
    const ms_pf_gate *g = &D->gate;
    out->pf_guessed = g->guessed - (g->layer >= 0 ? (uint64_t)g->n : 0);
    out->pf_right = g->hits;
    out->pf_forwarded = D->prefetch_all ? g->forwarded + g->held : g->forwarded;
    out->pf_held = D->prefetch_all ? 0 : g->held;
    out->gate_gap_s = g->gap_s;
    out->gate_read_s = g->read_s;
    out->gate_precision = ms_pf_gate_precision(g);
    out->gate_open = D->prefetch_all || ms_pf_gate_open(g, &out->gate_need);
}

int ms_device_experts_default_budget(const ms_model *m, ms_backend *be, int max_ctx, uint64_t *budget, ms_err *err) {
    *budget = 0;
    if (!be->ops->mem_info)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "the %s backend does not report its free memory: give a device expert "
                       "budget (--device-expert-mib)", be->name);
    uint64_t fr = 0, tot = 0;
    int rc = be->ops->mem_info(be, &fr, &tot, err);
    if (rc) return rc;
    ms_plan p;
    ms_plan_opts po = {.context = max_ctx > 0 ? max_ctx : 4096, .threads = 1, .expert_cache_bytes = 0};
    if (po.context > m->cfg.max_pos) po.context = (int)m->cfg.max_pos;
    if ((rc = ms_plan_make(m, &po, &p, err))) return rc;
    uint64_t state = 0, ws = 0;
    ms_engine_opts eo = {.max_ctx = max_ctx, .backend = be};
    ms_engine_plan_bytes(m, &eo, 1, &state, &ws);
    uint64_t reserve = tot / 32 > (256ull << 20) ? tot / 32 : (256ull << 20);
    uint64_t need = p.static_bytes + state + ws + reserve;
    uint64_t b = fr > need ? fr - need : 0;
    uint64_t slot = ms_device_expert_slot_bytes(m), all = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) all += m->layers[l].experts ? slot * (uint64_t)m->cfg.n_experts : 0;
    *budget = b < all ? b : all;
    return MS_OK;
}

int ms_device_experts_create(ms_model *m, ms_backend *be, ms_expert_source *inner, const ms_device_experts_opts *o,
                             ms_expert_source **out, char *why, size_t why_cap, ms_err *err) {
    *out = NULL;
    if (why && why_cap) why[0] = 0;
    const ms_config *c = &m->cfg;
    if (!c->n_experts) return ms_fail(err, MS_ERR_ARG, "%s: the model has no routed experts to stream", m->ck.dir);
    uint64_t slot = ms_device_expert_slot_bytes(m);
    if (!slot) return ms_fail(err, MS_ERR_ARG, "%s: no routed expert is bound", m->ck.dir);
    uint64_t budget = o->budget_bytes;
    int rc;
    int64_t total = 0;
    for (int l = 0; l < c->n_layers; l++) total += m->layers[l].experts ? c->n_experts : 0;
    int64_t n = budget ? (int64_t)(budget / slot) : c->top_k;
    if (n < c->top_k)
        return ms_fail(err, MS_ERR_NOMEM,
                       "device expert budget of %.1f MiB holds %lld slot(s) of %.2f MiB, but one layer's top-%lld "
                       "needs %lld (at least %.1f MiB)",
                       budget / 1048576.0, (long long)n, slot / 1048576.0, (long long)c->top_k, (long long)c->top_k,
                       (double)slot * (double)c->top_k / 1048576.0);
    if (n > total) n = total > c->top_k ? total : c->top_k;
    if (n > (1 << 24)) n = 1 << 24;
    dev_src *D = calloc(1, sizeof *D);
    if (!D) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    D->base.ops = &k_dev_ops;
    D->base.max_acquire = (int)n;
    D->base.views_on = be;
    D->m = m, D->be = be, D->inner = inner;
    D->prefetch_all = o->prefetch_all;
    D->always_guess = o->always_guess;
    D->lists = o->lists;
    ms_pf_gate_init(&D->gate);
    D->gate.warm_open = o->gate_warm_open;
    D->n_slots = (int)n;
    D->slot_bytes = slot;
    D->views = calloc((size_t)n, sizeof *D->views);
    D->hviews = calloc((size_t)n, sizeof *D->hviews);
    D->ids = calloc((size_t)n, sizeof *D->ids);
    D->slots = calloc((size_t)n, sizeof *D->slots);
    rc = !D->views || !D->hviews || !D->ids || !D->slots ? ms_fail(err, MS_ERR_NOMEM, "out of memory") : MS_OK;
    if (!rc) rc = ms_ecache_init(&D->c, o->policy, (int)n, (int)c->n_layers, (int)c->n_experts, o->half_life, err);
    void *a = NULL;
    if (!rc && (rc = be->ops->alloc(be, (size_t)(slot * (uint64_t)n), &a, err)))
        ms_wrap(err, "allocating %lld device expert slots of %.2f MiB (%.1f MiB)", (long long)n, slot / 1048576.0,
                (double)slot * (double)n / 1048576.0);
    D->arena = a;
    char pin_note[160] = "host cache not page-locked";
    if (!rc && !o->no_pin && be->ops->host_register && ms_is_streaming_source(inner)) {
        void *hp = NULL;
        uint64_t hb = 0;
        ms_streaming_host_cache(inner, &hp, &hb);
        ms_err pe = {0};
        if (hp && hb && be->ops->host_register(be, hp, (size_t)hb, &pe) == MS_OK) {
            D->pinned = hp;
            D->st.pinned = 1;
            snprintf(pin_note, sizeof pin_note, "host cache %.1f MiB page-locked as staging", hb / 1048576.0);
        } else if (pe.msg[0]) {
            snprintf(pin_note, sizeof pin_note, "host cache not page-locked: %.120s", pe.msg);
        }
    }
    if (rc) {
        d_destroy(&D->base);
        return rc;
    }
    D->st.n_slots = D->n_slots;
    D->st.slot_bytes = slot;
    if (why && why_cap)
        snprintf(why, why_cap,
                 "device expert cache on %s: %d slots x %.2f MiB (%.1f MiB, %s; %lld experts in all), %s, lookahead %s",
                 be->name, D->n_slots, slot / 1048576.0, (double)slot * D->n_slots / 1048576.0,
                 ms_cache_policy_name(o->policy), (long long)total, pin_note,
                 o->prefetch_all ? "forwarded (no gate)" : "gated by its measured worth");
    if (why && why_cap && (o->gate_warm_open || o->always_guess || o->lists)) {
        size_t k = strlen(why);
        snprintf(why + k, why_cap - k, " (%s%s%s)", o->gate_warm_open ? " forwarded while warming up" : "",
                 o->always_guess ? " every guess made" : "", o->lists ? " decode over the expert lists" : "");
    }
    *out = &D->base;
    return MS_OK;
}
