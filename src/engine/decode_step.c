/* decode_step.c — the replayable decode step: one token's whole forward recorded once
 * as a backend graph (a CUDA / HIP graph on the GPU backend) and replayed for the
 * tokens after it, so the device runs the step without a launch per op.
 *
 * What changes from token to token (the position, the token id) is read by the ops
 * from backend memory (e->step, uploaded before each step): the embedding row
 * (embed_at), the RoPE angle and the cache rows of the keys and values (qkv_at), and
 * the attention's key count (ms_attn_gqa_args.pos_dev). Every pointer of the step
 * is fixed: activations, caches and weights do not move while the engine lives.
 * The attention's grid is sized for the last position of a context bucket of
 * STEP_BUCKET tokens; a token in another bucket records again.
 *
 * Per bucket: the first token runs eagerly in step mode (every table and scratch
 * buffer of the backend made), the second is recorded and replayed, the rest
 * replayed. A graph whose backend scratch moved since (MS_ERR_LIMIT) is recorded
 * again; a recording that fails (an op that needs the host) turns the step off for
 * the engine, and the token runs as before, so the results never depend on it.
 *
 * Which models: GQA, KDA or NoPE MLA (latent_at) attention in every layer, no mHC,
 * Attention Residuals, DSA or compressed attention; MoE layers with resident experts routed on the device (no
 * hash routing, no router of a kind the device routes on the host). The backend
 * leaves the graph ops NULL when it has none (the CPU) or when they are switched
 * off (the GPU's MS_GPU_GRAPH=0), and the engine then runs every step as before. */
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/hybrid_experts.h"

#define STEP_BUCKET 256

/* Whether e's model and backend can take the step at all (static: config, weights, backend). */
static int step_qualifies(const ms_engine *e) {
    const ms_backend_ops *o = e->be->ops;
    const ms_config *c = &e->m->cfg;
    if (e->be->host_memory || !o->embed_at || !o->qkv_at || !o->graph_begin || !o->graph_end || !o->graph_launch ||
        !o->graph_free || !e->logits)
        return 0;
    if (e->mhc || e->dsa || e->cattn || c->attn_res_block || c->latent_moe || c->n_zero_experts) return 0;
    if (e->staged) return 0; /* a pipeline stage (several devices): its hand-offs are host-driven copies */
    if (ms_engine_hybrid_active(e)) return 0; /* experts on the CPU: their sums come from the host */
    if (e->experts != e->own_experts) return 0; /* streamed experts: router ids go to the host */
    if (c->qk_norm_after_rope) return 0; /* qkv_at normalizes before its RoPE */
    if (c->q_pos_beta != 0) return 0; /* the position-dependent query scale is computed from the host's position */
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_attn[l] == MS_ATTN_MLA) { /* latent_at writes the cache row; no RoPE, no indexer */
            if (!o->latent_at || c->rope.dim != 0 || c->layer_dsa[l]) return 0;
        } else if (c->layer_attn[l] != MS_ATTN_KDA) { /* KDA: no per-token value but the state */
            if (c->layer_attn[l] != MS_ATTN_GQA) return 0;
            if ((c->layer_rope[l] ? c->rope_alt.dim : c->rope.dim) == 0) return 0; /* NoPE layers: qkv_at always ropes */
        }
        if (c->layer_mlp[l] == MS_MLP_MOE) {
            const ms_layer *L = &e->w->layers[l];
            /* routers the device routes on the host (route's downloads are not part of a graph) */
            int host_router = c->router != MS_ROUTER_SOFTMAX && c->router != MS_ROUTER_SIGMOID &&
                              c->router != MS_ROUTER_TOPK_SOFTMAX;
            if (L->hash_ids || !L->experts || host_router || !o->moe_experts_routed) return 0;
        }
    }
    return 1;
}

static void stats_sub(ms_engine_stats *d, const ms_engine_stats *a, const ms_engine_stats *b) {
    d->tokens = a->tokens - b->tokens;
    d->expert_activations = a->expert_activations - b->expert_activations;
    d->experts_acquired = a->experts_acquired - b->experts_acquired;
    d->lookahead_predicted = a->lookahead_predicted - b->lookahead_predicted;
    d->lookahead_correct = a->lookahead_correct - b->lookahead_correct;
    d->mla_chunks = a->mla_chunks - b->mla_chunks;
    d->mla_expanded = a->mla_expanded - b->mla_expanded;
}
static void stats_add(ms_engine_stats *a, const ms_engine_stats *d) {
    a->tokens += d->tokens;
    a->expert_activations += d->expert_activations;
    a->experts_acquired += d->experts_acquired;
    a->lookahead_predicted += d->lookahead_predicted;
    a->lookahead_correct += d->lookahead_correct;
    a->mla_chunks += d->mla_chunks;
    a->mla_expanded += d->mla_expanded;
}

void ms_engine_step_free(ms_engine *e) {
    if (e->step_graph) e->be->ops->graph_free(e->be, e->step_graph);
    e->step_graph = NULL;
    if (e->step) e->be->ops->free(e->be, e->step);
    e->step = NULL;
}

/* The token's forward in step mode (run, or recorded between graph_begin / graph_end). */
static int step_forward(ms_engine *e, int32_t token, ms_err *err) {
    e->step_mode = 1;
    float dummy = 0; /* forward_rows wants a logits pointer; in step mode the head writes e->logits */
    int rc = ms_engine_forward_chunk(e, &token, 1, &dummy, 0, err);
    e->step_mode = 0;
    return rc;
}

/* Record the step of token (nothing runs); on success e->step_graph holds it and e's
 * n_past / stats have moved as the step will: the caller launches it. MS_ERR_UNSUPPORTED
 * with everything as before when recording is off now (graph_begin refuses: the profile);
 * a recording that fails also turns the step off for the engine. */
static int step_record(ms_engine *e, int32_t token) {
    ms_backend *be = e->be;
    ms_err ign = {0};
    if (be->ops->graph_begin(be, &ign)) return MS_ERR_UNSUPPORTED;
    int n_past = e->n_past, no_routed = e->no_routed, la = e->la_layer;
    ms_engine_stats st = e->stats;
    int rc = step_forward(e, token, &ign);
    void *g = NULL;
    int rc2 = be->ops->graph_end(be, &g, &ign);
    if (rc || rc2 || !g || e->no_routed != no_routed) { /* an op needed the host, or refused: undone */
        if (g) be->ops->graph_free(be, g);
        e->n_past = n_past, e->no_routed = no_routed, e->la_layer = la, e->stats = st;
        e->step_off = 1;
        return MS_ERR_UNSUPPORTED;
    }
    stats_sub(&e->step_delta, &e->stats, &st);
    e->step_graph = g;
    return MS_OK;
}

int ms_engine_step(ms_engine *e, int32_t token, float *logits, ms_err *err) {
    if (e->step_off) return MS_ERR_UNSUPPORTED;
    if (!step_qualifies(e) || e->no_routed) {
        e->step_off = 1;
        return MS_ERR_UNSUPPORTED;
    }
    ms_backend *be = e->be;
    int rc;
    if (!e->step) {
        if (be->ops->alloc(be, 2 * sizeof(int64_t), (void **)&e->step, err)) {
            e->step = NULL;
            e->step_off = 1;
            return MS_ERR_UNSUPPORTED;
        }
        e->step_warm = e->step_bucket = -1;
        e->step_dev_pos = -1;
    }
    int64_t pos = e->n_past, bucket = pos / STEP_BUCKET;
    int64_t bound = (bucket + 1) * STEP_BUCKET - 1;
    if (bound > e->max_ctx - 1) bound = e->max_ctx - 1;
    if (e->step_graph && e->step_bucket != bucket) { /* another bucket: another attention grid */
        be->ops->graph_free(be, e->step_graph);
        e->step_graph = NULL;
    }
    int64_t hv[2] = {pos, token};
    if (e->step_dev_pos != pos || e->step_dev_tok != token) { /* else the device holds it (argmax_step) */
        e->step_dev_pos = -1;
        if ((rc = be->ops->upload(be, e->step, hv, sizeof hv, err))) return rc;
        e->step_dev_pos = pos, e->step_dev_tok = token;
    }
    e->step_bound = bound;
    if (e->step_graph) {
        rc = be->ops->graph_launch(be, e->step_graph, err);
        if (rc == MS_ERR_UNSUPPORTED) return rc; /* replays off for now (the profile): the ops as called */
        if (rc == MS_ERR_LIMIT) { /* the backend's scratch moved since the recording: prepare and record again */
            be->ops->graph_free(be, e->step_graph);
            e->step_graph = NULL;
            e->step_warm = -1;
        } else if (rc) {
            return rc;
        } else {
            e->n_past++;
            stats_add(&e->stats, &e->step_delta);
        }
    }
    if (!e->step_graph && e->step_warm == bucket) {
        if (step_record(e, token) != MS_OK) return MS_ERR_UNSUPPORTED;
        e->step_bucket = bucket;
        if ((rc = be->ops->graph_launch(be, e->step_graph, err))) return rc; /* n_past has moved: a real failure */
    } else if (!e->step_graph) { /* the eager step-mode run: prepares the backend to record this bucket */
        if ((rc = step_forward(e, token, err))) return rc;
        e->step_warm = bucket;
    }
    if (!logits) return MS_OK; /* ms_engine_decode_greedy picks from e->logits */
    return be->ops->download(be, logits, e->logits, (size_t)e->m->cfg.vocab * 4, err);
}
