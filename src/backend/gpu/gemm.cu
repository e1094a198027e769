/* gemm.cu — prefill products on tensor cores through the vendor BLAS (contract and
 * the accuracy scheme in gemm.h): dense matmuls of n tokens and the routed experts
 * of a layer in expert-major grouped form. Only the BLAS names of gpu_blas.h and the
 * runtime names of gpu_port.h, so the HIP compiler builds this file too (without HIPBLAS the
 * GEMMs are left out and the hooks decline). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gpu_internal.h"
#include "backend/gpu/gpu_blas.h"
extern "C" {
#include "core/backend.h" /* C linkage (ms_moe_experts_composed) before gemm.h includes it */
}
#include "backend/gpu/gemm.h"
#include "backend/gpu/gemm_mma.h"
#include "backend/gpu/backend_gpu.h"

/* accessors of backend_gpu.cu (backend_gpu_blocks.h has their siblings) */
ms_gpu *ms_gpu_be_dev(ms_backend *be);
void ms_gpu_be_note(ms_backend *be, int rc, const ms_err *e);
void **ms_gpu_be_gemm(ms_backend *be);

#define XS_CAP ((size_t)64 << 20)  /* split activations, BF16 elements per group */
#define CS_CAP ((size_t)64 << 20)  /* GEMM outputs, floats per group */
#define WS_CAP ((size_t)256 << 20) /* dequantized weights, BF16 elements per group (at least one expert) */
#define MROWS 1024                 /* pairs of one expert per item (more: several items) */
#define COLPAD 16                  /* columns of an item rounded up to this (GEMM size classes) */
#define XS_CAP_RB ((size_t)192 << 20) /* split activations of the row-block form (a copy per row block) */

/* BF16 parts of a weight: 0 when it is used as stored (BF16, no scale), 1 when one
 * BF16 matrix holds it exactly (MXFP4: e2m1 times a power of two), 2 otherwise (hi + lo;
 * exact for INT4 with BF16 or F16 group scales: (u - uz) x s has at most 4 + 11 significant
 * bits; and for Q8 with BF16 block scales: q x s, |q| <= 127, has at most 7 + 8); -1: F32 (the F32
 * GEMM), or a dtype the GEMMs do not take. */
static int wparts(const ms_qmat *w) {
    switch (w->dtype) {
    case MS_DT_BF16: return w->scale ? 2 : 0;
    case MS_DT_F4: return w->scale_dtype == MS_DT_F8_E8M0 ? 1 : 2;
    case MS_DT_F16:
    case MS_DT_I4:
    case MS_DT_Q8:
    case MS_DT_F8_E4M3: return 2;
    default: return -1;
    }
}

#if MS_GPU_HAVE_BLAS

/* ------------------------------------------------------------ device helpers */

/* float -> BF16 bits, round to nearest even (NaN stays a quiet NaN). */
static __device__ __forceinline__ uint16_t bf16_rn(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static __device__ __forceinline__ float bf16_f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
/* v = hi + mid + lo, each the BF16 rounding of what is left (exact to 2^-27 |v|; non-finite v: hi alone). */
static __device__ __forceinline__ void split3(float v, uint16_t *hi, uint16_t *mid, uint16_t *lo) {
    uint16_t h = bf16_rn(v);
    float r = v - bf16_f(h);
    if (!(fabsf(v) < 3.0e38f)) r = 0.0f;
    uint16_t m = bf16_rn(r);
    float r2 = r - bf16_f(m);
    *hi = h, *mid = m, *lo = bf16_rn(r2);
}

/* A weight element of any stored dtype, scale applied: the same arithmetic as the
 * CPU's ms_qmat_row (value times its block scale, one F32 rounding). */
typedef struct {
    const uint8_t *w, *s, *z; /* z: I4 zero points (core/qmat.h), NULL: symmetric */
    int64_t cols, scols;
    int dt, sdt, brow, bcol;
} wview;
enum { WD_F32, WD_F16, WD_BF16, WD_FP8, WD_F4, WD_I4, WD_Q8 };
enum { WS_NONE, WS_F32, WS_BF16, WS_E8M0, WS_F16 };

/* The view of a placed weight (validated as the matmul kernels do). */
static int wview_of(const ms_qmat *w, wview *q, ms_err *err) {
    int rc = ms_gpu_qmat_check(w, "weight", err);
    if (rc) return rc;
    q->w = (const uint8_t *)w->data, q->s = (const uint8_t *)w->scale, q->cols = w->cols;
    q->z = w->dtype == MS_DT_I4 ? (const uint8_t *)w->zero : NULL;
    q->dt = w->dtype == MS_DT_F32 ? WD_F32 : w->dtype == MS_DT_F16 ? WD_F16 : w->dtype == MS_DT_BF16 ? WD_BF16
            : w->dtype == MS_DT_F8_E4M3 ? WD_FP8 : w->dtype == MS_DT_I4 ? WD_I4 : w->dtype == MS_DT_Q8 ? WD_Q8 : WD_F4;
    q->sdt = !w->scale ? WS_NONE : w->scale_dtype == MS_DT_F32 ? WS_F32 : w->scale_dtype == MS_DT_BF16 ? WS_BF16
             : w->scale_dtype == MS_DT_F16 ? WS_F16 : WS_E8M0;
    q->brow = w->scale ? w->brow : 1, q->bcol = w->scale ? w->bcol : 1;
    q->scols = w->scale ? (w->cols + w->bcol - 1) / w->bcol : 0;
    return MS_OK;
}
/* The I4 zero point uz of row r, group g (8 without zero points; core/qmat.h). */
static __device__ __forceinline__ int wv_uz(const wview &q, int64_t r, int64_t g) {
    if (!q.z) return 8;
    return (int)((((const uint32_t *)q.z)[(r >> 3) * q.scols + g] >> (4 * (r & 7))) & 15u);
}
/* Scale element si of q. */
static __device__ __forceinline__ float wv_scale(const wview &q, int64_t si) {
    return q.sdt == WS_F32    ? ((const float *)q.s)[si]
           : q.sdt == WS_BF16 ? ms_bf16_to_f32_dev(((const uint16_t *)q.s)[si])
           : q.sdt == WS_F16  ? ms_f16_to_f32_dev(((const uint16_t *)q.s)[si])
                              : ms_e8m0_to_f32_dev(q.s[si]);
}
/* Element (r, c), scale applied. */
static __device__ __forceinline__ float wv_at(const wview &q, int64_t r, int64_t c) {
    int64_t i = r * q.cols + c;
    float v;
    switch (q.dt) {
    case WD_F32: return ((const float *)q.w)[i];
    case WD_F16: return ms_f16_to_f32_dev(((const uint16_t *)q.w)[i]);
    case WD_BF16: v = ms_bf16_to_f32_dev(((const uint16_t *)q.w)[i]); break;
    case WD_FP8: v = ms_fp8_e4m3_to_f32_dev(q.w[i]); break;
    case WD_I4: v = (float)((int)((q.w[i >> 1] >> ((i & 1) * 4)) & 15u) - wv_uz(q, r, c / q.bcol)); break;
    case WD_Q8: v = (float)(int8_t)q.w[i]; break;
    default: v = ms_e2m1_to_f32((q.w[i >> 1] >> ((i & 1) * 4)) & 15u); break;
    }
    if (q.sdt != WS_NONE) v *= wv_scale(q, (r / q.brow) * q.scols + c / q.bcol);
    return v;
}

/* One dequantization job: rows r0.. of a weight into nq BF16 matrices [rows, cols] at out,
 * out + rows * cols (hi, lo). */
typedef struct {
    wview q;
    uint16_t *out;
    int64_t r0, rows;
    int nq;
} deq_job;

/* Job blockIdx.y: its rows as BF16 hi (and lo = the rounding of the rest). */
__global__ void k_deq(const deq_job *jobs) {
    const deq_job jb = jobs[blockIdx.y];
    int64_t n = jb.rows * jb.q.cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / jb.q.cols, c = i - r * jb.q.cols;
        float v = wv_at(jb.q, jb.r0 + r, c);
        uint16_t h = bf16_rn(v);
        jb.out[i] = h;
        if (jb.nq > 1) {
            float rest = v - bf16_f(h);
            jb.out[n + i] = (fabsf(v) < 3.0e38f) ? bf16_rn(rest) : (uint16_t)0;
        }
    }
}

/* k_deq's arithmetic (value times its block scale, one F32 rounding, then hi and lo) on
 * eight columns per thread: a row per block iteration (its scale row computed once), one
 * load of the row's 8 stored values (4 to 32 bytes), the scale once per 8 columns, two
 * 16-byte stores. For jobs whose layout deq_fast_ok accepts; the same bits as k_deq. */
__global__ void k_deq8(const deq_job *jobs) {
    const deq_job jb = jobs[blockIdx.y];
    const wview &q = jb.q;
    const int64_t c8n = q.cols / 8, n = jb.rows * q.cols;
    int bsh = 0;
    while ((1 << bsh) < q.bcol) bsh++;
    for (int64_t r = blockIdx.x; r < jb.rows; r += gridDim.x) {
        const int64_t row = jb.r0 + r, srow = (row / q.brow) * q.scols;
        for (int64_t k = threadIdx.x; k < c8n; k += blockDim.x) {
            const int64_t c = 8 * k, i = row * q.cols + c;
            float v[8];
            if (q.dt == WD_FP8) {
                uint2 u = *(const uint2 *)(q.w + i);
                float2 f0 = ms_fp8x2_e4m3_to_f32x2(u.x & 0xffffu), f1 = ms_fp8x2_e4m3_to_f32x2(u.x >> 16);
                float2 f2 = ms_fp8x2_e4m3_to_f32x2(u.y & 0xffffu), f3 = ms_fp8x2_e4m3_to_f32x2(u.y >> 16);
                v[0] = f0.x, v[1] = f0.y, v[2] = f1.x, v[3] = f1.y, v[4] = f2.x, v[5] = f2.y, v[6] = f3.x, v[7] = f3.y;
            } else if (q.dt == WD_Q8) {
                uint2 u = *(const uint2 *)(q.w + i);
#pragma unroll
                for (int e = 0; e < 4; e++) v[e] = (float)(int8_t)(u.x >> (8 * e)), v[4 + e] = (float)(int8_t)(u.y >> (8 * e));
            } else if (q.dt == WD_F4) {
                uint32_t u = *(const uint32_t *)(q.w + i / 2);
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = ms_e2m1_to_f32((u >> (4 * e)) & 15u);
            } else if (q.dt == WD_I4) { /* 8 columns inside one group (8 | bcol): one zero point */
                uint32_t u = *(const uint32_t *)(q.w + i / 2);
                int uz = wv_uz(q, row, c >> bsh);
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = (float)((int)((u >> (4 * e)) & 15u) - uz);
            } else {
                uint4 u = *(const uint4 *)(q.w + 2 * i);
                const uint32_t h[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float2 f = q.dt == WD_BF16 ? ms_bf16x2_to_f32x2(h[e]) : ms_f16x2_to_f32x2(h[e]);
                    v[2 * e] = f.x, v[2 * e + 1] = f.y;
                }
            }
            if (q.sdt != WS_NONE && q.dt != WD_F16) { /* as wv_at: F16 as stored */
                float sc = wv_scale(q, srow + (c >> bsh));
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] *= sc;
            }
            uint32_t hw[4], lw[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                uint16_t h0 = bf16_rn(v[2 * e]), h1 = bf16_rn(v[2 * e + 1]);
                hw[e] = (uint32_t)h0 | ((uint32_t)h1 << 16);
                uint16_t l0 = fabsf(v[2 * e]) < 3.0e38f ? bf16_rn(v[2 * e] - bf16_f(h0)) : (uint16_t)0;
                uint16_t l1 = fabsf(v[2 * e + 1]) < 3.0e38f ? bf16_rn(v[2 * e + 1] - bf16_f(h1)) : (uint16_t)0;
                lw[e] = (uint32_t)l0 | ((uint32_t)l1 << 16);
            }
            int64_t o = r * q.cols + c;
            *(uint4 *)(jb.out + o) = make_uint4(hw[0], hw[1], hw[2], hw[3]);
            if (jb.nq > 1) *(uint4 *)(jb.out + n + o) = make_uint4(lw[0], lw[1], lw[2], lw[3]);
        }
    }
}

/* Whether k_deq8 takes job j: FP8, Q8, MXFP4, INT4, BF16 or F16 rows of a multiple of 8 columns, scale
 * blocks of a power-of-two multiple of 8 columns, the stored rows and the output 16-byte
 * aligned where k_deq8 reads and writes them whole. */
static int deq_fast_ok(const deq_job *j) {
    const wview *q = &j->q;
    if (q->dt == WD_F32 || q->cols % 8 || (uintptr_t)j->out % 16) return 0;
    if (q->sdt != WS_NONE && (q->bcol % 8 || (q->bcol & (q->bcol - 1)))) return 0;
    int eb = q->dt == WD_FP8 || q->dt == WD_Q8 ? 8 : q->dt == WD_F4 || q->dt == WD_I4 ? 4 : 16; /* bytes of 8 stored values */
    return (uintptr_t)q->w % (uintptr_t)eb == 0;
}
/* MS_GPU_DEQ=old (read once; A/B measurements): the element-wise dequantization (k_deq). */
static int deq_old(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("MS_GPU_DEQ");
        v = e && !strcmp(e, "old");
    }
    return v;
}

/* Dense: x [n, K] -> xs [3n, K] (rows t: hi, n + t: mid, 2n + t: lo). */
__global__ void k_split_dense(const float *x, int64_t n, int64_t K, uint16_t *xs) {
    int64_t tot = n * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < tot; i += (int64_t)gridDim.x * blockDim.x) {
        uint16_t h, m, l;
        split3(x[i], &h, &m, &l);
        xs[i] = h, xs[tot + i] = m, xs[2 * tot + i] = l;
    }
}
/* Dense: y[t, r0 + r] (+)= sum over the parts of cs [nq][3n][mr]; the small parts first. */
__global__ void k_reduce_dense(float *y, const float *cs, int64_t n, int64_t mr, int64_t M, int64_t r0, int nq,
                               int acc) {
    int64_t tot = n * mr;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < tot; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / mr, r = i - t * mr;
        float s = 0.0f;
        for (int q = nq - 1; q >= 0; q--)
            for (int j = 2; j >= 0; j--) s += cs[((int64_t)q * 3 * n + j * n + t) * mr + r];
        float *o = y + t * M + r0 + r;
        *o = acc ? *o + s : s;
    }
}

/* ---------------------------------------------------------------- handle */

struct ms_gpu_blas {
    ms_gpu *g;
    blas_api api; /* the BLAS's entry points (gpu_blas.h) */
    void *lib;    /* its dlopen handle (NULL when linked) */
    blasHandle_t h;
    uint16_t *xs, *ws;
    float *cs;
    void *meta;
    size_t xs_cap, ws_cap, cs_cap, meta_cap; /* elements of xs / ws (BF16), cs (F32), bytes of meta */
    uint8_t *hmeta;                          /* host image of meta */
    size_t hmeta_cap;
    int *hcnt; /* host: per-token counts (the combine's CSR) */
    size_t hcnt_cap;
    uint64_t mma_calls; /* moe and dense calls through gemm_mma.cu's kernel (ms_gpu_blas_mma_calls) */
};

/* Device scratch *p of at least need elements of elem bytes (grown by a quarter more; old contents
 * dropped: every user refills it). */
static int grow_dev(ms_gpu *g, void **p, size_t *cap, size_t need, size_t elem, ms_err *err) {
    if (*cap >= need) return MS_OK;
    ms_gpu_free(g, *p);
    *p = NULL, *cap = 0;
    size_t want = need + need / 4;
    int rc = ms_gpu_alloc(g, want * elem, p, err);
    if (rc) return rc;
    *cap = want;
    return MS_OK;
}
/* Host scratch of at least bytes (realloc: contents kept). */
static int grow_host(void **p, size_t *cap, size_t bytes, ms_err *err) {
    if (*cap >= bytes) return MS_OK;
    size_t want = bytes + bytes / 4;
    void *q = realloc(*p, want);
    if (!q) return ms_fail(err, MS_ERR_NOMEM, "gemm: out of host memory (%zu bytes)", want);
    *p = q, *cap = want;
    return MS_OK;
}

/* The BLAS's entry points into api: resolved in the library BLAS_LIBRARY names (dlopen;
 * *lib its handle), or the linked functions when it names none. MS_ERR_UNSUPPORTED with
 * the loader's message when the library or a symbol is missing. */
static int blas_load(blas_api *api, void **lib, ms_err *err) {
    const char *name = BLAS_LIBRARY;
    *lib = NULL;
    if (!name) {
#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP) /* linked: the same functions (pointer types by cast) */
        api->create = (decltype(api->create))&BLAS_FN_CREATE, api->destroy = (decltype(api->destroy))&BLAS_FN_DESTROY;
        api->set_stream = (decltype(api->set_stream))&BLAS_FN_SET_STREAM;
        api->gemm_ex = (decltype(api->gemm_ex))&BLAS_FN_GEMM_EX;
        api->gemm_batched_ex = (decltype(api->gemm_batched_ex))&BLAS_FN_GEMM_BATCHED_EX;
#endif
        return MS_OK;
    }
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) return ms_fail(err, MS_ERR_UNSUPPORTED, "gpu (%s): cannot load %s: %s", MS_GPU_BACKEND_NAME, name, dlerror());
    const char *syms[5] = {MS_BLAS_STR(BLAS_FN_CREATE), MS_BLAS_STR(BLAS_FN_DESTROY), MS_BLAS_STR(BLAS_FN_SET_STREAM),
                           MS_BLAS_STR(BLAS_FN_GEMM_EX), MS_BLAS_STR(BLAS_FN_GEMM_BATCHED_EX)};
    void *f[5];
    for (int i = 0; i < 5; i++)
        if (!(f[i] = dlsym(h, syms[i]))) {
            dlclose(h);
            return ms_fail(err, MS_ERR_UNSUPPORTED, "gpu (%s): %s has no %s", MS_GPU_BACKEND_NAME, name, syms[i]);
        }
    api->create = (decltype(api->create))f[0], api->destroy = (decltype(api->destroy))f[1];
    api->set_stream = (decltype(api->set_stream))f[2], api->gemm_ex = (decltype(api->gemm_ex))f[3];
    api->gemm_batched_ex = (decltype(api->gemm_batched_ex))f[4];
    *lib = h;
    return MS_OK;
}

extern "C" int ms_gpu_blas_open(ms_gpu *g, ms_gpu_blas **out, ms_err *err) {
    *out = NULL;
    ms_gpu_blas *b = (ms_gpu_blas *)calloc(1, sizeof *b);
    if (!b) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    b->g = g;
    int rc = blas_load(&b->api, &b->lib, err);
    if (rc) {
        free(b);
        return rc;
    }
    if (b->api.create(&b->h) != BLAS_SUCCESS) {
        if (b->lib) dlclose(b->lib);
        free(b);
        return ms_fail(err, MS_ERR_UNSUPPORTED, "gpu (%s): cannot create a BLAS handle", MS_GPU_BACKEND_NAME);
    }
    if (b->api.set_stream(b->h, g->stream) != BLAS_SUCCESS) {
        b->api.destroy(b->h);
        if (b->lib) dlclose(b->lib);
        free(b);
        return ms_fail(err, MS_ERR_UNSUPPORTED, "gpu (%s): cannot bind the BLAS handle to the stream", MS_GPU_BACKEND_NAME);
    }
    *out = b;
    return MS_OK;
}

extern "C" void ms_gpu_blas_close(ms_gpu_blas *b) {
    if (!b) return;
    ms_err e = {0};
    (void)ms_gpu_sync(b->g, &e);
    b->api.destroy(b->h);
    if (b->lib) dlclose(b->lib);
    ms_gpu_free(b->g, b->xs), ms_gpu_free(b->g, b->ws), ms_gpu_free(b->g, b->cs), ms_gpu_free(b->g, b->meta);
    free(b->hmeta), free(b->hcnt), free(b);
}

/* Blocks of 256 threads for n elements of a grid-stride loop (at most 8192). */
static unsigned grid_for(int64_t n) {
    int64_t k = (n + 255) / 256;
    return (unsigned)(k < 1 ? 1 : k > 8192 ? 8192 : k);
}

/* A BLAS status as an ms status (MS_ERR_UNSUPPORTED with the status number). */
static int blas_ok(blasStatus_t s, ms_err *err, const char *what) {
    if (s == BLAS_SUCCESS) return MS_OK;
    return ms_fail(err, MS_ERR_UNSUPPORTED, "gpu (%s): BLAS %s failed (status %d)", MS_GPU_BACKEND_NAME, what, (int)s);
}

/* C [cols, m] (row-major, ld m) = B [cols, k] A^T with A [m, k] row-major: column-major
 * C^T = op_T(A) B^T, both of them BF16, F32 out and accumulation. */
static int gemm_bf16(ms_gpu_blas *b, int64_t m, int64_t cols, int64_t k, const void *A, const void *B, float *C,
                     ms_err *err) {
    const float one = 1.0f, zero = 0.0f;
    return blas_ok(b->api.gemm_ex(b->h, BLAS_OP_T, BLAS_OP_N, (int)m, (int)cols, (int)k, &one, A, BLAS_R_16BF, (int)k, B,
                              BLAS_R_16BF, (int)k, &zero, C, BLAS_R_32F, (int)m, BLAS_COMPUTE_32F, BLAS_GEMM_DEFAULT),
                   err, "gemm (bf16)");
}

/* gemm_bf16 with C's leading dimension ldc (>= m: m rows of a taller output). */
static int gemm_bf16_ld(ms_gpu_blas *b, int64_t m, int64_t cols, int64_t k, const void *A, const void *B, float *C,
                        int64_t ldc, ms_err *err) {
    const float one = 1.0f, zero = 0.0f;
    return blas_ok(b->api.gemm_ex(b->h, BLAS_OP_T, BLAS_OP_N, (int)m, (int)cols, (int)k, &one, A, BLAS_R_16BF, (int)k, B,
                              BLAS_R_16BF, (int)k, &zero, C, BLAS_R_32F, (int)ldc, BLAS_COMPUTE_32F, BLAS_GEMM_DEFAULT),
                   err, "gemm (bf16)");
}

static int dense_mma(ms_gpu_blas *b, float *y, const float *x, int n, const ms_qmat *w, int acc, ms_err *err);

extern "C" int ms_gpu_blas_matmul(ms_gpu_blas *b, float *y, const float *x, int n, const ms_qmat *w, int acc,
                                  ms_err *err) {
    if (!b || !y || !x || !w || n < 1) return ms_fail(err, MS_ERR_ARG, "gemm: bad arguments");
    int rc = ms_gpu_qmat_check(w, "weight", err);
    if (rc) return rc;
    if ((rc = dense_mma(b, y, x, n, w, acc, err)) != -1) return rc; /* -1: not taken */
    int64_t M = w->rows, K = w->cols;
    if (w->dtype == MS_DT_F32 && !w->scale) { /* F32 weights: the F32 GEMM (no TF32: default math mode) */
        const float one = 1.0f, beta = acc ? 1.0f : 0.0f;
        return blas_ok(b->api.gemm_ex(b->h, BLAS_OP_T, BLAS_OP_N, (int)M, n, (int)K, &one, w->data, BLAS_R_32F, (int)K, x,
                                  BLAS_R_32F, (int)K, &beta, y, BLAS_R_32F, (int)M, BLAS_COMPUTE_32F, BLAS_GEMM_DEFAULT),
                       err, "gemm (f32)");
    }
    int nq = wparts(w);
    if (nq < 0) return ms_fail(err, MS_ERR_UNSUPPORTED, "gemm: weight dtype %s", ms_dtype_name(w->dtype));
    int np = nq ? nq : 1;
    /* rows per block: all of them when the weight is used as stored, else what fits the scratch */
    int64_t mr = M;
    if (nq) {
        mr = (int64_t)(WS_CAP / ((size_t)np * (size_t)K));
        if (mr < 1) mr = 1;
        if (mr > M) mr = M;
    }
    int64_t cs_rows = 3 * (int64_t)n * np;
    if ((rc = grow_dev(b->g, (void **)&b->xs, &b->xs_cap, (size_t)(3 * (int64_t)n * K), 2, err))) return rc;
    if ((rc = grow_dev(b->g, (void **)&b->cs, &b->cs_cap, (size_t)(cs_rows * mr), 4, err))) return rc;
    if (nq && (rc = grow_dev(b->g, (void **)&b->ws, &b->ws_cap, (size_t)(np * mr * K), 2, err))) return rc;
    if (nq && (rc = grow_dev(b->g, &b->meta, &b->meta_cap, sizeof(deq_job), 1, err))) return rc;
    k_split_dense<<<grid_for((int64_t)n * K), 256, 0, b->g->stream>>>(x, n, K, b->xs);
    if ((rc = ms_gpu_launched(err, "gemm split"))) return rc;
    wview q;
    if ((rc = wview_of(w, &q, err))) return rc;
    for (int64_t r0 = 0; r0 < M; r0 += mr) {
        int64_t rows = M - r0 < mr ? M - r0 : mr;
        const uint16_t *A = (const uint16_t *)w->data + r0 * K;
        if (nq) {
            deq_job j = {q, b->ws, r0, rows, np};
            if ((rc = ms_gpu_upload(b->g, b->meta, &j, sizeof j, err))) return rc;
            if (!deq_old() && deq_fast_ok(&j))
                k_deq8<<<dim3((unsigned)(rows < 4096 ? rows : 4096), 1), 128, 0, b->g->stream>>>((const deq_job *)b->meta);
            else
                k_deq<<<dim3(grid_for(rows * K), 1), 256, 0, b->g->stream>>>((const deq_job *)b->meta);
            if ((rc = ms_gpu_launched(err, "gemm dequantize"))) return rc;
            A = b->ws;
        }
        for (int p = 0; p < np; p++)
            if ((rc = gemm_bf16(b, rows, 3 * (int64_t)n, K, A + (int64_t)p * rows * K, b->xs,
                                b->cs + (int64_t)p * 3 * n * rows, err)))
                return rc;
        k_reduce_dense<<<grid_for((int64_t)n * rows), 256, 0, b->g->stream>>>(y, b->cs, n, rows, M, r0, np, acc);
        if ((rc = ms_gpu_launched(err, "gemm reduce"))) return rc;
    }
    return MS_OK;
}

/* ------------------------------------------------------ routed experts */

/* One pair of a group: its token's row, its first split row (the hi row; mid and lo
 * follow at + m and + 2m), m (its item's pairs). */
typedef struct {
    int tok, col, m, item; /* item: index of the pair's item in the group (its biases) */
} pair_rec;

/* xs rows col + j m (j: hi, mid, lo) := split(in[tok]) for every pair (a block each). */
__global__ void k_split_pairs(const float *in, const pair_rec *pr, int64_t D, uint16_t *xs) {
    pair_rec p = pr[blockIdx.x];
    const float *src = in + (int64_t)p.tok * D;
    uint16_t *d0 = xs + (int64_t)p.col * D, *d1 = d0 + (int64_t)p.m * D, *d2 = d1 + (int64_t)p.m * D;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) split3(src[c], d0 + c, d1 + c, d2 + c);
}

/* The row-block form of FP8 block-scaled experts (moe_rb_block): the weight's E4M3 values
 * are exact in BF16 unscaled, and for the rows of one scale row block rb the product is
 *   y[r] = sum_kb s[rb, kb] sum_{c in kb} q[r, c] x[c] = sum_c q[r, c] (x[c] s[rb, c / bcol]),
 * so each row block's GEMM takes the activations times that block's scales (one F32
 * rounding, as the CPU's w s) split into three BF16 parts: one weight part instead of
 * hi + lo. The scales of a matrix: sdt (WS_F32 / WS_BF16), scols per scale row. */
static __device__ __forceinline__ float rb_scale(const void *s, int sdt, int64_t i) {
    return sdt == WS_F32 ? ((const float *)s)[i] : ms_bf16_to_f32_dev(((const uint16_t *)s)[i]);
}
/* xs slice z = mt nrb + rb, rows col + j m (j: hi, mid, lo) := split(in[tok] s_mt[rb, c / bcol])
 * for every pair (blockIdx.x) and slice (blockIdx.y); sc [items][3]: gate, up, down scales. */
__global__ void k_split_pairs_rb(const float *in, const pair_rec *pr, const void *const *sc, int64_t D, int nrb,
                                 int64_t cols, int sdt, int64_t scols, int bshift, uint16_t *xs) {
    pair_rec p = pr[blockIdx.x];
    int z = blockIdx.y, mt = z / nrb, rb = z % nrb;
    const void *s = sc[3 * p.item + mt];
    const float *src = in + (int64_t)p.tok * D;
    uint16_t *d0 = xs + ((int64_t)z * cols + p.col) * D, *d1 = d0 + (int64_t)p.m * D, *d2 = d1 + (int64_t)p.m * D;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x)
        split3(src[c] * rb_scale(s, sdt, rb * scols + (c >> bshift)), d0 + c, d1 + c, d2 + c);
}

/* The sum of a pair's parts of one output element: cs [parts][cols][ld], rows col + j m (j < nj:
 * 3 activation parts, or 1 where the GEMM summed them: gemm_mma.cu). */
static __device__ __forceinline__ float parts_sum(const float *cs, int64_t cols, int64_t ld, int part0, int nq,
                                                  const pair_rec &p, int64_t e, int nj = 3) {
    float s = 0.0f;
    for (int q = nq - 1; q >= 0; q--)
        for (int j = nj - 1; j >= 0; j--) s += cs[((int64_t)(part0 + q) * cols + p.col + (int64_t)j * p.m) * ld + e];
    return s;
}

/* gate / up of every pair from the stage-1 outputs (cs1 [mats][nq][cols][M1]; fused: one
 * matrix of interleaved rows), the item's biases (bias [items][3]: gate, up, down) added,
 * the activation, split into xs rows [cols][I]. */
__global__ void k_glu_pairs(const float *cs1, const pair_rec *pr, const void *const *bias, int64_t cols, int64_t I,
                            int64_t M1, int nq, int fused, int bdt, ms_gpu_glu_params act, uint16_t *xs) {
    pair_rec p = pr[blockIdx.x];
    const void *gb = bias[3 * p.item], *ub = bias[3 * p.item + 1];
    uint16_t *d0 = xs + (int64_t)p.col * I, *d1 = d0 + (int64_t)p.m * I, *d2 = d1 + (int64_t)p.m * I;
    for (int64_t i = threadIdx.x; i < I; i += blockDim.x) {
        float g, u;
        if (fused) {
            g = parts_sum(cs1, cols, M1, 0, nq, p, 2 * i) + ms_bias_at(gb, bdt, 2 * i);
            u = parts_sum(cs1, cols, M1, 0, nq, p, 2 * i + 1) + ms_bias_at(gb, bdt, 2 * i + 1);
        } else {
            g = parts_sum(cs1, cols, M1, 0, nq, p, i) + ms_bias_at(gb, bdt, i);
            u = parts_sum(cs1, cols, M1, nq, nq, p, i) + ms_bias_at(ub, bdt, i);
        }
        split3(ms_glu_apply(g, u, act), d0 + i, d1 + i, d2 + i);
    }
}

/* k_glu_pairs of the row-block form: the activation h of every pair from the stage-1 outputs
 * (one part), then for each of the down matrix's nrb2 row blocks its split h s_down[rb2, i / bcol]
 * into xs slice rb2 (rows [cols][I] per slice). */
__global__ void k_glu_pairs_rb(const float *cs1, const pair_rec *pr, const void *const *bias, const void *const *sc,
                               int64_t cols, int64_t I, int64_t M1, int fused, int bdt, ms_gpu_glu_params act, int nrb2,
                               int sdt, int64_t scols, int bshift, uint16_t *xs) {
    pair_rec p = pr[blockIdx.x];
    const void *gb = bias[3 * p.item], *ub = bias[3 * p.item + 1], *sd = sc[3 * p.item + 2];
    for (int64_t i = threadIdx.x; i < I; i += blockDim.x) {
        float g, u;
        if (fused) {
            g = parts_sum(cs1, cols, M1, 0, 1, p, 2 * i) + ms_bias_at(gb, bdt, 2 * i);
            u = parts_sum(cs1, cols, M1, 0, 1, p, 2 * i + 1) + ms_bias_at(gb, bdt, 2 * i + 1);
        } else {
            g = parts_sum(cs1, cols, M1, 0, 1, p, i) + ms_bias_at(gb, bdt, i);
            u = parts_sum(cs1, cols, M1, 1, 1, p, i) + ms_bias_at(ub, bdt, i);
        }
        float h = ms_glu_apply(g, u, act);
        for (int rb = 0; rb < nrb2; rb++) {
            uint16_t *d0 = xs + ((int64_t)rb * cols + p.col) * I + i;
            split3(h * rb_scale(sd, sdt, rb * scols + (i >> bshift)), d0, d0 + (int64_t)p.m * I,
                   d0 + 2 * (int64_t)p.m * I);
        }
    }
}

/* k_glu_pairs_rb's activation h of every pair (blockIdx.x) from stage-1 outputs that hold one
 * summed part per pair (gemm_mma.cu), as F32 rows h[pair][I] for the second stage. */
__global__ void k_glu_pairs_h(const float *cs1, const pair_rec *pr, const void *const *bias, int64_t cols, int64_t I,
                              int64_t M1, int fused, int bdt, ms_gpu_glu_params act, float *h) {
    pair_rec p = pr[blockIdx.x];
    const void *gb = bias[3 * p.item], *ub = bias[3 * p.item + 1];
    float *o = h + (int64_t)blockIdx.x * I;
    for (int64_t i = threadIdx.x; i < I; i += blockDim.x) {
        float g, u;
        if (fused) {
            g = parts_sum(cs1, cols, M1, 0, 1, p, 2 * i, 1) + ms_bias_at(gb, bdt, 2 * i);
            u = parts_sum(cs1, cols, M1, 0, 1, p, 2 * i + 1, 1) + ms_bias_at(gb, bdt, 2 * i + 1);
        } else {
            g = parts_sum(cs1, cols, M1, 0, 1, p, i, 1) + ms_bias_at(gb, bdt, i);
            u = parts_sum(cs1, cols, M1, 1, 1, p, i, 1) + ms_bias_at(ub, bdt, i);
        }
        o[i] = ms_glu_apply(g, u, act);
    }
}

/* acc[tok] += w[p] * (down(p) + bias) over each token's pairs in order (tlist: the
 * tokens, toff: CSR into plist, group pair indices ascending; nj: activation parts per
 * pair in cs2). One block per token. */
__global__ void k_combine(float *acc, const float *cs2, const pair_rec *pr, const float *pw, const void *const *bias,
                          const int *tlist, const int *toff, const int *plist, int64_t cols, int64_t D, int nq,
                          int bdt, int nj) {
    int t = tlist[blockIdx.x], k0 = toff[blockIdx.x], k1 = toff[blockIdx.x + 1];
    float *o = acc + (int64_t)t * D;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
        float v = o[c];
        for (int k = k0; k < k1; k++) {
            int pi = plist[k];
            pair_rec p = pr[pi];
            float y = parts_sum(cs2, cols, D, 0, nq, p, c, nj) + ms_bias_at(bias[3 * p.item + 2], bdt, c);
            v += pw[pi] * y;
        }
        o[c] = v;
    }
}

/* Two weights of one dtype, shape and scale layout (one GEMM size class may hold both). */
static int same_layout(const ms_qmat *a, const ms_qmat *b) {
    return a->dtype == b->dtype && a->rows == b->rows && a->cols == b->cols && a->scale_dtype == b->scale_dtype &&
           a->brow == b->brow && a->bcol == b->bcol && !a->scale == !b->scale &&
           (a->dtype != MS_DT_I4 || !a->zero == !b->zero);
}

typedef struct {
    int u, p0, m, P, col; /* expert, first pair, pairs, padded columns (3m rounded up), first column */
} moe_item;

/* The row-block form of a call (0 rows: the hi + lo form): scale row blocks of brow rows,
 * nrb1 of the gate (and up) rows, nrb2 of the down rows; the scales' dtype (WS_*), scale
 * columns of gate and down, log2 of the scale block's columns. */
typedef struct {
    int brow, nrb1, nrb2, sdt, bshift;
    int64_t scols1, scols2;
} moe_rb;

/* n rounded up to a multiple of 8 (pointer alignment in the packed tables). */
static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Split activation elements per column of a group: the largest of the two stages' (row-block
 * form: one copy per row block and matrix). */
static int64_t moe_xrow(const moe_rb *rb, int nmat, int64_t D, int64_t I) {
    if (!rb->brow) return D > I ? D : I;
    int64_t a = (int64_t)nmat * rb->nrb1 * D, c = (int64_t)rb->nrb2 * I;
    return a > c ? a : c;
}

/* One group (items it[0..ni), columns laid out, nexp distinct experts in order) through
 * the device: upload of its tables, dequantization, split, stage-1 GEMMs per size
 * class, activation, stage-2 GEMMs, combine. tmp: host scratch of ni * (4 + 6 ptrs). */
static int moe_group(ms_gpu_blas *b, const ms_moe_args *a, moe_item *it, int ni, int cols, int nexp, int nq,
                     int nmat, int64_t M1, int64_t I, int64_t D, int64_t wexp, int bdt, int ntok, const moe_rb *rb,
                     ms_err *err) {
    int np = nq ? nq : 1, rc;
    int64_t wide = nmat * M1 > D ? nmat * M1 : D;
    /* GEMM entries per item and matrix: one per weight part (row-block form: per row block);
     * the split activations' elements per column */
    int s1 = rb->brow ? rb->nrb1 : np, s2 = rb->brow ? rb->nrb2 : np;
    int64_t xrow = moe_xrow(rb, nmat, D, I);
    int gp0 = it[0].p0, gpn = it[ni - 1].p0 + it[ni - 1].m - gp0;
    size_t n1 = (size_t)ni * nmat * s1, n2 = (size_t)ni * s2;
    size_t o_w = align8((size_t)gpn * sizeof(pair_rec)), o_tl = align8(o_w + (size_t)gpn * 4);
    size_t o_to = align8(o_tl + (size_t)gpn * 4), o_pl = align8(o_to + (size_t)(gpn + 1) * 4);
    size_t o_bias = align8(o_pl + (size_t)gpn * 4), o_sc = o_bias + (size_t)ni * 3 * sizeof(void *);
    size_t o_ptr = o_sc + (size_t)ni * 3 * sizeof(void *);
    size_t o_deq = align8(o_ptr + 3 * (n1 + n2) * sizeof(void *));
    size_t total = o_deq + (size_t)nexp * 3 * sizeof(deq_job);
    size_t hwork = (size_t)ni * (sizeof(int) + 6 * sizeof(void *) + 2 * sizeof(int)) + 64;
    if ((rc = grow_host((void **)&b->hmeta, &b->hmeta_cap, total + hwork, err)) ||
        (rc = grow_dev(b->g, &b->meta, &b->meta_cap, total, 1, err)) ||
        (rc = grow_dev(b->g, (void **)&b->xs, &b->xs_cap, (size_t)cols * (size_t)xrow, 2, err)) ||
        (rc = grow_dev(b->g, (void **)&b->cs, &b->cs_cap, (size_t)np * (size_t)cols * (size_t)wide, 4, err)) ||
        (nq && (rc = grow_dev(b->g, (void **)&b->ws, &b->ws_cap, (size_t)nexp * (size_t)wexp, 2, err))))
        return rc;
    uint8_t *H = b->hmeta, *Dm = (uint8_t *)b->meta;
    pair_rec *pr = (pair_rec *)H;
    float *pw = (float *)(H + o_w);
    int *tl = (int *)(H + o_tl), *to = (int *)(H + o_to), *pl = (int *)(H + o_pl);
    const void **bias = (const void **)(H + o_bias), **ptr = (const void **)(H + o_ptr);
    const void **scl = (const void **)(H + o_sc);
    deq_job *dj = (deq_job *)(H + o_deq);
    int *ord = (int *)(H + align8(total)); /* host work: size-class order, weight pointers, classes */
    const uint16_t **iw = (const uint16_t **)(H + align8(align8(total) + (size_t)ni * sizeof(int)));
    int *cls = (int *)(iw + (size_t)ni * 6);
    for (int i = 0; i < ni; i++) {
        const ms_expert_view *v = &a->views[it[i].u];
        bias[3 * i] = v->gate_bias, bias[3 * i + 1] = v->up_bias, bias[3 * i + 2] = v->down_bias;
        scl[3 * i] = v->gate.scale, scl[3 * i + 1] = nmat == 2 ? v->up.scale : NULL, scl[3 * i + 2] = v->down.scale;
        for (int k = 0; k < it[i].m; k++) {
            int p = it[i].p0 + k;
            pr[p - gp0] = (pair_rec){a->tok[p], it[i].col + k, it[i].m, i};
            pw[p - gp0] = a->w[p];
        }
    }
    /* tokens: a counting sort of the group's pairs by token (stable: pairs ascending per token) */
    int *cnt = b->hcnt;
    memset(cnt, 0, (size_t)(ntok + 1) * sizeof(int));
    for (int p = 0; p < gpn; p++) cnt[a->tok[gp0 + p] + 1]++;
    int nt = 0;
    for (int t = 0; t < ntok; t++) {
        if (cnt[t + 1]) tl[nt] = t, to[nt] = cnt[t], nt++;
        cnt[t + 1] += cnt[t];
    }
    to[nt] = gpn;
    for (int p = 0; p < gpn; p++) pl[cnt[a->tok[gp0 + p]]++] = p;
    /* each item's weights: as stored, or its expert's dequantized parts in ws */
    int e = -1, ndj = 0;
    for (int i = 0; i < ni; i++) {
        const ms_expert_view *v = &a->views[it[i].u];
        const uint16_t **o = iw + (size_t)i * 6;
        if (!nq) {
            o[0] = (const uint16_t *)v->gate.data, o[2] = (const uint16_t *)v->up.data;
            o[4] = (const uint16_t *)v->down.data;
            o[1] = o[3] = o[5] = NULL;
            continue;
        }
        if (i == 0 || it[i].u != it[i - 1].u) { /* a new expert: its dequantization jobs */
            e++;
            uint16_t *base = b->ws + (int64_t)e * wexp;
            for (int mt = 0; mt <= nmat; mt++) {
                const ms_qmat *w = mt == nmat ? &v->down : mt == 0 ? &v->gate : &v->up;
                deq_job j;
                if ((rc = wview_of(w, &j.q, err))) return rc;
                if (rb->brow) j.q.sdt = WS_NONE; /* the row-block form: the E4M3 values unscaled (exact) */
                j.out = base + (int64_t)np * mt * M1 * D;
                j.r0 = 0, j.rows = w->rows, j.nq = np;
                dj[ndj++] = j;
            }
        }
        const uint16_t *base = b->ws + (int64_t)e * wexp;
        for (int mt = 0; mt < 2; mt++)
            for (int q = 0; q < 2; q++)
                o[2 * mt + q] = mt < nmat && q < np ? base + ((int64_t)np * mt + q) * M1 * D : NULL;
        for (int q = 0; q < 2; q++) o[4 + q] = q < np ? base + (int64_t)np * nmat * M1 * D + (int64_t)q * D * I : NULL;
    }
    /* size classes: items by P (insertion sort, stable); per class the stage-1 entries
     * [mat][part][items] and the stage-2 entries [part][items] */
    for (int i = 0; i < ni; i++) {
        int k = i;
        while (k > 0 && it[ord[k - 1]].P > it[i].P) ord[k] = ord[k - 1], k--;
        ord[k] = i;
    }
    const void **A1 = ptr, **B1 = ptr + n1, **C1 = ptr + 2 * n1;
    const void **A2 = ptr + 3 * n1, **B2 = A2 + n2, **C2 = A2 + 2 * n2;
    size_t k1 = 0, k2 = 0;
    int ncls = 0;
    for (int s = 0; s < ni;) {
        int P = it[ord[s]].P, c1 = s;
        while (c1 < ni && it[ord[c1]].P == P) c1++;
        cls[2 * ncls] = s, cls[2 * ncls + 1] = c1, ncls++;
        for (int mt = 0; mt < nmat; mt++)
            for (int q = 0; q < s1; q++)
                for (int k = s; k < c1; k++, k1++) {
                    const moe_item *m = &it[ord[k]];
                    if (rb->brow) { /* row block q of matrix mt against its scaled activations (slice mt nrb1 + q) */
                        A1[k1] = iw[(size_t)ord[k] * 6 + 2 * mt] + (int64_t)q * rb->brow * D;
                        B1[k1] = b->xs + ((int64_t)(mt * rb->nrb1 + q) * cols + m->col) * D;
                        C1[k1] = b->cs + ((int64_t)mt * cols + m->col) * M1 + (int64_t)q * rb->brow;
                        continue;
                    }
                    A1[k1] = iw[(size_t)ord[k] * 6 + 2 * mt + q];
                    B1[k1] = b->xs + (int64_t)m->col * D;
                    C1[k1] = b->cs + ((int64_t)(mt * np + q) * cols + m->col) * M1;
                }
        for (int q = 0; q < s2; q++)
            for (int k = s; k < c1; k++, k2++) {
                const moe_item *m = &it[ord[k]];
                if (rb->brow) { /* down row block q against h times that block's scales (slice q) */
                    A2[k2] = iw[(size_t)ord[k] * 6 + 4] + (int64_t)q * rb->brow * I;
                    B2[k2] = b->xs + ((int64_t)q * cols + m->col) * I;
                    C2[k2] = b->cs + (int64_t)m->col * D + (int64_t)q * rb->brow;
                    continue;
                }
                A2[k2] = iw[(size_t)ord[k] * 6 + 4 + q];
                B2[k2] = b->xs + (int64_t)m->col * I;
                C2[k2] = b->cs + ((int64_t)q * cols + m->col) * D;
            }
        s = c1;
    }
    if ((rc = ms_gpu_upload(b->g, b->meta, b->hmeta, o_deq + (size_t)ndj * sizeof(deq_job), err))) return rc;
    gpuStream_t st = b->g->stream;
    const pair_rec *dpr = (const pair_rec *)Dm;
    const void *const *dbias = (const void *const *)(Dm + o_bias);
    const void **dptr = (const void **)(Dm + o_ptr);
    if (ndj) {
        int fast = !deq_old();
        for (int q = 0; q < ndj && fast; q++) fast = deq_fast_ok(&dj[q]);
        if (fast) /* a block per row of each job (gate / up / down of each expert), 8 columns per thread */
            k_deq8<<<dim3((unsigned)(M1 > D ? M1 : D), ndj), 128, 0, st>>>((const deq_job *)(Dm + o_deq));
        else
            k_deq<<<dim3(grid_for(M1 * D) > 1024 ? 1024 : grid_for(M1 * D), ndj), 256, 0, st>>>((const deq_job *)(Dm + o_deq));
        if ((rc = ms_gpu_launched(err, "grouped experts: dequantize"))) return rc;
    }
    const void *const *dscl = (const void *const *)(Dm + o_sc);
    if (rb->brow)
        k_split_pairs_rb<<<dim3((unsigned)gpn, (unsigned)(nmat * rb->nrb1)), 256, 0, st>>>(
            a->in, dpr, dscl, D, rb->nrb1, cols, rb->sdt, rb->scols1, rb->bshift, b->xs);
    else
        k_split_pairs<<<gpn, 256, 0, st>>>(a->in, dpr, D, b->xs);
    if ((rc = ms_gpu_launched(err, "grouped experts: split"))) return rc;
    const float one = 1.0f, zero = 0.0f;
    size_t e1 = 0;
    for (int c = 0; c < ncls; c++) {
        int P = it[ord[cls[2 * c]]].P, cnt1 = (cls[2 * c + 1] - cls[2 * c]) * nmat * s1;
        int m1 = rb->brow ? rb->brow : (int)M1; /* rows per GEMM; C's leading dimension stays M1 */
        if (b->api.gemm_batched_ex(b->h, BLAS_OP_T, BLAS_OP_N, m1, P, (int)D, &one, dptr + e1, BLAS_R_16BF, (int)D,
                              dptr + n1 + e1, BLAS_R_16BF, (int)D, &zero, (void **)(dptr + 2 * n1 + e1), BLAS_R_32F,
                              (int)M1, cnt1, BLAS_COMPUTE_32F, BLAS_GEMM_DEFAULT) != BLAS_SUCCESS)
            for (int q = 0; q < cnt1; q++) /* a BLAS without this batched form: one GEMM per entry */
                if ((rc = gemm_bf16_ld(b, m1, P, D, A1[e1 + q], B1[e1 + q], (float *)C1[e1 + q], M1, err))) return rc;
        e1 += (size_t)cnt1;
    }
    ms_gpu_glu_params act = {a->act->kind == MS_ACT_SITU, a->act->limit, a->act->alpha, a->act->up_offset,
                             a->act->beta, a->act->linear_beta};
    if (rb->brow)
        k_glu_pairs_rb<<<gpn, 256, 0, st>>>(b->cs, dpr, dbias, dscl, cols, I, M1, nmat == 1, bdt, act, rb->nrb2, rb->sdt,
                                            rb->scols2, rb->bshift, b->xs);
    else
        k_glu_pairs<<<gpn, 256, 0, st>>>(b->cs, dpr, dbias, cols, I, M1, np, nmat == 1, bdt, act, b->xs);
    if ((rc = ms_gpu_launched(err, "grouped experts: activation"))) return rc;
    size_t e2 = 0;
    const void **d2 = dptr + 3 * n1;
    for (int c = 0; c < ncls; c++) {
        int P = it[ord[cls[2 * c]]].P, cnt2 = (cls[2 * c + 1] - cls[2 * c]) * s2;
        int m2 = rb->brow ? rb->brow : (int)D;
        if (b->api.gemm_batched_ex(b->h, BLAS_OP_T, BLAS_OP_N, m2, P, (int)I, &one, d2 + e2, BLAS_R_16BF, (int)I,
                              d2 + n2 + e2, BLAS_R_16BF, (int)I, &zero, (void **)(d2 + 2 * n2 + e2), BLAS_R_32F, (int)D,
                              cnt2, BLAS_COMPUTE_32F, BLAS_GEMM_DEFAULT) != BLAS_SUCCESS)
            for (int q = 0; q < cnt2; q++)
                if ((rc = gemm_bf16_ld(b, m2, P, I, A2[e2 + q], B2[e2 + q], (float *)C2[e2 + q], D, err))) return rc;
        e2 += (size_t)cnt2;
    }
    k_combine<<<nt, 256, 0, st>>>(a->acc, b->cs, dpr, (const float *)(Dm + o_w), dbias, (const int *)(Dm + o_tl),
                                  (const int *)(Dm + o_to), (const int *)(Dm + o_pl), cols, D, np, bdt, 3);
    return ms_gpu_launched(err, "grouped experts: combine");
}

/* The experts' common layout, or MS_ERR_UNSUPPORTED / MS_ERR_SHAPE (nothing to run). */
typedef struct {
    int nq, nmat, bdt;
    int64_t D, I, M1;
} moe_layout;
static int moe_layout_of(const ms_moe_args *a, moe_layout *L, ms_err *err) {
    if (a->nu < 1) return MS_OK;
    const ms_expert_view *v0 = &a->views[0];
    int fused = !v0->up.data;
    int nq = wparts(&v0->gate);
    if (nq < 0 || v0->gate.dtype == MS_DT_Q8) /* Q8: the static tier's dense products only */
        return ms_fail(err, MS_ERR_UNSUPPORTED, "grouped experts: weight dtype %s", ms_dtype_name(v0->gate.dtype));
    for (int u = 0; u < a->nu; u++) {
        const ms_expert_view *v = &a->views[u];
        if (!v->up.data != fused || !same_layout(&v->gate, &v0->gate) || !same_layout(&v->down, &v0->down) ||
            (!fused && !same_layout(&v->up, &v0->gate)) || !v->gate_bias != !v0->gate_bias ||
            !v->up_bias != !v0->up_bias || !v->down_bias != !v0->down_bias ||
            ((v->gate_bias || v->up_bias || v->down_bias) && v->bias_dtype != v0->bias_dtype))
            return ms_fail(err, MS_ERR_UNSUPPORTED, "grouped experts: experts of mixed layouts");
    }
    if (wparts(&v0->down) != nq || v0->down.dtype != v0->gate.dtype)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "grouped experts: gate and down differ in dtype");
    int has_bias = v0->gate_bias || v0->up_bias || v0->down_bias;
    L->bdt = v0->bias_dtype == MS_DT_BF16 ? 1 : v0->bias_dtype == MS_DT_F16 ? 2 : 0;
    if (has_bias && L->bdt == 0 && v0->bias_dtype != MS_DT_F32)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "grouped experts: bias dtype %s", ms_dtype_name(v0->bias_dtype));
    L->D = v0->down.rows, L->I = v0->down.cols, L->M1 = v0->gate.rows;
    L->nq = nq, L->nmat = fused ? 1 : 2;
    if (L->D != a->D || v0->gate.cols != L->D || L->M1 != (fused ? 2 * L->I : L->I))
        return ms_fail(err, MS_ERR_SHAPE, "grouped experts: shapes (gate %lld x %lld, down %lld x %lld, rows of %lld)",
                       (long long)L->M1, (long long)v0->gate.cols, (long long)L->D, (long long)L->I, (long long)a->D);
    return MS_OK;
}

/* MS_GPU_FP8_GEMM=split (read once; A/B measurements): FP8 experts keep the hi + lo form. */
static int fp8_gemm_split(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("MS_GPU_FP8_GEMM");
        v = e && !strcmp(e, "split");
    }
    return v;
}

/* The row-block form for experts of layout L (rb->brow 0: not taken): FP8 E4M3 gate (up) and
 * down with F32 or BF16 scales in one block shape, brow | rows of both stages, bcol a power
 * of two. */
static void moe_rb_of(const ms_moe_args *a, const moe_layout *L, moe_rb *rb) {
    memset(rb, 0, sizeof *rb);
    const ms_qmat *g = &a->views[0].gate, *d = &a->views[0].down;
    if (fp8_gemm_split() || g->dtype != MS_DT_F8_E4M3 || d->dtype != MS_DT_F8_E4M3 || !g->scale || !d->scale) return;
    if (g->scale_dtype != d->scale_dtype || (g->scale_dtype != MS_DT_F32 && g->scale_dtype != MS_DT_BF16)) return;
    if (g->brow != d->brow || g->bcol != d->bcol || g->brow < 1 || g->bcol < 1 || (g->bcol & (g->bcol - 1))) return;
    if (L->M1 % g->brow || L->D % g->brow) return;
    int sh = 0;
    while ((1 << sh) < g->bcol) sh++;
    rb->brow = g->brow, rb->nrb1 = (int)(L->M1 / g->brow), rb->nrb2 = (int)(L->D / g->brow);
    rb->sdt = g->scale_dtype == MS_DT_F32 ? WS_F32 : WS_BF16, rb->bshift = sh;
    rb->scols1 = (L->D + g->bcol - 1) / g->bcol, rb->scols2 = (L->I + g->bcol - 1) / g->bcol;
}

/* ------------------------------------------ routed experts through gemm_mma.cu's kernel */

/* MS_GPU_MOE_MMA (read per call; A/B measurements): routed experts of these dtypes take
 * gemm_mma.cu's kernel (the weights as stored, no dequantized copy, no split rows, no BLAS):
 * "1" / "all" every dtype it takes, else a comma list of bf16, fp8, mxfp4; "0" none; unset:
 * MM_DEFAULT (FP8 and MXFP4: 1.74x / 1.26x the BLAS path's pp512 on the H200, BF16 0.96x).
 * MS_GPU_MOE_PARTS=1|2 (read per call; default 3) the activations' BF16 parts there: 3 is the
 * F32-activation level (the three-part split is exact), 2 and 1 a faster mode of its own error
 * (each activation to 2^-16 / 2^-8 relative). */
#define MM_BF16 1
#define MM_FP8 2
#define MM_F4 4
#define MM_DEFAULT (MM_FP8 | MM_F4) /* the dtypes taken when MS_GPU_MOE_MMA is unset (measured: BF16 stays on the BLAS) */
#define MM_DB_DEFAULT 0 /* the double-buffered form when MS_GPU_MOE_MMA_DB is unset */
#define MM_F4_AVG 64 /* by default MXFP4 takes the kernel while the experts average at most this many pairs */
static int moe_mma_env(int *given) {
    const char *e = getenv("MS_GPU_MOE_MMA");
    *given = e && *e;
    if (!e || !*e) return MM_DEFAULT;
    if (!strcmp(e, "0")) return 0;
    if (!strcmp(e, "1") || !strcmp(e, "all")) return MM_BF16 | MM_FP8 | MM_F4;
    return (strstr(e, "bf16") ? MM_BF16 : 0) | (strstr(e, "fp8") ? MM_FP8 : 0) | (strstr(e, "mxfp4") ? MM_F4 : 0);
}
static int moe_parts_env(void) {
    const char *e = getenv("MS_GPU_MOE_PARTS");
    int v = e ? atoi(e) : 3;
    return v >= 1 && v <= 3 ? v : 3;
}
/* MS_GPU_MOE_MMA_DB=1|0 (read per call; A/B): the kernel's double-buffered form or not */
static int mma_db_env(void) {
    const char *e = getenv("MS_GPU_MOE_MMA_DB");
    return e && *e ? !strcmp(e, "1") : MM_DB_DEFAULT;
}
static int al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
/* log2 of a power of two v (-1 otherwise) */
static int log2_pow2(int64_t v) {
    if (v < 1 || (v & (v - 1))) return -1;
    int sh = 0;
    while (((int64_t)1 << sh) < v) sh++;
    return sh;
}

/* Whether experts of layout L (row-block form rb) take gemm_mma.cu's kernel; fills m's weight
 * fields (dtype, scales, parts) and the scale columns per scale row of both stages. BF16 without
 * scales; FP8 E4M3 in the row-block form with scale blocks of a multiple of MS_MMA_MT rows and
 * MS_MMA_KT columns; MXFP4 with E8M0 scales per row and a power-of-two multiple of MS_MMA_KT
 * columns; D and I multiples of MS_MMA_KT, every weight 16-byte aligned, an sm_80+ device. */
static int moe_mma_of(const ms_gpu_blas *b, const ms_moe_args *a, const moe_layout *L, const moe_rb *rb,
                      ms_mma_gemm *m, int64_t *scols1, int64_t *scols2) {
    int given, want = moe_mma_env(&given);
    /* the default's MXFP4 rule (gpubench --moe-gemm on the H200, 128 experts top-8: the kernel 2.4x the
     * BLAS at 16 pairs per expert, 0.64x at 256; the linear fits cross near 95): small chunks only */
    if (!given && a->nu > 0 && a->off[a->nu] - a->off[0] > MM_F4_AVG * a->nu) want &= ~MM_F4;
    if (!want || b->g->prop.major < 8 || L->D % MS_MMA_KT || L->I % MS_MMA_KT || !ms_gpu_mma_gemm_ok()) return 0;
    const ms_qmat *g = &a->views[0].gate, *d = &a->views[0].down;
    memset(m, 0, sizeof *m);
    m->parts = moe_parts_env(), m->db = mma_db_env();
    *scols1 = *scols2 = 0;
    if (g->dtype == MS_DT_BF16 && !g->scale && !d->scale) {
        if (!(want & MM_BF16)) return 0;
        m->wdt = MS_MMA_BF16;
    } else if (g->dtype == MS_DT_F8_E4M3 && rb->brow) {
        if (!(want & MM_FP8) || rb->brow % MS_MMA_MT || ((int64_t)1 << rb->bshift) % MS_MMA_KT) return 0;
        m->wdt = MS_MMA_FP8, m->sdt = rb->sdt == WS_F32 ? 1 : 2, m->brow = rb->brow, m->bshift = rb->bshift;
        *scols1 = rb->scols1, *scols2 = rb->scols2;
    } else if (g->dtype == MS_DT_F4 && g->scale && g->scale_dtype == MS_DT_F8_E8M0 && d->scale &&
               d->scale_dtype == MS_DT_F8_E8M0) {
        int sh = log2_pow2(g->bcol);
        if (!(want & MM_F4) || g->brow != 1 || d->brow != 1 || d->bcol != g->bcol || sh < 0 ||
            ((int64_t)1 << sh) % MS_MMA_KT)
            return 0;
        m->wdt = MS_MMA_F4, m->bshift = sh;
        *scols1 = (L->D + g->bcol - 1) / g->bcol, *scols2 = (L->I + g->bcol - 1) / g->bcol;
    } else
        return 0;
    for (int u = 0; u < a->nu; u++) {
        const ms_expert_view *v = &a->views[u];
        if (!al16(v->gate.data) || !al16(v->down.data) || (v->up.data && !al16(v->up.data))) return 0;
    }
    return 1;
}

/* MS_GPU_DENSE_MMA=1 (read per call; A/B measurements, opt-in): dense matmuls of BF16, FP8 E4M3
 * (block scales of a multiple of MS_MMA_MT rows and MS_MMA_KT columns) and MXFP4 weights through
 * gemm_mma.cu's kernel as one item of n pairs (MS_GPU_MOE_PARTS activation parts). Returns -1 when
 * not taken (the BLAS path runs), else the launch's status. */
#define DENSE_MMA_DEFAULT 0 /* dense matmuls through the kernel when MS_GPU_DENSE_MMA is unset */
static int dense_mma(ms_gpu_blas *b, float *y, const float *x, int n, const ms_qmat *w, int acc, ms_err *err) {
    const char *e = getenv("MS_GPU_DENSE_MMA");
    int want = e && *e ? !strcmp(e, "1") : DENSE_MMA_DEFAULT;
    if (!want || b->g->prop.major < 8 || w->cols % MS_MMA_KT || !al16(w->data) || !al16(x) ||
        !ms_gpu_mma_gemm_ok())
        return -1;
    ms_mma_gemm m;
    memset(&m, 0, sizeof m);
    int sh = w->scale ? log2_pow2(w->bcol) : 0;
    if (w->dtype == MS_DT_BF16 && !w->scale) {
        m.wdt = MS_MMA_BF16;
    } else if (w->dtype == MS_DT_F8_E4M3 && w->scale &&
               (w->scale_dtype == MS_DT_F32 || w->scale_dtype == MS_DT_BF16) && w->brow > 0 &&
               w->brow % MS_MMA_MT == 0 && sh >= 0 && ((int64_t)1 << sh) % MS_MMA_KT == 0) {
        m.wdt = MS_MMA_FP8, m.sdt = w->scale_dtype == MS_DT_F32 ? 1 : 2, m.brow = w->brow, m.bshift = sh;
        m.scols = (w->cols + w->bcol - 1) / w->bcol;
    } else if (w->dtype == MS_DT_F4 && w->scale && w->scale_dtype == MS_DT_F8_E8M0 && w->brow == 1 && sh >= 0 &&
               ((int64_t)1 << sh) % MS_MMA_KT == 0) {
        m.wdt = MS_MMA_F4, m.bshift = sh, m.scols = (w->cols + w->bcol - 1) / w->bcol;
    } else
        return -1;
    m.parts = moe_parts_env(), m.nt = n < 24 ? 16 : 32, m.accum = acc, m.db = mma_db_env();
    int ntl = (n + m.nt - 1) / m.nt, rc;
    size_t o_tile = align8(sizeof(ms_mma_item)), total = o_tile + (size_t)ntl * sizeof(ms_mma_tile);
    if ((rc = grow_host((void **)&b->hmeta, &b->hmeta_cap, total, err)) ||
        (rc = grow_dev(b->g, &b->meta, &b->meta_cap, total, 1, err)))
        return rc;
    ms_mma_item *it = (ms_mma_item *)b->hmeta;
    *it = (ms_mma_item){{w->data, NULL, NULL}, {w->scale, NULL, NULL}};
    ms_mma_tile *tt = (ms_mma_tile *)(b->hmeta + o_tile);
    for (int i = 0; i < ntl; i++)
        tt[i] = (ms_mma_tile){0, i * m.nt, n - i * m.nt < m.nt ? n - i * m.nt : m.nt, 0};
    if ((rc = ms_gpu_upload(b->g, b->meta, b->hmeta, total, err))) return rc;
    m.items = (const ms_mma_item *)b->meta, m.tiles = (const ms_mma_tile *)((uint8_t *)b->meta + o_tile);
    m.ntiles = ntl, m.x = x, m.ldx = w->cols, m.out = y, m.cols = n, m.M = w->rows, m.K = w->cols, m.nmat = 1;
    if ((rc = ms_gpu_mma_gemm((void *)b->g->stream, &m, err))) return rc;
    b->mma_calls++;
    return MS_OK;
}

/* One group of items through gemm_mma.cu: upload of its tables (pairs, weights, the token CSR,
 * biases, items, tiles), stage 1 (gate / up of every pair from the activations as stored),
 * the activation h as F32 rows, stage 2 (down), combine. Items laid out one column per pair. */
static int moe_group_mma(ms_gpu_blas *b, const ms_moe_args *a, const moe_item *it, int ni, int cols, int nmat,
                         int64_t M1, int64_t I, int64_t D, int bdt, int ntok, const ms_mma_gemm *mm, int64_t scols1,
                         int64_t scols2, ms_err *err) {
    int rc, gp0 = it[0].p0, gpn = it[ni - 1].p0 + it[ni - 1].m - gp0, ntl = 0;
    /* pairs per tile: 32, or 16 where the items average under 24 pairs (a 256-token chunk of 128
     * experts top-8: 16 each); MS_GPU_MOE_NT=16|32 (read per call) forces one */
    const char *ntenv = getenv("MS_GPU_MOE_NT");
    int ntp = ntenv && atoi(ntenv) == 16 ? 16 : ntenv && atoi(ntenv) == 32 ? 32 : gpn < 24 * ni ? 16 : 32;
    for (int i = 0; i < ni; i++) ntl += (it[i].m + ntp - 1) / ntp;
    int64_t wide = nmat * M1 > D ? nmat * M1 : D;
    size_t o_w = align8((size_t)gpn * sizeof(pair_rec)), o_tl = align8(o_w + (size_t)gpn * 4);
    size_t o_to = align8(o_tl + (size_t)gpn * 4), o_pl = align8(o_to + (size_t)(gpn + 1) * 4);
    size_t o_bias = align8(o_pl + (size_t)gpn * 4), o_it = o_bias + (size_t)ni * 3 * sizeof(void *);
    size_t o_tile = align8(o_it + (size_t)ni * sizeof(ms_mma_item));
    size_t total = o_tile + (size_t)ntl * sizeof(ms_mma_tile);
    if ((rc = grow_host((void **)&b->hmeta, &b->hmeta_cap, total, err)) ||
        (rc = grow_dev(b->g, &b->meta, &b->meta_cap, total, 1, err)) ||
        (rc = grow_dev(b->g, (void **)&b->xs, &b->xs_cap, (size_t)gpn * (size_t)I * 2, 2, err)) ||
        (rc = grow_dev(b->g, (void **)&b->cs, &b->cs_cap, (size_t)cols * (size_t)wide, 4, err)))
        return rc;
    uint8_t *H = b->hmeta, *Dm = (uint8_t *)b->meta;
    pair_rec *pr = (pair_rec *)H;
    float *pw = (float *)(H + o_w);
    int *tl = (int *)(H + o_tl), *to = (int *)(H + o_to), *pl = (int *)(H + o_pl);
    const void **bias = (const void **)(H + o_bias);
    ms_mma_item *mi = (ms_mma_item *)(H + o_it);
    ms_mma_tile *tt = (ms_mma_tile *)(H + o_tile);
    int k = 0;
    for (int i = 0; i < ni; i++) {
        const ms_expert_view *v = &a->views[it[i].u];
        bias[3 * i] = v->gate_bias, bias[3 * i + 1] = v->up_bias, bias[3 * i + 2] = v->down_bias;
        mi[i] = (ms_mma_item){{v->gate.data, nmat == 2 ? v->up.data : NULL, v->down.data},
                              {v->gate.scale, nmat == 2 ? v->up.scale : NULL, v->down.scale}};
        for (int q = 0; q < it[i].m; q++) {
            int p = it[i].p0 + q;
            pr[p - gp0] = (pair_rec){a->tok[p], it[i].col + q, it[i].m, i};
            pw[p - gp0] = a->w[p];
        }
        for (int n0 = 0; n0 < it[i].m; n0 += ntp)
            tt[k++] = (ms_mma_tile){i, it[i].p0 - gp0 + n0, it[i].m - n0 < ntp ? it[i].m - n0 : ntp, 0};
    }
    /* tokens: a counting sort of the group's pairs by token (stable), as moe_group */
    int *cnt = b->hcnt;
    memset(cnt, 0, (size_t)(ntok + 1) * sizeof(int));
    for (int p = 0; p < gpn; p++) cnt[a->tok[gp0 + p] + 1]++;
    int nt = 0;
    for (int t = 0; t < ntok; t++) {
        if (cnt[t + 1]) tl[nt] = t, to[nt] = cnt[t], nt++;
        cnt[t + 1] += cnt[t];
    }
    to[nt] = gpn;
    for (int p = 0; p < gpn; p++) pl[cnt[a->tok[gp0 + p]]++] = p;
    if ((rc = ms_gpu_upload(b->g, b->meta, b->hmeta, total, err))) return rc;
    gpuStream_t st = b->g->stream;
    const pair_rec *dpr = (const pair_rec *)Dm;
    const void *const *dbias = (const void *const *)(Dm + o_bias);
    ms_mma_gemm g1 = *mm;
    g1.items = (const ms_mma_item *)(Dm + o_it), g1.tiles = (const ms_mma_tile *)(Dm + o_tile), g1.ntiles = ntl;
    g1.xrow = &dpr->tok, g1.ocol = &dpr->col, g1.xstride = g1.ostride = (int)(sizeof(pair_rec) / sizeof(int));
    g1.x = a->in, g1.ldx = D, g1.out = b->cs, g1.cols = cols, g1.M = M1, g1.K = D, g1.mat0 = 0, g1.nmat = nmat;
    g1.scols = scols1, g1.nt = ntp;
    if ((rc = ms_gpu_mma_gemm((void *)st, &g1, err))) return rc;
    ms_gpu_glu_params act = {a->act->kind == MS_ACT_SITU, a->act->limit, a->act->alpha, a->act->up_offset,
                             a->act->beta, a->act->linear_beta};
    float *h = (float *)b->xs;
    k_glu_pairs_h<<<gpn, 256, 0, st>>>(b->cs, dpr, dbias, cols, I, M1, nmat == 1, bdt, act, h);
    if ((rc = ms_gpu_launched(err, "grouped experts (mma): activation"))) return rc;
    ms_mma_gemm g2 = g1;
    g2.xrow = NULL, g2.x = h, g2.ldx = I, g2.M = D, g2.K = I, g2.mat0 = 2, g2.nmat = 1, g2.scols = scols2;
    if ((rc = ms_gpu_mma_gemm((void *)st, &g2, err))) return rc;
    k_combine<<<nt, 256, 0, st>>>(a->acc, b->cs, dpr, (const float *)(Dm + o_w), dbias, (const int *)(Dm + o_tl),
                                  (const int *)(Dm + o_to), (const int *)(Dm + o_pl), cols, D, 1, bdt, 1);
    return ms_gpu_launched(err, "grouped experts (mma): combine");
}

/* ms_gpu_blas_moe through gemm_mma.cu (moe_mma_of took the layout): items of at most MROWS pairs
 * of one expert, one column per pair, groups while the stage outputs and the F32 rows of h fit. */
static int moe_run_mma(ms_gpu_blas *b, const ms_moe_args *a, const moe_layout *L, const ms_mma_gemm *mm,
                       int64_t scols1, int64_t scols2, ms_err *err) {
    int64_t D = L->D, I = L->I, M1 = L->M1;
    int nmat = L->nmat;
    int64_t wide = nmat * M1 > D ? nmat * M1 : D;
    int64_t cap = (int64_t)(CS_CAP / (size_t)wide), cap2 = (int64_t)(XS_CAP / (2 * (size_t)I));
    if (cap2 < cap) cap = cap2;
    if (cap < 1) cap = 1;
    int64_t mch = cap < MROWS ? cap : MROWS;
    int P0 = a->off[0], Ptot = a->off[a->nu] - P0, ntok = 0, rc = MS_OK;
    for (int i = 0; i < Ptot; i++)
        if (a->tok[P0 + i] + 1 > ntok) ntok = a->tok[P0 + i] + 1;
    if ((rc = grow_host((void **)&b->hcnt, &b->hcnt_cap, (size_t)(ntok + 1) * sizeof(int), err))) return rc;
    size_t n_items_max = (size_t)a->nu + (size_t)Ptot / (size_t)mch + 1;
    moe_item *items = (moe_item *)malloc(n_items_max * sizeof *items);
    if (!items) return ms_fail(err, MS_ERR_NOMEM, "grouped experts: out of host memory");
    int ni = 0;
    for (int u = 0; u < a->nu; u++)
        for (int p = a->off[u]; p < a->off[u + 1]; p += (int)mch) {
            int m = a->off[u + 1] - p < mch ? a->off[u + 1] - p : (int)mch;
            items[ni++] = (moe_item){u, p, m, m, 0};
        }
    for (int i0 = 0; i0 < ni && !rc;) {
        int i1 = i0, cols = 0;
        while (i1 < ni && (i1 == i0 || cols + items[i1].P <= cap)) items[i1].col = cols, cols += items[i1].P, i1++;
        rc = moe_group_mma(b, a, items + i0, i1 - i0, cols, nmat, M1, I, D, L->bdt, ntok, mm, scols1, scols2, err);
        i0 = i1;
    }
    free(items);
    if (!rc) b->mma_calls++;
    return rc;
}

extern "C" uint64_t ms_gpu_blas_mma_calls(const ms_gpu_blas *b) { return b ? b->mma_calls : 0; }

extern "C" int ms_gpu_blas_moe_supported(const ms_moe_args *a, ms_err *err) {
    moe_layout L;
    return moe_layout_of(a, &L, err);
}

extern "C" int ms_gpu_blas_moe(ms_gpu_blas *b, const ms_moe_args *a, ms_err *err) {
    if (a->nu < 1 || a->off[a->nu] <= a->off[0]) return MS_OK;
    moe_layout L;
    int rc = moe_layout_of(a, &L, err);
    if (rc) return rc;
    moe_rb rb;
    moe_rb_of(a, &L, &rb);
    ms_mma_gemm mm;
    int64_t sc1, sc2;
    if (moe_mma_of(b, a, &L, &rb, &mm, &sc1, &sc2)) return moe_run_mma(b, a, &L, &mm, sc1, sc2, err);
    if (rb.brow) L.nq = 1; /* one BF16 weight part: the E4M3 values unscaled */
    int nq = L.nq, nmat = L.nmat, np = nq ? nq : 1, bdt = L.bdt;
    int64_t D = L.D, I = L.I, M1 = L.M1;
    /* columns per group: bounded by the split rows and by either stage's GEMM outputs */
    int64_t wide = nmat * M1 > D ? nmat * M1 : D, xrow = moe_xrow(&rb, nmat, D, I);
    int64_t cap = (int64_t)(CS_CAP / ((size_t)np * (size_t)wide));
    int64_t cap2 = (int64_t)((rb.brow ? XS_CAP_RB : XS_CAP) / (size_t)xrow);
    if (cap2 < cap) cap = cap2;
    if (cap < 3 + COLPAD) cap = 3 + COLPAD;
    int64_t mch = (cap - (COLPAD - 1)) / 3;
    if (mch > MROWS) mch = MROWS;
    int64_t wexp = nq ? (int64_t)np * (nmat * M1 * D + D * I) : 0; /* dequantized elements per expert */
    int P0 = a->off[0], Ptot = a->off[a->nu] - P0, ntok = 0;
    for (int i = 0; i < Ptot; i++)
        if (a->tok[P0 + i] + 1 > ntok) ntok = a->tok[P0 + i] + 1;
    if ((rc = grow_host((void **)&b->hcnt, &b->hcnt_cap, (size_t)(ntok + 1) * sizeof(int), err))) return rc;
    size_t n_items_max = (size_t)a->nu + (size_t)Ptot / (size_t)mch + 1;
    moe_item *items = (moe_item *)malloc(n_items_max * sizeof *items);
    if (!items) return ms_fail(err, MS_ERR_NOMEM, "grouped experts: out of host memory");
    int ni = 0;
    for (int u = 0; u < a->nu; u++)
        for (int p = a->off[u]; p < a->off[u + 1]; p += (int)mch) {
            int m = a->off[u + 1] - p < mch ? a->off[u + 1] - p : (int)mch;
            items[ni++] = (moe_item){u, p, m, (int)(((int64_t)3 * m + COLPAD - 1) / COLPAD * COLPAD), 0};
        }
    /* groups: consecutive items while the columns and the dequantized experts fit */
    for (int i0 = 0; i0 < ni && !rc;) {
        int i1 = i0, cols = 0, nexp = 0;
        while (i1 < ni) {
            int newexp = i1 == i0 || items[i1].u != items[i1 - 1].u;
            if (i1 > i0 && (cols + items[i1].P > cap || (nq && newexp && (int64_t)(nexp + 1) * wexp > (int64_t)WS_CAP)))
                break;
            items[i1].col = cols;
            cols += items[i1].P;
            nexp += newexp;
            i1++;
        }
        rc = moe_group(b, a, items + i0, i1 - i0, cols, nexp, nq, nmat, M1, I, D, wexp, bdt, ntok, &rb, err);
        i0 = i1;
    }
    free(items);
    return rc;
}

#else /* no BLAS in this build: the hooks decline, the backend keeps its own kernels */

struct ms_gpu_blas {
    int unused;
};
static int no_blas(ms_err *err) {
    return ms_fail(err, MS_ERR_UNSUPPORTED, "gpu (%s): built without a BLAS", MS_GPU_BACKEND_NAME);
}
extern "C" int ms_gpu_blas_open(ms_gpu *g, ms_gpu_blas **out, ms_err *err) {
    (void)g;
    *out = NULL;
    return no_blas(err);
}
extern "C" void ms_gpu_blas_close(ms_gpu_blas *b) { (void)b; }
extern "C" uint64_t ms_gpu_blas_mma_calls(const ms_gpu_blas *b) {
    (void)b;
    return 0;
}
extern "C" int ms_gpu_blas_matmul(ms_gpu_blas *b, float *y, const float *x, int n, const ms_qmat *w, int acc,
                                  ms_err *err) {
    (void)b, (void)y, (void)x, (void)n, (void)w, (void)acc;
    return no_blas(err);
}
extern "C" int ms_gpu_blas_moe_supported(const ms_moe_args *a, ms_err *err) {
    (void)a;
    return no_blas(err);
}
extern "C" int ms_gpu_blas_moe(ms_gpu_blas *b, const ms_moe_args *a, ms_err *err) {
    (void)b, (void)a;
    return no_blas(err);
}
#endif

/* ------------------------------------------------------ the backend's hooks */

/* The backend's GEMM state: the handle (opened at the first product that qualifies) and
 * the thresholds in tokens: dense with the weight as stored (large matrices, and those
 * under SMALL_W elements, where the GEMM's three launches cost more than the matvec),
 * dense dequantized, routed experts. Measured on the H200 (gpubench --gemm, docs/gpu.md):
 * BF16 4096 x 2048 wins from n = 12, 768 x 2048 from n = 24-32, FP8 4096 x 2048 from ~40. */
typedef struct {
    ms_gpu_blas *blas;
    int tried;
    int min_dense, min_small, min_deq, min_moe;
    uint64_t dense_calls, moe_calls; /* products run here (ms_backend_gpu_gemm_calls) */
} gemm_state;

#define MIN_DENSE 16 /* BF16 / F32 weights as stored, >= SMALL_W elements */
#define MIN_SMALL 32 /* the same under SMALL_W elements */
#define SMALL_W ((int64_t)1 << 22)
#define MIN_DEQ 48 /* weights dequantized per product (FP8, F16, MXFP4) */
#define MIN_MOE 4  /* routed experts: tokens of the chunk */

/* The backend's GEMM state (made on first use when create; NULL when out of memory). */
static gemm_state *state(ms_backend *be, int create) {
    void **slot = ms_gpu_be_gemm(be);
    if (*slot || !create) return (gemm_state *)*slot;
    gemm_state *s = (gemm_state *)calloc(1, sizeof *s);
    if (!s) return NULL;
    s->min_dense = MIN_DENSE, s->min_small = MIN_SMALL, s->min_deq = MIN_DEQ, s->min_moe = MIN_MOE;
    const char *env = getenv("MS_GPU_GEMM_MIN"); /* tests and fixture runs: force the GEMMs down to n */
    if (env && atoi(env) > 0) {
        int v = atoi(env) < 2 ? 2 : atoi(env);
        s->min_dense = s->min_small = s->min_deq = s->min_moe = v;
    }
    *slot = s;
    return s;
}
/* The BLAS handle, opened once (NULL for good when the build or the device has none). */
static ms_gpu_blas *handle(ms_backend *be, gemm_state *s) {
    if (!s->blas && !s->tried) {
        ms_err e = {0};
        s->tried = 1;
        if (ms_gpu_blas_open(ms_gpu_be_dev(be), &s->blas, &e)) s->blas = NULL; /* no BLAS: the own kernels */
    }
    return s->blas;
}
/* Whether y = W x of n tokens goes through the GEMM under s's thresholds. */
static int qualifies(const gemm_state *s, int n, const ms_qmat *w) {
    int nq = w->dtype == MS_DT_F32 && !w->scale ? 0 : wparts(w);
    if (nq < 0) return 0;
    if (w->dtype == MS_DT_Q8) { /* MS_GPU_Q8=old (read per call; A/B): Q8 prefill by the matvec, as before */
        const char *e = getenv("MS_GPU_Q8");
        if (e && !strcmp(e, "old")) return 0;
    }
    if (nq > 0) return n >= s->min_deq;
    return n >= (w->rows * w->cols >= SMALL_W ? s->min_dense : s->min_small);
}

extern "C" int ms_gpu_gemm_matmul(ms_backend *be, float *y, const float *x, int n, const ms_qmat *w, int acc) {
    if (n < 2) return 0;
    gemm_state *s = state(be, 1);
    if (!s || !qualifies(s, n, w)) return 0;
    ms_gpu_blas *bl = handle(be, s);
    if (!bl) return 0;
    ms_err e = {0};
    ms_gpu_be_note(be, ms_gpu_blas_matmul(bl, y, x, n, w, acc, &e), &e);
    s->dense_calls++;
    return 1;
}

extern "C" int ms_gpu_gemm_matmul_many(ms_backend *be, const ms_matmul_job *jobs, int count) {
    gemm_state *s = state(be, 1);
    if (!s) return 0;
    for (int i = 0; i < count; i++)
        if (jobs[i].n < 2 || !qualifies(s, jobs[i].n, jobs[i].w)) return 0;
    if (!handle(be, s)) return 0;
    for (int i = 0; i < count; i++) {
        ms_err e = {0};
        ms_gpu_be_note(be, ms_gpu_blas_matmul(s->blas, jobs[i].y, jobs[i].x, jobs[i].n, jobs[i].w, jobs[i].acc, &e), &e);
    }
    s->dense_calls += (uint64_t)count;
    return 1;
}

extern "C" void ms_gpu_gemm_moe_experts(ms_backend *be, const ms_moe_args *a) {
    gemm_state *s = state(be, 1);
    if (s && a->nu > 0) {
        int ntok = 0, P0 = a->off[0], P1 = a->off[a->nu];
        for (int i = P0; i < P1; i++) /* the chunk's tokens (at least those routed here) */
            if (a->tok[i] + 1 > ntok) ntok = a->tok[i] + 1;
        ms_gpu_blas *bl = ntok >= s->min_moe ? handle(be, s) : NULL;
        if (bl) {
            ms_err e = {0};
            if (ms_gpu_blas_moe_supported(a, &e) == MS_OK) { /* from here on a failure is a failure */
                ms_gpu_be_note(be, ms_gpu_blas_moe(bl, a, &e), &e);
                s->moe_calls++;
                return;
            }
        }
    }
    ms_moe_experts_composed(be, a);
}

extern "C" void ms_gpu_gemm_free(ms_backend *be) {
    void **slot = ms_gpu_be_gemm(be);
    gemm_state *s = (gemm_state *)*slot;
    if (!s) return;
    ms_gpu_blas_close(s->blas);
    free(s);
    *slot = NULL;
}

extern "C" int ms_backend_gpu_gemm_min(ms_backend *be, int dense, int dequantized, int experts) {
    gemm_state *s = state(be, 1);
    if (!s) return MS_ERR_NOMEM;
    if (dense > 0) s->min_dense = s->min_small = dense < 2 ? 2 : dense;
    if (dequantized > 0) s->min_deq = dequantized < 2 ? 2 : dequantized;
    if (experts > 0) s->min_moe = experts;
    return MS_OK;
}

extern "C" void ms_backend_gpu_gemm_calls(ms_backend *be, uint64_t *dense, uint64_t *experts) {
    gemm_state *s = state(be, 0);
    *dense = s ? s->dense_calls : 0;
    *experts = s ? s->moe_calls : 0;
}

extern "C" uint64_t ms_backend_gpu_gemm_mma_calls(ms_backend *be) {
    gemm_state *s = state(be, 0);
    return s ? ms_gpu_blas_mma_calls(s->blas) : 0;
}
