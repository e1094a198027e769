/* route_warp.h — the one-warp router of one token, shared by ops.cu (ms_gpu_route) and
 * matmul.cu (the router matvec that routes in its last block). Include after gpu_internal.h. */
#ifndef MS_GPU_ROUTE_WARP_H
#define MS_GPU_ROUTE_WARP_H

#define RT_MAXE 1024
#define RT_MAXK 32

/* Is (v, i) a better top-k candidate than (bv, bi)? Larger wins, ties to the
 * lower index, NaN never (engine/moe.c topk). bi < 0: no candidate yet. */
static __device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    if (i < 0 || isnan(v)) return false;
    if (bi < 0) return true;
    return v > bv || (v == bv && i < bi);
}

/* Softmax, top-k softmax or sigmoid without groups (c.kind; E <= RT_MAXE, K <= RT_MAXK) of the
 * logits lg [E] into ids_out / w_out [K], by the lanes of the calling warp (threadIdx.x < MS_WARP;
 * the whole warp calls it). The scores live in shared memory (scores, choice [E], taken [E],
 * ids [K], the caller's); K rounds of a warp argmax by shuffles (larger wins, ties to the lower
 * index, NaN never; only NaN left: the lowest unused index, as ops.cu's block_topk), no block
 * barriers. The weights as ops.cu's route_kernel (sums in double, norm_topk, routed scale). */
static __device__ void route_warp_token(int32_t *ids_out, float *w_out, const float *lg, const float *bias,
                                        const ms_gpu_route_cfg &c, float *scores, float *choice,
                                        unsigned char *taken, int *ids) {
    const int E = c.n_experts, K = c.top_k, lane = threadIdx.x % MS_WARP;
    const float *sel = choice; /* the values the top-k ranks */
    if (c.kind == MS_GPU_ROUTER_SOFTMAX) {
        float m = -INFINITY;
        for (int i = lane; i < E; i += MS_WARP) m = fmaxf(m, lg[i]);
        m = ms_warp_max(m);
        float s = 0.0f;
        for (int i = lane; i < E; i += MS_WARP) s += (choice[i] = expf(lg[i] - m));
        float inv = 1.0f / ms_warp_sum(s);
        for (int i = lane; i < E; i += MS_WARP) scores[i] = choice[i] * inv, taken[i] = 0;
        sel = scores;
    } else if (c.kind == MS_GPU_ROUTER_TOPK_SOFTMAX) {
        for (int i = lane; i < E; i += MS_WARP) taken[i] = 0;
        sel = lg;
    } else {
        for (int i = lane; i < E; i += MS_WARP) {
            scores[i] = 1.0f / (1.0f + expf(-lg[i]));
            choice[i] = scores[i] + (bias ? bias[i] : 0.0f);
            taken[i] = 0;
        }
    }
    ms_syncwarp();
    for (int k = 0; k < K; k++) {
        float bv = 0.0f;
        int bi = -1;
        for (int i = lane; i < E; i += MS_WARP)
            if (!taken[i] && better(sel[i], i, bv, bi)) bv = sel[i], bi = i;
#pragma unroll
        for (int m = MS_WARP / 2; m > 0; m >>= 1) {
            float ov = ms_shfl_xor(bv, m);
            int oi = ms_shfl_xor_i(bi, m);
            if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        if (bi < 0) { /* only NaN left: the lowest unused index */
            int lo = E;
            for (int i = lane; i < E && lo == E; i += MS_WARP)
                if (!taken[i]) lo = i;
#pragma unroll
            for (int m = MS_WARP / 2; m > 0; m >>= 1) {
                int o = ms_shfl_xor_i(lo, m);
                lo = o < lo ? o : lo;
            }
            bi = lo < E ? lo : -1;
        }
        if (lane == 0) {
            ids[k] = bi;
            if (bi >= 0) taken[bi] = 1;
        }
        ms_syncwarp();
    }
    if (lane == 0) {
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
        for (int k = 0; k < K; k++) ids_out[k] = ids[k], w_out[k] = w[k];
    }
}

#endif
