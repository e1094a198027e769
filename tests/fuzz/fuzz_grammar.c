/* libFuzzer target: grammar compile + random walk. The first byte picks the form
 * (JSON Schema, GBNF, json_object) and seeds the walk; the rest is the schema or
 * grammar text. Compiling must fail cleanly or give a grammar on which a random
 * walk over a small vocabulary (every byte, some multi-byte tokens, a stop token)
 * keeps its contract: the mask is never empty before the end, equals the
 * byte-level check for every token, allowed tokens are accepted, and a finished
 * JSON document parses. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

static const char *const k_multi[] = {"\"", "{\"", "\":", "\",\"", "true", "null", "},", "\xe6\x97", "\xa5", "\xe6\x97\xa5\"", "  ", "\n", "0.", "e+"};
#define N_MULTI (sizeof k_multi / sizeof *k_multi)
#define N_VOCAB (256 + N_MULTI + 1)

static ms_gvocab *vocab(void) {
    static ms_gvocab *v;
    static uint8_t bytes[256];
    if (v) return v;
    const uint8_t *p[N_VOCAB];
    size_t l[N_VOCAB];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i, p[i] = &bytes[i], l[i] = 1;
    for (size_t i = 0; i < N_MULTI; i++) p[256 + i] = (const uint8_t *)k_multi[i], l[256 + i] = strlen(k_multi[i]);
    p[N_VOCAB - 1] = NULL, l[N_VOCAB - 1] = 0;
    int32_t stop = N_VOCAB - 1;
    ms_err err;
    if (ms_gvocab_new_raw(N_VOCAB, p, l, &stop, 1, &v, &err)) abort();
    return v;
}

static const uint8_t *tok_bytes(int32_t t, size_t *n) {
    static uint8_t b[256];
    if (t < 256) {
        b[t] = (uint8_t)t;
        *n = 1;
        return &b[t];
    }
    *n = strlen(k_multi[t - 256]);
    return (const uint8_t *)k_multi[t - 256];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 8192) return 0;
    int mode = data[0] % 3;
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ data[0];
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    ms_grammar_opts o = {.max_states = 20000, .max_repeat = 64, .max_stack = 64};
    ms_grammar *g = NULL;
    ms_err err;
    int rc = mode == 0   ? ms_grammar_from_schema(text, size - 1, &o, &g, &err)
             : mode == 1 ? ms_grammar_from_gbnf(text, size - 1, NULL, NULL, 0, &o, &g, &err)
                         : ms_grammar_json(data[0] & 8 ? MS_GRAMMAR_JSON_VALUE : MS_GRAMMAR_JSON_OBJECT, &o, &g, &err);
    if (rc) {
        if (g || !err.msg[0]) abort(); /* a failure names itself and returns nothing */
        free(text);
        return 0;
    }
    ms_gvocab *v = vocab();
    ms_matcher *m = NULL;
    if (ms_matcher_new(g, v, &m, &err)) abort();
    uint32_t bits[(N_VOCAB + 31) / 32];
    char out[4096];
    size_t on = 0;
    for (int step = 0; step < 200; step++) {
        rc = ms_matcher_mask(m, bits, &err);
        if (rc == MS_ERR_LIMIT) break;
        if (rc) abort();
        int cnt = 0;
        for (int32_t t = 0; t < (int32_t)N_VOCAB; t++) {
            int got = bits[t >> 5] >> (t & 31) & 1;
            int want;
            if (t == N_VOCAB - 1) want = ms_matcher_done(m);
            else {
                size_t n;
                const uint8_t *b = tok_bytes(t, &n);
                want = ms_matcher_can_accept_bytes(m, b, n);
            }
            if (got != want) abort();
            cnt += got;
        }
        if (!cnt) abort(); /* every live state can be completed */
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        int k = (int)(rng % (uint64_t)cnt);
        int32_t pick = -1;
        for (int32_t t = 0; t < (int32_t)N_VOCAB && pick < 0; t++)
            if (bits[t >> 5] >> (t & 31) & 1 && !k--) pick = t;
        rc = ms_matcher_accept(m, pick, &err);
        if (rc == MS_ERR_LIMIT) break;
        if (rc) abort();
        if (pick == N_VOCAB - 1) {
            if (mode != 1 && on < sizeof out) {
                out[on] = 0;
                cJSON *d = cJSON_ParseWithLength(out, on);
                /* enum/const literals of huge numbers may not round-trip; any other document parses */
                if (!d && mode == 2) abort();
                cJSON_Delete(d);
            }
            break;
        }
        size_t n;
        const uint8_t *b = tok_bytes(pick, &n);
        if (on + n < sizeof out) memcpy(out + on, b, n);
        on += n;
    }
    ms_matcher_free(m);
    ms_grammar_free(g);
    free(text);
    return 0;
}
