/* test_gpu.h — what the GPU tests' files share (test_gpu.c defines it): the device and the CPU
 * twin, the random stream, random weights of every stored dtype and the dot-product bound (see
 * test_gpu.c's head for the tolerances), and the per-file test runner. */
#ifndef MS_TEST_GPU_H
#define MS_TEST_GPU_H

#include <stdint.h>
#include <stdio.h>

#include "backend/gpu/gpu.h"
#include "core/backend.h"
#include "core/qmat.h"
#include "util/dtype.h"

#define U32 (1.0 / 16777216.0)

/* GPU 0 for the kernels of gpu.h, opened at the first call (prints the device; exits when it cannot). */
ms_gpu *gpu(void);
/* The CPU backend: the twin of every op (single-threaded), its scratch reserved for the
 * largest shapes of the tests. */
ms_backend *cpu(void);

/* MS_GPU_TEST_ONLY=SUBSTRING runs only the tests whose name contains it (short device sessions). */
int skip(const char *name);
#define SKIP_UNLESS_SELECTED(name) \
    do {                           \
        if (skip(name)) return;    \
    } while (0)

/* The tests' random stream (xorshift64, one fixed seed): raw, uniform in (0, 1), standard normal,
 * and a malloc'd vector of n normals times s. */
uint64_t rnd(void);
double unif(void);
float gauss(void);
float *randv(int64_t n, float s);

/* A host weight of a dtype with random values; scales per block; zp: I4 with random zero
 * points (asymmetric, core/qmat.h). */
typedef struct {
    const char *name;
    ms_dtype dt, sdt;
    int brow, bcol;
    int zp;
} wkind;
extern const wkind K_F32, K_F16, K_BF16, K_FP8, K_FP8B, K_F4, K_Q8, K_Q8F, K_I4, K_I4H, K_I4G8, K_I4Z, K_I4ZH;

/* A host weight of kind k, rows x cols, random values (and scales per block, zero points);
 * free_w frees it. */
ms_qmat make_w(const wkind *k, int64_t rows, int64_t cols);
void free_w(ms_qmat *w);
/* Per-element bound for y = W x through the GPU: (N/W + log2 W + 3) u sum_c |w_rc x_c|:
 * l1[t * rows + r] = sum_c |w_rc x_tc| for the n tokens of x; dot_bound(N) the factor. */
void l1_rows(const ms_qmat *w, const float *x, int n, double *l1);
double dot_bound(int64_t N);

/* Defines runner(pass, fail): runs the tests of the file it is in (test.h's registry is per
 * file) as TEST_MAIN does, and adds the file's counts to *pass and *fail. */
#define TEST_GPU_RUNNER(runner)                                                           \
    void runner(int *pass, int *fail) {                                                   \
        for (int i = 0; i < ms_ntests_; i++) {                                            \
            int before = ms_fail_;                                                        \
            ms_tests_[i].fn();                                                            \
            if (ms_fail_ != before) fprintf(stderr, "  in test %s\n", ms_tests_[i].name); \
        }                                                                                 \
        *pass += ms_pass_, *fail += ms_fail_;                                             \
    }
/* test_gpu_kernels.c: the kernels of gpu.h against their twins; test_gpu_backend.c: the GPU
 * backend op by op against the CPU backend. */
void test_gpu_run_kernels(int *pass, int *fail);
void test_gpu_run_backend(int *pass, int *fail);
/* test_gpu_step.c: the GPU backend's replayable decode step and PDL through whole decodes. */
void test_gpu_run_step(int *pass, int *fail);
/* test_gpu_backend.c's GPU backend and buffers (also used by test_gpu_step.c): gbe() the backend
 * (opened and reserved at the first call; exits when it cannot), bup a device copy of n host
 * floats, bget a malloc'd host copy of n device floats, same: device d := host h, gfree frees a
 * device buffer; maxabs the largest |v|, cmpv checks got against ref within rel |ref| + abs
 * elementwise (NaN matches NaN) and prints the worst ratio. */
ms_backend *gbe(void);
float *bup(const float *h, int64_t n);
float *bget(const float *d, int64_t n);
void same(float *d, const float *h, int64_t n);
void gfree(void *d);
double maxabs(const float *v, int64_t n);
void cmpv(const char *what, const float *got, const float *ref, int64_t n, double rel, double abs_);
/* test_gpu_comm.c: several GPU backends in one process (the comm, a split engine). */
void test_gpu_run_comm(int *pass, int *fail);
/* test_gpu_prefill.c: the tiled prefill attention (attn_prefill.h) against the CPU twin, and its timing. */
void test_gpu_run_prefill(int *pass, int *fail);
/* test_gpu_router.c: ms_gpu_router_route's kernel over the families' router geometries. */
void test_gpu_run_router(int *pass, int *fail);

#endif
