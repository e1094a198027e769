#include "util/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int ms_read_file(const char *path, size_t max_bytes, char **out, size_t *len, ms_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ms_fail(err, MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return ms_fail(err, MS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if ((uint64_t)st.st_size > max_bytes) {
        close(fd);
        return ms_fail(err, MS_ERR_LIMIT, "%s: file is %lld bytes, limit is %zu", path,
                       (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return ms_fail(err, MS_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            close(fd);
            return ms_fail(err, MS_ERR_IO, "%s: short read at byte %zu", path, got);
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return MS_OK;
}

int ms_atomic_begin(ms_atomic_file *f, const char *path, ms_err *err) { return ms_atomic_begin_mode(f, path, 0644, err); }

int ms_atomic_begin_mode(ms_atomic_file *f, const char *path, int mode, ms_err *err) {
    f->fd = -1;
    f->path = path;
    if (snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof f->tmp)
        return ms_fail(err, MS_ERR_ARG, "%s: path too long", path);
    unlink(f->tmp); /* a leftover of a crash: O_EXCL below creates it anew with our mode */
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (f->fd < 0) return ms_fail(err, MS_ERR_IO, "%s: cannot create: %s", f->tmp, strerror(errno));
    return MS_OK;
}

int ms_atomic_write(ms_atomic_file *f, const void *data, uint64_t len, ms_err *err) {
    const uint8_t *p = data;
    while (len) {
        ssize_t w = write(f->fd, p, len > (1u << 30) ? (1u << 30) : (size_t)len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return ms_fail(err, MS_ERR_IO, "%s: write failed: %s", f->tmp, w < 0 ? strerror(errno) : "no progress");
        p += w;
        len -= (uint64_t)w;
    }
    return MS_OK;
}

void ms_atomic_abort(ms_atomic_file *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    unlink(f->tmp);
}

int ms_atomic_commit(ms_atomic_file *f, ms_err *err) {
    int rc = MS_OK;
    if (fsync(f->fd) != 0) rc = ms_fail(err, MS_ERR_IO, "%s: fsync failed: %s", f->tmp, strerror(errno));
    if (close(f->fd) != 0 && !rc) rc = ms_fail(err, MS_ERR_IO, "%s: close failed: %s", f->tmp, strerror(errno));
    f->fd = -1;
    if (!rc && rename(f->tmp, f->path) != 0) rc = ms_fail(err, MS_ERR_IO, "%s: rename failed: %s", f->path, strerror(errno));
    if (rc) {
        unlink(f->tmp);
        return rc;
    }
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s", f->path);
    int dfd = open(dirname(dirbuf), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return MS_OK;
}

int ms_write_file_atomic(const char *path, const void *data, size_t len, ms_err *err) {
    return ms_write_file_atomic_mode(path, data, len, 0644, err);
}

int ms_write_file_atomic_mode(const char *path, const void *data, size_t len, int mode, ms_err *err) {
    ms_atomic_file f;
    int rc = ms_atomic_begin_mode(&f, path, mode, err);
    if (rc) return rc;
    if ((rc = ms_atomic_write(&f, data, len, err))) {
        ms_atomic_abort(&f);
        return rc;
    }
    return ms_atomic_commit(&f, err);
}

int ms_map_file(const char *path, ms_mapping *m, ms_err *err) {
    memset(m, 0, sizeof *m);
    m->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ms_fail(err, MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return ms_fail(err, MS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    m->fd = fd;
    m->size = (uint64_t)st.st_size;
    if (m->size == 0) return MS_OK;
    void *p = mmap(NULL, m->size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        m->fd = -1;
        return ms_fail(err, MS_ERR_IO, "%s: mmap of %llu bytes failed: %s", path,
                       (unsigned long long)m->size, strerror(errno));
    }
    m->data = p;
    return MS_OK;
}

void ms_unmap_file(ms_mapping *m) {
    if (m->data && m->size) munmap((void *)m->data, m->size);
    if (m->fd >= 0) close(m->fd);
    memset(m, 0, sizeof *m);
    m->fd = -1;
}

int ms_path_join(char *out, size_t cap, const char *dir, const char *name, ms_err *err) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return ms_fail(err, MS_ERR_ARG, "path too long: %s/%s", dir, name);
    return MS_OK;
}

int ms_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
