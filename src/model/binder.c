/* binder.c — binds tensor names to weight views (load mode) or records
 * tensor specs (spec mode, for synth). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/model.h"

static int vname(ms_binder *b, char *out, size_t cap, const char *fmt, va_list ap) {
    size_t pl = strlen(b->prefix);
    if (pl >= cap) return -1;
    memcpy(out, b->prefix, pl);
    int n = vsnprintf(out + pl, cap - pl, fmt, ap);
    return (n < 0 || (size_t)n >= cap - pl) ? -1 : 0;
}

static void add_spec(ms_binder *b, const char *name, int ndim, const int64_t *shape, ms_wkind kind) {
    if (b->n_specs == b->cap_specs) {
        int nc = b->cap_specs ? b->cap_specs * 2 : 256;
        ms_tensor_spec *ns = realloc(b->specs, (size_t)nc * sizeof *ns);
        if (!ns) {
            b->rc = ms_fail(b->err, MS_ERR_NOMEM, "out of memory collecting tensor specs");
            return;
        }
        b->specs = ns;
        b->cap_specs = nc;
    }
    ms_tensor_spec *s = &b->specs[b->n_specs++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ndim = ndim;
    for (int i = 0; i < ndim; i++) s->shape[i] = shape[i];
    s->kind = kind;
}

const ms_tensor *ms_bind_find(ms_binder *b, const char *name, int ndim, const int64_t *shape) {
    const ms_tensor *t = ms_checkpoint_find(b->ck, name);
    char want[160], got[160];
    if (!t) {
        b->rc = ms_fail(b->err, MS_ERR_SHAPE, "%s: missing tensor \"%s\" (expected shape %s)", b->ck->dir, name,
                        ms_shape_str(shape, ndim, want, sizeof want));
        return NULL;
    }
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        b->rc = ms_fail(b->err, MS_ERR_SHAPE, "tensor \"%s\": expected shape %s, found %s", name,
                        ms_shape_str(shape, ndim, want, sizeof want), ms_shape_str(t->shape, t->ndim, got, sizeof got));
        return NULL;
    }
    b->bound_bytes += t->nbytes;
    if (b->bound) b->bound[t - b->ck->tensors] = 1;
    return t;
}

/* compressed-tensors mxfp4-pack-quantized: BASE.weight_packed U8 [rows, cols/2]
 * (two e2m1 values per byte, low nibble = even column) and BASE.weight_scale
 * U8 [rows, cols/32] (E8M0, 2^(s-127)), bound as an F4 view (no copy). */
static int bind_mxfp4(ms_binder *b, ms_qmat *out, const char *base, int64_t rows, int64_t cols) {
    char name[220];
    if (cols % 32)
        return b->rc = ms_fail(b->err, MS_ERR_SHAPE,
                               "tensor \"%s.weight_packed\": MXFP4 needs a column count divisible by 32 (expected %lld)",
                               base, (long long)cols);
    int64_t pshape[2] = {rows, cols / 2}, sshape[2] = {rows, cols / 32};
    snprintf(name, sizeof name, "%s.weight_packed", base);
    const ms_tensor *p = ms_bind_find(b, name, 2, pshape);
    if (!p) return b->rc;
    if (p->dtype != MS_DT_U8 && p->dtype != MS_DT_I8)
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s (expected U8 packed MXFP4)", name,
                               ms_dtype_name(p->dtype));
    snprintf(name, sizeof name, "%s.weight_scale", base);
    const ms_tensor *s = ms_bind_find(b, name, 2, sshape);
    if (!s) return b->rc;
    if (s->dtype != MS_DT_U8 && s->dtype != MS_DT_F8_E8M0)
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s (expected U8 E8M0 scales)", name,
                               ms_dtype_name(s->dtype));
    out->dtype = MS_DT_F4;
    out->data = p->data;
    out->scale = s->data;
    out->scale_dtype = MS_DT_F8_E8M0;
    out->brow = 1;
    out->bcol = 32;
    return MS_OK;
}

/* compressed-tensors pack-quantized INT4 (core/qmat.h I4): BASE.weight_packed I32
 * [rows, cols/8] (8 values per int32, value i in bits 4i as q + 8), BASE.weight_scale
 * BF16/F16/F32 [rows, ceil(cols/group)], BASE.weight_shape I32 [2] = {rows, cols}
 * and, when the config is asymmetric, BASE.weight_zero_point I32 [ceil(rows/8),
 * ceil(cols/group)] (its padding nibbles 0), bound as an I4 view (no copy). The group
 * size is the config's. */
static int bind_int4(ms_binder *b, ms_qmat *out, const char *base, int64_t rows, int64_t cols) {
    char name[220];
    int gs = b->cfg->int4_group;
    if (!b->cfg->int4_packed || gs < 1)
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED,
                               "tensor \"%s.weight_packed\" is int32 (INT4 pack-quantized) but config.json declares no "
                               "compressed-tensors pack-quantized group",
                               base);
    if (cols % 8)
        return b->rc = ms_fail(b->err, MS_ERR_SHAPE,
                               "tensor \"%s.weight_packed\": INT4 needs a column count divisible by 8 (expected %lld)",
                               base, (long long)cols);
    int64_t pshape[2] = {rows, cols / 8}, sshape[2] = {rows, (cols + gs - 1) / gs}, wshape[1] = {2};
    snprintf(name, sizeof name, "%s.weight_packed", base);
    const ms_tensor *p = ms_bind_find(b, name, 2, pshape);
    if (!p) return b->rc;
    snprintf(name, sizeof name, "%s.weight_scale", base);
    const ms_tensor *s = ms_bind_find(b, name, 2, sshape);
    if (!s) return b->rc;
    if (s->dtype != MS_DT_BF16 && s->dtype != MS_DT_F16 && s->dtype != MS_DT_F32)
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s (expected BF16, F16 or F32 scales)",
                               name, ms_dtype_name(s->dtype));
    const ms_tensor *z = NULL;
    if (b->cfg->int4_asym) { /* weight_zero_point: packed along the rows (qmat.h I4) */
        int64_t zshape[2] = {(rows + 7) / 8, sshape[1]};
        snprintf(name, sizeof name, "%s.weight_zero_point", base);
        if (!(z = ms_bind_find(b, name, 2, zshape))) return b->rc;
        if (z->dtype != MS_DT_I32)
            return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED,
                                   "tensor \"%s\": dtype %s (expected I32, zero points packed 8 per int32 along the rows)",
                                   name, ms_dtype_name(z->dtype));
        if (!b->ck->headers_only && rows % 8) { /* pack_to_int32 pads the last word's missing rows with 0 */
            const uint32_t *zw = (const uint32_t *)z->data + (rows / 8) * sshape[1];
            for (int64_t g = 0; g < sshape[1]; g++)
                if (zw[g] >> (4 * (rows % 8)))
                    return b->rc = ms_fail(b->err, MS_ERR_FORMAT,
                                           "tensor \"%s\": padding rows %lld..%lld of group %lld are not zero", name,
                                           (long long)rows, (long long)((rows + 7) / 8 * 8 - 1), (long long)g);
        }
    }
    snprintf(name, sizeof name, "%s.weight_shape", base);
    const ms_tensor *ws = ms_bind_find(b, name, 1, wshape);
    if (!ws) return b->rc;
    if (ws->dtype != MS_DT_I32 && ws->dtype != MS_DT_I64)
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s (expected I32)", name,
                               ms_dtype_name(ws->dtype));
    if (!b->ck->headers_only) { /* the payload: the unpacked shape must be the Linear's */
        int64_t r0, c0;
        if (ws->dtype == MS_DT_I32) {
            int32_t v[2];
            memcpy(v, ws->data, sizeof v);
            r0 = v[0], c0 = v[1];
        } else {
            int64_t v[2];
            memcpy(v, ws->data, sizeof v);
            r0 = v[0], c0 = v[1];
        }
        if (r0 != rows || c0 != cols)
            return b->rc = ms_fail(b->err, MS_ERR_SHAPE, "tensor \"%s\" says [%lld, %lld], expected [%lld, %lld]", name,
                                   (long long)r0, (long long)c0, (long long)rows, (long long)cols);
    }
    out->dtype = MS_DT_I4;
    out->data = p->data;
    out->scale = s->data;
    out->scale_dtype = s->dtype;
    out->brow = 1;
    out->bcol = gs;
    out->zero = z ? z->data : NULL;
    return MS_OK;
}

int ms_bind_mat(ms_binder *b, ms_qmat *out, ms_wkind kind, int64_t rows, int64_t cols, const char *fmt, ...) {
    if (b->rc) return b->rc;
    char base[200], name[220];
    va_list ap;
    va_start(ap, fmt);
    int bad = vname(b, base, sizeof base, fmt, ap);
    va_end(ap);
    if (bad) return b->rc = ms_fail(b->err, MS_ERR_ARG, "tensor name too long");
    snprintf(name, sizeof name, "%s.weight", base);
    int64_t shape[2] = {rows, cols};
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    if (!b->ck) {
        add_spec(b, name, 2, shape, kind);
        return b->rc;
    }
    if (!ms_checkpoint_find(b->ck, name)) {
        snprintf(name, sizeof name, "%s.weight_packed", base);
        const ms_tensor *pk = ms_checkpoint_find(b->ck, name);
        if (pk && pk->dtype == MS_DT_I32) return bind_int4(b, out, base, rows, cols);
        if (pk) return bind_mxfp4(b, out, base, rows, cols);
        snprintf(name, sizeof name, "%s.weight", base);
    }
    const ms_tensor *t = ms_bind_find(b, name, 2, shape);
    if (!t) return b->rc;
    out->dtype = t->dtype;
    out->data = t->data;
    switch (t->dtype) {
    case MS_DT_F32:
    case MS_DT_F16:
    case MS_DT_BF16: break;
    case MS_DT_F8_E4M3: {
        int b0 = b->cfg->fp8 ? b->cfg->fp8_block[0] : 128, b1 = b->cfg->fp8 ? b->cfg->fp8_block[1] : 128;
        snprintf(name, sizeof name, "%s.weight_scale_inv", base);
        int64_t sshape[2] = {(rows + b0 - 1) / b0, (cols + b1 - 1) / b1};
        const ms_tensor *s = ms_bind_find(b, name, 2, sshape);
        if (!s) return b->rc;
        if (s->dtype != MS_DT_F32 && s->dtype != MS_DT_BF16)
            return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": scale dtype %s (expected F32 or BF16)",
                                   name, ms_dtype_name(s->dtype));
        out->scale = s->data;
        out->scale_dtype = s->dtype;
        out->brow = b0;
        out->bcol = b1;
        break;
    }
    default:
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s is not supported for a matrix", name,
                               ms_dtype_name(t->dtype));
    }
    return MS_OK;
}

int ms_bind_vec(ms_binder *b, float **out, ms_wkind kind, int64_t n, int opt, const char *fmt, ...) {
    *out = NULL;
    if (b->rc) return b->rc;
    char name[220];
    va_list ap;
    va_start(ap, fmt);
    int bad = vname(b, name, sizeof name, fmt, ap);
    va_end(ap);
    if (bad) return b->rc = ms_fail(b->err, MS_ERR_ARG, "tensor name too long");
    int64_t shape[1] = {n};
    if (!b->ck) {
        if (!opt) add_spec(b, name, 1, shape, kind);
        return b->rc;
    }
    if (opt && !ms_checkpoint_find(b->ck, name)) return MS_OK;
    const ms_tensor *t = ms_bind_find(b, name, 1, shape);
    if (!t) return b->rc;
    if (t->dtype != MS_DT_F32 && t->dtype != MS_DT_BF16 && t->dtype != MS_DT_F16)
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s (expected F32, BF16 or F16)", name,
                               ms_dtype_name(t->dtype));
    *out = ms_bind_alloc(b, (size_t)(n > 0 ? n : 1) * sizeof **out);
    if (!*out) return b->rc;
    ms_to_f32(*out, t->data, t->dtype, n);
    return MS_OK;
}

void *ms_bind_alloc(ms_binder *b, size_t bytes) {
    if (b->n_allocs == b->cap_allocs) {
        int nc = b->cap_allocs ? 2 * b->cap_allocs : 256;
        void **na = realloc(b->allocs, (size_t)nc * sizeof *na);
        if (!na) {
            b->rc = ms_fail(b->err, MS_ERR_NOMEM, "out of memory");
            return NULL;
        }
        b->allocs = na;
        size_t *nb = realloc(b->alloc_bytes, (size_t)nc * sizeof *nb);
        if (!nb) {
            b->rc = ms_fail(b->err, MS_ERR_NOMEM, "out of memory");
            return NULL;
        }
        b->alloc_bytes = nb;
        b->cap_allocs = nc;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        b->rc = ms_fail(b->err, MS_ERR_NOMEM, "out of memory");
        return NULL;
    }
    b->alloc_bytes[b->n_allocs] = bytes;
    b->allocs[b->n_allocs++] = p;
    return p;
}

int ms_bind_has(ms_binder *b, const char *fmt, ...) {
    if (!b->ck) return 0;
    char name[220];
    va_list ap;
    va_start(ap, fmt);
    int bad = vname(b, name, sizeof name, fmt, ap);
    va_end(ap);
    return !bad && ms_checkpoint_find(b->ck, name) != NULL;
}

int ms_bind_tensor(ms_binder *b, ms_qmat *out, ms_wkind kind, int ndim, const int64_t *shape, int64_t rows,
                   int64_t cols, int opt, const char *fmt, ...) {
    memset(out, 0, sizeof *out);
    if (b->rc) return b->rc;
    char name[220];
    va_list ap;
    va_start(ap, fmt);
    int bad = vname(b, name, sizeof name, fmt, ap);
    va_end(ap);
    if (bad) return b->rc = ms_fail(b->err, MS_ERR_ARG, "tensor name too long");
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    if (ndim < 1 || ndim > 4 || numel != rows * cols)
        return b->rc = ms_fail(b->err, MS_ERR_ARG, "tensor \"%s\": bad view [%lld, %lld] of a %d-d shape", name,
                               (long long)rows, (long long)cols, ndim);
    out->rows = rows;
    out->cols = cols;
    if (!b->ck) {
        if (!opt) add_spec(b, name, ndim, shape, kind);
        return b->rc;
    }
    if (opt && !ms_checkpoint_find(b->ck, name)) return MS_OK;
    const ms_tensor *t = ms_bind_find(b, name, ndim, shape);
    if (!t) return b->rc;
    if (t->dtype != MS_DT_F32 && t->dtype != MS_DT_BF16 && t->dtype != MS_DT_F16)
        return b->rc = ms_fail(b->err, MS_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s (expected F32, BF16 or F16)", name,
                               ms_dtype_name(t->dtype));
    out->dtype = t->dtype;
    out->data = t->data;
    return MS_OK;
}
