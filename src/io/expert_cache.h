/* expert_cache.h — which (layer, expert) lives in which cache slot, what to evict,
 * and which prefetches to admit.
 *
 * A global pool of equal slots (one expert each) under one byte budget, shared
 * by all layers. The policy is pure bookkeeping (no I/O): the streaming source
 * (io/expert_stream.c) drives it with demand requests and prefetches and does
 * the reads; io/expert_trace.c drives the same functions from a recorded trace,
 * so a policy can be compared offline on the exact sequence a run produced.
 *
 * Policies:
 *  LRU        evict the least recently used unpinned slot; every prefetch is admitted.
 *  LFU_DECAY  every (layer, expert) keeps a use score that decays exponentially
 *             with that layer's steps (half-life `half_life` steps, kept for all
 *             experts, cached or not: a history that outlives eviction).
 *             Victim order: a stale prefetch (its layer's next step came and did not
 *             use it) first, then the lowest current score, sparing experts used in the
 *             layer's last MS_ECACHE_RECENT steps while others can go (routing repeats
 *             short-term), last use breaking ties.
 *             Prefetch admission weighs expected uses: the candidate is worth the
 *             prefetches' running precision p (the chance it is used at its step); the
 *             victim is worth its use rate (score x (1 - decay) per step) times the
 *             steps a slot stays resident (slots / loads per token, measured). A
 *             prefetch is admitted when p is at least the victim's worth, so accurate
 *             lookahead loads into cold slots while a hot set survives inaccurate
 *             lookahead.
 * Both policies protect a prefetch until its step: a prefetch is never the victim of
 * another prefetch or miss before the acquire it was issued for. */
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
    uint32_t pf_step;   /* prefetched: the layer step it was issued for */
} ms_ecache_slot;

/* Counted by ms_ecache_request / ms_ecache_prefetch (per expert). */
typedef struct ms_ecache_stats {
    uint64_t requests, hits, misses;
    uint64_t prefetch_issued;  /* admitted and handed to the owner to load */
    uint64_t prefetch_used;    /* a request found it (hits include these) */
    uint64_t prefetch_wasted;  /* evicted (or dropped) before any use */
    uint64_t prefetch_refused; /* not admitted: no victim worth less than the prefetch */
    uint64_t evictions;        /* cached experts replaced */
} ms_ecache_stats;

typedef struct ms_ecache {
    ms_cache_policy policy;
    int n_slots, n_layers, n_experts;
    ms_ecache_slot *slots;
    int32_t *slot_of;  /* [n_layers * n_experts] -> slot or -1 */
    float *score;      /* [n_layers * n_experts] decayed use count at score_t */
    uint32_t *score_t; /* layer step of the last update */
    uint32_t *layer_t; /* [n_layers] steps so far */
    float decay;       /* per layer step: 2^(-1/half_life) */
    float precision;   /* running precision of prefetches (used at their step / judged) */
    float loads_per_token; /* running loads per step of layer 0 (misses + prefetches, all layers) */
    uint64_t loads, loads_at_step0;
    uint64_t tick;
    /* prefetch admission (LFU_DECAY): who a prefetch displaced and whether it was missed */
    uint32_t *ghost;      /* [n_layers * n_experts] layer step + 1 when a prefetch displaced it, 0 none */
    uint8_t *ghost_cls;   /* the victim class it had (1 cold, 2 recent) */
    float regret[3], displaced[3]; /* per class, decayed counts: displaced, then asked for while it would have stayed */
    uint32_t explore;     /* refusals so far (every 16th is admitted to keep measuring) */
    ms_ecache_stats st;
} ms_ecache;

/* n_slots >= 1 slots over n_layers x n_experts keys. half_life in layer steps (tokens),
 * e.g. 64; ignored by LRU. Errors: MS_ERR_ARG, MS_ERR_NOMEM. */
int ms_ecache_init(ms_ecache *c, ms_cache_policy policy, int n_slots, int n_layers, int n_experts, double half_life,
                   ms_err *err);
void ms_ecache_free(ms_ecache *c);

/* One step of layer li (once per acquire of that layer, before its requests). */
void ms_ecache_step(ms_ecache *c, int li);
/* Slot holding (li, e) (any state), or -1. */
static inline int ms_ecache_lookup(const ms_ecache *c, int li, int e) { return c->slot_of[li * c->n_experts + e]; }

/* A demand request for (li, e) in the layer's current step. Returns 1 on a hit (*slot
 * holds it, READY or LOADING), 0 on a miss for which *slot was assigned to (li, e)
 * (state LOADING: the owner reads it and sets READY, or calls ms_ecache_drop), -1
 * when every slot is pinned, loading or a protected prefetch (nothing counted: the
 * owner waits for a load and asks again). The slot's use is recorded; pins are the
 * owner's. */
int ms_ecache_request(ms_ecache *c, int li, int e, int *slot);
/* A prefetch of (li, e) for the layer's next step. Returns the slot assigned (LOADING:
 * the owner reads it), or -1 when (li, e) is already cached or the policy refuses. */
int ms_ecache_prefetch(ms_ecache *c, int li, int e);
/* Empty a slot (after a failed read). */
void ms_ecache_drop(ms_ecache *c, int slot);

/* Lower-level pieces (used by the functions above; exposed for tests):
 * the victim for loading (li, e) (an empty slot, else the policy's choice among
 * unpinned READY slots; for a prefetch (for_prefetch 1) -1 when no victim is worth
 * less than the prefetch), and assigning a slot to (li, e) (state LOADING). */
int ms_ecache_victim(const ms_ecache *c, int li, int e, int for_prefetch);
void ms_ecache_assign(ms_ecache *c, int slot, int li, int e);
/* Record a use of the slot (recency and score). */
void ms_ecache_touch(ms_ecache *c, int slot);

/* Replay without prefetch: hits on a trace of T steps x n_layers x k expert ids
 * (trace[(t*L + l)*k + j]), loading every miss at once. Returns hits. */
uint64_t ms_ecache_replay(ms_ecache *c, const int *trace, int T, int k);

#endif
