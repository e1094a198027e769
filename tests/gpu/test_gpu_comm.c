/* test_gpu_comm.c — several GPU backends in one process (`--gpus`): the comm
 * (backend_gpu_comm.h) between two backends on one device (device-to-device copies) and, where
 * the machine has two devices, between devices through NCCL; and a model split over two
 * stages on one device (engine.h ms_stages) against the same model in one GPU engine (the
 * pipeline: the same greedy ids and logits within 1e-4 of the largest; sharded experts: the
 * per-device sums add in another F32 order, within 1e-3). Fixture: tests/data/fixtures/models/qwen3_moe. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/backend_gpu.h"
#include "backend/gpu/backend_gpu_comm.h"
#include "engine/engine.h"
#include "engine/placement.h"
#include "model/model.h"
#include "test.h"
#include "test_gpu.h"

/* bytes through comm from backend a's buffer to backend b's, read back and compared. */
static void copy_roundtrip(const int *devs, const char *what) {
    ms_backend *be[2] = {NULL, NULL};
    ms_comm *c = NULL;
    ms_err err = {0};
    for (int i = 0; i < 2; i++) CHECK_MSG(ms_backend_gpu_create(devs[i], &be[i], &err) == MS_OK, "%s", err.msg);
    if (!be[0] || !be[1]) goto out;
    CHECK_MSG(ms_comm_gpu_create(be, devs, 2, &c, &err) == MS_OK, "%s: %s", what, err.msg);
    if (!c) goto out;
    size_t n = (size_t)3 << 20; /* 3 MiB, and an odd tail */
    uint8_t *h = malloc(n + 7), *back = calloc(n + 7, 1);
    for (size_t i = 0; i < n + 7; i++) h[i] = (uint8_t)rnd();
    void *d0 = NULL, *d1 = NULL;
    if (c->ops->activate) c->ops->activate(c, 0);
    CHECK(be[0]->ops->alloc(be[0], n + 7, &d0, &err) == MS_OK);
    if (c->ops->activate) c->ops->activate(c, 1);
    CHECK(be[1]->ops->alloc(be[1], n + 7, &d1, &err) == MS_OK);
    if (d0 && d1) {
        CHECK(be[0]->ops->upload(be[0], d0, h, n + 7, &err) == MS_OK);
        CHECK_MSG(c->ops->copy(c, 1, d1, 0, d0, n + 7, &err) == MS_OK, "%s", err.msg);
        CHECK(be[1]->ops->download(be[1], back, d1, n + 7, &err) == MS_OK);
        CHECK_MSG(!memcmp(h, back, n + 7), "%s: 0 -> 1 differs", what);
        /* back the other way into an offset */
        memset(back, 0, n + 7);
        CHECK(be[0]->ops->upload(be[0], d0, back, n + 7, &err) == MS_OK);
        CHECK(c->ops->copy(c, 0, (uint8_t *)d0 + 7, 1, d1, n, &err) == MS_OK);
        CHECK(be[0]->ops->download(be[0], back, d0, n + 7, &err) == MS_OK);
        CHECK_MSG(!memcmp(h, back + 7, n) && back[0] == 0, "%s: 1 -> 0 differs", what);
        CHECK(c->bytes == 2 * n + 7 && c->calls == 2);
    }
    if (d0) be[0]->ops->free(be[0], d0);
    if (d1) be[1]->ops->free(be[1], d1);
    free(h), free(back);
out:
    if (c) c->ops->destroy(c);
    for (int i = 1; i >= 0; i--)
        if (be[i]) be[i]->ops->destroy(be[i]);
}

TEST(comm_one_device_twice) {
    SKIP_UNLESS_SELECTED("comm");
    int devs[2] = {0, 0};
    copy_roundtrip(devs, "devices 0,0");
}

TEST(comm_two_devices_nccl) {
    SKIP_UNLESS_SELECTED("comm");
    if (ms_backend_gpu_count() < 2) {
        printf("comm_two_devices_nccl: skipped (%d device)\n", ms_backend_gpu_count());
        return;
    }
    int devs[2] = {0, 1};
    copy_roundtrip(devs, "devices 0,1 (NCCL)");
}

static int argmax(const float *x, int64_t n) {
    int b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = (int)i;
    return b;
}

/* 8 prompt ids (spread over the vocabulary, each < V), then 4 greedy steps: logits [5, V] into out. */
static int run_steps(ms_engine *e, int64_t V, float *out, ms_err *err) {
    static const int32_t raw[8] = {1, 17, 301, 4, 99, 1000, 7, 23};
    int32_t ids[8];
    for (int i = 0; i < 8; i++) ids[i] = (int32_t)(raw[i] % V);
    int rc = ms_engine_forward(e, ids, 8, out, 0, err);
    for (int s = 1; !rc && s < 5; s++) {
        int32_t t = argmax(out + (s - 1) * V, V);
        rc = ms_engine_forward(e, &t, 1, out + s * V, 0, err);
    }
    return rc;
}

TEST(split_engine_one_device) {
    SKIP_UNLESS_SELECTED("comm");
    ms_model m;
    ms_err err = {0};
    if (ms_model_load("tests/data/fixtures/models/qwen3_moe", &m, &err)) {
        printf("split_engine_one_device: skipped (%s)\n", err.msg);
        return;
    }
    int64_t V = m.cfg.vocab;
    float *ref = calloc((size_t)(5 * V), 4), *got = calloc((size_t)(5 * V), 4);
    ms_backend *one = NULL;
    ms_engine *e1 = NULL;
    CHECK(ms_backend_gpu_create(0, &one, &err) == MS_OK);
    ms_engine_opts o = {.max_ctx = 64, .max_batch = 16, .backend = one};
    CHECK_MSG(one && ms_engine_create(&m, &o, &e1, &err) == MS_OK, "%s", err.msg);
    CHECK_MSG(e1 && run_steps(e1, V, ref, &err) == MS_OK, "%s", err.msg);
    ms_engine_destroy(e1);
    if (one) one->ops->destroy(one);
    for (int mode = 0; mode < 2; mode++) {
        int devs[2] = {0, 0};
        ms_backend *be[2] = {NULL, NULL};
        ms_comm *c = NULL;
        for (int i = 0; i < 2; i++) CHECK(ms_backend_gpu_create(0, &be[i], &err) == MS_OK);
        CHECK_MSG(ms_comm_gpu_create(be, devs, 2, &c, &err) == MS_OK, "%s", err.msg);
        ms_place_input in;
        ms_placement p;
        ms_expert_split sp = mode ? MS_EXPERTS_SHARDED : MS_EXPERTS_WITH_LAYER;
        CHECK(ms_place_input_of(&m, be[0], 64, 16, 1, sp, 0, &in, &err) == MS_OK);
        CHECK(ms_placement_make(&in, 2, NULL, &p, &err) == MS_OK);
        int b[2], en[2];
        ms_stages st;
        ms_stages_of(&p, be, c, mode, b, en, &st);
        ms_engine_opts so = {.max_ctx = 64, .max_batch = 16, .stages = &st};
        ms_engine *e = NULL;
        CHECK_MSG(ms_engine_create(&m, &so, &e, &err) == MS_OK, "%s", err.msg);
        memset(got, 0, (size_t)(5 * V) * 4);
        if (e) CHECK_MSG(run_steps(e, V, got, &err) == MS_OK, "%s", err.msg);
        double mx = 0;
        for (int64_t i = 0; i < 5 * V; i++) mx = fabs(ref[i]) > mx ? fabs(ref[i]) : mx;
        double d = ms_test_max_abs(ref, got, 5 * V);
        printf("split_engine_one_device (%s): max |diff| %.3g of max |logit| %.3g, %llu bytes in %llu copies\n",
               mode ? "sharded experts" : "pipeline", d, mx, (unsigned long long)c->bytes,
               (unsigned long long)c->calls);
        CHECK_MSG(d <= (mode ? 1e-3 : 1e-4) * (mx > 1 ? mx : 1), "%s: %g", mode ? "sharded" : "pipeline", d);
        for (int r = 0; r < 5; r++) CHECK(argmax(ref + r * V, V) == argmax(got + r * V, V));
        ms_engine_destroy(e);
        ms_placement_free(&p);
        ms_place_input_free(&in);
        if (c) c->ops->destroy(c);
        for (int i = 1; i >= 0; i--)
            if (be[i]) be[i]->ops->destroy(be[i]);
    }
    free(ref), free(got);
    ms_model_free(&m);
}

TEST_GPU_RUNNER(test_gpu_run_comm)
