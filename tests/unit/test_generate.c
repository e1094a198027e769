/* Sampler distributions against closed forms (temperature, top_k, top_p, min_p,
 * OpenAI penalties, transformers' repetition penalty), empirical draws within
 * binomial bounds, seed reproducibility, stop-string hold-back against a
 * whole-text search (memmem) over random splits, EOS ids from the fixtures'
 * configs, greedy generation == the fixtures' transformers gen_ids, and prefix
 * reuse (rollback for GQA/MLA, reset or a snapshot hook for KDA) giving the
 * fixtures' reference logits and logits bit-identical to a fresh engine. */
#include <stdint.h>

#include "session/generate.h"
#include "io/safetensors.h"
#include "text/tokenizer.h"
#include "test.h"

static double *probs_of(const ms_sampler_params *p, const float *logits, int V, void (*hist)(ms_sampler *)) {
    ms_sampler *s;
    ms_err err = {0};
    if (ms_sampler_new(p, V, &s, &err)) { CHECK_MSG(0, "%s", err.msg); return NULL; }
    if (hist) hist(s);
    double *pr = malloc(sizeof(double) * V);
    CHECK(ms_sampler_probs(s, logits, pr, &err) == 0);
    ms_sampler_free(s);
    return pr;
}

static void check_probs(const double *got, const double *want, int V, const char *what) {
    for (int i = 0; i < V; i++) CHECK_MSG(fabs(got[i] - want[i]) < 1e-12, "%s: p[%d] %.15g vs %.15g", what, i, got[i], want[i]);
}

/* logits = log p for p = [0.4, 0.3, 0.2, 0.1] (softmax at T=1 gives p back) */
static const double k_p[4] = {0.4, 0.3, 0.2, 0.1};

TEST(sampler_closed_forms) {
    float lg[4];
    for (int i = 0; i < 4; i++) lg[i] = (float)log(k_p[i]);
    double want[4], *got;
    ms_sampler_params p;
    /* T = 1: p itself (float logits: 1e-7 relative) */
    ms_sampler_defaults(&p);
    got = probs_of(&p, lg, 4, NULL);
    for (int i = 0; i < 4; i++) CHECK_NEAR(got[i], k_p[i], 1e-7);
    free(got);
    /* T = 2: p^(1/2) / sum */
    double lgd[4], z = 0;
    for (int i = 0; i < 4; i++) { lgd[i] = lg[i]; z += exp(lgd[i] / 2); }
    for (int i = 0; i < 4; i++) want[i] = exp(lgd[i] / 2) / z;
    p.temperature = 2;
    got = probs_of(&p, lg, 4, NULL);
    check_probs(got, want, 4, "T=2");
    free(got);
    /* T = 0.5: p^2 / sum */
    z = 0;
    for (int i = 0; i < 4; i++) z += exp(lgd[i] * 2);
    for (int i = 0; i < 4; i++) want[i] = exp(lgd[i] * 2) / z;
    p.temperature = 0.5;
    got = probs_of(&p, lg, 4, NULL);
    check_probs(got, want, 4, "T=0.5");
    free(got);
    /* exact masks: use logits that are exactly representable for the sums below */
    double q[4];
    z = 0;
    for (int i = 0; i < 4; i++) z += exp(lgd[i]);
    for (int i = 0; i < 4; i++) q[i] = exp(lgd[i]) / z; /* what the sampler sees at T=1 */
    struct { int k; double tp, mp; int keep; } cases[] = {
        {2, 1, 0, 2}, {1, 1, 0, 1}, {0, 0.65, 0, 2}, {0, 0.75, 0, 3}, {0, 0.35, 0, 1}, {0, 1, 0.6, 2},
        {0, 1, 0.2, 4}, {0, 1, 0.3, 3}, {3, 0.8, 0, 3}, {3, 0.7, 0, 2}, {0, 0.95, 0.4, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ms_sampler_defaults(&p);
        p.top_k = cases[c].k;
        p.top_p = cases[c].tp;
        p.min_p = cases[c].mp;
        got = probs_of(&p, lg, 4, NULL);
        double s = 0;
        for (int i = 0; i < cases[c].keep; i++) s += q[i];
        for (int i = 0; i < 4; i++) want[i] = i < cases[c].keep ? q[i] / s : 0;
        char what[64];
        snprintf(what, sizeof what, "case %zu (k %d, p %g, min_p %g)", c, cases[c].k, cases[c].tp, cases[c].mp);
        for (int i = 0; i < 4; i++) CHECK_MSG(fabs(got[i] - want[i]) < 1e-7, "%s: p[%d] %g vs %g", what, i, got[i], want[i]);
        free(got);
    }
    /* greedy: one-hot on the argmax, lowest id on ties */
    float tie[4] = {1, 3, 3, 2};
    ms_sampler_defaults(&p);
    p.temperature = 0;
    got = probs_of(&p, tie, 4, NULL);
    CHECK(got[1] == 1 && got[0] == 0 && got[2] == 0 && got[3] == 0);
    free(got);
}

/* Reference truncation by a full sort of the whole vocabulary (the definitions:
 * top_k, then top_p on the renormalized top_k, then min_p), to check the
 * sampler's partial sort on a large vocabulary. */
static const double *g_ref_p;
static int ref_cmp(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (g_ref_p[i] != g_ref_p[j]) return g_ref_p[i] > g_ref_p[j] ? -1 : 1;
    return i - j;
}
static void ref_probs(const float *lg, int V, double T, int k, double tp, double *out) {
    double mx = lg[0], z = 0;
    for (int i = 1; i < V; i++) if (lg[i] > mx) mx = lg[i];
    for (int i = 0; i < V; i++) z += out[i] = exp((lg[i] - mx) / T);
    for (int i = 0; i < V; i++) out[i] /= z;
    int *ord = malloc(sizeof(int) * V);
    for (int i = 0; i < V; i++) ord[i] = i;
    g_ref_p = out;
    qsort(ord, V, sizeof *ord, ref_cmp);
    int keep = k > 0 && k < V ? k : V;
    double s = 0;
    for (int r = 0; r < keep; r++) s += out[ord[r]];
    for (int r = keep; r < V; r++) out[ord[r]] = 0;
    for (int r = 0; r < keep; r++) out[ord[r]] /= s;
    if (tp < 1) {
        double cum = 0;
        int r = 0;
        while (r < keep) { cum += out[ord[r++]]; if (cum >= tp) break; }
        s = 0;
        for (int q = 0; q < r; q++) s += out[ord[q]];
        for (int q = r; q < keep; q++) out[ord[q]] = 0;
        for (int q = 0; q < r; q++) out[ord[q]] /= s;
    }
    free(ord);
}

TEST(sampler_large_vocab_truncation) {
    enum { V = 20000 };
    float *lg = malloc(sizeof(float) * V);
    double *want = malloc(sizeof(double) * V);
    ms_rng r;
    ms_rng_seed(&r, 99);
    for (int i = 0; i < V; i++) { /* a peaked head and a long tail, like a language model's logits */
        double u = ms_rng_uniform(&r) + 1e-12;
        lg[i] = (float)(-3 * log(u) * (i % 97 == 0 ? 2.5 : 1));
    }
    struct { double T; int k; double tp; } cs[] = {{1, 40, 1}, {1, 0, 0.9}, {0.7, 0, 0.5}, {1.3, 50, 0.95}, {1, 1, 1},
                                                   {2, 0, 0.999}, {1, 15000, 1}, {1, 0, 1e-9}};
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++) {
        ms_sampler_params p;
        ms_sampler_defaults(&p);
        p.temperature = cs[c].T;
        p.top_k = cs[c].k;
        p.top_p = cs[c].tp;
        double *got = probs_of(&p, lg, V, NULL);
        ref_probs(lg, V, cs[c].T, cs[c].k, cs[c].tp, want);
        int same_support = 1;
        double mx = 0;
        for (int i = 0; i < V; i++) {
            same_support &= (got[i] > 0) == (want[i] > 0);
            if (fabs(got[i] - want[i]) > mx) mx = fabs(got[i] - want[i]);
        }
        CHECK_MSG(same_support && mx < 1e-12, "case %zu: support %d, max diff %g", c, same_support, mx);
        free(got);
        if (c == 0) /* the rest with many ties (logits rounded to halves): ties go by id */
            for (int i = 0; i < V; i++) lg[i] = roundf(lg[i] * 2) / 2;
    }
    free(lg);
    free(want);
}

static void hist_pen(ms_sampler *s) {
    ms_sampler_add_output(s, 1);
    ms_sampler_add_output(s, 1);
    ms_sampler_add_output(s, 2);
}
static void hist_rep(ms_sampler *s) {
    int32_t pr[2] = {0, 1};
    ms_sampler_add_prompt(s, pr, 2);
}

TEST(sampler_penalties) {
    /* OpenAI: mu[j] - c[j] * alpha_frequency - (c[j] > 0) * alpha_presence */
    float lg[4] = {0, 0, 0, 0};
    ms_sampler_params p;
    ms_sampler_defaults(&p);
    p.frequency_penalty = 0.5;
    p.presence_penalty = 0.25;
    double *got = probs_of(&p, lg, 4, hist_pen);
    double l[4] = {0, -2 * 0.5 - 0.25, -0.5 - 0.25, 0}, z = 0, want[4];
    for (int i = 0; i < 4; i++) z += exp(l[i]);
    for (int i = 0; i < 4; i++) want[i] = exp(l[i]) / z;
    check_probs(got, want, 4, "penalties");
    free(got);
    /* transformers RepetitionPenaltyLogitsProcessor: score < 0 ? score * p : score / p */
    float lr[4] = {2, -2, 1, 0.5f};
    ms_sampler_defaults(&p);
    p.repetition_penalty = 2;
    got = probs_of(&p, lr, 4, hist_rep);
    double m[4] = {1, -4, 1, 0.5};
    z = 0;
    for (int i = 0; i < 4; i++) z += exp(m[i]);
    for (int i = 0; i < 4; i++) want[i] = exp(m[i]) / z;
    check_probs(got, want, 4, "repetition");
    free(got);
    /* range errors name the field */
    ms_err err = {0};
    ms_sampler *s;
    ms_sampler_defaults(&p);
    p.top_p = 0;
    CHECK(ms_sampler_new(&p, 4, &s, &err) == MS_ERR_ARG && strstr(err.msg, "top_p"));
    ms_sampler_defaults(&p);
    p.presence_penalty = 2.5;
    CHECK(ms_sampler_new(&p, 4, &s, &err) == MS_ERR_ARG && strstr(err.msg, "presence_penalty"));
}

TEST(sampler_draws_and_seeds) {
    float lg[4];
    for (int i = 0; i < 4; i++) lg[i] = (float)log(k_p[i]);
    ms_sampler_params p;
    ms_sampler_defaults(&p);
    p.seed = 1234;
    ms_sampler *a, *b, *c;
    ms_err err = {0};
    CHECK(ms_sampler_new(&p, 4, &a, &err) == 0);
    CHECK(ms_sampler_new(&p, 4, &b, &err) == 0);
    p.seed = 1235;
    CHECK(ms_sampler_new(&p, 4, &c, &err) == 0);
    enum { N = 40000 };
    int cnt[4] = {0}, same = 1, diff = 0;
    for (int i = 0; i < N; i++) {
        int32_t x, y, w;
        ms_sampler_sample(a, lg, &x, &err);
        ms_sampler_sample(b, lg, &y, &err);
        ms_sampler_sample(c, lg, &w, &err);
        cnt[x]++;
        same &= x == y;
        diff += x != w;
    }
    CHECK(same);
    CHECK(diff > N / 4);
    for (int i = 0; i < 4; i++) {
        double sd = sqrt(N * k_p[i] * (1 - k_p[i]));
        CHECK_MSG(fabs(cnt[i] - N * k_p[i]) < 5 * sd, "token %d drawn %d times, expected %g +- %g", i, cnt[i], N * k_p[i], sd);
    }
    ms_sampler_free(a);
    ms_sampler_free(b);
    ms_sampler_free(c);
}

/* Random texts over a small alphabet, random splits: the concatenated output
 * equals the text before the earliest stop string, and no output ever contains
 * a prefix of the text beyond that point. */
TEST(stop_holdback) {
    const char *stops[] = {"ab", "</s>", "aab", "b/"};
    const char alpha[] = "ab</s>x";
    ms_rng r;
    ms_rng_seed(&r, 7);
    ms_err err = {0};
    for (int it = 0; it < 3000; it++) {
        int ns = 1 + (int)(ms_rng_next(&r) % 4);
        char text[64];
        int n = (int)(ms_rng_next(&r) % 40);
        for (int i = 0; i < n; i++) text[i] = alpha[ms_rng_next(&r) % 7];
        text[n] = 0;
        size_t want = n;
        for (int k = 0; k < ns; k++) {
            const char *m = memmem(text, n, stops[k], strlen(stops[k]));
            if (m && (size_t)(m - text) < want) want = (size_t)(m - text);
        }
        ms_stopper *st;
        CHECK(ms_stopper_new(stops, ns, &st, &err) == 0);
        char got[128];
        size_t gl = 0;
        int hit = 0, pos = 0, ok = 1;
        while (pos < n && !hit) {
            int k = 1 + (int)(ms_rng_next(&r) % 5);
            if (pos + k > n) k = n - pos;
            const char *o;
            size_t ol;
            CHECK(ms_stopper_feed(st, text + pos, k, &o, &ol, &hit, &err) == 0);
            memcpy(got + gl, o, ol);
            gl += ol;
            pos += k;
            ok &= gl <= want; /* nothing past the stop point ever leaks */
        }
        if (!hit) {
            const char *o;
            size_t ol;
            ms_stopper_flush(st, &o, &ol);
            memcpy(got + gl, o, ol);
            gl += ol;
        }
        CHECK_MSG(ok && gl == want && !memcmp(got, text, want) && hit == (want < (size_t)n), "text \"%s\" (%d stops): got %zu bytes, want %zu", text, ns, gl, want);
        ms_stopper_free(st);
    }
    ms_stopper *st;
    const char *bad[] = {""};
    CHECK(ms_stopper_new(bad, 1, &st, &err) == MS_ERR_ARG);
}

TEST(eos_ids) {
    int32_t ids[8];
    int n;
    ms_err err = {0};
    CHECK(ms_gen_eos_ids(MS_TEST_FIXTURES "qwen3_moe", 512, ids, 8, &n, &err) == 0);
    CHECK(n == 1 && ids[0] == 2); /* config.json eos_token_id 2 */
    CHECK(ms_gen_eos_ids(MS_TEST_FIXTURES "qwen3_moe", 2, ids, 8, &n, &err) == MS_ERR_FORMAT);
}

typedef struct { const char *name; int can_truncate; } fixture;

/* Mock snapshot hook: save records the ids; restore replays the longest
 * recorded prefix of ids[0..n) on a reset engine (a real cache copies state). */
static int g_restores, g_nsaved, g_saved_n[16];
static int32_t g_saved[16][128];
static int mock_save(void *user, ms_engine *e, const int32_t *ids, int n, ms_err *err) {
    if (g_nsaved < 16 && n <= 128) {
        memcpy(g_saved[g_nsaved], ids, n * sizeof *ids);
        g_saved_n[g_nsaved++] = n;
    }
    return 0;
}
static int mock_restore(void *user, ms_engine *e, const int32_t *ids, int n, int *restored, ms_err *err) {
    g_restores++;
    int best = 0;
    for (int i = 0; i < g_nsaved; i++)
        if (g_saved_n[i] <= n && g_saved_n[i] > best && !memcmp(g_saved[i], ids, g_saved_n[i] * sizeof *ids)) best = g_saved_n[i];
    *restored = best;
    if (!best) return 0;
    ms_engine_reset(e);
    return ms_engine_forward(e, ids, best, NULL, 0, err);
}

typedef struct { int32_t ids[64]; int n; struct lp_rec *lp; } collected;
static int collect(void *user, int32_t id, const char *text, size_t len) {
    collected *c = user;
    if (id >= 0 && c->n < 64) c->ids[c->n++] = id;
    return 0;
}

static void max_err(const float *a, const float *b, int64_t V, double *mx) {
    *mx = 0;
    for (int64_t i = 0; i < V; i++)
        if (fabs(a[i] - b[i]) > *mx) *mx = fabs(a[i] - b[i]);
}

static void check_fixture(const fixture *f, int with_hook) {
    char dir[256], refp[300];
    snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", f->name);
    snprintf(refp, sizeof refp, "%s/reference.safetensors", dir);
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(dir, &m, &err)) { CHECK_MSG(0, "%s: %s", f->name, err.msg); return; }
    ms_checkpoint ref;
    CHECK(ms_checkpoint_open(refp, &ref, &err) == 0);
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids"), *lt = ms_checkpoint_find(&ref, "logits");
    const ms_tensor *gp = ms_checkpoint_find(&ref, "gen_prompt"), *gi = ms_checkpoint_find(&ref, "gen_ids");
    const int32_t *ids = in->data;
    int n = (int)in->shape[0];
    int64_t V = m.cfg.vocab;
    ms_engine *e, *fresh;
    ms_engine_opts o = {.max_ctx = 128};
    CHECK(ms_engine_create(&m, &o, &e, &err) == 0);
    CHECK(ms_engine_create(&m, &o, &fresh, &err) == 0);
    CHECK(ms_engine_can_truncate(e) == f->can_truncate);
    ms_gen_snapshots snaps = {.restore = mock_restore, .save = mock_save};
    g_nsaved = 0;
    ms_generator *g;
    CHECK(ms_generator_new(e, NULL, V, with_hook ? &snaps : NULL, &g, &err) == 0);
    float *lg = malloc(sizeof(float) * V), *lf = malloc(sizeof(float) * V);
    const float *ref_logits = lt->data;
    int cached;
    double mx;
    g_restores = 0;
    /* 1. a first request of 20 tokens: the reference's row 19 */
    CHECK(ms_generator_prefill(g, ids, 20, &cached, lg, &err) == 0 && cached == 0);
    max_err(lg, ref_logits + 19 * V, V, &mx);
    CHECK_MSG(mx < 1e-4, "%s: first request: max error %g", f->name, mx);
    /* 2. a prompt diverging after 20 tokens (5 foreign tokens), then 3. the full input */
    int32_t alt[25];
    memcpy(alt, ids, 20 * sizeof *ids);
    for (int i = 20; i < 25; i++) alt[i] = (ids[i] + 7) % (int32_t)V;
    CHECK(ms_generator_prefill(g, alt, 25, &cached, lg, &err) == 0);
    CHECK_MSG(cached == 20, "%s: extending the history: cached %d", f->name, cached); /* no rollback needed */
    CHECK(ms_generator_prefill(g, ids, n, &cached, lg, &err) == 0);
    CHECK_MSG(cached == (f->can_truncate || with_hook ? 20 : 0), "%s: cached %d", f->name, cached);
    max_err(lg, ref_logits + (int64_t)(n - 1) * V, V, &mx);
    CHECK_MSG(mx < 1e-4, "%s: after reuse: max error %g vs the reference", f->name, mx);
    /* a fresh engine fed the same chunks (rows are batch-size dependent in the last bits)
     * gives bit-identical logits: the 5 foreign tokens left no trace */
    int split = cached ? cached : n;
    CHECK(ms_engine_forward(fresh, ids, split, lf, 0, &err) == 0);
    if (split < n) CHECK(ms_engine_forward(fresh, ids + split, n - split, lf, 0, &err) == 0);
    CHECK_MSG(!memcmp(lf, lg, sizeof(float) * V), "%s: reused-prefix logits differ from a fresh engine's", f->name);
    /* 4. the same prompt again: rollback reuses everything but the last token; snapshots
     * the longest saved prefix shorter than the prompt (request 1's 20 tokens) */
    CHECK(ms_generator_prefill(g, ids, n, &cached, lg, &err) == 0);
    CHECK_MSG(cached == (f->can_truncate ? n - 1 : with_hook ? 20 : 0), "%s: same prompt: cached %d", f->name, cached);
    max_err(lg, ref_logits + (int64_t)(n - 1) * V, V, &mx);
    CHECK_MSG(mx < 1e-4, "%s: same prompt: max error %g", f->name, mx);
    /* 5. back to the foreign prompt: rollback keeps 20; snapshots the longest saved prefix of its first 24 (request 1's 20) */
    CHECK(ms_generator_prefill(g, alt, 25, &cached, lg, &err) == 0);
    CHECK_MSG(cached == (f->can_truncate ? 20 : with_hook ? 20 : 0), "%s: foreign prompt again: cached %d", f->name, cached);
    if (with_hook) CHECK(g_restores > 0);
    /* 5. greedy generation reproduces transformers' gen_ids (no EOS: the reference ignores it) */
    ms_gen_params gpar = {.max_tokens = (int)gi->shape[0]};
    ms_sampler_defaults(&gpar.sampling);
    gpar.sampling.temperature = 0;
    ms_gen_result res;
    collected col = {.n = 0};
    CHECK(ms_generate(g, gp->data, (int)gp->shape[0], &gpar, collect, &col, &res, &err) == 0);
    CHECK_MSG(col.n == gi->shape[0] && !memcmp(col.ids, gi->data, col.n * sizeof(int32_t)), "%s: greedy ids differ from gen_ids", f->name);
    int nh;
    const int32_t *h = ms_generator_history(g, &nh);
    CHECK(res.completion_tokens == gi->shape[0] && res.finish == MS_FINISH_LENGTH);
    /* the history holds the prompt and every generated token but the last (never fed) */
    CHECK(nh == gp->shape[0] + gi->shape[0] - 1);
    CHECK_MSG(!memcmp(h + gp->shape[0], gi->data, (gi->shape[0] - 1) * sizeof(int32_t)), "%s: greedy ids differ", f->name);
    ms_generator_free(g);
    ms_engine_destroy(e);
    ms_engine_destroy(fresh);
    free(lg);
    free(lf);
    ms_checkpoint_close(&ref);
    ms_model_free(&m);
}

TEST(prefix_reuse_fixtures) {
    fixture fx[] = {{"qwen3_moe", 1}, {"deepseek_v3", 1}, {"kimi_linear", 0}};
    for (size_t i = 0; i < sizeof fx / sizeof *fx; i++) check_fixture(&fx[i], 0);
    check_fixture(&fx[2], 1);
}

/* logprob_fn's values against the engine's own logits (a fresh engine fed the same ids:
 * log-softmax, top ids by value), and logit_bias steering greedy decoding */
typedef struct lp_rec {
    int n;
    int32_t id[16], top[16][5];
    float lp[16], tlp[16][5];
    int ntop[16];
} lp_rec;
static void on_lp(void *user, int32_t id, float lp, const int32_t *top, const float *tlp, int n) {
    struct lp_rec *r = ((collected *)user)->lp;
    if (r->n >= 16) return;
    r->id[r->n] = id, r->lp[r->n] = lp, r->ntop[r->n] = n;
    for (int i = 0; i < n && i < 5; i++) r->top[r->n][i] = top[i], r->tlp[r->n][i] = tlp[i];
    r->n++;
}

TEST(logprobs_and_logit_bias) {
    char dir[256];
    snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", "qwen3_moe");
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(dir, &m, &err)) { CHECK_MSG(0, "%s", err.msg); return; }
    int64_t V = m.cfg.vocab;
    ms_engine *e, *fresh;
    ms_engine_opts o = {.max_ctx = 128};
    CHECK(ms_engine_create(&m, &o, &e, &err) == 0);
    CHECK(ms_engine_create(&m, &o, &fresh, &err) == 0);
    ms_generator *g;
    CHECK(ms_generator_new(e, NULL, V, NULL, &g, &err) == 0);
    int32_t prompt[6] = {3, 17, 101, 7, 250, 9};
    ms_gen_params gp = {.max_tokens = 8, .logprob_fn = on_lp, .top_logprobs = 5};
    ms_sampler_defaults(&gp.sampling);
    gp.sampling.temperature = 0;
    lp_rec rec = {0};
    collected col = {.n = 0, .lp = &rec};
    ms_gen_result res;
    CHECK(ms_generate(g, prompt, 6, &gp, collect, &col, &res, &err) == 0);
    CHECK(rec.n == col.n && col.n == 8);
    float *lf = malloc(sizeof(float) * V);
    CHECK(ms_engine_forward(fresh, prompt, 6, lf, 0, &err) == 0);
    for (int k = 0; k < rec.n; k++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < V; i++) mx = lf[i] > mx ? lf[i] : mx;
        for (int64_t i = 0; i < V; i++) sum += exp(lf[i] - mx);
        double lse = mx + log(sum);
        CHECK(rec.id[k] == col.ids[k] && rec.ntop[k] == 5);
        CHECK_MSG(fabs(rec.lp[k] - (lf[rec.id[k]] - lse)) < 1e-4, "step %d: logprob %g vs %g", k, rec.lp[k], lf[rec.id[k]] - lse);
        CHECK(rec.top[k][0] == rec.id[k]); /* greedy: the sampled token is the most likely */
        for (int i = 0; i < 5; i++) {
            CHECK(fabs(rec.tlp[k][i] - (lf[rec.top[k][i]] - lse)) < 1e-4);
            if (i) CHECK(rec.tlp[k][i] <= rec.tlp[k][i - 1]);
            int above = 0; /* exactly i ids are more likely than the i-th */
            for (int64_t j = 0; j < V; j++) above += lf[j] > lf[rec.top[k][i]];
            CHECK_MSG(above <= i, "step %d: top %d has %d ids above it", k, i, above);
        }
        CHECK(ms_engine_forward(fresh, &col.ids[k], 1, lf, 0, &err) == 0);
    }
    /* logit_bias: +100 on the least likely first token makes greedy pick it; -100 on every
     * token of the unbiased reply keeps them all out */
    int32_t low = 0;
    {
        ms_engine *f2;
        CHECK(ms_engine_create(&m, &o, &f2, &err) == 0);
        CHECK(ms_engine_forward(f2, prompt, 6, lf, 0, &err) == 0);
        for (int64_t i = 1; i < V; i++) if (lf[i] < lf[low]) low = (int32_t)i;
        ms_engine_destroy(f2);
    }
    int32_t bid[9] = {low};
    float bv[9] = {100};
    gp.sampling.bias_ids = bid, gp.sampling.bias = bv, gp.sampling.n_bias = 1;
    gp.logprob_fn = NULL;
    collected c2 = {.n = 0};
    CHECK(ms_generate(g, prompt, 6, &gp, collect, &c2, &res, &err) == 0);
    CHECK_MSG(c2.n >= 1 && c2.ids[0] == low, "+100 bias: first id %d, want %d", c2.ids[0], low);
    for (int k = 0; k < 8; k++) bid[k] = col.ids[k], bv[k] = -100;
    gp.sampling.n_bias = 8;
    collected c3 = {.n = 0};
    CHECK(ms_generate(g, prompt, 6, &gp, collect, &c3, &res, &err) == 0);
    for (int k = 0; k < c3.n; k++)
        for (int j = 0; j < 8; j++) CHECK_MSG(c3.ids[k] != col.ids[j], "-100 bias: id %d still sampled", c3.ids[k]);
    bv[0] = NAN;
    CHECK(ms_generate(g, prompt, 6, &gp, collect, &c3, &res, &err) == MS_ERR_ARG);
    free(lf);
    ms_generator_free(g);
    ms_engine_destroy(e);
    ms_engine_destroy(fresh);
    ms_model_free(&m);
}

/* Greedy generation through the engine's pick (ms_gen_params.host_logits 0: each id forwarded
 * with ms_generator_decode_greedy, on the CPU the engine's own row picked on the host) gives the
 * ids of the logits path (host_logits 1: the sampler's greedy choice of every step's logits) and
 * of the plain loop (forward, then the first largest logit), and only the logits path hands its
 * callbacks logits after the first token; a run that needs its logits (repetition penalty) is
 * not greedy-picked. */
typedef struct { ms_generator *g; int32_t ids[64]; int n, null_logits; } picked;
static int collect_pick(void *user, int32_t id, const char *text, size_t len) {
    picked *c = user;
    if (id < 0) return 0;
    if (c->n < 64) c->ids[c->n++] = id;
    c->null_logits += ms_generator_logits(c->g) == NULL;
    return 0;
}
/* A byte-level BPE tokenizer of the 256 byte tokens (ids = byte values), written to build/. */
static ms_tokenizer *byte_tokenizer(void) {
    const char *dir = "build/tokenizers/bytes256";
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (system("mkdir -p build/tokenizers/bytes256")) return NULL;
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fputs("{\"version\":\"1.0\",\"added_tokens\":[],\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
          "\"use_regex\":true},\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"merges\":[],\"vocab\":{", f);
    int extra = 0;
    for (int b = 0; b < 256; b++) { /* GPT-2's bytes_to_unicode: printable bytes are themselves */
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : 256 + extra++;
        fputs(b ? ",\"" : "\"", f);
        if (cp == '"' || cp == '\\') fputc('\\', f);
        if (cp < 0x80) fputc(cp, f);
        else fputc(0xC0 | (cp >> 6), f), fputc(0x80 | (cp & 0x3F), f);
        fprintf(f, "\":%d", b);
    }
    fputs("}}}", f);
    fclose(f);
    ms_tokenizer *t = NULL;
    ms_err err = {0};
    CHECK_MSG(ms_tok_load_dir(dir, &t, &err) == 0 && ms_tok_vocab_size(t) == 256, "%s", err.msg);
    return t;
}

TEST(greedy_engine_pick) {
    char dir[256];
    snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", "qwen3_moe");
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(dir, &m, &err)) { CHECK_MSG(0, "%s", err.msg); return; }
    int64_t V = m.cfg.vocab;
    enum { N = 40 };
    ms_engine *e, *ref;
    ms_engine_opts o = {.max_ctx = 128};
    CHECK(ms_engine_create(&m, &o, &e, &err) == 0 && ms_engine_create(&m, &o, &ref, &err) == 0);
    int32_t prompt[5] = {1, 2, 3, 4, 5}, want[N];
    float *lf = malloc(sizeof(float) * V);
    CHECK(ms_engine_forward(ref, prompt, 5, lf, 0, &err) == 0);
    for (int k = 0; k < N; k++) { /* the plain loop */
        int32_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (lf[i] > lf[best]) best = (int32_t)i;
        want[k] = best;
        if (k + 1 < N) CHECK(ms_engine_forward(ref, &best, 1, lf, 0, &err) == 0);
    }
    ms_generator *g;
    CHECK(ms_generator_new(e, NULL, V, NULL, &g, &err) == 0);
    ms_gen_params gp = {.max_tokens = N};
    ms_sampler_defaults(&gp.sampling);
    gp.sampling.temperature = 0;
    ms_gen_result res;
    for (int host = 1; host >= 0; host--) {
        gp.host_logits = host;
        picked c = {.g = g};
        ms_generator_reset(g);
        CHECK_MSG(ms_generate(g, prompt, 5, &gp, collect_pick, &c, &res, &err) == 0, "%s", err.msg);
        CHECK_MSG(c.n == N && !memcmp(c.ids, want, sizeof want), "host_logits %d: ids differ from the plain loop", host);
        CHECK_MSG(c.null_logits == (host ? 0 : N - 1), "host_logits %d: %d callbacks without logits", host,
                  c.null_logits);
        CHECK(res.completion_tokens == N && res.finish == MS_FINISH_LENGTH);
    }
    /* a tokenizer of 256 byte tokens under the fixture's 512 logits: a pick past them falls back to
     * the step's logits (ms_engine_greedy_logits), and both runs give the sampler's ids over [0, 256) */
    ms_tokenizer *t = byte_tokenizer();
    ms_generator *gt = NULL;
    CHECK(t && ms_generator_new(e, t, V, NULL, &gt, &err) == 0);
    int32_t tids[2][N];
    int nulls = 0;
    for (int host = 1; gt && host >= 0; host--) {
        gp.host_logits = host;
        picked c = {.g = gt};
        ms_generator_reset(gt);
        CHECK_MSG(ms_generate(gt, prompt, 5, &gp, collect_pick, &c, &res, &err) == 0, "%s", err.msg);
        CHECK(c.n == N);
        memcpy(tids[host], c.ids, sizeof tids[host]);
        for (int k = 0; k < N; k++) CHECK(c.ids[k] < 256);
        nulls = c.null_logits;
    }
    if (gt) {
        CHECK_MSG(!memcmp(tids[0], tids[1], sizeof tids[0]), "256-token tokenizer: ids differ with the engine's pick");
        /* both kinds of step happened: picks that served, and picks past the tokenizer's ids */
        CHECK_MSG(nulls > 0 && nulls < N - 1, "256-token tokenizer: %d of %d steps took the engine's pick", nulls, N - 1);
    }
    ms_generator_free(gt);
    ms_tok_free(t);
    /* a repetition penalty reads the logits: the run forwards with them (never NULL) */
    gp.host_logits = 0;
    gp.sampling.repetition_penalty = 1.3;
    picked c = {.g = g};
    ms_generator_reset(g);
    CHECK(ms_generate(g, prompt, 5, &gp, collect_pick, &c, &res, &err) == 0 && c.n == N && c.null_logits == 0);
    free(lf);
    ms_generator_free(g);
    ms_engine_destroy(e);
    ms_engine_destroy(ref);
    ms_model_free(&m);
}

TEST_MAIN()
