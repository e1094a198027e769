/* tokenizer.h — text <-> token ids, exactly as the model's own tokenizer does it.
 *
 * Two on-disk formats are supported, both byte-level BPE:
 *   - Hugging Face tokenizer.json (model BPE with "a b" or [a, b] merges and
 *     ignore_merges; normalizers NFC and Sequence; pre-tokenizers Split (regex
 *     or string, every behavior, invert), ByteLevel (add_prefix_space, use_regex)
 *     and Sequence; added tokens with their special/lstrip/rstrip/normalized/
 *     single_word flags; the ByteLevel decoder);
 *   - tiktoken: a base64 rank file (tiktoken.model) with the split pattern and
 *     special tokens of the model's tokenizer code (tokenizer_config.json says
 *     which; today: the Kimi tokenizer, tokenization_kimi.py).
 *
 * Encoding follows tokenizers 0.23 step by step: added tokens are cut out of the
 * text first (leftmost-longest), the rest is normalized, pre-tokenized and BPE'd.
 * No special tokens are ever added (BOS is the chat template's business).
 *
 * A loaded tokenizer is immutable and may be used from many threads at once
 * (the word cache inside is locked). Every function fills err on failure and
 * returns a negative MS_ERR_*; none prints. */
#ifndef MS_TOKENIZER_H
#define MS_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct ms_tokenizer ms_tokenizer;

enum { MS_TOK_KIND_HF = 1, MS_TOK_KIND_TIKTOKEN = 2 };

/* A growable id array; zero-initialize, free with ms_tok_ids_free. */
typedef struct ms_tok_ids {
    int32_t *ids;
    size_t n, cap;
} ms_tok_ids;
void ms_tok_ids_free(ms_tok_ids *v);

/* Load the tokenizer of a model directory: tokenizer.json if present, else
 * tiktoken.model; tokenizer_config.json (optional for tokenizer.json, required
 * for tiktoken) gives bos/eos/pad and tiktoken's special tokens.
 * *out is owned by the caller (ms_tok_free).
 * Errors: MS_ERR_IO (missing/unreadable files), MS_ERR_FORMAT (malformed),
 * MS_ERR_UNSUPPORTED (a component we do not implement, named in the message). */
int ms_tok_load_dir(const char *dir, ms_tokenizer **out, ms_err *err);

/* Load from the bytes of a tokenizer.json (json, len) and optionally of a
 * tokenizer_config.json (cfg may be NULL). Same errors as ms_tok_load_dir. */
int ms_tok_load_hf_json(const char *json, size_t len, const char *cfg, size_t cfg_len,
                        ms_tokenizer **out, ms_err *err);

/* Load a tiktoken rank file (lines "BASE64 RANK") with the given split pattern
 * (Rust-regex syntax as tiktoken takes it) and n_special special tokens
 * (specials[i] gets id special_ids[i]). Ranks must be 0..N-1 without holes.
 * cfg (tokenizer_config.json bytes, may be NULL) only supplies bos/eos/pad. */
int ms_tok_load_tiktoken(const char *ranks, size_t len, const char *pattern,
                         const char *const *specials, const int32_t *special_ids, size_t n_special,
                         const char *cfg, size_t cfg_len, ms_tokenizer **out, ms_err *err);

/* Kimi's tiktoken split pattern (tokenization_kimi.py pat_str), verbatim. */
extern const char ms_tiktoken_pattern_kimi[];

void ms_tok_free(ms_tokenizer *t);

enum {
    MS_TOK_ENCODE_SPECIAL = 1, /* recognize special tokens in the text (as HF does by default) */
};

/* Encode len bytes of UTF-8 text; ids are appended to out. With
 * MS_TOK_ENCODE_SPECIAL, added tokens (special or not) in the text become their
 * ids; without it, special tokens are encoded as plain text (HF's
 * encode_special_tokens / tiktoken's disallowed_special=()) while non-special
 * added tokens are still recognized.
 * Errors: MS_ERR_FORMAT when text is not valid UTF-8 (offset in the message). */
int ms_tok_encode(const ms_tokenizer *t, const char *text, size_t len, int flags, ms_tok_ids *out,
                  ms_err *err);

enum { MS_TOK_DECODE_SKIP_SPECIAL = 1 };

/* Decode n ids into text (malloc'd, NUL-terminated, *out_len without the NUL).
 * Byte sequences that are not valid UTF-8 become U+FFFD, as HF's decode does.
 * Errors: MS_ERR_ARG for an id that is not in the vocabulary (named). */
int ms_tok_decode(const ms_tokenizer *t, const int32_t *ids, size_t n, int flags, char **out,
                  size_t *out_len, ms_err *err);

/* The raw bytes of one token (not NUL-terminated; *len set), or NULL for an id
 * outside the vocabulary. The pointer lives as long as t. */
const uint8_t *ms_tok_token_bytes(const ms_tokenizer *t, int32_t id, size_t *len);

/* Id of an added/special token by its content ("<|im_end|>"), else of a vocab
 * token whose raw bytes are exactly s; -1 when neither exists. */
int32_t ms_tok_token_id(const ms_tokenizer *t, const char *s);

/* 1 when id is a special token (added with special=true, or a tiktoken special). */
int ms_tok_is_special(const ms_tokenizer *t, int32_t id);

/* One past the largest id. */
uint32_t ms_tok_vocab_size(const ms_tokenizer *t);
/* bos/eos/pad ids from tokenizer_config.json, -1 when not set. */
int32_t ms_tok_bos_id(const ms_tokenizer *t);
int32_t ms_tok_eos_id(const ms_tokenizer *t);
int32_t ms_tok_pad_id(const ms_tokenizer *t);
int ms_tok_kind(const ms_tokenizer *t);
/* 1 when tokenizer_config.json says add_bos_token / add_eos_token (and the
 * token exists): what transformers' tokenizer(text) adds around plain text
 * (deepseek_v3: BOS). ms_tok_encode never adds them; a caller encoding text
 * that is not a rendered chat template prepends ms_tok_bos_id itself. */
int ms_tok_adds_bos(const ms_tokenizer *t);
int ms_tok_adds_eos(const ms_tokenizer *t);

/* ---- streaming detokenization ----
 * Feed ids one by one; each call returns the newly completed text. Bytes of a
 * character split across tokens are held back until complete, so no output
 * ever ends inside a UTF-8 sequence; an invalid sequence is emitted as U+FFFD.
 * The concatenation of every feed's output and the final flush equals
 * ms_tok_decode of all the ids. */
typedef struct ms_tok_stream {
    const ms_tokenizer *t;
    int flags;          /* MS_TOK_DECODE_* */
    uint8_t pend[8];    /* bytes of an incomplete character */
    size_t n_pend;
    char *out;          /* last output (owned by the stream) */
    size_t out_cap;
} ms_tok_stream;

void ms_tok_stream_init(ms_tok_stream *s, const ms_tokenizer *t, int flags);
/* Feed one id. *text points to the new bytes (owned by the stream, valid until
 * the next call, followed by a NUL), *n their count (may be 0).
 * Errors: MS_ERR_ARG for an unknown id (the stream is unchanged). */
int ms_tok_stream_feed(ms_tok_stream *s, int32_t id, const char **text, size_t *n, ms_err *err);
/* End of stream: whatever is pending (an incomplete character) comes out as U+FFFD. */
int ms_tok_stream_flush(ms_tok_stream *s, const char **text, size_t *n, ms_err *err);
void ms_tok_stream_free(ms_tok_stream *s);

#endif
