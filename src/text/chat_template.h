/* chat_template.h — turn a chat request into the model's prompt text.
 *
 * A request is a JSON object {"messages": [...], "tools"?: [...],
 * "add_generation_prompt"?: bool, "chat_template_kwargs"?: {...}}.
 *
 * Renderer choice for a model directory (ms_chat_pick):
 *   1. DIR/additional_chat_templates/tool_use.jinja when the request has tools,
 *      DIR/chat_template.jinja (or additional_chat_templates/default.jinja),
 *      else `chat_template` in DIR/tokenizer_config.json (a string, or a list of
 *      {name, template}: "tool_use" when the request has tools and such a
 *      template exists, else "default") — rendered by the Jinja interpreter
 *      exactly as transformers' apply_chat_template does;
 *   2. otherwise the first built-in renderer (chat_builtin.c) that accepts DIR;
 *   3. otherwise an error saying the model ships no chat template.
 *
 * Template variables, as transformers passes them: messages, tools (None
 * when absent), documents (None), add_generation_prompt (default false),
 * the special tokens of tokenizer_config.json (bos_token, eos_token,
 * unk_token, pad_token, sep_token, cls_token, mask_token when set, as strings;
 * AddedToken objects give their "content"; transformers 5.17 passes no
 * additional_special_tokens), then every member of chat_template_kwargs.
 * An empty "messages" is an error, as in transformers. */
#ifndef MS_CHAT_TEMPLATE_H
#define MS_CHAT_TEMPLATE_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "util/err.h"

/* A built-in renderer for models that ship no Jinja template. */
typedef struct ms_chat_builtin {
    const char *name; /* short name for messages ("kimi-k3 xtml") */
    /* 1 when this renderer is the right one for the model in dir. tokenizer_config and
     * config are the parsed DIR/tokenizer_config.json and DIR/config.json (either may be NULL). */
    int (*accepts)(const char *dir, const cJSON *tokenizer_config, const cJSON *config);
    /* Render the request (a validated JSON object; request_json/len is its text, for
     * renderers that must see numbers as written) to a malloc'd NUL-terminated string. */
    int (*render)(const char *dir, const cJSON *request, const char *request_json, size_t len, char **out,
                  size_t *out_len, ms_err *err);
} ms_chat_builtin;

/* The built-in renderers, NULL-terminated (chat_builtin.c). */
extern const ms_chat_builtin *const ms_chat_builtins[];

typedef struct ms_chat_source {
    char *template_text;             /* Jinja source (malloc'd) when a template was found, else NULL */
    const char *template_origin;     /* "chat_template.jinja", "tokenizer_config.json", ... */
    const ms_chat_builtin *builtin;  /* else the built-in renderer */
} ms_chat_source;

/* Choose the renderer for dir given whether the request has tools.
 * Fills *src (free with ms_chat_source_free). Errors: MS_ERR_IO / MS_ERR_FORMAT
 * naming the file, MS_ERR_UNSUPPORTED when no renderer applies. */
int ms_chat_pick(const char *dir, int has_tools, ms_chat_source *src, ms_err *err);
void ms_chat_source_free(ms_chat_source *src);

/* Render request_json (len bytes) for the model in dir into a malloc'd,
 * NUL-terminated *out of *out_len bytes. Errors: MS_ERR_FORMAT for a bad
 * request ("request: ...") or a template error ("template line N: ..."),
 * plus those of ms_chat_pick. */
int ms_chat_render(const char *dir, const char *request_json, size_t len, char **out, size_t *out_len, ms_err *err);

/* Render request_json with the Jinja template template_text, taking special
 * tokens from tokenizer_config (parsed tokenizer_config.json, may be NULL).
 * Same output and errors as ms_chat_render. */
int ms_chat_render_jinja(const char *template_text, const cJSON *tokenizer_config, const char *request_json,
                         size_t len, char **out, size_t *out_len, ms_err *err);

#endif
