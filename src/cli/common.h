/* common.h — shared CLI plumbing: open a model with a pool and an engine. */
#ifndef MS_CLI_COMMON_H
#define MS_CLI_COMMON_H

#include "engine/engine.h"
#include "engine/placement.h"
#include "engine/hybrid_experts.h"
#include "engine/streaming.h"
#include "model/model.h"

typedef struct ms_cli_ctx {
    ms_model model;
    ms_pool *pool;
    ms_engine *engine;
    int threads;
    double load_seconds;
    ms_expert_source *experts; /* the streaming source when --expert-cache-mib/--io/--store were given, else NULL */
    ms_static_load static_load; /* --static-load */
    ms_backend *backend;        /* --backend: the GPU backend, or NULL (the engine's own CPU backend) */
    ms_expert_source *dev_experts; /* streaming on a device backend: the device expert source over experts */
    /* --gpus: one backend per entry of the device list (backend is stage_bes[0]), the comm
     * between them, the placement and the engine's stages over them; stages NULL otherwise */
    int n_stages;
    int gpu_ids[MS_MAX_DEVICES];
    ms_backend *stage_bes[MS_MAX_DEVICES];
    struct ms_comm *comm;
    ms_placement placement;
    int stage_begin[MS_MAX_DEVICES], stage_end[MS_MAX_DEVICES];
    ms_stages stages_v;
    const ms_stages *stages;
    /* hybrid execution (--experts-on, --cpu-moe-layers) on a device backend */
    uint8_t *cpu_layers;        /* [n_layers] the MoE layers whose experts run on the CPU, or NULL */
    int n_cpu_layers;
    int measured;               /* 1: measure holds the probes' figures (auto, or hybrid_probe) */
    ms_hybrid_measure measure;
    uint64_t device_budget;     /* the device's bytes for experts the auto rule used */
    int host_tier;              /* 1: x->experts is a host RAM tier the CPU layers read (--expert-cache-mib,
                                 * --store, or sized by --memory-mib's plan); 0: only the arena's inner source */
    int hybrid_placed;          /* 1: auto put the other MoE layers' experts on the device and they fit
                                 * in device_budget: placed resident, no device arena (a cold arena over
                                 * the streaming cache would read every first use from the drive) */
    ms_hybrid_opts hybrid;      /* what ms_cli_open gave its engine (ms_cli_hybrid) */
} ms_cli_ctx;

/* The engine options of one invocation: parsed by ms_cli_engine_args, applied by ms_cli_open. */
typedef struct ms_cli_opts {
    int threads;                  /* --threads (0: one per CPU) */
    int ctx;                      /* --ctx (0: the engine's default) */
    int64_t memory_mib;           /* --memory-mib, -1 when not given */
    ms_static_load static_load;   /* --static-load (below) */
    ms_static_dtype static_dtype; /* --static-dtype stored|q8|fp8: requantized at load (model.h) */
    const char *static_store;     /* --static-store DIR: the static tier packed by pack --static (model.h) */
    int cpu_act;                  /* --cpu-activations f32|q8|bf16|q8+bf16|q16|q16+bf16 (backend/cpu/cpu.h ms_cpu_act; default ms_cpu_act_default) */
    ms_mla_form mla_form;         /* --mla-form */
    int defer_static_load;        /* 1: ms_cli_open leaves --static-load read to the caller (below) */
    const char *backend;          /* --backend cpu|cuda|hip|auto (default auto) */
    int prefill_chunk;            /* --prefill-chunk N: tokens per forward chunk (0: the engine's 256; on a
                                   * single device backend MS_CLI_DEVICE_CHUNK) */
    int stream;                   /* 1: one of the streaming options was given */
    int host_cache_given;         /* 1: --expert-cache-mib or --store was given: hybrid CPU layers read that host
                                   * cache; else (--device-expert-mib, --io alone) they read the mapping */
    ms_streaming_opts stream_opts;
    int64_t device_expert_mib;    /* --device-expert-mib (a streaming option; 0: top-k slots), -1 when not given:
                                   * the default budget (ms_device_experts_default_budget) */
    const char *gpus;             /* --gpus N | a,b,...: the model split over these devices (NULL: one) */
    int experts_split;            /* --experts-split sharded|layer (ms_expert_split; default sharded) */
    int replicate_hot;            /* --replicate-hot N: the N lowest-id experts of each layer on every device */
    ms_experts_on experts_on;     /* --experts-on cpu|gpu|auto (default gpu) */
    int experts_on_given;         /* 1: --experts-on was given */
    int hybrid_probe;             /* 1: run the bandwidth probes on a device backend (auto always does;
                                   * bench sets it with --experts-on, to report them) */
    int cpu_moe_layers;           /* --cpu-moe-layers N: the first N MoE layers on the CPU; -1 when not given */
} ms_cli_opts;

/* The defaults (what ms_cli_engine_args gives for an argv without engine flags). */
void ms_cli_opts_init(ms_cli_opts *o);
/* Parse the engine options every command shares (--threads N, --ctx N, --memory-mib N) from
 * argv into *o, and the expert streaming options (--expert-cache-mib N, --io
 * uring|pread|mmap|auto, --store DIR, --cache-policy lfu-decay|lru, --queue-depth N,
 * --expert-trace FILE, --no-prefetch, --device-expert-mib N), which ms_cli_open then applies:
 * any of them streams routed experts through a bounded cache instead of the resident mapping;
 * on a device backend (--backend cuda|hip) the host cache feeds a device slot arena of
 * --device-expert-mib MiB (engine/device_experts.h; 0: top-k slots; default: what the device
 * has free after the static tier, state and workspace). Also
 * --static-load mmap|read (below), --static-dtype stored|q8|fp8 (ms_model_requant_static, after
 * the memory plan, which counts the chosen dtype), --static-store DIR (ms_static_store_open
 * before the plan: the packed tier instead of requantizing; with --static-dtype the two must agree), --mla-form auto|absorbed|expanded (ms_mla_form) and
 * --backend cpu|cuda|hip|auto: where the forward runs (auto, the default: the GPU backend
 * when this build has one (MS_WITH_GPU) and a device is present, else the CPU), and
 * --prefill-chunk N: the most tokens one forward chunk takes (the engine's max_batch; larger
 * chunks amortize the prefill GEMMs' weight reads on a device backend), and
 * --gpus N | a,b,...: the model split over several devices (engine/placement.h: layers in
 * stages, routed experts sharded over the devices per --experts-split sharded|layer, the
 * --replicate-hot N lowest-id experts of each layer on every device); with --backend cpu
 * the "devices" are CPU backends (the split checked on the CPU); a list may name a device
 * twice (0,0: two stages on one GPU, copies instead of NCCL). Refused before allocating when
 * a device's share exceeds its free memory (or --memory-mib per device);
 * and hybrid execution
 * on a device backend (engine/hybrid_experts.h): --experts-on cpu|gpu|auto (cpu: the routed
 * experts of every MoE layer, or of the first N with --cpu-moe-layers N, computed on the CPU
 * from host memory; auto: per layer by ms_hybrid_auto_layers from measured bandwidths; gpu,
 * the default: on the device) and --cpu-moe-layers N alone (the first N on the CPU).
 * Prints the error and returns nonzero on a bad flag. */
int ms_cli_engine_args(int argc, char **argv, ms_cli_opts *o);
/* Load dir and create pool + engine as *o says; prints the error and returns nonzero on failure. */
int ms_cli_open(const char *cmd, const char *dir, const ms_cli_opts *o, ms_cli_ctx *x);
void ms_cli_close(ms_cli_ctx *x);
/* For engines a command creates itself (serve's slots): the hybrid options ms_cli_open used
 * (NULL when no layer's experts run on the CPU) and the engine's expert source. */
const ms_hybrid_opts *ms_cli_hybrid(const ms_cli_ctx *x);
ms_expert_source *ms_cli_engine_experts(const ms_cli_ctx *x);
/* --static-load read (the default is mmap): ms_cli_open moves the static tier into huge-page
 * memory (ms_model_static_read) after the memory plan, unless o->defer_static_load; then the
 * caller does it with ms_cli_static_load (bench drops the page cache first: dropping after
 * the move would discard the copy). Prints the error, nonzero on failure. */
int ms_cli_static_load(const char *cmd, ms_cli_ctx *x);
/* Print the streaming source's statistics as one line to stderr (nothing when not streaming). */
void ms_cli_print_stream_stats(const ms_cli_ctx *x);
/* The model argument of command cmd (arg: the first positional, NULL when absent, returned as NULL):
 * an existing path as is, or a Hugging Face repo id (ORG/NAME[@REV]) or cache repository folder
 * resolved offline to its snapshot (util/hf_cache.h) through HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME,
 * HOME. When it resolves to nothing, prints what was looked for and exits 1. */
const char *ms_cli_model_arg(const char *cmd, const char *arg);
double ms_now(void);
/* Device backends (x->backend set): the device-to-device copy bandwidth, bytes read +
 * written per second (0 on the CPU or on failure); the per-op profile (backend_gpu.h:
 * on 1 starts, 0 stops; the JSON object per `per` tokens into buf, its length, 0 when
 * there is none). */
double ms_cli_device_copy_bw(ms_cli_ctx *x);
int ms_cli_profile(ms_cli_ctx *x, int on);
int ms_cli_profile_json(ms_cli_ctx *x, int per, char *buf, size_t cap);

/* bench --static-compare D (cmd_bench_static.c): the model opened twice from dir with eo's options,
 * once with the stored static tier and once in dtype D (eo->static_store when given, else
 * requantized at load); after a warm-up round each, `rounds` rounds of reset + P-token prefill + G
 * greedy decode tokens alternate between the two. One JSON line: per tier load_s, static_bytes,
 * weight_bytes_per_token and per-round decode tok/s and CPU seconds; bytes_ratio, speedup_wall
 * and speedup_cpu (ratios of the medians) and how many greedy ids of the last round agree. Resident
 * experts only (2 when streaming options were given). Returns the exit code. */
int ms_cli_bench_static_compare(const char *dir, const ms_cli_opts *eo, ms_static_dtype d, int64_t P, int64_t G,
                                int rounds);

/* the prefill chunk of a single device backend when --prefill-chunk is unset (ms_cli_open) */
#define MS_CLI_DEVICE_CHUNK 512

#endif
