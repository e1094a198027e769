/* engine.h — the CPU inference engine: causal state + forward.
 *
 * An engine binds a loaded model, a thread pool and an expert source, and
 * owns the causal state of one sequence (KV cache for GQA layers, the
 * compressed latent cache for MLA layers). ms_engine_forward appends n
 * tokens: a prefill processes them in chunks of up to max_batch tokens with
 * batched matmuls; n == 1 is a decode step. */
#ifndef MS_ENGINE_H
#define MS_ENGINE_H

#include <stdint.h>

#include "core/backend.h"
#include "core/expert_source.h"
#include "model/model.h"
#include "util/threadpool.h"

/* How MLA layers compute a prefill chunk (engine/attention.c): by the FLOP
 * estimate there (AUTO), or forced (tests compare the two forms). Decode and
 * weights whose per-head kv_b rows cannot be viewed in place always use the
 * absorbed form. */
typedef enum { MS_MLA_AUTO = 0, MS_MLA_ABSORBED = 1, MS_MLA_EXPANDED = 2 } ms_mla_form;

struct ms_comm;

/* Several devices of one process (engine/placement.h decides the split): stage s runs
 * layers [layer_begin[s], layer_end[s]) on backend bes[s], the embedding on stage 0, the
 * final norm and head on stage n - 1; the residual rows move from stage to stage through
 * comm (core/comm.h). Borrowed: must outlive the engine. */
typedef struct ms_stages {
    int n;
    ms_backend *const *bes;
    struct ms_comm *comm;
    const int *layer_begin, *layer_end;
    /* [n_layers * n_experts] expert parallelism: the stage whose backend holds and runs expert
     * e of layer l (engine/placement.h expert_home); NULL: a layer's experts run on its stage.
     * Each stage's backend must hold the experts homed there (ms_place_part.expert_devs). */
    const int *expert_home;
    const uint32_t *expert_devs; /* [n_layers * n_experts] bit s: stage s holds a copy (placed there) */
} ms_stages;

typedef struct ms_engine_opts {
    int max_ctx;            /* tokens of causal state to allocate (default 4096, capped by max_pos) */
    int max_batch;          /* prefill chunk (default 256) */
    ms_pool *pool;          /* borrowed; NULL runs single-threaded */
    ms_expert_source *experts; /* borrowed; NULL: resident views of the mapped checkpoint */
    ms_mla_form mla_form;   /* MLA prefill form (default MS_MLA_AUTO) */
    ms_backend *backend;    /* borrowed; NULL: a CPU backend over pool (core/backend.h) */
    /* borrowed, must outlive this engine; NULL: none. An engine of the same model (and, on a
     * backend without host memory, the same backend and kind of expert source) whose weights
     * this one uses as they are placed instead of placing its own copy: the engines of one
     * batch (ms_engine_decode_batch) on a device backend share one placement. */
    const struct ms_engine *weights_from;
    /* NULL: one backend (opts->backend). Else the pipeline split over stages->n backends
     * (opts->backend ignored): one engine per stage behind this one, each with its stage's
     * layers' weights placed on its backend and their causal state there. Resident experts
     * only (experts NULL: MS_ERR_UNSUPPORTED otherwise). What spans layers goes along at
     * each hand-off: Attention Residuals' block states, mHC's streams (the residual then), the
     * chunk's DSA selection; DSA tie replays cover every stage. */
    const ms_stages *stages;
    /* borrowed (copied at create); NULL: none. Hybrid execution on a backend without host memory
     * (engine/hybrid_experts.h): the flagged MoE layers' routed experts are computed on the CPU
     * from host memory and never placed on the backend. Ignored on a host-memory backend. */
    const struct ms_hybrid_opts *hybrid;
} ms_engine_opts;

typedef struct ms_engine_stats {
    uint64_t tokens;             /* tokens forwarded */
    uint64_t expert_activations; /* (token, expert) pairs computed */
    uint64_t experts_acquired;   /* unique experts requested from the source, summed over layers/steps */
    uint64_t lookahead_predicted, lookahead_correct; /* decode: experts predicted one layer early, and right */
    uint64_t mla_chunks, mla_expanded; /* MLA (layer, chunk) computations, and how many used the expanded form */
    /* split over stages (ms_engine_opts.stages), per stage engine: wall seconds its layers took
     * (its backend synced at the hand-off, so the device's work is in it), and of that, seconds
     * its experts ran for tokens of other stages (expert parallelism) */
    double stage_s, remote_experts_s;
    /* streamed decode on the routed kernels (engine/moe.c): host seconds waiting for the router's ids
     * (the sync drains the layer's queued work), in the source's acquire, and in the lookahead */
    double route_wait_s, acquire_s, lookahead_s;
} ms_engine_stats;

typedef struct ms_engine ms_engine;

/* Plan and allocate state + scratch for m. Fails (MS_ERR_NOMEM) naming the
 * sizes if an allocation fails. */
int ms_engine_create(ms_model *m, const ms_engine_opts *opts, ms_engine **out, ms_err *err);
void ms_engine_destroy(ms_engine *e);
/* Forget the sequence (n_past = 0). */
void ms_engine_reset(ms_engine *e);
int ms_engine_n_past(const ms_engine *e);
/* Tokens of causal state allocated (opts->max_ctx as capped at create). */
int ms_engine_max_ctx(const ms_engine *e);
/* The model the engine runs (borrowed). */
const ms_model *ms_engine_model(const ms_engine *e);
/* What ms_engine_create would allocate with `threads` threads: causal state for
 * opts->max_ctx tokens and workspace (activations, scratch) — the engine's
 * lines of the memory plan. */
void ms_engine_plan_bytes(const ms_model *m, const ms_engine_opts *opts, int threads, uint64_t *state,
                          uint64_t *workspace);
/* The causal state of ms_engine_plan_bytes by layer: per_layer[n_layers] (caches and
 * recurrent states of layer l), *other (module caches of no one layer), and the workspace
 * as ms_engine_plan_bytes counts it for one thread (engine/placement.h's input). */
void ms_engine_layer_state_bytes(const ms_model *m, const ms_engine_opts *opts, uint64_t *per_layer, uint64_t *other,
                                 uint64_t *workspace);
/* Bytes of causal state per token (all layers). */
uint64_t ms_engine_state_bytes_per_token(const ms_model *m);

/* Append tokens[0..n) at positions n_past..n_past+n-1. If logits is not NULL
 * it receives [n, vocab] (all_logits) or [1, vocab] for the last token.
 * Fails when the context would exceed max_ctx or a token id is out of range. */
int ms_engine_forward(ms_engine *e, const int32_t *tokens, int n, float *logits, int all_logits, ms_err *err);
/* One decode token (as ms_engine_forward(e, &token, 1, logits, 0)) whose greedy successor is
 * picked where the logits are: *next = the first index of the largest logit (NaN never wins; a
 * NaN logit 0 gives 0). A device backend downloads one id instead of the vocabulary's logits; a
 * host-memory backend forwards into the engine's own logits row and picks on the host (the same
 * rule, the same logits as ms_engine_forward). MS_ERR_UNSUPPORTED, with nothing done, where it
 * cannot pick (a device backend without argmax; a model split over devices, --gpus): the caller
 * forwards and picks itself. */
int ms_engine_decode_greedy(ms_engine *e, int32_t token, int32_t *next, ms_err *err);
/* The logits [vocab] of the token the last successful ms_engine_decode_greedy forwarded, into
 * logits (host memory; a device backend downloads them), for a caller whose pick needs them after
 * all (an id past its tokenizer's). Valid until the next forward. MS_ERR_ARG when there are none. */
int ms_engine_greedy_logits(ms_engine *e, float *logits, ms_err *err);

/* One decode step of k sequences together: token tokens[i] is appended to
 * es[i] at its position n_past. The engines share the model and the backend
 * (or all have host-memory backends, as CPU engines created without one do);
 * es[0] leads: its activations hold the k rows (k <= its max_batch) and its
 * expert source serves the MoE layers. What is per token (embedding, norms,
 * projections, router, experts — the union of the k rows' experts acquired once
 * per layer —, dense MLPs, the head) runs once over the k rows; what is per
 * sequence (RoPE, the cache append, the attention op, KDA / gated DeltaNet /
 * DSA / compressed-attention state) on each engine. logits [k, vocab] receives
 * row i for es[i] (as ms_engine_forward(es[i], tokens + i, 1, ...) would, up to
 * F32 reduction order). Fails as ms_engine_forward would for any engine, or
 * MS_ERR_ARG (engines not sharing model and backend, an engine twice), MS_ERR_LIMIT
 * (k > max_batch); after a failure inside the step the engines' states are
 * undefined (reset them). */
int ms_engine_decode_batch(ms_engine *const *es, int k, const int32_t *tokens, float *logits, ms_err *err);

const ms_engine_stats *ms_engine_get_stats(const ms_engine *e);

/* A discrete choice one forward made, for inspection (verify --static-dtype judges where a
 * requantized static tier chose otherwise: docs/performance.md "Q8 static tier"):
 *   MS_CHOICE_EXPERTS: the routed experts of the token at pos in MoE layer `layer`: scores
 *     [n_scores] its router logits (ms_router_width of them, the router Linear's bias added:
 *     what ms_route_args.logits receives), chosen [n_chosen] the ids picked (top_k, the
 *     router's order). Hash-routed layers (no choice) are not reported.
 *   MS_CHOICE_DSA: the lightning indexer's selection for the query at pos in layer `layer`:
 *     scores [n_scores] the index score of every candidate (ms_dsa_scores: per key t <= pos, or
 *     per complete pool with KPool), chosen [n_chosen] the candidates selected (key positions,
 *     or pool numbers; a KPool query's own tail tokens are not candidates). Only queries with
 *     more candidates than the selection keeps are reported (otherwise nothing is chosen).
 * A DSA tie replay (ops/dsa.h) reports the replayed positions again: the later report holds.
 * Both arrays are host memory valid during the call only. */
typedef enum { MS_CHOICE_EXPERTS = 0, MS_CHOICE_DSA = 1 } ms_choice_kind;
typedef struct ms_choice {
    ms_choice_kind kind;
    int layer;
    int64_t pos;
    const float *scores;
    int n_scores;
    const int32_t *chosen;
    int n_chosen;
} ms_choice;
/* The observer: returns 0 to let the forward go on with c's choice, or 1 after writing the
 * choice the forward uses instead into force[c->n_chosen] (expert ids, weighed as the router
 * weighs its own: core/backend.h ms_route_args.fixed; or DSA candidates, ascending, whose tokens
 * replace the selected ones, a KPool query's tail kept): verify forces the stored tier's choices
 * on the requantized engine, as it forces the reference's tokens. */
typedef int (*ms_choice_fn)(void *ctx, const ms_choice *c, int32_t *force);
/* Every following forward of e calls fn(ctx, choice, force) for each choice above, in the order
 * the forward makes them (layer by layer; a layer's DSA selection before its experts); fn NULL
 * stops it (the default; nothing is computed for it then). An observer that never forces leaves
 * the logits bit for bit as without it.
 * Host-memory backends only: MS_ERR_UNSUPPORTED otherwise, and for a split (--gpus) or
 * hybrid engine, with nothing changed. Single-sequence forwards only: not called from a
 * ms_engine_decode_batch step of two or more sequences. */
int ms_engine_observe_choices(ms_engine *e, ms_choice_fn fn, void *ctx, ms_err *err);
/* Stages of a split engine (1 without ms_engine_opts.stages), and stage s's statistics
 * (stage 0: e's own; NULL when s is out of range). */
int ms_engine_n_stages(const ms_engine *e);
const ms_engine_stats *ms_engine_stage_stats(const ms_engine *e, int s);

/* The resident expert source: views onto the mapped checkpoint. */
int ms_resident_experts_create(ms_model *m, ms_expert_source **out, ms_err *err);

#endif
