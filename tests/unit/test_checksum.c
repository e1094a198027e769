/* test_checksum.c — whole-file SHA-256 (FIPS 180-2 vectors, coreutils sha256sum across the
 * read chunks) and the sha256sum checksum-file parser (io/checksum.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/checksum.h"
#include "test.h"
#include "util/hash.h"

static char g_dir[] = "/tmp/ms_test_checksum_XXXXXX";

static void write_file(const char *name, const void *buf, size_t n) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    CHECK(f && fwrite(buf, 1, n, f) == n);
    if (f) fclose(f);
}

static void file_hex(const char *name, char hex[65], uint64_t *size) {
    char p[256];
    uint8_t sum[32];
    ms_err err = {0};
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    int rc = ms_sha256_file(p, sum, size, NULL, NULL, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    ms_hex(sum, 32, hex);
}

static int calls;
static uint64_t last_done;
static void count(void *ud, uint64_t done, uint64_t size) {
    (void)ud, (void)size;
    CHECK(done > last_done);
    last_done = done;
    calls++;
}

TEST(fips_vectors) {
    char hex[65];
    uint64_t size = 7;
    write_file("empty", "", 0);
    file_hex("empty", hex, &size);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") && size == 0);
    write_file("abc", "abc", 3);
    file_hex("abc", hex, &size);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") && size == 3);
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    write_file("million_a", a, 1000000);
    free(a);
    file_hex("million_a", hex, &size);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") && size == 1000000);
}

TEST(large_file_vs_sha256sum) {
    /* 19 MiB + 13 bytes: three read chunks, the last one partial */
    size_t n = (19u << 20) + 13;
    uint8_t *b = malloc(n);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(ms_test_xorshift(&s) >> 56);
    write_file("big.safetensors", b, n);
    free(b);
    char cmd[300], ref[65] = {0}, hex[65], p[256];
    snprintf(cmd, sizeof cmd, "sha256sum %s/big.safetensors", g_dir);
    FILE *f = popen(cmd, "r");
    CHECK(f && fscanf(f, "%64s", ref) == 1);
    if (f) pclose(f);
    uint8_t sum[32];
    uint64_t size = 0;
    ms_err err = {0};
    snprintf(p, sizeof p, "%s/big.safetensors", g_dir);
    calls = 0, last_done = 0;
    CHECK(ms_sha256_file(p, sum, &size, count, NULL, &err) == 0);
    ms_hex(sum, 32, hex);
    CHECK_MSG(!strcmp(hex, ref), "%s vs sha256sum %s", hex, ref);
    CHECK(size == n && last_done == n && calls == 3);
    CHECK(ms_sha256_file("/nonexistent/x", sum, &size, NULL, NULL, &err) == MS_ERR_IO && strstr(err.msg, "/nonexistent/x"));
}

TEST(list_shards_sorted) {
    write_file("b-00002.safetensors", "x", 1);
    write_file("a-00001.safetensors", "x", 1);
    write_file("config.json", "{}", 2);
    char **names;
    int n;
    ms_err err = {0};
    CHECK(ms_list_shards(g_dir, &names, &n, &err) == 0);
    CHECK(n == 3 && !strcmp(names[0], "a-00001.safetensors") && !strcmp(names[1], "b-00002.safetensors") &&
          !strcmp(names[2], "big.safetensors"));
    ms_names_free(names, n);
}

static int parse(const char *text, ms_sums *s, ms_err *err) {
    *err = (ms_err){0};
    return ms_sums_parse(text, strlen(text), "SUMS", s, err);
}

TEST(sums_parse) {
    const char *h = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    char text[1024];
    ms_sums s;
    ms_err err;
    snprintf(text, sizeof text, "%s  abc\n\n%s *sub/x y.safetensors\r\nBA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD  up", h, h);
    CHECK_MSG(parse(text, &s, &err) == 0, "%s", err.msg);
    CHECK(s.n == 3 && !strcmp(s.e[0].name, "abc") && !strcmp(s.e[1].name, "sub/x y.safetensors") && !strcmp(s.e[2].name, "up"));
    CHECK(s.n == 3 && s.e[0].sum[0] == 0xba && s.e[2].sum[31] == 0xad && ms_sums_find(&s, "up") == &s.e[2] &&
          !ms_sums_find(&s, "nope"));
    ms_sums_free(&s);
    struct {
        const char *line, *want;
    } bad[] = {
        {"ba7816bf  abc", ":1: expected 64 hex"},
        {"zz7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  abc", ":1: expected 64 hex"},
        {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad0  abc", ":1: expected 64 hex"},
        {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad abc", "sha256sum format"},
        {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  ", "sha256sum format"},
        {"\\ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  a\\nb", "escaped"},
        {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  /etc/passwd", "relative"},
        {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  a/../../b", "relative"},
        {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  a\n"
         "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  a",
         ":2: \"a\" is listed twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = parse(bad[i].line, &s, &err);
        CHECK_MSG(rc != 0 && strstr(err.msg, bad[i].want) && s.n == 0 && !s.e, "case %zu: %s", i, err.msg);
    }
    /* a name with ".." inside a component is a name */
    CHECK(parse("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  a..b", &s, &err) == 0 && s.n == 1);
    ms_sums_free(&s);
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
