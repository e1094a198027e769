/* test_tokenizer.c — tokenizers against Hugging Face's own outputs
 * (tests/data/fixtures/text/tok_dev.json, made with tokenizers 0.23.2) for the
 * three real tokenizers in tests/data/tokenizers, plus properties on other text:
 * byte-level round trip, streaming == batch decoding, and a tiktoken rank file
 * made from gpt-oss's tokenizer.json encoding exactly like the tokenizer.json. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "test.h"
#include "text/tok_internal.h"
#include "text/tokenizer.h"
#include "util/fs.h"
#include "util/json.h"

static const char *k_names[3] = {"deepseek_v3", "qwen3", "gptoss"};
static cJSON *g_fix;

/* Unpack tests/data/tokenizers/NAME into build/tokenizers/NAME (once). */
static int unpack(const char *name, char *dir, size_t cap) {
    snprintf(dir, cap, "build/tokenizers/%s", name);
    char path[600], cmd[4096];
    char cfg[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    /* other tests unpack tokenizer.json alone into the same folder: need both */
    if (ms_file_exists(path) && ms_file_exists(cfg)) return 0;
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && gzip -dc tests/data/tokenizers/%s/tokenizer.json.gz > %s.tmp && mv %s.tmp %s && "
             "cp tests/data/tokenizers/%s/tokenizer_config.json %s/",
             dir, name, path, path, path, name, dir);
    return system(cmd);
}

static ms_tokenizer *g_loaded[3];

/* Each tokenizer is loaded once and kept (freed at exit). */
static ms_tokenizer *load(const char *name) {
    int slot = -1;
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, k_names[i])) slot = i;
    if (slot >= 0 && g_loaded[slot]) return g_loaded[slot];
    char dir[512];
    ms_err err = {0};
    ms_tokenizer *t = NULL;
    CHECK(unpack(name, dir, sizeof dir) == 0);
    int rc = ms_tok_load_dir(dir, &t, &err);
    CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
    if (!rc && slot >= 0) g_loaded[slot] = t;
    return rc ? NULL : t;
}

static cJSON *fixture(void) {
    if (g_fix) return g_fix;
    char *data;
    size_t len;
    ms_err err = {0};
    int rc = ms_read_file("tests/data/fixtures/text/tok_dev.json", 1 << 26, &data, &len, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return NULL;
    rc = ms_json_parse(data, len, "tok_dev.json", &g_fix, &err);
    free(data);
    CHECK_MSG(rc == 0, "%s", err.msg);
    return g_fix;
}

static int ids_equal(const ms_tok_ids *a, const cJSON *want) {
    if ((int)a->n != cJSON_GetArraySize(want)) return 0;
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, want) {
        if (a->ids[i++] != (int32_t)e->valuedouble) return 0;
    }
    return 1;
}

/* Streaming decode of ids must equal the batch decode. */
static void check_stream(const ms_tokenizer *t, const int32_t *ids, size_t n, const char *what) {
    char *batch;
    size_t blen;
    ms_err err = {0};
    if (ms_tok_decode(t, ids, n, 0, &batch, &blen, &err)) {
        CHECK_MSG(0, "%s: %s", what, err.msg);
        return;
    }
    ms_tok_stream s;
    ms_tok_stream_init(&s, t, 0);
    ms_buf acc = {0};
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        const char *p;
        size_t k;
        if (ms_tok_stream_feed(&s, ids[i], &p, &k, &err)) ok = 0;
        else {
            /* every chunk is valid UTF-8 on its own */
            if (ms_utf8_valid_prefix((const uint8_t *)p, k) != k) ok = 0;
            ms_buf_add(&acc, p, k);
        }
    }
    const char *p;
    size_t k;
    if (ok && !ms_tok_stream_flush(&s, &p, &k, &err)) ms_buf_add(&acc, p, k);
    CHECK_MSG(ok && acc.n == blen && (blen == 0 || memcmp(acc.p, batch, blen) == 0), "%s: stream != batch", what);
    ms_buf_free(&acc);
    ms_tok_stream_free(&s);
    free(batch);
}

TEST(fixture_cases_and_chats) {
    cJSON *fix = fixture();
    if (!fix) return;
    const cJSON *toks = cJSON_GetObjectItem(fix, "tokenizers");
    for (int k = 0; k < 3; k++) {
        ms_tokenizer *t = load(k_names[k]);
        if (!t) continue;
        const cJSON *tk = cJSON_GetObjectItem(toks, k_names[k]);
        const cJSON *c;
        int ncase = 0, nchat = 0;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(tk, "cases")) {
            const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
            ms_tok_ids ids = {0};
            ms_err err = {0};
            int rc = ms_tok_encode(t, text, strlen(text), MS_TOK_ENCODE_SPECIAL, &ids, &err);
            CHECK_MSG(rc == 0 && ids_equal(&ids, cJSON_GetObjectItem(c, "ids")), "%s: ids of \"%.60s\"", k_names[k], text);
            const cJSON *want = cJSON_GetObjectItem(c, "ids");
            int32_t *wids = malloc(((size_t)cJSON_GetArraySize(want) + 1) * sizeof *wids);
            size_t n = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, want) wids[n++] = (int32_t)e->valuedouble;
            char *dec;
            size_t dlen;
            rc = ms_tok_decode(t, wids, n, 0, &dec, &dlen, &err);
            const char *wdec = cJSON_GetObjectItem(c, "decoded")->valuestring;
            CHECK_MSG(rc == 0 && dlen == strlen(wdec) && memcmp(dec, wdec, dlen) == 0, "%s: decode of \"%.60s\"",
                      k_names[k], text);
            if (!rc) free(dec);
            check_stream(t, wids, n, text);
            free(wids);
            ms_tok_ids_free(&ids);
            ncase++;
        }
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(tk, "chats")) {
            const cJSON *r = cJSON_GetObjectItem(c, "rendered");
            if (!cJSON_IsString(r)) continue;
            ms_tok_ids ids = {0};
            ms_err err = {0};
            int rc = ms_tok_encode(t, r->valuestring, strlen(r->valuestring), MS_TOK_ENCODE_SPECIAL, &ids, &err);
            CHECK_MSG(rc == 0 && ids_equal(&ids, cJSON_GetObjectItem(c, "ids")), "%s: chat %s",
                      k_names[k], cJSON_GetObjectItem(c, "name")->valuestring);
            ms_tok_ids_free(&ids);
            nchat++;
        }
        CHECK(ncase == 25);
        CHECK(k == 2 || nchat == 16);
    }
}

/* Text beyond the fixture: mixed scripts, emoji, whitespace runs, CJK,
 * combining marks, added tokens next to text, long words. */
static const char *k_extra[] = {
    "Grüße aus Köln — 東京タワー 🗼 and Москва, Ελλάδα; العربية עברית हिन्दी ไทย 한국어",
    "👩🏽‍💻👨‍👩‍👧‍👦🏳️‍🌈 emoji zwj sequences 🇺🇸🇯🇵 keycap 1️⃣ #️⃣",
    "tabs\t\t\tand   \n\n\n   spaces\r\n\r\n        end      ",
    "                                                                                                    x",
    "e\xcc\x81 a\xcc\x8a o\xcc\x88\xcc\x81 \xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8 q\xcc\xa3\xcc\x87 \xe2\x84\xab \xef\xac\x81",
    "<|im_start|>system\nYou are<|im_end|><|im_end|>x<|endoftext|>y <|im_start|> z",
    "<｜begin▁of▁sentence｜>hi<｜User｜>there<｜Assistant｜></think>ok",
    "<|start|>assistant<|channel|>final<|message|>done<|return|>",
    "pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilisticexpialidocious",
    "0123456789012345678901234567890 ٣٤٥ ૧૨ 一二三 Ⅻ ½",
    "'s 'S 'T 're 'VE ’s don’t DON’T I'M we'LL",
    "\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80",
    "\xe2\x80\x8b\xe2\x80\x8c\xe2\x80\x8d\xef\xbb\xbf\xc2\xa0\xe3\x80\x80\xe1\xa0\x8e\xc2\x85",
    "中文标点，。！？“引号”（括号）《书名》、顿号",
    "日本語ひらがなカタカナ漢字ｈａｌｆｗｉｄｔｈ ｶﾀｶﾅ",
    "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // done\n\tif (a && b || !c) return;",
};

static char *nfc_of(const ms_tokenizer *t, const char *s, size_t *n) {
    ms_buf b = {0};
    if (t->normalizer == MS_NORM_NFC) ms_nfc((const uint8_t *)s, strlen(s), &b);
    else ms_buf_add(&b, s, strlen(s));
    *n = b.n;
    return (char *)b.p;
}

TEST(properties_on_other_text) {
    for (int k = 0; k < 3; k++) {
        ms_tokenizer *t = load(k_names[k]);
        if (!t) continue;
        for (size_t i = 0; i < sizeof k_extra / sizeof *k_extra; i++) {
            const char *x = k_extra[i];
            ms_tok_ids ids = {0};
            ms_err err = {0};
            int rc = ms_tok_encode(t, x, strlen(x), MS_TOK_ENCODE_SPECIAL, &ids, &err);
            CHECK_MSG(rc == 0, "%s: %s", k_names[k], err.msg);
            char *dec = NULL;
            size_t dlen = 0, wn;
            rc = ms_tok_decode(t, ids.ids, ids.n, 0, &dec, &dlen, &err);
            char *want = nfc_of(t, x, &wn);
            CHECK_MSG(rc == 0 && dlen == wn && memcmp(dec, want, wn) == 0, "%s: round trip of \"%.50s\"", k_names[k], x);
            check_stream(t, ids.ids, ids.n, x);
            /* without special-token recognition no special id comes out, and the
             * text still round-trips */
            ids.n = 0;
            rc = ms_tok_encode(t, x, strlen(x), 0, &ids, &err);
            int special = 0;
            for (size_t j = 0; j < ids.n; j++) special |= ms_tok_is_special(t, ids.ids[j]);
            CHECK_MSG(rc == 0 && !special, "%s: special id without recognition in \"%.50s\"", k_names[k], x);
            free(dec);
            free(want);
            ms_tok_ids_free(&ids);
        }
        /* random id sequences: stream == batch (U+FFFD placement included) */
        srand(1234 + k);
        int32_t ids[64];
        for (int rep = 0; rep < 200; rep++) {
            for (int j = 0; j < 64; j++) {
                int32_t id;
                size_t l;
                do id = rand() % (int)ms_tok_vocab_size(t);
                while (!ms_tok_token_bytes(t, id, &l));
                ids[j] = id;
            }
            check_stream(t, ids, 64, "random ids");
        }
        /* bad input is an error, not a crash */
        ms_tok_ids v = {0};
        ms_err err = {0};
        CHECK(ms_tok_encode(t, "ok\xff", 3, 0, &v, &err) == MS_ERR_FORMAT);
        CHECK(ms_tok_encode(t, "\xed\xa0\x80", 3, 0, &v, &err) == MS_ERR_FORMAT); /* surrogate */
        int32_t bad[2] = {1, (int32_t)ms_tok_vocab_size(t)};
        char *dec;
        size_t dl;
        CHECK(ms_tok_decode(t, bad, 2, 0, &dec, &dl, &err) == MS_ERR_ARG);
        ms_tok_ids_free(&v);
    }
}

TEST(config_tokens) {
    ms_tokenizer *t = load("deepseek_v3");
    if (t) {
        CHECK(ms_tok_bos_id(t) == 0 && ms_tok_eos_id(t) == 1);
        CHECK(ms_tok_adds_bos(t) && !ms_tok_adds_eos(t));
        CHECK(ms_tok_token_id(t, "<｜begin▁of▁sentence｜>") == 0);
    }
    t = load("qwen3");
    if (t) {
        CHECK(ms_tok_bos_id(t) == -1 && ms_tok_eos_id(t) == 151645 && ms_tok_pad_id(t) == 151643);
        CHECK(!ms_tok_adds_bos(t));
        CHECK(ms_tok_token_id(t, "<|im_start|>") == 151644 && ms_tok_is_special(t, 151644));
        CHECK(ms_tok_token_id(t, "<think>") == 151667 && !ms_tok_is_special(t, 151667));
    }
    t = load("gptoss");
    if (t) {
        CHECK(ms_tok_bos_id(t) == 199998 && ms_tok_eos_id(t) == 200002);
    }
}

/* Base64 (standard alphabet, padded) for the rank file. */
static void b64(const uint8_t *s, size_t n, ms_buf *o) {
    static const char *A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        char q[4] = {A[v >> 18], A[(v >> 12) & 63], i + 1 < n ? A[(v >> 6) & 63] : '=', i + 2 < n ? A[v & 63] : '='};
        ms_buf_add(o, q, 4);
    }
}

/* gpt-oss's ranks as a tiktoken file: every BPE vocab entry, rank = id. */
static char *gptoss_ranks(const ms_tokenizer *g, size_t *len) {
    ms_buf o = {0};
    for (uint32_t id = 0; id < g->bpe.n_ids; id++) {
        if (g->bpe.len[id] == UINT32_MAX) continue;
        b64(g->bpe.blob + g->bpe.off[id], g->bpe.len[id], &o);
        char num[24];
        int k = snprintf(num, sizeof num, " %u\n", id);
        ms_buf_add(&o, num, (size_t)k);
    }
    *len = o.n;
    return (char *)o.p;
}

static char *gptoss_pattern(void) {
    char *data;
    size_t len;
    ms_err err = {0};
    cJSON *j = NULL;
    if (ms_read_file("build/tokenizers/gptoss/tokenizer.json", 1 << 30, &data, &len, &err)) return NULL;
    ms_json_parse(data, len, "gptoss", &j, &err);
    free(data);
    const cJSON *pre = cJSON_GetObjectItem(j, "pre_tokenizer");
    const cJSON *split = cJSON_GetArrayItem(cJSON_GetObjectItem(pre, "pretokenizers"), 0);
    const cJSON *re = cJSON_GetObjectItem(cJSON_GetObjectItem(split, "pattern"), "Regex");
    char *p = cJSON_IsString(re) ? strdup(re->valuestring) : NULL;
    cJSON_Delete(j);
    return p;
}

TEST(tiktoken_from_gptoss_matches_tokenizer_json) {
    ms_tokenizer *g = load("gptoss");
    if (!g) return;
    size_t len;
    char *ranks = gptoss_ranks(g, &len);
    char *pat = gptoss_pattern();
    CHECK(pat != NULL);
    const char *specials[32];
    int32_t sids[32];
    size_t ns = 0;
    for (size_t i = 0; i < g->n_added && ns < 32; i++) specials[ns] = g->added[i].content, sids[ns++] = g->added[i].id;
    ms_tokenizer *t = NULL;
    ms_err err = {0};
    int rc = ms_tok_load_tiktoken(ranks, len, pat ? pat : "x", specials, sids, ns, NULL, 0, &t, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    cJSON *fix = fixture();
    if (t && fix) {
        const cJSON *c;
        int n = 0;
        const cJSON *cases = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(fix, "tokenizers"), "gptoss"), "cases");
        const char *texts[64];
        cJSON_ArrayForEach(c, cases) texts[n++] = cJSON_GetObjectItem(c, "text")->valuestring;
        for (size_t i = 0; i < sizeof k_extra / sizeof *k_extra; i++) texts[n++] = k_extra[i];
        for (int i = 0; i < n; i++) {
            ms_tok_ids a = {0}, b = {0};
            ms_tok_encode(g, texts[i], strlen(texts[i]), MS_TOK_ENCODE_SPECIAL, &a, &err);
            ms_tok_encode(t, texts[i], strlen(texts[i]), MS_TOK_ENCODE_SPECIAL, &b, &err);
            CHECK_MSG(a.n == b.n && (a.n == 0 || memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0), "tiktoken != tokenizer.json on \"%.50s\"",
                      texts[i]);
            ms_tok_ids_free(&a);
            ms_tok_ids_free(&b);
        }
        /* and on every chat render of the other tokenizers (long, varied text) */
        int m = 0;
        for (int k = 0; k < 2; k++) {
            const cJSON *chats = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(fix, "tokenizers"), k_names[k]), "chats");
            cJSON_ArrayForEach(c, chats) {
                const cJSON *r = cJSON_GetObjectItem(c, "rendered");
                if (!cJSON_IsString(r)) continue;
                ms_tok_ids a = {0}, b = {0};
                ms_tok_encode(g, r->valuestring, strlen(r->valuestring), 0, &a, &err);
                ms_tok_encode(t, r->valuestring, strlen(r->valuestring), 0, &b, &err);
                CHECK(a.n == b.n && a.n > 0 && memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0);
                ms_tok_ids_free(&a);
                ms_tok_ids_free(&b);
                m++;
            }
        }
        CHECK(m == 32);
    }
    ms_tok_free(t);
    free(ranks);
    free(pat);
    }

/* A Kimi-style directory (tiktoken.model + tokenizer_config.json as Kimi ships
 * them) over gpt-oss's ranks: specials, bos/eos and the split pattern load. */
TEST(kimi_directory) {
    ms_tokenizer *g = load("gptoss");
    if (!g) return;
    size_t len;
    char *ranks = gptoss_ranks(g, &len);
    size_t nbase = 0;
    for (size_t i = 0; i < len; i++) nbase += ranks[i] == '\n';
    ms_err err = {0};
    mkdir("build/tokenizers/kimi_test", 0755);
    CHECK(ms_write_file_atomic("build/tokenizers/kimi_test/tiktoken.model", ranks, len, &err) == 0);
    char cfg[2048];
    int k = snprintf(cfg, sizeof cfg,
                     "{\"auto_map\": {\"AutoTokenizer\": [\"tokenization_kimi.TikTokenTokenizer\", null]},"
                     " \"tokenizer_class\": \"TikTokenTokenizer\", \"bos_token\": \"[BOS]\","
                     " \"eos_token\": {\"content\": \"[EOS]\", \"__type\": \"AddedToken\"},"
                     " \"added_tokens_decoder\": {\"%zu\": {\"content\": \"[BOS]\", \"special\": true},"
                     " \"%zu\": {\"content\": \"[EOS]\", \"special\": true}, \"%zu\": {\"content\": \"<|im_end|>\", \"special\": true}}}",
                     nbase, nbase + 1, nbase + 4);
    CHECK(ms_write_file_atomic("build/tokenizers/kimi_test/tokenizer_config.json", cfg, (size_t)k, &err) == 0);
    ms_tokenizer *t = NULL;
    int rc = ms_tok_load_dir("build/tokenizers/kimi_test", &t, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (t) {
        CHECK(ms_tok_kind(t) == MS_TOK_KIND_TIKTOKEN);
        CHECK(ms_tok_bos_id(t) == (int32_t)nbase && ms_tok_eos_id(t) == (int32_t)nbase + 1);
        CHECK(ms_tok_vocab_size(t) == nbase + 256);
        char name[64];
        snprintf(name, sizeof name, "<|reserved_token_%zu|>", nbase + 7);
        CHECK(ms_tok_token_id(t, name) == (int32_t)nbase + 7);
        const char *x = "[BOS]中文English混合<|im_end|>";
        ms_tok_ids ids = {0};
        CHECK(ms_tok_encode(t, x, strlen(x), MS_TOK_ENCODE_SPECIAL, &ids, &err) == 0);
        CHECK(ids.n > 3 && ids.ids[0] == (int32_t)nbase && ids.ids[ids.n - 1] == (int32_t)nbase + 4);
        char *dec;
        size_t dl;
        CHECK(ms_tok_decode(t, ids.ids, ids.n, 0, &dec, &dl, &err) == 0 && dl == strlen(x) && !memcmp(dec, x, dl));
        free(dec);
        ids.n = 0;
        CHECK(ms_tok_encode(t, x, strlen(x), 0, &ids, &err) == 0 && ids.ids[0] != (int32_t)nbase);
        ms_tok_ids_free(&ids);
        ms_tok_free(t);
    }
    free(ranks);
    }

/* One tokenizer used from several threads at once (shared word cache) gives
 * every thread the single-threaded answer. */
typedef struct {
    const ms_tokenizer *t;
    int ok;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    a->ok = 1;
    for (int rep = 0; rep < 20; rep++)
        for (size_t i = 0; i < sizeof k_extra / sizeof *k_extra; i++) {
            ms_tok_ids x = {0}, y = {0};
            ms_err err = {0};
            size_t j = (i + (size_t)rep) % (sizeof k_extra / sizeof *k_extra);
            if (ms_tok_encode(a->t, k_extra[j], strlen(k_extra[j]), MS_TOK_ENCODE_SPECIAL, &x, &err) ||
                ms_tok_encode(a->t, k_extra[j], strlen(k_extra[j]), MS_TOK_ENCODE_SPECIAL, &y, &err) || x.n != y.n ||
                memcmp(x.ids, y.ids, x.n * sizeof *x.ids))
                a->ok = 0;
            ms_tok_ids_free(&x);
            ms_tok_ids_free(&y);
        }
    return NULL;
}

TEST(threads_share_one_tokenizer) {
    ms_tokenizer *t = load("qwen3");
    if (!t) return;
    /* reference answers first, single-threaded */
    ms_tok_ids ref[sizeof k_extra / sizeof *k_extra];
    ms_err err = {0};
    for (size_t i = 0; i < sizeof k_extra / sizeof *k_extra; i++) {
        memset(&ref[i], 0, sizeof ref[i]);
        ms_tok_encode(t, k_extra[i], strlen(k_extra[i]), MS_TOK_ENCODE_SPECIAL, &ref[i], &err);
    }
    pthread_t th[4];
    thr_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i].t = t;
        pthread_create(&th[i], NULL, thr_main, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(a[i].ok);
    }
    for (size_t i = 0; i < sizeof k_extra / sizeof *k_extra; i++) {
        ms_tok_ids x = {0};
        ms_tok_encode(t, k_extra[i], strlen(k_extra[i]), MS_TOK_ENCODE_SPECIAL, &x, &err);
        CHECK(x.n == ref[i].n && !memcmp(x.ids, ref[i].ids, x.n * sizeof *x.ids));
        ms_tok_ids_free(&x);
        ms_tok_ids_free(&ref[i]);
    }
}

/* Run build/moonshine with stdin from a file; returns the exit status, output in *out. */
static int run_cli(const char *args, const void *in, size_t n, char **out, size_t *out_n) {
    ms_err err = {0};
    if (ms_write_file_atomic("build/tok_cli_in", in, n, &err)) return -1;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "./build/moonshine %s < build/tok_cli_in 2>/dev/null", args);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t cap = 1 << 20;
    *out = calloc(cap + 1, 1);
    *out_n = fread(*out, 1, cap, f);
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The commands' exact interfaces: tokenize prints the fixture's ids as a JSON
 * array (specials in the text recognized), detokenize writes the text back,
 * invalid UTF-8 and unknown ids exit 1. */
TEST(commands) {
    cJSON *fix = fixture();
    if (!fix || !load("deepseek_v3")) return;
    const cJSON *chat = cJSON_GetArrayItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(fix, "tokenizers"), "deepseek_v3"), "chats"), 4);
    const char *text = cJSON_GetObjectItem(chat, "rendered")->valuestring;
    char *out;
    size_t n;
    int rc = run_cli("tokenize build/tokenizers/deepseek_v3", text, strlen(text), &out, &n);
    cJSON *got = NULL;
    ms_err err = {0};
    CHECK(rc == 0 && ms_json_parse(out, n, "tokenize output", &got, &err) == 0);
    CHECK(cJSON_Compare(got, cJSON_GetObjectItem(chat, "ids"), 1));
    char *ids = cJSON_PrintUnformatted(cJSON_GetObjectItem(chat, "ids"));
    free(out);
    rc = run_cli("detokenize build/tokenizers/deepseek_v3", ids, strlen(ids), &out, &n);
    CHECK(rc == 0 && n == strlen(text) && memcmp(out, text, n) == 0);
    free(out);
    free(ids);
    cJSON_Delete(got);
    CHECK(run_cli("tokenize build/tokenizers/deepseek_v3", "ok\xc3", 3, &out, &n) == 1);
    free(out);
    CHECK(run_cli("detokenize build/tokenizers/deepseek_v3", "[1, 5000000]", 12, &out, &n) == 1);
    free(out);
    CHECK(run_cli("detokenize build/tokenizers/deepseek_v3", "[1, 2.5]", 8, &out, &n) == 1);
    free(out);
}

static void cleanup(void) __attribute__((destructor));
static void cleanup(void) {
    cJSON_Delete(g_fix);
    for (int i = 0; i < 3; i++) ms_tok_free(g_loaded[i]);
}

TEST_MAIN()
