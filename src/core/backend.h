/* backend.h — the one interface between the model code (src/engine) and the
 * machines it runs on (src/backend/cpu, src/backend/gpu).
 *
 * Eager, in the spirit of ggml's backend interface but without a graph: the
 * engine calls an op, the backend runs it (or enqueues it on its stream) and
 * returns. Every pointer an op takes is a backend address: memory from
 * be->ops->alloc (activations, causal state) or a weight placed with
 * place_qmat / place_vec. Pointer arithmetic on backend addresses is allowed
 * (row t of a buffer is buf + t * row); dereferencing them in model code is
 * not: the engine reads device memory only through download. Activations are
 * F32 and row-major; shapes are [rows, cols] as stated on each op.
 *
 * Every op has a scalar or reference twin on the CPU (src/ops/ops_ref.c and the
 * CPU backend itself, which is the reference: its results are the ones the
 * fixtures check). A backend may leave an op NULL: engine creation then fails
 * with MS_ERR_UNSUPPORTED naming the op (ms_backend_require); nothing falls
 * back silently.
 *
 * Ops that cannot fail return void; those that can (allocation, a failed
 * kernel launch, a malformed selection) return MS_OK or MS_ERR_* with err
 * filled. A backend that queues work may report an earlier failure at the next
 * download or sync. */
#ifndef MS_BACKEND_H
#define MS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/expert_source.h"
#include "engine/gdn_block.h"
#include "engine/kda_block.h"
#include "model/config.h"
#include "ops/dsa.h"
#include "ops/mhc.h"
#include "ops/ops.h"
#include "util/err.h"

typedef struct ms_backend ms_backend;

/* The gated activation of an FFN: out = act(gate) * up in place of gate.
 *  SwiGLU (MS_ACT_SILU): with limit > 0 the gate is clamped to
 *  (-inf, limit] and up to [-limit, limit]; g = (u + up_offset) * g * sigmoid(alpha * g)
 *  (ms_swiglu_param; alpha 1, offset 0 is silu(g) * u).
 *  SiTU (MS_ACT_SITU): ms_situ_glu with beta, linear_beta. */
typedef struct ms_glu {
    ms_act_kind kind;
    float limit, alpha, up_offset; /* SwiGLU */
    float beta, linear_beta;       /* SiTU */
} ms_glu;

/* GQA / MHA / SWA / sink attention of n query tokens at positions n_past.. over
 * a KV cache that already holds positions 0..n_past+n-1.
 *   out   [n, H * vd]        softmax(q k^T * scale) v per head
 *   q     [n, H * hd]        roped queries
 *   k     [ctx, KV * hd]     cache rows by position; v [ctx, KV * vd]
 * Query head h reads KV head h / (H / KV). window > 0: token p sees keys
 * max(0, p - window + 1)..p, else 0..p. sinks [H] (or NULL): a per-head logit
 * that joins the softmax denominator only. */
typedef struct ms_attn_gqa_args {
    float *out;
    const float *q, *k, *v;
    int n;
    int64_t n_past;
    int64_t H, KV, hd, vd, window;
    const float *sinks;
    float scale;
    /* a replayable decode step (optional ops below): n = 1 at the position *pos_dev (backend
     * memory, int64), n_past then an upper bound of it (the backend sizes its grid by it) */
    const int64_t *pos_dev;
} ms_attn_gqa_args;

/* MLA attention (DeepSeek V3 family) over the latent cache.
 *   out    [n, H * vd]
 *   q      [n, H * (nope + rope)]  per head [q_nope, q_pe], q_pe roped
 *   latent [ctx, lora + rope]      per position [normalized c, roped k_pe], 0..n_past+n-1 filled
 *   kv_b   [H * (nope + vd), lora] per head: nope rows W_UK, then vd rows W_UV
 * score(t, s) = (q_nope W_UK c_s + q_pe k_pe_s) * scale; out = W_UV sum_s p c_s.
 * sel (DSA, or NULL for causal 0..p): token t attends to sel[t * sel_width + i],
 * i < sel_count[t], ascending positions; both are HOST arrays (the indexer's output).
 * expanded: compute in transformers' expanded form (k_nope, v = kv_b c per cached
 * position, online softmax over key blocks) instead of the absorbed form; only
 * when every head's kv_b rows can be viewed in place (ms_qmat_row_range). */
typedef struct ms_attn_mla_args {
    float *out;
    const float *q, *latent;
    const ms_qmat *kv_b;
    int n;
    int64_t n_past;
    int64_t H, lora, rope, nope, vd;
    float scale;
    const int32_t *sel;
    const int32_t *sel_count;
    int64_t sel_width;
    int expanded;
    /* a replayable decode step (optional ops below): n = 1 at the position *pos_dev (backend
     * memory, int64), absorbed, no sel; n_past then an upper bound of it (the grid's size) */
    const int64_t *pos_dev;
} ms_attn_mla_args;

/* Router of every kind the config knows (ms_router_kind), for n tokens:
 *   logits [n, E] (a router Linear bias already added), bias [E] or NULL
 *   (correction bias), fixed [n, K] or NULL (ids given, only weighed: hash routing, or ids an
 *   observer forced, engine.h; every router kind)
 *   ids [n, K], w [n, K] out: transformers' choice and weights (ties: lower id first;
 *   NaN logits never chosen while another is left; never an id of -1).
 * Reads only the router fields of c (router, n_experts, top_k, n_group,
 * topk_group, norm_topk_prob, routed_scale). */
typedef struct ms_route_args {
    const ms_config *c;
    const float *logits, *bias;
    const int32_t *fixed;
    int n;
    int *ids;
    float *w;
} ms_route_args;

/* DeepSeek Sparse Attention's lightning indexer for one layer and one chunk of n
 * tokens at positions pos0.. (ops/dsa.h has the math and the tie rule). cache: the
 * layer's index-key cache; its arrays (keys [cap, D], KPool gates [cap, D], pooled
 * [cap / kpool + 1, D], ape [kpool, D]) are backend memory, len and cap host
 * bookkeeping; it holds positions 0..pos0-1 and needs cap >= pos0 + n. In order:
 *   k [n, D]    (wk x) becomes rope(LayerNorm(k; k_norm_w, k_norm_b)) in place
 *   q [n, H*D]  (wq_b q_resid) gets the rope on each head's first rope_dims dims in place
 *               (the prepared queries, which the engine keeps for tie re-checks)
 *   the keys (and KPool gate logits g [n, D], else NULL) are appended: len = pos0 + n,
 *   pools completed get their pooled key
 *   the selection of each query against the cache with w [n, H] (weights_proj x, raw):
 *   torch.topk's tie choices for a forward of fwd_len tokens (>= pos0 + n)
 * RoPE angles are ms_rope_cos_sin(rope, pos) (no rotation when rope_dims is 0 or
 * kpool > 1). idx [n, ms_dsa_row_width(cfg)], count [n], ambiguous [n] are HOST
 * arrays (attn_mla's sel / sel_count). Errors: MS_ERR_ARG (config, shapes, a cache
 * not at pos0), MS_ERR_LIMIT (no room), MS_ERR_NOMEM. */
typedef struct ms_dsa_index_args {
    const ms_dsa_cfg *cfg;
    ms_dsa_cache *cache;
    float *q, *k;
    const float *g, *w;
    const float *k_norm_w, *k_norm_b;
    const ms_rope *rope;
    int n;
    int64_t pos0, fwd_len;
    int32_t *idx, *count;
    uint8_t *ambiguous;
} ms_dsa_index_args;

/* DeepSeek V4 compressor (ops/compress.h) of one layer: the raw rows kv, g [n, cw]
 * (cw = (overlap ? 2 : 1) * dim) of positions pos0.. go into the rings raw_kv, raw_g
 * [2 * rate, cw] at slot p % (2 * rate); every window w that closes (p + 1 a multiple
 * of rate) pools into entries + w * dim (ms_compress_pool with ape [rate, cw], norm
 * [dim], eps; overlap: the previous window's rows too, none for w = 0), whose trailing
 * rope->dim dims are then rotated at position w * rate. Rings and entries are backend
 * memory; ape and norm placed vectors. Errors: MS_ERR_ARG (shapes). */
typedef struct ms_compress_args {
    float *raw_kv, *raw_g, *entries;
    const float *kv, *g;
    const float *ape, *norm;
    const ms_rope *rope;
    int rate, overlap, n;
    int64_t dim, pos0;
    float eps;
} ms_compress_args;

/* DeepSeek V4 compressed attention (CSA / HCA) of n query tokens at positions pos0..
 * with one shared key = value per position:
 *   out [n, H * hd]  per head h of token p: sum_i softmax_i(q . key_i * scale) key_i,
 *                    sinks [H] (or NULL) a logit in the denominator only; the output's
 *                    RoPE is not undone here (the engine's rope with sign -1 does it)
 *   q   [n, H * hd]  queries (per-head normed, roped)
 *   kv  [n, hd]      the chunk's keys; win [window, hd] a ring holding the key of each
 *                    earlier position p (p >= pos0 - window + 1) at p % window
 * Keys of p, in this order: positions max(0, p - window + 1)..p (from kv when >= pos0,
 * else win), then (rate > 0) compressed entries comp [n_comp, hd], entry x visible when
 * (x + 1) * rate <= p + 1: HCA (csa 0) every visible one in order; CSA the topk best
 * visible by the indexer score sum_h relu(iq_h . icomp_x) / sqrt(idx_dim) * iw_h /
 * sqrt(idx_heads) (iq [n, idx_heads * idx_dim], iw [n, idx_heads], icomp [n_comp,
 * idx_dim]), chosen with torch.topk's tie rule over a row of max(fwd_len / rate, n_comp)
 * entries (ops/dsa.h ms_dsa_topk), ascending. All arrays backend memory.
 * Errors: MS_ERR_LIMIT (more keys than the backend reserved for). */
typedef struct ms_cattn_args {
    float *out;
    const float *q, *kv, *win, *comp;
    const float *iq, *iw, *icomp;
    const float *sinks;
    int n, csa;
    int64_t pos0, H, hd, window, rate, n_comp;
    int64_t idx_heads, idx_dim, topk, fwd_len;
    float scale;
} ms_cattn_args;

/* The routed experts of one MoE layer in expert-major form (engine/moe.c builds the
 * lists): expert views[u] (u < nu, acquired) takes the (token, weight) pairs
 * off[u]..off[u+1) of tok / w (host arrays: rows of in, routing weights) and
 *   acc[tok] += w * down(act(gate x) * (up x))   (x = in[tok]; biases added, fused
 *                                                 gate_up rows split as the view says)
 * experts in order, pairs in order, in blocks of at most max_batch rows through the
 * scratch rows xs, ys [max_batch, D] and g, u [max_batch, 2 * inter] (backend memory).
 * ms_moe_experts_composed is exactly this through the backend's own ops (gather_rows,
 * matmul, add_bias_any, split_gate_up, glu, scatter_add_rows): the CPU backend's. */
typedef struct ms_moe_args {
    const float *in;
    float *acc;
    int64_t D;
    const ms_glu *act;
    int nu;
    const ms_expert_view *views;
    const int *off, *tok;
    const float *w;
    int max_batch;
    float *xs, *g, *u, *ys;
} ms_moe_args;
void ms_moe_experts_composed(ms_backend *be, const ms_moe_args *a);

/* One decode token's routed experts straight from the router's output, with no host
 * round trip, when every expert of the layer is resident:
 *   acc [D] = sum_j w[j] * expert_{ids[j]}(in),  j < K (in ascending expert id)
 * ids, w [K]: backend memory (route's output, distinct ids); all [E]: the layer's
 * experts' placed views, a host array that stays unchanged while the backend lives
 * (the backend may keep a device copy of it keyed by its address). Optional (NULL:
 * the engine downloads the ids and calls moe_experts); MS_ERR_UNSUPPORTED (nothing
 * done) for layers the backend does not take this way, the engine then does the same.
 * per_call = 1 (streamed experts, engine/device_experts.h): all [E] is this call's array
 * (the E = K acquired views in ascending expert id, backend memory valid until the work
 * queued now has run) and ids [K] hold each slot's index into it (its rank among the K
 * ids, so the ascending order, and the sum, are those of the resident call); the backend
 * keeps no copy of all past the call. */
typedef struct ms_moe_routed_args {
    const float *in;
    float *acc;
    int64_t D;
    const ms_glu *act;
    const int *ids;
    const float *w;
    int K, E;
    const ms_expert_view *all;
    int per_call; /* 1: all is this call's array of the acquired experts (above) */
} ms_moe_routed_args;

typedef struct ms_backend_ops {
    /* ---- memory ---- */
    /* bytes of zeroed backend memory into *out (MS_ERR_NOMEM naming the size) */
    int (*alloc)(ms_backend *be, size_t bytes, void **out, ms_err *err);
    void (*free)(ms_backend *be, void *p);
    /* host → backend, backend → host (waits for queued work), backend → backend; zero */
    int (*upload)(ms_backend *be, void *dst, const void *src, size_t bytes, ms_err *err);
    int (*download)(ms_backend *be, void *dst, const void *src, size_t bytes, ms_err *err);
    void (*copy)(ms_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(ms_backend *be, void *dst, size_t bytes);
    /* rows strided copy: dst[r * dst_stride + i] = src[r * src_stride + i], i < width floats */
    void (*copy_rows)(ms_backend *be, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                      int64_t rows, int64_t width);
    /* wait for every queued op; reports a failure of any of them */
    int (*sync)(ms_backend *be, ms_err *err);
    /* A weight on the backend: out describes the same matrix (dtype, shape, blocks) with
     * data/scale in backend memory (the CPU backend: the host view itself). Owned by the
     * backend until destroy. Vectors (norms, biases) likewise, F32. */
    int (*place_qmat)(ms_backend *be, const ms_qmat *host, ms_qmat *out, ms_err *err);
    int (*place_vec)(ms_backend *be, const float *host, int64_t n, const float **out, ms_err *err);
    void (*destroy)(ms_backend *be);
    /* Planning: bytes of the backend's own workspace (per-thread scratch, staging) for a
     * model of config c at max_ctx tokens of context and chunks of max_batch tokens, and
     * reserving it (engine creation; a backend shared by engines keeps the largest). */
    uint64_t (*workspace_bytes)(const ms_backend *be, const ms_config *c, int64_t max_ctx, int64_t max_batch);
    int (*reserve)(ms_backend *be, const ms_config *c, int64_t max_ctx, int64_t max_batch, ms_err *err);

    /* ---- dense math ---- */
    /* y [n, w->rows] = x [n, w->cols] W^T (acc: y +=), W in its stored dtype */
    void (*matmul)(ms_backend *be, float *y, const float *x, int n, const ms_qmat *w, int acc);
    /* several independent products in one pass (no job's y overlaps another's x or y) */
    void (*matmul_many)(ms_backend *be, const ms_matmul_job *jobs, int count);
    /* y = x / sqrt(mean(x^2) + eps) * (w ? w : 1), rows of d; y may equal x */
    void (*rmsnorm)(ms_backend *be, float *y, const float *x, const float *w, int64_t rows, int64_t d, float eps);
    /* Optional (NULL: the engine runs add, then rmsnorm): x[i] += y[i] for i < rows * d, then
     * xn = rmsnorm(x) * w as rmsnorm does (the residual add and the next sublayer's norm) */
    void (*add_rmsnorm)(ms_backend *be, float *x, const float *y, float *xn, const float *w, int64_t rows, int64_t d,
                        float eps);
    /* x[r * d + i] += b[i] for rows r; b F32 [d] */
    void (*add_bias)(ms_backend *be, float *x, const float *b, int64_t rows, int64_t d);
    /* y[i] += x[i]; x[i] *= s; x[i] *= sigmoid(g[i]) for i < n */
    void (*add)(ms_backend *be, float *y, const float *x, int64_t n);
    void (*scale)(ms_backend *be, float *x, float s, int64_t n);
    void (*mul_sigmoid)(ms_backend *be, float *x, const float *g, int64_t n);
    /* RoPE on heads of n tokens at positions pos0 + t: head h of token t starts at
     * x + t * tok_stride + h * head_stride + offset and its first r->dim dims rotate
     * (r->layout pairs). sign -1 rotates backwards (inverse RoPE). */
    void (*rope)(ms_backend *be, const ms_rope *r, float *x, int n, int64_t tok_stride, int64_t heads,
                 int64_t head_stride, int64_t offset, int64_t pos0, float sign);
    /* Optional (NULL: rmsnorm of each head, then rope, as the engine composes them): the
     * per-head query/key norm and RoPE of n tokens at positions pos0..: q [n, qh * hd] heads
     * normed with wq [hd], k [n, kh * hd] with wk [hd] (eps), then r rotates the first r->dim
     * dims of every head of both */
    void (*qk_norm_rope)(ms_backend *be, const ms_rope *r, float *q, int64_t qh, const float *wq, float *k,
                         int64_t kh, const float *wk, int n, int64_t hd, float eps, int64_t pos0);
    /* gate [n] = act(gate) * up elementwise (ms_glu); up may be modified (clamped) */
    void (*glu)(ms_backend *be, const ms_glu *a, float *gate, float *up, int64_t n);
    /* x [n, d] rows of the embedding table (any stored dtype) for host token ids */
    void (*embed)(ms_backend *be, float *x, const ms_qmat *table, const int32_t *tokens, int n);

    /* ---- attention ---- */
    int (*attn_gqa)(ms_backend *be, const ms_attn_gqa_args *a, ms_err *err);
    int (*attn_mla)(ms_backend *be, const ms_attn_mla_args *a, ms_err *err);

    /* ---- mixture of experts ---- */
    void (*route)(ms_backend *be, const ms_route_args *a);
    /* optional (NULL: matmul then route): one decode token's router logits a->logits [E] =
     * router x and the route op's selection of them into a->ids / a->w (a->n = 1, no fixed
     * ids, no logit bias: the engine asks only then), in one step where the backend can */
    void (*router_route)(ms_backend *be, const ms_route_args *a, const float *x, const ms_qmat *router);
    /* dst[i] = src[rows[i]] for i < m, rows of d floats (rows: host array) */
    void (*gather_rows)(ms_backend *be, float *dst, const float *src, const int *rows, int m, int64_t d);
    /* dst[rows[i]] += w[i] * src[i] for i < m in order (rows, w: host arrays) */
    void (*scatter_add_rows)(ms_backend *be, float *dst, const float *src, const int *rows, const float *w, int m,
                             int64_t d);
    /* dst[rows[i]] += w[i] * src[rows[i]] for i < m in order, rows of d floats (rows, w: host
     * arrays; dst and src distinct buffers): zero-computation experts (LongCat-Flash), whose
     * output is their weight times the FFN input src, added after the routed experts' sum dst */
    void (*scale_add_rows)(ms_backend *be, float *dst, const float *src, const int *rows, const float *w, int m,
                           int64_t d);
    /* x [m, d] += bias (a stored F32/F16/BF16 vector [d], host or placed) */
    void (*add_bias_any)(ms_backend *be, float *x, const void *bias, ms_dtype dt, int64_t m, int64_t d);
    /* interleaved fused gate/up rows [m, 2I] in u → gate g [m, I], up u [m, I] (in place in u) */
    void (*split_gate_up)(ms_backend *be, float *g, float *u, int64_t m, int64_t I);
    /* y[t] += sigmoid(s[t]) * x[t] for rows of d (shared-expert gate) */
    void (*add_gated_rows)(ms_backend *be, float *y, const float *x, const float *s, int64_t rows, int64_t d);
    /* the routed experts of a layer (ms_moe_args), and the device-routed decode form (optional) */
    void (*moe_experts)(ms_backend *be, const ms_moe_args *a);
    int (*moe_experts_routed)(ms_backend *be, const ms_moe_routed_args *a, ms_err *err);

    /* ---- linear attention (KDA, gated DeltaNet) ---- */
    /* out [n, hidden] = the KDA token mixer (engine/kda_block.h: projections, short
     * convolutions, decay gate, delta rule, gated RMSNorm, o_proj) over x [n, hidden],
     * n >= 1 tokens following what st has seen; updates st (conv tails and recurrent
     * state, backend memory of ms_kda_state_lens floats each, zero = a fresh sequence).
     * Chunked delta rule for n > 1, the recurrence for n = 1. out may not alias x.
     * Errors: MS_ERR_ARG / MS_ERR_SHAPE (config, weights, a state of another config),
     * MS_ERR_NOMEM. */
    int (*kda_forward)(ms_backend *be, const ms_kda_config *c, const ms_kda_weights *w, ms_kda_state *st,
                       const float *x, int n, float *out, ms_err *err);
    /* The same for a gated DeltaNet layer (engine/gdn_block.h; state: ms_gdn_state_lens). */
    int (*gdn_forward)(ms_backend *be, const ms_gdn_config *c, const ms_gdn_weights *w, ms_kda_state *st,
                       const float *x, int n, float *out, ms_err *err);

    /* ---- sparse and compressed attention (DSA indexer, DeepSeek V4) ---- */
    int (*dsa_index)(ms_backend *be, const ms_dsa_index_args *a, ms_err *err);
    /* Re-derive the selection of one earlier query at pos (prepared q [H*D], raw w [H],
     * backend memory) against the cache, for a forward of fwd_len tokens: idx
     * [ms_dsa_row_width(cfg)] and *count HOST out; the cache is not changed. The same
     * scores and tie choices as dsa_index gave a query with those inputs (the CPU
     * backend: single-threaded). Errors: as dsa_index. */
    int (*dsa_recheck)(ms_backend *be, const ms_dsa_cfg *cfg, const ms_dsa_cache *cache, const float *q,
                       const float *w, int64_t pos, int64_t fwd_len, int32_t *idx, int32_t *count, ms_err *err);
    /* DeepSeek V4 (engine/compressed_attn.c): the compressors and the attention core */
    int (*compress_append)(ms_backend *be, const ms_compress_args *a, ms_err *err);
    int (*attn_compressed)(ms_backend *be, const ms_cattn_args *a, ms_err *err);

    /* ---- residual-stream variants (mHC, Attention Residuals) ---- */
    /* mHC (ops/mhc.h; the engine: engine/mhc_layer.c): streams [n, hc, dim] in backend
     * memory, h's weights placed. pre: the collapse of one hyper-connection, collapsed
     * [n, dim], post [n, hc], comb [n, hc, hc] out (comb[t][i][j]: old stream i in new
     * stream j); errors MS_ERR_ARG (shapes), MS_ERR_NOMEM. post: out [n, hc, dim] =
     * post[t][j] * y[t] + sum_i comb[t][i][j] * in[t][i] (in and out do not overlap).
     * expand: out [n, hc, dim] = hc copies of x [n, dim]. head_mean: out [n, dim] = the
     * streams' mean. head_weighted (DeepSeek V4): out [n, dim] = sum_i pre_i stream_i with
     * pre = sigmoid(rms(x) (fn x) * scale[0] + base) + hc_eps; fn [hc, hc*dim], base [hc],
     * scale [1]; errors as pre. */
    int (*mhc_pre)(ms_backend *be, const ms_mhc *h, const float *streams, int n, float *collapsed, float *post,
                   float *comb, ms_err *err);
    void (*mhc_post)(ms_backend *be, const float *in, const float *y, const float *post, const float *comb, int n,
                     int hc, int dim, float *out);
    void (*mhc_expand)(ms_backend *be, const float *x, int n, int hc, int dim, float *out);
    void (*mhc_head_mean)(ms_backend *be, const float *streams, int n, int hc, int dim, float *out);
    int (*mhc_head_weighted)(ms_backend *be, const ms_qmat *fn, const float *base, const float *scale, int hc,
                             int dim, float hc_eps, float norm_eps, const float *streams, int n, float *out,
                             ms_err *err);
    /* Attention Residuals (Kimi K3): out[t] = the softmax-over-depth mixture of
     * blocks[0..nb)[t] (block i at blocks + i * block_stride, rows of d) and cur[t],
     * scored by sum(rmsnorm(v) * norm * proj), for t < n. norm, proj [d]. */
    void (*attn_res_mix)(ms_backend *be, float *out, const float *blocks, int nb, int64_t block_stride,
                         const float *cur, int n, int64_t d, const float *norm, const float *proj, float eps);

    /* ---- optional: host staging and capacity (NULL where the backend has none; the CPU backend) ---- */
    /* Page-lock the host range [p, p + bytes) so upload copies from it by DMA (cudaHostRegister):
     * the device expert source registers the streaming source's host cache, which the io_uring
     * reader fills, so that cache is the pinned staging with no extra copy. An upload from
     * registered memory may still be in flight when it returns: the caller syncs before it
     * writes that memory again. unregister undoes it (before the memory is unmapped). A read-only
     * range (a PROT_READ mapping: the mapped checkpoint, whose CPU-layer experts hybrid execution's
     * gpu_share uploads) is registered read-only where the backend can. */
    int (*host_register)(ms_backend *be, void *p, size_t bytes, ms_err *err);
    void (*host_unregister)(ms_backend *be, void *p);
    /* Free and total bytes of the backend's memory now (the device expert source's default budget). */
    int (*mem_info)(ms_backend *be, uint64_t *free_bytes, uint64_t *total_bytes, ms_err *err);

    /* ---- optional: the replayable decode step (NULL on the CPU backend; engine/decode_step.c) ----
     * One decode token whose per-token values are read from backend memory, so that one recorded
     * step replays for the next tokens: step [2] int64 = {position, token id} (backend memory,
     * written by an upload before each step).
     * embed_at: x [table->cols] = the embedding row of token step[1] (any stored dtype).
     * qkv_at: q [qh * hd] and k [kh * hd] of one token, each head RMS-normed with wq / wk when norm
     *   is 1 (as rmsnorm with eps), then the first r->dim dims of every head rotated by r at position
     *   step[0] (as rope); then k and v [kh * vd] written into row step[0] of k_cache [., kh * hd]
     *   and v_cache [., kh * vd]. k and v are scratch rows (k is changed).
     * attn_gqa reads the position from a->pos_dev when it is set (ms_attn_gqa_args).
     * graph_begin: the ops that follow are recorded, not run, until graph_end, which gives the
     *   recording as a replayable graph in *graph (MS_ERR_UNSUPPORTED when recording is off (the
     *   profile) or failed: then nothing ran, and the ops' failures during it are not kept).
     * graph_launch: runs it; MS_ERR_LIMIT when the backend's scratch or tables moved since it was
     *   recorded (record again), MS_ERR_UNSUPPORTED when replays are off (the profile).
     * graph_free: releases it (NULL is a no-op). */
    void (*embed_at)(ms_backend *be, float *x, const ms_qmat *table, const int64_t *step);
    void (*qkv_at)(ms_backend *be, const ms_rope *r, float *q, int64_t qh, const float *wq, float *k, int64_t kh,
                   const float *wk, const float *v, int64_t vd, float *k_cache, float *v_cache, int64_t hd, int norm,
                   float eps, const int64_t *step);
    /* latent_at: row step[0] of an MLA latent cache [., lw] = row [lw] (the engine normalizes the latent
     *   in place first; the step takes MLA layers without rotary dims); attn_mla then reads the
     *   position from a->pos_dev. */
    void (*latent_at)(ms_backend *be, float *cache, int64_t lw, const float *row, const int64_t *step);
    int (*graph_begin)(ms_backend *be, ms_err *err);
    int (*graph_end)(ms_backend *be, void **graph, ms_err *err);
    int (*graph_launch)(ms_backend *be, void *graph, ms_err *err);
    void (*graph_free)(ms_backend *be, void *graph);
    /* optional (NULL: the caller downloads x): *out (backend memory) = the greedy pick of x [n], the
     * first index of the largest value as `if (x[v] > x[best]) best = v` from best = 0 finds it
     * (NaN never wins; a NaN x[0] gives 0) */
    void (*argmax)(ms_backend *be, const float *x, int64_t n, int32_t *out);
    /* optional (NULL: argmax, and the caller uploads the next step): argmax, then step [2] (the
     * replayable step's {position, token id}, backend memory) = {step[0] + 1, the pick}: the step of
     * the next greedy token, written where the pick is */
    void (*argmax_step)(ms_backend *be, const float *x, int64_t n, int32_t *out, int64_t *step);
    /* optional (NULL, or MS_ERR_UNSUPPORTED having done nothing: the caller runs qkv_at, then attn_gqa):
     * the replayable step's qkv_at work (q [a->H * a->hd], k, v, the caches a->k / a->v, a->hd,
     * a->vd, wq, wk, norm, eps) and then attn_gqa (a, one token, a->pos_dev the step) in one op, with
     * the same results; q and k are scratch (either may be changed or not). */
    int (*qkv_attn_at)(ms_backend *be, const ms_rope *r, float *q, const float *wq, float *k, const float *wk,
                       const float *v, int norm, float eps, const ms_attn_gqa_args *a, ms_err *err);
    /* optional (a model with cfg layernorm needs it): y = (x - mean) / sqrt(var + eps) * (w ? w : 1) + (b ? b : 0)
     * over rows of d (mean and population variance of each row, as torch's LayerNorm); y may equal x */
    void (*layernorm)(ms_backend *be, float *y, const float *x, const float *w, const float *b, int64_t rows, int64_t d,
                      float eps);
    /* optional (a model with cfg clip_qkv needs it): x[i] = min(max(x[i], lo), hi) for i < n */
    void (*clamp)(ms_backend *be, float *x, float lo, float hi, int64_t n);
} ms_backend_ops;

struct ms_backend {
    const ms_backend_ops *ops;
    const char *name; /* "cpu", "cuda", "hip" */
    int host_memory;  /* 1: backend addresses are host addresses a caller may read and write
                       * directly (the CPU backend); an op's output may then be a caller's buffer */
    void *impl;       /* the backend's own state */
};

/* MS_OK when every op a model of config c needs is present in be; otherwise
 * MS_ERR_UNSUPPORTED naming the backend and the first missing op. */
int ms_backend_require(const ms_backend *be, const ms_config *c, ms_err *err);

#endif
