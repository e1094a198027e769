/* build.c — the grammar builder: per-rule NFAs from the front ends become one
 * global table of minimized DFAs (see gram_int.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_int.h"

/* ---------------- builder ---------------- */

static ms_grammar_opts opts_defaults(const ms_grammar_opts *o) {
    ms_grammar_opts d = {0};
    if (o) d = *o;
    if (!d.ws_max) d.ws_max = 20;
    if (!d.max_states) d.max_states = 200000;
    if (!d.max_rules) d.max_rules = 4096;
    if (!d.max_repeat) d.max_repeat = 1024;
    if (!d.max_schema_depth) d.max_schema_depth = 64;
    if (!d.max_stack) d.max_stack = 512;
    if (!d.max_configs) d.max_configs = 4096;
    if (!d.cache_bytes) d.cache_bytes = (size_t)256 << 20;
    return d;
}

void gb_init(gbuild *b, const ms_grammar_opts *o, ms_err *err) {
    memset(b, 0, sizeof *b);
    b->o = opts_defaults(o);
    b->err = err;
    b->j = (gjson){-1, -1, -1, -1, -1, -1, -1};
}

void gb_free(gbuild *b) {
    for (int i = 0; i < b->nr; i++) {
        free(b->r[i].name);
        free(b->r[i].e);
    }
    free(b->r);
    free(b->tok);
    memset(b, 0, sizeof *b);
}

int gb_fail(gbuild *b, int code, const char *fmt, ...) {
    if (b->rc) return b->rc;
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    b->rc = ms_fail(b->err, code, "%s", msg);
    return b->rc;
}

/* NFA states, all rules together, may be at most this many times max_states. */
#define NFA_FACTOR 4

int gb_rule(gbuild *b, const char *name) {
    if (b->rc) return -1;
    if (b->nr >= b->o.max_rules) {
        gb_fail(b, MS_ERR_LIMIT, "grammar: more than %d rules (max_rules)", b->o.max_rules);
        return -1;
    }
    if (b->nr == b->rcap) {
        int nc = b->rcap ? b->rcap * 2 : 16;
        grule_b *nr = realloc(b->r, (size_t)nc * sizeof *nr);
        if (!nr) {
            gb_fail(b, MS_ERR_NOMEM, "grammar: out of memory");
            return -1;
        }
        b->r = nr;
        b->rcap = nc;
    }
    grule_b *r = &b->r[b->nr];
    memset(r, 0, sizeof *r);
    r->name = strdup(name ? name : "");
    r->nstates = 2;
    b->nfa_states += 2;
    return b->nr++;
}

int gb_find_rule(const gbuild *b, const char *name) {
    for (int i = 0; i < b->nr; i++)
        if (!strcmp(b->r[i].name, name)) return i;
    return -1;
}

int gb_state(gbuild *b, int r) {
    if (b->rc || r < 0) return 0;
    if (b->nfa_states >= (size_t)b->o.max_states * NFA_FACTOR) {
        gb_fail(b, MS_ERR_LIMIT, "grammar: more than %zu automaton states before determinization (max_states %d)",
                (size_t)b->o.max_states * NFA_FACTOR, b->o.max_states);
        return 0;
    }
    b->nfa_states++;
    return b->r[r].nstates++;
}

static void add_edge(gbuild *b, int r, int from, int to, int kind, int a, int bb) {
    if (b->rc || r < 0) return;
    grule_b *ru = &b->r[r];
    if (ru->ne == ru->cap) {
        size_t nc = ru->cap ? ru->cap * 2 : 16;
        gedge *ne = realloc(ru->e, nc * sizeof *ne);
        if (!ne) {
            gb_fail(b, MS_ERR_NOMEM, "grammar: out of memory");
            return;
        }
        ru->e = ne;
        ru->cap = nc;
    }
    ru->e[ru->ne++] = (gedge){from, to, kind, a, bb};
}

void gb_eps(gbuild *b, int r, int from, int to) { add_edge(b, r, from, to, GE_EPS, 0, 0); }
void gb_range(gbuild *b, int r, int from, int lo, int hi, int to) { add_edge(b, r, from, to, GE_BYTE, lo, hi); }
void gb_call(gbuild *b, int r, int from, int callee, int to) { add_edge(b, r, from, to, GE_CALL, callee, 0); }

void gb_token(gbuild *b, int r, int from, int32_t id, int to) {
    if (b->rc || r < 0) return;
    if (id < 0 || id >= (1 << 30)) {
        gb_fail(b, MS_ERR_ARG, "grammar: token reference <[%d]> out of range", id);
        return;
    }
    int k = 0;
    while (k < b->ntok && b->tok[k] != id) k++;
    if (k == b->ntok) {
        if (b->ntok >= GB_MAX_TOKEN_REFS) {
            gb_fail(b, MS_ERR_LIMIT, "grammar: more than %d distinct token references", GB_MAX_TOKEN_REFS);
            return;
        }
        if (b->ntok == b->tokcap) {
            int nc = b->tokcap ? b->tokcap * 2 : 8;
            int32_t *nt = realloc(b->tok, (size_t)nc * sizeof *nt);
            if (!nt) {
                gb_fail(b, MS_ERR_NOMEM, "grammar: out of memory");
                return;
            }
            b->tok = nt, b->tokcap = nc;
        }
        b->tok[b->ntok++] = id;
    }
    add_edge(b, r, from, to, GE_BYTE, 256 + k, 256 + k);
}

void gb_lit(gbuild *b, int r, int from, const char *s, size_t n, int to) {
    if (!n) {
        gb_eps(b, r, from, to);
        return;
    }
    int cur = from;
    for (size_t i = 0; i < n; i++) {
        int nx = i + 1 == n ? to : gb_state(b, r);
        gb_range(b, r, cur, (uint8_t)s[i], (uint8_t)s[i], nx);
        cur = nx;
    }
}

/* One code point range of a single UTF-8 length, split until every byte position
 * is a plain range (the utf8-ranges construction). */
static void utf8_range(gbuild *b, int r, int from, uint32_t lo, uint32_t hi, int to) {
    if (lo > hi || b->rc) return;
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i]) {
            utf8_range(b, r, from, lo, bounds[i], to);
            utf8_range(b, r, from, bounds[i] + 1, hi, to);
            return;
        }
    int n = lo <= 0x7F ? 1 : lo <= 0x7FF ? 2 : lo <= 0xFFFF ? 3 : 4;
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_range(b, r, from, lo, lo | m, to);
                utf8_range(b, r, from, (lo | m) + 1, hi, to);
                return;
            }
            if ((hi & m) != m) {
                utf8_range(b, r, from, lo, (hi & ~m) - 1, to);
                utf8_range(b, r, from, hi & ~m, hi, to);
                return;
            }
        }
    }
    uint8_t L[4], H[4];
    uint32_t cps[2] = {lo, hi};
    uint8_t *outs[2] = {L, H};
    for (int k = 0; k < 2; k++) {
        uint32_t c = cps[k];
        uint8_t *o = outs[k];
        if (n == 1) o[0] = (uint8_t)c;
        else if (n == 2) o[0] = 0xC0 | (c >> 6), o[1] = 0x80 | (c & 0x3F);
        else if (n == 3) o[0] = 0xE0 | (c >> 12), o[1] = 0x80 | ((c >> 6) & 0x3F), o[2] = 0x80 | (c & 0x3F);
        else
            o[0] = 0xF0 | (c >> 18), o[1] = 0x80 | ((c >> 12) & 0x3F), o[2] = 0x80 | ((c >> 6) & 0x3F),
            o[3] = 0x80 | (c & 0x3F);
    }
    int cur = from;
    for (int i = 0; i < n; i++) {
        int nx = i + 1 == n ? to : gb_state(b, r);
        gb_range(b, r, cur, L[i], H[i], nx);
        cur = nx;
    }
}

void gb_cps(gbuild *b, int r, int from, const uint32_t *lo, const uint32_t *hi, int n, int to) {
    for (int i = 0; i < n; i++) {
        uint32_t a = lo[i], z = hi[i] > 0x10FFFF ? 0x10FFFF : hi[i];
        if (a > z) continue;
        /* cut the surrogates out */
        if (a < 0xD800 && z >= 0xD800) utf8_range(b, r, from, a, 0xD7FF, to), a = 0xE000;
        else if (a >= 0xD800 && a <= 0xDFFF) a = 0xE000;
        if (a <= z) utf8_range(b, r, from, a, z, to);
    }
}

/* ---------------- interning int arrays ---------------- */

typedef struct ikmap {
    int32_t *keys;
    size_t nk, kcap;
    size_t *off;
    int32_t *len;
    int32_t n, ncap;
    int32_t *tab;
    size_t tcap; /* power of two */
} ikmap;

static uint64_t ik_hash(const int32_t *k, int len) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)len;
    for (int i = 0; i < len; i++) h = (h ^ (uint32_t)k[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static void ik_free(ikmap *m) {
    free(m->keys);
    free(m->off);
    free(m->len);
    free(m->tab);
    memset(m, 0, sizeof *m);
}

/* id of key k (len ints), interning it when new (*added = 1); -1 on NOMEM. */
static int32_t ik_intern(ikmap *m, const int32_t *k, int len, int *added) {
    *added = 0;
    if ((size_t)(m->n + 1) * 2 > m->tcap) {
        size_t nc = m->tcap ? m->tcap * 2 : 1024;
        int32_t *nt = malloc(nc * sizeof *nt);
        if (!nt) return -1;
        memset(nt, 0xff, nc * sizeof *nt);
        for (int32_t i = 0; i < m->n; i++) {
            size_t h = ik_hash(m->keys + m->off[i], m->len[i]) & (nc - 1);
            while (nt[h] >= 0) h = (h + 1) & (nc - 1);
            nt[h] = i;
        }
        free(m->tab);
        m->tab = nt;
        m->tcap = nc;
    }
    size_t h = ik_hash(k, len) & (m->tcap - 1);
    while (m->tab[h] >= 0) {
        int32_t i = m->tab[h];
        if (m->len[i] == len && !memcmp(m->keys + m->off[i], k, (size_t)len * sizeof *k)) return i;
        h = (h + 1) & (m->tcap - 1);
    }
    if (m->n == m->ncap) {
        int32_t nc = m->ncap ? m->ncap * 2 : 256;
        size_t *no = realloc(m->off, (size_t)nc * sizeof *no);
        if (!no) return -1;
        m->off = no;
        int32_t *nl = realloc(m->len, (size_t)nc * sizeof *nl);
        if (!nl) return -1;
        m->len = nl;
        m->ncap = nc;
    }
    if (m->nk + (size_t)len > m->kcap) {
        size_t nc = m->kcap ? m->kcap * 2 : 4096;
        while (nc < m->nk + (size_t)len) nc *= 2;
        int32_t *nk = realloc(m->keys, nc * sizeof *nk);
        if (!nk) return -1;
        m->keys = nk;
        m->kcap = nc;
    }
    memcpy(m->keys + m->nk, k, (size_t)len * sizeof *k);
    m->off[m->n] = m->nk;
    m->len[m->n] = len;
    m->nk += (size_t)len;
    m->tab[h] = m->n;
    *added = 1;
    return m->n++;
}

/* ---------------- per-rule DFA ---------------- */

typedef struct rdfa {
    int32_t n;          /* states; 0 is the start */
    int32_t *trans;     /* [n * ncls] local targets or -1 */
    uint8_t *acc;       /* [n] */
    int32_t *coff;      /* [n + 1] */
    int32_t *crule, *cret;
} rdfa;

static void rdfa_free(rdfa *d) {
    free(d->trans);
    free(d->acc);
    free(d->coff);
    free(d->crule);
    free(d->cret);
    memset(d, 0, sizeof *d);
}

typedef struct ivec {
    int32_t *v;
    size_t n, cap;
} ivec;
static int iv_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        int32_t *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return -1;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    return 0;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}
static int cmp_pair(const void *a, const void *b) {
    const int32_t *x = a, *y = b;
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

typedef struct dctx {
    gbuild *b;
    int ncls;
    const uint16_t *cls;
    size_t total_dfa;
} dctx;

/* Subset construction of rule ri. */
static int determinize(dctx *c, int ri, rdfa *out) {
    gbuild *b = c->b;
    grule_b *ru = &b->r[ri];
    int ns = ru->nstates, ncls = c->ncls;
    int rc = MS_OK;
    /* CSR of edges by source */
    int32_t *eoff = calloc((size_t)ns + 1, sizeof *eoff);
    int32_t *eidx = malloc((ru->ne ? ru->ne : 1) * sizeof *eidx);
    int32_t *mark = calloc((size_t)ns, sizeof *mark);
    int32_t *stk = malloc((size_t)ns * sizeof *stk);
    ikmap sets = {0};
    ivec queue = {0}, set = {0}, trans = {0}, acc = {0}, coff = {0}, crule = {0}, cret = {0}, pairs = {0};
    int32_t gen = 0;
    if (!eoff || !eidx || !mark || !stk) goto nomem;
    for (size_t i = 0; i < ru->ne; i++) eoff[ru->e[i].from + 1]++;
    for (int i = 0; i < ns; i++) eoff[i + 1] += eoff[i];
    {
        int32_t *fill = malloc(((size_t)ns + 1) * sizeof *fill);
        if (!fill) goto nomem;
        memcpy(fill, eoff, ((size_t)ns + 1) * sizeof *fill);
        for (size_t i = 0; i < ru->ne; i++) eidx[fill[ru->e[i].from]++] = (int32_t)i;
        free(fill);
    }
    /* closure helper inline: set.v holds seeds; expand via eps, sort, intern */
#define CLOSE_AND_INTERN(ID)                                                                      \
    do {                                                                                          \
        gen++;                                                                                    \
        size_t sp = 0;                                                                            \
        size_t nseed = set.n;                                                                     \
        set.n = 0;                                                                                \
        for (size_t q = 0; q < nseed; q++) {                                                      \
            int32_t s0 = set.v[q];                                                                \
            if (mark[s0] != gen) mark[s0] = gen, stk[sp++] = s0;                                  \
        }                                                                                         \
        set.n = 0;                                                                                \
        while (sp) {                                                                              \
            int32_t s = stk[--sp];                                                                \
            if (iv_push(&set, s)) goto nomem;                                                     \
            for (int32_t k = eoff[s]; k < eoff[s + 1]; k++) {                                     \
                const gedge *e = &ru->e[eidx[k]];                                                 \
                if (e->kind == GE_EPS && mark[e->to] != gen) mark[e->to] = gen, stk[sp++] = e->to; \
            }                                                                                     \
        }                                                                                         \
        qsort(set.v, set.n, sizeof *set.v, cmp_i32);                                              \
        int added_;                                                                               \
        ID = ik_intern(&sets, set.v, (int)set.n, &added_);                                        \
        if (ID < 0) goto nomem;                                                                   \
        if (added_) {                                                                             \
            if (c->total_dfa + (size_t)sets.n > (size_t)b->o.max_states) {                        \
                rc = gb_fail(b, MS_ERR_LIMIT, "grammar: more than %d automaton states (max_states)", \
                             b->o.max_states);                                                    \
                goto done;                                                                        \
            }                                                                                     \
            if (iv_push(&queue, ID)) goto nomem;                                                  \
        }                                                                                         \
    } while (0)

    {
        int32_t id;
        set.n = 0;
        if (iv_push(&set, 0)) goto nomem;
        CLOSE_AND_INTERN(id);
        (void)id;
    }
    for (size_t qi = 0; qi < queue.n; qi++) {
        int32_t d = queue.v[qi]; /* == qi */
        /* copy the set: sets.keys may move while interning */
        int32_t len = sets.len[d];
        int32_t *mem = malloc(((size_t)len + 1) * sizeof *mem);
        if (!mem) goto nomem;
        memcpy(mem, sets.keys + sets.off[d], (size_t)len * sizeof *mem);
        int a = 0;
        pairs.n = 0;
        ivec calls = {0};
        for (int32_t i = 0; i < len; i++) {
            int32_t s = mem[i];
            if (s == 1) a = 1;
            for (int32_t k = eoff[s]; k < eoff[s + 1]; k++) {
                const gedge *e = &ru->e[eidx[k]];
                if (e->kind == GE_BYTE) {
                    for (int cl = c->cls[e->a]; cl <= c->cls[e->b]; cl++)
                        if (iv_push(&pairs, cl) || iv_push(&pairs, e->to)) goto nomem2;
                } else if (e->kind == GE_CALL) {
                    if (iv_push(&calls, e->a) || iv_push(&calls, e->to)) goto nomem2;
                }
            }
        }
        free(mem);
        mem = NULL;
        if (iv_push(&acc, a)) goto nomem2;
        size_t tbase = trans.n;
        for (int cl = 0; cl < ncls; cl++)
            if (iv_push(&trans, -1)) goto nomem2;
        if (pairs.n) qsort(pairs.v, pairs.n / 2, 2 * sizeof *pairs.v, cmp_pair);
        for (size_t i = 0; i < pairs.n;) {
            int32_t cl = pairs.v[i];
            set.n = 0;
            while (i < pairs.n && pairs.v[i] == cl) {
                if (iv_push(&set, pairs.v[i + 1])) goto nomem2;
                i += 2;
            }
            int32_t id;
            CLOSE_AND_INTERN(id);
            trans.v[tbase + cl] = id;
        }
        if (calls.n) qsort(calls.v, calls.n / 2, 2 * sizeof *calls.v, cmp_pair);
        if (iv_push(&coff, (int32_t)crule.n)) goto nomem2;
        for (size_t i = 0; i < calls.n;) {
            int32_t rr = calls.v[i];
            set.n = 0;
            while (i < calls.n && calls.v[i] == rr) {
                if (iv_push(&set, calls.v[i + 1])) goto nomem2;
                i += 2;
            }
            int32_t id;
            CLOSE_AND_INTERN(id);
            if (iv_push(&crule, rr) || iv_push(&cret, id)) goto nomem2;
        }
        free(calls.v);
        continue;
    nomem2:
        free(mem);
        free(calls.v);
        goto nomem;
    }
#undef CLOSE_AND_INTERN
    if (iv_push(&coff, (int32_t)crule.n)) goto nomem;
    out->n = (int32_t)queue.n;
    out->trans = trans.v, trans.v = NULL;
    out->acc = malloc(acc.n ? acc.n : 1);
    if (!out->acc) goto nomem;
    for (size_t i = 0; i < acc.n; i++) out->acc[i] = (uint8_t)acc.v[i];
    out->coff = coff.v, coff.v = NULL;
    out->crule = crule.v, crule.v = NULL;
    out->cret = cret.v, cret.v = NULL;
    c->total_dfa += queue.n;
    goto done;
nomem:
    rc = gb_fail(b, MS_ERR_NOMEM, "grammar: out of memory determinizing rule %s", ru->name);
done:
    free(eoff);
    free(eidx);
    free(mark);
    free(stk);
    ik_free(&sets);
    free(queue.v);
    free(set.v);
    free(trans.v);
    free(acc.v);
    free(coff.v);
    free(crule.v);
    free(cret.v);
    free(pairs.v);
    return rc;
}

/* Drop states that cannot be reached from the start or cannot reach an accepting
 * state (calls into unproductive rules removed first), then Moore-minimize.
 * Rewrites d in place. */
static int trim_minimize(rdfa *d, int ncls, const uint8_t *prod) {
    int32_t n = d->n;
    /* remove calls to unproductive rules */
    {
        int32_t w = 0;
        int32_t *noff = malloc(((size_t)n + 1) * sizeof *noff);
        if (!noff) return MS_ERR_NOMEM;
        for (int32_t s = 0; s < n; s++) {
            noff[s] = w;
            for (int32_t k = d->coff[s]; k < d->coff[s + 1]; k++)
                if (prod[d->crule[k]]) d->crule[w] = d->crule[k], d->cret[w] = d->cret[k], w++;
        }
        noff[n] = w;
        free(d->coff);
        d->coff = noff;
    }
    uint8_t *fwd = calloc((size_t)n, 1), *bwd = calloc((size_t)n, 1);
    int32_t *stk = malloc(((size_t)n + 1) * sizeof *stk);
    if (!fwd || !bwd || !stk) {
        free(fwd), free(bwd), free(stk);
        return MS_ERR_NOMEM;
    }
    size_t sp = 0;
    fwd[0] = 1;
    stk[sp++] = 0;
    while (sp) {
        int32_t s = stk[--sp];
        for (int c = 0; c < ncls; c++) {
            int32_t t = d->trans[(size_t)s * ncls + c];
            if (t >= 0 && !fwd[t]) fwd[t] = 1, stk[sp++] = t;
        }
        for (int32_t k = d->coff[s]; k < d->coff[s + 1]; k++)
            if (!fwd[d->cret[k]]) fwd[d->cret[k]] = 1, stk[sp++] = d->cret[k];
    }
    /* backward: iterate to a fixpoint (small DFAs; fine) */
    for (int32_t s = 0; s < n; s++) bwd[s] = d->acc[s];
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t s = n - 1; s >= 0; s--) {
            if (bwd[s]) continue;
            int ok = 0;
            for (int c = 0; c < ncls && !ok; c++) {
                int32_t t = d->trans[(size_t)s * ncls + c];
                if (t >= 0 && bwd[t]) ok = 1;
            }
            for (int32_t k = d->coff[s]; k < d->coff[s + 1] && !ok; k++)
                if (bwd[d->cret[k]]) ok = 1;
            if (ok) bwd[s] = 1, changed = 1;
        }
    }
    free(stk);
    /* Moore partition refinement over live states; dead -> -1 */
    int32_t *part = malloc((size_t)n * sizeof *part);
    int32_t *np = malloc((size_t)n * sizeof *np);
    int32_t *key = NULL;
    size_t keycap = 0;
    if (!part || !np) goto nomem;
    for (int32_t s = 0; s < n; s++) part[s] = (fwd[s] && bwd[s]) ? d->acc[s] : -1;
    if (part[0] < 0) part[0] = 0; /* an unproductive rule keeps a lone start state */
    int32_t nparts = 0;
    for (;;) {
        ikmap m = {0};
        for (int32_t s = 0; s < n; s++) {
            if (part[s] < 0) {
                np[s] = -1;
                continue;
            }
            size_t nc = d->coff[s + 1] - d->coff[s];
            size_t kl = 1 + (size_t)ncls + 2 * nc;
            if (kl > keycap) {
                keycap = kl * 2;
                int32_t *nk = realloc(key, keycap * sizeof *nk);
                if (!nk) {
                    ik_free(&m);
                    goto nomem;
                }
                key = nk;
            }
            key[0] = part[s];
            for (int c = 0; c < ncls; c++) {
                int32_t t = d->trans[(size_t)s * ncls + c];
                key[1 + c] = t >= 0 ? part[t] : -1;
            }
            /* call edges: (rule, part of ret), sorted; dead rets dropped */
            size_t w = 0;
            for (int32_t k = d->coff[s]; k < d->coff[s + 1]; k++) {
                int32_t pr = part[d->cret[k]];
                if (pr < 0) continue;
                key[1 + ncls + 2 * w] = d->crule[k];
                key[1 + ncls + 2 * w + 1] = pr;
                w++;
            }
            if (w) qsort(key + 1 + ncls, w, 2 * sizeof *key, cmp_pair);
            int added;
            int32_t id = ik_intern(&m, key, (int)(1 + ncls + 2 * w), &added);
            if (id < 0) {
                ik_free(&m);
                goto nomem;
            }
            np[s] = id;
        }
        int32_t cnt = m.n;
        ik_free(&m);
        memcpy(part, np, (size_t)n * sizeof *part);
        if (cnt == nparts) break;
        nparts = cnt;
    }
    /* renumber so that the start's part is 0 */
    {
        int32_t *ren = malloc(((size_t)nparts + 1) * sizeof *ren);
        int32_t *rep = malloc(((size_t)nparts + 1) * sizeof *rep);
        if (!ren || !rep) {
            free(ren), free(rep);
            goto nomem;
        }
        for (int32_t i = 0; i < nparts; i++) ren[i] = -1;
        int32_t k = 0;
        ren[part[0]] = k, rep[k] = 0, k++;
        for (int32_t s = 0; s < n; s++)
            if (part[s] >= 0 && ren[part[s]] < 0) ren[part[s]] = k, rep[k] = s, k++;
        rdfa o = {0};
        o.n = k;
        o.trans = malloc((size_t)k * ncls * sizeof *o.trans);
        o.acc = malloc((size_t)k);
        o.coff = malloc(((size_t)k + 1) * sizeof *o.coff);
        size_t ncalls = 0;
        for (int32_t i = 0; i < k; i++) ncalls += d->coff[rep[i] + 1] - d->coff[rep[i]];
        o.crule = malloc((ncalls ? ncalls : 1) * sizeof *o.crule);
        o.cret = malloc((ncalls ? ncalls : 1) * sizeof *o.cret);
        if (!o.trans || !o.acc || !o.coff || !o.crule || !o.cret) {
            rdfa_free(&o);
            free(ren), free(rep);
            goto nomem;
        }
        size_t w = 0;
        for (int32_t i = 0; i < k; i++) {
            int32_t s = rep[i];
            o.acc[i] = d->acc[s] && part[s] >= 0;
            for (int c = 0; c < ncls; c++) {
                int32_t t = d->trans[(size_t)s * ncls + c];
                o.trans[(size_t)i * ncls + c] = t >= 0 && part[t] >= 0 ? ren[part[t]] : -1;
            }
            o.coff[i] = (int32_t)w;
            for (int32_t q = d->coff[s]; q < d->coff[s + 1]; q++) {
                int32_t t = d->cret[q];
                if (part[t] < 0) continue;
                o.crule[w] = d->crule[q];
                o.cret[w] = ren[part[t]];
                w++;
            }
        }
        o.coff[k] = (int32_t)w;
        free(ren), free(rep);
        rdfa_free(d);
        *d = o;
    }
    free(part), free(np), free(key), free(fwd), free(bwd);
    return MS_OK;
nomem:
    free(part), free(np), free(key), free(fwd), free(bwd);
    return MS_ERR_NOMEM;
}

/* Does rule r's DFA reach acceptance through byte edges and calls to rules with ok[]? */
static int reaches_accept(const rdfa *d, int ncls, const uint8_t *ok, int bytes_too, uint8_t *seen,
                          int32_t *stk) {
    memset(seen, 0, (size_t)d->n);
    size_t sp = 0;
    seen[0] = 1;
    stk[sp++] = 0;
    while (sp) {
        int32_t s = stk[--sp];
        if (d->acc[s]) return 1;
        if (bytes_too)
            for (int c = 0; c < ncls; c++) {
                int32_t t = d->trans[(size_t)s * ncls + c];
                if (t >= 0 && !seen[t]) seen[t] = 1, stk[sp++] = t;
            }
        for (int32_t k = d->coff[s]; k < d->coff[s + 1]; k++) {
            int32_t t = d->cret[k];
            if (ok[d->crule[k]] && !seen[t]) seen[t] = 1, stk[sp++] = t;
        }
    }
    return 0;
}

typedef uint64_t bset[4];
static inline void bs_set(uint64_t *s, int b) { s[b >> 6] |= 1ull << (b & 63); }
static inline int bs_or(uint64_t *a, const uint64_t *b) {
    int ch = 0;
    for (int i = 0; i < 4; i++) {
        uint64_t x = a[i] | b[i];
        if (x != a[i]) a[i] = x, ch = 1;
    }
    return ch;
}

int gb_finish(gbuild *b, int root, ms_grammar **out) {
    *out = NULL;
    if (b->rc) return b->rc;
    for (int i = 0; i < b->nr; i++)
        if (!b->r[i].defined) return gb_fail(b, MS_ERR_ARG, "grammar: rule \"%s\" is used but never defined", b->r[i].name);
    /* symbol classes: cut points at every range's lo and hi+1; bytes and token references
     * never share a class (each reference is a class of its own) */
    int nsym = 256 + b->ntok;
    uint8_t cut[256 + GB_MAX_TOKEN_REFS + 1] = {0};
    cut[0] = 1;
    for (int x = 256; x <= nsym; x++) cut[x] = 1;
    for (int i = 0; i < b->nr; i++)
        for (size_t k = 0; k < b->r[i].ne; k++) {
            const gedge *e = &b->r[i].e[k];
            if (e->kind != GE_BYTE) continue;
            cut[e->a] = 1;
            cut[e->b + 1] = 1;
        }
    uint16_t cls[256 + GB_MAX_TOKEN_REFS];
    int ncls = 0;
    for (int x = 0; x < nsym; x++) {
        if (cut[x] && x) ncls++;
        cls[x] = (uint16_t)ncls;
    }
    ncls++;
    int nr = b->nr, rc = MS_OK;
    rdfa *d = calloc((size_t)nr, sizeof *d);
    uint8_t *prod = calloc((size_t)nr, 1), *nul = calloc((size_t)nr, 1);
    ms_grammar *g = NULL;
    uint8_t *seen = NULL;
    int32_t *stk = NULL;
    if (!d || !prod || !nul) goto nomem;
    dctx c = {b, ncls, cls, 0};
    for (int i = 0; i < nr; i++)
        if ((rc = determinize(&c, i, &d[i]))) goto fail;
    int32_t maxn = 1;
    for (int i = 0; i < nr; i++)
        if (d[i].n > maxn) maxn = d[i].n;
    seen = malloc((size_t)maxn);
    stk = malloc(((size_t)maxn + 1) * sizeof *stk);
    if (!seen || !stk) goto nomem;
    for (int ch = 1; ch;) {
        ch = 0;
        for (int i = 0; i < nr; i++)
            if (!prod[i] && reaches_accept(&d[i], ncls, prod, 1, seen, stk)) prod[i] = 1, ch = 1;
    }
    if (!prod[root]) {
        rc = gb_fail(b, MS_ERR_ARG, "grammar: rule \"%s\" derives no string (the grammar admits no document)",
                     b->r[root].name);
        goto fail;
    }
    for (int i = 0; i < nr; i++)
        if ((rc = trim_minimize(&d[i], ncls, prod))) goto nomem;
    /* nullable rules, then left recursion: r -> r' when r can call r' before reading a byte */
    for (int ch = 1; ch;) {
        ch = 0;
        for (int i = 0; i < nr; i++)
            if (!nul[i] && reaches_accept(&d[i], ncls, nul, 0, seen, stk)) nul[i] = 1, ch = 1;
    }
    {
        /* left-call adjacency via reachability over nullable calls from the start */
        uint8_t *color = calloc((size_t)nr, 1);
        int32_t *path = malloc((size_t)nr * sizeof *path), *it = malloc((size_t)nr * sizeof *it);
        ivec *adj = calloc((size_t)nr, sizeof *adj);
        if (!color || !path || !it || !adj) {
            free(color), free(path), free(it), free(adj);
            goto nomem;
        }
        for (int i = 0; i < nr && !rc; i++) {
            if (!prod[i]) continue;
            memset(seen, 0, (size_t)d[i].n);
            size_t sp = 0;
            seen[0] = 1;
            stk[sp++] = 0;
            while (sp) {
                int32_t s = stk[--sp];
                for (int32_t k = d[i].coff[s]; k < d[i].coff[s + 1]; k++) {
                    if (iv_push(&adj[i], d[i].crule[k])) rc = MS_ERR_NOMEM;
                    int32_t t = d[i].cret[k];
                    if (nul[d[i].crule[k]] && !seen[t]) seen[t] = 1, stk[sp++] = t;
                }
            }
        }
        for (int s0 = 0; s0 < nr && !rc; s0++) {
            if (color[s0]) continue;
            int dep = 0;
            path[0] = s0, it[0] = 0, color[s0] = 1;
            while (dep >= 0 && !rc) {
                int u = path[dep];
                if ((size_t)it[dep] < adj[u].n) {
                    int v = adj[u].v[it[dep]++];
                    if (color[v] == 1) {
                        rc = gb_fail(b, MS_ERR_ARG, "grammar: left recursion: rule \"%s\" can call itself (via \"%s\") before reading a byte",
                                     b->r[v].name, b->r[u].name);
                    } else if (!color[v]) {
                        color[v] = 1;
                        path[++dep] = v, it[dep] = 0;
                    }
                } else {
                    color[u] = 2;
                    dep--;
                }
            }
        }
        for (int i = 0; i < nr; i++) free(adj[i].v);
        free(adj), free(color), free(path), free(it);
        if (rc == MS_ERR_NOMEM) goto nomem;
        if (rc) goto fail;
    }
    /* lay out */
    g = calloc(1, sizeof *g);
    if (!g) goto nomem;
    g->o = b->o;
    g->n_rules = nr;
    g->root = root;
    g->n_cls = ncls;
    g->cls = malloc((size_t)nsym * sizeof *g->cls);
    g->tok = malloc(((size_t)b->ntok + 1) * sizeof *g->tok);
    if (!g->cls || !g->tok) goto nomem;
    memcpy(g->cls, cls, (size_t)nsym * sizeof *g->cls);
    if (b->ntok) memcpy(g->tok, b->tok, (size_t)b->ntok * sizeof *g->tok);
    g->n_tok = b->ntok;
    int32_t ntot = 0;
    size_t ncall = 0;
    for (int i = 0; i < nr; i++) ntot += d[i].n, ncall += d[i].coff[d[i].n];
    g->n_states = ntot;
    g->trans = malloc((size_t)ntot * ncls * sizeof *g->trans);
    g->flags = calloc((size_t)ntot, 1);
    g->call_off = malloc(((size_t)ntot + 1) * sizeof *g->call_off);
    g->call_rule = malloc((ncall ? ncall : 1) * sizeof *g->call_rule);
    g->call_ret = malloc((ncall ? ncall : 1) * sizeof *g->call_ret);
    g->state_rule = malloc((size_t)ntot * sizeof *g->state_rule);
    g->rule_start = malloc((size_t)nr * sizeof *g->rule_start);
    g->rule_name = calloc((size_t)nr, sizeof *g->rule_name);
    g->follow = calloc((size_t)nr, sizeof *g->follow);
    if (!g->trans || !g->flags || !g->call_off || !g->call_rule || !g->call_ret || !g->state_rule ||
        !g->rule_start || !g->rule_name || !g->follow)
        goto nomem;
    {
        int32_t base = 0;
        size_t w = 0;
        for (int i = 0; i < nr; i++) {
            g->rule_start[i] = base;
            g->rule_name[i] = strdup(b->r[i].name);
            if (!g->rule_name[i]) goto nomem;
            for (int32_t s = 0; s < d[i].n; s++) {
                int32_t gs = base + s;
                uint8_t f = d[i].acc[s] ? GS_ACCEPT : 0;
                for (int cl = 0; cl < ncls; cl++) {
                    int32_t t = d[i].trans[(size_t)s * ncls + cl];
                    g->trans[(size_t)gs * ncls + cl] = t >= 0 ? base + t : -1;
                    if (t >= 0) f |= GS_BYTES;
                }
                g->call_off[gs] = (int32_t)w;
                for (int32_t k = d[i].coff[s]; k < d[i].coff[s + 1]; k++) {
                    g->call_rule[w] = d[i].crule[k];
                    g->call_ret[w] = base + d[i].cret[k];
                    w++;
                    f |= GS_CALLS;
                }
                g->flags[gs] = f;
                g->state_rule[gs] = i;
            }
            base += d[i].n;
        }
        g->call_off[ntot] = (int32_t)w;
    }
    /* FIRST / FOLLOW (over-approximations, used only to prune the mask's work) */
    {
        bset *first = calloc((size_t)nr, sizeof *first);
        bset *snext = calloc((size_t)ntot, sizeof *snext); /* bytes readable from s before completing */
        uint8_t *scomp = calloc((size_t)ntot, 1);           /* s can complete its rule reading nothing */
        if (!first || !snext || !scomp) {
            free(first), free(snext), free(scomp);
            goto nomem;
        }
        bset *clsb = calloc((size_t)ncls, sizeof *clsb); /* the bytes of each class (token classes: none) */
        if (!clsb) {
            free(first), free(snext), free(scomp);
            goto nomem;
        }
        for (int x = 0; x < 256; x++) bs_set(clsb[cls[x]], x);
        for (int32_t s = 0; s < ntot; s++) {
            for (int cl = 0; cl < ncls; cl++)
                if (g->trans[(size_t)s * ncls + cl] >= 0) bs_or(snext[s], clsb[cl]);
            scomp[s] = (g->flags[s] & GS_ACCEPT) != 0;
        }
        for (int i = 0; i < nr; i++) bs_or(first[i], snext[g->rule_start[i]]);
        for (int ch = 1; ch;) {
            ch = 0;
            for (int32_t s = ntot - 1; s >= 0; s--) {
                if (!(g->flags[s] & GS_CALLS)) continue;
                uint64_t nx[4] = {0};
                int comp = 0;
                for (int32_t k = g->call_off[s]; k < g->call_off[s + 1]; k++) {
                    int r = g->call_rule[k];
                    bs_or(nx, first[r]);
                    if (nul[r]) {
                        bs_or(nx, snext[g->call_ret[k]]);
                        if (scomp[g->call_ret[k]]) comp = 1;
                    }
                }
                if (bs_or(snext[s], nx)) ch = 1;
                if (comp && !scomp[s]) scomp[s] = 1, ch = 1;
            }
            for (int i = 0; i < nr; i++)
                if (bs_or(first[i], snext[g->rule_start[i]])) ch = 1;
        }
        for (int ch = 1; ch;) {
            ch = 0;
            for (int32_t s = 0; s < ntot; s++)
                for (int32_t k = g->call_off[s]; k < g->call_off[s + 1]; k++) {
                    int r = g->call_rule[k];
                    int32_t ret = g->call_ret[k];
                    if (bs_or(g->follow[r], snext[ret])) ch = 1;
                    if (scomp[ret] && bs_or(g->follow[r], g->follow[g->state_rule[s]])) ch = 1;
                }
        }
        free(first), free(snext), free(scomp), free(clsb);
    }
    /* bounded string rules: the state after the opening quote and k one-byte characters needs
     * max(0, bmin - k) and takes bmax - k more (each such state is reached by "a"^k) */
    g->bs_min = malloc((size_t)ntot * sizeof *g->bs_min);
    g->bs_max = malloc((size_t)ntot * sizeof *g->bs_max);
    if (!g->bs_min || !g->bs_max) goto nomem;
    for (int32_t s = 0; s < ntot; s++) g->bs_min[s] = 0, g->bs_max[s] = -1;
    for (int i = 0; i < nr; i++) {
        if (!b->r[i].bounded) continue;
        int mn = b->r[i].bmin, mx = b->r[i].bmax;
        int32_t st = g->trans[(size_t)g->rule_start[i] * ncls + cls['"']];
        for (int k = 0; st >= 0 && (mx < 0 || k <= mx); k++) {
            if (g->bs_max[st] >= 0) break; /* the unbounded tail loops back */
            g->bs_min[st] = mn > k ? mn - k : 0;
            g->bs_max[st] = mx < 0 ? INT32_MAX : mx - k;
            st = g->trans[(size_t)st * ncls + cls['a']];
        }
    }
    if (pthread_mutex_init(&g->mu, NULL)) goto nomem;
    g->refs = 1;
    for (int i = 0; i < nr; i++) rdfa_free(&d[i]);
    free(d), free(prod), free(nul), free(seen), free(stk);
    *out = g;
    return MS_OK;
nomem:
    rc = gb_fail(b, MS_ERR_NOMEM, "grammar: out of memory");
fail:
    if (d)
        for (int i = 0; i < nr; i++) rdfa_free(&d[i]);
    free(d), free(prod), free(nul), free(seen), free(stk);
    if (g) {
        g->binds = NULL;
        free(g->trans), free(g->flags), free(g->call_off), free(g->call_rule), free(g->call_ret);
        free(g->state_rule), free(g->rule_start), free(g->follow), free(g->cls), free(g->tok);
        free(g->bs_min), free(g->bs_max);
        if (g->rule_name)
            for (int i = 0; i < nr; i++) free(g->rule_name[i]);
        free(g->rule_name);
        free(g);
    }
    return rc;
}

int ms_grammar_n_states(const ms_grammar *g) { return g ? g->n_states : 0; }
int ms_grammar_n_rules(const ms_grammar *g) { return g ? g->n_rules : 0; }
