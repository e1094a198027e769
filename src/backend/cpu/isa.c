/* isa.c — the process's kernel instruction set, picked once from CPUID and
 * MS_CPU_ISA, and the per-pool override. */
#include <pthread.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/kernels.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static ms_cpu_isa g_best = MS_ISA_SCALAR;
static unsigned g_supported = 1u << MS_ISA_SCALAR; /* bit per ms_cpu_isa */
static ms_cpu_isa g_active = MS_ISA_SCALAR; /* g_best capped by MS_CPU_ISA; fixed by init_once */
static int g_bf16; /* AVX512_BF16 (with the AVX-512 level) */

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

/* CPUID feature bits plus the OS saving the vector state (XGETBV): the set of
 * supported levels (bit per ms_cpu_isa). */
static unsigned detect(int *bf16) {
    unsigned set = 1u << MS_ISA_SCALAR;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return set;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx || !fma || !f16c) return set;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return set;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return set;
    int avx2 = (b >> 5) & 1, f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    int vnni512 = (c >> 11) & 1;
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    int avxvnni = (a1 >> 4) & 1, bf16_512 = (a1 >> 5) & 1;
    if (!avx2) return set;
    set |= 1u << MS_ISA_AVX2;
    if (avxvnni) set |= 1u << MS_ISA_AVX_VNNI;
    if (f && dq && bw && vl && (xcr0 & 0xe0) == 0xe0) {
        set |= 1u << MS_ISA_AVX512;
        if (vnni512) set |= 1u << MS_ISA_AVX512_VNNI;
        *bf16 = bf16_512;
    }
#endif
    return set;
}

static void init_once(void) {
    ms_dtype_init();
    g_supported = detect(&g_bf16);
    static const ms_cpu_isa pref[] = {MS_ISA_AVX512_VNNI, MS_ISA_AVX512, MS_ISA_AVX_VNNI, MS_ISA_AVX2};
    g_best = MS_ISA_SCALAR;
    for (int i = 0; i < 4; i++)
        if (g_supported >> pref[i] & 1) {
            g_best = pref[i];
            break;
        }
    ms_cpu_isa use = g_best;
    const char *env = getenv("MS_CPU_ISA");
    if (env && *env) {
        int want = ms_cpu_isa_parse(env);
        /* an unknown or unsupported request keeps the best */
        if (want >= 0 && (g_supported >> want & 1)) use = (ms_cpu_isa)want;
    }
    g_active = use;
}

ms_cpu_isa ms_cpu_isa_best(void) {
    pthread_once(&g_once, init_once);
    return g_best;
}

int ms_cpu_isa_supported(ms_cpu_isa isa) {
    pthread_once(&g_once, init_once);
    return (int)isa >= 0 && (int)isa <= MS_ISA_AVX512_VNNI && (g_supported >> isa & 1);
}

int ms_cpu_has_avx512bf16(void) {
    pthread_once(&g_once, init_once);
    return g_bf16;
}

ms_cpu_isa ms_cpu_isa_base(ms_cpu_isa isa) {
    return isa == MS_ISA_AVX_VNNI ? MS_ISA_AVX2 : isa == MS_ISA_AVX512_VNNI ? MS_ISA_AVX512 : isa;
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
    if ((int)isa < MS_ISA_SCALAR || (int)isa > MS_ISA_AVX512_VNNI)
        return ms_fail(err, MS_ERR_ARG, "cpu isa %d: not one of scalar, avx2, avx512, avxvnni, avx512vnni", (int)isa);
    if (!(g_supported >> isa & 1))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "cpu isa %s: this CPU does not support it (best: %s)",
                       ms_cpu_isa_name(isa), ms_cpu_isa_name(g_best));
    ms_pool_set_isa(pool, (int)isa);
    return MS_OK;
}

const char *ms_cpu_isa_name(ms_cpu_isa isa) {
    switch (isa) {
    case MS_ISA_SCALAR: return "scalar";
    case MS_ISA_AVX2: return "avx2";
    case MS_ISA_AVX512: return "avx512";
    case MS_ISA_AVX_VNNI: return "avxvnni";
    case MS_ISA_AVX512_VNNI: return "avx512vnni";
    }
    return "unknown";
}

int ms_cpu_isa_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "scalar")) return MS_ISA_SCALAR;
    if (!strcmp(name, "avx2")) return MS_ISA_AVX2;
    if (!strcmp(name, "avx512")) return MS_ISA_AVX512;
    if (!strcmp(name, "avxvnni")) return MS_ISA_AVX_VNNI;
    if (!strcmp(name, "avx512vnni")) return MS_ISA_AVX512_VNNI;
    return -1;
}

int ms_cpu_set_activations(ms_pool *pool, ms_cpu_act act, ms_err *err) {
    if (!pool) return ms_fail(err, MS_ERR_ARG, "cpu activations: no pool to set them on");
    if ((int)act < MS_ACT_F32 || ((int)act > MS_ACT_Q8_BF16 && act != MS_ACT_Q16 && act != MS_ACT_Q16_BF16))
        return ms_fail(err, MS_ERR_ARG, "cpu activations %d: not one of f32, q8, bf16, q8+bf16, q16, q16+bf16", (int)act);
    ms_pool_set_act(pool, (int)act);
    return MS_OK;
}

ms_cpu_act ms_cpu_activations_of(const ms_pool *pool) {
    int a = ms_pool_act(pool);
    return (a >= MS_ACT_F32 && a <= MS_ACT_Q8_BF16) || a == MS_ACT_Q16 || a == MS_ACT_Q16_BF16 ? (ms_cpu_act)a : MS_ACT_F32;
}

const char *ms_cpu_act_name(ms_cpu_act act) {
    switch (act) {
    case MS_ACT_Q8: return "q8";
    case MS_ACT_BF16: return "bf16";
    case MS_ACT_Q8_BF16: return "q8+bf16";
    case MS_ACT_Q16: return "q16";
    case MS_ACT_Q16_BF16: return "q16+bf16";
    default: return "f32";
    }
}

ms_cpu_act ms_cpu_act_default(ms_cpu_isa isa) { return isa == MS_ISA_SCALAR ? MS_ACT_F32 : MS_ACT_Q16; }

int ms_cpu_act_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "f32")) return MS_ACT_F32;
    if (!strcmp(name, "q8")) return MS_ACT_Q8;
    if (!strcmp(name, "bf16")) return MS_ACT_BF16;
    if (!strcmp(name, "q8+bf16")) return MS_ACT_Q8_BF16;
    if (!strcmp(name, "q16")) return MS_ACT_Q16;
    if (!strcmp(name, "q16+bf16")) return MS_ACT_Q16_BF16;
    return -1;
}

const mm_kernels *ms_cpu_kernels_for(ms_cpu_isa isa) {
    switch (ms_cpu_isa_base(isa)) {
#if defined(__x86_64__) || defined(__i386__)
    case MS_ISA_AVX512: return &ms_kernels_avx512;
    case MS_ISA_AVX2: return &ms_kernels_avx2;
#endif
    default: return &ms_kernels_scalar;
    }
}

const mm_kernels *ms_cpu_kernels(void) { return ms_cpu_kernels_for(ms_cpu_isa_active()); }
const mm_kernels *ms_cpu_kernels_of(const ms_pool *pool) { return ms_cpu_kernels_for(ms_cpu_isa_of(pool)); }

const mm_kernels *ms_cpu_mm_kernels_of(const ms_pool *pool) {
#if defined(__x86_64__) || defined(__i386__)
    ms_cpu_isa isa = ms_cpu_isa_of(pool);
    if ((ms_cpu_activations_of(pool) & MS_ACT_BF16) && ms_cpu_isa_base(isa) == MS_ISA_AVX512 && ms_cpu_has_avx512bf16())
        return &ms_kernels_avx512bf16;
#endif
    return ms_cpu_kernels_of(pool);
}
