/* gpu.c — `--gpu [--gpu-budget-mib M]` on every command, in the GPU build of moonshine
 * (main.c with MS_WITH_GPU; the Makefile compiles this file only then, with the GPU backend).
 * --gpu installs the GPU matmul offload (backend/gpu/gpu.h ms_gpu_offload_enable) before the
 * command runs: products of up to 8 tokens (decode) run on GPU 0 with the weights resident
 * there; the rest of the forward stays on the CPU. One line of offload statistics goes to
 * stderr at exit. Without --gpu it is plain moonshine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/gpu/gpu.h"

int ms_cli_gpu_main(int argc, char **argv, int (*run)(int argc, char **argv)) {
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
    argv[argc] = NULL;
    if (!gpu) return run(argc, argv);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--expert-cache-mib") || !strcmp(argv[i], "--store") || !strcmp(argv[i], "--io")) {
            fprintf(stderr, "moonshine: --gpu keeps weights by their host address; it cannot run with streamed experts (%s)\n",
                    argv[i]);
            return 2;
        }
    ms_gpu *g = NULL;
    ms_err err = {0};
    ms_gpu_info info;
    if (ms_gpu_open(0, &g, &err) || ms_gpu_info_get(g, &info, &err)) {
        fprintf(stderr, "moonshine: --gpu: %s\n", err.msg);
        return 1;
    }
    size_t budget = budget_mib > 0 ? (size_t)budget_mib << 20 : info.mem_free / 10 * 9;
    if (ms_gpu_offload_enable(g, budget, &err)) {
        fprintf(stderr, "moonshine: --gpu: %s\n", err.msg);
        ms_gpu_close(g);
        return 1;
    }
    int rc = run(argc, argv);
    uint64_t mm = 0, dec = 0, res = 0;
    ms_gpu_offload_stats(&mm, &dec, &res);
    fprintf(stderr, "{\"gpu_offload\":{\"matmuls\":%llu,\"declined\":%llu,\"resident_mib\":%.1f}}\n",
            (unsigned long long)mm, (unsigned long long)dec, res / 1048576.0);
    ms_gpu_offload_disable();
    ms_gpu_close(g);
    return rc;
}
