/* test_tok_split.c — the pre-tokenizer regexes run with PCRE2 (after
 * translation, tok_pretok.c) against Python's `regex` module on the same
 * patterns: the Split patterns of the three real tokenizer.json files, GPT-2's
 * ByteLevel pattern and Kimi's tiktoken pattern, over fixed and random text
 * mixing scripts, marks, digits, emoji and every kind of white space. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "text/tok_internal.h"
#include "text/tokenizer.h"
#include "util/fs.h"
#include "util/json.h"

static const char *k_pool[] = {
    "a", "Z", "q", "x", "7", "0", "42", " ", "  ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\xc2\x85", "\xc2\xa0",
    "\xe1\x9a\x80", "\xe2\x80\x80", "\xe2\x80\xa8", "\xe3\x80\x80", "\xe1\xa0\x8e", "\xe2\x80\x8b", "'", "'s", "'S",
    "'ll", "'LL", "'re", "\xe2\x80\x99", "\xc5\xbf", "!", "?", ".", ",", "-", "/", "#", "$", "(", ")", "\"", "_", "@",
    "\xc3\xa9", "e\xcc\x81", "\xcc\x88", "\xc3\x9c", "\xc3\x9f", "\xce\xa9", "\xce\xb4", "\xd0\x96", "\xd0\xb6",
    "\xe4\xb8\xad", "\xe6\x96\x87", "\xe6\x97\xa5", "\xe3\x81\xae", "\xe3\x83\x86", "\xe3\x80\x81", "\xe3\x80\x82",
    "\xe3\x80\x8c", "\xef\xbc\x8c", "\xea\xb0\x80", "\xd8\xb9", "\xd9\xa3", "\xe0\xa4\xb9", "\xe0\xa4\xbf", "\xe0\xb9\x84",
    "\xe0\xab\xa7", "\xe2\x85\xab", "\xc2\xbd", "\xc7\x85", "\xca\xb0", "\xef\xbd\x88", "\xf0\x9f\x98\x80",
    "\xf0\x9f\x91\x8d", "\xf0\x9f\x8f\xbd", "\xe2\x80\x8d", "\xef\xb8\x8f", "\xf0\x9f\x87\xab", "\xe2\x84\xab",
    "\xe3\x80\x85", "\xe4\xb9\x80", "\xf0\xa0\x80\x80", "\xe2\xba\x80", "\xe2\xbc\x80", "\xe3\x80\xa1",
};

static const char *k_fixed[] = {
    "Hello world", " Hello  world ", "I'm sure you'll see they've done it, can't we?", "HELLO WORLD'S",
    "1234567890 3.14159 1,000,000", "def f(x):\n    return x**2  # square\n", "\n\n\n\t\t  \n ",
    "日本語のテキストです。漢字とカタカナ", "中文分词测试，你好世界！", "emoji 😀👍🏽🇫🇷 family 👨‍👩‍👧",
    "URL https://example.com/a?b=c&d=e#f", "mixedCASEWordsAndNumbers123abc", "tabs\tand\nnewlines\r\nhere",
    "Ünïcödé ÀÉÎÕÜ ß ﬁ ẞ", "x\xe2\x80\x8by\xe2\x80\x8dz", "Ωmega Δelta πi", "don't DON'T Don'T",
};

static char *json_pattern(const char *name) {
    char path[256], *data;
    size_t len;
    ms_err err = {0};
    snprintf(path, sizeof path, "build/tokenizers/%s/tokenizer.json", name);
    if (!ms_file_exists(path)) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "mkdir -p build/tokenizers/%s && gzip -dc tests/data/tokenizers/%s/tokenizer.json.gz > %s.tmp && mv %s.tmp %s",
                 name, name, path, path, path);
        if (system(cmd)) return NULL;
    }
    if (ms_read_file(path, 1 << 30, &data, &len, &err)) return NULL;
    /* only the pre_tokenizer part is needed: parse the document once */
    cJSON *j = NULL;
    ms_json_parse(data, len, path, &j, &err);
    free(data);
    const cJSON *pre = cJSON_GetObjectItem(j, "pre_tokenizer");
    const cJSON *list = cJSON_GetObjectItem(pre, "pretokenizers"), *e;
    char *out = NULL;
    /* the last Split of the sequence is the main word pattern */
    cJSON_ArrayForEach(e, list) {
        const cJSON *re = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "pattern"), "Regex");
        if (cJSON_IsString(re)) {
            free(out);
            out = strdup(re->valuestring);
        }
    }
    cJSON_Delete(j);
    return out;
}

TEST(pcre2_translation_matches_python_regex) {
    const char *pats[8];
    int np = 0;
    char *owned[3] = {0};
    static const char *names[3] = {"deepseek_v3", "qwen3", "gptoss"};
    for (int i = 0; i < 3; i++) {
        owned[i] = json_pattern(names[i]);
        CHECK_MSG(owned[i] != NULL, "pattern of %s", names[i]);
        if (owned[i]) pats[np++] = owned[i];
    }
    pats[np++] = "\\p{N}{1,3}";
    pats[np++] = "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+";
    pats[np++] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
    pats[np++] = ms_tiktoken_pattern_kimi;
    /* texts: fixed + random mixes of the pool */
    enum { NRAND = 300 };
    char *texts[NRAND + 32];
    int nt = 0;
    for (size_t i = 0; i < sizeof k_fixed / sizeof *k_fixed; i++) texts[nt++] = strdup(k_fixed[i]);
    srand(77);
    for (int r = 0; r < NRAND; r++) {
        ms_buf b = {0};
        int len = 1 + rand() % 24;
        for (int k = 0; k < len; k++) {
            const char *p = k_pool[rand() % (int)(sizeof k_pool / sizeof *k_pool)];
            ms_buf_add(&b, p, strlen(p));
        }
        texts[nt++] = (char *)b.p;
    }
    cJSON *req = cJSON_CreateObject();
    cJSON *jp = cJSON_AddArrayToObject(req, "patterns"), *jt = cJSON_AddArrayToObject(req, "texts");
    for (int i = 0; i < np; i++) cJSON_AddItemToArray(jp, cJSON_CreateString(pats[i]));
    for (int i = 0; i < nt; i++) cJSON_AddItemToArray(jt, cJSON_CreateString(texts[i]));
    char *s = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    ms_err err = {0};
    CHECK(ms_write_file_atomic("build/tok_split_req.json", s, strlen(s), &err) == 0);
    free(s);
    FILE *f = popen("/usr/bin/python3 tests/unit/tok_split_ref.py < build/tok_split_req.json", "r"); /* Debian python3-regex */
    size_t cap = 1 << 20, n = 0;
    char *resp = malloc(cap);
    while (f && resp) {
        size_t r = fread(resp + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        resp = realloc(resp, cap *= 2);
    }
    int prc = f ? pclose(f) : -1;
    CHECK_MSG(prc == 0, "python3 tests/unit/tok_split_ref.py failed (needs python3-regex)");
    cJSON *ref = NULL;
    if (prc == 0 && ms_json_parse(resp, n, "reference", &ref, &err)) CHECK_MSG(0, "%s", err.msg);
    free(resp);
    int compared = 0, bad = 0;
    for (int p = 0; ref && p < np; p++) {
        ms_regex *re = NULL;
        int rc = ms_regex_compile(pats[p], strlen(pats[p]), 0, &re, &err);
        CHECK_MSG(rc == 0, "pattern %d: %s", p, err.msg);
        if (rc) continue;
        void *md = ms_regex_match_data(re);
        const cJSON *per = cJSON_GetArrayItem(ref, p);
        for (int t = 0; t < nt; t++) {
            const cJSON *want = cJSON_GetArrayItem(per, t), *m = want ? want->child : NULL;
            size_t pos = 0, a, b, len = strlen(texts[t]);
            int same = 1;
            while (ms_regex_next(re, (const uint8_t *)texts[t], len, pos, &a, &b, md, &err) == 1) {
                if (!m || (size_t)cJSON_GetArrayItem(m, 0)->valuedouble != a ||
                    (size_t)cJSON_GetArrayItem(m, 1)->valuedouble != b) {
                    same = 0;
                    break;
                }
                m = m->next;
                pos = b;
            }
            if (m) same = 0;
            compared++;
            if (!same && bad++ < 8) CHECK_MSG(0, "pattern %d differs from python regex on \"%s\"", p, texts[t]);
        }
        ms_regex_match_data_free(md);
        ms_regex_free(re);
    }
    CHECK_MSG(bad == 0, "%d of %d splits differ", bad, compared);
    CHECK(compared == np * nt);
    cJSON_Delete(ref);
    for (int i = 0; i < nt; i++) free(texts[i]);
    for (int i = 0; i < 3; i++) free(owned[i]);
}

TEST_MAIN()
