/* gpubench.c — GPU kernel microbenchmark, one JSON object per line (like
 * `moonshine kbench`): decode matvecs per stored dtype (GB/s of weight + scale
 * bytes read, against the datasheet peak and a measured device copy), the
 * expert FFN of one token, GQA decode attention. Built by `make gpu`.
 *
 * Every weight is replicated into copies that together exceed 1 GiB and the
 * timed launches cycle through them, so the bytes come from HBM, not L2.
 * Usage: gpubench [--peak-gbs 4800] [--quick] [--matvec DTYPE ROWS COLS N] [--gemm DTYPE ROWS COLS]
 *                 [--routed DTYPE[,DTYPE...] EXPERTS K HIDDEN INTER] (one line per dtype, in order)
 *                 [--moe-gemm DTYPE[,DTYPE...] EXPERTS K HIDDEN INTER N] (prefill grouped experts, N tokens) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gemm.h"
#include "backend/gpu/gpu.h"
#include "ops/ops.h"

static ms_gpu *G;
static double g_peak = 4800, g_copy = 0;

static void die(const char *what, const ms_err *err) {
    fprintf(stderr, "gpubench: %s: %s\n", what, err->msg);
    exit(1);
}

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

typedef struct {
    const char *name;
    ms_dtype dt, sdt;
    int brow, bcol;
} bdt;
static const bdt k_dt[] = {
    {"bf16", MS_DT_BF16, 0, 0, 0},
    {"f16", MS_DT_F16, 0, 0, 0},
    {"f32", MS_DT_F32, 0, 0, 0},
    {"f8_e4m3", MS_DT_F8_E4M3, MS_DT_F32, 128, 128},
    {"mxfp4", MS_DT_F4, MS_DT_F8_E8M0, 1, 32},
    {"int4", MS_DT_I4, MS_DT_BF16, 1, 32}, /* compressed-tensors pack-quantized (Kimi K2), symmetric */
};
#define N_SWEEP 5 /* the default sweep's dtypes (the first five) */
#define N_DT ((int)(sizeof k_dt / sizeof k_dt[0]))
static int dt_index(const char *name, size_t len) {
    for (int d = 0; d < N_DT; d++)
        if (strlen(k_dt[d].name) == len && !strncmp(name, k_dt[d].name, len)) return d;
    return -1;
}

/* Host weight with plausible values (finite; the speed does not depend on them). */
static ms_qmat host_w(const bdt *d, int64_t rows, int64_t cols) {
    ms_qmat w = {.dtype = d->dt, .rows = rows, .cols = cols};
    size_t db = (size_t)((uint64_t)rows * cols * ms_dtype_bits(d->dt) / 8);
    uint8_t *m = malloc(db + 8);
    for (size_t i = 0; i + 8 <= db; i += 8) {
        uint64_t r = rnd(), v;
        switch (d->dt) {
        case MS_DT_BF16: v = (r & 0x807f807f807f807full) | 0x3c003c003c003c00ull; break;
        case MS_DT_F16: v = (r & 0x83ff83ff83ff83ffull) | 0x2c002c002c002c00ull; break;
        case MS_DT_F32: v = (r & 0x807fffff807fffffull) | 0x3c0000003c000000ull; break;
        case MS_DT_F8_E4M3: v = r & 0xbfbfbfbfbfbfbfbfull; break;
        default: v = r;
        }
        memcpy(m + i, &v, 8);
    }
    w.data = m;
    if (d->sdt) {
        int64_t n = ((rows + d->brow - 1) / d->brow) * ((cols + d->bcol - 1) / d->bcol);
        uint8_t *s = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) {
            if (d->sdt == MS_DT_F32) ((float *)s)[i] = 0.01f;
            else if (d->sdt == MS_DT_BF16) ((uint16_t *)s)[i] = 0x3c00; /* 2^-7 */
            else s[i] = 120;
        }
        w.scale = s, w.scale_dtype = d->sdt, w.brow = d->brow, w.bcol = d->bcol;
    }
    return w;
}

/* Copies of w on the device totalling >= 1 GiB (at least 2). */
static int upload_copies(const ms_qmat *h, ms_qmat *dev, int max) {
    uint64_t b = ms_qmat_bytes(h);
    int n = (int)((1ull << 30) / b) + 1;
    if (n < 2) n = 2;
    if (n > max) n = max;
    ms_err err = {0};
    for (int i = 0; i < n; i++)
        if (ms_gpu_qmat_upload(G, h, &dev[i], &err)) die("upload", &err);
    return n;
}

static void measure_copy(void) {
    size_t bytes = (size_t)2 << 30;
    void *a, *b;
    ms_err err = {0};
    float ms = 0, best = 1e30f;
    if (ms_gpu_alloc(G, bytes, &a, &err) || ms_gpu_alloc(G, bytes, &b, &err)) die("alloc", &err);
    ms_gpu_zero(G, a, bytes, &err);
    for (int r = 0; r < 6; r++) {
        ms_gpu_timer_start(G, &err);
        if (ms_gpu_copy(G, b, a, bytes, &err)) die("copy", &err);
        if (ms_gpu_timer_stop(G, &ms, &err)) die("timer", &err);
        if (r && ms < best) best = ms;
    }
    g_copy = 2.0 * bytes / (best * 1e-3) / 1e9; /* read + write */
    printf("{\"bench\":\"copy\",\"bytes\":%zu,\"ms\":%.3f,\"gbs_read_plus_write\":%.1f}\n", bytes, best, g_copy);
    ms_gpu_free(G, a), ms_gpu_free(G, b);
}

static void bench_matvec(const bdt *d, int64_t rows, int64_t cols, int n, int generic) {
    ms_qmat h = host_w(d, rows, cols), dev[64];
    int nc = upload_copies(&h, dev, 64);
    ms_err err = {0};
    float *x, *y;
    if (ms_gpu_alloc(G, (size_t)(n * cols) * 4, (void **)&x, &err) || ms_gpu_alloc(G, (size_t)(n * rows) * 4, (void **)&y, &err))
        die("alloc", &err);
    ms_gpu_zero(G, x, (size_t)(n * cols) * 4, &err);
    int reps = nc < 40 ? 40 : nc;
    float ms = 0, best = 1e30f;
    for (int round = 0; round < 4; round++) {
        ms_gpu_timer_start(G, &err);
        for (int i = 0; i < reps; i++) {
            int rc = generic ? ms_gpu_matmul_generic(G, y, x, n, &dev[i % nc], 0, &err)
                             : ms_gpu_matmul(G, y, x, n, &dev[i % nc], 0, &err);
            if (rc) die("matmul", &err);
        }
        if (ms_gpu_timer_stop(G, &ms, &err)) die("timer", &err);
        if (round && ms < best) best = ms; /* round 0 warms up */
    }
    double us = best * 1e3 / reps, bytes = (double)ms_qmat_bytes(&h), gbs = bytes / (us * 1e-6) / 1e9;
    printf("{\"bench\":\"matvec\",\"dtype\":\"%s\",\"kernel\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"n\":%d,\"bytes\":%.0f,"
           "\"us\":%.2f,\"gbs\":%.1f,\"frac_peak\":%.3f,\"frac_copy\":%.3f}\n",
           d->name, generic ? "generic" : "vector", (long long)rows, (long long)cols, n, bytes, us, gbs, gbs / g_peak,
           g_copy > 0 ? gbs / g_copy : 0.0);
    fflush(stdout);
    for (int i = 0; i < nc; i++) ms_gpu_qmat_free(G, &dev[i]);
    ms_gpu_free(G, x), ms_gpu_free(G, y);
    free((void *)h.data), free((void *)h.scale);
}

/* k experts of one token, dsv3 shape; sets of experts cycled as above. */
static void bench_experts(const bdt *d, int k, int64_t D, int64_t I) {
    enum { SETS = 8 };
    ms_qmat hg = host_w(d, I, D), hd = host_w(d, D, I);
    ms_gpu_expert ex[SETS][8];
    ms_err err = {0};
    for (int s = 0; s < SETS; s++)
        for (int e = 0; e < k; e++) {
            memset(&ex[s][e], 0, sizeof ex[s][e]);
            if (ms_gpu_qmat_upload(G, &hg, &ex[s][e].gate, &err) || ms_gpu_qmat_upload(G, &hg, &ex[s][e].up, &err) ||
                ms_gpu_qmat_upload(G, &hd, &ex[s][e].down, &err))
                die("upload", &err);
        }
    float *x, *out, *w, *scr, ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    if (ms_gpu_alloc(G, (size_t)D * 4, (void **)&x, &err) || ms_gpu_alloc(G, (size_t)D * 4, (void **)&out, &err) ||
        ms_gpu_alloc(G, 32, (void **)&w, &err) ||
        ms_gpu_alloc(G, ms_gpu_expert_scratch_floats(k, I, D) * 4, (void **)&scr, &err))
        die("alloc", &err);
    ms_gpu_zero(G, x, (size_t)D * 4, &err);
    ms_gpu_upload(G, w, ones, 32, &err);
    int reps = 64;
    float ms = 0, best = 1e30f;
    for (int round = 0; round < 4; round++) {
        ms_gpu_timer_start(G, &err);
        for (int i = 0; i < reps; i++)
            if (ms_gpu_expert_ffn(G, out, x, k, ex[i % SETS], w, MS_GPU_ACT_SWIGLU, 0, 0, scr, 0, &err))
                die("experts", &err);
        if (ms_gpu_timer_stop(G, &ms, &err)) die("timer", &err);
        if (round && ms < best) best = ms;
    }
    double us = best * 1e3 / reps, bytes = (double)k * (2 * ms_qmat_bytes(&hg) + ms_qmat_bytes(&hd));
    double gbs = bytes / (us * 1e-6) / 1e9;
    printf("{\"bench\":\"expert_ffn\",\"dtype\":\"%s\",\"k\":%d,\"hidden\":%lld,\"inter\":%lld,\"bytes\":%.0f,\"us\":%.2f,"
           "\"gbs\":%.1f,\"frac_peak\":%.3f}\n",
           d->name, k, (long long)D, (long long)I, bytes, us, gbs, gbs / g_peak);
    fflush(stdout);
    for (int s = 0; s < SETS; s++)
        for (int e = 0; e < k; e++)
            ms_gpu_qmat_free(G, &ex[s][e].gate), ms_gpu_qmat_free(G, &ex[s][e].up), ms_gpu_qmat_free(G, &ex[s][e].down);
    ms_gpu_free(G, x), ms_gpu_free(G, out), ms_gpu_free(G, w), ms_gpu_free(G, scr);
    free((void *)hg.data), free((void *)hg.scale), free((void *)hd.data), free((void *)hd.scale);
}

/* One decode token's routed experts (ms_gpu_moe_routed, the backend's decode path): E experts
 * of [I, D] gate and up and [D, I] down resident, K of them per call from 64 random id sets
 * (distinct ids per set; E x the expert bytes exceed L2, so the bytes come from HBM). GB/s
 * of the K experts' weight + scale bytes, against the copy measured in the same run. */
static void bench_routed(const bdt *d, int E, int K, int64_t D, int64_t I) {
    enum { SETS = 64 };
    ms_err err = {0};
    ms_qmat hg = host_w(d, I, D), hd = host_w(d, D, I);
    ms_qmat *dg = calloc((size_t)E * 3, sizeof *dg);
    ms_gpu_ex_ptrs *tab = calloc((size_t)E, sizeof *tab);
    for (int e = 0; e < E; e++) {
        for (int m = 0; m < 3; m++) {
            if (ms_gpu_qmat_upload(G, m == 2 ? &hd : &hg, &dg[3 * e + m], &err)) die("upload", &err);
            tab[e].w[m] = dg[3 * e + m].data, tab[e].s[m] = dg[3 * e + m].scale;
        }
    }
    int32_t ids[SETS * 32];
    for (int s = 0; s < SETS; s++)
        for (int j = 0; j < K; j++) {
            int id, dup;
            do {
                id = (int)(rnd() % (uint64_t)E), dup = 0;
                for (int q = 0; q < j; q++) dup |= ids[s * K + q] == id;
            } while (dup);
            ids[s * K + j] = id;
        }
    float wts[32];
    for (int j = 0; j < 32; j++) wts[j] = 1.0f / (float)K;
    void *dtab, *dids, *dw, *x, *acc, *scr;
    if (ms_gpu_alloc(G, (size_t)E * sizeof *tab, &dtab, &err) || ms_gpu_alloc(G, sizeof ids, &dids, &err) ||
        ms_gpu_alloc(G, sizeof wts, &dw, &err) || ms_gpu_alloc(G, (size_t)D * 4, &x, &err) ||
        ms_gpu_alloc(G, (size_t)D * 4, &acc, &err) ||
        ms_gpu_alloc(G, ms_gpu_moe_routed_scratch_floats(K, I, D) * 4, &scr, &err))
        die("alloc", &err);
    ms_gpu_upload(G, dtab, tab, (size_t)E * sizeof *tab, &err), ms_gpu_upload(G, dids, ids, sizeof ids, &err);
    ms_gpu_upload(G, dw, wts, sizeof wts, &err), ms_gpu_zero(G, x, (size_t)D * 4, &err);
    ms_gpu_glu_params act = {0, 0.0f, 1.0f, 0.0f, 0.0f, 0.0f};
    int reps = 256;
    float ms = 0, best = 1e30f;
    for (int round = 0; round < 5; round++) {
        ms_gpu_timer_start(G, &err);
        for (int i = 0; i < reps; i++)
            if (ms_gpu_moe_routed(G, acc, x, K, (const int32_t *)dids + (i % SETS) * K, dw, dtab, &dg[0], &dg[2], 0, 0,
                                  &act, scr, &err))
                die("routed experts", &err);
        if (ms_gpu_timer_stop(G, &ms, &err)) die("timer", &err);
        if (round && ms < best) best = ms;
    }
    double us = best * 1e3 / reps, bytes = (double)K * (2 * ms_qmat_bytes(&hg) + ms_qmat_bytes(&hd));
    double gbs = bytes / (us * 1e-6) / 1e9;
    const char *fp8 = getenv("MS_GPU_FP8_DECODE"), *qx = getenv("MS_GPU_QX"), *rx = getenv("MS_GPU_RX");
    printf("{\"bench\":\"moe_routed\",\"dtype\":\"%s\",\"experts\":%d,\"k\":%d,\"hidden\":%lld,\"inter\":%lld,"
           "\"fp8_decode\":\"%s\",\"qx\":\"%s\",\"rx\":\"%s\",\"bytes\":%.0f,\"us\":%.2f,\"gbs\":%.1f,\"frac_copy\":%.3f}\n",
           d->name, E, K, (long long)D, (long long)I, fp8 ? fp8 : "default", qx ? qx : "new", rx ? rx : "default", bytes,
           us, gbs, g_copy > 0 ? gbs / g_copy : 0.0);
    fflush(stdout);
    for (int i = 0; i < 3 * E; i++) ms_gpu_qmat_free(G, &dg[i]);
    ms_gpu_free(G, dtab), ms_gpu_free(G, dids), ms_gpu_free(G, dw), ms_gpu_free(G, x), ms_gpu_free(G, acc);
    ms_gpu_free(G, scr);
    free(dg), free(tab);
    free((void *)hg.data), free((void *)hg.scale), free((void *)hd.data), free((void *)hd.scale);
}

/* A prefill chunk's routed experts through the grouped GEMMs (ms_gpu_blas_moe, the backend's
 * prefill path): E experts of [I, D] gate and up and [D, I] down resident, n tokens routed to K
 * distinct random experts each. Time per call (the host tables and uploads included) and the
 * weight-level TFLOPS (2 x pairs x 3 D I; the activation parts not counted); MS_GPU_MOE_MMA /
 * MS_GPU_MOE_PARTS name the path. */
static void bench_moe_gemm(const bdt *d, int E, int K, int64_t D, int64_t I, int n) {
    ms_err err = {0};
    ms_gpu_blas *bl = NULL;
    if (ms_gpu_blas_open(G, &bl, &err)) die("blas", &err);
    ms_qmat hg = host_w(d, I, D), hd = host_w(d, D, I);
    ms_qmat *dg = calloc((size_t)E * 3, sizeof *dg);
    ms_expert_view *v = calloc((size_t)E, sizeof *v);
    for (int e = 0; e < E; e++) {
        for (int m = 0; m < 3; m++)
            if (ms_gpu_qmat_upload(G, m == 2 ? &hd : &hg, &dg[3 * e + m], &err)) die("upload", &err);
        v[e].gate = dg[3 * e], v[e].up = dg[3 * e + 1], v[e].down = dg[3 * e + 2];
    }
    int P = n * K, *ids = malloc((size_t)P * 4), *cnt = calloc((size_t)E + 1, 4), *tok = malloc((size_t)P * 4);
    int *off = malloc((size_t)(E + 1) * 4), *pos = malloc((size_t)E * 4);
    float *w = malloc((size_t)P * 4);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            int id, dup;
            do {
                id = (int)(rnd() % (uint64_t)E), dup = 0;
                for (int q = 0; q < j; q++) dup |= ids[t * K + q] == id;
            } while (dup);
            ids[t * K + j] = id;
        }
    for (int i = 0; i < P; i++) cnt[ids[i] + 1]++;
    for (int e = 0; e < E; e++) cnt[e + 1] += cnt[e];
    memcpy(pos, cnt, (size_t)E * 4);
    for (int i = 0; i < P; i++) tok[pos[ids[i]]] = i / K, w[pos[ids[i]]++] = 1.0f / (float)K;
    int nu = 0;
    ms_expert_view *vu = calloc((size_t)E, sizeof *vu);
    for (int e = 0; e < E; e++)
        if (cnt[e + 1] > cnt[e]) off[nu] = cnt[e], vu[nu] = v[e], nu++;
    off[nu] = P;
    void *x, *acc;
    if (ms_gpu_alloc(G, (size_t)n * D * 4, &x, &err) || ms_gpu_alloc(G, (size_t)n * D * 4, &acc, &err)) die("alloc", &err);
    ms_gpu_zero(G, x, (size_t)n * D * 4, &err), ms_gpu_zero(G, acc, (size_t)n * D * 4, &err);
    ms_glu act = {.kind = MS_ACT_SILU, .alpha = 1.0f};
    ms_moe_args a = {.in = x, .acc = acc, .D = D, .act = &act, .nu = nu, .views = vu, .off = off, .tok = tok, .w = w};
    float ms = 0, best = 1e30f;
    for (int round = 0; round < 4; round++) {
        const int reps = 3;
        if (ms_gpu_timer_start(G, &err)) die("timer", &err);
        for (int r = 0; r < reps; r++)
            if (ms_gpu_blas_moe(bl, &a, &err)) die("grouped experts", &err);
        if (ms_gpu_timer_stop(G, &ms, &err)) die("timer", &err);
        if (round && ms / reps < best) best = ms / reps;
    }
    const char *mm = getenv("MS_GPU_MOE_MMA"), *pa = getenv("MS_GPU_MOE_PARTS");
    printf("{\"bench\":\"moe_gemm\",\"dtype\":\"%s\",\"experts\":%d,\"k\":%d,\"hidden\":%lld,\"inter\":%lld,\"n\":%d,"
           "\"mma\":\"%s\",\"parts\":\"%s\",\"mma_calls\":%llu,\"us\":%.1f,\"tflops\":%.1f}\n",
           d->name, E, K, (long long)D, (long long)I, n, mm ? mm : "off", pa ? pa : "3",
           (unsigned long long)ms_gpu_blas_mma_calls(bl), best * 1e3, 2.0 * P * 3 * D * I / (best * 1e-3) / 1e12);
    fflush(stdout);
    ms_gpu_free(G, x), ms_gpu_free(G, acc);
    for (int i = 0; i < 3 * E; i++) ms_gpu_qmat_free(G, &dg[i]);
    free(dg), free(v), free(vu), free(ids), free(cnt), free(tok), free(off), free(pos), free(w);
    free((void *)hg.data), free((void *)hg.scale), free((void *)hd.data), free((void *)hd.scale);
    ms_gpu_blas_close(bl);
}

static void bench_attn(int H, int KV, int hd, int64_t ctx, int window) {
    ms_err err = {0};
    size_t kvb = (size_t)ctx * KV * hd * 4;
    float *q, *k, *v, *o;
    if (ms_gpu_alloc(G, (size_t)H * hd * 4, (void **)&q, &err) || ms_gpu_alloc(G, kvb, (void **)&k, &err) ||
        ms_gpu_alloc(G, kvb, (void **)&v, &err) || ms_gpu_alloc(G, (size_t)H * hd * 4, (void **)&o, &err))
        die("alloc", &err);
    ms_gpu_zero(G, q, (size_t)H * hd * 4, &err), ms_gpu_zero(G, k, kvb, &err), ms_gpu_zero(G, v, kvb, &err);
    ms_gpu_attn_cfg c = {H, KV, hd, hd, window, 0.088f};
    float *scr;
    if (ms_gpu_alloc(G, ms_gpu_attn_scratch_floats(1, &c) * 4, (void **)&scr, &err)) die("alloc", &err);
    int reps = 20;
    float ms = 0, best = 1e30f;
    for (int round = 0; round < 3; round++) {
        ms_gpu_timer_start(G, &err);
        for (int i = 0; i < reps; i++)
            if (ms_gpu_attn_gqa(G, o, q, k, v, NULL, 1, ctx - 1, &c, scr, &err)) die("attention", &err);
        if (ms_gpu_timer_stop(G, &ms, &err)) die("timer", &err);
        if (round && ms < best) best = ms;
    }
    int64_t keys = window > 0 && window < ctx ? window : ctx;
    double us = best * 1e3 / reps, bytes = 2.0 * keys * KV * hd * 4, gbs = bytes / (us * 1e-6) / 1e9;
    const char *mode = getenv("MS_GPU_ATTN");
    printf("{\"bench\":\"attn_gqa_decode\",\"heads\":%d,\"kv_heads\":%d,\"head_dim\":%d,\"ctx\":%lld,\"window\":%d,"
           "\"mode\":\"%s\",\"kv_bytes\":%.0f,\"us\":%.2f,\"gbs\":%.1f,\"frac_peak\":%.3f}\n",
           H, KV, hd, (long long)ctx, window, mode ? mode : "default", bytes, us, gbs, gbs / g_peak);
    fflush(stdout);
    ms_gpu_free(G, q), ms_gpu_free(G, k), ms_gpu_free(G, v), ms_gpu_free(G, o), ms_gpu_free(G, scr);
}

/* The prefill threshold: y = W x for n tokens through the matvec kernel (groups of 8)
 * and through the BLAS GEMM (gemm.h: split activations, dequantized weights), one line
 * per n with both times. */
static void bench_gemm(const bdt *d, int64_t rows, int64_t cols) {
    ms_err err = {0};
    ms_gpu_blas *bl = NULL;
    if (ms_gpu_blas_open(G, &bl, &err)) die("blas", &err);
    ms_qmat h = host_w(d, rows, cols), w;
    if (ms_gpu_qmat_upload(G, &h, &w, &err)) die("upload", &err);
    static const int ns[] = {2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512};
    int nmax = 512;
    void *x, *y;
    if (ms_gpu_alloc(G, (size_t)nmax * cols * 4, &x, &err) || ms_gpu_alloc(G, (size_t)nmax * rows * 4, &y, &err))
        die("alloc", &err);
    ms_gpu_zero(G, x, (size_t)nmax * cols * 4, &err);
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
        int n = ns[k];
        double best[2] = {1e30, 1e30};
        for (int path = 0; path < 2; path++)
            for (int round = 0; round < 4; round++) {
                float ms = 0;
                const int reps = 5;
                if (ms_gpu_timer_start(G, &err)) die("timer", &err);
                for (int r = 0; r < reps; r++) {
                    int rc = path ? ms_gpu_blas_matmul(bl, y, x, n, &w, 0, &err) : ms_gpu_matmul(G, y, x, n, &w, 0, &err);
                    if (rc) die("matmul", &err);
                }
                if (ms_gpu_timer_stop(G, &ms, &err)) die("timer", &err);
                if (round && ms / reps < best[path]) best[path] = ms / reps;
            }
        printf("{\"bench\":\"gemm_vs_matvec\",\"dtype\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"n\":%d,"
               "\"matvec_us\":%.1f,\"gemm_us\":%.1f,\"gemm_tflops\":%.1f}\n",
               d->name, (long long)rows, (long long)cols, n, best[0] * 1e3, best[1] * 1e3,
               2.0 * rows * cols * n / (best[1] * 1e-3) / 1e12);
        fflush(stdout);
    }
    ms_gpu_free(G, x), ms_gpu_free(G, y);
    ms_gpu_qmat_free(G, &w);
    free((void *)h.data), free((void *)h.scale);
    ms_gpu_blas_close(bl);
}

int main(int argc, char **argv) {
    int quick = 0, one = -1, one_n = 1, gemm = -1, routed[16], n_routed = 0, r_e = 0, r_k = 0, moe_n = 0;
    int64_t one_r = 0, one_c = 0, a_ctx[8];
    int a_h[8], a_kv[8], a_hd[8], n_attn = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--peak-gbs") && i + 1 < argc) g_peak = atof(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--matvec") && i + 4 < argc) { /* one case: DTYPE ROWS COLS N */
            one = dt_index(argv[i + 1], strlen(argv[i + 1]));
            one_r = atoll(argv[i + 2]), one_c = atoll(argv[i + 3]), one_n = atoi(argv[i + 4]);
            i += 4;
            if (one < 0 || one_r < 1 || one_c < 1 || one_n < 1) {
                fprintf(stderr, "gpubench: --matvec DTYPE ROWS COLS N (dtype bf16|f16|f32|f8_e4m3|mxfp4|int4)\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--gemm") && i + 3 < argc) { /* matvec vs GEMM over n: DTYPE ROWS COLS */
            gemm = dt_index(argv[i + 1], strlen(argv[i + 1]));
            one_r = atoll(argv[i + 2]), one_c = atoll(argv[i + 3]);
            i += 3;
            if (gemm < 0 || one_r < 1 || one_c < 1) {
                fprintf(stderr, "gpubench: --gemm DTYPE ROWS COLS (dtype bf16|f16|f32|f8_e4m3|mxfp4)\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--moe-gemm") && i + 6 < argc) { /* DTYPE[,DTYPE...] EXPERTS K HIDDEN INTER N */
            int bad = 0;
            for (const char *p = argv[i + 1]; *p && !bad;) {
                const char *c = strchr(p, ',');
                size_t len = c ? (size_t)(c - p) : strlen(p);
                int di = dt_index(p, len);
                if (di < 0 || n_routed >= 16) bad = 1;
                else routed[n_routed++] = di;
                p += len + (c ? 1 : 0);
            }
            r_e = atoi(argv[i + 2]), r_k = atoi(argv[i + 3]), one_r = atoll(argv[i + 4]), one_c = atoll(argv[i + 5]);
            moe_n = atoi(argv[i + 6]);
            i += 6;
            if (bad || r_e < 1 || r_k < 1 || r_k > r_e || moe_n < 1) {
                fprintf(stderr, "gpubench: --moe-gemm DTYPE[,DTYPE...] EXPERTS K HIDDEN INTER N\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--routed") && i + 5 < argc) { /* DTYPE[,DTYPE...] EXPERTS K HIDDEN INTER */
            int bad = 0;
            for (const char *p = argv[i + 1]; *p && !bad;) {
                size_t len = strcspn(p, ",");
                int d = dt_index(p, len);
                if (d < 0 || n_routed == 16) bad = 1;
                else routed[n_routed++] = d;
                p += len + (p[len] == ',');
            }
            r_e = atoi(argv[i + 2]), r_k = atoi(argv[i + 3]), one_r = atoll(argv[i + 4]), one_c = atoll(argv[i + 5]);
            i += 5;
            if (bad || !n_routed || r_k < 1 || r_k > 32 || r_e < r_k || one_r < 1 || one_c < 1) {
                fprintf(stderr, "gpubench: --routed DTYPE[,DTYPE...] EXPERTS K HIDDEN INTER (K 1..32 <= EXPERTS; dtype "
                                "bf16|f16|f32|f8_e4m3|mxfp4|int4)\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--attn") && i + 4 < argc && n_attn < 8) { /* HEADS KV_HEADS HEAD_DIM KEYS */
            int j = n_attn++;
            a_h[j] = atoi(argv[i + 1]), a_kv[j] = atoi(argv[i + 2]), a_hd[j] = atoi(argv[i + 3]);
            a_ctx[j] = atoll(argv[i + 4]);
            i += 4;
            if (a_h[j] < 1 || a_kv[j] < 1 || a_h[j] % a_kv[j] || a_hd[j] < 4 || a_ctx[j] < 1) {
                fprintf(stderr, "gpubench: --attn HEADS KV_HEADS HEAD_DIM KEYS (KV_HEADS | HEADS; up to 8 of them)\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: gpubench [--peak-gbs GBS] [--quick] [--matvec DTYPE ROWS COLS N] [--gemm DTYPE ROWS COLS] [--routed DTYPE[,DTYPE...] EXPERTS K HIDDEN INTER] [--attn HEADS KV_HEADS HEAD_DIM KEYS]\n");
            return 2;
        }
    }
    ms_err err = {0};
    if (ms_gpu_open(0, &G, &err)) die("opening GPU 0", &err);
    ms_gpu_info info;
    if (ms_gpu_info_get(G, &info, &err)) die("device info", &err);
    printf("{\"bench\":\"device\",\"backend\":\"%s\",\"name\":\"%s\",\"cc\":\"%d.%d\",\"sms\":%d,\"warp\":%d,"
           "\"mem_gib\":%.1f,\"l2_mib\":%.1f,\"peak_gbs_attr\":%.0f,\"peak_gbs_used\":%.0f,\"runtime\":%d,\"driver\":%d}\n",
           info.backend, info.name, info.cc_major, info.cc_minor, info.sm_count, info.warp_size,
           info.mem_total / 1073741824.0, info.l2_bytes / 1048576.0, info.peak_gbs, g_peak, info.runtime_version,
           info.driver_version);
    measure_copy();
    if (n_attn) {
        for (int j = 0; j < n_attn; j++) bench_attn(a_h[j], a_kv[j], a_hd[j], a_ctx[j], 0);
        ms_gpu_close(G);
        return 0;
    }
    if (n_routed && moe_n) {
        for (int q = 0; q < n_routed; q++) bench_moe_gemm(&k_dt[routed[q]], r_e, r_k, one_r, one_c, moe_n);
        ms_gpu_close(G);
        return 0;
    }
    if (n_routed) {
        for (int q = 0; q < n_routed; q++) bench_routed(&k_dt[routed[q]], r_e, r_k, one_r, one_c);
        ms_gpu_close(G);
        return 0;
    }
    if (gemm >= 0) {
        bench_gemm(&k_dt[gemm], one_r, one_c);
        ms_gpu_close(G);
        return 0;
    }
    if (one >= 0) {
        bench_matvec(&k_dt[one], one_r, one_c, one_n, 0);
        ms_gpu_close(G);
        return 0;
    }
    static const int64_t shapes[][2] = {{2048, 7168}, {7168, 2048}, {18432, 7168}, {129280, 7168}};
    int nshape = quick ? 3 : 4;
    for (int d = 0; d < N_SWEEP; d++)
        for (int s = 0; s < nshape; s++) bench_matvec(&k_dt[d], shapes[s][0], shapes[s][1], 1, 0);
    for (int d = 0; d < N_SWEEP; d++) {
        bench_matvec(&k_dt[d], 18432, 7168, 4, 0);
        bench_matvec(&k_dt[d], 18432, 7168, 8, 0);
    }
    bench_matvec(&k_dt[0], 18432, 7168, 1, 1);
    bench_matvec(&k_dt[3], 18432, 7168, 1, 1);
    bench_experts(&k_dt[0], 8, 7168, 2048);
    bench_experts(&k_dt[3], 8, 7168, 2048);
    bench_experts(&k_dt[4], 8, 7168, 2048);
    bench_attn(64, 8, 128, 4096, 0);
    bench_attn(64, 8, 128, 32768, 0);
    bench_attn(64, 8, 64, 32768, 128);
    bench_attn(64, 4, 128, 32768, 0);
    bench_attn(128, 128, 128, 4096, 0);
    ms_gpu_close(G);
    return 0;
}
