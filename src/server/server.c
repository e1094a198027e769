/* server.c — libmicrohttpd glue: routing, the request queue, the worker. */
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include "server/api.h"
#include "text/chat_template.h"

/* One queued request and its output channel (shared by the connection and the worker). */
typedef struct job {
    ms_api_request req;
    int32_t *prompt;
    int n_prompt, max_tokens;
    int start_in_reasoning;
    int fd;                 /* the client's socket, to notice a hang-up while waiting */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *buf;              /* body bytes produced and not yet sent */
    size_t len, off, cap;
    int nomem;
    int done, cancelled, running;
    int status;             /* non-stream: HTTP status of the body */
    int refs;               /* connection + worker (+ queue) */
    struct job *next;
} job;

struct ms_server {
    ms_server_opts o;
    char *model_name, *model_dir;
    int32_t *eos, *forced;
    struct MHD_Daemon *d;
    int port;
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail, *cur; /* queue; the job the worker runs */
    int queued; /* queued + running */
    int stopping;
};

/* Per-connection state: the request body. */
typedef struct conn {
    char *body;
    size_t len, cap;
    int too_large;
    job *j;
} conn;

static void job_unref(job *j) {
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    ms_api_request_free(&j->req);
    free(j->prompt);
    free(j->buf);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Worker -> connection: append body bytes. Returns nonzero when the client is gone. */
static int job_sink(void *user, const char *data, size_t len) {
    job *j = user;
    pthread_mutex_lock(&j->mu);
    int gone = j->cancelled;
    if (!gone && len) {
        if (j->len + len > j->cap) {
            size_t cap = j->cap ? j->cap : 4096;
            while (cap < j->len + len) cap *= 2;
            char *n = realloc(j->buf, cap);
            if (!n) j->nomem = 1;
            else {
                j->buf = n;
                j->cap = cap;
            }
        }
        if (!j->nomem) {
            memcpy(j->buf + j->len, data, len);
            j->len += len;
        }
        pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
    return gone || j->nomem;
}

/* 1 when the peer closed its end of the socket. */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
    char c;
    if (p.revents & POLLIN) {
        ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return r == 0;
    }
    return 0;
}

/* Wait (with j->mu held) up to 100 ms for news; marks the job cancelled when the client left. */
static void job_wait(job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    if (!j->done && !j->cancelled && peer_gone(j->fd)) j->cancelled = 1;
}

/* ---------------- the worker ---------------- */
typedef struct gen_ctx {
    job *j;
    ms_api_resp *resp;
    ms_err err;
    int rc;
} gen_ctx;

static int on_token(void *user, int32_t id, const char *text, size_t len) {
    gen_ctx *g = user;
    int rc = ms_api_resp_text(g->resp, text, len, job_sink, g->j, &g->err);
    if (rc) {
        g->rc = rc;
        return 1;
    }
    pthread_mutex_lock(&g->j->mu);
    int stop = g->j->cancelled;
    pthread_mutex_unlock(&g->j->mu);
    return stop;
}

static void random_hex(char *out, int n) {
    uint8_t b[32];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)(rand() ^ (int)time(NULL));
    for (int i = 0; i < n; i++) out[i] = "0123456789abcdef"[(b[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[n] = 0;
}

static void run_job(ms_server *s, job *j) {
    char hex[32], id[48];
    random_hex(hex, 24);
    snprintf(id, sizeof id, "%s-%s", j->req.kind == MS_API_CHAT ? "chatcmpl" : "cmpl", hex);
    if (!j->req.has_seed) {
        uint64_t seed;
        if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) seed = (uint64_t)time(NULL);
        j->req.sampling.seed = seed;
    }
    ms_outparse_opts po = {.start_in_reasoning = j->start_in_reasoning, .tools_json = j->req.tools_json};
    if (getrandom(&po.id_seed, sizeof po.id_seed, 0) != (ssize_t)sizeof po.id_seed) po.id_seed = j->req.sampling.seed ^ 0x5eedULL;
    ms_api_resp_opts ro = {.kind = j->req.kind, .id = id, .model = s->model_name, .created = (int64_t)time(NULL),
                           .stream = j->req.stream, .include_usage = j->req.include_usage, .fmt = s->o.fmt, .parse = &po};
    gen_ctx g = {.j = j};
    ms_gen_params gp = {.sampling = j->req.sampling, .max_tokens = j->max_tokens,
                        .stop = (const char *const *)j->req.stop, .n_stop = j->req.n_stop, .eos_ids = s->eos,
                        .n_eos = s->o.n_eos, .forced_ids = s->forced, .n_forced = s->o.n_forced};
    ms_gen_result res;
    int rc = ms_api_resp_new(&ro, &g.resp, &g.err);
    if (!rc) rc = ms_generate(s->o.gen, j->prompt, j->n_prompt, &gp, on_token, &g, &res, &g.err);
    if (!rc && g.rc) rc = g.rc;
    pthread_mutex_lock(&j->mu);
    int cancelled = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    if (!rc && !cancelled && res.finish != MS_FINISH_ABORT)
        rc = ms_api_resp_finish(g.resp, res.finish, res.prompt_tokens, res.completion_tokens, res.cached_tokens,
                                job_sink, j, &g.err);
    pthread_mutex_lock(&j->mu);
    cancelled = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    if (rc && !cancelled) {
        ms_api_error e;
        ms_api_fail(&e, 500, "server_error", NULL, NULL, "generation failed: %s", g.err.msg[0] ? g.err.msg : ms_status_name(rc));
        pthread_mutex_lock(&j->mu);
        j->len = j->off = 0; /* non-stream: replace a partial body */
        j->status = 500;
        pthread_mutex_unlock(&j->mu);
        if (j->req.stream) ms_api_resp_stream_error(&e, job_sink, j);
        else {
            char *b = ms_api_error_json(&e);
            if (b) job_sink(j, b, strlen(b));
            free(b);
        }
    }
    ms_api_resp_free(g.resp);
}

static void *worker_main(void *arg) {
    ms_server *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) { pthread_mutex_unlock(&s->mu); break; }
        job *j = s->head;
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->cur = j;
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_lock(&j->mu);
        int skip = j->cancelled || s->stopping;
        j->running = 1;
        pthread_mutex_unlock(&j->mu);
        if (!skip) run_job(s, j);
        pthread_mutex_lock(&j->mu);
        j->done = 1;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        pthread_mutex_lock(&s->mu);
        s->queued--;
        s->cur = NULL;
        pthread_mutex_unlock(&s->mu);
        job_unref(j);
    }
    return NULL;
}

/* ---------------- HTTP ---------------- */
static enum MHD_Result send_body(struct MHD_Connection *c, int status, const char *body, size_t len, const char *allow) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (allow) MHD_add_response_header(r, "Allow", allow);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_error(struct MHD_Connection *c, const ms_api_error *e, const char *allow) {
    char *b = ms_api_error_json(e);
    if (!b) return MHD_NO;
    enum MHD_Result rc = send_body(c, e->status, b, strlen(b), allow);
    free(b);
    return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, cJSON *j) {
    char *b = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!b) return MHD_NO;
    enum MHD_Result rc = send_body(c, status, b, strlen(b), NULL);
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

/* Streaming body: pull what the worker produced. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    while (j->len == j->off && !j->done && !j->cancelled) job_wait(j);
    ssize_t n;
    if (j->len > j->off) {
        size_t k = j->len - j->off < max ? j->len - j->off : max;
        memcpy(buf, j->buf + j->off, k);
        j->off += k;
        if (j->off == j->len) j->off = j->len = 0;
        n = (ssize_t)k;
    } else {
        n = j->cancelled ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

static void stream_free(void *cls) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    if (!j->done) j->cancelled = 1; /* the client went away (or the stream ended early) */
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
}

/* Validate, render and tokenize; on success *out is a job with its prompt. */
static int prepare(ms_server *s, ms_api_kind kind, const conn *cn, job **out, ms_api_error *e) {
    *out = NULL;
    job *j = calloc(1, sizeof *j);
    if (!j) return ms_api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->status = 200;
    j->fd = -1;
    int rc = ms_api_parse_request(kind, cn->body, cn->len, s->o.vocab, &j->req, e);
    if (rc) goto fail;
    if (j->req.model && strcmp(j->req.model, s->model_name)) {
        rc = ms_api_fail(e, 404, "invalid_request_error", "model", "model_not_found",
                         "The model '%.200s' does not exist; this server serves '%.200s'", j->req.model, s->model_name);
        goto fail;
    }
    ms_err err = {0};
    ms_tok_ids ids = {0};
    if (kind == MS_API_CHAT) {
        char *prompt = NULL;
        size_t plen = 0;
        rc = ms_chat_render(s->model_dir, j->req.render_json, strlen(j->req.render_json), &prompt, &plen, &err);
        if (rc) {
            int client = rc == MS_ERR_FORMAT;
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
        rc = ms_api_fail(e, 400, "invalid_request_error", kind == MS_API_CHAT ? "messages" : "prompt", NULL,
                         "tokenizing the prompt: %s", err.msg);
        goto fail;
    }
    j->prompt = ids.ids;
    j->n_prompt = (int)ids.n;
    int ctx = ms_generator_max_ctx(s->o.gen);
    if (j->n_prompt < 1) {
        rc = ms_api_fail(e, 400, "invalid_request_error", "prompt", NULL, "the prompt is empty after tokenization");
        goto fail;
    }
    int room = ctx - j->n_prompt;
    if (room < 1 || (j->req.max_tokens && j->req.max_tokens > room)) {
        rc = ms_api_fail(e, 400, "invalid_request_error", room < 1 ? (kind == MS_API_CHAT ? "messages" : "prompt") : "max_tokens",
                         "context_length_exceeded",
                         "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in "
                         "the prompt, %d for the completion).",
                         ctx, (long long)j->n_prompt + (j->req.max_tokens ? j->req.max_tokens : 1), j->n_prompt,
                         j->req.max_tokens ? j->req.max_tokens : 1);
        goto fail;
    }
    j->max_tokens = j->req.max_tokens ? j->req.max_tokens : room;
    *out = j;
    return MS_OK;
fail:
    job_unref(j);
    return rc ? rc : MS_ERR_ARG;
}

static int enqueue(ms_server *s, job *j, ms_api_error *e) {
    pthread_mutex_lock(&s->mu);
    int max = s->o.max_queue > 0 ? s->o.max_queue : 64;
    if (s->stopping || s->queued >= max) {
        pthread_mutex_unlock(&s->mu);
        return ms_api_fail(e, 503, "server_error", NULL, "server_busy",
                           s->stopping ? "the server is shutting down" : "the server is busy: %d requests are queued; retry later", s->queued);
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

static enum MHD_Result handle_generate(ms_server *s, struct MHD_Connection *c, ms_api_kind kind, conn *cn) {
    ms_api_error e;
    job *j;
    if (prepare(s, kind, cn, &j, &e)) return send_error(c, &e, NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    if (enqueue(s, j, &e)) {
        job_unref(j);
        return send_error(c, &e, NULL);
    }
    if (j->req.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, j, stream_free);
        if (!r) {
            stream_free(j);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        return rc;
    }
    pthread_mutex_lock(&j->mu);
    while (!j->done && !j->cancelled) job_wait(j);
    int ok = j->done && !j->cancelled && !j->nomem;
    int status = j->status;
    char *body = ok ? j->buf : NULL;
    size_t len = j->len;
    if (!j->done) j->cancelled = 1;
    pthread_mutex_unlock(&j->mu);
    enum MHD_Result rc = MHD_NO; /* client gone: close the connection */
    if (ok) rc = send_body(c, status, body ? body : "", len, NULL);
    job_unref(j);
    return rc;
}

static enum MHD_Result route(ms_server *s, struct MHD_Connection *c, const char *url, const char *method, conn *cn) {
    ms_api_error e;
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (cn->too_large) {
        ms_api_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                    "the request body exceeds the limit of %zu bytes", s->o.max_body);
        return send_error(c, &e, NULL);
    }
    if (!strcmp(url, "/health")) {
        if (!get) goto not_allowed_get;
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "status", "ok");
        pthread_mutex_lock(&s->mu);
        cJSON_AddNumberToObject(j, "queued", s->queued);
        pthread_mutex_unlock(&s->mu);
        return send_json(c, 200, j);
    }
    if (!strcmp(url, "/v1/models")) {
        if (!get) goto not_allowed_get;
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "data"), model_json(s));
        return send_json(c, 200, j);
    }
    if (!strncmp(url, "/v1/models/", 11)) {
        if (!get) goto not_allowed_get;
        if (strcmp(url + 11, s->model_name)) {
            ms_api_fail(&e, 404, "invalid_request_error", "model", "model_not_found", "The model '%.200s' does not exist",
                        url + 11);
            return send_error(c, &e, NULL);
        }
        return send_json(c, 200, model_json(s));
    }
    int chat = !strcmp(url, "/v1/chat/completions"), compl = !strcmp(url, "/v1/completions");
    if (chat || compl) {
        if (!post) {
            ms_api_fail(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s %s: use POST", method, url);
            return send_error(c, &e, "POST");
        }
        return handle_generate(s, c, chat ? MS_API_CHAT : MS_API_COMPLETION, cn);
    }
    ms_api_fail(&e, 404, "invalid_request_error", NULL, "not_found", "no endpoint %s %.200s", method, url);
    return send_error(c, &e, NULL);
not_allowed_get:
    ms_api_fail(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s %s: use GET", method, url);
    return send_error(c, &e, "GET, HEAD");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    ms_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) {
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cn->too_large || cn->len + n > s->o.max_body) {
            cn->too_large = 1; /* keep reading (and dropping) the body, then answer 413 */
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
    return route(s, c, url, method, cn);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    conn *cn = *con_cls;
    if (!cn) return;
    free(cn->body);
    free(cn);
    *con_cls = NULL;
}

int ms_server_start(const ms_server_opts *o, ms_server **out, ms_err *err) {
    *out = NULL;
    if (!o->gen || !o->tok || !o->model_name || !o->model_name[0] || !o->model_dir)
        return ms_fail(err, MS_ERR_ARG, "server: needs a generator, a tokenizer, a model name and a model directory");
    if (o->port < 0 || o->port > 65535) return ms_fail(err, MS_ERR_ARG, "server: port %d is out of range", o->port);
    if (o->n_eos < 0 || o->n_eos > 64 || o->n_forced < 0) return ms_fail(err, MS_ERR_ARG, "server: bad eos/forced id lists");
    const char *host = o->host ? o->host : "127.0.0.1";
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return ms_fail(err, MS_ERR_ARG, "server: --host \"%s\" is not an IPv4 address", host);
    ms_server *s = calloc(1, sizeof *s);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "server: out of memory");
    s->o = *o;
    if (!s->o.max_body) s->o.max_body = MS_API_MAX_BODY;
    s->model_name = strdup(o->model_name);
    s->model_dir = strdup(o->model_dir);
    s->eos = malloc(sizeof(int32_t) * (size_t)(o->n_eos + 1));
    s->forced = o->forced_ids ? malloc(sizeof(int32_t) * (size_t)(o->n_forced + 1)) : NULL;
    if (!s->model_name || !s->model_dir || !s->eos || (o->forced_ids && !s->forced)) {
        free(s->model_name);
        free(s->model_dir);
        free(s->eos);
        free(s->forced);
        free(s);
        return ms_fail(err, MS_ERR_NOMEM, "server: out of memory");
    }
    if (o->n_eos) memcpy(s->eos, o->eos_ids, sizeof(int32_t) * (size_t)o->n_eos);
    if (s->forced && o->n_forced) memcpy(s->forced, o->forced_ids, sizeof(int32_t) * (size_t)o->n_forced);
    s->o.model_name = s->model_name;
    s->o.model_dir = s->model_dir;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->worker, NULL, worker_main, s)) {
        free(s->model_name);
        free(s->model_dir);
        free(s->eos);
        free(s->forced);
        free(s);
        return ms_fail(err, MS_ERR_NOMEM, "server: cannot start the worker thread");
    }
    unsigned maxc = o->max_connections > 0 ? (unsigned)o->max_connections : 128;
    s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, (uint16_t)o->port, NULL,
                            NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT, maxc,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
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
    for (job *j = s->cur ? s->cur : s->head; j; j = j == s->cur ? s->head : j->next) {
        pthread_mutex_lock(&j->mu);
        j->cancelled = 1;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->worker, NULL);
    if (s->d) MHD_stop_daemon(s->d);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->model_name);
    free(s->model_dir);
    free(s->eos);
    free(s->forced);
    free(s);
}
