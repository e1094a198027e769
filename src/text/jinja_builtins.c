/* jinja_builtins.c — attribute and item access (sandboxed like
 * ImmutableSandboxedEnvironment), Python str/dict/list methods, loop.*,
 * global functions, binary operators and %-formatting. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja_int.h"
#include "text/unicase.h"

/* ---------------- arguments ---------------- */

int jarg(jargs *a, int i, const char *kw, jv *out) {
    if (i >= 0 && i < a->npos) { *out = a->pos[i]; return 1; }
    if (kw)
        for (int k = 0; k < a->nkw; k++)
            if (!strcmp(a->kwn[k], kw)) { *out = a->kwv[k]; return 1; }
    return 0;
}

void jargs_check(jctx *c, int line, const char *fn, jargs *a, int npos, const char *const *kws) {
    if (npos >= 0 && a->npos > npos)
        jfail(c->t, MS_ERR_FORMAT, line, "%s() takes at most %d positional arguments (%d given)", fn, npos, a->npos);
    for (int k = 0; k < a->nkw; k++) {
        int ok = 0;
        for (int i = 0; kws && kws[i]; i++)
            if (!strcmp(kws[i], a->kwn[k])) { ok = 1; break; }
        if (!ok) jfail(c->t, MS_ERR_FORMAT, line, "%s() got an unexpected keyword argument '%s'", fn, a->kwn[k]);
    }
}

static int64_t want_int(jctx *c, int line, jv v, const char *what) {
    if (v.t == JV_INT || v.t == JV_BOOL) return v.i;
    jfail(c->t, MS_ERR_FORMAT, line, "%s must be an integer, not %s", what, jv_type_name(v));
}
static jstr *want_str(jctx *c, int line, jv v, const char *what) {
    if (v.t == JV_STR) return v.s;
    jfail(c->t, MS_ERR_FORMAT, line, "%s must be a string, not %s", what, jv_type_name(v));
}

/* ---------------- iteration ---------------- */

jlist *jinja_iter(jctx *c, int line, jv v) {
    switch (v.t) {
    case JV_LIST: return v.l;
    case JV_UNDEF: return jv_list(c->t, 1).l;
    case JV_DICT: {
        jlist *l = jv_list(c->t, v.d->n + 1).l;
        for (size_t i = 0; i < v.d->n; i++) jl_push(c->t, l, v.d->k[i]);
        return l;
    }
    case JV_STR: {
        jlist *l = jv_list(c->t, v.s->len + 1).l;
        size_t i = 0;
        while (i < v.s->len) {
            size_t st = i;
            u8_decode(v.s->s, v.s->len, &i);
            jl_push(c->t, l, jv_str(c->t, v.s->s + st, i - st));
        }
        return l;
    }
    default: jfail(c->t, MS_ERR_FORMAT, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---------------- case mapping (Python's full Unicode mappings, unicase_table.c) ---------------- */

static uint32_t cp_map1(uint32_t c, char kind) {
    const uc_entry *e = uc_lookup(c);
    if (!e) return c;
    uint32_t m = kind == 'U' ? e->up : kind == 'L' ? e->lo : e->ti;
    return m == 0 || m == 0xFFFFFFFFu ? c : m;
}
static uint32_t cp_lower(uint32_t c) { return cp_map1(c, 'L'); }
static int cp_cased(uint32_t c) { const uc_entry *e = uc_lookup(c); return e && e->cased; }
static int cp_case_ignorable(uint32_t c) {
    return c == 0x27 || c == 0x2E || c == 0x3A || c == 0x5E || c == 0x60 || c == 0xA8 || c == 0xAD || c == 0xAF ||
           c == 0xB4 || c == 0xB7 || c == 0xB8 || c == 0x2019 || (c >= 0x300 && c <= 0x36F) || (c >= 0x2B0 && c <= 0x2FF);
}

/* append the mapping of cp (kind 'U', 'L', 'T'), expanding multi-character mappings */
static void put_mapped(jbuf *b, uint32_t cp, char kind) {
    const uc_entry *e = uc_lookup(cp);
    uint32_t m = e ? (kind == 'U' ? e->up : kind == 'L' ? e->lo : e->ti) : 0;
    if (m == 0xFFFFFFFFu) {
        const char *x = uc_expand(cp, kind);
        if (x) { jb_puts(b, x); return; }
        m = 0;
    }
    u8_encode(b, m ? m : cp);
}

/* Python's final-sigma rule for lower(): Σ after a cased letter and not before one is ς */
static int final_sigma(const jstr *s, size_t at, size_t after) {
    size_t j = at;
    int before = 0;
    while (j > 0) {
        size_t st = j - 1;
        while (st > 0 && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
        size_t q = st;
        uint32_t c = (uint32_t)u8_decode(s->s, s->len, &q);
        j = st;
        if (cp_case_ignorable(c)) continue;
        before = cp_cased(c);
        break;
    }
    if (!before) return 0;
    size_t i = after;
    while (i < s->len) {
        uint32_t c = (uint32_t)u8_decode(s->s, s->len, &i);
        if (cp_case_ignorable(c)) continue;
        return !cp_cased(c);
    }
    return 1;
}

static void put_lower(jbuf *b, const jstr *s, uint32_t cp, size_t at, size_t after) {
    if (cp == 0x3A3) { u8_encode(b, final_sigma(s, at, after) ? 0x3C2 : 0x3C3); return; }
    put_mapped(b, cp, 'L');
}

/* mode: 0 lower, 1 upper, 2 capitalize, 3 Python title, 4 swapcase */
jv jinja_case(jctx *c, jstr *s, int mode);
jv jinja_case(jctx *c, jstr *s, int mode) {
    jbuf b;
    jb_init(&b, c->t, 0);
    size_t i = 0;
    int first = 1, prev_cased = 0;
    while (i < s->len) {
        size_t at = i;
        uint32_t cp = (uint32_t)u8_decode(s->s, s->len, &i);
        switch (mode) {
        case 0: put_lower(&b, s, cp, at, i); break;
        case 1: put_mapped(&b, cp, 'U'); break;
        case 2:
            if (first) put_mapped(&b, cp, 'T');
            else put_lower(&b, s, cp, at, i);
            break;
        case 3:
            if (prev_cased) put_lower(&b, s, cp, at, i);
            else put_mapped(&b, cp, 'T');
            prev_cased = cp_cased(cp);
            break;
        default:
            if (cp_lower(cp) != cp || (uc_lookup(cp) && uc_lookup(cp)->lo == 0xFFFFFFFFu)) put_lower(&b, s, cp, at, i);
            else put_mapped(&b, cp, 'U');
        }
        first = 0;
    }
    return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
}

/* ---------------- str helpers ---------------- */

static int in_chars(jstr *chars, uint32_t cp) {
    size_t i = 0;
    while (i < chars->len)
        if ((uint32_t)u8_decode(chars->s, chars->len, &i) == cp) return 1;
    return 0;
}

/* strip: which 1 = left, 2 = right, 3 = both; chars NULL = whitespace */
jv jinja_strip(jctx *c, jstr *s, jstr *chars, int which);
jv jinja_strip(jctx *c, jstr *s, jstr *chars, int which) {
    size_t a = 0, b = s->len;
    if (which & 1) {
        while (a < b) {
            size_t q = a;
            uint32_t cp = (uint32_t)u8_decode(s->s, s->len, &q);
            if (chars ? !in_chars(chars, cp) : !py_isspace(cp)) break;
            a = q;
        }
    }
    if (which & 2) {
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
            size_t q = st;
            uint32_t cp = (uint32_t)u8_decode(s->s, b, &q);
            if (chars ? !in_chars(chars, cp) : !py_isspace(cp)) break;
            b = st;
        }
    }
    return jv_str(c->t, s->s + a, b - a);
}

static jv str_split(jctx *c, int line, jstr *s, jv sepv, int64_t maxsplit, int right) {
    jv out = jv_list(c->t, 8);
    if (sepv.t == JV_NONE || sepv.t == JV_UNDEF) {
        /* whitespace runs */
        size_t n = s->len;
        if (!right) {
            size_t i = 0;
            int64_t splits = 0;
            for (;;) {
                while (i < n) { size_t q = i; if (!py_isspace((uint32_t)u8_decode(s->s, n, &q))) break; i = q; }
                if (i >= n) break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    jl_push(c->t, out.l, jv_str(c->t, s->s + i, n - i));
                    break;
                }
                size_t st = i;
                while (i < n) { size_t q = i; if (py_isspace((uint32_t)u8_decode(s->s, n, &q))) break; i = q; }
                jl_push(c->t, out.l, jv_str(c->t, s->s + st, i - st));
                splits++;
            }
            return out;
        }
        /* rsplit on whitespace */
        size_t e = n;
        int64_t splits = 0;
        jv rev = jv_list(c->t, 8);
        for (;;) {
            while (e > 0) {
                size_t st = e - 1;
                while (st > 0 && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
                size_t q = st;
                if (!py_isspace((uint32_t)u8_decode(s->s, e, &q))) break;
                e = st;
            }
            if (e == 0) break;
            if (maxsplit >= 0 && splits >= maxsplit) {
                jl_push(c->t, rev.l, jv_str(c->t, s->s, e));
                break;
            }
            size_t b = e;
            while (b > 0) {
                size_t st = b - 1;
                while (st > 0 && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
                size_t q = st;
                if (py_isspace((uint32_t)u8_decode(s->s, b, &q))) break;
                b = st;
            }
            jl_push(c->t, rev.l, jv_str(c->t, s->s + b, e - b));
            e = b;
            splits++;
        }
        for (size_t i = rev.l->n; i > 0; i--) jl_push(c->t, out.l, rev.l->v[i - 1]);
        return out;
    }
    jstr *sep = want_str(c, line, sepv, "separator");
    if (!sep->len) jfail(c->t, MS_ERR_FORMAT, line, "empty separator");
    if (!right) {
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            const char *h = (maxsplit < 0 || splits < maxsplit) ? memmem(s->s + i, s->len - i, sep->s, sep->len) : NULL;
            if (!h) { jl_push(c->t, out.l, jv_str(c->t, s->s + i, s->len - i)); break; }
            size_t k = (size_t)(h - s->s);
            jl_push(c->t, out.l, jv_str(c->t, s->s + i, k - i));
            i = k + sep->len;
            splits++;
        }
        return out;
    }
    jv rev = jv_list(c->t, 8);
    size_t e = s->len;
    int64_t splits = 0;
    for (;;) {
        size_t found = (size_t)-1;
        if ((maxsplit < 0 || splits < maxsplit) && e >= sep->len)
            for (size_t k = e - sep->len + 1; k-- > 0;)
                if (!memcmp(s->s + k, sep->s, sep->len)) { found = k; break; }
        if (found == (size_t)-1) { jl_push(c->t, rev.l, jv_str(c->t, s->s, e)); break; }
        jl_push(c->t, rev.l, jv_str(c->t, s->s + found + sep->len, e - found - sep->len));
        e = found;
        splits++;
    }
    for (size_t i = rev.l->n; i > 0; i--) jl_push(c->t, out.l, rev.l->v[i - 1]);
    return out;
}

jv jinja_replace(jctx *c, int line, jstr *s, jstr *old, jstr *nw, int64_t count);
jv jinja_replace(jctx *c, int line, jstr *s, jstr *old, jstr *nw, int64_t count) {
    jbuf b;
    jb_init(&b, c->t, c->max_output);
    int64_t done = 0;
    if (!old->len) {
        size_t i = 0;
        while (i <= s->len) {
            if (count < 0 || done < count) { jb_put(&b, nw->s, nw->len); done++; }
            if (i == s->len) break;
            size_t st = i;
            u8_decode(s->s, s->len, &i);
            jb_put(&b, s->s + st, i - st);
        }
        return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
    }
    size_t i = 0;
    for (;;) {
        const char *h = (count < 0 || done < count) ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
        if (!h) { jb_put(&b, s->s + i, s->len - i); break; }
        size_t k = (size_t)(h - s->s);
        jb_put(&b, s->s + i, k - i);
        jb_put(&b, nw->s, nw->len);
        i = k + old->len;
        done++;
    }
    return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
}

/* code point index of the first (or last) occurrence of sub in s[start:end], -1 if none */
static int64_t str_find(jstr *s, jstr *sub, int64_t start, int64_t end, int last) {
    int64_t n = (int64_t)u8_count(s->s, s->len);
    if (start < 0) { start += n; if (start < 0) start = 0; }
    if (end < 0) { end += n; if (end < 0) end = 0; }
    if (end > n) end = n;
    if (start > end) return -1;
    size_t a = u8_offset(s->s, s->len, (size_t)start), b = u8_offset(s->s, s->len, (size_t)end);
    if (sub->len > b - a) return -1;
    int64_t found = -1;
    for (size_t k = a; k + sub->len <= b; k++) {
        if (((unsigned char)s->s[k] & 0xC0) == 0x80) continue;
        if (!memcmp(s->s + k, sub->s, sub->len)) {
            found = (int64_t)u8_count(s->s, k);
            if (!last) return found;
        }
    }
    return found;
}

static int64_t str_count(jstr *s, jstr *sub) {
    if (!sub->len) return (int64_t)u8_count(s->s, s->len) + 1;
    int64_t n = 0;
    size_t i = 0;
    for (;;) {
        const char *h = memmem(s->s + i, s->len - i, sub->s, sub->len);
        if (!h) break;
        n++;
        i = (size_t)(h - s->s) + sub->len;
    }
    return n;
}

static int affix(jctx *c, int line, jstr *s, jv arg, int end) {
    if (arg.t == JV_LIST && arg.l->tuple) {
        for (size_t i = 0; i < arg.l->n; i++)
            if (affix(c, line, s, arg.l->v[i], end)) return 1;
        return 0;
    }
    if (arg.t != JV_STR)
        jfail(c->t, MS_ERR_FORMAT, line, "%s first arg must be str or a tuple of str, not %s", end ? "endswith" : "startswith",
              jv_type_name(arg));
    jstr *p = arg.s;
    if (p->len > s->len) return 0;
    return !memcmp(end ? s->s + s->len - p->len : s->s, p->s, p->len);
}

static int all_cp(jstr *s, int kind) {
    if (!s->len) return 0;
    size_t i = 0;
    int any_cased = 0;
    while (i < s->len) {
        uint32_t cp = (uint32_t)u8_decode(s->s, s->len, &i);
        switch (kind) {
        case 0: if (!(cp >= '0' && cp <= '9')) return 0; break;
        case 1: if (!(cp_cased(cp) || cp >= 0x80)) return 0; break;
        case 2: if (!(cp_cased(cp) || (cp >= '0' && cp <= '9') || cp >= 0x80)) return 0; break;
        case 3: if (!py_isspace(cp)) return 0; break;
        case 4: case 5: {
            const uc_entry *e = uc_lookup(cp);
            if (e && (kind == 4 ? e->lo : e->up) != 0) return 0;
            if (e && e->cased) any_cased = 1;
            break;
        }
        }
    }
    return kind >= 4 ? any_cased : 1;
}

/* Python str.format with {} {0} {name} {0[key]} {x.attr}, !s/!r and simple specs */
static void fmt_spec(jctx *c, int line, jbuf *b, jv v, const char *spec, size_t sl);
static jv str_format(jctx *c, int line, jstr *f, jargs *a) {
    jbuf b;
    jb_init(&b, c->t, c->max_output);
    int autoi = 0;
    size_t i = 0;
    while (i < f->len) {
        char ch = f->s[i];
        if (ch == '{' && i + 1 < f->len && f->s[i + 1] == '{') { jb_putc(&b, '{'); i += 2; continue; }
        if (ch == '}' && i + 1 < f->len && f->s[i + 1] == '}') { jb_putc(&b, '}'); i += 2; continue; }
        if (ch == '}') jfail(c->t, MS_ERR_FORMAT, line, "Single '}' encountered in format string");
        if (ch != '{') { jb_putc(&b, ch); i++; continue; }
        size_t e = i + 1;
        while (e < f->len && f->s[e] != '}') e++;
        if (e >= f->len) jfail(c->t, MS_ERR_FORMAT, line, "Single '{' encountered in format string");
        const char *fld = f->s + i + 1;
        size_t fl = e - i - 1;
        const char *spec = memchr(fld, ':', fl);
        const char *conv = memchr(fld, '!', spec ? (size_t)(spec - fld) : fl);
        size_t namel = conv ? (size_t)(conv - fld) : spec ? (size_t)(spec - fld) : fl;
        size_t nl = 0;
        while (nl < namel && fld[nl] != '.' && fld[nl] != '[') nl++;
        jv v;
        if (nl == 0) {
            if (!jarg(a, autoi++, NULL, &v)) jfail(c->t, MS_ERR_FORMAT, line, "Replacement index %d out of range", autoi - 1);
        } else if (fld[0] >= '0' && fld[0] <= '9') {
            int idx = 0;
            for (size_t q = 0; q < nl && fld[q] >= '0' && fld[q] <= '9'; q++) idx = idx < 100000 ? idx * 10 + (fld[q] - '0') : idx;
            if (!jarg(a, idx, NULL, &v)) jfail(c->t, MS_ERR_FORMAT, line, "Replacement index %d out of range", idx);
        } else {
            char *nm = ja_strndup(c->t, fld, nl);
            if (!jarg(a, -1, nm, &v)) jfail(c->t, MS_ERR_FORMAT, line, "KeyError: '%s'", nm);
        }
        size_t p = nl;
        while (p < namel) {
            if (fld[p] == '.') {
                size_t q = p + 1;
                while (q < namel && fld[q] != '.' && fld[q] != '[') q++;
                v = jinja_getattr(c, line, v, ja_strndup(c->t, fld + p + 1, q - p - 1));
                p = q;
            } else {
                size_t q = p + 1;
                while (q < namel && fld[q] != ']') q++;
                char *key = ja_strndup(c->t, fld + p + 1, q - p - 1);
                jv k = (key[0] >= '0' && key[0] <= '9') ? jv_int(strtoll(key, NULL, 10)) : jv_cstr(c->t, key);
                v = jinja_getitem(c, line, v, k);
                p = q + 1;
            }
        }
        if (conv && conv + 1 < fld + fl && conv[1] == 'r') {
            jbuf r;
            jb_init(&r, c->t, 0);
            jv_write_repr(&r, v);
            v = r.p ? jb_take(&r) : jv_str(c->t, "", 0);
        } else if (conv) v = jv_to_str(c->t, v);
        if (spec) fmt_spec(c, line, &b, v, spec + 1, (size_t)(fld + fl - spec - 1));
        else jv_write_str(&b, v);
        i = e + 1;
    }
    return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
}

static void fmt_spec(jctx *c, int line, jbuf *b, jv v, const char *spec, size_t sl) {
    /* [[fill]align][sign][0][width][,][.precision][type] */
    char fill = ' ', align = 0, sign = 0, type = 0;
    int width = 0, prec = -1, zero = 0;
    size_t i = 0;
    if (sl >= 2 && memchr("<>^=", spec[1], 4)) { fill = spec[0]; align = spec[1]; i = 2; }
    else if (sl >= 1 && memchr("<>^=", spec[0], 4)) { align = spec[0]; i = 1; }
    if (i < sl && memchr("+- ", spec[i], 3)) sign = spec[i++];
    if (i < sl && spec[i] == '0') { zero = 1; i++; }
    while (i < sl && spec[i] >= '0' && spec[i] <= '9') { if (width < 1000000) width = width * 10 + (spec[i] - '0'); i++; }
    if (i < sl && spec[i] == '.') {
        i++;
        prec = 0;
        while (i < sl && spec[i] >= '0' && spec[i] <= '9') { if (prec < 1000000) prec = prec * 10 + (spec[i] - '0'); i++; }
    }
    if (i < sl) type = spec[i++];
    if (i != sl || width > 10000 || prec > 100) jfail(c->t, MS_ERR_FORMAT, line, "unsupported format specifier");
    char tmp[256];
    jbuf body;
    jb_init(&body, c->t, 0);
    if (v.t == JV_STR && (type == 0 || type == 's')) {
        size_t n = v.s->len;
        if (prec >= 0) n = u8_offset(v.s->s, v.s->len, (size_t)prec);
        jb_put(&body, v.s->s, n);
        if (!align) align = '<';
    } else if ((v.t == JV_INT || v.t == JV_BOOL) && (type == 0 || type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b')) {
        if (type == 'x') snprintf(tmp, sizeof tmp, "%llx", (long long)v.i);
        else if (type == 'X') snprintf(tmp, sizeof tmp, "%llX", (long long)v.i);
        else if (type == 'o') snprintf(tmp, sizeof tmp, "%llo", (long long)v.i);
        else snprintf(tmp, sizeof tmp, sign == '+' ? "%+lld" : sign == ' ' ? "% lld" : "%lld", (long long)v.i);
        jb_puts(&body, tmp);
        if (!align) align = zero ? '=' : '>';
    } else if (jv_is_num(v) && (type == 'f' || type == 'F' || type == 'e' || type == 'g' || type == '%' || type == 0)) {
        double d = jv_num(v);
        if (type == 0) py_float_repr(d, tmp, sizeof tmp);
        else if (type == '%') snprintf(tmp, sizeof tmp, "%.*f%%", prec < 0 ? 6 : prec, d * 100);
        else {
            char f[16];
            snprintf(f, sizeof f, "%%%s.*%c", sign == '+' ? "+" : "", type);
            snprintf(tmp, sizeof tmp, f, prec < 0 ? 6 : prec, d);
        }
        jb_puts(&body, tmp);
        if (!align) align = zero ? '=' : '>';
    } else jfail(c->t, MS_ERR_FORMAT, line, "unsupported format spec for %s", jv_type_name(v));
    size_t cps = body.n ? u8_count(body.p, body.n) : 0;
    int pad = width > (int)cps ? width - (int)cps : 0;
    if (zero && align == '=') fill = '0';
    int left = align == '<' ? 0 : align == '^' ? pad / 2 : pad;
    if (align == '=' && body.n && (body.p[0] == '-' || body.p[0] == '+')) { jb_putc(b, body.p[0]); body.p++; body.n--; }
    for (int k = 0; k < left; k++) jb_putc(b, fill);
    jb_put(b, body.p, body.n);
    for (int k = left; k < pad; k++) jb_putc(b, fill);
}

/* ---------------- attribute / item access ---------------- */

static const char *const STR_METHODS[] = {
    "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "replace", "upper", "lower", "title",
    "capitalize", "swapcase", "find", "rfind", "index", "rindex", "count", "format", "join", "isdigit", "isalpha",
    "isalnum", "isspace", "islower", "isupper", "isnumeric", "isdecimal", "splitlines", "center", "ljust", "rjust",
    "zfill", "removeprefix", "removesuffix", "partition", "rpartition", "casefold", NULL};
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", "copy", NULL};
static const char *const LIST_METHODS[] = {"count", "index", "copy", NULL};

static int in_list(const char *const *l, const char *n) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], n)) return 1;
    return 0;
}

static jv method(jctx *c, jv self, const char *name) {
    jfunc *fn = ja_alloc(c->t, sizeof *fn);
    fn->kind = JF_METHOD;
    fn->name = name;
    fn->self = self;
    jv v = {.t = JV_FUNC, .fn = fn};
    return v;
}

jv jinja_getattr(jctx *c, int line, jv obj, const char *name) {
    switch (obj.t) {
    case JV_DICT:
        if (in_list(DICT_METHODS, name)) return method(c, obj, name);
        { jv *p = jd_gets(obj.d, name); if (p) return *p; }
        return JV_UNDEFINED;
    case JV_NS: { jv *p = jd_gets(obj.d, name); return p ? *p : JV_UNDEFINED; }
    case JV_STR: return in_list(STR_METHODS, name) ? method(c, obj, name) : JV_UNDEFINED;
    case JV_LIST:
        if (obj.l->group && obj.l->n == 2 && !strcmp(name, "grouper")) return obj.l->v[0];
        if (obj.l->group && obj.l->n == 2 && !strcmp(name, "list")) return obj.l->v[1];
        return in_list(LIST_METHODS, name) ? method(c, obj, name) : JV_UNDEFINED;
    case JV_LOOP: {
        jloop *l = obj.lp;
        if (!strcmp(name, "index")) return jv_int(l->index0 + 1);
        if (!strcmp(name, "index0")) return jv_int(l->index0);
        if (!strcmp(name, "revindex")) return jv_int(l->length - l->index0);
        if (!strcmp(name, "revindex0")) return jv_int(l->length - l->index0 - 1);
        if (!strcmp(name, "first")) return jv_bool(l->index0 == 0);
        if (!strcmp(name, "last")) return jv_bool(l->index0 == l->length - 1);
        if (!strcmp(name, "length")) return jv_int(l->length);
        if (!strcmp(name, "depth")) return jv_int(l->depth0 + 1);
        if (!strcmp(name, "depth0")) return jv_int(l->depth0);
        if (!strcmp(name, "previtem")) return l->index0 > 0 ? l->items->v[l->index0 - 1] : JV_UNDEFINED;
        if (!strcmp(name, "nextitem")) return l->index0 + 1 < l->length ? l->items->v[l->index0 + 1] : JV_UNDEFINED;
        if (!strcmp(name, "cycle") || !strcmp(name, "changed")) return method(c, obj, name);
        return JV_UNDEFINED;
    }
    default: return JV_UNDEFINED;
    }
}

jv jinja_getitem(jctx *c, int line, jv obj, jv key) {
    switch (obj.t) {
    case JV_DICT: { jv *p = jd_get(obj.d, key); if (p) return *p; break; }
    case JV_LIST:
        if (key.t == JV_INT || key.t == JV_BOOL) {
            int64_t i = key.i, n = (int64_t)obj.l->n;
            if (i < 0) i += n;
            return (i >= 0 && i < n) ? obj.l->v[i] : JV_UNDEFINED;
        }
        break;
    case JV_STR:
        if (key.t == JV_INT || key.t == JV_BOOL) {
            int64_t i = key.i, n = (int64_t)u8_count(obj.s->s, obj.s->len);
            if (i < 0) i += n;
            if (i < 0 || i >= n) return JV_UNDEFINED;
            size_t a = u8_offset(obj.s->s, obj.s->len, (size_t)i), b = a;
            u8_decode(obj.s->s, obj.s->len, &b);
            return jv_str(c->t, obj.s->s + a, b - a);
        }
        break;
    default: break;
    }
    if (key.t == JV_STR) return jinja_getattr(c, line, obj, key.s->s);
    return JV_UNDEFINED;
}

/* ---------------- methods ---------------- */

static jv str_method(jctx *c, int line, jstr *s, const char *m, jargs *a) {
    jv x, y, z;
    jv self = {.t = JV_STR, .s = s};
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        if (!jarg(a, 0, NULL, &x)) jfail(c->t, MS_ERR_FORMAT, line, "%s() takes at least 1 argument", m);
        jstr *t = s;
        if (jarg(a, 1, NULL, &y)) {
            int64_t n = (int64_t)u8_count(s->s, s->len), st = want_int(c, line, y, "start"), en = n;
            if (jarg(a, 2, NULL, &z) && z.t != JV_NONE) en = want_int(c, line, z, "end");
            if (st < 0) { st += n; if (st < 0) st = 0; }
            if (en < 0) { en += n; if (en < 0) en = 0; }
            if (en > n) en = n;
            if (st > n) return jv_bool(0);
            if (en < st) en = st;
            size_t ao = u8_offset(s->s, s->len, (size_t)st), bo = u8_offset(s->s, s->len, (size_t)en);
            t = jv_str(c->t, s->s + ao, bo - ao).s;
        }
        return jv_bool(affix(c, line, t, x, m[0] == 'e'));
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        jv sep = jv_none();
        int64_t mx = -1;
        jarg(a, 0, "sep", &sep);
        if (jarg(a, 1, "maxsplit", &y)) mx = want_int(c, line, y, "maxsplit");
        return str_split(c, line, s, sep, mx, m[0] == 'r');
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        jstr *chars = NULL;
        if (jarg(a, 0, NULL, &x) && x.t != JV_NONE) chars = want_str(c, line, x, "strip arg");
        return jinja_strip(c, s, chars, m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3);
    }
    if (!strcmp(m, "replace")) {
        if (!jarg(a, 0, NULL, &x) || !jarg(a, 1, NULL, &y)) jfail(c->t, MS_ERR_FORMAT, line, "replace() takes at least 2 arguments");
        int64_t cnt = -1;
        if (jarg(a, 2, "count", &z)) cnt = want_int(c, line, z, "count");
        return jinja_replace(c, line, s, want_str(c, line, x, "replace arg"), want_str(c, line, y, "replace arg"), cnt);
    }
    if (!strcmp(m, "upper")) return jinja_case(c, s, 1);
    if (!strcmp(m, "lower") || !strcmp(m, "casefold")) return jinja_case(c, s, 0);
    if (!strcmp(m, "capitalize")) return jinja_case(c, s, 2);
    if (!strcmp(m, "title")) return jinja_case(c, s, 3);
    if (!strcmp(m, "swapcase")) return jinja_case(c, s, 4);
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex")) {
        if (!jarg(a, 0, NULL, &x)) jfail(c->t, MS_ERR_FORMAT, line, "%s() takes at least 1 argument", m);
        int64_t st = 0, en = INT64_MAX / 2;
        if (jarg(a, 1, NULL, &y) && y.t != JV_NONE) st = want_int(c, line, y, "start");
        if (jarg(a, 2, NULL, &z) && z.t != JV_NONE) en = want_int(c, line, z, "end");
        int64_t r = str_find(s, want_str(c, line, x, "substring"), st, en, m[0] == 'r');
        if (r < 0 && strstr(m, "index")) jfail(c->t, MS_ERR_FORMAT, line, "substring not found");
        return jv_int(r);
    }
    if (!strcmp(m, "count")) {
        if (!jarg(a, 0, NULL, &x)) jfail(c->t, MS_ERR_FORMAT, line, "count() takes at least 1 argument");
        return jv_int(str_count(s, want_str(c, line, x, "substring")));
    }
    if (!strcmp(m, "format")) return str_format(c, line, s, a);
    if (!strcmp(m, "join")) {
        if (!jarg(a, 0, NULL, &x)) jfail(c->t, MS_ERR_FORMAT, line, "join() takes exactly one argument");
        jlist *l = jinja_iter(c, line, x);
        jbuf b;
        jb_init(&b, c->t, c->max_output);
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].t != JV_STR)
                jfail(c->t, MS_ERR_FORMAT, line, "sequence item %zu: expected str instance, %s found", i, jv_type_name(l->v[i]));
            if (i) jb_put(&b, s->s, s->len);
            jb_put(&b, l->v[i].s->s, l->v[i].s->len);
        }
        return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
    }
    if (!strcmp(m, "isdigit") || !strcmp(m, "isnumeric") || !strcmp(m, "isdecimal")) return jv_bool(all_cp(s, 0));
    if (!strcmp(m, "isalpha")) return jv_bool(all_cp(s, 1));
    if (!strcmp(m, "isalnum")) return jv_bool(all_cp(s, 2));
    if (!strcmp(m, "isspace")) return jv_bool(all_cp(s, 3));
    if (!strcmp(m, "islower")) return jv_bool(all_cp(s, 4));
    if (!strcmp(m, "isupper")) return jv_bool(all_cp(s, 5));
    if (!strcmp(m, "splitlines")) {
        jv out = jv_list(c->t, 8);
        int keep = jarg(a, 0, "keepends", &x) && jv_truthy(x);
        size_t i = 0, st = 0;
        while (i < s->len) {
            size_t q = i;
            uint32_t cp = (uint32_t)u8_decode(s->s, s->len, &q);
            int brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
                      cp == 0x2028 || cp == 0x2029;
            if (!brk) { i = q; continue; }
            if (cp == '\r' && q < s->len && s->s[q] == '\n') q++;
            jl_push(c->t, out.l, jv_str(c->t, s->s + st, (keep ? q : i) - st));
            i = st = q;
        }
        if (st < s->len) jl_push(c->t, out.l, jv_str(c->t, s->s + st, s->len - st));
        return out;
    }
    if (!strcmp(m, "center") || !strcmp(m, "ljust") || !strcmp(m, "rjust") || !strcmp(m, "zfill")) {
        if (!jarg(a, 0, NULL, &x)) jfail(c->t, MS_ERR_FORMAT, line, "%s() takes at least 1 argument", m);
        int64_t w = want_int(c, line, x, "width"), n = (int64_t)u8_count(s->s, s->len);
        if (w > (int64_t)(1 << 24)) jfail(c->t, MS_ERR_LIMIT, line, "%s() width too large", m);
        char fill = m[0] == 'z' ? '0' : ' ';
        if (jarg(a, 1, NULL, &y)) { jstr *fs = want_str(c, line, y, "fill"); if (fs->len != 1) jfail(c->t, MS_ERR_FORMAT, line, "fill character must be exactly one character long"); fill = fs->s[0]; }
        if (w <= n) return self;
        int64_t pad = w - n, left = m[0] == 'l' ? 0 : m[0] == 'r' || m[0] == 'z' ? pad : (pad / 2 + (pad & w & 1));
        jbuf b;
        jb_init(&b, c->t, 0);
        size_t off = 0;
        if (m[0] == 'z' && s->len && (s->s[0] == '-' || s->s[0] == '+')) { jb_putc(&b, s->s[0]); off = 1; }
        for (int64_t k = 0; k < left; k++) jb_putc(&b, fill);
        jb_put(&b, s->s + off, s->len - off);
        for (int64_t k = left; k < pad; k++) jb_putc(&b, fill);
        return jb_take(&b);
    }
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        if (!jarg(a, 0, NULL, &x)) jfail(c->t, MS_ERR_FORMAT, line, "%s() takes exactly one argument", m);
        jstr *p = want_str(c, line, x, "affix");
        if (p->len <= s->len) {
            if (m[6] == 'p' && !memcmp(s->s, p->s, p->len)) return jv_str(c->t, s->s + p->len, s->len - p->len);
            if (m[6] == 's' && !memcmp(s->s + s->len - p->len, p->s, p->len) && p->len) return jv_str(c->t, s->s, s->len - p->len);
        }
        return self;
    }
    if (!strcmp(m, "partition") || !strcmp(m, "rpartition")) {
        if (!jarg(a, 0, NULL, &x)) jfail(c->t, MS_ERR_FORMAT, line, "%s() takes exactly one argument", m);
        jstr *p = want_str(c, line, x, "separator");
        if (!p->len) jfail(c->t, MS_ERR_FORMAT, line, "empty separator");
        jv out = jv_tuple(c->t, 3);
        const char *h = NULL;
        if (m[0] == 'p') h = memmem(s->s, s->len, p->s, p->len);
        else if (s->len >= p->len)
            for (size_t k = s->len - p->len + 1; k-- > 0;)
                if (!memcmp(s->s + k, p->s, p->len)) { h = s->s + k; break; }
        if (!h) {
            jv e = jv_str(c->t, "", 0);
            if (m[0] == 'p') { jl_push(c->t, out.l, self); jl_push(c->t, out.l, e); jl_push(c->t, out.l, e); }
            else { jl_push(c->t, out.l, e); jl_push(c->t, out.l, e); jl_push(c->t, out.l, self); }
            return out;
        }
        size_t k = (size_t)(h - s->s);
        jl_push(c->t, out.l, jv_str(c->t, s->s, k));
        jl_push(c->t, out.l, x);
        jl_push(c->t, out.l, jv_str(c->t, s->s + k + p->len, s->len - k - p->len));
        return out;
    }
    jfail(c->t, MS_ERR_FORMAT, line, "'str' object has no attribute '%s'", m);
}

jv jinja_call_method(jctx *c, int line, jv self, const char *name, jargs *a) {
    jv x, y;
    if (self.t == JV_STR) return str_method(c, line, self.s, name, a);
    if (self.t == JV_DICT) {
        if (!strcmp(name, "get")) {
            if (!jarg(a, 0, NULL, &x)) jfail(c->t, MS_ERR_FORMAT, line, "get expected at least 1 argument, got 0");
            jv *p = jd_get(self.d, x);
            if (p) return *p;
            return jarg(a, 1, NULL, &y) ? y : jv_none();
        }
        if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values")) {
            jv out = jv_list(c->t, self.d->n + 1);
            for (size_t i = 0; i < self.d->n; i++) {
                if (name[0] == 'k') jl_push(c->t, out.l, self.d->k[i]);
                else if (name[0] == 'v') jl_push(c->t, out.l, self.d->v[i]);
                else {
                    jv t = jv_tuple(c->t, 2);
                    jl_push(c->t, t.l, self.d->k[i]);
                    jl_push(c->t, t.l, self.d->v[i]);
                    jl_push(c->t, out.l, t);
                }
            }
            return out;
        }
        if (!strcmp(name, "copy")) {
            jv out = jv_dict(c->t);
            for (size_t i = 0; i < self.d->n; i++) jd_set(c->t, out.d, self.d->k[i], self.d->v[i]);
            return out;
        }
    }
    if (self.t == JV_LIST) {
        if (!strcmp(name, "count")) {
            if (!jarg(a, 0, NULL, &x)) jfail(c->t, MS_ERR_FORMAT, line, "count() takes exactly one argument");
            int64_t n = 0;
            for (size_t i = 0; i < self.l->n; i++) n += jv_eq(self.l->v[i], x);
            return jv_int(n);
        }
        if (!strcmp(name, "index")) {
            if (!jarg(a, 0, NULL, &x)) jfail(c->t, MS_ERR_FORMAT, line, "index() takes at least 1 argument");
            for (size_t i = 0; i < self.l->n; i++)
                if (jv_eq(self.l->v[i], x)) return jv_int((int64_t)i);
            jfail(c->t, MS_ERR_FORMAT, line, "value is not in list");
        }
        if (!strcmp(name, "copy")) {
            jv out = jv_list(c->t, self.l->n + 1);
            for (size_t i = 0; i < self.l->n; i++) jl_push(c->t, out.l, self.l->v[i]);
            return out;
        }
    }
    if (self.t == JV_LOOP) {
        jloop *l = self.lp;
        if (!strcmp(name, "cycle")) {
            if (!a->npos) jfail(c->t, MS_ERR_FORMAT, line, "no items for cycling given");
            return a->pos[l->index0 % a->npos];
        }
        if (!strcmp(name, "changed")) {
            jv t = jv_tuple(c->t, (size_t)a->npos + 1);
            for (int i = 0; i < a->npos; i++) jl_push(c->t, t.l, a->pos[i]);
            if (!l->has_last || !jv_eq(t, l->last)) { l->last = t; l->has_last = 1; return jv_bool(1); }
            return jv_bool(0);
        }
    }
    jfail(c->t, MS_ERR_FORMAT, line, "'%s' object has no method '%s'", jv_type_name(self), name);
}

/* ---------------- global functions ---------------- */

static const char *const BUILTINS[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", "lipsum",
                                       "cycler", "joiner", NULL};
int jinja_builtin_known(const char *name) { return in_list(BUILTINS, name); }

jv jinja_call_builtin(jctx *c, int line, const char *name, jargs *a) {
    if (!strcmp(name, "range")) {
        jargs_check(c, line, "range", a, 3, NULL);
        if (!a->npos) jfail(c->t, MS_ERR_FORMAT, line, "range expected at least 1 argument, got 0");
        int64_t lo = 0, hi, st = 1;
        if (a->npos == 1) hi = want_int(c, line, a->pos[0], "range() argument");
        else {
            lo = want_int(c, line, a->pos[0], "range() argument");
            hi = want_int(c, line, a->pos[1], "range() argument");
            if (a->npos == 3) st = want_int(c, line, a->pos[2], "range() argument");
        }
        if (!st) jfail(c->t, MS_ERR_FORMAT, line, "range() arg 3 must not be zero");
        int64_t n = st > 0 ? (hi > lo ? (hi - lo + st - 1) / st : 0) : (lo > hi ? (lo - hi - st - 1) / -st : 0);
        if (n > 100000) jfail(c->t, MS_ERR_LIMIT, line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        jv out = jv_list(c->t, (size_t)n + 1);
        for (int64_t i = 0; i < n; i++) jl_push(c->t, out.l, jv_int(lo + i * st));
        return out;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jv out = name[0] == 'n' ? jv_ns(c->t) : jv_dict(c->t);
        if (a->npos > 1) jfail(c->t, MS_ERR_FORMAT, line, "%s expected at most 1 positional argument", name);
        if (a->npos == 1) {
            jv src = a->pos[0];
            if (src.t == JV_DICT || src.t == JV_NS) {
                for (size_t i = 0; i < src.d->n; i++) jd_set(c->t, out.d, src.d->k[i], src.d->v[i]);
            } else {
                jlist *l = jinja_iter(c, line, src);
                for (size_t i = 0; i < l->n; i++) {
                    jv p = l->v[i];
                    if (p.t != JV_LIST || p.l->n != 2)
                        jfail(c->t, MS_ERR_FORMAT, line, "dictionary update sequence element #%zu has the wrong length", i);
                    jd_set(c->t, out.d, p.l->v[0], p.l->v[1]);
                }
            }
        }
        for (int k = 0; k < a->nkw; k++) jd_set(c->t, out.d, jv_cstr(c->t, a->kwn[k]), a->kwv[k]);
        return out;
    }
    if (!strcmp(name, "raise_exception")) {
        jv m;
        if (!jarg(a, 0, "message", &m)) jfail(c->t, MS_ERR_FORMAT, line, "raise_exception() missing message");
        jv s = jv_to_str(c->t, m);
        jfail(c->t, MS_ERR_FORMAT, line, "%s", s.s->s);
    }
    if (!strcmp(name, "strftime_now")) {
        jv f;
        if (!jarg(a, 0, "format", &f) || f.t != JV_STR) jfail(c->t, MS_ERR_FORMAT, line, "strftime_now() needs a format string");
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char buf[512];
        size_t n = strftime(buf, sizeof buf, f.s->s, &tmv);
        if (!n && f.s->len) jfail(c->t, MS_ERR_FORMAT, line, "strftime_now(): result too long or empty format");
        return jv_str(c->t, buf, n);
    }
    jfail(c->t, MS_ERR_UNSUPPORTED, line, "the global '%s' is not supported", name);
}

/* ---------------- operators ---------------- */

static jv num_result(jctx *c, int line, int op, jv a, jv b) {
    int isint = a.t != JV_FLOAT && b.t != JV_FLOAT;
    if (isint) {
        int64_t x = a.i, y = b.i, r;
        switch (op) {
        case T_ADD: if (__builtin_add_overflow(x, y, &r)) goto ovf; return jv_int(r);
        case T_SUB: if (__builtin_sub_overflow(x, y, &r)) goto ovf; return jv_int(r);
        case T_MUL: if (__builtin_mul_overflow(x, y, &r)) goto ovf; return jv_int(r);
        case T_DIV:
            if (!y) jfail(c->t, MS_ERR_FORMAT, line, "division by zero");
            return jv_float((double)x / (double)y);
        case T_FLOORDIV: case T_MOD: {
            if (!y) jfail(c->t, MS_ERR_FORMAT, line, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) goto ovf;
            int64_t q = x / y, m = x % y;
            if (m && ((m < 0) != (y < 0))) { q--; m += y; }
            return jv_int(op == T_MOD ? m : q);
        }
        case T_POW: {
            if (y < 0) return jv_float(pow((double)x, (double)y));
            int64_t acc = 1, base = x;
            while (y) {
                if (y & 1) { if (__builtin_mul_overflow(acc, base, &acc)) goto ovf; }
                y >>= 1;
                if (y && __builtin_mul_overflow(base, base, &base)) goto ovf;
            }
            return jv_int(acc);
        }
        }
    }
    double x = jv_num(a), y = jv_num(b);
    switch (op) {
    case T_ADD: return jv_float(x + y);
    case T_SUB: return jv_float(x - y);
    case T_MUL: return jv_float(x * y);
    case T_DIV:
        if (y == 0) jfail(c->t, MS_ERR_FORMAT, line, "float division by zero");
        return jv_float(x / y);
    case T_FLOORDIV: case T_MOD: {
        if (y == 0) jfail(c->t, MS_ERR_FORMAT, line, "float modulo");
        double m = fmod(x, y);
        double q = (x - m) / y;
        if (m) { if ((y < 0) != (m < 0)) { m += y; q -= 1.0; } }
        else m = copysign(0.0, y);
        if (op == T_MOD) return jv_float(m);
        double fq = floor(q);
        if (q - fq > 0.5) fq += 1.0;
        return jv_float(q ? fq : copysign(0.0, x / y));
    }
    case T_POW:
        if (x == 0 && y < 0) jfail(c->t, MS_ERR_FORMAT, line, "0.0 cannot be raised to a negative power");
        return jv_float(pow(x, y));
    }
ovf:
    jfail(c->t, MS_ERR_LIMIT, line, "integer overflow (moonshine integers are 64-bit)");
}

static const char *op_sym(int op) {
    switch (op) {
    case T_ADD: return "+";
    case T_SUB: return "-";
    case T_MUL: return "*";
    case T_DIV: return "/";
    case T_FLOORDIV: return "//";
    case T_MOD: return "%";
    case T_POW: return "**";
    default: return "~";
    }
}

static jv repeat(jctx *c, int line, jv seq, int64_t n) {
    if (n < 0) n = 0;
    size_t unit = seq.t == JV_STR ? seq.s->len : seq.l->n * sizeof(jv);
    if (n && unit && (uint64_t)n * unit > c->max_output) jfail(c->t, MS_ERR_LIMIT, line, "repeated sequence too large");
    if (seq.t == JV_STR) {
        jbuf b;
        jb_init(&b, c->t, 0);
        for (int64_t i = 0; i < n; i++) jb_put(&b, seq.s->s, seq.s->len);
        return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
    }
    jv out = seq.l->tuple ? jv_tuple(c->t, 4) : jv_list(c->t, 4);
    for (int64_t i = 0; i < n; i++)
        for (size_t k = 0; k < seq.l->n; k++) jl_push(c->t, out.l, seq.l->v[k]);
    return out;
}

jv jinja_binop(jctx *c, int line, int op, jv a, jv b) {
    if (op == T_TILDE) {
        jbuf buf;
        jb_init(&buf, c->t, c->max_output);
        jv_write_str(&buf, a);
        jv_write_str(&buf, b);
        return buf.p ? jb_take(&buf) : jv_str(c->t, "", 0);
    }
    if (a.t == JV_UNDEF || b.t == JV_UNDEF)
        jfail(c->t, MS_ERR_FORMAT, line, "undefined value used with operator '%s'", op_sym(op));
    if (jv_is_num(a) && jv_is_num(b)) return num_result(c, line, op, a, b);
    if (op == T_ADD) {
        if (a.t == JV_STR && b.t == JV_STR) {
            jbuf buf;
            jb_init(&buf, c->t, c->max_output);
            jb_put(&buf, a.s->s, a.s->len);
            jb_put(&buf, b.s->s, b.s->len);
            return buf.p ? jb_take(&buf) : jv_str(c->t, "", 0);
        }
        if (a.t == JV_LIST && b.t == JV_LIST && a.l->tuple == b.l->tuple) {
            jv out = a.l->tuple ? jv_tuple(c->t, a.l->n + b.l->n + 1) : jv_list(c->t, a.l->n + b.l->n + 1);
            for (size_t i = 0; i < a.l->n; i++) jl_push(c->t, out.l, a.l->v[i]);
            for (size_t i = 0; i < b.l->n; i++) jl_push(c->t, out.l, b.l->v[i]);
            return out;
        }
    }
    if (op == T_MUL) {
        if ((a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL)) return repeat(c, line, a, b.i);
        if ((b.t == JV_STR || b.t == JV_LIST) && (a.t == JV_INT || a.t == JV_BOOL)) return repeat(c, line, b, a.i);
    }
    if (op == T_MOD && a.t == JV_STR) return jinja_percent_format(c, line, a, b);
    jfail(c->t, MS_ERR_FORMAT, line, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), jv_type_name(a),
          jv_type_name(b));
}

jv jinja_percent_format(jctx *c, int line, jv fmt, jv args) {
    jstr *f = fmt.s;
    jbuf b;
    jb_init(&b, c->t, c->max_output);
    int is_tuple = args.t == JV_LIST && args.l->tuple;
    size_t ai = 0, i = 0;
    int used_single = 0;
    while (i < f->len) {
        char ch = f->s[i];
        if (ch != '%') { jb_putc(&b, ch); i++; continue; }
        i++;
        if (i >= f->len) jfail(c->t, MS_ERR_FORMAT, line, "incomplete format");
        jv v;
        int have = 0;
        if (f->s[i] == '(') {
            size_t e = i + 1;
            while (e < f->len && f->s[e] != ')') e++;
            if (e >= f->len || args.t != JV_DICT) jfail(c->t, MS_ERR_FORMAT, line, "format requires a mapping");
            jv *p = jd_get(args.d, jv_str(c->t, f->s + i + 1, e - i - 1));
            if (!p) jfail(c->t, MS_ERR_FORMAT, line, "KeyError in %% format");
            v = *p;
            have = 1;
            i = e + 1;
        }
        char flags[8];
        int nf = 0;
        while (i < f->len && f->s[i] && strchr("-+ 0#", f->s[i]) && nf < 6) flags[nf++] = f->s[i++];
        flags[nf] = 0;
        int width = -1, prec = -1;
        if (i < f->len && f->s[i] >= '0' && f->s[i] <= '9') {
            width = 0;
            while (i < f->len && f->s[i] >= '0' && f->s[i] <= '9') { if (width < 1000000) width = width * 10 + (f->s[i] - '0'); i++; }
        }
        if (i < f->len && f->s[i] == '.') {
            i++;
            prec = 0;
            while (i < f->len && f->s[i] >= '0' && f->s[i] <= '9') { if (prec < 1000000) prec = prec * 10 + (f->s[i] - '0'); i++; }
        }
        if (i >= f->len) jfail(c->t, MS_ERR_FORMAT, line, "incomplete format");
        char conv = f->s[i++];
        if (width > 10000 || prec > 100) jfail(c->t, MS_ERR_LIMIT, line, "format width too large");
        if (conv == '%') { jb_putc(&b, '%'); continue; }
        if (!have) {
            if (is_tuple) {
                if (ai >= args.l->n) jfail(c->t, MS_ERR_FORMAT, line, "not enough arguments for format string");
                v = args.l->v[ai++];
            } else {
                if (used_single) jfail(c->t, MS_ERR_FORMAT, line, "not enough arguments for format string");
                v = args;
                used_single = 1;
            }
        }
        char spec[32], tmp[400];
        if (conv == 's' || conv == 'r' || conv == 'a') {
            jbuf sb;
            jb_init(&sb, c->t, 0);
            if (conv == 's') jv_write_str(&sb, v);
            else jv_write_repr(&sb, v);
            size_t n = sb.n;
            if (prec >= 0 && sb.p) n = u8_offset(sb.p, sb.n, (size_t)prec);
            size_t cps = sb.p ? u8_count(sb.p, n) : 0;
            int pad = width > (int)cps ? width - (int)cps : 0;
            int left = strchr(flags, '-') != NULL;
            if (!left) for (int k = 0; k < pad; k++) jb_putc(&b, ' ');
            if (sb.p) jb_put(&b, sb.p, n);
            if (left) for (int k = 0; k < pad; k++) jb_putc(&b, ' ');
            continue;
        }
        if (!jv_is_num(v)) jfail(c->t, MS_ERR_FORMAT, line, "%%%c format: a real number is required, not %s", conv, jv_type_name(v));
        if (conv && strchr("diu", conv)) {
            long long x = v.t == JV_FLOAT ? (long long)v.f : (long long)v.i;
            snprintf(spec, sizeof spec, "%%%s%s%s%slld", flags, width >= 0 ? "*" : "", prec >= 0 ? ".*" : "", "");
            if (width >= 0 && prec >= 0) snprintf(tmp, sizeof tmp, spec, width, prec, x);
            else if (width >= 0) snprintf(tmp, sizeof tmp, spec, width, x);
            else if (prec >= 0) snprintf(tmp, sizeof tmp, spec, prec, x);
            else snprintf(tmp, sizeof tmp, spec, x);
        } else if (conv && strchr("xXo", conv)) {
            if (v.t == JV_FLOAT) jfail(c->t, MS_ERR_FORMAT, line, "%%%c format: an integer is required, not float", conv);
            long long x = v.i;
            snprintf(spec, sizeof spec, "%%%s%s%sll%c", flags, width >= 0 ? "*" : "", "", conv);
            if (x < 0) jfail(c->t, MS_ERR_UNSUPPORTED, line, "negative %%%c format", conv);
            if (width >= 0) snprintf(tmp, sizeof tmp, spec, width, x);
            else snprintf(tmp, sizeof tmp, spec, x);
        } else if (conv && strchr("eEfFgG", conv)) {
            double x = jv_num(v);
            snprintf(spec, sizeof spec, "%%%s%s.*%c", flags, width >= 0 ? "*" : "", conv);
            if (width >= 0) snprintf(tmp, sizeof tmp, spec, width, prec < 0 ? 6 : prec, x);
            else snprintf(tmp, sizeof tmp, spec, prec < 0 ? 6 : prec, x);
        } else if (conv == 'c') {
            jbuf cb;
            jb_init(&cb, c->t, 0);
            u8_encode(&cb, (uint32_t)(v.t == JV_FLOAT ? 0 : v.i));
            jb_put(&b, cb.p, cb.n);
            continue;
        } else jfail(c->t, MS_ERR_FORMAT, line, "unsupported format character '%c'", conv);
        jb_puts(&b, tmp);
    }
    if (is_tuple && ai < args.l->n) jfail(c->t, MS_ERR_FORMAT, line, "not all arguments converted during string formatting");
    if (!is_tuple && !used_single && args.t != JV_DICT)
        jfail(c->t, MS_ERR_FORMAT, line, "not all arguments converted during string formatting");
    return b.p ? jb_take(&b) : jv_str(c->t, "", 0);
}
