/* common.h — shared CLI plumbing: open a model with a pool and an engine. */
#ifndef MS_CLI_COMMON_H
#define MS_CLI_COMMON_H

#include "engine/engine.h"
#include "engine/streaming.h"
#include "model/model.h"

typedef struct ms_cli_ctx {
    ms_model model;
    ms_pool *pool;
    ms_engine *engine;
    int threads;
    double load_seconds;
    ms_expert_source *experts; /* the streaming source when --expert-cache-mib/--io/--store were given, else NULL */
    ms_static_load static_load; /* --static-load */
    ms_backend *backend;        /* --backend: the GPU backend, or NULL (the engine's own CPU backend) */
} ms_cli_ctx;

/* Parse the engine options every command shares (--threads N, --ctx N) from argv, and the
 * expert streaming options (--expert-cache-mib N, --io uring|pread|mmap|auto, --store DIR,
 * --cache-policy lfu-decay|lru, --queue-depth N), which ms_cli_open then applies: any of
 * them streams routed experts through a bounded cache instead of the resident mapping.
 * Also --static-load mmap|read (below), --mla-form auto|absorbed|expanded (ms_mla_form) and
 * --backend cpu|cuda|hip|auto: where the forward runs (auto, the default: the GPU backend when
 * this build has one (MS_WITH_GPU) and a device is present, else the CPU). */
int ms_cli_engine_args(int argc, char **argv, int *threads, int *ctx);
/* Load dir and create pool + engine; prints the error and returns nonzero on failure. */
int ms_cli_open(const char *cmd, const char *dir, int threads, int ctx, ms_cli_ctx *x);
void ms_cli_close(ms_cli_ctx *x);
/* --static-load read (the default is mmap): ms_cli_open moves the static tier into huge-page
 * memory (ms_model_static_read) after the memory plan, unless ms_cli_defer_static_load() was
 * called first; then the caller does it with ms_cli_static_load (bench drops the page cache
 * first: dropping after the move would discard the copy). Prints the error, nonzero on failure. */
void ms_cli_defer_static_load(void);
int ms_cli_static_load(const char *cmd, ms_cli_ctx *x);
/* Print the streaming source's statistics as one line to stderr (nothing when not streaming). */
void ms_cli_print_stream_stats(const ms_cli_ctx *x);
double ms_now(void);

#endif
