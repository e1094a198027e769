#include "util/dtype.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static const struct { const char *name; ms_dtype dt; int bits; } k_dtypes[] = {
    {"F64", MS_DT_F64, 64},      {"F32", MS_DT_F32, 32},         {"F16", MS_DT_F16, 16},
    {"BF16", MS_DT_BF16, 16},    {"F8_E4M3", MS_DT_F8_E4M3, 8},  {"F8_E5M2", MS_DT_F8_E5M2, 8},
    {"F8_E8M0", MS_DT_F8_E8M0, 8}, {"I64", MS_DT_I64, 64},       {"I32", MS_DT_I32, 32},
    {"I16", MS_DT_I16, 16},      {"I8", MS_DT_I8, 8},            {"U64", MS_DT_U64, 64},
    {"U32", MS_DT_U32, 32},      {"U16", MS_DT_U16, 16},         {"U8", MS_DT_U8, 8},
    {"BOOL", MS_DT_BOOL, 8},     {"F4", MS_DT_F4, 4},        {"Q8", MS_DT_Q8, 8},
    {"I4", MS_DT_I4, 4},
};

int ms_dtype_bits(ms_dtype dt) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof *k_dtypes; i++)
        if (k_dtypes[i].dt == dt) return k_dtypes[i].bits;
    return 0;
}

const char *ms_dtype_name(ms_dtype dt) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof *k_dtypes; i++)
        if (k_dtypes[i].dt == dt) return k_dtypes[i].name;
    return "INVALID";
}

ms_dtype ms_dtype_parse(const char *s) {
    if (!s) return MS_DT_INVALID;
    for (size_t i = 0; i < sizeof k_dtypes / sizeof *k_dtypes; i++)
        if (k_dtypes[i].dt != MS_DT_F4 && k_dtypes[i].dt != MS_DT_Q8 && k_dtypes[i].dt != MS_DT_I4 && strcmp(k_dtypes[i].name, s) == 0) return k_dtypes[i].dt;
    return MS_DT_INVALID;
}

float ms_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float f;
    if (exp == 0) {
        f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    uint32_t u;
    if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ms_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    float a = fabsf(f);
    if (isnan(f)) return sign | 0x7e00;
    if (a >= 65520.0f) return sign | 0x7c00;
    if (a < ldexpf(1.0f, -14)) { /* subnormal: quantum 2^-24 */
        float q = nearbyintf(a * ldexpf(1.0f, 24));
        return sign | (uint16_t)q;
    }
    int e;
    float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5,1) */
    float q = nearbyintf(m * 2048.0f); /* 11 significant bits */
    if (q >= 2048.0f) { q = 1024.0f; e++; }
    return sign | (uint16_t)((e + 14) << 10) | (uint16_t)((int)q - 1024);
}

float ms_fp8_e4m3_table[256];
float ms_fp8_e5m2_table[256];
const float ms_fp4_e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float ms_e8m0_to_f32(uint8_t v) {
    if (v == 0xff) return NAN;
    return ldexpf(1.0f, (int)v - 127);
}

static float decode_fp8(uint8_t v, int ebits, int mbits, int bias, int e4m3fn) {
    int sign = v >> 7, exp = (v >> mbits) & ((1 << ebits) - 1), man = v & ((1 << mbits) - 1);
    float f;
    if (e4m3fn && exp == 15 && man == 7) return NAN;
    if (!e4m3fn && exp == 31) return man ? NAN : (sign ? -INFINITY : INFINITY);
    if (exp == 0) f = ldexpf((float)man, 1 - bias - mbits);
    else f = ldexpf(1.0f + (float)man / (float)(1 << mbits), exp - bias);
    return sign ? -f : f;
}

static void init_tables(void) {
    for (int i = 0; i < 256; i++) {
        ms_fp8_e4m3_table[i] = decode_fp8((uint8_t)i, 4, 3, 7, 1);
        ms_fp8_e5m2_table[i] = decode_fp8((uint8_t)i, 5, 2, 15, 0);
    }
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
void ms_dtype_init(void) { pthread_once(&g_once, init_tables); }

__attribute__((constructor)) static void dtype_ctor(void) { ms_dtype_init(); }

uint8_t ms_f32_to_fp8_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e; /* saturate (e4m3fn has no inf) */
    if (a < 0.015625f) {                 /* below 2^-6: subnormal, quantum 2^-9 */
        int q = (int)nearbyintf(a * 512.0f);
        return sign | (uint8_t)q;        /* q == 8 is exactly the smallest normal */
    }
    int e;
    float m = frexpf(a, &e);             /* a = m * 2^e, m in [0.5, 1) */
    int E = e - 1;                       /* a = (2m) * 2^E, 2m in [1, 2) */
    int mant = (int)nearbyintf((2.0f * m - 1.0f) * 8.0f);
    if (mant == 8) {
        mant = 0;
        E++;
    }
    int code = ((E + 7) << 3) | mant;
    if (code > 0x7e) code = 0x7e;
    return sign | (uint8_t)code;
}
