/* test_kimi_linear.c — the KDA + MLA engine on the transformers-made fixtures
 * (tests/data/fixtures/models/kimi_linear{,_fp8}): the 40-token reference logits
 * reproduced when the sequence arrives in uneven pieces (prefill slices,
 * single decode steps, prefill again), so the carried KDA conv + recurrent
 * state and the chunked/recurrent switch are exercised at every boundary. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "fixture.h"
#include "test.h"

static void run_pieces(const char *dir, const int *pieces, int np, int max_batch, int threads) {
    /* a first, unrelated sequence, then reset: the state must not leak */
    static const int32_t junk[5] = {3, 1, 4, 1, 5};
    double md = ms_test_logits_in_pieces(dir, NULL, pieces, np, max_batch, threads, junk, 5);
    CHECK_MSG(md <= 1e-4, "%s: pieces max |logit - ref| %.3g", dir, md);
}

TEST(kimi_linear_in_pieces) {
    int a[] = {17, 1, 1, 21}, b[] = {1, 1, 1, 1, 1, 35}, c[] = {40};
    run_pieces(MS_TEST_FIXTURES "kimi_linear", a, 4, 256, 2);
    run_pieces(MS_TEST_FIXTURES "kimi_linear", b, 6, 256, 1);
    run_pieces(MS_TEST_FIXTURES "kimi_linear", c, 1, 7, 2); /* engine batches of 7 */
    run_pieces(MS_TEST_FIXTURES "kimi_linear_fp8", a, 4, 256, 2);
}

TEST(kimi_linear_config_errors) {
    ms_config c;
    ms_err err = {0};
    const char *bad_layer =
        "{\"model_type\":\"kimi_linear\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":2,\"kv_lora_rank\":4,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,"
        "\"v_head_dim\":4,\"intermediate_size\":8,\"first_k_dense_replace\":2,"
        "\"linear_attn_config\":{\"num_heads\":2,\"head_dim\":4,\"kda_layers\":[1],\"full_attn_layers\":[3]}}";
    CHECK(ms_config_parse(bad_layer, strlen(bad_layer), "t", &c, &err) == MS_ERR_FORMAT);
    CHECK(strstr(err.msg, "full_attn_layers") != NULL);
    const char *ok =
        "{\"model_type\":\"kimi_linear\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":2,\"kv_lora_rank\":4,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,"
        "\"v_head_dim\":4,\"intermediate_size\":8,\"first_k_dense_replace\":2,"
        "\"linear_attn_config\":{\"num_heads\":2,\"head_dim\":4,\"kda_layers\":[1],\"full_attn_layers\":[2],"
        "\"gate_lower_bound\":-5.0,\"use_full_rank_gate\":true}}";
    ms_err_clear(&err);
    CHECK_MSG(ms_config_parse(ok, strlen(ok), "t", &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.layer_attn[0] == MS_ATTN_KDA && c.layer_attn[1] == MS_ATTN_MLA);
    CHECK(c.kda_lower_bound_gate == 1 && c.kda_lower_bound == -5.0 && c.kda_full_rank_gate == 1);
}

TEST_MAIN()
