/* test_qwen3_next.c — Qwen3-Next (gated DeltaNet + gated attention) on the
 * transformers-made fixture tests/data/fixtures/models/qwen3_next: the
 * 40-token reference logits reproduced when the sequence arrives in uneven
 * pieces (so the carried conv + recurrent state and the chunked/recurrent
 * switch are crossed at every boundary); the gated DeltaNet block's chunked
 * and recurrent forms agree on the real layer weights; config defaults and
 * errors follow transformers' Qwen3NextConfig. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "backend/cpu/linear_attn.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "fixture.h"
#include "test.h"

#define DIR "tests/data/fixtures/models/qwen3_next"

static void logits_in_pieces(const int *pieces, int np, int max_batch, int threads) {
    static const int32_t other[6] = {7, 2, 9, 4, 4, 1}; /* an unrelated sequence first: reset must clear every state */
    double md = ms_test_logits_in_pieces(DIR, NULL, pieces, np, max_batch, threads, other, 6);
    CHECK_MSG(md <= 1e-4, "pieces: max |logit - ref| %.3g", md);
}

TEST(qwen3_next_in_pieces) {
    int a[] = {13, 1, 1, 25}, b[] = {1, 1, 1, 1, 36}, c[] = {40};
    logits_in_pieces(a, 4, 256, 2);
    logits_in_pieces(b, 5, 256, 1);
    logits_in_pieces(c, 1, 6, 2); /* engine batches of 6 */
}

TEST(gdn_block_chunked_matches_recurrent) {
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(DIR, &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    int layer = -1;
    for (int l = 0; l < m.cfg.n_layers && layer < 0; l++)
        if (m.cfg.layer_attn[l] == MS_ATTN_GDN) layer = l;
    CHECK(layer >= 0);
    ms_gdn_config gc = {.hidden = (int)m.cfg.hidden, .k_heads = (int)m.cfg.gdn_k_heads,
                        .v_heads = (int)m.cfg.gdn_v_heads, .k_dim = (int)m.cfg.gdn_k_dim,
                        .v_dim = (int)m.cfg.gdn_v_dim, .conv_kernel = (int)m.cfg.kda_conv,
                        .norm_eps = (float)m.cfg.rms_eps};
    const ms_gdn_weights *w = &m.layers[layer].gdn;
    CHECK(ms_gdn_check(&gc, w, &err) == MS_OK);
    const int n = 150, D = gc.hidden; /* > 2 chunks of 64 */
    float *x = malloc(sizeof(float) * n * D), *y1 = malloc(sizeof(float) * n * D), *y2 = malloc(sizeof(float) * n * D);
    uint32_t s = 12345;
    for (int i = 0; i < n * D; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 2.0f;
    }
    ms_kda_state a, b;
    CHECK(ms_gdn_state_init(&a, &gc, &err) == MS_OK && ms_gdn_state_init(&b, &gc, &err) == MS_OK);
    /* chunked over 100 then 50 tokens vs token by token */
    CHECK(ms_gdn_forward(NULL, &gc, w, &a, x, 100, y1, MS_KDA_CHUNKED, &err) == MS_OK);
    CHECK(ms_gdn_forward(NULL, &gc, w, &a, x + 100 * D, 50, y1 + 100 * D, MS_KDA_CHUNKED, &err) == MS_OK);
    for (int t = 0; t < n; t++)
        CHECK(ms_gdn_forward(NULL, &gc, w, &b, x + t * D, 1, y2 + t * D, MS_KDA_RECURRENT, &err) == MS_OK);
    double md = 0, mag = 0;
    for (int i = 0; i < n * D; i++) md = fmax(md, fabs(y1[i] - y2[i])), mag = fmax(mag, fabs(y2[i]));
    CHECK_MSG(md <= 1e-4 * fmax(1.0, mag), "chunked vs recurrent: %.3g (output magnitude %.3g)", md, mag);
    CHECK(mag > 0);
    double sd = 0;
    for (int64_t i = 0; i < a.S_len; i++) sd = fmax(sd, fabs(a.S[i] - b.S[i]));
    CHECK_MSG(sd <= 1e-4, "final states differ by %.3g", sd);
    /* a state of another shape is refused */
    ms_gdn_config g2 = gc;
    g2.v_heads = gc.k_heads;
    CHECK(ms_gdn_forward(NULL, &g2, w, &a, x, 1, y1, MS_KDA_AUTO, &err) != MS_OK);
    g2 = gc;
    g2.v_heads = gc.k_heads + 1; /* not a multiple */
    CHECK(ms_gdn_check(&g2, w, &err) == MS_ERR_ARG);
    ms_kda_state_free(&a);
    ms_kda_state_free(&b);
    free(x), free(y1), free(y2);
    ms_model_free(&m);
}

#define BASE                                                                                                         \
    "\"model_type\":\"qwen3_next\",\"vocab_size\":16,\"hidden_size\":8,\"num_hidden_layers\":8,"                       \
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":16,\"intermediate_size\":8,"                   \
    "\"moe_intermediate_size\":4,\"num_experts\":4,\"num_experts_per_tok\":2,\"shared_expert_intermediate_size\":4," \
    "\"linear_num_key_heads\":2,\"linear_key_head_dim\":4,\"linear_value_head_dim\":4"

TEST(qwen3_next_config) {
    ms_config c;
    ms_err err = {0};
    const char *dflt = "{" BASE ",\"linear_num_value_heads\":4}";
    CHECK_MSG(ms_config_parse(dflt, strlen(dflt), "t", &c, &err) == MS_OK, "%s", err.msg);
    for (int l = 0; l < 8; l++) CHECK(c.layer_attn[l] == ((l + 1) % 4 ? MS_ATTN_GDN : MS_ATTN_GQA));
    CHECK(c.rope.dim == 4); /* partial_rotary_factor defaults to 0.25 */
    CHECK(c.norm_topk_prob == 1 && c.router == MS_ROUTER_SOFTMAX && c.attn_out_gate && c.shared_expert_gate);
    CHECK(c.gdn_v_heads == 4 && c.gdn_k_heads == 2 && c.kda_conv == 4 && c.shared_inter == 4);
    const char *sched = "{" BASE ",\"linear_num_value_heads\":4,\"partial_rotary_factor\":0.5,\"decoder_sparse_step\":2,"
                        "\"norm_topk_prob\":false,\"layer_types\":[\"full_attention\",\"linear_attention\","
                        "\"linear_attention\",\"linear_attention\",\"full_attention\",\"full_attention\","
                        "\"linear_attention\",\"linear_attention\"]}";
    CHECK_MSG(ms_config_parse(sched, strlen(sched), "t", &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.layer_attn[0] == MS_ATTN_GQA && c.layer_attn[1] == MS_ATTN_GDN && c.layer_attn[5] == MS_ATTN_GQA);
    CHECK(c.layer_mlp[0] == MS_MLP_DENSE && c.layer_mlp[1] == MS_MLP_MOE && c.rope.dim == 8 && !c.norm_topk_prob);
    const char *bad_heads = "{" BASE ",\"linear_num_value_heads\":3}";
    CHECK(ms_config_parse(bad_heads, strlen(bad_heads), "t", &c, &err) == MS_ERR_FORMAT);
    CHECK(strstr(err.msg, "linear_num_value_heads") != NULL);
    const char *bad_type = "{" BASE ",\"layer_types\":[\"mamba\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]}";
    CHECK(ms_config_parse(bad_type, strlen(bad_type), "t", &c, &err) == MS_ERR_FORMAT);
    CHECK(strstr(err.msg, "layer_types[0]") != NULL);
    const char *bad_len = "{" BASE ",\"layer_types\":[\"full_attention\"]}";
    CHECK(ms_config_parse(bad_len, strlen(bad_len), "t", &c, &err) == MS_ERR_FORMAT);
}

TEST_MAIN()
