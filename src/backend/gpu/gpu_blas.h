/* gpu_blas.h — the vendor BLAS behind one set of names, like gpu_port.h for the
 * runtime: cuBLAS on CUDA, hipBLAS (the v2 API, hipDataType) on ROCm when the build
 * found it (the Makefile defines MS_GPU_HIPBLAS and links -lhipblas). Without a BLAS
 * MS_GPU_HAVE_BLAS is 0 and gemm.cu's prefill GEMMs are left out (the backend keeps
 * its own kernels). Only gemm.cu includes this. */
#ifndef MS_GPU_BLAS_H
#define MS_GPU_BLAS_H

#include "backend/gpu/gpu_port.h"

#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP)
#if defined(MS_GPU_HIPBLAS)
#ifndef HIPBLAS_V2
#define HIPBLAS_V2
#endif
#include <hipblas/hipblas.h>
#define MS_GPU_HAVE_BLAS 1
typedef hipblasHandle_t blasHandle_t;
typedef hipblasStatus_t blasStatus_t;
#define BLAS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define blasCreate hipblasCreate
#define blasDestroy hipblasDestroy
#define blasSetStream hipblasSetStream
#define BLAS_OP_T HIPBLAS_OP_T
#define BLAS_OP_N HIPBLAS_OP_N
#define BLAS_R_16BF HIP_R_16BF
#define BLAS_R_32F HIP_R_32F
#define BLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define BLAS_GEMM_DEFAULT HIPBLAS_GEMM_DEFAULT
#define blasGemmEx hipblasGemmEx
#define blasGemmBatchedEx hipblasGemmBatchedEx
#else
#define MS_GPU_HAVE_BLAS 0
#endif
#else
#include <cublas_v2.h>
#define MS_GPU_HAVE_BLAS 1
typedef cublasHandle_t blasHandle_t;
typedef cublasStatus_t blasStatus_t;
#define BLAS_SUCCESS CUBLAS_STATUS_SUCCESS
#define blasCreate cublasCreate
#define blasDestroy cublasDestroy
#define blasSetStream cublasSetStream
#define BLAS_OP_T CUBLAS_OP_T
#define BLAS_OP_N CUBLAS_OP_N
#define BLAS_R_16BF CUDA_R_16BF
#define BLAS_R_32F CUDA_R_32F
#define BLAS_COMPUTE_32F CUBLAS_COMPUTE_32F
#define BLAS_GEMM_DEFAULT CUBLAS_GEMM_DEFAULT
#define blasGemmEx cublasGemmEx
#define blasGemmBatchedEx cublasGemmBatchedEx
#endif

#endif
