/* chat_builtin_xtml.c — the built-in XTML renderer (text/xtml.h) for Kimi K3
 * checkpoints, which ship a Python encoder instead of a Jinja template. */
#include <string.h>

#include "text/chat_template.h"
#include "text/xtml.h"

static int is_k3(const cJSON *cfg) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    if (cJSON_IsString(mt) && !strcmp(mt->valuestring, "kimi_k3")) return 1;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
    mt = cJSON_GetObjectItemCaseSensitive(tc, "model_type");
    return cJSON_IsString(mt) && !strcmp(mt->valuestring, "kimi_k3");
}

static int xtml_accepts(const char *dir, const cJSON *tokenizer_config, const cJSON *config) {
    return config && is_k3(config);
}

/* The raw request text is rendered, not the cJSON tree: the reference encoder
 * prints numbers as Python does (1.0 stays 1.0, big integers stay exact). */
static int xtml_render(const char *dir, const cJSON *request, const char *request_json, size_t len,
                       char **out, size_t *out_len, ms_err *err) {
    return ms_xtml_render(request_json, len, out, out_len, err);
}

const ms_chat_builtin ms_chat_builtin_xtml = {"kimi-k3 xtml", xtml_accepts, xtml_render};
