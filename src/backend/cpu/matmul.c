/* matmul.c — CPU matmul dispatch (ms_matmul / ms_matmul_acc).
 *
 * n == 1 (decode): memory-bound matvec; rows are split into chunks handed to
 * the pool, each chunk streamed once through a dtype-specific kernel that
 * dequantizes in registers (kernels_avx512.c, kernels_avx2.c).
 * n > 1 (prefill): cache-blocked. A task owns MM_RB rows x a block of tokens;
 * for each MM_KC-column slice it dequantizes the weight tile once into an F32
 * buffer on its stack and multiplies it with every token of the block, so each
 * weight byte is read and converted once per token block, not once per token.
 * Accumulation is F32 throughout; activations are never rounded, except on a
 * pool set to MS_ACT_Q8 (cpu.h): there MXFP4 / INT4 / Q8 weights (ms_qk_ok) take
 * the integer path of qkern.h instead: x is quantized once per call into
 * scratch, decode splits rows as above, prefill gives a task MM_RB rows x a
 * block of tokens (the rows stay in cache across the tokens). MS_ACT_Q16: the
 * same path with two int8 planes, for decode (n = 1) only. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/qkern.h"

/* ---- scalar kernels (the fallback ISA) ---- */

void mm_dequant_scalar(const ms_qmat *w, int64_t r0, int nr, int64_t c0, int kc, float *buf, int ld) {
    const int64_t C = w->cols;
    for (int i = 0; i < nr; i++) {
        int64_t r = r0 + i;
        float *o = buf + (int64_t)i * ld;
        switch (w->dtype) {
        case MS_DT_F32: memcpy(o, (const float *)w->data + r * C + c0, (size_t)kc * 4); break;
        case MS_DT_BF16: {
            const uint16_t *p = (const uint16_t *)w->data + r * C + c0;
            for (int k = 0; k < kc; k++) o[k] = ms_bf16_to_f32(p[k]);
            break;
        }
        case MS_DT_F16: {
            const uint16_t *p = (const uint16_t *)w->data + r * C + c0;
            for (int k = 0; k < kc; k++) o[k] = ms_f16_to_f32(p[k]);
            break;
        }
        case MS_DT_F8_E4M3: {
            const uint8_t *p = (const uint8_t *)w->data + r * C;
            int64_t sr = w->scale ? r / w->brow : 0, sc = -1;
            float s = 1.0f;
            for (int k = 0; k < kc; k++) {
                int64_t c = c0 + k;
                if (w->scale && c / w->bcol != sc) {
                    sc = c / w->bcol;
                    s = mm_scale_at(w, sr, sc);
                }
                o[k] = ms_fp8_e4m3_to_f32(p[c]) * s;
            }
            break;
        }
        case MS_DT_Q8: {
            const int8_t *p = (const int8_t *)w->data + r * C;
            int64_t sr = r / w->brow, sc = -1;
            float s = 1.0f;
            for (int k = 0; k < kc; k++) {
                int64_t c = c0 + k;
                if (c / w->bcol != sc) {
                    sc = c / w->bcol;
                    s = mm_scale_at(w, sr, sc);
                }
                o[k] = (float)p[c] * s;
            }
            break;
        }
        case MS_DT_I4: {
            const uint8_t *p = (const uint8_t *)w->data + r * (C / 2);
            int64_t sr = r / w->brow, sc = -1;
            float s = 1.0f;
            for (int k = 0; k < kc; k++) {
                int64_t c = c0 + k;
                if (c / w->bcol != sc) {
                    sc = c / w->bcol;
                    s = mm_scale_at(w, sr, sc);
                }
                uint8_t b = p[c / 2];
                o[k] = (float)((int)((c & 1) ? b >> 4 : b & 15) - ms_i4_zero(w, r, c / w->bcol)) * s;
            }
            break;
        }
        case MS_DT_F4: {
            const uint8_t *p = (const uint8_t *)w->data + r * (C / 2);
            int64_t sr = w->scale ? r / w->brow : 0, sc = -1;
            float s = 1.0f;
            for (int k = 0; k < kc; k++) {
                int64_t c = c0 + k;
                if (w->scale && c / w->bcol != sc) {
                    sc = c / w->bcol;
                    s = mm_scale_at(w, sr, sc);
                }
                uint8_t b = p[c / 2];
                o[k] = ms_fp4_e2m1_table[(c & 1) ? b >> 4 : b & 15] * s;
            }
            break;
        }
        default:
            for (int k = 0; k < kc; k++) o[k] = NAN;
        }
    }
}

static int gemv_none(const ms_qmat *w) { return 0; }

static void tile_scalar(const float *buf, int ld, int nr, const float *x, int64_t ldx, int nt, int kc, float *y,
                        int64_t ldy, int acc) {
    for (int t = 0; t < nt; t++) {
        const float *xt = x + (int64_t)t * ldx;
        for (int r = 0; r < nr; r++) {
            const float *wr = buf + (int64_t)r * ld;
            float s[8] = {0};
            int k = 0;
            for (; k + 8 <= kc; k += 8)
                for (int u = 0; u < 8; u++) s[u] += wr[k + u] * xt[k + u];
            for (; k < kc; k++) s[0] += wr[k] * xt[k];
            float sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
            float *yo = y + (int64_t)t * ldy + r;
            *yo = acc ? *yo + sum : sum;
        }
    }
}

const mm_kernels ms_kernels_scalar = {
    .gemv_ok = gemv_none,
    .gemv = NULL,
    .dequant = mm_dequant_scalar,
    .tile = tile_scalar,
    .dot = ms_dot_ref,
    .axpy = ms_axpy_ref,
    .rmsnorm = ms_rmsnorm_ref,
    .softmax = ms_softmax_ref,
    .swiglu = ms_swiglu_ref,
};

/* ---- dispatch ---- */

typedef struct {
    const mm_kernels *k;
    const ms_qmat *w;
    const float *x;
    float *y;
    int n, acc;
    int gemv;              /* 1: n == 1 streaming kernel, 0: tiles */
    const qk_kernels *qk;  /* Q8 activations (then xq/xd/xm are the quantized x), else NULL */
    const int8_t *xq, *xq2; /* xq2: the second plane (MS_ACT_Q16), else NULL */
    int planes;             /* 1 (Q8) or 2 (Q16) */
    const float *xd, *xm;
    int64_t xq_stride, xs_stride; /* per token: int8s, floats */
    int n_tasks;
    int64_t rows_per_task; /* gemv */
    int64_t n_rb;          /* tile: row blocks */
    int tb;                /* tile: tokens per block */
} mm_job;

static void gemv_run(const mm_job *j, int task) {
    int64_t r0 = (int64_t)task * j->rows_per_task, r1 = r0 + j->rows_per_task;
    if (r1 > j->w->rows) r1 = j->w->rows;
    j->k->gemv(j->w, j->x, j->y, r0, r1, j->acc);
}

static void tile_run(const mm_job *j, int task) {
    const ms_qmat *w = j->w;
    const int64_t K = w->cols, R = w->rows;
    /* a pad of 16 floats per row keeps the rows off the same cache sets */
    float buf[MM_RB * (MM_KC + 16)] __attribute__((aligned(64)));
    int64_t rb = task % j->n_rb, tbi = task / j->n_rb;
    int64_t r0 = rb * MM_RB, t0 = tbi * j->tb;
    int nr = (int)(R - r0 < MM_RB ? R - r0 : MM_RB);
    int nt = (int)(j->n - t0 < j->tb ? j->n - t0 : j->tb);
    for (int64_t c0 = 0; c0 < K; c0 += MM_KC) {
        int kc = (int)(K - c0 < MM_KC ? K - c0 : MM_KC);
        int ld = ((kc + 15) & ~15) + 16;
        j->k->dequant(w, r0, nr, c0, kc, buf, ld);
        j->k->tile(buf, ld, nr, j->x + t0 * K + c0, K, nt, kc, j->y + t0 * R + r0, R, c0 > 0 || j->acc);
    }
}

/* Q8 activations: decode rows [task * rows_per_task, ...), or prefill MM_RB rows x a token block. */
static void q_run(const mm_job *j, int task) {
    const int64_t R = j->w->rows;
    int64_t r0, r1, t0, t1;
    if (j->gemv) {
        r0 = (int64_t)task * j->rows_per_task, r1 = r0 + j->rows_per_task, t0 = 0, t1 = 1;
    } else {
        int64_t rb = task % j->n_rb, tbi = task / j->n_rb;
        r0 = rb * MM_RB, r1 = r0 + MM_RB, t0 = tbi * j->tb, t1 = t0 + j->tb;
        if (t1 > j->n) t1 = j->n;
    }
    if (r1 > R) r1 = R;
    qk_act a[16];
    for (int64_t tb = t0; tb < t1; tb += 16) {
        int nt = (int)(t1 - tb < 16 ? t1 - tb : 16);
        for (int t = 0; t < nt; t++)
            a[t] = (qk_act){j->xq + (tb + t) * j->xq_stride, j->xd + (tb + t) * j->xs_stride, j->xm + (tb + t) * j->xs_stride,
                            j->xq2 ? j->xq2 + (tb + t) * j->xq_stride : NULL};
        if (j->qk->gemm && nt > 1) j->qk->gemm(j->w, a, nt, j->y + tb * R, R, r0, r1, j->acc);
        else
            for (int t = 0; t < nt; t++) j->qk->gemv(j->w, &a[t], j->y + (tb + t) * R, r0, r1, j->acc);
    }
}

static void job_task(void *ctx, int task, int tid) {
    const mm_job *j = ctx;
    if (j->qk) q_run(j, task);
    else if (j->gemv) gemv_run(j, task);
    else tile_run(j, task);
}

/* Plans one matmul: kernel path and task split. Returns the number of tasks
 * (0: nothing to run). *xs_need gets the F32 scratch the job needs (F8 decode
 * takes x pre-scaled, MM_F8_XSCALE), in floats. */
static int plan(const mm_kernels *k, const qk_kernels *qk, int planes, int nth, float *y, const float *x, int n,
                const ms_qmat *w, int acc, mm_job *j, int64_t *xs_need) {
    *j = (mm_job){.k = k, .w = w, .x = x, .y = y, .n = n, .acc = acc, .planes = planes};
    *xs_need = 0;
    if (n <= 0 || w->rows <= 0) return 0;
    if (w->cols <= 0) {
        if (!acc) memset(y, 0, (size_t)n * (size_t)w->rows * sizeof *y);
        return 0;
    }
    /* Q16 (two planes) is for decode: prefill keeps the F32 tiles, which are as fast (AVX-512) or
     * faster (AVX2, no multi-token kernel) than two planes per token, and exact */
    if (qk && planes == 2 && n > 1) qk = NULL;
    if (qk && ms_qk_ok(w)) {
        int64_t kp = (w->cols + QK_PAD - 1) / QK_PAD * QK_PAD;
        j->qk = qk;
        j->xq_stride = kp;
        j->xs_stride = (kp / 32 + QK_DPAD - 1) / QK_DPAD * QK_DPAD;
        *xs_need = (int64_t)n * (planes * kp / 4 + 2 * j->xs_stride); /* in floats: the int8s (each plane), then d, then m */
        if (n == 1) {
            uint64_t bytes = ms_qmat_bytes(w), row_bytes = bytes / (uint64_t)w->rows + 1;
            int64_t tasks = (int64_t)nth * 8;
            if ((int64_t)(bytes >> 20) > tasks) tasks = (int64_t)(bytes >> 20);
            int64_t rpt = (w->rows + tasks - 1) / tasks, min_rows = (int64_t)((32u << 10) / row_bytes) + 1;
            if (rpt < min_rows) rpt = min_rows;
            rpt = (rpt + 3) & ~(int64_t)3;
            j->gemv = 1;
            j->rows_per_task = rpt;
            j->n_tasks = (int)((w->rows + rpt - 1) / rpt);
            return j->n_tasks;
        }
        j->n_rb = (w->rows + MM_RB - 1) / MM_RB;
        int tb = n;
        while (j->n_rb * ((n + tb - 1) / tb) < 4 * nth && tb > 8) tb = (((tb + 1) / 2) + 3) & ~3;
        j->tb = tb;
        j->n_tasks = (int)(j->n_rb * ((n + tb - 1) / tb));
        return j->n_tasks;
    }
    if (n == 1 && k->gemv_ok(w)) {
        uint64_t bytes = ms_qmat_bytes(w), row_bytes = bytes / (uint64_t)w->rows + 1;
        int64_t tasks = (int64_t)nth * 8;
        if ((int64_t)(bytes >> 20) > tasks) tasks = (int64_t)(bytes >> 20);
        int64_t rpt = (w->rows + tasks - 1) / tasks;
        int64_t min_rows = (int64_t)((32u << 10) / row_bytes) + 1;
        if (rpt < min_rows) rpt = min_rows;
        rpt = (rpt + 3) & ~(int64_t)3;
        j->gemv = 1;
        j->rows_per_task = rpt;
        j->n_tasks = (int)((w->rows + rpt - 1) / rpt);
        if (w->dtype == MS_DT_F8_E4M3) *xs_need = w->cols;
        else if (k->x_need) *xs_need = k->x_need(w);
        return j->n_tasks;
    }
    j->n_rb = (w->rows + MM_RB - 1) / MM_RB;
    int tb = n;
    while (j->n_rb * ((n + tb - 1) / tb) < 4 * nth && tb > 8) tb = (((tb + 1) / 2) + 3) & ~3;
    j->tb = tb;
    j->n_tasks = (int)(j->n_rb * ((n + tb - 1) / tb));
    return j->n_tasks;
}

/* Points an F8 decode job at x * MM_F8_XSCALE written into xs (another dtype whose
 * table has x_prep: at its rewrite of x); without
 * scratch (xs NULL: allocation failed) the job takes the tile path instead. */
static void use_scratch(mm_job *j, float *xs, int nth) {
    if (!xs && j->qk) { /* Q8 without scratch: the F32 path */
        int64_t need;
        plan(j->k, NULL, 1, nth, j->y, j->x, j->n, j->w, j->acc, j, &need);
        if (!need) return;
    }
    if (!xs) {
        int64_t ignore;
        const mm_kernels *k = j->k;
        plan(&ms_kernels_scalar, NULL, 1, nth, j->y, j->x, j->n, j->w, j->acc, j, &ignore); /* gemv_ok is 0 there */
        j->k = k;
        return;
    }
    if (j->qk) {
        const int64_t K = j->w->cols;
        int8_t *q = (int8_t *)xs, *q2 = j->planes == 2 ? q + (int64_t)j->n * j->xq_stride : NULL;
        float *d = xs + (int64_t)j->n * j->planes * (j->xq_stride / 4), *m = d + (int64_t)j->n * j->xs_stride;
        memset(d, 0, (size_t)j->n * 2 * (size_t)j->xs_stride * sizeof *d); /* the padding past kp / 32 */
        for (int t = 0; t < j->n; t++)
            (j->qk->quant ? j->qk->quant : ms_qk_quant)(j->x + (int64_t)t * K, K, j->qk->gb, ms_qk_layout(j->w),
                                                        q + t * j->xq_stride, q2 ? q2 + t * j->xq_stride : NULL,
                                                        d + t * j->xs_stride, m + t * j->xs_stride);
        j->xq = q, j->xq2 = q2, j->xd = d, j->xm = m;
        return;
    }
    if (j->w->dtype == MS_DT_F8_E4M3)
        for (int64_t c = 0; c < j->w->cols; c++) xs[c] = j->x[c] * MM_F8_XSCALE;
    else j->k->x_prep(j->w, j->x, xs);
    j->x = xs;
}

/* The Q8-activation table for pool, or NULL when its activations are F32 (Q16: the same
 * table, two planes). */
static const qk_kernels *qk_of(const ms_pool *pool) {
    return (ms_cpu_activations_of(pool) & (MS_ACT_Q8 | MS_ACT_Q16)) ? ms_qk_for(ms_cpu_isa_of(pool)) : NULL;
}
static int planes_of(const ms_pool *pool) { return (ms_cpu_activations_of(pool) & MS_ACT_Q16) ? 2 : 1; }

static void run(ms_pool *pool, float *y, const float *x, int n, const ms_qmat *w, int acc) {
    const mm_kernels *k = ms_cpu_mm_kernels_of(pool);
    int nth = ms_pool_size(pool);
    mm_job j;
    int64_t need;
    if (!plan(k, qk_of(pool), planes_of(pool), nth, y, x, n, w, acc, &j, &need)) return;
    float xs_stack[4096], *xs = NULL;
    if (need) {
        xs = need <= 4096 ? xs_stack : malloc((size_t)need * sizeof *xs);
        use_scratch(&j, xs, nth);
    }
    ms_pool_run(pool, j.n_tasks, job_task, &j);
    if (xs != xs_stack) free(xs);
}

void ms_matmul(ms_pool *pool, float *y, const float *x, int n, const ms_qmat *w) { run(pool, y, x, n, w, 0); }
void ms_matmul_acc(ms_pool *pool, float *y, const float *x, int n, const ms_qmat *w) { run(pool, y, x, n, w, 1); }

/* ---- several matmuls in one pool run ---- */

#define MANY_MAX 64

typedef struct {
    mm_job jobs[MANY_MAX];
    int first[MANY_MAX + 1]; /* task index where each job starts */
    int count;
} many_ctx;

static void many_task(void *ctx, int task, int tid) {
    const many_ctx *m = ctx;
    int lo = 0, hi = m->count - 1; /* the last job whose first task <= task */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (m->first[mid] <= task) lo = mid;
        else hi = mid - 1;
    }
    job_task((void *)&m->jobs[lo], task - m->first[lo], tid);
}

void ms_matmul_many(ms_pool *pool, const ms_matmul_job *jobs, int count) {
    const mm_kernels *k = ms_cpu_mm_kernels_of(pool);
    const qk_kernels *qk = qk_of(pool);
    const int planes = planes_of(pool);
    int nth = ms_pool_size(pool);
    many_ctx m;
    for (int base = 0; base < count; base += MANY_MAX) {
        int c = count - base < MANY_MAX ? count - base : MANY_MAX;
        int64_t need[MANY_MAX], total_need = 0;
        m.count = 0;
        for (int i = 0; i < c; i++) {
            const ms_matmul_job *in = &jobs[base + i];
            mm_job j;
            if (!plan(k, qk, planes, nth, in->y, in->x, in->n, in->w, in->acc, &j, &need[m.count])) continue;
            total_need += need[m.count];
            m.jobs[m.count++] = j;
        }
        float xs_stack[4096], *xs = NULL;
        if (total_need) xs = total_need <= 4096 ? xs_stack : malloc((size_t)total_need * sizeof *xs);
        int64_t off = 0;
        int total = 0;
        for (int i = 0; i < m.count; i++) {
            if (need[i]) {
                use_scratch(&m.jobs[i], xs ? xs + off : NULL, nth);
                off += need[i];
            }
            m.first[i] = total;
            total += m.jobs[i].n_tasks;
        }
        m.first[m.count] = total;
        if (total > 0) ms_pool_run(pool, total, many_task, &m);
        if (xs != xs_stack) free(xs);
    }
}
