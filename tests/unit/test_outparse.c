/* Output parsers: texts rendered by the official chat templates (through
 * python3-jinja2 by tools/refs/outparse_reference.py, whose output is
 * tests/data/outparse_cases.json) parse back into the
 * messages they came from; whole-string, byte-by-byte and random-chunk
 * streaming agree exactly; malformed and truncated texts keep their content. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "outparse_check.h"
#include "test.h"
#include "text/outparse.h"
#include "text/pyjson.h"
#include "text/xtml.h"
#include "util/fs.h"

#define REF_FILE "tests/data/outparse_cases.json"

typedef struct {
    ms_outmsg *m;
    int bad_utf8, bad_order, open_call;
} checker;

static int check_ev(void *user, const ms_outev *ev) {
    checker *c = user;
    if ((ev->type == MS_OUTEV_CONTENT || ev->type == MS_OUTEV_REASONING) && !ms_test_utf8_ok(ev->text, ev->len))
        c->bad_utf8++;
    if (ev->type == MS_OUTEV_TOOL_START) c->bad_order += c->open_call, c->open_call = 1;
    if (ev->type == MS_OUTEV_TOOL_ARGS) c->bad_order += !c->open_call;
    if (ev->type == MS_OUTEV_TOOL_END) c->bad_order += !c->open_call, c->open_call = 0;
    return ms_outmsg_collect(c->m, ev);
}

/* Parse text fed in chunks: chunk = 0 whole, 1 byte by byte, else random sizes from that seed. */
static char *parse_chunked(ms_outfmt f, const ms_outparse_opts *o, const char *t, size_t n, uint64_t chunk,
                           int *bad) {
    ms_outparse *p = NULL;
    ms_err e = {0};
    if (ms_outparse_new(f, o, &p, &e)) return NULL;
    checker c = {.m = ms_outmsg_new()};
    int st = ms_test_outparse_chunked(p, t, n, chunk, chunk, 7, check_ev, &c, &e);
    char *js = NULL;
    if (!st) ms_outmsg_json(c.m, &js, &e);
    if (bad) *bad = c.bad_utf8 + c.bad_order + c.open_call;
    ms_outmsg_free(c.m);
    ms_outparse_free(p);
    return js;
}

static void strip(const char **s, size_t *n) {
    while (*n && strchr(" \t\r\n", (*s)[0])) (*s)++, (*n)--;
    while (*n && strchr(" \t\r\n", (*s)[*n - 1])) (*n)--;
}

static int same_stripped(const ms_py *got, const ms_py *want) {
    const char *a = got && got->type == MS_PY_STR ? got->s : "", *b = want && want->type == MS_PY_STR ? want->s : "";
    size_t al = got && got->type == MS_PY_STR ? got->slen : 0, bl = want && want->type == MS_PY_STR ? want->slen : 0;
    strip(&a, &al);
    strip(&b, &bl);
    return al == bl && memcmp(a, b, al) == 0;
}

static char *canon(ms_py *v) {
    ms_textbuf b = {0};
    ms_py_deep_sort(v);
    ms_py_dumps(&b, v, 1);
    return b.data;
}

TEST(template_rendered_outputs_parse_back) {
    size_t len = 0;
    char *out = NULL;
    ms_err e = {0};
    CHECK_MSG(ms_read_file(REF_FILE, 1 << 24, &out, &len, &e) == MS_OK, "%s", e.msg);
    if (!out) return;
    ms_py *cases = NULL;
    CHECK(ms_py_parse(out, len, 64, "reference cases", &cases, &e) == MS_OK);
    if (!cases) {
        free(out);
        return;
    }
    CHECK(cases->n >= 35);
    int per_fmt[MS_OUTFMT_COUNT] = {0};
    for (size_t i = 0; i < cases->n; i++) {
        const ms_py *c = cases->items[i];
        const char *name = ms_py_get(c, "name")->s;
        ms_outfmt f;
        CHECK(ms_outfmt_from_name(ms_py_get(c, "format")->s, &f, &e) == MS_OK);
        per_fmt[f]++;
        const ms_py *text = ms_py_get(c, "text");
        ms_outparse_opts o = {.start_in_reasoning = ms_py_truthy(ms_py_get(c, "start_in_reasoning")),
                              .id_seed = 7};
        int bad = 0;
        char *whole = parse_chunked(f, &o, text->s, text->slen, 0, &bad);
        CHECK_MSG(whole != NULL && bad == 0, "%s: whole-string parse failed or misordered events", name);
        if (!whole) continue;
        for (uint64_t chunk = 1; chunk < 6; chunk++) {
            char *js = parse_chunked(f, &o, text->s, text->slen, chunk == 1 ? 1 : chunk * 0x9E3779B9u, &bad);
            CHECK_MSG(js && !strcmp(js, whole) && bad == 0, "%s: chunked (%llu) differs:\n  %s\n  %s", name,
                      (unsigned long long)chunk, js ? js : "(null)", whole);
            free(js);
        }
        ms_py *got = NULL;
        CHECK(ms_py_parse(whole, strlen(whole), 64, "parsed", &got, &e) == MS_OK);
        const ms_py *want = ms_py_get(c, "expect");
        CHECK_MSG(same_stripped(ms_py_get(got, "content"), ms_py_get(want, "content")), "%s content: %s", name,
                  whole);
        CHECK_MSG(same_stripped(ms_py_get(got, "reasoning_content"), ms_py_get(want, "reasoning")),
                  "%s reasoning: %s", name, whole);
        const ms_py *gc = ms_py_get(got, "tool_calls"), *wc = ms_py_get(want, "tool_calls");
        size_t gn = gc ? gc->n : 0;
        CHECK_MSG(gn == wc->n, "%s: %zu tool calls, want %zu: %s", name, gn, wc->n, whole);
        for (size_t k = 0; k < gn && k < wc->n; k++) {
            const ms_py *g = gc->items[k], *w = wc->items[k];
            const ms_py *fn = ms_py_get(g, "function");
            CHECK(ms_py_str_eq(ms_py_get(g, "type"), "function"));
            const ms_py *id = ms_py_get(g, "id");
            CHECK(id && id->type == MS_PY_STR && id->slen > 0);
            if (ms_py_get(w, "id")) CHECK_MSG(ms_py_str_eq(id, ms_py_get(w, "id")->s), "%s: id", name);
            CHECK_MSG(ms_py_str_eq(ms_py_get(fn, "name"), ms_py_get(w, "name")->s), "%s: name", name);
            const ms_py *as = ms_py_get(fn, "arguments");
            const ms_py *raw = ms_py_get(w, "arguments_raw");
            if (raw) {
                CHECK_MSG(as && as->slen == raw->slen && !memcmp(as->s, raw->s, raw->slen), "%s: raw arguments", name);
                continue;
            }
            ms_py *args = NULL;
            int ok = as && as->type == MS_PY_STR && ms_py_parse(as->s, as->slen, 64, "args", &args, &e) == MS_OK;
            CHECK_MSG(ok, "%s: arguments are not JSON: %s", name, as ? as->s : "(none)");
            if (ok) {
                ms_py *wa = ms_py_copy(ms_py_get(w, "arguments"));
                char *x = canon(args), *y = canon(wa);
                CHECK_MSG(!strcmp(x, y), "%s: arguments %s, want %s", name, x, y);
                free(x);
                free(y);
                ms_py_free(wa);
            }
            ms_py_free(args);
        }
        ms_py_free(got);
        /* every prefix (a generation cut anywhere) parses without error */
        for (size_t cut = 0; cut < text->slen; cut += 1 + cut / 16) {
            while (cut < text->slen && (text->s[cut] & 0xC0) == 0x80) cut++; /* whole characters */
            char *js = parse_chunked(f, &o, text->s, cut, 3, &bad);
            CHECK_MSG(js && bad == 0, "%s: prefix %zu failed", name, cut);
            free(js);
        }
        free(whole);
    }
    for (int f = 1; f < MS_OUTFMT_COUNT; f++) CHECK_MSG(per_fmt[f] >= 5, "format %s has %d cases", ms_outfmt_name(f), per_fmt[f]);
    ms_py_free(cases);
    free(out);
}

/* One parse, returned as JSON (whole and byte-by-byte must agree). */
static char *parse(ms_outfmt f, const ms_outparse_opts *o, const char *t) {
    char *a = parse_chunked(f, o, t, strlen(t), 0, NULL);
    char *b = parse_chunked(f, o, t, strlen(t), 1, NULL);
    CHECK_MSG(a && b && !strcmp(a, b), "whole vs byte-by-byte for %s:\n  %s\n  %s", t, a ? a : "", b ? b : "");
    free(b);
    return a;
}

static void expect(ms_outfmt f, const ms_outparse_opts *o, const char *text, const char *want) {
    char *got = parse(f, o, text);
    CHECK_MSG(got && !strcmp(got, want), "%s: %s\n  got  %s\n  want %s", ms_outfmt_name(f), text,
              got ? got : "(null)", want);
    free(got);
}

TEST(malformed_keeps_content) {
    ms_outparse_opts o = {.id_seed = 1};
    expect(MS_OUTFMT_QWEN3, &o, "a <tool_call>not json</tool_call> b",
           "{\"role\":\"assistant\",\"content\":\"a <tool_call>not json</tool_call> b\"}");
    expect(MS_OUTFMT_QWEN3, &o, "text <tool_call", "{\"role\":\"assistant\",\"content\":\"text <tool_call\"}");
    expect(MS_OUTFMT_QWEN3, &o, "x <tool", "{\"role\":\"assistant\",\"content\":\"x <tool\"}");
    expect(MS_OUTFMT_THINK, &o, "<think>unfinished", "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"unfinished\"}");
    expect(MS_OUTFMT_THINK, &o, "a</think>b", "{\"role\":\"assistant\",\"content\":\"a</think>b\"}");
    expect(MS_OUTFMT_GLM, &o, "<tool_call>two words<arg_key>k</arg_key></tool_call>",
           "{\"role\":\"assistant\",\"content\":\"<tool_call>two words<arg_key>k</arg_key></tool_call>\"}");
    expect(MS_OUTFMT_HARMONY, &o, "plain text, no header", "{\"role\":\"assistant\",\"content\":\"plain text, no header\"}");
    expect(MS_OUTFMT_DEEPSEEK_V31, &o, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁call▁end｜>",
           "{\"role\":\"assistant\",\"content\":\"<｜tool▁call▁begin｜>f<｜tool▁call▁end｜>\"}");
    expect(MS_OUTFMT_KIMI_K2, &o, "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\":",
           "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"functions.f:0\",\"type\":\"function\","
           "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":\"}}]}");
    /* an unterminated harmony tool call still ends */
    char *js = parse(MS_OUTFMT_HARMONY, &o, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"x\": 1}");
    CHECK(js && strstr(js, "\"name\":\"f\"") && strstr(js, "{\\\"x\\\": 1}"));
    free(js);
    /* a Qwen body in another key order is still a call, once it is complete */
    js = parse(MS_OUTFMT_QWEN3, &o, "<tool_call>{\"arguments\": {\"q\": 1}, \"name\": \"s\"}</tool_call>");
    CHECK(js && strstr(js, "\"name\":\"s\"") && strstr(js, "{\\\"q\\\": 1}"));
    free(js);
}

TEST(reasoning_markers_and_prompt_detection) {
    ms_outparse_opts kimi = {.reasoning_open = "◁think▷", .reasoning_close = "◁/think▷"};
    expect(MS_OUTFMT_THINK, &kimi, "◁think▷思考◁/think▷答え",
           "{\"role\":\"assistant\",\"content\":\"答え\",\"reasoning_content\":\"思考\"}");
    const char *p1 = "<|im_start|>assistant\n<think>\n";
    CHECK(ms_outparse_prompt_opens_reasoning(p1, strlen(p1), NULL) == 1);
    const char *p2 = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    CHECK(ms_outparse_prompt_opens_reasoning(p2, strlen(p2), NULL) == 0);
    ms_outparse_opts open = {.start_in_reasoning = 1};
    expect(MS_OUTFMT_DEEPSEEK_V31, &open, "r</think>c", "{\"role\":\"assistant\",\"content\":\"c\",\"reasoning_content\":\"r\"}");
    ms_outfmt f;
    ms_err e = {0};
    CHECK(ms_outfmt_from_name("nope", &f, &e) == MS_ERR_ARG && strstr(e.msg, "qwen3"));
}

/* Qwen3's template writes "\n" between non-empty content and the first <tool_call>:
 * that newline is not content (test_outparse_roundtrip renders it back); only one. */
TEST(qwen3_newline_before_tool_call) {
    ms_outparse_opts o = {.id_seed = 1};
    const char *call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    const char *tail = ",\"tool_calls\":[{\"id\":\"call_910a2dec89025cc1beeb8da1\",\"type\":\"function\","
                       "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}";
    char text[256], want[512];
    snprintf(text, sizeof text, "Checking.\n%s", call);
    snprintf(want, sizeof want, "{\"role\":\"assistant\",\"content\":\"Checking.\"%s", tail);
    expect(MS_OUTFMT_QWEN3, &o, text, want);
    snprintf(text, sizeof text, "Checking.\n\n%s", call);
    snprintf(want, sizeof want, "{\"role\":\"assistant\",\"content\":\"Checking.\\n\"%s", tail);
    expect(MS_OUTFMT_QWEN3, &o, text, want);
    /* not a call: the newline goes back with the marker */
    expect(MS_OUTFMT_QWEN3, &o, "a\n<tool_call>not json</tool_call>",
           "{\"role\":\"assistant\",\"content\":\"a\\n<tool_call>not json</tool_call>\"}");
    /* a newline at the end stays content */
    expect(MS_OUTFMT_QWEN3, &o, "a\n", "{\"role\":\"assistant\",\"content\":\"a\\n\"}");
}

TEST(glm_schema_decides_string_values) {
    ms_outparse_opts o = {.tools_json = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                                        "{\"type\":\"object\",\"properties\":{\"zip\":{\"type\":\"string\"},"
                                        "\"n\":{\"type\":\"integer\"}}}}}]"};
    char *js = parse(MS_OUTFMT_GLM, &o, "<tool_call>f<arg_key>zip</arg_key><arg_value>02134</arg_value>"
                                        "<arg_key>n</arg_key><arg_value>7</arg_value><arg_key>s</arg_key>"
                                        "<arg_value>true</arg_value></tool_call>");
    CHECK_MSG(js && strstr(js, "{\\\"zip\\\": \\\"02134\\\", \\\"n\\\": 7, \\\"s\\\": true}"), "%s", js);
    free(js);
}

/* Which prompts open reasoning, per format: K3's generation prompt as the XTML
 * renderer (checked against encoding_k3.py in test_xtml) writes it, thinking
 * on and off; harmony never; the others by their markers. */
TEST(format_prompt_opens_reasoning) {
    const char *req[2] = {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"add_generation_prompt\":true}",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"add_generation_prompt\":true,"
                          "\"chat_template_kwargs\":{\"thinking\":false}}"};
    for (int k = 0; k < 2; k++) {
        char *out = NULL;
        size_t len = 0;
        ms_err e = {0};
        CHECK(ms_xtml_render(req[k], strlen(req[k]), &out, &len, &e) == MS_OK);
        if (!out) continue;
        CHECK_MSG(ms_outfmt_prompt_opens_reasoning(MS_OUTFMT_XTML, out, len, NULL) == (k == 0), "K3 prompt %d", k);
        CHECK(ms_outfmt_prompt_opens_reasoning(MS_OUTFMT_QWEN3, out, len, NULL) == 0);
        /* and the parser started that way takes the reasoning as reasoning */
        ms_outparse_opts o = {.start_in_reasoning = ms_outfmt_prompt_opens_reasoning(MS_OUTFMT_XTML, out, len, NULL)};
        char *js = NULL;
        const char *gen = k == 0 ? "hmm<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|>"
                                 : "ok<|close|>response<|sep|>";
        CHECK(ms_outparse_all(MS_OUTFMT_XTML, &o, gen, strlen(gen), &js, &e) == MS_OK);
        CHECK_MSG(js && strstr(js, "\"content\":\"ok\"") && (strstr(js, "\"reasoning_content\":\"hmm\"") != NULL) == (k == 0),
                  "%s", js ? js : "");
        free(js);
        free(out);
    }
    const char *h = "<|start|>user<|message|>hi<|end|><|start|>assistant";
    CHECK(ms_outfmt_prompt_opens_reasoning(MS_OUTFMT_HARMONY, h, strlen(h), NULL) == 0);
    const char *q = "<|im_start|>assistant\n<think>\n";
    CHECK(ms_outfmt_prompt_opens_reasoning(MS_OUTFMT_QWEN3, q, strlen(q), NULL) == 1);
    CHECK(ms_outfmt_prompt_opens_reasoning(MS_OUTFMT_HARMONY, q, strlen(q), NULL) == 0);
}

static int count_args(void *user, const ms_outev *ev) {
    if (ev->type == MS_OUTEV_TOOL_ARGS) *(size_t *)user += ev->len;
    return 0;
}

/* Arguments stream while they are generated (not only at the end of the call),
 * and a long argument does not make the parser rescan what it holds. */
TEST(arguments_stream_early) {
    const ms_outfmt fmts[] = {MS_OUTFMT_QWEN3, MS_OUTFMT_KIMI_K2, MS_OUTFMT_HARMONY, MS_OUTFMT_DEEPSEEK_V31};
    const char *heads[] = {"<tool_call>\n{\"name\": \"w\", \"arguments\": {\"a\": {\"b\": 1}, \"c\": \"",
                           "<|tool_calls_section_begin|><|tool_call_begin|>functions.w:0<|tool_call_argument_begin|>{\"c\": \"",
                           "<|channel|>commentary to=functions.w <|constrain|>json<|message|>{\"c\": \"",
                           "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>w<｜tool▁sep｜>{\"c\": \""};
    for (int f = 0; f < 4; f++) {
        ms_outparse *p = NULL;
        ms_err e = {0};
        CHECK(ms_outparse_new(fmts[f], NULL, &p, &e) == MS_OK);
        size_t got = 0;
        CHECK(ms_outparse_feed(p, heads[f], strlen(heads[f]), count_args, &got, &e) == MS_OK);
        int bad = 0;
        for (int i = 0; i < 200000; i++) bad |= ms_outparse_feed(p, "x", 1, count_args, &got, &e) != MS_OK;
        CHECK(!bad);
        CHECK_MSG(got >= 200000, "%s: only %zu argument bytes out before the call ended", ms_outfmt_name(fmts[f]), got);
        ms_outparse_free(p);
    }
}

static int stop_cb(void *user, const ms_outev *ev) { return ev->type == MS_OUTEV_TOOL_START ? 42 : 0; }

TEST(callback_can_stop) {
    ms_outparse *p = NULL;
    ms_err e = {0};
    CHECK(ms_outparse_new(MS_OUTFMT_QWEN3, NULL, &p, &e) == MS_OK);
    const char *t = "<tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call>";
    CHECK(ms_outparse_feed(p, t, strlen(t), stop_cb, NULL, &e) == 42);
    CHECK(ms_outparse_feed(p, "x", 1, stop_cb, NULL, &e) != MS_OK);
    ms_outparse_free(p);
}

TEST_MAIN()
