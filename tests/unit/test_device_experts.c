/* The device expert source over a fake device: a backend that runs the CPU
 * backend's ops but reports host_memory = 0, so the engine places the weights
 * (copies in the fake's own memory) and moves data only through upload and
 * download, as on a GPU. Experts streamed through the host cache (the smallest
 * one) into a device slot arena (the smallest one, and one that holds every
 * expert) give logits memcmp-identical to the CPU resident run on every MoE
 * fixture; the views lie in the fake's memory; hits + misses = requests, each
 * miss is one upload, no step uploads more experts than it acquires, and a warm
 * cache that holds everything uploads nothing. The lookahead gate (held or
 * forwarded guesses) changes what is read, never the logits. */
#include <stdint.h>

#include "backend/cpu/be_cpu.h"
#include "engine/device_experts.h"
#include "engine/engine.h"
#include "engine/streaming.h"
#include "test.h"

#define N_DECODE 6

#include "fake_device.h"

/* ---------------- runs ---------------- */

typedef struct step_acct {
    int bad_steps;        /* steps that uploaded more experts than they acquired */
    uint64_t uploads;     /* device uploads during the run */
} step_acct;

/* Prefill input_ids (all logits), then N_DECODE greedy decode steps (last logits each). */
static float *run(ms_model *m, ms_backend *be, ms_expert_source *src, const int32_t *ids, int n, step_acct *acct,
                  ms_err *err) {
    int64_t V = m->cfg.vocab;
    ms_engine *e;
    ms_engine_opts o = {.max_ctx = 128, .experts = src, .backend = be};
    if (ms_engine_create(m, &o, &e, err)) return NULL;
    float *out = malloc(sizeof(float) * (size_t)V * (n + N_DECODE));
    int dev = src && ms_is_device_experts(src);
    ms_device_experts_stats s0 = {0}, s1 = {0}, sa = {0};
    uint64_t a0 = ms_engine_get_stats(e)->experts_acquired;
    if (dev) ms_device_experts_stats_get(src, &s0);
    sa = s0;
    int rc = ms_engine_forward(e, ids, n, out, 1, err);
    for (int i = 0; i <= N_DECODE && !rc; i++) {
        if (dev) { /* this step: uploads <= distinct (layer, expert) pairs acquired */
            ms_device_experts_stats_get(src, &s1);
            uint64_t a1 = ms_engine_get_stats(e)->experts_acquired;
            if (s1.uploads - s0.uploads > a1 - a0) acct->bad_steps++;
            s0 = s1, a0 = a1;
        }
        if (i == N_DECODE) break;
        const float *last = out + (size_t)V * (n - 1 + i);
        int32_t tok = 0;
        for (int64_t v = 1; v < V; v++)
            if (last[v] > last[tok]) tok = (int32_t)v;
        rc = ms_engine_forward(e, &tok, 1, out + (size_t)V * (n + i), 0, err);
    }
    if (dev) acct->uploads += s1.uploads - sa.uploads;
    ms_engine_destroy(e);
    if (rc) { free(out); return NULL; }
    return out;
}

static void check_fixture_on(const char *name, int routed) {
    char dir[256], refp[300];
    snprintf(dir, sizeof dir, strchr(name, '/') ? "%s" : MS_TEST_FIXTURES "%s", name); /* a name, or a fixture's dir */
    snprintf(refp, sizeof refp, "%s/reference.safetensors", dir);
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(dir, &m, &err)) { CHECK_MSG(0, "%s: %s", name, err.msg); return; }
    ms_checkpoint ref;
    CHECK(ms_checkpoint_open(refp, &ref, &err) == 0);
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids");
    int n = (int)in->shape[0];
    size_t total = (size_t)m.cfg.vocab * (n + N_DECODE);
    step_acct acct = {0};
    float *base = run(&m, NULL, NULL, in->data, n, &acct, &err);
    CHECK_MSG(base != NULL, "%s resident: %s", name, err.msg);
    ms_backend *be = fake_create();
    if (routed) fake_enable_routed(be);
    fk(be)->refuse_per_call = routed == 2; /* streamed decode then falls back to the lists, once per engine */
    /* the fake device with resident (placed) experts: only copies, so the same logits */
    float *placed = base ? run(&m, be, NULL, in->data, n, &acct, &err) : NULL;
    CHECK_MSG(placed && !memcmp(placed, base, total * 4), "%s placed on the fake device%s: %s", name,
              routed ? " (routed)" : "", placed ? "logits differ" : err.msg);
    /* the routed decode form where the model allows it (no zero-computation experts) */
    int routable = routed && !m.cfg.n_zero_experts && m.cfg.top_k <= 32;
    CHECK(!routable || (fk(be)->routed_calls > 0 && fk(be)->routed_per_call == 0));
    free(placed);
    /* a host streaming source is refused there: its views are host memory */
    ms_streaming_opts so = {.cache_mib = 0};
    ms_expert_source *host = NULL, *dev = NULL;
    char why[1200];
    CHECK_MSG(ms_streaming_experts_create(&m, &so, &host, why, sizeof why, &err) == 0, "%s: %s", name, err.msg);
    if (host) {
        ms_engine *e = NULL;
        ms_engine_opts o = {.max_ctx = 64, .experts = host, .backend = be};
        CHECK(ms_engine_create(&m, &o, &e, &err) == MS_ERR_UNSUPPORTED && !e);
    }
    uint64_t slot = ms_device_expert_slot_bytes(&m), all = 0;
    for (int l = 0; l < m.cfg.n_layers; l++) all += m.layers[l].experts ? (uint64_t)m.cfg.n_experts : 0;
    /* a budget below top-k slots is refused, naming the need */
    ms_device_experts_opts dz = {.budget_bytes = slot * (uint64_t)(m.cfg.top_k - 1) + 1};
    CHECK(host && ms_device_experts_create(&m, be, host, &dz, &dev, why, sizeof why, &err) == MS_ERR_NOMEM && !dev);
    struct { uint64_t slots; ms_cache_policy pol; int no_pin, prefetch_all, old; } cfgs[] = {
        {(uint64_t)m.cfg.top_k, MS_CACHE_LFU_DECAY, 0, 0, 0}, /* the smallest device cache: groups of top-k */
        {(uint64_t)m.cfg.top_k, MS_CACHE_LFU_DECAY, 0, 1, 0}, /* the same, every lookahead guess read */
        {(uint64_t)m.cfg.top_k + 3, MS_CACHE_LRU, 1, 0, 0},
        {all, MS_CACHE_LFU_DECAY, 0, 0, 0},                    /* every expert fits */
        /* the earlier forms: expert lists, the gate forwarding while warming up, every guess made */
        {(uint64_t)m.cfg.top_k + 1, MS_CACHE_LFU_DECAY, 0, 0, 1},
    };
    for (size_t k = 0; host && base && k < sizeof cfgs / sizeof *cfgs; k++) {
        ms_device_experts_opts dopt = {.budget_bytes = slot * cfgs[k].slots, .policy = cfgs[k].pol,
                                       .no_pin = cfgs[k].no_pin, .prefetch_all = cfgs[k].prefetch_all,
                                       .lists = cfgs[k].old, .gate_warm_open = cfgs[k].old,
                                       .always_guess = cfgs[k].old};
        if (ms_device_experts_create(&m, be, host, &dopt, &dev, why, sizeof why, &err)) {
            CHECK_MSG(0, "%s cfg %zu: %s", name, k, err.msg);
            continue;
        }
        CHECK(ms_is_device_experts(dev) && dev->views_on == be && dev->max_acquire == (int)cfgs[k].slots);
        CHECK((fk(be)->reg != NULL) == !cfgs[k].no_pin);
        /* a view: in the fake's memory (not the mapping, not the host cache), over the same bytes */
        for (int l = 0; l < m.cfg.n_layers; l++) {
            if (!m.layers[l].experts) continue;
            int id = (int)m.cfg.n_experts - 1;
            ms_expert_view v;
            CHECK_MSG(ms_experts_acquire(dev, l, 1, &id, &v, &err) == 0, "%s", err.msg);
            const ms_expert_view *r = &m.layers[l].experts[id];
            size_t db = (size_t)((r->down.rows * r->down.cols * ms_dtype_bits(r->down.dtype) + 7) / 8);
            CHECK(is_dev(be, v.down.data, db) && is_dev(be, v.gate.data, 1));
            CHECK(!r->down.scale || is_dev(be, v.down.scale, 1));
            CHECK(!r->gate_bias || is_dev(be, v.gate_bias, 1));
            CHECK(!r->down.zero || is_dev(be, v.down.zero, 1)); /* asymmetric INT4: the zero points moved too */
            uint8_t *tmp = malloc(db);
            be->ops->download(be, tmp, v.down.data, db, &err);
            CHECK(!memcmp(tmp, r->down.data, db));
            free(tmp);
            CHECK(v.down.rows == r->down.rows && v.down.dtype == r->down.dtype && v.down.brow == r->down.brow);
            ms_experts_release(dev, l);
            /* more than max_acquire at once is refused */
            int many[1024];
            int cnt = dev->max_acquire + 1 <= m.cfg.n_experts && dev->max_acquire + 1 <= 1024 ? dev->max_acquire + 1 : 0;
            for (int i = 0; i < cnt; i++) many[i] = i;
            ms_expert_view *vv = malloc(sizeof *vv * (cnt + 1));
            if (cnt) CHECK(ms_experts_acquire(dev, l, cnt, many, vv, &err) == MS_ERR_NOMEM);
            free(vv);
            break;
        }
        uint64_t up0 = fk(be)->uploads, reg0 = fk(be)->upload_from_reg, pc0 = fk(be)->routed_per_call;
        step_acct a = {0};
        float *got = run(&m, be, dev, in->data, n, &a, &err);
        CHECK_MSG(got != NULL, "%s cfg %zu: %s", name, k, err.msg);
        if (got)
            CHECK_MSG(!memcmp(got, base, total * 4), "%s cfg %zu%s: logits differ from the CPU resident run", name, k,
                      routed ? " (routed)" : "");
        /* streamed decode took the per-call routed form (one call per MoE layer and decoded token) */
        CHECK(!cfgs[k].old || fk(be)->routed_per_call == pc0); /* lists: no per-call routed calls */
        CHECK_MSG(!routable || routed == 2 || cfgs[k].old || fk(be)->routed_per_call >= pc0 + N_DECODE,
                  "%s cfg %zu: %llu per-call routed calls", name, k, (unsigned long long)(fk(be)->routed_per_call - pc0));
        CHECK(!routable || routed != 2 || (fk(be)->routed_per_call == 0 && fk(be)->routed_refused > 0));
        free(got);
        CHECK_MSG(a.bad_steps == 0, "%s cfg %zu: %d steps uploaded more experts than they acquired", name, k, a.bad_steps);
        ms_device_experts_stats st;
        ms_device_experts_stats_get(dev, &st);
        CHECK(st.hits + st.misses == st.requests && st.uploads == st.misses && st.misses > 0);
        /* the lookahead gate's books: every guess judged is forwarded or held; all forwarded without the gate */
        CHECK(st.pf_right <= st.pf_guessed && st.pf_forwarded + st.pf_held >= st.pf_guessed);
        CHECK(!cfgs[k].prefetch_all || (st.pf_held == 0 && st.gate_open));
        CHECK(fk(be)->uploads > up0);
        /* pinned: the uploads read the host cache (the registered staging) */
        if (!cfgs[k].no_pin) CHECK(fk(be)->upload_from_reg > reg0);
        if (cfgs[k].slots == all) { /* warm and complete: a second run uploads nothing, hits all */
            CHECK(st.evictions == 0);
            step_acct a2 = {0};
            float *again = run(&m, be, dev, in->data, n, &a2, &err);
            CHECK(again && !memcmp(again, base, total * 4));
            free(again);
            ms_device_experts_stats s2;
            ms_device_experts_stats_get(dev, &s2);
            CHECK_MSG(a2.uploads == 0 && s2.misses == st.misses && s2.hits > st.hits, "%s: %llu uploads warm", name,
                      (unsigned long long)a2.uploads);
        } else {
            CHECK(st.evictions > 0 || st.misses <= cfgs[k].slots);
        }
        dev->ops->destroy(dev);
        dev = NULL;
        CHECK(fk(be)->reg == NULL);
    }
    if (host) host->ops->destroy(host);
    be->ops->destroy(be);
    free(base);
    ms_checkpoint_close(&ref);
    ms_model_free(&m);
}

/* Each fixture on the fake with the expert lists only (the CPU backend's ops), with a routed
 * decode op (fake_enable_routed: resident decode routed on the device, streamed decode over
 * per-call tables of the acquired slots), and with that op refusing per-call tables (streamed
 * decode falls back to the lists): all memcmp-identical to the CPU resident run. */
static void check_fixture(const char *name) {
    check_fixture_on(name, 0);
    check_fixture_on(name, 1);
    check_fixture_on(name, 2); /* per_call refused: the lists over the same acquire */
}

TEST(qwen3_moe) { check_fixture("qwen3_moe"); }
TEST(deepseek_v3) { check_fixture("deepseek_v3"); }
TEST(deepseek_v3_fp8) { check_fixture("deepseek_v3_fp8"); }
TEST(glm4_moe) { check_fixture("glm4_moe"); }
TEST(minimax_m2) { check_fixture("minimax_m2"); }
TEST(gpt_oss) { check_fixture("gpt_oss"); }
TEST(gpt_oss_mxfp4) { check_fixture("gpt_oss_mxfp4"); }
TEST(mimo_v2_flash) { check_fixture("mimo_v2_flash"); }
TEST(longcat_flash) { check_fixture("tests/fixtures/extra/longcat_flash"); } /* zero-computation experts */
/* INT4 (compressed-tensors pack-quantized) experts: the list fixture of tests/fixtures/extra */
TEST(kimi_k25_int4) { check_fixture("tests/fixtures/extra/kimi_k25_int4"); }

/* ms_streaming_acquire_each: every requested expert handed over once, as the bytes of the
 * checkpoint; a callback's failure ends the acquire with its status and pins nothing. */
typedef struct each_rec { int calls[64]; int fail_at; const ms_model *m; int layer; const int *ids; int bad; } each_rec;
static int each_cb(void *ctx, int i, const ms_expert_view *v, ms_err *err) {
    each_rec *r = ctx;
    r->calls[i]++;
    const ms_expert_view *ref = &r->m->layers[r->layer].experts[r->ids[i]];
    size_t db = (size_t)((ref->down.rows * ref->down.cols * ms_dtype_bits(ref->down.dtype) + 7) / 8);
    if (memcmp(v->down.data, ref->down.data, db) || v->down.rows != ref->down.rows) r->bad++;
    if (r->fail_at == i) return ms_fail(err, MS_ERR_IO, "callback stops at %d", i);
    return MS_OK;
}

TEST(acquire_each) {
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(MS_TEST_FIXTURES "qwen3_moe", &m, &err)) { CHECK_MSG(0, "%s", err.msg); return; }
    ms_streaming_opts so = {.cache_mib = 0};
    ms_expert_source *host = NULL;
    char why[1200];
    CHECK(ms_streaming_experts_create(&m, &so, &host, why, sizeof why, &err) == 0);
    int K = (int)m.cfg.top_k, l = 0;
    while (l < m.cfg.n_layers && !m.layers[l].experts) l++;
    int ids[64], ids2[64];
    for (int i = 0; i < K; i++) ids[i] = K - 1 - i, ids2[i] = K + i; /* out of order; then K others */
    ms_expert_view v[64];
    each_rec r = {.fail_at = -1, .m = &m, .layer = l, .ids = ids};
    CHECK(host && K <= 32 && 2 * K <= m.cfg.n_experts);
    if (host && K <= 32 && 2 * K <= m.cfg.n_experts) {
        CHECK_MSG(ms_streaming_acquire_each(host, l, K, ids, v, each_cb, &r, &err) == 0, "%s", err.msg);
        for (int i = 0; i < K; i++) CHECK(r.calls[i] == 1);
        CHECK(r.bad == 0);
        ms_experts_release(host, l);
        /* the callback fails at the second expert handed over: that status, nothing left pinned */
        each_rec f = {.fail_at = 1, .m = &m, .layer = l, .ids = ids2};
        CHECK(ms_streaming_acquire_each(host, l, K, ids2, v, each_cb, &f, &err) == MS_ERR_IO);
        CHECK(strstr(err.msg, "callback stops") != NULL);
        each_rec g = {.fail_at = -1, .m = &m, .layer = l, .ids = ids};
        CHECK_MSG(ms_streaming_acquire_each(host, l, K, ids, v, each_cb, &g, &err) == 0, "%s", err.msg);
        CHECK(g.bad == 0);
        ms_experts_release(host, l);
        /* without a callback: ms_experts_acquire's views */
        ms_expert_view w[64];
        CHECK(ms_streaming_acquire_each(host, l, K, ids2, v, NULL, NULL, &err) == 0);
        ms_experts_release(host, l);
        CHECK(ms_experts_acquire(host, l, K, ids2, w, &err) == 0 && !memcmp(v, w, sizeof *v * (size_t)K));
        ms_experts_release(host, l);
    }
    if (host) host->ops->destroy(host);
    ms_model_free(&m);
}

/* The lookahead's guesses while the gate holds them back: every one asked for while it warms up
 * (held, judged, never read), then, once wrong guesses close it, one in MS_DEVICE_GUESS_SAMPLE;
 * always_guess asks for every one. The guess is made just before its acquire (a gap of
 * microseconds) and the acquire reads (the smallest arena and host cache): p = 0 against a need
 * of 1 - gap / read > 0. */
static void guess_run(int always, int *asked_warm, int *asked_closed, ms_device_experts_stats *st) {
    ms_model m;
    ms_err err = {0};
    *asked_warm = *asked_closed = -1;
    if (ms_model_load(MS_TEST_FIXTURES "qwen3_moe", &m, &err)) { CHECK_MSG(0, "%s", err.msg); return; }
    ms_backend *be = fake_create();
    ms_streaming_opts so = {.cache_mib = 0};
    ms_expert_source *host = NULL, *dev = NULL;
    char why[1200];
    CHECK(ms_streaming_experts_create(&m, &so, &host, why, sizeof why, &err) == 0);
    ms_device_experts_opts d0 = {.always_guess = always};
    CHECK(host && ms_device_experts_create(&m, be, host, &d0, &dev, why, sizeof why, &err) == 0);
    int K = (int)m.cfg.top_k, E = (int)m.cfg.n_experts, l = 0;
    while (l < m.cfg.n_layers && !m.layers[l].experts) l++;
    CHECK(dev && K <= 8 && 3 * K + K <= E);
    int warm = 0, closed = 0, n_closed = 0;
    for (int s = 0; dev && s < 400 && n_closed < 8 * MS_DEVICE_GUESS_SAMPLE && K <= 8 && 4 * K <= E; s++) {
        ms_device_experts_stats g;
        ms_device_experts_stats_get(dev, &g);
        int is_closed = !g.gate_open && g.gate_need > 0;
        int want = ms_experts_wants_prefetch(dev, l), guess[8], ids[8];
        if (is_closed) closed += want, n_closed++;
        else warm += want;
        for (int i = 0; i < K; i++) guess[i] = E - 1 - i, ids[i] = (s % 3) * K + i; /* the guesses never come */
        if (want) ms_experts_prefetch(dev, l, K, guess);
        ms_expert_view v[8];
        CHECK_MSG(ms_experts_acquire(dev, l, K, ids, v, &err) == 0, "%s", err.msg);
        ms_experts_release(dev, l);
    }
    *asked_warm = warm, *asked_closed = closed;
    CHECK_MSG(n_closed == 8 * MS_DEVICE_GUESS_SAMPLE, "the gate closed for %d calls", n_closed);
    if (dev) ms_device_experts_stats_get(dev, st), dev->ops->destroy(dev);
    if (host) host->ops->destroy(host);
    be->ops->destroy(be);
    ms_model_free(&m);
}

TEST(guess_sampling) {
    int warm = 0, closed = 0;
    ms_device_experts_stats st = {0};
    guess_run(0, &warm, &closed, &st);
    CHECK_MSG(closed == 8, "%d of %d guesses asked for while closed", closed, 8 * MS_DEVICE_GUESS_SAMPLE);
    CHECK(warm > 0 && st.pf_forwarded == 0 && st.pf_right == 0); /* the warm-up's guesses held back */
    CHECK(st.pf_held == st.pf_guessed && st.pf_guessed > 0);
    guess_run(1, &warm, &closed, &st);
    CHECK(closed == 8 * MS_DEVICE_GUESS_SAMPLE && st.pf_forwarded == 0);
}

TEST(default_budget) {
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(MS_TEST_FIXTURES "qwen3_moe", &m, &err)) { CHECK_MSG(0, "%s", err.msg); return; }
    ms_backend *be = fake_create();
    uint64_t b = 0, slot = ms_device_expert_slot_bytes(&m), all = 0;
    for (int l = 0; l < m.cfg.n_layers; l++) all += m.layers[l].experts ? slot * (uint64_t)m.cfg.n_experts : 0;
    CHECK(ms_device_experts_default_budget(&m, be, 0, &b, &err) == 0 && b == all); /* 3 GiB free: all fit */
    ms_streaming_opts so = {.cache_mib = 0};
    ms_expert_source *host = NULL, *dev = NULL;
    char why[1200];
    CHECK(ms_streaming_experts_create(&m, &so, &host, why, sizeof why, &err) == 0);
    ms_device_experts_opts d0 = {.budget_bytes = 0}; /* 0: the smallest arena, top-k slots */
    CHECK(host && ms_device_experts_create(&m, be, host, &d0, &dev, why, sizeof why, &err) == 0 &&
          dev->max_acquire == m.cfg.top_k);
    if (dev) dev->ops->destroy(dev);
    if (host) host->ops->destroy(host);
    ms_backend *cpu;
    CHECK(ms_backend_cpu_create(NULL, &cpu, &err) == 0);
    CHECK(ms_device_experts_default_budget(&m, cpu, 0, &b, &err) == MS_ERR_UNSUPPORTED); /* no mem_info */
    cpu->ops->destroy(cpu);
    be->ops->destroy(be);
    ms_model_free(&m);
}

TEST_MAIN()
