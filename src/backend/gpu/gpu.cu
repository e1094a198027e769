/* gpu.cu — context, device info, buffers, weight upload, timers (contracts in gpu.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gpu_internal.h"

/* MS_GPU_LEGACY_DECODE: "1" / "all" every bit, else a comma list of the words below (others ignored). */
static int legacy_bits(const char *v) {
    if (!v) return 0;
    if (!strcmp(v, "1") || !strcmp(v, "all")) return 0xff;
    static const struct {
        const char *w;
        int bit;
    } words[] = {{"experts", MS_GPU_LEG_EXPERTS}, {"route", MS_GPU_LEG_ROUTE}, {"norm", MS_GPU_LEG_NORM},
                 {"router", MS_GPU_LEG_ROUTER}};
    int bits = 0;
    while (*v) {
        size_t n = strcspn(v, ",");
        for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
            if (strlen(words[i].w) == n && !strncmp(v, words[i].w, n)) bits |= words[i].bit;
        v += n + (v[n] == ',');
    }
    return bits;
}

/* What ms_pdl_capable asks about: a kernel of this build (every .cu file has the same target). */
__global__ void k_pdl_probe(int *p) {
    ms_pdl_wait();
    if (p) *p = 0;
}

extern "C" int ms_gpu_open(int device, ms_gpu **out, ms_err *err) {
    if (!out) return ms_fail(err, MS_ERR_ARG, "ms_gpu_open: out is NULL");
    *out = NULL;
    int count = 0;
    gpuError_t e = gpuGetDeviceCount(&count);
    if (e != gpuSuccess) return ms_gpu_check(e, err, "counting devices");
    if (device < 0 || device >= count)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "gpu (%s): device %d does not exist (%d found)", MS_GPU_BACKEND_NAME,
                       device, count);
    ms_gpu *g = (ms_gpu *)calloc(1, sizeof *g);
    if (!g) return ms_fail(err, MS_ERR_NOMEM, "ms_gpu_open: out of host memory");
    g->device = device;
    g->legacy = legacy_bits(getenv("MS_GPU_LEGACY_DECODE"));
    const char *am = getenv("MS_GPU_ATTN");
    g->attn_mode = am && !strcmp(am, "old") ? MS_GPU_ATTN_OLD : am && !strcmp(am, "combine") ? MS_GPU_ATTN_COMBINE
                                                                                            : MS_GPU_ATTN_FOLD;
    const char *ro = getenv("MS_GPU_ROUTER");
    g->router_old = ro && !strcmp(ro, "old");
    const char *as = getenv("MS_GPU_ATTN_SPLITS");
    g->attn_splits = as ? atoi(as) : 0;
    if (g->attn_splits < 0 || g->attn_splits > MS_GPU_ATTN_MAXS) g->attn_splits = 0;
    int rc;
    if ((rc = ms_gpu_check(gpuSetDevice(device), err, "selecting the device")) ||
        (rc = ms_gpu_check(gpuGetDeviceProperties(&g->prop, device), err, "reading device properties")) ||
        (rc = ms_gpu_check(gpuStreamCreateWithFlags(&g->stream, gpuStreamNonBlocking), err, "creating a stream")) ||
        (rc = ms_gpu_check(gpuEventCreate(&g->ev0), err, "creating an event")) ||
        (rc = ms_gpu_check(gpuEventCreate(&g->ev1), err, "creating an event"))) {
        ms_gpu_close(g);
        return rc;
    }
    const char *pd = getenv("MS_GPU_PDL"); /* MS_GPU_PDL=0: every kernel in plain stream order (A/B) */
    g->pdl = !(pd && !strcmp(pd, "0")) && g->prop.major >= 9 && ms_pdl_capable((const void *)k_pdl_probe);
    const char *rx = getenv("MS_GPU_RX"); /* MS_GPU_RX=plain|old|early: routed decode kernels (A/B) */
    g->rx_mode = !rx                   ? MS_GPU_RX_DEFAULT
                 : !strcmp(rx, "old")   ? MS_GPU_RX_OLD
                 : !strcmp(rx, "early") ? MS_GPU_RX_EARLY
                                        : MS_GPU_RX_DEFAULT; /* "plain" and other words */
    const char *pa = getenv("MS_GPU_ATTN_PDL"); /* MS_GPU_ATTN_PDL=0: the attention kernels launch plainly (A/B) */
    g->pdl_attn = g->pdl && !(pa && !strcmp(pa, "0"));
    const char *qa = getenv("MS_GPU_QKV_ATTN"); /* MS_GPU_QKV_ATTN=0: qkv_at, then the attention (A/B) */
    g->qkv_attn = !(qa && !strcmp(qa, "0"));
    const char *mu = getenv("MS_GPU_MV_U"); /* MS_GPU_MV_U=2: 2 chunks per lane a round for every row (A/B) */
    g->mv_u4 = !(mu && !strcmp(mu, "2"));
    const char *ab = getenv("MS_GPU_ARGMAX_BLOCKS"); /* MS_GPU_ARGMAX_BLOCKS=0: the pick by one block (A/B) */
    g->argmax_blocks = !(ab && !strcmp(ab, "0"));
    const char *q8 = getenv("MS_GPU_Q8"); /* MS_GPU_Q8=old: Q8 products through matmul_q.cu as before (A/B) */
    g->q8_old = q8 && !strcmp(q8, "old");
    *out = g;
    return MS_OK;
}

int *ms_gpu_counters(ms_gpu *g, int64_t n, ms_err *err) {
    if (g->cnt_n >= n) return g->cnt;
    if (g->cnt) (void)gpuFree(g->cnt);
    g->cnt = NULL, g->cnt_n = 0;
    int64_t want = n < 4096 ? 4096 : n;
    void *p = NULL;
    int rc = ms_gpu_check(gpuMalloc(&p, (size_t)want * 4), err, "allocating arrival counters");
    if (!rc) rc = ms_gpu_check(gpuMemsetAsync(p, 0, (size_t)want * 4, g->stream), err, "zeroing arrival counters");
    if (rc) {
        if (p) (void)gpuFree(p);
        return NULL;
    }
    g->cnt = (int *)p, g->cnt_n = (int)want;
    return g->cnt;
}

extern "C" void ms_gpu_close(ms_gpu *g) {
    if (!g) return;
    (void)gpuSetDevice(g->device);
    if (g->cnt) (void)gpuFree(g->cnt);
    if (g->ev0) (void)gpuEventDestroy(g->ev0);
    if (g->ev1) (void)gpuEventDestroy(g->ev1);
    if (g->stream) (void)gpuStreamDestroy(g->stream);
    free(g);
}

extern "C" int ms_gpu_info_get(ms_gpu *g, ms_gpu_info *info, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!info) return ms_fail(err, MS_ERR_ARG, "ms_gpu_info_get: info is NULL");
    memset(info, 0, sizeof *info);
    snprintf(info->backend, sizeof info->backend, "%s", MS_GPU_BACKEND_NAME);
    snprintf(info->name, sizeof info->name, "%.255s", g->prop.name);
    info->cc_major = g->prop.major;
    info->cc_minor = g->prop.minor;
    info->sm_count = g->prop.multiProcessorCount;
    info->warp_size = g->prop.warpSize;
    info->l2_bytes = (size_t)g->prop.l2CacheSize;
    int clk_khz = 0, bus_bits = 0;
    /* CUDA 13 removed these attributes on some devices: then peak stays 0 */
    if (gpuDeviceGetAttribute(&clk_khz, gpuDevAttrMemoryClockRate, g->device) != gpuSuccess) clk_khz = 0;
    if (gpuDeviceGetAttribute(&bus_bits, gpuDevAttrGlobalMemoryBusWidth, g->device) != gpuSuccess) bus_bits = 0;
    (void)gpuGetLastError(); /* clear a sticky "invalid value" from the queries above */
    info->peak_gbs = 2.0 * (double)clk_khz * 1e3 * (double)bus_bits / 8.0 / 1e9;
    (void)gpuRuntimeGetVersion(&info->runtime_version);
    (void)gpuDriverGetVersion(&info->driver_version);
    return ms_gpu_check(gpuMemGetInfo(&info->mem_free, &info->mem_total), err, "reading free memory");
}

extern "C" int ms_gpu_alloc(ms_gpu *g, size_t bytes, void **dptr, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!dptr || !bytes) return ms_fail(err, MS_ERR_ARG, "ms_gpu_alloc: need an out pointer and bytes > 0");
    *dptr = NULL;
    gpuError_t e = gpuMalloc(dptr, bytes);
    if (e != gpuSuccess) {
        (void)gpuGetLastError();
        *dptr = NULL;
        return ms_fail(err, MS_ERR_NOMEM, "gpu (%s): allocating %zu bytes on the device: %s", MS_GPU_BACKEND_NAME,
                       bytes, gpuGetErrorString(e));
    }
    return MS_OK;
}

extern "C" void ms_gpu_free(ms_gpu *g, void *dptr) {
    if (dptr) (void)gpuFree(dptr);
}

extern "C" int ms_gpu_alloc_host(ms_gpu *g, size_t bytes, void **hptr, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!hptr || !bytes) return ms_fail(err, MS_ERR_ARG, "ms_gpu_alloc_host: need an out pointer and bytes > 0");
    gpuError_t e = gpuMallocHost(hptr, bytes);
    if (e != gpuSuccess) {
        (void)gpuGetLastError();
        *hptr = NULL;
        return ms_fail(err, MS_ERR_NOMEM, "gpu (%s): allocating %zu bytes of page-locked host memory: %s",
                       MS_GPU_BACKEND_NAME, bytes, gpuGetErrorString(e));
    }
    return MS_OK;
}

extern "C" void ms_gpu_free_host(ms_gpu *g, void *hptr) {
    if (hptr) (void)gpuFreeHost(hptr);
}

extern "C" int ms_gpu_upload(ms_gpu *g, void *dst, const void *src, size_t bytes, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!bytes) return MS_OK;
    if (!dst || !src) return ms_fail(err, MS_ERR_ARG, "ms_gpu_upload: NULL buffer");
    return ms_gpu_check(gpuMemcpyAsync(dst, src, bytes, gpuMemcpyHostToDevice, g->stream), err, "upload");
}

extern "C" int ms_gpu_download(ms_gpu *g, void *dst, const void *src, size_t bytes, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!bytes) return ms_gpu_sync(g, err);
    if (!dst || !src) return ms_fail(err, MS_ERR_ARG, "ms_gpu_download: NULL buffer");
    int rc = ms_gpu_check(gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToHost, g->stream), err, "download");
    return rc ? rc : ms_gpu_sync(g, err);
}

extern "C" int ms_gpu_copy(ms_gpu *g, void *dst, const void *src, size_t bytes, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!bytes) return MS_OK;
    if (!dst || !src) return ms_fail(err, MS_ERR_ARG, "ms_gpu_copy: NULL buffer");
    return ms_gpu_check(gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToDevice, g->stream), err, "device copy");
}

extern "C" int ms_gpu_zero(ms_gpu *g, void *dst, size_t bytes, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!bytes) return MS_OK;
    if (!dst) return ms_fail(err, MS_ERR_ARG, "ms_gpu_zero: NULL buffer");
    return ms_gpu_check(gpuMemsetAsync(dst, 0, bytes, g->stream), err, "memset");
}

extern "C" int ms_gpu_sync(ms_gpu *g, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    return ms_gpu_check(gpuStreamSynchronize(g->stream), err, "waiting for the stream (a kernel failed?)");
}

/* ------------------------------------------------------------ weights */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int ms_gpu_qmat_check(const ms_qmat *w, const char *what, ms_err *err) {
    if (!w || !w->data) return ms_fail(err, MS_ERR_ARG, "%s: weight view has no data", what);
    if (w->rows < 1 || w->cols < 1 || w->rows > (INT64_C(1) << 31) || w->cols > (INT64_C(1) << 31))
        return ms_fail(err, MS_ERR_SHAPE, "%s: weight shape [%lld, %lld] out of range", what, (long long)w->rows,
                       (long long)w->cols);
    switch (w->dtype) {
    case MS_DT_F32:
    case MS_DT_F16:
    case MS_DT_BF16:
        if (w->scale) return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: %s weights take no scale", what, ms_dtype_name(w->dtype));
        return MS_OK;
    case MS_DT_F8_E4M3:
        if (!w->scale) return MS_OK; /* per-tensor 1 */
        if (w->brow < 1 || w->bcol < 1)
            return ms_fail(err, MS_ERR_SHAPE, "%s: FP8 block %dx%d invalid", what, w->brow, w->bcol);
        if (w->scale_dtype != MS_DT_F32 && w->scale_dtype != MS_DT_BF16)
            return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: FP8 block scales of %s (F32 or BF16 supported)", what,
                           ms_dtype_name(w->scale_dtype));
        return MS_OK;
    case MS_DT_F4:
        if (w->cols % 32 || !w->scale || w->brow != 1 || w->bcol != 32 ||
            (w->scale_dtype != MS_DT_F8_E8M0 && w->scale_dtype != MS_DT_U8))
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: MXFP4 needs cols %% 32 == 0 (%lld) and E8M0 scales per 1x32 block (%dx%d)", what,
                           (long long)w->cols, w->brow, w->bcol);
        return MS_OK;
    case MS_DT_Q8: /* the requantized static tier: matmul.cu, gemm.cu (test_gpu matmul_q_*, verify --static-dtype q8) */
        return ms_gpu_qmat_check_q(w, what, err);
    case MS_DT_I4: /* INT4 (Kimi K2 / K2.5 experts; zero points when asymmetric): matmul_q.cu, matmul*.cu, gemm.cu */
        return ms_gpu_qmat_check_q(w, what, err);
    default:
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: weight dtype %s is not supported on the gpu", what,
                       ms_dtype_name(w->dtype));
    }
}

static size_t qmat_data_bytes(const ms_qmat *w) {
    return (size_t)((uint64_t)w->rows * (uint64_t)w->cols * (uint64_t)ms_gpu_dtype_bits(w->dtype) / 8);
}
static size_t qmat_scale_bytes(const ms_qmat *w) {
    if (!w->scale) return 0;
    return (size_t)(cdiv(w->rows, w->brow) * cdiv(w->cols, w->bcol) * (ms_gpu_dtype_bits(w->scale_dtype) / 8));
}
/* Bytes of an I4 view's packed zero points (core/qmat.h: int32 [ceil(rows/8), ceil(cols/bcol)]), 0 without. */
static size_t qmat_zero_bytes(const ms_qmat *w) {
    if (w->dtype != MS_DT_I4 || !w->zero) return 0;
    return (size_t)(cdiv(w->rows, 8) * cdiv(w->cols, w->bcol) * 4);
}

extern "C" int ms_gpu_qmat_upload(ms_gpu *g, const ms_qmat *host, ms_qmat *dev, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    if (!dev) return ms_fail(err, MS_ERR_ARG, "ms_gpu_qmat_upload: dev is NULL");
    int rc = ms_gpu_qmat_check(host, "ms_gpu_qmat_upload", err);
    if (rc) return rc;
    size_t db = qmat_data_bytes(host), sb = qmat_scale_bytes(host), zb = qmat_zero_bytes(host);
    size_t soff = (db + 255) & ~(size_t)255, zoff = (soff + sb + 255) & ~(size_t)255;
    void *buf = NULL;
    if ((rc = ms_gpu_alloc(g, zoff + zb + 16, &buf, err))) return rc;
    *dev = *host;
    dev->data = buf;
    dev->scale = sb ? (const void *)((uint8_t *)buf + soff) : NULL;
    dev->zero = zb ? (const void *)((uint8_t *)buf + zoff) : NULL;
    if ((rc = ms_gpu_upload(g, buf, host->data, db, err)) ||
        (sb && (rc = ms_gpu_upload(g, (uint8_t *)buf + soff, host->scale, sb, err))) ||
        (zb && (rc = ms_gpu_upload(g, (uint8_t *)buf + zoff, host->zero, zb, err))) || (rc = ms_gpu_sync(g, err))) {
        ms_gpu_free(g, buf);
        dev->data = dev->scale = dev->zero = NULL;
        return rc;
    }
    return MS_OK;
}

extern "C" void ms_gpu_qmat_free(ms_gpu *g, ms_qmat *dev) {
    if (!dev) return;
    ms_gpu_free(g, (void *)dev->data);
    dev->data = dev->scale = dev->zero = NULL;
}

/* ------------------------------------------------------------- timers */

extern "C" int ms_gpu_timer_start(ms_gpu *g, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    return ms_gpu_check(gpuEventRecord(g->ev0, g->stream), err, "recording the start event");
}

extern "C" int ms_gpu_timer_stop(ms_gpu *g, float *ms, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    int rc;
    if ((rc = ms_gpu_check(gpuEventRecord(g->ev1, g->stream), err, "recording the stop event")) ||
        (rc = ms_gpu_check(gpuEventSynchronize(g->ev1), err, "waiting for the stop event")))
        return rc;
    return ms_gpu_check(gpuEventElapsedTime(ms, g->ev0, g->ev1), err, "reading the timer");
}
