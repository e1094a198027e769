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
