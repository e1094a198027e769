/* dsa_layer.c — DeepSeek Sparse Attention in the engine: the per-layer
 * index-key caches (decode state kept next to the MLA latent cache, in backend
 * memory), and the selection each MLA layer with an indexer attends to
 * (ops/dsa.h): the projections are backend matmuls, the indexer itself the
 * backend's dsa_index op; the selection and the recorded tied rows are host
 * arrays. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "ops/dsa.h"

/* Rows whose selection fell inside a tie (see ops/dsa.h): their query, weights
 * and selection, to check whether a longer forward would choose differently. */
typedef struct {
    int64_t n, cap;
    int64_t *pos;
    float *q, *w;   /* [cap, H*D], [cap, H] */
    int32_t *sel;   /* [cap, width] */
    int32_t *cnt;   /* [cap] */
} amb_list;

typedef struct ms_dsa_state {
    ms_dsa_cfg cfg;
    amb_list *amb_rows;   /* [n_layers] */
    int32_t *tokens;      /* [max_ctx] the sequence so far, for replays */
    int replay_ok;        /* every layer's state can be rolled back to any position (no recurrent layers) */
    ms_dsa_cache *cache;  /* [n_layers]: set up for layers with their own indexer; arrays [be] */
    int width;            /* entries of a selection row */
    int32_t *idx, *cnt;   /* [max_batch, width], [max_batch]: the current chunk's selection */
    uint8_t *amb;         /* [max_batch] */
    float *q, *w, *k, *g; /* [be] indexer scratch [B, H*D], [B, H], [B, D], [B, D] */
} ms_dsa_state;

static int any_dsa(const ms_config *c) {
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_dsa[l]) return 1;
    return 0;
}

int ms_dsa_engine_init(ms_engine *e, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    if (!any_dsa(c)) return MS_OK;
    ms_dsa_state *s = calloc(1, sizeof *s);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "out of memory for the DSA state");
    e->dsa = s;
    ms_dsa_cfg_of(c, &s->cfg);
    int rc = ms_dsa_cfg_check(&s->cfg, err);
    if (rc) return rc;
    s->width = ms_dsa_row_width(&s->cfg);
    s->cache = calloc((size_t)c->n_layers, sizeof *s->cache);
    s->amb_rows = calloc((size_t)c->n_layers, sizeof *s->amb_rows);
    if (!s->cache || !s->amb_rows) return ms_fail(err, MS_ERR_NOMEM, "out of memory for the DSA state");
    s->replay_ok = 1;
    for (int l = 0; l < c->n_layers; l++) s->replay_ok &= c->layer_attn[l] == MS_ATTN_MLA || c->layer_attn[l] == MS_ATTN_GQA;
    int64_t kp = s->cfg.kpool > 1 ? s->cfg.kpool : 1;
    for (int l = 0; l < c->n_layers; l++) /* empty caches with room for the whole context (ms_dsa_cache_init's layout) */
        if (c->layer_dsa[l] == 1 && !(e->staged && (l < e->l0 || l >= e->l1))) /* a split engine: its stage's */
            s->cache[l] = (ms_dsa_cache){.head_dim = s->cfg.head_dim, .kpool = (int)kp, .cap = e->max_ctx};
    return MS_OK;
}

int ms_dsa_engine_buffers(ms_engine *e, const ms_config *c, size_t T, size_t B, ms_buf_spec *b, int n) {
    if (!any_dsa(c)) return n;
    ms_dsa_state *s = e ? e->dsa : NULL;
    ms_dsa_cfg cfg;
    ms_dsa_cfg_of(c, &cfg);
    size_t H = (size_t)cfg.n_heads, D = (size_t)cfg.head_dim, W = (size_t)ms_dsa_row_width(&cfg);
    size_t kp = cfg.kpool > 1 ? (size_t)cfg.kpool : 1;
#define P(f) (s ? (void **)&(f) : NULL)
    n = ms_buf_add(b, n, P(s->tokens), sizeof(int32_t) * T, 1, 1); /* the sequence so far, for tie replays */
    n = ms_buf_add(b, n, P(s->idx), sizeof(int32_t) * B * W, 0, 1);
    n = ms_buf_add(b, n, P(s->cnt), sizeof(int32_t) * B, 0, 1);
    n = ms_buf_add(b, n, P(s->amb), B, 0, 1);
    n = ms_buf_add(b, n, P(s->q), sizeof(float) * B * H * D, 0, 0);
    n = ms_buf_add(b, n, P(s->w), sizeof(float) * B * H, 0, 0);
    n = ms_buf_add(b, n, P(s->k), sizeof(float) * B * D, 0, 0);
    n = ms_buf_add(b, n, P(s->g), sizeof(float) * B * D, 0, 0);
    for (int l = 0; l < c->n_layers; l++) { /* index keys (KPool: + gate logits and pooled keys) */
        if (c->layer_dsa[l] != 1) continue;
        if (e && e->staged && (l < e->l0 || l >= e->l1)) continue; /* another stage's layer */
        n = ms_buf_add(b, n, P(s->cache[l].keys), sizeof(float) * T * D, 1, 0);
        if (kp <= 1) continue;
        n = ms_buf_add(b, n, P(s->cache[l].gates), sizeof(float) * T * D, 1, 0);
        n = ms_buf_add(b, n, P(s->cache[l].pooled), sizeof(float) * (T / kp + 1) * D, 1, 0);
        n = ms_buf_add(b, n, P(s->cache[l].ape), sizeof(float) * kp * D, 0, 0);
    }
#undef P
    return n;
}

int ms_dsa_engine_ready(ms_engine *e, ms_err *err) {
    ms_dsa_state *s = e->dsa;
    if (!s || s->cfg.kpool <= 1) return MS_OK;
    int64_t kp = s->cfg.kpool, D = s->cfg.head_dim;
    for (int l = 0; l < e->m->cfg.n_layers; l++) {
        if (e->m->cfg.layer_dsa[l] != 1 || !s->cache[l].head_dim) continue; /* (another stage's) */
        const ms_qmat *ape = &e->m->layers[l].dsa.kpool_ape; /* zeros when absent (the allocation is zeroed) */
        if (!ape->data) continue;
        float *apef = malloc(sizeof(float) * (size_t)(kp * D));
        if (!apef) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
        ms_to_f32(apef, ape->data, ape->dtype, kp * D);
        int rc = e->be->ops->upload(e->be, s->cache[l].ape, apef, sizeof(float) * (size_t)(kp * D), err);
        free(apef);
        if (rc) return ms_wrap(err, "layer %d", l);
    }
    return MS_OK;
}

void ms_dsa_engine_free(ms_engine *e) {
    ms_dsa_state *s = e->dsa;
    if (!s) return;
    for (int l = 0; s->amb_rows && l < e->m->cfg.n_layers; l++) {
        amb_list *a = &s->amb_rows[l];
        free(a->pos), free(a->q), free(a->w), free(a->sel), free(a->cnt);
    }
    free(s->amb_rows);
    free(s->cache);
    free(s);
    e->dsa = NULL;
}

void ms_dsa_engine_reset(ms_engine *e) {
    ms_dsa_state *s = e->dsa;
    if (!s) return;
    ms_dsa_engine_rollback(e, 0);
}

/* One tied row: its prepared query q [H*D] and weights w [H] (backend memory), its selection (host). */
static int amb_push(ms_engine *e, ms_dsa_state *s, amb_list *a, int64_t pos, const float *q, const float *w,
                    const int32_t *sel, int32_t cnt, ms_err *err) {
    size_t H = (size_t)s->cfg.n_heads, D = (size_t)s->cfg.head_dim, W = (size_t)s->width;
    if (a->n == a->cap) {
        int64_t cap = a->cap ? 2 * a->cap : 16;
        int64_t *np = realloc(a->pos, sizeof *np * (size_t)cap);
        if (np) a->pos = np;
        float *nq = realloc(a->q, sizeof *nq * (size_t)cap * H * D);
        if (nq) a->q = nq;
        float *nw = realloc(a->w, sizeof *nw * (size_t)cap * H);
        if (nw) a->w = nw;
        int32_t *ns = realloc(a->sel, sizeof *ns * (size_t)cap * W);
        if (ns) a->sel = ns;
        int32_t *nc = realloc(a->cnt, sizeof *nc * (size_t)cap);
        if (nc) a->cnt = nc;
        if (!np || !nq || !nw || !ns || !nc) return ms_fail(err, MS_ERR_NOMEM, "out of memory recording tied selections");
        a->cap = cap;
    }
    a->pos[a->n] = pos;
    int rc;
    if ((rc = e->be->ops->download(e->be, a->q + (size_t)a->n * H * D, q, sizeof(float) * H * D, err)) ||
        (rc = e->be->ops->download(e->be, a->w + (size_t)a->n * H, w, sizeof(float) * H, err)))
        return rc;
    memcpy(a->sel + (size_t)a->n * W, sel, sizeof(int32_t) * W);
    a->cnt[a->n] = cnt;
    a->n++;
    return MS_OK;
}

void ms_dsa_engine_rollback(ms_engine *e, int64_t pos) {
    ms_dsa_state *s = e->dsa;
    if (!s) return;
    for (int l = 0; l < e->m->cfg.n_layers; l++) {
        if (s->cache[l].head_dim && s->cache[l].len > pos) s->cache[l].len = pos; /* complete pools below keep their keys */
        amb_list *a = &s->amb_rows[l];
        int64_t k = 0;
        for (int64_t i = 0; i < a->n; i++) /* rows stay in position order: keep those below pos */
            if (a->pos[i] < pos) k = i + 1;
        a->n = k;
    }
}

int ms_dsa_engine_replay_from(ms_engine *e, int64_t fwd_len, int64_t *from, ms_err *err) {
    ms_dsa_state *s = e->dsa;
    *from = -1;
    if (!s) return MS_OK;
    int32_t idx[s->width], cnt;
    for (int l = 0; l < e->m->cfg.n_layers; l++) {
        amb_list *a = &s->amb_rows[l];
        size_t H = (size_t)s->cfg.n_heads, D = (size_t)s->cfg.head_dim;
        for (int64_t i = 0; i < a->n; i++) {
            if (*from >= 0 && a->pos[i] >= *from) break;
            /* the recorded query and weights into the indexer scratch (free between forwards) */
            ms_backend *be = e->be;
            int rc;
            if ((rc = be->ops->upload(be, s->q, a->q + (size_t)i * H * D, sizeof(float) * H * D, err)) ||
                (rc = be->ops->upload(be, s->w, a->w + (size_t)i * H, sizeof(float) * H, err)) ||
                (rc = be->ops->dsa_recheck(be, &s->cfg, &s->cache[l], s->q, s->w, a->pos[i], fwd_len, idx, &cnt, err)))
                return ms_wrap(err, "layer %d: re-checking position %lld", l, (long long)a->pos[i]);
            if (cnt != a->cnt[i] || memcmp(idx, a->sel + (size_t)i * s->width, sizeof(int32_t) * (size_t)cnt)) {
                *from = a->pos[i];
                break;
            }
        }
    }
    if (*from > 0 && !s->replay_ok) *from = 0; /* recurrent state cannot be rolled back: redo everything */
    return MS_OK;
}

void ms_dsa_engine_note_tokens(ms_engine *e, const int32_t *tokens, int n) {
    if (e->dsa) memcpy(e->dsa->tokens + e->n_past, tokens, sizeof(int32_t) * (size_t)n);
}

const int32_t *ms_dsa_engine_tokens(const ms_engine *e) { return e->dsa->tokens; }

void ms_dsa_engine_hand_on(const ms_engine *from, ms_engine *to, int n) {
    if (!from->dsa || !to->dsa) return;
    memcpy(to->dsa->idx, from->dsa->idx, sizeof(int32_t) * (size_t)n * (size_t)from->dsa->width);
    memcpy(to->dsa->cnt, from->dsa->cnt, sizeof(int32_t) * (size_t)n);
}

/* ms_engine_observe_choices (a host-memory backend): each query of the chunk whose candidates outnumber
 * what it selected, with every candidate's index score and the candidates selected (engine.h); a
 * forced choice rewrites the query's selection row (the idx and cnt the attention reads). */
static int observe(ms_engine *e, ms_dsa_state *s, int layer, int n, ms_err *err) {
    const ms_dsa_cfg *cfg = &s->cfg;
    const int64_t p0 = e->n_past, kp = cfg->kpool > 1 ? cfg->kpool : 1;
    const int64_t cap = ms_dsa_candidates(cfg, p0 + n - 1);
    float *sc = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *sc);
    int32_t *ch = malloc((size_t)s->width * 3 * sizeof *ch), *fo = ch + s->width, *nr = fo + s->width;
    int rc = sc && ch ? MS_OK : ms_fail(err, MS_ERR_NOMEM, "layer %d: out of memory observing the DSA selection", layer);
    for (int t = 0; !rc && t < n; t++) {
        const int64_t pos = p0 + t, nc = ms_dsa_candidates(cfg, pos);
        const int32_t *row = s->idx + (size_t)t * s->width;
        int k = 0;
        for (int j = 0; j < s->cnt[t]; j++) { /* ascending positions; a pool's tokens are consecutive */
            int32_t cand = (int32_t)(row[j] / kp);
            if (cand < nc && (k == 0 || ch[k - 1] != cand)) ch[k++] = cand;
        }
        if (nc <= k) continue;
        int64_t got = ms_dsa_scores(cfg, &s->cache[layer], s->q + (size_t)t * cfg->n_heads * cfg->head_dim,
                                    s->w + (size_t)t * cfg->n_heads, pos, sc, cap, err);
        if (got < 0) rc = (int)got;
        else {
            ms_choice c = {.kind = MS_CHOICE_DSA, .layer = layer, .pos = pos, .scores = sc, .n_scores = (int)got,
                           .chosen = ch, .n_chosen = k};
            if (e->choice_fn(e->choice_ctx, &c, fo)) { /* forced: the candidates' tokens, then the tail as chosen */
                int32_t *rw = s->idx + (size_t)t * s->width;
                int m = 0;
                for (int j = 0; j < k; j++)
                    for (int64_t q = 0; q < kp && m < s->width; q++) nr[m++] = (int32_t)(fo[j] * kp + q);
                for (int j = 0; j < s->cnt[t]; j++)
                    if (rw[j] / kp >= nc && m < s->width) nr[m++] = rw[j];
                for (int j = 0; j < s->width; j++) rw[j] = j < m ? nr[j] : -1;
                s->cnt[t] = m;
            }
        }
    }
    free(sc), free(ch);
    return rc ? ms_wrap(err, "layer %d: observing the DSA selection", layer) : MS_OK;
}

int ms_dsa_engine_select(ms_engine *e, int layer, int n, const float *q_resid, const float *xn, ms_err *err) {
    ms_dsa_state *s = e->dsa;
    const ms_config *c = &e->m->cfg;
    if (!s) return ms_fail(err, MS_ERR_ARG, "layer %d: DSA layer without DSA state", layer);
    if (c->layer_dsa[layer] == 2) return MS_OK; /* reuse the selection left by the layer it shares */
    const ms_dsa_weights *W = &e->w->layers[layer].dsa;
    ms_dsa_cache *cache = &s->cache[layer];
    int64_t p0 = e->n_past;
    if (cache->len != p0)
        return ms_fail(err, MS_ERR_ARG, "layer %d: index-key cache holds %lld keys, the sequence %lld", layer,
                       (long long)cache->len, (long long)p0);
    ms_backend *be = e->be;
    be->ops->matmul(be, s->q, q_resid, n, &W->wq_b, 0);
    be->ops->matmul(be, s->k, xn, n, &W->wk, 0);
    be->ops->matmul(be, s->w, xn, n, &W->weights_proj, 0);
    if (s->cfg.kpool > 1) be->ops->matmul(be, s->g, xn, n, &W->kpool_gate, 0);
    ms_dsa_index_args a = {.cfg = &s->cfg, .cache = cache, .q = s->q, .k = s->k,
                           .g = s->cfg.kpool > 1 ? s->g : NULL, .w = s->w, .k_norm_w = W->k_norm_w,
                           .k_norm_b = W->k_norm_b, .rope = &c->rope, .n = n, .pos0 = p0, .fwd_len = e->fwd_len,
                           .idx = s->idx, .count = s->cnt, .ambiguous = s->amb};
    int rc = be->ops->dsa_index(be, &a, err);
    if (rc) return ms_wrap(err, "layer %d indexer", layer);
    for (int t = 0; t < n; t++)
        if (s->amb[t] && (rc = amb_push(e, s, &s->amb_rows[layer], p0 + t,
                                        s->q + (size_t)t * s->cfg.n_heads * s->cfg.head_dim,
                                        s->w + (size_t)t * s->cfg.n_heads, s->idx + (size_t)t * s->width, s->cnt[t],
                                        err)))
            return ms_wrap(err, "layer %d", layer);
    for (int t = 0; t < n; t++)
        if (s->cnt[t] < 1)
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "layer %d: position %lld has no key to attend to (KPool without the tail)", layer,
                           (long long)(p0 + t));
    if (e->choice_fn && e->n_seqs == 1) return observe(e, s, layer, n, err);
    return MS_OK;
}

void ms_dsa_engine_selection(const ms_engine *e, const int32_t **sel, const int32_t **count, int64_t *width) {
    *sel = e->dsa->idx;
    *count = e->dsa->cnt;
    *width = e->dsa->width;
}

const int32_t *ms_dsa_engine_row(const ms_engine *e, int t, int *count) {
    *count = e->dsa->cnt[t];
    return e->dsa->idx + (size_t)t * e->dsa->width;
}

/* ---- state parts (engine/state.c): index keys, KPool gates and pooled keys, the
 * recorded tied selections of each layer, the token ids ---- */

/* A layer's tied rows serialized: int64 count, then per row int64 pos, q [H*D],
 * w [H] (f32), sel [width], cnt (int32). */
static uint64_t amb_row_bytes(const ms_dsa_state *s) {
    return 8 + 4 * ((uint64_t)s->cfg.n_heads * s->cfg.head_dim + (uint64_t)s->cfg.n_heads + (uint64_t)s->width + 1);
}

static uint64_t amb_size(const ms_engine *e, int layer) {
    return 8 + (uint64_t)e->dsa->amb_rows[layer].n * amb_row_bytes(e->dsa);
}

static void amb_get(const ms_engine *e, int layer, uint8_t *out) {
    const ms_dsa_state *s = e->dsa;
    const amb_list *a = &s->amb_rows[layer];
    size_t H = (size_t)s->cfg.n_heads, D = (size_t)s->cfg.head_dim, W = (size_t)s->width;
    memcpy(out, &a->n, 8), out += 8;
    for (int64_t i = 0; i < a->n; i++) {
        memcpy(out, &a->pos[i], 8), out += 8;
        memcpy(out, a->q + (size_t)i * H * D, 4 * H * D), out += 4 * H * D;
        memcpy(out, a->w + (size_t)i * H, 4 * H), out += 4 * H;
        memcpy(out, a->sel + (size_t)i * W, 4 * W), out += 4 * W;
        memcpy(out, &a->cnt[i], 4), out += 4;
    }
}

static int amb_check(ms_engine *e, int layer, const uint8_t *in, uint64_t n, int64_t n_past, ms_err *err) {
    ms_dsa_state *s = e->dsa;
    uint64_t rb = amb_row_bytes(s);
    int64_t cnt;
    if (n < 8) return ms_fail(err, MS_ERR_FORMAT, "%llu bytes, less than the row count", (unsigned long long)n);
    memcpy(&cnt, in, 8);
    if (cnt < 0 || cnt > n_past || (uint64_t)cnt != (n - 8) / rb || (n - 8) % rb)
        return ms_fail(err, MS_ERR_FORMAT, "%lld tied rows do not fit %llu bytes (%llu per row, %lld positions)",
                       (long long)cnt, (unsigned long long)n, (unsigned long long)rb, (long long)n_past);
    size_t H = (size_t)s->cfg.n_heads, D = (size_t)s->cfg.head_dim, W = (size_t)s->width;
    int64_t prev = -1;
    for (int64_t i = 0; i < cnt; i++) {
        const uint8_t *r = in + 8 + (uint64_t)i * rb;
        int64_t pos;
        int32_t c;
        memcpy(&pos, r, 8);
        memcpy(&c, r + 8 + 4 * (H * D + H + W), 4);
        if (pos <= prev || pos >= n_past)
            return ms_fail(err, MS_ERR_FORMAT, "tied row %lld: position %lld not in ascending order below %lld",
                           (long long)i, (long long)pos, (long long)n_past);
        if (c < 0 || c > (int32_t)W)
            return ms_fail(err, MS_ERR_FORMAT, "tied row %lld: %d selected keys, the row holds %zu", (long long)i, c, W);
        prev = pos;
    }
    amb_list *a = &s->amb_rows[layer];
    if (a->cap < cnt) { /* more room only: the rows kept and a->n stay as they are */
        int64_t *np = realloc(a->pos, sizeof *np * (size_t)cnt);
        if (np) a->pos = np;
        float *nq = realloc(a->q, sizeof *nq * (size_t)cnt * H * D);
        if (nq) a->q = nq;
        float *nw = realloc(a->w, sizeof *nw * (size_t)cnt * H);
        if (nw) a->w = nw;
        int32_t *ns = realloc(a->sel, sizeof *ns * (size_t)cnt * W);
        if (ns) a->sel = ns;
        int32_t *nc = realloc(a->cnt, sizeof *nc * (size_t)cnt);
        if (nc) a->cnt = nc;
        if (!np || !nq || !nw || !ns || !nc) return ms_fail(err, MS_ERR_NOMEM, "out of memory for %lld tied rows", (long long)cnt);
        a->cap = cnt;
    }
    return MS_OK;
}

static void amb_put(ms_engine *e, int layer, const uint8_t *in, uint64_t n) {
    ms_dsa_state *s = e->dsa;
    amb_list *a = &s->amb_rows[layer];
    size_t H = (size_t)s->cfg.n_heads, D = (size_t)s->cfg.head_dim, W = (size_t)s->width;
    memcpy(&a->n, in, 8), in += 8;
    for (int64_t i = 0; i < a->n; i++) {
        memcpy(&a->pos[i], in, 8), in += 8;
        memcpy(a->q + (size_t)i * H * D, in, 4 * H * D), in += 4 * H * D;
        memcpy(a->w + (size_t)i * H, in, 4 * H), in += 4 * H;
        memcpy(a->sel + (size_t)i * W, in, 4 * W), in += 4 * W;
        memcpy(&a->cnt[i], in, 4), in += 4;
    }
}

int ms_dsa_engine_parts(const ms_engine *e, ms_state_part *parts, int n, int cap) {
    ms_dsa_state *s = e->dsa;
    if (!s) return n;
    const char *why = s->replay_ok ? NULL : "DSA tie replays of a model with recurrent layers";
#define PART(...)                                              \
    do {                                                       \
        if (parts && n < cap) parts[n] = (ms_state_part){__VA_ARGS__}; \
        n++;                                                   \
    } while (0)
#define NAME(fmt, ...) \
    if (parts && n - 1 < cap) snprintf(parts[n - 1].name, sizeof parts[n - 1].name, fmt, __VA_ARGS__)
    uint64_t D4 = 4 * (uint64_t)s->cfg.head_dim;
    for (int l = 0; l < e->m->cfg.n_layers; l++) {
        ms_dsa_cache *c = &s->cache[l];
        if (c->head_dim) {
            PART(.kind = MS_PART_ROWS, .data = c->keys, .row_bytes = D4, .per = 1, .cap_rows = c->cap, .no_truncate = why,
                 .be = e->be);
            NAME("L%d.dsa.keys", l);
            if (c->kpool > 1) {
                PART(.kind = MS_PART_ROWS, .data = c->gates, .row_bytes = D4, .per = 1, .cap_rows = c->cap,
                     .no_truncate = why, .be = e->be);
                NAME("L%d.dsa.gates", l);
                PART(.kind = MS_PART_ROWS, .data = c->pooled, .row_bytes = D4, .per = c->kpool,
                     .cap_rows = c->cap / c->kpool + 1, .no_truncate = why, .be = e->be);
                NAME("L%d.dsa.pooled", l);
            }
            PART(.kind = MS_PART_CUSTOM, .layer = l, .no_truncate = why, .size = amb_size, .get = amb_get,
                 .check = amb_check, .put = amb_put, .eng = (ms_engine *)e);
            NAME("L%d.dsa.ties", l);
        }
    }
    if (!(e->staged && e->stage > 0)) { /* the sequence once: the lead's (a split engine's replays start there) */
        PART(.kind = MS_PART_ROWS, .data = s->tokens, .host = 1, .row_bytes = 4, .per = 1, .cap_rows = e->max_ctx,
             .no_truncate = why);
        NAME("%s", "dsa.tokens");
    }
#undef PART
#undef NAME
    return n;
}

void ms_dsa_engine_restored(ms_engine *e, int64_t n_past) {
    ms_dsa_state *s = e->dsa;
    for (int l = 0; s && l < e->m->cfg.n_layers; l++)
        if (s->cache[l].head_dim) s->cache[l].len = n_past;
}
