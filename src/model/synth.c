/* synth.c — see synth.h. Values: Linear weights U(-a, a) with std 0.02
 * (transformers' initializer_range), norms 1 ± 0.1, small vectors ± 0.01.
 * Each tensor's values depend only on (seed, name): sharding does not change them. */
#include "model/synth.h"

#include "util/progress.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/strmap.h"
#include "util/threadpool.h"

typedef struct {
    char name[200];
    ms_dtype dtype;
    int ndim;
    int64_t shape[4];
    ms_wkind kind;
    int scale_of;      /* for a scale tensor: index of its weight; -1 otherwise */
    int f4;            /* MXFP4 weight_packed (U8 [rows, cols/2]); its weight_scale follows */
    int i4;            /* INT4 pack-quantized weight_packed (I32 [rows, cols/8]); weight_scale, weight_shape follow */
    int shard;
    uint64_t offset, nbytes;
} synth_tensor;

typedef struct { uint64_t s[2]; } rng_t;

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(rng_t *r, uint64_t seed, const char *name) {
    uint64_t x = seed ^ ms_hash_str(name);
    r->s[0] = splitmix(&x);
    r->s[1] = splitmix(&x);
}

static inline uint64_t rng_next(rng_t *r) { /* xorshift128+ */
    uint64_t a = r->s[0], b = r->s[1];
    r->s[0] = b;
    a ^= a << 23;
    r->s[1] = a ^ b ^ (a >> 17) ^ (b >> 26);
    return r->s[1] + b;
}

/* n values uniform in [center - half, center + half) */
static void fill_uniform(rng_t *r, float *out, int64_t n, float center, float half) {
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint64_t v = rng_next(r);
        out[i] = center + half * ((float)(v >> 40) * (2.0f / 16777216.0f) - 1.0f);
        out[i + 1] = center + half * ((float)((v >> 8) & 0xffffff) * (2.0f / 16777216.0f) - 1.0f);
    }
    if (i < n) out[i] = center + half * ((float)(rng_next(r) >> 40) * (2.0f / 16777216.0f) - 1.0f);
}

static void dist(ms_wkind k, float *center, float *half) {
    *center = 0;
    switch (k) {
    case MS_W_NORM: *center = 1.0f; *half = 0.1f; break;
    case MS_W_VECTOR: *half = 0.01f; break;
    default: *half = 0.02f * 1.7320508f; break;
    }
}

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off, const char *path, ms_err *err) {
    const char *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return ms_fail(err, MS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return MS_OK;
}

static int64_t nelem(const synth_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* MXFP4 (OCP MX, e2m1 with one E8M0 scale per 32 values along a row): the
 * scale is 2^(floor(log2(amax)) - 2), so amax / scale lies in [4, 8) and values
 * round to the nearest of {0, .5, 1, 1.5, 2, 3, 4, 6} (saturating at 6). Two
 * values per byte, low nibble = even column; scale byte = exponent + 127. */
static uint8_t e2m1_nibble(float v) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float a = fabsf(v);
    int best = 0;
    for (int k = 1; k < 8; k++)
        if (fabsf(a - mag[k]) < fabsf(a - mag[best])) best = k;
    return (uint8_t)(best | (v < 0 && best ? 8 : 0));
}

static void quantize_mxfp4(const float *f, int64_t n_rows, int64_t cols, uint8_t *packed, uint8_t *scales) {
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t g = 0; g < cols / 32; g++) {
            const float *x = f + r * cols + g * 32;
            float amax = 0;
            for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(x[k]));
            int e = amax > 0 ? (int)floorf(log2f(amax)) - 2 : 0;
            if (e < -127) e = -127;
            if (e > 127) e = 127;
            scales[r * (cols / 32) + g] = (uint8_t)(e + 127);
            float inv = ldexpf(1.0f, -e);
            uint8_t *o = packed + r * (cols / 2) + g * 16;
            for (int k = 0; k < 16; k++)
                o[k] = (uint8_t)(e2m1_nibble(x[2 * k] * inv) | (e2m1_nibble(x[2 * k + 1] * inv) << 4));
        }
}

/* Write tensor ts[i] (and, for an FP8 or MXFP4 weight, its scale ts[i+1]; INT4: its scale,
 * weight_shape and, asymmetric (int4_asym), weight_zero_point ts[i+1..i+3]) into fd. */
static int write_tensor(int fd, const char *path, synth_tensor *ts, int i, uint64_t data_start, uint64_t seed,
                        int int4_asym, ms_err *err) {
    synth_tensor *t = &ts[i];
    const int o_asym = t->i4 && int4_asym;
    rng_t r;
    char base[sizeof t->name];
    snprintf(base, sizeof base, "%s", t->name);
    if (t->f4 || t->i4) base[strlen(base) - 7] = 0; /* X.weight_packed draws the values of X.weight */
    rng_seed(&r, seed, base);
    float center, half;
    dist(t->kind, &center, &half);
    /* rows x cols: all leading dims x the last one (1-D: one row) */
    int64_t cols = t->ndim ? t->shape[t->ndim - 1] : 1, rows = cols ? nelem(t) / cols : 0;
    if (t->f4) cols *= 2; /* weight_packed holds two values per byte */
    if (t->i4) cols *= 8; /* INT4 weight_packed: eight values per int32 */
    int64_t brows = t->dtype == MS_DT_F8_E4M3 ? 128 : (rows < 64 ? rows : 64);
    int esz = ms_dtype_bits(t->dtype) / 8;
    float *f = malloc((size_t)(brows * cols) * sizeof *f);
    uint8_t *o = malloc((size_t)(brows * cols) * (size_t)esz);
    int64_t sc_cols = (cols + 127) / 128;
    float *scales = t->dtype == MS_DT_F8_E4M3 ? malloc((size_t)sc_cols * sizeof *scales) : NULL;
    int rc = MS_OK;
    if (!f || !o || (t->dtype == MS_DT_F8_E4M3 && !scales)) {
        rc = ms_fail(err, MS_ERR_NOMEM, "out of memory synthesizing %s", t->name);
        goto done;
    }
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += brows) {
        int64_t nr = rows - r0 < brows ? rows - r0 : brows, n = nr * cols;
        fill_uniform(&r, f, n, center, half);
        if (t->i4) { /* compressed-tensors symmetric INT4, groups of 32 (ms_quant_i4_row) */
            int64_t ng = (cols + 31) / 32;
            int32_t *pk = (int32_t *)o;
            uint16_t *sc = (uint16_t *)(o + n / 2); /* o holds 4n bytes: packed n/2, then scales */
            if (!o_asym) {
                for (int64_t rr = 0; rr < nr; rr++)
                    ms_quant_i4_row(f + rr * cols, cols, 32, pk + rr * (cols / 8), sc + rr * ng);
            } else { /* asymmetric: zero points packed 8 rows per int32 (r0 is a multiple of 8) */
                int8_t *zp = (int8_t *)(o + n);                 /* nr * ng signed zero points */
                uint32_t *zw = (uint32_t *)(o + n / 2 + n / 8); /* ceil(nr / 8) * ng words */
                int64_t nzr = (nr + 7) / 8;
                memset(zw, 0, (size_t)(nzr * ng) * 4);
                for (int64_t rr = 0; rr < nr; rr++) {
                    ms_quant_i4z_row(f + rr * cols, cols, 32, pk + rr * (cols / 8), sc + rr * ng, zp + rr * ng);
                    for (int64_t g = 0; g < ng; g++)
                        zw[(rr / 8) * ng + g] |= (uint32_t)(zp[rr * ng + g] + 8) << (4 * (rr % 8));
                }
                rc = pwrite_all(fd, zw, (size_t)(nzr * ng * 4), data_start + ts[i + 3].offset + (uint64_t)(r0 / 8 * ng * 4),
                                path, err);
                if (rc) continue;
            }
            rc = pwrite_all(fd, sc, (size_t)(nr * ng * 2), data_start + ts[i + 1].offset + (uint64_t)(r0 * ng * 2), path, err);
            if (!rc)
                rc = pwrite_all(fd, pk, (size_t)(n / 2), data_start + t->offset + (uint64_t)(r0 * (cols / 2)), path, err);
            if (!rc && r0 == 0) {
                int32_t shp[2] = {(int32_t)rows, (int32_t)cols};
                rc = pwrite_all(fd, shp, sizeof shp, data_start + ts[i + 2].offset, path, err);
            }
            continue;
        }
        if (t->f4) {
            uint8_t *sc = o + n / 2; /* o holds n bytes: packed n/2, then n/32 scale bytes */
            quantize_mxfp4(f, nr, cols, o, sc);
            const synth_tensor *st = &ts[i + 1];
            rc = pwrite_all(fd, sc, (size_t)(n / 32), data_start + st->offset + (uint64_t)(r0 * (cols / 32)), path, err);
            if (!rc)
                rc = pwrite_all(fd, o, (size_t)(n / 2), data_start + t->offset + (uint64_t)(r0 * (cols / 2)), path, err);
            continue;
        }
        if (t->dtype == MS_DT_F32) memcpy(o, f, (size_t)n * 4);
        else if (t->dtype == MS_DT_BF16)
            for (int64_t k = 0; k < n; k++) ((uint16_t *)o)[k] = ms_f32_to_bf16(f[k]);
        else if (t->dtype == MS_DT_F16)
            for (int64_t k = 0; k < n; k++) ((uint16_t *)o)[k] = ms_f32_to_f16(f[k]);
        else { /* FP8 e4m3 with one scale per 128x128 block: scale = amax / 448 */
            for (int64_t cb = 0; cb < sc_cols; cb++) {
                int64_t c0 = cb * 128, c1 = c0 + 128 < cols ? c0 + 128 : cols;
                float amax = 0;
                for (int64_t rr = 0; rr < nr; rr++)
                    for (int64_t c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(f[rr * cols + c]));
                float s = amax > 0 ? amax / 448.0f : 1.0f;
                scales[cb] = s;
                for (int64_t rr = 0; rr < nr; rr++)
                    for (int64_t c = c0; c < c1; c++) o[rr * cols + c] = ms_f32_to_fp8_e4m3(f[rr * cols + c] / s);
            }
            const synth_tensor *st = &ts[i + 1];
            rc = pwrite_all(fd, scales, (size_t)sc_cols * 4, data_start + st->offset + (uint64_t)(r0 / 128 * sc_cols) * 4,
                            path, err);
            if (rc) break;
        }
        rc = pwrite_all(fd, o, (size_t)n * (size_t)esz, data_start + t->offset + (uint64_t)(r0 * cols * esz), path, err);
    }
done:
    free(f);
    free(o);
    free(scales);
    return rc;
}

/* One shard's tensors written by a pool: task k writes ts[items[k]] (with its scales) at its
 * own offsets, so the bytes do not depend on the order or the thread count. The first failure (in
 * task order it is whichever fails first in time) is kept in rc / err; later tasks then skip. */
typedef struct {
    int fd;
    const char *path;
    synth_tensor *ts;
    const int *items; /* [n_items] indices of the shard's weights (scales go with their weight) */
    int n, n_items;
    uint64_t data_start;
    const ms_synth_opts *o;
    pthread_mutex_t mu; /* guards rc, err, *total and the progress callback */
    int rc;
    uint64_t *total, all;
    ms_err *err;
} shard_job;

static void write_job(void *ctx, int task, int tid) {
    (void)tid;
    shard_job *j = ctx;
    int i = j->items[task];
    pthread_mutex_lock(&j->mu);
    int failed = j->rc;
    pthread_mutex_unlock(&j->mu);
    if (failed) return;
    ms_err e = {0};
    int rc = write_tensor(j->fd, j->path, j->ts, i, j->data_start, j->o->seed, j->o->int4_asym, &e);
    uint64_t bytes = j->ts[i].nbytes;
    for (int f = i + 1; f < j->n && j->ts[f].scale_of == i; f++) bytes += j->ts[f].nbytes;
    pthread_mutex_lock(&j->mu);
    if (rc && !j->rc) {
        j->rc = rc;
        *j->err = e;
    } else if (!rc && !j->rc) {
        *j->total += bytes;
        ms_progress_report(j->o->progress, "synth", MS_PROGRESS_BYTES, *j->total, j->all);
    }
    pthread_mutex_unlock(&j->mu);
}

static int copy_file(const char *src, const char *dst, ms_err *err) {
    char *buf;
    size_t len;
    int rc = ms_read_file(src, 1u << 30, &buf, &len, err);
    if (rc) return rc;
    rc = ms_write_file_atomic(dst, buf, len, err);
    free(buf);
    return rc;
}

/* Declare compressed-tensors MXFP4 in the config object that holds the text
 * model (text_config for multimodal wrappers, as config.c reads it): the
 * routed experts are packed, everything else is listed as ignored. */
static int declare_mxfp4(cJSON *cj, const char *where, ms_err *err) {
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(cj, "text_config");
    cJSON *dst = cJSON_IsObject(tc) && !cJSON_GetObjectItemCaseSensitive(cj, "vocab_size") ? tc : cj;
    cJSON *q = cJSON_CreateObject();
    if (!q) return ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", where);
    cJSON_AddStringToObject(q, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(q, "format", "mxfp4-pack-quantized");
    cJSON_AddStringToObject(q, "quantization_status", "compressed");
    cJSON *g = cJSON_AddObjectToObject(cJSON_AddObjectToObject(q, "config_groups"), "group_0");
    cJSON_AddStringToObject(g, "format", "mxfp4-pack-quantized");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(g, "targets"), cJSON_CreateString("Linear"));
    cJSON *w = cJSON_AddObjectToObject(g, "weights");
    cJSON_AddNumberToObject(w, "num_bits", 4);
    cJSON_AddStringToObject(w, "type", "float");
    cJSON_AddStringToObject(w, "strategy", "group");
    cJSON_AddNumberToObject(w, "group_size", 32);
    cJSON_AddBoolToObject(w, "symmetric", 1);
    cJSON_AddBoolToObject(w, "dynamic", 0);
    cJSON_AddStringToObject(w, "scale_dtype", "torch.uint8");
    cJSON *ign = cJSON_AddArrayToObject(q, "ignore");
    const char *pats[] = {"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                          "re:.*lm_head.*", "re:.*routed_expert_(down|up)_proj.*", "re:.*block_sparse_moe\\.gate.*",
                          "re:.*vision_tower.*", "re:.*mm_projector.*"};
    for (size_t i = 0; i < sizeof pats / sizeof *pats; i++) cJSON_AddItemToArray(ign, cJSON_CreateString(pats[i]));
    cJSON_DeleteItemFromObjectCaseSensitive(dst, "quantization_config");
    cJSON_AddItemToObject(dst, "quantization_config", q);
    return MS_OK;
}

/* Declare compressed-tensors INT4 pack-quantized as Kimi K2-Thinking / K2.5 publish it
 * (symmetric int4 in groups of 32, BF16 scales, its ignore list), plus one ignore entry
 * for every module that is not a routed expert, so the routed experts alone are INT4
 * on every architecture (the plan reads the same lists: ms_config_ct_quantized). */
static int declare_int4(cJSON *cj, int asym, const char *where, ms_err *err) {
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(cj, "text_config");
    cJSON *dst = cJSON_IsObject(tc) && !cJSON_GetObjectItemCaseSensitive(cj, "vocab_size") ? tc : cj;
    cJSON *q = cJSON_CreateObject();
    if (!q) return ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", where);
    cJSON_AddStringToObject(q, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(q, "format", "pack-quantized");
    cJSON_AddStringToObject(q, "quantization_status", "compressed");
    cJSON_AddNullToObject(q, "kv_cache_scheme");
    cJSON *g = cJSON_AddObjectToObject(cJSON_AddObjectToObject(q, "config_groups"), "group_0");
    cJSON_AddNullToObject(g, "input_activations");
    cJSON_AddNullToObject(g, "output_activations");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(g, "targets"), cJSON_CreateString("Linear"));
    cJSON *w = cJSON_AddObjectToObject(g, "weights");
    cJSON_AddNullToObject(w, "actorder");
    cJSON_AddNullToObject(w, "block_structure");
    cJSON_AddBoolToObject(w, "dynamic", 0);
    cJSON_AddNumberToObject(w, "group_size", 32);
    cJSON_AddNumberToObject(w, "num_bits", 4);
    cJSON_AddStringToObject(w, "observer", "minmax");
    cJSON_AddStringToObject(w, "strategy", "group");
    cJSON_AddBoolToObject(w, "symmetric", !asym);
    cJSON_AddStringToObject(w, "type", "int");
    cJSON *ign = cJSON_AddArrayToObject(q, "ignore");
    const char *pats[] = {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                          "re:(?!.*\\.experts\\.\\d+\\.).*"};
    for (size_t i = 0; i < sizeof pats / sizeof *pats; i++) cJSON_AddItemToArray(ign, cJSON_CreateString(pats[i]));
    cJSON_DeleteItemFromObjectCaseSensitive(dst, "quantization_config");
    cJSON_AddItemToObject(dst, "quantization_config", q);
    return MS_OK;
}

static ms_dtype pick_dtype(const ms_synth_opts *o, const ms_config *c, ms_wkind k) {
    if (k == MS_W_EXPERT) return o->expert_dtype;
    if (k == MS_W_MATRIX && c->fp8) return MS_DT_F8_E4M3;
    return o->dtype;
}

/* Whether key names a list of layer numbers (linear_attn_config's kda_layers, full_attn_layers). */
static int layer_list_key(const char *key) {
    size_t n = key ? strlen(key) : 0;
    return n > 7 && !strcmp(key + n - 7, "_layers");
}

/* Cut the layer lists of one JSON object to n layers of old: arrays of exactly old entries
 * (layer_types, mlp_layer_types, ...) keep their first n; integer lists under a *_layers key
 * keep the entries 1..n (the 1-based layer numbers Kimi Linear's linear_attn_config writes).
 * depth: objects below this one are cut too (one level: linear_attn_config). */
static void cut_lists(cJSON *obj, int old, int n, int depth) {
    cJSON *it = obj ? obj->child : NULL;
    for (; it; it = it->next) {
        if (cJSON_IsObject(it) && depth > 0) {
            cut_lists(it, old, n, depth - 1);
        } else if (cJSON_IsArray(it) && layer_list_key(it->string)) {
            for (int i = cJSON_GetArraySize(it) - 1; i >= 0; i--) {
                const cJSON *v = cJSON_GetArrayItem(it, i);
                if (cJSON_IsNumber(v) && v->valuedouble > n) cJSON_DeleteItemFromArray(it, i);
            }
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == old) {
            for (int i = old - 1; i >= n; i--) cJSON_DeleteItemFromArray(it, i);
        }
    }
}

/* o->layers > 0: the config text with num_hidden_layers cut to o->layers and its per-layer
 * lists with it (cut_lists); *text is replaced (the caller frees it). */
static int cut_config(const ms_synth_opts *o, char **text, size_t *len, ms_err *err) {
    cJSON *j = NULL;
    int rc = ms_json_parse(*text, *len, o->config_path, &j, err);
    if (rc) return rc;
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(j, "num_hidden_layers");
    if (!ms_json_is_int(nl, 1, MS_MAX_LAYERS)) {
        cJSON_Delete(j);
        return ms_fail(err, MS_ERR_FORMAT, "%s: --layers needs an integer num_hidden_layers", o->config_path);
    }
    int old = (int)nl->valuedouble;
    if (o->layers > old) {
        cJSON_Delete(j);
        return ms_fail(err, MS_ERR_ARG, "synth: --layers %d is more than the config's %d layers", o->layers, old);
    }
    cut_lists(j, old, o->layers, 1);
    cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "num_hidden_layers"), o->layers);
    char *cs = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!cs) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    free(*text);
    *text = cs;
    *len = strlen(cs);
    return MS_OK;
}

int ms_synth(const ms_synth_opts *o, ms_synth_result *res, ms_err *err) {
    char *text = NULL;
    size_t len;
    cJSON *cj = NULL;
    synth_tensor *ts = NULL;
    ms_tensor_spec *specs = NULL;
    int n_specs = 0, rc, *items = NULL;
    ms_pool *pool = NULL;
    memset(res, 0, sizeof *res);
    if (o->dtype != MS_DT_F32 && o->dtype != MS_DT_BF16 && o->dtype != MS_DT_F16)
        return ms_fail(err, MS_ERR_ARG, "synth: --dtype must be f32, bf16 or f16");
    if (o->expert_dtype != MS_DT_F32 && o->expert_dtype != MS_DT_BF16 && o->expert_dtype != MS_DT_F16 &&
        o->expert_dtype != MS_DT_F8_E4M3 && o->expert_dtype != MS_DT_F4 && o->expert_dtype != MS_DT_I4)
        return ms_fail(err, MS_ERR_ARG, "synth: --expert-dtype must be f32, bf16, f16, fp8, mxfp4 or int4");
    if ((rc = ms_read_file(o->config_path, 16u << 20, &text, &len, err))) return rc;
    if (o->layers > 0 && (rc = cut_config(o, &text, &len, err))) goto out;
    ms_config cfg;
    if ((rc = ms_config_parse(text, len, o->config_path, &cfg, err))) goto out;
    if ((rc = ms_json_parse(text, len, o->config_path, &cj, err))) goto out;
    if (o->expert_dtype == MS_DT_F8_E4M3 && !cfg.fp8) {
        /* declare the block format the FP8 tensors use */
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "quant_method", "fp8");
        cJSON_AddStringToObject(q, "fmt", "e4m3");
        cJSON_AddStringToObject(q, "activation_scheme", "dynamic");
        cJSON *bs = cJSON_AddArrayToObject(q, "weight_block_size");
        cJSON_AddItemToArray(bs, cJSON_CreateNumber(128));
        cJSON_AddItemToArray(bs, cJSON_CreateNumber(128));
        cJSON_DeleteItemFromObjectCaseSensitive(cj, "quantization_config");
        cJSON_AddItemToObject(cj, "quantization_config", q);
        cfg.fp8 = 0; /* the static tier stays in --dtype */
    }
    if (o->expert_dtype == MS_DT_F4 && (rc = declare_mxfp4(cj, o->config_path, err))) goto out;
    ms_config qcfg;
    memset(&qcfg, 0, sizeof qcfg); /* INT4: which matrices the declared config groups quantize */
    if (o->expert_dtype == MS_DT_I4) {
        char *qs = NULL;
        if ((rc = declare_int4(cj, o->int4_asym, o->config_path, err))) goto out;
        if (!(qs = cJSON_PrintUnformatted(cj))) { rc = ms_fail(err, MS_ERR_NOMEM, "out of memory"); goto out; }
        rc = ms_config_parse(qs, strlen(qs), o->config_path, &qcfg, err);
        free(qs);
        if (rc) goto out;
    }
    if (cfg.fp8 && (cfg.fp8_block[0] != 128 || cfg.fp8_block[1] != 128)) {
        rc = ms_fail(err, MS_ERR_UNSUPPORTED, "synth: only 128x128 FP8 blocks are generated");
        goto out;
    }
    if ((rc = ms_model_specs(&cfg, &specs, &n_specs, err))) goto out;
    ts = calloc((size_t)n_specs * 4 + 1, sizeof *ts);
    if (!ts) { rc = ms_fail(err, MS_ERR_NOMEM, "out of memory"); goto out; }
    int n = 0;
    for (int i = 0; i < n_specs; i++) {
        synth_tensor *t = &ts[n++];
        snprintf(t->name, sizeof t->name, "%s", specs[i].name);
        t->ndim = specs[i].ndim;
        memcpy(t->shape, specs[i].shape, sizeof t->shape);
        t->kind = specs[i].kind;
        t->dtype = t->ndim == 2 ? pick_dtype(o, &cfg, t->kind) : o->dtype;
        t->scale_of = -1;
        if (o->expert_dtype == MS_DT_I4 && t->ndim == 2 && (t->kind == MS_W_EXPERT || t->kind == MS_W_MATRIX)) {
            size_t nl = strlen(t->name);
            char mod[sizeof t->name];
            snprintf(mod, sizeof mod, "%.*s", (int)(nl > 7 ? nl - 7 : 0), t->name);
            int q = nl > 7 && !strcmp(t->name + nl - 7, ".weight") && t->shape[1] % 8 == 0 && ms_config_ct_quantized(&qcfg, mod);
            if (!q && t->dtype == MS_DT_I4) t->dtype = o->dtype;
            if (q) { /* compressed-tensors: X.weight -> X.weight_packed + X.weight_scale + X.weight_shape */
                int64_t cols = t->shape[1];
                if (nl + 7 >= sizeof t->name) {
                    rc = ms_fail(err, MS_ERR_ARG, "synth: cannot name the INT4 tensors of %s", t->name);
                    goto out;
                }
                strcat(t->name, "_packed");
                t->dtype = MS_DT_I32;
                t->i4 = 1;
                t->shape[1] = cols / 8;
                t->nbytes = (uint64_t)t->shape[0] * (uint64_t)t->shape[1] * 4;
                synth_tensor *sct = &ts[n++];
                memcpy(sct->name, t->name, sizeof sct->name);
                memcpy(sct->name + nl, "_scale", 7);
                sct->ndim = 2;
                sct->shape[0] = t->shape[0];
                sct->shape[1] = (cols + 31) / 32;
                sct->dtype = MS_DT_BF16;
                sct->kind = MS_W_VECTOR;
                sct->scale_of = n - 2;
                sct->nbytes = (uint64_t)sct->shape[0] * (uint64_t)sct->shape[1] * 2;
                synth_tensor *wst = &ts[n++];
                memcpy(wst->name, t->name, sizeof wst->name);
                memcpy(wst->name + nl, "_shape", 7);
                wst->ndim = 1;
                wst->shape[0] = 2;
                wst->dtype = MS_DT_I32;
                wst->kind = MS_W_VECTOR;
                wst->scale_of = n - 3;
                wst->nbytes = 8;
                if (o->int4_asym) { /* X.weight_zero_point I32 [ceil(rows/8), groups] */
                    synth_tensor *zt = &ts[n++];
                    if (nl + 12 > sizeof zt->name) {
                        rc = ms_fail(err, MS_ERR_ARG, "synth: cannot name the INT4 zero points of %s", t->name);
                        goto out;
                    }
                    memcpy(zt->name, t->name, nl);
                    memcpy(zt->name + nl, "_zero_point", 12);
                    zt->ndim = 2;
                    zt->shape[0] = (t->shape[0] + 7) / 8;
                    zt->shape[1] = sct->shape[1];
                    zt->dtype = MS_DT_I32;
                    zt->kind = MS_W_VECTOR;
                    zt->scale_of = n - 4;
                    zt->nbytes = (uint64_t)zt->shape[0] * (uint64_t)zt->shape[1] * 4;
                }
                continue;
            }
        }
        if (t->dtype == MS_DT_F4) { /* compressed-tensors: X.weight -> X.weight_packed + X.weight_scale */
            if (t->ndim != 2 || t->shape[1] % 32) {
                rc = ms_fail(err, MS_ERR_UNSUPPORTED, "synth: %s is not a matrix with a multiple of 32 columns (MXFP4)",
                             t->name);
                goto out;
            }
            size_t nl = strlen(t->name);
            if (nl < 7 || strcmp(t->name + nl - 7, ".weight") || nl + 7 >= sizeof t->name) {
                rc = ms_fail(err, MS_ERR_ARG, "synth: cannot name the MXFP4 tensors of %s", t->name);
                goto out;
            }
            int64_t cols = t->shape[1];
            strcat(t->name, "_packed");
            t->dtype = MS_DT_U8;
            t->f4 = 1;
            t->shape[1] = cols / 2;
            t->nbytes = (uint64_t)t->shape[0] * (uint64_t)t->shape[1];
            synth_tensor *sct = &ts[n++];
            memcpy(sct->name, t->name, sizeof sct->name);
            memcpy(sct->name + nl, "_scale", 7); /* X.weight -> X.weight_scale */
            sct->ndim = 2;
            sct->shape[0] = t->shape[0];
            sct->shape[1] = cols / 32;
            sct->dtype = MS_DT_U8;
            sct->kind = MS_W_VECTOR;
            sct->scale_of = n - 2;
            sct->nbytes = (uint64_t)sct->shape[0] * (uint64_t)sct->shape[1];
            continue;
        }
        t->nbytes = (uint64_t)nelem(t) * (uint64_t)(ms_dtype_bits(t->dtype) / 8);
        if (t->dtype == MS_DT_F8_E4M3) {
            synth_tensor *s = &ts[n++];
            char sname[sizeof s->name];
            snprintf(sname, sizeof sname, "%.180s_scale_inv", t->name); /* X.weight -> X.weight_scale_inv */
            memcpy(s->name, sname, sizeof sname);
            s->ndim = 2;
            s->shape[0] = (t->shape[0] + 127) / 128;
            s->shape[1] = (t->shape[1] + 127) / 128;
            s->dtype = MS_DT_F32;
            s->kind = MS_W_VECTOR;
            s->scale_of = n - 2;
            s->nbytes = (uint64_t)nelem(s) * 4;
        }
    }
    uint64_t shard_max = o->shard_bytes ? o->shard_bytes : (4ull << 30);
    int shards = 1;
    uint64_t cur = 0;
    for (int i = 0; i < n; i++) {
        /* keep a weight and its scale (INT4: and its weight_shape) in one shard */
        uint64_t need = ts[i].nbytes;
        int f = i + 1;
        for (; f < n && ts[f].scale_of == i; f++) need += ts[f].nbytes;
        if (cur > 0 && cur + need > shard_max) {
            shards++;
            cur = 0;
        }
        for (int k = i; k < f; k++) {
            ts[k].shard = shards - 1;
            ts[k].offset = cur;
            cur += ts[k].nbytes;
        }
        i = f - 1;
    }
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST) {
        rc = ms_fail(err, MS_ERR_IO, "%s: cannot create directory: %s", o->out_dir, strerror(errno));
        goto out;
    }
    /* the tensor writers: o->threads workers (the caller included); NULL pool = the caller alone */
    pool = o->threads > 1 ? ms_pool_create(o->threads) : NULL;
    items = malloc((size_t)(n ? n : 1) * sizeof *items);
    if (!items || (o->threads > 1 && !pool)) {
        rc = ms_fail(err, MS_ERR_NOMEM, "synth: out of memory for %d writer threads", o->threads);
        goto out;
    }
    cJSON *index = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(index, "metadata"),
          *wmap = cJSON_AddObjectToObject(index, "weight_map");
    uint64_t total = 0, all = 0;
    for (int i = 0; i < n; i++) all += ts[i].nbytes;
    for (int s = 0; s < shards && !rc; s++) {
        char fname[128], path[4096];
        if (shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, shards);
        if ((rc = ms_path_join(path, sizeof path, o->out_dir, fname, err))) break;
        cJSON *h = cJSON_CreateObject();
        cJSON *md = cJSON_AddObjectToObject(h, "__metadata__");
        cJSON_AddStringToObject(md, "format", "pt");
        for (int i = 0; i < n; i++) {
            if (ts[i].shard != s) continue;
            cJSON *e = cJSON_AddObjectToObject(h, ts[i].name);
            cJSON_AddStringToObject(e, "dtype", ms_dtype_name(ts[i].dtype));
            cJSON *sh = cJSON_AddArrayToObject(e, "shape");
            for (int d = 0; d < ts[i].ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)ts[i].shape[d]));
            cJSON *of = cJSON_AddArrayToObject(e, "data_offsets");
            cJSON_AddItemToArray(of, cJSON_CreateNumber((double)ts[i].offset));
            cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(ts[i].offset + ts[i].nbytes)));
            cJSON_AddStringToObject(wmap, ts[i].name, fname);
        }
        char *hs = cJSON_PrintUnformatted(h);
        cJSON_Delete(h);
        if (!hs) { rc = ms_fail(err, MS_ERR_NOMEM, "out of memory"); break; }
        size_t hl = strlen(hs), padded = (hl + 7) & ~(size_t)7;
        uint8_t *hb = malloc(8 + padded);
        if (!hb) { free(hs); rc = ms_fail(err, MS_ERR_NOMEM, "out of memory"); break; }
        for (int b = 0; b < 8; b++) hb[b] = (uint8_t)((uint64_t)padded >> (8 * b));
        memcpy(hb + 8, hs, hl);
        memset(hb + 8 + hl, ' ', padded - hl);
        free(hs);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            free(hb);
            rc = ms_fail(err, MS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
            break;
        }
        rc = pwrite_all(fd, hb, 8 + padded, 0, path, err);
        free(hb);
        if (!rc) {
            shard_job job = {.fd = fd, .path = path, .ts = ts, .items = items, .n = n, .data_start = 8 + padded,
                             .o = o, .total = &total, .all = all, .err = err};
            pthread_mutex_init(&job.mu, NULL);
            for (int i = 0; i < n; i++)
                if (ts[i].shard == s && ts[i].scale_of < 0) items[job.n_items++] = i;
            ms_pool_run(pool, job.n_items, write_job, &job);
            pthread_mutex_destroy(&job.mu);
            rc = job.rc;
        }
        if (!rc && fsync(fd) != 0) rc = ms_fail(err, MS_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
        close(fd);
    }
    (void)meta;
    if (!rc && shards > 1) {
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        char *is = cJSON_Print(index), path[4096];
        if (!is) rc = ms_fail(err, MS_ERR_NOMEM, "out of memory");
        else if (!(rc = ms_path_join(path, sizeof path, o->out_dir, "model.safetensors.index.json", err)))
            rc = ms_write_file_atomic(path, is, strlen(is), err);
        free(is);
    }
    cJSON_Delete(index);
    if (!rc) {
        char *cs = cJSON_Print(cj), path[4096];
        if (!cs) rc = ms_fail(err, MS_ERR_NOMEM, "out of memory");
        else if (!(rc = ms_path_join(path, sizeof path, o->out_dir, "config.json", err)))
            rc = ms_write_file_atomic(path, cs, strlen(cs), err);
        free(cs);
    }
    if (!rc && o->tokenizer_dir) {
        const char *files[] = {"tokenizer.json", "tokenizer_config.json", "tiktoken.model", "special_tokens_map.json",
                               "chat_template.jinja", "generation_config.json"};
        int copied = 0;
        for (size_t i = 0; i < sizeof files / sizeof *files && !rc; i++) {
            char src[4096], dst[4096];
            if ((rc = ms_path_join(src, sizeof src, o->tokenizer_dir, files[i], err)) ||
                (rc = ms_path_join(dst, sizeof dst, o->out_dir, files[i], err)))
                break;
            if (!ms_file_exists(src)) continue;
            rc = copy_file(src, dst, err);
            copied++;
        }
        if (!rc && !copied) rc = ms_fail(err, MS_ERR_IO, "%s: no tokenizer files found", o->tokenizer_dir);
    }
    res->n_tensors = n;
    res->n_shards = shards;
    res->bytes = total;
out:
    ms_pool_destroy(pool);
    free(items);
    free(text);
    free(ts);
    free(specs);
    cJSON_Delete(cj);
    return rc;
}
