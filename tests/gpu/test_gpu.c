/* test_gpu.c — every GPU op against its CPU twin on random inputs of real shapes.
 * Built by `make check` (compile only) and `make gpu`, run by `make gpu-check` on a machine
 * with a GPU. Twins: ms_matmul_ref / ms_rmsnorm_ref (ops_ref.c), ms_rope_parse +
 * ms_rope_cos_sin + ms_rope_apply (model/rope.c), and for everything else the
 * CPU backend's own ops (backend/cpu, ms_backend_cpu_create): the kernels of gpu.h against
 * the CPU's glu / route / attn_gqa, and the GPU backend (backend_gpu.h) op by op against the
 * CPU backend on the same inputs (the backend_* tests).
 *
 * Tolerances are derived, not tuned. u = 2^-24 (F32 unit roundoff). The GPU sums
 * a dot product of N terms as N/W sequential per-lane sums (W = warp lanes)
 * followed by a log2(W)-level tree, so its error is at most (N/W + log2 W + 3) u
 * * sum|terms| (Higham's bound for recursive summation, +3 for the product, the
 * block scale and the final store); the twins accumulate in double, so their
 * own error is a single rounding; where the CPU backend is the twin, its own vector
 * kernels' error is added (tests/unit/test_ops.c holds them to 2e-6 relative of their
 * scalar twins). Each check prints the worst ratio
 * error / bound; a wrong element, row or scale breaks the bound by orders of
 * magnitude.
 *
 * The checks live in test_gpu_kernels.c (the kernels of gpu.h against their twins) and
 * test_gpu_backend.c (the GPU backend op by op against the CPU backend; test_gpu_step.c its decode
 * step), with test_gpu_comm.c, test_gpu_prefill.c, test_gpu_router.c; this file holds the
 * helpers they share (test_gpu.h) and main. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "backend/gpu/gpu.h"
#include "engine/engine_internal.h"
#include "model/config.h"
#include "ops/ops.h"
#include "backend/cpu/backend_cpu.h"
#include "backend/gpu/backend_gpu.h"
#include "backend/cpu/linear_attn.h"
#include "test_gpu.h"

static ms_gpu *g_gpu;
static int g_warp = 32;
ms_gpu *gpu(void) {
    if (g_gpu) return g_gpu;
    ms_err err = {0};
    if (ms_gpu_open(0, &g_gpu, &err)) {
        fprintf(stderr, "test_gpu: cannot open GPU 0: %s\n", err.msg);
        exit(1);
    }
    ms_gpu_info info;
    if (ms_gpu_info_get(g_gpu, &info, &err) == MS_OK) {
        g_warp = info.warp_size;
        printf("device: %s (%s %d.%d, %d SMs, warp %d, %.1f GiB)\n", info.name, info.backend, info.cc_major,
               info.cc_minor, info.sm_count, info.warp_size, info.mem_total / 1073741824.0);
    }
    return g_gpu;
}

/* The CPU backend: the twin of every op (single-threaded), its scratch reserved for the
 * largest shapes below. */
static ms_backend *g_cpu;
ms_backend *cpu(void) {
    if (g_cpu) return g_cpu;
    ms_err err = {0};
    ms_config c;
    memset(&c, 0, sizeof c);
    c.hidden = 8192, c.head_dim = 512, c.v_head_dim = 512, c.kv_lora_rank = 512, c.qk_nope_dim = 128;
    c.qk_rope_dim = 64, c.n_experts = 1024, c.n_layers = 1;
    if (ms_backend_cpu_create(NULL, &g_cpu, &err) || g_cpu->ops->reserve(g_cpu, &c, 9000, 32, &err)) {
        fprintf(stderr, "test_gpu: CPU backend: %s\n", err.msg);
        exit(1);
    }
    return g_cpu;
}

/* ------------------------------------------------------------ helpers */

/* MS_GPU_TEST_ONLY=SUBSTRING runs only the tests whose name contains it (short device sessions). */
int skip(const char *name) {
    const char *only = getenv("MS_GPU_TEST_ONLY");
    return only && *only && !strstr(name, only);
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
uint64_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}
double unif(void) { return ((rnd() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
float gauss(void) { return (float)(sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif())); }
float *randv(int64_t n, float s) {
    float *v = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) v[i] = gauss() * s;
    return v;
}

const wkind K_F32 = {"f32", MS_DT_F32, 0, 0, 0, 0}, K_F16 = {"f16", MS_DT_F16, 0, 0, 0, 0},
                   K_BF16 = {"bf16", MS_DT_BF16, 0, 0, 0, 0},
                   K_FP8 = {"fp8_e4m3 (f32 128x128 scales)", MS_DT_F8_E4M3, MS_DT_F32, 128, 128, 0},
                   K_FP8B = {"fp8_e4m3 (bf16 128x128 scales)", MS_DT_F8_E4M3, MS_DT_BF16, 128, 128, 0},
                   K_F4 = {"mxfp4", MS_DT_F4, MS_DT_F8_E8M0, 1, 32, 0},
                   K_Q8 = {"q8 (bf16 1x32 scales)", MS_DT_Q8, MS_DT_BF16, 1, 32, 0},
                   K_Q8F = {"q8 (f32 1x64 scales)", MS_DT_Q8, MS_DT_F32, 1, 64, 0},
                   K_I4 = {"int4 (bf16 1x32 scales)", MS_DT_I4, MS_DT_BF16, 1, 32, 0},
                   K_I4H = {"int4 (f16 1x128 scales)", MS_DT_I4, MS_DT_F16, 1, 128, 0},
                   K_I4G8 = {"int4 (bf16 1x8 scales)", MS_DT_I4, MS_DT_BF16, 1, 8, 0},
                   K_I4Z = {"int4 asym (bf16 1x32, zero points)", MS_DT_I4, MS_DT_BF16, 1, 32, 1},
                   K_I4ZH = {"int4 asym (f16 1x128, zero points)", MS_DT_I4, MS_DT_F16, 1, 128, 1};

ms_qmat make_w(const wkind *k, int64_t rows, int64_t cols) {
    ms_qmat w = {.dtype = k->dt, .rows = rows, .cols = cols};
    int64_t n = rows * cols;
    size_t bytes = (size_t)(n * ms_dtype_bits(k->dt) / 8);
    uint8_t *d = malloc(bytes + 16);
    switch (k->dt) {
    case MS_DT_F32:
        for (int64_t i = 0; i < n; i++) ((float *)d)[i] = gauss() * 0.05f;
        break;
    case MS_DT_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i] = ms_f32_to_f16(gauss() * 0.05f);
        break;
    case MS_DT_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i] = ms_f32_to_bf16(gauss() * 0.05f);
        break;
    case MS_DT_F8_E4M3:
        for (int64_t i = 0; i < n; i++) d[i] = ms_f32_to_fp8_e4m3(gauss() * 64.0f);
        break;
    case MS_DT_Q8: /* |q| <= 127 (core/qmat.h) */
        for (int64_t i = 0; i < n; i++) d[i] = (uint8_t)(int8_t)((int)(rnd() % 255) - 127);
        break;
    default: /* F4, I4: every nibble */
        for (size_t i = 0; i < bytes; i++) d[i] = (uint8_t)rnd();
    }
    w.data = d;
    if (k->sdt) {
        int64_t sr = (rows + k->brow - 1) / k->brow, sc = (cols + k->bcol - 1) / k->bcol;
        w.brow = k->brow, w.bcol = k->bcol, w.scale_dtype = k->sdt;
        void *s = malloc((size_t)(sr * sc * 4));
        for (int64_t i = 0; i < sr * sc; i++) {
            float v = ldexpf(1.0f + (float)unif(), -(int)(rnd() % 8) - 7); /* 2^-14 .. 2^-6 */
            if (k->sdt == MS_DT_F32) ((float *)s)[i] = v;
            else if (k->sdt == MS_DT_BF16) ((uint16_t *)s)[i] = ms_f32_to_bf16(v);
            else if (k->sdt == MS_DT_F16) ((uint16_t *)s)[i] = ms_f32_to_f16(v);
            else ((uint8_t *)s)[i] = (uint8_t)(118 + rnd() % 8); /* 2^-9 .. 2^-2 */
        }
        w.scale = s;
    }
    if (k->zp) { /* the packed zero points: int32 [ceil(rows/8), ceil(cols/bcol)], every nibble */
        int64_t nz = (rows + 7) / 8 * ((cols + k->bcol - 1) / k->bcol);
        uint32_t *z = malloc((size_t)nz * 4);
        for (int64_t i = 0; i < nz; i++) z[i] = (uint32_t)rnd();
        w.zero = z;
    }
    return w;
}
void free_w(ms_qmat *w) {
    free((void *)w->data);
    free((void *)w->scale);
    free((void *)w->zero);
}

/* Per-element bound for y = W x through the GPU: (N/W + log2 W + 3) u sum_c |w_rc x_c|. */
void l1_rows(const ms_qmat *w, const float *x, int n, double *l1) {
    float *row = malloc((size_t)w->cols * 4);
    for (int64_t r = 0; r < w->rows; r++) {
        ms_qmat_row(w, r, row);
        for (int t = 0; t < n; t++) {
            double s = 0;
            for (int64_t c = 0; c < w->cols; c++) s += fabs((double)row[c] * x[(int64_t)t * w->cols + c]);
            l1[(int64_t)t * w->rows + r] = s;
        }
    }
    free(row);
}
double dot_bound(int64_t N) { return ((double)N / g_warp + log2((double)g_warp) + 3) * U32; }

/* test.h keeps its registry and counts per file: each file of checks runs its own tests
 * (TEST_GPU_RUNNER) and main adds their counts up. */
int main(void) {
    int pass = 0, fail = 0;
    test_gpu_run_kernels(&pass, &fail);
    test_gpu_run_backend(&pass, &fail);
    test_gpu_run_step(&pass, &fail);
    test_gpu_run_comm(&pass, &fail);
    test_gpu_run_prefill(&pass, &fail);
    test_gpu_run_router(&pass, &fail);
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
