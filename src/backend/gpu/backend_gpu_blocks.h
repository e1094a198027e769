/* backend_gpu_blocks.h — between backend_gpu.cu and backend_gpu_blocks.cu (not a
 * public interface): the device ops of the linear-attention, sparse/compressed
 * attention and residual-stream sections of core/backend.h live in
 * backend_gpu_blocks.cu and reach the backend's device, failure note and their
 * own per-backend scratch through these accessors. */
#ifndef MS_BACKEND_GPU_BLOCKS_H
#define MS_BACKEND_GPU_BLOCKS_H

#include "backend/gpu/gpu.h"
#ifdef __cplusplus
extern "C" {
#endif
#include "core/backend.h"
#ifdef __cplusplus
}
#endif

/* backend_gpu.cu: the backend's context; remember the first failure of a void op;
 * report an earlier one (MS_OK when none); the blocks' own state slot (NULL at first). */
ms_gpu *ms_gpu_be_dev(ms_backend *be);
void ms_gpu_be_note(ms_backend *be, int rc, const ms_err *e);
int ms_gpu_be_report(ms_backend *be, ms_err *err);
void **ms_gpu_be_blocks(ms_backend *be);
/* backend_gpu_blocks.cu: fill the ops it implements (kda_forward, gdn_forward, dsa_index,
 * dsa_recheck, compress_append, attn_compressed, mhc_*) into o; free its state (destroy). */
void ms_gpu_blocks_fill(ms_backend_ops *o);
void ms_gpu_blocks_free(ms_backend *be);

#endif
