/* cmd_cachesim.c — `moonshine cachesim TRACE --slots N`: replay a recorded expert trace
 * (`--expert-trace FILE` on any engine command) through the cache policies. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "io/expert_trace.h"

int cmd_cachesim(int argc, char **argv) {
    const char *usage =
        "usage: moonshine cachesim TRACE --slots N [--policy lru|lfu-decay] [--no-prefetch] [--half-life H]\n"
        "                          [--skip-acquires A]\n";
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%sReplays the acquires, prefetches and releases that a streamed run recorded with\n"
               "--expert-trace TRACE through an expert cache of N slots, reads completing at once, and\n"
               "prints one JSON line per policy: hit rate (prefetched hits included), loads (misses +\n"
               "prefetches), prefetch issued / used / wasted / refused and precision (used / issued).\n"
               "Without --policy: lru and lfu-decay, each with and without the trace's prefetches.\n"
               "--skip-acquires A counts only after the first A acquire events (e.g. the prefill's).\n",
               usage);
        return 0;
    }
    int64_t slots = 0, skip = 0, hl = 64;
    const char *pol = ms_arg_str(argc, argv, "--policy");
    int no_pf = ms_arg_flag(argc, argv, "--no-prefetch");
    if (ms_arg_int(argc, argv, "--slots", 1, 1 << 24, &slots) || ms_arg_int(argc, argv, "--skip-acquires", 0, INT64_MAX, &skip) ||
        ms_arg_int(argc, argv, "--half-life", 1, 1 << 20, &hl))
        return 2;
    const char *path = ms_arg_pos(argc, argv, 0);
    if (!path || !slots || ms_arg_pos(argc, argv, 1) || ms_args_unknown(argc, argv, "cachesim")) {
        fputs(usage, stderr);
        return 2;
    }
    ms_err err = {0};
    struct { ms_cache_policy p; int no_pf; } runs[4];
    int n = 0;
    if (pol) {
        if (ms_cache_policy_parse(pol, &runs[0].p, &err)) {
            fprintf(stderr, "moonshine cachesim: %s\n", err.msg);
            return 2;
        }
        runs[0].no_pf = no_pf;
        n = 1;
    } else {
        ms_cache_policy ps[2] = {MS_CACHE_LRU, MS_CACHE_LFU_DECAY};
        for (int i = 0; i < 2; i++)
            for (int f = 1; f >= 0; f--)
                if (!(no_pf && !f)) runs[n].p = ps[i], runs[n++].no_pf = f;
    }
    for (int i = 0; i < n; i++) {
        ms_trace_replay_opts o = {.policy = runs[i].p, .n_slots = (int)slots, .no_prefetch = runs[i].no_pf,
                                  .half_life = (double)hl, .skip_acquires = skip};
        ms_trace_replay_result r;
        if (ms_expert_trace_replay(path, &o, &r, &err)) {
            fprintf(stderr, "moonshine cachesim: %s\n", err.msg);
            return 1;
        }
        const ms_ecache_stats *s = &r.st;
        printf("{\"trace\":\"%s\",\"policy\":\"%s\",\"prefetch\":%s,\"slots\":%lld,\"layers\":%d,\"experts\":%d,"
               "\"requests\":%llu,\"hit_rate\":%.4f,\"loads\":%llu,\"prefetch_issued\":%llu,\"prefetch_used\":%llu,"
               "\"prefetch_wasted\":%llu,\"prefetch_refused\":%llu,\"prefetch_precision\":%.4f}\n",
               path, ms_cache_policy_name(runs[i].p), runs[i].no_pf ? "false" : "true", (long long)slots, r.n_layers,
               r.n_experts, (unsigned long long)s->requests, s->requests ? (double)s->hits / (double)s->requests : 0.0,
               (unsigned long long)(s->misses + s->prefetch_issued), (unsigned long long)s->prefetch_issued,
               (unsigned long long)s->prefetch_used, (unsigned long long)s->prefetch_wasted,
               (unsigned long long)s->prefetch_refused,
               s->prefetch_issued ? (double)s->prefetch_used / (double)s->prefetch_issued : 0.0);
    }
    return 0;
}
