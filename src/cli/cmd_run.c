/* cmd_run.c — `moonshine run MODEL_DIR --prompt-ids 1,2,3 --max-new-tokens N [--json]
 * [--load-state FILE] [--save-state FILE]`: greedy generation from token ids,
 * optionally continuing a saved causal state and saving the one it ends in. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/state.h"

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
    const char *usage = "usage: moonshine run MODEL_DIR --prompt-ids 1,2,3 --max-new-tokens N [--json] [--threads N] [--ctx N] [--backend B]\n"
                        "       [--load-state FILE] [--save-state FILE]\n";
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%sGenerates greedily (argmax) from the prompt ids; prints the new ids comma-separated,\n"
               "or with --json one object {\"prompt_ids\",\"generated_ids\",\"prefill_tok_s\",\"decode_tok_s\"}\n"
               "(with --load-state also \"state_tokens\": the tokens the loaded state held).\n"
               "Stops at max-new-tokens or the config's eos_token_id.\n"
               "--load-state FILE: start from a saved causal state; the prompt ids follow its tokens.\n"
               "--save-state FILE: after generating, feed the last generated id too and save the state\n"
               "(its tokens: the loaded state's, the prompt, every generated id) atomically; see docs/state.md.\n"
               "--cpu-activations f32|q8|bf16|q8+bf16|q16|q16+bf16: q8 multiplies MXFP4/INT4/Q8 weights with int8\n"
               "activations (per 32, F32 scale) on the CPU; q16 the same weights' decode matvecs with 16-bit\n"
               "activations (two int8 planes); bf16 rounds the BF16 decode matvec's activations to BF16\n"
               "(vdpbf16ps, AVX512_BF16 CPUs); default q16 (f32: the exact kernels).\n",
               usage);
        return 0;
    }
    ms_cli_opts eo;
    int64_t max_new = 16;
    if (ms_cli_engine_args(argc, argv, &eo) || ms_arg_int(argc, argv, "--max-new-tokens", 0, 1 << 24, &max_new))
        return 2;
    const char *ids_s = ms_arg_str(argc, argv, "--prompt-ids");
    const char *load = ms_arg_str(argc, argv, "--load-state"), *save = ms_arg_str(argc, argv, "--save-state");
    int json = ms_arg_flag(argc, argv, "--json");
    const char *dir = ms_cli_model_arg("run", ms_arg_pos(argc, argv, 0));
    if (!dir || !ids_s || ms_args_unknown(argc, argv, "run")) {
        fputs(usage, stderr);
        return 2;
    }
    int32_t *ids;
    int n;
    if (parse_ids(ids_s, &ids, &n)) return 2;
    ms_err err = {0};
    int n_state = 0; /* tokens of the state to load: known before the engine is sized */
    if (load) {
        ms_state_info in;
        if (ms_state_inspect(load, &in, &err)) {
            fprintf(stderr, "moonshine run: --load-state: %s\n", err.msg);
            free(ids);
            return 1;
        }
        n_state = (int)in.n_past;
        ms_state_info_free(&in);
    }
    if (eo.ctx == 0) eo.ctx = n_state + n + (int)max_new + 1;
    ms_cli_ctx x;
    if (ms_cli_open("run", dir, &eo, &x)) {
        free(ids);
        return 1;
    }
    int64_t V = x.model.cfg.vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *gen = malloc((size_t)(max_new + 1) * sizeof *gen);
    int32_t *hist = NULL; /* every token fed, for --save-state */
    int rc = 1, k = 0;
    double t0 = ms_now(), t1 = t0;
    if (!logits || !gen) goto done;
    if (load) {
        if (ms_engine_state_load(x.engine, load, &hist, &n_state, &err)) goto fail;
    }
    if (ms_engine_forward(x.engine, ids, n, logits, 0, &err)) goto fail;
    t1 = ms_now();
    int32_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = (int32_t)i;
    /* the engine picks each next id (on a device: one id comes down, not the logits); where it
     * cannot (a model split over devices), forward with the logits and pick here */
    for (int pick = 1; k < max_new;) {
        gen[k++] = best;
        if (!json) {
            printf(k > 1 ? ",%d" : "%d", best);
            fflush(stdout);
        }
        if (best == x.model.cfg.eos_id || k == max_new) break;
        int32_t nx = 0;
        int prc = pick ? ms_engine_decode_greedy(x.engine, best, &nx, &err) : MS_ERR_UNSUPPORTED;
        if (prc == MS_ERR_UNSUPPORTED) {
            pick = 0;
            if (ms_engine_forward(x.engine, &best, 1, logits, 0, &err)) goto fail;
            for (int64_t i = 1; i < V; i++)
                if (logits[i] > logits[nx]) nx = (int32_t)i;
        } else if (prc) {
            goto fail;
        }
        best = nx;
    }
    double t2 = ms_now();
    if (save) { /* the state after every token: feed the last generated one too */
        if (k > 0 && ms_engine_forward(x.engine, &gen[k - 1], 1, NULL, 0, &err)) goto fail;
        int nh = n_state + n + k;
        int32_t *h = realloc(hist, (size_t)nh * sizeof *h + 4);
        if (!h) goto done;
        hist = h;
        memcpy(hist + n_state, ids, (size_t)n * sizeof *ids);
        memcpy(hist + n_state + n, gen, (size_t)k * sizeof *gen);
        if (ms_engine_state_save(x.engine, save, hist, nh, &err)) goto fail;
    }
    if (json) {
        printf("{\"prompt_ids\":[");
        for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
        printf("],\"generated_ids\":[");
        for (int i = 0; i < k; i++) printf(i ? ",%d" : "%d", gen[i]);
        if (load) printf("],\"state_tokens\":%d", n_state);
        else printf("]");
        printf(",\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.2f}\n", n / (t1 - t0), k > 1 ? (k - 1) / (t2 - t1) : 0.0);
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
    free(hist);
    free(ids);
    ms_cli_close(&x);
    return rc;
}
