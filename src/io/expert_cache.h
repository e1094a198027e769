/* expert_cache.h — which (layer, expert) lives in which cache slot, and what to evict.
 *
 * A global pool of equal slots (one expert each) under one byte budget, shared
 * by all layers. The policy is pure bookkeeping (no I/O), so it can be replayed
 * on routing traces: ms_ecache_* below is what the streaming source drives.
 *
 * Policies:
 *  LRU        evict the least recently used unpinned slot; prefetches always admitted.
 *  LFU_DECAY  every (layer, expert) keeps a use score that decays exponentially
 *             with that layer's steps (half-life `half_life` steps, kept for all
 *             experts, cached or not: a history that outlives eviction); evict the
 *             lowest current score, last use breaking ties, but spare experts used in
 *             the layer's last MS_ECACHE_RECENT steps while others can go (routing
 *             repeats short-term: a fresh expert must get the chance to be reused). A prefetch is admitted
 *             only over a victim whose score is not higher than the candidate's plus
 *             2 x prefetch_bonus (the prefetches' running precision, kept by the owner), so
 *             speculation never pushes out hot experts, and accurate lookahead still loads. */
#ifndef MS_EXPERT_CACHE_H
#define MS_EXPERT_CACHE_H

#include <stdint.h>

#include "util/err.h"

#define MS_ECACHE_RECENT 2

typedef enum ms_cache_policy { MS_CACHE_LFU_DECAY = 0, MS_CACHE_LRU = 1 } ms_cache_policy;

const char *ms_cache_policy_name(ms_cache_policy p);
int ms_cache_policy_parse(const char *s, ms_cache_policy *out, ms_err *err);

enum { MS_SLOT_EMPTY = 0, MS_SLOT_LOADING = 1, MS_SLOT_READY = 2 };

typedef struct ms_ecache_slot {
    int32_t key;        /* layer * n_experts + expert, -1 when empty */
    uint8_t state;      /* MS_SLOT_* (LOADING/READY are set by the owner) */
    uint8_t prefetched; /* loaded by a prefetch and not used yet */
    int32_t pins;       /* > 0: in use, never evicted */
    uint64_t last_use;  /* global tick */
    uint32_t last_step; /* the layer's step at the last use */
} ms_ecache_slot;

typedef struct ms_ecache {
    ms_cache_policy policy;
    int n_slots, n_layers, n_experts;
    ms_ecache_slot *slots;
    int32_t *slot_of;  /* [n_layers * n_experts] -> slot or -1 */
    float *score;      /* [n_layers * n_experts] decayed use count at score_t */
    uint32_t *score_t; /* layer step of the last update */
    uint32_t *layer_t; /* [n_layers] steps so far */
    float decay;       /* per layer step: 2^(-1/half_life) */
    float prefetch_bonus; /* LFU_DECAY admission: a prefetch counts as this likely use (its running precision) */
    uint64_t tick;
} ms_ecache;

/* n_slots >= 1 slots over n_layers x n_experts keys. half_life in layer steps (tokens),
 * e.g. 64; ignored by LRU. Errors: MS_ERR_ARG, MS_ERR_NOMEM. */
int ms_ecache_init(ms_ecache *c, ms_cache_policy policy, int n_slots, int n_layers, int n_experts, double half_life,
                   ms_err *err);
void ms_ecache_free(ms_ecache *c);

/* One step of layer li (call once per acquire of that layer, before lookups). */
void ms_ecache_step(ms_ecache *c, int li);
/* Slot holding (li, e) (any state), or -1. */
static inline int ms_ecache_lookup(const ms_ecache *c, int li, int e) { return c->slot_of[li * c->n_experts + e]; }
/* Record a use of the slot (recency and score). */
void ms_ecache_touch(ms_ecache *c, int slot);
/* The slot to load (li, e) into: an empty slot, else the policy's victim among
 * unpinned READY slots; for a prefetch (for_prefetch 1) LFU_DECAY refuses a victim
 * scoring higher than (li, e). -1 when none. */
int ms_ecache_victim(const ms_ecache *c, int li, int e, int for_prefetch);
/* Make slot hold (li, e) (the old key is dropped); state LOADING, pins unchanged. */
void ms_ecache_assign(ms_ecache *c, int slot, int li, int e);
/* Empty a slot (after a failed read). */
void ms_ecache_drop(ms_ecache *c, int slot);

/* Replay: hits on a trace of T steps x n_layers x k expert ids (trace[(t*L + l)*k + j]),
 * loading every miss (a demand read). Returns hits; misses = T*L*k - hits. */
uint64_t ms_ecache_replay(ms_ecache *c, const int *trace, int T, int k);

#endif
