/* test_nfc.c — the NFC normalizer against Unicode's own NormalizationTest.txt
 * (Debian's unicode-data), on every line whose characters were all assigned by
 * Unicode 9.0.0 (the data version of tokenizers' normalizer; see
 * tools/gen_unicode_nfc.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "test.h"
#include "text/tok_internal.h"
#include "util/fs.h"
#include "util/json.h"

#define UCD "/usr/share/unicode/"

static unsigned char *g_age_ok; /* [0x110000] 1 when assigned by 9.0 */

static void load_ages(void) {
    FILE *f = fopen(UCD "DerivedAge.txt", "r");
    CHECK_MSG(f != NULL, "%s (install unicode-data)", UCD "DerivedAge.txt");
    if (!f) return;
    g_age_ok = calloc(0x110000, 1);
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned lo, hi, maj, min;
        if (line[0] == '#' || line[0] == '\n') continue;
        int n = sscanf(line, "%x..%x ; %u.%u", &lo, &hi, &maj, &min);
        if (n != 4) {
            if (sscanf(line, "%x ; %u.%u", &lo, &maj, &min) != 3) continue;
            hi = lo;
        }
        if (maj < 9 || (maj == 9 && min == 0))
            for (unsigned c = lo; c <= hi && c < 0x110000; c++) g_age_ok[c] = 1;
    }
    fclose(f);
}

/* Parse "0044 0307" into UTF-8; returns 0 when a code point is newer than 9.0. */
static int field(const char *s, const char *end, ms_buf *out) {
    out->n = 0;
    while (s < end) {
        char *e;
        unsigned long c = strtoul(s, &e, 16);
        if (e == s) break;
        if (c >= 0x110000 || !g_age_ok[c]) return 0;
        uint8_t u[4];
        ms_buf_add(out, u, (size_t)ms_utf8_put((uint32_t)c, u));
        s = e;
        while (s < end && *s == ' ') s++;
    }
    ms_buf_add(out, "", 0);
    return 1;
}

static int nfc_is(const ms_buf *in, const ms_buf *want) {
    ms_buf o = {0};
    ms_nfc(in->p, in->n, &o);
    int ok = o.n == want->n && memcmp(o.p, want->p, o.n) == 0;
    /* the quick check never says "yes" to text that NFC changes */
    if (ms_nfc_quick_yes(in->p, in->n) && !(in->n == want->n && memcmp(in->p, want->p, in->n) == 0)) ok = 0;
    ms_buf_free(&o);
    return ok;
}

TEST(normalization_test_txt) {
    load_ages();
    if (!g_age_ok) return;
    FILE *f = popen("bzcat " UCD "NormalizationTest.txt.bz2", "r");
    CHECK(f != NULL);
    if (!f) return;
    char line[4096];
    int tested = 0, skipped = 0, bad = 0;
    ms_buf c[5] = {{0}};
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '@' || line[0] == '\n') continue;
        const char *p = line;
        int ok = 1;
        for (int k = 0; k < 5; k++) {
            const char *e = strchr(p, ';');
            if (!e) {
                ok = 0;
                break;
            }
            if (!field(p, e, &c[k])) ok = 0;
            p = e + 1;
        }
        if (!ok) {
            skipped++;
            continue;
        }
        tested++;
        /* c2 == NFC(c1) == NFC(c2) == NFC(c3); c4 == NFC(c4) == NFC(c5) */
        int good = nfc_is(&c[0], &c[1]) && nfc_is(&c[1], &c[1]) && nfc_is(&c[2], &c[1]) && nfc_is(&c[3], &c[3]) &&
                   nfc_is(&c[4], &c[3]);
        if (!good && bad++ < 10) CHECK_MSG(0, "NormalizationTest line: %.120s", line);
    }
    pclose(f);
    for (int k = 0; k < 5; k++) ms_buf_free(&c[k]);
    CHECK_MSG(bad == 0, "%d of %d lines wrong", bad, tested);
    CHECK_MSG(tested > 15000, "only %d lines tested (%d skipped)", tested, skipped);
    printf("NormalizationTest: %d lines tested, %d skipped (characters after Unicode 9.0)\n", tested, skipped);
    free(g_age_ok);
}

/* Random strings dense in what NFC changes (marks in every order, Hangul jamo,
 * kana with voiced marks, singletons, excluded composites) against Python's
 * unicodedata.normalize (Unicode 14.0; the pool holds only characters of 9.0,
 * whose normalization no later version changed). */
TEST(random_text_vs_python_unicodedata) {
    static const char *pool[] = {
        "a", "e", "o", "A", "u", " ", "x", "\xcc\x81", "\xcc\x80", "\xcc\x88", "\xcc\xa3", "\xcc\x87",
        "\xcc\x9b", "\xcd\x85", "\xce\xb1", "\xe1\xbe\xb3", "\xc3\xa9", "\xe1\x84\x80", "\xe1\x85\xa1",
        "\xe1\x86\xa8", "\xea\xb0\x80", "\xea\xb0\x81", "\xe3\x81\x8b", "\xe3\x82\x99", "\xe3\x81\x8c",
        "\xe3\x82\x9a", "\xe2\x84\xab", "\xe2\x84\xa6", "\xef\xac\x81", "\xe0\xa4\xa8", "\xe0\xa4\xbc",
        "\xe0\xa5\x98", "\xe0\xbd\xb1", "\xe0\xbd\xb2", "\xe0\xbd\xb3", "\xcd\x84", "\xef\xbc\xa1",
        "\xe4\xb8\xad", "\xd7\x90", "\xd6\xb7", "\xd6\xbc", "\xef\xac\xae", "\xe1\xb8\x8a", "\xc5\x89",
    };
    enum { N = 400 };
    char *texts[N];
    cJSON *arr = cJSON_CreateArray();
    srand(99);
    for (int i = 0; i < N; i++) {
        ms_buf b = {0};
        int len = 1 + rand() % 16;
        for (int k = 0; k < len; k++) {
            const char *p = pool[rand() % (int)(sizeof pool / sizeof *pool)];
            ms_buf_add(&b, p, strlen(p));
        }
        texts[i] = (char *)b.p;
        cJSON_AddItemToArray(arr, cJSON_CreateString(texts[i]));
    }
    char *req = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    ms_err err = {0};
    CHECK(ms_write_file_atomic("build/nfc_req.json", req, strlen(req), &err) == 0);
    free(req);
    FILE *f = popen("python3 -c 'import json,sys,unicodedata as u; "
                    "json.dump([u.normalize(\"NFC\", t) for t in json.load(open(\"build/nfc_req.json\"))], sys.stdout)'", "r");
    size_t cap = 1 << 20, n = 0;
    char *resp = malloc(cap);
    if (f) n = fread(resp, 1, cap, f);
    CHECK(f && pclose(f) == 0 && n < cap);
    cJSON *ref = NULL;
    CHECK(ms_json_parse(resp, n, "python NFC", &ref, &err) == 0);
    free(resp);
    int bad = 0;
    for (int i = 0; i < N && ref; i++) {
        const char *want = cJSON_GetArrayItem(ref, i)->valuestring;
        ms_buf o = {0};
        ms_nfc((const uint8_t *)texts[i], strlen(texts[i]), &o);
        if (o.n != strlen(want) || memcmp(o.p, want, o.n)) bad++;
        ms_buf_free(&o);
    }
    CHECK_MSG(bad == 0, "%d of %d random strings differ from unicodedata NFC", bad, N);
    cJSON_Delete(ref);
    for (int i = 0; i < N; i++) free(texts[i]);
}

TEST_MAIN()
