/* attn_decode.cu — GQA attention of a few query tokens over an F32 KV cache, the
 * decode form (ms_gpu_attn_dec, gpu_internal.h; the contract is gpu.h's
 * ms_gpu_attn_gqa / ms_gpu_attn_gqa_at, whose dispatch in ops.cu calls it first).
 *
 * Grid: (KV heads x head groups, tokens, key splits). A block takes GB query heads of
 * one KV head (all of them up to 8, so each key and value row is read once per token)
 * and one slice of the keys; its AD_WARPS warps take tiles of KT keys, the lanes own
 * float4 chunks of the head dim (NC per lane) and of the value dim (NCV). Per tile a
 * lane loads its chunks of the KT key rows and value rows at once (16-byte loads, a
 * row per warp instruction), forms its partial dots of the KT x GB (key, head) pairs,
 * and one transposing butterfly (ad_treduce: at each level a lane sends the half of
 * its partials it does not keep) leaves each pair's full dot in its own lane(s), in
 * KT*GB - 1 + the remaining levels' shuffles rather than KT*GB*log2(warp). The online
 * softmax runs in the lanes of the pairs; the probabilities and the rescale factors go
 * to the lanes over shared memory, which accumulate p * v into their value chunks of
 * every head. The warps merge in shared memory; one split writes the output itself,
 * more write (max, sum, unnormalized output) per head and split, and the last block
 * of the head group to arrive (an arrival counter, ms_gpu_counters) combines them in
 * split order; MS_GPU_ATTN=combine runs that combine as its own launch instead (the
 * same function: the same bits). Which block arrives last does not change the result,
 * and the grid depends only on the shape and the key count bound (a replayed step's
 * bound: eager, recorded and replayed steps run the same arithmetic). */
#include <math.h>
#include <string.h>

#include "backend/gpu/gpu_internal.h"

#define AD_THREADS 256
#define AD_WARPS (AD_THREADS / MS_WARP)
#define AD_MAXTOK 16 /* query tokens per launch taken (the backend's chunks) */

/* Keys per warp tile: KT * GB pairs of at most a warp, at most 8 keys, and the tile's loads
 * (KT (NC + NCV) float4 per lane) at most 16 float4; a power of two. */
static __host__ __device__ constexpr int ad_kt(int gb, int nc, int ncv) {
    int k = MS_WARP / gb < 8 ? MS_WARP / gb : 8;
    while (k > 1 && k * (nc + ncv) > 16) k /= 2;
    return k;
}

typedef struct ad_args {
    float *out;        /* [n, H, vd] */
    float *po, *pml;   /* partials: po [n, H, splits, vd], pml [n, H, splits, 2] (max, sum) */
    const float *q, *K, *V, *sinks;
    const int64_t *pos_dev;
    int64_t pos0;
    int *cnt;          /* arrival counters [n * gridDim.x] (zero between launches), NULL: no fold */
    int splits, ngrp;  /* key splits; head groups per KV head */
    ms_gpu_attn_cfg c;
    ms_gpu_qkv_pro pro; /* the FQ kernels: q raw, qkv_at's norms, RoPE and cache rows in their prologue */
} ad_args;

/* The full warp sums of NV partials per lane (NV a power of two <= MS_WARP): level O (MS_WARP/2
 * down to 1) with C partials left, C > 1: the lanes with bit O set keep the upper half, the
 * others the lower, each adding its partner's copy of the half it keeps; C = 1: a plain
 * butterfly sum. Leaves in v[0] the sum of partial lane / (MS_WARP / NV) (every lane of that
 * group of MS_WARP / NV holds the same bits). Each sum: the lane's own chain, then a fixed tree. */
template <int O, int C> struct ad_tr {
    static __device__ __forceinline__ void run(float *v, int lane) {
        if constexpr (C > 1) {
            constexpr int h = C / 2;
            const bool up = (lane & O) != 0;
#pragma unroll
            for (int i = 0; i < h; i++) {
                float send = up ? v[i] : v[i + h], keep = up ? v[i + h] : v[i];
                v[i] = keep + ms_shfl_xor(send, O);
            }
            ad_tr<O / 2, h>::run(v, lane);
        } else {
            v[0] += ms_shfl_xor(v[0], O);
            ad_tr<O / 2, 1>::run(v, lane);
        }
    }
};
template <int C> struct ad_tr<0, C> {
    static __device__ __forceinline__ void run(float *, int) {}
};

static __device__ __forceinline__ void f4_fma(float4 &a, float p, const float4 &v) {
    a.x = fmaf(p, v.x, a.x), a.y = fmaf(p, v.y, a.y), a.z = fmaf(p, v.z, a.z), a.w = fmaf(p, v.w, a.w);
}
static __device__ __forceinline__ void f4_scale(float4 &a, float s) { a.x *= s, a.y *= s, a.z *= s, a.w *= s; }

/* The combine of head group (t, h0 .. h0 + gn - 1) by one block: per head (a warp) the splits'
 * maxima and sums over the lanes, the weights e^(m_s - M) into shared memory, then per output
 * float4 the splits in ascending order:
 *   out = sum_s w_s o_s / (sum_s w_s l_s + e^(sink - M)), M = max(sink, m_s over splits with l_s > 0).
 * Partials are read through L2 (other blocks of this launch wrote them). */
template <int GB> static __device__ void ad_combine(const ad_args &a, int t, int h0, int gn) {
    __shared__ float cw[GB][MS_GPU_ATTN_MAXS], cinv[GB];
    constexpr int SL = (MS_GPU_ATTN_MAXS + MS_WARP - 1) / MS_WARP;
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    const int S = a.splits, H = a.c.n_heads, vd4 = a.c.v_head_dim / 4;
    for (int g = warp; g < gn; g += AD_WARPS) {
        const float *ml = a.pml + ((int64_t)t * H + h0 + g) * S * 2;
        const float sk = a.sinks ? a.sinks[h0 + g] : -INFINITY;
        float ms[SL], ls[SL], M = sk;
#pragma unroll
        for (int i = 0; i < SL; i++) {
            const int s = lane + i * MS_WARP;
            ms[i] = s < S ? ms_load_cg(ml + 2 * s) : -INFINITY;
            ls[i] = s < S ? ms_load_cg(ml + 2 * s + 1) : 0.0f;
            if (ls[i] > 0) M = fmaxf(M, ms[i]);
        }
        M = ms_warp_max(M); /* finite: split 0 has keys */
        float L = 0.0f;
#pragma unroll
        for (int i = 0; i < SL; i++) {
            const int s = lane + i * MS_WARP;
            const float w = ls[i] > 0 ? expf(ms[i] - M) : 0.0f;
            if (s < S) cw[g][s] = w;
            L = fmaf(ls[i], w, L);
        }
        L = ms_warp_sum(L) + (a.sinks ? expf(sk - M) : 0.0f);
        if (lane == 0) cinv[g] = 1.0f / L;
    }
    __syncthreads();
    for (int it = threadIdx.x; it < gn * vd4; it += AD_THREADS) {
        const int g = it / vd4, c4 = it % vd4;
        const float4 *src = (const float4 *)a.po + ((int64_t)t * H + h0 + g) * S * vd4 + c4;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16 /* the loads of 16 splits in flight */
        for (int s = 0; s < S; s++) f4_fma(o, cw[g][s], ms_load_cg4(src + (int64_t)s * vd4));
        f4_scale(o, cinv[g]);
        ((float4 *)a.out)[((int64_t)t * H + h0 + g) * vd4 + c4] = o;
    }
}

/* One head's rope(norm(src)) by one warp (the FQ prologue), rope_head.h's arithmetic to the bit:
 * the sum of squares in the order of qkv_at's 128-thread block (its thread T adds elements T,
 * T + 128, .. in order; the butterfly sums of its warps added in warp order to 0), the norm
 * x * r * w, the rotation of pair i with cs[i] = (cos, sin) times the attention factor, the dims
 * past 2 half copied. buf: hd floats of shared memory (dst may be buf). act is warp-uniform; every
 * warp of the block calls it (ms_syncwarp is a block barrier on HIP). */
static __device__ __forceinline__ void ad_head_prep(const float *src, float *buf, float *dst, int hd,
                                                    const ms_gpu_qkv_pro &pr, const float *w, const float2 *cs,
                                                    int lane, bool act) {
    constexpr int NWV = 128 / MS_WARP; /* qkv_at's warps */
    float part[NWV];
#pragma unroll
    for (int vw = 0; vw < NWV; vw++) {
        part[vw] = 0.0f;
        if (act)
            for (int i = vw * MS_WARP + lane; i < hd; i += 128) {
                const float x = src[i];
                buf[i] = x;
                part[vw] = fmaf(x, x, part[vw]);
            }
    }
    float tot = 0.0f;
#pragma unroll
    for (int vw = 0; vw < NWV; vw++) tot += ms_warp_sum(part[vw]);
    if (act && pr.norm) {
        const float r = 1.0f / sqrtf(tot / (float)hd + pr.eps);
        for (int i = lane; i < hd; i += MS_WARP) buf[i] = buf[i] * r * (w ? w[i] : 1.0f); /* the lane's own elements */
    }
    ms_syncwarp(); /* the rotation pairs cross lanes */
    if (!act) return;
    const int half = pr.half;
    if (dst != buf)
        for (int i = lane; i < hd; i += MS_WARP)
            if (i >= 2 * half) dst[i] = buf[i];
    for (int i = lane; i < half; i += MS_WARP) {
        const int ia = pr.interleaved ? 2 * i : i, ib = pr.interleaved ? 2 * i + 1 : i + half;
        const float2 t = cs[i];
        const float x0 = buf[ia], x1 = buf[ib];
        dst[ia] = __fsub_rn(__fmul_rn(x0, t.x), __fmul_rn(x1, t.y));
        dst[ib] = __fadd_rn(__fmul_rn(x1, t.x), __fmul_rn(x0, t.y));
    }
}

/* cs[i] = (cos, sin) of pair i's angle (float)pos * inv[i] in double, times attn_factor, rounded to
 * float (rope_head.h's), i < half, by the block's threads; out of line (the double trig's frame
 * and registers stay out of the attention loop's). */
static __device__ __noinline__ void ad_rope_cs(float2 *cs, int half, const float *inv, int64_t pos, double af) {
    for (int i = threadIdx.x; i < half; i += AD_THREADS) {
        const float ang = (float)pos * inv[i];
        cs[i] = make_float2((float)(cos((double)ang) * af), (float)(sin((double)ang) * af));
    }
}

template <int GB, int NC, int NCV, bool FQ>
__global__ void __launch_bounds__(AD_THREADS, 2) attn_dec_kernel(ad_args a) {
    constexpr int KT = ad_kt(GB, NC, NCV), NV = KT * GB, R = MS_WARP / NV;
    __shared__ float sp[AD_WARPS][NV], scor[AD_WARPS][GB];
    __shared__ float wm[AD_WARPS][GB], wl[AD_WARPS][GB], ew[AD_WARPS][GB], bM[GB], bL[GB];
    __shared__ float4 wo[AD_WARPS][GB][NCV * MS_WARP];
    __shared__ int last;
    constexpr int QS = NC * MS_WARP * 4; /* FQ: floats per head in qn */
    __shared__ __align__(16) float qn[FQ ? GB * QS : 4], kn[FQ ? QS : 4];
    __shared__ float2 cs[FQ ? QS / 2 : 2];
    const ms_gpu_attn_cfg &c = a.c;
    ms_pdl_launch();
    if constexpr (FQ) { /* the RoPE angles: a table and the step's position (uploaded before the step's first
                         * kernel, which every kernel of the chain starts after), so before the wait */
        ad_rope_cs(cs, a.pro.half, a.pro.inv, *a.pos_dev, a.pro.attn_factor);
    }
    ms_pdl_wait(); /* q, the caches, the position and the counters are earlier kernels' (launched with PDL) */
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    const int H = c.n_heads, G = H / c.n_kv_heads, hd4 = c.head_dim / 4, vd4 = c.v_head_dim / 4;
    const int kvh = blockIdx.x / a.ngrp, grp = blockIdx.x % a.ngrp, t = blockIdx.y, split = blockIdx.z;
    const int h0 = kvh * G + grp * GB, gn = G - grp * GB < GB ? G - grp * GB : GB;
    const int64_t kd4 = (int64_t)c.n_kv_heads * hd4, vt4 = (int64_t)c.n_kv_heads * vd4;
    const int64_t p = (a.pos_dev ? *a.pos_dev : a.pos0) + t; /* a replayable step: the position from device memory */
    const int64_t s0 = c.window > 0 && p - c.window + 1 > 0 ? p - c.window + 1 : 0, nkeys = p - s0 + 1;
    const int64_t per = (nkeys + a.splits - 1) / a.splits, k0 = s0 + (int64_t)split * per;
    const int64_t k1 = k0 + per - 1 < p ? k0 + per - 1 : p; /* inclusive; k0 > k1: no keys */
    const float4 *K4 = (const float4 *)a.K + (int64_t)kvh * hd4, *V4 = (const float4 *)a.V + (int64_t)kvh * vd4;
    const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (FQ) { /* qkv_at's work (one token, t = 0): the group's query heads normed and rotated into
                         * qn (every block with keys: redundant, cheap), and by the block(s) whose keys hold
                         * the token's own, its key head normed and rotated and its value row, written into
                         * cache row p (visible to the block after the barrier; no other block reads row p) */
        if (k0 <= k1) {
            const bool own = p <= k1; /* k0 <= p: p is the last key of the last split with keys */
            const int items = gn + (own ? 1 : 0), hd = c.head_dim, vd = c.v_head_dim, KV = c.n_kv_heads;
            __syncthreads(); /* cs */
#pragma unroll 1
            for (int b0 = 0; b0 < items; b0 += AD_WARPS) {
                const int it = b0 + warp;
                const bool act = it < items, isk = it == gn;
                const float *src = !act ? a.q : isk ? a.pro.k + (int64_t)kvh * hd : a.q + (int64_t)(h0 + it) * hd;
                float *buf = isk || !act ? kn : qn + it * QS;
                float *dst = isk ? a.pro.kc + (p * KV + kvh) * hd : buf;
                ad_head_prep(src, buf, dst, hd, a.pro, isk ? a.pro.wk : a.pro.wq, cs, lane, act);
            }
            if (own)
                for (int i = threadIdx.x; i < vd; i += AD_THREADS)
                    a.pro.vc[(p * KV + kvh) * vd + i] = a.pro.v[(int64_t)kvh * vd + i];
            for (int i = threadIdx.x; i < GB * QS; i += AD_THREADS) /* padded heads and dims: zeros */
                if (i / QS >= gn || i % QS >= hd) qn[i] = 0.0f;
            __syncthreads();
        }
    }
    float4 qr[GB][NC], acc[GB][NCV];
#pragma unroll
    for (int g = 0; g < GB; g++) {
#pragma unroll
        for (int i = 0; i < NC; i++) {
            const int ci = lane + i * MS_WARP;
            if constexpr (!FQ) /* FQ: the queries stay in qn (shared), read per tile: registers for the tile's */
                qr[g][i] = g < gn && ci < hd4 ? ((const float4 *)a.q)[((int64_t)t * H + h0 + g) * hd4 + ci] : z4;
        }
#pragma unroll
        for (int j = 0; j < NCV; j++) acc[g][j] = z4;
    }
    /* this lane's pair after the butterfly: key my_k of the tile, head my_g */
    const int my = lane / R, my_g = my % GB, my_k = my / GB;
    float m = -INFINITY, l = 0.0f;
    /* the block's tiles: every warp runs the same trip count (ms_syncwarp is a block barrier on HIP) */
    for (int64_t bt = k0; bt <= k1; bt += (int64_t)AD_WARPS * KT) {
        const int64_t tb = bt + (int64_t)warp * KT;
        const bool act = tb <= k1; /* the warp has keys in this tile (key tb among them) */
        float4 kr[KT][NC], vr[KT][NCV];
        if (act) {
#pragma unroll
            for (int k = 0; k < KT; k++) {
                const int64_t key = tb + k;
                const bool ok = key <= k1;
#pragma unroll
                for (int i = 0; i < NC; i++) {
                    const int ci = lane + i * MS_WARP;
                    kr[k][i] = ok && ci < hd4 ? K4[key * kd4 + ci] : z4;
                }
#pragma unroll
                for (int j = 0; j < NCV; j++) {
                    const int cj = lane + j * MS_WARP;
                    vr[k][j] = ok && cj < vd4 ? V4[key * vt4 + cj] : z4;
                }
            }
            float v[NV];
#pragma unroll
            for (int k = 0; k < KT; k++)
#pragma unroll
                for (int g = 0; g < GB; g++) {
                    float s = 0.0f;
#pragma unroll
                    for (int i = 0; i < NC; i++) {
                        const float4 qg = FQ ? ((const float4 *)(qn + g * QS))[lane + i * MS_WARP] : qr[g][i];
                        s = fmaf(qg.x, kr[k][i].x, s), s = fmaf(qg.y, kr[k][i].y, s);
                        s = fmaf(qg.z, kr[k][i].z, s), s = fmaf(qg.w, kr[k][i].w, s);
                    }
                    v[k * GB + g] = s;
                }
            ad_tr<MS_WARP / 2, NV>::run(v, lane);
            const float sc = tb + my_k <= k1 ? v[0] * c.scale : -INFINITY;
            float tm = sc; /* the tile's max of head my_g: over the lanes of its keys */
#pragma unroll
            for (int o = GB * R; o < MS_WARP; o <<= 1) tm = fmaxf(tm, ms_shfl_xor(tm, o));
            const float mn = fmaxf(m, tm); /* finite: key tb is in the tile */
            const float corr = expf(m - mn), pr = expf(sc - mn);
            l = l * corr + pr, m = mn;
            if (lane % R == 0) sp[warp][my] = pr;
            if (lane % R == 0 && my_k == 0) scor[warp][my_g] = corr;
        }
        ms_syncwarp();
        if (act) {
#pragma unroll
            for (int g = 0; g < GB; g++) {
                const float cg = scor[warp][g];
#pragma unroll
                for (int j = 0; j < NCV; j++) f4_scale(acc[g][j], cg);
            }
#pragma unroll
            for (int k = 0; k < KT; k++)
#pragma unroll
                for (int g = 0; g < GB; g++) {
                    const float pk = sp[warp][k * GB + g];
#pragma unroll
                    for (int j = 0; j < NCV; j++) f4_fma(acc[g][j], pk, vr[k][j]);
                }
        }
        ms_syncwarp(); /* sp / scor are rewritten by the next tile */
    }
    /* the warp's per-head sums over its key lanes; then the warps merged in shared memory */
    float ls = l;
#pragma unroll
    for (int o = GB * R; o < MS_WARP; o <<= 1) ls += ms_shfl_xor(ls, o);
    if (lane % R == 0 && my_k == 0) wm[warp][my_g] = m, wl[warp][my_g] = ls;
#pragma unroll
    for (int g = 0; g < GB; g++)
#pragma unroll
        for (int j = 0; j < NCV; j++) wo[warp][g][lane + j * MS_WARP] = acc[g][j];
    __syncthreads();
    if (threadIdx.x < GB) {
        const int g = threadIdx.x;
        float M = -INFINITY, L = 0.0f;
        for (int w = 0; w < AD_WARPS; w++)
            if (wl[w][g] > 0) M = fmaxf(M, wm[w][g]);
        for (int w = 0; w < AD_WARPS; w++) {
            const float e = wl[w][g] > 0 ? expf(wm[w][g] - M) : 0.0f;
            ew[w][g] = e, L = fmaf(wl[w][g], e, L);
        }
        bM[g] = M, bL[g] = L; /* no keys: M -inf, L 0, and the output below 0 */
    }
    __syncthreads();
    const int64_t row0 = (int64_t)t * H + h0; /* head h0 + g of token t: row row0 + g */
    if (a.splits == 1) { /* the whole softmax here, sinks included */
        for (int it = threadIdx.x; it < gn * vd4; it += AD_THREADS) {
            const int g = it / vd4, c4 = it % vd4;
            float4 o = z4;
            for (int w = 0; w < AD_WARPS; w++) f4_fma(o, ew[w][g], wo[w][g][c4]);
            float M = bM[g], L = bL[g];
            if (a.sinks) {
                const float sk = a.sinks[h0 + g], Mf = fmaxf(M, sk), e = expf(M - Mf);
                L = fmaf(L, e, expf(sk - Mf)), f4_scale(o, e);
            }
            f4_scale(o, 1.0f / L);
            ((float4 *)a.out)[(row0 + g) * vd4 + c4] = o;
        }
        return;
    }
    for (int it = threadIdx.x; it < gn * vd4; it += AD_THREADS) {
        const int g = it / vd4, c4 = it % vd4;
        float4 o = z4;
        for (int w = 0; w < AD_WARPS; w++) f4_fma(o, ew[w][g], wo[w][g][c4]);
        ((float4 *)a.po)[((row0 + g) * a.splits + split) * vd4 + c4] = o;
    }
    if (threadIdx.x < gn) {
        float *d = a.pml + ((row0 + threadIdx.x) * a.splits + split) * 2;
        d[0] = bM[threadIdx.x], d[1] = bL[threadIdx.x];
    }
    if (!a.cnt) return;
    /* the last block of this (token, head group) to finish combines its splits */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int *ct = a.cnt + (int64_t)t * gridDim.x + blockIdx.x;
        last = atomicAdd(ct, 1) == a.splits - 1;
        if (last) *ct = 0; /* ready for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    ad_combine<GB>(a, t, h0, gn);
}

template <int GB> __global__ void __launch_bounds__(AD_THREADS) attn_dec_combine_kernel(ad_args a) {
    ms_pdl_launch();
    ms_pdl_wait(); /* the partials are the decode kernel's */
    const int G = a.c.n_heads / a.c.n_kv_heads, kvh = blockIdx.x / a.ngrp, grp = blockIdx.x % a.ngrp;
    const int gn = G - grp * GB < GB ? G - grp * GB : GB;
    ad_combine<GB>(a, blockIdx.y, kvh * G + grp * GB, gn);
}

/* float4 chunks per lane for a dim of d floats: 1, 2 or 4 (0: too wide) */
static int ad_chunks(int d) {
    int n = (d / 4 + MS_WARP - 1) / MS_WARP;
    return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 0;
}

template <int GB, int NC, int NCV> static void ad_launch(int pdl, dim3 grid, gpuStream_t st, const ad_args &a) {
    if (a.pro.inv) ms_launch(pdl, attn_dec_kernel<GB, NC, NCV, true>, grid, dim3(AD_THREADS), 0, st, a);
    else ms_launch(pdl, attn_dec_kernel<GB, NC, NCV, false>, grid, dim3(AD_THREADS), 0, st, a);
}

int ms_gpu_attn_dec(ms_gpu *g, float *out, const float *q, const float *k_cache, const float *v_cache,
                    const float *sinks, int n, int64_t pos0, const int64_t *pos_dev, const ms_gpu_attn_cfg *c,
                    float *scratch, const ms_gpu_qkv_pro *pro, ms_err *err) {
    const int hd = c->head_dim, vd = c->v_head_dim, G = c->n_heads / c->n_kv_heads;
    if (vd % 4 || ((uintptr_t)v_cache | (uintptr_t)out | (uintptr_t)scratch) % 16 || n > AD_MAXTOK) return -1;
    if (pro && (n != 1 || !pos_dev || !pro->inv || 2 * pro->half > hd)) return -1;
    int nc = ad_chunks(hd), ncv = ad_chunks(vd);
    if (!nc || !ncv) return -1;
    /* the instantiated chunk pairs: (1,1), (2,1), (2,2), (4,4); others take the next wider */
    if (nc == 1 && ncv == 2) nc = 2;
    if (nc == 4 || ncv == 4) nc = ncv = 4;
    if (ncv == 2) nc = 2;
    /* heads per block: all of the group (rounded up to a power of two; padded heads have q = 0 and
     * are not written) within the register budget GB (NC + NCV) <= 16 float4 */
    int cap = 1;
    while (cap * 2 * (nc + ncv) <= 16 && cap * 2 <= 8) cap *= 2;
    int gb = 1;
    while (gb < G && gb < cap) gb *= 2;
    const int ngrp = (G + gb - 1) / gb, kt = ad_kt(gb, nc, ncv);
    /* splits: a tile of the block's warps at least per split, enough blocks for ~8 per SM, at most
     * MS_GPU_ATTN_MAXS (or MS_GPU_ATTN_SPLITS, for A/B runs); sized by the key count (of the bound,
     * for a device position) */
    int64_t keys = pos0 + n;
    if (c->window > 0 && keys > c->window) keys = c->window;
    const int64_t bx = (int64_t)c->n_kv_heads * ngrp, blocks = bx * n, tile = (int64_t)AD_WARPS * kt;
    int64_t splits = (keys + tile - 1) / tile, want = (8 * (int64_t)g->prop.multiProcessorCount + blocks - 1) / blocks;
    if (splits > want) splits = want;
    if (splits > (g->attn_splits ? g->attn_splits : MS_GPU_ATTN_MAXS)) splits = g->attn_splits ? g->attn_splits : MS_GPU_ATTN_MAXS;
    if (splits < 1) splits = 1;
    if (bx > 65535) return -1;
    ad_args a;
    memset(&a, 0, sizeof a);
    a.out = out, a.q = q, a.K = k_cache, a.V = v_cache, a.sinks = sinks, a.pos_dev = pos_dev, a.pos0 = pos0;
    a.splits = (int)splits, a.ngrp = ngrp, a.c = *c;
    if (pro) a.pro = *pro;
    a.po = scratch, a.pml = scratch + (int64_t)n * c->n_heads * splits * vd;
    const int fold = splits > 1 && g->attn_mode == MS_GPU_ATTN_FOLD;
    if (fold && !(a.cnt = ms_gpu_counters(g, blocks, err))) return err ? err->code : MS_ERR_NOMEM;
    dim3 grid((unsigned)bx, (unsigned)n, (unsigned)splits);
#define AD_CASE(GBV, NCA, NCB) \
    if (gb == GBV && nc == NCA && ncv == NCB) ad_launch<GBV, NCA, NCB>(g->pdl_attn, grid, g->stream, a)
    AD_CASE(1, 1, 1); else AD_CASE(2, 1, 1); else AD_CASE(4, 1, 1); else AD_CASE(8, 1, 1);
    else AD_CASE(1, 2, 1); else AD_CASE(2, 2, 1); else AD_CASE(4, 2, 1);
    else AD_CASE(1, 2, 2); else AD_CASE(2, 2, 2); else AD_CASE(4, 2, 2);
    else AD_CASE(1, 4, 4); else AD_CASE(2, 4, 4);
    else return ms_fail(err, MS_ERR_UNSUPPORTED, "ms_gpu_attn_gqa: no decode kernel for %d heads x chunks %d / %d",
                        gb, nc, ncv);
#undef AD_CASE
    int rc = ms_gpu_launched(err, "attention (decode)");
    if (rc || splits == 1 || fold) return rc;
    dim3 cgrid((unsigned)bx, (unsigned)n);
    switch (gb) {
    case 1: ms_launch(g->pdl_attn, attn_dec_combine_kernel<1>, cgrid, dim3(AD_THREADS), 0, g->stream, a); break;
    case 2: ms_launch(g->pdl_attn, attn_dec_combine_kernel<2>, cgrid, dim3(AD_THREADS), 0, g->stream, a); break;
    case 4: ms_launch(g->pdl_attn, attn_dec_combine_kernel<4>, cgrid, dim3(AD_THREADS), 0, g->stream, a); break;
    default: ms_launch(g->pdl_attn, attn_dec_combine_kernel<8>, cgrid, dim3(AD_THREADS), 0, g->stream, a); break;
    }
    return ms_gpu_launched(err, "attention (decode combine)");
}
