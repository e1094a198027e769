/* test_dsa_engine.c — DeepSeek Sparse Attention in the engine against the
 * transformers references of the tests/data fixtures, on paths `moonshine verify`
 * does not take: prefill in small chunks, a prompt fed in pieces, and decode
 * whose tied top-k choices must be redone as the sequence grows (the reference
 * recomputes every step; deepseek_v32, deepseek_v32_topk4 and glm5_next_s2 need replays). */
#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "test.h"

static void run_fixture(const char *dir, int max_batch, int threads, int piece) {
    char path[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ms_checkpoint ref;
    ms_model m;
    ms_err err = {0};
    int rc = ms_checkpoint_open(path, &ref, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    if (rc) return;
    rc = ms_model_load(dir, &m, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    if (rc) {
        ms_checkpoint_close(&ref);
        return;
    }
    ms_pool *pool = threads > 1 ? ms_pool_create(threads) : NULL;
    ms_engine_opts o = {.max_ctx = 128, .max_batch = max_batch, .pool = pool};
    ms_engine *e = NULL;
    rc = ms_engine_create(&m, &o, &e, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids"), *lg = ms_checkpoint_find(&ref, "logits");
    const ms_tensor *gp = ms_checkpoint_find(&ref, "gen_prompt"), *gi = ms_checkpoint_find(&ref, "gen_ids");
    const ms_tensor *gl = ms_checkpoint_find(&ref, "gen_logits");
    CHECK(in && lg && gp && gi && gl);
    if (rc || !(in && lg && gp && gi && gl)) goto out;
    int64_t V = m.cfg.vocab;
    int n_in = (int)in->nelem, n_gp = (int)gp->nelem, n_gen = (int)gi->nelem;
    float *buf = malloc(sizeof(float) * (size_t)n_in * V);
    CHECK(ms_engine_forward(e, in->data, n_in, buf, 1, &err) == MS_OK);
    double e1 = ms_test_max_abs(buf, lg->data, (int64_t)n_in * V);
    CHECK_MSG(e1 < 1e-4, "%s (batch %d): prefill logits differ by %g", dir, max_batch, e1);
    /* the prompt in pieces of `piece` tokens, then one token at a time */
    ms_engine_reset(e);
    const int32_t *pr = gp->data, *ids = gi->data;
    for (int s = 0; s < n_gp; s += piece) {
        int k = n_gp - s < piece ? n_gp - s : piece;
        CHECK(ms_engine_forward(e, pr + s, k, buf, 0, &err) == MS_OK);
    }
    double e2 = 0;
    int match = 1;
    for (int i = 0; i < n_gen; i++) {
        double d = ms_test_max_abs(buf, (const float *)gl->data + (int64_t)i * V, V);
        if (d > e2) e2 = d;
        int best = 0;
        for (int64_t v = 1; v < V; v++)
            if (buf[v] > buf[best]) best = (int)v;
        match &= best == ids[i];
        CHECK(ms_engine_forward(e, &ids[i], 1, buf, 0, &err) == MS_OK);
    }
    /* when the prompt is fed in pieces, earlier pieces were computed as shorter forwards than the
     * reference's: their tied choices are redone too, so the result must not change */
    CHECK_MSG(e2 < 1e-4 && match, "%s (batch %d, pieces of %d): decode logits differ by %g, ids match %d", dir,
              max_batch, piece, e2, match);
    free(buf);
out:
    ms_engine_destroy(e);
    if (pool) ms_pool_destroy(pool);
    ms_model_free(&m);
    ms_checkpoint_close(&ref);
}

TEST(deepseek_v32_chunked_prefill_and_decode) {
    run_fixture(MS_TEST_FIXTURES "deepseek_v32", 7, 2, 20);
    run_fixture(MS_TEST_FIXTURES "deepseek_v32", 256, 1, 3);
}

TEST(deepseek_v32_topk4_many_ties) { run_fixture("tests/fixtures/extra/deepseek_v32_topk4", 5, 2, 6); }

TEST(glm_moe_dsa_shared_selection_chunked) {
    run_fixture("tests/fixtures/extra/glm_moe_dsa_topk4_shared", 3, 2, 20);
    run_fixture(MS_TEST_FIXTURES "glm_moe_dsa", 16, 1, 1);
}

/* KDA + KPool DSA + mHC; glm5_next_s2 (hc_mult 3, kpool 3, a shared layer) has tied pool choices
 * that flip as the sequence grows: with recurrent KDA state the engine redoes the sequence */
TEST(glm5_next_chunked_and_replayed) {
    run_fixture(MS_TEST_FIXTURES "glm5_next", 6, 2, 7);
    run_fixture("tests/fixtures/extra/glm5_next_s2", 5, 2, 20);
    run_fixture("tests/fixtures/extra/glm5_next_s2", 256, 1, 3);
}

TEST_MAIN()
