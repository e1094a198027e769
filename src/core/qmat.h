/* qmat.h — ms_qmat, the weight view every layer shares, and its helpers.
 *
 * Part of core/: depends only on util/. The definitions live with the
 * kernels (src/ops, src/backend/cpu); ops/ops.h includes this header. */
#ifndef MS_CORE_QMAT_H
#define MS_CORE_QMAT_H

#include <stdint.h>

#include "util/dtype.h"

/* A 2-D weight [rows, cols] as torch.nn.Linear stores it (out x in).
 *  F32/F16/BF16: data is rows*cols elements, no scale.
 *  F8_E4M3: data rows*cols bytes; scale [ceil(rows/brow), ceil(cols/bcol)] of
 *           scale_dtype (F32 or BF16), multiplied in (DeepSeek weight_scale_inv).
 *  F4 (MXFP4 e2m1): data rows*cols/2 bytes, two values per byte, low nibble
 *           first; scale [rows, cols/32] E8M0 (brow 1, bcol 32).
 *  Q8: data rows*cols int8; scale [ceil(rows/brow), ceil(cols/bcol)] (F32/BF16).
 *  I4 (compressed-tensors "pack-quantized", num_bits 4, strategy group, symmetric:
 *           Kimi K2-Thinking / K2.5 routed experts): data is the weight_packed tensor,
 *           int32 [rows, cols/8]; int32 word g of a row holds columns 8g..8g+7, column
 *           8g+j in bits 4j..4j+3 as the unsigned nibble u = q + 8 (q in [-8, 7]).
 *           Read as bytes (little-endian) that is rows*cols/2 bytes, two values per
 *           byte, low nibble = even column, as F4. Value = (u - 8) * scale; scale is
 *           weight_scale [rows, cols/bcol] (BF16, F16 or F32; brow 1), bcol the group
 *           size (a multiple of 32 for the SIMD kernels; 32 in Kimi K2). cols % 8 == 0.
 *           Asymmetric (compressed-tensors symmetric: false): zero is the
 *           weight_zero_point tensor, int32 [ceil(rows/8), ceil(cols/bcol)], the signed
 *           zero points z [rows, ceil(cols/bcol)] packed like the weights but along the rows
 *           (pack_to_int32 packed_dim 0): word (r/8, g) holds row 8(r/8)+i of group g in
 *           bits 4i..4i+3 as the unsigned nibble uz = z + 8; value = (q - z) * scale =
 *           (u - uz) * scale. zero NULL (symmetric) is uz = 8 everywhere.
 *           Packing per compressed_tensors pack_to_int32 / unpack_from_int32
 *           (vllm-project/compressed-tensors, compressors/quantized_compressors/
 *           pack_quantized.py: offset 1 << (num_bits - 1), value i of each group of
 *           8 shifted left by num_bits * i). */
typedef struct ms_qmat {
    ms_dtype dtype;
    int64_t rows, cols;
    const void *data;
    ms_dtype scale_dtype;
    const void *scale;
    int brow, bcol;
    const void *zero; /* I4 only: packed zero points (above), or NULL */
} ms_qmat;

/* The unsigned zero point uz of row r, group g of an I4 view (8 when w->zero is NULL):
 * value = (u - uz) * scale. */
static inline int ms_i4_zero(const ms_qmat *w, int64_t r, int64_t g) {
    if (!w->zero) return 8;
    int64_t ng = (w->cols + w->bcol - 1) / w->bcol;
    uint32_t word = ((const uint32_t *)w->zero)[(r / 8) * ng + g];
    return (int)((word >> (4 * (r % 8))) & 15);
}

/* Values per Q8 (and requantized FP8) scale block along a row. */
#define MS_Q8_BLOCK 32

/* Block quantization of one row x[n] (n > 0) in blocks of MS_Q8_BLOCK values
 * (the last one may be shorter): scale[b] (BF16 bits) = amax_b / 127 rounded up
 * to BF16, q[c] = round(x[c] / d_b) (|q| <= 127; 0 for an all-zero block).
 * The FP8 twin: E4M3 values (ms_f32_to_fp8_e4m3 of x / d_b), d_b = amax_b / 448
 * rounded up to BF16. Non-finite inputs give a NaN scale. */
void ms_quant_q8_row(const float *x, int64_t n, int8_t *q, uint16_t *scale);
void ms_quant_fp8_row(const float *x, int64_t n, uint8_t *q, uint16_t *scale);

/* Symmetric INT4 quantization of one group-of-`group` row x[n] (n % 8 == 0) as
 * compressed-tensors does it (scale = amax / 7.5 rounded to BF16, q = clamp(round(x /
 * scale), -8, 7); 0 for an all-zero group): packed[n/8] int32 words (the I4 layout
 * above), scale[ceil(n/group)] BF16 bits. Used by synth and the tests. */
void ms_quant_i4_row(const float *x, int64_t n, int group, int32_t *packed, uint16_t *scale);

/* Asymmetric INT4 quantization of one row (n % 8 == 0) in groups of `group`: per group
 * lo = min(x, 0), hi = max(x, 0), scale = (hi - lo) / 15 rounded to BF16, z =
 * clamp(round(-8 - lo / scale), -8, 7), q = clamp(round(x / scale) + z, -8, 7) (scale 0:
 * q = z = 0 ... value 0); packed[n/8] as ms_quant_i4_row, scale[ceil(n/group)] BF16 bits,
 * zp[ceil(n/group)] the signed zero points (the caller packs them along rows).
 * Used by synth and the tests. */
void ms_quant_i4z_row(const float *x, int64_t n, int group, int32_t *packed, uint16_t *scale, int8_t *zp);

/* Bytes of weight data + scales (+ zero points) that a full pass over w reads. */
uint64_t ms_qmat_bytes(const ms_qmat *w);

/* A view of rows [r0, r0 + nrows) of w. Returns 1 and fills out when the rows
 * can be viewed in place (block scales, if any, must start at a block boundary;
 * I4 zero points at a multiple of 8 rows); 0 otherwise. */
int ms_qmat_row_range(const ms_qmat *w, int64_t r0, int64_t nrows, ms_qmat *out);
/* Dequantize row r of w into out[cols] (F32). */
void ms_qmat_row(const ms_qmat *w, int64_t r, float *out);

/* Element conversion of a stored vector (F32/F16/BF16) to F32. */
void ms_to_f32(float *out, const void *src, ms_dtype dt, int64_t n);

#endif
