/* test_kimi_k3.c — Kimi K3 on the fixtures made with the official K3 code
 * (tests/data/fixtures/models/kimi_k3{,_mxfp4}):
 *  - the reference logits reproduced when the sequence arrives in uneven
 *    pieces and engine batches (Attention Residuals block states, KDA state,
 *    latent cache across every boundary);
 *  - real-checkpoint robustness: A_log stored zero-padded past the head count
 *    loads and computes the same logits; non-zero padding, a short A_log, a
 *    missing or mis-shaped MXFP4 scale are errors naming the tensor;
 *  - the image placeholder token is rejected; config errors are named. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/synth.h"
#include "fixture.h"
#include "test.h"
#include "util/fs.h"

#define K3 "tests/data/fixtures/models/kimi_k3"
#define K3Q "tests/data/fixtures/models/kimi_k3_mxfp4"

/* max |logits - reference| over the 40 reference tokens fed in pieces (fixture.h); model_dir is
 * K3, K3Q or a rewrite of one of them in tmpdir, checked against K3's reference unless it is an MXFP4 one */
static double run_pieces(const char *model_dir, const int *pieces, int np, int max_batch, int threads) {
    static const int32_t junk[5] = {3, 1, 4, 1, 5};
    const char *ref = strstr(model_dir, "mxfp4") ? K3Q "/reference.safetensors" : K3 "/reference.safetensors";
    return ms_test_logits_in_pieces(model_dir, ref, pieces, np, max_batch, threads, junk, 5);
}

TEST(k3_in_pieces) {
    int a[] = {17, 1, 1, 21}, b[] = {1, 1, 1, 1, 1, 35}, c[] = {40};
    double d;
    d = run_pieces(K3, a, 4, 256, 2);
    CHECK_MSG(d <= 1e-4, "kimi_k3 pieces a: %.3g", d);
    d = run_pieces(K3, b, 6, 256, 1);
    CHECK_MSG(d <= 1e-4, "kimi_k3 pieces b: %.3g", d);
    d = run_pieces(K3, c, 1, 7, 2); /* engine batches of 7 */
    CHECK_MSG(d <= 1e-4, "kimi_k3 batches of 7: %.3g", d);
    d = run_pieces(K3Q, a, 4, 5, 2);
    CHECK_MSG(d <= 1e-4, "kimi_k3_mxfp4 pieces: %.3g", d);
}

/* ---- rewriting the fixture checkpoint into a temp dir ---- */

typedef enum { EDIT_NONE, EDIT_VISION, EDIT_PAD_ALOG, EDIT_PAD_ALOG_DIRTY, EDIT_SHORT_ALOG, EDIT_DROP_SCALE, EDIT_BAD_SCALE } edit_kind;

static char tmpdir[256];

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Write src_dir's checkpoint to tmpdir with one kind of edit; config.json
 * copied, with `config_extra` ("\"key\": value,") inserted after the opening brace. */
static int rewrite(const char *src_dir, edit_kind edit, const char *config_extra) {
    ms_checkpoint ck;
    ms_err err = {0};
    if (ms_checkpoint_open(src_dir, &ck, &err)) return -1;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ms_test_k3_%d", (int)getpid());
    mkdir(tmpdir, 0755);
    size_t cap = 1 << 20, hl = 0;
    char *hdr = malloc(cap);
    uint8_t *data = NULL;
    size_t dlen = 0;
    hl += (size_t)snprintf(hdr + hl, cap - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    int edited = 0;
    for (int i = 0; i < ck.n_tensors; i++) {
        const ms_tensor *t = &ck.tensors[i];
        int64_t shape[MS_MAX_DIMS];
        int ndim = t->ndim;
        memcpy(shape, t->shape, sizeof shape);
        const uint8_t *src = t->data;
        size_t nb = t->nbytes, extra = 0;
        int is_alog = strstr(t->name, ".A_log") && ndim == 1;
        int is_scale = strstr(t->name, "layers.1.block_sparse_moe.experts.0.w1.weight_scale") != NULL;
        if (edit == EDIT_DROP_SCALE && is_scale) {
            edited++;
            continue;
        }
        if (edit == EDIT_BAD_SCALE && is_scale) {
            shape[1] += 1; /* one more group than the width has */
            extra = (size_t)shape[0];
            edited++;
        }
        if ((edit == EDIT_PAD_ALOG || edit == EDIT_PAD_ALOG_DIRTY) && is_alog) {
            shape[0] += 4;
            extra = 16;
            edited++;
        }
        if (edit == EDIT_SHORT_ALOG && is_alog) {
            shape[0] -= 1;
            nb -= 4;
            edited++;
        }
        data = realloc(data, dlen + nb + extra);
        memcpy(data + dlen, src, nb);
        memset(data + dlen + nb, 0, extra);
        if (edit == EDIT_PAD_ALOG_DIRTY && is_alog) {
            float one = 1.0f;
            memcpy(data + dlen + nb + 8, &one, 4);
        }
        hl += (size_t)snprintf(hdr + hl, cap - hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name,
                               ms_dtype_name(t->dtype));
        for (int d = 0; d < ndim; d++) hl += (size_t)snprintf(hdr + hl, cap - hl, d ? ",%lld" : "%lld", (long long)shape[d]);
        hl += (size_t)snprintf(hdr + hl, cap - hl, "],\"data_offsets\":[%zu,%zu]}", dlen, dlen + nb + extra);
        dlen += nb + extra;
    }
    if (edit == EDIT_VISION) { /* a vision tower tensor the text-only loader must ignore */
        data = realloc(data, dlen + 64);
        memset(data + dlen, 0x7f, 64);
        hl += (size_t)snprintf(hdr + hl, cap - hl,
                               ",\"vision_tower.patch_embed.proj.weight\":{\"dtype\":\"BF16\",\"shape\":[4,8],"
                               "\"data_offsets\":[%zu,%zu]}",
                               dlen, dlen + 64);
        dlen += 64;
        edited++;
    }
    hl += (size_t)snprintf(hdr + hl, cap - hl, "}");
    while (hl % 8) hdr[hl++] = ' ';
    size_t flen = 8 + hl + dlen;
    uint8_t *file = malloc(flen);
    put_u64(file, hl);
    memcpy(file + 8, hdr, hl);
    memcpy(file + 8 + hl, data, dlen);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
    int rc = ms_write_file_atomic(path, file, flen, &err);
    free(file), free(hdr), free(data);
    ms_checkpoint_close(&ck);
    char *cfg;
    size_t clen;
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    if (rc || ms_read_file(path, 1 << 20, &cfg, &clen, &err)) return -1;
    char *brace = strchr(cfg, '{');
    size_t elen = config_extra ? strlen(config_extra) : 0;
    char *nc = malloc(clen + elen + 1);
    size_t pre = (size_t)(brace - cfg) + 1;
    memcpy(nc, cfg, pre);
    memcpy(nc + pre, config_extra ? config_extra : "", elen);
    memcpy(nc + pre + elen, cfg + pre, clen - pre);
    snprintf(path, sizeof path, "%s/config.json", tmpdir);
    rc = ms_write_file_atomic(path, nc, clen + elen, &err);
    free(cfg), free(nc);
    return rc || (edit != EDIT_NONE && !edited) ? -1 : 0;
}

static void cleanup(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", tmpdir);
    unlink(path);
    rmdir(tmpdir);
}

static int load_err(ms_err *err) {
    ms_model m;
    int rc = ms_model_load(tmpdir, &m, err);
    if (!rc) ms_model_free(&m);
    return rc;
}

TEST(k3_ignores_vision_tower) {
    int c[] = {40};
    CHECK(rewrite(K3, EDIT_VISION, "\"vision_config\": {\"vt_hidden_size\": 8},") == 0);
    double d = run_pieces(tmpdir, c, 1, 256, 1);
    CHECK_MSG(d <= 1e-4, "with a vision tower tensor: %.3g", d);
    cleanup();
}

TEST(k3_a_log_padding) {
    int c[] = {40};
    CHECK(rewrite(K3, EDIT_PAD_ALOG, NULL) == 0);
    double d = run_pieces(tmpdir, c, 1, 256, 1);
    CHECK_MSG(d <= 1e-4, "zero-padded A_log: %.3g", d);
    ms_err err = {0};
    CHECK(rewrite(K3, EDIT_PAD_ALOG_DIRTY, NULL) == 0);
    CHECK(load_err(&err) == MS_ERR_SHAPE);
    CHECK_MSG(strstr(err.msg, "A_log") && strstr(err.msg, "padding"), "%s", err.msg);
    ms_err_clear(&err);
    CHECK(rewrite(K3, EDIT_SHORT_ALOG, NULL) == 0);
    CHECK(load_err(&err) == MS_ERR_SHAPE);
    CHECK_MSG(strstr(err.msg, "A_log") && strstr(err.msg, "expected shape"), "%s", err.msg);
    cleanup();
}

TEST(k3_mxfp4_errors) {
    ms_err err = {0};
    CHECK(rewrite(K3Q, EDIT_DROP_SCALE, NULL) == 0);
    CHECK(load_err(&err) == MS_ERR_SHAPE);
    CHECK_MSG(strstr(err.msg, "missing") && strstr(err.msg, "experts.0.w1.weight_scale"), "%s", err.msg);
    ms_err_clear(&err);
    CHECK(rewrite(K3Q, EDIT_BAD_SCALE, NULL) == 0);
    CHECK(load_err(&err) == MS_ERR_SHAPE);
    CHECK_MSG(strstr(err.msg, "experts.0.w1.weight_scale") && strstr(err.msg, "expected shape"), "%s", err.msg);
    cleanup();
}

TEST(k3_rejects_images) {
    CHECK(rewrite(K3, EDIT_NONE, "\"media_placeholder_token_id\": 7,") == 0);
    ms_model m;
    ms_err err = {0};
    CHECK_MSG(ms_model_load(tmpdir, &m, &err) == MS_OK, "%s", err.msg);
    ms_engine *e = NULL;
    ms_engine_opts o = {.max_ctx = 16};
    CHECK(ms_engine_create(&m, &o, &e, &err) == MS_OK);
    int32_t toks[3] = {5, 7, 9};
    CHECK(ms_engine_forward(e, toks, 3, NULL, 0, &err) == MS_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "image") != NULL, "%s", err.msg);
    CHECK(ms_engine_n_past(e) == 0);
    ms_engine_destroy(e);
    ms_model_free(&m);
    cleanup();
}

TEST(k3_config_errors) {
    ms_config c;
    ms_err err = {0};
    const char *no_text = "{\"model_type\":\"kimi_k3\",\"vision_config\":{}}";
    CHECK(ms_config_parse(no_text, strlen(no_text), "t", &c, &err) != MS_OK);
    const char *base =
        "{\"model_type\":\"kimi_k3\",\"text_config\":{\"model_type\":\"kimi_linear\",\"vocab_size\":16,"
        "\"hidden_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2,\"kv_lora_rank\":4,"
        "\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,\"v_head_dim\":4,\"intermediate_size\":8,"
        "\"first_k_dense_replace\":2,\"hidden_act\":\"situ\",\"activation_situ_beta\":4.0,"
        "\"activation_situ_linear_beta\":null,\"attn_res_block_size\":%s,\"routed_expert_hidden_size\":null,"
        "\"linear_attn_config\":{\"num_heads\":2,\"head_dim\":4,\"kda_layers\":[1],\"full_attn_layers\":[2]}%s}}";
    char buf[2048];
    snprintf(buf, sizeof buf, base, "2", "");
    ms_err_clear(&err);
    CHECK_MSG(ms_config_parse(buf, strlen(buf), "t", &c, &err) == MS_OK, "%s", err.msg);
    CHECK(c.act == MS_ACT_SITU && c.situ_beta == 4.0 && c.situ_linear_beta == 0 && c.attn_res_block == 2);
    CHECK(c.latent_moe == 0 && c.expert_hidden == 8 && c.hidden == 8);
    snprintf(buf, sizeof buf, base, "0", "");
    ms_err_clear(&err);
    CHECK(ms_config_parse(buf, strlen(buf), "t", &c, &err) == MS_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "attn_res_block_size") != NULL, "%s", err.msg);
    snprintf(buf, sizeof buf, base, "null",
             ",\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"int-quantized\"}");
    ms_err_clear(&err);
    CHECK(ms_config_parse(buf, strlen(buf), "t", &c, &err) == MS_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "int-quantized") != NULL, "%s", err.msg);
    snprintf(buf, sizeof buf, base, "null",
             ",\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"mxfp4-pack-quantized\","
             "\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":8,\"type\":\"float\",\"group_size\":32}}}}");
    ms_err_clear(&err);
    CHECK(ms_config_parse(buf, strlen(buf), "t", &c, &err) == MS_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "8-bit") != NULL, "%s", err.msg);
}

TEST(situ_matches_formula) {
    float g[5] = {-30.f, -1.5f, 0.f, 0.7f, 40.f}, u[5] = {2.f, -100.f, 3.f, 60.f, -0.25f}, o[5];
    ms_situ_glu(o, g, u, 5, 4.0f, 25.0f);
    for (int i = 0; i < 5; i++) {
        double a = 4.0 * tanh(g[i] / 4.0) / (1.0 + exp(-(double)g[i])), b = 25.0 * tanh(u[i] / 25.0);
        CHECK_NEAR(o[i], a * b, 1e-5 * (1 + fabs(a * b)));
    }
    ms_situ_glu(o, g, u, 5, 1.0f, 0.0f); /* no linear beta: up as is */
    for (int i = 0; i < 5; i++) {
        double a = tanh((double)g[i]) / (1.0 + exp(-(double)g[i]));
        CHECK_NEAR(o[i], a * u[i], 1e-5 * (1 + fabs(a * u[i])));
    }
}

/* synth --expert-dtype mxfp4 on a K3 config: experts in the compressed-tensors
 * layout, bound as F4 views, each value the e2m1 rounding of the same seed's
 * F32 value under the OCP MX scale 2^(floor(log2 amax) - 2) of its group of 32
 * (saturating at 6);
 * the model runs. */
TEST(k3_synth_mxfp4) {
    char d1[] = "/tmp/ms_k3q_XXXXXX", d2[] = "/tmp/ms_k3f_XXXXXX";
    CHECK(mkdtemp(d1) && mkdtemp(d2));
    ms_err err = {0};
    ms_synth_result r;
    ms_synth_opts o = {.config_path = K3 "/config.json", .out_dir = d1, .seed = 11, .dtype = MS_DT_BF16,
                       .expert_dtype = MS_DT_F4};
    CHECK_MSG(ms_synth(&o, &r, &err) == MS_OK, "%s", err.msg);
    o.out_dir = d2;
    o.dtype = o.expert_dtype = MS_DT_F32;
    CHECK_MSG(ms_synth(&o, &r, &err) == MS_OK, "%s", err.msg);
    ms_model q, f;
    CHECK_MSG(ms_model_load(d1, &q, &err) == MS_OK, "%s", err.msg);
    CHECK_MSG(ms_model_load(d2, &f, &err) == MS_OK, "%s", err.msg);
    CHECK(q.cfg.mxfp4_packed == 1);
    const ms_qmat *wq = &q.layers[1].experts[5].down, *wf = &f.layers[1].experts[5].down;
    CHECK(wq->dtype == MS_DT_F4 && wq->scale_dtype == MS_DT_F8_E8M0 && wq->bcol == 32 && wf->dtype == MS_DT_F32);
    int bad = 0, exact = 0, total = 0;
    float rq[256], rf[256];
    for (int64_t row = 0; row < wq->rows && wq->cols <= 256; row++) {
        ms_qmat_row(wq, row, rq);
        ms_qmat_row(wf, row, rf);
        for (int64_t g = 0; g < wq->cols / 32; g++) {
            float amax = 0;
            for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(rf[g * 32 + k]));
            float sc = ldexpf(1.0f, (int)floor(log2(amax)) - 2);
            for (int k = 0; k < 32; k++) {
                float x = rf[g * 32 + k] / sc, y = rq[g * 32 + k] / sc;
                /* y must be the e2m1 value nearest x (grid steps .5 to 2: within half a step) */
                float step = fabsf(x) < 2 ? 0.5f : fabsf(x) < 4 ? 1.0f : 2.0f;
                if (fabsf(x) > 6) bad += y != (x > 0 ? 6.0f : -6.0f); /* OCP MX saturates above 6 */
                else if (fabsf(x - y) > step / 2 + 1e-6f || y != y) bad++;
                exact += y == 0 || fabsf(y) == 0.5f || fabsf(y) == 1 || fabsf(y) == 1.5f || fabsf(y) == 2 ||
                         fabsf(y) == 3 || fabsf(y) == 4 || fabsf(y) == 6;
                total++;
            }
        }
    }
    CHECK_MSG(total > 0 && bad == 0 && exact == total, "total %d bad %d exact %d", total, bad, exact);
    ms_engine *e = NULL;
    ms_engine_opts eo = {.max_ctx = 16};
    CHECK(ms_engine_create(&q, &eo, &e, &err) == MS_OK);
    int32_t toks[4] = {1, 2, 3, 4};
    float *lg = malloc(sizeof(float) * (size_t)q.cfg.vocab);
    CHECK_MSG(ms_engine_forward(e, toks, 4, lg, 0, &err) == MS_OK, "%s", err.msg);
    int finite = 1;
    for (int64_t v = 0; v < q.cfg.vocab; v++) finite &= isfinite(lg[v]);
    CHECK(finite);
    free(lg);
    ms_engine_destroy(e);
    ms_model_free(&q);
    ms_model_free(&f);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", d1, d2);
    CHECK(system(cmd) == 0);
}

TEST_MAIN()
