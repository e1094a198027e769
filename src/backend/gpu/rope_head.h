/* rope_head.h — one attention head's RMSNorm and RoPE by the threads of a block, shared by
 * backend_gpu.cu's qk_norm_rope and backend_gpu_step.cu's qkv_at. Include after gpu_internal.h. */
#ifndef MS_GPU_ROPE_HEAD_H
#define MS_GPU_ROPE_HEAD_H

/* dst = rope(norm(src)) for one head of hd floats (dst may be src; every thread of the block
 * calls it): norm != 0: src times 1 / sqrt(mean(src^2) + eps) times w (NULL: ones), as the
 * rmsnorm kernel; then the first 2 half dims rotated at position pos as k_rope (angle
 * (float)pos * inv[i], cos / sin in double times attn_factor, rounded to float; interleaved
 * pairs (2i, 2i + 1) or half-split (i, i + half)), the dims past them copied. hv: hd floats of
 * shared memory, sh: 32 floats of shared memory. */
static __device__ __forceinline__ void ms_head_norm_rope(const float *src, float *dst, int hd, int norm,
                                                         const float *w, float eps, int half, int interleaved,
                                                         const float *inv, double attn_factor, int64_t pos, float *hv,
                                                         float *sh) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float x = src[i];
        hv[i] = x;
        ss = fmaf(x, x, ss);
    }
    if (norm) {
        ss = ms_warp_sum(ss);
        const int lane = threadIdx.x % MS_WARP, warp = threadIdx.x / MS_WARP, nw = blockDim.x / MS_WARP;
        if (lane == 0) sh[warp] = ss;
        __syncthreads();
        float tot = 0.0f;
        for (int i = 0; i < nw; i++) tot += sh[i];
        float r = 1.0f / sqrtf(tot / (float)hd + eps);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) hv[i] = hv[i] * r * (w ? w[i] : 1.0f);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) /* dims past the rotary ones (both layouts: 2 half of them) */
        if (i >= 2 * half) dst[i] = hv[i];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float ang = (float)pos * inv[i];
        float c = (float)(cos((double)ang) * attn_factor), s = (float)(sin((double)ang) * attn_factor);
        int ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
        float a = hv[ia], bb = hv[ib];
        dst[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, s));
        dst[ib] = __fadd_rn(__fmul_rn(bb, c), __fmul_rn(a, s));
    }
}

#endif
