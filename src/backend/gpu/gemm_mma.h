/* gemm_mma.h — the grouped expert GEMM on tensor cores straight from the stored
 * weights (gemm_mma.cu; CUDA, compute capability >= 8.0): the routed-experts path of
 * gemm.cu without the dequantized copies, the split activation rows and the BLAS.
 *
 * A block computes a 128-row x 32-pair (or 16-pair) tile of one matrix of one expert for the pairs
 * of one item: per 32-wide K step it loads the weight tile as stored (BF16; FP8 E4M3,
 * whose values are exact in BF16 unscaled; MXFP4, e2m1 times its E8M0 scale, exact in
 * BF16) into shared memory as BF16, and the pairs' F32 activation rows (FP8: times the
 * tile's block scale, one F32 rounding, as gemm.cu's row-block form) split into `parts`
 * BF16 parts (3: exact, the F32-activation level; 2: 2^-16 relative; 1: 2^-8), then
 * mma.sync m16n8k16 BF16 -> F32: the hi part into one accumulator, the others into a
 * second, summed at the end (second + first). */
#ifndef MS_GPU_GEMM_MMA_H
#define MS_GPU_GEMM_MMA_H

#include <stdint.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MS_MMA_MT 128 /* rows of a block's tile: FP8 scale row blocks must be a multiple of it */
#define MS_MMA_NT 32  /* pairs of a tile at most (ms_mma_gemm.nt: 16 or 32) */
#define MS_MMA_KT 32  /* K step: K of both stages a multiple of it, scale column blocks too */

enum { MS_MMA_BF16, MS_MMA_FP8, MS_MMA_F4 };

/* An item's weights and scales (gate, up, down; up NULL when fused), device pointers,
 * 16-byte aligned rows (the caller checks). */
typedef struct {
    const void *w[3];
    const void *s[3];
} ms_mma_item;

/* A tile of pairs: group pair indices p0 .. p0 + np - 1 (np <= ms_mma_gemm.nt) of item `item`. */
typedef struct {
    int item, p0, np, unused;
} ms_mma_tile;

/* One stage's launch. Pair p's activation row is x + xrow(p) ldx (xrow(p) = xrow[p xstride],
 * p itself when xrow is NULL), its output column ocol[p ostride] (p when NULL); matrix mt of
 * the stage (mt < nmat: item w[mat0 + mt]) writes out[(mt cols + ocol) M + r] for its M rows
 * (accum: adds to it). The
 * weight: wdt (MS_MMA_*), rows of K values; FP8: scales sdt (1 F32, 2 BF16) in blocks
 * of brow rows x 2^bshift columns, scols per scale row; F4: E8M0 scales per 2^bshift
 * columns of each row, scols per row. items / tiles / xrow / ocol are device arrays. */
typedef struct {
    const ms_mma_item *items;
    const ms_mma_tile *tiles;
    int ntiles;
    const int *xrow, *ocol;
    int xstride, ostride;
    const float *x;
    int64_t ldx;
    float *out;
    int64_t cols, M, K;
    int mat0, nmat, wdt, sdt, brow, bshift, parts, nt; /* nt: pairs per tile, 16 or 32 */
    int accum;
    int db; /* two shared buffers (one barrier per K step) instead of one */
    int64_t scols;
} ms_mma_gemm;

/* Launches one stage on stream (a gpuStream_t) and checks the launch. MS_ERR_UNSUPPORTED
 * for a build without the kernel (HIP, or no device code for sm_80+), MS_ERR_SHAPE for
 * K not a multiple of MS_MMA_KT, parts outside 1..3 or nt not 16 / 32. */
int ms_gpu_mma_gemm(void *stream, const ms_mma_gemm *a, ms_err *err);
/* 1 when this build has the kernel for the current device (CUDA device code for sm_80+), else 0. */
int ms_gpu_mma_gemm_ok(void);

#ifdef __cplusplus
}
#endif

#endif
