/* streaming.h — the engine's streaming expert source: the model's routed experts
 * read from the checkpoint files (or a packed store) into a bounded cache.
 *
 * The store is built from the model's own bound expert views: every pointer of
 * a resident ms_expert_view (gate/up/down data and scales, biases) that lies in
 * a checkpoint mapping becomes a role extent, and a streamed view is the
 * resident view with those pointers moved into the cache slot. Views are thus
 * the same matrices over the same bytes, for every architecture the loader
 * binds: streamed logits are bit-identical to resident ones. */
#ifndef MS_STREAMING_H
#define MS_STREAMING_H

#include "core/expert_source.h"
#include "io/expert_stream.h"
#include "model/model.h"

typedef struct ms_streaming_opts {
    int64_t cache_mib;        /* budget in MiB; 0 = the smallest cache (top_k slots) */
    ms_io_mode io;            /* MS_IO_AUTO or forced */
    int queue_depth;          /* 0 = default */
    uint64_t chunk_bytes;     /* reads split into pieces of at most this (multiple of 4096); 0 = the reader's 2 MiB */
    const char *store_dir;    /* packed store (moonshine pack) or NULL: read the checkpoint */
    ms_cache_policy policy;   /* MS_CACHE_LFU_DECAY by default */
    int no_verify;            /* skip the per-expert CRC of a packed store */
    int no_prefetch;          /* ignore lookahead prefetches (plain demand caching) */
    const char *trace_path;   /* record the source's calls (io/expert_trace.h), or NULL */
} ms_streaming_opts;

/* A streaming source for model m (borrowed: must outlive the source). why[why_cap]
 * receives one line for the log: io mode (with fallback reason), slots, store.
 * Errors: a packed store that does not match m's checkpoint (MS_ERR_MISMATCH), a budget
 * below one layer's top-k (MS_ERR_NOMEM with the numbers), I/O errors naming the file. */
int ms_streaming_experts_create(ms_model *m, const ms_streaming_opts *o, ms_expert_source **out, char *why,
                                size_t why_cap, ms_err *err);
/* Cache/read statistics of a source from ms_streaming_experts_create. */
void ms_streaming_stats(const ms_expert_source *s, ms_stream_stats *out);
/* ms_experts_acquire of s (from ms_streaming_experts_create) handing each expert to ready
 * as its read lands, while the others are still read (ms_stream_source_acquire_each). */
int ms_streaming_acquire_each(ms_expert_source *s, int layer, int n, const int *ids, ms_expert_view *views,
                              ms_stream_ready_fn ready, void *ready_ctx, ms_err *err);
/* The host cache's memory (the io_uring reader's targets), to page-lock as staging. */
void ms_streaming_host_cache(const ms_expert_source *s, void **p, uint64_t *bytes);
/* 1 when s came from ms_streaming_experts_create. */
int ms_is_streaming_source(const ms_expert_source *s);

/* Touch every page of m's checkpoint tensors except the streamed experts' bytes (so a
 * benchmark faults the static tier in without reading the experts through the mapping). */
void ms_streaming_prefault_static(ms_model *m, const ms_expert_source *s);
/* Evict m's checkpoint files (and a packed store's files) from the page cache
 * (posix_fadvise DONTNEED), so reads measure the drive. */
void ms_streaming_drop_page_cache(ms_model *m, const ms_expert_source *s);
/* The largest file the source reads (to measure the drive's bandwidth on), or NULL. */
const char *ms_streaming_largest_file(const ms_expert_source *s);

/* Pack m's routed experts (as the engine binds them) into out_dir; see ms_expert_pack. */
int ms_streaming_pack(ms_model *m, const char *out_dir, const char *const *dirs, int n_dirs, ms_pack_stats *stats,
                      ms_err *err);
/* The same, reporting the bytes written so far to progress (util/progress.h; NULL: none). */
int ms_streaming_pack_progress(ms_model *m, const char *out_dir, const char *const *dirs, int n_dirs,
                               const ms_progress *progress, ms_pack_stats *stats, ms_err *err);

#endif
