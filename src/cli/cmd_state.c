/* cmd_state.c — `moonshine state inspect FILE`: a saved causal-state file's
 * header as one JSON object (docs/state.md). */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/state.h"
#include "util/hash.h"

static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

int cmd_state(int argc, char **argv) {
    const char *usage = "usage: moonshine state inspect FILE\n";
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%sValidates a state file (written by `moonshine run --save-state`): structure, bounds and\n"
               "every checksum; prints its header as JSON: version, model_id (SHA-256 of config.json and the\n"
               "tensor table), n_past, ctx_needed, saved_ctx, tokens, sections (name, offset, size, crc32c).\n"
               "Exits 1 when the file is invalid.\n",
               usage);
        return 0;
    }
    /* ms_arg_pos consumes what it returns: each call takes the next positional */
    const char *verb = ms_arg_pos(argc, argv, 0), *path = ms_arg_pos(argc, argv, 0);
    if (!verb || strcmp(verb, "inspect") || !path || ms_arg_pos(argc, argv, 0) || ms_args_unknown(argc, argv, "state")) {
        fputs(usage, stderr);
        return 2;
    }
    ms_state_info in;
    ms_err err = {0};
    if (ms_state_inspect(path, &in, &err)) {
        fprintf(stderr, "moonshine state: %s\n", err.msg);
        return 1;
    }
    char id[65];
    ms_hex(in.model_id, 32, id);
    printf("{\"file\":");
    json_str(path);
    printf(",\"version\":%u,\"model_id\":\"%s\",\"n_past\":%lld,\"ctx_needed\":%lld,\"saved_ctx\":%lld,"
           "\"header_bytes\":%llu,\"file_bytes\":%llu,\"tokens\":[",
           in.version, id, (long long)in.n_past, (long long)in.ctx_needed, (long long)in.saved_ctx,
           (unsigned long long)in.header_bytes, (unsigned long long)in.file_bytes);
    for (int64_t i = 0; i < in.n_tokens; i++) printf(i ? ",%d" : "%d", in.tokens[i]);
    printf("],\"sections\":[");
    for (int i = 0; i < in.n_sections; i++) {
        printf(i ? ",{\"name\":" : "{\"name\":");
        json_str(in.sections[i].name);
        printf(",\"offset\":%llu,\"size\":%llu,\"crc32c\":\"%08x\"}", (unsigned long long)in.sections[i].offset,
               (unsigned long long)in.sections[i].size, in.sections[i].crc32c);
    }
    printf("]}\n");
    ms_state_info_free(&in);
    return 0;
}
