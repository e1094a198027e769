/* cmd_run.c — `moonshine run MODEL_DIR --prompt-ids 1,2,3 --max-new-tokens N [--json]`:
 * greedy generation from token ids. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"

/* Parse "1,2,3" into a malloc'd array; prints an error and returns -1 when malformed. */
static int parse_ids(const char *s, int32_t **out, int *n) {
    int cap = 16, k = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "moonshine run: --prompt-ids: expected comma-separated non-negative integers near \"%.20s\"\n", p);
            free(ids);
            return -1;
        }
        if (k == cap) {
            cap *= 2;
            int32_t *ni = realloc(ids, (size_t)cap * sizeof *ids);
            if (!ni) { free(ids); return -1; }
            ids = ni;
        }
        ids[k++] = (int32_t)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) {
            fprintf(stderr, "moonshine run: --prompt-ids: unexpected \"%c\"\n", *p);
            free(ids);
            return -1;
        }
    }
    if (!k) {
        fprintf(stderr, "moonshine run: --prompt-ids is empty\n");
        free(ids);
        return -1;
    }
    *out = ids;
    *n = k;
    return 0;
}

int cmd_run(int argc, char **argv) {
    const char *usage = "usage: moonshine run MODEL_DIR --prompt-ids 1,2,3 --max-new-tokens N [--json] [--threads N] [--ctx N]\n";
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%sGenerates greedily (argmax) from the prompt ids; prints the new ids comma-separated,\n"
               "or with --json one object {\"prompt_ids\",\"generated_ids\",\"prefill_tok_s\",\"decode_tok_s\"}.\n"
               "Stops at max-new-tokens or the config's eos_token_id.\n", usage);
        return 0;
    }
    int threads, ctx;
    int64_t max_new = 16;
    if (ms_cli_engine_args(argc, argv, &threads, &ctx) || ms_arg_int(argc, argv, "--max-new-tokens", 0, 1 << 24, &max_new))
        return 2;
    const char *ids_s = ms_arg_str(argc, argv, "--prompt-ids");
    int json = ms_arg_flag(argc, argv, "--json");
    const char *dir = ms_arg_pos(argc, argv, 0);
    if (!dir || !ids_s || ms_args_unknown(argc, argv, "run")) {
        fputs(usage, stderr);
        return 2;
    }
    int32_t *ids;
    int n;
    if (parse_ids(ids_s, &ids, &n)) return 2;
    if (ctx == 0) ctx = n + (int)max_new + 1;
    ms_cli_ctx x;
    if (ms_cli_open("run", dir, threads, ctx, &x)) {
        free(ids);
        return 1;
    }
    int64_t V = x.model.cfg.vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *gen = malloc((size_t)(max_new + 1) * sizeof *gen);
    ms_err err = {0};
    int rc = 1, k = 0;
    double t0 = ms_now(), t1 = t0;
    if (!logits || !gen) goto done;
    if (ms_engine_forward(x.engine, ids, n, logits, 0, &err)) goto fail;
    t1 = ms_now();
    for (k = 0; k < max_new;) {
        int32_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = (int32_t)i;
        gen[k++] = best;
        if (!json) {
            printf(k > 1 ? ",%d" : "%d", best);
            fflush(stdout);
        }
        if (best == x.model.cfg.eos_id || k == max_new) break;
        if (ms_engine_forward(x.engine, &best, 1, logits, 0, &err)) goto fail;
    }
    double t2 = ms_now();
    if (json) {
        printf("{\"prompt_ids\":[");
        for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
        printf("],\"generated_ids\":[");
        for (int i = 0; i < k; i++) printf(i ? ",%d" : "%d", gen[i]);
        printf("],\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.2f}\n", n / (t1 - t0),
               k > 1 ? (k - 1) / (t2 - t1) : 0.0);
    } else {
        printf("\n");
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "moonshine run: %s\n", err.msg);
done:
    free(logits);
    free(gen);
    free(ids);
    ms_cli_close(&x);
    return rc;
}
