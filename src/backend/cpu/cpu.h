/* cpu.h — CPU backend: instruction-set dispatch and machine measurements.
 *
 * The fast kernels (ms_matmul, ms_rmsnorm, ...) pick an implementation at run
 * time from what the CPU supports: AVX-512 (F/BW/VL + FMA + F16C), AVX2 (+FMA,
 * F16C) or portable scalar C. The process's choice is made once (first use)
 * from CPUID, capped by the environment variable MS_CPU_ISA=scalar|avx2|avx512,
 * and never changes after. A pool can carry its own (ms_cpu_set_isa: tests and
 * benchmarks force every path this way); the kernels that receive a pool
 * (ms_matmul*, the KDA/DeltaNet ops of ops/kda.h, ms_measure_read_bandwidth)
 * follow it, the pool-less vector ops (ms_rmsnorm, ms_softmax, ...) use the
 * process's choice. */
#ifndef MS_BACKEND_CPU_H
#define MS_BACKEND_CPU_H

#include <stddef.h>

#include "util/err.h"
#include "util/threadpool.h"

typedef enum ms_cpu_isa {
    MS_ISA_SCALAR = 0,
    MS_ISA_AVX2 = 1,
    MS_ISA_AVX512 = 2,
} ms_cpu_isa;

/* The best ISA this CPU supports (ignores MS_CPU_ISA and ms_cpu_set_isa). */
ms_cpu_isa ms_cpu_isa_best(void);
/* The process's ISA: the best, capped by MS_CPU_ISA (fixed at first use). */
ms_cpu_isa ms_cpu_isa_active(void);
/* The ISA the kernels run on `pool` use: its own, else the process's (also for NULL). */
ms_cpu_isa ms_cpu_isa_of(const ms_pool *pool);
/* Make the kernels run on `pool` use `isa` (may exceed MS_CPU_ISA, not the CPU).
 * Fails with MS_ERR_ARG for a NULL pool or an unknown isa, MS_ERR_UNSUPPORTED
 * (message in err) when the CPU lacks it. Call it between computations on the pool. */
int ms_cpu_set_isa(ms_pool *pool, ms_cpu_isa isa, ms_err *err);
/* "scalar", "avx2", "avx512". */
const char *ms_cpu_isa_name(ms_cpu_isa isa);
/* Parse a name as above; returns -1 when unknown. */
int ms_cpu_isa_parse(const char *name);

/* Measured memory read bandwidth in GB/s (1e9 bytes/s): every pool thread
 * sum-reduces its share of a buffer of `bytes` (use several times the last-level
 * cache; 0 picks 512 MiB), best of a few passes. Allocates and frees the buffer;
 * returns 0 when it cannot be allocated. A NULL pool measures one thread. */
double ms_measure_read_bandwidth(ms_pool *pool, size_t bytes);

#endif
