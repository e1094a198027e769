/* mhc.h — manifold-constrained hyper-connections (mHC): the residual stream is
 * widened to hc parallel streams [tokens, hc, dim]; around every sublayer a
 * learned mapping collapses the streams into the sublayer's input and mixes the
 * sublayer output back in (transformers 5.17 Glm5NextTextHyperConnection,
 * DeepseekV4HyperConnection — identical math).
 *
 * Per token, with x the hc streams flattened to [hc*dim]:
 *   r      = 1 / sqrt(mean(x^2) + norm_eps)                (unweighted RMSNorm)
 *   m      = r * (fn x)                                     fn: [(2+hc)*hc, hc*dim]
 *   pre_i  = sigmoid(m[i] * scale[0] + base[i]) + hc_eps          i < hc
 *   post_i = 2 * sigmoid(m[hc+i] * scale[1] + base[hc+i])
 *   comb   = Sinkhorn(m[2hc + i*hc + j] * scale[2] + base[2hc + i*hc + j])   [hc, hc]
 *   collapsed = sum_i pre_i * stream_i                       -> the sublayer input
 *   new stream_j = post_j * y + sum_i comb[i][j] * stream_i  (y = sublayer output)
 * Sinkhorn (as the reference): comb = softmax over each row + hc_eps; divide each
 * column by (its sum + hc_eps); then iters-1 times: rows by (sum + hc_eps),
 * columns by (sum + hc_eps).
 *
 * The stack starts as hc copies of the embedding and ends with a "hyper head":
 * GLM-5-Next takes the plain mean of the streams; DeepSeek-V4 a learned
 * weighting pre_i = sigmoid(r * (hc_fn x)_i * hc_scale + hc_base_i) + hc_eps,
 * out = sum_i pre_i * stream_i. */
#ifndef MS_MHC_H
#define MS_MHC_H

#include "ops/ops.h"
#include "util/err.h"

typedef struct ms_mhc {
    int hc;             /* streams, >= 1 */
    int dim;            /* hidden size, >= 1 */
    const ms_qmat *fn;  /* [(2+hc)*hc, hc*dim] in its stored dtype */
    const float *base;  /* [(2+hc)*hc] F32 */
    const float *scale; /* [3] F32: pre, post, comb */
    int sinkhorn_iters; /* hc_sinkhorn_iters, >= 1 */
    float hc_eps;       /* hc_eps */
    float norm_eps;     /* rms_norm_eps (the flattened-stream RMSNorm) */
} ms_mhc;

/* Sinkhorn normalization of one [n, n] logit matrix m in place (row-major,
 * m[i*n + j]) into a (nearly) doubly-stochastic matrix, exactly as above.
 * Errors: MS_ERR_ARG (n < 1, iters < 1). */
int ms_mhc_sinkhorn(float *m, int n, int iters, float eps, ms_err *err);

/* Collapse side of one hyper-connection for n tokens. streams: [n, hc, dim];
 * collapsed out: [n, dim]; post out: [n, hc]; comb out: [n, hc, hc] (comb[t][i][j]:
 * weight of old stream i in new stream j). Work on fn is split across pool.
 * Errors: MS_ERR_ARG (shapes), MS_ERR_NOMEM. */
int ms_mhc_pre(ms_pool *pool, const ms_mhc *h, const float *streams, int n, float *collapsed, float *post,
               float *comb, ms_err *err);

/* Expand side: out[t][j] = post[t][j] * y[t] + sum_i comb[t][i][j] * in[t][i].
 * in, out: [n, hc, dim] and must not overlap; y: [n, dim]. */
void ms_mhc_post(const float *in, const float *y, const float *post, const float *comb, int n, int hc, int dim,
                 float *out);

/* out [n, hc, dim] = hc copies of x [n, dim] (the stack's start). */
void ms_mhc_expand(const float *x, int n, int hc, int dim, float *out);

/* GLM-5-Next hyper head: out [n, dim] = mean over the hc streams of [n, hc, dim]. */
void ms_mhc_head_mean(const float *streams, int n, int hc, int dim, float *out);

/* DeepSeek-V4 hyper head: fn [hc, hc*dim], base [hc] F32, scale [1] F32. out [n, dim].
 * Errors: MS_ERR_ARG (shapes), MS_ERR_NOMEM. */
int ms_mhc_head_weighted(ms_pool *pool, const ms_qmat *fn, const float *base, const float *scale, int hc, int dim,
                         float hc_eps, float norm_eps, const float *streams, int n, float *out, ms_err *err);

#endif
