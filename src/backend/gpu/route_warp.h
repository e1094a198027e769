/* route_warp.h — the router of one token: by one warp (ops.cu's ms_gpu_route) or by one block
 * (matmul.cu's router matvec, which routes in its last block). Include after gpu_internal.h. */
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

/* The values the top-k of route_warp_token ranks (c.kind's): the softmax scores, the logits
 * (top-k softmax) or sigmoid + bias, into scores / choice (shared memory) by the lanes of the
 * calling warp; returns the array ranked (choice, scores or lg). taken [E] is cleared. */
static __device__ inline const float *route_warp_scores(const float *lg, const float *bias, const ms_gpu_route_cfg &c,
                                                 float *scores, float *choice, unsigned char *taken) {
    const int E = c.n_experts, lane = threadIdx.x % MS_WARP;
    if (c.kind == MS_GPU_ROUTER_SOFTMAX) {
        float m = -INFINITY;
        for (int i = lane; i < E; i += MS_WARP) m = fmaxf(m, lg[i]);
        m = ms_warp_max(m);
        float s = 0.0f;
        for (int i = lane; i < E; i += MS_WARP) s += (choice[i] = expf(lg[i] - m));
        float inv = 1.0f / ms_warp_sum(s);
        for (int i = lane; i < E; i += MS_WARP) scores[i] = choice[i] * inv, taken[i] = 0;
        return scores;
    }
    if (c.kind == MS_GPU_ROUTER_TOPK_SOFTMAX) {
        for (int i = lane; i < E; i += MS_WARP) taken[i] = 0;
        return lg;
    }
    for (int i = lane; i < E; i += MS_WARP) {
        scores[i] = 1.0f / (1.0f + expf(-lg[i]));
        choice[i] = scores[i] + (bias ? bias[i] : 0.0f);
        taken[i] = 0;
    }
    return choice;
}

/* The route weights of the chosen ids [K] into w_out (and the ids into ids_out), by one thread:
 * top-k softmax over the chosen logits, or the chosen scores (sums in double, norm_topk, routed
 * scale), as ops.cu's route_kernel. */
static __device__ inline void route_weights(int32_t *ids_out, float *w_out, const float *lg, const float *scores,
                                     const ms_gpu_route_cfg &c, const int *ids) {
    const int K = c.top_k;
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

/* Softmax, top-k softmax or sigmoid without groups (c.kind; E <= RT_MAXE, K <= RT_MAXK) of the
 * logits lg [E] into ids_out / w_out [K], by the lanes of the calling warp (threadIdx.x < MS_WARP;
 * the whole warp calls it). The scores live in shared memory (scores, choice [E], taken [E],
 * ids [K], the caller's); K rounds of a warp argmax by shuffles (larger wins, ties to the lower
 * index, NaN never; only NaN left: the lowest unused index, as ops.cu's block_topk), no block
 * barriers. The weights as ops.cu's route_kernel (sums in double, norm_topk, routed scale). */
static __device__ inline void route_warp_token(int32_t *ids_out, float *w_out, const float *lg, const float *bias,
                                        const ms_gpu_route_cfg &c, float *scores, float *choice,
                                        unsigned char *taken, int *ids) {
    const int E = c.n_experts, K = c.top_k, lane = threadIdx.x % MS_WARP;
    const float *sel = route_warp_scores(lg, bias, c, scores, choice, taken); /* the values the top-k ranks */
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
    if (lane == 0) route_weights(ids_out, w_out, lg, scores, c, ids);
}

/* The same routing of one token by every thread of a block (all call it; the block's
 * barriers): the scores by its first warp (route_warp_scores), then the top-k by ranks: each
 * expert counts the experts ranked before it in route_warp_token's order (larger first, ties to
 * the lower index; NaN after every number, among themselves by index), the expert of rank
 * r < K is the r-th choice, so the ids are route_warp_token's, in one pass over the E values
 * per expert instead of K dependent rounds; the weights by thread 0 (route_weights). */
static __device__ inline void route_block_token(int32_t *ids_out, float *w_out, const float *lg, const float *bias,
                                         const ms_gpu_route_cfg &c, float *scores, float *choice,
                                         unsigned char *taken, int *ids) {
    const int E = c.n_experts, K = c.top_k;
    __shared__ const float *sel_sh;
    if (threadIdx.x < MS_WARP) {
        const float *sel = route_warp_scores(lg, bias, c, scores, choice, taken);
        if (threadIdx.x == 0) sel_sh = sel;
    }
    __syncthreads();
    const float *sel = sel_sh;
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        float v = sel[i];
        int rank = 0;
        if (isnan(v)) {
            for (int j = 0; j < E; j++) rank += !isnan(sel[j]) || j < i;
        } else {
            for (int j = 0; j < E && rank < K; j++) rank += better(sel[j], j, v, i);
        }
        if (rank < K) ids[rank] = i;
    }
    __syncthreads();
    if (threadIdx.x == 0) route_weights(ids_out, w_out, lg, scores, c, ids);
}

/* route_block_ranked's split of the rank count: P lanes per expert (a power of two <= MS_WARP,
 * P E <= the block's T threads; 1 when E > T / 2), each over seg values (a multiple of 4); the
 * ranked arrays hold epad = seg P values, those past E NaN (route_rank_pad). */
static __device__ __forceinline__ int route_rank_lanes(int E, int T) {
    int P = 1;
    while (P < MS_WARP && 2 * P * E <= T) P *= 2;
    return P;
}
static __device__ __forceinline__ int route_rank_seg(int E, int P) { return ((E + P - 1) / P + 3) & ~3; }
/* The padded length of the arrays route_block_ranked ranks: seg P, at most E + 4 P when P > 1
 * (then 4 E <= T), E rounded up to 4 when P = 1; so <= RT_MAXE for E <= RT_MAXE, T <= 1024. */
static __device__ __forceinline__ int route_rank_pad(int E, int T) {
    const int P = route_rank_lanes(E, T);
    return route_rank_seg(E, P) * P;
}

/* How many of the values sel [j0, j0 + seg) rank before expert i (value v = sel[i]) in
 * route_warp_token's order: larger first, ties to the lower index, NaN after every number and
 * among themselves by index (so a NaN pad past E never counts); exact while under K, else some
 * count >= K (the scan stops there). 16-byte shared loads, all lanes of a warp reading the same
 * address (a broadcast), 16 values between the stop tests. */
static __device__ __forceinline__ int route_rank_count(const float *sel, int i, int j0, int seg, int K) {
    const float v = sel[i];
    const float4 *p = (const float4 *)(sel + j0);
    const int n4 = seg / 4;
    int cnt = 0;
    if (!isnan(v)) {
        for (int q = 0; q < n4 && cnt < K; q += 4) {
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (q + u < n4) {
                    const float4 s = p[q + u];
                    const int j = j0 + 4 * (q + u);
                    cnt += (int)(s.x > v || (s.x == v && j < i)) + (int)(s.y > v || (s.y == v && j + 1 < i)) +
                           (int)(s.z > v || (s.z == v && j + 2 < i)) + (int)(s.w > v || (s.w == v && j + 3 < i));
                }
            }
        }
    } else {
        for (int q = 0; q < n4 && cnt < K; q++) {
            const float4 s = p[q];
            const int j = j0 + 4 * q;
            cnt += (int)(!isnan(s.x) || j < i) + (int)(!isnan(s.y) || j + 1 < i) + (int)(!isnan(s.z) || j + 2 < i) +
                   (int)(!isnan(s.w) || j + 3 < i);
        }
    }
    return cnt;
}

/* route_block_token's contract (the same ids and weights) with the ranks counted by P lanes per
 * expert (route_rank_lanes) in 16-byte shared loads and their counts summed by shuffles. The
 * caller has padded lg, scores and choice (16-byte aligned, shared) with NaN from E up to
 * route_rank_pad(E, blockDim.x) and synchronized the block. Every thread of the block calls it. */
static __device__ inline void route_block_ranked(int32_t *ids_out, float *w_out, const float *lg, const float *bias,
                                                 const ms_gpu_route_cfg &c, float *scores, float *choice,
                                                 unsigned char *taken, int *ids) {
    const int E = c.n_experts, K = c.top_k, T = (int)blockDim.x;
    __shared__ const float *rsel_sh;
    if (threadIdx.x < MS_WARP) {
        const float *sel = route_warp_scores(lg, bias, c, scores, choice, taken);
        if (threadIdx.x == 0) rsel_sh = sel;
    }
    __syncthreads();
    const float *sel = rsel_sh;
    const int P = route_rank_lanes(E, T), seg = route_rank_seg(E, P);
    if (P > 1) { /* one expert per P lanes (P E <= T): every lane joins the shuffles */
        const int i = (int)threadIdx.x / P, part = (int)threadIdx.x % P;
        int cnt = i < E ? route_rank_count(sel, i, part * seg, seg, K) : 0;
        for (int m = 1; m < P; m <<= 1) cnt += ms_shfl_xor_i(cnt, m);
        if (i < E && part == 0 && cnt < K) ids[cnt] = i;
    } else {
        for (int i = threadIdx.x; i < E; i += T) {
            int cnt = route_rank_count(sel, i, 0, seg, K);
            if (cnt < K) ids[cnt] = i;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) route_weights(ids_out, w_out, lg, scores, c, ids);
}

#endif
