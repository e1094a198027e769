/* config.json parsing: accepted fixtures and clear rejections. */
#include "model/config.h"
#include "model/model.h"
#include "test.h"

static int parse(const char *s, ms_config *c, ms_err *e) { return ms_config_parse(s, strlen(s), "config.json", c, e); }

TEST(fixture_configs) {
    const char *names[] = {"deepseek_v3", "deepseek_v3_fp8", "qwen3_moe", "glm4_moe", "minimax_m2"};
    for (int i = 0; i < 5; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", names[i]);
        ms_config c;
        ms_err e = {0};
        int rc = ms_config_load(dir, &c, &e);
        CHECK_MSG(rc == 0, "%s: %s", names[i], e.msg);
    }
    ms_config c;
    ms_err e = {0};
    CHECK(ms_config_load(MS_TEST_FIXTURES "deepseek_v3_fp8", &c, &e) == 0);
    CHECK(c.fp8 && c.fp8_block[0] == 128 && c.fp8_block[1] == 128);
    CHECK(c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE);
    CHECK(c.rope.layout == MS_ROPE_INTERLEAVED && c.rope.dim == 8);
}

TEST(rejections) {
    ms_config c;
    ms_err e = {0};
    CHECK(parse("{\"model_type\":\"llama\",\"vocab_size\":8}", &c, &e) == MS_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "llama") && strstr(e.msg, "deepseek_v3"));
    CHECK(parse("{\"vocab_size\":8}", &c, &e) == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "model_type") != NULL);
    CHECK(parse("{\"model_type\":\"qwen3_moe\",\"vocab_size\":-3}", &c, &e) == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "vocab_size") != NULL);
    CHECK(parse("{\"model_type\":\"qwen3_moe\",\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":1,"
                "\"num_attention_heads\":3,\"num_key_value_heads\":2,\"num_experts\":4,\"num_experts_per_tok\":2,"
                "\"moe_intermediate_size\":4}",
                &c, &e) == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "num_key_value_heads") != NULL);
    CHECK(parse("{\"model_type\":\"qwen3_moe\",\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":1,"
                "\"num_attention_heads\":2,\"num_experts\":4,\"num_experts_per_tok\":5,\"moe_intermediate_size\":4}",
                &c, &e) == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "num_experts_per_tok") != NULL);
    CHECK(parse("{\"model_type\":\"deepseek_v3\",\"vocab_size\":8,\"hidden_size\":8,\"num_hidden_layers\":1,"
                "\"num_attention_heads\":2,\"n_routed_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":4,"
                "\"kv_lora_rank\":4,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":4,\"v_head_dim\":4,"
                "\"quantization_config\":{\"quant_method\":\"awq\"}}",
                &c, &e) == MS_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "awq") != NULL);
    CHECK(parse("{\"model_type\":\"deepseek_v3\"", &c, &e) == MS_ERR_FORMAT);
}

TEST(missing_tensor_named) {
    /* a fixture whose config promises more layers than the checkpoint has */
    ms_model m;
    ms_err e = {0};
    CHECK(ms_model_load(MS_TEST_FIXTURES "deepseek_v3", &m, &e) == 0);
    ms_model_free(&m);
    CHECK(ms_model_load(MS_TEST_FIXTURES "does_not_exist", &m, &e) != 0);
}

TEST_MAIN()
