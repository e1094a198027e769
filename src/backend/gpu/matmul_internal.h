/* matmul_internal.h — shared by matmul.cu (y = W x, the expert FFN, the router) and
 * matmul_routed.cu (the routed-expert decode kernels): the vector kernel's dtype codes, job
 * and argument layout, the in-register decode and the row-chunk product; .cu files only. */
#ifndef MS_GPU_MATMUL_INTERNAL_H
#define MS_GPU_MATMUL_INTERNAL_H

#include "backend/gpu/gpu_internal.h"

#define MM_WARPS 4    /* warps per block */
#define MM_R 4        /* rows per block */
#define MM_MAXJ 64    /* jobs per launch */
#define MM_MAXNT 8    /* tokens per pass */

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_FP8 = 3, DT_F4 = 4, DT_FP8_CVT = 5 /* FP8, other decode */, DT_I4 = 6,
       DT_Q8 = 7 /* core/qmat.h Q8: int8 times a scale per 1 x bcol block (bcol a multiple of 16) */ };
enum { SC_NONE = 0, SC_F32 = 1, SC_BF16 = 2, SC_E8M0 = 3, SC_F16 = 4 };

typedef struct mm_job {
    const uint8_t *w, *scale;
    const float *x;
    float *y;
    int64_t rows; /* this job's rows (0: the launch's, a.rows; the launch covers the largest) */
    const uint8_t *zero; /* I4 zero points (core/qmat.h), NULL: symmetric (uz 8) or not I4 */
} mm_job;

typedef struct mm_args {
    mm_job job[MM_MAXJ];
    int64_t rows, cols, scols; /* scols: scale columns per scale row */
    int brow, bcol, bshift, scale_dt, n, acc; /* bshift: log2(bcol) (vector kernel: bcol a power of 2) */
    /* indirect jobs (routed experts, tab non-NULL): job y is matrix sel0 + y % per of expert
     * ids[y / per] in tab, x = xb + (y / per) * xjs, y = yb + (y / per) * yjs + (y % per) * ywh */
    const ms_gpu_ex_ptrs *tab;
    const int32_t *ids;
    int per, sel0;
    const float *xb;
    float *yb;
    int64_t xjs, yjs, ywh;
    /* the vector kernel over direct jobs (nflat > 0): one row of blocks, job j's MM_R-row blocks
     * at boff[j] .. boff[j + 1] (no idle blocks for the shorter jobs of a launch) */
    int nflat;
    int boff[MM_MAXJ + 1];
} mm_args;

static __device__ __forceinline__ mm_job job_of(const mm_args &a) {
    if (!a.tab) return a.job[blockIdx.y];
    int y = blockIdx.y, j = y / a.per, k = y % a.per, m = a.sel0 + k;
    const ms_gpu_ex_ptrs &p = a.tab[a.ids[j]];
    mm_job jb;
    jb.w = (const uint8_t *)p.w[m];
    jb.scale = (const uint8_t *)p.s[m];
    jb.x = a.xb + (int64_t)j * a.xjs;
    jb.y = a.yb + (int64_t)j * a.yjs + (int64_t)k * a.ywh;
    jb.rows = 0;
    jb.zero = (const uint8_t *)p.z[m];
    return jb;
}

static __device__ __forceinline__ float load_scale(const uint8_t *s, int dt, int64_t i) {
    if (dt == SC_F32) return ((const float *)s)[i];
    if (dt == SC_BF16) return ms_bf16_to_f32_dev(((const uint16_t *)s)[i]);
    if (dt == SC_E8M0) return ms_e8m0_to_f32_dev(s[i]);
    if (dt == SC_F16) return ms_f16_to_f32_dev(((const uint16_t *)s)[i]);
    return 1.0f;
}

/* INT4 (core/qmat.h I4): the offset -(2^23 + uz) that decode<DT_I4> adds to 2^23 + u, for the
 * zero point uz of group g of a row whose zero words start at index zrow (uz in bits zsh ..
 * zsh + 3); uz = 8 when z is NULL (symmetric). */
static __device__ __forceinline__ int i4_uz(const uint8_t *z, int64_t zrow, int zsh, int64_t g) {
    return z ? (int)((((const uint32_t *)z)[zrow + g] >> zsh) & 15u) : 8;
}
static __device__ __forceinline__ float i4_off(const uint8_t *z, int64_t zrow, int zsh, int64_t g) {
    return -(8388608.0f + (float)i4_uz(z, zrow, zsh, g));
}
/* The index of row row's first zero word and its nibble's shift (rows packed 8 per word). */
static __device__ __forceinline__ void i4_zrow(int64_t row, int64_t scols, int64_t *zrow, int *zsh) {
    *zrow = (row >> 3) * scols, *zsh = 4 * (int)(row & 7);
}

/* Elements per 16-byte chunk and per decoded sub-group. */
template <int DT> struct mm_traits;
template <> struct mm_traits<DT_F32> { enum { VEC = 4, SUB = 4 }; };
template <> struct mm_traits<DT_F16> { enum { VEC = 8, SUB = 8 }; };
template <> struct mm_traits<DT_BF16> { enum { VEC = 8, SUB = 8 }; };
template <> struct mm_traits<DT_FP8> { enum { VEC = 16, SUB = 8 }; };
template <> struct mm_traits<DT_F4> { enum { VEC = 32, SUB = 8 }; };
template <> struct mm_traits<DT_FP8_CVT> { enum { VEC = 16, SUB = 8 }; };
template <> struct mm_traits<DT_I4> { enum { VEC = 32, SUB = 8 }; };
template <> struct mm_traits<DT_Q8> { enum { VEC = 16, SUB = 8 }; };

/* Decode sub-group `sub` of a 16-byte chunk into SUB floats. FP8 comes out
 * times 2^-112, MXFP4 times 2 (kernel_scale puts that back with the block scale);
 * INT4 as u - uz (i4off = -(2^23 + uz), i4_off), unscaled; Q8 as the int8 value q, unscaled: the
 * byte b = q + 128 (q's bits with the sign flipped) in a float's mantissa, 2^23 + b, minus 2^23 + 128
 * (exact). */
template <int DT>
static __device__ __forceinline__ void decode(const uint4 &raw, int sub, float *w, float i4off) {
    const uint32_t q[4] = {raw.x, raw.y, raw.z, raw.w};
    if (DT == DT_Q8) { /* words 2 sub, 2 sub + 1: columns 8 sub .. 8 sub + 7, byte j = column 8 sub + j */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t v = q[2 * sub + i] ^ 0x80808080u;
#pragma unroll
            for (int j = 0; j < 4; j++)
                w[4 * i + j] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540u + (unsigned)j)) - 8388736.0f;
        }
    } else if (DT == DT_I4) { /* word `sub`: columns 8 sub .. 8 sub + 7, nibble j = column 8 sub + j */
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = __uint_as_float(0x4B000000u | ((q[sub] >> (4 * j)) & 15u)) + i4off;
    } else if (DT == DT_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) w[i] = __uint_as_float(q[i]);
    } else if (DT == DT_BF16 || DT == DT_F16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = DT == DT_BF16 ? ms_bf16x2_to_f32x2(q[i]) : ms_f16x2_to_f32x2(q[i]);
            w[2 * i] = f.x, w[2 * i + 1] = f.y;
        }
    } else if (DT == DT_FP8_CVT) { /* pair conversion to F16, F16 -> F32 by the conversion unit */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint32_t v = q[2 * sub + i];
            float2 a = ms_fp8x2_e4m3_to_f32x2(v & 0xffffu), b = ms_fp8x2_e4m3_to_f32x2(v >> 16);
            w[4 * i] = a.x, w[4 * i + 1] = a.y, w[4 * i + 2] = b.x, w[4 * i + 3] = b.y;
        }
    } else if (DT == DT_FP8) {
        ms_fp8x4_e4m3_scaled(q[2 * sub], w);
        ms_fp8x4_e4m3_scaled(q[2 * sub + 1], w + 4);
    } else { /* DT_F4: word `sub` holds columns 8*sub .. 8*sub+7 */
        ms_e2m1x8_times2(q[sub], w);
    }
}
template <int DT> static __device__ __forceinline__ float kernel_scale() {
    return DT == DT_FP8 ? 0x1p112f : DT == DT_F4 ? 0.5f : 1.0f;
}

/* FP8 decode of the vector kernel (matmul.cu): 0 = DT_FP8_CVT, 1 = DT_FP8 (MS_GPU_FP8_DECODE=shift). */
int fp8_decode_mode(void);
/* The DT_ code of a weight dtype; -1 when the vector / generic kernels do not take it. */
int kernel_dtype(ms_dtype dt);
/* Fill the layout fields of a from w. */
void mm_layout(mm_args &a, const ms_qmat *w, int n, int acc);
/* Launch nj jobs of a (layout of w); aligned: every job's w and x 16-byte aligned. */
int mm_run(ms_gpu *g, const ms_qmat *w, const mm_args &a, int nj, int aligned, int force_generic, ms_err *err);
/* Whether the vector kernel takes a matrix of w's layout over a 16-byte aligned x (as mm_run). */
int vec_layout_ok(const ms_qmat *w);

/* acc[r] += the lane's share of row r of chunks k (a chunk: VEC columns at c0), as mm_vec_kernel;
 * INT4: row r's zero points zp[r] (NULL: symmetric), its first zero word zrow[r], nibble shift zsh[r]. */
template <int DT>
static __device__ __forceinline__ void rx_chunk(const uint4 (&raw)[MM_R], const float *xp, const uint8_t *const (&sp)[MM_R],
                                                const int64_t (&srow)[MM_R], int c0, int scale_dt, int bshift,
                                                float (&acc)[MM_R], const uint8_t *const (&zp)[MM_R],
                                                const int64_t (&zrow)[MM_R], const int (&zsh)[MM_R]) {
    typedef mm_traits<DT> T;
    const int SUB = T::SUB, NSUB = T::VEC / T::SUB;
    const bool SCALED = DT == DT_FP8 || DT == DT_F4 || DT == DT_FP8_CVT || DT == DT_I4 || DT == DT_Q8;
    float off[MM_R];
#pragma unroll
    for (int r = 0; r < MM_R; r++) off[r] = DT == DT_I4 ? i4_off(zp[r], zrow[r], zsh[r], c0 >> bshift) : 0.0f;
    float part[MM_R];
#pragma unroll
    for (int r = 0; r < MM_R; r++) part[r] = 0.0f;
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
            decode<DT>(raw[r], s, wv, off[r]);
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
            if (scale_dt != SC_NONE) sc *= load_scale(sp[r], scale_dt, srow[r] + (c0 >> bshift));
            acc[r] = fmaf(sc, part[r], acc[r]);
        }
    }
}

/* Sum acc over the block's warps into red[r] (every thread then reads red). */
static __device__ __forceinline__ void rx_block_reduce(float (&acc)[MM_R], float (*red)[MM_R]) {
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        float v = ms_warp_sum(acc[r]);
        if (lane == 0) red[warp][r] = v;
    }
    __syncthreads();
}

#endif
