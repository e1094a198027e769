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

struct ms_gpu {
    int device;
    gpuStream_t stream;
    gpuEvent_t ev0, ev1;
    gpuDeviceProp prop;
};

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
    case MS_DT_U8: return 8;
    case MS_DT_F4: return 4;
    default: return 0;
    }
}

/* Validate a weight view for the kernels (dtype, shape, scale layout); `what` names it. */
int ms_gpu_qmat_check(const ms_qmat *w, const char *what, ms_err *err);

#define MS_GPU_CHECK_CTX(g, err)                                                                 \
    do {                                                                                         \
        if (!(g)) return ms_fail((err), MS_ERR_ARG, "%s: no gpu context", __func__);             \
    } while (0)

#endif
