/* rope.c — RoPE parameters (default, YaRN), cos/sin and the rotation (model/rope.h). */
#include "model/rope.h"

#include <math.h>
#include <string.h>

#include "util/json.h"

static double get_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

int ms_rope_parse(const cJSON *rp, double theta, int64_t max_pos, int64_t rotary_dim, ms_rope_layout layout,
                  ms_rope *r, const char *where, ms_err *err) {
    memset(r, 0, sizeof *r);
    if (rotary_dim <= 0 || rotary_dim % 2 || rotary_dim / 2 > (int64_t)(sizeof r->inv_freq / sizeof *r->inv_freq))
        return ms_fail(err, MS_ERR_FORMAT, "%s: rotary dimension %lld must be even and at most 1024", where,
                       (long long)rotary_dim);
    r->dim = (int)rotary_dim;
    r->layout = layout;
    r->theta = theta;
    r->attn_factor = 1.0;
    const char *type = "default";
    int rc = MS_OK;
    if (rp) {
        rc = ms_json_opt_double(rp, "rope_theta", &r->theta, where, err);
        if (!rc) rc = ms_json_opt_string(rp, "rope_type", &type, where, err);
        if (!rc && !strcmp(type, "default")) rc = ms_json_opt_string(rp, "type", &type, where, err);
    }
    if (rc) return rc;
    if (!(r->theta > 0)) return ms_fail(err, MS_ERR_FORMAT, "%s: rope_theta must be positive", where);
    for (int i = 0; i < r->dim / 2; i++) r->inv_freq[i] = 1.0 / pow(r->theta, (double)(2 * i) / r->dim);
    if (!strcmp(type, "default")) return MS_OK;
    if (strcmp(type, "yarn") != 0)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: rope_type \"%s\" is not supported (default, yarn)", where, type);
    r->yarn = 1;
    r->factor = 1;
    r->beta_fast = 32;
    r->beta_slow = 1;
    r->orig_max_pos = (double)max_pos;
    r->truncate = 1;
    double attn_factor = NAN;
    if ((rc = ms_json_opt_double(rp, "factor", &r->factor, where, err)) ||
        (rc = ms_json_opt_double(rp, "beta_fast", &r->beta_fast, where, err)) ||
        (rc = ms_json_opt_double(rp, "beta_slow", &r->beta_slow, where, err)) ||
        (rc = ms_json_opt_double(rp, "mscale", &r->mscale, where, err)) ||
        (rc = ms_json_opt_double(rp, "mscale_all_dim", &r->mscale_all_dim, where, err)) ||
        (rc = ms_json_opt_double(rp, "attention_factor", &attn_factor, where, err)) ||
        (rc = ms_json_opt_bool(rp, "truncate", &r->truncate, where, err)))
        return rc;
    if (r->beta_fast == 0) r->beta_fast = 32;
    if (r->beta_slow == 0) r->beta_slow = 1;
    const cJSON *omp = cJSON_GetObjectItemCaseSensitive(rp, "original_max_position_embeddings");
    if (omp && !cJSON_IsNull(omp)) {
        if (!cJSON_IsNumber(omp) || omp->valuedouble <= 0)
            return ms_fail(err, MS_ERR_FORMAT, "%s: original_max_position_embeddings must be positive", where);
        r->orig_max_pos = omp->valuedouble;
    }
    /* transformers 5.17 derives the attention factor from the configured factor
     * (checked against gpt-oss, whose max_position_embeddings equals the original) */
    double factor = r->factor;
    if (!(r->factor >= 1)) return ms_fail(err, MS_ERR_FORMAT, "%s: yarn factor must be >= 1", where);
    if (isnan(attn_factor)) {
        if (r->mscale != 0 && r->mscale_all_dim != 0)
            attn_factor = get_mscale(factor, r->mscale) / get_mscale(factor, r->mscale_all_dim);
        else
            attn_factor = get_mscale(factor, 1.0);
    }
    r->attn_factor = attn_factor;
    /* correction range over the rotary dims (transformers _compute_yarn_parameters) */
    double d = r->dim, base = r->theta;
    double lo = d * log(r->orig_max_pos / (r->beta_fast * 2 * M_PI)) / (2 * log(base));
    double hi = d * log(r->orig_max_pos / (r->beta_slow * 2 * M_PI)) / (2 * log(base));
    if (r->truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    if (lo < 0) lo = 0;
    if (hi > d - 1) hi = d - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < r->dim / 2; i++) {
        double pos_freq = pow(base, (double)(2 * i) / d);
        double extra = 1.0 / pos_freq, inter = 1.0 / (r->factor * pos_freq);
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extra_factor = 1 - ramp;
        r->inv_freq[i] = inter * (1 - extra_factor) + extra * extra_factor;
    }
    return MS_OK;
}

void ms_rope_cos_sin(const ms_rope *r, int64_t pos, float *cos_out, float *sin_out) {
    for (int i = 0; i < r->dim / 2; i++) {
        /* transformers forms the angle in float32: pos * inv_freq(float32) */
        float ang = (float)pos * (float)r->inv_freq[i];
        cos_out[i] = (float)(cos((double)ang) * r->attn_factor);
        sin_out[i] = (float)(sin((double)ang) * r->attn_factor);
    }
}

void ms_rope_apply(const ms_rope *r, float *x, const float *cs, const float *sn) {
    int h = r->dim / 2;
    if (r->layout == MS_ROPE_INTERLEAVED) {
        for (int i = 0; i < h; i++) {
            float a = x[2 * i], b = x[2 * i + 1];
            x[2 * i] = a * cs[i] - b * sn[i];
            x[2 * i + 1] = b * cs[i] + a * sn[i];
        }
    } else {
        for (int i = 0; i < h; i++) {
            float a = x[i], b = x[i + h];
            x[i] = a * cs[i] - b * sn[i];
            x[i + h] = b * cs[i] + a * sn[i];
        }
    }
}
