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
    ms_gpu_glu_params p;
} rx_args;


template <int DT>
__global__ void __launch_bounds__(MM_WARPS *MS_WARP) rx_gu_kernel(const rx_args a) {
    typedef mm_traits<DT> T;
    const int VEC = T::VEC, U = 2;
    const int STEP = (int)blockDim.x; /* 1 to MM_WARPS warps (rx_warps) */
    const int j = blockIdx.y;
    const int64_t i0 = (int64_t)blockIdx.x * 2;
    ms_pdl_launch();
    ms_pdl_wait(); /* the ids, weights and x are earlier kernels' output */
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
    if (threadIdx.x < 2 && i0 + threadIdx.x < a.I) {
        int o = threadIdx.x;
        int64_t i = i0 + o;
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
}

/* ---- the gate + up kernel for the narrow dtypes (FP8, MXFP4, INT4), several row pairs per block.
 * rx_gu_kernel's block moves 4 rows (14 KB of INT4 at the Kimi K2 shape, 1.75 chunks per thread)
 * and pays its start (ids -> table -> weights), reduction and epilogue for them; rx_gup_kernel's
 * block owns P consecutive row quads (inter rows i0 .. i0 + 2P - 1 of one slot, P from rx_quads)
 * and keeps one item (a 16-byte chunk of its 4 rows, with their scale bits and INT4 zero words)
 * loaded ahead: the next item's loads are issued before the current one is decoded, across the
 * quads' boundary too, and the scale and zero point reach the decode without a load of their own.
 * Each thread walks the same chunks in the same order as rx_gu_kernel (k = lane, lane + STEP, ...
 * of each row, one FMA chain per row and chunk, the scale applied per chunk), the warp and block
 * sums are the same: the same products summed in the same order, so the same bits.
 * MS_GPU_RX=old (gpu_rx_old) keeps rx_gu_kernel for A/B runs. */
#define RX_MAXP 8 /* row quads per block, at most */

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

/* Row r of a quad of the block (inter rows i0, i0 + 1, clamped to I - 1 as rx_gu_kernel): its
 * weight row and scale row index; the zero word row of rows 0 (and 1: the up matrix's) and row
 * 0's nibble shift. Rows 0..3 of a quad (i0 even) sit in one group of 8 rows of each matrix: the
 * zero word is shared, the shift of row r is zsh + 4 r (fused) or zsh + 4 (r / 2) (separate);
 * a clamped row (I odd) may get another zero point: its result is dropped. Indices fit 32 bits
 * (one expert matrix's scales or zero words). */
typedef struct rx_quad {
    const uint4 *wr[MM_R];
    int srow[MM_R], zrow;
    int zsh;
} rx_quad;

static __device__ __forceinline__ void rx_quad_of(const rx_args &a, const ms_gpu_ex_ptrs &e, int64_t i0, int64_t rowbytes,
                                                  rx_quad &qd) {
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        int64_t i = i0 + r / 2 < a.I ? i0 + r / 2 : a.I - 1;
        int kind = r % 2, m = a.fused ? 0 : kind;
        int64_t row = a.fused ? 2 * i + kind : i;
        qd.wr[r] = (const uint4 *)((const uint8_t *)e.w[m] + row * rowbytes);
        qd.srow[r] = (int)(a.brow == 1 ? row * a.scols : (row / a.brow) * a.scols);
    }
    int64_t row0 = a.fused ? 2 * i0 : i0, zr;
    i4_zrow(row0, a.scols, &zr, &qd.zsh);
    qd.zrow = (int)zr;
}

/* Issue the loads of chunk k of quad qd's rows (weights, scale bits, zero words) into it. */
template <int DT>
static __device__ __forceinline__ void rx_fetch(const rx_args &a, const ms_gpu_ex_ptrs &e, const rx_quad &qd, int64_t k,
                                                int VEC, rx_item &it) {
    const int64_t g = (k * VEC) >> a.bshift;
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        int m = a.fused ? 0 : r % 2;
        it.raw[r] = ms_load_stream16(qd.wr[r] + k);
        it.sb[r] = a.scale_dt != SC_NONE ? load_scale_bits((const uint8_t *)e.s[m], a.scale_dt, qd.srow[r] + g) : 0u;
    }
    if (DT == DT_I4) {
        it.zsh = qd.zsh;
#pragma unroll
        for (int m = 0; m < 2; m++) {
            const uint32_t *z = (const uint32_t *)e.z[a.fused ? 0 : m];
            it.zw[m] = z ? z[qd.zrow + g] : 0x88888888u;
        }
    }
}

/* acc[r] += item it's share of row r against x at column c0: rx_chunk's products and order. */
template <int DT>
static __device__ __forceinline__ void rx_use(const rx_item &it, const float *xp, int scale_dt, int fused,
                                              float (&acc)[MM_R]) {
    typedef mm_traits<DT> T;
    const int SUB = T::SUB, NSUB = T::VEC / T::SUB;
    float off[MM_R], part[MM_R];
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        int sh = it.zsh + 4 * (fused ? r : r / 2);
        off[r] = DT == DT_I4 ? -(8388608.0f + (float)((it.zw[fused ? 0 : r % 2] >> sh) & 15u)) : 0.0f;
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
            for (int i = 0; i < SUB; i++) part[r] = fmaf(wv[i], xv[i], part[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        float sc = kernel_scale<DT>();
        if (scale_dt != SC_NONE) sc *= scale_of_bits(it.sb[r], scale_dt);
        acc[r] = fmaf(sc, part[r], acc[r]);
    }
}

/* ptxas sm_90: 96 registers (INT4, FP8, MXFP4); a second __launch_bounds__ argument of 1 gave 252,
 * of 6 (80) spills. */
template <int DT>
__global__ void __launch_bounds__(MM_WARPS *MS_WARP) rx_gup_kernel(const rx_args a, int P) {
    typedef mm_traits<DT> T;
    const int VEC = T::VEC;
    const int STEP = (int)blockDim.x; /* as rx_gu_kernel (rx_warps): the same chunks per thread */
    const int j = blockIdx.y, lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    const int64_t npairs = (a.I + 1) / 2, p0 = (int64_t)blockIdx.x * P;
    const int nq = (int)(npairs - p0 < P ? npairs - p0 : P);
    ms_pdl_launch();
    ms_pdl_wait(); /* the ids, weights and x are earlier kernels' output */
    const ms_gpu_ex_ptrs &e = a.tab[a.ids[j]];
    const int64_t nch = a.cols / VEC, rowbytes = a.cols * (128 / VEC) / 8;
    __shared__ float red[RX_MAXP][MM_WARPS][MM_R];
    rx_quad qd;
    rx_item nx;
    int fq = 0;                   /* the quad of the item loaded ahead */
    int64_t fk = threadIdx.x;     /* its chunk */
    rx_quad_of(a, e, 2 * p0, rowbytes, qd);
    if (fk < nch) rx_fetch<DT>(a, e, qd, fk, VEC, nx);
    for (int q = 0; q < nq; q++) {
        float acc[MM_R] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t k = threadIdx.x; k < nch; k += STEP) {
            rx_item cur = nx;
            fk += STEP;
            if (fk >= nch) { /* the next item is the next quad's first chunk */
                fk = threadIdx.x, fq++;
                if (fq < nq) rx_quad_of(a, e, 2 * (p0 + fq), rowbytes, qd);
            }
            if (fq < nq) rx_fetch<DT>(a, e, qd, fk, VEC, nx);
            rx_use<DT>(cur, a.x + k * VEC, a.scale_dt, a.fused, acc);
        }
#pragma unroll
        for (int r = 0; r < MM_R; r++) {
            float v = ms_warp_sum(acc[r]);
            if (lane == 0) red[q][warp][r] = v;
        }
    }
    __syncthreads();
    if ((int)threadIdx.x < 2 * nq) {
        int q = threadIdx.x / 2, o = threadIdx.x % 2;
        int64_t i = 2 * (p0 + q) + o;
        if (i < a.I) {
            float gt = 0.0f, up = 0.0f;
            for (int w = 0; w < (int)(blockDim.x / MS_WARP); w++) gt += red[q][w][2 * o], up += red[q][w][2 * o + 1];
            if (a.fused) {
                gt += ms_bias_at(e.bias[0], a.bias_dt, 2 * i);
                up += ms_bias_at(e.bias[0], a.bias_dt, 2 * i + 1);
            } else {
                gt += ms_bias_at(e.bias[0], a.bias_dt, i);
                up += ms_bias_at(e.bias[1], a.bias_dt, i);
            }
            a.h[j * a.I + i] = a.w[j] * ms_glu_apply(gt, up, a.p);
        }
    }
}

/* The start of the down kernels (rx_down_kernel, rx_downp_kernel): the dependent-launch trigger
 * and wait, then the K slots in ascending expert id into the block's shared arrays: ord[rank] the
 * slot of that rank, sw / ss / sz its down weights, scales and zero points. */
static __device__ __forceinline__ void rx_down_slots(const rx_args &a, int (&ord)[32], const uint8_t *(&sw)[32],
                                                     const uint8_t *(&ss)[32], const uint8_t *(&sz)[32]) {
    const int K = a.K;
    ms_pdl_launch();
    ms_pdl_wait(); /* the ids, weights and h are earlier kernels' output */
    if (threadIdx.x < K) { /* slot of rank r in ascending expert id (ids of one token are distinct) */
        int id = a.ids[threadIdx.x], rank = 0;
        for (int q = 0; q < K; q++) rank += a.ids[q] < id || (a.ids[q] == id && q < (int)threadIdx.x);
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
    if (threadIdx.x < MM_R && d0 + threadIdx.x < a.D) {
        int64_t d = d0 + threadIdx.x;
        float v = 0.0f;
        for (int w = 0; w < MM_WARPS; w++) v += red[w][threadIdx.x];
        for (int q = 0; q < K; q++) { /* down biases, ascending expert id */
            const void *b = a.tab[a.ids[ord[q]]].bias[2];
            if (b) v = fmaf(a.w[ord[q]], ms_bias_at(b, a.bias_dt, d), v);
        }
        a.acc[d] = v;
    }
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
    if (threadIdx.x < MM_R && d0 + threadIdx.x < a.D) {
        int64_t d = d0 + threadIdx.x;
        float v = 0.0f;
        for (int w = 0; w < MM_WARPS; w++) v += red[w][threadIdx.x];
        for (int q = 0; q < K; q++) { /* down biases, ascending expert id */
            const void *b = a.tab[a.ids[ord[q]]].bias[2];
            if (b) v = fmaf(a.w[ord[q]], ms_bias_at(b, a.bias_dt, d), v);
        }
        a.acc[d] = v;
    }
}

/* Warps per block of the gate + up kernel over rows of nch 16-byte chunks: enough for one
 * chunk per lane, at most MM_WARPS (MXFP4 rows of 2048 columns have 64 chunks: two warps,
 * not four with half the lanes idle); MS_GPU_QX=old: always MM_WARPS. */
static int rx_warps(int64_t nch) {
    int64_t w = (nch + MS_WARP - 1) / MS_WARP;
    return qx_old() || w > MM_WARPS ? MM_WARPS : w < 1 ? 1 : (int)w;
}

/* MS_GPU_RX (read once; A/B measurements) for the narrow dtypes (FP8, MXFP4, INT4). Default (unset,
 * or oldgu): rx_gu_kernel for gate + up and rx_downp_kernel for down, the fastest pair measured on
 * the H200 (Kimi K2 shape: INT4 134 vs 146 us with both earlier kernels, FP8 107 vs 109;
 * rx_gup_kernel measured slower: INT4 165, FP8 175, docs/performance.md). new: rx_gup_kernel and
 * rx_downp_kernel; old: rx_gu_kernel and rx_down_kernel; olddown: rx_gup_kernel and rx_down_kernel.
 * Bits: 1 the earlier gate + up, 2 the earlier down. */
static int rx_old(void) {
    static int old = -1;
    if (old < 0) {
        const char *e = getenv("MS_GPU_RX");
        old = !e ? 1 : !strcmp(e, "old") ? 3 : !strcmp(e, "new") ? 0 : !strcmp(e, "olddown") ? 2 : 1;
    }
    return old;
}

/* Row quads per block of rx_gup_kernel: P in 1 .. Pmax (Pmax for about 64 KB of weights per
 * block, at most RX_MAXP) with the least ceil(blocks / res) * (P + 1), res the blocks resident on
 * the device at once: whole waves of blocks (a block's time taken as P quads plus one for its start
 * and end), the smaller P on ties. E.g. on an H200 (96 registers: 5 blocks of 4 warps per SM,
 * 10 of 2): the Kimi K2 shape (8 slots) INT4 P = 5, FP8 3; the Qwen3 shape (8 slots, 384 pairs)
 * FP8 5, INT4 / MXFP4 (64 chunks a row: two-warp blocks) 3. */
static int rx_quads(int64_t rowbytes, int64_t I, int K, int64_t res) {
    int64_t quad = 4 * rowbytes, npairs = (I + 1) / 2;
    int64_t pmax = (65536 + quad - 1) / quad;
    if (pmax > RX_MAXP) pmax = RX_MAXP;
    if (pmax > npairs) pmax = npairs;
    if (res < 1) res = 1;
    int best = 1;
    int64_t bcost = -1;
    for (int P = 1; P <= pmax; P++) {
        int64_t blocks = ((npairs + P - 1) / P) * K, cost = ((blocks + res - 1) / res) * (P + 1);
        if (bcost < 0 || cost < bcost) best = P, bcost = cost;
    }
    return best;
}

/* Resident blocks per SM of rx_gup_kernel<DT> at `warps` warps per block (cached in g; 1 when the
 * runtime does not say). */
template <int DT>
static int rx_occupancy(ms_gpu *g, int warps) {
    int &o = g->rx_occ[DT][warps - 1];
    if (!o) {
        int n = 0;
        if (gpuOccupancyMaxActiveBlocksPerMultiprocessor(&n, rx_gup_kernel<DT>, warps * MS_WARP, 0) != gpuSuccess || n < 1)
            n = 1, (void)gpuGetLastError();
        o = n;
    }
    return o;
}

template <int DT>
static void launch_rx(ms_gpu *g, const rx_args &gu, const rx_args &dn) {
    gpuStream_t st = g->stream;
    int pdl = g->pdl;
    typedef mm_traits<DT> T;
    dim3 block(MM_WARPS * MS_WARP);
    dim3 gblock(rx_warps(gu.cols / T::VEC) * MS_WARP);
    constexpr bool narrow = DT == DT_FP8 || DT == DT_FP8_CVT || DT == DT_F4 || DT == DT_I4;
    const dim3 dgrid((unsigned)((dn.D + MM_R - 1) / MM_R));
    if constexpr (narrow) { /* rx_gup_kernel / rx_downp_kernel exist for these only */
        if (!(rx_old() & 1)) {
            int warps = (int)(gblock.x / MS_WARP);
            int64_t res = (int64_t)g->prop.multiProcessorCount * rx_occupancy<DT>(g, warps);
            int P = rx_quads(gu.cols * (128 / T::VEC) / 8, gu.I, gu.K, res);
            int64_t npairs = (gu.I + 1) / 2;
            ms_launch(pdl, rx_gup_kernel<DT>, dim3((unsigned)((npairs + P - 1) / P), (unsigned)gu.K), gblock, 0, st, gu,
                      P);
        } else
            ms_launch(pdl, rx_gu_kernel<DT>, dim3((unsigned)((gu.I + 1) / 2), (unsigned)gu.K), gblock, 0, st, gu);
        if (!(rx_old() & 2)) ms_launch(pdl, rx_downp_kernel<DT>, dgrid, block, 0, st, dn);
        else ms_launch(pdl, rx_down_kernel<DT>, dgrid, block, 0, st, dn);
    } else {
        ms_launch(pdl, rx_gu_kernel<DT>, dim3((unsigned)((gu.I + 1) / 2), (unsigned)gu.K), gblock, 0, st, gu);
        ms_launch(pdl, rx_down_kernel<DT>, dgrid, block, 0, st, dn);
    }
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

