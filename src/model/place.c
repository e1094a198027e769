/* place.c — a model's weights placed on a backend (ms_model_place): a shallow
 * copy of the model whose matrices and F32 vectors are the backend's placed
 * views. The CPU backend places a view as itself; a device backend copies the
 * bytes into its memory in their stored dtype. */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* The binder's F32 vector copies by address: a vector's length, and its placed
 * copy once made (a vector used twice is placed once). */
typedef struct {
    const void *host;
    size_t bytes;
    const float *placed;
} vec_entry;

typedef struct {
    ms_backend *be;  /* NULL: count the bytes into *count instead (ms_model_place_bytes) */
    vec_entry *vecs;
    int n_vecs;
    ms_err *err;
    int rc;
    uint64_t *count;
} placer;

static int vec_cmp(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const vec_entry *)a)->host, y = (uintptr_t)((const vec_entry *)b)->host;
    return x < y ? -1 : x > y;
}

static void place_qmat(placer *p, ms_qmat *w, const char *what, int layer) {
    if (p->rc || !w->data) return;
    if (!p->be) {
        *p->count += ms_qmat_bytes(w);
        return;
    }
    ms_qmat out;
    if ((p->rc = p->be->ops->place_qmat(p->be, w, &out, p->err))) {
        if (layer >= 0) ms_wrap(p->err, "placing layer %d %s", layer, what);
        else ms_wrap(p->err, "placing %s", what);
        return;
    }
    *w = out;
}

/* An F32 vector: its length is the binder's allocation size. */
static void place_vec(placer *p, float **v, const char *what, int layer) {
    if (p->rc || !*v) return;
    vec_entry key = {.host = *v}, *e = bsearch(&key, p->vecs, (size_t)p->n_vecs, sizeof key, vec_cmp);
    if (!e) {
        p->rc = ms_fail(p->err, MS_ERR_UNSUPPORTED,
                        "placing %s (layer %d): the vector is not one of the model's bound copies (its length is unknown)",
                        what, layer);
        return;
    }
    if (!p->be) { /* counting: each vector once */
        if (!e->placed) *p->count += e->bytes, e->placed = (const float *)e->host;
        return;
    }
    if (!e->placed && (p->rc = p->be->ops->place_vec(p->be, (const float *)e->host, (int64_t)(e->bytes / 4),
                                                     &e->placed, p->err))) {
        ms_wrap(p->err, "placing %s (layer %d)", what, layer);
        return;
    }
    *v = (float *)e->placed;
}

/* A stored vector of n elements in dtype dt (expert biases): placed as a [1, n] matrix. */
static void place_raw(placer *p, const void **v, ms_dtype dt, int64_t n, const char *what, int layer) {
    if (p->rc || !*v) return;
    ms_qmat w = {.dtype = dt, .rows = 1, .cols = n, .data = *v};
    place_qmat(p, &w, what, layer);
    if (!p->rc && p->be) *v = w.data;
}

static void place_expert(placer *p, ms_expert_view *x, int layer) {
    int64_t gate_rows = x->gate.rows, up_rows = x->up.rows, down_rows = x->down.rows;
    place_qmat(p, &x->gate, "expert gate", layer);
    place_qmat(p, &x->up, "expert up", layer);
    place_qmat(p, &x->down, "expert down", layer);
    place_raw(p, &x->gate_bias, x->bias_dtype, gate_rows, "expert gate bias", layer);
    place_raw(p, &x->up_bias, x->bias_dtype, up_rows, "expert up bias", layer);
    place_raw(p, &x->down_bias, x->bias_dtype, down_rows, "expert down bias", layer);
}

static void place_layer_static(placer *p, ms_layer *L, int l) {
#define Q(f) place_qmat(p, &L->f, #f, l)
#define V(f) place_vec(p, &L->f, #f, l)
    Q(wq), Q(wk), Q(wv), Q(wo), Q(q_a), Q(q_b), Q(kv_a), Q(kv_b), Q(mla_gate);
    Q(gate), Q(up), Q(down), Q(router), Q(shared_gate), Q(lat_down), Q(lat_up);
    V(attn_norm), V(ffn_norm), V(attn_post_norm), V(ffn_post_norm), V(attn_norm_b), V(ffn_norm_b), V(bq), V(bk), V(bv), V(q_norm), V(k_norm), V(bo), V(sinks);
    V(q_a_norm), V(kv_a_norm), V(attn_res.norm), V(attn_res.proj), V(mlp_res.norm), V(mlp_res.proj);
    V(router_bias), V(router_lbias), V(lat_norm);
    /* KDA and gated DeltaNet: matrices, convolution weights and parameter vectors are qmats */
    Q(kda.q_proj), Q(kda.k_proj), Q(kda.v_proj), Q(kda.q_conv), Q(kda.k_conv), Q(kda.v_conv), Q(kda.f_a), Q(kda.f_b);
    Q(kda.A_log), Q(kda.dt_bias), Q(kda.b_proj), Q(kda.g_a), Q(kda.g_b), Q(kda.g_proj), Q(kda.o_norm), Q(kda.o_proj);
    Q(gdn.in_qkvz), Q(gdn.in_ba), Q(gdn.in_qkv), Q(gdn.in_z), Q(gdn.in_b), Q(gdn.in_a);
    Q(gdn.conv), Q(gdn.A_log), Q(gdn.dt_bias), Q(gdn.norm), Q(gdn.out_proj);
    /* the DSA indexer (kpool_ape stays a host view: the engine reads it from the host model) */
    Q(dsa.wq_b), Q(dsa.wk), Q(dsa.weights_proj), Q(dsa.kpool_gate), V(dsa.k_norm_w), V(dsa.k_norm_b);
    /* DeepSeek V4 compressed attention, its compressors and CSA indexer */
    Q(ca.wkv), Q(ca.wo_a), Q(ca.wo_b), V(ca.kv_norm);
    Q(ca.comp.wkv), Q(ca.comp.wgate), V(ca.comp.ape), V(ca.comp.norm);
    Q(ca.icomp.wkv), Q(ca.icomp.wgate), V(ca.icomp.ape), V(ca.icomp.norm), Q(ca.iwq_b), Q(ca.iweights);
    /* mHC */
    Q(hc_attn_fn), Q(hc_ffn_fn), V(hc_attn_base), V(hc_attn_scale), V(hc_ffn_base), V(hc_ffn_scale);
#undef Q
#undef V
}

/* The layer's routed experts: those with bit `dev` in mask[i] (mask NULL: all) placed, the
 * others' views zeroed (a part of a multi-device placement holds only its share). */
static void place_layer_experts(placer *p, const ms_config *c, ms_layer *L, int l, const uint32_t *mask, int dev) {
    /* hash_ids, owned and expert_tensors stay host memory (the engine reads them). */
    if (!L->experts || p->rc) {
        L->experts = NULL;
        return;
    }
    ms_expert_view *x = malloc((size_t)c->n_experts * sizeof *x);
    if (!x) {
        p->rc = ms_fail(p->err, MS_ERR_NOMEM, "out of memory placing the experts of layer %d", l);
        L->experts = NULL;
        return;
    }
    memcpy(x, L->experts, (size_t)c->n_experts * sizeof *x);
    L->experts = x;
    for (int64_t i = 0; i < c->n_experts && !p->rc; i++) {
        if (mask && !(mask[i] & (1u << dev))) memset(&x[i], 0, sizeof x[i]);
        else place_expert(p, &x[i], l);
    }
}

int ms_model_place(const ms_model *m, ms_backend *be, int skip_experts, ms_model **placed, ms_err *err) {
    ms_place_part all = {.layer_begin = 0, .layer_end = m->cfg.n_layers, .embed = 1, .head = 1,
                         .skip_experts = skip_experts};
    return ms_model_place_part(m, be, &all, placed, err);
}

/* The sorted table of the model's bound F32 vectors (place_vec finds lengths there). */
static int vec_table(const ms_model *m, placer *p) {
    p->n_vecs = m->n_allocs;
    p->vecs = calloc((size_t)m->n_allocs + 1, sizeof *p->vecs);
    if (!p->vecs) return -1;
    for (int i = 0; i < m->n_allocs; i++) p->vecs[i] = (vec_entry){m->allocs[i], m->alloc_bytes ? m->alloc_bytes[i] : 0, NULL};
    if (p->n_vecs > 1) qsort(p->vecs, (size_t)p->n_vecs, sizeof *p->vecs, vec_cmp);
    return 0;
}

static int head_tied(const ms_model *m) {
    return m->lm_head.data == m->embed.data && m->lm_head.rows == m->embed.rows && m->lm_head.cols == m->embed.cols;
}

/* The head side: the final norm, lm_head, the output AttnRes vectors, the hyper head. */
static void place_head(placer *p, ms_model *w, int tied_to_placed) {
    if (tied_to_placed) w->lm_head = w->embed;
    else place_qmat(p, &w->lm_head, "lm_head", -1);
    place_vec(p, &w->final_norm, "the final norm", -1);
    place_vec(p, &w->final_norm_b, "the final norm bias", -1);
    place_vec(p, &w->lm_head_b, "the lm_head bias", -1);
    place_vec(p, &w->out_res.norm, "the output AttnRes norm", -1);
    place_vec(p, &w->out_res.proj, "the output AttnRes projection", -1);
    place_qmat(p, &w->hc_head_fn, "the hyper head fn", -1);
    place_vec(p, &w->hc_head_base, "the hyper head base", -1);
    place_vec(p, &w->hc_head_scale, "the hyper head scale", -1);
}

int ms_model_place_part(const ms_model *m, ms_backend *be, const ms_place_part *part, ms_model **placed,
                        ms_err *err) {
    *placed = NULL;
    ms_model *w = malloc(sizeof *w);
    if (!w) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    *w = *m;
    w->allocs = NULL, w->alloc_bytes = NULL, w->n_allocs = 0, w->tensor_bound = NULL;
    w->quant_allocs = NULL, w->n_quant_allocs = 0;
    w->static_store_map = NULL, w->static_store_len = 0;
    w->layers = calloc((size_t)(m->cfg.n_layers > 0 ? m->cfg.n_layers : 1), sizeof *w->layers);
    placer p = {.be = be, .err = err};
    if (!w->layers || vec_table(m, &p)) {
        free(w->layers), free(w), free(p.vecs);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    }
    int l = 0, E = (int)m->cfg.n_experts;
    for (; l < m->cfg.n_layers && !p.rc; l++) {
        w->layers[l] = m->layers[l];
        int mine = l >= part->layer_begin && l < part->layer_end;
        if (mine) place_layer_static(&p, &w->layers[l], l);
        /* experts: the mask's share of every layer, else those of the part's own layers */
        if (part->skip_experts || (!part->expert_devs && !mine)) w->layers[l].experts = NULL;
        else place_layer_experts(&p, &m->cfg, &w->layers[l], l,
                                 part->expert_devs ? part->expert_devs + (int64_t)l * E : NULL, part->dev);
    }
    int tied = head_tied(m);
    if (part->embed) place_qmat(&p, &w->embed, "the embedding", -1);
    if (part->head && !p.rc) place_head(&p, w, tied && part->embed);
    free(p.vecs);
    if (p.rc) {
        for (int i = l; i < m->cfg.n_layers; i++) w->layers[i].experts = NULL; /* never copied */
        ms_model_placed_free(w);
        return p.rc;
    }
    *placed = w;
    return MS_OK;
}

void ms_model_place_bytes(const ms_model *m, uint64_t *layer_static, uint64_t *expert_bytes, uint64_t *embed_bytes,
                          uint64_t *head_bytes, int *tied) {
    placer p = {.be = NULL};
    uint64_t count = 0;
    p.count = &count;
    *embed_bytes = *head_bytes = 0;
    *tied = head_tied(m);
    if (vec_table(m, &p)) p.n_vecs = 0; /* no table: vectors are not counted */
    for (int l = 0; l < m->cfg.n_layers; l++) {
        ms_layer L = m->layers[l];
        count = 0;
        place_layer_static(&p, &L, l);
        layer_static[l] = count;
        count = 0;
        if (L.experts && m->cfg.n_experts > 0) place_expert(&p, &L.experts[0], l);
        expert_bytes[l] = count;
    }
    ms_model w = *m;
    count = 0;
    place_qmat(&p, &w.embed, "the embedding", -1);
    *embed_bytes = count;
    count = 0;
    place_head(&p, &w, 0);
    *head_bytes = count;
    free(p.vecs);
}

void ms_model_placed_free(ms_model *w) {
    if (!w) return;
    for (int l = 0; w->layers && l < w->cfg.n_layers; l++) free(w->layers[l].experts);
    free(w->layers);
    free(w);
}
