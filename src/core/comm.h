/* comm.h — moving activations between the backends of one process (several devices
 * of one host, engine/placement.h): the pipeline hand-off between stages and the
 * tokens of expert parallelism. Implemented over NCCL (RCCL on AMD) for device
 * backends (backend/gpu/backend_gpu_comm.h), and by plain copies for host-memory
 * backends (ms_comm_host_create, the CPU tests of the split logic). */
#ifndef MS_COMM_H
#define MS_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "util/err.h"

typedef struct ms_comm ms_comm;

typedef struct ms_comm_ops {
    /* bytes from src (memory of backend bes[from]) to dst (memory of bes[to]): after
     * every op queued on bes[from] so far, and before every op queued on bes[to] after
     * this returns. from == to is a copy within one backend. Errors: the transport's
     * (MS_ERR_UNSUPPORTED with its message), MS_ERR_ARG for a rank out of range. */
    int (*copy)(ms_comm *c, int to, void *dst, int from, const void *src, size_t bytes, ms_err *err);
    void (*destroy)(ms_comm *c);
    /* Optional (NULL: nothing to do, as on the CPU): make rank's device the calling thread's
     * current device before work is queued on bes[rank] (GPU runtimes launch kernels and
     * allocate on the current device; the GPU backend selects its device only when made). */
    void (*activate)(ms_comm *c, int rank);
} ms_comm_ops;

struct ms_comm {
    const ms_comm_ops *ops;
    int n;              /* ranks: one per entry of the device list */
    ms_backend **bes;   /* [n] borrowed */
    uint64_t bytes;     /* moved so far (statistics: bench --gpus) */
    uint64_t calls;
    double seconds;     /* wall time inside copy */
    void *impl;
};

/* A comm over n host-memory backends (be->host_memory): copy is memcpy. MS_ERR_ARG for a
 * backend without host memory, MS_ERR_NOMEM. bes is borrowed (must outlive the comm). */
int ms_comm_host_create(ms_backend *const *bes, int n, ms_comm **out, ms_err *err);

#endif
