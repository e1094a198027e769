/* attn_res.c — the CPU backend's Attention Residuals op (Kimi K3): instead of one running residual
 * stream, a layer's sublayer input is a softmax mixture over depth of the
 * block states completed so far and the current partial sum. As the official
 * _apply_attn_res, per token, in F32:
 *   v_i     = blocks[i] (i < nb), v_nb = cur
 *   score_i = sum_d v_i[d] / sqrt(mean(v_i^2) + eps) * norm[d] * proj[d]
 *   out     = sum_i softmax(score)_i v_i
 * The mixture never looks at other tokens: the block states of a token are
 * working state of that token's forward pass, rebuilt every step. */
#include <math.h>
#include <string.h>

#include "backend/cpu/be_cpu.h"

void ms_cpu_attn_res_mix(ms_backend *be, float *out, const float *blocks, int nb, int64_t block_stride,
                         const float *cur, int n, int64_t d, const float *norm, const float *proj, float eps) {
    float *scratch = cpu_thread_buf(cpu_of(be), 0); /* d + nb + 1 floats (ms_cpu_th_stride) */
    float *w = scratch;            /* [d] norm * proj */
    float *sc = scratch + d;       /* [nb + 1] */
    for (int64_t i = 0; i < d; i++) w[i] = norm[i] * proj[i];
    for (int t = 0; t < n; t++) {
        const float *ct = cur + (int64_t)t * d;
        for (int i = 0; i <= nb; i++) {
            const float *v = i < nb ? blocks + (int64_t)i * block_stride + (int64_t)t * d : ct;
            double ss = 0, dot = 0;
            for (int64_t k = 0; k < d; k++) ss += (double)v[k] * v[k];
            float inv = (float)(1.0 / sqrt(ss / (double)d + eps));
            for (int64_t k = 0; k < d; k++) dot += (double)(v[k] * inv) * w[k];
            sc[i] = (float)dot;
        }
        ms_softmax(sc, nb + 1);
        float *o = out + (int64_t)t * d;
        for (int64_t k = 0; k < d; k++) {
            float acc = sc[nb] * ct[k];
            for (int i = 0; i < nb; i++) acc += sc[i] * blocks[(int64_t)i * block_stride + (int64_t)t * d + k];
            o[k] = acc;
        }
    }
}
