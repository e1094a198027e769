/* server.h — the OpenAI-compatible HTTP server over one generator.
 *
 * Endpoints: GET /health, GET /v1/models, GET /v1/models/{id},
 * POST /v1/chat/completions, POST /v1/completions (see docs/server.md).
 * libmicrohttpd runs one thread per connection (at most max_connections);
 * requests are validated, rendered and tokenized on their connection's thread,
 * then queued; one worker thread owns the generator and serves the queue in
 * arrival order, one request at a time. A client that disconnects stops its
 * generation (or leaves the queue). The server never prints; start/stop return
 * statuses. */
#ifndef MS_SERVER_H
#define MS_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "session/generate.h"
#include "text/outparse.h"
#include "text/tokenizer.h"

typedef struct ms_server_opts {
    const char *host;          /* IPv4 address to bind ("127.0.0.1" if NULL; "localhost" accepted) */
    int port;                  /* 0: any free port (ms_server_port tells which) */
    const char *model_name;    /* the id /v1/models reports and requests may name */
    const char *model_dir;     /* chat templates are read from here */
    ms_generator *gen;         /* borrowed; used only by the worker thread */
    const ms_tokenizer *tok;   /* borrowed */
    int64_t vocab;
    const int32_t *eos_ids;    /* copied */
    int n_eos;
    ms_outfmt fmt;             /* output format of the model family (reasoning / tool calls) */
    size_t max_body;           /* request body limit in bytes (0: MS_API_MAX_BODY) */
    int max_queue;             /* queued + running requests before 503 (0: 64) */
    int max_connections;       /* 0: 128 */
    const int32_t *forced_ids; /* test hook (ms_gen_params.forced_ids), copied; NULL normally */
    int n_forced;
} ms_server_opts;

typedef struct ms_server ms_server;

/* Bind and start serving. Errors: MS_ERR_ARG (bad options, named),
 * MS_ERR_IO (the address cannot be bound), MS_ERR_NOMEM. */
int ms_server_start(const ms_server_opts *o, ms_server **out, ms_err *err);
/* The bound port. */
int ms_server_port(const ms_server *s);
/* Stop accepting, cancel queued and running requests, join the threads, free. */
void ms_server_stop(ms_server *s);

#endif
