#include "io/expert_stream.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "io/expert_trace.h"
#include "util/hash.h"

typedef struct slot_io {
    int pending;     /* pieces outstanding */
    int failed;      /* 1: the last load failed (msg says why) */
    char msg[1200];
} slot_io;

typedef struct pin_rec { int layer, slot; } pin_rec;

typedef struct stream_src {
    ms_expert_source base;
    const ms_expert_store *st;
    ms_stream_opts o;
    ms_reader *rd;
    ms_ecache c;
    uint8_t *arena;
    uint64_t arena_bytes, slot_bytes;
    int n_slots;
    slot_io *io;
    pin_rec *pins;
    int n_pins, cap_pins;
    ms_stream_stats stats;
    double busy_t0;
    FILE *trace; /* opts.trace_path */
} stream_src;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- default binder ---- */

static int find_role(const ms_expert_bytes *b, const char *name) {
    for (int r = 0; r < b->n_roles; r++)
        if (!strcmp(b->roles[r].name, name)) return b->data[r] ? r : -1;
    return -1;
}

static int bind_mat(const ms_bind_opts *bo, const ms_expert_bytes *b, const char *name, ms_qmat *q, ms_err *err) {
    int r = find_role(b, name);
    if (r < 0) {
        for (int k = 0; k < b->n_roles; k++)
            if (b->data[k] && strstr(b->roles[k].name, "gate_up"))
                return ms_fail(err, MS_ERR_UNSUPPORTED,
                               "layer %d expert %d: fused role %s needs the model's own binder", b->layer, b->expert,
                               b->roles[k].name);
        return ms_fail(err, MS_ERR_SHAPE, "layer %d expert %d: role %s is missing", b->layer, b->expert, name);
    }
    const ms_expert_role_info *ri = &b->roles[r];
    if (ri->ndim != 2)
        return ms_fail(err, MS_ERR_SHAPE, "layer %d expert %d: role %s has %d dims (need 2)", b->layer, b->expert, name,
                       ri->ndim);
    memset(q, 0, sizeof *q);
    q->rows = ri->shape[0];
    q->cols = ri->shape[1];
    q->data = b->data[r];
    q->dtype = ri->dtype;
    char sn[48];
    snprintf(sn, sizeof sn, "%s_scale", name);
    int s = find_role(b, sn);
    const ms_expert_role_info *si = s >= 0 ? &b->roles[s] : NULL;
    switch (ri->dtype) {
    case MS_DT_F32: case MS_DT_F16: case MS_DT_BF16:
        if (si) return ms_fail(err, MS_ERR_UNSUPPORTED, "layer %d expert %d: %s is %s but has a scale", b->layer,
                               b->expert, name, ms_dtype_name(ri->dtype));
        return MS_OK;
    case MS_DT_F8_E4M3: {
        int br = bo && bo->fp8_block_rows ? bo->fp8_block_rows : 128, bc = bo && bo->fp8_block_cols ? bo->fp8_block_cols : 128;
        if (!si || si->ndim != 2 || (si->dtype != MS_DT_F32 && si->dtype != MS_DT_BF16) ||
            si->shape[0] != (q->rows + br - 1) / br || si->shape[1] != (q->cols + bc - 1) / bc)
            return ms_fail(err, MS_ERR_SHAPE, "layer %d expert %d: FP8 role %s needs an F32/BF16 scale [%lld, %lld]",
                           b->layer, b->expert, name, (long long)((q->rows + br - 1) / br),
                           (long long)((q->cols + bc - 1) / bc));
        q->scale = b->data[s];
        q->scale_dtype = si->dtype;
        q->brow = br;
        q->bcol = bc;
        return MS_OK;
    }
    case MS_DT_I32: /* compressed-tensors pack-quantized INT4 (core/qmat.h I4): the group from the scale's shape */
        q->dtype = MS_DT_I4;
        q->cols = ri->shape[1] * 8;
        if (!si || si->ndim != 2 || si->shape[0] != q->rows || si->shape[1] < 1 ||
            (si->dtype != MS_DT_BF16 && si->dtype != MS_DT_F16 && si->dtype != MS_DT_F32) || q->cols % si->shape[1])
            return ms_fail(err, MS_ERR_SHAPE,
                           "layer %d expert %d: INT4 role %s needs a BF16/F16/F32 scale [%lld, cols / group]", b->layer,
                           b->expert, name, (long long)q->rows);
        q->scale = b->data[s];
        q->scale_dtype = si->dtype;
        q->brow = 1;
        q->bcol = (int)(q->cols / si->shape[1]);
        snprintf(sn, sizeof sn, "%s_zero", name); /* asymmetric: the packed zero points (qmat.h I4 zero) */
        int z = find_role(b, sn);
        if (z >= 0 && b->data[z]) {
            const ms_expert_role_info *zi = &b->roles[z];
            if (zi->dtype != MS_DT_I32 || zi->ndim != 2 || zi->shape[0] != (q->rows + 7) / 8 || zi->shape[1] != si->shape[1])
                return ms_fail(err, MS_ERR_SHAPE, "layer %d expert %d: INT4 role %s needs an I32 zero point [%lld, %lld]",
                               b->layer, b->expert, name, (long long)((q->rows + 7) / 8), (long long)si->shape[1]);
            q->zero = b->data[z];
        }
        return MS_OK;
    case MS_DT_U8:
        q->dtype = MS_DT_F4;
        q->cols = ri->shape[1] * 2;
        if (!si || si->dtype != MS_DT_U8 || si->ndim != 2 || si->shape[0] != q->rows || q->cols % 32 ||
            si->shape[1] != q->cols / 32)
            return ms_fail(err, MS_ERR_SHAPE, "layer %d expert %d: MXFP4 role %s needs a U8 scale [%lld, %lld]",
                           b->layer, b->expert, name, (long long)q->rows, (long long)(q->cols / 32));
        q->scale = b->data[s];
        q->scale_dtype = MS_DT_F8_E8M0;
        q->brow = 1;
        q->bcol = 32;
        return MS_OK;
    default:
        return ms_fail(err, MS_ERR_UNSUPPORTED, "layer %d expert %d: role %s has dtype %s", b->layer, b->expert, name,
                       ms_dtype_name(ri->dtype));
    }
}

int ms_expert_bind_default(void *ctx, const ms_expert_bytes *b, ms_expert_view *v, ms_err *err) {
    const ms_bind_opts *bo = ctx;
    memset(v, 0, sizeof *v);
    int rc;
    if ((rc = bind_mat(bo, b, "gate", &v->gate, err)) || (rc = bind_mat(bo, b, "up", &v->up, err)) ||
        (rc = bind_mat(bo, b, "down", &v->down, err)))
        return rc;
    if (v->gate.rows != v->up.rows || v->gate.cols != v->up.cols || v->down.cols != v->gate.rows ||
        v->down.rows != v->gate.cols)
        return ms_fail(err, MS_ERR_SHAPE, "layer %d expert %d: gate/up [%lld, %lld] and down [%lld, %lld] do not chain",
                       b->layer, b->expert, (long long)v->gate.rows, (long long)v->gate.cols, (long long)v->down.rows,
                       (long long)v->down.cols);
    const char *bn[3] = {"gate_bias", "up_bias", "down_bias"};
    const void **bp[3] = {&v->gate_bias, &v->up_bias, &v->down_bias};
    for (int i = 0; i < 3; i++) {
        int r = find_role(b, bn[i]);
        if (r < 0) continue;
        *bp[i] = b->data[r];
        v->bias_dtype = b->roles[r].dtype;
    }
    return MS_OK;
}

/* ---- reads ---- */

static void busy_update(stream_src *S) {
    if (S->busy_t0 > 0 && ms_reader_outstanding(S->rd) == 0) {
        S->stats.busy_s += now_s() - S->busy_t0;
        S->busy_t0 = 0;
    }
}

static void on_done(stream_src *S, const ms_read_done *d) {
    int slot = (int)d->tag;
    slot_io *io = &S->io[slot];
    ms_ecache_slot *cs = &S->c.slots[slot];
    int li = cs->key / S->st->n_experts, e = cs->key % S->st->n_experts;
    int L = S->st->layer_id[li];
    if (d->status && !io->failed) {
        io->failed = 1;
        snprintf(io->msg, sizeof io->msg, "layer %d expert %d: read of %s [%" PRIu64 ", +%" PRIu64 ") failed: %s", L, e,
                 ms_reader_file_path(S->rd, d->file), d->off, d->len,
                 d->err_no ? strerror(d->err_no) : "short read (file truncated?)");
    }
    if (--io->pending > 0) return;
    if (!io->failed && S->st->packed && S->o.verify) {
        const ms_expert_loc *l = ms_expert_store_loc(S->st, li, e);
        const uint8_t *p = S->arena + (uint64_t)slot * S->slot_bytes + (l->piece[0].offset & (MS_IO_ALIGN - 1));
        uint32_t crc = ms_crc32c(0, p, l->piece[0].len);
        if (crc != l->crc32c) {
            io->failed = 1;
            snprintf(io->msg, sizeof io->msg,
                     "layer %d expert %d: checksum mismatch in %s at offset %" PRIu64 " (crc32c %08x, manifest %08x): "
                     "the store is corrupt",
                     L, e, S->st->paths[l->piece[0].file], l->piece[0].offset, crc, l->crc32c);
        }
    }
    if (io->failed) ms_ecache_drop(&S->c, slot);
    else cs->state = MS_SLOT_READY;
}

static int reap(stream_src *S, int min_done, ms_err *err) {
    ms_read_done d[64];
    int n;
    do {
        int rc = ms_reader_reap(S->rd, min_done, d, 64, &n, err);
        if (rc) return rc;
        for (int i = 0; i < n; i++) on_done(S, &d[i]);
        min_done = 0;
    } while (n == 64);
    busy_update(S);
    return MS_OK;
}

/* Start loading (li, e) into slot (already assigned). */
static void load(stream_src *S, int slot, int li, int e) {
    const ms_expert_loc *l = ms_expert_store_loc(S->st, li, e);
    uint64_t base[MS_EXPERT_MAX_ROLES], at[MS_EXPERT_MAX_ROLES];
    ms_expert_place(S->st, li, e, base, at);
    slot_io *io = &S->io[slot];
    io->failed = 0;
    io->pending = 0;
    io->msg[0] = 0;
    if (S->busy_t0 == 0) S->busy_t0 = now_s();
    uint8_t *buf = S->arena + (uint64_t)slot * S->slot_bytes;
    for (int p = 0; p < l->n_pieces; p++) {
        ms_err e2 = {0};
        if (ms_reader_submit(S->rd, l->piece[p].file, l->piece[p].offset, l->piece[p].len, buf + base[p],
                             (uint64_t)slot, &e2)) {
            io->failed = 1;
            snprintf(io->msg, sizeof io->msg, "layer %d expert %d: %s", S->st->layer_id[li], e, e2.msg);
            break;
        }
        io->pending++;
        S->stats.bytes_read += l->piece[p].len;
    }
    S->stats.reads++;
    if (io->pending == 0) ms_ecache_drop(&S->c, slot);
}

static int pin(stream_src *S, int layer, int slot, ms_err *err) {
    if (S->n_pins == S->cap_pins) {
        int nc = S->cap_pins ? S->cap_pins * 2 : 256;
        pin_rec *p = realloc(S->pins, (size_t)nc * sizeof *p);
        if (!p) return ms_fail(err, MS_ERR_NOMEM, "expert cache: out of memory");
        S->pins = p;
        S->cap_pins = nc;
    }
    S->pins[S->n_pins++] = (pin_rec){layer, slot};
    S->c.slots[slot].pins++;
    return MS_OK;
}

static void s_release(ms_expert_source *base, int layer) {
    stream_src *S = (stream_src *)base;
    if (S->trace && layer >= 0 && layer < S->st->n_model_layers && S->st->store_layer[layer] >= 0)
        ms_expert_trace_event(S->trace, 'r', S->st->store_layer[layer], 0, NULL);
    int k = 0;
    for (int i = 0; i < S->n_pins; i++) {
        if (S->pins[i].layer == layer) S->c.slots[S->pins[i].slot].pins--;
        else S->pins[k++] = S->pins[i];
    }
    S->n_pins = k;
}

/* The view of (li, e) in slot s once its load has landed: the read's failure (checksum:
 * MS_ERR_MISMATCH) or the binder's view. */
static int bind_slot(stream_src *S, int layer, int li, int e, int s, ms_expert_view *view, ms_err *err) {
    const ms_expert_store *st = S->st;
    if (S->io[s].failed) {
        int rc = ms_fail(err, MS_ERR_IO, "%s", S->io[s].msg);
        if (strstr(S->io[s].msg, "checksum")) err->code = rc = MS_ERR_MISMATCH;
        return rc;
    }
    if (S->c.slots[s].key != li * st->n_experts + e || S->c.slots[s].state != MS_SLOT_READY)
        return ms_fail(err, MS_ERR_IO, "layer %d expert %d: load did not complete", layer, e);
    uint64_t pb[MS_EXPERT_MAX_ROLES], at[MS_EXPERT_MAX_ROLES];
    ms_expert_place(st, li, e, pb, at);
    ms_expert_bytes b = {.layer = layer, .expert = e, .n_roles = st->n_roles, .roles = &st->roles[li * st->n_roles]};
    const uint8_t *buf = S->arena + (uint64_t)s * S->slot_bytes;
    for (int r = 0; r < st->n_roles; r++) b.data[r] = at[r] == UINT64_MAX ? NULL : buf + at[r];
    return S->o.bind(S->o.bind_ctx, &b, view, err);
}

int ms_stream_source_acquire_each(ms_expert_source *base, int layer, int n, const int *ids, ms_expert_view *views,
                                  ms_stream_ready_fn ready, void *ready_ctx, ms_err *err) {
    stream_src *S = (stream_src *)base;
    const ms_expert_store *st = S->st;
    if (layer < 0 || layer >= st->n_model_layers || st->store_layer[layer] < 0)
        return ms_fail(err, MS_ERR_ARG, "acquire: layer %d has no routed experts", layer);
    int li = st->store_layer[layer];
    if (S->trace && n > 0) ms_expert_trace_event(S->trace, 'a', li, n, ids);
    if (n < 0 || n > S->n_slots)
        return ms_fail(err, MS_ERR_NOMEM,
                       "acquire: layer %d asks for %d experts at once but the expert cache holds %d (raise the budget "
                       "or acquire in groups of at most %d)",
                       layer, n, S->n_slots, S->n_slots);
    int pins_before = S->n_pins;
    int slot_of_req[n > 0 ? n : 1];
    int rc = reap(S, 0, err);
    ms_ecache_step(&S->c, li);
    for (int i = 0; i < n && !rc; i++) {
        int e = ids[i];
        if (e < 0 || e >= st->n_experts) {
            rc = ms_fail(err, MS_ERR_ARG, "acquire: layer %d expert id %d out of range [0, %d)", layer, e, st->n_experts);
            break;
        }
        int s, r;
        for (;;) {
            r = ms_ecache_request(&S->c, li, e, &s);
            if (r >= 0) break;
            /* every slot pinned, loading or a protected prefetch: wait for a load */
            int loading = 0;
            for (int k = 0; k < S->n_slots; k++) loading += S->c.slots[k].state == MS_SLOT_LOADING;
            if (!loading) {
                rc = ms_fail(err, MS_ERR_NOMEM,
                             "acquire: layer %d expert %d: all %d expert cache slots are in use (pinned by "
                             "unreleased acquires)",
                             layer, e, S->n_slots);
                break;
            }
            double t0 = now_s();
            rc = reap(S, 1, err);
            S->stats.wait_s += now_s() - t0;
            if (rc) break;
        }
        if (rc) break;
        if (r == 0) load(S, s, li, e);
        slot_of_req[i] = s;
        if ((rc = pin(S, layer, s, err))) break;
    }
    /* wait for the requested slots: bound (and handed to ready) as each load lands, in the
     * order they land; without ready, in request order once all have landed */
    uint8_t done[n > 0 ? n : 1];
    memset(done, 0, sizeof done);
    int left = n;
    while (left > 0 && !rc) {
        int progressed = 0, landed = 1;
        for (int i = 0; i < n && landed && !ready; i++) landed = S->c.slots[slot_of_req[i]].state != MS_SLOT_LOADING;
        for (int i = 0; i < n && landed && !rc; i++) {
            if (done[i] || S->c.slots[slot_of_req[i]].state == MS_SLOT_LOADING) continue;
            rc = bind_slot(S, layer, li, ids[i], slot_of_req[i], &views[i], err);
            done[i] = 1, left--, progressed = 1;
            if (!rc && ready) rc = ready(ready_ctx, i, &views[i], err);
        }
        if (left > 0 && !rc && !progressed) {
            double t0 = now_s();
            rc = reap(S, 1, err);
            S->stats.wait_s += now_s() - t0;
        }
    }
    if (rc) {
        /* unpin what this call pinned */
        for (int i = pins_before; i < S->n_pins; i++) S->c.slots[S->pins[i].slot].pins--;
        S->n_pins = pins_before;
    }
    return rc;
}

static int s_acquire(ms_expert_source *base, int layer, int n, const int *ids, ms_expert_view *views, ms_err *err) {
    return ms_stream_source_acquire_each(base, layer, n, ids, views, NULL, NULL, err);
}

static void s_prefetch(ms_expert_source *base, int layer, int n, const int *ids) {
    stream_src *S = (stream_src *)base;
    const ms_expert_store *st = S->st;
    ms_err e2 = {0};
    if (layer < 0 || layer >= st->n_model_layers || st->store_layer[layer] < 0 || n < 1) return;
    int li = st->store_layer[layer];
    if (S->trace) ms_expert_trace_event(S->trace, 'p', li, n, ids);
    if (S->o.no_prefetch) return;
    reap(S, 0, &e2);
    for (int i = 0; i < n; i++) {
        int e = ids[i];
        if (e < 0 || e >= st->n_experts) continue;
        int s = ms_ecache_prefetch(&S->c, li, e);
        if (s >= 0) load(S, s, li, e);
    }
}

static void s_destroy(ms_expert_source *base) {
    stream_src *S = (stream_src *)base;
    if (!S) return;
    ms_reader_close(S->rd); /* waits for reads in flight into the arena */
    if (S->trace) fclose(S->trace);
    if (S->arena) munmap(S->arena, S->arena_bytes);
    ms_ecache_free(&S->c);
    free(S->io);
    free(S->pins);
    free(S);
}

static const ms_expert_source_ops k_stream_ops = {s_acquire, s_release, s_prefetch, s_destroy, NULL};

void ms_stream_source_stats(const ms_expert_source *s, ms_stream_stats *out) {
    const stream_src *S = (const stream_src *)s;
    *out = S->stats;
    const ms_ecache_stats *c = &S->c.st;
    out->acquires = c->requests;
    out->hits = c->hits;
    out->misses = c->misses;
    out->prefetch_issued = c->prefetch_issued;
    out->prefetch_used = c->prefetch_used;
    out->prefetch_dropped = c->prefetch_refused;
    out->prefetch_wasted = c->prefetch_wasted;
    out->evictions = c->evictions;
}

int ms_stream_source_slots(const ms_expert_source *s) { return ((const stream_src *)s)->n_slots; }

void ms_stream_source_arena(const ms_expert_source *s, void **p, uint64_t *bytes) {
    const stream_src *S = (const stream_src *)s;
    *p = S->arena;
    *bytes = S->arena_bytes;
}

int ms_stream_source_create(const ms_expert_store *st, const ms_stream_opts *opts, ms_expert_source **out, char *why,
                            size_t why_cap, ms_err *err) {
    *out = NULL;
    ms_stream_opts o = *opts;
    if (o.min_slots < 1) return ms_fail(err, MS_ERR_ARG, "expert cache: min_slots %d (the top-k, >= 1)", o.min_slots);
    if (!o.bind) o.bind = ms_expert_bind_default;
    uint64_t slot = st->buf_bytes;
    if (slot == 0 || slot % MS_IO_ALIGN) return ms_fail(err, MS_ERR_ARG, "expert cache: bad slot size %" PRIu64, slot);
    int64_t total = (int64_t)st->n_layers * st->n_experts;
    int64_t n = o.budget_bytes ? (int64_t)(o.budget_bytes / slot) : o.min_slots;
    if (n < o.min_slots)
        return ms_fail(err, MS_ERR_NOMEM,
                       "expert cache budget of %.1f MiB holds %lld slot(s) of %.2f MiB, but one layer's top-%d needs %d "
                       "(at least %.1f MiB)",
                       o.budget_bytes / 1048576.0, (long long)n, slot / 1048576.0, o.min_slots, o.min_slots,
                       (double)slot * o.min_slots / 1048576.0);
    if (n > total) n = total > o.min_slots ? total : o.min_slots;
    if (n > (1 << 24)) n = 1 << 24;
    stream_src *S = calloc(1, sizeof *S);
    if (!S) return ms_fail(err, MS_ERR_NOMEM, "expert cache: out of memory");
    S->base.ops = &k_stream_ops;
    S->st = st;
    S->o = o;
    S->n_slots = (int)n;
    S->slot_bytes = slot;
    S->arena_bytes = slot * (uint64_t)n;
    int rc = MS_OK;
    void *a = mmap(NULL, S->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) {
        rc = ms_fail(err, MS_ERR_NOMEM, "expert cache: cannot map %.1f MiB of slots: %s", S->arena_bytes / 1048576.0,
                     strerror(errno));
        free(S);
        return rc;
    }
    S->arena = a;
    madvise(a, S->arena_bytes, MADV_HUGEPAGE);
    S->io = calloc((size_t)n, sizeof *S->io);
    if (!S->io) rc = ms_fail(err, MS_ERR_NOMEM, "expert cache: out of memory");
    if (!rc) rc = ms_ecache_init(&S->c, o.policy, (int)n, st->n_layers, st->n_experts, o.half_life, err);
    if (!rc && o.trace_path) {
        S->trace = fopen(o.trace_path, "w");
        if (!S->trace) rc = ms_fail(err, MS_ERR_IO, "cannot create expert trace %s: %s", o.trace_path, strerror(errno));
        else ms_expert_trace_header(S->trace, st->n_layers, st->n_experts);
    }
    if (!rc) {
        ms_reader_opts ro = {.mode = o.io, .queue_depth = o.queue_depth, .chunk_bytes = o.chunk_bytes, .arena = S->arena,
                             .arena_bytes = S->arena_bytes, .unit_bytes = slot};
        rc = ms_reader_open((const char *const *)st->paths, st->n_files, &ro, &S->rd, why, why_cap, err);
    }
    if (rc) {
        s_destroy(&S->base);
        return rc;
    }
    S->stats.n_slots = S->n_slots;
    S->stats.slot_bytes = slot;
    S->stats.mode = ms_reader_mode(S->rd);
    *out = &S->base;
    return MS_OK;
}
