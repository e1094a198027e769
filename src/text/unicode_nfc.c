/* unicode_nfc.c — Unicode canonical composition (NFC, UAX #15): full canonical
 * decomposition (with Hangul), canonical ordering, canonical composition.
 * Tables: unicode_nfc_tables.h (tools/gen_unicode_nfc.py). */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "text/unicode_nfc_tables.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7, LCOUNT = 19, VCOUNT = 21, TCOUNT = 28 };
#define NCOUNT (VCOUNT * TCOUNT)
#define SCOUNT (LCOUNT * NCOUNT)

static int ccc_of(uint32_t c) {
    if (c < 0x300) return 0;
    size_t lo = 0, hi = NELEM(k_ccc);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (k_ccc[m][0] < c) lo = m + 1;
        else hi = m;
    }
    return lo < NELEM(k_ccc) && k_ccc[lo][0] == c ? (int)k_ccc[lo][1] : 0;
}

static const uint32_t *decomp_of(uint32_t c) {
    if (c < 0xC0) return NULL;
    size_t lo = 0, hi = NELEM(k_decomp);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (k_decomp[m][0] < c) lo = m + 1;
        else hi = m;
    }
    return lo < NELEM(k_decomp) && k_decomp[lo][0] == c ? &k_decomp[lo][1] : NULL;
}

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    size_t lo = 0, hi = NELEM(k_comp);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (k_comp[m][0] < a || (k_comp[m][0] == a && k_comp[m][1] < b)) lo = m + 1;
        else hi = m;
    }
    return lo < NELEM(k_comp) && k_comp[lo][0] == a && k_comp[lo][1] == b ? k_comp[lo][2] : 0;
}

static int maybe_changes(uint32_t c) {
    if (c < 0x300) return 0;
    size_t lo = 0, hi = NELEM(k_maybe);
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (k_maybe[m][1] < c) lo = m + 1;
        else hi = m;
    }
    return lo < NELEM(k_maybe) && k_maybe[lo][0] <= c;
}

int ms_nfc_quick_yes(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        if (s[i] < 0xCC) { /* two-byte sequences with these lead bytes are below U+0300 */
            i += 2;
            continue;
        }
        uint32_t cp;
        int k = ms_utf8_next(s + i, n - i, &cp);
        if (!k) return 0;
        if (maybe_changes(cp)) return 0;
        i += (size_t)k;
    }
    return 1;
}

typedef struct {
    uint32_t *v;
    size_t n, cap;
} cpvec;

static int cp_push(cpvec *b, uint32_t c) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        uint32_t *p = realloc(b->v, cap * sizeof *p);
        if (!p) return -1;
        b->v = p;
        b->cap = cap;
    }
    b->v[b->n++] = c;
    return 0;
}

static int decompose(uint32_t c, cpvec *out, int depth) {
    if (c >= SBASE && c < SBASE + SCOUNT) {
        uint32_t si = c - SBASE, l = LBASE + si / NCOUNT, v = VBASE + (si % NCOUNT) / TCOUNT, t = TBASE + si % TCOUNT;
        if (cp_push(out, l) || cp_push(out, v)) return -1;
        return t != TBASE ? cp_push(out, t) : 0;
    }
    const uint32_t *d = depth < 8 ? decomp_of(c) : NULL;
    if (!d) return cp_push(out, c);
    if (decompose(d[0], out, depth + 1)) return -1;
    return d[1] ? decompose(d[1], out, depth + 1) : 0;
}

static int nfc_region(const uint8_t *s, size_t n, ms_buf *out) {
    cpvec b = {0};
    int rc = 0;
    /* 1. full canonical decomposition */
    for (size_t i = 0; i < n && !rc;) {
        uint32_t cp;
        int k = ms_utf8_next(s + i, n - i, &cp);
        if (!k) cp = 0xFFFD, k = 1; /* callers pass valid UTF-8 */
        rc = decompose(cp, &b, 0);
        i += (size_t)k;
    }
    /* 2. canonical ordering: stable sort of each run of non-starters by class */
    for (size_t i = 0; i < b.n && !rc;) {
        if (!ccc_of(b.v[i])) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < b.n && ccc_of(b.v[j])) j++;
        for (size_t x = i + 1; x < j; x++) { /* insertion sort: stable */
            uint32_t c = b.v[x];
            int cc = ccc_of(c);
            size_t y = x;
            while (y > i && ccc_of(b.v[y - 1]) > cc) {
                b.v[y] = b.v[y - 1];
                y--;
            }
            b.v[y] = c;
        }
        i = j;
    }
    /* 3. canonical composition */
    size_t len = b.n;
    if (len && !rc) {
        size_t starter = 0, comp = 1;
        uint32_t starter_ch = b.v[0];
        int last = ccc_of(starter_ch);
        if (last) last = 256; /* a leading non-starter blocks everything after it */
        for (size_t i = 1; i < len; i++) {
            uint32_t ch = b.v[i];
            int cc = ccc_of(ch);
            uint32_t c2 = (last < cc || last == 0) ? compose_pair(starter_ch, ch) : 0;
            if (c2 && last != 256) {
                b.v[starter] = starter_ch = c2;
            } else {
                if (cc == 0) {
                    starter = comp;
                    starter_ch = ch;
                }
                last = cc;
                b.v[comp++] = ch;
            }
        }
        len = comp;
    }
    for (size_t i = 0; i < len && !rc; i++) {
        uint8_t u[4];
        int k = ms_utf8_put(b.v[i], u);
        if (ms_buf_add(out, u, (size_t)k)) rc = -1;
    }
    free(b.v);
    return rc;
}

/* A character NFC leaves alone and that nothing before it can combine with
 * (NFC_Quick_Check=Yes, ccc=0) is a boundary: NFC(x y) = NFC(x) NFC(y) when y
 * starts with one. Text is copied as is up to the boundary before each region
 * that may change, and only those regions are normalized. */
int ms_nfc(const uint8_t *s, size_t n, ms_buf *out) {
    size_t done = 0, last_safe = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        int k = ms_utf8_next(s + i, n - i, &cp);
        if (!k) cp = 0xFFFD, k = 1;
        if (!maybe_changes(cp)) {
            last_safe = i;
            i += (size_t)k;
            continue;
        }
        size_t end = i + (size_t)k;
        while (end < n) {
            int k2 = ms_utf8_next(s + end, n - end, &cp);
            if (!k2 || !maybe_changes(cp)) break;
            end += (size_t)k2;
        }
        size_t start = last_safe > done ? last_safe : done;
        if (ms_buf_add(out, s + done, start - done) || nfc_region(s + start, end - start, out)) return -1;
        done = last_safe = i = end;
    }
    if (ms_buf_add(out, s + done, n - done)) return -1;
    return 0;
}
