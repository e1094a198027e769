/* test_new_families.c — the families of issue 16 beyond their fixtures
 * (tests/fixtures/extra, checked by moonshine verify): the gated DeltaNet's
 * split projections (Qwen3.5) give what the fused Qwen3-Next layout gives for
 * the same weights, on the qwen3_5_moe fixture's real layer; and the config
 * rules of each new model_type (what transformers' config classes imply, and
 * what the binds refuse by name); zero-computation experts need only the
 * scale_add_rows op (a backend without it is refused by the op's name). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/linear_attn.h"
#include "backend/cpu/backend_cpu.h"
#include "core/backend.h"
#include "model/model.h"
#include "text/outparse.h"
#include "test.h"

#define Q35 "tests/fixtures/extra/qwen3_5_moe"

/* F32 copy of rows [r0, r0 + n) of w into dst (row-major, w->cols wide). */
static void rows_f32(const ms_qmat *w, int64_t r0, int64_t n, float *dst) {
    for (int64_t r = 0; r < n; r++) ms_qmat_row(w, r0 + r, dst + r * w->cols);
}

TEST(gdn_split_matches_fused_layout) {
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(Q35, &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    CHECK(m.cfg.gdn_split == 1);
    int layer = -1;
    for (int l = 0; l < m.cfg.n_layers && layer < 0; l++)
        if (m.cfg.layer_attn[l] == MS_ATTN_GDN) layer = l;
    CHECK(layer >= 0);
    if (layer < 0) return;
    const ms_gdn_weights *w = &m.layers[layer].gdn;
    CHECK(!w->in_qkvz.data && w->in_qkv.data && w->in_z.data && w->in_b.data && w->in_a.data);
    ms_gdn_config gc = {.hidden = (int)m.cfg.hidden, .k_heads = (int)m.cfg.gdn_k_heads,
                        .v_heads = (int)m.cfg.gdn_v_heads, .k_dim = (int)m.cfg.gdn_k_dim,
                        .v_dim = (int)m.cfg.gdn_v_dim, .conv_kernel = (int)m.cfg.kda_conv,
                        .norm_eps = (float)m.cfg.rms_eps};
    CHECK(ms_gdn_check(&gc, w, &err) == MS_OK);
    /* the same weights in Qwen3-Next's fused layout: per key head g, [q, k, v (r heads), z (r heads)]
     * rows of in_proj_qkvz and [b (r), a (r)] rows of in_proj_ba */
    const int Hk = gc.k_heads, Hv = gc.v_heads, r = Hv / Hk, dk = gc.k_dim, dv = gc.v_dim, D = gc.hidden;
    const int64_t Kd = (int64_t)Hk * dk, Vd = (int64_t)Hv * dv, P = 2 * Kd + 2 * Vd;
    float *qkvz = malloc(sizeof(float) * P * D), *ba = malloc(sizeof(float) * 2 * Hv * D);
    for (int g = 0; g < Hk; g++) {
        float *grp = qkvz + (int64_t)g * (2 * dk + 2 * r * dv) * D;
        rows_f32(&w->in_qkv, (int64_t)g * dk, dk, grp);
        rows_f32(&w->in_qkv, Kd + (int64_t)g * dk, dk, grp + (int64_t)dk * D);
        rows_f32(&w->in_qkv, 2 * Kd + (int64_t)g * r * dv, (int64_t)r * dv, grp + (int64_t)2 * dk * D);
        rows_f32(&w->in_z, (int64_t)g * r * dv, (int64_t)r * dv, grp + (int64_t)(2 * dk + r * dv) * D);
        rows_f32(&w->in_b, (int64_t)g * r, r, ba + (int64_t)g * 2 * r * D);
        rows_f32(&w->in_a, (int64_t)g * r, r, ba + (int64_t)(g * 2 * r + r) * D);
    }
    ms_gdn_weights f = *w;
    memset(&f.in_qkv, 0, sizeof f.in_qkv), memset(&f.in_z, 0, sizeof f.in_z);
    memset(&f.in_b, 0, sizeof f.in_b), memset(&f.in_a, 0, sizeof f.in_a);
    f.in_qkvz = (ms_qmat){.dtype = MS_DT_F32, .rows = P, .cols = D, .data = qkvz};
    f.in_ba = (ms_qmat){.dtype = MS_DT_F32, .rows = 2 * Hv, .cols = D, .data = ba};
    CHECK(ms_gdn_check(&gc, &f, &err) == MS_OK);
    /* and the split layout with one matrix missing is refused by name */
    ms_gdn_weights bad = *w;
    memset(&bad.in_z, 0, sizeof bad.in_z);
    CHECK(ms_gdn_check(&gc, &bad, &err) == MS_ERR_SHAPE && strstr(err.msg, "in_proj_z"));
    const int n = 70; /* two chunks of the chunked form, then token by token */
    float *x = malloc(sizeof(float) * n * D), *y1 = malloc(sizeof(float) * n * D), *y2 = malloc(sizeof(float) * n * D);
    uint32_t s = 777;
    for (int i = 0; i < n * D; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 2.0f;
    }
    ms_kda_state a, b;
    CHECK(ms_gdn_state_init(&a, &gc, &err) == MS_OK && ms_gdn_state_init(&b, &gc, &err) == MS_OK);
    CHECK(ms_gdn_forward(NULL, &gc, w, &a, x, 66, y1, MS_KDA_AUTO, &err) == MS_OK);
    CHECK(ms_gdn_forward(NULL, &gc, &f, &b, x, 66, y2, MS_KDA_AUTO, &err) == MS_OK);
    for (int t = 66; t < n; t++) {
        CHECK(ms_gdn_forward(NULL, &gc, w, &a, x + t * D, 1, y1 + t * D, MS_KDA_AUTO, &err) == MS_OK);
        CHECK(ms_gdn_forward(NULL, &gc, &f, &b, x + t * D, 1, y2 + t * D, MS_KDA_AUTO, &err) == MS_OK);
    }
    double md = 0, mag = 0;
    for (int i = 0; i < n * D; i++) md = fmax(md, fabs(y1[i] - y2[i])), mag = fmax(mag, fabs(y2[i]));
    CHECK_MSG(md <= 1e-6 * fmax(1.0, mag), "split vs fused: %.3g (output magnitude %.3g)", md, mag);
    CHECK(mag > 0);
    ms_kda_state_free(&a);
    ms_kda_state_free(&b);
    free(x), free(y1), free(y2), free(qkvz), free(ba);
    ms_model_free(&m);
}

static int parse(const char *json, ms_config *c, ms_err *err) { return ms_config_parse(json, strlen(json), "t", c, err); }

#define GQA "\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2," \
            "\"num_key_value_heads\":1,\"head_dim\":4,\"intermediate_size\":8,\"num_experts_per_tok\":2"

TEST(new_family_configs) {
    ms_config c;
    ms_err err = {0};
    /* qwen3_5_moe: the text config under text_config, split projections, top-k always renormalised */
    const char *q35 = "{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"model_type\":\"qwen3_5_moe_text\"," GQA
                      ",\"moe_intermediate_size\":4,\"num_experts\":4,\"shared_expert_intermediate_size\":4,"
                      "\"linear_num_key_heads\":1,\"linear_num_value_heads\":2,\"linear_key_head_dim\":4,"
                      "\"linear_value_head_dim\":4,\"partial_rotary_factor\":0.5,\"layer_types\":[\"linear_attention\",\"full_attention\"]}}";
    CHECK_MSG(parse(q35, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.gdn_split && c.norm_topk_prob && c.shared_expert_gate && c.layer_attn[0] == MS_ATTN_GDN &&
          c.layer_attn[1] == MS_ATTN_GQA && c.layer_mlp[0] == MS_MLP_MOE && c.layer_mlp[1] == MS_MLP_MOE);
    const char *q35_step = "{\"model_type\":\"qwen3_5_moe_text\"," GQA ",\"moe_intermediate_size\":4,\"num_experts\":4,"
                           "\"decoder_sparse_step\":2}";
    CHECK(parse(q35_step, &c, &err) == MS_ERR_FORMAT && strstr(err.msg, "decoder_sparse_step"));
    const char *q35_tmt = "{\"model_type\":\"qwen3_5_moe\",\"text_config\":{\"model_type\":\"qwen3_next\"," GQA
                          ",\"moe_intermediate_size\":4,\"num_experts\":4}}";
    CHECK(parse(q35_tmt, &c, &err) == MS_ERR_UNSUPPORTED);
    /* kimi_k25: DeepSeek V3 under text_config, model_type kimi_k2 or deepseek_v3 */
#define K25T "\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2," \
             "\"intermediate_size\":8,\"moe_intermediate_size\":4,\"n_routed_experts\":4,\"num_experts_per_tok\":2," \
             "\"kv_lora_rank\":4,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,\"v_head_dim\":4,\"first_k_dense_replace\":1"
    const char *k25 = "{\"model_type\":\"kimi_k25\",\"text_config\":{\"model_type\":\"kimi_k2\"," K25T "}}";
    CHECK_MSG(parse(k25, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.layer_attn[0] == MS_ATTN_MLA && c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE &&
          c.router == MS_ROUTER_SIGMOID && c.router_bias);
    /* its INT4 quantization_config, in text_config or (when text_config has none) at the top level */
#define K25Q "\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"pack-quantized\"," \
             "\"config_groups\":{\"group_0\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,\"type\":\"int\"," \
             "\"symmetric\":true,\"strategy\":\"group\",\"group_size\":32}}},\"ignore\":[\"lm_head\"]}"
    const char *k25_qin = "{\"model_type\":\"kimi_k25\",\"text_config\":{\"model_type\":\"kimi_k2\"," K25T "," K25Q "}}";
    CHECK_MSG(parse(k25_qin, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.int4_packed && c.int4_group == 32);
    const char *k25_qtop = "{\"model_type\":\"kimi_k25\"," K25Q ",\"text_config\":{\"model_type\":\"kimi_k2\"," K25T "}}";
    CHECK_MSG(parse(k25_qtop, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.int4_packed && c.int4_group == 32);
    CHECK_MSG(parse(k25, &c, &err) == MS_OK && !c.int4_packed, "%s", err.msg);
    const char *k25_other = "{\"model_type\":\"kimi_k25\",\"text_config\":{\"model_type\":\"kimi_linear\"," K25T "}}";
    CHECK(parse(k25_other, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "kimi_linear"));
    /* glm4_moe_lite: the schedule from mlp_layer_types (default: one dense layer, then MoE) */
    const char *lite = "{\"model_type\":\"glm4_moe_lite\"," K25T "}";
    CHECK(parse(lite, &c, &err) == MS_ERR_FORMAT && strstr(err.msg, "first_k_dense_replace"));
    const char *lite_dflt = "{\"model_type\":\"glm4_moe_lite\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":3,"
                            "\"num_attention_heads\":2,\"intermediate_size\":8,\"moe_intermediate_size\":4,"
                            "\"n_routed_experts\":4,\"num_experts_per_tok\":2,\"kv_lora_rank\":4,\"qk_nope_head_dim\":4,"
                            "\"qk_rope_head_dim\":2,\"v_head_dim\":4}";
    CHECK_MSG(parse(lite_dflt, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE && c.layer_mlp[2] == MS_MLP_MOE);
    const char *lite_bad = "{\"model_type\":\"glm4_moe_lite\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":2,"
                           "\"num_attention_heads\":2,\"intermediate_size\":8,\"moe_intermediate_size\":4,"
                           "\"n_routed_experts\":4,\"num_experts_per_tok\":2,\"kv_lora_rank\":4,\"qk_nope_head_dim\":4,"
                           "\"qk_rope_head_dim\":2,\"v_head_dim\":4,\"mlp_layer_types\":[\"dense\",\"moe\"]}";
    CHECK(parse(lite_bad, &c, &err) == MS_ERR_FORMAT && strstr(err.msg, "mlp_layer_types[1]"));
    /* mixtral: experts of width intermediate_size, top-k softmax; a sliding window is refused */
    const char *mix = "{\"model_type\":\"mixtral\"," GQA ",\"num_local_experts\":4,\"sliding_window\":null}";
    CHECK_MSG(parse(mix, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.router == MS_ROUTER_TOPK_SOFTMAX && c.moe_inter == 8 && c.qk_norm == 0);
    const char *mix_sw = "{\"model_type\":\"mixtral\"," GQA ",\"num_local_experts\":4,\"sliding_window\":4096}";
    CHECK(parse(mix_sw, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "sliding_window"));
    /* qwen2_moe: q/k/v biases from qkv_bias, gated shared expert, norm_topk_prob as given */
    const char *q2 = "{\"model_type\":\"qwen2_moe\"," GQA ",\"moe_intermediate_size\":4,\"num_experts\":4,"
                     "\"shared_expert_intermediate_size\":4,\"norm_topk_prob\":false,\"mlp_only_layers\":[1]}";
    CHECK_MSG(parse(q2, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.attn_bias && c.shared_expert_gate && !c.norm_topk_prob && c.layer_mlp[0] == MS_MLP_MOE &&
          c.layer_mlp[1] == MS_MLP_DENSE);
    const char *q2_sw = "{\"model_type\":\"qwen2_moe\"," GQA ",\"moe_intermediate_size\":4,\"num_experts\":4,"
                        "\"use_sliding_window\":true}";
    CHECK(parse(q2_sw, &c, &err) == MS_ERR_UNSUPPORTED);
    /* olmoe: whole-projection q/k norm; clip_qkv refused */
    const char *ol = "{\"model_type\":\"olmoe\"," GQA ",\"num_experts\":4,\"clip_qkv\":null}";
    CHECK_MSG(parse(ol, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.qk_norm == MS_QKNORM_FULL && c.router == MS_ROUTER_SOFTMAX && c.moe_inter == 8);
    const char *ol_clip = "{\"model_type\":\"olmoe\"," GQA ",\"num_experts\":4,\"clip_qkv\":8.0}";
    CHECK(parse(ol_clip, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "clip_qkv"));
    /* qwen3_vl_moe: the text config must be under text_config; the router always renormalises */
    const char *vl = "{\"model_type\":\"qwen3_vl_moe\",\"text_config\":{\"model_type\":\"qwen3_vl_moe_text\"," GQA
                     ",\"moe_intermediate_size\":4,\"num_experts\":4}}";
    CHECK_MSG(parse(vl, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.norm_topk_prob && c.qk_norm == MS_QKNORM_HEAD && c.router == MS_ROUTER_SOFTMAX);
    const char *vl_flat = "{\"model_type\":\"qwen3_vl_moe\"," GQA ",\"moe_intermediate_size\":4,\"num_experts\":4}";
    CHECK(parse(vl_flat, &c, &err) == MS_ERR_FORMAT && strstr(err.msg, "text_config"));
    /* longcat_flash: two engine layers per decoder layer, the MoE on the first as a shortcut into the second,
     * the router over the routed plus the zero-computation experts */
#define LC "\"model_type\":\"longcat_flash\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":6," \
           "\"num_attention_heads\":2,\"q_lora_rank\":4,\"kv_lora_rank\":4,\"qk_nope_head_dim\":4," \
           "\"qk_rope_head_dim\":2,\"v_head_dim\":4,\"n_routed_experts\":4,\"ffn_hidden_size\":8," \
           "\"expert_ffn_hidden_size\":4,\"routed_scaling_factor\":6.0"
    const char *lc = "{" LC ",\"num_layers\":3,\"zero_expert_num\":2,\"moe_topk\":2}";
    CHECK_MSG(parse(lc, &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.n_layers == 6 && c.n_experts == 4 && c.n_zero_experts == 2 && ms_router_width(&c) == 6 &&
          c.router == MS_ROUTER_SOFTMAX_BIAS && c.router_bias && !c.norm_topk_prob && c.routed_scale == 6.0 &&
          c.inter == 8 && c.moe_inter == 4 && c.top_k == 2);
    for (int l = 0; l < 6; l++)
        CHECK(c.layer_attn[l] == MS_ATTN_MLA && c.layer_shortcut[l] == (l % 2 ? 2 : 1) &&
              c.layer_mlp[l] == (l % 2 ? MS_MLP_DENSE : MS_MLP_MOE));
    const char *lc_k = "{" LC ",\"num_layers\":3,\"zero_expert_num\":2,\"moe_topk\":7}";
    CHECK(parse(lc_k, &c, &err) == MS_ERR_FORMAT && strstr(err.msg, "moe_topk"));
    const char *lc_n = "{" LC "}";
    CHECK(parse(lc_n, &c, &err) == MS_ERR_FORMAT && strstr(err.msg, "num_layers"));
    const char *lc_b = "{" LC ",\"num_layers\":3,\"moe_topk\":2,\"router_bias\":true}";
    CHECK(parse(lc_b, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "router_bias"));
}
/* Kimi K2.5 replies in Kimi K2's format (reasoning, tool-call sections); GLM-4.7-Flash in GLM's. */
TEST(new_family_output_formats) {
    CHECK(ms_outfmt_for_model_type("kimi_k25") == MS_OUTFMT_KIMI_K2);
    CHECK(ms_outfmt_for_model_type("glm4_moe_lite") == MS_OUTFMT_GLM);
}

/* zero-computation experts run on any backend with the scale_add_rows op (device backends
 * included); one without it is refused by the op's name */
TEST(zero_experts_need_scale_add_rows) {
    ms_config c;
    ms_err err = {0};
    const char *lc = "{" LC ",\"num_layers\":1,\"zero_expert_num\":2,\"moe_topk\":2}";
    CHECK_MSG(parse(lc, &c, &err) == MS_OK, "%s", err.msg);
    ms_backend *be = NULL;
    CHECK(ms_backend_cpu_create(NULL, &be, &err) == MS_OK);
    if (!be) return;
    CHECK_MSG(ms_backend_require(be, &c, &err) == MS_OK, "%s", err.msg);
    be->host_memory = 0; /* as a device backend: still runs them */
    CHECK_MSG(ms_backend_require(be, &c, &err) == MS_OK, "%s", err.msg);
    be->host_memory = 1;
    const ms_backend_ops *ops = be->ops;
    ms_backend_ops without = *ops;
    without.scale_add_rows = NULL;
    be->ops = &without;
    CHECK(ms_backend_require(be, &c, &err) == MS_ERR_UNSUPPORTED && strstr(err.msg, "scale_add_rows"));
    c.n_zero_experts = 0;
    CHECK(ms_backend_require(be, &c, &err) == MS_OK);
    be->ops = ops;
    be->ops->destroy(be);
}

TEST_MAIN()
