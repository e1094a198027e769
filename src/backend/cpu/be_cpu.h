/* be_cpu.h — private to the CPU backend's files (backend_cpu.c, be_cpu_*.c). */
#ifndef MS_BE_CPU_H
#define MS_BE_CPU_H

#include "backend/cpu/backend_cpu.h"

/* keys per block of the expanded MLA prefill (bounds its per-thread scratch) */
#define MS_MLA_KEY_BLOCK 256

/* what the per-thread scratch is sized by (backend_cpu.c) */
typedef struct cpu_scratch_dims {
    int64_t lora, row, mla_block, small;
    int64_t ca_window, ca_rate; /* compressed attention: widest window, smallest rate (0: none) */
} cpu_scratch_dims;

typedef struct cpu_backend {
    ms_backend base;
    ms_pool *pool;
    int n_threads;
    /* per-thread scratch: th_stride floats per thread, sized by reserve() for
     * contexts of up to max_ctx tokens and chunks of up to max_batch */
    float *th_buf;
    size_t th_stride;
    int64_t max_ctx, max_batch;
    cpu_scratch_dims dims;
} cpu_backend;

static inline cpu_backend *cpu_of(ms_backend *be) { return (cpu_backend *)be; }
static inline float *cpu_thread_buf(cpu_backend *b, int tid) { return b->th_buf + (size_t)tid * b->th_stride; }

/* Floats of per-thread scratch a model of config c needs (backend_cpu.c). */
size_t ms_cpu_th_stride(const ms_config *c, int64_t max_ctx, int64_t max_batch);

/* Ops implemented in be_cpu_*.c, gathered into the ops table by backend_cpu.c. */
int ms_cpu_attn_gqa(ms_backend *be, const ms_attn_gqa_args *a, ms_err *err);
int ms_cpu_attn_mla(ms_backend *be, const ms_attn_mla_args *a, ms_err *err);
int ms_cpu_dsa_index(ms_backend *be, const ms_dsa_index_args *a, ms_err *err);
int ms_cpu_dsa_recheck(ms_backend *be, const ms_dsa_cfg *cfg, const ms_dsa_cache *cache, const float *q,
                       const float *w, int64_t pos, int64_t fwd_len, int32_t *idx, int32_t *count, ms_err *err);
int ms_cpu_compress_append(ms_backend *be, const ms_compress_args *a, ms_err *err);
int ms_cpu_attn_compressed(ms_backend *be, const ms_cattn_args *a, ms_err *err);
/* Floats of thread-0 scratch ms_cpu_attn_compressed needs for windows of w keys and
 * n_entries compressed entries (its pointer and queue arrays come first, 8-byte aligned). */
static inline size_t ms_cpu_cattn_scratch(int64_t w, int64_t n_entries) {
    size_t k = (size_t)(w + n_entries + 2), e = (size_t)n_entries + 2;
    return 2 * k + 2 * e + k + e + e + 16; /* keys, queue, scores, index scores, selection */
}
void ms_cpu_route(ms_backend *be, const ms_route_args *a);
void ms_cpu_attn_res_mix(ms_backend *be, float *out, const float *blocks, int nb, int64_t block_stride,
                         const float *cur, int n, int64_t d, const float *norm, const float *proj, float eps);

#endif
