/* attn_mla.cu — MLA's absorbed latent attention of one decode token (attn_mla.h). The earlier
 * kernel (backend_gpu.cu's k_mla_attn) gives each head one block of 4 warps that walks every key
 * in turn: a dependent chain of loads, a warp sum and two exponentials per key, 32 blocks for
 * 32 heads. Here block (head, split) takes MLAD_CHUNK keys (or more, so that at most MLAD_MAXNS
 * splits), writes its (max, sum, unnormalized o_lat) and the head's last block to arrive (an
 * arrival counter, ms_gpu_counters) merges them: the same running softmax, another grouping of
 * the sums. Every runtime name goes through gpu_port.h (hipcc compiles this file too). */
#include <math.h>

#include "backend/gpu/gpu_internal.h"
#include "backend/gpu/attn_mla.h"

#define MLAD_WARPS 4
#define MLAD_MAXL 1024 /* latent width held per warp */
#define MLAD_MAXNS 64  /* splits per head */
#define MLAD_CHUNK 32  /* keys per split (at least) */

typedef struct {
    float *olat, *part;
    const float *qlat, *q, *latent;
    const int32_t *sel, *sel_count;
    const int64_t *pos; /* device position (or NULL: n_past) */
    int *cnt;
    int64_t n_past, H, lora, rope, nope, chunk;
    float scale;
} mlad_a;

__global__ void __launch_bounds__(MLAD_WARPS *MS_WARP) k_mla_decode(const mlad_a a) {
    extern __shared__ float sh[];
    __shared__ float fs[MLAD_MAXNS];
    __shared__ int last;
    const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP;
    const int64_t h = blockIdx.x, sp = blockIdx.y, ns = gridDim.y, lw = a.lora + a.rope, qk = a.nope + a.rope;
    float *qs = sh, *wm = qs + lw, *wl = wm + MLAD_WARPS, *wacc = wl + MLAD_WARPS;
    for (int64_t i = threadIdx.x; i < a.lora; i += blockDim.x) qs[i] = a.qlat[h * a.lora + i];
    for (int64_t i = threadIdx.x; i < a.rope; i += blockDim.x) qs[a.lora + i] = a.q[h * qk + a.nope + i];
    __syncthreads();
    const int64_t cnt = a.sel ? a.sel_count[0] : (a.pos ? a.pos[0] : a.n_past) + 1;
    const int64_t k0 = sp * a.chunk, k1 = k0 + a.chunk < cnt ? k0 + a.chunk : cnt;
    float m = -INFINITY, l = 0, o[MLAD_MAXL / MS_WARP];
#pragma unroll
    for (int j = 0; j < MLAD_MAXL / MS_WARP; j++) o[j] = 0;
    for (int64_t si = k0 + warp; si < k1; si += MLAD_WARPS) {
        const float *row = a.latent + (a.sel ? (int64_t)a.sel[si] : si) * lw;
        float part = 0, rv[8];
        int64_t c = lane;
        for (; c + 7 * MS_WARP < lw; c += 8 * MS_WARP) { /* 8 loads in flight, the same order */
#pragma unroll
            for (int j = 0; j < 8; j++) rv[j] = row[c + j * MS_WARP];
#pragma unroll
            for (int j = 0; j < 8; j++) part = fmaf(qs[c + j * MS_WARP], rv[j], part);
        }
        for (; c < lw; c += MS_WARP) part = fmaf(qs[c], row[c], part);
        float sc = ms_warp_sum(part) * a.scale;
        float mn = sc > m ? sc : m, f = m == -INFINITY ? 0.0f : expf(m - mn), pw = expf(sc - mn);
        l = l * f + pw;
#pragma unroll
        for (int j = 0; j < MLAD_MAXL / MS_WARP; j++) {
            int64_t c = lane + (int64_t)j * MS_WARP;
            if (c < a.lora) o[j] = o[j] * f + pw * row[c];
        }
        m = mn;
    }
    if (lane == 0) wm[warp] = m, wl[warp] = l;
#pragma unroll
    for (int j = 0; j < MLAD_MAXL / MS_WARP; j++) {
        int64_t c = lane + (int64_t)j * MS_WARP;
        if (c < a.lora) wacc[warp * a.lora + c] = o[j];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < MLAD_WARPS; w++) M = wm[w] > M ? wm[w] : M;
    float den = 0, fw[MLAD_WARPS];
    for (int w = 0; w < MLAD_WARPS; w++) {
        fw[w] = wm[w] == -INFINITY ? 0.0f : expf(wm[w] - M);
        den += fw[w] * wl[w];
    }
    float *pp = a.part + (h * ns + sp) * (a.lora + 2); /* [max, sum, o_lat unnormalized] */
    for (int64_t c = threadIdx.x; c < a.lora; c += blockDim.x) {
        float s = 0;
        for (int w = 0; w < MLAD_WARPS; w++) s += fw[w] * wacc[w * a.lora + c];
        pp[2 + c] = s;
    }
    if (threadIdx.x == 0) pp[0] = M, pp[1] = den;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int prev = atomicAdd(&a.cnt[h], 1);
        last = prev == (int)ns - 1;
        if (last) a.cnt[h] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const volatile float *ph = a.part + h * ns * (a.lora + 2);
    float Mg = -INFINITY;
    for (int64_t s = 0; s < ns; s++) Mg = ph[s * (a.lora + 2)] > Mg ? ph[s * (a.lora + 2)] : Mg;
    for (int64_t s = threadIdx.x; s < ns; s += blockDim.x) {
        float ms = ph[s * (a.lora + 2)];
        fs[s] = ms == -INFINITY ? 0.0f : expf(ms - Mg);
    }
    __syncthreads();
    float dg = 0;
    for (int64_t s = 0; s < ns; s++) dg += fs[s] * ph[s * (a.lora + 2) + 1];
    const float inv = dg > 0 ? 1.0f / dg : 0.0f;
    for (int64_t c = threadIdx.x; c < a.lora; c += blockDim.x) {
        float t = 0;
        for (int64_t s = 0; s < ns; s++) t += fs[s] * ph[s * (a.lora + 2) + 2 + c];
        a.olat[h * a.lora + c] = t * inv;
    }
}

/* the split: keys per block and splits for at most `keys` keys */
static void mlad_split(int64_t keys, int64_t *chunk, int64_t *ns) {
    if (keys < 1) keys = 1;
    int64_t c = MLAD_CHUNK;
    if ((keys + c - 1) / c > MLAD_MAXNS) c = (keys + MLAD_MAXNS - 1) / MLAD_MAXNS;
    *chunk = c;
    *ns = (keys + c - 1) / c;
}

size_t ms_gpu_mla_decode_scratch(int64_t H, int64_t lora) { return (size_t)(H * MLAD_MAXNS * (lora + 2)); }

int ms_gpu_mla_decode(ms_gpu *g, float *olat, const float *qlat, const float *q, const float *latent,
                      const int32_t *sel, const int32_t *sel_count, int64_t sel_width, int64_t n_past,
                      const int64_t *pos_dev, int64_t H, int64_t lora, int64_t rope, int64_t nope, float scale, float *scr,
                      ms_err *err) {
    if (lora < 1 || lora > MLAD_MAXL || rope < 0 || H < 1 || H > 65535)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "MLA decode: latent width %lld, %lld heads", (long long)lora,
                       (long long)H);
    int64_t chunk, ns;
    mlad_split(sel ? sel_width : n_past + 1, &chunk, &ns);
    mlad_a a = {olat, scr, qlat, q, latent, sel, sel_count, pos_dev, NULL, n_past, H, lora, rope, nope, chunk, scale};
    if (!(a.cnt = ms_gpu_counters(g, H, err))) return err ? err->code : MS_ERR_NOMEM;
    size_t shm = (size_t)(lora + rope + 2 * MLAD_WARPS + MLAD_WARPS * lora) * 4;
    k_mla_decode<<<dim3((unsigned)H, (unsigned)ns), MLAD_WARPS * MS_WARP, shm, g->stream>>>(a);
    return ms_gpu_launched(err, "MLA decode attention");
}
