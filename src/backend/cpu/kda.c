/* kda.c — gated delta-rule attention on the CPU: short convolution, decay
 * gate, recurrent and chunked delta rule, gated RMSNorm (contracts in
 * ops/kda.h). The per-head kernels live in kda_kern.inc, compiled for AVX2+FMA
 * and for the baseline, chosen by the pool's ISA (ms_cpu_isa_of). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "ops/kda.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KDA_X86 1
#endif

#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpsabi" /* v8f only crosses static inline calls */
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

enum { KDA_SB = 16 }; /* sub-block of the chunked kernel's intra-chunk matrices */

#define KN(name) name##_base
#define KT
#include "kda_kern.inc"
#undef KN
#undef KT

#ifdef KDA_X86
#define KN(name) name##_avx2
#define KT __attribute__((target("avx2,fma")))
#include "kda_kern.inc"
#undef KN
#undef KT
#endif

/* The AVX2+FMA builds when the pool's ISA (backend/cpu/cpu.h) has them. */
static int use_avx2(const ms_pool *pool) {
#ifdef KDA_X86
    return ms_cpu_isa_of(pool) >= MS_ISA_AVX2;
#else
    (void)pool;
    return 0;
#endif
}

/* Denormals only arise here from products of decays that are already
 * negligible; flushing them keeps the running products fast. */
typedef struct { unsigned csr; } fpmode;
static fpmode fp_enter(void) {
    fpmode m = {0};
#ifdef KDA_X86
    m.csr = _mm_getcsr();
    _mm_setcsr(m.csr | 0x8040); /* FTZ | DAZ */
#endif
    return m;
}
static void fp_leave(fpmode m) {
#ifdef KDA_X86
    _mm_setcsr(m.csr);
#else
    (void)m;
#endif
}

/* ---- parameter vectors ---- */

static int64_t qmat_numel(const ms_qmat *w) { return w->rows * w->cols; }

static int vec_ok(const ms_qmat *w, int64_t want, const char *what, ms_err *err) {
    if (!w || !w->data) return ms_fail(err, MS_ERR_ARG, "%s: missing", what);
    if (w->dtype != MS_DT_F32 && w->dtype != MS_DT_BF16 && w->dtype != MS_DT_F16)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: dtype %s (want F32, BF16 or F16)", what, ms_dtype_name(w->dtype));
    if (w->rows < 1 || w->cols < 1 || qmat_numel(w) != want)
        return ms_fail(err, MS_ERR_SHAPE, "%s: %lld x %lld elements, want %lld", what, (long long)w->rows,
                       (long long)w->cols, (long long)want);
    return MS_OK;
}

/* ---- short convolution ---- */

enum { CONV_BLOCK = 64, CONV_KMAX = 16 };

typedef struct {
    float *y;
    int64_t ld_y;
    const float *x;
    int64_t ld_x;
    int n, channels, K, silu;
    const ms_qmat *w;
    float *state;
} conv_job;

static void conv_task(void *ctx, int task, int tid) {
    (void)tid;
    const conv_job *j = ctx;
    const int K = j->K, c0 = task * CONV_BLOCK;
    const int nc = j->channels - c0 < CONV_BLOCK ? j->channels - c0 : CONV_BLOCK;
    float w[CONV_BLOCK * CONV_KMAX], hist[CONV_BLOCK * CONV_KMAX]; /* hist[c*K + s]: window, oldest first */
    const size_t esz = (size_t)ms_dtype_bits(j->w->dtype) / 8;
    ms_to_f32(w, (const char *)j->w->data + (size_t)c0 * K * esz, j->w->dtype, (int64_t)nc * K);
    for (int c = 0; c < nc; c++)
        for (int s = 0; s < K - 1; s++) hist[c * K + s] = j->state[(int64_t)(c0 + c) * (K - 1) + s];
    for (int t = 0; t < j->n; t++) {
        const float *xt = j->x + (int64_t)t * j->ld_x + c0;
        float *yt = j->y + (int64_t)t * j->ld_y + c0;
        for (int c = 0; c < nc; c++) {
            float *hc = hist + c * K;
            hc[K - 1] = xt[c];
            const float *wc = w + c * K;
            float acc = 0;
            for (int s = 0; s < K; s++) acc += wc[s] * hc[s];
            memmove(hc, hc + 1, (size_t)(K - 1) * sizeof *hc);
            yt[c] = j->silu ? ms_silu(acc) : acc;
        }
    }
    for (int c = 0; c < nc; c++)
        for (int s = 0; s < K - 1; s++) j->state[(int64_t)(c0 + c) * (K - 1) + s] = hist[c * K + s];
}

int ms_short_conv(ms_pool *pool, float *y, int64_t ld_y, const float *x, int64_t ld_x, int n, int channels,
                  const ms_qmat *w, float *state, int silu, ms_err *err) {
    if (!y || !x || !w || (!state && w->cols > 1)) return ms_fail(err, MS_ERR_ARG, "short conv: NULL argument");
    if (n < 1 || channels < 1 || ld_x < channels || ld_y < channels)
        return ms_fail(err, MS_ERR_ARG, "short conv: n %d, channels %d, ld_x %lld, ld_y %lld", n, channels,
                       (long long)ld_x, (long long)ld_y);
    if (y == x && ld_y != ld_x) return ms_fail(err, MS_ERR_ARG, "short conv: in place needs ld_y == ld_x");
    if (w->cols < 1 || w->cols > CONV_KMAX)
        return ms_fail(err, MS_ERR_SHAPE, "short conv: kernel size %lld outside 1..%d", (long long)w->cols, CONV_KMAX);
    if (w->rows != channels)
        return ms_fail(err, MS_ERR_SHAPE, "short conv: weight has %lld rows, want %d channels", (long long)w->rows,
                       channels);
    int rc = vec_ok(w, (int64_t)channels * w->cols, "short conv weight", err);
    if (rc) return rc;
    conv_job j = {y, ld_y, x, ld_x, n, channels, (int)w->cols, silu, w, state};
    ms_pool_run(pool, (channels + CONV_BLOCK - 1) / CONV_BLOCK, conv_task, &j);
    return MS_OK;
}

/* ---- decay gate, beta ---- */

typedef struct {
    float *f;
    int64_t ld;
    int n, heads, width, lower, avx2, rows_per_task;
    const float *A, *bias;
    float lb;
} gate_job;

static void gate_task(void *ctx, int task, int tid) {
    (void)tid;
    const gate_job *j = ctx;
    int t0 = task * j->rows_per_task, t1 = t0 + j->rows_per_task < j->n ? t0 + j->rows_per_task : j->n;
    for (int t = t0; t < t1; t++) {
        float *row = j->f + (int64_t)t * j->ld;
#ifdef KDA_X86
        if (j->avx2) gate_row_avx2(row, j->heads, j->width, j->A, j->bias, j->lower, j->lb);
        else
#endif
            gate_row_base(row, j->heads, j->width, j->A, j->bias, j->lower, j->lb);
    }
}

int ms_decay_gate(ms_pool *pool, float *f, int64_t ld, int n, int heads, int width, const ms_qmat *A_log,
                  const ms_qmat *dt_bias, ms_decay_kind kind, float lower_bound, ms_err *err) {
    if (!f || n < 1 || heads < 1 || width < 1 || ld < (int64_t)heads * width)
        return ms_fail(err, MS_ERR_ARG, "decay gate: n %d, heads %d, width %d, ld %lld", n, heads, width, (long long)ld);
    if (kind != MS_DECAY_SOFTPLUS && kind != MS_DECAY_LOWER_BOUND)
        return ms_fail(err, MS_ERR_ARG, "decay gate: unknown kind %d", (int)kind);
    if (!A_log && kind == MS_DECAY_SOFTPLUS) return ms_fail(err, MS_ERR_ARG, "decay gate: softplus form needs A_log");
    if (kind == MS_DECAY_LOWER_BOUND && !(lower_bound < 0 && isfinite(lower_bound)))
        return ms_fail(err, MS_ERR_ARG, "decay gate: lower bound %g must be finite and negative", lower_bound);
    int rc;
    if (A_log && (rc = vec_ok(A_log, heads, "decay gate A_log", err))) return rc;
    if (dt_bias && (rc = vec_ok(dt_bias, (int64_t)heads * width, "decay gate dt_bias", err))) return rc;
    const int hw = heads * width;
    float *buf = malloc(((size_t)heads + (size_t)hw) * sizeof *buf);
    if (!buf) return ms_fail(err, MS_ERR_NOMEM, "decay gate: scratch");
    float *A = buf, *bias = buf + heads;
    if (A_log) {
        ms_to_f32(A, A_log->data, A_log->dtype, heads);
        for (int h = 0; h < heads; h++) A[h] = expf(A[h]);
    } else {
        for (int h = 0; h < heads; h++) A[h] = 1.0f;
    }
    if (dt_bias) ms_to_f32(bias, dt_bias->data, dt_bias->dtype, hw);
    else memset(bias, 0, (size_t)hw * sizeof *bias);
    gate_job j = {f, ld, n, heads, width, kind == MS_DECAY_LOWER_BOUND, use_avx2(pool), 16, A, bias, lower_bound};
    ms_pool_run(pool, (n + j.rows_per_task - 1) / j.rows_per_task, gate_task, &j);
    free(buf);
    return MS_OK;
}

void ms_sigmoid_rows(float *x, int64_t ld, int n, int width) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < width; i++) x[(int64_t)t * ld + i] = ms_sigmoid(x[(int64_t)t * ld + i]);
}

/* ---- gated RMSNorm ---- */

int ms_gated_rmsnorm(float *y, const float *x, const float *gate, int64_t rows, int d, const ms_qmat *w, float eps,
                     ms_gate_act act, ms_err *err) {
    if (!y || !x || !gate || rows < 0 || d < 1 || !(eps >= 0))
        return ms_fail(err, MS_ERR_ARG, "gated rmsnorm: rows %lld, d %d, eps %g", (long long)rows, d, eps);
    if (act != MS_GATE_SIGMOID && act != MS_GATE_SILU)
        return ms_fail(err, MS_ERR_ARG, "gated rmsnorm: unknown activation %d", (int)act);
    int rc;
    if (w && (rc = vec_ok(w, d, "gated rmsnorm weight", err))) return rc;
    float *wf = malloc((size_t)d * sizeof *wf);
    if (!wf) return ms_fail(err, MS_ERR_NOMEM, "gated rmsnorm: scratch");
    if (w) ms_to_f32(wf, w->data, w->dtype, d);
    else for (int i = 0; i < d; i++) wf[i] = 1.0f;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *gr = gate + r * d;
        float *yr = y + r * d;
        float ss = 0;
        for (int i = 0; i < d; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)d + eps);
        for (int i = 0; i < d; i++) {
            float gv = act == MS_GATE_SIGMOID ? ms_sigmoid(gr[i]) : ms_silu(gr[i]);
            yr[i] = xr[i] * inv * wf[i] * gv;
        }
    }
    free(wf);
    return MS_OK;
}

/* ---- the delta rule ---- */

static int delta_check(const ms_delta_args *a, const float *state, const char *who, ms_err *err) {
    if (!a || !state) return ms_fail(err, MS_ERR_ARG, "%s: NULL argument", who);
    if (!a->q || !a->k || !a->v || !a->g || !a->beta || !a->o)
        return ms_fail(err, MS_ERR_ARG, "%s: NULL q/k/v/g/beta/o", who);
    if (a->n < 1 || a->n_qk_heads < 1 || a->n_v_heads < 1 || a->n_v_heads % a->n_qk_heads)
        return ms_fail(err, MS_ERR_ARG, "%s: n %d, qk heads %d, v heads %d (v heads must be a multiple)", who, a->n,
                       a->n_qk_heads, a->n_v_heads);
    if (a->dk < 1 || a->dk > 1024 || a->dv < 1 || a->dv > 1024)
        return ms_fail(err, MS_ERR_ARG, "%s: head sizes dk %d, dv %d outside 1..1024", who, a->dk, a->dv);
    int64_t qk = (int64_t)a->n_qk_heads * a->dk, vw = (int64_t)a->n_v_heads * a->dv;
    int64_t gw = a->g_per_head ? a->n_v_heads : (int64_t)a->n_v_heads * a->dk;
    if (a->ld_q < qk || a->ld_k < qk || a->ld_v < vw || a->ld_o < vw || a->ld_g < gw || a->ld_beta < a->n_v_heads)
        return ms_fail(err, MS_ERR_ARG, "%s: a row stride is shorter than its row (q %lld, k %lld, v %lld, g %lld, "
                       "beta %lld, o %lld)", who, (long long)a->ld_q, (long long)a->ld_k, (long long)a->ld_v,
                       (long long)a->ld_g, (long long)a->ld_beta, (long long)a->ld_o);
    if (a->qk_l2norm && !(a->l2_eps >= 0)) return ms_fail(err, MS_ERR_ARG, "%s: l2 eps %g", who, a->l2_eps);
    if (!isfinite(a->scale)) return ms_fail(err, MS_ERR_ARG, "%s: scale %g", who, a->scale);
    return MS_OK;
}

typedef struct {
    const ms_delta_args *a;
    float *state;
    int chunk;
    int avx2;
    size_t scratch;
    int failed;
} delta_job;

static void recur_task(void *ctx, int h, int tid) {
    (void)tid;
    delta_job *j = ctx;
    float *scratch = malloc(j->scratch * sizeof *scratch);
    if (!scratch) {
        j->failed = 1;
        return;
    }
    fpmode m = fp_enter();
    float *S = j->state + (size_t)h * j->a->dk * j->a->dv;
#ifdef KDA_X86
    if (j->avx2) recur_head_avx2(j->a, h, S, scratch);
    else
#endif
        recur_head_base(j->a, h, S, scratch);
    fp_leave(m);
    free(scratch);
}

int ms_delta_recurrent(ms_pool *pool, const ms_delta_args *a, float *state, ms_err *err) {
    int rc = delta_check(a, state, "delta rule (recurrent)", err);
    if (rc) return rc;
    delta_job j = {a, state, 0, use_avx2(pool), 3 * (size_t)a->dk + 2 * (size_t)a->dv, 0};
    ms_pool_run(pool, a->n_v_heads, recur_task, &j);
    if (j.failed) return ms_fail(err, MS_ERR_NOMEM, "delta rule (recurrent): scratch");
    return MS_OK;
}

static void chunk_task(void *ctx, int h, int tid) {
    (void)tid;
    delta_job *j = ctx;
    float *scratch = malloc(j->scratch * sizeof *scratch);
    if (!scratch) {
        j->failed = 1;
        return;
    }
    fpmode m = fp_enter();
    float *S = j->state + (size_t)h * j->a->dk * j->a->dv;
#ifdef KDA_X86
    if (j->avx2) chunk_head_avx2(j->a, h, S, j->chunk, scratch);
    else
#endif
        chunk_head_base(j->a, h, S, j->chunk, scratch);
    fp_leave(m);
    free(scratch);
}

int ms_delta_chunked(ms_pool *pool, const ms_delta_args *a, float *state, int chunk, ms_err *err) {
    int rc = delta_check(a, state, "delta rule (chunked)", err);
    if (rc) return rc;
    if (chunk < 1 || chunk > 256) return ms_fail(err, MS_ERR_ARG, "delta rule (chunked): chunk %d outside 1..256", chunk);
    delta_job j = {a, state, chunk, use_avx2(pool), chunk_scratch_base(chunk, a->dk, a->dv), 0};
    ms_pool_run(pool, a->n_v_heads, chunk_task, &j);
    if (j.failed) return ms_fail(err, MS_ERR_NOMEM, "delta rule (chunked): scratch");
    return MS_OK;
}

int ms_delta_recurrent_ref(const ms_delta_args *a, float *state, ms_err *err) {
    int rc = delta_check(a, state, "delta rule (reference)", err);
    if (rc) return rc;
    const int dk = a->dk, dv = a->dv, rep = a->n_v_heads / a->n_qk_heads;
    float *buf = malloc((3 * (size_t)dk + (size_t)dv) * sizeof *buf);
    if (!buf) return ms_fail(err, MS_ERR_NOMEM, "delta rule (reference): scratch");
    float *qn = buf, *kn = qn + dk, *dec = kn + dk, *kv = dec + dk;
    for (int t = 0; t < a->n; t++)
        for (int h = 0; h < a->n_v_heads; h++) {
            const float *q = a->q + (int64_t)t * a->ld_q + (int64_t)(h / rep) * dk;
            const float *k = a->k + (int64_t)t * a->ld_k + (int64_t)(h / rep) * dk;
            float sq = 0, sk = 0;
            for (int i = 0; i < dk; i++) sq += q[i] * q[i], sk += k[i] * k[i];
            float nq = a->qk_l2norm ? 1.0f / sqrtf(sq + a->l2_eps) : 1.0f;
            float nk = a->qk_l2norm ? 1.0f / sqrtf(sk + a->l2_eps) : 1.0f;
            for (int i = 0; i < dk; i++) qn[i] = q[i] * nq * a->scale, kn[i] = k[i] * nk;
            const float *g = a->g + (int64_t)t * a->ld_g;
            for (int i = 0; i < dk; i++) dec[i] = expf(a->g_per_head ? g[h] : g[(int64_t)h * dk + i]);
            float beta = a->beta[(int64_t)t * a->ld_beta + h];
            const float *v = a->v + (int64_t)t * a->ld_v + (int64_t)h * dv;
            float *o = a->o + (int64_t)t * a->ld_o + (int64_t)h * dv;
            float *S = state + (size_t)h * dk * dv;
            for (int e = 0; e < dv; e++) kv[e] = 0;
            for (int i = 0; i < dk; i++)
                for (int e = 0; e < dv; e++) {
                    S[i * dv + e] *= dec[i];
                    kv[e] += kn[i] * S[i * dv + e];
                }
            for (int e = 0; e < dv; e++) kv[e] = beta * (v[e] - kv[e]);
            for (int e = 0; e < dv; e++) o[e] = 0;
            for (int i = 0; i < dk; i++)
                for (int e = 0; e < dv; e++) {
                    S[i * dv + e] += kn[i] * kv[e];
                    o[e] += qn[i] * S[i * dv + e];
                }
        }
    free(buf);
    return MS_OK;
}
