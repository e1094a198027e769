/* matcher.c — the vocabulary trie, the runtime parser and the token mask.
 *
 * Parse state: a set of configurations (s, p): s a global automaton state that
 * reads bytes, p a stack node (the return state of each pending call, linked to
 * its parent; ROOT at the bottom). Reading a byte moves s along its byte edge, then
 * the closure follows calls (push) and completed rules (pop) to the next states
 * that read bytes.
 *
 * Mask: for each configuration, a cache per state s (computed once per grammar
 * and vocabulary by walking the whole token trie from s alone, with BOTTOM below
 * it) gives the tokens accepted without leaving s's rule frame, and the trie
 * nodes where the frame may complete with bytes of the token still to come
 * ("escapes", pruned by FOLLOW of the rule). Those are finished by walking just
 * that trie subtree from the configuration's real parent: exact, and the walks
 * are short because the parent usually wants one of a few bytes next. */
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_int.h"

#define ROOT (-1)
#define BOTTOM (-2)

/* ---------------- vocabulary ---------------- */

struct ms_gvocab {
    uint32_t n_vocab;
    size_t words;
    int32_t n_nodes;
    uint8_t *nb;     /* byte of node (root: 0) */
    int32_t *nend;   /* end of the node's subtree in preorder */
    uint16_t *ndep;  /* depth, root 0 */
    int32_t *ntok;   /* first token whose bytes end at the node, -1 */
    int32_t *tnext;  /* [n_vocab] next token with the same bytes, -1 */
    uint8_t *tstop;  /* [n_vocab] 1 for a stop token */
    int32_t *stop;
    size_t n_stop;
    uint8_t *bytes;  /* all text tokens' bytes */
    size_t *boff;    /* [n_vocab] */
    uint32_t *blen;  /* [n_vocab], 0: not text */
    int max_len;
    /* String profile: what each text token is as JSON string content (the characters of a
     * string rule: the bounded string rules' caches are read from it, matcher.c get_cache).
     * sp_a: tokens that stay inside a string, by the characters of room they need (a token
     * ending inside a character needs one more), sp_a_off[r]..sp_a_off[r+1] those needing r;
     * sp_q: tokens that end with the closing quote, by the characters before it; sp_qn: the
     * trie nodes of closing quotes followed by more of a token, by the characters before
     * them. r and j go up to sp_max. */
    int32_t *sp_a, *sp_a_off, *sp_q, *sp_q_off, *sp_qn, *sp_qn_off;
    int sp_max;
};

static const uint8_t *g_sort_bytes;
static const size_t *g_sort_off;
static const uint32_t *g_sort_len;
static int cmp_tok(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = g_sort_len[x], ly = g_sort_len[y];
    int c = memcmp(g_sort_bytes + g_sort_off[x], g_sort_bytes + g_sort_off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

void ms_gvocab_free(ms_gvocab *v) {
    if (!v) return;
    free(v->nb), free(v->nend), free(v->ndep), free(v->ntok), free(v->tnext), free(v->tstop);
    free(v->stop), free(v->bytes), free(v->boff), free(v->blen);
    free(v->sp_a), free(v->sp_a_off), free(v->sp_q), free(v->sp_q_off), free(v->sp_qn), free(v->sp_qn_off);
    free(v);
}

/* Counting sort of (key, value) pairs into values by key 0..max: off[max + 2]. */
static int bucket(const int32_t *key, const int32_t *val, size_t n, int max, int32_t **out, int32_t **off) {
    *off = calloc((size_t)max + 2, sizeof **off);
    *out = malloc((n ? n : 1) * sizeof **out);
    if (!*off || !*out) return -1;
    for (size_t i = 0; i < n; i++) (*off)[key[i] + 1]++;
    for (int r = 0; r < max + 1; r++) (*off)[r + 1] += (*off)[r];
    int32_t *fill = malloc(((size_t)max + 1) * sizeof *fill);
    if (!fill) return -1;
    memcpy(fill, *off, ((size_t)max + 1) * sizeof *fill);
    for (size_t i = 0; i < n; i++) (*out)[fill[key[i]]++] = val[i];
    free(fill);
    return 0;
}

/* The string profile of v (see struct ms_gvocab): the trie walked once with the builtin JSON
 * string rule's automaton ("\"" char* "\"", char = an unescaped character or an escape, a
 * surrogate pair one character), counting characters at each return to the content state. */
static int string_profile(ms_gvocab *v, ms_err *err) {
    gbuild b;
    gb_init(&b, NULL, err);
    int root = gb_rule(&b, "root");
    int sr = root >= 0 ? gj_string_rule(&b) : -1;
    if (sr >= 0) {
        b.r[root].defined = 1;
        gb_call(&b, root, 0, sr, 1);
    }
    ms_grammar *sg = NULL;
    int rc = gb_finish(&b, root, &sg);
    gb_free(&b);
    if (rc) return rc;
    int ncls = sg->n_cls;
    const int32_t *tr = sg->trans;
    int32_t q = tr[(size_t)sg->rule_start[sr] * ncls + sg->cls['"']];
    int32_t fin = q >= 0 ? tr[(size_t)q * ncls + sg->cls['"']] : -1;
    int32_t nn = v->n_nodes;
    int32_t *st = malloc(((size_t)v->max_len + 2) * sizeof *st), *jd = malloc(((size_t)v->max_len + 2) * sizeof *jd);
    int32_t *ak = malloc((size_t)v->n_vocab * sizeof *ak), *av = malloc((size_t)v->n_vocab * sizeof *av);
    int32_t *qk = malloc((size_t)v->n_vocab * sizeof *qk), *qv = malloc((size_t)v->n_vocab * sizeof *qv);
    int32_t *nk = malloc(((size_t)nn + 1) * sizeof *nk), *nv = malloc(((size_t)nn + 1) * sizeof *nv);
    size_t na = 0, nq = 0, nqn = 0;
    int mx = 0;
    rc = MS_ERR_NOMEM;
    if (q < 0 || fin < 0 || !st || !jd || !ak || !av || !qk || !qv || !nk || !nv) goto out;
    st[0] = q, jd[0] = 0;
    for (int32_t i = 1; i < nn;) {
        int d = v->ndep[i];
        int32_t from = st[d - 1];
        int32_t t = from >= 0 ? tr[(size_t)from * ncls + sg->cls[v->nb[i]]] : -1;
        if (t < 0) { i = v->nend[i]; continue; }
        int j = jd[d - 1] + (t == q);
        if (t == fin) { /* the closing quote after jd[d-1] characters */
            j = jd[d - 1];
            if (j > mx) mx = j;
            for (int32_t k = v->ntok[i]; k >= 0; k = v->tnext[k]) qk[nq] = j, qv[nq++] = k;
            if (i + 1 < v->nend[i]) nk[nqn] = j, nv[nqn++] = i;
            i = v->nend[i];
            continue;
        }
        int room = j + (t != q); /* inside a character: it needs one more */
        if (room > mx) mx = room;
        for (int32_t k = v->ntok[i]; k >= 0; k = v->tnext[k]) ak[na] = room, av[na++] = k;
        st[d] = t, jd[d] = j;
        i++;
    }
    v->sp_max = mx;
    if (bucket(ak, av, na, mx, &v->sp_a, &v->sp_a_off) || bucket(qk, qv, nq, mx, &v->sp_q, &v->sp_q_off) ||
        bucket(nk, nv, nqn, mx, &v->sp_qn, &v->sp_qn_off))
        goto out;
    rc = MS_OK;
out:
    free(st), free(jd), free(ak), free(av), free(qk), free(qv), free(nk), free(nv);
    ms_grammar_free(sg);
    return rc == MS_ERR_NOMEM ? ms_fail(err, rc, "grammar vocabulary: out of memory") : rc;
}

uint32_t ms_gvocab_size(const ms_gvocab *v) { return v->n_vocab; }
size_t ms_gvocab_mask_words(const ms_gvocab *v) { return v->words; }

#define MAX_TOKEN_BYTES 1024

int ms_gvocab_new_raw(uint32_t n_vocab, const uint8_t *const *bytes, const size_t *len,
                      const int32_t *stop_ids, size_t n_stop, ms_gvocab **out, ms_err *err) {
    *out = NULL;
    if (!n_vocab || n_vocab > (1u << 30)) return ms_fail(err, MS_ERR_ARG, "grammar vocabulary: %u tokens", n_vocab);
    ms_gvocab *v = calloc(1, sizeof *v);
    if (!v) return ms_fail(err, MS_ERR_NOMEM, "grammar vocabulary: out of memory");
    v->n_vocab = n_vocab;
    v->words = (n_vocab + 31) / 32;
    size_t total = 0;
    for (uint32_t i = 0; i < n_vocab; i++)
        if (bytes[i] && len[i] && len[i] <= MAX_TOKEN_BYTES) total += len[i];
    v->bytes = malloc(total ? total : 1);
    v->boff = calloc(n_vocab, sizeof *v->boff);
    v->blen = calloc(n_vocab, sizeof *v->blen);
    v->tnext = malloc(n_vocab * sizeof *v->tnext);
    v->tstop = calloc(n_vocab, 1);
    v->stop = malloc((n_stop ? n_stop : 1) * sizeof *v->stop);
    int32_t *order = malloc(n_vocab * sizeof *order);
    if (!v->bytes || !v->boff || !v->blen || !v->tnext || !v->tstop || !v->stop || !order) goto nomem;
    for (size_t i = 0; i < n_stop; i++) {
        if (stop_ids[i] < 0 || (uint32_t)stop_ids[i] >= n_vocab) {
            free(order);
            ms_gvocab_free(v);
            return ms_fail(err, MS_ERR_ARG, "grammar vocabulary: stop token %d outside the vocabulary (%u)",
                           stop_ids[i], n_vocab);
        }
        v->stop[i] = stop_ids[i];
        v->tstop[stop_ids[i]] = 1;
    }
    v->n_stop = n_stop;
    size_t w = 0;
    uint32_t nt = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        v->tnext[i] = -1;
        if (!bytes[i] || !len[i] || len[i] > MAX_TOKEN_BYTES || v->tstop[i]) continue;
        memcpy(v->bytes + w, bytes[i], len[i]);
        v->boff[i] = w;
        v->blen[i] = (uint32_t)len[i];
        w += len[i];
        order[nt++] = (int32_t)i;
        if ((int)len[i] > v->max_len) v->max_len = (int)len[i];
    }
    g_sort_bytes = v->bytes, g_sort_off = v->boff, g_sort_len = v->blen;
    if (nt) qsort(order, nt, sizeof *order, cmp_tok);
    /* preorder trie: nodes at most total bytes + 1 */
    size_t cap = total + 1;
    v->nb = malloc(cap);
    v->nend = malloc(cap * sizeof *v->nend);
    v->ndep = malloc(cap * sizeof *v->ndep);
    v->ntok = malloc(cap * sizeof *v->ntok);
    int32_t *path = malloc(((size_t)v->max_len + 2) * sizeof *path);
    if (!v->nb || !v->nend || !v->ndep || !v->ntok || !path) {
        free(path);
        goto nomem;
    }
    int32_t nn = 1;
    v->nb[0] = 0, v->ndep[0] = 0, v->ntok[0] = -1;
    path[0] = 0;
    int depth = 0;
    int32_t prev = -1;
    for (uint32_t k = 0; k < nt; k++) {
        int32_t t = order[k];
        const uint8_t *tb = v->bytes + v->boff[t];
        int tl = (int)v->blen[t], lcp = 0;
        if (prev >= 0) {
            const uint8_t *pb = v->bytes + v->boff[prev];
            int pl = (int)v->blen[prev];
            while (lcp < tl && lcp < pl && pb[lcp] == tb[lcp]) lcp++;
        }
        for (int d = depth; d > lcp; d--) v->nend[path[d]] = nn;
        for (int d = lcp + 1; d <= tl; d++) {
            v->nb[nn] = tb[d - 1];
            v->ndep[nn] = (uint16_t)d;
            v->ntok[nn] = -1;
            path[d] = nn++;
        }
        depth = tl;
        int32_t node = path[tl];
        if (v->ntok[node] < 0) v->ntok[node] = t;
        else {
            int32_t q = v->ntok[node];
            while (v->tnext[q] >= 0) q = v->tnext[q];
            v->tnext[q] = t;
        }
        prev = t;
    }
    for (int d = depth; d >= 0; d--) v->nend[path[d]] = nn;
    free(path);
    free(order);
    v->n_nodes = nn;
    int prc = string_profile(v, err);
    if (prc) {
        ms_gvocab_free(v);
        return prc;
    }
    *out = v;
    return MS_OK;
nomem:
    free(order);
    ms_gvocab_free(v);
    return ms_fail(err, MS_ERR_NOMEM, "grammar vocabulary: out of memory");
}

int ms_gvocab_new(const ms_tokenizer *t, uint32_t n_vocab, const int32_t *stop_ids, size_t n_stop,
                  ms_gvocab **out, ms_err *err) {
    uint32_t nt = ms_tok_vocab_size(t);
    if (!n_vocab) n_vocab = nt;
    const uint8_t **b = calloc(n_vocab, sizeof *b);
    size_t *l = calloc(n_vocab, sizeof *l);
    if (!b || !l) {
        free(b), free(l);
        return ms_fail(err, MS_ERR_NOMEM, "grammar vocabulary: out of memory");
    }
    for (uint32_t i = 0; i < n_vocab && i < nt; i++) {
        if (ms_tok_is_special(t, (int32_t)i)) continue;
        b[i] = ms_tok_token_bytes(t, (int32_t)i, &l[i]);
    }
    int rc = ms_gvocab_new_raw(n_vocab, b, l, stop_ids, n_stop, out, err);
    free(b), free(l);
    return rc;
}

/* ---------------- runtime structures ---------------- */

typedef struct gcfg {
    int32_t s, p;
} gcfg;
typedef struct gnode {
    int32_t s, p, dep;
    uint32_t h; /* hash of the stack's states from this node down (equal stacks, equal h) */
} gnode;
typedef struct arena {
    gnode *n;
    int32_t len, cap;
} arena;

typedef struct gcache {
    int32_t nacc;
    uint32_t *bits;  /* a bitmap when many tokens are accepted, else NULL */
    int32_t *list;   /* accepted ids otherwise */
    int32_t nesc;
    int32_t *esc;    /* trie nodes to walk from the parent's continuation */
    int32_t maxdep;  /* deepest call stack of the walk (frames above the state's own) */
} gcache;

/* A hash index over one configuration set (the set being built, or the closure's seen
 * set): slot -> index into the set, valid when its stamp is the current one; reset in O(1)
 * by a new stamp. Sized for max_configs at half load. Keeps the membership test O(1)
 * instead of a scan of the set per insertion (quadratic: 4096^2 stack compares per byte). */
typedef struct cfg_index {
    uint32_t *stamp;
    int32_t *at;
    uint32_t cur, mask;
} cfg_index;

typedef struct walk {
    const ms_grammar *g;
    arena *ar;
    gcfg *sb; /* configuration sets, by depth */
    size_t nsb, capsb;
    gcfg *seen;
    int nseen, capseen;
    gcfg *work;
    int nwork, capwork;
    size_t out_off; /* where the set being built starts in sb */
    cfg_index ix_out, ix_seen; /* over sb[out_off..nsb) and seen[0..nseen) */
    int esc, done, rc;
    int32_t maxdep; /* deepest node pushed */
} walk;

struct ms_matcher {
    ms_grammar *g;
    const ms_gvocab *v;
    gbind *bind;
    arena ar, tmp;
    gcfg *cur;
    int ncur, capcur;
    int done, ended;
    walk w;
    size_t *setoff;
    int32_t *setlen, *mark;
    int32_t *acc;
    size_t nacc, capacc;
    int32_t *escv;
    size_t nescv, capescv;
};

static int grow(void **p, size_t need, size_t *cap, size_t el) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, nc * el);
    if (!np) return -1;
    *p = np;
    *cap = nc;
    return 0;
}
static int growi(void **p, int need, int *cap, size_t el) {
    size_t c = (size_t)*cap;
    int r = grow(p, (size_t)need, &c, el);
    *cap = (int)c;
    return r;
}

static int32_t node_push(walk *w, int32_t s, int32_t p) {
    arena *a = w->ar;
    int32_t dep = (p >= 0 ? a->n[p].dep : 0) + 1;
    if (dep > w->g->o.max_stack) return -3; /* too deep: this path is not followed */
    if (a->len == a->cap) {
        if (a->cap >= (1 << 26)) {
            w->rc = MS_ERR_LIMIT;
            return -3;
        }
        int nc = a->cap ? a->cap * 2 : 1024;
        gnode *nn = realloc(a->n, (size_t)nc * sizeof *nn);
        if (!nn) {
            w->rc = MS_ERR_NOMEM;
            return -3;
        }
        a->n = nn;
        a->cap = nc;
    }
    uint32_t h = (p >= 0 ? a->n[p].h : (uint32_t)p) * 0x9E3779B1u ^ (uint32_t)s * 0x85EBCA6Bu;
    a->n[a->len] = (gnode){s, p, dep, h ^ h >> 15};
    if (dep > w->maxdep) w->maxdep = dep;
    return a->len++;
}

static inline int node_eq(const arena *a, int32_t x, int32_t y) {
    while (x != y) {
        if (x < 0 || y < 0) return 0;
        if (a->n[x].s != a->n[y].s) return 0;
        x = a->n[x].p;
        y = a->n[y].p;
    }
    return 1;
}

static inline uint32_t stack_hash(const arena *a, int32_t p) { return p >= 0 ? a->n[p].h : (uint32_t)p; }

/* Allocate ix for n_max entries (a power of two of at least twice that). 0 or -1. */
static int ix_init(cfg_index *ix, int n_max) {
    uint32_t cap = 64;
    while (cap < 2u * (uint32_t)n_max) cap *= 2;
    ix->stamp = calloc(cap, sizeof *ix->stamp);
    ix->at = malloc(cap * sizeof *ix->at);
    ix->mask = cap - 1;
    ix->cur = 1;
    return ix->stamp && ix->at ? 0 : -1;
}
static void ix_free(cfg_index *ix) { free(ix->stamp), free(ix->at); }
/* Empty ix (a new set starts). */
static void ix_reset(cfg_index *ix) {
    if (++ix->cur == 0) { /* the stamps wrapped: clear them once */
        memset(ix->stamp, 0, (size_t)(ix->mask + 1) * sizeof *ix->stamp);
        ix->cur = 1;
    }
}
/* Whether (s, p) (a stack equal to p's counts) is in set, indexed by ix; if not and add,
 * index it as set[n] (the caller appends it there). */
static int ix_find(cfg_index *ix, const arena *a, const gcfg *set, int32_t n, int32_t s, int32_t p, int add) {
    uint32_t hp = stack_hash(a, p), k = (hp ^ (uint32_t)s * 0xC2B2AE35u) & ix->mask;
    for (; ix->stamp[k] == ix->cur; k = (k + 1) & ix->mask) {
        const gcfg *c = &set[ix->at[k]];
        if (c->s == s && (c->p == p || (stack_hash(a, c->p) == hp && node_eq(a, c->p, p)))) return 1;
    }
    if (add) ix->stamp[k] = ix->cur, ix->at[k] = n;
    return 0;
}
/* The sets start: the one being built at sb[out_off], and the closure's seen set. */
static void sets_reset(walk *w) {
    ix_reset(&w->ix_out);
    ix_reset(&w->ix_seen);
}

static void out_add(walk *w, int32_t s, int32_t p) {
    size_t n = w->nsb - w->out_off;
    if ((int)n >= w->g->o.max_configs) { /* full: (s, p) may still be in it */
        if (!ix_find(&w->ix_out, w->ar, w->sb + w->out_off, (int32_t)n, s, p, 0)) w->rc = MS_ERR_LIMIT;
        return;
    }
    if (ix_find(&w->ix_out, w->ar, w->sb + w->out_off, (int32_t)n, s, p, 1)) return;
    if (grow((void **)&w->sb, w->nsb + 1, &w->capsb, sizeof *w->sb)) {
        w->rc = MS_ERR_NOMEM;
        return;
    }
    w->sb[w->nsb++] = (gcfg){s, p};
}

/* Add configuration (s, p) and its closure to the set being built. */
static void visit(walk *w, int32_t s, int32_t p) {
    const ms_grammar *g = w->g;
    if (g->flags[s] == GS_BYTES) {
        out_add(w, s, p);
        return;
    }
    w->nwork = 0;
    if (growi((void **)&w->work, 1, &w->capwork, sizeof *w->work)) {
        w->rc = MS_ERR_NOMEM;
        return;
    }
    w->work[w->nwork++] = (gcfg){s, p};
    while (w->nwork && !w->rc) {
        gcfg c = w->work[--w->nwork];
        uint8_t f = g->flags[c.s];
        if (f == GS_BYTES) {
            out_add(w, c.s, c.p);
            continue;
        }
        if (w->nseen >= g->o.max_configs) {
            if (ix_find(&w->ix_seen, w->ar, w->seen, w->nseen, c.s, c.p, 0)) continue;
            w->rc = MS_ERR_LIMIT;
            return;
        }
        if (ix_find(&w->ix_seen, w->ar, w->seen, w->nseen, c.s, c.p, 1)) continue;
        if (growi((void **)&w->seen, w->nseen + 1, &w->capseen, sizeof *w->seen)) {
            w->rc = MS_ERR_NOMEM;
            return;
        }
        w->seen[w->nseen++] = c;
        if (f & GS_BYTES) out_add(w, c.s, c.p);
        int32_t k0 = g->call_off[c.s], k1 = g->call_off[c.s + 1];
        if (growi((void **)&w->work, w->nwork + (k1 - k0) + 1, &w->capwork, sizeof *w->work)) {
            w->rc = MS_ERR_NOMEM;
            return;
        }
        for (int32_t k = k0; k < k1; k++) {
            int32_t np = node_push(w, g->call_ret[k], c.p);
            if (np == -3) continue;
            w->work[w->nwork++] = (gcfg){g->rule_start[g->call_rule[k]], np};
        }
        if (f & GS_ACCEPT) {
            if (c.p == ROOT) w->done = 1;
            else if (c.p == BOTTOM) w->esc = 1;
            else w->work[w->nwork++] = (gcfg){w->ar->n[c.p].s, w->ar->n[c.p].p};
        }
    }
}

/* The set sb[in_off .. in_off+nin) reads byte x; the closed result is appended to
 * sb. Returns 1 when some configuration read the byte. */
static int step(walk *w, size_t in_off, size_t nin, int x) {
    const ms_grammar *g = w->g;
    const int32_t *tr = g->trans;
    int ncls = g->n_cls, cl = g->cls[x], raw = 0;
    w->out_off = w->nsb;
    w->nseen = 0;
    sets_reset(w);
    w->esc = w->done = 0;
    for (size_t i = 0; i < nin; i++) {
        gcfg c = w->sb[in_off + i];
        int32_t t = tr[(size_t)c.s * ncls + cl];
        if (t < 0) continue;
        raw = 1;
        visit(w, t, c.p);
    }
    return raw;
}

/* ---------------- trie walks ---------------- */

enum { WALK_CACHE = 0, WALK_FULL = 1 };

/* Walk trie nodes [lo, nend[lo]) (lo and its subtree; or, with lo = 1 and hi =
 * n_nodes, every node below the root) from the set sb[0..nin), which belongs to
 * depth base. CACHE: collect accepted tokens in m->acc and escape nodes in
 * m->escv (follow: the bytes that may come after the frame). FULL: set bits. */
static int walk_trie(ms_matcher *m, int32_t lo, int32_t hi, int base, int mode, const uint64_t *follow,
                     uint32_t *bits) {
    const ms_gvocab *v = m->v;
    walk *w = &m->w;
    const int32_t *tr = w->g->trans;
    const uint8_t *flags = w->g->flags;
    const uint16_t *cls = w->g->cls;
    int ncls = w->g->n_cls;
    m->setoff[0] = 0;
    m->setlen[0] = (int32_t)w->nsb;
    m->mark[1] = w->ar->len;
    for (int32_t i = lo; i < hi && !w->rc;) {
        int d = v->ndep[i] - base;
        w->ar->len = m->mark[d];
        w->nsb = m->setoff[d - 1] + (size_t)m->setlen[d - 1];
        m->setoff[d] = w->nsb;
        int raw;
        gcfg one = w->sb[m->setoff[d - 1]];
        int32_t t1;
        if (m->setlen[d - 1] == 1 && (t1 = tr[(size_t)one.s * ncls + cls[v->nb[i]]]) >= 0 && flags[t1] == GS_BYTES) {
            /* the common case: one configuration moving to a plain state */
            if (grow((void **)&w->sb, w->nsb + 1, &w->capsb, sizeof *w->sb)) return MS_ERR_NOMEM;
            w->sb[w->nsb++] = (gcfg){t1, one.p};
            w->esc = w->done = 0;
            raw = 1;
        } else raw = step(w, m->setoff[d - 1], (size_t)m->setlen[d - 1], v->nb[i]);
        if (!raw) {
            i = v->nend[i];
            continue;
        }
        for (int32_t t = v->ntok[i]; t >= 0; t = v->tnext[t]) {
            if (mode == WALK_FULL) bits[t >> 5] |= 1u << (t & 31);
            else {
                if (grow((void **)&m->acc, m->nacc + 1, &m->capacc, sizeof *m->acc)) return MS_ERR_NOMEM;
                m->acc[m->nacc++] = t;
            }
        }
        if (mode == WALK_CACHE && w->esc)
            for (int32_t c = i + 1; c < v->nend[i]; c = v->nend[c]) {
                uint8_t x = v->nb[c];
                if (!(follow[x >> 6] >> (x & 63) & 1)) continue;
                if (grow((void **)&m->escv, m->nescv + 1, &m->capescv, sizeof *m->escv)) return MS_ERR_NOMEM;
                m->escv[m->nescv++] = c;
            }
        m->setlen[d] = (int32_t)(w->nsb - m->setoff[d]);
        if (!m->setlen[d]) {
            i = v->nend[i];
            continue;
        }
        m->mark[d + 1] = w->ar->len;
        i++;
    }
    return w->rc;
}

static void cache_free(gcache *c) {
    if (!c) return;
    free(c->bits), free(c->list), free(c->esc);
    free(c);
}

static size_t cache_size(const gcache *c, const ms_gvocab *v) {
    return sizeof *c + (c->bits ? v->words * 4 : (size_t)c->nacc * 4) + (size_t)c->nesc * 4;
}

/* The cache of state s, computed when missing. *owned = 1 when the caller must
 * free it (the budget was spent). */
static int get_cache(ms_matcher *m, int32_t s, gcache **out, int *owned) {
    ms_grammar *g = m->g;
    gbind *bd = m->bind;
    *owned = 0;
    pthread_mutex_lock(&g->mu);
    gcache *c = bd->ent[s];
    pthread_mutex_unlock(&g->mu);
    if (c) {
        *out = c;
        return MS_OK;
    }
    const ms_gvocab *v = m->v;
    walk *w = &m->w;
    int32_t maxdep = 0;
    m->nacc = m->nescv = 0;
    if (g->bs_max[s] >= 0 && v->sp_a_off) {
        /* a state between two characters of a bounded string: from the string profile, the
         * tokens that fit the characters left (and close the string after enough), and the
         * quotes where the rule ends with bytes of the token left (what the trie walk below
         * finds, without it) */
        const uint64_t *follow = g->follow[g->state_rule[s]];
        int hi = g->bs_max[s] < v->sp_max ? g->bs_max[s] : v->sp_max, lo = g->bs_min[s];
        size_t na = (size_t)v->sp_a_off[hi + 1];
        size_t nq = lo <= hi ? (size_t)(v->sp_q_off[hi + 1] - v->sp_q_off[lo]) : 0;
        if (grow((void **)&m->acc, na + nq + 1, &m->capacc, sizeof *m->acc)) return MS_ERR_NOMEM;
        memcpy(m->acc, v->sp_a, na * sizeof *m->acc);
        if (nq) memcpy(m->acc + na, v->sp_q + v->sp_q_off[lo], nq * sizeof *m->acc);
        m->nacc = na + nq;
        for (int32_t k = lo <= hi ? v->sp_qn_off[lo] : 0; lo <= hi && k < v->sp_qn_off[hi + 1]; k++) {
            int32_t qn = v->sp_qn[k];
            for (int32_t ch = qn + 1; ch < v->nend[qn]; ch = v->nend[ch]) {
                uint8_t x = v->nb[ch];
                if (!(follow[x >> 6] >> (x & 63) & 1)) continue;
                if (grow((void **)&m->escv, m->nescv + 1, &m->capescv, sizeof *m->escv)) return MS_ERR_NOMEM;
                m->escv[m->nescv++] = ch;
            }
        }
    } else {
        arena *saved = w->ar;
        w->ar = &m->tmp;
        m->tmp.len = 0;
        w->nsb = 0;
        if (grow((void **)&w->sb, 1, &w->capsb, sizeof *w->sb)) return MS_ERR_NOMEM;
        w->sb[w->nsb++] = (gcfg){s, BOTTOM};
        w->rc = 0;
        w->maxdep = 0;
        int rc = walk_trie(m, 1, v->n_nodes, 0, WALK_CACHE, g->follow[g->state_rule[s]], NULL);
        maxdep = w->maxdep;
        w->ar = saved;
        if (rc) return rc;
    }
    c = calloc(1, sizeof *c);
    if (!c) return MS_ERR_NOMEM;
    c->nacc = (int32_t)m->nacc;
    c->maxdep = maxdep;
    if (m->nacc * 32 >= v->n_vocab) {
        c->bits = calloc(v->words, 4);
        if (!c->bits) goto nomem;
        for (size_t i = 0; i < m->nacc; i++) c->bits[m->acc[i] >> 5] |= 1u << (m->acc[i] & 31);
    } else if (m->nacc) {
        c->list = malloc(m->nacc * sizeof *c->list);
        if (!c->list) goto nomem;
        memcpy(c->list, m->acc, m->nacc * sizeof *c->list);
    }
    c->nesc = (int32_t)m->nescv;
    if (m->nescv) {
        c->esc = malloc(m->nescv * sizeof *c->esc);
        if (!c->esc) goto nomem;
        memcpy(c->esc, m->escv, m->nescv * sizeof *c->esc);
    }
    size_t sz = cache_size(c, v);
    pthread_mutex_lock(&g->mu);
    if (bd->ent[s]) {
        gcache *o = bd->ent[s];
        pthread_mutex_unlock(&g->mu);
        cache_free(c);
        *out = o;
        return MS_OK;
    }
    if (bd->bytes + sz <= g->o.cache_bytes) {
        bd->ent[s] = c;
        bd->bytes += sz;
    } else {
        *owned = 1;
    }
    pthread_mutex_unlock(&g->mu);
    *out = c;
    return MS_OK;
nomem:
    cache_free(c);
    return MS_ERR_NOMEM;
}

/* ---------------- matcher ---------------- */

/* k when token id is the grammar's token reference k, else -1 */
static int tok_ref(const ms_grammar *g, int32_t id) {
    for (int32_t k = 0; k < g->n_tok; k++)
        if (g->tok[k] == id) return (int)k;
    return -1;
}

static int fail_rc(ms_err *err, int rc, const char *what) {
    if (rc == MS_ERR_LIMIT)
        return ms_fail(err, rc, "grammar %s: a runtime limit was hit (max_configs or the stack arena)", what);
    if (rc == MS_ERR_NOMEM) return ms_fail(err, rc, "grammar %s: out of memory", what);
    return ms_fail(err, rc, "grammar %s failed", what);
}

/* Set cur to the closure of the start configuration. */
static int start(ms_matcher *m) {
    walk *w = &m->w;
    w->ar = &m->ar;
    m->ar.len = 0;
    w->nsb = 0;
    w->rc = 0;
    w->out_off = 0;
    w->nseen = 0;
    sets_reset(w);
    w->esc = w->done = 0;
    visit(w, m->g->rule_start[m->g->root], ROOT);
    if (w->rc) return w->rc;
    if (growi((void **)&m->cur, (int)w->nsb + 1, &m->capcur, sizeof *m->cur)) return MS_ERR_NOMEM;
    memcpy(m->cur, w->sb, w->nsb * sizeof *m->cur);
    m->ncur = (int)w->nsb;
    m->done = w->done;
    m->ended = 0;
    return MS_OK;
}

int ms_matcher_new(ms_grammar *g, const ms_gvocab *v, ms_matcher **out, ms_err *err) {
    *out = NULL;
    ms_matcher *m = calloc(1, sizeof *m);
    if (!m) return ms_fail(err, MS_ERR_NOMEM, "grammar matcher: out of memory");
    m->g = g;
    m->v = v;
    m->w.g = g;
    pthread_mutex_lock(&g->mu);
    gbind *b = g->binds;
    while (b && b->v != v) b = b->next;
    if (!b) {
        b = calloc(1, sizeof *b);
        if (b) b->ent = calloc((size_t)g->n_states, sizeof *b->ent);
        if (b && b->ent) {
            b->v = v;
            b->next = g->binds;
            g->binds = b;
        } else if (b) {
            free(b);
            b = NULL;
        }
    }
    pthread_mutex_unlock(&g->mu);
    m->bind = b;
    size_t dn = (size_t)v->max_len + 3;
    m->setoff = malloc(dn * sizeof *m->setoff);
    m->setlen = malloc(dn * sizeof *m->setlen);
    m->mark = malloc(dn * sizeof *m->mark);
    if (!b || !m->setoff || !m->setlen || !m->mark || grow((void **)&m->w.sb, 64, &m->w.capsb, sizeof *m->w.sb) ||
        growi((void **)&m->w.seen, 64, &m->w.capseen, sizeof *m->w.seen) ||
        growi((void **)&m->w.work, 64, &m->w.capwork, sizeof *m->w.work) || ix_init(&m->w.ix_out, g->o.max_configs) ||
        ix_init(&m->w.ix_seen, g->o.max_configs)) {
        ms_matcher_free(m);
        return ms_fail(err, MS_ERR_NOMEM, "grammar matcher: out of memory");
    }
    int rc = start(m);
    if (rc) {
        ms_matcher_free(m);
        return fail_rc(err, rc, "start");
    }
    *out = m;
    return MS_OK;
}

void ms_matcher_free(ms_matcher *m) {
    if (!m) return;
    free(m->ar.n), free(m->tmp.n), free(m->cur);
    free(m->w.sb), free(m->w.seen), free(m->w.work);
    ix_free(&m->w.ix_out), ix_free(&m->w.ix_seen);
    free(m->setoff), free(m->setlen), free(m->mark), free(m->acc), free(m->escv);
    free(m);
}

void ms_matcher_reset(ms_matcher *m) { (void)start(m); }

int ms_matcher_clone(const ms_matcher *m, ms_matcher **out, ms_err *err) {
    ms_matcher *c = NULL;
    int rc = ms_matcher_new(m->g, m->v, &c, err);
    if (rc) return rc;
    if (growi((void **)&c->cur, m->ncur + 1, &c->capcur, sizeof *c->cur) ||
        growi((void **)&c->ar.n, m->ar.len + 1, &c->ar.cap, sizeof *c->ar.n)) {
        ms_matcher_free(c);
        return ms_fail(err, MS_ERR_NOMEM, "grammar matcher clone: out of memory");
    }
    if (m->ar.len) memcpy(c->ar.n, m->ar.n, (size_t)m->ar.len * sizeof *c->ar.n);
    c->ar.len = m->ar.len;
    memcpy(c->cur, m->cur, (size_t)m->ncur * sizeof *c->cur);
    c->ncur = m->ncur;
    c->done = m->done;
    c->ended = m->ended;
    *out = c;
    return MS_OK;
}

int ms_matcher_done(const ms_matcher *m) { return m->done && !m->ended; }
int ms_matcher_ended(const ms_matcher *m) { return m->ended; }
int ms_matcher_closed(const ms_matcher *m) { return m->done && m->ncur == 0; }

/* Drop stack nodes that no configuration reaches (nodes only point to older ones). */
static void compact(ms_matcher *m) {
    arena *a = &m->ar;
    if (a->len < 4096) return;
    int32_t *ren = malloc((size_t)a->len * sizeof *ren);
    if (!ren) return;
    for (int32_t i = 0; i < a->len; i++) ren[i] = -1;
    for (int i = 0; i < m->ncur; i++)
        for (int32_t p = m->cur[i].p; p >= 0 && ren[p] == -1; p = a->n[p].p) ren[p] = 0;
    int32_t k = 0;
    for (int32_t i = 0; i < a->len; i++)
        if (ren[i] == 0) {
            gnode nd = a->n[i];
            if (nd.p >= 0) nd.p = ren[nd.p];
            ren[i] = k;
            a->n[k++] = nd;
        }
    for (int i = 0; i < m->ncur; i++)
        if (m->cur[i].p >= 0) m->cur[i].p = ren[m->cur[i].p];
    a->len = k;
    free(ren);
}

/* Run bytes b[0..n) from cur (b NULL: the one symbol sym, a token reference); 1 when all
 * are read (*done: the document may end), 0 when byte *bad is refused, negative on a
 * limit. commit: make the result cur. */
static int run_syms(ms_matcher *m, const uint8_t *b, size_t n, int sym, int commit, size_t *bad) {
    walk *w = &m->w;
    w->ar = &m->ar;
    int32_t mark = m->ar.len;
    w->rc = 0;
    w->nsb = 0;
    if (grow((void **)&w->sb, (size_t)m->ncur + 1, &w->capsb, sizeof *w->sb)) return MS_ERR_NOMEM;
    memcpy(w->sb, m->cur, (size_t)m->ncur * sizeof *w->sb);
    w->nsb = (size_t)m->ncur;
    size_t cnt = w->nsb;
    int done = m->done;
    for (size_t i = 0; i < n; i++) {
        int raw = step(w, 0, cnt, b ? b[i] : sym);
        if (w->rc || !raw) {
            m->ar.len = mark;
            *bad = i;
            return w->rc ? w->rc : 0;
        }
        done = w->done;
        size_t nn = w->nsb - w->out_off;
        memmove(w->sb, w->sb + w->out_off, nn * sizeof *w->sb);
        w->nsb = nn;
        cnt = nn;
    }
    if (!commit) {
        m->ar.len = mark;
        return 1;
    }
    if (growi((void **)&m->cur, (int)cnt + 1, &m->capcur, sizeof *m->cur)) {
        m->ar.len = mark;
        return MS_ERR_NOMEM;
    }
    memcpy(m->cur, w->sb, cnt * sizeof *m->cur);
    m->ncur = (int)cnt;
    m->done = done;
    compact(m);
    return 1;
}

int ms_matcher_can_accept_bytes(ms_matcher *m, const uint8_t *b, size_t n) {
    if (m->ended) return 0;
    size_t bad;
    return run_syms(m, b, n, 0, 0, &bad) == 1;
}

int ms_matcher_accept_bytes(ms_matcher *m, const uint8_t *b, size_t n, ms_err *err) {
    if (m->ended) return ms_fail(err, MS_ERR_ARG, "grammar: text after the end of the document");
    if (!n) return MS_OK;
    size_t bad = 0;
    int r = run_syms(m, b, n, 0, 1, &bad);
    if (r == 1) return MS_OK;
    if (r == 0) return ms_fail(err, MS_ERR_ARG, "grammar: byte %zu (0x%02x) of the text is not allowed here", bad, b[bad]);
    return fail_rc(err, r, "accept");
}

int ms_matcher_accept(ms_matcher *m, int32_t tok, ms_err *err) {
    const ms_gvocab *v = m->v;
    if (m->ended) return ms_fail(err, MS_ERR_ARG, "grammar: token %d after the end of the document", tok);
    if (tok < 0 || (uint32_t)tok >= v->n_vocab) return ms_fail(err, MS_ERR_ARG, "grammar: token %d outside the vocabulary", tok);
    int k = tok_ref(m->g, tok);
    if (k >= 0) { /* a token the grammar references: only as that reference, never as text or a stop */
        size_t bad = 0;
        int r = run_syms(m, NULL, 1, 256 + k, 1, &bad);
        if (r == 1) return MS_OK;
        if (r == 0) return ms_fail(err, MS_ERR_ARG, "grammar: token %d is not allowed here", tok);
        return fail_rc(err, r, "accept");
    }
    if (v->tstop[tok]) {
        if (!m->done) return ms_fail(err, MS_ERR_ARG, "grammar: stop token %d before the document is complete", tok);
        m->ended = 1;
        return MS_OK;
    }
    if (!v->blen[tok]) return ms_fail(err, MS_ERR_ARG, "grammar: token %d is not text", tok);
    int rc = ms_matcher_accept_bytes(m, v->bytes + v->boff[tok], v->blen[tok], err);
    if (rc == MS_ERR_ARG) {
        ms_err_clear(err);
        return ms_fail(err, MS_ERR_ARG, "grammar: token %d is not allowed here", tok);
    }
    return rc;
}

int ms_matcher_mask(ms_matcher *m, uint32_t *bits, ms_err *err) {
    const ms_gvocab *v = m->v;
    const ms_grammar *g = m->g;
    memset(bits, 0, v->words * 4);
    if (m->ended) return MS_OK;
    walk *w = &m->w;
    int32_t mark = m->ar.len;
    int rc = MS_OK, deep = !m->ncur;
    for (int ci = 0; ci < m->ncur && !rc; ci++) {
        gcfg c = m->cur[ci];
        gcache *e;
        int owned;
        if ((rc = get_cache(m, c.s, &e, &owned))) break;
        int32_t dep = c.p >= 0 ? m->ar.n[c.p].dep : 0;
        if (dep + e->maxdep > g->o.max_stack) {
            /* near max_stack the cache (walked with an empty stack) may offer calls the real
             * stack cannot take: walk the whole trie from the real configuration instead */
            deep = 1;
            w->ar = &m->ar;
            w->rc = 0;
            w->nsb = 0;
            if (grow((void **)&w->sb, 1, &w->capsb, sizeof *w->sb)) rc = MS_ERR_NOMEM;
            else {
                w->sb[w->nsb++] = c;
                rc = walk_trie(m, 1, v->n_nodes, 0, WALK_FULL, NULL, bits);
            }
            if (owned) cache_free(e);
            m->ar.len = mark;
            continue;
        }
        if (e->bits) {
            for (size_t i = 0; i < v->words; i++) bits[i] |= e->bits[i];
        } else {
            for (int32_t i = 0; i < e->nacc; i++) bits[e->list[i] >> 5] |= 1u << (e->list[i] & 31);
        }
        if (e->nesc && c.p >= 0) {
            /* the continuation once the frame of c.s completes */
            w->ar = &m->ar;
            w->rc = 0;
            w->nsb = 0;
            w->out_off = 0;
            w->nseen = 0;
            sets_reset(w);
            w->esc = w->done = 0;
            visit(w, m->ar.n[c.p].s, m->ar.n[c.p].p);
            size_t np = w->nsb;
            if (w->rc) rc = w->rc;
            int32_t pmark = m->ar.len;
            for (int32_t k = 0; k < e->nesc && np && !rc; k++) {
                int32_t node = e->esc[k];
                w->nsb = np;
                m->ar.len = pmark;
                rc = walk_trie(m, node, v->nend[node], v->ndep[node] - 1, WALK_FULL, NULL, bits);
            }
        }
        if (owned) cache_free(e);
        m->ar.len = mark;
    }
    m->ar.len = mark;
    if (rc) {
        memset(bits, 0, v->words * 4);
        return fail_rc(err, rc, "mask");
    }
    if (m->done)
        for (size_t i = 0; i < v->n_stop; i++) bits[v->stop[i] >> 5] |= 1u << (v->stop[i] & 31);
    /* token references: allowed exactly when the parse can read their symbol (whatever the
     * trie or the stop rule said about the same id) */
    for (int32_t k = 0; k < g->n_tok; k++) {
        int32_t id = g->tok[k];
        if ((uint32_t)id >= v->n_vocab) continue;
        size_t bad;
        int r = run_syms(m, NULL, 1, 256 + k, 0, &bad);
        if (r < 0) {
            memset(bits, 0, v->words * 4);
            return fail_rc(err, r, "mask");
        }
        if (r) bits[id >> 5] |= 1u << (id & 31);
        else bits[id >> 5] &= ~(1u << (id & 31));
    }
    if (deep && !m->done) {
        /* only the stack bound can leave a live parse with no continuation */
        size_t i = 0;
        while (i < v->words && !bits[i]) i++;
        if (i == v->words)
            return ms_fail(err, MS_ERR_LIMIT, "grammar mask: the document nests deeper than max_stack (%d): no token can follow",
                           g->o.max_stack);
    }
    return MS_OK;
}

void ms_grammar_free(ms_grammar *g) {
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    for (gbind *b = g->binds; b;) {
        gbind *nx = b->next;
        for (int32_t s = 0; s < g->n_states; s++) cache_free(b->ent[s]);
        free(b->ent);
        free(b);
        b = nx;
    }
    pthread_mutex_destroy(&g->mu);
    free(g->trans), free(g->flags), free(g->call_off), free(g->call_rule), free(g->call_ret);
    free(g->state_rule), free(g->rule_start), free(g->follow), free(g->cls), free(g->tok);
    free(g->bs_min), free(g->bs_max);
    for (int i = 0; i < g->n_rules; i++) free(g->rule_name[i]);
    free(g->rule_name);
    free(g);
}
