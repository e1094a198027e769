/* cmd_kbench.c — `moonshine kbench`: CPU kernel microbenchmark (one JSON line). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/cpu/cpu.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "ops/ops.h"

typedef struct {
    const char *name;
    ms_dtype dt, sdt;
    int brow, bcol;
    int zp; /* I4: with zero points (compressed-tensors symmetric: false) */
} kb_dtype;

static const kb_dtype k_dtypes[] = {
    {"bf16", MS_DT_BF16, MS_DT_INVALID, 0, 0, 0},
    {"f16", MS_DT_F16, MS_DT_INVALID, 0, 0, 0},
    {"f32", MS_DT_F32, MS_DT_INVALID, 0, 0, 0},
    {"f8_e4m3", MS_DT_F8_E4M3, MS_DT_F32, 128, 128, 0},
    {"mxfp4", MS_DT_F4, MS_DT_F8_E8M0, 1, 32, 0},
    {"int4", MS_DT_I4, MS_DT_BF16, 1, 32, 0}, /* compressed-tensors pack-quantized (Kimi K2): BF16 scale per 32 */
    {"int4z", MS_DT_I4, MS_DT_BF16, 1, 32, 1}, /* the same with weight_zero_point (asymmetric) */
    {"q8", MS_DT_Q8, MS_DT_BF16, 1, 32, 0},   /* the requantized static tier (--static-dtype q8) */
};
static const int64_t k_decode_shapes[][2] = {{768, 2048}, {2048, 768}, {2048, 7168}, {151936, 2048}};
static const int64_t k_prefill_shapes[][2] = {{768, 2048}, {2048, 2048}};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

/* One weight copy with data and scales in one mapping; plausible values (no NaN/Inf). */
typedef struct {
    ms_qmat w;
    void *mem;
    size_t len;
} kb_weight;

static int make_weight(const kb_dtype *d, int64_t rows, int64_t cols, kb_weight *o) {
    size_t dbytes = (size_t)(rows * cols * ms_dtype_bits(d->dt) / 8);
    int64_t sr = d->brow ? (rows + d->brow - 1) / d->brow : 0, sc = d->bcol ? (cols + d->bcol - 1) / d->bcol : 0;
    size_t soff = (dbytes + 4095) & ~(size_t)4095, sbytes = (size_t)(sr * sc * (d->brow ? ms_dtype_bits(d->sdt) : 0) / 8);
    size_t zoff = soff + sbytes, zbytes = d->zp ? (size_t)((rows + 7) / 8 * sc * 4) : 0;
    o->len = zoff + zbytes + 4096;
    o->mem = mmap(NULL, o->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (o->mem == MAP_FAILED) return -1;
    uint8_t *m = o->mem;
    for (size_t i = 0; i + 8 <= dbytes; i += 8) {
        uint64_t r = rnd(), v = 0;
        switch (d->dt) {
        case MS_DT_BF16: v = (r & 0x807f807f807f807full) | 0x3c003c003c003c00ull; break;
        case MS_DT_F16: v = (r & 0x83ff83ff83ff83ffull) | 0x2c002c002c002c00ull; break;
        case MS_DT_F32: v = (r & 0x807fffff807fffffull) | 0x3c0000003c000000ull; break;
        case MS_DT_F8_E4M3: v = r & 0xbfbfbfbfbfbfbfbfull; break;
        default: v = r;
        }
        memcpy(m + i, &v, 8);
    }
    for (int64_t i = 0; i < sr * sc; i++) {
        if (d->sdt == MS_DT_F32) ((float *)(m + soff))[i] = 0.01f;
        else if (d->sdt == MS_DT_BF16) ((uint16_t *)(m + soff))[i] = ms_f32_to_bf16(0.01f);
        else m[soff + i] = 120;
    }
    for (size_t i = 0; i < zbytes; i++) m[zoff + i] = (uint8_t)rnd();
    o->w = (ms_qmat){.dtype = d->dt, .rows = rows, .cols = cols, .data = m, .zero = d->zp ? m + zoff : NULL};
    if (d->brow) o->w.scale = m + soff, o->w.scale_dtype = d->sdt, o->w.brow = d->brow, o->w.bcol = d->bcol;
    return 0;
}

static void free_weight(kb_weight *w) {
    if (w->mem && w->mem != MAP_FAILED) munmap(w->mem, w->len);
    w->mem = NULL;
}

static float *alloc_f32(size_t n) {
    float *p = malloc(n * sizeof *p);
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = (float)((rnd() >> 40) / 16777216.0 - 0.5);
    return p;
}

/* Decode matvec GB/s over copies cycling through >= `ring` bytes (so the weights come from DRAM). */
static double bench_decode(ms_pool *pool, const kb_dtype *d, int64_t rows, int64_t cols, size_t ring, double secs,
                           double *best_call) {
    ms_qmat probe = {.dtype = d->dt, .rows = rows, .cols = cols, .scale = d->brow ? (void *)1 : NULL,
                     .scale_dtype = d->sdt, .brow = d->brow, .bcol = d->bcol, .zero = d->zp ? (void *)1 : NULL};
    uint64_t bytes = ms_qmat_bytes(&probe);
    int nc = (int)((ring + bytes - 1) / bytes);
    if (nc < 1) nc = 1;
    if (nc > 512) nc = 512;
    kb_weight *ws = calloc((size_t)nc, sizeof *ws);
    float *x = alloc_f32((size_t)cols), *y = malloc((size_t)rows * sizeof *y);
    double best = -1;
    if (!ws || !x || !y) goto done;
    for (int i = 0; i < nc; i++)
        if (make_weight(d, rows, cols, &ws[i])) goto done;
    for (int i = 0; i < nc; i++) ms_matmul(pool, y, x, 1, &ws[i].w); /* warm: page in, fault in TLBs */
    best = 0;
    double fastest = 1e30; /* the quickest single call: the kernel's rate when the shared machine let it run */
    for (int rep = 0; rep < 3; rep++) {
        int64_t it = 0;
        double t0 = now_s(), dt, tc = t0;
        do {
            ms_matmul(pool, y, x, 1, &ws[it % nc].w);
            it++;
            double t = now_s();
            if (t - tc < fastest) fastest = t - tc;
            tc = t;
            dt = t - t0;
        } while (dt < secs / 3 || it < nc);
        double gbps = (double)bytes * (double)it / dt / 1e9;
        if (gbps > best) best = gbps;
    }
    *best_call = (double)bytes / fastest / 1e9;
done:
    if (ws)
        for (int i = 0; i < nc; i++) free_weight(&ws[i]);
    free(ws), free(x), free(y);
    return best;
}

/* Prefill: GFLOP/s of one n-token matmul, and the time ratio against n separate matvecs. */
static int bench_prefill(ms_pool *pool, const kb_dtype *d, int64_t rows, int64_t cols, int n, double *gflops,
                         double *speedup) {
    kb_weight w = {0};
    float *x = alloc_f32((size_t)n * (size_t)cols), *y = malloc((size_t)n * (size_t)rows * sizeof *y);
    int rc = -1;
    if (!x || !y || make_weight(d, rows, cols, &w)) goto done;
    double best_mm = 1e30, best_mv = 1e30;
    ms_matmul(pool, y, x, n, &w.w);
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        ms_matmul(pool, y, x, n, &w.w);
        double t1 = now_s();
        for (int t = 0; t < n; t++) ms_matmul(pool, y + (int64_t)t * rows, x + (int64_t)t * cols, 1, &w.w);
        double t2 = now_s();
        if (t1 - t0 < best_mm) best_mm = t1 - t0;
        if (t2 - t1 < best_mv) best_mv = t2 - t1;
    }
    *gflops = 2.0 * (double)rows * (double)cols * n / best_mm / 1e9;
    *speedup = best_mv / best_mm;
    rc = 0;
done:
    free_weight(&w);
    free(x), free(y);
    return rc;
}

int cmd_kbench(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("usage: moonshine kbench [--threads T] [--isa scalar|avx2|avx512|avxvnni|avx512vnni] [--dtype NAME]\n"
               "                        [--activations f32|q8|bf16|q8+bf16|q16|q16+bf16] [--quick] [--seconds S] [--bw-mib M]\n"
               "Measures the memory read bandwidth with T threads, then for each weight dtype\n"
               "(bf16 f16 f32 f8_e4m3 mxfp4 int4 int4z q8) the decode matvec (n = 1) GB/s and %% of that bandwidth on\n"
               "several shapes (weights cycled through >= 256 MiB so they come from memory; the bandwidth is\n"
               "measured again before each shape, read_gbps_now, and the %% uses the larger one), and the\n"
               "decode GB/s of one core on a 256x2048 weight that stays in cache (cached_1core: what the\n"
               "kernel itself can do), and the prefill GFLOP/s at n = 64 with its speed-up over 64 separate\n"
               "matvecs. Prints one JSON line. best_call_gbps: the quickest single call of a decode row (on a\n"
               "shared machine the steadier figure of what the kernel does when it runs).\n"
               "--activations q8: int8 activations per 32 and integer dot products for mxfp4, int4 and q8\n"
               "(the other dtypes keep F32); bf16: BF16-rounded activations and vdpbf16ps for bf16 (AVX512_BF16\n"
               "CPUs; elsewhere F32); q8+bf16 both; q16: the q8 decode path with 16-bit activations (two int8 planes;\n"
               "prefill F32; the default, as for the other commands). --quick skips the 151936x2048 shape. --seconds: time per measurement (default 0.6).\n");
        return 0;
    }
    int64_t threads = 0, bw_mib = 1024;
    double secs = 0.6;
    if (ms_arg_int(argc, argv, "--threads", 1, 1024, &threads) || ms_arg_int(argc, argv, "--bw-mib", 64, 4096, &bw_mib))
        return 2;
    const char *isa = ms_arg_str(argc, argv, "--isa"), *only = ms_arg_str(argc, argv, "--dtype");
    const char *ssec = ms_arg_str(argc, argv, "--seconds"), *acts = ms_arg_str(argc, argv, "--activations");
    int quick = ms_arg_flag(argc, argv, "--quick");
    if (ssec) {
        char *end;
        secs = strtod(ssec, &end);
        if (*end || !(secs > 0.01 && secs < 600)) {
            fprintf(stderr, "moonshine kbench: --seconds expects a number in (0.01, 600), got \"%s\"\n", ssec);
            return 2;
        }
    }
    if (ms_args_unknown(argc, argv, "kbench")) return 2;
    int isa_v = isa ? ms_cpu_isa_parse(isa) : -1;
    if (isa && isa_v < 0) {
        fprintf(stderr, "moonshine kbench: --isa %s: expected scalar, avx2, avx512, avxvnni or avx512vnni\n", isa);
        return 2;
    }
    /* the programs' default for the ISA measured (q16; f32 on scalar) */
    int act_v = acts ? ms_cpu_act_parse(acts) : ms_cpu_act_default(isa_v >= 0 ? (ms_cpu_isa)isa_v : ms_cpu_isa_active());
    if (act_v < 0) {
        fprintf(stderr, "moonshine kbench: --activations %s: expected f32, q8, bf16, q8+bf16, q16 or q16+bf16\n", acts);
        return 2;
    }
    if (only) {
        int found = 0;
        for (size_t i = 0; i < sizeof k_dtypes / sizeof *k_dtypes; i++) found |= !strcmp(only, k_dtypes[i].name);
        if (!found) {
            fprintf(stderr, "moonshine kbench: --dtype %s: expected bf16, f16, f32, f8_e4m3, mxfp4, int4, int4z or q8\n", only);
            return 2;
        }
    }
    /* pool: the measurements' threads; one: the single-core runs (both on --isa) */
    ms_pool *pool = ms_pool_create((int)threads), *one = ms_pool_create(1);
    if (!pool || !one) {
        fprintf(stderr, "moonshine kbench: cannot create a pool of %lld threads\n", (long long)threads);
        ms_pool_destroy(pool), ms_pool_destroy(one);
        return 1;
    }
    if (isa) {
        ms_err err = {0};
        if (ms_cpu_set_isa(pool, (ms_cpu_isa)isa_v, &err) || ms_cpu_set_isa(one, (ms_cpu_isa)isa_v, &err)) {
            fprintf(stderr, "moonshine kbench: --isa %s: %s\n", isa, err.msg);
            ms_pool_destroy(pool), ms_pool_destroy(one);
            return 2;
        }
    }
    ms_cpu_set_activations(pool, (ms_cpu_act)act_v, NULL), ms_cpu_set_activations(one, (ms_cpu_act)act_v, NULL);
    double bw = ms_measure_read_bandwidth(pool, (size_t)bw_mib << 20);
    if (bw <= 0) {
        fprintf(stderr, "moonshine kbench: cannot allocate %lld MiB for the bandwidth measurement\n", (long long)bw_mib);
        ms_pool_destroy(pool), ms_pool_destroy(one);
        return 1;
    }
    printf("{\"threads\":%d,\"isa\":\"%s\",\"activations\":\"%s\",\"read_gbps\":%.2f,\"decode\":[", ms_pool_size(pool),
           ms_cpu_isa_name(ms_cpu_isa_of(pool)), ms_cpu_act_name((ms_cpu_act)act_v), bw);
    int first = 1;
    for (size_t di = 0; di < sizeof k_dtypes / sizeof *k_dtypes; di++) {
        const kb_dtype *d = &k_dtypes[di];
        if (only && strcmp(only, d->name)) continue;
        for (size_t si = 0; si < sizeof k_decode_shapes / sizeof *k_decode_shapes; si++) {
            int64_t rows = k_decode_shapes[si][0], cols = k_decode_shapes[si][1];
            if (rows > 100000 && (quick || d->dt == MS_DT_F32 || d->dt == MS_DT_F16)) continue;
            /* the machine is shared: measure the bandwidth again right before, and
             * compare with the better of the two measurements */
            double bw_now = ms_measure_read_bandwidth(pool, (size_t)256 << 20), ref = bw_now > bw ? bw_now : bw;
            double bc = 0, g = bench_decode(pool, d, rows, cols, (size_t)256 << 20, secs, &bc);
            printf("%s{\"dtype\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"gbps\":%.2f,\"best_call_gbps\":%.2f,"
                   "\"read_gbps_now\":%.2f,\"pct_of_read_bw\":%.1f}",
                   first ? "" : ",", d->name, (long long)rows, (long long)cols, g, bc, bw_now, 100.0 * g / ref);
            fflush(stdout);
            first = 0;
        }
    }
    /* the kernels' own speed: one core, a 256x2048 weight that stays in L2 */
    printf("],\"cached_1core\":[");
    first = 1;
    for (size_t di = 0; di < sizeof k_dtypes / sizeof *k_dtypes; di++) {
        const kb_dtype *d = &k_dtypes[di];
        if (only && strcmp(only, d->name)) continue;
        double bc = 0, g = bench_decode(one, d, 256, 2048, 0, secs / 2, &bc);
        printf("%s{\"dtype\":\"%s\",\"rows\":256,\"cols\":2048,\"gbps\":%.2f,\"best_call_gbps\":%.2f}", first ? "" : ",",
               d->name, g, bc);
        fflush(stdout);
        first = 0;
    }
    printf("],\"prefill\":[");
    first = 1;
    for (size_t di = 0; di < sizeof k_dtypes / sizeof *k_dtypes; di++) {
        const kb_dtype *d = &k_dtypes[di];
        if (only && strcmp(only, d->name)) continue;
        for (size_t si = 0; si < sizeof k_prefill_shapes / sizeof *k_prefill_shapes; si++) {
            int64_t rows = k_prefill_shapes[si][0], cols = k_prefill_shapes[si][1];
            double gf = 0, sp = 0;
            if (bench_prefill(pool, d, rows, cols, 64, &gf, &sp)) continue;
            printf("%s{\"dtype\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"n\":64,\"gflops\":%.1f,\"x_vs_64_matvecs\":%.2f}",
                   first ? "" : ",", d->name, (long long)rows, (long long)cols, gf, sp);
            fflush(stdout);
            first = 0;
        }
    }
    printf("]}\n");
    ms_pool_destroy(pool), ms_pool_destroy(one);
    return 0;
}
