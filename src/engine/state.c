/* state.c — causal-state snapshots, rollback and state files (engine/state.h).
 *
 * The engine lists its state as parts (engine_internal.h: ms_engine_state_parts,
 * fed by the buffer table that also allocates and plans it). A snapshot is one
 * section per part, in that order, holding the part's bytes in use at n_past.
 * A state file is a header, the token ids, a section table and the same
 * sections (docs/state.md). Restoring from either goes through the same two
 * steps: check every section against the engine's parts (no change), then copy. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine_internal.h"
#include "engine/state.h"
#include "util/dtype.h"
#include "util/fs.h"
#include "util/hash.h"

static void wr32(uint8_t *p, uint32_t v);
static void wr64(uint8_t *p, uint64_t v);

/* One section to restore: a name and its bytes. */
typedef struct {
    const char *name;
    const uint8_t *data;
    uint64_t size;
} sec_in;

struct ms_snapshot {
    int64_t n_past;
    int n;
    ms_state_section *sec; /* offsets into blob */
    uint8_t *blob;
    uint64_t bytes;
};

/* The engine's parts, malloc'd into *out. */
static int get_parts(const ms_engine *e, ms_state_part **out, int *n, ms_err *err) {
    int k = ms_engine_state_parts(e, NULL, 0);
    if (k < 0) return ms_fail(err, MS_ERR_NOMEM, "out of memory listing the engine state");
    ms_state_part *p = calloc((size_t)k + 1, sizeof *p);
    if (!p) return ms_fail(err, MS_ERR_NOMEM, "out of memory listing %d state parts", k);
    if (ms_engine_state_parts(e, p, k) != k) {
        free(p);
        return ms_fail(err, MS_ERR_NOMEM, "the engine state changed while it was listed");
    }
    *out = p;
    *n = k;
    return MS_OK;
}

/* Bytes of a part at the engine's current n_past. */
static uint64_t part_bytes(const ms_engine *e, const ms_state_part *p) {
    if (p->kind == MS_PART_ROWS) return (uint64_t)(e->n_past / p->per) * p->row_bytes;
    if (p->kind == MS_PART_FIXED) return p->row_bytes;
    return p->size(p->eng ? p->eng : e, p->layer);
}

/* A part's bytes into out: backend memory through download, host memory directly. */
static int part_get(const ms_engine *e, const ms_state_part *p, uint8_t *out, ms_err *err) {
    if (p->kind == MS_PART_CUSTOM) {
        p->get(p->eng ? p->eng : e, p->layer, out);
        return MS_OK;
    }
    uint64_t n = part_bytes(e, p);
    if (!n) return MS_OK;
    if (p->host) {
        memcpy(out, p->data, n);
        return MS_OK;
    }
    ms_backend *be = p->be ? p->be : e->be; /* a split engine: the backend of the part's stage */
    return be->ops->download(be, out, p->data, n, err);
}

/* Check sections s[0..ns) for a state at n_past against e's parts (reserving
 * memory custom parts need: no visible change). where: "snapshot" or the file. */
static int check_sections(ms_engine *e, int64_t n_past, const sec_in *s, int ns, const ms_state_part *p, int np,
                          const char *where, ms_err *err) {
    if (n_past < 0) return ms_fail(err, MS_ERR_FORMAT, "%s: negative position count %lld", where, (long long)n_past);
    if (n_past > e->max_ctx)
        return ms_fail(err, MS_ERR_LIMIT, "%s: the state holds %lld positions, the engine's context only %d (raise --ctx)",
                       where, (long long)n_past, e->max_ctx);
    for (int i = 0; i < ns && i < np; i++)
        if (strcmp(s[i].name, p[i].name))
            return ms_fail(err, MS_ERR_MISMATCH,
                           "%s: section %d is \"%s\" but this engine's state part %d is \"%s\" (a state of another model)",
                           where, i, s[i].name, i, p[i].name);
    if (ns != np)
        return ms_fail(err, MS_ERR_MISMATCH, "%s: %d sections, this engine's state has %d parts (a state of another model)",
                       where, ns, np);
    for (int i = 0; i < np; i++) {
        const ms_state_part *q = &p[i];
        if (q->kind == MS_PART_CUSTOM) {
            int rc = q->check(q->eng ? q->eng : e, q->layer, s[i].data, s[i].size, n_past, err);
            if (rc) return ms_wrap(err, "%s: section \"%s\"", where, q->name);
            continue;
        }
        int64_t rows = q->kind == MS_PART_ROWS ? n_past / q->per : 1;
        if (q->kind == MS_PART_ROWS && rows > q->cap_rows)
            return ms_fail(err, MS_ERR_LIMIT, "%s: section \"%s\" needs %lld rows, the engine has room for %lld", where,
                           q->name, (long long)rows, (long long)q->cap_rows);
        uint64_t want = (uint64_t)rows * q->row_bytes;
        if (s[i].size != want)
            return ms_fail(err, MS_ERR_MISMATCH, "%s: section \"%s\" holds %llu bytes, %lld positions of this engine's "
                           "state need %llu",
                           where, q->name, (unsigned long long)s[i].size, (long long)n_past, (unsigned long long)want);
    }
    return MS_OK;
}

/* Copy checked sections into the engine (backend memory through upload); fails only
 * where the backend's upload does. */
static int apply_sections(ms_engine *e, int64_t n_past, const sec_in *s, const ms_state_part *p, int np,
                          ms_err *err) {
    for (int i = 0; i < np; i++) {
        if (p[i].kind == MS_PART_CUSTOM) p[i].put(p[i].eng ? p[i].eng : e, p[i].layer, s[i].data, s[i].size);
        else if (s[i].size && p[i].host) memcpy(p[i].data, s[i].data, s[i].size);
        else if (s[i].size) {
            ms_backend *be = p[i].be ? p[i].be : e->be;
            int rc = be->ops->upload(be, p[i].data, s[i].data, s[i].size, err);
            if (rc) return ms_wrap(err, "restoring \"%s\"", p[i].name);
        }
    }
    e->n_past = (int)n_past;
    e->la_layer = -1;
    ms_engine_stages_at(e);
    ms_dsa_engine_restored(e, n_past);
    ms_cattn_engine_restored(e, n_past);
    return MS_OK;
}

static int restore_sections(ms_engine *e, int64_t n_past, const sec_in *s, int ns, const char *where, ms_err *err) {
    ms_state_part *p;
    int np, rc = get_parts(e, &p, &np, err);
    if (rc) return rc;
    if (!(rc = check_sections(e, n_past, s, ns, p, np, where, err))) rc = apply_sections(e, n_past, s, p, np, err);
    free(p);
    return rc;
}

/* ---- snapshots ---- */

int ms_engine_snapshot(ms_engine *e, ms_snapshot **out, ms_err *err) {
    *out = NULL;
    ms_state_part *p;
    int np, rc = get_parts(e, &p, &np, err);
    if (rc) return rc;
    ms_snapshot *s = calloc(1, sizeof *s);
    uint64_t total = 0;
    if (s) s->sec = calloc((size_t)np + 1, sizeof *s->sec);
    for (int i = 0; s && s->sec && i < np; i++) {
        snprintf(s->sec[i].name, sizeof s->sec[i].name, "%s", p[i].name);
        s->sec[i].offset = total;
        s->sec[i].size = part_bytes(e, &p[i]);
        total += (s->sec[i].size + 7) & ~(uint64_t)7;
    }
    if (!s || !s->sec || !(s->blob = malloc(total ? total : 1))) {
        free(p);
        ms_engine_snapshot_free(s);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory for a snapshot of %llu bytes at %d positions",
                       (unsigned long long)total, e->n_past);
    }
    for (int i = 0; i < np && !rc; i++) rc = part_get(e, &p[i], s->blob + s->sec[i].offset, err);
    if (rc) {
        free(p);
        ms_engine_snapshot_free(s);
        return ms_wrap(err, "snapshot");
    }
    s->n = np;
    s->n_past = e->n_past;
    s->bytes = total;
    free(p);
    *out = s;
    return MS_OK;
}

int ms_engine_restore(ms_engine *e, const ms_snapshot *snap, ms_err *err) {
    if (!snap) return ms_fail(err, MS_ERR_ARG, "restore: no snapshot");
    sec_in *s = calloc((size_t)snap->n + 1, sizeof *s);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < snap->n; i++)
        s[i] = (sec_in){snap->sec[i].name, snap->blob + snap->sec[i].offset, snap->sec[i].size};
    int rc = restore_sections(e, snap->n_past, s, snap->n, "snapshot", err);
    free(s);
    return rc;
}

void ms_engine_snapshot_free(ms_snapshot *snap) {
    if (!snap) return;
    free(snap->sec);
    free(snap->blob);
    free(snap);
}

int ms_engine_snapshot_n_past(const ms_snapshot *snap) { return snap ? (int)snap->n_past : 0; }
uint64_t ms_engine_snapshot_bytes(const ms_snapshot *snap) { return snap ? snap->bytes : 0; }

/* ---- rollback ---- */

int ms_engine_truncatable(const ms_engine *e, ms_err *why) {
    ms_state_part *p;
    int np, rc = get_parts(e, &p, &np, why);
    if (rc) return rc;
    for (int i = 0; i < np && !rc; i++)
        if (p[i].no_truncate)
            rc = ms_fail(why, MS_ERR_UNSUPPORTED,
                         "cannot roll this model's state back: \"%s\" is %s, which depends on every earlier token "
                         "(restore a snapshot taken at the prefix instead)",
                         p[i].name, p[i].no_truncate);
    free(p);
    return rc;
}

int ms_engine_can_truncate(const ms_engine *e) { return ms_engine_truncatable(e, NULL) == MS_OK; }

int ms_engine_truncate(ms_engine *e, int n_past, ms_err *err) {
    if (n_past < 0 || n_past > e->n_past)
        return ms_fail(err, MS_ERR_ARG, "truncate to %d positions: the sequence holds %d", n_past, e->n_past);
    if (n_past == e->n_past) return MS_OK;
    if (n_past == 0) { /* every model can start over */
        ms_engine_reset(e);
        return MS_OK;
    }
    int rc = ms_engine_truncatable(e, err);
    if (rc) return rc;
    ms_dsa_engine_rollback(e, n_past); /* index keys and recorded tie rows from n_past on */
    e->n_past = n_past;
    e->la_layer = -1;
    ms_engine_stages_at(e);
    return MS_OK;
}

/* ---- model identity ---- */

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp((*(const ms_tensor *const *)a)->name, (*(const ms_tensor *const *)b)->name);
}

int ms_model_identity(const ms_model *m, uint8_t id[32], ms_err *err) {
    char path[4096];
    int rc = ms_path_join(path, sizeof path, m->ck.dir ? m->ck.dir : ".", "config.json", err);
    if (rc) return rc;
    char *cfg = NULL;
    size_t clen = 0;
    if ((rc = ms_read_file(path, 64u << 20, &cfg, &clen, err))) return ms_wrap(err, "model identity");
    int nt = m->ck.n_tensors;
    const ms_tensor **t = malloc(sizeof *t * (size_t)(nt + 1));
    size_t cap = 64 + clen;
    for (int i = 0; t && i < nt; i++) {
        t[i] = &m->ck.tensors[i];
        cap += strlen(t[i]->name) + 1 + strlen(ms_dtype_name(t[i]->dtype)) + 1 + 4 + 8 * MS_MAX_DIMS;
    }
    uint8_t *buf = t ? malloc(cap) : NULL;
    if (!buf) {
        free(cfg), free(t);
        return ms_fail(err, MS_ERR_NOMEM, "model identity: out of memory for %d tensors", nt);
    }
    qsort(t, (size_t)nt, sizeof *t, cmp_tensor_name);
    /* "moonshine-id-v1\0", u64 config length, config bytes, then per tensor by name:
     * name NUL, SafeTensors dtype NUL, u32 ndim, i64 shape[ndim] (little-endian) */
    size_t k = 0;
    memcpy(buf, "moonshine-id-v1", 16), k += 16;
    wr64(buf + k, clen), k += 8;
    memcpy(buf + k, cfg, clen), k += clen;
    for (int i = 0; i < nt; i++) {
        const char *dt = ms_dtype_name(t[i]->dtype);
        size_t ln = strlen(t[i]->name) + 1, ld = strlen(dt) + 1;
        memcpy(buf + k, t[i]->name, ln), k += ln;
        memcpy(buf + k, dt, ld), k += ld;
        wr32(buf + k, (uint32_t)t[i]->ndim), k += 4;
        for (int d = 0; d < t[i]->ndim; d++) wr64(buf + k, (uint64_t)t[i]->shape[d]), k += 8;
    }
    rc = ms_sha256(buf, k, id) ? ms_fail(err, MS_ERR_IO, "model identity: SHA-256 failed") : MS_OK;
    free(buf), free(cfg), free(t);
    return rc;
}

/* ---- state files ----
 * Little-endian. Header (HDR bytes): magic[8], u32 version, u32 n_sections,
 * u64 header_bytes, u64 file_bytes, u8 model_id[32], i64 n_past, i64 ctx_needed,
 * i64 saved_ctx, i64 n_tokens, u32 header_crc32c (of [0, header_bytes) with
 * this field zero), u32 reserved (0). Then int32 tokens [n_tokens] padded to 8
 * bytes, then n_sections entries of SEC bytes: name[48] (NUL-padded), u64
 * offset, u64 size, u32 crc32c, u32 reserved. Sections follow at 8-byte
 * aligned offsets in table order. */
#define HDR 104
#define SEC 72
#define HDR_CRC_AT 96
#define MAX_SECTIONS (1 << 20)

static uint64_t pad8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

void ms_state_info_free(ms_state_info *info) {
    if (!info) return;
    free(info->tokens);
    free(info->sections);
    memset(info, 0, sizeof *info);
}

static int cmp_sec_name(const void *a, const void *b) {
    return strcmp((*(const ms_state_section *const *)a)->name, (*(const ms_state_section *const *)b)->name);
}

static int parse(const uint8_t *b, uint64_t len, const char *w, ms_state_info *in, ms_err *err) {
    if (len < HDR) return ms_fail(err, MS_ERR_FORMAT, "%s: %llu bytes, shorter than the %d-byte header", w, (unsigned long long)len, HDR);
    if (memcmp(b, MS_STATE_MAGIC, 8)) return ms_fail(err, MS_ERR_FORMAT, "%s: not a moonshine state file (bad magic)", w);
    in->version = rd32(b + 8);
    if (in->version != MS_STATE_VERSION)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: state format version %u, this build reads %u", w, in->version,
                       MS_STATE_VERSION);
    uint32_t ns = rd32(b + 12);
    in->header_bytes = rd64(b + 16);
    in->file_bytes = rd64(b + 24);
    memcpy(in->model_id, b + 32, 32);
    in->n_past = (int64_t)rd64(b + 64);
    in->ctx_needed = (int64_t)rd64(b + 72);
    in->saved_ctx = (int64_t)rd64(b + 80);
    in->n_tokens = (int64_t)rd64(b + 88);
    if (in->file_bytes != len)
        return ms_fail(err, MS_ERR_FORMAT, "%s: the header says %llu bytes, the file has %llu (truncated or extended)", w,
                       (unsigned long long)in->file_bytes, (unsigned long long)len);
    if (ns > MAX_SECTIONS) return ms_fail(err, MS_ERR_FORMAT, "%s: %u sections (at most %d)", w, ns, MAX_SECTIONS);
    if (in->n_tokens < 0 || in->n_tokens > INT32_MAX || (uint64_t)in->n_tokens > len / 4)
        return ms_fail(err, MS_ERR_FORMAT, "%s: token count %lld out of range", w, (long long)in->n_tokens);
    uint64_t tok_at = HDR, tab_at = tok_at + pad8(4 * (uint64_t)in->n_tokens);
    uint64_t hb = tab_at + (uint64_t)ns * SEC;
    if (in->header_bytes != hb || hb > len)
        return ms_fail(err, MS_ERR_FORMAT, "%s: header size %llu, %lld tokens and %u sections need %llu (file %llu bytes)",
                       w, (unsigned long long)in->header_bytes, (long long)in->n_tokens, ns, (unsigned long long)hb,
                       (unsigned long long)len);
    if (rd32(b + 100)) return ms_fail(err, MS_ERR_FORMAT, "%s: reserved header field is not zero", w);
    uint32_t want = rd32(b + HDR_CRC_AT), zero = 0;
    uint32_t crc = ms_crc32c(0, b, HDR_CRC_AT);
    crc = ms_crc32c(crc, &zero, 4);
    crc = ms_crc32c(crc, b + HDR_CRC_AT + 4, hb - HDR_CRC_AT - 4);
    if (crc != want)
        return ms_fail(err, MS_ERR_MISMATCH, "%s: header checksum mismatch (CRC32C %08x, stored %08x)", w, crc, want);
    if (in->n_past < 0 || in->n_past > INT32_MAX)
        return ms_fail(err, MS_ERR_FORMAT, "%s: position count %lld out of range", w, (long long)in->n_past);
    if (in->n_tokens != in->n_past)
        return ms_fail(err, MS_ERR_FORMAT, "%s: %lld token ids for %lld positions", w, (long long)in->n_tokens,
                       (long long)in->n_past);
    if (in->ctx_needed < in->n_past || in->ctx_needed > INT32_MAX)
        return ms_fail(err, MS_ERR_FORMAT, "%s: needed context %lld is below the %lld positions held or out of range", w,
                       (long long)in->ctx_needed, (long long)in->n_past);
    in->tokens = malloc(4 * (size_t)in->n_tokens + 4);
    in->sections = calloc((size_t)ns + 1, sizeof *in->sections);
    const ms_state_section **order = malloc(sizeof *order * ((size_t)ns + 1));
    if (!in->tokens || !in->sections || !order) {
        free(order);
        return ms_fail(err, MS_ERR_NOMEM, "%s: out of memory for %u sections", w, ns);
    }
    for (int64_t i = 0; i < in->n_tokens; i++) {
        in->tokens[i] = (int32_t)rd32(b + tok_at + 4 * i);
        if (in->tokens[i] < 0) {
            free(order);
            return ms_fail(err, MS_ERR_FORMAT, "%s: token %lld is negative (%d)", w, (long long)i, in->tokens[i]);
        }
    }
    in->n_sections = (int)ns;
    uint64_t next = hb;
    int rc = MS_OK;
    for (uint32_t i = 0; i < ns && !rc; i++) {
        const uint8_t *t = b + tab_at + (uint64_t)i * SEC;
        ms_state_section *s = &in->sections[i];
        size_t nl = strnlen((const char *)t, MS_STATE_NAME_MAX);
        if (nl == 0 || nl == MS_STATE_NAME_MAX) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: section %u: name empty or not terminated", w, i);
            break;
        }
        memcpy(s->name, t, nl);
        for (size_t j = 0; j < nl && !rc; j++)
            if (t[j] < 0x21 || t[j] > 0x7e) rc = ms_fail(err, MS_ERR_FORMAT, "%s: section %u: name has byte 0x%02x", w, i, t[j]);
        for (size_t j = nl; j < MS_STATE_NAME_MAX && !rc; j++)
            if (t[j]) rc = ms_fail(err, MS_ERR_FORMAT, "%s: section %u (\"%s\"): name padding not zero", w, i, s->name);
        if (rc) break;
        s->offset = rd64(t + 48);
        s->size = rd64(t + 56);
        s->crc32c = rd32(t + 64);
        if (rd32(t + 68)) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: section \"%s\": reserved field not zero", w, s->name);
            break;
        }
        if (s->offset != next || s->size > len - s->offset) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: section \"%s\": bytes [%llu, +%llu) are not at %llu or not inside the "
                         "%llu-byte file",
                         w, s->name, (unsigned long long)s->offset, (unsigned long long)s->size,
                         (unsigned long long)next, (unsigned long long)len);
            break;
        }
        next = s->offset + pad8(s->size);
        if (next > len) next = len + 1; /* the padding of the last section must be in the file */
        uint32_t c = ms_crc32c(0, b + s->offset, s->size);
        if (c != s->crc32c)
            rc = ms_fail(err, MS_ERR_MISMATCH, "%s: section \"%s\" checksum mismatch (CRC32C %08x, stored %08x)", w,
                         s->name, c, s->crc32c);
        for (uint64_t j = s->offset + s->size; !rc && j < s->offset + pad8(s->size) && j < len; j++)
            if (b[j]) rc = ms_fail(err, MS_ERR_FORMAT, "%s: section \"%s\": padding byte at %llu is not zero", w, s->name,
                                   (unsigned long long)j);
        order[i] = s;
    }
    if (!rc && next != len)
        rc = ms_fail(err, MS_ERR_FORMAT, "%s: the sections end at %llu, the file at %llu", w, (unsigned long long)next,
                     (unsigned long long)len);
    if (!rc) {
        qsort(order, ns, sizeof *order, cmp_sec_name);
        for (uint32_t i = 1; i < ns && !rc; i++)
            if (!strcmp(order[i]->name, order[i - 1]->name))
                rc = ms_fail(err, MS_ERR_FORMAT, "%s: section \"%s\" appears twice", w, order[i]->name);
    }
    free(order);
    return rc;
}

int ms_state_parse(const uint8_t *buf, uint64_t len, const char *where, ms_state_info *info, ms_err *err) {
    memset(info, 0, sizeof *info);
    if (!buf && len) return ms_fail(err, MS_ERR_ARG, "state parse: no buffer");
    int rc = parse(buf, len, where ? where : "state", info, err);
    if (rc) ms_state_info_free(info);
    return rc;
}

int ms_state_inspect(const char *path, ms_state_info *info, ms_err *err) {
    memset(info, 0, sizeof *info);
    ms_mapping mp;
    int rc = ms_map_file(path, &mp, err);
    if (rc) return rc;
    rc = ms_state_parse(mp.data, mp.size, path, info, err);
    ms_unmap_file(&mp);
    return rc;
}

int ms_engine_state_save(ms_engine *e, const char *path, const int32_t *tokens, int n_tokens, ms_err *err) {
    if (n_tokens != e->n_past || (n_tokens && !tokens))
        return ms_fail(err, MS_ERR_ARG, "state save: %d token ids for a state of %d positions", n_tokens, e->n_past);
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= e->m->cfg.vocab)
            return ms_fail(err, MS_ERR_ARG, "state save: token %d is %d, outside the vocabulary", i, tokens[i]);
    if (e->dsa) { /* the engine keeps the ids too (for tie replays): they must be these */
        const int32_t *own = ms_dsa_engine_tokens(e);
        for (int i = 0; i < n_tokens; i++)
            if (own[i] != tokens[i])
                return ms_fail(err, MS_ERR_ARG, "state save: token %d is %d, the engine was fed %d there", i, tokens[i],
                               own[i]);
    }
    uint8_t id[32];
    int rc = ms_model_identity(e->m, id, err);
    if (rc) return rc;
    ms_snapshot *s;
    if ((rc = ms_engine_snapshot(e, &s, err))) return rc;
    rc = ms_snapshot_save_file(s, id, e->max_ctx, path, tokens, n_tokens, err);
    ms_engine_snapshot_free(s);
    return rc;
}

int ms_snapshot_save_file(const ms_snapshot *s, const uint8_t model_id[32], int saved_ctx, const char *path,
                          const int32_t *tokens, int n_tokens, ms_err *err) {
    if (!s || n_tokens != s->n_past || (n_tokens && !tokens))
        return ms_fail(err, MS_ERR_ARG, "state save: %d token ids for a state of %lld positions", n_tokens,
                       s ? (long long)s->n_past : -1LL);
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0) return ms_fail(err, MS_ERR_ARG, "state save: token %d is %d", i, tokens[i]);
    const uint8_t *id = model_id;
    int rc;
    uint64_t tab_at = HDR + pad8(4 * (uint64_t)n_tokens), hb = tab_at + (uint64_t)s->n * SEC;
    uint8_t *h = calloc(1, hb);
    if (!h) {
        return ms_fail(err, MS_ERR_NOMEM, "state save: out of memory for a %llu-byte header", (unsigned long long)hb);
    }
    uint64_t off = hb;
    for (int i = 0; i < s->n; i++) {
        uint8_t *t = h + tab_at + (uint64_t)i * SEC;
        memcpy(t, s->sec[i].name, strlen(s->sec[i].name));
        wr64(t + 48, off);
        wr64(t + 56, s->sec[i].size);
        wr32(t + 64, ms_crc32c(0, s->blob + s->sec[i].offset, s->sec[i].size));
        off += pad8(s->sec[i].size);
    }
    memcpy(h, MS_STATE_MAGIC, 8);
    wr32(h + 8, MS_STATE_VERSION);
    wr32(h + 12, (uint32_t)s->n);
    wr64(h + 16, hb);
    wr64(h + 24, off);
    memcpy(h + 32, id, 32);
    wr64(h + 64, (uint64_t)s->n_past);
    wr64(h + 72, (uint64_t)s->n_past);
    wr64(h + 80, (uint64_t)saved_ctx);
    wr64(h + 88, (uint64_t)n_tokens);
    for (int i = 0; i < n_tokens; i++) wr32(h + HDR + 4 * (uint64_t)i, (uint32_t)tokens[i]);
    wr32(h + HDR_CRC_AT, ms_crc32c(0, h, hb));
    /* temp file, fsync, rename, fsync the directory */
    ms_atomic_file f;
    if ((rc = ms_atomic_begin_mode(&f, path, 0600, err))) { /* private: it holds a conversation */
        free(h);
        return rc;
    }
    static const uint8_t zeros[8];
    rc = ms_atomic_write(&f, h, hb, err);
    for (int i = 0; i < s->n && !rc; i++) {
        rc = ms_atomic_write(&f, s->blob + s->sec[i].offset, s->sec[i].size, err);
        if (!rc) rc = ms_atomic_write(&f, zeros, pad8(s->sec[i].size) - s->sec[i].size, err);
    }
    free(h);
    if (rc) {
        ms_atomic_abort(&f);
        return rc;
    }
    return ms_atomic_commit(&f, err);
}

int ms_engine_state_load_buffer(ms_engine *e, const uint8_t *buf, uint64_t len, const char *where, int32_t **tokens,
                                int *n_tokens, ms_err *err) {
    if (tokens) *tokens = NULL;
    if (n_tokens) *n_tokens = 0;
    const char *path = where ? where : "state";
    ms_state_info in;
    sec_in *s = NULL;
    int rc = ms_state_parse(buf, len, path, &in, err);
    if (rc) return rc;
    uint8_t id[32];
    if ((rc = ms_model_identity(e->m, id, err))) goto out;
    if (memcmp(id, in.model_id, 32)) {
        char a[65], b[65];
        ms_hex(in.model_id, 32, a);
        ms_hex(id, 32, b);
        rc = ms_fail(err, MS_ERR_MISMATCH, "%s: saved from another model (model id %.16s..., this model's %.16s...)", path,
                     a, b);
        goto out;
    }
    if (in.ctx_needed > e->max_ctx) {
        rc = ms_fail(err, MS_ERR_LIMIT, "%s: the state needs a context of %lld positions, the engine has %d (raise --ctx)",
                     path, (long long)in.ctx_needed, e->max_ctx);
        goto out;
    }
    for (int64_t i = 0; i < in.n_tokens; i++)
        if (in.tokens[i] >= e->m->cfg.vocab) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: token %lld is %d, outside the vocabulary of %lld", path, (long long)i,
                         in.tokens[i], (long long)e->m->cfg.vocab);
            goto out;
        }
    if (!(s = calloc((size_t)in.n_sections + 1, sizeof *s))) {
        rc = ms_fail(err, MS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < in.n_sections; i++) {
        s[i] = (sec_in){in.sections[i].name, buf + in.sections[i].offset, in.sections[i].size};
        if (!strcmp(s[i].name, "dsa.tokens") && (s[i].size != 4 * (uint64_t)in.n_tokens ||
                                                  memcmp(s[i].data, in.tokens, s[i].size))) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: the DSA token ids differ from the header's", path);
            goto out;
        }
    }
    if ((rc = restore_sections(e, in.n_past, s, in.n_sections, path, err))) goto out;
    if (tokens) {
        *tokens = in.tokens;
        in.tokens = NULL;
    }
    if (n_tokens) *n_tokens = (int)in.n_tokens;
out:
    free(s);
    ms_state_info_free(&in);
    return rc;
}

int ms_engine_state_load(ms_engine *e, const char *path, int32_t **tokens, int *n_tokens, ms_err *err) {
    if (tokens) *tokens = NULL;
    if (n_tokens) *n_tokens = 0;
    ms_mapping mp;
    int rc = ms_map_file(path, &mp, err);
    if (rc) return rc;
    rc = ms_engine_state_load_buffer(e, mp.data, mp.size, path, tokens, n_tokens, err);
    ms_unmap_file(&mp);
    return rc;
}
