/* server.c — libmicrohttpd glue: exposure checks, routing, limits, the request
 * queue, the worker, the watchdog, metrics. */
#include "server/server.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include "server/api.h"
#include "server/web.h"
#include "text/chat_template.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One queued request and its output channel (shared by the connection, the worker and the watchdog). */
typedef struct job {
    ms_api_request req;
    int32_t *prompt;
    int n_prompt, max_tokens;
    int start_in_reasoning;
    int fd;                        /* the client's socket, to notice a hang-up; -1 once the connection ended */
    struct MHD_Connection *conn;   /* NULL once the connection ended */
    int suspended;                 /* conn is suspended, waiting for news from the worker */
    double t_arrive;
    pthread_mutex_t mu;
    char *buf;              /* body bytes produced and not yet sent */
    size_t len, off, cap;
    int nomem;
    int done, cancelled;
    int started;            /* stream: the 200 and its SSE response are queued (before: an error can still be a status) */
    int status;             /* HTTP status of the body (a stream's, until it started) */
    double deadline_s, t_deadline; /* the request's deadline (0: none), and when it passes */
    int refs;               /* connection + worker/queue + stream response */
    struct job *next;
    /* constrained decoding (response_format, text.format, a forced tool call) */
    ms_grammar *grammar;    /* NULL: none */
    int32_t *lead;          /* forced ids before the grammar's text (closing an opened reasoning block) */
    ms_gen_constraint con;
} job;

/* Per-socket state (MHD_OPTION_NOTIFY_CONNECTION): the watchdog's deadlines. */
typedef struct sock {
    int fd;
    int stage;      /* 0 reading a request's headers (or idle keep-alive), 1 its body, 2 being answered */
    int over;       /* opened past max_connections */
    int over_ip;    /* opened past max_connections_per_ip (the peer's address had that many open) */
    int fam;        /* the peer's address family (AF_INET, AF_INET6; 0: unknown) */
    uint8_t addr[16];
    int killed;     /* the watchdog shut it down */
    double t0;      /* when the stage began */
    struct sock *prev, *next;
} sock;

enum { EP_HEALTH, EP_METRICS, EP_MODELS, EP_CHAT, EP_COMPLETIONS, EP_TOKENIZE, EP_DETOKENIZE, EP_MESSAGES,
       EP_COUNT_TOKENS, EP_RESPONSES, EP_SLOTS, EP_ROOT, EP_OTHER, EP_N };
static const char *const k_ep_name[EP_N] = {"/health", "/metrics", "/v1/models", "/v1/chat/completions",
                                            "/v1/completions", "/tokenize", "/detokenize", "/v1/messages",
                                            "/v1/messages/count_tokens", "/v1/responses", "/slots", "/", "other"};
static const int k_statuses[] = {200, 204, 400, 401, 403, 404, 405, 413, 415, 500, 503, 504};
#define N_STATUS ((int)(sizeof k_statuses / sizeof *k_statuses))
static const double k_ttft_b[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
static const double k_itl_b[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
#define N_TTFT ((int)(sizeof k_ttft_b / sizeof *k_ttft_b))
#define N_ITL ((int)(sizeof k_itl_b / sizeof *k_itl_b))

typedef struct hist {
    uint64_t n, b[16];
    double sum;
} hist;

static void hist_add(hist *h, const double *bounds, int nb, double v) {
    h->n++;
    h->sum += v;
    for (int i = 0; i < nb; i++)
        if (v <= bounds[i]) h->b[i]++;
}

typedef struct metrics {
    uint64_t requests[EP_N][N_STATUS + 1]; /* last column: other statuses */
    uint64_t prompt_tokens, completion_tokens, cached_tokens, prefix_hits, generations, cancelled, failed;
    uint64_t timeouts, refused_connections, refused_per_ip;
    uint64_t deadline_first, deadline_after; /* deadlines reached before the first token (504), after it (length) */
    hist ttft, itl;
    double slot_s;   /* mean seconds a request spent in its slot (EWMA, weight 0.2, of those that finished) */
    uint64_t slot_n; /* requests in it */
    ms_server_engine_stats eng;
    ms_sched_stats sched;
} metrics;

/* A slot as /slots and /metrics see it (the worker refreshes it after every step, under mu). */
typedef struct slot_view {
    ms_sched_slot info;
    double t_arrive, deadline_s; /* of its request (0: none) */
    int stream;
} slot_view;

struct ms_server {
    ms_server_opts o;
    ms_gvocab *gvocab;      /* the grammar vocabulary, built on the first constrained request (under gvmu) */
    ms_grammar_cache *gcache; /* compiled grammars of recent schemas / tool sets (warm mask caches) */
    pthread_mutex_t gvmu;
    ms_sched *sched;
    int n_slots;
    struct run **slot_run;  /* the worker's: each slot's request */
    job **slot_job;         /* under mu: each slot's job (the watchdog checks them for hang-ups) */
    slot_view *view;        /* under mu */
    int running;            /* under mu: jobs in slots */
    uint64_t kept_seen;     /* the worker's: ms_sched_stats.kept_prefixes seen */
    char *model_name, *model_dir, *cors, *host_str;
    unsigned char key_hash[32];
    int has_key, loopback;
    int32_t *eos, *forced;
    struct MHD_Daemon *d;
    int port;
    double t_start;
    pthread_t worker, watch;
    int have_watch;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;       /* queue (waiting for a slot) */
    int queued;             /* queued + running */
    int stopping;
    pthread_mutex_t smu;    /* socks, n_socks */
    sock *socks;
    int n_socks;
    pthread_mutex_t wmu;    /* the watchdog's sleep */
    pthread_cond_t wcv;
    pthread_mutex_t mmu;    /* metrics */
    metrics m;
    ms_api_reasoning reasoning; /* how this model's template switches reasoning */
    pthread_mutex_t rmu;    /* the response store */
    struct stored *store;   /* recent Responses (newest first), for previous_response_id */
    int n_store;
    size_t store_bytes;
};

/* A finished Responses response: its conversation (internal messages: the input chain + the output). */
typedef struct stored {
    char id[64];
    char *messages_json;
    size_t bytes;
    struct stored *next;
} stored;
#define STORE_MAX 256                 /* responses kept for previous_response_id */
#define STORE_MAX_BYTES ((size_t)64 << 20)

/* Per-request state. */
typedef struct conn {
    char *body;
    size_t len, cap;
    int ep;
    int answered;       /* a response was queued before the body was read */
    int too_large;      /* the body passed the limit: dropped, 413 at its end */
    int cors_ok;        /* the request's Origin is the allowed one */
    char origin[256];
    job *j;
} conn;

static void count_request(ms_server *s, int ep, int status) {
    int k = N_STATUS;
    for (int i = 0; i < N_STATUS; i++)
        if (k_statuses[i] == status) k = i;
    pthread_mutex_lock(&s->mmu);
    s->m.requests[ep][k]++;
    pthread_mutex_unlock(&s->mmu);
}

static void job_unref(job *j) {
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    ms_api_request_free(&j->req);
    free(j->prompt);
    free(j->buf);
    ms_grammar_free(j->grammar);
    free(j->lead);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* With j->mu held: let a suspended connection see the news (bytes, done, cancelled). */
static void job_wake(job *j) {
    if (j->suspended && j->conn) {
        j->suspended = 0;
        MHD_resume_connection(j->conn);
    }
}

/* 1 when the peer closed its end of the socket (a half-close counts: see docs/server.md). */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    char c;
    if (p.revents & POLLIN) return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    return 0;
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
        if (j->req.stream) job_wake(j);
    }
    pthread_mutex_unlock(&j->mu);
    return gone || j->nomem;
}

/* The worker's view of a hang-up: checked before each token and between prefill pieces. */
static int job_check_cancel(job *j) {
    pthread_mutex_lock(&j->mu);
    if (!j->cancelled && !j->done && peer_gone(j->fd)) {
        j->cancelled = 1;
        job_wake(j);
    }
    int c = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return c;
}

/* ---------------- the worker: the slot scheduler ---------------- */
/* A job in a slot: its response builder and what the scheduler's callbacks need. */
typedef struct run {
    ms_server *s;
    job *j;
    ms_api_resp *resp;
    ms_outparse_opts po;
    ms_err err;
    int rc, slot, n_tok, deadline_hit;
    double t_last, t_admit;
    int32_t last_id;   /* the last sampled id */
    int32_t *ids;      /* sampled ids, kept when a stop string must be identified (MESSAGES with stop sequences) */
    int n_ids, cap_ids;
} run;

/* ---------------- the response store (Responses' previous_response_id) ---------------- */
/* Keep id -> messages (newest first); the oldest go past STORE_MAX entries or STORE_MAX_BYTES. */
static void store_put(ms_server *s, const char *id, char *messages_json) {
    stored *n = calloc(1, sizeof *n);
    if (!n) { free(messages_json); return; }
    snprintf(n->id, sizeof n->id, "%s", id);
    n->messages_json = messages_json;
    n->bytes = strlen(messages_json) + sizeof *n;
    pthread_mutex_lock(&s->rmu);
    n->next = s->store;
    s->store = n;
    s->n_store++;
    s->store_bytes += n->bytes;
    while (s->n_store > STORE_MAX || (s->store_bytes > STORE_MAX_BYTES && s->n_store > 1)) {
        stored **pp = &s->store;
        while ((*pp)->next) pp = &(*pp)->next;
        stored *old = *pp;
        *pp = NULL;
        s->n_store--;
        s->store_bytes -= old->bytes;
        free(old->messages_json);
        free(old);
    }
    pthread_mutex_unlock(&s->rmu);
}

/* A copy of a stored response's messages (malloc'd) or NULL. */
static char *store_get(ms_server *s, const char *id) {
    char *out = NULL;
    pthread_mutex_lock(&s->rmu);
    for (stored *n = s->store; n; n = n->next)
        if (!strcmp(n->id, id)) { out = strdup(n->messages_json); break; }
    pthread_mutex_unlock(&s->rmu);
    return out;
}

static void store_free(ms_server *s) {
    for (stored *n = s->store, *nx; n; n = nx) {
        nx = n->next;
        free(n->messages_json);
        free(n);
    }
    s->store = NULL;
}

/* The input chain + the produced assistant message, stored under the response's id. */
static void store_response(ms_server *s, job *j, ms_api_resp *resp) {
    char *m = ms_api_resp_message_json(resp);
    cJSON *in = j->req.input_json ? cJSON_Parse(j->req.input_json) : NULL, *msg = m ? cJSON_Parse(m) : NULL;
    free(m);
    if (cJSON_IsArray(in) && msg) {
        /* as the client saw it: text trimmed as in the output items (api_agent.c), content a string */
        const char *keys[2] = {"content", "reasoning_content"};
        for (int k = 0; k < 2; k++) {
            cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, keys[k]);
            if (!cJSON_IsString(c)) {
                if (!k) cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", cJSON_CreateString(""));
                continue;
            }
            const char *t = c->valuestring;
            while (*t && strchr(" \t\r\n", *t)) t++;
            size_t n = strlen(t);
            while (n && strchr(" \t\r\n", t[n - 1])) n--;
            char *tr = strndup(t, n);
            if (tr) cJSON_ReplaceItemInObjectCaseSensitive(msg, keys[k], cJSON_CreateString(tr));
            free(tr);
        }
        cJSON_AddItemToArray(in, msg);
        msg = NULL;
        char *t = cJSON_PrintUnformatted(in);
        if (t) store_put(s, ms_api_resp_id(resp), t);
    }
    cJSON_Delete(in);
    cJSON_Delete(msg);
}

/* The stop string that ended a generation: the earliest match in the decoded output (as the stop
 * matcher chose it), or NULL. */
static const char *which_stop(ms_server *s, job *j, const run *g) {
    if (!j->req.n_stop || !g->n_ids) return NULL;
    for (int i = 0; i < s->o.n_eos; i++)
        if (s->eos[i] == g->last_id) return NULL; /* ended by EOS */
    char *text = NULL;
    size_t tl = 0;
    ms_err err = {0};
    if (ms_tok_decode(s->o.tok, g->ids, (size_t)g->n_ids, 0, &text, &tl, &err)) return NULL;
    const char *best = NULL;
    size_t first = SIZE_MAX;
    for (int i = 0; i < j->req.n_stop; i++) {
        const char *m = memmem(text, tl, j->req.stop[i], strlen(j->req.stop[i]));
        if (m && (size_t)(m - text) < first) { first = (size_t)(m - text); best = j->req.stop[i]; }
    }
    free(text);
    return best;
}

static int j_keeps_ids(const run *g) { return g->j->req.kind == MS_API_MESSAGES && g->j->req.n_stop > 0; }

static int on_token(void *user, int32_t id, const char *text, size_t len) {
    run *g = user;
    if (id >= 0) {
        double t = now_s();
        pthread_mutex_lock(&g->s->mmu);
        if (!g->n_tok) hist_add(&g->s->m.ttft, k_ttft_b, N_TTFT, t - g->j->t_arrive);
        else hist_add(&g->s->m.itl, k_itl_b, N_ITL, t - g->t_last);
        pthread_mutex_unlock(&g->s->mmu);
        g->t_last = t;
        g->n_tok++;
        g->last_id = id;
        if (j_keeps_ids(g)) {
            if (g->n_ids == g->cap_ids) {
                int cap = g->cap_ids ? g->cap_ids * 2 : 256;
                int32_t *n = realloc(g->ids, sizeof *n * (size_t)cap);
                if (n) { g->ids = n; g->cap_ids = cap; }
            }
            if (g->n_ids < g->cap_ids) g->ids[g->n_ids++] = id;
        }
    }
    int rc = ms_api_resp_text(g->resp, text, len, job_sink, g->j, &g->err);
    if (rc) {
        g->rc = rc;
        return 1;
    }
    return job_check_cancel(g->j);
}

/* ms_gen_logprob_fn: the token's logprobs go to the response builder (sent with its text) */
static void on_logprob(void *user, int32_t id, float lp, const int32_t *top, const float *tlp, int n) {
    struct run *g = user;
    if (ms_api_resp_logprob(g->resp, id, lp, top, tlp, n)) g->rc = MS_ERR_NOMEM;
}

static void random_hex(char *out, int n) {
    uint8_t b[32];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)(rand() ^ (int)time(NULL));
    for (int i = 0; i < n; i++) out[i] = "0123456789abcdef"[(b[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[n] = 0;
}

/* The job ends with an error: its JSON body (json, or e's) and status, unless a stream already started:
 * then a `data: {"error":...}` event and [DONE]. */
static void job_error(job *j, const ms_api_error *e, const char *json) {
    pthread_mutex_lock(&j->mu);
    int sse = j->req.stream && j->started;
    if (!sse) {
        j->len = j->off = 0; /* replace a partial body */
        j->status = e->status;
    }
    pthread_mutex_unlock(&j->mu);
    if (sse) {
        ms_api_resp_stream_error_kind(j->req.kind, e, job_sink, j);
        return;
    }
    char *b = json ? NULL : j->req.kind == MS_API_MESSAGES ? ms_api_anthropic_error_json(e) : ms_api_error_json(e);
    const char *t = json ? json : b;
    if (t) job_sink(j, t, strlen(t));
    free(b);
}

/* The job left the worker: counted off, then done and its connection woken, the worker's reference
 * dropped. Counted off first: a client that sees its answer end and sends the next request at once
 * must find the room this one held (else a full queue refuses it with a 503 for a job already over). */
static void job_end(ms_server *s, job *j, int slot) {
    pthread_mutex_lock(&s->mu);
    s->queued--;
    if (slot >= 0) {
        s->slot_job[slot] = NULL;
        s->running--;
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    job_wake(j);
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
}

/* 504: the deadline passed before the first token. evaluated: prompt tokens in the slot's state, of which
 * reused were there before the request; resumes: the same request sent again starts from them. */
static void deadline_error(ms_server *s, job *j, int evaluated, int reused, int resumes) {
    double el = now_s() - j->t_arrive;
    ms_api_error e;
    if (evaluated > 0)
        ms_api_fail(&e, 504, "timeout_error", NULL, "deadline_exceeded",
                    "the request's deadline of %.3g s passed after %.3f s, before the first token: %d of the prompt's %d "
                    "tokens are evaluated (%d reused from earlier requests, %d evaluated for this one); %s",
                    j->deadline_s, el, evaluated, j->n_prompt, reused, evaluated - reused,
                    resumes ? "the same request sent again resumes from them" : "a retry starts over");
    else
        ms_api_fail(&e, 504, "timeout_error", NULL, "deadline_exceeded",
                    "the request's deadline of %.3g s passed after %.3f s while it waited for a slot: no prompt token "
                    "was evaluated",
                    j->deadline_s, el);
    char *b = ms_api_error_json(&e), *out = NULL;
    cJSON *root = b ? cJSON_Parse(b) : NULL, *eo = cJSON_GetObjectItemCaseSensitive(root, "error");
    if (eo) {
        cJSON_AddNumberToObject(eo, "elapsed_s", el);
        cJSON_AddNumberToObject(eo, "deadline_s", j->deadline_s);
        cJSON_AddNumberToObject(eo, "prompt_tokens", j->n_prompt);
        cJSON_AddNumberToObject(eo, "prompt_tokens_evaluated", evaluated);
        cJSON_AddNumberToObject(eo, "prompt_tokens_reused", reused);
        cJSON_AddBoolToObject(eo, "retry_resumes", resumes);
        out = cJSON_PrintUnformatted(root);
    }
    cJSON_Delete(root);
    job_error(j, &e, out ? out : b);
    free(out);
    free(b);
    pthread_mutex_lock(&s->mmu);
    s->m.deadline_first++;
    pthread_mutex_unlock(&s->mmu);
}

/* The scheduler's end of a request (inside ms_sched_step): the response's end, or its error; metrics. */
static void on_done(void *user, int rc, const ms_gen_result *res0, const ms_err *err) {
    run *g = user;
    ms_server *s = g->s;
    job *j = g->j;
    ms_gen_result res = *res0;
    if (rc && !g->err.msg[0] && err) g->err = *err;
    if (!rc && g->rc) rc = g->rc;
    pthread_mutex_lock(&j->mu);
    int cancelled = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    int evaluated = 0;
    ms_generator *gen = ms_sched_generator(s->sched, g->slot);
    if (gen) ms_generator_history(gen, &evaluated);
    if (evaluated > j->n_prompt) evaluated = j->n_prompt;
    ms_sched_stats st;
    ms_sched_get_stats(s->sched, &st);
    int kept = st.kept_prefixes > s->kept_seen; /* this slot's evaluated prefix was just saved as a snapshot */
    s->kept_seen = st.kept_prefixes;
    if (!rc && !cancelled && g->deadline_hit && !g->n_tok) {
        int resumes = evaluated > 0 && (s->o.reuse == MS_SERVER_REUSE_ROLLBACK || kept ||
                                        (s->o.reuse == MS_SERVER_REUSE_SNAPSHOTS && evaluated == j->n_prompt));
        deadline_error(s, j, evaluated, res.cached_tokens, resumes);
    } else if (!rc && !cancelled && (res.finish != MS_FINISH_ABORT || g->deadline_hit)) {
        ms_finish fin = res.finish;
        if (g->deadline_hit && fin == MS_FINISH_ABORT) {
            fin = MS_FINISH_LENGTH;
            ms_api_resp_deadline(g->resp);
            pthread_mutex_lock(&s->mmu);
            s->m.deadline_after++;
            pthread_mutex_unlock(&s->mmu);
        }
        if (fin == MS_FINISH_STOP && j->req.kind == MS_API_MESSAGES)
            rc = ms_api_resp_set_stop_sequence(g->resp, which_stop(s, j, g));
        if (!rc)
            rc = ms_api_resp_finish(g->resp, fin, res.prompt_tokens, res.completion_tokens, res.cached_tokens, job_sink,
                                    j, &g->err);
    }
    pthread_mutex_lock(&j->mu);
    cancelled = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    if (!rc && !cancelled && j->req.kind == MS_API_RESPONSES && j->req.store && res.finish != MS_FINISH_ABORT)
        store_response(s, j, g->resp);
    free(g->ids);
    pthread_mutex_lock(&s->mmu);
    s->m.generations++;
    s->m.prompt_tokens += (uint64_t)res.prompt_tokens;
    s->m.completion_tokens += (uint64_t)res.completion_tokens;
    s->m.cached_tokens += (uint64_t)(res.cached_tokens > 0 ? res.cached_tokens : 0);
    s->m.prefix_hits += res.cached_tokens > 0;
    if (!rc && !cancelled && (res.finish != MS_FINISH_ABORT || g->deadline_hit)) {
        double took = now_s() - g->t_admit;
        s->m.slot_s = s->m.slot_n ? 0.8 * s->m.slot_s + 0.2 * took : took;
        s->m.slot_n++;
    }
    s->m.cancelled += cancelled;
    s->m.failed += rc && !cancelled;
    pthread_mutex_unlock(&s->mmu);
    if (rc && !cancelled) {
        ms_api_error e;
        ms_api_fail(&e, 500, "server_error", NULL, NULL, "generation failed: %s", g->err.msg[0] ? g->err.msg : ms_status_name(rc));
        ms_api_scrub_paths(e.message, s->model_dir);
        job_error(j, &e, NULL);
    }
    ms_api_resp_free(g->resp);
    if (g->slot >= 0) s->slot_run[g->slot] = NULL;
    job_end(s, j, g->slot);
    free(g);
}

/* Put j into a free slot (between steps). */
static void admit(ms_server *s, job *j) {
    run *g = calloc(1, sizeof *g);
    if (!g) {
        ms_api_error e;
        ms_api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        job_error(j, &e, NULL);
        job_end(s, j, -1);
        return;
    }
    g->s = s;
    g->j = j;
    g->slot = -1;
    g->t_admit = now_s();
    char hex[32], id[48];
    random_hex(hex, 24);
    ms_api_kind kind = j->req.kind;
    snprintf(id, sizeof id, "%s%s", kind == MS_API_CHAT ? "chatcmpl-" : kind == MS_API_MESSAGES ? "msg_" :
                                    kind == MS_API_RESPONSES ? "resp_" : "cmpl-", hex);
    if (!j->req.has_seed) {
        uint64_t seed;
        if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) seed = (uint64_t)time(NULL);
        j->req.sampling.seed = seed;
    }
    g->po = (ms_outparse_opts){.start_in_reasoning = j->start_in_reasoning, .tools_json = j->req.tools_json};
    if (getrandom(&g->po.id_seed, sizeof g->po.id_seed, 0) != (ssize_t)sizeof g->po.id_seed)
        g->po.id_seed = j->req.sampling.seed ^ 0x5eedULL;
    ms_api_resp_opts ro = {.kind = j->req.kind, .id = id, .model = s->model_name, .created = (int64_t)time(NULL),
                           .stream = j->req.stream, .include_usage = j->req.include_usage, .fmt = s->o.fmt, .parse = &g->po,
                           .prompt_tokens = j->n_prompt, .echo_json = j->req.echo_json,
                           .previous_response_id = j->req.previous_response_id,
                           .single_tool_call = !j->req.parallel_tool_calls, .logprobs = j->req.logprobs, .tok = s->o.tok};
    ms_gen_params gp = {.sampling = j->req.sampling, .max_tokens = j->max_tokens,
                        .stop = (const char *const *)j->req.stop, .n_stop = j->req.n_stop, .eos_ids = s->eos,
                        .n_eos = s->o.n_eos, .forced_ids = s->forced, .n_forced = s->o.n_forced,
                        .constraint = j->grammar ? &j->con : NULL,
                        .logprob_fn = j->req.logprobs ? on_logprob : NULL, .top_logprobs = j->req.top_logprobs};
    int slot = -1;
    int rc = ms_api_resp_new(&ro, &g->resp, &g->err);
    if (!rc) rc = ms_sched_submit(s->sched, j->prompt, j->n_prompt, &gp, on_token, on_done, g, &slot, &g->err);
    if (rc) {
        ms_api_error e;
        int client = rc == MS_ERR_ARG || rc == MS_ERR_LIMIT;
        ms_api_fail(&e, client ? 400 : 500, client ? "invalid_request_error" : "server_error", NULL, NULL, "%s%s",
                    client ? "" : "generation failed: ", g->err.msg[0] ? g->err.msg : ms_status_name(rc));
        ms_api_scrub_paths(e.message, s->model_dir);
        job_error(j, &e, NULL);
        ms_api_resp_free(g->resp);
        free(g);
        pthread_mutex_lock(&s->mmu);
        s->m.failed += !client;
        pthread_mutex_unlock(&s->mmu);
        job_end(s, j, -1);
        return;
    }
    g->slot = slot;
    s->slot_run[slot] = g;
    pthread_mutex_lock(&s->mu);
    s->slot_job[slot] = j;
    s->running++;
    pthread_mutex_unlock(&s->mu);
}

static void sample_engine_stats(ms_server *s) {
    ms_server_engine_stats st = {0};
    if (s->o.stats) s->o.stats(s->o.stats_user, &st);
    ms_sched_stats ss;
    ms_sched_get_stats(s->sched, &ss);
    pthread_mutex_lock(&s->mmu);
    s->m.eng = st;
    s->m.sched = ss;
    pthread_mutex_unlock(&s->mmu);
}

/* /slots' and /metrics' view of the slots, refreshed by the worker after every step. */
static void publish_slots(ms_server *s) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_slots; i++) {
        slot_view *v = &s->view[i];
        ms_sched_slot_info(s->sched, i, &v->info);
        job *j = s->slot_job[i];
        v->t_arrive = j ? j->t_arrive : 0;
        v->deadline_s = j ? j->deadline_s : 0;
        v->stream = j ? j->req.stream : 0;
    }
    pthread_mutex_unlock(&s->mu);
}

static void *worker_main(void *arg) {
    ms_server *s = arg;
    sample_engine_stats(s);
    job *adm[64];
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->running && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
        if (s->stopping) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        /* join: queued requests take the free slots (in arrival order); queued ones past their deadline (504)
         * or whose client left go too */
        int na = 0, nslot = 0, free_slots = ms_sched_free_slots(s->sched);
        double t = now_s();
        for (job **pp = &s->head; *pp && na < 64;) {
            job *j = *pp;
            pthread_mutex_lock(&j->mu);
            int gone = j->cancelled;
            pthread_mutex_unlock(&j->mu);
            int late = gone || (j->t_deadline > 0 && t >= j->t_deadline);
            if (late || nslot < free_slots) {
                *pp = j->next;
                adm[na++] = j;
                nslot += !late;
            } else {
                pp = &j->next;
            }
        }
        s->tail = s->head;
        while (s->tail && s->tail->next) s->tail = s->tail->next;
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < na; i++) {
            job *j = adm[i];
            pthread_mutex_lock(&j->mu);
            int skip = j->cancelled;
            pthread_mutex_unlock(&j->mu);
            if (skip) job_end(s, j, -1);
            else if (j->t_deadline > 0 && t >= j->t_deadline) {
                deadline_error(s, j, 0, 0, 0);
                job_end(s, j, -1);
            } else admit(s, j);
        }
        if (na) publish_slots(s);
        /* leave at the next step: hang-ups (also mid-prefill), deadlines */
        t = now_s();
        for (int i = 0; i < s->n_slots; i++) {
            run *g = s->slot_run[i];
            if (!g) continue;
            ms_sched_slot info;
            ms_sched_slot_info(s->sched, i, &info);
            if (info.state == MS_SLOT_DONE) continue; /* it ended on its own: leaves as it is */
            if (job_check_cancel(g->j)) ms_sched_cancel(s->sched, i);
            else if (!g->deadline_hit && g->j->t_deadline > 0 && t >= g->j->t_deadline) {
                g->deadline_hit = 1;
                ms_sched_cancel(s->sched, i);
            }
        }
        if (ms_sched_active(s->sched)) {
            ms_err err = {0};
            ms_sched_step(s->sched, &err); /* a failed step ends the requests it concerned, with its error */
        }
        publish_slots(s);
        sample_engine_stats(s);
    }
    /* stopping: every request is cancelled; the slots' requests leave, the queue empties */
    for (int i = 0; i < s->n_slots; i++)
        if (s->slot_run[i]) {
            job *j = s->slot_run[i]->j;
            pthread_mutex_lock(&j->mu);
            j->cancelled = 1;
            job_wake(j);
            pthread_mutex_unlock(&j->mu);
            ms_sched_cancel(s->sched, i);
        }
    if (ms_sched_active(s->sched)) {
        ms_err err = {0};
        ms_sched_step(s->sched, &err);
    }
    for (;;) {
        pthread_mutex_lock(&s->mu);
        job *j = s->head;
        if (j) s->head = j->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        if (!j) break;
        job_end(s, j, -1);
    }
    publish_slots(s);
    return NULL;
}

/* ---------------- the watchdog ---------------- */
static void *watch_main(void *arg) {
    ms_server *s = arg;
    double hto = s->o.header_timeout_s, bto = s->o.body_timeout_s;
    for (;;) {
        pthread_mutex_lock(&s->wmu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->wcv, &s->wmu, &ts);
        pthread_mutex_unlock(&s->wmu);
        pthread_mutex_lock(&s->mu);
        int stop = s->stopping;
        /* queued and running requests whose client hung up (the worker frees their slots at the next step) */
        int woke = 0;
        for (int i = 0; i <= s->n_slots; i++)
            for (job *j = i < s->n_slots ? s->slot_job[i] : s->head; j; j = i < s->n_slots ? NULL : j->next) {
                pthread_mutex_lock(&j->mu);
                if (!j->done && !j->cancelled && peer_gone(j->fd)) {
                    j->cancelled = 1;
                    job_wake(j);
                    woke = 1;
                }
                pthread_mutex_unlock(&j->mu);
            }
        if (woke) pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        /* header and body deadlines: shut the socket down, libmicrohttpd then closes it */
        double t = now_s();
        int killed = 0;
        pthread_mutex_lock(&s->smu);
        for (sock *k = s->socks; k; k = k->next) {
            if (k->killed || k->stage == 2) continue;
            if (t - k->t0 > (k->stage == 0 ? hto : bto)) {
                shutdown(k->fd, SHUT_RDWR);
                k->killed = 1;
                killed++;
            }
        }
        pthread_mutex_unlock(&s->smu);
        if (killed) {
            pthread_mutex_lock(&s->mmu);
            s->m.timeouts += (uint64_t)killed;
            pthread_mutex_unlock(&s->mmu);
        }
    }
    return NULL;
}

static void on_socket(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    ms_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        sock *k = calloc(1, sizeof *k);
        *socket_context = k;
        if (!k) return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        k->t0 = now_s();
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        const struct sockaddr *sa = ai ? ai->client_addr : NULL;
        if (sa && sa->sa_family == AF_INET) {
            k->fam = AF_INET;
            memcpy(k->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        } else if (sa && sa->sa_family == AF_INET6) {
            k->fam = AF_INET6;
            memcpy(k->addr, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        }
        pthread_mutex_lock(&s->smu);
        k->over = s->n_socks >= s->o.max_connections;
        if (s->o.max_connections_per_ip > 0 && k->fam) { /* the peer's open connections (at most the cap + 64 to scan) */
            int same = 0;
            for (sock *o = s->socks; o; o = o->next)
                same += o->fam == k->fam && !memcmp(o->addr, k->addr, k->fam == AF_INET ? 4 : 16);
            k->over_ip = same >= s->o.max_connections_per_ip;
        }
        s->n_socks++;
        k->next = s->socks;
        if (s->socks) s->socks->prev = k;
        s->socks = k;
        pthread_mutex_unlock(&s->smu);
        if (k->over || k->over_ip) {
            pthread_mutex_lock(&s->mmu);
            s->m.refused_connections++;
            s->m.refused_per_ip += !k->over && k->over_ip;
            pthread_mutex_unlock(&s->mmu);
        }
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        sock *k = *socket_context;
        if (!k) return;
        pthread_mutex_lock(&s->smu);
        if (k->prev) k->prev->next = k->next;
        else s->socks = k->next;
        if (k->next) k->next->prev = k->prev;
        s->n_socks--;
        pthread_mutex_unlock(&s->smu);
        free(k);
        *socket_context = NULL;
    }
}

static sock *sock_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void sock_stage(ms_server *s, struct MHD_Connection *c, int stage) {
    sock *k = sock_of(c);
    if (!k) return;
    pthread_mutex_lock(&s->smu);
    k->stage = stage;
    k->t0 = now_s();
    pthread_mutex_unlock(&s->smu);
}

/* ---------------- HTTP ---------------- */
/* Queue r with the CORS header when the origin is allowed; counts the status. */
static enum MHD_Result respond(ms_server *s, struct MHD_Connection *c, conn *cn, int status, struct MHD_Response *r) {
    if (!r) return MHD_NO;
    if (cn && cn->cors_ok) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", cn->origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
    count_request(s, cn ? cn->ep : EP_OTHER, status);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

/* hdrs: NULL-terminated name/value pairs (may be NULL). */
static enum MHD_Result send_body(ms_server *s, struct MHD_Connection *c, conn *cn, int status, const char *body,
                                 size_t len, const char *ctype, const char *const *hdrs) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype ? ctype : "application/json");
    for (int i = 0; hdrs && hdrs[i]; i += 2) MHD_add_response_header(r, hdrs[i], hdrs[i + 1]);
    return respond(s, c, cn, status, r);
}

static int anthropic_ep(int ep) { return ep == EP_MESSAGES || ep == EP_COUNT_TOKENS; }

static enum MHD_Result send_error_h(ms_server *s, struct MHD_Connection *c, conn *cn, const ms_api_error *e,
                                    const char *const *hdrs) {
    char *b = cn && anthropic_ep(cn->ep) ? ms_api_anthropic_error_json(e) : ms_api_error_json(e);
    if (!b) return MHD_NO;
    enum MHD_Result rc = send_body(s, c, cn, e->status, b, strlen(b), NULL, hdrs);
    free(b);
    return rc;
}

static enum MHD_Result send_error(ms_server *s, struct MHD_Connection *c, conn *cn, const ms_api_error *e) {
    return send_error_h(s, c, cn, e, NULL);
}

static enum MHD_Result send_json(ms_server *s, struct MHD_Connection *c, conn *cn, int status, cJSON *j) {
    char *b = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!b) return MHD_NO;
    enum MHD_Result rc = send_body(s, c, cn, status, b, strlen(b), NULL, NULL);
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
    job_unref(j);
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
        char *prev = store_get(s, j->req.previous_response_id);
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
        rc = ms_chat_render(s->model_dir, j->req.render_json, strlen(j->req.render_json), &prompt, &plen, &err);
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
    job_unref(j);
    return rc ? rc : MS_ERR_ARG;
}

/* Retry-After for a refused request: the time the requests waiting now need to get a slot, at the
 * measured mean time a request spends in a slot (one of the n slots frees every mean / n seconds):
 * ceil(waiting * mean / n), at least 1 s (also before anything was measured), at most an hour.
 * *mean_out: the mean used (0: none yet). */
static int retry_after(ms_server *s, int waiting, double *mean_out) {
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
        *retry = retry_after(s, waiting, &mean);
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
    if (ok) rc = send_body(s, c, cn, status, body ? body : "", len, NULL, NULL);
    free(body);
    return rc;
}

static enum MHD_Result handle_generate(ms_server *s, struct MHD_Connection *c, ms_api_kind kind, conn *cn) {
    ms_api_error e;
    job *j;
    if (prepare(s, kind, cn->body, cn->len, 1, &j, &e)) return send_error(s, c, cn, &e);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->conn = c;
    int retry = 1;
    if (enqueue(s, j, &e, &retry)) {
        job_unref(j);
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry);
        const char *h[] = {"Retry-After", ra, NULL};
        return send_error_h(s, c, cn, &e, h);
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
    if (ms_api_check_json(cn->body, cn->len, &e)) return send_error(s, c, cn, &e);
    cJSON *root = cJSON_ParseWithLength(cn->body, cn->len);
    int chat = cJSON_IsObject(root) && cJSON_GetObjectItemCaseSensitive(root, "messages");
    cJSON_Delete(root);
    job *j;
    if (prepare(s, chat ? MS_API_CHAT : MS_API_COMPLETION, cn->body, cn->len, 0, &j, &e)) return send_error(s, c, cn, &e);
    cJSON *o = cJSON_CreateObject(), *t = cJSON_AddArrayToObject(o, "tokens");
    for (int i = 0; i < j->n_prompt; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(j->prompt[i]));
    cJSON_AddNumberToObject(o, "count", j->n_prompt);
    cJSON_AddNumberToObject(o, "max_model_len", ms_generator_max_ctx(s->o.gen));
    job_unref(j);
    return send_json(s, c, cn, 200, o);
}

/* POST /v1/messages/count_tokens: an Anthropic Messages body -> {"input_tokens": N}. */
static enum MHD_Result handle_count_tokens(ms_server *s, struct MHD_Connection *c, conn *cn) {
    ms_api_error e;
    job *j;
    if (prepare(s, MS_API_COUNT_TOKENS, cn->body, cn->len, 0, &j, &e)) return send_error(s, c, cn, &e);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", j->n_prompt);
    job_unref(j);
    return send_json(s, c, cn, 200, o);
}

/* POST /detokenize: {"tokens": [ids]} -> {"prompt": text} (special tokens kept). */
static enum MHD_Result handle_detokenize(ms_server *s, struct MHD_Connection *c, conn *cn) {
    ms_api_error e;
    if (!cn->len) {
        ms_api_fail(&e, 400, "invalid_request_error", NULL, NULL, "the request body is empty: expected a JSON object");
        return send_error(s, c, cn, &e);
    }
    if (ms_api_check_json(cn->body, cn->len, &e)) return send_error(s, c, cn, &e);
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
            return send_json(s, c, cn, 200, o);
        }
        free(ids);
    }
    cJSON_Delete(root);
    return send_error(s, c, cn, &e);
}

static void prom_hist(FILE *f, const char *name, const char *help, const hist *h, const double *b, int nb) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < nb; i++) fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, b[i], (unsigned long long)h->b[i]);
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->n, name, h->sum,
            name, (unsigned long long)h->n);
}

#define PROM(f, type, name, help, fmt, v) fprintf(f, "# HELP " name " " help "\n# TYPE " name " " type "\n" name " " fmt "\n", v)

static enum MHD_Result handle_metrics(ms_server *s, struct MHD_Connection *c, conn *cn) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return MHD_NO;
    pthread_mutex_lock(&s->mu);
    int queued = s->queued, running = s->running, by_state[4] = {0};
    for (int i = 0; i < s->n_slots; i++) by_state[s->view[i].info.state]++;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->smu);
    int nconn = s->n_socks;
    pthread_mutex_unlock(&s->smu);
    pthread_mutex_lock(&s->mmu);
    metrics m = s->m;
    pthread_mutex_unlock(&s->mmu);
    typedef unsigned long long ull;
    fprintf(f, "# HELP moonshine_requests_total HTTP requests answered, by endpoint and status\n"
               "# TYPE moonshine_requests_total counter\n");
    for (int e = 0; e < EP_N; e++)
        for (int k = 0; k <= N_STATUS; k++)
            if (m.requests[e][k]) {
                if (k < N_STATUS) fprintf(f, "moonshine_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", k_ep_name[e], k_statuses[k], (ull)m.requests[e][k]);
                else fprintf(f, "moonshine_requests_total{endpoint=\"%s\",status=\"other\"} %llu\n", k_ep_name[e], (ull)m.requests[e][k]);
            }
    PROM(f, "counter", "moonshine_generations_total", "generations run by the worker", "%llu", (ull)m.generations);
    PROM(f, "counter", "moonshine_generations_cancelled_total", "generations stopped because the client left", "%llu", (ull)m.cancelled);
    PROM(f, "counter", "moonshine_generations_failed_total", "generations that failed (500)", "%llu", (ull)m.failed);
    PROM(f, "counter", "moonshine_prompt_tokens_total", "prompt tokens of generations", "%llu", (ull)m.prompt_tokens);
    PROM(f, "counter", "moonshine_generation_tokens_total", "tokens generated", "%llu", (ull)m.completion_tokens);
    PROM(f, "counter", "moonshine_prefix_cache_hits_total", "generations that reused a cached prefix", "%llu", (ull)m.prefix_hits);
    PROM(f, "counter", "moonshine_prefix_cached_tokens_total", "prompt tokens reused from a cached prefix", "%llu", (ull)m.cached_tokens);
    prom_hist(f, "moonshine_time_to_first_token_seconds", "arrival to the first generated token", &m.ttft, k_ttft_b, N_TTFT);
    prom_hist(f, "moonshine_inter_token_latency_seconds", "time between generated tokens", &m.itl, k_itl_b, N_ITL);
    PROM(f, "gauge", "moonshine_queue_length", "requests waiting for a slot", "%d", queued - running);
    PROM(f, "gauge", "moonshine_request_slot_seconds_mean", "mean seconds a finished request spent in its slot (EWMA, weight 0.2)", "%.6f",
         m.slot_n ? m.slot_s : 0.0);
    PROM(f, "gauge", "moonshine_retry_after_seconds", "the Retry-After a 503 server_busy would carry now", "%d",
         retry_after(s, queued - running, NULL));
    PROM(f, "gauge", "moonshine_requests_running", "requests in slots", "%d", running);
    PROM(f, "gauge", "moonshine_slots", "parallel slots (--slots)", "%d", s->n_slots);
    PROM(f, "gauge", "moonshine_slots_busy", "slots serving a request", "%d", s->n_slots - by_state[MS_SLOT_FREE]);
    fprintf(f, "# HELP moonshine_slots_state slots by state\n# TYPE moonshine_slots_state gauge\n");
    for (int k = 0; k < 4; k++)
        fprintf(f, "moonshine_slots_state{state=\"%s\"} %d\n", ms_sched_slot_state_name((ms_sched_slot_state)k), by_state[k]);
    PROM(f, "gauge", "moonshine_slot_occupancy", "busy slots / slots", "%.4f", (double)(s->n_slots - by_state[MS_SLOT_FREE]) / s->n_slots);
    PROM(f, "counter", "moonshine_deadline_exceeded_total", "requests whose deadline passed (before the first token: 504)", "%llu",
         (ull)(m.deadline_first + m.deadline_after));
    PROM(f, "counter", "moonshine_deadline_before_first_token_total", "deadlines reached before the first token (504)", "%llu", (ull)m.deadline_first);
    PROM(f, "counter", "moonshine_deadline_after_first_token_total", "deadlines that ended a reply (finish length)", "%llu", (ull)m.deadline_after);
    PROM(f, "counter", "moonshine_sched_steps_total", "scheduler steps", "%llu", (ull)m.sched.steps);
    PROM(f, "counter", "moonshine_sched_decode_steps_total", "batched decode steps", "%llu", (ull)m.sched.decode_steps);
    PROM(f, "counter", "moonshine_sched_decode_rows_total", "sequences decoded, summed over decode steps (rows / steps: the mean batch)", "%llu",
         (ull)m.sched.decode_rows);
    PROM(f, "counter", "moonshine_sched_prefill_tokens_total", "prompt tokens prefilled by the slots", "%llu", (ull)m.sched.prefill_tokens);
    PROM(f, "counter", "moonshine_sched_shared_prefixes_total", "requests that copied their prefix from another slot (rollback models)", "%llu",
         (ull)m.sched.shared_prefixes);
    PROM(f, "counter", "moonshine_sched_shared_tokens_total", "prompt tokens copied from another slot", "%llu", (ull)m.sched.shared_tokens);
    PROM(f, "gauge", "moonshine_open_connections", "open client connections", "%d", nconn);
    PROM(f, "counter", "moonshine_connections_refused_total", "connections opened past --max-connections or --max-connections-per-ip", "%llu", (ull)m.refused_connections);
    PROM(f, "counter", "moonshine_connections_refused_per_ip_total", "of which past --max-connections-per-ip only", "%llu", (ull)m.refused_per_ip);
    PROM(f, "counter", "moonshine_connection_timeouts_total", "connections closed by the header/body deadlines", "%llu", (ull)m.timeouts);
    PROM(f, "counter", "moonshine_engine_tokens_total", "tokens forwarded by the engine (prefill + decode)", "%llu", (ull)m.eng.tokens_forwarded);
    PROM(f, "counter", "moonshine_engine_experts_acquired_total", "unique experts acquired, summed over layers and steps", "%llu", (ull)m.eng.experts_acquired);
    if (m.eng.streaming) {
        PROM(f, "counter", "moonshine_expert_cache_requests_total", "streamed expert requests", "%llu", (ull)m.eng.expert_acquires);
        PROM(f, "counter", "moonshine_expert_cache_hits_total", "streamed expert requests served from the cache", "%llu", (ull)m.eng.expert_hits);
        PROM(f, "counter", "moonshine_expert_cache_misses_total", "streamed expert requests that read", "%llu", (ull)m.eng.expert_misses);
        PROM(f, "gauge", "moonshine_expert_cache_hit_rate", "hits / requests", "%.6f",
             m.eng.expert_acquires ? (double)m.eng.expert_hits / (double)m.eng.expert_acquires : 0.0);
        PROM(f, "counter", "moonshine_expert_read_bytes_total", "bytes read from disk for experts", "%llu", (ull)m.eng.bytes_read);
        PROM(f, "counter", "moonshine_expert_reads_total", "experts loaded", "%llu", (ull)m.eng.expert_reads);
        PROM(f, "counter", "moonshine_expert_read_wait_seconds_total", "time the engine waited on expert reads", "%.6f", m.eng.read_wait_s);
    }
    if (m.eng.prefix_cache) {
        const ms_prefix_cache_stats *pc = &m.eng.pc;
        PROM(f, "gauge", "moonshine_prefix_cache_entries", "state snapshots held (RAM or disk)", "%d", m.eng.prefix_cache_entries);
        PROM(f, "gauge", "moonshine_prefix_cache_bytes", "bytes of state snapshots held in RAM", "%llu", (ull)m.eng.prefix_cache_bytes);
        fprintf(f, "# HELP moonshine_prefix_cache_tier_entries snapshots by tier\n# TYPE moonshine_prefix_cache_tier_entries gauge\n"
                   "moonshine_prefix_cache_tier_entries{tier=\"ram\"} %d\nmoonshine_prefix_cache_tier_entries{tier=\"disk\"} %d\n",
                pc->ram_entries, pc->disk_entries);
        fprintf(f, "# HELP moonshine_prefix_cache_tier_bytes bytes of snapshots by tier\n# TYPE moonshine_prefix_cache_tier_bytes gauge\n"
                   "moonshine_prefix_cache_tier_bytes{tier=\"ram\"} %llu\nmoonshine_prefix_cache_tier_bytes{tier=\"disk\"} %llu\n",
                (ull)pc->ram_bytes, (ull)pc->disk_bytes);
        fprintf(f, "# HELP moonshine_prefix_cache_restores_total snapshot restores by tier\n# TYPE moonshine_prefix_cache_restores_total counter\n"
                   "moonshine_prefix_cache_restores_total{tier=\"ram\"} %llu\nmoonshine_prefix_cache_restores_total{tier=\"disk\"} %llu\n",
                (ull)pc->hits_ram, (ull)pc->hits_disk);
        PROM(f, "counter", "moonshine_prefix_cache_misses_total", "lookups that found no saved prefix", "%llu", (ull)pc->misses);
        PROM(f, "counter", "moonshine_prefix_cache_restored_tokens_total", "tokens of the snapshots restored", "%llu", (ull)pc->restored_tokens);
        PROM(f, "counter", "moonshine_prefix_cache_saves_total", "snapshots saved (new entries)", "%llu", (ull)pc->saves);
        PROM(f, "counter", "moonshine_prefix_cache_checkpoints_total", "of which prefill checkpoints", "%llu", (ull)m.eng.checkpoints);
        fprintf(f, "# HELP moonshine_prefix_cache_evictions_total snapshots evicted by the LRU limits, by tier\n"
                   "# TYPE moonshine_prefix_cache_evictions_total counter\n"
                   "moonshine_prefix_cache_evictions_total{tier=\"ram\"} %llu\nmoonshine_prefix_cache_evictions_total{tier=\"disk\"} %llu\n",
                (ull)pc->evicted_ram, (ull)pc->evicted_disk);
        PROM(f, "counter", "moonshine_prefix_cache_disk_writes_total", "state files written", "%llu", (ull)pc->writes);
        PROM(f, "counter", "moonshine_prefix_cache_disk_write_drops_total", "writes dropped (queue full)", "%llu", (ull)pc->write_drops);
        PROM(f, "counter", "moonshine_prefix_cache_disk_write_errors_total", "writes that failed", "%llu", (ull)pc->write_errors);
        PROM(f, "counter", "moonshine_prefix_cache_disk_removed_total", "files removed as corrupt or foreign", "%llu", (ull)pc->removed);
        PROM(f, "gauge", "moonshine_prefix_cache_disk_queue", "writes waiting for the writer thread", "%d", pc->queued);
    }
    PROM(f, "gauge", "moonshine_uptime_seconds", "seconds since the server started", "%.3f", now_s() - s->t_start);
    fclose(f);
    enum MHD_Result rc = send_body(s, c, cn, 200, buf ? buf : "", len, "text/plain; version=0.0.4; charset=utf-8", NULL);
    free(buf);
    return rc;
}

/* GET /slots: each slot's state, tokens and request age (the worker's view after its last step). */
static enum MHD_Result handle_slots(ms_server *s, struct MHD_Connection *c, conn *cn) {
    cJSON *o = cJSON_CreateObject();
    double t = now_s();
    pthread_mutex_lock(&s->mu);
    cJSON_AddNumberToObject(o, "n_slots", s->n_slots);
    cJSON_AddNumberToObject(o, "busy", s->running);
    cJSON_AddNumberToObject(o, "queued", s->queued - s->running);
    cJSON_AddNumberToObject(o, "max_queue", s->o.max_queue > 0 ? s->o.max_queue : 64);
    cJSON_AddStringToObject(o, "prefix_reuse", s->o.reuse == MS_SERVER_REUSE_SNAPSHOTS ? "shared snapshots"
                                               : s->o.reuse == MS_SERVER_REUSE_ROLLBACK ? "rollback, shared across slots" : "none");
    cJSON *arr = cJSON_AddArrayToObject(o, "slots");
    for (int i = 0; i < s->n_slots; i++) {
        const slot_view *v = &s->view[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", i);
        cJSON_AddStringToObject(e, "state", ms_sched_slot_state_name(v->info.state));
        cJSON_AddNumberToObject(e, "n_ctx_tokens", v->info.history);
        if (v->info.state != MS_SLOT_FREE) {
            cJSON_AddNumberToObject(e, "prompt_tokens", v->info.prompt_tokens);
            cJSON_AddNumberToObject(e, "cached_tokens", v->info.cached_tokens);
            cJSON_AddNumberToObject(e, "prompt_tokens_evaluated",
                                    v->info.state == MS_SLOT_PREFILL ? v->info.history : v->info.prompt_tokens);
            cJSON_AddNumberToObject(e, "completion_tokens", v->info.completion_tokens);
            cJSON_AddBoolToObject(e, "stream", v->stream);
            cJSON_AddNumberToObject(e, "age_s", v->t_arrive > 0 ? t - v->t_arrive : 0);
            if (v->deadline_s > 0) cJSON_AddNumberToObject(e, "deadline_s", v->deadline_s);
        }
        cJSON_AddItemToArray(arr, e);
    }
    pthread_mutex_unlock(&s->mu);
    return send_json(s, c, cn, 200, o);
}

static enum MHD_Result method_not_allowed(ms_server *s, struct MHD_Connection *c, conn *cn, const char *method,
                                          const char *url, const char *allow) {
    ms_api_error e;
    ms_api_fail(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s %.200s: use %s", method, url,
                strcmp(allow, "POST") ? "GET" : "POST");
    const char *h[] = {"Allow", allow, NULL};
    return send_error_h(s, c, cn, &e, h);
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

static int is_post_ep(int ep) {
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
        return send_json(s, c, cn, 200, j);
    }
    case EP_METRICS: return handle_metrics(s, c, cn);
    case EP_ROOT: { /* the chat page: no key needed to load it (it asks for one when the API answers 401) */
        size_t n;
        const char *page = ms_web_chat_page(&n);
        const char *h[] = {"Content-Security-Policy",
                           "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                           "X-Content-Type-Options", "nosniff", "X-Frame-Options", "DENY", "Cache-Control", "no-cache", NULL};
        return send_body(s, c, cn, 200, page, n, "text/html; charset=utf-8", h);
    }
    case EP_SLOTS: return handle_slots(s, c, cn);
    case EP_MODELS:
        if (!strcmp(url, "/v1/models")) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "object", "list");
            cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "data"), model_json(s));
            return send_json(s, c, cn, 200, j);
        }
        if (strcmp(url + 11, s->model_name)) {
            ms_api_fail(&e, 404, "invalid_request_error", "model", "model_not_found", "The model '%.200s' does not exist",
                        url + 11);
            return send_error(s, c, cn, &e);
        }
        return send_json(s, c, cn, 200, model_json(s));
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
    return send_error(s, c, cn, &e);
}

/* A loopback name or the bound address (DNS rebinding: a page on evil.example that resolves to 127.0.0.1
 * still sends "Host: evil.example"). */
static int host_ok(const ms_server *s, const char *h) {
    if (!s->loopback || !h) return 1;
    char name[256];
    size_t n = strlen(h);
    if (n >= sizeof name) return 0;
    if (h[0] == '[') {
        const char *e = strchr(h, ']');
        if (!e || (e[1] && e[1] != ':')) return 0;
        n = (size_t)(e - h - 1);
        memcpy(name, h + 1, n);
    } else {
        const char *colon = strchr(h, ':');
        if (colon && strchr(colon + 1, ':')) return 0; /* bare IPv6 is not a Host */
        n = colon ? (size_t)(colon - h) : n;
        memcpy(name, h, n);
    }
    name[n] = 0;
    for (size_t i = 0; i < n; i++) name[i] = (char)tolower((unsigned char)name[i]);
    if (n && name[n - 1] == '.') name[--n] = 0;
    if (!strcmp(name, "localhost") || (n > 10 && !strcmp(name + n - 10, ".localhost"))) return 1;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, name, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127 || !strcmp(name, s->host_str);
    if (inet_pton(AF_INET6, name, &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6) || !strcmp(name, s->host_str);
    return 0;
}

static int json_ctype(const char *ct) {
    if (!ct) return 0;
    while (*ct == ' ' || *ct == '\t') ct++;
    if (strncasecmp(ct, "application/json", 16)) return 0;
    char e = ct[16];
    return e == 0 || e == ';' || e == ' ' || e == '\t';
}

/* auth: the Authorization header ("Bearer KEY") or, when xkey, the x-api-key header (Anthropic's). */
static int key_ok(const ms_server *s, const char *auth, int xkey) {
    if (!auth || (!xkey && strncasecmp(auth, "Bearer ", 7))) return 0;
    const char *k = xkey ? auth : auth + 7;
    while (*k == ' ') k++;
    unsigned char h[32];
    unsigned int hl = 0;
    if (!EVP_Digest(k, strlen(k), h, &hl, EVP_sha256(), NULL) || hl != 32) return 0;
    return CRYPTO_memcmp(h, s->key_hash, 32) == 0; /* constant time, and the key's length does not show */
}

/* Checks on the headers, before any body is read: exposure (Host, Origin/CORS, key), the connection cap,
 * method, Content-Type and Content-Length. Returns 1 when it answered. */
static int precheck(ms_server *s, struct MHD_Connection *c, const char *url, const char *method, conn *cn,
                    enum MHD_Result *rc) {
    ms_api_error e;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!host_ok(s, host)) {
        ms_api_fail(&e, 403, "invalid_request_error", NULL, "host_not_allowed",
                    "the Host header '%.100s' is not this server's loopback address (a DNS-rebinding guard); "
                    "use localhost, 127.0.0.1 or [::1]", host);
        *rc = send_error(s, c, cn, &e);
        return 1;
    }
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    int preflight = !strcmp(method, "OPTIONS");
    if (origin && host && !preflight) { /* the built-in page's own requests: Origin is this server (Host) */
        const char *o = !strncmp(origin, "http://", 7) ? origin + 7 : NULL;
        if (o && !strcmp(o, host)) origin = NULL;
    }
    if (origin) {
        if (s->cors && (!strcmp(s->cors, "*") || !strcmp(s->cors, origin)) && strlen(origin) < sizeof cn->origin) {
            cn->cors_ok = 1;
            snprintf(cn->origin, sizeof cn->origin, "%s", origin);
        } else {
            ms_api_fail(&e, 403, "invalid_request_error", NULL, "cors_refused",
                        s->cors ? "cross-origin requests from '%.100s' are refused (this server allows only --cors-origin)"
                                : "cross-origin requests from '%.100s' are refused: CORS is off (start the server "
                                  "with --cors-origin ORIGIN to allow a web page at ORIGIN)",
                        origin);
            *rc = send_error(s, c, cn, &e);
            return 1;
        }
    }
    if (preflight) {
        if (!cn->cors_ok) {
            ms_api_fail(&e, 403, "invalid_request_error", NULL, "cors_refused",
                        "CORS preflight refused: %s", s->cors ? "the request has no allowed Origin" : "CORS is off (see --cors-origin)");
            *rc = send_error(s, c, cn, &e);
            return 1;
        }
        const char *h[] = {"Access-Control-Allow-Methods", "GET, POST, OPTIONS", "Access-Control-Allow-Headers",
                           "Authorization, Content-Type, x-api-key, anthropic-version", "Access-Control-Max-Age", "600", NULL};
        *rc = send_body(s, c, cn, 204, "", 0, "text/plain", h);
        return 1;
    }
    sock *k = sock_of(c);
    if (k && (k->over || k->over_ip) && cn->ep != EP_HEALTH) {
        if (k->over)
            ms_api_fail(&e, 503, "server_error", NULL, "too_many_connections",
                        "the server has too many open connections (--max-connections %d); retry later", s->o.max_connections);
        else
            ms_api_fail(&e, 503, "server_error", NULL, "too_many_connections",
                        "your address has too many open connections (--max-connections-per-ip %d); close some, or retry later",
                        s->o.max_connections_per_ip);
        const char *h[] = {"Retry-After", "1", "Connection", "close", NULL};
        *rc = send_error_h(s, c, cn, &e, h);
        return 1;
    }
    const char *xk = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (s->has_key && cn->ep != EP_HEALTH && cn->ep != EP_ROOT &&
        !key_ok(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"), 0) && !key_ok(s, xk, 1)) {
        int given = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization") != NULL || xk;
        ms_api_fail(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
                    given ? "Incorrect API key provided"
                          : "You didn't provide an API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')");
        const char *h[] = {"WWW-Authenticate", "Bearer", NULL};
        *rc = send_error_h(s, c, cn, &e, h);
        return 1;
    }
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (cn->ep == EP_OTHER) {
        ms_api_fail(&e, 404, "invalid_request_error", NULL, "not_found", "no endpoint %s %.200s", method, url);
        *rc = send_error(s, c, cn, &e);
        return 1;
    }
    if (is_post_ep(cn->ep) && !post) {
        *rc = method_not_allowed(s, c, cn, method, url, "POST");
        return 1;
    }
    if (!is_post_ep(cn->ep) && !get) {
        *rc = method_not_allowed(s, c, cn, method, url, "GET, HEAD");
        return 1;
    }
    if (post) {
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        if (!json_ctype(ct)) {
            ms_api_fail(&e, 415, "invalid_request_error", NULL, "unsupported_media_type",
                        "Content-Type must be application/json, got %s%.100s%s", ct ? "'" : "", ct ? ct : "none", ct ? "'" : "");
            *rc = send_error(s, c, cn, &e);
            return 1;
        }
        /* a body past the limit is read and dropped, then 413 (answering before the client has sent it
         * makes many clients see a reset instead of the answer); past limit + 64 MiB it is answered at
         * once and the connection closed */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        unsigned long long clv = cl ? strtoull(cl, NULL, 10) : 0;
        if (clv > s->o.max_body) cn->too_large = 1;
        if (clv > (unsigned long long)s->o.max_body + (64u << 20)) {
            ms_api_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                        "the request body exceeds the limit of %zu bytes (Content-Length %.30s)", s->o.max_body, cl);
            *rc = send_error(s, c, cn, &e);
            return 1;
        }
    }
    return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    ms_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) { /* the headers are in */
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        cn->ep = endpoint_of(url);
        sock_stage(s, c, 1);
        enum MHD_Result rc;
        if (precheck(s, c, url, method, cn, &rc)) {
            cn->answered = 1;
            sock_stage(s, c, 2);
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
    sock_stage(s, c, 2);
    if (cn->too_large) {
        ms_api_error e;
        ms_api_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                    "the request body exceeds the limit of %zu bytes", s->o.max_body);
        return send_error(s, c, cn, &e);
    }
    return route(s, c, url, method, cn);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    ms_server *s = cls;
    conn *cn = *con_cls;
    sock_stage(s, c, 0); /* next: another request's headers, or idle */
    if (!cn) return;
    if (cn->j) {
        job *j = cn->j;
        pthread_mutex_lock(&j->mu);
        if (!j->done) j->cancelled = 1;
        j->conn = NULL;
        j->fd = -1;
        j->suspended = 0;
        pthread_mutex_unlock(&j->mu);
        job_unref(j);
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
    if (pthread_create(&s->worker, NULL, worker_main, s)) {
        server_free(s);
        return ms_fail(err, MS_ERR_NOMEM, "server: cannot start the worker thread");
    }
    if (pthread_create(&s->watch, NULL, watch_main, s)) {
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
                            on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_socket, s, MHD_OPTION_CONNECTION_LIMIT,
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
            job_wake(j);
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
    store_free(s);
    pthread_mutex_destroy(&s->rmu);
    pthread_mutex_destroy(&s->gvmu);
    server_free(s);
}
