#include "util/json.h"

#include <math.h>
#include <stdio.h>

#define MS_JSON_MAX_DEPTH 64

static int depth_ok(const cJSON *v, int d) {
    if (d > MS_JSON_MAX_DEPTH) return 0;
    for (const cJSON *c = v ? v->child : NULL; c; c = c->next)
        if (!depth_ok(c, d + 1)) return 0;
    return 1;
}

int ms_json_parse(const char *text, size_t len, const char *where, cJSON **out, ms_err *err) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        size_t off = end ? (size_t)(end - text) : 0;
        return ms_fail(err, MS_ERR_FORMAT, "%s: malformed JSON near byte %zu", where, off);
    }
    /* trailing content other than whitespace/NUL padding is an error */
    for (const char *p = end; p && p < text + len; p++) {
        if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t' && *p != 0) {
            cJSON_Delete(j);
            return ms_fail(err, MS_ERR_FORMAT, "%s: trailing data after JSON at byte %zu", where,
                           (size_t)(p - text));
        }
    }
    if (!depth_ok(j, 0)) {
        cJSON_Delete(j);
        return ms_fail(err, MS_ERR_LIMIT, "%s: JSON nested deeper than %d", where, MS_JSON_MAX_DEPTH);
    }
    *out = j;
    return MS_OK;
}

int ms_json_is_int(const cJSON *v, int64_t lo, int64_t hi) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < -9007199254740992.0 || d > 9007199254740992.0) return 0;
    return (int64_t)d >= lo && (int64_t)d <= hi;
}

int ms_json_opt_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    const char *where, ms_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (cJSON_IsBool(v)) { /* some configs write booleans for flags read as ints */
        *out = cJSON_IsTrue(v);
        return MS_OK;
    }
    if (!ms_json_is_int(v, lo, hi))
        return ms_fail(err, MS_ERR_FORMAT, "%s: \"%s\" must be an integer in [%lld, %lld]", where, key,
                       (long long)lo, (long long)hi);
    *out = (int64_t)v->valuedouble;
    return MS_OK;
}

int ms_json_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                const char *where, ms_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return ms_fail(err, MS_ERR_FORMAT, "%s: missing \"%s\"", where, key);
    return ms_json_opt_int(obj, key, lo, hi, out, where, err);
}

int ms_json_opt_double(const cJSON *obj, const char *key, double *out, const char *where, ms_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return ms_fail(err, MS_ERR_FORMAT, "%s: \"%s\" must be a finite number", where, key);
    *out = v->valuedouble;
    return MS_OK;
}

int ms_json_opt_bool(const cJSON *obj, const char *key, int *out, const char *where, ms_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (!cJSON_IsBool(v)) return ms_fail(err, MS_ERR_FORMAT, "%s: \"%s\" must be true or false", where, key);
    *out = cJSON_IsTrue(v);
    return MS_OK;
}

int ms_json_opt_string(const cJSON *obj, const char *key, const char **out, const char *where,
                       ms_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (!cJSON_IsString(v)) return ms_fail(err, MS_ERR_FORMAT, "%s: \"%s\" must be a string", where, key);
    *out = v->valuestring;
    return MS_OK;
}
