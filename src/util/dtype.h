/* dtype.h — element types as stored in checkpoints, and scalar conversions.
 *
 * Weights stay in their stored dtype; kernels call these converters (or
 * their SIMD twins) while computing. Sub-byte types (F4 = MXFP4 e2m1) have
 * elem_bits 4 and are always packed two per byte, low nibble first. */
#ifndef MS_DTYPE_H
#define MS_DTYPE_H

#include <stdint.h>
#include <string.h>

typedef enum ms_dtype {
    MS_DT_INVALID = 0,
    MS_DT_F64, MS_DT_F32, MS_DT_F16, MS_DT_BF16,
    MS_DT_F8_E4M3, MS_DT_F8_E5M2, MS_DT_F8_E8M0,
    MS_DT_I64, MS_DT_I32, MS_DT_I16, MS_DT_I8,
    MS_DT_U64, MS_DT_U32, MS_DT_U16, MS_DT_U8,
    MS_DT_BOOL,
    MS_DT_F4, /* not a SafeTensors dtype: packed e2m1 view of U8 blocks */
    MS_DT_Q8, /* not a SafeTensors dtype: int8 values with a scale per block (core/qmat.h) */
    MS_DT_I4, /* not a SafeTensors dtype: int4 packed 8 per int32, compressed-tensors pack-quantized (core/qmat.h) */
    MS_DT_COUNT
} ms_dtype;

/* Bits per element (4 for F4), 0 for invalid. */
int ms_dtype_bits(ms_dtype dt);
/* SafeTensors spelling ("BF16", "F8_E4M3", ...). */
const char *ms_dtype_name(ms_dtype dt);
/* Parse a SafeTensors dtype string; MS_DT_INVALID when unknown. */
ms_dtype ms_dtype_parse(const char *s);

static inline float ms_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round-to-nearest-even, NaN preserved (as PyTorch does). */
static inline uint16_t ms_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float ms_f16_to_f32(uint16_t h);
uint16_t ms_f32_to_f16(float f);

/* OCP FP8 E4M3FN (no inf; 0x7f/0xff are NaN), E5M2, E8M0 (scale = 2^(e-127)). */
extern float ms_fp8_e4m3_table[256];
extern float ms_fp8_e5m2_table[256];
static inline float ms_fp8_e4m3_to_f32(uint8_t v) { return ms_fp8_e4m3_table[v]; }
static inline float ms_fp8_e5m2_to_f32(uint8_t v) { return ms_fp8_e5m2_table[v]; }
float ms_e8m0_to_f32(uint8_t v);
/* Nearest E4M3FN value with saturation to ±448 (round half to even). */
uint8_t ms_f32_to_fp8_e4m3(float f);

/* MXFP4 e2m1 nibble to float: {0,.5,1,1.5,2,3,4,6} with sign in bit 3. */
extern const float ms_fp4_e2m1_table[16];

/* Build the lookup tables once (idempotent, thread-safe after first call). */
void ms_dtype_init(void);

#endif
