/* json.h — bounded, error-naming accessors over cJSON.
 *
 * Every getter takes the object, the key and a "where" string used in
 * messages ("config.json", "model.safetensors header"), and fails with
 * MS_ERR_FORMAT naming the key when the value has the wrong type or is out
 * of range. "opt" getters leave *out unchanged when the key is absent or null. */
#ifndef MS_JSON_H
#define MS_JSON_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "util/err.h"

/* Parse len bytes as one JSON document; at most max_depth nesting. */
int ms_json_parse(const char *text, size_t len, const char *where, cJSON **out, ms_err *err);

int ms_json_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                const char *where, ms_err *err);
int ms_json_opt_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    const char *where, ms_err *err);
int ms_json_opt_double(const cJSON *obj, const char *key, double *out, const char *where, ms_err *err);
int ms_json_opt_bool(const cJSON *obj, const char *key, int *out, const char *where, ms_err *err);
/* String getters return a pointer into the cJSON tree (valid while it lives). */
int ms_json_opt_string(const cJSON *obj, const char *key, const char **out, const char *where,
                       ms_err *err);
/* True when v is a number holding an exact integer in [lo, hi]. */
int ms_json_is_int(const cJSON *v, int64_t lo, int64_t hi);

#endif
