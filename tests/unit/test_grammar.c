/* test_grammar.c — the grammar engine (src/grammar):
 *   - JSON Schema features: valid documents are accepted (and pass a handwritten
 *     validator), invalid ones are refused; unsupported keywords name themselves
 *     and their JSON pointer;
 *   - the GBNF form, json_object, limits and errors;
 *   - masks on the real Qwen3 and gpt-oss vocabularies are exact: at points of
 *     random walks, every token's bit equals a brute-force byte-level check, and
 *     sampled allowed tokens really extend to a document that parses and validates;
 *   - 100 random walks over varied schemas (uniform among allowed tokens, the
 *     stand-in for a random-weight model) all end and parse and validate. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "test.h"
#include "util/fs.h"

#include "schema_check.h"

/* ---------------- helpers ---------------- */

static ms_grammar *schema(const char *js) {
    ms_err err = {0};
    ms_grammar *g = NULL;
    int rc = ms_grammar_from_schema(js, strlen(js), NULL, &g, &err);
    CHECK_MSG(rc == 0, "%s: %s", js, err.msg);
    return g;
}

/* A one-token-per-byte vocabulary (ids 0..255) plus a stop token 256. */
static ms_gvocab *byte_vocab(void) {
    static uint8_t b[256];
    const uint8_t *p[257];
    size_t l[257];
    for (int i = 0; i < 256; i++) b[i] = (uint8_t)i, p[i] = &b[i], l[i] = 1;
    p[256] = NULL, l[256] = 0;
    int32_t stop = 256;
    ms_gvocab *v = NULL;
    ms_err err = {0};
    int rc = ms_gvocab_new_raw(257, p, l, &stop, 1, &v, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    return v;
}
static ms_gvocab *g_bytes;

/* 1 when the whole text is a document of g. */
static int accepts(ms_grammar *g, const char *text) {
    if (!g_bytes) g_bytes = byte_vocab();
    ms_matcher *m = NULL;
    ms_err err = {0};
    if (ms_matcher_new(g, g_bytes, &m, &err)) return -1;
    int ok = ms_matcher_accept_bytes(m, (const uint8_t *)text, strlen(text), &err) == 0 && ms_matcher_done(m);
    ms_matcher_free(m);
    return ok;
}

typedef struct feature {
    const char *schema;
    const char *valid[8];
    const char *invalid[10];
} feature;

static const feature k_features[] = {
    {"{\"type\":\"string\"}", {"\"\"", "\"abc\"", "\"a\\\"b\\\\c\\n\"", "\"\\u00e9\\ud83d\\ude00\"", "\"日本語\""},
     {"", "abc", "\"abc", "\"a\nb\"", "\"\\x\"", "\"\\ud800\"", "\"\\udc00\"", "\"\xff\"", "\"\xe6\x97\"", "1"}},
    {"{\"type\":\"integer\"}", {"0", "-7", "1234567890"}, {"01", "-", "1.5", "1e3", "+1", "\"1\"", "-0a"}},
    {"{\"type\":\"number\"}", {"0", "-0.5", "3.25e-10", "1E+3", "42"}, {".5", "1.", "1e", "--1", "0x10", "Infinity"}},
    {"{\"type\":\"boolean\"}", {"true", "false"}, {"True", "1", "null", "tru"}},
    {"{\"type\":\"null\"}", {"null"}, {"nul", "None", "0"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}",
     {"{\"a\":1}", "{\"a\":1,\"b\":\"x\"}", "{ \"a\" : 1 , \"b\" : \"\" }", "{\n  \"a\": 2\n}"},
     {"{}", "{\"b\":\"x\"}", "{\"a\":\"1\"}", "{\"a\":1,}", "{\"a\":1,\"c\":2}", "{\"a\":1 \"b\":\"x\"}", "[\"a\"]"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"boolean\"}}",
     {"{}", "{\"a\":1}", "{\"a\":1,\"z\":true}", "{\"x\":false,\"y\":true}"},
     {"{\"z\":1}", "{\"a\":1,\"z\":null}"}},
    {"{\"type\":\"object\"}", {"{}", "{\"k\":[1,{\"x\":null}],\"j\":\"s\"}"}, {"[]", "{\"k\"}", "{1:2}"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
     {"[1]", "[1,2,3]", "[ 1 , 2 ]"}, {"[]", "[1,2,3,4]", "[1,]", "[\"a\"]", "[1 2]"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":5,\"maxItems\":6}",
     {"[\"a\",\"b\",\"c\",\"d\",\"e\"]", "[\"\",\"\",\"\",\"\",\"\",\"\"]"}, {"[\"a\",\"b\",\"c\",\"d\"]", "[\"\",\"\",\"\",\"\",\"\",\"\",\"\"]"}},
    {"{\"type\":\"array\"}", {"[]", "[1,\"a\",null,[true]]"}, {"[", "[,]"}},
    {"{\"enum\":[\"red\",\"green\",3,null,{\"a\":[1]}]}", {"\"red\"", "\"green\"", "3", "null", "{\"a\":[1]}"},
     {"\"blue\"", "\"re\"", "30", "{\"a\":[2]}"}},
    {"{\"const\":\"x\"}", {"\"x\""}, {"\"y\"", "\"xx\""}},
    {"{\"type\":\"string\",\"enum\":[\"a\",1,\"b\"]}", {"\"a\"", "\"b\""}, {"1"}},
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":2}]}", {"5", "\"ab\""}, {"\"abc\"", "true"}},
    {"{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]}", {"true", "null"}, {"0"}},
    {"{\"allOf\":[{\"type\":\"boolean\"}]}", {"false"}, {"0"}},
    {"{\"type\":[\"string\",\"null\"],\"maxLength\":3}", {"\"abc\"", "null"}, {"\"abcd\"", "1"}},
    {"{\"type\":\"integer\",\"nullable\":true}", {"1", "null"}, {"\"1\""}},
    {"{\"type\":\"integer\",\"minimum\":-12,\"maximum\":305}", {"-12", "-1", "0", "9", "10", "99", "300", "305"},
     {"-13", "-120", "306", "310", "999", "1000", "3050", "1.5", "01"}},
    {"{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}",
     {"9007199254740991", "-9007199254740991", "0", "123456789012"}, {"9007199254740992", "-9007199254740992", "10000000000000000"}},
    {"{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":100.5}", {"1", "42", "100"}, {"0", "-1", "101"}},
    {"{\"type\":\"integer\",\"minimum\":1000,\"maximum\":1009}", {"1000", "1009", "1005"}, {"999", "1010", "100"}},
    {"{\"type\":\"integer\",\"maximum\":-5}", {"-5", "-100", "-9223372036854775807"}, {"-4", "0", "5"}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", {"\"ab\"", "\"abc\"", "\"日本\"", "\"\\n\\t\""},
     {"\"a\"", "\"abcd\"", "\"日\""}},
    {"{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-29\"", "\"1999-12-31\""}, {"\"2024-13-01\"", "\"2024-1-01\"", "\"2024-00-10\""}},
    {"{\"type\":\"string\",\"format\":\"time\"}", {"\"23:59:59Z\"", "\"01:02:03.5+05:30\""}, {"\"24:00:00Z\"", "\"12:00:00\""}},
    {"{\"type\":\"string\",\"format\":\"date-time\"}", {"\"2024-05-06T07:08:09Z\""}, {"\"2024-05-06 07:08:09Z\""}},
    {"{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\""}, {"\"123e4567e89b12d3a456426614174000\""}},
    {"{\"type\":\"string\",\"format\":\"ipv4\"}", {"\"192.168.0.1\"", "\"0.0.0.0\"", "\"255.255.255.255\""},
     {"\"256.1.1.1\"", "\"01.1.1.1\"", "\"1.1.1\""}},
    {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"$ref\":\"#/$defs/n\"}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/n\"}",
     {"{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3}}}"}, {"{\"v\":1,\"next\":{}}", "{\"next\":{\"v\":1}}"}},
    {"{\"definitions\":{\"s\":{\"type\":\"string\"}},\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/s\"}}",
     {"[\"a\",\"b\"]"}, {"[1]"}},
    {"true", {"1", "\"s\"", "{\"a\":[]}"}, {"", "{"}},
    {"{}", {"null", "[{}]"}, {"]"}},
};

TEST(schema_features) {
    for (size_t i = 0; i < sizeof k_features / sizeof *k_features; i++) {
        const feature *f = &k_features[i];
        ms_grammar *g = schema(f->schema);
        if (!g) continue;
        cJSON *sj = cJSON_Parse(f->schema);
        for (int k = 0; k < 8 && f->valid[k]; k++) {
            CHECK_MSG(accepts(g, f->valid[k]) == 1, "schema %s should accept %s", f->schema, f->valid[k]);
            cJSON *d = cJSON_Parse(f->valid[k]);
            CHECK_MSG(d && validate(d, sj, sj), "validator disagrees: %s on %s", f->schema, f->valid[k]);
            cJSON_Delete(d);
        }
        for (int k = 0; k < 10 && f->invalid[k]; k++)
            CHECK_MSG(accepts(g, f->invalid[k]) == 0, "schema %s should refuse %s", f->schema, f->invalid[k]);
        cJSON_Delete(sj);
        ms_grammar_free(g);
    }
}

static void expect_error(const char *js, int code, const char *needle) {
    ms_err err = {0};
    ms_grammar *g = NULL;
    int rc = ms_grammar_from_schema(js, strlen(js), NULL, &g, &err);
    CHECK_MSG(rc == code, "%s: rc %d (%s), want %d", js, rc, err.msg, code);
    CHECK_MSG(strstr(err.msg, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", js, err.msg, needle);
    CHECK(g == NULL);
    ms_grammar_free(g);
}

TEST(schema_errors) {
    expect_error("{\"type\":\"object\",\"properties\":{\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]+$\"}}}",
                 MS_ERR_UNSUPPORTED, "\"pattern\" at /properties/zip/pattern");
    expect_error("{\"type\":\"number\",\"minimum\":3}", MS_ERR_UNSUPPORTED, "\"minimum\" on a number (integers only) at /minimum");
    expect_error("{\"type\":\"integer\",\"minimum\":3,\"maximum\":2}", MS_ERR_ARG, "no integer lies within the bounds");
    expect_error("{\"type\":\"integer\",\"exclusiveMinimum\":true}", MS_ERR_UNSUPPORTED, "exclusiveMinimum");
    expect_error("{\"items\":[{\"type\":\"string\"}],\"prefixItems\":[]}", MS_ERR_UNSUPPORTED, "prefixItems");
    expect_error("{\"anyOf\":[{\"type\":\"string\"},{\"not\":{}}]}", MS_ERR_UNSUPPORTED, "\"not\" at /anyOf/1/not");
    expect_error("{\"type\":\"string\",\"format\":\"email\"}", MS_ERR_UNSUPPORTED, "format \"email\" at /format");
    expect_error("{\"$ref\":\"http://x/s.json\"}", MS_ERR_UNSUPPORTED, "only local references");
    expect_error("{\"$ref\":\"#/$defs/missing\"}", MS_ERR_ARG, "does not resolve");
    expect_error("{\"type\":\"strin\"}", MS_ERR_ARG, "unknown type \"strin\" at /type");
    expect_error("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", MS_ERR_ARG, "minItems 3 > maxItems 2");
    expect_error("{\"type\":\"array\",\"maxItems\":100000}", MS_ERR_LIMIT, "max_repeat");
    expect_error("{\"type\":\"string\",\"enum\":[1,2]}", MS_ERR_ARG, "no enum value");
    expect_error("{\"allOf\":[{},{}]}", MS_ERR_UNSUPPORTED, "allOf");
    expect_error("{\"type\":\"object\",\"anyOf\":[{}]}", MS_ERR_UNSUPPORTED, "beside");
    expect_error("false", MS_ERR_ARG, "admits no value");
    expect_error("{\"properties\":{\"a\":false},\"required\":[\"a\"]}", MS_ERR_ARG, "admits no value");
    expect_error("{\"type\":", MS_ERR_FORMAT, "");
    expect_error("{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},\"$ref\":\"#/$defs/a\"}",
                 MS_ERR_ARG, "left recursion");
    /* a deep schema hits max_schema_depth */
    {
        char deep[4096] = "";
        for (int i = 0; i < 20; i++) strcat(deep, "{\"type\":\"array\",\"items\":");
        strcat(deep, "{}");
        for (int i = 0; i < 20; i++) strcat(deep, "}");
        ms_grammar_opts od = {.max_schema_depth = 10};
        ms_err e = {0};
        ms_grammar *gd = NULL;
        CHECK(ms_grammar_from_schema(deep, strlen(deep), &od, &gd, &e) == MS_ERR_LIMIT);
        CHECK_MSG(strstr(e.msg, "max_schema_depth") != NULL, "%s", e.msg);
    }
    /* a state blow-up is a clear limit */
    ms_grammar_opts o = {.max_states = 500};
    ms_err err = {0};
    ms_grammar *g = NULL;
    const char *big = "{\"type\":\"string\",\"maxLength\":400}";
    CHECK(ms_grammar_from_schema(big, strlen(big), &o, &g, &err) == MS_ERR_LIMIT);
    CHECK(strstr(err.msg, "max_states") != NULL);
}

TEST(json_object_and_value) {
    ms_err err = {0};
    ms_grammar *g = NULL;
    CHECK(ms_grammar_json(MS_GRAMMAR_JSON_OBJECT, NULL, &g, &err) == 0);
    CHECK(accepts(g, "{}") == 1);
    CHECK(accepts(g, "{\"a\": [1, 2.5e3, \"x\", {\"b\": null}], \"c\": true}") == 1);
    CHECK(accepts(g, "[1]") == 0);
    CHECK(accepts(g, "\"s\"") == 0);
    CHECK(accepts(g, "{\"a\" 1}") == 0);
    ms_grammar_free(g);
    CHECK(ms_grammar_json(MS_GRAMMAR_JSON_VALUE, NULL, &g, &err) == 0);
    CHECK(accepts(g, "[1, [[[]]]]") == 1);
    CHECK(accepts(g, "-0.0") == 1);
    CHECK(accepts(g, "[1,]") == 0);
    ms_grammar_free(g);
    /* ws_max: bounded whitespace */
    ms_grammar_opts o = {.ws_max = 2};
    CHECK(ms_grammar_json(MS_GRAMMAR_JSON_OBJECT, &o, &g, &err) == 0);
    CHECK(accepts(g, "{  }") == 1);
    CHECK(accepts(g, "{   }") == 0);
    ms_grammar_free(g);
    o.ws_max = -1;
    CHECK(ms_grammar_json(MS_GRAMMAR_JSON_OBJECT, &o, &g, &err) == 0);
    CHECK(accepts(g, "{\"a\":1}") == 1);
    CHECK(accepts(g, "{ \"a\":1}") == 0);
    ms_grammar_free(g);
}

static ms_grammar *gbnf(const char *t) {
    ms_err err = {0};
    ms_grammar *g = NULL;
    int rc = ms_grammar_from_gbnf(t, strlen(t), NULL, NULL, 0, NULL, &g, &err);
    CHECK_MSG(rc == 0, "%s: %s", t, err.msg);
    return g;
}

TEST(gbnf) {
    ms_grammar *g = gbnf("root ::= greeting \" \" name  # a comment\n"
                         "greeting ::= \"hello\" | \"hi\"\n"
                         "name ::= [A-Z] [a-z]* | \"world\"\n");
    if (g) {
        CHECK(accepts(g, "hello World") == 1);
        CHECK(accepts(g, "hi world") == 1);
        CHECK(accepts(g, "hi W") == 1);
        CHECK(accepts(g, "hi") == 0);
        CHECK(accepts(g, "hey World") == 0);
        ms_grammar_free(g);
    }
    g = gbnf("root ::= ( [^\"\\\\] | \"\\\\\" . ){2,3} \"\\n\"? x{0,} y+\nx ::= \"x\"\ny ::= \"\\u00e9\" | [\\u4e00-\\u9fff]");
    if (g) {
        CHECK(accepts(g, "ab\n\xc3\xa9") == 1);
        CHECK(accepts(g, "\\\"bxx\xe6\x97\xa5\xc3\xa9") == 1);
        CHECK(accepts(g, "a\xc3\xa9") == 0);         /* one char: too few */
        CHECK(accepts(g, "abcd\xc3\xa9") == 0);      /* four: too many */
        CHECK(accepts(g, "ab") == 0);
        ms_grammar_free(g);
    }
    /* recursion (balanced parentheses) */
    g = gbnf("root ::= p\np ::= \"(\" p* \")\"");
    if (g) {
        CHECK(accepts(g, "(()(()))") == 1);
        CHECK(accepts(g, "(()") == 0);
        CHECK(accepts(g, "())") == 0);
        ms_grammar_free(g);
    }
    /* a schema bound to a rule */
    const char *names[] = {"args"};
    const char *schemas[] = {"{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}"};
    const char *t = "root ::= \"<tool_call>\" args \"</tool_call>\"";
    ms_err err = {0};
    CHECK(ms_grammar_from_gbnf(t, strlen(t), names, schemas, 1, NULL, &g, &err) == 0);
    if (g) {
        CHECK(accepts(g, "<tool_call>{\"city\":\"Paris\"}</tool_call>") == 1);
        CHECK(accepts(g, "<tool_call>{}</tool_call>") == 0);
        ms_grammar_free(g);
    }
    struct {
        const char *text;
        int code;
        const char *needle;
    } bad[] = {
        {"root ::= foo", MS_ERR_ARG, "\"foo\" is used but never defined"},
        {"rot ::= \"a\"", MS_ERR_ARG, "no rule \"root\""},
        {"root ::= root \"a\" | \"b\"", MS_ERR_ARG, "left recursion"},
        {"root ::= a\na ::= b? a \"x\" | \"z\"\nb ::= \"y\"", MS_ERR_ARG, "left recursion"},
        {"root ::= \"abc", MS_ERR_FORMAT, "line 1"},
        {"root ::= [a-", MS_ERR_FORMAT, "unterminated"},
        {"root ::= \"a\"\n  ( \"b\"", MS_ERR_FORMAT, "line 2"},
        {"root ::= \"a\"{5,2}", MS_ERR_FORMAT, "n < m"},
        {"root ::= \"a\"{99999}", MS_ERR_LIMIT, "max_repeat"},
        {"root ::= \"a\"\nroot ::= \"b\"", MS_ERR_FORMAT, "defined twice"},
        {"root ::= x\nx ::= x \"a\" | \"b\"", MS_ERR_ARG, "left recursion"},
        {"root ::= x\nx ::= \"a\" x", MS_ERR_ARG, "derives no string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ms_err e = {0};
        ms_grammar *gg = NULL;
        int rc = ms_grammar_from_gbnf(bad[i].text, strlen(bad[i].text), NULL, NULL, 0, NULL, &gg, &e);
        CHECK_MSG(rc == bad[i].code && strstr(e.msg, bad[i].needle), "%s: rc %d msg \"%s\"", bad[i].text, rc, e.msg);
        ms_grammar_free(gg);
    }
}

/* Tokens split inside a UTF-8 character: a vocabulary whose tokens are byte
 * fragments of "日本" ("\xe6\x97\xa5\xe6\x9c\xac"). */
TEST(utf8_split_tokens) {
    const char *frags[] = {"\"", "\xe6", "\x97\xa5", "\xe6\x9c", "\xac\"", "\xe6\x97", "\xa5\xe6", "\xff", "\x9c\xac", "\xac"};
    int n = sizeof frags / sizeof *frags;
    const uint8_t *p[16];
    size_t l[16];
    for (int i = 0; i < n; i++) p[i] = (const uint8_t *)frags[i], l[i] = strlen(frags[i]);
    int32_t stop = n;
    p[n] = NULL, l[n] = 0;
    ms_gvocab *v = NULL;
    ms_err err = {0};
    CHECK(ms_gvocab_new_raw((uint32_t)n + 1, p, l, &stop, 1, &v, &err) == 0);
    ms_grammar *g = schema("{\"type\":\"string\",\"maxLength\":2}");
    ms_matcher *m = NULL;
    CHECK(ms_matcher_new(g, v, &m, &err) == 0);
    uint32_t bits[1];
    CHECK(ms_matcher_mask(m, bits, &err) == 0);
    CHECK(bits[0] == 1u); /* only the quote */
    CHECK(ms_matcher_accept(m, 0, &err) == 0);
    CHECK(ms_matcher_mask(m, bits, &err) == 0);
    /* the closing quote, or "\xe6", "\xe6\x9c", "\xe6\x97" that start a character; "\x97\xa5" etc. do
     * not; "\xff" never */
    CHECK_MSG(bits[0] == (1u | (1u << 1) | (1u << 3) | (1u << 5)), "mask %#x", bits[0]);
    CHECK(ms_matcher_accept(m, 5, &err) == 0); /* \xe6\x97 */
    CHECK(ms_matcher_mask(m, bits, &err) == 0);
    /* one continuation byte is missing: "\xac\"" (then closes), "\xa5\xe6" (then starts another
     * character), "\xac"; not "\x97\xa5" or "\x9c\xac" (a second continuation byte) */
    CHECK_MSG(bits[0] == ((1u << 4) | (1u << 6) | (1u << 9)), "mask %#x", bits[0]);
    CHECK(ms_matcher_accept(m, 6, &err) == 0);
    CHECK(ms_matcher_mask(m, bits, &err) == 0);
    /* 日 and a lead byte: two continuation bytes are missing: "\x97\xa5", "\x9c\xac", "\xac" */
    CHECK_MSG(bits[0] == ((1u << 2) | (1u << 8) | (1u << 9)), "mask %#x", bits[0]);
    CHECK(ms_matcher_accept(m, 8, &err) == 0);
    CHECK(ms_matcher_mask(m, bits, &err) == 0);
    CHECK_MSG(bits[0] == 1u, "mask %#x", bits[0]); /* two characters: only the closing quote */
    CHECK(ms_matcher_accept(m, 3, &err) == MS_ERR_ARG);
    CHECK(ms_matcher_accept(m, 0, &err) == 0);
    CHECK(ms_matcher_done(m) && ms_matcher_closed(m));
    CHECK(ms_matcher_mask(m, bits, &err) == 0);
    CHECK(bits[0] == (1u << n)); /* the stop token only */
    CHECK(ms_matcher_accept(m, n, &err) == 0);
    CHECK(ms_matcher_ended(m));
    CHECK(ms_matcher_mask(m, bits, &err) == 0 && bits[0] == 0);
    ms_matcher_free(m);
    ms_grammar_free(g);
    ms_gvocab_free(v);
}

/* ---------------- real vocabularies ---------------- */

typedef struct tk {
    ms_tokenizer *t;
    ms_gvocab *v;
    int32_t stop;
} tk;
static tk g_tk[2];
static const char *k_tok_names[2] = {"qwen3", "gptoss"};

static void cleanup(void);
static tk *load_tk(int i) {
    if (g_tk[i].v) return &g_tk[i];
    static int reg;
    if (!reg++) atexit(cleanup);
    char dir[256], cmd[2048], path[300];
    snprintf(dir, sizeof dir, "build/tokenizers/%s", k_tok_names[i]);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char cfg[300];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    if (!ms_file_exists(path) || !ms_file_exists(cfg)) {
        snprintf(cmd, sizeof cmd,
                 "mkdir -p %s && gzip -dc tests/data/tokenizers/%s/tokenizer.json.gz > %s.tmp.$$ && mv %s.tmp.$$ %s && "
                 "cp tests/data/tokenizers/%s/tokenizer_config.json %s/",
                 dir, k_tok_names[i], path, path, path, k_tok_names[i], dir);
        CHECK(system(cmd) == 0);
    }
    ms_err err = {0};
    CHECK_MSG(ms_tok_load_dir(dir, &g_tk[i].t, &err) == 0, "%s", err.msg);
    if (!g_tk[i].t) return NULL;
    g_tk[i].stop = ms_tok_eos_id(g_tk[i].t);
    CHECK(g_tk[i].stop >= 0);
    CHECK_MSG(ms_gvocab_new(g_tk[i].t, 0, &g_tk[i].stop, 1, &g_tk[i].v, &err) == 0, "%s", err.msg);
    return g_tk[i].v ? &g_tk[i] : NULL;
}

static int popcount_mask(const uint32_t *bits, size_t w) {
    int n = 0;
    for (size_t i = 0; i < w; i++) n += __builtin_popcount(bits[i]);
    return n;
}
static int32_t nth_bit(const uint32_t *bits, size_t w, int k) {
    for (size_t i = 0; i < w; i++) {
        int c = __builtin_popcount(bits[i]);
        if (k >= c) {
            k -= c;
            continue;
        }
        for (int b = 0; b < 32; b++)
            if (bits[i] >> b & 1 && !k--) return (int32_t)(i * 32 + b);
    }
    return -1;
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;
static void sb_add(sbuf *s, const void *b, size_t n) {
    if (s->n + n + 1 > s->cap) {
        s->cap = (s->n + n + 1) * 2;
        s->p = realloc(s->p, s->cap);
    }
    memcpy(s->p + s->n, b, n);
    s->n += n;
    s->p[s->n] = 0;
}

/* Finish the document greedily byte by byte (preferring closing bytes; a byte
 * chosen 64 times in a row is skipped, which breaks loops); 1 when done. */
static int complete(ms_matcher *m, sbuf *out) {
    static const char pref[] = "\"'}])=01enultrfas:, ";
    ms_err err = {0};
    int last = -1, run = 0;
    for (int k = 0; k < 20000; k++) {
        if (ms_matcher_done(m)) return 1;
        int moved = -1;
        for (const char *c = pref; *c && moved < 0; c++)
            if (!(*c == last && run >= 64) && ms_matcher_can_accept_bytes(m, (const uint8_t *)c, 1)) moved = *c;
        for (int c = 0x20; c < 0x7f && moved < 0; c++) {
            uint8_t b = (uint8_t)c;
            if (!(c == last && run >= 64) && ms_matcher_can_accept_bytes(m, &b, 1)) moved = c;
        }
        if (moved < 0) return 0;
        uint8_t b = (uint8_t)moved;
        ms_matcher_accept_bytes(m, &b, 1, &err);
        sb_add(out, &b, 1);
        run = moved == last ? run + 1 : 1;
        last = moved;
    }
    return 0;
}

static int g_walk_gbnf; /* the grammar under test is not JSON: only completion is checked */
static int doc_ok(const char *text, const cJSON *sj) {
    if (g_walk_gbnf) return 1;
    cJSON *d = cJSON_Parse(text);
    int ok = d && (!sj || validate(d, sj, sj));
    cJSON_Delete(d);
    return ok;
}

/* Every token's bit against the byte-level check; 0 mismatches expected. */
static int check_exact(ms_matcher *m, const tk *k, const uint32_t *bits) {
    uint32_t n = ms_gvocab_size(k->v);
    int bad = 0;
    for (uint32_t id = 0; id < n; id++) {
        size_t len = 0;
        const uint8_t *b = ms_tok_is_special(k->t, (int32_t)id) ? NULL : ms_tok_token_bytes(k->t, (int32_t)id, &len);
        int want;
        if ((int32_t)id == k->stop) want = ms_matcher_done(m);
        else want = b && len ? ms_matcher_can_accept_bytes(m, b, len) : 0;
        int got = bits[id >> 5] >> (id & 31) & 1;
        if (got != want) {
            if (bad < 3) fprintf(stderr, "  token %u (%.*s): mask %d, byte check %d\n", id, (int)len, b ? (const char *)b : "", got, want);
            bad++;
        }
    }
    return bad;
}

typedef struct walk_res {
    int ended, tokens, mismatches, extend_fail;
    double mask_s;
} walk_res;

/* One random walk: uniform among allowed tokens, at most budget tokens. With
 * exact_every > 0, every exact_every-th step checks the whole mask and that a few
 * allowed tokens extend to a valid document. */
static walk_res random_walk(ms_grammar *g, tk *k, const cJSON *sj, uint64_t seed, int budget, int exact_every,
                            sbuf *text) {
    walk_res r = {0};
    ms_err err = {0};
    ms_matcher *m = NULL;
    if (ms_matcher_new(g, k->v, &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return r;
    }
    size_t w = ms_gvocab_mask_words(k->v);
    uint32_t *bits = malloc(w * 4);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    text->n = 0;
    sb_add(text, "", 0);
    for (int step = 0; step < budget; step++) {
        if (ms_matcher_mask(m, bits, &err)) {
            CHECK_MSG(0, "mask: %s", err.msg);
            break;
        }
        int cnt = popcount_mask(bits, w);
        CHECK_MSG(cnt > 0, "empty mask at step %d after %s", step, text->p);
        if (!cnt) break;
        if (exact_every && step % exact_every == 0) {
            r.mismatches += check_exact(m, k, bits);
            for (int q = 0; q < 3; q++) {
                int32_t t = nth_bit(bits, w, (int)(ms_test_xorshift(&s) % (uint64_t)cnt));
                if (t == k->stop) continue;
                ms_matcher *c = NULL;
                CHECK(ms_matcher_clone(m, &c, &err) == 0);
                sbuf doc = {0};
                sb_add(&doc, text->p, text->n);
                size_t len;
                const uint8_t *b = ms_tok_token_bytes(k->t, t, &len);
                sb_add(&doc, b, len);
                int ok = ms_matcher_accept(c, t, &err) == 0 && complete(c, &doc) && doc_ok(doc.p, sj);
                if (!ok) {
                    r.extend_fail++;
                    fprintf(stderr, "  allowed token %d does not extend: %s\n", t, doc.p);
                }
                free(doc.p);
                ms_matcher_free(c);
            }
        }
        int32_t t = nth_bit(bits, w, (int)(ms_test_xorshift(&s) % (uint64_t)cnt));
        if (ms_matcher_accept(m, t, &err)) {
            CHECK_MSG(0, "accept of an allowed token %d failed: %s", t, err.msg);
            break;
        }
        r.tokens++;
        if (t == k->stop) {
            r.ended = 1;
            break;
        }
        size_t len;
        const uint8_t *b = ms_tok_token_bytes(k->t, t, &len);
        sb_add(text, b, len);
    }
    free(bits);
    ms_matcher_free(m);
    return r;
}

static const char *const k_walk_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":\"integer\"},"
    "\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":4}",
    "{\"enum\":[\"red\",\"green\",\"blue\",42,null,{\"a\":1},\"日本\"]}",
    "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":8},{\"type\":\"integer\"},{\"type\":\"null\"}]}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\","
    "\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":1}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}",
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"when\":{\"type\":\"string\","
    "\"format\":\"date-time\"},\"ip\":{\"type\":\"string\",\"format\":\"ipv4\"}},\"required\":[\"id\",\"when\",\"ip\"],"
    "\"additionalProperties\":false}",
    "{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":[\"array\",\"null\"],\"items\":{\"type\":\"string\","
    "\"maxLength\":5},\"maxItems\":3},\"score\":{\"type\":\"number\"}},\"required\":[\"tags\"]}",
    "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"point\"},\"xy\":{\"type\":\"array\",\"items\":"
    "{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":2}},\"required\":[\"kind\",\"xy\"]}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}",
    "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":4}},\"required\":[\"a\"]},"
    "{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}]}",
};
#define N_WALK_SCHEMAS (int)(sizeof k_walk_schemas / sizeof *k_walk_schemas)
/* schema 8 (any keys) is unbounded: its walks need not end within the budget */
static int walk_bounded(int si) { return si != 8; }

/* Masks are exact on both real vocabularies. */
TEST(mask_exact_real_vocabs) {
    for (int ti = 0; ti < 2; ti++) {
        tk *k = load_tk(ti);
        if (!k) continue;
        int checks = 0;
        for (int si = 0; si < N_WALK_SCHEMAS; si += (ti ? 3 : 1)) {
            ms_grammar *g = schema(k_walk_schemas[si]);
            if (!g) continue;
            cJSON *sj = cJSON_Parse(k_walk_schemas[si]);
            sbuf text = {0};
            walk_res r = random_walk(g, k, sj, 1000 + (uint64_t)si, 40, 13, &text);
            CHECK_MSG(r.mismatches == 0, "%s schema %d: %d mask bits differ from the byte check (text %s)",
                      k_tok_names[ti], si, r.mismatches, text.p);
            CHECK_MSG(r.extend_fail == 0, "%s schema %d: %d allowed tokens did not extend", k_tok_names[ti], si, r.extend_fail);
            checks += (r.tokens + 12) / 13;
            free(text.p);
            cJSON_Delete(sj);
            ms_grammar_free(g);
        }
        /* json_object and a GBNF grammar too */
        ms_err err = {0};
        ms_grammar *g = NULL;
        CHECK(ms_grammar_json(MS_GRAMMAR_JSON_OBJECT, NULL, &g, &err) == 0);
        sbuf text = {0};
        walk_res r = random_walk(g, k, NULL, 7, 30, 10, &text);
        CHECK_MSG(r.mismatches == 0 && r.extend_fail == 0, "%s json_object: %d mismatches, %d extension failures",
                  k_tok_names[ti], r.mismatches, r.extend_fail);
        ms_grammar_free(g);
        g = gbnf("root ::= \"call(\" arg (\", \" arg)* \")\"\narg ::= [a-z]+ \"=\" ([0-9]+ | \"'\" [^']* \"'\")");
        g_walk_gbnf = 1;
        r = random_walk(g, k, NULL, 8, 30, 10, &text);
        g_walk_gbnf = 0;
        CHECK_MSG(r.mismatches == 0 && r.extend_fail == 0, "%s gbnf: %d mismatches, %d extension failures",
                  k_tok_names[ti], r.mismatches, r.extend_fail);
        ms_grammar_free(g);
        free(text.p);
        CHECK(checks > 5);
    }
}

/* 100 random walks (Qwen3; every fourth schema also on gpt-oss) end, parse and validate. */
TEST(random_walks_parse_and_validate) {
    int total = 0, ok = 0, ended = 0;
    for (int ti = 0; ti < 2; ti++) {
        tk *k = load_tk(ti);
        if (!k) continue;
        for (int si = 0; si < N_WALK_SCHEMAS; si++) {
            if ((ti == 1 && si % 4) || !walk_bounded(si)) continue;
            ms_grammar *g = schema(k_walk_schemas[si]);
            if (!g) continue;
            cJSON *sj = cJSON_Parse(k_walk_schemas[si]);
            for (int rep = 0; rep < 10; rep++) {
                sbuf text = {0};
                walk_res r = random_walk(g, k, sj, (uint64_t)(si * 100 + rep + 1), 8000, 0, &text);
                total++;
                ended += r.ended;
                int good = r.ended && doc_ok(text.p, sj);
                ok += good;
                CHECK_MSG(good, "%s schema %d walk %d (ended %d, %d tokens): %s", k_tok_names[ti], si, rep, r.ended,
                          r.tokens, text.p);
                free(text.p);
            }
            cJSON_Delete(sj);
            ms_grammar_free(g);
        }
    }
    CHECK(total >= 100);
    printf("random walks: %d of %d ended, parsed and validated\n", ok, total);
}

/* Clone and reset are snapshots: a clone continues independently. */
TEST(clone_reset) {
    ms_grammar *g = schema("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}");
    if (!g_bytes) g_bytes = byte_vocab();
    ms_err err = {0};
    ms_matcher *m = NULL, *c = NULL;
    CHECK(ms_matcher_new(g, g_bytes, &m, &err) == 0);
    CHECK(ms_matcher_accept_bytes(m, (const uint8_t *)"[1,", 3, &err) == 0);
    CHECK(ms_matcher_clone(m, &c, &err) == 0);
    CHECK(ms_matcher_accept_bytes(m, (const uint8_t *)"2]", 2, &err) == 0 && ms_matcher_done(m));
    CHECK(!ms_matcher_done(c));
    CHECK(ms_matcher_accept_bytes(c, (const uint8_t *)"]", 1, &err) == MS_ERR_ARG); /* unchanged after a refusal */
    CHECK(ms_matcher_accept_bytes(c, (const uint8_t *)"33]", 3, &err) == 0 && ms_matcher_done(c));
    ms_matcher_reset(m);
    CHECK(!ms_matcher_done(m));
    CHECK(ms_matcher_accept_bytes(m, (const uint8_t *)"[]", 2, &err) == 0 && ms_matcher_done(m));
    CHECK(ms_matcher_accept(m, 256, &err) == 0 && ms_matcher_ended(m));
    CHECK(ms_matcher_accept(m, '1', &err) == MS_ERR_ARG);
    ms_matcher_free(m);
    ms_matcher_free(c);
    /* deep nesting is bounded by max_stack */
    ms_grammar_opts o = {.max_stack = 20};
    ms_grammar *gj = NULL;
    CHECK(ms_grammar_json(MS_GRAMMAR_JSON_VALUE, &o, &gj, &err) == 0);
    CHECK(ms_matcher_new(gj, g_bytes, &m, &err) == 0);
    char deep[64];
    memset(deep, '[', sizeof deep);
    CHECK(ms_matcher_accept_bytes(m, (const uint8_t *)deep, 5, &err) == 0);
    CHECK(ms_matcher_accept_bytes(m, (const uint8_t *)deep, sizeof deep, &err) == MS_ERR_ARG);
    ms_matcher_free(m);
    ms_grammar_free(gj);
    ms_grammar_free(g);
}

static int bit(const uint32_t *bits, int32_t id) { return (bits[id >> 5] >> (id & 31)) & 1; }

/* <[ID]> token references: special tokens (no text) as grammar symbols; a referenced stop
 * token is a symbol too (allowed where the grammar reads it, not where the document may end),
 * and a referenced text token is allowed only as the reference */
TEST(token_references) {
    /* ids: 0..9 "a".."j", 10 "<" , 11 "x>", 12 special, 13 special, 14 stop, 15 stop, 16 "<x>" */
    static const char *txt[17] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "<", "x>", NULL, NULL, NULL, NULL, "<x>"};
    const uint8_t *p[17];
    size_t l[17];
    for (int i = 0; i < 17; i++) p[i] = (const uint8_t *)txt[i], l[i] = txt[i] ? strlen(txt[i]) : 0;
    int32_t stops[2] = {14, 15};
    ms_gvocab *v = NULL;
    ms_err err = {0};
    CHECK(ms_gvocab_new_raw(17, p, l, stops, 2, &v, &err) == 0);
    ms_grammar *g = NULL;
    const char *gb = "root ::= <[12]> \"ab\" (<[13]> | \"<x>\") <[16]> <[15]>\n";
    CHECK_MSG(ms_grammar_from_gbnf(gb, strlen(gb), NULL, NULL, 0, NULL, &g, &err) == 0, "%s", err.msg);
    ms_matcher *m = NULL;
    CHECK(ms_matcher_new(g, v, &m, &err) == 0);
    uint32_t bits[1];
    CHECK(ms_matcher_mask(m, bits, &err) == 0);
    CHECK(bits[0] == (1u << 12));
    CHECK(ms_matcher_accept(m, 13, &err) == MS_ERR_ARG);
    CHECK(ms_matcher_accept(m, 12, &err) == 0);
    CHECK(ms_matcher_mask(m, bits, &err) == 0 && bits[0] == (1u << 0));
    CHECK(ms_matcher_accept(m, 0, &err) == 0 && ms_matcher_accept(m, 1, &err) == 0);
    /* either the special token 13 or the text "<x>" (as "<" + "x>"; token 16 is only the reference) */
    CHECK(ms_matcher_mask(m, bits, &err) == 0);
    CHECK(bit(bits, 13) && bit(bits, 10) && !bit(bits, 16) && !bit(bits, 11) && !bit(bits, 14) && !bit(bits, 15));
    ms_matcher *c = NULL;
    CHECK(ms_matcher_clone(m, &c, &err) == 0);
    CHECK(ms_matcher_accept(c, 16, &err) == MS_ERR_ARG);
    CHECK(ms_matcher_accept(c, 10, &err) == 0 && ms_matcher_accept(c, 11, &err) == 0);
    CHECK(ms_matcher_accept(m, 13, &err) == 0);
    for (int k = 0; k < 2; k++) {
        ms_matcher *x = k ? c : m;
        CHECK(ms_matcher_mask(x, bits, &err) == 0 && bits[0] == (1u << 16));
        CHECK(ms_matcher_accept(x, 16, &err) == 0);
        /* the stop token 15 is read as the grammar's symbol; 14 (a plain stop) is not allowed before the end */
        CHECK(ms_matcher_mask(x, bits, &err) == 0 && bits[0] == (1u << 15));
        CHECK(!ms_matcher_done(x));
        CHECK(ms_matcher_accept(x, 14, &err) == MS_ERR_ARG);
        CHECK(ms_matcher_accept(x, 15, &err) == 0);
        CHECK(ms_matcher_done(x) && ms_matcher_closed(x));
        /* the document is complete: now only the stop tokens the grammar does not reference */
        CHECK(ms_matcher_mask(x, bits, &err) == 0 && bits[0] == (1u << 14));
    }
    ms_matcher_free(m);
    ms_matcher_free(c);
    ms_grammar_free(g);
    /* syntax errors name the form */
    const char *bad[] = {"root ::= <[]>\n", "root ::= <[12]\n", "root ::= <[99999999999]>\n"};
    for (int i = 0; i < 3; i++) {
        ms_err e2 = {0};
        CHECK(ms_grammar_from_gbnf(bad[i], strlen(bad[i]), NULL, NULL, 0, NULL, &g, &e2) == MS_ERR_FORMAT);
        CHECK_MSG(strstr(e2.msg, "<[ID]>") != NULL, "%s", e2.msg);
    }
    ms_gvocab_free(v);
}

/* the grammar cache: a key finds the same grammar (one more reference), LRU eviction by count,
 * references outlive eviction */
TEST(grammar_cache) {
    ms_err err = {0};
    ms_grammar_cache *c = NULL;
    CHECK(ms_grammar_cache_new(2, 0, &c, &err) == 0);
    ms_grammar *g[3];
    const char *keys[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        CHECK(ms_grammar_json(MS_GRAMMAR_JSON_OBJECT, NULL, &g[i], &err) == 0);
        CHECK(ms_grammar_cache_get(c, keys[i], 1) == NULL);
        ms_grammar_cache_put(c, keys[i], 1, g[i]);
        if (i == 1) { /* touch "a": "b" is the least recently used when "c" comes */
            ms_grammar *x = ms_grammar_cache_get(c, "a", 1);
            CHECK(x == g[0]);
            ms_grammar_free(x);
        }
    }
    CHECK(ms_grammar_cache_size(c) == 2);
    CHECK(ms_grammar_cache_get(c, "b", 1) == NULL);
    ms_grammar *a = ms_grammar_cache_get(c, "a", 1), *cc = ms_grammar_cache_get(c, "c", 1);
    CHECK(a == g[0] && cc == g[2]);
    ms_grammar_cache_free(c); /* the references taken stay valid */
    for (int i = 0; i < 3; i++) ms_grammar_free(g[i]);
    CHECK(accepts(a, "{\"k\": 1}") && accepts(cc, "{}"));
    ms_grammar_free(a);
    ms_grammar_free(cc);
}

static void cleanup(void) {
    for (int i = 0; i < 2; i++) {
        ms_gvocab_free(g_tk[i].v);
        ms_tok_free(g_tk[i].t);
    }
    ms_gvocab_free(g_bytes);
}

TEST_MAIN()
