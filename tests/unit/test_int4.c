/* test_int4.c — compressed-tensors INT4 pack-quantized experts (core/qmat.h I4).
 *
 * A synth model with INT4 routed experts (synth --expert-dtype int4: the layout Kimi
 * K2-Thinking / K2.5 publish) against an independent reference: the same model with
 * every expert matrix replaced by its exactly dequantized values stored as F32, so the
 * reference runs the F32 kernels, not the INT4 ones. Logits must agree to F32 reduction
 * accuracy, on a DeepSeek-V3-architecture model (what Kimi K2 is) and a Kimi Linear one.
 * Also: the config parsing (targets/ignore, the refusals naming their key; asymmetric INT4 is
 * test_int4_asym.c). Streamed vs
 * resident bit-identity is in test_streaming_engine.c. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "engine/engine.h"
#include "model/model.h"
#include "model/synth.h"
#include "test.h"
#include "util/fs.h"

#define N_PROMPT 24
#define N_STEPS 6

/* Prefill ids[N_PROMPT] (all logits), then N_STEPS decode steps of fixed tokens. */
static float *run(ms_model *m, const int32_t *ids, ms_err *err) {
    ms_engine *e;
    ms_engine_opts o = {.max_ctx = 128};
    if (ms_engine_create(m, &o, &e, err)) return NULL;
    int64_t V = m->cfg.vocab;
    float *out = malloc(sizeof(float) * (size_t)V * (N_PROMPT + N_STEPS));
    int rc = ms_engine_forward(e, ids, N_PROMPT, out, 1, err);
    for (int i = 0; i < N_STEPS && !rc; i++) {
        int32_t tok = (int32_t)(7 + 31 * i);
        rc = ms_engine_forward(e, &tok, 1, out + (size_t)V * (N_PROMPT + i), 0, err);
    }
    ms_engine_destroy(e);
    if (rc) { free(out); return NULL; }
    return out;
}

/* Replaces every I4 expert matrix of m by an F32 copy of its dequantized rows; returns the count. */
static int dequantize_experts(ms_model *m, float ***allocs, int *n_allocs) {
    int count = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        ms_layer *L = &m->layers[l];
        if (!L->experts) continue;
        for (int e = 0; e < m->cfg.n_experts; e++) {
            ms_qmat *mats[3] = {&L->experts[e].gate, &L->experts[e].up, &L->experts[e].down};
            for (int k = 0; k < 3; k++) {
                ms_qmat *q = mats[k];
                if (q->dtype != MS_DT_I4) continue;
                float *f = malloc(sizeof(float) * (size_t)(q->rows * q->cols));
                for (int64_t r = 0; r < q->rows; r++) ms_qmat_row(q, r, f + r * q->cols);
                *allocs = realloc(*allocs, sizeof **allocs * (size_t)(*n_allocs + 1));
                (*allocs)[(*n_allocs)++] = f;
                *q = (ms_qmat){.dtype = MS_DT_F32, .rows = q->rows, .cols = q->cols, .data = f};
                count++;
            }
        }
    }
    return count;
}

static void check_against_f32(const char *name) {
    char cfg[256], out[256];
    snprintf(cfg, sizeof cfg, MS_TEST_FIXTURES "%s/config.json", name);
    snprintf(out, sizeof out, "build/tmp/int4_ref_%s", name);
    mkdir("build/tmp", 0755);
    ms_synth_opts o = {.config_path = cfg, .out_dir = out, .seed = 3, .dtype = MS_DT_BF16, .expert_dtype = MS_DT_I4};
    ms_synth_result sr;
    ms_err err = {0};
    if (ms_synth(&o, &sr, &err)) { CHECK_MSG(0, "%s synth: %s", name, err.msg); return; }
    ms_model m;
    if (ms_model_load(out, &m, &err)) { CHECK_MSG(0, "%s load: %s", name, err.msg); return; }
    CHECK(m.cfg.int4_packed == 1 && m.cfg.int4_group == 32);
    /* the routed experts alone are INT4, bound as views into the mapping */
    int n_i4 = 0, n_other = 0;
    for (int l = 0; l < m.cfg.n_layers; l++) {
        ms_layer *L = &m.layers[l];
        if (!L->experts) continue;
        const ms_qmat *g = &L->experts[0].gate;
        n_i4 += g->dtype == MS_DT_I4;
        const uint8_t *p = g->data, *mp = m.ck.files[0].map.data;
        CHECK(p >= mp && p < mp + m.ck.files[0].map.size);
        CHECK(g->brow == 1 && g->bcol == 32 && g->scale_dtype == MS_DT_BF16);
        n_other += L->wo.dtype == MS_DT_I4;
    }
    CHECK_MSG(n_i4 > 0 && n_other == 0, "%s: %d INT4 expert layers, %d INT4 static matrices", name, n_i4, n_other);
    int32_t ids[N_PROMPT];
    for (int k = 0; k < N_PROMPT; k++) ids[k] = (int32_t)((k * 53 + 11) % 250 + 1);
    float *got = run(&m, ids, &err);
    CHECK_MSG(got != NULL, "%s int4: %s", name, err.msg);
    float **allocs = NULL;
    int n_allocs = 0;
    int n_deq = dequantize_experts(&m, &allocs, &n_allocs);
    CHECK(n_deq == n_i4 * m.cfg.n_experts * 3);
    float *ref = run(&m, ids, &err);
    CHECK_MSG(ref != NULL, "%s f32 reference: %s", name, err.msg);
    if (got && ref) {
        size_t total = (size_t)m.cfg.vocab * (N_PROMPT + N_STEPS);
        double max_abs = 0, max_ref = 0;
        for (size_t i = 0; i < total; i++) {
            double d = fabs((double)got[i] - ref[i]);
            max_abs = d > max_abs ? d : max_abs;
            max_ref = fabs(ref[i]) > max_ref ? fabs(ref[i]) : max_ref;
        }
        /* F32 reduction order only: a few ulps of the largest logit through the layers */
        CHECK_MSG(max_abs <= 2e-5 * (max_ref + 1e-3), "%s: max |int4 - f32 dequantized| %.3g (max |logit| %.3g)", name,
                  max_abs, max_ref);
        printf("%s int4 vs f32-dequantized reference: max abs diff %.3g, max |logit| %.3g, %d expert matrices\n", name,
               max_abs, max_ref, n_deq);
    }
    free(got);
    free(ref);
    for (int i = 0; i < n_allocs; i++) free(allocs[i]);
    free(allocs);
    ms_model_free(&m);
}

TEST(int4_experts_match_f32_dequantized_reference) {
    check_against_f32("deepseek_v3");
    check_against_f32("kimi_linear");
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

/* Kimi K2-Thinking's quantization_config (config_groups, targets, ignore) and the refusals. */
TEST(int4_config) {
    static ms_config c;
    ms_err err = {0};
    const char *k2 =
        "{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\",\"config_groups\":{\"group_0\":{"
        "\"input_activations\":null,\"output_activations\":null,\"targets\":[\"Linear\"],\"weights\":{\"actorder\":null,"
        "\"dynamic\":false,\"group_size\":32,\"num_bits\":4,\"observer\":\"minmax\",\"strategy\":\"group\","
        "\"symmetric\":true,\"type\":\"int\"}}},\"ignore\":[\"lm_head\",\"re:.*self_attn.*\",\"re:.*shared_experts.*\","
        "\"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\"],\"kv_cache_scheme\":null,\"quantization_status\":\"compressed\"}";
    int rc = parse_q(k2, &c, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK(c.int4_packed == 1 && c.int4_group == 32 && !c.mxfp4_packed);
    CHECK(ms_config_ct_quantized(&c, "model.layers.3.mlp.experts.17.gate_proj"));
    CHECK(ms_config_ct_quantized(&c, "model.layers.3.mlp.experts.17.down_proj"));
    CHECK(!ms_config_ct_quantized(&c, "model.layers.3.mlp.shared_experts.down_proj"));
    CHECK(!ms_config_ct_quantized(&c, "model.layers.0.mlp.gate_proj"));
    CHECK(!ms_config_ct_quantized(&c, "model.layers.3.self_attn.kv_a_proj_with_mqa"));
    CHECK(!ms_config_ct_quantized(&c, "lm_head"));
    /* re.match anchors at the start only */
    CHECK(ms_config_ct_quantized(&c, "xmlp.gate_proj") == 0 && ms_config_ct_quantized(&c, "mlp.gate_projection") == 0);
    struct { const char *from, *to, *needle; } bad[] = {
        {"\"num_bits\":4", "\"num_bits\":8", "8-bit"},
        {"\"actorder\":null", "\"actorder\":\"group\"", "actorder"},
        {"\"strategy\":\"group\"", "\"strategy\":\"channel\"", "strategy"},
        {"\"input_activations\":null", "\"input_activations\":{\"num_bits\":8}", "input_activations"},
        {"\"format\":\"pack-quantized\"", "\"format\":\"marlin-24\"", "marlin-24"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char q[2048];
        const char *at = strstr(k2, bad[i].from);
        snprintf(q, sizeof q, "%.*s%s%s", (int)(at - k2), k2, bad[i].to, at + strlen(bad[i].from));
        err = (ms_err){0};
        rc = parse_q(q, &c, &err);
        CHECK_MSG(rc == MS_ERR_UNSUPPORTED && strstr(err.msg, bad[i].needle), "case %zu: rc %d: %s", i, rc, err.msg);
    }
}

TEST_MAIN()
