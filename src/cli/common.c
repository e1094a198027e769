#include "cli/common.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"

double ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int ms_cli_engine_args(int argc, char **argv, int *threads, int *ctx) {
    int64_t t = 0, c = 0;
    if (ms_arg_int(argc, argv, "--threads", 0, 1024, &t) || ms_arg_int(argc, argv, "--ctx", 0, 1 << 24, &c)) return -1;
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
