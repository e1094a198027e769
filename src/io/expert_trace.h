/* expert_trace.h — record the calls a streaming expert source receives, and replay
 * them through an expert cache policy without I/O.
 *
 * Routing does not depend on the cache, so the sequence of acquires, prefetches and
 * releases of one run is the same under every policy and budget: replaying it
 * through ms_ecache gives each policy's hit rate and prefetch precision on exactly
 * that run (reads complete at once in the replay, so a prefetch is never late).
 *
 * Text format, one event per line:
 *   moonshine-expert-trace 1
 *   layers L experts E          (store layers: MoE layers in model order, 0-based)
 *   a LI N ID...                acquire N experts of store layer LI
 *   p LI N ID...                prefetch
 *   r LI                        release
 */
#ifndef MS_EXPERT_TRACE_H
#define MS_EXPERT_TRACE_H

#include <stdio.h>

#include "io/expert_cache.h"

/* Writer: the header, then events. Write errors are sticky in the FILE (ferror). */
void ms_expert_trace_header(FILE *f, int n_layers, int n_experts);
void ms_expert_trace_event(FILE *f, char kind, int li, int n, const int *ids);

typedef struct ms_trace_replay_opts {
    ms_cache_policy policy;
    int n_slots;       /* >= 1 */
    int no_prefetch;   /* 1: ignore the trace's prefetches (plain demand caching) */
    double half_life;  /* 0 = 64 */
    int skip_acquires; /* count statistics only after this many acquire events (e.g. the prefill's) */
} ms_trace_replay_opts;

typedef struct ms_trace_replay_result {
    ms_ecache_stats st;  /* counted after skip_acquires */
    int n_layers, n_experts;
    long acquires;       /* acquire events in the trace */
} ms_trace_replay_result;

/* Replay the trace at path. Errors: MS_ERR_IO (cannot read), MS_ERR_FORMAT naming the line
 * (bad header or event, layer or expert id out of range, N not matching the ids, more than
 * the cache's slots pinned at once), MS_ERR_ARG (bad options). */
int ms_expert_trace_replay(const char *path, const ms_trace_replay_opts *o, ms_trace_replay_result *out, ms_err *err);

#endif
