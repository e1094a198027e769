/* libFuzzer target: loading state files into a live engine
 * (ms_engine_state_load_buffer) — the section checks against the engine's state
 * layout (sizes for n_past, the DSA tie-row lists) and the restore behind them.
 *
 * The engine is the deepseek_v32 fixture (MLA latents, DSA index keys, recorded
 * tied selections, token ids), context 64, from tests/data/fixtures (make fuzz runs in the
 * repository root). Each input gets this model's identity, its own size and
 * recomputed checksums written in where its claimed layout allows, so mutations
 * get past those checks to the engine's. After a successful load the engine
 * must hold what the file said and forward two more tokens (tie replays
 * included) without a sanitizer report. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/state.h"
#include "model/model.h"
#include "state_fix.h"

#define FIXTURE "tests/data/fixtures/models/deepseek_v32"

static ms_model g_model;
static ms_engine *g_engine;
static uint8_t g_id[32];

static void init(void) {
    ms_err err = {0};
    ms_engine_opts o = {.max_ctx = 64, .max_batch = 16};
    if (ms_model_load(FIXTURE, &g_model, &err) || ms_engine_create(&g_model, &o, &g_engine, &err) ||
        ms_model_identity(&g_model, g_id, &err)) {
        fprintf(stderr, "fuzz_state_load: %s (run from the repository root)\n", err.msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_engine) init();
    if (size < 104 || size > (1u << 20)) return 0;
    uint8_t *b = malloc(size);
    if (!b) return 0;
    memcpy(b, data, size);
    memcpy(b + 32, g_id, 32);
    state_fix_derived(b, size);
    ms_err err = {0};
    int before = ms_engine_n_past(g_engine);
    int32_t *tok = NULL;
    int n = -1;
    int rc = ms_engine_state_load_buffer(g_engine, b, size, "fuzz", &tok, &n, &err);
    if (rc) {
        if (ms_engine_n_past(g_engine) != before || tok || n != 0) abort(); /* a refused load changes nothing */
    } else {
        if (n != ms_engine_n_past(g_engine) || (n && !tok)) abort();
        int32_t next[2] = {n ? tok[0] : 1, 2};
        if (n + 2 <= 64) ms_engine_forward(g_engine, next, 2, NULL, 0, &err); /* may refuse odd data; must not crash */
        ms_engine_reset(g_engine);
    }
    free(tok);
    free(b);
    return 0;
}
