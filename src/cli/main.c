/* main.c — the `moonshine` command: dispatch to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static const struct { const char *name; ms_cmd_fn fn; const char *help; } k_cmds[] = {
#define MS_ENTRY(name, help) {#name, cmd_##name, help},
    MS_COMMAND_LIST(MS_ENTRY)
#undef MS_ENTRY
};

/* Command names are C identifiers: "bench_grammar" is typed bench-grammar. */
static int name_is(const char *typed, const char *name) {
    for (; *typed && *name; typed++, name++)
        if (*typed != *name && !(*typed == '-' && *name == '_')) return 0;
    return !*typed && !*name;
}

static void usage(FILE *f) {
    fprintf(f, "usage: moonshine COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "%s", k_cmds[i].name);
        for (char *c = nm; *c; c++)
            if (*c == '_') *c = '-';
        fprintf(f, "  %-13s %s\n", nm, k_cmds[i].help);
    }
    fprintf(f, "\n`moonshine COMMAND --help` describes each command.\n");
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
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        if (name_is(argv[1], k_cmds[i].name)) return k_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "moonshine: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
