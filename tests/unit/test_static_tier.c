/* test_static_tier.c — the static tier read into anonymous huge-page memory
 * (ms_model_static_read): every bound tensor keeps its bytes and address, the
 * static tensors' pages are no longer file-backed (the routed experts' still
 * are), the plan's static line is the copy's size, and the engine still
 * reproduces the transformers references of the tests/data fixtures. */
#include <stdint.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/plan.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "test.h"

/* Whether addr lies in a file-backed mapping of this process (/proc/self/maps inode != 0). */
static int file_backed(const void *addr) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int res = -1;
    uintptr_t a = (uintptr_t)addr;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi, ino;
        char perm[8], dev[16];
        unsigned long long off;
        if (sscanf(line, "%lx-%lx %7s %llx %15s %lu", &lo, &hi, perm, &off, dev, &ino) != 6) continue;
        if (a >= lo && a < hi) {
            res = ino != 0;
            break;
        }
    }
    if (f) fclose(f);
    return res;
}

static int is_expert(const ms_model *m, const ms_tensor *t) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const ms_layer *L = &m->layers[l];
        for (int64_t i = 0; L->expert_tensors && i < (int64_t)m->cfg.n_experts * MS_EXPERT_TENSORS; i++)
            if (L->expert_tensors[i] == t) return 1;
    }
    return 0;
}

static void check_fixture(const char *dir) {
    ms_model m;
    ms_err err = {0};
    int rc = ms_model_load(dir, &m, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    if (rc) return;
    const ms_checkpoint *ck = &m.ck;
    /* the bytes of every tensor before */
    uint64_t total = 0;
    for (int i = 0; i < ck->n_tensors; i++) total += ck->tensors[i].nbytes;
    uint8_t *before = malloc(total ? total : 1);
    uint64_t o = 0;
    for (int i = 0; i < ck->n_tensors; i++) {
        memcpy(before + o, ck->tensors[i].data, ck->tensors[i].nbytes);
        o += ck->tensors[i].nbytes;
    }
    uint64_t want = ms_model_static_read_bytes(&m);
    CHECK_MSG(want >= m.static_bytes, "%s: copy %llu < static tier %llu", dir, (unsigned long long)want,
              (unsigned long long)m.static_bytes);
    /* the plan's static line follows the mode */
    ms_plan pm, pr;
    ms_plan_opts po = {.context = 64, .threads = 1, .expert_cache_bytes = -1};
    CHECK(ms_plan_make(&m, &po, &pm, &err) == MS_OK);
    po.static_load = MS_STATIC_READ;
    CHECK(ms_plan_make(&m, &po, &pr, &err) == MS_OK);
    CHECK(pm.static_bytes == m.static_bytes && pr.static_bytes == want);
    CHECK(pr.total - pm.total == want - m.static_bytes);
    CHECK(ms_plan_check(&pr, pm.total, &err) == (want > m.static_bytes ? MS_ERR_NOMEM : MS_OK));

    rc = ms_model_static_read(&m, &err);
    CHECK_MSG(rc == MS_OK, "%s: %s", dir, err.msg);
    CHECK_MSG(m.static_copied == want, "%s: copied %llu, expected %llu", dir, (unsigned long long)m.static_copied,
              (unsigned long long)want);
    CHECK(ms_model_static_read(&m, &err) == MS_OK && m.static_copied == want); /* again: a no-op */
    o = 0;
    int same = 1, n_static = 0, static_anon = 0, n_expert = 0, expert_file = 0;
    for (int i = 0; i < ck->n_tensors; i++) {
        const ms_tensor *t = &ck->tensors[i];
        same &= memcmp(before + o, t->data, t->nbytes) == 0;
        o += t->nbytes;
        if (!m.tensor_bound[i] || !t->nbytes) continue;
        if (is_expert(&m, t)) {
            if (t->nbytes < 3 * 4096) continue; /* may share its pages with static tensors */
            n_expert++;
            expert_file += file_backed((const uint8_t *)t->data + t->nbytes / 2) == 1;
        } else {
            n_static++;
            static_anon += file_backed(t->data) == 0 && file_backed((const uint8_t *)t->data + t->nbytes - 1) == 0;
        }
    }
    CHECK_MSG(same, "%s: tensor bytes changed by the static read", dir);
    CHECK_MSG(n_static > 0 && static_anon == n_static, "%s: %d of %d static tensors in anonymous memory", dir,
              static_anon, n_static);
    CHECK_MSG(expert_file == n_expert, "%s: only %d of %d expert tensors still mapped from the file", dir,
              expert_file, n_expert);
    free(before);

    /* the engine on the moved weights: the reference logits */
    char path[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ms_checkpoint ref;
    if (ms_checkpoint_open(path, &ref, &err) == MS_OK) {
        const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids"), *lg = ms_checkpoint_find(&ref, "logits");
        ms_engine_opts eo = {.max_ctx = 64};
        ms_engine *e = NULL;
        CHECK(in && lg && ms_engine_create(&m, &eo, &e, &err) == MS_OK);
        if (e && in && lg) {
            int64_t V = m.cfg.vocab, n = (int64_t)in->nelem;
            float *buf = malloc(sizeof(float) * (size_t)(n * V));
            CHECK(ms_engine_forward(e, in->data, (int)n, buf, 1, &err) == MS_OK);
            double d = 0;
            for (int64_t i = 0; i < n * V; i++) {
                double x = fabs((double)buf[i] - (double)((const float *)lg->data)[i]);
                if (!(x <= d)) d = x;
            }
            CHECK_MSG(d < 1e-4, "%s: logits differ from the reference by %g after the static read", dir, d);
            free(buf);
        }
        ms_engine_destroy(e);
        ms_checkpoint_close(&ref);
    } else {
        CHECK_MSG(0, "%s", err.msg);
    }
    ms_model_free(&m);
}

TEST(static_read_fixtures) {
    check_fixture(MS_TEST_FIXTURES "deepseek_v3_fp8");
    check_fixture(MS_TEST_FIXTURES "qwen3_moe");
    check_fixture(MS_TEST_FIXTURES "kimi_k3_mxfp4");
    check_fixture(MS_TEST_FIXTURES "glm5_next");
}

TEST(static_load_parse) {
    ms_static_load s = MS_STATIC_READ;
    ms_err err = {0};
    CHECK(ms_static_load_parse("mmap", &s, &err) == MS_OK && s == MS_STATIC_MMAP);
    CHECK(ms_static_load_parse("read", &s, &err) == MS_OK && s == MS_STATIC_READ);
    CHECK(ms_static_load_parse("huge", &s, &err) == MS_ERR_ARG && strstr(err.msg, "huge"));
}

TEST_MAIN()
