/* static_store.c — the requantized static tier packed offline (`moonshine pack --static q8|fp8`)
 * and loaded without requantizing, bound to its source checkpoint (model.h). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/expert_store.h"
#include "model/model.h"
#include "model/requant_int.h"
#include "util/fs.h"
#include "util/hash.h"

/* The file (all integers little-endian, as this machine writes them):
 *   header  (struct sst_head)
 *   sources (n_src x struct sst_src): the checkpoint's files, in order
 *   matrices (n_mat x struct sst_mat): in ms_rq_collect order of their first view
 *   padding to ALIGN, then each matrix at its offset (ALIGN-aligned): rows x cols values, then
 *   at (rows x cols + 15) & ~15 the BF16 scales, rows x ceil(cols / 32), as ms_model_requant_static
 *   lays them out in memory.
 * head_crc is the CRC32C of every byte before the first matrix with head_crc itself zero. */
#define SST_MAGIC "MSSTATIC"
#define SST_VERSION 1u
#define ALIGN 4096ull
#define MAX_SRC 65536
#define MAX_MAT (1 << 22)

typedef struct {
    char magic[8];
    uint32_t version, dtype; /* ms_static_dtype */
    uint32_t n_src, n_mat;
    uint32_t n_views, uses; /* ms_rq_collect's count; requantized views (ms_model.requant_uses) */
    uint64_t data_start, file_size;
    double rel_max;
    uint32_t head_crc, pad;
} sst_head;

typedef struct {
    char name[256];
    uint64_t size;
    char header_sha256[65], data_sample_sha256[65];
    char pad[6];
} sst_src;

typedef struct {
    uint32_t view;     /* index in ms_rq_collect's order */
    int32_t layer;
    char what[48];
    int64_t rows, cols;
    uint32_t crc; /* CRC32C of the matrix's bytes */
    uint32_t pad;
    uint64_t offset, bytes;
} sst_mat;

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int join(char *out, size_t n, const char *dir, ms_err *err) {
    return ms_path_join(out, n, dir, MS_STATIC_STORE_FILE, err);
}

/* bytes of matrix [R, C] as laid out (values, 16-aligned scales) */
static uint64_t mat_bytes(int64_t R, int64_t C) {
    const uint64_t nb = (uint64_t)((C + MS_Q8_BLOCK - 1) / MS_Q8_BLOCK);
    return (((uint64_t)R * (uint64_t)C + 15) & ~15ull) + (uint64_t)R * nb * 2;
}

static int sources(const ms_model *m, sst_src *s, ms_err *err) {
    for (int i = 0; i < m->ck.n_files; i++) {
        memset(&s[i], 0, sizeof s[i]);
        snprintf(s[i].name, sizeof s[i].name, "%s", base_name(m->ck.files[i].path));
        s[i].size = m->ck.files[i].map.size;
        int rc = ms_checkpoint_header_sha256(&m->ck, i, s[i].header_sha256, err);
        if (!rc) rc = ms_checkpoint_data_sample_sha256(&m->ck, i, s[i].data_sample_sha256, err);
        if (rc) return rc;
    }
    return MS_OK;
}

int ms_static_store_write(ms_model *m, const char *dir, ms_err *err) {
    if (m->static_dtype == MS_STATIC_STORED)
        return ms_fail(err, MS_ERR_ARG, "static store: the static tier is not requantized (q8 or fp8 first)");
    if (m->static_store_map)
        return ms_fail(err, MS_ERR_ARG, "static store: the static tier was itself loaded from a store");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return ms_fail(err, MS_ERR_IO, "%s: cannot create: %s", dir, strerror(errno));
    const int nv = ms_rq_collect(m, NULL), nf = m->ck.n_files;
    ms_rq_ref *r = malloc((size_t)nv * sizeof *r);
    sst_src *src = calloc((size_t)(nf ? nf : 1), sizeof *src);
    sst_mat *mat = calloc((size_t)(nv ? nv : 1), sizeof *mat);
    uint8_t *head = NULL;
    int rc = MS_OK, nm = 0;
    if (!r || !src || !mat) {
        rc = ms_fail(err, MS_ERR_NOMEM, "static store: out of memory");
        goto out;
    }
    ms_rq_collect(m, r);
    if ((rc = sources(m, src, err))) goto out;
    /* the requantized views; a view whose data an earlier one has is the same matrix (tied head) */
    for (int i = 0; i < nv; i++) {
        const ms_qmat *w = r[i].w;
        if (!w->data || w->brow != 1 || w->bcol != MS_Q8_BLOCK || w->scale_dtype != MS_DT_BF16 ||
            (w->dtype != MS_DT_Q8 && w->dtype != MS_DT_F8_E4M3))
            continue;
        int dup = 0;
        for (int k = 0; k < nm && !dup; k++) dup = r[mat[k].view].w->data == w->data;
        if (dup) continue;
        /* only the copies ms_model_requant_static made (a checkpoint's own FP8 1x32 blocks are stored) */
        int own = 0;
        for (int k = 0; k < m->n_quant_allocs && !own; k++) own = m->quant_allocs[k] == w->data;
        if (!own) continue;
        if ((const uint8_t *)w->scale != (const uint8_t *)w->data + (((uint64_t)w->rows * w->cols + 15) & ~15ull)) {
            rc = ms_fail(err, MS_ERR_ARG, "static store: %s: not laid out as requantized", r[i].what);
            goto out;
        }
        sst_mat *x = &mat[nm++];
        x->view = (uint32_t)i, x->layer = r[i].layer, x->rows = w->rows, x->cols = w->cols;
        snprintf(x->what, sizeof x->what, "%s", r[i].what);
        x->bytes = mat_bytes(w->rows, w->cols);
        x->crc = ms_crc32c(0, w->data, x->bytes);
    }
    uint64_t hsize = sizeof(sst_head) + (uint64_t)nf * sizeof(sst_src) + (uint64_t)nm * sizeof(sst_mat);
    uint64_t at = (hsize + ALIGN - 1) & ~(ALIGN - 1);
    for (int k = 0; k < nm; k++) {
        mat[k].offset = at;
        at = (at + mat[k].bytes + ALIGN - 1) & ~(ALIGN - 1);
    }
    head = calloc(1, (size_t)((hsize + ALIGN - 1) & ~(ALIGN - 1)));
    if (!head) {
        rc = ms_fail(err, MS_ERR_NOMEM, "static store: out of memory");
        goto out;
    }
    sst_head h = {.version = SST_VERSION, .dtype = (uint32_t)m->static_dtype, .n_src = (uint32_t)nf,
                  .n_mat = (uint32_t)nm, .n_views = (uint32_t)nv, .uses = (uint32_t)m->requant_uses,
                  .data_start = (hsize + ALIGN - 1) & ~(ALIGN - 1), .file_size = at, .rel_max = m->requant_rel_rms};
    memcpy(h.magic, SST_MAGIC, 8);
    memcpy(head, &h, sizeof h);
    memcpy(head + sizeof h, src, (size_t)nf * sizeof *src);
    memcpy(head + sizeof h + (size_t)nf * sizeof *src, mat, (size_t)nm * sizeof *mat);
    h.head_crc = ms_crc32c(0, head, (size_t)h.data_start);
    memcpy(head, &h, sizeof h);
    char path[4096];
    if ((rc = join(path, sizeof path, dir, err))) goto out;
    ms_atomic_file af;
    if ((rc = ms_atomic_begin(&af, path, err))) goto out;
    rc = ms_atomic_write(&af, head, h.data_start, err);
    static const uint8_t zeros[4096];
    for (int k = 0; k < nm && !rc; k++) {
        rc = ms_atomic_write(&af, r[mat[k].view].w->data, mat[k].bytes, err);
        uint64_t end = mat[k].offset + mat[k].bytes, pad = ((end + ALIGN - 1) & ~(ALIGN - 1)) - end;
        if (!rc && pad) rc = ms_atomic_write(&af, zeros, pad, err);
    }
    if (rc) ms_atomic_abort(&af);
    else rc = ms_atomic_commit(&af, err);
out:
    free(r), free(src), free(mat), free(head);
    return rc;
}

int ms_static_store_open(ms_model *m, const char *dir, ms_static_dtype want, ms_err *err) {
    if (m->static_dtype != MS_STATIC_STORED)
        return ms_fail(err, MS_ERR_ARG, "static store: the static tier is already held as %s",
                       ms_static_dtype_name((ms_static_dtype)m->static_dtype));
    char path[4096];
    int rc = join(path, sizeof path, dir, err);
    if (rc) return rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ms_fail(err, MS_ERR_IO, "%s: %s (pack it with moonshine pack MODEL --static q8 --out %s)", path,
                               strerror(errno), dir);
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return ms_fail(err, MS_ERR_IO, "%s: %s", path, strerror(e));
    }
    const uint64_t size = (uint64_t)st.st_size;
    if (size < sizeof(sst_head)) {
        close(fd);
        return ms_fail(err, MS_ERR_FORMAT, "%s: %llu bytes: too short for a static store", path, (unsigned long long)size);
    }
    uint8_t *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return ms_fail(err, MS_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    const int nv = ms_rq_collect(m, NULL), nf = m->ck.n_files;
    ms_rq_ref *r = malloc((size_t)nv * sizeof *r);
    ms_qmat *olds = malloc((size_t)nv * sizeof *olds), *q = NULL;
    int *srcix = malloc((size_t)nv * sizeof *srcix);
    ms_rq_span *replaced = malloc((size_t)nv * sizeof *replaced);
    sst_src *want_src = calloc((size_t)(nf ? nf : 1), sizeof *want_src);
    sst_head h;
    memcpy(&h, base, sizeof h);
#define BAD(...) (rc = ms_fail(err, MS_ERR_FORMAT, __VA_ARGS__))
#define MISMATCH(...) (rc = ms_fail(err, MS_ERR_MISMATCH, __VA_ARGS__))
    if (!r || !olds || !srcix || !replaced || !want_src) {
        rc = ms_fail(err, MS_ERR_NOMEM, "static store: out of memory");
        goto out;
    }
    if (memcmp(h.magic, SST_MAGIC, 8)) {
        BAD("%s: not a moonshine static store (bad magic)", path);
        goto out;
    }
    if (h.version != SST_VERSION) {
        BAD("%s: static store version %u, this build reads %u (pack it again)", path, h.version, SST_VERSION);
        goto out;
    }
    if ((h.dtype != MS_STATIC_Q8 && h.dtype != MS_STATIC_FP8) || h.n_src > MAX_SRC || h.n_mat > MAX_MAT ||
        h.data_start % ALIGN || h.file_size != size ||
        h.data_start < sizeof h + (uint64_t)h.n_src * sizeof(sst_src) + (uint64_t)h.n_mat * sizeof(sst_mat) ||
        h.data_start > size) {
        BAD("%s: bad static store header (dtype %u, %u sources, %u matrices, data at %llu, file size %llu of %llu)", path,
            h.dtype, h.n_src, h.n_mat, (unsigned long long)h.data_start, (unsigned long long)h.file_size,
            (unsigned long long)size);
        goto out;
    }
    {
        uint32_t crc = h.head_crc;
        sst_head z = h;
        z.head_crc = 0;
        uint32_t c = ms_crc32c(0, &z, sizeof z);
        c = ms_crc32c(c, base + sizeof z, (size_t)(h.data_start - sizeof z));
        if (c != crc) {
            BAD("%s: static store header checksum mismatch (corrupt)", path);
            goto out;
        }
    }
    if (want != MS_STATIC_STORED && (int)h.dtype != (int)want) {
        rc = ms_fail(err, MS_ERR_ARG, "%s holds the static tier in %s, not %s", path,
                     ms_static_dtype_name((ms_static_dtype)h.dtype), ms_static_dtype_name(want));
        goto out;
    }
    /* binding to the checkpoint, as the expert store's */
    const sst_src *s = (const sst_src *)(base + sizeof h);
    const sst_mat *mat = (const sst_mat *)(base + sizeof h + (size_t)h.n_src * sizeof(sst_src));
    if ((int)h.n_src != nf) {
        MISMATCH("%s was packed from a checkpoint of %u file(s); %s has %d", path, h.n_src, m->ck.dir, nf);
        goto out;
    }
    if ((rc = sources(m, want_src, err))) goto out;
    for (int i = 0; i < nf; i++) {
        const char *fp = m->ck.files[i].path;
        if (strncmp(s[i].name, want_src[i].name, sizeof s[i].name))
            MISMATCH("%s was packed from another checkpoint: source file %d is %.256s, not %s", path, i, s[i].name, fp);
        else if (s[i].size != want_src[i].size)
            MISMATCH("%s was packed from another checkpoint: %s is %llu bytes, the store expects %llu", path, fp,
                     (unsigned long long)want_src[i].size, (unsigned long long)s[i].size);
        else if (memcmp(s[i].header_sha256, want_src[i].header_sha256, 65))
            MISMATCH("%s was packed from another checkpoint: the SafeTensors header of %s differs", path, fp);
        else if (memcmp(s[i].data_sample_sha256, want_src[i].data_sample_sha256, 65))
            MISMATCH("%s was packed from another checkpoint: the weights in %s differ (data sample sha256)", path, fp);
        if (rc) goto out;
    }
    /* the same matrices the requantizing load makes, in the same order */
    ms_rq_collect(m, r);
    int nu = 0, uses = 0;
    for (int i = 0; i < nv; i++) {
        olds[i] = *r[i].w;
        srcix[i] = -1;
        if (!ms_rq_eligible(r[i].w)) continue;
        uses++;
        int j = ms_rq_earlier_same(r, i, olds);
        srcix[i] = j >= 0 ? srcix[j] : nu++;
    }
    if ((int)h.n_views != nv || (int)h.n_mat != nu) {
        MISMATCH("%s: %u matrices of %u views, the model has %d of %d (packed by another build?)", path, h.n_mat,
                 h.n_views, nu, nv);
        goto out;
    }
    if (!(q = calloc((size_t)(nu ? nu : 1), sizeof *q))) {
        rc = ms_fail(err, MS_ERR_NOMEM, "static store: out of memory");
        goto out;
    }
    for (int i = 0, u = 0; i < nv; i++) {
        if (srcix[i] != u) continue; /* not the first view of matrix u */
        const sst_mat *x = &mat[u];
        char what[96];
        ms_rq_ref_name(&r[i], what, sizeof what);
        if (x->view != (uint32_t)i || x->layer != r[i].layer || strncmp(x->what, r[i].what, sizeof x->what) ||
            x->rows != r[i].w->rows || x->cols != r[i].w->cols) {
            MISMATCH("%s: matrix %d is layer %d %.48s [%lld, %lld], the model's is %s", path, u, x->layer, x->what,
                     (long long)x->rows, (long long)x->cols, what);
            goto out;
        }
        if (x->bytes != mat_bytes(x->rows, x->cols) || x->offset % ALIGN || x->offset < h.data_start ||
            x->offset > size || x->bytes > size - x->offset) {
            BAD("%s: %s: bad extent (offset %llu, %llu bytes)", path, what, (unsigned long long)x->offset,
                (unsigned long long)x->bytes);
            goto out;
        }
        if (ms_crc32c(0, base + x->offset, x->bytes) != x->crc) {
            BAD("%s: %s: checksum mismatch (corrupt)", path, what);
            goto out;
        }
        const uint8_t *d = base + x->offset;
        q[u] = (ms_qmat){.dtype = h.dtype == MS_STATIC_Q8 ? MS_DT_Q8 : MS_DT_F8_E4M3, .rows = x->rows, .cols = x->cols,
                         .data = d, .scale_dtype = MS_DT_BF16,
                         .scale = d + (((uint64_t)x->rows * (uint64_t)x->cols + 15) & ~15ull), .brow = 1,
                         .bcol = MS_Q8_BLOCK};
        u++;
    }
    if ((int)h.uses != uses) {
        MISMATCH("%s: %u requantized views, the model has %d", path, h.uses, uses);
        goto out;
    }
    if ((rc = ms_rq_install(m, (ms_static_dtype)h.dtype, r, nv, srcix, q, h.rel_max, uses, replaced, err))) goto out;
    m->static_store_map = base, m->static_store_len = size;
    base = NULL;
out:
#undef BAD
#undef MISMATCH
    if (base) munmap(base, size);
    free(r), free(olds), free(q), free(srcix), free(replaced), free(want_src);
    return rc;
}
