/* cpu.h — CPU backend: instruction-set dispatch and machine measurements.
 *
 * The fast kernels (ms_matmul, ms_rmsnorm, ...) pick an implementation at run
 * time from what the CPU supports: AVX-512 (F/BW/VL + FMA + F16C), AVX2 (+FMA,
 * F16C) or portable scalar C; the int8 dot products of the Q8-activation path
 * (ms_cpu_set_activations) also use AVX-512 VNNI or AVX-VNNI where present
 * (the *_VNNI levels: the same F32 kernels as AVX-512 / AVX2). The process's choice is made once (first use)
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
    MS_ISA_AVX_VNNI = 3,    /* AVX2 + AVX-VNNI (256-bit vpdpbusd) */
    MS_ISA_AVX512_VNNI = 4, /* AVX-512 + AVX512_VNNI */
} ms_cpu_isa;

/* Activations of the CPU matmuls (--cpu-activations). F32: the weights are
 * dequantized to F32 against F32 activations (the default; results are the
 * reference kernels'). Q8: for MXFP4, INT4 and Q8 weights the activations are
 * rounded to int8 per block of 32 with an F32 scale (amax / 127) and multiplied
 * in integers (core/qmat.h dtypes; FP8 and 16/32-bit weights keep F32). BF16:
 * the decode matvec of BF16 weights rounds x to BF16 and uses vdpbf16ps, on an
 * AVX-512 ISA of a CPU with AVX512_BF16 only (elsewhere, and for prefill, F32).
 * Q8_BF16 is both (the values are bit flags: Q8 | BF16). Q16: the weights Q8
 * takes, with the activations rounded to 16 bits per block of 32 (unit amax /
 * (127 * 256)) held as two int8 planes (x ~ unit * (256 q_hi + q_lo)), two
 * integer dot products per weight vector: 256x less rounding than Q8 (within
 * the verify tolerance on every fixture), still no weight dequantized to F32;
 * decode (one token) only, prefill keeps the F32 tiles. Q16_BF16 is Q16 | BF16. */
typedef enum ms_cpu_act {
    MS_ACT_F32 = 0,
    MS_ACT_Q8 = 1,
    MS_ACT_BF16 = 2,
    MS_ACT_Q8_BF16 = 3,
    MS_ACT_Q16 = 4,
    MS_ACT_Q16_BF16 = 6,
} ms_cpu_act;

/* The best ISA this CPU supports (ignores MS_CPU_ISA and ms_cpu_set_isa). */
ms_cpu_isa ms_cpu_isa_best(void);
/* Whether this CPU can run `isa` (0 for values outside the enum). */
int ms_cpu_isa_supported(ms_cpu_isa isa);
/* The F32 kernel family of `isa`: AVX_VNNI -> AVX2, AVX512_VNNI -> AVX512, else itself. */
ms_cpu_isa ms_cpu_isa_base(ms_cpu_isa isa);
/* The process's ISA: the best, or MS_CPU_ISA when the CPU supports it (fixed at first use). */
ms_cpu_isa ms_cpu_isa_active(void);
/* The ISA the kernels run on `pool` use: its own, else the process's (also for NULL). */
ms_cpu_isa ms_cpu_isa_of(const ms_pool *pool);
/* Make the kernels run on `pool` use `isa` (may exceed MS_CPU_ISA, not the CPU).
 * Fails with MS_ERR_ARG for a NULL pool or an unknown isa, MS_ERR_UNSUPPORTED
 * (message in err) when the CPU lacks it. Call it between computations on the pool. */
int ms_cpu_set_isa(ms_pool *pool, ms_cpu_isa isa, ms_err *err);
/* Whether this CPU has AVX512_BF16 (vdpbf16ps) besides the AVX-512 level. */
int ms_cpu_has_avx512bf16(void);
/* "scalar", "avx2", "avx512", "avxvnni", "avx512vnni". */
const char *ms_cpu_isa_name(ms_cpu_isa isa);
/* Parse a name as above; returns -1 when unknown. */
int ms_cpu_isa_parse(const char *name);

/* Make the matmuls run on `pool` use activations `act` (default MS_ACT_F32).
 * MS_ERR_ARG for a NULL pool or an unknown value. Call between computations. */
int ms_cpu_set_activations(ms_pool *pool, ms_cpu_act act, ms_err *err);
/* The activations of `pool` (MS_ACT_F32 for NULL). */
ms_cpu_act ms_cpu_activations_of(const ms_pool *pool);
/* "f32" / "q8" / "bf16" / "q8+bf16" / "q16" / "q16+bf16"; parse returns -1 for anything else. */
const char *ms_cpu_act_name(ms_cpu_act act);
int ms_cpu_act_parse(const char *name);
/* The programs' default --cpu-activations for kernels of `isa` (src/cli; a pool's own default
 * stays MS_ACT_F32): MS_ACT_Q16 on every SIMD level (it keeps every fixture within verify's
 * tolerance with identical greedy ids: docs/performance.md "CPU Q8 activations"), MS_ACT_F32 on
 * scalar, where the integer path has no fast kernel. f32 stays selectable. */
ms_cpu_act ms_cpu_act_default(ms_cpu_isa isa);

/* Measured memory read bandwidth in GB/s (1e9 bytes/s): every pool thread
 * sum-reduces its share of a buffer of `bytes` (use several times the last-level
 * cache; 0 picks 512 MiB), best of a few passes. Allocates and frees the buffer;
 * returns 0 when it cannot be allocated. A NULL pool measures one thread. */
double ms_measure_read_bandwidth(ms_pool *pool, size_t bytes);

#endif
