/* comm_nccl.cu — core/comm.h over NCCL / RCCL (backend_gpu_comm.h). */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/gpu/gpu_port.h"
extern "C" {
#include "util/err.h"
}
#include "backend/gpu/backend_gpu_comm.h"

#if defined(__HIP_PLATFORM_AMD__) || defined(MS_GPU_HIP)
#if __has_include(<rccl/rccl.h>)
#include <rccl/rccl.h>
#define MS_GPU_HAVE_NCCL 1
#define NCCL_LIBRARY "librccl.so.1"
#else
#define MS_GPU_HAVE_NCCL 0
#endif
#else
#include <nccl.h>
#define MS_GPU_HAVE_NCCL 1
#define NCCL_LIBRARY "libnccl.so.2"
#endif

#if MS_GPU_HAVE_NCCL
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The NCCL entry points this file calls, resolved from NCCL_LIBRARY. */
typedef struct {
    void *lib;
    ncclResult_t (*comm_init_all)(ncclComm_t *comms, int n, const int *devs);
    ncclResult_t (*comm_destroy)(ncclComm_t comm);
    ncclResult_t (*send)(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, gpuStream_t s);
    ncclResult_t (*recv)(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, gpuStream_t s);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    const char *(*error_string)(ncclResult_t r);
} nccl_api;

typedef struct {
    nccl_api api;
    int n, n_ranks;
    int dev[16];        /* physical device of each entry */
    int rank[16];       /* its rank in the communicator (index among the distinct devices) */
    int uniq[16];
    ncclComm_t comm[16]; /* per rank */
    gpuStream_t stream[16]; /* per entry, on its device */
} nccl_comm;

static int nccl_load(nccl_api *a, ms_err *err) {
    memset(a, 0, sizeof *a);
    void *h = dlopen(NCCL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!h) return ms_fail(err, MS_ERR_UNSUPPORTED, "comm: cannot load %s: %s", NCCL_LIBRARY, dlerror());
    a->lib = h;
#define SYM(f, name)                                                                                           \
    if (!(*(void **)&a->f = dlsym(h, name))) {                                                                 \
        dlclose(h);                                                                                            \
        return ms_fail(err, MS_ERR_UNSUPPORTED, "comm: %s has no %s", NCCL_LIBRARY, name);                    \
    }
    SYM(comm_init_all, "ncclCommInitAll");
    SYM(comm_destroy, "ncclCommDestroy");
    SYM(send, "ncclSend");
    SYM(recv, "ncclRecv");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(error_string, "ncclGetErrorString");
#undef SYM
    return MS_OK;
}

static int nccl_check(nccl_comm *k, ncclResult_t r, const char *what, ms_err *err) {
    if (r == ncclSuccess) return MS_OK;
    return ms_fail(err, MS_ERR_UNSUPPORTED, "comm: %s: %s", what, k->api.error_string(r));
}

static int rt_check(gpuError_t e, const char *what, ms_err *err) {
    if (e == gpuSuccess) return MS_OK;
    return ms_fail(err, MS_ERR_UNSUPPORTED, "comm: %s: %s", what, gpuGetErrorString(e));
}

static int nccl_copy(ms_comm *c, int to, void *dst, int from, const void *src, size_t bytes, ms_err *err) {
    nccl_comm *k = (nccl_comm *)c->impl;
    if (to < 0 || to >= c->n || from < 0 || from >= c->n)
        return ms_fail(err, MS_ERR_ARG, "comm: rank %d -> %d of %d", from, to, c->n);
    if (!bytes) return MS_OK;
    double t0 = now_s();
    /* the source's queued work has written src; the destination's no longer reads or writes dst */
    int rc = c->bes[from]->ops->sync(c->bes[from], err);
    if (!rc && to != from) rc = c->bes[to]->ops->sync(c->bes[to], err);
    if (rc) return rc;
    if (k->dev[to] == k->dev[from]) { /* one physical device: a device-to-device copy */
        if ((rc = rt_check(gpuSetDevice(k->dev[from]), "set device", err)) ||
            (rc = rt_check(gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToDevice, k->stream[from]), "copy", err)) ||
            (rc = rt_check(gpuStreamSynchronize(k->stream[from]), "copy", err)))
            return rc;
    } else {
        int rf = k->rank[from], rt = k->rank[to];
        if ((rc = nccl_check(k, k->api.group_start(), "ncclGroupStart", err))) return rc;
        ncclResult_t s = k->api.send(src, bytes, ncclUint8, rt, k->comm[rf], k->stream[from]);
        ncclResult_t r = k->api.recv(dst, bytes, ncclUint8, rf, k->comm[rt], k->stream[to]);
        ncclResult_t g = k->api.group_end();
        if ((rc = nccl_check(k, s, "ncclSend", err)) || (rc = nccl_check(k, r, "ncclRecv", err)) ||
            (rc = nccl_check(k, g, "ncclGroupEnd", err)))
            return rc;
        if ((rc = rt_check(gpuStreamSynchronize(k->stream[from]), "send", err)) ||
            (rc = rt_check(gpuStreamSynchronize(k->stream[to]), "recv", err)))
            return rc;
    }
    c->bytes += bytes, c->calls++, c->seconds += now_s() - t0;
    return MS_OK;
}

static void nccl_destroy(ms_comm *c) {
    if (!c) return;
    nccl_comm *k = (nccl_comm *)c->impl;
    if (k) {
        for (int i = 0; i < k->n; i++)
            if (k->stream[i]) gpuSetDevice(k->dev[i]), gpuStreamDestroy(k->stream[i]);
        for (int r = 0; r < k->n_ranks; r++)
            if (k->comm[r]) k->api.comm_destroy(k->comm[r]);
        if (k->api.lib) dlclose(k->api.lib);
        free(k);
    }
    free(c->bes);
    free(c);
}

static void nccl_activate(ms_comm *c, int rank) {
    nccl_comm *k = (nccl_comm *)c->impl;
    if (rank >= 0 && rank < k->n) (void)gpuSetDevice(k->dev[rank]);
}

static const ms_comm_ops nccl_ops = {nccl_copy, nccl_destroy, nccl_activate};
#endif

extern "C" int ms_comm_gpu_create(ms_backend *const *bes, const int *devices, int n, ms_comm **out, ms_err *err) {
    *out = NULL;
    if (n < 1 || n > 16) return ms_fail(err, MS_ERR_ARG, "comm: %d devices (1..16)", n);
#if !MS_GPU_HAVE_NCCL
    (void)bes, (void)devices;
    return ms_fail(err, MS_ERR_UNSUPPORTED, "comm: this build has no RCCL (rccl/rccl.h was not found)");
#else
    ms_comm *c = (ms_comm *)calloc(1, sizeof *c);
    nccl_comm *k = (nccl_comm *)calloc(1, sizeof *k);
    if (c) c->bes = (ms_backend **)malloc((size_t)n * sizeof *c->bes);
    if (!c || !k || !c->bes) {
        if (c) free(c->bes);
        free(c), free(k);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    }
    memcpy(c->bes, bes, (size_t)n * sizeof *bes);
    c->ops = &nccl_ops, c->n = n, c->impl = k;
    k->n = n;
    for (int i = 0; i < n; i++) {
        k->dev[i] = devices[i];
        int r = 0;
        while (r < k->n_ranks && k->uniq[r] != devices[i]) r++;
        if (r == k->n_ranks) k->uniq[k->n_ranks++] = devices[i];
        k->rank[i] = r;
    }
    int rc = MS_OK;
    for (int i = 0; i < n && !rc; i++)
        if (!(rc = rt_check(gpuSetDevice(k->dev[i]), "set device", err)))
            rc = rt_check(gpuStreamCreateWithFlags(&k->stream[i], gpuStreamNonBlocking), "stream", err);
    if (!rc && k->n_ranks > 1) { /* NCCL only where two physical devices talk */
        /* ncclCommInitAll makes one rank per listed device from this thread */
        setenv("NCCL_NVLS_ENABLE", "0", 1); /* no NVLink multicast (the lent machines must keep it off) */
        if (!(rc = nccl_load(&k->api, err)))
            rc = nccl_check(k, k->api.comm_init_all(k->comm, k->n_ranks, k->uniq), "ncclCommInitAll", err);
    }
    if (rc) {
        nccl_destroy(c);
        return rc;
    }
    (void)gpuSetDevice(k->dev[0]);
    *out = c;
    return MS_OK;
#endif
}
