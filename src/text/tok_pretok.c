/* tok_pretok.c — pre-tokenization: regex splitting with PCRE2 (UTF + UCP) and
 * the ByteLevel pre-tokenizer.
 *
 * tokenizers runs Split patterns with Oniguruma and tiktoken with Rust's regex;
 * PCRE2 differs from both in a few constructs, which are translated here:
 *   \s, \S   PCRE2 also counts U+180E as space; both others use White_Space.
 *   \p{Han}  PCRE2 >= 10.40 means Script_Extensions; both others mean Script.
 *   [A&&B]   class intersection (both others) has no PCRE2 form: (?=[B])[A].
 *   \h, \H   Oniguruma: hex digit (PCRE2: horizontal space).
 * Unicode data: PCRE2 10.42 and Oniguruma 6.9.8 (tokenizers' onig) are both 14.0. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

struct ms_regex {
    pcre2_code *code;
    int jit;
};

#define WS_BODY "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

static int is_script_name(const char *name, size_t n) {
    /* A script when PCRE2 accepts \p{sc=NAME}; general categories and binary
     * properties are not scripts. */
    char pat[96];
    if (n == 0 || n > 64) return 0;
    int k = snprintf(pat, sizeof pat, "\\p{sc=%.*s}", (int)n, name);
    int e;
    PCRE2_SIZE eo;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)pat, (size_t)k, PCRE2_UTF | PCRE2_UCP, &e, &eo, NULL);
    if (!c) return 0;
    pcre2_code_free(c);
    return 1;
}

/* Translate \p{...}/\P{...} at p (p[0] == '\\'); returns chars consumed or 0. */
static size_t tr_prop(const char *p, size_t n, ms_buf *o) {
    if (n < 4 || p[2] != '{') return 0;
    const char *close = memchr(p + 3, '}', n - 3);
    if (!close) return 0;
    const char *name = p + 3;
    size_t nl = (size_t)(close - name);
    int neg = 0;
    if (nl && name[0] == '^') neg = 1, name++, nl--;
    char head[4] = {'\\', p[1], '{', 0};
    ms_buf_add(o, head, 3);
    if (neg) ms_buf_add(o, "^", 1);
    if (!memchr(name, '=', nl) && !memchr(name, ':', nl) && is_script_name(name, nl)) ms_buf_add(o, "sc=", 3);
    ms_buf_add(o, name, nl);
    ms_buf_add(o, "}", 1);
    return (size_t)(close - p) + 1;
}

/* Any other escape at p (p[0] == '\\', n >= 2): \p{...}/\P{...} translated by tr_prop, the rest
 * (and a \p that is not a property) copied as its two bytes. Returns the bytes consumed. */
static size_t tr_escape(const char *p, size_t n, ms_buf *o) {
    size_t k = p[1] == 'p' || p[1] == 'P' ? tr_prop(p, n, o) : 0;
    if (!k) {
        ms_buf_add(o, p, 2);
        k = 2;
    }
    return k;
}

/* Translate a class body item-by-item until the matching ']' (not included).
 * Returns the index of the ']' in p, or (size_t)-1 on error. Top-level '&&'
 * operands are written separated by a NUL byte into o; *n_ops counts them. */
static size_t tr_class_body(const char *p, size_t n, size_t i, ms_buf *o, int *n_ops, ms_err *err) {
    int first = 1;
    *n_ops = 1;
    while (i < n) {
        char c = p[i];
        if (c == ']' && !first) return i;
        first = 0;
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            if (d == 's') {
                ms_buf_add(o, WS_BODY, strlen(WS_BODY));
                i += 2;
            } else if (d == 'h') {
                ms_buf_add(o, "0-9a-fA-F", 9);
                i += 2;
            } else {
                i += tr_escape(p + i, n - i, o);
            }
        } else if (c == '&' && i + 1 < n && p[i + 1] == '&') {
            ms_buf_add(o, "", 1); /* operand separator (NUL) */
            (*n_ops)++;
            i += 2;
            first = 1;
        } else if (c == '[' && i + 1 < n && p[i + 1] == ':') {
            const char *e = NULL;
            for (size_t j = i + 2; j + 1 < n; j++)
                if (p[j] == ':' && p[j + 1] == ']') {
                    e = p + j;
                    break;
                }
            if (!e) {
                ms_buf_add(o, "\\[", 2);
                i++;
                continue;
            }
            size_t l = (size_t)(e - (p + i)) + 2;
            ms_buf_add(o, p + i, l);
            i += l;
        } else if (c == '[') {
            /* nested class: union (inline it) or an intersection operand */
            size_t j = i + 1;
            int neg = 0;
            if (j < n && p[j] == '^') neg = 1, j++;
            ms_buf inner = {0};
            int ops = 0;
            size_t end = tr_class_body(p, n, j, &inner, &ops, err);
            if (end == (size_t)-1) {
                ms_buf_free(&inner);
                return end;
            }
            if (ops != 1 || (neg && o->n && o->p[o->n - 1] != 0)) {
                ms_buf_free(&inner);
                ms_fail(err, MS_ERR_UNSUPPORTED, "regex: nested class at offset %zu is not supported", i);
                return (size_t)-1;
            }
            if (neg) {
                /* only valid as a whole operand: mark it with a leading 0x01 */
                ms_buf_add(o, "\x01", 1);
            }
            ms_buf_add(o, inner.p ? (char *)inner.p : "", inner.n);
            ms_buf_free(&inner);
            i = end + 1;
        } else {
            ms_buf_add(o, p + i, 1);
            i++;
        }
    }
    ms_fail(err, MS_ERR_FORMAT, "regex: unterminated character class");
    return (size_t)-1;
}

/* Write one class operand (body, may start with 0x01 = negated) as [..]. */
static void put_class(ms_buf *o, const char *body, size_t n, int neg) {
    if (n && body[0] == '\x01') neg = !neg, body++, n--;
    ms_buf_add(o, neg ? "[^" : "[", neg ? 2 : 1);
    ms_buf_add(o, body, n);
    ms_buf_add(o, "]", 1);
}

static int translate(const char *p, size_t n, ms_buf *o, ms_err *err) {
    size_t i = 0;
    while (i < n) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            if (d == 's' || d == 'S') {
                ms_buf_add(o, d == 's' ? "[" : "[^", d == 's' ? 1 : 2);
                ms_buf_add(o, WS_BODY "]", strlen(WS_BODY) + 1);
                i += 2;
            } else if (d == 'h' || d == 'H') {
                ms_buf_add(o, d == 'h' ? "[0-9a-fA-F]" : "[^0-9a-fA-F]", d == 'h' ? 11 : 12);
                i += 2;
            } else {
                i += tr_escape(p + i, n - i, o);
            }
        } else if (c == '[') {
            size_t j = i + 1;
            int neg = 0;
            if (j < n && p[j] == '^') neg = 1, j++;
            ms_buf body = {0};
            int ops = 0;
            size_t end = tr_class_body(p, n, j, &body, &ops, err);
            if (end == (size_t)-1) {
                ms_buf_free(&body);
                return err ? err->code : MS_ERR_FORMAT;
            }
            if (ops == 1) {
                put_class(o, body.p ? (char *)body.p : "", body.n, neg);
            } else {
                if (neg) {
                    ms_buf_free(&body);
                    return ms_fail(err, MS_ERR_UNSUPPORTED, "regex: negated class intersection at offset %zu", i);
                }
                /* (?:(?=[B])(?=[C])[A]) */
                const char *b = (const char *)body.p;
                size_t len = body.n;
                const char *first_end = memchr(b, 0, len);
                ms_buf_add(o, "(?:", 3);
                const char *q = first_end + 1;
                while (q < b + len) {
                    const char *e = memchr(q, 0, (size_t)(b + len - q));
                    if (!e) e = b + len;
                    ms_buf_add(o, "(?=", 3);
                    put_class(o, q, (size_t)(e - q), 0);
                    ms_buf_add(o, ")", 1);
                    q = e + 1;
                }
                put_class(o, b, (size_t)(first_end - b), 0);
                ms_buf_add(o, ")", 1);
            }
            ms_buf_free(&body);
            i = end + 1;
        } else {
            ms_buf_add(o, p + i, 1);
            i++;
        }
    }
    return MS_OK;
}

int ms_regex_compile(const char *pat, size_t len, int literal, ms_regex **out, ms_err *err) {
    ms_buf tr = {0};
    const char *src = pat;
    size_t srclen = len;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP;
    if (literal) {
        opts = PCRE2_UTF | PCRE2_LITERAL;
    } else {
        int rc = translate(pat, len, &tr, err);
        if (rc) {
            ms_buf_free(&tr);
            return rc;
        }
        src = tr.p ? (const char *)tr.p : "";
        srclen = tr.n;
    }
    int e;
    PCRE2_SIZE eo;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)src, srclen, opts, &e, &eo, NULL);
    if (!code) {
        char msg[256];
        pcre2_get_error_message(e, (PCRE2_UCHAR *)msg, sizeof msg);
        int rc = ms_fail(err, MS_ERR_FORMAT, "regex %.200s: %s at offset %zu", src, msg, (size_t)eo);
        ms_buf_free(&tr);
        return rc;
    }
    ms_buf_free(&tr);
    ms_regex *r = calloc(1, sizeof *r);
    if (!r) {
        pcre2_code_free(code);
        return ms_fail(err, MS_ERR_NOMEM, "regex: out of memory");
    }
    r->code = code;
    r->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    *out = r;
    return MS_OK;
}

void ms_regex_free(ms_regex *r) {
    if (!r) return;
    pcre2_code_free(r->code);
    free(r);
}

void *ms_regex_match_data(const ms_regex *r) { return pcre2_match_data_create_from_pattern(r->code, NULL); }

void ms_regex_match_data_free(void *md) { pcre2_match_data_free(md); }

int ms_regex_next(const ms_regex *r, const uint8_t *s, size_t n, size_t pos, size_t *ms, size_t *me,
                  void *md, ms_err *err) {
    while (pos <= n) {
        int rc = r->jit ? pcre2_jit_match(r->code, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL)
                        : pcre2_match(r->code, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its frames on the heap */
            rc = pcre2_match(r->code, s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc < 0) {
            char msg[256];
            pcre2_get_error_message(rc, (PCRE2_UCHAR *)msg, sizeof msg);
            return ms_fail(err, MS_ERR_LIMIT, "regex match at byte %zu: %s", pos, msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] > ov[0]) {
            *ms = ov[0];
            *me = ov[1];
            return 1;
        }
        /* empty match: Oniguruma's find_iter moves on by one character */
        pos = ov[0] + 1;
        while (pos < n && (s[pos] & 0xC0) == 0x80) pos++;
    }
    return 0;
}

/* ---- pre-tokenization ---- */

static int pieces_push(ms_pieces *p, size_t off, size_t len) {
    if (len == 0) return 0;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        ms_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v) return -1;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n].off = off;
    p->v[p->n].len = len;
    p->n++;
    return 0;
}

typedef struct {
    size_t a, b;
    int m;
} span;

/* Split one piece with a regex per tokenizers' Split(behavior, invert). */
static int split_piece(const ms_pre_step *st, const uint8_t *arena, ms_piece pc, void *md, ms_pieces *out,
                       span **sp, size_t *spcap, ms_err *err) {
    const uint8_t *s = arena + pc.off;
    size_t n = pc.len, ns = 0, prev = 0, pos = 0;
#define SPUSH(A, B, M)                                                         \
    do {                                                                       \
        if (ns == *spcap) {                                                    \
            size_t c2 = *spcap ? *spcap * 2 : 64;                              \
            span *v2 = realloc(*sp, c2 * sizeof *v2);                          \
            if (!v2) return ms_fail(err, MS_ERR_NOMEM, "pre-tokenize: out of memory"); \
            *sp = v2;                                                          \
            *spcap = c2;                                                       \
        }                                                                      \
        (*sp)[ns].a = (A), (*sp)[ns].b = (B), (*sp)[ns].m = (M);               \
        ns++;                                                                  \
    } while (0)
    for (;;) {
        size_t a, b;
        int rc = ms_regex_next(st->re, s, n, pos, &a, &b, md, err);
        if (rc < 0) return rc;
        if (rc == 0) break;
        if (a != prev) SPUSH(prev, a, 0);
        SPUSH(a, b, 1);
        prev = pos = b;
    }
    if (prev != n) SPUSH(prev, n, 0);
#undef SPUSH
    span *v = *sp;
    if (st->invert)
        for (size_t i = 0; i < ns; i++) v[i].m = !v[i].m;
    size_t k = 0; /* merged spans written back in place */
    switch (st->behavior) {
    case MS_SPLIT_REMOVED:
        for (size_t i = 0; i < ns; i++)
            if (!v[i].m) v[k++] = v[i];
        break;
    case MS_SPLIT_ISOLATED:
        k = ns;
        break;
    case MS_SPLIT_MERGED_PREV: {
        int prevm = 0;
        for (size_t i = 0; i < ns; i++) {
            int m = v[i].m;
            if (m && !prevm && k) v[k - 1].b = v[i].b;
            else v[k++] = v[i];
            prevm = m;
        }
        break;
    }
    case MS_SPLIT_MERGED_NEXT: {
        /* walk backwards, merging a match into the span after it */
        int prevm = 0;
        size_t w = ns; /* write position from the end */
        for (size_t i = ns; i-- > 0;) {
            int m = v[i].m;
            if (m && !prevm && w < ns) v[w].a = v[i].a;
            else v[--w] = v[i];
            prevm = m;
        }
        for (size_t i = w; i < ns; i++) v[k++] = v[i];
        break;
    }
    case MS_SPLIT_CONTIGUOUS: {
        int prevm = 0;
        for (size_t i = 0; i < ns; i++) {
            int m = v[i].m;
            if (m == prevm && k) v[k - 1].b = v[i].b;
            else v[k++] = v[i];
            prevm = m;
        }
        break;
    }
    }
    for (size_t i = 0; i < k; i++)
        if (pieces_push(out, pc.off + v[i].a, v[i].b - v[i].a))
            return ms_fail(err, MS_ERR_NOMEM, "pre-tokenize: out of memory");
    return MS_OK;
}

int ms_pretokenize(const ms_pre_step *steps, int n_steps, ms_buf *arena, size_t start, size_t n0,
                   ms_pieces *out, ms_err *err) {
    ms_pieces cur = {0}, nxt = {0};
    span *sp = NULL;
    size_t spcap = 0;
    int rc = MS_OK;
    if (pieces_push(&cur, start, n0)) return ms_fail(err, MS_ERR_NOMEM, "pre-tokenize: out of memory");
    for (int si = 0; si < n_steps && !rc; si++) {
        const ms_pre_step *st = &steps[si];
        void *md = st->re ? ms_regex_match_data(st->re) : NULL;
        if (st->re && !md) {
            rc = ms_fail(err, MS_ERR_NOMEM, "pre-tokenize: out of memory");
            break;
        }
        nxt.n = 0;
        for (size_t i = 0; i < cur.n && !rc; i++) {
            ms_piece pc = cur.v[i];
            if (st->kind == MS_PRE_BYTELEVEL && st->add_prefix_space && arena->p[pc.off] != ' ') {
                size_t off = arena->n;
                if (ms_buf_reserve(arena, pc.len + 2)) {
                    rc = ms_fail(err, MS_ERR_NOMEM, "pre-tokenize: out of memory");
                    break;
                }
                arena->p[arena->n++] = ' ';
                memcpy(arena->p + arena->n, arena->p + pc.off, pc.len);
                arena->n += pc.len;
                arena->p[arena->n] = 0;
                pc.off = off;
                pc.len += 1;
            }
            if (st->re) rc = split_piece(st, arena->p, pc, md, &nxt, &sp, &spcap, err);
            else if (pieces_push(&nxt, pc.off, pc.len)) rc = ms_fail(err, MS_ERR_NOMEM, "pre-tokenize: out of memory");
        }
        if (md) ms_regex_match_data_free(md);
        ms_pieces t = cur;
        cur = nxt;
        nxt = t;
    }
    for (size_t i = 0; i < cur.n && !rc; i++)
        if (pieces_push(out, cur.v[i].off, cur.v[i].len)) rc = ms_fail(err, MS_ERR_NOMEM, "pre-tokenize: out of memory");
    free(cur.v);
    free(nxt.v);
    free(sp);
    return rc;
}
