/* checksum.c — whole-file SHA-256 and sha256sum checksum files (checksum.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checksum.h"

#define READ_CHUNK (8u << 20)

int ms_sha256_file(const char *path, uint8_t out[32], uint64_t *size, ms_sha_progress progress, void *ud,
                   ms_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ms_fail(err, MS_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return ms_fail(err, MS_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ms_fail(err, MS_ERR_IO, "%s: not a regular file", path);
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint8_t *buf = malloc(READ_CHUNK);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int rc = MS_OK;
    if (!buf || !ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        rc = ms_fail(err, MS_ERR_NOMEM, "%s: SHA-256: out of memory", path);
        goto done;
    }
    uint64_t total = 0;
    for (;;) {
        ssize_t k = read(fd, buf, READ_CHUNK);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            rc = ms_fail(err, MS_ERR_IO, "%s: read at %llu: %s", path, (unsigned long long)total, strerror(errno));
            goto done;
        }
        if (k == 0) break;
        if (EVP_DigestUpdate(ctx, buf, (size_t)k) != 1) {
            rc = ms_fail(err, MS_ERR_IO, "%s: SHA-256 failed", path);
            goto done;
        }
        total += (uint64_t)k;
        /* dropped behind the reader: hashing a terabyte must not evict everything else */
        if ((total & ((64u << 20) - 1)) < (uint64_t)k) posix_fadvise(fd, 0, (off_t)total, POSIX_FADV_DONTNEED);
        if (progress) progress(ud, total, (uint64_t)st.st_size);
    }
    if (total != (uint64_t)st.st_size) {
        rc = ms_fail(err, MS_ERR_IO, "%s: %llu bytes read but the file has %llu (changed while read?)", path,
                     (unsigned long long)total, (unsigned long long)st.st_size);
        goto done;
    }
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx, out, &n) != 1 || n != 32) {
        rc = ms_fail(err, MS_ERR_IO, "%s: SHA-256 failed", path);
        goto done;
    }
    if (size) *size = total;
done:
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    return rc;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int ms_unhex(const char *s, size_t n, uint8_t *out) {
    for (size_t i = 0; i < n; i++) {
        int a = hexval((unsigned char)s[2 * i]), b = a < 0 ? -1 : hexval((unsigned char)s[2 * i + 1]);
        if (a < 0 || b < 0) return -1;
        out[i] = (uint8_t)(a << 4 | b);
    }
    return 0;
}

void ms_sums_free(ms_sums *s) {
    for (int i = 0; s->e && i < s->n; i++) free(s->e[i].name);
    free(s->e);
    s->e = NULL, s->n = 0;
}

const ms_sum_entry *ms_sums_find(const ms_sums *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->e[i].name, name)) return &s->e[i];
    return NULL;
}

/* "..", as a whole path component of name */
static int has_dotdot(const char *name) {
    for (const char *p = name; (p = strstr(p, "..")); p += 2)
        if ((p == name || p[-1] == '/') && (p[2] == 0 || p[2] == '/')) return 1;
    return 0;
}

int ms_sums_parse(const char *text, size_t len, const char *path, ms_sums *out, ms_err *err) {
    *out = (ms_sums){0};
    int cap = 0, line_no = 0, rc = MS_OK;
    size_t i = 0;
    while (i < len && !rc) {
        size_t a = i;
        while (i < len && text[i] != '\n') i++;
        size_t b = i; /* [a, b) is the line */
        if (i < len) i++;
        line_no++;
        if (b > a && text[b - 1] == '\r') b--;
        if (b == a) continue;
        if (line_no > (1 << 20)) {
            rc = ms_fail(err, MS_ERR_LIMIT, "%s: more than %d lines", path, 1 << 20);
            break;
        }
        const char *l = text + a;
        size_t n = b - a;
        if (l[0] == '\\') {
            rc = ms_fail(err, MS_ERR_UNSUPPORTED, "%s:%d: escaped file names (a leading '\\') are not supported", path,
                         line_no);
            break;
        }
        uint8_t sum[32];
        if (n < 64 || ms_unhex(l, 32, sum) || (n > 64 && hexval((unsigned char)l[64]) >= 0)) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s:%d: expected 64 hex digits (SHA-256) at the start of the line", path,
                         line_no);
            break;
        }
        if (n < 67 || l[64] != ' ' || (l[65] != ' ' && l[65] != '*')) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s:%d: expected \"HASH  NAME\" or \"HASH *NAME\" (the sha256sum format)",
                         path, line_no);
            break;
        }
        size_t nl = n - 66;
        const char *nm = l + 66;
        if (memchr(nm, 0, nl)) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s:%d: a NUL byte in the file name", path, line_no);
            break;
        }
        char *name = strndup(nm, nl);
        if (!name) {
            rc = ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        if (name[0] == '/' || has_dotdot(name)) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s:%d: \"%s\": names must be relative and without \"..\"", path, line_no,
                         name);
            free(name);
            break;
        }
        if (ms_sums_find(out, name)) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s:%d: \"%s\" is listed twice", path, line_no, name);
            free(name);
            break;
        }
        if (out->n == cap) {
            int nc = cap ? 2 * cap : 16;
            ms_sum_entry *ne = realloc(out->e, (size_t)nc * sizeof *ne);
            if (!ne) {
                free(name);
                rc = ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            out->e = ne, cap = nc;
        }
        out->e[out->n].name = name;
        memcpy(out->e[out->n].sum, sum, 32);
        out->n++;
    }
    if (rc) ms_sums_free(out);
    return rc;
}

void ms_names_free(char **names, int n) {
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int ms_list_shards(const char *dir, char ***names_out, int *n_out, ms_err *err) {
    *names_out = NULL, *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) return ms_fail(err, MS_ERR_IO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0, rc = MS_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors")) continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, 0) || !S_ISREG(st.st_mode)) continue;
        if (n == cap) {
            int nc = cap ? 2 * cap : 16;
            char **nn = realloc(names, (size_t)nc * sizeof *nn);
            if (!nn) {
                rc = ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", dir);
                break;
            }
            names = nn, cap = nc;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = ms_fail(err, MS_ERR_NOMEM, "%s: out of memory", dir);
            break;
        }
        n++;
    }
    closedir(d);
    if (rc) {
        ms_names_free(names, n);
        return rc;
    }
    if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_name);
    *names_out = names, *n_out = n;
    return MS_OK;
}
