/* tok_tiktoken.c — tiktoken rank files, Kimi's tokenizer settings, and
 * loading a tokenizer from a model directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "util/fs.h"
#include "util/json.h"

/* tokenization_kimi.py, TikTokenTokenizer.pat_str (Rust regex syntax: \p{Han}
 * is the Han script, && is class intersection; see tok_pretok.c). */
const char ms_tiktoken_pattern_kimi[] =
    "[\\p{Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

/* tokenization_kimi.py: num_reserved_special_tokens and the chunking limit of
 * _split_whitespaces_or_nonwhitespaces. */
#define KIMI_N_SPECIAL 256
#define KIMI_MAX_RUN 25000



static int b64val(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 with optional padding; returns decoded length or -1. */
static long b64decode(const uint8_t *s, size_t n, uint8_t *out) {
    while (n && s[n - 1] == '=') n--;
    if (n % 4 == 1) return -1;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64val(s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    return (long)o;
}

int ms_tok_load_tiktoken(const char *ranks, size_t len, const char *pattern, const char *const *specials,
                         const int32_t *special_ids, size_t n_special, const char *cfg, size_t cfg_len,
                         ms_tokenizer **out, ms_err *err) {
    const uint8_t *s = (const uint8_t *)ranks;
    /* pass 1: count lines, largest rank */
    int64_t max_rank = -1;
    size_t nlines = 0;
    for (size_t i = 0; i < len;) {
        size_t e = i;
        while (e < len && s[e] != '\n') e++;
        size_t le = e;
        if (le > i && s[le - 1] == '\r') le--;
        if (le > i) {
            const uint8_t *sp = memchr(s + i, ' ', le - i);
            if (!sp) return ms_fail(err, MS_ERR_FORMAT, "tiktoken rank file line %zu: expected \"BASE64 RANK\"", nlines + 1);
            int64_t r = 0;
            const uint8_t *p = sp + 1;
            if (p == s + le) return ms_fail(err, MS_ERR_FORMAT, "tiktoken rank file line %zu: missing rank", nlines + 1);
            for (; p < s + le; p++) {
                if (*p < '0' || *p > '9' || r > (1 << 24))
                    return ms_fail(err, MS_ERR_FORMAT, "tiktoken rank file line %zu: bad rank", nlines + 1);
                r = r * 10 + (*p - '0');
            }
            if (r >= (1 << 24)) return ms_fail(err, MS_ERR_LIMIT, "tiktoken rank file line %zu: rank too large", nlines + 1);
            if (r > max_rank) max_rank = r;
            nlines++;
        }
        i = e + 1;
    }
    if (nlines == 0) return ms_fail(err, MS_ERR_FORMAT, "tiktoken rank file: no ranks");
    ms_tokenizer *t = ms_tok_alloc(MS_TOK_KIND_TIKTOKEN);
    if (!t) return ms_fail(err, MS_ERR_NOMEM, "tiktoken: out of memory");
    int rc = ms_bpe_init(&t->bpe, (uint32_t)(max_rank + 1), err);
    t->bpe.ignore_merges = 1; /* tiktoken takes a piece that is a token as is */
    uint8_t *dec = malloc(len + 4);
    if (!rc && !dec) rc = ms_fail(err, MS_ERR_NOMEM, "tiktoken: out of memory");
    size_t line = 0;
    for (size_t i = 0; i < len && !rc;) {
        size_t e = i;
        while (e < len && s[e] != '\n') e++;
        size_t le = e;
        if (le > i && s[le - 1] == '\r') le--;
        if (le > i) {
            line++;
            const uint8_t *sp = memchr(s + i, ' ', le - i);
            long dl = b64decode(s + i, (size_t)(sp - (s + i)), dec);
            uint32_t r = (uint32_t)strtoul((const char *)sp + 1, NULL, 10);
            if (dl <= 0) rc = ms_fail(err, MS_ERR_FORMAT, "tiktoken rank file line %zu: bad base64 token", line);
            else if ((rc = ms_bpe_set_token(&t->bpe, r, dec, (size_t)dl, err)))
                ms_wrap(err, "tiktoken rank file line %zu", line);
        }
        i = e + 1;
    }
    if (!rc) rc = ms_bpe_build_vocab(&t->bpe, err);
    for (int b = 0; b < 256 && !rc; b++)
        if (t->bpe.byte_id[b] < 0) rc = ms_fail(err, MS_ERR_FORMAT, "tiktoken rank file: byte 0x%02x has no rank", b);
    /* merges: a token of rank r merges any two tokens it splits into, at priority r
     * (tiktoken ranks a pair by the rank of its concatenation). */
    if (!rc) rc = ms_bpe_reserve_merges(&t->bpe, nlines * 4, err);
    for (uint32_t id = 0; id < t->bpe.n_ids && !rc; id++) {
        uint32_t l = t->bpe.len[id];
        if (l == UINT32_MAX || l < 2) continue;
        const uint8_t *tb = t->bpe.blob + t->bpe.off[id];
        for (uint32_t k = 1; k < l && !rc; k++) {
            int32_t a = ms_bpe_lookup(&t->bpe, tb, k), c = ms_bpe_lookup(&t->bpe, tb + k, l - k);
            if (a >= 0 && c >= 0) rc = ms_bpe_add_merge(&t->bpe, (uint32_t)a, (uint32_t)c, id, id, err);
        }
    }
    free(dec);
    ms_pre_step st = {0};
    st.kind = MS_PRE_SPLIT;
    st.behavior = MS_SPLIT_ISOLATED;
    if (!rc) rc = ms_regex_compile(pattern, strlen(pattern), 0, &st.re, err);
    if (!rc) {
        t->pre = calloc(2, sizeof *t->pre);
        if (!t->pre) {
            ms_regex_free(st.re);
            rc = ms_fail(err, MS_ERR_NOMEM, "tiktoken: out of memory");
        } else {
            t->pre[0] = st;
            t->n_pre = 1;
        }
    }
    if (!rc) {
        t->added = calloc(n_special + 1, sizeof *t->added);
        if (!t->added) rc = ms_fail(err, MS_ERR_NOMEM, "tiktoken: out of memory");
    }
    for (size_t i = 0; i < n_special && !rc; i++) {
        ms_added *a = &t->added[t->n_added];
        size_t l = strlen(specials[i]);
        if (special_ids[i] < 0 || special_ids[i] >= (1 << 24)) {
            rc = ms_fail(err, MS_ERR_FORMAT, "tiktoken: special token \"%.60s\" has a bad id %d", specials[i], special_ids[i]);
            break;
        }
        if (ms_utf8_valid_prefix((const uint8_t *)specials[i], l) != l) {
            rc = ms_fail(err, MS_ERR_FORMAT, "tiktoken: special token %zu is not valid UTF-8", i);
            break;
        }
        a->content = strdup(specials[i]);
        if (!a->content) {
            rc = ms_fail(err, MS_ERR_NOMEM, "tiktoken: out of memory");
            break;
        }
        a->len = l;
        a->id = special_ids[i];
        a->special = 1;
        t->n_added++;
    }
    if (!rc) rc = ms_tok_finish(t, err);
    if (!rc && cfg) {
        cJSON *cj = NULL;
        rc = ms_json_parse(cfg, cfg_len, "tokenizer_config.json", &cj, err);
        if (!rc && !cJSON_IsObject(cj)) rc = ms_fail(err, MS_ERR_FORMAT, "tokenizer_config.json: must be an object");
        if (!rc) rc = ms_tok_apply_config(t, cj, err);
        cJSON_Delete(cj);
    }
    if (rc) {
        ms_tok_free(t);
        return rc;
    }
    *out = t;
    return MS_OK;
}

/* Kimi: special ids n_base .. n_base+255 named by added_tokens_decoder, the
 * rest "<|reserved_token_ID|>"; long runs split like tokenization_kimi.py. */
static int load_kimi(const char *ranks, size_t len, const char *cfg, size_t cfg_len, const cJSON *cj,
                     ms_tokenizer **out, ms_err *err) {
    size_t n_base = 0;
    for (size_t i = 0; i < len;) {
        size_t e = i;
        while (e < len && ranks[e] != '\n') e++;
        if (e > i && !(e == i + 1 && ranks[i] == '\r')) n_base++;
        i = e + 1;
    }
    char *names[KIMI_N_SPECIAL];
    int32_t ids[KIMI_N_SPECIAL];
    const cJSON *atd = cJSON_GetObjectItemCaseSensitive(cj, "added_tokens_decoder");
    int rc = MS_OK;
    size_t made = 0;
    for (int i = 0; i < KIMI_N_SPECIAL && !rc; i++) {
        char key[32], dflt[48];
        snprintf(key, sizeof key, "%zu", n_base + (size_t)i);
        snprintf(dflt, sizeof dflt, "<|reserved_token_%zu|>", n_base + (size_t)i);
        const cJSON *ent = cJSON_GetObjectItemCaseSensitive(atd, key);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(ent, "content");
        if (ent && !cJSON_IsString(content)) {
            rc = ms_fail(err, MS_ERR_FORMAT, "tokenizer_config.json: added_tokens_decoder[\"%s\"] needs a content string", key);
            break;
        }
        names[i] = strdup(content ? content->valuestring : dflt);
        if (!names[i]) {
            rc = ms_fail(err, MS_ERR_NOMEM, "tiktoken: out of memory");
            break;
        }
        ids[i] = (int32_t)(n_base + (size_t)i);
        made++;
    }
    if (!rc) rc = ms_tok_load_tiktoken(ranks, len, ms_tiktoken_pattern_kimi, (const char *const *)names, ids,
                                       KIMI_N_SPECIAL, cfg, cfg_len, out, err);
    for (size_t i = 0; i < made; i++) free(names[i]);
    if (!rc) {
        (*out)->max_run_chars = KIMI_MAX_RUN;
        /* tokenization_kimi.py defaults when the config names none */
        if ((*out)->bos_id < 0 && !cJSON_GetObjectItemCaseSensitive(cj, "bos_token")) (*out)->bos_id = ms_tok_token_id(*out, "[BOS]");
        if ((*out)->eos_id < 0 && !cJSON_GetObjectItemCaseSensitive(cj, "eos_token")) (*out)->eos_id = ms_tok_token_id(*out, "[EOS]");
    }
    return rc;
}

static int is_kimi_config(const cJSON *cj) {
    const cJSON *am = cJSON_GetObjectItemCaseSensitive(cj, "auto_map");
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(am, "AutoTokenizer");
    const cJSON *e;
    if (cJSON_IsString(at)) return strstr(at->valuestring, "tokenization_kimi") != NULL;
    cJSON_ArrayForEach(e, at) {
        if (cJSON_IsString(e) && strstr(e->valuestring, "tokenization_kimi")) return 1;
    }
    return 0;
}

#define MAX_TOKENIZER_FILE ((size_t)1 << 30)

int ms_tok_load_dir(const char *dir, ms_tokenizer **out, ms_err *err) {
    char pj[4096], pc[4096], pt[4096];
    int rc;
    if ((rc = ms_path_join(pj, sizeof pj, dir, "tokenizer.json", err))) return rc;
    if ((rc = ms_path_join(pc, sizeof pc, dir, "tokenizer_config.json", err))) return rc;
    if ((rc = ms_path_join(pt, sizeof pt, dir, "tiktoken.model", err))) return rc;
    char *cfg = NULL, *data = NULL;
    size_t cfg_len = 0, len = 0;
    if (ms_file_exists(pc) && (rc = ms_read_file(pc, 64u << 20, &cfg, &cfg_len, err))) return rc;
    if (ms_file_exists(pj)) {
        rc = ms_read_file(pj, MAX_TOKENIZER_FILE, &data, &len, err);
        if (!rc) rc = ms_tok_load_hf_json(data, len, cfg, cfg_len, out, err);
        if (rc) ms_wrap(err, "%s", pj);
    } else if (ms_file_exists(pt)) {
        cJSON *cj = NULL;
        if (!cfg) rc = ms_fail(err, MS_ERR_IO, "%s: a tiktoken tokenizer needs tokenizer_config.json beside it", dir);
        if (!rc) rc = ms_json_parse(cfg, cfg_len, pc, &cj, err);
        if (!rc && !is_kimi_config(cj))
            rc = ms_fail(err, MS_ERR_UNSUPPORTED,
                         "%s: tiktoken.model of an unknown tokenizer (known: Kimi's tokenization_kimi.py); its split "
                         "pattern is not in the file", dir);
        if (!rc) rc = ms_read_file(pt, MAX_TOKENIZER_FILE, &data, &len, err);
        if (!rc) rc = load_kimi(data, len, cfg, cfg_len, cj, out, err);
        if (rc) ms_wrap(err, "%s", pt);
        cJSON_Delete(cj);
    } else {
        rc = ms_fail(err, MS_ERR_IO, "%s: no tokenizer.json or tiktoken.model", dir);
    }
    free(cfg);
    free(data);
    return rc;
}
