/* gpu_internal.h — shared by the backend's .cu files only (not a public interface). */
#ifndef MS_GPU_INTERNAL_H
#define MS_GPU_INTERNAL_H

#include "backend/gpu/gpu_port.h"

/* the C library's headers, with C linkage (ops.h, included by gpu.h, then finds them guarded) */
#include <math.h> /* before the extern "C" block: C++'s math overloads must keep C++ linkage */
#include <string.h>
extern "C" {
#include "util/dtype.h"
#include "util/err.h"
#include "ops/ops.h"
}
#include "backend/gpu/gpu.h"

/* A bias element (dt 0 F32, 1 BF16, 2 F16); 0 when b is NULL. */
static __device__ __forceinline__ float ms_bias_at(const void *b, int dt, int64_t i) {
    if (!b) return 0.0f;
    return dt == 0   ? ((const float *)b)[i]
           : dt == 1 ? ms_bf16_to_f32_dev(((const uint16_t *)b)[i])
                     : ms_f16_to_f32_dev(((const uint16_t *)b)[i]);
}
/* The gated activation act(x, y) of the backend's glu op (core/backend.h ms_glu), the same arithmetic. */
static __device__ __forceinline__ float ms_glu_apply(float x, float y, const ms_gpu_glu_params &p) {
    if (p.situ) {
        float a = p.beta * tanhf(x / p.beta) * (1.0f / (1.0f + expf(-x)));
        if (p.linear_beta > 0) y = p.linear_beta * tanhf(y / p.linear_beta);
        return a * y;
    }
    if (p.limit > 0) {
        if (x > p.limit) x = p.limit; /* NaN stays NaN, as torch.clamp */
        y = y > p.limit ? p.limit : y < -p.limit ? -p.limit : y;
    }
    if (p.alpha == 1.0f && p.up_offset == 0.0f) return x / (1.0f + expf(-x)) * y;
    return (y + p.up_offset) * x * (1.0f / (1.0f + expf(-(p.alpha * x))));
}

struct ms_gpu {
    int device;
    gpuStream_t stream;
    gpuEvent_t ev0, ev1;
    gpuDeviceProp prop;
    int *cnt;  /* arrival counters of the last-block patterns (zero between launches), cnt_n of them */
    int cnt_n;
    int legacy; /* MS_GPU_LEGACY_DECODE at open (A/B measurements): "1" or "all" every earlier decode kernel,
                 * else a comma list of experts, route, norm, router (MS_GPU_LEG_* bits) */
    int attn_mode; /* MS_GPU_ATTN at open (A/B measurements): MS_GPU_ATTN_* below */
    int attn_splits; /* MS_GPU_ATTN_SPLITS at open: the decode kernel's splits at most (0: MS_GPU_ATTN_MAXS) */
    int qkv_attn; /* the replayable step's qkv_at folded into the decode attention kernel's prologue (backend
                   * qkv_attn_at); MS_GPU_QKV_ATTN=0 at open (A/B measurements): qkv_at, then the attention */
    int mv_u4; /* one token's wide rows (over 256 chunks) with 4 chunks per lane a round in matmul.cu's vector
                * kernel; MS_GPU_MV_U=2 at open (A/B measurements): 2 for every row */
    int argmax_blocks; /* the greedy pick by a block per 1024 values and a 64-bit max (backend_gpu_step.cu);
                        * MS_GPU_ARGMAX_BLOCKS=0 at open (A/B measurements): one block of 1024 threads */
    int q8_old; /* MS_GPU_Q8=old at open (A/B measurements): Q8 matvecs through matmul_q.cu's warp-per-row kernel
                 * (no PDL, one job a launch) instead of matmul.cu's vector kernel (DT_Q8) */
    int router_old; /* MS_GPU_ROUTER=old at open (A/B measurements): ms_gpu_router_route's earlier kernel (rows
                     * of 4 per block of 128 threads, the ranks by one loop per expert) */
    int pdl;    /* programmatic dependent launch of the decode kernels (gpu_port.h ms_launch): an sm_90+
                 * device, device code built for it, and MS_GPU_PDL not "0" at open */
    int pdl_attn; /* the GQA attention kernels (attn_decode.cu, ops.cu's split + combine) in that chain too:
                   * pdl and MS_GPU_ATTN_PDL not "0" at open (A/B measurements: "0" launches them plainly) */
    int rx_mode; /* MS_GPU_RX at open (A/B measurements): MS_GPU_RX_* below */
};

/* ms_gpu.rx_mode: which routed-expert decode kernels ms_gpu_moe_routed takes (matmul_routed.cu) */
#define MS_GPU_RX_DEFAULT 0 /* rx_gu_kernel, rx_downp_kernel (FP8, MXFP4, INT4) / rx_down_kernel (MS_GPU_RX=plain) */
#define MS_GPU_RX_OLD 1     /* MS_GPU_RX=old: rx_gu_kernel, rx_down_kernel */
#define MS_GPU_RX_EARLY 2   /* MS_GPU_RX=early: the default kernels, the down's first loads before its wait */

/* ms_gpu.attn_mode: which GQA attention kernels ms_gpu_attn_gqa takes */
#define MS_GPU_ATTN_FOLD 0    /* attn_decode.cu's kernel, the last block of a head group combines the splits */
#define MS_GPU_ATTN_COMBINE 1 /* the same kernel, the combine in its own launch (MS_GPU_ATTN=combine) */
#define MS_GPU_ATTN_OLD 2     /* ops.cu's earlier split kernel (a lane per key) + combine (MS_GPU_ATTN=old) */
#define MS_GPU_ATTN_MAXS 64   /* key splits at most: ms_gpu_attn_scratch_floats holds this many per head */

/* ms_gpu.legacy bits: which decode paths take the earlier kernels */
#define MS_GPU_LEG_EXPERTS 1 /* routed experts in four launches */
#define MS_GPU_LEG_ROUTE 2   /* the block router */
#define MS_GPU_LEG_NORM 4    /* add_rmsnorm by loops */
#define MS_GPU_LEG_ROUTER 16 /* the router matmul and the routing in two launches */

/* Turn a runtime status into an ms status with the runtime's message. */
static inline int ms_gpu_check(gpuError_t e, ms_err *err, const char *what) {
    if (e == gpuSuccess) return MS_OK;
    return ms_fail(err, MS_ERR_UNSUPPORTED, "gpu (%s): %s: %s", MS_GPU_BACKEND_NAME, what, gpuGetErrorString(e));
}
/* After a kernel launch: report a launch failure (bad configuration, no kernel image). */
static inline int ms_gpu_launched(ms_err *err, const char *kernel) {
    return ms_gpu_check(gpuGetLastError(), err, kernel);
}

/* Bits per element of the dtypes the kernels read; 0 for others. */
static inline int ms_gpu_dtype_bits(ms_dtype dt) {
    switch (dt) {
    case MS_DT_F32: return 32;
    case MS_DT_F16:
    case MS_DT_BF16: return 16;
    case MS_DT_F8_E4M3:
    case MS_DT_F8_E8M0:
    case MS_DT_Q8:
    case MS_DT_U8: return 8;
    case MS_DT_F4:
    case MS_DT_I4: return 4;
    default: return 0;
    }
}

/* n arrival counters in device memory, zero (ms_gpu.cnt, grown and zeroed on the stream when
 * short). A kernel whose blocks count their arrivals there leaves each counter it used at zero
 * again, so launches on the stream share them. NULL after a failure (err set). */
int *ms_gpu_counters(ms_gpu *g, int64_t n, ms_err *err);

/* attn_decode.cu: ms_gpu_attn_gqa's contract (gpu.h; pos_dev NULL or the device position of
 * ms_gpu_attn_gqa_at, pos0 then its bound) through the decode kernel: warps own keys, lanes own
 * float4 chunks of the head dim, all query heads of a KV head (up to 8) in one block, the keys
 * split over blocks by the bound's key count, the splits combined by the last block of each
 * head group (g->attn_mode MS_GPU_ATTN_FOLD) or by a second launch. Returns -1, having done
 * nothing, for what it does not take (value dim not a multiple of 4, v or out not 16-byte
 * aligned, more than 16 query tokens); the caller then runs ops.cu's kernel. Arguments were
 * validated by the caller. */
/* pro (NULL: none): one token (n 1, pos_dev set) whose q holds the raw query heads; the kernel
 * first does qkv_at's work (core/backend.h) with rope_head.h's arithmetic, to the bit: the query
 * heads of each block normed and rotated in shared memory (q is not written), and the key head
 * normed and rotated and the value row copied into cache row *pos_dev by the block(s) whose keys
 * hold it. -1 also when pro cannot be taken (2 half > head dim, no table). */
typedef struct ms_gpu_qkv_pro {
    const float *k, *v;   /* the token's raw key [kv heads * head dim] and value [kv heads * value dim] rows */
    const float *wq, *wk; /* the per-head-dim norm weights (NULL: ones) */
    const float *inv;     /* the RoPE inverse frequencies (half of them; device memory) */
    float *kc, *vc;       /* the caches, [., kv heads * head dim] and [., kv heads * value dim] */
    double attn_factor;
    float eps;
    int norm, half, interleaved; /* norm 0: the rotation alone; half: the rotated pairs per head */
} ms_gpu_qkv_pro;
int ms_gpu_attn_dec(ms_gpu *g, float *out, const float *q, const float *k_cache, const float *v_cache,
                    const float *sinks, int n, int64_t pos0, const int64_t *pos_dev, const ms_gpu_attn_cfg *c,
                    float *scratch, const ms_gpu_qkv_pro *pro, ms_err *err);

/* Validate a weight view for the kernels (dtype, shape, scale layout); `what` names it. */
int ms_gpu_qmat_check(const ms_qmat *w, const char *what, ms_err *err);

/* matmul_q.cu: the Q8 / I4 matvec (core/qmat.h layouts). ms_gpu_qmat_check_q: a Q8 view needs
 * BF16/F32 scales per 1 x bcol block; an I4 view BF16/F16/F32 scales per 1 x bcol group, cols
 * and bcol multiples of 8 (zero points, when present, as core/qmat.h packs them).
 * ms_gpu_matmul_q: ms_gpu_matmul's contract for those views (force_generic: the generic
 * kernel, one element per lane per step; else the 16-byte vector kernel when the row bytes,
 * bcol (16 | bcol for Q8, 32 | bcol for I4) and the w and x addresses allow). */
extern "C" int ms_gpu_qmat_check_q(const ms_qmat *w, const char *what, ms_err *err);
extern "C" int ms_gpu_matmul_q(ms_gpu *g, float *y, const float *x, int n, const ms_qmat *w, int acc,
                               int force_generic, ms_err *err);
static inline int ms_gpu_is_q(const ms_qmat *w) { return w->dtype == MS_DT_Q8 || w->dtype == MS_DT_I4; }

#define MS_GPU_CHECK_CTX(g, err)                                                                 \
    do {                                                                                         \
        if (!(g)) return ms_fail((err), MS_ERR_ARG, "%s: no gpu context", __func__);             \
    } while (0)

#endif
