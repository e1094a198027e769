/* outparse.h — streaming parsers for generated text: reasoning and tool calls.
 *
 * A model's output interleaves its reasoning, the answer, and tool calls in a
 * format fixed by its chat template. This module splits that text while it is
 * generated: feed text deltas (any split, even inside a marker or a UTF-8
 * character) and receive events. A marker is never emitted as content: text
 * that could be the start of a marker is held back until it is decided.
 * Feeding a whole string at once or byte by byte yields the same concatenated
 * content, reasoning and tool calls.
 *
 * The text must include the special tokens (detokenized without skipping
 * them), since most markers are special tokens.
 *
 * Formats (as the official chat templates write them):
 *   THINK        reasoning in <think>…</think>, no tool calls
 *   DEEPSEEK_V3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>
 *   DEEPSEEK_V31 <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>
 *   QWEN3        <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>; the one "\n" the template
 *                writes between content and the first call is not content, so the parsed message
 *                renders back to the generated text (tests/unit/test_outparse_roundtrip.c)
 *   KIMI_K2      <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>…<|tool_calls_section_end|>
 *                (the id of the call is the "functions.NAME:IDX" head, as Kimi's template expects back)
 *   GLM          <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>, newlines between
 *                parts allowed (GLM 4.5/4.6 write them, 4.7/5 do not). V is the raw string for string
 *                values and JSON otherwise; a value is a string when the tool's schema says so, else
 *                when it is not valid JSON.
 *   HARMONY      gpt-oss: <|channel|>analysis<|message|>…<|end|> is reasoning, final (and commentary
 *                without a recipient) is content, and
 *                <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>
 *                is a tool call.
 *   XTML         Kimi K3: <|open|>think<|sep|>…<|close|>think<|sep|><|open|>response<|sep|>…<|close|>response<|sep|>
 *                <|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|><|open|>argument key="K"
 *                type="T"<|sep|>V<|close|>argument<|sep|>…<|close|>call<|sep|><|close|>tools<|sep|>, as
 *                encoding_k3.py writes it (or <|open|>json type="object"<|sep|>RAW<|close|>json<|sep|> for
 *                arguments that were not JSON). Its generation prompt ends inside <|open|>think<|sep|> when
 *                thinking is on: pass start_in_reasoning then.
 * Every format but HARMONY and XTML separates <think>…</think> reasoning (or the pair
 * given in the options, e.g. Kimi's ◁think▷…◁/think▷). */
#ifndef MS_TEXT_OUTPARSE_H
#define MS_TEXT_OUTPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef enum {
    MS_OUTFMT_THINK,
    MS_OUTFMT_DEEPSEEK_V3,
    MS_OUTFMT_DEEPSEEK_V31,
    MS_OUTFMT_QWEN3,
    MS_OUTFMT_KIMI_K2,
    MS_OUTFMT_GLM,
    MS_OUTFMT_HARMONY,
    MS_OUTFMT_XTML,
    MS_OUTFMT_COUNT
} ms_outfmt;

/* Format by name ("think", "deepseek_v3", "deepseek_v31", "qwen3", "kimi_k2",
 * "glm", "harmony", "xtml"); MS_ERR_ARG naming the known names otherwise. */
int ms_outfmt_from_name(const char *name, ms_outfmt *out, ms_err *err);
const char *ms_outfmt_name(ms_outfmt f);
/* The output format for a model directory's config.json model_type
 * (qwen3* -> qwen3, deepseek_v3 -> deepseek_v3, deepseek_v32/v4 -> deepseek_v31,
 * kimi_linear -> kimi_k2, kimi_k3 -> xtml, glm* -> glm, gpt_oss -> harmony,
 * otherwise think); text/outfmt.c. The server and chat both choose by it. */
ms_outfmt ms_outfmt_for_model_type(const char *model_type);

typedef struct ms_outparse_opts {
    /* The prompt ends inside reasoning (the template opened <think>): the
     * output starts as reasoning. See ms_outparse_prompt_opens_reasoning. */
    int start_in_reasoning;
    /* Reasoning markers; NULL = "<think>" / "</think>". */
    const char *reasoning_open, *reasoning_close;
    /* Tool-call ids are "call_" + 24 hex digits derived from this seed and the
     * call's index (Kimi uses the model's own ids). Pass a random seed per
     * request in a server; a fixed one gives reproducible ids. */
    uint64_t id_seed;
    /* Optional OpenAI "tools" array as JSON text (GLM: decides which argument
     * values are strings). Copied; NULL = none. */
    const char *tools_json;
    /* Longest block the parser buffers whole before deciding it (a GLM key or
     * value, an XTML value, a Qwen3 body in another layout), in bytes; a longer
     * one fails the parse with MS_ERR_LIMIT. 0 = 64 MiB. */
    size_t max_block;
} ms_outparse_opts;

typedef enum {
    MS_OUTEV_CONTENT,    /* text: a content delta */
    MS_OUTEV_REASONING,  /* text: a reasoning delta */
    MS_OUTEV_TOOL_START, /* tool_index, tool_id, tool_name: a call begins (name known) */
    MS_OUTEV_TOOL_ARGS,  /* tool_index, text: a delta of the call's arguments (JSON text) */
    MS_OUTEV_TOOL_END,   /* tool_index: the call's arguments are complete */
} ms_outev_type;

typedef struct ms_outev {
    ms_outev_type type;
    const char *text; /* not NUL-terminated; valid during the callback */
    size_t len;
    int tool_index;   /* 0-based, in order of appearance */
    const char *tool_id, *tool_name; /* NUL-terminated, TOOL_START only */
} ms_outev;

/* Event sink: return 0 to continue, nonzero to abort the feed (returned as is). */
typedef int (*ms_outev_fn)(void *user, const ms_outev *ev);

typedef struct ms_outparse ms_outparse;

/* New parser for one generated message. opts may be NULL (defaults).
 * Errors: MS_ERR_ARG (bad format or markers), MS_ERR_FORMAT (tools_json),
 * MS_ERR_NOMEM. Free with ms_outparse_free. */
int ms_outparse_new(ms_outfmt fmt, const ms_outparse_opts *opts, ms_outparse **out, ms_err *err);
void ms_outparse_free(ms_outparse *p);

/* Feed the next len bytes of generated text; events go to fn. Content and
 * reasoning deltas end on UTF-8 character boundaries. Errors: MS_ERR_NOMEM,
 * MS_ERR_LIMIT (a buffered block longer than opts.max_block; decided by the
 * block's length, so it fails the same however the text is split), or the
 * callback's nonzero value; after an error the parser only accepts
 * ms_outparse_free. */
int ms_outparse_feed(ms_outparse *p, const char *text, size_t len, ms_outev_fn fn, void *user,
                     ms_err *err);
/* End of generation: flush what was held back (an unfinished marker prefix is
 * content; an unterminated tool call is ended; a tool call whose name never
 * completed is given back as content). */
int ms_outparse_finish(ms_outparse *p, ms_outev_fn fn, void *user, ms_err *err);

/* True when the rendered prompt ends (trailing whitespace aside) with the
 * reasoning-open marker, i.e. the template opened reasoning for the model:
 * pass as start_in_reasoning. Markers as in opts (may be NULL). */
int ms_outparse_prompt_opens_reasoning(const char *prompt, size_t len, const ms_outparse_opts *opts);
/* The same for a format: XTML's prompt opens reasoning when it ends with
 * <|open|>think<|sep|> (Kimi K3 with thinking on; <|open|>response<|sep|> is
 * not), harmony's never does (the model writes its channel), every other
 * format's as above. A server renders the prompt, calls this and passes the
 * answer as opts.start_in_reasoning. */
int ms_outfmt_prompt_opens_reasoning(ms_outfmt fmt, const char *prompt, size_t len, const ms_outparse_opts *opts);

/* ---- collecting events into an OpenAI-style message ---- */
typedef struct ms_outmsg ms_outmsg;
ms_outmsg *ms_outmsg_new(void);
void ms_outmsg_free(ms_outmsg *m);
/* An ms_outev_fn: pass the ms_outmsg as user. */
int ms_outmsg_collect(void *user, const ms_outev *ev);
/* The message as JSON: {"role":"assistant","content":STRING|null,
 * "reasoning_content"?:STRING,"tool_calls"?:[{"id","type":"function",
 * "function":{"name","arguments"}}]}. *out is malloc'd. MS_ERR_NOMEM. */
int ms_outmsg_json(const ms_outmsg *m, char **out, ms_err *err);

/* Parse a whole generated text at once into that JSON (convenience). */
int ms_outparse_all(ms_outfmt fmt, const ms_outparse_opts *opts, const char *text, size_t len,
                    char **json_out, ms_err *err);

#endif
