/* cmd_parse.c — `moonshine parse FORMAT`: generated text on stdin -> the
 * OpenAI-style assistant message (content, reasoning_content, tool_calls) as JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "text/outparse.h"

int cmd_parse(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("usage: moonshine parse FORMAT [--start-in-reasoning] [--tools FILE] [--seed N] < text\n"
               "Splits a model's generated text (special tokens included) into content, reasoning\n"
               "and tool calls, and prints the assistant message as JSON. FORMAT: think, deepseek_v3,\n"
               "deepseek_v31, qwen3, kimi_k2, glm, harmony, xtml. --start-in-reasoning when the prompt\n"
               "opened the reasoning block; --tools an OpenAI tools JSON file (GLM argument types);\n"
               "--seed the tool-call id seed (default 0). The same parser streams in the library\n"
               "(src/text/outparse.h).\n");
        return 0;
    }
    const char *fname = ms_arg_pos(argc, argv, 0);
    int sir = ms_arg_flag(argc, argv, "--start-in-reasoning");
    const char *tools_path = ms_arg_str(argc, argv, "--tools");
    int64_t seed = 0;
    if (ms_arg_int(argc, argv, "--seed", 0, INT64_MAX, &seed)) return 2;
    if (!fname || ms_arg_pos(argc, argv, 1) || ms_args_unknown(argc, argv, "parse")) {
        fprintf(stderr, "usage: moonshine parse FORMAT [--start-in-reasoning] [--tools FILE] [--seed N] < text\n");
        return 2;
    }
    ms_err err = {0};
    ms_outfmt fmt;
    if (ms_outfmt_from_name(fname, &fmt, &err)) {
        fprintf(stderr, "moonshine parse: %s\n", err.msg);
        return 2;
    }
    char *tools = NULL;
    if (tools_path) {
        FILE *f = fopen(tools_path, "rb");
        size_t cap = 0, n = 0;
        if (f) {
            for (;;) {
                if (n + 4096 + 1 > cap) {
                    char *t = realloc(tools, cap = (cap ? cap * 2 : 65536));
                    if (!t) break;
                    tools = t;
                }
                size_t r = fread(tools + n, 1, cap - n - 1, f);
                if (!r) break;
                n += r;
            }
            fclose(f);
        }
        if (!f || !tools) {
            fprintf(stderr, "moonshine parse: cannot read %s\n", tools_path);
            free(tools);
            return 1;
        }
        tools[n] = 0;
    }
    ms_outparse_opts o = {.start_in_reasoning = sir, .id_seed = (uint64_t)seed, .tools_json = tools};
    ms_outparse *p = NULL;
    ms_outmsg *m = ms_outmsg_new();
    int rc = m ? ms_outparse_new(fmt, &o, &p, &err) : ms_fail(&err, MS_ERR_NOMEM, "out of memory");
    char buf[65536];
    size_t r;
    while (!rc && (r = fread(buf, 1, sizeof buf, stdin)) > 0) rc = ms_outparse_feed(p, buf, r, ms_outmsg_collect, m, &err);
    if (!rc && ferror(stdin)) rc = ms_fail(&err, MS_ERR_IO, "error reading stdin");
    if (!rc) rc = ms_outparse_finish(p, ms_outmsg_collect, m, &err);
    char *js = NULL;
    if (!rc) rc = ms_outmsg_json(m, &js, &err);
    if (!rc) printf("%s\n", js);
    else fprintf(stderr, "moonshine parse: %s\n", err.msg);
    free(js);
    ms_outmsg_free(m);
    ms_outparse_free(p);
    free(tools);
    return rc ? 1 : 0;
}
