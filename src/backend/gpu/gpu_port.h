/* gpu_port.h — the one place where CUDA and HIP differ.
 *
 * The kernels (*.cu) are written in CUDA syntax against the names below and
 * never name a cuda* / hip* runtime symbol, intrinsic or header directly, so
 * the same files build with nvcc (CUDA) and with hipcc (ROCm, compiled as HIP
 * when __HIP_PLATFORM_AMD__ or MS_GPU_HIP is defined). In the style of
 * llama.cpp's vendors/hip.h: runtime API names are mapped by macros, device
 * intrinsics by small inline functions.
 *
 * Warp width: 32 on NVIDIA, 64 on AMD CDNA (gfx9xx; RDNA runs 32 but HIP
 * reports warpSize 64 only for wave64). Kernels use MS_WARP for lane counts
 * and ms_warp_sum / ms_warp_max for reductions within one warp; block sizes
 * are multiples of 64 so they hold whole warps on both. */
#ifndef MS_GPU_PORT_H
#define MS_GPU_PORT_H

#include <stdint.h>
#include <stdlib.h>

#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP)
/* ---------------------------------------------------------------- HIP */
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define MS_GPU_BACKEND_NAME "hip"
#define MS_WARP 64
typedef hipError_t gpuError_t;
typedef hipStream_t gpuStream_t;
typedef hipEvent_t gpuEvent_t;
typedef hipDeviceProp_t gpuDeviceProp;
#define gpuSuccess hipSuccess
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuSetDevice hipSetDevice
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuDeviceGetAttribute hipDeviceGetAttribute
#define gpuDevAttrMemoryClockRate hipDeviceAttributeMemoryClockRate
#define gpuDevAttrGlobalMemoryBusWidth hipDeviceAttributeMemoryBusWidth
#define gpuMemGetInfo hipMemGetInfo
#define gpuFuncSetAttribute hipFuncSetAttribute
#define gpuOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define gpuFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMallocHost hipHostMalloc
#define gpuFreeHost hipHostFree
#define gpuHostRegister hipHostRegister
#define gpuHostUnregister hipHostUnregister
#define gpuHostRegisterDefault hipHostRegisterDefault
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuMemcpyDefault hipMemcpyDefault
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
typedef hipGraph_t gpuGraph_t;
typedef hipGraphExec_t gpuGraphExec_t;
#define gpuStreamBeginCapture hipStreamBeginCapture
#define gpuStreamEndCapture hipStreamEndCapture
#define gpuStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define gpuGraphInstantiateWithFlags hipGraphInstantiateWithFlags
#define gpuGraphLaunch hipGraphLaunch
#define gpuGraphExecDestroy hipGraphExecDestroy
#define gpuGraphDestroy hipGraphDestroy
#define gpuEventCreate hipEventCreate
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuRuntimeGetVersion hipRuntimeGetVersion
#define gpuDriverGetVersion hipDriverGetVersion

/* Programmatic dependent launch (CUDA sm_90+) has no HIP counterpart here: kernels launch in
 * stream order, the device calls below do nothing. */
template <typename... P, typename... A>
static inline void ms_launch(int pdl, void (*k)(P...), dim3 grid, dim3 block, size_t shm, gpuStream_t st,
                             A &&...args) {
    (void)pdl;
    k<<<grid, block, shm, st>>>(static_cast<A &&>(args)...);
}
static inline int ms_pdl_capable(const void *kernel) {
    (void)kernel;
    return 0;
}
static __device__ __forceinline__ void ms_pdl_wait(void) {}
static __device__ __forceinline__ void ms_pdl_launch(void) {}
/* The dependency edges of graph g (programmatic ones: none on HIP); 0 when it cannot tell. */
static inline void ms_graph_edges(hipGraph_t g, uint64_t *edges, uint64_t *programmatic) {
    size_t n = 0;
    *programmatic = 0;
    if (hipGraphGetEdges(g, NULL, NULL, &n) != hipSuccess) (void)hipGetLastError(), n = 0;
    *edges = n;
}

/* lane shuffles: HIP has no mask argument */
static __device__ __forceinline__ float ms_shfl_xor(float v, int m) { return __shfl_xor(v, m, MS_WARP); }
static __device__ __forceinline__ int ms_shfl_xor_i(int v, int m) { return __shfl_xor(v, m, MS_WARP); }
static __device__ __forceinline__ float ms_shfl_idx(float v, int lane) { return __shfl(v, lane, MS_WARP); }
/* orders shared-memory accesses among the lanes of a block that is one warp */
static __device__ __forceinline__ void ms_syncwarp(void) { __syncthreads(); }

/* FP8 E4M3FN byte -> float, exact (incl. subnormals; 0x7f/0xff NaN), by bit
 * placement: the 7 magnitude bits at f32 bit 20 give 2^(e-127)(1+m/8) (or the
 * f32 subnormal m 2^-129), times 2^120 is the E4M3 value. */
static __device__ __forceinline__ float ms_fp8_e4m3_to_f32_dev(uint32_t b) {
    uint32_t mag = b & 0x7fu;
    float f = __uint_as_float(mag << 20) * 0x1p120f;
    f = (b & 0x80u) ? -f : f;
    return mag == 0x7fu ? __uint_as_float(0x7fc00000u) : f;
}
/* Two FP8 E4M3 values (low byte first) of a 16-bit word -> float2. */
static __device__ __forceinline__ float2 ms_fp8x2_e4m3_to_f32x2(uint32_t w16) {
    return make_float2(ms_fp8_e4m3_to_f32_dev(w16 & 0xffu), ms_fp8_e4m3_to_f32_dev((w16 >> 8) & 0xffu));
}
/* Four FP8 E4M3 values of a word (low byte first) times 2^-112 (see the CUDA twin). */
static __device__ __forceinline__ void ms_fp8x4_e4m3_scaled(uint32_t w, float *out) {
    for (int i = 0; i < 4; i++) out[i] = ms_fp8_e4m3_to_f32_dev((w >> (8 * i)) & 0xffu) * 0x1p-112f;
}
#else
/* --------------------------------------------------------------- CUDA */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define MS_GPU_BACKEND_NAME "cuda"
#define MS_WARP 32
typedef cudaError_t gpuError_t;
typedef cudaStream_t gpuStream_t;
typedef cudaEvent_t gpuEvent_t;
typedef cudaDeviceProp gpuDeviceProp;
#define gpuSuccess cudaSuccess
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuSetDevice cudaSetDevice
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuDeviceGetAttribute cudaDeviceGetAttribute
#define gpuDevAttrMemoryClockRate cudaDevAttrMemoryClockRate
#define gpuDevAttrGlobalMemoryBusWidth cudaDevAttrGlobalMemoryBusWidth
#define gpuMemGetInfo cudaMemGetInfo
#define gpuOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#define gpuFuncSetAttribute cudaFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMallocHost cudaMallocHost
#define gpuFreeHost cudaFreeHost
#define gpuHostRegister cudaHostRegister
#define gpuHostUnregister cudaHostUnregister
#define gpuHostRegisterDefault cudaHostRegisterDefault
#define gpuHostRegisterReadOnly cudaHostRegisterReadOnly /* read-only mappings (a mapped checkpoint) */
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuMemcpyDefault cudaMemcpyDefault
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
typedef cudaGraph_t gpuGraph_t;
typedef cudaGraphExec_t gpuGraphExec_t;
#define gpuStreamBeginCapture cudaStreamBeginCapture
#define gpuStreamEndCapture cudaStreamEndCapture
#define gpuStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define gpuGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define gpuGraphLaunch cudaGraphLaunch
#define gpuGraphExecDestroy cudaGraphExecDestroy
#define gpuGraphDestroy cudaGraphDestroy
#define gpuEventCreate cudaEventCreate
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuRuntimeGetVersion cudaRuntimeGetVersion
#define gpuDriverGetVersion cudaDriverGetVersion

/* Programmatic dependent launch (sm_90+). ms_launch(pdl, k, grid, block, shm, stream, args...)
 * launches k as k<<<...>>>(args...) would; with pdl != 0 it sets the launch attribute that lets
 * the grid start before the stream's previous kernel has finished (that kernel's blocks have
 * all called ms_pdl_launch, or exited): then k MUST call ms_pdl_wait() in every thread before
 * it reads anything an earlier kernel of the stream writes and before it writes anything an
 * earlier kernel reads or writes; what k does before that (weights, kernel arguments) overlaps
 * the previous kernel's tail. Under stream capture the attribute becomes a programmatic edge
 * of the graph. A failed launch is left for gpuGetLastError, as <<<>>>'s (the caller's
 * ms_gpu_launched reports it). */
template <typename... P, typename... A>
static inline void ms_launch(int pdl, void (*k)(P...), dim3 grid, dim3 block, size_t shm, gpuStream_t st,
                             A &&...args) {
    if (!pdl) {
        k<<<grid, block, shm, st>>>(static_cast<A &&>(args)...);
        return;
    }
    cudaLaunchAttribute at[1] = {};
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = shm, cfg.stream = st;
    cfg.attrs = at, cfg.numAttrs = 1;
    (void)cudaLaunchKernelEx(&cfg, k, static_cast<A &&>(args)...); /* its error is also the thread's last error */
}
/* Whether kernel's device code has the waits above (its PTX is for sm_90 or later: code built
 * for an older target runs without them, so the attribute must stay off). */
static inline int ms_pdl_capable(const void *kernel) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return fa.ptxVersion >= 90;
}
/* The PTX version (major * 10 + minor) kernel's device code was built for; 0 when unknown. */
static inline int ms_kernel_ptx(const void *kernel) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return fa.ptxVersion;
}
/* Wait until the stream's previous kernels have completed and their writes are visible (a
 * no-op when the kernel was launched without the attribute); let the stream's next kernel
 * launch (its own waits still order it after this kernel's completion). */
static __device__ __forceinline__ void ms_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void ms_pdl_launch(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* The dependency edges of graph g and how many are programmatic (a PDL launch captured after a
 * kernel); 0 when the runtime cannot tell (before CUDA 12.3: the total only). */
static inline void ms_graph_edges(cudaGraph_t g, uint64_t *edges, uint64_t *programmatic) {
    size_t n = 0;
    *edges = 0, *programmatic = 0;
#if CUDART_VERSION >= 13000
    if (cudaGraphGetEdges(g, NULL, NULL, NULL, &n) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
#elif CUDART_VERSION >= 12030
    if (cudaGraphGetEdges_v2(g, NULL, NULL, NULL, &n) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
#else
    if (cudaGraphGetEdges(g, NULL, NULL, &n) != cudaSuccess) (void)cudaGetLastError(), n = 0;
    *edges = n;
    return;
#endif
    *edges = n;
#if CUDART_VERSION >= 12030
    if (!n) return;
    cudaGraphNode_t *from = (cudaGraphNode_t *)malloc(n * sizeof *from), *to = (cudaGraphNode_t *)malloc(n * sizeof *to);
    cudaGraphEdgeData *ed = (cudaGraphEdgeData *)malloc(n * sizeof *ed);
    size_t m = n;
#if CUDART_VERSION >= 13000
    cudaError_t e = from && to && ed ? cudaGraphGetEdges(g, from, to, ed, &m) : cudaErrorMemoryAllocation;
#else
    cudaError_t e = from && to && ed ? cudaGraphGetEdges_v2(g, from, to, ed, &m) : cudaErrorMemoryAllocation;
#endif
    if (e == cudaSuccess)
        for (size_t i = 0; i < m && i < n; i++) *programmatic += ed[i].type == cudaGraphDependencyTypeProgrammatic;
    else
        (void)cudaGetLastError();
    free(from), free(to), free(ed);
#endif
}

static __device__ __forceinline__ float ms_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m, MS_WARP); }
static __device__ __forceinline__ int ms_shfl_xor_i(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m, MS_WARP); }
static __device__ __forceinline__ float ms_shfl_idx(float v, int lane) { return __shfl_sync(0xffffffffu, v, lane, MS_WARP); }
/* orders shared-memory accesses among the lanes of one (full) warp */
static __device__ __forceinline__ void ms_syncwarp(void) { __syncwarp(); }

/* FP8 E4M3FN -> float through the hardware pair conversion (sm_89+: one
 * cvt.rn.f16x2.e4m3x2 per two values; E4M3 is exact in F16, NaN stays NaN). */
static __device__ __forceinline__ float2 ms_fp8x2_e4m3_to_f32x2(uint32_t w16) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w16 & 0xffffu), __NV_E4M3);
    return __half22float2(*(const __half2 *)&h);
}
static __device__ __forceinline__ float ms_fp8_e4m3_to_f32_dev(uint32_t b) {
    return ms_fp8x2_e4m3_to_f32x2(b & 0xffu).x;
}
/* Four FP8 E4M3 values of a word (low byte first) times 2^-112, for the matvec
 * fast path: the hardware pair conversion to F16 (exact), then each F16 moved
 * into F32 bits by shifts alone (F16 exponent field read with F32's bias: the
 * value times 2^-112; every E4M3 value is a normal F16 or zero, so this is
 * exact). Avoids the F16->F32 conversion instructions, which bounded the FP8
 * kernel at ~3 TB/s. NaN bytes (0x7f/0xff) come out finite here. */
static __device__ __forceinline__ void ms_fp8x4_e4m3_scaled(uint32_t w, float *out) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((w >> (16 * i)) & 0xffffu), __NV_E4M3);
        uint32_t h2 = (uint32_t)h.x | ((uint32_t)h.y << 16);
        out[2 * i] = __uint_as_float(((h2 & 0x7fffu) << 13) | ((h2 & 0x8000u) << 16));
        out[2 * i + 1] = __uint_as_float(((h2 >> 3) & 0x0fffe000u) | (h2 & 0x80000000u));
    }
}
#endif

/* ------------------------------------------------------ shared helpers */

/* 16-byte load of data read once (weights): streaming / evict-first where the
 * platform has it, so it does not push reused data (activations) out of L1/L2. */
static __device__ __forceinline__ uint4 ms_load_stream16(const uint4 *p) {
#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP) || defined(MS_MM_PLAIN_LOAD)
    return *p;
#else
    return __ldcs(p);
#endif
}

/* A float another block wrote in this launch (after its fence): through L2, not a stale L1 line. */
static __device__ __forceinline__ float ms_load_cg(const float *p) {
#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP)
    return *(const volatile float *)p;
#else
    return __ldcg(p);
#endif
}

/* Four floats another block wrote in this launch (16-byte aligned), as ms_load_cg. */
static __device__ __forceinline__ float4 ms_load_cg4(const float4 *p) {
#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP)
    const volatile float *f = (const volatile float *)p;
    return make_float4(f[0], f[1], f[2], f[3]);
#else
    return __ldcg(p);
#endif
}

/* Sum / max over the lanes of one warp (every lane gets the result). */
static __device__ __forceinline__ float ms_warp_sum(float v) {
#pragma unroll
    for (int m = MS_WARP / 2; m > 0; m >>= 1) v += ms_shfl_xor(v, m);
    return v;
}
static __device__ __forceinline__ float ms_warp_max(float v) {
#pragma unroll
    for (int m = MS_WARP / 2; m > 0; m >>= 1) v = fmaxf(v, ms_shfl_xor(v, m));
    return v;
}

/* BF16 bits -> float (exact). */
static __device__ __forceinline__ float ms_bf16_to_f32_dev(uint32_t h) { return __uint_as_float(h << 16); }
/* Two BF16 in one 32-bit word (low first) -> float2. */
static __device__ __forceinline__ float2 ms_bf16x2_to_f32x2(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
/* F16 bits -> float (exact). */
static __device__ __forceinline__ float ms_f16_to_f32_dev(uint32_t h) {
    __half_raw r;
    r.x = (unsigned short)h;
    return __half2float(__half(r));
}
/* Two F16 in one word -> float2. */
static __device__ __forceinline__ float2 ms_f16x2_to_f32x2(uint32_t w) {
    return make_float2(ms_f16_to_f32_dev(w & 0xffffu), ms_f16_to_f32_dev(w >> 16));
}
/* E8M0 scale byte -> 2^(e-127) as ms_e8m0_to_f32 computes it (0xff NaN, 0 -> 2^-127). */
static __device__ __forceinline__ float ms_e8m0_to_f32_dev(uint32_t e) {
    return __uint_as_float(e == 0xffu ? 0x7fc00000u : e == 0 ? 0x00400000u : e << 23);
}
/* Eight MXFP4 e2m1 nibbles of a word (low nibble first) -> twice their values
 * (exact small integers -12..12): magnitudes by one byte-permute table lookup
 * per four nibbles, each placed under the float 2^23 to read it as a number,
 * the sign XORed in from the nibble's bit 3. The 1/2 goes into the scale. */
static __device__ __forceinline__ void ms_e2m1x8_times2(uint32_t q, float *out) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        uint32_t sel = (q >> (16 * half)) & 0x7777u;
        uint32_t mag = __byte_perm(0x03020100u, 0x0C080604u, sel); /* 2 * {0,.5,1,1.5,2,3,4,6} */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int j = 4 * half + i;
            float f = __uint_as_float(__byte_perm(mag, 0x4B000000u, 0x7540u | (uint32_t)i)) - 8388608.0f;
            out[j] = __uint_as_float(__float_as_uint(f) ^ ((q << (28 - 4 * j)) & 0x80000000u));
        }
    }
}
/* MXFP4 e2m1 nibble -> float: magnitudes {0,.5,1,1.5,2,3,4,6} (twice: a
 * packed table of 4-bit integers), sign in bit 3. */
static __device__ __forceinline__ float ms_e2m1_to_f32(uint32_t nib) {
    float m = (float)((0xC8643210u >> ((nib & 7u) * 4u)) & 15u) * 0.5f;
    return (nib & 8u) ? -m : m;
}

#endif
