/* schema.c — JSON Schema (and "any JSON") to grammar rules; see grammar.h for the
 * supported subset. Values are emitted inline into the rule of the schema that
 * holds them; $ref targets, array items under a count bound, and the builtins
 * (ws, string, number, integer, any value/object/array) are rules of their own. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_int.h"
#include "util/json.h"

/* ---------------- builtins ---------------- */

static int gj_ws(gbuild *b) {
    if (b->o.ws_max < 0) return -1;
    if (b->j.ws >= 0) return b->j.ws;
    int r = b->j.ws = gb_rule(b, "ws");
    if (r < 0) return -1;
    b->r[r].defined = 1;
    int cur = 0;
    gb_eps(b, r, 0, 1);
    for (int i = 0; i < b->o.ws_max; i++) {
        int nx = i + 1 == b->o.ws_max ? 1 : gb_state(b, r);
        gb_range(b, r, cur, ' ', ' ', nx);
        gb_range(b, r, cur, '\t', '\t', nx);
        gb_range(b, r, cur, '\n', '\n', nx);
        gb_range(b, r, cur, '\r', '\r', nx);
        gb_eps(b, r, nx, 1);
        cur = nx;
    }
    return r;
}

static void skip_ws(gbuild *b, int r, int from, int to) {
    int w = gj_ws(b);
    if (w >= 0) gb_call(b, r, from, w, to);
    else gb_eps(b, r, from, to);
}

/* One JSON string character (unescaped, or an escape; a \u surrogate only as a pair). */
static void emit_char(gbuild *b, int r, int from, int to) {
    gb_range(b, r, from, 0x20, 0x21, to);
    gb_range(b, r, from, 0x23, 0x5B, to);
    gb_range(b, r, from, 0x5D, 0x7F, to);
    uint32_t lo = 0x80, hi = 0x10FFFF;
    gb_cps(b, r, from, &lo, &hi, 1, to);
    int e = gb_state(b, r);
    gb_range(b, r, from, '\\', '\\', e);
    static const char simple[] = "\"\\/bfnrt";
    for (const char *c = simple; *c; c++) gb_range(b, r, e, *c, *c, to);
    int u = gb_state(b, r);
    gb_range(b, r, e, 'u', 'u', u);
    /* non-surrogate: first hex digit not d/D, or d/D followed by 0-7 */
    int h1 = gb_state(b, r), h2 = gb_state(b, r), h3 = gb_state(b, r);
    gb_range(b, r, u, '0', '9', h1);
    gb_range(b, r, u, 'a', 'c', h1);
    gb_range(b, r, u, 'A', 'C', h1);
    gb_range(b, r, u, 'e', 'f', h1);
    gb_range(b, r, u, 'E', 'F', h1);
    int hd = gb_state(b, r);
    gb_range(b, r, u, 'd', 'd', hd);
    gb_range(b, r, u, 'D', 'D', hd);
    gb_range(b, r, hd, '0', '7', h2);
    const int hexs[3][2] = {{'0', '9'}, {'a', 'f'}, {'A', 'F'}};
    for (int k = 0; k < 3; k++) {
        gb_range(b, r, h1, hexs[k][0], hexs[k][1], h2);
        gb_range(b, r, h2, hexs[k][0], hexs[k][1], h3);
        gb_range(b, r, h3, hexs[k][0], hexs[k][1], to);
    }
    /* a high surrogate d800-dbff, then \u and a low one dc00-dfff */
    int s2 = gb_state(b, r), s3 = gb_state(b, r), s4 = gb_state(b, r), s5 = gb_state(b, r);
    gb_range(b, r, hd, '8', '9', s2);
    gb_range(b, r, hd, 'a', 'b', s2);
    gb_range(b, r, hd, 'A', 'B', s2);
    for (int k = 0; k < 3; k++) {
        gb_range(b, r, s2, hexs[k][0], hexs[k][1], s3);
        gb_range(b, r, s3, hexs[k][0], hexs[k][1], s4);
    }
    gb_lit(b, r, s4, "\\u", 2, s5);
    int l1 = gb_state(b, r), l2 = gb_state(b, r), l3 = gb_state(b, r);
    gb_range(b, r, s5, 'd', 'd', l1);
    gb_range(b, r, s5, 'D', 'D', l1);
    gb_range(b, r, l1, 'c', 'f', l2);
    gb_range(b, r, l1, 'C', 'F', l2);
    for (int k = 0; k < 3; k++) {
        gb_range(b, r, l2, hexs[k][0], hexs[k][1], l3);
        gb_range(b, r, l3, hexs[k][0], hexs[k][1], to);
    }
}

static int gj_string(gbuild *b);
int gj_string_rule(gbuild *b) { return gj_string(b); }

static int gj_string(gbuild *b) {
    if (b->j.string >= 0) return b->j.string;
    int r = b->j.string = gb_rule(b, "string");
    if (r < 0) return -1;
    b->r[r].defined = 1;
    int q = gb_state(b, r);
    gb_lit(b, r, 0, "\"", 1, q);
    emit_char(b, r, q, q);
    gb_lit(b, r, q, "\"", 1, 1);
    return r;
}

/* -? (0 | [1-9][0-9]*), then for numbers (. [0-9]+)? ([eE][+-]?[0-9]+)? */
static int gj_num(gbuild *b, int integer) {
    int *slot = integer ? &b->j.integer : &b->j.number;
    if (*slot >= 0) return *slot;
    int r = *slot = gb_rule(b, integer ? "integer" : "number");
    if (r < 0) return -1;
    b->r[r].defined = 1;
    int s = gb_state(b, r), ip = gb_state(b, r);
    gb_eps(b, r, 0, s);
    gb_range(b, r, 0, '-', '-', s);
    gb_range(b, r, s, '0', '0', ip);
    int d = gb_state(b, r);
    gb_range(b, r, s, '1', '9', d);
    gb_range(b, r, d, '0', '9', d);
    gb_eps(b, r, d, ip);
    if (integer) {
        gb_eps(b, r, ip, 1);
        return r;
    }
    int fp = gb_state(b, r), f1 = gb_state(b, r), ep = gb_state(b, r);
    gb_eps(b, r, ip, fp);
    gb_range(b, r, ip, '.', '.', f1);
    gb_range(b, r, f1, '0', '9', f1);
    int f2 = gb_state(b, r);
    gb_range(b, r, f1, '0', '9', f2);
    gb_range(b, r, f2, '0', '9', f2);
    gb_eps(b, r, f2, fp);
    /* exponent */
    gb_eps(b, r, fp, 1);
    int e1 = gb_state(b, r), e2 = gb_state(b, r);
    gb_range(b, r, fp, 'e', 'e', ep);
    gb_range(b, r, fp, 'E', 'E', ep);
    gb_eps(b, r, ep, e1);
    gb_range(b, r, ep, '+', '+', e1);
    gb_range(b, r, ep, '-', '-', e1);
    gb_range(b, r, e1, '0', '9', e2);
    gb_range(b, r, e2, '0', '9', e2);
    gb_eps(b, r, e2, 1);
    return r;
}

/* "{" ws (string ws ":" ws value ws ("," ws string ws ":" ws value ws)*)? "}" and
 * "[" ws (value ws ("," ws value ws)*)? "]", both calling the value rule. */
int gj_value(gbuild *b) {
    if (b->j.value >= 0) return b->j.value;
    int v = b->j.value = gb_rule(b, "value");
    int o = b->j.object = gb_rule(b, "object");
    int a = b->j.array = gb_rule(b, "array");
    if (v < 0 || o < 0 || a < 0) return -1;
    b->r[v].defined = b->r[o].defined = b->r[a].defined = 1;
    int str = gj_string(b), num = gj_num(b, 0);
    gb_call(b, v, 0, o, 1);
    gb_call(b, v, 0, a, 1);
    gb_call(b, v, 0, str, 1);
    gb_call(b, v, 0, num, 1);
    gb_lit(b, v, 0, "true", 4, 1);
    gb_lit(b, v, 0, "false", 5, 1);
    gb_lit(b, v, 0, "null", 4, 1);
    /* object */
    int s0 = gb_state(b, o), s1 = gb_state(b, o), k = gb_state(b, o);
    gb_lit(b, o, 0, "{", 1, s0);
    skip_ws(b, o, s0, s1);
    gb_lit(b, o, s1, "}", 1, 1);
    int k1 = gb_state(b, o), k2 = gb_state(b, o), k3 = gb_state(b, o), k4 = gb_state(b, o);
    int c1 = gb_state(b, o), c2 = gb_state(b, o);
    gb_call(b, o, s1, str, k1);
    gb_call(b, o, c2, str, k1);
    skip_ws(b, o, k1, k2);
    gb_lit(b, o, k2, ":", 1, k3);
    skip_ws(b, o, k3, k4);
    int kv = gb_state(b, o);
    gb_call(b, o, k4, v, kv);
    skip_ws(b, o, kv, k);
    gb_lit(b, o, k, "}", 1, 1);
    gb_lit(b, o, k, ",", 1, c1);
    skip_ws(b, o, c1, c2);
    /* array */
    int a0 = gb_state(b, a), a1 = gb_state(b, a), ai = gb_state(b, a), aw = gb_state(b, a);
    int ac = gb_state(b, a), ac2 = gb_state(b, a);
    gb_lit(b, a, 0, "[", 1, a0);
    skip_ws(b, a, a0, a1);
    gb_lit(b, a, a1, "]", 1, 1);
    gb_call(b, a, a1, v, ai);
    gb_call(b, a, ac2, v, ai);
    skip_ws(b, a, ai, aw);
    gb_lit(b, a, aw, "]", 1, 1);
    gb_lit(b, a, aw, ",", 1, ac);
    skip_ws(b, a, ac, ac2);
    return v;
}

int gj_object(gbuild *b) {
    if (gj_value(b) < 0) return -1;
    return b->j.object;
}

/* ---------------- schema compiler ---------------- */

typedef struct sctx {
    gbuild *b;
    cJSON *doc;
    char ptr[2048];
    size_t plen;
    char **refp;
    int *refr;
    int nref, capref;
    int depth, nitem;
} sctx;

static size_t ptr_push(sctx *c, const char *seg) {
    size_t old = c->plen;
    if (c->plen + 2 < sizeof c->ptr) c->ptr[c->plen++] = '/';
    for (const char *s = seg; *s && c->plen + 3 < sizeof c->ptr; s++) {
        if (*s == '~') c->ptr[c->plen++] = '~', c->ptr[c->plen++] = '0';
        else if (*s == '/') c->ptr[c->plen++] = '~', c->ptr[c->plen++] = '1';
        else c->ptr[c->plen++] = *s;
    }
    c->ptr[c->plen] = 0;
    return old;
}
static size_t ptr_push_i(sctx *c, const char *seg, int i) {
    size_t old = ptr_push(c, seg);
    char num[24];
    snprintf(num, sizeof num, "%d", i);
    ptr_push(c, num);
    return old;
}
static void ptr_pop(sctx *c, size_t old) {
    c->plen = old;
    c->ptr[old] = 0;
}
static const char *P(sctx *c) { return c->plen ? c->ptr : "(root)"; }

static const char *const k_annotations[] = {"title", "description", "default", "examples", "$schema", "$id",
                                            "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                            "definitions", NULL};
static const char *const k_supported[] = {"type", "properties", "required", "additionalProperties", "items",
                                          "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minItems",
                                          "maxItems", "minLength", "maxLength", "format", "nullable", "minimum",
                                          "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};

static int in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

static int emit(sctx *c, const cJSON *s, int r, int from, int to);

/* A JSON value's compact text as a literal. */
static int emit_literal(sctx *c, const cJSON *v, int r, int from, int to) {
    char *t = cJSON_PrintUnformatted(v);
    if (!t) return gb_fail(c->b, MS_ERR_NOMEM, "schema: out of memory");
    gb_lit(c->b, r, from, t, strlen(t), to);
    cJSON_free(t);
    return c->b->rc;
}

static int type_bit(const char *t) {
    static const char *const names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, names[i])) return 1 << i;
    return 0;
}
enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64 };

static int value_type_ok(const cJSON *v, int types) {
    if (cJSON_IsNull(v)) return types & T_NULL;
    if (cJSON_IsBool(v)) return types & T_BOOL;
    if (cJSON_IsNumber(v)) return (types & T_NUM) || ((types & T_INT) && ms_json_is_int(v, INT64_MIN, INT64_MAX));
    if (cJSON_IsString(v)) return types & T_STR;
    if (cJSON_IsArray(v)) return types & T_ARR;
    return types & T_OBJ;
}

static int get_count(sctx *c, const cJSON *s, const char *key, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return 0;
    if (!ms_json_is_int(v, 0, INT64_MAX)) {
        size_t o = ptr_push(c, key);
        gb_fail(c->b, MS_ERR_ARG, "schema: \"%s\" must be a non-negative integer at %s", key, P(c));
        ptr_pop(c, o);
        return c->b->rc;
    }
    if (v->valuedouble > c->b->o.max_repeat) {
        size_t o = ptr_push(c, key);
        gb_fail(c->b, MS_ERR_LIMIT, "schema: \"%s\" %.0f exceeds the limit %d (max_repeat) at %s", key, v->valuedouble,
                c->b->o.max_repeat, P(c));
        ptr_pop(c, o);
        return c->b->rc;
    }
    *out = (int)v->valuedouble;
    return 0;
}

static const char *const k_formats[][2] = {
    {"date", "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])"},
    {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]+)? "
             "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
    {"date-time", "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) \"T\" "
                  "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]+)? "
                  "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
    {"uuid", "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}"},
    {"ipv4", "(\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]) (\".\" (\"25\" [0-5] | "
             "\"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9])){3}"},
};

const char *ms_grammar_format_gbnf(const char *format) {
    for (size_t i = 0; format && i < sizeof k_formats / sizeof *k_formats; i++)
        if (!strcmp(k_formats[i][0], format)) return k_formats[i][1];
    return NULL;
}

static int emit_string(sctx *c, const cJSON *s, int r, int from, int to) {
    gbuild *b = c->b;
    int mn = 0, mx = -1;
    if (get_count(c, s, "minLength", &mn) || get_count(c, s, "maxLength", &mx)) return b->rc;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (f) {
        size_t o = ptr_push(c, "format");
        if (!cJSON_IsString(f)) {
            gb_fail(b, MS_ERR_ARG, "schema: \"format\" must be a string at %s", P(c));
            ptr_pop(c, o);
            return b->rc;
        }
        const char *body = NULL;
        for (size_t i = 0; i < sizeof k_formats / sizeof *k_formats; i++)
            if (!strcmp(k_formats[i][0], f->valuestring)) body = k_formats[i][1];
        if (!body) {
            gb_fail(b, MS_ERR_UNSUPPORTED, "unsupported JSON Schema string format \"%s\" at %s (supported: date, time, date-time, uuid, ipv4)",
                    f->valuestring, P(c));
            ptr_pop(c, o);
            return b->rc;
        }
        if (mn || mx >= 0) {
            gb_fail(b, MS_ERR_UNSUPPORTED, "unsupported JSON Schema: \"format\" with minLength/maxLength at %s", P(c));
            ptr_pop(c, o);
            return b->rc;
        }
        ptr_pop(c, o);
        int q1 = gb_state(b, r), q2 = gb_state(b, r);
        gb_lit(b, r, from, "\"", 1, q1);
        gg_emit_expr(b, body, r, q1, q2);
        gb_lit(b, r, q2, "\"", 1, to);
        return b->rc;
    }
    if (!mn && mx < 0) {
        gb_call(b, r, from, gj_string(b), to);
        return b->rc;
    }
    if (mx >= 0 && mn > mx) return gb_fail(b, MS_ERR_ARG, "schema: minLength %d > maxLength %d at %s (no string fits)", mn, mx, P(c));
    /* a rule of its own per (minLength, maxLength), shared by every string with those bounds */
    char name[64];
    snprintf(name, sizeof name, "string{%d,%d}", mn, mx);
    int br = gb_find_rule(b, name);
    if (br < 0) {
        if ((br = gb_rule(b, name)) < 0) return b->rc;
        b->r[br].defined = 1;
        b->r[br].bounded = 1;
        b->r[br].bmin = mn;
        b->r[br].bmax = mx;
        int cur = gb_state(b, br);
        gb_lit(b, br, 0, "\"", 1, cur);
        for (int i = 0; i < mn && !b->rc; i++) {
            int nx = gb_state(b, br);
            emit_char(b, br, cur, nx);
            cur = nx;
        }
        int end = gb_state(b, br);
        if (mx < 0) emit_char(b, br, cur, cur);
        else
            for (int i = mn; i < mx && !b->rc; i++) {
                int nx = gb_state(b, br);
                gb_eps(b, br, cur, end);
                emit_char(b, br, cur, nx);
                cur = nx;
            }
        gb_eps(b, br, cur, end);
        gb_lit(b, br, end, "\"", 1, 1);
    }
    gb_call(b, r, from, br, to);
    return b->rc;
}

static int emit_array(sctx *c, const cJSON *s, int r, int from, int to) {
    gbuild *b = c->b;
    int mn = 0, mx = -1;
    if (get_count(c, s, "minItems", &mn) || get_count(c, s, "maxItems", &mx)) return b->rc;
    if (mx >= 0 && mn > mx) return gb_fail(b, MS_ERR_ARG, "schema: minItems %d > maxItems %d at %s (no array fits)", mn, mx, P(c));
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    /* the item as a call: its own rule when it is copied more than twice */
    int item_rule = -1;
    int copies = mx >= 0 ? mx : (mn > 1 ? mn : 1) + 1;
    size_t o = ptr_push(c, "items");
    if (!items) item_rule = gj_value(b);
    else if (copies > 2) {
        char name[64];
        snprintf(name, sizeof name, "item%d", c->nitem++);
        item_rule = gb_rule(b, name);
        if (item_rule < 0) return b->rc;
        b->r[item_rule].defined = 1;
        emit(c, items, item_rule, 0, 1);
    }
#define ITEM(FROM, TO)                                                         \
    do {                                                                       \
        int iw_ = gb_state(b, r);                                              \
        if (item_rule >= 0) gb_call(b, r, FROM, item_rule, iw_);               \
        else emit(c, items, r, FROM, iw_);                                     \
        skip_ws(b, r, iw_, TO);                                                \
    } while (0)
#define SEP_ITEM(FROM, TO)                                                     \
    do {                                                                       \
        int c1_ = gb_state(b, r), c2_ = gb_state(b, r);                        \
        gb_lit(b, r, FROM, ",", 1, c1_);                                       \
        skip_ws(b, r, c1_, c2_);                                               \
        ITEM(c2_, TO);                                                         \
    } while (0)
    int s0 = gb_state(b, r), s1 = gb_state(b, r), close = gb_state(b, r);
    gb_lit(b, r, from, "[", 1, s0);
    skip_ws(b, r, s0, s1);
    gb_lit(b, r, close, "]", 1, to);
    if (mx == 0) gb_eps(b, r, s1, close);
    else {
        if (mn == 0) gb_eps(b, r, s1, close);
        int cur = gb_state(b, r);
        ITEM(s1, cur);
        int k = 1;
        for (; k < mn && !b->rc; k++) {
            int nx = gb_state(b, r);
            SEP_ITEM(cur, nx);
            cur = nx;
        }
        if (mx < 0) {
            SEP_ITEM(cur, cur);
            gb_eps(b, r, cur, close);
        } else {
            for (; k < mx && !b->rc; k++) {
                int nx = gb_state(b, r);
                gb_eps(b, r, cur, close);
                SEP_ITEM(cur, nx);
                cur = nx;
            }
            gb_eps(b, r, cur, close);
        }
    }
#undef ITEM
#undef SEP_ITEM
    ptr_pop(c, o);
    return b->rc;
}

typedef struct prop {
    const char *name;
    const cJSON *schema; /* NULL: any value */
    int req;
} prop;

/* "key" ws ":" ws value ws, from -> to */
static void emit_kv(sctx *c, const prop *p, int r, int from, int to) {
    gbuild *b = c->b;
    cJSON *k = cJSON_CreateString(p->name);
    char *t = k ? cJSON_PrintUnformatted(k) : NULL;
    cJSON_Delete(k);
    if (!t) {
        gb_fail(b, MS_ERR_NOMEM, "schema: out of memory");
        return;
    }
    int a = gb_state(b, r), bb = gb_state(b, r), cc = gb_state(b, r), d = gb_state(b, r), e = gb_state(b, r);
    gb_lit(b, r, from, t, strlen(t), a);
    cJSON_free(t);
    skip_ws(b, r, a, bb);
    gb_lit(b, r, bb, ":", 1, cc);
    skip_ws(b, r, cc, d);
    size_t o = ptr_push(c, "properties");
    ptr_push(c, p->name);
    if (p->schema) emit(c, p->schema, r, d, e);
    else gb_call(b, r, d, gj_value(b), e);
    ptr_pop(c, o);
    skip_ws(b, r, e, to);
}

static void emit_sep_kv(sctx *c, const prop *p, int r, int from, int to) {
    gbuild *b = c->b;
    int c1 = gb_state(b, r), c2 = gb_state(b, r);
    gb_lit(b, r, from, ",", 1, c1);
    skip_ws(b, r, c1, c2);
    emit_kv(c, p, r, c2, to);
}

/* an additional property: any key (a string) -> value of schema xs (NULL: any) */
static void emit_extra(sctx *c, const cJSON *xs, int r, int from, int to) {
    gbuild *b = c->b;
    int a = gb_state(b, r), bb = gb_state(b, r), cc = gb_state(b, r), d = gb_state(b, r), e = gb_state(b, r);
    gb_call(b, r, from, gj_string(b), a);
    skip_ws(b, r, a, bb);
    gb_lit(b, r, bb, ":", 1, cc);
    skip_ws(b, r, cc, d);
    size_t o = ptr_push(c, "additionalProperties");
    if (xs) emit(c, xs, r, d, e);
    else gb_call(b, r, d, gj_value(b), e);
    ptr_pop(c, o);
    skip_ws(b, r, e, to);
}

static int emit_object(sctx *c, const cJSON *s, int r, int from, int to) {
    gbuild *b = c->b;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return gb_fail(b, MS_ERR_ARG, "schema: \"properties\" must be an object at %s", P(c));
    if (req && !cJSON_IsArray(req)) return gb_fail(b, MS_ERR_ARG, "schema: \"required\" must be an array at %s", P(c));
    int n = props ? cJSON_GetArraySize(props) : 0, nreq = req ? cJSON_GetArraySize(req) : 0;
    prop *p = calloc((size_t)(n + nreq) + 1, sizeof *p);
    if (!p) return gb_fail(b, MS_ERR_NOMEM, "schema: out of memory");
    int np = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, props) p[np++] = (prop){it->string, it, 0};
    int i = 0;
    cJSON_ArrayForEach(it, req) {
        if (!cJSON_IsString(it)) {
            size_t o = ptr_push_i(c, "required", i);
            gb_fail(b, MS_ERR_ARG, "schema: a required name must be a string at %s", P(c));
            ptr_pop(c, o);
            free(p);
            return b->rc;
        }
        int found = 0;
        for (int k = 0; k < np; k++)
            if (!strcmp(p[k].name, it->valuestring)) p[k].req = 1, found = 1;
        if (!found) p[np++] = (prop){it->valuestring, NULL, 1};
        i++;
    }
    /* absent additionalProperties: none when properties are declared (strict), any otherwise */
    int extras;
    const cJSON *xs = NULL;
    if (!add) extras = !props;
    else if (cJSON_IsBool(add)) extras = cJSON_IsTrue(add);
    else if (cJSON_IsObject(add)) extras = 1, xs = add;
    else {
        free(p);
        return gb_fail(b, MS_ERR_ARG, "schema: \"additionalProperties\" must be a boolean or a schema at %s", P(c));
    }
    int s0 = gb_state(b, r), close = gb_state(b, r);
    int *A = malloc(((size_t)np + 1) * sizeof *A), *B = malloc(((size_t)np + 1) * sizeof *B);
    if (!A || !B) {
        free(p), free(A), free(B);
        return gb_fail(b, MS_ERR_NOMEM, "schema: out of memory");
    }
    gb_lit(b, r, from, "{", 1, s0);
    A[0] = gb_state(b, r);
    skip_ws(b, r, s0, A[0]);
    B[0] = -1;
    for (int k = 1; k <= np; k++) A[k] = gb_state(b, r), B[k] = gb_state(b, r);
    for (int k = 0; k < np && !b->rc; k++) {
        emit_kv(c, &p[k], r, A[k], B[k + 1]);
        if (!p[k].req) gb_eps(b, r, A[k], A[k + 1]);
        if (k > 0) {
            emit_sep_kv(c, &p[k], r, B[k], B[k + 1]);
            if (!p[k].req) gb_eps(b, r, B[k], B[k + 1]);
        }
    }
    int endA = A[np], endB = np ? B[np] : -1;
    if (extras) {
        int loop = gb_state(b, r);
        emit_extra(c, xs, r, endA, loop);
        if (endB >= 0) {
            int c1 = gb_state(b, r), c2 = gb_state(b, r);
            gb_lit(b, r, endB, ",", 1, c1);
            skip_ws(b, r, c1, c2);
            emit_extra(c, xs, r, c2, loop);
            gb_eps(b, r, endB, close);
        }
        int c1 = gb_state(b, r), c2 = gb_state(b, r);
        gb_lit(b, r, loop, ",", 1, c1);
        skip_ws(b, r, c1, c2);
        emit_extra(c, xs, r, c2, loop);
        gb_eps(b, r, loop, close);
    } else if (endB >= 0) {
        gb_eps(b, r, endB, close);
    }
    gb_eps(b, r, endA, close); /* endA is reachable only when every property is optional */
    gb_lit(b, r, close, "}", 1, to);
    free(p), free(A), free(B);
    return b->rc;
}

/* Resolve a local $ref ("#" or "#/a/b") to its node. */
static const cJSON *resolve(sctx *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const cJSON *cur = c->doc;
    const char *s = ref + 1;
    char seg[512];
    while (*s) {
        if (*s != '/') return NULL;
        s++;
        size_t n = 0;
        while (*s && *s != '/' && n + 1 < sizeof seg) {
            if (*s == '~' && s[1] == '0') seg[n++] = '~', s += 2;
            else if (*s == '~' && s[1] == '1') seg[n++] = '/', s += 2;
            else seg[n++] = *s++;
        }
        seg[n] = 0;
        if (cJSON_IsObject(cur)) cur = cJSON_GetObjectItemCaseSensitive(cur, seg);
        else if (cJSON_IsArray(cur)) {
            char *e;
            long i = strtol(seg, &e, 10);
            cur = *e || !n ? NULL : cJSON_GetArrayItem(cur, (int)i);
        } else cur = NULL;
        if (!cur) return NULL;
    }
    return cur;
}

static int ref_rule(sctx *c, const char *ref) {
    gbuild *b = c->b;
    for (int i = 0; i < c->nref; i++)
        if (!strcmp(c->refp[i], ref)) return c->refr[i];
    const cJSON *t = resolve(c, ref);
    if (!t) {
        size_t o = ptr_push(c, "$ref");
        if (ref[0] != '#') gb_fail(b, MS_ERR_UNSUPPORTED, "unsupported JSON Schema $ref \"%s\" at %s (only local references: \"#...\")", ref, P(c));
        else gb_fail(b, MS_ERR_ARG, "schema: $ref \"%s\" does not resolve at %s", ref, P(c));
        ptr_pop(c, o);
        return -1;
    }
    if (c->nref == c->capref) {
        int nc = c->capref ? c->capref * 2 : 16;
        char **np = realloc(c->refp, (size_t)nc * sizeof *np);
        if (!np) return gb_fail(b, MS_ERR_NOMEM, "schema: out of memory"), -1;
        c->refp = np;
        int *nr = realloc(c->refr, (size_t)nc * sizeof *nr);
        if (!nr) return gb_fail(b, MS_ERR_NOMEM, "schema: out of memory"), -1;
        c->refr = nr;
        c->capref = nc;
    }
    char name[600];
    snprintf(name, sizeof name, "ref:%s", ref);
    int rr = gb_rule(b, name);
    if (rr < 0) return -1;
    b->r[rr].defined = 1;
    c->refp[c->nref] = strdup(ref);
    c->refr[c->nref++] = rr;
    /* compile the target with its own pointer */
    char saved[sizeof c->ptr];
    size_t sl = c->plen;
    memcpy(saved, c->ptr, sl + 1);
    snprintf(c->ptr, sizeof c->ptr, "%s", ref + 1);
    c->plen = strlen(c->ptr);
    int sd = c->depth;
    c->depth = 0;
    emit(c, t, rr, 0, 1);
    c->depth = sd;
    memcpy(c->ptr, saved, sl + 1);
    c->plen = sl;
    return b->rc ? -1 : rr;
}

/* ---------------- integer ranges ---------------- */

typedef struct rbuf { char *p; size_t n, cap; int bad; } rbuf;
static void rb_add(rbuf *b, const char *s) {
    size_t l = strlen(s);
    if (b->n + l + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 256;
        while (c < b->n + l + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) { b->bad = 1; return; }
        b->p = q, b->cap = c;
    }
    memcpy(b->p + b->n, s, l + 1);
    b->n += l;
}

/* Digit strings x..y of the same length n (leading zeros allowed: they are inner positions),
 * as a GBNF alternation. */
static void same_len(rbuf *b, const char *x, const char *y, int n) {
    if (!n) { rb_add(b, "\"\""); return; }
    if (!memcmp(x, y, (size_t)n)) {
        char t[32];
        snprintf(t, sizeof t, "\"%.*s\"", n, x);
        rb_add(b, t);
        return;
    }
    char t[64];
    int full = 1; /* 0...0 to 9...9: any n digits */
    for (int i = 0; i < n && full; i++) full = x[i] == '0' && y[i] == '9';
    if (full) {
        snprintf(t, sizeof t, "[0-9]{%d}", n);
        rb_add(b, t);
        return;
    }
    if (n == 1) {
        snprintf(t, sizeof t, "[%c-%c]", x[0], y[0]);
        rb_add(b, t);
        return;
    }
    if (x[0] == y[0]) {
        snprintf(t, sizeof t, "\"%c\" (", x[0]);
        rb_add(b, t);
        same_len(b, x + 1, y + 1, n - 1);
        rb_add(b, ")");
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n - 1), memset(zeros, '0', (size_t)n - 1);
    snprintf(t, sizeof t, "(\"%c\" (", x[0]);
    rb_add(b, t);
    same_len(b, x + 1, nines, n - 1);
    rb_add(b, "))");
    if (x[0] + 1 <= y[0] - 1) {
        snprintf(t, sizeof t, " | ([%c-%c] [0-9]{%d})", x[0] + 1, y[0] - 1, n - 1);
        rb_add(b, t);
    }
    snprintf(t, sizeof t, " | (\"%c\" (", y[0]);
    rb_add(b, t);
    same_len(b, zeros, y + 1, n - 1);
    rb_add(b, "))");
}

/* The decimal numbers a..b (0 <= a <= b), no leading zeros, as alternatives (each prefixed by
 * " | " but the first when *first). */
static void pos_range(rbuf *b, uint64_t a, uint64_t bb, int *first) {
    char sa[24], sb[24];
    int la = snprintf(sa, sizeof sa, "%llu", (unsigned long long)a), lb = snprintf(sb, sizeof sb, "%llu", (unsigned long long)bb);
    for (int L = la; L <= lb; L++) {
        char x[24], y[24];
        if (L == la) memcpy(x, sa, (size_t)la + 1);
        else { x[0] = '1'; memset(x + 1, '0', (size_t)L - 1); x[L] = 0; }
        if (L == lb) memcpy(y, sb, (size_t)lb + 1);
        else { memset(y, '9', (size_t)L); y[L] = 0; }
        rb_add(b, *first ? "(" : " | (");
        *first = 0;
        same_len(b, x, y, L);
        rb_add(b, ")");
    }
}

/* An integer with minimum / maximum / exclusiveMinimum / exclusiveMaximum (number bounds are
 * rounded inward; |bounds| beyond 2^63 - 1 are clamped). 1 when bounds were present (emitted,
 * or b->rc set), 0 when none. */
static int emit_int_range(sctx *c, const cJSON *s, int r, int from, int to) {
    gbuild *b = c->b;
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    double lo = -9223372036854775807.0, hi = 9223372036854775807.0;
    int any = 0;
    for (int i = 0; i < 4; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, keys[i]);
        if (!v) continue;
        any = 1;
        if (!cJSON_IsNumber(v)) {
            size_t o = ptr_push(c, keys[i]);
            gb_fail(b, cJSON_IsBool(v) ? MS_ERR_UNSUPPORTED : MS_ERR_ARG, "%s JSON Schema \"%s\" (a number is needed) at %s",
                    cJSON_IsBool(v) ? "unsupported: a boolean" : "schema: a non-numeric", keys[i], P(c));
            ptr_pop(c, o);
            return 1;
        }
        double x = v->valuedouble;
        if (i == 0) x = ceil(x);
        else if (i == 1) x = floor(x) + 1;
        else if (i == 2) x = floor(x);
        else x = ceil(x) - 1;
        if (i < 2 && x > lo) lo = x;
        if (i >= 2 && x < hi) hi = x;
    }
    if (!any) return 0;
    if (lo < -9223372036854775807.0) lo = -9223372036854775807.0;
    if (hi > 9223372036854775807.0) hi = 9223372036854775807.0;
    if (lo > hi) return gb_fail(b, MS_ERR_ARG, "schema: no integer lies within the bounds at %s", P(c)), 1;
    int64_t L = lo <= -9223372036854775807.0 ? -INT64_MAX : (int64_t)lo, H = hi >= 9223372036854775807.0 ? INT64_MAX : (int64_t)hi;
    rbuf rb = {0};
    int first = 1;
    if (L < 0) {
        uint64_t m0 = H < 0 ? (uint64_t)(-H) : 1, m1 = (uint64_t)(-L);
        rb_add(&rb, "(\"-\" (");
        int f2 = 1;
        pos_range(&rb, m0, m1, &f2);
        rb_add(&rb, "))");
        first = 0;
    }
    if (H >= 0) pos_range(&rb, L > 0 ? (uint64_t)L : 0, (uint64_t)H, &first);
    if (rb.bad) gb_fail(b, MS_ERR_NOMEM, "grammar: out of memory");
    else gg_emit_expr(b, rb.p, r, from, to);
    free(rb.p);
    return 1;
}

static int emit_type(sctx *c, int t, const cJSON *s, int r, int from, int to) {
    gbuild *b = c->b;
    switch (t) {
    case T_NULL: gb_lit(b, r, from, "null", 4, to); break;
    case T_BOOL:
        gb_lit(b, r, from, "true", 4, to);
        gb_lit(b, r, from, "false", 5, to);
        break;
    case T_INT:
        if (!emit_int_range(c, s, r, from, to)) gb_call(b, r, from, gj_num(b, 1), to);
        break;
    case T_NUM: {
        static const char *const nk[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
        for (int i = 0; i < 4; i++)
            if (cJSON_GetObjectItemCaseSensitive(s, nk[i])) {
                size_t o = ptr_push(c, nk[i]);
                gb_fail(b, MS_ERR_UNSUPPORTED, "unsupported JSON Schema keyword \"%s\" on a number (integers only) at %s", nk[i], P(c));
                ptr_pop(c, o);
                return b->rc;
            }
        gb_call(b, r, from, gj_num(b, 0), to);
        break;
    }
    case T_STR: return emit_string(c, s, r, from, to);
    case T_ARR: return emit_array(c, s, r, from, to);
    case T_OBJ: return emit_object(c, s, r, from, to);
    }
    return b->rc;
}

static int emit(sctx *c, const cJSON *s, int r, int from, int to) {
    gbuild *b = c->b;
    if (b->rc) return b->rc;
    if (cJSON_IsTrue(s)) {
        gb_call(b, r, from, gj_value(b), to);
        return b->rc;
    }
    if (cJSON_IsFalse(s)) return gb_fail(b, MS_ERR_ARG, "schema: false admits no value at %s", P(c));
    if (!cJSON_IsObject(s)) return gb_fail(b, MS_ERR_ARG, "schema: a schema must be an object or a boolean at %s", P(c));
    if (++c->depth > b->o.max_schema_depth) {
        c->depth--;
        return gb_fail(b, MS_ERR_LIMIT, "schema: nested deeper than %d (max_schema_depth) at %s", b->o.max_schema_depth, P(c));
    }
    const cJSON *k;
    int nvalid = 0;
    const char *first_valid = NULL;
    cJSON_ArrayForEach(k, s) {
        if (in_list(k_annotations, k->string)) continue;
        if (!in_list(k_supported, k->string)) {
            size_t o = ptr_push(c, k->string);
            gb_fail(b, MS_ERR_UNSUPPORTED, "unsupported JSON Schema keyword \"%s\" at %s", k->string, P(c));
            ptr_pop(c, o);
            goto out;
        }
        if (!first_valid) first_valid = k->string;
        nvalid++;
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *anyof = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *oneof = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    const cJSON *allof = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    const cJSON *combo = ref ? ref : anyof ? anyof : oneof ? oneof : allof;
    if (combo && nvalid > 1) {
        const char *other = NULL;
        cJSON_ArrayForEach(k, s) if (!in_list(k_annotations, k->string) && strcmp(k->string, combo->string)) {
            other = k->string;
            break;
        }
        size_t o = ptr_push(c, other);
        gb_fail(b, MS_ERR_UNSUPPORTED, "unsupported JSON Schema: \"%s\" beside \"%s\" at %s", other, combo->string, P(c));
        ptr_pop(c, o);
        goto out;
    }
    if (ref) {
        if (!cJSON_IsString(ref)) {
            size_t o = ptr_push(c, "$ref");
            gb_fail(b, MS_ERR_ARG, "schema: \"$ref\" must be a string at %s", P(c));
            ptr_pop(c, o);
            goto out;
        }
        int rr = ref_rule(c, ref->valuestring);
        if (rr >= 0) gb_call(b, r, from, rr, to);
        goto out;
    }
    if (anyof || oneof || allof) {
        const cJSON *arr = combo;
        if (!cJSON_IsArray(arr) || !cJSON_GetArraySize(arr)) {
            size_t o = ptr_push(c, arr->string);
            gb_fail(b, MS_ERR_ARG, "schema: \"%s\" must be a non-empty array at %s", arr->string, P(c));
            ptr_pop(c, o);
            goto out;
        }
        if (allof && cJSON_GetArraySize(arr) != 1) {
            size_t o = ptr_push(c, "allOf");
            gb_fail(b, MS_ERR_UNSUPPORTED, "unsupported JSON Schema: \"allOf\" with more than one schema at %s", P(c));
            ptr_pop(c, o);
            goto out;
        }
        int i = 0;
        cJSON_ArrayForEach(k, arr) {
            size_t o = ptr_push_i(c, arr->string, i++);
            emit(c, k, r, from, to);
            ptr_pop(c, o);
        }
        goto out;
    }
    /* types */
    int types = 0;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (ty) {
        size_t o = ptr_push(c, "type");
        if (cJSON_IsString(ty)) {
            types = type_bit(ty->valuestring);
            if (!types) gb_fail(b, MS_ERR_ARG, "schema: unknown type \"%s\" at %s", ty->valuestring, P(c));
        } else if (cJSON_IsArray(ty) && cJSON_GetArraySize(ty)) {
            cJSON_ArrayForEach(k, ty) {
                int t = cJSON_IsString(k) ? type_bit(k->valuestring) : 0;
                if (!t) {
                    gb_fail(b, MS_ERR_ARG, "schema: unknown type in the type array at %s", P(c));
                    break;
                }
                types |= t;
            }
        } else gb_fail(b, MS_ERR_ARG, "schema: \"type\" must be a string or a non-empty array at %s", P(c));
        ptr_pop(c, o);
        if (b->rc) goto out;
    }
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(s, "nullable");
    if (nl && !cJSON_IsBool(nl)) {
        gb_fail(b, MS_ERR_ARG, "schema: \"nullable\" must be a boolean at %s", P(c));
        goto out;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en || cn) {
        if (en && cn) {
            gb_fail(b, MS_ERR_UNSUPPORTED, "unsupported JSON Schema: \"enum\" beside \"const\" at %s", P(c));
            goto out;
        }
        if (en && (!cJSON_IsArray(en) || !cJSON_GetArraySize(en))) {
            size_t o = ptr_push(c, "enum");
            gb_fail(b, MS_ERR_ARG, "schema: \"enum\" must be a non-empty array at %s", P(c));
            ptr_pop(c, o);
            goto out;
        }
        int tmask = types ? types | (nl && cJSON_IsTrue(nl) ? T_NULL : 0) : 0x7f;
        int any = 0;
        if (cn) {
            if (value_type_ok(cn, tmask)) emit_literal(c, cn, r, from, to), any = 1;
        } else
            cJSON_ArrayForEach(k, en) if (value_type_ok(k, tmask)) emit_literal(c, k, r, from, to), any = 1;
        if (!any) gb_fail(b, MS_ERR_ARG, "schema: no %s value has the schema's type at %s", cn ? "const" : "enum", P(c));
        goto out;
    }
    if (!types) {
        /* infer from the keywords; none: any value */
        static const char *const ko[] = {"properties", "required", "additionalProperties", NULL};
        static const char *const ka[] = {"items", "minItems", "maxItems", NULL};
        static const char *const ks[] = {"minLength", "maxLength", "format", NULL};
        static const char *const kn[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
        cJSON_ArrayForEach(k, s) {
            if (in_list(ko, k->string)) types |= T_OBJ;
            if (in_list(ka, k->string)) types |= T_ARR;
            if (in_list(ks, k->string)) types |= T_STR;
            if (in_list(kn, k->string)) types |= T_NUM;
        }
        if (!types) {
            if (nl && cJSON_IsTrue(nl)) types = 0; /* any value includes null */
            gb_call(b, r, from, gj_value(b), to);
            goto out;
        }
    }
    if (nl && cJSON_IsTrue(nl)) types |= T_NULL;
    if ((types & T_INT) && (types & T_NUM)) types &= ~T_INT;
    for (int t = 1; t <= T_OBJ && !b->rc; t <<= 1)
        if (types & t) emit_type(c, t, s, r, from, to);
out:
    c->depth--;
    return b->rc;
}

int gs_schema_rule(gbuild *b, const char *json, size_t len, int r, const char *what) {
    cJSON *doc = NULL;
    ms_err perr = {0};
    if (ms_json_parse(json, len, what, &doc, &perr)) return gb_fail(b, MS_ERR_FORMAT, "%s", perr.msg);
    sctx c = {0};
    c.b = b;
    c.doc = doc;
    b->r[r].defined = 1;
    emit(&c, doc, r, 0, 1);
    for (int i = 0; i < c.nref; i++) free(c.refp[i]);
    free(c.refp);
    free(c.refr);
    cJSON_Delete(doc);
    return b->rc;
}

int ms_grammar_from_schema(const char *schema_json, size_t len, const ms_grammar_opts *o, ms_grammar **out,
                           ms_err *err) {
    *out = NULL;
    gbuild b;
    gb_init(&b, o, err);
    int root = gb_rule(&b, "root");
    if (root >= 0) gs_schema_rule(&b, schema_json, len, root, "JSON schema");
    int rc = gb_finish(&b, root, out);
    gb_free(&b);
    return rc;
}

int ms_grammar_json(int which, const ms_grammar_opts *o, ms_grammar **out, ms_err *err) {
    *out = NULL;
    gbuild b;
    gb_init(&b, o, err);
    int root = gb_rule(&b, "root");
    if (root >= 0) {
        b.r[root].defined = 1;
        int t = which == MS_GRAMMAR_JSON_VALUE ? gj_value(&b) : gj_object(&b);
        gb_call(&b, root, 0, t, 1);
    }
    int rc = gb_finish(&b, root, out);
    gb_free(&b);
    return rc;
}
