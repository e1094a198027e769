/* matmul.cu — y = W x for weights in their stored dtype (F32, F16, BF16, FP8
 * E4M3 with block scales, MXFP4, INT4, Q8 with block scales), small token counts (decode), and the expert
 * FFN of one token built on it (contracts in gpu.h). Dense INT4 products go to
 * matmul_q.cu; the routed-expert decode kernels (ms_gpu_moe_routed, INT4 for Kimi K2 / K2.5) to
 * matmul_routed.cu, with what both share in matmul_internal.h.
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
 * per 32-column group; Q8 by a byte permute into a float's mantissa (decode<DT_Q8>), the
 * block scale once per 16-column chunk; INT4 (compressed-tensors pack-quantized, core/qmat.h I4) by
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

#include "backend/gpu/matmul_internal.h"
#include "backend/gpu/route_warp.h"

/* FP8 decode of the vector kernel: 0 = hardware pair conversion then F16->F32
 * conversions (DT_FP8_CVT, measured faster on H200), 1 = shifts (DT_FP8);
 * MS_GPU_FP8_DECODE=shift selects the latter (for measurements). */
int fp8_decode_mode(void) {
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("MS_GPU_FP8_DECODE");
        mode = e && !strcmp(e, "shift") ? 1 : 0;
    }
    return mode;
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
            const bool SCALED = DT == DT_FP8 || DT == DT_F4 || DT == DT_FP8_CVT || DT == DT_I4 || DT == DT_Q8;
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
    case DT_Q8: v = (float)(int8_t)jb.w[i]; break;
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

int kernel_dtype(ms_dtype dt) {
    switch (dt) {
    case MS_DT_F32: return DT_F32;
    case MS_DT_F16: return DT_F16;
    case MS_DT_BF16: return DT_BF16;
    case MS_DT_F8_E4M3: return DT_FP8;
    case MS_DT_F4: return DT_F4;
    case MS_DT_I4: return DT_I4;
    case MS_DT_Q8: return DT_Q8;
    default: return -1;
    }
}

/* u4: one token's rows of more than 2 x 128 chunks with 4 chunks per lane a round (the default;
 * MS_GPU_MV_U=2: 2; o_proj's 4096 BF16 columns in one round, all its loads issued before the PDL
 * wait); a lane's chunks are summed in the same order either way (the same bits for finite x). */
template <int DT>
static void launch_vec(const mm_args &a, int nj, gpuStream_t st, int pdl, int u4) {
    dim3 grid = a.nflat ? dim3((unsigned)a.boff[a.nflat]) : dim3((unsigned)((a.rows + MM_R - 1) / MM_R), (unsigned)nj);
    dim3 block(MM_WARPS * MS_WARP);
    if (a.n == 1 && u4 && a.cols / mm_traits<DT>::VEC > 2 * MM_WARPS * MS_WARP)
        ms_launch(pdl, mm_vec_kernel<DT, 1, 4>, grid, block, 0, st, a);
    else if (a.n == 1) ms_launch(pdl, mm_vec_kernel<DT, 1, 2>, grid, block, 0, st, a);
    else if (a.n == 2) ms_launch(pdl, mm_vec_kernel<DT, 2, 2>, grid, block, 0, st, a);
    else if (a.n <= 4) ms_launch(pdl, mm_vec_kernel<DT, 4, 1>, grid, block, 0, st, a);
    else ms_launch(pdl, mm_vec_kernel<DT, 8, 1>, grid, block, 0, st, a);
}

/* Fill the layout fields of a from w. */
void mm_layout(mm_args &a, const ms_qmat *w, int n, int acc) {
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
int mm_run(ms_gpu *g, const ms_qmat *w, const mm_args &a, int nj, int aligned, int force_generic, ms_err *err) {
    int dt = kernel_dtype(w->dtype);
    if (dt < 0)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s weights: the gpu expert FFN does not take them",
                       ms_dtype_name(w->dtype));
    int bits = ms_gpu_dtype_bits(w->dtype), vec = 128 / bits;
    int vec_ok = !force_generic && aligned && w->cols % vec == 0 && w->cols < (INT64_C(1) << 30);
    if (dt == DT_FP8 && w->scale && w->bcol % 16) vec_ok = 0;
    if (dt == DT_I4 && w->bcol % 32) vec_ok = 0; /* a 16-byte chunk (32 values) inside one group */
    if (dt == DT_Q8 && w->bcol % 16) vec_ok = 0; /* a 16-byte chunk (16 values) inside one scale block */
    if (a.bcol & (a.bcol - 1)) vec_ok = 0; /* the vector kernel shifts by log2(bcol) */
    if (vec_ok) {
        switch (dt) {
        case DT_F32: launch_vec<DT_F32>(a, nj, g->stream, g->pdl, g->mv_u4); break;
        case DT_F16: launch_vec<DT_F16>(a, nj, g->stream, g->pdl, g->mv_u4); break;
        case DT_BF16: launch_vec<DT_BF16>(a, nj, g->stream, g->pdl, g->mv_u4); break;
        case DT_FP8:
            if (fp8_decode_mode()) launch_vec<DT_FP8>(a, nj, g->stream, g->pdl, g->mv_u4);
            else launch_vec<DT_FP8_CVT>(a, nj, g->stream, g->pdl, g->mv_u4);
            break;
        case DT_I4: launch_vec<DT_I4>(a, nj, g->stream, g->pdl, g->mv_u4); break;
        case DT_Q8: launch_vec<DT_Q8>(a, nj, g->stream, g->pdl, g->mv_u4); break;
        default: launch_vec<DT_F4>(a, nj, g->stream, g->pdl, g->mv_u4); break;
        }
    } else {
        dim3 grid((unsigned)((a.rows + MM_WARPS - 1) / MM_WARPS), (unsigned)nj);
        ms_launch(g->pdl, mm_generic_kernel, grid, dim3(MM_WARPS * MS_WARP), 0, g->stream, a, dt);
    }
    return ms_gpu_launched(err, vec_ok ? "matmul (vector kernel)" : "matmul (generic kernel)");
}

/* Whether the vector kernel takes a matrix of w's layout over a 16-byte aligned x (as mm_run). */
int vec_layout_ok(const ms_qmat *w) {
    int bits = ms_gpu_dtype_bits(w->dtype), vec = bits ? 128 / bits : 0;
    if (!vec || w->cols % vec || w->cols >= (INT64_C(1) << 30)) return 0;
    if (w->dtype == MS_DT_F8_E4M3 && w->scale && w->bcol % 16) return 0;
    if (w->dtype == MS_DT_I4 && w->bcol % 32) return 0;
    if (w->dtype == MS_DT_Q8 && (!w->scale || w->bcol % 16)) return 0;
    if (w->scale && (w->bcol & (w->bcol - 1))) return 0;
    return 1;
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
    if (w->dtype == MS_DT_I4 || (w->dtype == MS_DT_Q8 && g->q8_old)) /* matmul_q.cu */
        return ms_gpu_matmul_q(g, y, x, n, w, acc, force_generic, err);
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
        if (jobs[i0].w->dtype == MS_DT_I4 || (jobs[i0].w->dtype == MS_DT_Q8 && g->q8_old)) { /* matmul_q.cu, one job at a time */
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
    if ((g->legacy & MS_GPU_LEG_ROUTER) || !kind_ok || dt < 0 || dt == DT_I4 || dt == DT_Q8 || c->n_experts != router->rows ||
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
