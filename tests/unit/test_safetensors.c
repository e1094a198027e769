/* Loader rejections and acceptance, on files built in memory. */
#include <stdint.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "test.h"

/* Build a file image: 8-byte length + header + data_len zero bytes. */
static uint8_t *mk(const char *hdr, size_t data_len, size_t *out_len) {
    size_t h = strlen(hdr);
    uint8_t *b = calloc(8 + h + data_len + 1, 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    *out_len = 8 + h + data_len;
    return b;
}

static int parse(const char *hdr, size_t data_len, ms_err *err, int *n) {
    size_t len;
    uint8_t *b = mk(hdr, data_len, &len);
    ms_tensor *t = NULL;
    uint64_t ds;
    int rc = ms_st_parse(b, len, len, "t.safetensors", &t, n, &ds, err);
    ms_st_free_tensors(t, *n);
    free(b);
    return rc;
}

TEST(accepts_valid) {
    ms_err e = {0};
    int n = 0;
    int rc = parse("{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,16]}}",
                   16, &e, &n);
    CHECK_MSG(rc == 0, "%s", e.msg);
    CHECK(n == 2);
}

TEST(rejects_truncated) {
    ms_err e = {0};
    int n;
    int rc = parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, &e, &n);
    CHECK(rc == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "\"a\"") && strstr(e.msg, "past the end"));
}

TEST(rejects_overlap) {
    ms_err e = {0};
    int n;
    int rc = parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   12, &e, &n);
    CHECK(rc == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "overlapping") != NULL);
}

TEST(rejects_bad_dtype) {
    ms_err e = {0};
    int n;
    int rc = parse("{\"a\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &e, &n);
    CHECK(rc == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "unknown dtype") && strstr(e.msg, "Q4_K"));
}

TEST(rejects_size_mismatch) {
    ms_err e = {0};
    int n;
    int rc = parse("{\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, &e, &n);
    CHECK(rc == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "needs 6 bytes") != NULL);
}

TEST(rejects_oversized_header) {
    uint8_t b[16] = {0};
    uint64_t h = (uint64_t)MS_ST_MAX_HEADER + 1;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(h >> (8 * i));
    ms_err e = {0};
    ms_tensor *t;
    int n;
    CHECK(ms_st_parse(b, 16, 16, "x", &t, &n, NULL, &e) == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "out of bounds") != NULL);
    h = 100; /* within bounds but longer than the file */
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(h >> (8 * i));
    CHECK(ms_st_parse(b, 16, 16, "x", &t, &n, NULL, &e) == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "exceeds the file") != NULL);
}

TEST(rejects_duplicates_and_junk) {
    ms_err e = {0};
    int n;
    CHECK(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                2, &e, &n) == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "twice") != NULL);
    CHECK(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}", 1, &e, &n) == MS_ERR_FORMAT);
    CHECK(parse("[1,2]", 0, &e, &n) == MS_ERR_FORMAT);
    CHECK(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, &e, &n) == MS_ERR_FORMAT);
    CHECK(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, &e, &n) == MS_ERR_FORMAT);
    CHECK(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,0]}}", 1, &e, &n) == MS_ERR_FORMAT);
}

static void write_file(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(d, 1, n, f);
    fclose(f);
}

TEST(sharded_index) {
    char dir[] = "/tmp/ms_test_stXXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p[512];
    size_t len;
    uint8_t *b = mk("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    write_file(p, b, len);
    free(b);
    b = mk("{\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    write_file(p, b, len);
    free(b);
    const char *idx = "{\"metadata\":{},\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s2.safetensors\"}}";
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_file(p, idx, strlen(idx));
    ms_checkpoint ck;
    ms_err e = {0};
    int rc = ms_checkpoint_open(dir, &ck, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    if (!rc) {
        CHECK(ms_checkpoint_find(&ck, "x") && ms_checkpoint_find(&ck, "y"));
        CHECK(ms_checkpoint_find(&ck, "z") == NULL);
        CHECK(ck.n_files == 2);
        ms_checkpoint_close(&ck);
    }
    /* index naming a missing shard */
    idx = "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s3.safetensors\"}}";
    write_file(p, idx, strlen(idx));
    CHECK(ms_checkpoint_open(dir, &ck, &e) == MS_ERR_IO);
    CHECK(strstr(e.msg, "s3.safetensors") && strstr(e.msg, "does not exist"));
    /* index pointing at a tensor that the shard lacks */
    idx = "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s1.safetensors\"}}";
    write_file(p, idx, strlen(idx));
    CHECK(ms_checkpoint_open(dir, &ck, &e) == MS_ERR_FORMAT);
    CHECK(strstr(e.msg, "\"y\"") != NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST(fixture_loads) {
    ms_checkpoint ck;
    ms_err e = {0};
    int rc = ms_checkpoint_open(MS_TEST_FIXTURES "deepseek_v3", &ck, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    if (!rc) {
        const ms_tensor *t = ms_checkpoint_find(&ck, "model.embed_tokens.weight");
        CHECK(t && t->dtype == MS_DT_BF16 && t->ndim == 2 && t->shape[0] == 512 && t->shape[1] == 64);
        ms_checkpoint_close(&ck);
    }
}

TEST_MAIN()
