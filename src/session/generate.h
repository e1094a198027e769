/* generate.h — sampling, stop conditions and the generation loop over an engine.
 *
 * Three layers, each usable alone:
 *   - the sampler: logits [vocab] -> one token id, with OpenAI's penalties and
 *     the usual truncations, driven by a seeded RNG (same seed, same logits ->
 *     same token);
 *   - the stop matcher: text deltas in, text deltas out, holding back any tail
 *     that could still become a stop string, so a stop string never leaks;
 *   - the generator: owns the token history of one engine, reuses the longest
 *     common prefix with the previous request (rollback for attention-only
 *     models, or a snapshot hook for models with recurrent state), prefills
 *     the rest, then samples, decodes (UTF-8 safe) and stops.
 * Library code: statuses + ms_err, never prints. */
#ifndef MS_ENGINE_GENERATE_H
#define MS_ENGINE_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/state.h"
#include "grammar/grammar.h"
#include "text/tokenizer.h"
#include "util/err.h"
#include "util/progress.h"

/* ---------------- RNG ---------------- */
/* xoshiro256** seeded through splitmix64: a seed fixes the whole sequence. */
typedef struct ms_rng { uint64_t s[4]; } ms_rng;
void ms_rng_seed(ms_rng *r, uint64_t seed);
uint64_t ms_rng_next(ms_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double ms_rng_uniform(ms_rng *r);

/* ---------------- sampler ---------------- */
typedef struct ms_sampler_params {
    double temperature;        /* 0: greedy (argmax, lowest id on ties); else > 0 */
    int top_k;                 /* 0: off; else keep the k most likely */
    double top_p;              /* 1: off; else (0, 1]: smallest most-likely set with mass >= top_p */
    double min_p;              /* 0: off; else [0, 1]: keep p >= min_p * max p */
    double repetition_penalty; /* 1: off; > 0, transformers' rule: a logit of a token seen in the prompt
                                  or output is divided by it when positive, multiplied when negative */
    double presence_penalty;   /* OpenAI [-2, 2]: logit -= presence if the token occurred in the output */
    double frequency_penalty;  /* OpenAI [-2, 2]: logit -= frequency * (times it occurred in the output) */
    uint64_t seed;             /* RNG seed (the server draws one when the request has none) */
    /* OpenAI logit_bias: bias[i] is added to the logit of id bias_ids[i] after the penalties,
     * before temperature and truncation (-100 all but bans, 100 all but forces). Copied by
     * ms_sampler_new; ids outside the sampler's vocabulary are ignored; values must be finite. */
    const int32_t *bias_ids;
    const float *bias;
    int n_bias;
} ms_sampler_params;

/* Defaults: temperature 1, top_k 0, top_p 1, min_p 0, penalties off, seed 0. */
void ms_sampler_defaults(ms_sampler_params *p);
/* Range checks (names the field): MS_ERR_ARG. */
int ms_sampler_check(const ms_sampler_params *p, ms_err *err);

typedef struct ms_sampler ms_sampler;

/* A sampler for a vocabulary of `vocab` ids. Copies p; seeds the RNG from p->seed.
 * Errors: those of ms_sampler_check, MS_ERR_ARG (vocab < 1), MS_ERR_NOMEM. */
int ms_sampler_new(const ms_sampler_params *p, int64_t vocab, ms_sampler **out, ms_err *err);
void ms_sampler_free(ms_sampler *s);
/* Token history for the penalties: prompt tokens count for repetition_penalty
 * only, output tokens for all three. Ids outside the vocabulary are ignored. */
void ms_sampler_add_prompt(ms_sampler *s, const int32_t *ids, int n);
void ms_sampler_add_output(ms_sampler *s, int32_t id);

/* The distribution the sampler would draw from: penalties, then temperature,
 * top_k, top_p, min_p, each truncation applied to the distribution renormalized
 * after the previous one (transformers' logits-processor order). probs [vocab]
 * receives it (zeros outside the kept set; sums to 1). With temperature 0 it is
 * one-hot on the argmax. logits [vocab] is not modified. */
int ms_sampler_probs(ms_sampler *s, const float *logits, double *probs, ms_err *err);
/* Draw one id from logits [vocab] (ms_sampler_probs + one RNG draw; greedy
 * draws nothing). Does not record it: call ms_sampler_add_output. */
int ms_sampler_sample(ms_sampler *s, const float *logits, int32_t *id, ms_err *err);

/* ---------------- stop strings ---------------- */
#define MS_STOP_MAX 16        /* stop strings per request */
#define MS_STOP_MAX_LEN 256   /* bytes per stop string */

typedef struct ms_stopper ms_stopper;

/* A matcher for n (0..MS_STOP_MAX) non-empty stop strings of at most
 * MS_STOP_MAX_LEN bytes each (copied). Errors: MS_ERR_ARG naming the string. */
int ms_stopper_new(const char *const *stops, int n, ms_stopper **out, ms_err *err);
void ms_stopper_free(ms_stopper *s);
/* Feed a text delta. *out and *out_len: the text that is now certain not to be part
 * of a stop string (owned by the stopper, valid until the next call). *hit is
 * set to 1 when a stop string completed: *out is then the text before it and
 * the matcher accepts nothing more. Errors: MS_ERR_NOMEM. */
int ms_stopper_feed(ms_stopper *s, const char *text, size_t len, const char **out, size_t *out_len, int *hit,
                    ms_err *err);
/* End of text: everything held back (a partial match) is released. */
void ms_stopper_flush(ms_stopper *s, const char **out, size_t *out_len);

/* ---------------- EOS ids ---------------- */
/* The end-of-sequence ids of a model directory: eos_token_id of config.json and
 * of generation_config.json (an int or a list, either file may be absent),
 * deduplicated, at most cap. Ids outside [0, vocab) are an error naming the file.
 * Errors: MS_ERR_FORMAT (malformed JSON, bad ids), MS_ERR_LIMIT (> cap). */
int ms_gen_eos_ids(const char *dir, int64_t vocab, int32_t *ids, int cap, int *n, ms_err *err);

/* ---------------- prefix reuse ---------------- */
/* Rollback (ms_engine_can_truncate, ms_engine_truncate) and snapshots: engine/state.h. */

/* Exact causal-state snapshots for models that cannot roll back (an optional
 * plug-in, e.g. over engine/state.h). Both functions are optional. */
typedef struct ms_gen_snapshots {
    void *user;
    /* Put e into the state after the longest saved prefix of ids[0..n) (n >= 0);
     * *restored = its length, or 0 when none applies (e untouched). */
    int (*restore)(void *user, ms_engine *e, const int32_t *ids, int n, int *restored, ms_err *err);
    /* e holds exactly ids[0..n): save it if wanted. */
    int (*save)(void *user, ms_engine *e, const int32_t *ids, int n, ms_err *err);
    /* The token ids of saved entry i (i = 0, 1, ...; return 0 past the last; borrowed until
     * the next call into the plug-in): prompts are matched against them on bytes (canonical
     * history, ms_gen_align) as against the generator's own history. */
    int (*entry)(void *user, int i, const int32_t **ids, int *n);
    /* The longest saved prefix of ids[0..n) without restoring it (0: none). Lets a model
     * that can roll back use a saved state (e.g. from disk) longer than its own history. */
    int (*longest)(void *user, const int32_t *ids, int n);
    /* Checkpoints during prefill, for an engine that cannot roll back (ignored for one that
     * can; needs save). The state is saved at every prompt position that is a multiple of
     * `every` (0: none) and, with `at_boundaries` and a tokenizer, at each message boundary
     * of the prompt: a position p whose token is special (chat templates delimit messages with
     * added tokens) and follows a plain one, at least `every`/16 (>= 16) positions after the
     * previous checkpoint. Prefill pieces stop at these positions, and they depend only on the
     * tokens before them, so a prompt that diverges from a saved one restores the checkpoint
     * nearest before the divergence and then feeds the same pieces as a cold prefill of the
     * same prompt: bit-identical logits. The plug-in bounds what it keeps (prefix_cache.h). */
    int every;
    int at_boundaries;
} ms_gen_snapshots;

/* ---------------- canonical token history ----------------
 * A reply is kept as the ids that were generated. The next request renders that
 * reply again as text and tokenizes it, which can give other ids for the same bytes
 * (BPE merges across what were separate sampling steps). Matching on ids would lose
 * the reply and everything after it; ms_gen_align matches on the tokens' raw bytes:
 *   known[0..*k_used) and prompt[0..*p_used) have the same bytes, end on a token
 *   boundary of both, and are the longest such pair within the longest common byte
 *   prefix of the two sequences (so reuse goes up to the first real difference).
 * A special token matches only itself (the same id at a boundary of both), and a
 * token without bytes or outside the tokenizer's vocabulary ends the match. Without
 * a tokenizer (t NULL) it is the plain common id prefix. The request then runs
 * known[0..*k_used) + prompt[*p_used..n): the same text, the generated ids. */
void ms_gen_align(const ms_tokenizer *t, const int32_t *known, int nk, const int32_t *prompt, int n, int *k_used,
                  int *p_used);

/* ---------------- generation ---------------- */
typedef enum { MS_FINISH_NONE, MS_FINISH_STOP, MS_FINISH_LENGTH, MS_FINISH_ABORT } ms_finish;
const char *ms_finish_name(ms_finish f); /* "stop", "length", "abort" */

/* Constrained decoding (grammar/grammar.h). The generation is
 *   prefix_ids   forced one per step (e.g. a tool-call frame's special tokens),
 *   the grammar  each step's logits masked to the tokens the matcher allows (-inf
 *                elsewhere) before sampling; the sampled id is accepted by the matcher,
 *   suffix_ids   forced once the grammar is complete,
 * then it ends (finish stop). The grammar is complete when the matcher is closed
 * (nothing but a stop token may follow) or when a stop token of the vocabulary
 * (allowed only where the document may end) is sampled: without suffix_ids that
 * stop token is the generation's last id (an EOS); with them it is replaced by the
 * suffix. vocab's stop ids should be the generation's eos_ids (ms_gvocab_new).
 * A limit (max_tokens, the context) may end it earlier: finish length. The grammar and
 * vocabulary are borrowed (one grammar may serve many runs at once); each run has its
 * own matcher. */
typedef struct ms_gen_constraint {
    ms_grammar *grammar;          /* NULL: only the forced ids */
    const ms_gvocab *vocab;       /* required with a grammar; its size is the model's vocab */
    const int32_t *prefix_ids;
    int n_prefix;
    const int32_t *suffix_ids;
    int n_suffix;
} ms_gen_constraint;

/* Log-probabilities (OpenAI logprobs): called for each emitted token but an EOS, just before
 * the token callback, with the same user pointer: logprob is the token's log-probability under
 * the model's raw distribution (log-softmax of the step's logits over the tokenizer's ids:
 * before penalties, logit_bias, temperature, truncation and any grammar mask), top_ids /
 * top_lps the n_top (ms_gen_params.top_logprobs) most likely ids and theirs, most likely first
 * (ties: the lower id). Pointers valid during the call. */
typedef void (*ms_gen_logprob_fn)(void *user, int32_t id, float logprob, const int32_t *top_ids, const float *top_lps,
                                  int n_top);

typedef struct ms_gen_params {
    ms_sampler_params sampling;
    int max_tokens;              /* >= 1 new tokens at most (also bounded by the context) */
    const char *const *stop;     /* stop strings (n_stop <= MS_STOP_MAX), matched on the decoded text */
    int n_stop;
    const int32_t *eos_ids;      /* generation ends (finish stop) when one is sampled; not emitted */
    int n_eos;
    int decode_flags;            /* MS_TOK_DECODE_*: 0 keeps special tokens in the text (output parsers need them) */
    /* Test hook: emit these ids in order instead of sampling (the engine still
     * runs every step); when they run out the generation ends with finish stop.
     * NULL for normal sampling. */
    const int32_t *forced_ids;
    int n_forced;
    const ms_gen_constraint *constraint; /* NULL: free generation (borrowed until the run ends) */
    /* ms_generate only: a prompt of at least MS_GEN_PROGRESS_MIN tokens is prefilled in pieces of
     * MS_GEN_PROGRESS_CHUNK (as the server's chunked prefill), reported here ("prefill", tokens) when
     * at least MS_GEN_PROGRESS_MIN of them are new; NULL or no fn: in one piece. */
    const ms_progress *prefill_progress;
    ms_gen_logprob_fn logprob_fn;  /* NULL: none */
    int top_logprobs;              /* 0..MS_GEN_TOP_LOGPROBS_MAX alternatives per token for logprob_fn */
    /* 0: a greedy run whose ids need no logits (temperature 0; no penalties, logit_bias,
     * logprob_fn, constraint or forced ids) takes the engine's pick (ms_engine_decode_greedy:
     * on a device backend one id comes down instead of the logits), so ms_generator_logits is
     * NULL in its callbacks after the first token; the ids are the sampler's (the first largest
     * logit), but a NaN logit is not reported as an error there. 1: every step's logits come
     * to the host. */
    int host_logits;
} ms_gen_params;
#define MS_GEN_TOP_LOGPROBS_MAX 20

#define MS_GEN_PROGRESS_MIN 1024
#define MS_GEN_PROGRESS_CHUNK 256

/* Per-token callback: id is the sampled token (-1 for text released at the end:
 * a held-back partial stop string or an incomplete UTF-8 character); text/len
 * the new visible text (may be empty while a UTF-8 character or a possible
 * stop string is pending; NUL-terminated, valid during the call).
 * Return nonzero to stop generating (finish abort; e.g. the client went away). */
typedef int (*ms_gen_token_fn)(void *user, int32_t id, const char *text, size_t len);


typedef struct ms_gen_result {
    int prompt_tokens;     /* tokens of the prompt */
    int cached_tokens;     /* of which reused from the previous request's state */
    int completion_tokens; /* sampled tokens (including a final EOS) */
    ms_finish finish;
} ms_gen_result;

typedef struct ms_generator ms_generator;

/* A generator over engine e (borrowed, used by nobody else while the generator
 * lives) and tokenizer t (borrowed; NULL: ids only, the callback's text is
 * always empty and stop strings are refused). vocab: the model's vocabulary (logit
 * count). snaps may be NULL (copied). Errors: MS_ERR_ARG, MS_ERR_NOMEM. */
int ms_generator_new(ms_engine *e, const ms_tokenizer *t, int64_t vocab, const ms_gen_snapshots *snaps,
                     ms_generator **out, ms_err *err);
void ms_generator_free(ms_generator *g);
/* Forget the history (the next request prefills from scratch). */
void ms_generator_reset(ms_generator *g);
/* The canonical form of prompt[0..n): aligned (ms_gen_align) on the generator's history
 * and on the entries of the snapshot plug-in, the candidate that reuses the most tokens
 * (the history may be used in part; an entry only whole) gives its ids for the matched
 * span. *out (malloc'd) and *n_out receive it when it differs from the prompt (and fits
 * the context); else *out = NULL. ms_gen_run_new (so ms_generate) applies it itself;
 * a caller that prefills before (the server's chunked prefill) applies it first.
 * Errors: MS_ERR_NOMEM. */
int ms_generator_canon(ms_generator *g, const int32_t *prompt, int n, int32_t **out, int *n_out, ms_err *err);
/* Bring the engine to the state after prompt[0..n) and leave its last logits in
 * the generator. The common prefix with the history is reused: kept as is when
 * the prompt extends the history, else rolled back when the engine can
 * truncate; otherwise the engine is reset and the snapshot hook (if any) asked
 * for the longest saved prefix of prompt[0..n-1). The state is saved through
 * the hook after every prefill. *cached = tokens
 * reused. logits (may be NULL) receives [vocab] of the last prompt token.
 * Errors: MS_ERR_ARG (n < 1), those of ms_engine_forward (the history is then
 * forgotten and the engine reset). */
int ms_generator_prefill(ms_generator *g, const int32_t *prompt, int n, int *cached, float *logits, ms_err *err);
/* Prefill in pieces (what ms_generator_prefill does in one call): begin applies the
 * prefix reuse above (*cached = the tokens kept; errors as ms_generator_prefill
 * before feeding), then each continue feeds the next at most max_feed prompt tokens
 * (fewer up to a checkpoint, ms_gen_snapshots.every; *left = how many remain; at 0 the logits of the last prompt token are the
 * generator's and the snapshot hook has saved the state). Errors: MS_ERR_ARG
 * (nothing left to feed), those of ms_engine_forward (the history is then forgotten). */
int ms_generator_prefill_begin(ms_generator *g, const int32_t *prompt, int n, int *cached, ms_err *err);
int ms_generator_prefill_continue(ms_generator *g, const int32_t *prompt, int n, int max_feed, int *left, ms_err *err);
/* Prefill checkpoints this generator saved so far (ms_gen_snapshots.every / at_boundaries). */
int ms_generator_checkpoints(const ms_generator *g);
/* The engine (borrowed). */
ms_engine *ms_generator_engine(const ms_generator *g);
/* The caller forwarded id on the generator's engine itself (a batched decode step,
 * ms_engine_decode_batch): record it in the history, with logits [vocab] its
 * output row. Errors: MS_ERR_ARG (the engine does not hold exactly one token more
 * than the history; the history is then forgotten and the engine reset). */
int ms_generator_accept(ms_generator *g, int32_t id, const float *logits, ms_err *err);
/* Forward id (the feed_id of a greedy run, ms_gen_run_greedy) on the generator's engine and
 * take the engine's greedy pick of its successor (ms_engine_decode_greedy: no logits come down
 * on a device backend); the run's next ms_gen_run_next emits that pick. Where the engine cannot
 * pick (MS_ERR_UNSUPPORTED) id is forwarded with its logits as ms_generate feeds. Errors: the
 * engine's (the history is then forgotten and the engine reset). */
int ms_generator_decode_greedy(ms_generator *g, int32_t id, ms_err *err);

/* Run one request: prefill the prompt, then sample (only ids below the
 * tokenizer's vocabulary size when it is smaller than the model's) until an EOS id, a stop
 * string, max_tokens, the context end (finish length) or the callback asks to
 * stop (finish abort). Text goes through the streaming detokenizer and the stop
 * matcher before the callback sees it. res is filled on success.
 * Errors: MS_ERR_ARG (bad params, named), MS_ERR_LIMIT (prompt does not fit the
 * context), the engine's and tokenizer's errors. */
int ms_generate(ms_generator *g, const int32_t *prompt, int n, const ms_gen_params *p, ms_gen_token_fn fn,
                void *user, ms_gen_result *res, ms_err *err);
/* ms_generate one step at a time, for a caller that forwards the tokens itself (the
 * slot scheduler, session/slots.h, batches the decode steps of several runs):
 *   new      checks p as ms_generate does and sets up the sampler, stop matcher and
 *            detokenizer (prompt and p's arrays are borrowed until free)
 *   prefill  the prompt in pieces of at most max_feed tokens (*left: still to feed);
 *            the first call applies the prefix reuse (ms_generator_prefill_begin)
 *   next     after the prompt, or after the previous *feed_id was forwarded (and
 *            recorded: ms_generator_accept): sample from the generator's logits, pass
 *            the text to the callback, and either end (*done = 1, finish set) or give
 *            the id to forward next (*done = 0)
 *   finish   release the text held back (as ms_generate does at the end) and give the result
 * ms_generate is new, prefill (whole), next / forward until done, finish, free. */
typedef struct ms_gen_run ms_gen_run;
int ms_gen_run_new(ms_generator *g, const int32_t *prompt, int n, const ms_gen_params *p, ms_gen_token_fn fn,
                   void *user, ms_gen_run **out, ms_err *err);
int ms_gen_run_prefill(ms_gen_run *r, int max_feed, int *left, ms_err *err);
int ms_gen_run_next(ms_gen_run *r, int32_t *feed_id, int *done, ms_err *err);
int ms_gen_run_finish(ms_gen_run *r, ms_gen_result *res, ms_err *err);
void ms_gen_run_free(ms_gen_run *r);
/* The result so far (counts, finish), and the run's generator. */
const ms_gen_result *ms_gen_run_result(const ms_gen_run *r);
/* 1 when the run's ids need no logits (ms_gen_params.host_logits): its caller may forward each
 * *feed_id with ms_generator_decode_greedy instead of with the logits (ms_generate does). */
int ms_gen_run_greedy(const ms_gen_run *r);
ms_generator *ms_gen_run_generator(const ms_gen_run *r);

/* Tokens the engine currently holds (the history), and its length. */
const int32_t *ms_generator_history(const ms_generator *g, int *n);
/* The engine's context size. */
int ms_generator_max_ctx(const ms_generator *g);
/* The logits [vocab] of the last token fed (owned by the generator; valid until
 * the next prefill or generate). Inside an ms_generate callback for a sampled
 * id (id >= 0) they are the logits that id was drawn from. NULL when the last token went
 * through ms_generator_decode_greedy (the engine picked its successor; ms_gen_params.host_logits). */
const float *ms_generator_logits(const ms_generator *g);
/* The caller put the engine into the state after ids[0..n) (ms_engine_state_load,
 * ms_engine_restore): make that the history, so the next prefill reuses it. The
 * stored logits are not those of ids[n-1] (a prefill always feeds at least one
 * token). Errors: MS_ERR_ARG (n != the engine's n_past, n beyond the context, an
 * id outside the vocabulary); the history is then forgotten and the engine reset. */
int ms_generator_adopt(ms_generator *g, const int32_t *ids, int n, ms_err *err);

#endif
