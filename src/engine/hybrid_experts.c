/* hybrid_experts.c — routed experts of chosen MoE layers on the CPU while the rest of
 * the forward runs on a device backend (engine/hybrid_experts.h has the design). */
#include "engine/hybrid_experts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu.h"
/* backend_cpu.h and cpu.h share the include guard MS_BACKEND_CPU_H: both are needed here */
#undef MS_BACKEND_CPU_H
#include "backend/cpu/backend_cpu.h"
#include "engine/device_experts.h"
#include "engine/engine_internal.h"

/* The hybrid state of an engine (e->hyb). Host rows in and acc are page-locked through the
 * device backend when it can (host_register): their copies are DMA, not staged. */
struct ms_hybrid {
    uint8_t *cpu_layer;        /* [n_layers] */
    int n_cpu;
    ms_backend *cpu;           /* a CPU backend over the engine's pool: the experts' sums */
    ms_expert_source *host;    /* host views for the CPU layers */
    ms_expert_source *own_host;
    float *in, *acc;           /* [B, D] host: the experts' input rows, their weighted sum */
    size_t rows_bytes;         /* bytes of each of in / acc (page-rounded) */
    int in_reg, acc_reg;       /* registered with the device backend */
    float *xs, *ys, *g, *u;    /* the CPU moe_experts scratch: [B, D] x2, [B, 2 inter] x2 */
    float *gate;               /* [be] [B] the shared-expert gate logits (rlog is the lookahead's) */
    int64_t inter2;            /* floats per row of g / u */
    int composed;              /* ms_hybrid_opts.composed */
    ms_matmul_job *jobs;       /* [2 B] the one-row form's products */
    /* gpu_share (ms_hybrid_opts): a chunk's highest-id experts uploaded into device slots */
    double share;              /* fraction of a chunk's experts to the device; 0: none */
    int share_slots;
    uint64_t slot_bytes;
    uint8_t *dslots;           /* device [share_slots x slot_bytes] */
    float *dxs, *dys, *dg, *du, *dsum; /* device scratch of the device experts' ops; dsum: the CPU's sum */
    int *gids, *goff;          /* [share_slots (+1)] */
    ms_matmul_job *djobs;      /* [2 share_slots] the device's one-row form (experts_one_row on be) */
    ms_expert_view *gviews, *dviews; /* [share_slots] host views, their device copies */
    const void **reg;          /* [n_reg] page-locked spans of the mapping (host_unregister at free) */
    int n_reg;
    ms_hybrid_stats st;
};

/* Monotonic seconds. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int ms_experts_on_parse(const char *s, ms_experts_on *out, ms_err *err) {
    if (!strcmp(s, "gpu")) *out = MS_EXPERTS_ON_GPU;
    else if (!strcmp(s, "cpu")) *out = MS_EXPERTS_ON_CPU;
    else if (!strcmp(s, "auto")) *out = MS_EXPERTS_ON_AUTO;
    else return ms_fail(err, MS_ERR_ARG, "--experts-on \"%s\": expected cpu, gpu or auto", s);
    return MS_OK;
}

const char *ms_experts_on_name(ms_experts_on on) {
    return on == MS_EXPERTS_ON_CPU ? "cpu" : on == MS_EXPERTS_ON_AUTO ? "auto" : "gpu";
}

int ms_hybrid_first_layers(const ms_config *c, int n, uint8_t *flags) {
    int set = 0;
    for (int l = 0; l < c->n_layers; l++) {
        flags[l] = c->layer_mlp[l] == MS_MLP_MOE && (n < 0 || set < n);
        set += flags[l];
    }
    return set;
}

/* Bytes a pass over expert v reads: its matrices (with block scales) and biases. */
static uint64_t view_bytes(const ms_expert_view *v) {
    uint64_t b = ms_qmat_bytes(&v->gate) + (v->up.data ? ms_qmat_bytes(&v->up) : 0) + ms_qmat_bytes(&v->down);
    uint64_t bb = (uint64_t)ms_dtype_bits(v->bias_dtype) / 8;
    if (v->gate_bias) b += (uint64_t)v->gate.rows * bb;
    if (v->up_bias) b += (uint64_t)v->up.rows * bb;
    if (v->down_bias) b += (uint64_t)v->down.rows * bb;
    return b;
}

uint64_t ms_hybrid_expert_bytes(const ms_model *m, int l) {
    return m->layers[l].experts ? view_bytes(&m->layers[l].experts[0]) : 0;
}

/* ---------------- engine side ---------------- */

int ms_engine_hybrid_active(const ms_engine *e) { return e && e->hyb && e->hyb->n_cpu > 0; }

int ms_engine_hybrid_stats(const ms_engine *e, ms_hybrid_stats *out) {
    memset(out, 0, sizeof *out);
    if (!ms_engine_hybrid_active(e)) return 0;
    *out = e->hyb->st;
    return 1;
}

int ms_hybrid_layer(const ms_engine *e, int layer) { return e->hyb && e->hyb->cpu_layer[layer]; }

ms_expert_source *ms_hybrid_host(const ms_engine *e) { return e->hyb ? e->hyb->host : NULL; }

int ms_hybrid_place(const ms_model *m, ms_backend *be, const uint8_t *cpu_layer, int skip_experts, ms_model **placed,
                    ms_err *err) {
    ms_model tmp = *m; /* the same model with the CPU layers' experts hidden from the placer */
    tmp.layers = malloc((size_t)(m->cfg.n_layers > 0 ? m->cfg.n_layers : 1) * sizeof *tmp.layers);
    if (!tmp.layers) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    for (int l = 0; l < m->cfg.n_layers; l++) {
        tmp.layers[l] = m->layers[l];
        if (cpu_layer && cpu_layer[l]) tmp.layers[l].experts = NULL;
    }
    int rc = ms_model_place(&tmp, be, skip_experts, placed, err);
    free(tmp.layers);
    return rc;
}

/* Zeroed page-aligned host memory of bytes (page-aligned so that host_register can lock it), or NULL. */
static float *host_rows(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 4096)) return NULL;
    memset(p, 0, bytes);
    return p;
}

void ms_hybrid_free(ms_engine *e) {
    struct ms_hybrid *h = e->hyb;
    if (!h) return;
    if (h->in_reg) e->be->ops->host_unregister(e->be, h->in);
    if (h->acc_reg) e->be->ops->host_unregister(e->be, h->acc);
    free(h->in), free(h->acc), free(h->xs), free(h->ys), free(h->g), free(h->u), free(h->jobs);
    if (h->gate) e->be->ops->free(e->be, h->gate);
    for (int i = 0; i < h->n_reg; i++) e->be->ops->host_unregister(e->be, (void *)h->reg[i]);
    free(h->reg), free(h->gids), free(h->goff), free(h->gviews), free(h->dviews), free(h->djobs);
    float *dev[] = {h->dxs, h->dys, h->dg, h->du, h->dsum};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) e->be->ops->free(e->be, dev[i]);
    if (h->dslots) e->be->ops->free(e->be, h->dslots);
    if (h->own_host) h->own_host->ops->destroy(h->own_host);
    if (h->cpu) h->cpu->ops->destroy(h->cpu);
    free(h->cpu_layer);
    free(h);
    e->hyb = NULL;
}

/* gpu_share's state: device slots and scratch, and the checkpoint files holding a CPU layer's
 * experts page-locked through the device backend. Where a file cannot be page-locked (or the
 * backend has no host_register) the share is off: staged copies block the host. */
static int share_init(ms_engine *e, struct ms_hybrid *h, const ms_hybrid_opts *o, ms_err *err) {
    const ms_model *m = e->m;
    const ms_config *c = &m->cfg;
    ms_backend *be = e->be;
    int slots = o->gpu_slots > 0 ? o->gpu_slots : 2 * (int)c->top_k;
    size_t B = (size_t)e->max_batch;
    int64_t D = c->latent_moe ? c->expert_hidden : c->hidden;
    int64_t inter = 2 * (c->moe_inter > c->inter ? c->moe_inter : c->inter);
    h->slot_bytes = ms_device_expert_slot_bytes(m);
    h->gids = malloc((size_t)slots * sizeof *h->gids);
    h->goff = malloc((size_t)(slots + 1) * sizeof *h->goff);
    h->gviews = calloc((size_t)slots, sizeof *h->gviews);
    h->dviews = calloc((size_t)slots, sizeof *h->dviews);
    h->reg = calloc((size_t)(m->ck.n_files > 0 ? m->ck.n_files : 1), sizeof *h->reg);
    h->djobs = malloc(2 * (size_t)slots * sizeof *h->djobs);
    if (!h->gids || !h->goff || !h->gviews || !h->dviews || !h->reg || !h->djobs)
        return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    int rc = be->ops->alloc(be, (size_t)h->slot_bytes * (size_t)slots, (void **)&h->dslots, err);
    if (!rc) rc = be->ops->alloc(be, B * (size_t)D * 4, (void **)&h->dxs, err);
    if (!rc) rc = be->ops->alloc(be, B * (size_t)D * 4, (void **)&h->dys, err);
    if (!rc) rc = be->ops->alloc(be, B * (size_t)D * 4, (void **)&h->dsum, err);
    if (!rc) rc = be->ops->alloc(be, B * (size_t)inter * 4, (void **)&h->dg, err);
    if (!rc) rc = be->ops->alloc(be, B * (size_t)inter * 4, (void **)&h->du, err);
    if (rc) return ms_wrap(err, "device slots for the CPU layers' device share (%d x %.2f MiB)", slots,
                           h->slot_bytes / 1048576.0);
    h->share = o->gpu_share;
    h->share_slots = slots;
    if (!be->ops->host_register) {
        h->share = 0;
        return MS_OK;
    }
    /* every mapped file holding a CPU layer's expert: page-locked whole (the experts' uploads are DMA) */
    int failed = 0;
    for (int f = 0; f < m->ck.n_files; f++) {
        const ms_mapping *mp = &m->ck.files[f].map;
        int used = 0;
        for (int l = 0; l < c->n_layers && !used && mp->data; l++)
            for (int64_t x = 0; h->cpu_layer[l] && m->layers[l].experts && x < c->n_experts && !used; x++) {
                const uint8_t *d = m->layers[l].experts[x].gate.data;
                used = d >= mp->data && d < mp->data + mp->size;
            }
        if (!used) continue;
        ms_err ignore = {0};
        size_t bytes = (size_t)((mp->size + 4095) & ~(uint64_t)4095);
        if (be->ops->host_register(be, (void *)mp->data, bytes, &ignore) == MS_OK) h->reg[h->n_reg++] = mp->data;
        else failed++;
    }
    h->st.gpu_pinned = h->n_reg > 0 && !failed;
    if (!h->st.gpu_pinned) h->share = 0; /* staged copies would hold the CPU up longer than they save */
    return MS_OK;
}

int ms_hybrid_init(ms_engine *e, const ms_hybrid_opts *o, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    if (!o || !o->cpu_layer || e->be->host_memory || !c->n_experts) return MS_OK; /* nothing to split */
    int n_cpu = 0;
    for (int l = 0; l < c->n_layers; l++) n_cpu += o->cpu_layer[l] && c->layer_mlp[l] == MS_MLP_MOE;
    if (!n_cpu) return MS_OK;
    if (o->host && o->host->views_on)
        return ms_fail(err, MS_ERR_ARG, "the CPU experts' source has views in %s memory, not host memory",
                       o->host->views_on->name);
    struct ms_hybrid *h = calloc(1, sizeof *h);
    if (!h) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    e->hyb = h;
    h->n_cpu = h->st.cpu_layers = n_cpu;
    h->cpu_layer = calloc((size_t)c->n_layers, 1);
    if (!h->cpu_layer) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) h->cpu_layer[l] = o->cpu_layer[l] && c->layer_mlp[l] == MS_MLP_MOE;
    int rc;
    if ((rc = ms_backend_cpu_create(e->pool, &h->cpu, err))) return rc;
    /* the experts' ops need no context-sized scratch: reserve for a 1-token context */
    if ((rc = h->cpu->ops->reserve(h->cpu, c, 1, e->max_batch, err))) return rc;
    h->host = o->host;
    if (!h->host) {
        if ((rc = ms_resident_experts_create(e->m, &h->own_host, err))) return rc;
        h->host = h->own_host;
    }
    size_t B = (size_t)e->max_batch;
    int64_t D = c->latent_moe ? c->expert_hidden : c->hidden;
    int64_t inter = 2 * (c->moe_inter > c->inter ? c->moe_inter : c->inter);
    h->rows_bytes = (B * (size_t)D * 4 + 4095) / 4096 * 4096;
    h->in = host_rows(h->rows_bytes), h->acc = host_rows(h->rows_bytes);
    h->xs = host_rows(B * (size_t)D * 4), h->ys = host_rows(B * (size_t)D * 4);
    h->g = host_rows(B * (size_t)inter * 4), h->u = host_rows(B * (size_t)inter * 4);
    h->inter2 = inter;
    h->composed = o->composed;
    h->jobs = malloc(2 * B * sizeof *h->jobs);
    if (!h->in || !h->acc || !h->xs || !h->ys || !h->g || !h->u || !h->jobs)
        return ms_fail(err, MS_ERR_NOMEM, "out of memory for the CPU experts' rows (batch %zu)", B);
    if (c->shared_inter && c->shared_expert_gate && (rc = e->be->ops->alloc(e->be, B * 4, (void **)&h->gate, err)))
        return rc;
    if (e->be->ops->host_register) { /* best effort: pageable rows still work, staged */
        ms_err ignore = {0};
        h->in_reg = e->be->ops->host_register(e->be, h->in, h->rows_bytes, &ignore) == MS_OK;
        h->acc_reg = e->be->ops->host_register(e->be, h->acc, h->rows_bytes, &ignore) == MS_OK;
    }
    if (o->gpu_share > 0 && !o->host && (rc = share_init(e, h, o, err))) return rc;
    return MS_OK;
}

/* The experts of a (acquired views, host rows) when each takes exactly one row (decode):
 * every gate / up product in one matmul_many pass, biases and activations, every down
 * product in a second pass, then the weighted adds in expert order with the CPU backend's
 * scatter_add_rows, one row each. The same products, activations and adds in the same
 * order as ms_moe_experts_composed (one row per expert: no gather changes a value), in 2
 * pool runs instead of 3 per expert. Expert u uses rows u of g / u / ys. Returns 0 (nothing
 * done) when some expert has another row count or there are more experts than rows. */
static int experts_one_row(struct ms_hybrid *h, const ms_moe_args *a, int B) {
    ms_backend *cpu = h->cpu;
    int nu = a->nu, nj = 0;
    if (nu > B) return 0;
    for (int u = 0; u < nu; u++)
        if (a->off[u + 1] - a->off[u] != 1) return 0;
    for (int u = 0; u < nu; u++) {
        const ms_expert_view *v = &a->views[u];
        const float *x = a->in + (int64_t)a->tok[a->off[u]] * a->D;
        float *g = h->g + u * h->inter2, *up = h->u + u * h->inter2;
        if (!v->up.data) {
            h->jobs[nj++] = (ms_matmul_job){up, x, 1, &v->gate, 0};
        } else {
            h->jobs[nj++] = (ms_matmul_job){g, x, 1, &v->gate, 0};
            h->jobs[nj++] = (ms_matmul_job){up, x, 1, &v->up, 0};
        }
    }
    cpu->ops->matmul_many(cpu, h->jobs, nj);
    nj = 0;
    for (int u = 0; u < nu; u++) {
        const ms_expert_view *v = &a->views[u];
        int64_t I = v->down.cols;
        float *g = h->g + u * h->inter2, *up = h->u + u * h->inter2;
        if (!v->up.data) {
            if (v->gate_bias) cpu->ops->add_bias_any(cpu, up, v->gate_bias, v->bias_dtype, 1, 2 * I);
            cpu->ops->split_gate_up(cpu, g, up, 1, I);
        } else {
            if (v->gate_bias) cpu->ops->add_bias_any(cpu, g, v->gate_bias, v->bias_dtype, 1, I);
            if (v->up_bias) cpu->ops->add_bias_any(cpu, up, v->up_bias, v->bias_dtype, 1, I);
        }
        cpu->ops->glu(cpu, a->act, g, up, I);
        h->jobs[nj++] = (ms_matmul_job){h->ys + u * a->D, g, 1, &v->down, 0};
    }
    cpu->ops->matmul_many(cpu, h->jobs, nj);
    for (int u = 0; u < nu; u++) {
        const ms_expert_view *v = &a->views[u];
        float *y = h->ys + u * a->D;
        if (v->down_bias) cpu->ops->add_bias_any(cpu, y, v->down_bias, v->bias_dtype, 1, v->down.rows);
        cpu->ops->scatter_add_rows(cpu, a->acc, y, a->tok + a->off[u], a->w + a->off[u], 1, a->D);
    }
    return 1;
}

int ms_hybrid_ffn_moe(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    struct ms_hybrid *h = e->hyb;
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->w->layers[layer];
    ms_backend *be = e->be;
    const float *in;
    float *acc;
    int64_t D = ms_moe_io(e, L, n, out, &in, &acc);
    ms_glu act = ms_moe_glu(c, c->expert_act);
    double t0 = now_s();
    /* the router's choice and the experts' input rows come down (each download waits for the stream) */
    int rc = ms_moe_route(e, L, e->xn, n, e->chunk_tokens, e->topk_ids, e->topk_w, err);
    if (!rc) rc = be->ops->download(be, h->in, in, (size_t)n * (size_t)D * 4, err);
    if (rc) return ms_wrap(err, "layer %d router (hybrid)", layer);
    double t1 = now_s();
    int nu = ms_moe_build_lists(e, layer, n, NULL);
    if ((rc = ms_moe_lookahead(e, layer, n, err))) return rc;
    /* the shared expert is queued now: the device runs it while the CPU sums the routed ones */
    if (c->shared_inter) {
        ms_ffn_dense(e, &L->gate, &L->up, &L->down, n, e->xn, e->ys, 0);
        if (c->shared_expert_gate) be->ops->matmul(be, h->gate, e->xn, n, &L->shared_gate, 0);
    }
    memset(h->acc, 0, (size_t)n * (size_t)D * 4);
    int group = h->host->max_acquire > 0 ? h->host->max_acquire : nu;
    const int *cnt = e->ex_count, *uniq = e->ex_uniq;
    /* gpu_share: the last ng experts (highest ids) up into device slots and summed there into acc,
     * queued before the CPU starts on the first nu - ng */
    int ng = h->share > 0 ? (int)(h->share * nu + 0.5) : 0;
    if (ng > h->share_slots) ng = h->share_slots;
    if (ng > nu) ng = nu;
    int nc = nu - ng;
    if (ng) {
        double tq = now_s();
        for (int u = 0; u < ng; u++) h->gids[u] = uniq[nc + u];
        if ((rc = ms_experts_acquire(h->host, layer, ng, h->gids, h->gviews, err)))
            return ms_wrap(err, "layer %d experts (device share)", layer);
        be->ops->zero(be, acc, (size_t)n * (size_t)D * 4);
        for (int u = 0; u < ng && !rc; u++)
            rc = ms_device_expert_upload(be, &h->gviews[u], h->dslots + (uint64_t)u * h->slot_bytes, h->slot_bytes,
                                         &h->dviews[u], &h->st.gpu_expert_bytes, err);
        ms_experts_release(h->host, layer); /* the mapping's views stay valid while the copies run */
        if (rc) return ms_wrap(err, "layer %d: an expert into a device slot", layer);
        for (int u = 0; u < ng; u++) h->goff[u] = cnt[uniq[nc + u]];
        h->goff[ng] = cnt[uniq[nu - 1] + 1];
        ms_moe_args ga = {.in = in, .acc = acc, .D = D, .act = &act, .nu = ng, .views = h->dviews, .off = h->goff,
                          .tok = e->ex_tokens, .w = e->ex_w, .max_batch = e->max_batch, .xs = h->dxs, .g = h->dg,
                          .u = h->du, .ys = h->dys};
        /* decode: the one-row form through the device's ops (two matmul_many launches instead of a
         * composed run per expert); chunks through the backend's moe_experts (grouped GEMMs) */
        struct ms_hybrid dh = {.cpu = be, .g = h->dg, .u = h->du, .ys = h->dys, .jobs = h->djobs,
                               .inter2 = h->inter2};
        if (h->composed || ng > h->share_slots || !experts_one_row(&dh, &ga, e->max_batch)) be->ops->moe_experts(be, &ga);
        h->st.gpu_experts += (uint64_t)ng;
        h->st.gpu_queue_s += now_s() - tq;
    }
    for (int g0 = 0; g0 < nc; g0 += group) {
        int gn = nc - g0 < group ? nc - g0 : group;
        if ((rc = ms_experts_acquire(h->host, layer, gn, uniq + g0, e->ex_views, err)))
            return ms_wrap(err, "layer %d experts (CPU)", layer);
        for (int u = 0; u < gn; u++) {
            e->ex_off[u] = cnt[uniq[g0 + u]];
            h->st.expert_bytes += view_bytes(&e->ex_views[u]);
        }
        e->ex_off[gn] = cnt[uniq[g0 + gn - 1] + 1];
        ms_moe_args ma = {.in = h->in, .acc = h->acc, .D = D, .act = &act, .nu = gn, .views = e->ex_views,
                          .off = e->ex_off, .tok = e->ex_tokens, .w = e->ex_w, .max_batch = e->max_batch,
                          .xs = h->xs, .g = h->g, .u = h->u, .ys = h->ys};
        if (h->composed || !experts_one_row(h, &ma, e->max_batch)) h->cpu->ops->moe_experts(h->cpu, &ma);
        ms_experts_release(h->host, layer);
    }
    ms_moe_zero_experts(e, h->cpu, h->in, h->acc, D); /* the identity experts, as the CPU engine adds them */
    double t2 = now_s();
    /* the sum goes up into the layer's accumulator; the device adds the rest in stream order */
    if ((rc = be->ops->upload(be, ng ? h->dsum : acc, h->acc, (size_t)n * (size_t)D * 4, err)))
        return ms_wrap(err, "layer %d experts' sum upload", layer);
    if (ng) be->ops->add(be, acc, h->dsum, (int64_t)n * D); /* the device's experts' sum + the CPU's */
    ms_moe_latent_up(e, L, n, acc, out);
    if (c->shared_inter && c->shared_expert_gate) be->ops->add_gated_rows(be, out, e->ys, h->gate, n, c->hidden);
    else if (c->shared_inter) be->ops->add(be, out, e->ys, (int64_t)n * c->hidden);
    double t3 = now_s();
    h->st.layer_calls++;
    h->st.experts += (uint64_t)nu;
    h->st.wait_s += t1 - t0;
    h->st.cpu_s += t2 - t1;
    h->st.tail_s += t3 - t2;
    return MS_OK;
}

/* ---------------- measurements and the auto rule ---------------- */

/* Seconds per upload of `bytes` from src to dst (best of 3 after a warm-up). */
static int time_upload(ms_backend *dev, void *dst, const void *src, size_t bytes, double *sec, ms_err *err) {
    int rc = dev->ops->upload(dev, dst, src, bytes, err);
    if (!rc) rc = dev->ops->sync(dev, err);
    double best = 1e30;
    for (int r = 0; r < 3 && !rc; r++) {
        double t = now_s();
        rc = dev->ops->upload(dev, dst, src, bytes, err);
        if (!rc) rc = dev->ops->sync(dev, err);
        t = now_s() - t;
        if (t < best) best = t;
    }
    *sec = best;
    return rc;
}

/* qsort order of doubles, ascending. */
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int ms_hybrid_measure_run(const ms_model *m, ms_backend *dev, ms_pool *pool, ms_hybrid_measure *out, ms_err *err) {
    memset(out, 0, sizeof *out);
    out->threads = ms_pool_size(pool);
    const size_t PB = (size_t)64 << 20;
    void *d = NULL;
    float *hbuf = host_rows(PB);
    if (!hbuf) return ms_fail(err, MS_ERR_NOMEM, "out of memory (bandwidth probe)");
    int rc = dev->ops->alloc(dev, PB, &d, err);
    double s;
    if (!rc && !(rc = time_upload(dev, d, hbuf, PB, &s, err))) out->pcie_pageable_gb_s = PB / s / 1e9;
    if (!rc && dev->ops->host_register) {
        ms_err ignore = {0};
        if (dev->ops->host_register(dev, hbuf, PB, &ignore) == MS_OK) {
            if (!(rc = time_upload(dev, d, hbuf, PB, &s, err))) out->pcie_h2d_gb_s = PB / s / 1e9;
            dev->ops->host_unregister(dev, hbuf);
        }
    }
    if (!out->pcie_h2d_gb_s) out->pcie_h2d_gb_s = out->pcie_pageable_gb_s;
    if (d) dev->ops->free(dev, d);
    free(hbuf);
    if (rc) return ms_wrap(err, "measuring the host-to-device bandwidth");
    out->ram_read_gb_s = ms_measure_read_bandwidth(pool, (size_t)512 << 20);
    /* the CPU's expert rate: one decode token through top-k distinct experts of the first MoE layer */
    const ms_config *c = &m->cfg;
    int l0 = -1;
    for (int l = 0; l < c->n_layers && l0 < 0; l++)
        if (m->layers[l].experts) l0 = l;
    if (l0 < 0) return MS_OK;
    int K = (int)c->top_k, E = (int)c->n_experts;
    int64_t D = c->latent_moe ? c->expert_hidden : c->hidden;
    int64_t inter = 2 * (c->moe_inter > c->inter ? c->moe_inter : c->inter);
    ms_backend *cpu = NULL;
    if ((rc = ms_backend_cpu_create(pool, &cpu, err))) return rc;
    float *x = host_rows((size_t)D * 4), *acc = host_rows((size_t)D * 4), *xs = host_rows((size_t)D * 4);
    float *ys = host_rows((size_t)D * 4), *g = host_rows((size_t)inter * 4), *u = host_rows((size_t)inter * 4);
    ms_expert_view *views = malloc((size_t)K * sizeof *views);
    int *off = malloc((size_t)(K + 1) * sizeof *off), *tok = calloc((size_t)K, sizeof *tok);
    float *w = malloc((size_t)K * 4);
    if (!x || !acc || !xs || !ys || !g || !u || !views || !off || !tok || !w) {
        rc = ms_fail(err, MS_ERR_NOMEM, "out of memory (expert-rate probe)");
    } else if (!(rc = cpu->ops->reserve(cpu, c, 1, K, err))) {
        /* the hybrid layer's decode form (experts_one_row) over rows of its own */
        struct ms_hybrid ph = {.cpu = cpu, .inter2 = inter};
        ph.g = host_rows((size_t)K * (size_t)inter * 4), ph.u = host_rows((size_t)K * (size_t)inter * 4);
        ph.ys = host_rows((size_t)K * (size_t)D * 4);
        ph.jobs = malloc(2 * (size_t)K * sizeof *ph.jobs);
        for (int64_t i = 0; i < D; i++) x[i] = (float)((i % 17) - 8) * 0.01f;
        ms_glu act = ms_moe_glu(c, c->expert_act);
        double t[12];
        uint64_t bytes = 0;
        /* a different set of experts each round, read from RAM (6 sets: more than a last-level cache); the
         * first pass maps their pages (a fresh mapping faults), the second is timed */
        for (int r = 0; r < 12; r++) {
            bytes = 0;
            for (int j = 0; j < K; j++) {
                views[j] = m->layers[l0].experts[((r % 6) * K + j) % E];
                off[j] = j, w[j] = 1.0f / (float)K;
                bytes += view_bytes(&views[j]);
            }
            off[K] = K;
            ms_moe_args ma = {.in = x, .acc = acc, .D = D, .act = &act, .nu = K, .views = views, .off = off,
                              .tok = tok, .w = w, .max_batch = 1, .xs = xs, .g = g, .u = u, .ys = ys};
            double t0 = now_s();
            if (!ph.g || !ph.u || !ph.ys || !ph.jobs || !experts_one_row(&ph, &ma, K)) cpu->ops->moe_experts(cpu, &ma);
            t[r] = now_s() - t0;
        }
        free(ph.g), free(ph.u), free(ph.ys), free(ph.jobs);
        qsort(t + 6, 6, sizeof *t, cmp_d);
        double med = 0.5 * (t[8] + t[9]);
        out->cpu_expert_gb_s = med > 0 ? (double)bytes / med / 1e9 : 0;
    }
    free(x), free(acc), free(xs), free(ys), free(g), free(u), free(views), free(off), free(tok), free(w);
    cpu->ops->destroy(cpu);
    return rc;
}

int ms_hybrid_auto_layers(const ms_model *m, const ms_hybrid_measure *ms, uint64_t device_budget, int stream,
                          uint8_t *flags, char *why, size_t cap) {
    const ms_config *c = &m->cfg;
    int n_moe = 0, fit = 0;
    uint64_t used = 0;
    /* from the last MoE layer backwards: the layers that fit stay on the device, the first go to the CPU */
    for (int l = c->n_layers - 1; l >= 0; l--) {
        if (c->layer_mlp[l] != MS_MLP_MOE) continue;
        n_moe++;
        uint64_t b = ms_hybrid_expert_bytes(m, l) * (uint64_t)c->n_experts;
        if (fit == n_moe - 1 && used + b <= device_budget) used += b, fit++;
    }
    int cpu_wins = ms->cpu_expert_gb_s >= ms->pcie_h2d_gb_s;
    int n_cpu = n_moe - fit;
    if (!cpu_wins && stream) n_cpu = 0; /* the layers that do not fit stream through the device cache */
    ms_hybrid_first_layers(c, n_cpu, flags);
    if (why)
        snprintf(why, cap,
                 "experts-on auto: %d of %d MoE layers fit in the device's %.1f MiB for experts; cold expert on the "
                 "CPU %.2f GB/s vs PCIe %.2f GB/s: %d layers on the CPU%s",
                 fit, n_moe, device_budget / 1048576.0, ms->cpu_expert_gb_s, ms->pcie_h2d_gb_s, n_cpu,
                 n_cpu == 0 && fit < n_moe ? " (the rest stream through the device cache)"
                 : n_cpu && !cpu_wins      ? " (no host cache to stream from)"
                                           : "");
    return n_cpu;
}
