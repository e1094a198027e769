#include "util/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct ms_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* current job */
    ms_task_fn fn;
    void *ctx;
    int n_tasks;
    atomic_int next;
    atomic_int done_workers;
    atomic_uint generation;
    int stop;
};

typedef struct { ms_pool *p; int tid; } worker_arg;

static void drain(ms_pool *p, int tid) {
    for (;;) {
        int i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n_tasks) break;
        p->fn(p->ctx, i, tid);
    }
}

static void *worker(void *arg) {
    worker_arg a = *(worker_arg *)arg;
    free(arg);
    ms_pool *p = a.p;
    unsigned seen = 0;
    for (;;) {
        /* spin briefly for low-latency back-to-back kernels, then sleep */
        int spins = 0;
        while (atomic_load_explicit(&p->generation, memory_order_acquire) == seen && spins < 20000) {
            spins++;
            if ((spins & 255) == 0) sched_yield();
        }
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->generation) == seen && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        int stop = p->stop;
        pthread_mutex_unlock(&p->mu);
        if (stop) return NULL;
        seen = atomic_load(&p->generation);
        drain(p, a.tid);
        atomic_fetch_add_explicit(&p->done_workers, 1, memory_order_release);
    }
}

ms_pool *ms_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    ms_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) { free(p); return NULL; }
    for (int t = 1; t < n_threads; t++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) { p->n = t; break; }
        a->p = p;
        a->tid = t;
        if (pthread_create(&p->threads[t], NULL, worker, a) != 0) { free(a); p->n = t; break; }
    }
    return p;
}

void ms_pool_destroy(ms_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->n; t++) pthread_join(p->threads[t], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

int ms_pool_size(const ms_pool *p) { return p ? p->n : 1; }

void ms_pool_run(ms_pool *p, int n_tasks, ms_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n == 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    atomic_store(&p->done_workers, 0);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    /* Wait for the workers: spin briefly, then yield so that a worker sharing
     * this core (an oversubscribed machine) gets to run instead of us spinning
     * through our whole time slice. */
    for (int spins = 0; atomic_load_explicit(&p->done_workers, memory_order_acquire) < p->n - 1; spins++)
        if (spins > 64) sched_yield();
}
