/* ops.cu — RMSNorm, RoPE, gated activations, MoE router, GQA attention
 * (contracts in gpu.h). Each mirrors a CPU twin: ops_ref.c / backend/cpu
 * (rmsnorm), model/rope.c (ms_rope_cos_sin, ms_rope_apply),
 * engine/moe.c (route, expert_act), engine/attention.c (gqa_head). */
#include <stdio.h>
#include <string.h>

#include "backend/gpu/gpu_internal.h"
#include "backend/gpu/route_warp.h"

/* Sum over a block whose size is a multiple of MS_WARP (every thread gets it). */
static __device__ float block_sum(float v, float *sh) {
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP, nw = blockDim.x / MS_WARP;
    v = ms_warp_sum(v);
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++) s += sh[i];
    return s;
}

/* ------------------------------------------------------------ RMSNorm */

__global__ void rmsnorm_kernel(float *y, const float *x, const float *w, int d, float eps) {
    __shared__ float sh[32];
    const float *xr = x + (int64_t)blockIdx.x * d;
    float *yr = y + (int64_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = block_sum(ss, sh);
    float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
}

extern "C" int ms_gpu_rmsnorm(ms_gpu *g, float *y, const float *x, const float *w, int n, int d, float eps,
                              ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!y || !x || n < 1 || d < 1 || !(eps >= 0))
        return ms_fail(err, MS_ERR_ARG, "ms_gpu_rmsnorm: need x, y, n >= 1, d >= 1, eps >= 0 (n %d, d %d)", n, d);
    rmsnorm_kernel<<<n, 256, 0, g->stream>>>(y, x, w, d, eps);
    return ms_gpu_launched(err, "rmsnorm");
}

/* --------------------------------------------------------------- RoPE */

__global__ void rope_kernel(float *x, int n, int64_t tok_stride, int n_heads, int64_t head_stride, int rot_off,
                            int half, int interleaved, const float *inv_freq, double attn_factor, int64_t pos0) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, total = (int64_t)n * n_heads * half;
    if (idx >= total) return;
    int i = (int)(idx % half);
    int64_t th = idx / half;
    int h = (int)(th % n_heads), t = (int)(th / n_heads);
    float ang = (float)(pos0 + t) * inv_freq[i]; /* in float, as transformers and the CPU path */
    float c = (float)(cos((double)ang) * attn_factor), s = (float)(sin((double)ang) * attn_factor);
    float *v = x + t * tok_stride + h * head_stride + rot_off;
    int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    float a = v[ia], b = v[ib];
    v[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[ib] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

extern "C" int ms_gpu_rope(ms_gpu *g, float *x, int n, int64_t tok_stride, int n_heads, int64_t head_stride,
                           int rot_off, int rot_dim, int interleaved, const float *inv_freq, double attn_factor,
                           int64_t pos0, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!x || !inv_freq || n < 1 || n_heads < 1 || rot_off < 0 || pos0 < 0)
        return ms_fail(err, MS_ERR_ARG, "ms_gpu_rope: need x, inv_freq, n >= 1, heads >= 1, offsets >= 0");
    if (rot_dim < 2 || rot_dim % 2 || rot_dim > 1024)
        return ms_fail(err, MS_ERR_ARG, "ms_gpu_rope: rotary dims %d must be even, 2..1024", rot_dim);
    int64_t total = (int64_t)n * n_heads * (rot_dim / 2);
    rope_kernel<<<(unsigned)((total + 255) / 256), 256, 0, g->stream>>>(x, n, tok_stride, n_heads, head_stride,
                                                                       rot_off, rot_dim / 2, interleaved, inv_freq,
                                                                       attn_factor, pos0);
    return ms_gpu_launched(err, "rope");
}

/* ---------------------------------------------------- gated activations */

__global__ void glu_kernel(float *out, const float *gate, const float *up, int64_t n, int act, float limit,
                           float alpha) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float gt = gate[i], u = up[i];
        if (act == MS_GPU_ACT_CLAMPED_SWIGLU) {
            float gg = gt > limit ? limit : gt; /* NaN stays NaN, as torch.clamp */
            float uu = u < -limit ? -limit : u > limit ? limit : u;
            out[i] = (uu + 1.0f) * gg * (1.0f / (1.0f + expf(-(alpha * gg))));
        } else {
            if (limit > 0) {
                if (gt > limit) gt = limit;
                u = u > limit ? limit : u < -limit ? -limit : u;
            }
            out[i] = gt / (1.0f + expf(-gt)) * u;
        }
    }
}

extern "C" int ms_gpu_glu(ms_gpu *g, float *out, const float *gate, const float *up, int64_t n, ms_gpu_act act,
                          float limit, float alpha, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!out || !gate || !up || n < 1) return ms_fail(err, MS_ERR_ARG, "ms_gpu_glu: need buffers and n >= 1");
    if (act != MS_GPU_ACT_SWIGLU && act != MS_GPU_ACT_CLAMPED_SWIGLU)
        return ms_fail(err, MS_ERR_ARG, "ms_gpu_glu: unknown activation %d", (int)act);
    int64_t blocks = (n + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    glu_kernel<<<(unsigned)blocks, 256, 0, g->stream>>>(out, gate, up, n, (int)act, limit, alpha);
    return ms_gpu_launched(err, "glu");
}

/* ------------------------------------------------------------- router */

#define RT_MAXG 256
#define RT_THREADS 256


/* K rounds of block argmax over v[0..E) (entries marked taken skipped) into ids. */
static __device__ void block_topk(const float *v, int E, int K, unsigned char *taken, int *ids, float *shv, int *shi) {
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP, nw = blockDim.x / MS_WARP;
    for (int k = 0; k < K; k++) {
        float bv = 0.0f;
        int bi = -1;
        for (int i = threadIdx.x; i < E; i += blockDim.x)
            if (!taken[i] && better(v[i], i, bv, bi)) bv = v[i], bi = i;
#pragma unroll
        for (int m = MS_WARP / 2; m > 0; m >>= 1) {
            float ov = ms_shfl_xor(bv, m);
            int oi = ms_shfl_xor_i(bi, m);
            if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        if (lane == 0) shv[warp] = bv, shi[warp] = bi;
        __syncthreads();
        if (threadIdx.x == 0) {
            float fv = 0.0f;
            int fi = -1;
            for (int w = 0; w < nw; w++)
                if (better(shv[w], shi[w], fv, fi)) fv = shv[w], fi = shi[w];
            for (int i = 0; fi < 0 && i < E; i++) /* only NaN left: the lowest unused index, as engine/moe.c */
                if (!taken[i]) fi = i;
            ids[k] = fi;
            if (fi >= 0) taken[fi] = 1;
        }
        __syncthreads();
    }
}

__global__ void route_kernel(int32_t *ids_out, float *w_out, const float *logits, const float *bias,
                             ms_gpu_route_cfg c) {
    __shared__ float scores[RT_MAXE], choice[RT_MAXE], shv[32], red[32];
    __shared__ unsigned char taken[RT_MAXE];
    __shared__ int shi[32], ids[RT_MAXK];
    __shared__ float gsc[RT_MAXG];
    __shared__ unsigned char gkeep[RT_MAXG];
    const int E = c.n_experts, K = c.top_k;
    const float *lg = logits + (int64_t)blockIdx.x * E;
    for (int i = threadIdx.x; i < E; i += blockDim.x) taken[i] = 0;
    if (c.kind == MS_GPU_ROUTER_SOFTMAX) {
        float m = -INFINITY;
        for (int i = threadIdx.x; i < E; i += blockDim.x) m = fmaxf(m, lg[i]);
        m = ms_warp_max(m);
        if (threadIdx.x % MS_WARP == 0) shv[threadIdx.x / MS_WARP] = m;
        __syncthreads();
        m = -INFINITY;
        for (int w = 0; w < (int)(blockDim.x / MS_WARP); w++) m = fmaxf(m, shv[w]);
        float s = 0.0f;
        for (int i = threadIdx.x; i < E; i += blockDim.x) s += (choice[i] = expf(lg[i] - m));
        s = block_sum(s, red);
        float inv = 1.0f / s;
        for (int i = threadIdx.x; i < E; i += blockDim.x) scores[i] = choice[i] * inv;
        __syncthreads();
        block_topk(scores, E, K, taken, ids, shv, shi);
    } else if (c.kind == MS_GPU_ROUTER_TOPK_SOFTMAX) {
        __syncthreads();
        block_topk(lg, E, K, taken, ids, shv, shi);
    } else {
        for (int i = threadIdx.x; i < E; i += blockDim.x) {
            scores[i] = 1.0f / (1.0f + expf(-lg[i]));
            choice[i] = scores[i] + (bias ? bias[i] : 0.0f);
        }
        __syncthreads();
        const int G = c.n_group;
        if (G > 1) {
            const int per = E / G;
            /* group score: the sum of its two best choices (one thread per group) */
            for (int gi = threadIdx.x; gi < G; gi += blockDim.x) {
                float b1 = 0.0f, b2 = 0.0f;
                int i1 = -1, i2 = -1;
                for (int j = 0; j < per; j++) {
                    float v = choice[gi * per + j];
                    if (better(v, j, b1, i1)) b2 = b1, i2 = i1, b1 = v, i1 = j;
                    else if (better(v, j, b2, i2)) b2 = v, i2 = j;
                }
                gsc[gi] = b1 + b2;
                gkeep[gi] = 0;
            }
            __syncthreads();
            if (threadIdx.x == 0) /* the topk_group best groups, ties to the lower group */
                for (int k = 0; k < c.topk_group; k++) {
                    float bv = 0.0f;
                    int bi = -1;
                    for (int gi = 0; gi < G; gi++)
                        if (!gkeep[gi] && better(gsc[gi], gi, bv, bi)) bv = gsc[gi], bi = gi;
                    if (bi >= 0) gkeep[bi] = 1;
                }
            __syncthreads();
            for (int i = threadIdx.x; i < E; i += blockDim.x)
                if (!gkeep[i / per]) choice[i] = -INFINITY;
            __syncthreads();
        }
        block_topk(choice, E, K, taken, ids, shv, shi);
    }
    if (threadIdx.x == 0) {
        float w[RT_MAXK];
        if (c.kind == MS_GPU_ROUTER_TOPK_SOFTMAX) {
            float m = -INFINITY;
            for (int k = 0; k < K; k++) m = fmaxf(m, w[k] = lg[ids[k]]);
            double s = 0;
            for (int k = 0; k < K; k++) s += (w[k] = expf(w[k] - m));
            float inv = (float)(1.0 / s);
            for (int k = 0; k < K; k++) w[k] *= inv;
        } else {
            double sum = 0;
            for (int k = 0; k < K; k++) sum += (w[k] = scores[ids[k]]);
            if (c.norm_topk) {
                float den = (float)(sum + (c.kind == MS_GPU_ROUTER_SIGMOID ? 1e-20 : 0.0));
                for (int k = 0; k < K; k++) w[k] /= den;
            }
            for (int k = 0; k < K; k++) w[k] *= c.routed_scale;
        }
        for (int k = 0; k < K; k++) {
            ids_out[(int64_t)blockIdx.x * K + k] = ids[k];
            w_out[(int64_t)blockIdx.x * K + k] = w[k];
        }
    }
}

/* The one-warp router (route_warp.h), one warp per token. */
__global__ void __launch_bounds__(MS_WARP) route_warp_kernel(int32_t *ids_out, float *w_out, const float *logits,
                                                            const float *bias, ms_gpu_route_cfg c) {
    __shared__ float scores[RT_MAXE], choice[RT_MAXE];
    __shared__ unsigned char taken[RT_MAXE];
    __shared__ int ids[RT_MAXK];
    route_warp_token(ids_out + (int64_t)blockIdx.x * c.top_k, w_out + (int64_t)blockIdx.x * c.top_k,
                     logits + (int64_t)blockIdx.x * c.n_experts, bias, c, scores, choice, taken, ids);
}

extern "C" int ms_gpu_route(ms_gpu *g, int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                            const ms_gpu_route_cfg *c, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!ids || !weights || !logits || !c || n < 1) return ms_fail(err, MS_ERR_ARG, "ms_gpu_route: NULL argument or n < 1");
    if (c->kind != MS_GPU_ROUTER_SOFTMAX && c->kind != MS_GPU_ROUTER_SIGMOID && c->kind != MS_GPU_ROUTER_TOPK_SOFTMAX)
        return ms_fail(err, MS_ERR_ARG, "ms_gpu_route: unknown router kind %d", (int)c->kind);
    if (c->n_experts < 1 || c->n_experts > RT_MAXE || c->top_k < 1 || c->top_k > RT_MAXK || c->top_k > c->n_experts)
        return ms_fail(err, MS_ERR_LIMIT, "ms_gpu_route: %d experts, top %d (limits: experts <= %d, 1 <= k <= %d, k <= experts)",
                       c->n_experts, c->top_k, RT_MAXE, RT_MAXK);
    if (c->kind == MS_GPU_ROUTER_SIGMOID && c->n_group > 1 &&
        (c->n_group > RT_MAXG || c->n_experts % c->n_group || c->n_experts / c->n_group < 2 || c->topk_group < 1 ||
         c->topk_group > c->n_group))
        return ms_fail(err, MS_ERR_ARG,
                       "ms_gpu_route: %d groups (<= %d) of %d experts (>= 2 each, dividing evenly), %d kept groups",
                       c->n_group, RT_MAXG, c->n_experts, c->topk_group);
    if (!(g->legacy & MS_GPU_LEG_ROUTE) && (c->kind != MS_GPU_ROUTER_SIGMOID || c->n_group <= 1))
        route_warp_kernel<<<n, MS_WARP, 0, g->stream>>>(ids, weights, logits, bias, *c);
    else
        route_kernel<<<n, RT_THREADS, 0, g->stream>>>(ids, weights, logits, bias, *c);
    return ms_gpu_launched(err, "route");
}

/* ---------------------------------------------------------- attention */

#define AT_WARPS 4
#define AT_MAXD 512
#define AT_MAXS MS_GPU_ATTN_MAXS /* key splits */
#define AT_VB 8    /* value rows loaded together at PV > 4 (16 at PV <= 4: VB below) */

/* The earlier form (MS_GPU_ATTN=old, and the shapes attn_decode.cu declines).
 * Flash-decoding over a GQA cache. Grid: (q-head groups, tokens, key splits).
 * A block takes GB query heads that share one kv head, so each K/V row is read
 * once for all of them, and one slice of the keys. Warps take tiles of
 * MS_WARP keys: lane j scores key j against the GB queries (q in shared
 * memory), the tile's probabilities are broadcast by shuffles while the lanes
 * accumulate the value rows across dims (PV dims per lane). Each block leaves
 * (max, sum, unnormalized output) per head for attn_combine_kernel. */
template <int GB, int PV>
__global__ void __launch_bounds__(AT_WARPS *MS_WARP)
    attn_split_kernel(float *part, const float *q, const float *K, const float *V, int64_t pos0,
                      const int64_t *pos_dev, int splits, ms_gpu_attn_cfg c) {
    __shared__ float qs[GB][AT_MAXD];
    __shared__ float wm[AT_WARPS][GB], wl[AT_WARPS][GB];
    __shared__ float wo[AT_WARPS][GB][PV * MS_WARP];
    constexpr int VB = PV <= 4 ? 2 * AT_VB : AT_VB; /* more rows in flight where registers allow (short contexts) */
    ms_pdl_launch();
    ms_pdl_wait(); /* q, the caches and the position are earlier kernels' (launched with PDL) */
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    const int H = c.n_heads, hd = c.head_dim, vd = c.v_head_dim, G = H / c.n_kv_heads;
    const int h0 = blockIdx.x * GB, kvh = h0 / G, t = blockIdx.y, split = blockIdx.z;
    const int64_t kd = (int64_t)c.n_kv_heads * hd, vtot = (int64_t)c.n_kv_heads * vd;
    const int64_t p = (pos_dev ? *pos_dev : pos0) + t; /* a replayable step: the position from device memory */
    const int64_t s0 = c.window > 0 && p - c.window + 1 > 0 ? p - c.window + 1 : 0, nkeys = p - s0 + 1;
    const int64_t per = (nkeys + splits - 1) / splits, a0 = s0 + split * per;
    const int64_t a1 = a0 + per - 1 < p ? a0 + per - 1 : p; /* inclusive */
    for (int i = threadIdx.x; i < GB * hd; i += blockDim.x)
        qs[i / hd][i % hd] = q[((int64_t)t * H + h0 + i / hd) * hd + i % hd];
    __syncthreads();
    float m[GB], l[GB], acc[GB][PV];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < PV; i++) acc[g][i] = 0.0f;
    }
    for (int64_t tb = a0 + (int64_t)warp * MS_WARP; tb <= a1; tb += (int64_t)AT_WARPS * MS_WARP) {
        const int64_t s = tb + lane;
        const bool valid = s <= a1;
        float sc[GB];
#pragma unroll
        for (int g = 0; g < GB; g++) sc[g] = 0.0f;
        if (valid) {
            const float4 *kr = (const float4 *)(K + s * kd + (int64_t)kvh * hd);
#pragma unroll 16
            for (int d4 = 0; d4 < hd / 4; d4++) {
                float4 kv = kr[d4];
#pragma unroll
                for (int g = 0; g < GB; g++) {
                    const float *qq = &qs[g][4 * d4];
                    sc[g] = fmaf(qq[0], kv.x, sc[g]);
                    sc[g] = fmaf(qq[1], kv.y, sc[g]);
                    sc[g] = fmaf(qq[2], kv.z, sc[g]);
                    sc[g] = fmaf(qq[3], kv.w, sc[g]);
                }
            }
        }
        float pr[GB];
#pragma unroll
        for (int g = 0; g < GB; g++) {
            float v = valid ? sc[g] * c.scale : -INFINITY;
            float mn = fmaxf(m[g], ms_warp_max(v)); /* finite: lane 0 of the tile is valid */
            float corr = expf(m[g] - mn);
            pr[g] = expf(v - mn);
            l[g] = l[g] * corr + pr[g];
#pragma unroll
            for (int i = 0; i < PV; i++) acc[g][i] *= corr;
            m[g] = mn;
        }
        const int nt = a1 - tb + 1 < MS_WARP ? (int)(a1 - tb + 1) : MS_WARP;
        /* value rows AT_VB at a time: their loads in flight together (the probabilities of keys
         * past nt are 0 and their rows read as 0, so a partial group adds exact zeros) */
        for (int j0 = 0; j0 < nt; j0 += VB) {
            float vv[VB][PV];
#pragma unroll
            for (int jj = 0; jj < VB; jj++) {
                const float *vr = V + (tb + j0 + jj) * vtot + (int64_t)kvh * vd;
#pragma unroll
                for (int i = 0; i < PV; i++) {
                    int d = lane + i * MS_WARP;
                    vv[jj][i] = d < vd && j0 + jj < nt ? vr[d] : 0.0f;
                }
            }
#pragma unroll
            for (int jj = 0; jj < VB; jj++)
#pragma unroll
                for (int g = 0; g < GB; g++) {
                    float pj = ms_shfl_idx(pr[g], (j0 + jj) % MS_WARP);
#pragma unroll
                    for (int i = 0; i < PV; i++) acc[g][i] = fmaf(pj, vv[jj][i], acc[g][i]);
                }
        }
    }
#pragma unroll
    for (int g = 0; g < GB; g++) {
        float ls = ms_warp_sum(l[g]);
        if (lane == 0) wm[warp][g] = m[g], wl[warp][g] = ls;
#pragma unroll
        for (int i = 0; i < PV; i++) wo[warp][g][lane + i * MS_WARP] = acc[g][i];
    }
    __syncthreads();
    /* merge the warps: part[(t, h, split)] = {max, sum, out[vd]} */
    for (int g = 0; g < GB; g++) {
        float M = -INFINITY;
        for (int w = 0; w < AT_WARPS; w++) M = fmaxf(M, wm[w][g]);
        float *dst = part + (((int64_t)t * H + h0 + g) * splits + split) * (vd + 2);
        float L = 0.0f;
        for (int w = 0; w < AT_WARPS; w++)
            if (wl[w][g] > 0) L += wl[w][g] * expf(wm[w][g] - M);
        if (threadIdx.x == 0) dst[0] = M, dst[1] = L;
        for (int d = threadIdx.x; d < vd; d += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < AT_WARPS; w++)
                if (wl[w][g] > 0) o += wo[w][g][d] * expf(wm[w][g] - M);
            dst[2 + d] = o;
        }
    }
}

/* out[t, h] = sum over splits of out_s e^(m_s - M) / (sum_s l_s e^(m_s - M) + e^(sink - M)). */
__global__ void attn_combine_kernel(float *out, const float *part, const float *sinks, int splits, int H, int vd) {
    const int h = blockIdx.x, t = blockIdx.y;
    ms_pdl_launch();
    ms_pdl_wait(); /* the partials are the split kernel's */
    const float *src = part + ((int64_t)t * H + h) * splits * (vd + 2);
    float M = sinks ? sinks[h] : -INFINITY;
    for (int s = 0; s < splits; s++)
        if (src[s * (vd + 2) + 1] > 0) M = fmaxf(M, src[s * (vd + 2)]);
    float L = sinks ? expf(sinks[h] - M) : 0.0f;
    for (int s = 0; s < splits; s++) {
        const float *ps = src + s * (vd + 2);
        if (ps[1] > 0) L += ps[1] * expf(ps[0] - M);
    }
    float inv = 1.0f / L;
    for (int d = threadIdx.x; d < vd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < splits; s++) {
            const float *ps = src + s * (vd + 2);
            if (ps[1] > 0) o += ps[2 + d] * expf(ps[0] - M);
        }
        out[((int64_t)t * H + h) * vd + d] = o * inv;
    }
}

template <int GB, int PV>
static void launch_attn(int pdl, dim3 grid, gpuStream_t st, float *part, const float *q, const float *K, const float *V,
                        int64_t pos0, const int64_t *pos_dev, int splits, const ms_gpu_attn_cfg &c) {
    ms_launch(pdl, attn_split_kernel<GB, PV>, grid, dim3(AT_WARPS * MS_WARP), 0, st, part, q, K, V, pos0, pos_dev, splits, c);
}

extern "C" size_t ms_gpu_attn_scratch_floats(int n, const ms_gpu_attn_cfg *c) {
    return (size_t)n * (size_t)c->n_heads * AT_MAXS * (size_t)(c->v_head_dim + 2);
}

static int attn_gqa(ms_gpu *g, float *out, const float *q, const float *k_cache, const float *v_cache,
                    const float *sinks, int n, int64_t pos0, const int64_t *pos_dev, const ms_gpu_attn_cfg *c,
                    float *scratch, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!out || !q || !k_cache || !v_cache || !c || !scratch || n < 1 || pos0 < 0)
        return ms_fail(err, MS_ERR_ARG, "ms_gpu_attn_gqa: NULL argument, n < 1 or pos0 < 0");
    if (c->n_heads < 1 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads || c->head_dim < 4 || c->head_dim % 4 ||
        c->head_dim > AT_MAXD || c->v_head_dim < 1 || c->v_head_dim > AT_MAXD || c->window < 0)
        return ms_fail(err, MS_ERR_ARG,
                       "ms_gpu_attn_gqa: %d heads over %d kv heads (must divide), head dim %d (multiple of 4, <= %d), "
                       "value dim %d (1..%d), window %d",
                       c->n_heads, c->n_kv_heads, c->head_dim, AT_MAXD, c->v_head_dim, AT_MAXD, c->window);
    if (((uintptr_t)k_cache | (uintptr_t)q) % 16)
        return ms_fail(err, MS_ERR_ARG, "ms_gpu_attn_gqa: q and the key cache must be 16-byte aligned");
    if (g->attn_mode != MS_GPU_ATTN_OLD) { /* the decode kernel (attn_decode.cu) where it takes the shape */
        int rc = ms_gpu_attn_dec(g, out, q, k_cache, v_cache, sinks, n, pos0, pos_dev, c, scratch, NULL, err);
        if (rc >= 0) return rc;
    }
    int G = c->n_heads / c->n_kv_heads;
    int pv = (c->v_head_dim + MS_WARP - 1) / MS_WARP;
    pv = pv <= 2 ? 2 : pv <= 4 ? 4 : pv <= 8 ? 8 : 16;
    int gb = 1;
    while (gb * 2 <= 8 && G % (gb * 2) == 0 && gb * 2 * pv <= 32 && gb * 2 * c->head_dim <= AT_MAXD * 4) gb *= 2;
    /* few query tokens (decode): fewer heads per block, down to 2, so that the blocks fill the device */
    while (gb > 2 && (int64_t)(c->n_heads / gb) * n < g->prop.multiProcessorCount) gb /= 2;
    /* splits: enough blocks for the device, at least 64 keys each */
    int64_t keys = pos0 + n;
    if (c->window > 0 && keys > c->window) keys = c->window;
    int64_t blocks = (int64_t)(c->n_heads / gb) * n;
    int64_t want = (2 * (int64_t)g->prop.multiProcessorCount + blocks - 1) / blocks;
    int64_t cap = (keys + 63) / 64;
    int splits = (int)(want < cap ? want : cap);
    if (splits < 1) splits = 1;
    if (splits > AT_MAXS) splits = AT_MAXS;
    dim3 grid((unsigned)(c->n_heads / gb), (unsigned)n, (unsigned)splits);
#define AT_CASE(GBV, PVV) \
    if (gb == GBV && pv == PVV)                                                                                       \
        launch_attn<GBV, PVV>(g->pdl_attn, grid, g->stream, scratch, q, k_cache, v_cache, pos0, pos_dev, splits, *c)
    AT_CASE(1, 2); else AT_CASE(2, 2); else AT_CASE(4, 2); else AT_CASE(8, 2);
    else AT_CASE(1, 4); else AT_CASE(2, 4); else AT_CASE(4, 4); else AT_CASE(8, 4);
    else AT_CASE(1, 8); else AT_CASE(2, 8); else AT_CASE(4, 8);
    else AT_CASE(1, 16); else AT_CASE(2, 16);
    else return ms_fail(err, MS_ERR_UNSUPPORTED, "ms_gpu_attn_gqa: no kernel for group %d x %d value regs", gb, pv);
#undef AT_CASE
    int rc = ms_gpu_launched(err, "attention (split)");
    if (rc) return rc;
    ms_launch(g->pdl_attn, attn_combine_kernel, dim3((unsigned)c->n_heads, (unsigned)n), dim3(128), 0, g->stream, out,
              (const float *)scratch, sinks, splits, (int)c->n_heads, (int)c->v_head_dim);
    return ms_gpu_launched(err, "attention (combine)");
}

extern "C" int ms_gpu_attn_gqa(ms_gpu *g, float *out, const float *q, const float *k_cache, const float *v_cache,
                               const float *sinks, int n, int64_t pos0, const ms_gpu_attn_cfg *c, float *scratch,
                               ms_err *err) {
    return attn_gqa(g, out, q, k_cache, v_cache, sinks, n, pos0, NULL, c, scratch, err);
}

extern "C" int ms_gpu_attn_gqa_at(ms_gpu *g, float *out, const float *q, const float *k_cache, const float *v_cache,
                                  const float *sinks, int64_t pos_bound, const int64_t *pos_dev,
                                  const ms_gpu_attn_cfg *c, float *scratch, ms_err *err) {
    if (!pos_dev) return ms_fail(err, MS_ERR_ARG, "ms_gpu_attn_gqa_at: no device position");
    return attn_gqa(g, out, q, k_cache, v_cache, sinks, 1, pos_bound, pos_dev, c, scratch, err);
}
