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

void ms_swiglu_param(float *g, float *u, int64_t n, float limit, float alpha, float up_offset) {
    if (limit > 0)
        for (int64_t i = 0; i < n; i++) {
            if (g[i] > limit) g[i] = limit;
            u[i] = u[i] > limit ? limit : u[i] < -limit ? -limit : u[i];
        }
    if (alpha == 1.0f && up_offset == 0.0f) {
        ms_swiglu(g, g, u, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) g[i] = (u[i] + up_offset) * g[i] * ms_sigmoid(alpha * g[i]);
}
