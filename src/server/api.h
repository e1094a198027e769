/* api.h — the OpenAI-compatible API without the HTTP: request validation and
 * response building (JSON bodies and SSE chunks).
 *
 * Requests (POST /v1/chat/completions and /v1/completions bodies) are parsed
 * into an ms_api_request: every field we read is type- and range-checked;
 * fields we cannot honour (n > 1, logprobs, images, a JSON Schema keyword the
 * grammar lacks, ...) are refused with an OpenAI-shaped
 * error naming the parameter, never silently ignored. Unknown fields are
 * ignored, as OpenAI-compatible servers do.
 *
 * A response builder turns generated text into the body: for chat, the text
 * goes through the model family's output parser (text/outparse.h), so
 * reasoning becomes `reasoning_content` and tool calls `tool_calls`. With
 * stream it produces `data: {...}\n\n` chunks ending in `data: [DONE]\n\n`.
 * Library code: statuses and error structs, never prints. */
#ifndef MS_SERVER_API_H
#define MS_SERVER_API_H

#include <stddef.h>
#include <stdint.h>

#include "session/generate.h"
#include "text/outparse.h"
#include "grammar/grammar.h"

/* CHAT: POST /v1/chat/completions; COMPLETION: /v1/completions; MESSAGES: Anthropic's
 * POST /v1/messages; COUNT_TOKENS: its /v1/messages/count_tokens (a MESSAGES body without
 * max_tokens, never generated); RESPONSES: OpenAI's POST /v1/responses. Every kind but
 * COMPLETION is rendered with the chat template from an internal OpenAI-style message list. */
typedef enum { MS_API_CHAT, MS_API_COMPLETION, MS_API_MESSAGES, MS_API_COUNT_TOKENS, MS_API_RESPONSES } ms_api_kind;
#define MS_API_KIND_COUNT 5
/* Whether a kind renders messages with the chat template (all but COMPLETION). */
#define MS_API_IS_CHATLIKE(k) ((k) != MS_API_COMPLETION)

/* An OpenAI error object plus its HTTP status. */
typedef struct ms_api_error {
    int status;        /* 400, 404, 405, 413, 500, 503 */
    const char *type;  /* "invalid_request_error", "not_found_error", "server_error", ... (static) */
    char param[64];    /* the offending parameter ("" = null) */
    char code[64];     /* machine code ("" = null) */
    char message[1024];
} ms_api_error;

/* Anthropic's error type for an HTTP status (400 invalid_request_error, 401 authentication_error,
 * 403 permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error,
 * 503 overloaded_error, else api_error). */
const char *ms_api_anthropic_error_type(int status);
/* The error in Anthropic's shape: {"type":"error","error":{"type","message"}} (malloc'd). */
char *ms_api_anthropic_error_json(const ms_api_error *e);

/* Fill e (status, type, param, code may be NULL) with a printf message; returns MS_ERR_ARG. */
int ms_api_fail(ms_api_error *e, int status, const char *type, const char *param, const char *code, const char *fmt,
                ...) __attribute__((format(printf, 6, 7)));
/* The error as JSON: {"error":{"message","type","param","code"}} (malloc'd; NULL when out of memory). */
char *ms_api_error_json(const ms_api_error *e);

#define MS_API_MAX_BODY (8u << 20) /* default request body limit (bytes) */
#define MS_API_MAX_DEPTH 64        /* JSON nesting limit of request bodies */

/* The body is UTF-8 without NUL bytes and nests at most MS_API_MAX_DEPTH arrays/objects
 * (else 400: "not valid UTF-8 (byte N)", "nested too deeply (limit 64)"). Done by
 * ms_api_parse_request; exposed for the server's other JSON endpoints. */
int ms_api_check_json(const char *body, size_t len, ms_api_error *e);
/* Remove server paths from an error message in place: the model directory becomes
 * "<model>", any other absolute path keeps its last component. */
void ms_api_scrub_paths(char *msg, const char *model_dir);

typedef struct ms_api_request {
    ms_api_kind kind;
    char *model;               /* requested model id (owned; may be NULL) */
    int stream, include_usage;
    ms_sampler_params sampling;
    int has_seed;              /* seed given (else the caller draws one) */
    int max_tokens;            /* 0: until the context is full */
    char *stop[MS_STOP_MAX];   /* owned */
    int n_stop;
    /* chat */
    char *render_json;         /* chat-template request {"messages","tools"?,"add_generation_prompt":true,
                                  "chat_template_kwargs"?} (owned) */
    char *tools_json;          /* the "tools" array as JSON (owned) or NULL */
    /* completion: exactly one of prompt_text / prompt_ids */
    char *prompt_text;         /* owned */
    int32_t *prompt_ids;       /* owned */
    int n_prompt_ids;
    /* reasoning switches (applied to render_json by ms_api_apply_reasoning) */
    char *reasoning_effort;    /* "none", "minimal", "low", "medium", "high", "max" as given (owned) or NULL */
    const char *effort_param;  /* the field it came from ("reasoning_effort", "reasoning.effort"; static) */
    int thinking;              /* -1 unset; 0 off, 1 on (Anthropic's "thinking": {"type": "disabled"/"enabled"}) */
    int parallel_tool_calls;   /* 1 (default): any number of calls; 0: only the first call is returned */
    /* Anthropic / Responses */
    int stream_usage;          /* always report usage (both APIs do) */
    char *previous_response_id;/* Responses: continue that stored response (owned) or NULL */
    int store;                 /* Responses: keep this response for previous_response_id (default 1) */
    char *input_json;          /* Responses: the input as internal messages, without instructions (owned) */
    int n_instructions;        /* Responses: leading messages of render_json that come from "instructions" (0/1) */
    char *echo_json;           /* Responses: {"instructions","tools","tool_choice",...} echoed in the response (owned) */
    /* constrained decoding: response_format / text.format, tool_choice required or named */
    int constrain;             /* MS_API_CONSTRAIN_* */
    char *schema_json;         /* SCHEMA: the JSON Schema (owned) */
    char *forced_tool;         /* TOOL: the function to call (owned), NULL: any of tools_json */
    const char *constrain_param; /* the field it came from ("response_format", "text.format", "tool_choice"; static) */
    /* logprobs (chat, completions, Responses) and logit_bias (chat, completions) */
    int64_t vocab;             /* the model's vocabulary (ms_api_parse_request's): bounds token ids */
    int logprobs;              /* report log-probabilities of the sampled tokens */
    int top_logprobs;          /* with that many alternatives (0..20) */
    int32_t *bias_ids;         /* logit_bias (owned; sampling.bias_ids / bias point here) */
    float *bias;
    int n_bias;
} ms_api_request;

enum { MS_API_CONSTRAIN_NONE, MS_API_CONSTRAIN_JSON_OBJECT, MS_API_CONSTRAIN_SCHEMA, MS_API_CONSTRAIN_TOOL };

/* The grammar of r's constraint (NULL when it has none) for a model family's output syntax
 * (fmt), over tok's special tokens (frame markers that are one special token become token
 * references; tok may be NULL: markers as text).
 *   JSON_OBJECT / SCHEMA: the document; harmony: inside <|channel|>final<|message|>; XTML:
 *     inside the response element (closing think first when the prompt opened it).
 *   TOOL: a call of the forced function (or of any of the tools; one or more with
 *     parallel_tool_calls, harmony one) in the family's frame: Qwen3 <tool_call>, DeepSeek V3 /
 *     V3.1 and Kimi K2 sections of special tokens, GLM and XTML key/value arguments, harmony's
 *     commentary channel to=functions.NAME ending in <|call|>; arguments bound to the function's
 *     parameter schema (none: an object without properties).
 * close_reasoning: the prompt opened a reasoning block; for <think> families *lead is then the
 * text to force first ("</think>\n\n", static; else NULL). Errors: 400 naming the unsupported
 * keyword and its JSON pointer (the grammar's message), a tool that is not in tools, a format
 * without tool-call syntax (think), a GLM argument whose type the syntax cannot carry. */
int ms_api_constraint_grammar(const ms_api_request *r, ms_outfmt fmt, const ms_tokenizer *tok, int close_reasoning,
                              struct ms_grammar **out, const char **lead, ms_api_error *e);
/* The same through a cache (NULL: none) keyed by every input of the grammar (the constraint,
 * schema, tools, forced name, parallel_tool_calls, fmt, close_reasoning): a repeated schema or
 * tool set reuses the compiled grammar and its warm mask caches. *out is a reference of the
 * caller's (ms_grammar_free). */
int ms_api_constraint_grammar_cached(struct ms_grammar_cache *cache, const ms_api_request *r, ms_outfmt fmt,
                                     const ms_tokenizer *tok, int close_reasoning, struct ms_grammar **out, const char **lead,
                                     ms_api_error *e);

/* How a model family turns reasoning on/off or sets its effort (chosen once per model). */
typedef enum {
    MS_REASONING_NO_SWITCH,      /* the template has none: valid values are accepted and change nothing */
    MS_REASONING_ENABLE_THINKING,/* chat_template_kwargs.enable_thinking (Qwen3, GLM, ...) */
    MS_REASONING_THINKING,       /* chat_template_kwargs.thinking (DeepSeek V3.1) */
    MS_REASONING_HARMONY,        /* chat_template_kwargs.reasoning_effort low/medium/high (gpt-oss) */
    MS_REASONING_XTML,           /* chat_template_kwargs.thinking + thinking_effort low/high/max (Kimi K3) */
} ms_api_reasoning;
/* The switch of a model: from its output format and chat template source (may be NULL). */
ms_api_reasoning ms_api_reasoning_for(ms_outfmt fmt, const char *template_text);
/* Apply r->reasoning_effort and r->thinking to r->render_json's chat_template_kwargs (a kwarg the
 * request set itself is kept). Mapping (docs/server.md): none/minimal turn thinking off (harmony:
 * low), low/medium/high/max turn it on with that effort where the family has efforts (XTML:
 * medium -> high; harmony: max -> high). Errors: 400 naming the accepted values. */
int ms_api_apply_reasoning(ms_api_request *r, ms_api_reasoning sw, ms_api_error *e);
/* Responses previous_response_id: put the stored conversation (a JSON array of internal messages)
 * before r's input in render_json (after the instructions). Errors: 400 (malformed), 500 (memory). */
int ms_api_prepend_messages(ms_api_request *r, const char *messages_json, ms_api_error *e);
/* Render a request's render_json with the chat template of the model in dir (ms_chat_render): as
 * sent, and when the template refuses it (MS_ERR_FORMAT) and an assistant turn has "content": null,
 * once more with those contents "" (templates that test the content as a string, e.g. Qwen3's
 * "'</think>' in content"; templates that test "is none", e.g. DeepSeek V3's, render a tool-only
 * turn's calls only from the null). The error is the first render's. */
int ms_api_render_chat(const char *dir, const char *render_json, char **out, size_t *out_len, ms_err *err);

/* Parse and validate a request body of len bytes (one JSON object; trailing
 * bytes other than whitespace are refused). vocab bounds token-id prompts.
 * An assistant message without content (missing) gets "content": null, as OpenAI sends it.  On failure e says why (status 400) and req holds nothing.
 * Returns MS_OK or MS_ERR_ARG (also for out of memory: e is then a 500). */
int ms_api_parse_request(ms_api_kind kind, const char *body, size_t len, int64_t vocab, ms_api_request *req,
                         ms_api_error *e);
void ms_api_request_free(ms_api_request *req);

/* ---- responses ---- */
/* Receives bytes of the response body (SSE chunks when streaming, the whole
 * JSON otherwise). Nonzero aborts (returned by the builder's functions). */
typedef int (*ms_api_sink)(void *user, const char *data, size_t len);

typedef struct ms_api_resp_opts {
    ms_api_kind kind;
    const char *id;          /* "chatcmpl-..." / "cmpl-..." */
    const char *model;       /* model id to report */
    int64_t created;         /* unix seconds */
    int stream, include_usage;
    ms_outfmt fmt;           /* chat: output format of the model family */
    int prompt_tokens;       /* MESSAGES (message_start's usage) */
    const char *echo_json;   /* RESPONSES: fields echoed in the response object (ms_api_request.echo_json) */
    const char *previous_response_id; /* RESPONSES */
    int single_tool_call;    /* 1 (parallel_tool_calls false): only the first tool call is reported */
    const ms_outparse_opts *parse; /* chat: parser options (start_in_reasoning, tools_json, id_seed); may be NULL */
    int logprobs;            /* chat, completion: choices carry logprobs (ms_api_resp_logprob's entries); Responses: output_text parts and their events do */
    const ms_tokenizer *tok; /* with logprobs: the tokens' text and bytes */
} ms_api_resp_opts;

typedef struct ms_api_resp ms_api_resp;

/* A builder for one response. Errors: those of ms_outparse_new, MS_ERR_NOMEM. */
int ms_api_resp_new(const ms_api_resp_opts *o, ms_api_resp **out, ms_err *err);
void ms_api_resp_free(ms_api_resp *r);
/* Generated text delta (any split). Streaming: chunks go to sink as soon as
 * the parser releases text (the first one carries the assistant role).
 * Errors: the parser's, or the sink's nonzero value. */
int ms_api_resp_text(ms_api_resp *r, const char *text, size_t len, ms_api_sink sink, void *user, ms_err *err);
/* End: finish ("stop"/"length"; "tool_calls" replaces "stop" when the message
 * has tool calls), usage counts. Streaming: the final chunk, the usage chunk
 * (include_usage) and `data: [DONE]`; otherwise the whole JSON body. */
int ms_api_resp_finish(ms_api_resp *r, ms_finish finish, int prompt_tokens, int completion_tokens, int cached_tokens,
                       ms_api_sink sink, void *user, ms_err *err);
/* One sampled token's log-probability and its top alternatives (ms_gen_logprob_fn's values),
 * reported with the text the token produces (streamed: in the next chunk sent). A no-op unless
 * opts.logprobs. MS_ERR_NOMEM. */
int ms_api_resp_logprob(ms_api_resp *r, int32_t id, float logprob, const int32_t *top_ids, const float *top_lps, int n_top);
/* MESSAGES: the stop string that ended the generation (stop_reason "stop_sequence"). Copied. */
int ms_api_resp_set_stop_sequence(ms_api_resp *r, const char *stop);
/* The assistant message produced (internal shape, as ms_outmsg_json: {"role":"assistant","content",
 * "reasoning_content"?,"tool_calls"?}; malloc'd) once finished; NULL for COMPLETION and a chat stream. */
char *ms_api_resp_message_json(ms_api_resp *r);
/* RESPONSES: the response id ("resp_..." from opts.id). */
const char *ms_api_resp_id(const ms_api_resp *r);
/* The request's deadline ended the reply (finish "length"): the body, or the stream's
 * chunk with the finish_reason, gets "deadline_exceeded": true. Call before finish. */
void ms_api_resp_deadline(ms_api_resp *r);
/* A streamed error after the stream started: `data: {"error":...}` and `data: [DONE]`. */
int ms_api_resp_stream_error(const ms_api_error *e, ms_api_sink sink, void *user);
/* The same for a kind: MESSAGES `event: error` (Anthropic's shape), RESPONSES `event: error`
 * ({"type":"error","code","message","param","sequence_number"}), else as above. */
int ms_api_resp_stream_error_kind(ms_api_kind kind, const ms_api_error *e, ms_api_sink sink, void *user);

#endif
