/* requant.c — the static tier requantized at load (--static-dtype q8|fp8, model.h). */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "model/requant_int.h"
#include "util/threadpool.h"

#define CHUNK_BYTES (4u << 20) /* the bounded read buffer: whole rows, at most this (or one row) */

int ms_static_dtype_parse(const char *s, ms_static_dtype *out, ms_err *err) {
    if (s && !strcmp(s, "stored")) *out = MS_STATIC_STORED;
    else if (s && !strcmp(s, "q8")) *out = MS_STATIC_Q8;
    else if (s && !strcmp(s, "fp8")) *out = MS_STATIC_FP8;
    else return ms_fail(err, MS_ERR_ARG, "static dtype \"%s\": expected stored, q8 or fp8", s ? s : "(null)");
    return MS_OK;
}

const char *ms_static_dtype_name(ms_static_dtype d) {
    return d == MS_STATIC_Q8 ? "q8" : d == MS_STATIC_FP8 ? "fp8" : "stored";
}

uint64_t ms_static_dtype_matrix_bytes(ms_static_dtype d, int64_t rows, int64_t cols) {
    if (d == MS_STATIC_STORED || rows <= 0 || cols <= 0) return 0;
    uint64_t nb = (uint64_t)((cols + MS_Q8_BLOCK - 1) / MS_Q8_BLOCK);
    return (uint64_t)rows * (uint64_t)cols + (uint64_t)rows * nb * 2; /* 1-byte values + BF16 scales */
}

/* Every static matrix ms_model_requant_static may requantize, in a fixed order; count when out is NULL. */
int ms_rq_collect(ms_model *m, ms_rq_ref *out) {
    int n = 0;
#define ADD(W, L, WHAT)                                                                                           \
    do {                                                                                                          \
        if (out) out[n] = (ms_rq_ref){(W), (L), (WHAT)};                                                                \
        n++;                                                                                                      \
    } while (0)
    ADD(&m->embed, -1, "embedding");
    ADD(&m->lm_head, -1, "lm_head");
    for (int l = 0; m->layers && l < m->cfg.n_layers; l++) {
        ms_layer *L = &m->layers[l];
        ADD(&L->wq, l, "q_proj");
        ADD(&L->wk, l, "k_proj");
        ADD(&L->wv, l, "v_proj");
        ADD(&L->wo, l, "o_proj");
        ADD(&L->q_a, l, "q_a_proj");
        ADD(&L->q_b, l, "q_b_proj");
        ADD(&L->kv_a, l, "kv_a_proj_with_mqa");
        ADD(&L->kv_b, l, "kv_b_proj");
        ADD(&L->mla_gate, l, "g_proj");
        ADD(&L->gate, l, "mlp gate_proj");
        ADD(&L->up, l, "mlp up_proj");
        ADD(&L->down, l, "mlp down_proj");
        ADD(&L->lat_down, l, "routed_expert_down_proj");
        ADD(&L->lat_up, l, "routed_expert_up_proj");
        /* linear attention: the projections (ms_matmul); not the convs, A_log, dt_bias, norms */
        ADD(&L->kda.q_proj, l, "KDA q_proj");
        ADD(&L->kda.k_proj, l, "KDA k_proj");
        ADD(&L->kda.v_proj, l, "KDA v_proj");
        ADD(&L->kda.o_proj, l, "KDA o_proj");
        ADD(&L->kda.g_proj, l, "KDA g_proj");
        ADD(&L->kda.g_a, l, "KDA g_a_proj");
        ADD(&L->kda.g_b, l, "KDA g_b_proj");
        ADD(&L->kda.f_a, l, "KDA f_a_proj");
        ADD(&L->kda.f_b, l, "KDA f_b_proj");
        ADD(&L->kda.b_proj, l, "KDA b_proj");
        ADD(&L->gdn.in_qkvz, l, "in_proj_qkvz");
        ADD(&L->gdn.in_ba, l, "in_proj_ba");
        ADD(&L->gdn.out_proj, l, "out_proj");
    }
    /* the split gated DeltaNet projections (Qwen3.5) come after every other entry, and only in
     * models that have them, so the order and count of every other model's list is unchanged */
    for (int l = 0; m->layers && m->cfg.gdn_split && l < m->cfg.n_layers; l++) {
        ms_layer *L = &m->layers[l];
        ADD(&L->gdn.in_qkv, l, "in_proj_qkv");
        ADD(&L->gdn.in_z, l, "in_proj_z");
        ADD(&L->gdn.in_b, l, "in_proj_b");
        ADD(&L->gdn.in_a, l, "in_proj_a");
    }
#undef ADD
    return n;
}

int ms_rq_eligible(const ms_qmat *w) {
    return w->data && !w->scale && (w->dtype == MS_DT_BF16 || w->dtype == MS_DT_F16) && w->rows > 0 && w->cols > 0;
}

/* index of an earlier eligible ref viewing the same bytes (same data, shape, dtype), else -1 */
int ms_rq_earlier_same(const ms_rq_ref *r, int i, const ms_qmat *olds) {
    for (int j = 0; j < i; j++)
        if (olds[j].data == r[i].w->data && olds[j].rows == r[i].w->rows && olds[j].cols == r[i].w->cols &&
            olds[j].dtype == r[i].w->dtype)
            return j;
    return -1;
}

uint64_t ms_model_static_bytes_as(const ms_model *m, ms_static_dtype d) {
    if (d == MS_STATIC_STORED || m->static_dtype != MS_STATIC_STORED) return m->static_bytes;
    int n = ms_rq_collect((ms_model *)m, NULL);
    ms_rq_ref *r = malloc((size_t)n * sizeof *r);
    ms_qmat *olds = malloc((size_t)n * sizeof *olds);
    if (!r || !olds) {
        free(r), free(olds);
        return m->static_bytes;
    }
    ms_rq_collect((ms_model *)m, r);
    uint64_t old_b = 0, new_b = 0;
    for (int i = 0; i < n; i++) {
        olds[i] = *r[i].w;
        if (!ms_rq_eligible(r[i].w) || ms_rq_earlier_same(r, i, olds) >= 0) continue;
        old_b += ms_qmat_bytes(r[i].w);
        new_b += ms_static_dtype_matrix_bytes(d, r[i].w->rows, r[i].w->cols);
    }
    free(r), free(olds);
    return m->static_bytes - old_b + new_b;
}

/* The checkpoint file whose mapping holds p, else -1. */
static int file_of(const ms_model *m, const void *p, uint64_t *off) {
    for (int f = 0; f < m->ck.n_files; f++) {
        const ms_mapping *mp = &m->ck.files[f].map;
        if (mp->data && (const uint8_t *)p >= mp->data && (const uint8_t *)p < mp->data + mp->size) {
            *off = (uint64_t)((const uint8_t *)p - mp->data);
            return f;
        }
    }
    return -1;
}

static int pread_full(int fd, void *buf, size_t len, uint64_t off) {
    uint8_t *b = buf;
    while (len) {
        ssize_t k = pread(fd, b, len, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k, len -= (size_t)k, off += (uint64_t)k;
    }
    return 0;
}

/* One task: rows [r0, r0 + nr) of matrix mat, read into the thread's buffer and quantized. */
typedef struct {
    int mat;
    int64_t r0, nr;
    double se, sw; /* squared error and squared weight over the task's values */
    int rc;        /* 0, or the errno of a failed read */
} rq_task;

typedef struct {
    const ms_rq_ref *r;
    ms_qmat *w;       /* per matrix: the stored view (read) */
    ms_qmat *q;       /* per matrix: the new view (written) */
    uint64_t *off;    /* per matrix: file offset of its bytes; file index in fileix */
    int *fileix;      /* -1: owned memory, read in place */
    const int *fds;   /* per checkpoint file, opened once */
    rq_task *t;
    uint8_t **buf;    /* per pool thread: CHUNK_BYTES (or one row) */
    float **rowf;     /* per pool thread: the widest row */
    ms_static_dtype d;
} rq_job;

static void rq_run(void *ctx, int task, int tid) {
    rq_job *j = ctx;
    rq_task *t = &j->t[task];
    const ms_qmat *w = &j->w[t->mat];
    ms_qmat *q = &j->q[t->mat];
    const int64_t C = w->cols, nb = (C + MS_Q8_BLOCK - 1) / MS_Q8_BLOCK;
    const size_t row_bytes = (size_t)C * ((size_t)ms_dtype_bits(w->dtype) / 8);
    const uint8_t *src = (const uint8_t *)w->data + (size_t)t->r0 * row_bytes;
    const int f = j->fileix[t->mat];
    if (f >= 0) {
        uint64_t at = j->off[t->mat] + (uint64_t)t->r0 * row_bytes;
        if (pread_full(j->fds[f], j->buf[tid], (size_t)t->nr * row_bytes, at)) {
            t->rc = errno ? errno : EIO;
            return;
        }
        posix_fadvise(j->fds[f], (off_t)at, (off_t)((size_t)t->nr * row_bytes), POSIX_FADV_DONTNEED);
        src = j->buf[tid];
    }
    float *rowf = j->rowf[tid];
    uint8_t *dst = (uint8_t *)q->data;
    uint16_t *scale = (uint16_t *)q->scale;
    double se = 0, sw = 0;
    for (int64_t i = 0; i < t->nr; i++) {
        const int64_t row = t->r0 + i;
        ms_to_f32(rowf, src + (size_t)i * row_bytes, w->dtype, C);
        uint8_t *qr = dst + (size_t)row * (size_t)C;
        const uint16_t *sc = scale + row * nb;
        if (j->d == MS_STATIC_Q8) ms_quant_q8_row(rowf, C, (int8_t *)qr, scale + row * nb);
        else ms_quant_fp8_row(rowf, C, qr, scale + row * nb);
        for (int64_t c = 0; c < C; c++) {
            float v = j->d == MS_STATIC_Q8 ? (float)((const int8_t *)qr)[c] : ms_fp8_e4m3_to_f32(qr[c]);
            double e = (double)(v * ms_bf16_to_f32(sc[c / MS_Q8_BLOCK])) - rowf[c];
            se += e * e, sw += (double)rowf[c] * rowf[c];
        }
    }
    t->se = se, t->sw = sw;
}

/* The new [R, C] view in dtype d over freshly allocated memory (values, then BF16 scales 16-aligned). */
static int rq_alloc(ms_static_dtype d, int64_t R, int64_t C, ms_qmat *q) {
    const uint64_t dbytes = (uint64_t)R * (uint64_t)C;
    uint8_t *dst = malloc((size_t)ms_static_dtype_matrix_bytes(d, R, C) + 16);
    if (!dst) return -1;
    *q = (ms_qmat){.dtype = d == MS_STATIC_Q8 ? MS_DT_Q8 : MS_DT_F8_E4M3, .rows = R, .cols = C, .data = dst,
                   .scale_dtype = MS_DT_BF16, .scale = dst + ((dbytes + 15) & ~(uint64_t)15), .brow = 1,
                   .bcol = MS_Q8_BLOCK};
    return 0;
}

void ms_rq_ref_name(const ms_rq_ref *r, char *what, size_t n) {
    if (r->layer >= 0)
        snprintf(what, n, "layer %d %s [%lld, %lld]", r->layer, r->what, (long long)r->w->rows, (long long)r->w->cols);
    else snprintf(what, n, "%s [%lld, %lld]", r->what, (long long)r->w->rows, (long long)r->w->cols);
}


static int cmp_ms_rq_span(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const ms_rq_span *)a)->p, y = (uintptr_t)((const ms_rq_span *)b)->p;
    return x < y ? -1 : x > y;
}

/* Point every eligible view i at its new matrix q[src[i]] (src[i] < 0: not requantized), mark the
 * tensors nothing reads any more, and account the bytes. replaced: scratch of n ms_rq_spans. */
int ms_rq_install(ms_model *m, ms_static_dtype d, ms_rq_ref *r, int n, const int *src, const ms_qmat *q,
                              double rel_max, int uses, ms_rq_span *replaced, ms_err *err) {
    int n_rep = 0;
    uint64_t old_b = 0, new_b = 0;
    unsigned char *seen = calloc((size_t)n + 1, 1);
    if (!seen) return ms_fail(err, MS_ERR_NOMEM, "requantizing the static tier: out of memory");
    for (int i = 0; i < n; i++) {
        if (src[i] < 0) continue;
        if (!seen[src[i]]) { /* the first view of these bytes */
            seen[src[i]] = 1;
            old_b += ms_qmat_bytes(r[i].w);
            new_b += ms_qmat_bytes(&q[src[i]]);
            replaced[n_rep++] = (ms_rq_span){r[i].w->data, ms_qmat_bytes(r[i].w)};
        }
        *r[i].w = q[src[i]];
    }
    free(seen);
    if (n_rep > 1) qsort(replaced, (size_t)n_rep, sizeof *replaced, cmp_ms_rq_span);
    for (int t = 0; m->tensor_bound && t < m->ck.n_tensors; t++) {
        ms_rq_span key = {m->ck.tensors[t].data, 0};
        const ms_rq_span *hit = key.p && n_rep ? bsearch(&key, replaced, (size_t)n_rep, sizeof *replaced, cmp_ms_rq_span) : NULL;
        if (hit && hit->bytes == m->ck.tensors[t].nbytes) m->tensor_bound[t] = 2;
    }
    m->static_bytes = m->static_bytes - old_b + new_b;
    m->static_dtype = (int)d;
    m->static_requant_bytes = new_b;
    m->requant_rel_rms = rel_max;
    m->requant_uses = uses;
    return MS_OK;
}

int ms_model_requant_static(ms_model *m, ms_static_dtype d, ms_pool *pool, ms_err *err) {
    if (d == MS_STATIC_STORED || m->static_dtype == (int)d) return MS_OK;
    if (m->static_dtype != MS_STATIC_STORED)
        return ms_fail(err, MS_ERR_ARG, "static tier already held as %s, not %s",
                       ms_static_dtype_name((ms_static_dtype)m->static_dtype), ms_static_dtype_name(d));
    const int n = ms_rq_collect(m, NULL), nth = ms_pool_size(pool), nf = m->ck.n_files;
    ms_rq_ref *r = malloc((size_t)n * sizeof *r);
    ms_qmat *olds = malloc((size_t)n * sizeof *olds), *w = calloc((size_t)n, sizeof *w), *q = calloc((size_t)n, sizeof *q);
    int *src = malloc((size_t)n * sizeof *src), *fileix = malloc((size_t)n * sizeof *fileix);
    int *fds = malloc((size_t)(nf > 0 ? nf : 1) * sizeof *fds);
    uint64_t *off = calloc((size_t)n, sizeof *off);
    ms_rq_span *replaced = malloc((size_t)n * sizeof *replaced);
    uint8_t **buf = calloc((size_t)nth, sizeof *buf);
    float **rowf = calloc((size_t)nth, sizeof *rowf);
    rq_task *t = NULL;
    int rc = MS_OK, nu = 0, nt = 0, uses = 0;
    for (int f = 0; fds && f < nf; f++) fds[f] = -1;
    free(m->quant_allocs);
    m->quant_allocs = calloc((size_t)n, sizeof *m->quant_allocs);
    m->n_quant_allocs = 0;
    if (!r || !olds || !w || !q || !src || !fileix || !fds || !off || !replaced || !buf || !rowf || !m->quant_allocs) {
        rc = ms_fail(err, MS_ERR_NOMEM, "requantizing the static tier: out of memory");
        goto out;
    }
    ms_rq_collect(m, r);
    /* the distinct matrices (a tied head is requantized once), their files, their row tasks */
    int64_t max_cols = 1, n_tasks = 0;
    for (int i = 0; i < n; i++) {
        olds[i] = *r[i].w;
        src[i] = -1;
        if (!ms_rq_eligible(r[i].w)) continue;
        uses++;
        int j = ms_rq_earlier_same(r, i, olds);
        if (j >= 0) {
            src[i] = src[j];
            continue;
        }
        src[i] = nu;
        w[nu] = *r[i].w;
        fileix[nu] = file_of(m, w[nu].data, &off[nu]);
        if (fileix[nu] >= 0 && fds[fileix[nu]] < 0 &&
            (fds[fileix[nu]] = open(m->ck.files[fileix[nu]].path, O_RDONLY | O_CLOEXEC)) < 0) {
            char what[96];
            ms_rq_ref_name(&r[i], what, sizeof what);
            rc = ms_fail(err, MS_ERR_IO, "requantizing %s: %s: %s", what, m->ck.files[fileix[nu]].path, strerror(errno));
            goto out;
        }
        if (w[nu].cols > max_cols) max_cols = w[nu].cols;
        const size_t row_bytes = (size_t)w[nu].cols * ((size_t)ms_dtype_bits(w[nu].dtype) / 8);
        int64_t per = (int64_t)(CHUNK_BYTES / row_bytes);
        if (per < 1) per = 1;
        n_tasks += (w[nu].rows + per - 1) / per;
        nu++;
    }
    if (n_tasks > INT32_MAX || !(t = calloc((size_t)(n_tasks ? n_tasks : 1), sizeof *t))) {
        rc = ms_fail(err, MS_ERR_NOMEM, "requantizing the static tier: out of memory for %lld tasks", (long long)n_tasks);
        goto out;
    }
    size_t buf_bytes = 0;
    for (int u = 0; u < nu; u++) {
        const size_t row_bytes = (size_t)w[u].cols * ((size_t)ms_dtype_bits(w[u].dtype) / 8);
        int64_t per = (int64_t)(CHUNK_BYTES / row_bytes);
        if (per < 1) per = 1;
        if ((size_t)(per < w[u].rows ? per : w[u].rows) * row_bytes > buf_bytes)
            buf_bytes = (size_t)(per < w[u].rows ? per : w[u].rows) * row_bytes;
        for (int64_t r0 = 0; r0 < w[u].rows; r0 += per)
            t[nt++] = (rq_task){.mat = u, .r0 = r0, .nr = w[u].rows - r0 < per ? w[u].rows - r0 : per};
        if (rq_alloc(d, w[u].rows, w[u].cols, &q[u])) {
            rc = ms_fail(err, MS_ERR_NOMEM, "requantizing the static tier to %s: out of memory for a [%lld, %lld] matrix",
                         ms_static_dtype_name(d), (long long)w[u].rows, (long long)w[u].cols);
            goto out;
        }
        m->quant_allocs[m->n_quant_allocs++] = (void *)q[u].data;
    }
    for (int k = 0; k < nth; k++)
        if (!(buf[k] = malloc(buf_bytes ? buf_bytes : 1)) || !(rowf[k] = malloc((size_t)max_cols * sizeof(float)))) {
            rc = ms_fail(err, MS_ERR_NOMEM, "requantizing the static tier: out of memory for the read buffers");
            goto out;
        }
    /* the bounded buffers: one per thread; every matrix's rows are independent, so the result does not
     * depend on the thread count */
    rq_job job = {.r = r, .w = w, .q = q, .off = off, .fileix = fileix, .fds = fds, .t = t, .buf = buf,
                  .rowf = rowf, .d = d};
    ms_pool_run(pool, nt, rq_run, &job);
    for (int k = 0; k < nt; k++)
        if (t[k].rc) {
            const int u = t[k].mat;
            int i = 0;
            while (src[i] != u) i++;
            char what[96];
            ms_rq_ref_name(&r[i], what, sizeof what);
            const size_t row_bytes = (size_t)w[u].cols * ((size_t)ms_dtype_bits(w[u].dtype) / 8);
            rc = ms_fail(err, MS_ERR_IO, "requantizing %s: %s: short read at %llu: %s", what,
                         m->ck.files[fileix[u]].path, (unsigned long long)(off[u] + (uint64_t)t[k].r0 * row_bytes),
                         strerror(t[k].rc));
            goto out;
        }
    double rel_max = 0;
    for (int u = 0, k = 0; u < nu; u++) {
        double se = 0, sw = 0;
        for (; k < nt && t[k].mat == u; k++) se += t[k].se, sw += t[k].sw;
        double rel = sw > 0 ? sqrt(se / sw) : 0;
        if (rel > rel_max) rel_max = rel;
    }
    rc = ms_rq_install(m, d, r, n, src, q, rel_max, uses, replaced, err);
out:
    if (rc) { /* the stored views stay; the copies go */
        for (int k = 0; m->quant_allocs && k < m->n_quant_allocs; k++) free(m->quant_allocs[k]);
        if (m->quant_allocs) m->n_quant_allocs = 0;
    }
    for (int f = 0; fds && f < nf; f++)
        if (fds[f] >= 0) close(fds[f]);
    for (int k = 0; k < nth; k++) {
        if (buf) free(buf[k]);
        if (rowf) free(rowf[k]);
    }
    free(buf), free(rowf), free(t), free(r), free(olds), free(w), free(q), free(src), free(fileix), free(fds), free(off),
        free(replaced);
    return rc;
}
