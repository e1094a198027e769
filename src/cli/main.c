/* main.c — the `moonshine` command: dispatch to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static const struct { const char *name; ms_cmd_fn fn; const char *help; } k_cmds[] = {
#define MS_ENTRY(name, help) {#name, cmd_##name, help},
    MS_COMMAND_LIST(MS_ENTRY)
#undef MS_ENTRY
};

static void usage(FILE *f) {
    fprintf(f, "usage: moonshine COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        fprintf(f, "  %-12s %s\n", k_cmds[i].name, k_cmds[i].help);
    fprintf(f, "\n`moonshine COMMAND --help` describes each command.\n");
#ifdef MS_WITH_GPU
    fprintf(f, "Any command also takes --gpu [--gpu-budget-mib M]: decode matmuls on GPU 0.\n");
#endif
}

static int dispatch(int argc, char **argv) {
    const char *base = argc > 0 && argv[0] ? strrchr(argv[0], '/') : NULL;
    if (argc > 0 && argv[0] && !strcmp(base ? base + 1 : argv[0], "moonshine-server")) return cmd_serve(argc, argv);
    if (argc > 0 && argv[0] && !strcmp(base ? base + 1 : argv[0], "moonshine-chat")) return cmd_chat(argc, argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) return k_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "moonshine: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}

#ifdef MS_WITH_GPU
/* cli/gpu.c (the GPU build only): strips --gpu [--gpu-budget-mib M] from argv, sets up the
 * GPU offload when asked, calls run(argc, argv) and returns its exit code. */
int ms_cli_gpu_main(int argc, char **argv, int (*run)(int argc, char **argv));
#endif

int main(int argc, char **argv) {
#ifdef MS_WITH_GPU
    return ms_cli_gpu_main(argc, argv, dispatch);
#else
    return dispatch(argc, argv);
#endif
}
