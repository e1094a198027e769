/* xtml.h — built-in renderer for the XTML chat format (Kimi K3).
 *
 * Kimi K3 ships a Python chat encoder (encoding_k3.py) instead of a Jinja
 * template. This renderer reproduces the string that encoder's
 * build_chat_segments(...) joins to, byte for byte, as the K3 tokenizer's
 * apply_chat_template(tokenize=False) returns it.
 *
 * Request (the JSON object `moonshine render` reads):
 *   {"messages": [...], "tools"?: [...], "add_generation_prompt"?: bool,
 *    "chat_template_kwargs"?: {...}}
 * Mapping onto the encoder's parameters:
 *   messages               -> messages (must be a list; batched lists of lists are rejected)
 *   tools                  -> tools (absent or null = None)
 *   add_generation_prompt  -> add_generation_prompt (Python truthiness; absent = false,
 *                             as for every template `render` runs)
 *   chat_template_kwargs:
 *     thinking             -> thinking (truthiness); else enable_thinking; absent = true
 *     thinking_effort      -> thinking_effort ("low" | "high" | "max"; null = no effort
 *                             message); else reasoning_effort; absent = "max", the
 *                             default of the K3 tokenizer's apply_chat_template
 *     tool_choice          -> tool_choice ("required" / "none" add a system note)
 *     response_format      -> response_format ({"type": "json_object"} or
 *                             {"type": "json_schema", "json_schema": {"schema": ...}})
 *     response_schema      -> response_schema (overrides the schema of response_format)
 *     image_prompts        -> image_prompts (strings replacing image placeholders)
 *   other kwargs are ignored, as the encoder ignores them.
 * Messages with other roles (e.g. "developer") render nothing, as in the
 * encoder. Where the encoder would raise (unknown thinking effort, a tool
 * message whose tool cannot be named, arguments that are not a JSON object,
 * ...) this fails with a message. Where the encoder would print a Python
 * repr of a list or dict as text (a list as reasoning_content, a dict as a
 * name), this fails with MS_ERR_UNSUPPORTED instead. */
#ifndef MS_TEXT_XTML_H
#define MS_TEXT_XTML_H

#include <stddef.h>

#include "util/err.h"

/* Render the request (len bytes of JSON text, UTF-8) to the XTML prompt.
 * On success *out is a malloc'd NUL-terminated string the caller frees and
 * *out_len its length (the text never contains NUL unless the request had
 * \u0000). Errors: MS_ERR_FORMAT (malformed request or a message the encoder
 * rejects), MS_ERR_UNSUPPORTED, MS_ERR_LIMIT (output over 256 MiB or JSON
 * nested deeper than 512), MS_ERR_NOMEM; err names the message index. */
int ms_xtml_render(const char *request, size_t len, char **out, size_t *out_len, ms_err *err);

#endif
