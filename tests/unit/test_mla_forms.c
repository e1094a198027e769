/* test_mla_forms.c — MLA prefill in the expanded form (per-head K/V up-projected
 * from the latent cache, engine/attention.c) against the absorbed form and
 * against the transformers references of the tests/data fixtures: random prompts
 * at several chunk sizes n and context lengths T (past one key block of
 * MS_MLA_KEY_BLOCK = 256, so the running softmax crosses blocks), dense MLA,
 * MLA without q_lora, DSA (sparse) MLA and gated NoPE MLA. */
#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "fixture.h"
#include "test.h"

static double max_mag(const float *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

static ms_engine *engine(ms_model *m, ms_pool *pool, int max_batch, ms_mla_form form) {
    ms_engine_opts o = {.max_ctx = 640, .max_batch = max_batch, .pool = pool, .mla_form = form};
    ms_engine *e = NULL;
    ms_err err = {0};
    int rc = ms_engine_create(m, &o, &e, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    return rc ? NULL : e;
}

/* A prefix of `past` random tokens, then a chunk of n: the chunk's logits of both forms agree. */
static void compare_forms(const char *dir, ms_pool *pool, int past, int n, uint64_t seed) {
    ms_model m;
    ms_err err = {0};
    int rc = ms_model_load(dir, &m, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    if (rc) return;
    int maxb = n > past ? n : (past > 0 ? past : 1);
    ms_engine *ea = engine(&m, pool, maxb, MS_MLA_ABSORBED), *ex = engine(&m, pool, maxb, MS_MLA_EXPANDED);
    int64_t V = m.cfg.vocab;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(past + n));
    float *la = malloc(sizeof(float) * (size_t)n * V), *lx = malloc(sizeof(float) * (size_t)n * V);
    if (!ea || !ex || !tok || !la || !lx) goto out;
    for (int i = 0; i < past + n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((seed >> 33) % (uint64_t)V);
    }
    if (past) {
        CHECK(ms_engine_forward(ea, tok, past, NULL, 0, &err) == MS_OK);
        CHECK(ms_engine_forward(ex, tok, past, NULL, 0, &err) == MS_OK);
    }
    CHECK(ms_engine_forward(ea, tok + past, n, la, 1, &err) == MS_OK);
    CHECK(ms_engine_forward(ex, tok + past, n, lx, 1, &err) == MS_OK);
    const ms_engine_stats *sa = ms_engine_get_stats(ea), *sx = ms_engine_get_stats(ex);
    CHECK_MSG(sa->mla_chunks > 0 && sa->mla_expanded == 0, "%s: absorbed engine ran %llu expanded chunks", dir,
              (unsigned long long)sa->mla_expanded);
    CHECK_MSG(sx->mla_expanded > 0, "%s: the expanded form never ran (%llu MLA chunks)", dir,
              (unsigned long long)sx->mla_chunks);
    double d = ms_test_max_abs(la, lx, (int64_t)n * V), mag = max_mag(la, (int64_t)n * V);
    CHECK_MSG(d <= 1e-4 * (mag > 1 ? mag : 1), "%s past %d chunk %d: forms differ by %g (logits up to %g)", dir, past,
              n, d, mag);
out:
    free(tok);
    free(la);
    free(lx);
    ms_engine_destroy(ea);
    ms_engine_destroy(ex);
    ms_model_free(&m);
}

/* The fixture's input_ids in chunks of `chunk`, expanded form forced: the reference logits. */
static void against_reference(const char *dir, ms_pool *pool, int chunk) {
    ms_checkpoint ref;
    ms_model m;
    ms_err err = {0};
    if (ms_test_fixture_open(dir, NULL, &m, &ref)) return;
    ms_engine *e = engine(&m, pool, chunk, MS_MLA_EXPANDED);
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids"), *lg = ms_checkpoint_find(&ref, "logits");
    CHECK(e && in && lg);
    if (e && in && lg) {
        int64_t V = m.cfg.vocab;
        int n_in = (int)in->nelem;
        float *buf = malloc(sizeof(float) * (size_t)n_in * V);
        double worst = 0;
        for (int s = 0; s < n_in; s += chunk) {
            int k = n_in - s < chunk ? n_in - s : chunk;
            CHECK(ms_engine_forward(e, (const int32_t *)in->data + s, k, buf, 1, &err) == MS_OK);
            double d = ms_test_max_abs(buf, (const float *)lg->data + (int64_t)s * V, (int64_t)k * V);
            if (d > worst) worst = d;
        }
        CHECK_MSG(worst < 1e-4, "%s chunks of %d: logits differ from the reference by %g", dir, chunk, worst);
        CHECK(ms_engine_get_stats(e)->mla_expanded > 0);
        free(buf);
    }
    ms_engine_destroy(e);
    ms_test_fixture_close(&m, &ref);
}

static const char *dirs[] = {
    MS_TEST_FIXTURES "deepseek_v3",  "tests/fixtures/extra/deepseek_v3_noqlora",
    MS_TEST_FIXTURES "deepseek_v32", MS_TEST_FIXTURES "kimi_k3",
    MS_TEST_FIXTURES "glm5_next",
};

TEST(forms_agree_on_random_prompts) {
    ms_pool *pool = ms_pool_create(2);
    static const int cases[][2] = {{0, 2}, {0, 37}, {5, 3}, {100, 64}, {250, 20}, {0, 300}, {290, 200}};
    for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            compare_forms(dirs[d], i % 2 ? pool : NULL, cases[i][0], cases[i][1], 1000 + d * 31 + i);
    ms_pool_destroy(pool);
}

TEST(expanded_matches_reference) {
    ms_pool *pool = ms_pool_create(2);
    for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++) {
        against_reference(dirs[d], pool, 40);
        against_reference(dirs[d], NULL, 7);
    }
    ms_pool_destroy(pool);
}

TEST_MAIN()
