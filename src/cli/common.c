#include "cli/common.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "engine/plan.h"

double ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int64_t g_memory_mib = -1;

int ms_cli_engine_args(int argc, char **argv, int *threads, int *ctx) {
    int64_t t = 0, c = 0;
    if (ms_arg_int(argc, argv, "--threads", 0, 1024, &t) || ms_arg_int(argc, argv, "--ctx", 0, 1 << 24, &c) ||
        ms_arg_int(argc, argv, "--memory-mib", 1, INT64_C(1) << 40, &g_memory_mib))
        return -1;
    *threads = (int)t;
    *ctx = (int)c;
    return 0;
}

int ms_cli_open(const char *cmd, const char *dir, int threads, int ctx, ms_cli_ctx *x) {
    memset(x, 0, sizeof *x);
    ms_err err = {0};
    double t0 = ms_now();
    if (ms_model_load(dir, &x->model, &err)) {
        fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
        return 1;
    }
    x->pool = ms_pool_create(threads);
    x->threads = ms_pool_size(x->pool);
    ms_engine_opts o = {.max_ctx = ctx, .pool = x->pool};
    if (g_memory_mib > 0) { /* plan first; refuse what does not fit, before allocating */
        ms_plan p;
        ms_plan_opts po = {.context = ctx > 0 ? ctx : 4096, .threads = x->threads, .expert_cache_bytes = -1};
        if (po.context > x->model.cfg.max_pos) po.context = (int)x->model.cfg.max_pos;
        if (ms_plan_make(&x->model, &po, &p, &err) || ms_plan_check(&p, (uint64_t)g_memory_mib << 20, &err)) {
            fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
            ms_pool_destroy(x->pool);
            ms_model_free(&x->model);
            return 1;
        }
    }
    if (ms_engine_create(&x->model, &o, &x->engine, &err)) {
        fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
        ms_pool_destroy(x->pool);
        ms_model_free(&x->model);
        return 1;
    }
    x->load_seconds = ms_now() - t0;
    return 0;
}

void ms_cli_close(ms_cli_ctx *x) {
    ms_engine_destroy(x->engine);
    ms_pool_destroy(x->pool);
    ms_model_free(&x->model);
}
