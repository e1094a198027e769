/* device_experts.h — routed experts streamed into device memory: an expert
 * source whose views live in a backend's memory (a slot arena allocated with
 * be->ops->alloc), filled from a host expert source (the streaming source of
 * engine/streaming.h: io_uring reads into its bounded host cache).
 *
 * Written against the backend interface only (core/backend.h): alloc, upload,
 * sync and the optional host_register / mem_info; no device code. A (layer,
 * expert) -> slot map with the CPU cache's policy code (io/expert_cache.h:
 * lfu-decay or lru, the same functions) decides hits and victims:
 *   acquire   hits return the slot's device view; misses acquire host views from
 *             the inner source (in groups of its max_acquire), upload every role
 *             (weights, block scales, biases) into the victim slot, sync (the host
 *             slots may be rewritten once released) and release the inner layer.
 *             From the streaming source (engine/streaming.h) each miss's upload is
 *             queued as soon as its read lands (ms_streaming_acquire_each), so the
 *             copy of one expert overlaps the reads of the others; the sync after
 *             the group is the only wait on the backend.
 *             Views stay valid (the slots pinned) until release(layer).
 *   prefetch  the lookahead's guess, less the experts on the device, is judged at that
 *             layer's acquire and forwarded to the inner source through a gate
 *             (io/prefetch_gate.h): forwarded while the guesses' measured precision
 *             pays for the drive time wrong guesses take from the demand reads
 *             (p >= 1 - gap / t_read, gap and t_read measured here), held back
 *             otherwise, so lookahead reads of the host cache overlap the compute as
 *             on the CPU when they are right and do not queue ahead of the misses
 *             when they are not. While the gate holds guesses back (measured), the
 *             source asks the engine (wants_prefetch) for one guess in
 *             MS_DEVICE_GUESS_SAMPLE only: the others' router pass and download are
 *             skipped, the sampled ones keep p measured.
 * max_acquire is the slot count. The device views have the layout model/place.c
 * gives placed experts (the stored dtype and block scales, each role 256-byte
 * aligned), so the backend's MoE ops run them unchanged, and logits are those of
 * the resident placed model bit for bit. When the backend can page-lock host
 * memory (host_register), the inner streaming source's host cache is registered:
 * the reader's io_uring targets are the pinned staging, no extra copy.
 *
 * Not thread-safe: one engine thread calls acquire/release/prefetch. */
#ifndef MS_DEVICE_EXPERTS_H
#define MS_DEVICE_EXPERTS_H

#include "core/backend.h"
#include "core/expert_source.h"
#include "io/expert_cache.h"
#include "model/model.h"

typedef struct ms_device_experts_opts {
    uint64_t budget_bytes;  /* the device slot arena; 0 = the smallest (top-k slots). The CLI's default
                             * is ms_device_experts_default_budget */
    ms_cache_policy policy; /* MS_CACHE_LFU_DECAY by default (the same as the host cache) */
    double half_life;       /* LFU-decay half-life in tokens (0 = 64) */
    int no_pin;             /* 1: do not page-lock the host cache (uploads from pageable memory) */
    int prefetch_all;       /* 1: forward every lookahead guess (no gate; the behaviour before the gate) */
    int gate_warm_open;     /* 1: the gate forwards guesses until it has measured them (its first form);
                             * 0: held back until measured (io/prefetch_gate.h) */
    int always_guess;       /* 1: the engine makes every lookahead guess; 0: while the gate holds guesses
                             * back (measured) only one in MS_DEVICE_GUESS_SAMPLE is made, to keep
                             * measuring their precision (ms_experts_wants_prefetch) */
    int lists;              /* 1: the engine's decode takes the expert-list path over these experts;
                             * 0: the backend's fused routed kernels over this call's slots, when it has
                             * them (ms_moe_routed_args.per_call: the resident decode's sum, bit for bit) */
} ms_device_experts_opts;

#define MS_DEVICE_GUESS_SAMPLE 8 /* guesses made while the gate is closed: one in this many */

typedef struct ms_device_experts_stats {
    uint64_t requests, hits, misses; /* per requested expert (the device slot map) */
    uint64_t evictions;
    uint64_t uploads, upload_bytes;  /* experts (and their bytes) copied host -> device */
    double inner_s;  /* time in the inner source's acquire (host cache hits, reads, read waits) */
    double upload_s; /* time issuing uploads and the fence after them */
    int n_slots;
    uint64_t slot_bytes;
    int pinned;      /* 1: the inner source's host cache is page-locked */
    /* lookahead (experts not on the device when guessed): guessed, later asked for, forwarded to
     * the inner source, held back by the gate; the gate's running gap (guess to acquire), read
     * time of one expert, precision and the precision it needs (0: open while warming up) */
    uint64_t pf_guessed, pf_right, pf_forwarded, pf_held;
    double gate_gap_s, gate_read_s, gate_precision, gate_need;
    int gate_open;
} ms_device_experts_stats;

/* A device expert source for model m (the host model, whose layers[l].experts give the
 * shapes) on backend be over inner (both borrowed: they outlive the source). Refuses
 * (MS_ERR_NOMEM with the numbers) a budget below one layer's top-k slots. why[why_cap]
 * receives one line for the log (slots, slot size, policy, pinned or not). */
int ms_device_experts_create(ms_model *m, ms_backend *be, ms_expert_source *inner, const ms_device_experts_opts *o,
                             ms_expert_source **out, char *why, size_t why_cap, ms_err *err);
/* 1 when s came from ms_device_experts_create. */
int ms_is_device_experts(const ms_expert_source *s);
/* 1 when s (a device source) was made with opts.lists: decode over the expert lists. */
int ms_device_experts_lists(const ms_expert_source *s);
void ms_device_experts_stats_get(const ms_expert_source *s, ms_device_experts_stats *out);
/* The inner (host) source of s. */
ms_expert_source *ms_device_experts_inner(const ms_expert_source *s);

/* Device bytes of one expert slot of m (every role of the largest expert, 256-aligned). */
uint64_t ms_device_expert_slot_bytes(const ms_model *m);
/* Every role of host view hv (weights, block scales, biases, INT4 zero points) queued for upload
 * on be into slot (slot_bytes of backend memory, each role 256-byte aligned as the arena's slots):
 * dv = hv with its pointers moved there. The copies are stream-ordered (from page-locked memory
 * they are asynchronous: hv's bytes must stay until the stream passes them). *uploaded (if
 * non-NULL) grows by the bytes queued. MS_ERR_SHAPE when the view does not fit. */
int ms_device_expert_upload(ms_backend *be, const ms_expert_view *hv, void *slot, uint64_t slot_bytes,
                            ms_expert_view *dv, uint64_t *uploaded, ms_err *err);
/* The default budget: the device's free memory (mem_info) less what an engine of opts will
 * place and allocate there (the static tier, causal state, activations, the backend's
 * workspace) and a reserve (1/32 of the device, at least 256 MiB), capped at all of m's
 * routed experts. MS_ERR_UNSUPPORTED when be has no mem_info. */
int ms_device_experts_default_budget(const ms_model *m, ms_backend *be, int max_ctx, uint64_t *budget, ms_err *err);

#endif
