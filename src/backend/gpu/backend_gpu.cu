/* backend_gpu.cu — the device-resident GPU backend (contract in backend_gpu.h
 * and core/backend.h): memory, weight placement and the ops of GQA, MLA and
 * MoE models on one device and one stream. The matmul, RMSNorm, router and GQA
 * attention kernels are gpu.h's; the rest are here. Every name of the runtime
 * goes through gpu_port.h, so hipcc compiles this file too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <type_traits>

#include "backend/gpu/gpu_internal.h"
#include "backend/gpu/rope_head.h"
extern "C" {
#include "backend/cpu/backend_cpu.h" /* ms_route_host: the router kinds the device kernel lacks */
}
#include "backend/gpu/backend_gpu.h"
#include "backend/gpu/attn_mla.h"
#include "backend/gpu/backend_gpu_blocks.h" /* the linear / sparse / compressed attention and mHC ops */
#include "backend/gpu/backend_gpu_step.h"   /* the replayable decode step's ops */
#include "backend/gpu/gemm.h"               /* prefill GEMMs through the vendor BLAS */
#include "backend/gpu/attn_prefill.h"       /* tiled prefill attention */

#define ARENA_CHUNK ((size_t)256 << 20) /* placed weights: one device allocation per 256 MiB */
#define ROW_BATCH 256                   /* host rows / weights / token ids per launch (kernel arguments) */
#define ATT_TOK 16                      /* query tokens per attention launch (bounds the split scratch) */
#define MLA_MAXL 1024                   /* latent width the MLA kernels hold per warp */
#define MLA_WARPS 4
#define ROPE_SLOTS 4 /* RoPE tables kept on the device (layer_rope alternates two) */
#define RX_CALL_MAX 32 /* experts of a per-call routed table (moe_experts_routed per_call; K <= 32 there) */

typedef struct {
    uint8_t *base;
    size_t size, used;
} arena_chunk;

typedef struct gpu_backend {
    ms_backend base;
    ms_backend_ops ops;
    ms_gpu *g;
    arena_chunk *chunks;
    int n_chunks, cap_chunks;
    float *attn_scr; /* split-K partials of ATT_TOK tokens */
    size_t attn_cap; /* floats */
    float *work;     /* MLA and in-place temporaries */
    size_t work_cap; /* floats */
    void *idx;       /* host index arrays copied up (MLA selections) */
    size_t idx_cap;
    float *rope_inv; /* [ROPE_SLOTS][512] device copies of the RoPE tables seen last */
    float rope_host[ROPE_SLOTS][512];
    int rope_half[ROPE_SLOTS], rope_next;
    float *host;     /* host scratch (routing on the host) */
    size_t host_cap; /* floats */
    int failed;      /* an earlier op failed: reported by the next sync / download */
    ms_err fail;
    void *blocks;    /* backend_gpu_blocks.cu's state */
    void *gemm;      /* gemm.cu's state (BLAS handle, scratch, thresholds) */
    /* moe_experts_routed: device tables of the layers' resident experts, keyed by the host array */
    struct rx_table *rx;
    int n_rx, cap_rx;
    struct ms_gpu_ex_ptrs *rx_call; /* [RX_CALL_MAX] the per-call table (streamed experts), arena memory */
    float *rx_scr;
    size_t rx_cap;
    void *pin; /* page-locked download staging (PIN_BYTES) */
    int pin_failed;
    /* per-op profile (ms_backend_gpu_profile): the ops as filled, events around each outermost op */
    ms_backend_ops orig;
    int prof, prof_depth, prof_n;
    int64_t prof_stall; /* MS_GPU_PROFILE_STALL_US at profile start, as clock cycles (2 per ns): 0 none */
    double prof_t0;
    gpuEvent_t *prof_ev, prof_start;
    int *prof_cls;
    struct prof_class *prof_classes;
    int prof_nc;
    ms_gpu_step_state step; /* the replayable decode step (backend_gpu_step.h) */
    int mla_old; /* MS_GPU_MLA=old at creation: MLA decode through the one-block-per-head kernel (A/B) */
} gpu_backend;

static gpu_backend *gb(ms_backend *be) { return (gpu_backend *)be->impl; }

/* Remember the first failure of a void op. */
static void note(gpu_backend *b, int rc, const ms_err *e) {
    if (rc && !b->failed) {
        b->failed = 1;
        b->fail = *e;
    }
}
static void launched(gpu_backend *b, const char *what) {
    ms_err e = {0};
    note(b, ms_gpu_launched(&e, what), &e);
}
static int report(gpu_backend *b, ms_err *err) {
    if (!b->failed) return MS_OK;
    if (err) *err = b->fail;
    return b->fail.code ? b->fail.code : MS_ERR_UNSUPPORTED;
}

/* for backend_gpu_blocks.cu (backend_gpu_blocks.h) */
ms_gpu *ms_gpu_be_dev(ms_backend *be) { return gb(be)->g; }
void ms_gpu_be_note(ms_backend *be, int rc, const ms_err *e) { note(gb(be), rc, e); }
int ms_gpu_be_report(ms_backend *be, ms_err *err) { return report(gb(be), err); }
void **ms_gpu_be_blocks(ms_backend *be) { return &gb(be)->blocks; }
void **ms_gpu_be_gemm(ms_backend *be) { return &gb(be)->gemm; }
/* for backend_gpu_step.cu (backend_gpu_step.h) */
ms_gpu_step_state *ms_gpu_be_step(ms_backend *be) { return &gb(be)->step; }
int ms_gpu_be_profiling(ms_backend *be) { return gb(be)->prof; }
void ms_gpu_be_fail_state(ms_backend *be, int **failed, ms_err **fail) { *failed = &gb(be)->failed, *fail = &gb(be)->fail; }

static unsigned blocks_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* Device scratch of at least `floats` (grown; the old contents are not kept). */
static int grow(gpu_backend *b, float **p, size_t *cap, size_t floats, ms_err *err) {
    if (*cap >= floats) return MS_OK;
    if (b->step.capturing) /* a recorded graph would keep the old address */
        return ms_fail(err, MS_ERR_LIMIT, "gpu: device scratch grows during a recorded step");
    b->step.gen++;
    if (*p) ms_gpu_free(b->g, *p);
    *p = NULL;
    *cap = 0;
    void *q;
    int rc = ms_gpu_alloc(b->g, floats * 4, &q, err);
    if (rc) return rc;
    *p = (float *)q;
    *cap = floats;
    return MS_OK;
}

/* ------------------------------------------------------------ profile */

/* With profiling on (ms_backend_gpu_profile), every outermost op of the table is
 * bracketed by two events on the stream; elapsed times are summed per op at the
 * next harvest (a full event pool, or ms_backend_gpu_profile_json). Ops that an op
 * calls through the table (moe_experts composed of matmuls) count as the outer op. */
#define PROF_PAIRS 8192
#define PROF_CLASSES 64
typedef struct prof_class {
    const char *name;
    double ms, host_s; /* device time between the op's events; host time inside the op's call */
    uint64_t calls;
} prof_class;
static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static const char *g_op_names[sizeof(ms_backend_ops) / sizeof(void *)];

static void prof_harvest(gpu_backend *b) {
    if (!b->prof_n) return;
    (void)gpuEventSynchronize(b->prof_ev[2 * b->prof_n - 1]);
    for (int i = 0; i < b->prof_n; i++) {
        float ms = 0;
        if (gpuEventElapsedTime(&ms, b->prof_ev[2 * i], b->prof_ev[2 * i + 1]) != gpuSuccess) {
            (void)gpuGetLastError();
            continue;
        }
        prof_class *c = &b->prof_classes[b->prof_cls[i]];
        c->ms += ms;
        c->calls++;
    }
    b->prof_n = 0;
}
/* Spins ~cycles clock cycles (the stall before each profiled token, below). */
__global__ void k_spin(int64_t cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}
static int prof_class_of(gpu_backend *b, const char *name);
static int prof_begin(gpu_backend *b, size_t off) {
    if (b->prof_depth++ || !b->prof) return -1;
    const char *name = g_op_names[off / sizeof(void *)];
    /* a stalled profile (MS_GPU_PROFILE_STALL_US): each token's first op (the embedding) waits
     * behind a spin on the device, so the host queues the token's ops meanwhile and the events
     * time device work alone, not the host's launches; the spins have their own class "stall" */
    if (b->prof_stall && (!strcmp(name, "embed") || !strcmp(name, "embed_at"))) {
        int sc = prof_class_of(b, "stall");
        if (sc >= 0) {
            if (b->prof_n == PROF_PAIRS) prof_harvest(b);
            int i = b->prof_n++;
            b->prof_cls[i] = sc;
            (void)gpuEventRecord(b->prof_ev[2 * i], b->g->stream);
            k_spin<<<1, 1, 0, b->g->stream>>>(b->prof_stall);
            (void)gpuEventRecord(b->prof_ev[2 * i + 1], b->g->stream);
        }
    }
    int c = prof_class_of(b, name);
    if (c < 0) return -1;
    if (b->prof_n == PROF_PAIRS) prof_harvest(b);
    int i = b->prof_n++;
    b->prof_cls[i] = c;
    b->prof_t0 = prof_now();
    (void)gpuEventRecord(b->prof_ev[2 * i], b->g->stream);
    return i;
}
/* The class of an op name (names are the table's string literals; "stall" compared by value), -1 when full. */
static int prof_class_of(gpu_backend *b, const char *name) {
    int c = 0;
    while (c < b->prof_nc && b->prof_classes[c].name != name && strcmp(b->prof_classes[c].name, name)) c++;
    if (c == b->prof_nc) {
        if (c == PROF_CLASSES) return -1;
        b->prof_classes[b->prof_nc++] = (prof_class){name, 0, 0, 0};
    }
    return c;
}
static void prof_end(gpu_backend *b, int i) {
    b->prof_depth--;
    if (i < 0) return;
    (void)gpuEventRecord(b->prof_ev[2 * i + 1], b->g->stream);
    b->prof_classes[b->prof_cls[i]].host_s += prof_now() - b->prof_t0;
}
static void prof_free(gpu_backend *b) {
    if (b->prof_ev)
        for (int i = 0; i < 2 * PROF_PAIRS; i++) (void)gpuEventDestroy(b->prof_ev[i]);
    if (b->prof_start) (void)gpuEventDestroy(b->prof_start);
    free(b->prof_ev);
    free(b->prof_cls);
    free(b->prof_classes);
    b->prof_ev = NULL;
}

/* The wrapper of the op at offset OFF of the table: the op as filled (b->orig), timed. */
template <size_t OFF, typename F> struct prof_wrap;
template <size_t OFF, typename R, typename... A> struct prof_wrap<OFF, R (*)(ms_backend *, A...)> {
    typedef R (*fn_t)(ms_backend *, A...);
    static R call(ms_backend *be, A... args) {
        gpu_backend *b = (gpu_backend *)be->impl;
        fn_t f = *(const fn_t *)((const char *)&b->orig + OFF);
        int i = prof_begin(b, OFF);
        if constexpr (std::is_void<R>::value) {
            f(be, args...);
            prof_end(b, i);
        } else {
            R r = f(be, args...);
            prof_end(b, i);
            return r;
        }
    }
};
#define PROF_WRAP(field)                                                                                            \
    do {                                                                                                           \
        if (o->field) {                                                                                            \
            g_op_names[offsetof(ms_backend_ops, field) / sizeof(void *)] = #field;                                 \
            o->field = prof_wrap<offsetof(ms_backend_ops, field), decltype(o->field)>::call;                        \
        }                                                                                                          \
    } while (0)

/* Every op that enqueues device work, wrapped (b->orig keeps the table as filled). */
static void prof_wrap_ops(gpu_backend *b) {
    ms_backend_ops *o = &b->ops;
    b->orig = *o;
    PROF_WRAP(upload); PROF_WRAP(download); PROF_WRAP(copy); PROF_WRAP(zero); PROF_WRAP(copy_rows);
    PROF_WRAP(matmul); PROF_WRAP(matmul_many); PROF_WRAP(rmsnorm); PROF_WRAP(add_bias); PROF_WRAP(add);
    PROF_WRAP(scale); PROF_WRAP(mul_sigmoid); PROF_WRAP(rope); PROF_WRAP(glu); PROF_WRAP(embed);
    PROF_WRAP(attn_gqa); PROF_WRAP(attn_mla); PROF_WRAP(route); PROF_WRAP(router_route); PROF_WRAP(gather_rows);
    PROF_WRAP(scatter_add_rows); PROF_WRAP(scale_add_rows); PROF_WRAP(add_bias_any); PROF_WRAP(split_gate_up); PROF_WRAP(add_gated_rows);
    PROF_WRAP(moe_experts); PROF_WRAP(moe_experts_routed); PROF_WRAP(add_rmsnorm); PROF_WRAP(qk_norm_rope); PROF_WRAP(kda_forward); PROF_WRAP(gdn_forward);
    PROF_WRAP(dsa_index); PROF_WRAP(dsa_recheck); PROF_WRAP(compress_append); PROF_WRAP(attn_compressed);
    PROF_WRAP(mhc_pre); PROF_WRAP(mhc_post); PROF_WRAP(mhc_expand); PROF_WRAP(mhc_head_mean);
    PROF_WRAP(mhc_head_weighted); PROF_WRAP(attn_res_mix); PROF_WRAP(embed_at); PROF_WRAP(qkv_at);
    PROF_WRAP(qkv_attn_at); PROF_WRAP(argmax); PROF_WRAP(argmax_step);
}

/* ------------------------------------------------------------ memory */

static int g_alloc(ms_backend *be, size_t bytes, void **out, ms_err *err) {
    gpu_backend *b = gb(be);
    int rc = ms_gpu_alloc(b->g, bytes ? bytes : 16, out, err);
    if (!rc) rc = ms_gpu_zero(b->g, *out, bytes ? bytes : 16, err);
    return rc;
}
static void g_free(ms_backend *be, void *p) {
    if (p) ms_gpu_free(gb(be)->g, p);
}
static int g_upload(ms_backend *be, void *dst, const void *src, size_t bytes, ms_err *err) {
    return ms_gpu_upload(gb(be)->g, dst, src, bytes, err);
}
#define PIN_BYTES ((size_t)8 << 20) /* page-locked staging of downloads up to this size (the logits) */
static int g_download(ms_backend *be, void *dst, const void *src, size_t bytes, ms_err *err) {
    gpu_backend *b = gb(be);
    if (bytes && bytes <= PIN_BYTES && !b->pin_failed) { /* through page-locked memory: the DMA at full speed */
        ms_err e = {0};
        if (!b->pin && ms_gpu_alloc_host(b->g, PIN_BYTES, &b->pin, &e)) b->pin = NULL, b->pin_failed = 1;
        if (b->pin) {
            int rc = ms_gpu_download(b->g, b->pin, src, bytes, err);
            if (rc) return rc;
            memcpy(dst, b->pin, bytes);
            return report(b, err);
        }
    }
    int rc = ms_gpu_download(b->g, dst, src, bytes, err);
    return rc ? rc : report(b, err);
}
static void g_copy(ms_backend *be, void *dst, const void *src, size_t bytes) {
    ms_err e = {0};
    if (bytes && dst != src) note(gb(be), ms_gpu_copy(gb(be)->g, dst, src, bytes, &e), &e);
}
static void g_zero(ms_backend *be, void *dst, size_t bytes) {
    ms_err e = {0};
    note(gb(be), ms_gpu_zero(gb(be)->g, dst, bytes, &e), &e);
}

__global__ void k_copy_rows(float *dst, int64_t ds, const float *src, int64_t ss, int64_t rows, int64_t width) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
        for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[r * ds + i] = src[r * ss + i];
}
static void g_copy_rows(ms_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                        int64_t rows, int64_t width) {
    gpu_backend *b = gb(be);
    if (rows < 1 || width < 1) return;
    /* the rows overlap each other (compaction in place): through a temporary, as the CPU's row-by-row memmove */
    const float *s_lo = src, *s_hi = src + (rows - 1) * src_stride + width;
    const float *d_lo = dst, *d_hi = dst + (rows - 1) * dst_stride + width;
    if (s_lo < d_hi && d_lo < s_hi && !(dst == src && dst_stride == src_stride)) {
        ms_err e = {0};
        int rc = grow(b, &b->work, &b->work_cap, (size_t)(rows * width), &e);
        if (rc) return note(b, rc, &e);
        k_copy_rows<<<blocks_for(rows, 1), 128, 0, b->g->stream>>>(b->work, width, src, src_stride, rows, width);
        k_copy_rows<<<blocks_for(rows, 1), 128, 0, b->g->stream>>>(dst, dst_stride, b->work, width, rows, width);
    } else if (dst != src) {
        k_copy_rows<<<blocks_for(rows, 1), 128, 0, b->g->stream>>>(dst, dst_stride, src, src_stride, rows, width);
    }
    launched(b, "copy_rows");
}

static int g_sync(ms_backend *be, ms_err *err) {
    gpu_backend *b = gb(be);
    int rc = ms_gpu_sync(b->g, err);
    return rc ? rc : report(b, err);
}

/* Optional ops: page-locked host staging (the streaming source's host cache) and free memory. */
static int g_host_register(ms_backend *be, void *p, size_t bytes, ms_err *err) {
    (void)be;
    if (!p || !bytes) return MS_OK;
    gpuError_t e = gpuHostRegister(p, bytes, gpuHostRegisterDefault);
#ifdef gpuHostRegisterReadOnly
    if (e != gpuSuccess) { /* a read-only mapping (PROT_READ: the mapped checkpoint) pins read-only */
        (void)gpuGetLastError();
        e = gpuHostRegister(p, bytes, gpuHostRegisterReadOnly);
    }
#endif
    if (e != gpuSuccess) {
        (void)gpuGetLastError();
        return ms_fail(err, MS_ERR_NOMEM, "gpu (%s): page-locking %.1f MiB of host staging: %s", MS_GPU_BACKEND_NAME,
                       bytes / 1048576.0, gpuGetErrorString(e));
    }
    return MS_OK;
}
static void g_host_unregister(ms_backend *be, void *p) {
    (void)be;
    if (p && gpuHostUnregister(p) != gpuSuccess) (void)gpuGetLastError();
}
static int g_mem_info(ms_backend *be, uint64_t *free_bytes, uint64_t *total_bytes, ms_err *err) {
    size_t f = 0, t = 0;
    int rc = ms_gpu_check(gpuMemGetInfo(&f, &t), err, "reading free memory");
    if (!rc) *free_bytes = f, *total_bytes = t;
    return rc;
}

/* Placed weights: bump allocation in chunks (never freed one by one). */
static int arena_get(gpu_backend *b, size_t bytes, void **out, ms_err *err) {
    bytes = (bytes + 255) & ~(size_t)255;
    arena_chunk *c = b->n_chunks ? &b->chunks[b->n_chunks - 1] : NULL;
    if (!c || c->used + bytes > c->size) {
        if (b->n_chunks == b->cap_chunks) {
            int nc = b->cap_chunks ? 2 * b->cap_chunks : 64;
            arena_chunk *na = (arena_chunk *)realloc(b->chunks, (size_t)nc * sizeof *na);
            if (!na) return ms_fail(err, MS_ERR_NOMEM, "out of host memory");
            b->chunks = na;
            b->cap_chunks = nc;
        }
        size_t sz = bytes > ARENA_CHUNK ? bytes : ARENA_CHUNK;
        void *p = NULL;
        int rc = ms_gpu_alloc(b->g, sz, &p, err);
        if (rc) return ms_wrap(err, "placing weights (%.1f MiB placed so far)", (double)(b->n_chunks * ARENA_CHUNK) / 1048576.0);
        c = &b->chunks[b->n_chunks++];
        c->base = (uint8_t *)p, c->size = sz, c->used = 0;
    }
    *out = c->base + c->used;
    c->used += bytes;
    return MS_OK;
}

static size_t qmat_data_bytes(const ms_qmat *w) {
    return (size_t)((uint64_t)w->rows * (uint64_t)w->cols * (uint64_t)ms_gpu_dtype_bits(w->dtype) / 8);
}
static size_t qmat_scale_bytes(const ms_qmat *w) {
    if (!w->scale) return 0;
    int64_t sr = (w->rows + w->brow - 1) / w->brow, sc = (w->cols + w->bcol - 1) / w->bcol;
    return (size_t)(sr * sc * (ms_gpu_dtype_bits(w->scale_dtype) / 8));
}

/* An I4 view's packed zero points (core/qmat.h), 0 without. */
static size_t qmat_zero_bytes(const ms_qmat *w) {
    if (w->dtype != MS_DT_I4 || !w->zero || w->bcol < 1) return 0;
    return (size_t)(((w->rows + 7) / 8) * ((w->cols + w->bcol - 1) / w->bcol) * 4);
}

static int g_place_qmat(ms_backend *be, const ms_qmat *host, ms_qmat *out, ms_err *err) {
    gpu_backend *b = gb(be);
    int rc = ms_gpu_qmat_check(host, "placing a weight", err);
    if (rc) return rc;
    size_t db = qmat_data_bytes(host), sb = qmat_scale_bytes(host), zb = qmat_zero_bytes(host);
    void *d = NULL, *s = NULL, *z = NULL;
    if ((rc = arena_get(b, db + 16, &d, err)) || (sb && (rc = arena_get(b, sb + 16, &s, err))) ||
        (zb && (rc = arena_get(b, zb + 16, &z, err))))
        return rc;
    if ((rc = ms_gpu_upload(b->g, d, host->data, db, err)) || (sb && (rc = ms_gpu_upload(b->g, s, host->scale, sb, err))) ||
        (zb && (rc = ms_gpu_upload(b->g, z, host->zero, zb, err))))
        return rc;
    *out = *host;
    out->data = d;
    out->scale = sb ? s : NULL;
    out->zero = zb ? z : NULL;
    return MS_OK;
}
static int g_place_vec(ms_backend *be, const float *host, int64_t n, const float **out, ms_err *err) {
    gpu_backend *b = gb(be);
    void *d = NULL;
    int rc = arena_get(b, (size_t)(n > 0 ? n : 1) * 4, &d, err);
    if (!rc) rc = ms_gpu_upload(b->g, d, host, (size_t)n * 4, err);
    if (!rc) *out = (const float *)d;
    return rc;
}

static void g_destroy(ms_backend *be) {
    if (!be) return;
    gpu_backend *b = gb(be);
    if (b->g) {
        ms_err e = {0};
        (void)ms_gpu_sync(b->g, &e);
        ms_gpu_blocks_free(be);
        ms_gpu_gemm_free(be);
        for (int i = 0; i < b->n_chunks; i++) ms_gpu_free(b->g, b->chunks[i].base);
        ms_gpu_free(b->g, b->attn_scr);
        ms_gpu_free(b->g, b->work);
        ms_gpu_free(b->g, b->idx);
        ms_gpu_free(b->g, b->rope_inv);
        ms_gpu_free(b->g, b->rx_scr);
        if (b->pin) ms_gpu_free_host(b->g, b->pin);
        prof_free(b);
        ms_gpu_close(b->g);
    }
    free(b->rx);
    free(b->chunks);
    free(b->host);
    free(b);
}

/* ---------------------------------------------------------- planning */

static size_t attn_floats(const ms_config *c) {
    int64_t vd = c->head_dim > c->v_head_dim ? c->head_dim : c->v_head_dim;
    ms_gpu_attn_cfg a = {(int)(c->n_heads > 0 ? c->n_heads : 1), 1, 4, (int)(vd > 0 ? vd : 1), 0, 1.0f};
    return ms_gpu_attn_scratch_floats(ATT_TOK, &a);
}
static uint64_t g_workspace_bytes(const ms_backend *be, const ms_config *c, int64_t max_ctx, int64_t max_batch) {
    return (uint64_t)attn_floats(c) * 4;
}
static int g_reserve(ms_backend *be, const ms_config *c, int64_t max_ctx, int64_t max_batch, ms_err *err) {
    gpu_backend *b = gb(be);
    return grow(b, &b->attn_scr, &b->attn_cap, attn_floats(c), err);
}

/* ---------------------------------------------------------- dense math */

static void g_matmul(ms_backend *be, float *y, const float *x, int n, const ms_qmat *w, int acc) {
    if (ms_gpu_gemm_matmul(be, y, x, n, w, acc)) return; /* prefill: the GEMM (gemm.cu) */
    ms_err e = {0};
    note(gb(be), ms_gpu_matmul(gb(be)->g, y, x, n, w, acc, &e), &e);
}
static void g_matmul_many(ms_backend *be, const ms_matmul_job *jobs, int count) {
    if (ms_gpu_gemm_matmul_many(be, jobs, count)) return;
    ms_err e = {0};
    note(gb(be), ms_gpu_matmul_many(gb(be)->g, jobs, count, &e), &e);
}
static void g_rmsnorm(ms_backend *be, float *y, const float *x, const float *w, int64_t rows, int64_t d, float eps) {
    ms_err e = {0};
    if (rows > 0) note(gb(be), ms_gpu_rmsnorm(gb(be)->g, y, x, w, (int)rows, (int)d, eps, &e), &e);
}

/* x += y, then xn = rmsnorm(x) * w (as ops.cu's rmsnorm kernel); one block of 256 threads per row */
__global__ void k_add_rmsnorm(float *x, const float *y, float *xn, const float *w, int64_t d, float eps) {
    __shared__ float sh[256 / MS_WARP];
    float *xr = x + (int64_t)blockIdx.x * d, *nr = xn + (int64_t)blockIdx.x * d;
    const float *yr = y + (int64_t)blockIdx.x * d;
    ms_pdl_launch();
    ms_pdl_wait();
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float v = xr[i] + yr[i];
        xr[i] = v;
        ss = fmaf(v, v, ss);
    }
    ss = ms_warp_sum(ss);
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP, nw = blockDim.x / MS_WARP;
    if (lane == 0) sh[warp] = ss;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < nw; i++) t += sh[i];
    float inv = 1.0f / sqrtf(t / (float)d + eps);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) nr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
}
/* The same in registers: rows of d = 4 NV blockDim floats at most, 16-byte aligned; each
 * thread holds NV float4 of the row (one load of x, y and w each, no second pass over x). */
template <int NV>
__global__ void __launch_bounds__(512) k_add_rmsnorm_reg(float *__restrict__ x, const float *__restrict__ y,
                                                         float *__restrict__ xn, const float *__restrict__ w, int64_t d,
                                                         float eps) {
    __shared__ float sh[512 / MS_WARP];
    float4 *xr = (float4 *)(x + (int64_t)blockIdx.x * d), *nr = (float4 *)(xn + (int64_t)blockIdx.x * d);
    const float4 *yr = (const float4 *)(y + (int64_t)blockIdx.x * d);
    const int n4 = (int)(d / 4);
    float4 v[NV], wv[NV];
    float ss = 0.0f;
    ms_pdl_launch();
#pragma unroll
    for (int k = 0; k < NV; k++) { /* the norm's weights (no kernel's output) before the wait */
        int i = threadIdx.x + k * blockDim.x;
        wv[k] = w && i < n4 ? ((const float4 *)w)[i] : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    }
    ms_pdl_wait();
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < n4) {
            float4 a = xr[i], b = yr[i];
            v[k] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        } else {
            v[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
#pragma unroll
    for (int k = 0; k < NV; k++) { /* element order of the loop kernel within a thread */
        int i = threadIdx.x + k * blockDim.x;
        if (i < n4) xr[i] = v[k];
        ss = fmaf(v[k].x, v[k].x, ss), ss = fmaf(v[k].y, v[k].y, ss);
        ss = fmaf(v[k].z, v[k].z, ss), ss = fmaf(v[k].w, v[k].w, ss);
    }
    ss = ms_warp_sum(ss);
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP, nw = blockDim.x / MS_WARP;
    if (lane == 0) sh[warp] = ss;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < nw; i++) t += sh[i];
    float inv = 1.0f / sqrtf(t / (float)d + eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i >= n4) continue;
        nr[i] = make_float4(v[k].x * inv * wv[k].x, v[k].y * inv * wv[k].y, v[k].z * inv * wv[k].z,
                            v[k].w * inv * wv[k].w);
    }
}
static void g_add_rmsnorm(ms_backend *be, float *x, const float *y, float *xn, const float *w, int64_t rows, int64_t d,
                          float eps) {
    gpu_backend *b = gb(be);
    if (rows < 1 || d < 1) return;
    int aligned = d % 4 == 0 && ((uintptr_t)x | (uintptr_t)y | (uintptr_t)xn | (uintptr_t)w) % 16 == 0;
    int64_t n4 = d / 4;
    if (!(b->g->legacy & MS_GPU_LEG_NORM) && aligned && n4 <= 8 * 512 && x != y && xn != y && xn != x) {
        /* threads: whole warps, n4 / NV rounded up; NV the smallest of 1, 2, 4, 8 with 512 NV >= n4 */
        int nv = n4 <= 512 ? 1 : n4 <= 1024 ? 2 : n4 <= 2048 ? 4 : 8;
        int th = (int)((n4 + nv - 1) / nv);
        th = (th + 63) / 64 * 64;
        void (*k)(float *, const float *, float *, const float *, int64_t, float) =
            nv == 1 ? k_add_rmsnorm_reg<1> : nv == 2 ? k_add_rmsnorm_reg<2> : nv == 4 ? k_add_rmsnorm_reg<4> : k_add_rmsnorm_reg<8>;
        ms_launch(b->g->pdl, k, dim3((unsigned)rows), dim3(th), 0, b->g->stream, x, y, xn, w, d, eps);
    } else {
        ms_launch(b->g->pdl, k_add_rmsnorm, dim3((unsigned)rows), dim3(256), 0, b->g->stream, x, y, xn, w, d, eps);
    }
    launched(b, "add_rmsnorm");
}
__global__ void k_add_bias(float *x, const float *bias, int64_t rows, int64_t d) {
    int64_t n = rows * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += bias[i % d];
}
__global__ void k_add(float *y, const float *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}
__global__ void k_scale(float *x, float s, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}
__global__ void k_mul_sigmoid(float *x, const float *g, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= 1.0f / (1.0f + expf(-g[i]));
}
static void g_add_bias(ms_backend *be, float *x, const float *bias, int64_t rows, int64_t d) {
    if (rows * d < 1) return;
    k_add_bias<<<blocks_for(rows * d, 256), 256, 0, gb(be)->g->stream>>>(x, bias, rows, d);
    launched(gb(be), "add_bias");
}
static void g_add(ms_backend *be, float *y, const float *x, int64_t n) {
    if (n < 1) return;
    k_add<<<blocks_for(n, 256), 256, 0, gb(be)->g->stream>>>(y, x, n);
    launched(gb(be), "add");
}
static void g_scale(ms_backend *be, float *x, float s, int64_t n) {
    if (n < 1) return;
    k_scale<<<blocks_for(n, 256), 256, 0, gb(be)->g->stream>>>(x, s, n);
    launched(gb(be), "scale");
}
static void g_mul_sigmoid(ms_backend *be, float *x, const float *g, int64_t n) {
    if (n < 1) return;
    k_mul_sigmoid<<<blocks_for(n, 256), 256, 0, gb(be)->g->stream>>>(x, g, n);
    launched(gb(be), "mul_sigmoid");
}

/* RoPE as the CPU: angle (float)pos * (float)inv_freq[i], cos/sin in double times the
 * attention factor, rounded to float, sin times sign; then the pair rotation. */
__global__ void k_rope(float *x, int n, int64_t tok_stride, int64_t heads, int64_t head_stride, int64_t offset,
                       int half, int interleaved, const float *inv, double attn_factor, int64_t pos0, float sign) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, total = (int64_t)n * heads * half;
    if (idx >= total) return;
    int i = (int)(idx % half);
    int64_t th = idx / half, h = th % heads, t = th / heads;
    float ang = (float)(pos0 + t) * inv[i];
    float c = (float)(cos((double)ang) * attn_factor), s = (float)(sin((double)ang) * attn_factor);
    s = __fmul_rn(s, sign);
    float *v = x + t * tok_stride + h * head_stride + offset;
    int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    float a = v[ia], bb = v[ib];
    v[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, s));
    v[ib] = __fadd_rn(__fmul_rn(bb, c), __fmul_rn(a, s));
}
/* The device copy of r's inverse frequencies (one of ROPE_SLOTS), NULL after noting a failure. */
static const float *rope_table(gpu_backend *b, const ms_rope *r) {
    int half = r->dim / 2;
    if (half > 512) {
        ms_err e = {0};
        note(b, ms_fail(&e, MS_ERR_UNSUPPORTED, "rope: %d rotary dims (at most 1024)", r->dim), &e);
        return NULL;
    }
    float inv[512];
    for (int i = 0; i < half; i++) inv[i] = (float)r->inv_freq[i];
    int slot = -1;
    for (int i = 0; i < ROPE_SLOTS && slot < 0; i++)
        if (b->rope_half[i] == half && !memcmp(inv, b->rope_host[i], (size_t)half * 4)) slot = i;
    if (slot < 0) { /* a new table: into the next slot (the stream orders it after the kernels reading the old one) */
        ms_err e = {0};
        if (b->step.capturing) { /* a recorded graph reads the slots as they are */
            note(b, ms_fail(&e, MS_ERR_LIMIT, "gpu: a new RoPE table during a recorded step"), &e);
            return NULL;
        }
        b->step.gen++;
        slot = b->rope_next;
        b->rope_next = (b->rope_next + 1) % ROPE_SLOTS;
        int rc = ms_gpu_upload(b->g, b->rope_inv + slot * 512, inv, (size_t)half * 4, &e);
        if (!rc) rc = ms_gpu_sync(b->g, &e); /* the host table is a local */
        if (rc) {
            note(b, rc, &e);
            return NULL;
        }
        memcpy(b->rope_host[slot], inv, (size_t)half * 4);
        b->rope_half[slot] = half;
    }
    return b->rope_inv + slot * 512;
}

const float *ms_gpu_be_rope_table(ms_backend *be, const ms_rope *r) {
    return r->dim / 2 > 0 ? rope_table(gb(be), r) : gb(be)->rope_inv;
}

/* Per-head RMSNorm then RoPE of q's qh and k's kh heads (block (head, token), 128 threads):
 * rope_head.h's arithmetic (the norm as the rmsnorm kernel, the rotation as k_rope). */
__global__ void k_qk_norm_rope(float *q, int64_t qh, const float *wq, float *k, int64_t kh, const float *wk, int hd,
                               float eps, int half, int interleaved, const float *inv, double attn_factor, int64_t pos0) {
    extern __shared__ float hv[];
    __shared__ float sh[32];
    int64_t h = blockIdx.x, t = blockIdx.y;
    int isq = h < qh;
    ms_pdl_launch();
    ms_pdl_wait();
    float *v = isq ? q + (t * qh + h) * hd : k + (t * kh + (h - qh)) * hd;
    ms_head_norm_rope(v, v, hd, 1, isq ? wq : wk, eps, half, interleaved, inv, attn_factor, pos0 + t, hv, sh);
}
static void g_qk_norm_rope(ms_backend *be, const ms_rope *r, float *q, int64_t qh, const float *wq, float *k,
                           int64_t kh, const float *wk, int n, int64_t hd, float eps, int64_t pos0) {
    gpu_backend *b = gb(be);
    if (n < 1 || qh + kh < 1 || hd < 1) return;
    int half = r->dim / 2;
    if (2 * half > hd) {
        ms_err e = {0};
        return note(b, ms_fail(&e, MS_ERR_ARG, "qk_norm_rope: %d rotary dims in heads of %lld", r->dim, (long long)hd), &e);
    }
    const float *inv = half > 0 ? rope_table(b, r) : b->rope_inv;
    if (!inv) return;
    ms_launch(b->g->pdl, k_qk_norm_rope, dim3((unsigned)(qh + kh), (unsigned)n), dim3(128), (size_t)hd * 4, b->g->stream,
              q, qh, wq, k, kh, wk, (int)hd, eps, half, (int)(r->layout == MS_ROPE_INTERLEAVED), inv, r->attn_factor, pos0);
    launched(b, "qk_norm_rope");
}

static void g_rope(ms_backend *be, const ms_rope *r, float *x, int n, int64_t tok_stride, int64_t heads,
                   int64_t head_stride, int64_t offset, int64_t pos0, float sign) {
    gpu_backend *b = gb(be);
    int half = r->dim / 2;
    if (n < 1 || heads < 1 || half < 1) return;
    if (half > 512) {
        ms_err e = {0};
        return note(b, ms_fail(&e, MS_ERR_UNSUPPORTED, "rope: %d rotary dims (at most 1024)", r->dim), &e);
    }
    const float *inv = rope_table(b, r);
    if (!inv) return;
    int64_t total = (int64_t)n * heads * half;
    k_rope<<<(unsigned)((total + 255) / 256), 256, 0, b->g->stream>>>(x, n, tok_stride, heads, head_stride, offset, half,
                                                                     r->layout == MS_ROPE_INTERLEAVED, inv,
                                                                     r->attn_factor, pos0, sign);
    launched(b, "rope");
}

__global__ void k_glu(float *g, float *u, int64_t n, int situ, float limit, float alpha, float up_offset, float beta,
                      float linear_beta) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float x = g[i], y = u[i];
        if (situ) {
            float a = beta * tanhf(x / beta) * (1.0f / (1.0f + expf(-x)));
            if (linear_beta > 0) y = linear_beta * tanhf(y / linear_beta);
            g[i] = a * y;
            continue;
        }
        if (limit > 0) {
            if (x > limit) x = limit; /* NaN stays NaN, as torch.clamp */
            y = y > limit ? limit : y < -limit ? -limit : y;
            u[i] = y;
        }
        if (alpha == 1.0f && up_offset == 0.0f) g[i] = x / (1.0f + expf(-x)) * y;
        else g[i] = (y + up_offset) * x * (1.0f / (1.0f + expf(-(alpha * x))));
    }
}
static void g_glu(ms_backend *be, const ms_glu *a, float *gate, float *up, int64_t n) {
    if (n < 1) return;
    k_glu<<<blocks_for(n, 256), 256, 0, gb(be)->g->stream>>>(gate, up, n, a->kind == MS_ACT_SITU, a->limit, a->alpha,
                                                              a->up_offset, a->beta, a->linear_beta);
    launched(gb(be), "glu");
}

/* A weight element of any stored dtype, scale applied (the embedding, MLA's kv_b). */
typedef struct {
    const uint8_t *w, *s, *z; /* z: I4 zero points (NULL: symmetric) */
    int64_t cols, scols;
    int dt, sdt, brow, bcol;
} qview;
enum { QD_F32, QD_F16, QD_BF16, QD_FP8, QD_F4, QD_Q8, QD_I4 };
enum { QS_NONE, QS_F32, QS_BF16, QS_E8M0, QS_F16 };

static int qview_of(const ms_qmat *w, qview *q, ms_err *err) {
    int rc = ms_gpu_qmat_check(w, "weight", err);
    if (rc) return rc;
    q->w = (const uint8_t *)w->data, q->s = (const uint8_t *)w->scale, q->cols = w->cols;
    q->z = w->dtype == MS_DT_I4 ? (const uint8_t *)w->zero : NULL;
    q->dt = w->dtype == MS_DT_F32 ? QD_F32 : w->dtype == MS_DT_F16 ? QD_F16 : w->dtype == MS_DT_BF16 ? QD_BF16
            : w->dtype == MS_DT_F8_E4M3 ? QD_FP8 : w->dtype == MS_DT_Q8 ? QD_Q8 : w->dtype == MS_DT_I4 ? QD_I4 : QD_F4;
    q->sdt = !w->scale ? QS_NONE : w->scale_dtype == MS_DT_F32 ? QS_F32 : w->scale_dtype == MS_DT_BF16 ? QS_BF16
            : w->scale_dtype == MS_DT_F16 ? QS_F16 : QS_E8M0;
    q->brow = w->scale ? w->brow : 1, q->bcol = w->scale ? w->bcol : 1;
    q->scols = w->scale ? (w->cols + w->bcol - 1) / w->bcol : 0;
    return MS_OK;
}
static __device__ __forceinline__ float qv_at(const qview &q, int64_t r, int64_t c) {
    int64_t i = r * q.cols + c;
    float v;
    switch (q.dt) {
    case QD_F32: return ((const float *)q.w)[i];
    case QD_F16: return ms_f16_to_f32_dev(((const uint16_t *)q.w)[i]);
    case QD_BF16: return ms_bf16_to_f32_dev(((const uint16_t *)q.w)[i]);
    case QD_FP8: v = ms_fp8_e4m3_to_f32_dev(q.w[i]); break;
    case QD_Q8: v = (float)(int8_t)q.w[i]; break;
    case QD_I4: { /* core/qmat.h I4: u - uz */
        int uz = q.z ? (int)((((const uint32_t *)q.z)[(r >> 3) * q.scols + c / q.bcol] >> (4 * (r & 7))) & 15u) : 8;
        v = (float)((int)((q.w[i >> 1] >> ((i & 1) * 4)) & 15u) - uz);
        break;
    }
    default: v = ms_e2m1_to_f32((q.w[i >> 1] >> ((i & 1) * 4)) & 15u); break;
    }
    if (q.sdt != QS_NONE) {
        int64_t si = (r / q.brow) * q.scols + c / q.bcol;
        float s = q.sdt == QS_F32    ? ((const float *)q.s)[si]
                  : q.sdt == QS_BF16 ? ms_bf16_to_f32_dev(((const uint16_t *)q.s)[si])
                  : q.sdt == QS_F16  ? ms_f16_to_f32_dev(((const uint16_t *)q.s)[si])
                                     : ms_e8m0_to_f32_dev(q.s[si]);
        v *= s;
    }
    return v;
}

typedef struct {
    int32_t id[ROW_BATCH];
} ids_arg;
__global__ void k_embed(float *x, qview q, ids_arg a) {
    int t = blockIdx.x;
    for (int64_t c = threadIdx.x; c < q.cols; c += blockDim.x) x[(int64_t)t * q.cols + c] = qv_at(q, a.id[t], c);
}
static void g_embed(ms_backend *be, float *x, const ms_qmat *table, const int32_t *tokens, int n) {
    gpu_backend *b = gb(be);
    qview q;
    ms_err e = {0};
    int rc = qview_of(table, &q, &e);
    if (rc) return note(b, rc, &e);
    for (int t0 = 0; t0 < n; t0 += ROW_BATCH) {
        int k = n - t0 < ROW_BATCH ? n - t0 : ROW_BATCH;
        ids_arg a;
        memcpy(a.id, tokens + t0, (size_t)k * 4);
        k_embed<<<k, 256, 0, b->g->stream>>>(x + (int64_t)t0 * table->cols, q, a);
    }
    launched(b, "embed");
}

/* ---------------------------------------------------------- attention */

int ms_gpu_be_attn_scratch(ms_backend *be, const ms_gpu_attn_cfg *c, float **scr, ms_err *err) { /* step.h */
    gpu_backend *b = gb(be);
    int rc = grow(b, &b->attn_scr, &b->attn_cap, ms_gpu_attn_scratch_floats(ATT_TOK, c), err);
    *scr = rc ? NULL : b->attn_scr;
    return rc;
}
static int g_attn_gqa(ms_backend *be, const ms_attn_gqa_args *a, ms_err *err) {
    gpu_backend *b = gb(be);
    int rc = report(b, err);
    if (rc) return rc;
    ms_gpu_attn_cfg c = {(int)a->H, (int)a->KV, (int)a->hd, (int)a->vd, (int)a->window, a->scale};
    if ((rc = grow(b, &b->attn_scr, &b->attn_cap, ms_gpu_attn_scratch_floats(ATT_TOK, &c), err))) return rc;
    if (a->pos_dev) /* a replayable step: one token at the position in device memory, n_past its bound */
        return a->n != 1 ? ms_fail(err, MS_ERR_ARG, "attn_gqa: a device position takes one token, not %d", a->n)
                         : ms_gpu_attn_gqa_at(b->g, a->out, a->q, a->k, a->v, a->sinks, a->n_past, a->pos_dev, &c,
                                              b->attn_scr, err);
    if (ms_gpu_attn_prefill_wanted(b->g, a->n, a->n_past, &c) && /* attn_prefill.h; UNSUPPORTED: split-K below */
        (rc = ms_gpu_attn_prefill(b->g, a->out, a->q, a->k, a->v, a->sinks, a->n, a->n_past, &c, MS_GPU_FA_AUTO,
                                  err)) != MS_ERR_UNSUPPORTED)
        return rc;
    for (int t0 = 0; t0 < a->n; t0 += ATT_TOK) {
        int k = a->n - t0 < ATT_TOK ? a->n - t0 : ATT_TOK;
        rc = ms_gpu_attn_gqa(b->g, a->out + (int64_t)t0 * a->H * a->vd, a->q + (int64_t)t0 * a->H * a->hd, a->k, a->v,
                             a->sinks, k, a->n_past + t0, &c, b->attn_scr, err);
        if (rc) return rc;
    }
    return MS_OK;
}

/* MLA, absorbed: q_lat = W_UK^T q_nope per head, then the latent attention, then W_UV o_lat. */
__global__ void k_mla_qlat(float *qlat, const float *q, qview W, int64_t H, int64_t nope, int64_t qk, int64_t lora,
                           int64_t dkv) {
    extern __shared__ float qn[];
    int64_t h = blockIdx.x, t = blockIdx.y;
    for (int64_t r = threadIdx.x; r < nope; r += blockDim.x) qn[r] = q[(t * H + h) * qk + r];
    __syncthreads();
    for (int64_t c = blockIdx.z * blockDim.x + threadIdx.x; c < lora; c += blockDim.x * gridDim.z) {
        float acc = 0, wv[16];
        int64_t r = 0;
        for (; r + 16 <= nope; r += 16) { /* 16 loads in flight, then the sum in the same order */
#pragma unroll
            for (int j = 0; j < 16; j++) wv[j] = qv_at(W, h * dkv + r + j, c);
#pragma unroll
            for (int j = 0; j < 16; j++) acc = fmaf(qn[r + j], wv[j], acc);
        }
        for (; r < nope; r++) acc = fmaf(qn[r], qv_at(W, h * dkv + r, c), acc);
        qlat[(t * H + h) * lora + c] = acc;
    }
}

typedef struct {
    float *olat;
    const float *qlat, *q, *latent;
    const int32_t *sel, *sel_count;
    int64_t sel_width, n_past, t0, H, lora, rope, nope, qk;
    float scale;
} mla_attn_args;

/* One (head, token) per block: warps take keys in turn with a running softmax each,
 * then merge. Lane j holds latent columns j, j + W, ... of its warp's sum. */
__global__ void __launch_bounds__(MLA_WARPS *MS_WARP) k_mla_attn(const mla_attn_args a) {
    extern __shared__ float sh[];
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    int64_t h = blockIdx.x, tl = blockIdx.y, t = a.t0 + tl, lw = a.lora + a.rope;
    float *qs = sh, *wm = qs + lw, *wl = wm + MLA_WARPS, *wacc = wl + MLA_WARPS;
    for (int64_t i = threadIdx.x; i < a.lora; i += blockDim.x) qs[i] = a.qlat[(tl * a.H + h) * a.lora + i];
    for (int64_t i = threadIdx.x; i < a.rope; i += blockDim.x) qs[a.lora + i] = a.q[(t * a.H + h) * a.qk + a.nope + i];
    __syncthreads();
    int64_t p = a.n_past + t, cnt = a.sel ? a.sel_count[t] : p + 1;
    const int32_t *sel = a.sel ? a.sel + t * a.sel_width : NULL;
    float m = -INFINITY, l = 0, o[MLA_MAXL / MS_WARP];
#pragma unroll
    for (int j = 0; j < MLA_MAXL / MS_WARP; j++) o[j] = 0;
    for (int64_t si = warp; si < cnt; si += MLA_WARPS) {
        const float *row = a.latent + (sel ? (int64_t)sel[si] : si) * lw;
        float part = 0;
        for (int64_t c = lane; c < lw; c += MS_WARP) part = fmaf(qs[c], row[c], part);
        float sc = ms_warp_sum(part) * a.scale;
        float mn = sc > m ? sc : m, f = m == -INFINITY ? 0.0f : expf(m - mn), pw = expf(sc - mn);
        l = l * f + pw;
#pragma unroll
        for (int j = 0; j < MLA_MAXL / MS_WARP; j++) {
            int64_t c = lane + (int64_t)j * MS_WARP;
            if (c < a.lora) o[j] = o[j] * f + pw * row[c];
        }
        m = mn;
    }
    if (lane == 0) wm[warp] = m, wl[warp] = l;
#pragma unroll
    for (int j = 0; j < MLA_MAXL / MS_WARP; j++) {
        int64_t c = lane + (int64_t)j * MS_WARP;
        if (c < a.lora) wacc[warp * a.lora + c] = o[j];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < MLA_WARPS; w++) M = wm[w] > M ? wm[w] : M;
    float den = 0, fw[MLA_WARPS];
    for (int w = 0; w < MLA_WARPS; w++) {
        fw[w] = wm[w] == -INFINITY ? 0.0f : expf(wm[w] - M);
        den += fw[w] * wl[w];
    }
    float inv = den > 0 ? 1.0f / den : 0.0f;
    for (int64_t c = threadIdx.x; c < a.lora; c += blockDim.x) {
        float s = 0;
        for (int w = 0; w < MLA_WARPS; w++) s += fw[w] * wacc[w * a.lora + c];
        a.olat[(tl * a.H + h) * a.lora + c] = s * inv;
    }
}

__global__ void k_mla_out(float *out, const float *olat, qview W, int64_t t0, int64_t H, int64_t nope, int64_t vd,
                          int64_t lora, int64_t dkv) {
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP, nw = blockDim.x / MS_WARP;
    int64_t h = blockIdx.x, tl = blockIdx.y;
    const float *ol = olat + (tl * H + h) * lora;
    for (int64_t i = blockIdx.z * nw + warp; i < vd; i += nw * gridDim.z) { /* z: slices of the rows */
        float part = 0, wv[8];
        int64_t c = lane;
        for (; c + 7 * MS_WARP < lora; c += 8 * MS_WARP) { /* 8 loads in flight, the same order */
#pragma unroll
            for (int j = 0; j < 8; j++) wv[j] = qv_at(W, h * dkv + nope + i, c + j * MS_WARP);
#pragma unroll
            for (int j = 0; j < 8; j++) part = fmaf(wv[j], ol[c + j * MS_WARP], part);
        }
        for (; c < lora; c += MS_WARP) part = fmaf(qv_at(W, h * dkv + nope + i, c), ol[c], part);
        part = ms_warp_sum(part);
        if (lane == 0) out[((t0 + tl) * H + h) * vd + i] = part;
    }
}

/* MLA, expanded: per cached position, K = [W_UK c, k_pe] and V = W_UV c for every head. */
__global__ void k_mla_assemble(float *K, float *V, const float *kvf, const float *latent, int64_t H, int64_t nope,
                               int64_t rope, int64_t vd, int64_t lora) {
    int64_t s = blockIdx.x, dkv = nope + vd, qk = nope + rope, lw = lora + rope;
    for (int64_t i = threadIdx.x; i < H * qk; i += blockDim.x) {
        int64_t h = i / qk, j = i % qk;
        K[s * H * qk + i] = j < nope ? kvf[s * H * dkv + h * dkv + j] : latent[s * lw + lora + (j - nope)];
    }
    for (int64_t i = threadIdx.x; i < H * vd; i += blockDim.x) {
        int64_t h = i / vd, j = i % vd;
        V[s * H * vd + i] = kvf[s * H * dkv + h * dkv + nope + j];
    }
}

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

static int mla_expanded(gpu_backend *b, const ms_attn_mla_args *a, ms_err *err) {
    int64_t H = a->H, lora = a->lora, rope = a->rope, nope = a->nope, vd = a->vd, qk = nope + rope, dkv = nope + vd;
    int64_t T = a->n_past + a->n, lw = lora + rope;
    size_t oxl = 0, okv = up64((size_t)(T * lora)), oK = okv + up64((size_t)(T * H * dkv)),
           oV = oK + up64((size_t)(T * H * qk)), total = oV + up64((size_t)(T * H * vd));
    int rc = grow(b, &b->work, &b->work_cap, total, err);
    if (rc) return rc;
    float *xl = b->work + oxl, *kvf = b->work + okv, *K = b->work + oK, *V = b->work + oV;
    k_copy_rows<<<blocks_for(T, 1), 128, 0, b->g->stream>>>(xl, lora, a->latent, lw, T, lora);
    if ((rc = ms_gpu_launched(err, "MLA latent rows"))) return rc;
    if ((rc = ms_gpu_matmul(b->g, kvf, xl, (int)T, a->kv_b, 0, err))) return rc;
    k_mla_assemble<<<(unsigned)T, 256, 0, b->g->stream>>>(K, V, kvf, a->latent, H, nope, rope, vd, lora);
    if ((rc = ms_gpu_launched(err, "MLA expanded keys"))) return rc;
    ms_gpu_attn_cfg c = {(int)H, (int)H, (int)qk, (int)vd, 0, a->scale};
    if ((rc = grow(b, &b->attn_scr, &b->attn_cap, ms_gpu_attn_scratch_floats(ATT_TOK, &c), err))) return rc;
    if (ms_gpu_attn_prefill_wanted(b->g, a->n, a->n_past, &c) &&
        (rc = ms_gpu_attn_prefill(b->g, a->out, a->q, K, V, NULL, a->n, a->n_past, &c, MS_GPU_FA_AUTO, err)) !=
            MS_ERR_UNSUPPORTED)
        return rc;
    for (int t0 = 0; t0 < a->n; t0 += ATT_TOK) {
        int k = a->n - t0 < ATT_TOK ? a->n - t0 : ATT_TOK;
        if ((rc = ms_gpu_attn_gqa(b->g, a->out + (int64_t)t0 * H * vd, a->q + (int64_t)t0 * H * qk, K, V, NULL, k,
                                  a->n_past + t0, &c, b->attn_scr, err)))
            return rc;
    }
    return MS_OK;
}

static int g_attn_mla(ms_backend *be, const ms_attn_mla_args *a, ms_err *err) {
    gpu_backend *b = gb(be);
    int rc = report(b, err);
    if (rc) return rc;
    int64_t H = a->H, lora = a->lora, rope = a->rope, nope = a->nope, vd = a->vd, qk = nope + rope, dkv = nope + vd;
    if (lora < 1 || lora > MLA_MAXL)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "MLA attention: latent width %lld (the %s backend holds up to %d)",
                       (long long)lora, b->base.name, MLA_MAXL);
    /* the expanded form through the GQA kernel (one KV head per query head) where its limits allow */
    if (a->expanded && !a->sel && qk % 4 == 0 && qk <= 512 && vd <= 512) return mla_expanded(b, a, err);
    qview W;
    if ((rc = qview_of(a->kv_b, &W, err))) return rc;
    const int32_t *dsel = NULL, *dcnt = NULL;
    if (a->sel) { /* host selection arrays (the indexer's output): up to the device */
        size_t sb = (size_t)a->n * (size_t)a->sel_width * 4, cb = (size_t)a->n * 4;
        if (b->idx_cap < sb + cb + 256) {
            ms_gpu_free(b->g, b->idx);
            b->idx = NULL, b->idx_cap = 0;
            if ((rc = ms_gpu_alloc(b->g, sb + cb + 256, &b->idx, err))) return rc;
            b->idx_cap = sb + cb + 256;
        }
        dsel = (const int32_t *)b->idx;
        dcnt = (const int32_t *)((uint8_t *)b->idx + ((sb + 255) & ~(size_t)255));
        if ((rc = ms_gpu_upload(b->g, (void *)dsel, a->sel, sb, err)) ||
            (rc = ms_gpu_upload(b->g, (void *)dcnt, a->sel_count, cb, err)))
            return rc;
    }
    size_t per = (size_t)(ATT_TOK * H * lora);
    if (a->pos_dev && (a->n != 1 || a->sel || b->mla_old))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "MLA attention: a device position needs one token, no selection");
    const int split = a->n == 1 && !b->mla_old; /* decode: the keys split over blocks (attn_mla.cu) */
    if ((rc = grow(b, &b->work, &b->work_cap, 2 * per + (split ? ms_gpu_mla_decode_scratch(H, lora) : 0), err)))
        return rc;
    float *qlat = b->work, *olat = b->work + per;
    size_t shm = (size_t)(lora + rope + 2 * MLA_WARPS + MLA_WARPS * lora) * 4;
    for (int t0 = 0; t0 < a->n; t0 += ATT_TOK) {
        int k = a->n - t0 < ATT_TOK ? a->n - t0 : ATT_TOK;
        dim3 grid((unsigned)H, (unsigned)k), gq(grid.x, grid.y, (unsigned)((lora + 63) / 64)); /* z: column slices */
        dim3 go(grid.x, grid.y, (unsigned)((vd + 7) / 8)); /* z: 8 rows each (a warp a row) */
        k_mla_qlat<<<gq, 64, (size_t)nope * 4, b->g->stream>>>(qlat, a->q + (int64_t)t0 * H * qk, W, H, nope, qk,
                                                                  lora, dkv);
        mla_attn_args m = {olat, qlat, a->q, a->latent, dsel, dcnt, a->sel_width, a->n_past, t0, H, lora, rope, nope,
                           qk, a->scale};
        if (!split) k_mla_attn<<<grid, MLA_WARPS * MS_WARP, shm, b->g->stream>>>(m);
        else if ((rc = ms_gpu_mla_decode(b->g, olat, qlat, a->q, a->latent, dsel, dcnt, a->sel_width, a->n_past,
                                          a->pos_dev, H, lora, rope, nope, a->scale, b->work + 2 * per, err)))
            return rc;
        k_mla_out<<<go, 256, 0, b->g->stream>>>(a->out, olat, W, t0, H, nope, vd, lora, dkv);
        if ((rc = ms_gpu_launched(err, "MLA attention"))) return rc;
    }
    return MS_OK;
}

/* ---------------------------------------------------------- mixture of experts */

static void g_route(ms_backend *be, const ms_route_args *a) {
    gpu_backend *b = gb(be);
    const ms_config *c = a->c;
    int E = (int)ms_router_width(c), K = (int)c->top_k, G = (int)(c->n_group > 1 ? c->n_group : 1);
    int TG = (int)(c->topk_group > 0 ? c->topk_group : G);
    ms_err e = {0};
    int rc;
    if (a->n < 1) return;
    /* zero-computation experts: the router's width E counts them; their kind is routed on the host */
    int device = !a->fixed && !c->n_zero_experts && c->router >= MS_ROUTER_SOFTMAX && c->router <= MS_ROUTER_TOPK_SOFTMAX && E <= 1024 &&
                 K <= 32 && K <= E && (c->router != MS_ROUTER_SIGMOID || (E % G == 0 && TG <= G && G <= 256));
    if (device) {
        ms_gpu_route_cfg rc_ = {(ms_gpu_router)c->router, E, K, c->router == MS_ROUTER_SIGMOID ? G : 1,
                                c->router == MS_ROUTER_SIGMOID ? TG : 1, c->norm_topk_prob ? 1 : 0,
                                (float)c->routed_scale};
        rc = ms_gpu_route(b->g, (int32_t *)a->ids, a->w, a->logits, a->bias, a->n, &rc_, &e);
        return note(b, rc, &e);
    }
    /* on the host: the kinds the kernel lacks (sqrt-softplus, softmax + bias, hash-routed ids) */
    size_t need = (size_t)a->n * E + (size_t)E + 2 * (size_t)E + 2 * (size_t)a->n * K;
    if (b->host_cap < need) {
        float *p = (float *)realloc(b->host, need * 4);
        if (!p) return note(b, ms_fail(&e, MS_ERR_NOMEM, "out of host memory routing"), &e);
        b->host = p, b->host_cap = need;
    }
    float *lg = b->host, *bias = lg + (size_t)a->n * E, *scr = bias + E, *w = scr + 2 * E;
    int *ids = (int *)(w + (size_t)a->n * K);
    if ((rc = ms_gpu_download(b->g, lg, a->logits, (size_t)a->n * E * 4, &e)) ||
        (a->bias && (rc = ms_gpu_download(b->g, bias, a->bias, (size_t)E * 4, &e))))
        return note(b, rc, &e);
    ms_route_args h = *a;
    h.logits = lg, h.bias = a->bias ? bias : NULL, h.ids = ids, h.w = w;
    ms_route_host(&h, scr);
    if ((rc = ms_gpu_upload(b->g, a->ids, ids, (size_t)a->n * K * 4, &e)) ||
        (rc = ms_gpu_upload(b->g, a->w, w, (size_t)a->n * K * 4, &e)))
        return note(b, rc, &e);
    note(b, ms_gpu_sync(b->g, &e), &e); /* the host buffers are reused by the next call */
}

/* The router matmul and the device routing in one launch (ms_gpu_router_route) where it takes
 * this router, else the two ops. */
static void g_router_route(ms_backend *be, const ms_route_args *a, const float *x, const ms_qmat *router) {
    gpu_backend *b = gb(be);
    const ms_config *c = a->c;
    int E = (int)c->n_experts, K = (int)c->top_k;
    if (a->n == 1 && !a->fixed && !c->n_zero_experts && (c->router == MS_ROUTER_SOFTMAX || c->router == MS_ROUTER_TOPK_SOFTMAX ||
                                   (c->router == MS_ROUTER_SIGMOID && c->n_group <= 1))) {
        ms_gpu_route_cfg rc_ = {(ms_gpu_router)c->router, E, K, 1, 1, c->norm_topk_prob ? 1 : 0, (float)c->routed_scale};
        ms_err e = {0};
        int rc = ms_gpu_router_route(b->g, (int32_t *)a->ids, a->w, (float *)a->logits, x, router, a->bias, &rc_, &e);
        if (rc != MS_ERR_UNSUPPORTED) return note(b, rc, &e);
    }
    g_matmul(be, (float *)a->logits, x, a->n, router, 0);
    g_route(be, a);
}

typedef struct {
    int32_t row[ROW_BATCH];
    float w[ROW_BATCH];
    int m;
} rows_arg;
__global__ void k_gather(float *dst, const float *src, rows_arg a, int64_t d) {
    int i = blockIdx.x;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) dst[(int64_t)i * d + k] = src[(int64_t)a.row[i] * d + k];
}
/* in order over i for each column, as the CPU (a row may repeat); the source row: i, or row[i]
 * (by_row: scale_add_rows) */
__global__ void k_scatter_add(float *dst, const float *src, rows_arg a, int64_t d, int by_row) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < d; k += (int64_t)gridDim.x * blockDim.x)
        for (int i = 0; i < a.m; i++)
            dst[(int64_t)a.row[i] * d + k] += a.w[i] * src[(int64_t)(by_row ? a.row[i] : i) * d + k];
}
static void g_gather_rows(ms_backend *be, float *dst, const float *src, const int *rows, int m, int64_t d) {
    gpu_backend *b = gb(be);
    for (int i0 = 0; i0 < m; i0 += ROW_BATCH) {
        rows_arg a;
        a.m = m - i0 < ROW_BATCH ? m - i0 : ROW_BATCH;
        memcpy(a.row, rows + i0, (size_t)a.m * 4);
        k_gather<<<a.m, 256, 0, b->g->stream>>>(dst + (int64_t)i0 * d, src, a, d);
    }
    launched(b, "gather_rows");
}
static void scatter_rows(gpu_backend *b, float *dst, const float *src, const int *rows, const float *w, int m,
                         int64_t d, int by_row) {
    for (int i0 = 0; i0 < m; i0 += ROW_BATCH) {
        rows_arg a;
        a.m = m - i0 < ROW_BATCH ? m - i0 : ROW_BATCH;
        memcpy(a.row, rows + i0, (size_t)a.m * 4);
        memcpy(a.w, w + i0, (size_t)a.m * 4);
        k_scatter_add<<<blocks_for(d, 256), 256, 0, b->g->stream>>>(dst, by_row ? src : src + (int64_t)i0 * d, a, d,
                                                                     by_row);
    }
    launched(b, by_row ? "scale_add_rows" : "scatter_add_rows");
}
static void g_scatter_add_rows(ms_backend *be, float *dst, const float *src, const int *rows, const float *w, int m,
                               int64_t d) {
    scatter_rows(gb(be), dst, src, rows, w, m, d, 0);
}
static void g_scale_add_rows(ms_backend *be, float *dst, const float *src, const int *rows, const float *w, int m,
                             int64_t d) {
    scatter_rows(gb(be), dst, src, rows, w, m, d, 1);
}

__global__ void k_add_bias_any(float *x, const void *bias, int dt, int64_t m, int64_t d) {
    int64_t n = m * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t k = i % d;
        float v = dt == QD_F32 ? ((const float *)bias)[k]
                  : dt == QD_BF16 ? ms_bf16_to_f32_dev(((const uint16_t *)bias)[k])
                                  : ms_f16_to_f32_dev(((const uint16_t *)bias)[k]);
        x[i] += v;
    }
}
static void g_add_bias_any(ms_backend *be, float *x, const void *bias, ms_dtype dt, int64_t m, int64_t d) {
    gpu_backend *b = gb(be);
    if (dt != MS_DT_F32 && dt != MS_DT_BF16 && dt != MS_DT_F16) {
        ms_err e = {0};
        return note(b, ms_fail(&e, MS_ERR_UNSUPPORTED, "add_bias_any: bias dtype %s", ms_dtype_name(dt)), &e);
    }
    if (m * d < 1) return;
    int k = dt == MS_DT_F32 ? QD_F32 : dt == MS_DT_BF16 ? QD_BF16 : QD_F16;
    k_add_bias_any<<<blocks_for(m * d, 256), 256, 0, b->g->stream>>>(x, bias, k, m, d);
    launched(b, "add_bias_any");
}

__global__ void k_split(float *g, float *u, const float *tmp, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        g[i] = tmp[2 * i];
        u[i] = tmp[2 * i + 1];
    }
}
static void g_split_gate_up(ms_backend *be, float *g, float *u, int64_t m, int64_t I) {
    gpu_backend *b = gb(be);
    ms_err e = {0};
    int64_t n = m * I;
    if (n < 1) return;
    int rc = grow(b, &b->work, &b->work_cap, (size_t)(2 * n), &e);
    if (!rc) rc = ms_gpu_copy(b->g, b->work, u, (size_t)(2 * n) * 4, &e); /* in place in u: through a copy */
    if (rc) return note(b, rc, &e);
    k_split<<<blocks_for(n, 256), 256, 0, b->g->stream>>>(g, u, b->work, n);
    launched(b, "split_gate_up");
}

__global__ void k_add_gated_rows(float *y, const float *x, const float *s, int64_t rows, int64_t d) {
    int64_t n = rows * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += (1.0f / (1.0f + expf(-s[i / d]))) * x[i];
}
static void g_add_gated_rows(ms_backend *be, float *y, const float *x, const float *s, int64_t rows, int64_t d) {
    if (rows * d < 1) return;
    k_add_gated_rows<<<blocks_for(rows * d, 256), 256, 0, gb(be)->g->stream>>>(y, x, s, rows, d);
    launched(gb(be), "add_gated_rows");
}

/* One decode token's routed experts from the router's device output (no host round trip):
 * a device table of the layer's resident experts (built at the first call for that layer's
 * host array), then matmul_routed.cu's launches (ms_gpu_moe_routed). */
typedef struct rx_table {
    const ms_expert_view *key;
    const void *key_w; /* expert 0's placed gate data: placed weights are never freed before destroy, so a
                        * host array freed and reused at the same address (another model) cannot match */
    int E, ok, fused, bias_dt;
    ms_qmat gate, down;
    ms_gpu_ex_ptrs *dev;
} rx_table;

static int qmat_same_layout(const ms_qmat *a, const ms_qmat *b) {
    return a->dtype == b->dtype && a->rows == b->rows && a->cols == b->cols && !a->scale == !b->scale &&
           (!a->scale || (a->scale_dtype == b->scale_dtype && a->brow == b->brow && a->bcol == b->bcol)) &&
           (a->dtype != MS_DT_I4 || !a->zero == !b->zero);
}

/* t's layout from all[0..E) (t->ok = 0 when the experts differ in layout or bias dtype), and
 * when ok, the device pointers of each expert into h[E] (host). */
static void rx_check(rx_table *t, const ms_expert_view *all, int E) {
    memset(t, 0, sizeof *t);
    t->key = all, t->E = E, t->key_w = all[0].gate.data;
    const ms_expert_view *v0 = &all[0];
    t->fused = v0->up.data == NULL;
    t->gate = v0->gate, t->down = v0->down;
    int any_bias = 0, ok = 1;
    for (int x = 0; x < E && ok; x++) {
        const ms_expert_view *v = &all[x];
        ok = v->gate.data && v->down.data && (v->up.data == NULL) == t->fused && qmat_same_layout(&v->gate, &v0->gate) &&
             qmat_same_layout(&v->down, &v0->down) && (t->fused || qmat_same_layout(&v->up, &v0->gate));
        if (v->gate_bias || v->up_bias || v->down_bias) {
            any_bias = 1;
            ok = ok && v->bias_dtype == v0->bias_dtype;
        }
    }
    if (any_bias && v0->bias_dtype != MS_DT_F32 && v0->bias_dtype != MS_DT_BF16 && v0->bias_dtype != MS_DT_F16) ok = 0;
    t->bias_dt = v0->bias_dtype == MS_DT_BF16 ? 1 : v0->bias_dtype == MS_DT_F16 ? 2 : 0;
    int64_t I = v0->down.cols;
    if (t->gate.rows != (t->fused ? 2 : 1) * I || t->gate.cols != v0->down.rows) ok = 0;
    t->ok = ok;
}
static void rx_fill(const ms_expert_view *all, int E, ms_gpu_ex_ptrs *h) {
    memset(h, 0, (size_t)E * sizeof *h);
    for (int x = 0; x < E; x++) {
        const ms_expert_view *v = &all[x];
        h[x].w[0] = v->gate.data, h[x].s[0] = v->gate.scale;
        h[x].w[1] = v->up.data, h[x].s[1] = v->up.scale;
        h[x].w[2] = v->down.data, h[x].s[2] = v->down.scale;
        if (v->gate.dtype == MS_DT_I4) h[x].z[0] = v->gate.zero, h[x].z[1] = v->up.zero, h[x].z[2] = v->down.zero;
        h[x].bias[0] = v->gate_bias, h[x].bias[1] = v->up_bias, h[x].bias[2] = v->down_bias;
    }
}

/* A cached table (resident experts): checked, filled, uploaded into the arena once. */
static int rx_build(gpu_backend *b, rx_table *t, const ms_expert_view *all, int E, ms_err *err) {
    rx_check(t, all, E);
    if (!t->ok) return MS_OK;
    ms_gpu_ex_ptrs *h = (ms_gpu_ex_ptrs *)calloc((size_t)E, sizeof *h);
    if (!h) return ms_fail(err, MS_ERR_NOMEM, "out of host memory");
    rx_fill(all, E, h);
    void *d = NULL;
    int rc = arena_get(b, (size_t)E * sizeof *h, &d, err);
    if (!rc) rc = ms_gpu_upload(b->g, d, h, (size_t)E * sizeof *h, err);
    free(h);
    t->dev = (ms_gpu_ex_ptrs *)d;
    return rc;
}

static int g_moe_experts_routed(ms_backend *be, const ms_moe_routed_args *a, ms_err *err) {
    gpu_backend *b = gb(be);
    int rc = report(b, err);
    if (rc) return rc;
    if (a->K < 1 || a->K > 32 || a->E < 1)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "moe_experts_routed: %d of %d experts", a->K, a->E);
    rx_table *t = NULL, tc;
    if (a->per_call) { /* streamed experts: this call's table, into one device buffer (stream-ordered reuse) */
        if (b->step.capturing || a->E < 1 || a->E > RX_CALL_MAX)
            return ms_fail(err, MS_ERR_UNSUPPORTED, "moe_experts_routed: a per-call table of %d experts%s", a->E,
                           b->step.capturing ? " while recording" : "");
        rx_check(&tc, a->all, a->E);
        if (!tc.ok)
            return ms_fail(err, MS_ERR_UNSUPPORTED, "moe_experts_routed: the experts differ in layout or bias dtype");
        if (!b->rx_call && (rc = arena_get(b, RX_CALL_MAX * sizeof(ms_gpu_ex_ptrs), (void **)&b->rx_call, err)))
            return rc;
        ms_gpu_ex_ptrs h[RX_CALL_MAX];
        rx_fill(a->all, a->E, h);
        /* pageable source: staged before the call returns, so h may go out of scope */
        if ((rc = ms_gpu_upload(b->g, b->rx_call, h, (size_t)a->E * sizeof *h, err))) return rc;
        tc.dev = b->rx_call;
        t = &tc;
    }
    for (int i = 0; i < b->n_rx && !t; i++)
        if (b->rx[i].key == a->all && b->rx[i].E == a->E && b->rx[i].key_w == a->all[0].gate.data) t = &b->rx[i];
    if (!t && b->step.capturing) /* the table's upload would be recorded, not run */
        return ms_fail(err, MS_ERR_LIMIT, "moe_experts_routed: a layer's first call during a recorded step");
    if (!t) {
        if (b->n_rx == b->cap_rx) {
            int nc = b->cap_rx ? 2 * b->cap_rx : 64;
            rx_table *nt = (rx_table *)realloc(b->rx, (size_t)nc * sizeof *nt);
            if (!nt) return ms_fail(err, MS_ERR_NOMEM, "out of host memory");
            b->rx = nt, b->cap_rx = nc;
        }
        t = &b->rx[b->n_rx];
        if ((rc = rx_build(b, t, a->all, a->E, err))) return rc;
        b->n_rx++;
    }
    if (!t->ok)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "moe_experts_routed: the layer's experts differ in layout or bias dtype");
    int64_t I = t->down.cols, D = t->down.rows;
    if (D != a->D) return ms_fail(err, MS_ERR_SHAPE, "moe_experts_routed: experts of width %lld, rows of %lld",
                                  (long long)D, (long long)a->D);
    if ((rc = grow(b, &b->rx_scr, &b->rx_cap, ms_gpu_moe_routed_scratch_floats(a->K, I, D), err))) return rc;
    ms_gpu_glu_params p = {a->act->kind == MS_ACT_SITU, a->act->limit, a->act->alpha, a->act->up_offset,
                           a->act->beta, a->act->linear_beta};
    return ms_gpu_moe_routed(b->g, a->acc, a->in, a->K, (const int32_t *)a->ids, a->w, t->dev, &t->gate, &t->down,
                             t->fused, t->bias_dt, &p, b->rx_scr, err);
}

/* ---------------------------------------------------------- Attention Residuals */

static __device__ double block_sum_d(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}
/* one token per block (256 threads); scores in double as the CPU, softmax in float */
__global__ void k_attn_res(float *out, const float *blocks, int nb, int64_t bs, const float *cur, int64_t d,
                           const float *norm, const float *proj, float eps) {
    __shared__ double red[256];
    extern __shared__ float sc[];
    int64_t t = blockIdx.x;
    const float *ct = cur + t * d;
    for (int i = 0; i <= nb; i++) {
        const float *v = i < nb ? blocks + (int64_t)i * bs + t * d : ct;
        double ss = 0;
        for (int64_t k = threadIdx.x; k < d; k += blockDim.x) ss += (double)v[k] * v[k];
        ss = block_sum_d(ss, red);
        float inv = (float)(1.0 / sqrt(ss / (double)d + eps));
        double dot = 0;
        for (int64_t k = threadIdx.x; k < d; k += blockDim.x) dot += (double)(v[k] * inv) * (double)(norm[k] * proj[k]);
        dot = block_sum_d(dot, red);
        if (threadIdx.x == 0) sc[i] = (float)dot;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = sc[0], sum = 0;
        for (int i = 1; i <= nb; i++) mx = sc[i] > mx ? sc[i] : mx;
        for (int i = 0; i <= nb; i++) sum += (sc[i] = expf(sc[i] - mx));
        for (int i = 0; i <= nb; i++) sc[i] /= sum;
    }
    __syncthreads();
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
        float acc = sc[nb] * ct[k];
        for (int i = 0; i < nb; i++) acc += sc[i] * blocks[(int64_t)i * bs + t * d + k];
        out[t * d + k] = acc;
    }
}
static void g_attn_res_mix(ms_backend *be, float *out, const float *blocks, int nb, int64_t block_stride,
                           const float *cur, int n, int64_t d, const float *norm, const float *proj, float eps) {
    if (n < 1) return;
    k_attn_res<<<n, 256, (size_t)(nb + 1) * 4, gb(be)->g->stream>>>(out, blocks, nb, block_stride, cur, d, norm, proj,
                                                                    eps);
    launched(gb(be), "attn_res_mix");
}

/* ---------------------------------------------------------- the replayable decode step */

/* x = the embedding row of token step[1] (core/backend.h embed_at) */
__global__ void k_embed_at(float *x, qview q, const int64_t *step) {
    ms_pdl_launch();
    ms_pdl_wait();
    int64_t id = step[1];
    for (int64_t c = threadIdx.x; c < q.cols; c += blockDim.x) x[c] = qv_at(q, id, c);
}
static void g_embed_at(ms_backend *be, float *x, const ms_qmat *table, const int64_t *step) {
    gpu_backend *b = gb(be);
    qview q;
    ms_err e = {0};
    int rc = qview_of(table, &q, &e);
    if (rc) return note(b, rc, &e);
    ms_launch(b->g->pdl, k_embed_at, dim3(1), dim3(256), 0, b->g->stream, x, q, step);
    launched(b, "embed_at");
}

/* ---------------------------------------------------------- the table */

/* the table, filled by name (fields are added to core/backend.h as ops land; unset ones stay NULL) */
static void fill_ops(ms_backend_ops *o) {
    memset(o, 0, sizeof *o);
    o->alloc = g_alloc;
    o->free = g_free;
    o->upload = g_upload;
    o->download = g_download;
    o->copy = g_copy;
    o->zero = g_zero;
    o->copy_rows = g_copy_rows;
    o->sync = g_sync;
    o->place_qmat = g_place_qmat;
    o->place_vec = g_place_vec;
    o->destroy = g_destroy;
    o->workspace_bytes = g_workspace_bytes;
    o->reserve = g_reserve;
    o->matmul = g_matmul;
    o->matmul_many = g_matmul_many;
    o->rmsnorm = g_rmsnorm;
    o->add_bias = g_add_bias;
    o->add = g_add;
    o->scale = g_scale;
    o->mul_sigmoid = g_mul_sigmoid;
    o->rope = g_rope;
    o->glu = g_glu;
    o->embed = g_embed;
    o->attn_gqa = g_attn_gqa;
    o->attn_mla = g_attn_mla;
    o->route = g_route;
    o->router_route = g_router_route;
    o->gather_rows = g_gather_rows;
    o->scatter_add_rows = g_scatter_add_rows;
    o->scale_add_rows = g_scale_add_rows;
    o->add_bias_any = g_add_bias_any;
    o->split_gate_up = g_split_gate_up;
    o->add_gated_rows = g_add_gated_rows;
    o->moe_experts = ms_gpu_gemm_moe_experts; /* grouped GEMMs for chunks, else composed */
    o->moe_experts_routed = g_moe_experts_routed;
    o->add_rmsnorm = g_add_rmsnorm;
    o->qk_norm_rope = g_qk_norm_rope;
    o->attn_res_mix = g_attn_res_mix;
    o->host_register = g_host_register;
    o->host_unregister = g_host_unregister;
    o->mem_info = g_mem_info;
    o->embed_at = g_embed_at;
    ms_gpu_step_fill(o); /* qkv_at, graph_*, argmax */
    ms_gpu_blocks_fill(o);
}


extern "C" int ms_backend_gpu_count(void) {
    int n = 0;
    if (gpuGetDeviceCount(&n) != gpuSuccess) {
        (void)gpuGetLastError(); /* clear the sticky "no driver" */
        return 0;
    }
    return n;
}

extern "C" int ms_backend_gpu_create(int device, ms_backend **out, ms_err *err) {
    *out = NULL;
    gpu_backend *b = (gpu_backend *)calloc(1, sizeof *b);
    if (!b) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    fill_ops(&b->ops);
    const char *gr = getenv("MS_GPU_GRAPH"); /* MS_GPU_GRAPH=0: no replayable decode step (A/B) */
    if (gr && !strcmp(gr, "0")) b->ops.graph_begin = NULL, b->ops.graph_end = NULL, b->ops.graph_launch = NULL;
    const char *am = getenv("MS_GPU_ARGMAX"); /* MS_GPU_ARGMAX=0: no device greedy pick (A/B) */
    if (am && !strcmp(am, "0")) b->ops.argmax = NULL;
    b->mla_old = getenv("MS_GPU_MLA") && !strcmp(getenv("MS_GPU_MLA"), "old"); /* A/B: the earlier MLA decode */
    if (b->mla_old) b->ops.latent_at = NULL; /* and MLA layers out of the replayable step */
    b->base.impl = b;
    int rc = ms_gpu_open(device, &b->g, err);
    if (!rc) {
        void *p = NULL;
        rc = ms_gpu_alloc(b->g, ROPE_SLOTS * 512 * 4, &p, err);
        b->rope_inv = (float *)p;
    }
    if (rc) {
        g_destroy(&b->base);
        return rc;
    }
    prof_wrap_ops(b);
    b->base.ops = &b->ops;
    b->base.name = MS_GPU_BACKEND_NAME;
    b->base.host_memory = 0;
    *out = &b->base;
    return MS_OK;
}

extern "C" int ms_backend_gpu_profile(ms_backend *be, int on, ms_err *err) {
    gpu_backend *b = gb(be);
    if (on && !b->prof_ev) {
        b->prof_ev = (gpuEvent_t *)calloc(2 * PROF_PAIRS, sizeof *b->prof_ev);
        b->prof_cls = (int *)calloc(PROF_PAIRS, sizeof *b->prof_cls);
        b->prof_classes = (prof_class *)calloc(PROF_CLASSES, sizeof *b->prof_classes);
        if (!b->prof_ev || !b->prof_cls || !b->prof_classes) {
            prof_free(b);
            return ms_fail(err, MS_ERR_NOMEM, "out of host memory");
        }
        int rc = ms_gpu_check(gpuEventCreate(&b->prof_start), err, "creating an event");
        for (int i = 0; i < 2 * PROF_PAIRS && !rc; i++)
            rc = ms_gpu_check(gpuEventCreate(&b->prof_ev[i]), err, "creating an event");
        if (rc) return rc;
    }
    if (on) {
        int rc = ms_gpu_sync(b->g, err);
        if (rc) return rc;
        b->prof_n = 0, b->prof_nc = 0;
        const char *st = getenv("MS_GPU_PROFILE_STALL_US");
        b->prof_stall = st ? (int64_t)(2000.0 * atof(st)) : 0;
        (void)gpuEventRecord(b->prof_start, b->g->stream);
    }
    b->prof = on;
    return MS_OK;
}

extern "C" int ms_backend_gpu_profile_json(ms_backend *be, int per, char *buf, size_t cap) {
    gpu_backend *b = gb(be);
    size_t n = 0;
    if (cap) buf[0] = 0;
    if (!b->prof_ev) return 0;
    ms_err e = {0};
    float span = 0;
    if (!b->prof_n) (void)gpuEventRecord(b->prof_ev[0], b->g->stream);
    gpuEvent_t last = b->prof_n ? b->prof_ev[2 * b->prof_n - 1] : b->prof_ev[0];
    (void)ms_gpu_sync(b->g, &e);
    (void)gpuEventElapsedTime(&span, b->prof_start, last);
    prof_harvest(b);
    if (per < 1) per = 1;
    double sum = 0, hsum = 0;
    for (int i = 0; i < b->prof_nc; i++) sum += b->prof_classes[i].ms, hsum += b->prof_classes[i].host_s;
    int order[PROF_CLASSES];
    for (int i = 0; i < b->prof_nc; i++) order[i] = i;
    for (int i = 1; i < b->prof_nc; i++) /* by time, largest first */
        for (int k = i; k > 0 && b->prof_classes[order[k]].ms > b->prof_classes[order[k - 1]].ms; k--) {
            int t = order[k];
            order[k] = order[k - 1], order[k - 1] = t;
        }
    double stall = 0; /* the stalled profile's spins: out of the span and the ops' sum */
    for (int i = 0; i < b->prof_nc; i++)
        if (!strcmp(b->prof_classes[i].name, "stall")) stall = b->prof_classes[i].ms;
    n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0,
                          "{\"tokens\":%d,\"span_us_per_token\":%.1f,\"ops_us_per_token\":%.1f,"
                          "\"ops_host_us_per_token\":%.1f,\"stalled\":%d,\"ops\":{",
                          per, 1e3 * (span - stall) / per, 1e3 * (sum - stall) / per, 1e6 * hsum / per, stall > 0);
    for (int k = 0; k < b->prof_nc; k++) {
        const prof_class *c = &b->prof_classes[order[k]];
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s\"%s\":{\"us_per_token\":%.2f,\"host_us_per_token\":%.2f,\"calls_per_token\":%.1f}",
                              k ? "," : "", c->name, 1e3 * c->ms / per, 1e6 * c->host_s / per, (double)c->calls / per);
    }
    n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "}}");
    return (int)n;
}

extern "C" int ms_backend_gpu_copy_bandwidth(ms_backend *be, double *bytes_per_s, ms_err *err) {
    gpu_backend *b = gb(be);
    *bytes_per_s = 0;
    size_t bytes = (size_t)1 << 30;
    void *s = NULL, *d = NULL;
    int rc = ms_gpu_alloc(b->g, bytes, &s, err);
    if (!rc && (rc = ms_gpu_alloc(b->g, bytes, &d, err))) ms_gpu_free(b->g, s);
    if (rc) return rc;
    float ms = 0;
    const int reps = 10;
    rc = ms_gpu_zero(b->g, s, bytes, err);
    if (!rc) rc = ms_gpu_copy(b->g, d, s, bytes, err); /* warm-up */
    if (!rc) rc = ms_gpu_timer_start(b->g, err);
    for (int i = 0; i < reps && !rc; i++) rc = ms_gpu_copy(b->g, i & 1 ? s : d, i & 1 ? d : s, bytes, err);
    if (!rc) rc = ms_gpu_timer_stop(b->g, &ms, err);
    ms_gpu_free(b->g, s);
    ms_gpu_free(b->g, d);
    if (!rc && ms > 0) *bytes_per_s = 2.0 * (double)bytes * reps / (ms * 1e-3); /* read + write */
    return rc;
}
