/* ms_qmat row-range views against row-by-row dequantization. */
#include "ops/ops.h"
#include "test.h"

TEST(row_range_views) {
    enum { R = 256, C = 256 };
    static uint8_t fp8[R * C];
    static float sc[2 * 2];
    static uint16_t bf[R * C];
    for (int i = 0; i < R * C; i++) {
        fp8[i] = (uint8_t)((i * 37) % 0x7e);
        bf[i] = ms_f32_to_bf16((float)((i * 13) % 101) / 50.0f - 1.0f);
    }
    for (int i = 0; i < 4; i++) sc[i] = 0.5f + (float)i;
    ms_qmat w8 = {.dtype = MS_DT_F8_E4M3, .rows = R, .cols = C, .data = fp8, .scale_dtype = MS_DT_F32, .scale = sc,
                  .brow = 128, .bcol = 128};
    ms_qmat wb = {.dtype = MS_DT_BF16, .rows = R, .cols = C, .data = bf};
    ms_qmat v;
    float a[C], b[C];
    CHECK(ms_qmat_row_range(&w8, 128, 100, &v) == 1 && v.rows == 100);
    ms_qmat_row(&v, 5, a);
    ms_qmat_row(&w8, 133, b);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(ms_qmat_row_range(&w8, 100, 10, &v) == 0);  /* not at a scale-block boundary */
    CHECK(ms_qmat_row_range(&w8, 200, 100, &v) == 0); /* past the end */
    CHECK(ms_qmat_row_range(&wb, 77, 20, &v) == 1);
    ms_qmat_row(&v, 19, a);
    ms_qmat_row(&wb, 96, b);
    CHECK(memcmp(a, b, sizeof a) == 0);
    /* a matmul on the view equals the rows of the full matmul */
    float x[C], yfull[R], yv[20];
    for (int i = 0; i < C; i++) x[i] = (float)(i % 7) - 3.0f;
    ms_matmul(NULL, yfull, x, 1, &wb);
    ms_matmul(NULL, yv, x, 1, &v);
    for (int i = 0; i < 20; i++) CHECK_NEAR(yv[i], yfull[77 + i], 1e-4);
}

TEST_MAIN()
