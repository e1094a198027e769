/* be_cpu_dsa.c — the CPU backend's DSA indexer ops (core/backend.h dsa_index,
 * dsa_recheck) over ops/dsa.c: key and query preparation, the index-key cache
 * append, scoring and torch.topk's tie choices. */
#include "backend/cpu/be_cpu.h"

int ms_cpu_dsa_index(ms_backend *be, const ms_dsa_index_args *a, ms_err *err) {
    const ms_dsa_cfg *cfg = a->cfg;
    ms_dsa_cache *cache = a->cache;
    int rc = ms_dsa_cfg_check(cfg, err);
    if (rc) return rc;
    if (cache->len != a->pos0)
        return ms_fail(err, MS_ERR_ARG, "index-key cache holds %lld keys, the chunk starts at %lld",
                       (long long)cache->len, (long long)a->pos0);
    if (a->pos0 + a->n > cache->cap)
        return ms_fail(err, MS_ERR_LIMIT, "index-key cache has room for %lld keys, not %lld", (long long)cache->cap,
                       (long long)(a->pos0 + a->n));
    const int H = cfg->n_heads, D = cfg->head_dim;
    /* keys, then queries, row by row with the angles of their position (every step is per row) */
    for (int t = 0; t < a->n; t++) {
        float cs[512], sn[512];
        const float *c = NULL, *s = NULL;
        if (cfg->rope_dims > 0) {
            ms_rope_cos_sin(a->rope, a->pos0 + t, cs, sn);
            c = cs, s = sn;
        }
        if ((rc = ms_dsa_prepare_keys(cfg, a->k + (size_t)t * D, 1, a->k_norm_w, a->k_norm_b, c, s, err)) ||
            (rc = ms_dsa_prepare_queries(cfg, a->q + (size_t)t * H * D, 1, c, s, err)))
            return rc;
    }
    if ((rc = ms_dsa_cache_append(cache, a->k, cfg->kpool > 1 ? a->g : NULL, a->n, err))) return rc;
    return ms_dsa_select(cpu_of(be)->pool, cfg, cache, a->q, a->w, a->n, a->pos0, a->fwd_len, a->idx, a->count,
                         a->ambiguous, err);
}

int ms_cpu_dsa_recheck(ms_backend *be, const ms_dsa_cfg *cfg, const ms_dsa_cache *cache, const float *q,
                       const float *w, int64_t pos, int64_t fwd_len, int32_t *idx, int32_t *count, ms_err *err) {
    return ms_dsa_select(NULL, cfg, cache, q, w, 1, pos, fwd_len, idx, count, NULL, err);
}
