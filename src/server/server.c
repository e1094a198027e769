/* server.c — libmicrohttpd glue: responses, request preparation (validate, render, tokenize), the
 * request queue, the endpoints' handlers, routing, start and stop. The connection limits and header
 * checks are in server_conn.c, the metrics in server_metrics.c, the worker in server_worker.c
 * (server_int.h: what they share). */
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "server/api.h"
#include "server/server_int.h"
#include "server/web.h"
#include "text/chat_template.h"

/* ---------------- HTTP ---------------- */
/* Queue r with the CORS header when the origin is allowed; counts the status. */
static enum MHD_Result respond(ms_server *s, struct MHD_Connection *c, conn *cn, int status, struct MHD_Response *r) {
    if (!r) return MHD_NO;
    if (cn && cn->cors_ok) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", cn->origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
    ms_srv_count_request(s, cn ? cn->ep : EP_OTHER, status);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

/* hdrs: NULL-terminated name/value pairs (may be NULL). */
enum MHD_Result ms_srv_send_body(ms_server *s, struct MHD_Connection *c, conn *cn, int status, const char *body,
                                 size_t len, const char *ctype, const char *const *hdrs) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype ? ctype : "application/json");
    for (int i = 0; hdrs && hdrs[i]; i += 2) MHD_add_response_header(r, hdrs[i], hdrs[i + 1]);
    return respond(s, c, cn, status, r);
}

static int anthropic_ep(int ep) { return ep == EP_MESSAGES || ep == EP_COUNT_TOKENS; }

enum MHD_Result ms_srv_send_error_h(ms_server *s, struct MHD_Connection *c, conn *cn, const ms_api_error *e,
                                    const char *const *hdrs) {
    char *b = cn && anthropic_ep(cn->ep) ? ms_api_anthropic_error_json(e) : ms_api_error_json(e);
    if (!b) return MHD_NO;
    enum MHD_Result rc = ms_srv_send_body(s, c, cn, e->status, b, strlen(b), NULL, hdrs);
    free(b);
    return rc;
}

enum MHD_Result ms_srv_send_error(ms_server *s, struct MHD_Connection *c, conn *cn, const ms_api_error *e) {
    return ms_srv_send_error_h(s, c, cn, e, NULL);
}

enum MHD_Result ms_srv_send_json(ms_server *s, struct MHD_Connection *c, conn *cn, int status, cJSON *j) {
    char *b = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!b) return MHD_NO;
    enum MHD_Result rc = ms_srv_send_body(s, c, cn, status, b, strlen(b), NULL, NULL);
    free(b);
    return rc;
}

static cJSON *model_json(const ms_server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "moonshine");
    cJSON_AddNumberToObject(m, "max_model_len", ms_generator_max_ctx(s->o.gen));
    return m;
}

/* Streaming body: what the worker produced; with nothing yet the connection is suspended. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    ssize_t n;
    if (j->len > j->off) {
        size_t k = j->len - j->off < max ? j->len - j->off : max;
        memcpy(buf, j->buf + j->off, k);
        j->off += k;
        if (j->off == j->len) j->off = j->len = 0;
        n = (ssize_t)k;
    } else if (j->cancelled) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (j->done) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        if (j->conn && !j->suspended) {
            MHD_suspend_connection(j->conn);
            j->suspended = 1;
        }
        n = 0;
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

static void stream_free(void *cls) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    if (!j->done) j->cancelled = 1; /* the client went away (or the stream ended early) */
    pthread_mutex_unlock(&j->mu);
    ms_srv_job_unref(j);
}

/* The request's deadline: its "deadline_s" (seconds from arrival, > 0) when given, at most the server's
 * --request-deadline-s; else the server's (0: none). */
static int request_deadline(const ms_server *s, const char *body, size_t blen, double *out, ms_api_error *e) {
    double d = s->o.request_deadline_s > 0 ? s->o.request_deadline_s : 0;
    cJSON *root = cJSON_ParseWithLength(body, blen);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "deadline_s");
    int rc = MS_OK;
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || v->valuedouble > 1e6)
            rc = ms_api_fail(e, 400, "invalid_request_error", "deadline_s", NULL,
                             "'deadline_s' must be a number of seconds in (0, 1e6]");
        else if (!d || v->valuedouble < d) d = v->valuedouble;
    }
    cJSON_Delete(root);
    *out = d;
    return rc;
}

/* The request's grammar (a 400 names an unsupported schema keyword before inference), the
 * model's grammar vocabulary (built once), and the constraint the generation runs under. */
static int prepare_constraint(ms_server *s, job *j, ms_api_error *e) {
    const char *lead = NULL;
    int rc = ms_api_constraint_grammar_cached(s->gcache, &j->req, s->o.fmt, s->o.tok, j->start_in_reasoning, &j->grammar,
                                              &lead, e);
    if (rc || !j->grammar) return rc;
    ms_err err = {0};
    pthread_mutex_lock(&s->gvmu);
    if (!s->gvocab) rc = ms_gvocab_new(s->o.tok, (uint32_t)s->o.vocab, s->eos, (size_t)s->o.n_eos, &s->gvocab, &err);
    pthread_mutex_unlock(&s->gvmu);
    if (rc) return ms_api_fail(e, 500, "server_error", NULL, NULL, "grammar vocabulary: %s", err.msg);
    j->con = (ms_gen_constraint){.grammar = j->grammar, .vocab = s->gvocab};
    if (lead) {
        ms_tok_ids ids = {0};
        if ((rc = ms_tok_encode(s->o.tok, lead, strlen(lead), MS_TOK_ENCODE_SPECIAL, &ids, &err))) {
            ms_tok_ids_free(&ids);
            return ms_api_fail(e, 500, "server_error", NULL, NULL, "tokenizing the forced text: %s", err.msg);
        }
        j->lead = ids.ids;
        j->con.prefix_ids = ids.ids;
        j->con.n_prefix = (int)ids.n;
    }
    return MS_OK;
}

/* Validate, render and tokenize; on success *out is a job with its prompt. check_ctx: the
 * prompt (+ max_tokens) must fit the context. */
static int prepare(ms_server *s, ms_api_kind kind, const char *body, size_t blen, int check_ctx, job **out,
                   ms_api_error *e) {
    *out = NULL;
    job *j = calloc(1, sizeof *j);
    if (!j) return ms_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 1;
    j->status = 200;
    j->fd = -1;
    j->t_arrive = now_s();
    int rc = ms_api_parse_request(kind, body, blen, s->o.vocab, &j->req, e);
    if (rc) goto fail;
    if (j->req.model && strcmp(j->req.model, s->model_name)) {
        rc = ms_api_fail(e, 404, "invalid_request_error", "model", "model_not_found",
                         "The model '%.200s' does not exist; this server serves '%.200s'", j->req.model, s->model_name);
        goto fail;
    }
    if (MS_API_IS_CHATLIKE(kind) && (rc = ms_api_apply_reasoning(&j->req, s->reasoning, e))) goto fail;
    if (j->req.previous_response_id) {
        char *prev = ms_srv_store_get(s, j->req.previous_response_id);
        if (!prev) {
            rc = ms_api_fail(e, 400, "invalid_request_error", "previous_response_id", "previous_response_not_found",
                             "Previous response with id '%.100s' not found: this server keeps the last %d stored responses "
                             "(in memory, until it restarts); send the whole conversation as 'input' instead",
                             j->req.previous_response_id, STORE_MAX);
            goto fail;
        }
        rc = ms_api_prepend_messages(&j->req, prev, e);
        free(prev);
        if (rc) goto fail;
    }
    ms_err err = {0};
    ms_tok_ids ids = {0};
    if (MS_API_IS_CHATLIKE(kind)) {
        char *prompt = NULL;
        size_t plen = 0;
        rc = ms_api_render_chat(s->model_dir, j->req.render_json, &prompt, &plen, &err);
        if (rc) {
            int client = rc == MS_ERR_FORMAT;
            ms_api_scrub_paths(err.msg, s->model_dir);
            rc = ms_api_fail(e, client ? 400 : 500, client ? "invalid_request_error" : "server_error", client ? "messages" : NULL,
                             NULL, "chat template: %s", err.msg);
            goto fail;
        }
        j->start_in_reasoning = ms_outfmt_prompt_opens_reasoning(s->o.fmt, prompt, plen, NULL);
        rc = ms_tok_encode(s->o.tok, prompt, plen, MS_TOK_ENCODE_SPECIAL, &ids, &err);
        free(prompt);
    } else if (j->req.prompt_text) {
        if (ms_tok_adds_bos(s->o.tok)) {
            int32_t bos = ms_tok_bos_id(s->o.tok);
            ids.ids = malloc(64 * sizeof *ids.ids);
            if (ids.ids) { ids.cap = 64; ids.ids[ids.n++] = bos; }
        }
        rc = ms_tok_encode(s->o.tok, j->req.prompt_text, strlen(j->req.prompt_text), MS_TOK_ENCODE_SPECIAL, &ids, &err);
    } else {
        ids.ids = j->req.prompt_ids;
        ids.n = (size_t)j->req.n_prompt_ids;
        j->req.prompt_ids = NULL;
    }
    if (rc) {
        ms_tok_ids_free(&ids);
        ms_api_scrub_paths(err.msg, s->model_dir);
        rc = ms_api_fail(e, 400, "invalid_request_error", MS_API_IS_CHATLIKE(kind) ? "messages" : "prompt", NULL,
                         "tokenizing the prompt: %s", err.msg);
        goto fail;
    }
    j->prompt = ids.ids;
    j->n_prompt = (int)ids.n;
    int ctx = ms_generator_max_ctx(s->o.gen);
    if (j->n_prompt < 1 && check_ctx) {
        rc = ms_api_fail(e, 400, "invalid_request_error", "prompt", NULL, "the prompt is empty after tokenization");
        goto fail;
    }
    int room = ctx - j->n_prompt;
    if (check_ctx && (room < 1 || (j->req.max_tokens && j->req.max_tokens > room))) {
        rc = ms_api_fail(e, 400, "invalid_request_error", room < 1 ? (MS_API_IS_CHATLIKE(kind) ? "messages" : "prompt") : "max_tokens",
                         "context_length_exceeded",
                         "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in "
                         "the prompt, %d for the completion).",
                         ctx, (long long)j->n_prompt + (j->req.max_tokens ? j->req.max_tokens : 1), j->n_prompt,
                         j->req.max_tokens ? j->req.max_tokens : 1);
        goto fail;
    }
    j->max_tokens = j->req.max_tokens ? j->req.max_tokens : room;
    if (kind != MS_API_COUNT_TOKENS && (rc = prepare_constraint(s, j, e))) goto fail;
    if ((rc = request_deadline(s, body, blen, &j->deadline_s, e))) goto fail;
    if (j->deadline_s > 0) j->t_deadline = j->t_arrive + j->deadline_s;
    *out = j;
    return MS_OK;
fail:
    ms_srv_job_unref(j);
    return rc ? rc : MS_ERR_ARG;
}

/* Retry-After for a refused request: the time the requests waiting now need to get a slot, at the
 * measured mean time a request spends in a slot (one of the n slots frees every mean / n seconds):
 * ceil(waiting * mean / n), at least 1 s (also before anything was measured), at most an hour.
 * *mean_out: the mean used (0: none yet). */
int ms_srv_retry_after(ms_server *s, int waiting, double *mean_out) {
    pthread_mutex_lock(&s->mmu);
    double mean = s->m.slot_n ? s->m.slot_s : 0;
    pthread_mutex_unlock(&s->mmu);
    if (mean_out) *mean_out = mean;
    double t = ceil((double)(waiting > 0 ? waiting : 0) * mean / (double)s->n_slots - 1e-9);
    return t < 1 ? 1 : t > 3600 ? 3600 : (int)t;
}

static int enqueue(ms_server *s, job *j, ms_api_error *e, int *retry) {
    pthread_mutex_lock(&s->mu);
    int max = s->o.max_queue > 0 ? s->o.max_queue : 64;
    if (s->stopping || s->queued >= s->n_slots + max) {
        int waiting = s->queued - s->running, stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        double mean = 0;
        *retry = ms_srv_retry_after(s, waiting, &mean);
        if (stopping) return ms_api_fail(e, 503, "server_error", NULL, "server_busy", "the server is shutting down");
        return ms_api_fail(e, 503, "server_error", NULL, "server_busy",
                           "the server is busy: all %d slots are serving requests and %d more are queued "
                           "(--max-queue %d); retry in %d s (%d waiting at %.3g s per request in a slot, %d slots)",
                           s->n_slots, waiting, max, *retry, waiting, mean, s->n_slots);
    }
    j->refs++;
    j->next = NULL;
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->queued++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return MS_OK;
}

/* A stream's response: 200 and the SSE bytes as the worker produces them. */
static enum MHD_Result start_stream(ms_server *s, struct MHD_Connection *c, conn *cn, job *j) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, j, stream_free);
    if (!r) return MHD_NO;
    pthread_mutex_lock(&j->mu);
    j->refs++; /* the response's */
    j->started = 1;
    pthread_mutex_unlock(&j->mu);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return respond(s, c, cn, MHD_HTTP_OK, r);
}

/* The job's answer once the worker has news (or MHD_NO when the client left): a finished body; for a
 * stream, the SSE response from its first bytes on (until then an error, e.g. a 504, is still a status). */
static enum MHD_Result answer_job(ms_server *s, struct MHD_Connection *c, conn *cn) {
    job *j = cn->j;
    pthread_mutex_lock(&j->mu);
    int stream_now = j->req.stream && !j->cancelled && j->status == 200 && (j->len > 0 || j->done);
    if (!j->done && !j->cancelled && !stream_now) { /* woken early: wait on */
        MHD_suspend_connection(c);
        j->suspended = 1;
        pthread_mutex_unlock(&j->mu);
        return MHD_YES;
    }
    pthread_mutex_unlock(&j->mu);
    if (stream_now) return start_stream(s, c, cn, j);
    pthread_mutex_lock(&j->mu);
    int ok = j->done && !j->cancelled && !j->nomem;
    if (!j->done) j->cancelled = 1;
    int status = j->status;
    char *body = j->buf;
    size_t len = j->len;
    j->buf = NULL;
    j->len = j->cap = 0;
    pthread_mutex_unlock(&j->mu);
    enum MHD_Result rc = MHD_NO; /* client gone: close the connection */
    if (ok) rc = ms_srv_send_body(s, c, cn, status, body ? body : "", len, NULL, NULL);
    free(body);
    return rc;
}

static enum MHD_Result handle_generate(ms_server *s, struct MHD_Connection *c, ms_api_kind kind, conn *cn) {
    ms_api_error e;
    job *j;
    if (prepare(s, kind, cn->body, cn->len, 1, &j, &e)) return ms_srv_send_error(s, c, cn, &e);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->conn = c;
    int retry = 1;
    if (enqueue(s, j, &e, &retry)) {
        ms_srv_job_unref(j);
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry);
        const char *h[] = {"Retry-After", ra, NULL};
        return ms_srv_send_error_h(s, c, cn, &e, h);
    }
    cn->j = j; /* the connection's reference */
    pthread_mutex_lock(&j->mu);
    int news = j->done || (j->req.stream && j->len > 0);
    if (!news) {
        MHD_suspend_connection(c);
        j->suspended = 1;
    }
    pthread_mutex_unlock(&j->mu);
    return news ? answer_job(s, c, cn) : MHD_YES;
}

/* POST /tokenize: {"prompt": text or ids} or {"messages": [...], "tools"?} -> {"tokens","count","max_model_len"}. */
static enum MHD_Result handle_tokenize(ms_server *s, struct MHD_Connection *c, conn *cn) {
    ms_api_error e;
    if (ms_api_check_json(cn->body, cn->len, &e)) return ms_srv_send_error(s, c, cn, &e);
    cJSON *root = cJSON_ParseWithLength(cn->body, cn->len);
    int chat = cJSON_IsObject(root) && cJSON_GetObjectItemCaseSensitive(root, "messages");
    cJSON_Delete(root);
    job *j;
    if (prepare(s, chat ? MS_API_CHAT : MS_API_COMPLETION, cn->body, cn->len, 0, &j, &e)) return ms_srv_send_error(s, c, cn, &e);
    cJSON *o = cJSON_CreateObject(), *t = cJSON_AddArrayToObject(o, "tokens");
    for (int i = 0; i < j->n_prompt; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(j->prompt[i]));
    cJSON_AddNumberToObject(o, "count", j->n_prompt);
    cJSON_AddNumberToObject(o, "max_model_len", ms_generator_max_ctx(s->o.gen));
    ms_srv_job_unref(j);
    return ms_srv_send_json(s, c, cn, 200, o);
}

/* POST /v1/messages/count_tokens: an Anthropic Messages body -> {"input_tokens": N}. */
static enum MHD_Result handle_count_tokens(ms_server *s, struct MHD_Connection *c, conn *cn) {
    ms_api_error e;
    job *j;
    if (prepare(s, MS_API_COUNT_TOKENS, cn->body, cn->len, 0, &j, &e)) return ms_srv_send_error(s, c, cn, &e);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", j->n_prompt);
    ms_srv_job_unref(j);
    return ms_srv_send_json(s, c, cn, 200, o);
}

/* POST /detokenize: {"tokens": [ids]} -> {"prompt": text} (special tokens kept). */
static enum MHD_Result handle_detokenize(ms_server *s, struct MHD_Connection *c, conn *cn) {
    ms_api_error e;
    if (!cn->len) {
        ms_api_fail(&e, 400, "invalid_request_error", NULL, NULL, "the request body is empty: expected a JSON object");
        return ms_srv_send_error(s, c, cn, &e);
    }
    if (ms_api_check_json(cn->body, cn->len, &e)) return ms_srv_send_error(s, c, cn, &e);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(cn->body, cn->len, &end, 0);
    size_t at = end ? (size_t)(end - cn->body) : cn->len;
    while (root && at < cn->len && strchr(" \t\r\n", cn->body[at])) at++;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!root || at < cn->len || !cJSON_IsObject(root)) {
        ms_api_fail(&e, 400, "invalid_request_error", NULL, NULL, "the request body must be one JSON object");
    } else if (!cJSON_IsArray(t)) {
        ms_api_fail(&e, 400, "invalid_request_error", "tokens", NULL, "'tokens' must be an array of token ids");
    } else {
        int n = cJSON_GetArraySize(t), i = 0, bad = -1;
        int32_t *ids = malloc(sizeof *ids * (size_t)(n + 1));
        const cJSON *x;
        int64_t tv = (int64_t)ms_tok_vocab_size(s->o.tok);
        cJSON_ArrayForEach(x, t) {
            if (!cJSON_IsNumber(x) || x->valuedouble != (double)(int64_t)x->valuedouble || x->valuedouble < 0 ||
                x->valuedouble >= (double)tv) {
                bad = i;
                break;
            }
            if (ids) ids[i] = (int32_t)x->valuedouble;
            i++;
        }
        char *text = NULL;
        size_t tl = 0;
        ms_err err = {0};
        if (!ids) ms_api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        else if (bad >= 0) ms_api_fail(&e, 400, "invalid_request_error", "tokens", NULL, "'tokens[%d]' must be a token id in [0, %lld)", bad, (long long)tv);
        else if (ms_tok_decode(s->o.tok, ids, (size_t)n, 0, &text, &tl, &err)) ms_api_fail(&e, 400, "invalid_request_error", "tokens", NULL, "%s", err.msg);
        else {
            free(ids);
            cJSON_Delete(root);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "prompt", text);
            free(text);
            return ms_srv_send_json(s, c, cn, 200, o);
        }
        free(ids);
    }
    cJSON_Delete(root);
    return ms_srv_send_error(s, c, cn, &e);
}

enum MHD_Result ms_srv_method_not_allowed(ms_server *s, struct MHD_Connection *c, conn *cn, const char *method,
                                          const char *url, const char *allow) {
    ms_api_error e;
    ms_api_fail(&e, 405, "invalid_request_error", NULL, "ms_srv_method_not_allowed", "%s %.200s: use %s", method, url,
                strcmp(allow, "POST") ? "GET" : "POST");
    const char *h[] = {"Allow", allow, NULL};
    return ms_srv_send_error_h(s, c, cn, &e, h);
}

static int endpoint_of(const char *url) {
    if (!strcmp(url, "/health")) return EP_HEALTH;
    if (!strcmp(url, "/metrics")) return EP_METRICS;
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) return EP_MODELS;
    if (!strcmp(url, "/v1/chat/completions")) return EP_CHAT;
    if (!strcmp(url, "/v1/completions")) return EP_COMPLETIONS;
    if (!strcmp(url, "/tokenize")) return EP_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return EP_DETOKENIZE;
    if (!strcmp(url, "/v1/messages")) return EP_MESSAGES;
    if (!strcmp(url, "/v1/messages/count_tokens")) return EP_COUNT_TOKENS;
    if (!strcmp(url, "/v1/responses")) return EP_RESPONSES;
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) return EP_ROOT;
    if (!strcmp(url, "/slots")) return EP_SLOTS;
    return EP_OTHER;
}

int ms_srv_is_post_ep(int ep) {
    return ep == EP_CHAT || ep == EP_COMPLETIONS || ep == EP_TOKENIZE || ep == EP_DETOKENIZE || ep == EP_MESSAGES ||
           ep == EP_COUNT_TOKENS || ep == EP_RESPONSES;
}

/* The full request is here: answer it. */
static enum MHD_Result route(ms_server *s, struct MHD_Connection *c, const char *url, const char *method, conn *cn) {
    ms_api_error e;
    switch (cn->ep) {
    case EP_HEALTH: {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "status", "ok");
        pthread_mutex_lock(&s->mu);
        cJSON_AddNumberToObject(j, "queued", s->queued);
        pthread_mutex_unlock(&s->mu);
        return ms_srv_send_json(s, c, cn, 200, j);
    }
    case EP_METRICS: return ms_srv_handle_metrics(s, c, cn);
    case EP_ROOT: { /* the chat page: no key needed to load it (it asks for one when the API answers 401) */
        size_t n;
        const char *page = ms_web_chat_page(&n);
        const char *h[] = {"Content-Security-Policy",
                           "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                           "X-Content-Type-Options", "nosniff", "X-Frame-Options", "DENY", "Cache-Control", "no-cache", NULL};
        return ms_srv_send_body(s, c, cn, 200, page, n, "text/html; charset=utf-8", h);
    }
    case EP_SLOTS: return ms_srv_handle_slots(s, c, cn);
    case EP_MODELS:
        if (!strcmp(url, "/v1/models")) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "object", "list");
            cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "data"), model_json(s));
            return ms_srv_send_json(s, c, cn, 200, j);
        }
        if (strcmp(url + 11, s->model_name)) {
            ms_api_fail(&e, 404, "invalid_request_error", "model", "model_not_found", "The model '%.200s' does not exist",
                        url + 11);
            return ms_srv_send_error(s, c, cn, &e);
        }
        return ms_srv_send_json(s, c, cn, 200, model_json(s));
    case EP_CHAT: return handle_generate(s, c, MS_API_CHAT, cn);
    case EP_COMPLETIONS: return handle_generate(s, c, MS_API_COMPLETION, cn);
    case EP_TOKENIZE: return handle_tokenize(s, c, cn);
    case EP_DETOKENIZE: return handle_detokenize(s, c, cn);
    case EP_MESSAGES: return handle_generate(s, c, MS_API_MESSAGES, cn);
    case EP_COUNT_TOKENS: return handle_count_tokens(s, c, cn);
    case EP_RESPONSES: return handle_generate(s, c, MS_API_RESPONSES, cn);
    default: break;
    }
    ms_api_fail(&e, 404, "invalid_request_error", NULL, "not_found", "no endpoint %s %.200s", method, url);
    return ms_srv_send_error(s, c, cn, &e);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    ms_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) { /* the headers are in */
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        cn->ep = endpoint_of(url);
        ms_srv_sock_stage(s, c, 1);
        enum MHD_Result rc;
        if (ms_srv_precheck(s, c, url, method, cn, &rc)) {
            cn->answered = 1;
            ms_srv_sock_stage(s, c, 2);
            return rc;
        }
        return MHD_YES;
    }
    if (cn->answered) { /* answered early: drop the rest */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cn->too_large || cn->len + n > s->o.max_body) {
            /* chunked: libmicrohttpd cannot answer in the middle of a body, so the rest is read and dropped
             * (for at most the body deadline) and 413 follows */
            cn->too_large = 1;
            free(cn->body);
            cn->body = NULL;
            cn->len = cn->cap = 0;
            return MHD_YES;
        }
        if (cn->len + n + 1 > cn->cap) {
            size_t cap = cn->cap ? cn->cap : 4096;
            while (cap < cn->len + n + 1) cap *= 2;
            char *b = realloc(cn->body, cap);
            if (!b) return MHD_NO;
            cn->body = b;
            cn->cap = cap;
        }
        memcpy(cn->body + cn->len, upload, n);
        cn->len += n;
        cn->body[cn->len] = 0;
        return MHD_YES;
    }
    if (cn->j) return answer_job(s, c, cn); /* resumed */
    ms_srv_sock_stage(s, c, 2);
    if (cn->too_large) {
        ms_api_error e;
        ms_api_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                    "the request body exceeds the limit of %zu bytes", s->o.max_body);
        return ms_srv_send_error(s, c, cn, &e);
    }
    return route(s, c, url, method, cn);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    ms_server *s = cls;
    conn *cn = *con_cls;
    ms_srv_sock_stage(s, c, 0); /* next: another request's headers, or idle */
    if (!cn) return;
    if (cn->j) {
        job *j = cn->j;
        pthread_mutex_lock(&j->mu);
        if (!j->done) j->cancelled = 1;
        j->conn = NULL;
        j->fd = -1;
        j->suspended = 0;
        pthread_mutex_unlock(&j->mu);
        ms_srv_job_unref(j);
    }
    free(cn->body);
    free(cn);
    *con_cls = NULL;
}

static int is_loopback(int fam, const void *a) {
    if (fam == AF_INET) return (ntohl(((const struct in_addr *)a)->s_addr) >> 24) == 127;
    return IN6_IS_ADDR_LOOPBACK((const struct in6_addr *)a);
}

static void server_free(ms_server *s) {
    free(s->model_name);
    free(s->model_dir);
    free(s->cors);
    free(s->host_str);
    free(s->eos);
    free(s->forced);
    ms_grammar_cache_free(s->gcache); /* before the vocabulary its grammars' caches were built for */
    ms_gvocab_free(s->gvocab);
    free(s->slot_run);
    free(s->slot_job);
    free(s->view);
    free(s);
}

int ms_server_start(const ms_server_opts *o, ms_server **out, ms_err *err) {
    *out = NULL;
    if (!o->tok || !o->model_name || !o->model_name[0] || !o->model_dir)
        return ms_fail(err, MS_ERR_ARG, "server: needs a generator, a tokenizer, a model name and a model directory");
    if (o->port < 0 || o->port > 65535) return ms_fail(err, MS_ERR_ARG, "server: port %d is out of range", o->port);
    if (o->n_eos < 0 || o->n_eos > 64 || o->n_forced < 0) return ms_fail(err, MS_ERR_ARG, "server: bad eos/forced id lists");
    if (!o->sched) return ms_fail(err, MS_ERR_ARG, "server: needs the slot scheduler");
    if (o->header_timeout_s < 0 || o->body_timeout_s < 0 || o->max_connections < 0 || o->max_connections_per_ip < 0 ||
        o->request_deadline_s < 0)
        return ms_fail(err, MS_ERR_ARG, "server: negative timeout, deadline or connection limit");
    const char *host = o->host ? o->host : "127.0.0.1";
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    struct sockaddr_in6 sa6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)o->port)};
    int v6 = 0;
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        if (inet_pton(AF_INET6, host, &sa6.sin6_addr) != 1)
            return ms_fail(err, MS_ERR_ARG, "server: --host \"%s\" is not an IPv4 or IPv6 address", host);
        v6 = 1;
    }
    int loop = v6 ? is_loopback(AF_INET6, &sa6.sin6_addr) : is_loopback(AF_INET, &sa.sin_addr);
    int has_key = o->api_key && o->api_key[0];
    if (!loop && !has_key)
        return ms_fail(err, MS_ERR_ARG,
                       "server: refusing to listen on %s without an API key: anyone who can reach it could run the "
                       "model. Pass --api-key KEY or set MOONSHINE_API_KEY (clients send 'Authorization: Bearer KEY'), "
                       "or bind to 127.0.0.1",
                       host);
    ms_server *s = calloc(1, sizeof *s);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "server: out of memory");
    s->o = *o;
    s->sched = o->sched;
    s->n_slots = ms_sched_n_slots(o->sched);
    if (!s->o.gen) s->o.gen = ms_sched_generator(o->sched, 0);
    if (!s->o.max_body) s->o.max_body = MS_API_MAX_BODY;
    if (!s->o.max_connections) s->o.max_connections = 1024;
    if (!s->o.header_timeout_s) s->o.header_timeout_s = 10;
    if (!s->o.body_timeout_s) s->o.body_timeout_s = 30;
    s->loopback = loop;
    s->has_key = has_key;
    s->t_start = now_s();
    unsigned int hl = 0;
    if (has_key && (!EVP_Digest(o->api_key, strlen(o->api_key), s->key_hash, &hl, EVP_sha256(), NULL) || hl != 32)) {
        free(s);
        return ms_fail(err, MS_ERR_NOMEM, "server: cannot hash the API key");
    }
    s->o.api_key = NULL; /* only the hash is kept */
    s->model_name = strdup(o->model_name);
    s->model_dir = strdup(o->model_dir);
    s->host_str = strdup(host);
    s->cors = o->cors_origin ? strdup(o->cors_origin) : NULL;
    s->eos = malloc(sizeof(int32_t) * (size_t)(o->n_eos + 1));
    s->forced = o->forced_ids ? malloc(sizeof(int32_t) * (size_t)(o->n_forced + 1)) : NULL;
    s->slot_run = calloc((size_t)s->n_slots, sizeof *s->slot_run);
    s->slot_job = calloc((size_t)s->n_slots, sizeof *s->slot_job);
    s->view = calloc((size_t)s->n_slots, sizeof *s->view);
    if (!s->model_name || !s->model_dir || !s->host_str || !s->eos || (o->forced_ids && !s->forced) ||
        !s->slot_run || !s->slot_job || !s->view ||
        (o->cors_origin && !s->cors)) {
        server_free(s);
        return ms_fail(err, MS_ERR_NOMEM, "server: out of memory");
    }
    if (o->n_eos) memcpy(s->eos, o->eos_ids, sizeof(int32_t) * (size_t)o->n_eos);
    if (s->forced && o->n_forced) memcpy(s->forced, o->forced_ids, sizeof(int32_t) * (size_t)o->n_forced);
    s->o.model_name = s->model_name;
    s->o.model_dir = s->model_dir;
    s->o.cors_origin = s->cors;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->smu, NULL);
    pthread_mutex_init(&s->wmu, NULL);
    pthread_cond_init(&s->wcv, NULL);
    pthread_mutex_init(&s->mmu, NULL);
    pthread_mutex_init(&s->rmu, NULL);
    pthread_mutex_init(&s->gvmu, NULL);
    {
        ms_err gerr = {0};
        if (ms_grammar_cache_new(32, (size_t)256 << 20, &s->gcache, &gerr)) s->gcache = NULL; /* none: compiled per request */
    }
    {
        ms_chat_source src = {0};
        ms_err perr = {0};
        int has_src = !ms_chat_pick(s->model_dir, 0, &src, &perr);
        s->reasoning = ms_api_reasoning_for(o->fmt, has_src ? src.template_text : NULL);
        if (has_src) ms_chat_source_free(&src);
    }
    if (pthread_create(&s->worker, NULL, ms_srv_worker_main, s)) {
        server_free(s);
        return ms_fail(err, MS_ERR_NOMEM, "server: cannot start the worker thread");
    }
    if (pthread_create(&s->watch, NULL, ms_srv_watch_main, s)) {
        ms_server_stop(s);
        return ms_fail(err, MS_ERR_NOMEM, "server: cannot start the watchdog thread");
    }
    s->have_watch = 1;
    /* epoll threads (no thread per connection: idle and slow sockets cost a few KiB, not a thread);
     * libmicrohttpd's own cap is a backstop above ours, whose refusal is a 503 */
    unsigned maxc = (unsigned)s->o.max_connections + 64;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | (v6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
                            v6 ? (struct sockaddr *)&sa6 : (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, ms_srv_on_socket, s, MHD_OPTION_CONNECTION_LIMIT,
                            maxc, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o.header_timeout_s,
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)2, MHD_OPTION_END);
    if (!s->d) {
        int e = errno;
        ms_server_stop(s);
        return ms_fail(err, MS_ERR_IO, "server: cannot listen on %s:%d (%s)", host, o->port, e ? strerror(e) : "libmicrohttpd refused");
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return MS_OK;
}

int ms_server_port(const ms_server *s) { return s->port; }

void ms_server_stop(ms_server *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    for (int i = 0; i <= s->n_slots; i++)
        for (job *j = i < s->n_slots ? s->slot_job[i] : s->head; j; j = i < s->n_slots ? NULL : j->next) {
            pthread_mutex_lock(&j->mu);
            j->cancelled = 1;
            ms_srv_job_wake(j);
            pthread_mutex_unlock(&j->mu);
        }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->worker, NULL);
    if (s->have_watch) {
        pthread_mutex_lock(&s->wmu);
        pthread_cond_broadcast(&s->wcv);
        pthread_mutex_unlock(&s->wmu);
        pthread_join(s->watch, NULL);
    }
    if (s->d) MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->smu);
    pthread_mutex_destroy(&s->wmu);
    pthread_cond_destroy(&s->wcv);
    pthread_mutex_destroy(&s->mmu);
    ms_srv_store_free(s);
    pthread_mutex_destroy(&s->rmu);
    pthread_mutex_destroy(&s->gvmu);
    server_free(s);
}

