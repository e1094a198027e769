/* The server's API layer without HTTP: request validation (accepted fields land
 * in range, refusals name the parameter), the chat-template request built from
 * messages (content parts joined, developer -> system, tools kept unless
 * tool_choice "none"), and responses: for texts of every case that
 * tools/refs/outparse_reference.py rendered with the official templates
 * (tests/data/outparse_cases.json), the
 * streamed chunks reassemble to the non-streamed message, which equals the
 * output parser's own whole-text message. */
#include <cjson/cJSON.h>
#include <stdio.h>

#include "server/api.h"
#include "text/chat_template.h"
#include "test.h"
#include "util/fs.h"

static int parse(ms_api_kind k, const char *body, ms_api_request *r, ms_api_error *e) {
    return ms_api_parse_request(k, body, strlen(body), 1000, r, e);
}

TEST(request_fields) {
    ms_api_request r;
    ms_api_error e;
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"Hel\"},{\"type\":\"text\",\"text\":\"lo\"}]}],\"temperature\":0.5,\"top_p\":0.9,"
        "\"top_k\":40,\"min_p\":0.05,\"seed\":-1,\"stop\":\"END\",\"max_tokens\":7,\"max_completion_tokens\":9,"
        "\"presence_penalty\":1.5,\"frequency_penalty\":-0.5,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]}";
    CHECK_MSG(parse(MS_API_CHAT, body, &r, &e) == 0, "%s", e.message);
    CHECK(!strcmp(r.model, "m") && r.stream && r.include_usage && r.has_seed && r.sampling.seed == UINT64_MAX);
    CHECK(r.sampling.temperature == 0.5 && r.sampling.top_p == 0.9 && r.sampling.top_k == 40 && r.sampling.min_p == 0.05);
    CHECK(r.sampling.presence_penalty == 1.5 && r.sampling.frequency_penalty == -0.5);
    CHECK(r.max_tokens == 9); /* max_completion_tokens wins */
    CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "END"));
    cJSON *rj = cJSON_Parse(r.render_json);
    CHECK(rj != NULL);
    cJSON *m = cJSON_GetObjectItem(rj, "messages");
    CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 0), "role")->valuestring, "system"));
    CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "content")->valuestring, "Hello"));
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(rj, "add_generation_prompt")));
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(rj, "tools")) == 1 && r.tools_json);
    cJSON_Delete(rj);
    ms_api_request_free(&r);
    /* tool_choice none: the tools stay out of the prompt */
    CHECK(parse(MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"none\",\"tools\":"
                             "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}", &r, &e) == 0);
    CHECK(!strstr(r.render_json, "\"tools\"") && !r.tools_json);
    ms_api_request_free(&r);
    /* completions: a batch of one, token ids in range */
    CHECK(parse(MS_API_COMPLETION, "{\"prompt\":[[5,6,999]]}", &r, &e) == 0);
    CHECK(r.n_prompt_ids == 3 && r.prompt_ids[2] == 999 && !r.prompt_text && r.max_tokens == 0);
    ms_api_request_free(&r);
    CHECK(parse(MS_API_COMPLETION, "{\"prompt\":\"abc\",\"top_p\":0}", &r, &e) == 0);
    CHECK(!strcmp(r.prompt_text, "abc") && r.sampling.top_k == 1);
    ms_api_request_free(&r);
}

TEST(request_refusals) {
    struct { ms_api_kind k; const char *body, *param, *msg; int status; } cases[] = {
        {MS_API_CHAT, "", "", "empty", 400},
        {MS_API_CHAT, "[1]", "", "must be a JSON object", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":3}", "n", "'n' must be 1", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", "temperature", "must be a number", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":1.5}", "top_p", "[0, 1]", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}", "max_tokens", "integer", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",5]}", "stop", "'stop[1]'", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\"]}", "stop", "1 to", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":{}}", "stream_options", "only allowed", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "top_logprobs", "needs 'logprobs': true", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs", "[0, 20]", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", "logprobs", "boolean", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"abc\":1}}", "logit_bias", "token ids", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"007\":1}}", "logit_bias", "token ids", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"1000\":1}}", "logit_bias", "outside the vocabulary", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"5\":100.5}}", "logit_bias", "[-100, 100]", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":[1]}", "logit_bias", "must be an object", 400},
        {MS_API_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":6}", "logprobs", "[0, 5]", 400},
        {MS_API_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":true}", "logprobs", "integer", 400},
        {MS_API_COMPLETION, "{\"prompt\":\"a\",\"top_logprobs\":2}", "top_logprobs", "chat field", 400},
        {MS_API_MESSAGES, "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"1\":2}}", "logit_bias", "not supported", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content", "required", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}", "tools[0]", "name", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"function\"}}", "tool_choice", "must be {", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"xml\"}}", "response_format", "must be \"text\"", 400},
        {MS_API_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt", "several prompts", 400},
        {MS_API_COMPLETION, "{\"prompt\":[1,1000]}", "prompt", "'prompt[1]'", 400},
        {MS_API_COMPLETION, "{\"prompt\":\"a\",\"echo\":true}", "echo", "not supported", 400},
        {MS_API_COMPLETION, "{}", "prompt", "required", 400},
        {MS_API_COMPLETION, "{\"prompt\":\"a\"} x", "", "1 trailing bytes after the JSON value (from byte 15)", 400},
        {MS_API_COMPLETION, "{\"prompt\":\"a\"}{}", "", "trailing bytes", 400},
        {MS_API_COMPLETION, "{\"prompt\":\"a\"", "", "not valid JSON", 400},
        {MS_API_COMPLETION, "{\"prompt\":\"\xff\"}", "", "not valid UTF-8 (byte 11)", 400},
        {MS_API_COMPLETION, "{\"prompt\":\"\xed\xa0\x80\"}", "", "not valid UTF-8", 400},
        {MS_API_COMPLETION, "{\"prompt\":\"\xc0\xaf\"}", "", "not valid UTF-8", 400},
        {MS_API_COMPLETION, "{\"prompt\":\"\\ud800\"}", "", "not valid JSON", 400},
        {MS_API_COMPLETION, "{\"prompt\":1e999}", "prompt", "must be a string", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1e300}", "max_tokens", "must be in", 400},
        {MS_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"seed\":1e30}", "seed", "must be in", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ms_api_request r;
        ms_api_error e;
        int rc = parse(cases[i].k, cases[i].body, &r, &e);
        CHECK_MSG(rc == MS_ERR_ARG && e.status == cases[i].status && !strcmp(e.param, cases[i].param) &&
                      strstr(e.message, cases[i].msg),
                  "case %zu: rc %d status %d param '%s' message '%s'", i, rc, e.status, e.param, e.message);
        char *j = ms_api_error_json(&e);
        cJSON *p = cJSON_Parse(j);
        cJSON *err = cJSON_GetObjectItem(p, "error");
        CHECK(cJSON_IsString(cJSON_GetObjectItem(err, "message")) && cJSON_IsString(cJSON_GetObjectItem(err, "type")));
        CHECK(cases[i].param[0] ? cJSON_IsString(cJSON_GetObjectItem(err, "param")) : cJSON_IsNull(cJSON_GetObjectItem(err, "param")));
        cJSON_Delete(p);
        free(j);
    }
}

TEST(request_json_limits) {
    ms_api_request r;
    ms_api_error e;
    char deep[512], *w = deep;
    w += sprintf(w, "{\"prompt\":\"a\",\"x\":");
    for (int i = 0; i < MS_API_MAX_DEPTH; i++) *w++ = '[';
    for (int i = 0; i < MS_API_MAX_DEPTH; i++) *w++ = ']';
    strcpy(w, "}");
    CHECK_MSG(parse(MS_API_COMPLETION, deep, &r, &e) == MS_ERR_ARG && strstr(e.message, "nested too deeply (limit 64)"), "%s", e.message);
    /* 63 levels inside the object: accepted; brackets inside strings do not count */
    w = deep + sprintf(deep, "{\"prompt\":\"[[[[{{{{\\\"[[\",\"x\":");
    for (int i = 0; i < MS_API_MAX_DEPTH - 1; i++) *w++ = '[';
    for (int i = 0; i < MS_API_MAX_DEPTH - 1; i++) *w++ = ']';
    strcpy(w, "} \r\n");
    CHECK_MSG(parse(MS_API_COMPLETION, deep, &r, &e) == 0, "%s", e.message);
    ms_api_request_free(&r);
    /* a NUL inside the body */
    CHECK(ms_api_parse_request(MS_API_COMPLETION, "{\"prompt\":\"a\"}\0x", 16, 1000, &r, &e) == MS_ERR_ARG &&
          strstr(e.message, "NUL byte"));
}

TEST(assistant_null_content) {
    ms_api_request r;
    ms_api_error e;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":null,"
                       "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                       "{\"role\":\"assistant\",\"tool_calls\":[]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"1\"}]}";
    CHECK_MSG(parse(MS_API_CHAT, body, &r, &e) == 0, "%s", e.message);
    cJSON *rj = cJSON_Parse(r.render_json), *m = cJSON_GetObjectItem(rj, "messages");
    for (int i = 1; i <= 2; i++) { /* null and missing: null, as OpenAI sends it */
        cJSON *c = cJSON_GetObjectItem(cJSON_GetArrayItem(m, i), "content");
        CHECK(cJSON_IsNull(c));
    }
    cJSON_Delete(rj);
    /* DeepSeek V3's template renders the calls of a turn whose content "is none" (not of ""); Qwen3's
     * tests the content as a string and fails on null, so ms_api_render_chat renders it with "" */
    char *out = NULL;
    size_t len = 0;
    ms_err err = {0};
    CHECK_MSG(ms_api_render_chat("tests/data/tokenizers/deepseek_v3", r.render_json, &out, &len, &err) == MS_OK, "%s",
              err.msg);
    CHECK_MSG(out && strstr(out, "<｜tool▁call▁begin｜>") &&
                  strstr(out, "<｜tool▁output▁begin｜>1"),
              "deepseek_v3: %s", out ? out : "(none)");
    free(out);
    out = NULL;
    CHECK(ms_chat_render("tests/data/tokenizers/qwen3", r.render_json, strlen(r.render_json), &out, &len, &err) ==
          MS_ERR_FORMAT); /* the template itself refuses null */
    free(out);
    out = NULL;
    CHECK_MSG(ms_api_render_chat("tests/data/tokenizers/qwen3", r.render_json, &out, &len, &err) == MS_OK, "%s", err.msg);
    CHECK_MSG(out && strstr(out, "<tool_call>\n{\"name\": \"f\"") && strstr(out, "<tool_response>\n1"), "qwen3: %s",
              out ? out : "(none)");
    free(out);
    ms_api_request_free(&r);
}

TEST(scrub_paths) {
    char m[256];
    snprintf(m, sizeof m, "chat template: /srv/models/qwen/chat_template.jinja:3: argument of type 'NoneType'");
    ms_api_scrub_paths(m, "/srv/models/qwen/");
    CHECK_MSG(!strcmp(m, "chat template: <model>/chat_template.jinja:3: argument of type 'NoneType'"), "%s", m);
    snprintf(m, sizeof m, "reading '/etc/secret/x.json': no such file; </think> stays, a/b stays");
    ms_api_scrub_paths(m, "models/q");
    CHECK_MSG(!strcmp(m, "reading 'x.json': no such file; </think> stays, a/b stays"), "%s", m);
    snprintf(m, sizeof m, "models/q/tokenizer_config.json: bad");
    ms_api_scrub_paths(m, "models/q");
    CHECK_MSG(!strcmp(m, "<model>/tokenizer_config.json: bad"), "%s", m);
}

typedef struct { char *buf; size_t len; } sbuf;
static int sink(void *user, const char *d, size_t n) {
    sbuf *b = user;
    b->buf = realloc(b->buf, b->len + n + 1);
    memcpy(b->buf + b->len, d, n);
    b->len += n;
    b->buf[b->len] = 0;
    return 0;
}

static char *build_kind(ms_api_kind kind, ms_outfmt fmt, int sir, const char *text, int stream, size_t step) {
    ms_outparse_opts po = {.start_in_reasoning = sir, .id_seed = 42};
    ms_api_resp_opts o = {.kind = kind, .id = "chatcmpl-1", .model = "m", .created = 5, .stream = stream,
                          .include_usage = 1, .fmt = fmt, .parse = &po};
    ms_api_resp *r;
    ms_err err = {0};
    if (ms_api_resp_new(&o, &r, &err)) return NULL;
    sbuf b = {0};
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i += step) ms_api_resp_text(r, text + i, n - i < step ? n - i : step, sink, &b, &err);
    ms_api_resp_finish(r, MS_FINISH_STOP, 10, 20, 3, sink, &b, &err);
    ms_api_resp_free(r);
    return b.buf;
}

static char *build(ms_outfmt fmt, int sir, const char *text, int stream, size_t step) {
    return build_kind(MS_API_CHAT, fmt, sir, text, stream, step);
}

/* Reassemble SSE chunks into {"content","reasoning_content","tool_calls"} and check the framing. */
static cJSON *reassemble(const char *sse, const char **finish_out, int *usage_ok) {
    cJSON *msg = cJSON_CreateObject(), *calls = cJSON_CreateArray();
    char *content = calloc(1, 1), *reasoning = calloc(1, 1);
    static char finish[32];
    finish[0] = 0;
    *usage_ok = 0;
    const char *p = sse;
    while (!strncmp(p, "data: ", 6)) {
        const char *end = strstr(p, "\n\n");
        if (!end) break;
        if (!strncmp(p + 6, "[DONE]", 6)) break;
        cJSON *c = cJSON_ParseWithLength(p + 6, (size_t)(end - p - 6));
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "choices"), 0);
        cJSON *u = cJSON_GetObjectItem(c, "usage");
        if (cJSON_IsObject(u) && cJSON_GetObjectItem(u, "total_tokens")->valueint == 30) *usage_ok = 1;
        if (ch) {
            cJSON *d = cJSON_GetObjectItem(ch, "delta"), *x;
            if ((x = cJSON_GetObjectItem(d, "content"))) {
                content = realloc(content, strlen(content) + strlen(x->valuestring) + 1);
                strcat(content, x->valuestring);
            }
            if ((x = cJSON_GetObjectItem(d, "reasoning_content"))) {
                reasoning = realloc(reasoning, strlen(reasoning) + strlen(x->valuestring) + 1);
                strcat(reasoning, x->valuestring);
            }
            cJSON *tc;
            cJSON_ArrayForEach(tc, cJSON_GetObjectItem(d, "tool_calls")) {
                int idx = cJSON_GetObjectItem(tc, "index")->valueint;
                while (cJSON_GetArraySize(calls) <= idx) {
                    cJSON *n = cJSON_CreateObject();
                    cJSON_AddStringToObject(n, "name", "");
                    cJSON_AddStringToObject(n, "arguments", "");
                    cJSON_AddItemToArray(calls, n);
                }
                cJSON *dst = cJSON_GetArrayItem(calls, idx), *f = cJSON_GetObjectItem(tc, "function");
                const char *keys[2] = {"name", "arguments"};
                for (int k = 0; k < 2; k++) {
                    cJSON *v = cJSON_GetObjectItem(f, keys[k]);
                    if (!v) continue;
                    const char *old = cJSON_GetObjectItem(dst, keys[k])->valuestring;
                    char *nv = malloc(strlen(old) + strlen(v->valuestring) + 1);
                    strcpy(nv, old);
                    strcat(nv, v->valuestring);
                    cJSON_ReplaceItemInObject(dst, keys[k], cJSON_CreateString(nv));
                    free(nv);
                }
            }
            cJSON *fr = cJSON_GetObjectItem(ch, "finish_reason");
            if (cJSON_IsString(fr)) snprintf(finish, sizeof finish, "%s", fr->valuestring);
        }
        cJSON_Delete(c);
        p = end + 2;
    }
    cJSON_AddStringToObject(msg, "content", content);
    cJSON_AddStringToObject(msg, "reasoning_content", reasoning);
    cJSON_AddItemToObject(msg, "tool_calls", calls);
    free(content);
    free(reasoning);
    *finish_out = !strcmp(p, "data: [DONE]\n\n") ? finish : "bad framing";
    return msg;
}

static const char *str_or_empty(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

TEST(responses_stream_equals_whole) {
    char *out = NULL;
    size_t len = 0;
    ms_err rerr = {0};
    CHECK_MSG(ms_read_file("tests/data/outparse_cases.json", 1 << 24, &out, &len, &rerr) == MS_OK, "%s", rerr.msg);
    cJSON *cases = out ? cJSON_Parse(out) : NULL;
    CHECK_MSG(cJSON_GetArraySize(cases) > 10, "tests/data/outparse_cases.json has no cases (%zu bytes)", len);
    cJSON *c;
    int n_calls = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring, *text = cJSON_GetObjectItem(c, "text")->valuestring;
        ms_outfmt fmt;
        if (ms_outfmt_from_name(cJSON_GetObjectItem(c, "format")->valuestring, &fmt, NULL)) continue;
        int sir = cJSON_IsTrue(cJSON_GetObjectItem(c, "start_in_reasoning"));
        /* the parser's own whole-text message is the reference for the builder's glue */
        ms_outparse_opts po = {.start_in_reasoning = sir, .id_seed = 42};
        char *pj = NULL;
        CHECK(ms_outparse_all(fmt, &po, text, strlen(text), &pj, NULL) == 0);
        cJSON *want = cJSON_Parse(pj);
        free(pj);
        char *whole = build(fmt, sir, text, 0, 1 << 20);
        cJSON *wj = cJSON_Parse(whole);
        cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(wj, "choices"), 0);
        cJSON *msg = cJSON_GetObjectItem(ch, "message");
        CHECK_MSG(cJSON_Compare(msg, want, 1), "%s: whole message differs from the parser's", name);
        int has_calls = cJSON_GetArraySize(cJSON_GetObjectItem(want, "tool_calls")) > 0;
        n_calls += has_calls;
        const char *fin = cJSON_GetObjectItem(ch, "finish_reason")->valuestring;
        CHECK_MSG(!strcmp(fin, has_calls ? "tool_calls" : "stop"), "%s: finish %s", name, fin);
        CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(wj, "usage"), "total_tokens")->valueint == 30);
        for (size_t step = 1; step <= 7; step += 6) {
            char *sse = build(fmt, sir, text, 1, step);
            const char *sfin;
            int usage_ok;
            cJSON *got = reassemble(sse, &sfin, &usage_ok);
            CHECK_MSG(!strcmp(sfin, fin) && usage_ok, "%s step %zu: finish '%s' usage %d", name, step, sfin, usage_ok);
            CHECK_MSG(!strcmp(str_or_empty(got, "content"), str_or_empty(msg, "content")), "%s step %zu: content", name, step);
            CHECK_MSG(!strcmp(str_or_empty(got, "reasoning_content"), str_or_empty(msg, "reasoning_content")),
                      "%s step %zu: reasoning", name, step);
            cJSON *gc = cJSON_GetObjectItem(got, "tool_calls"), *wc = cJSON_GetObjectItem(msg, "tool_calls");
            CHECK_MSG(cJSON_GetArraySize(gc) == cJSON_GetArraySize(wc), "%s step %zu: %d vs %d calls", name, step,
                      cJSON_GetArraySize(gc), cJSON_GetArraySize(wc));
            for (int i = 0; i < cJSON_GetArraySize(gc) && i < cJSON_GetArraySize(wc); i++) {
                cJSON *g = cJSON_GetArrayItem(gc, i), *w = cJSON_GetObjectItem(cJSON_GetArrayItem(wc, i), "function");
                CHECK_MSG(!strcmp(str_or_empty(g, "name"), str_or_empty(w, "name")) &&
                              !strcmp(str_or_empty(g, "arguments"), str_or_empty(w, "arguments")),
                          "%s step %zu: call %d", name, step, i);
            }
            cJSON_Delete(got);
            free(sse);
        }
        cJSON_Delete(wj);
        cJSON_Delete(want);
        free(whole);
    }
    CHECK(n_calls > 3);
    cJSON_Delete(cases);
    free(out);
}

/* Anthropic / Responses: the internal message list built from their requests. */
TEST(agent_requests) {
    ms_api_request r;
    ms_api_error e;
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":5,\"system\":[{\"type\":\"text\",\"text\":\"S\"}],\"stop_sequences\":[\"X\"],"
        "\"thinking\":{\"type\":\"disabled\"},\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true},"
        "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"messages\":["
        "{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"T\",\"signature\":\"\"},"
        "{\"type\":\"text\",\"text\":\"A\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{\"a\":1}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"R\"}]},{\"type\":\"text\",\"text\":\"more\"}]}]}";
    CHECK_MSG(parse(MS_API_MESSAGES, body, &r, &e) == 0, "%s", e.message);
    CHECK(r.max_tokens == 5 && r.n_stop == 1 && r.thinking == 0 && r.parallel_tool_calls == 0 && r.tools_json);
    cJSON *rj = cJSON_Parse(r.render_json), *m = cJSON_GetObjectItem(rj, "messages");
    const char *want =
        "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
        "\"content\":\"A\",\"reasoning_content\":\"T\",\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},{\"role\":\"tool\",\"content\":\"R\","
        "\"tool_call_id\":\"toolu_1\"},{\"role\":\"user\",\"content\":\"more\"}]";
    cJSON *wj = cJSON_Parse(want);
    CHECK_MSG(cJSON_Compare(m, wj, 1), "messages: %s", r.render_json);
    cJSON_Delete(wj);
    cJSON_Delete(rj);
    /* thinking off -> enable_thinking false for templates that have it */
    CHECK(ms_api_apply_reasoning(&r, MS_REASONING_ENABLE_THINKING, &e) == 0);
    CHECK(strstr(r.render_json, "\"enable_thinking\":false") != NULL);
    ms_api_request_free(&r);
    CHECK(parse(MS_API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) != 0 &&
          !strcmp(e.param, "max_tokens"));
    CHECK(parse(MS_API_COUNT_TOKENS, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == 0);
    ms_api_request_free(&r);
    CHECK(parse(MS_API_MESSAGES, "{\"max_tokens\":1,\"tool_choice\":{\"type\":\"any\"},\"messages\":[{\"role\":\"user\","
                                 "\"content\":\"x\"}]}", &r, &e) == 0 && r.constrain == MS_API_CONSTRAIN_TOOL && !r.forced_tool);
    ms_api_request_free(&r);
    CHECK(parse(MS_API_MESSAGES, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}",
                &r, &e) != 0 && !strcmp(e.param, "messages[0].content[0]"));
    /* Responses: items -> one assistant message per run of assistant-side items */
    body = "{\"instructions\":\"I\",\"reasoning\":{\"effort\":\"low\"},\"max_output_tokens\":9,\"tools\":[{\"type\":\"function\","
           "\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}],\"input\":[{\"role\":\"user\",\"content\":\"q\"},"
           "{\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"T\"}]},"
           "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"A\"}]},"
           "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
           "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"R\"}]}";
    CHECK_MSG(parse(MS_API_RESPONSES, body, &r, &e) == 0, "%s", e.message);
    CHECK(r.max_tokens == 9 && r.n_instructions == 1 && !strcmp(r.reasoning_effort, "low"));
    want = "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"A\",\"reasoning_content\":\"T\","
           "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
           "{\"role\":\"tool\",\"content\":\"R\",\"tool_call_id\":\"c1\"}]";
    wj = cJSON_Parse(want);
    cJSON *ij = cJSON_Parse(r.input_json);
    CHECK_MSG(cJSON_Compare(ij, wj, 1), "input: %s", r.input_json);
    cJSON_Delete(ij);
    /* previous_response_id: the stored messages go after the instructions */
    CHECK(ms_api_prepend_messages(&r, "[{\"role\":\"user\",\"content\":\"old\"}]", &e) == 0);
    rj = cJSON_Parse(r.render_json);
    m = cJSON_GetObjectItem(rj, "messages");
    CHECK(cJSON_GetArraySize(m) == 5 && !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 0), "content")->valuestring, "I") &&
          !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "content")->valuestring, "old"));
    cJSON_Delete(rj);
    cJSON_Delete(wj);
    /* reasoning_effort per family */
    CHECK(ms_api_apply_reasoning(&r, MS_REASONING_XTML, &e) == 0 && strstr(r.render_json, "\"thinking_effort\":\"low\""));
    ms_api_request_free(&r);
    CHECK(parse(MS_API_CHAT, "{\"reasoning_effort\":\"max\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == 0);
    CHECK(ms_api_apply_reasoning(&r, MS_REASONING_HARMONY, &e) != 0 && !strcmp(e.param, "reasoning_effort") &&
          strstr(e.message, "none, minimal, low, medium, high"));
    CHECK(ms_api_apply_reasoning(&r, MS_REASONING_XTML, &e) == 0 && strstr(r.render_json, "\"thinking_effort\":\"max\""));
    ms_api_request_free(&r);
    CHECK(parse(MS_API_CHAT, "{\"reasoning_effort\":\"medium\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e) == 0);
    CHECK(ms_api_apply_reasoning(&r, MS_REASONING_HARMONY, &e) == 0 && strstr(r.render_json, "\"reasoning_effort\":\"medium\""));
    ms_api_request_free(&r);
    CHECK(parse(MS_API_RESPONSES, "{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", &r, &e) != 0 &&
          !strcmp(e.param, "input[0]"));
}

/* Streamed Anthropic / Responses events rebuild the non-streamed blocks / items, for every outparse case. */
TEST(agent_stream_equals_whole) {
    char *out = NULL;
    size_t len = 0;
    CHECK(ms_read_file("tests/data/outparse_cases.json", 1 << 24, &out, &len, NULL) == MS_OK);
    cJSON *cases = cJSON_Parse(out), *c;
    int n = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring, *text = cJSON_GetObjectItem(c, "text")->valuestring;
        ms_outfmt fmt;
        if (ms_outfmt_from_name(cJSON_GetObjectItem(c, "format")->valuestring, &fmt, NULL)) continue;
        int sir = cJSON_IsTrue(cJSON_GetObjectItem(c, "start_in_reasoning"));
        for (int k = 0; k < 2; k++) {
            ms_api_kind kind = k ? MS_API_RESPONSES : MS_API_MESSAGES;
            char *whole = build_kind(kind, fmt, sir, text, 0, 1 << 20);
            cJSON *wj = cJSON_Parse(whole), *want = cJSON_GetObjectItem(wj, k ? "output" : "content");
            CHECK_MSG(cJSON_IsArray(want), "%s: %s", name, whole);
            char *sse = build_kind(kind, fmt, sir, text, 1, 3);
            /* rebuild: Anthropic from start/delta/stop, Responses from output_item.done; check the framing */
            cJSON *got = cJSON_CreateArray(), *last = NULL;
            const char *p = sse;
            int ok = 1;
            while (p && *p) {
                const char *nl = strstr(p, "\ndata: "), *end = nl ? strstr(nl, "\n\n") : NULL;
                if (strncmp(p, "event: ", 7) || !end) { ok = 0; break; }
                cJSON *d = cJSON_ParseWithLength(nl + 7, (size_t)(end - nl - 7));
                const char *ty = cJSON_GetObjectItem(d, "type")->valuestring;
                if (strncmp(p + 7, ty, strlen(ty))) ok = 0;
                if (!k && !strcmp(ty, "content_block_start"))
                    cJSON_AddItemToArray(got, cJSON_Duplicate(cJSON_GetObjectItem(d, "content_block"), 1));
                if (!k && !strcmp(ty, "content_block_delta")) {
                    cJSON *b = cJSON_GetArrayItem(got, cJSON_GetObjectItem(d, "index")->valueint), *dl = cJSON_GetObjectItem(d, "delta");
                    const char *dt = cJSON_GetObjectItem(dl, "type")->valuestring;
                    const char *key = !strcmp(dt, "thinking_delta") ? "thinking" : !strcmp(dt, "text_delta") ? "text" : "partial_json";
                    const char *bk = !strcmp(key, "partial_json") ? "_json" : key;
                    const char *old = cJSON_GetObjectItem(b, bk) ? cJSON_GetObjectItem(b, bk)->valuestring : "";
                    const char *add = cJSON_GetObjectItem(dl, key)->valuestring;
                    char *nv = malloc(strlen(old) + strlen(add) + 1);
                    strcpy(nv, old);
                    strcat(nv, add);
                    if (cJSON_GetObjectItem(b, bk)) cJSON_ReplaceItemInObject(b, bk, cJSON_CreateString(nv));
                    else cJSON_AddStringToObject(b, bk, nv);
                    free(nv);
                }
                if (!k && !strcmp(ty, "content_block_stop")) {
                    cJSON *b = cJSON_GetArrayItem(got, cJSON_GetObjectItem(d, "index")->valueint), *js = cJSON_GetObjectItem(b, "_json");
                    if (js) {
                        cJSON *in = cJSON_Parse(js->valuestring);
                        if (cJSON_IsObject(in)) cJSON_ReplaceItemInObject(b, "input", in);
                        else cJSON_Delete(in);
                        cJSON_DeleteItemFromObject(b, "_json");
                    }
                }
                if (k && !strcmp(ty, "response.output_item.done"))
                    cJSON_AddItemToArray(got, cJSON_Duplicate(cJSON_GetObjectItem(d, "item"), 1));
                if (k && !strcmp(ty, "response.completed"))
                    ok &= cJSON_Compare(cJSON_GetObjectItem(cJSON_GetObjectItem(d, "response"), "output"), want, 1);
                cJSON_Delete(last);
                last = d;
                p = end + 2;
            }
            const char *lt = last ? cJSON_GetObjectItem(last, "type")->valuestring : "";
            CHECK_MSG(ok && !strcmp(lt, k ? "response.completed" : "message_stop"), "%s kind %d: framing (last %s)", name, k, lt);
            /* Anthropic tool inputs that are not objects are wrapped the same way in both */
            CHECK_MSG(cJSON_Compare(got, want, 1) || (!k && strstr(whole, "\"arguments\":")), "%s kind %d: stream != whole\n%s\n%s",
                      name, k, cJSON_PrintUnformatted(got), whole);
            cJSON_Delete(last);
            cJSON_Delete(got);
            cJSON_Delete(wj);
            free(whole);
            free(sse);
            n++;
        }
    }
    CHECK(n > 20);
    cJSON_Delete(cases);
    free(out);
}

TEST_MAIN()
