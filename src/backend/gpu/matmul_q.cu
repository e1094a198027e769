/* matmul_q.cu — y = W x for the integer block formats: Q8 (the requantized static tier,
 * int8 with a scale per 1 x bcol block) and I4 (compressed-tensors pack-quantized INT4,
 * value (u - uz) x scale per 1 x bcol group, uz the group's zero point when asymmetric, else
 * 8), layouts in core/qmat.h. Contracts in gpu.h (ms_gpu_matmul_q); matmul.cu hands the dense
 * INT4 products here (its own kernels take INT4 routed experts, and Q8: ms_gpu_matmul no longer
 * calls this for Q8, whose products run in matmul.cu's vector kernel with PDL and batched jobs).
 *
 * One warp per row, four rows per block. The vector kernel loads 16 bytes per lane per
 * step (16 Q8 values, 32 I4 values), coalesced across the warp; a chunk lies inside one
 * scale block (bcol a multiple of 16 for Q8, 32 for I4), so the block scale multiplies the
 * chunk's partial sum once per token. Rows whose bytes are not a multiple of 16, unaligned
 * w or x, or other block widths take the generic kernel (one element per lane per step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gpu_internal.h"

#define MQ_WARPS 4
#define MQ_MAXNT 8

enum { MQ_Q8 = 0, MQ_I4 = 1 };
enum { MQS_F32 = 0, MQS_BF16 = 1, MQS_F16 = 2 };

typedef struct {
    const uint8_t *w, *s, *z; /* z: I4 zero points (core/qmat.h), NULL: symmetric */
    const float *x;
    float *y;
    int64_t rows, cols, scols; /* scols: scale columns per row */
    int bcol, sdt, n, acc;
} mq_args;

static __device__ __forceinline__ float mq_scale(const mq_args &a, int64_t row, int64_t c) {
    int64_t i = row * a.scols + c / a.bcol;
    if (a.sdt == MQS_F32) return ((const float *)a.s)[i];
    if (a.sdt == MQS_BF16) return ms_bf16_to_f32_dev(((const uint16_t *)a.s)[i]);
    return ms_f16_to_f32_dev(((const uint16_t *)a.s)[i]);
}

/* The I4 zero point uz of row row, group g (8 without zero points). */
static __device__ __forceinline__ int mq_uz(const mq_args &a, int64_t row, int64_t g) {
    if (!a.z) return 8;
    return (int)((((const uint32_t *)a.z)[(row >> 3) * a.scols + g] >> (4 * (row & 7))) & 15u);
}

static __device__ __forceinline__ float mq_elem(const mq_args &a, int dt, int64_t row, int64_t c) {
    int64_t i = row * a.cols + c;
    float v = dt == MQ_Q8 ? (float)(int8_t)a.w[i]
                          : (float)((int)((a.w[i >> 1] >> ((i & 1) * 4)) & 15u) - mq_uz(a, row, c / a.bcol));
    return v * mq_scale(a, row, c);
}

__global__ void __launch_bounds__(MQ_WARPS *MS_WARP) mq_generic_kernel(const mq_args a, int dt) {
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    const int64_t row = (int64_t)blockIdx.x * MQ_WARPS + warp;
    if (row >= a.rows) return;
    float acc[MQ_MAXNT];
#pragma unroll
    for (int t = 0; t < MQ_MAXNT; t++) acc[t] = 0.0f;
    for (int64_t c = lane; c < a.cols; c += MS_WARP) {
        float w = mq_elem(a, dt, row, c);
#pragma unroll
        for (int t = 0; t < MQ_MAXNT; t++)
            if (t < a.n) acc[t] = fmaf(w, a.x[(int64_t)t * a.cols + c], acc[t]);
    }
#pragma unroll
    for (int t = 0; t < MQ_MAXNT; t++) {
        float v = ms_warp_sum(acc[t]);
        if (lane == 0 && t < a.n) {
            float *yp = a.y + (int64_t)t * a.rows + row;
            *yp = a.acc ? *yp + v : v;
        }
    }
}

/* The 16 (Q8) or 32 (I4, u - uz) values of one 16-byte chunk, dotted with x[t] from column c0. */
template <int DT, int NT>
static __device__ __forceinline__ void mq_chunk(const uint4 &raw, const mq_args &a, int64_t c0, float s, int uz,
                                                float *acc) {
    const uint32_t q[4] = {raw.x, raw.y, raw.z, raw.w};
    const int VEC = DT == MQ_Q8 ? 16 : 32;
    float w[VEC];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (DT == MQ_Q8) {
#pragma unroll
            for (int b = 0; b < 4; b++) w[4 * i + b] = (float)(int8_t)(q[i] >> (8 * b));
        } else {
#pragma unroll
            for (int b = 0; b < 8; b++) w[8 * i + b] = (float)((int)((q[i] >> (4 * b)) & 15u) - uz);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < a.n) {
            const float4 *xp = (const float4 *)(a.x + (int64_t)t * a.cols + c0);
            float p = 0.0f;
#pragma unroll
            for (int k = 0; k < VEC / 4; k++) {
                float4 xv = xp[k];
                p = fmaf(w[4 * k], xv.x, p);
                p = fmaf(w[4 * k + 1], xv.y, p);
                p = fmaf(w[4 * k + 2], xv.z, p);
                p = fmaf(w[4 * k + 3], xv.w, p);
            }
            acc[t] = fmaf(p, s, acc[t]);
        }
    }
}

template <int DT, int NT>
__global__ void __launch_bounds__(MQ_WARPS *MS_WARP) mq_vec_kernel(const mq_args a) {
    const int VEC = DT == MQ_Q8 ? 16 : 32;
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    const int64_t row = (int64_t)blockIdx.x * MQ_WARPS + warp;
    if (row >= a.rows) return;
    const int64_t nch = a.cols / VEC, rowbytes = a.cols * (DT == MQ_Q8 ? 8 : 4) / 8;
    const uint4 *wr = (const uint4 *)(a.w + row * rowbytes);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t ch = lane; ch < nch; ch += MS_WARP) {
        const uint4 raw = wr[ch];
        const int64_t c0 = ch * VEC;
        mq_chunk<DT, NT>(raw, a, c0, mq_scale(a, row, c0), DT == MQ_I4 ? mq_uz(a, row, c0 / a.bcol) : 0, acc);
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = ms_warp_sum(acc[t]);
        if (lane == 0 && t < a.n) {
            float *yp = a.y + (int64_t)t * a.rows + row;
            *yp = a.acc ? *yp + v : v;
        }
    }
}

template <int DT>
static void mq_launch_vec(const mq_args &a, gpuStream_t st) {
    dim3 grid((unsigned)((a.rows + MQ_WARPS - 1) / MQ_WARPS)), block(MQ_WARPS * MS_WARP);
    if (a.n == 1) mq_vec_kernel<DT, 1><<<grid, block, 0, st>>>(a);
    else if (a.n == 2) mq_vec_kernel<DT, 2><<<grid, block, 0, st>>>(a);
    else if (a.n <= 4) mq_vec_kernel<DT, 4><<<grid, block, 0, st>>>(a);
    else mq_vec_kernel<DT, 8><<<grid, block, 0, st>>>(a);
}

extern "C" int ms_gpu_qmat_check_q(const ms_qmat *w, const char *what, ms_err *err) {
    const int i4 = w->dtype == MS_DT_I4;
    if (w->dtype != MS_DT_Q8 && !i4)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: dtype %s is not Q8 or I4", what, ms_dtype_name(w->dtype));
    if (!w->scale || w->brow != 1 || w->bcol < 1 || (i4 && (w->cols % 8 || w->bcol % 8)) ||
        (w->scale_dtype != MS_DT_F32 && w->scale_dtype != MS_DT_BF16 && (!i4 || w->scale_dtype != MS_DT_F16)))
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: %s needs a scale per 1 x bcol block (%dx%d) of %s", what, ms_dtype_name(w->dtype), w->brow,
                       w->bcol, i4 ? "F32, BF16 or F16, and cols and bcol multiples of 8" : "F32 or BF16");
    return MS_OK;
}

extern "C" int ms_gpu_matmul_q(ms_gpu *g, float *y, const float *x, int n, const ms_qmat *w, int acc,
                               int force_generic, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    int rc = ms_gpu_qmat_check_q(w, "ms_gpu_matmul", err);
    if (rc) return rc;
    if (!y || !x || n < 1) return ms_fail(err, MS_ERR_ARG, "ms_gpu_matmul: need x, y and n >= 1 (n = %d)", n);
    const int dt = w->dtype == MS_DT_Q8 ? MQ_Q8 : MQ_I4, vec = dt == MQ_Q8 ? 16 : 32;
    for (int t0 = 0; t0 < n; t0 += MQ_MAXNT) {
        mq_args a;
        memset(&a, 0, sizeof a);
        a.w = (const uint8_t *)w->data, a.s = (const uint8_t *)w->scale;
        a.z = w->dtype == MS_DT_I4 ? (const uint8_t *)w->zero : NULL;
        a.x = x + (int64_t)t0 * w->cols, a.y = y + (int64_t)t0 * w->rows;
        a.rows = w->rows, a.cols = w->cols, a.bcol = w->bcol, a.scols = (w->cols + w->bcol - 1) / w->bcol;
        a.sdt = w->scale_dtype == MS_DT_F32 ? MQS_F32 : w->scale_dtype == MS_DT_BF16 ? MQS_BF16 : MQS_F16;
        a.n = n - t0 < MQ_MAXNT ? n - t0 : MQ_MAXNT, a.acc = acc;
        const int vec_ok = !force_generic && w->cols % vec == 0 && w->bcol % vec == 0 && (uintptr_t)a.w % 16 == 0 &&
                           (uintptr_t)a.x % 16 == 0;
        if (vec_ok) {
            if (dt == MQ_Q8) mq_launch_vec<MQ_Q8>(a, g->stream);
            else mq_launch_vec<MQ_I4>(a, g->stream);
        } else {
            mq_generic_kernel<<<(unsigned)((a.rows + MQ_WARPS - 1) / MQ_WARPS), MQ_WARPS * MS_WARP, 0, g->stream>>>(a, dt);
        }
        if ((rc = ms_gpu_launched(err, vec_ok ? "matmul Q8/I4 (vector kernel)" : "matmul Q8/I4 (generic kernel)")))
            return rc;
    }
    return MS_OK;
}
