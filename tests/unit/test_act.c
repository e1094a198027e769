/* The one parameterized SwiGLU (ms_swiglu_param) as each model's config sets it
 * up, against the activation code of the transformers sources themselves
 * (gpt-oss's clamped (up + 1) form, GLM-5-Next's and DeepSeek-V4's clamped
 * MLPs), run in float64 by tools/refs/swiglu_reference.py on values past
 * the clamps (its output is tests/data/swiglu_reference.json); the unclamped
 * default is ms_swiglu exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "ops/ops.h"
#include "test.h"
#include "text/pyjson.h"
#include "util/fs.h"

#define REF_FILE "tests/data/swiglu_reference.json"

static float *floats(const ms_py *list, size_t *n) {
    *n = list && list->type == MS_PY_LIST ? list->n : 0;
    float *v = calloc(*n ? *n : 1, sizeof *v);
    for (size_t i = 0; i < *n; i++) {
        const ms_py *x = list->items[i];
        v[i] = x->type == MS_PY_INT ? (float)atof(x->s) : (float)x->f;
    }
    return v;
}

TEST(configured_swiglu_matches_transformers) {
    size_t len = 0;
    char *out = NULL;
    ms_err e = {0};
    CHECK_MSG(ms_read_file(REF_FILE, 1 << 20, &out, &len, &e) == MS_OK, "%s", e.msg);
    if (!out) return;
    ms_py *ref = NULL;
    CHECK(ms_py_parse(out, len, 8, "swiglu reference", &ref, &e) == MS_OK);
    size_t n = 0, nu = 0;
    float *gate = floats(ms_py_get(ref, "gate"), &n), *up = floats(ms_py_get(ref, "up"), &nu);
    CHECK(n > 100 && n == nu);
    const char *models[] = {"gpt_oss", "glm5_next", "deepseek_v4"};
    for (int m = 0; m < 3; m++) {
        char dir[256];
        snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", models[m]);
        ms_config c;
        CHECK_MSG(ms_config_load(dir, &c, &e) == MS_OK, "%s: %s", dir, e.msg);
        size_t nw = 0;
        float *want = floats(ms_py_get(ref, models[m]), &nw);
        CHECK(nw == n);
        float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u);
        memcpy(g, gate, n * sizeof *g);
        memcpy(u, up, n * sizeof *u);
        CHECK_MSG(c.act_limit > 0 && c.expert_act == MS_ACT_SILU, "%s: limit %g", models[m], c.act_limit);
        ms_swiglu_param(g, u, (int64_t)n, (float)c.act_limit, (float)c.act_alpha, (float)c.act_up_offset);
        int bad = 0;
        for (size_t i = 0; i < n && i < nw; i++)
            if (!(fabsf(g[i] - want[i]) <= 2e-6f * (1 + fabsf(want[i])))) {
                if (bad++ < 3)
                    fprintf(stderr, "%s: act(%g, %g) = %.9g, transformers %.9g\n", models[m], gate[i], up[i], g[i],
                            want[i]);
            }
        CHECK_MSG(bad == 0, "%s: %d of %zu values differ", models[m], bad, n);
        free(g);
        free(u);
        free(want);
    }
    /* the unclamped default is ms_swiglu bit for bit; NaN stays NaN through the clamp */
    ms_config q;
    CHECK(ms_config_load(MS_TEST_FIXTURES "qwen3_moe", &q, &e) == MS_OK);
    CHECK(q.act_limit == 0 && q.act_alpha == 1 && q.act_up_offset == 0);
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u), *r = malloc(n * sizeof *r);
    memcpy(g, gate, n * sizeof *g);
    memcpy(u, up, n * sizeof *u);
    ms_swiglu(r, gate, up, (int64_t)n);
    ms_swiglu_param(g, u, (int64_t)n, (float)q.act_limit, (float)q.act_alpha, (float)q.act_up_offset);
    CHECK(memcmp(g, r, n * sizeof *g) == 0);
    float ng[2] = {NAN, 1}, nu2[2] = {1, NAN};
    ms_swiglu_param(ng, nu2, 2, 7, 1.702f, 1);
    CHECK(isnan(ng[0]) && isnan(ng[1]));
    free(g);
    free(u);
    free(r);
    free(gate);
    free(up);
    ms_py_free(ref);
    free(out);
}

TEST_MAIN()
