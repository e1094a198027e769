/* compress.c — KV window compression (see compress.h). */
#include "ops/compress.h"

#include <math.h>

int ms_compress_pool(const float *cur_kv, const float *cur_gate, const float *prev_kv, const float *prev_gate,
                     const float *ape, const float *norm, int rate, int dim, int overlap, float eps, float *out,
                     ms_err *err) {
    if (rate < 1 || dim < 1) return ms_fail(err, MS_ERR_ARG, "compress: rate %d and dim %d must be >= 1", rate, dim);
    if (!cur_kv || !cur_gate || !ape || !norm || !out || (!prev_kv) != (!prev_gate))
        return ms_fail(err, MS_ERR_ARG, "compress: missing input arrays");
    if (!overlap && prev_kv) return ms_fail(err, MS_ERR_ARG, "compress: a previous window needs overlap");
    int w = overlap ? 2 : 1, half = overlap ? dim : 0;
    double ss = 0;
    for (int c = 0; c < dim; c++) {
        float mx = -INFINITY;
        for (int r = 0; r < rate; r++) {
            float g = cur_gate[(size_t)r * w * dim + half + c] + ape[(size_t)r * w * dim + half + c];
            if (g > mx) mx = g;
            if (prev_kv) {
                g = prev_gate[(size_t)r * w * dim + c] + ape[(size_t)r * w * dim + c];
                if (g > mx) mx = g;
            }
        }
        double den = 0, num = 0;
        for (int r = 0; r < rate; r++) {
            double p = exp((double)(cur_gate[(size_t)r * w * dim + half + c] + ape[(size_t)r * w * dim + half + c]) - mx);
            den += p, num += p * cur_kv[(size_t)r * w * dim + half + c];
            if (prev_kv) {
                p = exp((double)(prev_gate[(size_t)r * w * dim + c] + ape[(size_t)r * w * dim + c]) - mx);
                den += p, num += p * prev_kv[(size_t)r * w * dim + c];
            }
        }
        out[c] = (float)(num / den);
        ss += (double)out[c] * out[c];
    }
    float r = (float)(1.0 / sqrt(ss / dim + eps));
    for (int c = 0; c < dim; c++) out[c] = out[c] * r * norm[c];
    return MS_OK;
}
