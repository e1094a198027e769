/* matmul.cu — y = W x for weights in their stored dtype (F32, F16, BF16, FP8
 * E4M3 with block scales, MXFP4, INT4), small token counts (decode), and the expert
 * FFN of one token built on it (contracts in gpu.h). Dense Q8 / INT4 products go to
 * matmul_q.cu; INT4 routed experts (Kimi K2 / K2.5) run here.
 *
 * Decode is memory-bound: each weight byte is read once per pass, so the
 * kernel streams rows with 16-byte loads per lane, coalesced across the warp,
 * several loads in flight (R rows x U chunks per lane), and applies up to NT
 * tokens to every loaded chunk (each x load serves R rows). A block of 4
 * warps owns R = 4 rows and its warps split the columns. Dequantization
 * happens in registers with few integer operations (the conversion units, not
 * the memory, limited the first version): BF16/F16/F32 by shifts/conversion;
 * FP8 by the hardware pair conversion to F16 then shifts into F32 bits (value
 * x 2^-112), the block scale applied once per 16-column chunk; MXFP4 by a
 * byte-permute table lookup (2 x value as an exact float), the E8M0 scale once
 * per 32-column group; INT4 (compressed-tensors pack-quantized, core/qmat.h I4) by
 * placing each nibble u in a float's mantissa (2^23 + u) and subtracting 2^23 + uz
 * (uz the group's zero point, 8 when symmetric): u - uz exactly, the group scale
 * (bcol a multiple of 32: one per 16-byte chunk) once per chunk. Products of the scaled FP8 values below 2^-14 in
 * magnitude become F32 subnormals: their absolute error stays below 2^-38
 * times the block scale, far under the F32 rounding of the sum.
 *
 * Rows whose byte length is not a multiple of 16, x not 16-byte aligned, or
 * FP8 blocks narrower than 16 columns take a generic kernel (one element per
 * lane per step, any layout): correct for every shape, slower. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gpu_internal.h"
#include "backend/gpu/route_warp.h"

#define MM_WARPS 4    /* warps per block */
#define MM_R 4        /* rows per block */
#define MM_MAXJ 64    /* jobs per launch */
#define MM_MAXNT 8    /* tokens per pass */

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_FP8 = 3, DT_F4 = 4, DT_FP8_CVT = 5 /* FP8, other decode */, DT_I4 = 6 };
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

/* Decode sub-group `sub` of a 16-byte chunk into SUB floats. FP8 comes out
 * times 2^-112, MXFP4 times 2 (kernel_scale puts that back with the block scale);
 * INT4 as u - uz (i4off = -(2^23 + uz), i4_off), unscaled. */
template <int DT>
static __device__ __forceinline__ void decode(const uint4 &raw, int sub, float *w, float i4off) {
    const uint32_t q[4] = {raw.x, raw.y, raw.z, raw.w};
    if (DT == DT_I4) { /* word `sub`: columns 8 sub .. 8 sub + 7, nibble j = column 8 sub + j */
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

/* FP8 decode of the vector kernel: 0 = hardware pair conversion then F16->F32
 * conversions (DT_FP8_CVT, measured faster on H200), 1 = shifts (DT_FP8);
 * MS_GPU_FP8_DECODE=shift selects the latter (for measurements). */
static int fp8_decode_mode(void) {
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("MS_GPU_FP8_DECODE");
        mode = e && !strcmp(e, "shift") ? 1 : 0;
    }
    return mode;
}

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

/* The vector kernel: rows of cols % VEC == 0, 16-byte aligned rows and x.
 * A block owns MM_R rows; its warps split the columns (so short, wide
 * matrices still fill the device); partial sums meet in shared memory. */
template <int DT, int NT, int U>
__global__ void __launch_bounds__(MM_WARPS *MS_WARP) mm_vec_kernel(const mm_args a) {
    typedef mm_traits<DT> T;
    const int VEC = T::VEC, SUB = T::SUB, NSUB = VEC / SUB;
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    ms_pdl_launch();
    if (a.tab) ms_pdl_wait(); /* routed jobs: the expert ids are an earlier kernel's output */
    int fj = 0;
    while (fj + 1 < a.nflat && (int)blockIdx.x >= a.boff[fj + 1]) fj++;
    const mm_job jb = a.nflat ? a.job[fj] : job_of(a);
    const int64_t rows = jb.rows ? jb.rows : a.rows;
    const int64_t row0 = ((int64_t)blockIdx.x - (a.nflat ? a.boff[fj] : 0)) * MM_R;
    if (row0 >= rows) return; /* a shorter job of the launch */
    const int64_t nch = a.cols / VEC, rowbytes = a.cols * (128 / VEC) / 8;
    const int n = a.n;
    const int STEP = MM_WARPS * MS_WARP;
    float acc[MM_R][NT];
#pragma unroll
    for (int r = 0; r < MM_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    const uint4 *wr[MM_R];
    int64_t srow[MM_R], zrow[MM_R];
    int zsh[MM_R];
    const float *xrow[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) xrow[t] = jb.x + (int64_t)(t < n ? t : 0) * a.cols;
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        int64_t row = row0 + r < rows ? row0 + r : rows - 1; /* clamp: duplicate reads, result dropped */
        wr[r] = (const uint4 *)(jb.w + row * rowbytes);
        srow[r] = (row / a.brow) * a.scols;
        i4_zrow(row, a.scols, &zrow[r], &zsh[r]);
    }
    /* the first chunks of the weights are loaded before the wait (weights are no kernel's output),
     * the activations after it */
    const int kfirst = warp * MS_WARP + lane;
    uint4 raw[U][MM_R];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < MM_R; r++) {
            int k = kfirst + u * STEP;
            raw[u][r] = k < nch ? ms_load_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
        }
    ms_pdl_wait();
    for (int k0 = kfirst; k0 < nch; k0 += U * STEP) {
        if (k0 != kfirst)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < MM_R; r++) {
                    int k = k0 + u * STEP;
                    raw[u][r] = k < nch ? ms_load_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int k = k0 + u * STEP;
            bool live = k < nch;
            int c0 = (live ? k : 0) * VEC; /* a dead chunk decodes zeros against column 0 */
            const bool SCALED = DT == DT_FP8 || DT == DT_F4 || DT == DT_FP8_CVT || DT == DT_I4;
            /* INT4: a dead chunk's zero nibbles, offset by 2^23 alone, decode to 0 (offset by the zero
             * point they would be -uz, and a dead chunk is not scaled) */
            float off[MM_R];
#pragma unroll
            for (int r = 0; r < MM_R; r++)
                off[r] = DT == DT_I4 && live ? i4_off(jb.zero, zrow[r], zsh[r], c0 >> a.bshift) : -8388608.0f;
            float part[MM_R][NT];
#pragma unroll
            for (int r = 0; r < MM_R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++) part[r][t] = 0.0f;
#pragma unroll
            for (int s = 0; s < NSUB; s++) {
                float w[MM_R][SUB];
#pragma unroll
                for (int r = 0; r < MM_R; r++) decode<DT>(raw[u][r], s, w[r], off[r]);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const float4 *xp = (const float4 *)(xrow[t] + c0 + s * SUB);
                    float xv[SUB];
#pragma unroll
                    for (int i = 0; i < SUB / 4; i++) {
                        float4 v = xp[i];
                        xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
                    }
#pragma unroll
                    for (int r = 0; r < MM_R; r++)
#pragma unroll
                        for (int i = 0; i < SUB; i++) {
                            if (SCALED) part[r][t] = fmaf(w[r][i], xv[i], part[r][t]);
                            else acc[r][t] = fmaf(w[r][i], xv[i], acc[r][t]);
                        }
                }
            }
            if (SCALED) {
#pragma unroll
                for (int r = 0; r < MM_R; r++) {
                    float sc = kernel_scale<DT>();
                    if (a.scale_dt != SC_NONE && live) sc *= load_scale(jb.scale, a.scale_dt, srow[r] + (c0 >> a.bshift));
#pragma unroll
                    for (int t = 0; t < NT; t++) acc[r][t] = fmaf(sc, part[r][t], acc[r][t]);
                }
            }
        }
    }
    __shared__ float red[MM_WARPS][MM_R][NT];
#pragma unroll
    for (int r = 0; r < MM_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = ms_warp_sum(acc[r][t]);
            if (lane == 0) red[warp][r][t] = v;
        }
    __syncthreads();
    if (threadIdx.x < MM_R * NT) {
        int r = threadIdx.x / NT, t = threadIdx.x % NT;
        int64_t row = row0 + r;
        if (t < n && row < rows) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < MM_WARPS; w++) v += red[w][r][t];
            float *yp = jb.y + (int64_t)t * rows + row;
            *yp = a.acc ? *yp + v : v;
        }
    }
}

/* Element (row, c) of any supported layout, scale applied. */
static __device__ __forceinline__ float elem(const mm_args &a, const mm_job &jb, int dt, int64_t row, int64_t c) {
    int64_t i = row * a.cols + c;
    float v;
    switch (dt) {
    case DT_F32: return ((const float *)jb.w)[i];
    case DT_F16: return ms_f16_to_f32_dev(((const uint16_t *)jb.w)[i]);
    case DT_BF16: return ms_bf16_to_f32_dev(((const uint16_t *)jb.w)[i]);
    case DT_FP8: v = ms_fp8_e4m3_to_f32_dev(jb.w[i]); break;
    case DT_I4: { /* u - uz, core/qmat.h I4 */
        int64_t zr;
        int zs;
        i4_zrow(row, a.scols, &zr, &zs);
        v = (float)((int)((jb.w[i >> 1] >> ((i & 1) * 4)) & 15u) - i4_uz(jb.zero, zr, zs, c / a.bcol));
        break;
    }
    default: v = ms_e2m1_to_f32((jb.w[i >> 1] >> ((i & 1) * 4)) & 15u); break;
    }
    if (a.scale_dt != SC_NONE) v *= load_scale(jb.scale, a.scale_dt, (row / a.brow) * a.scols + c / a.bcol);
    return v;
}

/* The generic kernel: one warp per row, one column per lane per step. */
__global__ void __launch_bounds__(MM_WARPS *MS_WARP) mm_generic_kernel(const mm_args a, int dt) {
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    ms_pdl_launch();
    ms_pdl_wait();
    const mm_job jb = job_of(a);
    const int64_t rows = jb.rows ? jb.rows : a.rows;
    const int64_t row = (int64_t)blockIdx.x * MM_WARPS + warp;
    if (row >= rows) return;
    float acc[MM_MAXNT];
#pragma unroll
    for (int t = 0; t < MM_MAXNT; t++) acc[t] = 0.0f;
    for (int64_t c = lane; c < a.cols; c += MS_WARP) {
        float w = elem(a, jb, dt, row, c);
#pragma unroll
        for (int t = 0; t < MM_MAXNT; t++)
            if (t < a.n) acc[t] = fmaf(w, jb.x[(int64_t)t * a.cols + c], acc[t]);
    }
#pragma unroll
    for (int t = 0; t < MM_MAXNT; t++) {
        float v = ms_warp_sum(acc[t]);
        if (lane == 0 && t < a.n) {
            float *yp = jb.y + (int64_t)t * rows + row;
            *yp = a.acc ? *yp + v : v;
        }
    }
}

static int kernel_dtype(ms_dtype dt) {
    switch (dt) {
    case MS_DT_F32: return DT_F32;
    case MS_DT_F16: return DT_F16;
    case MS_DT_BF16: return DT_BF16;
    case MS_DT_F8_E4M3: return DT_FP8;
    case MS_DT_F4: return DT_F4;
    case MS_DT_I4: return DT_I4;
    default: return -1;
    }
}

template <int DT>
static void launch_vec(const mm_args &a, int nj, gpuStream_t st, int pdl) {
    dim3 grid = a.nflat ? dim3((unsigned)a.boff[a.nflat]) : dim3((unsigned)((a.rows + MM_R - 1) / MM_R), (unsigned)nj);
    dim3 block(MM_WARPS * MS_WARP);
    if (a.n == 1) ms_launch(pdl, mm_vec_kernel<DT, 1, 2>, grid, block, 0, st, a);
    else if (a.n == 2) ms_launch(pdl, mm_vec_kernel<DT, 2, 2>, grid, block, 0, st, a);
    else if (a.n <= 4) ms_launch(pdl, mm_vec_kernel<DT, 4, 1>, grid, block, 0, st, a);
    else ms_launch(pdl, mm_vec_kernel<DT, 8, 1>, grid, block, 0, st, a);
}

/* Fill the layout fields of a from w. */
static void mm_layout(mm_args &a, const ms_qmat *w, int n, int acc) {
    a.rows = w->rows, a.cols = w->cols, a.n = n, a.acc = acc;
    a.brow = w->scale ? w->brow : 1, a.bcol = w->scale ? w->bcol : 1;
    a.scols = w->scale ? (w->cols + w->bcol - 1) / w->bcol : 0;
    a.scale_dt = !w->scale                          ? SC_NONE
                 : w->scale_dtype == MS_DT_F32  ? SC_F32
                 : w->scale_dtype == MS_DT_BF16 ? SC_BF16
                 : w->scale_dtype == MS_DT_F16  ? SC_F16
                                                : SC_E8M0;
    a.bshift = 0;
    while ((1 << a.bshift) < a.bcol) a.bshift++;
}

/* Launch nj jobs of a (layout of w); aligned: every job's w and x 16-byte aligned. */
static int mm_run(ms_gpu *g, const ms_qmat *w, const mm_args &a, int nj, int aligned, int force_generic, ms_err *err) {
    int dt = kernel_dtype(w->dtype);
    if (dt < 0) /* Q8 reaches here only through the expert paths (matmul_q.cu has the dense products) */
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s weights: the gpu expert FFN does not take them",
                       ms_dtype_name(w->dtype));
    int bits = ms_gpu_dtype_bits(w->dtype), vec = 128 / bits;
    int vec_ok = !force_generic && aligned && w->cols % vec == 0 && w->cols < (INT64_C(1) << 30);
    if (dt == DT_FP8 && w->scale && w->bcol % 16) vec_ok = 0;
    if (dt == DT_I4 && w->bcol % 32) vec_ok = 0; /* a 16-byte chunk (32 values) inside one group */
    if (a.bcol & (a.bcol - 1)) vec_ok = 0; /* the vector kernel shifts by log2(bcol) */
    if (vec_ok) {
        switch (dt) {
        case DT_F32: launch_vec<DT_F32>(a, nj, g->stream, g->pdl); break;
        case DT_F16: launch_vec<DT_F16>(a, nj, g->stream, g->pdl); break;
        case DT_BF16: launch_vec<DT_BF16>(a, nj, g->stream, g->pdl); break;
        case DT_FP8:
            if (fp8_decode_mode()) launch_vec<DT_FP8>(a, nj, g->stream, g->pdl);
            else launch_vec<DT_FP8_CVT>(a, nj, g->stream, g->pdl);
            break;
        case DT_I4: launch_vec<DT_I4>(a, nj, g->stream, g->pdl); break;
        default: launch_vec<DT_F4>(a, nj, g->stream, g->pdl); break;
        }
    } else {
        dim3 grid((unsigned)((a.rows + MM_WARPS - 1) / MM_WARPS), (unsigned)nj);
        ms_launch(g->pdl, mm_generic_kernel, grid, dim3(MM_WARPS * MS_WARP), 0, g->stream, a, dt);
    }
    return ms_gpu_launched(err, vec_ok ? "matmul (vector kernel)" : "matmul (generic kernel)");
}

/* Run nj jobs of one weight layout (w describes dtype/shape/scales; job pointers
 * carry the per-job data), n tokens each (n <= MM_MAXNT). */
static int mm_launch(ms_gpu *g, const ms_qmat *w, mm_job *jobs, int nj, int n, int acc, int force_generic,
                     ms_err *err) {
    mm_args a;
    memset(&a, 0, sizeof a);
    memcpy(a.job, jobs, (size_t)nj * sizeof *jobs);
    mm_layout(a, w, n, acc);
    int aligned = 1;
    for (int j = 0; j < nj && aligned; j++)
        if ((uintptr_t)jobs[j].w % 16 || (uintptr_t)jobs[j].x % 16) aligned = 0;
    int64_t nb = 0; /* the vector kernel's blocks of every job, in one row (fits an int: rows < 2^31 x 4) */
    for (int j = 0; j < nj; j++) {
        a.boff[j] = (int)nb;
        nb += ((jobs[j].rows ? jobs[j].rows : a.rows) + MM_R - 1) / MM_R;
    }
    a.boff[nj] = (int)nb;
    if (nb < INT32_MAX) a.nflat = nj;
    return mm_run(g, w, a, nj, aligned, force_generic, err);
}

static int matmul_impl(ms_gpu *g, float *y, const float *x, int n, const ms_qmat *w, int acc, int force_generic,
                       ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    int rc = ms_gpu_qmat_check(w, "ms_gpu_matmul", err);
    if (rc) return rc;
    if (ms_gpu_is_q(w)) return ms_gpu_matmul_q(g, y, x, n, w, acc, force_generic, err); /* matmul_q.cu */
    if (!y || !x || n < 1) return ms_fail(err, MS_ERR_ARG, "ms_gpu_matmul: need x, y and n >= 1 (n = %d)", n);
    for (int t0 = 0; t0 < n; t0 += MM_MAXNT) {
        int nt = n - t0 < MM_MAXNT ? n - t0 : MM_MAXNT;
        mm_job j = {(const uint8_t *)w->data, (const uint8_t *)w->scale, x + (int64_t)t0 * w->cols,
                    y + (int64_t)t0 * w->rows};
        if ((rc = mm_launch(g, w, &j, 1, nt, acc, force_generic, err))) return rc;
    }
    return MS_OK;
}

extern "C" int ms_gpu_matmul(ms_gpu *g, float *y, const float *x, int n, const ms_qmat *w, int acc, ms_err *err) {
    return matmul_impl(g, y, x, n, w, acc, 0, err);
}

/* Same contract, always the generic kernel (tests compare both paths). */
extern "C" int ms_gpu_matmul_generic(ms_gpu *g, float *y, const float *x, int n, const ms_qmat *w, int acc,
                                     ms_err *err) {
    return matmul_impl(g, y, x, n, w, acc, 1, err);
}

/* Whether b can share a launch with a: the same dtype, columns and scale layout (rows may differ). */
static int mm_compatible(const ms_qmat *a, const ms_qmat *b) {
    return a->dtype == b->dtype && a->cols == b->cols && !a->scale == !b->scale &&
           (!a->scale || (a->scale_dtype == b->scale_dtype && a->brow == b->brow && a->bcol == b->bcol));
}

extern "C" int ms_gpu_matmul_many(ms_gpu *g, const ms_matmul_job *jobs, int count, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    int rc;
    for (int i = 0; i < count; i++) {
        if ((rc = ms_gpu_qmat_check(jobs[i].w, "ms_gpu_matmul_many", err))) return rc;
        if (!jobs[i].y || !jobs[i].x || jobs[i].n < 1)
            return ms_fail(err, MS_ERR_ARG, "ms_gpu_matmul_many: job %d needs x, y and n >= 1", i);
    }
    for (int i0 = 0; i0 < count;) { /* runs of compatible jobs with the same n and acc: one launch per 8 tokens */
        if (ms_gpu_is_q(jobs[i0].w)) { /* matmul_q.cu, one job at a time */
            if ((rc = ms_gpu_matmul_q(g, jobs[i0].y, jobs[i0].x, jobs[i0].n, jobs[i0].w, jobs[i0].acc, 0, err))) return rc;
            i0++;
            continue;
        }
        int i1 = i0 + 1;
        while (i1 < count && i1 - i0 < MM_MAXJ && jobs[i1].n == jobs[i0].n && jobs[i1].acc == jobs[i0].acc &&
               mm_compatible(jobs[i0].w, jobs[i1].w))
            i1++;
        const ms_qmat *w0 = jobs[i0].w; /* the launch's layout: the job of the most rows */
        for (int i = i0; i < i1; i++)
            if (jobs[i].w->rows > w0->rows) w0 = jobs[i].w;
        int n = jobs[i0].n;
        for (int t0 = 0; t0 < n; t0 += MM_MAXNT) {
            int nt = n - t0 < MM_MAXNT ? n - t0 : MM_MAXNT;
            mm_job mj[MM_MAXJ];
            for (int i = i0; i < i1; i++) {
                const ms_qmat *w = jobs[i].w;
                mj[i - i0] = (mm_job){(const uint8_t *)w->data, (const uint8_t *)w->scale,
                                      jobs[i].x + (int64_t)t0 * w->cols, jobs[i].y + (int64_t)t0 * w->rows, w->rows};
            }
            if ((rc = mm_launch(g, w0, mj, i1 - i0, nt, jobs[i0].acc, 0, err))) return rc;
        }
        i0 = i1;
    }
    return MS_OK;
}

/* ------------------------------------------------------------ expert FFN */

#define EX_MAXK 32

typedef struct ex_act_args {
    const void *gbias[EX_MAXK], *ubias[EX_MAXK];
    int64_t inter;
    int fused, bias_bf16, act;
    float limit, alpha;
} ex_act_args;

static __device__ __forceinline__ float bias_at(const void *b, int bf16, int64_t i) {
    if (!b) return 0.0f;
    return bf16 ? ms_bf16_to_f32_dev(((const uint16_t *)b)[i]) : ((const float *)b)[i];
}

/* gpt-oss clamped SwiGLU / (limited) SwiGLU, as engine/moe.c's expert_act. */
static __device__ __forceinline__ float glu(float gt, float up, int act, float limit, float alpha) {
    if (act == MS_GPU_ACT_CLAMPED_SWIGLU) {
        float gg = gt > limit ? limit : gt; /* NaN stays NaN, as torch.clamp */
        float uu = up < -limit ? -limit : up > limit ? limit : up;
        return (uu + 1.0f) * gg * (1.0f / (1.0f + expf(-(alpha * gg))));
    }
    if (limit > 0) {
        if (gt > limit) gt = limit;
        up = up > limit ? limit : up < -limit ? -limit : up;
    }
    return gt / (1.0f + expf(-gt)) * up;
}

/* G [k, 2I] (gate outputs, or the fused interleaved gate_up), U [k, I] (up
 * outputs when not fused) -> H [k, I] into U. */
__global__ void ex_act_kernel(const ex_act_args a, const float *G, float *U) {
    int e = blockIdx.y;
    int64_t I = a.inter;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < I; i += (int64_t)gridDim.x * blockDim.x) {
        float gt, up;
        if (a.fused) {
            gt = G[e * 2 * I + 2 * i] + bias_at(a.gbias[e], a.bias_bf16, 2 * i);
            up = G[e * 2 * I + 2 * i + 1] + bias_at(a.gbias[e], a.bias_bf16, 2 * i + 1);
        } else {
            gt = G[e * 2 * I + i] + bias_at(a.gbias[e], a.bias_bf16, i);
            up = U[e * I + i] + bias_at(a.ubias[e], a.bias_bf16, i);
        }
        U[e * I + i] = glu(gt, up, a.act, a.limit, a.alpha);
    }
}

typedef struct ex_sum_args {
    const void *dbias[EX_MAXK];
    int k, bias_bf16, acc;
    int64_t hidden;
} ex_sum_args;

/* out[d] = (acc ? out[d] : 0) + sum_e w[e] (Y[e, d] + bias_e[d]), experts in order. */
__global__ void ex_sum_kernel(const ex_sum_args a, const float *Y, const float *w, float *out) {
    for (int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; d < a.hidden; d += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int e = 0; e < a.k; e++) s = fmaf(w[e], Y[e * a.hidden + d] + bias_at(a.dbias[e], a.bias_bf16, d), s);
        out[d] = a.acc ? out[d] + s : s;
    }
}

extern "C" size_t ms_gpu_expert_scratch_floats(int k, int64_t inter, int64_t hidden) {
    return (size_t)k * (size_t)(3 * inter + hidden) + 64;
}

static int same_layout(const ms_qmat *a, const ms_qmat *b) {
    return a->dtype == b->dtype && a->rows == b->rows && a->cols == b->cols && !a->scale == !b->scale &&
           (!a->scale || (a->scale_dtype == b->scale_dtype && a->brow == b->brow && a->bcol == b->bcol));
}

extern "C" int ms_gpu_expert_ffn(ms_gpu *g, float *out, const float *x, int k, const ms_gpu_expert *ex,
                                 const float *weights, ms_gpu_act act, float limit, float alpha, float *scratch,
                                 int acc, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!out || !x || !ex || !weights || !scratch)
        return ms_fail(err, MS_ERR_ARG, "ms_gpu_expert_ffn: NULL argument");
    if (k < 1 || k > EX_MAXK) return ms_fail(err, MS_ERR_LIMIT, "ms_gpu_expert_ffn: %d experts (1..%d)", k, EX_MAXK);
    if (act != MS_GPU_ACT_SWIGLU && act != MS_GPU_ACT_CLAMPED_SWIGLU)
        return ms_fail(err, MS_ERR_ARG, "ms_gpu_expert_ffn: unknown activation %d", (int)act);
    int fused = ex[0].up.data == NULL;
    int64_t I = ex[0].down.cols, D = ex[0].down.rows;
    int rc;
    char what[64];
    for (int e = 0; e < k; e++) {
        snprintf(what, sizeof what, "expert %d gate", e);
        if ((rc = ms_gpu_qmat_check(&ex[e].gate, what, err))) return rc;
        snprintf(what, sizeof what, "expert %d down", e);
        if ((rc = ms_gpu_qmat_check(&ex[e].down, what, err))) return rc;
        if ((ex[e].up.data == NULL) != fused)
            return ms_fail(err, MS_ERR_ARG, "expert %d: fused and separate gate/up mixed in one call", e);
        if (!fused) {
            snprintf(what, sizeof what, "expert %d up", e);
            if ((rc = ms_gpu_qmat_check(&ex[e].up, what, err))) return rc;
            if (!same_layout(&ex[e].up, &ex[e].gate))
                return ms_fail(err, MS_ERR_SHAPE, "expert %d: up and gate differ in dtype, shape or scales", e);
        }
        if (ex[e].gate.rows != (fused ? 2 : 1) * I || ex[e].gate.cols != D || ex[e].down.rows != D ||
            ex[e].down.cols != I)
            return ms_fail(err, MS_ERR_SHAPE,
                           "expert %d: gate [%lld, %lld], down [%lld, %lld] do not fit inter %lld, hidden %lld%s", e,
                           (long long)ex[e].gate.rows, (long long)ex[e].gate.cols, (long long)ex[e].down.rows,
                           (long long)ex[e].down.cols, (long long)I, (long long)D, fused ? " (fused gate_up)" : "");
        if (e && (!same_layout(&ex[e].gate, &ex[0].gate) || !same_layout(&ex[e].down, &ex[0].down)))
            return ms_fail(err, MS_ERR_UNSUPPORTED, "expert %d: weights differ in dtype or layout from expert 0", e);
        if ((ex[e].gate_bias || ex[e].up_bias || ex[e].down_bias) && ex[e].bias_dtype != MS_DT_F32 &&
            ex[e].bias_dtype != MS_DT_BF16)
            return ms_fail(err, MS_ERR_UNSUPPORTED, "expert %d: biases of %s (F32 or BF16)", e,
                           ms_dtype_name(ex[e].bias_dtype));
    }
    float *G = scratch, *U = G + (int64_t)k * 2 * I, *Y = U + (int64_t)k * I;
    mm_job jobs[2 * EX_MAXK];
    int nj = 0;
    for (int e = 0; e < k; e++) {
        jobs[nj++] = (mm_job){(const uint8_t *)ex[e].gate.data, (const uint8_t *)ex[e].gate.scale, x, G + e * 2 * I, 0,
                              (const uint8_t *)ex[e].gate.zero};
        if (!fused)
            jobs[nj++] = (mm_job){(const uint8_t *)ex[e].up.data, (const uint8_t *)ex[e].up.scale, x, U + e * I, 0,
                                  (const uint8_t *)ex[e].up.zero};
    }
    /* gate and up share a layout: one launch for both (or the fused rows) */
    if ((rc = mm_launch(g, &ex[0].gate, jobs, nj, 1, 0, 0, err))) return rc;
    ex_act_args aa;
    memset(&aa, 0, sizeof aa);
    aa.inter = I, aa.fused = fused, aa.act = act, aa.limit = limit, aa.alpha = alpha;
    aa.bias_bf16 = ex[0].bias_dtype == MS_DT_BF16;
    for (int e = 0; e < k; e++) aa.gbias[e] = ex[e].gate_bias, aa.ubias[e] = ex[e].up_bias;
    dim3 ga((unsigned)((I + 255) / 256), (unsigned)k);
    ex_act_kernel<<<ga, 256, 0, g->stream>>>(aa, G, U);
    if ((rc = ms_gpu_launched(err, "expert activation"))) return rc;
    nj = 0;
    for (int e = 0; e < k; e++)
        jobs[nj++] = (mm_job){(const uint8_t *)ex[e].down.data, (const uint8_t *)ex[e].down.scale, U + e * I, Y + e * D, 0,
                              (const uint8_t *)ex[e].down.zero};
    if ((rc = mm_launch(g, &ex[0].down, jobs, nj, 1, 0, 0, err))) return rc;
    ex_sum_args sa;
    memset(&sa, 0, sizeof sa);
    sa.k = k, sa.hidden = D, sa.acc = acc, sa.bias_bf16 = aa.bias_bf16;
    for (int e = 0; e < k; e++) sa.dbias[e] = ex[e].down_bias;
    ex_sum_kernel<<<(unsigned)((D + 255) / 256), 256, 0, g->stream>>>(sa, Y, weights, out);
    return ms_gpu_launched(err, "expert weighted sum");
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

/* acc[r] += the lane's share of row r of chunks k (a chunk: VEC columns at c0), as mm_vec_kernel;
 * INT4: row r's zero points zp[r] (NULL: symmetric), its first zero word zrow[r], nibble shift zsh[r]. */
template <int DT>
static __device__ __forceinline__ void rx_chunk(const uint4 (&raw)[MM_R], const float *xp, const uint8_t *const (&sp)[MM_R],
                                                const int64_t (&srow)[MM_R], int c0, int scale_dt, int bshift,
                                                float (&acc)[MM_R], const uint8_t *const (&zp)[MM_R],
                                                const int64_t (&zrow)[MM_R], const int (&zsh)[MM_R]) {
    typedef mm_traits<DT> T;
    const int SUB = T::SUB, NSUB = T::VEC / T::SUB;
    const bool SCALED = DT == DT_FP8 || DT == DT_F4 || DT == DT_FP8_CVT || DT == DT_I4;
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

template <int DT>
__global__ void __launch_bounds__(MM_WARPS *MS_WARP) rx_down_kernel(const rx_args a) {
    typedef mm_traits<DT> T;
    const int VEC = T::VEC, STEP = MM_WARPS * MS_WARP, U = 2;
    __shared__ int ord[32];
    __shared__ const uint8_t *sw[32], *ss[32], *sz[32];
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

/* Whether the vector kernel takes a matrix of w's layout over a 16-byte aligned x (as mm_run). */
static int vec_layout_ok(const ms_qmat *w) {
    int bits = ms_gpu_dtype_bits(w->dtype), vec = bits ? 128 / bits : 0;
    if (!vec || w->cols % vec || w->cols >= (INT64_C(1) << 30)) return 0;
    if (w->dtype == MS_DT_F8_E4M3 && w->scale && w->bcol % 16) return 0;
    if (w->dtype == MS_DT_I4 && w->bcol % 32) return 0;
    if (w->scale && (w->bcol & (w->bcol - 1))) return 0;
    return 1;
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

/* ------------------------------------------------------------ router + routing (decode) */

/* logits [E] = router x for one token (rows as the vector kernel: MM_R per block, the warps
 * over the columns), then the last block to finish (an arrival counter) routes them with
 * route_block_token (route_warp.h: the ids and weights of route_warp_token, the top-k by ranks
 * over the block's threads): one launch instead of the matmul's and the route's. */
typedef struct rr_args {
    const uint8_t *w, *scale;
    const float *x, *bias;
    float *logits, *wout;
    int32_t *ids;
    int *cnt;
    int64_t rows, cols, scols;
    int brow, bshift, scale_dt;
    ms_gpu_route_cfg c;
} rr_args;

template <int DT>
__global__ void __launch_bounds__(MM_WARPS *MS_WARP) rr_kernel(const rr_args a) {
    typedef mm_traits<DT> T;
    const int VEC = T::VEC, STEP = MM_WARPS * MS_WARP, U = 2;
    const int64_t row0 = (int64_t)blockIdx.x * MM_R;
    const int64_t nch = a.cols / VEC, rowbytes = a.cols * (128 / VEC) / 8;
    ms_pdl_launch();
    const uint4 *wr[MM_R];
    const uint8_t *sp[MM_R], *zp[MM_R] = {NULL, NULL, NULL, NULL}; /* no INT4 routers (ms_gpu_router_route) */
    int64_t srow[MM_R], zrow[MM_R] = {0, 0, 0, 0};
    int zsh[MM_R] = {0, 0, 0, 0};
#pragma unroll
    for (int r = 0; r < MM_R; r++) {
        int64_t row = row0 + r < a.rows ? row0 + r : a.rows - 1;
        wr[r] = (const uint4 *)(a.w + row * rowbytes);
        sp[r] = a.scale;
        srow[r] = (row / a.brow) * a.scols;
    }
    float acc[MM_R] = {0.0f, 0.0f, 0.0f, 0.0f};
    /* the first chunks of the router's rows before the wait (all of them for rows of up to
     * 2 x 128 chunks), x after it */
    uint4 raw[U][MM_R];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < MM_R; r++) {
            int64_t k = threadIdx.x + u * STEP;
            raw[u][r] = k < nch ? ms_load_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
        }
    ms_pdl_wait();
    for (int64_t k0 = threadIdx.x; k0 < nch; k0 += U * STEP) {
        if (k0 != (int64_t)threadIdx.x)
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
    if (threadIdx.x < MM_R && row0 + threadIdx.x < a.rows) {
        float v = 0.0f;
        for (int w = 0; w < MM_WARPS; w++) v += red[w][threadIdx.x];
        a.logits[row0 + threadIdx.x] = v;
    }
    __shared__ int last;
    __shared__ float lg[RT_MAXE], scores[RT_MAXE], choice[RT_MAXE];
    __shared__ unsigned char taken[RT_MAXE];
    __shared__ int ids[RT_MAXK];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(a.cnt, 1) == (int)gridDim.x - 1;
        if (last) *a.cnt = 0; /* ready for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int64_t i = threadIdx.x; i < a.rows; i += blockDim.x) lg[i] = ms_load_cg(a.logits + i);
    __syncthreads();
    route_block_token(a.ids, a.wout, lg, a.bias, a.c, scores, choice, taken, ids);
}

/* The default router + route kernel: a block per router row (the logit of expert blockIdx.x), its
 * threads over the row's 16-byte chunks (RR1_U per thread in one round: every chunk of rows up to
 * RR1_U x 512 chunks loaded by its own lane, all loads issued before the wait and before any use),
 * so the whole router is in flight in one wave of E blocks; the row's dot in a fixed order (a
 * thread's chunks in column order, the warp's butterfly, the warps in order), written by thread 0,
 * which counts the block's arrival; the last block loads the E logits and routes them with
 * route_block_ranked (route_block_token's ids and weights). Neither the arrival order nor eager /
 * recorded / replayed changes a bit. MS_GPU_ROUTER=old: rr_kernel above. */
#define RR1_U 4
#define RR1_MAXT 512
template <int DT>
__global__ void __launch_bounds__(RR1_MAXT) rr1_kernel(const rr_args a) {
    typedef mm_traits<DT> T;
    const int VEC = T::VEC, SUB = T::SUB, NSUB = VEC / SUB, U = RR1_U;
    const bool SCALED = DT == DT_FP8 || DT == DT_F4 || DT == DT_FP8_CVT;
    const int64_t row = blockIdx.x, nch = a.cols / VEC, rowbytes = a.cols * (128 / VEC) / 8;
    const int tid = (int)threadIdx.x, nt = (int)blockDim.x;
    ms_pdl_launch();
    const uint4 *wr = (const uint4 *)(a.w + row * rowbytes);
    const int64_t srow = (row / a.brow) * a.scols;
    uint4 raw[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t k = tid + (int64_t)u * nt;
        raw[u] = k < nch ? ms_load_stream16(wr + k) : make_uint4(0, 0, 0, 0);
    }
    ms_pdl_wait(); /* x is the previous kernel's output */
    float acc = 0.0f;
    for (int64_t k0 = tid; k0 < nch; k0 += (int64_t)U * nt) {
        if (k0 != tid)
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t k = k0 + (int64_t)u * nt;
                raw[u] = k < nch ? ms_load_stream16(wr + k) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t k = k0 + (int64_t)u * nt;
            if (k >= nch) continue;
            const int c0 = (int)(k * VEC);
            float part = 0.0f;
#pragma unroll
            for (int s = 0; s < NSUB; s++) {
                float w[SUB], xv[SUB];
                decode<DT>(raw[u], s, w, 0.0f);
                const float4 *x4 = (const float4 *)(a.x + c0 + s * SUB);
#pragma unroll
                for (int i = 0; i < SUB / 4; i++) {
                    const float4 v = x4[i];
                    xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
                }
#pragma unroll
                for (int i = 0; i < SUB; i++) {
                    if (SCALED) part = fmaf(w[i], xv[i], part);
                    else acc = fmaf(w[i], xv[i], acc);
                }
            }
            if (SCALED) {
                float sc = kernel_scale<DT>();
                if (a.scale_dt != SC_NONE) sc *= load_scale(a.scale, a.scale_dt, srow + (c0 >> a.bshift));
                acc = fmaf(sc, part, acc);
            }
        }
    }
    __shared__ float red[RR1_MAXT / MS_WARP];
    __shared__ int last;
    __shared__ __align__(16) float lg[RT_MAXE], scores[RT_MAXE], choice[RT_MAXE];
    __shared__ unsigned char taken[RT_MAXE];
    __shared__ int ids[RT_MAXK];
    const float v = ms_warp_sum(acc);
    if (tid % MS_WARP == 0) red[tid / MS_WARP] = v;
    __syncthreads();
    if (tid == 0) {
        float y = 0.0f;
        for (int w = 0; w < nt / MS_WARP; w++) y += red[w];
        a.logits[row] = y;
        __threadfence();
        last = atomicAdd(a.cnt, 1) == (int)gridDim.x - 1;
        if (last) *a.cnt = 0; /* ready for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int E = (int)a.rows, epad = route_rank_pad(E, nt);
    for (int i = tid; i < epad; i += nt) {
        const float l = i < E ? ms_load_cg(a.logits + i) : NAN;
        lg[i] = l;
        if (i >= E) scores[i] = choice[i] = NAN; /* the rank pads (route_block_ranked) */
    }
    __syncthreads();
    route_block_ranked(a.ids, a.wout, lg, a.bias, a.c, scores, choice, taken, ids);
}

/* rr1_kernel's block size: every chunk of a row by its own lane up to 256 chunks (more chunks
 * per thread past that, RR1_U a round), at least one thread per expert for the ranks up to
 * RR1_MAXT, a whole number of warps. */
static unsigned rr1_threads(int64_t nch, int64_t E) {
    int64_t t = nch < 256 ? nch : 256;
    if (t < E) t = E;
    if (t > RR1_MAXT) t = RR1_MAXT;
    t = (t + MS_WARP - 1) / MS_WARP * MS_WARP;
    return (unsigned)(t < MS_WARP ? MS_WARP : t);
}

extern "C" int ms_gpu_router_route(ms_gpu *g, int32_t *ids, float *weights, float *logits, const float *x,
                                   const ms_qmat *router, const float *bias, const ms_gpu_route_cfg *c, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    int rc = ms_gpu_qmat_check(router, "ms_gpu_router_route", err);
    if (rc) return rc;
    if (!ids || !weights || !logits || !x || !c) return ms_fail(err, MS_ERR_ARG, "ms_gpu_router_route: NULL argument");
    int kind_ok = c->kind == MS_GPU_ROUTER_SOFTMAX || c->kind == MS_GPU_ROUTER_TOPK_SOFTMAX ||
                  (c->kind == MS_GPU_ROUTER_SIGMOID && c->n_group <= 1);
    int dt = kernel_dtype(router->dtype);
    if ((g->legacy & MS_GPU_LEG_ROUTER) || !kind_ok || dt < 0 || dt == DT_I4 || c->n_experts != router->rows ||
        c->n_experts > RT_MAXE || c->top_k < 1 || c->top_k > RT_MAXK || c->top_k > c->n_experts || (uintptr_t)x % 16 ||
        (uintptr_t)router->data % 16 || !vec_layout_ok(router))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "ms_gpu_router_route: not this router (kind %d, %lld rows, top %d)",
                       (int)c->kind, (long long)router->rows, c->top_k);
    rr_args a;
    memset(&a, 0, sizeof a);
    mm_args m;
    memset(&m, 0, sizeof m);
    mm_layout(m, router, 1, 0);
    a.w = (const uint8_t *)router->data, a.scale = (const uint8_t *)router->scale, a.x = x, a.bias = bias;
    a.logits = logits, a.wout = weights, a.ids = ids, a.rows = m.rows, a.cols = m.cols, a.scols = m.scols;
    a.brow = m.brow, a.bshift = m.bshift, a.scale_dt = m.scale_dt, a.c = *c;
    if (!(a.cnt = ms_gpu_counters(g, 1, err))) return err ? err->code : MS_ERR_NOMEM;
    if (!g->router_old) {
        const int64_t vec = dt == DT_F32 ? 4 : dt == DT_F4 ? 32 : dt == DT_F16 || dt == DT_BF16 ? 8 : 16;
        dim3 grid((unsigned)a.rows), th1(rr1_threads(a.cols / vec, a.rows));
        switch (dt) {
        case DT_F32: ms_launch(g->pdl, rr1_kernel<DT_F32>, grid, th1, 0, g->stream, a); break;
        case DT_F16: ms_launch(g->pdl, rr1_kernel<DT_F16>, grid, th1, 0, g->stream, a); break;
        case DT_BF16: ms_launch(g->pdl, rr1_kernel<DT_BF16>, grid, th1, 0, g->stream, a); break;
        case DT_FP8:
            if (fp8_decode_mode()) ms_launch(g->pdl, rr1_kernel<DT_FP8>, grid, th1, 0, g->stream, a);
            else ms_launch(g->pdl, rr1_kernel<DT_FP8_CVT>, grid, th1, 0, g->stream, a);
            break;
        default: ms_launch(g->pdl, rr1_kernel<DT_F4>, grid, th1, 0, g->stream, a); break;
        }
        return ms_gpu_launched(err, "router + route");
    }
    unsigned blocks = (unsigned)((a.rows + MM_R - 1) / MM_R);
    dim3 th(MM_WARPS * MS_WARP);
    switch (kernel_dtype(router->dtype)) {
    case DT_F32: ms_launch(g->pdl, rr_kernel<DT_F32>, dim3(blocks), th, 0, g->stream, a); break;
    case DT_F16: ms_launch(g->pdl, rr_kernel<DT_F16>, dim3(blocks), th, 0, g->stream, a); break;
    case DT_BF16: ms_launch(g->pdl, rr_kernel<DT_BF16>, dim3(blocks), th, 0, g->stream, a); break;
    case DT_FP8:
        if (fp8_decode_mode()) ms_launch(g->pdl, rr_kernel<DT_FP8>, dim3(blocks), th, 0, g->stream, a);
        else ms_launch(g->pdl, rr_kernel<DT_FP8_CVT>, dim3(blocks), th, 0, g->stream, a);
        break;
    default: ms_launch(g->pdl, rr_kernel<DT_F4>, dim3(blocks), th, 0, g->stream, a); break;
    }
    return ms_gpu_launched(err, "router + route");
}
