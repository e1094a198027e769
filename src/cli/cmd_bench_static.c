/* cmd_bench_static.c — `moonshine bench MODEL_DIR --static-compare q8|fp8`: the stored static
 * tier and the requantized one decoding in one run, interleaved (cli/common.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/common.h"

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

/* Weight bytes a decoded token reads: the static tier's matrices it uses, plus the experts it acquired
 * (acq over g tokens); as cmd_bench's weight_bytes_per_token. */
static double bytes_per_token(const ms_cli_ctx *x, uint64_t acq, int64_t g) {
    const ms_config *c = &x->model.cfg;
    uint64_t each = 0, n_moe = 0;
    for (int l = 0; l < c->n_layers && !each; l++)
        if (x->model.layers[l].experts) {
            const ms_expert_view *v = &x->model.layers[l].experts[0];
            each = ms_qmat_bytes(&v->gate) + ms_qmat_bytes(&v->up) + ms_qmat_bytes(&v->down);
        }
    for (int l = 0; l < c->n_layers; l++) n_moe += c->layer_mlp[l] == MS_MLP_MOE;
    uint64_t st = ms_model_active_bytes(&x->model) - n_moe * (uint64_t)c->top_k * each;
    return (double)st + (double)acq * (double)each / (double)g;
}

typedef struct {
    double wall[16], cpu[16], bytes;
    int32_t last[64]; /* the greedy ids of the last round (compared between the tiers) */
} side;

/* Reset, prefill the P tokens, decode G greedily: wall and CPU seconds of the decode. */
static int one_round(ms_cli_ctx *x, const int32_t *toks, int64_t P, int64_t G, float *logits, side *s, int r) {
    ms_err err = {0};
    const int64_t V = x->model.cfg.vocab;
    ms_engine_reset(x->engine);
    if (ms_engine_forward(x->engine, toks, (int)P, logits, 0, &err)) goto fail;
    uint64_t acq0 = ms_engine_get_stats(x->engine)->experts_acquired;
    double t0 = ms_now(), c0 = cpu_s();
    for (int64_t i = 0; i < G; i++) {
        int32_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = (int32_t)v;
        if (i < 64) s->last[i] = best;
        if (ms_engine_forward(x->engine, &best, 1, logits, 0, &err)) goto fail;
    }
    s->wall[r] = ms_now() - t0, s->cpu[r] = cpu_s() - c0;
    s->bytes = bytes_per_token(x, ms_engine_get_stats(x->engine)->experts_acquired - acq0, G);
    return 0;
fail:
    fprintf(stderr, "moonshine bench: %s\n", err.msg);
    return 1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(const double *v, int n) {
    double t[16];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void arr(char *out, size_t cap, const double *v, int n, double scale_num) {
    size_t k = 0;
    k += (size_t)snprintf(out + k, cap - k, "[");
    for (int i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%.3f", i ? "," : "", scale_num > 0 ? scale_num / v[i] : v[i]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

int ms_cli_bench_static_compare(const char *dir, const ms_cli_opts *eo, ms_static_dtype d, int64_t P, int64_t G,
                                int rounds) {
    if (eo->stream) {
        fprintf(stderr, "moonshine bench: --static-compare runs the experts resident (no streaming options)\n");
        return 2;
    }
    if (d == MS_STATIC_STORED || rounds < 1 || rounds > 16) {
        fprintf(stderr, "moonshine bench: --static-compare q8|fp8 (1..16 rounds)\n");
        return 2;
    }
    ms_cli_opts oa = *eo, ob = *eo;
    oa.static_dtype = MS_STATIC_STORED, oa.static_store = NULL;
    ob.static_dtype = eo->static_store ? eo->static_dtype : d;
    if (!oa.ctx) oa.ctx = ob.ctx = (int)(P + G + 1);
    ms_cli_ctx a, b;
    double t0 = ms_now();
    if (ms_cli_open("bench", dir, &oa, &a)) return 1;
    double la = ms_now() - t0;
    t0 = ms_now();
    if (ms_cli_open("bench", dir, &ob, &b)) {
        ms_cli_close(&a);
        return 1;
    }
    double lb = ms_now() - t0;
    int rc = 1;
    if (b.model.static_dtype != (int)d) {
        fprintf(stderr, "moonshine bench: the compared tier is %s, not %s\n",
                ms_static_dtype_name((ms_static_dtype)b.model.static_dtype), ms_static_dtype_name(d));
        goto done;
    }
    const ms_config *c = &a.model.cfg;
    int32_t *toks = malloc((size_t)P * sizeof *toks);
    float *logits = malloc((size_t)c->vocab * sizeof *logits);
    side sa, sb;
    memset(&sa, 0, sizeof sa), memset(&sb, 0, sizeof sb);
    if (!toks || !logits) goto done_free;
    uint64_t s = 0x243f6a8885a308d3ull; /* cmd_bench's prompt */
    for (int64_t i = 0; i < P; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((s >> 33) % (uint64_t)c->vocab);
    }
    /* a warm-up round each (faults the pages in), then stored and requantized alternately */
    if (one_round(&a, toks, P, G, logits, &sa, 0) || one_round(&b, toks, P, G, logits, &sb, 0)) goto done_free;
    for (int r = 0; r < rounds; r++)
        if (one_round(&a, toks, P, G, logits, &sa, r) || one_round(&b, toks, P, G, logits, &sb, r)) goto done_free;
    int agree = 0, ng = G < 64 ? (int)G : 64;
    while (agree < ng && sa.last[agree] == sb.last[agree]) agree++;
    char wa[256], wb[256], ca[256], cb[256];
    arr(wa, sizeof wa, sa.wall, rounds, (double)G), arr(wb, sizeof wb, sb.wall, rounds, (double)G);
    arr(ca, sizeof ca, sa.cpu, rounds, 0), arr(cb, sizeof cb, sb.cpu, rounds, 0);
    const char *dn = ms_static_dtype_name(d);
    printf("{\"model\":\"%s\",\"arch\":\"%s\",\"threads\":%d,\"static_compare\":\"%s\",\"prompt_tokens\":%lld,"
           "\"gen_tokens\":%lld,\"rounds\":%d,\"stored\":{\"load_s\":%.3f,\"static_bytes\":%llu,"
           "\"weight_bytes_per_token\":%.0f,\"decode_tok_s\":%s,\"decode_cpu_s\":%s},\"%s\":{\"load_s\":%.3f,"
           "\"static_bytes\":%llu,\"weight_bytes_per_token\":%.0f,\"decode_tok_s\":%s,\"decode_cpu_s\":%s},"
           "\"bytes_ratio\":%.4f,\"speedup_wall\":%.3f,\"speedup_cpu\":%.3f,\"greedy_prefix_agree\":\"%d/%d\"}\n",
           dir, c->model_type, a.threads, dn, (long long)P, (long long)G, rounds, la,
           (unsigned long long)a.model.static_bytes, sa.bytes, wa, ca, dn, lb, (unsigned long long)b.model.static_bytes,
           sb.bytes, wb, cb, sb.bytes / sa.bytes, median(sa.wall, rounds) / median(sb.wall, rounds),
           median(sa.cpu, rounds) / median(sb.cpu, rounds), agree, ng);
    rc = 0;
done_free:
    free(toks), free(logits);
done:
    ms_cli_close(&b);
    ms_cli_close(&a);
    return rc;
}
