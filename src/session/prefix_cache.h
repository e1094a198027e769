/* prefix_cache.h — exact prefix reuse for any model: a bounded set of causal-
 * state snapshots (engine/state.h), each keyed by the token ids it holds.
 *
 * For models whose state cannot be rolled back (KDA, gated DeltaNet,
 * compressed attention), a request that shares a prefix with an earlier one
 * restores the snapshot of the longest saved prefix and forwards only the rest;
 * the result is bit-identical to forwarding the same pieces on a fresh engine.
 * Entries are evicted least recently used first to stay within max_entries and
 * max_bytes. The save/restore hooks below match session/generate.h's
 * ms_gen_snapshots (user = the cache). Not thread-safe: one engine's requests. */
#ifndef MS_PREFIX_CACHE_H
#define MS_PREFIX_CACHE_H

#include <stdint.h>

#include "engine/state.h"
#include "session/generate.h"

typedef struct ms_prefix_cache ms_prefix_cache;

/* A cache of at most max_entries (>= 1) snapshots totalling at most max_bytes
 * (>= 1) bytes of state. Errors: MS_ERR_ARG, MS_ERR_NOMEM. */
int ms_prefix_cache_new(int max_entries, uint64_t max_bytes, ms_prefix_cache **out, ms_err *err);
void ms_prefix_cache_free(ms_prefix_cache *pc);

/* e holds exactly ids[0..n) (n == ms_engine_n_past(e) >= 1): keep a snapshot of
 * it. An entry with the same ids is refreshed (made most recent), not copied
 * again; a snapshot larger than max_bytes is not kept (MS_OK). Errors:
 * MS_ERR_ARG (n does not match the engine), MS_ERR_NOMEM. */
int ms_prefix_cache_save(ms_prefix_cache *pc, ms_engine *e, const int32_t *ids, int n, ms_err *err);

/* Put e in the state of the entry whose ids are the longest prefix of
 * ids[0..n) (at most n tokens); *restored = its length, or 0 when no entry
 * applies (e untouched). Errors: those of ms_engine_restore (e unchanged). */
int ms_prefix_cache_restore(ms_prefix_cache *pc, ms_engine *e, const int32_t *ids, int n, int *restored, ms_err *err);

/* Entries and snapshot bytes held. */
int ms_prefix_cache_entries(const ms_prefix_cache *pc);
uint64_t ms_prefix_cache_bytes(const ms_prefix_cache *pc);

/* The same as ms_gen_snapshots hooks: user is an ms_prefix_cache *. */
int ms_prefix_cache_save_hook(void *user, ms_engine *e, const int32_t *ids, int n, ms_err *err);
int ms_prefix_cache_restore_hook(void *user, ms_engine *e, const int32_t *ids, int n, int *restored, ms_err *err);
int ms_prefix_cache_entry_hook(void *user, int i, const int32_t **ids, int *n);
int ms_prefix_cache_longest_hook(void *user, const int32_t *ids, int n);
/* The hooks above in an ms_gen_snapshots. */
ms_gen_snapshots ms_prefix_cache_snapshots(ms_prefix_cache *pc);

#endif
