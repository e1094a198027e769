/* test_jinja_diff.c — differential test against Debian's python3-jinja2.
 * tests/text/jinja_diff.py renders a corpus (small templates, one construct
 * each, plus the real chat templates of tests/data/tokenizers and chat-style
 * templates over many conversations) with jinja2 configured as transformers
 * configures it, and emits the results; this test renders every case
 * in-process and requires byte-identical output, or an error where jinja2
 * raised. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "text/chat_template.h"

static char *run_reference(size_t *len) {
    FILE *p = popen("/usr/bin/python3 tests/text/jinja_diff.py --emit -", "r");
    if (!p) return NULL;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n == cap) buf = realloc(buf, cap *= 2);
        size_t r = fread(buf + n, 1, cap - n, p);
        if (!r) break;
        n += r;
    }
    int st = pclose(p);
    if (st != 0) { free(buf); return NULL; }
    *len = n;
    return buf;
}

TEST(matches_python_jinja2) {
    size_t len = 0;
    char *ref = run_reference(&len);
    CHECK_MSG(ref != NULL, "tests/text/jinja_diff.py --emit failed (is python3-jinja2 installed? tools/install-deps.sh)");
    if (!ref) return;
    cJSON *cases = cJSON_ParseWithLength(ref, len);
    free(ref);
    CHECK(cJSON_IsArray(cases));
    int n = 0, differ = 0, errors = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const char *tpl = cJSON_GetObjectItem(c, "template")->valuestring;
        const char *req = cJSON_GetObjectItem(c, "request")->valuestring;
        const cJSON *cfg = cJSON_GetObjectItem(c, "tokenizer_config");
        int ok_ref = cJSON_IsTrue(cJSON_GetObjectItem(c, "ok"));
        const char *want = cJSON_GetObjectItem(c, "output")->valuestring;
        char *out = NULL;
        size_t out_len = 0;
        ms_err err = {0};
        int rc = ms_chat_render_jinja(tpl, cfg, req, strlen(req), &out, &out_len, &err);
        n++;
        errors += !ok_ref;
        int same = ok_ref ? (rc == 0 && out_len == strlen(want) && !memcmp(out, want, out_len)) : rc != 0;
        if (!same) {
            differ++;
            if (differ <= 15)
                fprintf(stderr, "DIFF %s\n  template: %.200s\n  jinja2:    %s %.300s\n  moonshine: %s %.300s\n", name, tpl,
                        ok_ref ? "ok " : "ERR", want, rc ? "ERR" : "ok ", rc ? err.msg : out);
        }
        free(out);
    }
    printf("jinja differential: %d renders (%d expected errors), %d differ\n", n, errors, differ);
    CHECK_MSG(differ == 0, "%d of %d renders differ from python3-jinja2", differ, n);
    CHECK_MSG(n >= 600, "only %d cases", n);
    CHECK_MSG(errors < n / 4, "%d of %d cases are errors", errors, n);
    cJSON_Delete(cases);
}

TEST_MAIN()
