/* cmd_bench_grammar.c — `moonshine bench-grammar TOKENIZER...`: the cost of the
 * constrained-decoding token mask (src/grammar) on real vocabularies, as JSON.
 *
 * For each tokenizer and schema: compile the grammar, then random walks (tokens
 * drawn uniformly among the allowed ones, the worst case for a grammar: nothing
 * steers toward short output). Every ms_matcher_mask call is timed. "cold" is the
 * first walk of a freshly compiled grammar (its per-state caches are built on the
 * way: what one request with a new schema pays); "warm" is the later walks (the
 * same schema again). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "grammar/grammar.h"
#include "text/tokenizer.h"
#include "util/fs.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct bschema {
    const char *name;
    const char *json; /* NULL: json_object */
} bschema;

static const bschema k_schemas[] = {
    {"person", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
               "\"email\":{\"type\":\"string\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
               "\"maxItems\":4},\"active\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"active\"]}"},
    /* maxLength: one automaton state per character position, each with its own cache (the worst case) */
    {"bounded_strings", "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},"
                        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":4}},"
                        "\"required\":[\"name\",\"tags\"]}"},
    {"tool_args", "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"celsius\","
                  "\"fahrenheit\"]},\"days\":{\"type\":\"integer\"},\"when\":{\"type\":\"string\",\"format\":\"date\"}},"
                  "\"required\":[\"location\",\"unit\"],\"additionalProperties\":false}"},
    {"recursive", "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"label\":{\"type\":"
                  "[\"string\",\"null\"]},\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
                  "\"required\":[\"id\",\"label\"]}},\"$ref\":\"#/$defs/node\"}"},
    {"numbers", "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"}]},\"minItems\":1}"},
    {"json_object", NULL},
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct stats {
    double *t;
    size_t n, cap;
} stats;

static void st_add(stats *s, double v) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->t = realloc(s->t, s->cap * sizeof *s->t);
    }
    s->t[s->n++] = v;
}

static void st_print(const char *name, stats *s) {
    if (!s->n) {
        printf("\"%s\": null", name);
        return;
    }
    qsort(s->t, s->n, sizeof *s->t, cmp_d);
    double sum = 0;
    for (size_t i = 0; i < s->n; i++) sum += s->t[i];
    size_t p99 = (size_t)((double)(s->n - 1) * 0.99);
    printf("\"%s\": {\"masks\": %zu, \"mean_us\": %.1f, \"p50_us\": %.1f, \"p99_us\": %.1f, \"worst_us\": %.1f}", name,
           s->n, sum / (double)s->n * 1e6, s->t[s->n / 2] * 1e6, s->t[p99] * 1e6, s->t[s->n - 1] * 1e6);
}

static int32_t pick(const uint32_t *bits, size_t w, uint64_t *rng) {
    int cnt = 0;
    for (size_t i = 0; i < w; i++) cnt += __builtin_popcount(bits[i]);
    if (!cnt) return -1;
    *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
    int k = (int)(*rng % (uint64_t)cnt);
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

static int load_tok(const char *path, ms_tokenizer **t, ms_err *err) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        /* a tokenizer.json file; tokenizer_config.json beside it when present */
        char *js = NULL, *cfg = NULL;
        size_t jl = 0, cl = 0;
        if (ms_read_file(path, (size_t)1 << 30, &js, &jl, err)) return err->code;
        char cpath[4096];
        snprintf(cpath, sizeof cpath, "%s", path);
        char *slash = strrchr(cpath, '/');
        snprintf(slash ? slash + 1 : cpath, sizeof cpath - (size_t)(slash ? slash + 1 - cpath : 0), "tokenizer_config.json");
        if (ms_file_exists(cpath)) ms_read_file(cpath, (size_t)1 << 24, &cfg, &cl, err);
        ms_err_clear(err);
        int rc = ms_tok_load_hf_json(js, jl, cfg, cl, t, err);
        free(js), free(cfg);
        return rc;
    }
    return ms_tok_load_dir(path, t, err);
}

static void usage(FILE *f) {
    fprintf(f, "usage: moonshine bench-grammar TOKENIZER... [--schema FILE] [--walks N] [--tokens N] [--seed S]\n");
}

int cmd_bench_grammar(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        usage(stdout);
        printf("TOKENIZER: a model directory (tokenizer.json or tiktoken.model) or a tokenizer.json file.\n"
               "Times the constrained-decoding token mask on built-in schemas (person,\n"
               "bounded_strings, tool_args, recursive, numbers, json_object), or on the JSON Schema in FILE only, over N random\n"
               "walks (default 5) of at most N tokens each (default 400), drawing uniformly among\n"
               "the allowed tokens. Prints one JSON document: per tokenizer and schema the compile\n"
               "time and the mask time per token (mean, p50, p99, worst) for the first walk (cold\n"
               "caches) and the others (warm).\n");
        return 0;
    }
    const char *sfile = ms_arg_str(argc, argv, "--schema");
    int64_t walks = 5, tokens = 400, seed = 1;
    if (ms_arg_int(argc, argv, "--walks", 1, 100000, &walks) || ms_arg_int(argc, argv, "--tokens", 1, 10000000, &tokens) ||
        ms_arg_int(argc, argv, "--seed", 1, INT64_MAX, &seed))
        return 2;
    const char *paths[64];
    int npaths = 0;
    for (const char *p; npaths < 64 && (p = ms_arg_pos(argc, argv, 0));) paths[npaths++] = p; /* each call takes the next */
    if (!npaths || ms_args_unknown(argc, argv, "bench-grammar")) {
        usage(stderr);
        return 2;
    }
    ms_err err = {0};
    bschema user = {"file", NULL};
    char *utext = NULL;
    if (sfile) {
        size_t ul;
        if (ms_read_file(sfile, (size_t)1 << 26, &utext, &ul, &err)) {
            fprintf(stderr, "moonshine bench-grammar: %s\n", err.msg);
            return 1;
        }
        user.name = sfile;
        user.json = utext;
    }
    const bschema *list = sfile ? &user : k_schemas;
    size_t nlist = sfile ? 1 : sizeof k_schemas / sizeof *k_schemas;
    printf("{\"bench\": \"grammar\", \"walks\": %lld, \"max_tokens\": %lld, \"seed\": %lld, \"tokenizers\": [",
           (long long)walks, (long long)tokens, (long long)seed);
    int status = 0;
    for (int ti = 0; ti < npaths; ti++) {
        const char *path = paths[ti];
        ms_tokenizer *t = NULL;
        if (load_tok(path, &t, &err)) {
            fprintf(stderr, "moonshine bench-grammar: %s: %s\n", path, err.msg);
            status = 1;
            break;
        }
        int32_t stop = ms_tok_eos_id(t);
        ms_gvocab *v = NULL;
        double t0 = now_s();
        if (ms_gvocab_new(t, 0, stop >= 0 ? &stop : NULL, stop >= 0, &v, &err)) {
            fprintf(stderr, "moonshine bench-grammar: %s: %s\n", path, err.msg);
            ms_tok_free(t);
            status = 1;
            break;
        }
        double vocab_s = now_s() - t0;
        size_t w = ms_gvocab_mask_words(v);
        uint32_t *bits = malloc(w * 4);
        printf("%s\n  {\"tokenizer\": \"%s\", \"vocab\": %u, \"vocab_build_ms\": %.1f, \"schemas\": [", ti ? "," : "", path,
               ms_gvocab_size(v), vocab_s * 1e3);
        for (size_t si = 0; si < nlist && !status; si++) {
            ms_grammar *g = NULL;
            t0 = now_s();
            int rc = list[si].json ? ms_grammar_from_schema(list[si].json, strlen(list[si].json), NULL, &g, &err)
                                   : ms_grammar_json(MS_GRAMMAR_JSON_OBJECT, NULL, &g, &err);
            double comp_s = now_s() - t0;
            if (rc) {
                fprintf(stderr, "moonshine bench-grammar: schema %s: %s\n", list[si].name, err.msg);
                status = 1;
                break;
            }
            stats cold = {0}, warm = {0}, acc = {0};
            uint64_t rng = (uint64_t)seed * 0x9E3779B97F4A7C15ull + si;
            int ended = 0;
            size_t ntok = 0;
            for (int64_t wk = 0; wk < walks && !status; wk++) {
                ms_matcher *m = NULL;
                if (ms_matcher_new(g, v, &m, &err)) {
                    fprintf(stderr, "moonshine bench-grammar: %s\n", err.msg);
                    status = 1;
                    break;
                }
                for (int64_t k = 0; k < tokens; k++) {
                    double a = now_s();
                    if (ms_matcher_mask(m, bits, &err)) {
                        fprintf(stderr, "moonshine bench-grammar: mask: %s\n", err.msg);
                        status = 1;
                        break;
                    }
                    st_add(wk ? &warm : &cold, now_s() - a);
                    int32_t tok = pick(bits, w, &rng);
                    if (tok < 0) break;
                    a = now_s();
                    if (ms_matcher_accept(m, tok, &err)) {
                        fprintf(stderr, "moonshine bench-grammar: accept: %s\n", err.msg);
                        status = 1;
                        break;
                    }
                    st_add(&acc, now_s() - a);
                    ntok++;
                    if (ms_matcher_ended(m)) {
                        ended++;
                        break;
                    }
                }
                ms_matcher_free(m);
            }
            printf("%s\n    {\"schema\": \"%s\", \"states\": %d, \"rules\": %d, \"compile_ms\": %.2f, \"tokens\": %zu, "
                   "\"walks_ended\": %d, ",
                   si ? "," : "", list[si].name, ms_grammar_n_states(g), ms_grammar_n_rules(g), comp_s * 1e3, ntok, ended);
            st_print("cold", &cold);
            printf(", ");
            st_print("warm", &warm);
            printf(", ");
            st_print("accept", &acc);
            printf("}");
            free(cold.t), free(warm.t), free(acc.t);
            ms_grammar_free(g);
        }
        printf("]}");
        free(bits);
        ms_gvocab_free(v);
        ms_tok_free(t);
        if (status) break;
    }
    printf("\n]}\n");
    free(utext);
    return status;
}
