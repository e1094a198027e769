/* rope.h — rotary position embedding: the parameters (default or YaRN), their
 * parsing from rope_parameters / rope_scaling, the per-position cos/sin and the
 * rotation itself. All of it is in model/rope.c. */
#ifndef MS_MODEL_ROPE_H
#define MS_MODEL_ROPE_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "util/err.h"

/* RoPE pairing: rotate_half (x_i, x_{i+d/2}) or interleaved pairs (x_2i, x_2i+1). */
typedef enum { MS_ROPE_HALF = 1, MS_ROPE_INTERLEAVED = 2 } ms_rope_layout;

typedef struct ms_rope {
    int dim;                 /* rotary dims (even) */
    ms_rope_layout layout;
    double theta;
    int yarn;                /* rope_type == "yarn" */
    double factor, beta_fast, beta_slow, mscale, mscale_all_dim, orig_max_pos;
    int truncate;
    double attn_factor;      /* multiplies cos/sin (YaRN attention_factor; 1 otherwise) */
    double inv_freq[512];    /* [dim/2] */
} ms_rope;

/* Parse one RoPE parameter object (rope_parameters / rope_scaling, or NULL for
 * defaults) into r: default or YaRN. theta: rope_theta found outside rp. */
int ms_rope_parse(const cJSON *rp, double theta, int64_t max_pos, int64_t rotary_dim, ms_rope_layout layout,
                  ms_rope *r, const char *where, ms_err *err);
/* Fill cos/sin [dim/2] for a position (already multiplied by attn_factor). */
void ms_rope_cos_sin(const ms_rope *r, int64_t pos, float *cos_out, float *sin_out);
/* Rotate one vector of rope->dim dims in place. */
void ms_rope_apply(const ms_rope *r, float *x, const float *cos, const float *sin);

#endif
