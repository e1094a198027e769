/* expert_stream.h — the streaming expert source: routed experts read from
 * NVMe (checkpoint or packed store) into a bounded cache of slots.
 *
 * ms_experts_acquire blocks until every requested expert sits in a slot and
 * returns views onto the slots; the slots stay pinned until
 * ms_experts_release(layer). ms_experts_prefetch starts reads into free (or
 * cold) slots and returns at once. Views are built from the raw role bytes by
 * a binder: ms_expert_bind_default understands the common role names; an
 * architecture with another layout (gpt-oss fused gate_up) passes its own.
 *
 * Not thread-safe: one engine thread calls acquire/release/prefetch. */
#ifndef MS_EXPERT_STREAM_H
#define MS_EXPERT_STREAM_H

#include <stdint.h>

#include "core/expert_source.h"
#include "io/expert_cache.h"
#include "io/expert_store.h"
#include "io/reader.h"

/* The bytes of one expert, as the binder sees them. data[r] is NULL for an absent role. */
typedef struct ms_expert_bytes {
    int layer, expert; /* model layer index, expert id */
    int n_roles;
    const ms_expert_role_info *roles; /* [n_roles] dtype, per-expert shape, bytes */
    const void *data[MS_EXPERT_MAX_ROLES];
} ms_expert_bytes;

/* Build a view from an expert's bytes. Must not copy: views point into b->data. */
typedef int (*ms_expert_bind_fn)(void *ctx, const ms_expert_bytes *b, ms_expert_view *view, ms_err *err);

/* ctx for the default binder (NULL = 128 x 128 FP8 blocks). */
typedef struct ms_bind_opts {
    int fp8_block_rows, fp8_block_cols;
} ms_bind_opts;

/* The default binder. Roles "gate", "up", "down" (2-D) are required, "gate_scale",
 * "up_scale", "down_scale", "gate_bias", "up_bias", "down_bias" optional:
 *  F32/F16/BF16 weights: [rows, cols] as stored, no scale;
 *  F8_E4M3 with an F32/BF16 scale [ceil(rows/br), ceil(cols/bc)]: blocks from ctx;
 *  U8 [rows, cols/2] with a U8 scale [rows, cols/32] (compressed-tensors MXFP4): F4, E8M0 scale.
 *  I32 [rows, cols/8] with a BF16/F16/F32 scale [rows, groups] (compressed-tensors INT4): I4,
 *  and an optional "gate_zero"/"up_zero"/"down_zero" I32 [ceil(rows/8), groups] (asymmetric).
 * Errors: MS_ERR_UNSUPPORTED naming the role (e.g. a fused "gate_up" the model must split),
 * MS_ERR_SHAPE for a scale that does not fit its weight. */
int ms_expert_bind_default(void *ctx, const ms_expert_bytes *b, ms_expert_view *view, ms_err *err);

typedef struct ms_stream_opts {
    uint64_t budget_bytes; /* cache budget; 0 = the smallest cache (min_slots slots) */
    int min_slots;         /* experts one acquire pins at once (the router's top-k), >= 1 */
    ms_io_mode io;         /* MS_IO_AUTO or forced */
    int queue_depth;       /* 0 = reader default */
    uint64_t chunk_bytes;  /* the reader's piece size (ms_reader_opts.chunk_bytes); 0 = its default */
    ms_cache_policy policy;
    double half_life;      /* LFU-decay half-life in tokens (0 = 64) */
    int verify;            /* packed stores: check each expert's CRC32C after reading (1 recommended) */
    int no_prefetch;       /* 1: ignore prefetch hints (plain demand caching, for comparison) */
    const char *trace_path; /* record every acquire/prefetch/release here (io/expert_trace.h), or NULL */
    ms_expert_bind_fn bind;  /* NULL = ms_expert_bind_default */
    void *bind_ctx;
} ms_stream_opts;

typedef struct ms_stream_stats {
    uint64_t acquires, hits, misses;   /* per requested expert */
    uint64_t bytes_read;               /* bytes submitted to the reader */
    uint64_t reads;                    /* experts loaded */
    uint64_t prefetch_issued, prefetch_used, prefetch_dropped, prefetch_wasted;
    uint64_t evictions;
    double wait_s;   /* time acquire spent blocked on reads */
    double busy_s;   /* time with at least one read outstanding (approximate) */
    int n_slots;
    uint64_t slot_bytes;
    ms_io_mode mode;
} ms_stream_stats;

/* A streaming source over store `st` (borrowed: must outlive the source). Slots are
 * st->buf_bytes (a multiple of 4096); their number is budget / slot bytes. Refuses
 * (MS_ERR_NOMEM, with the numbers) a budget with fewer than min_slots slots. why
 * receives the reader's one-line mode description (fallback reason). */
int ms_stream_source_create(const ms_expert_store *st, const ms_stream_opts *opts, ms_expert_source **out, char *why,
                            size_t why_cap, ms_err *err);
/* Called by ms_stream_source_acquire_each once per requested expert i as its view
 * becomes valid (its read landed and was bound); a non-zero return stops the acquire
 * with that status (the call's pins are dropped as on any failure). */
typedef int (*ms_stream_ready_fn)(void *ctx, int i, const ms_expert_view *view, ms_err *err);
/* ms_experts_acquire of a source from ms_stream_source_create, handing each expert to
 * ready as soon as its read lands (completion order; hits first), while the other reads
 * are still in flight, so a caller can copy one expert while the next is read. With
 * ready NULL: ms_experts_acquire itself (views bound once every read has landed). The
 * views[] and the pins are those of ms_experts_acquire; the cache policy sees the same
 * requests in the same order either way. */
int ms_stream_source_acquire_each(ms_expert_source *s, int layer, int n, const int *ids, ms_expert_view *views,
                                  ms_stream_ready_fn ready, void *ready_ctx, ms_err *err);
/* Stats so far (s must come from ms_stream_source_create). */
void ms_stream_source_stats(const ms_expert_source *s, ms_stream_stats *out);
/* Experts the cache holds at once. */
int ms_stream_source_slots(const ms_expert_source *s);
/* The host memory the cache's slots live in (the reader's read targets): *p, *bytes. */
void ms_stream_source_arena(const ms_expert_source *s, void **p, uint64_t *bytes);

#endif
