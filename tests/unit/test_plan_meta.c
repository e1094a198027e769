/* The plan before a download: ms_model_load_meta from config.json + the shards' headers
 * (each shard cut after its header) and from config.json alone gives the same ledger as
 * the full checkpoint, for synth models (BF16, MXFP4 and FP8 experts), stored and
 * requantized static tiers; and the requantization realizes the bytes the plan counted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/plan.h"
#include "model/synth.h"
#include "test.h"

static const char *k_cfg =
    "{\"model_type\":\"qwen3_moe\",\"vocab_size\":4096,\"hidden_size\":256,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":64,\"intermediate_size\":512,"
    "\"moe_intermediate_size\":256,\"num_experts\":16,\"num_experts_per_tok\":4,\"norm_topk_prob\":true,"
    "\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,\"max_position_embeddings\":8192}";

static void copy_prefix(const char *src, const char *dst, long limit) { /* limit < 0: whole file */
    FILE *a = fopen(src, "rb"), *b = fopen(dst, "wb");
    CHECK(a && b);
    if (!a || !b) return;
    unsigned char len8[8];
    if (limit == -2) { /* a SafeTensors header: 8 + its length */
        CHECK(fread(len8, 1, 8, a) == 8);
        uint64_t h = 0;
        for (int i = 7; i >= 0; i--) h = (h << 8) | len8[i];
        limit = (long)(8 + h);
        fseek(a, 0, SEEK_SET);
    }
    char buf[65536];
    long done = 0;
    size_t k;
    while ((limit < 0 || done < limit) &&
           (k = fread(buf, 1, limit < 0 || limit - done > (long)sizeof buf ? sizeof buf : (size_t)(limit - done), a)) > 0) {
        fwrite(buf, 1, k, b);
        done += (long)k;
    }
    fclose(a), fclose(b);
}

static void plan_json(const ms_model *m, int ctx, int64_t cache, ms_static_dtype sd, char *out, size_t cap) {
    ms_plan_opts po = {.context = ctx, .threads = 2, .expert_cache_bytes = cache, .static_dtype = sd};
    ms_plan p;
    ms_err e = {0};
    CHECK_MSG(ms_plan_make(m, &po, &p, &e) == 0, "%s", e.msg);
    ms_plan_json(&p, out, cap);
}

static void same_plans(const ms_model *a, const ms_model *b, const char *what) {
    static const int ctxs[] = {256, 4096};
    static const int64_t caches[] = {-1, 1 << 20};
    for (int sd = 0; sd < 3; sd++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                char pa[1200], pb[1200];
                plan_json(a, ctxs[i], caches[j], (ms_static_dtype)sd, pa, sizeof pa);
                plan_json(b, ctxs[i], caches[j], (ms_static_dtype)sd, pb, sizeof pb);
                CHECK_MSG(!strcmp(pa, pb), "%s (static %d, ctx %d, cache %lld):\n full    %s\n meta    %s", what, sd,
                          ctxs[i], (long long)caches[j], pa, pb);
            }
    CHECK(a->static_bytes == b->static_bytes && a->expert_bytes == b->expert_bytes);
}

static void one(const char *dir, ms_dtype expert_dtype, int asym, int config_only_too) {
    char cfg[300], out[300], hdr[300], conf[300], p1[600], p2[600];
    snprintf(cfg, sizeof cfg, "%s/in.json", dir);
    FILE *f = fopen(cfg, "w");
    fputs(k_cfg, f);
    fclose(f);
    snprintf(out, sizeof out, "%s/model%d%s", dir, (int)expert_dtype, asym ? "z" : "");
    snprintf(hdr, sizeof hdr, "%s/headers%d%s", dir, (int)expert_dtype, asym ? "z" : "");
    snprintf(conf, sizeof conf, "%s/config%d%s", dir, (int)expert_dtype, asym ? "z" : "");
    ms_synth_opts so = {.config_path = cfg, .out_dir = out, .seed = 5, .dtype = MS_DT_BF16,
                        .expert_dtype = expert_dtype, .int4_asym = asym, .shard_bytes = 3u << 20};
    ms_synth_result sr;
    ms_err e = {0};
    CHECK_MSG(ms_synth(&so, &sr, &e) == 0, "%s", e.msg);
    CHECK(sr.n_shards > 1);
    mkdir(hdr, 0755), mkdir(conf, 0755);
    snprintf(p1, sizeof p1, "%s/config.json", out);
    snprintf(p2, sizeof p2, "%s/config.json", hdr);
    copy_prefix(p1, p2, -1);
    snprintf(p2, sizeof p2, "%s/config.json", conf);
    copy_prefix(p1, p2, -1);
    snprintf(p1, sizeof p1, "%s/model.safetensors.index.json", out);
    snprintf(p2, sizeof p2, "%s/model.safetensors.index.json", hdr);
    copy_prefix(p1, p2, -1);
    for (int s = 1; s <= sr.n_shards; s++) {
        char fn[80];
        snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", s, sr.n_shards);
        snprintf(p1, sizeof p1, "%s/%s", out, fn);
        snprintf(p2, sizeof p2, "%s/%s", hdr, fn);
        copy_prefix(p1, p2, -2);
    }
    ms_model full, mh, mc;
    ms_model_source src;
    CHECK_MSG(ms_model_load(out, &full, &e) == 0, "%s", e.msg);
    CHECK_MSG(ms_model_load(hdr, &mh, &e) != 0, "a header-only shard must not open as a checkpoint");
    CHECK_MSG(ms_model_load_meta(hdr, &mh, &src, &e) == 0, "%s", e.msg);
    CHECK(src == MS_SOURCE_HEADERS);
    same_plans(&full, &mh, "headers");
    if (config_only_too) {
        CHECK_MSG(ms_model_load_meta(conf, &mc, &src, &e) == 0, "%s", e.msg);
        CHECK(src == MS_SOURCE_CONFIG);
        same_plans(&full, &mc, "config only");
        ms_model_free(&mc);
    }
    /* requantizing realizes what the plan counted */
    uint64_t want = ms_model_static_bytes_as(&mh, MS_STATIC_Q8);
    CHECK_MSG(ms_model_requant_static(&full, MS_STATIC_Q8, NULL, &e) == 0, "%s", e.msg);
    CHECK(full.static_bytes == want && want < mh.static_bytes);
    ms_model_free(&full);
    ms_model_free(&mh);
}

TEST(plan_from_headers_and_config_equals_full) {
    char dir[] = "/tmp/ms_planmetaXXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    one(dir, MS_DT_BF16, 0, 1);
    one(dir, MS_DT_F4, 0, 1);
    one(dir, MS_DT_I4, 0, 1); /* INT4 pack-quantized: the config's targets/ignore say which matrices */
    one(dir, MS_DT_I4, 1, 1); /* asymmetric INT4: + weight_zero_point */
    one(dir, MS_DT_F8_E4M3, 0, 0); /* synth's FP8 experts keep a BF16 static tier: only the headers know */
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST_MAIN()
