/* requant_int.h — what requant.c (at load) and static_store.c (the packed static
 * tier) share: the requantizable matrices of a model and how new views replace them. */
#ifndef MS_REQUANT_INT_H
#define MS_REQUANT_INT_H

#include "model/model.h"

/* One static matrix view that --static-dtype may requantize. */
typedef struct {
    ms_qmat *w;       /* the model's view (replaced in place) */
    int layer;        /* -1 for the embedding and the head */
    const char *what; /* its role, for messages and the store's table */
} ms_rq_ref;

typedef struct {
    const void *p;
    uint64_t bytes;
} ms_rq_span;

/* Every static matrix view of m, in a fixed order (the store's indices); the count, and the
 * views into out when out is not NULL (callers size out with a first call). */
int ms_rq_collect(ms_model *m, ms_rq_ref *out);
/* 1 when w is a BF16/F16 matrix that is requantized (not already quantized, not empty). */
int ms_rq_eligible(const ms_qmat *w);
/* The index j < i of an earlier view with the same bytes as r[i] (olds[j]: view j before any
 * replacement; same data, shape and dtype: a tied head), else -1. */
int ms_rq_earlier_same(const ms_rq_ref *r, int i, const ms_qmat *olds);
/* "layer L what [R, C]" (or "what [R, C]") into what[n]. */
void ms_rq_ref_name(const ms_rq_ref *r, char *what, size_t n);
/* Points every view i with src[i] >= 0 at q[src[i]] (src[i] < 0: left stored), marks the
 * tensors no view reads any more 2 in m->tensor_bound, and sets m's static_bytes,
 * static_dtype = d, static_requant_bytes, requant_rel_rms = rel_max and requant_uses =
 * uses. replaced: scratch for n spans. MS_ERR_NOMEM only (before anything changed). */
int ms_rq_install(ms_model *m, ms_static_dtype d, ms_rq_ref *r, int n, const int *src, const ms_qmat *q,
                  double rel_max, int uses, ms_rq_span *replaced, ms_err *err);

#endif
