/* tok_bpe.c — byte-level BPE: vocab (bytes <-> id), merges ((a, b) -> rank,
 * merged id) and the merge loop of tokenizers' Word::merge_all (a priority
 * queue on (rank, position), so long words cost O(n log n)), plus a word cache. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

#define NONE32 UINT32_MAX
#define CACHE_MAX_WORD 96
#define CACHE_CAP 65536 /* entries; cleared when half full */

typedef struct ms_bpe_cache_ent {
    uint64_t h;
    uint8_t *key; /* NULL = empty; key bytes followed by ids */
    uint32_t klen, nids;
} ms_bpe_cache_ent;

static uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w ^ ((uint64_t)n << 56)) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    return h;
}

static uint64_t hash64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

int ms_bpe_init(ms_bpe *b, uint32_t n_ids, ms_err *err) {
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->cache_mu, NULL);
    b->n_ids = n_ids;
    b->off = calloc(n_ids ? n_ids : 1, sizeof *b->off);
    b->len = malloc((n_ids ? n_ids : 1) * sizeof *b->len);
    if (!b->off || !b->len) return ms_fail(err, MS_ERR_NOMEM, "BPE vocabulary of %u ids: out of memory", n_ids);
    for (uint32_t i = 0; i < n_ids; i++) b->len[i] = NONE32;
    for (int i = 0; i < 256; i++) b->byte_id[i] = -1;
    return MS_OK;
}

int ms_bpe_set_token(ms_bpe *b, uint32_t id, const uint8_t *s, size_t n, ms_err *err) {
    if (id >= b->n_ids) return ms_fail(err, MS_ERR_FORMAT, "token id %u out of range (< %u)", id, b->n_ids);
    if (b->len[id] != NONE32) return ms_fail(err, MS_ERR_FORMAT, "token id %u given twice", id);
    if (n >= NONE32) return ms_fail(err, MS_ERR_LIMIT, "token %u is too long", id);
    if (b->blob_n + n + 1 > b->blob_cap) {
        size_t cap = b->blob_cap ? b->blob_cap : 1 << 16;
        while (cap < b->blob_n + n + 1) cap *= 2;
        uint8_t *p = realloc(b->blob, cap);
        if (!p) return ms_fail(err, MS_ERR_NOMEM, "BPE vocabulary: out of memory");
        b->blob = p;
        b->blob_cap = cap;
    }
    memcpy(b->blob + b->blob_n, s, n);
    b->off[id] = b->blob_n;
    b->len[id] = (uint32_t)n;
    b->blob_n += n;
    b->blob[b->blob_n++] = 0;
    return MS_OK;
}

int32_t ms_bpe_lookup(const ms_bpe *b, const uint8_t *s, size_t n) {
    if (!b->vcap) return -1;
    size_t mask = b->vcap - 1, i = hash_bytes(s, n) & mask;
    for (;;) {
        uint32_t id = b->vslots[i];
        if (id == NONE32) return -1;
        if (b->len[id] == n && memcmp(b->blob + b->off[id], s, n) == 0) return (int32_t)id;
        i = (i + 1) & mask;
    }
}

int ms_bpe_build_vocab(ms_bpe *b, ms_err *err) {
    size_t count = 0;
    for (uint32_t i = 0; i < b->n_ids; i++) count += b->len[i] != NONE32;
    size_t cap = 16;
    while (cap < count * 2 + 1) cap <<= 1;
    free(b->vslots);
    b->vslots = malloc(cap * sizeof *b->vslots);
    if (!b->vslots) return ms_fail(err, MS_ERR_NOMEM, "BPE vocabulary map: out of memory");
    memset(b->vslots, 0xFF, cap * sizeof *b->vslots);
    b->vcap = cap;
    for (uint32_t id = 0; id < b->n_ids; id++) {
        if (b->len[id] == NONE32) continue;
        const uint8_t *s = b->blob + b->off[id];
        size_t n = b->len[id], i = hash_bytes(s, n) & (cap - 1);
        int dup = 0;
        while (b->vslots[i] != NONE32) {
            uint32_t o = b->vslots[i];
            if (b->len[o] == n && memcmp(b->blob + b->off[o], s, n) == 0) {
                dup = 1; /* two ids with the same bytes: the lower id wins lookups */
                break;
            }
            i = (i + 1) & (cap - 1);
        }
        if (!dup) b->vslots[i] = id;
    }
    for (int c = 0; c < 256; c++) {
        uint8_t ch = (uint8_t)c;
        b->byte_id[c] = ms_bpe_lookup(b, &ch, 1);
    }
    return MS_OK;
}

int ms_bpe_reserve_merges(ms_bpe *b, size_t n, ms_err *err) {
    size_t cap = 16;
    while (cap < n * 2 + 1) cap <<= 1;
    if (cap <= b->mcap) return MS_OK;
    uint64_t *k = calloc(cap, sizeof *k);
    uint32_t *r = malloc(cap * sizeof *r), *m = malloc(cap * sizeof *m);
    if (!k || !r || !m) {
        free(k), free(r), free(m);
        return ms_fail(err, MS_ERR_NOMEM, "BPE merges: out of memory");
    }
    for (size_t i = 0; i < b->mcap; i++) {
        if (!b->mkeys[i]) continue;
        size_t j = hash64(b->mkeys[i]) & (cap - 1);
        while (k[j]) j = (j + 1) & (cap - 1);
        k[j] = b->mkeys[i], r[j] = b->mrank[i], m[j] = b->mnew[i];
    }
    free(b->mkeys), free(b->mrank), free(b->mnew);
    b->mkeys = k, b->mrank = r, b->mnew = m, b->mcap = cap;
    return MS_OK;
}

int ms_bpe_add_merge(ms_bpe *b, uint32_t a, uint32_t bb, uint32_t rank, uint32_t merged, ms_err *err) {
    if ((b->mcount + 1) * 2 > b->mcap) {
        int rc = ms_bpe_reserve_merges(b, b->mcount * 2 + 16, err);
        if (rc) return rc;
    }
    uint64_t key = (((uint64_t)a << 32) | bb) + 1;
    size_t j = hash64(key) & (b->mcap - 1);
    while (b->mkeys[j]) {
        if (b->mkeys[j] == key) return MS_OK; /* first definition (lowest rank) wins */
        j = (j + 1) & (b->mcap - 1);
    }
    b->mkeys[j] = key, b->mrank[j] = rank, b->mnew[j] = merged;
    b->mcount++;
    return MS_OK;
}

static inline int merge_get(const ms_bpe *b, int32_t a, int32_t c, uint32_t *rank, int32_t *merged) {
    if (!b->mcap) return 0;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)c) + 1;
    size_t j = hash64(key) & (b->mcap - 1);
    for (;;) {
        uint64_t k = b->mkeys[j];
        if (!k) return 0;
        if (k == key) {
            *rank = b->mrank[j];
            *merged = (int32_t)b->mnew[j];
            return 1;
        }
        j = (j + 1) & (b->mcap - 1);
    }
}

/* ---- word cache ---- */

static int cache_get(ms_bpe *b, uint64_t h, const uint8_t *s, size_t n, ms_tok_ids *out, int *hit) {
    *hit = 0;
    int rc = 0;
    pthread_mutex_lock(&b->cache_mu);
    if (b->cache) {
        size_t mask = b->cache_cap - 1, i = h & mask;
        for (;;) {
            ms_bpe_cache_ent *e = &b->cache[i];
            if (!e->key) break;
            if (e->h == h && e->klen == n && memcmp(e->key, s, n) == 0) {
                const uint8_t *ids = e->key + n;
                for (uint32_t k = 0; k < e->nids && !rc; k++) {
                    int32_t id;
                    memcpy(&id, ids + 4 * k, 4);
                    rc = ms_ids_push(out, id);
                }
                *hit = 1;
                break;
            }
            i = (i + 1) & mask;
        }
    }
    pthread_mutex_unlock(&b->cache_mu);
    return rc;
}

static void cache_clear_locked(ms_bpe *b) {
    for (size_t i = 0; i < b->cache_cap; i++) free(b->cache[i].key);
    memset(b->cache, 0, b->cache_cap * sizeof *b->cache);
    b->cache_count = 0;
}

static void cache_put(ms_bpe *b, uint64_t h, const uint8_t *s, size_t n, const int32_t *ids, size_t nids) {
    uint8_t *key = malloc(n + 4 * nids + 1);
    if (!key) return; /* the cache is an optimisation: skip on OOM */
    memcpy(key, s, n);
    memcpy(key + n, ids, 4 * nids);
    pthread_mutex_lock(&b->cache_mu);
    if (!b->cache) {
        b->cache = calloc(CACHE_CAP, sizeof *b->cache);
        if (!b->cache) {
            pthread_mutex_unlock(&b->cache_mu);
            free(key);
            return;
        }
        b->cache_cap = CACHE_CAP;
    }
    if ((b->cache_count + 1) * 2 > b->cache_cap) cache_clear_locked(b);
    size_t mask = b->cache_cap - 1, i = h & mask;
    for (;;) {
        ms_bpe_cache_ent *e = &b->cache[i];
        if (!e->key) {
            e->h = h, e->key = key, e->klen = (uint32_t)n, e->nids = (uint32_t)nids;
            b->cache_count++;
            key = NULL;
            break;
        }
        if (e->h == h && e->klen == n && memcmp(e->key, s, n) == 0) break; /* another thread won */
        i = (i + 1) & mask;
    }
    pthread_mutex_unlock(&b->cache_mu);
    free(key);
}

/* ---- the merge loop ---- */

typedef struct {
    uint32_t rank, pos;
    int32_t a, c, merged;
} hent;

static inline int hless(const hent *x, const hent *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void hpush(hent *h, size_t *n, hent e) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!hless(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static hent hpop(hent *h, size_t *n) {
    hent top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, s = i;
        const hent *best = &last;
        if (l < m && hless(&h[l], best)) s = l, best = &h[l];
        if (r < m && hless(&h[r], best)) s = r;
        if (s == i) break;
        h[i] = h[s];
        i = s;
    }
    if (m) h[i] = last;
    return top;
}

int ms_bpe_encode_word(ms_bpe *b, const uint8_t *s, size_t n, ms_tok_ids *out, ms_err *err) {
    if (n == 0) return MS_OK;
    if (b->ignore_merges || n == 1) {
        int32_t id = ms_bpe_lookup(b, s, n);
        if (id >= 0) return ms_ids_push(out, id) ? ms_fail(err, MS_ERR_NOMEM, "encode: out of memory") : MS_OK;
    }
    uint64_t h = 0;
    if (n <= CACHE_MAX_WORD) {
        int hit;
        h = hash_bytes(s, n);
        if (cache_get(b, h, s, n, out, &hit)) return ms_fail(err, MS_ERR_NOMEM, "encode: out of memory");
        if (hit) return MS_OK;
    }
    /* symbols: id, prev, next (index), alive when id >= 0 */
    int32_t stack_buf[3 * 128];
    hent hstack[128];
    int32_t *sym = n <= 128 ? stack_buf : malloc(3 * n * sizeof *sym);
    hent *heap = n <= 128 ? hstack : malloc(n * sizeof *heap);
    if (!sym || !heap) {
        if (sym != stack_buf) free(sym);
        if (heap != hstack) free(heap);
        return ms_fail(err, MS_ERR_NOMEM, "encode: out of memory for a %zu-byte word", n);
    }
    int32_t *id = sym, *prv = sym + n, *nxt = sym + 2 * n;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t bid = b->byte_id[s[i]];
        if (bid < 0) continue; /* tokenizers drops a char missing from the vocab when there is no unk */
        id[m] = bid;
        prv[m] = (int32_t)m - 1;
        nxt[m] = (int32_t)m + 1;
        m++;
    }
    if (m) nxt[m - 1] = -1;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < m; i++) {
        hent e;
        if (merge_get(b, id[i], id[i + 1], &e.rank, &e.merged)) {
            e.pos = (uint32_t)i, e.a = id[i], e.c = id[i + 1];
            hpush(heap, &hn, e);
        }
    }
    /* A heap entry is pushed only when a pair forms; each merge creates at most
     * two pairs and removes one symbol, so the heap never exceeds 3m entries...
     * but stale entries are popped before new ones exceed n: grow if needed. */
    size_t hcap = n <= 128 ? 128 : n;
    while (hn) {
        hent e = hpop(heap, &hn);
        int32_t p = (int32_t)e.pos;
        if (id[p] != e.a || nxt[p] < 0 || id[nxt[p]] != e.c) continue; /* stale */
        int32_t q = nxt[p];
        id[p] = e.merged;
        id[q] = -1;
        nxt[p] = nxt[q];
        if (nxt[q] >= 0) prv[nxt[q]] = p;
        if (hn + 2 > hcap) {
            size_t nc = hcap * 2;
            hent *nh = heap == hstack ? malloc(nc * sizeof *nh) : realloc(heap, nc * sizeof *nh);
            if (!nh) {
                if (sym != stack_buf) free(sym);
                if (heap != hstack) free(heap);
                return ms_fail(err, MS_ERR_NOMEM, "encode: out of memory");
            }
            if (heap == hstack) memcpy(nh, hstack, hn * sizeof *nh);
            heap = nh;
            hcap = nc;
        }
        hent f;
        if (prv[p] >= 0 && merge_get(b, id[prv[p]], id[p], &f.rank, &f.merged)) {
            f.pos = (uint32_t)prv[p], f.a = id[prv[p]], f.c = id[p];
            hpush(heap, &hn, f);
        }
        if (nxt[p] >= 0 && merge_get(b, id[p], id[nxt[p]], &f.rank, &f.merged)) {
            f.pos = (uint32_t)p, f.a = id[p], f.c = id[nxt[p]];
            hpush(heap, &hn, f);
        }
    }
    size_t start = out->n;
    int rc = MS_OK;
    for (int32_t i = m ? 0 : -1; i >= 0; i = nxt[i])
        if (ms_ids_push(out, id[i])) {
            rc = ms_fail(err, MS_ERR_NOMEM, "encode: out of memory");
            break;
        }
    if (!rc && n <= CACHE_MAX_WORD && out->n > start) cache_put(b, h, s, n, out->ids + start, out->n - start);
    if (sym != stack_buf) free(sym);
    if (heap != hstack) free(heap);
    return rc;
}

void ms_bpe_free(ms_bpe *b) {
    free(b->blob), free(b->off), free(b->len), free(b->vslots);
    free(b->mkeys), free(b->mrank), free(b->mnew);
    if (b->cache) {
        cache_clear_locked(b);
        free(b->cache);
    }
    pthread_mutex_destroy(&b->cache_mu);
    memset(b, 0, sizeof *b);
}
