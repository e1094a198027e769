/* cmd_synth.c — `moonshine synth --config CONFIG.json --out DIR ...`. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/progress.h"
#include "model/synth.h"

static int dtype_arg(const char *s, ms_dtype *out) {
    if (!s) return 0;
    if (!strcmp(s, "f32")) *out = MS_DT_F32;
    else if (!strcmp(s, "bf16")) *out = MS_DT_BF16;
    else if (!strcmp(s, "f16")) *out = MS_DT_F16;
    else if (!strcmp(s, "fp8")) *out = MS_DT_F8_E4M3;
    else if (!strcmp(s, "mxfp4")) *out = MS_DT_F4;
    else if (!strcmp(s, "int4")) *out = MS_DT_I4;
    else return -1;
    return 0;
}

int cmd_synth(int argc, char **argv) {
    const char *usage = "usage: moonshine synth --config CONFIG.json --out DIR [--seed N] [--dtype f32|bf16]\n"
                        "                       [--expert-dtype bf16|fp8|mxfp4|int4|int4-asym] [--shard-mib M] [--tokenizer DIR]\n"
                        "                       [--threads N] [--layers N]\n";
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%sWrites a deterministic random-weight checkpoint of any supported architecture in its\n"
               "original layout (per-expert tensors, FP8 with 128x128 weight_scale_inv, MXFP4 as\n"
               "compressed-tensors weight_packed + weight_scale, INT4 as compressed-tensors pack-quantized\n"
               "weight_packed int32 + BF16 weight_scale per 32 + weight_shape; int4-asym: symmetric false\n"
               "with min/max scales and weight_zero_point int32 packed along the rows), sharded with an\n"
               "index when larger than --shard-mib (default 4096), streaming (bounded memory). --threads N\n"
               "writes N tensors at a time (default: one per online CPU); the bytes do not depend on it.\n"
               "--layers N cuts num_hidden_layers to N and the config's per-layer lists with it (lists of\n"
               "num_hidden_layers entries such as layer_types / mlp_layer_types keep their first N; integer\n"
               "lists under a *_layers key, such as linear_attn_config.kda_layers, keep the layers 1..N).\n", usage);
        return 0;
    }
    ms_synth_opts o = {.dtype = MS_DT_BF16, .expert_dtype = MS_DT_INVALID};
    int64_t seed = 0, shard = 0, threads = 0, layers = 0;
    if (ms_arg_int(argc, argv, "--seed", 0, INT64_MAX, &seed) || ms_arg_int(argc, argv, "--shard-mib", 1, 1 << 24, &shard) ||
        ms_arg_int(argc, argv, "--threads", 1, 1024, &threads) || ms_arg_int(argc, argv, "--layers", 1, 1 << 20, &layers))
        return 2;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? n : 1;
    }
    o.config_path = ms_arg_str(argc, argv, "--config");
    o.out_dir = ms_arg_str(argc, argv, "--out");
    o.tokenizer_dir = ms_arg_str(argc, argv, "--tokenizer");
    const char *dt = ms_arg_str(argc, argv, "--dtype"), *edt = ms_arg_str(argc, argv, "--expert-dtype");
    if (dtype_arg(dt, &o.dtype) || o.dtype == MS_DT_F8_E4M3 || o.dtype == MS_DT_F4 || o.dtype == MS_DT_I4) {
        fprintf(stderr, "moonshine synth: --dtype must be f32, bf16 or f16\n");
        return 2;
    }
    o.expert_dtype = o.dtype;
    if (edt && !strcmp(edt, "int4-asym")) edt = "int4", o.int4_asym = 1; /* symmetric: false, weight_zero_point */
    if (dtype_arg(edt, &o.expert_dtype)) {
        fprintf(stderr, "moonshine synth: --expert-dtype must be f32, bf16, f16, fp8, mxfp4, int4 or int4-asym\n");
        return 2;
    }
    if (!o.config_path || !o.out_dir || ms_args_unknown(argc, argv, "synth")) {
        fputs(usage, stderr);
        return 2;
    }
    o.seed = (uint64_t)seed;
    o.threads = (int)threads;
    o.layers = (int)layers;
    o.shard_bytes = (uint64_t)shard << 20;
    ms_synth_result r;
    ms_err err = {0};
    double t0 = ms_now();
    ms_cli_progress cp;
    ms_cli_progress_init(&cp);
    o.progress = &cp.p;
    int src = ms_synth(&o, &r, &err);
    ms_cli_progress_end(&cp);
    if (src) {
        fprintf(stderr, "moonshine synth: %s\n", err.msg);
        return 1;
    }
    double dt_s = ms_now() - t0;
    printf("{\"out\":\"%s\",\"tensors\":%d,\"shards\":%d,\"bytes\":%llu,\"seconds\":%.2f,\"mb_s\":%.1f}\n", o.out_dir,
           r.n_tensors, r.n_shards, (unsigned long long)r.bytes, dt_s, r.bytes / 1e6 / (dt_s > 0 ? dt_s : 1));
    return 0;
}
