/* test_int4_asym.c — compressed-tensors INT4 (pack-quantized; core/qmat.h I4), symmetric as
 * Kimi K2-Thinking / K2.5 publish and asymmetric (symmetric: false, weight_zero_point).
 *
 * The reference is this file's own float64 dequantization, written from compressed-tensors'
 * format (pack_to_int32 / unpack_from_int32: nibble i of an int32 word is bits 4i..4i+3,
 * stored as value + 8; weights packed along the columns, zero points along the rows;
 * value = (q - z) * scale, z = 0 when symmetric), sharing no code with the kernels or ms_qmat_row:
 *  - every CPU dispatch path (scalar, AVX2, AVX-512 where present; F32 activations against
 *    it and against the scalar path, Q8 activations against it on the activations rounded
 *    as ms_qk_quant's contract says), decode and prefill, odd shapes, rows not a
 *    multiple of 8 (a zero-point word's padding rows);
 *  - synth models (synth --expert-dtype int4 / int4-asym) on a DeepSeek-V3 (what Kimi K2 is)
 *    and a Kimi Linear architecture against the same model with every expert matrix replaced
 *    by its reference dequantization in F32 (one table of cases);
 *  - the config parse (Kimi K2-Thinking's quantization_config, symmetric false accepted, each
 *    refusal naming its key: one table) and the binding.
 * Streamed vs resident bit-identity is in test_streaming_engine.c. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "backend/cpu/cpu.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/synth.h"
#include "ops/ops.h"
#include "test.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) { return (uint32_t)(ms_test_xorshift(&g_rng) >> 16); }
static double frand(void) { return (rnd() & 0xffffff) / 16777216.0 * 2.0 - 1.0; }

/* The scale of row r, group g (BF16 widened by its bits, or F32). */
static double ref_scale(const ms_qmat *w, int64_t r, int64_t g) {
    const int64_t ng = (w->cols + w->bcol - 1) / w->bcol;
    if (w->scale_dtype == MS_DT_F32) return ((const float *)w->scale)[r * ng + g];
    uint32_t bits = (uint32_t)((const uint16_t *)w->scale)[r * ng + g] << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* The reference value of row r, column c: compressed-tensors' unpack of both tensors. */
static double ref_value(const ms_qmat *w, int64_t r, int64_t c) {
    const int64_t ng = (w->cols + w->bcol - 1) / w->bcol, g = c / w->bcol;
    const uint32_t *wp = (const uint32_t *)w->data; /* [rows, cols / 8] */
    int q = (int)((wp[r * (w->cols / 8) + c / 8] >> (4 * (c % 8))) & 15u) - 8;
    int z = 0; /* symmetric: zero point 0 */
    if (w->zero) {
        const uint32_t *zp = (const uint32_t *)w->zero; /* [ceil(rows / 8), ng] */
        z = (int)((zp[(r / 8) * ng + g] >> (4 * (r % 8))) & 15u) - 8;
    }
    return (double)(q - z) * ref_scale(w, r, g);
}

/* The Q8 activation path's rounding of x (backend/cpu/qkern.h ms_qk_quant's contract): per
 * block of 32, d = amax / 127, q = round-half-even(x * (127 / amax)); xq = q * d. */
static void q8_round(const float *x, int64_t n, float *xq) {
    for (int64_t b = 0; b < n; b += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fabsf(x[b + j]) > amax ? fabsf(x[b + j]) : amax;
        float id = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
        for (int j = 0; j < 32; j++) xq[b + j] = (float)nearbyint(x[b + j] * id) * d;
    }
}

/* A random asymmetric I4 matrix (scales BF16 or F32, group bcol); one allocation. */
static void *make_w(int64_t rows, int64_t cols, int bcol, ms_dtype sdt, ms_qmat *w) {
    int64_t ng = (cols + bcol - 1) / bcol, nzr = (rows + 7) / 8;
    size_t pk = (size_t)(rows * cols / 2), sb = (size_t)(rows * ng) * 4, zb = (size_t)(nzr * ng) * 4;
    uint8_t *m = calloc(1, pk + sb + zb);
    uint32_t *p = (uint32_t *)m, *z = (uint32_t *)(m + pk + sb);
    for (int64_t i = 0; i < rows * cols / 8; i++) p[i] = (uint32_t)rnd() << 16 | rnd();
    for (int64_t i = 0; i < rows * ng; i++) {
        float s = (float)(0.01 + 0.05 * fabs(frand()));
        if (sdt == MS_DT_F32) ((float *)(m + pk))[i] = s;
        else ((uint16_t *)(m + pk))[i] = ms_f32_to_bf16(s);
    }
    for (int64_t zr = 0; zr < nzr; zr++) /* the zero points of rows past `rows` stay 0 (pack_to_int32's padding) */
        for (int64_t g = 0; g < ng; g++)
            for (int i = 0; i < 8 && zr * 8 + i < rows; i++) z[zr * ng + g] |= (rnd() & 15u) << (4 * i);
    *w = (ms_qmat){.dtype = MS_DT_I4, .rows = rows, .cols = cols, .data = m, .scale_dtype = sdt, .scale = m + pk,
                   .brow = 1, .bcol = bcol, .zero = z};
    return m;
}

static ms_pool *pool_of(int isa, int q8) {
    static ms_pool *pools[8][2];
    if (!pools[isa][q8]) {
        pools[isa][q8] = ms_pool_create(2);
        CHECK(ms_cpu_set_isa(pools[isa][q8], (ms_cpu_isa)isa, NULL) == MS_OK);
        if (q8) CHECK(ms_cpu_set_activations(pools[isa][q8], MS_ACT_Q8, NULL) == MS_OK);
    }
    return pools[isa][q8];
}

static void run_case(int64_t rows, int64_t cols, int bcol, ms_dtype sdt, int n) {
    ms_qmat w;
    void *mem = make_w(rows, cols, bcol, sdt, &w);
    float *x = malloc(sizeof(float) * (size_t)(n * cols)), *y = malloc(sizeof(float) * (size_t)(n * rows));
    float *ys = malloc(sizeof(float) * (size_t)(n * rows));
    double *ref = malloc(sizeof(double) * (size_t)(n * rows)), *mag = malloc(sizeof(double) * (size_t)(n * rows));
    double *refq = malloc(sizeof(double) * (size_t)(n * rows)), *magq = malloc(sizeof(double) * (size_t)(n * rows));
    float *xq = malloc(sizeof(float) * (size_t)(n * cols));
    for (int64_t i = 0; i < n * cols; i++) x[i] = (float)(frand() * 3);
    /* the Q8 path takes BF16-scaled groups of a multiple of 32 (qkern.h ms_qk_ok); others run in F32 */
    if (cols % 32 == 0 && bcol % 32 == 0 && sdt == MS_DT_BF16) q8_round(x, n * cols, xq);
    else memcpy(xq, x, sizeof(float) * (size_t)(n * cols));
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double a = 0, m = 0, aq = 0, mq = 0;
            for (int64_t c = 0; c < cols; c++) {
                double wv = ref_value(&w, r, c), v = wv * x[t * cols + c];
                a += v, m += fabs(v);
                aq += wv * xq[t * cols + c];
                /* the integer path sums u * q and uz * q apart (each up to 15 steps of the scale) */
                mq += 16 * ref_scale(&w, r, c / w.bcol) * fabs((double)xq[t * cols + c]);
            }
            ref[t * rows + r] = a, mag[t * rows + r] = m, refq[t * rows + r] = aq, magq[t * rows + r] = mq;
        }
    ms_matmul(pool_of(MS_ISA_SCALAR, 0), ys, x, n, &w);
    for (int isa = 0; isa <= MS_ISA_AVX512_VNNI; isa++) {
        if (!ms_cpu_isa_supported((ms_cpu_isa)isa)) continue;
        for (int q8 = 0; q8 < 2; q8++) {
            ms_matmul(pool_of(isa, q8), y, x, n, &w);
            int bad = 0;
            for (int64_t i = 0; i < n * rows && bad < 3; i++) {
                double tol = 2e-6 * mag[i] + 1e-30;
                /* Q8 activations: against the reference on the rounded activations */
                if (q8 ? !(fabs(y[i] - refq[i]) <= 2e-6 * magq[i] + 1e-30)
                       : (!(fabs(y[i] - ref[i]) <= tol) || !(fabs((double)y[i] - ys[i]) <= 2 * tol))) {
                    bad++;
                    CHECK_MSG(0, "isa %s q8 %d rows %lld cols %lld group %d %s n %d: y[%lld] %.9g, ref %.9g (q8 %.9g), scalar %.9g",
                              ms_cpu_isa_name((ms_cpu_isa)isa), q8, (long long)rows, (long long)cols, bcol,
                              ms_dtype_name(sdt), n, (long long)i, y[i], ref[i], refq[i], ys[i]);
                }
            }
            if (!bad) CHECK(1);
        }
    }
    free(x), free(y), free(ys), free(ref), free(mag), free(refq), free(magq), free(xq), free(mem);
}

/* Every dispatch path: BF16 scales (the SIMD kernels), F32 scales (scalar dequantization). */
TEST(matmul_i4_zero_point_all_isas) {
    static const int64_t rows_l[] = {1, 7, 8, 44, 130};
    static const int64_t cols_l[] = {32, 96, 256, 1024};
    static const int n_l[] = {1, 3, 17};
    for (int gi = 0; gi < 2; gi++)
        for (size_t ri = 0; ri < 5; ri++)
            for (size_t ci = 0; ci < 4; ci++)
                for (size_t ni = 0; ni < 3; ni++) {
                    int bcol = gi ? 128 : 32;
                    if (cols_l[ci] % bcol) continue;
                    run_case(rows_l[ri], cols_l[ci], bcol, MS_DT_BF16, n_l[ni]);
                }
    run_case(44, 96, 32, MS_DT_F32, 3);
    run_case(9, 40, 8, MS_DT_BF16, 2); /* a group the SIMD kernels do not take */
}

/* ms_qmat_row and row views honour the zero points; a view must start at a zero-point word. */
TEST(qmat_i4_zero_point_rows) {
    ms_qmat w, v;
    void *mem = make_w(20, 64, 32, MS_DT_BF16, &w);
    float row[64];
    int bad = 0;
    for (int64_t r = 0; r < 20; r++) {
        ms_qmat_row(&w, r, row);
        for (int c = 0; c < 64; c++) bad += (double)row[c] != ref_value(&w, r, c);
    }
    CHECK_MSG(bad == 0, "%d values differ from the reference", bad);
    CHECK(ms_qmat_row_range(&w, 3, 4, &v) == 0);
    CHECK(ms_qmat_row_range(&w, 8, 12, &v) == 1);
    ms_qmat_row(&v, 5, row);
    for (int c = 0; c < 64; c++) bad += (double)row[c] != ref_value(&w, 13, c);
    CHECK(bad == 0);
    /* bytes: packed + scales + zero-point words */
    CHECK(ms_qmat_bytes(&w) == 20 * 64 / 2 + 20 * 2 * 2 + 3 * 2 * 4);
    free(mem);
}

/* ms_quant_i4z_row: compressed-tensors' asymmetric min/max quantization, reconstructed by
 * the reference formula within half a step. */
TEST(quant_i4z_row_contract) {
    enum { N = 32 * 4 };
    float x[N];
    int32_t pk[N / 8];
    uint16_t sc[N / 32];
    int8_t zp[N / 32];
    for (int trial = 0; trial < 20; trial++) {
        for (int i = 0; i < N; i++) x[i] = (float)(frand() * 0.05 + (trial % 2 ? 0.03 : 0));
        if (trial == 3) for (int i = 32; i < 64; i++) x[i] = 0;
        ms_quant_i4z_row(x, N, 32, pk, sc, zp);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            uint32_t bits = (uint32_t)sc[i / 32] << 16;
            float d;
            memcpy(&d, &bits, 4);
            int q = (int)(((uint32_t)pk[i / 8] >> (4 * (i % 8))) & 15) - 8;
            double v = (double)(q - zp[i / 32]) * d;
            if (zp[i / 32] < -8 || zp[i / 32] > 7) bad++;
            if (fabs(v - x[i]) > d * 0.5 * 1.02 + d * 16 * 0.004 + 1e-30) bad++;
        }
        CHECK_MSG(bad == 0, "trial %d: %d contract violations", trial, bad);
    }
}

/* One synth model with INT4 routed experts (synth --expert-dtype int4 / int4-asym) and the
 * prompt it runs: the same model with every expert matrix replaced by this file's reference
 * dequantization in F32 (ref_value, not ms_qmat_row) runs the F32 kernels, so the logits must
 * agree to F32 reduction accuracy. */
typedef struct {
    const char *fixture; /* its config.json: DeepSeek-V3 architecture (what Kimi K2 is), Kimi Linear */
    int asym;            /* 0: symmetric, as Kimi K2-Thinking / K2.5 publish; 1: weight_zero_point */
    int seed, n_prompt, n_steps;
    int id_mul, id_add, id_mod; /* prompt id k = (k * id_mul + id_add) % id_mod + 1 */
    int tok0, tok_step;         /* decode step i feeds tok0 + tok_step * i */
} model_case;

static const model_case model_cases[] = {
    {"deepseek_v3", 0, 3, 24, 6, 53, 11, 250, 7, 31},
    {"kimi_linear", 0, 3, 24, 6, 53, 11, 250, 7, 31},
    {"deepseek_v3", 1, 5, 20, 5, 41, 3, 240, 5, 29},
    {"kimi_linear", 1, 5, 20, 5, 41, 3, 240, 5, 29},
};

/* Prefill the case's prompt (all logits), then its decode steps of fixed tokens:
 * [n_prompt + n_steps, vocab], or NULL with err set. */
static float *run(ms_model *m, const model_case *k, ms_err *err) {
    ms_engine *e;
    ms_engine_opts o = {.max_ctx = 128};
    if (ms_engine_create(m, &o, &e, err)) return NULL;
    int64_t V = m->cfg.vocab;
    int32_t ids[64];
    for (int i = 0; i < k->n_prompt; i++) ids[i] = (int32_t)((i * k->id_mul + k->id_add) % k->id_mod + 1);
    float *out = malloc(sizeof(float) * (size_t)V * (size_t)(k->n_prompt + k->n_steps));
    int rc = ms_engine_forward(e, ids, k->n_prompt, out, 1, err);
    for (int i = 0; i < k->n_steps && !rc; i++) {
        int32_t tok = (int32_t)(k->tok0 + k->tok_step * i);
        rc = ms_engine_forward(e, &tok, 1, out + (size_t)V * (size_t)(k->n_prompt + i), 0, err);
    }
    ms_engine_destroy(e);
    if (rc) { free(out); return NULL; }
    return out;
}

static void check_model(const model_case *k) {
    const char *name = k->fixture, *kind = k->asym ? "int4-asym" : "int4";
    char cfg[256], out[256];
    snprintf(cfg, sizeof cfg, MS_TEST_FIXTURES "%s/config.json", name);
    snprintf(out, sizeof out, "build/tmp/%s_ref_%s", k->asym ? "int4z" : "int4", name);
    mkdir("build/tmp", 0755);
    ms_synth_opts o = {.config_path = cfg, .out_dir = out, .seed = (uint64_t)k->seed, .dtype = MS_DT_BF16,
                       .expert_dtype = MS_DT_I4, .int4_asym = k->asym};
    ms_synth_result sr;
    ms_err err = {0};
    if (ms_synth(&o, &sr, &err)) { CHECK_MSG(0, "%s %s synth: %s", name, kind, err.msg); return; }
    ms_model m;
    if (ms_model_load(out, &m, &err)) { CHECK_MSG(0, "%s %s load: %s", name, kind, err.msg); return; }
    CHECK(m.cfg.int4_packed == 1 && m.cfg.int4_asym == k->asym && m.cfg.int4_group == 32);
    /* the routed experts alone are INT4, bound as views into the mapping; zero points iff asymmetric */
    int n_i4 = 0, n_other = 0, n_zero = 0, n_nonsym = 0;
    for (int l = 0; l < m.cfg.n_layers; l++) {
        ms_layer *L = &m.layers[l];
        if (!L->experts) continue;
        const ms_qmat *g = &L->experts[0].gate;
        n_i4 += g->dtype == MS_DT_I4;
        const uint8_t *p = g->data, *mp = m.ck.files[0].map.data;
        CHECK(p >= mp && p < mp + m.ck.files[0].map.size);
        CHECK(g->brow == 1 && g->bcol == 32 && g->scale_dtype == MS_DT_BF16);
        n_other += L->wo.dtype == MS_DT_I4;
        n_zero += g->dtype == MS_DT_I4 && g->zero != NULL;
        for (int64_t r = 0; g->zero && r < g->rows; r++) n_nonsym += ms_i4_zero(g, r, 0) != 8;
    }
    CHECK_MSG(n_i4 > 0 && n_other == 0, "%s %s: %d INT4 expert layers, %d INT4 static matrices", name, kind, n_i4, n_other);
    CHECK_MSG(k->asym ? n_zero == n_i4 && n_nonsym > 0 : n_zero == 0, "%s %s: %d of %d layers with zero points, %d non-8",
              name, kind, n_zero, n_i4, n_nonsym);
    float *got = run(&m, k, &err);
    CHECK_MSG(got != NULL, "%s %s: %s", name, kind, err.msg);
    /* every I4 expert matrix -> F32 of the reference dequantization */
    float **allocs = NULL;
    int n_allocs = 0;
    for (int l = 0; l < m.cfg.n_layers; l++) {
        if (!m.layers[l].experts) continue;
        for (int e = 0; e < m.cfg.n_experts; e++) {
            ms_qmat *mats[3] = {&m.layers[l].experts[e].gate, &m.layers[l].experts[e].up, &m.layers[l].experts[e].down};
            for (int j = 0; j < 3; j++) {
                ms_qmat *q = mats[j];
                if (q->dtype != MS_DT_I4) continue;
                float *f = malloc(sizeof(float) * (size_t)(q->rows * q->cols));
                for (int64_t r = 0; r < q->rows; r++)
                    for (int64_t c = 0; c < q->cols; c++) f[r * q->cols + c] = (float)ref_value(q, r, c);
                allocs = realloc(allocs, sizeof *allocs * (size_t)(n_allocs + 1));
                allocs[n_allocs++] = f;
                *q = (ms_qmat){.dtype = MS_DT_F32, .rows = q->rows, .cols = q->cols, .data = f};
            }
        }
    }
    CHECK(n_allocs == n_i4 * m.cfg.n_experts * 3);
    float *ref = run(&m, k, &err);
    CHECK_MSG(ref != NULL, "%s %s f32 reference: %s", name, kind, err.msg);
    if (got && ref) {
        size_t total = (size_t)m.cfg.vocab * (size_t)(k->n_prompt + k->n_steps);
        double max_abs = 0, max_ref = 0;
        for (size_t i = 0; i < total; i++) {
            double d = fabs((double)got[i] - ref[i]);
            max_abs = d > max_abs ? d : max_abs;
            max_ref = fabs(ref[i]) > max_ref ? fabs(ref[i]) : max_ref;
        }
        /* F32 reduction order only: a few ulps of the largest logit through the layers */
        CHECK_MSG(max_abs <= 2e-5 * (max_ref + 1e-3), "%s: max |%s - f32 reference| %.3g (max |logit| %.3g)", name, kind,
                  max_abs, max_ref);
        printf("%s %s vs f32 reference dequantization: max abs diff %.3g, max |logit| %.3g, %d expert matrices\n", name,
               kind, max_abs, max_ref, n_allocs);
    }
    free(got), free(ref);
    for (int i = 0; i < n_allocs; i++) free(allocs[i]);
    free(allocs);
    ms_model_free(&m);
}

TEST(int4_experts_match_reference) {
    for (size_t i = 0; i < sizeof model_cases / sizeof *model_cases; i++) check_model(&model_cases[i]);
}

/* the deepseek_v3 fixture's config.json with quantization_config q */
static int parse_q(const char *q, ms_config *c, ms_err *err) {
    char *text, buf[16384];
    size_t len;
    if (ms_read_file(MS_TEST_FIXTURES "deepseek_v3/config.json", 1 << 20, &text, &len, err)) return -1;
    while (len && text[len - 1] != '}') len--;
    snprintf(buf, sizeof buf, "%.*s,\"quantization_config\":%s}", (int)(len - 1), text, q);
    free(text);
    return ms_config_parse(buf, strlen(buf), "test", c, err);
}

/* Kimi K2-Thinking's quantization_config (config_groups, targets, ignore) */
static const char k2_q[] =
    "{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{\"group_0\":{"
    "\"input_activations\":null,\"output_activations\":null,\"targets\":[\"Linear\"],\"weights\":{\"actorder\":null,"
    "\"dynamic\":false,\"group_size\":32,\"num_bits\":4,\"observer\":\"minmax\",\"strategy\":\"group\","
    "\"symmetric\":true,\"type\":\"int\"}}},\"ignore\":[\"lm_head\",\"re:.*self_attn.*\",\"re:.*shared_experts.*\","
    "\"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\"],\"kv_cache_scheme\":null,\"quantization_status\":\"compressed\"}";

/* The quantization_config parse: what is accepted (symmetric or not) and each refusal naming its key. */
TEST(int4_config) {
    static ms_config c;
    ms_err err = {0};
    struct {
        const char *base, *from, *to; /* base with from replaced by to (from NULL: base as is) */
        int asym;                     /* accepted: int4_asym; -1: refused */
        const char *needle;           /* the refusal names it */
    } cases[] = {
        {k2_q, NULL, NULL, 0, NULL},
        {"{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{\"group_0\":{"
         "\"targets\":[\"Linear\"],\"weights\":{\"group_size\":32,\"num_bits\":4,\"strategy\":\"group\","
         "\"symmetric\":false,\"type\":\"int\"}}},\"ignore\":[\"lm_head\"]}",
         NULL, NULL, 1, NULL},
        {k2_q, "\"num_bits\":4", "\"num_bits\":8", -1, "8-bit"},
        {k2_q, "\"actorder\":null", "\"actorder\":\"group\"", -1, "actorder"},
        {k2_q, "\"strategy\":\"group\"", "\"strategy\":\"channel\"", -1, "strategy"},
        {k2_q, "\"input_activations\":null", "\"input_activations\":{\"num_bits\":8}", -1, "input_activations"},
        {k2_q, "\"format\":\"pack-quantized\"", "\"format\":\"marlin-24\"", -1, "marlin-24"},
        {"{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{"
         "\"a\":{\"targets\":[\"re:.*up_proj\"],\"weights\":{\"group_size\":32,\"num_bits\":4,\"symmetric\":true}},"
         "\"b\":{\"targets\":[\"re:.*down_proj\"],\"weights\":{\"group_size\":32,\"num_bits\":4,\"symmetric\":false}}}}",
         NULL, NULL, -1, "symmetric"}, /* mixed groups */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char q[2048];
        const char *b = cases[i].base, *at = cases[i].from ? strstr(b, cases[i].from) : NULL;
        if (cases[i].from) CHECK_MSG(at != NULL, "case %zu: \"%s\" not in its base", i, cases[i].from);
        if (at) snprintf(q, sizeof q, "%.*s%s%s", (int)(at - b), b, cases[i].to, at + strlen(cases[i].from));
        else snprintf(q, sizeof q, "%s", b);
        err = (ms_err){0};
        int rc = parse_q(q, &c, &err);
        if (cases[i].asym >= 0)
            CHECK_MSG(rc == 0 && c.int4_packed == 1 && c.int4_group == 32 && c.int4_asym == cases[i].asym && !c.mxfp4_packed,
                      "case %zu: rc %d: %s", i, rc, err.msg);
        else
            CHECK_MSG(rc == MS_ERR_UNSUPPORTED && strstr(err.msg, cases[i].needle), "case %zu: rc %d: %s", i, rc, err.msg);
    }
    /* K2's targets and ignore list: re.match anchors at the start only */
    CHECK_MSG(parse_q(k2_q, &c, &err) == 0, "%s", err.msg);
    CHECK(ms_config_ct_quantized(&c, "model.layers.3.mlp.experts.17.gate_proj"));
    CHECK(ms_config_ct_quantized(&c, "model.layers.3.mlp.experts.17.down_proj"));
    CHECK(!ms_config_ct_quantized(&c, "model.layers.3.mlp.shared_experts.down_proj"));
    CHECK(!ms_config_ct_quantized(&c, "model.layers.0.mlp.gate_proj"));
    CHECK(!ms_config_ct_quantized(&c, "model.layers.3.self_attn.kv_a_proj_with_mqa"));
    CHECK(!ms_config_ct_quantized(&c, "lm_head"));
    CHECK(ms_config_ct_quantized(&c, "xmlp.gate_proj") == 0 && ms_config_ct_quantized(&c, "mlp.gate_projection") == 0);
}

/* The loader binds weight_zero_point as the view's zero (a view into the mapping) and lists it
 * among the expert's tensors. */
TEST(int4_asym_binds_zero_points) {
    mkdir("build/tmp", 0755);
    ms_synth_opts o = {.config_path = MS_TEST_FIXTURES "deepseek_v3/config.json", .out_dir = "build/tmp/int4z_bind",
                       .seed = 2, .dtype = MS_DT_BF16, .expert_dtype = MS_DT_I4, .int4_asym = 1};
    ms_synth_result sr;
    ms_err err = {0};
    CHECK_MSG(ms_synth(&o, &sr, &err) == 0, "%s", err.msg);
    ms_model m;
    CHECK_MSG(ms_model_load(o.out_dir, &m, &err) == 0, "%s", err.msg);
    int found = 0;
    for (int l = 0; l < m.cfg.n_layers && !found; l++) {
        if (!m.layers[l].experts) continue;
        const ms_qmat *d = &m.layers[l].experts[0].down;
        const uint8_t *z = d->zero, *mp = m.ck.files[0].map.data;
        CHECK(z != NULL && z >= mp && z < mp + m.ck.files[0].map.size);
        /* the zero points are expert tensors (not the static tier the streamer pins) */
        const ms_tensor *zt = m.layers[l].expert_tensors[0 * MS_EXPERT_TENSORS + 3 * 2 + 2];
        CHECK(zt != NULL && zt->data == d->zero);
        found = 1;
    }
    CHECK(found);
    ms_model_free(&m);
}

TEST_MAIN()
