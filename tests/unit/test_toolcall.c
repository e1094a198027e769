/* test_toolcall.c — forced tool calls (tool_choice required / named) in every model family's
 * own syntax: the server's grammar (ms_api_constraint_grammar) over a real-size vocabulary,
 * walked at random (uniform among the allowed tokens: what a random-weight model does), the
 * ids decoded with their special tokens and given to the family's output parser
 * (src/text/outparse.c, itself tested against the official templates): every walk must end,
 * parse into tool calls of the forced function, and each call's arguments must validate
 * against its parameter schema (tests/unit/schema_check.h). Also response_format in the
 * harmony and XTML frames, and the refusals (a format without tool syntax; a GLM argument
 * whose type the syntax cannot carry).
 *
 * Vocabularies: the real DeepSeek V3 (its tool markers are added non-special tokens: text),
 * gpt-oss (harmony's markers are special tokens: token references) and Qwen3 tokenizers; for
 * Kimi K2, GLM and Kimi K3 the Qwen3 tokenizer with their markers added as special tokens. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_check.h"
#include "server/api.h"
#include "test.h"
#include "util/fs.h"

static const char *k_tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\",\"maxLength\":12},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]},"
    "\"days\":{\"type\":\"integer\"}},\"required\":[\"city\",\"unit\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"a\":{\"type\":\"number\"},\"b\":{\"type\":\"number\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\","
    "\"maxLength\":5},\"maxItems\":3},\"ok\":{\"type\":\"boolean\"},\"when\":{\"type\":\"string\",\"format\":\"date\"}},"
    "\"required\":[\"a\",\"b\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"nested\",\"parameters\":{\"type\":\"object\","
    "\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]}},"
    "\"properties\":{\"p\":{\"$ref\":\"#/$defs/pt\"},\"q\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"null\"}]}},"
    "\"required\":[\"p\"]}}}]";
static const char *k_names[] = {"get_weather", "add", "ping", "nested"};

/* ---------------- tokenizers ---------------- */

static const char *k_markers[] = {
    /* Kimi K2 */
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    /* GLM (its <tool_call> / </tool_call> are Qwen3's plain-text ones here) */
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    /* Kimi K3 XTML */
    "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};

static void unpack(const char *name, const char *dir) {
    char path[300], cfg[300], cmd[2048];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    if (ms_file_exists(path) && ms_file_exists(cfg)) return;
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && gzip -dc tests/data/tokenizers/%s/tokenizer.json.gz > %s.tmp.$$ && mv %s.tmp.$$ %s && "
             "cp tests/data/tokenizers/%s/tokenizer_config.json %s/",
             dir, name, path, path, path, name, dir);
    CHECK(system(cmd) == 0);
}

/* build/tokenizers/qwen3_markers: Qwen3's tokenizer.json with k_markers added as special tokens */
static void make_marker_tokenizer(void) {
    const char *dir = "build/tokenizers/qwen3_markers";
    unpack("qwen3", "build/tokenizers/qwen3");
    char path[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (ms_file_exists(path)) return;
    char *buf = NULL;
    size_t len = 0;
    ms_err err = {0};
    CHECK(ms_read_file("build/tokenizers/qwen3/tokenizer.json", (size_t)1 << 30, &buf, &len, &err) == 0);
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    CHECK(j != NULL);
    cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    int next = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, added) {
        int id = cJSON_GetObjectItemCaseSensitive(a, "id")->valueint;
        if (id >= next) next = id + 1;
    }
    for (size_t i = 0; i < sizeof k_markers / sizeof *k_markers; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", next++);
        cJSON_AddStringToObject(t, "content", k_markers[i]);
        cJSON_AddBoolToObject(t, "single_word", 0);
        cJSON_AddBoolToObject(t, "lstrip", 0);
        cJSON_AddBoolToObject(t, "rstrip", 0);
        cJSON_AddBoolToObject(t, "normalized", 0);
        cJSON_AddBoolToObject(t, "special", 1);
        cJSON_AddItemToArray(added, t);
    }
    char *out = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp build/tokenizers/qwen3/tokenizer_config.json %s/", dir, dir);
    CHECK(system(cmd) == 0);
    CHECK(ms_write_file_atomic(path, out, strlen(out), &err) == 0);
    free(out);
}

typedef struct fam {
    ms_outfmt fmt;
    const char *tok; /* directory under build/tokenizers */
    int in_reasoning;
    const char *stop[2]; /* the generation's stop tokens */
} fam;

static const fam k_fams[] = {
    {MS_OUTFMT_QWEN3, "qwen3", 0, {"<|im_end|>", "<|endoftext|>"}},
    {MS_OUTFMT_DEEPSEEK_V3, "deepseek_v3", 0, {"<｜end▁of▁sentence｜>", NULL}},
    {MS_OUTFMT_DEEPSEEK_V31, "deepseek_v3", 0, {"<｜end▁of▁sentence｜>", NULL}},
    {MS_OUTFMT_KIMI_K2, "qwen3_markers", 0, {"<|im_end|>", NULL}},
    {MS_OUTFMT_GLM, "qwen3_markers", 0, {"<|endoftext|>", NULL}},
    {MS_OUTFMT_HARMONY, "gptoss", 0, {"<|return|>", "<|call|>"}},
    {MS_OUTFMT_XTML, "qwen3_markers", 1, {"<|end_of_msg|>", NULL}},
    {MS_OUTFMT_XTML, "qwen3_markers", 0, {"<|end_of_msg|>", NULL}},
};
#define N_FAMS ((int)(sizeof k_fams / sizeof *k_fams))

typedef struct loaded {
    ms_tokenizer *t;
    ms_gvocab *v;
    int32_t stop[2];
    int nstop;
} loaded;

static void load(const fam *f, loaded *L) {
    memset(L, 0, sizeof *L);
    char dir[256];
    snprintf(dir, sizeof dir, "build/tokenizers/%s", f->tok);
    if (!strcmp(f->tok, "qwen3_markers")) make_marker_tokenizer();
    else unpack(!strcmp(f->tok, "gptoss") ? "gptoss" : f->tok, dir);
    ms_err err = {0};
    CHECK_MSG(ms_tok_load_dir(dir, &L->t, &err) == 0, "%s", err.msg);
    if (!L->t) return;
    for (int i = 0; i < 2 && f->stop[i]; i++) {
        int32_t id = ms_tok_token_id(L->t, f->stop[i]);
        CHECK_MSG(id >= 0, "%s: no stop token %s", f->tok, f->stop[i]);
        L->stop[L->nstop++] = id;
    }
    CHECK_MSG(ms_gvocab_new(L->t, 0, L->stop, (size_t)L->nstop, &L->v, &err) == 0, "%s", err.msg);
}

static void unload(loaded *L) {
    ms_gvocab_free(L->v);
    ms_tok_free(L->t);
}

/* ---------------- walks ---------------- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

/* Walk g from its start to its end with uniform choices; the ids in *ids (malloc'd). 1 when it ended. */
static int walk(ms_grammar *g, const loaded *L, int32_t **ids, int *n, int cap) {
    ms_err err = {0};
    ms_matcher *m = NULL;
    *ids = malloc((size_t)cap * sizeof **ids);
    *n = 0;
    CHECK_MSG(ms_matcher_new(g, L->v, &m, &err) == 0, "%s", err.msg);
    if (!m) return 0;
    size_t words = ms_gvocab_mask_words(L->v);
    uint32_t *bits = malloc(words * 4);
    int ended = 0;
    while (*n < cap) {
        if (ms_matcher_mask(m, bits, &err)) { CHECK_MSG(0, "mask: %s", err.msg); break; }
        int cnt = 0;
        for (size_t i = 0; i < words; i++) cnt += __builtin_popcount(bits[i]);
        if (!cnt) break;
        int k = (int)(rnd() % (uint32_t)cnt);
        int32_t id = -1;
        for (size_t i = 0; i < words && id < 0; i++) {
            int c = __builtin_popcount(bits[i]);
            if (k >= c) { k -= c; continue; }
            for (int b = 0; b < 32; b++)
                if ((bits[i] >> b) & 1 && !k--) { id = (int32_t)(i * 32 + b); break; }
        }
        CHECK(ms_matcher_accept(m, id, &err) == 0);
        int is_stop = 0;
        for (int s = 0; s < L->nstop; s++) is_stop |= L->stop[s] == id;
        (*ids)[(*n)++] = id;
        if (ms_matcher_ended(m) || ms_matcher_closed(m)) { ended = 1; break; }
        (void)is_stop;
    }
    free(bits);
    ms_matcher_free(m);
    return ended;
}

static int build(const char *body, ms_outfmt fmt, const loaded *L, int in_reasoning, ms_grammar **g, const char **lead,
                 ms_api_error *e) {
    ms_api_request req;
    memset(e, 0, sizeof *e);
    int rc = ms_api_parse_request(MS_API_CHAT, body, strlen(body), ms_tok_vocab_size(L->t), &req, e);
    CHECK_MSG(rc == 0, "request: %s", e->message);
    if (rc) return rc;
    rc = ms_api_constraint_grammar(&req, fmt, L->t, in_reasoning, g, lead, e);
    ms_api_request_free(&req);
    return rc;
}

static const cJSON *tool_schema(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, name))
            return cJSON_GetObjectItemCaseSensitive(f, "parameters");
    }
    return NULL;
}

/* Walk, decode, parse, validate: 1 when the calls are right. forced: the one name allowed (NULL: any). */
static int one_case(const fam *f, const loaded *L, const char *choice, const char *forced, int parallel, int seed,
                    const cJSON *tools, int *ncalls) {
    char body[8192];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":%s,\"tool_choice\":%s,\"parallel_tool_calls\":%s}",
             k_tools, choice, parallel ? "true" : "false");
    ms_grammar *g = NULL;
    const char *lead = NULL;
    ms_api_error e;
    if (build(body, f->fmt, L, f->in_reasoning, &g, &lead, &e)) return 0;
    g_rng = 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed * 0x100000001B3ull + (uint64_t)f->fmt * 7919u);
    int32_t *ids = NULL;
    int n = 0, ok = 0;
    int ended = walk(g, L, &ids, &n, 6000);
    CHECK_MSG(ended, "%s %s seed %d: the walk did not end in %d tokens", ms_outfmt_name(f->fmt), choice, seed, n);
    /* the generation drops a final stop token that the grammar does not read itself */
    int keep = n;
    {
        for (int s = 0; s < L->nstop; s++)
            if (ids[keep - 1] == L->stop[s] && !(f->fmt == MS_OUTFMT_HARMONY && s == 1)) { keep--; break; }
    }
    char *text = NULL;
    size_t tl = 0;
    ms_err err = {0};
    CHECK(ms_tok_decode(L->t, ids, (size_t)keep, 0, &text, &tl, &err) == 0);
    ms_outparse_opts po = {.start_in_reasoning = f->in_reasoning, .tools_json = k_tools, .id_seed = 1};
    char *js = NULL;
    CHECK_MSG(ms_outparse_all(f->fmt, &po, text, tl, &js, &err) == 0, "%s", err.msg);
    cJSON *msg = js ? cJSON_Parse(js) : NULL;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    *ncalls = cJSON_GetArraySize(calls);
    ok = ended && *ncalls >= 1 && (parallel || *ncalls == 1);
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
        const char *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments")->valuestring;
        if (forced && strcmp(name, forced)) ok = 0;
        const cJSON *ps = tool_schema(tools, name);
        cJSON *av = cJSON_Parse(args);
        cJSON *empty = cJSON_Parse("{\"type\":\"object\",\"properties\":{}}");
        const cJSON *sch = ps ? ps : empty;
        if (!ps && !tool_schema(tools, name) && strcmp(name, "ping")) ok = 0;
        if (!av || !validate(av, sch, sch)) ok = 0;
        cJSON_Delete(av);
        cJSON_Delete(empty);
    }
    /* content around the calls: none (the grammar is all frame) */
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (cJSON_IsString(content) && content->valuestring[strspn(content->valuestring, " \n")]) ok = 0;
    if (!ok || (getenv("TOOLCALL_SHOW") && seed % 3 == 0)) fprintf(stderr, "  %s %s seed %d: %d calls from\n    %.*s\n  parsed %s\n", ms_outfmt_name(f->fmt), choice, seed, *ncalls,
                     (int)(tl > 3000 ? 3000 : tl), text, js ? js : "(none)");
    cJSON_Delete(msg);
    free(js);
    free(text);
    free(ids);
    ms_grammar_free(g);
    return ok;
}

TEST(forced_calls_every_family) {
    cJSON *tools = cJSON_Parse(k_tools);
    CHECK(tools != NULL);
    for (int fi = 0; fi < N_FAMS; fi++) {
        const fam *f = &k_fams[fi];
        loaded L;
        load(f, &L);
        if (!L.v) continue;
        int good = 0, total = 0, multi = 0;
        for (int k = 0; k < 4; k++) {
            char choice[128];
            snprintf(choice, sizeof choice, "{\"type\":\"function\",\"function\":{\"name\":\"%s\"}}", k_names[k]);
            for (int seed = 0; seed < 3; seed++) {
                int nc = 0;
                good += one_case(f, &L, choice, k_names[k], 1, seed, tools, &nc);
                total++;
            }
        }
        for (int seed = 0; seed < 6; seed++) {
            int nc = 0;
            good += one_case(f, &L, "\"required\"", NULL, seed & 1, 100 + seed, tools, &nc);
            total++;
            multi += nc > 1;
        }
        CHECK_MSG(good == total, "%s: %d of %d forced calls parsed and validated", ms_outfmt_name(f->fmt), good, total);
        printf("  %s%s: %d of %d forced calls parsed and validated (%d walks with several calls)\n", ms_outfmt_name(f->fmt),
               f->in_reasoning ? " (from reasoning)" : "", good, total, multi);
        unload(&L);
    }
    cJSON_Delete(tools);
}

/* GLM: an argument that may be a string without being declared one is refused by name (the
 * syntax tells strings from JSON by the declared type); THINK has no tool syntax; an
 * unsupported keyword inside a tool's parameters is named with its pointer */
TEST(refusals) {
    loaded L;
    load(&k_fams[4], &L);
    if (!L.v) return;
    ms_grammar *g = NULL;
    const char *lead;
    ms_api_error e;
    char body[8192];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"m\","
             "\"parameters\":{\"type\":\"object\",\"properties\":{\"v\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}}}}}],"
             "\"tool_choice\":\"required\"}");
    CHECK(build(body, MS_OUTFMT_GLM, &L, 0, &g, &lead, &e) != 0);
    CHECK_MSG(e.status == 400 && strstr(e.message, "'v' of 'm'") && strstr(e.message, "GLM"), "%s", e.message);
    ms_grammar_free(g), g = NULL;
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":%s,\"tool_choice\":\"required\"}", k_tools);
    CHECK(build(body, MS_OUTFMT_THINK, &L, 0, &g, &lead, &e) != 0);
    CHECK_MSG(e.status == 400 && strstr(e.message, "think"), "%s", e.message);
    /* an unsupported keyword inside a tool's parameters: named with its pointer */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"z\","
             "\"parameters\":{\"type\":\"object\",\"properties\":{\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]+$\"}}}}}],"
             "\"tool_choice\":\"required\"}");
    CHECK(build(body, MS_OUTFMT_GLM, &L, 0, &g, &lead, &e) != 0);
    CHECK_MSG(e.status == 400 && strstr(e.message, "/properties/zip/pattern"), "%s", e.message);
    unload(&L);
}

/* response_format inside harmony's final channel and XTML's response element: the parser
 * returns the document as the content, and it validates */
TEST(framed_response_format) {
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
                         "\"n\":{\"type\":\"integer\"}},\"required\":[\"name\",\"n\"]}";
    cJSON *sj = cJSON_Parse(schema);
    const int which[] = {5, 6, 7, 0};
    for (int w = 0; w < 4; w++) {
        const fam *f = &k_fams[which[w]];
        loaded L;
        load(f, &L);
        if (!L.v) continue;
        int good = 0;
        for (int seed = 0; seed < 4; seed++) {
            char body[2048];
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":\"json_schema\","
                     "\"json_schema\":{\"name\":\"x\",\"schema\":%s}}}",
                     schema);
            ms_grammar *g = NULL;
            const char *lead = NULL;
            ms_api_error e;
            if (build(body, f->fmt, &L, f->in_reasoning, &g, &lead, &e)) continue;
            g_rng = 77 + (uint64_t)seed * 1315423911u;
            int32_t *ids = NULL;
            int n = 0;
            int ended = walk(g, &L, &ids, &n, 4000);
            int keep = n;
            for (int s = 0; s < L.nstop && keep; s++)
                if (ids[keep - 1] == L.stop[s]) { keep--; break; }
            char *text = NULL, *js = NULL;
            size_t tl = 0;
            ms_err err = {0};
            CHECK(ms_tok_decode(L.t, ids, (size_t)keep, 0, &text, &tl, &err) == 0);
            ms_outparse_opts po = {.start_in_reasoning = f->in_reasoning, .id_seed = 1};
            CHECK(ms_outparse_all(f->fmt, &po, text, tl, &js, &err) == 0);
            cJSON *msg = js ? cJSON_Parse(js) : NULL;
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
            cJSON *doc = cJSON_IsString(content) ? cJSON_Parse(content->valuestring) : NULL;
            int ok = ended && doc && validate(doc, sj, sj) && !cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
            if (!ok) fprintf(stderr, "  %s: %.*s\n  parsed %s\n", ms_outfmt_name(f->fmt), (int)tl, text, js ? js : "");
            good += ok;
            cJSON_Delete(doc);
            cJSON_Delete(msg);
            free(js), free(text), free(ids);
            ms_grammar_free(g);
        }
        CHECK_MSG(good == 4, "%s: %d of 4 framed documents parsed and validated", ms_outfmt_name(f->fmt), good);
        unload(&L);
    }
    cJSON_Delete(sj);
}

TEST_MAIN()
