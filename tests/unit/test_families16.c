/* test_families16.c — the second round of issue 16's families beyond their
 * fixtures (tests/fixtures/extra, checked by moonshine verify): the config rules
 * of deepseek_v2, dots1, hunyuan_v1_moe, ernie4_5_moe, granitemoe(shared),
 * flex_olmo, exaone_moe, solar_open, dbrx and phimoe (hand-written config.json text, what
 * transformers' config classes imply, what the binds refuse by name), and the
 * DeepSeek-V2 group-limited router (MS_ROUTER_SOFTMAX_GROUP) on logits where it
 * chooses other experts than the plain softmax top-k and the sigmoid groups;
 * the CPU LayerNorm and clamp ops DBRX needs; PhiMoE's sparsemixer routing. */
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
            "\"n_shared_experts\":1,\"routed_scaling_factor\":2.0,\"norm_topk_prob\":true"

TEST(deepseek_v2_configs) {
    ms_config c;
    ms_err err = {0};
    const char *glg = "{\"model_type\":\"deepseek_v2\"," MLA ",\"q_lora_rank\":6,\"n_group\":2,\"topk_group\":1,"
                      "\"topk_method\":\"group_limited_greedy\"}";
    CHECK_MSG(parse(glg, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_SOFTMAX_GROUP && !c.router_bias && !c.norm_topk_prob && c.routed_scale == 2.0 &&
          c.n_group == 2 && c.topk_group == 1 && c.q_lora_rank == 6 && c.shared_inter == 4);
    CHECK(c.layer_attn[0] == MS_ATTN_MLA && c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE);
    CHECK(c.rope.layout == MS_ROPE_INTERLEAVED && c.rope.dim == 2 && fabs(c.attn_scale - 1.0 / sqrt(6.0)) < 1e-12);
    /* V2-Lite: greedy (plain softmax top-k), q_proj (no q_lora_rank), groups ignored */
    const char *lite = "{\"model_type\":\"deepseek_v2\"," MLA ",\"q_lora_rank\":null,\"n_group\":null,\"topk_method\":\"greedy\"}";
    CHECK_MSG(parse(lite, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_SOFTMAX && c.q_lora_rank == 0 && c.n_group == 1 && !c.norm_topk_prob);
    /* no mscale in the softmax scale with YaRN (transformers' DeepseekV2Attention) */
    const char *yarn = "{\"model_type\":\"deepseek_v2\"," MLA ",\"topk_method\":\"greedy\",\"rope_scaling\":{\"type\":\"yarn\","
                       "\"factor\":4.0,\"original_max_position_embeddings\":1024,\"mscale\":0.707,\"mscale_all_dim\":0.707,"
                       "\"beta_fast\":32,\"beta_slow\":1}}";
    CHECK_MSG(parse(yarn, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.rope.yarn && fabs(c.attn_scale - 1.0 / sqrt(6.0)) < 1e-12);
    const char *bad = "{\"model_type\":\"deepseek_v2\"," MLA ",\"topk_method\":\"noaux_tc\"}";
    CHECK(parse(bad, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "noaux_tc"));
    const char *sig = "{\"model_type\":\"deepseek_v2\"," MLA ",\"scoring_func\":\"sigmoid\"}";
    CHECK(parse(sig, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "scoring_func"));
}

TEST(gqa_sigmoid_configs) {
    ms_config c;
    ms_err err = {0};
    /* dots1: V3 router, per-head q/k norm, the sliding layers from layer_types */
    const char *dots = "{\"model_type\":\"dots1\"," GQA ",\"moe_intermediate_size\":4,\"n_routed_experts\":4,"
                       "\"n_shared_experts\":1,\"first_k_dense_replace\":1,\"sliding_window\":8,\"max_window_layers\":1,"
                       "\"layer_types\":[\"full_attention\",\"sliding_attention\"]}";
    CHECK_MSG(parse(dots, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_SIGMOID && c.router_bias && c.qk_norm == MS_QKNORM_HEAD && c.shared_inter == 4 &&
          c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE && c.layer_window[0] == 0 &&
          c.layer_window[1] == 8);
    /* without layer_types: sliding from max_window_layers on (Dots1Config's default schedule) */
    const char *dots_d = "{\"model_type\":\"dots1\"," GQA ",\"moe_intermediate_size\":4,\"n_routed_experts\":4,"
                         "\"sliding_window\":8,\"max_window_layers\":1}";
    CHECK_MSG(parse(dots_d, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.layer_window[0] == 0 && c.layer_window[1] == 8 && c.layer_mlp[0] == MS_MLP_MOE);
    const char *dots_bad = "{\"model_type\":\"dots1\"," GQA ",\"moe_intermediate_size\":4,\"n_routed_experts\":4,"
                           "\"layer_types\":[\"full_attention\",\"chunked_attention\"]}";
    CHECK(parse(dots_bad, &c, &err) == MS_ERR_FORMAT && strstr(err.msg, "layer_types[1]"));
    /* exaone_moe: sliding layers with RoPE, full layers NoPE (rotary dims 0), mlp_layer_types */
    const char *ex = "{\"model_type\":\"exaone_moe\"," GQA ",\"moe_intermediate_size\":4,\"num_experts\":4,"
                     "\"num_shared_experts\":1,\"sliding_window\":8,\"layer_types\":[\"sliding_attention\",\"full_attention\"],"
                     "\"mlp_layer_types\":[\"dense\",\"sparse\"]}";
    CHECK_MSG(parse(ex, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.layer_window[0] == 8 && c.layer_window[1] == 0 && c.layer_rope[0] == 0 && c.layer_rope[1] == 1 &&
          c.rope.dim == 4 && c.rope_alt.dim == 0 && c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE &&
          c.qk_norm == MS_QKNORM_HEAD && c.router == MS_ROUTER_SIGMOID);
    /* no sliding window: every layer full with RoPE; the schedule from first_k_dense_replace */
    const char *ex_full = "{\"model_type\":\"exaone_moe\"," GQA ",\"moe_intermediate_size\":4,\"num_experts\":4,"
                          "\"sliding_window\":null,\"first_k_dense_replace\":0}";
    CHECK_MSG(parse(ex_full, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.layer_window[0] == 0 && c.layer_window[1] == 0 && !c.layer_rope[0] && !c.layer_rope[1] &&
          c.layer_mlp[0] == MS_MLP_MOE);
    /* solar_open: q/k/v biases, no q/k norm, MoE everywhere, partial rotary from rope_parameters */
    const char *so = "{\"model_type\":\"solar_open\"," GQA ",\"moe_intermediate_size\":4,\"n_routed_experts\":4,"
                     "\"n_shared_experts\":1,\"attention_bias\":true,\"rope_parameters\":{\"rope_type\":\"default\","
                     "\"rope_theta\":1000000.0,\"partial_rotary_factor\":0.5}}";
    CHECK_MSG(parse(so, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.attn_bias && !c.o_bias && c.qk_norm == MS_QKNORM_NONE && c.rope.dim == 2 && c.rope.theta == 1e6 &&
          c.layer_mlp[0] == MS_MLP_MOE && c.layer_mlp[1] == MS_MLP_MOE && c.shared_inter == 4);
}

TEST(gqa_softmax_configs) {
    ms_config c;
    ms_err err = {0};
    /* hunyuan_v1_moe: q/k norm after RoPE, renormalised softmax top-k, shared MLP of intermediate_size,
     * per-layer lists that agree */
    const char *hy = "{\"model_type\":\"hunyuan_v1_moe\"," GQA ",\"num_experts\":[4,4],\"moe_topk\":[2,2],"
                     "\"moe_intermediate_size\":[6,6],\"num_shared_expert\":[1,1],\"use_cla\":false}";
    CHECK_MSG(parse(hy, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.n_experts == 4 && c.top_k == 2 && c.moe_inter == 6 && c.shared_inter == 8 && c.qk_norm == MS_QKNORM_HEAD &&
          c.qk_norm_after_rope && c.router == MS_ROUTER_SOFTMAX && c.norm_topk_prob);
    const char *hy_mixed = "{\"model_type\":\"hunyuan_v1_moe\"," GQA ",\"num_experts\":[4,8],\"moe_topk\":2}";
    CHECK(parse(hy_mixed, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "num_experts"));
    const char *hy_cla = "{\"model_type\":\"hunyuan_v1_moe\"," GQA ",\"num_experts\":4,\"moe_topk\":2,\"use_cla\":true}";
    CHECK(parse(hy_cla, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "use_cla"));
    /* RoPE alpha (DynamicNTKAlphaRotary): theta x alpha^(hd / (hd - 2)) */
    const char *hy_a = "{\"model_type\":\"hunyuan_v1_moe\"," GQA ",\"num_experts\":4,\"moe_topk\":2,\"rope_theta\":10000.0,"
                       "\"rope_scaling\":{\"type\":\"dynamic\",\"alpha\":4.0,\"factor\":1.0}}";
    CHECK_MSG(parse(hy_a, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(fabs(c.rope.theta - 10000.0 * pow(4.0, 2.0)) < 1e-6 && c.moe_inter == 8);
    /* ernie4_5_moe: softmax + correction bias for the choice, renormalised, interleaved RoPE, the MoE range,
     * tied embeddings unless the config says otherwise */
    const char *er = "{\"model_type\":\"ernie4_5_moe\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":4,"
                     "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"intermediate_size\":8,\"moe_intermediate_size\":4,"
                     "\"moe_num_experts\":4,\"moe_k\":2,\"moe_num_shared_experts\":2,\"moe_layer_start_index\":1,"
                     "\"moe_layer_end_index\":2,\"moe_layer_interval\":1}";
    CHECK_MSG(parse(er, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_SOFTMAX_BIAS && c.router_bias && c.norm_topk_prob && c.tie_embeddings &&
          c.rope.layout == MS_ROPE_INTERLEAVED && c.head_dim == 4 && c.shared_inter == 8 && c.top_k == 2 &&
          c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE && c.layer_mlp[2] == MS_MLP_MOE &&
          c.layer_mlp[3] == MS_MLP_DENSE);
    const char *er_bias = "{\"model_type\":\"ernie4_5_moe\"," GQA ",\"moe_intermediate_size\":4,\"moe_num_experts\":4,"
                          "\"moe_k\":2,\"use_bias\":true}";
    CHECK(parse(er_bias, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "use_bias"));
}

TEST(granite_flex_olmo_configs) {
    ms_config c;
    ms_err err = {0};
    /* granitemoe: the multipliers as engine fields, the softmax scale is attention_multiplier */
    const char *gr = "{\"model_type\":\"granitemoe\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"intermediate_size\":4,\"num_local_experts\":4,"
                     "\"num_experts_per_tok\":2,\"embedding_multiplier\":12.0,\"attention_multiplier\":0.015625,"
                     "\"residual_multiplier\":0.22,\"logits_scaling\":8.0,\"position_embedding_type\":\"rope\"}";
    CHECK_MSG(parse(gr, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_TOPK_SOFTMAX && c.moe_inter == 4 && c.head_dim == 4 && c.embed_scale == 12.0 &&
          c.residual_scale == 0.22 && c.logit_scale == 0.125 && c.attn_scale == 0.015625 && !c.shared_inter);
    const char *grs = "{\"model_type\":\"granitemoeshared\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,"
                      "\"num_attention_heads\":2,\"intermediate_size\":4,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
                      "\"shared_intermediate_size\":6}";
    CHECK_MSG(parse(grs, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.shared_inter == 6 && c.embed_scale == 1.0 && c.logit_scale == 1.0 && c.n_kv_heads == 2);
    const char *gr_nope = "{\"model_type\":\"granitemoe\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,"
                          "\"num_attention_heads\":2,\"intermediate_size\":4,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
                          "\"position_embedding_type\":\"nope\"}";
    CHECK(parse(gr_nope, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "position_embedding_type"));
    /* flex_olmo: OLMoE with the norms after the sublayers */
    const char *fo = "{\"model_type\":\"flex_olmo\"," GQA ",\"num_experts\":4,\"norm_topk_prob\":false}";
    CHECK_MSG(parse(fo, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.post_norm && c.qk_norm == MS_QKNORM_FULL && c.router == MS_ROUTER_SOFTMAX && !c.norm_topk_prob &&
          c.moe_inter == 8);
}

TEST(dbrx_config_and_ops) {
    ms_config c;
    ms_err err = {0};
    /* DbrxConfig's own names (d_model, n_layers, n_heads, max_seq_len) and nested attn/ffn configs */
    const char *dx = "{\"model_type\":\"dbrx\",\"vocab_size\":16,\"d_model\":8,\"n_layers\":2,\"n_heads\":2,"
                     "\"max_seq_len\":64,\"attn_config\":{\"kv_n_heads\":1,\"clip_qkv\":8.0,\"rope_theta\":500000.0},"
                     "\"ffn_config\":{\"ffn_hidden_size\":6,\"moe_num_experts\":4,\"moe_top_k\":2,"
                     "\"moe_normalize_expert_weights\":1.0,\"ffn_act_fn\":{\"name\":\"silu\"}}}";
    CHECK_MSG(parse(dx, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.hidden == 8 && c.n_layers == 2 && c.n_heads == 2 && c.n_kv_heads == 1 && c.head_dim == 4 && c.max_pos == 64 &&
          c.layernorm && c.clip_qkv == 8.0 && c.rms_eps == 1e-5 && c.router == MS_ROUTER_SOFTMAX && c.norm_topk_prob &&
          c.n_experts == 4 && c.top_k == 2 && c.moe_inter == 6 && c.rope.theta == 500000.0 && c.rope.dim == 4);
    const char *dx_p2 = "{\"model_type\":\"dbrx\",\"vocab_size\":16,\"d_model\":8,\"n_layers\":2,\"n_heads\":2,"
                        "\"attn_config\":{\"kv_n_heads\":1},\"ffn_config\":{\"ffn_hidden_size\":6,\"moe_num_experts\":4,"
                        "\"moe_top_k\":2,\"moe_normalize_expert_weights\":2.0}}";
    CHECK(parse(dx_p2, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "moe_normalize_expert_weights"));
    const char *dx_none = "{\"model_type\":\"dbrx\",\"vocab_size\":16,\"d_model\":8,\"n_layers\":2,\"n_heads\":2}";
    CHECK(parse(dx_none, &c, &err) == MS_ERR_FORMAT && strstr(err.msg, "attn_config"));
    /* the CPU ops it needs: LayerNorm (with and without affine terms) and the clamp */
    ms_backend *be = NULL;
    CHECK(ms_backend_cpu_create(NULL, &be, &err) == MS_OK);
    if (!be) return;
    CHECK_MSG(ms_backend_require(be, &c, &err) == MS_OK, "%s", err.msg);
    const float x[8] = {1, 2, 3, 4, -1, 0, 1, 6}, w[4] = {1, 2, 0.5f, 1}, b[4] = {0, 1, 0, -1};
    float y[8];
    be->ops->layernorm(be, y, x, w, b, 2, 4, 1e-5f);
    for (int r = 0; r < 2; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < 4; i++) m += x[r * 4 + i] / 4.0;
        for (int i = 0; i < 4; i++) v += (x[r * 4 + i] - m) * (x[r * 4 + i] - m) / 4.0;
        for (int i = 0; i < 4; i++)
            CHECK(fabs(y[r * 4 + i] - ((x[r * 4 + i] - m) / sqrt(v + 1e-5) * w[i] + b[i])) < 1e-5);
    }
    be->ops->layernorm(be, y, x, NULL, NULL, 1, 4, 1e-5f);
    CHECK(fabs(y[0] + y[1] + y[2] + y[3]) < 1e-5 && fabs(y[0] + 1.3416355) < 1e-4);
    float z[4] = {-3, -0.5f, 0.25f, 9};
    be->ops->clamp(be, z, -1, 1, 4);
    CHECK(z[0] == -1 && z[1] == -0.5f && z[2] == 0.25f && z[3] == 1);
    be->ops->destroy(be);
}

TEST(phimoe_config) {
    ms_config c;
    ms_err err = {0};
    const char *ph = "{\"model_type\":\"phimoe\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"intermediate_size\":6,\"num_local_experts\":4,"
                     "\"num_experts_per_tok\":2,\"rms_norm_eps\":1e-5,\"attention_bias\":true,\"lm_head_bias\":true,"
                     "\"router_jitter_noise\":0.01,\"sliding_window\":null}";
    CHECK_MSG(parse(ph, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_SPARSEMIXER && c.router_jitter == 0.01 && c.layernorm && c.attn_bias && c.o_bias &&
          c.head_dim == 4 && c.moe_inter == 6 && c.layer_window[0] == 0);
    const char *ph_k = "{\"model_type\":\"phimoe\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":2,\"intermediate_size\":6,\"num_local_experts\":4,\"num_experts_per_tok\":3}";
    CHECK(parse(ph_k, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "sparsemixer"));
    const char *ph_lr = "{\"model_type\":\"phimoe\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,"
                        "\"num_attention_heads\":2,\"intermediate_size\":6,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
                        "\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1.0,1.0],\"long_factor\":[2.0,2.0]}}";
    CHECK(parse(ph_lr, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "longrope"));
}

/* Routing one token with c's router over E logits. */
static void route1(const ms_config *c, const float *logits, int *ids, float *w) {
    float scratch[64];
    ms_route_args a = {.c = c, .logits = logits, .n = 1, .ids = ids, .w = w};
    ms_route_host(&a, scratch);
}

TEST(softmax_group_router) {
    ms_config c;
    memset(&c, 0, sizeof c);
    c.n_experts = 8, c.top_k = 2, c.n_group = 2, c.topk_group = 1, c.routed_scale = 2.0, c.norm_topk_prob = 0;
    /* group 0 holds three good experts, group 1 the single best one: group_limited_greedy keeps group 1
     * (best expert 2.1 > 2.0) and fills the second slot from it; the plain top-k takes experts 4 and 0;
     * the sigmoid rule (sum of the top two) would keep group 0 */
    const float lg[8] = {2.0f, 1.9f, 1.8f, -5.0f, 2.1f, -6.0f, -5.5f, -7.0f};
    double den = 0;
    for (int i = 0; i < 8; i++) den += exp((double)lg[i]);
    int ids[2];
    float w[2];
    c.router = MS_ROUTER_SOFTMAX_GROUP;
    route1(&c, lg, ids, w);
    CHECK(ids[0] == 4 && ids[1] == 6);
    CHECK(fabs(w[0] - 2.0 * exp(2.1) / den) < 1e-6 && fabs(w[1] - 2.0 * exp(-5.5) / den) < 1e-6);
    c.router = MS_ROUTER_SOFTMAX;
    route1(&c, lg, ids, w);
    CHECK(ids[0] == 4 && ids[1] == 0 && fabs(w[1] - 2.0 * exp(2.0) / den) < 1e-6);
    /* one group: the same as the plain softmax router, and renormalised when asked */
    c.router = MS_ROUTER_SOFTMAX_GROUP, c.n_group = c.topk_group = 1, c.norm_topk_prob = 1;
    route1(&c, lg, ids, w);
    CHECK(ids[0] == 4 && ids[1] == 0 && fabs(w[0] + w[1] - 2.0) < 1e-6);
}

TEST(sparsemixer_router) {
    ms_config c;
    memset(&c, 0, sizeof c);
    c.n_experts = 6, c.top_k = 2, c.router = MS_ROUTER_SPARSEMIXER, c.router_jitter = 0.01;
    /* round 1: best 5.0 (expert 2); within 2% relative ((5.0 - s) / 5.0 <= 0.02): 4.95 and 4.91, not 4.86 or
     * 4.8; round 2 over the others: best 4.95 (expert 4), within 2% of it: 4.91 and 4.86 */
    const float lg[6] = {4.91f, 4.8f, 5.0f, 4.86f, 4.95f, -1.0f};
    int ids[2];
    float w[2];
    route1(&c, lg, ids, w);
    CHECK(ids[0] == 2 && ids[1] == 4);
    double d1 = exp(5.0) + exp(4.95) + exp(4.91), d2 = exp(4.95) + exp(4.91) + exp(4.86);
    CHECK_MSG(fabs(w[0] - exp(5.0) / d1) < 1e-5, "%g vs %g", w[0], exp(5.0) / d1);
    CHECK_MSG(fabs(w[1] - exp(4.95) / d2) < 1e-5, "%g vs %g", w[1], exp(4.95) / d2);
}

TEST_MAIN()
