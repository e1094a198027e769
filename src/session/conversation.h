/* conversation.h — one chat conversation over an engine: messages, turns,
 * prefix reuse, and saved sessions (see docs/chat.md).
 *
 * A conversation owns the list of OpenAI-style messages (an optional system
 * message first, then user and assistant turns) and a generator over a
 * borrowed engine. A turn appends the user message, renders the whole
 * conversation with the model's chat template (add_generation_prompt true),
 * tokenizes the rendered text (special tokens recognized, nothing added) and
 * hands those ids to the generator, which forwards only what differs from
 * the tokens the engine already holds (rollback to the longest common
 * prefix). The reply streams through the model family's output parser
 * (reasoning, content, tool calls); the parsed assistant message is appended
 * to the messages, and the template decides on the next render what of it
 * (e.g. the reasoning) the model sees again.
 *
 * A saved conversation is two files written atomically: FILE (JSON: format,
 * version, the model's identity, the messages, and the name, token count and
 * token hash of the state file) and FILE.state (the engine's exact causal
 * state, engine/state.h). Loading validates both before anything changes.
 * Library code: statuses + ms_err, never prints. */
#ifndef MS_CHAT_CONVERSATION_H
#define MS_CHAT_CONVERSATION_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"
#include "session/generate.h"
#include "model/model.h"
#include "text/outparse.h"
#include "text/tokenizer.h"
#include "util/err.h"

#define MS_CONV_FORMAT "moonshine-chat"
#define MS_CONV_VERSION 1
#define MS_CONV_MAX_FILE ((size_t)256 << 20) /* largest conversation JSON loaded */
#define MS_CONV_MAX_MESSAGES 100000

/* Constrained replies (chat --json-schema / --grammar): called at every turn with the output
 * format and whether the rendered prompt opened a reasoning block; sets *g to the grammar the
 * reply must match (borrowed: the caller keeps it alive while the conversation lives; NULL:
 * free reply) and *lead to text forced before it (closing the reasoning block; NULL: none). */
typedef int (*ms_conv_constraint_fn)(void *user, ms_outfmt fmt, int opens_reasoning, ms_grammar **g, const char **lead,
                                     ms_err *err);

typedef struct ms_conv_opts {
    const char *model_dir;      /* chat template, config.json (model_type), EOS ids; copied */
    ms_model *model;            /* borrowed: vocabulary and identity (save/load) */
    ms_engine *engine;          /* borrowed; used by nobody else while the conversation lives */
    const ms_tokenizer *tok;    /* borrowed */
    const char *system;         /* system message text or NULL (copied) */
    const char *parser;         /* output format name (outparse.h) or NULL: from config.json's model_type
                                   (ms_outfmt_for_model_type, as the server chooses) */
    const char *template_kwargs;/* JSON object passed as chat_template_kwargs, or NULL (copied) */
    const ms_gen_snapshots *snaps; /* prefix reuse through snapshots (session/prefix_cache.h), or NULL (copied) */
    const ms_progress *prefill_progress; /* a long prompt's prefill reports to it (ms_gen_params), or NULL (borrowed) */
    const char *tools_json;     /* OpenAI "tools" array (JSON text) given to the template and the parser, or NULL (copied) */
    ms_conv_constraint_fn constraint; /* NULL: free replies */
    void *constraint_user;
} ms_conv_opts;

typedef struct ms_conv ms_conv;

/* A conversation over o's engine (reset: the engine starts empty). EOS ids are
 * those of config.json / generation_config.json plus the tokenizer's eos.
 * Errors: MS_ERR_ARG (missing engine/tokenizer/model, bad parser name, bad
 * template_kwargs), MS_ERR_FORMAT (config files), MS_ERR_NOMEM. */
int ms_conv_new(const ms_conv_opts *o, ms_conv **out, ms_err *err);
void ms_conv_free(ms_conv *c);

/* Streamed output of a turn; every member may be NULL. */
typedef struct ms_conv_sink {
    void *user;
    /* Parsed output as it is generated (content, reasoning, tool-call events).
     * Nonzero stops the generation (finish abort). */
    int (*event)(void *user, const ms_outev *ev);
    /* Each sampled id with the logits [vocab] it was drawn from (valid during the
     * call; NULL after a turn's first token when greedy ids are picked by the engine,
     * ms_gen_params.host_logits), before its text is parsed. Nonzero stops the generation
     * (finish abort). */
    int (*token)(void *user, int32_t id, const float *logits, int64_t vocab);
} ms_conv_sink;

typedef struct ms_conv_turn {
    char *message_json;       /* the assistant message appended to the conversation (malloc'd):
                                 {"role":"assistant","content":STRING,"reasoning_content"?,"tool_calls"?} */
    int prompt_tokens;        /* the rendered conversation's tokens */
    int cached_tokens;        /* of which the engine already held (not forwarded) */
    int completion_tokens;    /* sampled, including a final EOS */
    uint64_t forwarded_tokens;/* tokens the engine forwarded during the turn (prompt suffix + decode steps) */
    double prefill_s;         /* from the start of the turn to the first sampled token */
    double decode_s;          /* from the first sampled token to the end */
    ms_finish finish;         /* stop (EOS), length (max_tokens or context), abort (sink asked) */
} ms_conv_turn;
void ms_conv_turn_free(ms_conv_turn *t);

/* One turn: append {"role":"user","content":text}, render, tokenize, generate
 * at most max_tokens (>= 1) with sampling sp, parse, append the assistant
 * message (content "" rather than null: templates concatenate it). A turn
 * stopped by the sink keeps what was generated so far. On error the user
 * message is removed again and nothing is appended. res is filled on success
 * (free with ms_conv_turn_free). Errors: MS_ERR_ARG (text not UTF-8, bad
 * sampling), MS_ERR_LIMIT (the conversation no longer fits the context),
 * MS_ERR_FORMAT (template errors), the engine's, tokenizer's and parser's. */
int ms_conv_turn_run(ms_conv *c, const char *text, const ms_sampler_params *sp, int max_tokens,
                     const ms_conv_sink *sink, ms_conv_turn *res, ms_err *err);

/* A tool-result turn: append {"role":"tool","tool_call_id":ID,"name"?,"content":content}
 * answering a call of the last assistant message (tool_call_id NULL: its first call that no
 * tool message answers yet; the call's function name is added as "name"), then generate the
 * next reply as ms_conv_turn_run does. Errors: MS_ERR_ARG (no assistant tool call to answer,
 * an id that none of them has, content not UTF-8), then those of ms_conv_turn_run. */
int ms_conv_tool_turn_run(ms_conv *c, const char *tool_call_id, const char *content, const ms_sampler_params *sp,
                          int max_tokens, const ms_conv_sink *sink, ms_conv_turn *res, ms_err *err);

/* Render the conversation (with the generation prompt) as the next turn would
 * see it, without a new user message: *out malloc'd, NUL-terminated. Errors:
 * those of ms_chat_render (MS_ERR_FORMAT "request: messages is empty" when
 * there are no messages). */
int ms_conv_render(const ms_conv *c, char **out, size_t *len, ms_err *err);

/* The prompt ids of the last successful turn (owned by c; NULL, 0 before any). */
const int32_t *ms_conv_last_prompt(const ms_conv *c, int *n);
/* The messages as a JSON array (malloc'd). Errors: MS_ERR_NOMEM. */
int ms_conv_messages_json(const ms_conv *c, char **out, ms_err *err);
/* Number of messages (the system message included). */
int ms_conv_n_messages(const ms_conv *c);
/* The output format used to parse replies. */
ms_outfmt ms_conv_format(const ms_conv *c);
/* Tokens the engine holds now (the conversation's causal state). */
int ms_conv_n_past(const ms_conv *c);
/* The engine's context size. */
int ms_conv_max_ctx(const ms_conv *c);

/* Forget the turns (the system message stays). The engine keeps its state, so
 * the next turn reuses whatever prefix (e.g. the system prompt) still matches. */
void ms_conv_reset(ms_conv *c);
/* Replace the system message (text NULL or "": remove it); the turns stay.
 * Errors: MS_ERR_NOMEM. */
int ms_conv_set_system(ms_conv *c, const char *text, ms_err *err);

/* Save the messages to path and the engine's causal state to path + ".state",
 * each atomically (the state first). Errors: MS_ERR_ARG (path too long),
 * MS_ERR_IO, MS_ERR_NOMEM. */
int ms_conv_save(ms_conv *c, const char *path, ms_err *err);
/* Load a conversation saved by ms_conv_save: the JSON (format, version, this
 * model's identity, well-formed messages that render with this model's
 * template, a plain state file name next to it whose token ids hash to the
 * recorded value) and the state file (engine/state.h validates structure,
 * checksums, model identity and context) are checked before anything
 * changes: on any error the conversation and the engine are as they were.
 * Errors: MS_ERR_IO, MS_ERR_FORMAT (naming the field), MS_ERR_MISMATCH
 * (another model, a state file that is not this conversation's),
 * MS_ERR_LIMIT (context too small), MS_ERR_NOMEM. */
int ms_conv_load(ms_conv *c, const char *path, ms_err *err);

#endif
