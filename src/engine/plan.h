/* plan.h — the memory plan: every byte the process will hold, decided before
 * anything large is allocated. The engine refuses a configuration whose plan
 * exceeds the budget, printing this ledger instead of half-loading. */
#ifndef MS_PLAN_H
#define MS_PLAN_H

#include <stdint.h>

#include "engine/engine.h"

typedef struct ms_plan_opts {
    int context;                /* tokens of causal state */
    int max_batch;              /* prefill chunk */
    int threads;
    int64_t expert_cache_bytes; /* < 0: every routed expert resident (mapped) */
    uint64_t staging_bytes;     /* I/O staging buffers of a streaming expert source */
    ms_static_load static_load; /* READ: the static line is the page-rounded copy (ms_model_static_read_bytes) */
    ms_static_dtype static_dtype; /* the static tier's matrices in this dtype (ms_model_static_bytes_as) */
    int slots;                  /* engines serving requests at once (session/slots.h), each with its own causal
                                 * state and workspace; 0 counts as 1 */
    uint64_t device_expert_bytes; /* the device tier (--device-expert-mib: the device slot arena over the host
                                 * cache): device memory, shown in the ledger, not in the host total */
} ms_plan_opts;

typedef struct ms_plan {
    uint64_t static_bytes;      /* attention, norms, routers, shared experts, embeddings, head */
    uint64_t expert_bytes;      /* routed experts held in host RAM: all (resident) or the host tier's budget
                                 * (the streaming cache between the device tier and the drive) */
    uint64_t device_expert_bytes; /* ms_plan_opts.device_expert_bytes (not in total) */
    uint64_t experts_total;     /* all routed experts in the checkpoint */
    uint64_t state_bytes;       /* causal state for `context` tokens, times slots */
    uint64_t state_per_token;
    uint64_t workspace_bytes;   /* activations and scratch, times slots */
    uint64_t staging_bytes;
    uint64_t overhead_bytes;    /* runtime, allocator, tables: fixed allowance */
    uint64_t total;
    int context, resident;
    int slots;
    ms_static_dtype static_dtype;
} ms_plan;

/* Fixed allowance for what the ledger does not itemize (code, libc, tables). */
#define MS_PLAN_OVERHEAD (64ull << 20)

int ms_plan_make(const ms_model *m, const ms_plan_opts *o, ms_plan *p, ms_err *err);
/* MS_OK when p->total <= budget_bytes, else MS_ERR_NOMEM with the ledger in the message. */
int ms_plan_check(const ms_plan *p, uint64_t budget_bytes, ms_err *err);
/* The most slots (o->slots ignored) whose plan fits budget_bytes: 0 when not even one does
 * (or o is refused by ms_plan_make). */
int ms_plan_max_slots(const ms_model *m, const ms_plan_opts *o, uint64_t budget_bytes);
/* The ledger as text lines ("static tier   1234.5 MiB ..."). */
void ms_plan_format(const ms_plan *p, char *buf, size_t cap);
/* The ledger as one JSON object. */
void ms_plan_json(const ms_plan *p, char *buf, size_t cap);

#endif
