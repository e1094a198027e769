#include "engine/streaming.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

/* The streamed roles of an expert. The INT4 zero points (qmat.h I4 zero) come last and only
 * for an asymmetric INT4 checkpoint, so every other model keeps its 9 roles (and its packed
 * stores). */
#define N_ROLES 9
#define N_ROLES_ZP 12
static const char *const k_roles[N_ROLES_ZP] = {"gate",      "gate_scale", "up",        "up_scale",
                                                "down",      "down_scale", "gate_bias", "up_bias",
                                                "down_bias", "gate_zero",  "up_zero",   "down_zero"};
static int n_roles_of(const ms_model *m) { return m->cfg.int4_asym ? N_ROLES_ZP : N_ROLES; }

static uint64_t mat_bytes(const ms_qmat *q) {
    return ((uint64_t)q->rows * (uint64_t)q->cols * (uint64_t)ms_dtype_bits(q->dtype) + 7) / 8;
}

static uint64_t scale_bytes(const ms_qmat *q) {
    if (!q->scale || q->brow < 1 || q->bcol < 1) return 0;
    uint64_t r = (uint64_t)((q->rows + q->brow - 1) / q->brow), c = (uint64_t)((q->cols + q->bcol - 1) / q->bcol);
    return (r * c * (uint64_t)ms_dtype_bits(q->scale_dtype) + 7) / 8;
}

/* Bytes of an I4 view's packed zero points (0 without). */
static uint64_t zero_bytes(const ms_qmat *q) {
    if (q->dtype != MS_DT_I4 || !q->zero || q->bcol < 1) return 0;
    return (uint64_t)((q->rows + 7) / 8) * (uint64_t)((q->cols + q->bcol - 1) / q->bcol) * 4;
}

/* Role r of view v (k_roles): pointer and length. */
static const void *role_ptr(const ms_expert_view *v, int r, uint64_t *len) {
    if (r >= N_ROLES) {
        const ms_qmat *z = r == 9 ? &v->gate : r == 10 ? &v->up : &v->down;
        *len = zero_bytes(z);
        return z->zero;
    }
    const ms_qmat *q = r < 2 ? &v->gate : r < 4 ? &v->up : &v->down;
    switch (r) {
    case 0: case 2: case 4: *len = mat_bytes(q); return q->data;
    case 1: case 3: case 5: *len = scale_bytes(q); return q->scale;
    case 6: *len = (uint64_t)v->gate.rows * ms_dtype_bits(v->bias_dtype) / 8; return v->gate_bias;
    case 7: *len = (uint64_t)v->up.rows * ms_dtype_bits(v->bias_dtype) / 8; return v->up_bias;
    default: *len = (uint64_t)v->down.rows * ms_dtype_bits(v->bias_dtype) / 8; return v->down_bias;
    }
}

static int view_extent(void *ctx, int layer, int expert, int role, ms_extent *ext, ms_err *err) {
    ms_model *m = ctx;
    const ms_expert_view *v = &m->layers[layer].experts[expert];
    uint64_t len = 0;
    const uint8_t *p = role_ptr(v, role, &len);
    if (!p || !len) return 0;
    for (int i = 0; i < m->ck.n_files; i++) {
        const ms_mapping *mp = &m->ck.files[i].map;
        if (mp->data && p >= mp->data && p < mp->data + mp->size) {
            uint64_t off = (uint64_t)(p - mp->data);
            if (len > mp->size - off)
                return ms_fail(err, MS_ERR_FORMAT, "layer %d expert %d %s: %llu bytes run past the end of %s", layer,
                               expert, k_roles[role], (unsigned long long)len, m->ck.files[i].path);
            *ext = (ms_extent){.file = i, .offset = off, .len = len};
            return 1;
        }
    }
    return 0; /* a resident copy (e.g. an F32 bias): stays where it is */
}

/* The streamed view: the resident view with the streamed roles moved into the slot. */
static int bind_relocate(void *ctx, const ms_expert_bytes *b, ms_expert_view *v, ms_err *err) {
    ms_model *m = ctx;
    *v = m->layers[b->layer].experts[b->expert];
    for (int r = 0; r < N_ROLES_ZP && r < b->n_roles; r++) {
        const void *d = b->data[r];
        if (!d) continue;
        switch (r) {
        case 0: v->gate.data = d; break;
        case 1: v->gate.scale = d; break;
        case 2: v->up.data = d; break;
        case 3: v->up.scale = d; break;
        case 4: v->down.data = d; break;
        case 5: v->down.scale = d; break;
        case 6: v->gate_bias = d; break;
        case 7: v->up_bias = d; break;
        case 8: v->down_bias = d; break;
        case 9: v->gate.zero = d; break;
        case 10: v->up.zero = d; break;
        default: v->down.zero = d; break;
        }
    }
    return MS_OK;
}

static int store_of_model(ms_model *m, ms_expert_store *st, ms_err *err) {
    int nl = (int)m->cfg.n_layers;
    uint8_t *moe = calloc((size_t)nl, 1);
    if (!moe) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    for (int l = 0; l < nl; l++) moe[l] = m->layers[l].experts != NULL;
    int rc = ms_expert_store_from_extents(&m->ck, nl, moe, (int)m->cfg.n_experts, n_roles_of(m), k_roles, view_extent, m,
                                          st, err);
    free(moe);
    return rc;
}

typedef struct {
    ms_expert_source base;
    ms_expert_source *inner;
    ms_expert_store ck_store, packed;
    int use_packed;
} wrap_src;

static int w_acquire(ms_expert_source *s, int layer, int n, const int *ids, ms_expert_view *v, ms_err *err) {
    wrap_src *w = (wrap_src *)s;
    return w->inner->ops->acquire(w->inner, layer, n, ids, v, err);
}
static void w_release(ms_expert_source *s, int layer) { ms_experts_release(((wrap_src *)s)->inner, layer); }
static void w_prefetch(ms_expert_source *s, int layer, int n, const int *ids) {
    ms_experts_prefetch(((wrap_src *)s)->inner, layer, n, ids);
}
static void w_destroy(ms_expert_source *s) {
    wrap_src *w = (wrap_src *)s;
    if (!w) return;
    if (w->inner) w->inner->ops->destroy(w->inner);
    ms_expert_store_free(&w->ck_store);
    ms_expert_store_free(&w->packed);
    free(w);
}
static const ms_expert_source_ops k_wrap_ops = {w_acquire, w_release, w_prefetch, w_destroy, NULL};

int ms_is_streaming_source(const ms_expert_source *s) { return s && s->ops == &k_wrap_ops; }

int ms_streaming_acquire_each(ms_expert_source *s, int layer, int n, const int *ids, ms_expert_view *views,
                              ms_stream_ready_fn ready, void *ready_ctx, ms_err *err) {
    return ms_stream_source_acquire_each(((wrap_src *)s)->inner, layer, n, ids, views, ready, ready_ctx, err);
}

void ms_streaming_host_cache(const ms_expert_source *s, void **p, uint64_t *bytes) {
    ms_stream_source_arena(((const wrap_src *)s)->inner, p, bytes);
}

void ms_streaming_stats(const ms_expert_source *s, ms_stream_stats *out) {
    ms_stream_source_stats(((const wrap_src *)s)->inner, out);
}

int ms_streaming_experts_create(ms_model *m, const ms_streaming_opts *o, ms_expert_source **out, char *why,
                                size_t why_cap, ms_err *err) {
    *out = NULL;
    if (why && why_cap) why[0] = 0;
    if (!m->cfg.n_experts) return ms_fail(err, MS_ERR_ARG, "%s: the model has no routed experts to stream", m->ck.dir);
    if (o->cache_mib < 0 || o->cache_mib > (INT64_C(1) << 32))
        return ms_fail(err, MS_ERR_ARG, "expert cache of %lld MiB", (long long)o->cache_mib);
    wrap_src *w = calloc(1, sizeof *w);
    if (!w) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    w->base.ops = &k_wrap_ops;
    int rc = store_of_model(m, &w->ck_store, err);
    if (!rc && o->store_dir) {
        rc = ms_expert_store_open_packed(o->store_dir, &m->ck, &w->ck_store, &w->packed, err);
        w->use_packed = !rc;
    }
    char rwhy[700] = "";
    int qd = o->queue_depth, probed = 0;
    if (!rc && qd == 0 && (o->io == MS_IO_AUTO || o->io == MS_IO_URING)) {
        /* default from a quick probe of the largest file, at the size of one expert's read */
        const ms_expert_store *st = w->use_packed ? &w->packed : &w->ck_store;
        const char *big = NULL;
        off_t bs = 0;
        for (int i = 0; i < st->n_files; i++) {
            struct stat sb;
            if (stat(st->paths[i], &sb) == 0 && sb.st_size > bs) { bs = sb.st_size; big = st->paths[i]; }
        }
        uint64_t blk = st->buf_bytes < (4u << 20) ? st->buf_bytes : (4u << 20);
        if (big && (uint64_t)bs >= (256u << 20) && blk >= MS_IO_ALIGN) {
            ms_err pe = {0};
            if (ms_io_probe_queue_depth(big, blk, 64u << 20, &qd, &pe) == MS_OK) probed = 1;
            else qd = 0;
        }
    }
    if (!rc) {
        ms_stream_opts so = {.budget_bytes = (uint64_t)o->cache_mib << 20, .min_slots = (int)m->cfg.top_k,
                             .io = o->io, .queue_depth = qd, .chunk_bytes = o->chunk_bytes, .policy = o->policy,
                             .verify = !o->no_verify,
                             .no_prefetch = o->no_prefetch, .trace_path = o->trace_path,
                             .bind = bind_relocate, .bind_ctx = m};
        rc = ms_stream_source_create(w->use_packed ? &w->packed : &w->ck_store, &so, &w->inner, rwhy, sizeof rwhy, err);
    }
    if (rc) {
        w_destroy(&w->base);
        return rc;
    }
    w->base.max_acquire = ms_stream_source_slots(w->inner);
    const ms_expert_store *st = w->use_packed ? &w->packed : &w->ck_store;
    if (why && why_cap)
        snprintf(why, why_cap, "experts streamed from %s: io %s, queue depth %d%s; cache %d slots x %.2f MiB (%s)",
                 w->use_packed ? o->store_dir : "the checkpoint", rwhy, qd ? qd : 32,
                 probed ? " (probed)" : o->queue_depth ? "" : " (default)", w->base.max_acquire,
                 st->buf_bytes / 1048576.0, ms_cache_policy_name(o->policy));
    *out = &w->base;
    return MS_OK;
}

int ms_streaming_pack(ms_model *m, const char *out_dir, const char *const *dirs, int n_dirs, ms_pack_stats *stats,
                      ms_err *err) {
    return ms_streaming_pack_progress(m, out_dir, dirs, n_dirs, NULL, stats, err);
}

int ms_streaming_pack_progress(ms_model *m, const char *out_dir, const char *const *dirs, int n_dirs,
                               const ms_progress *progress, ms_pack_stats *stats, ms_err *err) {
    ms_expert_store st;
    int rc = store_of_model(m, &st, err);
    if (rc) return rc;
    rc = ms_expert_pack_progress(&m->ck, &st, out_dir, dirs, n_dirs, progress, stats, err);
    ms_expert_store_free(&st);
    return rc;
}

typedef struct { int file; uint64_t a, b; } range_t;
static int cmp_range(const void *x, const void *y) {
    const range_t *p = x, *q = y;
    if (p->file != q->file) return p->file < q->file ? -1 : 1;
    return p->a < q->a ? -1 : p->a > q->a;
}

void ms_streaming_prefault_static(ms_model *m, const ms_expert_source *s) {
    const wrap_src *w = (const wrap_src *)s;
    const ms_expert_store *st = &w->ck_store;
    size_t n = 0, cap = (size_t)st->n_layers * st->n_experts * st->n_roles;
    range_t *r = malloc((cap ? cap : 1) * sizeof *r);
    if (!r) return;
    for (int li = 0; li < st->n_layers; li++)
        for (int e = 0; e < st->n_experts; e++) {
            const ms_expert_loc *l = ms_expert_store_loc(st, li, e);
            for (int k = 0; k < st->n_roles; k++) {
                if (l->role_piece[k] < 0) continue;
                const ms_extent *p = &l->piece[l->role_piece[k]];
                uint64_t a = p->offset + l->role_off[k];
                r[n++] = (range_t){p->file, a, a + ms_expert_store_role(st, li, k)->nbytes};
            }
        }
    qsort(r, n, sizeof *r, cmp_range);
    for (int i = 0; i < m->ck.n_tensors; i++) {
        const ms_tensor *t = &m->ck.tensors[i];
        const volatile uint8_t *base = m->ck.files[t->file].map.data;
        if (!base || !t->nbytes) continue;
        /* skip tensors overlapping an expert extent: binary search the first range ending after t */
        size_t lo = 0, hi = n;
        range_t key = {t->file, t->offset, 0};
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (cmp_range(&r[mid], &key) < 0) lo = mid + 1;
            else hi = mid;
        }
        int hit = 0;
        for (size_t j = lo > 0 ? lo - 1 : 0; j < n && j <= lo + 1 && !hit; j++)
            hit = r[j].file == t->file && r[j].a < t->offset + t->nbytes && r[j].b > t->offset;
        if (hit) continue;
        uint8_t acc = 0;
        for (uint64_t o = 0; o < t->nbytes; o += 4096) acc ^= base[t->offset + o];
        acc ^= base[t->offset + t->nbytes - 1];
        (void)acc;
    }
    free(r);
}

static void drop_file(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

void ms_streaming_drop_page_cache(ms_model *m, const ms_expert_source *s) {
    const wrap_src *w = (const wrap_src *)s;
    for (int i = 0; i < m->ck.n_files; i++) {
        const ms_mapping *mp = &m->ck.files[i].map;
        /* pages mapped by this process stay; drop what the kernel may. Not after --static-load
         * read: parts of the mapping are then anonymous copies, which MADV_DONTNEED would zero */
        if (mp->data && mp->size && !m->static_copied) madvise((void *)mp->data, mp->size, MADV_DONTNEED);
        drop_file(m->ck.files[i].path);
    }
    if (w->use_packed)
        for (int i = 0; i < w->packed.n_files; i++) drop_file(w->packed.paths[i]);
}

const char *ms_streaming_largest_file(const ms_expert_source *s) {
    const wrap_src *w = (const wrap_src *)s;
    const ms_expert_store *st = w->use_packed ? &w->packed : &w->ck_store;
    const char *best = NULL;
    off_t bs = -1;
    for (int i = 0; i < st->n_files; i++) {
        struct stat sb;
        if (stat(st->paths[i], &sb) == 0 && sb.st_size > bs) {
            bs = sb.st_size;
            best = st->paths[i];
        }
    }
    return best;
}
