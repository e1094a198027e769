/* server.h — the OpenAI-compatible HTTP server over one generator.
 *
 * Endpoints: GET /health, GET /metrics, GET /v1/models, GET /v1/models/{id},
 * POST /v1/chat/completions, POST /v1/completions, POST /tokenize,
 * POST /detokenize (see docs/server.md). libmicrohttpd runs a small pool of
 * epoll threads; no connection ever blocks one: a request that waits for the
 * worker is suspended and resumed when its bytes are ready. Requests are
 * validated, rendered and tokenized on their connection's thread, then queued;
 * one worker thread owns the slot scheduler (session/slots.h): queued requests
 * join free slots between steps, in arrival order, and every step prefills one
 * chunk and decodes all decoding slots together. A watchdog thread enforces the
 * header and body deadlines and notices clients that hang up while queued or
 * running (their slot is freed at the next step, during prefill too); the worker
 * enforces request deadlines. The server never prints; start/stop return statuses. */
#ifndef MS_SERVER_H
#define MS_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "session/generate.h"
#include "session/prefix_cache.h"
#include "session/slots.h"
#include "text/outparse.h"
#include "text/tokenizer.h"

/* What the engine side reports to /metrics (zeros where it has nothing). */
typedef struct ms_server_engine_stats {
    uint64_t tokens_forwarded, experts_acquired;
    int streaming;                          /* experts are streamed: the next fields mean something */
    uint64_t expert_acquires, expert_hits, expert_misses, bytes_read, expert_reads;
    double read_wait_s;
    int prefix_cache;                       /* a snapshot prefix cache is in use */
    int prefix_cache_entries;
    uint64_t prefix_cache_bytes;
    ms_prefix_cache_stats pc;               /* the snapshot cache's counters (prefix_cache set) */
    uint64_t checkpoints;                   /* prefill checkpoints saved by the slots */
} ms_server_engine_stats;

/* How the slots reuse earlier requests' state: each slot its own previous prefix (models that
 * roll back: the slot's history), a snapshot prefix cache shared by all slots (models that
 * cannot), or nothing. */
typedef enum { MS_SERVER_REUSE_NONE, MS_SERVER_REUSE_ROLLBACK, MS_SERVER_REUSE_SNAPSHOTS } ms_server_reuse;

typedef struct ms_server_opts {
    const char *host;          /* IPv4 or IPv6 address to bind ("127.0.0.1" if NULL; "localhost" = 127.0.0.1) */
    int port;                  /* 0: any free port (ms_server_port tells which) */
    const char *model_name;    /* the id /v1/models reports and requests may name */
    const char *model_dir;     /* chat templates are read from here */
    ms_sched *sched;           /* borrowed: the slots; used only by the worker thread */
    ms_generator *gen;         /* borrowed, may be NULL (then slot 0's): only its context size is read */
    ms_server_reuse reuse;     /* how the sched's slots reuse prefixes (what a 504 says about a retry) */
    double request_deadline_s; /* > 0: every request's deadline (a request's deadline_s may only shorten it) */
    const ms_tokenizer *tok;   /* borrowed */
    int64_t vocab;
    const int32_t *eos_ids;    /* copied */
    int n_eos;
    ms_outfmt fmt;             /* output format of the model family (reasoning / tool calls) */
    size_t max_body;           /* request body limit in bytes (0: MS_API_MAX_BODY) */
    int max_queue;             /* requests waiting for a slot (beyond the slots) before 503 (0: 64) */
    int max_connections;       /* open connections before new ones get 503 (0: 1024; /health is still answered) */
    int max_connections_per_ip; /* open connections of one peer address before its new ones get 503 (0: no
                                  per-address cap; /health is still answered) */
    const char *api_key;       /* bearer key required on every endpoint but /health (NULL/"": none; copied);
                                  ms_server_start refuses a non-loopback host without one */
    const char *cors_origin;   /* the one Origin allowed cross-origin access ("*": any); NULL: CORS off,
                                  requests carrying another Origin are refused (copied) */
    int header_timeout_s;      /* request line + headers must arrive within this (also the keep-alive idle
                                  time); 0: 10 */
    int body_timeout_s;        /* the body must arrive within this after the headers; 0: 30 */
    /* Engine-side counters for /metrics, sampled by the worker after each step (may be NULL). */
    void (*stats)(void *user, struct ms_server_engine_stats *out);
    void *stats_user;
    const int32_t *forced_ids; /* test hook (ms_gen_params.forced_ids), copied; NULL normally */
    int n_forced;
} ms_server_opts;

typedef struct ms_server ms_server;

/* Bind and start serving. Errors: MS_ERR_ARG (bad options, named; a non-loopback
 * host without an api_key, saying how to give one),
 * MS_ERR_IO (the address cannot be bound), MS_ERR_NOMEM. */
int ms_server_start(const ms_server_opts *o, ms_server **out, ms_err *err);
/* The bound port. */
int ms_server_port(const ms_server *s);
/* Stop accepting, cancel queued and running requests, join the threads, free. */
void ms_server_stop(ms_server *s);

#endif
