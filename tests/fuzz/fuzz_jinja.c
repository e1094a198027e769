/* libFuzzer target: Jinja template parsing and rendering on arbitrary input.
 * The input is the template; it renders over a fixed chat-like context with
 * tight limits (output, iterations, memory, depth). Any status is fine; the
 * sanitizers and the limits are what is tested. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"

static const char CTX[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi \\u00e9 \\ud83d\\ude00\"},"
    " {\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"r\", \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1.5, \"b\": [1, 2, {\"c\": null}]}}}]},"
    " {\"role\": \"tool\", \"content\": \"{\\\"x\\\": 1}\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"n\": 3, \"f\": -2.5, \"s\": \"  a b  \", \"e\": []}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    ms_jinja_tpl *t = NULL;
    ms_err err;
    if (ms_jinja_parse((const char *)data, size, &t, &err) != MS_OK) return 0;
    ms_jinja_limits lim;
    ms_jinja_default_limits(&lim);
    lim.max_output = 1 << 20;
    lim.max_memory = 64 << 20;
    lim.max_iterations = 20000;
    lim.max_depth = 64;
    ms_jinja_vars *v = ms_jinja_vars_new(&lim);
    if (v && ms_jinja_vars_set_json(v, NULL, CTX, sizeof CTX - 1, NULL, NULL, &err) == MS_OK) {
        char *out = NULL;
        size_t n = 0;
        if (ms_jinja_render(t, v, &out, &n, &err) == MS_OK) {
            if (strlen(out) > n) abort(); /* the length covers the string */
            free(out);
        }
    }
    ms_jinja_vars_free(v);
    ms_jinja_free(t);
    return 0;
}
