/* test_multi_stage.c — a model split over several backends (engine.h ms_stages, the
 * `--gpus` execution) on CPU backends with the host comm (core/comm.h), against the same
 * model in one engine: the pipeline split (layers over 2..4 stages, the residual handed
 * from stage to stage) gives bit-identical logits (memcmp) over a prefill and decode steps;
 * expert parallelism (each stage holds a share of every layer's experts; tokens dispatched
 * to the expert's stage and the sums combined) gives the same logits up to the F32 order of
 * the per-device sums, and the same greedy ids; snapshots and batched decode see every
 * stage's state; replicated experts run where the layer is; Attention Residuals' block states
 * travel with the residual (kimi_k3), mHC's streams are the residual handed on and compressed
 * attention's rings stay with their layer (deepseek_v4), DSA's index keys stay with their layer
 * and the chunk's selection goes along for layers that share it, tie replays span the stages
 * (deepseek_v32, glm_moe_dsa, glm5_next). Fixtures:
 * tests/data/fixtures/models/<name>. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "core/comm.h"
#include "engine/engine.h"
#include "engine/placement.h"
#include "engine/state.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "test.h"

enum { PREFILL = 7, STEPS = 5, CTX = 64 };

static int load_ids(const char *name, int32_t *ids, int cap) {
    char path[600];
    snprintf(path, sizeof path, MS_TEST_FIXTURES "%s/reference.safetensors", name);
    ms_checkpoint ref;
    ms_err err = {0};
    if (ms_checkpoint_open(path, &ref, &err)) return -1;
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids");
    int n = in && in->dtype == MS_DT_I32 ? (int)in->shape[0] : -1;
    if (n > cap) n = cap;
    if (n > 0) memcpy(ids, in->data, (size_t)n * sizeof *ids);
    ms_checkpoint_close(&ref);
    return n;
}

/* The logits of the sequence fed as a PREFILL-token prefill then one token a step: [1 + STEPS, V]. */
static int run_seq(ms_engine *e, const int32_t *ids, int n_ids, float *out, int64_t V, ms_err *err) {
    ms_engine_reset(e);
    int rc = ms_engine_forward(e, ids, PREFILL, out, 0, err);
    for (int s = 0; !rc && s < STEPS && PREFILL + s < n_ids; s++)
        rc = ms_engine_forward(e, ids + PREFILL + s, 1, out + (int64_t)(s + 1) * V, 0, err);
    return rc;
}

static int argmax(const float *x, int64_t n) {
    int b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = (int)i;
    return b;
}

typedef struct {
    ms_backend *bes[8];
    ms_comm *comm;
    ms_placement pl;
    int begin[8], end[8];
    ms_stages st;
    int n;
} split;

static int split_open(split *s, ms_model *m, int n, ms_expert_split mode, int replicate, ms_err *err) {
    memset(s, 0, sizeof *s);
    s->n = n;
    for (int i = 0; i < n; i++)
        if (ms_backend_cpu_create(NULL, &s->bes[i], err)) return -1;
    if (ms_comm_host_create(s->bes, n, &s->comm, err)) return -1;
    ms_place_input in;
    if (ms_place_input_of(m, NULL, CTX, 8, 1, mode, replicate, &in, err)) return -1;
    int rc = ms_placement_make(&in, n, NULL, &s->pl, err);
    ms_place_input_free(&in);
    if (rc) return -1;
    ms_stages_of(&s->pl, s->bes, s->comm, mode == MS_EXPERTS_SHARDED, s->begin, s->end, &s->st);
    return 0;
}

static void split_close(split *s) {
    if (s->comm) s->comm->ops->destroy(s->comm);
    for (int i = 0; i < s->n; i++)
        if (s->bes[i]) s->bes[i]->ops->destroy(s->bes[i]);
    ms_placement_free(&s->pl);
}

static void check_model(const char *name) {
    ms_model m;
    ms_err err = {0};
    char dir[512];
    snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", name);
    int32_t ids[64];
    int n_ids = load_ids(name, ids, 64);
    CHECK_MSG(n_ids > PREFILL, "%s: reference ids", name);
    if (n_ids <= PREFILL || ms_model_load(dir, &m, &err)) {
        CHECK_MSG(0, "%s: %s", name, err.msg);
        return;
    }
    int64_t V = m.cfg.vocab, rows = 1 + STEPS;
    float *ref = calloc((size_t)(rows * V), 4), *got = calloc((size_t)(rows * V), 4);
    ms_engine *one = NULL;
    ms_engine_opts o = {.max_ctx = CTX, .max_batch = 8};
    CHECK_MSG(ms_engine_create(&m, &o, &one, &err) == MS_OK, "%s: %s", name, err.msg);
    CHECK_MSG(one && run_seq(one, ids, n_ids, ref, V, &err) == MS_OK, "%s: %s", name, err.msg);
    int L = (int)m.cfg.n_layers;
    for (int n = 2; n <= 4 && n <= L + 1; n++) {
        for (int mode = 0; mode < 2; mode++) { /* pipeline only, then with expert parallelism */
            ms_expert_split sp = mode ? MS_EXPERTS_SHARDED : MS_EXPERTS_WITH_LAYER;
            if (mode && !m.cfg.n_experts) continue;
            split s;
            CHECK_MSG(split_open(&s, &m, n, sp, 0, &err) == 0, "%s: %s", name, err.msg);
            ms_engine_opts so = {.max_ctx = CTX, .max_batch = 8, .stages = &s.st};
            ms_engine *e = NULL;
            int rc = ms_engine_create(&m, &so, &e, &err);
            CHECK_MSG(rc == MS_OK, "%s, %d stages: %s", name, n, err.msg);
            if (rc) {
                split_close(&s);
                continue;
            }
            memset(got, 0, (size_t)(rows * V) * 4);
            CHECK_MSG(run_seq(e, ids, n_ids, got, V, &err) == MS_OK, "%s: %s", name, err.msg);
            CHECK(s.comm->bytes > 0 && s.comm->calls > 0);
            if (!mode) {
                CHECK_MSG(!memcmp(ref, got, (size_t)(rows * V) * 4), "%s, %d stages: logits differ (max %g)", name, n,
                          ms_test_max_abs(ref, got, rows * V));
            } else {
                double d = ms_test_max_abs(ref, got, rows * V);
                CHECK_MSG(d < 1e-3, "%s, %d stages, experts split: max |diff| %g", name, n, d);
                for (int r = 0; r < rows; r++)
                    CHECK_MSG(argmax(ref + r * V, V) == argmax(got + r * V, V), "%s, %d stages: greedy id of row %d",
                              name, n, r);
            }
            /* a snapshot after the prefill restores every stage's state */
            if (!mode) {
                ms_engine_reset(e);
                float *a = calloc((size_t)V, 4), *b = calloc((size_t)V, 4);
                ms_snapshot *snap = NULL;
                CHECK(ms_engine_forward(e, ids, PREFILL, NULL, 0, &err) == MS_OK);
                CHECK_MSG(ms_engine_snapshot(e, &snap, &err) == MS_OK, "%s", err.msg);
                CHECK(ms_engine_forward(e, ids + PREFILL, 1, a, 0, &err) == MS_OK);
                CHECK(ms_engine_forward(e, ids + PREFILL + 1, 1, b, 0, &err) == MS_OK); /* moves on */
                CHECK_MSG(snap && ms_engine_restore(e, snap, &err) == MS_OK, "%s", err.msg);
                CHECK(ms_engine_n_past(e) == PREFILL);
                CHECK(ms_engine_forward(e, ids + PREFILL, 1, b, 0, &err) == MS_OK);
                CHECK_MSG(!memcmp(a, b, (size_t)V * 4), "%s, %d stages: restored state differs", name, n);
                ms_engine_snapshot_free(snap);
                free(a), free(b);
            }
            ms_engine_destroy(e);
            split_close(&s);
        }
    }
    ms_engine_destroy(one);
    free(ref), free(got);
    ms_model_free(&m);
}

TEST(gqa_moe_qwen3) { check_model("qwen3_moe"); }
TEST(mla_deepseek_v3) { check_model("deepseek_v3"); }
TEST(gpt_oss_sinks_swa) { check_model("gpt_oss"); }
TEST(glm4_moe) { check_model("glm4_moe"); }
TEST(kda_kimi_linear) { check_model("kimi_linear"); }
TEST(gdn_qwen3_next) { check_model("qwen3_next"); }
TEST(attention_residuals_kimi_k3) { check_model("kimi_k3"); }
TEST(mhc_compressed_deepseek_v4) { check_model("deepseek_v4"); }
TEST(dsa_deepseek_v32) { check_model("deepseek_v32"); }
TEST(dsa_glm_moe) { check_model("glm_moe_dsa"); }
TEST(mhc_dsa_glm5_next) { check_model("glm5_next"); }

/* Replicas: the hottest experts held on every stage run where the layer is; the result is
 * the sharded one's (same tolerance), and fewer bytes cross between stages. */
TEST(replicated_experts_stay_local) {
    ms_model m;
    ms_err err = {0};
    int32_t ids[64];
    int n_ids = load_ids("qwen3_moe", ids, 64);
    if (n_ids <= PREFILL || ms_model_load(MS_TEST_FIXTURES "qwen3_moe", &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    int64_t V = m.cfg.vocab, rows = 1 + STEPS;
    float *a = calloc((size_t)(rows * V), 4), *b = calloc((size_t)(rows * V), 4);
    uint64_t bytes[2];
    for (int r = 0; r < 2; r++) {
        split s;
        CHECK_MSG(split_open(&s, &m, 2, MS_EXPERTS_SHARDED, r ? (int)m.cfg.n_experts : 0, &err) == 0, "%s", err.msg);
        ms_engine_opts so = {.max_ctx = CTX, .max_batch = 8, .stages = &s.st};
        ms_engine *e = NULL;
        CHECK_MSG(ms_engine_create(&m, &so, &e, &err) == MS_OK, "%s", err.msg);
        if (e) CHECK_MSG(run_seq(e, ids, n_ids, r ? b : a, V, &err) == MS_OK, "%s", err.msg);
        bytes[r] = s.comm->bytes;
        ms_engine_destroy(e);
        split_close(&s);
    }
    /* every expert replicated: nothing is dispatched, only the pipeline hand-offs move */
    CHECK_MSG(bytes[1] < bytes[0], "%llu vs %llu bytes", (unsigned long long)bytes[1], (unsigned long long)bytes[0]);
    CHECK(ms_test_max_abs(a, b, rows * V) < 1e-3);
    free(a), free(b);
    ms_model_free(&m);
}

/* Two sequences decoded together through a split engine pair give what each gives alone. */
TEST(batched_decode_over_stages) {
    ms_model m;
    ms_err err = {0};
    int32_t ids[64];
    int n_ids = load_ids("qwen3_moe", ids, 64);
    if (n_ids <= PREFILL + 2 || ms_model_load(MS_TEST_FIXTURES "qwen3_moe", &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    int64_t V = m.cfg.vocab;
    split s;
    CHECK_MSG(split_open(&s, &m, 3, MS_EXPERTS_WITH_LAYER, 0, &err) == 0, "%s", err.msg);
    ms_engine_opts so = {.max_ctx = CTX, .max_batch = 8, .stages = &s.st};
    ms_engine *e0 = NULL, *e1 = NULL;
    CHECK(ms_engine_create(&m, &so, &e0, &err) == MS_OK);
    so.weights_from = e0;
    CHECK_MSG(ms_engine_create(&m, &so, &e1, &err) == MS_OK, "%s", err.msg);
    float *alone = calloc((size_t)(2 * V), 4), *both = calloc((size_t)(2 * V), 4);
    if (e0 && e1) {
        /* sequence 0: the ids; sequence 1: the ids from 1 on */
        CHECK(ms_engine_forward(e0, ids, PREFILL, NULL, 0, &err) == MS_OK);
        CHECK(ms_engine_forward(e0, ids + PREFILL, 1, alone, 0, &err) == MS_OK);
        CHECK(ms_engine_forward(e1, ids + 1, PREFILL, NULL, 0, &err) == MS_OK);
        CHECK(ms_engine_forward(e1, ids + PREFILL + 1, 1, alone + V, 0, &err) == MS_OK);
        ms_engine_reset(e0), ms_engine_reset(e1);
        CHECK(ms_engine_forward(e0, ids, PREFILL, NULL, 0, &err) == MS_OK);
        CHECK(ms_engine_forward(e1, ids + 1, PREFILL, NULL, 0, &err) == MS_OK);
        ms_engine *es[2] = {e0, e1};
        int32_t tok[2] = {ids[PREFILL], ids[PREFILL + 1]};
        CHECK_MSG(ms_engine_decode_batch(es, 2, tok, both, &err) == MS_OK, "%s", err.msg);
        CHECK_MSG(ms_test_max_abs(alone, both, 2 * V) < 1e-4, "batched vs alone: %g", ms_test_max_abs(alone, both, 2 * V));
        CHECK(ms_engine_n_past(e0) == PREFILL + 1 && ms_engine_n_past(e1) == PREFILL + 1);
    }
    ms_engine_destroy(e1);
    ms_engine_destroy(e0);
    split_close(&s);
    free(alone), free(both);
    ms_model_free(&m);
}

/* An expert source from outside (streamed experts) is refused by name, before anything is allocated. */
TEST(refuses_an_external_expert_source) {
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(MS_TEST_FIXTURES "qwen3_moe", &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    split s;
    CHECK(split_open(&s, &m, 2, MS_EXPERTS_WITH_LAYER, 0, &err) == 0);
    ms_expert_source *src = NULL;
    CHECK(ms_resident_experts_create(&m, &src, &err) == MS_OK);
    ms_engine_opts so = {.max_ctx = CTX, .max_batch = 8, .stages = &s.st, .experts = src};
    ms_engine *e = NULL;
    CHECK(ms_engine_create(&m, &so, &e, &err) == MS_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "not supported yet"), "%s", err.msg);
    CHECK(e == NULL);
    if (src) src->ops->destroy(src);
    split_close(&s);
    ms_model_free(&m);
}

TEST_MAIN()
