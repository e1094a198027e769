/* tok_hf.c — building a tokenizer from a Hugging Face tokenizer.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "util/fs.h"
#include "util/json.h"

#define W "tokenizer.json"

static int type_is(const cJSON *o, const char *type) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) && strcmp(t->valuestring, type) == 0;
}

static const char *type_of(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : "(no type)";
}

static int parse_normalizer(ms_tokenizer *t, const cJSON *n, int depth, ms_err *err) {
    if (!n || cJSON_IsNull(n)) return MS_OK;
    if (depth > 8) return ms_fail(err, MS_ERR_LIMIT, W ": normalizer Sequence nested too deep");
    if (!cJSON_IsObject(n)) return ms_fail(err, MS_ERR_FORMAT, W ": normalizer must be an object or null");
    if (type_is(n, "NFC")) {
        t->normalizer = MS_NORM_NFC;
        return MS_OK;
    }
    if (type_is(n, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list)) return ms_fail(err, MS_ERR_FORMAT, W ": normalizer Sequence needs a \"normalizers\" array");
        const cJSON *c;
        cJSON_ArrayForEach(c, list) {
            int rc = parse_normalizer(t, c, depth + 1, err);
            if (rc) return rc;
        }
        return MS_OK;
    }
    return ms_fail(err, MS_ERR_UNSUPPORTED, W ": normalizer type \"%.60s\" is not supported (NFC, Sequence)", type_of(n));
}

static int add_step(ms_tokenizer *t, ms_pre_step st, ms_err *err) {
    if (t->n_pre >= 32) return ms_fail(err, MS_ERR_LIMIT, W ": more than 32 pre-tokenizer steps");
    ms_pre_step *p = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof *p);
    if (!p) return ms_fail(err, MS_ERR_NOMEM, W ": out of memory");
    t->pre = p;
    t->pre[t->n_pre++] = st;
    return MS_OK;
}

static const char k_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_pre(ms_tokenizer *t, const cJSON *n, int depth, int *has_bytelevel, ms_err *err) {
    if (!n || cJSON_IsNull(n)) return MS_OK;
    if (depth > 8) return ms_fail(err, MS_ERR_LIMIT, W ": pre_tokenizer Sequence nested too deep");
    if (!cJSON_IsObject(n)) return ms_fail(err, MS_ERR_FORMAT, W ": pre_tokenizer must be an object or null");
    int rc;
    if (type_is(n, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "pretokenizers");
        if (!cJSON_IsArray(list))
            return ms_fail(err, MS_ERR_FORMAT, W ": pre_tokenizer Sequence needs a \"pretokenizers\" array");
        const cJSON *c;
        cJSON_ArrayForEach(c, list) {
            if ((rc = parse_pre(t, c, depth + 1, has_bytelevel, err))) return rc;
        }
        return MS_OK;
    }
    ms_pre_step st = {0};
    if (type_is(n, "Split")) {
        st.kind = MS_PRE_SPLIT;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *use = cJSON_IsString(re) ? re : str;
        if (!cJSON_IsObject(pat) || !cJSON_IsString(use))
            return ms_fail(err, MS_ERR_FORMAT, W ": Split needs \"pattern\": {\"Regex\": ...} or {\"String\": ...}");
        const char *beh = NULL;
        if ((rc = ms_json_opt_string(n, "behavior", &beh, W " Split", err))) return rc;
        static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        st.behavior = -1;
        for (int i = 0; i < 5; i++)
            if (beh && !strcmp(beh, names[i])) st.behavior = i;
        if (st.behavior < 0) return ms_fail(err, MS_ERR_FORMAT, W ": Split behavior \"%.40s\" is not known", beh ? beh : "(missing)");
        if ((rc = ms_json_opt_bool(n, "invert", &st.invert, W " Split", err))) return rc;
        if ((rc = ms_regex_compile(use->valuestring, strlen(use->valuestring), use == str, &st.re, err)))
            return ms_wrap(err, W ": Split pattern");
        if ((rc = add_step(t, st, err))) ms_regex_free(st.re);
        return rc;
    }
    if (type_is(n, "ByteLevel")) {
        st.kind = MS_PRE_BYTELEVEL;
        st.add_prefix_space = 1; /* tokenizers' defaults */
        int use_regex = 1;
        if ((rc = ms_json_opt_bool(n, "add_prefix_space", &st.add_prefix_space, W " ByteLevel", err))) return rc;
        if ((rc = ms_json_opt_bool(n, "use_regex", &use_regex, W " ByteLevel", err))) return rc;
        if (use_regex && (rc = ms_regex_compile(k_gpt2_pattern, strlen(k_gpt2_pattern), 0, &st.re, err))) return rc;
        st.behavior = MS_SPLIT_ISOLATED;
        if ((rc = add_step(t, st, err))) ms_regex_free(st.re);
        *has_bytelevel = 1;
        return rc;
    }
    return ms_fail(err, MS_ERR_UNSUPPORTED, W ": pre_tokenizer type \"%.60s\" is not supported (Split, ByteLevel, Sequence)",
                   type_of(n));
}

static int check_decoder(const cJSON *d, int depth, ms_err *err) {
    if (!d || cJSON_IsNull(d))
        return ms_fail(err, MS_ERR_UNSUPPORTED, W ": no decoder (a byte-level tokenizer needs the ByteLevel decoder)");
    if (depth > 8 || !cJSON_IsObject(d)) return ms_fail(err, MS_ERR_FORMAT, W ": decoder must be an object");
    if (type_is(d, "ByteLevel")) return MS_OK;
    if (type_is(d, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders"), *c;
        if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
            return ms_fail(err, MS_ERR_FORMAT, W ": decoder Sequence needs a \"decoders\" array");
        cJSON_ArrayForEach(c, list) {
            int rc = check_decoder(c, depth + 1, err);
            if (rc) return rc;
        }
        return MS_OK;
    }
    return ms_fail(err, MS_ERR_UNSUPPORTED, W ": decoder type \"%.60s\" is not supported (ByteLevel)", type_of(d));
}

/* Look a vocab string up by its byte-level bytes. */
static int32_t lookup_str(ms_tokenizer *t, const char *s, size_t n, ms_buf *tmp) {
    tmp->n = 0;
    if (ms_bytelevel_decode((const uint8_t *)s, n, tmp)) return -2;
    return ms_bpe_lookup(&t->bpe, tmp->p, tmp->n);
}

static int parse_model(ms_tokenizer *t, const cJSON *m, ms_err *err) {
    int rc;
    if (!cJSON_IsObject(m)) return ms_fail(err, MS_ERR_FORMAT, W ": \"model\" must be an object");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(m, "type");
    if (ty && !type_is(m, "BPE"))
        return ms_fail(err, MS_ERR_UNSUPPORTED, W ": model type \"%.60s\" is not supported (BPE)", type_of(m));
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (drop && !cJSON_IsNull(drop) && !(cJSON_IsNumber(drop) && drop->valuedouble == 0.0))
        return ms_fail(err, MS_ERR_UNSUPPORTED, W ": BPE dropout is not supported");
    const char *pfx = NULL, *sfx = NULL;
    if ((rc = ms_json_opt_string(m, "continuing_subword_prefix", &pfx, W " model", err))) return rc;
    if ((rc = ms_json_opt_string(m, "end_of_word_suffix", &sfx, W " model", err))) return rc;
    if ((pfx && *pfx) || (sfx && *sfx))
        return ms_fail(err, MS_ERR_UNSUPPORTED, W ": BPE continuing_subword_prefix/end_of_word_suffix are not supported");
    int byte_fallback = 0;
    if ((rc = ms_json_opt_bool(m, "byte_fallback", &byte_fallback, W " model", err))) return rc;
    if ((rc = ms_json_opt_bool(m, "ignore_merges", &t->bpe.ignore_merges, W " model", err))) return rc;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    if (!cJSON_IsObject(vocab)) return ms_fail(err, MS_ERR_FORMAT, W ": model.vocab must be an object");
    int64_t max_id = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!ms_json_is_int(e, 0, (1 << 24) - 1))
            return ms_fail(err, MS_ERR_FORMAT, W ": vocab entry \"%.60s\" must be an id in [0, 2^24)", e->string);
        if ((int64_t)e->valuedouble > max_id) max_id = (int64_t)e->valuedouble;
    }
    int ignore = t->bpe.ignore_merges;
    if ((rc = ms_bpe_init(&t->bpe, (uint32_t)(max_id + 1), err))) return rc;
    t->bpe.ignore_merges = ignore;
    ms_buf tmp = {0};
    cJSON_ArrayForEach(e, vocab) {
        tmp.n = 0;
        if (ms_bytelevel_decode((const uint8_t *)e->string, strlen(e->string), &tmp)) {
            ms_buf_free(&tmp);
            return ms_fail(err, MS_ERR_NOMEM, W ": out of memory");
        }
        if ((rc = ms_bpe_set_token(&t->bpe, (uint32_t)e->valuedouble, tmp.p, tmp.n, err))) {
            ms_buf_free(&tmp);
            return ms_wrap(err, W ": vocab entry \"%.60s\"", e->string);
        }
    }
    if ((rc = ms_bpe_build_vocab(&t->bpe, err))) {
        ms_buf_free(&tmp);
        return rc;
    }
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (merges && !cJSON_IsArray(merges)) {
        ms_buf_free(&tmp);
        return ms_fail(err, MS_ERR_FORMAT, W ": model.merges must be an array");
    }
    if ((rc = ms_bpe_reserve_merges(&t->bpe, (size_t)cJSON_GetArraySize(merges), err))) {
        ms_buf_free(&tmp);
        return rc;
    }
    uint32_t rank = 0;
    ms_buf cat = {0};
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        size_t al, bl;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp) {
                rc = ms_fail(err, MS_ERR_FORMAT, W ": merge %u \"%.60s\" is not \"a b\"", rank, e->valuestring);
                break;
            }
            a = e->valuestring, al = (size_t)(sp - a), b = sp + 1, bl = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            a = e->child->valuestring, al = strlen(a);
            b = e->child->next->valuestring, bl = strlen(b);
        } else {
            rc = ms_fail(err, MS_ERR_FORMAT, W ": merge %u must be \"a b\" or [\"a\", \"b\"]", rank);
            break;
        }
        int32_t ia = lookup_str(t, a, al, &tmp), ib = lookup_str(t, b, bl, &tmp);
        cat.n = 0;
        if (ms_buf_add(&cat, a, al) || ms_buf_add(&cat, b, bl)) {
            rc = ms_fail(err, MS_ERR_NOMEM, W ": out of memory");
            break;
        }
        int32_t im = lookup_str(t, (const char *)cat.p, cat.n, &tmp);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = ms_fail(err, MS_ERR_FORMAT, W ": merge %u (\"%.40s\" + \"%.40s\") uses a token missing from the vocab",
                         rank, a, b);
            break;
        }
        if ((rc = ms_bpe_add_merge(&t->bpe, (uint32_t)ia, (uint32_t)ib, rank, (uint32_t)im, err))) break;
        rank++;
    }
    ms_buf_free(&cat);
    ms_buf_free(&tmp);
    (void)byte_fallback; /* all 256 bytes are in a byte-level vocab: never needed */
    return rc;
}

static int parse_added(ms_tokenizer *t, const cJSON *list, ms_err *err) {
    if (!list || cJSON_IsNull(list)) return MS_OK;
    if (!cJSON_IsArray(list)) return ms_fail(err, MS_ERR_FORMAT, W ": added_tokens must be an array");
    int n = cJSON_GetArraySize(list);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added) return ms_fail(err, MS_ERR_NOMEM, W ": out of memory");
    const cJSON *e;
    int rc;
    cJSON_ArrayForEach(e, list) {
        ms_added *a = &t->added[t->n_added];
        char where[64];
        snprintf(where, sizeof where, W " added_tokens[%zu]", t->n_added);
        int64_t id;
        const char *content = NULL;
        if (!cJSON_IsObject(e)) return ms_fail(err, MS_ERR_FORMAT, "%s must be an object", where);
        if ((rc = ms_json_int(e, "id", 0, (1 << 24) - 1, &id, where, err))) return rc;
        if ((rc = ms_json_opt_string(e, "content", &content, where, err))) return rc;
        if (!content) return ms_fail(err, MS_ERR_FORMAT, "%s: \"content\" is missing", where);
        if (ms_utf8_valid_prefix((const uint8_t *)content, strlen(content)) != strlen(content))
            return ms_fail(err, MS_ERR_FORMAT, "%s: content is not valid UTF-8", where);
        int f[5] = {0};
        static const char *keys[5] = {"special", "lstrip", "rstrip", "normalized", "single_word"};
        for (int k = 0; k < 5; k++)
            if ((rc = ms_json_opt_bool(e, keys[k], &f[k], where, err))) return rc;
        a->content = strdup(content);
        if (!a->content) return ms_fail(err, MS_ERR_NOMEM, W ": out of memory");
        a->len = strlen(content);
        a->id = (int32_t)id;
        a->special = (uint8_t)f[0], a->lstrip = (uint8_t)f[1], a->rstrip = (uint8_t)f[2];
        a->normalized = (uint8_t)f[3], a->single_word = (uint8_t)f[4];
        t->n_added++;
    }
    return MS_OK;
}

/* bos/eos/pad/unk: a string or an AddedToken dict {"content": ...}; an unknown
 * bos/eos is an error, an unknown pad/unk is left unset (-1). */
int ms_tok_apply_config(ms_tokenizer *t, const cJSON *cfg, ms_err *err) {
    int rc;
    if ((rc = ms_json_opt_bool(cfg, "add_bos_token", &t->add_bos, "tokenizer_config.json", err))) return rc;
    if ((rc = ms_json_opt_bool(cfg, "add_eos_token", &t->add_eos, "tokenizer_config.json", err))) return rc;
    static const char *keys[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    int32_t *dst[4] = {&t->bos_id, &t->eos_id, &t->pad_id, &t->unk_id};
    for (int k = 0; k < 4; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, keys[k]);
        if (!v || cJSON_IsNull(v)) continue;
        if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (!cJSON_IsString(v))
            return ms_fail(err, MS_ERR_FORMAT, "tokenizer_config.json: \"%s\" must be a string or {\"content\": string}", keys[k]);
        int32_t id = ms_tok_token_id(t, v->valuestring);
        /* bos/eos must exist; configs often name a pad/unk the vocab lacks
         * (transformers then leaves it unset too) */
        if (id < 0 && k < 2)
            return ms_fail(err, MS_ERR_FORMAT, "tokenizer_config.json: %s \"%.80s\" is not a token", keys[k], v->valuestring);
        *dst[k] = id;
    }
    return MS_OK;
}

static ms_tokenizer *tok_new(int kind) {
    ms_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->kind = kind;
    t->bos_id = t->eos_id = t->pad_id = t->unk_id = -1;
    pthread_mutex_init(&t->bpe.cache_mu, NULL);
    return t;
}

int ms_tok_load_hf_json(const char *json, size_t len, const char *cfg, size_t cfg_len, ms_tokenizer **out,
                        ms_err *err) {
    cJSON *root = NULL, *cj = NULL;
    int rc = ms_json_parse(json, len, W, &root, err);
    if (rc) return rc;
    ms_tokenizer *t = tok_new(MS_TOK_KIND_HF);
    if (!t) {
        cJSON_Delete(root);
        return ms_fail(err, MS_ERR_NOMEM, W ": out of memory");
    }
    int has_bl = 0;
    const cJSON *trunc = cJSON_GetObjectItemCaseSensitive(root, "truncation");
    const cJSON *pad = cJSON_GetObjectItemCaseSensitive(root, "padding");
    if (!cJSON_IsObject(root)) rc = ms_fail(err, MS_ERR_FORMAT, W ": the document must be an object");
    else if ((trunc && !cJSON_IsNull(trunc)) || (pad && !cJSON_IsNull(pad)))
        rc = ms_fail(err, MS_ERR_UNSUPPORTED, W ": truncation/padding are not supported");
    if (!rc) rc = parse_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"), err);
    if (!rc) rc = parse_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), 0, err);
    if (!rc) rc = parse_pre(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), 0, &has_bl, err);
    if (!rc && !has_bl)
        rc = ms_fail(err, MS_ERR_UNSUPPORTED, W ": only byte-level BPE is supported (no ByteLevel pre-tokenizer)");
    if (!rc) rc = check_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), 0, err);
    if (!rc) rc = parse_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), err);
    if (!rc) rc = ms_tok_finish(t, err);
    if (!rc && cfg) {
        rc = ms_json_parse(cfg, cfg_len, "tokenizer_config.json", &cj, err);
        if (!rc && !cJSON_IsObject(cj)) rc = ms_fail(err, MS_ERR_FORMAT, "tokenizer_config.json: must be an object");
        if (!rc) rc = ms_tok_apply_config(t, cj, err);
    }
    cJSON_Delete(root);
    cJSON_Delete(cj);
    if (rc) {
        ms_tok_free(t);
        return rc;
    }
    *out = t;
    return MS_OK;
}

ms_tokenizer *ms_tok_alloc(int kind) { return tok_new(kind); }
