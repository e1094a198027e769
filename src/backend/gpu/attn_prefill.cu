/* attn_prefill.cu — tiled causal prefill attention (contract: attn_prefill.h).
 *
 * Grid (row tiles, kv heads), 128 threads: four groups of 32 lanes, 16 query rows each (on a
 * 64-wide HIP wavefront the groups are its halves: reductions are xor shuffles inside 8 or 4
 * lanes). A block's 64 rows are consecutive (token, head) pairs of one kv head, token-major,
 * so with G query heads per kv head a tile covers 64 / G tokens and every K/V tile staged in
 * shared memory serves all of them. The key loop runs from the first key any row of the tile
 * sees (window) to the last row's position; per tile each row's scores are masked (s <= p and,
 * with a window, s > p - window), its running max m and sum l rescaled, and this tile's
 * P V summed into fresh accumulators before o = o corr + P V (so an accumulator's rounding
 * chain is one tile long, not the whole context). Tiles run last-first (the causal tail is the
 * longest). */
#include <stdlib.h>

#include "backend/gpu/gpu_internal.h" /* first: the C headers with C linkage */
#include "backend/gpu/attn_prefill.h"

#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP)
#define FA_HAVE_MMA 0
#else
#define FA_HAVE_MMA 1
#endif

#define FA_ROWS 64     /* query rows per block */
#define FA_KEYS 64     /* keys per tile */
#define FA_THREADS 128 /* four groups of 32 lanes */
#define FA_MAXD 256
#define FA_MAXV 128 /* value columns per block: wider values take blockIdx.z slices (scores recomputed) */
#define FA_MAXVD 512
#define FA_PS (FA_KEYS + 1) /* row stride of the FMA form's probabilities */

struct fa_args {
    float *out;
    const float *q, *k, *v, *sinks;
    int64_t pos0;
    int rows, H, KV, G, hd, vd, window;
    float scale;
    int async; /* K/V tiles by cp.async (MS_GPU_FA_LOAD=async; CUDA sm_80+), else loads then stores */
};

/* floats of shared memory: Q [64][hd + 4], K [64][hd + 4], V [64][vb + 4] (vb = min(vd, 128): a
 * block's slice of the value columns), and the FMA form's probabilities [4][16][65]. Row strides of 4 mod 32 words keep the fragment loads (8 rows x 4
 * columns per warp) on distinct banks. */
static size_t fa_smem_floats(int hd, int vd, int form) {
    if (vd > FA_MAXV) vd = FA_MAXV;
    return (size_t)FA_ROWS * (hd + 4) + (size_t)FA_KEYS * (hd + 4) + (size_t)FA_KEYS * (vd + 4) +
           (form == MS_GPU_FA_FMA ? (size_t)4 * 16 * FA_PS : 0);
}

/* the tile's query rows (zeros past the last row) */
static __device__ __forceinline__ void fa_load_q(float *Qs, const fa_args &a, int r0, int kvh) {
    const int hd4 = a.hd / 4, hdp = a.hd + 4;
    for (int i = threadIdx.x; i < FA_ROWS * hd4; i += FA_THREADS) {
        int r = i / hd4, c = i % hd4, gr = r0 + r;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (gr < a.rows) {
            int t = gr / a.G, h = kvh * a.G + gr % a.G;
            x = *(const float4 *)(a.q + ((int64_t)t * a.H + h) * a.hd + 4 * c);
        }
        *(float4 *)(Qs + r * hdp + 4 * c) = x;
    }
}

/* One 16-byte copy global -> shared: asynchronous (cp.async.cg, zero-filled when !valid: no byte
 * read) where the device has it and async is set, else a load and a store. */
static __device__ __forceinline__ void fa_copy16(float *dst, const float *src, bool valid, int async) {
#if FA_HAVE_MMA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (async) {
        unsigned sa = (unsigned)__cvta_generic_to_shared(dst);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(src), "r"(valid ? 16 : 0)
                     : "memory");
        return;
    }
#endif
    (void)async;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (valid) x = *(const float4 *)src;
    *(float4 *)dst = x;
}
/* Waits for this thread's cp.async copies (the block's barrier after it publishes them). */
static __device__ __forceinline__ void fa_copy_wait(int async) {
#if FA_HAVE_MMA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (async) asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
    (void)async;
}

/* rows 0 .. 63 of cols4 float4 each from src (row stride sstride floats) into dst (stride dstride):
 * rows >= nvalid as zeros, never read (nvalid >= 1: row 0 is the address a zero fill names). The
 * linear index r cols4 + c steps by the block size with one division up front. */
static __device__ __forceinline__ void fa_copy_tile(float *dst, int dstride, const float *src, int64_t sstride,
                                                    int cols4, int64_t nvalid, int async) {
    const int step_r = FA_THREADS / cols4, step_c = FA_THREADS % cols4;
    int r = threadIdx.x / cols4, c = threadIdx.x % cols4;
    while (r < FA_KEYS) {
        bool ok = r < nvalid;
        fa_copy16(dst + r * dstride + 4 * c, src + (ok ? r * sstride : 0) + 4 * c, ok, async);
        r += step_r, c += step_c;
        if (c >= cols4) c -= cols4, r++;
    }
}

/* keys k0 .. k0 + 63 of kv head kvh and value columns v0 .. v0 + vb - 1 of them (row stride vdp in
 * Vs; zeros past s_end: never read from the cache) */
static __device__ __forceinline__ void fa_load_kv(float *Ks, float *Vs, const fa_args &a, int kvh, int64_t k0,
                                                  int64_t s_end, int v0, int vb, int vdp) {
    const int64_t kd = (int64_t)a.KV * a.hd, vt = (int64_t)a.KV * a.vd, nvalid = s_end - k0 + 1;
    fa_copy_tile(Ks, a.hd + 4, a.k + k0 * kd + (int64_t)kvh * a.hd, kd, a.hd / 4, nvalid, a.async);
    fa_copy_tile(Vs, vdp, a.v + k0 * vt + (int64_t)kvh * a.vd + v0, vt, vb / 4, nvalid, a.async);
    fa_copy_wait(a.async);
}

/* the tile's key range: [s_begin, s_end] covers every key a row of it sees */
static __device__ __forceinline__ void fa_range(const fa_args &a, int r0, int64_t *s_begin, int64_t *s_end) {
    int last = r0 + FA_ROWS - 1 < a.rows - 1 ? r0 + FA_ROWS - 1 : a.rows - 1;
    *s_end = a.pos0 + last / a.G;
    int64_t b = 0;
    if (a.window > 0) b = a.pos0 + r0 / a.G - a.window + 1;
    *s_begin = b > 0 ? b : 0;
}

/* position of tile row r (rows past the last take the last row's: finite, never stored) */
static __device__ __forceinline__ int64_t fa_pos(const fa_args &a, int gr) {
    return a.pos0 + (gr < a.rows ? gr : a.rows - 1) / a.G;
}

static __device__ __forceinline__ bool fa_sees(const fa_args &a, int64_t s, int64_t p) {
    return s <= p && (a.window <= 0 || s > p - a.window);
}

/* m <- max(m, mx) for a row; corr = e^(m_old - m_new) (0 when m_old is -inf), mb the finite
 * reference the probabilities take (0 while the row has seen no key) */
static __device__ __forceinline__ void fa_rescale(float &m, float mx, float &corr, float &mb) {
    float mn = fmaxf(m, mx);
    mb = mn == -INFINITY ? 0.0f : mn;
    corr = expf(m - mb);
    m = mn;
}

/* out row = o f / (l f + e^(sink - M)) with M = max(m, sink), f = e^(m - M); o / l without sinks */
static __device__ __forceinline__ float fa_inv(const fa_args &a, int h, float m, float l) {
    if (!a.sinks) return 1.0f / l;
    float sk = a.sinks[h], M = fmaxf(m, sk), f = expf(m - M);
    return f / (l * f + expf(sk - M));
}

/* ---------------------------------------------------------------- FMA form */

/* Lane (rg = lane / 8, kg = lane % 8) of a 16-row group: scores of rows 4 rg .. 4 rg + 3 against
 * keys kg + 8 jj (jj < 8), one F32 FMA chain over the head dims each; the probabilities through
 * shared memory; output columns kg + 8 c (c < NC) of the same four rows. */
template <int NC>
__global__ void __launch_bounds__(FA_THREADS) fa_fma_kernel(fa_args a) {
    extern __shared__ float4 fa_sh4[];
    float *sh = (float *)fa_sh4;
    const int hd = a.hd, vd = a.vd, hdp = hd + 4, v0 = blockIdx.z * FA_MAXV, vb = min(FA_MAXV, vd - v0);
    const int vdp = min(FA_MAXV, vd) + 4;
    float *Qs = sh, *Ks = Qs + FA_ROWS * hdp, *Vs = Ks + FA_KEYS * hdp, *Ps = Vs + FA_KEYS * vdp;
    const int tile = (int)gridDim.x - 1 - (int)blockIdx.x, kvh = blockIdx.y, r0 = tile * FA_ROWS;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, rg = lane >> 3, kg = lane & 7;
    float *Pw = Ps + w * 16 * FA_PS;
    fa_load_q(Qs, a, r0, kvh);
    int64_t s_begin, s_end;
    fa_range(a, r0, &s_begin, &s_end);
    int64_t p[4];
    float m[4], l[4], o[4][NC];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        p[i] = fa_pos(a, r0 + 16 * w + 4 * rg + i), m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++) o[i][c] = 0.0f;
    }
    for (int64_t k0 = s_begin; k0 <= s_end; k0 += FA_KEYS) {
        __syncthreads(); /* the previous tile's K, V, P reads are done */
        fa_load_kv(Ks, Vs, a, kvh, k0, s_end, v0, vb, vdp);
        __syncthreads();
        float s[4][8];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int jj = 0; jj < 8; jj++) s[i][jj] = 0.0f;
        for (int d = 0; d < hd; d += 4) {
            float4 qv[4], kv[8];
#pragma unroll
            for (int i = 0; i < 4; i++) qv[i] = *(const float4 *)(Qs + (16 * w + 4 * rg + i) * hdp + d);
#pragma unroll
            for (int jj = 0; jj < 8; jj++) kv[jj] = *(const float4 *)(Ks + (kg + 8 * jj) * hdp + d);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int jj = 0; jj < 8; jj++) {
                    s[i][jj] = fmaf(qv[i].x, kv[jj].x, s[i][jj]);
                    s[i][jj] = fmaf(qv[i].y, kv[jj].y, s[i][jj]);
                    s[i][jj] = fmaf(qv[i].z, kv[jj].z, s[i][jj]);
                    s[i][jj] = fmaf(qv[i].w, kv[jj].w, s[i][jj]);
                }
        }
        float corr[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float mx = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < 8; jj++) {
                float v = fa_sees(a, k0 + kg + 8 * jj, p[i]) ? s[i][jj] * a.scale : -INFINITY;
                s[i][jj] = v, mx = fmaxf(mx, v);
            }
            mx = fmaxf(mx, ms_shfl_xor(mx, 1));
            mx = fmaxf(mx, ms_shfl_xor(mx, 2));
            mx = fmaxf(mx, ms_shfl_xor(mx, 4));
            float mb;
            fa_rescale(m[i], mx, corr[i], mb);
            float ls = 0.0f;
#pragma unroll
            for (int jj = 0; jj < 8; jj++) {
                float pv = expf(s[i][jj] - mb);
                ls += pv;
                Pw[(4 * rg + i) * FA_PS + kg + 8 * jj] = pv;
            }
            l[i] = l[i] * corr[i] + ls;
        }
        ms_syncwarp();
        float t[4][NC];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int c = 0; c < NC; c++) t[i][c] = 0.0f;
        for (int j = 0; j < FA_KEYS; j++) {
            float pj[4];
#pragma unroll
            for (int i = 0; i < 4; i++) pj[i] = Pw[(4 * rg + i) * FA_PS + j];
            const float *vr = Vs + j * vdp + kg;
#pragma unroll
            for (int c = 0; c < NC; c++)
                if (8 * c < vb) {
                    float vv = vr[8 * c];
#pragma unroll
                    for (int i = 0; i < 4; i++) t[i][c] = fmaf(pj[i], vv, t[i][c]);
                }
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int c = 0; c < NC; c++) o[i][c] = fmaf(o[i][c], corr[i], t[i][c]);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        l[i] += ms_shfl_xor(l[i], 1);
        l[i] += ms_shfl_xor(l[i], 2);
        l[i] += ms_shfl_xor(l[i], 4);
        int gr = r0 + 16 * w + 4 * rg + i;
        if (gr >= a.rows) continue;
        int tk = gr / a.G, h = kvh * a.G + gr % a.G;
        float inv = fa_inv(a, h, m[i], l[i]);
        float *dst = a.out + ((int64_t)tk * a.H + h) * vd + v0 + kg;
#pragma unroll
        for (int c = 0; c < NC; c++)
            if (8 * c < vb) dst[8 * c] = o[i][c] * inv;
    }
}

/* ---------------------------------------------------------------- tensor-core form */

#if FA_HAVE_MMA
/* x = hi + lo: hi the TF32 rounding of x (to nearest, ties away: the carry of bit 12 into the kept
 * bits, then the low 13 bits cleared), lo = x - hi exact in F32 (|lo| <= 2^-11 |x|), passed as F32
 * bits: the tensor core reads its top 19 bits (TF32 truncation, error <= 2^-10 |lo| <= 2^-21 |x|),
 * as CUTLASS's 3xTF32 "small" operand. Three integer / float ops, no cvt. */
static __device__ __forceinline__ void fa_split(float x, uint32_t &hi, uint32_t &lo) {
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
}
/* d += A B, A 16 x 8 (row), B 8 x 8 (col), TF32 in, F32 accumulate */
static __device__ __forceinline__ void fa_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

/* Warp w (rows 16 w .. 16 w + 15 of the tile), lane (gq = lane / 4, tq = lane % 4): the m16n8k8
 * fragments' rows gq and gq + 8. Scores: per 8-key n-tile j the hi x hi products into one
 * accumulator and the two cross products into another (the small terms do not lengthen the
 * large terms' chain), summed after the head dims. P V: the score accumulator's element e of
 * n-tile j (row gq + 8 (e / 2), key 8 j + 2 tq + e % 2) is the A fragment of the k-step over
 * those 8 keys when the step's k index tq stands for key 2 tq and tq + 4 for key 2 tq + 1; V's
 * B fragment reads its rows in that order. NT: value n-tiles (vd <= 8 NT). */
template <int NT>
__global__ void __launch_bounds__(FA_THREADS) fa_mma_kernel(fa_args a) {
#if FA_HAVE_MMA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ float4 fa_sh4[];
    float *sh = (float *)fa_sh4;
    const int hd = a.hd, vd = a.vd, hdp = hd + 4, v0 = blockIdx.z * FA_MAXV, vb = min(FA_MAXV, vd - v0);
    const int vdp = min(FA_MAXV, vd) + 4;
    float *Qs = sh, *Ks = Qs + FA_ROWS * hdp, *Vs = Ks + FA_KEYS * hdp;
    const int tile = (int)gridDim.x - 1 - (int)blockIdx.x, kvh = blockIdx.y, r0 = tile * FA_ROWS;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    const int ra = 16 * w + gq, rb = ra + 8;
    fa_load_q(Qs, a, r0, kvh);
    int64_t s_begin, s_end;
    fa_range(a, r0, &s_begin, &s_end);
    const int64_t pr[2] = {fa_pos(a, r0 + ra), fa_pos(a, r0 + rb)};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    for (int64_t k0 = s_begin; k0 <= s_end; k0 += FA_KEYS) {
        __syncthreads();
        fa_load_kv(Ks, Vs, a, kvh, k0, s_end, v0, vb, vdp);
        __syncthreads();
        float s[8][4], sx[8][4];
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = sx[j][e] = 0.0f;
        for (int d0 = 0; d0 < hd; d0 += 8) {
            uint32_t ah[4], al[4];
            fa_split(Qs[ra * hdp + d0 + tq], ah[0], al[0]);
            fa_split(Qs[rb * hdp + d0 + tq], ah[1], al[1]);
            fa_split(Qs[ra * hdp + d0 + tq + 4], ah[2], al[2]);
            fa_split(Qs[rb * hdp + d0 + tq + 4], ah[3], al[3]);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float *kr = Ks + (8 * j + gq) * hdp + d0 + tq;
                uint32_t bh0, bl0, bh1, bl1;
                fa_split(kr[0], bh0, bl0);
                fa_split(kr[4], bh1, bl1);
                fa_mma(sx[j], ah, bl0, bl1);
                fa_mma(sx[j], al, bh0, bh1);
                fa_mma(s[j], ah, bh0, bh1);
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int64_t key = k0 + 8 * j + 2 * tq + (e & 1);
                float v = fa_sees(a, key, pr[e >> 1]) ? (s[j][e] + sx[j][e]) * a.scale : -INFINITY;
                s[j][e] = v, mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        float corr[2], mb[2], ls[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], ms_shfl_xor(mx[i], 1));
            mx[i] = fmaxf(mx[i], ms_shfl_xor(mx[i], 2));
            fa_rescale(m[i], mx[i], corr[i], mb[i]);
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float pv = expf(s[j][e] - mb[e >> 1]);
                s[j][e] = pv, ls[e >> 1] += pv;
            }
        l[0] = l[0] * corr[0] + ls[0];
        l[1] = l[1] * corr[1] + ls[1];
        float t[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) t[nt][0] = t[nt][1] = t[nt][2] = t[nt][3] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t ph[4], pl[4];
            fa_split(s[j][0], ph[0], pl[0]); /* row gq,     key 2 tq     (k = tq)     */
            fa_split(s[j][2], ph[1], pl[1]); /* row gq + 8, key 2 tq     (k = tq)     */
            fa_split(s[j][1], ph[2], pl[2]); /* row gq,     key 2 tq + 1 (k = tq + 4) */
            fa_split(s[j][3], ph[3], pl[3]); /* row gq + 8, key 2 tq + 1 (k = tq + 4) */
            const float *vr = Vs + (8 * j + 2 * tq) * vdp + gq;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                if (8 * nt < vb) {
                    uint32_t vh0, vl0, vh1, vl1;
                    fa_split(vr[8 * nt], vh0, vl0);
                    fa_split(vr[vdp + 8 * nt], vh1, vl1);
                    fa_mma(t[nt], ph, vl0, vl1);
                    fa_mma(t[nt], pl, vh0, vh1);
                    fa_mma(t[nt], ph, vh0, vh1);
                }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            o[nt][0] = fmaf(o[nt][0], corr[0], t[nt][0]);
            o[nt][1] = fmaf(o[nt][1], corr[0], t[nt][1]);
            o[nt][2] = fmaf(o[nt][2], corr[1], t[nt][2]);
            o[nt][3] = fmaf(o[nt][3], corr[1], t[nt][3]);
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += ms_shfl_xor(l[i], 1);
        l[i] += ms_shfl_xor(l[i], 2);
        int gr = r0 + (i ? rb : ra);
        if (gr >= a.rows) continue;
        int tk = gr / a.G, h = kvh * a.G + gr % a.G;
        float inv = fa_inv(a, h, m[i], l[i]);
        float *dst = a.out + ((int64_t)tk * a.H + h) * vd + v0 + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            if (8 * nt < vb) *(float2 *)(dst + 8 * nt) = make_float2(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
    }
#elif defined(__CUDA_ARCH__)
    __trap(); /* built for a device without mma.sync TF32: the host never picks this form there */
#endif
}

/* ---------------------------------------------------------------- host */

/* MS_GPU_PREFILL_ATTN: -1 "old", MS_GPU_FA_FMA "fma", MS_GPU_FA_MMA "mma", else MS_GPU_FA_AUTO */
static int fa_env_form(void) {
    const char *e = getenv("MS_GPU_PREFILL_ATTN");
    if (!e) return MS_GPU_FA_AUTO;
    if (!strcmp(e, "old")) return -1;
    if (!strcmp(e, "fma")) return MS_GPU_FA_FMA;
    if (!strcmp(e, "mma")) return MS_GPU_FA_MMA;
    return MS_GPU_FA_AUTO;
}

static int fa_device_mma(const ms_gpu *g) { return FA_HAVE_MMA && g->prop.major >= 8; }

extern "C" int ms_gpu_attn_prefill_wanted(ms_gpu *g, int n, int64_t pos0, const ms_gpu_attn_cfg *c) {
    if (!g || !c || n < 2 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads) return 0;
    int64_t rows = (int64_t)n * (c->n_heads / c->n_kv_heads), blocks = (rows + FA_ROWS - 1) / FA_ROWS * c->n_kv_heads;
    /* a block per SM at least: 256-token chunks of Qwen3-30B (128 blocks) deep in a 4096-token prompt
     * ran 0.94x the split-K path on the H200 with half the SMs as the bar (pp4096, default chunk) */
    return blocks >= g->prop.multiProcessorCount || pos0 + n <= 1024;
}

template <typename K> static int fa_launch(ms_gpu *g, K kernel, dim3 grid, size_t bytes, const fa_args &a, ms_err *err) {
    if (bytes > 48 * 1024) {
        gpuError_t e = gpuFuncSetAttribute((const void *)kernel, gpuFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
        if (e != gpuSuccess) {
            (void)gpuGetLastError();
            return ms_fail(err, MS_ERR_UNSUPPORTED, "prefill attention: %zu bytes of shared memory: %s", bytes,
                           gpuGetErrorString(e));
        }
    }
    kernel<<<grid, FA_THREADS, bytes, g->stream>>>(a);
    return ms_gpu_launched(err, "prefill attention (tiled)");
}

extern "C" int ms_gpu_attn_prefill(ms_gpu *g, float *out, const float *q, const float *k_cache, const float *v_cache,
                                   const float *sinks, int n, int64_t pos0, const ms_gpu_attn_cfg *c, int form,
                                   ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!out || !q || !k_cache || !v_cache || !c || n < 1 || pos0 < 0)
        return ms_fail(err, MS_ERR_ARG, "ms_gpu_attn_prefill: NULL argument, n < 1 or pos0 < 0");
    if (form == MS_GPU_FA_AUTO) {
        int e = fa_env_form();
        if (e < 0) return ms_fail(err, MS_ERR_UNSUPPORTED, "prefill attention: MS_GPU_PREFILL_ATTN=old");
        form = e != MS_GPU_FA_AUTO ? e : fa_device_mma(g) ? MS_GPU_FA_MMA : MS_GPU_FA_FMA;
    }
    if (form != MS_GPU_FA_FMA && form != MS_GPU_FA_MMA)
        return ms_fail(err, MS_ERR_ARG, "ms_gpu_attn_prefill: form %d", form);
    if (form == MS_GPU_FA_MMA && !fa_device_mma(g))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "prefill attention: no TF32 tensor cores on this device");
    if (c->n_heads < 1 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads || c->head_dim < 8 || c->head_dim % 8 ||
        c->head_dim > FA_MAXD || c->v_head_dim < 8 || c->v_head_dim % 8 || c->v_head_dim > FA_MAXVD || c->window < 0)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "prefill attention: %d heads over %d, head dims %d / %d (multiples of 8, <= %d / %d), window %d",
                       c->n_heads, c->n_kv_heads, c->head_dim, c->v_head_dim, FA_MAXD, FA_MAXVD, c->window);
    if (((uintptr_t)out | (uintptr_t)q | (uintptr_t)k_cache | (uintptr_t)v_cache) % 16)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "prefill attention: q, out and the caches must be 16-byte aligned");
    int G = c->n_heads / c->n_kv_heads;
    int64_t rows = (int64_t)n * G;
    if (rows > (int64_t)1 << 30) return ms_fail(err, MS_ERR_UNSUPPORTED, "prefill attention: %lld rows", (long long)rows);
    size_t bytes = fa_smem_floats(c->head_dim, c->v_head_dim, form) * sizeof(float);
#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP)
    size_t limit = g->prop.sharedMemPerBlock;
#else
    size_t limit = g->prop.sharedMemPerBlockOptin;
#endif
    if (bytes > limit)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "prefill attention: %zu bytes of shared memory (device: %zu)", bytes,
                       limit);
    fa_args a;
    a.out = out, a.q = q, a.k = k_cache, a.v = v_cache, a.sinks = sinks, a.pos0 = pos0;
    a.rows = (int)rows, a.H = c->n_heads, a.KV = c->n_kv_heads, a.G = G, a.hd = c->head_dim, a.vd = c->v_head_dim;
    a.window = c->window, a.scale = c->scale;
    const char *ld = getenv("MS_GPU_FA_LOAD");
    a.async = FA_HAVE_MMA && g->prop.major >= 8 && ld && !strcmp(ld, "async");
    dim3 grid((unsigned)((rows + FA_ROWS - 1) / FA_ROWS), (unsigned)c->n_kv_heads,
              (unsigned)((c->v_head_dim + FA_MAXV - 1) / FA_MAXV));
    int small = c->v_head_dim <= 64;
    if (form == MS_GPU_FA_MMA)
        return small ? fa_launch(g, fa_mma_kernel<8>, grid, bytes, a, err)
                     : fa_launch(g, fa_mma_kernel<16>, grid, bytes, a, err);
    return small ? fa_launch(g, fa_fma_kernel<8>, grid, bytes, a, err)
                 : fa_launch(g, fa_fma_kernel<16>, grid, bytes, a, err);
}
