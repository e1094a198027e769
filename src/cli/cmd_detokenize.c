/* cmd_detokenize.c — `moonshine detokenize DIR`: JSON array of ids on stdin -> text. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/common.h"
#include "cli/commands.h"
#include "text/tokenizer.h"
#include "util/json.h"

int cmd_detokenize(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("usage: moonshine detokenize MODEL_DIR [--skip-special]\n"
               "Reads a JSON array of token ids from stdin and writes the text they decode to\n"
               "(bytes that are not valid UTF-8 become U+FFFD, as Hugging Face decode does).\n"
               "--skip-special leaves special tokens out.\n");
        return 0;
    }
    const char *dir = ms_cli_model_arg("detokenize", ms_arg_pos(argc, argv, 0));
    int skip = ms_arg_flag(argc, argv, "--skip-special");
    if (!dir || ms_args_unknown(argc, argv, "detokenize")) {
        fprintf(stderr, "usage: moonshine detokenize MODEL_DIR [--skip-special]\n");
        return 2;
    }
    size_t cap = 1 << 16, n = 0;
    char *in = malloc(cap);
    for (;;) {
        if (!in) {
            fprintf(stderr, "moonshine detokenize: out of memory\n");
            return 1;
        }
        n += fread(in + n, 1, cap - n, stdin);
        if (n < cap) break;
        char *q = realloc(in, cap * 2);
        if (!q) free(in);
        in = q;
        cap *= 2;
    }
    ms_err err = {0};
    cJSON *arr = NULL;
    if (ms_json_parse(in, n, "stdin", &arr, &err)) {
        fprintf(stderr, "moonshine detokenize: %s\n", err.msg);
        free(in);
        return 1;
    }
    free(in);
    if (!cJSON_IsArray(arr)) {
        fprintf(stderr, "moonshine detokenize: stdin must be a JSON array of token ids\n");
        cJSON_Delete(arr);
        return 1;
    }
    int count = cJSON_GetArraySize(arr), i = 0;
    int32_t *ids = malloc(((size_t)count + 1) * sizeof *ids);
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        if (!ms_json_is_int(e, 0, INT32_MAX)) {
            fprintf(stderr, "moonshine detokenize: element %d of the array is not a token id (a non-negative integer)\n", i);
            free(ids);
            cJSON_Delete(arr);
            return 1;
        }
        ids[i++] = (int32_t)e->valuedouble;
    }
    cJSON_Delete(arr);
    ms_tokenizer *t;
    if (ms_tok_load_dir(dir, &t, &err)) {
        fprintf(stderr, "moonshine detokenize: %s\n", err.msg);
        free(ids);
        return 1;
    }
    char *text;
    size_t len;
    int rc = ms_tok_decode(t, ids, (size_t)count, skip ? MS_TOK_DECODE_SKIP_SPECIAL : 0, &text, &len, &err);
    if (rc) {
        fprintf(stderr, "moonshine detokenize: %s\n", err.msg);
    } else {
        fwrite(text, 1, len, stdout);
        free(text);
    }
    free(ids);
    ms_tok_free(t);
    return rc ? 1 : 0;
}
