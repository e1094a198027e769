/* matmul_routed.cu — the routed experts of one decode token on the device (ms_gpu_moe_routed,
 * contract in gpu.h): the fused path of two launches (a gate + up kernel writing the activated
 * h, a down kernel summing the K slots in ascending expert id) over matmul.cu's vector-kernel
 * decode (matmul_internal.h), else four launches on matmul.cu's mm_run. */
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/matmul_internal.h"

/* MS_GPU_QX=old (read once; A/B measurements): the routed-expert kernels keep 4 warps per
 * block even when a row has fewer 16-byte chunks than threads (the earlier launch shape). */
static int qx_old(void) {
    static int old = -1;
    if (old < 0) {
        const char *e = getenv("MS_GPU_QX");
        old = e && !strcmp(e, "old");
    }
    return old;
}

/* ------------------------------------------------------------ routed experts (decode) */

/* G [K, 2I] (gate | up rows per slot, or the fused interleaved rows) -> H [K, I]:
 * biases of tab[ids[j]] added, then the gated activation as the backend's glu op. */
__global__ void rx_act_kernel(const ms_gpu_ex_ptrs *tab, const int32_t *ids, const float *G, float *H, int64_t I,
                              int fused, int bias_dt, ms_gpu_glu_params p) {
    int j = blockIdx.y;
    const ms_gpu_ex_ptrs &e = tab[ids[j]];
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < I; i += (int64_t)gridDim.x * blockDim.x) {
        float x, y;
        if (fused) {
            x = G[j * 2 * I + 2 * i] + ms_bias_at(e.bias[0], bias_dt, 2 * i);
            y = G[j * 2 * I + 2 * i + 1] + ms_bias_at(e.bias[0], bias_dt, 2 * i + 1);
        } else {
            x = G[j * 2 * I + i] + ms_bias_at(e.bias[0], bias_dt, i);
            y = G[j * 2 * I + I + i] + ms_bias_at(e.bias[1], bias_dt, i);
        }
        H[j * I + i] = ms_glu_apply(x, y, p);
    }
}

/* acc[d] = sum_j w[j] (Y[j, d] + bias_j[d]) over the K slots in ascending expert id. */
__global__ void rx_sum_kernel(const ms_gpu_ex_ptrs *tab, const int32_t *ids, const float *w, const float *Y,
                              float *acc, int K, int64_t D, int bias_dt) {
    __shared__ int ord[32];
    if (threadIdx.x == 0) {
        for (int j = 0; j < K; j++) ord[j] = j;
        for (int j = 1; j < K; j++) /* insertion sort by id (K <= 32) */
            for (int k = j; k > 0 && ids[ord[k]] < ids[ord[k - 1]]; k--) {
                int t = ord[k];
                ord[k] = ord[k - 1], ord[k - 1] = t;
            }
    }
    __syncthreads();
    for (int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; d < D; d += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < K; k++) {
            int j = ord[k];
            const void *b = tab[ids[j]].bias[2];
            s += w[j] * (b ? Y[j * D + d] + ms_bias_at(b, bias_dt, d) : Y[j * D + d]);
        }
        acc[d] = s;
    }
}

extern "C" size_t ms_gpu_moe_routed_scratch_floats(int K, int64_t inter, int64_t hidden) {
    return (size_t)K * (size_t)(3 * inter + hidden) + 64;
}

/* The fused routed path (two launches): rx_gu_kernel computes, for slot j and inter
 * rows i0, i0 + 1, the gate and up dot products over x in one block (its four "rows":
 * gate i0, up i0, gate i0+1, up i0+1, or the fused interleaved rows 2 i0 .. 2 i0 + 3),
 * adds the biases, applies the activation and writes H[j, i] = w[j] act(g, u); then
 * rx_down_kernel's block owns MM_R output rows d and reads the down rows of all K
 * slots as one virtual row of K I columns against H (slots in ascending expert id:
 * deterministic, no atomics): acc[d] = sum over slots and columns + sum_j w[j] b_j[d].
 * Layouts as the vector kernel requires (mm_run's vec_ok), else the four-launch path. */
typedef struct rx_args {
    const ms_gpu_ex_ptrs *tab;
    const int32_t *ids;
    const float *w, *x;
    float *h, *acc;
    int64_t I, D, cols, scols; /* cols: the kernel's row width (D for gate/up, I for down) */
    int K, brow, bshift, scale_dt, fused, bias_dt;
    int early; /* MS_GPU_RX=early (rx_gu_kernel + rx_downp_kernel): gate + up lets down launch after its
                * own wait, down reads the ids and issues its first loads before its wait (rx_down_slots) */
    ms_gpu_glu_params p;
} rx_args;


/* The gate + up kernels' epilogue for inter row i of slot j (o = 0, 1: the first or second row
 * of its quad): the gate and up sums over the block's warps (red[w][2 o], red[w][2 o + 1], warp
 * 0 first), the biases of expert e, then h[j, i] = w[j] act(gate, up). */
static __device__ __forceinline__ void rx_gu_out(const rx_args &a, const ms_gpu_ex_ptrs &e, int j, int64_t i,
                                                 const float (*red)[MM_R], int o) {
    float gt = 0.0f, up = 0.0f;
    for (int w = 0; w < (int)(blockDim.x / MS_WARP); w++) gt += red[w][2 * o], up += red[w][2 * o + 1];
    if (a.fused) {
        gt += ms_bias_at(e.bias[0], a.bias_dt, 2 * i);
        up += ms_bias_at(e.bias[0], a.bias_dt, 2 * i + 1);
    } else {
        gt += ms_bias_at(e.bias[0], a.bias_dt, i);
        up += ms_bias_at(e.bias[1], a.bias_dt, i);
    }
    a.h[j * a.I + i] = a.w[j] * ms_glu_apply(gt, up, a.p);
}

/* The down kernels' epilogue for output row d: the block's warp sums (red[w][r], warp 0 first),
 * then the K slots' down biases in ascending expert id (ord: the slot of each rank), into acc[d]. */
static __device__ __forceinline__ void rx_down_out(const rx_args &a, const int (&ord)[32], int64_t d,
                                                   const float (*red)[MM_R], int r) {
    float v = 0.0f;
    for (int w = 0; w < MM_WARPS; w++) v += red[w][r];
    for (int q = 0; q < a.K; q++) { /* down biases, ascending expert id */
        const void *b = a.tab[a.ids[ord[q]]].bias[2];
        if (b) v = fmaf(a.w[ord[q]], ms_bias_at(b, a.bias_dt, d), v);
    }
    a.acc[d] = v;
}

template <int DT>
__global__ void __launch_bounds__(MM_WARPS *MS_WARP) rx_gu_kernel(const rx_args a) {
    typedef mm_traits<DT> T;
    const int VEC = T::VEC, U = 2;
    const int STEP = (int)blockDim.x; /* 1 to MM_WARPS warps (rx_warps) */
    const int j = blockIdx.y;
    const int64_t i0 = (int64_t)blockIdx.x * 2;
    if (!a.early) ms_pdl_launch();
    ms_pdl_wait(); /* the ids, weights and x are earlier kernels' output */
    if (a.early) ms_pdl_launch(); /* after the wait: the down kernel reads the ids before its own */
    const ms_gpu_ex_ptrs &e = a.tab[a.ids[j]];
    const int64_t nch = a.cols / VEC, rowbytes = a.cols * (128 / VEC) / 8;
    const uint4 *wr[MM_R];
    const uint8_t *sp[MM_R], *zp[MM_R];
    int64_t srow[MM_R], zrow[MM_R];
    int zsh[MM_R];
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        int64_t i = i0 + r / 2 < a.I ? i0 + r / 2 : a.I - 1; /* clamp: duplicate reads, result dropped */
        int kind = r % 2, m = a.fused ? 0 : kind;
        int64_t row = a.fused ? 2 * i + kind : i;
        wr[r] = (const uint4 *)((const uint8_t *)e.w[m] + row * rowbytes);
        sp[r] = (const uint8_t *)e.s[m];
        srow[r] = (row / a.brow) * a.scols;
        zp[r] = (const uint8_t *)e.z[m];
        i4_zrow(row, a.scols, &zrow[r], &zsh[r]);
    }
    float acc[MM_R] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t k0 = threadIdx.x; k0 < nch; k0 += U * STEP) {
        uint4 raw[U][MM_R];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < MM_R; r++) {
                int64_t k = k0 + u * STEP;
                raw[u][r] = k < nch ? ms_load_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int64_t k = k0 + u * STEP;
            if (k < nch)
                rx_chunk<DT>(raw[u], a.x + k * VEC, sp, srow, (int)(k * VEC), a.scale_dt, a.bshift, acc, zp, zrow, zsh);
        }
    }
    __shared__ float red[MM_WARPS][MM_R];
    rx_block_reduce(acc, red);
    if (threadIdx.x < 2 && i0 + threadIdx.x < a.I) rx_gu_out(a, e, j, i0 + threadIdx.x, red, threadIdx.x);
}

/* ---- one item of the look-ahead down kernel: a 16-byte chunk of a block's 4 rows with
 * their scale bits and INT4 zero words, loaded ahead of its decode (rx_use). */
typedef struct rx_item {
    uint4 raw[MM_R];
    uint32_t sb[MM_R]; /* scale bits (load_scale_bits) */
    uint32_t zw[2];    /* INT4: the zero words of matrix 0 (gate or fused) and 1 (up); 8 << zsh when symmetric */
    int zsh;           /* INT4: row 0's nibble shift (the quad's rows are consecutive in one word) */
} rx_item;

/* The raw bits of scale i (F32, BF16, F16, E8M0): the load without the conversion, so that a
 * prefetch does not wait on it; scale_of_bits converts them as load_scale would. */
static __device__ __forceinline__ uint32_t load_scale_bits(const uint8_t *s, int dt, int64_t i) {
    if (dt == SC_F32) return ((const uint32_t *)s)[i];
    if (dt == SC_BF16 || dt == SC_F16) return ((const uint16_t *)s)[i];
    if (dt == SC_E8M0) return s[i];
    return 0;
}
static __device__ __forceinline__ float scale_of_bits(uint32_t b, int dt) {
    if (dt == SC_F32) return __uint_as_float(b);
    if (dt == SC_BF16) return ms_bf16_to_f32_dev(b);
    if (dt == SC_E8M0) return ms_e8m0_to_f32_dev(b);
    if (dt == SC_F16) return ms_f16_to_f32_dev(b);
    return 1.0f;
}

/* acc[r] += item it's share of row r against x at column c0 (rows 0..3 of a quad: fused, or gate
 * and up of two inter rows): rx_chunk's products and order, the scale and zero point from it. */
template <int DT>
static __device__ __forceinline__ void rx_use(const rx_item &it, const float *xp, int scale_dt, int fused,
                                              float (&acc)[MM_R]) {
    typedef mm_traits<DT> T;
    const int SUB = T::SUB, NSUB = T::VEC / T::SUB;
    const bool SCALED = DT == DT_FP8 || DT == DT_F4 || DT == DT_FP8_CVT || DT == DT_I4;
    float off[MM_R], part[MM_R];
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        int sh = it.zsh + 4 * (fused ? r : r / 2);
        uint32_t zw = fused || r % 2 == 0 ? it.zw[0] : it.zw[1];
        off[r] = DT == DT_I4 ? -(8388608.0f + (float)((zw >> sh) & 15u)) : 0.0f;
        part[r] = 0.0f;
    }
#pragma unroll
    for (int s = 0; s < NSUB; s++) {
        float xv[SUB];
        const float4 *x4 = (const float4 *)(xp + s * SUB);
#pragma unroll
        for (int i = 0; i < SUB / 4; i++) {
            float4 v = x4[i];
            xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
        }
#pragma unroll
        for (int r = 0; r < MM_R; r++) {
            float wv[SUB];
            decode<DT>(it.raw[r], s, wv, off[r]);
#pragma unroll
            for (int i = 0; i < SUB; i++) {
                if (SCALED) part[r] = fmaf(wv[i], xv[i], part[r]);
                else acc[r] = fmaf(wv[i], xv[i], acc[r]);
            }
        }
    }
    if (SCALED) {
#pragma unroll
        for (int r = 0; r < MM_R; r++) {
            float sc = kernel_scale<DT>();
            if (scale_dt != SC_NONE) sc *= scale_of_bits(it.sb[r], scale_dt);
            acc[r] = fmaf(sc, part[r], acc[r]);
        }
    }
}

/* An id the router (two kernels back) wrote, read through L2 (no L1 line of an earlier layer's). */
static __device__ __forceinline__ int rx_id_cg(const int32_t *p) {
#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP)
    return *(const volatile int32_t *)p;
#else
    return __ldcg(p);
#endif
}

/* The start of the down kernels (rx_down_kernel, rx_downp_kernel): the
 * dependent-launch trigger and wait, then the K slots in ascending expert id into the block's
 * shared arrays: ord[rank] the slot of that rank, sw / ss / sz its down weights, scales and zero
 * points. a.early (rx_downp_kernel): no wait here, the caller waits before it reads h. That
 * reads the ids before this kernel's wait, which is safe because the gate + up kernel (the
 * previous one) triggers this launch only after its own wait: once every gate + up block has
 * triggered, the router that wrote the ids has completed and its writes are in L2 (read past L1). */
static __device__ __forceinline__ void rx_down_slots(const rx_args &a, int (&ord)[32], const uint8_t *(&sw)[32],
                                                     const uint8_t *(&ss)[32], const uint8_t *(&sz)[32]) {
    const int K = a.K;
    ms_pdl_launch();
    if (!a.early) ms_pdl_wait(); /* the ids, weights and h are earlier kernels' output */
    if (threadIdx.x < K) { /* slot of rank r in ascending expert id (ids of one token are distinct) */
        int id = rx_id_cg(a.ids + threadIdx.x), rank = 0;
        for (int q = 0; q < K; q++) {
            int iq = rx_id_cg(a.ids + q);
            rank += iq < id || (iq == id && q < (int)threadIdx.x);
        }
        ord[rank] = threadIdx.x;
        sw[rank] = (const uint8_t *)a.tab[id].w[2];
        ss[rank] = (const uint8_t *)a.tab[id].s[2];
        sz[rank] = (const uint8_t *)a.tab[id].z[2];
    }
    __syncthreads();
}

template <int DT>
__global__ void __launch_bounds__(MM_WARPS *MS_WARP) rx_down_kernel(const rx_args a) {
    typedef mm_traits<DT> T;
    const int VEC = T::VEC, STEP = MM_WARPS * MS_WARP, U = 2;
    __shared__ int ord[32];
    __shared__ const uint8_t *sw[32], *ss[32], *sz[32];
    const int K = a.K;
    rx_down_slots(a, ord, sw, ss, sz);
    const int64_t d0 = (int64_t)blockIdx.x * MM_R;
    const int64_t nch = a.cols / VEC, rowbytes = a.cols * (128 / VEC) / 8, total = (int64_t)K * nch;
    int64_t roff[MM_R], srow[MM_R], zrow[MM_R];
    int zsh[MM_R];
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        int64_t d = d0 + r < a.D ? d0 + r : a.D - 1;
        roff[r] = d * rowbytes;
        srow[r] = (d / a.brow) * a.scols;
        i4_zrow(d, a.scols, &zrow[r], &zsh[r]);
    }
    float acc[MM_R] = {0.0f, 0.0f, 0.0f, 0.0f};
    /* the lane's position in the virtual row: slot s, chunk c (k = s nch + c), advanced by STEP */
    int s = (int)(threadIdx.x / nch);
    int64_t c = threadIdx.x - (int64_t)s * nch;
    for (int64_t k0 = threadIdx.x; k0 < total; k0 += U * STEP) {
        uint4 raw[U][MM_R];
        int su[U];
        int64_t cu[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            su[u] = s, cu[u] = c;
            bool live = k0 + u * STEP < total;
#pragma unroll
            for (int r = 0; r < MM_R; r++)
                raw[u][r] = live ? ms_load_stream16((const uint4 *)(sw[s] + roff[r]) + c) : make_uint4(0, 0, 0, 0);
            c += STEP;
            while (c >= nch && s < K) c -= nch, s++;
            if (s >= K) s = K - 1, c = 0; /* past the end: the loads above are guarded by live */
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (k0 + u * STEP >= total) continue;
            const uint8_t *sp[MM_R], *zp[MM_R];
#pragma unroll
            for (int r = 0; r < MM_R; r++) sp[r] = ss[su[u]], zp[r] = sz[su[u]];
            rx_chunk<DT>(raw[u], a.x + (int64_t)ord[su[u]] * a.I + cu[u] * VEC, sp, srow, (int)(cu[u] * VEC),
                         a.scale_dt, a.bshift, acc, zp, zrow, zsh);
        }
    }
    __shared__ float red[MM_WARPS][MM_R];
    rx_block_reduce(acc, red);
    if (threadIdx.x < MM_R && d0 + threadIdx.x < a.D) rx_down_out(a, ord, d0 + threadIdx.x, red, threadIdx.x);
}

/* ---- the down kernel with one item loaded ahead (rx_downp_kernel): rx_down_kernel's virtual row
 * (slot s of rank s in ascending expert id, chunk c), the same chunks per thread in the same
 * order and the same products, so the same bits; the next item's loads (weights, scale bits,
 * the zero word: rows d0 .. d0 + 3 of one group of 8) are issued before the current item is
 * decoded, and its x offset travels with it. MS_GPU_RX=old keeps rx_down_kernel. */
template <int DT>
static __device__ __forceinline__ void rx_dfetch(const rx_args &a, const uint8_t *w, const uint8_t *sc, const uint8_t *z,
                                                 int slot, const int64_t (&roff)[MM_R], const int (&srow)[MM_R],
                                                 int zrow, int64_t c, int VEC, rx_item &it, int64_t &xo) {
    const int64_t g = (c * VEC) >> a.bshift;
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        it.raw[r] = ms_load_stream16((const uint4 *)(w + roff[r]) + c);
        it.sb[r] = a.scale_dt != SC_NONE ? load_scale_bits(sc, a.scale_dt, srow[r] + g) : 0u;
    }
    if (DT == DT_I4) it.zw[0] = z ? ((const uint32_t *)z)[zrow + g] : 0x88888888u;
    xo = (int64_t)slot * a.I + c * VEC;
}

template <int DT>
__global__ void __launch_bounds__(MM_WARPS *MS_WARP) rx_downp_kernel(const rx_args a) {
    typedef mm_traits<DT> T;
    const int VEC = T::VEC, STEP = MM_WARPS * MS_WARP;
    __shared__ int ord[32];
    __shared__ const uint8_t *sw[32], *ss[32], *sz[32];
    const int K = a.K;
    rx_down_slots(a, ord, sw, ss, sz);
    const int64_t d0 = (int64_t)blockIdx.x * MM_R;
    const int64_t nch = a.cols / VEC, rowbytes = a.cols * (128 / VEC) / 8, total = (int64_t)K * nch;
    int64_t roff[MM_R];
    int srow[MM_R];
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        int64_t d = d0 + r < a.D ? d0 + r : a.D - 1;
        roff[r] = d * rowbytes;
        srow[r] = (int)((d / a.brow) * a.scols);
    }
    int64_t zr;
    rx_item nx;
    i4_zrow(d0, a.scols, &zr, &nx.zsh); /* rows d0 .. d0 + 3: one zero word, shifts zsh + 4 r */
    const int zrow = (int)zr;
    float acc[MM_R] = {0.0f, 0.0f, 0.0f, 0.0f};
    int s = (int)(threadIdx.x / nch);
    int64_t c = threadIdx.x - (int64_t)s * nch, xn = 0;
    if ((int64_t)threadIdx.x < total) rx_dfetch<DT>(a, sw[s], ss[s], sz[s], ord[s], roff, srow, zrow, c, VEC, nx, xn);
    if (a.early) ms_pdl_wait(); /* h and the route weights are the gate + up kernel's */
    for (int64_t k = threadIdx.x; k < total; k += STEP) {
        rx_item cur = nx;
        int64_t xo = xn;
        c += STEP;
        while (c >= nch && s < K) c -= nch, s++;
        if (k + STEP < total) rx_dfetch<DT>(a, sw[s], ss[s], sz[s], ord[s], roff, srow, zrow, c, VEC, nx, xn);
        rx_use<DT>(cur, a.x + xo, a.scale_dt, 1, acc);
    }
    __shared__ float red[MM_WARPS][MM_R];
    rx_block_reduce(acc, red);
    if (threadIdx.x < MM_R && d0 + threadIdx.x < a.D) rx_down_out(a, ord, d0 + threadIdx.x, red, threadIdx.x);
}

/* Warps per block of the gate + up kernel over rows of nch 16-byte chunks: enough for one
 * chunk per lane, at most MM_WARPS (MXFP4 rows of 2048 columns have 64 chunks: two warps,
 * not four with half the lanes idle); MS_GPU_QX=old: always MM_WARPS. */
static int rx_warps(int64_t nch) {
    int64_t w = (nch + MS_WARP - 1) / MS_WARP;
    return qx_old() || w > MM_WARPS ? MM_WARPS : w < 1 ? 1 : (int)w;
}

/* The two launches by ms_gpu.rx_mode (MS_GPU_RX at open; A/B measurements). Default: rx_gu_kernel
 * for gate + up, and for down rx_downp_kernel (FP8, MXFP4, INT4; Kimi K2 shape INT4 134 us vs 146
 * with rx_down_kernel) or rx_down_kernel (F32, F16, BF16). old: rx_gu_kernel and rx_down_kernel.
 * early (FP8, MXFP4, INT4): the default pair with rx_downp_kernel's ids, ranks and first item
 * loaded before it waits for gate + up (a.early; F32 / F16 / BF16: the default). */
template <int DT>
static void launch_rx(ms_gpu *g, const rx_args &gu, const rx_args &dn) {
    gpuStream_t st = g->stream;
    int pdl = g->pdl;
    typedef mm_traits<DT> T;
    dim3 block(MM_WARPS * MS_WARP);
    dim3 gblock(rx_warps(gu.cols / T::VEC) * MS_WARP);
    constexpr bool narrow = DT == DT_FP8 || DT == DT_FP8_CVT || DT == DT_F4 || DT == DT_I4;
    const dim3 dgrid((unsigned)((dn.D + MM_R - 1) / MM_R)), ggrid((unsigned)((gu.I + 1) / 2), (unsigned)gu.K);
    if constexpr (narrow) {
        if (g->rx_mode != MS_GPU_RX_OLD) {
            rx_args gue = gu, dne = dn;
            gue.early = dne.early = g->rx_mode == MS_GPU_RX_EARLY;
            ms_launch(pdl, rx_gu_kernel<DT>, ggrid, gblock, 0, st, gue);
            ms_launch(pdl, rx_downp_kernel<DT>, dgrid, block, 0, st, dne);
            return;
        }
    }
    ms_launch(pdl, rx_gu_kernel<DT>, ggrid, gblock, 0, st, gu);
    ms_launch(pdl, rx_down_kernel<DT>, dgrid, block, 0, st, dn);
}

static void rx_layout(rx_args &a, const ms_qmat *w) {
    mm_args m;
    memset(&m, 0, sizeof m);
    mm_layout(m, w, 1, 0);
    a.cols = m.cols, a.scols = m.scols, a.brow = m.brow, a.bshift = m.bshift, a.scale_dt = m.scale_dt;
}

extern "C" int ms_gpu_moe_routed(ms_gpu *g, float *acc, const float *x, int K, const int32_t *ids, const float *w,
                                 const ms_gpu_ex_ptrs *tab, const ms_qmat *gate, const ms_qmat *down, int fused,
                                 int bias_dt, const ms_gpu_glu_params *p, float *scratch, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (K < 1 || K > 32) return ms_fail(err, MS_ERR_LIMIT, "ms_gpu_moe_routed: %d experts per token (1..32)", K);
    int64_t I = down->cols, D = down->rows;
    float *G = scratch, *H = G + (int64_t)K * 2 * I, *Y = H + (int64_t)K * I;
    int rc;
    if (!(g->legacy & MS_GPU_LEG_EXPERTS) && (uintptr_t)x % 16 == 0 && vec_layout_ok(gate) && vec_layout_ok(down)) {
        rx_args gu;
        memset(&gu, 0, sizeof gu);
        gu.tab = tab, gu.ids = ids, gu.w = w, gu.x = x, gu.h = H, gu.acc = acc, gu.I = I, gu.D = D, gu.K = K;
        gu.fused = fused, gu.bias_dt = bias_dt, gu.p = *p;
        rx_args dn = gu;
        dn.x = H;
        rx_layout(gu, gate), rx_layout(dn, down);
        switch (kernel_dtype(gate->dtype) * 8 + kernel_dtype(down->dtype)) {
#define RX_CASE(DT, LDT) case DT * 8 + DT: launch_rx<LDT>(g, gu, dn); break
        RX_CASE(DT_F32, DT_F32);
        RX_CASE(DT_F16, DT_F16);
        RX_CASE(DT_BF16, DT_BF16);
        case DT_FP8 * 8 + DT_FP8:
            if (fp8_decode_mode()) launch_rx<DT_FP8>(g, gu, dn);
            else launch_rx<DT_FP8_CVT>(g, gu, dn);
            break;
        RX_CASE(DT_F4, DT_F4);
        RX_CASE(DT_I4, DT_I4);
#undef RX_CASE
        default: goto unfused; /* gate and down of different dtypes */
        }
        return ms_gpu_launched(err, "routed experts (fused)");
    }
unfused:;
    mm_args a;
    memset(&a, 0, sizeof a);
    mm_layout(a, gate, 1, 0);
    a.tab = tab, a.ids = ids, a.per = fused ? 1 : 2, a.sel0 = 0;
    a.xb = x, a.xjs = 0, a.yb = G, a.yjs = 2 * I, a.ywh = I;
    int aligned = (uintptr_t)x % 16 == 0; /* placed weights are 256-byte aligned */
    if ((rc = mm_run(g, gate, a, K * a.per, aligned, 0, err))) return rc;
    dim3 ga((unsigned)((I + 255) / 256), (unsigned)K);
    rx_act_kernel<<<ga, 256, 0, g->stream>>>(tab, ids, G, H, I, fused, bias_dt, *p);
    if ((rc = ms_gpu_launched(err, "routed experts' activation"))) return rc;
    memset(&a, 0, sizeof a);
    mm_layout(a, down, 1, 0);
    a.tab = tab, a.ids = ids, a.per = 1, a.sel0 = 2;
    a.xb = H, a.xjs = I, a.yb = Y, a.yjs = D, a.ywh = 0;
    if ((rc = mm_run(g, down, a, K, (I * 4) % 16 == 0, 0, err))) return rc;
    rx_sum_kernel<<<(unsigned)((D + 255) / 256), 256, 0, g->stream>>>(tab, ids, w, Y, acc, K, D, bias_dt);
    return ms_gpu_launched(err, "routed experts' weighted sum");
}

