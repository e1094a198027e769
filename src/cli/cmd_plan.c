/* cmd_plan.c — `moonshine plan MODEL_DIR --memory-mib M --context N`: the
 * memory ledger, and whether it fits. */
#include <stdio.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/plan.h"

int cmd_plan(int argc, char **argv) {
    const char *usage = "usage: moonshine plan MODEL_DIR --memory-mib M [--context N] [--expert-cache-mib C] [--threads T] [--slots S] [--static-load mmap|read] [--static-dtype stored|q8|fp8] [--json]\n";
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%sPrints the memory ledger (static tier, expert cache, causal state, workspace, staging)\n"
               "for serving MODEL_DIR with N tokens of context (default 4096) and exits 1 when it does\n"
               "not fit in M MiB. Without --expert-cache-mib every routed expert is resident.\n"
               "--slots S counts S sequences served at once (each its own causal state and workspace) and\n"
               "prints max_slots, the most that fit.\n", usage);
        return 0;
    }
    int64_t mem = -1, ctx = 4096, cache = -1, threads = 1, slots = 1;
    if (ms_arg_int(argc, argv, "--memory-mib", 1, INT64_C(1) << 40, &mem) ||
        ms_arg_int(argc, argv, "--context", 1, 1 << 28, &ctx) ||
        ms_arg_int(argc, argv, "--expert-cache-mib", 0, INT64_C(1) << 40, &cache) ||
        ms_arg_int(argc, argv, "--threads", 1, 1024, &threads) || ms_arg_int(argc, argv, "--slots", 1, 4096, &slots))
        return 2;
    int json = ms_arg_flag(argc, argv, "--json");
    const char *sl = ms_arg_str(argc, argv, "--static-load");
    ms_static_load sload = MS_STATIC_MMAP;
    ms_err serr = {0};
    if (sl && ms_static_load_parse(sl, &sload, &serr)) {
        fprintf(stderr, "moonshine plan: --static-load: %s\n", serr.msg);
        return 2;
    }
    const char *sd = ms_arg_str(argc, argv, "--static-dtype");
    ms_static_dtype sdt = MS_STATIC_STORED;
    if (sd && ms_static_dtype_parse(sd, &sdt, &serr)) {
        fprintf(stderr, "moonshine plan: --static-dtype: %s\n", serr.msg);
        return 2;
    }
    const char *dir = ms_arg_pos(argc, argv, 0);
    if (!dir || mem < 0 || ms_args_unknown(argc, argv, "plan")) {
        fputs(usage, stderr);
        return 2;
    }
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(dir, &m, &err)) {
        fprintf(stderr, "moonshine plan: %s\n", err.msg);
        return 1;
    }
    ms_plan_opts o = {.context = (int)ctx, .threads = (int)threads,
                      .expert_cache_bytes = cache < 0 ? -1 : cache << 20, .staging_bytes = 0,
                      .static_load = sload, .slots = (int)slots, .static_dtype = sdt};
    ms_plan p;
    int rc = ms_plan_make(&m, &o, &p, &err);
    if (rc) {
        fprintf(stderr, "moonshine plan: %s\n", err.msg);
        ms_model_free(&m);
        return 1;
    }
    int fits = ms_plan_check(&p, (uint64_t)mem << 20, &err) == MS_OK;
    char buf[1200];
    if (json) {
        ms_plan_json(&p, buf, sizeof buf);
        printf("{\"model\":\"%s\",\"memory_bytes\":%llu,\"fits\":%s,\"max_slots\":%d,\"plan\":%s}\n", dir,
               (unsigned long long)mem << 20, fits ? "true" : "false", ms_plan_max_slots(&m, &o, (uint64_t)mem << 20),
               buf);
    } else {
        ms_plan_format(&p, buf, sizeof buf);
        printf("%sbudget            %10.1f MiB  -> %s (at most %d slots fit)\n", buf, (double)mem,
               fits ? "fits" : "DOES NOT FIT", ms_plan_max_slots(&m, &o, (uint64_t)mem << 20));
    }
    ms_model_free(&m);
    return fits ? 0 : 1;
}
