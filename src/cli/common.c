#include "cli/common.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/backend_cpu.h"
#include "cli/args.h"
#include "engine/plan.h"
#ifdef MS_WITH_GPU
#include "backend/gpu/backend_gpu.h"
#endif

double ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int64_t g_memory_mib = -1;
static ms_static_load g_static_load = MS_STATIC_MMAP;
static ms_mla_form g_mla_form = MS_MLA_AUTO;
static int g_static_defer;
static const char *g_backend = "cpu"; /* --backend (ms_cli_engine_args makes "auto" the default) */

void ms_cli_defer_static_load(void) { g_static_defer = 1; }

int ms_cli_static_load(const char *cmd, ms_cli_ctx *x) {
    if (x->static_load != MS_STATIC_READ) return 0;
    ms_err err = {0};
    if (ms_model_static_read(&x->model, &err)) {
        fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

/* streaming options parsed by ms_cli_engine_args, applied by ms_cli_open */
static struct {
    int on;
    ms_streaming_opts o;
} g_stream;

static int stream_args(int argc, char **argv) {
    int64_t mib = -1, qd = 0;
    const char *io = ms_arg_str(argc, argv, "--io"), *store = ms_arg_str(argc, argv, "--store");
    const char *pol = ms_arg_str(argc, argv, "--cache-policy"), *trace = ms_arg_str(argc, argv, "--expert-trace");
    int no_pf = ms_arg_flag(argc, argv, "--no-prefetch");
    if (ms_arg_int(argc, argv, "--expert-cache-mib", 0, INT64_C(1) << 32, &mib) ||
        ms_arg_int(argc, argv, "--queue-depth", 0, 256, &qd))
        return -1;
    memset(&g_stream, 0, sizeof g_stream);
    ms_err err = {0};
    if ((io && ms_io_mode_parse(io, &g_stream.o.io, &err)) || (pol && ms_cache_policy_parse(pol, &g_stream.o.policy, &err))) {
        fprintf(stderr, "moonshine: %s\n", err.msg);
        return -1;
    }
    g_stream.on = mib >= 0 || io || store || pol || trace || no_pf;
    g_stream.o.trace_path = trace;
    g_stream.o.no_prefetch = no_pf;
    g_stream.o.cache_mib = mib > 0 ? mib : 0;
    g_stream.o.store_dir = store;
    g_stream.o.queue_depth = (int)qd;
    return 0;
}

int ms_cli_engine_args(int argc, char **argv, int *threads, int *ctx) {
    int64_t t = 0, c = 0;
    if (ms_arg_int(argc, argv, "--threads", 0, 1024, &t) || ms_arg_int(argc, argv, "--ctx", 0, 1 << 24, &c) ||
        ms_arg_int(argc, argv, "--memory-mib", 1, INT64_C(1) << 40, &g_memory_mib))
        return -1;
    const char *mf = ms_arg_str(argc, argv, "--mla-form");
    if (mf) {
        if (!strcmp(mf, "auto")) g_mla_form = MS_MLA_AUTO;
        else if (!strcmp(mf, "absorbed")) g_mla_form = MS_MLA_ABSORBED;
        else if (!strcmp(mf, "expanded")) g_mla_form = MS_MLA_EXPANDED;
        else {
            fprintf(stderr, "moonshine: --mla-form \"%s\": expected auto, absorbed or expanded\n", mf);
            return -1;
        }
    }
    const char *sl = ms_arg_str(argc, argv, "--static-load");
    ms_err serr = {0};
    if (sl && ms_static_load_parse(sl, &g_static_load, &serr)) {
        fprintf(stderr, "moonshine: --static-load: %s\n", serr.msg);
        return -1;
    }
    if (stream_args(argc, argv)) return -1;
    const char *bk = ms_arg_str(argc, argv, "--backend");
    g_backend = bk ? bk : "auto";
    if (strcmp(g_backend, "auto") && strcmp(g_backend, "cpu") && strcmp(g_backend, "cuda") && strcmp(g_backend, "hip")) {
        fprintf(stderr, "moonshine: --backend \"%s\": expected cpu, cuda, hip or auto\n", g_backend);
        return -1;
    }
    *threads = (int)t;
    *ctx = (int)c;
    return 0;
}

/* The backend --backend names, into x->backend (NULL: the engine's own CPU backend).
 * auto: the GPU backend when this build has one and a device is present, else the CPU. */
static int open_backend(const char *cmd, ms_cli_ctx *x) {
    x->backend = NULL;
    if (!strcmp(g_backend, "cpu")) return 0;
#ifdef MS_WITH_GPU
    int want = strcmp(g_backend, "auto") != 0;
    if (want && strcmp(g_backend, MS_GPU_KIND)) {
        fprintf(stderr, "moonshine %s: --backend %s: this build's GPU backend is %s\n", cmd, g_backend, MS_GPU_KIND);
        return 1;
    }
    if (!want && ms_backend_gpu_count() < 1) return 0;
    ms_err err = {0};
    if (ms_backend_gpu_create(0, &x->backend, &err)) {
        fprintf(stderr, "moonshine %s: --backend %s: %s\n", cmd, g_backend, err.msg);
        return 1;
    }
    fprintf(stderr, "moonshine %s: backend %s\n", cmd, x->backend->name);
    return 0;
#else
    if (!strcmp(g_backend, "auto")) return 0;
    fprintf(stderr, "moonshine %s: --backend %s: this build has no GPU backend (built without nvcc/hipcc)\n", cmd,
            g_backend);
    return 1;
#endif
}

int ms_cli_open(const char *cmd, const char *dir, int threads, int ctx, ms_cli_ctx *x) {
    memset(x, 0, sizeof *x);
    ms_err err = {0};
    double t0 = ms_now();
    if (ms_model_load(dir, &x->model, &err)) {
        fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
        return 1;
    }
    if (g_stream.on) {
        char why[1024];
        if (ms_streaming_experts_create(&x->model, &g_stream.o, &x->experts, why, sizeof why, &err)) {
            fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
            ms_model_free(&x->model);
            return 1;
        }
        fprintf(stderr, "moonshine %s: %s\n", cmd, why);
    }
    x->static_load = g_static_load;
    x->pool = ms_pool_create(threads);
    x->threads = ms_pool_size(x->pool);
    if (open_backend(cmd, x)) {
        ms_pool_destroy(x->pool);
        if (x->experts) x->experts->ops->destroy(x->experts);
        ms_model_free(&x->model);
        return 1;
    }
    ms_engine_opts o = {.max_ctx = ctx, .pool = x->pool, .experts = x->experts, .mla_form = g_mla_form,
                        .backend = x->backend};
    if (g_memory_mib > 0) { /* plan first; refuse what does not fit, before allocating */
        ms_plan p;
        int64_t cache = -1;
        if (x->experts) {
            ms_stream_stats ss;
            ms_streaming_stats(x->experts, &ss);
            cache = (int64_t)ss.slot_bytes * ss.n_slots; /* mapped lazily: nothing touched yet */
        }
        ms_plan_opts po = {.context = ctx > 0 ? ctx : 4096, .threads = x->threads, .expert_cache_bytes = cache,
                           .static_load = x->static_load};
        if (po.context > x->model.cfg.max_pos) po.context = (int)x->model.cfg.max_pos;
        if (ms_plan_make(&x->model, &po, &p, &err) || ms_plan_check(&p, (uint64_t)g_memory_mib << 20, &err)) {
            fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
            if (x->backend) x->backend->ops->destroy(x->backend);
            ms_pool_destroy(x->pool);
            if (x->experts) x->experts->ops->destroy(x->experts);
            ms_model_free(&x->model);
            return 1;
        }
    }
    if (!g_static_defer && ms_cli_static_load(cmd, x)) {
        if (x->backend) x->backend->ops->destroy(x->backend);
        ms_pool_destroy(x->pool);
        if (x->experts) x->experts->ops->destroy(x->experts);
        ms_model_free(&x->model);
        return 1;
    }
    if (ms_engine_create(&x->model, &o, &x->engine, &err)) {
        fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
        if (x->backend) x->backend->ops->destroy(x->backend);
        x->backend = NULL;
        ms_pool_destroy(x->pool);
        if (x->experts) x->experts->ops->destroy(x->experts);
        ms_model_free(&x->model);
        return 1;
    }
    x->load_seconds = ms_now() - t0;
    return 0;
}

void ms_cli_print_stream_stats(const ms_cli_ctx *x) {
    if (!x->experts) return;
    ms_stream_stats s;
    ms_streaming_stats(x->experts, &s);
    const ms_engine_stats *es = ms_engine_get_stats(x->engine);
    fprintf(stderr,
            "experts: %llu acquired, hit rate %.3f, %.1f MiB read (%.2f GB/s while busy), waited %.3f s; prefetch "
            "%llu issued, %llu used; lookahead %llu/%llu right\n",
            (unsigned long long)s.acquires, s.acquires ? (double)s.hits / (double)s.acquires : 0.0,
            s.bytes_read / 1048576.0, s.busy_s > 0 ? s.bytes_read / s.busy_s / 1e9 : 0.0, s.wait_s,
            (unsigned long long)s.prefetch_issued, (unsigned long long)s.prefetch_used,
            (unsigned long long)es->lookahead_correct, (unsigned long long)es->lookahead_predicted);
}

void ms_cli_close(ms_cli_ctx *x) {
    if (x->engine) ms_cli_print_stream_stats(x);
    ms_engine_destroy(x->engine);
    if (x->backend) x->backend->ops->destroy(x->backend);
    if (x->experts) x->experts->ops->destroy(x->experts);
    ms_pool_destroy(x->pool);
    ms_model_free(&x->model);
}
