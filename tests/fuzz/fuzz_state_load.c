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
#include "util/hash.h"

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

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_engine) init();
    if (size < 104 || size > (1u << 20)) return 0;
    uint8_t *b = malloc(size);
    if (!b) return 0;
    memcpy(b, data, size);
    memcpy(b + 32, g_id, 32);
    for (int i = 0; i < 8; i++) b[24 + i] = (uint8_t)((uint64_t)size >> (8 * i));
    uint64_t ns = b[12] | (uint64_t)b[13] << 8 | (uint64_t)b[14] << 16 | (uint64_t)b[15] << 24;
    uint64_t nt = rd64(b + 88), hb = rd64(b + 16);
    if (nt <= size / 4 && ns <= size / 72) {
        uint64_t tab = 104 + ((4 * nt + 7) & ~(uint64_t)7);
        for (uint64_t i = 0; i < ns && tab + (i + 1) * 72 <= size; i++) {
            uint8_t *t = b + tab + i * 72;
            uint64_t off = rd64(t + 48), sz = rd64(t + 56);
            if (off <= size && sz <= size - off) wr32(t + 64, ms_crc32c(0, b + off, sz));
        }
    }
    if (hb >= 100 && hb <= size) {
        wr32(b + 96, 0);
        wr32(b + 96, ms_crc32c(0, b, hb));
    }
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
