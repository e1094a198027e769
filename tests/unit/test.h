/* test.h — a minimal unit-test harness. Each test file defines tests with
 * TEST(name) { ... CHECK(cond); ... } and ends with TEST_MAIN(). The binary
 * prints every failure with file:line and a final "N passed, N failed". */
#ifndef MS_TEST_H
#define MS_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*ms_test_fn)(void);
static struct { const char *name; ms_test_fn fn; } ms_tests_[256];
static int ms_ntests_, ms_pass_, ms_fail_;

#define TEST(tname)                                                            \
    static void test_##tname(void);                                            \
    __attribute__((constructor)) static void reg_##tname(void) {               \
        ms_tests_[ms_ntests_].name = #tname;                                   \
        ms_tests_[ms_ntests_++].fn = test_##tname;                             \
    }                                                                         \
    static void test_##tname(void)

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (cond) ms_pass_++;                                                 \
        else {                                                                \
            ms_fail_++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                     \
    } while (0)

#define CHECK_MSG(cond, ...)                                                  \
    do {                                                                      \
        if (cond) ms_pass_++;                                                 \
        else {                                                                \
            ms_fail_++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
        }                                                                     \
    } while (0)

#define CHECK_NEAR(a, b, tol) CHECK_MSG(fabs((double)(a) - (double)(b)) <= (tol), "%g vs %g", (double)(a), (double)(b))

/* Where the tests' fixtures are (tests/data/README.md): MS_TEST_FIXTURES "qwen3_moe". */
#define MS_TEST_FIXTURES "tests/data/fixtures/models/"

/* max |a[i] - b[i]| over n values, in double; a NaN on either side makes it NaN-large (never hidden). */
static inline double ms_test_max_abs(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* The tests' random stream: xorshift64 (13, 7, 17) on *s (never 0); returns the new state. */
static inline uint64_t ms_test_xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
/* Uniform in (0, 1) from the top 53 bits of the next state. */
static inline double ms_test_urand(uint64_t *s) { return ((ms_test_xorshift(s) >> 11) + 0.5) / 9007199254740992.0; }

#define TEST_MAIN()                                                           \
    int main(void) {                                                          \
        for (int i = 0; i < ms_ntests_; i++) {                                \
            int before = ms_fail_;                                            \
            ms_tests_[i].fn();                                                \
            if (ms_fail_ != before) fprintf(stderr, "  in test %s\n", ms_tests_[i].name); \
        }                                                                     \
        printf("%d passed, %d failed\n", ms_pass_, ms_fail_);                 \
        return ms_fail_ ? 1 : 0;                                              \
    }

#endif
