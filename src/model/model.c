/* model.c — load a checkpoint directory into a bound ms_model. */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

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

int ms_model_load(const char *dir, ms_model *m, ms_err *err) {
    memset(m, 0, sizeof *m);
    int rc = ms_config_load(dir, &m->cfg, err);
    if (rc) return rc;
    if ((rc = ms_checkpoint_open(dir, &m->ck, err))) return rc;
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
