/* backend_gpu_step.h — between backend_gpu.cu and backend_gpu_step.cu (not a public
 * interface): the replayable decode step's ops of core/backend.h (qkv_at, graph_begin ..
 * graph_free, argmax; engine/decode_step.c drives them) live in backend_gpu_step.cu and
 * reach the backend's recording state, failure state and RoPE tables through these. */
#ifndef MS_BACKEND_GPU_STEP_H
#define MS_BACKEND_GPU_STEP_H

#include "backend/gpu/gpu.h"
#ifdef __cplusplus
extern "C" {
#endif
#include "core/backend.h"
#ifdef __cplusplus
}
#endif

/* The backend's recording state: recording now (graph_begin .. graph_end; backend_gpu.cu's
 * setup paths refuse to grow scratch, replace a RoPE slot or build a routed-expert table then);
 * the failure state before it (restored when a recording fails); gen counts the moves of
 * scratch buffers and RoPE slots that a recorded graph bakes in (graph_launch refuses a stale
 * graph); the edge counts of the last recording (ms_backend_gpu_graph_edges). */
typedef struct ms_gpu_step_state {
    int capturing, cap_failed;
    ms_err cap_fail;
    unsigned gen;
    uint64_t edges, prog_edges; /* the last recorded graph's dependency edges, and its programmatic ones */
} ms_gpu_step_state;

/* backend_gpu.cu: the state above; whether the per-op profile is on; the first-failure note
 * (failed flag and message) of void ops; the device copy of r's inverse frequencies (the base
 * slot when r rotates nothing; NULL after noting a failure). */
ms_gpu_step_state *ms_gpu_be_step(ms_backend *be);
int ms_gpu_be_profiling(ms_backend *be);
void ms_gpu_be_fail_state(ms_backend *be, int **failed, ms_err **fail);
const float *ms_gpu_be_rope_table(ms_backend *be, const ms_rope *r);
/* backend_gpu.cu: the GQA attention's scratch for c's shape in *scr, grown (a failure status with
 * err set: a recording cannot grow it). */
int ms_gpu_be_attn_scratch(ms_backend *be, const ms_gpu_attn_cfg *c, float **scr, ms_err *err);
/* backend_gpu_step.cu: fill the ops it implements (qkv_at, qkv_attn_at, graph_*, argmax) into o. */
void ms_gpu_step_fill(ms_backend_ops *o);

#endif
