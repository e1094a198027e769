/* jinja_filters.c — Jinja2's builtin filters and tests (the subset chat
 * templates use), with transformers' tojson. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

jv jinja_case(jctx *c, jstr *s, int mode);
jv jinja_strip(jctx *c, jstr *s, jstr *chars, int which);
jv jinja_replace(jctx *c, int line, jstr *s, jstr *old, jstr *nw, int64_t count);

static const char *const FILTERS[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first",
    "float", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min",
    "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "slice", "sort",
    "string", "sum", "title", "tojson", "trim", "truncate", "unique", "upper", "wordcount", "groupby",
    "filesizeformat", "urlencode", NULL};
static const char *const TESTS[] = {
    "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number", "string", "mapping",
    "sequence", "iterable", "callable", "sameas", "escaped", "lower", "upper", "even", "odd", "divisibleby", "eq",
    "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "in",
    "filter", "test", NULL};

static int in_list(const char *const *l, const char *n) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], n)) return 1;
    return 0;
}
int jinja_filter_known(const char *name) { return in_list(FILTERS, name); }
int jinja_test_known(const char *name) { return in_list(TESTS, name); }

static jstr *soft_str(jctx *c, jv v) { return jv_to_str(c->t, v).s; }

static int64_t arg_int(jctx *c, int line, jargs *a, int i, const char *kw, int64_t dflt) {
    jv v;
    if (!jarg(a, i, kw, &v)) return dflt;
    if (v.t == JV_INT || v.t == JV_BOOL) return v.i;
    jfail(c->t, MS_ERR_FORMAT, line, "argument '%s' must be an integer, not %s", kw, jv_type_name(v));
}
static int arg_bool(jargs *a, int i, const char *kw, int dflt) {
    jv v;
    return jarg(a, i, kw, &v) ? jv_truthy(v) : dflt;
}

/* ---------------- attribute paths, ordering ---------------- */

/* environment.getitem over "a.b.0" parts; default replaces Undefined after each part */
static jv attr_path(jctx *c, int line, jv item, jv attribute, jv *dflt) {
    if (attribute.t == JV_NONE || attribute.t == JV_UNDEF) return item;
    if (attribute.t != JV_STR) {
        item = item.t == JV_UNDEF ? item : jinja_getitem(c, line, item, attribute);
        if (dflt && item.t == JV_UNDEF) item = *dflt;
        return item;
    }
    const char *s = attribute.s->s;
    size_t n = attribute.s->len, i = 0;
    while (i <= n) {
        size_t e = i;
        while (e < n && s[e] != '.') e++;
        jv key;
        int digits = e > i;
        for (size_t k = i; k < e; k++)
            if (s[k] < '0' || s[k] > '9') digits = 0;
        if (digits) key = jv_int(strtoll(ja_strndup(c->t, s + i, e - i), NULL, 10));
        else key = jv_str(c->t, s + i, e - i);
        if (item.t == JV_UNDEF) jfail(c->t, MS_ERR_FORMAT, line, "undefined value has no attribute '%s'", attribute.s->s);
        item = jinja_getitem(c, line, item, key);
        if (dflt && item.t == JV_UNDEF) item = *dflt;
        i = e + 1;
    }
    return item;
}

static jv ignore_case(jctx *c, jv v) { return v.t == JV_STR ? jinja_case(c, v.s, 0) : v; }

/* stable merge sort of idx[] by keys[] */
static void msort(jctx *c, int line, jv *keys, size_t *idx, size_t *tmp, size_t n, int reverse) {
    if (n < 2) return;
    size_t h = n / 2;
    msort(c, line, keys, idx, tmp, h, reverse);
    msort(c, line, keys, idx + h, tmp, n - h, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = jv_cmp(c->t, line, keys[idx[j]], keys[idx[i]]);
        if (r == 2) r = 0;
        /* take from the right only when strictly before (stable); reverse keeps stability like Python */
        int take_right = reverse ? r > 0 : r < 0;
        tmp[k++] = take_right ? idx[j++] : idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof(size_t));
}

static size_t *sorted_order(jctx *c, int line, jv *keys, size_t n, int reverse) {
    size_t *idx = ja_alloc(c->t, (n + 1) * sizeof(size_t)), *tmp = ja_alloc(c->t, (n + 1) * sizeof(size_t));
    for (size_t i = 0; i < n; i++) idx[i] = i;
    msort(c, line, keys, idx, tmp, n, reverse);
    return idx;
}

static jv do_len(jctx *c, int line, jv v) {
    switch (v.t) {
    case JV_UNDEF: return jv_int(0);
    case JV_STR: return jv_int((int64_t)u8_count(v.s->s, v.s->len));
    case JV_LIST: return jv_int((int64_t)v.l->n);
    case JV_DICT: return jv_int((int64_t)v.d->n);
    case JV_LOOP: return jv_int(v.lp->length);
    default: jfail(c->t, MS_ERR_FORMAT, line, "object of type '%s' has no len()", jv_type_name(v));
    }
}

static jv copy_list(jctx *c, jlist *l) {
    jv out = jv_list(c->t, l->n + 1);
    for (size_t i = 0; i < l->n; i++) jl_push(c->t, out.l, l->v[i]);
    return out;
}

static double parse_py_float(jctx *c, jstr *s, int *ok) {
    jv t = jinja_strip(c, s, NULL, 3);
    char *buf = ja_alloc(c->t, t.s->len + 1);
    size_t n = 0;
    for (size_t i = 0; i < t.s->len; i++) {
        char ch = t.s->s[i];
        if (ch == '_') {
            if (i == 0 || i + 1 >= t.s->len || !(t.s->s[i - 1] >= '0' && t.s->s[i - 1] <= '9') ||
                !(t.s->s[i + 1] >= '0' && t.s->s[i + 1] <= '9')) { *ok = 0; return 0; }
            continue;
        }
        buf[n++] = ch;
    }
    buf[n] = 0;
    *ok = 0;
    if (!n) return 0;
    /* reject hex floats and C-only spellings strtod accepts */
    for (size_t i = 0; i < n; i++)
        if (buf[i] == 'x' || buf[i] == 'X' || buf[i] == 'p' || buf[i] == 'P') return 0;
    char *end;
    double d = strtod(buf, &end);
    if (*end) return 0;
    const char *p = buf + (buf[0] == '+' || buf[0] == '-');
    if (!strcasecmp(p, "nan") || !strcasecmp(p, "inf") || !strcasecmp(p, "infinity") ||
        (*p >= '0' && *p <= '9') || *p == '.')
        *ok = 1;
    return d;
}

static int parse_py_int(jstr *s, int base, int64_t *out) {
    size_t i = 0, n = s->len;
    const char *p = s->s;
    while (i < n && (p[i] == ' ' || (p[i] >= 9 && p[i] <= 13))) i++;
    while (n > i && (p[n - 1] == ' ' || (p[n - 1] >= 9 && p[n - 1] <= 13))) n--;
    int neg = 0;
    if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    if (i + 1 < n && p[i] == '0' && base != 10) {
        char k = (char)(p[i + 1] | 32);
        if ((base == 16 && k == 'x') || (base == 8 && k == 'o') || (base == 2 && k == 'b')) i += 2;
    }
    if (i >= n) return 0;
    int64_t v = 0;
    int prev_us = 1;
    for (; i < n; i++) {
        char ch = p[i];
        if (ch == '_') { if (prev_us) return 0; prev_us = 1; continue; }
        int d = (ch >= '0' && ch <= '9') ? ch - '0' : ((ch | 32) >= 'a' && (ch | 32) <= 'z') ? (ch | 32) - 'a' + 10 : 99;
        if (d >= base) return 0;
        if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return 0;
        prev_us = 0;
    }
    if (prev_us) return 0;
    *out = neg ? -v : v;
    return 1;
}

static void html_escape(jbuf *b, jstr *s) {
    for (size_t i = 0; i < s->len; i++) {
        char ch = s->s[i];
        switch (ch) {
        case '&': jb_puts(b, "&amp;"); break;
        case '<': jb_puts(b, "&lt;"); break;
        case '>': jb_puts(b, "&gt;"); break;
        case '"': jb_puts(b, "&#34;"); break;
        case '\'': jb_puts(b, "&#39;"); break;
        default: jb_putc(b, ch);
        }
    }
}

static int is_word_cp(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 32) >= 'a' && (cp | 32) <= 'z') || cp == '_';
    if (py_isspace(cp)) return 0;
    if ((cp >= 0x2000 && cp <= 0x206F) || (cp >= 0x3000 && cp <= 0x303F) || (cp >= 0xFF00 && cp <= 0xFF0F) ||
        (cp >= 0xA0 && cp <= 0xBF && cp != 0xAA && cp != 0xB5 && cp != 0xBA && cp != 0xB2 && cp != 0xB3 && cp != 0xB9) ||
        cp == 0xD7 || cp == 0xF7 || (cp >= 0x1F000 && cp <= 0x1FAFF))
        return 0;
    return 1;
}

/* urllib.parse.quote_from_bytes with safe "/" (or "" and '+' for spaces in query strings) */
static void url_quote(jbuf *b, jstr *s, int for_qs) {
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < s->len; i++) {
        unsigned char ch = (unsigned char)s->s[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' ||
            ch == '-' || ch == '~' || (ch == '/' && !for_qs))
            jb_putc(b, (char)ch);
        else if (ch == ' ' && for_qs) jb_putc(b, '+');
        else {
            char e[3] = {'%', hex[ch >> 4], hex[ch & 15]};
            jb_put(b, e, 3);
        }
    }
}

/* ---------------- tojson ---------------- */

static jv do_tojson(jctx *c, int line, jv v, jargs *a) {
    static const char *const kws[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    jargs_check(c, line, "tojson", a, 4, kws);
    jjson_opts o = {0};
    o.ensure_ascii = arg_bool(a, 0, "ensure_ascii", 0);
    o.sort_keys = arg_bool(a, 3, "sort_keys", 0);
    jv ind;
    if (jarg(a, 1, "indent", &ind) && ind.t != JV_NONE) {
        if (ind.t == JV_INT || ind.t == JV_BOOL) {
            int64_t n = ind.i < 0 ? 0 : ind.i;
            if (n > 1000) jfail(c->t, MS_ERR_LIMIT, line, "tojson: indent too large");
            char *sp = ja_alloc(c->t, (size_t)n + 1);
            memset(sp, ' ', (size_t)n);
            o.indent = sp;
        } else if (ind.t == JV_STR) o.indent = ind.s->s;
        else jfail(c->t, MS_ERR_FORMAT, line, "tojson: indent must be an int or a string");
    }
    o.item_sep = o.indent ? "," : ", ";
    o.key_sep = ": ";
    jv sep;
    if (jarg(a, 2, "separators", &sep) && sep.t != JV_NONE) {
        if (sep.t != JV_LIST || sep.l->n != 2 || sep.l->v[0].t != JV_STR || sep.l->v[1].t != JV_STR)
            jfail(c->t, MS_ERR_FORMAT, line, "tojson: separators must be a pair of strings");
        o.item_sep = sep.l->v[0].s->s;
        o.key_sep = sep.l->v[1].s->s;
    }
    jbuf b;
    jb_init(&b, c->t, c->max_output);
    jv_write_json(c->t, line, &b, v, &o, 0);
    return jb_take(&b);
}

/* ---------------- filters ---------------- */

static jv select_reject(jctx *c, int line, jv v, jargs *a, int lookup_attr, int keep_if) {
    jlist *l = jinja_iter(c, line, v);
    jv attr = jv_none();
    int off = 0;
    if (lookup_attr) {
        if (!jarg(a, 0, NULL, &attr)) jfail(c->t, MS_ERR_FORMAT, line, "Missing parameter for attribute name");
        off = 1;
    }
    jv tname;
    int have_test = jarg(a, off, NULL, &tname);
    if (have_test && tname.t != JV_STR) jfail(c->t, MS_ERR_FORMAT, line, "test name must be a string");
    if (have_test && !jinja_test_known(tname.s->s)) jfail(c->t, MS_ERR_FORMAT, line, "no test named '%s'", tname.s->s);
    jargs ta = {.pos = a->pos + (a->npos > off + 1 ? off + 1 : a->npos), .npos = a->npos > off + 1 ? a->npos - off - 1 : 0,
                .kwn = a->kwn, .kwv = a->kwv, .nkw = a->nkw};
    jv out = jv_list(c->t, l->n + 1);
    for (size_t i = 0; i < l->n; i++) {
        jv item = lookup_attr ? attr_path(c, line, l->v[i], attr, NULL) : l->v[i];
        int r = have_test ? jinja_test(c, line, tname.s->s, item, &ta) : jv_truthy(item);
        if (!!r == keep_if) jl_push(c->t, out.l, l->v[i]);
    }
    return out;
}

static jv do_minmax(jctx *c, int line, jv v, jargs *a, int want_max) {
    jlist *l = jinja_iter(c, line, v);
    if (!l->n) return JV_UNDEFINED;
    int cs = arg_bool(a, 0, "case_sensitive", 0);
    jv attr = jv_none();
    jarg(a, 1, "attribute", &attr);
    size_t best = 0;
    jv bk = attr_path(c, line, l->v[0], attr, NULL);
    if (!cs) bk = ignore_case(c, bk);
    for (size_t i = 1; i < l->n; i++) {
        jv k = attr_path(c, line, l->v[i], attr, NULL);
        if (!cs) k = ignore_case(c, k);
        int r = jv_cmp(c->t, line, k, bk);
        if (r == 2) continue;
        if (want_max ? r > 0 : r < 0) { best = i; bk = k; }
    }
    return l->v[best];
}

static jv do_indent(jctx *c, int line, jv v, jargs *a) {
    jstr *s = soft_str(c, v);
    jv w;
    jstr *ind;
    if (jarg(a, 0, "width", &w) && w.t == JV_STR) ind = w.s;
    else {
        int64_t n = jarg(a, 0, "width", &w) ? (w.t == JV_INT || w.t == JV_BOOL ? w.i : -1) : 4;
        if (n < 0 || n > 10000) jfail(c->t, MS_ERR_FORMAT, line, "indent: bad width");
        char *sp = ja_alloc(c->t, (size_t)n + 1);
        memset(sp, ' ', (size_t)n);
        ind = jv_cstr(c->t, sp).s;
    }
    int first = arg_bool(a, 1, "first", 0), blank = arg_bool(a, 2, "blank", 0);
    /* s + "\n" split into lines like str.splitlines */
    jbuf src;
    jb_init(&src, c->t, 0);
    jb_put(&src, s->s, s->len);
    jb_putc(&src, '\n');
    jv self = jb_take(&src);
    jargs none = {0};
    jv lines = jinja_call_method(c, line, self, "splitlines", &none);
    jbuf b;
    jb_init(&b, c->t, c->max_output);
    jlist *L = lines.l;
    for (size_t i = 0; i < L->n; i++) {
        jstr *ln = L->v[i].s;
        if (i) {
            jb_putc(&b, '\n');
            if (blank || ln->len) jb_put(&b, ind->s, ind->len);
        }
        jb_put(&b, ln->s, ln->len);
    }
    jv body = b.p ? jb_take(&b) : jv_str(c->t, "", 0);
    if (!first) return body;
    jbuf r;
    jb_init(&r, c->t, c->max_output);
    jb_put(&r, ind->s, ind->len);
    jb_put(&r, body.s->s, body.s->len);
    return jb_take(&r);
}

static jv do_round(jctx *c, int line, jv v, jargs *a) {
    int64_t prec = arg_int(c, line, a, 0, "precision", 0);
    jv m;
    const char *method = "common";
    if (jarg(a, 1, "method", &m)) {
        if (m.t != JV_STR || (strcmp(m.s->s, "common") && strcmp(m.s->s, "ceil") && strcmp(m.s->s, "floor")))
            jfail(c->t, MS_ERR_FORMAT, line, "method must be common, ceil or floor");
        method = m.s->s;
    }
    if (!jv_is_num(v)) jfail(c->t, MS_ERR_FORMAT, line, "round: a number is required, not %s", jv_type_name(v));
    if (prec > 300 || prec < -300) jfail(c->t, MS_ERR_FORMAT, line, "round: precision out of range");
    if (!strcmp(method, "common")) {
        if (v.t != JV_FLOAT) {
            if (prec >= 0) return jv_int(v.i);
            double p = pow(10.0, (double)-prec);
            double q = (double)v.i / p;
            double r = nearbyint(q);
            return jv_int((int64_t)(r * p));
        }
        if (!isfinite(v.f)) return v;
        if (prec >= 0) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, v.f);
            return jv_float(strtod(buf, NULL));
        }
        double p = pow(10.0, (double)-prec);
        return jv_float(nearbyint(v.f / p) * p);
    }
    double p = pow(10.0, (double)prec);
    double x = jv_num(v) * p;
    double r = method[0] == 'c' ? ceil(x) : floor(x);
    return jv_float(r / p);
}

static jv do_truncate(jctx *c, int line, jv v, jargs *a) {
    jstr *s = soft_str(c, v);
    int64_t length = arg_int(c, line, a, 0, "length", 255);
    int killwords = arg_bool(a, 1, "killwords", 0);
    jv endv;
    jstr *end = jarg(a, 2, "end", &endv) ? soft_str(c, endv) : jv_cstr(c->t, "...").s;
    int64_t leeway = 5;
    jv lw;
    if (jarg(a, 3, "leeway", &lw) && lw.t != JV_NONE) leeway = arg_int(c, line, a, 3, "leeway", 5);
    int64_t elen = (int64_t)u8_count(end->s, end->len), n = (int64_t)u8_count(s->s, s->len);
    if (length < elen) jfail(c->t, MS_ERR_FORMAT, line, "expected length >= %lld, got %lld", (long long)elen, (long long)length);
    if (leeway < 0) jfail(c->t, MS_ERR_FORMAT, line, "expected leeway >= 0");
    jv self = {.t = JV_STR, .s = s};
    if (n <= length + leeway) return self;
    size_t cut = u8_offset(s->s, s->len, (size_t)(length - elen));
    jbuf b;
    jb_init(&b, c->t, 0);
    if (killwords) jb_put(&b, s->s, cut);
    else {
        size_t k = cut;
        while (k > 0 && s->s[k - 1] != ' ') k--;
        jb_put(&b, s->s, k ? k - 1 : cut);
    }
    jb_put(&b, end->s, end->len);
    return jb_take(&b);
}

jv jinja_filter(jctx *c, int line, const char *f, jv v, jargs *a) {
    jv x, y;
    if (!strcmp(f, "tojson")) return do_tojson(c, line, v, a);
    if (!strcmp(f, "length") || !strcmp(f, "count")) return do_len(c, line, v);
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        jv dv = jv_str(c->t, "", 0);
        jarg(a, 0, "default_value", &dv);
        int boolean = arg_bool(a, 1, "boolean", 0);
        if (v.t == JV_UNDEF || (boolean && !jv_truthy(v))) return dv;
        return v;
    }
    if (!strcmp(f, "trim")) {
        jstr *chars = NULL;
        if (jarg(a, 0, "chars", &x) && x.t != JV_NONE) chars = soft_str(c, x);
        return jinja_strip(c, soft_str(c, v), chars, 3);
    }
    if (!strcmp(f, "string") || !strcmp(f, "safe")) return jv_to_str(c->t, v);
    if (!strcmp(f, "upper")) return jinja_case(c, soft_str(c, v), 1);
    if (!strcmp(f, "lower")) return jinja_case(c, soft_str(c, v), 0);
    if (!strcmp(f, "capitalize")) return jinja_case(c, soft_str(c, v), 2);
    if (!strcmp(f, "title")) {
        jstr *s = soft_str(c, v);
        jbuf b;
        jb_init(&b, c->t, 0);
        size_t i = 0;
        int at_start = 1;
        while (i < s->len) {
            uint32_t cp = (uint32_t)u8_decode(s->s, s->len, &i);
            int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_isspace(cp);
            if (sep) { u8_encode(&b, cp); at_start = 1; continue; }
            jbuf one;
            jb_init(&one, c->t, 0);
            u8_encode(&one, cp);
            jv ch = jb_take(&one);
            jv o = jinja_case(c, ch.s, at_start ? 1 : 0);
            jb_put(&b, o.s->s, o.s->len);
            at_start = 0;
        }
        return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
    }
    if (!strcmp(f, "replace")) {
        if (!jarg(a, 0, "old", &x) || !jarg(a, 1, "new", &y)) jfail(c->t, MS_ERR_FORMAT, line, "replace() needs old and new");
        jv cnt;
        int64_t n = -1;
        if (jarg(a, 2, "count", &cnt) && cnt.t != JV_NONE) n = arg_int(c, line, a, 2, "count", -1);
        return jinja_replace(c, line, soft_str(c, v), soft_str(c, x), soft_str(c, y), n);
    }
    if (!strcmp(f, "join")) {
        jv sep = jv_str(c->t, "", 0), attr = jv_none();
        jarg(a, 0, "d", &sep);
        jarg(a, 1, "attribute", &attr);
        jlist *l = jinja_iter(c, line, v);
        jstr *ss = soft_str(c, sep);
        jbuf b;
        jb_init(&b, c->t, c->max_output);
        for (size_t i = 0; i < l->n; i++) {
            if (i) jb_put(&b, ss->s, ss->len);
            jv_write_str(&b, attr_path(c, line, l->v[i], attr, NULL));
        }
        return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
    }
    if (!strcmp(f, "items")) {
        if (v.t == JV_UNDEF) return jv_list(c->t, 1);
        if (v.t != JV_DICT) jfail(c->t, MS_ERR_FORMAT, line, "Can only get item pairs from a mapping.");
        jargs none = {0};
        return jinja_call_method(c, line, v, "items", &none);
    }
    if (!strcmp(f, "list")) return copy_list(c, jinja_iter(c, line, v));
    if (!strcmp(f, "first")) {
        jlist *l = jinja_iter(c, line, v);
        return l->n ? l->v[0] : JV_UNDEFINED;
    }
    if (!strcmp(f, "last")) {
        if (v.t == JV_UNDEF) jfail(c->t, MS_ERR_FORMAT, line, "last: undefined value");
        jlist *l = jinja_iter(c, line, v);
        return l->n ? l->v[l->n - 1] : JV_UNDEFINED;
    }
    if (!strcmp(f, "reverse")) {
        if (v.t == JV_STR) {
            jlist *l = jinja_iter(c, line, v);
            jbuf b;
            jb_init(&b, c->t, 0);
            for (size_t i = l->n; i > 0; i--) jb_put(&b, l->v[i - 1].s->s, l->v[i - 1].s->len);
            return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
        }
        jlist *l = jinja_iter(c, line, v);
        jv out = jv_list(c->t, l->n + 1);
        for (size_t i = l->n; i > 0; i--) jl_push(c->t, out.l, l->v[i - 1]);
        return out;
    }
    if (!strcmp(f, "map")) {
        jlist *l = jinja_iter(c, line, v);
        jv out = jv_list(c->t, l->n + 1);
        jv attr;
        if (!a->npos && jarg(a, -1, "attribute", &attr)) {
            jv dflt;
            int hd = jarg(a, -1, "default", &dflt) && dflt.t != JV_NONE;
            for (size_t i = 0; i < l->n; i++) jl_push(c->t, out.l, attr_path(c, line, l->v[i], attr, hd ? &dflt : NULL));
            return out;
        }
        if (!a->npos) jfail(c->t, MS_ERR_FORMAT, line, "map requires a filter argument");
        if (a->pos[0].t != JV_STR || !jinja_filter_known(a->pos[0].s->s))
            jfail(c->t, MS_ERR_FORMAT, line, "map: no filter named '%s'", a->pos[0].t == JV_STR ? a->pos[0].s->s : "?");
        jargs fa = {.pos = a->pos + 1, .npos = a->npos - 1, .kwn = a->kwn, .kwv = a->kwv, .nkw = a->nkw};
        for (size_t i = 0; i < l->n; i++) jl_push(c->t, out.l, jinja_filter(c, line, a->pos[0].s->s, l->v[i], &fa));
        return out;
    }
    if (!strcmp(f, "select")) return select_reject(c, line, v, a, 0, 1);
    if (!strcmp(f, "reject")) return select_reject(c, line, v, a, 0, 0);
    if (!strcmp(f, "selectattr")) return select_reject(c, line, v, a, 1, 1);
    if (!strcmp(f, "rejectattr")) return select_reject(c, line, v, a, 1, 0);
    if (!strcmp(f, "sort") || !strcmp(f, "unique")) {
        int is_sort = f[1] == 'o';
        int reverse = is_sort ? arg_bool(a, 0, "reverse", 0) : 0;
        int cs = arg_bool(a, is_sort ? 1 : 0, "case_sensitive", 0);
        jv attr = jv_none();
        jarg(a, is_sort ? 2 : 1, "attribute", &attr);
        jlist *l = jinja_iter(c, line, v);
        jv *keys = ja_alloc(c->t, (l->n + 1) * sizeof(jv));
        for (size_t i = 0; i < l->n; i++) {
            keys[i] = attr_path(c, line, l->v[i], attr, NULL);
            if (!cs) keys[i] = ignore_case(c, keys[i]);
        }
        jv out = jv_list(c->t, l->n + 1);
        if (is_sort) {
            size_t *ord = sorted_order(c, line, keys, l->n, reverse);
            for (size_t i = 0; i < l->n; i++) jl_push(c->t, out.l, l->v[ord[i]]);
            return out;
        }
        jv seen = jv_list(c->t, l->n + 1);
        for (size_t i = 0; i < l->n; i++) {
            int dup = 0;
            if (keys[i].t == JV_LIST && !keys[i].l->tuple) jfail(c->t, MS_ERR_FORMAT, line, "unhashable type: 'list'");
            if (keys[i].t == JV_DICT) jfail(c->t, MS_ERR_FORMAT, line, "unhashable type: 'dict'");
            for (size_t k = 0; k < seen.l->n && !dup; k++) dup = jv_eq(seen.l->v[k], keys[i]);
            if (!dup) { jl_push(c->t, seen.l, keys[i]); jl_push(c->t, out.l, l->v[i]); }
        }
        return out;
    }
    if (!strcmp(f, "dictsort")) {
        if (v.t != JV_DICT) jfail(c->t, MS_ERR_FORMAT, line, "dictsort: a mapping is required");
        int cs = arg_bool(a, 0, "case_sensitive", 0);
        int pos = 0;
        if (jarg(a, 1, "by", &x)) {
            if (x.t == JV_STR && !strcmp(x.s->s, "value")) pos = 1;
            else if (!(x.t == JV_STR && !strcmp(x.s->s, "key"))) jfail(c->t, MS_ERR_FORMAT, line, "You can only sort by either \"key\" or \"value\"");
        }
        int reverse = arg_bool(a, 2, "reverse", 0);
        size_t n = v.d->n;
        jv *keys = ja_alloc(c->t, (n + 1) * sizeof(jv));
        for (size_t i = 0; i < n; i++) keys[i] = cs ? (pos ? v.d->v[i] : v.d->k[i]) : ignore_case(c, pos ? v.d->v[i] : v.d->k[i]);
        size_t *ord = sorted_order(c, line, keys, n, reverse);
        jv out = jv_list(c->t, n + 1);
        for (size_t i = 0; i < n; i++) {
            jv t = jv_tuple(c->t, 2);
            jl_push(c->t, t.l, v.d->k[ord[i]]);
            jl_push(c->t, t.l, v.d->v[ord[i]]);
            jl_push(c->t, out.l, t);
        }
        return out;
    }
    if (!strcmp(f, "min")) return do_minmax(c, line, v, a, 0);
    if (!strcmp(f, "max")) return do_minmax(c, line, v, a, 1);
    if (!strcmp(f, "sum")) {
        jv attr = jv_none(), acc = jv_int(0);
        jarg(a, 0, "attribute", &attr);
        jarg(a, 1, "start", &acc);
        jlist *l = jinja_iter(c, line, v);
        /* Python >= 3.12 sum(): exact ints, then Neumaier-compensated floats */
        int fmode = 0;
        double fs = 0, comp = 0;
        for (size_t i = 0; i < l->n; i++) {
            jv it = attr_path(c, line, l->v[i], attr, NULL);
            if (fmode) {
                if (it.t == JV_FLOAT) {
                    double t = fs + it.f;
                    if (fabs(fs) >= fabs(it.f)) comp += (fs - t) + it.f;
                    else comp += (it.f - t) + fs;
                    fs = t;
                    continue;
                }
                if (it.t == JV_INT || it.t == JV_BOOL) { fs += (double)it.i; continue; }
                if (comp && isfinite(comp)) fs += comp;
                acc = jv_float(fs);
                fmode = 0;
            }
            acc = jinja_binop(c, line, T_ADD, acc, it);
            if (acc.t == JV_FLOAT && it.t == JV_FLOAT) { fmode = 1; fs = acc.f; comp = 0; }
        }
        if (fmode) {
            if (comp && isfinite(comp)) fs += comp;
            acc = jv_float(fs);
        }
        return acc;
    }
    if (!strcmp(f, "abs")) {
        if (v.t == JV_INT || v.t == JV_BOOL) {
            if (v.i == INT64_MIN) jfail(c->t, MS_ERR_LIMIT, line, "integer overflow");
            return jv_int(v.i < 0 ? -v.i : v.i);
        }
        if (v.t == JV_FLOAT) return jv_float(fabs(v.f));
        jfail(c->t, MS_ERR_FORMAT, line, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    if (!strcmp(f, "int")) {
        jv dflt = jv_int(0);
        jarg(a, 0, "default", &dflt);
        int64_t base = arg_int(c, line, a, 1, "base", 10);
        if (v.t == JV_INT) return v;
        if (v.t == JV_BOOL) return jv_int(v.i);
        if (v.t == JV_FLOAT) {
            if (!isfinite(v.f)) return dflt;
            if (fabs(v.f) >= 9.2e18) jfail(c->t, MS_ERR_LIMIT, line, "integer overflow");
            return jv_int((int64_t)v.f);
        }
        if (v.t == JV_STR) {
            int64_t r;
            if (base >= 2 && base <= 36 && parse_py_int(v.s, (int)base, &r)) return jv_int(r);
            int ok;
            double d = parse_py_float(c, v.s, &ok);
            if (ok && isfinite(d)) {
                if (fabs(d) >= 9.2e18) jfail(c->t, MS_ERR_LIMIT, line, "integer overflow");
                return jv_int((int64_t)d);
            }
        }
        return dflt;
    }
    if (!strcmp(f, "float")) {
        jv dflt = jv_float(0.0);
        jarg(a, 0, "default", &dflt);
        if (jv_is_num(v)) return jv_float(jv_num(v));
        if (v.t == JV_STR) {
            int ok;
            double d = parse_py_float(c, v.s, &ok);
            if (ok) return jv_float(d);
        }
        return dflt;
    }
    if (!strcmp(f, "round")) return do_round(c, line, v, a);
    if (!strcmp(f, "indent")) return do_indent(c, line, v, a);
    if (!strcmp(f, "truncate")) return do_truncate(c, line, v, a);
    if (!strcmp(f, "center")) {
        jv w = jv_int(arg_int(c, line, a, 0, "width", 80));
        jargs ca = {.pos = &w, .npos = 1};
        return jinja_call_method(c, line, jv_to_str(c->t, v), "center", &ca);
    }
    if (!strcmp(f, "wordcount")) {
        jstr *s = soft_str(c, v);
        int64_t n = 0;
        int in = 0;
        size_t i = 0;
        while (i < s->len) {
            int w = is_word_cp((uint32_t)u8_decode(s->s, s->len, &i));
            if (w && !in) n++;
            in = w;
        }
        return jv_int(n);
    }
    if (!strcmp(f, "escape") || !strcmp(f, "e")) {
        jbuf b;
        jb_init(&b, c->t, c->max_output);
        html_escape(&b, soft_str(c, v));
        return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
    }
    if (!strcmp(f, "format")) {
        if (v.t != JV_STR) v = jv_to_str(c->t, v);
        if (a->npos && a->nkw) jfail(c->t, MS_ERR_FORMAT, line, "can't handle positional and keyword arguments at the same time");
        if (a->nkw) {
            jv d = jv_dict(c->t);
            for (int k = 0; k < a->nkw; k++) jd_set(c->t, d.d, jv_cstr(c->t, a->kwn[k]), a->kwv[k]);
            return jinja_percent_format(c, line, v, d);
        }
        jv t = jv_tuple(c->t, (size_t)a->npos + 1);
        for (int i = 0; i < a->npos; i++) jl_push(c->t, t.l, a->pos[i]);
        return jinja_percent_format(c, line, v, t);
    }
    if (!strcmp(f, "attr")) {
        if (!jarg(a, 0, "name", &x) || x.t != JV_STR) jfail(c->t, MS_ERR_FORMAT, line, "attr: name must be a string");
        if (v.t == JV_UNDEF) jfail(c->t, MS_ERR_FORMAT, line, "attr: undefined value");
        if (v.t == JV_DICT) {
            jv m = jinja_getattr(c, line, v, x.s->s);
            return m.t == JV_FUNC ? m : JV_UNDEFINED;
        }
        return jinja_getattr(c, line, v, x.s->s);
    }
    if (!strcmp(f, "batch") || !strcmp(f, "slice")) {
        int64_t n = arg_int(c, line, a, 0, f[0] == 'b' ? "linecount" : "slices", 0);
        if (n <= 0) jfail(c->t, MS_ERR_FORMAT, line, "%s: count must be positive", f);
        jv fill;
        int hf = jarg(a, 1, "fill_with", &fill) && fill.t != JV_NONE;
        jlist *l = jinja_iter(c, line, v);
        jv out = jv_list(c->t, 4);
        if (f[0] == 'b') {
            jv cur = jv_list(c->t, (size_t)n);
            for (size_t i = 0; i < l->n; i++) {
                if ((int64_t)cur.l->n == n) { jl_push(c->t, out.l, cur); cur = jv_list(c->t, (size_t)n); }
                jl_push(c->t, cur.l, l->v[i]);
            }
            if (cur.l->n) {
                if (hf) while ((int64_t)cur.l->n < n) jl_push(c->t, cur.l, fill);
                jl_push(c->t, out.l, cur);
            }
            return out;
        }
        int64_t len = (int64_t)l->n, per = len / n, extra = len % n, off = 0;
        for (int64_t s = 0; s < n; s++) {
            int64_t start = off + s * per;
            if (s < extra) off++;
            int64_t end = off + (s + 1) * per;
            jv tmp = jv_list(c->t, (size_t)(end - start) + 1);
            for (int64_t i = start; i < end; i++) jl_push(c->t, tmp.l, l->v[i]);
            if (hf && s >= extra) jl_push(c->t, tmp.l, fill);
            jl_push(c->t, out.l, tmp);
        }
        return out;
    }
    if (!strcmp(f, "groupby")) {
        jv attr;
        if (!jarg(a, 0, "attribute", &attr)) jfail(c->t, MS_ERR_FORMAT, line, "groupby() missing attribute");
        jv dflt;
        int hd = jarg(a, 1, "default", &dflt) && dflt.t != JV_NONE;
        int cs = arg_bool(a, 2, "case_sensitive", 0);
        jlist *l = jinja_iter(c, line, v);
        jv *keys = ja_alloc(c->t, (l->n + 1) * sizeof(jv));
        for (size_t i = 0; i < l->n; i++) {
            keys[i] = attr_path(c, line, l->v[i], attr, hd ? &dflt : NULL);
            if (!cs) keys[i] = ignore_case(c, keys[i]);
        }
        size_t *ord = sorted_order(c, line, keys, l->n, 0);
        jv out = jv_list(c->t, 4);
        for (size_t i = 0; i < l->n;) {
            size_t j = i;
            jv members = jv_list(c->t, 4);
            while (j < l->n && jv_eq(keys[ord[j]], keys[ord[i]])) jl_push(c->t, members.l, l->v[ord[j++]]);
            jv g = jv_tuple(c->t, 2);
            g.l->group = 1;
            jl_push(c->t, g.l, cs ? keys[ord[i]] : attr_path(c, line, l->v[ord[i]], attr, hd ? &dflt : NULL));
            jl_push(c->t, g.l, members);
            jl_push(c->t, out.l, g);
            i = j;
        }
        return out;
    }
    if (!strcmp(f, "filesizeformat")) {
        int binary = arg_bool(a, 0, "binary", 0);
        double bytes;
        if (jv_is_num(v)) bytes = jv_num(v);
        else if (v.t == JV_STR) {
            int ok;
            bytes = parse_py_float(c, v.s, &ok);
            if (!ok) jfail(c->t, MS_ERR_FORMAT, line, "could not convert string to float");
        } else jfail(c->t, MS_ERR_FORMAT, line, "filesizeformat needs a number");
        static const char *const dec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
        static const char *const bin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
        double base = binary ? 1024 : 1000;
        char buf[128];
        if (bytes == 1) return jv_cstr(c->t, "1 Byte");
        if (bytes < base) {
            snprintf(buf, sizeof buf, "%lld Bytes", (long long)bytes);
            return jv_cstr(c->t, buf);
        }
        double unit = base * base;
        int k = 0;
        for (; k < 7 && bytes >= unit; k++) unit *= base;
        snprintf(buf, sizeof buf, "%.1f %s", base * bytes / unit, binary ? bin[k] : dec[k]);
        return jv_cstr(c->t, buf);
    }
    if (!strcmp(f, "urlencode")) {
        jbuf b;
        jb_init(&b, c->t, c->max_output);
        if (v.t == JV_STR || (v.t != JV_LIST && v.t != JV_DICT)) {
            url_quote(&b, jv_to_str(c->t, v).s, 0);
        } else {
            jlist *items;
            if (v.t == JV_DICT) {
                jargs none = {0};
                items = jinja_call_method(c, line, v, "items", &none).l;
            } else items = v.l;
            for (size_t i = 0; i < items->n; i++) {
                jv kv = items->v[i];
                if (kv.t != JV_LIST || kv.l->n != 2) jfail(c->t, MS_ERR_FORMAT, line, "urlencode: expected (key, value) pairs");
                if (i) jb_putc(&b, '&');
                url_quote(&b, jv_to_str(c->t, kv.l->v[0]).s, 1);
                jb_putc(&b, '=');
                url_quote(&b, jv_to_str(c->t, kv.l->v[1]).s, 1);
            }
        }
        return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
    }
    jfail(c->t, MS_ERR_FORMAT, line, "no filter named '%s'", f);
}

/* ---------------- tests ---------------- */

int jinja_test(jctx *c, int line, const char *t, jv v, jargs *a) {
    jv x;
    int has = jarg(a, 0, NULL, &x);
    if (!strcmp(t, "defined")) return v.t != JV_UNDEF;
    if (!strcmp(t, "undefined")) return v.t == JV_UNDEF;
    if (!strcmp(t, "none")) return v.t == JV_NONE;
    if (!strcmp(t, "boolean")) return v.t == JV_BOOL;
    if (!strcmp(t, "true")) return v.t == JV_BOOL && v.i;
    if (!strcmp(t, "false")) return v.t == JV_BOOL && !v.i;
    if (!strcmp(t, "integer")) return v.t == JV_INT;
    if (!strcmp(t, "float")) return v.t == JV_FLOAT;
    if (!strcmp(t, "number")) return jv_is_num(v);
    if (!strcmp(t, "string")) return v.t == JV_STR;
    if (!strcmp(t, "mapping")) return v.t == JV_DICT;
    if (!strcmp(t, "sequence")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    if (!strcmp(t, "iterable")) return v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF || v.t == JV_LOOP;
    if (!strcmp(t, "callable")) return v.t == JV_FUNC || v.t == JV_LOOP;
    if (!strcmp(t, "escaped")) return 0;
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        jargs none = {0};
        return jv_truthy(jinja_call_method(c, line, jv_to_str(c->t, v), t[0] == 'l' ? "islower" : "isupper", &none));
    }
    if (!strcmp(t, "filter")) return v.t == JV_STR && jinja_filter_known(v.s->s);
    if (!strcmp(t, "test")) return v.t == JV_STR && jinja_test_known(v.s->s);
    if (!strcmp(t, "even") || !strcmp(t, "odd")) {
        if (!jv_is_num(v)) jfail(c->t, MS_ERR_FORMAT, line, "test '%s' needs a number, not %s", t, jv_type_name(v));
        jv r = jinja_binop(c, line, T_MOD, v, jv_int(2));
        return t[0] == 'e' ? jv_eq(r, jv_int(0)) : jv_eq(r, jv_int(1));
    }
    if (!has && strcmp(t, "in")) jfail(c->t, MS_ERR_FORMAT, line, "test '%s' needs an argument", t);
    if (!strcmp(t, "divisibleby")) return jv_eq(jinja_binop(c, line, T_MOD, v, x), jv_int(0));
    if (!strcmp(t, "sameas")) {
        if (v.t != x.t) return 0;
        switch (v.t) {
        case JV_NONE: case JV_UNDEF: return 1;
        case JV_BOOL: return v.i == x.i;
        case JV_INT: return v.i == x.i && v.i >= -5 && v.i <= 256;
        case JV_STR: return v.s == x.s;
        case JV_LIST: return v.l == x.l;
        case JV_DICT: case JV_NS: return v.d == x.d;
        case JV_FUNC: return v.fn == x.fn;
        default: return 0;
        }
    }
    if (!strcmp(t, "in")) {
        if (!has) jfail(c->t, MS_ERR_FORMAT, line, "test 'in' needs an argument");
        if (x.t == JV_STR) {
            if (v.t != JV_STR) jfail(c->t, MS_ERR_FORMAT, line, "'in <string>' requires string as left operand");
            return v.s->len == 0 || memmem(x.s->s, x.s->len, v.s->s, v.s->len) != NULL;
        }
        if (x.t == JV_DICT) return jd_get(x.d, v) != NULL;
        jlist *l = jinja_iter(c, line, x);
        for (size_t i = 0; i < l->n; i++)
            if (jv_eq(l->v[i], v)) return 1;
        return 0;
    }
    if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==")) return jv_eq(v, x);
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) return !jv_eq(v, x);
    int r = jv_cmp(c->t, line, v, x);
    if (r == 2) return 0;
    if (!strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<")) return r < 0;
    if (!strcmp(t, "le") || !strcmp(t, "<=")) return r <= 0;
    if (!strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">")) return r > 0;
    if (!strcmp(t, "ge") || !strcmp(t, ">=")) return r >= 0;
    jfail(c->t, MS_ERR_FORMAT, line, "no test named '%s'", t);
}
