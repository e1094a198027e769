#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int ms_fail(ms_err *err, int code, const char *fmt, ...) {
    if (!err) return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->code = code;
    return code;
}

int ms_wrap(ms_err *err, const char *fmt, ...) {
    if (!err) return MS_ERR_ARG;
    char prefix[256], old[sizeof err->msg - 300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    snprintf(old, sizeof old, "%.700s", err->msg);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    return err->code ? err->code : MS_ERR_ARG;
}

void ms_err_clear(ms_err *err) {
    if (!err) return;
    err->code = MS_OK;
    err->msg[0] = 0;
}

const char *ms_status_name(int code) {
    switch (code) {
    case MS_OK: return "ok";
    case MS_ERR_IO: return "io";
    case MS_ERR_FORMAT: return "format";
    case MS_ERR_UNSUPPORTED: return "unsupported";
    case MS_ERR_NOMEM: return "nomem";
    case MS_ERR_ARG: return "argument";
    case MS_ERR_SHAPE: return "shape";
    case MS_ERR_LIMIT: return "limit";
    case MS_ERR_MISMATCH: return "mismatch";
    default: return "error";
    }
}
