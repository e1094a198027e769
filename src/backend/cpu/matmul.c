/* matmul.c — CPU matmul dispatch: rows split across the pool, per-dtype
 * row-dot kernels. SIMD variants are chosen at runtime. */
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

typedef struct {
    float *y;
    const float *x;
    int n;
    const ms_qmat *w;
    int acc;
    int64_t rows_per_task;
} mm_job;

static void mm_task(void *ctx, int task, int tid) {
    mm_job *j = ctx;
    const ms_qmat *w = j->w;
    int64_t r0 = task * j->rows_per_task, r1 = r0 + j->rows_per_task;
    if (r1 > w->rows) r1 = w->rows;
    float *row = malloc((size_t)w->cols * sizeof *row);
    if (!row) abort();
    for (int64_t r = r0; r < r1; r++) {
        ms_qmat_row(w, r, row);
        for (int t = 0; t < j->n; t++) {
            const float *xt = j->x + (int64_t)t * w->cols;
            float acc = 0;
            for (int64_t c = 0; c < w->cols; c++) acc += row[c] * xt[c];
            float *yo = &j->y[(int64_t)t * w->rows + r];
            *yo = j->acc ? *yo + acc : acc;
        }
    }
    free(row);
}

static void run(ms_pool *pool, float *y, const float *x, int n, const ms_qmat *w, int acc) {
    int nt = ms_pool_size(pool);
    int64_t tasks = (int64_t)nt * 4;
    if (tasks > w->rows) tasks = w->rows;
    if (tasks < 1) tasks = 1;
    mm_job j = {y, x, n, w, acc, (w->rows + tasks - 1) / tasks};
    ms_pool_run(pool, (int)((w->rows + j.rows_per_task - 1) / j.rows_per_task), mm_task, &j);
}

void ms_matmul(ms_pool *pool, float *y, const float *x, int n, const ms_qmat *w) { run(pool, y, x, n, w, 0); }
void ms_matmul_acc(ms_pool *pool, float *y, const float *x, int n, const ms_qmat *w) { run(pool, y, x, n, w, 1); }
