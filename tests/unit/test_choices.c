/* test_choices.c — ms_engine_observe_choices (engine.h): the routed experts and DSA selections a
 * forward reports, without changing its logits, and forced choices; and verify --static-dtype's
 * comparison, forcing and rule over them (src/cli/verify_choices.c, compiled in here: the CLI is
 * not in the library). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "fixture.h"
#include "cli/verify_choices.c"

typedef struct {
    const ms_model *m;
    int experts, dsa, bad;
    int force; /* 1: force every choice to itself; 2: every experts choice to another set */
} counts;

static int count_cb(void *ctx, const ms_choice *c, int32_t *force) {
    counts *k = ctx;
    const ms_config *cfg = &k->m->cfg;
    if (c->kind == MS_CHOICE_EXPERTS) {
        k->experts++;
        if (c->n_chosen != cfg->top_k || c->n_scores != ms_router_width(cfg)) k->bad++;
        for (int i = 0; i < c->n_chosen; i++)
            if (c->chosen[i] < 0 || c->chosen[i] >= c->n_scores) k->bad++;
    } else {
        k->dsa++;
        if (c->n_chosen >= c->n_scores || c->n_chosen < 1) k->bad++;
        if (cfg->dsa_kpool <= 1 && (c->n_scores != c->pos + 1 || c->n_chosen != cfg->dsa_topk)) k->bad++;
        for (int i = 0; i < c->n_chosen; i++)
            if (c->chosen[i] < 0 || c->chosen[i] >= c->n_scores || (i && c->chosen[i] <= c->chosen[i - 1])) k->bad++;
    }
    if (k->force == 1 || (k->force == 2 && c->kind == MS_CHOICE_EXPERTS)) {
        memcpy(force, c->chosen, (size_t)c->n_chosen * sizeof *force);
        if (k->force == 2) /* the lowest ids the router did not choose */
            for (int i = 0, id = 0; i < c->n_chosen; i++, id++) {
                for (int j = 0; j < c->n_chosen; j++)
                    if (c->chosen[j] == id) id++, j = -1;
                force[i] = id;
            }
        return 1;
    }
    return 0;
}

/* The reference's input_ids forwarded with and without an observer: the same logits bit for bit,
 * an experts report per token and routed (not hash-routed) MoE layer, DSA reports where a query
 * has more candidates than it keeps. */
static void observe_fixture(const char *name, int want_dsa) {
    char dir[256];
    snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", name);
    ms_model m;
    ms_checkpoint ref;
    if (ms_test_fixture_open(dir, NULL, &m, &ref)) return;
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids");
    CHECK(in && in->dtype == MS_DT_I32);
    const int n = (int)in->shape[0];
    const int64_t V = m.cfg.vocab;
    float *a = malloc(sizeof(float) * (size_t)(n * V)), *b = malloc(sizeof(float) * (size_t)(n * V));
    ms_engine_opts o = {.max_ctx = 64};
    ms_engine *e = NULL;
    ms_err err = {0};
    CHECK(a && b && ms_engine_create(&m, &o, &e, &err) == MS_OK);
    if (a && b && e) {
        CHECK(ms_engine_forward(e, in->data, n, a, 1, &err) == MS_OK);
        ms_engine_reset(e);
        counts k = {.m = &m};
        CHECK(ms_engine_observe_choices(e, count_cb, &k, &err) == MS_OK);
        CHECK(ms_engine_forward(e, in->data, n, b, 1, &err) == MS_OK);
        CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)(n * V)), "%s: logits differ with the observer", name);
        int routed = 0;
        for (int l = 0; l < m.cfg.n_layers; l++) routed += m.layers[l].experts && !m.layers[l].hash_ids;
        CHECK_MSG(k.experts == routed * n, "%s: %d expert reports, %d layers x %d tokens", name, k.experts, routed, n);
        CHECK_MSG(want_dsa ? k.dsa > 0 : k.dsa == 0, "%s: %d DSA reports", name, k.dsa);
        CHECK_MSG(!k.bad, "%s: %d malformed reports", name, k.bad);
        /* every choice forced to itself: the same logits; the experts forced to others: not */
        k.force = 1;
        ms_engine_reset(e);
        CHECK(ms_engine_forward(e, in->data, n, b, 1, &err) == MS_OK);
        CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)(n * V)), "%s: logits differ with choices forced to themselves", name);
        k.force = 2;
        ms_engine_reset(e);
        CHECK(ms_engine_forward(e, in->data, n, b, 1, &err) == MS_OK);
        CHECK_MSG(memcmp(a, b, sizeof(float) * (size_t)(n * V)), "%s: forcing other experts changed nothing", name);
        k.force = 0;
        /* stopped: nothing more is reported */
        CHECK(ms_engine_observe_choices(e, NULL, NULL, &err) == MS_OK);
        ms_engine_reset(e);
        int before = k.experts + k.dsa;
        CHECK(ms_engine_forward(e, in->data, n, b, 1, &err) == MS_OK);
        CHECK(k.experts + k.dsa == before);
    }
    ms_engine_destroy(e);
    free(a), free(b);
    ms_test_fixture_close(&m, &ref);
}

TEST(observer_reports_without_changing_logits) {
    observe_fixture("qwen3_moe", 0);
    observe_fixture("qwen3_next", 0);
    observe_fixture("deepseek_v32", 1);
    observe_fixture("glm5_next", 1); /* KPool */
}

/* one synthetic experts choice of layer `layer` at forward fwd: logits l[E], chosen ids */
static void put(ms_vc_log *g, int fwd, int layer, int64_t pos, const float *l, int E, const int32_t *ids, int k) {
    g->fwd = fwd;
    ms_choice c = {.kind = MS_CHOICE_EXPERTS, .layer = layer, .pos = pos, .scores = l, .n_scores = E, .chosen = ids,
                   .n_chosen = k};
    int32_t f[64];
    ms_vc_observe(g, &c, f);
}

/* The margin, the comparison (the choice in effect per forward) and the rule, on qwen3_moe's router
 * config (softmax top-2). */
TEST(margins_compare_and_rule) {
    ms_model m;
    ms_checkpoint ref;
    if (ms_test_fixture_open(MS_TEST_FIXTURES "qwen3_moe", NULL, &m, &ref)) return;
    const int E = (int)ms_router_width(&m.cfg), K = (int)m.cfg.top_k;
    CHECK(K == 2 && E >= 4);
    int ml = 0;
    while (ml < m.cfg.n_layers && !m.layers[ml].experts) ml++;
    float clear[64] = {0}, tie[64] = {0};
    CHECK(E <= 64);
    clear[0] = 3, clear[1] = 2, clear[2] = 1; /* top-2 {0, 1}, margin 1 */
    tie[0] = 3, tie[1] = 2.001f, tie[2] = 2;  /* top-2 {0, 1}, margin 0.001 */
    const int32_t top[2] = {0, 1}, other[2] = {0, 2};
    ms_vc_log a, b;
    ms_vc_init(&a, &m, 0.01, 1);
    ms_vc_init(&b, &m, 0, 0);
    put(&a, 0, ml, 5, clear, E, top, K);
    CHECK_NEAR(a.r[0].margin, 1.0, 1e-5);
    double ss = 0;
    for (int i = 0; i < E; i++) ss += (double)clear[i] * clear[i];
    CHECK_NEAR(a.r[0].bound, 4 * 0.01 * sqrt(ss / E), 1e-9);
    /* a flip beyond its bound, first: fails */
    put(&b, 0, ml, 5, clear, E, other, K);
    ms_vc_flip *f = NULL;
    int nf = 0, un = 0;
    int64_t cmp = 0;
    CHECK(ms_vc_compare(&a, &b, &f, &nf, &un, &cmp) == 0);
    CHECK(nf == 1 && un == 0 && cmp == 1 && f[0].first);
    CHECK(ms_vc_judge(f, nf, un) == 1);
    free(f);
    ms_vc_free(&a), ms_vc_free(&b);
    /* a near tie flips at forward 1: passes; a clear choice flipping after it (forward 2) fails */
    ms_vc_init(&a, &m, 0.01, 1);
    ms_vc_init(&b, &m, 0, 0);
    put(&a, 0, ml, 5, clear, E, top, K), put(&b, 0, ml, 5, clear, E, top, K);
    put(&a, 1, ml, 6, tie, E, top, K), put(&b, 1, ml, 6, tie, E, other, K);
    put(&a, 2, ml, 7, clear, E, top, K), put(&b, 2, ml, 7, clear, E, other, K);
    CHECK(a.r[1].margin < a.r[1].bound);
    CHECK(ms_vc_compare(&a, &b, &f, &nf, &un, &cmp) == 0);
    CHECK(nf == 2 && cmp == 3 && f[0].first && !f[1].first && f[0].ref.fwd == 1);
    CHECK(ms_vc_judge(f, 1, un) == 0 && ms_vc_judge(f, nf, un) == 1);
    free(f);
    /* a choice only one engine made: fails */
    put(&b, 3, ml, 8, clear, E, top, K);
    CHECK(ms_vc_compare(&a, &b, &f, &nf, &un, &cmp) == 0);
    CHECK(un == 1 && ms_vc_judge(f, 1, un) == 1);
    free(f);
    ms_vc_free(&a), ms_vc_free(&b);
    /* a re-derived choice (a DSA tie replay) holds from its forward on; the other engine's earlier one
     * is in effect there */
    ms_vc_init(&a, &m, 0.01, 1);
    ms_vc_init(&b, &m, 0, 0);
    put(&a, 0, ml, 5, clear, E, top, K), put(&b, 0, ml, 5, clear, E, top, K);
    put(&b, 2, ml, 5, clear, E, other, K); /* b re-chose position 5 at forward 2 */
    CHECK(ms_vc_compare(&a, &b, &f, &nf, &un, &cmp) == 0);
    CHECK(un == 0 && cmp == 2 && nf == 1 && f[0].ref.fwd == 2);
    free(f);
    ms_vc_free(&a), ms_vc_free(&b);
    /* DSA margin: the lowest selected minus the highest other score */
    ms_vc_init(&a, &m, 0.01, 1);
    const float sc[4] = {0.5f, 0.1f, 0.3f, 0.2f};
    const int32_t sel[2] = {0, 2};
    a.fwd = 0;
    ms_choice c = {.kind = MS_CHOICE_DSA, .layer = 0, .pos = 3, .scores = sc, .n_scores = 4, .chosen = sel, .n_chosen = 2};
    int32_t fo[2];
    CHECK(ms_vc_observe(&a, &c, fo) == 0);
    CHECK_NEAR(a.r[0].margin, 0.1, 1e-6);
    /* forcing: a log forced from a's gives a's choice where the engine chose otherwise */
    ms_vc_init(&b, &m, 0, 0);
    CHECK(ms_vc_force_from(&b, &a) == 0);
    const int32_t mine[2] = {0, 3}, same[2] = {0, 2};
    b.fwd = 1; /* a later forward: a's choice from forward 0 is in effect */
    c.chosen = mine;
    CHECK(ms_vc_observe(&b, &c, fo) == 1 && fo[0] == 0 && fo[1] == 2 && b.forced == 1);
    c.chosen = same;
    CHECK(ms_vc_observe(&b, &c, fo) == 0 && b.forced == 1);
    c.pos = 2; /* a site a never chose at: nothing forced */
    CHECK(ms_vc_observe(&b, &c, fo) == 0);
    ms_vc_free(&b);
    ms_vc_free(&a);
    ms_test_fixture_close(&m, &ref);
}

TEST_MAIN()
