/* offload.cu — the first engine hookup: decode matmuls on the GPU (contract in gpu.h).
 *
 * ms_matmul* offer every product to the installed offload (ops.h). This one
 * takes products of at most 8 tokens whose weight it can hold: on first sight
 * a weight view is uploaded (stored dtype, data + scales) and stays resident,
 * keyed by its host pointers and layout; x goes up, y comes back. The hidden
 * state stays on the host, so each product pays two small PCIe copies: a
 * correctness step towards a device-resident forward, not the fast path. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gpu_internal.h"

typedef struct off_entry {
    const void *data, *scale;
    int64_t rows, cols;
    int dtype;
    ms_qmat dev; /* dev.data == NULL: not offloadable (recorded so it is not retried) */
} off_entry;

static struct {
    pthread_mutex_t mu;
    ms_gpu *g;
    off_entry *tab;
    size_t cap, used;
    size_t budget, resident;
    float *dx, *dy, *hy; /* hy: host staging for y, copied out only when the whole product came back */
    size_t dx_cap, dy_cap, hy_cap;
    uint64_t hits, declined;
} S = {PTHREAD_MUTEX_INITIALIZER};

static size_t hash_ptr(const void *p, int64_t rows) {
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull ^ (uint64_t)rows * 0xC2B2AE3D27D4EB4Full;
    return (size_t)(h ^ (h >> 29));
}

static off_entry *find_slot(off_entry *tab, size_t cap, const ms_qmat *w) {
    size_t i = hash_ptr(w->data, w->rows) & (cap - 1);
    for (;; i = (i + 1) & (cap - 1)) {
        off_entry *e = &tab[i];
        if (!e->data) return e;
        if (e->data == w->data && e->scale == w->scale && e->rows == w->rows && e->cols == w->cols &&
            e->dtype == (int)w->dtype)
            return e;
    }
}

static int grow(void) {
    size_t ncap = S.cap ? S.cap * 2 : 4096;
    off_entry *nt = (off_entry *)calloc(ncap, sizeof *nt);
    if (!nt) return -1;
    for (size_t i = 0; i < S.cap; i++)
        if (S.tab[i].data) {
            ms_qmat k;
            memset(&k, 0, sizeof k);
            k.data = S.tab[i].data, k.rows = S.tab[i].rows;
            size_t j = hash_ptr(k.data, k.rows) & (ncap - 1);
            while (nt[j].data) j = (j + 1) & (ncap - 1);
            nt[j] = S.tab[i];
        }
    free(S.tab);
    S.tab = nt, S.cap = ncap;
    return 0;
}

static int ensure(float **buf, size_t *cap, size_t floats) {
    if (floats <= *cap) return 0;
    ms_gpu_free(S.g, *buf);
    *buf = NULL, *cap = 0;
    ms_err err = {0};
    if (ms_gpu_alloc(S.g, floats * 4, (void **)buf, &err)) return -1;
    *cap = floats;
    return 0;
}

static int offload(void *ctx, float *y, const float *x, int n, const ms_qmat *w, int acc) {
    (void)ctx;
    if (n < 1 || n > 8 || !w->data) return 0;
    pthread_mutex_lock(&S.mu);
    int done = 0;
    ms_err err = {0};
    if (S.used * 2 >= S.cap && grow()) goto out;
    {
        off_entry *e = find_slot(S.tab, S.cap, w);
        if (!e->data) { /* first sight: upload if it fits and the kernels take it */
            e->data = w->data, e->scale = w->scale, e->rows = w->rows, e->cols = w->cols, e->dtype = (int)w->dtype;
            memset(&e->dev, 0, sizeof e->dev);
            S.used++;
            uint64_t bytes = ms_qmat_bytes(w);
            if (S.resident + bytes <= S.budget && ms_gpu_qmat_check(w, "offload", &err) == MS_OK &&
                ms_gpu_qmat_upload(S.g, w, &e->dev, &err) == MS_OK)
                S.resident += bytes;
        }
        if (!e->dev.data) {
            S.declined++;
            goto out;
        }
        size_t nx = (size_t)n * (size_t)w->cols, ny = (size_t)n * (size_t)w->rows;
        if (ensure(&S.dx, &S.dx_cap, nx) || ensure(&S.dy, &S.dy_cap, ny)) goto out;
        if (ms_gpu_upload(S.g, S.dx, x, nx * 4, &err)) goto out;
        if (acc && ms_gpu_upload(S.g, S.dy, y, ny * 4, &err)) goto out;
        if (ms_gpu_matmul(S.g, S.dy, S.dx, n, &e->dev, acc, &err)) goto out;
        if (ny > S.hy_cap) {
            float *h = (float *)realloc(S.hy, ny * 4);
            if (!h) goto out;
            S.hy = h, S.hy_cap = ny;
        }
        if (ms_gpu_download(S.g, S.hy, S.dy, ny * 4, &err)) goto out; /* y untouched: the CPU computes it */
        memcpy(y, S.hy, ny * 4);
        S.hits++;
        done = 1;
    }
out:
    pthread_mutex_unlock(&S.mu);
    return done;
}

extern "C" int ms_gpu_offload_enable(ms_gpu *g, size_t budget_bytes, ms_err *err) {
    MS_GPU_CHECK_CTX(g, err);
    pthread_mutex_lock(&S.mu);
    S.g = g, S.budget = budget_bytes;
    pthread_mutex_unlock(&S.mu);
    ms_matmul_set_offload(offload, NULL);
    return MS_OK;
}

extern "C" void ms_gpu_offload_disable(void) {
    ms_matmul_set_offload(NULL, NULL);
    pthread_mutex_lock(&S.mu);
    for (size_t i = 0; i < S.cap; i++)
        if (S.tab[i].dev.data) ms_gpu_qmat_free(S.g, &S.tab[i].dev);
    free(S.tab);
    ms_gpu_free(S.g, S.dx), ms_gpu_free(S.g, S.dy);
    free(S.hy);
    S.tab = NULL, S.cap = S.used = 0, S.resident = 0, S.dx = S.dy = S.hy = NULL, S.dx_cap = S.dy_cap = S.hy_cap = 0;
    S.g = NULL;
    pthread_mutex_unlock(&S.mu);
}

extern "C" void ms_gpu_offload_stats(uint64_t *matmuls, uint64_t *declined, uint64_t *resident_bytes) {
    pthread_mutex_lock(&S.mu);
    if (matmuls) *matmuls = S.hits;
    if (declined) *declined = S.declined;
    if (resident_bytes) *resident_bytes = S.resident;
    pthread_mutex_unlock(&S.mu);
}
