/* test_threadpool.c — ms_pool_run runs every task exactly once, under many
 * small back-to-back runs, with pools of several sizes, and after the workers
 * have gone to sleep. */
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "test.h"
#include "util/threadpool.h"

typedef struct {
    atomic_int hits[64];
    atomic_int bad_tid;
    int n_threads;
} job;

static void task(void *ctx, int i, int tid) {
    job *j = ctx;
    atomic_fetch_add(&j->hits[i], 1);
    if (tid < 0 || tid >= j->n_threads) atomic_fetch_add(&j->bad_tid, 1);
}

static int check_run(ms_pool *p, int n_tasks) {
    job j;
    for (int i = 0; i < 64; i++) atomic_init(&j.hits[i], 0);
    atomic_init(&j.bad_tid, 0);
    j.n_threads = ms_pool_size(p);
    ms_pool_run(p, n_tasks, task, &j);
    int ok = atomic_load(&j.bad_tid) == 0;
    for (int i = 0; i < 64; i++) ok &= atomic_load(&j.hits[i]) == (i < n_tasks ? 1 : 0);
    if (!ok) {
        fprintf(stderr, "pool of %d, %d tasks: bad tids %d, wrong counts:", j.n_threads, n_tasks, atomic_load(&j.bad_tid));
        for (int i = 0; i < 64; i++)
            if (atomic_load(&j.hits[i]) != (i < n_tasks ? 1 : 0)) fprintf(stderr, " task %d ran %d times", i, atomic_load(&j.hits[i]));
        fputc('\n', stderr);
    }
    return ok;
}

TEST(many_small_runs) {
    int sizes[] = {1, 2, 3, 5};
    for (int s = 0; s < 4; s++) {
        ms_pool *p = ms_pool_create(sizes[s]);
        CHECK(p != NULL);
        if (!p) continue;
        CHECK(ms_pool_size(p) == sizes[s]);
        int bad = 0;
        for (int r = 0; r < 20000; r++) bad += !check_run(p, r % 65 - 1 < 0 ? 0 : r % 65 - 1 > 64 ? 64 : r % 65 - 1);
        CHECK_MSG(bad == 0, "pool of %d: %d bad runs", sizes[s], bad);
        ms_pool_destroy(p);
    }
}

TEST(runs_after_workers_sleep) {
    setenv("MS_POOL_SPIN_US", "50", 1);
    ms_pool *p = ms_pool_create(3);
    unsetenv("MS_POOL_SPIN_US");
    int bad = 0;
    for (int r = 0; r < 20; r++) {
        struct timespec ts = {0, 200000}; /* longer than the spin budget: workers sleep */
        nanosleep(&ts, NULL);
        bad += !check_run(p, 1 + r % 64);
    }
    CHECK(bad == 0);
    ms_pool_destroy(p);
}

TEST(null_pool_runs_inline) {
    CHECK(ms_pool_size(NULL) == 1);
    CHECK(check_run(NULL, 17));
    CHECK(check_run(NULL, 0));
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void empty_task(void *ctx, int i, int tid) { atomic_fetch_add((atomic_int *)ctx, 1); }

TEST(dispatch_latency) {
    ms_pool *p = ms_pool_create(2);
    atomic_int c;
    atomic_init(&c, 0);
    double t0 = now_s();
    for (int r = 0; r < 20000; r++) ms_pool_run(p, 8, empty_task, &c);
    double dt = now_s() - t0;
    CHECK(atomic_load(&c) == 20000 * 8);
    printf("pool of 2: %.2f us per run of 8 empty tasks\n", dt / 20000 * 1e6);
    ms_pool_destroy(p);
}

/* A worker that stalls 2 ms in every task it takes (a preempted worker on a loaded machine):
 * parallel runs then score slower than the caller alone, the pool puts the following runs on
 * the caller (ms_pool_solo_runs > 0), and every run still runs each task exactly once, on
 * valid tids. With MS_POOL_ADAPT=0 it never does. */
typedef struct {
    job j;
    int stall_us;
} stall_job;

static void stall_task(void *ctx, int i, int tid) {
    stall_job *s = ctx;
    if (tid != 0) {
        struct timespec ts = {0, (long)s->stall_us * 1000};
        nanosleep(&ts, NULL);
    }
    task(&s->j, i, tid);
}

static int stall_runs(ms_pool *p, int runs, int n_tasks) {
    int bad = 0;
    for (int r = 0; r < runs; r++) {
        stall_job s = {.stall_us = 2000};
        for (int i = 0; i < 64; i++) atomic_init(&s.j.hits[i], 0);
        atomic_init(&s.j.bad_tid, 0);
        s.j.n_threads = ms_pool_size(p);
        ms_pool_run(p, n_tasks, stall_task, &s);
        int ok = atomic_load(&s.j.bad_tid) == 0;
        for (int i = 0; i < 64; i++) ok &= atomic_load(&s.j.hits[i]) == (i < n_tasks ? 1 : 0);
        bad += !ok;
    }
    return bad;
}

TEST(stalled_worker_falls_back_to_caller) {
    ms_pool *p = ms_pool_create(2);
    CHECK(ms_pool_solo_runs(p) == 0);
    int bad = stall_runs(p, 200, 16);
    CHECK_MSG(bad == 0, "%d bad runs", bad);
    CHECK_MSG(ms_pool_solo_runs(p) > 0, "no run went to the caller alone (%llu)", ms_pool_solo_runs(p));
    ms_pool_destroy(p);
    setenv("MS_POOL_ADAPT", "0", 1);
    p = ms_pool_create(2);
    unsetenv("MS_POOL_ADAPT");
    CHECK(stall_runs(p, 40, 16) == 0);
    CHECK(ms_pool_solo_runs(p) == 0);
    ms_pool_destroy(p);
    CHECK(ms_pool_solo_runs(NULL) == 0);
}

TEST_MAIN()
