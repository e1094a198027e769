/* expert_source.h — where the MoE block gets routed experts from.
 *
 * The MoE block never touches expert bytes directly: it asks an expert
 * source for the experts a layer's tokens selected. The resident source
 * hands out views onto the mapped checkpoint; the streaming source (io/)
 * reads missing experts from NVMe into a bounded cache and hands out views
 * onto cache slots. Both fill the same ms_expert_view. */
#ifndef MS_CORE_EXPERT_SOURCE_H
#define MS_CORE_EXPERT_SOURCE_H

#include <stdint.h>

#include "core/qmat.h"
#include "util/err.h"

/* One routed expert: SwiGLU FFN down(act(gate x) * (up x)), optional biases
 * (gpt-oss). Views stay valid until the matching ms_experts_release. */
typedef struct ms_expert_view {
    /* gate, up: [inter, hidden]; down: [hidden, inter]. When up.data is NULL,
     * gate is the fused [2*inter, hidden] gate_up projection with gate and up
     * rows interleaved (row 2i: gate i, row 2i+1: up i), as gpt-oss stores it;
     * gate_bias is then the interleaved [2*inter] bias. */
    ms_qmat gate, up, down;
    const void *gate_bias, *up_bias, *down_bias; /* NULL when absent; dtype bias_dtype */
    ms_dtype bias_dtype;
} ms_expert_view;

/* Where a tensor of an expert lives in the checkpoint (for readers/packers). */
typedef struct ms_extent {
    int file;          /* index into ms_checkpoint.files */
    uint64_t offset;   /* absolute byte offset */
    uint64_t len;
} ms_extent;

typedef struct ms_expert_source ms_expert_source;

/* Virtual interface; implementations: resident (engine/), streaming (io/). */
typedef struct ms_expert_source_ops {
    /* Make experts ids[0..n) of `layer` available and fill views[0..n).
     * Blocks until every view is usable. */
    int (*acquire)(ms_expert_source *s, int layer, int n, const int *ids, ms_expert_view *views, ms_err *err);
    /* The views of the last acquire on `layer` may be evicted after this. */
    void (*release)(ms_expert_source *s, int layer);
    /* Hint: these experts of `layer` will likely be acquired soon (non-blocking, may be ignored). */
    void (*prefetch)(ms_expert_source *s, int layer, int n, const int *ids);
    void (*destroy)(ms_expert_source *s);
    /* Optional (NULL: always 1): 1 when a prefetch guess for `layer` made now would be used
     * (forwarded or judged), 0 when the caller may skip computing it (a device source whose
     * gate holds guesses back asks for one in a few, to keep measuring their precision).
     * Each call counts as a chance to guess: call it once per guess the caller would make. */
    int (*wants_prefetch)(ms_expert_source *s, int layer);
} ms_expert_source_ops;

struct ms_expert_source {
    const ms_expert_source_ops *ops;
    /* Most experts one acquire may ask for (a bounded cache); 0 = no limit. The MoE
     * block acquires a layer's experts in groups of at most this many. */
    int max_acquire;
    /* The backend whose memory the views' data, scales and biases live in; NULL: host memory
     * (the resident mapping, a host cache). A backend without host memory runs only a source
     * whose views are its own (engine/device_experts.h). */
    struct ms_backend *views_on;
};

static inline int ms_experts_acquire(ms_expert_source *s, int layer, int n, const int *ids, ms_expert_view *v,
                                     ms_err *err) {
    return s->ops->acquire(s, layer, n, ids, v, err);
}
static inline void ms_experts_release(ms_expert_source *s, int layer) {
    if (s->ops->release) s->ops->release(s, layer);
}
static inline int ms_experts_wants_prefetch(ms_expert_source *s, int layer) {
    return s->ops->prefetch && (!s->ops->wants_prefetch || s->ops->wants_prefetch(s, layer));
}
static inline void ms_experts_prefetch(ms_expert_source *s, int layer, int n, const int *ids) {
    if (s->ops->prefetch) s->ops->prefetch(s, layer, n, ids);
}

#endif
