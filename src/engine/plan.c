#include "engine/plan.h"

#include <stdio.h>
#include <string.h>

int ms_plan_make(const ms_model *m, const ms_plan_opts *o, ms_plan *p, ms_err *err) {
    memset(p, 0, sizeof *p);
    if (o->context < 1) return ms_fail(err, MS_ERR_ARG, "plan: context must be at least 1 token");
    if (o->context > m->cfg.max_pos)
        return ms_fail(err, MS_ERR_ARG, "plan: context %d exceeds the model's max_position_embeddings %lld", o->context,
                       (long long)m->cfg.max_pos);
    p->static_bytes = ms_model_static_bytes_as(m, o->static_dtype);
    if (o->static_load == MS_STATIC_READ && m->ck.n_files > 0) {
        /* the page-rounded copy of what stays stored, plus the requantized copies */
        uint64_t rd = ms_model_static_read_bytes(m), saved = m->static_bytes - p->static_bytes;
        p->static_bytes = (rd > saved ? rd - saved : 0) + m->static_requant_bytes;
    }
    p->static_dtype = m->static_dtype != MS_STATIC_STORED ? (ms_static_dtype)m->static_dtype : o->static_dtype;
    p->experts_total = m->expert_bytes;
    p->resident = o->expert_cache_bytes < 0 || (uint64_t)o->expert_cache_bytes >= m->expert_bytes;
    p->expert_bytes = p->resident ? m->expert_bytes : (uint64_t)o->expert_cache_bytes;
    ms_engine_opts eo = {.max_ctx = o->context, .max_batch = o->max_batch};
    ms_engine_plan_bytes(m, &eo, o->threads, &p->state_bytes, &p->workspace_bytes);
    p->slots = o->slots > 1 ? o->slots : 1;
    p->state_bytes *= (uint64_t)p->slots;
    p->workspace_bytes *= (uint64_t)p->slots;
    p->state_per_token = ms_engine_state_bytes_per_token(m);
    p->staging_bytes = p->resident ? 0 : o->staging_bytes;
    p->overhead_bytes = MS_PLAN_OVERHEAD;
    p->device_expert_bytes = o->device_expert_bytes;
    p->context = o->context;
    p->total = p->static_bytes + p->expert_bytes + p->state_bytes + p->workspace_bytes + p->staging_bytes +
               p->overhead_bytes;
    return MS_OK;
}

int ms_plan_max_slots(const ms_model *m, const ms_plan_opts *o, uint64_t budget) {
    ms_plan_opts q = *o;
    ms_plan p;
    ms_err err = {0};
    q.slots = 1;
    if (ms_plan_make(m, &q, &p, &err) || p.total > budget) return 0;
    uint64_t per = p.state_bytes + p.workspace_bytes, fixed = p.total - per;
    uint64_t n = per ? (budget - fixed) / per : 4096;
    return n > 4096 ? 4096 : (int)n;
}

static double mib(uint64_t b) { return (double)b / 1048576.0; }

void ms_plan_format(const ms_plan *p, char *buf, size_t cap) {
    char dev[160] = "";
    if (p->device_expert_bytes)
        snprintf(dev, sizeof dev, "device experts    %10.1f MiB  (device tier: slot arena in device memory, not in the "
                                  "host total)\n", mib(p->device_expert_bytes));
    snprintf(buf, cap,
             "static tier       %10.1f MiB  (attention, norms, routers, shared experts, embeddings, head; %s)\n"
             "%s"
             "expert cache      %10.1f MiB  (%s; routed experts total %.1f MiB)\n"
             "causal state      %10.1f MiB  (%d tokens x %.1f KiB x %d slot%s)\n"
             "workspace         %10.1f MiB  (activations and scratch)\n"
             "staging           %10.1f MiB  (expert reads)\n"
             "overhead          %10.1f MiB  (runtime allowance)\n"
             "total             %10.1f MiB\n",
             mib(p->static_bytes), p->static_dtype == MS_STATIC_STORED ? "stored dtype" : p->static_dtype == MS_STATIC_Q8 ? "matrices Q8" : "matrices FP8", dev, mib(p->expert_bytes),
             p->resident ? "all resident" : p->device_expert_bytes ? "host RAM tier, page-locked, over the drive" : "bounded cache",
             mib(p->experts_total), mib(p->state_bytes), p->context, (double)p->state_per_token / 1024.0, p->slots,
             p->slots == 1 ? "" : "s",
             mib(p->workspace_bytes), mib(p->staging_bytes), mib(p->overhead_bytes), mib(p->total));
}

void ms_plan_json(const ms_plan *p, char *buf, size_t cap) {
    snprintf(buf, cap,
             "{\"static_bytes\":%llu,\"expert_cache_bytes\":%llu,\"experts_total_bytes\":%llu,\"experts_resident\":%s,"
             "\"state_bytes\":%llu,\"state_bytes_per_token\":%llu,\"context\":%d,\"workspace_bytes\":%llu,"
             "\"staging_bytes\":%llu,\"overhead_bytes\":%llu,\"total_bytes\":%llu,\"slots\":%d,\"static_dtype\":\"%s\","
             "\"device_expert_bytes\":%llu}",
             (unsigned long long)p->static_bytes, (unsigned long long)p->expert_bytes,
             (unsigned long long)p->experts_total, p->resident ? "true" : "false", (unsigned long long)p->state_bytes,
             (unsigned long long)p->state_per_token, p->context, (unsigned long long)p->workspace_bytes,
             (unsigned long long)p->staging_bytes, (unsigned long long)p->overhead_bytes,
             (unsigned long long)p->total, p->slots, ms_static_dtype_name(p->static_dtype),
             (unsigned long long)p->device_expert_bytes);
}

int ms_plan_check(const ms_plan *p, uint64_t budget, ms_err *err) {
    if (p->total <= budget) return MS_OK;
    char ledger[1100];
    ms_plan_format(p, ledger, sizeof ledger);
    return ms_fail(err, MS_ERR_NOMEM, "the plan needs %.1f MiB but the budget is %.1f MiB:\n%s", mib(p->total),
                   mib(budget), ledger);
}
