/* test_dsa_engine.c — DeepSeek Sparse Attention in the engine against the
 * transformers references of the tests/data fixtures, on paths `moonshine verify`
 * does not take: prefill in small chunks, a prompt fed in pieces, and decode
 * whose tied top-k choices must be redone as the sequence grows (the reference
 * recomputes every step; deepseek_v32, deepseek_v32_topk4 and glm5_next_s2 need replays). */
#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "fixture.h"
#include "test.h"

/* Prefill, then the prompt in pieces of `piece` and decode, against the fixture's references
 * (fixture.h). When the prompt is fed in pieces, earlier pieces were computed as shorter forwards
 * than the reference's: their tied choices are redone too, so the result must not change. */
static void run_fixture(const char *dir, int max_batch, int threads, int piece) {
    ms_test_prefill_and_decode(dir, 128, max_batch, threads, piece);
}

TEST(deepseek_v32_chunked_prefill_and_decode) {
    run_fixture(MS_TEST_FIXTURES "deepseek_v32", 7, 2, 20);
    run_fixture(MS_TEST_FIXTURES "deepseek_v32", 256, 1, 3);
}

TEST(deepseek_v32_topk4_many_ties) { run_fixture("tests/fixtures/extra/deepseek_v32_topk4", 5, 2, 6); }

TEST(glm_moe_dsa_shared_selection_chunked) {
    run_fixture("tests/fixtures/extra/glm_moe_dsa_topk4_shared", 3, 2, 20);
    run_fixture(MS_TEST_FIXTURES "glm_moe_dsa", 16, 1, 1);
}

/* KDA + KPool DSA + mHC; glm5_next_s2 (hc_mult 3, kpool 3, a shared layer) has tied pool choices
 * that flip as the sequence grows: with recurrent KDA state the engine redoes the sequence */
TEST(glm5_next_chunked_and_replayed) {
    run_fixture(MS_TEST_FIXTURES "glm5_next", 6, 2, 7);
    run_fixture("tests/fixtures/extra/glm5_next_s2", 5, 2, 20);
    run_fixture("tests/fixtures/extra/glm5_next_s2", 256, 1, 3);
}

TEST_MAIN()
