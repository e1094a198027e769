/* cmd_tokenize.c — `moonshine tokenize DIR`: stdin text -> JSON array of ids;
 * `--bench FILE`: encoding speed on a file, one JSON line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/common.h"
#include "cli/commands.h"
#include "text/tokenizer.h"
#include "util/fs.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Read all of f into a malloc'd buffer. */
static char *slurp(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap + 1);
    while (p) {
        size_t r = fread(p + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        char *q = realloc(p, cap * 2 + 1);
        if (!q) {
            free(p);
            return NULL;
        }
        p = q;
        cap *= 2;
    }
    if (p) p[n] = 0;
    *len = n;
    return p;
}

static int bench(ms_tokenizer *t, const char *file, double load_s, double min_s) {
    char *text;
    size_t len;
    ms_err err = {0};
    if (ms_read_file(file, (size_t)1 << 31, &text, &len, &err)) {
        fprintf(stderr, "moonshine tokenize: %s\n", err.msg);
        return 1;
    }
    ms_tok_ids ids = {0};
    double t0 = now_s();
    if (ms_tok_encode(t, text, len, MS_TOK_ENCODE_SPECIAL, &ids, &err)) {
        fprintf(stderr, "moonshine tokenize: %s: %s\n", file, err.msg);
        free(text);
        return 1;
    }
    double cold = now_s() - t0;
    size_t ntok = ids.n;
    int reps = 0;
    double t1 = now_s(), el = 0;
    while (el < min_s || reps < 1) {
        ids.n = 0;
        if (ms_tok_encode(t, text, len, MS_TOK_ENCODE_SPECIAL, &ids, &err)) break;
        reps++;
        el = now_s() - t1;
    }
    char *dec = NULL;
    size_t dlen = 0;
    double t2 = now_s();
    int drc = ms_tok_decode(t, ids.ids, ids.n, 0, &dec, &dlen, &err);
    double dec_s = now_s() - t2;
    printf("{\"file\": \"%s\", \"bytes\": %zu, \"tokens\": %zu, \"load_s\": %.3f, \"cold_mb_per_s\": %.2f, "
           "\"warm_mb_per_s\": %.2f, \"warm_reps\": %d, \"decode_mb_per_s\": %.1f, \"roundtrip\": %s}\n",
           file, len, ntok, load_s, len / cold / 1e6, (double)len * reps / el / 1e6, reps,
           drc ? 0.0 : len / (dec_s > 0 ? dec_s : 1e-9) / 1e6,
           !drc && dlen == len && memcmp(dec, text, len) == 0 ? "true" : "false");
    free(dec);
    ms_tok_ids_free(&ids);
    free(text);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("usage: moonshine tokenize MODEL_DIR [--no-special] [--bench FILE [--seconds S]]\n"
               "Reads all of stdin as UTF-8 text and prints its token ids as a JSON array.\n"
               "No special tokens are added; special and added tokens written in the text are\n"
               "recognized, as Hugging Face tokenizers does (--no-special: special tokens are\n"
               "encoded as plain text). MODEL_DIR holds tokenizer.json, or tiktoken.model and\n"
               "tokenizer_config.json.\n"
               "--bench FILE: encode FILE instead and print one JSON line with the speed (MB/s,\n"
               "cold = first pass with an empty word cache, warm = repeated passes for S seconds).\n");
        return 0;
    }
    const char *dir = ms_cli_model_arg("tokenize", ms_arg_pos(argc, argv, 0));
    const char *bfile = ms_arg_str(argc, argv, "--bench");
    const char *secs = ms_arg_str(argc, argv, "--seconds");
    int no_special = ms_arg_flag(argc, argv, "--no-special");
    if (!dir || ms_args_unknown(argc, argv, "tokenize")) {
        fprintf(stderr, "usage: moonshine tokenize MODEL_DIR [--no-special] [--bench FILE [--seconds S]]\n");
        return 2;
    }
    ms_err err = {0};
    ms_tokenizer *t;
    double t0 = now_s();
    if (ms_tok_load_dir(dir, &t, &err)) {
        fprintf(stderr, "moonshine tokenize: %s\n", err.msg);
        return 1;
    }
    double load_s = now_s() - t0;
    if (bfile) {
        int rc = bench(t, bfile, load_s, secs ? atof(secs) : 2.0);
        ms_tok_free(t);
        return rc;
    }
    size_t len;
    char *text = slurp(stdin, &len);
    if (!text) {
        fprintf(stderr, "moonshine tokenize: reading stdin: out of memory\n");
        ms_tok_free(t);
        return 1;
    }
    ms_tok_ids ids = {0};
    int rc = ms_tok_encode(t, text, len, no_special ? 0 : MS_TOK_ENCODE_SPECIAL, &ids, &err);
    if (rc) {
        fprintf(stderr, "moonshine tokenize: stdin: %s\n", err.msg);
    } else {
        fputc('[', stdout);
        for (size_t i = 0; i < ids.n; i++) printf(i ? ", %d" : "%d", ids.ids[i]);
        fputs("]\n", stdout);
    }
    ms_tok_ids_free(&ids);
    free(text);
    ms_tok_free(t);
    return rc ? 1 : 0;
}
