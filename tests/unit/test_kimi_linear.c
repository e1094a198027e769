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
#include "test.h"

static void run_pieces(const char *dir, const int *pieces, int np, int max_batch, int threads) {
    char path[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ms_checkpoint ref;
    ms_model m;
    ms_err err = {0};
    if (ms_checkpoint_open(path, &ref, &err) || ms_model_load(dir, &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    const ms_tensor *in = ms_checkpoint_find(&ref, "input_ids"), *lg = ms_checkpoint_find(&ref, "logits");
    CHECK(in && lg && in->dtype == MS_DT_I32 && lg->dtype == MS_DT_F32);
    ms_pool *pool = threads > 1 ? ms_pool_create(threads) : NULL;
    ms_engine_opts o = {.max_ctx = 64, .max_batch = max_batch, .pool = pool};
    ms_engine *e = NULL;
    CHECK(ms_engine_create(&m, &o, &e, &err) == MS_OK);
    const int n = (int)in->shape[0];
    const int64_t V = m.cfg.vocab;
    float *out = malloc(sizeof(float) * (size_t)n * V);
    /* a first, unrelated sequence, then reset: the state must not leak */
    int32_t junk[5] = {3, 1, 4, 1, 5};
    CHECK(ms_engine_forward(e, junk, 5, NULL, 0, &err) == MS_OK);
    ms_engine_reset(e);
    int t = 0;
    for (int i = 0; i < np && t < n; i++) {
        int k = pieces[i] < n - t ? pieces[i] : n - t;
        CHECK_MSG(ms_engine_forward(e, (const int32_t *)in->data + t, k, out + (size_t)t * V, 1, &err) == MS_OK, "%s",
                  err.msg);
        t += k;
    }
    CHECK(t == n);
    double md = 0;
    const float *rl = lg->data;
    for (size_t i = 0; i < (size_t)n * V; i++) md = fmax(md, fabs(out[i] - rl[i]));
    CHECK_MSG(md <= 1e-4, "%s: pieces max |logit - ref| %.3g", dir, md);
    free(out);
    ms_engine_destroy(e);
    if (pool) ms_pool_destroy(pool);
    ms_model_free(&m);
    ms_checkpoint_close(&ref);
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
