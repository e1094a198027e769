/* Reader: every io mode returns exactly the file's bytes, for aligned and
 * unaligned extents, many in flight; fallbacks and errors are named. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/reader.h"
#include "test.h"
#include "util/hash.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t xs(void) { return ms_test_xorshift(&rng); }

static uint8_t *write_file(const char *path, size_t n) {
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(xs() >> 24);
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
    return b;
}

static void check_mode(ms_io_mode mode, const char *path, const uint8_t *ref, size_t n, int expect_mode) {
    ms_err e = {0};
    ms_reader *r;
    char why[512];
    enum { NB = 24 };
    uint64_t cap = 1u << 20;
    uint8_t *arena = NULL;
    CHECK(posix_memalign((void **)&arena, 4096, cap * NB) == 0);
    ms_reader_opts o = {.mode = mode, .queue_depth = 8, .chunk_bytes = 64 << 10, .arena = arena,
                        .arena_bytes = cap * NB, .unit_bytes = cap};
    int rc = ms_reader_open(&path, 1, &o, &r, why, sizeof why, &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    if (rc) { free(arena); return; }
    CHECK_MSG((int)ms_reader_mode(r) == expect_mode, "mode %s: %s", ms_io_mode_name(ms_reader_mode(r)), why);
    CHECK(why[0] != 0);
    uint64_t offs[NB], lens[NB];
    for (int i = 0; i < NB; i++) {
        /* mix: aligned, unaligned head, unaligned tail, tiny, the file's last byte */
        uint64_t len = 1 + xs() % (cap - 8192);
        if (i % 6 == 0) len = 1 + xs() % 100;
        uint64_t off = xs() % (n - len);
        if (i % 5 == 0) off &= ~4095ull;
        if (i == 7) { off = n - 1; len = 1; }
        if (i == 8) { off = n - 5000; len = 5000; }
        offs[i] = off;
        lens[i] = len;
        memset(arena + i * cap, 0xAB, cap);
        rc = ms_reader_submit(r, 0, off, len, arena + i * cap, (uint64_t)i, &e);
        CHECK_MSG(rc == 0, "%s", e.msg);
    }
    CHECK(ms_reader_outstanding(r) == NB);
    int got = 0, seen[NB] = {0};
    while (got < NB) {
        ms_read_done d[8];
        int nd;
        rc = ms_reader_reap(r, 1, d, 8, &nd, &e);
        CHECK_MSG(rc == 0, "%s", e.msg);
        if (rc) break;
        for (int k = 0; k < nd; k++) {
            int i = (int)d[k].tag;
            CHECK(d[k].status == 0);
            CHECK(!seen[i]);
            seen[i] = 1;
            CHECK_MSG(memcmp(arena + i * cap + (offs[i] & 4095), ref + offs[i], lens[i]) == 0,
                      "mode %s extent %d off %llu len %llu differs", ms_io_mode_name(mode), i,
                      (unsigned long long)offs[i], (unsigned long long)lens[i]);
        }
        got += nd;
    }
    CHECK(ms_reader_outstanding(r) == 0);
    /* past the end: named error, nothing queued */
    rc = ms_reader_submit(r, 0, n - 10, 11, arena, 99, &e);
    CHECK(rc == MS_ERR_IO && strstr(e.msg, "past the end") && strstr(e.msg, path));
    ms_reader_close(r);
    free(arena);
}

TEST(modes_identical_bytes) {
    mkdir("build/tmp", 0755);
    const char *path = "build/tmp/reader_test.bin";
    size_t n = (3u << 20) + 12345;
    uint8_t *ref = write_file(path, n);
    check_mode(MS_IO_PREAD, path, ref, n, MS_IO_PREAD);
    check_mode(MS_IO_MMAP, path, ref, n, MS_IO_MMAP);
    /* uring: O_DIRECT on this filesystem when it allows it */
    check_mode(MS_IO_URING, path, ref, n, MS_IO_URING);
    unlink(path);
    free(ref);
}

TEST(tmpfs_falls_back_with_reason) {
    const char *path = "/dev/shm/ms_reader_test.bin";
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) return; /* no tmpfs here */
    close(fd);
    int dfd = open(path, O_RDONLY | O_DIRECT);
    if (dfd >= 0) { close(dfd); unlink(path); return; } /* this tmpfs takes O_DIRECT: nothing to test */
    size_t n = 200000;
    uint8_t *ref = write_file(path, n);
    check_mode(MS_IO_AUTO, path, ref, n, MS_IO_PREAD);
    ms_err e = {0};
    ms_reader *r;
    char why[512];
    ms_reader_opts o = {.mode = MS_IO_AUTO};
    CHECK(ms_reader_open(&path, 1, &o, &r, why, sizeof why, &e) == 0);
    CHECK_MSG(strstr(why, "O_DIRECT") && strstr(why, path), "%s", why);
    ms_reader_close(r);
    unlink(path);
    free(ref);
}

TEST(missing_file_named) {
    ms_err e = {0};
    ms_reader *r;
    const char *p = "build/tmp/does-not-exist.bin";
    CHECK(ms_reader_open(&p, 1, NULL, &r, NULL, 0, &e) == MS_ERR_IO);
    CHECK(strstr(e.msg, p) != NULL);
    ms_io_mode m;
    CHECK(ms_io_mode_parse("uring", &m, &e) == 0 && m == MS_IO_URING);
    CHECK(ms_io_mode_parse("aio", &m, &e) == MS_ERR_ARG && strstr(e.msg, "aio"));
}

TEST(probe_bandwidth) {
    mkdir("build/tmp", 0755);
    const char *path = "build/tmp/probe_test.bin";
    uint8_t *ref = write_file(path, 4u << 20);
    double bw = 0;
    ms_err e = {0};
    char why[256];
    CHECK_MSG(ms_io_probe_bandwidth(path, 0, 1u << 20, 4, MS_IO_AUTO, &bw, why, sizeof why, &e) == 0, "%s", e.msg);
    CHECK(bw > 0);
    int qd = 0;
    CHECK_MSG(ms_io_probe_queue_depth(path, 64 << 10, 1 << 20, &qd, &e) == 0, "%s", e.msg);
    CHECK(qd == 2 || qd == 8 || qd == 32 || qd == 64);
    CHECK(ms_io_probe_queue_depth(path, 1000, 1 << 20, &qd, &e) == MS_ERR_ARG);
    unlink(path);
    free(ref);
}

TEST(crc32c_reference) {
    /* the standard CRC-32C check value (RFC 3720 / iSCSI) */
    CHECK(ms_crc32c(0, "123456789", 9) == 0xE3069283u);
    CHECK(ms_crc32c_sw(0, "123456789", 9) == 0xE3069283u);
    /* RFC 3720 B.4: 32 bytes of zeros -> 0x8A9136AA, 32 bytes of 0xFF -> 0x62A8AB43 */
    uint8_t z[32] = {0}, f[32];
    memset(f, 0xff, 32);
    CHECK(ms_crc32c(0, z, 32) == 0x8A9136AAu);
    CHECK(ms_crc32c(0, f, 32) == 0x62A8AB43u);
    /* fast path = table twin on odd lengths/alignments, and chaining */
    uint8_t *b = malloc(100003);
    for (int i = 0; i < 100003; i++) b[i] = (uint8_t)xs();
    for (int k = 0; k < 20; k++) {
        size_t o = xs() % 1000, l = xs() % 99000;
        CHECK(ms_crc32c(0, b + o, l) == ms_crc32c_sw(0, b + o, l));
    }
    CHECK(ms_crc32c(ms_crc32c(0, b, 777), b + 777, 5000) == ms_crc32c(0, b, 5777));
    free(b);
    uint8_t h[32];
    char hex[65];
    CHECK(ms_sha256("abc", 3, h) == 0);
    ms_hex(h, 32, hex);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
}

TEST_MAIN()
