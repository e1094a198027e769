/* hybrid_experts.h — hybrid execution (--experts-on cpu|gpu|auto, --cpu-moe-layers N):
 * the routed experts of chosen MoE layers are computed on the CPU from host memory
 * (the mapped checkpoint, or a host expert cache) while everything else — attention,
 * the static tier, routers, shared experts, the head — runs on a device backend.
 *
 * Per CPU layer and chunk of n tokens (engine/hybrid_experts.c):
 *   device  router + route (as every layer), then ids, weights and the experts' input
 *           rows (the normed hidden state, or the latent input) come down (download: a
 *           wait on the backend's stream, never a device-wide sync)
 *   device  the shared expert (and its gate) is queued into scratch rows: it runs while
 *   host    the CPU builds the expert-major lists, acquires the experts from the host
 *           source (never uploaded) and sums them with the CPU backend's moe_experts
 *           (its kernels and the engine's thread pool), into pinned host rows
 *   device  the sum goes up into the layer's expert accumulator (stream-ordered), the
 *           latent up-projection (if any) and the shared expert's rows are added.
 * With ms_hybrid_opts.gpu_share, part of a chunk's experts is uploaded into device slots and
 * summed on the device (queued before the CPU starts), the CPU's sum added to it there.
 * The other layers run as before through the engine's expert source (placed experts,
 * or the device expert source). Results equal the CPU path up to the device's F32
 * rounding (the CPU layers' sums are the CPU backend's own).
 *
 * The mode's per-layer choice is a flag array; ms_hybrid_auto_layers turns measured
 * bandwidths into one (the rule is documented there and in docs/gpu.md). */
#ifndef MS_HYBRID_EXPERTS_H
#define MS_HYBRID_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/expert_source.h"
#include "model/model.h"
#include "util/threadpool.h"

struct ms_engine;

/* Where routed experts are computed (--experts-on). GPU: on the device backend (today's
 * resident or streamed forms); CPU: every MoE layer on the CPU (or the first N with
 * --cpu-moe-layers N); AUTO: per layer by ms_hybrid_auto_layers. */
typedef enum { MS_EXPERTS_ON_GPU = 0, MS_EXPERTS_ON_CPU = 1, MS_EXPERTS_ON_AUTO = 2 } ms_experts_on;

/* "gpu", "cpu", "auto" -> *out; MS_ERR_ARG naming the value otherwise. */
int ms_experts_on_parse(const char *s, ms_experts_on *out, ms_err *err);
const char *ms_experts_on_name(ms_experts_on on);

/* The engine's hybrid options (ms_engine_opts.hybrid; ignored on a backend with host memory). */
typedef struct ms_hybrid_opts {
    const uint8_t *cpu_layer; /* [n_layers]: 1 = that MoE layer's routed experts run on the CPU (copied) */
    ms_expert_source *host;   /* borrowed, views in host memory (views_on NULL), serving the CPU layers;
                               * NULL: resident views of the host model's mapping (own source) */
    int composed;             /* 1: every expert through the composed form one by one (ms_moe_experts_composed),
                               * also in decode; 0 (default): experts of one row each (decode) in two
                               * matmul_many passes (all gate/up products, then all down products) */
    double gpu_share;         /* > 0: of a CPU layer's chunk, this fraction of its experts (rounded, at most
                               * gpu_slots; those with the highest expert ids) is uploaded over PCIe into
                               * device slots and computed there while the CPU sums the others: both the
                               * link and the CPU's RAM read feed the layer. The two partial sums are added
                               * on the device (not the CPU engine's order: within rounding, not bytes).
                               * Only with views of the mapping (host NULL); the CPU layers' expert spans
                               * of the mapping are page-locked (host_register) so the copies are DMA;
                               * where that fails the share is off (hybrid stats gpu_pinned 0).
                               * 0 (default): every routed expert of a CPU layer on the CPU */
    int gpu_slots;            /* device slots for gpu_share (0: 2 x top_k) */
} ms_hybrid_opts;

/* Counters of the CPU layers since engine creation. */
typedef struct ms_hybrid_stats {
    int cpu_layers;           /* MoE layers whose experts run on the CPU */
    uint64_t layer_calls;     /* (layer, chunk) computations on the CPU */
    uint64_t experts;         /* experts acquired for them (unique per layer and chunk) */
    uint64_t expert_bytes;    /* bytes of those experts' weights (what the CPU read) */
    double wait_s;            /* waiting for the device's router output (the stream's queue drains) */
    double cpu_s;             /* host source acquires + the CPU expert sums */
    double tail_s;            /* upload of the sums and queuing the rest of the layer */
    uint64_t gpu_experts;     /* of experts: those computed on the device (gpu_share) */
    uint64_t gpu_expert_bytes; /* their bytes (uploaded; not in expert_bytes) */
    double gpu_queue_s;       /* host time queuing their uploads and products (inside cpu_s) */
    int gpu_pinned;           /* 1: the mapping's spans were page-locked for gpu_share */
} ms_hybrid_stats;

/* 0 and zeroed stats when e has no CPU layers. */
int ms_engine_hybrid_stats(const struct ms_engine *e, ms_hybrid_stats *out);
/* 1 when e computes some MoE layer's experts on the CPU (the forward has host round trips
 * inside every such layer: a device graph capture of the decode step must not include it). */
int ms_engine_hybrid_active(const struct ms_engine *e);

/* flags[l] = 1 for the first n MoE layers of c (layer_mlp MS_MLP_MOE), 0 elsewhere; n < 0 or
 * n >= the MoE layer count: all of them. Returns how many were set. */
int ms_hybrid_first_layers(const ms_config *c, int n, uint8_t *flags);

/* Bytes of one routed expert of layer l of m (every role: weights, block scales, biases). */
uint64_t ms_hybrid_expert_bytes(const ms_model *m, int l);

/* Measured rates for the auto rule (and the bench JSON). */
typedef struct ms_hybrid_measure {
    double pcie_h2d_gb_s;   /* host -> device upload of 64 MiB from page-locked memory (1e9 B/s) */
    double pcie_pageable_gb_s; /* the same from pageable memory (the mapping: what an unregistered copy gets) */
    double ram_read_gb_s;   /* ms_measure_read_bandwidth over 512 MiB with the pool's threads */
    double cpu_expert_gb_s; /* expert bytes per second of the CPU layers' decode form on one token's
                             * top-k of the first MoE layer: 6 rounds of distinct experts, mapped by
                             * an untimed pass, then timed (the median) */
    int threads;
} ms_hybrid_measure;

/* Measure on device backend dev (upload, sync, host_register, alloc) and pool's CPU threads;
 * m: the host model (its first MoE layer's experts, resident mapping). Takes about a second. */
int ms_hybrid_measure_run(const ms_model *m, ms_backend *dev, ms_pool *pool, ms_hybrid_measure *out, ms_err *err);

/* The auto rule. A MoE layer keeps its experts on the device when they fit: layers in order
 * while their experts' bytes stay within device_budget (what the device has for experts
 * after the static tier, state and workspace). A layer that does not fit computes a cold
 * expert either on the CPU from RAM, at cpu_expert_gb_s, or on the device after a PCIe upload
 * at pcie_h2d_gb_s (the device's compute is negligible beside the copy): on the CPU when
 * cpu_expert_gb_s >= pcie_h2d_gb_s, or when streamed (device cache) execution is not
 * available (stream 0: no host cache was configured). The layers that go to the CPU are the
 * first MoE layers, as with --cpu-moe-layers N. flags[n_layers] out; returns the number of
 * CPU layers; why[cap]: one line with the numbers. */
int ms_hybrid_auto_layers(const ms_model *m, const ms_hybrid_measure *ms, uint64_t device_budget, int stream,
                          uint8_t *flags, char *why, size_t cap);

#endif
