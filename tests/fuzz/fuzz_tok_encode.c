/* libFuzzer target: encoding arbitrary bytes with a small tokenizer.json
 * tokenizer (NFC, Split regex, added tokens with every flag) and a tiktoken one
 * with Kimi's split pattern. Invalid UTF-8 must be refused; valid text must
 * round-trip (to its NFC form for the NFC tokenizer) and streaming decode must
 * equal batch decode. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tok_mini.h"

static ms_tokenizer *g_hf, *g_tt;

static void init(void) {
    ms_err err = {0};
    char *json = mini_json();
    if (ms_tok_load_hf_json(json, strlen(json), NULL, 0, &g_hf, &err)) {
        fprintf(stderr, "mini tokenizer.json: %s\n", err.msg);
        abort();
    }
    free(json);
    size_t len;
    char *ranks = mini_ranks(&len);
    const char *sp[2] = {"<|im_end|>", "[EOS]"};
    int32_t ids[2] = {400, 401};
    if (ms_tok_load_tiktoken(ranks, len, ms_tiktoken_pattern_kimi, sp, ids, 2, NULL, 0, &g_tt, &err)) {
        fprintf(stderr, "mini tiktoken: %s\n", err.msg);
        abort();
    }
    free(ranks);
    g_tt->max_run_chars = 8; /* exercise tokenization_kimi.py's run splitting */
}

static void check(ms_tokenizer *t, const uint8_t *data, size_t size, int flags, const uint8_t *want, size_t wn) {
    ms_tok_ids ids = {0};
    ms_err err = {0};
    int valid = ms_utf8_valid_prefix(data, size) == size;
    int rc = ms_tok_encode(t, (const char *)data, size, flags, &ids, &err);
    if (!valid) {
        if (rc != MS_ERR_FORMAT) abort();
        ms_tok_ids_free(&ids);
        return;
    }
    if (rc) abort();
    char *dec;
    size_t dn;
    if (ms_tok_decode(t, ids.ids, ids.n, 0, &dec, &dn, &err)) abort();
    if (want && (dn != wn || memcmp(dec, want, wn))) abort(); /* round trip */
    ms_tok_stream s;
    ms_tok_stream_init(&s, t, 0);
    ms_buf acc = {0};
    for (size_t i = 0; i < ids.n; i++) {
        const char *p;
        size_t k;
        if (ms_tok_stream_feed(&s, ids.ids[i], &p, &k, &err)) abort();
        ms_buf_add(&acc, p, k);
    }
    const char *p;
    size_t k;
    if (ms_tok_stream_flush(&s, &p, &k, &err)) abort();
    ms_buf_add(&acc, p, k);
    if (acc.n != dn || (dn && memcmp(acc.p, dec, dn))) abort(); /* stream == batch */
    ms_buf_free(&acc);
    ms_tok_stream_free(&s);
    free(dec);
    ms_tok_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_hf) init();
    int valid = ms_utf8_valid_prefix(data, size) == size;
    ms_buf nfc = {0};
    if (valid) {
        if (ms_nfc(data, size, &nfc)) abort();
        ms_buf again = {0};
        if (ms_nfc(nfc.p, nfc.n, &again) || again.n != nfc.n || memcmp(again.p, nfc.p, nfc.n)) abort(); /* idempotent */
        ms_buf_free(&again);
    }
    /* without special tokens only the normalized, unstripped added tokens are cut out */
    check(g_hf, data, size, 0, valid ? nfc.p : NULL, nfc.n);
    check(g_hf, data, size, MS_TOK_ENCODE_SPECIAL, NULL, 0);
    check(g_tt, data, size, 0, valid ? data : NULL, size);
    check(g_tt, data, size, MS_TOK_ENCODE_SPECIAL, valid ? data : NULL, size);
    ms_buf_free(&nfc);
    return 0;
}
