/* strmap.h — open-addressing hash map from string keys to int values.
 * Keys are borrowed (must outlive the map). Built once, then read-only:
 * lookups are lock-free and safe from many threads. */
#ifndef MS_STRMAP_H
#define MS_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct ms_strmap {
    const char **keys;
    int *vals;
    size_t cap; /* power of two */
    size_t count;
} ms_strmap;

/* 0 on success, -1 on allocation failure. */
int ms_strmap_init(ms_strmap *m, size_t expected);
/* Insert; returns 1 if inserted, 0 if the key was already present (value unchanged), -1 on OOM. */
int ms_strmap_put(ms_strmap *m, const char *key, int val);
/* Value for key, or -1 when absent. */
int ms_strmap_get(const ms_strmap *m, const char *key);
void ms_strmap_free(ms_strmap *m);
uint64_t ms_hash_str(const char *s);

#endif
