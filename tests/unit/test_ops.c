/* test_ops.c — vectorized rmsnorm, softmax, swiglu, dot and axpy on every
 * dispatch path against the scalar twins (libm expf, double accumulation). */
#include <stdint.h>
#include <stdlib.h>

#include "backend/cpu/kernels.h"
#include "ops/ops.h"
#include "test.h"

static uint64_t g_rng = 12345;
static float frand(void) {
    return (float)((ms_test_xorshift(&g_rng) >> 40) / 16777216.0 * 2.0 - 1.0);
}

static const int k_sizes[] = {1, 7, 16, 33, 100, 1000, 7168};
#define NS (int)(sizeof k_sizes / sizeof *k_sizes)

static int close_rel(double got, double want, double rel, double abs_tol) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= rel * fabs(want) + abs_tol;
}

/* The kernel table under test (every ISA in turn); the public entry points
 * ms_softmax, ... go through the process's table (checked below). */
static const mm_kernels *g_k;

static void each_isa(void (*fn)(ms_cpu_isa)) {
    for (int i = 0; i <= (int)ms_cpu_isa_best(); i++) {
        g_k = ms_cpu_kernels_for((ms_cpu_isa)i);
        fn((ms_cpu_isa)i);
    }
}

static void t_softmax(ms_cpu_isa isa) {
    for (int si = 0; si < NS; si++) {
        int d = k_sizes[si];
        float *a = malloc(d * sizeof *a), *b = malloc(d * sizeof *b);
        for (int i = 0; i < d; i++) a[i] = b[i] = frand() * 30;
        if (d > 3) a[1] = b[1] = -INFINITY; /* masked position */
        g_k->softmax(a, d);
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
        g_k->swiglu(o, g, u, d);
        ms_swiglu_ref(r, g, u, d);
        int bad = 0;
        for (int i = 0; i < d; i++) bad += !close_rel(o[i], r[i], 2e-6, 1e-35);
        CHECK_MSG(bad == 0, "swiglu isa=%s d=%d: %d elements off", ms_cpu_isa_name(isa), d, bad);
        g_k->swiglu(g, g, u, d); /* in place */
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
            g_k->rmsnorm(y, x, wi ? w : NULL, n, d, 1e-6f);
            ms_rmsnorm_ref(r, x, wi ? w : NULL, n, d, 1e-6f);
            for (int i = 0; i < n * d; i++) bad += !close_rel(y[i], r[i], 2e-6, 1e-30);
        }
        g_k->rmsnorm(x, x, w, n, d, 1e-6f); /* in place */
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
        float got = g_k->dot(a, b, d), want = ms_dot_ref(a, b, d);
        CHECK_MSG(fabs(got - want) <= 1e-6 * mag + 1e-30, "dot isa=%s d=%d: %g vs %g", ms_cpu_isa_name(isa), d, got, want);
        g_k->axpy(y, 0.37f, b, d);
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

/* The public entry points run the process's ISA (best, capped by MS_CPU_ISA). */
TEST(public_ops_use_process_isa) {
    g_k = ms_cpu_kernels_for(ms_cpu_isa_active());
    CHECK(g_k == ms_cpu_kernels() && g_k == ms_cpu_kernels_of(NULL));
    enum { D = 1000 };
    float a[D], b[D], c[D], y1[D], y2[D];
    for (int i = 0; i < D; i++) a[i] = y1[i] = y2[i] = frand() * 30, b[i] = frand(), c[i] = frand();
    CHECK(ms_dot(a, b, D) == g_k->dot(a, b, D));
    ms_softmax(y1, D), g_k->softmax(y2, D);
    CHECK(!memcmp(y1, y2, sizeof y1));
    ms_swiglu(y1, a, b, D), g_k->swiglu(y2, a, b, D);
    CHECK(!memcmp(y1, y2, sizeof y1));
    ms_rmsnorm(y1, a, c, 1, D, 1e-6f), g_k->rmsnorm(y2, a, c, 1, D, 1e-6f);
    CHECK(!memcmp(y1, y2, sizeof y1));
    ms_axpy(y1, 0.5f, b, D), g_k->axpy(y2, 0.5f, b, D);
    CHECK(!memcmp(y1, y2, sizeof y1));
}

TEST_MAIN()
