/* isa.c — the process's kernel instruction set, picked once from CPUID and
 * MS_CPU_ISA, and the per-pool override. */
#include <pthread.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/kernels.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static ms_cpu_isa g_best = MS_ISA_SCALAR;
static ms_cpu_isa g_active = MS_ISA_SCALAR; /* g_best capped by MS_CPU_ISA; fixed by init_once */

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

/* CPUID feature bits plus the OS saving the vector state (XGETBV). */
static ms_cpu_isa detect(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return MS_ISA_SCALAR;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx || !fma || !f16c) return MS_ISA_SCALAR;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return MS_ISA_SCALAR;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return MS_ISA_SCALAR;
    int avx2 = (b >> 5) & 1, f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    if (f && dq && bw && vl && (xcr0 & 0xe0) == 0xe0) return MS_ISA_AVX512;
    if (avx2) return MS_ISA_AVX2;
#endif
    return MS_ISA_SCALAR;
}

static void init_once(void) {
    ms_dtype_init();
    g_best = detect();
    ms_cpu_isa use = g_best;
    const char *env = getenv("MS_CPU_ISA");
    if (env && *env) {
        int want = ms_cpu_isa_parse(env);
        /* an unknown or unsupported request is capped to what the CPU has */
        if (want >= 0 && want < (int)use) use = (ms_cpu_isa)want;
    }
    g_active = use;
}

ms_cpu_isa ms_cpu_isa_best(void) {
    pthread_once(&g_once, init_once);
    return g_best;
}

ms_cpu_isa ms_cpu_isa_active(void) {
    pthread_once(&g_once, init_once);
    return g_active;
}

ms_cpu_isa ms_cpu_isa_of(const ms_pool *pool) {
    int isa = ms_pool_isa(pool);
    return isa >= 0 ? (ms_cpu_isa)isa : ms_cpu_isa_active();
}

int ms_cpu_set_isa(ms_pool *pool, ms_cpu_isa isa, ms_err *err) {
    pthread_once(&g_once, init_once);
    if (!pool) return ms_fail(err, MS_ERR_ARG, "cpu isa: no pool to set it on");
    if ((int)isa < MS_ISA_SCALAR || (int)isa > MS_ISA_AVX512)
        return ms_fail(err, MS_ERR_ARG, "cpu isa %d: not one of scalar, avx2, avx512", (int)isa);
    if (isa > g_best)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "cpu isa %s: this CPU supports at most %s", ms_cpu_isa_name(isa),
                       ms_cpu_isa_name(g_best));
    ms_pool_set_isa(pool, (int)isa);
    return MS_OK;
}

const char *ms_cpu_isa_name(ms_cpu_isa isa) {
    switch (isa) {
    case MS_ISA_SCALAR: return "scalar";
    case MS_ISA_AVX2: return "avx2";
    case MS_ISA_AVX512: return "avx512";
    }
    return "unknown";
}

int ms_cpu_isa_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "scalar")) return MS_ISA_SCALAR;
    if (!strcmp(name, "avx2")) return MS_ISA_AVX2;
    if (!strcmp(name, "avx512")) return MS_ISA_AVX512;
    return -1;
}

const mm_kernels *ms_cpu_kernels_for(ms_cpu_isa isa) {
    switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case MS_ISA_AVX512: return &ms_kernels_avx512;
    case MS_ISA_AVX2: return &ms_kernels_avx2;
#endif
    default: return &ms_kernels_scalar;
    }
}

const mm_kernels *ms_cpu_kernels(void) { return ms_cpu_kernels_for(ms_cpu_isa_active()); }
const mm_kernels *ms_cpu_kernels_of(const ms_pool *pool) { return ms_cpu_kernels_for(ms_cpu_isa_of(pool)); }
