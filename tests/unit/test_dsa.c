/* test_dsa.c — the DSA lightning indexer against a straightforward float64
 * implementation written from the transformers 5.17 reference math
 * (DeepseekV32Indexer, GlmMoeDsaIndexer, Glm5NextTextIndexer). */
#include <stdint.h>

#include "io/safetensors.h"
#include "ops/dsa.h"
#include "test.h"
#include "util/threadpool.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) { return ms_test_urand(&rng_state); }
static double nrand(void) { return sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand()); }
static void fill(float *x, int64_t n, double s) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(s * nrand());
}

/* ---------- float64 reference ---------- */

/* rope on the first R dims of v (D long) at position p; inv as transformers computes (float32 values) */
static void ref_rope(double *v, int R, int interleaved, double p, const float *inv) {
    int half = R / 2;
    double tmp[R > 0 ? R : 1];
    for (int i = 0; i < half; i++) {
        double a = (double)(float)((float)p * inv[i]); /* the reference forms the angle in float32 */
        double c = cos(a), s = sin(a);
        double x1 = interleaved ? v[2 * i] : v[i], x2 = interleaved ? v[2 * i + 1] : v[half + i];
        tmp[i] = x1 * c - x2 * s;
        tmp[half + i] = x2 * c + x1 * s;
    }
    for (int i = 0; i < R; i++) v[i] = tmp[i];
}

static void ref_layernorm(double *v, const float *x, int D, const float *w, const float *b, double eps) {
    double m = 0, var = 0;
    for (int i = 0; i < D; i++) m += x[i];
    m /= D;
    for (int i = 0; i < D; i++) var += (x[i] - m) * (x[i] - m);
    var /= D;
    for (int i = 0; i < D; i++) v[i] = (x[i] - m) / sqrt(var + eps) * (w ? w[i] : 1) + (b ? b[i] : 0);
}

typedef struct {
    int H, D, R, interleaved, topk, kpool, tail;
    int T;                 /* tokens */
    const float *q, *k, *w; /* raw: q [T, H*D], k [T, D] (pre-LayerNorm), w [T, H] */
    const float *lnw, *lnb, *gates, *ape;
    const float *inv;
} ref_in;

/* prepared keys/queries in double */
static void ref_prepare(const ref_in *in, double *K, double *Q) {
    for (int t = 0; t < in->T; t++) {
        ref_layernorm(K + (size_t)t * in->D, in->k + (size_t)t * in->D, in->D, in->lnw, in->lnb, 1e-6);
        if (in->kpool <= 1) ref_rope(K + (size_t)t * in->D, in->R, in->interleaved, t, in->inv);
        for (int h = 0; h < in->H; h++) {
            double *qh = Q + ((size_t)t * in->H + h) * in->D;
            for (int i = 0; i < in->D; i++) qh[i] = in->q[((size_t)t * in->H + h) * in->D + i];
            if (in->kpool <= 1) ref_rope(qh, in->R, in->interleaved, t, in->inv);
        }
    }
}

static double ref_score(const ref_in *in, const double *Q, int p, const double *key) {
    double s = 0;
    for (int h = 0; h < in->H; h++) {
        double d = 0;
        for (int i = 0; i < in->D; i++) d += Q[((size_t)p * in->H + h) * in->D + i] * key[i];
        d *= 1.0 / sqrt((double)in->D);
        if (d > 0) s += in->w[(size_t)p * in->H + h] / sqrt((double)in->H) * d;
    }
    return s;
}

static void ref_pools(const ref_in *in, const double *K, double *P) {
    int D = in->D, kp = in->kpool;
    for (int m = 0; m < in->T / kp; m++)
        for (int c = 0; c < D; c++) {
            double mx = -INFINITY, l[kp];
            for (int j = 0; j < kp; j++) {
                l[j] = (double)in->gates[((size_t)m * kp + j) * D + c] + in->ape[(size_t)j * D + c];
                if (l[j] > mx) mx = l[j];
            }
            double s = 0, a = 0;
            for (int j = 0; j < kp; j++) {
                double e = exp(l[j] - mx);
                s += e;
                a += e * K[((size_t)m * kp + j) * D + c];
            }
            P[(size_t)m * D + c] = a / s;
        }
}

/* candidates of query p ranked by (score desc, position asc); returns count; margin = gap at the cut */
static int ref_rank(const double *sc, int nc, int *order, int k, double *margin) {
    for (int i = 0; i < nc; i++) order[i] = i;
    for (int i = 1; i < nc; i++) { /* insertion sort: stable, so equal scores keep position order */
        int v = order[i], j = i - 1;
        while (j >= 0 && sc[order[j]] < sc[v]) {
            order[j + 1] = order[j];
            j--;
        }
        order[j + 1] = v;
    }
    if (margin) *margin = (k > 0 && k < nc) ? sc[order[k - 1]] - sc[order[k]] : INFINITY;
    return k < nc ? k : nc;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
static int cmp_int32(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

/* the reference selection row of query p (ascending) and the margin at the top-k cut */
static int ref_select(const ref_in *in, const double *K, const double *Q, const double *P, int p, int *row,
                      double *margin) {
    int nc = in->kpool > 1 ? (p + 1) / in->kpool : p + 1;
    double sc[nc > 0 ? nc : 1];
    int order[nc > 0 ? nc : 1];
    for (int t = 0; t < nc; t++) sc[t] = ref_score(in, Q, p, (in->kpool > 1 ? P : K) + (size_t)t * in->D);
    int want = in->kpool > 1 ? in->topk / in->kpool : in->topk;
    int k = ref_rank(sc, nc, order, want, margin);
    qsort(order, (size_t)k, sizeof(int), cmp_int);
    int n = 0;
    if (in->kpool > 1) {
        for (int i = 0; i < k; i++)
            for (int j = 0; j < in->kpool; j++) row[n++] = order[i] * in->kpool + j;
        if (in->tail)
            for (int t = p + 1 - (p + 1) % in->kpool; t <= p; t++) row[n++] = t;
    } else {
        for (int i = 0; i < k; i++) row[n++] = order[i];
    }
    return n;
}

/* ---------- runner: engine vs reference ---------- */

typedef struct {
    int checked, skipped;
} outcome;

static outcome run_case(const ref_in *in, ms_pool *pool, int incremental) {
    outcome o = {0, 0};
    ms_dsa_cfg cfg = {.n_heads = in->H, .head_dim = in->D, .rope_dims = in->R,
                      .rope_layout = in->interleaved ? MS_DSA_ROPE_INTERLEAVED : MS_DSA_ROPE_HALF,
                      .topk = in->topk, .kpool = in->kpool, .kpool_tail = in->tail, .ln_eps = 1e-6f};
    ms_err err = {0};
    int T = in->T, H = in->H, D = in->D, W = ms_dsa_row_width(&cfg);
    float *k = malloc(sizeof(float) * T * D), *q = malloc(sizeof(float) * T * H * D);
    float *cs = malloc(sizeof(float) * T * (in->R / 2 + 1)), *sn = malloc(sizeof(float) * T * (in->R / 2 + 1));
    int32_t *idx = malloc(sizeof(int32_t) * T * W), *cnt = malloc(sizeof(int32_t) * T);
    double *K = malloc(sizeof(double) * T * D), *Q = malloc(sizeof(double) * T * H * D);
    double *P = malloc(sizeof(double) * (T / (in->kpool > 1 ? in->kpool : 1) + 1) * D);
    memcpy(k, in->k, sizeof(float) * T * D);
    memcpy(q, in->q, sizeof(float) * T * H * D);
    ms_dsa_rope_table(cs, sn, in->inv, in->R / 2, 0, T, 1.0f);
    CHECK(ms_dsa_prepare_keys(&cfg, k, T, in->lnw, in->lnb, cs, sn, &err) == MS_OK);
    CHECK(ms_dsa_prepare_queries(&cfg, q, T, cs, sn, &err) == MS_OK);
    ref_prepare(in, K, Q);
    if (in->kpool > 1) ref_pools(in, K, P);
    double kerr = 0;
    for (int i = 0; i < T * D; i++) kerr = fmax(kerr, fabs(k[i] - K[i]));
    for (int i = 0; i < T * H * D; i++) kerr = fmax(kerr, fabs(q[i] - Q[i]));
    CHECK_MSG(kerr < 2e-5, "prepared q/k differ from float64 by %g", kerr);

    ms_dsa_cache c;
    CHECK(ms_dsa_cache_init(&c, &cfg, in->ape, incremental ? 0 : T, &err) == MS_OK);
    if (incremental) { /* decode: one token at a time, each query right after its key */
        for (int t = 0; t < T; t++) {
            CHECK(ms_dsa_cache_append(&c, k + (size_t)t * D, in->gates ? in->gates + (size_t)t * D : NULL, 1, &err) ==
                  MS_OK);
            CHECK(ms_dsa_select(pool, &cfg, &c, q + (size_t)t * H * D, in->w + (size_t)t * H, 1, t, 0,
                                idx + (size_t)t * W, cnt + t, NULL, &err) == MS_OK);
        }
    } else {
        CHECK(ms_dsa_cache_append(&c, k, in->gates, T, &err) == MS_OK);
        CHECK(ms_dsa_select(pool, &cfg, &c, q, in->w, T, 0, 0, idx, cnt, NULL, &err) == MS_OK);
    }
    /* scores */
    double serr = 0;
    float sc[T + 1];
    for (int p = 0; p < T; p++) {
        int64_t nc = ms_dsa_scores(&cfg, &c, q + (size_t)p * H * D, in->w + (size_t)p * H, p, sc, T + 1, &err);
        CHECK(nc == (in->kpool > 1 ? (p + 1) / in->kpool : p + 1));
        for (int64_t t = 0; t < nc; t++)
            serr = fmax(serr, fabs(sc[t] - ref_score(in, Q, p, (in->kpool > 1 ? P : K) + (size_t)t * D)));
    }
    CHECK_MSG(serr < 1e-5, "index scores differ from float64 by %g", serr);
    /* selections */
    int row[W + 1];
    for (int p = 0; p < T; p++) {
        double margin;
        int n = ref_select(in, K, Q, P, p, row, &margin);
        if (margin < 1e-4) { /* near-ties: float32 may order them differently; exact ties: tested on torch's data */
            o.skipped++;
            continue;
        }
        o.checked++;
        int same = cnt[p] == n;
        for (int i = 0; same && i < n; i++) same = idx[(size_t)p * W + i] == row[i];
        for (int i = n; same && i < W; i++) same = idx[(size_t)p * W + i] == -1;
        CHECK_MSG(same, "query %d: selection differs from the reference (count %d vs %d)", p, cnt[p], n);
    }
    ms_dsa_cache_free(&c);
    free(k), free(q), free(cs), free(sn), free(idx), free(cnt), free(K), free(Q), free(P);
    return o;
}

typedef struct {
    float *q, *k, *w, *lnw, *lnb, *gates, *ape, inv[64];
} bufs;

static ref_in make_case(bufs *b, int T, int H, int D, int R, int inter, int topk, int kpool, int tail) {
    b->q = malloc(sizeof(float) * T * H * D);
    b->k = malloc(sizeof(float) * T * D);
    b->w = malloc(sizeof(float) * T * H);
    b->lnw = malloc(sizeof(float) * D);
    b->lnb = malloc(sizeof(float) * D);
    b->gates = malloc(sizeof(float) * T * D);
    b->ape = malloc(sizeof(float) * (kpool > 1 ? kpool : 1) * D);
    fill(b->q, (int64_t)T * H * D, 1.0);
    fill(b->k, (int64_t)T * D, 1.0);
    fill(b->w, (int64_t)T * H, 1.0);
    for (int i = 0; i < D; i++) b->lnw[i] = (float)(1 + 0.1 * nrand()), b->lnb[i] = (float)(0.1 * nrand());
    fill(b->gates, (int64_t)T * D, 1.0);
    fill(b->ape, (int64_t)(kpool > 1 ? kpool : 1) * D, 0.5);
    if (R > 0) ms_dsa_rope_inv_freq(b->inv, R, 10000.0, NULL);
    return (ref_in){.H = H, .D = D, .R = R, .interleaved = inter, .topk = topk, .kpool = kpool, .tail = tail, .T = T,
                    .q = b->q, .k = b->k, .w = b->w, .lnw = b->lnw, .lnb = b->lnb,
                    .gates = kpool > 1 ? b->gates : NULL, .ape = kpool > 1 ? b->ape : NULL, .inv = b->inv};
}
static void free_case(bufs *b) { free(b->q), free(b->k), free(b->w), free(b->lnw), free(b->lnb), free(b->gates), free(b->ape); }

TEST(rope_matches_reference_layouts) {
    /* check the rotation itself on known pairs: half split pairs (i, i+R/2), interleaved (2i, 2i+1) */
    float inv[4];
    CHECK(ms_dsa_rope_inv_freq(inv, 8, 10000.0, NULL) == MS_OK);
    CHECK_NEAR(inv[0], 1.0, 0);
    CHECK_NEAR(inv[1], 0.1, 1e-7);
    CHECK_NEAR(inv[3], 0.001, 1e-9);
    for (int inter = 0; inter < 2; inter++) {
        float x[12], cs[4], sn[4];
        double r[12];
        for (int i = 0; i < 12; i++) x[i] = (float)nrand(), r[i] = x[i];
        ms_dsa_rope_table(cs, sn, inv, 4, 37, 1, 1.0f);
        ms_dsa_rope(x, 1, 12, 1, 8, inter ? MS_DSA_ROPE_INTERLEAVED : MS_DSA_ROPE_HALF, cs, sn);
        ref_rope(r, 8, inter, 37, inv);
        for (int i = 0; i < 12; i++) CHECK_NEAR(x[i], r[i], 1e-6);
    }
}

TEST(indexer_matches_float64_prefill_and_decode) {
    struct { int T, H, D, R, inter, topk; } cases[] = {
        {40, 4, 16, 8, 0, 8},   /* the deepseek_v32 fixture's shape, half-split rope */
        {40, 4, 16, 8, 1, 8},   /* glm_moe_dsa: interleaved rope */
        {300, 3, 32, 16, 0, 17},
        {64, 2, 8, 0, 0, 5},    /* no rope */
        {10, 4, 16, 8, 0, 64},  /* context never longer than top-k: dense */
        {33, 1, 4, 4, 1, 1},
    };
    ms_pool *pool = ms_pool_create(2);
    int checked = 0, skipped = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        bufs b;
        ref_in in = make_case(&b, cases[ci].T, cases[ci].H, cases[ci].D, cases[ci].R, cases[ci].inter, cases[ci].topk,
                              0, 0);
        for (int inc = 0; inc < 2; inc++) {
            outcome o = run_case(&in, inc ? pool : NULL, inc);
            checked += o.checked, skipped += o.skipped;
        }
        free_case(&b);
    }
    CHECK_MSG(skipped * 4 < checked, "too many (near-)ties skipped: %d of %d", skipped, checked + skipped);
    ms_pool_destroy(pool);
}

TEST(kpool_indexer_matches_float64) {
    struct { int T, H, D, topk, kpool, tail; } cases[] = {
        {40, 4, 16, 8, 4, 1}, /* the glm5_next fixture's shape */
        {40, 4, 16, 8, 4, 0},
        {101, 2, 8, 12, 3, 1},
        {50, 2, 8, 3, 4, 1},  /* topk < kpool: only the tail */
        {7, 2, 8, 8, 4, 1},
    };
    ms_pool *pool = ms_pool_create(2);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        bufs b;
        ref_in in = make_case(&b, cases[ci].T, cases[ci].H, cases[ci].D, 0, 0, cases[ci].topk, cases[ci].kpool,
                              cases[ci].tail);
        for (int inc = 0; inc < 2; inc++) run_case(&in, inc ? pool : NULL, inc);
        free_case(&b);
    }
    ms_pool_destroy(pool);
}

/* Exact ties: torch.topk's own choices (tools/gen_topk_ties.py, torch 2.11 CPU)
 * over causal score rows full of equal values, both of its algorithms. */
TEST(topk_ties_match_torch) {
    ms_checkpoint ck;
    ms_err err = {0};
    int rc = ms_checkpoint_open("tests/data/topk_ties.safetensors", &ck, &err);
    CHECK_MSG(rc == MS_OK, "%s", err.msg);
    if (rc) return;
    const ms_tensor *codes = ms_checkpoint_find(&ck, "codes"), *off = ms_checkpoint_find(&ck, "offsets");
    const ms_tensor *fl = ms_checkpoint_find(&ck, "fwd_len"), *va = ms_checkpoint_find(&ck, "valid");
    const ms_tensor *kt = ms_checkpoint_find(&ck, "k"), *tt = ms_checkpoint_find(&ck, "torch_topk");
    CHECK(codes && off && fl && va && kt && tt && tt->ndim == 2);
    if (!(codes && off && fl && va && kt && tt)) return;
    int rows = (int)fl->nelem, maxk = (int)tt->shape[1];
    const uint8_t *cd = codes->data;
    const int64_t *of = off->data;
    const int32_t *F = fl->data, *V = va->data, *K = kt->data, *S = tt->data;
    int bad = 0, partial = 0, nth = 0, amb = 0;
    for (int r = 0; r < rows; r++) {
        int T = F[r], nv = V[r], k = K[r];
        float sc[nv];
        for (int i = 0; i < nv; i++) sc[i] = cd[of[r] + i] * 0.5f;
        ms_dsa_qel work[T];
        int32_t out[k + 1], want[k + 1];
        uint8_t a = 0;
        int64_t n = ms_dsa_topk(sc, nv, T, k, work, out, &a);
        int m = 0;
        for (int i = 0; i < k && i < maxk; i++)
            if (S[(size_t)r * maxk + i] < nv) want[m++] = S[(size_t)r * maxk + i];
        qsort(want, (size_t)m, sizeof(int32_t), cmp_int32);
        int same = n == m;
        for (int i = 0; same && i < m; i++) same = out[i] == want[i];
        if (!same) bad++;
        if ((int64_t)k * 64 <= T) partial++;
        else nth++;
        amb += a;
    }
    CHECK_MSG(bad == 0, "%d of %d rows keep other tied positions than torch", bad, rows);
    CHECK_MSG(partial > 20 && nth > 200 && amb > 100, "coverage: %d partial_sort rows, %d nth_element rows, %d ambiguous",
              partial, nth, amb);
    ms_checkpoint_close(&ck);
}

/* The same query keeps different tied keys in a longer forward (the reference
 * recomputes with the full length), and the row says so. */
TEST(ambiguous_rows_are_flagged) {
    float sc[12] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
    ms_dsa_qel work[200];
    int32_t out[8];
    uint8_t amb = 0;
    CHECK(ms_dsa_topk(sc, 12, 12, 4, work, out, &amb) == 4);
    CHECK(amb == 1);
    int differs = 0;
    for (int T = 13; T < 200; T++) {
        int32_t o2[8];
        CHECK(ms_dsa_topk(sc, 12, T, 4, work, o2, NULL) == 4);
        differs |= memcmp(out, o2, sizeof out[0] * 4) != 0;
    }
    CHECK(differs); /* torch's choice among the zeros moves with T */
    float clear[6] = {3, 1, 4, 1.5f, 5, 9};
    CHECK(ms_dsa_topk(clear, 6, 6, 3, work, out, &amb) == 3);
    CHECK(amb == 0 && out[0] == 2 && out[1] == 4 && out[2] == 5);
    CHECK(ms_dsa_topk(clear, 6, 100, 3, work, out, &amb) == 3);
    CHECK(amb == 0 && out[0] == 2 && out[1] == 4 && out[2] == 5);
    CHECK(ms_dsa_topk(clear, 2, 100, 3, work, out, &amb) == 2); /* fewer valid than k */
    CHECK(amb == 0 && out[0] == 0 && out[1] == 1);
}

TEST(dense_while_context_fits_topk) {
    int T = 12, H = 2, D = 8, topk = 12;
    bufs b;
    ref_in in = make_case(&b, T, H, D, 4, 0, topk, 0, 0);
    (void)in;
    ms_dsa_cfg cfg = {.n_heads = H, .head_dim = D, .rope_dims = 4, .topk = topk, .ln_eps = 1e-6f};
    ms_dsa_cache c;
    ms_err err = {0};
    CHECK(ms_dsa_cache_init(&c, &cfg, NULL, 4, &err) == MS_OK);
    CHECK(ms_dsa_cache_append(&c, b.k, NULL, T, &err) == MS_OK);
    int32_t idx[T * topk], cnt[T];
    CHECK(ms_dsa_select(NULL, &cfg, &c, b.q, b.w, T, 0, 0, idx, cnt, NULL, &err) == MS_OK);
    int ok = 1;
    for (int p = 0; p < T; p++) {
        ok &= cnt[p] == p + 1;
        for (int i = 0; i <= p; i++) ok &= idx[p * topk + i] == i;
        for (int i = p + 1; i < topk; i++) ok &= idx[p * topk + i] == -1;
    }
    CHECK(ok);
    /* selecting beyond the cache is refused */
    CHECK(ms_dsa_select(NULL, &cfg, &c, b.q, b.w, 2, T - 1, 0, idx, cnt, NULL, &err) == MS_ERR_ARG);
    CHECK(ms_dsa_select(NULL, &cfg, &c, b.q, b.w, 2, 3, 4, idx, cnt, NULL, &err) == MS_ERR_ARG); /* fwd_len < end */
    /* truncate then re-append reproduces the same state */
    CHECK(ms_dsa_cache_truncate(&c, 5, &err) == MS_OK);
    CHECK(c.len == 5);
    CHECK(ms_dsa_cache_truncate(&c, 6, &err) == MS_ERR_ARG);
    ms_dsa_cache_free(&c);
    free_case(&b);
}

TEST(kpool_truncate_recomputes_pools) {
    int T = 30, H = 2, D = 8;
    bufs b;
    ref_in in = make_case(&b, T, H, D, 0, 0, 8, 4, 1);
    ms_dsa_cfg cfg = {.n_heads = H, .head_dim = D, .topk = 8, .kpool = 4, .kpool_tail = 1, .ln_eps = 1e-6f};
    ms_dsa_cache c1, c2;
    ms_err err = {0};
    CHECK(ms_dsa_cache_init(&c1, &cfg, b.ape, 0, &err) == MS_OK);
    CHECK(ms_dsa_cache_init(&c2, &cfg, b.ape, 0, &err) == MS_OK);
    CHECK(ms_dsa_cache_append(&c1, b.k, b.gates, T, &err) == MS_OK);
    /* c2: wrong tokens 10.. first, then rolled back and replaced */
    CHECK(ms_dsa_cache_append(&c2, b.k, b.gates, 10, &err) == MS_OK);
    CHECK(ms_dsa_cache_append(&c2, b.q, b.q, 7, &err) == MS_OK);
    CHECK(ms_dsa_cache_truncate(&c2, 10, &err) == MS_OK);
    CHECK(ms_dsa_cache_append(&c2, b.k + 10 * D, b.gates + 10 * D, T - 10, &err) == MS_OK);
    CHECK(memcmp(c1.pooled, c2.pooled, sizeof(float) * (T / 4) * D) == 0);
    CHECK(ms_dsa_cache_append(&c2, b.k, NULL, 1, &err) == MS_ERR_ARG); /* KPool needs gates */
    ms_dsa_cache_free(&c1);
    ms_dsa_cache_free(&c2);
    (void)in;
    free_case(&b);
}

TEST(mask_row_and_config_checks) {
    float row[6];
    int32_t idx[3] = {0, 2, 5};
    ms_err err = {0};
    CHECK(ms_dsa_mask_row(idx, 3, 6, row, &err) == MS_OK);
    CHECK(row[0] == 0 && row[2] == 0 && row[5] == 0 && isinf(row[1]) && row[1] < 0 && isinf(row[3]) && isinf(row[4]));
    CHECK(ms_dsa_mask_row(idx, 3, 5, row, &err) == MS_ERR_ARG);
    ms_dsa_cfg cfg = {.n_heads = 4, .head_dim = 16, .rope_dims = 7, .topk = 8, .ln_eps = 1e-6f};
    CHECK(ms_dsa_cfg_check(&cfg, &err) == MS_ERR_ARG);
    CHECK(strstr(err.msg, "rope") != NULL);
    cfg.rope_dims = 8;
    CHECK(ms_dsa_cfg_check(&cfg, &err) == MS_OK);
    cfg.kpool = 4;
    CHECK(ms_dsa_cfg_check(&cfg, &err) == MS_ERR_ARG); /* KPool has no rope */
    cfg.rope_dims = 0;
    cfg.kpool_tail = 1;
    CHECK(ms_dsa_row_width(&cfg) == 11);
    cfg.topk = 0;
    CHECK(ms_dsa_cfg_check(&cfg, &err) == MS_ERR_ARG);
}

TEST(share_plan) {
    ms_err err = {0};
    int src[6];
    int glm[6] = {1, 2, 2, 1, 2, 1}; /* GLM-MoE-DSA chains shared layers to the nearest full one */
    CHECK(ms_dsa_share_plan(glm, 6, 1, src, &err) == MS_OK);
    CHECK(src[0] == 0 && src[1] == 0 && src[2] == 0 && src[3] == 3 && src[4] == 3 && src[5] == 5);
    CHECK(ms_dsa_share_plan(glm, 6, 0, src, &err) == MS_ERR_UNSUPPORTED); /* GLM-5-Next: S after S raises */
    int next[6] = {0, 0, 1, 2, 0, 1};
    CHECK(ms_dsa_share_plan(next, 6, 0, src, &err) == MS_OK);
    CHECK(src[0] == -1 && src[2] == 2 && src[3] == 2 && src[4] == -1 && src[5] == 5);
    int bad[3] = {0, 2, 1};
    CHECK(ms_dsa_share_plan(bad, 3, 1, src, &err) == MS_ERR_UNSUPPORTED);
    int first[2] = {2, 1};
    CHECK(ms_dsa_share_plan(first, 2, 1, src, &err) == MS_ERR_UNSUPPORTED);
}

TEST_MAIN()
