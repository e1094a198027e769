/* model.c — load a checkpoint directory into a bound ms_model. */
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

#include "util/fs.h"

static int alloc_layers(ms_model *m, ms_err *err) {
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    return m->layers ? MS_OK : ms_fail(err, MS_ERR_NOMEM, "out of memory");
}

/* Weight bytes by tier: every bound tensor counts; routed experts are the
 * expert tier, everything else (whatever blocks the architecture has) static. */
static void account(ms_model *m, uint64_t bound_bytes) {
    const ms_config *c = &m->cfg;
    m->expert_bytes = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const ms_layer *L = &m->layers[l];
        if (L->experts)
            for (int e = 0; e < c->n_experts; e++)
                m->expert_bytes += ms_qmat_bytes(&L->experts[e].gate) + ms_qmat_bytes(&L->experts[e].up) +
                                   ms_qmat_bytes(&L->experts[e].down);
    }
    m->static_bytes = bound_bytes > m->expert_bytes ? bound_bytes - m->expert_bytes : 0;
}

/* m->cfg and m->ck set: bind the architecture's weights and count the tiers */
static int bind_model(ms_model *m, ms_err *err) {
    int rc;
    if ((rc = alloc_layers(m, err))) goto fail;
    m->tensor_bound = calloc((size_t)m->ck.n_tensors + 1, 1);
    if (!m->tensor_bound) {
        rc = ms_fail(err, MS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    ms_binder b = {.ck = &m->ck, .cfg = &m->cfg, .err = err, .bound = m->tensor_bound};
    rc = m->cfg.arch->bind(&b, m);
    m->allocs = b.allocs; /* the model owns every vector the binder copied */
    m->alloc_bytes = b.alloc_bytes;
    m->n_allocs = b.n_allocs;
    if (rc) goto fail;
    account(m, b.bound_bytes);
    return MS_OK;
fail:
    ms_model_free(m);
    return rc;
}

int ms_model_load(const char *dir, ms_model *m, ms_err *err) {
    memset(m, 0, sizeof *m);
    int rc = ms_config_load(dir, &m->cfg, err);
    if (rc) return rc;
    if ((rc = ms_checkpoint_open(dir, &m->ck, err))) return rc;
    return bind_model(m, err);
}

/* The tensors a checkpoint of c would hold, from the architecture's specs: matrices BF16
 * except the routed experts in the config's expert format (compressed-tensors MXFP4:
 * weight_packed + weight_scale; compressed-tensors INT4 pack-quantized: the experts and
 * matrices its config groups quantize (ms_config_ct_quantized) as weight_packed I32 +
 * weight_scale BF16 + weight_shape (+ weight_zero_point I32 when asymmetric); fp8: F8_E4M3 with F32 weight_scale_inv blocks) and, for
 * fp8, the other matrices too (as DeepSeek's FP8 checkpoints hold them); vectors BF16. */
static int spec_tensors(const ms_config *c, ms_tensor **out, int *n_out, ms_err *err) {
    ms_tensor_spec *sp;
    int ns, rc;
    if ((rc = ms_model_specs(c, &sp, &ns, err))) return rc;
    ms_tensor *ts = calloc((size_t)ns * 4 + 1, sizeof *ts);
    if (!ts) {
        free(sp);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    }
    int n = 0;
    for (int i = 0; i < ns && !rc; i++) {
        const ms_tensor_spec *s = &sp[i];
        ms_dtype dt = MS_DT_BF16;
        size_t sl = strlen(s->name);
        char mod[160];
        snprintf(mod, sizeof mod, "%.*s", (int)(sl > 7 ? sl - 7 : 0), s->name);
        if (s->ndim == 2 && s->kind == MS_W_EXPERT && c->mxfp4_packed) dt = MS_DT_F4;
        else if (s->ndim == 2 && (s->kind == MS_W_EXPERT || s->kind == MS_W_MATRIX) && c->int4_packed &&
                 s->shape[1] % 8 == 0 && ms_config_ct_quantized(c, mod))
            dt = MS_DT_I4;
        else if (s->ndim == 2 && (s->kind == MS_W_EXPERT || s->kind == MS_W_MATRIX) && c->fp8) dt = MS_DT_F8_E4M3;
        size_t nl = strlen(s->name);
        int is_w = nl > 7 && !strcmp(s->name + nl - 7, ".weight");
        if (!is_w && dt != MS_DT_BF16) dt = MS_DT_BF16;
        uint64_t nel = 1;
        for (int d = 0; d < s->ndim; d++) nel *= (uint64_t)s->shape[d];
        ms_tensor *t = &ts[n++];
        t->ndim = s->ndim;
        memcpy(t->shape, s->shape, sizeof t->shape);
        char name[260];
        if (dt == MS_DT_F4) {
            snprintf(name, sizeof name, "%s_packed", s->name);
            t->dtype = MS_DT_U8;
            t->shape[1] = s->shape[1] / 2;
            t->nelem = t->nbytes = (uint64_t)t->shape[0] * (uint64_t)t->shape[1];
            t->name = strdup(name);
            ms_tensor *sc = &ts[n++];
            snprintf(name, sizeof name, "%s_scale", s->name);
            sc->dtype = MS_DT_U8;
            sc->ndim = 2;
            sc->shape[0] = s->shape[0];
            sc->shape[1] = s->shape[1] / 32;
            sc->nelem = sc->nbytes = (uint64_t)sc->shape[0] * (uint64_t)sc->shape[1];
            sc->name = strdup(name);
        } else if (dt == MS_DT_I4) { /* weight_packed I32 [rows, cols/8], weight_scale BF16, weight_shape I32 [2] */
            int64_t gs = c->int4_group;
            snprintf(name, sizeof name, "%s_packed", s->name);
            t->dtype = MS_DT_I32;
            t->shape[1] = s->shape[1] / 8;
            t->nelem = (uint64_t)t->shape[0] * (uint64_t)t->shape[1];
            t->nbytes = t->nelem * 4;
            t->name = strdup(name);
            ms_tensor *sc = &ts[n++];
            snprintf(name, sizeof name, "%s_scale", s->name);
            sc->dtype = MS_DT_BF16;
            sc->ndim = 2;
            sc->shape[0] = s->shape[0];
            sc->shape[1] = (s->shape[1] + gs - 1) / gs;
            sc->nelem = (uint64_t)sc->shape[0] * (uint64_t)sc->shape[1];
            sc->nbytes = sc->nelem * 2;
            sc->name = strdup(name);
            ms_tensor *ws = &ts[n++];
            snprintf(name, sizeof name, "%s_shape", s->name);
            ws->dtype = MS_DT_I32;
            ws->ndim = 1;
            ws->shape[0] = 2;
            ws->nelem = 2;
            ws->nbytes = 8;
            ws->name = strdup(name);
            if (c->int4_asym) { /* weight_zero_point I32 [ceil(rows/8), ceil(cols/group)] */
                ms_tensor *zp = &ts[n++];
                snprintf(name, sizeof name, "%s_zero_point", s->name);
                zp->dtype = MS_DT_I32;
                zp->ndim = 2;
                zp->shape[0] = (s->shape[0] + 7) / 8;
                zp->shape[1] = sc->shape[1];
                zp->nelem = (uint64_t)zp->shape[0] * (uint64_t)zp->shape[1];
                zp->nbytes = zp->nelem * 4;
                zp->name = strdup(name);
            }
        } else {
            t->dtype = dt;
            t->nelem = nel;
            t->nbytes = nel * (uint64_t)ms_dtype_bits(dt) / 8;
            t->name = strdup(s->name);
            if (dt == MS_DT_F8_E4M3) {
                ms_tensor *sc = &ts[n++];
                snprintf(name, sizeof name, "%s_scale_inv", s->name);
                sc->dtype = MS_DT_F32;
                sc->ndim = 2;
                sc->shape[0] = (s->shape[0] + c->fp8_block[0] - 1) / c->fp8_block[0];
                sc->shape[1] = (s->shape[1] + c->fp8_block[1] - 1) / c->fp8_block[1];
                sc->nelem = (uint64_t)sc->shape[0] * (uint64_t)sc->shape[1];
                sc->nbytes = sc->nelem * 4;
                sc->name = strdup(name);
            }
        }
    }
    free(sp);
    for (int i = 0; i < n; i++)
        if (!ts[i].name) {
            ms_st_free_tensors(ts, n);
            return ms_fail(err, MS_ERR_NOMEM, "out of memory");
        }
    *out = ts;
    *n_out = n;
    return MS_OK;
}

int ms_model_load_meta(const char *dir, ms_model *m, ms_model_source *source, ms_err *err) {
    memset(m, 0, sizeof *m);
    int rc = ms_config_load(dir, &m->cfg, err);
    if (rc) return rc;
    char idx[4096], single[4096];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    ms_err herr = {0};
    if ((ms_file_exists(idx) || ms_file_exists(single)) && ms_checkpoint_open_headers(dir, &m->ck, &herr) == MS_OK) {
        *source = MS_SOURCE_HEADERS;
    } else {
        ms_tensor *ts = NULL;
        int n = 0;
        if ((rc = spec_tensors(&m->cfg, &ts, &n, err))) return rc;
        if ((rc = ms_checkpoint_from_tensors(&m->ck, dir, "config.json", ts, n, err))) return rc;
        *source = MS_SOURCE_CONFIG;
    }
    return bind_model(m, err);
}

void ms_model_free(ms_model *m) {
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            ms_layer *L = &m->layers[l];
            free(L->experts);
            free(L->owned);
            free(L->expert_tensors);
        }
        free(m->layers);
    }
    for (int i = 0; i < m->n_allocs; i++) free(m->allocs[i]);
    for (int i = 0; i < m->n_quant_allocs; i++) free(m->quant_allocs[i]);
    free(m->quant_allocs);
    if (m->static_store_map) munmap(m->static_store_map, m->static_store_len);
    free(m->allocs);
    free(m->alloc_bytes);
    free(m->tensor_bound);
    ms_checkpoint_close(&m->ck);
    memset(m, 0, sizeof *m);
}

int ms_model_specs(const ms_config *c, ms_tensor_spec **specs, int *n, ms_err *err) {
    ms_model m;
    memset(&m, 0, sizeof m);
    m.cfg = *c;
    if (alloc_layers(&m, err)) return MS_ERR_NOMEM;
    ms_binder b = {.ck = NULL, .cfg = &m.cfg, .err = err};
    int rc = c->arch->bind(&b, &m);
    free(m.layers);
    if (rc) {
        free(b.specs);
        return rc;
    }
    *specs = b.specs;
    *n = b.n_specs;
    return MS_OK;
}

uint64_t ms_model_active_bytes(const ms_model *m) {
    const ms_config *c = &m->cfg;
    uint64_t b = m->static_bytes - ms_qmat_bytes(&m->embed);
    if (m->lm_head.data == m->embed.data) b += ms_qmat_bytes(&m->embed);
    b += (uint64_t)c->hidden * (uint64_t)ms_dtype_bits(m->embed.dtype) / 8; /* one embedding row */
    for (int l = 0; l < c->n_layers; l++) {
        const ms_layer *L = &m->layers[l];
        if (!L->experts) continue;
        const ms_expert_view *v = &L->experts[0];
        b += (uint64_t)c->top_k * (ms_qmat_bytes(&v->gate) + ms_qmat_bytes(&v->up) + ms_qmat_bytes(&v->down));
    }
    return b;
}
