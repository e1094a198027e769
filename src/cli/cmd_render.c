/* cmd_render.c — `moonshine render DIR`: chat request JSON on stdin -> prompt text on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/common.h"
#include "cli/commands.h"
#include "text/chat_template.h"

#define MAX_REQUEST ((size_t)256 << 20)

int cmd_render(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("usage: moonshine render MODEL_DIR < request.json\n"
               "Reads {\"messages\": [...], \"tools\"?: [...], \"add_generation_prompt\"?: bool,\n"
               "\"chat_template_kwargs\"?: {...}} from stdin and writes the prompt the model's chat\n"
               "template renders (chat_template.jinja or tokenizer_config.json, as transformers'\n"
               "apply_chat_template does) to stdout, byte for byte. A model that ships no template\n"
               "uses its built-in renderer: Kimi K3 (config model_type kimi_k3) renders XTML as\n"
               "encoding_k3.py does (see src/text/xtml.h for the chat_template_kwargs it reads).\n");
        return 0;
    }
    const char *dir = ms_cli_model_arg("render", ms_arg_pos(argc, argv, 0));
    if (!dir || ms_arg_pos(argc, argv, 1) || ms_args_unknown(argc, argv, "render")) {
        fprintf(stderr, "usage: moonshine render MODEL_DIR < request.json\n");
        return 2;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) { fprintf(stderr, "moonshine render: out of memory\n"); return 1; }
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_REQUEST) { fprintf(stderr, "moonshine render: request larger than %zu bytes\n", MAX_REQUEST); free(buf); return 1; }
            char *nb = realloc(buf, cap * 2);
            if (!nb) { fprintf(stderr, "moonshine render: out of memory\n"); free(buf); return 1; }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, stdin);
        if (!r) break;
        n += r;
    }
    if (ferror(stdin)) { fprintf(stderr, "moonshine render: error reading stdin\n"); free(buf); return 1; }
    ms_err err = {0};
    char *out = NULL;
    size_t out_len = 0;
    int rc = ms_chat_render(dir, buf, n, &out, &out_len, &err);
    free(buf);
    if (rc) { fprintf(stderr, "moonshine render: %s\n", err.msg); return 1; }
    int ok = fwrite(out, 1, out_len, stdout) == out_len && fflush(stdout) == 0;
    free(out);
    if (!ok) { fprintf(stderr, "moonshine render: error writing stdout\n"); return 1; }
    return 0;
}
