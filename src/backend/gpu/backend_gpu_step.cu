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
__global__ void __launch_bounds__(1024) k_argmax(const float *x, int64_t n, int32_t *out) {
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
        *out = x0 != x0 ? 0 : (int32_t)bi;
    }
}
static void g_argmax(ms_backend *be, const float *x, int64_t n, int32_t *out) {
    if (n < 1) return;
    ms_gpu *g = ms_gpu_be_dev(be);
    ms_launch(g->pdl, k_argmax, dim3(1), dim3(1024), 0, g->stream, x, n, out);
    launched(be, "argmax");
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
}
