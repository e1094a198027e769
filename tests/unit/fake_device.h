/* fake_device.h — a fake device backend for engine tests that need no GPU: it runs the
 * CPU backend's ops but reports host_memory = 0, so the engine places the weights (copies in
 * the fake's own memory) and moves data only through upload and download, as on a GPU. It
 * counts uploads (and those from the registered host range), downloads, syncs and every
 * allocated byte. Shared by test_device_experts.c and test_hybrid_experts.c. */
#ifndef MS_TEST_FAKE_DEVICE_H
#define MS_TEST_FAKE_DEVICE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/be_cpu.h"


typedef struct fake_be {
    cpu_backend cb; /* first: the CPU ops take the backend as their cpu_backend */
    ms_backend_ops ops;
    void **blocks;
    size_t *sizes;
    int n_blocks, cap_blocks;
    const uint8_t *reg;
    size_t reg_bytes;
    uint64_t uploads, upload_bytes, upload_from_reg, downloads, syncs;
    uint64_t alloc_bytes; /* every alloc since creation */
    uint64_t routed_calls, routed_per_call; /* moe_experts_routed calls (fake_enable_routed), of them per_call */
    int refuse_per_call;                    /* 1: per_call calls answer MS_ERR_UNSUPPORTED (counted as refused) */
    uint64_t routed_refused;
} fake_be;

static fake_be *fk(ms_backend *be) { return (fake_be *)be; }

static int f_alloc(ms_backend *be, size_t bytes, void **out, ms_err *err) {
    fake_be *f = fk(be);
    if (f->n_blocks == f->cap_blocks) {
        f->cap_blocks = f->cap_blocks ? 2 * f->cap_blocks : 1024;
        f->blocks = realloc(f->blocks, (size_t)f->cap_blocks * sizeof *f->blocks);
        f->sizes = realloc(f->sizes, (size_t)f->cap_blocks * sizeof *f->sizes);
    }
    f->alloc_bytes += bytes;
    *out = calloc(bytes + 16, 1);
    if (!*out) return ms_fail(err, MS_ERR_NOMEM, "fake device: out of memory");
    f->blocks[f->n_blocks] = *out;
    f->sizes[f->n_blocks++] = bytes;
    return MS_OK;
}
static void f_free(ms_backend *be, void *p) {
    fake_be *f = fk(be);
    for (int i = 0; p && i < f->n_blocks; i++)
        if (f->blocks[i] == p) {
            free(p);
            f->blocks[i] = f->blocks[--f->n_blocks];
            f->sizes[i] = f->sizes[f->n_blocks];
            return;
        }
}
/* 1 when [p, p + n) lies in one block of the fake's memory */
static inline int is_dev(ms_backend *be, const void *p, size_t n) {
    fake_be *f = fk(be);
    const uint8_t *q = p;
    for (int i = 0; i < f->n_blocks; i++) {
        const uint8_t *b = f->blocks[i];
        if (q >= b && q + n <= b + f->sizes[i]) return 1;
    }
    return 0;
}
static int f_upload(ms_backend *be, void *dst, const void *src, size_t bytes, ms_err *err) {
    fake_be *f = fk(be);
    f->uploads++;
    f->upload_bytes += bytes;
    const uint8_t *s = src;
    if (f->reg && s >= f->reg && s + bytes <= f->reg + f->reg_bytes) f->upload_from_reg++;
    memcpy(dst, src, bytes);
    return MS_OK;
}
static int f_download(ms_backend *be, void *dst, const void *src, size_t bytes, ms_err *err) {
    fk(be)->downloads++;
    memcpy(dst, src, bytes);
    return MS_OK;
}
static int f_sync(ms_backend *be, ms_err *err) {
    fk(be)->syncs++;
    return MS_OK;
}
static int f_place_qmat(ms_backend *be, const ms_qmat *host, ms_qmat *out, ms_err *err) {
    *out = *host;
    size_t db = (size_t)ms_qmat_bytes(host), sb = 0;
    if (host->scale) {
        int64_t sr = (host->rows + host->brow - 1) / host->brow, sc = (host->cols + host->bcol - 1) / host->bcol;
        sb = (size_t)(sr * sc * ms_dtype_bits(host->scale_dtype) / 8);
        db = (size_t)((host->rows * host->cols * ms_dtype_bits(host->dtype) + 7) / 8);
    }
    void *d, *s = NULL;
    if (f_alloc(be, db, &d, err) || (sb && f_alloc(be, sb, &s, err))) return MS_ERR_NOMEM;
    memcpy(d, host->data, db);
    if (sb) memcpy(s, host->scale, sb);
    out->data = d;
    out->scale = s;
    return MS_OK;
}
static int f_place_vec(ms_backend *be, const float *host, int64_t n, const float **out, ms_err *err) {
    void *d;
    if (f_alloc(be, (size_t)n * 4, &d, err)) return MS_ERR_NOMEM;
    memcpy(d, host, (size_t)n * 4);
    *out = d;
    return MS_OK;
}
static int f_host_register(ms_backend *be, void *p, size_t bytes, ms_err *err) {
    fk(be)->reg = p;
    fk(be)->reg_bytes = bytes;
    return MS_OK;
}
static void f_host_unregister(ms_backend *be, void *p) {
    if (fk(be)->reg == p) fk(be)->reg = NULL, fk(be)->reg_bytes = 0;
}
static int f_mem_info(ms_backend *be, uint64_t *fr, uint64_t *tot, ms_err *err) {
    *fr = 3ull << 30, *tot = 4ull << 30;
    return MS_OK;
}
static void f_destroy(ms_backend *be) {
    fake_be *f = fk(be);
    for (int i = 0; i < f->n_blocks; i++) free(f->blocks[i]);
    free(f->blocks), free(f->sizes), free(f->cb.th_buf);
    free(f);
}

/* moe_experts_routed (core/backend.h) for the fake, opt-in (fake_enable_routed): the contract's
 * sum of w[j] * expert all[ids[j]] in ascending ids[j], through the composed ops of one token,
 * so it equals the expert lists of that token bit for bit (per_call or not). */
static inline int f_moe_routed(ms_backend *be, const ms_moe_routed_args *a, ms_err *err) {
    fake_be *f = fk(be);
    int K = a->K, ord[32], off[33], tok[32];
    float w[32];
    ms_expert_view v[32];
    if (K < 1 || K > 32) return ms_fail(err, MS_ERR_UNSUPPORTED, "fake routed: K = %d", K);
    if (a->per_call && f->refuse_per_call) {
        f->routed_refused++;
        return ms_fail(err, MS_ERR_UNSUPPORTED, "fake routed: per_call refused");
    }
    for (int j = 0; j < K; j++) { /* insertion sort of the slots by id */
        if (a->ids[j] < 0 || a->ids[j] >= a->E) return ms_fail(err, MS_ERR_ARG, "fake routed: id %d of %d", a->ids[j], a->E);
        int q = j;
        for (; q > 0 && a->ids[ord[q - 1]] > a->ids[j]; q--) ord[q] = ord[q - 1];
        ord[q] = j;
    }
    for (int q = 0; q < K; q++) v[q] = a->all[a->ids[ord[q]]], w[q] = a->w[ord[q]], off[q] = q, tok[q] = 0;
    off[K] = K;
    int64_t I = v[0].down.cols;
    float *xs = malloc((size_t)a->D * 4), *g = malloc((size_t)I * 8), *u = malloc((size_t)I * 8), *ys = malloc((size_t)a->D * 4);
    memset(a->acc, 0, (size_t)a->D * 4);
    ms_moe_args ma = {.in = a->in, .acc = a->acc, .D = a->D, .act = a->act, .nu = K, .views = v, .off = off,
                      .tok = tok, .w = w, .max_batch = 1, .xs = xs, .g = g, .u = u, .ys = ys};
    ms_moe_experts_composed(be, &ma);
    free(xs), free(g), free(u), free(ys);
    f->routed_calls++;
    f->routed_per_call += a->per_call != 0;
    return MS_OK;
}
static inline void fake_enable_routed(ms_backend *be) { fk(be)->ops.moe_experts_routed = f_moe_routed; }

static ms_backend *fake_create(void) {
    ms_backend *cpu;
    ms_err err = {0};
    if (ms_backend_cpu_create(NULL, &cpu, &err)) return NULL;
    fake_be *f = calloc(1, sizeof *f);
    f->cb = *(cpu_backend *)cpu;
    free(cpu); /* never reserved: no scratch to free */
    f->ops = *f->cb.base.ops;
    f->ops.alloc = f_alloc, f->ops.free = f_free, f->ops.upload = f_upload, f->ops.download = f_download;
    f->ops.sync = f_sync, f->ops.place_qmat = f_place_qmat, f->ops.place_vec = f_place_vec;
    f->ops.destroy = f_destroy, f->ops.host_register = f_host_register;
    f->ops.host_unregister = f_host_unregister, f->ops.mem_info = f_mem_info;
    f->cb.base.ops = &f->ops;
    f->cb.base.name = "fake-device";
    f->cb.base.host_memory = 0;
    f->cb.base.impl = f;
    return &f->cb.base;
}

#endif
