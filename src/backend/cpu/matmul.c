/* matmul.c — CPU matmul dispatch (ms_matmul / ms_matmul_acc).
 *
 * n == 1 (decode): memory-bound matvec; rows are split into chunks handed to
 * the pool, each chunk streamed once through a dtype-specific kernel that
 * dequantizes in registers (kernels_avx512.c, kernels_avx2.c).
 * n > 1 (prefill): cache-blocked. A task owns MM_RB rows x a block of tokens;
 * for each MM_KC-column slice it dequantizes the weight tile once into an F32
 * buffer on its stack and multiplies it with every token of the block, so each
 * weight byte is read and converted once per token block, not once per token.
 * Accumulation is F32 throughout; activations are never rounded. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"

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
    int64_t rows_per_task; /* gemv */
    int64_t n_rb;          /* tile: row blocks */
    int tb;                /* tile: tokens per block */
} mm_job;

static void gemv_task(void *ctx, int task, int tid) {
    const mm_job *j = ctx;
    int64_t r0 = (int64_t)task * j->rows_per_task, r1 = r0 + j->rows_per_task;
    if (r1 > j->w->rows) r1 = j->w->rows;
    j->k->gemv(j->w, j->x, j->y, r0, r1, j->acc);
}

static void tile_task(void *ctx, int task, int tid) {
    const mm_job *j = ctx;
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

static void run(ms_pool *pool, float *y, const float *x, int n, const ms_qmat *w, int acc) {
    if (n <= 0 || w->rows <= 0) return;
    if (w->cols <= 0) {
        if (!acc) memset(y, 0, (size_t)n * (size_t)w->rows * sizeof *y);
        return;
    }
    const mm_kernels *k = ms_cpu_kernels();
    int nth = ms_pool_size(pool);
    mm_job j = {.k = k, .w = w, .x = x, .y = y, .n = n, .acc = acc};
    if (n == 1 && k->gemv_ok(w)) {
        uint64_t bytes = ms_qmat_bytes(w), row_bytes = bytes / (uint64_t)w->rows + 1;
        int64_t tasks = (int64_t)nth * 8;
        if ((int64_t)(bytes >> 20) > tasks) tasks = (int64_t)(bytes >> 20);
        int64_t rpt = (w->rows + tasks - 1) / tasks;
        int64_t min_rows = (int64_t)((32u << 10) / row_bytes) + 1;
        if (rpt < min_rows) rpt = min_rows;
        rpt = (rpt + 3) & ~(int64_t)3;
        j.rows_per_task = rpt;
        float xs_stack[4096], *xs = NULL;
        if (w->dtype == MS_DT_F8_E4M3) { /* see MM_F8_XSCALE */
            xs = w->cols <= 4096 ? xs_stack : malloc((size_t)w->cols * sizeof *xs);
            if (!xs) goto tiles; /* the tile path needs no scratch */
            for (int64_t c = 0; c < w->cols; c++) xs[c] = x[c] * MM_F8_XSCALE;
            j.x = xs;
        }
        ms_pool_run(pool, (int)((w->rows + rpt - 1) / rpt), gemv_task, &j);
        if (xs != xs_stack) free(xs);
        return;
    }
tiles:
    j.n_rb = (w->rows + MM_RB - 1) / MM_RB;
    int tb = n;
    while (j.n_rb * ((n + tb - 1) / tb) < 4 * nth && tb > 8) tb = (((tb + 1) / 2) + 3) & ~3;
    j.tb = tb;
    ms_pool_run(pool, (int)(j.n_rb * ((n + tb - 1) / tb)), tile_task, &j);
}

void ms_matmul(ms_pool *pool, float *y, const float *x, int n, const ms_qmat *w) { run(pool, y, x, n, w, 0); }
void ms_matmul_acc(ms_pool *pool, float *y, const float *x, int n, const ms_qmat *w) { run(pool, y, x, n, w, 1); }
