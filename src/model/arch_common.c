#include "model/arch_common.h"

#include <math.h>
#include <string.h>

int ms_arch_rotary_dim(const cJSON *j, const ms_config *c, int64_t *out, const char *where, ms_err *err) {
    int64_t rd = 0;
    double prf = 1.0;
    int rc = ms_json_opt_int(j, "rotary_dim", 1, 65536, &rd, where, err);
    if (!rc) rc = ms_json_opt_double(j, "partial_rotary_factor", &prf, where, err);
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (!rc && cJSON_IsObject(rp)) rc = ms_json_opt_double(rp, "partial_rotary_factor", &prf, where, err);
    if (rc) return rc;
    if (!(prf > 0 && prf <= 1)) return ms_fail(err, MS_ERR_FORMAT, "%s: partial_rotary_factor must be in (0, 1]", where);
    *out = rd ? rd : (int64_t)(c->head_dim * prf);
    if (*out > c->head_dim) return ms_fail(err, MS_ERR_FORMAT, "%s: rotary dims exceed head_dim", where);
    return MS_OK;
}

int ms_arch_check_moe(const ms_config *c, const char *where, ms_err *err) {
    if (c->n_experts < 1 || c->n_experts > 65536) return ms_fail(err, MS_ERR_FORMAT, "%s: number of experts must be in [1, 65536]", where);
    if (c->top_k < 1 || c->top_k > c->n_experts)
        return ms_fail(err, MS_ERR_FORMAT, "%s: num_experts_per_tok %lld must be in [1, %lld]", where, (long long)c->top_k,
                       (long long)c->n_experts);
    if (c->moe_inter < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: missing expert width (moe_intermediate_size)", where);
    if (c->n_experts % c->n_group)
        return ms_fail(err, MS_ERR_FORMAT, "%s: n_routed_experts %lld is not divisible by n_group %lld", where,
                       (long long)c->n_experts, (long long)c->n_group);
    if (c->topk_group > c->n_group) return ms_fail(err, MS_ERR_FORMAT, "%s: topk_group exceeds n_group", where);
    if (c->n_group > 1 && c->n_experts / c->n_group < 2)
        return ms_fail(err, MS_ERR_FORMAT, "%s: group-limited routing needs at least 2 experts per group", where);
    if (c->top_k > c->topk_group * (c->n_experts / c->n_group))
        return ms_fail(err, MS_ERR_FORMAT, "%s: top-k %lld exceeds the experts of the selected groups", where,
                       (long long)c->top_k);
    return MS_OK;
}

int ms_arch_check_gqa(const ms_config *c, const char *where, ms_err *err) {
    if (c->n_heads < 1 || c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads)
        return ms_fail(err, MS_ERR_FORMAT, "%s: num_attention_heads %lld must be a multiple of num_key_value_heads %lld",
                       where, (long long)c->n_heads, (long long)c->n_kv_heads);
    if (c->head_dim < 2) return ms_fail(err, MS_ERR_FORMAT, "%s: head_dim must be at least 2", where);
    return MS_OK;
}

int ms_arch_gqa_rope(const cJSON *j, ms_config *c, ms_rope_layout layout, const char *where, ms_err *err) {
    int64_t rd;
    int rc;
    if ((rc = ms_arch_rotary_dim(j, c, &rd, where, err)) || (rc = ms_config_rope(j, c, rd, layout, where, err)))
        return rc;
    c->attn_scale = 1.0 / sqrt((double)c->head_dim);
    return MS_OK;
}

int ms_arch_mlp_layer_types(const cJSON *j, ms_config *c, int64_t first_dense, const char *where, ms_err *err) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "mlp_layer_types");
    if (arr && !cJSON_IsNull(arr) && (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != c->n_layers))
        return ms_fail(err, MS_ERR_FORMAT, "%s: mlp_layer_types must be a list of num_hidden_layers (%lld) names", where,
                       (long long)c->n_layers);
    const cJSON *v = cJSON_IsArray(arr) ? arr->child : NULL;
    for (int l = 0; l < c->n_layers; l++, v = v ? v->next : NULL) {
        int dense = l < first_dense;
        if (v) {
            if (cJSON_IsString(v) && !strcmp(v->valuestring, "dense")) dense = 1;
            else if (cJSON_IsString(v) && !strcmp(v->valuestring, "sparse")) dense = 0;
            else return ms_fail(err, MS_ERR_FORMAT, "%s: mlp_layer_types[%d] must be \"dense\" or \"sparse\"", where, l);
        }
        c->layer_mlp[l] = dense ? MS_MLP_DENSE : MS_MLP_MOE;
        if (dense && c->inter < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: dense layers need intermediate_size", where);
    }
    return MS_OK;
}
