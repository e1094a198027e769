/* libFuzzer target: the XTML chat renderer (and the Python-semantics JSON
 * parser under it) on arbitrary request bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/xtml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *out = NULL;
    size_t len = 0;
    ms_err err;
    if (ms_xtml_render((const char *)data, size, &out, &len, &err) == 0) {
        if (!out || strlen(out) > len) abort(); /* NUL-terminated within its length */
        free(out);
    } else if (out) {
        abort(); /* nothing is returned on failure */
    }
    return 0;
}
