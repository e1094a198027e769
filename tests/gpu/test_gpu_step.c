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
        int32_t *dpick = NULL;
        CHECK(G->ops->alloc(G, 4, (void **)&dpick, &err) == MS_OK);
        int64_t ns[7] = {151936, 151936, 151936, 151936, 129280, 1, 1500};
        for (int f = 0; f < 7; f++) {
            int64_t n = ns[f];
            float *x = randv(n, 3.0f);
            if (f == 1 || f == 6) for (int64_t i = 0; i < n; i++) x[i] = roundf(x[i]); /* many ties */
            if (f == 2) for (int64_t i = 0; i < n; i += 7) x[i] = NAN;
            if (f == 3) x[0] = NAN;
            if (f == 4) for (int64_t i = 0; i < n; i++) x[i] = -INFINITY;
            int64_t best = 0;
            for (int64_t v = 0; v < n; v++)
                if (x[v] > x[best]) best = v;
            float *dx = bup(x, n);
            G->ops->argmax(G, dx, n, dpick);
            int32_t got1 = -1;
            CHECK(G->ops->download(G, &got1, dpick, 4, &err) == MS_OK);
            CHECK_MSG(got1 == best, "argmax case %d (n %lld): %d, the host loop %lld", f, (long long)n, got1,
                      (long long)best);
            printf("  backend argmax case %d (n %lld): %d %s\n", f, (long long)n, got1, got1 == best ? "ok" : "WRONG");
            gfree(dx), free(x);
        }
        gfree(dpick);
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

/* Programmatic dependent launch (MS_GPU_PDL, gpu_port.h ms_launch) through whole decodes: a fixture
 * model (softmax router, top-k softmax with biases, sigmoid with a correction bias) decoded
 * greedily past a 256-token bucket (the step recorded twice, replayed between) on a backend with
 * the attribute and on one without: the same kernels in the same order, so the logits of every
 * step must be bit-identical (a kernel that read its predecessor's output before the wait would
 * show as a difference); the step must have stayed recorded (the programmatic edges captured). */
static int pdl_decode(ms_model *m, int pdl, int steps, float *out, int *recorded, uint64_t *edges, uint64_t *prog,
                      ms_err *err) {
    ms_backend *be = NULL;
    ms_engine *e = NULL;
    setenv("MS_GPU_PDL", pdl ? "1" : "0", 1);
    int rc = ms_backend_gpu_create(0, &be, err);
    unsetenv("MS_GPU_PDL");
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
        int rc1 = pdl_decode(&m, 1, steps, on, &rec_on, &ed_on, &pe_on, &err);
        CHECK_MSG(rc1 == MS_OK, "%s with PDL: %s", fx[f], err.msg);
        int rc2 = pdl_decode(&m, 0, steps, off, &rec_off, &ed_off, &pe_off, &err);
        CHECK_MSG(rc2 == MS_OK, "%s without PDL: %s", fx[f], err.msg);
        int64_t diff = 0;
        for (int64_t i = 0; i < n; i++) diff += memcmp(&on[i], &off[i], 4) != 0;
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
