/* test_batch_decode.c — ms_engine_decode_batch: several sequences' decode steps
 * forwarded together equal the same sequences served one at a time.
 *
 * Per fixture model, NSEQ sequences with different prompts (lengths and tokens)
 * are each run alone in their own engine (prefill, then one-token forwards of
 * the reference's greedy ids): the reference. Then the same sequences run in
 * NSEQ engines over the same model whose decode steps go through
 * ms_engine_decode_batch; the batch changes from step to step: a sequence
 * prefills only after two steps (its prefill is a forward between batched
 * steps, as the slot scheduler interleaves them), one leaves early, the lead
 * changes. Checked: the greedy ids are identical, and every logit is within
 * TOL of the reference (the batched matmuls sum in another order than the
 * one-row ones: F32 reduction order, nothing else). The largest error per
 * model is printed.
 *
 * Streamed experts (the smallest cache) shared by the engines: no expert of a
 * layer is acquired twice in one step (a counting source around the streaming
 * one), the experts read per step are at most the distinct experts the step's
 * rows chose, and a batched run reads fewer expert bytes than the same
 * sequences one at a time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/streaming.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "test.h"

#define NSEQ 4
#define STEPS 8
#define TOL 1e-5

/* the step a sequence is prefilled before (0: at the start) and the last step it decodes */
static const int k_join[NSEQ] = {0, 0, 2, 0};
static const int k_last[NSEQ] = {STEPS - 1, STEPS - 1, STEPS - 1, 4};

typedef struct {
    int32_t prompt[NSEQ][32];
    int plen[NSEQ];
    int32_t ids[NSEQ][STEPS + 1]; /* the reference's greedy ids: ids[s][0] follows the prompt */
    float *logits[NSEQ];          /* [(STEPS + 1), V]: the prompt's last row, then each decode step's */
} ref_run;

static int32_t argmax(const float *x, int64_t V) {
    int32_t b = 0;
    for (int64_t v = 1; v < V; v++)
        if (x[v] > x[b]) b = (int32_t)v;
    return b;
}

/* Prompts: prefixes of the fixture's input_ids of different lengths, tokens shifted per sequence. */
static void make_prompts(ref_run *r, const int32_t *in, int n_in, int64_t V) {
    for (int s = 0; s < NSEQ; s++) {
        r->plen[s] = 3 + 4 * s < n_in ? 3 + 4 * s : n_in;
        for (int t = 0; t < r->plen[s]; t++) r->prompt[s][t] = (int32_t)((in[t] + 7 * s) % V);
    }
}

static int reference(ms_model *m, ms_expert_source *src, ref_run *r, ms_err *err) {
    int64_t V = m->cfg.vocab;
    for (int s = 0; s < NSEQ; s++) {
        ms_engine *e;
        ms_engine_opts o = {.max_ctx = 64, .max_batch = 8, .experts = src};
        if (ms_engine_create(m, &o, &e, err)) return -1;
        r->logits[s] = malloc(sizeof(float) * (size_t)V * (STEPS + 1));
        int rc = ms_engine_forward(e, r->prompt[s], r->plen[s], r->logits[s], 0, err);
        r->ids[s][0] = argmax(r->logits[s], V);
        for (int i = 1; i <= STEPS && !rc; i++) {
            rc = ms_engine_forward(e, &r->ids[s][i - 1], 1, r->logits[s] + (size_t)V * i, 0, err);
            r->ids[s][i] = argmax(r->logits[s] + (size_t)V * i, V);
        }
        ms_engine_destroy(e);
        if (rc) return -1;
    }
    return 0;
}

static void ref_free(ref_run *r) {
    for (int s = 0; s < NSEQ; s++) free(r->logits[s]);
}

/* A source around another that counts acquires per (layer, expert) since the last reset. */
typedef struct {
    ms_expert_source base;
    ms_expert_source *inner;
    int E, L;
    int *count; /* [L * E] */
    int twice;  /* an expert acquired again within one step */
} counting_source;

static int cnt_acquire(ms_expert_source *s, int layer, int n, const int *ids, ms_expert_view *v, ms_err *err) {
    counting_source *c = (counting_source *)s;
    for (int i = 0; i < n; i++)
        if (++c->count[layer * c->E + ids[i]] > 1) c->twice++;
    return ms_experts_acquire(c->inner, layer, n, ids, v, err);
}
static void cnt_release(ms_expert_source *s, int layer) { ms_experts_release(((counting_source *)s)->inner, layer); }
static void cnt_prefetch(ms_expert_source *s, int layer, int n, const int *ids) {
    ms_experts_prefetch(((counting_source *)s)->inner, layer, n, ids);
}
static void cnt_destroy(ms_expert_source *s) {}
static const ms_expert_source_ops k_cnt_ops = {cnt_acquire, cnt_release, cnt_prefetch, cnt_destroy, NULL};

/* The batched run against the reference; returns the largest logit error (or a negative on failure). */
static double batched(ms_model *m, ms_expert_source *src, counting_source *cs, const ref_run *r, const char *name,
                      uint64_t *bytes_read) {
    int64_t V = m->cfg.vocab;
    ms_engine *es[NSEQ] = {0};
    ms_err err = {0};
    double worst = 0;
    int fail = 0;
    for (int s = 0; s < NSEQ && !fail; s++) {
        ms_engine_opts o = {.max_ctx = 64, .max_batch = 8, .experts = cs ? &cs->base : src};
        fail = ms_engine_create(m, &o, &es[s], &err) != MS_OK;
    }
    CHECK_MSG(!fail, "%s: %s", name, err.msg);
    float *lg = malloc(sizeof(float) * (size_t)V * (NSEQ + 1));
    ms_stream_stats st0, st1;
    if (src && bytes_read) ms_streaming_stats(src, &st0);
    for (int step = 0; step < STEPS && !fail; step++) {
        for (int s = 0; s < NSEQ && !fail; s++) { /* prefills of sequences that join now */
            if (k_join[s] != step) continue;
            int rc = ms_engine_forward(es[s], r->prompt[s], r->plen[s], lg, 0, &err);
            CHECK_MSG(rc == MS_OK, "%s prefill %d: %s", name, s, err.msg);
            fail |= rc != MS_OK;
            double d = ms_test_max_abs(lg, r->logits[s], V);
            if (d > worst) worst = d;
            CHECK_MSG(argmax(lg, V) == r->ids[s][0], "%s: sequence %d prefill argmax", name, s);
        }
        /* this step's batch: the sequences that joined before it and have not left, in an
         * order that changes the lead (rotated by the step) */
        ms_engine *b[NSEQ];
        int who[NSEQ], k = 0;
        int32_t tok[NSEQ];
        for (int j = 0; j < NSEQ; j++) {
            int s = (j + step) % NSEQ;
            if (k_join[s] > step || step > k_last[s]) continue;
            /* the sequence's decode step i feeds ids[i - 1]; it decodes from the step after it joined */
            int i = step - k_join[s] + 1;
            if (i > STEPS) continue;
            b[k] = es[s], who[k] = s, tok[k] = r->ids[s][i - 1], k++;
        }
        if (!k) continue;
        uint64_t acq0 = 0;
        if (cs) {
            memset(cs->count, 0, sizeof(int) * (size_t)cs->L * cs->E);
            cs->twice = 0; /* the prefills before acquire experts again, by design */
            for (int j = 0; j < k; j++) acq0 += ms_engine_get_stats(b[j])->experts_acquired;
        }
        if (src && cs) ms_streaming_stats(src, &st0);
        int rc = ms_engine_decode_batch(b, k, tok, lg, &err);
        CHECK_MSG(rc == MS_OK, "%s step %d: %s", name, step, err.msg);
        if (rc) { fail = 1; break; }
        if (cs) {
            uint64_t acq1 = 0;
            for (int j = 0; j < k; j++) acq1 += ms_engine_get_stats(b[j])->experts_acquired;
            CHECK_MSG(cs->twice == 0, "%s step %d: %d experts acquired twice in one step", name, step, cs->twice);
            ms_streaming_stats(src, &st1);
            CHECK_MSG(st1.reads - st0.reads <= acq1 - acq0, "%s step %d: %llu experts read, %llu distinct chosen",
                      name, step, (unsigned long long)(st1.reads - st0.reads), (unsigned long long)(acq1 - acq0));
        }
        for (int j = 0; j < k; j++) {
            int s = who[j], i = step - k_join[s] + 1;
            const float *want = r->logits[s] + (size_t)V * i, *got = lg + (size_t)V * j;
            double d = ms_test_max_abs(got, want, V);
            if (d > worst) worst = d;
            CHECK_MSG(d <= TOL, "%s step %d sequence %d: logits differ by %g", name, step, s, d);
            CHECK_MSG(argmax(got, V) == r->ids[s][i], "%s step %d sequence %d: greedy id %d, alone %d", name, step, s,
                      argmax(got, V), r->ids[s][i]);
        }
    }
    if (src && bytes_read) {
        ms_streaming_stats(src, &st1);
        *bytes_read = st1.bytes_read - st0.bytes_read;
    }
    for (int s = 0; s < NSEQ; s++) ms_engine_destroy(es[s]);
    free(lg);
    return fail ? -1 : worst;
}

static int load(const char *name, ms_model *m, ref_run *r) {
    char dir[256], refp[300];
    snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", name);
    snprintf(refp, sizeof refp, "%s/reference.safetensors", dir);
    ms_err err = {0};
    if (ms_model_load(dir, m, &err)) {
        CHECK_MSG(0, "%s: %s", name, err.msg);
        return -1;
    }
    ms_checkpoint ref;
    if (ms_checkpoint_open(refp, &ref, &err)) {
        CHECK_MSG(0, "%s: %s", name, err.msg);
        ms_model_free(m);
        return -1;
    }
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids");
    CHECK(in && in->dtype == MS_DT_I32);
    memset(r, 0, sizeof *r);
    make_prompts(r, in->data, (int)in->shape[0], m->cfg.vocab);
    ms_checkpoint_close(&ref);
    return 0;
}

static const char *k_models[] = {"qwen3_moe",  "deepseek_v3", "deepseek_v3_fp8", "glm4_moe",      "minimax_m2",
                                 "gpt_oss",    "gpt_oss_mxfp4", "kimi_linear",   "deepseek_v32",  "glm_moe_dsa",
                                 "qwen3_next", "deepseek_v4", "glm5_next",       "kimi_k3",       "mimo_v2_flash"};

TEST(batched_equals_sequential) {
    for (size_t i = 0; i < sizeof k_models / sizeof *k_models; i++) {
        ms_model m;
        ref_run r;
        if (load(k_models[i], &m, &r)) continue;
        ms_err err = {0};
        if (reference(&m, NULL, &r, &err)) {
            CHECK_MSG(0, "%s reference: %s", k_models[i], err.msg);
        } else {
            double worst = batched(&m, NULL, NULL, &r, k_models[i], NULL);
            CHECK(worst >= 0);
            printf("batch_decode %-14s max |logit - alone| = %.3g (tolerance %g)\n", k_models[i], worst, TOL);
        }
        ref_free(&r);
        ms_model_free(&m);
    }
}

/* Streamed experts through the smallest cache, shared by every engine. */
TEST(batched_streamed_reads_each_expert_once) {
    const char *names[] = {"qwen3_moe", "deepseek_v3"};
    for (int i = 0; i < 2; i++) {
        ms_model m;
        ref_run r;
        if (load(names[i], &m, &r)) continue;
        ms_err err = {0};
        CHECK_MSG(reference(&m, NULL, &r, &err) == 0, "%s: %s", names[i], err.msg);
        ms_streaming_opts so = {.cache_mib = 0, .io = MS_IO_PREAD};
        ms_expert_source *src = NULL;
        char why[512];
        CHECK_MSG(ms_streaming_experts_create(&m, &so, &src, why, sizeof why, &err) == 0, "%s", err.msg);
        if (src) {
            counting_source cs = {.base = {.ops = &k_cnt_ops, .max_acquire = src->max_acquire}, .inner = src,
                                  .E = (int)m.cfg.n_experts, .L = (int)m.cfg.n_layers};
            cs.count = calloc((size_t)cs.L * cs.E, sizeof(int));
            double worst = batched(&m, src, &cs, &r, names[i], NULL);
            CHECK(worst >= 0 && worst <= TOL);
            free(cs.count);
            src->ops->destroy(src);
        }
        /* expert bytes read: the sequences batched vs one at a time, each through a fresh cache */
        uint64_t b_batch = 0, b_alone = 0;
        if (!ms_streaming_experts_create(&m, &so, &src, why, sizeof why, &err)) {
            CHECK(batched(&m, src, NULL, &r, names[i], &b_batch) >= 0);
            src->ops->destroy(src);
        }
        if (!ms_streaming_experts_create(&m, &so, &src, why, sizeof why, &err)) {
            ms_stream_stats a, b;
            ms_streaming_stats(src, &a);
            ref_run r2 = r;
            for (int s = 0; s < NSEQ; s++) r2.logits[s] = NULL;
            CHECK(reference(&m, src, &r2, &err) == 0);
            ms_streaming_stats(src, &b);
            b_alone = b.bytes_read - a.bytes_read;
            ref_free(&r2);
            src->ops->destroy(src);
        }
        printf("batch_decode %s streamed: %llu expert bytes read batched, %llu one at a time\n", names[i],
               (unsigned long long)b_batch, (unsigned long long)b_alone);
        CHECK_MSG(b_batch > 0 && b_batch < b_alone, "%s: batched read %llu bytes, alone %llu", names[i],
                  (unsigned long long)b_batch, (unsigned long long)b_alone);
        ref_free(&r);
        ms_model_free(&m);
    }
}

/* Misuse is refused before anything runs. */
TEST(batch_refusals) {
    ms_model m, m2;
    ref_run r;
    if (load("qwen3_moe", &m, &r)) return;
    if (load("qwen3_moe", &m2, &r)) {
        ms_model_free(&m);
        return;
    }
    ms_engine *a, *b, *c;
    ms_err err = {0};
    ms_engine_opts o = {.max_ctx = 16, .max_batch = 2};
    CHECK(ms_engine_create(&m, &o, &a, &err) == 0);
    CHECK(ms_engine_create(&m, &o, &b, &err) == 0);
    CHECK(ms_engine_create(&m2, &o, &c, &err) == 0);
    int32_t t[3] = {1, 2, 3};
    float *lg = malloc(sizeof(float) * (size_t)m.cfg.vocab * 3);
    ms_engine *dup[2] = {a, a}, *other[2] = {a, c}, *three[3] = {a, b, c};
    CHECK(ms_engine_decode_batch(dup, 2, t, lg, &err) == MS_ERR_ARG);
    CHECK(ms_engine_decode_batch(other, 2, t, lg, &err) == MS_ERR_ARG);
    CHECK(ms_engine_decode_batch(three, 3, t, lg, &err) == MS_ERR_LIMIT);
    ms_engine *ok[2] = {a, b};
    int32_t bad[2] = {1, (int32_t)m.cfg.vocab};
    CHECK(ms_engine_decode_batch(ok, 2, bad, lg, &err) == MS_ERR_ARG);
    CHECK(ms_engine_decode_batch(ok, 2, t, lg, &err) == MS_OK);
    CHECK(ms_engine_n_past(a) == 1 && ms_engine_n_past(b) == 1);
    /* the greedy pick on a host-memory (CPU) backend: forwarded as ms_engine_forward, picked on the
     * host (the first largest logit); ms_engine_greedy_logits gives that step's logits, bit for bit */
    int32_t nx = -1, five = 5;
    float *lg2 = malloc(sizeof(float) * (size_t)m.cfg.vocab);
    ms_engine *d, *f;
    CHECK(ms_engine_create(&m, &o, &d, &err) == 0 && ms_engine_create(&m, &o, &f, &err) == 0);
    CHECK(ms_engine_forward(d, t, 1, NULL, 0, &err) == 0 && ms_engine_forward(f, t, 1, NULL, 0, &err) == 0);
    CHECK(ms_engine_greedy_logits(d, lg, &err) == MS_ERR_ARG); /* none decoded yet */
    CHECK(ms_engine_decode_greedy(d, 5, &nx, &err) == MS_OK && ms_engine_n_past(d) == 2);
    CHECK(ms_engine_greedy_logits(d, lg, &err) == MS_OK);
    CHECK(ms_engine_forward(f, &five, 1, lg2, 0, &err) == 0);
    CHECK(!memcmp(lg, lg2, sizeof(float) * (size_t)m.cfg.vocab));
    int32_t best = 0;
    for (int64_t v = 1; v < m.cfg.vocab; v++)
        if (lg2[v] > lg2[best]) best = (int32_t)v;
    CHECK(nx == best);
    ms_engine_destroy(d), ms_engine_destroy(f);
    free(lg2);
    free(lg);
    ms_engine_destroy(a), ms_engine_destroy(b), ms_engine_destroy(c);
    ms_model_free(&m), ms_model_free(&m2);
}

TEST_MAIN()
