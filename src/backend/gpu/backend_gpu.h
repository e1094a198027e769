/* backend_gpu.h — the device-resident GPU backend: core/backend.h's interface
 * over one device and one stream (CUDA or HIP underneath, backend/gpu/gpu_port.h).
 *
 * Buffers are device memory (host_memory 0): alloc is a zeroed device buffer,
 * upload/download/copy are stream copies (download waits), weights are placed
 * in device memory in their stored dtype (place_qmat: data and scales; one
 * arena, released with the backend). Ops are enqueued on the stream; a failed
 * launch of a void op is remembered and reported by the next sync or download.
 * Index arrays the contract gives as host arrays (gather/scatter rows, token
 * ids, MLA selections) travel in kernel arguments or a small device buffer.
 *
 * Every op of core/backend.h is present: those of GQA, MLA and MoE models with
 * Attention Residuals in backend_gpu.cu, the KDA, gated DeltaNet, DSA indexer,
 * compressed-attention and mHC ops in backend_gpu_blocks.cu (the DSA and CSA
 * selections: device scores, the CPU's torch.topk emulation on the host).
 * Each op is checked against the CPU backend's own (tests/gpu/test_gpu.c). */
#ifndef MS_BACKEND_GPU_H
#define MS_BACKEND_GPU_H

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A GPU backend on device `device` (0-based). MS_ERR_UNSUPPORTED (with the
 * runtime's message) when there is no such device or no driver. Destroy with
 * be->ops->destroy(be). */
int ms_backend_gpu_create(int device, ms_backend **out, ms_err *err);

/* Devices the runtime sees (0 when there is no driver). */
int ms_backend_gpu_count(void);

/* Per-op profile: on 1 waits for queued work and starts recording (every outermost op of
 * the table between two events on the stream; the totals reset), 0 stops.
 * ms_backend_gpu_profile_json writes {"tokens", "span_us_per_token" (the device time since
 * the start, gaps included), "ops_us_per_token" (the ops' sum), "ops": {op: {us_per_token,
 * calls_per_token}}} into buf, largest first, per = the tokens decoded meanwhile;
 * returns the length (0 when never started). With MS_GPU_PROFILE_STALL_US=N set when the
 * profile starts, each embedding op (a token's first) waits behind an N-microsecond spin on
 * the device, so the host has queued the token's ops before they run and the events time the
 * device alone (class "stall"; span and sum without it, "stalled": 1). */
int ms_backend_gpu_profile(ms_backend *be, int on, ms_err *err);
int ms_backend_gpu_profile_json(ms_backend *be, int per, char *buf, size_t cap);

/* The device's copy bandwidth: ten 1 GiB device-to-device copies timed with events,
 * bytes read + written per second into *bytes_per_s. */
int ms_backend_gpu_copy_bandwidth(ms_backend *be, double *bytes_per_s, ms_err *err);

/* The token counts from which the backend runs products through the BLAS GEMMs
 * (gemm.h): dense with the weight as stored (BF16, F32; default 16, 32 for matrices
 * under 4M elements), dense with a dequantized weight (FP8, F16, MXFP4; default 48),
 * routed experts (tokens of the chunk; default 4). Values <= 0 keep a threshold; 2 is the least for matmuls (decode,
 * n = 1, keeps its kernels). The environment variable MS_GPU_GEMM_MIN=N sets all three
 * at creation (fixture runs). MS_ERR_NOMEM when the state cannot be made. */
int ms_backend_gpu_gemm_min(ms_backend *be, int dense, int dequantized, int experts);
/* How many matmuls and moe_experts calls ran through the GEMMs so far (tests, benches). */
void ms_backend_gpu_gemm_calls(ms_backend *be, uint64_t *dense, uint64_t *experts);
/* Of those routed-expert calls, the ones through gemm_mma.cu's kernel (MS_GPU_MOE_MMA). */
uint64_t ms_backend_gpu_gemm_mma_calls(ms_backend *be);
/* The dependency edges of the last decode step recorded (graph_end): all of them, and those
 * programmatic (a kernel launched with programmatic dependent launch after a kernel; 0 without
 * PDL or on HIP). Both 0 before any recording. */
void ms_backend_gpu_graph_edges(ms_backend *be, uint64_t *edges, uint64_t *programmatic);

#ifdef __cplusplus
}
#endif

#endif
