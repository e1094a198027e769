#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "util/fs.h"
#include "util/json.h"

#define DIM_MAX (INT64_C(1) << 24)

int ms_config_rope(const cJSON *j, ms_config *c, int64_t rotary_dim, ms_rope_layout layout, const char *where,
                   ms_err *err) {
    double theta = 10000.0;
    int rc = ms_json_opt_double(j, "rope_theta", &theta, where, err);
    if (rc) return rc;
    /* transformers 5 writes rope_parameters; older checkpoints rope_scaling */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (!cJSON_IsObject(rp)) rp = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    return ms_rope_parse(cJSON_IsObject(rp) ? rp : NULL, theta, c->max_pos, rotary_dim, layout, &c->rope, where, err);
}

/* compressed-tensors: only the MXFP4 pack format (4-bit float weights, E8M0
 * scales per group of 32 along a row) is supported; every config group must
 * say so. Which tensors are packed is read from the checkpoint itself. */
static int parse_compressed_tensors(const cJSON *q, ms_config *c, const char *where, ms_err *err) {
    const char *fmt = NULL;
    int rc = ms_json_opt_string(q, "format", &fmt, where, err);
    if (rc) return rc;
    if (fmt && strcmp(fmt, "mxfp4-pack-quantized"))
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: compressed-tensors format \"%.64s\" is not supported (mxfp4-pack-quantized)", where, fmt);
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups"), *g;
    if (groups && !cJSON_IsObject(groups))
        return ms_fail(err, MS_ERR_FORMAT, "%s: quantization_config.config_groups must be an object", where);
    cJSON_ArrayForEach(g, groups) {
        const char *gf = fmt;
        if (!cJSON_IsObject(g)) return ms_fail(err, MS_ERR_FORMAT, "%s: config group \"%s\" is not an object", where, g->string);
        if ((rc = ms_json_opt_string(g, "format", &gf, where, err))) return rc;
        if (!gf || strcmp(gf, "mxfp4-pack-quantized"))
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: config group \"%s\": format \"%.64s\" is not supported (mxfp4-pack-quantized)", where,
                           g->string, gf ? gf : "(none)");
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
        if (cJSON_IsObject(w)) {
            int64_t bits = 4, gs = 32;
            const char *type = "float";
            if ((rc = ms_json_opt_int(w, "num_bits", 1, 64, &bits, where, err)) ||
                (rc = ms_json_opt_int(w, "group_size", 1, 1 << 20, &gs, where, err)) ||
                (rc = ms_json_opt_string(w, "type", &type, where, err)))
                return rc;
            if (bits != 4 || gs != 32 || strcmp(type, "float"))
                return ms_fail(err, MS_ERR_UNSUPPORTED,
                               "%s: config group \"%s\": %lld-bit %s weights in groups of %lld are not MXFP4 (4-bit float, "
                               "groups of 32)",
                               where, g->string, (long long)bits, type, (long long)gs);
        }
    }
    if (!fmt && !groups)
        return ms_fail(err, MS_ERR_FORMAT, "%s: compressed-tensors quantization_config names no format", where);
    c->mxfp4_packed = 1;
    return MS_OK;
}

static int parse_common(const cJSON *j, ms_config *c, const char *where, ms_err *err) {
    int rc;
    c->n_kv_heads = -1;
    c->head_dim = -1;
    c->rms_eps = 1e-6;
    c->max_pos = 4096;
    c->bos_id = c->eos_id = -1;
    int tie = 0;
    if ((rc = ms_json_int(j, "vocab_size", 1, INT64_C(1) << 31, &c->vocab, where, err)) ||
        (rc = ms_json_int(j, "hidden_size", 1, DIM_MAX, &c->hidden, where, err)) ||
        (rc = ms_json_int(j, "num_hidden_layers", 1, MS_MAX_LAYERS, &c->n_layers, where, err)) ||
        (rc = ms_json_opt_int(j, "num_attention_heads", 1, 65536, &c->n_heads, where, err)) ||
        (rc = ms_json_opt_int(j, "num_key_value_heads", 1, 65536, &c->n_kv_heads, where, err)) ||
        (rc = ms_json_opt_int(j, "head_dim", 0, 65536, &c->head_dim, where, err)) ||
        (rc = ms_json_opt_int(j, "max_position_embeddings", 1, INT64_C(1) << 40, &c->max_pos, where, err)) ||
        (rc = ms_json_opt_double(j, "rms_norm_eps", &c->rms_eps, where, err)) ||
        (rc = ms_json_opt_bool(j, "tie_word_embeddings", &tie, where, err)) ||
        (rc = ms_json_opt_int(j, "intermediate_size", 1, DIM_MAX, &c->inter, where, err)) ||
        (rc = ms_json_opt_int(j, "moe_intermediate_size", 1, DIM_MAX, &c->moe_inter, where, err)) ||
        (rc = ms_json_opt_int(j, "num_experts_per_tok", 1, 4096, &c->top_k, where, err)) ||
        (rc = ms_json_opt_int(j, "n_group", 1, 4096, &c->n_group, where, err)) ||
        (rc = ms_json_opt_int(j, "topk_group", 1, 4096, &c->topk_group, where, err)) ||
        (rc = ms_json_opt_bool(j, "norm_topk_prob", &c->norm_topk_prob, where, err)) ||
        (rc = ms_json_opt_double(j, "routed_scaling_factor", &c->routed_scale, where, err)) ||
        (rc = ms_json_opt_bool(j, "attention_bias", &c->attn_bias, where, err)))
        return rc;
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(j, "bos_token_id");
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
    if (ms_json_is_int(bos, 0, c->vocab - 1)) c->bos_id = (int64_t)bos->valuedouble;
    if (ms_json_is_int(eos, 0, c->vocab - 1)) c->eos_id = (int64_t)eos->valuedouble;
    if (cJSON_IsArray(eos) && ms_json_is_int(eos->child, 0, c->vocab - 1)) c->eos_id = (int64_t)eos->child->valuedouble;
    c->tie_embeddings = tie;
    if (c->n_kv_heads < 0) c->n_kv_heads = c->n_heads;
    if (c->head_dim <= 0 && c->n_heads > 0) c->head_dim = c->hidden / c->n_heads; /* 0: unset (GLM-5-Next) */
    if (c->routed_scale == 0) c->routed_scale = 1.0;
    if (c->n_group == 0) c->n_group = 1;
    if (c->topk_group == 0) c->topk_group = c->n_group;
    if (!(c->rms_eps > 0 && c->rms_eps < 1)) return ms_fail(err, MS_ERR_FORMAT, "%s: rms_norm_eps out of range", where);
    /* quantization */
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "quantization_config");
    if (cJSON_IsObject(q)) {
        const char *method = "";
        if ((rc = ms_json_opt_string(q, "quant_method", &method, where, err))) return rc;
        if (!strcmp(method, "fp8")) {
            const char *fmt = "e4m3";
            if ((rc = ms_json_opt_string(q, "fmt", &fmt, where, err))) return rc;
            if (strcmp(fmt, "e4m3"))
                return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: fp8 format \"%s\" is not supported (e4m3)", where, fmt);
            const cJSON *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
            if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !ms_json_is_int(bs->child, 1, 1 << 20) ||
                !ms_json_is_int(bs->child->next, 1, 1 << 20))
                return ms_fail(err, MS_ERR_UNSUPPORTED,
                               "%s: fp8 quantization needs weight_block_size [rows, cols] (per-tensor fp8 is not supported)",
                               where);
            c->fp8 = 1;
            c->fp8_block[0] = (int)bs->child->valuedouble;
            c->fp8_block[1] = (int)bs->child->next->valuedouble;
        } else if (!strcmp(method, "mxfp4") || !strcmp(method, "compressed-tensors")) {
            /* expert formats the architecture binds itself (gpt-oss _blocks/_scales,
             * compressed-tensors weight_packed/weight_scale) */
            snprintf(c->quant_method, sizeof c->quant_method, "%s", method);
            if (!strcmp(method, "compressed-tensors") && (rc = parse_compressed_tensors(q, c, where, err))) return rc;
        } else {
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: quantization_config.quant_method \"%s\" is not supported (fp8, mxfp4, compressed-tensors)",
                           where, method);
        }
    }
    return MS_OK;
}

int ms_config_parse(const char *json, size_t len, const char *where, ms_config *c, ms_err *err) {
    memset(c, 0, sizeof *c);
    cJSON *j = NULL;
    int rc = ms_json_parse(json, len, where, &j, err);
    if (rc) return rc;
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return ms_fail(err, MS_ERR_FORMAT, "%s: not a JSON object", where);
    }
    const char *mt = NULL;
    rc = ms_json_opt_string(j, "model_type", &mt, where, err);
    if (!rc && !mt) rc = ms_fail(err, MS_ERR_FORMAT, "%s: missing \"model_type\"", where);
    const ms_arch *arch = NULL;
    if (!rc) {
        arch = ms_arch_find(mt);
        if (!arch) {
            char list[512];
            ms_arch_list(list, sizeof list);
            rc = ms_fail(err, MS_ERR_UNSUPPORTED, "%s: model_type \"%.64s\" is not supported; supported: %s", where, mt,
                         list);
        }
    }
    /* multimodal checkpoints (GLM-5-Next) keep the text model's config under text_config */
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(j, "text_config");
    const cJSON *src = cJSON_IsObject(tc) && !cJSON_GetObjectItemCaseSensitive(j, "vocab_size") ? tc : j;
    if (!rc) {
        snprintf(c->model_type, sizeof c->model_type, "%s", mt);
        c->arch = arch;
        c->media_token = -1;
        c->act_alpha = 1.0; /* plain SwiGLU unless the architecture says otherwise */
        rc = parse_common(src, c, where, err);
    }
    if (!rc) rc = arch->configure(src, c, where, err);
    if (!rc && src != j) { /* multimodal: the image placeholder token, rejected by the text-only engine */
        int64_t media = -1;
        rc = ms_json_opt_int(j, "media_placeholder_token_id", 0, INT64_C(1) << 31, &media, where, err);
        if (!rc && media < c->vocab) c->media_token = media;
    }
    if (!rc && c->expert_hidden == 0) c->expert_hidden = c->hidden;
    cJSON_Delete(j);
    return rc;
}

int ms_config_load(const char *dir, ms_config *c, ms_err *err) {
    char path[4096];
    int rc = ms_path_join(path, sizeof path, dir, "config.json", err);
    if (rc) return rc;
    char *text;
    size_t len;
    if ((rc = ms_read_file(path, 16u << 20, &text, &len, err))) return rc;
    rc = ms_config_parse(text, len, path, c, err);
    free(text);
    return rc;
}
