/* qkern.h — internal to src/backend/cpu: the Q8-activation matmul path
 * (ms_cpu_set_activations MS_ACT_Q8). Activations are rounded to int8 per block
 * of 32 with an F32 scale; MXFP4 (e2m1 x 2 are the integers -12..12), INT4
 * (nibble - 8) and Q8 weights are multiplied with them in integers, one F32
 * scale product per block. Not a public interface. */
#ifndef MS_BACKEND_CPU_QKERN_H
#define MS_BACKEND_CPU_QKERN_H

#include "backend/cpu/kernels.h"

#define QK_BLOCK 32
/* A token's int8 activations are padded (zeros) to a multiple of this: the widest
 * group a kernel reads (AVX-512: 4 blocks). */
#define QK_PAD 128

/* Where column j of block b sits in a token's int8 buffer: blocks come in groups of
 * gb (the kernel's table says how many); a group holds its blocks' first halves
 * (16 bytes each, in block order), then their second halves. DEINT (MXFP4, INT4:
 * the low nibble is the even column) halves are the even and the odd columns; SPLIT
 * (Q8) halves are columns 0-15 and 16-31. Block order and group size change only
 * where the integers sit, not the sums. */
typedef enum { QK_DEINT = 0, QK_SPLIT = 1 } qk_layout;

static inline int64_t qk_pos(int64_t b, int j, int gb, qk_layout lay) {
    int h = lay == QK_DEINT ? (j & 1) : (j >> 4), i = lay == QK_DEINT ? (j >> 1) : (j & 15);
    return (b / gb) * (32 * gb) + h * (16 * gb) + (b % gb) * 16 + i;
}

/* One token's quantized activations: q (K rounded up to QK_PAD int8, zero past K),
 * d[b] the scale of block b, m[b] = d[b] * sum of block b's q; d and m hold a multiple
 * of QK_DPAD blocks, 0 past K (the kernels load them 16 at a time without masks).
 * Two planes (MS_ACT_Q16, q2 not NULL): the block's integers are 256 q + q2 (q2 laid
 * out as q, |q2| <= 127), d their unit, m = d * sum of them; a kernel's block dot is
 * (dot(w, q) << 8) + dot(w, q2), exact in int32. */
#define QK_DPAD 16
typedef struct qk_act {
    const int8_t *q;
    const float *d;
    const float *m;
    const int8_t *q2; /* NULL: one plane (MS_ACT_Q8) */
} qk_act;

typedef struct qk_kernels {
    int gb; /* blocks per group of the activation layout this table reads */
    /* y[r] = (acc ? y[r] : 0) + sum_b sw(r, b) * d[b] * sum_j wq(r, b, j) * q(b, j) for r in
     * [r0, r1); wq the weight's integers, sw its scale per block (MXFP4: E8M0 / 2). w must
     * pass ms_qk_ok; a laid out for (gb, ms_qk_layout(w)). */
    void (*gemv)(const ms_qmat *w, const qk_act *a, float *y, int64_t r0, int64_t r1, int acc);
    /* Optional (NULL: gemv per token): nt tokens a[0..nt) at once, y[t * ldy + r] as gemv's y[r]
     * for token t, each token's result what gemv gives it. */
    void (*gemm)(const ms_qmat *w, const qk_act *a, int nt, float *y, int64_t ldy, int64_t r0, int64_t r1, int acc);
    /* ms_qk_quant with the same results (NULL: ms_qk_quant itself). */
    void (*quant)(const float *x, int64_t K, int gb, qk_layout lay, int8_t *q, int8_t *q2, float *d, float *m);
} qk_kernels;

extern const qk_kernels ms_qk_scalar, ms_qk_avx2, ms_qk_avxvnni, ms_qk_avx512, ms_qk_avx512vnni;

/* The table for one ISA (which the CPU must support). */
const qk_kernels *ms_qk_for(ms_cpu_isa isa);

/* Whether the Q8 path takes w: MXFP4 (no scale, or E8M0/U8 per 32 with any brow), INT4
 * (BF16 scales, brow 1, group 32..512 a power of 2 dividing cols; with or without zero
 * points), Q8 (BF16 per 1x32);
 * cols a multiple of 32. */
int ms_qk_ok(const ms_qmat *w);
static inline qk_layout ms_qk_layout(const ms_qmat *w) { return w->dtype == MS_DT_Q8 ? QK_SPLIT : QK_DEINT; }

/* The unsigned zero points (core/qmat.h I4 zero) of blocks [b0, b0 + n) of row r of an INT4
 * w, as floats in o[0..lanes) (0 past n): the kernels take sum_b sw_b * uz_b * m_b back out
 * of the unsigned dot products instead of 8 * sum_b sw_b * m_b. */
static inline void qk_i4_zeros(const ms_qmat *w, int64_t r, int64_t b0, int n, int lanes, float *o) {
    /* ms_i4_zero's lookup with the divisions hoisted (bcol / 32 is a power of 2: ms_qk_ok) */
    const int64_t ng = w->cols / w->bcol;
    int gsh = 0;
    while ((32 << gsh) < w->bcol) gsh++;
    const uint32_t *zw = (const uint32_t *)w->zero + (r >> 3) * ng;
    const int sh = 4 * (int)(r & 7);
    for (int i = 0; i < lanes; i++) o[i] = i < n ? (float)((zw[(b0 + i) >> gsh] >> sh) & 15u) : 0.0f;
}

/* Quantize x[K] (K % 32 == 0) into q[roundup(K, QK_PAD)], d and m[roundup(K, QK_PAD) / 32]:
 * d_b = amax_b / 127, q = round-to-nearest-even(x / d_b) (|q| <= 127; all 0 and d 0 for a
 * zero block; a non-finite block gets q 0 and d NaN, so the rows it meets are NaN).
 * With q2 (not NULL, as q): the second plane, v = x * (127 / amax_b) (F32), q = rne(v),
 * q2 = rne((v - q) * 256) clamped to +-127, d_b = amax_b / 127 / 256 and m_b = d_b * sum
 * (256 q + q2): |x - d_b (256 q + q2)| <= d_b / 2 (+ F32 rounding of v). */
void ms_qk_quant(const float *x, int64_t K, int gb, qk_layout lay, int8_t *q, int8_t *q2, float *d, float *m);

#endif
