/* moonshine_gpu.c — `build/gpu/moonshine`: the moonshine command with a --gpu flag (built by
 * `make gpu`). --gpu [--gpu-budget-mib M] installs the GPU matmul offload (backend/gpu/gpu.h
 * ms_gpu_offload_enable) before the command runs: products of up to 8 tokens (decode) run
 * on GPU 0 with the weights resident there; the rest of the forward stays on the CPU. One
 * line of offload statistics goes to stderr at exit. Without --gpu it is plain moonshine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gpu.h"
#include "cli/commands.h"

static const struct { const char *name; ms_cmd_fn fn; } k_cmds[] = {
#define MS_ENTRY(name, help) {#name, cmd_##name},
    MS_COMMAND_LIST(MS_ENTRY)
#undef MS_ENTRY
};

int main(int argc, char **argv) {
    int gpu = 0;
    long long budget_mib = 0;
    int m = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--gpu")) {
            gpu = 1;
            continue;
        }
        if (!strcmp(argv[i], "--gpu-budget-mib") && i + 1 < argc) {
            budget_mib = atoll(argv[++i]);
            continue;
        }
        argv[m++] = argv[i];
    }
    argc = m;
    if (argc < 2) {
        fprintf(stderr, "usage: moonshine COMMAND [ARGS] [--gpu [--gpu-budget-mib M]]\n");
        return 2;
    }
    for (int i = 1; i < argc; i++)
        if (gpu && (!strcmp(argv[i], "--expert-cache-mib") || !strcmp(argv[i], "--store") || !strcmp(argv[i], "--io"))) {
            fprintf(stderr, "moonshine: --gpu keeps weights by their host address; it cannot run with streamed experts (%s)\n",
                    argv[i]);
            return 2;
        }
    ms_gpu *g = NULL;
    ms_err err = {0};
    if (gpu) {
        ms_gpu_info info;
        if (ms_gpu_open(0, &g, &err) || ms_gpu_info_get(g, &info, &err)) {
            fprintf(stderr, "moonshine: --gpu: %s\n", err.msg);
            return 1;
        }
        size_t budget = budget_mib > 0 ? (size_t)budget_mib << 20 : info.mem_free / 10 * 9;
        if (ms_gpu_offload_enable(g, budget, &err)) {
            fprintf(stderr, "moonshine: --gpu: %s\n", err.msg);
            return 1;
        }
    }
    int rc = -1;
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) {
            rc = k_cmds[i].fn(argc - 1, argv + 1);
            break;
        }
    if (rc < 0) {
        fprintf(stderr, "moonshine: unknown command \"%s\"\n", argv[1]);
        rc = 2;
    }
    if (gpu) {
        uint64_t mm = 0, dec = 0, res = 0;
        ms_gpu_offload_stats(&mm, &dec, &res);
        fprintf(stderr, "{\"gpu_offload\":{\"matmuls\":%llu,\"declined\":%llu,\"resident_mib\":%.1f}}\n",
                (unsigned long long)mm, (unsigned long long)dec, res / 1048576.0);
        ms_gpu_offload_disable();
        ms_gpu_close(g);
    }
    return rc;
}
