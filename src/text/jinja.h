/* jinja.h — a Jinja2 template interpreter sized for chat templates.
 *
 * Semantics follow Jinja2 3.1 configured the way Hugging Face transformers
 * renders chat templates: ImmutableSandboxedEnvironment(trim_blocks=True,
 * lstrip_blocks=True, extensions=[loopcontrols, generation tag]), a `tojson`
 * filter equal to json.dumps(x, ensure_ascii=False, indent=None,
 * separators=None, sort_keys=False), and the globals raise_exception(msg)
 * and strftime_now(fmt). Values follow Python rules (int/float/str/list/
 * dict/None/bool) and Jinja's default Undefined.
 *
 * Bounded: nesting depth while parsing and evaluating, total loop
 * iterations, output size and working memory (ms_jinja_limits). Every error
 * message names the template line ("line N: ..."). */
#ifndef MS_JINJA_H
#define MS_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct ms_jinja_tpl ms_jinja_tpl;

typedef struct ms_jinja_limits {
    size_t max_output;      /* bytes of rendered text (default 64 MiB) */
    size_t max_memory;      /* bytes of working memory while rendering (default 1 GiB) */
    int64_t max_iterations; /* loop iterations over the whole render (default 10M) */
    int max_depth;          /* macro calls + expression nesting (default 200) */
} ms_jinja_limits;

/* Fill *lim with the defaults above. */
void ms_jinja_default_limits(ms_jinja_limits *lim);

/* Parse template source (len bytes, UTF-8; need not be NUL-terminated;
 * at most 16 MiB) into *out. The source is copied; the caller keeps it.
 * Errors: MS_ERR_FORMAT with "template line N: ..." for syntax errors,
 * MS_ERR_LIMIT when nesting or size exceeds the bounds, MS_ERR_NOMEM.
 * On success free *out with ms_jinja_free. */
int ms_jinja_parse(const char *src, size_t len, ms_jinja_tpl **out, ms_err *err);

/* Template variables for one render, built from JSON text (numbers keep
 * Python's int/float distinction: a number written with '.', 'e' or 'E' is a
 * float, others are ints in int64 range). Owns the render's working memory. */
typedef struct ms_jinja_vars ms_jinja_vars;

/* New, empty variable set; lim may be NULL for the defaults. NULL on OOM. */
ms_jinja_vars *ms_jinja_vars_new(const ms_jinja_limits *lim);
void ms_jinja_vars_free(ms_jinja_vars *v);

/* Parse len bytes of JSON. When member is NULL the whole document is used,
 * else the value of that member of the top-level object (absent or null:
 * *found = 0 and nothing is set; found may be NULL). The value becomes the
 * variable name, or, when name is NULL, the value must be an object whose
 * members all become variables. Errors: MS_ERR_FORMAT naming the JSON byte
 * offset, MS_ERR_LIMIT (nesting deeper than 256, memory). */
int ms_jinja_vars_set_json(ms_jinja_vars *v, const char *name, const char *json, size_t len, const char *member,
                           int *found, ms_err *err);
/* Set a variable to a string (copied), a bool, or None. */
int ms_jinja_vars_set_string(ms_jinja_vars *v, const char *name, const char *s, ms_err *err);
int ms_jinja_vars_set_bool(ms_jinja_vars *v, const char *name, int b, ms_err *err);
int ms_jinja_vars_set_none(ms_jinja_vars *v, const char *name, ms_err *err);
/* 1 when a variable of that name is set. */
int ms_jinja_vars_has(const ms_jinja_vars *v, const char *name);

/* Render tpl with vars (which it may use as working memory: render a given
 * vars once). On success *out is a malloc'd, NUL-terminated string of
 * *out_len bytes (the caller frees it). Errors: MS_ERR_FORMAT for template
 * runtime errors ("template line N: ..."; raise_exception(msg) gives
 * "template line N: msg"), MS_ERR_LIMIT when a bound is hit. */
int ms_jinja_render(const ms_jinja_tpl *tpl, ms_jinja_vars *vars, char **out, size_t *out_len, ms_err *err);

/* Free a parsed template (NULL is fine). */
void ms_jinja_free(ms_jinja_tpl *tpl);

#endif
