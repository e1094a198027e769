/* test_canon.c — canonical token history (session/generate.h ms_gen_align) on the real
 * tokenizers, for every output format we parse (tests/data/outparse_cases.json): a reply
 * kept as the ids it was generated with (plain text in 2-character pieces, specials whole:
 * other ids than a whole re-tokenization, the same bytes) is matched whole when the next
 * render writes it again, and up to the first real difference when the template changes
 * it (drops the reasoning). */
#include <cjson/cJSON.h>

#include "session/generate.h"
#include "text/outparse.h"
#include "text/tokenizer.h"
#include "util/fs.h"
#include "test.h"

static ms_tokenizer *load(const char *name) {
    char dir[256], cmd[2048];
    snprintf(dir, sizeof dir, "build/tokenizers/%s", name);
    snprintf(cmd, sizeof cmd,
             "test -f %s/tokenizer.json -a -f %s/tokenizer_config.json || { mkdir -p %s && gzip -dc "
             "tests/data/tokenizers/%s/tokenizer.json.gz > %s/tokenizer.json.tmp.$$ && mv %s/tokenizer.json.tmp.$$ "
             "%s/tokenizer.json && cp tests/data/tokenizers/%s/tokenizer_config.json %s/; }",
             dir, dir, dir, name, dir, dir, dir, name, dir);
    CHECK(system(cmd) == 0);
    ms_tokenizer *t = NULL;
    ms_err err = {0};
    CHECK_MSG(ms_tok_load_dir(dir, &t, &err) == 0, "%s: %s", name, err.msg);
    return t;
}

static void enc(const ms_tokenizer *t, const char *s, size_t n, int flags, ms_tok_ids *out) {
    ms_err err = {0};
    CHECK_MSG(ms_tok_encode(t, s, n, flags, out, &err) == 0, "%s", err.msg);
}

/* "generated" ids of text: its whole tokenization, with every run of plain tokens re-encoded in
 * pieces of 2 UTF-8 characters (specials whole, as sampled) */
static void generated(const ms_tokenizer *t, const char *text, ms_tok_ids *out) {
    ms_tok_ids w = {0};
    enc(t, text, strlen(text), MS_TOK_ENCODE_SPECIAL, &w);
    char run[8192];
    size_t rl = 0;
    for (size_t i = 0; i <= w.n; i++) {
        if (i < w.n && !ms_tok_is_special(t, w.ids[i])) {
            size_t l;
            const uint8_t *b = ms_tok_token_bytes(t, w.ids[i], &l);
            if (rl + l < sizeof run) memcpy(run + rl, b, l), rl += l;
            continue;
        }
        for (size_t k = 0; k < rl;) { /* 2 characters at a time */
            size_t e = k, chars = 0;
            while (e < rl && chars < 2) {
                e++;
                while (e < rl && ((uint8_t)run[e] & 0xC0) == 0x80) e++;
                chars++;
            }
            enc(t, run + k, e - k, 0, out);
            k = e;
        }
        rl = 0;
        if (i < w.n) {
            ms_tok_ids one = {.ids = &w.ids[i], .n = 1};
            enc(t, "", 0, 0, out); /* keep out allocated */
            if (out->n == out->cap) { out->cap = out->cap ? out->cap * 2 : 64; out->ids = realloc(out->ids, out->cap * 4); }
            out->ids[out->n++] = one.ids[0];
        }
    }
    ms_tok_ids_free(&w);
}

static size_t bytes_of(const ms_tokenizer *t, const int32_t *ids, int n) {
    size_t s = 0, l;
    for (int i = 0; i < n; i++) ms_tok_token_bytes(t, ids[i], &l), s += l;
    return s;
}

static int same_bytes(const ms_tokenizer *t, const int32_t *a, int na, const char *text, size_t tl) {
    size_t off = 0, l;
    for (int i = 0; i < na; i++) {
        const uint8_t *b = ms_tok_token_bytes(t, a[i], &l);
        if (off + l > tl || memcmp(b, text + off, l)) return 0;
        off += l;
    }
    return off == tl;
}

TEST(align_basics) {
    int a[] = {1, 2, 3, 4}, b[] = {1, 2, 9}, i, j;
    ms_gen_align(NULL, a, 4, b, 3, &i, &j);
    CHECK(i == 2 && j == 2);
    ms_gen_align(NULL, a, 4, a, 4, &i, &j);
    CHECK(i == 4 && j == 4);
}

TEST(every_output_format) {
    char *data;
    size_t len;
    ms_err err = {0};
    CHECK(ms_read_file("tests/data/outparse_cases.json", 1 << 24, &data, &len, &err) == 0);
    cJSON *cases = cJSON_Parse(data);
    free(data);
    CHECK(cJSON_IsArray(cases));
    ms_tokenizer *qwen = load("qwen3"), *ds = load("deepseek_v3"), *oss = load("gptoss");
    int formats_seen[MS_OUTFMT_COUNT] = {0}, n_cases = 0, differed = 0, dropped = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *fname = cJSON_GetObjectItem(c, "format")->valuestring;
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        ms_outfmt f;
        CHECK(ms_outfmt_from_name(fname, &f, &err) == 0);
        const ms_tokenizer *t = f == MS_OUTFMT_DEEPSEEK_V3 || f == MS_OUTFMT_DEEPSEEK_V31 ? ds : f == MS_OUTFMT_HARMONY ? oss : qwen;
        const char *head = f == MS_OUTFMT_HARMONY ? "<|start|>user<|message|>What is 6x7?<|end|><|start|>assistant"
                           : t == ds ? "<｜begin▁of▁sentence｜><｜User｜>What is 6x7?<｜Assistant｜>"
                                     : "<|im_start|>user\nWhat is 6x7?<|im_end|>\n<|im_start|>assistant\n";
        const char *tail = f == MS_OUTFMT_HARMONY ? "<|end|><|start|>user<|message|>And 7x8?<|end|><|start|>assistant"
                           : t == ds ? "<｜end▁of▁sentence｜><｜User｜>And 7x8?<｜Assistant｜>"
                                     : "<|im_end|>\n<|im_start|>user\nAnd 7x8?<|im_end|>\n<|im_start|>assistant\n";
        /* the history: the prompt's ids, then the reply as generated */
        ms_tok_ids h = {0}, p = {0}, whole = {0};
        enc(t, head, strlen(head), MS_TOK_ENCODE_SPECIAL, &h);
        int n_head = (int)h.n;
        generated(t, text, &h);
        enc(t, text, strlen(text), MS_TOK_ENCODE_SPECIAL, &whole);
        differed += whole.n != h.n - (size_t)n_head || memcmp(whole.ids, h.ids + n_head, whole.n * 4);
        CHECK_MSG(bytes_of(t, h.ids + n_head, (int)h.n - n_head) == strlen(text), "%s", cJSON_GetObjectItem(c, "name")->valuestring);
        /* the next render writes the reply again, then the next user turn */
        size_t rl = strlen(head) + strlen(text) + strlen(tail);
        char *r = malloc(rl + 1);
        snprintf(r, rl + 1, "%s%s%s", head, text, tail);
        enc(t, r, rl, MS_TOK_ENCODE_SPECIAL, &p);
        int i, j;
        ms_gen_align(t, h.ids, (int)h.n, p.ids, (int)p.n, &i, &j);
        CHECK_MSG(i == (int)h.n, "%s: %d of %zu history tokens matched", cJSON_GetObjectItem(c, "name")->valuestring, i, h.n);
        /* the canonical prompt is the same text */
        int nc = i + (int)p.n - j;
        int32_t *cp = malloc(sizeof *cp * (size_t)nc);
        memcpy(cp, h.ids, sizeof *cp * (size_t)i);
        memcpy(cp + i, p.ids + j, sizeof *cp * (size_t)(p.n - j));
        CHECK(same_bytes(t, cp, nc, r, rl));
        free(cp);
        free(r);
        /* a template that drops the reasoning: reuse goes to the first real difference, no further */
        const char *content = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "expect"), "content")->valuestring;
        const char *reasoning = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "expect"), "reasoning")->valuestring;
        if (content && reasoning && *reasoning) {
            ms_tok_ids p2 = {0};
            rl = strlen(head) + strlen(content) + strlen(tail);
            r = malloc(rl + 1);
            snprintf(r, rl + 1, "%s%s%s", head, content, tail);
            enc(t, r, rl, MS_TOK_ENCODE_SPECIAL, &p2);
            ms_gen_align(t, h.ids, (int)h.n, p2.ids, (int)p2.n, &i, &j);
            size_t hb = bytes_of(t, h.ids, (int)h.n), mb = bytes_of(t, h.ids, i), lcp = 0;
            char *hs = malloc(hb + 1);
            for (int k = 0, o = 0; k < (int)h.n; k++) {
                size_t l;
                const uint8_t *b = ms_tok_token_bytes(t, h.ids[k], &l);
                memcpy(hs + o, b, l), o += (int)l;
            }
            while (lcp < hb && lcp < rl && hs[lcp] == r[lcp]) lcp++;
            CHECK_MSG(mb <= lcp && i >= n_head - 1 && bytes_of(t, p2.ids, j) == mb, "%s: %zu bytes reused, %zu in common",
                      cJSON_GetObjectItem(c, "name")->valuestring, mb, lcp);
            /* no later boundary of both within the common bytes */
            size_t ob = 0;
            int next_boundary = 0;
            for (int k = 0; k < (int)h.n; k++) {
                size_t l;
                ms_tok_token_bytes(t, h.ids[k], &l);
                ob += l;
                if (ob > mb && ob <= lcp)
                    for (int q = 0; q <= (int)p2.n; q++)
                        if (bytes_of(t, p2.ids, q) == ob) next_boundary = 1;
            }
            CHECK_MSG(!next_boundary, "%s: stopped early", cJSON_GetObjectItem(c, "name")->valuestring);
            dropped++;
            free(hs);
            free(r);
            ms_tok_ids_free(&p2);
        }
        formats_seen[f] = 1;
        n_cases++;
        ms_tok_ids_free(&h);
        ms_tok_ids_free(&p);
        ms_tok_ids_free(&whole);
    }
    for (int f = 0; f < MS_OUTFMT_COUNT; f++)
        CHECK_MSG(f == MS_OUTFMT_THINK || formats_seen[f], "format %s has no case", ms_outfmt_name(f));
    CHECK(differed > n_cases / 2); /* the generated ids really differ from a re-tokenization */
    CHECK(dropped >= 5);
    printf("canon: %d cases, %d with other ids than a re-tokenization, %d reasoning drops\n", n_cases, differed, dropped);
    cJSON_Delete(cases);
    ms_tok_free(qwen);
    ms_tok_free(ds);
    ms_tok_free(oss);
}

TEST_MAIN()
