/* test.h — a minimal unit-test harness. Each test file defines tests with
 * TEST(name) { ... CHECK(cond); ... } and ends with TEST_MAIN(). The binary
 * prints every failure with file:line and a final "N passed, N failed". */
#ifndef MS_TEST_H
#define MS_TEST_H

#include <math.h>
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
