/* cmd_bench.c — `moonshine bench MODEL_DIR`: load time, prefill and decode
 * speed, weight bytes read per decoded token and the achieved bandwidth next
 * to the machine's measured memory read bandwidth. One JSON line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "backend/cpu/cpu.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/comm.h"
#include "engine/device_experts.h"
#include "engine/streaming.h"
#include "io/reader.h"

/* Fault every page of the checkpoint into memory so decode measures compute
 * and memory bandwidth, not page faults (the engine's own steady state). With
 * streamed experts only the static tier is faulted in: the routed experts'
 * tensors are left to the expert source (they may not fit in memory). */
static double cpu_seconds(void) { /* user + system time of the whole process */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

/* The greedy token: the first index of the largest logit, as the loop
 * `if (x[v] > x[best]) best = v` from best = 0 finds it (NaN never wins; a NaN
 * x[0] stays). One pass over 16 lanes (GCC vector extensions: SIMD where the
 * target has it; an AVX2 clone on x86-64), each keeping the first index of its own maximum (strict >,
 * every lane starting at (x[0], 0)); then the largest value, and the smallest
 * index among the lanes holding it. The scalar loop took ~0.5 ms per 152K-entry
 * vocabulary, time a device backend idles between tokens. */
typedef float greedy_vf __attribute__((vector_size(32)));
typedef int32_t greedy_vi __attribute__((vector_size(32)));
#define GREEDY_LANE(m, id, cur, off)                                                                                  \
    do {                                                                                                             \
        greedy_vf xv;                                                                                                \
        memcpy(&xv, x + v + (off), sizeof xv);                                                                       \
        greedy_vi gt = xv > m; /* -1 where greater (never for NaN) */                                                \
        m = (greedy_vf)(((greedy_vi)xv & gt) | ((greedy_vi)m & ~gt));                                                \
        id = (cur & gt) | (id & ~gt);                                                                                \
        cur += sixteen;                                                                                              \
    } while (0)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static int32_t greedy(const float *x, int64_t V) {
    if (V < 1 || x[0] != x[0]) return 0;
    greedy_vf m0, m1;
    greedy_vi i0 = {0}, i1 = {0}, c0, c1, sixteen;
    for (int i = 0; i < 8; i++) m0[i] = m1[i] = x[0], c0[i] = i, c1[i] = 8 + i, sixteen[i] = 16;
    int64_t v = 0;
    if (V <= INT32_MAX - 16)
        for (; v + 16 <= V; v += 16) {
            GREEDY_LANE(m0, i0, c0, 0);
            GREEDY_LANE(m1, i1, c1, 8);
        }
    greedy_vf ms[2] = {m0, m1};
    greedy_vi is[2] = {i0, i1};
    float M = x[0];
    int64_t best = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 8; i++)
            if (ms[k][i] > M || (ms[k][i] == M && is[k][i] < best)) M = ms[k][i], best = is[k][i];
    for (; v < V; v++)
        if (x[v] > M) M = x[v], best = v;
    return (int32_t)best;
}
#undef GREEDY_LANE

static unsigned long long anon_huge_bytes(void) { /* AnonHugePages of this process (THP in use) */
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

static void prefault(const ms_model *m, int skip_experts) {
    const ms_checkpoint *ck = &m->ck;
    unsigned char *skip = skip_experts ? calloc((size_t)ck->n_tensors + 1, 1) : NULL;
    for (int l = 0; skip && l < m->cfg.n_layers; l++) {
        const ms_layer *L = &m->layers[l];
        for (int64_t i = 0; L->expert_tensors && i < m->cfg.n_experts * MS_EXPERT_TENSORS; i++)
            if (L->expert_tensors[i]) skip[L->expert_tensors[i] - ck->tensors] = 1;
    }
    for (int i = 0; skip && i < ck->n_tensors; i++) {
        const ms_tensor *t = &ck->tensors[i];
        if (skip[i] || !t->data) continue;
        const volatile uint8_t *p = t->data;
        uint8_t acc = 0;
        for (uint64_t k = 0; k < t->nbytes; k += 4096) acc ^= p[k];
        (void)acc;
    }
    for (int f = 0; !skip && f < ck->n_files; f++) {
        const volatile uint8_t *p = ck->files[f].map.data;
        uint64_t n = ck->files[f].map.size;
        if (!p) continue;
        madvise((void *)p, n, MADV_WILLNEED);
        uint8_t acc = 0;
        for (uint64_t i = 0; i < n; i += 4096) acc ^= p[i];
        (void)acc;
    }
    free(skip);
}

int cmd_bench(int argc, char **argv) {
    const char *usage = "usage: moonshine bench MODEL_DIR [--prompt-tokens P] [--gen-tokens G] [--threads T] [--backend B]\n"
                        "                      [--profile] [--static-compare q8|fp8 [--rounds R]]\n";
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%sPrints one JSON line: load_s, prefill_tok_s (P tokens), decode_tok_s (G tokens after\n"
               "the prompt), weight_bytes_per_token (static tier + the experts each decoded token\n"
               "used), achieved_gb_s and the machine's measured read bandwidth (mem_bw_gb_s).\n"
               "Weights are faulted in before timing (load_s includes that).\n"
               "Streaming (--expert-cache-mib N, --io MODE, --store DIR, --cache-policy P): only the static\n"
               "tier is faulted in; the drive's sequential O_DIRECT bandwidth is measured first and decode\n"
               "reports expert bytes read per token, hit rate, prefetch issued/used, lookahead accuracy,\n"
               "read GB/s vs the drive, and time waiting for reads vs the floor (bytes read / drive GB/s).\n"
               "On a device backend the host cache feeds a device slot arena (--device-expert-mib N):\n"
               "device_hit_rate, uploads and their bytes per token, time in host acquires and uploads;\n"
               "device_missed_bytes (the misses' bytes, each one upload), disk_floor_s (those bytes at the\n"
               "drive bandwidth measured above), decode_s and disk_floor_fraction (floor / decode time), and\n"
               "the lookahead gate: guessed, right, forwarded and held experts, its precision, the precision it\n"
               "needs, the measured gap (guess to acquire) and read time of one expert; on the routed kernels\n"
               "(docs/gpu.md) route_wait_s, acquire_s, lookahead_s: decode seconds the host waited for the router's\n"
               "ids, spent in the device source's acquire, and in the lookahead.\n"
                              "Hybrid (--experts-on cpu|gpu|auto, --cpu-moe-layers N; docs/gpu.md): the probes' figures\n"
               "(pcie_h2d_gb_s pinned and pcie_pageable_gb_s, ram_read_gb_s, cpu_expert_gb_s), cpu_moe_layers\n"
               "and per decoded token the CPU layers' time in expert sums (hybrid_cpu_s_per_token), waiting\n"
               "for the device's router output, the upload tail, and the expert bytes the CPU read.\n"
               "--static-load read copies the static tier into huge-page memory at load (default mmap: served from\n"
               "the page-cache mapping); static_copied_bytes and anon_huge_bytes say what it holds. decode_cpu_s is the\n"
               "process CPU time of the decode loop, prefill_cpu_s of the prefill (with --threads 1: the work without\n"
               "time-sharing waits).\n"
               "--cpu-activations q8: int8 activations and integer dot products for MXFP4/INT4/Q8 weights on\n"
               "the CPU; bf16: BF16-rounded activations and vdpbf16ps for the BF16 decode matvec (AVX512_BF16\n"
               "CPUs); q8+bf16 both; q16 (q16+bf16): the q8 weights' decode matvecs with 16-bit activations as two\n"
               "int8 planes (default q16; f32 the exact kernels; docs/performance.md gives the error per fixture).\n"
               "--drop-cache evicts the model's files from the page cache first. decode_expert_hit_rate,\n"
               "decode_disk_bytes_per_token and decode_read_wait_s repeat hit_rate, expert_bytes_read_per_token\n"
               "and read_wait_s under their earlier names.\n"
               "On a device backend (--backend cuda|hip) mem_bw_gb_s is the device's copy bandwidth (1 GiB\n"
               "device-to-device copies, read + write; bw_source says which) and --profile decodes G more tokens\n"
               "with every op timed by device events: \"profile\" holds microseconds and calls per token by op,\n"
               "their sum, and the device time span (gaps between ops included); with MS_GPU_PROFILE_STALL_US=N\n"
               "each token's ops wait behind an N-microsecond device spin, so the events time the device alone;\n"
               "its tokens take the timed decode's path (the device pick: no logits download where it picks).\n"
               "argmax_us_per_token: the host time of the greedy pick between decoded tokens (part of decode);\n"
               "a device backend picks on the device (ms_engine_decode_greedy, greedy_on_device 1: one id per\n"
               "token comes back instead of the logits; MS_GPU_ARGMAX=0 turns it off).\n"
               "There the timed prefill follows\n"
               "one untimed warm-up prefill of the same prompt (kernel loading, the BLAS handle, scratch growth).\n"
               "--static-compare q8|fp8 opens the model twice, with the stored static tier and with it in that\n"
               "dtype (--static-store DIR when given, else requantized), and decodes R rounds (default 3) on\n"
               "each, alternating: one JSON line with both tiers' weight_bytes_per_token, decode tok/s and CPU\n"
               "seconds per round, bytes_ratio and the speedups (ratios of the medians).\n", usage);
        return 0;
    }
    ms_cli_opts eo;
    int64_t P = 128, G = 32;
    if (ms_cli_engine_args(argc, argv, &eo) || ms_arg_int(argc, argv, "--prompt-tokens", 1, 1 << 20, &P) ||
        ms_arg_int(argc, argv, "--gen-tokens", 1, 1 << 20, &G))
        return 2;
    int drop_cache = ms_arg_flag(argc, argv, "--drop-cache");
    int profile = ms_arg_flag(argc, argv, "--profile");
    const char *cmp = ms_arg_str(argc, argv, "--static-compare");
    int64_t rounds = 3;
    if (ms_arg_int(argc, argv, "--rounds", 1, 16, &rounds)) return 2;
    const char *dir = ms_cli_model_arg("bench", ms_arg_pos(argc, argv, 0));
    if (!dir || ms_args_unknown(argc, argv, "bench")) {
        fputs(usage, stderr);
        return 2;
    }
    if (cmp) { /* stored vs requantized in one run (cmd_bench_static.c) */
        ms_static_dtype d;
        ms_err derr = {0};
        if (ms_static_dtype_parse(cmp, &d, &derr)) {
            fprintf(stderr, "moonshine bench: --static-compare: %s\n", derr.msg);
            return 2;
        }
        return ms_cli_bench_static_compare(dir, &eo, d, P, G, (int)rounds);
    }
    ms_cli_ctx x;
    double t0 = ms_now();
    eo.defer_static_load = 1; /* after the page-cache drop below */
    if (!eo.ctx) eo.ctx = (int)(P + (profile ? 2 : 1) * G + 1);
    eo.hybrid_probe = eo.experts_on_given; /* the bandwidth probes go into the JSON line */
    if (ms_cli_open("bench", dir, &eo, &x)) return 1;
    double drive_bw = 0;
    if (x.experts) { /* streaming: the static tier in memory, the experts on the drive */
        const char *big = ms_streaming_largest_file(x.experts);
        char why[600];
        ms_err perr = {0};
        struct stat sb;
        uint64_t blk = 4u << 20; /* 4 MiB reads, smaller for a small file (>= 8 blocks) */
        if (big && stat(big, &sb) == 0)
            while (blk > 4096 && (uint64_t)sb.st_size < 8 * blk) blk /= 2;
        if (big && ms_io_probe_bandwidth(big, 1ull << 30, blk, 8, MS_IO_AUTO, &drive_bw, why, sizeof why, &perr))
            fprintf(stderr, "moonshine bench: drive probe: %s\n", perr.msg);
        if (drop_cache) ms_streaming_drop_page_cache(&x.model, x.experts);
        if (ms_cli_static_load("bench", &x)) {
            ms_cli_close(&x);
            return 1;
        }
        ms_streaming_prefault_static(&x.model, x.experts);
    } else {
        if (ms_cli_static_load("bench", &x)) {
            ms_cli_close(&x);
            return 1;
        }
        prefault(&x.model, 0);
    }
    double load_s = ms_now() - t0;
    const ms_config *c = &x.model.cfg;
    int32_t *toks = malloc((size_t)P * sizeof *toks);
    float *logits = malloc((size_t)c->vocab * sizeof *logits);
    int rc = 1;
    ms_err err = {0};
    if (!toks || !logits) goto done;
    uint64_t s = 0x243f6a8885a308d3ull;
    for (int64_t i = 0; i < P; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((s >> 33) % (uint64_t)c->vocab);
    }
    int device = x.backend != NULL && !x.backend->host_memory;
    double bw = device ? ms_cli_device_copy_bw(&x) / 1e9 : ms_measure_read_bandwidth(x.pool, 0);
    if (device) { /* an untimed warm-up prefill: kernel loading, the BLAS handle, scratch growth */
        if (ms_engine_forward(x.engine, toks, (int)P, logits, 0, &err)) goto fail;
        ms_engine_reset(x.engine);
    }
    double t1 = ms_now(), c1 = cpu_seconds();
    if (ms_engine_forward(x.engine, toks, (int)P, logits, 0, &err)) goto fail;
    double t2 = ms_now();
    uint64_t acq0 = ms_engine_get_stats(x.engine)->experts_acquired;
    ms_stream_stats ss0 = {0}, ss1 = {0};
    ms_engine_stats es0 = *ms_engine_get_stats(x.engine);
    if (x.experts) ms_streaming_stats(x.experts, &ss0);
    ms_device_experts_stats ds0 = {0}, ds1 = {0};
    if (x.dev_experts) ms_device_experts_stats_get(x.dev_experts, &ds0);
    /* --gpus: each stage's and the comm's counters before the decode */
    double st0[MS_MAX_DEVICES] = {0}, rx0[MS_MAX_DEVICES] = {0}, cs0 = 0;
    uint64_t cb0 = 0, cc0 = 0;
    for (int i = 0; x.stages && i < ms_engine_n_stages(x.engine); i++)
        st0[i] = ms_engine_stage_stats(x.engine, i)->stage_s, rx0[i] = ms_engine_stage_stats(x.engine, i)->remote_experts_s;
    if (x.comm) cb0 = x.comm->bytes, cc0 = x.comm->calls, cs0 = x.comm->seconds;
    ms_hybrid_stats hs0, hs1;
    ms_engine_hybrid_stats(x.engine, &hs0);
    double c2 = cpu_seconds(); /* = end of the prefill */
    double argmax_s = 0;
    int picked = 0; /* device backends: the engine picks the greedy token where the logits are (one id down) */
    int64_t best = 0; /* after the loop: the last pick when picked */
    for (int64_t i = 0, dev_pick = device; i < G; i++) {
        double ta = ms_now();
        if (!picked) best = greedy(logits, c->vocab);
        argmax_s += ms_now() - ta;
        int32_t tok = (int32_t)best, nx = 0;
        int rc2 = dev_pick ? ms_engine_decode_greedy(x.engine, tok, &nx, &err) : MS_ERR_UNSUPPORTED;
        if (rc2 == MS_ERR_UNSUPPORTED) dev_pick = 0, picked = 0, rc2 = ms_engine_forward(x.engine, &tok, 1, logits, 0, &err);
        else if (!rc2) picked = 1, best = nx;
        if (rc2) goto fail;
    }
    double t3 = ms_now(), c3 = cpu_seconds();
    if (x.experts) ms_streaming_stats(x.experts, &ss1);
    if (x.dev_experts) ms_device_experts_stats_get(x.dev_experts, &ds1);
    ms_engine_hybrid_stats(x.engine, &hs1);
    const ms_engine_stats *es1 = ms_engine_get_stats(x.engine);
    uint64_t acq = ms_engine_get_stats(x.engine)->experts_acquired - acq0;
    /* static tier read per token + experts actually used (per-expert bytes from layer tensors) */
    uint64_t expert_each = 0;
    for (int l = 0; l < c->n_layers && !expert_each; l++)
        if (x.model.layers[l].experts) {
            const ms_expert_view *v = &x.model.layers[l].experts[0];
            expert_each = ms_qmat_bytes(&v->gate) + ms_qmat_bytes(&v->up) + ms_qmat_bytes(&v->down);
        }
    uint64_t per_tok_static = ms_model_active_bytes(&x.model);
    uint64_t n_moe = 0;
    for (int l = 0; l < c->n_layers; l++) n_moe += c->layer_mlp[l] == MS_MLP_MOE;
    per_tok_static -= n_moe * (uint64_t)c->top_k * expert_each;
    double bytes_tok = (double)per_tok_static + (double)acq * (double)expert_each / (double)G;
    double dec = (double)G / (t3 - t2), pre = (double)P / (t2 - t1);
    double gbs = bytes_tok * dec / 1e9;
    char sj[4096] = "";
    if (x.experts) { /* decode-only deltas */
        uint64_t acq_d = ss1.acquires - ss0.acquires, hit_d = ss1.hits - ss0.hits, rd = ss1.bytes_read - ss0.bytes_read;
        uint64_t pi = ss1.prefetch_issued - ss0.prefetch_issued, pu = ss1.prefetch_used - ss0.prefetch_used;
        uint64_t lp = es1->lookahead_predicted - es0.lookahead_predicted, lc = es1->lookahead_correct - es0.lookahead_correct;
        double busy = ss1.busy_s - ss0.busy_s, wait = ss1.wait_s - ss0.wait_s;
        double floor_s = drive_bw > 0 ? (double)rd / drive_bw : 0;
        snprintf(sj, sizeof sj,
                 ",\"io\":\"%s\",\"cache_slots\":%d,\"slot_bytes\":%llu,\"expert_bytes_read_per_token\":%.0f,"
                 "\"hit_rate\":%.4f,\"prefetch_issued\":%llu,\"prefetch_used\":%llu,\"lookahead_accuracy\":%.4f,"
                 "\"read_gb_s\":%.3f,\"drive_gb_s\":%.3f,\"read_vs_drive\":%.3f,\"read_wait_s\":%.3f,"
                 "\"read_floor_s\":%.3f,\"wait_over_floor\":%.3f,\"decode_expert_hit_rate\":%.3f,"
                 "\"decode_disk_bytes_per_token\":%.0f,\"decode_read_wait_s\":%.3f",
                 ms_io_mode_name(ss1.mode), ss1.n_slots, (unsigned long long)ss1.slot_bytes, (double)rd / (double)G,
                 acq_d ? (double)hit_d / (double)acq_d : 0.0, (unsigned long long)pi, (unsigned long long)pu,
                 lp ? (double)lc / (double)lp : 0.0, busy > 0 ? rd / busy / 1e9 : 0.0, drive_bw / 1e9,
                 busy > 0 && drive_bw > 0 ? rd / busy / drive_bw : 0.0, wait, floor_s,
                 floor_s > 0 ? wait / floor_s : 0.0, acq_d ? (double)hit_d / (double)acq_d : 0.0,
                 (double)rd / (double)G, wait);
    }
    if (x.dev_experts) { /* the device slot arena the host cache feeds (decode-only deltas) */
        size_t k = strlen(sj);
        uint64_t rq = ds1.requests - ds0.requests, h = ds1.hits - ds0.hits, up = ds1.uploads - ds0.uploads;
        /* the disk floor: the bytes the device missed (each miss is one upload) read at the drive's
         * O_DIRECT bandwidth measured above, against the decode's wall time */
        double missed = (double)(ds1.upload_bytes - ds0.upload_bytes), dec_s = t3 - t2;
        double dfloor = drive_bw > 0 ? missed / drive_bw : 0;
        snprintf(sj + k, sizeof sj - k,
                 ",\"device_slots\":%d,\"device_slot_bytes\":%llu,\"device_hit_rate\":%.4f,"
                 "\"device_uploads_per_token\":%.2f,\"device_upload_bytes_per_token\":%.0f,"
                 "\"device_host_acquire_s\":%.3f,\"device_upload_s\":%.3f,\"device_pinned\":%d,"
                 "\"device_missed_bytes\":%.0f,\"decode_s\":%.3f,\"disk_floor_s\":%.3f,\"disk_floor_fraction\":%.3f,"
                 "\"lookahead_guessed\":%llu,\"lookahead_right\":%llu,\"lookahead_forwarded\":%llu,"
                 "\"lookahead_held\":%llu,\"gate_open\":%d,\"gate_precision\":%.3f,\"gate_need\":%.3f,"
                 "\"gate_gap_ms\":%.3f,\"gate_read_ms\":%.3f,\"route_wait_s\":%.3f,\"acquire_s\":%.3f,"
                 "\"lookahead_s\":%.3f",
                 ds1.n_slots, (unsigned long long)ds1.slot_bytes, rq ? (double)h / (double)rq : 0.0,
                 (double)up / (double)G, (double)(ds1.upload_bytes - ds0.upload_bytes) / (double)G,
                 ds1.inner_s - ds0.inner_s, ds1.upload_s - ds0.upload_s, ds1.pinned, missed, dec_s, dfloor,
                 dec_s > 0 ? dfloor / dec_s : 0.0, (unsigned long long)(ds1.pf_guessed - ds0.pf_guessed),
                 (unsigned long long)(ds1.pf_right - ds0.pf_right),
                 (unsigned long long)(ds1.pf_forwarded - ds0.pf_forwarded),
                 (unsigned long long)(ds1.pf_held - ds0.pf_held), ds1.gate_open, ds1.gate_precision, ds1.gate_need,
                 1e3 * ds1.gate_gap_s, 1e3 * ds1.gate_read_s, es1->route_wait_s - es0.route_wait_s,
                 es1->acquire_s - es0.acquire_s, es1->lookahead_s - es0.lookahead_s);
    }
    if (x.stages) { /* per device: decode seconds per token of its stage (synced at its hand-off), of that its
                     * experts' work for other stages, its ledger; the comm's bytes, calls and seconds per token */
        size_t k = strlen(sj);
        k += (size_t)snprintf(sj + k, sizeof sj - k, ",\"gpus\":\"%s\",\"devices\":[", eo.gpus);
        for (int i = 0; i < ms_engine_n_stages(x.engine) && k < sizeof sj; i++) {
            const ms_engine_stats *st = ms_engine_stage_stats(x.engine, i);
            const ms_dev_ledger *g = &x.placement.dev[i];
            k += (size_t)snprintf(sj + k, sizeof sj - k,
                                  "%s{\"device\":%d,\"layer_begin\":%d,\"layer_end\":%d,\"decode_s_per_token\":%.6f,"
                                  "\"remote_experts_s_per_token\":%.6f,\"total_bytes\":%llu,\"expert_bytes\":%llu}",
                                  i ? "," : "", x.gpu_ids[i], g->layer_begin, g->layer_end,
                                  (st->stage_s - st0[i]) / (double)G, (st->remote_experts_s - rx0[i]) / (double)G,
                                  (unsigned long long)g->total, (unsigned long long)g->expert_bytes);
        }
        if (k < sizeof sj)
            snprintf(sj + k, sizeof sj - k,
                     "],\"comm_bytes_per_token\":%.0f,\"comm_calls_per_token\":%.2f,\"comm_s_per_token\":%.6f",
                     (double)(x.comm->bytes - cb0) / (double)G, (double)(x.comm->calls - cc0) / (double)G,
                     (x.comm->seconds - cs0) / (double)G);
    }
    if (x.measured || hs1.cpu_layers) { /* hybrid execution: the probes and the CPU layers' decode deltas */
        size_t k = strlen(sj);
        double cs = hs1.cpu_s - hs0.cpu_s, eb = (double)(hs1.expert_bytes - hs0.expert_bytes);
        snprintf(sj + k, sizeof sj - k,
                 ",\"experts_on\":\"%s\",\"cpu_moe_layers\":%d,\"pcie_h2d_gb_s\":%.3f,\"pcie_pageable_gb_s\":%.3f,"
                 "\"ram_read_gb_s\":%.3f,\"cpu_expert_gb_s\":%.3f,\"auto_device_budget_mib\":%.1f,"
                 "\"hybrid_cpu_s_per_token\":%.6f,\"hybrid_wait_s_per_token\":%.6f,\"hybrid_tail_s_per_token\":%.6f,"
                 "\"hybrid_cpu_expert_bytes_per_token\":%.0f,\"hybrid_cpu_gb_s\":%.3f,"
                 "\"hybrid_gpu_share\":%.3f,\"hybrid_gpu_experts_per_token\":%.2f,\"hybrid_gpu_bytes_per_token\":%.0f,"
                 "\"hybrid_gpu_queue_s_per_token\":%.6f,\"hybrid_gpu_pinned\":%d",
                 ms_experts_on_name(eo.experts_on), hs1.cpu_layers, x.measure.pcie_h2d_gb_s,
                 x.measure.pcie_pageable_gb_s, x.measure.ram_read_gb_s, x.measure.cpu_expert_gb_s,
                 x.device_budget / 1048576.0, cs / (double)G, (hs1.wait_s - hs0.wait_s) / (double)G,
                 (hs1.tail_s - hs0.tail_s) / (double)G, eb / (double)G, cs > 0 ? eb / cs / 1e9 : 0.0,
                 x.hybrid.gpu_share, (double)(hs1.gpu_experts - hs0.gpu_experts) / (double)G,
                 (double)(hs1.gpu_expert_bytes - hs0.gpu_expert_bytes) / (double)G,
                 (hs1.gpu_queue_s - hs0.gpu_queue_s) / (double)G, hs1.gpu_pinned);
    }
    char pj[4096] = "";
    if (profile && device) { /* G more tokens, each op timed (after the timed run: events cost time) */
        if (ms_cli_profile(&x, 1)) goto done;
        /* the timed loop's path: the pick on the device where it was (no logits download), else the host's */
        int pp = picked;
        if (!pp) best = greedy(logits, c->vocab);
        for (int64_t i = 0; i < G; i++) {
            int32_t tok = (int32_t)best, nx = 0;
            int rc2 = pp ? ms_engine_decode_greedy(x.engine, tok, &nx, &err) : MS_ERR_UNSUPPORTED;
            if (rc2 == MS_ERR_UNSUPPORTED) pp = 0, rc2 = ms_engine_forward(x.engine, &tok, 1, logits, 0, &err);
            if (rc2) goto fail;
            best = pp ? nx : greedy(logits, c->vocab);
        }
        memcpy(pj, ",\"profile\":", 11);
        if (ms_cli_profile_json(&x, (int)G, pj + 11, sizeof pj - 12) <= 0) pj[0] = 0;
        ms_cli_profile(&x, 0);
    }
    printf("{\"model\":\"%s\",\"arch\":\"%s\",\"threads\":%d,\"load_s\":%.3f,\"prompt_tokens\":%lld,\"prefill_tok_s\":%.2f,"
           "\"gen_tokens\":%lld,\"decode_tok_s\":%.3f,\"weight_bytes_per_token\":%.0f,\"achieved_gb_s\":%.2f,"
           "\"mem_bw_gb_s\":%.2f,\"bw_fraction\":%.3f,\"static_bytes\":%llu,\"expert_bytes\":%llu,"
           "\"static_load\":\"%s\",\"static_copied_bytes\":%llu,\"anon_huge_bytes\":%llu,\"decode_cpu_s\":%.3f,"
           "\"decode_tok_per_cpu_s\":%.3f,\"prefill_cpu_s\":%.3f,\"argmax_us_per_token\":%.1f,\"greedy_on_device\":%d,"
           "\"backend\":\"%s\",\"bw_source\":\"%s\"%s%s}\n",
           dir, c->model_type, x.threads, load_s, (long long)P, pre, (long long)G, dec, bytes_tok, gbs, bw,
           bw > 0 ? gbs / bw : 0.0, (unsigned long long)x.model.static_bytes, (unsigned long long)x.model.expert_bytes,
           x.static_load == MS_STATIC_READ ? "read" : "mmap", (unsigned long long)x.model.static_copied,
           (unsigned long long)anon_huge_bytes(), c3 - c2, c3 > c2 ? (double)G / (c3 - c2) : 0.0, c2 - c1,
           G > 0 ? 1e6 * argmax_s / (double)G : 0.0, picked, device ? x.backend->name : "cpu", device ? "device_copy" : "host_read", sj, pj);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "moonshine bench: %s\n", err.msg);
done:
    free(toks);
    free(logits);
    ms_cli_close(&x);
    return rc;
}
