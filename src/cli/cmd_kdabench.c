/* cmd_kdabench.c — `moonshine kdabench`: prefill speed of the chunked KDA
 * delta rule against stepping token by token, at Kimi-Linear-48B-A3B
 * proportions (hidden 2304, 32 KDA heads x 128, short conv 4: the defaults of
 * KimiLinearConfig), printed as JSON. Optionally the whole KDA mixer of a
 * layer (projections included) with random BF16 weights. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "backend/cpu/linear_attn.h"
#include "ops/kda.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rs = 0x2545f4914f6cdd1dull;
static double urand(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return ((rs >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static float nrand(void) { return (float)(sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand())); }

static float *randn(size_t n, float sd) {
    float *x = malloc(n * sizeof *x);
    if (x)
        for (size_t i = 0; i < n; i++) x[i] = nrand() * sd;
    return x;
}

/* A BF16 [rows, cols] weight with N(0, 1/cols) entries (owned by the caller via ->data). */
static ms_qmat rand_bf16(int64_t rows, int64_t cols, float sd) {
    uint16_t *d = malloc((size_t)(rows * cols) * sizeof *d);
    if (d)
        for (int64_t i = 0; i < rows * cols; i++) d[i] = ms_f32_to_bf16(nrand() * sd);
    ms_qmat m = {.dtype = MS_DT_BF16, .rows = rows, .cols = cols, .data = d};
    return m;
}

typedef struct {
    int hidden, heads, dk, conv, chunk;
} dims;

/* The delta rule alone over n tokens: chunked vs recurrent, same inputs. */
static int bench_core(ms_pool *pool, const dims *D, int n, int reps, FILE *out) {
    const int H = D->heads, d = D->dk, C = H * d;
    size_t nc = (size_t)n * C;
    float *q = randn(nc, 1), *k = randn(nc, 1), *v = randn(nc, 1), *g = randn(nc, 2), *beta = randn((size_t)n * H, 1);
    float *o1 = malloc(nc * 4), *o2 = malloc(nc * 4), *S1 = calloc((size_t)H * d * d, 4), *S2 = calloc((size_t)H * d * d, 4);
    float *alog = malloc(H * 4), *bias = malloc((size_t)C * 4);
    if (!q || !k || !v || !g || !beta || !o1 || !o2 || !S1 || !S2 || !alog || !bias) {
        fprintf(stderr, "moonshine kdabench: out of memory for %d tokens\n", n);
        return 1;
    }
    for (int h = 0; h < H; h++) alog[h] = logf(1 + 15 * (float)urand());
    for (int i = 0; i < C; i++) {
        double dt = exp(log(1e-3) + urand() * (log(1e-1) - log(1e-3)));
        bias[i] = (float)(dt + log(-expm1(-dt)));
    }
    ms_qmat A = {.dtype = MS_DT_F32, .rows = 1, .cols = H, .data = alog};
    ms_qmat B = {.dtype = MS_DT_F32, .rows = 1, .cols = C, .data = bias};
    ms_err err = {0};
    double tg = now_s();
    if (ms_decay_gate(pool, g, C, n, H, d, &A, &B, MS_DECAY_SOFTPLUS, 0, &err)) {
        fprintf(stderr, "moonshine kdabench: %s\n", err.msg);
        return 1;
    }
    tg = now_s() - tg;
    ms_sigmoid_rows(beta, H, n, H);
    ms_delta_args a = {.n = n, .n_qk_heads = H, .n_v_heads = H, .dk = d, .dv = d, .q = q, .k = k, .v = v, .g = g,
                       .beta = beta, .ld_q = C, .ld_k = C, .ld_v = C, .ld_g = C, .ld_beta = H, .qk_l2norm = 1,
                       .l2_eps = 1e-6f, .scale = 1 / sqrtf((float)d), .o = o1, .ld_o = C};
    double best_c = 1e30, best_r = 1e30, cpu_c = 1e30, cpu_r = 1e30;
    for (int r = 0; r < reps; r++) {
        memset(S1, 0, (size_t)H * d * d * 4);
        a.o = o1;
        double t = now_s(), u = cpu_s();
        if (ms_delta_chunked(pool, &a, S1, D->chunk, &err)) break;
        t = now_s() - t, u = cpu_s() - u;
        if (t < best_c) best_c = t;
        if (u < cpu_c) cpu_c = u;
        memset(S2, 0, (size_t)H * d * d * 4);
        a.o = o2;
        t = now_s(), u = cpu_s();
        if (ms_delta_recurrent(pool, &a, S2, &err)) break;
        t = now_s() - t, u = cpu_s() - u;
        if (t < best_r) best_r = t;
        if (u < cpu_r) cpu_r = u;
    }
    if (err.code) {
        fprintf(stderr, "moonshine kdabench: %s\n", err.msg);
        return 1;
    }
    double md = 0, mo = 0;
    for (size_t i = 0; i < nc; i++) md = fmax(md, fabs(o1[i] - o2[i])), mo = fmax(mo, fabs(o2[i]));
    fprintf(out,
            "    {\"tokens\": %d, \"chunked_tok_s\": %.1f, \"recurrent_tok_s\": %.1f, \"speedup\": %.2f, "
            "\"chunked_s\": %.4f, \"recurrent_s\": %.4f, \"chunked_cpu_s\": %.4f, \"recurrent_cpu_s\": %.4f, "
            "\"gate_s\": %.4f, \"max_abs_diff\": %.3g, \"max_abs_out\": %.3g}",
            n, n / best_c, n / best_r, best_r / best_c, best_c, best_r, cpu_c, cpu_r, tg, md, mo);
    free(q), free(k), free(v), free(g), free(beta), free(o1), free(o2), free(S1), free(S2), free(alog), free(bias);
    return 0;
}

/* The whole KDA mixer: prefill of n tokens in one call (chunked) vs tbt tokens one call each. */
static int bench_layer(ms_pool *pool, const dims *D, int n, int tbt, FILE *out) {
    const int H = D->heads, d = D->dk, C = H * d, Dm = D->hidden;
    ms_kda_config cfg = {.hidden = Dm, .heads = H, .head_dim = d, .conv_kernel = D->conv, .decay = MS_DECAY_SOFTPLUS,
                         .full_rank_gate = 0, .norm_eps = 1e-5f};
    ms_kda_weights w;
    memset(&w, 0, sizeof w);
    float si = 1 / sqrtf((float)Dm), sd = 1 / sqrtf((float)d), sc = 1 / sqrtf((float)C);
    w.q_proj = rand_bf16(C, Dm, si), w.k_proj = rand_bf16(C, Dm, si), w.v_proj = rand_bf16(C, Dm, si);
    w.q_conv = rand_bf16(C, D->conv, 0.5f), w.k_conv = rand_bf16(C, D->conv, 0.5f), w.v_conv = rand_bf16(C, D->conv, 0.5f);
    w.f_a = rand_bf16(d, Dm, si), w.f_b = rand_bf16(C, d, sd), w.b_proj = rand_bf16(H, Dm, si);
    w.g_a = rand_bf16(d, Dm, si), w.g_b = rand_bf16(C, d, sd), w.o_proj = rand_bf16(Dm, C, sc);
    w.A_log = rand_bf16(1, H, 0.5f), w.dt_bias = rand_bf16(1, C, 1.0f), w.o_norm = rand_bf16(1, d, 1.0f);
    float *x = randn((size_t)n * Dm, 1), *y = malloc((size_t)n * Dm * 4);
    ms_kda_state st;
    ms_err err = {0};
    int rc = ms_kda_state_init(&st, &cfg, &err);
    double tp = 0, tt = 0;
    if (!rc && x && y) {
        tp = now_s();
        rc = ms_kda_forward(pool, &cfg, &w, &st, x, n, y, MS_KDA_CHUNKED, &err);
        tp = now_s() - tp;
        ms_kda_state_reset(&st);
        tt = now_s();
        for (int t = 0; t < tbt && !rc; t++)
            rc = ms_kda_forward(pool, &cfg, &w, &st, x + (size_t)t * Dm, 1, y + (size_t)t * Dm, MS_KDA_RECURRENT, &err);
        tt = now_s() - tt;
    }
    if (rc) fprintf(stderr, "moonshine kdabench: %s\n", err.msg);
    else
        fprintf(out, "    {\"tokens\": %d, \"chunked_prefill_tok_s\": %.1f, \"token_by_token_tok_s\": %.1f, "
                     "\"token_by_token_measured_tokens\": %d}", n, n / tp, tbt / tt, tbt);
    ms_qmat *all[] = {&w.q_proj, &w.k_proj, &w.v_proj, &w.q_conv, &w.k_conv, &w.v_conv, &w.f_a, &w.f_b,
                      &w.b_proj, &w.g_a, &w.g_b, &w.o_proj, &w.A_log, &w.dt_bias, &w.o_norm};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free((void *)all[i]->data);
    ms_kda_state_free(&st);
    free(x), free(y);
    return rc ? 1 : 0;
}

/* End to end on a checkpoint: prefill of n tokens in one engine call (KDA layers
 * chunked) against the same tokens fed one decode step at a time (KDA layers
 * recurrent), measured over the first tbt tokens; then decode steps after the
 * prefill. Token ids are deterministic pseudo-random. */
static int bench_model(const char *dir, int threads, const int *toks, int nt, int tbt) {
    int maxn = 0;
    for (int i = 0; i < nt; i++) maxn = toks[i] > maxn ? toks[i] : maxn;
    ms_cli_ctx x;
    ms_cli_opts eo;
    ms_cli_opts_init(&eo);
    eo.threads = threads;
    eo.ctx = maxn + tbt + 1;
    if (ms_cli_open("kdabench", dir, &eo, &x)) return 1;
    const ms_config *c = &x.model.cfg;
    int n_kda = 0;
    for (int l = 0; l < c->n_layers; l++) n_kda += c->layer_attn[l] == MS_ATTN_KDA;
    int32_t *ids = malloc(sizeof *ids * (size_t)(maxn + tbt));
    float *logits = malloc(sizeof *logits * (size_t)c->vocab);
    int rc = !ids || !logits;
    for (int i = 0; i < maxn + tbt && !rc; i++) ids[i] = (int32_t)(urand() * (double)c->vocab) % (int32_t)c->vocab;
    printf("{\n  \"bench\": \"kda_model\", \"model\": \"%s\", \"model_type\": \"%s\", \"layers\": %lld, "
           "\"kda_layers\": %d, \"threads\": %d, \"load_s\": %.2f,\n  \"runs\": [\n",
           dir, c->model_type, (long long)c->n_layers, n_kda, x.threads, x.load_seconds);
    ms_err err = {0};
    for (int i = 0; i < nt && !rc; i++) {
        int n = toks[i], m = tbt < n ? tbt : n;
        ms_engine_reset(x.engine);
        double t = now_s();
        rc = ms_engine_forward(x.engine, ids, n, logits, 0, &err);
        double tp = now_s() - t;
        double td = 0;
        t = now_s();
        for (int k = 0; k < m && !rc; k++) rc = ms_engine_forward(x.engine, ids + n + k, 1, logits, 0, &err);
        td = now_s() - t;
        ms_engine_reset(x.engine);
        t = now_s();
        for (int k = 0; k < m && !rc; k++) rc = ms_engine_forward(x.engine, ids + k, 1, logits, 0, &err);
        double tt = now_s() - t;
        if (rc) break;
        printf("    {\"prompt_tokens\": %d, \"prefill_chunked_tok_s\": %.2f, \"prefill_s\": %.3f, "
               "\"token_by_token_tok_s\": %.2f, \"token_by_token_measured_tokens\": %d, "
               "\"decode_tok_s_after_prefill\": %.2f}%s\n",
               n, n / tp, tp, m / tt, m, m / td, i + 1 < nt ? "," : "");
        fflush(stdout);
    }
    printf("  ]\n}\n");
    if (rc && err.code) fprintf(stderr, "moonshine kdabench: %s\n", err.msg);
    free(ids);
    free(logits);
    ms_cli_close(&x);
    return rc ? 1 : 0;
}

int cmd_kdabench(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("usage: moonshine kdabench [--tokens 1024,4096] [--threads N] [--reps 2] [--heads 32]\n"
               "         [--head-dim 128] [--hidden 2304] [--conv 4] [--chunk 64]\n"
               "         [--layer-tokens N] [--layer-tbt-tokens 32]\n"
               "Times the KDA delta rule (random inputs, softplus decay gate) in its chunked form\n"
               "against the token-by-token recurrence at each token count, best of --reps (wall\n"
               "and process CPU seconds: on a shared machine CPU time is the steadier one), and\n"
               "prints JSON. Defaults are Kimi-Linear-48B-A3B's KDA layer. --layer-tokens N also\n"
               "times the whole KDA mixer with random BF16 weights: one chunked prefill call\n"
               "over N tokens against --layer-tbt-tokens single-token (decode) calls.\n"
               "With --model DIR (e.g. a `moonshine synth` checkpoint) it runs the whole engine\n"
               "instead: a prefill of each --tokens count in one call (KDA chunked) against\n"
               "--layer-tbt-tokens tokens fed one decode step at a time (KDA recurrent), and\n"
               "decode steps after the prefill.\n");
        return 0;
    }
    int64_t threads = 0, reps = 2, heads = 32, hd = 128, hidden = 2304, conv = 4, chunk = 64, ltok = 0, ltbt = 32;
    if (ms_arg_int(argc, argv, "--threads", 0, 1024, &threads) || ms_arg_int(argc, argv, "--reps", 1, 100, &reps) ||
        ms_arg_int(argc, argv, "--heads", 1, 1024, &heads) || ms_arg_int(argc, argv, "--head-dim", 1, 1024, &hd) ||
        ms_arg_int(argc, argv, "--hidden", 1, 65536, &hidden) || ms_arg_int(argc, argv, "--conv", 1, 16, &conv) ||
        ms_arg_int(argc, argv, "--chunk", 1, 256, &chunk) ||
        ms_arg_int(argc, argv, "--layer-tokens", 0, 1 << 20, &ltok) ||
        ms_arg_int(argc, argv, "--layer-tbt-tokens", 1, 1 << 20, &ltbt))
        return 2;
    const char *tok = ms_arg_str(argc, argv, "--tokens");
    const char *model = ms_arg_str(argc, argv, "--model");
    if (ms_args_unknown(argc, argv, "kdabench")) return 2;
    int toks[16], nt = 0;
    const char *s = tok ? tok : "1024,4096";
    while (*s && nt < 16) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > (1 << 20) || (*end && *end != ',')) {
            fprintf(stderr, "moonshine kdabench: --tokens wants a comma-separated list of counts, got \"%s\"\n", tok);
            return 2;
        }
        toks[nt++] = (int)v;
        s = *end ? end + 1 : end;
    }
    if (model) return bench_model(model, (int)threads, toks, nt, (int)ltbt);
    ms_pool *pool = ms_pool_create((int)threads);
    if (!pool) {
        fprintf(stderr, "moonshine kdabench: cannot start threads\n");
        return 1;
    }
    dims D = {(int)hidden, (int)heads, (int)hd, (int)conv, (int)chunk};
    printf("{\n  \"bench\": \"kda\", \"threads\": %d, \"heads\": %d, \"head_dim\": %d, \"hidden\": %d, "
           "\"conv_kernel\": %d, \"chunk\": %d,\n  \"delta_rule\": [\n",
           ms_pool_size(pool), D.heads, D.dk, D.hidden, D.conv, D.chunk);
    int rc = 0;
    for (int i = 0; i < nt && !rc; i++) {
        rc = bench_core(pool, &D, toks[i], (int)reps, stdout);
        printf(i + 1 < nt ? ",\n" : "\n");
        fflush(stdout);
    }
    printf("  ]");
    if (ltok > 0 && !rc) {
        printf(",\n  \"kda_mixer\": [\n");
        rc = bench_layer(pool, &D, (int)ltok, (int)(ltbt < ltok ? ltbt : ltok), stdout);
        printf("\n  ]");
    }
    printf("\n}\n");
    ms_pool_destroy(pool);
    return rc;
}
