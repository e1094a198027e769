/* outparse_check.h — what the output-parser tests (test_outparse*.c) share:
 * a UTF-8 check of the event texts, and feeding a text to a parser in chunks.
 * Include after test.h. */
#ifndef MS_TEST_OUTPARSE_CHECK_H
#define MS_TEST_OUTPARSE_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "text/outparse.h"

/* 1 when s[0..n) is whole, well-formed UTF-8 sequences by their lead bytes (no sequence cut at
 * the end); written here, apart from the library's own validators, so it checks them. */
static inline int ms_test_utf8_ok(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

/* Feed t[0..n) to p and finish it, events to fn(user): chunk 0 feeds it whole, 1 byte by byte,
 * anything else in random sizes 1..max drawn from xorshift64 (13, 7, 17) on `seed` (not 0).
 * Returns the first non-zero status of a feed or the finish (MS_OK when none). */
static inline int ms_test_outparse_chunked(ms_outparse *p, const char *t, size_t n, uint64_t chunk, uint64_t seed,
                                           size_t max, ms_outev_fn fn, void *user, ms_err *e) {
    uint64_t s = seed;
    int st = 0;
    for (size_t i = 0; i < n && !st;) {
        size_t k = chunk == 0 ? n : chunk == 1 ? 1 : 0;
        if (!k) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            k = 1 + s % max;
        }
        if (k > n - i) k = n - i;
        st = ms_outparse_feed(p, t + i, k, fn, user, e);
        i += k;
    }
    if (!st) st = ms_outparse_finish(p, fn, user, e);
    return st;
}

#endif
