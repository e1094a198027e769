/* gbnf.c — the GBNF-like text front end (syntax in grammar.h): parsed into a small
 * tree per rule body, then emitted into the rule's NFA. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_int.h"

enum { N_ALT, N_SEQ, N_LIT, N_CLASS, N_REF, N_REP, N_TOK };

typedef struct pnode {
    int kind;
    struct pnode **kid;
    int nkid, capkid;
    char *lit; /* N_LIT bytes */
    size_t nlit;
    uint32_t *lo, *hi; /* N_CLASS code point ranges (already complemented) */
    int nr;
    int rule;      /* N_REF; N_TOK: the token id */
    int min, max;  /* N_REP; max -1: unbounded */
} pnode;

typedef struct pctx {
    gbuild *b;
    const char *s, *end, *start;
    int allow_refs;
    int depth;
} pctx;

static void pfree(pnode *n) {
    if (!n) return;
    for (int i = 0; i < n->nkid; i++) pfree(n->kid[i]);
    free(n->kid), free(n->lit), free(n->lo), free(n->hi);
    free(n);
}

static void where(const pctx *p, int *line, int *col) {
    *line = 1, *col = 1;
    for (const char *q = p->start; q < p->s; q++) {
        if (*q == '\n') (*line)++, *col = 1;
        else (*col)++;
    }
}

static int perr(pctx *p, const char *msg) {
    int l, c;
    where(p, &l, &c);
    return gb_fail(p->b, MS_ERR_FORMAT, "grammar: %s at line %d column %d", msg, l, c);
}

static pnode *pnew(pctx *p, int kind) {
    pnode *n = calloc(1, sizeof *n);
    if (!n) gb_fail(p->b, MS_ERR_NOMEM, "grammar: out of memory");
    else n->kind = kind;
    return n;
}

static int padd(pctx *p, pnode *n, pnode *k) {
    if (n->nkid == n->capkid) {
        int nc = n->capkid ? n->capkid * 2 : 4;
        pnode **nk = realloc(n->kid, (size_t)nc * sizeof *nk);
        if (!nk) {
            pfree(k);
            return gb_fail(p->b, MS_ERR_NOMEM, "grammar: out of memory");
        }
        n->kid = nk;
        n->capkid = nc;
    }
    n->kid[n->nkid++] = k;
    return 0;
}

static void skip_sp(pctx *p) {
    while (p->s < p->end) {
        char c = *p->s;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->s++;
        else if (c == '#') {
            while (p->s < p->end && *p->s != '\n') p->s++;
        } else break;
    }
}

static int is_name(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'; }

/* A name followed by "::=" starts the next rule. */
static int at_rule_start(const pctx *p) {
    const char *q = p->s;
    if (q >= p->end || !is_name(*q)) return 0;
    while (q < p->end && is_name(*q)) q++;
    while (q < p->end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')) q++;
    return p->end - q >= 3 && !memcmp(q, "::=", 3);
}

/* Decode one UTF-8 code point at p->s (advancing); -1 on malformed. */
static int32_t utf8_next(pctx *p) {
    const uint8_t *u = (const uint8_t *)p->s;
    size_t left = (size_t)(p->end - p->s);
    if (!left) return -1;
    uint32_t c = u[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || (size_t)n > left) return -1;
    if (n > 1) {
        c &= 0x3F >> (n - 1);
        for (int i = 1; i < n; i++) {
            if ((u[i] & 0xC0) != 0x80) return -1;
            c = (c << 6) | (u[i] & 0x3F);
        }
    }
    p->s += n;
    return (int32_t)c;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class, with escapes; -1 and an error on failure. */
static int32_t pchar(pctx *p) {
    if (p->s >= p->end) return perr(p, "unterminated literal or class"), -1;
    if (*p->s != '\\') {
        int32_t c = utf8_next(p);
        if (c < 0) perr(p, "malformed UTF-8");
        return c;
    }
    p->s++;
    if (p->s >= p->end) return perr(p, "unterminated escape"), -1;
    char e = *p->s++;
    int nhex = 0;
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': return '\\';
    case '"': return '"';
    case '[': return '[';
    case ']': return ']';
    case '-': return '-';
    case '^': return '^';
    case '/': return '/';
    case 'x': nhex = 2; break;
    case 'u': nhex = 4; break;
    case 'U': nhex = 8; break;
    default: return perr(p, "unknown escape"), -1;
    }
    uint32_t v = 0;
    for (int i = 0; i < nhex; i++) {
        int h = p->s < p->end ? hexval(*p->s) : -1;
        if (h < 0) return perr(p, "bad hex escape"), -1;
        v = v * 16 + (uint32_t)h;
        p->s++;
    }
    if (v > 0x10FFFF) return perr(p, "code point above U+10FFFF"), -1;
    return (int32_t)v;
}

static size_t put_utf8(uint32_t c, char *o) {
    if (c < 0x80) return o[0] = (char)c, 1;
    if (c < 0x800) return o[0] = (char)(0xC0 | (c >> 6)), o[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return o[0] = (char)(0xE0 | (c >> 12)), o[1] = (char)(0x80 | ((c >> 6) & 0x3F)), o[2] = (char)(0x80 | (c & 0x3F)), 3;
    o[0] = (char)(0xF0 | (c >> 18)), o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F)), o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static pnode *parse_alt(pctx *p);

static pnode *parse_primary(pctx *p) {
    gbuild *b = p->b;
    if (p->s >= p->end) return perr(p, "expected an element"), NULL;
    char c = *p->s;
    if (c == '"') {
        p->s++;
        pnode *n = pnew(p, N_LIT);
        if (!n) return NULL;
        size_t cap = 16;
        n->lit = malloc(cap);
        if (!n->lit) return pfree(n), gb_fail(b, MS_ERR_NOMEM, "grammar: out of memory"), NULL;
        while (p->s < p->end && *p->s != '"') {
            int32_t ch = pchar(p);
            if (ch < 0) return pfree(n), NULL;
            if (n->nlit + 4 > cap) {
                cap *= 2;
                char *nl = realloc(n->lit, cap);
                if (!nl) return pfree(n), gb_fail(b, MS_ERR_NOMEM, "grammar: out of memory"), NULL;
                n->lit = nl;
            }
            n->nlit += put_utf8((uint32_t)ch, n->lit + n->nlit);
        }
        if (p->s >= p->end) return pfree(n), perr(p, "unterminated literal"), NULL;
        p->s++;
        return n;
    }
    if (c == '[' || c == '.') {
        pnode *n = pnew(p, N_CLASS);
        if (!n) return NULL;
        uint32_t *r = NULL; /* pairs */
        int nr = 0, cap = 0, neg = 0;
        if (c == '.') {
            p->s++;
            r = malloc(2 * sizeof *r);
            if (!r) return pfree(n), gb_fail(b, MS_ERR_NOMEM, "grammar: out of memory"), NULL;
            r[0] = 0, r[1] = 0x10FFFF, nr = 1;
        } else {
            p->s++;
            if (p->s < p->end && *p->s == '^') neg = 1, p->s++;
            while (p->s < p->end && *p->s != ']') {
                int32_t lo = pchar(p), hi;
                if (lo < 0) return free(r), pfree(n), NULL;
                hi = lo;
                if (p->end - p->s >= 2 && *p->s == '-' && p->s[1] != ']') {
                    p->s++;
                    hi = pchar(p);
                    if (hi < 0) return free(r), pfree(n), NULL;
                    if (hi < lo) return free(r), pfree(n), perr(p, "class range out of order"), NULL;
                }
                if (nr == cap) {
                    cap = cap ? cap * 2 : 8;
                    uint32_t *nrr = realloc(r, (size_t)cap * 2 * sizeof *nrr);
                    if (!nrr) return free(r), pfree(n), gb_fail(b, MS_ERR_NOMEM, "grammar: out of memory"), NULL;
                    r = nrr;
                }
                r[2 * nr] = (uint32_t)lo, r[2 * nr + 1] = (uint32_t)hi, nr++;
            }
            if (p->s >= p->end) return free(r), pfree(n), perr(p, "unterminated class"), NULL;
            p->s++;
        }
        if (nr) qsort(r, (size_t)nr, 2 * sizeof *r, cmp_range);
        int m = 0; /* merge */
        for (int i = 0; i < nr; i++) {
            if (m && r[2 * i] <= r[2 * (m - 1) + 1] + 1) {
                if (r[2 * i + 1] > r[2 * (m - 1) + 1]) r[2 * (m - 1) + 1] = r[2 * i + 1];
            } else r[2 * m] = r[2 * i], r[2 * m + 1] = r[2 * i + 1], m++;
        }
        n->lo = malloc(((size_t)m + 1) * sizeof *n->lo);
        n->hi = malloc(((size_t)m + 1) * sizeof *n->hi);
        if (!n->lo || !n->hi) return free(r), pfree(n), gb_fail(b, MS_ERR_NOMEM, "grammar: out of memory"), NULL;
        if (!neg) {
            for (int i = 0; i < m; i++) n->lo[i] = r[2 * i], n->hi[i] = r[2 * i + 1];
            n->nr = m;
        } else {
            uint32_t next = 0;
            int k = 0;
            for (int i = 0; i < m; i++) {
                if (r[2 * i] > next) n->lo[k] = next, n->hi[k] = r[2 * i] - 1, k++;
                next = r[2 * i + 1] + 1;
            }
            if (next <= 0x10FFFF) n->lo[k] = next, n->hi[k] = 0x10FFFF, k++;
            n->nr = k;
        }
        free(r);
        return n;
    }
    if (c == '<' && p->end - p->s >= 2 && p->s[1] == '[') { /* <[ID]>: the token with that id */
        p->s += 2;
        long v = 0;
        int nd = 0;
        while (p->s < p->end && *p->s >= '0' && *p->s <= '9' && nd < 10) v = v * 10 + (*p->s++ - '0'), nd++;
        if (!nd || p->end - p->s < 2 || p->s[0] != ']' || p->s[1] != '>' || v >= (1L << 30))
            return perr(p, "a token reference is <[ID]> with a decimal id below 2^30"), NULL;
        p->s += 2;
        pnode *n = pnew(p, N_TOK);
        if (n) n->rule = (int)v;
        return n;
    }
    if (c == '(') {
        p->s++;
        if (++p->depth > 200) return perr(p, "groups nested too deeply"), NULL;
        pnode *n = parse_alt(p);
        p->depth--;
        if (!n) return NULL;
        skip_sp(p);
        if (p->s >= p->end || *p->s != ')') return pfree(n), perr(p, "expected ')'"), NULL;
        p->s++;
        return n;
    }
    if (is_name(c)) {
        if (!p->allow_refs) return perr(p, "rule names are not allowed here"), NULL;
        const char *q = p->s;
        while (p->s < p->end && is_name(*p->s)) p->s++;
        char name[256];
        size_t len = (size_t)(p->s - q);
        if (len >= sizeof name) return perr(p, "rule name too long"), NULL;
        memcpy(name, q, len);
        name[len] = 0;
        int r = gb_find_rule(b, name);
        if (r < 0) r = gb_rule(b, name);
        if (r < 0) return NULL;
        pnode *n = pnew(p, N_REF);
        if (n) n->rule = r;
        return n;
    }
    return perr(p, "unexpected character"), NULL;
}

static int parse_int(pctx *p, int *out) {
    skip_sp(p);
    if (p->s >= p->end || *p->s < '0' || *p->s > '9') return perr(p, "expected a number");
    long v = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        v = v * 10 + (*p->s++ - '0');
        if (v > p->b->o.max_repeat)
            return gb_fail(p->b, MS_ERR_LIMIT, "grammar: repetition count above %d (max_repeat)", p->b->o.max_repeat);
    }
    *out = (int)v;
    return 0;
}

static pnode *parse_postfix(pctx *p) {
    pnode *n = parse_primary(p);
    while (n) {
        if (p->s >= p->end) break;
        char c = *p->s;
        int mn, mx;
        if (c == '*') mn = 0, mx = -1, p->s++;
        else if (c == '+') mn = 1, mx = -1, p->s++;
        else if (c == '?') mn = 0, mx = 1, p->s++;
        else if (c == '{') {
            p->s++;
            if (parse_int(p, &mn)) return pfree(n), NULL;
            skip_sp(p);
            mx = mn;
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                skip_sp(p);
                if (p->s < p->end && *p->s == '}') mx = -1;
                else if (parse_int(p, &mx)) return pfree(n), NULL;
                skip_sp(p);
            }
            if (p->s >= p->end || *p->s != '}') return pfree(n), perr(p, "expected '}'"), NULL;
            p->s++;
            if (mx >= 0 && mx < mn) return pfree(n), perr(p, "repetition {m,n} with n < m"), NULL;
        } else break;
        pnode *rp = pnew(p, N_REP);
        if (!rp) return pfree(n), NULL;
        rp->min = mn, rp->max = mx;
        if (padd(p, rp, n)) return pfree(rp), NULL;
        n = rp;
    }
    return n;
}

static pnode *parse_seq(pctx *p) {
    pnode *n = pnew(p, N_SEQ);
    if (!n) return NULL;
    for (;;) {
        skip_sp(p);
        if (p->s >= p->end || *p->s == '|' || *p->s == ')') break;
        if (p->allow_refs && at_rule_start(p)) break;
        pnode *k = parse_postfix(p);
        if (!k || padd(p, n, k)) return pfree(n), NULL;
    }
    return n;
}

static pnode *parse_alt(pctx *p) {
    pnode *n = pnew(p, N_ALT);
    if (!n) return NULL;
    for (;;) {
        pnode *k = parse_seq(p);
        if (!k || padd(p, n, k)) return pfree(n), NULL;
        skip_sp(p);
        if (p->s < p->end && *p->s == '|') {
            p->s++;
            continue;
        }
        break;
    }
    return n;
}

static void emit_node(gbuild *b, const pnode *n, int r, int from, int to) {
    if (b->rc) return;
    switch (n->kind) {
    case N_ALT:
        for (int i = 0; i < n->nkid; i++) emit_node(b, n->kid[i], r, from, to);
        break;
    case N_SEQ: {
        if (!n->nkid) {
            gb_eps(b, r, from, to);
            break;
        }
        int cur = from;
        for (int i = 0; i < n->nkid; i++) {
            int nx = i + 1 == n->nkid ? to : gb_state(b, r);
            emit_node(b, n->kid[i], r, cur, nx);
            cur = nx;
        }
        break;
    }
    case N_LIT: gb_lit(b, r, from, n->lit, n->nlit, to); break;
    case N_CLASS:
        if (!n->nr) gb_fail(b, MS_ERR_ARG, "grammar: a character class that matches nothing");
        gb_cps(b, r, from, n->lo, n->hi, n->nr, to);
        break;
    case N_REF: gb_call(b, r, from, n->rule, to); break;
    case N_TOK: gb_token(b, r, from, n->rule, to); break;
    case N_REP: {
        const pnode *k = n->kid[0];
        int cur = from;
        for (int i = 0; i < n->min && !b->rc; i++) {
            int nx = gb_state(b, r);
            emit_node(b, k, r, cur, nx);
            cur = nx;
        }
        if (n->max < 0) {
            int loop = gb_state(b, r);
            gb_eps(b, r, cur, loop);
            int back = gb_state(b, r);
            emit_node(b, k, r, loop, back);
            gb_eps(b, r, back, loop);
            gb_eps(b, r, loop, to);
        } else {
            for (int i = n->min; i < n->max && !b->rc; i++) {
                int nx = gb_state(b, r);
                gb_eps(b, r, cur, to);
                emit_node(b, k, r, cur, nx);
                cur = nx;
            }
            gb_eps(b, r, cur, to);
        }
        break;
    }
    }
}

int gg_emit_expr(gbuild *b, const char *text, int r, int from, int to) {
    pctx p = {b, text, text + strlen(text), text, 0, 0};
    pnode *n = parse_alt(&p);
    if (n) {
        skip_sp(&p);
        if (p.s != p.end) perr(&p, "unexpected text after the expression");
        else emit_node(b, n, r, from, to);
    }
    pfree(n);
    return b->rc;
}

int ms_grammar_from_gbnf(const char *text, size_t len, const char *const *schema_names,
                         const char *const *schema_jsons, size_t n_schemas, const ms_grammar_opts *o,
                         ms_grammar **out, ms_err *err) {
    *out = NULL;
    gbuild b;
    gb_init(&b, o, err);
    for (size_t i = 0; i < n_schemas && !b.rc; i++) {
        if (gb_find_rule(&b, schema_names[i]) >= 0) {
            gb_fail(&b, MS_ERR_ARG, "grammar: schema rule \"%s\" bound twice", schema_names[i]);
            break;
        }
        int r = gb_rule(&b, schema_names[i]);
        if (r < 0) break;
        char what[300];
        snprintf(what, sizeof what, "JSON schema of rule %s", schema_names[i]);
        if (gs_schema_rule(&b, schema_jsons[i], strlen(schema_jsons[i]), r, what)) {
            ms_wrap(err, "rule \"%s\"", schema_names[i]);
        }
    }
    pctx p = {&b, text, text + len, text, 1, 0};
    if (memchr(text, 0, len)) perr(&p, "NUL byte in the grammar");
    skip_sp(&p);
    while (!b.rc && p.s < p.end) {
        if (!is_name(*p.s)) {
            perr(&p, "expected a rule name");
            break;
        }
        const char *q = p.s;
        while (p.s < p.end && is_name(*p.s)) p.s++;
        char name[256];
        size_t nl = (size_t)(p.s - q);
        if (nl >= sizeof name) {
            perr(&p, "rule name too long");
            break;
        }
        memcpy(name, q, nl);
        name[nl] = 0;
        skip_sp(&p);
        if (p.end - p.s < 3 || memcmp(p.s, "::=", 3)) {
            perr(&p, "expected '::='");
            break;
        }
        p.s += 3;
        int r = gb_find_rule(&b, name);
        if (r >= 0 && b.r[r].defined) {
            char msg[300];
            snprintf(msg, sizeof msg, "rule \"%s\" defined twice", name);
            perr(&p, msg);
            break;
        }
        if (r < 0) r = gb_rule(&b, name);
        if (r < 0) break;
        pnode *body = parse_alt(&p);
        if (!body) break;
        b.r[r].defined = 1;
        emit_node(&b, body, r, 0, 1);
        pfree(body);
        skip_sp(&p);
    }
    int root = b.rc ? -1 : gb_find_rule(&b, "root");
    if (!b.rc && root < 0) gb_fail(&b, MS_ERR_ARG, "grammar: no rule \"root\"");
    int rc = gb_finish(&b, root, out);
    gb_free(&b);
    return rc;
}
