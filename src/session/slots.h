/* slots.h — parallel slots with batched decode: a scheduler that serves up to N
 * requests at once over one model.
 *
 * Each slot owns an engine (its causal state) and a generator (its history, so
 * a slot reuses the common prefix of its previous request). A step
 * (ms_sched_step) does, in order:
 *   1. remove the requests that finished or were cancelled (their done callback runs);
 *   2. one prefill chunk of at most `chunk` prompt tokens for one prefilling slot
 *      (round robin), so a long prompt never stalls the running replies for longer
 *      than one chunk; a slot whose prompt is complete samples its first token;
 *   3. one decode step of every decoding slot together (ms_engine_decode_batch: the
 *      union of their routed experts acquired once per layer), then each samples
 *      its next token (ms_gen_run_next: penalties, stop strings, EOS, max_tokens).
 * New requests (ms_sched_submit) take a free slot between steps: the one whose
 * history shares the longest prefix with the prompt, so a slot's state is reused. For engines
 * that roll back, when a busy slot shares a longer prefix, the new slot copies that slot's state
 * cut to the common prefix (prefixes are shared across slots; models that cannot roll back share
 * theirs through the snapshot hook, e.g. session/prefix_cache.h). Greedy results
 * equal the same requests served one at a time with ms_generate (logits within
 * F32 reduction order; tests/unit/test_slots.c).
 *
 * Not thread-safe: one thread submits, cancels and steps (a server's worker);
 * the callbacks run inside ms_sched_step. */
#ifndef MS_SESSION_SLOTS_H
#define MS_SESSION_SLOTS_H

#include "engine/engine.h"
#include "session/generate.h"

typedef struct ms_sched ms_sched;

/* The end of a request: rc MS_OK with res (finish, counts), or the error that ended it
 * (err; res then holds the counts so far). Called once per accepted request. */
typedef void (*ms_sched_done_fn)(void *user, int rc, const ms_gen_result *res, const ms_err *err);

typedef struct ms_sched_opts {
    int n_slots;     /* >= 1 */
    int chunk;       /* prefill tokens per step (default 64) */
    ms_engine_opts engine; /* every slot's engine: pool, experts, backend, max_ctx shared;
                            * max_batch is raised to at least max(chunk, n_slots) */
    const ms_tokenizer *tok;       /* borrowed, may be NULL (ids only) */
    const ms_gen_snapshots *snaps; /* per slot's generator, may be NULL */
} ms_sched_opts;

/* N slots over m (borrowed). Errors: MS_ERR_ARG, those of ms_engine_create (a slot
 * count whose engines do not fit: check ms_plan first, engine/plan.h). */
int ms_sched_new(ms_model *m, const ms_sched_opts *o, ms_sched **out, ms_err *err);
void ms_sched_free(ms_sched *s);
/* Queue a request into a free slot (*slot = its index). prompt is copied; p's arrays
 * (stop, eos_ids, forced_ids) and the callbacks' user data are borrowed until done
 * runs. fn as ms_generate's (returning nonzero cancels). Errors: MS_ERR_LIMIT (every
 * slot busy), those of ms_gen_run_new (then done is not called). */
int ms_sched_submit(ms_sched *s, const int32_t *prompt, int n, const ms_gen_params *p, ms_gen_token_fn fn,
                    ms_sched_done_fn done, void *user, int *slot, ms_err *err);
/* Cancel slot's request: it leaves at the next step (finish abort), also mid-prefill.
 * A prefill stopped midway keeps its evaluated prefix: in the slot's history (a model
 * that rolls back), or through the snapshot hook's save (one that cannot), so the same
 * prompt submitted again resumes from it. */
void ms_sched_cancel(ms_sched *s, int slot);
/* One step (above). Returns the number of requests still in slots after it, or a
 * negative MS_ERR_* when the step itself could not run (err; the requests it
 * concerned end with that error). */
int ms_sched_step(ms_sched *s, ms_err *err);
/* Requests in slots; free slots; slots. */
int ms_sched_active(const ms_sched *s);
int ms_sched_free_slots(const ms_sched *s);
int ms_sched_n_slots(const ms_sched *s);
/* A slot's generator (its history; borrowed). */
ms_generator *ms_sched_generator(ms_sched *s, int slot);

typedef struct ms_sched_stats {
    uint64_t steps, decode_steps, decode_rows, prefill_chunks, prefill_tokens;
    uint64_t kept_prefixes; /* cancelled prefills whose evaluated prefix was saved through the snapshot hook */
    uint64_t shared_prefixes, shared_tokens; /* requests that took a prefix from another slot's state (rollback
                                              * engines), and the tokens taken */
} ms_sched_stats;
void ms_sched_get_stats(const ms_sched *s, ms_sched_stats *out);

/* One slot as it stands (for a status page). */
typedef enum { MS_SLOT_FREE, MS_SLOT_PREFILL, MS_SLOT_DECODE, MS_SLOT_DONE } ms_sched_slot_state;
typedef struct ms_sched_slot {
    ms_sched_slot_state state;
    int prompt_tokens;     /* the request's prompt (0 when free) */
    int cached_tokens;     /* of which reused */
    int completion_tokens; /* sampled so far */
    int history;           /* tokens the slot's engine holds (a free slot: its last request's, reusable) */
} ms_sched_slot;
void ms_sched_slot_info(const ms_sched *s, int slot, ms_sched_slot *out);
const char *ms_sched_slot_state_name(ms_sched_slot_state st); /* "idle", "prefill", "decode", "ending" */

#endif
