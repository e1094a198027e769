/* test_gpu_step.c — the GPU backend's replayable decode step (core/backend.h embed_at, qkv_at,
 * attn_gqa with pos_dev, the recorded graph) against the CPU backend, and programmatic dependent
 * launch through whole decodes of fixture models (the same logits bits with and without). Uses
 * test_gpu_backend.c's backend and buffers (test_gpu.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gpu.h"
#include "engine/engine_internal.h"
#include "model/config.h"
#include "model/model.h"
#include "ops/ops.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/gpu/backend_gpu.h"
#include "test.h"
#include "test_gpu.h"

/* The replayable decode step's ops (core/backend.h embed_at, qkv_at, attn_gqa with pos_dev,
 * graph_begin .. graph_launch) against the CPU backend's composition at the same position: the
 * embedding row of step[1]; per-head rmsnorm then rope at step[0], the key and value rows in
 * the caches (the rest of the caches untouched); attention over step[0] + 1 keys with the grid
 * of a larger bound; and a recorded graph of these ops replayed at two later positions (the
 * step uploaded between), then a recording with a download in it refused without poisoning
 * the backend. */
TEST(backend_step) {
    SKIP_UNLESS_SELECTED("backend_step");
    ms_backend *C = cpu(), *G = gbe();
    ms_err err = {0};
    float *got;
    int64_t *dstep = NULL;
    CHECK(G->ops->alloc(G, 16, (void **)&dstep, &err) == MS_OK);
    int64_t hs[2] = {700, 777};
    CHECK(G->ops->upload(G, dstep, hs, 16, &err) == MS_OK);
    { /* embed_at: a BF16 table, row 777 */
        ms_qmat t = make_w(&K_BF16, 1000, 512), dt;
        CHECK(G->ops->place_qmat(G, &t, &dt, &err) == MS_OK);
        float *e1 = malloc(512 * 4), *de = bup(e1, 512);
        int32_t id = 777;
        C->ops->embed(C, e1, &t, &id, 1), G->ops->embed_at(G, de, &dt, dstep);
        got = bget(de, 512), cmpv("embed_at (bf16, row 777)", got, e1, 512, 0, 0), free(got);
        gfree(de), free(e1), free_w(&t);
    }
    /* Qwen3's attention shape: q 32 heads, k / v 4 heads of 128, a cache of 1024 rows */
    int64_t H = 32, KV = 4, hd = 128, vd = 128, ctx = 1024, kd = KV * hd, vt = KV * vd;
    for (int form = 0; form < 2; form++) { /* 0: norm + full half-split rope; 1: no norm, 64 interleaved dims */
        ms_rope r;
        memset(&r, 0, sizeof r);
        r.dim = form ? 64 : 128, r.layout = form ? MS_ROPE_INTERLEAVED : MS_ROPE_HALF, r.attn_factor = form ? 1.1 : 1.0;
        for (int i = 0; i < r.dim / 2; i++) r.inv_freq[i] = pow(1e6, -2.0 * i / r.dim);
        float *q = randv(H * hd, 1.0f), *k = randv(kd, 1.0f), *v = randv(vt, 1.0f), *wq = randv(hd, 1.0f),
              *wk = randv(hd, 1.0f);
        float *kc = calloc((size_t)(ctx * kd), 4), *vc = calloc((size_t)(ctx * vt), 4);
        float *dq = bup(q, H * hd), *dk = bup(k, kd), *dv = bup(v, vt), *dwq = bup(wq, hd), *dwk = bup(wk, hd);
        float *dkc = bup(kc, ctx * kd), *dvc = bup(vc, ctx * vt);
        if (!form) C->ops->rmsnorm(C, q, q, wq, H, hd, 1e-6f), C->ops->rmsnorm(C, k, k, wk, KV, hd, 1e-6f);
        C->ops->rope(C, &r, q, 1, H * hd, H, hd, 0, 700, 1.0f), C->ops->rope(C, &r, k, 1, kd, KV, hd, 0, 700, 1.0f);
        memcpy(kc + 700 * kd, k, (size_t)kd * 4), memcpy(vc + 700 * vt, v, (size_t)vt * 4);
        G->ops->qkv_at(G, &r, dq, H, dwq, dk, KV, dwk, dv, vd, dkc, dvc, hd, !form, 1e-6f, dstep);
        const char *fn = form ? "qkv_at (no norm, 64 interleaved dims" : "qkv_at (norm, half-split";
        char nm[96];
        snprintf(nm, sizeof nm, "%s, q)", fn);
        got = bget(dq, H * hd), cmpv(nm, got, q, H * hd, 200 * U32 + 2e-6, 1e-6), free(got);
        snprintf(nm, sizeof nm, "%s, key cache)", fn);
        got = bget(dkc, ctx * kd), cmpv(nm, got, kc, ctx * kd, 200 * U32 + 2e-6, 1e-6), free(got);
        snprintf(nm, sizeof nm, "%s, value cache)", fn);
        got = bget(dvc, ctx * vt), cmpv(nm, got, vc, ctx * vt, 0, 0), free(got);
        gfree(dq), gfree(dk), gfree(dv), gfree(dwq), gfree(dwk), gfree(dkc), gfree(dvc);
        free(q), free(k), free(v), free(wq), free(wk), free(kc), free(vc);
    }
    /* attention at the device position: eager (700 keys, grid of the bound 767), then a graph of
     * [qkv_at, attn_gqa] recorded at 700 and replayed at 701 and 900 (window 0 and window 300 + sinks) */
    for (int wform = 0; wform < 2; wform++) {
        int64_t window = wform ? 300 : 0;
        ms_rope r;
        memset(&r, 0, sizeof r);
        r.dim = 128, r.layout = MS_ROPE_HALF, r.attn_factor = 1.0;
        for (int i = 0; i < 64; i++) r.inv_freq[i] = pow(1e6, -2.0 * i / 128);
        float *kc = randv(ctx * kd, 1.0f), *vc = randv(ctx * vt, 1.0f), *q0 = randv(H * hd, 1.0f);
        float *knew = randv(kd, 1.0f), *vnew = randv(vt, 1.0f), *sinks = wform ? randv(H, 2.0f) : NULL;
        float *dkc = bup(kc, ctx * kd), *dvc = bup(vc, ctx * vt), *dq = bup(q0, H * hd), *dk = bup(knew, kd);
        float *dv = bup(vnew, vt), *ds = sinks ? bup(sinks, H) : NULL, *ref = malloc((size_t)H * vd * 4);
        float *dout = bup(ref, H * vd), scale = 1.0f / sqrtf((float)hd);
        int64_t pos[3] = {700, 701, 900};
        void *graph = NULL;
        for (int i = 0; i < 4; i++) {
            int64_t p = pos[i < 3 ? i : 2];
            int64_t hv[2] = {p, 0};
            CHECK(G->ops->upload(G, dstep, hv, 16, &err) == MS_OK);
            same(dq, q0, H * hd), same(dk, knew, kd);
            ms_attn_gqa_args b = {.out = dout, .q = dq, .k = dkc, .v = dvc, .n = 1, .n_past = 1023, .H = H, .KV = KV,
                                  .hd = hd, .vd = vd, .window = window, .sinks = ds, .scale = scale, .pos_dev = dstep};
            if (i == 0) { /* eager */
                G->ops->qkv_at(G, &r, dq, H, NULL, dk, KV, NULL, dv, vd, dkc, dvc, hd, 0, 1e-6f, dstep);
                CHECK_MSG(G->ops->attn_gqa(G, &b, &err) == MS_OK, "%s", err.msg);
            } else if (i == 1) { /* recorded at 701, then launched */
                CHECK_MSG(G->ops->graph_begin(G, &err) == MS_OK, "%s", err.msg);
                G->ops->qkv_at(G, &r, dq, H, NULL, dk, KV, NULL, dv, vd, dkc, dvc, hd, 0, 1e-6f, dstep);
                CHECK_MSG(G->ops->attn_gqa(G, &b, &err) == MS_OK, "%s", err.msg);
                CHECK_MSG(G->ops->graph_end(G, &graph, &err) == MS_OK && graph, "%s", err.msg);
                CHECK_MSG(G->ops->graph_launch(G, graph, &err) == MS_OK, "%s", err.msg);
            } else { /* replayed at 900 (twice: the same inputs, the same result) */
                CHECK_MSG(G->ops->graph_launch(G, graph, &err) == MS_OK, "%s", err.msg);
            }
            /* the CPU: the same rotation, the rows at p, attention over p + 1 keys */
            float *q = malloc((size_t)H * hd * 4), *k = malloc((size_t)kd * 4);
            memcpy(q, q0, (size_t)H * hd * 4), memcpy(k, knew, (size_t)kd * 4);
            C->ops->rope(C, &r, q, 1, H * hd, H, hd, 0, p, 1.0f), C->ops->rope(C, &r, k, 1, kd, KV, hd, 0, p, 1.0f);
            memcpy(kc + p * kd, k, (size_t)kd * 4), memcpy(vc + p * vt, vnew, (size_t)vt * 4);
            ms_attn_gqa_args a = {.out = ref, .q = q, .k = kc, .v = vc, .n = 1, .n_past = p, .H = H, .KV = KV,
                                  .hd = hd, .vd = vd, .window = window, .sinks = sinks, .scale = scale};
            CHECK(C->ops->attn_gqa(C, &a, &err) == MS_OK);
            got = bget(dout, H * vd);
            int64_t nk = window && p + 1 > window ? window : p + 1;
            double dsc = (hd + 3) * U32 * hd * maxabs(q, H * hd) * maxabs(kc, ctx * kd) * scale + 400 * U32;
            double tol = (2 * dsc + 2 * (nk / 4.0 + 16) * U32 + 8 * U32) * maxabs(vc, ctx * vt);
            char nm[96];
            snprintf(nm, sizeof nm, "step attention %s at %lld%s", i == 0 ? "eager" : i == 1 ? "recorded" : "replayed",
                     (long long)p, wform ? " (window 300, sinks)" : "");
            cmpv(nm, got, ref, H * vd, 0, tol);
            free(got), free(q), free(k);
        }
        G->ops->graph_free(G, graph);
        gfree(dkc), gfree(dvc), gfree(dq), gfree(dk), gfree(dv), gfree(dout);
        if (ds) gfree(ds);
        free(kc), free(vc), free(q0), free(knew), free(vnew), free(sinks), free(ref);
    }
    { /* argmax: the greedy pick of the host loop (first index of the largest; NaN never wins; NaN
       * at 0 gives 0) on vocabulary rows: plain, a coarse grid (ties), NaNs, NaN at 0, -inf, tiny */
        int32_t *dpick = NULL, *bpick = NULL;
        CHECK(G->ops->alloc(G, 4, (void **)&dpick, &err) == MS_OK);
        ms_backend *Bk = NULL; /* MS_GPU_ARGMAX_BLOCKS=0: the one-block pick (G: a block per 1024 values) */
        setenv("MS_GPU_ARGMAX_BLOCKS", "0", 1);
        CHECK(ms_backend_gpu_create(0, &Bk, &err) == MS_OK);
        unsetenv("MS_GPU_ARGMAX_BLOCKS");
        if (Bk) CHECK(Bk->ops->alloc(Bk, 4, (void **)&bpick, &err) == MS_OK);
        int64_t ns[9] = {151936, 151936, 151936, 151936, 129280, 1, 1500, 1024, 1025};
        for (int f = 0; f < 9; f++) {
            int64_t n = ns[f];
            float *x = randv(n, 3.0f);
            if (f == 1 || f == 6) for (int64_t i = 0; i < n; i++) x[i] = roundf(x[i]); /* many ties */
            if (f == 2) for (int64_t i = 0; i < n; i += 7) x[i] = NAN;
            if (f == 3) x[0] = NAN;
            if (f == 4) for (int64_t i = 0; i < n; i++) x[i] = -INFINITY;
            if (f == 7) for (int64_t i = 0; i < n; i++) x[i] = i % 2 ? 0.0f : -0.0f; /* -0 = +0: index 0 */
            if (f == 8) x[1024] = 1e30f;
            int64_t best = 0;
            for (int64_t v = 0; v < n; v++)
                if (x[v] > x[best]) best = v;
            float *dx = bup(x, n);
            G->ops->argmax(G, dx, n, dpick);
            int32_t got1 = -1;
            CHECK(G->ops->download(G, &got1, dpick, 4, &err) == MS_OK);
            CHECK_MSG(got1 == best, "argmax case %d (n %lld): %d, the host loop %lld", f, (long long)n, got1,
                      (long long)best);
            if (f == 0) { /* argmax_step (a backend opened with MS_GPU_STEP_NEXT=1): the pick, and the next step */
                ms_backend *S = NULL;
                setenv("MS_GPU_STEP_NEXT", "1", 1);
                CHECK(ms_backend_gpu_create(0, &S, &err) == MS_OK);
                unsetenv("MS_GPU_STEP_NEXT");
                if (S) {
                    int32_t *sp = NULL;
                    int64_t *ss = NULL, sv[2] = {41, 5}, sb[2] = {0, 0};
                    float *sx = NULL;
                    CHECK(S->ops->alloc(S, 4, (void **)&sp, &err) == MS_OK);
                    CHECK(S->ops->alloc(S, 16, (void **)&ss, &err) == MS_OK);
                    CHECK(S->ops->alloc(S, (size_t)n * 4, (void **)&sx, &err) == MS_OK);
                    CHECK(S->ops->upload(S, ss, sv, 16, &err) == MS_OK);
                    CHECK(S->ops->upload(S, sx, x, (size_t)n * 4, &err) == MS_OK);
                    CHECK(S->ops->argmax_step != NULL);
                    if (S->ops->argmax_step) S->ops->argmax_step(S, sx, n, sp, ss);
                    int32_t g2 = -1;
                    CHECK(S->ops->download(S, &g2, sp, 4, &err) == MS_OK);
                    CHECK(S->ops->download(S, sb, ss, 16, &err) == MS_OK);
                    CHECK_MSG(g2 == best && sb[0] == 42 && sb[1] == best, "argmax_step: %d, step {%lld, %lld}", g2,
                              (long long)sb[0], (long long)sb[1]);
                    S->ops->free(S, sp), S->ops->free(S, ss), S->ops->free(S, sx);
                    S->ops->destroy(S);
                }
            }
            int32_t got2 = -1;
            if (Bk && bpick) {
                float *bx = NULL;
                CHECK(Bk->ops->alloc(Bk, (size_t)n * 4, (void **)&bx, &err) == MS_OK);
                CHECK(Bk->ops->upload(Bk, bx, x, (size_t)n * 4, &err) == MS_OK);
                for (int rep = 0; rep < 2; rep++) {
                    Bk->ops->argmax(Bk, bx, n, bpick);
                    CHECK(Bk->ops->download(Bk, &got2, bpick, 4, &err) == MS_OK);
                    CHECK_MSG(got2 == best, "argmax (one block) case %d (n %lld) run %d: %d, the host loop %lld", f,
                              (long long)n, rep, got2, (long long)best);
                }
                Bk->ops->free(Bk, bx);
            }
            printf("  backend argmax case %d (n %lld): %d, one block %d %s\n", f, (long long)n, got1, got2,
                   got1 == best && got2 == best ? "ok" : "WRONG");
            gfree(dx), free(x);
        }
        gfree(dpick);
        if (Bk) {
            if (bpick) Bk->ops->free(Bk, bpick);
            Bk->ops->destroy(Bk);
        }
    }
    { /* a recording with a host round trip in it: refused, the backend still works */
        float h[4] = {1, 2, 3, 4}, back[4] = {0};
        float *d = bup(h, 4);
        CHECK(G->ops->graph_begin(G, &err) == MS_OK);
        G->ops->scale(G, d, 2.0f, 4);
        ms_err e2 = {0};
        (void)G->ops->download(G, back, d, 16, &e2);
        void *graph = NULL;
        CHECK(G->ops->graph_end(G, &graph, &e2) == MS_ERR_UNSUPPORTED && graph == NULL);
        CHECK_MSG(G->ops->sync(G, &err) == MS_OK, "after a refused recording: %s", err.msg);
        got = bget(d, 4);
        CHECK_MSG(got[0] == 1 && got[3] == 4, "the refused recording ran (%g)", got[0]);
        free(got), gfree(d);
    }
    gfree(dstep);
}

/* A buffer of n floats on backend be (alloc + upload), and n floats back (download: waits). */
static float *fup(ms_backend *be, const float *h, int64_t n) {
    ms_err err = {0};
    void *d = NULL;
    CHECK(be->ops->alloc(be, (size_t)n * 4, &d, &err) == MS_OK);
    CHECK(be->ops->upload(be, d, h, (size_t)n * 4, &err) == MS_OK);
    return (float *)d;
}
static float *fget(ms_backend *be, const float *d, int64_t n) {
    ms_err err = {0};
    float *h = malloc((size_t)n * 4);
    CHECK(be->ops->download(be, h, d, (size_t)n * 4, &err) == MS_OK);
    return h;
}

/* qkv_attn_at (MS_GPU_QKV_ATTN=1: qkv_at's work in the decode attention kernel's prologue) on
 * backend F against qkv_at then attn_gqa on backend G (the default): the same inputs at positions
 * pos[0] (eager), pos[1] (recorded, launched) and pos[2] (replayed), q and k re-uploaded before
 * each; the output and both whole caches must be the same bits. */
static void fold_case(ms_backend *G, ms_backend *F, int64_t H, int64_t KV, int64_t hd, int rdim, int inter, double af,
                      int norm, int64_t window, int sinks, const int64_t pos[3]) {
    const int64_t vd = hd, ctx = 1024, kd = KV * hd, vt = KV * vd;
    ms_rope r;
    memset(&r, 0, sizeof r);
    r.dim = rdim, r.layout = inter ? MS_ROPE_INTERLEAVED : MS_ROPE_HALF, r.attn_factor = af;
    for (int i = 0; i < r.dim / 2; i++) r.inv_freq[i] = pow(1e6, -2.0 * i / r.dim);
    float *kc = randv(ctx * kd, 1.0f), *vc = randv(ctx * vt, 1.0f), *q0 = randv(H * hd, 1.0f);
    float *k0 = randv(kd, 1.0f), *v0 = randv(vt, 1.0f), *wq = randv(hd, 1.0f), *wk = randv(hd, 1.0f);
    float *sk = sinks ? randv(H, 2.0f) : NULL, *zo = calloc((size_t)(H * vd), 4);
    float *res[2][3][3]; /* backend, position, (out, k cache, v cache) */
    ms_backend *B[2] = {G, F};
    char nm[160];
    snprintf(nm, sizeof nm, "%lld/%lld heads of %lld, rope %d%s x %.2f, norm %d, window %lld, sinks %d",
             (long long)H, (long long)KV, (long long)hd, rdim, inter ? " interleaved" : "", af, norm,
             (long long)window, sinks);
    for (int b = 0; b < 2; b++) {
        ms_backend *X = B[b];
        ms_err err = {0};
        int64_t *dstep = NULL;
        CHECK(X->ops->alloc(X, 16, (void **)&dstep, &err) == MS_OK);
        float *dkc = fup(X, kc, ctx * kd), *dvc = fup(X, vc, ctx * vt), *dq = fup(X, q0, H * hd);
        float *dk = fup(X, k0, kd), *dv = fup(X, v0, vt), *dwq = fup(X, wq, hd), *dwk = fup(X, wk, hd);
        float *ds = sk ? fup(X, sk, H) : NULL, *dout = fup(X, zo, H * vd);
        ms_attn_gqa_args a = {.out = dout, .q = dq, .k = dkc, .v = dvc, .n = 1, .n_past = 1023, .H = H, .KV = KV,
                              .hd = hd, .vd = vd, .window = window, .sinks = ds, .scale = 1.0f / sqrtf((float)hd),
                              .pos_dev = dstep};
        void *graph = NULL;
        for (int i = 0; i < 3; i++) {
            int64_t hv[2] = {pos[i], 0};
            CHECK(X->ops->upload(X, dstep, hv, 16, &err) == MS_OK);
            CHECK(X->ops->upload(X, dq, q0, (size_t)(H * hd) * 4, &err) == MS_OK);
            CHECK(X->ops->upload(X, dk, k0, (size_t)kd * 4, &err) == MS_OK);
            if (i == 1) CHECK_MSG(X->ops->graph_begin(X, &err) == MS_OK, "%s", err.msg);
            if (i < 2) {
                if (b) {
                    int rc = X->ops->qkv_attn_at(X, &r, dq, dwq, dk, dwk, dv, norm, 1e-6f, &a, &err);
                    CHECK_MSG(rc == MS_OK, "qkv_attn_at (%s): %s", nm, err.msg);
                } else {
                    X->ops->qkv_at(X, &r, dq, H, dwq, dk, KV, dwk, dv, vd, dkc, dvc, hd, norm, 1e-6f, dstep);
                    CHECK_MSG(X->ops->attn_gqa(X, &a, &err) == MS_OK, "%s", err.msg);
                }
            }
            if (i == 1) {
                CHECK_MSG(X->ops->graph_end(X, &graph, &err) == MS_OK && graph, "%s", err.msg);
            }
            if (i > 0) CHECK_MSG(graph && X->ops->graph_launch(X, graph, &err) == MS_OK, "%s", err.msg);
            res[b][i][0] = fget(X, dout, H * vd), res[b][i][1] = fget(X, dkc, ctx * kd);
            res[b][i][2] = fget(X, dvc, ctx * vt);
        }
        X->ops->graph_free(X, graph);
        void *bufs[10] = {dkc, dvc, dq, dk, dv, dwq, dwk, ds, dout, dstep};
        for (int j = 0; j < 10; j++)
            if (bufs[j]) X->ops->free(X, bufs[j]);
    }
    const int64_t len[3] = {H * vd, ctx * kd, ctx * vt};
    const char *what[3] = {"output", "key cache", "value cache"};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            int64_t diff = 0;
            for (int64_t x = 0; x < len[j]; x++) diff += memcmp(&res[0][i][j][x], &res[1][i][j][x], 4) != 0;
            CHECK_MSG(diff == 0, "qkv_attn_at (%s) at %lld: %lld of %lld %s floats differ from qkv_at + attn_gqa", nm,
                      (long long)pos[i], (long long)diff, (long long)len[j], what[j]);
            if (j == 0)
                printf("  qkv_attn_at %s at %lld (%s): output %s\n", nm, (long long)pos[i],
                       i == 0 ? "eager" : i == 1 ? "recorded" : "replayed", diff ? "DIFFERS" : "bit-identical");
            free(res[0][i][j]), free(res[1][i][j]);
        }
    free(kc), free(vc), free(q0), free(k0), free(v0), free(wq), free(wk), free(sk), free(zo);
}

/* The fold of qkv_at into the attention (qkv_attn_at) on a backend opened with MS_GPU_QKV_ATTN=1,
 * against the two ops on one opened with MS_GPU_QKV_ATTN=0: Qwen3's shape (norm, half-split), a partial interleaved
 * rotation with an attention factor and no norm, a window with sinks, 12 query heads per KV head
 * (two head groups: two blocks write the token's cache rows), head dims 64 and 256, early and
 * late positions (empty splits, one split holding the token's key). Also: refused on a default
 * MS_GPU_QKV_ATTN=0 backend (MS_ERR_UNSUPPORTED, nothing run). */
TEST(backend_step_fold) {
    SKIP_UNLESS_SELECTED("backend_step_fold");
    ms_backend *G = NULL, *F = NULL;
    ms_err err = {0};
    setenv("MS_GPU_QKV_ATTN", "1", 1);
    int rc = ms_backend_gpu_create(0, &F, &err);
    setenv("MS_GPU_QKV_ATTN", "0", 1);
    if (!rc) rc = ms_backend_gpu_create(0, &G, &err);
    unsetenv("MS_GPU_QKV_ATTN");
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    if (rc) {
        if (F) F->ops->destroy(F);
        return;
    }
    {
        ms_rope r;
        memset(&r, 0, sizeof r);
        r.dim = 128, r.layout = MS_ROPE_HALF, r.attn_factor = 1.0;
        ms_attn_gqa_args a = {.n = 1, .H = 32, .KV = 4, .hd = 128, .vd = 128, .pos_dev = (const int64_t *)16};
        CHECK(G->ops->qkv_attn_at(G, &r, NULL, NULL, NULL, NULL, NULL, 1, 1e-6f, &a, &err) == MS_ERR_UNSUPPORTED);
    }
    const int64_t p1[3] = {700, 701, 900}, p2[3] = {3, 4, 255}, p3[3] = {0, 1, 1000};
    fold_case(G, F, 32, 4, 128, 128, 0, 1.0, 1, 0, 0, p1);
    fold_case(G, F, 32, 4, 128, 128, 0, 1.0, 1, 0, 0, p2);
    fold_case(G, F, 32, 4, 128, 64, 1, 1.1, 0, 0, 0, p1);
    fold_case(G, F, 64, 8, 64, 64, 0, 1.0, 1, 300, 1, p1);
    fold_case(G, F, 24, 2, 128, 128, 0, 1.0, 1, 0, 1, p3);
    fold_case(G, F, 16, 4, 256, 128, 1, 1.0, 1, 0, 0, p1);
    F->ops->destroy(F), G->ops->destroy(G);
}

/* Programmatic dependent launch (MS_GPU_PDL, gpu_port.h ms_launch) through whole decodes: a fixture
 * model (softmax router, top-k softmax with biases, sigmoid with a correction bias) decoded
 * greedily past a 256-token bucket (the step recorded twice, replayed between) on a backend with
 * the attribute and on one without: the same kernels in the same order, so the logits of every
 * step must be bit-identical (a kernel that read its predecessor's output before the wait would
 * show as a difference); the step must have stayed recorded (the programmatic edges captured). */
static int pdl_decode(ms_model *m, int pdl, int fold, int steps, float *out, int *recorded, uint64_t *edges,
                      uint64_t *prog, ms_err *err) {
    ms_backend *be = NULL;
    ms_engine *e = NULL;
    setenv("MS_GPU_PDL", pdl ? "1" : "0", 1);
    setenv("MS_GPU_QKV_ATTN", fold ? "1" : "0", 1); /* qkv_at in the attention's prologue (qkv_attn_at) or not */
    int rc = ms_backend_gpu_create(0, &be, err);
    unsetenv("MS_GPU_PDL"), unsetenv("MS_GPU_QKV_ATTN");
    ms_engine_opts o = {.max_ctx = steps + 16, .max_batch = 16, .backend = be};
    if (!rc) rc = ms_engine_create(m, &o, &e, err);
    int64_t V = m->cfg.vocab;
    int32_t ids[8];
    for (int i = 0; i < 8; i++) ids[i] = (int32_t)((i * 37 + 1) % V);
    if (!rc) rc = ms_engine_forward(e, ids, 8, out, 0, err);
    for (int s = 1; !rc && s <= steps; s++) {
        const float *prev = out + (int64_t)(s - 1) * V;
        int32_t t = 0;
        for (int64_t v = 1; v < V; v++)
            if (prev[v] > prev[t]) t = (int32_t)v;
        rc = ms_engine_forward(e, &t, 1, out + (int64_t)s * V, 0, err);
    }
    *recorded = e && !e->step_off && e->step_graph;
    *edges = *prog = 0;
    if (be) ms_backend_gpu_graph_edges(be, edges, prog);
    if (e) ms_engine_destroy(e);
    if (be) be->ops->destroy(be);
    return rc;
}
/* The same decode through ms_engine_decode_greedy (the pick on the device) on a backend opened with
 * MS_GPU_STEP_NEXT=1 (argmax_step: the pick writes the next token's step, no upload),
 * MS_GPU_QKV_ATTN=1 and MS_GPU_ARGMAX_BLOCKS=1: ids[s] for s = 1..steps (ids[0] the prompt's greedy
 * token, picked on the host
 * from the prefill's logits). Returns the status. */
static int greedy_decode(ms_model *m, int steps, int32_t *ids, ms_err *err) {
    ms_backend *be = NULL;
    ms_engine *e = NULL;
    setenv("MS_GPU_STEP_NEXT", "1", 1), setenv("MS_GPU_QKV_ATTN", "1", 1), setenv("MS_GPU_ARGMAX_BLOCKS", "1", 1);
    int rc = ms_backend_gpu_create(0, &be, err);
    unsetenv("MS_GPU_STEP_NEXT"), unsetenv("MS_GPU_QKV_ATTN"), unsetenv("MS_GPU_ARGMAX_BLOCKS");
    ms_engine_opts o = {.max_ctx = steps + 16, .max_batch = 16, .backend = be};
    if (!rc) rc = ms_engine_create(m, &o, &e, err);
    int64_t V = m->cfg.vocab;
    int32_t pr[8];
    for (int i = 0; i < 8; i++) pr[i] = (int32_t)((i * 37 + 1) % V);
    float *lg = malloc((size_t)V * 4);
    if (!rc) rc = ms_engine_forward(e, pr, 8, lg, 0, err);
    ids[0] = 0;
    for (int64_t v = 1; !rc && v < V; v++)
        if (lg[v] > lg[ids[0]]) ids[0] = (int32_t)v;
    for (int s = 1; !rc && s <= steps; s++) rc = ms_engine_decode_greedy(e, ids[s - 1], &ids[s], err);
    free(lg);
    if (e) ms_engine_destroy(e);
    if (be) be->ops->destroy(be);
    return rc;
}

TEST(backend_step_pdl) {
    SKIP_UNLESS_SELECTED("backend_step_pdl");
    const char *fx[3] = {"qwen3_moe", "gpt_oss", "glm4_moe"};
    const int steps = 264;
    for (int f = 0; f < 3; f++) {
        char dir[128];
        snprintf(dir, sizeof dir, "tests/data/fixtures/models/%s", fx[f]);
        ms_model m;
        ms_err err = {0};
        if (ms_model_load(dir, &m, &err)) {
            printf("  backend_step_pdl %s: skipped (%s)\n", fx[f], err.msg);
            continue;
        }
        int64_t n = (int64_t)(steps + 1) * m.cfg.vocab;
        float *on = calloc((size_t)n, 4), *off = calloc((size_t)n, 4);
        int rec_on = 0, rec_off = 0;
        uint64_t ed_on = 0, pe_on = 0, ed_off = 0, pe_off = 0;
        int rc1 = pdl_decode(&m, 1, 0, steps, on, &rec_on, &ed_on, &pe_on, &err);
        CHECK_MSG(rc1 == MS_OK, "%s with PDL: %s", fx[f], err.msg);
        int rc2 = pdl_decode(&m, 0, 0, steps, off, &rec_off, &ed_off, &pe_off, &err);
        CHECK_MSG(rc2 == MS_OK, "%s without PDL: %s", fx[f], err.msg);
        int64_t diff = 0;
        for (int64_t i = 0; i < n; i++) diff += memcmp(&on[i], &off[i], 4) != 0;
        { /* the same decode with qkv_at folded into the attention (MS_GPU_QKV_ATTN=1): the same bits, one
           * kernel fewer per layer in the recorded step */
            int rec_f = 0;
            uint64_t ed_f = 0, pe_f = 0;
            float *fo = calloc((size_t)n, 4);
            int rc3 = pdl_decode(&m, 1, 1, steps, fo, &rec_f, &ed_f, &pe_f, &err);
            CHECK_MSG(rc3 == MS_OK, "%s folded: %s", fx[f], err.msg);
            int64_t d3 = 0;
            for (int64_t i = 0; i < n; i++) d3 += memcmp(&on[i], &fo[i], 4) != 0;
            free(fo);
            printf("  backend_step_pdl %s folded (MS_GPU_QKV_ATTN=1): %lld of %lld logits differ, step recorded %d, "
                   "graph edges %llu (%llu programmatic)\n",
                   fx[f], (long long)d3, (long long)n, rec_f, (unsigned long long)ed_f, (unsigned long long)pe_f);
            CHECK_MSG(d3 == 0, "%s: %lld logits differ with qkv_at folded", fx[f], (long long)d3);
            CHECK_MSG(rec_f == rec_on, "%s: the folded step recorded %d, %d without", fx[f], rec_f, rec_on);
            CHECK_MSG(!rec_f || ed_f < ed_on, "%s: the folded step has %llu edges, not fewer than %llu", fx[f],
                      (unsigned long long)ed_f, (unsigned long long)ed_on);
        }
        { /* greedy ids picked on the device with the next step written by the pick (MS_GPU_STEP_NEXT=1)
           * = the host's picks from the logits above */
            int32_t *ids = calloc((size_t)steps + 1, 4);
            int rc4 = greedy_decode(&m, steps, ids, &err);
            CHECK_MSG(rc4 == MS_OK, "%s greedy (MS_GPU_STEP_NEXT=1): %s", fx[f], err.msg);
            int bad = 0;
            for (int st = 1; st <= steps && !rc4; st++) {
                const float *prev = on + (int64_t)(st - 1) * m.cfg.vocab;
                int32_t t = 0;
                for (int64_t v = 1; v < m.cfg.vocab; v++)
                    if (prev[v] > prev[t]) t = (int32_t)v;
                bad += t != ids[st - 1];
            }
            printf("  backend_step_pdl %s greedy on the device (STEP_NEXT, QKV_ATTN, ARGMAX_BLOCKS=1): %d of %d ids "
                   "differ from the host's picks\n", fx[f], bad, steps);
            CHECK_MSG(bad == 0, "%s: %d greedy ids differ with MS_GPU_STEP_NEXT=1", fx[f], bad);
            free(ids);
        }
        printf("  backend_step_pdl %s: %d steps, %lld of %lld logits differ, step recorded %d / %d (pdl / not), "
               "graph edges %llu (%llu programmatic) / %llu (%llu)\n",
               fx[f], steps, (long long)diff, (long long)n, rec_on, rec_off, (unsigned long long)ed_on,
               (unsigned long long)pe_on, (unsigned long long)ed_off, (unsigned long long)pe_off);
        CHECK_MSG(diff == 0, "%s: %lld logits differ with PDL", fx[f], (long long)diff);
        CHECK_MSG(pe_off == 0, "%s: %llu programmatic edges without PDL", fx[f], (unsigned long long)pe_off);
        CHECK_MSG(rec_on == rec_off && (f || rec_on), "%s: the decode step recorded %d with PDL, %d without", fx[f],
                  rec_on, rec_off);
        free(on), free(off);
        ms_model_free(&m);
    }
}

/* The replayable step of KDA and NoPE-MLA models (Kimi Linear: latent_at, attn_mla at pos_dev, the
 * KDA decode kernels recorded): whole greedy decodes of fixture models past a 256-token bucket with
 * the step and with MS_GPU_GRAPH=0 (every token eager). The step must record, the greedy ids must be
 * the same, and the logits agree: latent_at is the rmsnorm kernel's sums, the MLA splits are the
 * same up to 2048 keys (the bound adds empty ones), so they are expected bit-identical; the check
 * allows 1e-5 of the largest logit and prints how many differ. */
static int graph_decode(ms_model *m, int graph, int steps, float *out, int *recorded, ms_err *err) {
    ms_backend *be = NULL;
    ms_engine *e = NULL;
    if (!graph) setenv("MS_GPU_GRAPH", "0", 1);
    int rc = ms_backend_gpu_create(0, &be, err);
    unsetenv("MS_GPU_GRAPH");
    ms_engine_opts o = {.max_ctx = steps + 16, .max_batch = 16, .backend = be};
    if (!rc) rc = ms_engine_create(m, &o, &e, err);
    int64_t V = m->cfg.vocab;
    int32_t ids[8];
    for (int i = 0; i < 8; i++) ids[i] = (int32_t)((i * 37 + 1) % V);
    if (!rc) rc = ms_engine_forward(e, ids, 8, out, 0, err);
    for (int s = 1; !rc && s <= steps; s++) {
        const float *prev = out + (int64_t)(s - 1) * V;
        int32_t t = 0;
        for (int64_t v = 1; v < V; v++)
            if (prev[v] > prev[t]) t = (int32_t)v;
        rc = ms_engine_forward(e, &t, 1, out + (int64_t)s * V, 0, err);
    }
    *recorded = e && !e->step_off && e->step_graph;
    if (e) ms_engine_destroy(e);
    if (be) be->ops->destroy(be);
    return rc;
}
TEST(backend_step_linear) {
    SKIP_UNLESS_SELECTED("backend_step_linear");
    const char *fx[3] = {"tests/data/fixtures/models/kimi_linear", "tests/fixtures/extra/kimi_linear_mla_first",
                         "tests/data/fixtures/models/kimi_linear_fp8"};
    const int steps = 264;
    for (int f = 0; f < 3; f++) {
        ms_model m;
        ms_err err = {0};
        if (ms_model_load(fx[f], &m, &err)) {
            printf("  backend_step_linear %s: skipped (%s)\n", fx[f], err.msg);
            continue;
        }
        int64_t V = m.cfg.vocab, n = (int64_t)(steps + 1) * V;
        float *on = calloc((size_t)n, 4), *off = calloc((size_t)n, 4);
        int rec_on = 0, rec_off = 0;
        int rc1 = graph_decode(&m, 1, steps, on, &rec_on, &err);
        CHECK_MSG(rc1 == MS_OK, "%s with the step: %s", fx[f], err.msg);
        int rc2 = graph_decode(&m, 0, steps, off, &rec_off, &err);
        CHECK_MSG(rc2 == MS_OK, "%s without: %s", fx[f], err.msg);
        int64_t diff = 0, idiff = 0;
        double worst = 0, big = maxabs(off, n);
        for (int64_t i = 0; i < n; i++) {
            diff += memcmp(&on[i], &off[i], 4) != 0;
            double d = fabs((double)on[i] - off[i]);
            if (d > worst) worst = d;
        }
        for (int s = 0; s <= steps; s++) { /* the greedy ids */
            int32_t a = 0, b = 0;
            for (int64_t v = 1; v < V; v++) {
                if (on[s * V + v] > on[s * V + a]) a = (int32_t)v;
                if (off[s * V + v] > off[s * V + b]) b = (int32_t)v;
            }
            idiff += a != b;
        }
        printf("  backend_step_linear %s: %d steps, step recorded %d (off: %d), %lld of %lld logits differ (worst "
               "%.3g of %.3g), %lld ids differ\n",
               fx[f], steps, rec_on, rec_off, (long long)diff, (long long)n, worst, big, (long long)idiff);
        CHECK_MSG(rec_on && !rec_off, "%s: the decode step recorded %d with the graph, %d without", fx[f], rec_on,
                  rec_off);
        CHECK_MSG(idiff == 0 && worst <= 1e-5 * big, "%s: %lld ids differ, worst %g", fx[f], (long long)idiff, worst);
        free(on), free(off);
        ms_model_free(&m);
    }
}

TEST_GPU_RUNNER(test_gpu_run_step)
