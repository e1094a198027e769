/* server_int.h — internals shared by the server's files: the types (job, sock, metrics, the
 * server, the per-request conn) and the functions one file calls in another. server.c: the HTTP
 * glue (responses, request preparation, the queue, the handlers, routing, start/stop);
 * server_conn.c: connection accounting and limits (per-socket state, the caps, the watchdog, the
 * header checks); server_metrics.c: request counts, /metrics and /slots; server_worker.c: the
 * worker (the slot scheduler's callbacks, the job lifecycle, the response store). Not a public
 * interface. */
#ifndef MS_SERVER_SERVER_INT_H
#define MS_SERVER_SERVER_INT_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "server/api.h"
#include "server/server.h"

/* Seconds on the monotonic clock. */
static inline double now_s(void) {
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

static inline void hist_add(hist *h, const double *bounds, int nb, double v) {
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
/* ---- server_worker.c: the job lifecycle, the response store, the worker thread ---- */
/* Drop one reference (connection, queue/worker, stream response); the last frees the job. */
void ms_srv_job_unref(job *j);
/* With j->mu held: let a suspended connection see the news (bytes, done, cancelled). */
void ms_srv_job_wake(job *j);
/* 1 when the peer closed its end of the socket (a half-close counts: see docs/server.md). */
int ms_srv_peer_gone(int fd);
/* A copy of a stored response's messages (malloc'd) or NULL. */
char *ms_srv_store_get(ms_server *s, const char *id);
/* Free every stored response (at stop, the worker joined). */
void ms_srv_store_free(ms_server *s);
/* The worker thread (arg: the server): owns the slot scheduler until s->stopping. */
void *ms_srv_worker_main(void *arg);

/* ---- server_conn.c: connection accounting and limits ---- */
/* The watchdog thread (arg: the server): hang-ups of queued and running requests, header and body deadlines. */
void *ms_srv_watch_main(void *arg);
/* MHD_OPTION_NOTIFY_CONNECTION: a socket's sock (the caps: over, over_ip) opened and closed. */
void ms_srv_on_socket(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code);
/* The connection's sock, or NULL. */
sock *ms_srv_sock_of(struct MHD_Connection *c);
/* The connection's stage (sock.stage) begins now: the watchdog's deadline for it restarts. */
void ms_srv_sock_stage(ms_server *s, struct MHD_Connection *c, int stage);
/* Checks on the headers, before any body is read: exposure (Host, Origin/CORS, key), the connection cap,
 * method, Content-Type and Content-Length. Returns 1 when it answered (*rc: the answer's). */
int ms_srv_precheck(ms_server *s, struct MHD_Connection *c, const char *url, const char *method, conn *cn,
                    enum MHD_Result *rc);

/* ---- server_metrics.c ---- */
/* One answered request of endpoint ep with status, for moonshine_requests_total. */
void ms_srv_count_request(ms_server *s, int ep, int status);
/* GET /metrics: Prometheus text. */
enum MHD_Result ms_srv_handle_metrics(ms_server *s, struct MHD_Connection *c, conn *cn);
/* GET /slots: each slot's state, tokens and request age (the worker's view after its last step). */
enum MHD_Result ms_srv_handle_slots(ms_server *s, struct MHD_Connection *c, conn *cn);

/* ---- server.c: responses ---- */
/* A response of body (copied) with Content-Type ctype (NULL: application/json); hdrs: NULL-terminated
 * name/value pairs (may be NULL). */
enum MHD_Result ms_srv_send_body(ms_server *s, struct MHD_Connection *c, conn *cn, int status, const char *body,
                                 size_t len, const char *ctype, const char *const *hdrs);
/* e as its endpoint's error body (Anthropic's shape for /v1/messages*), with hdrs as ms_srv_send_body's. */
enum MHD_Result ms_srv_send_error_h(ms_server *s, struct MHD_Connection *c, conn *cn, const ms_api_error *e,
                                    const char *const *hdrs);
enum MHD_Result ms_srv_send_error(ms_server *s, struct MHD_Connection *c, conn *cn, const ms_api_error *e);
/* j printed (and deleted) as the body. */
enum MHD_Result ms_srv_send_json(ms_server *s, struct MHD_Connection *c, conn *cn, int status, cJSON *j);
/* 405 with Allow: allow. */
enum MHD_Result ms_srv_method_not_allowed(ms_server *s, struct MHD_Connection *c, conn *cn, const char *method,
                                          const char *url, const char *allow);
/* 1 for the endpoints answered on POST (the others: GET, HEAD). */
int ms_srv_is_post_ep(int ep);
/* Retry-After for a refused request with waiting requests queued (see server.c). */
int ms_srv_retry_after(ms_server *s, int waiting, double *mean_out);

#endif
