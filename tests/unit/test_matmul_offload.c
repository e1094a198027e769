/* test_matmul_offload.c — ms_matmul_set_offload: ms_matmul, ms_matmul_acc and ms_matmul_many
 * hand products to an installed offload, use what it computes, fall back to the CPU when
 * it declines, and stop calling it once uninstalled. The fake offload computes with
 * ms_matmul_ref plus a marker, so the test can tell who computed each y. */
#include <stdlib.h>

#include "ops/ops.h"
#include "test.h"

static int g_calls, g_taken;
static int fake(void *ctx, float *y, const float *x, int n, const ms_qmat *w, int acc) {
    g_calls++;
    if (w->rows % 2) return 0; /* declines odd row counts */
    float *t = malloc((size_t)(n * w->rows) * 4);
    ms_matmul_ref(t, x, n, w);
    for (int64_t i = 0; i < n * w->rows; i++) y[i] = (acc ? y[i] : 0) + t[i] + *(float *)ctx;
    free(t);
    g_taken++;
    return 1;
}

static ms_qmat mk(int64_t rows, int64_t cols, float **buf) {
    *buf = malloc((size_t)(rows * cols) * 4);
    for (int64_t i = 0; i < rows * cols; i++) (*buf)[i] = (float)((i * 7919) % 13) / 13.0f - 0.5f;
    return (ms_qmat){.dtype = MS_DT_F32, .rows = rows, .cols = cols, .data = *buf};
}

TEST(offload_taken_declined_uninstalled) {
    float marker = 1000.0f, *b1, *b2, x[2 * 16], y1[2 * 8], y2[2 * 7], r1[2 * 8], r2[2 * 7];
    ms_qmat even = mk(8, 16, &b1), odd = mk(7, 16, &b2);
    for (int i = 0; i < 32; i++) x[i] = (float)i / 32.0f;
    ms_matmul_ref(r1, x, 2, &even);
    ms_matmul_ref(r2, x, 2, &odd);
    ms_matmul_set_offload(fake, &marker);
    ms_matmul(NULL, y1, x, 2, &even);
    ms_matmul(NULL, y2, x, 2, &odd);
    CHECK(g_calls == 2 && g_taken == 1);
    for (int i = 0; i < 16; i++) CHECK_NEAR(y1[i], r1[i] + marker, 1e-3);
    for (int i = 0; i < 14; i++) CHECK_NEAR(y2[i], r2[i], 1e-5); /* declined: the CPU's result, no marker */
    ms_matmul_acc(NULL, y1, x, 2, &even);
    for (int i = 0; i < 16; i++) CHECK_NEAR(y1[i], 2 * (r1[i] + marker), 1e-2);
    ms_matmul_job jobs[2] = {{y1, x, 2, &even, 0}, {y2, x, 2, &odd, 1}};
    ms_matmul_many(NULL, jobs, 2);
    CHECK(g_calls == 5 && g_taken == 3);
    for (int i = 0; i < 16; i++) CHECK_NEAR(y1[i], r1[i] + marker, 1e-3);
    for (int i = 0; i < 14; i++) CHECK_NEAR(y2[i], 2 * r2[i], 1e-5);
    ms_matmul_set_offload(NULL, NULL);
    ms_matmul(NULL, y1, x, 2, &even);
    CHECK(g_calls == 5);
    for (int i = 0; i < 16; i++) CHECK_NEAR(y1[i], r1[i], 1e-5);
    free(b1), free(b2);
}

TEST_MAIN()
