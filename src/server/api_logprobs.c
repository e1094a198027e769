/* api_logprobs.c — OpenAI logprobs / top_logprobs and logit_bias: the request fields
 * (validated: bounds, token ids inside the model's vocabulary) and the response shapes.
 *   chat:        choices[0].logprobs = {"content": [{"token","logprob","bytes","top_logprobs":
 *                [{"token","logprob","bytes"}]}], "refusal": null}
 *   completions: choices[0].logprobs = {"tokens","token_logprobs","top_logprobs": [{TOKEN: LP}],
 *                "text_offset"} (offsets in characters of the completion text)
 *   responses:   output_text parts' "logprobs" = chat's entries; the streamed
 *                response.output_text.delta / .done events the same without "bytes"
 *                (api_agent.c assigns the entries to the text their tokens became)
 * Streamed, each chunk carries the entries of the tokens generated since the previous chunk
 * (text the output parser holds back delays its entries, never drops them); the final chunk
 * carries the rest. The values come from the generation loop (ms_gen_logprob_fn): the model's
 * raw distribution. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api_int.h"

#define MAX_BIAS 1024

int ms_api_parse_logprobs(const cJSON *root, ms_api_request *r, ms_api_error *e) {
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "logprobs"), *tl = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs"),
                *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    int rc;
    if (r->kind == MS_API_CHAT) {
        if ((rc = ms_api_get_bool(root, "logprobs", &r->logprobs, e))) return rc;
        int64_t k = 0;
        int has = 0;
        if ((rc = ms_api_get_int(root, "top_logprobs", 0, MS_GEN_TOP_LOGPROBS_MAX, &k, &has, e))) return rc;
        if (has && !r->logprobs) return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        r->top_logprobs = (int)k;
    } else if (r->kind == MS_API_COMPLETION) {
        int64_t k = 0;
        int has = 0;
        if ((rc = ms_api_get_int(root, "logprobs", 0, 5, &k, &has, e))) return rc;
        r->logprobs = has;
        r->top_logprobs = (int)k;
        if (tl && !cJSON_IsNull(tl))
            return BAD("top_logprobs", "'top_logprobs' is a chat field; completions take 'logprobs': N (0 to 5)");
    } else if (r->kind == MS_API_RESPONSES) {
        /* include: ["message.output_text.logprobs"] or top_logprobs (0..20) asks for the entries */
        const cJSON *inc = cJSON_GetObjectItemCaseSensitive(root, "include"), *x;
        int64_t k = 0;
        int has = 0, want = 0;
        if ((rc = ms_api_get_int(root, "top_logprobs", 0, MS_GEN_TOP_LOGPROBS_MAX, &k, &has, e))) return rc;
        if (inc && !cJSON_IsNull(inc)) {
            if (!cJSON_IsArray(inc)) return BAD("include", "'include' must be an array of strings, got %s", ms_api_type_name(inc));
            cJSON_ArrayForEach(x, inc) {
                if (!cJSON_IsString(x)) return BAD("include", "'include' must be an array of strings");
                want |= !strcmp(x->valuestring, "message.output_text.logprobs");
            }
        }
        if (lp && !cJSON_IsNull(lp) && !cJSON_IsFalse(lp))
            return UNSUPPORTED("logprobs", "the Responses API takes 'top_logprobs' and include: [\"message.output_text.logprobs\"], not 'logprobs'");
        if (lb && !cJSON_IsNull(lb) && !(cJSON_IsObject(lb) && !lb->child))
            return UNSUPPORTED("logit_bias", "'logit_bias' is not supported on this endpoint");
        r->logprobs = want || has;
        r->top_logprobs = (int)k;
        return MS_OK;
    } else {
        if (lp && !cJSON_IsNull(lp) && !cJSON_IsFalse(lp)) return UNSUPPORTED("logprobs", "'logprobs' is not supported on this endpoint");
        if (tl && !cJSON_IsNull(tl)) return UNSUPPORTED("top_logprobs", "'top_logprobs' is not supported on this endpoint");
        if (lb && !cJSON_IsNull(lb) && !(cJSON_IsObject(lb) && !lb->child))
            return UNSUPPORTED("logit_bias", "'logit_bias' is not supported on this endpoint");
        return MS_OK;
    }
    if (!lb || cJSON_IsNull(lb)) return MS_OK;
    if (!cJSON_IsObject(lb)) return BAD("logit_bias", "'logit_bias' must be an object mapping token ids to numbers, got %s", ms_api_type_name(lb));
    int n = cJSON_GetArraySize(lb);
    if (n > MAX_BIAS) return BAD("logit_bias", "'logit_bias' has %d entries; at most %d", n, MAX_BIAS);
    if (!n) return MS_OK;
    if (!(r->bias_ids = malloc((size_t)n * sizeof *r->bias_ids)) || !(r->bias = malloc((size_t)n * sizeof *r->bias))) return NOMEM();
    const cJSON *x;
    cJSON_ArrayForEach(x, lb) {
        const char *k = x->string;
        char *end = NULL;
        long id = strtol(k, &end, 10);
        if (!*k || *end || k[0] == '+' || k[0] == ' ' || (k[0] == '0' && k[1]) || (k[0] == '-' && k[1]))
            return BAD("logit_bias", "'logit_bias' keys must be token ids (decimal integers), got \"%.32s\"", k);
        if (id < 0 || (r->vocab > 0 && id >= r->vocab))
            return BAD("logit_bias", "'logit_bias' token id %ld is outside the vocabulary [0, %lld)", id, (long long)r->vocab);
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= -100 && x->valuedouble <= 100))
            return BAD("logit_bias", "'logit_bias[\"%s\"]' must be a number in [-100, 100]", k);
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias[r->n_bias++] = (float)x->valuedouble;
    }
    r->sampling.bias_ids = r->bias_ids;
    r->sampling.bias = r->bias;
    r->sampling.n_bias = r->n_bias;
    return MS_OK;
}

/* ---------------- response entries ---------------- */

/* 1 when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static int utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        int k = c < 0x80 ? 0 : c >= 0xC2 && c < 0xE0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : c >= 0xF0 && c < 0xF5 ? 3 : -1;
        if (k < 0 || i + (size_t)k >= n) return 0;
        for (int j = 1; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] >= 0xA0) || (c == 0xF0 && s[i + 1] < 0x90) ||
            (c == 0xF4 && s[i + 1] >= 0x90))
            return 0;
        i += (size_t)k + 1;
    }
    return 1;
}

/* The token's text as OpenAI shows it: its bytes when they are UTF-8, else "bytes:\xNN..." (a
 * token that holds part of a character). *bytes: the raw bytes as a JSON array. */
static cJSON *tok_string(const ms_tokenizer *t, int32_t id, cJSON **bytes, int *chars) {
    size_t n = 0;
    const uint8_t *b = t ? ms_tok_token_bytes(t, id, &n) : NULL;
    if (!b) n = 0;
    if (bytes) {
        *bytes = cJSON_CreateArray();
        for (size_t i = 0; *bytes && i < n; i++) cJSON_AddItemToArray(*bytes, cJSON_CreateNumber(b[i]));
    }
    if (chars) {
        *chars = 0;
        for (size_t i = 0; i < n; i++) *chars += (b[i] & 0xC0) != 0x80;
    }
    if (utf8_valid(b, n)) return ms_api_string_n((const char *)b, n);
    char *s = malloc(6 + 4 * n + 1);
    if (!s) return NULL;
    size_t w = (size_t)sprintf(s, "bytes:");
    for (size_t i = 0; i < n; i++) w += (size_t)sprintf(s + w, "\\x%02x", b[i]);
    cJSON *j = cJSON_CreateString(s);
    free(s);
    return j;
}

/* -9999 for -inf (JSON has no infinity; OpenAI uses -9999.0 for tokens outside the top) */
static double lp_num(float x) { return isfinite(x) ? (double)x : -9999.0; }

static cJSON *lp_new_completion(void) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddArrayToObject(o, "tokens");
    cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON_AddArrayToObject(o, "text_offset");
    return o;
}

/* Append one token's entry to dst (chat: an array of entries; completion: the object of arrays). */
static int lp_append(ms_api_resp *r, cJSON *dst, int32_t id, float lp, const int32_t *top, const float *tlp, int n, int offset) {
    const ms_tokenizer *t = r->o.tok;
    if (r->o.kind != MS_API_COMPLETION) { /* chat and Responses entries have the same fields */
        cJSON *e = cJSON_CreateObject(), *bytes = NULL;
        if (!e) return MS_ERR_NOMEM;
        cJSON_AddItemToObject(e, "token", tok_string(t, id, &bytes, NULL));
        cJSON_AddNumberToObject(e, "logprob", lp_num(lp));
        cJSON_AddItemToObject(e, "bytes", bytes);
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int i = 0; i < n; i++) {
            cJSON *x = cJSON_CreateObject(), *xb = NULL;
            cJSON_AddItemToObject(x, "token", tok_string(t, top[i], &xb, NULL));
            cJSON_AddNumberToObject(x, "logprob", lp_num(tlp[i]));
            cJSON_AddItemToObject(x, "bytes", xb);
            cJSON_AddItemToArray(tops, x);
        }
        cJSON_AddItemToArray(dst, e);
        return MS_OK;
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(dst, "tokens"), tok_string(t, id, NULL, NULL));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(dst, "token_logprobs"), cJSON_CreateNumber(lp_num(lp)));
    cJSON *d = cJSON_CreateObject();
    for (int i = 0; i < n; i++) {
        cJSON *k = tok_string(t, top[i], NULL, NULL);
        if (k && !cJSON_GetObjectItemCaseSensitive(d, k->valuestring)) cJSON_AddNumberToObject(d, k->valuestring, lp_num(tlp[i]));
        cJSON_Delete(k);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(dst, "top_logprobs"), d);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(dst, "text_offset"), cJSON_CreateNumber(offset));
    return MS_OK;
}

int ms_api_resp_logprob(ms_api_resp *r, int32_t id, float logprob, const int32_t *top, const float *tlp, int n_top) {
    int kind = r->o.kind;
    if (!r->o.logprobs || (kind != MS_API_CHAT && kind != MS_API_COMPLETION && kind != MS_API_RESPONSES)) return MS_OK;
    /* Responses: pending until the builder knows which text the token went to (ms_api_resp_take_logprobs) */
    cJSON **dst = r->o.stream || kind == MS_API_RESPONSES ? &r->lp_pend : &r->lp_all;
    if (!*dst) *dst = kind == MS_API_COMPLETION ? lp_new_completion() : cJSON_CreateArray();
    if (!*dst) return MS_ERR_NOMEM;
    int chars = 0;
    cJSON *tmp = tok_string(r->o.tok, id, NULL, &chars);
    cJSON_Delete(tmp);
    int rc = lp_append(r, *dst, id, logprob, top, tlp, n_top, r->lp_chars);
    r->lp_chars += chars;
    return rc;
}

void ms_api_resp_add_logprobs(ms_api_resp *r, cJSON *choice) {
    if (!r->o.logprobs || (r->o.kind != MS_API_CHAT && r->o.kind != MS_API_COMPLETION)) {
        cJSON_AddNullToObject(choice, "logprobs");
        return;
    }
    cJSON **src = r->o.stream ? &r->lp_pend : &r->lp_all;
    cJSON *v = *src;
    *src = NULL;
    if (r->o.kind == MS_API_CHAT) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "content", v ? v : cJSON_CreateArray());
        cJSON_AddNullToObject(o, "refusal");
        cJSON_AddItemToObject(choice, "logprobs", o);
    } else {
        cJSON_AddItemToObject(choice, "logprobs", v ? v : lp_new_completion());
    }
}

cJSON *ms_api_resp_take_logprobs(ms_api_resp *r) {
    cJSON *v = r->lp_pend;
    r->lp_pend = NULL;
    return v ? v : cJSON_CreateArray();
}

void ms_api_resp_free_logprobs(ms_api_resp *r) {
    cJSON_Delete(r->lp_pend);
    cJSON_Delete(r->lp_all);
    r->lp_pend = r->lp_all = NULL;
}
