#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "util/fs.h"
#include "util/json.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

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

/* compressed-tensors: re.match of a "re:" pattern (anchored at the start, as Python's
 * re.match), else the exact name. PCRE2 is the closest to Python's re syntax. */
static int ct_match(const char *pat, const char *name) {
    if (strncmp(pat, "re:", 3)) return !strcmp(pat, name);
    int e;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(pat + 3), PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &e, &eo, NULL);
    if (!re) return 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int ok = md && pcre2_match(re, (PCRE2_SPTR)name, strlen(name), 0, 0, md, NULL) >= 0;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return ok;
}

int ms_config_ct_quantized(const ms_config *c, const char *name) {
    int hit = 0;
    for (int i = 0; i < c->n_ct_targets && !hit; i++)
        hit = !strcmp(c->ct_targets[i], "Linear") || ct_match(c->ct_targets[i], name);
    for (int i = 0; i < c->n_ct_ignore && hit; i++) hit = !ct_match(c->ct_ignore[i], name);
    return hit;
}

/* A targets / ignore list (strings) appended to out[*n]; patterns must compile. */
static int ct_patterns(const cJSON *list, char (*out)[MS_CT_PATTERN_LEN], int *n, const char *key, const char *where,
                       ms_err *err) {
    const cJSON *it;
    if (!list) return MS_OK;
    if (!cJSON_IsArray(list)) return ms_fail(err, MS_ERR_FORMAT, "%s: quantization_config %s must be a list", where, key);
    cJSON_ArrayForEach(it, list) {
        if (!cJSON_IsString(it))
            return ms_fail(err, MS_ERR_FORMAT, "%s: quantization_config %s: entries must be strings", where, key);
        const char *p = it->valuestring;
        if (strlen(p) >= MS_CT_PATTERN_LEN || *n >= MS_CT_MAX_PATTERNS)
            return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: quantization_config %s: more than %d entries or \"%.40s...\" too long",
                           where, key, MS_CT_MAX_PATTERNS, p);
        if (!strncmp(p, "re:", 3)) {
            int e;
            PCRE2_SIZE eo;
            pcre2_code *re = pcre2_compile((PCRE2_SPTR)(p + 3), PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &e, &eo, NULL);
            if (!re) return ms_fail(err, MS_ERR_FORMAT, "%s: quantization_config %s: bad regex \"%s\"", where, key, p);
            pcre2_code_free(re);
        }
        int dup = 0;
        for (int i = 0; i < *n; i++) dup |= !strcmp(out[i], p);
        if (!dup) snprintf(out[(*n)++], MS_CT_PATTERN_LEN, "%s", p);
    }
    return MS_OK;
}

/* compressed-tensors: two pack formats, one per checkpoint.
 *  - mxfp4-pack-quantized (Kimi K3): 4-bit float weights, E8M0 scales per group of 32.
 *  - pack-quantized (Kimi K2-Thinking / K2.5): int4 packed 8 per int32 (weight_packed),
 *    per-group scales (weight_scale), weight_shape; bound as I4 (qmat.h). Asymmetric
 *    groups (symmetric: false) also store weight_zero_point (int4_asym; every group of
 *    a checkpoint the same). Activation ordering (actorder, weight_g_idx), other bit
 *    widths and quantized activations are refused, naming the key.
 * The config groups' targets and ignore lists say which modules are quantized
 * (ms_config_ct_quantized); binding reads the tensors the checkpoint holds. */
static int parse_compressed_tensors(const cJSON *q, ms_config *c, const char *where, ms_err *err) {
    const char *fmt = NULL;
    int rc = ms_json_opt_string(q, "format", &fmt, where, err);
    if (rc) return rc;
    if (fmt && strcmp(fmt, "mxfp4-pack-quantized") && strcmp(fmt, "pack-quantized"))
        return ms_fail(err, MS_ERR_UNSUPPORTED,
                       "%s: compressed-tensors format \"%.64s\" is not supported (mxfp4-pack-quantized, pack-quantized)",
                       where, fmt);
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups"), *g;
    if (groups && !cJSON_IsObject(groups))
        return ms_fail(err, MS_ERR_FORMAT, "%s: quantization_config.config_groups must be an object", where);
    const char *seen = fmt;
    int64_t group_size = 0;
    int asym = 0, n_int4_groups = 0; /* INT4: weights.symmetric false (weight_zero_point tensors) */
    cJSON_ArrayForEach(g, groups) {
        const char *gf = fmt;
        if (!cJSON_IsObject(g)) return ms_fail(err, MS_ERR_FORMAT, "%s: config group \"%s\" is not an object", where, g->string);
        if ((rc = ms_json_opt_string(g, "format", &gf, where, err))) return rc;
        if (!gf || (strcmp(gf, "mxfp4-pack-quantized") && strcmp(gf, "pack-quantized")))
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: config group \"%s\": format \"%.64s\" is not supported (mxfp4-pack-quantized, "
                           "pack-quantized)",
                           where, g->string, gf ? gf : "(none)");
        if (seen && strcmp(seen, gf))
            return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: config group \"%s\": format \"%s\" mixed with \"%s\"", where,
                           g->string, gf, seen);
        seen = gf;
        int mx = !strcmp(gf, "mxfp4-pack-quantized");
        const cJSON *ia = cJSON_GetObjectItemCaseSensitive(g, "input_activations");
        if (!mx && ia && !cJSON_IsNull(ia))
            return ms_fail(err, MS_ERR_UNSUPPORTED,
                           "%s: config group \"%s\": quantized input_activations are not supported (weight-only INT4)",
                           where, g->string);
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "weights");
        if (!mx && !cJSON_IsObject(w))
            return ms_fail(err, MS_ERR_FORMAT, "%s: config group \"%s\": pack-quantized needs \"weights\"", where,
                           g->string);
        if (cJSON_IsObject(w)) {
            int64_t bits = 4, gs = 32;
            int sym = 1;
            const char *type = mx ? "float" : "int", *strategy = "group";
            if ((rc = ms_json_opt_int(w, "num_bits", 1, 64, &bits, where, err)) ||
                (rc = ms_json_opt_int(w, "group_size", 1, 1 << 20, &gs, where, err)) ||
                (rc = ms_json_opt_string(w, "type", &type, where, err)) ||
                (rc = ms_json_opt_string(w, "strategy", &strategy, where, err)) ||
                (rc = ms_json_opt_bool(w, "symmetric", &sym, where, err)))
                return rc;
            if (mx && (bits != 4 || gs != 32 || strcmp(type, "float")))
                return ms_fail(err, MS_ERR_UNSUPPORTED,
                               "%s: config group \"%s\": %lld-bit %s weights in groups of %lld are not MXFP4 (4-bit float, "
                               "groups of 32)",
                               where, g->string, (long long)bits, type, (long long)gs);
            if (!mx) {
                const cJSON *ao = cJSON_GetObjectItemCaseSensitive(w, "actorder");
                if (bits != 4 || strcmp(type, "int"))
                    return ms_fail(err, MS_ERR_UNSUPPORTED,
                                   "%s: config group \"%s\": pack-quantized %lld-bit %s weights are not supported (num_bits 4, "
                                   "type int)",
                                   where, g->string, (long long)bits, type);
                if (strcmp(strategy, "group") || gs % 8)
                    return ms_fail(err, MS_ERR_UNSUPPORTED,
                                   "%s: config group \"%s\": INT4 strategy \"%s\" with group_size %lld is not supported "
                                   "(strategy group, group_size a multiple of 8)",
                                   where, g->string, strategy, (long long)gs);
                if (n_int4_groups && (!sym) != asym)
                    return ms_fail(err, MS_ERR_UNSUPPORTED,
                                   "%s: config group \"%s\": weights.symmetric %s mixed with %s in another group", where,
                                   g->string, sym ? "true" : "false", sym ? "false" : "true");
                asym = !sym;
                n_int4_groups++;
                if (ao && !cJSON_IsNull(ao))
                    return ms_fail(err, MS_ERR_UNSUPPORTED,
                                   "%s: config group \"%s\": weights.actorder (weight_g_idx) is not supported", where,
                                   g->string);
                if (group_size && gs != group_size)
                    return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: config groups with group sizes %lld and %lld", where,
                                   (long long)group_size, (long long)gs);
                group_size = gs;
            }
        }
        if ((rc = ct_patterns(cJSON_GetObjectItemCaseSensitive(g, "targets"), c->ct_targets, &c->n_ct_targets,
                              "targets", where, err)))
            return rc;
    }
    if (!seen) return ms_fail(err, MS_ERR_FORMAT, "%s: compressed-tensors quantization_config names no format", where);
    if ((rc = ct_patterns(cJSON_GetObjectItemCaseSensitive(q, "ignore"), c->ct_ignore, &c->n_ct_ignore, "ignore", where,
                          err)))
        return rc;
    if (!strcmp(seen, "mxfp4-pack-quantized")) {
        c->mxfp4_packed = 1;
    } else {
        if (!groups)
            return ms_fail(err, MS_ERR_FORMAT, "%s: compressed-tensors pack-quantized needs config_groups", where);
        c->int4_packed = 1;
        c->int4_group = (int)group_size;
        c->int4_asym = asym;
    }
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
        (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "moe_intermediate_size")) && /* a per-layer list: the arch's */
         (rc = ms_json_opt_int(j, "moe_intermediate_size", 1, DIM_MAX, &c->moe_inter, where, err))) ||
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
        const char *needs = arch ? NULL : ms_arch_refusal(mt);
        if (needs) {
            rc = ms_fail(err, MS_ERR_UNSUPPORTED, "%s: model_type \"%.64s\" is not supported: it needs %s", where, mt,
                         needs);
        } else if (!arch) {
            char list[1024];
            ms_arch_list(list, sizeof list);
            rc = ms_fail(err, MS_ERR_UNSUPPORTED, "%s: model_type \"%.64s\" is not supported; supported: %s", where, mt,
                         list);
        }
    }
    /* multimodal checkpoints (GLM-5-Next) keep the text model's config under text_config, omni ones
     * (Qwen3-Omni) under thinker_config.text_config */
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(j, "text_config");
    const cJSON *thinker = cJSON_GetObjectItemCaseSensitive(j, "thinker_config");
    if (!cJSON_IsObject(tc) && cJSON_IsObject(thinker)) tc = cJSON_GetObjectItemCaseSensitive(thinker, "text_config");
    const cJSON *src = cJSON_IsObject(tc) && !cJSON_GetObjectItemCaseSensitive(j, "vocab_size") ? tc : j;
    /* multimodal: a quantization_config at the top level applies to the text model when text_config has none */
    if (!rc && src != j && !cJSON_GetObjectItemCaseSensitive(src, "quantization_config")) {
        cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "quantization_config");
        if (q && !cJSON_AddItemReferenceToObject((cJSON *)src, "quantization_config", q))
            rc = ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", where);
    }
    /* the family's names for common keys (ms_arch aliases), where the common key is absent */
    for (const char *const *a = arch ? ms_arch_key_aliases(arch) : NULL; !rc && a && a[0] && a[1]; a += 2) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(src, a[1]);
        if (v && !cJSON_GetObjectItemCaseSensitive(src, a[0]) &&
            !cJSON_AddItemReferenceToObject((cJSON *)src, a[0], (cJSON *)v))
            rc = ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", where);
    }
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
