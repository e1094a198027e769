/* backend_gpu_comm.h — core/comm.h over the GPU backends of one process: NCCL on CUDA
 * (RCCL on ROCm, where its header was found at build time), loaded with dlopen when the
 * first multi-device comm is made, so single-GPU processes never load it. */
#ifndef MS_BACKEND_GPU_COMM_H
#define MS_BACKEND_GPU_COMM_H

#include "core/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A comm over n GPU backends (ms_backend_gpu_create) whose physical devices are devices[n].
 * Entries naming the same physical device (a device list like 0,0) copy between each other
 * with plain device-to-device copies (NCCL cannot have two ranks on one GPU); the distinct
 * devices form one NCCL communicator (ncclCommInitAll, one rank each, driven from this one
 * thread with grouped ncclSend / ncclRecv on the comm's own stream per entry). NVLink
 * multicast stays off: NCCL_NVLS_ENABLE=0 is set before the communicator is made.
 * A copy waits for both backends' queued work (their sync) and returns when the bytes
 * have arrived (the stages run one after another; overlap is not attempted). Errors: MS_ERR_UNSUPPORTED (NCCL not loadable, or its message; a build
 * without it), MS_ERR_ARG, MS_ERR_NOMEM. bes is borrowed. */
int ms_comm_gpu_create(ms_backend *const *bes, const int *devices, int n, ms_comm **out, ms_err *err);

#ifdef __cplusplus
}
#endif

#endif
