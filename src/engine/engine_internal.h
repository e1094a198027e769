/* engine_internal.h — the engine's private state shared by its blocks. */
#ifndef MS_ENGINE_INTERNAL_H
#define MS_ENGINE_INTERNAL_H

#include "core/backend.h"
#include "core/comm.h"
#include "engine/engine.h"
#include "engine/gdn_block.h"
#include "engine/kda_block.h"

/* lookahead prefetch is skipped for routers choosing more experts than this */
#define MS_LOOKAHEAD_MAX_K 64

/* One sequence of the forward in flight: its engine (causal state, position,
 * the per-sequence module state) and its rows [row, row + n) of the chunk held
 * in the lead engine's activations. A single-sequence forward is one entry
 * {e, 0, n}; a batched decode step (ms_engine_decode_batch) one per engine. */
typedef struct ms_fwd_seq {
    ms_engine *e;
    int row, n;
} ms_fwd_seq;

/* Memory: pointers marked [be] are backend memory (activations, causal state):
 * the engine passes them to ops and never dereferences them; [host] ones are
 * the engine's own (routing lists, pointer tables). */
struct ms_engine {
    ms_model *m;
    const ms_model *w;   /* the weights as placed on the backend (the CPU backend: m itself) */
    ms_backend *be;      /* every compute step goes through it */
    ms_backend *own_be;  /* created here when opts gave none (a CPU backend over opts->pool) */
    ms_pool *pool;
    ms_expert_source *experts;
    ms_expert_source *own_experts; /* created here when none was given */
    ms_model *placed;    /* a backend without host memory: m's weights placed on it (e->w); else NULL */
    int max_ctx, max_batch, n_threads;
    int n_past;
    ms_mla_form mla_form;
    /* causal state, per layer: GQA k/v [max_ctx, kv_heads*head_dim];
     * MLA latent [max_ctx, kv_lora + rope] (normalized latent, roped k_pe) */
    float **k_cache, **v_cache, **latent; /* [host] per-layer pointers to [be] caches */
    ms_kda_state *kda;   /* [n_layers]: conv + recurrent state of KDA and gated DeltaNet layers (unused entries zero) */
    /* [be] activations for a chunk of up to max_batch tokens */
    float *x;      /* [B, hidden] residual stream */
    float *xn;     /* [B, hidden] normed input of a sublayer */
    float *q;      /* [B, H * qdim] */
    float *kv;     /* [B, max(2*KV*hd, lora+rope, q_lora)] */
    float *att;    /* [B, H * vdim] attention output before o_proj */
    float *tmp;    /* [B, hidden] */
    float *sc;     /* [B, hidden] the shortcut MoE's output between its two layers (cfg layer_shortcut), or NULL */
    float *logits; /* [logit_rows, vocab] the head's output when the caller cannot read backend memory */
    int logit_rows;
    /* FFN scratch */
    float *g, *u;  /* [B, max inter] */
    float *xs, *ys;/* [B, hidden] gathered rows for one expert */
    float *rlog;   /* [B, n_experts] router logits */
    int *topk_ids; /* [B, top_k] the router's choice */
    float *topk_w; /* [B, top_k] and weights */
    /* [host] the routing as the engine sees it: ids/weights downloaded, hash-routed
     * rows given to the router, expert-major lists, the unique experts of a layer */
    int *h_ids; float *h_w;   /* [B, top_k] */
    int32_t *h_fixed;         /* [B, top_k] */
    int *ex_count, *ex_tokens; float *ex_w; /* [E + 1], [B * top_k], [B * top_k] */
    int *ex_pos, *ex_uniq;    /* [E] */
    int *ex_off;              /* [E + 1]: an acquired group's pair offsets (ms_moe_args.off) */
    int no_routed;            /* the backend refused moe_experts_routed: the lists from then on */
    int no_routed_stream;     /* the same for streamed experts (per_call tables): the lists from then on */
    ms_expert_view *ex_views; /* [E] */
    int *ex_rank;             /* [3E] staged with expert parallelism: each expert's rank in (device, id) order, the
                               * inverse, and the device that runs it (its home, or this stage holding a replica) */
    /* Kimi K3 options */
    float *ares;   /* [n_blocks][B, hidden] Attention Residuals block states of the chunk's tokens */
    int ares_blocks;
    float *lat_in, *lat_out; /* [B, expert_hidden] latent routed-expert input / weighted sum */
    float *gate_buf;         /* [B, H * vdim] MLA / GQA output gate */
    ms_engine_stats stats;
    /* DeepSeek Sparse Attention (engine/dsa_layer.c) */
    struct ms_dsa_state *dsa;
    struct ms_mhc_state *mhc; /* hyper-connection streams (engine/mhc_layer.c), NULL for hc_mult <= 1 */
    struct ms_cattn_state *cattn; /* compressed-attention caches (engine/compressed_attn.c), NULL without */
    struct ms_hybrid *hyb;        /* hybrid execution (engine/hybrid_experts.c): CPU expert layers, else NULL */
    const int32_t *chunk_tokens;  /* token ids of the chunk in flight (hash-routed MoE layers) */
    /* the sequences of the chunk in flight (this engine is their lead: its activations hold
     * every row). Per-token work (projections, norms, router, experts, the head) runs once
     * over all rows; per-sequence work (RoPE at the row's position, cache appends, the
     * attention op, linear-attention / DSA / compressed-attention state) per entry, on the
     * entry's engine. */
    const ms_fwd_seq *seqs;
    int n_seqs;
    int64_t fwd_len;     /* length of the forward whose top-k tie choices are reproduced */
    /* decode lookahead: the experts layer la_layer was predicted to pick (-1: none pending) */
    int la_layer;
    const float *ffn_in; /* [n, hidden] the current layer's FFN input before its norm (the lookahead re-norms it) */
    int la_ids[MS_LOOKAHEAD_MAX_K];
    /* the replayable decode step (engine/decode_step.c): step [be] {position, token id} of the
     * token in flight when step_mode is 1 (the ops read them from there); the recorded graph
     * of the context bucket step_bucket; step_warm: the bucket whose eager step-mode run
     * prepared the backend; step_off: 1 never again (the model or the backend does not qualify) */
    int64_t *step;
    int step_mode, step_off;
    int64_t step_bound, step_bucket, step_warm;
    int64_t step_dev_pos; /* what e->step holds on the device: {step_dev_pos, step_dev_tok} (-1: unknown); */
    int32_t step_dev_tok; /* argmax_step writes the next greedy token's there, and then no upload is needed */
    void *step_graph;
    ms_engine_stats step_delta; /* what one recorded step adds to stats */
    ms_choice_fn choice_fn;     /* ms_engine_observe_choices, or NULL */
    void *choice_ctx;
    int keep_logits;            /* a device forward leaves the head's output in e->logits (no download) */
    int32_t *pick;              /* [be] the greedy pick of ms_engine_decode_greedy */
    float *host_logits;         /* [vocab] host memory: ms_engine_decode_greedy's logits on a host-memory backend */
    /* the pipeline split (ms_engine_opts.stages): this engine runs layers [l0, l1) (0, n_layers
     * without one); staged: only those layers' causal state is allocated */
    int l0, l1, staged, stage;
    int ares_nb;          /* a later stage: Attention Residuals blocks completed by the stages before it */
    const ms_stages *stages;
    struct ms_engine **stage_e; /* [stages->n] the lead's stage engines (stage_e[0] = the lead); shared by all stages */
};

/* A split engine: stage s's backend made current before work is queued on it (the comm's
 * activate: a GPU's device); nothing for an engine without stages. */
static inline void ms_stage_activate(const ms_engine *e, int s) {
    if (e->staged && e->stages->comm->ops->activate) e->stages->comm->ops->activate(e->stages->comm, s);
}

/* A lead split over stages (ms_engine_opts.stages): its later stages' engines take its
 * position (state.c after a restore or truncation); nothing without stages. */
void ms_engine_stages_at(ms_engine *e);

/* One allocation of the engine: where its pointer goes (NULL when only
 * counting, as the memory plan does), how big, whether it is causal state
 * (grows with the context) or workspace, and whether it is engine (host)
 * memory or backend memory. Every buffer of the engine and of its modules
 * (DSA, compressed attention, mHC, the linear-attention states) is one entry of
 * one table (engine.c engine_buffers): the allocator, the destructor and the
 * memory plan all read it. */
typedef struct ms_buf_spec {
    void **ptr;
    size_t bytes;
    int state;       /* causal state (the plan's state line), else workspace */
    int host;        /* engine memory (calloc), not backend memory */
    const char *tag; /* per-position caches: the snapshot section name (with the layer) */
    int layer;
    size_t row;      /* causal state: bytes per position (0: fixed size) */
} ms_buf_spec;

/* Append one spec at b[n] (b NULL: count only); returns n + 1. */
static inline int ms_buf_add(ms_buf_spec *b, int n, void **ptr, size_t bytes, int state, int host) {
    if (b) b[n] = (ms_buf_spec){ptr, bytes, state, host, NULL, -1, 0};
    return n + 1;
}

/* The modules' buffers for a model of config c at context T and batch B,
 * appended at b[n..] (b NULL: count); return the new count. Their state
 * structs (e->dsa, e->cattn, e->mhc) hold the pointers; with a NULL struct
 * (planning, or before init) the entries have NULL ptr. */
int ms_dsa_engine_buffers(ms_engine *e, const ms_config *c, size_t T, size_t B, ms_buf_spec *b, int n);
int ms_cattn_engine_buffers(ms_engine *e, const ms_config *c, size_t T, size_t B, ms_buf_spec *b, int n);
int ms_mhc_engine_buffers(ms_engine *e, const ms_config *c, size_t T, size_t B, ms_buf_spec *b, int n);
/* After the table is allocated: what a module sets up in its buffers (DSA: the KPool ape upload). */
int ms_dsa_engine_ready(ms_engine *e, ms_err *err);

/* Sublayers: read e->xn [n, hidden], write the sublayer output into out [n, hidden];
 * e is the lead of the forward in flight (e->seqs: which rows belong to which sequence). */
int ms_attn_gqa(ms_engine *e, int layer, int n, float *out, ms_err *err);
/* One decode token through the replayable step (engine/decode_step.c): MS_ERR_UNSUPPORTED, with
 * nothing done, when the model, the backend or the token do not qualify (the caller then runs
 * forward_chunk); else the token forwarded (n_past + 1) with its logits [vocab] in logits (NULL:
 * left in e->logits). */
int ms_engine_step(ms_engine *e, int32_t token, float *logits, ms_err *err);
/* forward_chunk of engine.c, for decode_step.c */
int ms_engine_forward_chunk(ms_engine *e, const int32_t *tokens, int n, float *logits, int all_logits, ms_err *err);
void ms_engine_step_free(ms_engine *e);
int ms_attn_mla(ms_engine *e, int layer, int n, float *out, ms_err *err);
int ms_attn_kda(ms_engine *e, int layer, int n, float *out, ms_err *err);
int ms_attn_gdn(ms_engine *e, int layer, int n, float *out, ms_err *err);
/* The gated DeltaNet block config of a model config (engine/kda_layer.c). */
void ms_gdn_config_of(const ms_config *c, ms_gdn_config *out);
int ms_attn_compressed(ms_engine *e, int layer, int n, float *out, ms_err *err);
/* Compressed attention state (engine/compressed_attn.c): init (its host struct;
 * a no-op for models without MS_ATTN_COMPRESSED layers; the buffers come from the
 * engine's table), free (the struct; the table frees the buffers first), reset
 * to an empty sequence. */
int ms_cattn_engine_init(ms_engine *e, ms_err *err);
void ms_cattn_engine_free(ms_engine *e);
void ms_cattn_engine_reset(ms_engine *e);
/* The KDA block config of a model config (engine/kda_layer.c). */
void ms_kda_config_of(const ms_config *c, ms_kda_config *out);
int ms_ffn_dense(ms_engine *e, const ms_qmat *gate, const ms_qmat *up, const ms_qmat *down, int n, const float *in,
                 float *out, int accumulate);
int ms_ffn_moe(ms_engine *e, int layer, int n, float *out, ms_err *err);
/* Pieces of the MoE layer (engine/moe.c) the hybrid layer shares: the gated activation of
 * kind; layer L's router over x [n, hidden] into ids / w [n, K] (backend memory), downloaded
 * into e->h_ids / e->h_w; the expert-major lists of that routing (returns the unique
 * experts: e->ex_uniq, offsets e->ex_count); the decode lookahead prefetch of the next MoE
 * layer (into the source that serves it). */
ms_glu ms_moe_glu(const ms_config *c, ms_act_kind kind);
int ms_moe_route(ms_engine *e, const ms_layer *L, const float *x, int n, const int32_t *tokens, int *ids, float *w,
                 ms_err *err);
int ms_moe_build_lists(ms_engine *e, int layer, int n, const int *rank);
int ms_moe_lookahead(ms_engine *e, int layer, int n, ms_err *err);
/* The zero-computation experts' pairs of the lists ms_moe_build_lists made: acc += w * in rows,
 * through be's scale_add_rows (in, acc: be's memory, rows of D), after the routed experts (moe.c). */
void ms_moe_zero_experts(ms_engine *e, ms_backend *be, const float *in, float *acc, int64_t D);
/* The routed experts' input / accumulator rows and their width (the latent ones queue
 * lat_down), and the latent sum's norm + up projection into out (moe.c). */
int64_t ms_moe_io(ms_engine *e, const ms_layer *L, int n, float *out, const float **in, float **acc);
void ms_moe_latent_up(ms_engine *e, const ms_layer *L, int n, float *acc, float *out);

/* Hybrid execution (engine/hybrid_experts.h). init after the engine's table (o NULL or
 * without CPU layers, or a host-memory backend: nothing, e->hyb stays NULL); free; whether
 * layer's experts run on the CPU; the host source serving those layers; the MoE sublayer of
 * a CPU layer (as ms_ffn_moe); the placement of m's weights on be without the CPU layers'
 * experts (ms_model_place otherwise; cpu_layer NULL: all layers as skip_experts says). */
int ms_hybrid_init(ms_engine *e, const struct ms_hybrid_opts *o, ms_err *err);
void ms_hybrid_free(ms_engine *e);
int ms_hybrid_layer(const ms_engine *e, int layer);
ms_expert_source *ms_hybrid_host(const ms_engine *e);
int ms_hybrid_ffn_moe(ms_engine *e, int layer, int n, float *out, ms_err *err);
int ms_hybrid_place(const ms_model *m, ms_backend *be, const uint8_t *cpu_layer, int skip_experts, ms_model **placed,
                    ms_err *err);

/* DSA: state for the model's indexers (a no-op for models without), its
 * reset, and the selection of a chunk for an MLA layer with layer_dsa != 0:
 * runs the layer's indexer on q_resid [n, q_lora_rank] and xn [n, hidden] (layer_dsa 1)
 * or keeps the selection of the layer it shares (2). The selection of token t
 * of the chunk: ms_dsa_engine_row. */
int ms_dsa_engine_init(ms_engine *e, ms_err *err);
void ms_dsa_engine_free(ms_engine *e);
void ms_dsa_engine_reset(ms_engine *e);
int ms_dsa_engine_select(ms_engine *e, int layer, int n, const float *q_resid, const float *xn, ms_err *err);
const int32_t *ms_dsa_engine_row(const ms_engine *e, int t, int *count);
/* The whole selection of the chunk: rows of width positions, count[t] valid in row t (host arrays). */
void ms_dsa_engine_selection(const ms_engine *e, const int32_t **sel, const int32_t **count, int64_t *width);
/* Reproducing a full-recompute reference: a selection that fell inside a tie
 * can change when the forward grows (ops/dsa.h). replay_from: the earliest
 * position whose recorded tied selection differs in a forward of fwd_len
 * tokens, -1 if none (or the model has recurrent layers, whose state cannot be
 * rolled back). rollback: forget DSA state from pos on. note_tokens: record
 * tokens at n_past.. for replays; tokens: the recorded sequence. */
int ms_dsa_engine_replay_from(ms_engine *e, int64_t fwd_len, int64_t *from, ms_err *err);
void ms_dsa_engine_rollback(ms_engine *e, int64_t pos);
void ms_dsa_engine_note_tokens(ms_engine *e, const int32_t *tokens, int n);
const int32_t *ms_dsa_engine_tokens(const ms_engine *e);
/* A split engine's hand-off: the chunk's current selection (n rows; host arrays) from one stage
 * to the next, for a later layer that shares an earlier one's (layer_dsa 2). */
void ms_dsa_engine_hand_on(const ms_engine *from, ms_engine *to, int n);
/* mHC (hc_mult > 1): init/free the streams; begin: e->x [n, hidden] (the
 * embeddings) becomes hc copies; pre: the collapsed input of a sublayer
 * (ffn 0: attention, 1: feed-forward) from the streams; post: mix the sublayer
 * output y [n, hidden] into the streams; end: their mean (or the learned hyper
 * head, cfg hc_head_weighted) into e->x. */
int ms_mhc_engine_init(ms_engine *e, ms_err *err);
void ms_mhc_engine_free(ms_engine *e);
void ms_mhc_engine_begin(ms_engine *e, int n);
int ms_mhc_engine_pre(ms_engine *e, int layer, int ffn, int n, const float **collapsed, ms_err *err);
void ms_mhc_engine_post(ms_engine *e, int n, const float *y);
/* The current streams [B, hc, hidden] (backend memory; NULL without mHC): a split engine hands
 * them to the next stage instead of the residual. */
float *ms_mhc_engine_streams(ms_engine *e);
int ms_mhc_engine_end(ms_engine *e, int n, ms_err *err);

/* ---- causal state as engine/state.c sees it (snapshots, state files, truncation) ----
 * Every piece of state that outlives a forward is one part. Whoever allocates
 * state lists it here: engine.c's buffer table (per-position caches) and the
 * KDA / gated-DeltaNet states, dsa_layer.c and compressed_attn.c their own.
 * Everything else in the engine (activations, mHC streams, Attention-Residual
 * block states, router scratch) lives only within one forward. */
typedef enum {
    MS_PART_ROWS,   /* one row per `per` positions: rows in use = n_past / per */
    MS_PART_FIXED,  /* row_bytes bytes, all of them state (recurrent states, rings) */
    MS_PART_CUSTOM, /* serialized by the owning module (size/get/check/put) */
} ms_part_kind;

typedef struct ms_state_part {
    char name[48];          /* unique and stable: the section name in snapshots and state files */
    ms_part_kind kind;
    void *data;             /* ROWS, FIXED: the engine memory: backend memory (state.c copies it with
                             * download / upload), or host memory when host is set */
    int host;               /* ROWS, FIXED: data is the engine's own host memory */
    ms_backend *be;         /* ROWS, FIXED: the backend whose memory data is (NULL: the engine's; a split
                             * engine's later stages: theirs) */
    uint64_t row_bytes;     /* ROWS: bytes per row; FIXED: bytes */
    int64_t per;            /* ROWS: positions per row (>= 1) */
    int64_t cap_rows;       /* ROWS: rows data has room for */
    const char *no_truncate; /* NULL: rolls back with the position; else why it cannot */
    int layer;              /* CUSTOM: passed to the hooks */
    /* CUSTOM: bytes of the serialized form now; write them; validate a serialized form for
     * n_past (and reserve memory for it: no visible change); put it (cannot fail after check) */
    uint64_t (*size)(const ms_engine *e, int layer);
    void (*get)(const ms_engine *e, int layer, uint8_t *out);
    int (*check)(ms_engine *e, int layer, const uint8_t *in, uint64_t n, int64_t n_past, ms_err *err);
    void (*put)(ms_engine *e, int layer, const uint8_t *in, uint64_t n);
    ms_engine *eng;         /* CUSTOM: the engine the hooks get (NULL: the one saved or restored; a split
                             * engine's later stage: its own) */
} ms_state_part;

/* The engine's state parts into parts[0..cap) (parts may be NULL to count);
 * returns how many there are (may exceed cap: call again with room), or
 * MS_ERR_NOMEM. e is not changed (the parts' data pointers are its memory). */
int ms_engine_state_parts(const ms_engine *e, ms_state_part *parts, int cap);
/* The modules' parts, appended at parts[n..cap); return the new count. */
int ms_dsa_engine_parts(const ms_engine *e, ms_state_part *parts, int n, int cap);
int ms_cattn_engine_parts(const ms_engine *e, ms_state_part *parts, int n, int cap);
/* After state.c restored every part for n_past: the modules' own counters. */
void ms_dsa_engine_restored(ms_engine *e, int64_t n_past);
void ms_cattn_engine_restored(ms_engine *e, int64_t n_past);

#endif
