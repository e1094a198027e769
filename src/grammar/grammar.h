/* grammar.h — constrained decoding: a grammar (from JSON Schema, "any JSON object",
 * or a GBNF-like text) and a matcher that turns it into a token mask over a model's
 * real vocabulary.
 *
 * A grammar is a set of rules, each a byte-level automaton whose edges read a byte
 * or call another rule (a recursive transition network, i.e. a pushdown automaton).
 * Strings are UTF-8 at the byte level, so a character split across tokens is just
 * an automaton state between two tokens.
 *
 * The mask is exact: token t is allowed iff the bytes generated so far followed by
 * t's bytes are a prefix of some document of the grammar (every rule is checked to
 * derive some string at compile time, so "live" means "completable"). Special
 * tokens never match grammar text; the vocabulary's stop tokens are allowed exactly
 * when the document may end (ms_matcher_done).
 *
 * Layering: util and text only. A compiled grammar is immutable apart from its
 * internal mask caches, which are locked: one grammar may serve many matchers on
 * many threads; one matcher is used by one thread at a time.
 *
 * Every function that can fail returns MS_OK or a negative MS_ERR_* and fills err;
 * none prints. Memory is bounded by ms_grammar_opts limits (MS_ERR_LIMIT names the
 * limit that was hit). */
#ifndef MS_GRAMMAR_H
#define MS_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"
#include "util/err.h"

typedef struct ms_grammar ms_grammar;
typedef struct ms_gvocab ms_gvocab;
typedef struct ms_matcher ms_matcher;

/* Compile options and limits; zero fields take the defaults in brackets. */
typedef struct ms_grammar_opts {
    int ws_max;           /* JSON: most whitespace bytes between two tokens [20]; -1 none */
    int max_states;       /* automaton states, all rules together [200000] */
    int max_rules;        /* rules (each $ref target, builtin, GBNF rule) [4096] */
    int max_repeat;       /* largest bounded repetition (maxItems, maxLength, {m,n}) [1024] */
    int max_schema_depth; /* nesting of schema objects [64] */
    int max_stack;        /* runtime rule-call depth (recursive $ref, nested JSON) [512] */
    int max_configs;      /* runtime parse configurations at one point [4096] */
    size_t cache_bytes;   /* mask cache per vocabulary, bytes [256 MiB] */
} ms_grammar_opts;

/* JSON Schema (draft 2020-12 keywords, the subset below) -> grammar.
 * Supported: type (a name or an array of names; "nullable": true adds null),
 * object (properties in schema order, required, additionalProperties false / true /
 * a schema), array (items, minItems, maxItems), string (minLength, maxLength,
 * format date, time, date-time, uuid, ipv4), number, integer (minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum: exact digit ranges), boolean, null, enum,
 * const, anyOf, oneOf (as anyOf: exclusivity is not enforced), allOf with one
 * element, $ref to "#" or "#/..." JSON pointers ($defs, definitions), boolean
 * schemas (true: any value). Annotations (title, description, default, examples,
 * $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored.
 * An absent additionalProperties is read as false (OpenAI strict mode): the output
 * always validates against the schema, but optional properties keep schema order.
 * Errors: MS_ERR_FORMAT (not JSON), MS_ERR_UNSUPPORTED (a keyword or value we do
 * not implement: the message names it and its JSON pointer, e.g.
 * "unsupported JSON Schema keyword \"pattern\" at /properties/zip"), MS_ERR_ARG (a
 * schema that is malformed or admits no value, named likewise), MS_ERR_LIMIT. */
int ms_grammar_from_schema(const char *schema_json, size_t len, const ms_grammar_opts *o,
                           ms_grammar **out, ms_err *err);

/* Any JSON object (response_format json_object); MS_GRAMMAR_JSON_VALUE: any JSON value. */
enum { MS_GRAMMAR_JSON_OBJECT = 0, MS_GRAMMAR_JSON_VALUE = 1 };
int ms_grammar_json(int which, const ms_grammar_opts *o, ms_grammar **out, ms_err *err);

/* A GBNF-like grammar (llama.cpp's syntax): rules `name ::= body`, the start rule is
 * `root`. Body: alternatives `|`, sequences, "literals" (escapes \n \r \t \\ \" \xHH
 * \uHHHH \UHHHHHHHH), [character classes] over code points ([^...] negated, a-z
 * ranges, the same escapes), `.` (any character), rule names, ( groups ), and the
 * postfix operators * + ? {m} {m,} {m,n}. `#` starts a comment.
 * A token reference <[ID]> reads exactly the token with that id (a special token of
 * a tool-call frame: <|channel|>, <|tool_call_begin|>; at most 256 distinct ones). A
 * referenced id is allowed only through its references: never as text, and, if it is
 * one of the vocabulary's stop tokens, not as a stop either (harmony's <|call|> ends a
 * call where the grammar reads it; other stops still end a complete document).
 * A rule name may also be bound to a JSON Schema: schema_names[i] = schema_jsons[i]
 * (n_schemas of them; NULL/0 for none), e.g. to embed tool arguments in a tool-call
 * syntax: root ::= "<tool_call>" args "</tool_call>".
 * Errors: MS_ERR_FORMAT (syntax, with line:col), MS_ERR_ARG (undefined rule, left
 * recursion, a rule that derives nothing), MS_ERR_LIMIT, and the schema errors. */
int ms_grammar_from_gbnf(const char *text, size_t len, const char *const *schema_names,
                         const char *const *schema_jsons, size_t n_schemas, const ms_grammar_opts *o,
                         ms_grammar **out, ms_err *err);

/* The GBNF expression of a JSON Schema string "format" the schema front end supports
 * (date, time, date-time, uuid, ipv4): the characters between the quotes; NULL for
 * any other name. Static. */
const char *ms_grammar_format_gbnf(const char *format);

/* Grammars are reference counted (a cache and the requests using a grammar share it):
 * ms_grammar_ref adds a reference and returns g; ms_grammar_free drops one and frees the
 * grammar with the last. Every matcher made from it must have been freed by then. */
ms_grammar *ms_grammar_ref(ms_grammar *g);
void ms_grammar_free(ms_grammar *g);

/* A cache of compiled grammars by key (the caller's: e.g. the request fields a grammar is
 * made from): a grammar found again keeps its warm mask caches, so a repeated schema pays
 * neither the compile nor the first visits of its states. At most max_entries grammars and
 * max_bytes of them and their mask caches (0: no byte bound); the least recently used go
 * first. Thread-safe. */
typedef struct ms_grammar_cache ms_grammar_cache;
int ms_grammar_cache_new(int max_entries, size_t max_bytes, ms_grammar_cache **out, ms_err *err);
void ms_grammar_cache_free(ms_grammar_cache *c);
/* A new reference to the grammar kept under key (free it with ms_grammar_free), or NULL. */
ms_grammar *ms_grammar_cache_get(ms_grammar_cache *c, const char *key, size_t len);
/* Keep g under key (the cache takes a reference of its own; the caller keeps its own). */
void ms_grammar_cache_put(ms_grammar_cache *c, const char *key, size_t len, ms_grammar *g);
int ms_grammar_cache_size(ms_grammar_cache *c);

/* Counts for reports: automaton states and rules. */
int ms_grammar_n_states(const ms_grammar *g);
int ms_grammar_n_rules(const ms_grammar *g);

/* ---- vocabulary ----
 * The model's tokens as byte strings with a byte trie over them. n_vocab is the size
 * of the model's logits (0: the tokenizer's ms_tok_vocab_size); ids the tokenizer
 * does not know are never allowed. Special tokens are not text. stop_ids (n_stop of
 * them, e.g. EOS and <|im_end|>) are allowed only where the document may end; ids
 * outside n_vocab are an MS_ERR_ARG. Immutable once built; shared by any number of
 * matchers and grammars. */
int ms_gvocab_new(const ms_tokenizer *t, uint32_t n_vocab, const int32_t *stop_ids, size_t n_stop,
                  ms_gvocab **out, ms_err *err);
/* The same from raw token byte strings (tests, other tokenizers): bytes[i] (len[i]),
 * NULL for a token that is never text. */
int ms_gvocab_new_raw(uint32_t n_vocab, const uint8_t *const *bytes, const size_t *len,
                      const int32_t *stop_ids, size_t n_stop, ms_gvocab **out, ms_err *err);
void ms_gvocab_free(ms_gvocab *v);
uint32_t ms_gvocab_size(const ms_gvocab *v);
/* uint32_t words of a mask: (n_vocab + 31) / 32. */
size_t ms_gvocab_mask_words(const ms_gvocab *v);

/* ---- matcher ----
 * The parse state of one generation. g and v must outlive it. */
int ms_matcher_new(ms_grammar *g, const ms_gvocab *v, ms_matcher **out, ms_err *err);
void ms_matcher_free(ms_matcher *m);

/* Write the allowed-token mask: bit (id % 32) of bits[id / 32] is set iff token id
 * may come next (ms_gvocab_mask_words(v) words; bits past n_vocab are 0). After a
 * stop token was accepted the mask is empty.
 * Errors: MS_ERR_LIMIT (a runtime limit: max_configs, or a document nested deeper
 * than max_stack, where no token may be left to offer), MS_ERR_NOMEM. */
int ms_matcher_mask(ms_matcher *m, uint32_t *bits, ms_err *err);

/* Advance by one token. A token the mask would not allow is MS_ERR_ARG and leaves
 * the matcher unchanged. A stop token is allowed only when ms_matcher_done; it ends
 * the matcher (ms_matcher_ended). */
int ms_matcher_accept(ms_matcher *m, int32_t token, ms_err *err);
/* Advance by raw bytes (forced text, tests). MS_ERR_ARG when they leave the
 * grammar (the matcher is unchanged). */
int ms_matcher_accept_bytes(ms_matcher *m, const uint8_t *b, size_t n, ms_err *err);

/* 1 when the bytes could be accepted now (the matcher is not changed). */
int ms_matcher_can_accept_bytes(ms_matcher *m, const uint8_t *b, size_t n);

/* 1 when the text so far is a complete document (stop tokens allowed), else 0. */
int ms_matcher_done(const ms_matcher *m);
/* 1 after a stop token was accepted. */
int ms_matcher_ended(const ms_matcher *m);
/* 1 when nothing but a stop token can follow (the document is complete and closed). */
int ms_matcher_closed(const ms_matcher *m);

/* Back to the start of the document (caches are kept). */
void ms_matcher_reset(ms_matcher *m);
/* A copy of m's parse state (a snapshot to roll back to); the copy is independent. */
int ms_matcher_clone(const ms_matcher *m, ms_matcher **out, ms_err *err);

#endif
