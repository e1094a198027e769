/* attn_prefill.h — tiled causal prefill attention over an F32 GQA cache (attn_prefill.cu).
 *
 * The contract of ms_gpu_attn_gqa (gpu.h) for n query tokens at pos0 .. pos0+n-1, in one
 * launch, no scratch: a block owns 64 query rows (row r = token r / G, head kvh G + r % G of
 * one kv head kvh, G = H / KV) and walks the keys of its rows in tiles of 64 staged through
 * shared memory (every query head of the group reads each K/V tile once), with an online
 * softmax per row; sinks in the denominator, sliding window, scale as there.
 *
 * Two inner products:
 *   MS_GPU_FA_FMA  F32 FMA register tiles (any device; the HIP build's only form);
 *   MS_GPU_FA_MMA  tensor cores (CUDA, compute capability >= 8.0): mma.sync m16n8k8 TF32 with
 *                  every F32 operand split into two TF32 parts (x = hi + lo, hi rounded to
 *                  nearest, lo = x - hi read truncated) and three products per pair (hi hi, hi lo, lo hi), F32
 *                  accumulation: F32-level accuracy (the bound in tests/gpu/test_gpu_prefill.c).
 * MS_GPU_FA_AUTO takes MMA where the device has it, else FMA, and reads MS_GPU_PREFILL_ATTN
 * (each call): "old" refuses (the caller runs the split-K kernel), "fma" / "mma" pick the form.
 * MS_GPU_FA_LOAD=async (each call; CUDA sm_80+) stages the K/V tiles by cp.async, every copy of a
 * tile in flight at once, instead of one load and store after another (opt-in until measured).
 *
 * Shapes: H % KV == 0, head_dim a multiple of 8 up to 256, v_head_dim a multiple of 8 up to
 * 512 (wider than 128: slices of 128 value columns in blocks of their own, each recomputing the
 * scores), q / k / v / out 16-byte aligned, n >= 1, pos0 >= 0. Anything else, a form the device
 * lacks, or the shared memory it needs over the device's limit: MS_ERR_UNSUPPORTED with no
 * launch (the caller then takes ms_gpu_attn_gqa). Other errors: MS_ERR_ARG, a launch failure. */
#ifndef MS_GPU_ATTN_PREFILL_H
#define MS_GPU_ATTN_PREFILL_H

#include <stdint.h>

#include "backend/gpu/gpu.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MS_GPU_FA_AUTO = 0, MS_GPU_FA_FMA = 1, MS_GPU_FA_MMA = 2 };

int ms_gpu_attn_prefill(ms_gpu *g, float *out, const float *q, const float *k_cache, const float *v_cache,
                        const float *sinks, int n, int64_t pos0, const ms_gpu_attn_cfg *cfg, int form, ms_err *err);

/* The backend's choice for a chunk: 1 when the tiled kernel is expected to beat the split-K one
 * for n >= 2 tokens at pos0 (at least one block per SM, or the chunk ends within 1024
 * positions), else 0. Reads no environment. */
int ms_gpu_attn_prefill_wanted(ms_gpu *g, int n, int64_t pos0, const ms_gpu_attn_cfg *cfg);

#ifdef __cplusplus
}
#endif

#endif
