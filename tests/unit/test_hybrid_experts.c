/* Hybrid execution (engine/hybrid_experts.h) over a fake device: a backend that runs
 * the CPU backend's ops but reports host_memory = 0, so the engine places the weights in
 * the fake's own memory and moves data only through upload / download, as on a GPU (the
 * fake of test_device_experts.c). With every MoE layer's experts on the CPU, with the first
 * one only (--cpu-moe-layers 1), and with a host streaming cache feeding the CPU layers,
 * prefill + greedy decode logits equal the CPU resident run within 1e-5 (the same kernels
 * run the sums; only the shared expert's add is a separate op) with identical greedy ids;
 * the CPU layers' experts are never placed on the device (its allocations shrink by their
 * bytes), the counters add up, and the auto rule and parsers behave as documented. With
 * gpu_share (part of each chunk's experts uploaded and summed on the device) within 1e-4 with
 * identical ids (byte-identical where the sums are top-2, which commute; the top-3 fixture 3.6e-7). */
#include <stdint.h>

#include "backend/cpu/be_cpu.h"
#include "engine/engine.h"
#include "engine/hybrid_experts.h"
#include "engine/streaming.h"
#include "test.h"

#define N_DECODE 5

#include "fake_device.h"

/* ---------------- runs ---------------- */

/* Prefill input_ids (all logits), then N_DECODE greedy decode steps; ids[N_DECODE] receive
 * the greedy tokens. hs: the engine's hybrid counters at the end (zero when none). */
static float *run(ms_model *m, ms_backend *be, ms_expert_source *src, const ms_hybrid_opts *hy, const int32_t *in,
                  int n, int32_t *ids, ms_hybrid_stats *hs, ms_err *err) {
    int64_t V = m->cfg.vocab;
    ms_engine *e;
    ms_engine_opts o = {.max_ctx = 128, .experts = src, .backend = be, .hybrid = hy};
    if (ms_engine_create(m, &o, &e, err)) return NULL;
    float *out = malloc(sizeof(float) * (size_t)V * (n + N_DECODE));
    int rc = ms_engine_forward(e, in, n, out, 1, err);
    for (int i = 0; i < N_DECODE && !rc; i++) {
        const float *last = out + (size_t)V * (n - 1 + i);
        int32_t tok = 0;
        for (int64_t v = 1; v < V; v++)
            if (last[v] > last[tok]) tok = (int32_t)v;
        ids[i] = tok;
        rc = ms_engine_forward(e, &tok, 1, out + (size_t)V * (n + i), 0, err);
    }
    if (hs) ms_engine_hybrid_stats(e, hs);
    ms_engine_destroy(e);
    if (rc) { free(out); return NULL; }
    return out;
}

static int n_moe_layers(const ms_model *m) {
    int k = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) k += m->cfg.layer_mlp[l] == MS_MLP_MOE;
    return k;
}

static void check_fixture(const char *name) {
    char dir[256], refp[300];
    snprintf(dir, sizeof dir, strchr(name, '/') ? "%s" : MS_TEST_FIXTURES "%s", name); /* a name, or a fixture's dir */
    snprintf(refp, sizeof refp, "%s/reference.safetensors", dir);
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(dir, &m, &err)) { CHECK_MSG(0, "%s: %s", name, err.msg); return; }
    ms_checkpoint ref;
    CHECK(ms_checkpoint_open(refp, &ref, &err) == 0);
    const ms_tensor *tin = ms_checkpoint_find(&ref, "input_ids");
    int n = (int)tin->shape[0];
    size_t total = (size_t)m.cfg.vocab * (n + N_DECODE);
    int32_t base_ids[N_DECODE], ids[N_DECODE];
    float *base = run(&m, NULL, NULL, NULL, tin->data, n, base_ids, NULL, &err);
    CHECK_MSG(base != NULL, "%s resident: %s", name, err.msg);
    int L = m.cfg.n_layers, moe = n_moe_layers(&m);
    uint8_t *flags = calloc((size_t)L, 1);
    /* the fake device, everything placed: the allocation baseline */
    ms_backend *be = fake_create();
    ms_hybrid_stats hs;
    float *placed = base ? run(&m, be, NULL, NULL, tin->data, n, ids, &hs, &err) : NULL;
    CHECK_MSG(placed != NULL, "%s placed: %s", name, err.msg);
    CHECK(hs.cpu_layers == 0 && hs.layer_calls == 0);
    uint64_t all_bytes = fk(be)->alloc_bytes;
    free(placed);
    be->ops->destroy(be);
    /* all MoE layers (the one-row decode form, then the composed form), the first only, a host cache */
    /* and gpu_share: part of each chunk's experts uploaded into device slots and computed there (the
     * two partial sums added on the device: within rounding of the CPU engine, not its bytes) */
    struct { int first; int stream; int composed; double share; int slots; } cfgs[] = {
        {-1, 0, 0, 0, 0}, {-1, 0, 1, 0, 0}, {1, 0, 0, 0, 0}, {-1, 1, 0, 0, 0},
        {-1, 0, 0, 0.4, 0}, {1, 0, 0, 1.0, 0}, {-1, 0, 0, 0.5, 1}};
    for (size_t k = 0; base && k < sizeof cfgs / sizeof *cfgs; k++) {
        int n_cpu = ms_hybrid_first_layers(&m.cfg, cfgs[k].first, flags);
        CHECK(n_cpu == (cfgs[k].first < 0 || cfgs[k].first > moe ? moe : cfgs[k].first));
        ms_expert_source *host = NULL;
        if (cfgs[k].stream) {
            ms_streaming_opts so = {.cache_mib = 0}; /* the smallest host cache: top-k slots, groups */
            char why[1200];
            CHECK_MSG(ms_streaming_experts_create(&m, &so, &host, why, sizeof why, &err) == 0, "%s", err.msg);
        }
        ms_hybrid_opts hy = {.cpu_layer = flags, .host = host, .composed = cfgs[k].composed,
                             .gpu_share = cfgs[k].share, .gpu_slots = cfgs[k].slots};
        int share = cfgs[k].share > 0;
        be = fake_create();
        float *hyb = run(&m, be, NULL, &hy, tin->data, n, ids, &hs, &err);
        CHECK_MSG(hyb != NULL, "%s hybrid cfg %zu: %s", name, k, err.msg);
        if (hyb) {
            double d = ms_test_max_abs(hyb, base, (int64_t)total);
            CHECK_MSG(d <= (share ? 1e-4 : 1e-5), "%s hybrid cfg %zu: max |diff| %g", name, k, d);
            /* today's CPU kernels give the same bytes either way (the same products and adds in the same order) */
            CHECK_MSG(share || !memcmp(hyb, base, total * 4), "%s hybrid cfg %zu: not byte-identical", name, k);
            CHECK_MSG(!share || (hs.gpu_experts > 0 && hs.gpu_expert_bytes > 0 && hs.gpu_pinned),
                      "%s cfg %zu: %llu experts on the device (pinned %d)", name, k,
                      (unsigned long long)hs.gpu_experts, hs.gpu_pinned);
            CHECK_MSG(share || hs.gpu_experts == 0, "%s cfg %zu: device experts without gpu_share", name, k);
            if (getenv("MS_TEST_VERBOSE")) fprintf(stderr, "%s cfg %zu: max |diff| %g\n", name, k, d);
            CHECK_MSG(!memcmp(ids, base_ids, sizeof ids), "%s hybrid cfg %zu: greedy ids differ", name, k);
            /* every CPU layer ran once per chunk: the prefill (one chunk) and each decode step */
            CHECK_MSG(hs.cpu_layers == n_cpu && hs.layer_calls == (uint64_t)n_cpu * (1 + N_DECODE),
                      "%s cfg %zu: %d layers, %llu calls", name, k, hs.cpu_layers, (unsigned long long)hs.layer_calls);
            CHECK(hs.experts >= (uint64_t)n_cpu * (1 + N_DECODE) && hs.expert_bytes > 0 && hs.cpu_s >= 0);
            /* the CPU layers' experts were never placed on the device */
            uint64_t cpu_bytes = 0;
            for (int l = 0; l < L; l++)
                if (flags[l]) cpu_bytes += ms_hybrid_expert_bytes(&m, l) * (uint64_t)m.cfg.n_experts;
            CHECK_MSG(share || fk(be)->alloc_bytes + cpu_bytes <= all_bytes + 4096,
                      "%s cfg %zu: %llu device bytes with %llu of CPU experts (all placed: %llu)", name, k,
                      (unsigned long long)fk(be)->alloc_bytes, (unsigned long long)cpu_bytes,
                      (unsigned long long)all_bytes);
        }
        free(hyb);
        be->ops->destroy(be);
        if (host) host->ops->destroy(host);
    }
    /* on a host-memory backend the options change nothing: the CPU engine's own logits */
    ms_hybrid_first_layers(&m.cfg, -1, flags);
    ms_hybrid_opts hy = {.cpu_layer = flags};
    float *cpu = base ? run(&m, NULL, NULL, &hy, tin->data, n, ids, &hs, &err) : NULL;
    CHECK(cpu && !memcmp(cpu, base, total * 4) && hs.cpu_layers == 0);
    free(cpu);
    free(flags);
    free(base);
    ms_checkpoint_close(&ref);
    ms_model_free(&m);
}

TEST(qwen3_moe) { check_fixture("qwen3_moe"); }
TEST(deepseek_v3) { check_fixture("deepseek_v3"); }
TEST(deepseek_v3_fp8) { check_fixture("deepseek_v3_fp8"); }
TEST(glm4_moe) { check_fixture("glm4_moe"); }
TEST(gpt_oss_mxfp4) { check_fixture("gpt_oss_mxfp4"); }
TEST(qwen3_next) { check_fixture("qwen3_next"); } /* gated shared expert */
TEST(kimi_k3) { check_fixture("kimi_k3"); }       /* latent MoE */
TEST(longcat_flash) { check_fixture("tests/fixtures/extra/longcat_flash"); } /* zero-computation experts */
TEST(qwen3_moe_e12_top3) { check_fixture("tests/fixtures/extra/qwen3_moe_e12_top3"); } /* top-3: the device share's partial sums do not commute */

TEST(parse_and_rules) {
    ms_err err = {0};
    ms_experts_on on;
    CHECK(ms_experts_on_parse("cpu", &on, &err) == 0 && on == MS_EXPERTS_ON_CPU);
    CHECK(ms_experts_on_parse("auto", &on, &err) == 0 && on == MS_EXPERTS_ON_AUTO);
    CHECK(ms_experts_on_parse("gpu", &on, &err) == 0 && on == MS_EXPERTS_ON_GPU);
    CHECK(ms_experts_on_parse("GPU", &on, &err) == MS_ERR_ARG && strstr(err.msg, "GPU"));
    ms_model m;
    if (ms_model_load(MS_TEST_FIXTURES "qwen3_moe", &m, &err)) { CHECK_MSG(0, "%s", err.msg); return; }
    int L = m.cfg.n_layers, moe = n_moe_layers(&m);
    uint8_t *f = calloc((size_t)L, 1);
    CHECK(ms_hybrid_first_layers(&m.cfg, 0, f) == 0);
    CHECK(ms_hybrid_first_layers(&m.cfg, 1000, f) == moe);
    uint64_t layer_bytes = 0;
    for (int l = 0; l < L; l++)
        if (m.layers[l].experts) layer_bytes = ms_hybrid_expert_bytes(&m, l) * (uint64_t)m.cfg.n_experts;
    CHECK(layer_bytes > 0);
    char why[512];
    ms_hybrid_measure fast_cpu = {.pcie_h2d_gb_s = 10, .cpu_expert_gb_s = 20};
    ms_hybrid_measure slow_cpu = {.pcie_h2d_gb_s = 20, .cpu_expert_gb_s = 10};
    /* everything fits: all on the device */
    CHECK(ms_hybrid_auto_layers(&m, &slow_cpu, layer_bytes * (uint64_t)L, 0, f, why, sizeof why) == 0);
    CHECK(ms_hybrid_auto_layers(&m, &fast_cpu, layer_bytes * (uint64_t)L, 1, f, why, sizeof why) == 0);
    /* nothing fits: the CPU when it is faster or when nothing can stream; else the device cache */
    CHECK(ms_hybrid_auto_layers(&m, &fast_cpu, 0, 1, f, why, sizeof why) == moe);
    CHECK(ms_hybrid_auto_layers(&m, &slow_cpu, 0, 0, f, why, sizeof why) == moe);
    CHECK(ms_hybrid_auto_layers(&m, &slow_cpu, 0, 1, f, why, sizeof why) == 0);
    /* one layer fits: the others, the first ones, go to the CPU */
    if (moe >= 2) {
        CHECK(ms_hybrid_auto_layers(&m, &fast_cpu, layer_bytes, 1, f, why, sizeof why) == moe - 1);
        int last = -1;
        for (int l = 0; l < L; l++)
            if (m.cfg.layer_mlp[l] == MS_MLP_MOE) last = l;
        CHECK(last >= 0 && f[last] == 0 && strstr(why, "on the CPU"));
    }
    free(f);
    ms_model_free(&m);
}

/* The probes over the fake device: every rate measured and positive (uploads are memcpy there). */
TEST(measure) {
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(MS_TEST_FIXTURES "deepseek_v3_fp8", &m, &err)) { CHECK_MSG(0, "%s", err.msg); return; }
    ms_backend *be = fake_create();
    ms_pool *pool = ms_pool_create(2);
    ms_hybrid_measure hm;
    CHECK_MSG(ms_hybrid_measure_run(&m, be, pool, &hm, &err) == 0, "%s", err.msg);
    CHECK(hm.pcie_h2d_gb_s > 0 && hm.pcie_pageable_gb_s > 0 && hm.ram_read_gb_s > 0 && hm.cpu_expert_gb_s > 0);
    CHECK(hm.threads == ms_pool_size(pool));
    CHECK(fk(be)->reg == NULL); /* the probe's buffer was registered and given back */
    ms_pool_destroy(pool);
    be->ops->destroy(be);
    ms_model_free(&m);
}

TEST_MAIN()
