/* libFuzzer target: the server's request parser and response builder. The
 * first byte picks the endpoint (chat, completions, Anthropic messages and
 * count_tokens, Responses: byte % 5) and the output format (byte / 5);
 * the rest up to a NUL is the request body, what follows it is "generated
 * text". A body is either refused with a well-formed OpenAI error (HTTP status
 * 4xx/5xx, a message) or accepted with every field in range; an accepted
 * request's response is then built from the text, streamed and whole, and both
 * must be valid JSON / SSE. Error messages also go through ms_api_scrub_paths. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

typedef struct { char *buf; size_t len, cap; } sink_buf;

static int sink(void *user, const char *data, size_t len) {
    sink_buf *b = user;
    if (b->len + len + 1 > b->cap) {
        b->cap = (b->len + len + 1) * 2;
        b->buf = realloc(b->buf, b->cap);
        if (!b->buf) abort();
    }
    memcpy(b->buf + b->len, data, len);
    b->len += len;
    b->buf[b->len] = 0;
    return 0;
}

static void build(const ms_api_request *r, ms_outfmt fmt, int stream, const char *text, size_t n) {
    ms_outparse_opts po = {.tools_json = r->tools_json, .id_seed = 1};
    ms_api_resp_opts o = {.kind = r->kind, .id = "x_1", .model = "m", .created = 1, .stream = stream,
                          .include_usage = r->include_usage, .fmt = fmt, .parse = &po, .prompt_tokens = 3,
                          .echo_json = r->echo_json, .previous_response_id = r->previous_response_id,
                          .single_tool_call = !r->parallel_tool_calls};
    ms_api_resp *resp;
    ms_err err;
    if (ms_api_resp_new(&o, &resp, &err)) return; /* tools_json a parser refuses */
    sink_buf b = {0};
    for (size_t i = 0; i < n; i += 5)
        if (ms_api_resp_text(resp, text + i, n - i < 5 ? n - i : 5, sink, &b, &err)) abort();
    if (ms_api_resp_finish(resp, MS_FINISH_STOP, 3, 4, 1, sink, &b, &err)) abort();
    int agent = r->kind == MS_API_MESSAGES || r->kind == MS_API_RESPONSES;
    if (!stream) {
        cJSON *j = cJSON_ParseWithLength(b.buf, b.len);
        if (!j || !cJSON_GetObjectItem(j, agent ? (r->kind == MS_API_MESSAGES ? "content" : "output") : "choices")) abort();
        cJSON_Delete(j);
    } else if (agent) {
        /* every event is `event: NAME\ndata: JSON\n\n` with data.type == NAME; the last is message_stop /
         * response.completed */
        char *p = b.buf, *last = NULL;
        while (p && p < b.buf + b.len) {
            if (strncmp(p, "event: ", 7)) abort();
            char *nl = strstr(p, "\ndata: "), *end = nl ? strstr(nl, "\n\n") : NULL;
            if (!end) abort();
            cJSON *j = cJSON_ParseWithLength(nl + 7, (size_t)(end - nl - 7));
            cJSON *t = cJSON_GetObjectItem(j, "type");
            if (!cJSON_IsString(t) || strncmp(p + 7, t->valuestring, strlen(t->valuestring)) || p[7 + strlen(t->valuestring)] != '\n')
                abort();
            cJSON_Delete(j);
            last = p + 7;
            p = end + 2;
        }
        if (!last || strncmp(last, r->kind == MS_API_MESSAGES ? "message_stop\n" : "response.completed\n",
                             r->kind == MS_API_MESSAGES ? 13 : 19))
            abort();
    } else {
        /* every event is `data: JSON\n\n`, the last `data: [DONE]\n\n` */
        char *p = b.buf;
        if (!p || b.len < 14 || strcmp(b.buf + b.len - 14, "data: [DONE]\n\n")) abort();
        while (p < b.buf + b.len - 14) {
            if (strncmp(p, "data: ", 6)) abort();
            char *end = strstr(p, "\n\n");
            if (!end) abort();
            cJSON *j = cJSON_ParseWithLength(p + 6, (size_t)(end - p - 6));
            if (!j) abort();
            cJSON_Delete(j);
            p = end + 2;
        }
    }
    free(b.buf);
    ms_api_resp_free(resp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    ms_api_kind kind = (ms_api_kind)(data[0] % MS_API_KIND_COUNT);
    ms_outfmt fmt = (ms_outfmt)((data[0] / MS_API_KIND_COUNT) % MS_OUTFMT_COUNT);
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    const char *nul = memchr(body, 0, n);
    size_t blen = nul ? (size_t)(nul - body) : n;
    const char *text = nul ? nul + 1 : "";
    size_t tlen = nul ? n - blen - 1 : 0;
    ms_api_request r;
    ms_api_error e;
    if (ms_api_parse_request(kind, body, blen, 1000, &r, &e)) {
        if (e.status < 400 || e.status > 599 || !e.message[0] || !e.type) abort();
        /* path scrubbing keeps a message a message: shorter or equal, terminated */
        size_t ml = strnlen(e.message, sizeof e.message);
        ms_api_scrub_paths(e.message, "models/x");
        if (ml == sizeof e.message || strnlen(e.message, sizeof e.message) > ml) abort();
        char *j = ms_api_error_json(&e);
        if (!j) abort();
        cJSON *p = cJSON_Parse(j);
        if (!p) abort();
        cJSON_Delete(p);
        free(j);
        return 0;
    }
    if (ms_sampler_check(&r.sampling, NULL) || r.n_stop > MS_STOP_MAX || r.max_tokens < 0) abort();
    if (MS_API_IS_CHATLIKE(kind) && !r.render_json) abort();
    if (kind == MS_API_RESPONSES && (!r.input_json || !r.echo_json)) abort();
    if (MS_API_IS_CHATLIKE(kind)) { /* the reasoning switches either apply or refuse with a 400 */
        ms_api_reasoning sw = (ms_api_reasoning)(data[0] % 5);
        if (ms_api_apply_reasoning(&r, sw, &e) && e.status != 400) abort();
        if (kind == MS_API_RESPONSES && ms_api_prepend_messages(&r, "[{\"role\":\"user\",\"content\":\"p\"}]", &e)) abort();
    }
    if (kind == MS_API_COMPLETION && !r.prompt_text == !r.prompt_ids) abort();
    for (int i = 0; i < r.n_prompt_ids; i++)
        if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= 1000) abort();
    if (kind != MS_API_COUNT_TOKENS) {
        build(&r, fmt, 0, text, tlen);
        build(&r, fmt, 1, text, tlen);
    }
    ms_api_request_free(&r);
    return 0;
}
