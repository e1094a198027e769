/* schema_check.h — a handwritten JSON Schema validator for the subset src/grammar
 * supports (tests only; static functions, included by test_grammar.c and test_toolcall.c):
 * validate(value, schema, root) is 1 when value is valid. */
#ifndef MS_TEST_SCHEMA_CHECK_H
#define MS_TEST_SCHEMA_CHECK_H

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

/* ---------------- a handwritten JSON Schema validator ---------------- */

static int cp_len(const char *s) {
    int n = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80) n++;
    return n;
}

static int digits(const char *s, int n) {
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}
static int num2(const char *s) { return (s[0] - '0') * 10 + (s[1] - '0'); }

static int v_date(const char *s) {
    if (strlen(s) < 10 || !digits(s, 4) || s[4] != '-' || !digits(s + 5, 2) || s[7] != '-' || !digits(s + 8, 2)) return 0;
    int mo = num2(s + 5), d = num2(s + 8);
    return mo >= 1 && mo <= 12 && d >= 1 && d <= 31;
}
/* HH:MM:SS(.f+)?(Z|+HH:MM); returns the length used or 0 */
static int v_time(const char *s) {
    if (!digits(s, 2) || s[2] != ':' || !digits(s + 3, 2) || s[5] != ':' || !digits(s + 6, 2)) return 0;
    if (num2(s) > 23 || num2(s + 3) > 59 || num2(s + 6) > 59) return 0;
    int i = 8;
    if (s[i] == '.') {
        i++;
        if (!digits(s + i, 1)) return 0;
        while (s[i] >= '0' && s[i] <= '9') i++;
    }
    if (s[i] == 'Z') return i + 1;
    if ((s[i] == '+' || s[i] == '-') && digits(s + i + 1, 2) && s[i + 3] == ':' && digits(s + i + 4, 2) &&
        num2(s + i + 1) <= 23 && num2(s + i + 4) <= 59)
        return i + 6;
    return 0;
}
static int v_format(const char *f, const char *s) {
    if (!strcmp(f, "date")) return strlen(s) == 10 && v_date(s);
    if (!strcmp(f, "time")) {
        int n = v_time(s);
        return n && s[n] == 0;
    }
    if (!strcmp(f, "date-time")) {
        if (strlen(s) < 11 || !v_date(s) || s[10] != 'T') return 0;
        int n = v_time(s + 11);
        return n && s[11 + n] == 0;
    }
    if (!strcmp(f, "uuid")) {
        if (strlen(s) != 36) return 0;
        for (int i = 0; i < 36; i++) {
            int dash = i == 8 || i == 13 || i == 18 || i == 23;
            char c = s[i];
            int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
            if (dash ? c != '-' : !hex) return 0;
        }
        return 1;
    }
    if (!strcmp(f, "ipv4")) {
        const char *p = s;
        for (int k = 0; k < 4; k++) {
            if (k && *p++ != '.') return 0;
            int n = 0, v = 0;
            while (p[n] >= '0' && p[n] <= '9') v = v * 10 + (p[n] - '0'), n++;
            if (!n || n > 3 || v > 255 || (n > 1 && p[0] == '0')) return 0;
            p += n;
        }
        return *p == 0;
    }
    return 0;
}

static const cJSON *v_resolve(const cJSON *root, const char *ref) {
    const cJSON *cur = root;
    if (ref[0] != '#') return NULL;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", ref + 1);
    for (char *tok = strtok(buf, "/"); tok; tok = strtok(NULL, "/")) cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
    return cur;
}

static int is_type(const cJSON *v, const char *t) {
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && floor(v->valuedouble) == v->valuedouble;
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    return 0;
}

static int validate(const cJSON *v, const cJSON *s, const cJSON *root) {
    if (cJSON_IsTrue(s)) return 1;
    if (cJSON_IsFalse(s)) return 0;
    const cJSON *k;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) return validate(v, v_resolve(root, k->valuestring), root);
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) {
        const cJSON *a;
        cJSON_ArrayForEach(a, k) if (validate(v, a, root)) return 1;
        return 0;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) {
        const cJSON *a;
        int n = 0;
        cJSON_ArrayForEach(a, k) n += validate(v, a, root);
        return n == 1;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        const cJSON *a;
        cJSON_ArrayForEach(a, k) if (!validate(v, a, root)) return 0;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "const")) && !cJSON_Compare(v, k, 1)) return 0;
    if (cJSON_IsNumber(v)) { /* bounds apply to numbers only (compared as doubles: exact below 2^53) */
        const cJSON *b;
        if ((b = cJSON_GetObjectItemCaseSensitive(s, "minimum")) && v->valuedouble < b->valuedouble) return 0;
        if ((b = cJSON_GetObjectItemCaseSensitive(s, "maximum")) && v->valuedouble > b->valuedouble) return 0;
        if ((b = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum")) && v->valuedouble <= b->valuedouble) return 0;
        if ((b = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum")) && v->valuedouble >= b->valuedouble) return 0;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        const cJSON *a;
        int ok = 0;
        cJSON_ArrayForEach(a, k) if (cJSON_Compare(v, a, 1)) ok = 1;
        if (!ok) return 0;
    }
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(s, "nullable");
    if (cJSON_IsTrue(nl) && cJSON_IsNull(v)) return 1;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "type"))) {
        int ok = 0;
        if (cJSON_IsString(k)) ok = is_type(v, k->valuestring);
        else {
            const cJSON *a;
            cJSON_ArrayForEach(a, k) if (is_type(v, a->valuestring)) ok = 1;
        }
        if (!ok) return 0;
    }
    if (cJSON_IsString(v)) {
        int n = cp_len(v->valuestring);
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "minLength")) && n < k->valueint) return 0;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "maxLength")) && n > k->valueint) return 0;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "format")) && !v_format(k->valuestring, v->valuestring)) return 0;
    }
    if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "minItems")) && n < k->valueint) return 0;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "maxItems")) && n > k->valueint) return 0;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "items"))) {
            const cJSON *a;
            cJSON_ArrayForEach(a, v) if (!validate(a, k, root)) return 0;
        }
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "required"))) {
            const cJSON *a;
            cJSON_ArrayForEach(a, k) if (!cJSON_GetObjectItemCaseSensitive(v, a->valuestring)) return 0;
        }
        const cJSON *m;
        cJSON_ArrayForEach(m, v) {
            /* duplicate keys are invalid for us */
            for (const cJSON *q = v->child; q != m; q = q->next)
                if (!strcmp(q->string, m->string)) return 0;
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            if (ps) {
                if (!validate(m, ps, root)) return 0;
            } else if (add && !validate(m, add, root)) return 0;
        }
    }
    return 1;
}

#endif
