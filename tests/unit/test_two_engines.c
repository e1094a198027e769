/* test_two_engines.c — no hidden state between engines: several engines in one
 * process, their forwards interleaved token by token (a prefill, then single
 * decode steps), give logits bit-identical (memcmp) to each model run alone in
 * its own engine. Covers different models at once (GQA MoE qwen3_moe, KDA + MLA
 * kimi_linear, MLA deepseek_v3), two engines over the same loaded model, and
 * engines whose pools run different kernel ISAs (backend/cpu/cpu.h
 * ms_cpu_set_isa is per pool: a scalar pool must not change what the other
 * engine computes). Fixtures: tests/data/fixtures/models/<name>. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "fixture.h"
#include "test.h"

#define FIXTURES MS_TEST_FIXTURES
enum { PREFILL = 9, MAX_STEPS = 12 }; /* step 0: the first PREFILL tokens; then one token a step */

/* A model and the token sequence it is fed (the fixture's reference input_ids). */
typedef struct {
    const char *name;
    ms_model m;
    int32_t *ids;
    int n_ids;
    int loaded;
} fix;

/* The fixture (fixture.h): its model stays loaded in f, its first input_ids are copied. */
static int fix_load(fix *f, const char *name) {
    memset(f, 0, sizeof *f);
    f->name = name;
    char dir[512];
    snprintf(dir, sizeof dir, FIXTURES "%s", name);
    ms_checkpoint ref;
    if (ms_test_fixture_open(dir, NULL, &f->m, &ref)) return -1;
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids");
    CHECK(in && in->dtype == MS_DT_I32);
    if (!in || in->dtype != MS_DT_I32) {
        ms_test_fixture_close(&f->m, &ref);
        return -1;
    }
    f->n_ids = (int)in->shape[0];
    if (f->n_ids > PREFILL + MAX_STEPS - 1) f->n_ids = PREFILL + MAX_STEPS - 1;
    f->ids = malloc(sizeof *f->ids * (size_t)f->n_ids);
    memcpy(f->ids, in->data, sizeof *f->ids * (size_t)f->n_ids);
    ms_checkpoint_close(&ref);
    CHECK(f->n_ids > PREFILL);
    f->loaded = 1;
    return 0;
}

static void fix_free(fix *f) {
    if (!f->loaded) return;
    ms_model_free(&f->m);
    free(f->ids);
}

/* Tokens fed at step s, and how many. */
static int step_tokens(const fix *f, int s, const int32_t **tok) {
    if (s == 0) {
        *tok = f->ids;
        return PREFILL;
    }
    int t = PREFILL + s - 1;
    if (t >= f->n_ids) return 0;
    *tok = f->ids + t;
    return 1;
}

/* One engine's run: the logits of every step (prefill: all rows), in order. */
typedef struct {
    fix *f;
    ms_engine *e;
    float *logits;
    size_t len, off;
} run;

static int run_open(run *r, fix *f, ms_pool *pool, int max_batch) {
    memset(r, 0, sizeof *r);
    r->f = f;
    const int64_t V = f->m.cfg.vocab;
    r->len = (size_t)f->n_ids * (size_t)V;
    r->logits = malloc(sizeof(float) * r->len);
    ms_engine_opts o = {.max_ctx = 64, .max_batch = max_batch, .pool = pool};
    ms_err err = {0};
    if (ms_engine_create(&f->m, &o, &r->e, &err)) {
        CHECK_MSG(0, "%s: %s", f->name, err.msg);
        return -1;
    }
    return 0;
}

/* Forward step s; 0 when r has no more tokens. */
static int run_step(run *r, int s) {
    const int32_t *tok;
    int k = step_tokens(r->f, s, &tok);
    if (!k || !r->e) return 0;
    ms_err err = {0};
    const int64_t V = r->f->m.cfg.vocab;
    int rc = ms_engine_forward(r->e, tok, k, r->logits + r->off, 1, &err);
    CHECK_MSG(rc == MS_OK, "%s step %d: %s", r->f->name, s, err.msg);
    r->off += (size_t)k * (size_t)V;
    return 1;
}

static void run_close(run *r) {
    ms_engine_destroy(r->e);
    free(r->logits);
}

/* f alone in its own engine on a fresh pool of `threads` running `isa` (-1: the process's). */
static float *solo(fix *f, int threads, int isa, int max_batch) {
    ms_pool *pool = ms_pool_create(threads);
    if (isa >= 0) CHECK(ms_cpu_set_isa(pool, (ms_cpu_isa)isa, NULL) == MS_OK);
    run r;
    float *out = NULL;
    if (!run_open(&r, f, pool, max_batch)) {
        for (int s = 0; run_step(&r, s); s++) {}
        CHECK(r.off == r.len);
        out = r.logits;
        r.logits = NULL;
    }
    run_close(&r);
    ms_pool_destroy(pool);
    return out;
}

/* Interleave runs rs[0..n) step by step (every engine's step s before any's
 * step s + 1), then compare each with its solo logits want[i]. */
static void interleave_and_compare(run *rs, int n, float **want, const char *what) {
    for (int s = 0;; s++) {
        int any = 0;
        for (int i = 0; i < n; i++) any |= run_step(&rs[i], s);
        if (!any) break;
    }
    for (int i = 0; i < n; i++) {
        CHECK_MSG(rs[i].off == rs[i].len, "%s: %s ran %zu of %zu logits", what, rs[i].f->name, rs[i].off, rs[i].len);
        CHECK_MSG(want[i] && !memcmp(rs[i].logits, want[i], sizeof(float) * rs[i].len),
                  "%s: engine %d (%s) differs from the model run alone", what, i, rs[i].f->name);
    }
}

static const char *k_names[] = {"qwen3_moe", "kimi_linear", "deepseek_v3"};
#define NF 3

/* Different models, each engine on its own pool, then all on one shared pool. */
TEST(different_models_interleaved) {
    fix fs[NF];
    int ok = 1;
    for (int i = 0; i < NF; i++) ok &= fix_load(&fs[i], k_names[i]) == 0;
    if (ok) {
        float *want[NF];
        for (int i = 0; i < NF; i++) want[i] = solo(&fs[i], 2, -1, 256);
        run rs[NF];
        ms_pool *pools[NF];
        for (int i = 0; i < NF; i++) {
            pools[i] = ms_pool_create(2);
            run_open(&rs[i], &fs[i], pools[i], 256);
        }
        interleave_and_compare(rs, NF, want, "own pools");
        for (int i = 0; i < NF; i++) run_close(&rs[i]), ms_pool_destroy(pools[i]);
        ms_pool *shared = ms_pool_create(2); /* one pool, used by one engine at a time */
        for (int i = 0; i < NF; i++) run_open(&rs[i], &fs[i], shared, 256);
        interleave_and_compare(rs, NF, want, "shared pool");
        for (int i = 0; i < NF; i++) run_close(&rs[i]);
        ms_pool_destroy(shared);
        for (int i = 0; i < NF; i++) free(want[i]);
    }
    for (int i = 0; i < NF; i++) fix_free(&fs[i]);
}

/* Two engines over the same loaded model, interleaved: they share weights,
 * never state. Then the same with one engine's pool on the scalar kernels:
 * each engine matches its own solo run (the ISA is the pool's, not the process's). */
TEST(same_model_interleaved) {
    for (int fi = 0; fi < NF; fi++) {
        fix f;
        if (fix_load(&f, k_names[fi])) continue;
        float *want = solo(&f, 2, -1, 256), *want_scalar = solo(&f, 1, MS_ISA_SCALAR, 256);
        float *want_small = solo(&f, 2, -1, 4); /* prefill in chunks of 4 */
        run rs[3];
        ms_pool *p1 = ms_pool_create(2), *p2 = ms_pool_create(2);
        run_open(&rs[0], &f, p1, 256);
        run_open(&rs[1], &f, p2, 256);
        float *w2[2] = {want, want};
        interleave_and_compare(rs, 2, w2, k_names[fi]);
        run_close(&rs[0]), run_close(&rs[1]);
        /* one default pool, one scalar, and a third engine with a smaller prefill chunk */
        ms_pool *ps = ms_pool_create(1);
        CHECK(ms_cpu_set_isa(ps, MS_ISA_SCALAR, NULL) == MS_OK);
        run_open(&rs[0], &f, p1, 256);
        run_open(&rs[1], &f, ps, 256);
        run_open(&rs[2], &f, p2, 4);
        float *w3[3] = {want, want_scalar, want_small};
        interleave_and_compare(rs, 3, w3, k_names[fi]);
        for (int i = 0; i < 3; i++) run_close(&rs[i]);
        ms_pool_destroy(p1), ms_pool_destroy(p2), ms_pool_destroy(ps);
        free(want), free(want_scalar), free(want_small);
        fix_free(&f);
    }
}

TEST_MAIN()
