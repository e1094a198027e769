/* gemm.h — prefill products on tensor cores through the vendor BLAS (gemm.cu;
 * cuBLAS on CUDA, hipBLAS on ROCm, gpu_blas.h), at F32-activation accuracy.
 *
 * The weights are BF16 matrices (BF16 weights as stored; MXFP4 with E8M0 scales
 * dequantized into BF16 exactly; FP8 block-scaled and F16 as a BF16 pair hi + lo,
 * hi + lo = the F32 value to 2^-17 relative) and each F32 activation row x is split
 * into three BF16 rows x = x_hi + x_mid + x_lo (exact to 2^-27): one GEMM over 3n
 * columns (per weight part) with F32 accumulation, then the parts summed in F32.
 * Routed FP8 experts whose scale blocks tile their rows take the row-block form: the
 * E4M3 values unscaled (exact in BF16, one part) and, per scale row block, a GEMM
 * of those rows against the activations times that block's scales (gemm.cu).
 * F32 weights go through the BLAS's F32 GEMM. Dequantized weights live in a
 * bounded device scratch, one matrix (dense, in row blocks) or one group of experts
 * at a time; nothing is copied at load. */
#ifndef MS_GPU_GEMM_H
#define MS_GPU_GEMM_H

#include "backend/gpu/gpu.h"
#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ms_gpu_blas ms_gpu_blas;

/* A BLAS handle on g's stream with its scratch (grown on demand, freed by close).
 * MS_ERR_UNSUPPORTED when the build has no BLAS (HIP without hipBLAS). */
int ms_gpu_blas_open(ms_gpu *g, ms_gpu_blas **out, ms_err *err);
void ms_gpu_blas_close(ms_gpu_blas *b);
/* ms_gpu_matmul's contract (y [n, rows] (+)= x [n, cols] W^T, device pointers) always
 * through the GEMM, any n >= 1; MS_ERR_UNSUPPORTED for dtypes it does not take. */
int ms_gpu_blas_matmul(ms_gpu_blas *b, float *y, const float *x, int n, const ms_qmat *w, int acc, ms_err *err);
/* core/backend.h's moe_experts contract (ms_moe_args; tok / w / off host arrays) in
 * expert-major grouped GEMMs: per group of experts one upload of the pair tables,
 * gather + split, batched gate/up GEMMs, activation + split, batched down GEMMs, and
 * the weighted sum into acc per token in pair order (the composed op's order).
 * MS_ERR_UNSUPPORTED (nothing done) for experts of mixed layouts or F32 weights. */
int ms_gpu_blas_moe(ms_gpu_blas *b, const ms_moe_args *a, ms_err *err);
/* ms_gpu_blas_moe calls that ran through gemm_mma.cu's kernel (MS_GPU_MOE_MMA); 0 for NULL. */
uint64_t ms_gpu_blas_mma_calls(const ms_gpu_blas *b);
/* MS_OK when ms_gpu_blas_moe takes these experts (then any failure of it is a real one). */
int ms_gpu_blas_moe_supported(const ms_moe_args *a, ms_err *err);

/* The GPU backend's hooks (backend_gpu.cu): take the op through the GEMM when n is at
 * or above the backend's threshold (ms_backend_gpu_gemm_min) and return 1, else 0
 * (the caller runs its own kernels). Failures are noted on the backend. */
int ms_gpu_gemm_matmul(ms_backend *be, float *y, const float *x, int n, const ms_qmat *w, int acc);
int ms_gpu_gemm_matmul_many(ms_backend *be, const ms_matmul_job *jobs, int count);
/* the backend's moe_experts: grouped GEMMs at or above the threshold, else
 * ms_moe_experts_composed */
void ms_gpu_gemm_moe_experts(ms_backend *be, const ms_moe_args *a);
void ms_gpu_gemm_free(ms_backend *be);

#ifdef __cplusplus
}
#endif

#endif
