/* threadpool.h — a fixed pool of worker threads for data-parallel kernels.
 *
 * ms_pool_run(p, n, fn, ctx) calls fn(ctx, i, tid) for every i in [0, n)
 * across the pool (the caller participates as tid 0) and returns when all
 * are done. Tasks are handed out dynamically (atomic counter). One run at a
 * time per pool; not reentrant. A NULL pool runs everything on the caller. */
#ifndef MS_THREADPOOL_H
#define MS_THREADPOOL_H

typedef void (*ms_task_fn)(void *ctx, int task, int tid);
typedef struct ms_pool ms_pool;

/* n_threads <= 0 means one per online CPU. Returns NULL on failure. */
ms_pool *ms_pool_create(int n_threads);
void ms_pool_destroy(ms_pool *p);
int ms_pool_size(const ms_pool *p);
void ms_pool_run(ms_pool *p, int n_tasks, ms_task_fn fn, void *ctx);
/* How many runs the pool put on the caller alone because parallel runs were scoring
 * slower than one thread (a loaded machine; threadpool.c). 0 for NULL. */
unsigned long long ms_pool_solo_runs(const ms_pool *p);

/* The instruction set the CPU kernels run on this pool use (an ms_cpu_isa of
 * backend/cpu/cpu.h; set it through ms_cpu_set_isa there, which checks it),
 * or -1 (the default, and always for a NULL pool): the process's choice. */
int ms_pool_isa(const ms_pool *p);
void ms_pool_set_isa(ms_pool *p, int isa);
/* The activation mode of the CPU matmuls run on this pool (an ms_cpu_act of
 * backend/cpu/cpu.h, set through ms_cpu_set_activations there); 0 (F32) by
 * default and for a NULL pool. */
int ms_pool_act(const ms_pool *p);
void ms_pool_set_act(ms_pool *p, int act);

#endif
