/* cmd_bench_batch.c — `moonshine bench-batch MODEL_DIR`: aggregate decode
 * throughput of K concurrent sequences stepped together (ms_engine_decode_batch),
 * for each K of --batches, in interleaved rounds (every K once per round, the
 * order alternating), so a noisy shared machine moves all of them alike. One
 * JSON line: per K each round's aggregate decode tok/s and tok per CPU-second,
 * their medians, the median over rounds of the ratio to K = 1 in the same round,
 * and with streamed experts the expert bytes read from disk per generated token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/streaming.h"

#define MAX_K 64
#define MAX_LIST 8
#define MAX_ROUNDS 16

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    double t[MAX_ROUNDS];
    memcpy(t, v, sizeof *t * (size_t)n);
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static int32_t argmax(const float *x, int64_t V) {
    int32_t b = 0;
    for (int64_t v = 1; v < V; v++)
        if (x[v] > x[b]) b = (int32_t)v;
    return b;
}

typedef struct {
    double tok_s, tok_cpu, disk_per_tok;
} one_run;

/* K sequences: reset, prefill each with its own random prompt, then G batched decode steps (timed). */
static int run_k(ms_engine **es, int K, int64_t P, int64_t G, int64_t V, ms_expert_source *src, uint64_t seed,
                 float *logits, one_run *out, ms_err *err) {
    int32_t prompt[4096], tok[MAX_K];
    for (int i = 0; i < K; i++) {
        ms_engine_reset(es[i]);
        uint64_t s = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        for (int64_t t = 0; t < P; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            prompt[t] = (int32_t)((s >> 33) % (uint64_t)V);
        }
        int rc = ms_engine_forward(es[i], prompt, (int)P, logits + (size_t)i * V, 0, err);
        if (rc) return rc;
        tok[i] = argmax(logits + (size_t)i * V, V);
    }
    ms_stream_stats s0 = {0}, s1 = {0};
    if (src) ms_streaming_stats(src, &s0);
    double t0 = ms_now(), c0 = cpu_s();
    for (int64_t g = 0; g < G; g++) {
        int rc = ms_engine_decode_batch(es, K, tok, logits, err);
        if (rc) return rc;
        for (int i = 0; i < K; i++) tok[i] = argmax(logits + (size_t)i * V, V);
    }
    double t1 = ms_now(), c1 = cpu_s();
    if (src) ms_streaming_stats(src, &s1);
    double n = (double)K * (double)G;
    out->tok_s = n / (t1 - t0);
    out->tok_cpu = c1 > c0 ? n / (c1 - c0) : 0;
    out->disk_per_tok = src ? (double)(s1.bytes_read - s0.bytes_read) / n : 0;
    return MS_OK;
}

int cmd_bench_batch(int argc, char **argv) {
    const char *usage = "usage: moonshine bench-batch MODEL_DIR [--batches 1,2,4,8] [--prompt-tokens P] [--gen-tokens G]\n"
                        "                              [--rounds R] [--threads T] [streaming flags as for bench]\n";
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%sFor each K of --batches (default 1,2,4,8): K sequences, each prefilled with its own random\n"
               "P-token prompt (default 16), then G (default 16) decode steps of all K together\n"
               "(ms_engine_decode_batch: one forward per step, the union of the K rows' experts acquired once\n"
               "per layer). R rounds (default 3), every K once per round, the order reversed every other\n"
               "round. Prints one JSON line: per K the aggregate decode tok/s and tok per process CPU-second\n"
               "of each round, their medians, speedup = the median over rounds of tok_s(K) / tok_s(1) of\n"
               "the same round (cpu_speedup likewise), and with streamed experts (--expert-cache-mib N ...)\n"
               "the expert bytes read from disk per generated token and its ratio to K = 1.\n",
               usage);
        return 0;
    }
    ms_cli_opts eo;
    int64_t P = 16, G = 16, R = 3;
    if (ms_cli_engine_args(argc, argv, &eo) || ms_arg_int(argc, argv, "--prompt-tokens", 1, 4096, &P) ||
        ms_arg_int(argc, argv, "--gen-tokens", 1, 1 << 20, &G) || ms_arg_int(argc, argv, "--rounds", 1, MAX_ROUNDS, &R))
        return 2;
    int ks[MAX_LIST], nk = 0, kmax = 1;
    const char *bl = ms_arg_str(argc, argv, "--batches");
    if (!bl) bl = "1,2,4,8";
    for (const char *p = bl; *p && nk < MAX_LIST;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > MAX_K || (*end && *end != ',')) {
            fprintf(stderr, "moonshine bench-batch: --batches wants a list like 1,2,4,8 (each 1..%d)\n", MAX_K);
            return 2;
        }
        ks[nk++] = (int)v;
        if (v > kmax) kmax = (int)v;
        p = *end ? end + 1 : end;
    }
    const char *dir = ms_cli_model_arg("bench-batch", ms_arg_pos(argc, argv, 0));
    if (!dir || ms_args_unknown(argc, argv, "bench-batch")) {
        fputs(usage, stderr);
        return 2;
    }
    if (!eo.ctx) eo.ctx = (int)(P + G + 1);
    ms_cli_ctx x;
    if (ms_cli_open("bench-batch", dir, &eo, &x)) return 1;
    if (x.experts) ms_streaming_prefault_static(&x.model, x.experts);
    const ms_config *c = &x.model.cfg;
    int64_t V = c->vocab;
    ms_engine *es[MAX_K] = {0};
    int rc = 1;
    ms_err err = {0};
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)kmax);
    if (!logits) goto done;
    /* the sequences' engines: the same model, pool, backend and expert source; es[0] (the lead) holds kmax rows */
    for (int i = 0; i < kmax; i++) {
        ms_engine_opts o = {.max_ctx = eo.ctx, .max_batch = kmax > 16 ? kmax : 16, .pool = x.pool,
                            .experts = ms_cli_engine_experts(&x), .mla_form = eo.mla_form, .backend = x.backend,
                            .weights_from = i ? es[0] : NULL, /* one placement of the weights on a device */
                            .stages = x.stages, .hybrid = ms_cli_hybrid(&x)};
        if (ms_engine_create(&x.model, &o, &es[i], &err)) goto fail;
    }
    char load0[64] = "";
    FILE *la = fopen("/proc/loadavg", "r");
    if (la && !fgets(load0, sizeof load0, la)) load0[0] = 0;
    if (la) fclose(la);
    one_run res[MAX_LIST][MAX_ROUNDS];
    /* warm-up: one untimed short run at the largest K (faults the weights in, settles the caches) */
    one_run w;
    if ((rc = run_k(es, kmax, P, G < 4 ? G : 4, V, x.experts, 1, logits, &w, &err))) goto fail;
    rc = 1;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < nk; j++) {
            int i = r % 2 ? nk - 1 - j : j;
            fprintf(stderr, "bench-batch: round %d K=%d\n", r + 1, ks[i]);
            if (run_k(es, ks[i], P, G, V, x.experts, 1000 + (uint64_t)r, logits, &res[i][r], &err)) goto fail;
        }
    char load1[64] = "";
    la = fopen("/proc/loadavg", "r");
    if (la && !fgets(load1, sizeof load1, la)) load1[0] = 0;
    if (la) fclose(la);
    load0[strcspn(load0, " ")] = 0; /* the 1-minute load */
    load1[strcspn(load1, " ")] = 0;
    int base = -1;
    for (int i = 0; i < nk; i++)
        if (ks[i] == 1) base = i;
    printf("{\"model\":\"%s\",\"arch\":\"%s\",\"threads\":%d,\"prompt_tokens\":%lld,\"gen_tokens\":%lld,\"rounds\":%lld,"
           "\"streamed\":%s,\"load_1m_before\":%s,\"load_1m_after\":%s,\"batches\":[",
           dir, c->model_type, x.threads, (long long)P, (long long)G, (long long)R, x.experts ? "true" : "false",
           load0[0] ? load0 : "null", load1[0] ? load1 : "null");
    for (int i = 0; i < nk; i++) {
        double ts[MAX_ROUNDS], tc[MAX_ROUNDS], sp[MAX_ROUNDS], cs[MAX_ROUNDS], dk[MAX_ROUNDS];
        for (int r = 0; r < R; r++) {
            ts[r] = res[i][r].tok_s, tc[r] = res[i][r].tok_cpu, dk[r] = res[i][r].disk_per_tok;
            sp[r] = base >= 0 ? res[i][r].tok_s / res[base][r].tok_s : 0;
            cs[r] = base >= 0 ? res[i][r].tok_cpu / res[base][r].tok_cpu : 0;
        }
        printf("%s{\"k\":%d,\"decode_tok_s\":[", i ? "," : "", ks[i]);
        for (int r = 0; r < R; r++) printf("%s%.3f", r ? "," : "", ts[r]);
        printf("],\"decode_tok_per_cpu_s\":[");
        for (int r = 0; r < R; r++) printf("%s%.3f", r ? "," : "", tc[r]);
        printf("],\"median_tok_s\":%.3f,\"median_tok_per_cpu_s\":%.3f", median(ts, (int)R), median(tc, (int)R));
        if (base >= 0) printf(",\"speedup\":%.3f,\"cpu_speedup\":%.3f", median(sp, (int)R), median(cs, (int)R));
        if (x.experts) {
            double d = median(dk, (int)R), d1 = 0;
            if (base >= 0) {
                double b1[MAX_ROUNDS];
                for (int r = 0; r < R; r++) b1[r] = res[base][r].disk_per_tok;
                d1 = median(b1, (int)R);
            }
            printf(",\"disk_bytes_per_token\":%.0f", d);
            if (d1 > 0) printf(",\"disk_bytes_per_token_vs_k1\":%.3f", d / d1);
        }
        printf("}");
    }
    printf("]}\n");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "moonshine bench-batch: %s\n", err.msg);
    rc = 1;
done:
    for (int i = kmax - 1; i >= 0; i--) ms_engine_destroy(es[i]); /* es[0] holds the shared weights */
    free(logits);
    ms_cli_close(&x);
    return rc;
}
