/* synth.h — deterministic random-weight checkpoints of any supported
 * architecture, in the original checkpoint layout, written in streaming
 * fashion (memory use is bounded by one 128-row block of the widest matrix
 * per writer thread). */
#ifndef MS_SYNTH_H
#define MS_SYNTH_H

#include <stdint.h>

#include "util/dtype.h"
#include "util/err.h"
#include "util/progress.h"

typedef struct ms_synth_opts {
    const char *config_path;  /* input config.json */
    const char *out_dir;      /* created if missing */
    uint64_t seed;
    ms_dtype dtype;           /* F32 or BF16: trunk and (by default) experts */
    ms_dtype expert_dtype;    /* BF16, F32, F8_E4M3 (128x128 block scales), F4 (MXFP4) or I4 */
    int int4_asym;            /* I4: asymmetric (symmetric false, weight_zero_point; ms_quant_i4z_row) */
    uint64_t shard_bytes;     /* max bytes per shard (0: 4 GiB) */
    const char *tokenizer_dir;/* optional: tokenizer files copied from here */
    const ms_progress *progress; /* optional: bytes of tensor data written (util/progress.h); called
                                  * from the writer threads, one call at a time */
    int layers;               /* > 0: num_hidden_layers cut to this, the config's per-layer lists
                               * with it (lists of num_hidden_layers entries keep their first
                               * layers; integer lists under a *_layers key keep 1..layers) */
    int threads;              /* tensor writers (<= 1: the caller alone); the bytes written do not
                               * depend on it (each tensor is drawn from (seed, name) alone) */
} ms_synth_opts;

typedef struct ms_synth_result {
    int n_tensors, n_shards;
    uint64_t bytes;
} ms_synth_result;

int ms_synth(const ms_synth_opts *o, ms_synth_result *res, ms_err *err);

#endif
