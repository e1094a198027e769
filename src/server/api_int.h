/* api_int.h — internals shared by api.c (OpenAI chat/completions) and api_agent.c
 * (Anthropic Messages, OpenAI Responses): field getters that name the parameter on
 * failure, the common sampling fields, tool validation, and the response builder's
 * state. Not a public interface. */
#ifndef MS_SERVER_API_INT_H
#define MS_SERVER_API_INT_H

#include <cjson/cJSON.h>

#include "server/api.h"

#define BAD(param, ...) ms_api_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define UNSUPPORTED(param, ...) ms_api_fail(e, 400, "invalid_request_error", param, "unsupported_parameter", __VA_ARGS__)
#define NOMEM() ms_api_fail(e, 500, "server_error", NULL, NULL, "out of memory")

const char *ms_api_type_name(const cJSON *v);
/* Absent or null: MS_OK with *present 0 (out untouched). Wrong type or range: 400 naming key. */
int ms_api_get_number(const cJSON *root, const char *key, double lo, double hi, double *out, int *present, ms_api_error *e);
int ms_api_get_int(const cJSON *root, const char *key, int64_t lo, int64_t hi, int64_t *out, int *present, ms_api_error *e);
int ms_api_get_bool(const cJSON *root, const char *key, int *out, ms_api_error *e);
/* The fields every endpoint shares: model, stream, sampling, seed, max_tokens, refusals, stop. */
int ms_api_parse_common(const cJSON *root, ms_api_request *r, ms_api_error *e);
/* An OpenAI chat "tools" array (validated) and tool_choice "auto"/"none" (use_tools 0 for "none"):
 * added to render and r->tools_json. */
int ms_api_set_tools(const cJSON *tools, int use_tools, cJSON *render, ms_api_request *r, ms_api_error *e);
/* A response_format (chat) or text.format (Responses) object: text, json_object, json_schema
 * (the schema in f.json_schema.schema or f.schema; strict a boolean). Sets r->constrain. */
int ms_api_set_format(const cJSON *f, const char *param, ms_api_request *r, ms_api_error *e);
/* render_json from render (+ add_generation_prompt). */
int ms_api_finish_render(cJSON *render, ms_api_request *r, ms_api_error *e);
cJSON *ms_api_string_n(const char *s, size_t n);

/* ---- the Anthropic / Responses parsers (api_agent.c) ---- */
int ms_api_parse_messages(const cJSON *root, ms_api_request *r, ms_api_error *e);
int ms_api_parse_responses(const cJSON *root, ms_api_request *r, ms_api_error *e);

/* ---- the response builder ---- */
typedef struct agent_state {
    int started;         /* message_start / response.created sent */
    int open;            /* the block/item being written: 0 none, 1 reasoning, 2 text, 3 tool call */
    int n_items;         /* blocks/items finished or open (the next index) */
    cJSON *items;        /* finished content blocks (Anthropic) or output items (Responses) */
    char *acc;           /* the open block's text / arguments so far */
    size_t acc_len, acc_cap;
    char *ws;            /* trailing whitespace of a text block, held until more text comes */
    size_t ws_len, ws_cap;
    char item_id[64], call_id[96], name[256];
    int seq;             /* Responses: sequence_number */
    int n_calls;
    int out_tokens;
    char *stop_sequence; /* the stop string that ended the generation (owned) */
    char *echo;          /* Responses: the request fields echoed in the response object (JSON text) */
    cJSON *lp_text;      /* Responses with logprobs: the open output_text part's entries */
} agent_state;

struct ms_api_resp {
    ms_api_resp_opts o;
    char *id, *model;
    ms_outparse *parser;  /* chat-like kinds */
    ms_outmsg *msg;       /* chat-like kinds: the whole message (always collected but for chat stream) */
    char *text;           /* completion, non-stream */
    size_t text_len, text_cap;
    int sent_role, n_tool_calls;
    int deadline;         /* ms_api_resp_deadline: the final chunk / body says the deadline ended it */
    ms_api_sink sink;     /* during a call */
    void *user;
    int sink_rc;
    agent_state a;        /* MESSAGES, RESPONSES */
    cJSON *lp_pend, *lp_all; /* logprobs entries not yet sent (stream) / of the whole reply (api_logprobs.c) */
    int lp_chars;            /* completion: characters of the tokens so far (text_offset) */
};

/* ---- logprobs (api_logprobs.c) ---- */
/* logprobs / top_logprobs (chat: a boolean and 0..20; completions: logprobs 0..5; Responses:
 * top_logprobs 0..20 and include "message.output_text.logprobs") and logit_bias (chat,
 * completions: token id -> [-100, 100], ids inside r->vocab) into r and r->sampling; other kinds
 * refuse them. */
int ms_api_parse_logprobs(const cJSON *root, ms_api_request *r, ms_api_error *e);
/* choice.logprobs: the entries gathered so far (stream: since the last chunk), or null when the
 * request did not ask for them. */
void ms_api_resp_add_logprobs(ms_api_resp *r, cJSON *choice);
/* Responses: the entries recorded since the last call (an array, empty when none), detached. */
cJSON *ms_api_resp_take_logprobs(ms_api_resp *r);
void ms_api_resp_free_logprobs(ms_api_resp *r);

int ms_api_send_raw(ms_api_resp *r, const char *s, size_t len);
/* Parser events of MESSAGES / RESPONSES builders. */
int ms_api_agent_event(void *user, const ms_outev *ev);
int ms_api_agent_finish(ms_api_resp *r, ms_finish finish, int prompt_tokens, int completion_tokens, int cached_tokens);
void ms_api_agent_free(ms_api_resp *r);

#endif
