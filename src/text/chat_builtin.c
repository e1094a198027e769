/* chat_builtin.c — the table of built-in chat renderers used when a model
 * ships no Jinja template (see chat_template.h). To add one: define an
 * ms_chat_builtin in its own file and list it here, before the NULL. */
#include "text/chat_template.h"

extern const ms_chat_builtin ms_chat_builtin_xtml; /* Kimi K3 (chat_builtin_xtml.c) */

const ms_chat_builtin *const ms_chat_builtins[] = {
    &ms_chat_builtin_xtml,
    NULL,
};
