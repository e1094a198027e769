/* test_slots.c — the slot scheduler (session/slots.h): requests served together
 * in slots (chunked prefills interleaved with batched decode steps, requests
 * joining as slots free up, one cancelled by its callback, one by
 * ms_sched_cancel mid-prefill) give the same greedy ids as each request served
 * alone with ms_generate; the slot count that the memory plan refuses. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "session/slots.h"
#include "fixture.h"
#include "test.h"

#define NREQ 7
#define MAXTOK 8

typedef struct {
    int32_t ids[64];
    int n, done, rc, stop_after; /* stop_after > 0: the callback cancels after that many ids */
    ms_gen_result res;
} req;

static int on_token(void *user, int32_t id, const char *text, size_t len) {
    req *r = user;
    if (id >= 0 && r->n < 64) r->ids[r->n++] = id;
    return r->stop_after > 0 && r->n >= r->stop_after;
}

static void on_done(void *user, int rc, const ms_gen_result *res, const ms_err *err) {
    req *r = user;
    r->done++;
    r->rc = rc;
    r->res = *res;
}

static void run_model(const char *name, int n_slots, int chunk) {
    char dir[256];
    snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", name);
    ms_model m;
    ms_checkpoint ref;
    ms_err err = {0};
    if (ms_test_fixture_open(dir, NULL, &m, &ref)) return;
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids");
    int n_in = (int)in->shape[0];
    const int32_t *ids = in->data;
    int64_t V = m.cfg.vocab;
    /* prompts: lengths 2..n_in, shifted tokens; request 1 shares request 0's prefix (reuse in a slot) */
    int32_t prompts[NREQ][64];
    int plen[NREQ];
    for (int r = 0; r < NREQ; r++) {
        plen[r] = 2 + (r * 5) % (n_in - 1);
        for (int t = 0; t < plen[r]; t++) prompts[r][t] = (int32_t)((ids[t] + (r == 1 ? 0 : 3 * r)) % V);
    }
    ms_gen_params p;
    memset(&p, 0, sizeof p);
    ms_sampler_defaults(&p.sampling);
    p.sampling.temperature = 0;
    p.max_tokens = MAXTOK;
    /* alone: a fresh engine and generator per request */
    req want[NREQ];
    memset(want, 0, sizeof want);
    for (int r = 0; r < NREQ; r++) {
        ms_engine *e;
        ms_generator *g;
        ms_engine_opts eo = {.max_ctx = 64};
        CHECK(ms_engine_create(&m, &eo, &e, &err) == 0);
        CHECK(ms_generator_new(e, NULL, V, NULL, &g, &err) == 0);
        want[r].stop_after = r == 3 ? 2 : 0;
        ms_gen_params pr = p;
        if (r == 4) pr.max_tokens = 3;
        CHECK_MSG(ms_generate(g, prompts[r], plen[r], &pr, on_token, &want[r], &want[r].res, &err) == 0, "%s: %s",
                  name, err.msg);
        ms_generator_free(g);
        ms_engine_destroy(e);
    }
    /* together */
    ms_sched_opts so = {.n_slots = n_slots, .chunk = chunk, .engine = {.max_ctx = 64}};
    ms_sched *s;
    CHECK_MSG(ms_sched_new(&m, &so, &s, &err) == 0, "%s: %s", name, err.msg);
    req got[NREQ];
    memset(got, 0, sizeof got);
    ms_gen_params pr[NREQ];
    int next = 0, steps = 0, cancel_slot = -1;
    while (s && (next < NREQ || ms_sched_active(s)) && steps < 1000) {
        while (next < NREQ && ms_sched_free_slots(s) > 0) { /* join between steps */
            pr[next] = p;
            if (next == 4) pr[next].max_tokens = 3;
            got[next].stop_after = next == 3 ? 2 : 0;
            int slot;
            CHECK(ms_sched_submit(s, prompts[next], plen[next], &pr[next], on_token, on_done, &got[next], &slot, &err) ==
                  0);
            if (next == 6) cancel_slot = slot;
            next++;
        }
        int rc = ms_sched_step(s, &err);
        CHECK_MSG(rc >= 0, "%s step %d: %s", name, steps, err.msg);
        if (cancel_slot >= 0) { /* request 6: cancelled during its prefill (chunked: it has more to feed) */
            ms_sched_cancel(s, cancel_slot);
            cancel_slot = -1;
        }
        steps++;
    }
    CHECK(steps < 1000);
    for (int r = 0; s && r < NREQ; r++) {
        CHECK_MSG(got[r].done == 1 && got[r].rc == 0, "%s request %d: done %d rc %d", name, r, got[r].done, got[r].rc);
        if (r == 6) {
            CHECK_MSG(got[r].res.finish == MS_FINISH_ABORT, "%s: cancelled request finish %d", name, got[r].res.finish);
            continue;
        }
        CHECK_MSG(got[r].n == want[r].n && !memcmp(got[r].ids, want[r].ids, sizeof(int32_t) * (size_t)want[r].n),
                  "%s request %d: %d ids in slots, %d alone", name, r, got[r].n, want[r].n);
        CHECK_MSG(got[r].res.finish == want[r].res.finish && got[r].res.completion_tokens == want[r].res.completion_tokens,
                  "%s request %d: finish %d/%d tokens %d/%d", name, r, got[r].res.finish, want[r].res.finish,
                  got[r].res.completion_tokens, want[r].res.completion_tokens);
        CHECK(got[r].res.prompt_tokens == plen[r]);
    }
    CHECK(!s || ms_sched_submit(s, prompts[0], 0, &p, NULL, NULL, NULL, NULL, &err) == MS_ERR_ARG);
    if (s) {
        ms_sched_stats st;
        ms_sched_get_stats(s, &st);
        CHECK(n_slots == 1 || st.decode_rows > st.decode_steps); /* some steps batched several slots */
        printf("slots %-12s %d slots, chunk %d: %llu steps, %llu decode steps of %.2f rows on average, %llu prefill "
               "chunks\n",
               name, n_slots, chunk, (unsigned long long)st.steps, (unsigned long long)st.decode_steps,
               st.decode_steps ? (double)st.decode_rows / (double)st.decode_steps : 0.0,
               (unsigned long long)st.prefill_chunks);
    }
    ms_sched_free(s);
    ms_test_fixture_close(&m, &ref);
}

TEST(slots_equal_one_at_a_time) {
    const char *names[] = {"qwen3_moe", "deepseek_v3", "kimi_linear", "deepseek_v32", "gpt_oss", "qwen3_next"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) run_model(names[i], 3, 4);
    run_model("qwen3_moe", 1, 64); /* one slot: requests one after another */
}

/* Cross-slot sharing (rollback models): B shares 20 tokens with A, which is decoding in another
 * slot; B's free slot copies them (cached 20) and B's greedy ids equal B served after A in one
 * slot (one at a time, where B reuses A's prefix by rollback). */
static void share_model(const char *name) {
    char dir[256];
    snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", name);
    ms_model m;
    ms_checkpoint ref;
    ms_err err = {0};
    if (ms_test_fixture_open(dir, NULL, &m, &ref)) return;
    const int32_t *ids = ms_checkpoint_find(&ref, "input_ids")->data;
    int64_t V = m.cfg.vocab;
    int32_t a[30], b[26];
    memcpy(a, ids, sizeof a);
    memcpy(b, ids, 20 * sizeof *b);
    for (int t = 20; t < 26; t++) b[t] = (int32_t)((ids[t] + 7) % V);
    ms_gen_params p;
    memset(&p, 0, sizeof p);
    ms_sampler_defaults(&p.sampling);
    p.sampling.temperature = 0;
    p.max_tokens = MAXTOK;
    req want[2], got[2];
    memset(want, 0, sizeof want);
    memset(got, 0, sizeof got);
    ms_engine *e;
    ms_generator *g;
    ms_engine_opts eo = {.max_ctx = 64};
    CHECK(ms_engine_create(&m, &eo, &e, &err) == 0);
    CHECK(ms_generator_new(e, NULL, V, NULL, &g, &err) == 0);
    CHECK(ms_generate(g, a, 30, &p, on_token, &want[0], &want[0].res, &err) == 0);
    CHECK(ms_generate(g, b, 26, &p, on_token, &want[1], &want[1].res, &err) == 0 && want[1].res.cached_tokens == 20);
    ms_generator_free(g);
    ms_engine_destroy(e);
    ms_sched_opts so = {.n_slots = 2, .chunk = 64, .engine = {.max_ctx = 64}};
    ms_sched *s;
    CHECK_MSG(ms_sched_new(&m, &so, &s, &err) == 0, "%s: %s", name, err.msg);
    int slot_a = -1, slot_b = -1, steps = 0;
    CHECK(ms_sched_submit(s, a, 30, &p, on_token, on_done, &got[0], &slot_a, &err) == 0);
    while (got[0].n < 2 && steps++ < 50) ms_sched_step(s, &err); /* A is decoding */
    CHECK(ms_sched_submit(s, b, 26, &p, on_token, on_done, &got[1], &slot_b, &err) == 0 && slot_b != slot_a);
    while (ms_sched_active(s) && steps++ < 200) CHECK(ms_sched_step(s, &err) >= 0);
    ms_sched_stats st;
    ms_sched_get_stats(s, &st);
    CHECK_MSG(got[1].done == 1 && got[1].res.cached_tokens == 20 && st.shared_prefixes == 1 && st.shared_tokens == 20,
              "%s: B reused %d tokens in another slot (shared %llu)", name, got[1].res.cached_tokens,
              (unsigned long long)st.shared_prefixes);
    for (int r = 0; r < 2; r++)
        CHECK_MSG(got[r].n == want[r].n && !memcmp(got[r].ids, want[r].ids, sizeof(int32_t) * (size_t)want[r].n),
                  "%s request %d: ids with a shared prefix differ from one at a time", name, r);
    ms_sched_free(s);
    ms_test_fixture_close(&m, &ref);
}

TEST(slots_share_prefix_across_slots) {
    share_model("qwen3_moe");
    share_model("deepseek_v3");
    share_model("gpt_oss");
}

TEST(slots_full_and_plan) {
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(MS_TEST_FIXTURES "qwen3_moe", &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    ms_sched_opts so = {.n_slots = 2, .engine = {.max_ctx = 32}};
    ms_sched *s;
    CHECK(ms_sched_new(&m, &so, &s, &err) == 0);
    ms_gen_params p;
    memset(&p, 0, sizeof p);
    ms_sampler_defaults(&p.sampling);
    p.max_tokens = 2;
    int32_t pr[3] = {1, 2, 3};
    req r[3];
    memset(r, 0, sizeof r);
    CHECK(ms_sched_submit(s, pr, 3, &p, on_token, on_done, &r[0], NULL, &err) == 0);
    CHECK(ms_sched_submit(s, pr, 3, &p, on_token, on_done, &r[1], NULL, &err) == 0);
    CHECK(ms_sched_submit(s, pr, 3, &p, on_token, on_done, &r[2], NULL, &err) == MS_ERR_LIMIT);
    ms_sched_free(s); /* requests still in slots end (abort) */
    CHECK(r[0].done == 1 && r[0].res.finish == MS_FINISH_ABORT && r[2].done == 0);
    /* the plan counts N slots' state and workspace */
    ms_plan p1, p8;
    ms_plan_opts po = {.context = 1024, .threads = 2, .expert_cache_bytes = -1, .slots = 1};
    CHECK(ms_plan_make(&m, &po, &p1, &err) == 0);
    po.slots = 8;
    CHECK(ms_plan_make(&m, &po, &p8, &err) == 0);
    CHECK(p8.state_bytes == 8 * p1.state_bytes && p8.slots == 8);
    CHECK(p8.total > p1.total && p8.static_bytes == p1.static_bytes);
    uint64_t budget = p1.total + 3 * (p8.total - p1.total) / 7; /* room for 4 slots, not 5 */
    po.slots = 0;
    CHECK(ms_plan_max_slots(&m, &po, budget) == 4);
    po.slots = 5;
    CHECK(ms_plan_make(&m, &po, &p8, &err) == 0 && ms_plan_check(&p8, budget, &err) == MS_ERR_NOMEM);
    ms_model_free(&m);
}

TEST_MAIN()
