/* fixture.h — the reference fixtures the engine tests share
 * (tests/data/fixtures/models/<name>: a model directory and the
 * reference.safetensors transformers made from it; tests/data/README.md), and
 * the engine runs against them that several tests repeat. Include after
 * test.h; every step is a CHECK, so a fixture that fails to open or a run that
 * differs from the reference fails the including test. */
#ifndef MS_TEST_FIXTURE_H
#define MS_TEST_FIXTURE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "test.h"

/* Open a fixture: the reference checkpoint at ref_path (NULL: dir/reference.safetensors) and the
 * model in dir. Both steps are CHECKs naming dir and the error. Returns 0 with both open (close
 * with ms_test_fixture_close), or -1 with neither open. */
static inline int ms_test_fixture_open(const char *dir, const char *ref_path, ms_model *m, ms_checkpoint *ref) {
    char path[1024];
    if (!ref_path) {
        snprintf(path, sizeof path, "%s/reference.safetensors", dir);
        ref_path = path;
    }
    ms_err err = {0};
    int rc = ms_checkpoint_open(ref_path, ref, &err);
    CHECK_MSG(rc == MS_OK, "%s: %s", dir, err.msg);
    if (rc) return -1;
    rc = ms_model_load(dir, m, &err);
    CHECK_MSG(rc == MS_OK, "%s: %s", dir, err.msg);
    if (rc) {
        ms_checkpoint_close(ref);
        return -1;
    }
    return 0;
}

static inline void ms_test_fixture_close(ms_model *m, ms_checkpoint *ref) {
    ms_model_free(m);
    ms_checkpoint_close(ref);
}

/* The reference's input_ids [n] fed in pieces (pieces[0..np), each cut to what is left), after an
 * unrelated sequence warm[0..nwarm) and an engine reset (no state may leak through the reset), on
 * an engine of max_ctx 64, the given max_batch and a pool of `threads` (1: none). Returns
 * max |logits - reference logits| over all n positions; INFINITY where the fixture or the engine
 * failed (those failures are CHECKs too). The caller checks the bound it wants. */
static inline double ms_test_logits_in_pieces(const char *dir, const char *ref_path, const int *pieces, int np,
                                              int max_batch, int threads, const int32_t *warm, int nwarm) {
    ms_checkpoint ref;
    ms_model m;
    if (ms_test_fixture_open(dir, ref_path, &m, &ref)) return INFINITY;
    ms_err err = {0};
    double md = INFINITY;
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids"), *lg = ms_checkpoint_find(&ref, "logits");
    CHECK(in && lg && in->dtype == MS_DT_I32 && lg->dtype == MS_DT_F32);
    ms_pool *pool = threads > 1 ? ms_pool_create(threads) : NULL;
    ms_engine_opts o = {.max_ctx = 64, .max_batch = max_batch, .pool = pool};
    ms_engine *e = NULL;
    CHECK_MSG(ms_engine_create(&m, &o, &e, &err) == MS_OK, "%s: %s", dir, err.msg);
    if (!e || !in || !lg || in->dtype != MS_DT_I32 || lg->dtype != MS_DT_F32) goto out;
    const int n = (int)in->shape[0];
    const int64_t V = m.cfg.vocab;
    float *out = calloc((size_t)n * V, sizeof *out);
    CHECK(ms_engine_forward(e, warm, nwarm, NULL, 0, &err) == MS_OK);
    ms_engine_reset(e);
    int t = 0;
    for (int i = 0; i < np && t < n; i++) {
        int k = pieces[i] < n - t ? pieces[i] : n - t;
        CHECK_MSG(ms_engine_forward(e, (const int32_t *)in->data + t, k, out + (size_t)t * V, 1, &err) == MS_OK, "%s",
                  err.msg);
        t += k;
    }
    CHECK(t == n);
    md = 0;
    const float *rl = lg->data;
    for (size_t i = 0; i < (size_t)n * V; i++) md = fmax(md, fabs(out[i] - rl[i]));
    free(out);
out:
    ms_engine_destroy(e);
    if (pool) ms_pool_destroy(pool);
    ms_test_fixture_close(&m, &ref);
    return md;
}

/* The fixture's prefill and decode references (input_ids/logits; gen_prompt, gen_ids, gen_logits)
 * on an engine of max_ctx, max_batch and a pool of `threads` (1: none): input_ids in one forward
 * against logits; then, after a reset, gen_prompt in pieces of `piece` tokens and gen_ids decoded
 * one at a time, each step's logits against gen_logits and its argmax against gen_ids.
 * Both bounds are 1e-4 absolute. */
static inline void ms_test_prefill_and_decode(const char *dir, int max_ctx, int max_batch, int threads, int piece) {
    ms_checkpoint ref;
    ms_model m;
    if (ms_test_fixture_open(dir, NULL, &m, &ref)) return;
    ms_err err = {0};
    ms_pool *pool = threads > 1 ? ms_pool_create(threads) : NULL;
    ms_engine_opts o = {.max_ctx = max_ctx, .max_batch = max_batch, .pool = pool};
    ms_engine *e = NULL;
    int rc = ms_engine_create(&m, &o, &e, &err);
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
    CHECK_MSG(e2 < 1e-4 && match, "%s (batch %d, pieces of %d): decode logits differ by %g, ids match %d", dir,
              max_batch, piece, e2, match);
    free(buf);
out:
    ms_engine_destroy(e);
    if (pool) ms_pool_destroy(pool);
    ms_test_fixture_close(&m, &ref);
}

#endif
