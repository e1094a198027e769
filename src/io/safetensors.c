#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/json.h"

const char *ms_shape_str(const int64_t *shape, int ndim, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

void ms_st_free_tensors(ms_tensor *t, int n) {
    if (!t) return;
    for (int i = 0; i < n; i++) free(t[i].name);
    free(t);
}

static int cmp_by_offset(const void *a, const void *b) {
    const ms_tensor *x = *(const ms_tensor *const *)a, *y = *(const ms_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int parse_one(const cJSON *item, const char *where, uint64_t data_size, ms_tensor *t, ms_err *err) {
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\": entry is not an object", where, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt))
        return ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\": missing dtype", where, name);
    t->dtype = ms_dtype_parse(dt->valuestring);
    if (t->dtype == MS_DT_INVALID)
        return ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%.32s\"", where, name,
                       dt->valuestring);
    if (!cJSON_IsArray(sh))
        return ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\": missing shape", where, name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > MS_MAX_DIMS)
        return ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\": %d dimensions (max %d)", where, name, nd,
                       MS_MAX_DIMS);
    t->ndim = nd;
    unsigned __int128 nelem = 1;
    int i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        if (!ms_json_is_int(d, 0, INT64_C(1) << 48))
            return ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\": shape[%d] is not a non-negative integer",
                           where, name, i);
        t->shape[i] = (int64_t)d->valuedouble;
        nelem *= (uint64_t)t->shape[i];
        if (nelem > ((unsigned __int128)1 << 62))
            return ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\": element count overflows", where, name);
    }
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !ms_json_is_int(off->child, 0, INT64_MAX) ||
        !ms_json_is_int(off->child->next, 0, INT64_MAX))
        return ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\": data_offsets must be [begin, end]", where, name);
    uint64_t b = (uint64_t)off->child->valuedouble, e = (uint64_t)off->child->next->valuedouble;
    if (b > e) return ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\": data_offsets begin > end", where, name);
    if (e > data_size)
        return ms_fail(err, MS_ERR_FORMAT,
                       "%s: tensor \"%s\": data_offsets end %" PRIu64 " is past the end of the data (%" PRIu64
                       " bytes; file truncated?)",
                       where, name, e, data_size);
    t->nelem = (uint64_t)nelem;
    unsigned __int128 bits = nelem * (unsigned)ms_dtype_bits(t->dtype);
    uint64_t want = (uint64_t)((bits + 7) / 8);
    if (want != e - b) {
        char sb[160];
        return ms_fail(err, MS_ERR_FORMAT,
                       "%s: tensor \"%s\": shape %s x %s needs %" PRIu64 " bytes but data_offsets span %" PRIu64,
                       where, name, ms_shape_str(t->shape, t->ndim, sb, sizeof sb), ms_dtype_name(t->dtype), want,
                       e - b);
    }
    t->nbytes = want;
    t->offset = b;
    return MS_OK;
}

int ms_st_parse(const uint8_t *buf, uint64_t buf_len, uint64_t file_size, const char *where,
                ms_tensor **tensors, int *n, uint64_t *data_start, ms_err *err) {
    *tensors = NULL;
    *n = 0;
    if (file_size < 8 || buf_len < 8)
        return ms_fail(err, MS_ERR_FORMAT, "%s: file is %" PRIu64 " bytes, too small for a SafeTensors header",
                       where, file_size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen < 2 || hlen > MS_ST_MAX_HEADER)
        return ms_fail(err, MS_ERR_FORMAT, "%s: header length %" PRIu64 " is out of bounds [2, %u]", where, hlen,
                       MS_ST_MAX_HEADER);
    if (hlen > file_size - 8)
        return ms_fail(err, MS_ERR_FORMAT, "%s: header length %" PRIu64 " exceeds the file (%" PRIu64 " bytes)",
                       where, hlen, file_size);
    if (hlen > buf_len - 8)
        return ms_fail(err, MS_ERR_ARG, "%s: buffer does not cover the header", where);
    cJSON *root = NULL;
    char w2[600];
    snprintf(w2, sizeof w2, "%s header", where);
    int rc = ms_json_parse((const char *)buf + 8, hlen, w2, &root, err);
    if (rc) return rc;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ms_fail(err, MS_ERR_FORMAT, "%s: header is not a JSON object", where);
    }
    uint64_t dstart = 8 + hlen, dsize = file_size - dstart;
    int cap = cJSON_GetArraySize(root);
    ms_tensor *ts = calloc((size_t)(cap ? cap : 1), sizeof *ts);
    ms_tensor **sorted = calloc((size_t)(cap ? cap : 1), sizeof *sorted);
    ms_strmap names = {0};
    if (!ts || !sorted || ms_strmap_init(&names, (size_t)cap) != 0) {
        rc = ms_fail(err, MS_ERR_NOMEM, "%s: out of memory for %d tensors", where, cap);
        goto fail;
    }
    int cnt = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (!it->string) { rc = ms_fail(err, MS_ERR_FORMAT, "%s: header entry without a name", where); goto fail; }
        if (strcmp(it->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(it)) {
                rc = ms_fail(err, MS_ERR_FORMAT, "%s: __metadata__ is not an object", where);
                goto fail;
            }
            for (const cJSON *m = it->child; m; m = m->next)
                if (!cJSON_IsString(m)) {
                    rc = ms_fail(err, MS_ERR_FORMAT, "%s: __metadata__ value \"%s\" is not a string", where,
                                 m->string ? m->string : "?");
                    goto fail;
                }
            continue;
        }
        ms_tensor *t = &ts[cnt];
        rc = parse_one(it, where, dsize, t, err);
        if (rc) goto fail;
        t->name = strdup(it->string);
        if (!t->name) { rc = ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", where); goto fail; }
        cnt++;
        int put = ms_strmap_put(&names, t->name, cnt - 1);
        if (put == 0) { rc = ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\" appears twice", where, t->name); goto fail; }
        if (put < 0) { rc = ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", where); goto fail; }
    }
    for (int i = 0; i < cnt; i++) sorted[i] = &ts[i];
    qsort(sorted, (size_t)cnt, sizeof *sorted, cmp_by_offset);
    for (int i = 1; i < cnt; i++) {
        const ms_tensor *a = sorted[i - 1], *b = sorted[i];
        if (a->offset + a->nbytes > b->offset && a->nbytes && b->nbytes) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: tensors \"%s\" and \"%s\" have overlapping byte ranges", where,
                         a->name, b->name);
            goto fail;
        }
    }
    for (int i = 0; i < cnt; i++) ts[i].offset += dstart;
    ms_strmap_free(&names);
    free(sorted);
    cJSON_Delete(root);
    *tensors = ts;
    *n = cnt;
    if (data_start) *data_start = dstart;
    return MS_OK;
fail:
    ms_strmap_free(&names);
    free(sorted);
    ms_st_free_tensors(ts, cap);
    cJSON_Delete(root);
    return rc;
}

/* An anonymous read-only reservation of size bytes as f's mapping (headers-only checkpoints). */
static int reserve_map(ms_st_file *f, uint64_t size, ms_err *err) {
    size_t len = (size_t)(size ? size : 1);
    void *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return ms_fail(err, MS_ERR_NOMEM, "%s: cannot reserve %llu bytes of address space: %s", f->path,
                       (unsigned long long)size, strerror(errno));
    f->map.data = p;
    f->map.size = len;
    f->map.fd = -1;
    return MS_OK;
}

/* the header of path, read with pread: tensors with absolute offsets, the size they declare */
static int read_header(const char *path, ms_tensor **ts, int *n, uint64_t *data_start, uint64_t *declared,
                       ms_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ms_fail(err, MS_ERR_IO, "%s: %s", path, strerror(errno));
    uint8_t len8[8];
    int rc = MS_OK;
    uint8_t *buf = NULL;
    if (pread(fd, len8, 8, 0) != 8) {
        rc = ms_fail(err, MS_ERR_FORMAT, "%s: too small for a SafeTensors header", path);
        goto out;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | len8[i];
    if (hlen < 2 || hlen > MS_ST_MAX_HEADER) {
        rc = ms_fail(err, MS_ERR_FORMAT, "%s: header length %llu is out of bounds [2, %u]", path,
                     (unsigned long long)hlen, MS_ST_MAX_HEADER);
        goto out;
    }
    buf = malloc((size_t)hlen + 8);
    if (!buf) {
        rc = ms_fail(err, MS_ERR_NOMEM, "out of memory");
        goto out;
    }
    memcpy(buf, len8, 8);
    for (uint64_t got = 0; got < hlen;) {
        ssize_t k = pread(fd, buf + 8 + got, (size_t)(hlen - got), (off_t)(8 + got));
        if (k <= 0) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: the header (%llu bytes) is cut short", path, (unsigned long long)hlen);
            goto out;
        }
        got += (uint64_t)k;
    }
    /* the payload is not there to bound the ranges: the header's own extent is the file */
    rc = ms_st_parse(buf, hlen + 8, UINT64_C(1) << 62, path, ts, n, data_start, err);
    if (!rc) {
        *declared = 8 + hlen;
        for (int i = 0; i < *n; i++)
            if ((*ts)[i].offset + (*ts)[i].nbytes > *declared) *declared = (*ts)[i].offset + (*ts)[i].nbytes;
    }
out:
    free(buf);
    close(fd);
    return rc;
}

static int add_file(ms_checkpoint *ck, const char *path, ms_err *err) {
    ms_st_file *nf = realloc(ck->files, (size_t)(ck->n_files + 1) * sizeof *nf);
    if (!nf) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    ck->files = nf;
    ms_st_file *f = &ck->files[ck->n_files];
    memset(f, 0, sizeof *f);
    f->map.fd = -1;
    f->path = strdup(path);
    if (!f->path) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    ck->n_files++;
    ms_tensor *ts;
    int n, rc;
    if (ck->headers_only) {
        uint64_t declared = 0;
        if ((rc = read_header(path, &ts, &n, &f->data_start, &declared, err))) return rc;
        if ((rc = reserve_map(f, declared, err))) {
            ms_st_free_tensors(ts, n);
            return rc;
        }
    } else {
        if ((rc = ms_map_file(path, &f->map, err))) return rc;
        rc = ms_st_parse(f->map.data, f->map.size, f->map.size, path, &ts, &n, &f->data_start, err);
        if (rc) return rc;
    }
    ms_tensor *all = realloc(ck->tensors, (size_t)(ck->n_tensors + n) * sizeof *all);
    if (!all) {
        ms_st_free_tensors(ts, n);
        return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    }
    ck->tensors = all;
    for (int i = 0; i < n; i++) {
        ts[i].file = ck->n_files - 1;
        ts[i].data = f->map.data + ts[i].offset;
        all[ck->n_tensors + i] = ts[i];
    }
    ck->n_tensors += n;
    free(ts);
    return MS_OK;
}

static int build_index(ms_checkpoint *ck, ms_err *err) {
    if (ms_strmap_init(&ck->by_name, (size_t)ck->n_tensors) != 0) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < ck->n_tensors; i++) {
        int put = ms_strmap_put(&ck->by_name, ck->tensors[i].name, i);
        if (put < 0) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
        if (put == 0) {
            int j = ms_strmap_get(&ck->by_name, ck->tensors[i].name);
            return ms_fail(err, MS_ERR_FORMAT, "tensor \"%s\" appears in both %s and %s", ck->tensors[i].name,
                           ck->files[ck->tensors[j].file].path, ck->files[ck->tensors[i].file].path);
        }
    }
    return MS_OK;
}

static int open_index(ms_checkpoint *ck, const char *index_path, ms_err *err) {
    char *text;
    size_t len;
    int rc = ms_read_file(index_path, 256u << 20, &text, &len, err);
    if (rc) return rc;
    cJSON *root = NULL;
    rc = ms_json_parse(text, len, index_path, &root, err);
    free(text);
    if (rc) return rc;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return ms_fail(err, MS_ERR_FORMAT, "%s: missing \"weight_map\" object", index_path);
    }
    /* distinct shard names, in first-seen order */
    ms_strmap shards = {0};
    if (ms_strmap_init(&shards, 64) != 0) { cJSON_Delete(root); return ms_fail(err, MS_ERR_NOMEM, "out of memory"); }
    for (const cJSON *e = wm->child; e && !rc; e = e->next) {
        if (!cJSON_IsString(e)) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a file name", index_path, e->string);
            break;
        }
        const char *fn = e->valuestring;
        if (!*fn || strchr(fn, '/') || strcmp(fn, "..") == 0) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: weight_map[\"%s\"] names an invalid shard \"%s\"", index_path,
                         e->string, fn);
            break;
        }
        if (ms_strmap_get(&shards, fn) >= 0) continue;
        ms_strmap_put(&shards, fn, ck->n_files);
        char path[4096];
        rc = ms_path_join(path, sizeof path, ck->dir, fn, err);
        if (rc) break;
        if (!ms_file_exists(path)) {
            rc = ms_fail(err, MS_ERR_IO, "%s: shard \"%s\" (for tensor \"%s\") does not exist", index_path, fn,
                         e->string);
            break;
        }
        rc = add_file(ck, path, err);
    }
    if (!rc) rc = build_index(ck, err);
    for (const cJSON *e = wm->child; e && !rc; e = e->next) {
        int ti = ms_strmap_get(&ck->by_name, e->string);
        int fi = ms_strmap_get(&shards, e->valuestring);
        if (ti < 0)
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\" is not in shard %s", index_path, e->string,
                         e->valuestring);
        else if (ck->tensors[ti].file != fi)
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: tensor \"%s\" is listed in %s but stored in %s", index_path,
                         e->string, e->valuestring, ck->files[ck->tensors[ti].file].path);
    }
    ms_strmap_free(&shards);
    cJSON_Delete(root);
    return rc;
}

static int open_impl(const char *path, ms_checkpoint *ck, int headers_only, ms_err *err) {
    memset(ck, 0, sizeof *ck);
    ck->headers_only = headers_only;
    int rc;
    if (ms_file_exists(path)) { /* a single .safetensors file */
        ck->dir = strdup(path);
        rc = add_file(ck, path, err);
        if (!rc) rc = build_index(ck, err);
    } else {
        ck->dir = strdup(path);
        char idx[4096], single[4096];
        if ((rc = ms_path_join(idx, sizeof idx, path, "model.safetensors.index.json", err)) ||
            (rc = ms_path_join(single, sizeof single, path, "model.safetensors", err))) {
        } else if (ms_file_exists(idx)) {
            rc = open_index(ck, idx, err);
        } else if (ms_file_exists(single)) {
            rc = add_file(ck, single, err);
            if (!rc) rc = build_index(ck, err);
        } else {
            rc = ms_fail(err, MS_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", path);
        }
    }
    if (rc) ms_checkpoint_close(ck);
    return rc;
}

int ms_checkpoint_open(const char *path, ms_checkpoint *ck, ms_err *err) { return open_impl(path, ck, 0, err); }
int ms_checkpoint_open_headers(const char *path, ms_checkpoint *ck, ms_err *err) {
    return open_impl(path, ck, 1, err);
}

int ms_checkpoint_from_tensors(ms_checkpoint *ck, const char *dir, const char *where, ms_tensor *ts, int n,
                               ms_err *err) {
    memset(ck, 0, sizeof *ck);
    ck->headers_only = 1;
    ck->dir = strdup(dir);
    ck->files = calloc(1, sizeof *ck->files);
    int rc = MS_OK;
    if (!ck->dir || !ck->files || !(ck->files[0].path = strdup(where))) {
        ms_st_free_tensors(ts, n);
        rc = ms_fail(err, MS_ERR_NOMEM, "out of memory");
        goto out;
    }
    ck->files[0].map.fd = -1;
    ck->n_files = 1;
    ck->tensors = ts;
    ck->n_tensors = n;
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        ts[i].file = 0;
        ts[i].offset = off;
        off += (ts[i].nbytes + 63) & ~(uint64_t)63;
    }
    if ((rc = reserve_map(&ck->files[0], off, err))) goto out;
    for (int i = 0; i < n; i++) ts[i].data = ck->files[0].map.data + ts[i].offset;
    rc = build_index(ck, err);
out:
    if (rc) ms_checkpoint_close(ck);
    return rc;
}

void ms_checkpoint_close(ms_checkpoint *ck) {
    for (int i = 0; i < ck->n_files; i++) {
        ms_unmap_file(&ck->files[i].map);
        free(ck->files[i].path);
    }
    free(ck->files);
    ms_st_free_tensors(ck->tensors, ck->n_tensors);
    ms_strmap_free(&ck->by_name);
    free(ck->dir);
    memset(ck, 0, sizeof *ck);
}

const ms_tensor *ms_checkpoint_find(const ms_checkpoint *ck, const char *name) {
    int i = ms_strmap_get(&ck->by_name, name);
    return i < 0 ? NULL : &ck->tensors[i];
}
