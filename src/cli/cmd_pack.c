/* cmd_pack.c — `moonshine pack MODEL_DIR --out STORE_DIR [--dirs D1,D2,...]`:
 * rewrite the routed experts expert-major into a packed store;
 * `moonshine pack MODEL_DIR --static q8|fp8 --out STORE_DIR`: the requantized static tier; and
 * `moonshine probe FILE`: the drive's sequential O_DIRECT read bandwidth. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/common.h"
#include "cli/progress.h"
#include "cli/commands.h"
#include "engine/streaming.h"
#include "io/expert_store.h"
#include "io/reader.h"
#include "util/json.h"
#include "util/threadpool.h"

/* Layers to probe: config.json num_hidden_layers (or text_config's), else 4096. */
static int model_layers(const char *dir) {
    char path[4096], *text;
    size_t len;
    ms_err e = {0};
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (ms_read_file(path, 64u << 20, &text, &len, &e)) return 4096;
    cJSON *root = NULL;
    int64_t n = 0;
    if (!ms_json_parse(text, len, path, &root, &e)) {
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
        if (ms_json_opt_int(root, "num_hidden_layers", 1, 4096, &n, path, &e) || !n)
            if (cJSON_IsObject(tc)) ms_json_opt_int(tc, "num_hidden_layers", 1, 4096, &n, path, &e);
    }
    cJSON_Delete(root);
    free(text);
    return n > 0 ? (int)n : 4096;
}

static double now_s(void);

/* pack --static D: requantize the static tier (all cores) and write it to out. */
static int pack_static(const char *model, const char *dtype, const char *out, int64_t threads) {
    ms_err err = {0};
    ms_static_dtype d;
    if (ms_static_dtype_parse(dtype, &d, &err) || d == MS_STATIC_STORED) {
        fprintf(stderr, "moonshine pack: --static %s: expected q8 or fp8\n", dtype);
        return 2;
    }
    ms_model mdl;
    if (ms_model_load(model, &mdl, &err)) {
        fprintf(stderr, "moonshine pack: %s\n", err.msg);
        return 1;
    }
    ms_pool *pool = ms_pool_create((int)threads);
    double t0 = now_s();
    uint64_t before = mdl.static_bytes;
    int rc = ms_model_requant_static(&mdl, d, pool, &err);
    double t1 = now_s();
    if (!rc) rc = ms_static_store_write(&mdl, out, &err);
    if (!rc)
        printf("packed the static tier of %s as %s: %.1f -> %.1f MiB (requantized in %.1f s, written in %.1f s, max "
               "relative RMS error %.4f) into %s/%s\n",
               model, ms_static_dtype_name(d), before / 1048576.0, mdl.static_bytes / 1048576.0, t1 - t0, now_s() - t1,
               mdl.requant_rel_rms, out, MS_STATIC_STORE_FILE);
    else fprintf(stderr, "moonshine pack: %s\n", err.msg);
    ms_pool_destroy(pool);
    ms_model_free(&mdl);
    return rc ? 1 : 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cmd_pack(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("usage: moonshine pack MODEL_DIR --out STORE_DIR [--dirs D1,D2,...]\n"
               "       moonshine pack MODEL_DIR --static q8|fp8 --out STORE_DIR [--threads N]\n"
               "Rewrites the checkpoint's routed experts expert-major: one contiguous 4 KiB-aligned record\n"
               "per expert, one file per MoE layer (round-robin over --dirs, e.g. one per drive; default\n"
               "STORE_DIR), and STORE_DIR/manifest.json binding the store to this checkpoint (file sizes,\n"
               "SHA-256 of each SafeTensors header and of a data sample) with a CRC32C per expert.\n"
               "The checkpoint itself is not modified. Use it with --store STORE_DIR (verify, run, bench).\n"
               "--static q8|fp8 instead writes the static tier requantized as --static-dtype does at load\n"
               "into STORE_DIR/" MS_STATIC_STORE_FILE " (bound to this checkpoint the same way, a CRC32C per\n"
               "matrix); --static-store STORE_DIR (verify, run, bench, chat, serve) then loads it without\n"
               "requantizing.\n");
        return 0;
    }
    const char *out = ms_arg_str(argc, argv, "--out");
    const char *dirs_s = ms_arg_str(argc, argv, "--dirs");
    const char *stat = ms_arg_str(argc, argv, "--static");
    int64_t threads = 0;
    if (ms_arg_int(argc, argv, "--threads", 0, 1024, &threads)) return 2;
    const char *model = ms_cli_model_arg("pack", ms_arg_pos(argc, argv, 0));
    if (!model || !out || ms_args_unknown(argc, argv, "pack")) {
        fprintf(stderr, "usage: moonshine pack MODEL_DIR --out STORE_DIR [--dirs D1,D2,...]\n");
        return 2;
    }
    if (stat) {
        if (dirs_s) {
            fprintf(stderr, "moonshine pack: --dirs is for the expert store, not --static\n");
            return 2;
        }
        return pack_static(model, stat, out, threads);
    }
    char *dirs_buf = dirs_s ? strdup(dirs_s) : NULL;
    const char *dirs[256];
    int n_dirs = 0;
    for (char *tok = dirs_buf ? strtok(dirs_buf, ",") : NULL; tok; tok = strtok(NULL, ",")) {
        if (n_dirs == 256) {
            fprintf(stderr, "moonshine pack: at most 256 --dirs\n");
            free(dirs_buf);
            return 2;
        }
        dirs[n_dirs++] = tok;
    }
    ms_err err = {0};
    /* the engine's own binding when it loads the model: the store then matches what it streams */
    ms_model mdl;
    if (ms_model_load(model, &mdl, &err) == 0) {
        ms_pack_stats ps;
        double t0 = now_s();
        fprintf(stderr, "packing the routed experts of %s (%s, %.1f MiB of experts)\n", model, mdl.cfg.model_type,
                mdl.expert_bytes / 1048576.0);
        ms_cli_progress cp;
        ms_cli_progress_init(&cp);
        int rc = ms_streaming_pack_progress(&mdl, out, dirs, n_dirs, &cp.p, &ps, &err);
        ms_cli_progress_end(&cp);
        if (!rc)
            printf("packed %d layer file(s), %.1f MiB in %.1f s into %s\n", ps.n_files, ps.bytes_written / 1048576.0,
                   now_s() - t0, out);
        else
            fprintf(stderr, "moonshine pack: %s\n", err.msg);
        ms_model_free(&mdl);
        free(dirs_buf);
        return rc ? 1 : 0;
    }
    fprintf(stderr, "moonshine pack: the engine does not load this model (%s); packing by tensor naming\n", err.msg);
    err = (ms_err){0};
    ms_checkpoint ck;
    ms_expert_naming nm;
    ms_expert_store st;
    int rc = ms_checkpoint_open(model, &ck, &err);
    if (rc) {
        fprintf(stderr, "moonshine pack: %s\n", err.msg);
        free(dirs_buf);
        return 1;
    }
    if (!(rc = ms_expert_naming_detect(&ck, &nm, &err)))
        rc = ms_expert_store_from_checkpoint(&ck, &nm, model_layers(model), 0, &st, &err);
    if (!rc) {
        ms_pack_stats ps;
        double t0 = now_s();
        fprintf(stderr, "packing %d layers x %d experts (%.1f MiB of experts, naming %s)\n", st.n_layers, st.n_experts,
                st.total_read_bytes / 1048576.0, nm.roles[0].pattern);
        ms_cli_progress cp;
        ms_cli_progress_init(&cp);
        rc = ms_expert_pack_progress(&ck, &st, out, dirs, n_dirs, &cp.p, &ps, &err);
        ms_cli_progress_end(&cp);
        if (!rc)
            printf("packed %d layer file(s), %.1f MiB in %.1f s into %s\n", ps.n_files, ps.bytes_written / 1048576.0,
                   now_s() - t0, out);
        ms_expert_store_free(&st);
    }
    if (rc) fprintf(stderr, "moonshine pack: %s\n", err.msg);
    ms_checkpoint_close(&ck);
    free(dirs_buf);
    return rc ? 1 : 0;
}

int cmd_probe(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("usage: moonshine probe FILE [--block-kib K] [--qd N] [--max-mib M] [--io uring|pread|mmap]\n"
               "Sequential read bandwidth of FILE (O_DIRECT through io_uring unless --io says otherwise):\n"
               "the drive's floor that streamed expert reads are measured against.\n");
        return 0;
    }
    int64_t blk = 4096, qd = 8, max_mib = 0;
    const char *io_s = ms_arg_str(argc, argv, "--io");
    if (ms_arg_int(argc, argv, "--block-kib", 4, 262144, &blk) || ms_arg_int(argc, argv, "--qd", 1, 64, &qd) ||
        ms_arg_int(argc, argv, "--max-mib", 0, 1 << 30, &max_mib))
        return 2;
    const char *path = ms_arg_pos(argc, argv, 0);
    if (!path || ms_args_unknown(argc, argv, "probe")) {
        fprintf(stderr, "usage: moonshine probe FILE [--block-kib K] [--qd N] [--max-mib M] [--io MODE]\n");
        return 2;
    }
    ms_err err = {0};
    ms_io_mode mode = MS_IO_AUTO;
    if (io_s && ms_io_mode_parse(io_s, &mode, &err)) {
        fprintf(stderr, "moonshine probe: %s\n", err.msg);
        return 2;
    }
    double bw;
    char why[600];
    if (ms_io_probe_bandwidth(path, (uint64_t)max_mib << 20, (uint64_t)blk << 10, (int)qd, mode, &bw, why, sizeof why,
                              &err)) {
        fprintf(stderr, "moonshine probe: %s\n", err.msg);
        return 1;
    }
    printf("%s: %.2f GB/s sequential (%s, %lld KiB blocks, queue depth %lld)\n", path, bw / 1e9, why, (long long)blk,
           (long long)qd);
    return 0;
}
