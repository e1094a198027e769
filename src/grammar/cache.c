/* cache.c — compiled grammars kept by key (ms_grammar_cache in grammar.h): a server sees the
 * same schema or tool set again and again, and a cached grammar keeps its mask caches warm. */
#include <stdlib.h>
#include <string.h>

#include "grammar/gram_int.h"

typedef struct gentry {
    char *key;
    size_t klen;
    ms_grammar *g;
    uint64_t used; /* last use (a counter) */
} gentry;

struct ms_grammar_cache {
    pthread_mutex_t mu;
    gentry *e;
    int n, max;
    size_t max_bytes;
    uint64_t tick;
};

ms_grammar *ms_grammar_ref(ms_grammar *g) {
    if (g) __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    return g;
}

/* bytes of g's mask caches (all vocabularies) */
static size_t g_bytes(ms_grammar *g) {
    size_t b = (size_t)g->n_states * (sizeof *g->trans * (size_t)g->n_cls + 16);
    pthread_mutex_lock(&g->mu);
    for (gbind *x = g->binds; x; x = x->next) b += x->bytes;
    pthread_mutex_unlock(&g->mu);
    return b;
}

int ms_grammar_cache_new(int max_entries, size_t max_bytes, ms_grammar_cache **out, ms_err *err) {
    *out = NULL;
    if (max_entries < 1) return ms_fail(err, MS_ERR_ARG, "grammar cache: max_entries %d < 1", max_entries);
    ms_grammar_cache *c = calloc(1, sizeof *c);
    if (c) c->e = calloc((size_t)max_entries, sizeof *c->e);
    if (!c || !c->e) {
        free(c);
        return ms_fail(err, MS_ERR_NOMEM, "grammar cache: out of memory");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->max = max_entries;
    c->max_bytes = max_bytes;
    *out = c;
    return MS_OK;
}

void ms_grammar_cache_free(ms_grammar_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].key);
        ms_grammar_free(c->e[i].g);
    }
    pthread_mutex_destroy(&c->mu);
    free(c->e);
    free(c);
}

ms_grammar *ms_grammar_cache_get(ms_grammar_cache *c, const char *key, size_t len) {
    if (!c) return NULL;
    ms_grammar *g = NULL;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n && !g; i++)
        if (c->e[i].klen == len && !memcmp(c->e[i].key, key, len)) {
            g = ms_grammar_ref(c->e[i].g);
            c->e[i].used = ++c->tick;
        }
    pthread_mutex_unlock(&c->mu);
    return g;
}

static void drop(ms_grammar_cache *c, int i) {
    free(c->e[i].key);
    ms_grammar_free(c->e[i].g);
    c->e[i] = c->e[--c->n];
}

void ms_grammar_cache_put(ms_grammar_cache *c, const char *key, size_t len, ms_grammar *g) {
    if (!c || !g) return;
    char *k = malloc(len + 1);
    if (!k) return;
    memcpy(k, key, len);
    k[len] = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (c->e[i].klen == len && !memcmp(c->e[i].key, key, len)) { /* raced: keep the first */
            pthread_mutex_unlock(&c->mu);
            free(k);
            return;
        }
    /* make room: the least recently used go first, by count and by bytes */
    for (;;) {
        size_t total = 0;
        int lru = -1;
        for (int i = 0; i < c->n; i++) {
            total += g_bytes(c->e[i].g);
            if (lru < 0 || c->e[i].used < c->e[lru].used) lru = i;
        }
        if (lru < 0 || (c->n < c->max && (!c->max_bytes || total + g_bytes(g) <= c->max_bytes))) break;
        drop(c, lru);
    }
    c->e[c->n++] = (gentry){k, len, ms_grammar_ref(g), ++c->tick};
    pthread_mutex_unlock(&c->mu);
}

int ms_grammar_cache_size(ms_grammar_cache *c) {
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    int n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}
