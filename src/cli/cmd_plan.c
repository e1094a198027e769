/* cmd_plan.c — `moonshine plan MODEL_DIR --memory-mib M --context N`: the
 * memory ledger, and whether it fits; before a download too (config.json and
 * shard headers only: ms_model_load_meta), and --suggest. */
#include <stdio.h>
#include <string.h>

#include "util/fs.h"

#include "cli/args.h"
#include "cli/common.h"
#include "cli/commands.h"
#include "engine/plan.h"

int cmd_plan(int argc, char **argv) {
    const char *usage = "usage: moonshine plan MODEL_DIR --memory-mib M [--context N] [--expert-cache-mib C] [--device-expert-mib D] [--threads T] [--slots S] [--static-load mmap|read] [--static-dtype stored|q8|fp8] [--suggest] [--json]\n";
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%sPrints the memory ledger (static tier, expert cache, causal state, workspace, staging)\n"
               "for serving MODEL_DIR with N tokens of context (default 4096) and exits 1 when it does\n"
               "not fit in M MiB. Without --expert-cache-mib every routed expert is resident.\n"
               "--device-expert-mib D adds the device tier (the device slot arena, on a device backend): a line\n"
               "of its own, device memory, not in the host total; the expert cache line is then the host RAM tier\n"
               "between it and the drive (page-locked; with --suggest, the largest that fits M).\n"
               "--slots S counts S sequences served at once (each its own causal state and workspace) and\n"
               "prints max_slots, the most that fit.\n"
               "--static-dtype q8|fp8 counts the static tier requantized (run with the same flag).\n"
               "MODEL_DIR may hold config.json alone, or with model.safetensors.index.json and the shards'\n"
               "headers (a shard cut after its header is enough): the ledger is then computed from the\n"
               "headers (no payload is read) or from the config (BF16 except the routed experts in the\n"
               "config's quantization format), before downloading the weights.\n"
               "--suggest proposes, for M MiB, the context (with --context: that one; else the largest power\n"
               "of two up to max_position_embeddings whose causal state and workspace take at most a quarter\n"
               "of what the static tier and overhead leave) and the largest expert cache that fit with it,\n"
               "and prints that plan's ledger (the flags to run it with on the last line).\n", usage);
        return 0;
    }
    int64_t mem = -1, ctx = 4096, cache = -1, threads = 1, slots = 1, dmib = 0;
    if (ms_arg_int(argc, argv, "--memory-mib", 1, INT64_C(1) << 40, &mem) ||
        ms_arg_int(argc, argv, "--device-expert-mib", 0, INT64_C(1) << 40, &dmib) ||
        ms_arg_int(argc, argv, "--context", 1, 1 << 28, &ctx) ||
        ms_arg_int(argc, argv, "--expert-cache-mib", 0, INT64_C(1) << 40, &cache) ||
        ms_arg_int(argc, argv, "--threads", 1, 1024, &threads) || ms_arg_int(argc, argv, "--slots", 1, 4096, &slots))
        return 2;
    int json = ms_arg_flag(argc, argv, "--json");
    int suggest = ms_arg_flag(argc, argv, "--suggest"), ctx_given = ms_arg_str(argc, argv, "--context") != NULL;
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
    const char *dir = ms_cli_model_arg("plan", ms_arg_pos(argc, argv, 0));
    if (!dir || mem < 0 || ms_args_unknown(argc, argv, "plan")) {
        fputs(usage, stderr);
        return 2;
    }
    ms_model m;
    ms_err err = {0}, ferr = {0};
    ms_model_source src = MS_SOURCE_FULL;
    char idx[4096], single[4096];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    snprintf(single, sizeof single, "%s/model.safetensors", dir);
    int have_weights = ms_file_exists(idx) || ms_file_exists(single);
    if (!have_weights || ms_model_load(dir, &m, &ferr)) {
        if (ms_model_load_meta(dir, &m, &src, &err)) {
            fprintf(stderr, "moonshine plan: %s\n", have_weights ? ferr.msg : err.msg);
            return 1;
        }
        fprintf(stderr, "moonshine plan: %s%s%s\n",
                src == MS_SOURCE_HEADERS ? "from the shard headers (no payload read)"
                                         : "from config.json alone (dtypes assumed: BF16, routed experts in the "
                                           "config's quantization format)",
                have_weights ? "; the full checkpoint did not open: " : "", have_weights ? ferr.msg : "");
    }
    ms_plan_opts o = {.context = (int)ctx, .threads = (int)threads,
                      .expert_cache_bytes = cache < 0 ? -1 : cache << 20, .staging_bytes = 0,
                      .static_load = sload, .slots = (int)slots, .static_dtype = sdt,
                      .device_expert_bytes = (uint64_t)dmib << 20};
    if (o.context > m.cfg.max_pos && suggest && !ctx_given) o.context = (int)m.cfg.max_pos;
    ms_plan p;
    if (suggest) { /* the context, then the largest expert cache that fits with it */
        uint64_t budget = (uint64_t)mem << 20;
        ms_plan_opts q = o;
        q.expert_cache_bytes = 0;
        if (!ctx_given) {
            int64_t best = 0;
            for (int64_t c = 1024; c <= m.cfg.max_pos && c <= (1 << 24); c *= 2) {
                q.context = (int)c;
                if (ms_plan_make(&m, &q, &p, &err)) break;
                uint64_t fixed = p.static_bytes + p.overhead_bytes;
                if (fixed > budget || (p.state_bytes + p.workspace_bytes) * 4 > budget - fixed) break;
                best = c;
            }
            if (!best) best = 1024 <= m.cfg.max_pos ? 1024 : m.cfg.max_pos;
            o.context = (int)best;
            q.context = (int)best;
        }
        if (ms_plan_make(&m, &q, &p, &err)) {
            fprintf(stderr, "moonshine plan: %s\n", err.msg);
            ms_model_free(&m);
            return 1;
        }
        uint64_t others = p.total - p.expert_bytes;
        uint64_t room = budget > others ? budget - others : 0;
        room &= ~((1ull << 20) - 1);
        o.expert_cache_bytes = room >= m.expert_bytes ? -1 : (int64_t)room;
    }
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
        printf("{\"model\":\"%s\",\"source\":\"%s\",\"memory_bytes\":%llu,\"fits\":%s,\"max_slots\":%d,\"plan\":%s}\n",
               dir, src == MS_SOURCE_FULL ? "checkpoint" : src == MS_SOURCE_HEADERS ? "headers" : "config",
               (unsigned long long)mem << 20, fits ? "true" : "false", ms_plan_max_slots(&m, &o, (uint64_t)mem << 20),
               buf);
    } else {
        ms_plan_format(&p, buf, sizeof buf);
        printf("%sbudget            %10.1f MiB  -> %s (at most %d slots fit)\n", buf, (double)mem,
               fits ? "fits" : "DOES NOT FIT", ms_plan_max_slots(&m, &o, (uint64_t)mem << 20));
        if (suggest) {
            char ec[64] = "(experts resident)", dv[48] = "";
            if (o.expert_cache_bytes >= 0)
                snprintf(ec, sizeof ec, "--expert-cache-mib %lld", (long long)(o.expert_cache_bytes >> 20));
            if (dmib) snprintf(dv, sizeof dv, " --device-expert-mib %lld", (long long)dmib);
            printf("suggest           --ctx %d %s%s --static-dtype %s  (expert cache %.1f%% of the routed experts)\n",
                   o.context, ec, dv, ms_static_dtype_name(sdt),
                   m.expert_bytes ? 100.0 * (double)p.expert_bytes / (double)m.expert_bytes : 100.0);
        }
    }
    ms_model_free(&m);
    return fits ? 0 : 1;
}
