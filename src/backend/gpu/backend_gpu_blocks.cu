/* backend_gpu_blocks.cu — the GPU backend's ops of the linear-attention (KDA,
 * gated DeltaNet), sparse / compressed attention (the DSA indexer, DeepSeek V4's
 * compressors and attention core) and residual-stream (mHC) sections of
 * core/backend.h, on the backend's one stream. The CPU backend's ops are the
 * reference (tests/gpu/test_gpu.c compares each with it); results agree to F32
 * rounding, not bit for bit.
 *
 * Forms, correctness first (F32 throughout):
 *  - kda_forward / gdn_forward: the projections are the backend's matmuls; the short
 *    convolutions one thread per channel over the tokens; the delta rule the
 *    token-by-token recurrence for every n (decode and prefill alike), one block per
 *    (value head, 32 state columns) with that tile of the state in shared memory.
 *  - dsa_index / dsa_recheck: key LayerNorm + RoPE, query RoPE, the cache append and
 *    KPool pooling, and the index scores on the device; the scores are downloaded and
 *    the selection is made on the host by ops/dsa.h's ms_dsa_topk, the CPU's own
 *    step-by-step emulation of torch.topk, so the tie rule is the CPU's by
 *    construction (the selection is a host array anyway). One host sync per call.
 *  - attn_compressed: HCA entirely on the device; CSA scores its entries on the
 *    device and picks them on the host with ms_dsa_topk as above (one sync).
 *  - compress_append, mhc_*: elementwise / per-token kernels, matmuls for fn.
 *  - layernorm (one block per row, sums in double), clamp (elementwise): DBRX and PhiMoE.
 * Every runtime name goes through gpu_port.h (hipcc compiles this file too). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gpu_internal.h"
extern "C" { /* the C headers: the reference's DSA top-k, RoPE angles, block checks */
#include "core/backend.h"
}
#include "backend/gpu/backend_gpu.h"
#include "backend/gpu/backend_gpu_blocks.h"
#include "backend/gpu/gemm.h" /* the prefill GEMMs of the projections */
#include "backend/gpu/backend_gpu_step.h" /* the recording state: scratch moves stale a recorded step */

#define BLK_SLICE 1024 /* tokens per pass of the linear-attention blocks (bounds the scratch) */
#define BLK_THREADS 128
#define DSA_SCORE_FLOATS ((int64_t)1 << 24) /* index scores per download */

typedef struct {
    float *scr; /* device scratch */
    size_t scr_cap;
    void *tab; /* device copies of host tables (RoPE angles, selections) */
    size_t tab_cap;
    void *host; /* host scratch */
    size_t host_cap;
    int kda_old; /* MS_GPU_KDA=old when the state was made: decode through the correctness-first ops */
} blk_state;

static blk_state *bs(ms_backend *be) {
    void **slot = ms_gpu_be_blocks(be);
    if (!*slot) {
        blk_state *s = (blk_state *)calloc(1, sizeof(blk_state));
        const char *e = getenv("MS_GPU_KDA"); /* read once per backend: A/B runs in one binary */
        if (s) s->kda_old = e && !strcmp(e, "old");
        *slot = s;
    }
    return (blk_state *)*slot;
}

void ms_gpu_blocks_free(ms_backend *be) {
    void **slot = ms_gpu_be_blocks(be);
    blk_state *s = (blk_state *)*slot;
    if (!s) return;
    ms_gpu *g = ms_gpu_be_dev(be);
    if (g) {
        ms_gpu_free(g, s->scr);
        ms_gpu_free(g, s->tab);
    }
    free(s->host);
    free(s);
    *slot = NULL;
}

/* device scratch of at least `floats` (old contents not kept) */
static int scratch(ms_backend *be, size_t floats, float **out, ms_err *err) {
    blk_state *s = bs(be);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "out of host memory");
    if (s->scr_cap < floats) {
        ms_gpu_step_state *st = ms_gpu_be_step(be); /* KDA decode is part of the replayable step */
        if (st->capturing) return ms_fail(err, MS_ERR_LIMIT, "gpu: linear-attention scratch grows during a recorded step");
        st->gen++;
        ms_gpu *g = ms_gpu_be_dev(be);
        ms_gpu_free(g, s->scr);
        s->scr = NULL, s->scr_cap = 0;
        void *p = NULL;
        int rc = ms_gpu_alloc(g, floats * 4 + 256, &p, err);
        if (rc) return rc;
        s->scr = (float *)p, s->scr_cap = floats;
    }
    *out = s->scr;
    return MS_OK;
}
/* a device copy of `bytes` of host data (waits for nothing: the upload is from pageable memory) */
static int table(ms_backend *be, const void *host, size_t bytes, void **out, ms_err *err) {
    blk_state *s = bs(be);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "out of host memory");
    ms_gpu *g = ms_gpu_be_dev(be);
    if (s->tab_cap < bytes) {
        ms_gpu_free(g, s->tab);
        s->tab = NULL, s->tab_cap = 0;
        void *p = NULL;
        int rc = ms_gpu_alloc(g, bytes + 256, &p, err);
        if (rc) return rc;
        s->tab = p, s->tab_cap = bytes;
    }
    *out = s->tab;
    return bytes ? ms_gpu_upload(g, s->tab, host, bytes, err) : MS_OK;
}
static int host_buf(ms_backend *be, size_t bytes, void **out, ms_err *err) {
    blk_state *s = bs(be);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "out of host memory");
    if (s->host_cap < bytes) {
        void *p = realloc(s->host, bytes);
        if (!p) return ms_fail(err, MS_ERR_NOMEM, "out of host memory (%zu bytes)", bytes);
        s->host = p, s->host_cap = bytes;
    }
    *out = s->host;
    return MS_OK;
}

static unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* ------------------------------------------------------------ shared device helpers */

/* A stored F32 / BF16 / F16 vector (KDA / GDN parameters are qmats). */
typedef struct {
    const void *p;
    int dt; /* 0 F32, 1 BF16, 2 F16 */
} vec_t;
static int vec_of(const ms_qmat *m, vec_t *v, const char *what, ms_err *err) {
    if (!m->data) return ms_fail(err, MS_ERR_SHAPE, "%s: missing", what);
    if (m->dtype != MS_DT_F32 && m->dtype != MS_DT_BF16 && m->dtype != MS_DT_F16)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: dtype %s (want F32, BF16 or F16)", what, ms_dtype_name(m->dtype));
    v->p = m->data;
    v->dt = m->dtype == MS_DT_F32 ? 0 : m->dtype == MS_DT_BF16 ? 1 : 2;
    return MS_OK;
}
static __device__ __forceinline__ float vat(vec_t v, int64_t i) {
    return v.dt == 0 ? ((const float *)v.p)[i]
           : v.dt == 1 ? ms_bf16_to_f32_dev(((const uint16_t *)v.p)[i])
                       : ms_f16_to_f32_dev(((const uint16_t *)v.p)[i]);
}

static __device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* sum over the block (every thread gets it; blockDim a power of two <= 256); sh: 256 slots */
template <typename T> static __device__ T block_sum(T v, T *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads();
    return r;
}

/* ------------------------------------------------------------ linear attention */

/* Causal depthwise convolution with carried state, one thread per channel (ms_short_conv). */
__global__ void k_short_conv(float *y, const float *x, int64_t ld, int n, int C, int K, vec_t w, float *state,
                             int silu) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float hist[16], wc[16];
    for (int s = 0; s < K; s++) wc[s] = vat(w, (int64_t)c * K + s);
    for (int s = 0; s < K - 1; s++) hist[s] = state[(int64_t)c * (K - 1) + s];
    for (int t = 0; t < n; t++) {
        hist[K - 1] = x[(int64_t)t * ld + c];
        float acc = 0;
        for (int s = 0; s < K; s++) acc += wc[s] * hist[s];
        for (int s = 0; s < K - 1; s++) hist[s] = hist[s + 1];
        y[(int64_t)t * ld + c] = silu ? acc / (1.0f + expf(-acc)) : acc;
    }
    for (int s = 0; s < K - 1; s++) state[(int64_t)c * (K - 1) + s] = hist[s];
}

/* The decay gate in place (ms_decay_gate): rows of heads * width. */
__global__ void k_decay_gate(float *f, int64_t ld, int n, int heads, int width, vec_t A_log, int has_A, vec_t bias,
                             int has_bias, int lower, float lb) {
    int64_t total = (int64_t)n * heads * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / ((int64_t)heads * width), hc = i % ((int64_t)heads * width);
        int h = (int)(hc / width);
        float A = has_A ? expf(vat(A_log, h)) : 1.0f;
        float x = f[t * ld + hc] + (has_bias ? vat(bias, hc) : 0.0f);
        f[t * ld + hc] = lower ? lb * (1.0f / (1.0f + expf(-A * x))) : -A * (x > 20.0f ? x : logf(1.0f + expf(x)));
    }
}

__global__ void k_sigmoid_rows(float *x, int64_t ld, int n, int width) {
    int64_t total = (int64_t)n * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        x[(i / width) * ld + i % width] = sigm(x[(i / width) * ld + i % width]);
}

#define KDA1_MAXD 256 /* head dims the step kernel holds (d % 32 == 0) */
#define KDA1_THREADS 256
#define KDA1_NC 32 /* state columns per block */

/* the sum over the block of one value per thread (KDA1_THREADS threads); sh: KDA1_THREADS / MS_WARP slots */
static __device__ float kda1_bsum(float v, float *sh) {
    v = ms_warp_sum(v);
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = 0;
    for (int w = 0; w < KDA1_THREADS / MS_WARP; w++) t += sh[w];
    return t;
}

/* sum of v over the lanes of this warp that hold the same column quad (lane % 8) */
static __device__ __forceinline__ float kda1_rgsum(float v) {
    for (int off = 8; off < MS_WARP; off <<= 1) v += ms_shfl_xor(v, off);
    return v;
}

typedef struct {
    const float *q, *k, *v, *g, *beta;
    int64_t ld_q, ld_k, ld_v, ld_g, ld_beta, ld_o;
    float *o, *S;
    int n, Hk, Hv, dk, dv, g_per_head, ncol;
    float eps, scale;
} delta_a;

/* The delta rule, token by token (ms_delta_recurrent): block (value head h, columns
 * e0..e0+ncol) holds S[h][:, e0..] in shared memory over all tokens. */
__global__ void __launch_bounds__(BLK_THREADS) k_delta(delta_a a) {
    extern __shared__ float sh[];
    __shared__ float red[256];
    const int h = blockIdx.x, e0 = blockIdx.y * a.ncol, dk = a.dk, ncol = a.ncol;
    const int hq = h / (a.Hv / a.Hk);
    float *St = sh, *qn = St + (size_t)dk * ncol, *kn = qn + dk, *dec = kn + dk;
    float *S = a.S + (size_t)h * dk * a.dv;
    const int j = threadIdx.x, e = e0 + j, live = j < ncol && e < a.dv;
    for (int64_t i = threadIdx.x; i < (int64_t)dk * ncol; i += blockDim.x) {
        int r = (int)(i / ncol), cc = (int)(i % ncol);
        St[i] = e0 + cc < a.dv ? S[(size_t)r * a.dv + e0 + cc] : 0.0f;
    }
    for (int t = 0; t < a.n; t++) {
        const float *qt = a.q + (int64_t)t * a.ld_q + (int64_t)hq * dk, *kt = a.k + (int64_t)t * a.ld_k + (int64_t)hq * dk;
        float sq = 0, sk = 0;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) sq += qt[i] * qt[i], sk += kt[i] * kt[i];
        sq = block_sum(sq, red);
        sk = block_sum(sk, red);
        float nq = a.scale / sqrtf(sq + a.eps), nk = 1.0f / sqrtf(sk + a.eps);
        const float *gt = a.g + (int64_t)t * a.ld_g;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            qn[i] = qt[i] * nq;
            kn[i] = kt[i] * nk;
            dec[i] = expf(a.g_per_head ? gt[h] : gt[(int64_t)h * dk + i]);
        }
        __syncthreads();
        if (live) {
            float kv = 0;
            for (int i = 0; i < dk; i++) {
                float s = St[i * ncol + j] * dec[i];
                St[i * ncol + j] = s;
                kv += kn[i] * s;
            }
            float u = a.beta[(int64_t)t * a.ld_beta + h] * (a.v[(int64_t)t * a.ld_v + (int64_t)h * a.dv + e] - kv);
            float o = 0;
            for (int i = 0; i < dk; i++) {
                float s = St[i * ncol + j] + kn[i] * u;
                St[i * ncol + j] = s;
                o += qn[i] * s;
            }
            a.o[(int64_t)t * a.ld_o + (int64_t)h * a.dv + e] = o;
        }
        __syncthreads();
    }
    for (int64_t i = threadIdx.x; i < (int64_t)dk * ncol; i += blockDim.x) {
        int r = (int)(i / ncol), cc = (int)(i % ncol);
        if (e0 + cc < a.dv) S[(size_t)r * a.dv + e0 + cc] = St[i];
    }
}

/* The delta rule over a.n tokens with the state tile in registers (dk % 32 == 0, dk <= 256,
 * dv % 32 == 0): block (value head h, columns e0 .. e0 + 31) of 256 threads, thread (row group
 * rg, column quad cq) holding S[h][rg + 32 r][e0 + 4 cq .. + 3] (k_kda_step's layout) across the
 * tokens; per token the L2 norms and both products over the keys are block sums (shuffles, then
 * one shared row per warp) instead of k_delta's serial loops. Same arithmetic, other orders. */
__global__ void __launch_bounds__(KDA1_THREADS) k_delta_tile(delta_a a) {
    __shared__ float qs[KDA1_MAXD], ks[KDA1_MAXD], dec[KDA1_MAXD], vv[KDA1_NC];
    __shared__ float red[KDA1_THREADS / MS_WARP][KDA1_NC], sums[2][KDA1_THREADS / MS_WARP];
    const int h = blockIdx.x, e0 = blockIdx.y * KDA1_NC, dk = a.dk, dv = a.dv, tid = threadIdx.x;
    const int hq = h / (a.Hv / a.Hk), cq = tid & 7, rg = tid >> 3, R = dk >> 5, lane = tid % MS_WARP,
              warp = tid / MS_WARP;
    float *S = a.S + (int64_t)h * dk * dv;
    float4 s[KDA1_MAXD / 32];
#pragma unroll
    for (int r = 0; r < KDA1_MAXD / 32; r++)
        if (r < R) s[r] = *(const float4 *)(S + (int64_t)(rg + 32 * r) * dv + e0 + 4 * cq);
    for (int t = 0; t < a.n; t++) {
        const float *qt = a.q + (int64_t)t * a.ld_q + (int64_t)hq * dk, *kt = a.k + (int64_t)t * a.ld_k + (int64_t)hq * dk;
        const float *gt = a.g + (int64_t)t * a.ld_g;
        float pq = 0, pk = 0;
        for (int i = tid; i < dk; i += KDA1_THREADS) {
            float x = qt[i], y = kt[i];
            qs[i] = x, ks[i] = y, pq += x * x, pk += y * y;
            dec[i] = expf(a.g_per_head ? gt[h] : gt[(int64_t)h * dk + i]);
        }
        if (tid < KDA1_NC) vv[tid] = a.v[(int64_t)t * a.ld_v + (int64_t)h * dv + e0 + tid];
        pq = ms_warp_sum(pq), pk = ms_warp_sum(pk);
        if (lane == 0) sums[0][warp] = pq, sums[1][warp] = pk;
        __syncthreads();
        float sq = 0, sk = 0;
        for (int w = 0; w < KDA1_THREADS / MS_WARP; w++) sq += sums[0][w], sk += sums[1][w];
        const float nq = a.scale / sqrtf(sq + a.eps), nk = 1.0f / sqrtf(sk + a.eps);
        const float beta = a.beta[(int64_t)t * a.ld_beta + h];
        float kv0 = 0, kv1 = 0, kv2 = 0, kv3 = 0;
#pragma unroll
        for (int r = 0; r < KDA1_MAXD / 32; r++)
            if (r < R) {
                const int i = rg + 32 * r;
                const float di = dec[i], ki = ks[i] * nk;
                s[r].x *= di, s[r].y *= di, s[r].z *= di, s[r].w *= di;
                kv0 += ki * s[r].x, kv1 += ki * s[r].y, kv2 += ki * s[r].z, kv3 += ki * s[r].w;
            }
        kv0 = kda1_rgsum(kv0), kv1 = kda1_rgsum(kv1), kv2 = kda1_rgsum(kv2), kv3 = kda1_rgsum(kv3);
        if (lane < 8) red[warp][4 * cq] = kv0, red[warp][4 * cq + 1] = kv1, red[warp][4 * cq + 2] = kv2, red[warp][4 * cq + 3] = kv3;
        __syncthreads();
        float u[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float tt = 0;
            for (int w = 0; w < KDA1_THREADS / MS_WARP; w++) tt += red[w][4 * cq + j];
            u[j] = beta * (vv[4 * cq + j] - tt);
        }
        __syncthreads();
        float o0 = 0, o1 = 0, o2 = 0, o3 = 0;
#pragma unroll
        for (int r = 0; r < KDA1_MAXD / 32; r++)
            if (r < R) {
                const int i = rg + 32 * r;
                const float ki = ks[i] * nk, qi = qs[i] * nq;
                s[r].x += ki * u[0], s[r].y += ki * u[1], s[r].z += ki * u[2], s[r].w += ki * u[3];
                o0 += qi * s[r].x, o1 += qi * s[r].y, o2 += qi * s[r].z, o3 += qi * s[r].w;
            }
        o0 = kda1_rgsum(o0), o1 = kda1_rgsum(o1), o2 = kda1_rgsum(o2), o3 = kda1_rgsum(o3);
        if (lane < 8) red[warp][4 * cq] = o0, red[warp][4 * cq + 1] = o1, red[warp][4 * cq + 2] = o2, red[warp][4 * cq + 3] = o3;
        __syncthreads();
        if (tid < KDA1_NC) {
            float tt = 0;
            for (int w = 0; w < KDA1_THREADS / MS_WARP; w++) tt += red[w][tid];
            a.o[(int64_t)t * a.ld_o + (int64_t)h * dv + e0 + tid] = tt;
        }
        __syncthreads(); /* qs / ks / dec / vv / red / sums are the next token's */
    }
#pragma unroll
    for (int r = 0; r < KDA1_MAXD / 32; r++)
        if (r < R) *(float4 *)(S + (int64_t)(rg + 32 * r) * dv + e0 + 4 * cq) = s[r];
}

static int run_delta(ms_backend *be, delta_a a, ms_err *err) {
    blk_state *bst = bs(be);
    if (bst && !bst->kda_old && a.dk % 32 == 0 && a.dk <= KDA1_MAXD && a.dv % KDA1_NC == 0 &&
        ((uintptr_t)a.S & 15) == 0) {
        k_delta_tile<<<dim3((unsigned)a.Hv, (unsigned)(a.dv / KDA1_NC)), KDA1_THREADS, 0, ms_gpu_be_dev(be)->stream>>>(a);
        return ms_gpu_launched(err, "delta rule");
    }
    int ncol = a.dv < 32 ? a.dv : 32;
    while (ncol > 1 && ((size_t)a.dk * ncol + 3 * (size_t)a.dk) * 4 > 40 * 1024) ncol /= 2;
    size_t shm = ((size_t)a.dk * ncol + 3 * (size_t)a.dk) * 4;
    if (shm > 46 * 1024)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "delta rule: key head size %d beyond the %s kernel's shared memory", a.dk,
                       MS_GPU_BACKEND_NAME);
    a.ncol = ncol;
    dim3 grid((unsigned)a.Hv, (unsigned)((a.dv + ncol - 1) / ncol));
    k_delta<<<grid, BLK_THREADS, shm, ms_gpu_be_dev(be)->stream>>>(a);
    return ms_gpu_launched(err, "delta rule");
}

/* y = x / sqrt(mean(x^2) + eps) * w * act(gate), one block per row (ms_gated_rmsnorm) */
__global__ void k_gated_rmsnorm(float *y, const float *x, const float *gate, int d, vec_t w, float eps, int silu) {
    __shared__ float red[256];
    int64_t r = blockIdx.x;
    const float *xr = x + r * d, *gr = gate + r * d;
    float ss = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float g = gr[i], gv = silu ? g / (1.0f + expf(-g)) : sigm(g);
        y[r * d + i] = xr[i] * inv * vat(w, i) * gv;
    }
}

static int conv_launch(ms_backend *be, float *y, int64_t ld, int m, int C, const ms_qmat *w, float *state,
                       const char *what, ms_err *err) {
    vec_t v;
    int rc = vec_of(w, &v, what, err);
    if (rc) return rc;
    if (w->rows != C || w->cols < 1 || w->cols > 16)
        return ms_fail(err, MS_ERR_SHAPE, "%s: [%lld, %lld], want [%d, 1..16]", what, (long long)w->rows,
                       (long long)w->cols, C);
    k_short_conv<<<grid_for(C, 128), 128, 0, ms_gpu_be_dev(be)->stream>>>(y, y, ld, m, C, (int)w->cols, v, state, 1);
    return ms_gpu_launched(err, what);
}

static int gate_launch(ms_backend *be, float *f, int64_t ld, int m, int heads, int width, const ms_qmat *A_log,
                       const ms_qmat *dt_bias, int lower, float lb, ms_err *err) {
    vec_t A = {0, 0}, bias = {0, 0};
    int rc;
    if (A_log && A_log->data && (rc = vec_of(A_log, &A, "decay gate A_log", err))) return rc;
    if (dt_bias && dt_bias->data && (rc = vec_of(dt_bias, &bias, "decay gate dt_bias", err))) return rc;
    int64_t total = (int64_t)m * heads * width;
    k_decay_gate<<<grid_for(total, 256), 256, 0, ms_gpu_be_dev(be)->stream>>>(f, ld, m, heads, width, A, A.p != NULL,
                                                                            bias, bias.p != NULL, lower, lb);
    return ms_gpu_launched(err, "decay gate");
}

static int gnorm_launch(ms_backend *be, float *o, const float *gate, int64_t rows, int d, const ms_qmat *w, float eps,
                        int silu, ms_err *err) {
    vec_t v;
    int rc = vec_of(w, &v, "gated rmsnorm weight", err);
    if (rc) return rc;
    if (rows < 1) return MS_OK;
    if (rows > 0x7fffffff) return ms_fail(err, MS_ERR_LIMIT, "gated rmsnorm: %lld rows", (long long)rows);
    k_gated_rmsnorm<<<(unsigned)rows, 128, 0, ms_gpu_be_dev(be)->stream>>>(o, o, gate, d, v, eps, silu);
    return ms_gpu_launched(err, "gated rmsnorm");
}

/* ---- KDA decode (one token) in four launches: the six projections of x in one matvec launch,
 * f_b / g_b in one, k_kda_step (convolutions, decay gate, beta, L2 norms, the delta rule, the
 * gated RMSNorm), o_proj. */

typedef struct {
    const float *q, *k, *v; /* the projections of x before the convolutions [C] */
    const float *f;         /* f_b's output [C] (before the decay gate) */
    const float *braw;      /* b_proj's output [H] (before the sigmoid) */
    const float *gate;      /* the output gate [C] (before the sigmoid) */
    float *o;               /* [C]: written normed and gated */
    float *S;               /* [H][d][d] */
    float *conv;            /* [3][C][K-1]: q, k, v */
    int *cnt;               /* [H] arrival counters, zero between launches */
    vec_t qw, kw, vw, A_log, dt_bias, onorm;
    int has_A, has_bias, lower, H, d, K;
    float lb, eps, scale, norm_eps;
} kda1_a;

/* The causal convolution of channel c with its K - 1 carried inputs, SiLU after (ms_short_conv). */
static __device__ __forceinline__ float kda1_conv(vec_t w, const float *st, float x, int64_t c, int K) {
    float acc = 0;
    for (int t = 0; t < K - 1; t++) acc += vat(w, c * K + t) * st[t];
    acc += vat(w, c * K + K - 1) * x;
    return acc / (1.0f + expf(-acc));
}
static __device__ __forceinline__ void kda1_shift(float *st, float x, int K) {
    for (int t = 0; t < K - 2; t++) st[t] = st[t + 1];
    if (K > 1) st[K - 2] = x;
}

/* Block (head h, state columns e0 .. e0 + 31): thread (row group rg, column quad cq) holds
 * S[h][rg + 32 r][e0 + 4 cq .. + 3] in registers. The last block of a head to arrive (the
 * counter) applies the gated RMSNorm over the head's d outputs and moves the q / k
 * convolution states (every block of the head reads them); each block moves its own v
 * channels' state. Same arithmetic as the op-by-op path (k_short_conv, k_decay_gate, k_delta,
 * k_gated_rmsnorm), other summation orders. */
__global__ void __launch_bounds__(KDA1_THREADS) k_kda_step(kda1_a a) {
    __shared__ float qs[KDA1_MAXD], ks[KDA1_MAXD], dec[KDA1_MAXD], vv[KDA1_NC];
    __shared__ float red[KDA1_THREADS / MS_WARP][KDA1_NC], sums[KDA1_THREADS / MS_WARP];
    __shared__ int last;
    const int h = blockIdx.x, e0 = blockIdx.y * KDA1_NC, d = a.d, K = a.K, tid = threadIdx.x;
    const int cq = tid & 7, rg = tid >> 3, R = d >> 5, lane = tid % MS_WARP, warp = tid / MS_WARP;
    const int64_t C = (int64_t)a.H * d, hd = (int64_t)h * d;
    float *S = a.S + hd * d;
    float *cs_q = a.conv, *cs_k = cs_q + C * (K - 1), *cs_v = cs_k + C * (K - 1);
    float4 s[KDA1_MAXD / 32];
#pragma unroll
    for (int r = 0; r < KDA1_MAXD / 32; r++)
        if (r < R) s[r] = *(const float4 *)(S + (int64_t)(rg + 32 * r) * d + e0 + 4 * cq);
    for (int i = tid; i < 2 * d + KDA1_NC; i += KDA1_THREADS) {
        if (i < d) {
            qs[i] = kda1_conv(a.qw, cs_q + (hd + i) * (K - 1), a.q[hd + i], hd + i, K);
        } else if (i < 2 * d) {
            ks[i - d] = kda1_conv(a.kw, cs_k + (hd + i - d) * (K - 1), a.k[hd + i - d], hd + i - d, K);
        } else {
            int64_t c = hd + e0 + (i - 2 * d);
            float *st = cs_v + c * (K - 1), x = a.v[c];
            vv[i - 2 * d] = kda1_conv(a.vw, st, x, c, K);
            kda1_shift(st, x, K); /* only this block reads these channels */
        }
    }
    const float A = a.has_A ? expf(vat(a.A_log, h)) : 1.0f;
    for (int i = tid; i < d; i += KDA1_THREADS) {
        float x = a.f[hd + i] + (a.has_bias ? vat(a.dt_bias, hd + i) : 0.0f);
        float g = a.lower ? a.lb * (1.0f / (1.0f + expf(-A * x))) : -A * (x > 20.0f ? x : logf(1.0f + expf(x)));
        dec[i] = expf(g);
    }
    __syncthreads();
    float pq = 0, pk = 0;
    for (int i = tid; i < d; i += KDA1_THREADS) pq += qs[i] * qs[i], pk += ks[i] * ks[i];
    const float nq = a.scale / sqrtf(kda1_bsum(pq, sums) + a.eps);
    const float nk = 1.0f / sqrtf(kda1_bsum(pk, sums) + a.eps);
    const float beta = sigm(a.braw[h]);
    float kv0 = 0, kv1 = 0, kv2 = 0, kv3 = 0;
#pragma unroll
    for (int r = 0; r < KDA1_MAXD / 32; r++)
        if (r < R) {
            const int i = rg + 32 * r;
            const float di = dec[i], ki = ks[i] * nk;
            s[r].x *= di, s[r].y *= di, s[r].z *= di, s[r].w *= di;
            kv0 += ki * s[r].x, kv1 += ki * s[r].y, kv2 += ki * s[r].z, kv3 += ki * s[r].w;
        }
    kv0 = kda1_rgsum(kv0), kv1 = kda1_rgsum(kv1), kv2 = kda1_rgsum(kv2), kv3 = kda1_rgsum(kv3);
    if (lane < 8) red[warp][4 * cq] = kv0, red[warp][4 * cq + 1] = kv1, red[warp][4 * cq + 2] = kv2, red[warp][4 * cq + 3] = kv3;
    __syncthreads();
    float u[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float t = 0;
        for (int w = 0; w < KDA1_THREADS / MS_WARP; w++) t += red[w][4 * cq + j];
        u[j] = beta * (vv[4 * cq + j] - t);
    }
    __syncthreads();
    float o0 = 0, o1 = 0, o2 = 0, o3 = 0;
#pragma unroll
    for (int r = 0; r < KDA1_MAXD / 32; r++)
        if (r < R) {
            const int i = rg + 32 * r;
            const float ki = ks[i] * nk, qi = qs[i] * nq;
            s[r].x += ki * u[0], s[r].y += ki * u[1], s[r].z += ki * u[2], s[r].w += ki * u[3];
            o0 += qi * s[r].x, o1 += qi * s[r].y, o2 += qi * s[r].z, o3 += qi * s[r].w;
            *(float4 *)(S + (int64_t)i * d + e0 + 4 * cq) = s[r];
        }
    o0 = kda1_rgsum(o0), o1 = kda1_rgsum(o1), o2 = kda1_rgsum(o2), o3 = kda1_rgsum(o3);
    if (lane < 8) red[warp][4 * cq] = o0, red[warp][4 * cq + 1] = o1, red[warp][4 * cq + 2] = o2, red[warp][4 * cq + 3] = o3;
    __syncthreads();
    if (tid < KDA1_NC) {
        float t = 0;
        for (int w = 0; w < KDA1_THREADS / MS_WARP; w++) t += red[w][tid];
        a.o[hd + e0 + tid] = t;
    }
    if (gridDim.y > 1) { /* the head's last block to arrive goes on */
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            int prev = atomicAdd(&a.cnt[h], 1);
            last = prev == (int)gridDim.y - 1;
            if (last) a.cnt[h] = 0;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
    } else {
        __syncthreads();
    }
    volatile float *ov = a.o + hd;
    float ss = 0;
    for (int i = tid; i < d; i += KDA1_THREADS) {
        float x = ov[i];
        ss += x * x;
    }
    const float inv = 1.0f / sqrtf(kda1_bsum(ss, sums) / (float)d + a.norm_eps);
    for (int i = tid; i < d; i += KDA1_THREADS) ov[i] = ov[i] * inv * vat(a.onorm, i) * sigm(a.gate[hd + i]);
    for (int i = tid; i < 2 * d; i += KDA1_THREADS) { /* every block of the head has read these */
        if (i < d) kda1_shift(cs_q + (hd + i) * (K - 1), a.q[hd + i], K);
        else kda1_shift(cs_k + (hd + i - d) * (K - 1), a.k[hd + i - d], K);
    }
}

/* Whether the one-token kernels take this block (else the op-by-op path). */
static int kda_step_fits(const ms_kda_config *c, const ms_kda_state *st) {
    const int d = c->head_dim;
    return d % 32 == 0 && d <= KDA1_MAXD && c->conv_kernel <= 16 && ((uintptr_t)st->S & 15) == 0;
}

static int kda_step(ms_backend *be, const ms_kda_config *c, const ms_kda_weights *w, ms_kda_state *st, const float *x,
                    float *out, ms_err *err) {
    const int H = c->heads, d = c->head_dim, C = H * d, K = c->conv_kernel;
    ms_gpu *g = ms_gpu_be_dev(be);
    float *buf;
    int rc;
    if ((rc = scratch(be, 6 * (size_t)C + 2 * (size_t)d + (size_t)H + 64, &buf, err))) return rc;
    float *q = buf, *k = q + C, *v = k + C, *f = v + C, *gate = f + C, *o = gate + C, *lrf = o + C, *lrg = lrf + d;
    float *braw = lrg + d;
    int *cnt = ms_gpu_counters(g, H, err); /* zero between launches: each head's last block resets its own */
    if (!cnt) return err ? err->code : MS_ERR_NOMEM;
    kda1_a a;
    memset(&a, 0, sizeof a);
    if ((rc = vec_of(&w->q_conv, &a.qw, "KDA q_conv1d", err)) || (rc = vec_of(&w->k_conv, &a.kw, "KDA k_conv1d", err)) ||
        (rc = vec_of(&w->v_conv, &a.vw, "KDA v_conv1d", err)) || (rc = vec_of(&w->o_norm, &a.onorm, "KDA o_norm", err)) ||
        (w->A_log.data && (rc = vec_of(&w->A_log, &a.A_log, "decay gate A_log", err))) ||
        (w->dt_bias.data && (rc = vec_of(&w->dt_bias, &a.dt_bias, "decay gate dt_bias", err))))
        return rc;
    ms_matmul_job ja[6], jb[2];
    const ms_qmat *wa[6] = {&w->q_proj, &w->k_proj, &w->v_proj, &w->f_a, &w->b_proj,
                            c->full_rank_gate ? &w->g_proj : &w->g_a};
    float *ya[6] = {q, k, v, lrf, braw, c->full_rank_gate ? gate : lrg};
    for (int i = 0; i < 6; i++) ja[i].y = ya[i], ja[i].x = x, ja[i].n = 1, ja[i].w = wa[i], ja[i].acc = 0;
    jb[0].y = f, jb[0].x = lrf, jb[0].w = &w->f_b;
    jb[1].y = gate, jb[1].x = lrg, jb[1].w = &w->g_b;
    for (int i = 0; i < 2; i++) jb[i].n = 1, jb[i].acc = 0;
    if ((rc = ms_gpu_matmul_many(g, ja, 6, err)) || (rc = ms_gpu_matmul_many(g, jb, c->full_rank_gate ? 1 : 2, err)))
        return rc;
    a.q = q, a.k = k, a.v = v, a.f = f, a.braw = braw, a.gate = gate, a.o = o, a.S = st->S, a.conv = st->conv;
    a.cnt = cnt, a.has_A = a.A_log.p != NULL, a.has_bias = a.dt_bias.p != NULL;
    a.lower = c->decay == MS_DECAY_LOWER_BOUND, a.lb = c->lower_bound, a.H = H, a.d = d, a.K = K;
    a.eps = 1e-6f, a.scale = 1.0f / sqrtf((float)d), a.norm_eps = c->norm_eps;
    k_kda_step<<<dim3((unsigned)H, (unsigned)(d / KDA1_NC)), KDA1_THREADS, 0, g->stream>>>(a);
    if ((rc = ms_gpu_launched(err, "KDA decode step"))) return rc;
    return ms_gpu_matmul(g, out, o, 1, &w->o_proj, 0, err);
}

/* y = W x of n tokens: through the backend's GEMM hook (gemm.cu) when n reaches its threshold
 * (prefill chunks), else the matvec kernels (MS_GPU_KDA=old: the kernels always). */
static int blk_matmul(ms_backend *be, ms_gpu *g, float *y, const float *x, int n, const ms_qmat *w, int acc,
                      ms_err *err) {
    blk_state *bst = bs(be);
    if (n > 1 && bst && !bst->kda_old && ms_gpu_gemm_matmul(be, y, x, n, w, acc)) return ms_gpu_be_report(be, err);
    return ms_gpu_matmul(g, y, x, n, w, acc, err);
}

static int b_kda_forward(ms_backend *be, const ms_kda_config *c, const ms_kda_weights *w, ms_kda_state *st,
                         const float *x, int n, float *out, ms_err *err) {
    int rc = ms_gpu_be_report(be, err);
    if (rc || (rc = ms_kda_check(c, w, err))) return rc;
    if (!st || !st->S || !st->conv || !x || !out || n < 1)
        return ms_fail(err, MS_ERR_ARG, "KDA forward: bad state/input (n %d)", n);
    const int H = c->heads, d = c->head_dim, C = H * d, K = c->conv_kernel;
    if (st->S_len != (int64_t)H * d * d || st->conv_len != 3 * (int64_t)C * (K - 1))
        return ms_fail(err, MS_ERR_ARG, "KDA forward: state was made for another config");
    ms_gpu *g = ms_gpu_be_dev(be);
    blk_state *bst = bs(be);
    if (!bst) return ms_fail(err, MS_ERR_NOMEM, "out of host memory");
    if (n == 1 && !bst->kda_old && kda_step_fits(c, st))
        return (rc = kda_step(be, c, w, st, x, out, err)) ? ms_wrap(err, "KDA forward") : MS_OK;
    const int slice = n < BLK_SLICE ? n : BLK_SLICE;
    size_t per = (size_t)slice;
    float *buf;
    if ((rc = scratch(be, 6 * per * C + per * d + per * H, &buf, err))) return rc;
    float *q = buf, *k = q + per * C, *v = k + per * C, *gg = v + per * C, *gate = gg + per * C, *o = gate + per * C;
    float *lr = o + per * C, *beta = lr + per * d;
    float *cs_q = st->conv, *cs_k = cs_q + (size_t)C * (K - 1), *cs_v = cs_k + (size_t)C * (K - 1);
    for (int t0 = 0; t0 < n; t0 += slice) {
        const int m = n - t0 < slice ? n - t0 : slice;
        const float *xs = x + (size_t)t0 * c->hidden;
        if ((rc = blk_matmul(be, g, q, xs, m, &w->q_proj, 0, err)) ||
            (rc = blk_matmul(be, g, k, xs, m, &w->k_proj, 0, err)) ||
            (rc = blk_matmul(be, g, v, xs, m, &w->v_proj, 0, err)) ||
            (rc = conv_launch(be, q, C, m, C, &w->q_conv, cs_q, "KDA q_conv1d", err)) ||
            (rc = conv_launch(be, k, C, m, C, &w->k_conv, cs_k, "KDA k_conv1d", err)) ||
            (rc = conv_launch(be, v, C, m, C, &w->v_conv, cs_v, "KDA v_conv1d", err)) ||
            (rc = blk_matmul(be, g, lr, xs, m, &w->f_a, 0, err)) ||
            (rc = blk_matmul(be, g, gg, lr, m, &w->f_b, 0, err)) ||
            (rc = gate_launch(be, gg, C, m, H, d, &w->A_log, w->dt_bias.data ? &w->dt_bias : NULL,
                              c->decay == MS_DECAY_LOWER_BOUND, c->lower_bound, err)) ||
            (rc = blk_matmul(be, g, beta, xs, m, &w->b_proj, 0, err)))
            break;
        k_sigmoid_rows<<<grid_for((int64_t)m * H, 256), 256, 0, g->stream>>>(beta, H, m, H);
        delta_a a = {q, k, v, gg, beta, C, C, C, C, H, C, o, st->S, m, H, H, d, d, 0, 0, 1e-6f, 1.0f / sqrtf((float)d)};
        if ((rc = run_delta(be, a, err))) break;
        if (c->full_rank_gate) rc = blk_matmul(be, g, gate, xs, m, &w->g_proj, 0, err);
        else if (!(rc = blk_matmul(be, g, lr, xs, m, &w->g_a, 0, err)))
            rc = blk_matmul(be, g, gate, lr, m, &w->g_b, 0, err);
        if (rc || (rc = gnorm_launch(be, o, gate, (int64_t)m * H, d, &w->o_norm, c->norm_eps, 0, err)) ||
            (rc = blk_matmul(be, g, out + (size_t)t0 * c->hidden, o, m, &w->o_proj, 0, err)))
            break;
    }
    return rc ? ms_wrap(err, "KDA forward") : MS_OK;
}

/* the fused projections' rows into q|k|v, z, b, a (gdn_block.c split_rows) */
__global__ void k_gdn_split(float *qkv, float *z, float *b, float *a, const float *qkvz, const float *ba, int m, int Hk,
                            int Hv, int dk, int dv) {
    const int r = Hv / Hk;
    const int64_t Kd = (int64_t)Hk * dk, Vd = (int64_t)Hv * dv, C = 2 * Kd + Vd, P = 2 * Kd + 2 * Vd;
    const int64_t grp = 2 * (int64_t)dk + 2 * (int64_t)r * dv;
    int64_t total = (int64_t)m * P;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / P, jj = i % P, gi = jj / grp, off = jj % grp;
        float v = qkvz[i];
        if (off < dk) qkv[t * C + gi * dk + off] = v;
        else if (off < 2 * dk) qkv[t * C + Kd + gi * dk + off - dk] = v;
        else if (off < 2 * dk + (int64_t)r * dv) qkv[t * C + 2 * Kd + gi * r * dv + off - 2 * dk] = v;
        else z[t * Vd + gi * r * dv + off - 2 * dk - (int64_t)r * dv] = v;
    }
    int64_t tb = (int64_t)m * 2 * Hv;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < tb; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / (2 * Hv), jj = i % (2 * Hv), gi = jj / (2 * r), o = jj % (2 * r);
        if (o < r) b[t * Hv + gi * r + o] = ba[i];
        else a[t * Hv + gi * r + o - r] = ba[i];
    }
}

static int b_gdn_forward(ms_backend *be, const ms_gdn_config *c, const ms_gdn_weights *w, ms_kda_state *st,
                         const float *x, int n, float *out, ms_err *err) {
    int rc = ms_gpu_be_report(be, err);
    if (rc || (rc = ms_gdn_check(c, w, err))) return rc;
    if (!st || !st->S || !st->conv || !x || !out || n < 1)
        return ms_fail(err, MS_ERR_ARG, "gated DeltaNet forward: bad state/input (n %d)", n);
    const int Hk = c->k_heads, Hv = c->v_heads, dk = c->k_dim, dv = c->v_dim;
    const int64_t Kd = (int64_t)Hk * dk, Vd = (int64_t)Hv * dv, C = 2 * Kd + Vd, P = 2 * Kd + 2 * Vd;
    if (st->S_len != (int64_t)Hv * dk * dv || st->conv_len != C * (c->conv_kernel - 1))
        return ms_fail(err, MS_ERR_ARG, "gated DeltaNet forward: state was made for another config");
    ms_gpu *g = ms_gpu_be_dev(be);
    const int slice = n < BLK_SLICE ? n : BLK_SLICE;
    const size_t per = (size_t)slice;
    float *buf;
    if ((rc = scratch(be, per * ((size_t)P + 2 * (size_t)Hv + (size_t)C + 2 * (size_t)Vd + 2 * (size_t)Hv), &buf, err)))
        return rc;
    float *qkvz = buf, *ba = qkvz + per * P, *qkv = ba + per * 2 * Hv, *z = qkv + per * C, *o = z + per * Vd;
    float *b = o + per * Vd, *a = b + per * Hv;
    for (int t0 = 0; t0 < n; t0 += slice) {
        const int m = n - t0 < slice ? n - t0 : slice;
        const float *xs = x + (size_t)t0 * c->hidden;
        if (ms_gdn_split(w)) { /* split projections (Qwen3.5) write the rows in the order the block uses */
            if ((rc = blk_matmul(be, g, qkv, xs, m, &w->in_qkv, 0, err)) ||
                (rc = blk_matmul(be, g, z, xs, m, &w->in_z, 0, err)) ||
                (rc = blk_matmul(be, g, b, xs, m, &w->in_b, 0, err)) || (rc = blk_matmul(be, g, a, xs, m, &w->in_a, 0, err)))
                break;
        } else {
            if ((rc = blk_matmul(be, g, qkvz, xs, m, &w->in_qkvz, 0, err)) ||
                (rc = blk_matmul(be, g, ba, xs, m, &w->in_ba, 0, err)))
                break;
            k_gdn_split<<<grid_for((int64_t)m * P, 256), 256, 0, g->stream>>>(qkv, z, b, a, qkvz, ba, m, Hk, Hv, dk, dv);
            if ((rc = ms_gpu_launched(err, "gated DeltaNet split"))) break;
        }
        if ((rc = conv_launch(be, qkv, C, m, (int)C, &w->conv, st->conv, "gated DeltaNet conv1d", err)) ||
            (rc = gate_launch(be, a, Hv, m, Hv, 1, &w->A_log, &w->dt_bias, 0, 0.0f, err)))
            break;
        k_sigmoid_rows<<<grid_for((int64_t)m * Hv, 256), 256, 0, g->stream>>>(b, Hv, m, Hv);
        delta_a da = {qkv, qkv + Kd, qkv + 2 * Kd, a, b, C, C, C, Hv, Hv, Vd, o, st->S, m, Hk, Hv, dk, dv, 1, 0, 1e-6f,
                      1.0f / sqrtf((float)dk)};
        if ((rc = run_delta(be, da, err)) || (rc = gnorm_launch(be, o, z, (int64_t)m * Hv, dv, &w->norm, c->norm_eps, 1, err)) ||
            (rc = blk_matmul(be, g, out + (size_t)t0 * c->hidden, o, m, &w->out_proj, 0, err)))
            break;
    }
    return rc ? ms_wrap(err, "gated DeltaNet forward") : MS_OK;
}

/* ------------------------------------------------------------ DSA indexer */

/* rotate the first rot dims of v by (cs, sn) [rot/2], the CPU's ms_dsa_rope (interleaved
 * input written back de-interleaved); tmp: rot floats of shared memory */
static __device__ void dsa_rope_vec(float *v, int rot, int interleaved, const float *cs, const float *sn, float *tmp) {
    int half = rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float x1 = interleaved ? v[2 * i] : v[i], x2 = interleaved ? v[2 * i + 1] : v[half + i];
        tmp[i] = x1 * cs[i] - x2 * sn[i];
        tmp[half + i] = x2 * cs[i] + x1 * sn[i];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rot; i += blockDim.x) v[i] = tmp[i];
    __syncthreads();
}

/* keys in place: LayerNorm (mean and variance in double, as ms_layernorm), then RoPE; one block per key */
__global__ void k_dsa_keys(float *k, int D, const float *lw, const float *lb, float eps, int rot, int interleaved,
                           const float *cs, const float *sn) {
    extern __shared__ float tmp[];
    __shared__ double red[256];
    float *kt = k + (int64_t)blockIdx.x * D;
    double s = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) s += kt[i];
    double mean = block_sum(s, red) / D;
    double v = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) v += (kt[i] - mean) * (kt[i] - mean);
    double var = block_sum(v, red) / D;
    float inv = (float)(1.0 / sqrt(var + eps));
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        kt[i] = (float)(kt[i] - mean) * inv * (lw ? lw[i] : 1.0f) + (lb ? lb[i] : 0.0f);
    __syncthreads();
    if (rot > 0) dsa_rope_vec(kt, rot, interleaved, cs + (int64_t)blockIdx.x * (rot / 2), sn + (int64_t)blockIdx.x * (rot / 2), tmp);
}
/* queries in place: RoPE on each head's first rot dims; one block per (token, head) */
__global__ void k_dsa_queries(float *q, int H, int D, int rot, int interleaved, const float *cs, const float *sn) {
    extern __shared__ float tmp[];
    int64_t th = blockIdx.x, t = th / H;
    dsa_rope_vec(q + th * D, rot, interleaved, cs + t * (rot / 2), sn + t * (rot / 2), tmp);
}
/* pooled[m][ch] = sum_j softmax_j(gate + ape) key over pool m's tokens (ops/dsa.c pool_key) */
__global__ void k_dsa_pool(const float *keys, const float *gates, const float *ape, float *pooled, int64_t m0,
                           int64_t m1, int D, int P) {
    int64_t total = (m1 - m0) * D;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t m = m0 + i / D;
        int ch = (int)(i % D);
        const float *kk = keys + m * P * D, *g = gates + m * P * D;
        float mx = -INFINITY;
        for (int j = 0; j < P; j++) {
            float l = g[(int64_t)j * D + ch] + ape[(int64_t)j * D + ch];
            if (l > mx) mx = l;
        }
        double s = 0, acc = 0;
        for (int j = 0; j < P; j++) {
            double e = exp((double)(g[(int64_t)j * D + ch] + ape[(int64_t)j * D + ch]) - mx);
            s += e;
            acc += e * kk[(int64_t)j * D + ch];
        }
        pooled[m * D + ch] = (float)(acc / s);
    }
}
/* sc[t][j] = sum_h w_h H^-1/2 relu(D^-1/2 q_h . key_j) for the candidates j of the query at pos0 + t */
__global__ void k_dsa_scores(float *sc, int64_t ld, const float *q, const float *w, const float *keys, int64_t pos0,
                             int H, int D, int kpool) {
    int t = blockIdx.y;
    int64_t p = pos0 + t, nc = kpool > 1 ? (p + 1) / kpool : p + 1;
    float hs = 1.0f / sqrtf((float)H), scale = 1.0f / sqrtf((float)D);
    const float *qt = q + (int64_t)t * H * D, *wt = w + (int64_t)t * H;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < nc; j += (int64_t)gridDim.x * blockDim.x) {
        const float *kj = keys + j * D;
        float s = 0;
        for (int h = 0; h < H; h++) {
            const float *qh = qt + (int64_t)h * D;
            float d = 0;
            for (int i = 0; i < D; i++) d = fmaf(qh[i], kj[i], d);
            d *= scale;
            s += d > 0.0f ? (wt[h] * hs) * d : 0.0f;
        }
        sc[(int64_t)t * ld + j] = s;
    }
}

/* The selections of n queries at pos0.. (prepared q [n, H*D], raw w [n, H], device) against
 * the cache: scores on the device, torch.topk's choice on the host (ms_dsa_topk). */
static int dsa_select_rows(ms_backend *be, const ms_dsa_cfg *cfg, const ms_dsa_cache *c, const float *q, const float *w,
                           int n, int64_t pos0, int64_t fwd_len, int32_t *idx, int32_t *count, uint8_t *ambiguous,
                           ms_err *err) {
    int rc0 = ms_dsa_select_check(cfg, c, q, w, n, pos0, &fwd_len, idx, count, err);
    if (rc0 || n == 0) return rc0;
    const int H = cfg->n_heads, D = cfg->head_dim, width = ms_dsa_row_width(cfg), kp = cfg->kpool;
    int64_t ld = ms_dsa_candidates(cfg, pos0 + n - 1);
    if (ld < 1) ld = 1;
    int64_t nq = ms_dsa_queue_len(cfg, fwd_len);
    if (nq < 1) nq = 1;
    int64_t qb = DSA_SCORE_FLOATS / ld;
    if (qb < 1) qb = 1;
    if (qb > n) qb = n;
    if (qb > 65535) qb = 65535;
    float *dsc, *hsc;
    void *hb;
    int rc;
    size_t hbytes = (size_t)qb * ld * 4 + (size_t)nq * (sizeof(ms_dsa_qel) + 4);
    if ((rc = scratch(be, (size_t)(qb * ld), &dsc, err)) || (rc = host_buf(be, hbytes, &hb, err))) return rc;
    hsc = (float *)hb;
    ms_dsa_qel *work = (ms_dsa_qel *)(void *)(hsc + qb * ld);
    int32_t *sel = (int32_t *)(void *)(work + nq);
    const float *keys = kp > 1 ? c->pooled : c->keys;
    ms_gpu *g = ms_gpu_be_dev(be);
    int64_t want = kp > 1 ? cfg->topk / kp : cfg->topk;
    for (int q0 = 0; q0 < n; q0 += (int)qb) {
        int qn = (int)(n - q0 < qb ? n - q0 : qb);
        int64_t nk = ms_dsa_candidates(cfg, pos0 + q0 + qn - 1);
        if (nk > 0) {
            dim3 grid(grid_for(nk, 128), (unsigned)qn);
            k_dsa_scores<<<grid, 128, 0, g->stream>>>(dsc, ld, q + (size_t)q0 * H * D, w + (size_t)q0 * H, keys,
                                                      pos0 + q0, H, D, kp);
            if ((rc = ms_gpu_launched(err, "dsa scores")) ||
                (rc = ms_gpu_download(g, hsc, dsc, (size_t)qn * ld * 4, err)))
                return rc;
        }
        for (int qi = 0; qi < qn; qi++) { /* ops/dsa.c pick_task */
            int64_t p = pos0 + q0 + qi, nc = ms_dsa_candidates(cfg, p);
            int32_t *row = idx + (size_t)(q0 + qi) * width;
            uint8_t amb = 0;
            int64_t k = ms_dsa_topk(hsc + (size_t)qi * ld, nc, nq, want, work, sel, &amb);
            int m = 0;
            if (kp > 1) {
                for (int64_t i = 0; i < k; i++)
                    for (int j = 0; j < kp; j++) row[m++] = sel[i] * kp + j;
                if (cfg->kpool_tail) {
                    int64_t tail = (p + 1) % kp;
                    for (int64_t t = p + 1 - tail; t <= p; t++) row[m++] = (int32_t)t;
                }
            } else {
                for (int64_t i = 0; i < k; i++) row[m++] = sel[i];
            }
            count[q0 + qi] = m;
            if (ambiguous) ambiguous[q0 + qi] = amb;
            for (int i = m; i < width; i++) row[i] = -1;
        }
    }
    return MS_OK;
}

static int b_dsa_index(ms_backend *be, const ms_dsa_index_args *a, ms_err *err) {
    const ms_dsa_cfg *cfg = a->cfg;
    ms_dsa_cache *cache = a->cache;
    int rc = ms_gpu_be_report(be, err);
    if (rc || (rc = ms_dsa_cfg_check(cfg, err))) return rc;
    if (cache->len != a->pos0)
        return ms_fail(err, MS_ERR_ARG, "index-key cache holds %lld keys, the chunk starts at %lld",
                       (long long)cache->len, (long long)a->pos0);
    if (a->pos0 + a->n > cache->cap)
        return ms_fail(err, MS_ERR_LIMIT, "index-key cache has room for %lld keys, not %lld", (long long)cache->cap,
                       (long long)(a->pos0 + a->n));
    if (a->n < 1) return MS_OK;
    const int H = cfg->n_heads, D = cfg->head_dim, kp = cfg->kpool > 1 ? cfg->kpool : 1, n = a->n;
    const int rot = kp > 1 ? 0 : cfg->rope_dims, half = rot / 2;
    ms_gpu *g = ms_gpu_be_dev(be);
    const float *dcs = NULL, *dsn = NULL;
    if (rot > 0) { /* the angles of the chunk's positions, as the CPU forms them (ms_rope_cos_sin) */
        if (a->rope->dim / 2 < half)
            return ms_fail(err, MS_ERR_ARG, "dsa: rope dims %d beyond the model's %d", rot, a->rope->dim);
        void *hb, *dt;
        size_t tb = (size_t)n * half * 4;
        if ((rc = host_buf(be, 2 * tb, &hb, err))) return rc;
        float *hc = (float *)hb, *hs = hc + (size_t)n * half, cs[512], sn[512];
        for (int t = 0; t < n; t++) {
            ms_rope_cos_sin(a->rope, a->pos0 + t, cs, sn);
            memcpy(hc + (size_t)t * half, cs, (size_t)half * 4);
            memcpy(hs + (size_t)t * half, sn, (size_t)half * 4);
        }
        if ((rc = table(be, hb, 2 * tb, &dt, err))) return rc;
        dcs = (const float *)dt, dsn = dcs + (size_t)n * half;
    }
    int interleaved = cfg->rope_layout == MS_DSA_ROPE_INTERLEAVED;
    k_dsa_keys<<<(unsigned)n, 128, (size_t)(rot > 0 ? rot : 1) * 4, g->stream>>>(a->k, D, a->k_norm_w, a->k_norm_b,
                                                                                cfg->ln_eps, rot, interleaved, dcs, dsn);
    if ((rc = ms_gpu_launched(err, "dsa keys"))) return rc;
    if (rot > 0) {
        k_dsa_queries<<<(unsigned)((int64_t)n * H), 64, (size_t)rot * 4, g->stream>>>(a->q, H, D, rot, interleaved, dcs,
                                                                                       dsn);
        if ((rc = ms_gpu_launched(err, "dsa queries"))) return rc;
    }
    /* the cache append (ms_dsa_cache_append): keys, KPool gate logits, completed pools */
    if ((rc = ms_gpu_copy(g, cache->keys + (size_t)a->pos0 * D, a->k, (size_t)n * D * 4, err))) return rc;
    if (kp > 1) {
        if (!a->g) return ms_fail(err, MS_ERR_ARG, "dsa cache: the KPool indexer needs gate logits for appended keys");
        if ((rc = ms_gpu_copy(g, cache->gates + (size_t)a->pos0 * D, a->g, (size_t)n * D * 4, err))) return rc;
        int64_t m0 = a->pos0 / kp, m1 = (a->pos0 + n) / kp;
        if (m1 > m0) {
            k_dsa_pool<<<grid_for((m1 - m0) * D, 128), 128, 0, g->stream>>>(cache->keys, cache->gates, cache->ape,
                                                                             cache->pooled, m0, m1, D, kp);
            if ((rc = ms_gpu_launched(err, "dsa pool"))) return rc;
        }
    }
    cache->len = a->pos0 + n;
    return dsa_select_rows(be, cfg, cache, a->q, a->w, n, a->pos0, a->fwd_len, a->idx, a->count, a->ambiguous, err);
}

static int b_dsa_recheck(ms_backend *be, const ms_dsa_cfg *cfg, const ms_dsa_cache *cache, const float *q,
                         const float *w, int64_t pos, int64_t fwd_len, int32_t *idx, int32_t *count, ms_err *err) {
    int rc = ms_gpu_be_report(be, err);
    if (rc || (rc = ms_dsa_cfg_check(cfg, err))) return rc;
    return dsa_select_rows(be, cfg, cache, q, w, 1, pos, fwd_len, idx, count, NULL, err);
}

/* ------------------------------------------------------------ DeepSeek V4 compressed attention */

/* one block per closing window win0 + blockIdx.x: per channel the softmax over the window's
 * slots (and the previous window's with overlap) weighting kv, then RMSNorm (ms_compress_pool);
 * rows of positions >= pos0 come from the chunk, earlier ones from the rings */
__global__ void k_comp_pool(float *entries, const float *kv, const float *gt, const float *raw_kv, const float *raw_g,
                            const float *ape, const float *norm, int rate, int dim, int overlap, float eps, int64_t pos0,
                            int64_t win0) {
    __shared__ double red[256];
    int64_t win = win0 + blockIdx.x;
    const int w = overlap ? 2 : 1, half = overlap ? dim : 0;
    const int64_t cw = (int64_t)w * dim;
#define ROWK(pos) ((pos) >= pos0 ? kv + ((pos) - pos0) * cw : raw_kv + ((pos) % (2 * rate)) * cw)
#define ROWG(pos) ((pos) >= pos0 ? gt + ((pos) - pos0) * cw : raw_g + ((pos) % (2 * rate)) * cw)
    float *out = entries + win * dim;
    int prev = overlap && win > 0;
    double ss = 0;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float mx = -INFINITY;
        for (int r = 0; r < rate; r++) {
            int64_t pc = win * rate + r;
            float g = ROWG(pc)[half + c] + ape[(int64_t)r * cw + half + c];
            if (g > mx) mx = g;
            if (prev) {
                int64_t pp = (win - 1) * rate + r;
                g = ROWG(pp)[c] + ape[(int64_t)r * cw + c];
                if (g > mx) mx = g;
            }
        }
        double den = 0, num = 0;
        for (int r = 0; r < rate; r++) {
            int64_t pc = win * rate + r;
            double p = exp((double)(ROWG(pc)[half + c] + ape[(int64_t)r * cw + half + c]) - mx);
            den += p, num += p * ROWK(pc)[half + c];
            if (prev) {
                int64_t pp = (win - 1) * rate + r;
                p = exp((double)(ROWG(pp)[c] + ape[(int64_t)r * cw + c]) - mx);
                den += p, num += p * ROWK(pp)[c];
            }
        }
        float o = (float)(num / den);
        out[c] = o;
        ss += (double)o * o;
    }
#undef ROWK
#undef ROWG
    ss = block_sum(ss, red);
    float r = (float)(1.0 / sqrt(ss / dim + eps));
    for (int c = threadIdx.x; c < dim; c += blockDim.x) out[c] = out[c] * r * norm[c];
}
/* the rings keep the chunk's last 2 * rate rows (slot p % (2 * rate)) */
__global__ void k_comp_ring(float *raw_kv, float *raw_g, const float *kv, const float *gt, int64_t cw, int rate,
                            int64_t pos0, int t0, int n) {
    int64_t total = (int64_t)(n - t0) * cw;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = t0 + i / cw, c = i % cw, slot = (pos0 + t) % (2 * rate);
        raw_kv[slot * cw + c] = kv[t * cw + c];
        raw_g[slot * cw + c] = gt[t * cw + c];
    }
}

static int b_compress_append(ms_backend *be, const ms_compress_args *a, ms_err *err) {
    int rc = ms_gpu_be_report(be, err);
    if (rc) return rc;
    if (a->rate < 1 || a->dim < 1 || a->n < 0 || !a->ape || !a->norm)
        return ms_fail(err, MS_ERR_ARG, "compress: rate %d, dim %lld, n %d", a->rate, (long long)a->dim, a->n);
    if (a->n == 0) return MS_OK;
    ms_gpu *g = ms_gpu_be_dev(be);
    const int rate = a->rate;
    const int64_t dim = a->dim, cw = (a->overlap ? 2 : 1) * dim, p_end = a->pos0 + a->n;
    /* window w closes at p = (w + 1) * rate - 1: those with pos0 <= p < pos0 + n */
    const int64_t win0 = a->pos0 / rate, win1 = p_end / rate;
    if (win1 > win0) {
        k_comp_pool<<<(unsigned)(win1 - win0), 128, 0, g->stream>>>(a->entries, a->kv, a->g, a->raw_kv, a->raw_g, a->ape,
                                                                     a->norm, rate, (int)dim, a->overlap, a->eps, a->pos0,
                                                                     win0);
        if ((rc = ms_gpu_launched(err, "compressor pool"))) return rc;
        for (int64_t w = win0; w < win1; w++) /* RoPE on the entry's trailing dims at w * rate */
            be->ops->rope(be, a->rope, a->entries + w * dim, 1, dim, 1, dim, dim - a->rope->dim, w * rate, 1.0f);
    }
    int t0 = a->n > 2 * rate ? a->n - 2 * rate : 0;
    k_comp_ring<<<grid_for((int64_t)(a->n - t0) * cw, 256), 256, 0, g->stream>>>(a->raw_kv, a->raw_g, a->kv, a->g, cw,
                                                                               rate, a->pos0, t0, a->n);
    if ((rc = ms_gpu_launched(err, "compressor rings"))) return rc;
    return ms_gpu_be_report(be, err);
}

/* CSA indexer scores of the visible entries: isc[t][x] = sum_h relu(iq_h . icomp_x) ihd^-1/2 (iw_h IH^-1/2) */
__global__ void k_cattn_iscore(float *isc, int64_t ld, const float *iq, const float *iw, const float *icomp,
                               int64_t pos0, int64_t IH, int64_t ihd, int64_t rate, int64_t NC) {
    int t = blockIdx.y;
    int64_t p = pos0 + t, vis = (p + 1) / rate < NC ? (p + 1) / rate : NC;
    float ws = 1.0f / sqrtf((float)IH), ss = 1.0f / sqrtf((float)ihd);
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < vis; x += (int64_t)gridDim.x * blockDim.x) {
        float acc = 0;
        for (int64_t h = 0; h < IH; h++) {
            const float *qh = iq + ((int64_t)t * IH + h) * ihd, *k = icomp + x * ihd;
            float d = 0;
            for (int64_t i = 0; i < ihd; i++) d = fmaf(qh[i], k[i], d);
            acc += (d > 0 ? d : 0) * ss * (iw[(int64_t)t * IH + h] * ws);
        }
        isc[(int64_t)t * ld + x] = acc;
    }
}

typedef struct {
    float *out;
    const float *q, *kv, *win, *comp, *sinks;
    const int32_t *sel, *cnt; /* CSA: chosen entries [n, selw], counts [n] */
    int64_t selw, pos0, H, hd, W, rate, NC;
    int csa;
    float scale;
} cattn_a;

/* one block per (head, token): scores of the window keys then the entries into shared memory,
 * the softmax (sinks in the denominator), out = sum p_i key_i */
__global__ void k_cattn(cattn_a a) {
    extern __shared__ float sc[];
    __shared__ float redf[32];
    __shared__ double redd[256];
    int64_t h = blockIdx.x, t = blockIdx.y, p = a.pos0 + t, s0 = p - a.W + 1 > 0 ? p - a.W + 1 : 0;
    int64_t nwin = p - s0 + 1, ncomp = 0;
    if (a.rate > 0) {
        int64_t vis = (p + 1) / a.rate < a.NC ? (p + 1) / a.rate : a.NC;
        ncomp = a.csa ? (a.NC > 0 ? a.cnt[t] : 0) : vis;
    }
    int64_t nk = nwin + ncomp;
    const float *qv = a.q + (t * a.H + h) * a.hd;
#define KEY(i)                                                                                                       \
    ((i) < nwin ? (s0 + (i) >= a.pos0 ? a.kv + (s0 + (i) - a.pos0) * a.hd : a.win + ((s0 + (i)) % a.W) * a.hd)    \
                : a.comp + (a.csa ? (int64_t)a.sel[t * a.selw + (i) - nwin] : (i) - nwin) * a.hd)
    float mx = a.sinks ? a.sinks[h] : -INFINITY;
    for (int64_t i = threadIdx.x; i < nk; i += blockDim.x) {
        const float *k = KEY(i);
        float d = 0;
        for (int64_t c = 0; c < a.hd; c++) d = fmaf(qv[c], k[c], d);
        sc[i] = d * a.scale;
        mx = fmaxf(mx, sc[i]);
    }
    /* block max */
    for (int m = MS_WARP / 2; m > 0; m >>= 1) mx = fmaxf(mx, ms_shfl_xor(mx, m));
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP, nw = (blockDim.x + MS_WARP - 1) / MS_WARP;
    __syncthreads();
    if (lane == 0) redf[warp] = mx;
    __syncthreads();
    mx = redf[0];
    for (int w = 1; w < nw; w++) mx = fmaxf(mx, redf[w]);
    double den = 0;
    for (int64_t i = threadIdx.x; i < nk; i += blockDim.x) {
        sc[i] = expf(sc[i] - mx);
        den += sc[i];
    }
    den = block_sum(den, redd);
    if (a.sinks) den += exp((double)a.sinks[h] - mx);
    __syncthreads();
    float *o = a.out + (t * a.H + h) * a.hd;
    for (int64_t c = threadIdx.x; c < a.hd; c += blockDim.x) {
        float acc = 0;
        for (int64_t i = 0; i < nk; i++) acc = fmaf((float)(sc[i] / den), KEY(i)[c], acc);
        o[c] = acc;
    }
#undef KEY
}

static int b_attn_compressed(ms_backend *be, const ms_cattn_args *a, ms_err *err) {
    int rc = ms_gpu_be_report(be, err);
    if (rc) return rc;
    if (a->n < 1) return MS_OK;
    ms_gpu *g = ms_gpu_be_dev(be);
    const int64_t rate = a->rate, NC = rate ? a->n_comp : 0, n = a->n;
    int64_t maxk = a->window + (a->csa ? (a->topk < NC ? a->topk : NC) : NC) + 1;
    size_t shm = (size_t)maxk * 4;
    if (shm > 46 * 1024)
        return ms_fail(err, MS_ERR_LIMIT, "compressed attention: %lld keys per query (the %s kernel holds %d)",
                       (long long)maxk, MS_GPU_BACKEND_NAME, 46 * 1024 / 4);
    const int32_t *dsel = NULL, *dcnt = NULL;
    int64_t selw = 1;
    if (a->csa && rate && NC > 0) { /* the indexer's choice: scores here, torch.topk's tie rule on the host */
        int64_t NT = a->fwd_len / rate > NC ? a->fwd_len / rate : NC, k = a->topk < NT ? a->topk : NT;
        selw = k > 0 ? k : 1;
        float *disc, *hsc;
        void *hb, *dt;
        size_t hbytes = (size_t)n * NC * 4 + (size_t)NT * (sizeof(ms_dsa_qel) + 4) + (size_t)n * (selw + 1) * 4;
        if ((rc = scratch(be, (size_t)(n * NC), &disc, err)) || (rc = host_buf(be, hbytes, &hb, err))) return rc;
        hsc = (float *)hb;
        ms_dsa_qel *work = (ms_dsa_qel *)(void *)(hsc + n * NC);
        int32_t *tmp = (int32_t *)(void *)(work + NT), *hsel = tmp + NT, *hcnt = hsel + n * selw;
        dim3 grid(grid_for(NC, 128), (unsigned)n);
        k_cattn_iscore<<<grid, 128, 0, g->stream>>>(disc, NC, a->iq, a->iw, a->icomp, a->pos0, a->idx_heads, a->idx_dim,
                                                    rate, NC);
        if ((rc = ms_gpu_launched(err, "CSA indexer scores")) || (rc = ms_gpu_download(g, hsc, disc, (size_t)(n * NC) * 4, err)))
            return rc;
        for (int64_t t = 0; t < n; t++) {
            int64_t p = a->pos0 + t, vis = (p + 1) / rate < NC ? (p + 1) / rate : NC;
            int64_t cnt = ms_dsa_topk(hsc + t * NC, vis, NT, k, work, tmp, NULL);
            memcpy(hsel + t * selw, tmp, (size_t)cnt * 4);
            hcnt[t] = (int32_t)cnt;
        }
        if ((rc = table(be, hsel, (size_t)n * (selw + 1) * 4, &dt, err))) return rc;
        dsel = (const int32_t *)dt, dcnt = dsel + n * selw;
    }
    cattn_a c = {a->out, a->q, a->kv, a->win, a->comp, a->sinks, dsel, dcnt, selw, a->pos0, a->H, a->hd, a->window,
                 rate, NC, a->csa, a->scale};
    dim3 grid((unsigned)a->H, (unsigned)n);
    k_cattn<<<grid, 128, shm, g->stream>>>(c);
    return ms_gpu_launched(err, "compressed attention"); /* the table's next upload is ordered after this kernel */
}

/* ------------------------------------------------------------ mHC */

/* r[t] = 1 / sqrt(mean(x_t^2) + eps) in double over rows of d */
__global__ void k_inv_rms(float *r, const float *x, int64_t d, float eps) {
    __shared__ double red[256];
    const float *xt = x + (int64_t)blockIdx.x * d;
    double ss = 0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += (double)xt[i] * xt[i];
    ss = block_sum(ss, red);
    if (threadIdx.x == 0) r[blockIdx.x] = (float)(1.0 / sqrt(ss / (double)d + eps));
}
/* per token: pre, post, comb (Sinkhorn) from the mixes m [n, (2+hc)*hc] (ms_mhc_pre) */
__global__ void k_mhc_mix(const float *m, const float *r, const float *base, const float *scale, int hc, int iters,
                          float hc_eps, float *pre, float *post, float *comb, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    int mix = (2 + hc) * hc;
    const float *mt = m + (int64_t)t * mix;
    float rt = r[t];
    for (int i = 0; i < hc; i++) {
        pre[(int64_t)t * hc + i] = sigm((mt[i] * rt) * scale[0] + base[i]) + hc_eps;
        post[(int64_t)t * hc + i] = 2.0f * sigm((mt[hc + i] * rt) * scale[1] + base[hc + i]);
    }
    float *ct = comb + (int64_t)t * hc * hc;
    for (int i = 0; i < hc * hc; i++) ct[i] = (mt[2 * hc + i] * rt) * scale[2] + base[2 * hc + i];
    for (int i = 0; i < hc; i++) { /* softmax per row + eps */
        float *row = ct + i * hc, mx = -INFINITY;
        for (int j = 0; j < hc; j++) mx = row[j] > mx ? row[j] : mx;
        double s = 0;
        for (int j = 0; j < hc; j++) s += (row[j] = expf(row[j] - mx));
        float inv = (float)(1.0 / s);
        for (int j = 0; j < hc; j++) row[j] = row[j] * inv + hc_eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int i = 0; i < hc; i++) {
                float s = 0;
                for (int j = 0; j < hc; j++) s += ct[i * hc + j];
                for (int j = 0; j < hc; j++) ct[i * hc + j] /= s + hc_eps;
            }
        for (int j = 0; j < hc; j++) {
            float s = 0;
            for (int i = 0; i < hc; i++) s += ct[i * hc + j];
            for (int i = 0; i < hc; i++) ct[i * hc + j] /= s + hc_eps;
        }
    }
}
/* out[t][c] = sum_i w[t][i] * streams[t][i][c] */
__global__ void k_collapse(float *out, const float *streams, const float *w, int hc, int64_t dim, int n) {
    int64_t total = (int64_t)n * dim;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = k / dim, c = k % dim;
        float acc = 0;
        for (int i = 0; i < hc; i++) acc += w[t * hc + i] * streams[(t * hc + i) * dim + c];
        out[k] = acc;
    }
}
/* DeepSeek V4 hyper head's weights: pre_i = sigmoid(m_i r scale[0] + base_i) + hc_eps */
__global__ void k_head_pre(float *pre, const float *m, const float *r, const float *base, const float *scale, int hc,
                           float hc_eps, int n) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * hc) return;
    int t = k / hc, i = k % hc;
    pre[k] = sigm(m[k] * r[t] * scale[0] + base[i]) + hc_eps;
}

static int b_mhc_pre(ms_backend *be, const ms_mhc *h, const float *streams, int n, float *collapsed, float *post,
                     float *comb, ms_err *err) {
    int rc = ms_gpu_be_report(be, err);
    if (rc) return rc;
    if (!h || h->hc < 1 || h->hc > 64 || h->dim < 1 || !h->base || !h->scale || h->sinkhorn_iters < 1)
        return ms_fail(err, MS_ERR_ARG, "mhc: bad hyper-connection description");
    const int hc = h->hc, dim = h->dim, mix = (2 + hc) * hc;
    if (!h->fn || h->fn->rows != mix || h->fn->cols != (int64_t)hc * dim)
        return ms_fail(err, MS_ERR_SHAPE, "mhc: fn is [%lld, %lld], expected [%d, %lld]", h->fn ? (long long)h->fn->rows : -1LL,
                       h->fn ? (long long)h->fn->cols : -1LL, mix, (long long)hc * dim);
    if (n < 0) return ms_fail(err, MS_ERR_ARG, "mhc: negative token count %d", n);
    if (n == 0) return MS_OK;
    ms_gpu *g = ms_gpu_be_dev(be);
    float *m;
    if ((rc = scratch(be, (size_t)n * (mix + 1 + hc), &m, err))) return rc;
    float *r = m + (size_t)n * mix, *pre = r + n;
    if ((rc = ms_gpu_matmul(g, m, streams, n, h->fn, 0, err))) return rc;
    k_inv_rms<<<(unsigned)n, 256, 0, g->stream>>>(r, streams, (int64_t)hc * dim, h->norm_eps);
    k_mhc_mix<<<grid_for(n, 64), 64, 0, g->stream>>>(m, r, h->base, h->scale, hc, h->sinkhorn_iters, h->hc_eps, pre, post,
                                                     comb, n);
    k_collapse<<<grid_for((int64_t)n * dim, 256), 256, 0, g->stream>>>(collapsed, streams, pre, hc, dim, n);
    return ms_gpu_launched(err, "mhc pre");
}

__global__ void k_mhc_post(float *out, const float *in, const float *y, const float *post, const float *comb, int n,
                           int hc, int64_t dim) {
    int64_t total = (int64_t)n * hc * dim;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = k % dim, tj = k / dim, j = tj % hc, t = tj / hc;
        const float *ct = comb + t * hc * hc;
        float o = post[t * hc + j] * y[t * dim + c];
        for (int i = 0; i < hc; i++) o += ct[i * hc + j] * in[(t * hc + i) * dim + c];
        out[k] = o;
    }
}
static void b_mhc_post(ms_backend *be, const float *in, const float *y, const float *post, const float *comb, int n,
                       int hc, int dim, float *out) {
    if (n < 1) return;
    ms_err e = {0};
    k_mhc_post<<<grid_for((int64_t)n * hc * dim, 256), 256, 0, ms_gpu_be_dev(be)->stream>>>(out, in, y, post, comb, n, hc,
                                                                                          dim);
    ms_gpu_be_note(be, ms_gpu_launched(&e, "mhc post"), &e);
}

__global__ void k_mhc_expand(float *out, const float *x, int n, int hc, int64_t dim) {
    int64_t total = (int64_t)n * hc * dim;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x)
        out[k] = x[(k / (hc * dim)) * dim + k % dim];
}
static void b_mhc_expand(ms_backend *be, const float *x, int n, int hc, int dim, float *out) {
    if (n < 1) return;
    ms_err e = {0};
    k_mhc_expand<<<grid_for((int64_t)n * hc * dim, 256), 256, 0, ms_gpu_be_dev(be)->stream>>>(out, x, n, hc, dim);
    ms_gpu_be_note(be, ms_gpu_launched(&e, "mhc expand"), &e);
}

__global__ void k_mhc_mean(float *out, const float *streams, int n, int hc, int64_t dim) {
    int64_t total = (int64_t)n * dim;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = k / dim, c = k % dim;
        float s = 0;
        for (int i = 0; i < hc; i++) s += streams[(t * hc + i) * dim + c];
        out[k] = s / (float)hc;
    }
}
static void b_mhc_head_mean(ms_backend *be, const float *streams, int n, int hc, int dim, float *out) {
    if (n < 1) return;
    ms_err e = {0};
    k_mhc_mean<<<grid_for((int64_t)n * dim, 256), 256, 0, ms_gpu_be_dev(be)->stream>>>(out, streams, n, hc, dim);
    ms_gpu_be_note(be, ms_gpu_launched(&e, "mhc head mean"), &e);
}

static int b_mhc_head_weighted(ms_backend *be, const ms_qmat *fn, const float *base, const float *scale, int hc, int dim,
                               float hc_eps, float norm_eps, const float *streams, int n, float *out, ms_err *err) {
    int rc = ms_gpu_be_report(be, err);
    if (rc) return rc;
    if (hc < 1 || hc > 64 || dim < 1 || !base || !scale || n < 0)
        return ms_fail(err, MS_ERR_ARG, "mhc head: bad arguments (hc %d, dim %d, n %d)", hc, dim, n);
    if (!fn || fn->rows != hc || fn->cols != (int64_t)hc * dim)
        return ms_fail(err, MS_ERR_SHAPE, "mhc: hc_head fn is [%lld, %lld], expected [%d, %lld]",
                       fn ? (long long)fn->rows : -1LL, fn ? (long long)fn->cols : -1LL, hc, (long long)hc * dim);
    if (n == 0) return MS_OK;
    ms_gpu *g = ms_gpu_be_dev(be);
    float *m;
    if ((rc = scratch(be, (size_t)n * (2 * hc + 1), &m, err))) return rc;
    float *r = m + (size_t)n * hc, *pre = r + n;
    if ((rc = ms_gpu_matmul(g, m, streams, n, fn, 0, err))) return rc;
    k_inv_rms<<<(unsigned)n, 256, 0, g->stream>>>(r, streams, (int64_t)hc * dim, norm_eps);
    k_head_pre<<<grid_for((int64_t)n * hc, 64), 64, 0, g->stream>>>(pre, m, r, base, scale, hc, hc_eps, n);
    k_collapse<<<grid_for((int64_t)n * dim, 256), 256, 0, g->stream>>>(out, streams, pre, hc, dim, n);
    return ms_gpu_launched(err, "mhc head weighted");
}

/* ------------------------------------------------------------ LayerNorm and clamp (DBRX, PhiMoE) */

/* One block of 256 threads per row: the mean, then the variance around it, in double as the CPU op
 * sums them; y may equal x (every thread reads its elements before it writes them). */
__global__ void k_layernorm(float *y, const float *x, const float *w, const float *b, int64_t d, float eps) {
    __shared__ double sh[256];
    const float *xr = x + (int64_t)blockIdx.x * d;
    float *yr = y + (int64_t)blockIdx.x * d;
    double acc = 0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) acc += xr[i];
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int k = (int)blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
        __syncthreads();
    }
    const double mean = sh[0] / (double)d;
    __syncthreads();
    acc = 0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) acc += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int k = (int)blockDim.x / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
        __syncthreads();
    }
    const float inv = (float)(1.0 / sqrt(sh[0] / (double)d + (double)eps)), m = (float)mean;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = (xr[i] - m) * inv * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
}
static void b_layernorm(ms_backend *be, float *y, const float *x, const float *w, const float *b, int64_t rows, int64_t d,
                        float eps) {
    if (rows < 1) return;
    ms_err e = {0};
    k_layernorm<<<(unsigned)rows, 256, 0, ms_gpu_be_dev(be)->stream>>>(y, x, w, b, d, eps);
    ms_gpu_be_note(be, ms_gpu_launched(&e, "layernorm"), &e);
}

/* x[i] = min(max(x[i], lo), hi), NaN kept (as the CPU op) */
__global__ void k_clamp(float *x, float lo, float hi, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
}
static void b_clamp(ms_backend *be, float *x, float lo, float hi, int64_t n) {
    if (n < 1) return;
    ms_err e = {0};
    k_clamp<<<grid_for(n, 256), 256, 0, ms_gpu_be_dev(be)->stream>>>(x, lo, hi, n);
    ms_gpu_be_note(be, ms_gpu_launched(&e, "clamp"), &e);
}

/* ------------------------------------------------------------ the table */

void ms_gpu_blocks_fill(ms_backend_ops *o) {
    o->layernorm = b_layernorm;
    o->clamp = b_clamp;
    o->kda_forward = b_kda_forward;
    o->gdn_forward = b_gdn_forward;
    o->dsa_index = b_dsa_index;
    o->dsa_recheck = b_dsa_recheck;
    o->compress_append = b_compress_append;
    o->attn_compressed = b_attn_compressed;
    o->mhc_pre = b_mhc_pre;
    o->mhc_post = b_mhc_post;
    o->mhc_expand = b_mhc_expand;
    o->mhc_head_mean = b_mhc_head_mean;
    o->mhc_head_weighted = b_mhc_head_weighted;
}
