/* libFuzzer target: the streaming output parsers. The first byte picks the
 * format and options, the rest is generated text; it is parsed whole and in
 * chunks whose sizes come from the input, and both must give the same message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/outparse.h"

static char *parse(ms_outfmt f, const ms_outparse_opts *o, const char *t, size_t n, const uint8_t *sizes,
                   size_t nsizes) {
    ms_outparse *p = NULL;
    ms_err e;
    if (ms_outparse_new(f, o, &p, &e)) abort();
    ms_outmsg *m = ms_outmsg_new();
    if (!m) abort();
    size_t i = 0, k = 0;
    while (i < n) {
        size_t c = nsizes ? 1 + sizes[k++ % nsizes] % 13 : n;
        if (c > n - i) c = n - i;
        if (ms_outparse_feed(p, t + i, c, ms_outmsg_collect, m, &e)) abort();
        i += c;
    }
    if (ms_outparse_finish(p, ms_outmsg_collect, m, &e)) abort();
    char *js = NULL;
    if (ms_outmsg_json(m, &js, &e)) abort();
    ms_outmsg_free(m);
    ms_outparse_free(p);
    return js;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    ms_outfmt f = (ms_outfmt)(data[0] % MS_OUTFMT_COUNT);
    ms_outparse_opts o = {.start_in_reasoning = (data[0] >> 3) & 1, .id_seed = 1};
    if ((data[0] >> 4) & 1) o.reasoning_open = "◁think▷", o.reasoning_close = "◁/think▷";
    if ((data[0] >> 5) & 1)
        o.tools_json = "[{\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{\"k\":{\"type\":\"string\"}}}}}]";
    const char *t = (const char *)data + 1;
    size_t n = size - 1;
    char *a = parse(f, &o, t, n, NULL, 0);
    char *b = parse(f, &o, t, n, data, size);
    char *c = parse(f, &o, t, n, (const uint8_t *)"\0", 1); /* byte by byte */
    if (strcmp(a, b) || strcmp(a, c)) abort(); /* streaming must not change the result */
    free(a);
    free(b);
    free(c);
    return 0;
}
