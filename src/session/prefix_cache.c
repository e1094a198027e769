/* prefix_cache.c — snapshots keyed by token prefixes, LRU (session/prefix_cache.h). */
#include <stdlib.h>
#include <string.h>

#include "session/prefix_cache.h"

typedef struct {
    int32_t *ids;
    int n;
    ms_snapshot *snap;
    uint64_t bytes;
    uint64_t used; /* clock of the last save or restore */
} entry;

struct ms_prefix_cache {
    int max_entries, n;
    uint64_t max_bytes, bytes, clock;
    entry *e;
};

int ms_prefix_cache_new(int max_entries, uint64_t max_bytes, ms_prefix_cache **out, ms_err *err) {
    *out = NULL;
    if (max_entries < 1 || max_entries > (1 << 20) || max_bytes < 1)
        return ms_fail(err, MS_ERR_ARG, "prefix cache: %d entries / %llu bytes (need >= 1 of each)", max_entries,
                       (unsigned long long)max_bytes);
    ms_prefix_cache *pc = calloc(1, sizeof *pc);
    if (pc) pc->e = calloc((size_t)max_entries, sizeof *pc->e);
    if (!pc || !pc->e) {
        free(pc);
        return ms_fail(err, MS_ERR_NOMEM, "prefix cache: out of memory for %d entries", max_entries);
    }
    pc->max_entries = max_entries;
    pc->max_bytes = max_bytes;
    *out = pc;
    return MS_OK;
}

static void drop(ms_prefix_cache *pc, int i) {
    pc->bytes -= pc->e[i].bytes;
    free(pc->e[i].ids);
    ms_engine_snapshot_free(pc->e[i].snap);
    pc->e[i] = pc->e[--pc->n];
}

void ms_prefix_cache_free(ms_prefix_cache *pc) {
    if (!pc) return;
    while (pc->n) drop(pc, pc->n - 1);
    free(pc->e);
    free(pc);
}

int ms_prefix_cache_entries(const ms_prefix_cache *pc) { return pc->n; }
uint64_t ms_prefix_cache_bytes(const ms_prefix_cache *pc) { return pc->bytes; }

static int lru(const ms_prefix_cache *pc) {
    int k = 0;
    for (int i = 1; i < pc->n; i++)
        if (pc->e[i].used < pc->e[k].used) k = i;
    return k;
}

int ms_prefix_cache_save(ms_prefix_cache *pc, ms_engine *e, const int32_t *ids, int n, ms_err *err) {
    if (n < 1 || n != ms_engine_n_past(e) || !ids)
        return ms_fail(err, MS_ERR_ARG, "prefix cache: saving %d ids of an engine holding %d", n, ms_engine_n_past(e));
    for (int i = 0; i < pc->n; i++)
        if (pc->e[i].n == n && !memcmp(pc->e[i].ids, ids, sizeof *ids * (size_t)n)) {
            pc->e[i].used = ++pc->clock;
            return MS_OK;
        }
    ms_snapshot *s;
    int rc = ms_engine_snapshot(e, &s, err);
    if (rc) return rc;
    uint64_t b = ms_engine_snapshot_bytes(s) + sizeof *ids * (uint64_t)n;
    if (b > pc->max_bytes) {
        ms_engine_snapshot_free(s);
        return MS_OK;
    }
    int32_t *cp = malloc(sizeof *ids * (size_t)n);
    if (!cp) {
        ms_engine_snapshot_free(s);
        return ms_fail(err, MS_ERR_NOMEM, "prefix cache: out of memory for %d ids", n);
    }
    memcpy(cp, ids, sizeof *ids * (size_t)n);
    while (pc->n && (pc->n == pc->max_entries || pc->bytes + b > pc->max_bytes)) drop(pc, lru(pc));
    pc->e[pc->n++] = (entry){cp, n, s, b, ++pc->clock};
    pc->bytes += b;
    return MS_OK;
}

int ms_prefix_cache_restore(ms_prefix_cache *pc, ms_engine *e, const int32_t *ids, int n, int *restored, ms_err *err) {
    *restored = 0;
    int best = -1;
    for (int i = 0; i < pc->n; i++)
        if (pc->e[i].n <= n && (best < 0 || pc->e[i].n > pc->e[best].n) &&
            !memcmp(pc->e[i].ids, ids, sizeof *ids * (size_t)pc->e[i].n))
            best = i;
    if (best < 0) return MS_OK;
    int rc = ms_engine_restore(e, pc->e[best].snap, err);
    if (rc) return rc;
    pc->e[best].used = ++pc->clock;
    *restored = pc->e[best].n;
    return MS_OK;
}

int ms_prefix_cache_save_hook(void *user, ms_engine *e, const int32_t *ids, int n, ms_err *err) {
    return ms_prefix_cache_save(user, e, ids, n, err);
}

int ms_prefix_cache_restore_hook(void *user, ms_engine *e, const int32_t *ids, int n, int *restored, ms_err *err) {
    return ms_prefix_cache_restore(user, e, ids, n, restored, err);
}

int ms_prefix_cache_entry_hook(void *user, int i, const int32_t **ids, int *n) {
    ms_prefix_cache *pc = user;
    if (i < 0 || i >= pc->n) return 0;
    *ids = pc->e[i].ids;
    *n = pc->e[i].n;
    return 1;
}

int ms_prefix_cache_longest_hook(void *user, const int32_t *ids, int n) {
    ms_prefix_cache *pc = user;
    int best = 0;
    for (int i = 0; i < pc->n; i++)
        if (pc->e[i].n <= n && pc->e[i].n > best && !memcmp(pc->e[i].ids, ids, sizeof *ids * (size_t)pc->e[i].n))
            best = pc->e[i].n;
    return best;
}

ms_gen_snapshots ms_prefix_cache_snapshots(ms_prefix_cache *pc) {
    return (ms_gen_snapshots){.user = pc, .restore = ms_prefix_cache_restore_hook, .save = ms_prefix_cache_save_hook,
                              .entry = ms_prefix_cache_entry_hook, .longest = ms_prefix_cache_longest_hook};
}
