/* prefix_cache.c — snapshots keyed by token prefixes, LRU, in RAM and on disk
 * (session/prefix_cache.h, docs/state.md). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "session/prefix_cache.h"
#include "util/fs.h"
#include "util/hash.h"

typedef struct {
    ms_snapshot *s;
    int refs;
} snapref;

typedef struct {
    int32_t *ids;
    int n;
    snapref *ram;        /* in RAM, or NULL */
    uint64_t ram_bytes;
    int on_disk, pending;/* a file in the directory; a write queued or running */
    uint64_t disk_bytes;
    char name[40];       /* 32 hex digits of SHA-256(ids) + ".mss" */
    uint64_t used;       /* clock of the last save or restore */
    uint64_t seq;
} entry;

typedef struct {
    uint64_t seq;
    snapref *snap;
    int32_t *ids;
    int n;
    char name[40];
} job;

struct ms_prefix_cache {
    ms_prefix_cache_opts o;
    char *dir;
    uint8_t model_id[32];
    pthread_mutex_t mu;
    pthread_cond_t cv, done_cv;
    pthread_t writer;
    int have_writer, stopping, writing;
    entry *e;
    int n, cap;
    uint64_t clock, seq;
    job *q;
    int qh, qn;
    ms_prefix_cache_stats st;
};

static void logf_(ms_prefix_cache *pc, const char *fmt, ...) {
    if (!pc->o.log) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pc->o.log(pc->o.log_user, line);
}

static void unref(snapref *r) {
    if (r && --r->refs == 0) {
        ms_engine_snapshot_free(r->s);
        free(r);
    }
}

static void path_of(const ms_prefix_cache *pc, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", pc->dir, name);
}

/* ---- accounting (under mu) ---- */

static void recount(ms_prefix_cache *pc) {
    ms_prefix_cache_stats *s = &pc->st;
    s->ram_entries = s->disk_entries = 0;
    s->ram_bytes = s->disk_bytes = 0;
    for (int i = 0; i < pc->n; i++) {
        if (pc->e[i].ram) s->ram_entries++, s->ram_bytes += pc->e[i].ram_bytes;
        if (pc->e[i].on_disk) s->disk_entries++, s->disk_bytes += pc->e[i].disk_bytes;
    }
}

static void drop_ram(ms_prefix_cache *pc, entry *x) {
    unref(x->ram);
    x->ram = NULL;
    x->ram_bytes = 0;
}

/* Remove entries held nowhere any more (the caller's thread only: frees ids). */
static void sweep(ms_prefix_cache *pc) {
    for (int i = 0; i < pc->n;) {
        entry *x = &pc->e[i];
        if (!x->ram && !x->on_disk && !x->pending) {
            free(x->ids);
            pc->e[i] = pc->e[--pc->n];
        } else {
            i++;
        }
    }
}

static void evict_ram(ms_prefix_cache *pc, const entry *keep) {
    for (;;) {
        recount(pc);
        if (pc->st.ram_entries <= pc->o.max_entries && pc->st.ram_bytes <= pc->o.max_bytes) return;
        entry *v = NULL;
        for (int i = 0; i < pc->n; i++)
            if (pc->e[i].ram && &pc->e[i] != keep && (!v || pc->e[i].used < v->used)) v = &pc->e[i];
        if (!v) return;
        drop_ram(pc, v);
        pc->st.evicted_ram++;
    }
}

static void evict_disk(ms_prefix_cache *pc) {
    for (;;) {
        recount(pc);
        if (pc->st.disk_entries <= pc->o.disk_entries && pc->st.disk_bytes <= pc->o.disk_bytes) return;
        entry *v = NULL;
        for (int i = 0; i < pc->n; i++)
            if (pc->e[i].on_disk && (!v || pc->e[i].used < v->used)) v = &pc->e[i];
        if (!v) return;
        char p[4200];
        path_of(pc, v->name, p, sizeof p);
        unlink(p);
        v->on_disk = 0;
        v->disk_bytes = 0;
        pc->st.evicted_disk++;
    }
}

static entry *find_seq(ms_prefix_cache *pc, uint64_t seq) {
    for (int i = 0; i < pc->n; i++)
        if (pc->e[i].seq == seq) return &pc->e[i];
    return NULL;
}

/* ---- the writer thread ---- */

static void *writer_main(void *arg) {
    ms_prefix_cache *pc = arg;
    pthread_mutex_lock(&pc->mu);
    for (;;) {
        while (!pc->qn && !pc->stopping) pthread_cond_wait(&pc->cv, &pc->mu);
        if (!pc->qn) break; /* stopping, queue drained */
        job j = pc->q[pc->qh];
        pc->qh = (pc->qh + 1) % pc->o.queue;
        pc->qn--;
        pc->writing = 1;
        pthread_mutex_unlock(&pc->mu);
        char p[4200];
        path_of(pc, j.name, p, sizeof p);
        ms_err err = {0};
        int rc = ms_snapshot_save_file(j.snap->s, pc->model_id, 0, p, j.ids, j.n, &err);
        struct stat sb;
        uint64_t size = !rc && !stat(p, &sb) ? (uint64_t)sb.st_size : 0;
        pthread_mutex_lock(&pc->mu);
        entry *x = find_seq(pc, j.seq);
        if (x) x->pending = 0;
        if (rc) {
            pc->st.write_errors++;
            logf_(pc, "prefix cache: writing %s failed: %s", p, err.msg);
        } else if (x) {
            x->on_disk = 1;
            x->disk_bytes = size;
            pc->st.writes++;
            evict_disk(pc);
        } else {
            unlink(p); /* its entry went meanwhile */
        }
        unref(j.snap);
        free(j.ids);
        pc->writing = 0;
        pthread_cond_broadcast(&pc->done_cv);
    }
    pthread_mutex_unlock(&pc->mu);
    return NULL;
}

/* ---- the directory ---- */

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* The header of a state file of this model: its token ids (*ids malloc'd). 0 or a reason. */
static const char *read_header(ms_prefix_cache *pc, int fd, uint64_t size, int32_t **ids, int *n) {
    uint8_t h0[104];
    if (size < sizeof h0 || pread(fd, h0, sizeof h0, 0) != (ssize_t)sizeof h0) return "shorter than a state header";
    if (memcmp(h0, MS_STATE_MAGIC, 8)) return "not a state file (magic)";
    if (rd32(h0 + 8) != MS_STATE_VERSION) return "another state format version";
    uint64_t hb = rd64(h0 + 16), fb = rd64(h0 + 24), nt = rd64(h0 + 88), np = rd64(h0 + 64);
    if (fb != size) return "cut or extended (file size differs from its header)";
    if (nt != np || nt < 1 || nt > (1u << 28) || hb > size || hb < 104 + 4 * nt) return "malformed header";
    if (memcmp(h0 + 32, pc->model_id, 32)) return "saved by another model";
    uint8_t *h = malloc(hb);
    if (!h) return "out of memory";
    if (pread(fd, h, hb, 0) != (ssize_t)hb) {
        free(h);
        return "unreadable";
    }
    uint32_t want = rd32(h + 96);
    memset(h + 96, 0, 4);
    if (ms_crc32c(0, h, hb) != want) {
        free(h);
        return "header checksum mismatch";
    }
    int32_t *t = malloc(4 * nt);
    if (!t) {
        free(h);
        return "out of memory";
    }
    for (uint64_t i = 0; i < nt; i++) t[i] = (int32_t)rd32(h + 104 + 4 * i);
    free(h);
    *ids = t;
    *n = (int)nt;
    return NULL;
}

static void name_of(const int32_t *ids, int n, char out[40]) {
    uint8_t h[32];
    char hex[65];
    ms_sha256(ids, sizeof *ids * (size_t)n, h);
    ms_hex(h, 32, hex);
    snprintf(out, 40, "%.32s.mss", hex);
}

static int grow_entries(ms_prefix_cache *pc) {
    if (pc->n < pc->cap) return 0;
    int cap = pc->cap ? pc->cap * 2 : 16;
    entry *e = realloc(pc->e, sizeof *e * (size_t)cap);
    if (!e) return -1;
    pc->e = e;
    pc->cap = cap;
    return 0;
}

typedef struct {
    char name[256];
    int64_t mtime;
} scanned;

static int cmp_mtime(const void *a, const void *b) {
    const scanned *x = a, *y = b;
    return (x->mtime > y->mtime) - (x->mtime < y->mtime);
}

static int scan_dir(ms_prefix_cache *pc, ms_err *err) {
    DIR *d = opendir(pc->dir);
    if (!d) return ms_fail(err, MS_ERR_IO, "prefix cache: cannot read %s: %s", pc->dir, strerror(errno));
    scanned *list = NULL;
    int nl = 0, cl = 0;
    struct dirent *de;
    char p[4200];
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        size_t l = strlen(nm);
        if (strstr(nm, ".mss.tmp.")) { /* a write cut short by a crash */
            path_of(pc, nm, p, sizeof p);
            unlink(p);
            continue;
        }
        if (l < 5 || l >= sizeof list->name || strcmp(nm + l - 4, ".mss")) continue;
        path_of(pc, nm, p, sizeof p);
        struct stat sb;
        if (lstat(p, &sb) || !S_ISREG(sb.st_mode)) {
            logf_(pc, "prefix cache: %s is not a regular file: removed, not loaded", p);
            unlink(p);
            pc->st.removed++;
            continue;
        }
        if (nl == cl) {
            cl = cl ? cl * 2 : 64;
            scanned *nlst = realloc(list, sizeof *list * (size_t)cl);
            if (!nlst) break;
            list = nlst;
        }
        snprintf(list[nl].name, sizeof list[nl].name, "%s", nm);
        list[nl++].mtime = (int64_t)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
    }
    closedir(d);
    if (nl > 1) qsort(list, (size_t)nl, sizeof *list, cmp_mtime); /* least recently used first */
    for (int i = 0; i < nl; i++) {
        path_of(pc, list[i].name, p, sizeof p);
        int fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        struct stat sb;
        int32_t *ids = NULL;
        int n = 0;
        const char *why = fd < 0 ? "unreadable" : fstat(fd, &sb) ? "unreadable" : read_header(pc, fd, (uint64_t)sb.st_size, &ids, &n);
        if (fd >= 0) close(fd);
        if (why) {
            logf_(pc, "prefix cache: %s: %s: removed, not loaded", p, why);
            unlink(p);
            pc->st.removed++;
            continue;
        }
        if (grow_entries(pc)) {
            free(ids);
            break;
        }
        entry *x = &pc->e[pc->n++];
        memset(x, 0, sizeof *x);
        x->ids = ids;
        x->n = n;
        x->on_disk = 1;
        x->disk_bytes = (uint64_t)sb.st_size;
        snprintf(x->name, sizeof x->name, "%s", list[i].name);
        x->used = ++pc->clock;
        x->seq = ++pc->seq;
    }
    free(list);
    evict_disk(pc);
    return MS_OK;
}

/* ---- life cycle ---- */

int ms_prefix_cache_open(const ms_prefix_cache_opts *o, ms_prefix_cache **out, ms_err *err) {
    *out = NULL;
    if (!o || o->max_entries < 1 || o->max_entries > (1 << 20) || o->max_bytes < 1)
        return ms_fail(err, MS_ERR_ARG, "prefix cache: %d entries / %llu bytes (need >= 1 of each)", o ? o->max_entries : 0,
                       o ? (unsigned long long)o->max_bytes : 0ULL);
    if (o->dir && !o->model) return ms_fail(err, MS_ERR_ARG, "prefix cache: a directory needs the model (its identity)");
    ms_prefix_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return ms_fail(err, MS_ERR_NOMEM, "prefix cache: out of memory");
    pc->o = *o;
    if (pc->o.disk_entries < 1) pc->o.disk_entries = o->max_entries;
    if (!pc->o.disk_bytes) pc->o.disk_bytes = (uint64_t)16 << 30;
    if (pc->o.queue < 1) pc->o.queue = 8;
    pthread_mutex_init(&pc->mu, NULL);
    pthread_cond_init(&pc->cv, NULL);
    pthread_cond_init(&pc->done_cv, NULL);
    int rc = MS_OK;
    if (o->dir) {
        pc->o.dir = NULL;
        struct stat sb;
        if (!(pc->dir = strdup(o->dir)) || !(pc->q = calloc((size_t)pc->o.queue, sizeof *pc->q))) {
            rc = ms_fail(err, MS_ERR_NOMEM, "prefix cache: out of memory");
        } else if (mkdir(pc->dir, 0700) && errno != EEXIST) {
            rc = ms_fail(err, MS_ERR_IO, "prefix cache: cannot create %s: %s", pc->dir, strerror(errno));
        } else if (lstat(pc->dir, &sb) || !S_ISDIR(sb.st_mode)) {
            rc = ms_fail(err, MS_ERR_IO, "prefix cache: %s is not a directory", pc->dir);
        } else if (sb.st_uid != geteuid()) {
            rc = ms_fail(err, MS_ERR_IO, "prefix cache: %s belongs to another user", pc->dir);
        } else if ((sb.st_mode & 0777) != 0700 && chmod(pc->dir, 0700)) {
            rc = ms_fail(err, MS_ERR_IO, "prefix cache: cannot make %s private (0700): %s", pc->dir, strerror(errno));
        } else if (!(rc = ms_model_identity(o->model, pc->model_id, err)) && !(rc = scan_dir(pc, err))) {
            if (pthread_create(&pc->writer, NULL, writer_main, pc))
                rc = ms_fail(err, MS_ERR_NOMEM, "prefix cache: cannot start the writer thread");
            else
                pc->have_writer = 1;
        }
    }
    if (rc) {
        ms_prefix_cache_free(pc);
        return rc;
    }
    *out = pc;
    return MS_OK;
}

int ms_prefix_cache_new(int max_entries, uint64_t max_bytes, ms_prefix_cache **out, ms_err *err) {
    ms_prefix_cache_opts o = {.max_entries = max_entries, .max_bytes = max_bytes};
    return ms_prefix_cache_open(&o, out, err);
}

void ms_prefix_cache_flush(ms_prefix_cache *pc) {
    if (!pc) return;
    pthread_mutex_lock(&pc->mu);
    while (pc->qn || pc->writing) pthread_cond_wait(&pc->done_cv, &pc->mu);
    pthread_mutex_unlock(&pc->mu);
}

void ms_prefix_cache_free(ms_prefix_cache *pc) {
    if (!pc) return;
    if (pc->have_writer) {
        pthread_mutex_lock(&pc->mu);
        pc->stopping = 1;
        pthread_cond_broadcast(&pc->cv);
        pthread_mutex_unlock(&pc->mu);
        pthread_join(pc->writer, NULL);
    }
    for (int i = 0; i < pc->n; i++) {
        unref(pc->e[i].ram);
        free(pc->e[i].ids);
    }
    free(pc->e);
    free(pc->q);
    free(pc->dir);
    pthread_mutex_destroy(&pc->mu);
    pthread_cond_destroy(&pc->cv);
    pthread_cond_destroy(&pc->done_cv);
    free(pc);
}

int ms_prefix_cache_entries(const ms_prefix_cache *pc) {
    ms_prefix_cache *m = (ms_prefix_cache *)pc;
    pthread_mutex_lock(&m->mu);
    int n = m->n;
    pthread_mutex_unlock(&m->mu);
    return n;
}

uint64_t ms_prefix_cache_bytes(const ms_prefix_cache *pc) {
    ms_prefix_cache *m = (ms_prefix_cache *)pc;
    pthread_mutex_lock(&m->mu);
    recount(m);
    uint64_t b = m->st.ram_bytes;
    pthread_mutex_unlock(&m->mu);
    return b;
}

void ms_prefix_cache_get_stats(ms_prefix_cache *pc, ms_prefix_cache_stats *out) {
    pthread_mutex_lock(&pc->mu);
    recount(pc);
    pc->st.queued = pc->qn;
    *out = pc->st;
    pthread_mutex_unlock(&pc->mu);
}

/* ---- save / restore ---- */

static int enqueue(ms_prefix_cache *pc, entry *x, ms_err *err) {
    int32_t *cp = malloc(sizeof *cp * (size_t)x->n);
    if (!cp) return ms_fail(err, MS_ERR_NOMEM, "prefix cache: out of memory for %d ids", x->n);
    memcpy(cp, x->ids, sizeof *cp * (size_t)x->n);
    if (pc->qn == pc->o.queue) { /* full: the oldest write gives way (saving never waits) */
        job *old = &pc->q[pc->qh];
        entry *ox = find_seq(pc, old->seq);
        if (ox) ox->pending = 0;
        unref(old->snap);
        free(old->ids);
        pc->qh = (pc->qh + 1) % pc->o.queue;
        pc->qn--;
        pc->st.write_drops++;
    }
    job *j = &pc->q[(pc->qh + pc->qn) % pc->o.queue];
    *j = (job){.seq = x->seq, .snap = x->ram, .ids = cp, .n = x->n};
    memcpy(j->name, x->name, sizeof j->name);
    x->ram->refs++;
    x->pending = 1;
    pc->qn++;
    pthread_cond_signal(&pc->cv);
    return MS_OK;
}

int ms_prefix_cache_save(ms_prefix_cache *pc, ms_engine *e, const int32_t *ids, int n, ms_err *err) {
    if (n < 1 || n != ms_engine_n_past(e) || !ids)
        return ms_fail(err, MS_ERR_ARG, "prefix cache: saving %d ids of an engine holding %d", n, ms_engine_n_past(e));
    pthread_mutex_lock(&pc->mu);
    sweep(pc);
    for (int i = 0; i < pc->n; i++)
        if (pc->e[i].n == n && !memcmp(pc->e[i].ids, ids, sizeof *ids * (size_t)n)) {
            pc->e[i].used = ++pc->clock;
            pthread_mutex_unlock(&pc->mu);
            return MS_OK;
        }
    pthread_mutex_unlock(&pc->mu);
    ms_snapshot *s; /* outside the lock: the writer thread keeps going */
    int rc = ms_engine_snapshot(e, &s, err);
    if (rc) return rc;
    uint64_t b = ms_engine_snapshot_bytes(s) + sizeof *ids * (uint64_t)n;
    if (b > pc->o.max_bytes && !pc->dir) {
        ms_engine_snapshot_free(s);
        return MS_OK;
    }
    snapref *r = malloc(sizeof *r);
    int32_t *cp = malloc(sizeof *ids * (size_t)n);
    pthread_mutex_lock(&pc->mu);
    if (!r || !cp || grow_entries(pc)) {
        pthread_mutex_unlock(&pc->mu);
        free(r), free(cp);
        ms_engine_snapshot_free(s);
        return ms_fail(err, MS_ERR_NOMEM, "prefix cache: out of memory for %d ids", n);
    }
    memcpy(cp, ids, sizeof *ids * (size_t)n);
    *r = (snapref){s, 1};
    entry *x = &pc->e[pc->n++];
    memset(x, 0, sizeof *x);
    x->ids = cp;
    x->n = n;
    x->ram = r;
    x->ram_bytes = b;
    x->used = ++pc->clock;
    x->seq = ++pc->seq;
    pc->st.saves++;
    name_of(ids, n, x->name);
    if (pc->dir) rc = enqueue(pc, x, err);
    if (b > pc->o.max_bytes) drop_ram(pc, x); /* only the file keeps it */
    evict_ram(pc, x);
    sweep(pc);
    pthread_mutex_unlock(&pc->mu);
    return rc;
}

/* Load entry x's file into e after checking it in full; MS_OK, or why it cannot be used. */
static int load_file(ms_prefix_cache *pc, ms_engine *e, const entry *x, ms_err *err) {
    char p[4200];
    path_of(pc, x->name, p, sizeof p);
    ms_mapping mp;
    int rc = ms_map_file(p, &mp, err);
    if (rc) return rc;
    ms_state_info info;
    if (!(rc = ms_state_parse(mp.data, mp.size, p, &info, err))) { /* every checksum */
        if (info.n_tokens != x->n || memcmp(info.tokens, x->ids, sizeof *x->ids * (size_t)x->n))
            rc = ms_fail(err, MS_ERR_MISMATCH, "%s: its token ids are not the ones it was indexed by", p);
        ms_state_info_free(&info);
    }
    /* identity, context, layout: e is unchanged on error */
    if (!rc) rc = ms_engine_state_load_buffer(e, mp.data, mp.size, p, NULL, NULL, err);
    ms_unmap_file(&mp);
    if (!rc) { /* recently used, across restarts too */
        int fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) {
            futimens(fd, NULL);
            close(fd);
        }
    }
    return rc;
}

int ms_prefix_cache_restore(ms_prefix_cache *pc, ms_engine *e, const int32_t *ids, int n, int *restored, ms_err *err) {
    *restored = 0;
    pthread_mutex_lock(&pc->mu);
    sweep(pc);
    for (;;) {
        int best = -1;
        for (int i = 0; i < pc->n; i++) {
            const entry *x = &pc->e[i];
            if ((x->ram || x->on_disk) && x->n <= n && (best < 0 || x->n > pc->e[best].n) &&
                !memcmp(x->ids, ids, sizeof *ids * (size_t)x->n))
                best = i;
        }
        if (best < 0) {
            pc->st.misses++;
            pthread_mutex_unlock(&pc->mu);
            return MS_OK;
        }
        entry *x = &pc->e[best];
        if (x->ram) {
            int rc = ms_engine_restore(e, x->ram->s, err);
            if (rc) {
                pthread_mutex_unlock(&pc->mu);
                return rc;
            }
            x->used = ++pc->clock;
            pc->st.hits_ram++;
            pc->st.restored_tokens += (uint64_t)x->n;
            *restored = x->n;
            pthread_mutex_unlock(&pc->mu);
            return MS_OK;
        }
        /* from disk: the file is only read (the writer never rewrites a written file) */
        ms_err lerr = {0};
        int rc = load_file(pc, e, x, &lerr);
        if (rc == MS_ERR_LIMIT || rc == MS_ERR_NOMEM) { /* fine on disk, not for this engine now */
            pthread_mutex_unlock(&pc->mu);
            return MS_OK;
        }
        if (rc) {
            char p[4200];
            path_of(pc, x->name, p, sizeof p);
            logf_(pc, "prefix cache: %s: %s: removed, not loaded", p, lerr.msg);
            unlink(p);
            x->on_disk = 0;
            pc->st.removed++;
            continue; /* the next longest */
        }
        x->used = ++pc->clock;
        pc->st.hits_disk++;
        pc->st.restored_tokens += (uint64_t)x->n;
        *restored = x->n;
        /* back to RAM */
        ms_snapshot *s;
        ms_err serr = {0};
        snapref *r = malloc(sizeof *r);
        if (r && !ms_engine_snapshot(e, &s, &serr)) {
            uint64_t b = ms_engine_snapshot_bytes(s) + sizeof *ids * (uint64_t)x->n;
            *r = (snapref){s, 1};
            x->ram = r;
            x->ram_bytes = b;
            if (b > pc->o.max_bytes) drop_ram(pc, x);
            evict_ram(pc, x);
        } else {
            free(r);
        }
        pthread_mutex_unlock(&pc->mu);
        return MS_OK;
    }
}

int ms_prefix_cache_save_hook(void *user, ms_engine *e, const int32_t *ids, int n, ms_err *err) {
    return ms_prefix_cache_save(user, e, ids, n, err);
}

int ms_prefix_cache_restore_hook(void *user, ms_engine *e, const int32_t *ids, int n, int *restored, ms_err *err) {
    return ms_prefix_cache_restore(user, e, ids, n, restored, err);
}

int ms_prefix_cache_entry_hook(void *user, int i, const int32_t **ids, int *n) {
    ms_prefix_cache *pc = user;
    pthread_mutex_lock(&pc->mu);
    int ok = i >= 0 && i < pc->n;
    if (ok) {
        *ids = pc->e[i].ids;
        *n = pc->e[i].n;
    }
    pthread_mutex_unlock(&pc->mu);
    return ok;
}

int ms_prefix_cache_longest_hook(void *user, const int32_t *ids, int n) {
    ms_prefix_cache *pc = user;
    int best = 0;
    pthread_mutex_lock(&pc->mu);
    for (int i = 0; i < pc->n; i++) {
        const entry *x = &pc->e[i];
        if ((x->ram || x->on_disk) && x->n <= n && x->n > best && !memcmp(x->ids, ids, sizeof *ids * (size_t)x->n))
            best = x->n;
    }
    pthread_mutex_unlock(&pc->mu);
    return best;
}

int ms_prefix_cache_checkpoint_every(const ms_prefix_cache *pc, const ms_model *m, const ms_engine_opts *eo, int chunk) {
    int ctx = eo->max_ctx > 0 ? eo->max_ctx : 4096;
    if (chunk < 1) chunk = 256;
    uint64_t state = 0, ws = 0, per = ms_engine_state_bytes_per_token(m);
    ms_engine_plan_bytes(m, eo, 1, &state, &ws);
    uint64_t fixed = state > per * (uint64_t)ctx ? state - per * (uint64_t)ctx : 0;
    for (int k = chunk; k < ctx; k += chunk) {
        uint64_t c = (uint64_t)(ctx - 1) / (uint64_t)k;
        /* checkpoint j holds the state at j*k tokens: fixed + per * j*k */
        double bytes = (double)c * (double)fixed + (double)per * (double)k * (double)(c * (c + 1) / 2);
        if (bytes * 4 <= (double)pc->o.max_bytes && c * 4 <= (uint64_t)pc->o.max_entries) return k;
    }
    return ctx;
}

ms_gen_snapshots ms_prefix_cache_snapshots(ms_prefix_cache *pc) {
    return (ms_gen_snapshots){.user = pc, .restore = ms_prefix_cache_restore_hook, .save = ms_prefix_cache_save_hook,
                              .entry = ms_prefix_cache_entry_hook, .longest = ms_prefix_cache_longest_hook};
}
