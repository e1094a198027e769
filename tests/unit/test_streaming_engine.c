/* The engine with streamed experts gives logits bit-identical to the resident
 * engine: every io mode, the smallest cache, a mid-sized cache with lookahead
 * prefetch, and a packed store; a store of another model is refused. */
#include <stdint.h>
#include <sys/stat.h>

#include "engine/engine.h"
#include "engine/streaming.h"
#include "model/synth.h"
#include "test.h"

#define N_DECODE 6

/* Prefill input_ids (all logits), then N_DECODE greedy decode steps (last logits each). */
static float *run(ms_model *m, ms_expert_source *src, const int32_t *ids, int n, int64_t V, ms_err *err) {
    ms_engine *e;
    ms_engine_opts o = {.max_ctx = 128, .experts = src};
    if (ms_engine_create(m, &o, &e, err)) return NULL;
    float *out = malloc(sizeof(float) * (size_t)V * (n + N_DECODE));
    int rc = ms_engine_forward(e, ids, n, out, 1, err);
    for (int i = 0; i < N_DECODE && !rc; i++) {
        const float *last = out + (size_t)V * (n - 1 + i);
        int32_t tok = 0;
        for (int64_t v = 1; v < V; v++)
            if (last[v] > last[tok]) tok = (int32_t)v;
        rc = ms_engine_forward(e, &tok, 1, out + (size_t)V * (n + i), 0, err);
    }
    ms_engine_destroy(e);
    if (rc) { free(out); return NULL; }
    return out;
}

/* Streams the experts of model dir (loaded as m) in every configuration and compares
 * with the resident logits for prompt ids[n]. */
static void check_model(const char *name, const char *dir, const int32_t *ids, int n);

static void check_fixture(const char *name) {
    char dir[256], refp[300];
    snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", name);
    snprintf(refp, sizeof refp, "%s/reference.safetensors", dir);
    ms_checkpoint ref;
    ms_err err = {0};
    CHECK(ms_checkpoint_open(refp, &ref, &err) == 0);
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids");
    check_model(name, dir, in->data, (int)in->shape[0]);
    ms_checkpoint_close(&ref);
}

static void check_model(const char *name, const char *dir, const int32_t *ids, int n) {
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(dir, &m, &err)) { CHECK_MSG(0, "%s: %s", name, err.msg); return; }
    int64_t V = m.cfg.vocab;
    size_t total = (size_t)V * (n + N_DECODE);
    float *base = run(&m, NULL, ids, n, V, &err);
    CHECK_MSG(base != NULL, "%s resident: %s", name, err.msg);
    char store[300];
    snprintf(store, sizeof store, "build/tmp/engine_store_%s", name);
    mkdir("build/tmp", 0755);
    ms_pack_stats ps;
    CHECK_MSG(ms_streaming_pack(&m, store, NULL, 0, &ps, &err) == 0, "%s pack: %s", name, err.msg);
    struct { ms_io_mode io; int64_t mib; const char *store; ms_cache_policy pol; } cfgs[] = {
        {MS_IO_URING, 0, NULL, MS_CACHE_LFU_DECAY}, {MS_IO_PREAD, 0, NULL, MS_CACHE_LFU_DECAY},
        {MS_IO_MMAP, 0, NULL, MS_CACHE_LRU},        {MS_IO_AUTO, 1, NULL, MS_CACHE_LFU_DECAY},
        {MS_IO_URING, 0, store, MS_CACHE_LFU_DECAY}, {MS_IO_AUTO, 1, store, MS_CACHE_LRU},
    };
    for (size_t k = 0; base && k < sizeof cfgs / sizeof *cfgs; k++) {
        ms_streaming_opts so = {.cache_mib = cfgs[k].mib, .io = cfgs[k].io, .store_dir = cfgs[k].store,
                                .policy = cfgs[k].pol};
        ms_expert_source *src;
        char why[1024];
        if (ms_streaming_experts_create(&m, &so, &src, why, sizeof why, &err)) {
            CHECK_MSG(0, "%s cfg %zu: %s", name, k, err.msg);
            continue;
        }
        CHECK(ms_is_streaming_source(src) && src->max_acquire >= m.cfg.top_k);
        /* views point into the cache, not the mapping, over the same bytes */
        for (int l = 0; l < m.cfg.n_layers; l++) {
            if (!m.layers[l].experts) continue;
            int id = (int)m.cfg.n_experts - 1;
            ms_expert_view v;
            CHECK_MSG(ms_experts_acquire(src, l, 1, &id, &v, &err) == 0, "%s", err.msg);
            const ms_expert_view *r = &m.layers[l].experts[id];
            const uint8_t *p = v.down.data, *mp = m.ck.files[0].map.data;
            CHECK(!(p >= mp && p < mp + m.ck.files[0].map.size));
            CHECK(!memcmp(v.down.data, r->down.data, (size_t)(r->down.rows * r->down.cols * ms_dtype_bits(r->down.dtype) / 8)));
            CHECK(v.down.rows == r->down.rows && v.down.dtype == r->down.dtype && v.down.brow == r->down.brow);
            CHECK((v.down.scale == NULL) == (r->down.scale == NULL));
            CHECK((v.down.zero == NULL) == (r->down.zero == NULL)); /* asymmetric INT4: the zero points stream too */
            if (r->down.zero) {
                const uint8_t *z = v.down.zero;
                CHECK(!(z >= mp && z < mp + m.ck.files[0].map.size));
                CHECK(!memcmp(v.down.zero, r->down.zero, (size_t)((r->down.rows + 7) / 8 * (r->down.cols / r->down.bcol) * 4)));
            }
            ms_experts_release(src, l);
            break;
        }
        float *got = run(&m, src, ids, n, V, &err);
        CHECK_MSG(got != NULL, "%s cfg %zu: %s", name, k, err.msg);
        ms_stream_stats st;
        ms_streaming_stats(src, &st);
        CHECK(st.misses > 0 && (st.bytes_read > 0 || !strcmp(name, "gpt_oss"))); /* gpt_oss BF16: copies, nothing to read */
        if (got) CHECK_MSG(memcmp(got, base, total * sizeof(float)) == 0, "%s cfg %zu (%s): logits differ", name, k, why);
        free(got);
        src->ops->destroy(src);
    }
    free(base);
    ms_model_free(&m);
}

TEST(bit_identical_to_resident) {
    /* every tests/data fixture (all have routed experts; gpt_oss's BF16 experts are transposed copies
     * made at load, so they stay resident and only its MXFP4 twin reads from disk) */
    const char *names[] = {"deepseek_v3", "deepseek_v3_fp8", "deepseek_v32", "deepseek_v4", "glm4_moe", "glm5_next",
                           "glm_moe_dsa", "gpt_oss", "gpt_oss_mxfp4", "kimi_k3", "kimi_k3_mxfp4", "kimi_linear", "kimi_linear_fp8",
                           "mimo_v2_flash", "minimax_m2", "qwen3_moe", "qwen3_next"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) check_fixture(names[i]);
}

/* INT4 compressed-tensors experts (synth --expert-dtype int4, and int4-asym with zero points)
 * on a DeepSeek-V3 and a Kimi Linear model: streamed (every io mode, the smallest cache, a
 * packed store) equals resident. */
TEST(int4_bit_identical_to_resident) {
    const char *names[] = {"deepseek_v3", "kimi_linear", "deepseek_v3", "kimi_linear"};
    mkdir("build/tmp", 0755);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char cfg[256], out[256], label[64];
        int asym = i >= 2;
        snprintf(cfg, sizeof cfg, MS_TEST_FIXTURES "%s/config.json", names[i]);
        snprintf(out, sizeof out, "build/tmp/int4%s_stream_%s", asym ? "z" : "", names[i]);
        snprintf(label, sizeof label, "%s_int4%s", names[i], asym ? "_asym" : "");
        ms_synth_opts o = {.config_path = cfg, .out_dir = out, .seed = 11, .dtype = MS_DT_BF16, .expert_dtype = MS_DT_I4,
                           .int4_asym = asym};
        ms_synth_result r;
        ms_err err = {0};
        if (ms_synth(&o, &r, &err)) { CHECK_MSG(0, "%s synth: %s", names[i], err.msg); continue; }
        int32_t ids[24];
        for (int k = 0; k < 24; k++) ids[k] = (int32_t)((k * 37 + 5) % 200 + 1);
        check_model(label, out, ids, 24);
    }
}

TEST(refuses_store_of_another_model) {
    ms_model a, b;
    ms_err err = {0};
    CHECK(ms_model_load(MS_TEST_FIXTURES "deepseek_v3", &a, &err) == 0);
    CHECK(ms_model_load(MS_TEST_FIXTURES "glm4_moe", &b, &err) == 0);
    mkdir("build/tmp", 0755);
    CHECK(ms_streaming_pack(&a, "build/tmp/engine_store_other", NULL, 0, NULL, &err) == 0);
    ms_streaming_opts so = {.store_dir = "build/tmp/engine_store_other"};
    ms_expert_source *src;
    err = (ms_err){0};
    int rc = ms_streaming_experts_create(&b, &so, &src, NULL, 0, &err);
    CHECK_MSG(rc == MS_ERR_MISMATCH && strstr(err.msg, "another checkpoint"), "%d %s", rc, err.msg);
    /* the smallest cache (top-k slots) is accepted */
    ms_streaming_opts tiny = {.cache_mib = 0};
    CHECK(ms_streaming_experts_create(&a, &tiny, &src, NULL, 0, &err) == 0);
    src->ops->destroy(src);
    ms_model_free(&a);
    ms_model_free(&b);
}

TEST_MAIN()
