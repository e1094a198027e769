/* tok_mini.h — a small byte-level BPE tokenizer for the tokenizer fuzz targets:
 * the 256 bytes plus merges that build a few words, as a tokenizer.json (NFC,
 * a Split regex, ByteLevel, added tokens with every flag) and as a tiktoken
 * rank file (ids = ranks). Included by fuzz_tok_*.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

static const char *k_mini_words[] = {"the", " the", "ing", " a", "er", "hello", " world", "\xe4\xb8\xad\xe6\x96\x87",
                                     "\xe6\x97\xa5\xe6\x9c\xac", "\xc3\xa9", "\xf0\x9f\x91\x8d", "  ", "\n\n", "123",
                                     " and", "tion"};

/* GPT-2 byte -> char (the forward map of ms_bytelevel_byte). */
static void mini_bl(uint8_t b, ms_buf *o) {
    int k = 0;
    uint32_t cp = b;
    for (int x = 0; x < 256; x++) {
        int printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174);
        if (!printable) {
            if (x == b) cp = 256 + (uint32_t)k;
            k++;
        }
    }
    uint8_t u[4];
    int n = ms_utf8_put(cp, u);
    if (cp == '"' || cp == '\\') ms_buf_add(o, "\\", 1);
    ms_buf_add(o, u, (size_t)n);
}

typedef struct {
    uint8_t tok[64][32];
    size_t len[64];
    int n;
    int ma[64], mb[64]; /* merge i builds token 256 + i from ma + mb */
} mini_vocab;

static int mini_find(const mini_vocab *v, const uint8_t *s, size_t n) {
    if (n == 1) return s[0];
    for (int i = 0; i < v->n; i++)
        if (v->len[i] == n && !memcmp(v->tok[i], s, n)) return 256 + i;
    return -1;
}

static void mini_build(mini_vocab *v) {
    memset(v, 0, sizeof *v);
    for (size_t w = 0; w < sizeof k_mini_words / sizeof *k_mini_words; w++) {
        const uint8_t *s = (const uint8_t *)k_mini_words[w];
        size_t n = strlen(k_mini_words[w]);
        for (size_t k = 2; k <= n; k++) {
            if (mini_find(v, s, k) >= 0) continue;
            memcpy(v->tok[v->n], s, k);
            v->len[v->n] = k;
            v->ma[v->n] = mini_find(v, s, k - 1);
            v->mb[v->n] = s[k - 1];
            v->n++;
        }
    }
}

static void mini_tokstr(const mini_vocab *v, int id, ms_buf *o) {
    ms_buf_add(o, "\"", 1);
    if (id < 256) mini_bl((uint8_t)id, o);
    else
        for (size_t i = 0; i < v->len[id - 256]; i++) mini_bl(v->tok[id - 256][i], o);
    ms_buf_add(o, "\"", 1);
}

/* tokenizer.json text (malloc'd). */
static char *mini_json(void) {
    mini_vocab v;
    mini_build(&v);
    ms_buf o = {0};
    char num[32];
    const char *head =
        "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": ["
        "{\"id\": %d, \"content\": \"<|im_start|>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true},"
        "{\"id\": %d, \"content\": \"<|im_end|>\", \"single_word\": false, \"lstrip\": true, \"rstrip\": true, \"normalized\": false, \"special\": true},"
        "{\"id\": %d, \"content\": \"<think>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": true, \"special\": false},"
        "{\"id\": %d, \"content\": \"word\", \"single_word\": true, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true},"
        "{\"id\": %d, \"content\": \"<tool>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": true, \"special\": false}],"
        "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]},"
        "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
        " \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}]},"
        "\"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false},"
        "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": \"\", \"end_of_word_suffix\": \"\","
        " \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false, \"vocab\": {";
    int base = 256 + v.n;
    char hb[4096];
    snprintf(hb, sizeof hb, head, base, base + 1, base + 2, base + 3, base + 4);
    ms_buf_add(&o, hb, strlen(hb));
    for (int id = 0; id < base; id++) {
        if (id) ms_buf_add(&o, ", ", 2);
        mini_tokstr(&v, id, &o);
        int k = snprintf(num, sizeof num, ": %d", id);
        ms_buf_add(&o, num, (size_t)k);
    }
    ms_buf_add(&o, "}, \"merges\": [", 14);
    for (int i = 0; i < v.n; i++) {
        ms_buf_add(&o, i ? ", [" : "[", i ? 3 : 1);
        mini_tokstr(&v, v.ma[i], &o);
        ms_buf_add(&o, ", ", 2);
        mini_tokstr(&v, v.mb[i], &o);
        ms_buf_add(&o, "]", 1);
    }
    ms_buf_add(&o, "]}}", 3);
    return (char *)o.p;
}

/* tiktoken rank file text (malloc'd), *len set. */
static char *mini_ranks(size_t *len) {
    static const char *A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    mini_vocab v;
    mini_build(&v);
    ms_buf o = {0};
    for (int id = 0; id < 256 + v.n; id++) {
        uint8_t one = (uint8_t)id;
        const uint8_t *s = id < 256 ? &one : v.tok[id - 256];
        size_t n = id < 256 ? 1 : v.len[id - 256];
        for (size_t i = 0; i < n; i += 3) {
            uint32_t x = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
            char q[4] = {A[x >> 18], A[(x >> 12) & 63], i + 1 < n ? A[(x >> 6) & 63] : '=', i + 2 < n ? A[x & 63] : '='};
            ms_buf_add(&o, q, 4);
        }
        char num[24];
        int k = snprintf(num, sizeof num, " %d\n", id);
        ms_buf_add(&o, num, (size_t)k);
    }
    *len = o.n;
    return (char *)o.p;
}
