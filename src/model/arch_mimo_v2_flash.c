/* arch_mimo_v2_flash.c — MiMo V2 Flash: hybrid full / sliding-window GQA
 * (layer_types) where sliding layers have twice the KV heads and per-head
 * attention sinks; one partial RoPE per layer type; values scaled by
 * attention_value_scale and of their own width (v_head_dim); dense or MoE
 * feed-forward per mlp_layer_types; DeepSeek-style sigmoid router with group-
 * limited top-k, no shared experts. transformers: models/mimo_v2_flash. */
#include <math.h>
#include <string.h>

#include "model/arch_common.h"
#include "model/model.h"

/* One layer type's RoPE: rope_parameters[type] with its partial_rotary_factor (default 0.334). */
static int type_rope(const cJSON *j, const ms_config *c, const char *type, ms_rope *r, const char *where, ms_err *err) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const cJSON *tp = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, type) : NULL;
    if (!cJSON_IsObject(tp)) return ms_fail(err, MS_ERR_FORMAT, "%s: rope_parameters.%s is missing", where, type);
    double prf = 0.334;
    int rc = ms_json_opt_double(tp, "partial_rotary_factor", &prf, where, err);
    if (rc) return rc;
    if (!(prf > 0 && prf <= 1)) return ms_fail(err, MS_ERR_FORMAT, "%s: partial_rotary_factor out of range", where);
    int64_t dim = (int64_t)(c->head_dim * prf);
    return ms_rope_parse(tp, 10000.0, c->max_pos, dim, MS_ROPE_HALF, r, where, err);
}

static int configure(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int64_t window = 0;
    int rc;
    if ((rc = ms_json_int(j, "n_routed_experts", 1, 65536, &c->n_experts, where, err)) ||
        (rc = ms_json_opt_int(j, "sliding_window", 0, INT64_C(1) << 30, &window, where, err)) ||
        (rc = ms_json_opt_int(j, "v_head_dim", 1, 65536, &c->v_head_dim, where, err)) ||
        (rc = ms_json_opt_double(j, "attention_value_scale", &c->v_scale, where, err)))
        return rc;
    c->router = MS_ROUTER_SIGMOID;
    c->router_bias = 1;
    if ((rc = ms_arch_check_gqa(c, where, err)) || (rc = ms_arch_check_moe(c, where, err))) return rc;
    if ((rc = type_rope(j, c, "full_attention", &c->rope, where, err)) ||
        (rc = type_rope(j, c, "sliding_attention", &c->rope_alt, where, err)))
        return rc;
    c->attn_scale = 1.0 / sqrt((double)c->head_dim);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "mlp_layer_types");
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers || !cJSON_IsArray(mt) ||
        cJSON_GetArraySize(mt) != c->n_layers)
        return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types and mlp_layer_types must list %lld entries", where,
                       (long long)c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        const cJSON *t = cJSON_GetArrayItem(lt, l), *f = cJSON_GetArrayItem(mt, l);
        int swa = cJSON_IsString(t) && !strcmp(t->valuestring, "sliding_attention");
        if (!swa && !(cJSON_IsString(t) && !strcmp(t->valuestring, "full_attention")))
            return ms_fail(err, MS_ERR_FORMAT, "%s: layer_types[%d] must be full_attention or sliding_attention", where, l);
        int sparse = cJSON_IsString(f) && !strcmp(f->valuestring, "sparse");
        if (!sparse && !(cJSON_IsString(f) && !strcmp(f->valuestring, "dense")))
            return ms_fail(err, MS_ERR_FORMAT, "%s: mlp_layer_types[%d] must be dense or sparse", where, l);
        c->layer_attn[l] = MS_ATTN_GQA;
        c->layer_mlp[l] = sparse ? MS_MLP_MOE : MS_MLP_DENSE;
        if (!sparse && c->inter < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: dense layers need intermediate_size", where);
        if (swa) {
            if (window < 1) return ms_fail(err, MS_ERR_FORMAT, "%s: sliding layers need sliding_window", where);
            c->layer_window[l] = (int32_t)window;
            c->layer_kv_heads[l] = (int32_t)(2 * c->n_kv_heads);
            c->layer_sinks[l] = 1;
            c->layer_rope[l] = 1;
            if (c->n_heads % (2 * c->n_kv_heads))
                return ms_fail(err, MS_ERR_FORMAT, "%s: sliding layers need heads divisible by 2 x KV heads", where);
        }
    }
    return MS_OK;
}

/* GQA plus the attention sinks of the layers that have them. */
static int attn(ms_binder *b, ms_model *m, int l, const char *p) {
    const ms_config *c = b->cfg;
    ms_bind_gqa(b, m, l, p);
    if (c->layer_sinks[l])
        ms_bind_vec(b, &m->layers[l].sinks, MS_W_VECTOR, c->n_heads, 0, "%sself_attn.attention_sink_bias", p);
    return b->rc;
}

static int bind(ms_binder *b, ms_model *m) { return ms_bind_decoder(b, m, attn, ms_bind_ffn); }

const ms_arch ms_arch_mimo_v2_flash = {"mimo_v2_flash", configure, bind};
