/* dtype conversions against exhaustive/independent definitions. */
#include "util/dtype.h"
#include "test.h"

/* nearest E4M3FN code by exhaustive search (ties to even code) */
static uint8_t fp8_ref(float f) {
    float a = fabsf(f);
    if (a >= 448.0f) return (signbit(f) ? 0x80 : 0) | 0x7e;
    int best = 0;
    float bd = INFINITY;
    for (int c = 0; c < 0x7f; c++) {
        float d = fabsf(ms_fp8_e4m3_to_f32((uint8_t)c) - a);
        if (d < bd || (d == bd && (c & 1) == 0)) { bd = d; best = c; }
    }
    return (signbit(f) ? 0x80 : 0) | (uint8_t)best;
}

TEST(fp8_tables) {
    CHECK(ms_fp8_e4m3_to_f32(0x7e) == 448.0f);
    CHECK(ms_fp8_e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
    CHECK(ms_fp8_e4m3_to_f32(0x08) == ldexpf(1.0f, -6));
    CHECK(isnan(ms_fp8_e4m3_to_f32(0x7f)) && isnan(ms_fp8_e4m3_to_f32(0xff)));
    CHECK(ms_fp8_e4m3_to_f32(0xb8) == -1.0f);
    CHECK(ms_fp8_e5m2_to_f32(0x3c) == 1.0f && isinf(ms_fp8_e5m2_to_f32(0x7c)));
    CHECK(ms_e8m0_to_f32(127) == 1.0f && ms_e8m0_to_f32(130) == 8.0f);
}

TEST(fp8_rounding_matches_search) {
    int bad = 0;
    /* every representable value, midpoints and a sweep (0x7f is NaN: stop below it) */
    for (int c = 0; c < 0x7e; c++) {
        float v = ms_fp8_e4m3_to_f32((uint8_t)c), w = ms_fp8_e4m3_to_f32((uint8_t)(c + 1));
        float pts[3] = {v, (v + w) / 2, nextafterf(v, INFINITY)};
        for (int k = 0; k < 3; k++)
            for (int s = 0; s < 2; s++) {
                float x = s ? -pts[k] : pts[k];
                if (ms_f32_to_fp8_e4m3(x) != fp8_ref(x)) bad++;
            }
    }
    for (float x = -500; x < 500; x += 0.0137f)
        if (ms_f32_to_fp8_e4m3(x) != fp8_ref(x)) bad++;
    CHECK_MSG(bad == 0, "%d mismatches", bad);
}

TEST(bf16_f16) {
    CHECK(ms_bf16_to_f32(ms_f32_to_bf16(1.0f)) == 1.0f);
    CHECK(ms_f32_to_bf16(1.00390625f) == 0x3f80); /* tie to even */
    CHECK(ms_f32_to_bf16(1.01171875f) == 0x3f82);
    int bad = 0;
    for (uint32_t h = 0; h < 0x7c00; h++)
        if (ms_f32_to_f16(ms_f16_to_f32((uint16_t)h)) != h) bad++;
    CHECK(bad == 0);
    CHECK(ms_f16_to_f32(0x3c00) == 1.0f && ms_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
}

TEST(dtype_names) {
    CHECK(ms_dtype_parse("F8_E4M3") == MS_DT_F8_E4M3 && ms_dtype_parse("bf16") == MS_DT_INVALID);
    CHECK(ms_dtype_bits(MS_DT_BF16) == 16 && ms_dtype_bits(MS_DT_F4) == 4);
}

TEST_MAIN()
