#include "cli/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/cpu.h"
#include "cli/args.h"
#include "engine/device_experts.h"
#include "engine/plan.h"
#include "cli/progress.h"
#include "core/comm.h"
#include "util/hf_cache.h"
#ifdef MS_WITH_GPU
#include "backend/gpu/backend_gpu.h"
#include "backend/gpu/backend_gpu_comm.h"
#endif

const char *ms_cli_model_arg(const char *cmd, const char *arg) {
    if (!arg) return NULL;
    ms_hf_env env = {.hf_hub_cache = getenv("HF_HUB_CACHE"), .hf_home = getenv("HF_HOME"),
                     .xdg_cache_home = getenv("XDG_CACHE_HOME"), .home = getenv("HOME")};
    char buf[4096];
    ms_err err = {0};
    if (ms_hf_resolve(arg, &env, buf, sizeof buf, &err)) {
        fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
        exit(1);
    }
    if (!strcmp(buf, arg)) return arg;
    char *r = strdup(buf); /* lives as long as the process, like argv */
    if (!r) {
        fprintf(stderr, "moonshine %s: out of memory\n", cmd);
        exit(1);
    }
    return r;
}

double ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void ms_cli_opts_init(ms_cli_opts *o) {
    memset(o, 0, sizeof *o);
    o->memory_mib = -1;
    o->static_load = MS_STATIC_MMAP;
    o->mla_form = MS_MLA_AUTO;
    o->cpu_act = ms_cpu_act_default(ms_cpu_isa_active());
    o->backend = "auto";
    o->device_expert_mib = -1;
    o->experts_on = MS_EXPERTS_ON_GPU;
    o->cpu_moe_layers = -1;
}

int ms_cli_static_load(const char *cmd, ms_cli_ctx *x) {
    if (x->static_load != MS_STATIC_READ) return 0;
    ms_err err = {0};
    ms_cli_progress cp;
    ms_cli_progress_init(&cp);
    int rc = ms_model_static_read_progress(&x->model, &cp.p, &err);
    ms_cli_progress_end(&cp);
    if (rc) {
        fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

static int stream_args(int argc, char **argv, ms_cli_opts *o) {
    int64_t mib = -1, qd = 0, dmib = -1;
    const char *io = ms_arg_str(argc, argv, "--io"), *store = ms_arg_str(argc, argv, "--store");
    const char *pol = ms_arg_str(argc, argv, "--cache-policy"), *trace = ms_arg_str(argc, argv, "--expert-trace");
    int no_pf = ms_arg_flag(argc, argv, "--no-prefetch");
    if (ms_arg_int(argc, argv, "--expert-cache-mib", 0, INT64_C(1) << 32, &mib) ||
        ms_arg_int(argc, argv, "--queue-depth", 0, 256, &qd) ||
        ms_arg_int(argc, argv, "--device-expert-mib", 0, INT64_C(1) << 32, &dmib))
        return -1;
    o->device_expert_mib = dmib;
    memset(&o->stream_opts, 0, sizeof o->stream_opts);
    ms_streaming_opts *so = &o->stream_opts;
    ms_err err = {0};
    if ((io && ms_io_mode_parse(io, &so->io, &err)) || (pol && ms_cache_policy_parse(pol, &so->policy, &err))) {
        fprintf(stderr, "moonshine: %s\n", err.msg);
        return -1;
    }
    o->stream = mib >= 0 || io || store || pol || trace || no_pf || dmib >= 0;
    o->host_cache_given = mib >= 0 || store;
    so->trace_path = trace;
    so->no_prefetch = no_pf;
    so->cache_mib = mib > 0 ? mib : 0;
    so->store_dir = store;
    so->queue_depth = (int)qd;
    /* MS_IO_CHUNK_KIB=N: the reader's piece size (an A/B switch of the streamed reads; default 2048) */
    const char *ck = getenv("MS_IO_CHUNK_KIB");
    if (ck && atoi(ck) >= 4) so->chunk_bytes = (uint64_t)(atoi(ck) / 4) * 4096;
    return 0;
}

int ms_cli_engine_args(int argc, char **argv, ms_cli_opts *o) {
    ms_cli_opts_init(o);
    int64_t t = 0, c = 0, pc = 0;
    if (ms_arg_int(argc, argv, "--threads", 0, 1024, &t) || ms_arg_int(argc, argv, "--ctx", 0, 1 << 24, &c) ||
        ms_arg_int(argc, argv, "--prefill-chunk", 1, 1 << 16, &pc) ||
        ms_arg_int(argc, argv, "--memory-mib", 1, INT64_C(1) << 40, &o->memory_mib))
        return -1;
    const char *mf = ms_arg_str(argc, argv, "--mla-form");
    if (mf) {
        if (!strcmp(mf, "auto")) o->mla_form = MS_MLA_AUTO;
        else if (!strcmp(mf, "absorbed")) o->mla_form = MS_MLA_ABSORBED;
        else if (!strcmp(mf, "expanded")) o->mla_form = MS_MLA_EXPANDED;
        else {
            fprintf(stderr, "moonshine: --mla-form \"%s\": expected auto, absorbed or expanded\n", mf);
            return -1;
        }
    }
    const char *sl = ms_arg_str(argc, argv, "--static-load");
    ms_err serr = {0};
    if (sl && ms_static_load_parse(sl, &o->static_load, &serr)) {
        fprintf(stderr, "moonshine: --static-load: %s\n", serr.msg);
        return -1;
    }
    const char *sd = ms_arg_str(argc, argv, "--static-dtype");
    if (sd && ms_static_dtype_parse(sd, &o->static_dtype, &serr)) {
        fprintf(stderr, "moonshine: --static-dtype: %s\n", serr.msg);
        return -1;
    }
    o->static_store = ms_arg_str(argc, argv, "--static-store");
    const char *ca = ms_arg_str(argc, argv, "--cpu-activations");
    if (ca) {
        int act = ms_cpu_act_parse(ca);
        if (act < 0) {
            fprintf(stderr, "moonshine: --cpu-activations \"%s\": expected f32, q8, bf16, q8+bf16, q16 or q16+bf16\n", ca);
            return -1;
        }
        o->cpu_act = act;
    }
    if (stream_args(argc, argv, o)) return -1;
    const char *xo = ms_arg_str(argc, argv, "--experts-on");
    if (xo && ms_experts_on_parse(xo, &o->experts_on, &serr)) {
        fprintf(stderr, "moonshine: %s\n", serr.msg);
        return -1;
    }
    o->experts_on_given = xo != NULL;
    int64_t cml = -1;
    if (ms_arg_int(argc, argv, "--cpu-moe-layers", 0, 1 << 20, &cml)) return -1;
    o->cpu_moe_layers = (int)cml;
    if (cml >= 0 && xo && o->experts_on != MS_EXPERTS_ON_CPU) {
        fprintf(stderr, "moonshine: --cpu-moe-layers goes with --experts-on cpu (or alone), not %s\n", xo);
        return -1;
    }
    const char *bk = ms_arg_str(argc, argv, "--backend");
    o->backend = bk ? bk : "auto";
    if (strcmp(o->backend, "auto") && strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda") &&
        strcmp(o->backend, "hip")) {
        fprintf(stderr, "moonshine: --backend \"%s\": expected cpu, cuda, hip or auto\n", o->backend);
        return -1;
    }
    o->gpus = ms_arg_str(argc, argv, "--gpus");
    const char *es = ms_arg_str(argc, argv, "--experts-split");
    int64_t rh = 0;
    if (ms_arg_int(argc, argv, "--replicate-hot", 0, 1 << 20, &rh)) return -1;
    o->replicate_hot = (int)rh;
    if (es && strcmp(es, "sharded") && strcmp(es, "layer")) {
        fprintf(stderr, "moonshine: --experts-split \"%s\": expected sharded or layer\n", es);
        return -1;
    }
    o->experts_split = es && !strcmp(es, "layer") ? MS_EXPERTS_WITH_LAYER : MS_EXPERTS_SHARDED;
    if (!o->gpus && (es || rh)) {
        fprintf(stderr, "moonshine: --experts-split and --replicate-hot need --gpus\n");
        return -1;
    }
    o->threads = (int)t;
    o->ctx = (int)c;
    o->prefill_chunk = (int)pc;
    return 0;
}

/* --gpus: a backend per entry of the device list and the comm over them (x->stage_bes,
 * x->comm; x->backend = the first). GPU backends on a GPU build, or CPU backends over the
 * pool with --backend cpu. */
static int open_stages(const char *cmd, const ms_cli_opts *eo, ms_cli_ctx *x) {
    ms_err err = {0};
    int n = ms_parse_device_list(eo->gpus, x->gpu_ids, MS_MAX_DEVICES, &err);
    if (n < 0) {
        fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
        return 1;
    }
    int cpu = eo->backend && !strcmp(eo->backend, "cpu");
#ifdef MS_WITH_GPU
    int have = ms_backend_gpu_count();
    if (!cpu && strcmp(eo->backend, "auto") && strcmp(eo->backend, MS_GPU_KIND)) {
        fprintf(stderr, "moonshine %s: --backend %s: this build's GPU backend is %s\n", cmd, eo->backend, MS_GPU_KIND);
        return 1;
    }
    if (!cpu && !strcmp(eo->backend, "auto") && have < 1) cpu = 1;
#else
    if (!cpu && strcmp(eo->backend, "auto")) {
        fprintf(stderr, "moonshine %s: --backend %s: this build has no GPU backend (built without nvcc/hipcc)\n", cmd,
                eo->backend);
        return 1;
    }
    cpu = 1;
#endif
    x->n_stages = n;
    for (int i = 0; i < n; i++) {
        int rc;
        if (cpu) {
            rc = ms_backend_cpu_create(x->pool, &x->stage_bes[i], &err);
        } else {
#ifdef MS_WITH_GPU
            if (x->gpu_ids[i] >= have) {
                fprintf(stderr, "moonshine %s: --gpus %s: there is no device %d (%d present)\n", cmd, eo->gpus,
                        x->gpu_ids[i], have);
                return 1;
            }
            rc = ms_backend_gpu_create(x->gpu_ids[i], &x->stage_bes[i], &err);
#else
            rc = MS_ERR_UNSUPPORTED;
#endif
        }
        if (rc) {
            fprintf(stderr, "moonshine %s: --gpus %s: device %d: %s\n", cmd, eo->gpus, x->gpu_ids[i], err.msg);
            return 1;
        }
    }
    int rc = MS_OK;
#ifdef MS_WITH_GPU
    if (!cpu) rc = ms_comm_gpu_create(x->stage_bes, x->gpu_ids, n, &x->comm, &err);
    else
#endif
        rc = ms_comm_host_create(x->stage_bes, n, &x->comm, &err);
    if (rc) {
        fprintf(stderr, "moonshine %s: --gpus %s: %s\n", cmd, eo->gpus, err.msg);
        return 1;
    }
    x->backend = x->stage_bes[0];
    fprintf(stderr, "moonshine %s: %d stage%s on %s backends (--gpus %s)\n", cmd, n, n == 1 ? "" : "s", x->backend->name,
            eo->gpus);
    return 0;
}

/* --gpus: the placement over the stages' devices (budgets: each device's free memory shared
 * by the list's entries on it, at most --memory-mib each), refused before the engine
 * allocates; the ledger to stderr; the engine's stages into x->stages. */
static int place_stages(const char *cmd, const ms_cli_opts *eo, int ctx, ms_cli_ctx *x) {
    ms_err err = {0};
    int n = x->n_stages;
    uint64_t budgets[MS_MAX_DEVICES] = {0};
    for (int i = 0; i < n; i++) {
        ms_backend *be = x->stage_bes[i];
        uint64_t fr = 0, tot = 0;
        if (x->comm->ops->activate) x->comm->ops->activate(x->comm, i); /* mem_info reads the current device */
        if (be->ops->mem_info && !be->ops->mem_info(be, &fr, &tot, &err)) {
            int share = 0;
            for (int j = 0; j < n; j++) share += x->gpu_ids[j] == x->gpu_ids[i];
            budgets[i] = fr / (uint64_t)(share ? share : 1);
        }
        if (eo->memory_mib > 0 && (!budgets[i] || budgets[i] > ((uint64_t)eo->memory_mib << 20)))
            budgets[i] = (uint64_t)eo->memory_mib << 20;
    }
    ms_place_input in;
    int context = ctx > 0 ? ctx : 4096;
    if (context > x->model.cfg.max_pos) context = (int)x->model.cfg.max_pos;
    if (ms_place_input_of(&x->model, x->stage_bes[0], context, eo->prefill_chunk, 1, (ms_expert_split)eo->experts_split,
                          eo->replicate_hot, &in, &err) ||
        ms_placement_make(&in, n, budgets, &x->placement, &err)) {
        ms_place_input_free(&in);
        fprintf(stderr, "moonshine %s: --gpus %s: %s\n", cmd, eo->gpus, err.msg);
        return 1;
    }
    ms_place_input_free(&in);
    char names[MS_MAX_DEVICES][24];
    const char *np[MS_MAX_DEVICES];
    for (int i = 0; i < n; i++) { /* "GPU 1", or "GPU 0 #1" for the second stage of a device named twice */
        int dup = 0;
        for (int j = 0; j < n; j++) dup += x->gpu_ids[j] == x->gpu_ids[i];
        if (x->backend->host_memory) snprintf(names[i], sizeof names[i], "cpu #%d", i);
        else if (dup > 1) snprintf(names[i], sizeof names[i], "GPU %d #%d", x->gpu_ids[i], i);
        else snprintf(names[i], sizeof names[i], "GPU %d", x->gpu_ids[i]);
        np[i] = names[i];
    }
    if (ms_placement_check(&x->placement, np, &err)) { /* the message holds the ledger */
        fprintf(stderr, "moonshine %s: --gpus %s: %s", cmd, eo->gpus, err.msg);
        return 1;
    }
    char ledger[4096];
    ms_placement_format(&x->placement, np, ledger, sizeof ledger);
    fprintf(stderr, "moonshine %s: placement (%s experts):\n%s", cmd,
            eo->experts_split == MS_EXPERTS_WITH_LAYER ? "layer-local" : "sharded", ledger);
    ms_stages_of(&x->placement, x->stage_bes, x->comm, eo->experts_split == MS_EXPERTS_SHARDED, x->stage_begin,
                 x->stage_end, &x->stages_v);
    x->stages = &x->stages_v;
    return 0;
}

/* The backends of x (one, or the stages' with their comm), after the engine is gone. */
static void close_backends(ms_cli_ctx *x) {
    if (x->comm) x->comm->ops->destroy(x->comm);
    x->comm = NULL;
    if (x->n_stages) {
        for (int i = x->n_stages - 1; i >= 0; i--)
            if (x->stage_bes[i]) x->stage_bes[i]->ops->destroy(x->stage_bes[i]);
        x->n_stages = 0;
    } else if (x->backend) {
        x->backend->ops->destroy(x->backend);
    }
    x->backend = NULL;
    x->stages = NULL;
    ms_placement_free(&x->placement);
}

/* The backend `name` (--backend) names, into x->backend (NULL: the engine's own CPU backend).
 * auto: the GPU backend when this build has one and a device is present, else the CPU. */
static int open_backend(const char *cmd, const char *name, ms_cli_ctx *x) {
    x->backend = NULL;
    if (!name || !strcmp(name, "cpu")) return 0;
#ifdef MS_WITH_GPU
    int want = strcmp(name, "auto") != 0;
    if (want && strcmp(name, MS_GPU_KIND)) {
        fprintf(stderr, "moonshine %s: --backend %s: this build's GPU backend is %s\n", cmd, name, MS_GPU_KIND);
        return 1;
    }
    if (!want && ms_backend_gpu_count() < 1) return 0;
    ms_err err = {0};
    if (ms_backend_gpu_create(0, &x->backend, &err)) {
        fprintf(stderr, "moonshine %s: --backend %s: %s\n", cmd, name, err.msg);
        return 1;
    }
    fprintf(stderr, "moonshine %s: backend %s\n", cmd, x->backend->name);
    return 0;
#else
    if (!strcmp(name, "auto")) return 0;
    fprintf(stderr, "moonshine %s: --backend %s: this build has no GPU backend (built without nvcc/hipcc)\n", cmd, name);
    return 1;
#endif
}

double ms_cli_device_copy_bw(ms_cli_ctx *x) {
#ifdef MS_WITH_GPU
    double bw = 0;
    ms_err err = {0};
    if (x->backend && !x->backend->host_memory && ms_backend_gpu_copy_bandwidth(x->backend, &bw, &err)) {
        fprintf(stderr, "moonshine: device copy bandwidth: %s\n", err.msg);
        return 0;
    }
    return bw;
#else
    (void)x;
    return 0;
#endif
}

int ms_cli_profile(ms_cli_ctx *x, int on) {
#ifdef MS_WITH_GPU
    ms_err err = {0};
    if (x->backend && !x->backend->host_memory && ms_backend_gpu_profile(x->backend, on, &err)) {
        fprintf(stderr, "moonshine: profile: %s\n", err.msg);
        return 1;
    }
#else
    (void)x, (void)on;
#endif
    return 0;
}

int ms_cli_profile_json(ms_cli_ctx *x, int per, char *buf, size_t cap) {
    if (cap) buf[0] = 0;
#ifdef MS_WITH_GPU
    if (x->backend && !x->backend->host_memory) return ms_backend_gpu_profile_json(x->backend, per, buf, cap);
#else
    (void)x, (void)per;
#endif
    return 0;
}

/* --experts-on / --cpu-moe-layers on a device backend: the probes (auto, or eo->hybrid_probe),
 * then x->cpu_layers by the mode (NULL when no layer's experts run on the CPU). On the CPU
 * backend the options change nothing (the experts are computed there anyway). */
static int hybrid_setup(const char *cmd, const ms_cli_opts *eo, ms_cli_ctx *x) {
    int want = eo->experts_on != MS_EXPERTS_ON_GPU || eo->cpu_moe_layers >= 0;
    if (!x->backend || x->backend->host_memory) {
        if (want) fprintf(stderr, "moonshine %s: --experts-on / --cpu-moe-layers ignored: the CPU backend computes "
                                  "every expert\n", cmd);
        return 0;
    }
    ms_err err = {0};
    const ms_config *c = &x->model.cfg;
    if (eo->experts_on == MS_EXPERTS_ON_AUTO || eo->hybrid_probe) {
        if (ms_hybrid_measure_run(&x->model, x->backend, x->pool, &x->measure, &err)) {
            fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
            return 1;
        }
        x->measured = 1;
        fprintf(stderr, "moonshine %s: PCIe host-to-device %.2f GB/s pinned, %.2f GB/s pageable; RAM read %.2f GB/s; CPU "
                "experts %.2f GB/s (%d threads)\n", cmd, x->measure.pcie_h2d_gb_s, x->measure.pcie_pageable_gb_s,
                x->measure.ram_read_gb_s, x->measure.cpu_expert_gb_s, x->measure.threads);
    }
    if (!want) return 0;
    x->cpu_layers = calloc((size_t)(c->n_layers > 0 ? c->n_layers : 1), 1);
    if (!x->cpu_layers) {
        fprintf(stderr, "moonshine %s: out of memory\n", cmd);
        return 1;
    }
    char why[512] = "";
    if (eo->experts_on == MS_EXPERTS_ON_AUTO) {
        uint64_t budget = eo->device_expert_mib >= 0 ? (uint64_t)eo->device_expert_mib << 20 : 0;
        if (eo->device_expert_mib < 0 &&
            ms_device_experts_default_budget(&x->model, x->backend, eo->ctx, &budget, &err)) {
            fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
            return 1;
        }
        x->device_budget = budget;
        x->n_cpu_layers = ms_hybrid_auto_layers(&x->model, &x->measure, budget, x->experts != NULL, x->cpu_layers,
                                                why, sizeof why);
        fprintf(stderr, "moonshine %s: %s\n", cmd, why);
        /* the device's layers fit their budget: placed resident (MS_HYBRID_AUTO_ARENA=1 keeps the arena) */
        uint64_t dev_bytes = 0;
        for (int l = 0; l < c->n_layers; l++)
            if (c->layer_mlp[l] == MS_MLP_MOE && !x->cpu_layers[l])
                dev_bytes += ms_hybrid_expert_bytes(&x->model, l) * (uint64_t)c->n_experts;
        const char *ka = getenv("MS_HYBRID_AUTO_ARENA");
        x->hybrid_placed = x->n_cpu_layers > 0 && dev_bytes <= budget && !(ka && atoi(ka) > 0);
        if (x->hybrid_placed && x->experts)
            fprintf(stderr, "moonshine %s: experts-on auto: the device's %.1f MiB of experts placed resident (no "
                            "device arena)\n", cmd, dev_bytes / 1048576.0);
    } else {
        x->n_cpu_layers = ms_hybrid_first_layers(c, eo->cpu_moe_layers, x->cpu_layers);
    }
    int n_moe = 0;
    for (int l = 0; l < c->n_layers; l++) n_moe += c->layer_mlp[l] == MS_MLP_MOE;
    fprintf(stderr, "moonshine %s: routed experts of %d of %d MoE layers on the CPU (from %s), the rest on %s\n", cmd,
            x->n_cpu_layers, n_moe, x->experts && x->host_tier ? "the host expert cache" : "the mapped checkpoint",
            x->backend->name);
    if (!x->n_cpu_layers) {
        free(x->cpu_layers);
        x->cpu_layers = NULL;
    }
    return 0;
}

#define HYB_SHARE_MIN_US 60 /* the device share's smallest expert, in microseconds of CPU time */

/* The plan's options of x and eo with an expert cache of cache bytes (< 0: every expert resident). */
static ms_plan_opts plan_opts(const ms_cli_ctx *x, const ms_cli_opts *eo, int ctx, int threads, int64_t cache) {
    ms_plan_opts po = {.context = ctx > 0 ? ctx : 4096, .threads = threads, .expert_cache_bytes = cache,
                       .static_load = eo->static_load, .static_dtype = eo->static_dtype,
                       .max_batch = eo->prefill_chunk,
                       .device_expert_bytes = eo->device_expert_mib > 0 ? (uint64_t)eo->device_expert_mib << 20 : 0};
    if (po.context > x->model.cfg.max_pos) po.context = (int)x->model.cfg.max_pos;
    return po;
}

/* The host RAM tier --memory-mib leaves: the budget less the plan without an expert cache, at
 * most every routed expert, whole MiB; 0 when nothing is left (the smallest cache then). Before
 * the pool exists: its size by ms_pool_create's rule (--threads, else one per online CPU). */
static uint64_t plan_host_tier(const ms_cli_ctx *x, const ms_cli_opts *eo, int ctx) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    ms_plan_opts po = plan_opts(x, eo, ctx, eo->threads > 0 ? eo->threads : (int)(ncpu > 0 ? ncpu : 1), 0);
    ms_plan p;
    ms_err err = {0};
    uint64_t budget = (uint64_t)eo->memory_mib << 20;
    if (ms_plan_make(&x->model, &po, &p, &err) || p.total >= budget) return 0;
    uint64_t room = budget - p.total;
    if (room > x->model.expert_bytes) room = (x->model.expert_bytes + (1u << 20) - 1) & ~((uint64_t)(1u << 20) - 1);
    return room & ~((uint64_t)(1u << 20) - 1);
}

int ms_cli_open(const char *cmd, const char *dir, const ms_cli_opts *eo, ms_cli_ctx *x) {
    memset(x, 0, sizeof *x);
    const int ctx = eo->ctx;
    ms_err err = {0};
    double t0 = ms_now();
    if (ms_model_load(dir, &x->model, &err)) {
        fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
        return 1;
    }
    x->host_tier = eo->host_cache_given;
    if (eo->stream) {
        char why[1024];
        ms_streaming_opts so = eo->stream_opts;
        if (eo->memory_mib > 0 && !eo->host_cache_given && !eo->gpus) { /* the host RAM tier sized by the plan */
            so.cache_mib = (int64_t)(plan_host_tier(x, eo, ctx) >> 20);
            x->host_tier = so.cache_mib > 0;
            fprintf(stderr, "moonshine %s: host expert tier sized by the memory plan (--memory-mib %lld): %lld MiB\n",
                    cmd, (long long)eo->memory_mib, (long long)so.cache_mib);
        }
        if (ms_streaming_experts_create(&x->model, &so, &x->experts, why, sizeof why, &err)) {
            fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
            ms_model_free(&x->model);
            return 1;
        }
        fprintf(stderr, "moonshine %s: %s\n", cmd, why);
    }
    x->static_load = eo->static_load;
    x->pool = ms_pool_create(eo->threads);
    x->threads = ms_pool_size(x->pool);
    if (x->pool && ms_cpu_set_activations(x->pool, (ms_cpu_act)eo->cpu_act, &err)) {
        fprintf(stderr, "moonshine %s: --cpu-activations: %s\n", cmd, err.msg);
        goto fail;
    }
    if (eo->gpus && eo->stream) {
        fprintf(stderr, "moonshine %s: --gpus: streamed experts (the streaming options) are not split over devices "
                        "yet: the split holds every expert resident\n", cmd);
        goto fail;
    }
    if (eo->gpus && (eo->experts_on != MS_EXPERTS_ON_GPU || eo->cpu_moe_layers >= 0)) {
        fprintf(stderr, "moonshine %s: --gpus with hybrid execution (--experts-on cpu|auto, --cpu-moe-layers) is not "
                        "supported yet\n", cmd);
        goto fail;
    }
    if (eo->gpus ? open_stages(cmd, eo, x) : open_backend(cmd, eo->backend, x)) goto fail;
    if (!eo->gpus && hybrid_setup(cmd, eo, x)) goto fail;
    int n_moe = 0;
    for (int l = 0; l < x->model.cfg.n_layers; l++) n_moe += x->model.cfg.layer_mlp[l] == MS_MLP_MOE;
    /* every MoE layer's experts on the CPU: the host cache (if any) serves them, no device arena */
    if (x->hybrid_placed && x->experts && !x->host_tier) { /* only the arena's inner source: unused */
        x->experts->ops->destroy(x->experts);
        x->experts = NULL;
    }
    if (x->experts && x->backend && !x->backend->host_memory && x->n_cpu_layers < n_moe && !x->hybrid_placed) {
        /* the host cache feeds a device slot arena */
        char why[1024];
        /* --device-expert-mib N; 0: the smallest arena (top-k slots); not given: what the device has free */
        uint64_t budget = eo->device_expert_mib > 0 ? (uint64_t)eo->device_expert_mib << 20 : 0;
        if (eo->device_expert_mib < 0 && ms_device_experts_default_budget(&x->model, x->backend, ctx, &budget, &err)) {
            fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
            goto fail;
        }
        /* A/B switches of the streamed decode (docs/gpu.md): MS_STREAM_ROUTED=0 the expert lists instead of
         * the fused routed kernels, MS_GATE_WARM=open the gate forwarding until measured, MS_GUESS_ALL=1
         * every lookahead guess made while the gate holds them back */
        const char *sr = getenv("MS_STREAM_ROUTED"), *gw = getenv("MS_GATE_WARM"), *ga = getenv("MS_GUESS_ALL");
        ms_device_experts_opts dopt = {.budget_bytes = budget, .policy = eo->stream_opts.policy,
                                       .lists = sr && !strcmp(sr, "0"), .gate_warm_open = gw && !strcmp(gw, "open"),
                                       .always_guess = ga && atoi(ga) > 0};
        if (ms_device_experts_create(&x->model, x->backend, x->experts, &dopt, &x->dev_experts, why, sizeof why,
                                     &err)) {
            fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
            goto fail;
        }
        fprintf(stderr, "moonshine %s: %s%s\n", cmd, why, eo->device_expert_mib >= 0 ? "" : " (default budget)");
    } else if (eo->device_expert_mib >= 0 && !x->cpu_layers) {
        fprintf(stderr, "moonshine %s: --device-expert-mib ignored: the experts are used in host memory\n", cmd);
    }
    /* hybrid: the device's layers use the arena or their placed experts. MS_HYBRID_COMPOSED=1: the CPU layers' decode experts one by one (the A/B of the one-row form) */
    const char *hc = getenv("MS_HYBRID_COMPOSED");
    /* the CPU layers read the host cache when the user sized one, else the mapping (a cache made only
     * as the device arena's inner source has top-k slots: every CPU expert would be a read) */
    x->hybrid = (ms_hybrid_opts){.cpu_layer = x->cpu_layers, .host = x->host_tier ? x->experts : NULL,
                                 .composed = hc && atoi(hc) > 0};
    /* the device share (ms_hybrid_opts.gpu_share): MS_HYBRID_GPU_SHARE=F sends fraction F of a CPU layer's
     * chunk's experts over PCIe to the device, 0 turns it off; unset or auto: F = pinned PCIe / (PCIe + CPU
     * expert rate) from the probes (0.4 without them) when one expert takes at least HYB_SHARE_MIN_US on the
     * CPU (at the probe's rate, else 80 GB/s): a device expert costs the host ~27 us of queuing (E1,
     * 2026-12-02), so smaller experts (MXFP4 Qwen3: no gain measured) stay on the CPU.
     * MS_HYBRID_GPU_SLOTS=N device slots for them (default 2 x top-k) */
    const char *gs = getenv("MS_HYBRID_GPU_SHARE"), *gsl = getenv("MS_HYBRID_GPU_SLOTS");
    if (x->cpu_layers) {
        double pc = x->measure.pcie_h2d_gb_s, ce = x->measured ? x->measure.cpu_expert_gb_s : 0, f = 0;
        if (!gs || !*gs || !strcmp(gs, "auto")) {
            uint64_t eb = 0;
            for (int l = 0; l < x->model.cfg.n_layers && !eb; l++)
                if (x->cpu_layers[l]) eb = ms_hybrid_expert_bytes(&x->model, l);
            double us = (double)eb / ((ce > 0 ? ce : 80.0) * 1e3);
            if (us >= HYB_SHARE_MIN_US) f = x->measured && pc > 0 && ce > 0 ? pc / (pc + ce) : 0.4;
            else if (gs && *gs)
                fprintf(stderr, "moonshine %s: device share off: an expert takes %.0f us on the CPU (< %d)\n", cmd, us,
                        HYB_SHARE_MIN_US);
        } else {
            f = atof(gs);
        }
        x->hybrid.gpu_share = f < 0 ? 0 : f > 1 ? 1 : f;
        x->hybrid.gpu_slots = gsl ? atoi(gsl) : 0;
        if (x->hybrid.gpu_share > 0)
            fprintf(stderr, "moonshine %s: CPU layers send %.2f of a chunk's experts to %s over PCIe (%s)%s\n", cmd,
                    x->hybrid.gpu_share, x->backend->name, gs && *gs ? gs : "default auto",
                    x->hybrid.host ? ": not with a host cache, off" : "");
    }
    /* --prefill-chunk unset: the engine's 256 on the CPU, MS_CLI_DEVICE_CHUNK on a device backend (larger chunks
     * amortize the prefill GEMMs' weight reads: 1.28x at pp512 with FP8 experts on the H200, 512 vs 256) */
    int chunk = eo->prefill_chunk > 0 ? eo->prefill_chunk
                : x->backend && !x->backend->host_memory && !eo->gpus ? MS_CLI_DEVICE_CHUNK : 0;
    ms_engine_opts o = {.max_ctx = ctx, .pool = x->pool, .experts = ms_cli_engine_experts(x), .mla_form = eo->mla_form,
                        .backend = x->backend, .max_batch = chunk, .hybrid = ms_cli_hybrid(x)};
    if (eo->static_store) { /* mapped, checked, bound: the plan below counts its dtype */
        double ts = ms_now();
        uint64_t before = x->model.static_bytes;
        if (ms_static_store_open(&x->model, eo->static_store, eo->static_dtype, &err)) {
            fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
            goto fail;
        }
        fprintf(stderr, "moonshine %s: static tier from %s (%s): %.1f -> %.1f MiB, checked in %.2f s\n", cmd,
                eo->static_store, ms_static_dtype_name((ms_static_dtype)x->model.static_dtype), before / 1048576.0,
                x->model.static_bytes / 1048576.0, ms_now() - ts);
    }
    if (eo->memory_mib > 0 && !eo->gpus) { /* plan first; refuse what does not fit, before allocating */
        ms_plan p;
        int64_t cache = -1;
        if (x->experts) {
            ms_stream_stats ss;
            ms_streaming_stats(x->experts, &ss);
            cache = (int64_t)ss.slot_bytes * ss.n_slots; /* mapped lazily: nothing touched yet */
        }
        ms_plan_opts po = plan_opts(x, eo, ctx, x->threads, cache);
        po.max_batch = chunk; /* the engine's chunk (the device default when --prefill-chunk is unset) */
        if (ms_plan_make(&x->model, &po, &p, &err) || ms_plan_check(&p, (uint64_t)eo->memory_mib << 20, &err)) {
            fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
            goto fail;
        }
    }
    if (eo->static_dtype != MS_STATIC_STORED && x->model.static_dtype == MS_STATIC_STORED) {
        double tq = ms_now();
        uint64_t before = x->model.static_bytes;
        if (ms_model_requant_static(&x->model, eo->static_dtype, x->pool, &err)) {
            fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
            goto fail;
        }
        fprintf(stderr, "moonshine %s: static tier requantized to %s: %.1f -> %.1f MiB in %.2f s\n", cmd,
                ms_static_dtype_name(eo->static_dtype), before / 1048576.0, x->model.static_bytes / 1048576.0,
                ms_now() - tq);
    }
    if (!eo->defer_static_load && ms_cli_static_load(cmd, x)) goto fail;
    if (eo->gpus) { /* the per-device plan (refused before allocating), then the engine over the stages */
        if (place_stages(cmd, eo, ctx, x)) goto fail;
        o.stages = x->stages;
        o.backend = NULL;
    }
    if (ms_engine_create(&x->model, &o, &x->engine, &err)) {
        fprintf(stderr, "moonshine %s: %s\n", cmd, err.msg);
        goto fail;
    }
    x->load_seconds = ms_now() - t0;
    return 0;
fail:
    free(x->cpu_layers);
    x->cpu_layers = NULL;
    if (x->dev_experts) x->dev_experts->ops->destroy(x->dev_experts);
    x->dev_experts = NULL;
    close_backends(x);
    ms_pool_destroy(x->pool);
    if (x->experts) x->experts->ops->destroy(x->experts);
    ms_model_free(&x->model);
    return 1;
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
    if (x->dev_experts) {
        ms_device_experts_stats d;
        ms_device_experts_stats_get(x->dev_experts, &d);
        fprintf(stderr,
                "device experts: %d slots, %llu requests, hit rate %.3f, %llu uploads (%.1f MiB), %.3f s in host "
                "acquires, %.3f s uploading%s\n",
                d.n_slots, (unsigned long long)d.requests, d.requests ? (double)d.hits / (double)d.requests : 0.0,
                (unsigned long long)d.uploads, d.upload_bytes / 1048576.0, d.inner_s, d.upload_s,
                d.pinned ? " (pinned staging)" : "");
    }
}

const ms_hybrid_opts *ms_cli_hybrid(const ms_cli_ctx *x) { return x->cpu_layers ? &x->hybrid : NULL; }

ms_expert_source *ms_cli_engine_experts(const ms_cli_ctx *x) {
    return x->dev_experts ? x->dev_experts : x->cpu_layers ? NULL : x->experts;
}

void ms_cli_close(ms_cli_ctx *x) {
    if (x->engine) ms_cli_print_stream_stats(x);
    ms_engine_destroy(x->engine);
    free(x->cpu_layers);
    if (x->dev_experts) x->dev_experts->ops->destroy(x->dev_experts);
    close_backends(x);
    if (x->experts) x->experts->ops->destroy(x->experts);
    ms_pool_destroy(x->pool);
    ms_model_free(&x->model);
}
