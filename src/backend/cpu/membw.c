/* membw.c — measure the machine's memory read bandwidth with the pool's threads. */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
__attribute__((target("avx512f"))) static float sum_avx512(const float *p, size_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
__attribute__((target("avx2"))) static float sum_avx2(const float *p, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    }
    float o[8];
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    return o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
}
#endif

static float sum_scalar(const float *p, size_t n) {
    float a[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) a[u] += p[i + u];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

#define CHUNK_FLOATS ((size_t)1 << 20) /* 4 MiB per task */

typedef struct {
    float *buf;
    size_t n_chunks;
    int fill;
    int isa;
    float partial[1024];
} bw_job;

static void bw_task(void *ctx, int task, int tid) {
    bw_job *j = ctx;
    float *p = j->buf + (size_t)task * CHUNK_FLOATS;
    if (j->fill) {
        for (size_t i = 0; i < CHUNK_FLOATS; i++) p[i] = 1.0f;
        return;
    }
    float s;
#if defined(__x86_64__) || defined(__i386__)
    if (ms_cpu_isa_base(j->isa) == MS_ISA_AVX512) s = sum_avx512(p, CHUNK_FLOATS);
    else if (ms_cpu_isa_base(j->isa) == MS_ISA_AVX2) s = sum_avx2(p, CHUNK_FLOATS);
    else
#endif
        s = sum_scalar(p, CHUNK_FLOATS);
    j->partial[task % 1024] += s;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double ms_measure_read_bandwidth(ms_pool *pool, size_t bytes) {
    if (bytes == 0) bytes = (size_t)512 << 20;
    size_t n_chunks = bytes / (CHUNK_FLOATS * sizeof(float));
    if (n_chunks < 1) n_chunks = 1;
    if (n_chunks > 1024) n_chunks = 1024; /* 4 GiB at most */
    size_t len = n_chunks * CHUNK_FLOATS * sizeof(float);
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return 0;
#ifdef MADV_HUGEPAGE
    madvise(mem, len, MADV_HUGEPAGE);
#endif
    bw_job j;
    memset(&j, 0, sizeof j);
    j.buf = mem;
    j.n_chunks = n_chunks;
    j.isa = (int)ms_cpu_isa_of(pool);
    j.fill = 1; /* first touch from the threads that will read */
    ms_pool_run(pool, (int)n_chunks, bw_task, &j);
    j.fill = 0;
    double best = 0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = now_s();
        ms_pool_run(pool, (int)n_chunks, bw_task, &j);
        double dt = now_s() - t0;
        if (dt > 0 && (double)len / dt > best) best = (double)len / dt;
    }
    munmap(mem, len);
    return best / 1e9;
}
