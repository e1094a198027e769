/* jinja_value.c — arena, values with Python semantics, str/repr, JSON in and out. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

const jv JV_UNDEFINED = {.t = JV_UNDEF};

/* ---------------- arena + errors ---------------- */

void jfail(jtrap *t, int code, int line, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (t->err) {
        if (line > 0) ms_fail(t->err, code, "template line %d: %s", line, msg);
        else ms_fail(t->err, code, "template: %s", msg);
    }
    t->code = code;
    longjmp(t->jb, 1);
}

void *ja_alloc(jtrap *t, size_t n) {
    n = (n + 15) & ~(size_t)15;
    ja_block *b = t->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (1u << 16) ? n : (1u << 16);
        if (t->cap && t->total + cap > t->cap)
            jfail(t, MS_ERR_LIMIT, 0, "working memory limit of %zu bytes exceeded", t->cap);
        ja_block *nb = malloc(sizeof(ja_block) + cap);
        if (!nb) jfail(t, MS_ERR_NOMEM, 0, "out of memory (%zu bytes)", cap);
        t->total += cap;
        nb->cap = cap;
        nb->used = 0;
        if (b && n > (1u << 16)) { /* big block: keep the current one for small allocations */
            nb->next = b->next;
            b->next = nb;
            nb->used = n;
            memset(nb->data, 0, n);
            return nb->data;
        }
        nb->next = b;
        t->blocks = b = nb;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void *ja_grow(jtrap *t, void *p, size_t old, size_t n) {
    void *q = ja_alloc(t, n);
    if (p && old) memcpy(q, p, old < n ? old : n);
    return q;
}

char *ja_strndup(jtrap *t, const char *s, size_t n) {
    char *p = ja_alloc(t, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void ja_free_all(jtrap *t) {
    ja_block *b = t->blocks;
    while (b) {
        ja_block *n = b->next;
        free(b);
        b = n;
    }
    t->blocks = NULL;
    t->total = 0;
}

/* ---------------- constructors ---------------- */

jv jv_str(jtrap *t, const char *s, size_t n) {
    jstr *x = ja_alloc(t, sizeof(jstr) + n + 1);
    x->len = n;
    if (n) memcpy(x->s, s, n);
    x->s[n] = 0;
    jv v = {.t = JV_STR, .s = x};
    return v;
}
jv jv_cstr(jtrap *t, const char *s) { return jv_str(t, s, strlen(s)); }

jv jv_list(jtrap *t, size_t cap) {
    jlist *l = ja_alloc(t, sizeof *l);
    l->cap = cap ? cap : 4;
    l->v = ja_alloc(t, l->cap * sizeof(jv));
    jv v = {.t = JV_LIST, .l = l};
    return v;
}
jv jv_tuple(jtrap *t, size_t cap) {
    jv v = jv_list(t, cap);
    v.l->tuple = 1;
    return v;
}
void jl_push(jtrap *t, jlist *l, jv x) {
    if (l->n == l->cap) {
        size_t nc = l->cap * 2;
        l->v = ja_grow(t, l->v, l->cap * sizeof(jv), nc * sizeof(jv));
        l->cap = nc;
    }
    l->v[l->n++] = x;
}
jv jv_dict(jtrap *t) {
    jdict *d = ja_alloc(t, sizeof *d);
    jv v = {.t = JV_DICT, .d = d};
    return v;
}
jv jv_ns(jtrap *t) {
    jv v = jv_dict(t);
    v.t = JV_NS;
    return v;
}

jv *jd_get(jdict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], key)) return &d->v[i];
    return NULL;
}
jv *jd_gets(jdict *d, const char *key) {
    size_t kl = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].s->len == kl && !memcmp(d->k[i].s->s, key, kl)) return &d->v[i];
    return NULL;
}
void jd_set(jtrap *t, jdict *d, jv key, jv val) {
    jv *p = jd_get(d, key);
    if (p) { *p = val; return; }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        d->k = ja_grow(t, d->k, d->cap * sizeof(jv), nc * sizeof(jv));
        d->v = ja_grow(t, d->v, d->cap * sizeof(jv), nc * sizeof(jv));
        d->cap = nc;
    }
    d->k[d->n] = key;
    d->v[d->n++] = val;
}

/* ---------------- Python semantics ---------------- */

int jv_truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0.0;
    case JV_STR: return v.s->len != 0;
    case JV_LIST: return v.l->n != 0;
    case JV_DICT: return v.d->n != 0;
    default: return 1;
    }
}
int jv_is_num(jv v) { return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT; }
double jv_num(jv v) { return v.t == JV_FLOAT ? v.f : (double)v.i; }

int jv_eq(jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return a.i == b.i;
        return jv_num(a) == jv_num(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a.s->len == b.s->len && !memcmp(a.s->s, b.s->s, a.s->len);
    case JV_LIST:
        if (a.l->tuple != b.l->tuple || a.l->n != b.l->n) return 0;
        for (size_t i = 0; i < a.l->n; i++)
            if (!jv_eq(a.l->v[i], b.l->v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a.d->n != b.d->n) return 0;
        for (size_t i = 0; i < a.d->n; i++) {
            jv *o = jd_get(b.d, a.d->k[i]);
            if (!o || !jv_eq(a.d->v[i], *o)) return 0;
        }
        return 1;
    case JV_FUNC: return a.fn == b.fn;
    case JV_NS: return a.d == b.d;
    case JV_LOOP: return a.lp == b.lp;
    }
    return 0;
}

const char *jv_type_name(jv v) {
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_FUNC: return "function";
    case JV_NS: return "Namespace";
    case JV_LOOP: return "LoopContext";
    }
    return "?";
}

int jv_cmp(jtrap *t, int line, jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return a.i < b.i ? -1 : a.i > b.i;
        double x = jv_num(a), y = jv_num(b);
        if (x != x || y != y) return 2; /* NaN: every ordering is false */
        return x < y ? -1 : x > y;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.s->len < b.s->len ? a.s->len : b.s->len;
        int c = memcmp(a.s->s, b.s->s, n); /* UTF-8 byte order == code point order */
        if (c) return c < 0 ? -1 : 1;
        return a.s->len < b.s->len ? -1 : a.s->len > b.s->len;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.l->tuple == b.l->tuple) {
        size_t n = a.l->n < b.l->n ? a.l->n : b.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_eq(a.l->v[i], b.l->v[i])) continue;
            return jv_cmp(t, line, a.l->v[i], b.l->v[i]);
        }
        return a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
    }
    jfail(t, MS_ERR_FORMAT, line, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a),
          jv_type_name(b));
}

/* ---------------- buffers ---------------- */

void jb_init(jbuf *b, jtrap *t, size_t max) {
    b->t = t;
    b->p = NULL;
    b->n = b->cap = 0;
    b->max = max;
}
void jb_put(jbuf *b, const char *s, size_t n) {
    if (!n) return;
    if (b->max && b->n + n > b->max)
        jfail(b->t, MS_ERR_LIMIT, 0, "output larger than the limit of %zu bytes", b->max);
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->n + n + 1) nc *= 2;
        b->p = ja_grow(b->t, b->p, b->n, nc);
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }
void jb_putc(jbuf *b, char c) { jb_put(b, &c, 1); }
jv jb_take(jbuf *b) {
    jstr *x = ja_alloc(b->t, sizeof(jstr) + b->n + 1);
    x->len = b->n;
    if (b->n) memcpy(x->s, b->p, b->n);
    x->s[b->n] = 0;
    jv v = {.t = JV_STR, .s = x};
    return v;
}

/* ---------------- UTF-8 ---------------- */

int u8_decode(const char *s, size_t n, size_t *i) {
    const unsigned char *p = (const unsigned char *)s;
    size_t k = *i;
    unsigned c = p[k];
    if (c < 0x80) { *i = k + 1; return c; }
    int need = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (need < 0 || c > 0xF4 || k + (size_t)need >= n) { *i = k + 1; return 0xFFFD; }
    uint32_t cp = c & (0x3F >> need);
    for (int j = 1; j <= need; j++) {
        unsigned d = p[k + j];
        if ((d & 0xC0) != 0x80) { *i = k + 1; return 0xFFFD; }
        cp = (cp << 6) | (d & 0x3F);
    }
    *i = k + need + 1;
    return (int)cp;
}

size_t u8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}
size_t u8_offset(const char *s, size_t n, size_t cp) {
    size_t c = 0, i = 0;
    for (; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == cp) return i;
            c++;
        }
    }
    return n;
}
void u8_encode(jbuf *b, uint32_t cp) {
    char o[4];
    if (cp < 0x80) { o[0] = (char)cp; jb_put(b, o, 1); }
    else if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); jb_put(b, o, 2); }
    else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        jb_put(b, o, 3);
    } else {
        o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
        jb_put(b, o, 4);
    }
}
int py_isspace(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---------------- str / repr ---------------- */

void py_float_repr(double f, char *out, size_t cap) {
    if (f != f) { snprintf(out, cap, "nan"); return; }
    if (isinf(f)) { snprintf(out, cap, f < 0 ? "-inf" : "inf"); return; }
    char buf[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf = [-]d.ddde[+-]XX ; collect digits and exponent */
    char digits[32];
    int nd = 0, neg = 0;
    const char *q = buf;
    if (*q == '-') { neg = 1; q++; }
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    int e = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char *o = out;
    size_t left = cap;
#define PUT(...) do { int w_ = snprintf(o, left, __VA_ARGS__); if (w_ < 0 || (size_t)w_ >= left) return; o += w_; left -= w_; } while (0)
    if (neg) PUT("-");
    if (e < -4 || e >= 16) {
        PUT("%c", digits[0]);
        if (nd > 1) PUT(".%s", digits + 1);
        PUT("e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else if (e < 0) {
        PUT("0.");
        for (int i = 0; i < -e - 1; i++) PUT("0");
        PUT("%s", digits);
    } else {
        for (int i = 0; i <= e; i++) PUT("%c", i < nd ? digits[i] : '0');
        PUT(".");
        if (nd > e + 1) PUT("%s", digits + e + 1);
        else PUT("0");
    }
#undef PUT
}

static void write_str_repr(jbuf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    jb_putc(b, q);
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        int c = u8_decode(s, n, &i);
        char e[16];
        if (c == q || c == '\\') { e[0] = '\\'; e[1] = (char)c; jb_put(b, e, 2); }
        else if (c == '\n') jb_puts(b, "\\n");
        else if (c == '\r') jb_puts(b, "\\r");
        else if (c == '\t') jb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xA0) || c == 0xAD) {
            snprintf(e, sizeof e, "\\x%02x", c);
            jb_puts(b, e);
        } else if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F) ||
                   c == 0xFEFF || c == 0x3000 || c == 0x1680 || (c >= 0xD800 && c <= 0xDFFF)) {
            if (c == 0x2010 || (c >= 0x2011 && c <= 0x2027 && c != 0x2028)) jb_put(b, s + st, i - st);
            else { snprintf(e, sizeof e, "\\u%04x", c); jb_puts(b, e); }
        } else jb_put(b, s + st, i - st);
    }
    jb_putc(b, q);
}

static void write_seq(jbuf *b, jv v, int repr_items) {
    (void)repr_items;
    if (v.t == JV_LIST) {
        jb_putc(b, v.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jb_puts(b, ", ");
            jv_write_repr(b, v.l->v[i]);
        }
        if (v.l->tuple && v.l->n == 1) jb_putc(b, ',');
        jb_putc(b, v.l->tuple ? ')' : ']');
    } else {
        jb_putc(b, '{');
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) jb_puts(b, ", ");
            jv_write_repr(b, v.d->k[i]);
            jb_puts(b, ": ");
            jv_write_repr(b, v.d->v[i]);
        }
        jb_putc(b, '}');
    }
}

void jv_write_str(jbuf *b, jv v) {
    char tmp[64];
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_puts(b, "None"); return;
    case JV_BOOL: jb_puts(b, v.i ? "True" : "False"); return;
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v.i); jb_puts(b, tmp); return;
    case JV_FLOAT: py_float_repr(v.f, tmp, sizeof tmp); jb_puts(b, tmp); return;
    case JV_STR: jb_put(b, v.s->s, v.s->len); return;
    case JV_LIST: case JV_DICT: write_seq(b, v, 1); return;
    case JV_NS:
        jb_puts(b, "<Namespace ");
        { jv d = v; d.t = JV_DICT; write_seq(b, d, 1); }
        jb_puts(b, ">");
        return;
    case JV_FUNC: jb_puts(b, "<function>"); return;
    case JV_LOOP: jb_puts(b, "<LoopContext>"); return;
    }
}

void jv_write_repr(jbuf *b, jv v) {
    if (v.t == JV_STR) write_str_repr(b, v.s->s, v.s->len);
    else if (v.t == JV_UNDEF) jb_puts(b, "Undefined");
    else jv_write_str(b, v);
}

jv jv_to_str(jtrap *t, jv v) {
    if (v.t == JV_STR) return v;
    jbuf b;
    jb_init(&b, t, 0);
    jv_write_str(&b, v);
    return jb_take(&b);
}

/* ---------------- JSON out (Python json.dumps) ---------------- */

static void json_str(jbuf *b, const char *s, size_t n, int ensure_ascii) {
    jb_putc(b, '"');
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        unsigned char c0 = (unsigned char)s[i];
        char e[16];
        if (c0 < 0x80) {
            i++;
            switch (c0) {
            case '"': jb_puts(b, "\\\""); break;
            case '\\': jb_puts(b, "\\\\"); break;
            case '\n': jb_puts(b, "\\n"); break;
            case '\r': jb_puts(b, "\\r"); break;
            case '\t': jb_puts(b, "\\t"); break;
            case '\b': jb_puts(b, "\\b"); break;
            case '\f': jb_puts(b, "\\f"); break;
            default:
                if (c0 < 0x20) { snprintf(e, sizeof e, "\\u%04x", c0); jb_puts(b, e); }
                else jb_putc(b, (char)c0);
            }
            continue;
        }
        int c = u8_decode(s, n, &i);
        if (!ensure_ascii) { jb_put(b, s + st, i - st); continue; }
        if (c >= 0x10000) {
            unsigned v = (unsigned)c - 0x10000;
            snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        } else snprintf(e, sizeof e, "\\u%04x", c);
        jb_puts(b, e);
    }
    jb_putc(b, '"');
}

static void json_indent(jbuf *b, const jjson_opts *o, int level) {
    jb_putc(b, '\n');
    for (int i = 0; i < level; i++) jb_puts(b, o->indent);
}

static jv json_key(jtrap *t, int line, jv k) {
    char tmp[64];
    switch (k.t) {
    case JV_STR: return k;
    case JV_BOOL: return jv_cstr(t, k.i ? "true" : "false");
    case JV_NONE: return jv_cstr(t, "null");
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)k.i); return jv_cstr(t, tmp);
    case JV_FLOAT:
        if (k.f != k.f) return jv_cstr(t, "NaN");
        if (isinf(k.f)) return jv_cstr(t, k.f < 0 ? "-Infinity" : "Infinity");
        py_float_repr(k.f, tmp, sizeof tmp);
        return jv_cstr(t, tmp);
    default: jfail(t, MS_ERR_FORMAT, line, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

void jv_write_json(jtrap *t, int line, jbuf *b, jv v, const jjson_opts *o, int level) {
    char tmp[64];
    if (level > 512) jfail(t, MS_ERR_LIMIT, line, "tojson: nesting too deep");
    switch (v.t) {
    case JV_NONE: jb_puts(b, "null"); return;
    case JV_BOOL: jb_puts(b, v.i ? "true" : "false"); return;
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v.i); jb_puts(b, tmp); return;
    case JV_FLOAT:
        if (v.f != v.f) jb_puts(b, "NaN");
        else if (isinf(v.f)) jb_puts(b, v.f < 0 ? "-Infinity" : "Infinity");
        else { py_float_repr(v.f, tmp, sizeof tmp); jb_puts(b, tmp); }
        return;
    case JV_STR: json_str(b, v.s->s, v.s->len, o->ensure_ascii); return;
    case JV_LIST:
        if (!v.l->n) { jb_puts(b, "[]"); return; }
        jb_putc(b, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jb_puts(b, o->item_sep);
            if (o->indent) json_indent(b, o, level + 1);
            jv_write_json(t, line, b, v.l->v[i], o, level + 1);
        }
        if (o->indent) json_indent(b, o, level);
        jb_putc(b, ']');
        return;
    case JV_DICT: {
        if (!v.d->n) { jb_puts(b, "{}"); return; }
        size_t n = v.d->n;
        jv *keys = ja_alloc(t, n * sizeof(jv));
        size_t *ord = ja_alloc(t, n * sizeof(size_t));
        for (size_t i = 0; i < n; i++) { keys[i] = json_key(t, line, v.d->k[i]); ord[i] = i; }
        if (o->sort_keys) { /* insertion sort on the original keys (Python sorts the keys as given) */
            for (size_t i = 1; i < n; i++) {
                size_t x = ord[i], j = i;
                while (j > 0 && jv_cmp(t, line, v.d->k[ord[j - 1]], v.d->k[x]) > 0) { ord[j] = ord[j - 1]; j--; }
                ord[j] = x;
            }
        }
        jb_putc(b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i) jb_puts(b, o->item_sep);
            if (o->indent) json_indent(b, o, level + 1);
            json_str(b, keys[ord[i]].s->s, keys[ord[i]].s->len, o->ensure_ascii);
            jb_puts(b, o->key_sep);
            jv_write_json(t, line, b, v.d->v[ord[i]], o, level + 1);
        }
        if (o->indent) json_indent(b, o, level);
        jb_putc(b, '}');
        return;
    }
    default:
        jfail(t, MS_ERR_FORMAT, line, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

/* ---------------- JSON in ---------------- */

typedef struct jp { jtrap *t; const char *s; size_t n, i; int depth; } jp;

_Noreturn static void jp_fail(jp *p, const char *what) {
    jfail(p->t, MS_ERR_FORMAT, 0, "JSON: %s at byte %zu", what, p->i);
}
static void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}
static int hex4(jp *p, unsigned *out) {
    if (p->i + 4 > p->n) return 0;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i + k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return 0;
    }
    p->i += 4;
    *out = v;
    return 1;
}
static jv jp_string(jp *p) {
    jbuf b;
    jb_init(&b, p->t, 0);
    p->i++; /* opening quote */
    for (;;) {
        if (p->i >= p->n) jp_fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') { p->i++; break; }
        if (c < 0x20) jp_fail(p, "control character in string");
        if (c != '\\') {
            size_t st = p->i;
            while (p->i < p->n && p->s[p->i] != '"' && p->s[p->i] != '\\' && (unsigned char)p->s[p->i] >= 0x20) p->i++;
            jb_put(&b, p->s + st, p->i - st);
            continue;
        }
        p->i++;
        if (p->i >= p->n) jp_fail(p, "bad escape");
        char e = p->s[p->i++];
        switch (e) {
        case '"': jb_putc(&b, '"'); break;
        case '\\': jb_putc(&b, '\\'); break;
        case '/': jb_putc(&b, '/'); break;
        case 'b': jb_putc(&b, '\b'); break;
        case 'f': jb_putc(&b, '\f'); break;
        case 'n': jb_putc(&b, '\n'); break;
        case 'r': jb_putc(&b, '\r'); break;
        case 't': jb_putc(&b, '\t'); break;
        case 'u': {
            unsigned u;
            if (!hex4(p, &u)) jp_fail(p, "bad \\u escape");
            if (u >= 0xD800 && u < 0xDC00 && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                size_t save = p->i;
                unsigned lo;
                p->i += 2;
                if (hex4(p, &lo) && lo >= 0xDC00 && lo < 0xE000) u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                else p->i = save;
            }
            if (u >= 0xD800 && u < 0xE000) u = 0xFFFD; /* lone surrogate: not representable in UTF-8 */
            u8_encode(&b, u);
            break;
        }
        default: jp_fail(p, "bad escape");
        }
    }
    return jb_take(&b);
}
static jv jp_value(jp *p);
static jv jp_number(jp *p) {
    size_t st = p->i;
    int isf = 0;
    if (p->s[p->i] == '-') p->i++;
    if (p->i >= p->n || !(p->s[p->i] >= '0' && p->s[p->i] <= '9')) jp_fail(p, "bad number");
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c >= '0' && c <= '9') p->i++;
        else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') { isf |= c == '.' || c == 'e' || c == 'E'; p->i++; }
        else break;
    }
    char tmp[128];
    size_t l = p->i - st;
    if (l >= sizeof tmp) jp_fail(p, "number too long");
    memcpy(tmp, p->s + st, l);
    tmp[l] = 0;
    char *end;
    if (!isf) {
        errno = 0;
        long long v = strtoll(tmp, &end, 10);
        if (*end) jp_fail(p, "bad number");
        if (errno == 0) return jv_int(v);
    }
    double d = strtod(tmp, &end);
    if (*end) jp_fail(p, "bad number");
    return jv_float(d);
}
static int jp_lit(jp *p, const char *w) {
    size_t l = strlen(w);
    if (p->i + l <= p->n && !memcmp(p->s + p->i, w, l)) { p->i += l; return 1; }
    return 0;
}
static jv jp_value(jp *p) {
    jp_ws(p);
    if (p->i >= p->n) jp_fail(p, "unexpected end");
    char c = p->s[p->i];
    if (c == '{' || c == '[') {
        if (++p->depth > 256) jp_fail(p, "nesting deeper than 256");
        p->i++;
        jv out = c == '{' ? jv_dict(p->t) : jv_list(p->t, 4);
        jp_ws(p);
        char close = c == '{' ? '}' : ']';
        if (p->i < p->n && p->s[p->i] == close) { p->i++; p->depth--; return out; }
        for (;;) {
            if (c == '{') {
                jp_ws(p);
                if (p->i >= p->n || p->s[p->i] != '"') jp_fail(p, "expected a string key");
                jv k = jp_string(p);
                jp_ws(p);
                if (p->i >= p->n || p->s[p->i] != ':') jp_fail(p, "expected ':'");
                p->i++;
                jv v = jp_value(p);
                jd_set(p->t, out.d, k, v);
            } else jl_push(p->t, out.l, jp_value(p));
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
            if (p->i < p->n && p->s[p->i] == close) { p->i++; break; }
            jp_fail(p, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
        p->depth--;
        return out;
    }
    if (c == '"') return jp_string(p);
    if (jp_lit(p, "-Infinity")) return jv_float(-INFINITY);
    if (c == '-' || (c >= '0' && c <= '9')) return jp_number(p);
    if (jp_lit(p, "true")) return jv_bool(1);
    if (jp_lit(p, "false")) return jv_bool(0);
    if (jp_lit(p, "null")) return jv_none();
    if (jp_lit(p, "NaN")) return jv_float(NAN);
    if (jp_lit(p, "Infinity")) return jv_float(INFINITY);
    jp_fail(p, "unexpected character");
}

jv jv_parse_json(jtrap *t, const char *s, size_t n) {
    jp p = {.t = t, .s = s, .n = n};
    jv v = jp_value(&p);
    jp_ws(&p);
    if (p.i != n) jp_fail(&p, "trailing characters");
    return v;
}
