/* err.h — status codes and error messages for library code.
 *
 * Contract: every library function that can fail returns an int status
 * (MS_OK == 0, negative on failure) and, on failure, fills an ms_err with a
 * message that names what is wrong and where (file, tensor, key, line).
 * Library code never prints and never exits; only src/cli does. */
#ifndef MS_ERR_H
#define MS_ERR_H

#include <stddef.h>

enum {
    MS_OK = 0,
    MS_ERR_IO = -1,          /* open/read/write/mmap failed */
    MS_ERR_FORMAT = -2,      /* malformed input (file, JSON, header) */
    MS_ERR_UNSUPPORTED = -3, /* valid input we do not support */
    MS_ERR_NOMEM = -4,       /* allocation failed or plan does not fit */
    MS_ERR_ARG = -5,         /* bad argument from the caller/user */
    MS_ERR_SHAPE = -6,       /* tensor missing or with an unexpected shape */
    MS_ERR_LIMIT = -7,       /* a bound (size, depth, count) was exceeded */
    MS_ERR_MISMATCH = -8,    /* checksum or binding mismatch */
};

typedef struct ms_err {
    int code;
    char msg[1024];
} ms_err;

/* Fill err (may be NULL) with code and a printf-style message; returns code.
 * If err already holds a message, the new one is prefixed: "new: old". */
int ms_fail(ms_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix an existing error with context ("loading X: <old msg>"); returns err->code. */
int ms_wrap(ms_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reset err to "no error". */
void ms_err_clear(ms_err *err);

/* Short name of a status code ("io", "format", ...). */
const char *ms_status_name(int code);

#endif
