/* web.c — the embedded chat page (build/gen/chat_page.h is xxd -i of src/server/web/chat.html). */
#include "server/web.h"

#include "chat_page.h"

const char *ms_web_chat_page(size_t *len) {
    *len = (size_t)chat_html_len;
    return (const char *)chat_html;
}
