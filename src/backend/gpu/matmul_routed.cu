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
    int early; /* MS_GPU_RX=early (rx_gu_kernel + rx_downp_kernel) and tmae (the staged kernels): gate +
                * up lets down launch after its own wait, down reads the ids and issues its first loads
                * or its copies before its wait (rx_down_slots) */
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

/* ---- one item of the look-ahead and staged kernels: a 16-byte chunk of a block's 4 rows with
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

/* The start of the down kernels (rx_down_kernel, rx_downp_kernel, rx_downt_kernel): the
 * dependent-launch trigger and wait, then the K slots in ascending expert id into the block's
 * shared arrays: ord[rank] the slot of that rank, sw / ss / sz its down weights, scales and zero
 * points. a.early (rx_downp_kernel, rx_downt_kernel): no wait here, the caller waits before it
 * reads h. That
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
 * decoded, and its x offset travels with it. MS_GPU_RX=old or olddown keeps rx_down_kernel. */
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

/* ---- the staged kernels (MS_GPU_RX=tma, sm_90 CUDA builds): a block's weight bytes are copied
 * into shared memory by bulk asynchronous copies (cp.async.bulk, completion on one mbarrier)
 * issued right after the ids -> table chain, so a block has all of them in flight at once with
 * no register cost (up to 48 KB a block, 4-6 blocks an SM: the Qwen3-30B shape's 25 MB of FP8
 * gate + up rows in one wave of blocks); the scale bits and INT4 zero words are loaded into
 * registers while the copies fly, x after. Each thread then decodes the same chunks in the same
 * order with the same products and sums as rx_gu_kernel and rx_downp_kernel / rx_down_kernel:
 * the same bits. */
#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP)
#define RX_TMA 0
#else
#define RX_TMA 1
#endif
#define RX_TMA_GU_MAX (44 * 1024) /* dynamic shared bytes of a staged gate + up block, at most */
#define RX_TMA_DN_MAX (96 * 1024) /* of a staged down block (over 48 KB: the opt-in attribute) */

#if RX_TMA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RX_TMA_DEV 1
static __device__ __forceinline__ uint32_t rx_sh(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
#else
#define RX_TMA_DEV 0
#endif

/* One thread: the barrier with one arrival, visible to the copies (async proxy). */
static __device__ __forceinline__ void rx_bar_init(uint64_t *bar) {
#if RX_TMA_DEV
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(rx_sh(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
/* One thread, once: the arrival, expecting `bytes` of copies. */
static __device__ __forceinline__ void rx_bar_expect(uint64_t *bar, uint32_t bytes) {
#if RX_TMA_DEV
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(rx_sh(bar)), "r"(bytes) : "memory");
#endif
}
/* Copy `bytes` (a multiple of 16; both addresses 16-byte aligned) from global src to shared dst,
 * completing on bar. */
static __device__ __forceinline__ void rx_bulk(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
#if RX_TMA_DEV
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     rx_sh(dst)),
                 "l"(src), "r"(bytes), "r"(rx_sh(bar))
                 : "memory");
#endif
}
/* Every thread: wait until the barrier's first phase completed (the copies landed). */
static __device__ __forceinline__ void rx_bar_wait(uint64_t *bar) {
#if RX_TMA_DEV
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(rx_sh(bar))
                     : "memory");
#elif defined(__CUDA_ARCH__) && !(defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP))
    __trap(); /* built without sm_90 bulk copies: the host never picks these kernels there (rx_tma_ok) */
#endif
}

/* Gate + up, staged: the block owns NQ quads of slot j (inter rows i0 .. i0 + 2 NQ - 1), copies
 * their valid rows (separate: gate rows at shared row 0, up rows at 2 NQ; fused: rows 2 i0 ..
 * in order), and each thread takes chunks k = lane, lane + STEP, .. (U of them at most: U STEP >=
 * the row's chunks) of every row, as rx_gu_kernel. Shared: 4 NQ rows. */
/* ptxas sm_90: 46-128 registers, no spills (FP8 64-72, INT4 / MXFP4 up to 128: their blocks at
 * the Qwen3 shape have 2 warps); without the second __launch_bounds__ argument ptxas held them at
 * 96 and MXFP4 with NQ 4 spilled. */
template <int DT, int NQ, int U>
__global__ void __launch_bounds__(MM_WARPS *MS_WARP, 4) rx_gut_kernel(const rx_args a) {
    typedef mm_traits<DT> T;
    const int VEC = T::VEC, STEP = (int)blockDim.x;
    extern __shared__ __align__(128) uint8_t rx_sm[];
    __shared__ uint64_t bar;
    __shared__ float red[NQ][MM_WARPS][MM_R];
    const int j = blockIdx.y, lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    const int64_t i0 = (int64_t)blockIdx.x * 2 * NQ;
    const int64_t nch = a.cols / VEC, rowbytes = a.cols * (128 / VEC) / 8;
    const int nv = (int)(a.I - i0 < 2 * NQ ? a.I - i0 : 2 * NQ); /* valid inter rows */
    if (threadIdx.x == 0) rx_bar_init(&bar);
    if (!a.early) ms_pdl_launch();
    ms_pdl_wait(); /* the ids, weights and x are earlier kernels' output */
    if (a.early) ms_pdl_launch(); /* after the wait: the down kernel reads the ids before its own */
    const ms_gpu_ex_ptrs &e = a.tab[a.ids[j]];
    __syncthreads(); /* the barrier's init */
    if (threadIdx.x == 0) {
        const uint32_t n = (uint32_t)(nv * rowbytes);
        rx_bar_expect(&bar, 2 * n);
        if (a.fused) rx_bulk(rx_sm, (const uint8_t *)e.w[0] + 2 * i0 * rowbytes, 2 * n, &bar);
        else {
            rx_bulk(rx_sm, (const uint8_t *)e.w[0] + i0 * rowbytes, n, &bar);
            rx_bulk(rx_sm + 2 * NQ * rowbytes, (const uint8_t *)e.w[1] + i0 * rowbytes, n, &bar);
        }
    }
    rx_item it[U][NQ]; /* the scale bits and zero words now, the chunks from shared memory later */
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t k = threadIdx.x + (int64_t)u * STEP, g = (k * VEC) >> a.bshift;
#pragma unroll
        for (int q = 0; q < NQ; q++) {
            if (k >= nch || 2 * q >= nv) continue;
#pragma unroll
            for (int r = 0; r < MM_R; r++) {
                int64_t i = i0 + 2 * q + r / 2 < a.I ? i0 + 2 * q + r / 2 : a.I - 1;
                int kind = r % 2, m = a.fused ? 0 : kind;
                int64_t row = a.fused ? 2 * i + kind : i;
                int64_t srow = a.brow == 1 ? row * a.scols : (row / a.brow) * a.scols;
                it[u][q].sb[r] =
                    a.scale_dt != SC_NONE ? load_scale_bits((const uint8_t *)e.s[m], a.scale_dt, srow + g) : 0u;
            }
            it[u][q].zsh = 0;
            if (DT == DT_I4) {
                int64_t row0 = a.fused ? 2 * (i0 + 2 * q) : i0 + 2 * q, zr;
                int zsh;
                i4_zrow(row0, a.scols, &zr, &zsh);
                it[u][q].zsh = zsh;
                const uint32_t *z0 = (const uint32_t *)e.z[0], *z1 = (const uint32_t *)e.z[a.fused ? 0 : 1];
                it[u][q].zw[0] = z0 ? z0[zr + g] : 0x88888888u;
                it[u][q].zw[1] = z1 ? z1[zr + g] : 0x88888888u;
            }
        }
    }
    float acc[NQ][MM_R];
#pragma unroll
    for (int q = 0; q < NQ; q++)
#pragma unroll
        for (int r = 0; r < MM_R; r++) acc[q][r] = 0.0f;
    rx_bar_wait(&bar);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t k = threadIdx.x + (int64_t)u * STEP;
        if (k >= nch) break;
#pragma unroll
        for (int q = 0; q < NQ; q++) {
            if (2 * q >= nv) break;
#pragma unroll
            for (int r = 0; r < MM_R; r++) {
                int li = 2 * q + r / 2 < nv ? 2 * q + r / 2 : nv - 1, kind = r % 2;
                int sr = a.fused ? 2 * li + kind : kind * 2 * NQ + li;
                it[u][q].raw[r] = ((const uint4 *)(rx_sm + sr * rowbytes))[k];
            }
            rx_use<DT>(it[u][q], a.x + k * VEC, a.scale_dt, a.fused, acc[q]);
        }
    }
#pragma unroll
    for (int q = 0; q < NQ; q++)
#pragma unroll
        for (int r = 0; r < MM_R; r++) {
            float v = ms_warp_sum(acc[q][r]);
            if (lane == 0) red[q][warp][r] = v;
        }
    __syncthreads();
    if ((int)threadIdx.x < nv) rx_gu_out(a, e, j, i0 + threadIdx.x, red[threadIdx.x / 2], threadIdx.x % 2);
}

/* Down, staged: rx_down_kernel's block (output rows d0 .. d0 + 3, the K slots' down rows as one
 * virtual row in ascending expert id) with the K x 4 row segments copied (segment 4 s + r: rank
 * s, row d0 + r); each thread takes virtual chunks k = lane, lane + STEP, .. (NIT of them at
 * most). Shared: 4 K segments of I columns. */
template <int DT, int NIT>
__global__ void __launch_bounds__(MM_WARPS *MS_WARP) rx_downt_kernel(const rx_args a) {
    typedef mm_traits<DT> T;
    const int VEC = T::VEC, STEP = MM_WARPS * MS_WARP;
    extern __shared__ __align__(128) uint8_t rx_sm[];
    __shared__ uint64_t bar;
    __shared__ int ord[32];
    __shared__ const uint8_t *sw[32], *ss[32], *sz[32];
    const int K = a.K;
    if (threadIdx.x == 0) rx_bar_init(&bar);
    rx_down_slots(a, ord, sw, ss, sz); /* its __syncthreads publishes the barrier's init too */
    const int64_t d0 = (int64_t)blockIdx.x * MM_R;
    const int64_t nch = a.cols / VEC, rowbytes = a.cols * (128 / VEC) / 8, total = (int64_t)K * nch;
    if (threadIdx.x < MS_WARP) {
        if (threadIdx.x == 0) rx_bar_expect(&bar, (uint32_t)(4 * K * rowbytes));
#if RX_TMA_DEV
        __syncwarp(); /* the expectation before the copies that complete on it */
#endif
        for (int t = threadIdx.x; t < 4 * K; t += MS_WARP) {
            int64_t d = d0 + t % 4 < a.D ? d0 + t % 4 : a.D - 1;
            rx_bulk(rx_sm + t * rowbytes, sw[t / 4] + d * rowbytes, (uint32_t)rowbytes, &bar);
        }
    }
    int srow[MM_R];
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        int64_t d = d0 + r < a.D ? d0 + r : a.D - 1;
        srow[r] = (int)((d / a.brow) * a.scols);
    }
    int64_t zr;
    int zsh;
    i4_zrow(d0, a.scols, &zr, &zsh); /* rows d0 .. d0 + 3: one zero word, shifts zsh + 4 r */
    rx_item it[NIT];
#pragma unroll
    for (int n = 0; n < NIT; n++) {
        const int64_t k = threadIdx.x + (int64_t)n * STEP;
        if (k >= total) break;
        const int s = (int)(k / nch);
        const int64_t g = ((k - s * nch) * VEC) >> a.bshift;
#pragma unroll
        for (int r = 0; r < MM_R; r++)
            it[n].sb[r] = a.scale_dt != SC_NONE ? load_scale_bits(ss[s], a.scale_dt, srow[r] + g) : 0u;
        it[n].zsh = zsh;
        if (DT == DT_I4) it[n].zw[0] = sz[s] ? ((const uint32_t *)sz[s])[zr + g] : 0x88888888u;
    }
    float acc[MM_R] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (a.early) ms_pdl_wait(); /* h and the route weights are the gate + up kernel's */
    rx_bar_wait(&bar);
#pragma unroll
    for (int n = 0; n < NIT; n++) {
        const int64_t k = threadIdx.x + (int64_t)n * STEP;
        if (k >= total) break;
        const int s = (int)(k / nch);
        const int64_t c = k - s * nch;
#pragma unroll
        for (int r = 0; r < MM_R; r++) it[n].raw[r] = ((const uint4 *)(rx_sm + (4 * s + r) * rowbytes))[c];
        rx_use<DT>(it[n], a.x + (int64_t)ord[s] * a.I + c * VEC, a.scale_dt, 1, acc);
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

/* Whether the staged kernels take the routed experts of g: an sm_90+ device, device code built
 * for it (the bulk copies are in the sm_90 code only), MS_GPU_RX=tma at open (ms_gpu.rx_mode). */
static int rx_tma_ok(const ms_gpu *g) {
    return RX_TMA && (g->rx_mode == MS_GPU_RX_TMA || g->rx_mode == MS_GPU_RX_TMAE) && g->rx_tma_cap;
}

/* Launch the staged gate + up kernel (NQ quads per block, U chunks per thread and row). */
template <int DT, int NQ, int U> static void launch_gut(ms_gpu *g, const rx_args &gu, dim3 block, size_t shm) {
    int64_t npairs = (gu.I + 1) / 2;
    dim3 grid((unsigned)((npairs + NQ - 1) / NQ), (unsigned)gu.K);
    ms_launch(g->pdl, rx_gut_kernel<DT, NQ, U>, grid, block, shm, g->stream, gu);
}

/* The staged gate + up kernel when its block fits (rows whose chunks a thread covers in 4 passes
 * at most: 1 pass 4 quads a block, 2 passes 2, 3-4 passes 1; the quads' rows in RX_TMA_GU_MAX);
 * 0 when it does not (the caller takes rx_gu_kernel). */
template <int DT> static int gu_tma_shape(const ms_gpu *g, const rx_args &gu, dim3 block, int *nq, size_t *shm) {
    typedef mm_traits<DT> T;
    const int64_t nch = gu.cols / T::VEC, rowbytes = gu.cols * (128 / T::VEC) / 8;
    const int64_t passes = (nch + block.x - 1) / block.x;
    *nq = passes <= 1 ? 4 : passes <= 2 ? 2 : 1;
    *shm = (size_t)(4 * *nq * rowbytes);
    return rx_tma_ok(g) && passes <= 4 && *shm <= RX_TMA_GU_MAX;
}
template <int DT> static int launch_gu_tma(ms_gpu *g, const rx_args &gu, dim3 block) {
    int nq;
    size_t shm;
    if (!gu_tma_shape<DT>(g, gu, block, &nq, &shm)) return 0;
    if (nq == 4) launch_gut<DT, 4, 1>(g, gu, block, shm);
    else if (nq == 2) launch_gut<DT, 2, 2>(g, gu, block, shm);
    else launch_gut<DT, 1, 4>(g, gu, block, shm);
    return 1;
}

/* Launch the staged down kernel with NIT chunks per thread, opting in to its shared bytes. */
template <int DT, int NIT> static int launch_dt(ms_gpu *g, const rx_args &dn, dim3 grid, size_t shm) {
    if (shm > 32 * 1024) { /* the default limit is 48 KB with the static arrays */
        /* opt in once per instance and context: rx_smem bit DT * 4 + log2(NIT) */
        unsigned bit = 1u << (DT * 4 + (NIT == 1 ? 0 : NIT == 2 ? 1 : NIT == 4 ? 2 : 3));
        if (!(g->rx_smem & bit)) {
            if (gpuFuncSetAttribute((const void *)rx_downt_kernel<DT, NIT>, gpuFuncAttributeMaxDynamicSharedMemorySize,
                                    RX_TMA_DN_MAX) != gpuSuccess) {
                (void)gpuGetLastError();
                return 0;
            }
            g->rx_smem |= bit;
        }
    }
    ms_launch(g->pdl, rx_downt_kernel<DT, NIT>, grid, dim3(MM_WARPS * MS_WARP), shm, g->stream, dn);
    return 1;
}

/* The staged down kernel when its block fits (8 chunks per thread at most, 4 K row segments in
 * RX_TMA_DN_MAX); 0 when it does not (the caller takes rx_downp_kernel or rx_down_kernel). */
template <int DT> static int dn_tma_shape(const ms_gpu *g, const rx_args &dn, int64_t *nit, size_t *shm) {
    typedef mm_traits<DT> T;
    const int64_t nch = dn.cols / T::VEC, rowbytes = dn.cols * (128 / T::VEC) / 8;
    *nit = ((int64_t)dn.K * nch + MM_WARPS * MS_WARP - 1) / (MM_WARPS * MS_WARP);
    *shm = (size_t)(4 * dn.K * rowbytes);
    return rx_tma_ok(g) && *nit <= 8 && *shm <= RX_TMA_DN_MAX;
}
/* Whether both staged kernels take this call (MS_GPU_RX=tmae needs both: the early down pairs
 * with the staged gate + up's late trigger). */
template <int DT> static int rx_tma_fits(const ms_gpu *g, const rx_args &gu, dim3 gblock, const rx_args &dn) {
    int nq;
    int64_t nit;
    size_t s1, s2;
    return gu_tma_shape<DT>(g, gu, gblock, &nq, &s1) && dn_tma_shape<DT>(g, dn, &nit, &s2);
}
template <int DT> static int launch_dn_tma(ms_gpu *g, const rx_args &dn, dim3 grid) {
    int64_t nit;
    size_t shm;
    if (!dn_tma_shape<DT>(g, dn, &nit, &shm)) return 0;
    if (nit <= 1) return launch_dt<DT, 1>(g, dn, grid, shm);
    if (nit <= 2) return launch_dt<DT, 2>(g, dn, grid, shm);
    if (nit <= 4) return launch_dt<DT, 4>(g, dn, grid, shm);
    return launch_dt<DT, 8>(g, dn, grid, shm);
}

/* The two launches by ms_gpu.rx_mode (MS_GPU_RX at open; A/B measurements). Default: rx_gu_kernel
 * for gate + up, and for down rx_downp_kernel (FP8, MXFP4, INT4; Kimi K2 shape INT4 134 us vs 146
 * with rx_down_kernel) or rx_down_kernel (F32, F16, BF16). old: rx_gu_kernel and rx_down_kernel.
 * tma: the staged kernels where their blocks fit, else the default's; tmae: tma, and where both
 * staged kernels fit the down kernel's copies are issued before it waits for gate + up (a.early);
 * early (FP8, MXFP4, INT4): the default pair with rx_downp_kernel's first item loaded before it
 * waits for gate + up (a.early; F32 / F16 / BF16: the default). */
template <int DT>
static void launch_rx(ms_gpu *g, const rx_args &gu, const rx_args &dn) {
    gpuStream_t st = g->stream;
    int pdl = g->pdl;
    typedef mm_traits<DT> T;
    dim3 block(MM_WARPS * MS_WARP);
    dim3 gblock(rx_warps(gu.cols / T::VEC) * MS_WARP);
    constexpr bool narrow = DT == DT_FP8 || DT == DT_FP8_CVT || DT == DT_F4 || DT == DT_I4;
    const dim3 dgrid((unsigned)((dn.D + MM_R - 1) / MM_R));
    rx_args gue = gu, dne = dn; /* tmae: the early down when both staged kernels take the call */
    gue.early = dne.early = g->rx_mode == MS_GPU_RX_TMAE && rx_tma_fits<DT>(g, gu, gblock, dn);
    if constexpr (narrow) {
        if (g->rx_mode == MS_GPU_RX_EARLY) { /* rx_gu_kernel, then rx_downp_kernel's first loads early */
            gue.early = dne.early = 1;
            ms_launch(pdl, rx_gu_kernel<DT>, dim3((unsigned)((gu.I + 1) / 2), (unsigned)gu.K), gblock, 0, st, gue);
            ms_launch(pdl, rx_downp_kernel<DT>, dgrid, block, 0, st, dne);
            return;
        }
    }
    if (!launch_gu_tma<DT>(g, gue, gblock))
        ms_launch(pdl, rx_gu_kernel<DT>, dim3((unsigned)((gu.I + 1) / 2), (unsigned)gu.K), gblock, 0, st, gu);
    if (launch_dn_tma<DT>(g, dne, dgrid)) return;
    if constexpr (narrow) {
        if (g->rx_mode != MS_GPU_RX_OLD) {
            ms_launch(pdl, rx_downp_kernel<DT>, dgrid, block, 0, st, dn);
            return;
        }
    }
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

