/* pyjson.h — JSON values with the semantics of Python's json module.
 *
 * Reference encoders written in Python (a model's chat encoder) turn JSON into
 * text with json.loads/json.dumps and str(). Reproducing them byte for byte
 * needs what a generic JSON tree forgets: whether a number was written as an
 * integer ("1") or a float ("1.0"), integers of any size, and Python's dict
 * rule for duplicate keys (the last value wins, at the first key's position).
 * This module parses JSON text into such values and prints them the way
 * Python does. It is not a general JSON library: use util/json.h for configs.
 *
 * Also here: ms_textbuf, a growable byte buffer with a size cap, used by the
 * text renderers and parsers. */
#ifndef MS_TEXT_PYJSON_H
#define MS_TEXT_PYJSON_H

#include <stddef.h>

#include "util/err.h"

/* ---- growable text buffer ---- */
typedef struct ms_textbuf {
    char *data;   /* NUL-terminated while len < cap; owned */
    size_t len;
    size_t cap;
    size_t limit; /* 0 = no limit beyond memory; else appends past it fail (MS_ERR_LIMIT) */
    int failed;   /* sticky: an append failed (out of memory or past limit) */
} ms_textbuf;

/* Append n bytes (or a NUL-terminated string). Returns MS_OK or, once the
 * buffer failed, MS_ERR_NOMEM / MS_ERR_LIMIT (and keeps failing). */
int ms_textbuf_append(ms_textbuf *b, const char *s, size_t n);
int ms_textbuf_puts(ms_textbuf *b, const char *s);
/* Free the data and zero the buffer. */
void ms_textbuf_free(ms_textbuf *b);

/* ---- values ---- */
typedef enum {
    MS_PY_NULL,
    MS_PY_BOOL,
    MS_PY_INT,   /* arbitrary size: kept as its canonical decimal text */
    MS_PY_FLOAT, /* double (json.loads: float(); 1e400 is inf) */
    MS_PY_STR,   /* UTF-8, may contain NUL (from \u0000) */
    MS_PY_LIST,
    MS_PY_DICT,  /* keys are strings, unique, in insertion order */
} ms_py_type;

typedef struct ms_py ms_py;
struct ms_py {
    ms_py_type type;
    int b;          /* BOOL */
    double f;       /* FLOAT */
    char *s;        /* STR bytes, INT decimal text; NUL-terminated; owned */
    size_t slen;
    ms_py **items;  /* LIST items, DICT values; owned */
    char **keys;    /* DICT keys (NUL-terminated, owned) */
    size_t *klens;
    size_t n, cap;
};

/* Parse len bytes exactly as Python's json.loads(text) would (strict mode:
 * raw control characters in strings are errors; NaN, Infinity and -Infinity
 * are accepted; nesting at most max_depth). The text must be valid UTF-8 and
 * lone UTF-16 surrogates (\ud800 alone) are rejected. On success *out is a new
 * tree the caller frees with ms_py_free. Errors: MS_ERR_FORMAT naming `where`
 * and the byte offset, MS_ERR_LIMIT for depth, MS_ERR_NOMEM. */
int ms_py_parse(const char *text, size_t len, int max_depth, const char *where, ms_py **out,
                ms_err *err);
void ms_py_free(ms_py *v);

/* Constructors (NULL on out of memory) and container edits. */
ms_py *ms_py_new(ms_py_type t);
ms_py *ms_py_new_str(const char *s, size_t n);
/* Set d[key] = v (takes ownership of v): replaces in place when key exists. */
int ms_py_dict_set(ms_py *d, const char *key, size_t klen, ms_py *v);
int ms_py_list_append(ms_py *l, ms_py *v);
/* Deep copy (NULL on out of memory). */
ms_py *ms_py_copy(const ms_py *v);

/* d.get(key): the value, or NULL when absent (or d is not a dict). */
ms_py *ms_py_get(const ms_py *d, const char *key);
/* True when v is a string equal to s. */
int ms_py_str_eq(const ms_py *v, const char *s);
/* Python truth value (bool(v)). */
int ms_py_truthy(const ms_py *v);
/* Python's str.strip() would leave something (v must be STR). */
int ms_py_str_has_nonspace(const char *s, size_t n);

/* Sort every dict's keys recursively by code point (Python sorted(d.items())). */
void ms_py_deep_sort(ms_py *v);

/* json.dumps(v, ensure_ascii=False) appended to b; compact selects
 * separators=(",", ":") instead of (", ", ": "). */
int ms_py_dumps(ms_textbuf *b, const ms_py *v, int compact);
/* str(v) appended to b for scalars (None, True, ints, floats as repr, str).
 * Lists and dicts would need Python's repr: MS_ERR_UNSUPPORTED naming `what`. */
int ms_py_str(ms_textbuf *b, const ms_py *v, const char *what, ms_err *err);
/* repr(float) as Python 3 prints it ("1.0", "1e-05", "1e+16", "inf", "nan"). */
void ms_py_float_repr(double f, char out[32]);

#endif
