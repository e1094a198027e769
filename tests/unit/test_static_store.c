/* test_static_store.c — the requantized static tier: parallel requantization gives the same
 * bytes as the serial one (and the same bytes for any thread count); the packed static store
 * (ms_static_store_write / ms_static_store_open) loads exactly what requantizing at load makes
 * (views, bytes, accounting, tied heads), and is refused for another checkpoint, a changed
 * source, another dtype and every kind of corruption, naming what is wrong. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "model/requant_int.h"
#include "model/synth.h"
#include "test.h"
#include "util/threadpool.h"

static char g_dir[] = "/tmp/ms_test_static_store_XXXXXX";

/* a small Qwen3-MoE with a tied head (the head is the embedding's view) */
static const char *k_cfg =
    "{\"model_type\":\"qwen3_moe\",\"vocab_size\":1024,\"hidden_size\":128,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"intermediate_size\":256,"
    "\"moe_intermediate_size\":64,\"num_experts\":8,\"num_experts_per_tok\":2,\"norm_topk_prob\":true,"
    "\"tie_word_embeddings\":true,\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,\"max_position_embeddings\":4096}";

/* every requantizable view of a and b: same dtype, shape and bytes (values and scales) */
static int same_views(ms_model *a, ms_model *b, const char *what) {
    int n = ms_rq_collect(a, NULL), nb = ms_rq_collect(b, NULL), bad = 0;
    if (n != nb) return 0;
    ms_rq_ref *ra = malloc((size_t)n * sizeof *ra), *rb = malloc((size_t)n * sizeof *rb);
    ms_rq_collect(a, ra), ms_rq_collect(b, rb);
    for (int i = 0; i < n; i++) {
        const ms_qmat *x = ra[i].w, *y = rb[i].w;
        if (x->dtype != y->dtype || x->rows != y->rows || x->cols != y->cols || !x->data != !y->data) {
            bad++;
            continue;
        }
        if (!x->data) continue;
        if (x->dtype == MS_DT_Q8 || x->dtype == MS_DT_F8_E4M3) {
            uint64_t vb = (uint64_t)x->rows * x->cols, sb = (uint64_t)x->rows * ((x->cols + 31) / 32) * 2;
            if (memcmp(x->data, y->data, vb) || memcmp(x->scale, y->scale, sb)) bad++;
        } else if (x->data != y->data && memcmp(x->data, y->data, ms_qmat_bytes(x))) {
            bad++;
        }
    }
    CHECK_MSG(!bad, "%s: %d views differ", what, bad);
    free(ra), free(rb);
    return !bad;
}

static void same_accounting(const ms_model *a, const ms_model *b) {
    CHECK(a->static_dtype == b->static_dtype && a->static_bytes == b->static_bytes &&
          a->static_requant_bytes == b->static_requant_bytes && a->requant_uses == b->requant_uses &&
          a->requant_rel_rms == b->requant_rel_rms);
    int same_bound = a->ck.n_tensors == b->ck.n_tensors;
    for (int t = 0; same_bound && t < a->ck.n_tensors; t++) same_bound = a->tensor_bound[t] == b->tensor_bound[t];
    CHECK(same_bound);
}

static void load(const char *dir, ms_model *m) {
    ms_err e = {0};
    CHECK_MSG(ms_model_load(dir, m, &e) == 0, "%s: %s", dir, e.msg);
}

static void parallel_equals_serial(const char *dir, ms_static_dtype d) {
    ms_model s, p;
    ms_err e = {0};
    load(dir, &s), load(dir, &p);
    ms_pool *pool = ms_pool_create(3);
    CHECK_MSG(ms_model_requant_static(&s, d, NULL, &e) == 0, "%s", e.msg);
    CHECK_MSG(ms_model_requant_static(&p, d, pool, &e) == 0, "%s", e.msg);
    CHECK(s.static_dtype == (int)d && s.requant_uses > 0 && s.requant_rel_rms > 0);
    same_views(&s, &p, dir);
    same_accounting(&s, &p);
    ms_pool_destroy(pool);
    ms_model_free(&s), ms_model_free(&p);
}

TEST(parallel_requant_equals_serial) {
    parallel_equals_serial(MS_TEST_FIXTURES "qwen3_moe", MS_STATIC_Q8);
    parallel_equals_serial(MS_TEST_FIXTURES "kimi_linear", MS_STATIC_FP8);
    parallel_equals_serial(MS_TEST_FIXTURES "deepseek_v3", MS_STATIC_Q8);
}

static void path(char *out, size_t n, const char *a, const char *b) { snprintf(out, n, "%s/%s", a, b); }

/* pack from src (requantized to d), open into a fresh load; equal to requantizing at load */
static void roundtrip(const char *src, ms_static_dtype d, const char *store) {
    ms_model q, s;
    ms_err e = {0};
    load(src, &q);
    CHECK(ms_static_store_write(&q, store, &e) == MS_ERR_ARG && strstr(e.msg, "not requantized"));
    CHECK_MSG(ms_model_requant_static(&q, d, NULL, &e) == 0, "%s", e.msg);
    CHECK_MSG(ms_static_store_write(&q, store, &e) == 0, "%s", e.msg);
    load(src, &s);
    CHECK_MSG(ms_static_store_open(&s, store, MS_STATIC_STORED, &e) == 0, "%s: %s", src, e.msg);
    CHECK(s.static_store_map && s.n_quant_allocs == 0);
    same_views(&q, &s, src);
    same_accounting(&q, &s);
    CHECK(ms_static_store_write(&s, store, &e) == MS_ERR_ARG); /* a store's tier is not packed again */
    CHECK(ms_static_store_open(&s, store, MS_STATIC_STORED, &e) == MS_ERR_ARG); /* already held */
    ms_model_free(&q), ms_model_free(&s);
    /* no temporary left behind */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 1", store);
    CHECK(system(cmd) == 0);
}

/* open must fail with code, the message containing want */
static void refused(const char *model, const char *store, ms_static_dtype want_dt, int code, const char *want) {
    ms_model m;
    ms_err e = {0};
    load(model, &m);
    int rc = ms_static_store_open(&m, store, want_dt, &e);
    CHECK_MSG(rc == code && strstr(e.msg, want), "rc %d (want %d): %s (want \"%s\")", rc, code, e.msg, want);
    if (code) CHECK(m.static_dtype == MS_STATIC_STORED && !m.static_store_map); /* untouched */
    ms_model_free(&m);
}

static void patch(const char *file, long off, int whence, unsigned char xor_mask) {
    FILE *f = fopen(file, "r+b");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, off, whence);
    long at = ftell(f);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ xor_mask, f);
    fclose(f);
}

TEST(store_roundtrip_and_refusals) {
    char cfg[300], synth[300], store[300], other[300], copy[300], file[400], cmd[1200];
    path(cfg, sizeof cfg, g_dir, "tied.json");
    FILE *f = fopen(cfg, "w");
    fputs(k_cfg, f);
    fclose(f);
    path(synth, sizeof synth, g_dir, "tied");
    ms_synth_opts so = {.config_path = cfg, .out_dir = synth, .seed = 3, .dtype = MS_DT_BF16, .expert_dtype = MS_DT_BF16};
    ms_synth_result sr;
    ms_err e = {0};
    CHECK_MSG(ms_synth(&so, &sr, &e) == 0, "%s", e.msg);
    {
        ms_model t;
        load(synth, &t);
        CHECK(t.lm_head.data == t.embed.data); /* the tied head: one matrix, two views */
        ms_model_free(&t);
    }
    path(store, sizeof store, g_dir, "store_tied");
    roundtrip(synth, MS_STATIC_Q8, store);
    path(store, sizeof store, g_dir, "store_q8");
    roundtrip(MS_TEST_FIXTURES "deepseek_v3", MS_STATIC_Q8, store);
    path(other, sizeof other, g_dir, "store_fp8");
    roundtrip(MS_TEST_FIXTURES "kimi_linear", MS_STATIC_FP8, other);
    roundtrip(MS_TEST_FIXTURES "kimi_linear", MS_STATIC_FP8, other); /* written again over itself */

    /* another checkpoint; another dtype than asked */
    refused(MS_TEST_FIXTURES "qwen3_moe", store, MS_STATIC_STORED, MS_ERR_MISMATCH, "another checkpoint");
    refused(MS_TEST_FIXTURES "deepseek_v3", store, MS_STATIC_FP8, MS_ERR_ARG, "not fp8");
    char nowhere[320];
    path(nowhere, sizeof nowhere, g_dir, "nowhere");
    refused(MS_TEST_FIXTURES "deepseek_v3", nowhere, MS_STATIC_STORED, MS_ERR_IO, "pack it with");

    /* the source changed after packing: a copy of the checkpoint whose weights differ in a sampled block,
     * and one grown by a byte */
    path(copy, sizeof copy, g_dir, "ds_copy");
    snprintf(cmd, sizeof cmd, "cp -r " MS_TEST_FIXTURES "deepseek_v3 %s", copy);
    CHECK(system(cmd) == 0);
    path(file, sizeof file, copy, "model.safetensors");
    patch(file, -1, SEEK_END, 0x01); /* the last byte: in the data sample's last block */
    refused(copy, store, MS_STATIC_STORED, MS_ERR_MISMATCH, "weights in");
    patch(file, -1, SEEK_END, 0x01);
    refused(copy, store, MS_STATIC_Q8, 0, ""); /* restored: opens (rc 0, message empty) */
    snprintf(cmd, sizeof cmd, "printf x >> %s", file);
    CHECK(system(cmd) == 0);
    refused(copy, store, MS_STATIC_STORED, MS_ERR_MISMATCH, "bytes, the store expects");

    /* corruption: a matrix byte, a header byte, the magic, a cut file */
    char sfile[400], bak[420];
    path(sfile, sizeof sfile, store, MS_STATIC_STORE_FILE);
    snprintf(bak, sizeof bak, "%s.bak", sfile);
    snprintf(cmd, sizeof cmd, "cp %s %s", sfile, bak);
    CHECK(system(cmd) == 0);
    struct stat st;
    stat(sfile, &st);
    /* the first matrix starts at data_start (the header's u64 at byte 32, static_store.c's layout) */
    uint64_t data_start = 0;
    f = fopen(sfile, "rb");
    CHECK(f && fseek(f, 32, SEEK_SET) == 0 && fread(&data_start, 8, 1, f) == 1);
    if (f) fclose(f);
    CHECK(data_start >= 4096 && data_start % 4096 == 0 && (long long)data_start < (long long)st.st_size);
    patch(sfile, (long)data_start + 7, SEEK_SET, 0x40);
    refused(MS_TEST_FIXTURES "deepseek_v3", store, MS_STATIC_STORED, MS_ERR_FORMAT, "checksum mismatch (corrupt)");
    snprintf(cmd, sizeof cmd, "cp %s %s", bak, sfile);
    CHECK(system(cmd) == 0);
    refused(MS_TEST_FIXTURES "deepseek_v3", store, MS_STATIC_STORED, 0, "");
    patch(sfile, 200, SEEK_SET, 0x01); /* a source name */
    refused(MS_TEST_FIXTURES "deepseek_v3", store, MS_STATIC_STORED, MS_ERR_FORMAT, "header checksum");
    snprintf(cmd, sizeof cmd, "cp %s %s", bak, sfile);
    CHECK(system(cmd) == 0);
    patch(sfile, 0, SEEK_SET, 0x20);
    refused(MS_TEST_FIXTURES "deepseek_v3", store, MS_STATIC_STORED, MS_ERR_FORMAT, "bad magic");
    snprintf(cmd, sizeof cmd, "head -c %lld %s > %s", (long long)st.st_size - 4096, bak, sfile);
    CHECK(system(cmd) == 0);
    refused(MS_TEST_FIXTURES "deepseek_v3", store, MS_STATIC_STORED, MS_ERR_FORMAT, "bad static store header");
    snprintf(cmd, sizeof cmd, "head -c 10 %s > %s", bak, sfile);
    CHECK(system(cmd) == 0);
    refused(MS_TEST_FIXTURES "deepseek_v3", store, MS_STATIC_STORED, MS_ERR_FORMAT, "too short");
}

TEST(cleanup) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
}

__attribute__((constructor(101))) static void mk(void) {
    if (!mkdtemp(g_dir)) abort();
}

TEST_MAIN()
