/* threadpool.c — a fixed pool with low-latency dispatch.
 *
 * One word, `work` = (generation << 32) | next task index, carries both the
 * publication of a new run and the claiming of its tasks (compare-and-swap),
 * so a worker that wakes late can never run a task of a finished run: its CAS
 * on the old generation fails (each run first closes the previous generation,
 * then writes fn/ctx/n_tasks, then opens a new one). The caller publishes fn/ctx/n_tasks before the
 * new generation (release), takes tasks itself, then waits until `done`
 * reaches n_tasks. Idle workers spin on `work` (with pause) for a short time
 * budget, then sleep on a condition variable; the caller signals only when a
 * worker is asleep. Nothing is allocated per run.
 *
 * Busy machines: tasks are claimed one at a time, so a preempted worker holds
 * at most the task it is in, and the others take everything else. The caller,
 * once no task is left to claim, spins only briefly (MS_POOL_WAIT_SPIN_US,
 * default 0.2 ms) for the ones still running, then sleeps on a futex on `done`
 * (the worker finishing the last task wakes it): a spinning caller would keep
 * its core from the preempted worker, which then waits a whole time slice on
 * the other core behind the machine's other load.
 *
 * That wait can still cost more than the parallelism gains: on a loaded machine a worker
 * preempted inside its task holds the run for the rest of a scheduler slice. So the caller
 * keeps score (ADAPT_RUNS runs at a time): the wall time of each parallel run against what it
 * would have taken alone (the time the caller spent on its own tasks, times n_tasks over the
 * number it ran). When the runs together were slower than alone, the next ADAPT_SOLO_NS of runs
 * go on the caller only (the same tasks with the same indices, so the results do not change),
 * then parallel runs are scored again. MS_POOL_ADAPT=0 turns this off. */
#include "util/threadpool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct ms_pool {
    int n;
    int isa; /* ms_pool_isa */
    int act; /* ms_pool_act */
    pthread_t *threads;
    struct worker_arg *args;
    /* current run: written by the caller before publishing the generation */
    _Atomic(ms_task_fn) fn;
    _Atomic(void *) ctx;
    atomic_int n_tasks;
    _Alignas(64) _Atomic uint64_t work; /* generation << 32 | next task index */
    _Alignas(64) atomic_int done;       /* tasks finished in this generation (futex word) */
    atomic_int caller_waits;            /* the caller sleeps (or is about to) on done */
    _Alignas(64) atomic_int sleepers;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t spin_ns;
    int64_t wait_spin_ns; /* caller: spin this long for running tasks, then sleep */
    /* adaptive fallback (caller-only state; see the top comment) */
    int adapt;
    int scored;             /* parallel runs scored in this window */
    int64_t wall_ns, solo_ns; /* their wall time, and the estimate of running them alone */
    int64_t solo_until;     /* run on the caller only until this time (now_ns) */
    uint64_t solo_runs;     /* runs the fallback put on the caller (for tests and tuning) */
};

enum { ADAPT_RUNS = 32 };
#define ADAPT_SOLO_NS 20000000 /* 20 ms */

struct worker_arg {
    ms_pool *p;
    int tid;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    sched_yield();
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void futex_wait(atomic_int *addr, int val) {
    syscall(SYS_futex, (int *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void futex_wake_all(atomic_int *addr) { syscall(SYS_futex, (int *)addr, FUTEX_WAKE_PRIVATE, 1 << 30, NULL, NULL, 0); }

/* Claim and run tasks of generation g until none are left; returns how many it ran. */
static int drain(ms_pool *p, uint32_t g, int tid) {
    int ran = 0;
    for (;;) {
        uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
        if ((uint32_t)(w >> 32) != g) return ran;
        uint32_t i = (uint32_t)w;
        int n = atomic_load_explicit(&p->n_tasks, memory_order_relaxed);
        if (i >= (uint32_t)n) return ran; /* also the closed marker UINT32_MAX */
        ms_task_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
        /* Pairs with the release fence in ms_pool_run: if fn/ctx/n above were
         * already the next run's, the CAS sees at least the closing store and
         * fails. So success means they belong to generation g. */
        atomic_thread_fence(memory_order_acquire);
        if (!atomic_compare_exchange_weak_explicit(&p->work, &w, w + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        fn(ctx, (int)i, tid);
        ran++;
        /* seq_cst: pairs with the caller's caller_waits store and done load */
        if (atomic_fetch_add(&p->done, 1) + 1 == n && tid != 0 && atomic_load(&p->caller_waits)) futex_wake_all(&p->done);
    }
}

static void *worker(void *arg) {
    struct worker_arg *a = arg;
    ms_pool *p = a->p;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = (uint32_t)(atomic_load_explicit(&p->work, memory_order_acquire) >> 32);
        if (g == seen) {
            /* spin for a while: decode issues hundreds of small runs back to back */
            int64_t t0 = now_ns();
            for (unsigned it = 1;; it++) {
                cpu_relax();
                g = (uint32_t)(atomic_load_explicit(&p->work, memory_order_acquire) >> 32);
                if (g != seen) break;
                if ((it & 63) == 0 && now_ns() - t0 > p->spin_ns) break;
            }
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = (uint32_t)(atomic_load(&p->work) >> 32)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        seen = g;
        drain(p, g, a->tid);
    }
}

ms_pool *ms_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > 1024) n_threads = 1024;
    ms_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = 1;
    p->isa = -1;
    p->spin_ns = 300000;     /* 0.3 ms */
    p->wait_spin_ns = 200000; /* 0.2 ms */
    const char *env = getenv("MS_POOL_SPIN_US");
    if (env && *env) {
        long us = strtol(env, NULL, 10);
        if (us >= 0 && us <= 1000000) p->spin_ns = (int64_t)us * 1000;
    }
    env = getenv("MS_POOL_ADAPT");
    p->adapt = !(env && !strcmp(env, "0"));
    env = getenv("MS_POOL_WAIT_SPIN_US");
    if (env && *env) {
        long us = strtol(env, NULL, 10);
        if (us >= 0 && us <= 1000000) p->wait_spin_ns = (int64_t)us * 1000;
    }
    if (pthread_mutex_init(&p->mu, NULL) || pthread_cond_init(&p->cv, NULL)) {
        free(p);
        return NULL;
    }
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->args = calloc((size_t)n_threads, sizeof *p->args);
    if (!p->threads || !p->args) {
        ms_pool_destroy(p);
        return NULL;
    }
    /* kernels keep tiles of ~130 KiB on their stacks: ask for 8 MiB whatever
     * RLIMIT_STACK says */
    pthread_attr_t attr;
    int have_attr = pthread_attr_init(&attr) == 0;
    if (have_attr && pthread_attr_setstacksize(&attr, (size_t)8 << 20) != 0) {
        pthread_attr_destroy(&attr);
        have_attr = 0;
    }
    for (int t = 1; t < n_threads; t++) {
        p->args[t] = (struct worker_arg){p, t};
        if (pthread_create(&p->threads[t], have_attr ? &attr : NULL, worker, &p->args[t]) != 0) break;
        p->n = t + 1;
    }
    if (have_attr) pthread_attr_destroy(&attr);
    return p;
}

void ms_pool_destroy(ms_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->work, (uint64_t)1 << 32); /* wake spinners */
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->n; t++) pthread_join(p->threads[t], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p->args);
    free(p);
}

int ms_pool_size(const ms_pool *p) { return p ? p->n : 1; }
int ms_pool_isa(const ms_pool *p) { return p ? p->isa : -1; }
void ms_pool_set_isa(ms_pool *p, int isa) {
    if (p) p->isa = isa;
}

int ms_pool_act(const ms_pool *p) { return p ? p->act : 0; }
void ms_pool_set_act(ms_pool *p, int act) {
    if (p) p->act = act;
}

unsigned long long ms_pool_solo_runs(const ms_pool *p) { return p ? (unsigned long long)p->solo_runs : 0; }

/* Sleep until `done` reaches n_tasks (the worker ending the last task wakes us). */
static void wait_done(ms_pool *p, int n_tasks) {
    for (;;) {
        atomic_store(&p->caller_waits, 1);
        int d = atomic_load(&p->done);
        if (d >= n_tasks) break;
        futex_wait(&p->done, d);
    }
    atomic_store_explicit(&p->caller_waits, 0, memory_order_relaxed);
}

void ms_pool_run(ms_pool *p, int n_tasks, ms_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n == 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    int64_t t0 = p->adapt ? now_ns() : 0;
    if (p->adapt && t0 < p->solo_until) {
        p->solo_runs++;
        for (int i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    /* close the previous generation first (no index is claimable), so a
     * worker that read the old word cannot claim with the new fn/ctx/n */
    uint64_t w = atomic_load_explicit(&p->work, memory_order_relaxed);
    uint32_t g = (uint32_t)(w >> 32) + 1;
    atomic_store_explicit(&p->work, ((uint64_t)g << 32) | UINT32_MAX, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    g++;
    atomic_store(&p->work, (uint64_t)g << 32); /* seq_cst: pairs with the sleepers check */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    int mine = drain(p, g, 0);
    int64_t t1 = p->adapt ? now_ns() : 0;
    /* the remaining tasks are running on workers: spin a little, then sleep until the last one ends */
    if (atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks) {
        int64_t ts = now_ns();
        for (unsigned it = 1; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; it++) {
            cpu_relax();
            if ((it & 63) == 0 && now_ns() - ts > p->wait_spin_ns) break;
        }
        wait_done(p, n_tasks);
    }
    if (p->adapt && mine > 0) {
        int64_t t2 = now_ns();
        p->wall_ns += t2 - t0;
        p->solo_ns += (t1 - t0) * n_tasks / mine;
        if (++p->scored == ADAPT_RUNS) {
            if (p->wall_ns > p->solo_ns) p->solo_until = t2 + ADAPT_SOLO_NS;
            p->scored = 0, p->wall_ns = p->solo_ns = 0;
        }
    }
}
