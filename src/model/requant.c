/* requant.c — the static tier requantized at load (--static-dtype q8|fp8, model.h). */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"

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

typedef struct {
    ms_qmat *w;
    int layer;
    const char *what;
} qref;

/* Every static matrix ms_model_requant_static may requantize, in a fixed order; count when out is NULL. */
static int collect(ms_model *m, qref *out) {
    int n = 0;
#define ADD(W, L, WHAT)                                                                                           \
    do {                                                                                                          \
        if (out) out[n] = (qref){(W), (L), (WHAT)};                                                                \
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
#undef ADD
    return n;
}

static int eligible(const ms_qmat *w) {
    return w->data && !w->scale && (w->dtype == MS_DT_BF16 || w->dtype == MS_DT_F16) && w->rows > 0 && w->cols > 0;
}

/* index of an earlier eligible ref viewing the same bytes (same data, shape, dtype), else -1 */
static int earlier_same(const qref *r, int i, const ms_qmat *olds) {
    for (int j = 0; j < i; j++)
        if (olds[j].data == r[i].w->data && olds[j].rows == r[i].w->rows && olds[j].cols == r[i].w->cols &&
            olds[j].dtype == r[i].w->dtype)
            return j;
    return -1;
}

uint64_t ms_model_static_bytes_as(const ms_model *m, ms_static_dtype d) {
    if (d == MS_STATIC_STORED || m->static_dtype != MS_STATIC_STORED) return m->static_bytes;
    int n = collect((ms_model *)m, NULL);
    qref *r = malloc((size_t)n * sizeof *r);
    ms_qmat *olds = malloc((size_t)n * sizeof *olds);
    if (!r || !olds) {
        free(r), free(olds);
        return m->static_bytes;
    }
    collect((ms_model *)m, r);
    uint64_t old_b = 0, new_b = 0;
    for (int i = 0; i < n; i++) {
        olds[i] = *r[i].w;
        if (!eligible(r[i].w) || earlier_same(r, i, olds) >= 0) continue;
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

static int requant_one(ms_model *m, const qref *r, ms_static_dtype d, ms_qmat *out, void **mem, double *rel, ms_err *err) {
    const ms_qmat *w = r->w;
    const int64_t R = w->rows, C = w->cols, nb = (C + MS_Q8_BLOCK - 1) / MS_Q8_BLOCK;
    const size_t esz = (size_t)ms_dtype_bits(w->dtype) / 8, row_bytes = (size_t)C * esz;
    char what[96];
    if (r->layer >= 0) snprintf(what, sizeof what, "layer %d %s [%lld, %lld]", r->layer, r->what, (long long)R, (long long)C);
    else snprintf(what, sizeof what, "%s [%lld, %lld]", r->what, (long long)R, (long long)C);
    uint64_t dbytes = (uint64_t)R * (uint64_t)C;
    uint8_t *dst = malloc((size_t)ms_static_dtype_matrix_bytes(d, R, C) + 16);
    int64_t rows_per = (int64_t)(CHUNK_BYTES / row_bytes);
    if (rows_per < 1) rows_per = 1;
    if (rows_per > R) rows_per = R;
    uint64_t off = 0;
    int f = file_of(m, w->data, &off), fd = -1;
    uint8_t *buf = f >= 0 ? malloc((size_t)rows_per * row_bytes) : NULL;
    float *rowf = malloc((size_t)C * sizeof *rowf);
    if (!dst || !rowf || (f >= 0 && !buf)) {
        free(dst), free(buf), free(rowf);
        return ms_fail(err, MS_ERR_NOMEM, "requantizing %s to %s: out of memory", what, ms_static_dtype_name(d));
    }
    if (f >= 0 && (fd = open(m->ck.files[f].path, O_RDONLY | O_CLOEXEC)) < 0) {
        int e = errno;
        free(dst), free(buf), free(rowf);
        return ms_fail(err, MS_ERR_IO, "requantizing %s: %s: %s", what, m->ck.files[f].path, strerror(e));
    }
    uint16_t *scale = (uint16_t *)(dst + ((dbytes + 15) & ~(uint64_t)15));
    int rc = MS_OK;
    double se = 0, sw = 0;
    for (int64_t r0 = 0; r0 < R && !rc; r0 += rows_per) {
        int64_t nr = R - r0 < rows_per ? R - r0 : rows_per;
        const uint8_t *src = (const uint8_t *)w->data + (size_t)r0 * row_bytes; /* owned memory: read in place */
        if (fd >= 0) {
            if (pread_full(fd, buf, (size_t)nr * row_bytes, off + (uint64_t)r0 * row_bytes)) {
                rc = ms_fail(err, MS_ERR_IO, "requantizing %s: %s: short read at %llu: %s", what, m->ck.files[f].path,
                             (unsigned long long)(off + (uint64_t)r0 * row_bytes), strerror(errno));
                break;
            }
            src = buf;
        }
        for (int64_t i = 0; i < nr; i++) {
            ms_to_f32(rowf, src + (size_t)i * row_bytes, w->dtype, C);
            uint8_t *q = dst + (size_t)(r0 + i) * (size_t)C;
            if (d == MS_STATIC_Q8) ms_quant_q8_row(rowf, C, (int8_t *)q, scale + (r0 + i) * nb);
            else ms_quant_fp8_row(rowf, C, q, scale + (r0 + i) * nb);
            const uint16_t *sc = scale + (r0 + i) * nb;
            for (int64_t c = 0; c < C; c++) {
                float v = d == MS_STATIC_Q8 ? (float)((const int8_t *)q)[c] : ms_fp8_e4m3_to_f32(q[c]);
                double e = (double)(v * ms_bf16_to_f32(sc[c / MS_Q8_BLOCK])) - rowf[c];
                se += e * e, sw += (double)rowf[c] * rowf[c];
            }
        }
    }
    if (fd >= 0) {
        if (!rc) posix_fadvise(fd, (off_t)off, (off_t)((uint64_t)R * row_bytes), POSIX_FADV_DONTNEED);
        close(fd);
    }
    free(buf), free(rowf);
    if (rc) {
        free(dst);
        return rc;
    }
    *out = (ms_qmat){.dtype = d == MS_STATIC_Q8 ? MS_DT_Q8 : MS_DT_F8_E4M3, .rows = R, .cols = C, .data = dst,
                     .scale_dtype = MS_DT_BF16, .scale = scale, .brow = 1, .bcol = MS_Q8_BLOCK};
    *mem = dst;
    *rel = sw > 0 ? sqrt(se / sw) : 0;
    return MS_OK;
}

typedef struct {
    const void *p;
    uint64_t bytes;
} span;

static int cmp_span(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const span *)a)->p, y = (uintptr_t)((const span *)b)->p;
    return x < y ? -1 : x > y;
}

int ms_model_requant_static(ms_model *m, ms_static_dtype d, ms_err *err) {
    if (d == MS_STATIC_STORED || m->static_dtype == (int)d) return MS_OK;
    if (m->static_dtype != MS_STATIC_STORED)
        return ms_fail(err, MS_ERR_ARG, "static tier already held as %s, not %s",
                       ms_static_dtype_name((ms_static_dtype)m->static_dtype), ms_static_dtype_name(d));
    int n = collect(m, NULL);
    qref *r = malloc((size_t)n * sizeof *r);
    ms_qmat *olds = malloc((size_t)n * sizeof *olds);
    span *replaced = malloc((size_t)n * sizeof *replaced);
    m->quant_allocs = calloc((size_t)n, sizeof *m->quant_allocs);
    if (!r || !olds || !replaced || !m->quant_allocs) {
        free(r), free(olds), free(replaced);
        return ms_fail(err, MS_ERR_NOMEM, "requantizing the static tier: out of memory");
    }
    collect(m, r);
    int rc = MS_OK, n_rep = 0, done = 0, uses = 0;
    uint64_t old_b = 0, new_b = 0;
    double rel_max = 0;
    for (int i = 0; i < n && !rc; i++, done++) {
        olds[i] = *r[i].w;
        if (!eligible(r[i].w)) continue;
        int j = earlier_same(r, i, olds);
        uses++;
        if (j >= 0) { /* the same bytes seen before (a tied head): share its copy */
            *r[i].w = *r[j].w;
            continue;
        }
        ms_qmat q;
        void *mem = NULL;
        double rel = 0;
        if ((rc = requant_one(m, &r[i], d, &q, &mem, &rel, err))) break;
        if (rel > rel_max) rel_max = rel;
        m->quant_allocs[m->n_quant_allocs++] = mem;
        old_b += ms_qmat_bytes(r[i].w);
        new_b += ms_qmat_bytes(&q);
        replaced[n_rep++] = (span){r[i].w->data, ms_qmat_bytes(r[i].w)};
        *r[i].w = q;
    }
    if (!rc) {
        /* the tensors whose bytes nothing reads any more */
        if (n_rep > 1) qsort(replaced, (size_t)n_rep, sizeof *replaced, cmp_span);
        for (int t = 0; m->tensor_bound && t < m->ck.n_tensors; t++) {
            span key = {m->ck.tensors[t].data, 0};
            const span *hit = key.p && n_rep ? bsearch(&key, replaced, (size_t)n_rep, sizeof *replaced, cmp_span) : NULL;
            if (hit && hit->bytes == m->ck.tensors[t].nbytes) m->tensor_bound[t] = 2;
        }
        m->static_bytes = m->static_bytes - old_b + new_b;
        m->static_dtype = (int)d;
        m->static_requant_bytes = new_b;
        m->requant_rel_rms = rel_max;
        m->requant_uses = uses;
    } else {
        /* put the stored views back; the copies go with the model */
        for (int i = 0; i < done; i++)
            if (r[i].w->data != olds[i].data) *r[i].w = olds[i];
    }
    free(r), free(olds), free(replaced);
    return rc;
}
