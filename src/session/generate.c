/* generate.c — sampler, stop matcher, EOS ids, prefix reuse and the generation loop. */
#include "session/generate.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/fs.h"
#include "util/json.h"

/* ---------------- RNG ---------------- */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void ms_rng_seed(ms_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t ms_rng_next(ms_rng *r) {
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double ms_rng_uniform(ms_rng *r) { return (double)(ms_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---------------- sampler ---------------- */
struct ms_sampler {
    ms_sampler_params p;
    int64_t vocab;
    ms_rng rng;
    uint32_t *out_count;  /* [vocab] occurrences in the output */
    uint8_t *seen;        /* [vocab] in prompt or output */
    double *work;         /* [vocab] adjusted logits / probs */
    int32_t *order;       /* [vocab] ids sorted by probability */
    float *bias;          /* [vocab] logit_bias, NULL when none */
};

void ms_sampler_defaults(ms_sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0;
    p->top_p = 1.0;
    p->repetition_penalty = 1.0;
}

int ms_sampler_check(const ms_sampler_params *p, ms_err *err) {
    if (!(p->temperature >= 0 && p->temperature <= 100))
        return ms_fail(err, MS_ERR_ARG, "temperature must be in [0, 100], got %g", p->temperature);
    if (p->top_k < 0) return ms_fail(err, MS_ERR_ARG, "top_k must be >= 0, got %d", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1)) return ms_fail(err, MS_ERR_ARG, "top_p must be in (0, 1], got %g", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1)) return ms_fail(err, MS_ERR_ARG, "min_p must be in [0, 1], got %g", p->min_p);
    if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 100))
        return ms_fail(err, MS_ERR_ARG, "repetition_penalty must be in (0, 100], got %g", p->repetition_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return ms_fail(err, MS_ERR_ARG, "presence_penalty must be in [-2, 2], got %g", p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return ms_fail(err, MS_ERR_ARG, "frequency_penalty must be in [-2, 2], got %g", p->frequency_penalty);
    return MS_OK;
}

int ms_sampler_new(const ms_sampler_params *p, int64_t vocab, ms_sampler **out, ms_err *err) {
    *out = NULL;
    int rc = ms_sampler_check(p, err);
    if (rc) return rc;
    if (vocab < 1 || vocab > (1LL << 31)) return ms_fail(err, MS_ERR_ARG, "sampler: vocab %lld out of range", (long long)vocab);
    ms_sampler *s = calloc(1, sizeof *s);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->vocab = vocab;
    s->out_count = calloc((size_t)vocab, sizeof *s->out_count);
    s->seen = calloc((size_t)vocab, 1);
    s->work = malloc((size_t)vocab * sizeof *s->work);
    s->order = malloc((size_t)vocab * sizeof *s->order);
    if (!s->out_count || !s->seen || !s->work || !s->order) {
        ms_sampler_free(s);
        return ms_fail(err, MS_ERR_NOMEM, "sampler: out of memory for a vocabulary of %lld", (long long)vocab);
    }
    if (p->n_bias > 0) {
        if (!p->bias_ids || !p->bias) {
            ms_sampler_free(s);
            return ms_fail(err, MS_ERR_ARG, "sampler: logit_bias without ids or values");
        }
        if (!(s->bias = calloc((size_t)vocab, sizeof *s->bias))) {
            ms_sampler_free(s);
            return ms_fail(err, MS_ERR_NOMEM, "sampler: out of memory");
        }
        for (int i = 0; i < p->n_bias; i++) {
            if (!isfinite(p->bias[i])) {
                ms_sampler_free(s);
                return ms_fail(err, MS_ERR_ARG, "sampler: logit_bias value %d is not finite", i);
            }
            if (p->bias_ids[i] >= 0 && p->bias_ids[i] < vocab) s->bias[p->bias_ids[i]] = p->bias[i];
        }
    }
    s->p.bias_ids = NULL, s->p.bias = NULL; /* borrowed: not kept */
    ms_rng_seed(&s->rng, p->seed);
    *out = s;
    return MS_OK;
}

void ms_sampler_free(ms_sampler *s) {
    if (!s) return;
    free(s->out_count);
    free(s->seen);
    free(s->work);
    free(s->order);
    free(s->bias);
    free(s);
}

void ms_sampler_add_prompt(ms_sampler *s, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->vocab) s->seen[ids[i]] = 1;
}

void ms_sampler_add_output(ms_sampler *s, int32_t id) {
    if (id < 0 || id >= s->vocab) return;
    s->seen[id] = 1;
    if (s->out_count[id] < UINT32_MAX) s->out_count[id]++;
}

static int cmp_prob_desc(const void *a, const void *b, void *ctx) {
    const double *w = ctx;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (w[i] != w[j]) return w[i] > w[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* Reorder ids[0..n) so that ids[0..k) are the k first in cmp_prob_desc order (0 < k < n):
 * quickselect with a median-of-three pivot, O(n) on average. */
static void select_top(int32_t *ids, int64_t n, int64_t k, const double *w) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int32_t a = ids[lo], b = ids[mid], c = ids[hi], piv;
        if (cmp_prob_desc(&a, &b, (void *)w) < 0) {
            piv = cmp_prob_desc(&b, &c, (void *)w) < 0 ? b : (cmp_prob_desc(&a, &c, (void *)w) < 0 ? c : a);
        } else {
            piv = cmp_prob_desc(&a, &c, (void *)w) < 0 ? a : (cmp_prob_desc(&b, &c, (void *)w) < 0 ? c : b);
        }
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (cmp_prob_desc(&ids[i], &piv, (void *)w) < 0) i++;
            while (cmp_prob_desc(&piv, &ids[j], (void *)w) < 0) j--;
            if (i <= j) {
                int32_t t = ids[i];
                ids[i++] = ids[j];
                ids[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
}

/* Renormalize w over the ids with w > 0. */
static void renorm(double *w, int64_t V) {
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += w[i];
    if (sum > 0)
        for (int64_t i = 0; i < V; i++) w[i] /= sum;
}

int ms_sampler_probs(ms_sampler *s, const float *logits, double *probs, ms_err *err) {
    const ms_sampler_params *p = &s->p;
    int64_t V = s->vocab;
    double *w = probs;
    for (int64_t i = 0; i < V; i++) {
        double l = logits[i];
        if (isnan(l)) return ms_fail(err, MS_ERR_ARG, "sampler: logit %lld is NaN", (long long)i);
        if (s->seen[i] && p->repetition_penalty != 1.0) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
        if (s->out_count[i]) l -= p->frequency_penalty * s->out_count[i] + p->presence_penalty;
        if (s->bias) l += s->bias[i];
        w[i] = l;
    }
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (w[i] > w[best]) best = i;
    if (p->temperature == 0 || !isfinite(w[best])) {
        /* greedy (or every logit infinite: the largest wins) */
        for (int64_t i = 0; i < V; i++) w[i] = 0;
        w[best] = 1;
        return MS_OK;
    }
    double mx = w[best];
    for (int64_t i = 0; i < V; i++) w[i] = exp((w[i] - mx) / p->temperature);
    renorm(w, V);
    int need_sort = (p->top_k > 0 && p->top_k < V) || p->top_p < 1;
    if (need_sort) {
        /* Sort only a prefix of the probability order. top_k: the k most likely, found by
         * quickselect. top_p alone: the ids with p >= eps for the largest eps (1e-3, 1e-6,
         * ... of the maximum) whose set reaches the top_p mass; that set is a prefix of the
         * full order, so the nucleus is exact, and a peaked distribution over a 150k
         * vocabulary sorts tens of ids per token instead of all of them. */
        int64_t n = 0, total = 0;
        for (int64_t i = 0; i < V; i++) total += w[i] > 0;
        int use_k = p->top_k > 0 && p->top_k < V;
        for (double eps = 1e-3; !use_k; eps *= 1e-3) {
            double thr = eps > 1e-280 ? w[best] * eps : 0, mass = 0;
            n = 0;
            for (int64_t i = 0; i < V; i++)
                if (w[i] > 0 && w[i] >= thr) { s->order[n++] = (int32_t)i; mass += w[i]; }
            if (n == total || mass >= p->top_p) break;
        }
        if (use_k) { /* top_k: select the k most likely in O(V), sort only them */
            for (int64_t i = 0; i < V; i++)
                if (w[i] > 0) s->order[n++] = (int32_t)i;
            if (p->top_k < n) {
                select_top(s->order, n, p->top_k, w);
                for (int64_t r = p->top_k; r < n; r++) w[s->order[r]] = 0; /* ties at the k-th go by id */
                n = p->top_k;
            }
        }
        int cut = n < total;
        if (cut && !use_k) { /* everything outside the set is past the nucleus */
            double thr = w[s->order[0]];
            for (int64_t r = 1; r < n; r++)
                if (w[s->order[r]] < thr) thr = w[s->order[r]];
            for (int64_t i = 0; i < V; i++)
                if (w[i] < thr) w[i] = 0;
        }
        qsort_r(s->order, (size_t)n, sizeof *s->order, cmp_prob_desc, w);
        int64_t keep = n;
        if (p->top_k > 0 && p->top_k < keep) keep = p->top_k;
        for (int64_t r = keep; r < n; r++) w[s->order[r]] = 0;
        if (use_k && (keep < n || cut)) renorm(w, V); /* top_p then sees the top_k renormalized */
        if (p->top_p < 1) {
            /* transformers' TopPLogitsWarper: keep the smallest prefix whose mass reaches top_p
             * (always at least one token) */
            double cum = 0;
            int64_t r = 0;
            while (r < keep) {
                cum += w[s->order[r]];
                r++;
                if (cum >= p->top_p) break;
            }
            for (int64_t q = r; q < keep; q++) w[s->order[q]] = 0;
            if (r < keep || (cut && !use_k)) renorm(w, V);
        }
    }
    if (p->min_p > 0) {
        double pmax = 0;
        for (int64_t i = 0; i < V; i++)
            if (w[i] > pmax) pmax = w[i];
        double thr = p->min_p * pmax;
        int cut = 0;
        for (int64_t i = 0; i < V; i++)
            if (w[i] < thr && w[i] > 0) { w[i] = 0; cut = 1; }
        if (cut) renorm(w, V);
    }
    return MS_OK;
}

int ms_sampler_sample(ms_sampler *s, const float *logits, int32_t *id, ms_err *err) {
    int rc = ms_sampler_probs(s, logits, s->work, err);
    if (rc) return rc;
    int64_t V = s->vocab, last = -1;
    if (s->p.temperature == 0) {
        for (int64_t i = 0; i < V; i++)
            if (s->work[i] > 0) { *id = (int32_t)i; return MS_OK; }
    }
    double u = ms_rng_uniform(&s->rng), cum = 0;
    for (int64_t i = 0; i < V; i++) {
        if (s->work[i] <= 0) continue;
        last = i;
        cum += s->work[i];
        if (u < cum) { *id = (int32_t)i; return MS_OK; }
    }
    if (last < 0) return ms_fail(err, MS_ERR_ARG, "sampler: empty distribution");
    *id = (int32_t)last; /* rounding: u landed past the summed mass */
    return MS_OK;
}

/* ---------------- stop strings ---------------- */
struct ms_stopper {
    char *stops[MS_STOP_MAX];
    size_t lens[MS_STOP_MAX];
    int n, done;
    char *buf;      /* held back + new text */
    size_t len, cap;
    char *out;      /* last output */
    size_t out_cap;
};

int ms_stopper_new(const char *const *stops, int n, ms_stopper **out, ms_err *err) {
    *out = NULL;
    if (n < 0 || n > MS_STOP_MAX) return ms_fail(err, MS_ERR_ARG, "stop: at most %d stop strings, got %d", MS_STOP_MAX, n);
    ms_stopper *s = calloc(1, sizeof *s);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "stop: out of memory");
    for (int i = 0; i < n; i++) {
        size_t l = stops[i] ? strlen(stops[i]) : 0;
        if (l == 0 || l > MS_STOP_MAX_LEN) {
            ms_stopper_free(s);
            return ms_fail(err, MS_ERR_ARG, "stop[%d]: a stop string must have 1..%d bytes, got %zu", i, MS_STOP_MAX_LEN, l);
        }
        if (!(s->stops[i] = strdup(stops[i]))) {
            ms_stopper_free(s);
            return ms_fail(err, MS_ERR_NOMEM, "stop: out of memory");
        }
        s->lens[i] = l;
        s->n++;
    }
    *out = s;
    return MS_OK;
}

void ms_stopper_free(ms_stopper *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->stops[i]);
    free(s->buf);
    free(s->out);
    free(s);
}

static int grow(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *n = realloc(*p, c);
    if (!n) return -1;
    *p = n;
    *cap = c;
    return 0;
}

/* Emit buf[0..k) as output and keep buf[k..len). */
static int stop_emit(ms_stopper *s, size_t k, const char **out, size_t *out_len, ms_err *err) {
    if (grow(&s->out, &s->out_cap, k + 1)) return ms_fail(err, MS_ERR_NOMEM, "stop: out of memory");
    memcpy(s->out, s->buf, k);
    s->out[k] = 0;
    memmove(s->buf, s->buf + k, s->len - k);
    s->len -= k;
    *out = s->out;
    *out_len = k;
    return MS_OK;
}

int ms_stopper_feed(ms_stopper *s, const char *text, size_t len, const char **out, size_t *out_len, int *hit,
                    ms_err *err) {
    *hit = 0;
    *out = "";
    *out_len = 0;
    if (s->done) { *hit = 1; return MS_OK; }
    if (grow(&s->buf, &s->cap, s->len + len + 1)) return ms_fail(err, MS_ERR_NOMEM, "stop: out of memory");
    memcpy(s->buf + s->len, text, len);
    s->len += len;
    if (!s->n) return stop_emit(s, s->len, out, out_len, err);
    /* earliest complete match */
    size_t first = SIZE_MAX;
    for (int i = 0; i < s->n; i++) {
        const char *m = memmem(s->buf, s->len, s->stops[i], s->lens[i]);
        if (m && (size_t)(m - s->buf) < first) first = (size_t)(m - s->buf);
    }
    if (first != SIZE_MAX) {
        s->done = 1;
        *hit = 1;
        int rc = stop_emit(s, first, out, out_len, err);
        s->len = 0;
        return rc;
    }
    /* hold back the longest tail that is a proper prefix of some stop string */
    size_t hold = 0;
    for (int i = 0; i < s->n; i++) {
        size_t mx = s->lens[i] - 1 < s->len ? s->lens[i] - 1 : s->len;
        for (size_t k = mx; k > hold; k--)
            if (!memcmp(s->buf + s->len - k, s->stops[i], k)) { hold = k; break; }
    }
    return stop_emit(s, s->len - hold, out, out_len, err);
}

void ms_stopper_flush(ms_stopper *s, const char **out, size_t *out_len) {
    *out = "";
    *out_len = 0;
    if (s->done || !s->len) return;
    /* the buffer already has room for its own bytes + NUL */
    if (grow(&s->out, &s->out_cap, s->len + 1)) { /* cannot copy: hand out the buffer itself */
        s->buf[s->len] = 0;
        *out = s->buf;
        *out_len = s->len;
        s->len = 0;
        return;
    }
    memcpy(s->out, s->buf, s->len);
    s->out[s->len] = 0;
    *out = s->out;
    *out_len = s->len;
    s->len = 0;
}

/* ---------------- EOS ids ---------------- */
static int add_eos(const cJSON *v, const char *file, int64_t vocab, int32_t *ids, int cap, int *n, ms_err *err) {
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (cJSON_IsArray(v)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, v) {
            int rc = add_eos(x, file, vocab, ids, cap, n, err);
            if (rc) return rc;
        }
        return MS_OK;
    }
    if (!ms_json_is_int(v, 0, vocab - 1))
        return ms_fail(err, MS_ERR_FORMAT, "%s: eos_token_id must be an id in [0, %lld) or a list of them", file,
                       (long long)vocab);
    int32_t id = (int32_t)v->valuedouble;
    for (int i = 0; i < *n; i++)
        if (ids[i] == id) return MS_OK;
    if (*n >= cap) return ms_fail(err, MS_ERR_LIMIT, "%s: more than %d eos_token_id values", file, cap);
    ids[(*n)++] = id;
    return MS_OK;
}

int ms_gen_eos_ids(const char *dir, int64_t vocab, int32_t *ids, int cap, int *n, ms_err *err) {
    *n = 0;
    const char *names[] = {"config.json", "generation_config.json"};
    for (int f = 0; f < 2; f++) {
        char path[4096];
        int rc = ms_path_join(path, sizeof path, dir, names[f], err);
        if (rc) return rc;
        if (!ms_file_exists(path)) continue;
        char *text;
        size_t len;
        if ((rc = ms_read_file(path, 1 << 24, &text, &len, err))) return rc;
        cJSON *j;
        rc = ms_json_parse(text, len, path, &j, err);
        free(text);
        if (rc) return rc;
        rc = add_eos(cJSON_GetObjectItemCaseSensitive(j, "eos_token_id"), path, vocab, ids, cap, n, err);
        cJSON_Delete(j);
        if (rc) return rc;
    }
    return MS_OK;
}

/* ---------------- prefix reuse ----------------
 * ms_engine_can_truncate / ms_engine_truncate: engine/state.c. */

void ms_gen_align(const ms_tokenizer *t, const int32_t *a, int na, const int32_t *b, int nb, int *ia, int *ib) {
    int x = 0;
    while (x < na && x < nb && a[x] == b[x]) x++;
    *ia = *ib = x;
    if (!t || x == na || x == nb) return;
    int y = x;
    size_t ox = 0, oy = 0, lx = 0, ly = 0; /* byte offsets inside a[x], b[y]; their lengths */
    const uint8_t *bx = NULL, *by = NULL;
    for (;;) {
        if (ox == 0 && oy == 0) { /* a boundary of both */
            *ia = x, *ib = y;
            if (x == na || y == nb) return;
            if (a[x] == b[y]) { x++, y++; continue; }
        }
        if (x == na || y == nb) return;
        if (ox == 0) {
            if (ms_tok_is_special(t, a[x]) || !(bx = ms_tok_token_bytes(t, a[x], &lx)) || !lx) return;
        }
        if (oy == 0) {
            if (ms_tok_is_special(t, b[y]) || !(by = ms_tok_token_bytes(t, b[y], &ly)) || !ly) return;
        }
        size_t k = lx - ox < ly - oy ? lx - ox : ly - oy;
        if (memcmp(bx + ox, by + oy, k)) return;
        ox += k, oy += k;
        if (ox == lx) x++, ox = 0;
        if (oy == ly) y++, oy = 0;
    }
}

/* ---------------- generation ---------------- */
struct ms_generator {
    ms_engine *e;
    const ms_tokenizer *t;
    int64_t vocab;
    ms_gen_snapshots snaps;
    int32_t *hist; /* tokens in the engine */
    int n_hist, cap;
    float *logits; /* [vocab] of the last token fed (stale while has_pick) */
    int has_pick;  /* the last token fed went through ms_generator_decode_greedy: its successor is pick */
    int32_t pick;
    int checkpoints; /* prefill checkpoints saved (ms_gen_snapshots.every / at_boundaries) */
};

const char *ms_finish_name(ms_finish f) {
    switch (f) {
    case MS_FINISH_STOP: return "stop";
    case MS_FINISH_LENGTH: return "length";
    case MS_FINISH_ABORT: return "abort";
    default: return "none";
    }
}

int ms_generator_new(ms_engine *e, const ms_tokenizer *t, int64_t vocab, const ms_gen_snapshots *snaps,
                     ms_generator **out, ms_err *err) {
    *out = NULL;
    if (!e || vocab < 1) return ms_fail(err, MS_ERR_ARG, "generator: needs an engine and a vocabulary");
    if (vocab != ms_engine_model(e)->cfg.vocab)
        return ms_fail(err, MS_ERR_ARG, "generator: vocab %lld differs from the model's %lld", (long long)vocab,
                       (long long)ms_engine_model(e)->cfg.vocab);
    ms_generator *g = calloc(1, sizeof *g);
    if (!g) return ms_fail(err, MS_ERR_NOMEM, "generator: out of memory");
    g->e = e;
    g->t = t;
    g->vocab = vocab;
    if (snaps) g->snaps = *snaps;
    g->cap = ms_engine_max_ctx(e);
    g->hist = malloc((size_t)g->cap * sizeof *g->hist);
    g->logits = malloc((size_t)vocab * sizeof *g->logits);
    if (!g->hist || !g->logits) {
        ms_generator_free(g);
        return ms_fail(err, MS_ERR_NOMEM, "generator: out of memory for %d tokens of history", ms_engine_max_ctx(e));
    }
    ms_engine_reset(e);
    *out = g;
    return MS_OK;
}

void ms_generator_free(ms_generator *g) {
    if (!g) return;
    free(g->hist);
    free(g->logits);
    free(g);
}

void ms_generator_reset(ms_generator *g) {
    g->n_hist = 0;
    g->has_pick = 0;
    ms_engine_reset(g->e);
}

int ms_generator_canon(ms_generator *g, const int32_t *p, int n, int32_t **out, int *n_out, ms_err *err) {
    *out = NULL;
    *n_out = n;
    if (!g->t || n < 1) return MS_OK;
    const int32_t *best = g->hist;
    int bi, bj;
    ms_gen_align(g->t, g->hist, g->n_hist, p, n, &bi, &bj);
    const int32_t *ids;
    int ne;
    for (int k = 0; g->snaps.entry && g->snaps.entry(g->snaps.user, k, &ids, &ne); k++) {
        if (ne <= bi) continue; /* cannot reuse more */
        int i, j;
        ms_gen_align(g->t, ids, ne, p, n, &i, &j);
        if (i == ne && j < n) best = ids, bi = i, bj = j; /* an entry is restored whole, leaving a token to feed */
    }
    if (bi == bj && !memcmp(best, p, sizeof *p * (size_t)bi)) return MS_OK; /* already the prompt's own ids */
    int nc = bi + (n - bj);
    if (nc < 1 || nc > ms_engine_max_ctx(g->e)) return MS_OK;
    int32_t *c = malloc(sizeof *c * (size_t)nc);
    if (!c) return ms_fail(err, MS_ERR_NOMEM, "generator: out of memory for a prompt of %d tokens", nc);
    memcpy(c, best, sizeof *c * (size_t)bi);
    memcpy(c + bi, p + bj, sizeof *c * (size_t)(n - bj));
    *out = c;
    *n_out = nc;
    return MS_OK;
}

const int32_t *ms_generator_history(const ms_generator *g, int *n) {
    *n = g->n_hist;
    return g->hist;
}

int ms_generator_max_ctx(const ms_generator *g) { return ms_engine_max_ctx(g->e); }

const float *ms_generator_logits(const ms_generator *g) { return g->has_pick ? NULL : g->logits; }

int ms_generator_adopt(ms_generator *g, const int32_t *ids, int n, ms_err *err) {
    int bad = n < 0 || n > g->cap || n != ms_engine_n_past(g->e) || (n > 0 && !ids);
    for (int i = 0; !bad && i < n; i++)
        if (ids[i] < 0 || ids[i] >= g->vocab) {
            ms_generator_reset(g);
            return ms_fail(err, MS_ERR_ARG, "adopt: token %d at %d is outside the vocabulary [0, %lld)", ids[i], i,
                           (long long)g->vocab);
        }
    if (bad) {
        int np = ms_engine_n_past(g->e);
        ms_generator_reset(g);
        return ms_fail(err, MS_ERR_ARG, "adopt: %d tokens for an engine holding %d (context %d)", n, np, g->cap);
    }
    if (n) memcpy(g->hist, ids, (size_t)n * sizeof *ids);
    g->n_hist = n;
    g->has_pick = 0;
    return MS_OK;
}

/* Feed ids into the engine, keeping the history in step. */
static int feed(ms_generator *g, const int32_t *ids, int n, ms_err *err) {
    g->has_pick = 0;
    int rc = ms_engine_forward(g->e, ids, n, g->logits, 0, err);
    if (rc) {
        ms_generator_reset(g);
        return rc;
    }
    memcpy(g->hist + g->n_hist, ids, (size_t)n * sizeof *ids);
    g->n_hist += n;
    return MS_OK;
}

int ms_generator_decode_greedy(ms_generator *g, int32_t id, ms_err *err) {
    if (g->n_hist >= g->cap) return feed(g, &id, 1, err); /* the engine names the full context */
    int32_t next = -1;
    int rc = ms_engine_decode_greedy(g->e, id, &next, err);
    if (rc == MS_ERR_UNSUPPORTED) return feed(g, &id, 1, err); /* nothing done: forward with the logits */
    if (rc) {
        ms_generator_reset(g);
        return rc;
    }
    g->hist[g->n_hist++] = id;
    g->has_pick = 1;
    g->pick = next;
    return MS_OK;
}

int ms_generator_prefill_begin(ms_generator *g, const int32_t *prompt, int n, int *cached, ms_err *err) {
    *cached = 0;
    if (n < 1) return ms_fail(err, MS_ERR_ARG, "prompt is empty");
    if (n > ms_engine_max_ctx(g->e))
        return ms_fail(err, MS_ERR_LIMIT, "prompt of %d tokens does not fit the context of %d", n, ms_engine_max_ctx(g->e));
    int common = 0;
    while (common < n && common < g->n_hist && g->hist[common] == prompt[common]) common++;
    if (common == n) common = n - 1; /* the last prompt token is fed again for its logits */
    int rc, truncatable = ms_engine_can_truncate(g->e);
    if (truncatable && g->snaps.longest && g->snaps.restore && n > 1 && g->snaps.longest(g->snaps.user, prompt, n - 1) > common) {
        /* a saved state (e.g. from disk after a restart) reuses more than the history */
        ms_generator_reset(g);
        common = 0;
        truncatable = 0; /* take the snapshot path below */
    }
    if (common < g->n_hist) {
        if (truncatable) {
            if ((rc = ms_engine_truncate(g->e, common, err))) return rc;
            g->n_hist = common;
        } else {
            ms_generator_reset(g);
            common = 0;
        }
    }
    if (!truncatable && common == 0 && n > 1 && g->snaps.restore) {
        /* an empty engine: the longest saved prefix of the prompt (any earlier request's) */
        int restored = 0;
        ms_generator_reset(g);
        if ((rc = g->snaps.restore(g->snaps.user, g->e, prompt, n - 1, &restored, err))) {
            ms_generator_reset(g);
            return rc;
        }
        if (restored < 0 || restored > n - 1 || ms_engine_n_past(g->e) != restored) {
            ms_generator_reset(g);
            return ms_fail(err, MS_ERR_MISMATCH, "snapshot restore gave %d tokens (engine holds %d) for a prompt of %d",
                           restored, ms_engine_n_past(g->e), n);
        }
        memcpy(g->hist, prompt, (size_t)restored * sizeof *prompt);
        g->n_hist = restored;
        common = restored;
    }
    *cached = common;
    return MS_OK;
}

/* Checkpoints (ms_gen_snapshots.every / at_boundaries) apply to this generator's engine. */
static int checkpointing(const ms_generator *g) {
    return g->snaps.save && (g->snaps.every > 0 || (g->snaps.at_boundaries && g->t)) && !ms_engine_can_truncate(g->e);
}

/* The first checkpoint position q in (from, limit] of prompt[0..n) (q < n), or 0: a multiple of
 * every, or a message boundary (a special token after a plain one) at least gap positions after
 * the checkpoint before it. Depends only on prompt[0..q], so every prompt sharing that prefix has
 * the same checkpoints up to q. */
static int next_checkpoint(const ms_generator *g, const int32_t *prompt, int n, int from, int limit) {
    int every = g->snaps.every, gap = every / 16 > 16 ? every / 16 : 16;
    if (limit > n - 1) limit = n - 1;
    int last = every > 0 ? from - from % every : 0; /* the previous checkpoint at or below from */
    if (g->snaps.at_boundaries && g->t) {
        /* the boundary checkpoints before from: replay the rule from the last multiple of every */
        for (int q = last + 1; q <= from; q++)
            if (q - last >= gap && ms_tok_is_special(g->t, prompt[q]) && !ms_tok_is_special(g->t, prompt[q - 1])) last = q;
    }
    for (int q = from + 1; q <= limit; q++) {
        if (every > 0 && q % every == 0) return q;
        if (g->snaps.at_boundaries && g->t && q - last >= gap && ms_tok_is_special(g->t, prompt[q]) &&
            !ms_tok_is_special(g->t, prompt[q - 1]))
            return q;
    }
    return 0;
}

int ms_generator_prefill_continue(ms_generator *g, const int32_t *prompt, int n, int max_feed, int *left, ms_err *err) {
    *left = 0;
    if (g->n_hist >= n || max_feed < 1)
        return ms_fail(err, MS_ERR_ARG, "prefill continue: %d of %d prompt tokens fed (chunk %d)", g->n_hist, n, max_feed);
    int k = n - g->n_hist < max_feed ? n - g->n_hist : max_feed, rc, ck = 0, cp = checkpointing(g);
    if (cp && max_feed < n && k > max_feed - g->n_hist % max_feed)
        k = max_feed - g->n_hist % max_feed; /* pieces end at multiples of max_feed: the same after a restore */
    if (cp && (ck = next_checkpoint(g, prompt, n, g->n_hist, g->n_hist + k))) k = ck - g->n_hist;
    if ((rc = feed(g, prompt + g->n_hist, k, err))) return rc;
    *left = n - g->n_hist;
    if ((!*left || ck) && g->snaps.save && (rc = g->snaps.save(g->snaps.user, g->e, g->hist, g->n_hist, err))) return rc;
    if (ck) g->checkpoints++;
    return MS_OK;
}

int ms_generator_checkpoints(const ms_generator *g) { return g->checkpoints; }

int ms_generator_prefill(ms_generator *g, const int32_t *prompt, int n, int *cached, float *logits, ms_err *err) {
    int left, rc = ms_generator_prefill_begin(g, prompt, n, cached, err);
    left = n;
    while (!rc && left) rc = ms_generator_prefill_continue(g, prompt, n, n, &left, err); /* pieces end at checkpoints */
    if (rc) return rc;
    if (logits) memcpy(logits, g->logits, (size_t)g->vocab * sizeof *logits);
    return MS_OK;
}

ms_engine *ms_generator_engine(const ms_generator *g) { return g->e; }

int ms_generator_accept(ms_generator *g, int32_t id, const float *logits, ms_err *err) {
    if (g->n_hist >= g->cap || ms_engine_n_past(g->e) != g->n_hist + 1) {
        int np = ms_engine_n_past(g->e);
        ms_generator_reset(g);
        return ms_fail(err, MS_ERR_ARG, "accept: the engine holds %d tokens, the history %d (context %d)", np,
                       g->n_hist, g->cap);
    }
    g->hist[g->n_hist++] = id;
    memcpy(g->logits, logits, (size_t)g->vocab * sizeof *logits);
    g->has_pick = 0;
    return MS_OK;
}

/* Pass text through the stop matcher to the callback. */
static int emit(ms_stopper *st, int32_t id, const char *text, size_t len, ms_gen_token_fn fn, void *user, int *hit,
                int *abort_, ms_err *err) {
    const char *o;
    size_t ol;
    int rc = ms_stopper_feed(st, text, len, &o, &ol, hit, err);
    if (rc) return rc;
    if (fn && fn(user, id, o, ol)) *abort_ = 1;
    return MS_OK;
}

/* One request in flight on a generator (ms_gen_run_*): the sampler, stop matcher and
 * streaming detokenizer, and where the loop of ms_generate stands. */
struct ms_gen_run {
    ms_generator *g;
    const int32_t *prompt;
    int32_t *own; /* the canonical prompt when it differs from the caller's */
    int n;
    ms_gen_params p;
    ms_gen_token_fn fn;
    void *user;
    ms_sampler *sp;
    ms_stopper *st;
    ms_tok_stream ts;
    ms_gen_result res;
    int begun, prefilled, hit, abort_, done;
    /* constrained decoding */
    const ms_gen_constraint *c;
    ms_matcher *m;
    uint32_t *mask;  /* [mask words] */
    float *mlog;     /* [vocab] masked logits */
    int greedy;      /* ids need no logits (ms_gen_run_greedy) */
    int phase;       /* 0 prefix, 1 grammar, 2 suffix */
    int pos;         /* forced ids emitted in the current phase */
    int64_t sv;      /* ids the sampler covers (the tokenizer's, at most the logits) */
};

int ms_gen_run_new(ms_generator *g, const int32_t *prompt, int n, const ms_gen_params *p, ms_gen_token_fn fn,
                   void *user, ms_gen_run **out, ms_err *err) {
    *out = NULL;
    if (p->max_tokens < 1) return ms_fail(err, MS_ERR_ARG, "max_tokens must be >= 1, got %d", p->max_tokens);
    if (p->n_eos < 0 || (p->n_eos && !p->eos_ids)) return ms_fail(err, MS_ERR_ARG, "bad eos id list");
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= g->vocab)
            return ms_fail(err, MS_ERR_ARG, "prompt token %d at %d is outside the vocabulary [0, %lld)", prompt[i], i,
                           (long long)g->vocab);
    if (!g->t && p->n_stop) return ms_fail(err, MS_ERR_ARG, "stop strings need a tokenizer (the generator has none)");
    ms_gen_run *r = calloc(1, sizeof *r);
    if (!r) return ms_fail(err, MS_ERR_NOMEM, "generate: out of memory");
    r->g = g, r->prompt = prompt, r->n = n, r->p = *p, r->fn = fn, r->user = user;
    int rc0 = ms_generator_canon(g, prompt, n, &r->own, &r->n, err);
    if (rc0) {
        free(r);
        return rc0;
    }
    if (r->own) r->prompt = r->own;
    ms_tok_stream_init(&r->ts, g->t, p->decode_flags);
    /* models pad their vocabulary past the tokenizer's (Qwen3: 151936 logits, 151669 tokens):
     * ids without text are never sampled */
    int64_t sv = g->vocab;
    if (g->t && (int64_t)ms_tok_vocab_size(g->t) < sv) sv = ms_tok_vocab_size(g->t);
    r->sv = sv;
    const ms_sampler_params *sp = &p->sampling;
    r->greedy = !p->host_logits && sp->temperature == 0 && sp->repetition_penalty == 1.0 && sp->presence_penalty == 0 &&
                sp->frequency_penalty == 0 && !sp->n_bias && !p->logprob_fn && !p->constraint && !p->forced_ids;
    int rc = ms_sampler_new(&p->sampling, sv, &r->sp, err);
    if (!rc && (p->top_logprobs < 0 || p->top_logprobs > MS_GEN_TOP_LOGPROBS_MAX))
        rc = ms_fail(err, MS_ERR_ARG, "top_logprobs must be in [0, %d], got %d", MS_GEN_TOP_LOGPROBS_MAX, p->top_logprobs);
    if (!rc) rc = ms_stopper_new(p->stop, p->n_stop, &r->st, err);
    const ms_gen_constraint *c = p->constraint;
    if (!rc && c) {
        r->c = c;
        if (c->n_prefix < 0 || c->n_suffix < 0 || (c->n_prefix && !c->prefix_ids) || (c->n_suffix && !c->suffix_ids))
            rc = ms_fail(err, MS_ERR_ARG, "constraint: bad forced id lists");
        for (int i = 0; !rc && i < c->n_prefix + c->n_suffix; i++) {
            int32_t id = i < c->n_prefix ? c->prefix_ids[i] : c->suffix_ids[i - c->n_prefix];
            if (id < 0 || id >= g->vocab) rc = ms_fail(err, MS_ERR_ARG, "constraint: forced id %d is outside the vocabulary", id);
        }
        if (!rc && c->grammar) {
            if (!c->vocab || (int64_t)ms_gvocab_size(c->vocab) != g->vocab)
                rc = ms_fail(err, MS_ERR_ARG, "constraint: the grammar vocabulary must have the model's %lld ids",
                             (long long)g->vocab);
            if (!rc) rc = ms_matcher_new(c->grammar, c->vocab, &r->m, err);
            if (!rc) {
                r->mask = malloc(ms_gvocab_mask_words(c->vocab) * sizeof *r->mask);
                r->mlog = malloc((size_t)g->vocab * sizeof *r->mlog);
                if (!r->mask || !r->mlog) rc = ms_fail(err, MS_ERR_NOMEM, "constraint: out of memory");
            }
        }
        r->phase = c->n_prefix ? 0 : c->grammar ? 1 : 2;
    }
    if (rc) {
        ms_gen_run_free(r);
        return rc;
    }
    *out = r;
    return MS_OK;
}

void ms_gen_run_free(ms_gen_run *r) {
    if (!r) return;
    ms_tok_stream_free(&r->ts);
    ms_sampler_free(r->sp);
    ms_stopper_free(r->st);
    ms_matcher_free(r->m);
    free(r->mask);
    free(r->mlog);
    free(r->own);
    free(r);
}

/* Constrained decoding: the next id (*id), or *end = 1 when the constraint is complete. */
static int constrained_next(ms_gen_run *r, int32_t *id, int *end, ms_err *err) {
    const ms_gen_constraint *c = r->c;
    ms_generator *g = r->g;
    int rc;
    *end = 0;
    if (r->phase == 0) {
        *id = c->prefix_ids[r->pos++];
        if (r->pos >= c->n_prefix) r->phase = c->grammar ? 1 : 2, r->pos = 0;
        return MS_OK;
    }
    if (r->phase == 1) {
        if ((rc = ms_matcher_mask(r->m, r->mask, err))) return rc;
        int any = 0;
        for (int64_t i = 0; i < g->vocab; i++) {
            int ok = (r->mask[i >> 5] >> (i & 31)) & 1;
            r->mlog[i] = ok ? g->logits[i] : -INFINITY;
            any |= ok;
        }
        /* the sampler covers only the tokenizer's ids; mask bits past it are never set for
         * tokens without text (ms_gvocab_new), so "any" stands */
        if (!any) return ms_fail(err, MS_ERR_LIMIT, "constraint: the grammar allows no token here");
        if ((rc = ms_sampler_sample(r->sp, r->mlog, id, err))) return rc;
        if (!((r->mask[*id >> 5] >> (*id & 31)) & 1))
            return ms_fail(err, MS_ERR_ARG, "constraint: sampled id %d outside the mask", *id);
        if ((rc = ms_matcher_accept(r->m, *id, err))) return rc;
        if (ms_matcher_ended(r->m)) { /* a stop token: the document is complete */
            if (!c->n_suffix) return MS_OK; /* the EOS path ends the generation */
            r->phase = 2, r->pos = 0;
        } else {
            if (ms_matcher_closed(r->m)) r->phase = 2, r->pos = 0;
            return MS_OK;
        }
    }
    if (r->pos >= c->n_suffix) { *end = 1; return MS_OK; }
    *id = c->suffix_ids[r->pos++];
    return MS_OK;
}

/* logprob_fn for the sampled id: log-softmax of the raw logits over the sampler's ids, and
 * the top_logprobs most likely (ties: lower id). */
static void report_logprobs(ms_gen_run *r, int32_t id) {
    const float *l = r->g->logits;
    int64_t V = r->sv;
    int k = r->p.top_logprobs;
    int32_t ti[MS_GEN_TOP_LOGPROBS_MAX];
    float tl[MS_GEN_TOP_LOGPROBS_MAX];
    int n = 0;
    float mx = -INFINITY;
    for (int64_t i = 0; i < V; i++) {
        float x = l[i];
        if (x > mx) mx = x;
        if (k && (n < k || x > tl[n - 1])) {
            int j = n < k ? n++ : k - 1;
            while (j > 0 && tl[j - 1] < x) ti[j] = ti[j - 1], tl[j] = tl[j - 1], j--;
            ti[j] = (int32_t)i, tl[j] = x;
        }
    }
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += exp((double)l[i] - mx);
    double lse = (double)mx + log(sum);
    for (int j = 0; j < n; j++) tl[j] = (float)((double)tl[j] - lse);
    float lp = id >= 0 && id < V ? (float)((double)l[id] - lse) : -INFINITY;
    r->p.logprob_fn(r->user, id, lp, ti, tl, n);
}

int ms_gen_run_prefill(ms_gen_run *r, int max_feed, int *left, ms_err *err) {
    int rc;
    *left = 0;
    if (r->prefilled) return MS_OK;
    if (!r->begun) {
        if ((rc = ms_generator_prefill_begin(r->g, r->prompt, r->n, &r->res.cached_tokens, err))) return rc;
        r->begun = 1;
    }
    if ((rc = ms_generator_prefill_continue(r->g, r->prompt, r->n, max_feed, left, err))) return rc;
    if (!*left) {
        r->prefilled = 1;
        r->res.prompt_tokens = r->n;
        ms_sampler_add_prompt(r->sp, r->prompt, r->n);
    }
    return MS_OK;
}

int ms_gen_run_next(ms_gen_run *r, int32_t *feed_id, int *done, ms_err *err) {
    ms_generator *g = r->g;
    const ms_gen_params *p = &r->p;
    ms_gen_result *res = &r->res;
    int rc;
    *done = 1;
    if (r->done) return MS_OK;
    if (!r->prefilled) return ms_fail(err, MS_ERR_ARG, "generate: the prompt is not prefilled yet");
    int32_t id = -1; /* set by every branch below that does not end the run */
    int use_pick = g->has_pick && r->greedy && g->pick >= 0 && g->pick < r->sv;
    if (g->has_pick && !use_pick) { /* the engine's pick does not serve (an id past the sampler's): the logits */
        if ((rc = ms_engine_greedy_logits(g->e, g->logits, err))) return rc;
        g->has_pick = 0;
    }
    if (use_pick) {
        id = g->pick; /* the sampler's greedy choice: the first largest logit */
    } else if (r->c) {
        int end = 0;
        if (r->phase == 2 && r->pos >= r->c->n_suffix) end = 1;
        else if ((rc = constrained_next(r, &id, &end, err))) return rc;
        if (end) { res->finish = MS_FINISH_STOP; goto end; }
    } else if (p->forced_ids) {
        if (res->completion_tokens >= p->n_forced) { res->finish = MS_FINISH_STOP; goto end; }
        id = p->forced_ids[res->completion_tokens];
        if (id < 0 || id >= g->vocab) return ms_fail(err, MS_ERR_ARG, "forced id %d is outside the vocabulary", id);
    } else if ((rc = ms_sampler_sample(r->sp, g->logits, &id, err))) {
        return rc;
    }
    res->completion_tokens++;
    ms_sampler_add_output(r->sp, id);
    int is_eos = 0;
    for (int i = 0; i < p->n_eos; i++) is_eos |= p->eos_ids[i] == id;
    if (is_eos) {
        res->finish = MS_FINISH_STOP;
        if (r->fn && r->fn(r->user, id, "", 0)) res->finish = MS_FINISH_ABORT;
        goto end;
    }
    if (p->logprob_fn) report_logprobs(r, id);
    const char *txt = "";
    size_t tl = 0;
    if (g->t && (rc = ms_tok_stream_feed(&r->ts, id, &txt, &tl, err))) return rc;
    if ((rc = emit(r->st, id, txt, tl, r->fn, r->user, &r->hit, &r->abort_, err))) return rc;
    if (r->hit) { res->finish = MS_FINISH_STOP; goto end; }
    if (r->abort_) { res->finish = MS_FINISH_ABORT; goto end; }
    if (r->c && r->phase == 2 && r->pos >= r->c->n_suffix) { res->finish = MS_FINISH_STOP; goto end; } /* complete */
    if (res->completion_tokens >= p->max_tokens || g->n_hist >= ms_engine_max_ctx(g->e)) {
        res->finish = MS_FINISH_LENGTH;
        goto end;
    }
    *feed_id = id;
    *done = 0;
    return MS_OK;
end:
    r->done = 1;
    return MS_OK;
}

int ms_gen_run_finish(ms_gen_run *r, ms_gen_result *res, ms_err *err) {
    int rc = MS_OK;
    if (r->done && r->res.finish != MS_FINISH_ABORT && !r->hit) {
        /* release what the detokenizer and the stop matcher held back */
        const char *txt = "", *o;
        size_t tl = 0, ol;
        if (r->g->t && (rc = ms_tok_stream_flush(&r->ts, &txt, &tl, err))) goto out;
        if (tl && !r->hit) {
            if ((rc = ms_stopper_feed(r->st, txt, tl, &o, &ol, &r->hit, err))) goto out;
            if (ol && r->fn) r->fn(r->user, -1, o, ol);
            if (r->hit) r->res.finish = MS_FINISH_STOP;
        }
        if (!r->hit) {
            ms_stopper_flush(r->st, &o, &ol);
            if (ol && r->fn) r->fn(r->user, -1, o, ol);
        }
    }
out:
    /* the state after the reply (prompt + generated ids, the last sampled one not fed): the
     * next turn of the conversation extends it */
    if (!rc && r->done && r->g->snaps.save && r->res.completion_tokens > 0 && r->g->n_hist > r->n &&
        ms_engine_n_past(r->g->e) == r->g->n_hist)
        rc = r->g->snaps.save(r->g->snaps.user, r->g->e, r->g->hist, r->g->n_hist, err);
    if (res) *res = r->res;
    return rc;
}

const ms_gen_result *ms_gen_run_result(const ms_gen_run *r) { return &r->res; }
int ms_gen_run_greedy(const ms_gen_run *r) { return r->greedy; }
ms_generator *ms_gen_run_generator(const ms_gen_run *r) { return r->g; }

int ms_generate(ms_generator *g, const int32_t *prompt, int n, const ms_gen_params *p, ms_gen_token_fn fn,
                void *user, ms_gen_result *res, ms_err *err) {
    memset(res, 0, sizeof *res);
    ms_gen_run *r;
    int rc = ms_gen_run_new(g, prompt, n, p, fn, user, &r, err), left, done = 0;
    if (rc) return rc;
    const ms_progress *pp = p->prefill_progress && p->prefill_progress->fn ? p->prefill_progress : NULL;
    if (!pp || r->n < MS_GEN_PROGRESS_MIN) {
        do { /* r->n: the canonical prompt; pieces end at checkpoints */
            if ((rc = ms_gen_run_prefill(r, 1 << 30, &left, err))) goto fail;
        } while (left);
    } else { /* a long prompt: in pieces, each reported, from 0 (the prefix reuse applied first) */
        if ((rc = ms_generator_prefill_begin(g, r->prompt, r->n, &r->res.cached_tokens, err))) goto fail;
        r->begun = 1;
        int total = r->n - r->res.cached_tokens, show = total >= MS_GEN_PROGRESS_MIN;
        if (show) ms_progress_report(pp, "prefill", MS_PROGRESS_TOKENS, 0, (uint64_t)total);
        do {
            if ((rc = ms_gen_run_prefill(r, MS_GEN_PROGRESS_CHUNK, &left, err))) goto fail;
            if (show)
                ms_progress_report(pp, "prefill", MS_PROGRESS_TOKENS, (uint64_t)(total > left ? total - left : 0),
                                   (uint64_t)total);
        } while (left);
    }
    for (;;) {
        int32_t id;
        if ((rc = ms_gen_run_next(r, &id, &done, err))) goto fail;
        if (done) break;
        if ((rc = r->greedy ? ms_generator_decode_greedy(g, id, err) : feed(g, &id, 1, err))) goto fail;
    }
    rc = ms_gen_run_finish(r, res, err);
    ms_gen_run_free(r);
    return rc;
fail: /* as before: the counts so far, no flush */
    *res = r->res;
    ms_gen_run_free(r);
    return rc;
}
