/* tok_internal.h — the pieces of the tokenizer shared by src/text/tok_*.c.
 * Not a public interface: callers use text/tokenizer.h. */
#ifndef MS_TOK_INTERNAL_H
#define MS_TOK_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"
#include "util/err.h"

/* ---- UTF-8 ---- */

/* Length of the valid UTF-8 sequence starting at s[0] (1..4), or 0 when the
 * bytes at s (n available) do not start a complete valid sequence. *cp gets the
 * code point. Overlongs, surrogates and > U+10FFFF are invalid. */
int ms_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
/* Byte offset of the first invalid or incomplete sequence in s, or n if all valid. */
size_t ms_utf8_valid_prefix(const uint8_t *s, size_t n);
/* Length of the maximal subpart of an ill-formed sequence at s (n >= 1 bytes),
 * following Unicode's "maximal subpart" practice (what from_utf8_lossy replaces
 * with one U+FFFD). When need_more is not NULL it is set to 1 if s[0..n) is a
 * proper prefix of a valid sequence (so more bytes could complete it). */
size_t ms_utf8_bad_len(const uint8_t *s, size_t n, int *need_more);
/* Append the UTF-8 encoding of cp to out (4 bytes room); returns bytes written. */
int ms_utf8_put(uint32_t cp, uint8_t *out);

/* ---- growable byte buffer ---- */
typedef struct ms_buf {
    uint8_t *p;
    size_t n, cap;
} ms_buf;
int ms_buf_reserve(ms_buf *b, size_t extra);
int ms_buf_add(ms_buf *b, const void *data, size_t n);
void ms_buf_free(ms_buf *b);

int ms_ids_push(ms_tok_ids *v, int32_t id);

/* ---- NFC (unicode_nfc.c) ---- */
/* Canonical composition (NFC) of valid UTF-8 in s[0..n), appended to out.
 * Uses the Unicode 9.0 data that tokenizers' normalizer crate uses. */
int ms_nfc(const uint8_t *s, size_t n, ms_buf *out);
/* 1 when s is already NFC (fast path: quick check); 0 when it may not be. */
int ms_nfc_quick_yes(const uint8_t *s, size_t n);

/* ---- byte-level BPE (tok_bpe.c) ---- */
typedef struct ms_bpe {
    uint32_t n_ids;    /* ids are < n_ids */
    uint8_t *blob;     /* token bytes, concatenated */
    uint64_t *off;     /* [n_ids] offset in blob */
    uint32_t *len;     /* [n_ids] length; UINT32_MAX when the id has no vocab entry */
    size_t blob_n, blob_cap;
    uint32_t *vslots;  /* bytes -> id, open addressing, UINT32_MAX empty */
    size_t vcap;
    uint64_t *mkeys;   /* (a << 32 | b) + 1, 0 empty */
    uint32_t *mrank, *mnew;
    size_t mcap, mcount;
    int32_t byte_id[256];
    int ignore_merges;
    /* word -> ids cache */
    pthread_mutex_t cache_mu;
    struct ms_bpe_cache_ent *cache;
    size_t cache_cap, cache_count;
} ms_bpe;

int ms_bpe_init(ms_bpe *b, uint32_t n_ids, ms_err *err);
/* Set id's bytes; fails if id is out of range or already set. */
int ms_bpe_set_token(ms_bpe *b, uint32_t id, const uint8_t *s, size_t n, ms_err *err);
/* After all tokens are set: build the bytes->id map and the byte ids. */
int ms_bpe_build_vocab(ms_bpe *b, ms_err *err);
int32_t ms_bpe_lookup(const ms_bpe *b, const uint8_t *s, size_t n);
/* Add merge (a, b) -> merged with rank; duplicates keep the first (lowest) rank. */
int ms_bpe_add_merge(ms_bpe *b, uint32_t a, uint32_t bb, uint32_t rank, uint32_t merged, ms_err *err);
int ms_bpe_reserve_merges(ms_bpe *b, size_t n, ms_err *err);
/* BPE of one pre-tokenized piece (raw bytes), ids appended to out. */
int ms_bpe_encode_word(ms_bpe *b, const uint8_t *s, size_t n, ms_tok_ids *out, ms_err *err);
void ms_bpe_free(ms_bpe *b);

/* ---- regex split (tok_pretok.c) ---- */
enum { MS_SPLIT_REMOVED, MS_SPLIT_ISOLATED, MS_SPLIT_MERGED_PREV, MS_SPLIT_MERGED_NEXT, MS_SPLIT_CONTIGUOUS };

typedef struct ms_regex ms_regex;
/* Compile a pattern written for Oniguruma / Rust regex (as tokenizer.json and
 * tiktoken ship them) with PCRE2 (UTF + UCP), translating the constructs whose
 * meaning differs (\s, \h, script names, class intersection &&). literal: the
 * pattern is a plain string. */
int ms_regex_compile(const char *pat, size_t len, int literal, ms_regex **out, ms_err *err);
void ms_regex_free(ms_regex *r);
/* Find the next non-empty match in s[0..n) starting at or after pos.
 * Returns 1 with [*ms, *me), 0 when none, negative on error. */
int ms_regex_next(const ms_regex *r, const uint8_t *s, size_t n, size_t pos, size_t *ms, size_t *me,
                  void *match_data, ms_err *err);
void *ms_regex_match_data(const ms_regex *r);
void ms_regex_match_data_free(void *md);

typedef enum { MS_PRE_SPLIT = 1, MS_PRE_BYTELEVEL } ms_pre_kind;
typedef struct ms_pre_step {
    ms_pre_kind kind;
    ms_regex *re;   /* Split's pattern; ByteLevel's GPT-2 pattern when use_regex */
    int behavior;   /* MS_SPLIT_* */
    int invert;
    int add_prefix_space;
} ms_pre_step;

/* A piece of text: [off, off+len) in an arena. */
typedef struct ms_piece {
    size_t off, len;
} ms_piece;
typedef struct ms_pieces {
    ms_piece *v;
    size_t n, cap;
} ms_pieces;

/* Run the pre-tokenizer steps over arena[0..n0); pieces get appended to out
 * (offsets into arena, which may grow when a prefix space is added). */
int ms_pretokenize(const ms_pre_step *steps, int n_steps, ms_buf *arena, size_t start, size_t n0,
                   ms_pieces *out, ms_err *err);

/* ---- added tokens ---- */
typedef struct ms_added {
    char *content;
    size_t len;
    uint8_t *dec;   /* the bytes it decodes to (set by ms_tok_finish) */
    size_t dec_len;
    int32_t id;
    uint8_t special, lstrip, rstrip, normalized, single_word;
} ms_added;

/* A byte trie over added-token contents (leftmost-longest matching). */
typedef struct ms_trie {
    uint64_t *keys; /* (node << 8 | byte) + 1 */
    uint32_t *child;
    size_t cap, count;
    int32_t *term; /* [nodes] index into added tokens, -1 none */
    int32_t root[256]; /* children of the root (0 = none; node 0 is the root) */
    uint32_t n_nodes, nodes_cap;
} ms_trie;

/* ---- the tokenizer ---- */
enum { MS_NORM_NONE = 0, MS_NORM_NFC = 1 };

struct ms_tokenizer {
    ms_bpe bpe;
    uint32_t n_vocab;       /* ids are < n_vocab */
    ms_added *added;
    size_t n_added;
    int32_t *added_of_id;   /* [n_vocab] index in added or -1 */
    ms_trie trie_raw, trie_norm;
    int normalizer;         /* MS_NORM_* */
    ms_pre_step *pre;
    int n_pre;
    int32_t bos_id, eos_id, pad_id, unk_id;
    int add_bos, add_eos; /* tokenizer_config.json add_bos_token / add_eos_token */
    /* tiktoken compatibility: split runs longer than this many code points of
     * whitespace / non-whitespace before encoding (0 = off) */
    size_t max_run_chars;
    int kind; /* MS_TOK_KIND_* */
};

/* A zeroed tokenizer of the given MS_TOK_KIND_* (ids -1), or NULL. */
ms_tokenizer *ms_tok_alloc(int kind);
int ms_trie_add(ms_trie *t, const uint8_t *s, size_t n, int32_t idx);
void ms_trie_free(ms_trie *t);
/* Finish a tokenizer whose bpe, added and pre are filled: tries, id tables. */
int ms_tok_finish(ms_tokenizer *t, ms_err *err);
/* Byte-level: the byte a vocab char stands for, or -1. */
int ms_bytelevel_byte(uint32_t cp);
/* tokenizers' ByteLevel decoding of one token string: the bytes its chars
 * stand for, or its own UTF-8 bytes when a char is not a byte char. Appends. */
int ms_bytelevel_decode(const uint8_t *s, size_t n, ms_buf *out);
/* Read bos/eos/pad/unk from a tokenizer_config.json tree (strings or AddedToken dicts). */
struct cJSON;
int ms_tok_apply_config(ms_tokenizer *t, const struct cJSON *cfg, ms_err *err);

#endif
