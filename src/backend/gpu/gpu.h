/* gpu.h — the GPU backend's C interface (CUDA or HIP underneath, see gpu_port.h).
 *
 * Callable from C. Every function returns MS_OK or a negative MS_ERR_* and
 * fills an ms_err naming what is wrong (the runtime's own message included);
 * nothing prints or exits. Built by `make` (with nvcc, else hipcc) and by `make check` (both).
 *
 * Model: one ms_gpu context = one device + one stream. Buffers are device
 * pointers from ms_gpu_alloc. Ops are enqueued on the context's stream and
 * return as soon as they are launched (launch errors are reported at once;
 * errors inside a kernel surface at the next ms_gpu_sync/ms_gpu_download).
 * Every pointer argument of an op is a device pointer unless stated.
 *
 * Weights are ms_qmat views (ops/ops.h) whose data and scale point to device
 * memory (ms_gpu_qmat_upload makes one from a host view); they stay in their
 * stored dtype and the kernels dequantize while reading: F32, F16, BF16,
 * F8_E4M3 with block scales (F32 or BF16, any brow x bcol, DeepSeek's 128x128),
 * F4 (MXFP4 e2m1, E8M0 scales per 32 columns), I4 (compressed-tensors pack-quantized INT4,
 * BF16/F16/F32 scales per 1 x group, packed zero points when asymmetric; core/qmat.h) and Q8.
 * Activations are F32. */
#ifndef MS_GPU_H
#define MS_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "ops/ops.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ms_gpu ms_gpu;

typedef struct ms_gpu_info {
    char backend[8];        /* "cuda" or "hip" */
    char name[256];         /* device name */
    int cc_major, cc_minor; /* compute capability (CUDA) / gfx major.minor (HIP) */
    int sm_count;           /* multiprocessors / compute units */
    int warp_size;
    size_t mem_total, mem_free;
    size_t l2_bytes;
    /* Peak DRAM bandwidth (GB/s, 1e9) from memory clock x bus width x 2 as the
     * runtime reports them; 0 when unknown (CUDA 13 dropped the attributes):
     * then callers use the datasheet (H200: 4800). */
    double peak_gbs;
    int runtime_version, driver_version;
} ms_gpu_info;

/* Open device `device` (0-based) and create the context's stream. *out is
 * owned by the caller (ms_gpu_close). Errors: MS_ERR_UNSUPPORTED when there is
 * no such device or no driver; the runtime's message is in err. */
int ms_gpu_open(int device, ms_gpu **out, ms_err *err);
/* Destroy the stream and free the context (not the buffers). NULL is a no-op. */
void ms_gpu_close(ms_gpu *g);
/* Describe the device (memory figures read now). */
int ms_gpu_info_get(ms_gpu *g, ms_gpu_info *info, ms_err *err);

/* Device buffer of `bytes` (> 0) into *dptr; owned by the caller (ms_gpu_free).
 * MS_ERR_NOMEM when the device is out of memory. */
int ms_gpu_alloc(ms_gpu *g, size_t bytes, void **dptr, ms_err *err);
/* Free a device buffer (NULL is a no-op). Waits for the device to be idle. */
void ms_gpu_free(ms_gpu *g, void *dptr);
/* Page-locked host buffer (for staging uploads at full link speed); ms_gpu_free_host. */
int ms_gpu_alloc_host(ms_gpu *g, size_t bytes, void **hptr, ms_err *err);
void ms_gpu_free_host(ms_gpu *g, void *hptr);
/* Copy host -> device (upload) and device -> host (download) on the stream.
 * Upload from pageable memory returns once the source may be reused; download
 * waits until the bytes are in dst. Download also reports errors of earlier
 * kernels. */
int ms_gpu_upload(ms_gpu *g, void *dst, const void *src, size_t bytes, ms_err *err);
int ms_gpu_download(ms_gpu *g, void *dst, const void *src, size_t bytes, ms_err *err);
/* Device -> device copy on the stream (also the bench's bandwidth yardstick). */
int ms_gpu_copy(ms_gpu *g, void *dst, const void *src, size_t bytes, ms_err *err);
/* dst[0..bytes) = 0 on the stream. */
int ms_gpu_zero(ms_gpu *g, void *dst, size_t bytes, ms_err *err);
/* Wait for everything enqueued; reports asynchronous kernel errors. */
int ms_gpu_sync(ms_gpu *g, ms_err *err);

/* Upload a host weight view: allocates one device buffer holding data and
 * scales and fills *dev with the same view onto device memory. Validates the
 * view (dtype supported, shapes, scale layout). The buffer is dev->data;
 * release it with ms_gpu_qmat_free. */
int ms_gpu_qmat_upload(ms_gpu *g, const ms_qmat *host, ms_qmat *dev, ms_err *err);
void ms_gpu_qmat_free(ms_gpu *g, ms_qmat *dev);

/* ------------------------------------------------------------------ ops */

/* Programmatic dependent launch (sm_90+ with device code built for it; MS_GPU_PDL=0 at open
 * turns it off): the decode kernels below (matmul's, router_route's, moe_routed's, and the
 * backend's add_rmsnorm, qk_norm_rope, qkv_at, embed_at, argmax) may start while the stream's
 * previous kernel is finishing; each waits for it (griddepcontrol.wait) before it reads an
 * activation or writes anything, and reads only weights before that. So a weight matrix given
 * to these ops (w, router, the experts' tables, norm weights) must not be written by a kernel
 * queued earlier on the stream: placed and uploaded weights are (a copy or upload is ordered as
 * before). */

/* y[t, r] = (acc ? y[t, r] : 0) + sum_c w[r, c] x[t, c] for t < n, r < w->rows.
 * x: [n, w->cols] F32, y: [n, w->rows] F32 (must not overlap x). w: device view.
 * Up to 8 tokens share one pass over the weights; larger n runs in groups of 8.
 * Accumulates in F32 (per-lane partial sums, then a warp tree). Errors:
 * MS_ERR_ARG (n < 1, NULL), MS_ERR_UNSUPPORTED (dtype/scale layout). */
int ms_gpu_matmul(ms_gpu *g, float *y, const float *x, int n, const ms_qmat *w, int acc, ms_err *err);
/* Same contract and result, always through the generic kernel (one element per
 * lane per step, any layout): the path odd shapes take; tests compare both. */
int ms_gpu_matmul_generic(ms_gpu *g, float *y, const float *x, int n, const ms_qmat *w, int acc, ms_err *err);

/* Several products (ops.h ms_matmul_job, device pointers; no job's y overlaps another's x
 * or y): runs of consecutive jobs with the same dtype, columns, scale layout, n and acc
 * share one launch (rows may differ). */
int ms_gpu_matmul_many(ms_gpu *g, const ms_matmul_job *jobs, int count, ms_err *err);

/* y[t, i] = x[t, i] / sqrt(mean_i(x[t]^2) + eps) * (w ? w[i] : 1), n rows of d.
 * w: F32 [d] or NULL. y may equal x. */
int ms_gpu_rmsnorm(ms_gpu *g, float *y, const float *x, const float *w, int n, int d, float eps, ms_err *err);

/* Rotary embedding in place, as the CPU path (ms_rope_cos_sin + ms_rope_apply):
 * for token t (position pos0 + t) and head h, the rot_dim dims starting at
 * x + t*tok_stride + h*head_stride + rot_off rotate by angle
 * (float)pos * inv_freq[i], cos/sin computed in double and multiplied by
 * attn_factor (YaRN's attention factor; 1 otherwise). inv_freq: device F32
 * [rot_dim/2] (the CPU's ms_rope.inv_freq rounded to float, YaRN ramp
 * included). interleaved: pairs (2i, 2i+1); else half split (i, i + rot_dim/2).
 * rot_dim even, <= 1024. */
int ms_gpu_rope(ms_gpu *g, float *x, int n, int64_t tok_stride, int n_heads, int64_t head_stride, int rot_off,
                int rot_dim, int interleaved, const float *inv_freq, double attn_factor, int64_t pos0, ms_err *err);

/* Gated activations. */
typedef enum ms_gpu_act {
    /* silu(gate) * up; with limit > 0 first gate = min(gate, limit),
     * up = clamp(up, -limit, limit) (GLM-5-Next, DeepSeek-V4) */
    MS_GPU_ACT_SWIGLU = 0,
    /* gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit),
     * out = (u + 1) * g * sigmoid(alpha * g) */
    MS_GPU_ACT_CLAMPED_SWIGLU = 1,
} ms_gpu_act;
/* out[i] = act(gate[i], up[i]) for i < n; out may equal gate or up. */
int ms_gpu_glu(ms_gpu *g, float *out, const float *gate, const float *up, int64_t n, ms_gpu_act act, float limit,
               float alpha, ms_err *err);

/* MoE router: logits [n, E] -> ids [n, K] (int32), weights [n, K] (F32), the
 * router math of engine/moe.c:
 *  SOFTMAX: softmax over E, top-K of the probabilities, weights = those probs;
 *  SIGMOID: scores sigmoid(logit); choice = score + bias[e] (bias F32 [E] or
 *    NULL); with n_group > 1 only the topk_group groups with the largest sum of
 *    their two best choices stay; top-K of choice; weights = scores;
 *  TOPK_SOFTMAX (gpt-oss): top-K of the logits, weights = softmax over those K.
 * SOFTMAX/SIGMOID: when norm_topk, weights /= their sum (+1e-20 for sigmoid).
 * All: weights *= routed_scale. Ties go to the lower index; NaN never wins.
 * Limits: E <= 1024, K <= 32, K <= E, E % n_group == 0, topk_group <= n_group. */
typedef enum ms_gpu_router { MS_GPU_ROUTER_SOFTMAX = 1, MS_GPU_ROUTER_SIGMOID = 2, MS_GPU_ROUTER_TOPK_SOFTMAX = 3 } ms_gpu_router;
typedef struct ms_gpu_route_cfg {
    ms_gpu_router kind;
    int n_experts, top_k, n_group, topk_group, norm_topk;
    float routed_scale;
} ms_gpu_route_cfg;
int ms_gpu_route(ms_gpu *g, int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                 const ms_gpu_route_cfg *cfg, ms_err *err);

/* GQA attention of n query tokens at positions pos0 .. pos0+n-1 over a KV cache
 * holding positions 0 .. pos0+n-1 (F32; k_cache [>= pos0+n, KV*hd], v_cache
 * [>= pos0+n, KV*vd], row p = position p): head h reads kv head h / (H/KV);
 * scores q.k * scale over the positions s with s <= p and, when window > 0,
 * s > p - window; sinks (F32 [H] or NULL) add exp(sink[h] - max) to the softmax
 * denominator only. q: [n, H, hd], out: [n, H, vd]. H % KV == 0; hd a multiple
 * of 4 up to 512 (q and k_cache 16-byte aligned); vd up to 512. scratch: device
 * F32 of ms_gpu_attn_scratch_floats(n, cfg) (per-split partial results: the
 * keys are split across blocks, flash-decoding style, then merged). */
typedef struct ms_gpu_attn_cfg {
    int n_heads, n_kv_heads, head_dim, v_head_dim;
    int window;
    float scale;
} ms_gpu_attn_cfg;
size_t ms_gpu_attn_scratch_floats(int n, const ms_gpu_attn_cfg *cfg);
int ms_gpu_attn_gqa(ms_gpu *g, float *out, const float *q, const float *k_cache, const float *v_cache,
                    const float *sinks, int n, int64_t pos0, const ms_gpu_attn_cfg *cfg, float *scratch, ms_err *err);
/* The same for one query token (a replayable decode step) at the position *pos_dev (device
 * memory, read when the kernel runs, <= pos_bound): the key splits are sized for pos_bound. */
int ms_gpu_attn_gqa_at(ms_gpu *g, float *out, const float *q, const float *k_cache, const float *v_cache,
                       const float *sinks, int64_t pos_bound, const int64_t *pos_dev, const ms_gpu_attn_cfg *cfg,
                       float *scratch, ms_err *err);

/* One routed expert, device views (core/expert_source.h's ms_expert_view with
 * device pointers): gate/up [I, D], down [D, I]; up.data NULL means gate is
 * the fused [2I, D] projection with gate/up rows interleaved (gpt-oss). Biases
 * F32 or BF16 (bias_dtype), NULL when absent. */
typedef struct ms_gpu_expert {
    ms_qmat gate, up, down;
    const void *gate_bias, *up_bias, *down_bias;
    ms_dtype bias_dtype;
} ms_gpu_expert;
/* Expert FFN of one token over k experts (1 <= k <= 32), all of one weight
 * dtype and shape: out[D] (+)= sum_e weights[e] * down_e(act(gate_e x, up_e x)).
 * x: [D]; weights: device F32 [k] (e.g. ms_gpu_route's output); out: [D]
 * (overwritten unless acc). scratch: device F32 of ms_gpu_expert_scratch_floats
 * (k, I, D) floats. act/limit/alpha as ms_gpu_glu. */
size_t ms_gpu_expert_scratch_floats(int k, int64_t inter, int64_t hidden);
int ms_gpu_expert_ffn(ms_gpu *g, float *out, const float *x, int k, const ms_gpu_expert *experts,
                      const float *weights, ms_gpu_act act, float limit, float alpha, float *scratch, int acc,
                      ms_err *err);

/* Routed experts of one decode token straight from the router's device output (no
 * host round trip): tab [E] (device) holds every expert's matrices (w/s/z: data, scale
 * and I4 zero points (NULL: symmetric or not I4) of gate, up, down; up NULL when gate is
 * the fused interleaved gate_up) and
 * biases (bias_dt: 0 F32, 1 BF16, 2 F16; NULL when absent); every expert has the
 * layout of gate / down (the host views given). ids, w: device [K] (K <= 32).
 *   acc [D] = sum_j w[j] (down_j act(gate_j x + b, up_j x + b) + b), slots in ascending id
 * act: the gated activation's parameters (ms_gpu_glu_params). scratch: device F32 of
 * ms_gpu_moe_routed_scratch_floats(K, I, D). Two launches (gate + up + activation, scaled by w[j];
 * down of all K as one row of K I columns per output row, slots in ascending id) where gate and
 * down fit the vector kernel, else four (gate+up, activation, down, weighted sum); no sync. */
typedef struct ms_gpu_ex_ptrs {
    const void *w[3], *s[3], *bias[3];
    const void *z[3];
} ms_gpu_ex_ptrs;
typedef struct ms_gpu_glu_params {
    int situ;
    float limit, alpha, up_offset, beta, linear_beta;
} ms_gpu_glu_params;
size_t ms_gpu_moe_routed_scratch_floats(int K, int64_t inter, int64_t hidden);
int ms_gpu_moe_routed(ms_gpu *g, float *acc, const float *x, int K, const int32_t *ids, const float *w,
                      const ms_gpu_ex_ptrs *tab, const ms_qmat *gate, const ms_qmat *down, int fused, int bias_dt,
                      const ms_gpu_glu_params *act, float *scratch, ms_err *err);

/* The router's logits and the routing of one decode token in one launch: logits [E] =
 * router x (E = router->rows = c->n_experts, the matrix in its stored dtype; the vector
 * kernel's layouts, x 16-byte aligned), then ms_gpu_route's selection and weights of them
 * (softmax, top-k softmax, or sigmoid without groups) into ids /
 * weights [top_k], by the matvec's last block to finish (the block's threads rank the experts:
 * ms_gpu_route's ids and weights). A block per router row (MS_GPU_ROUTER=old at context open: the
 * earlier kernel, 4 rows per block); the logits, ids and weights do not depend on the blocks'
 * order (the same bits eager, recorded, replayed). MS_ERR_UNSUPPORTED for any other
 * router, layout, or MS_GPU_LEGACY_DECODE "router" (then matmul and ms_gpu_route). */
int ms_gpu_router_route(ms_gpu *g, int32_t *ids, float *weights, float *logits, const float *x, const ms_qmat *router,
                        const float *bias, const ms_gpu_route_cfg *c, ms_err *err);

/* Timing with device events on the context's stream (for benches): ms_gpu_timer_start
 * records a start event; ms_gpu_timer_stop records the end, waits, and gives the
 * milliseconds between them. */
int ms_gpu_timer_start(ms_gpu *g, ms_err *err);
int ms_gpu_timer_stop(ms_gpu *g, float *ms, ms_err *err);

#ifdef __cplusplus
}
#endif

#endif
