/* gpu_blas.h — the vendor BLAS behind one set of names, like gpu_port.h for the
 * runtime: cuBLAS on CUDA, hipBLAS (the v2 API, hipDataType) on ROCm when the build
 * found it (the Makefile defines MS_GPU_HIPBLAS and links -lhipblas). Without a BLAS
 * MS_GPU_HAVE_BLAS is 0 and gemm.cu's prefill GEMMs are left out (the backend keeps
 * its own kernels). Only gemm.cu includes this. */
#ifndef MS_GPU_BLAS_H
#define MS_GPU_BLAS_H

#include "backend/gpu/gpu_port.h"

#define MS_BLAS_STR2(x) #x
#define MS_BLAS_STR(x) MS_BLAS_STR2(x) /* a macro's expansion as a string (symbol and library names) */

/* The BLAS entry points gemm.cu calls, as one table: on CUDA loaded at run time from
 * libcublas.so.<major> (dlopen at the first GEMM: linking cuBLAS would map its ~200 MB of
 * relocated data into every process, CPU runs included); on ROCm the linked hipBLAS. */
#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP)
#if defined(MS_GPU_HIPBLAS)
#ifndef HIPBLAS_V2
#define HIPBLAS_V2
#endif
#include <hipblas/hipblas.h>
#define MS_GPU_HAVE_BLAS 1
typedef hipblasHandle_t blasHandle_t;
typedef hipblasStatus_t blasStatus_t;
typedef hipblasOperation_t blasOp_t;
typedef hipDataType blasDataType_t;
typedef hipblasComputeType_t blasComputeType_t;
typedef hipblasGemmAlgo_t blasAlgo_t;
#define BLAS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define BLAS_OP_T HIPBLAS_OP_T
#define BLAS_OP_N HIPBLAS_OP_N
#define BLAS_R_16BF HIP_R_16BF
#define BLAS_R_32F HIP_R_32F
#define BLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define BLAS_GEMM_DEFAULT HIPBLAS_GEMM_DEFAULT
#define BLAS_FN_CREATE hipblasCreate
#define BLAS_FN_DESTROY hipblasDestroy
#define BLAS_FN_SET_STREAM hipblasSetStream
#define BLAS_FN_GEMM_EX hipblasGemmEx
#define BLAS_FN_GEMM_BATCHED_EX hipblasGemmBatchedEx
#define BLAS_LIBRARY NULL /* linked */
#else
#define MS_GPU_HAVE_BLAS 0
#endif
#else
#include <cublas_v2.h>
#define MS_GPU_HAVE_BLAS 1
typedef cublasHandle_t blasHandle_t;
typedef cublasStatus_t blasStatus_t;
typedef cublasOperation_t blasOp_t;
typedef cudaDataType blasDataType_t;
typedef cublasComputeType_t blasComputeType_t;
typedef cublasGemmAlgo_t blasAlgo_t;
#define BLAS_SUCCESS CUBLAS_STATUS_SUCCESS
#define BLAS_OP_T CUBLAS_OP_T
#define BLAS_OP_N CUBLAS_OP_N
#define BLAS_R_16BF CUDA_R_16BF
#define BLAS_R_32F CUDA_R_32F
#define BLAS_COMPUTE_32F CUBLAS_COMPUTE_32F
#define BLAS_GEMM_DEFAULT CUBLAS_GEMM_DEFAULT
#define BLAS_FN_CREATE cublasCreate_v2
#define BLAS_FN_DESTROY cublasDestroy_v2
#define BLAS_FN_SET_STREAM cublasSetStream_v2
#define BLAS_FN_GEMM_EX cublasGemmEx
#define BLAS_FN_GEMM_BATCHED_EX cublasGemmBatchedEx
#define BLAS_LIBRARY "libcublas.so." MS_BLAS_STR(CUBLAS_VER_MAJOR) /* loaded at run time */
#endif

#if MS_GPU_HAVE_BLAS
typedef struct {
    blasStatus_t (*create)(blasHandle_t *h);
    blasStatus_t (*destroy)(blasHandle_t h);
    blasStatus_t (*set_stream)(blasHandle_t h, gpuStream_t s);
    blasStatus_t (*gemm_ex)(blasHandle_t h, blasOp_t ta, blasOp_t tb, int m, int n, int k, const void *alpha,
                            const void *A, blasDataType_t at, int lda, const void *B, blasDataType_t bt, int ldb,
                            const void *beta, void *C, blasDataType_t ct, int ldc, blasComputeType_t compute,
                            blasAlgo_t algo);
    blasStatus_t (*gemm_batched_ex)(blasHandle_t h, blasOp_t ta, blasOp_t tb, int m, int n, int k, const void *alpha,
                                    const void *const *A, blasDataType_t at, int lda, const void *const *B,
                                    blasDataType_t bt, int ldb, const void *beta, void *const *C, blasDataType_t ct,
                                    int ldc, int batch, blasComputeType_t compute, blasAlgo_t algo);
} blas_api;
#endif

#endif
