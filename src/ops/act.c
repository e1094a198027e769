/* act.c — gated activations beyond SwiGLU (contracts in ops.h). */
#include <math.h>

#include "ops/ops.h"

void ms_situ_glu(float *out, const float *gate, const float *up, int64_t n, float beta, float linear_beta) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i];
        float a = beta * tanhf(g / beta) * ms_sigmoid(g);
        if (linear_beta > 0) u = linear_beta * tanhf(u / linear_beta);
        out[i] = a * u;
    }
}
