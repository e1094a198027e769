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

#ifdef __cplusplus
}
#endif

#endif
