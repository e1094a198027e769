/* cmd_inspect.c — `moonshine inspect PATH [--json]`: the validated tensor table. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/common.h"
#include "cli/commands.h"
#include "io/safetensors.h"

int cmd_inspect(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("usage: moonshine inspect MODEL_DIR|FILE.safetensors\n"
               "Validates every SafeTensors header and prints one line per tensor:\n"
               "name dtype shape file offset bytes.\n");
        return 0;
    }
    const char *path = ms_cli_model_arg("inspect", ms_arg_pos(argc, argv, 0));
    if (!path || ms_args_unknown(argc, argv, "inspect")) {
        fprintf(stderr, "usage: moonshine inspect MODEL_DIR|FILE.safetensors\n");
        return 2;
    }
    ms_checkpoint ck;
    ms_err err = {0};
    if (ms_checkpoint_open(path, &ck, &err)) {
        fprintf(stderr, "moonshine inspect: %s\n", err.msg);
        return 1;
    }
    uint64_t total = 0;
    for (int i = 0; i < ck.n_tensors; i++) {
        const ms_tensor *t = &ck.tensors[i];
        char sb[160];
        const char *fn = strrchr(ck.files[t->file].path, '/');
        printf("%s %s %s %s %llu %llu\n", t->name, ms_dtype_name(t->dtype), ms_shape_str(t->shape, t->ndim, sb, sizeof sb),
               fn ? fn + 1 : ck.files[t->file].path, (unsigned long long)t->offset, (unsigned long long)t->nbytes);
        total += t->nbytes;
    }
    fprintf(stderr, "%d tensors in %d file(s), %llu bytes\n", ck.n_tensors, ck.n_files, (unsigned long long)total);
    ms_checkpoint_close(&ck);
    return 0;
}
