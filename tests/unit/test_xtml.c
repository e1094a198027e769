/* XTML renderer vs Kimi K3's reference encoder (encoding_k3.py) on the corpus
 * in tests/data/xtml and on 300 random requests: the encoder's renders are
 * tests/data/xtml/reference_{corpus,random}.json, made by
 * tools/refs/xtml_reference.py (tools/refs/regen.sh). And Python-semantics
 * JSON printing vs Python itself. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "text/chat_template.h"
#include "text/pyjson.h"
#include "text/xtml.h"
#include "util/fs.h"

#define CORPUS "tests/data/xtml/conversations.json"
#define REF_CORPUS "tests/data/xtml/reference_corpus.json"
#define REF_RANDOM "tests/data/xtml/reference_random.json"
#define K3_DIR "tests/data/fixtures/models/kimi_k3"

static char *run_capture(const char *cmd, size_t *len) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    ms_textbuf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) ms_textbuf_append(&b, chunk, n);
    int rc = pclose(p);
    if (rc != 0 || b.failed) {
        ms_textbuf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.data;
}

static void show_diff(const char *name, const char *a, size_t al, const char *b, size_t bl) {
    size_t i = 0;
    while (i < al && i < bl && a[i] == b[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "  %s: first difference at byte %zu (moonshine %zu bytes, reference %zu)\n", name, i,
            al, bl);
    fprintf(stderr, "    moonshine: %.*s\n", (int)((al - from) < 160 ? al - from : 160), a + from);
    fprintf(stderr, "    reference: %.*s\n", (int)((bl - from) < 160 ? bl - from : 160), b + from);
}

/* Read and parse the JSON file at path, both CHECKs; *text keeps the file's bytes (freed by the
 * caller, after the value). NULL where either step failed (*text NULL where the read did). */
static ms_py *read_json(const char *path, char **text) {
    size_t len = 0;
    ms_err err = {0};
    *text = NULL;
    CHECK_MSG(ms_read_file(path, 64 << 20, text, &len, &err) == MS_OK, "%s: %s", path, err.msg);
    if (!*text) return NULL;
    ms_py *v = NULL;
    CHECK_MSG(ms_py_parse(*text, len, 64, path, &v, &err) == MS_OK, "%s: %s", path, err.msg);
    return v;
}

/* A corpus entry's request as the renderers take it: its "raw" text, else its "request" dumped. */
static void request_text(const ms_py *c, ms_textbuf *req) {
    const ms_py *rawv = ms_py_get(c, "raw");
    if (rawv) ms_textbuf_append(req, rawv->s, rawv->slen);
    else ms_py_dumps(req, ms_py_get(c, "request"), 0);
}

TEST(corpus_matches_reference_encoder) {
    char *ref = NULL, *corpus_text = NULL;
    ms_py *refs = read_json(REF_CORPUS, &ref), *corpus = NULL;
    if (!ref) return;
    corpus = read_json(CORPUS, &corpus_text);
    if (!corpus || !refs) goto out;
    CHECK(corpus->n >= 50);
    CHECK(refs->n == corpus->n);
    size_t texts = 0, errors = 0;
    for (size_t i = 0; i < corpus->n && i < refs->n; i++) {
        const ms_py *c = corpus->items[i];
        const ms_py *r = refs->items[i];
        const ms_py *name = ms_py_get(c, "name");
        CHECK(ms_py_str_eq(ms_py_get(r, "name"), name->s));
        ms_textbuf req = {0};
        request_text(c, &req);
        char *out = NULL;
        size_t olen = 0;
        ms_err e = {0};
        int st = ms_xtml_render(req.data, req.len, &out, &olen, &e);
        const ms_py *want = ms_py_get(r, "text");
        if (want) {
            texts++;
            CHECK_MSG(st == MS_OK, "%s: moonshine failed: %s", name->s, e.msg);
            if (st == MS_OK) {
                int same = olen == want->slen && memcmp(out, want->s, olen) == 0;
                CHECK_MSG(same, "%s differs from encoding_k3.py", name->s);
                if (!same) show_diff(name->s, out, olen, want->s, want->slen);
            }
        } else {
            errors++;
            CHECK_MSG(st != MS_OK, "%s: the reference raised (%s) but moonshine rendered", name->s,
                      ms_py_get(r, "error")->s);
            CHECK_MSG(st == MS_OK || e.msg[0], "%s: failure without a message", name->s);
        }
        free(out);
        ms_textbuf_free(&req);
    }
    CHECK(texts >= 50);
    CHECK(errors >= 5);
    /* the same through the renderer choice for a K3 checkpoint directory (no Jinja template:
     * the built-in XTML renderer); requests the render command refuses are skipped */
    size_t via_dir = 0;
    for (size_t i = 0; i < corpus->n && i < refs->n; i++) {
        const ms_py *want = ms_py_get(refs->items[i], "text");
        if (!want) continue;
        ms_textbuf req = {0};
        request_text(corpus->items[i], &req);
        char *out = NULL;
        size_t olen = 0;
        ms_err e = {0};
        if (ms_chat_render(K3_DIR, req.data, req.len, &out, &olen, &e) == MS_OK) {
            via_dir++;
            CHECK_MSG(olen == want->slen && !memcmp(out, want->s, olen), "%s via %s differs",
                      ms_py_get(corpus->items[i], "name")->s, K3_DIR);
        }
        free(out);
        ms_textbuf_free(&req);
    }
    CHECK_MSG(via_dir >= 40, "only %zu corpus requests rendered through %s", via_dir, K3_DIR);
out:
    ms_py_free(corpus);
    ms_py_free(refs);
    free(corpus_text);
    free(ref);
}

/* 300 random requests mixing every feature (valid and not), generated and
 * rendered by the reference side (tests/data/xtml/reference_random.json);
 * moonshine must agree on each. */
TEST(random_requests_match_reference_encoder) {
    char *ref = NULL;
    ms_py *refs = read_json(REF_RANDOM, &ref);
    if (!ref) return;
    size_t texts = 0, errors = 0;
    for (size_t i = 0; refs && i < refs->n; i++) {
        const ms_py *r = refs->items[i];
        ms_textbuf req = {0};
        ms_py_dumps(&req, ms_py_get(r, "request"), 0);
        char *out = NULL;
        size_t olen = 0;
        ms_err e = {0};
        int st = ms_xtml_render(req.data, req.len, &out, &olen, &e);
        const ms_py *want = ms_py_get(r, "text");
        if (want) {
            texts++;
            int same = st == MS_OK && olen == want->slen && !memcmp(out, want->s, olen);
            CHECK_MSG(same, "random request %zu differs (%s): %s", i, st ? e.msg : "text", req.data);
            if (!same && !st) show_diff("random", out, olen, want->s, want->slen);
        } else {
            errors++;
            CHECK_MSG(st != MS_OK, "random request %zu: the reference raised (%s), moonshine rendered: %s", i,
                      ms_py_get(r, "error")->s, req.data);
        }
        free(out);
        ms_textbuf_free(&req);
    }
    CHECK(texts >= 150 && errors >= 20);
    ms_py_free(refs);
    free(ref);
}

/* repr(float) and json.dumps(float) of random doubles, against python3 */
TEST(float_repr_matches_python) {
    enum { N = 3000 };
    static double v[N];
    uint64_t s = 0x9E3779B97F4A7C15ull;
    char path[] = "/tmp/ms_xtml_floatsXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w");
    for (int i = 0; i < N; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint64_t bits = s;
        double d;
        if (i % 3 == 0) { /* "nice" decimals: k / 10^j */
            d = (double)(int64_t)(s % 2000001 - 1000000) / pow(10, (double)(s >> 40) * 0 + (i / 3) % 25);
        } else if (i % 3 == 1) {
            d = ldexp((double)(s >> 11), (int)(s % 200) - 120);
        } else {
            memcpy(&d, &bits, 8);
            if (isnan(d) || isinf(d)) d = 1.0 / 3.0;
        }
        v[i] = d;
        fprintf(f, "%016llx\n", (unsigned long long)(memcpy(&bits, &d, 8), bits));
    }
    fclose(f);
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import struct,sys\nfor l in open('%s'):\n"
             " print(repr(struct.unpack('<d', bytes.fromhex(l.strip())[::-1])[0]))\"", path);
    size_t len = 0;
    char *out = run_capture(cmd, &len);
    remove(path);
    CHECK(out != NULL);
    if (!out) return;
    char *line = out;
    int bad = 0;
    for (int i = 0; i < N && line && *line; i++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char mine[32];
        ms_py_float_repr(v[i], mine);
        if (strcmp(mine, line) != 0 && bad++ < 5) fprintf(stderr, "  repr %s vs python %s\n", mine, line);
        line = nl ? nl + 1 : NULL;
    }
    CHECK(bad == 0);
    free(out);
}

TEST(malformed_requests_fail_with_messages) {
    const char *bad[] = {
        "", "[]", "{\"messages\": {}}", "{\"messages\": [[{\"role\": \"user\"}]]}",
        "{\"messages\": [], \"chat_template_kwargs\": 3}", "{\"messages\": [{\"role\": \"user\", "
        "\"content\": \"\\ud800\"}]}", "{\"messages\": [\"\xff\"]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": [1]}]}",
        "{\"messages\": [{\"role\": \"user\", \"name\": [1], \"content\": \"x\"}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *out = NULL;
        size_t olen;
        ms_err e = {0};
        int st = ms_xtml_render(bad[i], strlen(bad[i]), &out, &olen, &e);
        CHECK_MSG(st != MS_OK && e.msg[0] && !out, "case %zu", i);
    }
    /* nesting deeper than the bound is a clean error */
    ms_textbuf deep = {0};
    ms_textbuf_puts(&deep, "{\"messages\": ");
    for (int i = 0; i < 2000; i++) ms_textbuf_puts(&deep, "[");
    char *out = NULL;
    ms_err e = {0};
    CHECK(ms_xtml_render(deep.data, deep.len, &out, NULL, &e) == MS_ERR_LIMIT);
    ms_textbuf_free(&deep);
}

TEST_MAIN()
