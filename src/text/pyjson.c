#include "text/pyjson.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- textbuf ---------------- */

int ms_textbuf_append(ms_textbuf *b, const char *s, size_t n) {
    if (b->failed) return b->failed;
    if (b->limit && b->len + n > b->limit) {
        b->failed = MS_ERR_LIMIT;
        return b->failed;
    }
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1) nc *= 2;
        char *d = realloc(b->data, nc);
        if (!d) {
            b->failed = MS_ERR_NOMEM;
            return b->failed;
        }
        b->data = d;
        b->cap = nc;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return MS_OK;
}

int ms_textbuf_puts(ms_textbuf *b, const char *s) { return ms_textbuf_append(b, s, strlen(s)); }

void ms_textbuf_free(ms_textbuf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* ---------------- values ---------------- */

ms_py *ms_py_new(ms_py_type t) {
    ms_py *v = calloc(1, sizeof *v);
    if (v) v->type = t;
    return v;
}

ms_py *ms_py_new_str(const char *s, size_t n) {
    ms_py *v = ms_py_new(MS_PY_STR);
    if (!v) return NULL;
    v->s = malloc(n + 1);
    if (!v->s) {
        free(v);
        return NULL;
    }
    if (n) memcpy(v->s, s, n);
    v->s[n] = 0;
    v->slen = n;
    return v;
}

void ms_py_free(ms_py *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        ms_py_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->klens);
    free(v->s);
    free(v);
}

static int grow(ms_py *c) {
    if (c->n < c->cap) return MS_OK;
    size_t nc = c->cap ? c->cap * 2 : 4;
    ms_py **it = realloc(c->items, nc * sizeof *it);
    if (!it) return MS_ERR_NOMEM;
    c->items = it;
    if (c->type == MS_PY_DICT) {
        char **k = realloc(c->keys, nc * sizeof *k);
        if (!k) return MS_ERR_NOMEM;
        c->keys = k;
        size_t *kl = realloc(c->klens, nc * sizeof *kl);
        if (!kl) return MS_ERR_NOMEM;
        c->klens = kl;
    }
    c->cap = nc;
    return MS_OK;
}

int ms_py_list_append(ms_py *l, ms_py *v) {
    if (grow(l)) {
        ms_py_free(v);
        return MS_ERR_NOMEM;
    }
    l->items[l->n++] = v;
    return MS_OK;
}

int ms_py_dict_set(ms_py *d, const char *key, size_t klen, ms_py *v) {
    for (size_t i = 0; i < d->n; i++)
        if (d->klens[i] == klen && memcmp(d->keys[i], key, klen) == 0) {
            ms_py_free(d->items[i]);
            d->items[i] = v;
            return MS_OK;
        }
    char *k = malloc(klen + 1);
    if (!k || grow(d)) {
        free(k);
        ms_py_free(v);
        return MS_ERR_NOMEM;
    }
    memcpy(k, key, klen);
    k[klen] = 0;
    d->keys[d->n] = k;
    d->klens[d->n] = klen;
    d->items[d->n++] = v;
    return MS_OK;
}

ms_py *ms_py_copy(const ms_py *v) {
    ms_py *c;
    switch (v->type) {
    case MS_PY_STR:
    case MS_PY_INT:
        c = ms_py_new_str(v->s, v->slen);
        if (c) c->type = v->type;
        return c;
    case MS_PY_LIST:
    case MS_PY_DICT:
        c = ms_py_new(v->type);
        if (!c) return NULL;
        for (size_t i = 0; i < v->n; i++) {
            ms_py *x = ms_py_copy(v->items[i]);
            if (!x) {
                ms_py_free(c);
                return NULL;
            }
            int st = v->type == MS_PY_LIST ? ms_py_list_append(c, x)
                                           : ms_py_dict_set(c, v->keys[i], v->klens[i], x);
            if (st) {
                ms_py_free(c);
                return NULL;
            }
        }
        return c;
    default:
        c = ms_py_new(v->type);
        if (c) {
            c->b = v->b;
            c->f = v->f;
        }
        return c;
    }
}

ms_py *ms_py_get(const ms_py *d, const char *key) {
    if (!d || d->type != MS_PY_DICT) return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->klens[i] == kl && memcmp(d->keys[i], key, kl) == 0) return d->items[i];
    return NULL;
}

int ms_py_str_eq(const ms_py *v, const char *s) {
    return v && v->type == MS_PY_STR && v->slen == strlen(s) && memcmp(v->s, s, v->slen) == 0;
}

int ms_py_truthy(const ms_py *v) {
    if (!v) return 0;
    switch (v->type) {
    case MS_PY_NULL: return 0;
    case MS_PY_BOOL: return v->b;
    case MS_PY_INT: return strcmp(v->s, "0") != 0;
    case MS_PY_FLOAT: return v->f != 0.0 || isnan(v->f);
    case MS_PY_STR: return v->slen > 0;
    default: return v->n > 0;
    }
}

/* Decode one UTF-8 sequence at s[i] (already validated); returns the code point. */
static uint32_t utf8_at(const unsigned char *s, size_t n, size_t *i) {
    uint32_t c = s[*i];
    int k = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    if (k) c &= 0x3F >> k;
    (*i)++;
    for (int j = 0; j < k && *i < n; j++) c = (c << 6) | (s[(*i)++] & 0x3F);
    return c;
}

/* Python str.isspace() for one code point. */
static int py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

int ms_py_str_has_nonspace(const char *s, size_t n) {
    size_t i = 0;
    while (i < n)
        if (!py_isspace(utf8_at((const unsigned char *)s, n, &i))) return 1;
    return 0;
}

static int key_cmp(const char *a, size_t al, const char *b, size_t bl) {
    /* UTF-8 byte order equals code point order */
    int c = memcmp(a, b, al < bl ? al : bl);
    if (c) return c;
    return al < bl ? -1 : al > bl;
}

void ms_py_deep_sort(ms_py *v) {
    if (!v) return;
    if (v->type == MS_PY_DICT) {
        /* insertion sort: dicts here are small; stable and allocation free */
        for (size_t i = 1; i < v->n; i++) {
            char *k = v->keys[i];
            size_t kl = v->klens[i];
            ms_py *x = v->items[i];
            size_t j = i;
            while (j > 0 && key_cmp(v->keys[j - 1], v->klens[j - 1], k, kl) > 0) {
                v->keys[j] = v->keys[j - 1];
                v->klens[j] = v->klens[j - 1];
                v->items[j] = v->items[j - 1];
                j--;
            }
            v->keys[j] = k;
            v->klens[j] = kl;
            v->items[j] = x;
        }
    }
    if (v->type == MS_PY_DICT || v->type == MS_PY_LIST)
        for (size_t i = 0; i < v->n; i++) ms_py_deep_sort(v->items[i]);
}

/* ---------------- parser ---------------- */

typedef struct {
    const unsigned char *p;
    size_t n, i;
    int max_depth;
    const char *where;
    ms_err *err;
} parser;

static int perr(parser *ps, const char *what) {
    return ms_fail(ps->err, MS_ERR_FORMAT, "%s: %s at byte %zu", ps->where, what, ps->i);
}

static void skip_ws(parser *ps) {
    while (ps->i < ps->n) {
        unsigned char c = ps->p[ps->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        ps->i++;
    }
}

static int lit(parser *ps, const char *w) {
    size_t l = strlen(w);
    if (ps->n - ps->i >= l && memcmp(ps->p + ps->i, w, l) == 0) {
        ps->i += l;
        return 1;
    }
    return 0;
}

static int hex4(parser *ps, uint32_t *out) {
    if (ps->n - ps->i < 4) return 0;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = ps->p[ps->i + k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + d;
    }
    ps->i += 4;
    *out = v;
    return 1;
}

static void put_utf8(ms_textbuf *b, uint32_t c) {
    char t[4];
    size_t n;
    if (c < 0x80) t[0] = c, n = 1;
    else if (c < 0x800) t[0] = 0xC0 | (c >> 6), t[1] = 0x80 | (c & 0x3F), n = 2;
    else if (c < 0x10000)
        t[0] = 0xE0 | (c >> 12), t[1] = 0x80 | ((c >> 6) & 0x3F), t[2] = 0x80 | (c & 0x3F), n = 3;
    else
        t[0] = 0xF0 | (c >> 18), t[1] = 0x80 | ((c >> 12) & 0x3F), t[2] = 0x80 | ((c >> 6) & 0x3F),
        t[3] = 0x80 | (c & 0x3F), n = 4;
    ms_textbuf_append(b, t, n);
}

/* Length of a valid UTF-8 sequence at p[0..n), 0 if invalid. */
static size_t utf8_valid(const unsigned char *p, size_t n) {
    unsigned char c = p[0];
    if (c < 0x80) return 1;
    size_t k;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) k = 2, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) k = 3, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) k = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (n < k) return 0;
    for (size_t j = 1; j < k; j++) {
        if ((p[j] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k;
}

static int parse_string(parser *ps, char **out, size_t *olen) {
    ms_textbuf b = {0};
    ps->i++; /* opening quote */
    for (;;) {
        if (ps->i >= ps->n) {
            ms_textbuf_free(&b);
            return perr(ps, "unterminated string");
        }
        unsigned char c = ps->p[ps->i];
        if (c == '"') {
            ps->i++;
            break;
        }
        if (c < 0x20) {
            ms_textbuf_free(&b);
            return perr(ps, "control character in string");
        }
        if (c == '\\') {
            ps->i++;
            if (ps->i >= ps->n) {
                ms_textbuf_free(&b);
                return perr(ps, "unterminated escape");
            }
            c = ps->p[ps->i++];
            const char *rep = NULL;
            switch (c) {
            case '"': rep = "\""; break;
            case '\\': rep = "\\"; break;
            case '/': rep = "/"; break;
            case 'b': rep = "\b"; break;
            case 'f': rep = "\f"; break;
            case 'n': rep = "\n"; break;
            case 'r': rep = "\r"; break;
            case 't': rep = "\t"; break;
            case 'u': {
                uint32_t u, lo;
                if (!hex4(ps, &u)) {
                    ms_textbuf_free(&b);
                    return perr(ps, "invalid \\u escape");
                }
                if (u >= 0xD800 && u <= 0xDBFF) {
                    size_t save = ps->i;
                    if (ps->n - ps->i >= 2 && ps->p[ps->i] == '\\' && ps->p[ps->i + 1] == 'u') {
                        ps->i += 2;
                        if (hex4(ps, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
                            put_utf8(&b, 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00));
                            continue;
                        }
                    }
                    ps->i = save;
                    ms_textbuf_free(&b);
                    return perr(ps, "lone UTF-16 surrogate in \\u escape");
                }
                if (u >= 0xDC00 && u <= 0xDFFF) {
                    ms_textbuf_free(&b);
                    return perr(ps, "lone UTF-16 surrogate in \\u escape");
                }
                put_utf8(&b, u);
                continue;
            }
            default:
                ms_textbuf_free(&b);
                return perr(ps, "invalid escape");
            }
            ms_textbuf_append(&b, rep, 1);
            continue;
        }
        size_t k = utf8_valid(ps->p + ps->i, ps->n - ps->i);
        if (!k) {
            ms_textbuf_free(&b);
            return perr(ps, "invalid UTF-8");
        }
        ms_textbuf_append(&b, (const char *)ps->p + ps->i, k);
        ps->i += k;
    }
    if (b.failed || ms_textbuf_append(&b, "", 0)) {
        ms_textbuf_free(&b);
        return ms_fail(ps->err, MS_ERR_NOMEM, "%s: out of memory", ps->where);
    }
    *out = b.data;
    *olen = b.len;
    return MS_OK;
}

static int parse_number(parser *ps, ms_py **out) {
    size_t s = ps->i;
    const unsigned char *p = ps->p;
    size_t i = ps->i;
    if (i < ps->n && p[i] == '-') i++;
    if (i >= ps->n || !(p[i] >= '0' && p[i] <= '9')) return perr(ps, "invalid value");
    if (p[i] == '0') i++;
    else
        while (i < ps->n && p[i] >= '0' && p[i] <= '9') i++;
    int is_float = 0;
    if (i + 1 < ps->n && p[i] == '.' && p[i + 1] >= '0' && p[i + 1] <= '9') {
        is_float = 1;
        i++;
        while (i < ps->n && p[i] >= '0' && p[i] <= '9') i++;
    }
    if (i < ps->n && (p[i] == 'e' || p[i] == 'E')) {
        size_t j = i + 1;
        if (j < ps->n && (p[j] == '+' || p[j] == '-')) j++;
        if (j < ps->n && p[j] >= '0' && p[j] <= '9') {
            while (j < ps->n && p[j] >= '0' && p[j] <= '9') j++;
            is_float = 1;
            i = j;
        }
    }
    ps->i = i;
    size_t n = i - s;
    ms_py *v;
    if (is_float) {
        char tmp[512];
        char *heap = NULL, *t = tmp;
        if (n + 1 > sizeof tmp) {
            heap = malloc(n + 1);
            if (!heap) return ms_fail(ps->err, MS_ERR_NOMEM, "%s: out of memory", ps->where);
            t = heap;
        }
        memcpy(t, p + s, n);
        t[n] = 0;
        v = ms_py_new(MS_PY_FLOAT);
        if (v) v->f = strtod(t, NULL);
        free(heap);
    } else if (n == 2 && p[s] == '-' && p[s + 1] == '0') {
        v = ms_py_new_str("0", 1);
        if (v) v->type = MS_PY_INT;
    } else {
        v = ms_py_new_str((const char *)p + s, n);
        if (v) v->type = MS_PY_INT;
    }
    if (!v) return ms_fail(ps->err, MS_ERR_NOMEM, "%s: out of memory", ps->where);
    *out = v;
    return MS_OK;
}

static int parse_value(parser *ps, int depth, ms_py **out);

static int parse_container(parser *ps, int depth, ms_py **out) {
    int is_dict = ps->p[ps->i] == '{';
    if (depth >= ps->max_depth)
        return ms_fail(ps->err, MS_ERR_LIMIT, "%s: JSON nested deeper than %d at byte %zu", ps->where,
                       ps->max_depth, ps->i);
    ms_py *c = ms_py_new(is_dict ? MS_PY_DICT : MS_PY_LIST);
    if (!c) return ms_fail(ps->err, MS_ERR_NOMEM, "%s: out of memory", ps->where);
    ps->i++;
    skip_ws(ps);
    char close = is_dict ? '}' : ']';
    if (ps->i < ps->n && ps->p[ps->i] == close) {
        ps->i++;
        *out = c;
        return MS_OK;
    }
    for (;;) {
        char *key = NULL;
        size_t klen = 0;
        int st;
        if (is_dict) {
            skip_ws(ps);
            if (ps->i >= ps->n || ps->p[ps->i] != '"') {
                ms_py_free(c);
                return perr(ps, "expected a string key");
            }
            if ((st = parse_string(ps, &key, &klen))) {
                ms_py_free(c);
                return st;
            }
            skip_ws(ps);
            if (ps->i >= ps->n || ps->p[ps->i] != ':') {
                free(key);
                ms_py_free(c);
                return perr(ps, "expected ':'");
            }
            ps->i++;
        }
        ms_py *v = NULL;
        if ((st = parse_value(ps, depth + 1, &v))) {
            free(key);
            ms_py_free(c);
            return st;
        }
        st = is_dict ? ms_py_dict_set(c, key, klen, v) : ms_py_list_append(c, v);
        free(key);
        if (st) {
            ms_py_free(c);
            return ms_fail(ps->err, MS_ERR_NOMEM, "%s: out of memory", ps->where);
        }
        skip_ws(ps);
        if (ps->i < ps->n && ps->p[ps->i] == ',') {
            ps->i++;
            continue;
        }
        if (ps->i < ps->n && ps->p[ps->i] == close) {
            ps->i++;
            *out = c;
            return MS_OK;
        }
        ms_py_free(c);
        return perr(ps, is_dict ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int parse_value(parser *ps, int depth, ms_py **out) {
    skip_ws(ps);
    if (ps->i >= ps->n) return perr(ps, "expected a value");
    unsigned char c = ps->p[ps->i];
    ms_py *v = NULL;
    if (c == '{' || c == '[') return parse_container(ps, depth, out);
    if (c == '"') {
        char *s;
        size_t n;
        int st = parse_string(ps, &s, &n);
        if (st) return st;
        v = ms_py_new(MS_PY_STR);
        if (!v) {
            free(s);
            return ms_fail(ps->err, MS_ERR_NOMEM, "%s: out of memory", ps->where);
        }
        v->s = s;
        v->slen = n;
    } else if (lit(ps, "null")) {
        v = ms_py_new(MS_PY_NULL);
    } else if (lit(ps, "true") || lit(ps, "false")) {
        v = ms_py_new(MS_PY_BOOL);
        if (v) v->b = c == 't';
    } else if (lit(ps, "NaN")) {
        v = ms_py_new(MS_PY_FLOAT);
        if (v) v->f = NAN;
    } else if (lit(ps, "Infinity")) {
        v = ms_py_new(MS_PY_FLOAT);
        if (v) v->f = INFINITY;
    } else if (lit(ps, "-Infinity")) {
        v = ms_py_new(MS_PY_FLOAT);
        if (v) v->f = -INFINITY;
    } else {
        return parse_number(ps, out);
    }
    if (!v) return ms_fail(ps->err, MS_ERR_NOMEM, "%s: out of memory", ps->where);
    *out = v;
    return MS_OK;
}

int ms_py_parse(const char *text, size_t len, int max_depth, const char *where, ms_py **out,
                ms_err *err) {
    parser ps = {(const unsigned char *)text, len, 0, max_depth, where ? where : "JSON", err};
    ms_py *v = NULL;
    int st = parse_value(&ps, 0, &v);
    if (st) return st;
    skip_ws(&ps);
    if (ps.i != ps.n) {
        ms_py_free(v);
        return perr(&ps, "extra data after the JSON value");
    }
    *out = v;
    return MS_OK;
}

/* ---------------- printing ---------------- */

void ms_py_float_repr(double f, char out[32]) {
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f < 0 ? "-inf" : "inf");
        return;
    }
    /* shortest round-tripping digits, then Python's layout rules */
    char e[40];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, f);
        if (strtod(e, NULL) == f) break;
    }
    if (prec == 17) snprintf(e, sizeof e, "%.16e", f);
    /* e = [-]D[.DDD]e(+|-)XX */
    const char *p = e;
    int neg = 0;
    if (*p == '-') neg = 1, p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int exp10 = atoi(p + 1);
    int decpt = exp10 + 1; /* value = 0.DIGITS * 10^decpt */
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int k = 0; k < -decpt; k++) *o++ = '0';
            for (int k = 0; k < nd; k++) *o++ = digits[k];
        } else {
            for (int k = 0; k < decpt; k++) *o++ = k < nd ? digits[k] : '0';
            *o++ = '.';
            if (nd > decpt)
                for (int k = decpt; k < nd; k++) *o++ = digits[k];
            else
                *o++ = '0';
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int k = 1; k < nd; k++) *o++ = digits[k];
        }
        snprintf(o, 32 - (size_t)(o - out), "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

static void dump_str(ms_textbuf *b, const char *s, size_t n) {
    ms_textbuf_append(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        const char *esc = NULL;
        char u[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", c);
            esc = u;
        }
        if (esc) {
            ms_textbuf_append(b, s + i - run, run);
            run = 0;
            ms_textbuf_puts(b, esc);
        } else {
            run++;
        }
    }
    ms_textbuf_append(b, s + n - run, run);
    ms_textbuf_append(b, "\"", 1);
}

int ms_py_dumps(ms_textbuf *b, const ms_py *v, int compact) {
    const char *isep = compact ? "," : ", ";
    const char *ksep = compact ? ":" : ": ";
    char f[32];
    switch (v->type) {
    case MS_PY_NULL: ms_textbuf_puts(b, "null"); break;
    case MS_PY_BOOL: ms_textbuf_puts(b, v->b ? "true" : "false"); break;
    case MS_PY_INT: ms_textbuf_append(b, v->s, v->slen); break;
    case MS_PY_FLOAT:
        if (isnan(v->f)) ms_textbuf_puts(b, "NaN");
        else if (isinf(v->f)) ms_textbuf_puts(b, v->f < 0 ? "-Infinity" : "Infinity");
        else {
            ms_py_float_repr(v->f, f);
            ms_textbuf_puts(b, f);
        }
        break;
    case MS_PY_STR: dump_str(b, v->s, v->slen); break;
    case MS_PY_LIST:
        ms_textbuf_append(b, "[", 1);
        for (size_t i = 0; i < v->n; i++) {
            if (i) ms_textbuf_puts(b, isep);
            ms_py_dumps(b, v->items[i], compact);
        }
        ms_textbuf_append(b, "]", 1);
        break;
    case MS_PY_DICT:
        ms_textbuf_append(b, "{", 1);
        for (size_t i = 0; i < v->n; i++) {
            if (i) ms_textbuf_puts(b, isep);
            dump_str(b, v->keys[i], v->klens[i]);
            ms_textbuf_puts(b, ksep);
            ms_py_dumps(b, v->items[i], compact);
        }
        ms_textbuf_append(b, "}", 1);
        break;
    }
    return b->failed;
}

int ms_py_str(ms_textbuf *b, const ms_py *v, const char *what, ms_err *err) {
    char f[32];
    switch (v->type) {
    case MS_PY_NULL: ms_textbuf_puts(b, "None"); break;
    case MS_PY_BOOL: ms_textbuf_puts(b, v->b ? "True" : "False"); break;
    case MS_PY_INT:
    case MS_PY_STR: ms_textbuf_append(b, v->s, v->slen); break;
    case MS_PY_FLOAT:
        ms_py_float_repr(v->f, f);
        ms_textbuf_puts(b, f);
        break;
    default:
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s is a %s; only strings, numbers, booleans and null "
                       "can be written as text here", what, v->type == MS_PY_LIST ? "list" : "dict");
    }
    if (b->failed) return ms_fail(err, b->failed, "%s: output buffer failed", what);
    return MS_OK;
}
