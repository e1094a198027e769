/* dsa.h — DeepSeek Sparse Attention (DSA): the lightning indexer that chooses,
 * for every query, which earlier keys the (MLA) attention may look at.
 *
 * Math (transformers 5.17 DeepseekV32Indexer / GlmMoeDsaIndexer /
 * Glm5NextTextIndexer), for a query at position p with indexer heads h < H of
 * width D and keys t <= p:
 *     k_t      = rope(LayerNorm(wk x_t))                     (prepared once, cached)
 *     q_{p,h}  = rope(wq_b q_resid_p)_h
 *     w_{p,h}  = weights_proj(x_p)_h * H^-0.5
 *     score(p,t) = sum_h w_{p,h} * relu(D^-0.5 * q_{p,h} . k_t)
 * and the selection is the min(topk, p+1) highest-scoring keys t <= p (so the
 * attention is dense while the context is not longer than topk; ties below).
 *
 * RoPE: only the first R = rope_dims dims of each q head and of k rotate.
 * DeepSeek-V3.2's indexer uses the half-split (non-interleaved, rotate_half)
 * layout: pairs (i, i + R/2). GLM-MoE-DSA's indexer uses the interleaved
 * layout: pairs (2i, 2i+1), written back de-interleaved as the reference does
 * ([rotated evens, rotated odds]); both q and k get the same permutation, so
 * scores do not depend on it. Angles: pair i at position p rotates by
 * p * inv_freq[i] (cos/sin tables from the caller, see ms_dsa_rope_table).
 *
 * KPool (GLM-5-Next, kpool > 1): keys are scored per pool of kpool consecutive
 * tokens (pool m = tokens [m*kpool, (m+1)*kpool)). A complete pool's key is,
 * per channel c, sum_j softmax_j(gate_{j,c} + ape_{j,c}) * k_{j,c} over its
 * tokens j, where gate = index_kpool_compress_gate x (no RoPE in this variant).
 * A query at p may choose among complete pools whose last token is <= p; it
 * takes the min(topk / kpool, visible) best pools, expanded to their tokens,
 * plus (kpool_tail) the tokens of its own incomplete pool: the last
 * (p+1) % kpool positions up to p.
 *
 * Tie rule (deterministic): exactly torch.topk's on the CPU, which the
 * references use. The reference scores a query at p against a row of the
 * forward's full length T (keys after p masked to -inf-like values) and keeps
 * the first k of std::nth_element (k * 64 > T) or std::partial_sort
 * (k * 64 <= T) over (score, position) pairs compared by score alone; which of
 * several equal scores survive depends on that algorithm and on T. Exact ties
 * are common (relu makes many scores exactly 0), so ms_dsa_topk reproduces
 * libstdc++'s algorithms step for step, with fwd_len = T. A selection whose
 * cut falls inside a tie is flagged "ambiguous": the same query in a longer
 * forward may keep different tied keys, so an engine that must match a
 * full-recompute reference re-derives ambiguous rows when T grows.
 *
 * Output of a selection: for each query a row of `ms_dsa_row_width(cfg)`
 * int32 key positions in ascending order, followed by -1 padding, and the
 * number of valid entries. ms_dsa_mask_row turns one row into an additive
 * mask (0 where allowed, -inf elsewhere) for attention code that wants one.
 *
 * Cross-layer sharing (GLM-MoE-DSA, GLM-5-Next `indexer_types`): a "shared"
 * layer has no indexer and reuses the selection of an earlier layer for the
 * same tokens; ms_dsa_share_plan says which. */
#ifndef MS_DSA_H
#define MS_DSA_H

#include <stdint.h>

#include "ops/ops.h"
#include "util/err.h"
#include "util/threadpool.h"

typedef enum {
    MS_DSA_ROPE_HALF = 0,        /* rotate_half: pairs (i, i + R/2) */
    MS_DSA_ROPE_INTERLEAVED = 1, /* pairs (2i, 2i+1), output de-interleaved as the reference writes it */
} ms_dsa_rope_layout;

typedef struct ms_dsa_cfg {
    int n_heads;    /* H: index_n_heads, >= 1 */
    int head_dim;   /* D: index_head_dim, >= 1 */
    int rope_dims;  /* R: leading dims of q heads and k that rotate; even, <= D; 0 = none (must be 0 with kpool > 1) */
    ms_dsa_rope_layout rope_layout;
    int topk;       /* index_topk, >= 1 */
    int kpool;      /* <= 1: one key per token; > 1: KPool with pools of kpool tokens */
    int kpool_tail; /* KPool only: also select the query's own incomplete pool (index_kpool_always_select_tail) */
    float ln_eps;   /* eps of the LayerNorm on k (1e-6 in the references) */
} ms_dsa_cfg;

/* One layer's indexer weights (views in the stored dtype; small vectors F32).
 * transformers names under "...self_attn.indexer.": wq_b, wk, k_norm.{weight,bias},
 * weights_proj, and for KPool index_kpool_compress_gate / _ape. */
typedef struct ms_dsa_weights {
    ms_qmat wq_b;          /* [H*D, q_lora_rank] */
    ms_qmat wk;            /* [D, hidden] */
    float *k_norm_w;       /* [D] */
    float *k_norm_b;       /* [D] */
    ms_qmat weights_proj;  /* [H, hidden] */
    ms_qmat kpool_gate;    /* KPool: [D, hidden] */
    ms_qmat kpool_ape;     /* KPool: [kpool, D] */
} ms_dsa_weights;

/* Check a configuration: ranges above. Returns MS_OK or MS_ERR_ARG naming the field. */
int ms_dsa_cfg_check(const ms_dsa_cfg *cfg, ms_err *err);

/* Entries in one query's selection row: topk for per-token keys; for KPool
 * (topk / kpool) * kpool, plus kpool - 1 with kpool_tail. cfg must be valid. */
int ms_dsa_row_width(const ms_dsa_cfg *cfg);

/* Default RoPE inverse frequencies as transformers computes them in float32:
 * inv[i] = 1 / theta^((2i)/dim) for i < dim/2. dim even, >= 2; theta > 0. */
int ms_dsa_rope_inv_freq(float *inv, int dim, double theta, ms_err *err);

/* cos/sin tables for n consecutive positions pos0.. : cos[t*half + i] =
 * cos((pos0+t) * inv[i]) * scale (angle formed in float32, like the
 * reference), same for sin. scale is the rope "attention scaling" (1 for
 * default RoPE). cos, sin: [n, half] owned by the caller. */
void ms_dsa_rope_table(float *cos_t, float *sin_t, const float *inv, int half, int64_t pos0, int n, float scale);

/* Rotate the first rot dims (even) of n vectors of x in place, vector v at
 * x + v*stride, with angle row cos/sin + (v / per_row) * rot/2 (per_row
 * vectors share one position, e.g. the heads of one token). */
void ms_dsa_rope(float *x, int n, int64_t stride, int per_row, int rot, ms_dsa_rope_layout layout, const float *cos_t,
                 const float *sin_t);

/* Prepare n keys in place: k [n, D] = rope(LayerNorm(k; ln_w, ln_b)). ln_w, ln_b:
 * F32 [D] (either may be NULL = 1 / 0). cos/sin: [n, R/2] for the keys'
 * positions (ignored when R == 0 or kpool > 1). Errors: MS_ERR_ARG. */
int ms_dsa_prepare_keys(const ms_dsa_cfg *cfg, float *k, int n, const float *ln_w, const float *ln_b,
                        const float *cos_t, const float *sin_t, ms_err *err);

/* Prepare n queries in place: q [n, H*D], rope on the first R dims of each head
 * (nothing when R == 0 or kpool > 1). Errors: MS_ERR_ARG. */
int ms_dsa_prepare_queries(const ms_dsa_cfg *cfg, float *q, int n, const float *cos_t, const float *sin_t,
                           ms_err *err);

/* The per-layer index-key cache: prepared keys of every token so far (and
 * for KPool their gate logits and the pooled keys of complete pools). Grows
 * on append; len is the number of tokens cached (positions 0..len-1). */
typedef struct ms_dsa_cache {
    int head_dim, kpool;
    int64_t len, cap;
    float *keys;   /* [cap, D] */
    float *gates;  /* KPool: [cap, D] gate logits */
    float *pooled; /* KPool: [cap / kpool, D] keys of complete pools */
    float *ape;    /* KPool: [kpool, D] copy of index_kpool_compress_ape */
} ms_dsa_cache;

/* Make an empty cache for cfg. ape: F32 [kpool, D] (KPool only; copied; NULL = zeros).
 * cap_hint: initial capacity in tokens (>= 0). Free with ms_dsa_cache_free.
 * Errors: MS_ERR_ARG, MS_ERR_NOMEM. */
int ms_dsa_cache_init(ms_dsa_cache *c, const ms_dsa_cfg *cfg, const float *ape, int64_t cap_hint, ms_err *err);
void ms_dsa_cache_free(ms_dsa_cache *c);

/* Append n prepared keys k [n, D] (and for KPool their gate logits gates [n, D])
 * at positions len..len+n-1; pools completed by them get their pooled key.
 * Errors: MS_ERR_ARG (gates missing for KPool), MS_ERR_NOMEM. */
int ms_dsa_cache_append(ms_dsa_cache *c, const float *k, const float *gates, int n, ms_err *err);

/* Forget everything from position len on (len <= c->len); for rollback. */
int ms_dsa_cache_truncate(ms_dsa_cache *c, int64_t len, ms_err *err);

/* One (score, position) entry of the top-k queue. */
typedef struct ms_dsa_qel {
    float v;
    int32_t i;
} ms_dsa_qel;

/* torch.topk (CPU, largest) emulation on one score row: scores[0..n_valid) are
 * real candidates, positions n_valid..n_total-1 are masked (-inf). Keeps
 * min(k, n_total) entries exactly as torch does and writes the valid ones to
 * out (ascending); returns their number. work: n_total entries of scratch;
 * out: room for min(k, n_valid). ambiguous (may be NULL) out: 1 when the cut
 * falls inside a run of equal valid scores (see the tie rule above). */
int64_t ms_dsa_topk(const float *scores, int64_t n_valid, int64_t n_total, int64_t k, ms_dsa_qel *work, int32_t *out,
                    uint8_t *ambiguous);

/* Select the keys of n queries at positions pos0..pos0+n-1 against the cache,
 * which must hold at least pos0 + n tokens (the queries' own keys appended).
 * q: [n, H*D] prepared queries; w: [n, H] raw weights_proj outputs (the H^-0.5
 * and D^-0.5 factors are applied here). fwd_len: the length T of the forward
 * whose torch.topk tie choices to reproduce (0 = pos0 + n, a forward ending at
 * the last query; must be >= pos0 + n). idx: [n, ms_dsa_row_width(cfg)] out,
 * ascending positions then -1; count: [n] out, valid entries per row (>= 1
 * except for KPool without tail when no pool is visible: then 0, a row the
 * reference itself leaves unmasked); ambiguous: [n] out or NULL (see above).
 * Work is split across pool (may be NULL).
 * Errors: MS_ERR_ARG (shapes, positions), MS_ERR_NOMEM. */
int ms_dsa_select(ms_pool *pool, const ms_dsa_cfg *cfg, const ms_dsa_cache *c, const float *q, const float *w, int n,
                  int64_t pos0, int64_t fwd_len, int32_t *idx, int32_t *count, uint8_t *ambiguous, ms_err *err);
/* The argument checks of ms_dsa_select (shared with device implementations of the
 * same selection): MS_OK, with *fwd_len 0 replaced by pos0 + n; n == 0 is valid. */
int ms_dsa_select_check(const ms_dsa_cfg *cfg, const ms_dsa_cache *c, const float *q, const float *w, int n,
                        int64_t pos0, int64_t *fwd_len, const int32_t *idx, const int32_t *count, ms_err *err);
/* Candidates a query at position p chooses among (tokens, or complete KPool pools), and
 * the entries of the reference's score row in a forward of fwd_len tokens. */
static inline int64_t ms_dsa_candidates(const ms_dsa_cfg *cfg, int64_t p) {
    return cfg->kpool > 1 ? (p + 1) / cfg->kpool : p + 1;
}
static inline int64_t ms_dsa_queue_len(const ms_dsa_cfg *cfg, int64_t fwd_len) {
    return cfg->kpool > 1 ? fwd_len / cfg->kpool : fwd_len;
}

/* The index scores one query gives the cache's candidates, for inspection and
 * tests: per-token keys: scores[t] for t <= p (p+1 values); KPool: one score per
 * complete pool whose last token is <= p (floor((p+1)/kpool) values). Returns
 * the number written (>= 0) or a negative status. q [H*D], w [H] as above. */
int64_t ms_dsa_scores(const ms_dsa_cfg *cfg, const ms_dsa_cache *c, const float *q, const float *w, int64_t p,
                      float *scores, int64_t cap, ms_err *err);

/* Turn one selection row into an additive attention-mask row: row[kv_len] =
 * -INFINITY everywhere, 0 at idx[0..count). Every idx must be in [0, kv_len).
 * Errors: MS_ERR_ARG. */
int ms_dsa_mask_row(const int32_t *idx, int count, int64_t kv_len, float *row, ms_err *err);

/* Which layers' indexers serve which layers. kinds[l]: 0 = no DSA attention
 * (e.g. a linear-attention layer), 1 = DSA with its own indexer ("full"),
 * 2 = DSA reusing an earlier selection ("shared"). chain: 1 = a shared layer
 * passes the selection it reused on to the next layer (GLM-MoE-DSA: the
 * selection of the nearest full layer above, through any shared ones);
 * 0 = only a full layer passes its own selection, to the very next layer
 * (GLM-5-Next). src[l] out: l for full, the source layer for shared, -1 for 0.
 * Errors: MS_ERR_UNSUPPORTED naming the shared layer with no source (the
 * reference raises there), MS_ERR_ARG for a bad kind. */
int ms_dsa_share_plan(const int *kinds, int n_layers, int chain, int *src, ms_err *err);

#endif
