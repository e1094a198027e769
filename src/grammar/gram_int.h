/* gram_int.h — grammar internals shared by the builder (build.c), the front ends
 * (schema.c, gbnf.c) and the matcher (matcher.c).
 *
 * Front ends emit, per rule, a Thompson-style NFA: states 0 (start) and 1 (final)
 * exist in every rule; edges read a byte range, call a rule, or are epsilon. The
 * builder determinizes each rule over byte classes and call symbols, drops what
 * derives nothing, minimizes, checks left recursion, and lays every rule's DFA out
 * in one global state table (gram_int's ms_grammar). */
#ifndef MS_GRAM_INT_H
#define MS_GRAM_INT_H

#include <pthread.h>
#include <stdint.h>

#include "grammar/grammar.h"

enum { GE_EPS = 0, GE_BYTE = 1, GE_CALL = 2 };

typedef struct gedge {
    int32_t from, to;
    int32_t kind;  /* GE_* */
    int32_t a, b;  /* GE_BYTE: lo, hi (a symbol: a byte 0..255, or 256 + k for token reference k); GE_CALL: a = rule */
} gedge;

typedef struct grule_b {
    char *name;
    int32_t nstates;
    gedge *e;
    size_t ne, cap;
    int defined; /* body emitted (GBNF: a definition was seen) */
    int bounded; /* a JSON string with minLength bmin / maxLength bmax (-1: none): "\"" char{bmin,bmax} "\"" */
    int bmin, bmax;
} grule_b;

/* Builtin JSON rules (created on first use, shared by every schema of a build; -1: none yet). */
typedef struct gjson {
    int ws, string, number, integer, value, object, array;
} gjson;

typedef struct gbuild {
    ms_grammar_opts o;
    gjson j;
    grule_b *r;
    int nr, rcap;
    size_t nfa_states; /* all rules */
    ms_err *err;
    int rc; /* first failure, sticky: emitters become no-ops */
    int32_t *tok;      /* token references: symbol 256 + k reads token id tok[k] */
    int ntok, tokcap;
} gbuild;

void gb_init(gbuild *b, const ms_grammar_opts *o, ms_err *err);
void gb_free(gbuild *b);
/* New rule with states 0 (start) and 1 (final); returns its id or -1 (b->rc set). */
int gb_rule(gbuild *b, const char *name);
int gb_find_rule(const gbuild *b, const char *name);
int gb_state(gbuild *b, int r);
void gb_eps(gbuild *b, int r, int from, int to);
void gb_range(gbuild *b, int r, int from, int lo, int hi, int to);
void gb_call(gbuild *b, int r, int from, int callee, int to);
/* The bytes s[0..n) in sequence. */
void gb_lit(gbuild *b, int r, int from, const char *s, size_t n, int to);
/* Any one code point in the union of the ranges (lo[i]..hi[i]), UTF-8 encoded;
 * surrogates are never matched. */
void gb_cps(gbuild *b, int r, int from, const uint32_t *lo, const uint32_t *hi, int n, int to);
int gb_fail(gbuild *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An edge that reads the one token id (a reference: <[id]> in GBNF), not text. */
void gb_token(gbuild *b, int r, int from, int32_t id, int to);
#define GB_MAX_TOKEN_REFS 256

/* Determinize, check and lay out; root is the start rule. Frees nothing of b. */
int gb_finish(gbuild *b, int root, ms_grammar **out);

/* ---- the compiled grammar ---- */
enum { GS_ACCEPT = 1, GS_BYTES = 2, GS_CALLS = 4 };

struct gcache;
typedef struct gbind {
    const ms_gvocab *v;
    struct gcache **ent; /* per state, NULL until computed */
    size_t bytes;
    struct gbind *next;
} gbind;

struct ms_grammar {
    ms_grammar_opts o;
    int32_t n_states, n_rules, root;
    int n_cls;
    uint16_t *cls;         /* [256 + n_tok] symbol -> class (bytes, then token references) */
    int32_t n_tok;
    int32_t *tok;          /* [n_tok] token id of symbol 256 + k (distinct, in order of first use) */
    int32_t *trans;        /* [n_states * n_cls], -1: no edge */
    uint8_t *flags;        /* GS_* */
    int32_t *call_off;     /* [n_states + 1] into call_rule / call_ret */
    int32_t *call_rule, *call_ret;
    int32_t *state_rule;   /* [n_states] */
    int32_t *rule_start;   /* [n_rules] */
    char **rule_name;      /* [n_rules] */
    uint64_t (*follow)[4]; /* [n_rules]: bytes that may come right after the rule */
    pthread_mutex_t mu;
    gbind *binds;
    int refs;              /* references (ms_grammar_ref / ms_grammar_free); 1 when made */
    /* States between two characters of a bounded JSON string rule: how many more characters
     * it needs (bs_min) and may take (bs_max; INT32_MAX: no bound) before its closing quote;
     * bs_max -1 for every other state. Their mask caches come from the vocabulary's string
     * profile instead of a trie walk (matcher.c). */
    int32_t *bs_min, *bs_max;
};

/* JSON-schema front end, shared by ms_grammar_from_schema and GBNF bindings:
 * compile the schema document into rule r (whose body it emits). */
int gs_schema_rule(gbuild *b, const char *json, size_t len, int r, const char *what);
int gj_value(gbuild *b);
/* The builtin JSON string rule ("\"" char* "\""), created on first use. */
int gj_string_rule(gbuild *b);
int gj_object(gbuild *b);
/* Emit a GBNF alternation (no rule names) into rule r, from -> to: how the string
 * formats are written. */
int gg_emit_expr(gbuild *b, const char *text, int r, int from, int to);

#endif
