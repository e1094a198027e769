/* test_constrain.c — constrained decoding in the generation loop (ms_gen_params.constraint):
 * a random-weight model (the qwen3_moe fixture, 512 logits) with the real Qwen3 tokenizer
 * samples under a JSON Schema; every output parses and validates, with ms_generate and in
 * the slot scheduler's batched steps (each slot its own matcher). Forced prefix/suffix ids
 * frame the grammar's text; max_tokens cuts a document (finish length). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "session/slots.h"
#include "test.h"
#include "util/fs.h"

static const char *k_schema =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":6},"
    "\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",\"c\"]},\"maxItems\":3},"
    "\"ok\":{\"type\":\"boolean\"},"
    "\"kind\":{\"enum\":[\"x\",\"y\",null]}},"
    "\"required\":[\"name\",\"age\",\"tags\",\"ok\"]}";

static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* 1 when text is a JSON document valid against k_schema */
static int valid(const char *text, char *why, size_t wn) {
    cJSON *j = cJSON_Parse(text);
    int ok = 0;
    if (!j || !cJSON_IsObject(j)) { snprintf(why, wn, "not an object"); goto out; }
    const char *req[] = {"name", "age", "tags", "ok"};
    for (int i = 0; i < 4; i++)
        if (!cJSON_GetObjectItemCaseSensitive(j, req[i])) { snprintf(why, wn, "missing %s", req[i]); goto out; }
    const cJSON *x;
    cJSON_ArrayForEach(x, j) {
        const char *k = x->string;
        if (!strcmp(k, "name")) {
            if (!cJSON_IsString(x) || utf8_chars(x->valuestring) > 6) { snprintf(why, wn, "bad name"); goto out; }
        } else if (!strcmp(k, "age")) {
            if (!cJSON_IsNumber(x) || x->valuedouble != (double)(long long)x->valuedouble) {
                if (!(cJSON_IsNumber(x) && x->valuedouble > 9e15)) { snprintf(why, wn, "bad age"); goto out; }
            }
        } else if (!strcmp(k, "tags")) {
            if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) > 3) { snprintf(why, wn, "bad tags"); goto out; }
            const cJSON *t;
            cJSON_ArrayForEach(t, x) if (!cJSON_IsString(t) || strlen(t->valuestring) != 1 || !strchr("abc", t->valuestring[0])) {
                snprintf(why, wn, "bad tag");
                goto out;
            }
        } else if (!strcmp(k, "ok")) {
            if (!cJSON_IsBool(x)) { snprintf(why, wn, "bad ok"); goto out; }
        } else if (!strcmp(k, "kind")) {
            if (!cJSON_IsNull(x) && !(cJSON_IsString(x) && (!strcmp(x->valuestring, "x") || !strcmp(x->valuestring, "y")))) {
                snprintf(why, wn, "bad kind");
                goto out;
            }
        } else {
            snprintf(why, wn, "extra key %s", k);
            goto out;
        }
    }
    ok = 1;
out:
    cJSON_Delete(j);
    return ok;
}

typedef struct {
    char text[8192];
    size_t n;
    int32_t ids[1024];
    int n_ids, done, rc;
    ms_gen_result res;
} out_t;

static int on_tok(void *user, int32_t id, const char *text, size_t len) {
    out_t *o = user;
    if (id >= 0 && o->n_ids < 1024) o->ids[o->n_ids++] = id;
    if (o->n + len < sizeof o->text) {
        memcpy(o->text + o->n, text, len);
        o->n += len;
        o->text[o->n] = 0;
    }
    return 0;
}

static void on_done(void *user, int rc, const ms_gen_result *res, const ms_err *err) {
    out_t *o = user;
    (void)err;
    o->done++;
    o->rc = rc;
    o->res = *res;
}

static ms_tokenizer *load_qwen3(void) {
    const char *dir = "build/tokenizers/qwen3";
    if (!ms_file_exists("build/tokenizers/qwen3/tokenizer.json") ||
        !ms_file_exists("build/tokenizers/qwen3/tokenizer_config.json")) {
        CHECK(system("mkdir -p build/tokenizers/qwen3 && gzip -dc tests/data/tokenizers/qwen3/tokenizer.json.gz > "
                     "build/tokenizers/qwen3/tokenizer.json.tmp.c && mv build/tokenizers/qwen3/tokenizer.json.tmp.c "
                     "build/tokenizers/qwen3/tokenizer.json && cp tests/data/tokenizers/qwen3/tokenizer_config.json "
                     "build/tokenizers/qwen3/") == 0);
    }
    ms_tokenizer *t = NULL;
    ms_err err = {0};
    CHECK_MSG(ms_tok_load_dir(dir, &t, &err) == 0, "%s", err.msg);
    return t;
}

#define NGEN 20

TEST(constrained_json_schema) {
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(MS_TEST_FIXTURES "qwen3_moe", &m, &err)) { CHECK_MSG(0, "%s", err.msg); return; }
    ms_tokenizer *t = load_qwen3();
    if (!t) { ms_model_free(&m); return; }
    int64_t V = m.cfg.vocab;
    int32_t eos = (int32_t)(V - 1); /* a stand-in stop id inside the fixture's 512 logits */
    ms_gvocab *gv = NULL;
    CHECK_MSG(ms_gvocab_new(t, (uint32_t)V, &eos, 1, &gv, &err) == 0, "%s", err.msg);
    ms_grammar *gr = NULL;
    ms_grammar_opts go = {.ws_max = 2};
    CHECK_MSG(ms_grammar_from_schema(k_schema, strlen(k_schema), &go, &gr, &err) == 0, "%s", err.msg);
    if (!gv || !gr) goto done;
    ms_gen_constraint c = {.grammar = gr, .vocab = gv};
    ms_gen_params p;
    memset(&p, 0, sizeof p);
    ms_sampler_defaults(&p.sampling);
    p.max_tokens = 800;
    p.eos_ids = &eos;
    p.n_eos = 1;
    p.constraint = &c;
    int32_t prompt[4] = {1, 2, 3, 4};
    /* one at a time: ms_generate */
    ms_engine *e;
    ms_generator *g;
    ms_engine_opts eo = {.max_ctx = 1024};
    CHECK(ms_engine_create(&m, &eo, &e, &err) == 0);
    CHECK(ms_generator_new(e, t, V, NULL, &g, &err) == 0);
    static out_t o[NGEN];
    int n_valid = 0, n_eos = 0;
    for (int i = 0; i < NGEN; i++) {
        memset(&o[i], 0, sizeof o[i]);
        p.sampling.seed = 1000 + (uint64_t)i;
        p.sampling.temperature = i % 4 == 3 ? 0 : 1.0 + 0.25 * (i % 3);
        CHECK_MSG(ms_generate(g, prompt, 4, &p, on_tok, &o[i], &o[i].res, &err) == 0, "gen %d: %s", i, err.msg);
        char why[128] = "";
        int ok = o[i].res.finish == MS_FINISH_STOP && valid(o[i].text, why, sizeof why);
        CHECK_MSG(ok, "gen %d (finish %s, %d tokens): %s: %s", i, ms_finish_name(o[i].res.finish),
                  o[i].res.completion_tokens, why, o[i].text);
        n_valid += ok;
        n_eos += o[i].n_ids > 0 && o[i].ids[o[i].n_ids - 1] == eos;
    }
    printf("constrained: %d/%d valid (%d ended by the stop id), e.g. %s\n", n_valid, NGEN, n_eos, o[0].text);
    /* a length limit ends a document early: finish length, a prefix of a valid document */
    {
        out_t ol;
        memset(&ol, 0, sizeof ol);
        ms_gen_params pl = p;
        pl.max_tokens = 3;
        CHECK(ms_generate(g, prompt, 4, &pl, on_tok, &ol, &ol.res, &err) == 0);
        CHECK(ol.res.finish == MS_FINISH_LENGTH && ol.res.completion_tokens == 3 && ol.text[0] == '{');
    }
    /* forced frame around the grammar: prefix and suffix ids (tokens "<" ... ">" of the vocabulary) */
    {
        int32_t pre[2], suf[1];
        int32_t lt = -1, gt = -1;
        for (int32_t i = 0; i < V && (lt < 0 || gt < 0); i++) {
            char *s;
            size_t sl;
            if (ms_tok_decode(t, &i, 1, 0, &s, &sl, &err)) continue;
            if (sl == 1 && s[0] == '<') lt = i;
            if (sl == 1 && s[0] == '>') gt = i;
            free(s);
        }
        CHECK(lt >= 0 && gt >= 0);
        pre[0] = lt, pre[1] = lt, suf[0] = gt;
        ms_gen_constraint cf = {.grammar = gr, .vocab = gv, .prefix_ids = pre, .n_prefix = 2, .suffix_ids = suf, .n_suffix = 1};
        ms_gen_params pf = p;
        pf.constraint = &cf;
        for (int i = 0; i < 3; i++) {
            out_t of;
            memset(&of, 0, sizeof of);
            pf.sampling.seed = 77 + (uint64_t)i;
            CHECK(ms_generate(g, prompt, 4, &pf, on_tok, &of, &of.res, &err) == 0);
            char why[128] = "";
            CHECK_MSG(of.res.finish == MS_FINISH_STOP && of.n > 3 && !strncmp(of.text, "<<", 2) &&
                          of.text[of.n - 1] == '>',
                      "framed: %s", of.text);
            if (of.n > 3) {
                of.text[of.n - 1] = 0;
                CHECK_MSG(valid(of.text + 2, why, sizeof why), "framed %s: %s", why, of.text);
            }
            CHECK(of.ids[of.n_ids - 1] == gt); /* the suffix replaced the stop id */
        }
    }
    ms_generator_free(g);
    ms_engine_destroy(e);
    /* in slots: batched decode steps, each slot its own matcher (validity only, not compared with one at a time) */
    {
        ms_sched_opts so = {.n_slots = 3, .chunk = 4, .engine = {.max_ctx = 1024}, .tok = t};
        ms_sched *s;
        CHECK_MSG(ms_sched_new(&m, &so, &s, &err) == 0, "%s", err.msg);
        static out_t os[8];
        static ms_gen_params ps[8];
        int next = 0, steps = 0;
        memset(os, 0, sizeof os);
        while (s && (next < 8 || ms_sched_active(s)) && steps < 20000) {
            while (next < 8 && ms_sched_free_slots(s) > 0) {
                ps[next] = p;
                ps[next].sampling.seed = 2000 + (uint64_t)next;
                ps[next].sampling.temperature = 1.0;
                int slot;
                CHECK(ms_sched_submit(s, prompt, 4, &ps[next], on_tok, on_done, &os[next], &slot, &err) == 0);
                next++;
            }
            CHECK(ms_sched_step(s, &err) >= 0);
            steps++;
        }
        int nv = 0;
        for (int i = 0; i < 8; i++) {
            char why[128] = "";
            int ok = os[i].done == 1 && os[i].rc == 0 && os[i].res.finish == MS_FINISH_STOP && valid(os[i].text, why, sizeof why);
            CHECK_MSG(ok, "slot gen %d (finish %s): %s: %s", i, ms_finish_name(os[i].res.finish), why, os[i].text);
            nv += ok;
        }
        printf("constrained in 3 slots: %d/8 valid\n", nv);
        ms_sched_free(s);
    }
done:
    ms_grammar_free(gr);
    ms_gvocab_free(gv);
    ms_tok_free(t);
    ms_model_free(&m);
}

TEST_MAIN()
