/* fs.h — whole-file reads, atomic writes, read-only mappings. */
#ifndef MS_FS_H
#define MS_FS_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

/* Read a whole file (at most max_bytes) into a malloc'd, NUL-terminated buffer. */
int ms_read_file(const char *path, size_t max_bytes, char **out, size_t *len, ms_err *err);

/* Write data to path atomically: path.tmp.PID, fsync, rename, fsync dir. */
int ms_write_file_atomic(const char *path, const void *data, size_t len, ms_err *err);

/* The same in steps, for files written piece by piece: ms_atomic_begin creates
 * path.tmp.PID; ms_atomic_write appends (short writes and EINTR retried); ms_atomic_commit
 * fsyncs, renames over path and fsyncs the directory; ms_atomic_abort removes the temp
 * file. After begin succeeds, exactly one of commit or abort must be called (commit
 * removes the temp file itself when it fails). */
typedef struct ms_atomic_file {
    int fd;
    char tmp[4096];
    const char *path; /* borrowed */
} ms_atomic_file;
int ms_atomic_begin(ms_atomic_file *f, const char *path, ms_err *err);
/* The same with the file's mode (0600: private files, state and conversations). */
int ms_atomic_begin_mode(ms_atomic_file *f, const char *path, int mode, ms_err *err);
int ms_write_file_atomic_mode(const char *path, const void *data, size_t len, int mode, ms_err *err);
int ms_atomic_write(ms_atomic_file *f, const void *data, uint64_t len, ms_err *err);
int ms_atomic_commit(ms_atomic_file *f, ms_err *err);
void ms_atomic_abort(ms_atomic_file *f);

/* A read-only mapping of a whole file. */
typedef struct ms_mapping {
    int fd;
    const uint8_t *data;
    uint64_t size;
} ms_mapping;

int ms_map_file(const char *path, ms_mapping *m, ms_err *err);
void ms_unmap_file(ms_mapping *m);

/* Join dir and name into out (size cap); error when it does not fit. */
int ms_path_join(char *out, size_t cap, const char *dir, const char *name, ms_err *err);
int ms_file_exists(const char *path);

#endif
