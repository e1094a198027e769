/* backend_gpu_step.cu — the replayable decode step's ops of the GPU backend (core/backend.h:
 * qkv_at, graph_begin / graph_end / graph_launch / graph_free, argmax; the engine's side is
 * engine/decode_step.c, the recording guards of the backend's setup paths and embed_at are in
 * backend_gpu.cu). Every name of the runtime goes through gpu_port.h (a CUDA graph, or a
 * hipGraph). */
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gpu_internal.h"
#include "backend/gpu/rope_head.h"
#include "backend/gpu/backend_gpu_blocks.h" /* ms_gpu_be_dev, ms_gpu_be_note, ms_gpu_be_report */
#include "backend/gpu/backend_gpu_step.h"
#include "backend/gpu/backend_gpu.h" /* ms_backend_gpu_graph_edges */

/* A void op's launch failure, noted for the next sync / download. */
static void launched(ms_backend *be, const char *what) {
    ms_err e = {0};
    int rc = ms_gpu_launched(&e, what);
    if (rc) ms_gpu_be_note(be, rc, &e);
}

/* qkv_at (core/backend.h): block h < qh a query head in place, qh <= h < qh + kh a key head
 * into its cache row, the blocks after them a value head copied into its cache row; 128
 * threads. The norm and the rotation are rope_head.h's, as qk_norm_rope's (norm 0: the
 * rotation alone, as k_rope's). */
__global__ void k_qkv_at(float *q, int64_t qh, const float *wq, const float *k, int64_t kh, const float *wk,
                         const float *v, int64_t vd, float *kc, float *vc, int hd, int norm, float eps, int half,
                         int interleaved, const float *inv, double attn_factor, const int64_t *step) {
    extern __shared__ float hv[];
    __shared__ float sh[32];
    ms_pdl_launch();
    ms_pdl_wait();
    const int64_t h = blockIdx.x, pos = step[0];
    if (h >= qh + kh) { /* a value head */
        int64_t j = h - qh - kh;
        for (int64_t i = threadIdx.x; i < vd; i += blockDim.x) vc[pos * kh * vd + j * vd + i] = v[j * vd + i];
        return;
    }
    const int isq = h < qh;
    const float *src = isq ? q + h * hd : k + (h - qh) * hd;
    float *dst = isq ? q + h * hd : kc + pos * kh * hd + (h - qh) * hd;
    ms_head_norm_rope(src, dst, hd, norm, isq ? wq : wk, eps, half, interleaved, inv, attn_factor, pos, hv, sh);
}
static void g_qkv_at(ms_backend *be, const ms_rope *r, float *q, int64_t qh, const float *wq, float *k, int64_t kh,
                     const float *wk, const float *v, int64_t vd, float *k_cache, float *v_cache, int64_t hd, int norm,
                     float eps, const int64_t *step) {
    if (qh + kh < 1 || hd < 1) return;
    int half = r->dim / 2;
    if (2 * half > hd) {
        ms_err e = {0};
        return ms_gpu_be_note(be, ms_fail(&e, MS_ERR_ARG, "qkv_at: %d rotary dims in heads of %lld", r->dim, (long long)hd),
                              &e);
    }
    const float *inv = ms_gpu_be_rope_table(be, r);
    if (!inv) return;
    ms_gpu *g = ms_gpu_be_dev(be);
    ms_launch(g->pdl, k_qkv_at, dim3((unsigned)(qh + 2 * kh)), dim3(128), (size_t)hd * 4, g->stream, q, qh, wq,
              (const float *)k, kh, wk, v, vd, k_cache, v_cache, (int)hd, norm, eps, half,
              (int)(r->layout == MS_ROPE_INTERLEAVED), inv, r->attn_factor, step);
    launched(be, "qkv_at");
}

/* latent_at (core/backend.h): the row copied to row step[0] of the cache, one block. */
__global__ void k_latent_at(float *cache, int64_t lw, const float *row, const int64_t *step) {
    float *dst = cache + step[0] * lw;
    for (int64_t i = threadIdx.x; i < lw; i += blockDim.x) dst[i] = row[i];
}
static void g_latent_at(ms_backend *be, float *cache, int64_t lw, const float *row, const int64_t *step) {
    if (lw < 1) return;
    k_latent_at<<<1, 256, 0, ms_gpu_be_dev(be)->stream>>>(cache, lw, row, step);
    launched(be, "latent_at");
}

/* The greedy pick (core/backend.h argmax): one block of 1024 threads, each the first index of
 * its own largest value over a strided slice (strict >, so NaN never wins), then the largest
 * value and the smallest index holding it; a NaN x[0] gives 0 as the host loop. */
__global__ void __launch_bounds__(1024) k_argmax(const float *x, int64_t n, int32_t *out, int64_t *step) {
    __shared__ float sm[1024 / MS_WARP];
    __shared__ int64_t si[1024 / MS_WARP];
    ms_pdl_launch();
    ms_pdl_wait();
    const float x0 = x[0];
    float m = x0;
    int64_t bi = 0;
    for (int64_t v = threadIdx.x; v < n; v += blockDim.x) {
        float y = x[v];
        if (y > m) m = y, bi = v;
    }
    for (int o = MS_WARP / 2; o > 0; o /= 2) { /* (m, bi) pairs: larger value, then smaller index */
        float om = ms_shfl_xor(m, o);
        int64_t oi = ((int64_t)ms_shfl_xor_i((int)(bi >> 32), o) << 32) | (uint32_t)ms_shfl_xor_i((int)bi, o);
        if (om > m || (om == m && oi < bi)) m = om, bi = oi;
    }
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    if (lane == 0) sm[warp] = m, si[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / MS_WARP); w++)
            if (sm[w] > m || (sm[w] == m && si[w] < bi)) m = sm[w], bi = si[w];
        const int32_t pick = x0 != x0 ? 0 : (int32_t)bi;
        *out = pick;
        if (step) step[0] += 1, step[1] = pick; /* argmax_step: the next greedy token's step */
    }
}
/* The greedy pick by many blocks (the default; MS_GPU_ARGMAX_BLOCKS=0 at open: k_argmax): a block of 256
 * threads per 1024 values, each thread the first index of its largest over its strided slice (from
 * (x[0], 0), strict >: NaN never wins), the block's best as the 64-bit key (orderable bits of the
 * value, -0 as +0, high; ~index low: larger value first, then the smaller index) into a max at
 * cnt[2..3] (atomicMax: any arrival order, the same key), the last block to arrive (cnt[0]) writes
 * the pick (0 when x[0] is NaN, as the host loop) and resets both; the ids of k_argmax. */
static __device__ __forceinline__ unsigned long long am_key(float v, int64_t i) {
    uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)b << 32) | (0xFFFFFFFFu - (uint32_t)i);
}
__global__ void __launch_bounds__(256) k_argmax_blocks(const float *x, int64_t n, int32_t *out, int64_t *step,
                                                      int *cnt) {
    __shared__ unsigned long long sk[256 / MS_WARP];
    __shared__ int last;
    ms_pdl_launch();
    ms_pdl_wait();
    const float x0 = x[0];
    float m = x0;
    int64_t bi = 0;
    const int64_t b0 = (int64_t)blockIdx.x * 1024, b1 = b0 + 1024 < n ? b0 + 1024 : n;
#pragma unroll 4
    for (int64_t v = b0 + threadIdx.x; v < b1; v += 256) {
        const float y = x[v];
        if (y > m) m = y, bi = v;
    }
    unsigned long long k = am_key(m, bi); /* m is never NaN unless x0 is (then the pick is 0 anyway) */
    for (int o = MS_WARP / 2; o > 0; o /= 2) {
        const unsigned long long ok = ((unsigned long long)(uint32_t)ms_shfl_xor_i((int)(k >> 32), o) << 32) |
                                      (uint32_t)ms_shfl_xor_i((int)(uint32_t)k, o);
        k = ok > k ? ok : k;
    }
    if (threadIdx.x % MS_WARP == 0) sk[threadIdx.x / MS_WARP] = k;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 256 / MS_WARP; w++) k = sk[w] > k ? sk[w] : k;
        unsigned long long *slot = (unsigned long long *)(cnt + 2);
        atomicMax(slot, k);
        __threadfence();
        last = atomicAdd(cnt, 1) == (int)gridDim.x - 1;
        if (last) {
            __threadfence();
            const unsigned long long best = atomicExch(slot, 0ull); /* the max; reset for the next launch */
            cnt[0] = 0;
            const int32_t pick = x0 != x0 ? 0 : (int32_t)(0xFFFFFFFFu - (uint32_t)best);
            *out = pick;
            if (step) step[0] += 1, step[1] = pick;
        }
    }
}
/* Launch the pick (k_argmax_blocks, or k_argmax when the context was opened with MS_GPU_ARGMAX_BLOCKS=0). */
static void argmax_launch(ms_backend *be, const float *x, int64_t n, int32_t *out, int64_t *step) {
    ms_gpu *g = ms_gpu_be_dev(be);
    int *cnt = NULL;
    if (g->argmax_blocks && n <= INT64_C(1) << 31) {
        ms_err e = {0};
        if (!(cnt = ms_gpu_counters(g, 4, &e))) return ms_gpu_be_note(be, e.code, &e);
    }
    if (cnt)
        ms_launch(g->pdl, k_argmax_blocks, dim3((unsigned)((n + 1023) / 1024)), dim3(256), 0, g->stream, x, n, out,
                  step, cnt);
    else ms_launch(g->pdl, k_argmax, dim3(1), dim3(1024), 0, g->stream, x, n, out, step);
    launched(be, step ? "argmax_step" : "argmax");
}
/* argmax_step (core/backend.h): the same pick, and step = {step[0] + 1, the pick}. Left out (NULL:
 * the engine uploads each step) when MS_GPU_STEP_NEXT=0 at backend creation (A/B). */
static void g_argmax(ms_backend *be, const float *x, int64_t n, int32_t *out) {
    if (n >= 1) argmax_launch(be, x, n, out, NULL);
}
static void g_argmax_step(ms_backend *be, const float *x, int64_t n, int32_t *out, int64_t *step) {
    if (n >= 1) argmax_launch(be, x, n, out, step);
}

/* qkv_attn_at (core/backend.h): qkv_at's work in the decode attention kernel's prologue
 * (attn_decode.cu, ms_gpu_qkv_pro: the same bits as qkv_at then attn_gqa) unless MS_GPU_QKV_ATTN=0
 * was set at open, when the kernel takes the shape; else MS_ERR_UNSUPPORTED before anything runs. */
static int g_qkv_attn_at(ms_backend *be, const ms_rope *r, float *q, const float *wq, float *k, const float *wk,
                         const float *v, int norm, float eps, const ms_attn_gqa_args *a, ms_err *err) {
    ms_gpu *g = ms_gpu_be_dev(be);
    int half = r->dim / 2;
    if (!g->qkv_attn || g->attn_mode == MS_GPU_ATTN_OLD || !a->pos_dev || a->n != 1 || a->H < 1 || a->KV < 1 ||
        a->H % a->KV || a->hd < 4 || a->hd % 4 || a->vd < 1 || a->window < 0 || 2 * half > a->hd ||
        ((uintptr_t)a->k % 16))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "qkv_attn_at: not folded (MS_GPU_QKV_ATTN, the shape)");
    int rc = ms_gpu_be_report(be, err);
    if (rc) return rc;
    ms_gpu_attn_cfg c = {(int)a->H, (int)a->KV, (int)a->hd, (int)a->vd, (int)a->window, a->scale};
    float *scr;
    if ((rc = ms_gpu_be_attn_scratch(be, &c, &scr, err))) return rc;
    const float *inv = ms_gpu_be_rope_table(be, r);
    if (!inv) return ms_gpu_be_report(be, err); /* the table's failure, noted */
    ms_gpu_qkv_pro p = {k, v, wq, wk, inv, (float *)a->k, (float *)a->v, r->attn_factor, eps, norm, half, /* written */
                        (int)(r->layout == MS_ROPE_INTERLEAVED)};
    rc = ms_gpu_attn_dec(g, a->out, q, a->k, a->v, a->sinks, 1, a->n_past, a->pos_dev, &c, scr, &p, err);
    return rc < 0 ? ms_fail(err, MS_ERR_UNSUPPORTED, "qkv_attn_at: the decode kernel does not take the shape") : rc;
}

/* A recorded step: the instantiated graph, and what it baked in (the backend's gen, the
 * arrival counters' address). */
typedef struct step_graph {
    gpuGraphExec_t exec;
    unsigned gen;
    const int *cnt;
} step_graph;

static int g_graph_begin(ms_backend *be, ms_err *err) {
    ms_gpu_step_state *st = ms_gpu_be_step(be);
    if (ms_gpu_be_profiling(be)) return ms_fail(err, MS_ERR_UNSUPPORTED, "graph: not while profiling (the ops' events)");
    if (st->capturing) return ms_fail(err, MS_ERR_ARG, "graph: already recording");
    int rc = ms_gpu_be_report(be, err);
    if (rc) return rc;
    if (gpuStreamBeginCapture(ms_gpu_be_dev(be)->stream, gpuStreamCaptureModeThreadLocal) != gpuSuccess) {
        (void)gpuGetLastError();
        return ms_fail(err, MS_ERR_UNSUPPORTED, "graph: the stream cannot record");
    }
    int *failed;
    ms_err *fail;
    ms_gpu_be_fail_state(be, &failed, &fail);
    st->capturing = 1;
    st->cap_failed = *failed;
    st->cap_fail = *fail;
    return MS_OK;
}
static int g_graph_end(ms_backend *be, void **graph, ms_err *err) {
    ms_gpu_step_state *st = ms_gpu_be_step(be);
    ms_gpu *g = ms_gpu_be_dev(be);
    int *failed;
    ms_err *fail;
    ms_gpu_be_fail_state(be, &failed, &fail);
    *graph = NULL;
    if (!st->capturing) return ms_fail(err, MS_ERR_ARG, "graph: not recording");
    st->capturing = 0;
    gpuGraph_t gr = NULL;
    gpuError_t ge = gpuStreamEndCapture(g->stream, &gr);
    int bad = ge != gpuSuccess || !gr || (*failed && !st->cap_failed);
    gpuGraphExec_t ex = NULL;
    if (!bad) ms_graph_edges(gr, &st->edges, &st->prog_edges);
    if (!bad && gpuGraphInstantiateWithFlags(&ex, gr, 0) != gpuSuccess) bad = 1, ex = NULL;
    if (gr) (void)gpuGraphDestroy(gr);
    (void)gpuGetLastError();
    step_graph *sg = bad ? NULL : (step_graph *)calloc(1, sizeof *sg);
    if (!sg) {
        if (ex) (void)gpuGraphExecDestroy(ex);
        *failed = st->cap_failed, *fail = st->cap_fail; /* the ops' failures were the recording's */
        return ms_fail(err, MS_ERR_UNSUPPORTED, "graph: the step could not be recorded");
    }
    sg->exec = ex, sg->gen = st->gen, sg->cnt = g->cnt;
    *graph = sg;
    return MS_OK;
}
static int g_graph_launch(ms_backend *be, void *graph, ms_err *err) {
    step_graph *sg = (step_graph *)graph;
    ms_gpu *g = ms_gpu_be_dev(be);
    if (!sg) return ms_fail(err, MS_ERR_ARG, "graph: none");
    if (ms_gpu_be_profiling(be)) return ms_fail(err, MS_ERR_UNSUPPORTED, "graph: not while profiling (the ops' events)");
    if (sg->gen != ms_gpu_be_step(be)->gen || sg->cnt != g->cnt)
        return ms_fail(err, MS_ERR_LIMIT, "graph: the backend's scratch moved since the recording");
    int rc = ms_gpu_be_report(be, err);
    if (rc) return rc;
    return ms_gpu_check(gpuGraphLaunch(sg->exec, g->stream), err, "launching a recorded step");
}
static void g_graph_free(ms_backend *be, void *graph) {
    step_graph *sg = (step_graph *)graph;
    if (!sg) return;
    (void)gpuGraphExecDestroy(sg->exec);
    free(sg);
}

extern "C" void ms_backend_gpu_graph_edges(ms_backend *be, uint64_t *edges, uint64_t *programmatic) {
    ms_gpu_step_state *st = ms_gpu_be_step(be);
    *edges = st->edges, *programmatic = st->prog_edges;
}

void ms_gpu_step_fill(ms_backend_ops *o) {
    o->qkv_at = g_qkv_at;
    o->latent_at = g_latent_at;
    o->graph_begin = g_graph_begin;
    o->graph_end = g_graph_end;
    o->graph_launch = g_graph_launch;
    o->graph_free = g_graph_free;
    o->argmax = g_argmax;
    const char *sn = getenv("MS_GPU_STEP_NEXT"); /* MS_GPU_STEP_NEXT=0: the engine uploads every step (A/B) */
    o->argmax_step = sn && !strcmp(sn, "0") ? NULL : g_argmax_step;
    o->qkv_attn_at = g_qkv_attn_at;
}
