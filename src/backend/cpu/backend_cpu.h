/* backend_cpu.h — the CPU backend: today's kernels (src/backend/cpu) and the
 * thread pool behind the backend interface (core/backend.h). Its results are
 * the reference every other backend is checked against. */
#ifndef MS_BACKEND_CPU_IFACE_H
#define MS_BACKEND_CPU_IFACE_H

#include "core/backend.h"
#include "util/threadpool.h"

/* A CPU backend over pool (borrowed; NULL runs single-threaded). Buffers are
 * host memory; weights are used in place (place_qmat returns the host view).
 * Ops run one at a time: an engine (or engines used from one thread) drives it.
 * Destroy with be->ops->destroy(be). */
int ms_backend_cpu_create(ms_pool *pool, ms_backend **out, ms_err *err);

/* Bytes of the CPU backend's per-thread attention/router scratch for `threads`
 * threads (the memory plan's workspace line; what reserve allocates). */
uint64_t ms_backend_cpu_workspace_bytes(const ms_config *c, int64_t max_ctx, int64_t max_batch, int threads);

/* The router op on host memory (every pointer of a is a host address): the CPU
 * backend's route, for backends that route on the host (kinds their device
 * kernel lacks). scratch: 2 * n_experts floats. */
void ms_route_host(const ms_route_args *a, float *scratch);

#endif
