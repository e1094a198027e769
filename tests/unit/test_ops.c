/* test_ops.c — vectorized rmsnorm, softmax, swiglu, dot and axpy on every
 * dispatch path against the scalar twins (libm expf, double accumulation). */
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "ops/ops.h"
#include "test.h"

static uint64_t g_rng = 12345;
static float frand(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) / 16777216.0 * 2.0 - 1.0);
}

static const int k_sizes[] = {1, 7, 16, 33, 100, 1000, 7168};
#define NS (int)(sizeof k_sizes / sizeof *k_sizes)

static int close_rel(double got, double want, double rel, double abs_tol) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= rel * fabs(want) + abs_tol;
}

static void each_isa(void (*fn)(ms_cpu_isa)) {
    for (int i = 0; i <= (int)ms_cpu_isa_best(); i++) {
        CHECK(ms_cpu_set_isa((ms_cpu_isa)i, NULL) == MS_OK);
        fn((ms_cpu_isa)i);
    }
    ms_cpu_set_isa(ms_cpu_isa_best(), NULL);
}

static void t_softmax(ms_cpu_isa isa) {
    for (int si = 0; si < NS; si++) {
        int d = k_sizes[si];
        float *a = malloc(d * sizeof *a), *b = malloc(d * sizeof *b);
        for (int i = 0; i < d; i++) a[i] = b[i] = frand() * 30;
        if (d > 3) a[1] = b[1] = -INFINITY; /* masked position */
        ms_softmax(a, d);
        ms_softmax_ref(b, d);
        int bad = 0;
        for (int i = 0; i < d; i++) bad += !close_rel(a[i], b[i], 2e-6, 1e-30);
        CHECK_MSG(bad == 0, "softmax isa=%s d=%d: %d elements off", ms_cpu_isa_name(isa), d, bad);
        free(a), free(b);
    }
}

static void t_swiglu(ms_cpu_isa isa) {
    for (int si = 0; si < NS; si++) {
        int d = k_sizes[si];
        float *g = malloc(d * sizeof *g), *u = malloc(d * sizeof *u), *o = malloc(d * sizeof *o), *r = malloc(d * sizeof *r);
        for (int i = 0; i < d; i++) g[i] = frand() * (i % 3 ? 8 : 120), u[i] = frand() * 3;
        ms_swiglu(o, g, u, d);
        ms_swiglu_ref(r, g, u, d);
        int bad = 0;
        for (int i = 0; i < d; i++) bad += !close_rel(o[i], r[i], 2e-6, 1e-35);
        CHECK_MSG(bad == 0, "swiglu isa=%s d=%d: %d elements off", ms_cpu_isa_name(isa), d, bad);
        ms_swiglu(g, g, u, d); /* in place */
        bad = 0;
        for (int i = 0; i < d; i++) bad += !close_rel(g[i], r[i], 2e-6, 1e-35);
        CHECK_MSG(bad == 0, "swiglu in place isa=%s d=%d", ms_cpu_isa_name(isa), d);
        free(g), free(u), free(o), free(r);
    }
}

static void t_rmsnorm(ms_cpu_isa isa) {
    for (int si = 0; si < NS; si++) {
        int d = k_sizes[si], n = 3;
        float *x = malloc(n * d * sizeof *x), *w = malloc(d * sizeof *w), *y = malloc(n * d * sizeof *y),
              *r = malloc(n * d * sizeof *r);
        for (int i = 0; i < n * d; i++) x[i] = frand() * 5;
        for (int i = 0; i < d; i++) w[i] = 1 + frand();
        int bad = 0;
        for (int wi = 0; wi < 2; wi++) {
            ms_rmsnorm(y, x, wi ? w : NULL, n, d, 1e-6f);
            ms_rmsnorm_ref(r, x, wi ? w : NULL, n, d, 1e-6f);
            for (int i = 0; i < n * d; i++) bad += !close_rel(y[i], r[i], 2e-6, 1e-30);
        }
        ms_rmsnorm(x, x, w, n, d, 1e-6f); /* in place */
        for (int i = 0; i < n * d; i++) bad += !close_rel(x[i], r[i], 2e-6, 1e-30);
        CHECK_MSG(bad == 0, "rmsnorm isa=%s d=%d: %d elements off", ms_cpu_isa_name(isa), d, bad);
        free(x), free(w), free(y), free(r);
    }
}

static void t_dot_axpy(ms_cpu_isa isa) {
    for (int si = 0; si < NS; si++) {
        int d = k_sizes[si];
        float *a = malloc(d * sizeof *a), *b = malloc(d * sizeof *b), *y = malloc(d * sizeof *y), *z = malloc(d * sizeof *z);
        double mag = 0;
        for (int i = 0; i < d; i++) a[i] = frand(), b[i] = frand() * 4, y[i] = z[i] = frand(), mag += fabs(a[i] * b[i]);
        float got = ms_dot(a, b, d), want = ms_dot_ref(a, b, d);
        CHECK_MSG(fabs(got - want) <= 1e-6 * mag + 1e-30, "dot isa=%s d=%d: %g vs %g", ms_cpu_isa_name(isa), d, got, want);
        ms_axpy(y, 0.37f, b, d);
        ms_axpy_ref(z, 0.37f, b, d);
        int bad = 0;
        for (int i = 0; i < d; i++) bad += !close_rel(y[i], z[i], 1e-6, 1e-6);
        CHECK_MSG(bad == 0, "axpy isa=%s d=%d", ms_cpu_isa_name(isa), d);
        free(a), free(b), free(y), free(z);
    }
}

TEST(softmax_all_isas) { each_isa(t_softmax); }
TEST(swiglu_all_isas) { each_isa(t_swiglu); }
TEST(rmsnorm_all_isas) { each_isa(t_rmsnorm); }
TEST(dot_axpy_all_isas) { each_isa(t_dot_axpy); }

TEST_MAIN()
