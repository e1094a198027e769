/* cmd_inspect.c — `moonshine inspect PATH [--json]`: the validated tensor table;
 * `moonshine inspect PATH --verify-sha256 [SUMS]`: every shard through SHA-256. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/common.h"
#include "cli/commands.h"
#include "io/checksum.h"
#include "io/safetensors.h"
#include "util/fs.h"
#include "util/hash.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    const char *name;
    int idx, n;
    uint64_t before, total; /* bytes of the files hashed before this one; of all */
    double t0, last;
    int tty;
} progress;

static void show(void *ud, uint64_t done, uint64_t size) {
    progress *p = ud;
    double t = now_s();
    if (done < size && t - p->last < 0.5) return;
    p->last = t;
    double all = (double)(p->before + done), rate = all / (t - p->t0 > 1e-6 ? t - p->t0 : 1e-6);
    if (p->tty || done == size)
        fprintf(stderr, "%ssha256 [%d/%d] %s  %.2f / %.2f GiB  %.2f GB/s%s", p->tty ? "\r\033[K" : "", p->idx + 1, p->n,
                p->name, all / 1073741824.0, p->total / 1073741824.0, rate / 1e9, p->tty && done < size ? "" : "\n");
}

/* --verify-sha256: dir holds the shards (or path is one file); sums_path may be NULL. */
static int verify_sha256(const char *path, const char *sums_path) {
    ms_err err = {0};
    struct stat st;
    if (stat(path, &st)) {
        perror(path);
        return 1;
    }
    char dir[4096];
    char **names = NULL;
    int n = 0;
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
        if (ms_list_shards(dir, &names, &n, &err)) {
            fprintf(stderr, "moonshine inspect: %s\n", err.msg);
            return 1;
        }
    } else {
        const char *sl = strrchr(path, '/');
        snprintf(dir, sizeof dir, "%.*s", sl ? (int)(sl - path) : 1, sl ? path : ".");
        names = malloc(sizeof *names);
        names[0] = strdup(sl ? sl + 1 : path);
        n = 1;
    }
    ms_sums sums = {0};
    if (sums_path) {
        char *text;
        size_t len;
        if (ms_read_file(sums_path, 64u << 20, &text, &len, &err) || ms_sums_parse(text, len, sums_path, &sums, &err)) {
            fprintf(stderr, "moonshine inspect: %s\n", err.msg);
            ms_names_free(names, n);
            return 1;
        }
        free(text);
    }
    /* what is checked: every shard, then the checksum file's other entries */
    int cap = n + sums.n, m = 0, bad = 0;
    const char **todo = malloc((size_t)(cap ? cap : 1) * sizeof *todo);
    for (int i = 0; i < n; i++) {
        if (sums_path && !ms_sums_find(&sums, names[i])) {
            printf("%s: NOT LISTED in %s\n", names[i], sums_path);
            bad++;
            continue;
        }
        todo[m++] = names[i];
    }
    for (int i = 0; i < sums.n; i++) {
        int seen = 0;
        for (int j = 0; j < n && !seen; j++) seen = !strcmp(names[j], sums.e[i].name);
        if (!seen) todo[m++] = sums.e[i].name;
    }
    if (!n) fprintf(stderr, "moonshine inspect: %s: no .safetensors files\n", dir);
    progress p = {.n = m, .t0 = now_s(), .tty = isatty(2)};
    for (int i = 0; i < m; i++) {
        char fp[8192];
        snprintf(fp, sizeof fp, "%s/%s", dir, todo[i]);
        if (!stat(fp, &st)) p.total += (uint64_t)st.st_size;
    }
    for (int i = 0; i < m; i++) {
        char fp[8192], hex[65];
        uint8_t sum[32];
        uint64_t size = 0;
        snprintf(fp, sizeof fp, "%s/%s", dir, todo[i]);
        p.name = todo[i], p.idx = i;
        if (ms_sha256_file(fp, sum, &size, show, &p, &err)) {
            if (p.tty) fputc('\n', stderr);
            printf("%s: FAILED open or read (%s)\n", todo[i], err.msg);
            err = (ms_err){0};
            bad++;
            continue;
        }
        p.before += size;
        ms_hex(sum, 32, hex);
        if (!sums_path) {
            printf("%s  %s\n", hex, todo[i]); /* the manifest: `sha256sum -c` reads it in dir */
            continue;
        }
        int ok = !memcmp(sum, ms_sums_find(&sums, todo[i])->sum, 32);
        printf("%s: %s\n", todo[i], ok ? "OK" : "FAILED");
        bad += !ok;
        fflush(stdout);
    }
    double t = now_s() - p.t0;
    fprintf(stderr, "%d file(s), %.2f GiB in %.1f s (%.2f GB/s)%s\n", m, p.before / 1073741824.0, t,
            t > 0 ? p.before / t / 1e9 : 0.0, sums_path ? (bad ? ": MISMATCH" : ": all match") : "");
    if (bad) fprintf(stderr, "moonshine inspect: %d file(s) did not verify against %s\n", bad, sums_path ? sums_path : "-");
    free(todo);
    ms_sums_free(&sums);
    ms_names_free(names, n);
    return bad || (!n && !m) ? 1 : 0;
}

int cmd_inspect(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("usage: moonshine inspect MODEL_DIR|FILE.safetensors\n"
               "       moonshine inspect MODEL_DIR|FILE.safetensors --verify-sha256 [SUMS]\n"
               "Validates every SafeTensors header and prints one line per tensor:\n"
               "name dtype shape file offset bytes.\n"
               "--verify-sha256 streams every .safetensors file of the directory through SHA-256 (a\n"
               "progress line on stderr). With SUMS (the format sha256sum writes, names relative to\n"
               "MODEL_DIR) every shard must be listed and every listed file match: one \"NAME: OK\" or\n"
               "\"NAME: FAILED\" line each, exit 1 on any failure. Without SUMS it prints the manifest\n"
               "(`sha256sum -c` reads it in MODEL_DIR).\n");
        return 0;
    }
    int sha = ms_arg_flag(argc, argv, "--verify-sha256");
    const char *path = ms_cli_model_arg("inspect", ms_arg_pos(argc, argv, 0));
    const char *sums = sha ? ms_arg_pos(argc, argv, 0) : NULL; /* the next positional: path is used */
    if (!path || ms_args_unknown(argc, argv, "inspect")) {
        fprintf(stderr, "usage: moonshine inspect MODEL_DIR|FILE.safetensors [--verify-sha256 [SUMS]]\n");
        return 2;
    }
    if (sha) return verify_sha256(path, sums);
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
