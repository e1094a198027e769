/* dsa.c — DeepSeek Sparse Attention lightning indexer (see dsa.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/dsa.h"
#include "ops/ops.h"

int ms_dsa_cfg_check(const ms_dsa_cfg *cfg, ms_err *err) {
    if (!cfg) return ms_fail(err, MS_ERR_ARG, "dsa: no configuration");
    if (cfg->n_heads < 1 || cfg->n_heads > 4096)
        return ms_fail(err, MS_ERR_ARG, "dsa: index_n_heads %d out of range [1, 4096]", cfg->n_heads);
    if (cfg->head_dim < 1 || cfg->head_dim > 65536)
        return ms_fail(err, MS_ERR_ARG, "dsa: index_head_dim %d out of range [1, 65536]", cfg->head_dim);
    if (cfg->rope_dims < 0 || cfg->rope_dims > cfg->head_dim || cfg->rope_dims % 2)
        return ms_fail(err, MS_ERR_ARG, "dsa: rope dims %d must be even and within [0, index_head_dim %d]",
                       cfg->rope_dims, cfg->head_dim);
    if (cfg->rope_layout != MS_DSA_ROPE_HALF && cfg->rope_layout != MS_DSA_ROPE_INTERLEAVED)
        return ms_fail(err, MS_ERR_ARG, "dsa: unknown rope layout %d", (int)cfg->rope_layout);
    if (cfg->topk < 1 || cfg->topk > (1 << 24))
        return ms_fail(err, MS_ERR_ARG, "dsa: index_topk %d out of range [1, 2^24]", cfg->topk);
    if (cfg->kpool > 1) {
        if (cfg->kpool > 4096) return ms_fail(err, MS_ERR_ARG, "dsa: index_kpool %d out of range [2, 4096]", cfg->kpool);
        if (cfg->rope_dims != 0)
            return ms_fail(err, MS_ERR_ARG, "dsa: the KPool indexer applies no RoPE, but rope dims is %d",
                           cfg->rope_dims);
    }
    if (!(cfg->ln_eps >= 0.0f) || !isfinite(cfg->ln_eps))
        return ms_fail(err, MS_ERR_ARG, "dsa: LayerNorm eps %g must be finite and >= 0", (double)cfg->ln_eps);
    return MS_OK;
}

int ms_dsa_row_width(const ms_dsa_cfg *cfg) {
    if (cfg->kpool > 1) return (cfg->topk / cfg->kpool) * cfg->kpool + (cfg->kpool_tail ? cfg->kpool - 1 : 0);
    return cfg->topk;
}

int ms_dsa_rope_inv_freq(float *inv, int dim, double theta, ms_err *err) {
    if (dim < 2 || dim % 2) return ms_fail(err, MS_ERR_ARG, "rope: dim %d must be even and >= 2", dim);
    if (!(theta > 0) || !isfinite(theta)) return ms_fail(err, MS_ERR_ARG, "rope: theta %g must be > 0", theta);
    float base = (float)theta;
    for (int i = 0; i < dim / 2; i++) {
        float e = (float)(2 * i) / (float)dim;
        inv[i] = 1.0f / powf(base, e);
    }
    return MS_OK;
}

void ms_dsa_rope_table(float *cos_t, float *sin_t, const float *inv, int half, int64_t pos0, int n, float scale) {
    for (int t = 0; t < n; t++) {
        float p = (float)(pos0 + t);
        for (int i = 0; i < half; i++) {
            float a = p * inv[i];
            cos_t[(int64_t)t * half + i] = cosf(a) * scale;
            sin_t[(int64_t)t * half + i] = sinf(a) * scale;
        }
    }
}

void ms_dsa_rope(float *x, int n, int64_t stride, int per_row, int rot, ms_dsa_rope_layout layout, const float *cos_t,
                 const float *sin_t) {
    int half = rot / 2;
    if (half <= 0) return;
    float tmp[2 * half];
    for (int v = 0; v < n; v++) {
        float *xv = x + (int64_t)v * stride;
        const float *c = cos_t + (int64_t)(v / per_row) * half, *s = sin_t + (int64_t)(v / per_row) * half;
        for (int i = 0; i < half; i++) {
            float x1, x2;
            if (layout == MS_DSA_ROPE_INTERLEAVED) {
                x1 = xv[2 * i];
                x2 = xv[2 * i + 1];
            } else {
                x1 = xv[i];
                x2 = xv[half + i];
            }
            tmp[i] = x1 * c[i] - x2 * s[i];
            tmp[half + i] = x2 * c[i] + x1 * s[i];
        }
        memcpy(xv, tmp, sizeof(float) * (size_t)rot);
    }
}

int ms_dsa_prepare_keys(const ms_dsa_cfg *cfg, float *k, int n, const float *ln_w, const float *ln_b,
                        const float *cos_t, const float *sin_t, ms_err *err) {
    int rc = ms_dsa_cfg_check(cfg, err);
    if (rc) return rc;
    if (n < 0 || (n > 0 && !k)) return ms_fail(err, MS_ERR_ARG, "dsa keys: bad count %d or no buffer", n);
    int D = cfg->head_dim;
    ms_layernorm(k, k, ln_w, ln_b, n, D, cfg->ln_eps);
    if (cfg->rope_dims > 0 && cfg->kpool <= 1) {
        if (!cos_t || !sin_t) return ms_fail(err, MS_ERR_ARG, "dsa keys: rope dims %d but no cos/sin table", cfg->rope_dims);
        ms_dsa_rope(k, n, D, 1, cfg->rope_dims, cfg->rope_layout, cos_t, sin_t);
    }
    return MS_OK;
}

int ms_dsa_prepare_queries(const ms_dsa_cfg *cfg, float *q, int n, const float *cos_t, const float *sin_t,
                           ms_err *err) {
    int rc = ms_dsa_cfg_check(cfg, err);
    if (rc) return rc;
    if (n < 0 || (n > 0 && !q)) return ms_fail(err, MS_ERR_ARG, "dsa queries: bad count %d or no buffer", n);
    if (cfg->rope_dims > 0 && cfg->kpool <= 1) {
        if (!cos_t || !sin_t)
            return ms_fail(err, MS_ERR_ARG, "dsa queries: rope dims %d but no cos/sin table", cfg->rope_dims);
        ms_dsa_rope(q, n * cfg->n_heads, cfg->head_dim, cfg->n_heads, cfg->rope_dims, cfg->rope_layout, cos_t, sin_t);
    }
    return MS_OK;
}

/* ---- cache ---- */

int ms_dsa_cache_init(ms_dsa_cache *c, const ms_dsa_cfg *cfg, const float *ape, int64_t cap_hint, ms_err *err) {
    memset(c, 0, sizeof *c);
    int rc = ms_dsa_cfg_check(cfg, err);
    if (rc) return rc;
    if (cap_hint < 0 || cap_hint > ((int64_t)1 << 31))
        return ms_fail(err, MS_ERR_ARG, "dsa cache: capacity hint %lld out of range", (long long)cap_hint);
    c->head_dim = cfg->head_dim;
    c->kpool = cfg->kpool > 1 ? cfg->kpool : 1;
    if (c->kpool > 1) {
        c->ape = calloc((size_t)c->kpool * c->head_dim, sizeof(float));
        if (!c->ape) return ms_fail(err, MS_ERR_NOMEM, "dsa cache: no memory for ape");
        if (ape) memcpy(c->ape, ape, sizeof(float) * (size_t)c->kpool * c->head_dim);
    }
    if (cap_hint > 0) {
        /* grow once via a zero-length append path */
        int64_t cap = cap_hint;
        c->keys = malloc(sizeof(float) * (size_t)cap * c->head_dim);
        if (c->kpool > 1) {
            c->gates = malloc(sizeof(float) * (size_t)cap * c->head_dim);
            c->pooled = malloc(sizeof(float) * (size_t)(cap / c->kpool + 1) * c->head_dim);
        }
        if (!c->keys || (c->kpool > 1 && (!c->gates || !c->pooled))) {
            ms_dsa_cache_free(c);
            return ms_fail(err, MS_ERR_NOMEM, "dsa cache: no memory for %lld tokens", (long long)cap);
        }
        c->cap = cap;
    }
    return MS_OK;
}

void ms_dsa_cache_free(ms_dsa_cache *c) {
    if (!c) return;
    free(c->keys);
    free(c->gates);
    free(c->pooled);
    free(c->ape);
    memset(c, 0, sizeof *c);
}

static int cache_reserve(ms_dsa_cache *c, int64_t need, ms_err *err) {
    if (need <= c->cap) return MS_OK;
    int64_t cap = c->cap > 0 ? c->cap : 64;
    while (cap < need) cap *= 2;
    size_t D = (size_t)c->head_dim;
    float *k = realloc(c->keys, sizeof(float) * (size_t)cap * D);
    if (!k) return ms_fail(err, MS_ERR_NOMEM, "dsa cache: no memory for %lld tokens", (long long)cap);
    c->keys = k;
    if (c->kpool > 1) {
        float *g = realloc(c->gates, sizeof(float) * (size_t)cap * D);
        if (!g) return ms_fail(err, MS_ERR_NOMEM, "dsa cache: no memory for %lld gate rows", (long long)cap);
        c->gates = g;
        float *p = realloc(c->pooled, sizeof(float) * (size_t)(cap / c->kpool + 1) * D);
        if (!p) return ms_fail(err, MS_ERR_NOMEM, "dsa cache: no memory for %lld pools", (long long)(cap / c->kpool));
        c->pooled = p;
    }
    c->cap = cap;
    return MS_OK;
}

/* pooled[m][ch] = sum_j softmax_j(gate[j][ch] + ape[j][ch]) * key[j][ch] over the pool's tokens */
static void pool_key(ms_dsa_cache *c, int64_t m) {
    int D = c->head_dim, P = c->kpool;
    const float *k = c->keys + (size_t)m * P * D, *g = c->gates + (size_t)m * P * D;
    float *out = c->pooled + (size_t)m * D;
    for (int ch = 0; ch < D; ch++) {
        float mx = -INFINITY;
        for (int j = 0; j < P; j++) {
            float l = g[(size_t)j * D + ch] + c->ape[(size_t)j * D + ch];
            if (l > mx) mx = l;
        }
        double s = 0, acc = 0;
        for (int j = 0; j < P; j++) {
            double e = exp((double)(g[(size_t)j * D + ch] + c->ape[(size_t)j * D + ch]) - mx);
            s += e;
            acc += e * k[(size_t)j * D + ch];
        }
        out[ch] = (float)(acc / s);
    }
}

int ms_dsa_cache_append(ms_dsa_cache *c, const float *k, const float *gates, int n, ms_err *err) {
    if (!c || c->head_dim <= 0) return ms_fail(err, MS_ERR_ARG, "dsa cache: not initialized");
    if (n < 0 || (n > 0 && !k)) return ms_fail(err, MS_ERR_ARG, "dsa cache: bad append count %d or no keys", n);
    if (c->kpool > 1 && n > 0 && !gates)
        return ms_fail(err, MS_ERR_ARG, "dsa cache: the KPool indexer needs gate logits for appended keys");
    if (n == 0) return MS_OK;
    int rc = cache_reserve(c, c->len + n, err);
    if (rc) return rc;
    size_t D = (size_t)c->head_dim;
    memcpy(c->keys + (size_t)c->len * D, k, sizeof(float) * (size_t)n * D);
    if (c->kpool > 1) memcpy(c->gates + (size_t)c->len * D, gates, sizeof(float) * (size_t)n * D);
    int64_t old = c->len;
    c->len += n;
    if (c->kpool > 1)
        for (int64_t m = old / c->kpool; m < c->len / c->kpool; m++) pool_key(c, m);
    return MS_OK;
}

int ms_dsa_cache_truncate(ms_dsa_cache *c, int64_t len, ms_err *err) {
    if (!c || len < 0 || len > c->len)
        return ms_fail(err, MS_ERR_ARG, "dsa cache: cannot truncate to %lld (holds %lld)", (long long)len,
                       c ? (long long)c->len : 0LL);
    c->len = len; /* complete pools below len keep their pooled keys; later ones are recomputed on append */
    return MS_OK;
}

/* ---- scoring and selection ---- */

/* score of one query against nk keys (rows of D): sum_h w'_h relu(scale * q_h . k) */
static void score_keys(const float *q, const float *wq, int H, int D, float scale, const float *keys, int64_t nk,
                       float *out) {
    for (int64_t t = 0; t < nk; t++) {
        const float *kt = keys + (size_t)t * D;
        float s = 0.0f;
        for (int h = 0; h < H; h++) {
            const float *qh = q + (size_t)h * D;
            float d = 0.0f;
            for (int i = 0; i < D; i++) d += qh[i] * kt[i];
            d *= scale;
            if (d > 0.0f) s += wq[h] * d;
        }
        out[t] = s;
    }
}

/* ---- torch.topk (CPU) emulation ----
 * torch's CPU kernel fills a queue of (value, index) pairs and calls
 * std::partial_sort (when k * 64 <= n) or std::nth_element with the
 * comparator "x before y iff (isnan(x) && !isnan(y)) || x > y"; the first k
 * queue entries are the result. Which of several equal values survive is
 * decided by libstdc++'s introselect / heap-select, reproduced here step for
 * step (checked against torch's own choices in tests/data/topk_ties). */

static inline int tk_before(ms_dsa_qel a, ms_dsa_qel b) { return (isnan(a.v) && !isnan(b.v)) || a.v > b.v; }
static inline void tk_swap(ms_dsa_qel *a, int64_t x, int64_t y) {
    ms_dsa_qel t = a[x];
    a[x] = a[y];
    a[y] = t;
}

static void tk_insertion_sort(ms_dsa_qel *a, int64_t first, int64_t last) {
    if (first == last) return;
    for (int64_t i = first + 1; i < last; i++) {
        ms_dsa_qel val = a[i];
        if (tk_before(val, a[first])) {
            memmove(a + first + 1, a + first, sizeof *a * (size_t)(i - first));
            a[first] = val;
        } else {
            int64_t hole = i, next = i - 1;
            while (tk_before(val, a[next])) {
                a[hole] = a[next];
                hole = next--;
            }
            a[hole] = val;
        }
    }
}

static void tk_median_to_first(ms_dsa_qel *a, int64_t result, int64_t x, int64_t y, int64_t z) {
    if (tk_before(a[x], a[y])) {
        if (tk_before(a[y], a[z])) tk_swap(a, result, y);
        else if (tk_before(a[x], a[z])) tk_swap(a, result, z);
        else tk_swap(a, result, x);
    } else if (tk_before(a[x], a[z])) tk_swap(a, result, x);
    else if (tk_before(a[y], a[z])) tk_swap(a, result, z);
    else tk_swap(a, result, y);
}

static int64_t tk_partition_pivot(ms_dsa_qel *a, int64_t first, int64_t last) {
    int64_t mid = first + (last - first) / 2;
    tk_median_to_first(a, first, first + 1, mid, last - 1);
    ms_dsa_qel piv = a[first];
    int64_t lo = first + 1, hi = last;
    for (;;) {
        while (tk_before(a[lo], piv)) ++lo;
        --hi;
        while (tk_before(piv, a[hi])) --hi;
        if (!(lo < hi)) return lo;
        tk_swap(a, lo, hi);
        ++lo;
    }
}

static void tk_push_heap(ms_dsa_qel *a, int64_t hole, int64_t top, ms_dsa_qel val) {
    int64_t parent = (hole - 1) / 2;
    while (hole > top && tk_before(a[parent], val)) {
        a[hole] = a[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    a[hole] = val;
}

static void tk_adjust_heap(ms_dsa_qel *a, int64_t hole, int64_t len, ms_dsa_qel val) {
    int64_t top = hole, second = hole;
    while (second < (len - 1) / 2) {
        second = 2 * (second + 1);
        if (tk_before(a[second], a[second - 1])) second--;
        a[hole] = a[second];
        hole = second;
    }
    if ((len & 1) == 0 && second == (len - 2) / 2) {
        second = 2 * (second + 1);
        a[hole] = a[second - 1];
        hole = second - 1;
    }
    tk_push_heap(a, hole, top, val);
}

/* std::__heap_select(a, a + middle, a + last) */
static void tk_heap_select(ms_dsa_qel *a, int64_t middle, int64_t last) {
    if (middle >= 2)
        for (int64_t parent = (middle - 2) / 2;; parent--) {
            tk_adjust_heap(a, parent, middle, a[parent]);
            if (parent == 0) break;
        }
    for (int64_t i = middle; i < last; i++)
        if (tk_before(a[i], a[0])) {
            ms_dsa_qel v = a[i];
            a[i] = a[0];
            tk_adjust_heap(a, 0, middle, v);
        }
}

static void tk_nth_element(ms_dsa_qel *a, int64_t nth, int64_t n) {
    if (n == 0 || nth == n) return;
    int depth = 2 * (63 - __builtin_clzll((unsigned long long)n));
    int64_t first = 0, last = n;
    while (last - first > 3) {
        if (depth == 0) {
            tk_heap_select(a + first, nth + 1 - first, last - first);
            tk_swap(a, first, nth);
            return;
        }
        --depth;
        int64_t cut = tk_partition_pivot(a, first, last);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    tk_insertion_sort(a, first, last);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int64_t ms_dsa_topk(const float *scores, int64_t n_valid, int64_t n_total, int64_t k, ms_dsa_qel *work, int32_t *out,
                    uint8_t *ambiguous) {
    if (ambiguous) *ambiguous = 0;
    if (k > n_total) k = n_total;
    if (k <= 0 || n_valid <= 0) return 0;
    for (int64_t t = 0; t < n_valid; t++) work[t] = (ms_dsa_qel){scores[t], (int32_t)t};
    for (int64_t t = n_valid; t < n_total; t++) work[t] = (ms_dsa_qel){-INFINITY, (int32_t)t};
    if (k * 64 <= n_total) tk_heap_select(work, k, n_total); /* std::partial_sort's selection */
    else tk_nth_element(work, k - 1, n_total);
    int64_t n = 0;
    float worst = INFINITY;
    for (int64_t i = 0; i < k; i++)
        if (work[i].i < n_valid) {
            out[n++] = work[i].i;
            if (work[i].v < worst) worst = work[i].v;
        }
    if (ambiguous && n == k && n_valid > k)
        for (int64_t i = k; i < n_total; i++)
            if (work[i].i < n_valid && work[i].v == worst) {
                *ambiguous = 1;
                break;
            }
    qsort(out, (size_t)n, sizeof(int32_t), cmp_i32);
    return n;
}

typedef struct {
    const ms_dsa_cfg *cfg;
    const ms_dsa_cache *c;
    const float *q, *w;
    int64_t pos0, fwd_len;
    int q0, qn;         /* query block */
    int64_t ld;         /* row length of the score block */
    float *sc;          /* [qn, ld] */
    float *dots;        /* [qn * H, nk] q_h . k_t of the block (one matmul) */
    int64_t nk;         /* keys in the block's matmul: candidates of its last query */
    int64_t chunk;      /* keys per scoring task */
    int nchunk;
    int32_t *idx, *count;
    uint8_t *ambiguous;
    int width;
    int64_t qlen;       /* queue entries per thread */
    ms_dsa_qel *queue;  /* [threads, qlen] */
    int32_t *sel;       /* [threads, qlen] */
} sel_ctx;

/* candidates a query at p may choose from: keys 0..p, or complete pools ending at or before p */

static void weights_scaled(const ms_dsa_cfg *cfg, const float *w, float *out) {
    float hs = 1.0f / sqrtf((float)cfg->n_heads);
    for (int h = 0; h < cfg->n_heads; h++) out[h] = w[h] * hs;
}

/* scores of one query over a chunk of candidates from the block's dot products */
static void score_task(void *vctx, int task, int tid) {
    sel_ctx *x = vctx;
    int qi = task / x->nchunk, ch = task % x->nchunk;
    int64_t p = x->pos0 + x->q0 + qi;
    int64_t nc = ms_dsa_candidates(x->cfg, p);
    int64_t t0 = (int64_t)ch * x->chunk, t1 = t0 + x->chunk;
    if (t1 > nc) t1 = nc;
    if (t0 >= t1) return;
    const ms_dsa_cfg *cfg = x->cfg;
    int H = cfg->n_heads;
    float wq[H], scale = 1.0f / sqrtf((float)cfg->head_dim);
    weights_scaled(cfg, x->w + (size_t)(x->q0 + qi) * H, wq);
    float *out = x->sc + (size_t)qi * x->ld;
    for (int64_t t = t0; t < t1; t++) out[t] = 0.0f;
    for (int h = 0; h < H; h++) {
        const float *d = x->dots + ((size_t)qi * H + h) * x->nk;
        float wh = wq[h];
        for (int64_t t = t0; t < t1; t++) {
            float v = d[t] * scale;
            out[t] += v > 0.0f ? wh * v : 0.0f;
        }
    }
}

static void pick_task(void *vctx, int qi, int tid) {
    sel_ctx *x = vctx;
    const ms_dsa_cfg *cfg = x->cfg;
    int64_t p = x->pos0 + x->q0 + qi;
    int64_t nc = ms_dsa_candidates(cfg, p), nq = ms_dsa_queue_len(cfg, x->fwd_len);
    int32_t *sel = x->sel + (size_t)tid * x->qlen;
    int32_t *row = x->idx + (size_t)(x->q0 + qi) * x->width;
    int64_t want = cfg->kpool > 1 ? cfg->topk / cfg->kpool : cfg->topk;
    uint8_t amb = 0;
    int64_t k = ms_dsa_topk(x->sc + (size_t)qi * x->ld, nc, nq, want, x->queue + (size_t)tid * x->qlen, sel, &amb);
    int n = 0;
    if (cfg->kpool > 1) {
        for (int64_t i = 0; i < k; i++)
            for (int j = 0; j < cfg->kpool; j++) row[n++] = sel[i] * cfg->kpool + j;
        if (cfg->kpool_tail) {
            int64_t tail = (p + 1) % cfg->kpool;
            for (int64_t t = p + 1 - tail; t <= p; t++) row[n++] = (int32_t)t;
        }
    } else {
        for (int64_t i = 0; i < k; i++) row[n++] = sel[i];
    }
    x->count[x->q0 + qi] = n;
    if (x->ambiguous) x->ambiguous[x->q0 + qi] = amb;
    for (int i = n; i < x->width; i++) row[i] = -1;
}

int ms_dsa_select_check(const ms_dsa_cfg *cfg, const ms_dsa_cache *c, const float *q, const float *w, int n,
                        int64_t pos0, int64_t *fwd_len_io, const int32_t *idx, const int32_t *count, ms_err *err) {
    int64_t fwd_len = *fwd_len_io;
    if (!c || c->head_dim != cfg->head_dim || c->kpool != (cfg->kpool > 1 ? cfg->kpool : 1))
        return ms_fail(err, MS_ERR_ARG, "dsa select: the cache was made for another configuration");
    if (n < 0 || pos0 < 0) return ms_fail(err, MS_ERR_ARG, "dsa select: bad query count %d or position %lld", n,
                                          (long long)pos0);
    if (n == 0) return MS_OK;
    if (!q || !w || !idx || !count) return ms_fail(err, MS_ERR_ARG, "dsa select: missing buffer");
    if (pos0 + n > c->len)
        return ms_fail(err, MS_ERR_ARG, "dsa select: queries up to position %lld but the cache holds %lld keys",
                       (long long)(pos0 + n - 1), (long long)c->len);
    if (fwd_len == 0) fwd_len = pos0 + n;
    if (fwd_len < pos0 + n)
        return ms_fail(err, MS_ERR_ARG, "dsa select: forward length %lld shorter than the queries' end %lld",
                       (long long)fwd_len, (long long)(pos0 + n));
    if (fwd_len > ((int64_t)1 << 31) - 1) return ms_fail(err, MS_ERR_LIMIT, "dsa select: positions beyond int32");
    *fwd_len_io = fwd_len;
    return MS_OK;
}

int ms_dsa_select(ms_pool *pool, const ms_dsa_cfg *cfg, const ms_dsa_cache *c, const float *q, const float *w, int n,
                  int64_t pos0, int64_t fwd_len, int32_t *idx, int32_t *count, uint8_t *ambiguous, ms_err *err) {
    int rc = ms_dsa_cfg_check(cfg, err);
    if (rc || (rc = ms_dsa_select_check(cfg, c, q, w, n, pos0, &fwd_len, idx, count, err))) return rc;
    if (n == 0) return MS_OK;
    int threads = pool ? ms_pool_size(pool) : 1;
    if (threads < 1) threads = 1;
    int64_t ld = ms_dsa_candidates(cfg, pos0 + n - 1);
    if (ld < 1) ld = 1;
    /* queries per block: bound the dot-product block [qb * H, ld] to ~4M floats */
    int64_t qb = ((int64_t)1 << 22) / (ld * cfg->n_heads);
    if (qb < 1) qb = 1;
    if (qb > n) qb = n;
    sel_ctx x = {.cfg = cfg, .c = c, .q = q, .w = w, .pos0 = pos0, .fwd_len = fwd_len, .ld = ld, .idx = idx,
                 .count = count, .ambiguous = ambiguous, .width = ms_dsa_row_width(cfg)};
    x.qlen = ms_dsa_queue_len(cfg, fwd_len);
    if (x.qlen < 1) x.qlen = 1;
    x.sc = malloc(sizeof(float) * (size_t)qb * ld);
    x.dots = malloc(sizeof(float) * (size_t)qb * cfg->n_heads * ld);
    x.queue = malloc(sizeof(ms_dsa_qel) * (size_t)threads * x.qlen);
    x.sel = malloc(sizeof(int32_t) * (size_t)threads * x.qlen);
    if (!x.sc || !x.dots || !x.queue || !x.sel) {
        free(x.sc);
        free(x.dots);
        free(x.queue);
        free(x.sel);
        return ms_fail(err, MS_ERR_NOMEM, "dsa select: no memory for %lld x %lld scores", (long long)qb, (long long)ld);
    }
    /* key chunks: enough tasks to occupy the pool even for a single query */
    int64_t per = (ld + 4LL * threads - 1) / (4LL * threads);
    x.chunk = per < 256 ? 256 : per;
    x.nchunk = (int)((ld + x.chunk - 1) / x.chunk);
    for (int q0 = 0; q0 < n; q0 += (int)qb) {
        x.q0 = q0;
        x.qn = (int)(n - q0 < qb ? n - q0 : qb);
        /* q_h . k_t for every head of the block's queries and every candidate of its last query:
         * one matmul over the cached keys viewed as an F32 weight [nk, D] */
        x.nk = ms_dsa_candidates(cfg, pos0 + q0 + x.qn - 1);
        if (x.nk > 0) {
            ms_qmat kv = {.dtype = MS_DT_F32, .rows = x.nk, .cols = cfg->head_dim,
                          .data = cfg->kpool > 1 ? c->pooled : c->keys};
            ms_matmul(pool, x.dots, q + (size_t)q0 * cfg->n_heads * cfg->head_dim, x.qn * cfg->n_heads, &kv);
        }
        ms_pool_run(pool, x.qn * x.nchunk, score_task, &x);
        ms_pool_run(pool, x.qn, pick_task, &x);
    }
    free(x.sc);
    free(x.dots);
    free(x.queue);
    free(x.sel);
    return MS_OK;
}

int64_t ms_dsa_scores(const ms_dsa_cfg *cfg, const ms_dsa_cache *c, const float *q, const float *w, int64_t p,
                      float *scores, int64_t cap, ms_err *err) {
    int rc = ms_dsa_cfg_check(cfg, err);
    if (rc) return rc;
    if (!c || c->head_dim != cfg->head_dim || p < 0 || p >= c->len || !q || !w || !scores)
        return ms_fail(err, MS_ERR_ARG, "dsa scores: bad arguments (position %lld, cache %lld keys)", (long long)p,
                       c ? (long long)c->len : 0LL);
    int64_t nc = ms_dsa_candidates(cfg, p);
    if (nc > cap) return ms_fail(err, MS_ERR_ARG, "dsa scores: %lld scores do not fit in %lld", (long long)nc,
                                 (long long)cap);
    int H = cfg->n_heads, D = cfg->head_dim;
    float wq[H];
    weights_scaled(cfg, w, wq);
    score_keys(q, wq, H, D, 1.0f / sqrtf((float)D), cfg->kpool > 1 ? c->pooled : c->keys, nc, scores);
    return nc;
}

int ms_dsa_mask_row(const int32_t *idx, int count, int64_t kv_len, float *row, ms_err *err) {
    if (count < 0 || kv_len < 0 || (count > 0 && !idx) || (kv_len > 0 && !row))
        return ms_fail(err, MS_ERR_ARG, "dsa mask: bad count %d or length %lld", count, (long long)kv_len);
    for (int64_t t = 0; t < kv_len; t++) row[t] = -INFINITY;
    for (int i = 0; i < count; i++) {
        if (idx[i] < 0 || idx[i] >= kv_len)
            return ms_fail(err, MS_ERR_ARG, "dsa mask: selected position %d outside [0, %lld)", idx[i],
                           (long long)kv_len);
        row[idx[i]] = 0.0f;
    }
    return MS_OK;
}

int ms_dsa_share_plan(const int *kinds, int n_layers, int chain, int *src, ms_err *err) {
    if (n_layers < 0 || (n_layers > 0 && (!kinds || !src)))
        return ms_fail(err, MS_ERR_ARG, "dsa share plan: bad layer count %d", n_layers);
    for (int l = 0; l < n_layers; l++) {
        switch (kinds[l]) {
        case 0: src[l] = -1; break;
        case 1: src[l] = l; break;
        case 2:
            if (l == 0 || kinds[l - 1] == 0 || (kinds[l - 1] == 2 && !chain))
                return ms_fail(err, MS_ERR_UNSUPPORTED,
                               "layer %d: a shared DSA layer needs the previous layer to pass on a selection, "
                               "but layer %d %s", l, l - 1,
                               l == 0 ? "does not exist" : kinds[l - 1] == 0 ? "has no DSA indexer" :
                               "is itself shared and does not pass its selection on");
            src[l] = src[l - 1];
            break;
        default: return ms_fail(err, MS_ERR_ARG, "layer %d: unknown DSA layer kind %d", l, kinds[l]);
        }
    }
    return MS_OK;
}
