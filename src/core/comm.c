/* comm.c — the host-memory comm (core/comm.h): plain copies between CPU backends. */
#include "core/comm.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int host_copy(ms_comm *c, int to, void *dst, int from, const void *src, size_t bytes, ms_err *err) {
    if (to < 0 || to >= c->n || from < 0 || from >= c->n)
        return ms_fail(err, MS_ERR_ARG, "comm: rank %d -> %d of %d", from, to, c->n);
    double t0 = now_s();
    if (dst != src && bytes) memmove(dst, src, bytes);
    c->bytes += bytes, c->calls++, c->seconds += now_s() - t0;
    return MS_OK;
}

static void host_destroy(ms_comm *c) {
    if (!c) return;
    free(c->bes);
    free(c);
}

static const ms_comm_ops host_ops = {.copy = host_copy, .destroy = host_destroy};

int ms_comm_host_create(ms_backend *const *bes, int n, ms_comm **out, ms_err *err) {
    *out = NULL;
    if (n < 1) return ms_fail(err, MS_ERR_ARG, "comm: no backends");
    for (int i = 0; i < n; i++)
        if (!bes[i] || !bes[i]->host_memory)
            return ms_fail(err, MS_ERR_ARG, "comm: backend %d (%s) has no host memory: use the device comm", i,
                           bes[i] ? bes[i]->name : "none");
    ms_comm *c = calloc(1, sizeof *c);
    if (c) c->bes = malloc((size_t)n * sizeof *c->bes);
    if (!c || !c->bes) {
        free(c);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    }
    memcpy(c->bes, bes, (size_t)n * sizeof *bes);
    c->ops = &host_ops;
    c->n = n;
    *out = c;
    return MS_OK;
}
