/* Output parsers at their bounds: every format is fed whole, byte by byte and
 * in random chunkings, and all must give the same message (or the same error).
 * Inputs are built around every bounded decision: a tool-call head, harmony
 * header or XTML tag whose marker ends just inside or just past the head
 * window (HEAD_MAX + 1 = 1025 bytes), Qwen3's streamed-layout prefix against
 * that window and against the body's first </tool_call>, buffered blocks just
 * under and over opts.max_block, and a large random mix of every format's
 * markers, their fragments and filler. The property is the contract in
 * outparse.h (streaming yields exactly the whole-string result); the expected
 * calls are the ones the formats' own documentation writes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "outparse_check.h"
#include "test.h"
#include "text/outparse.h"
#include "text/pyjson.h"

#define WINDOW 1025 /* HEAD_MAX + 1 in outparse.c */

typedef struct {
    int st;     /* feed/finish status */
    char *json; /* the message, NULL on error */
} result;

/* chunk: 0 whole, 1 byte by byte, else a seed for random chunk sizes (1..max). */
static result run_parse(ms_outfmt f, const ms_outparse_opts *o, const char *t, size_t n, uint64_t chunk,
                        size_t max) {
    result r = {0};
    ms_outparse *p = NULL;
    ms_err e = {0};
    r.st = ms_outparse_new(f, o, &p, &e);
    if (r.st) return r;
    ms_outmsg *m = ms_outmsg_new();
    r.st = ms_test_outparse_chunked(p, t, n, chunk, chunk | 1, max, ms_outmsg_collect, m, &e);
    if (!r.st) ms_outmsg_json(m, &r.json, &e);
    ms_outmsg_free(m);
    ms_outparse_free(p);
    return r;
}

static int nfail_;

/* Whole, byte by byte and 4 random chunkings agree; returns the whole result. */
static result agree(const char *what, ms_outfmt f, const ms_outparse_opts *o, const char *t, size_t n) {
    result w = run_parse(f, o, t, n, 0, 0);
    for (uint64_t c = 1; c <= 5; c++) {
        result r = run_parse(f, o, t, n, c == 1 ? 1 : c * 0x9E3779B97F4A7C15ull, c == 5 ? 1500 : 1 + c * 3);
        int same = r.st == w.st && (!w.json || (r.json && !strcmp(r.json, w.json)));
        if (!same && nfail_++ < 5) {
            fprintf(stderr, "%s (%s, %zu bytes, chunking %llu):\n  whole %d %.400s\n  split %d %.400s\n", what,
                    ms_outfmt_name(f), n, (unsigned long long)c, w.st, w.json ? w.json : "", r.st,
                    r.json ? r.json : "");
        }
        CHECK(same);
        free(r.json);
    }
    return w;
}

static int has_call(const result *r, const char *name) {
    char want[128];
    snprintf(want, sizeof want, "\"name\":\"%s\"", name);
    return r->json && strstr(r->json, "\"tool_calls\"") && strstr(r->json, want);
}

static char *cat(ms_textbuf *b) { return b->data ? b->data : ""; }

/* head = pre + pad + post, the pad chosen so that post's last byte (the end of
 * the deciding marker) lands at offset `end` of the head window. */
static void build(ms_textbuf *b, const char *open, const char *pre, char padc, const char *post, size_t end,
                  const char *rest) {
    b->len = 0;
    ms_textbuf_puts(b, open);
    ms_textbuf_puts(b, pre);
    size_t fixed = strlen(pre) + strlen(post);
    for (size_t i = fixed; i < end; i++) ms_textbuf_append(b, &padc, 1);
    ms_textbuf_puts(b, post);
    ms_textbuf_puts(b, rest);
}

#define DS_CALLS "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
#define DS_TAIL "<｜tool▁call▁end｜><｜tool▁calls▁end｜> after"

TEST(heads_at_the_window_edge) {
    struct {
        ms_outfmt f;
        const char *open, *pre;
        char pad;
        const char *post, *rest;
    } cases[] = {
        {MS_OUTFMT_DEEPSEEK_V3, DS_CALLS, "function<｜tool▁sep｜>", ' ', "f\n```json\n", "{\"a\": 1}\n```" DS_TAIL},
        /* "```json" ends at the edge, its longer form "```json\n" one past it */
        {MS_OUTFMT_DEEPSEEK_V3, DS_CALLS, "function<｜tool▁sep｜>", ' ', "f\n```json", "\n{\"a\": 1}\n```" DS_TAIL},
        {MS_OUTFMT_DEEPSEEK_V3, DS_CALLS, "function<｜tool▁sep｜>", ' ', "f\n```json", "{\"a\": 1}\n```" DS_TAIL},
        {MS_OUTFMT_DEEPSEEK_V31, DS_CALLS, "", ' ', "f<｜tool▁sep｜>", "{\"a\": 1}" DS_TAIL},
        {MS_OUTFMT_KIMI_K2, "x<|tool_calls_section_begin|><|tool_call_begin|>", "", ' ',
         "functions.f:0<|tool_call_argument_begin|>", "{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|>y"},
        {MS_OUTFMT_GLM, "x<tool_call>", "", '\n', "f<arg_key>", "a</arg_key><arg_value>1</arg_value></tool_call>y"},
        {MS_OUTFMT_GLM, "x<tool_call>", "", '\n', "f</tool_call>", "y"},
        {MS_OUTFMT_HARMONY, "", "<|start|>assistant<|channel|>commentary to=functions.f", ' ',
         "<|constrain|>json<|message|>", "{\"a\": 1}<|call|>"},
        {MS_OUTFMT_HARMONY, "", "<|channel|>final", ' ', "<|message|>", "hello<|return|>"},
        {MS_OUTFMT_XTML, "<|open|>", "call tool=\"f\" index=\"1\"", ' ', "<|sep|>",
         "<|open|>argument key=\"a\" type=\"integer\"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|>"},
        {MS_OUTFMT_XTML, "<|open|>call tool=\"f\"<|sep|><|close|>", "call", ' ', "<|sep|>", "z"},
        {MS_OUTFMT_QWEN3, "x<tool_call>", "", '\n', "{\"name\": \"f\", \"arguments\": {",
         "\"a\": 1}}\n</tool_call>y"},
        /* the body's first </tool_call> right where the value would start */
        {MS_OUTFMT_QWEN3, "x<tool_call>", "", ' ', "{\"name\": \"f\", \"arguments\": ", "</tool_call>y"},
        /* a name string running over a </tool_call> */
        {MS_OUTFMT_QWEN3, "x<tool_call>", "{\"name\": \"f", ' ', "</tool_call>",
         "\", \"arguments\": {}}</tool_call>y"},
    };
    ms_textbuf b = {0};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int calls = 0, plain = 0;
        for (size_t end = WINDOW - 40; end <= WINDOW + 3; end += end < WINDOW - 3 ? 37 : 1) {
            build(&b, cases[c].open, cases[c].pre, cases[c].pad, cases[c].post, end, cases[c].rest);
            char what[64];
            snprintf(what, sizeof what, "head case %zu, marker ends at %zu", c, end);
            ms_outparse_opts o = {.id_seed = 3};
            result r = agree(what, cases[c].f, &o, cat(&b), b.len);
            CHECK_MSG(r.st == MS_OK, "%s: status %d", what, r.st);
            if (has_call(&r, "f")) calls++;
            else plain++;
            /* a call is recognized exactly when its deciding marker ends inside the
             * window; a Qwen3 call in the other layout is still one, buffered whole */
            int want = c == 8 || c == 12 || c == 13 ? 0 : c == 10 || c == 11 ? 1 : end <= WINDOW;
            if (c == 0 && end == WINDOW + 1) want = 1; /* "```json" still fits where "```json\n" does not */
            CHECK_MSG(has_call(&r, "f") == want, "%s: %.300s", what, r.json ? r.json : "");
            if (c == 8) CHECK_MSG(r.json && strstr(r.json, "hello") && (strstr(r.json, "<|message|>") != NULL) == (end > WINDOW),
                                  "%s: %.300s", what, r.json ? r.json : "");
            free(r.json);
        }
        CHECK(calls + plain > 0);
    }
    ms_textbuf_free(&b);
}

typedef struct {
    ms_outmsg *m;
    int bad;
} utf8_check;

static int check_utf8(void *user, const ms_outev *ev) {
    utf8_check *c = user;
    if ((ev->type == MS_OUTEV_CONTENT || ev->type == MS_OUTEV_REASONING) && !ms_test_utf8_ok(ev->text, ev->len)) c->bad++;
    return ms_outmsg_collect(c->m, ev);
}

/* A head given back at the window's edge, cut inside a character: every
 * content delta still holds whole characters (valid UTF-8 in, valid out). */
TEST(head_given_back_inside_a_character) {
    const struct {
        ms_outfmt f;
        const char *open;
    } cases[] = {{MS_OUTFMT_DEEPSEEK_V31, DS_CALLS}, {MS_OUTFMT_KIMI_K2, "<|tool_call_begin|>"},
                 {MS_OUTFMT_GLM, "<tool_call>"}, {MS_OUTFMT_XTML, "<|open|>"}, {MS_OUTFMT_XTML, "<|close|>"},
                 {MS_OUTFMT_HARMONY, "<|channel|>"}, {MS_OUTFMT_QWEN3, "<tool_call>"}};
    const char *chars[] = {"é", "思", "😀"};
    ms_textbuf b = {0};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int k = 0; k < 3; k++)
            for (int shift = 0; shift < 4; shift++) {
                b.len = 0;
                ms_textbuf_puts(&b, cases[c].open);
                for (int i = 0; i < shift; i++) ms_textbuf_puts(&b, "a");
                while (b.len < WINDOW + 40) ms_textbuf_puts(&b, chars[k]);
                char what[64];
                snprintf(what, sizeof what, "utf-8 case %zu/%d/%d", c, k, shift);
                result w = agree(what, cases[c].f, NULL, b.data, b.len);
                free(w.json);
                for (uint64_t chunk = 0; chunk < 3; chunk++) {
                    ms_outparse *p = NULL;
                    ms_err e = {0};
                    utf8_check u = {.m = ms_outmsg_new()};
                    CHECK(ms_outparse_new(cases[c].f, NULL, &p, &e) == MS_OK);
                    size_t step = chunk == 0 ? b.len : chunk == 1 ? 1 : 7;
                    for (size_t i = 0; i < b.len; i += step)
                        CHECK(ms_outparse_feed(p, b.data + i, b.len - i < step ? b.len - i : step, check_utf8, &u,
                                               &e) == MS_OK);
                    CHECK(ms_outparse_finish(p, check_utf8, &u, &e) == MS_OK);
                    CHECK_MSG(u.bad == 0, "%s, chunks of %zu: %d deltas cut a character", what, step, u.bad);
                    ms_outparse_free(p);
                    ms_outmsg_free(u.m);
                }
            }
    ms_textbuf_free(&b);
}

/* Buffered blocks of length max_block - 3 .. max_block + 3, closed and not. */
TEST(blocks_at_max_block) {
    const size_t M = 300;
    struct {
        ms_outfmt f;
        const char *pre, *post;
    } cases[] = {
        {MS_OUTFMT_GLM, "<tool_call>f<arg_key>k</arg_key><arg_value>", "</arg_value></tool_call>z"},
        {MS_OUTFMT_GLM, "<tool_call>f<arg_key>", "</arg_key><arg_value>1</arg_value></tool_call>z"},
        {MS_OUTFMT_GLM, "<tool_call>f<arg_key>k</arg_key><arg_value>1</arg_value>", "</tool_call>z"},
        {MS_OUTFMT_GLM, "<tool_call>f<arg_key>k</arg_key>", "<arg_value>1</arg_value></tool_call>z"},
        {MS_OUTFMT_QWEN3, "<tool_call>{\"arguments\": {}, \"name\": \"f\"", "}</tool_call>z"},
        {MS_OUTFMT_XTML, "<|open|>call tool=\"f\"<|sep|><|open|>argument key=\"k\" type=\"string\"<|sep|>",
         "<|close|>argument<|sep|><|close|>call<|sep|>"},
    };
    ms_textbuf b = {0};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (size_t len = M - 3; len <= M + 3; len++)
            for (int closed = 0; closed < 2; closed++) {
                b.len = 0;
                ms_textbuf_puts(&b, cases[c].pre);
                for (size_t i = 0; i < len; i++) ms_textbuf_append(&b, " ", 1);
                if (closed) ms_textbuf_puts(&b, cases[c].post);
                char what[64];
                snprintf(what, sizeof what, "block case %zu, %zu bytes, %s", c, len, closed ? "closed" : "open");
                ms_outparse_opts o = {.id_seed = 3, .max_block = M};
                result r = agree(what, cases[c].f, &o, cat(&b), b.len);
                /* the block is `len` bytes (the Qwen body: the layout's prefix too) */
                size_t block = len + (cases[c].f == MS_OUTFMT_QWEN3 ? strlen(cases[c].pre) - 11 : 0);
                CHECK_MSG((r.st == MS_ERR_LIMIT) == (block > M), "%s: status %d", what, r.st);
                if (r.st == MS_OK && closed) CHECK_MSG(has_call(&r, "f"), "%s: %s", what, r.json);
                free(r.json);
            }
    ms_textbuf_free(&b);
}

/* Random mixtures of every format's markers, their fragments and filler. */
static const char *pieces[] = {
    "<think>", "</think>", "◁think▷", "◁/think▷", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "function", "```json\n", "```json", "\n```",
    "```", "<|tool_calls_section_begin|>", "<|tool_call_section_begin|>", "<|tool_calls_section_end|>",
    "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>", "functions.f:0", "<tool_call>",
    "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "{\"name\": \"f\", \"arguments\": ",
    "{\"arguments\": {\"a\": 1}, \"name\": \"g\"}", "{\"a\": [1, \"}\"]}", "}", "{", "\"", ":", ",", "\\",
    "<|start|>", "assistant", "<|channel|>", "analysis", "final", "commentary", " to=functions.f ",
    "<|constrain|>json", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|open|>", "<|close|>", "<|sep|>",
    "<|end_of_msg|>", "think", "response", "tools", "call tool=\"f\" index=\"1\"", "argument key=\"k\" type=\"string\"",
    "argument key=\"n\" type=\"integer\"", "json type=\"object\"", "call", "argument", "json", " ", "\n", "x", "é",
    "😀", "\xE2", "\x97", "<", "|", "｜", "<|", "</", "<｜",
};
#define NPIECES (sizeof pieces / sizeof *pieces)

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

TEST(random_mixtures_agree) {
    uint64_t s = 0x243F6A8885A308D3ull;
    ms_textbuf b = {0};
    int n = 0;
    for (int f = 0; f < MS_OUTFMT_COUNT; f++)
        for (int k = 0; k < 600; k++) {
            b.len = 0;
            int np = 1 + rng(&s) % 40;
            for (int i = 0; i < np; i++) {
                uint64_t r = rng(&s);
                if (r % 53 == 0) { /* filler that carries a head across its window */
                    size_t fl = WINDOW - 60 + rng(&s) % 120;
                    for (size_t j = 0; j < fl; j++) ms_textbuf_append(&b, r & 64 ? " " : "a", 1);
                } else if (r % 7 == 0) { /* a fragment of a piece */
                    const char *pc = pieces[rng(&s) % NPIECES];
                    ms_textbuf_append(&b, pc, rng(&s) % (strlen(pc) + 1));
                } else {
                    ms_textbuf_puts(&b, pieces[r % NPIECES]);
                }
            }
            uint64_t r = rng(&s);
            ms_outparse_opts o = {.id_seed = 5, .start_in_reasoning = (r >> 8) & 1, .max_block = 64 + r % 2000};
            if ((r >> 9) & 1) o.reasoning_open = "◁think▷", o.reasoning_close = "◁/think▷";
            if (((r >> 10) & 7) == 0) o.reasoning_open = "x<tool_call>", o.reasoning_close = "</tool_call>x";
            if ((r >> 13) & 1)
                o.tools_json = "[{\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{\"k\":{\"type\":\"string\"}}}}}]";
            char what[48];
            snprintf(what, sizeof what, "mixture %d", k);
            result w = agree(what, (ms_outfmt)f, &o, cat(&b), b.len);
            CHECK(w.st == MS_OK || w.st == MS_ERR_LIMIT);
            free(w.json);
            n++;
        }
    CHECK(n == 600 * MS_OUTFMT_COUNT);
    ms_textbuf_free(&b);
}

/* One feed of text far larger than a slice parses as the text split small. */
TEST(large_feed_matches_small_feeds) {
    ms_textbuf b = {0};
    ms_textbuf_puts(&b, "<think>");
    for (int i = 0; i < 30000; i++) ms_textbuf_puts(&b, i % 1000 == 999 ? "</think><think>" : "reason ");
    ms_textbuf_puts(&b, "</think>answer<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"");
    for (int i = 0; i < 30000; i++) ms_textbuf_puts(&b, "arg é ");
    ms_textbuf_puts(&b, "\"}}\n</tool_call>");
    ms_outparse_opts o = {.id_seed = 9};
    result w = run_parse(MS_OUTFMT_QWEN3, &o, b.data, b.len, 0, 0);
    result r = run_parse(MS_OUTFMT_QWEN3, &o, b.data, b.len, 77, 4000);
    CHECK(w.st == MS_OK && r.st == MS_OK && w.json && r.json && !strcmp(w.json, r.json));
    CHECK(has_call(&w, "f"));
    free(w.json);
    free(r.json);
    ms_textbuf_free(&b);
}

TEST_MAIN()
