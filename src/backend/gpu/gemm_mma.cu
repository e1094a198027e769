/* gemm_mma.cu — the grouped expert GEMM on tensor cores from the stored weights
 * (contract and the accuracy scheme in gemm_mma.h; the caller is gemm.cu's routed
 * experts path). CUDA only (mma.sync.m16n8k16 BF16, sm_80+): the HIP build and device
 * code for older targets decline with MS_ERR_UNSUPPORTED. */
#include "backend/gpu/gpu_internal.h"
#include "backend/gpu/gemm_mma.h"

#if !defined(__HIP_PLATFORM_AMD__) && !defined(MS_GPU_HIP)

#define MT MS_MMA_MT
#define KT MS_MMA_KT
#define LDW 20 /* shared row stride in 32-bit words: 16 (KT BF16) + 4, fragment loads on distinct banks */

/* float -> BF16 bits, round to nearest even (NaN stays a quiet NaN): gemm.cu's bf16_rn. */
static __device__ __forceinline__ uint32_t mm_bf16_rn(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}
static __device__ __forceinline__ float mm_bf16_f(uint32_t h) { return __uint_as_float(h << 16); }

/* Two floats exact in BF16 (their low 16 bits zero) -> one word of two BF16 (a low). */
static __device__ __forceinline__ uint32_t mm_pack_exact(float a, float b) {
    return __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632);
}

/* v's NP BF16 parts (gemm.cu's split3 for NP = 3: each the rounding of what is left; a
 * non-finite v: hi alone). */
template <int NP>
static __device__ __forceinline__ void mm_split(float v, uint32_t *p) {
    uint32_t h = mm_bf16_rn(v);
    p[0] = h;
    if (NP > 1) {
        float r = v - mm_bf16_f(h);
        if (!(fabsf(v) < 3.0e38f)) r = 0.0f;
        uint32_t m = mm_bf16_rn(r);
        p[1] = m;
        if (NP > 2) p[2] = mm_bf16_rn(r - mm_bf16_f(m));
    }
}

static __device__ __forceinline__ void mm_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Chunks of 16 bytes of the weight tile per thread (128 threads): BF16 128 x 64 B, FP8 128 x 32 B,
 * F4 128 x 16 B. */
template <int WDT> struct mm_w {
    static constexpr int J = WDT == MS_MMA_BF16 ? 4 : WDT == MS_MMA_FP8 ? 2 : 1;
};

/* Grid (tiles, nmat x row tiles), 128 threads: warp w owns rows 32w .. 32w + 31 of the tile
 * (two m16 tiles) and all NT (16 or 32) pairs (NT / 8 n8 tiles). DB: two shared buffers, the
 * next step's tiles stored while others compute (one barrier per step instead of two). */
template <int WDT, int NP, int NT, int DB>
__global__ void __launch_bounds__(128) k_mma_gemm(ms_mma_gemm a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    __shared__ __align__(16) uint32_t As_[(DB ? 2 : 1) * MT * LDW];
    __shared__ __align__(16) uint32_t Bs_[(DB ? 2 : 1) * NP * NT * LDW];
    uint32_t *As = As_, *Bs = Bs_;
    constexpr int J = mm_w<WDT>::J, XJ = NT / 16, NI = NT / 8;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const ms_mma_tile tile = a.tiles[blockIdx.x];
    const int tpm = (int)((a.M + MT - 1) / MT), mt = (int)blockIdx.y / tpm;
    const int64_t row0 = (int64_t)((int)blockIdx.y % tpm) * MT, K = a.K;
    const ms_mma_item *itp = &a.items[tile.item];
    const uint8_t *W = (const uint8_t *)itp->w[a.mat0 + mt];
    const uint8_t *S = (const uint8_t *)itp->s[a.mat0 + mt];
    /* this thread's weight chunks: row and byte offset within the K step */
    const uint8_t *wr[J];
    const uint8_t *sr = NULL; /* F4: the row's E8M0 scales */
    int arow[J], aw[J];       /* shared row, first word */
#pragma unroll
    for (int j = 0; j < J; j++) {
        int c = tid + 128 * j, r, kb; /* kb: element offset */
        if (WDT == MS_MMA_BF16) r = c >> 2, kb = (c & 3) * 8;
        else if (WDT == MS_MMA_FP8) r = c >> 1, kb = (c & 1) * 16;
        else r = c, kb = 0;
        arow[j] = r, aw[j] = kb >> 1;
        int64_t gr = row0 + r;
        int64_t rb = WDT == MS_MMA_BF16 ? 2 * K : WDT == MS_MMA_FP8 ? K : K / 2; /* bytes per row */
        int64_t eb = WDT == MS_MMA_BF16 ? 2 * kb : WDT == MS_MMA_FP8 ? kb : kb / 2;
        wr[j] = gr < a.M ? W + gr * rb + eb : NULL;
        if (WDT == MS_MMA_F4 && gr < a.M) sr = S + gr * a.scols;
    }
    /* FP8: the tile's scale row (its rows lie in one scale row block) */
    const int64_t srow = WDT == MS_MMA_FP8 ? (row0 / a.brow) * a.scols : 0;
    /* this thread's activation chunks: pairs n = tid / 8 + 16 j, columns (tid % 8) 4 .. + 3 */
    const float *xr[XJ];
    const int xk = (tid & 7) * 4;
#pragma unroll
    for (int j = 0; j < XJ; j++) {
        int n = (tid >> 3) + 16 * j;
        if (n < tile.np) {
            int p = tile.p0 + n;
            int64_t row = a.xrow ? a.xrow[(int64_t)p * a.xstride] : p;
            xr[j] = a.x + row * a.ldx + xk;
        } else
            xr[j] = NULL;
    }
    uint4 ra[J];
    float4 rx[XJ];
    uint32_t rs = 0;
    float xsc = 1.0f;
    auto load = [&](int64_t k0) {
#pragma unroll
        for (int j = 0; j < J; j++) {
            int64_t eb = WDT == MS_MMA_BF16 ? 2 * k0 : WDT == MS_MMA_FP8 ? k0 : k0 / 2;
            ra[j] = wr[j] ? __ldg((const uint4 *)(wr[j] + eb)) : make_uint4(0, 0, 0, 0);
        }
        if (WDT == MS_MMA_F4) rs = sr ? sr[k0 >> a.bshift] : 0u;
        if (WDT == MS_MMA_FP8) {
            int64_t si = srow + (k0 >> a.bshift);
            xsc = a.sdt == 1 ? ((const float *)S)[si] : ms_bf16_to_f32_dev(((const uint16_t *)S)[si]);
        }
#pragma unroll
        for (int j = 0; j < XJ; j++) rx[j] = xr[j] ? *(const float4 *)(xr[j] + k0) : make_float4(0.f, 0.f, 0.f, 0.f);
    };
    auto store = [&]() {
#pragma unroll
        for (int j = 0; j < J; j++) {
            uint32_t *d = As + arow[j] * LDW + aw[j];
            if (WDT == MS_MMA_BF16) {
                *(uint4 *)d = ra[j];
            } else if (WDT == MS_MMA_FP8) {
                uint32_t v[4] = {ra[j].x, ra[j].y, ra[j].z, ra[j].w}, o[8];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float2 lo = ms_fp8x2_e4m3_to_f32x2(v[q] & 0xffffu), hi = ms_fp8x2_e4m3_to_f32x2(v[q] >> 16);
                    o[2 * q] = mm_pack_exact(lo.x, lo.y), o[2 * q + 1] = mm_pack_exact(hi.x, hi.y);
                }
                ((uint4 *)d)[0] = make_uint4(o[0], o[1], o[2], o[3]);
                ((uint4 *)d)[1] = make_uint4(o[4], o[5], o[6], o[7]);
            } else { /* F4: 32 nibbles (low first) times the E8M0 scale: exact in BF16 (gemm.cu's k_deq) */
                float sc = ms_e8m0_to_f32_dev(rs);
                uint32_t v[4] = {ra[j].x, ra[j].y, ra[j].z, ra[j].w}, o[16];
#pragma unroll
                for (int q = 0; q < 4; q++)
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        uint32_t byte = (v[q] >> (8 * b)) & 0xffu;
                        o[4 * q + b] = mm_pack_exact(ms_e2m1_to_f32(byte & 15u) * sc, ms_e2m1_to_f32(byte >> 4) * sc);
                    }
#pragma unroll
                for (int q = 0; q < 4; q++) ((uint4 *)d)[q] = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
            }
        }
#pragma unroll
        for (int j = 0; j < XJ; j++) {
            int n = (tid >> 3) + 16 * j;
            float v[4] = {rx[j].x, rx[j].y, rx[j].z, rx[j].w};
            uint32_t p[4][3];
#pragma unroll
            for (int e = 0; e < 4; e++) mm_split<NP>(WDT == MS_MMA_FP8 ? v[e] * xsc : v[e], p[e]);
#pragma unroll
            for (int q = 0; q < NP; q++)
                *(uint2 *)(Bs + (q * NT + n) * LDW + (xk >> 1)) =
                    make_uint2(p[0][q] | (p[1][q] << 16), p[2][q] | (p[3][q] << 16));
        }
    };
    float acc[2][NI][4], acl[2][NI][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f, acl[mi][ni][e] = 0.0f;
    load(0);
    if (DB) store(), __syncthreads();
    for (int64_t k0 = 0, cur = 0; k0 < K; k0 += KT, cur ^= 1) {
        if (DB) {
            As = As_ + cur * (MT * LDW), Bs = Bs_ + cur * (NP * NT * LDW);
        } else {
            __syncthreads(); /* the previous step's fragments are read */
            store();
            __syncthreads();
        }
        if (k0 + KT < K) load(k0 + KT); /* in flight during this step's products */
#pragma unroll
        for (int ks = 0; ks < 2; ks++) {
            uint32_t af[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                const uint32_t *r = As + (warp * 32 + mi * 16 + g) * LDW + ks * 8 + t;
                af[mi][0] = r[0], af[mi][1] = r[8 * LDW], af[mi][2] = r[4], af[mi][3] = r[8 * LDW + 4];
            }
#pragma unroll
            for (int q = 0; q < NP; q++)
#pragma unroll
                for (int ni = 0; ni < NI; ni++) {
                    const uint32_t *r = Bs + (q * NT + ni * 8 + g) * LDW + ks * 8 + t;
                    uint32_t b0 = r[0], b1 = r[4];
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) mm_mma(q ? acl[mi][ni] : acc[mi][ni], af[mi], b0, b1);
                }
        }
        if (DB && k0 + KT < K) { /* the next step's tiles into the other buffer; one barrier */
            As = As_ + (cur ^ 1) * (MT * LDW), Bs = Bs_ + (cur ^ 1) * (NP * NT * LDW);
            store();
            __syncthreads();
        }
    }
    /* c[h 2 + e]: row g + 8 h, pair 2 t + e of each m16 x n8 tile */
#pragma unroll
    for (int ni = 0; ni < NI; ni++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int n = ni * 8 + 2 * t + e;
            if (n >= tile.np) continue;
            int64_t oc = a.ocol ? a.ocol[(int64_t)(tile.p0 + n) * a.ostride] : tile.p0 + n;
            float *o = a.out + ((int64_t)mt * a.cols + oc) * a.M;
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int64_t r = row0 + warp * 32 + mi * 16 + g + 8 * h;
                    if (r >= a.M) continue;
                    float v = NP > 1 ? acl[mi][ni][2 * h + e] + acc[mi][ni][2 * h + e] : acc[mi][ni][2 * h + e];
                    o[r] = a.accum ? o[r] + v : v;
                }
        }
#endif
}

/* One stage through k_mma_gemm<WDT, NP, NT, DB>: MS_ERR_UNSUPPORTED when its device code is older than sm_80. */
template <int WDT, int NP, int NT, int DB>
static int mm_launch_db(const ms_mma_gemm *a, gpuStream_t st, ms_err *err) {
    if (ms_kernel_ptx((const void *)k_mma_gemm<WDT, NP, NT, DB>) < 80)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "gpu (%s): mma gemm: no sm_80+ device code", MS_GPU_BACKEND_NAME);
    int tpm = (int)((a->M + MT - 1) / MT);
    k_mma_gemm<WDT, NP, NT, DB><<<dim3((unsigned)a->ntiles, (unsigned)(a->nmat * tpm)), 128, 0, st>>>(*a);
    return ms_gpu_launched(err, "mma gemm");
}
template <int WDT, int NP, int NT>
static int mm_launch(const ms_mma_gemm *a, gpuStream_t st, ms_err *err) {
    return a->db ? mm_launch_db<WDT, NP, NT, 1>(a, st, err) : mm_launch_db<WDT, NP, NT, 0>(a, st, err);
}
template <int WDT, int NT>
static int mm_launch_np(const ms_mma_gemm *a, gpuStream_t st, ms_err *err) {
    return a->parts == 1 ? mm_launch<WDT, 1, NT>(a, st, err)
           : a->parts == 2 ? mm_launch<WDT, 2, NT>(a, st, err)
                           : mm_launch<WDT, 3, NT>(a, st, err);
}
template <int WDT>
static int mm_launch_nt(const ms_mma_gemm *a, gpuStream_t st, ms_err *err) {
    return a->nt == 16 ? mm_launch_np<WDT, 16>(a, st, err) : mm_launch_np<WDT, 32>(a, st, err);
}

extern "C" int ms_gpu_mma_gemm_ok(void) { return ms_kernel_ptx((const void *)k_mma_gemm<MS_MMA_BF16, 3, 32, 0>) >= 80; }

extern "C" int ms_gpu_mma_gemm(void *stream, const ms_mma_gemm *a, ms_err *err) {
    if (a->K % KT || a->parts < 1 || a->parts > 3 || a->wdt < MS_MMA_BF16 || a->wdt > MS_MMA_F4 ||
        (a->nt != 16 && a->nt != 32))
        return ms_fail(err, MS_ERR_SHAPE, "gpu (%s): mma gemm: K %lld, parts %d, dtype %d, tile %d", MS_GPU_BACKEND_NAME,
                       (long long)a->K, a->parts, a->wdt, a->nt);
    if (a->ntiles < 1 || a->M < 1) return MS_OK;
    gpuStream_t st = (gpuStream_t)stream;
    return a->wdt == MS_MMA_BF16  ? mm_launch_nt<MS_MMA_BF16>(a, st, err)
           : a->wdt == MS_MMA_FP8 ? mm_launch_nt<MS_MMA_FP8>(a, st, err)
                                  : mm_launch_nt<MS_MMA_F4>(a, st, err);
}

#else /* HIP: no kernel */

extern "C" int ms_gpu_mma_gemm_ok(void) { return 0; }

extern "C" int ms_gpu_mma_gemm(void *stream, const ms_mma_gemm *a, ms_err *err) {
    (void)stream, (void)a;
    return ms_fail(err, MS_ERR_UNSUPPORTED, "gpu (%s): mma gemm: CUDA only", MS_GPU_BACKEND_NAME);
}

#endif
