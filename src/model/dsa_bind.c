/* dsa_bind.c — DeepSeek Sparse Attention in the model description: the
 * indexer's config fields and per-layer schedule (indexer_types), and the
 * indexer's tensors (names and shapes from transformers 5.17
 * DeepseekV32Indexer / GlmMoeDsaIndexer / Glm5NextTextIndexer). */
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"
#include "ops/dsa.h"

int ms_arch_dsa_configure(const cJSON *j, ms_config *c, int rope_interleaved, int chain_shared, int kpool_default,
                          const char *where, ms_err *err) {
    int rc;
    int64_t freq = 1, offset = 2;
    c->dsa_kpool = kpool_default;
    c->dsa_kpool_tail = 1;
    if ((rc = ms_json_int(j, "index_n_heads", 1, 4096, &c->dsa_heads, where, err)) ||
        (rc = ms_json_int(j, "index_head_dim", 1, 65536, &c->dsa_head_dim, where, err)) ||
        (rc = ms_json_int(j, "index_topk", 1, 1 << 24, &c->dsa_topk, where, err)) ||
        (rc = ms_json_opt_int(j, "index_kpool", 1, 4096, &c->dsa_kpool, where, err)) ||
        (rc = ms_json_opt_bool(j, "index_kpool_always_select_tail", &c->dsa_kpool_tail, where, err)) ||
        (rc = ms_json_opt_int(j, "index_topk_freq", 1, MS_MAX_LAYERS, &freq, where, err)) ||
        (rc = ms_json_opt_int(j, "index_skip_topk_offset", 0, MS_MAX_LAYERS, &offset, where, err)))
        return rc;
    c->dsa_rope_interleaved = rope_interleaved;
    c->dsa_chain_shared = chain_shared;
    if (c->dsa_kpool <= 1) c->dsa_kpool = 0;
    if (c->dsa_kpool > 1 && c->qk_rope_dim != 0)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: the KPool indexer with rotary dims (%lld) is not defined", where,
                       (long long)c->qk_rope_dim);
    if (c->dsa_kpool <= 1 && c->qk_rope_dim > c->dsa_head_dim)
        return ms_fail(err, MS_ERR_FORMAT, "%s: qk_rope_head_dim %lld exceeds index_head_dim %lld", where,
                       (long long)c->qk_rope_dim, (long long)c->dsa_head_dim);
    if (c->q_lora_rank < 1)
        return ms_fail(err, MS_ERR_FORMAT, "%s: the DSA indexer needs q_lora_rank (its queries come from q_a)", where);
    /* indexer_types: "full" / "shared" per layer; else index_topk_pattern ("FSS...");
     * else the freq/offset schedule of transformers' GlmMoeDsaConfig (all full by default) */
    int full[MS_MAX_LAYERS];
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, "indexer_types");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "index_topk_pattern");
    if (it && !cJSON_IsNull(it)) {
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != c->n_layers)
            return ms_fail(err, MS_ERR_FORMAT, "%s: indexer_types must list num_hidden_layers (%lld) entries", where,
                           (long long)c->n_layers);
        int i = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, it) {
            if (cJSON_IsString(v) && !strcmp(v->valuestring, "full")) full[i] = 1;
            else if (cJSON_IsString(v) && !strcmp(v->valuestring, "shared")) full[i] = 0;
            else return ms_fail(err, MS_ERR_FORMAT, "%s: indexer_types[%d] must be \"full\" or \"shared\"", where, i);
            i++;
        }
    } else if (cJSON_IsString(pat)) {
        if ((int64_t)strlen(pat->valuestring) != c->n_layers)
            return ms_fail(err, MS_ERR_FORMAT, "%s: index_topk_pattern must have num_hidden_layers letters", where);
        for (int i = 0; i < c->n_layers; i++) {
            char ch = pat->valuestring[i];
            if (ch != 'F' && ch != 'S')
                return ms_fail(err, MS_ERR_FORMAT, "%s: index_topk_pattern letter %d must be F or S", where, i);
            full[i] = ch == 'F';
        }
    } else {
        for (int i = 0; i < c->n_layers; i++) {
            int64_t d = i - offset + 1;
            full[i] = (d > 0 ? d : 0) % freq == 0;
        }
    }
    int kinds[MS_MAX_LAYERS], src[MS_MAX_LAYERS];
    for (int l = 0; l < c->n_layers; l++) kinds[l] = c->layer_attn[l] == MS_ATTN_MLA ? (full[l] ? 1 : 2) : 0;
    if ((rc = ms_dsa_share_plan(kinds, (int)c->n_layers, chain_shared, src, err))) return ms_wrap(err, "%s", where);
    for (int l = 0; l < c->n_layers; l++) c->layer_dsa[l] = (uint8_t)kinds[l];
    ms_dsa_cfg dc;
    ms_dsa_cfg_of(c, &dc);
    if ((rc = ms_dsa_cfg_check(&dc, err))) return ms_wrap(err, "%s", where);
    return MS_OK;
}

void ms_dsa_cfg_of(const ms_config *c, ms_dsa_cfg *out) {
    memset(out, 0, sizeof *out);
    out->n_heads = (int)c->dsa_heads;
    out->head_dim = (int)c->dsa_head_dim;
    out->kpool = (int)c->dsa_kpool;
    out->kpool_tail = c->dsa_kpool_tail;
    out->rope_dims = c->dsa_kpool > 1 ? 0 : (int)c->qk_rope_dim;
    out->rope_layout = c->dsa_rope_interleaved ? MS_DSA_ROPE_INTERLEAVED : MS_DSA_ROPE_HALF;
    out->topk = (int)c->dsa_topk;
    out->ln_eps = 1e-6f; /* nn.LayerNorm(index_head_dim, eps=1e-6) in every reference */
}

int ms_bind_dsa(ms_binder *b, ms_model *m, int layer, const char *pfx) {
    const ms_config *c = b->cfg;
    ms_dsa_weights *w = &m->layers[layer].dsa;
    const int64_t H = c->dsa_heads, D = c->dsa_head_dim, X = c->hidden;
    ms_bind_mat(b, &w->wq_b, MS_W_MATRIX, H * D, c->q_lora_rank, "%swq_b", pfx);
    ms_bind_mat(b, &w->wk, MS_W_MATRIX, D, X, "%swk", pfx);
    ms_bind_vec(b, &w->k_norm_w, MS_W_NORM, D, 0, "%sk_norm.weight", pfx);
    ms_bind_vec(b, &w->k_norm_b, MS_W_VECTOR, D, 0, "%sk_norm.bias", pfx);
    ms_bind_mat(b, &w->weights_proj, MS_W_ROUTER, H, X, "%sweights_proj", pfx);
    if (c->dsa_kpool > 1) {
        const int64_t gs[2] = {D, X}, as[2] = {c->dsa_kpool, D};
        ms_bind_tensor(b, &w->kpool_gate, MS_W_MATRIX, 2, gs, D, X, 0, "%sindex_kpool_compress_gate", pfx);
        ms_bind_tensor(b, &w->kpool_ape, MS_W_VECTOR, 2, as, c->dsa_kpool, D, 0, "%sindex_kpool_compress_ape", pfx);
    }
    return b->rc;
}
