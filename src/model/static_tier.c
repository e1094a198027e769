/* static_tier.c — the static tier served from anonymous huge-page memory
 * instead of the checkpoint's page-cache mapping (see model.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/model.h"

#define PAGE 4096ull
#define HUGE (2ull << 20)
#define CHUNK (64ull << 20) /* a multiple of HUGE */

typedef struct {
    int file;
    uint64_t a, b; /* file offsets, page aligned, [a, b) */
} srange;

static int cmp_srange(const void *x, const void *y) {
    const srange *p = x, *q = y;
    if (p->file != q->file) return p->file < q->file ? -1 : 1;
    return p->a < q->a ? -1 : p->a > q->a;
}

/* The static tier's page ranges, sorted and merged; *n of them (malloc'd, NULL when none or out of memory). */
static srange *static_ranges(const ms_model *m, int *n_out) {
    const ms_checkpoint *ck = &m->ck;
    *n_out = 0;
    if (!m->tensor_bound || ck->n_tensors <= 0) return NULL;
    unsigned char *expert = calloc((size_t)ck->n_tensors, 1);
    srange *r = malloc((size_t)ck->n_tensors * sizeof *r);
    if (!expert || !r) {
        free(expert);
        free(r);
        return NULL;
    }
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const ms_layer *L = &m->layers[l];
        for (int64_t i = 0; L->expert_tensors && i < (int64_t)m->cfg.n_experts * MS_EXPERT_TENSORS; i++)
            if (L->expert_tensors[i]) expert[L->expert_tensors[i] - ck->tensors] = 1;
    }
    int n = 0;
    for (int i = 0; i < ck->n_tensors; i++) {
        const ms_tensor *t = &ck->tensors[i];
        const ms_mapping *mp = &ck->files[t->file].map;
        if (m->tensor_bound[i] != 1 || expert[i] || !t->nbytes || !mp->data) continue; /* 2: requantized */
        uint64_t a = t->offset & ~(PAGE - 1), b = (t->offset + t->nbytes + PAGE - 1) & ~(PAGE - 1);
        if (b > mp->size) b = mp->size;
        r[n++] = (srange){t->file, a, b};
    }
    free(expert);
    qsort(r, (size_t)n, sizeof *r, cmp_srange);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k > 0 && r[k - 1].file == r[i].file && r[i].a <= r[k - 1].b) {
            if (r[i].b > r[k - 1].b) r[k - 1].b = r[i].b;
        } else {
            r[k++] = r[i];
        }
    }
    *n_out = k;
    return r;
}

int ms_static_load_parse(const char *s, ms_static_load *out, ms_err *err) {
    if (s && !strcmp(s, "mmap")) *out = MS_STATIC_MMAP;
    else if (s && !strcmp(s, "read")) *out = MS_STATIC_READ;
    else return ms_fail(err, MS_ERR_ARG, "static load mode \"%s\": expected mmap or read", s ? s : "(null)");
    return MS_OK;
}

uint64_t ms_model_static_read_bytes(const ms_model *m) {
    int n;
    srange *r = static_ranges(m, &n);
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) sum += r[i].b - r[i].a;
    free(r);
    return sum;
}

/* MemAvailable of /proc/meminfo in bytes; 0 when unknown. */
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* Replace [addr, addr + len) of the mapping by an anonymous copy. */
static int move_chunk(uint8_t *addr, uint64_t len, const char *path, uint64_t off, ms_err *err) {
    uint8_t *raw = mmap(NULL, len + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return ms_fail(err, MS_ERR_NOMEM, "%s: static tier: cannot allocate %llu bytes for offset %llu: %s", path,
                       (unsigned long long)len, (unsigned long long)off, strerror(errno));
    /* dst congruent to addr modulo 2 MiB: huge pages of dst land on huge-page boundaries of addr */
    uint64_t shift = ((uint64_t)(uintptr_t)addr - (uint64_t)(uintptr_t)raw) & (HUGE - 1);
    uint8_t *dst = raw + shift;
    if (shift) munmap(raw, shift);
    if (HUGE - shift) munmap(dst + len, HUGE - shift);
    madvise(dst, len, MADV_HUGEPAGE); /* advice: without THP support the copy is still correct */
    memcpy(dst, addr, len);
    mprotect(dst, len, PROT_READ);
    void *got = mremap(dst, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, addr);
    if (got == MAP_FAILED) {
        int e = errno;
        munmap(dst, len);
        return ms_fail(err, MS_ERR_IO, "%s: static tier: cannot move %llu bytes at offset %llu into place: %s", path,
                       (unsigned long long)len, (unsigned long long)off, strerror(e));
    }
    return MS_OK;
}

int ms_model_static_read(ms_model *m, ms_err *err) { return ms_model_static_read_progress(m, NULL, err); }

int ms_model_static_read_progress(ms_model *m, const ms_progress *progress, ms_err *err) {
    if (m->static_copied) return MS_OK;
    int n;
    srange *r = static_ranges(m, &n);
    if (!r && n == 0 && m->ck.n_tensors > 0 && m->tensor_bound) {
        /* either no static tensor is mapped, or the range table did not fit */
        uint64_t probe = 0;
        for (int i = 0; i < m->ck.n_tensors; i++) probe += m->tensor_bound[i];
        if (probe) return ms_fail(err, MS_ERR_NOMEM, "static tier: out of memory for the range table");
    }
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += r[i].b - r[i].a;
    uint64_t avail = mem_available();
    if (avail && total > avail) {
        free(r);
        return ms_fail(err, MS_ERR_NOMEM,
                       "static tier: reading %.1f MiB into memory does not fit: MemAvailable is %.1f MiB (use the "
                       "mmap static load)",
                       total / 1048576.0, avail / 1048576.0);
    }
    int rc = MS_OK;
    for (int i = 0; i < n && !rc; i++) {
        const ms_st_file *f = &m->ck.files[r[i].file];
        uint8_t *base = (uint8_t *)f->map.data;
        int fd = open(f->path, O_RDONLY | O_CLOEXEC);
        for (uint64_t a = r[i].a; a < r[i].b && !rc;) {
            /* chunks end on 2 MiB boundaries of the address (or at the range's end) */
            uint64_t end = (((uint64_t)(uintptr_t)(base + a) + CHUNK) & ~(HUGE - 1)) - (uint64_t)(uintptr_t)base;
            if (end > r[i].b) end = r[i].b;
            rc = move_chunk(base + a, end - a, f->path, a, err);
            if (!rc) {
                m->static_copied += end - a;
                ms_progress_report(progress, "static tier", MS_PROGRESS_BYTES, m->static_copied, total);
                if (fd >= 0) posix_fadvise(fd, (off_t)a, (off_t)(end - a), POSIX_FADV_DONTNEED);
            }
            a = end;
        }
        if (fd >= 0) close(fd);
    }
    free(r);
    return rc;
}
