/* engine.c — state allocation and the layer loop (prefill and decode). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/backend_cpu.h"
#include "core/comm.h"
#include "engine/engine_internal.h"
#include "engine/hybrid_experts.h"

#define MAX2(a, b) ((a) > (b) ? (a) : (b))

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Element counts of layer l's linear-attention state (KDA or gated DeltaNet); 0 for other layers. */
static void linear_state_lens(const ms_config *c, int l, int64_t *conv_len, int64_t *S_len) {
    *conv_len = *S_len = 0;
    if (c->layer_attn[l] == MS_ATTN_KDA) {
        ms_kda_config kc;
        ms_kda_config_of(c, &kc);
        ms_kda_state_lens(&kc, conv_len, S_len);
    } else if (c->layer_attn[l] == MS_ATTN_GDN) {
        ms_gdn_config gc;
        ms_gdn_config_of(c, &gc);
        ms_gdn_state_lens(&gc, conv_len, S_len);
    }
}

/* Every buffer the engine and its modules allocate, sized from the config,
 * context T and batch B, appended into b (NULL: count only); returns the
 * count. The single source of truth for allocation, destruction and the memory
 * plan (the backend's own workspace is its workspace_bytes). e may be a zeroed
 * engine (planning): entries whose owner does not exist yet have NULL ptr.
 * with_layers 0 lists only the per-layer pointer arrays, which must exist
 * before the rest is listed with pointers. */
static int engine_buffers(ms_engine *e, const ms_config *c, size_t T, size_t B, int with_layers, ms_buf_spec *b) {
    int n = 0;
    /* backend memory, engine (host) memory */
#define BUF(p, sz, st) (n = ms_buf_add(b, n, (void **)(p), (size_t)(sz), (st), 0))
#define HBUF(p, sz) (n = ms_buf_add(b, n, (void **)(p), (size_t)(sz), 0, 1))
    /* causal state: one row of `rw` bytes per position (engine/state.c snapshots it by tag) */
#define SBUF(p, rw, tg, ly)                                                                                            \
    (b ? (b[n] = (ms_buf_spec){(void **)(p), T * (size_t)(rw), 1, 0, (tg), (ly), (size_t)(rw)}, 0) : 0, n++)
    size_t L = (size_t)c->n_layers;
    HBUF(&e->k_cache, L * sizeof(float *));
    HBUF(&e->v_cache, L * sizeof(float *));
    HBUF(&e->latent, L * sizeof(float *));
    HBUF(&e->kda, L * sizeof *e->kda);
    if (!with_layers) return n;
    for (size_t l = 0; l < L; l++) {
        if (e->staged && ((int)l < e->l0 || (int)l >= e->l1)) continue; /* another stage's layer */
        if (c->layer_attn[l] == MS_ATTN_GQA) {
            size_t kvh = (size_t)(c->layer_kv_heads[l] ? c->layer_kv_heads[l] : c->n_kv_heads);
            size_t vd = (size_t)(c->v_head_dim ? c->v_head_dim : c->head_dim);
            SBUF(e->k_cache ? &e->k_cache[l] : NULL, kvh * (size_t)c->head_dim * 4, "k", l);
            SBUF(e->v_cache ? &e->v_cache[l] : NULL, kvh * vd * 4, "v", l);
        } else if (c->layer_attn[l] == MS_ATTN_MLA) {
            SBUF(e->latent ? &e->latent[l] : NULL, (size_t)(c->kv_lora_rank + c->qk_rope_dim) * 4, "latent", l);
        } else if (c->layer_attn[l] == MS_ATTN_KDA || c->layer_attn[l] == MS_ATTN_GDN) {
            int64_t conv_len, S_len; /* fixed-size conv tails + recurrent state */
            linear_state_lens(c, (int)l, &conv_len, &S_len);
            BUF(e->kda ? &e->kda[l].conv : NULL, (size_t)(conv_len + 1) * 4, 1);
            BUF(e->kda ? &e->kda[l].S : NULL, (size_t)S_len * 4, 1);
            if (b) b[n - 1].layer = b[n - 2].layer = (int)l; /* the placement's per-layer state */
        }
    }
    int64_t H = c->n_heads, qdim = MAX2(c->head_dim, c->qk_nope_dim + c->qk_rope_dim);
    int64_t vdim = MAX2(c->head_dim, c->v_head_dim);
    int64_t max_kv = c->n_kv_heads;
    for (int l = 0; l < c->n_layers; l++) max_kv = MAX2(max_kv, c->layer_kv_heads[l]);
    int64_t kvw = MAX2(max_kv * (c->head_dim + vdim), MAX2(c->kv_lora_rank + c->qk_rope_dim, c->q_lora_rank));
    /* 2x: a fused gate_up expert writes [2 * inter] per token into g */
    int64_t inter = 2 * MAX2(c->inter, MAX2(c->moe_inter, c->shared_inter));
    BUF(&e->x, B * c->hidden * 4, 0);
    BUF(&e->xn, B * c->hidden * 4, 0);
    BUF(&e->q, B * H * qdim * (c->attn_out_gate ? 2 : 1) * 4, 0); /* gated: [query, gate] per head */
    BUF(&e->kv, B * kvw * 4, 0);
    BUF(&e->att, B * H * vdim * 4, 0);
    BUF(&e->tmp, B * c->hidden * 4, 0);
    int shortcut = 0;
    for (int l = 0; l < c->n_layers; l++) shortcut |= c->layer_shortcut[l] != 0;
    if (shortcut) BUF(&e->sc, B * c->hidden * 4, 0); /* the held shortcut-MoE output */
    /* logits rows computed on a backend whose memory the caller cannot read (logit_rows at a time) */
    e->logit_rows = 0;
    if (e->be && !e->be->host_memory) {
        e->logit_rows = (int)(B < 16 ? B : 16);
        BUF(&e->logits, (size_t)e->logit_rows * (size_t)c->vocab * 4, 0);
    }
    BUF(&e->g, B * inter * 4, 0);
    BUF(&e->u, B * inter * 4, 0);
    int64_t xw = MAX2(c->hidden, c->expert_hidden); /* expert rows: hidden, or the latent width */
    BUF(&e->xs, B * xw * 4, 0);
    BUF(&e->ys, B * xw * 4, 0);
    e->ares_blocks = c->attn_res_block > 0 ? (int)((c->n_layers + c->attn_res_block - 1) / c->attn_res_block) : 0;
    if (e->ares_blocks) BUF(&e->ares, (size_t)e->ares_blocks * B * c->hidden * 4, 0);
    if (c->latent_moe) {
        BUF(&e->lat_in, B * c->expert_hidden * 4, 0);
        BUF(&e->lat_out, B * c->expert_hidden * 4, 0);
    }
    if (c->mla_out_gate || c->attn_out_gate || c->attn_gate_proj) BUF(&e->gate_buf, B * H * vdim * 4, 0);
    if (c->n_experts) {
        BUF(&e->rlog, B * ms_router_width(c) * 4, 0);
        BUF(&e->topk_ids, B * c->top_k * sizeof(int), 0);
        BUF(&e->topk_w, B * c->top_k * 4, 0);
        size_t E = (size_t)c->n_experts, W = (size_t)ms_router_width(c), BK = B * (size_t)c->top_k;
        HBUF(&e->h_ids, BK * sizeof(int));
        HBUF(&e->h_w, BK * 4);
        HBUF(&e->h_fixed, BK * sizeof(int32_t));
        HBUF(&e->ex_count, (W + 1) * sizeof(int));
        HBUF(&e->ex_tokens, BK * sizeof(int));
        HBUF(&e->ex_w, BK * 4);
        HBUF(&e->ex_pos, W * sizeof(int));
        HBUF(&e->ex_uniq, E * sizeof(int));
        HBUF(&e->ex_off, (E + 1) * sizeof(int));
        HBUF(&e->ex_views, E * sizeof(ms_expert_view));
        if (e->staged) HBUF(&e->ex_rank, 3 * E * sizeof(int));
    }
    n = ms_dsa_engine_buffers(e, c, T, B, b, n);
    n = ms_cattn_engine_buffers(e, c, T, B, b, n);
    n = ms_mhc_engine_buffers(e, c, T, B, b, n);
#undef BUF
#undef HBUF
#undef SBUF
    return n;
}

/* The table of an engine (or a zeroed one, planning) into a new array (*out, free it); the count, or -1. */
static int engine_table(ms_engine *e, const ms_config *c, size_t T, size_t B, int with_layers, ms_buf_spec **out) {
    int n = engine_buffers(e, c, T, B, with_layers, NULL);
    *out = malloc((size_t)(n > 0 ? n : 1) * sizeof **out);
    if (!*out) return -1;
    return engine_buffers(e, c, T, B, with_layers, *out);
}

/* Causal-state bytes of the table at context T (batch 1). */
static uint64_t state_bytes_at(const ms_model *m, size_t T) {
    ms_engine tmp;
    memset(&tmp, 0, sizeof tmp);
    ms_buf_spec *specs;
    int n = engine_table(&tmp, &m->cfg, T, 1, 1, &specs);
    uint64_t b = 0;
    for (int i = 0; i < n; i++) b += specs[i].state ? specs[i].bytes : 0;
    free(specs);
    return b;
}

uint64_t ms_engine_state_bytes_per_token(const ms_model *m) {
    /* what 1024 more positions add (pooled and compressed rows grow by a fraction per token) */
    return (state_bytes_at(m, 2048) - state_bytes_at(m, 1024)) / 1024;
}

static void engine_dims(const ms_model *m, const ms_engine_opts *opts, size_t *T, size_t *B) {
    *T = opts && opts->max_ctx > 0 ? (size_t)opts->max_ctx : 4096;
    if (*T > (size_t)m->cfg.max_pos) *T = (size_t)m->cfg.max_pos;
    *B = opts && opts->max_batch > 0 ? (size_t)opts->max_batch : 256;
}

void ms_engine_plan_bytes(const ms_model *m, const ms_engine_opts *opts, int threads, uint64_t *state,
                          uint64_t *workspace) {
    size_t T, B;
    engine_dims(m, opts, &T, &B);
    ms_engine tmp; /* no engine: the table's sizes, without pointers */
    memset(&tmp, 0, sizeof tmp);
    tmp.be = opts ? opts->backend : NULL;
    ms_buf_spec *specs;
    int n = engine_table(&tmp, &m->cfg, T, B, 1, &specs);
    *state = *workspace = 0;
    for (int i = 0; i < n; i++) *(specs[i].state ? state : workspace) += specs[i].bytes;
    free(specs);
    /* the backend's own scratch (the CPU backend: per-thread attention and router scratch) */
    if (opts && opts->backend) *workspace += opts->backend->ops->workspace_bytes(opts->backend, &m->cfg, (int64_t)T, (int64_t)B);
    else *workspace += ms_backend_cpu_workspace_bytes(&m->cfg, (int64_t)T, (int64_t)B, threads > 0 ? threads : 1);
}

void ms_engine_layer_state_bytes(const ms_model *m, const ms_engine_opts *opts, uint64_t *per_layer, uint64_t *other,
                                 uint64_t *workspace) {
    size_t T, B;
    engine_dims(m, opts, &T, &B);
    ms_engine tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.be = opts ? opts->backend : NULL;
    ms_buf_spec *specs;
    int n = engine_table(&tmp, &m->cfg, T, B, 1, &specs);
    for (int l = 0; l < m->cfg.n_layers; l++) per_layer[l] = 0;
    *other = 0;
    for (int i = 0; i < n; i++) {
        if (!specs[i].state) continue;
        if (specs[i].layer >= 0 && specs[i].layer < m->cfg.n_layers) per_layer[specs[i].layer] += specs[i].bytes;
        else *other += specs[i].bytes;
    }
    free(specs);
    uint64_t st;
    ms_engine_plan_bytes(m, opts, 1, &st, workspace);
}

/* What a backend without host memory cannot run yet, beyond its ops table: an
 * expert source whose views are not in its memory (a host cache: wrap it in the
 * device expert source, engine/device_experts.h). MS_ERR_UNSUPPORTED naming it. */
static int device_supported(const ms_backend *be, const ms_config *c, const ms_expert_source *experts, ms_err *err) {
    if (experts && experts->views_on && experts->views_on != be)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "the expert source's views are in the memory of another backend (%s, "
                       "not %s)", experts->views_on->name, be->name);
    if (be->host_memory) return MS_OK;
    if (experts && experts->views_on != be)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "the %s backend needs expert views in its own memory: streamed experts go through the device "
                       "expert source (engine/device_experts.h; the CLI builds it for --backend %s with a streaming "
                       "option)",
                       be->name, be->name);
    return MS_OK;
}

/* One engine: the whole model on opts->backend, or stage `stage` of opts->stages. */
static int engine_create1(ms_model *m, const ms_engine_opts *opts, int stage, ms_engine **out, ms_err *err) {
    const ms_config *c = &m->cfg;
    ms_engine *e = calloc(1, sizeof *e);
    if (!e) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    e->m = m;
    e->w = m;
    const ms_stages *sg = opts ? opts->stages : NULL;
    e->l0 = 0, e->l1 = c->n_layers;
    if (sg) e->staged = 1, e->stage = stage, e->stages = sg, e->l0 = sg->layer_begin[stage], e->l1 = sg->layer_end[stage];
    ms_stage_activate(e, stage); /* its allocations and placed weights on its device */
    e->la_layer = -1;
    e->pool = opts ? opts->pool : NULL;
    e->n_threads = ms_pool_size(e->pool);
    size_t T, B;
    engine_dims(m, opts, &T, &B);
    e->max_ctx = (int)T;
    e->max_batch = (int)B;
    e->experts = opts ? opts->experts : NULL;
    e->mla_form = opts ? opts->mla_form : MS_MLA_AUTO;
    e->be = sg ? sg->bes[stage] : opts ? opts->backend : NULL;
    int rc;
    if (!e->be) {
        if ((rc = ms_backend_cpu_create(e->pool, &e->own_be, err))) {
            free(e);
            return rc;
        }
        e->be = e->own_be;
    }
    if ((rc = ms_backend_require(e->be, c, err)) || (rc = device_supported(e->be, c, e->experts, err)) ||
        (rc = e->be->ops->reserve(e->be, c, (int64_t)T, (int64_t)B, err))) {
        ms_engine_destroy(e);
        return rc;
    }
    const ms_engine *share = opts ? opts->weights_from : NULL;
    if (share && sg) share = share->stage_e && share->stages && share->stages->n == sg->n ? share->stage_e[stage] : NULL;
    if (share && (share->m != m || (!e->be->host_memory && (share->be != e->be || (share->experts != share->own_experts) !=
                                                                                  (e->experts != NULL))))) {
        ms_engine_destroy(e);
        return ms_fail(err, MS_ERR_ARG, "weights_from: that engine has another model, backend or expert source kind");
    }
    if (!e->be->host_memory && share) { /* the weights as the other engine placed them */
        e->w = share->w;
    } else if (!e->be->host_memory) { /* the weights move into the backend's memory (a stage: its part;
                                        * hybrid: all but the CPU layers' experts) */
        const uint8_t *cpu_layers = opts && opts->hybrid ? opts->hybrid->cpu_layer : NULL;
        ms_place_part part = {.layer_begin = e->l0, .layer_end = e->l1, .embed = !sg || stage == 0,
                              .head = !sg || stage == sg->n - 1, .skip_experts = e->experts != NULL,
                              .expert_devs = sg && sg->expert_home ? sg->expert_devs : NULL, .dev = stage};
        if ((rc = cpu_layers ? ms_hybrid_place(m, e->be, cpu_layers, e->experts != NULL, &e->placed, err)
                             : ms_model_place_part(m, e->be, &part, &e->placed, err))) {
            ms_wrap(err, "placing the weights on the %s backend", e->be->name);
            ms_engine_destroy(e);
            return rc;
        }
        e->w = e->placed;
    }
    if (!e->experts) {
        if ((rc = ms_resident_experts_create((ms_model *)e->w, &e->own_experts, err))) {
            ms_engine_destroy(e);
            return rc;
        }
        e->experts = e->own_experts;
    }
    /* the per-layer pointer arrays, the modules' own structs, then every buffer of the table */
    ms_buf_spec *specs = NULL;
    int f = 0, n = engine_table(e, c, T, B, 0, &specs);
    for (int i = 0; i < n && !f; i++) f = !(*specs[i].ptr = calloc(specs[i].bytes ? specs[i].bytes : 1, 1));
    free(specs);
    if (n < 0 || f) {
        ms_engine_destroy(e);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    }
    for (int l = 0; l < c->n_layers; l++) { /* KDA / gated DeltaNet state sizes (the ops read them) */
        int64_t conv_len, S_len;
        linear_state_lens(c, l, &conv_len, &S_len);
        e->kda[l].conv_len = conv_len, e->kda[l].S_len = S_len;
    }
    if ((rc = ms_dsa_engine_init(e, err)) || (rc = ms_mhc_engine_init(e, err)) || (rc = ms_cattn_engine_init(e, err))) {
        ms_engine_destroy(e);
        return rc;
    }
    n = engine_table(e, c, T, B, 1, &specs);
    ms_err aerr = {0};
    f = n < 0;
    for (int i = 0; i < n && !f; i++) {
        if (!specs[i].ptr || *specs[i].ptr) continue;
        if (specs[i].host) f = !(*specs[i].ptr = calloc(specs[i].bytes ? specs[i].bytes : 1, 1));
        else f = e->be->ops->alloc(e->be, specs[i].bytes, specs[i].ptr, &aerr) != MS_OK;
    }
    free(specs);
    if (f) {
        ms_engine_destroy(e);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory allocating engine state (context %zu, batch %zu, %.1f MiB of cache)",
                       T, B, (double)T * (double)ms_engine_state_bytes_per_token(m) / 1048576.0);
    }
    if ((rc = ms_dsa_engine_ready(e, err)) || (rc = ms_hybrid_init(e, opts ? opts->hybrid : NULL, err))) {
        ms_engine_destroy(e);
        return rc;
    }
    *out = e;
    return MS_OK;
}

/* Why a configuration cannot run split into stages, or NULL: an expert source from outside
 * (streamed experts: its cache and views are one backend's); a shortcut-connected MoE (the
 * MoE sum held for the next layer, e->sc, is not handed from stage to stage). */
static const char *unstageable(const ms_engine_opts *o, const ms_config *c) {
    if (o->experts) return "an external expert source (streamed experts)";
    if (o->hybrid && o->hybrid->cpu_layer) return "hybrid execution (routed experts on the CPU)";
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_shortcut[l]) return "a shortcut-connected MoE (layer_shortcut)";
    return NULL;
}

int ms_engine_create(ms_model *m, const ms_engine_opts *opts, ms_engine **out, ms_err *err) {
    const ms_stages *sg = opts ? opts->stages : NULL;
    if (!sg) return engine_create1(m, opts, 0, out, err);
    *out = NULL;
    if (sg->n < 1 || !sg->bes || !sg->comm || !sg->layer_begin || !sg->layer_end || sg->comm->n != sg->n)
        return ms_fail(err, MS_ERR_ARG, "stages: %d stages without backends, comm or layer ranges", sg->n);
    for (int s = 0, at = 0; s < sg->n; s++) {
        if (sg->layer_begin[s] != at || sg->layer_end[s] < at || sg->layer_end[s] > m->cfg.n_layers)
            return ms_fail(err, MS_ERR_ARG, "stages: stage %d's layers [%d, %d) do not follow the previous stage's", s,
                           sg->layer_begin[s], sg->layer_end[s]);
        at = sg->layer_end[s];
        if (s == sg->n - 1 && at != m->cfg.n_layers)
            return ms_fail(err, MS_ERR_ARG, "stages: the stages end at layer %d of %d", at, (int)m->cfg.n_layers);
    }
    const char *why = sg->n > 1 ? unstageable(opts, &m->cfg) : NULL;
    if (why)
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "splitting the model over %d devices is not supported yet with %s", sg->n, why);
    ms_engine **st = calloc((size_t)sg->n, sizeof *st);
    if (!st) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    int rc = MS_OK;
    for (int s = 0; s < sg->n && !rc; s++) {
        rc = engine_create1(m, opts, s, &st[s], err);
        if (rc) ms_wrap(err, "stage %d (layers %d..%d)", s, sg->layer_begin[s], sg->layer_end[s] - 1);
        else st[s]->stage_e = st;
    }
    if (rc) {
        for (int s = sg->n - 1; s >= 0; s--)
            if (st[s]) st[s]->stage_e = NULL, ms_engine_destroy(st[s]);
        free(st);
        return rc;
    }
    *out = st[0];
    return MS_OK;
}

/* The linear-attention layers' states (backend memory) back to a fresh sequence. */
static void kda_states_reset(ms_engine *e) {
    for (int l = 0; e->kda && l < e->m->cfg.n_layers; l++) {
        ms_kda_state *st = &e->kda[l];
        if (st->conv) e->be->ops->zero(e->be, st->conv, (size_t)st->conv_len * 4);
        if (st->S) e->be->ops->zero(e->be, st->S, (size_t)st->S_len * 4);
    }
}

void ms_engine_destroy(ms_engine *e) {
    if (!e) return;
    if (e->staged) ms_stage_activate(e, e->stage);
    if (e->stage_e && e->stage == 0) { /* the lead: its later stages, then the table of them */
        ms_engine **st = e->stage_e;
        for (int s = e->stages->n - 1; s >= 1; s--) st[s]->stage_e = NULL, ms_engine_destroy(st[s]);
        free(st);
        e->stage_e = NULL;
        ms_stage_activate(e, 0);
    }
    if (e->be) { /* every buffer of the table: backend memory through the backend, the rest with free */
        size_t T, B;
        ms_engine_opts o = {.max_ctx = e->max_ctx, .max_batch = e->max_batch};
        engine_dims(e->m, &o, &T, &B);
        ms_buf_spec *specs;
        int n = engine_table(e, &e->m->cfg, T, B, e->k_cache && e->v_cache && e->latent && e->kda, &specs);
        for (int i = n - 1; i >= 0; i--) { /* backwards: the per-layer buffers before their pointer arrays */
            if (!specs[i].ptr || !*specs[i].ptr) continue;
            if (specs[i].host) free(*specs[i].ptr);
            else e->be->ops->free(e->be, *specs[i].ptr);
            *specs[i].ptr = NULL;
        }
        free(specs);
    }
    ms_engine_step_free(e);
    if (e->pick && e->be) e->be->ops->free(e->be, e->pick);
    free(e->host_logits);
    ms_dsa_engine_free(e);
    ms_mhc_engine_free(e);
    ms_cattn_engine_free(e);
    ms_hybrid_free(e);
    if (e->own_experts) e->own_experts->ops->destroy(e->own_experts);
    ms_model_placed_free(e->placed);
    if (e->own_be) e->own_be->ops->destroy(e->own_be);
    free(e);
}

void ms_engine_reset(ms_engine *e) {
    if (e->stage_e && e->stage == 0)
        for (int s = 1; s < e->stages->n; s++) ms_engine_reset(e->stage_e[s]);
    e->n_past = 0;
    ms_dsa_engine_reset(e);
    ms_cattn_engine_reset(e);
    e->la_layer = -1;
    kda_states_reset(e);
}
void ms_engine_stages_at(ms_engine *e) {
    for (int s = 1; e->stage_e && e->stage == 0 && s < e->stages->n; s++) {
        e->stage_e[s]->n_past = e->n_past, e->stage_e[s]->la_layer = -1;
        ms_cattn_engine_restored(e->stage_e[s], e->n_past);
        ms_dsa_engine_restored(e->stage_e[s], e->n_past);
    }
}
int ms_engine_n_past(const ms_engine *e) { return e->n_past; }
int ms_engine_max_ctx(const ms_engine *e) { return e->max_ctx; }
const ms_model *ms_engine_model(const ms_engine *e) { return e->m; }
const ms_engine_stats *ms_engine_get_stats(const ms_engine *e) { return &e->stats; }

int ms_engine_observe_choices(ms_engine *e, ms_choice_fn fn, void *ctx, ms_err *err) {
    if (fn && (!e->be->host_memory || e->staged || e->stage_e || e->hyb))
        return ms_fail(err, MS_ERR_UNSUPPORTED, "observing choices needs a single host-memory backend (%s)", e->be->name);
    e->choice_fn = fn, e->choice_ctx = fn ? ctx : NULL;
    return MS_OK;
}
int ms_engine_n_stages(const ms_engine *e) { return e->stage_e ? e->stages->n : 1; }
const ms_engine_stats *ms_engine_stage_stats(const ms_engine *e, int s) {
    if (s < 0 || s >= ms_engine_n_stages(e)) return NULL;
    return e->stage_e ? &e->stage_e[s]->stats : &e->stats;
}

/* A sublayer's output y [n, D] joins the residual stream (or the hyper-connection streams). */
static void residual_add(ms_engine *e, int n, const float *y) {
    if (e->mhc) ms_mhc_engine_post(e, n, y);
    else e->be->ops->add(e->be, e->x, y, (int64_t)n * e->m->cfg.hidden);
}

/* The residual add of a sublayer's output y and the norm of the next sublayer's input,
 * xn = rmsnorm(x) * w, in one op where the backend has it (not with mHC streams or
 * Attention Residuals, whose next input is not the residual itself). */
static int fused_add_norm(const ms_engine *e) {
    return e->be->ops->add_rmsnorm && !e->mhc && !e->m->cfg.attn_res_block && !e->m->cfg.post_norm &&
           !e->m->cfg.layernorm && !e->m->cfg.parallel_block;
}

/* A sublayer's output y [n, D] before its residual add: its post norm (cfg post_norm) and the
 * residual multiplier (cfg residual_scale), in place. */
static void sublayer_out(ms_engine *e, float *y, const float *post_norm, int n) {
    const ms_config *c = &e->m->cfg;
    if (post_norm) e->be->ops->rmsnorm(e->be, y, y, post_norm, n, c->hidden, (float)c->rms_eps);
    if (c->residual_scale != 0 && c->residual_scale != 1)
        e->be->ops->scale(e->be, y, (float)c->residual_scale, (int64_t)n * c->hidden);
}

/* A sublayer's input row block xn from h [n, D]: rmsnorm(h) * w, layernorm(h) * w + b (cfg layernorm),
 * or h itself (cfg post_norm, w NULL). */
static void sublayer_in(ms_engine *e, float *xn, const float *h, const float *w, const float *b, int n) {
    const ms_config *c = &e->m->cfg;
    if (c->post_norm && !w) e->be->ops->copy(e->be, xn, h, (size_t)n * (size_t)c->hidden * 4);
    else if (c->layernorm) e->be->ops->layernorm(e->be, xn, h, w, b, n, c->hidden, (float)c->rms_eps);
    else e->be->ops->rmsnorm(e->be, xn, h, w, n, c->hidden, (float)c->rms_eps);
}

static int forward_rows(ms_engine *e, const ms_fwd_seq *seqs, int nseq, const int32_t *tokens, int n, float *logits,
                        int all_logits, ms_err *err);
static int forward_head(ms_engine *e, int nb, int64_t BS, int n, float *logits, int all_logits, ms_err *err);

/* The pipeline hand-off: the chunk's residual rows from stage e to the next stage's
 * activations (comm), then the next stage's layers over the same sequences' engines of
 * that stage. */
static int forward_next_stage(ms_engine *e, const ms_fwd_seq *seqs, int nseq, const int32_t *tokens, int n, int nb,
                              float *logits, int all_logits, ms_err *err) {
    int s = e->stage + 1;
    ms_engine *nx = e->stage_e[s];
    size_t row_bytes = (size_t)n * (size_t)e->m->cfg.hidden * 4;
    int rc;
    if (e->mhc) /* mHC: the hyper-connection streams are the residual */
        rc = e->stages->comm->ops->copy(e->stages->comm, s, ms_mhc_engine_streams(nx), e->stage,
                                        ms_mhc_engine_streams(e), row_bytes * (size_t)e->m->cfg.hc_mult, err);
    else
        rc = e->stages->comm->ops->copy(e->stages->comm, s, nx->x, e->stage, e->x, row_bytes, err);
    /* Attention Residuals: the completed block states of the chunk's rows go along */
    const int64_t BS = (int64_t)e->max_batch * e->m->cfg.hidden;
    for (int i = 0; i < nb && !rc; i++)
        rc = e->stages->comm->ops->copy(e->stages->comm, s, nx->ares + i * BS, e->stage, e->ares + i * BS, row_bytes, err);
    nx->ares_nb = nb;
    ms_dsa_engine_hand_on(e, nx, n); /* DSA: the selection a later layer may share */
    if (rc) {
        ms_wrap(err, "handing the residual from stage %d to stage %d", e->stage, s);
        return rc;
    }
    ms_fwd_seq stack_seqs[16], *sq = nseq <= 16 ? stack_seqs : malloc((size_t)nseq * sizeof *sq);
    if (!sq) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nseq; i++) {
        sq[i] = (ms_fwd_seq){seqs[i].e->stage_e[s], seqs[i].row, seqs[i].n};
        sq[i].e->fwd_len = seqs[i].e->fwd_len; /* the forward whose top-k tie choices are reproduced */
    }
    nx->fwd_len = e->fwd_len;
    rc = forward_rows(nx, sq, nseq, tokens, n, logits, all_logits, err);
    if (sq != stack_seqs) free(sq);
    return rc;
}

/* One chunk of n <= max_batch rows through the model on the lead engine e's
 * activations: the rows of seqs[0..nseq) (each on its own engine's causal state,
 * at its own position; together n rows, in row order). logits: all rows
 * (all_logits) or the last. */
static int forward_rows(ms_engine *e, const ms_fwd_seq *seqs, int nseq, const int32_t *tokens, int n, float *logits,
                        int all_logits, ms_err *err) {
    const ms_model *m = e->w;
    const ms_config *c = &m->cfg;
    ms_backend *be = e->be;
    int64_t D = c->hidden;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab)
            return ms_fail(err, MS_ERR_ARG, "token id %d is out of range [0, %lld)", tokens[t], (long long)c->vocab);
    double t_stage = e->staged ? now_s() : 0;
    ms_stage_activate(e, e->stage);
    if (e->stage == 0) { /* a later stage: e->x came from the previous */
        if (e->step_mode) be->ops->embed_at(be, e->x, &m->embed, e->step); /* the replayable step: the id in e->step */
        else be->ops->embed(be, e->x, &m->embed, tokens, n);
        if (c->embed_scale != 0 && c->embed_scale != 1) be->ops->scale(be, e->x, (float)c->embed_scale, (int64_t)n * D);
    }
    int rc = MS_OK;
    e->chunk_tokens = tokens;
    e->seqs = seqs;
    e->n_seqs = nseq;
    float eps = (float)c->rms_eps;
    const float *in = e->x; /* a sublayer's input before its norm: the residual, or the streams' collapse (mHC) */
    if (e->mhc && e->stage == 0) ms_mhc_engine_begin(e, n); /* a later stage: the streams came along */
    /* Attention Residuals (attn_res_block > 0; never with mHC): e->x is the current
     * block's partial sum, e->ares the completed block states; each sublayer reads their mixture. */
    int nb = e->staged && e->stage > 0 ? e->ares_nb : 0; /* a later stage: the blocks handed on */
    const int64_t BS = (int64_t)e->max_batch * D;
    int fuse = fused_add_norm(e), normed = 0; /* normed: e->xn already holds this layer's attention input */
    for (int l = e->l0; l < e->l1 && !rc; l++) {
        const ms_layer *L = &m->layers[l];
        if (e->mhc && (rc = ms_mhc_engine_pre(e, l, 0, n, &in, err))) break;
        const float *h = in;
        if (c->attn_res_block) {
            if (nb > 0) {
                be->ops->attn_res_mix(be, e->xn, e->ares, nb, BS, e->x, n, D, L->attn_res.norm, L->attn_res.proj, eps);
                h = e->xn;
            }
            if (l % c->attn_res_block == 0) { /* a new block starts: the partial sum becomes a block state */
                be->ops->copy(be, e->ares + nb * BS, e->x, (size_t)(n * D) * 4);
                if (h == e->x) h = e->ares + nb * BS;
                nb++;
                be->ops->zero(be, e->x, (size_t)(n * D) * 4);
            }
        }
        if (!normed) sublayer_in(e, e->xn, h, L->attn_norm, L->attn_norm_b, n);
        normed = 0;
        if (c->layer_attn[l] == MS_ATTN_MLA) rc = ms_attn_mla(e, l, n, e->tmp, err);
        else if (c->layer_attn[l] == MS_ATTN_KDA) rc = ms_attn_kda(e, l, n, e->tmp, err);
        else if (c->layer_attn[l] == MS_ATTN_GDN) rc = ms_attn_gdn(e, l, n, e->tmp, err);
        else if (c->layer_attn[l] == MS_ATTN_COMPRESSED) rc = ms_attn_compressed(e, l, n, e->tmp, err);
        else rc = ms_attn_gqa(e, l, n, e->tmp, err);
        if (rc) break;
        sublayer_out(e, e->tmp, L->attn_post_norm, n);
        if (c->parallel_block) { /* Cohere: the FFN reads the attention's normed input (still in e->xn) */
            residual_add(e, n, e->tmp);
        } else if (fuse) {
            be->ops->add_rmsnorm(be, e->x, e->tmp, e->xn, L->ffn_norm, n, D, eps);
            h = e->x;
        } else {
            residual_add(e, n, e->tmp);
            if (e->mhc && (rc = ms_mhc_engine_pre(e, l, 1, n, &in, err))) break;
            h = in;
            if (c->attn_res_block) {
                be->ops->attn_res_mix(be, e->xn, e->ares, nb, BS, e->x, n, D, L->mlp_res.norm, L->mlp_res.proj, eps);
                h = e->xn;
            }
            sublayer_in(e, e->xn, h, L->ffn_norm, L->ffn_norm_b, n);
        }
        e->ffn_in = h;
        if (c->layer_shortcut[l] == 1) { /* the MoE beside the dense MLP: held for the next layer */
            if (!(rc = ms_ffn_moe(e, l, n, e->sc, err))) rc = ms_ffn_dense(e, &L->gate, &L->up, &L->down, n, e->xn, e->tmp, 0);
        } else if (c->layer_mlp[l] == MS_MLP_MOE) {
            rc = ms_ffn_moe(e, l, n, e->tmp, err);
            if (!rc && c->moe_out_scale != 0 && c->moe_out_scale != 1) /* Cohere's "average" of routed and shared */
                be->ops->scale(be, e->tmp, (float)c->moe_out_scale, (int64_t)n * D);
        } else {
            rc = ms_ffn_dense(e, &L->gate, &L->up, &L->down, n, e->xn, e->tmp, 0);
        }
        if (rc) break;
        if (c->layer_shortcut[l] == 2) be->ops->add(be, e->tmp, e->sc, (int64_t)n * D);
        sublayer_out(e, e->tmp, L->ffn_post_norm, n);
        if (fuse && l + 1 < e->l1) { /* with the next layer's attention norm (on this stage) */
            be->ops->add_rmsnorm(be, e->x, e->tmp, e->xn, m->layers[l + 1].attn_norm, n, D, eps);
            normed = 1;
        } else {
            residual_add(e, n, e->tmp);
        }
    }
    e->seqs = NULL;
    e->n_seqs = 0;
    if (rc) return rc;
    int last = !e->staged || e->stage + 1 == e->stages->n;
    if (e->mhc && last && (rc = ms_mhc_engine_end(e, n, err))) return rc;
    for (int i = 0; i < nseq; i++) {
        seqs[i].e->n_past += seqs[i].n;
        seqs[i].e->stats.tokens += (uint64_t)seqs[i].n;
    }
    if (e->staged && e->stage + 1 < e->stages->n) { /* this stage's work done (synced: timed), then the next */
        if ((rc = be->ops->sync(be, err))) return rc;
        e->stats.stage_s += now_s() - t_stage;
        return forward_next_stage(e, seqs, nseq, tokens, n, nb, logits, all_logits, err);
    }
    if (e->staged) { /* the last stage: its time includes the head and the logits' download */
        rc = forward_head(e, nb, BS, n, logits, all_logits, err);
        if (!rc) rc = be->ops->sync(be, err);
        e->stats.stage_s += now_s() - t_stage;
        return rc;
    }
    return forward_head(e, nb, BS, n, logits, all_logits, err);
}

/* The final norm and the head of forward_rows' chunk (rows of e->x) into logits (NULL: none). */
static int forward_head(ms_engine *e, int nb, int64_t BS, int n, float *logits, int all_logits, ms_err *err) {
    const ms_model *m = e->w;
    const ms_config *c = &m->cfg;
    ms_backend *be = e->be;
    int64_t D = c->hidden;
    float eps = (float)c->rms_eps;
    int rc = MS_OK;
    if (!logits) return MS_OK;
    int t0 = all_logits ? 0 : n - 1, nt = n - t0;
    const float *h = e->x + (int64_t)t0 * D;
    if (c->attn_res_block) {
        be->ops->attn_res_mix(be, e->xn, e->ares + (int64_t)t0 * D, nb, BS, h, nt, D, m->out_res.norm, m->out_res.proj,
                              eps);
        h = e->xn;
    }
    if (c->layernorm) be->ops->layernorm(be, e->xn, h, m->final_norm, m->final_norm_b, nt, D, eps);
    else be->ops->rmsnorm(be, e->xn, h, m->final_norm, nt, D, eps);
    if (c->logit_scale != 0 && c->logit_scale != 1) be->ops->scale(be, e->xn, (float)c->logit_scale, (int64_t)nt * D);
    /* the head writes the caller's buffer directly when it is backend memory, else a device row block */
    if (be->host_memory) {
        be->ops->matmul(be, logits, e->xn, nt, &m->lm_head, 0);
        if (m->lm_head_b) be->ops->add_bias(be, logits, m->lm_head_b, nt, c->vocab);
        return MS_OK;
    }
    if (e->step_mode || (e->keep_logits && nt == 1)) { /* the head into e->logits, downloaded (or picked from) later */
        be->ops->matmul(be, e->logits, e->xn, 1, &m->lm_head, 0);
        if (m->lm_head_b) be->ops->add_bias(be, e->logits, m->lm_head_b, 1, c->vocab);
        return MS_OK;
    }
    int64_t V = c->vocab;
    for (int t = 0; t < nt; t += e->logit_rows) {
        int k = nt - t < e->logit_rows ? nt - t : e->logit_rows;
        be->ops->matmul(be, e->logits, e->xn + (int64_t)t * D, k, &m->lm_head, 0);
        if (m->lm_head_b) be->ops->add_bias(be, e->logits, m->lm_head_b, k, c->vocab);
        if ((rc = be->ops->download(be, logits + (int64_t)t * V, e->logits, (size_t)k * (size_t)V * 4, err))) return rc;
    }
    return MS_OK;
}

/* A chunk of one sequence: e is its own lead. */
static int forward_chunk(ms_engine *e, const int32_t *tokens, int n, float *logits, int all_logits, ms_err *err) {
    ms_fwd_seq one = {e, 0, n};
    return forward_rows(e, &one, 1, tokens, n, logits, all_logits, err);
}
int ms_engine_forward_chunk(ms_engine *e, const int32_t *tokens, int n, float *logits, int all_logits, ms_err *err) {
    return forward_chunk(e, tokens, n, logits, all_logits, err);
}

/* What every forward of n tokens onto e checks and prepares before its chunks: the
 * context, image placeholders, the forward's length, and DSA's tie replays. */
static int forward_begin(ms_engine *e, const int32_t *tokens, int n, ms_err *err) {
    if (n <= 0) return ms_fail(err, MS_ERR_ARG, "forward needs at least one token");
    if ((int64_t)e->n_past + n > e->max_ctx)
        return ms_fail(err, MS_ERR_LIMIT, "context full: %d + %d tokens exceed the allocated %d", e->n_past, n, e->max_ctx);
    if (e->m->cfg.media_token >= 0)
        for (int i = 0; i < n; i++)
            if (tokens[i] == e->m->cfg.media_token)
                return ms_fail(err, MS_ERR_UNSUPPORTED,
                               "token %d at %d is the image placeholder: images are not supported (the vision tower "
                               "is not loaded)",
                               tokens[i], i);
    e->fwd_len = (int64_t)e->n_past + n;
    if (e->dsa) { /* DSA: redo the positions whose tied top-k choice this longer forward changes */
        int64_t from = -1, end = e->n_past;
        int n_st = ms_engine_n_stages(e);
        for (int s = 0; s < n_st; s++) { /* a split engine: the earliest position any stage's layers re-choose */
            ms_engine *se = e->stage_e ? e->stage_e[s] : e;
            int64_t f = -1;
            ms_stage_activate(se, s);
            int rc = ms_dsa_engine_replay_from(se, e->fwd_len, &f, err);
            if (rc) return rc;
            if (f >= 0 && (from < 0 || f < from)) from = f;
        }
        int rc = MS_OK;
        if (from >= 0) {
            for (int s = 0; s < n_st; s++) {
                ms_engine *se = e->stage_e ? e->stage_e[s] : e;
                ms_dsa_engine_rollback(se, from);
                if (from == 0) kda_states_reset(se);
                se->n_past = (int)from;
            }
            for (int64_t s = from; s < end; s += e->max_batch) {
                int k = end - s < e->max_batch ? (int)(end - s) : e->max_batch;
                if ((rc = forward_chunk(e, ms_dsa_engine_tokens(e) + s, k, NULL, 0, err))) return rc;
            }
        }
        ms_dsa_engine_note_tokens(e, tokens, n);
    }
    return MS_OK;
}

int ms_engine_forward(ms_engine *e, const int32_t *tokens, int n, float *logits, int all_logits, ms_err *err) {
    int rc = forward_begin(e, tokens, n, err);
    if (rc) return rc;
    if (n == 1 && logits) { /* decode: the replayable step where the backend and the model have it */
        rc = ms_engine_step(e, tokens[0], logits, err);
        if (rc != MS_ERR_UNSUPPORTED) return rc;
    }
    int64_t V = e->m->cfg.vocab;
    for (int s = 0; s < n; s += e->max_batch) {
        int k = n - s < e->max_batch ? n - s : e->max_batch;
        int last = s + k == n;
        float *lg = NULL;
        if (logits && all_logits) lg = logits + (int64_t)s * V;
        else if (logits && last) lg = logits;
        if ((rc = forward_chunk(e, tokens + s, k, lg, all_logits, err))) return rc;
    }
    return MS_OK;
}

int ms_engine_decode_greedy(ms_engine *e, int32_t token, int32_t *next, ms_err *err) {
    ms_backend *be = e->be;
    int64_t V = e->m->cfg.vocab;
    if (be->host_memory) { /* the logits are host memory: forward into the engine's row, pick here */
        if (!e->host_logits && !(e->host_logits = malloc((size_t)V * sizeof *e->host_logits)))
            return ms_fail(err, MS_ERR_NOMEM, "decode_greedy: out of memory for %lld logits", (long long)V);
        int rc = ms_engine_forward(e, &token, 1, e->host_logits, 0, err);
        if (rc) return rc;
        int32_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (e->host_logits[v] > e->host_logits[best]) best = (int32_t)v;
        *next = best;
        return MS_OK;
    }
    if (!be->ops->argmax || !e->logits)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "decode_greedy: the %s backend picks no token on the device", be->name);
    if (e->staged) /* the head runs on the last stage and its logits come to the host */
        return ms_fail(err, MS_ERR_UNSUPPORTED, "decode_greedy: a model split over devices picks on the host");
    if (!e->pick && be->ops->alloc(be, sizeof(int32_t), (void **)&e->pick, err)) {
        e->pick = NULL;
        return err->code;
    }
    int rc = forward_begin(e, &token, 1, err);
    if (rc) return rc;
    rc = ms_engine_step(e, token, NULL, err); /* NULL: the logits stay in e->logits */
    if (rc == MS_ERR_UNSUPPORTED) {
        float dummy = 0;
        e->keep_logits = 1;
        rc = forward_chunk(e, &token, 1, &dummy, 0, err);
        e->keep_logits = 0;
    }
    if (rc) return rc;
    /* where the device step holds this token's position, the pick also writes the next token's step */
    int64_t *st = be->ops->argmax_step && e->step && e->step_dev_pos == e->n_past - 1 ? e->step : NULL;
    if (st) be->ops->argmax_step(be, e->logits, V, e->pick, st);
    else be->ops->argmax(be, e->logits, V, e->pick);
    if (st) e->step_dev_pos = -1; /* until the pick is known */
    rc = be->ops->download(be, next, e->pick, sizeof(int32_t), err);
    if (st && !rc) e->step_dev_pos = e->n_past, e->step_dev_tok = *next;
    return rc;
}

int ms_engine_greedy_logits(ms_engine *e, float *logits, ms_err *err) {
    size_t bytes = (size_t)e->m->cfg.vocab * sizeof *logits;
    if (e->be->host_memory) {
        if (!e->host_logits) return ms_fail(err, MS_ERR_ARG, "greedy_logits: no greedy step was decoded");
        memcpy(logits, e->host_logits, bytes);
        return MS_OK;
    }
    if (!e->logits || e->staged) return ms_fail(err, MS_ERR_ARG, "greedy_logits: no greedy step was decoded");
    return e->be->ops->download(e->be, logits, e->logits, bytes, err);
}

int ms_engine_decode_batch(ms_engine *const *es, int k, const int32_t *tokens, float *logits, ms_err *err) {
    if (k < 1 || !es || !tokens) return ms_fail(err, MS_ERR_ARG, "decode batch: needs at least one engine and token");
    ms_engine *lead = es[0];
    if (k > lead->max_batch)
        return ms_fail(err, MS_ERR_LIMIT, "decode batch: %d sequences exceed the lead engine's batch of %d", k,
                       lead->max_batch);
    for (int i = 0; i < k; i++) {
        /* one model; one backend, or host-memory backends (each CPU engine owns one by default) */
        if (!es[i] || es[i]->m != lead->m || es[i]->w != lead->w ||
            (es[i]->be != lead->be && !(es[i]->be->host_memory && lead->be->host_memory)))
            return ms_fail(err, MS_ERR_ARG, "decode batch: engine %d does not share the lead's model and backend", i);
        for (int j = 0; j < i; j++)
            if (es[j] == es[i]) return ms_fail(err, MS_ERR_ARG, "decode batch: engine %d appears twice (also %d)", i, j);
    }
    for (int i = 0; i < k; i++)
        if (tokens[i] < 0 || tokens[i] >= lead->m->cfg.vocab)
            return ms_fail(err, MS_ERR_ARG, "decode batch: token id %d of sequence %d is out of range [0, %lld)",
                           tokens[i], i, (long long)lead->m->cfg.vocab);
    if (k == 1) return ms_engine_forward(lead, tokens, 1, logits, 0, err);
    ms_fwd_seq stack_seqs[16], *seqs = k <= 16 ? stack_seqs : malloc((size_t)k * sizeof *seqs);
    if (!seqs) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    int rc = MS_OK;
    for (int i = 0; i < k && !rc; i++) {
        rc = forward_begin(es[i], tokens + i, 1, err);
        if (rc) ms_wrap(err, "decode batch: sequence %d", i);
        seqs[i] = (ms_fwd_seq){es[i], i, 1};
    }
    if (!rc) rc = forward_rows(lead, seqs, k, tokens, k, logits, 1, err);
    if (seqs != stack_seqs) free(seqs);
    return rc;
}

/* One part, if there is room. */
static int add_part(ms_state_part *parts, int n, int cap, ms_state_part p) {
    if (parts && n < cap) parts[n] = p;
    return n + 1;
}

int ms_engine_state_parts(const ms_engine *e, ms_state_part *parts, int cap) {
    const ms_config *c = &e->m->cfg;
    int n = 0, n_st = e->stage_e ? e->stages->n : 1;
    for (int s = 0; s < n_st; s++) { /* split over stages: each stage's layers' state is in its engine */
        const ms_engine *se = e->stage_e ? e->stage_e[s] : e;
        ms_engine view = *se; /* the table writes a few sizes into its engine: a copy; the per-layer arrays are se's */
        ms_buf_spec *specs;
        int ns = engine_table(&view, c, (size_t)se->max_ctx, (size_t)se->max_batch, 1, &specs);
        if (ns < 0) return MS_ERR_NOMEM;
        for (int i = 0; i < ns; i++) { /* every per-position cache of the buffer table (the modules list their own parts) */
            if (!specs[i].tag) continue;
            ms_state_part p = {.kind = MS_PART_ROWS, .data = *specs[i].ptr, .row_bytes = specs[i].row, .per = 1,
                               .cap_rows = se->max_ctx, .be = se->be};
            snprintf(p.name, sizeof p.name, "L%d.%s", specs[i].layer, specs[i].tag);
            n = add_part(parts, n, cap, p);
        }
        free(specs);
        for (int l = se->l0; se->kda && l < se->l1; l++) { /* KDA / gated DeltaNet: conv tails + recurrent state */
            if (!se->kda[l].S) continue;
            const char *why = c->layer_attn[l] == MS_ATTN_GDN ? "a gated DeltaNet layer's recurrent state"
                                                               : "a KDA layer's recurrent state";
            ms_state_part p = {.kind = MS_PART_FIXED, .data = se->kda[l].conv,
                               .row_bytes = (uint64_t)se->kda[l].conv_len * 4, .no_truncate = why, .be = se->be};
            snprintf(p.name, sizeof p.name, "L%d.conv", l);
            n = add_part(parts, n, cap, p);
            p.data = se->kda[l].S, p.row_bytes = (uint64_t)se->kda[l].S_len * 4;
            snprintf(p.name, sizeof p.name, "L%d.recurrent", l);
            n = add_part(parts, n, cap, p);
        }
    }
    for (int s = 0; s < n_st; s++) n = ms_dsa_engine_parts(e->stage_e ? e->stage_e[s] : e, parts, n, cap);
    for (int s = 0; s < n_st; s++) n = ms_cattn_engine_parts(e->stage_e ? e->stage_e[s] : e, parts, n, cap);
    return n;
}
