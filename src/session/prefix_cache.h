/* prefix_cache.h — exact prefix reuse for any model: a bounded set of causal-
 * state snapshots (engine/state.h), each keyed by the token ids it holds, in two
 * tiers: RAM and, optionally, a directory on disk (docs/state.md).
 *
 * A request that shares a prefix with an earlier one restores the snapshot of the
 * longest saved prefix and forwards only the rest; the result is bit-identical to
 * forwarding the same pieces on a fresh engine. RAM entries are evicted least
 * recently used first to stay within max_entries and max_bytes.
 *
 * With a directory, every saved snapshot is also written there as a state file
 * (engine/state.h format: checksums, model identity, section layout), by a writer
 * thread fed through a bounded queue, so saving never waits for the disk (a full
 * queue drops its oldest write). The directory is made 0700, files are 0600,
 * written atomically. Disk entries are evicted least recently used first to stay
 * within disk_entries and disk_bytes. A snapshot evicted from RAM stays on disk and
 * comes back (to RAM) on a hit. At open the directory is scanned: files of this
 * model are indexed by their token ids (header checked), so a restarted server hits
 * on conversations it saw before; a corrupt or foreign file (another model, another
 * format version) is removed with a log line, never loaded. Every file is checked
 * again in full (all checksums, identity, layout, its ids) before it is loaded.
 *
 * The save/restore hooks below match session/generate.h's ms_gen_snapshots (user =
 * the cache). One thread uses the cache (one engine's requests, or a scheduler's);
 * the writer thread is internal. */
#ifndef MS_PREFIX_CACHE_H
#define MS_PREFIX_CACHE_H

#include <stdint.h>

#include "engine/state.h"
#include "model/model.h"
#include "session/generate.h"

typedef struct ms_prefix_cache ms_prefix_cache;

typedef struct ms_prefix_cache_opts {
    int max_entries;        /* RAM: at most this many snapshots (>= 1) */
    uint64_t max_bytes;     /* RAM: at most this many bytes of state (>= 1) */
    const char *dir;        /* disk tier directory (created 0700), or NULL: RAM only */
    const ms_model *model;  /* the model (identity of the disk files); required with dir */
    int disk_entries;       /* disk: at most this many files (default: max_entries) */
    uint64_t disk_bytes;    /* disk: at most this many bytes of files (default 16 GiB) */
    int queue;              /* writes waiting for the writer thread (default 8) */
    /* log lines (a file skipped and removed, a write that failed); NULL: none */
    void (*log)(void *user, const char *line);
    void *log_user;
} ms_prefix_cache_opts;

/* Counters. */
typedef struct ms_prefix_cache_stats {
    int ram_entries, disk_entries;
    uint64_t ram_bytes, disk_bytes;
    uint64_t hits_ram, hits_disk, misses;
    uint64_t writes, write_drops, write_errors; /* disk files written, writes dropped (queue full), failed */
    uint64_t removed;                           /* files removed as corrupt or foreign */
    int queued;                                 /* writes waiting now */
    uint64_t saves;                             /* snapshots taken (new entries) */
    uint64_t restored_tokens;                   /* tokens of the entries restored (hits of both tiers) */
    uint64_t evicted_ram, evicted_disk;         /* entries dropped from RAM / files deleted by the LRU limits */
} ms_prefix_cache_stats;

/* A RAM-only cache of at most max_entries (>= 1) snapshots totalling at most max_bytes
 * (>= 1) bytes of state. Errors: MS_ERR_ARG, MS_ERR_NOMEM. */
int ms_prefix_cache_new(int max_entries, uint64_t max_bytes, ms_prefix_cache **out, ms_err *err);
/* A cache with the options above. Errors: MS_ERR_ARG, MS_ERR_IO (the directory cannot
 * be made or is not a private directory of this user), MS_ERR_NOMEM. */
int ms_prefix_cache_open(const ms_prefix_cache_opts *o, ms_prefix_cache **out, ms_err *err);
/* Waits for the queued writes, then frees. */
void ms_prefix_cache_free(ms_prefix_cache *pc);
/* Wait until the writer thread has written everything queued so far. */
void ms_prefix_cache_flush(ms_prefix_cache *pc);

/* e holds exactly ids[0..n) (n == ms_engine_n_past(e) >= 1): keep a snapshot of
 * it. An entry with the same ids is refreshed (made most recent), not copied
 * again; a snapshot larger than max_bytes is not kept (MS_OK). Errors:
 * MS_ERR_ARG (n does not match the engine), MS_ERR_NOMEM. */
int ms_prefix_cache_save(ms_prefix_cache *pc, ms_engine *e, const int32_t *ids, int n, ms_err *err);

/* Put e in the state of the entry whose ids are the longest prefix of
 * ids[0..n) (at most n tokens); *restored = its length, or 0 when no entry
 * applies (e untouched). A disk entry that fails its checks is removed (logged)
 * and the next longest tried. Errors: those of ms_engine_restore (e unchanged). */
int ms_prefix_cache_restore(ms_prefix_cache *pc, ms_engine *e, const int32_t *ids, int n, int *restored, ms_err *err);

/* Entries (both tiers) and RAM snapshot bytes held. */
int ms_prefix_cache_entries(const ms_prefix_cache *pc);
uint64_t ms_prefix_cache_bytes(const ms_prefix_cache *pc);
void ms_prefix_cache_get_stats(ms_prefix_cache *pc, ms_prefix_cache_stats *out);

/* The prefill checkpoint interval (ms_gen_snapshots.every) for engines of model m made with eo
 * (its max_ctx) whose prefill runs in pieces of chunk tokens: the smallest multiple of chunk
 * for which the checkpoints of one prompt filling the whole context (their state grows with
 * the position: fixed parts + per-token rows, from the memory plan) take at most a quarter of
 * this cache's RAM bytes and entries. max_ctx when none below fits (no checkpoint). */
int ms_prefix_cache_checkpoint_every(const ms_prefix_cache *pc, const ms_model *m, const ms_engine_opts *eo, int chunk);

/* The same as ms_gen_snapshots hooks: user is an ms_prefix_cache *. */
int ms_prefix_cache_save_hook(void *user, ms_engine *e, const int32_t *ids, int n, ms_err *err);
int ms_prefix_cache_restore_hook(void *user, ms_engine *e, const int32_t *ids, int n, int *restored, ms_err *err);
int ms_prefix_cache_entry_hook(void *user, int i, const int32_t **ids, int *n);
int ms_prefix_cache_longest_hook(void *user, const int32_t *ids, int n);
/* The hooks above in an ms_gen_snapshots. */
ms_gen_snapshots ms_prefix_cache_snapshots(ms_prefix_cache *pc);

#endif
