/* main.c — the `moonshine` command: dispatch to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static const struct { const char *name; ms_cmd_fn fn; const char *help; } k_cmds[] = {
#define MS_ENTRY(name, help) {#name, cmd_##name, help},
    MS_COMMAND_LIST(MS_ENTRY)
#undef MS_ENTRY
};

/* A command's name as typed: its identifier with '_' written '-'. */
static const char *typed_name(const char *name, char *buf, size_t cap) {
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++) buf[i] = name[i] == '_' ? '-' : name[i];
    buf[i] = 0;
    return buf;
}

static void usage(FILE *f) {
    char nb[64];
    fprintf(f, "usage: moonshine COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        fprintf(f, "  %-12s %s\n", typed_name(k_cmds[i].name, nb, sizeof nb), k_cmds[i].help);
    fprintf(f, "\n`moonshine COMMAND --help` describes each command. MODEL is a checkpoint directory or a Hugging Face\n"
               "repo id (ORG/NAME[@REV]) already in the local cache (HF_HUB_CACHE / HF_HOME; nothing is downloaded).\n"
               "First run: `make demo`, or `moonshine chat models/demo` (a small trained model in this repository).\n");
#ifdef MS_WITH_GPU
    fprintf(f, "This build has the %s backend: verify, run, bench, chat and serve take --backend cpu|%s|auto.\n",
            MS_GPU_KIND, MS_GPU_KIND);
#endif
}

int main(int argc, char **argv) {
    const char *base = argc > 0 && argv[0] ? strrchr(argv[0], '/') : NULL;
    if (argc > 0 && argv[0] && !strcmp(base ? base + 1 : argv[0], "moonshine-server")) return cmd_serve(argc, argv);
    if (argc > 0 && argv[0] && !strcmp(base ? base + 1 : argv[0], "moonshine-chat")) return cmd_chat(argc, argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    char nb[64];
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        if (!strcmp(argv[1], typed_name(k_cmds[i].name, nb, sizeof nb))) return k_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "moonshine: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
