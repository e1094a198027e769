/* web.h — the built-in chat page served at GET / (src/server/web/chat.html, embedded in
 * the binary at build time by the Makefile with xxd -i: no files are read at run time,
 * and the page loads no external assets). */
#ifndef MS_SERVER_WEB_H
#define MS_SERVER_WEB_H

#include <stddef.h>

/* The page's bytes (static) and length. */
const char *ms_web_chat_page(size_t *len);

#endif
