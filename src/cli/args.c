#include "cli/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char g_used[256];

const char *ms_arg_str(int argc, char **argv, const char *name) {
    for (int i = 1; i + 1 < argc && i < 255; i++)
        if (!strcmp(argv[i], name)) {
            g_used[i] = g_used[i + 1] = 1;
            return argv[i + 1];
        }
    return NULL;
}

int ms_arg_flag(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc && i < 256; i++)
        if (!strcmp(argv[i], name)) {
            g_used[i] = 1;
            return 1;
        }
    return 0;
}

int ms_arg_int(int argc, char **argv, const char *name, int64_t lo, int64_t hi, int64_t *out) {
    const char *s = ms_arg_str(argc, argv, name);
    if (!s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "moonshine: %s expects an integer in [%lld, %lld], got \"%s\"\n", name, (long long)lo,
                (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

const char *ms_arg_pos(int argc, char **argv, int want) {
    /* Call after every ms_arg_str/flag of the command: consumed options and
     * their values are skipped; anything starting with "--" is never positional. */
    int k = 0;
    for (int i = 1; i < argc && i < 256; i++) {
        if (g_used[i] || (argv[i][0] == '-' && argv[i][1] == '-')) continue;
        if (k++ == want) {
            g_used[i] = 1;
            return argv[i];
        }
    }
    return NULL;
}

int ms_args_unknown(int argc, char **argv, const char *cmd) {
    for (int i = 1; i < argc && i < 256; i++)
        if (!g_used[i]) {
            fprintf(stderr, "moonshine %s: unexpected argument \"%s\" (see --help)\n", cmd, argv[i]);
            return 1;
        }
    return 0;
}
