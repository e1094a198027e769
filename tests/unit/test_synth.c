/* synth: a checkpoint written from a fixture's config loads, is deterministic
 * per (seed, name) whatever the sharding, and FP8 experts carry block scales. */
#include <stdio.h>
#include <unistd.h>

#include "model/model.h"
#include "model/synth.h"
#include "test.h"

static int files_equal_tensor(const ms_model *a, const ms_model *b, const char *name) {
    const ms_tensor *x = ms_checkpoint_find(&a->ck, name), *y = ms_checkpoint_find(&b->ck, name);
    return x && y && x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes) == 0;
}

TEST(synth_roundtrip) {
    char d1[] = "/tmp/ms_synth1XXXXXX", d2[] = "/tmp/ms_synth2XXXXXX";
    CHECK(mkdtemp(d1) && mkdtemp(d2));
    ms_err e = {0};
    ms_synth_result r;
    ms_synth_opts o = {.config_path = MS_TEST_FIXTURES "deepseek_v3/config.json", .out_dir = d1, .seed = 7,
                       .dtype = MS_DT_BF16, .expert_dtype = MS_DT_F8_E4M3};
    int rc = ms_synth(&o, &r, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    CHECK(r.n_shards == 1);
    o.out_dir = d2;
    o.shard_bytes = 100 * 1024; /* several shards + index */
    rc = ms_synth(&o, &r, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    CHECK(r.n_shards > 2);
    ms_model a, b;
    CHECK_MSG(ms_model_load(d1, &a, &e) == 0, "%s", e.msg);
    CHECK_MSG(ms_model_load(d2, &b, &e) == 0, "%s", e.msg);
    CHECK(a.layers[1].experts[3].gate.dtype == MS_DT_F8_E4M3 && a.layers[1].experts[3].gate.scale != NULL);
    CHECK(a.layers[1].q_a.dtype == MS_DT_BF16);
    CHECK(files_equal_tensor(&a, &b, "model.layers.2.mlp.experts.5.down_proj.weight"));
    CHECK(files_equal_tensor(&a, &b, "model.layers.2.mlp.experts.5.down_proj.weight_scale_inv"));
    CHECK(files_equal_tensor(&a, &b, "model.embed_tokens.weight"));
    /* the dequantized FP8 values stay close to the bf16-scale distribution (|w| <= 0.035) */
    float row[64];
    ms_qmat_row(&a.layers[1].experts[3].gate, 0, row);
    float amax = 0;
    for (int i = 0; i < 64; i++) amax = fabsf(row[i]) > amax ? fabsf(row[i]) : amax;
    CHECK(amax > 0.01f && amax < 0.036f);
    ms_model_free(&a);
    ms_model_free(&b);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", d1, d2);
    CHECK(system(cmd) == 0);
}

/* Writer threads change nothing: the files of 1 and 3 writers are byte-identical, for every
 * expert dtype (FP8 / MXFP4 / INT4 carry scale tensors written with their weight) and with
 * several shards. */
TEST(synth_threads_same_bytes) {
    const ms_dtype dts[] = {MS_DT_BF16, MS_DT_F8_E4M3, MS_DT_F4, MS_DT_I4};
    for (size_t k = 0; k < sizeof dts / sizeof *dts; k++) {
        for (int sharded = 0; sharded < 2; sharded++) {
            char d1[] = "/tmp/ms_synth4XXXXXX", d2[] = "/tmp/ms_synth5XXXXXX";
            CHECK(mkdtemp(d1) && mkdtemp(d2));
            ms_err e = {0};
            ms_synth_result r1, r2;
            ms_synth_opts o = {.config_path = MS_TEST_FIXTURES "deepseek_v3/config.json", .out_dir = d1, .seed = 3,
                               .dtype = MS_DT_BF16, .expert_dtype = dts[k], .threads = 1,
                               .shard_bytes = sharded ? 100 * 1024 : 0};
            CHECK_MSG(ms_synth(&o, &r1, &e) == 0, "%s", e.msg);
            o.out_dir = d2;
            o.threads = 3;
            CHECK_MSG(ms_synth(&o, &r2, &e) == 0, "%s", e.msg);
            CHECK(r1.n_shards == r2.n_shards && r1.bytes == r2.bytes && r1.n_tensors == r2.n_tensors);
            CHECK(sharded ? r1.n_shards > 2 : r1.n_shards == 1);
            char cmd[200];
            snprintf(cmd, sizeof cmd, "diff -r %s %s >/dev/null", d1, d2);
            CHECK_MSG(system(cmd) == 0, "expert dtype %d, sharded %d: 1 and 3 writers differ", (int)dts[k], sharded);
            snprintf(cmd, sizeof cmd, "rm -rf %s %s", d1, d2);
            CHECK(system(cmd) == 0);
        }
    }
}

TEST(synth_rejects_bad_config) {
    char d[] = "/tmp/ms_synth3XXXXXX";
    CHECK(mkdtemp(d) != NULL);
    ms_err e = {0};
    ms_synth_result r;
    ms_synth_opts o = {.config_path = "/nonexistent/config.json", .out_dir = d, .dtype = MS_DT_BF16,
                       .expert_dtype = MS_DT_BF16};
    CHECK(ms_synth(&o, &r, &e) == MS_ERR_IO);
    rmdir(d);
}

/* --layers: a Kimi Linear config cut from 4 layers to 2 loads with its per-layer lists cut
 * (layer_types, mlp_layer_types; linear_attn_config's 1-based kda_layers / full_attn_layers keep
 * 1..2), and asking for more layers than the config has is refused. */
TEST(synth_cut_layers) {
    char d[] = "/tmp/ms_synth4XXXXXX";
    CHECK(mkdtemp(d) != NULL);
    ms_err e = {0};
    ms_synth_result r;
    ms_synth_opts o = {.config_path = MS_TEST_FIXTURES "kimi_linear/config.json", .out_dir = d, .seed = 1,
                       .dtype = MS_DT_BF16, .expert_dtype = MS_DT_F4, .layers = 2};
    CHECK_MSG(ms_synth(&o, &r, &e) == 0, "%s", e.msg);
    ms_model m;
    CHECK_MSG(ms_model_load(d, &m, &e) == 0, "%s", e.msg);
    CHECK(m.cfg.n_layers == 2 && m.cfg.layer_attn[0] == MS_ATTN_KDA && m.cfg.layer_attn[1] == MS_ATTN_KDA);
    CHECK(m.cfg.layer_mlp[0] == MS_MLP_DENSE && m.cfg.layer_mlp[1] == MS_MLP_MOE);
    ms_model_free(&m);
    o.layers = 5;
    CHECK(ms_synth(&o, &r, &e) == MS_ERR_ARG);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d);
    CHECK(system(cmd) == 0);
}

TEST_MAIN()
