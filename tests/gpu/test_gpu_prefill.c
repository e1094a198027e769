/* test_gpu_prefill.c — the tiled prefill attention (backend/gpu/attn_prefill.h) in both inner
 * product forms (F32 FMA, split-TF32 tensor cores) against the CPU backend's attn_gqa, and
 * its timing against the split-K kernel (ms_gpu_attn_gqa in chunks of 16 tokens, the
 * backend's earlier prefill path). MS_GPU_TEST_FA=fma or mma runs that form alone.
 *
 * Bound. out = sum_s p_s v_s / sum_s p_s over the keys a row sees. A score error d moves each
 * normalized probability by a relative 2 max|d| at first order, so |dout| <= (2 (dc + dg) +
 * vc + vg + 8 u) vmax, where (S = max_row |q| max_key |k| scale >= sum_i |q_i k_i| scale,
 * Cauchy-Schwarz; u = 2^-24; keys = the most keys a row sees):
 *   dc = (hd + 3) u S           the CPU's dot (any order) and scale
 *   vc = (keys + 16) u          the CPU's sequential axpy over the keys and p / sum
 * and, on the GPU's side, with T = ceil(keys / 64) key tiles: a term of tile i passes its tile's
 * chain, then one rounding and one e^(m_old - m_new) (2 u) per later tile, both for o and for
 * the lanes' partial sums l (a lane adds 8 (FMA) or 16 (MMA) probabilities per tile and row,
 * then 3 or 2 shuffle adds), and out = o / l (2 u): vg = (o's tile chain + l's + 6 T + 8) u.
 *   FMA form:  dg = (hd + 3) u S, one FMA chain per score;
 *              vg = (64 + 11 + 6 T + 8) u <= (84 + 6 T) u: a tile's 64-key FMA chain.
 *   MMA form (x = hi + lo, hi the TF32 rounding of x, lo = x - hi exact, read by the tensor
 *   core truncated to TF32: error <= 2^-21 |x|; three products per pair, the lo lo term left
 *   out: 20 u |x y| per product; each mma.sync adds its 8 exact products and the accumulator
 *   with at most 2 u of the largest of its 9 terms each (truncation), plus 2 u on the result:
 *   20 u of the terms' absolute sum per step):
 *              dg = (2.5 hd + 24) u S -> (3 hd + 24) u S: the hi hi chain of hd / 8 steps,
 *              the cross chain (2^-10 smaller), the split, the final add and scale;
 *              vg = (24 x 20 + 20 + 18 + 6 T + 8) u <= (530 + 6 T) u: a tile's chain of 8
 *              k-steps x 3 products and the split of p and v. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/gpu/attn_prefill.h"
#include "backend/gpu/gpu.h"
#include "test.h"
#include "test_gpu.h"

static float *fa_up(const float *h, int64_t n) {
    void *d = NULL;
    ms_err err = {0};
    if (ms_gpu_alloc(gpu(), (size_t)n * 4, &d, &err) || ms_gpu_upload(gpu(), d, h, (size_t)n * 4, &err)) {
        fprintf(stderr, "test_gpu: device buffer: %s\n", err.msg);
        exit(1);
    }
    return d;
}

/* largest L2 norm of the rows of d floats */
static double max_norm(const float *x, int64_t rows, int64_t d) {
    double m = 0;
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t i = 0; i < d; i++) s += (double)x[r * d + i] * x[r * d + i];
        m = fmax(m, sqrt(s));
    }
    return m;
}

static double maxabs_(const float *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* the split-K path as the backend ran prefill before: chunks of 16 tokens */
static int old_path(float *out, const float *q, const float *k, const float *v, const float *s, int n, int64_t pos0,
                    const ms_gpu_attn_cfg *c, float *scr, ms_err *err) {
    for (int t0 = 0; t0 < n; t0 += 16) {
        int m = n - t0 < 16 ? n - t0 : 16;
        int rc = ms_gpu_attn_gqa(gpu(), out + (int64_t)t0 * c->n_heads * c->v_head_dim,
                                 q + (int64_t)t0 * c->n_heads * c->head_dim, k, v, s, m, pos0 + t0, c, scr, err);
        if (rc) return rc;
    }
    return MS_OK;
}

/* One shape: ctx cached positions, the last n of them the query tokens (pos0 = ctx - n).
 * nsample 0: every token checked against one CPU call; else the CPU twin runs token by token
 * (n = 1 at n_past = pos0 + t: the same causal rows) on the chunk's edges, tile edges and
 * nsample random tokens. time: also time both forms and the split-K path. */
static void check_fa(const char *what, int H, int KV, int hd, int vd, int window, int with_sinks, int64_t ctx, int n,
                     int nsample, int time) {
    int64_t pos0 = ctx - n, kd = (int64_t)KV * hd, vt = (int64_t)KV * vd, nq = (int64_t)n * H * hd,
            no = (int64_t)n * H * vd;
    float *q = randv(nq, 1.0f), *k = randv(ctx * kd, 1.0f), *v = randv(ctx * vt, 1.0f);
    float *sinks = with_sinks ? randv(H, 2.0f) : NULL;
    float scale = 1.0f / sqrtf((float)hd);
    float *dq = fa_up(q, nq), *dk = fa_up(k, ctx * kd), *dv = fa_up(v, ctx * vt), *ds = sinks ? fa_up(sinks, H) : NULL;
    float *dout = NULL;
    ms_err err = {0};
    CHECK(ms_gpu_alloc(gpu(), (size_t)no * 4, (void **)&dout, &err) == MS_OK);
    ms_gpu_attn_cfg c = {H, KV, hd, vd, window, scale};
    float *got[3] = {NULL, NULL, NULL}; /* by form */
    const char *only = getenv("MS_GPU_TEST_FA"); /* "fma" or "mma": that form alone (a fault stays in its run) */
    for (int form = MS_GPU_FA_FMA; form <= MS_GPU_FA_MMA; form++) {
        if (only && strcmp(only, form == MS_GPU_FA_MMA ? "mma" : "fma")) continue;
        CHECK(ms_gpu_zero(gpu(), dout, (size_t)no * 4, &err) == MS_OK);
        int rc = ms_gpu_attn_prefill(gpu(), dout, dq, dk, dv, ds, n, pos0, &c, form, &err);
        if (rc == MS_ERR_UNSUPPORTED && form == MS_GPU_FA_MMA) {
            printf("  prefill attn %s: mma form refused (%s)\n", what, err.msg);
            continue;
        }
        CHECK_MSG(rc == MS_OK, "%s (%s): %s", what, form == MS_GPU_FA_MMA ? "mma" : "fma", err.msg);
        if (rc) continue;
        got[form] = malloc((size_t)no * 4);
        CHECK(ms_gpu_download(gpu(), got[form], dout, (size_t)no * 4, &err) == MS_OK);
    }
    /* the tokens to check */
    int *tok = malloc((size_t)(n + 64) * sizeof(int)), nt = 0;
    if (!nsample)
        for (int t = 0; t < n; t++) tok[nt++] = t;
    else {
        int fixed[] = {0, 1, 2, 7, 8, 15, 16, 63, 64, 65, n / 2, n - 65, n - 64, n - 63, n - 9, n - 8, n - 2, n - 1};
        for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
            if (fixed[i] >= 0 && fixed[i] < n) tok[nt++] = fixed[i];
        for (int i = 0; i < nsample; i++) tok[nt++] = (int)(rnd() % (uint64_t)n);
    }
    float *ref = malloc((size_t)(nsample ? H * vd : no) * 4);
    double S = max_norm(q, (int64_t)n * H, hd) * max_norm(k, ctx * KV, hd) * scale, vmax = maxabs_(v, ctx * vt);
    double keys = window > 0 && window < ctx ? window : (double)ctx;
    double dc = (hd + 3) * U32 * S, vc = (keys + 16) * U32;
    double T = ceil(keys / 64);
    double tol[3] = {0, (2 * (dc + (hd + 3) * U32 * S) + vc + (84 + 6 * T) * U32 + 8 * U32) * vmax,
                     (2 * (dc + (3.0 * hd + 24) * U32 * S) + vc + (530 + 6 * T) * U32 + 8 * U32) * vmax};
    double worst[3] = {0, 0, 0};
    int bad[3] = {0, 0, 0};
    ms_err cerr = {0};
    for (int i = 0; i < (nsample ? nt : 1); i++) {
        int t0 = nsample ? tok[i] : 0, m = nsample ? 1 : n;
        ms_attn_gqa_args ga = {.out = ref, .q = q + (int64_t)t0 * H * hd, .k = k, .v = v, .n = m, .n_past = pos0 + t0,
                               .H = H, .KV = KV, .hd = hd, .vd = vd, .window = window, .sinks = sinks, .scale = scale};
        CHECK_MSG(cpu()->ops->attn_gqa(cpu(), &ga, &cerr) == MS_OK, "CPU attention: %s", cerr.msg);
        for (int form = MS_GPU_FA_FMA; form <= MS_GPU_FA_MMA; form++) {
            if (!got[form]) continue;
            const float *g = got[form] + (int64_t)t0 * H * vd;
            for (int64_t j = 0; j < (int64_t)m * H * vd; j++) {
                double e = fabs((double)g[j] - ref[j]) / tol[form];
                if (!(e <= 1)) bad[form]++;
                if (e > worst[form] || e != e) worst[form] = e;
            }
        }
    }
    for (int form = MS_GPU_FA_FMA; form <= MS_GPU_FA_MMA; form++) {
        if (!got[form]) continue;
        printf("  prefill attn %-3s %-44s ctx %-5lld n=%-4d %s max err/bound %.3f (bound %.2e)\n",
               form == MS_GPU_FA_MMA ? "mma" : "fma", what, (long long)ctx, n, nsample ? "sampled" : "all    ",
               worst[form], tol[form]);
        CHECK_MSG(bad[form] == 0, "%s (%s): %d outputs out of bound", what, form == MS_GPU_FA_MMA ? "mma" : "fma",
                  bad[form]);
    }
    fflush(stdout);
    if (time) {
        float *scr = NULL;
        CHECK(ms_gpu_alloc(gpu(), ms_gpu_attn_scratch_floats(16, &c) * 4, (void **)&scr, &err) == MS_OK);
        float best[3] = {1e30f, 1e30f, 1e30f};
        for (int rep = 0; rep < 3; rep++)
            for (int f = 0; f < 3; f++) {
                if (f && !got[f]) continue;
                float ms = 0;
                ms_gpu_timer_start(gpu(), &err);
                int rc = f ? ms_gpu_attn_prefill(gpu(), dout, dq, dk, dv, ds, n, pos0, &c, f, &err)
                           : old_path(dout, dq, dk, dv, ds, n, pos0, &c, scr, &err);
                ms_gpu_timer_stop(gpu(), &ms, &err);
                CHECK_MSG(rc == MS_OK, "timing %s: %s", what, err.msg);
                fflush(stdout);
                if (ms < best[f]) best[f] = ms;
            }
        printf("  prefill attn time %-44s ctx %-5lld n=%-4d split-K %.3f ms, fma %.3f ms, mma %.3f ms\n", what,
               (long long)ctx, n, best[0], got[1] ? best[1] : 0.0f, got[2] ? best[2] : 0.0f);
        ms_gpu_free(gpu(), scr);
    }
    ms_gpu_free(gpu(), dq), ms_gpu_free(gpu(), dk), ms_gpu_free(gpu(), dv), ms_gpu_free(gpu(), ds),
        ms_gpu_free(gpu(), dout);
    free(q), free(k), free(v), free(sinks), free(ref), free(tok), free(got[1]), free(got[2]);
}

TEST(prefill_attention) {
    SKIP_UNLESS_SELECTED("prefill_attention");
    check_fa("32 / 4, hd 128 (qwen3 30B), from 0", 32, 4, 128, 128, 0, 0, 4096, 4096, 24, 0);
    check_fa("32 / 4, hd 128, chunk at 3584", 32, 4, 128, 128, 0, 0, 4096, 512, 16, 0);
    check_fa("32 / 4, hd 128, 1 token", 32, 4, 128, 128, 0, 0, 101, 1, 0, 0);
    check_fa("32 / 4, hd 128, 2 tokens", 32, 4, 128, 128, 0, 1, 300, 2, 0, 0);
    check_fa("32 / 4, hd 128, 17 tokens at 1000", 32, 4, 128, 128, 0, 0, 1017, 17, 0, 0);
    check_fa("32 / 4, hd 128, 65 tokens from 0", 32, 4, 128, 128, 0, 0, 65, 65, 0, 0);
    check_fa("32 / 4, window 100, sinks, 257 at 1000", 32, 4, 128, 128, 100, 1, 1257, 257, 0, 0);
    check_fa("64 / 8, hd 64, sinks, window 128 (gpt-oss)", 64, 8, 64, 64, 128, 1, 700, 300, 0, 0);
    check_fa("64 / 8, hd 64, sinks, full", 64, 8, 64, 64, 0, 1, 700, 300, 24, 0);
    check_fa("16 / 16 (MHA), hd 128", 16, 16, 128, 128, 0, 0, 1000, 1000, 16, 0);
    check_fa("16 / 16, qk 192, v 128 (MLA expanded)", 16, 16, 192, 128, 0, 0, 600, 200, 0, 0);
    check_fa("64 / 4, hd 128 (16 heads per kv head)", 64, 4, 128, 128, 0, 0, 300, 300, 0, 0);
    check_fa("8 / 1, hd 64, window 33, sinks", 8, 1, 64, 64, 33, 1, 2000, 100, 0, 0);
    check_fa("4 / 1, hd 96, 5 tokens from 0, sinks", 4, 1, 96, 96, 0, 1, 5, 5, 0, 0);
    check_fa("2 / 1, hd 8, v 16, 70 tokens", 2, 1, 8, 16, 0, 0, 70, 70, 0, 0);
    check_fa("4 / 2, hd 256, v 64, window 70", 4, 2, 256, 64, 70, 0, 400, 130, 0, 0);
    check_fa("16 / 2, hd 256, v 256 (two value slices)", 16, 2, 256, 256, 0, 0, 700, 300, 0, 0);
    check_fa("8 / 4, hd 128, v 192 (slices of 128 and 64), sinks", 8, 4, 128, 192, 0, 1, 333, 333, 0, 0);
    /* refused shapes: no launch, MS_ERR_UNSUPPORTED (the backend then runs the split-K kernel) */
    ms_gpu_attn_cfg c = {8, 8, 256, 520, 0, 0.1f};
    ms_err err = {0};
    float *d = NULL;
    CHECK(ms_gpu_alloc(gpu(), 1 << 20, (void **)&d, &err) == MS_OK);
    CHECK(ms_gpu_attn_prefill(gpu(), d, d, d, d, NULL, 4, 0, &c, MS_GPU_FA_FMA, &err) == MS_ERR_UNSUPPORTED);
    c.v_head_dim = 128, c.head_dim = 100;
    CHECK(ms_gpu_attn_prefill(gpu(), d, d, d, d, NULL, 4, 0, &c, MS_GPU_FA_FMA, &err) == MS_ERR_UNSUPPORTED);
    ms_gpu_free(gpu(), d);
}

/* Timing only (MS_GPU_TEST_ONLY=prefill_attention_time): the layer shapes of the benches. */
TEST(prefill_attention_time) {
    SKIP_UNLESS_SELECTED("prefill_attention_time");
    check_fa("32 / 4, hd 128 (qwen3 30B)", 32, 4, 128, 128, 0, 0, 4096, 4096, 4, 1);
    check_fa("32 / 4, hd 128 (qwen3 30B)", 32, 4, 128, 128, 0, 0, 512, 512, 4, 1);
    check_fa("32 / 4, hd 128, chunk 512 at 3584", 32, 4, 128, 128, 0, 0, 4096, 512, 4, 1);
    check_fa("64 / 8, hd 64, window 128, sinks (gpt-oss)", 64, 8, 64, 64, 128, 1, 4096, 4096, 4, 1);
    check_fa("128 / 128, qk 192, v 128 (deepseek expanded)", 128, 128, 192, 128, 0, 0, 512, 512, 2, 1);
}

TEST_GPU_RUNNER(test_gpu_run_prefill)
