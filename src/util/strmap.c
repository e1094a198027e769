#include "util/strmap.h"

#include <stdlib.h>
#include <string.h>

uint64_t ms_hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

int ms_strmap_init(ms_strmap *m, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2 + 1) cap <<= 1;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = calloc(cap, sizeof *m->vals);
    m->cap = cap;
    m->count = 0;
    if (!m->keys || !m->vals) {
        ms_strmap_free(m);
        return -1;
    }
    return 0;
}

static int grow(ms_strmap *m) {
    ms_strmap n;
    if (ms_strmap_init(&n, m->cap) != 0) return -1; /* doubles capacity */
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i]) ms_strmap_put(&n, m->keys[i], m->vals[i]);
    ms_strmap_free(m);
    *m = n;
    return 0;
}

int ms_strmap_put(ms_strmap *m, const char *key, int val) {
    if ((m->count + 1) * 2 > m->cap && grow(m) != 0) return -1;
    size_t i = ms_hash_str(key) & (m->cap - 1);
    while (m->keys[i]) {
        if (strcmp(m->keys[i], key) == 0) return 0;
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = key;
    m->vals[i] = val;
    m->count++;
    return 1;
}

int ms_strmap_get(const ms_strmap *m, const char *key) {
    if (!m->cap) return -1;
    size_t i = ms_hash_str(key) & (m->cap - 1);
    while (m->keys[i]) {
        if (strcmp(m->keys[i], key) == 0) return m->vals[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

void ms_strmap_free(ms_strmap *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}
