/* test_families16c.c — the third round of issue 16's families beyond their fixtures
 * (tests/fixtures/extra, checked by moonshine verify): the config rules of hy_v3,
 * mistral4, granitemoe_swa, afmoe, aria_text / aria, qwen3_omni_moe, cohere2_moe and glm4v_moe (hand-written config.json text,
 * what transformers' config classes imply, what the configures refuse by name), and
 * Mistral 4's router (MS_ROUTER_SOFTMAX_GROUP2: softmax scores, groups ranked by their
 * two best) on logits where it keeps other groups than DeepSeek-V2's best-expert rule. */
#include <math.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "model/config.h"
#include "test.h"

static int parse(const char *json, ms_config *c, ms_err *err) { return ms_config_parse(json, strlen(json), "t", c, err); }

#define GQA "\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2," \
            "\"num_key_value_heads\":1,\"head_dim\":4,\"intermediate_size\":8,\"num_experts_per_tok\":2"
#define MLA "\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2," \
            "\"intermediate_size\":8,\"moe_intermediate_size\":4,\"n_routed_experts\":8,\"num_experts_per_tok\":2," \
            "\"kv_lora_rank\":4,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,\"v_head_dim\":4,\"first_k_dense_replace\":1," \
            "\"n_shared_experts\":1,\"routed_scaling_factor\":1.5,\"norm_topk_prob\":true,\"q_lora_rank\":6"

TEST(hy_v3_config) {
    ms_config c;
    ms_err err = {0};
    const char *j = "{\"model_type\":\"hy_v3\"," GQA ",\"moe_intermediate_size\":4,\"num_experts\":8,"
                    "\"num_shared_experts\":2,\"router_scaling_factor\":2.826,\"mlp_layer_types\":[\"dense\",\"sparse\"]}";
    CHECK_MSG(parse(j, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_SIGMOID && c.router_bias && c.n_group == 1 && c.norm_topk_prob &&
          fabs(c.routed_scale - 2.826) < 1e-12 && c.shared_inter == 8 && c.qk_norm == MS_QKNORM_HEAD && !c.qk_norm_after_rope);
    CHECK(c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE && c.layer_attn[1] == MS_ATTN_GQA);
    /* default schedule: layer 0 dense; default scaling factor */
    const char *d = "{\"model_type\":\"hy_v3\"," GQA ",\"moe_intermediate_size\":4,\"num_experts\":8}";
    CHECK_MSG(parse(d, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE && fabs(c.routed_scale - 2.826) < 1e-12 &&
          c.shared_inter == 4);
}

TEST(mistral4_config) {
    ms_config c;
    ms_err err = {0};
    const char *j = "{\"model_type\":\"mistral4\"," MLA ",\"n_group\":4,\"topk_group\":2,\"max_position_embeddings\":64,"
                    "\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":10000.0,\"factor\":4.0,"
                    "\"original_max_position_embeddings\":16,\"mscale\":1.0,\"mscale_all_dim\":1.0,"
                    "\"llama_4_scaling_beta\":0.1,\"beta_fast\":32,\"beta_slow\":1}}";
    CHECK_MSG(parse(j, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_SOFTMAX_GROUP2 && !c.router_bias && c.n_group == 4 && c.topk_group == 2 &&
          c.norm_topk_prob && c.routed_scale == 1.5 && c.shared_inter == 4);
    /* the YaRN mscale^2 of mscale_all_dim in the softmax scale (transformers 5.17's yarn_apply_mscale) */
    double ms = 0.1 * log(4.0) + 1.0;
    CHECK(c.rope.yarn && c.rope.layout == MS_ROPE_INTERLEAVED && fabs(c.attn_scale - ms * ms / sqrt(6.0)) < 1e-12);
    CHECK(fabs(c.q_pos_beta - 0.1) < 1e-12 && c.q_pos_len == 16);
    CHECK(c.layer_attn[0] == MS_ATTN_MLA && c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE);
    const char *nolen = "{\"model_type\":\"mistral4\"," MLA ",\"rope_parameters\":{\"rope_type\":\"default\","
                        "\"rope_theta\":10000.0,\"llama_4_scaling_beta\":0.1}}";
    CHECK(parse(nolen, &c, &err) == MS_ERR_FORMAT && strstr(err.msg, "original_max_position_embeddings"));
    const char *badg = "{\"model_type\":\"mistral4\"," MLA ",\"n_group\":3,\"topk_group\":1}";
    CHECK(parse(badg, &c, &err) == MS_ERR_FORMAT && strstr(err.msg, "n_group"));
}

TEST(granitemoe_swa_config) {
    ms_config c;
    ms_err err = {0};
    const char *j = "{\"model_type\":\"granitemoe_swa\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":3,"
                    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"intermediate_size\":8,\"num_experts_per_tok\":2,"
                    "\"num_local_experts\":4,\"attention_multiplier\":0.25,\"sliding_window\":8,"
                    "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\"],"
                    "\"layer_rope_theta\":[10000.0,0,10000.0],\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000.0}}";
    CHECK_MSG(parse(j, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.layer_window[0] == 8 && c.layer_window[1] == 0 && c.layer_window[2] == 8);
    CHECK(c.layer_sinks[0] && c.layer_sinks[1] && c.layer_sinks[2] && c.shared_inter == 0 && c.attn_scale == 0.25);
    CHECK(c.layer_rope[0] == 0 && c.layer_rope[1] == 1 && c.rope_alt.dim == 0 && c.rope.dim == 4);
    /* default schedule: layer i full when i % 4 == 0 */
    const char *d = "{\"model_type\":\"granitemoe_swa\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":3,"
                    "\"num_attention_heads\":2,\"intermediate_size\":8,\"num_experts_per_tok\":2,\"num_local_experts\":4}";
    CHECK_MSG(parse(d, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.layer_window[0] == 0 && c.layer_window[1] == 128 && c.layer_window[2] == 128 && c.layer_rope[1] == 0);
    const char *other = "{\"model_type\":\"granitemoe_swa\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,"
                        "\"num_attention_heads\":2,\"intermediate_size\":8,\"num_experts_per_tok\":2,\"num_local_experts\":4,"
                        "\"layer_rope_theta\":[10000.0,500000.0]}";
    CHECK(parse(other, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "layer_rope_theta"));
}

TEST(afmoe_config) {
    ms_config c;
    ms_err err = {0};
    const char *j = "{\"model_type\":\"afmoe\"," GQA ",\"moe_intermediate_size\":4,\"num_experts\":8,\"num_shared_experts\":1,"
                    "\"num_dense_layers\":1,\"route_scale\":1.7,\"sliding_window\":8,\"mup_enabled\":true,"
                    "\"layer_types\":[\"sliding_attention\",\"full_attention\"]}";
    CHECK_MSG(parse(j, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_SIGMOID && c.router_bias && c.n_group == 1 && c.norm_topk_prob && c.routed_scale == 1.7 &&
          c.shared_inter == 4 && c.qk_norm == MS_QKNORM_HEAD && c.attn_gate_proj && c.post_norm);
    CHECK(fabs(c.embed_scale - sqrt(8.0)) < 1e-12 && c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE);
    CHECK(c.layer_window[0] == 8 && c.layer_window[1] == 0 && c.layer_rope[0] == 0 && c.layer_rope[1] == 1 &&
          c.rope_alt.dim == 0);
    /* the default schedule: every global_attn_every_n_layers-th layer full (here the second) */
    const char *d = "{\"model_type\":\"afmoe\"," GQA ",\"moe_intermediate_size\":4,\"num_experts\":8,"
                    "\"global_attn_every_n_layers\":2}";
    CHECK_MSG(parse(d, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.layer_window[0] == 1024 && c.layer_window[1] == 0 && c.embed_scale == 0 && c.shared_inter == 8);
}

TEST(aria_config) {
    ms_config c;
    ms_err err = {0};
    const char *j = "{\"model_type\":\"aria_text\"," GQA ",\"moe_num_experts\":8,\"moe_topk\":2,\"moe_num_shared_experts\":1}";
    CHECK_MSG(parse(j, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_TOPK_SOFTMAX && c.n_experts == 8 && c.top_k == 2 && c.moe_inter == 8 && c.shared_inter == 8);
    CHECK(c.layer_mlp[0] == MS_MLP_MOE && c.layer_mlp[1] == MS_MLP_MOE);
    const char *mm = "{\"model_type\":\"aria\",\"text_config\":{\"model_type\":\"aria_text\"," GQA
                     ",\"moe_num_experts\":8,\"moe_topk\":2}}";
    CHECK_MSG(parse(mm, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.shared_inter == 16 && c.n_experts == 8);
    const char *other = "{\"model_type\":\"aria\",\"text_config\":{\"model_type\":\"llama\"," GQA
                        ",\"moe_num_experts\":8,\"moe_topk\":2}}";
    CHECK(parse(other, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "llama"));
}

TEST(qwen3_omni_moe_config) {
    ms_config c;
    ms_err err = {0};
    /* the published form: the text config at thinker_config.text_config */
    const char *j = "{\"model_type\":\"qwen3_omni_moe\",\"enable_audio_output\":false,\"thinker_config\":{"
                    "\"model_type\":\"qwen3_omni_moe_thinker\",\"text_config\":{\"model_type\":\"qwen3_omni_moe_text\","
                    GQA ",\"moe_intermediate_size\":4,\"num_experts\":8,\"norm_topk_prob\":true}}}";
    CHECK_MSG(parse(j, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_SOFTMAX && c.n_experts == 8 && c.norm_topk_prob && c.qk_norm == MS_QKNORM_HEAD &&
          c.layer_mlp[0] == MS_MLP_MOE && c.vocab == 16);
    /* the thinker alone: text_config at the top */
    const char *t = "{\"model_type\":\"qwen3_omni_moe_thinker\",\"text_config\":{\"model_type\":\"qwen3_omni_moe_text\","
                    GQA ",\"moe_intermediate_size\":4,\"num_experts\":8}}";
    CHECK_MSG(parse(t, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.n_experts == 8 && !c.norm_topk_prob);
    /* the talker's text model is not the thinker's */
    const char *talk = "{\"model_type\":\"qwen3_omni_moe_thinker\",\"text_config\":{\"model_type\":\"qwen3_omni_moe_talker_text\","
                       GQA ",\"moe_intermediate_size\":4,\"num_experts\":8}}";
    CHECK(parse(talk, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "talker"));
}

TEST(cohere2_moe_config) {
    ms_config c;
    ms_err err = {0};
    const char *j = "{\"model_type\":\"cohere2_moe\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":3,"
                    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":4,\"intermediate_size\":8,"
                    "\"num_experts_per_tok\":2,\"num_experts\":4,\"num_shared_experts\":1,\"prefix_dense_intermediate_size\":12,"
                    "\"sliding_window\":8,\"mlp_layer_types\":[\"dense\",\"sparse\",\"sparse\"],"
                    "\"layer_types\":[\"full_attention\",\"sliding_attention\",\"full_attention\"],\"logit_scale\":0.5,"
                    "\"layer_norm_eps\":1e-5,\"rms_norm_eps\":null}";
    CHECK_MSG(parse(j, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.parallel_block && c.layernorm && fabs(c.rms_eps - 1e-5) < 1e-15 && c.tie_embeddings && c.logit_scale == 0.5);
    CHECK(c.router == MS_ROUTER_TOPK_SOFTMAX && c.moe_inter == 8 && c.shared_inter == 8 && c.inter == 12 &&
          c.moe_out_scale == 0.5);
    /* the dense prefix ropes (prefix_dense_sliding_window_pattern 1), the full MoE layer is NoPE */
    CHECK(c.layer_rope[0] == 0 && c.layer_rope[1] == 0 && c.layer_rope[2] == 1 && c.layer_window[1] == 8 &&
          c.layer_window[2] == 0 && c.rope.layout == MS_ROPE_INTERLEAVED);
    const char *sig = "{\"model_type\":\"cohere2_moe\"," GQA ",\"num_experts\":4,\"expert_selection_fn\":\"sigmoid\","
                      "\"norm_topk_prob\":true,\"shared_expert_combination_strategy\":\"sum\",\"num_shared_experts\":1,"
                      "\"rms_norm_eps\":1e-6}";
    CHECK_MSG(parse(sig, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_SIGMOID && !c.router_bias && c.norm_topk_prob && c.moe_out_scale == 0 && !c.layernorm);
    /* default schedule: every fourth layer full; the rest sliding with RoPE */
    CHECK(c.layer_window[0] == 4096 && c.layer_rope[0] == 0);
    const char *bad = "{\"model_type\":\"cohere2_moe\"," GQA ",\"num_experts\":4,\"expert_selection_fn\":\"sparsemixer\"}";
    CHECK(parse(bad, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "expert_selection_fn"));
}

TEST(glm4v_moe_config) {
    ms_config c;
    ms_err err = {0};
    const char *j = "{\"model_type\":\"glm4v_moe\",\"text_config\":{\"model_type\":\"glm4v_moe_text\"," GQA
                    ",\"moe_intermediate_size\":4,\"n_routed_experts\":8,\"n_shared_experts\":1,\"first_k_dense_replace\":1,"
                    "\"attention_bias\":true,\"use_qk_norm\":true,\"rope_parameters\":{\"rope_type\":\"default\","
                    "\"rope_theta\":10000.0,\"partial_rotary_factor\":0.5,\"mrope_section\":[1,0,0]}}}";
    CHECK_MSG(parse(j, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_SIGMOID && c.router_bias && c.attn_bias && c.qk_norm == MS_QKNORM_NONE &&
          c.rope.dim == 2 && c.rope.layout == MS_ROPE_HALF && c.layer_mlp[0] == MS_MLP_DENSE && c.shared_inter == 4);
    const char *other = "{\"model_type\":\"glm4v_moe\",\"text_config\":{\"model_type\":\"glm4_moe\"," GQA
                        ",\"n_routed_experts\":8}}";
    CHECK(parse(other, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "glm4v_moe_text"));
    /* Aria's defaults: 8 experts, top 2, two shared */
    CHECK_MSG(parse("{\"model_type\":\"aria_text\"," GQA "}", &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.n_experts == 8 && c.top_k == 2 && c.shared_inter == 16);
}

TEST(refused_families) {
    ms_config c;
    ms_err err = {0};
    /* known MoE families whose blocks are missing are refused with what they need */
    CHECK(parse("{\"model_type\":\"llama4_text\"}", &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "chunked attention"));
    CHECK(parse("{\"model_type\":\"jamba\"}", &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "Mamba"));
    CHECK(parse("{\"model_type\":\"jetmoe\"}", &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "mixture-of-attention-heads"));
    /* an unknown one lists the supported model_types */
    CHECK(parse("{\"model_type\":\"nonesuch\"}", &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "cohere2_moe"));
}

static void route1(const ms_config *c, const float *logits, int *ids, float *w) {
    float scratch[64];
    ms_route_args a = {.c = c, .logits = logits, .n = 1, .ids = ids, .w = w};
    ms_route_host(&a, scratch);
}

TEST(softmax_group2_router) {
    ms_config c;
    memset(&c, 0, sizeof c);
    c.n_experts = 8, c.top_k = 2, c.n_group = 4, c.topk_group = 1, c.routed_scale = 1.5, c.norm_topk_prob = 1;
    /* groups of two: group 0 (2.0, 1.9) sums highest, group 2 holds the single best expert (2.1, -5): the top-2 rule
     * keeps group 0 where the best-expert rule (SOFTMAX_GROUP) keeps group 2 */
    const float lg[8] = {2.0f, 1.9f, -4.0f, -4.5f, 2.1f, -5.0f, -6.0f, -7.0f};
    int ids[2];
    float w[2];
    c.router = MS_ROUTER_SOFTMAX_GROUP2;
    route1(&c, lg, ids, w);
    CHECK(ids[0] == 0 && ids[1] == 1);
    double a = exp(2.0), b = exp(1.9);
    CHECK_MSG(fabs(w[0] - 1.5 * a / (a + b)) < 1e-6 && fabs(w[1] - 1.5 * b / (a + b)) < 1e-6, "%g %g", w[0], w[1]);
    c.router = MS_ROUTER_SOFTMAX_GROUP;
    route1(&c, lg, ids, w);
    CHECK(ids[0] == 4 && ids[1] == 5);
    /* two groups kept (0 and 2): the plain top-2 over them */
    c.router = MS_ROUTER_SOFTMAX_GROUP2, c.topk_group = 2;
    route1(&c, lg, ids, w);
    CHECK(ids[0] == 4 && ids[1] == 0);
}

TEST_MAIN()
