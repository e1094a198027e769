/* arch_deepseek_v32.c — DeepSeek V3.2 and GLM-MoE-DSA (GLM 5): DeepSeek V3's
 * MLA + MoE (arch_deepseek_v3.c, reused as is) with DeepSeek Sparse Attention:
 * each MLA layer's lightning indexer picks the top-k keys every query may
 * attend to (ops/dsa.h). The two differ only in the indexer: V3.2 rotates its
 * first rope dims half-split (rotate_half) and runs an indexer in every layer;
 * GLM-MoE-DSA rotates them interleaved and may let "shared" layers reuse the
 * selection of the nearest full layer above (indexer_types).
 * transformers: models/deepseek_v32/modeling_deepseek_v32.py,
 * models/glm_moe_dsa/modeling_glm_moe_dsa.py. */
#include <stdio.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

extern const ms_arch ms_arch_deepseek_v3;

/* mlp_layer_types ("dense" / "sparse"), when the config lists it, overrides first_k_dense_replace */
static int mlp_schedule(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "mlp_layer_types");
    if (!a || cJSON_IsNull(a)) return MS_OK;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != c->n_layers)
        return ms_fail(err, MS_ERR_FORMAT, "%s: mlp_layer_types must list num_hidden_layers (%lld) entries", where,
                       (long long)c->n_layers);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        if (cJSON_IsString(v) && !strcmp(v->valuestring, "dense")) c->layer_mlp[i] = MS_MLP_DENSE;
        else if (cJSON_IsString(v) && !strcmp(v->valuestring, "sparse")) c->layer_mlp[i] = MS_MLP_MOE;
        else return ms_fail(err, MS_ERR_FORMAT, "%s: mlp_layer_types[%d] must be \"dense\" or \"sparse\"", where, i);
        if (c->layer_mlp[i] == MS_MLP_DENSE && c->inter < 1)
            return ms_fail(err, MS_ERR_FORMAT, "%s: missing intermediate_size", where);
        i++;
    }
    return MS_OK;
}

static int configure_v32(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int rc = ms_arch_deepseek_v3.configure(j, c, where, err);
    if (!rc) rc = mlp_schedule(j, c, where, err);
    if (!rc) rc = ms_arch_dsa_configure(j, c, 0, 1, 0, where, err);
    if (rc) return rc;
    for (int l = 0; l < c->n_layers; l++) c->layer_dsa[l] = 1; /* V3.2 has no shared layers */
    return MS_OK;
}

static int configure_glm(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int rc = ms_arch_deepseek_v3.configure(j, c, where, err);
    if (!rc) rc = mlp_schedule(j, c, where, err);
    if (!rc) rc = ms_arch_dsa_configure(j, c, 1, 1, 0, where, err);
    return rc;
}

static int bind(ms_binder *b, ms_model *m) {
    const ms_config *c = b->cfg;
    if (ms_arch_deepseek_v3.bind(b, m)) return b->rc;
    for (int l = 0; l < c->n_layers && !b->rc; l++) {
        if (c->layer_dsa[l] != 1) continue;
        char p[96];
        snprintf(p, sizeof p, "model.layers.%d.self_attn.indexer.", l);
        ms_bind_dsa(b, m, l, p);
    }
    return b->rc;
}

const ms_arch ms_arch_deepseek_v32 = {"deepseek_v32", configure_v32, bind};
const ms_arch ms_arch_glm_moe_dsa = {"glm_moe_dsa", configure_glm, bind};
