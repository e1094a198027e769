/* jinja_lex.c — Jinja2 tokenizer with the transformers settings:
 * trim_blocks, lstrip_blocks, `-`/`+` whitespace markers, comments, raw
 * blocks, newline normalization and the dropped final newline. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

typedef struct lx {
    jtrap *t;
    const char *s;
    size_t n, pos;
    int line;
    jtok *toks;
    int ntok, cap;
    char brace[256];
    int nbrace;
} lx;

static jtok *emit(lx *L, int type, int line) {
    if (L->ntok == L->cap) {
        int nc = L->cap ? L->cap * 2 : 256;
        if (nc > (1 << 24)) jfail(L->t, MS_ERR_LIMIT, line, "too many tokens");
        L->toks = ja_grow(L->t, L->toks, (size_t)L->cap * sizeof(jtok), (size_t)nc * sizeof(jtok));
        L->cap = nc;
    }
    jtok *k = &L->toks[L->ntok++];
    memset(k, 0, sizeof *k);
    k->type = type;
    k->line = line;
    return k;
}

static int count_nl(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

/* advance *p over Unicode whitespace (\s) */
static size_t skip_ws(const char *s, size_t n, size_t p) {
    while (p < n) {
        size_t q = p;
        int c = u8_decode(s, n, &q);
        if (!py_isspace((uint32_t)c)) break;
        p = q;
    }
    return p;
}

/* length of text after Python's str.rstrip() */
static size_t rstrip_len(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        size_t q = st;
        int c = u8_decode(s, end, &q);
        if (q != end || !py_isspace((uint32_t)c)) break;
        end = st;
    }
    return end;
}

static int all_ws(const char *s, size_t n) {
    size_t p = skip_ws(s, n, 0);
    return n > 0 && p == n;
}

static void emit_data(lx *L, size_t start, size_t len, int line) {
    if (!len) return;
    jtok *k = emit(L, T_DATA, line);
    k->s = ja_strndup(L->t, L->s + start, len);
    k->len = len;
}

/* Apply `-` / lstrip_blocks to the text [start, end) before a tag; returns new length. */
static size_t strip_before(lx *L, size_t start, size_t end, char sign, int is_var, int line_starting) {
    const char *text = L->s + start;
    size_t len = end - start;
    if (sign == '-') return rstrip_len(text, len);
    if (sign != '+' && !is_var) {
        size_t l_pos = 0;
        for (size_t i = len; i > 0; i--)
            if (text[i - 1] == '\n') { l_pos = i; break; }
        if ((l_pos > 0 || line_starting) && all_ws(text + l_pos, len - l_pos)) return l_pos;
    }
    return len;
}

static int starts(lx *L, size_t p, const char *w) {
    size_t l = strlen(w);
    return p + l <= L->n && !memcmp(L->s + p, w, l);
}

/* Decode a string literal body like Python's unicode-escape. */
static void lex_string(lx *L, int line) {
    char q = L->s[L->pos];
    size_t p = L->pos + 1;
    jbuf b;
    jb_init(&b, L->t, 0);
    for (;;) {
        if (p >= L->n) jfail(L->t, MS_ERR_FORMAT, line, "unexpected end of string");
        char c = L->s[p];
        if (c == q) { p++; break; }
        if (c != '\\') { jb_putc(&b, c); p++; continue; }
        if (p + 1 >= L->n) jfail(L->t, MS_ERR_FORMAT, line, "unexpected end of string");
        char e = L->s[p + 1];
        p += 2;
        switch (e) {
        case '\n': break;
        case '\\': jb_putc(&b, '\\'); break;
        case '\'': jb_putc(&b, '\''); break;
        case '"': jb_putc(&b, '"'); break;
        case 'a': jb_putc(&b, '\a'); break;
        case 'b': jb_putc(&b, '\b'); break;
        case 'f': jb_putc(&b, '\f'); break;
        case 'n': jb_putc(&b, '\n'); break;
        case 'r': jb_putc(&b, '\r'); break;
        case 't': jb_putc(&b, '\t'); break;
        case 'v': jb_putc(&b, '\v'); break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (int i = 0; i < nd; i++) {
                char h = p < L->n ? L->s[p] : 0;
                int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                      : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                if (d < 0) jfail(L->t, MS_ERR_FORMAT, line, "truncated \\%c escape in string", e);
                v = v * 16 + (uint32_t)d;
                p++;
            }
            if (v > 0x10FFFF) jfail(L->t, MS_ERR_FORMAT, line, "illegal Unicode character in string");
            if (v >= 0xD800 && v < 0xE000) v = 0xFFFD;
            u8_encode(&b, v);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int i = 0; i < 2 && p < L->n && L->s[p] >= '0' && L->s[p] <= '7'; i++) v = v * 8 + (uint32_t)(L->s[p++] - '0');
                u8_encode(&b, v);
            } else {
                jb_putc(&b, '\\');
                p--; /* keep the character itself */
            }
        }
    }
    jtok *k = emit(L, T_STRING, line);
    k->s = b.p ? b.p : ja_strndup(L->t, "", 0);
    k->len = b.n;
    L->pos = p;
}

static int isdig(char c) { return c >= '0' && c <= '9'; }
static int isnamec(unsigned char c) { return c == '_' || (c | 32) - 'a' < 26u || isdig((char)c) || c >= 0x80; }

/* digits with single underscores between them: returns end or start if none */
static size_t scan_digits(lx *L, size_t p, int base) {
    size_t st = p;
    for (;;) {
        char c = p < L->n ? L->s[p] : 0;
        int ok = base == 16 ? (isdig(c) || ((c | 32) >= 'a' && (c | 32) <= 'f')) : base == 8 ? (c >= '0' && c <= '7')
               : base == 2 ? (c == '0' || c == '1') : isdig(c);
        if (ok) { p++; continue; }
        if (c == '_' && p > st && p + 1 < L->n) {
            char d = L->s[p + 1];
            int ok2 = base == 16 ? (isdig(d) || ((d | 32) >= 'a' && (d | 32) <= 'f')) : base == 8 ? (d >= '0' && d <= '7')
                    : base == 2 ? (d == '0' || d == '1') : isdig(d);
            if (ok2) { p++; continue; }
        }
        break;
    }
    return p;
}

static void lex_number(lx *L, int line) {
    size_t st = L->pos, p = st;
    char buf[128];
    size_t bl = 0;
    if (L->s[p] == '0' && p + 1 < L->n && L->s[p + 1] && strchr("xXoObB", L->s[p + 1])) {
        char k = (char)(L->s[p + 1] | 32);
        int base = k == 'x' ? 16 : k == 'o' ? 8 : 2;
        size_t q = p + 2;
        if (q < L->n && L->s[q] == '_') q++;
        size_t e = scan_digits(L, q, base);
        if (e > q) {
            int64_t v = 0;
            for (size_t i = q; i < e; i++) {
                char c = L->s[i];
                if (c == '_') continue;
                int d = isdig(c) ? c - '0' : (c | 32) - 'a' + 10;
                if (v > (INT64_MAX - d) / base) jfail(L->t, MS_ERR_LIMIT, line, "integer literal too large");
                v = v * base + d;
            }
            jtok *t = emit(L, T_INT, line);
            t->i = v;
            L->pos = e;
            return;
        }
    }
    size_t e = scan_digits(L, p, 10);
    int isf = 0, nofloat = st > 0 && L->s[st - 1] == '.';
    size_t q = e;
    if (!nofloat && q + 1 < L->n && L->s[q] == '.' && isdig(L->s[q + 1])) { q = scan_digits(L, q + 1, 10); isf = 1; }
    if (!nofloat && q < L->n && (L->s[q] | 32) == 'e') {
        size_t r = q + 1;
        if (r < L->n && (L->s[r] == '+' || L->s[r] == '-')) r++;
        if (r < L->n && isdig(L->s[r])) { q = scan_digits(L, r, 10); isf = 1; }
    }
    if (!isf) {
        /* decimal integer: [1-9](_?\d)* or 0(_?0)* */
        if (L->s[p] == '0') {
            q = p + 1;
            while (q < L->n && (L->s[q] == '0' || (L->s[q] == '_' && q + 1 < L->n && L->s[q + 1] == '0'))) q++;
        } else q = e;
    }
    for (size_t i = st; i < q; i++)
        if (L->s[i] != '_') {
            if (bl + 1 >= sizeof buf) jfail(L->t, MS_ERR_LIMIT, line, "number literal too long");
            buf[bl++] = L->s[i];
        }
    buf[bl] = 0;
    if (isf) {
        jtok *t = emit(L, T_FLOAT, line);
        t->f = strtod(buf, NULL);
    } else {
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (errno) jfail(L->t, MS_ERR_LIMIT, line, "integer literal too large");
        jtok *t = emit(L, T_INT, line);
        t->i = v;
    }
    L->pos = q;
}

static const struct { const char *s; int t; } OPS[] = {
    {"//", T_FLOORDIV}, {"**", T_POW}, {"==", T_EQ}, {"!=", T_NE}, {">=", T_GTEQ}, {"<=", T_LTEQ},
    {"+", T_ADD}, {"-", T_SUB}, {"/", T_DIV}, {"*", T_MUL}, {"%", T_MOD}, {"~", T_TILDE}, {"[", T_LBRACKET},
    {"]", T_RBRACKET}, {"(", T_LPAREN}, {")", T_RPAREN}, {"{", T_LBRACE}, {"}", T_RBRACE}, {">", T_GT},
    {"<", T_LT}, {"=", T_ASSIGN}, {".", T_DOT}, {":", T_COLON}, {"|", T_PIPE}, {",", T_COMMA}, {";", T_SEMICOLON},
};

/* Tokens inside {{ }} or {% %} up to and including the closing tag.
 * Returns 1 when the closing match ended with a newline (line_starting). */
static int lex_tag(lx *L, int is_block) {
    L->nbrace = 0;
    for (;;) {
        int line = L->line;
        if (L->pos >= L->n) jfail(L->t, MS_ERR_FORMAT, line, "unexpected end of template, expected '%s'", is_block ? "%}" : "}}");
        if (L->nbrace == 0) {
            size_t p = L->pos, end = 0;
            if (is_block) {
                if (starts(L, p, "+%}")) end = p + 3;
                else if (starts(L, p, "-%}")) end = skip_ws(L->s, L->n, p + 3);
                else if (starts(L, p, "%}")) { end = p + 2; if (end < L->n && L->s[end] == '\n') end++; }
            } else {
                if (starts(L, p, "-}}")) end = skip_ws(L->s, L->n, p + 3);
                else if (starts(L, p, "}}")) end = p + 2;
            }
            if (end) {
                emit(L, is_block ? T_BLOCK_END : T_VAR_END, line);
                L->line += count_nl(L->s + p, end - p);
                L->pos = end;
                return end > 0 && L->s[end - 1] == '\n';
            }
        }
        size_t p = L->pos;
        unsigned char c = (unsigned char)L->s[p];
        size_t w = skip_ws(L->s, L->n, p);
        if (w > p) { L->line += count_nl(L->s + p, w - p); L->pos = w; continue; }
        if (isdig((char)c)) { lex_number(L, line); continue; }
        if (isnamec(c)) {
            size_t e = p;
            while (e < L->n && isnamec((unsigned char)L->s[e])) e++;
            jtok *k = emit(L, T_NAME, line);
            k->s = ja_strndup(L->t, L->s + p, e - p);
            k->len = e - p;
            L->pos = e;
            continue;
        }
        if (c == '\'' || c == '"') { lex_string(L, line); continue; }
        int found = 0;
        for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++) {
            if (!starts(L, p, OPS[i].s)) continue;
            int ty = OPS[i].t;
            if (ty == T_LBRACE || ty == T_LPAREN || ty == T_LBRACKET) {
                if (L->nbrace >= (int)sizeof L->brace) jfail(L->t, MS_ERR_LIMIT, line, "brackets nested too deeply");
                L->brace[L->nbrace++] = ty == T_LBRACE ? '}' : ty == T_LPAREN ? ')' : ']';
            } else if (ty == T_RBRACE || ty == T_RPAREN || ty == T_RBRACKET) {
                char ch = *OPS[i].s;
                if (!L->nbrace) jfail(L->t, MS_ERR_FORMAT, line, "unexpected '%c'", ch);
                char want = L->brace[--L->nbrace];
                if (want != ch) jfail(L->t, MS_ERR_FORMAT, line, "unexpected '%c', expected '%c'", ch, want);
            }
            emit(L, ty, line);
            L->pos = p + strlen(OPS[i].s);
            found = 1;
            break;
        }
        if (!found) jfail(L->t, MS_ERR_FORMAT, line, "unexpected char '%c'", c >= 0x20 && c < 0x7f ? c : '?');
    }
}

void jinja_lex(jtrap *t, const char *src, size_t len, jtok **out, int *ntok) {
    /* normalize newlines; drop one trailing newline */
    char *s = ja_alloc(t, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else s[n++] = src[i];
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = 0;
    lx L = {.t = t, .s = s, .n = n, .line = 1};
    int line_starting = 1;
    while (L.pos < L.n) {
        /* find the next tag opener */
        size_t k = L.pos;
        const char *hit = NULL;
        while (k + 1 < L.n) {
            hit = memchr(L.s + k, '{', L.n - k - 1);
            if (!hit) break;
            k = (size_t)(hit - L.s);
            char c2 = L.s[k + 1];
            if (c2 == '{' || c2 == '%' || c2 == '#') break;
            k++;
            hit = NULL;
        }
        if (!hit) {
            emit_data(&L, L.pos, L.n - L.pos, L.line);
            break;
        }
        char kind = L.s[k + 1];
        char sign = (k + 2 < L.n && (L.s[k + 2] == '-' || L.s[k + 2] == '+')) ? L.s[k + 2] : 0;
        size_t after = k + 2 + (sign ? 1 : 0);
        /* raw block? */
        int is_raw = 0;
        size_t raw_end = 0;
        if (kind == '%') {
            size_t p = skip_ws(L.s, L.n, after);
            if (starts(&L, p, "raw")) {
                p = skip_ws(L.s, L.n, p + 3);
                if (starts(&L, p, "-%}")) { is_raw = 1; raw_end = skip_ws(L.s, L.n, p + 3); }
                else if (starts(&L, p, "%}")) { is_raw = 1; raw_end = p + 2; }
            }
        }
        size_t dlen = strip_before(&L, L.pos, k, sign, kind == '{', line_starting);
        int data_line = L.line;
        emit_data(&L, L.pos, dlen, data_line);
        L.line += count_nl(L.s + L.pos, k - L.pos);
        int tag_line = L.line;
        if (is_raw) {
            L.line += count_nl(L.s + k, raw_end - k);
            int ls = raw_end > 0 && L.s[raw_end - 1] == '\n';
            /* find {%[-+]? \s* endraw \s* (+%} | -%}\s* | %}\n?) */
            size_t p = raw_end, body_end = 0, close_end = 0;
            char esign = 0;
            for (; p + 1 < L.n; p++) {
                if (L.s[p] != '{' || L.s[p + 1] != '%') continue;
                size_t q = p + 2;
                char sg = 0;
                if (q < L.n && (L.s[q] == '-' || L.s[q] == '+')) sg = L.s[q++];
                q = skip_ws(L.s, L.n, q);
                if (!starts(&L, q, "endraw")) continue;
                q = skip_ws(L.s, L.n, q + 6);
                if (starts(&L, q, "+%}")) close_end = q + 3;
                else if (starts(&L, q, "-%}")) close_end = skip_ws(L.s, L.n, q + 3);
                else if (starts(&L, q, "%}")) { close_end = q + 2; if (close_end < L.n && L.s[close_end] == '\n') close_end++; }
                else continue;
                body_end = p;
                esign = sg;
                break;
            }
            if (!close_end) jfail(t, MS_ERR_FORMAT, tag_line, "missing end of raw directive");
            size_t bl = strip_before(&L, raw_end, body_end, esign, 0, ls);
            emit_data(&L, raw_end, bl, L.line);
            L.line += count_nl(L.s + raw_end, close_end - raw_end);
            line_starting = L.s[close_end - 1] == '\n';
            L.pos = close_end;
            continue;
        }
        L.pos = after;
        if (kind == '#') {
            size_t p = after, end = 0;
            for (; p < L.n; p++) {
                if (starts(&L, p, "+#}")) { end = p + 3; break; }
                if (starts(&L, p, "-#}")) { end = skip_ws(L.s, L.n, p + 3); break; }
                if (starts(&L, p, "#}")) { end = p + 2; if (end < L.n && L.s[end] == '\n') end++; break; }
            }
            if (!end) jfail(t, MS_ERR_FORMAT, tag_line, "missing end of comment tag");
            L.line += count_nl(L.s + after, end - after);
            line_starting = L.s[end - 1] == '\n';
            L.pos = end;
            continue;
        }
        emit(&L, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, tag_line);
        line_starting = lex_tag(&L, kind == '%');
    }
    emit(&L, T_EOF, L.line);
    *out = L.toks;
    *ntok = L.ntok;
}
