/* DSA / mHC config parsing: the indexer schedules of transformers'
 * GlmMoeDsaConfig / Glm5NextTextConfig (indexer_types, index_topk_pattern,
 * index_topk_freq + index_skip_topk_offset), GLM-5-Next's text_config, and
 * the rejections the references raise. */
#include "model/config.h"
#include "model/model.h"
#include "test.h"
#include "util/fs.h"

/* the glm_moe_dsa fixture's config with "indexer_types" replaced by extra (JSON members) */
static int parse_glm(const char *extra, int layers, ms_config *c, ms_err *e) {
    char buf[8192];
    snprintf(buf, sizeof buf,
             "{\"model_type\":\"glm_moe_dsa\",\"vocab_size\":512,\"hidden_size\":64,\"num_hidden_layers\":%d,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":4,\"q_lora_rank\":48,\"kv_lora_rank\":32,"
             "\"qk_nope_head_dim\":16,\"qk_rope_head_dim\":8,\"v_head_dim\":16,\"n_routed_experts\":8,"
             "\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,\"intermediate_size\":96,"
             "\"first_k_dense_replace\":1,\"index_n_heads\":4,\"index_head_dim\":16,\"index_topk\":8%s%s}",
             layers, extra[0] ? "," : "", extra);
    return ms_config_parse(buf, strlen(buf), "config.json", c, e);
}

TEST(indexer_schedules) {
    ms_config c;
    ms_err e = {0};
    /* default: every layer full */
    CHECK(parse_glm("", 4, &c, &e) == MS_OK);
    CHECK(c.layer_dsa[0] == 1 && c.layer_dsa[3] == 1 && c.dsa_rope_interleaved && c.dsa_kpool == 0);
    /* freq 2, offset 2: full iff max(i - 1, 0) % 2 == 0 -> F F S F S F */
    CHECK(parse_glm("\"index_topk_freq\":2", 6, &c, &e) == MS_OK);
    uint8_t want[6] = {1, 1, 2, 1, 2, 1};
    CHECK(memcmp(c.layer_dsa, want, 6) == 0);
    CHECK(parse_glm("\"index_topk_pattern\":\"FSSF\"", 4, &c, &e) == MS_OK);
    CHECK(c.layer_dsa[0] == 1 && c.layer_dsa[1] == 2 && c.layer_dsa[2] == 2 && c.layer_dsa[3] == 1);
    CHECK(parse_glm("\"indexer_types\":[\"full\",\"shared\",\"full\"]", 3, &c, &e) == MS_OK);
    CHECK(c.layer_dsa[1] == 2 && c.layer_dsa[2] == 1);
    /* a shared first layer has nothing to reuse (transformers raises) */
    CHECK(parse_glm("\"indexer_types\":[\"shared\",\"full\"]", 2, &c, &e) == MS_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "layer 0") != NULL);
    CHECK(parse_glm("\"indexer_types\":[\"full\",\"sometimes\"]", 2, &c, &e) == MS_ERR_FORMAT);
    CHECK(parse_glm("\"indexer_types\":[\"full\"]", 2, &c, &e) == MS_ERR_FORMAT);
    CHECK(parse_glm("\"index_topk_pattern\":\"FX\"", 2, &c, &e) == MS_ERR_FORMAT);
}

TEST(fixture_configs) {
    ms_config c;
    ms_err e = {0};
    CHECK(ms_config_load(MS_TEST_FIXTURES "deepseek_v32", &c, &e) == MS_OK);
    CHECK(c.dsa_heads == 4 && c.dsa_head_dim == 16 && c.dsa_topk == 8 && !c.dsa_rope_interleaved);
    CHECK(c.layer_dsa[0] == 1 && c.layer_dsa[2] == 1 && c.rope.layout == MS_ROPE_INTERLEAVED);
    CHECK(ms_config_load(MS_TEST_FIXTURES "glm5_next", &c, &e) == MS_OK);
    CHECK_MSG(c.vocab == 512 && c.hidden == 64 && c.n_layers == 4, "%s", e.msg); /* from text_config */
    CHECK(c.hc_mult == 2 && c.hc_sinkhorn_iters == 5 && c.act_limit == 10.0 && c.dsa_kpool == 4 && c.dsa_kpool_tail);
    CHECK(c.layer_attn[0] == MS_ATTN_KDA && c.layer_attn[3] == MS_ATTN_MLA && c.layer_dsa[0] == 0 && c.layer_dsa[3] == 1);
    CHECK(c.kda_lower_bound_gate && c.kda_lower_bound == -5.0 && c.qk_rope_dim == 0);
    /* GLM-5-Next: a shared layer must directly follow a full DSA layer; layer 3 follows a KDA layer */
    char *txt = NULL;
    size_t len = 0;
    CHECK(ms_read_file(MS_TEST_FIXTURES "glm5_next/config.json", 1 << 20, &txt, &len, &e) == MS_OK);
    char *it = txt ? strstr(txt, "\"indexer_types\"") : NULL;
    char *end = it ? strchr(it, ']') : NULL;
    CHECK(it && end);
    if (it && end) {
        char buf[16384];
        snprintf(buf, sizeof buf, "%.*s\"indexer_types\": [\"full\", \"full\", \"full\", \"shared\"%s", (int)(it - txt),
                 txt, end);
        CHECK(ms_config_parse(buf, strlen(buf), "config.json", &c, &e) == MS_ERR_UNSUPPORTED);
        CHECK(strstr(e.msg, "layer 3") != NULL);
    }
    free(txt);
}

TEST_MAIN()
