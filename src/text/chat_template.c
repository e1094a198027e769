/* chat_template.c — pick a model's chat renderer and render requests with it. */
#include <stdlib.h>
#include <string.h>

#include "text/chat_template.h"
#include "text/jinja.h"
#include "util/fs.h"
#include "util/json.h"

#define MAX_CONFIG_BYTES ((size_t)64 << 20)

static int load_json_file(const char *dir, const char *name, cJSON **out, ms_err *err) {
    char path[4096];
    *out = NULL;
    if (ms_path_join(path, sizeof path, dir, name, err)) return err->code;
    if (!ms_file_exists(path)) return MS_OK;
    char *buf;
    size_t len;
    int rc = ms_read_file(path, MAX_CONFIG_BYTES, &buf, &len, err);
    if (rc) return rc;
    rc = ms_json_parse(buf, len, path, out, err);
    free(buf);
    return rc;
}

void ms_chat_source_free(ms_chat_source *src) {
    if (!src) return;
    free(src->template_text);
    memset(src, 0, sizeof *src);
}

int ms_chat_pick(const char *dir, int has_tools, ms_chat_source *src, ms_err *err) {
    memset(src, 0, sizeof *src);
    char path[4096];
    size_t len;
    /* transformers' save format for several templates: additional_chat_templates/NAME.jinja */
    if (has_tools) {
        if (ms_path_join(path, sizeof path, dir, "additional_chat_templates/tool_use.jinja", err)) return err->code;
        if (ms_file_exists(path)) {
            int rc = ms_read_file(path, (size_t)16 << 20, &src->template_text, &len, err);
            if (rc) return rc;
            src->template_origin = "additional_chat_templates/tool_use.jinja";
            return MS_OK;
        }
    }
    if (ms_path_join(path, sizeof path, dir, "chat_template.jinja", err)) return err->code;
    if (!ms_file_exists(path) && ms_path_join(path, sizeof path, dir, "additional_chat_templates/default.jinja", err) == MS_OK &&
        ms_file_exists(path)) {
        int rc = ms_read_file(path, (size_t)16 << 20, &src->template_text, &len, err);
        if (rc) return rc;
        src->template_origin = "additional_chat_templates/default.jinja";
        return MS_OK;
    }
    if (ms_path_join(path, sizeof path, dir, "chat_template.jinja", err)) return err->code;
    if (ms_file_exists(path)) {
        int rc = ms_read_file(path, (size_t)16 << 20, &src->template_text, &len, err);
        if (rc) return rc;
        src->template_origin = "chat_template.jinja";
        return MS_OK;
    }
    cJSON *tc = NULL, *cfg = NULL;
    int rc = load_json_file(dir, "tokenizer_config.json", &tc, err);
    if (rc) return rc;
    const cJSON *ct = tc ? cJSON_GetObjectItemCaseSensitive(tc, "chat_template") : NULL;
    if (ct && cJSON_IsString(ct)) {
        src->template_text = strdup(ct->valuestring);
        src->template_origin = "tokenizer_config.json";
    } else if (ct && cJSON_IsArray(ct)) {
        const char *want = NULL, *dflt = NULL, *tool = NULL;
        const cJSON *it;
        cJSON_ArrayForEach(it, ct) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "template");
            if (!cJSON_IsString(n) || !cJSON_IsString(t)) {
                cJSON_Delete(tc);
                return ms_fail(err, MS_ERR_FORMAT, "%s/tokenizer_config.json: chat_template list entries need string \"name\" and \"template\"", dir);
            }
            if (!strcmp(n->valuestring, "default")) dflt = t->valuestring;
            if (!strcmp(n->valuestring, "tool_use")) tool = t->valuestring;
        }
        want = (has_tools && tool) ? tool : dflt;
        if (!want) {
            cJSON_Delete(tc);
            return ms_fail(err, MS_ERR_FORMAT, "%s/tokenizer_config.json: several chat templates and none named \"default\"", dir);
        }
        src->template_text = strdup(want);
        src->template_origin = want == tool ? "tokenizer_config.json (tool_use)" : "tokenizer_config.json (default)";
    } else if (ct && !cJSON_IsNull(ct)) {
        cJSON_Delete(tc);
        return ms_fail(err, MS_ERR_FORMAT, "%s/tokenizer_config.json: chat_template must be a string or a list", dir);
    }
    if (src->template_text || src->template_origin) {
        cJSON_Delete(tc);
        if (!src->template_text) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
        return MS_OK;
    }
    rc = load_json_file(dir, "config.json", &cfg, err);
    if (rc) { cJSON_Delete(tc); return rc; }
    for (int i = 0; ms_chat_builtins[i]; i++)
        if (ms_chat_builtins[i]->accepts(dir, tc, cfg)) { src->builtin = ms_chat_builtins[i]; break; }
    cJSON_Delete(tc);
    cJSON_Delete(cfg);
    if (src->builtin) return MS_OK;
    return ms_fail(err, MS_ERR_UNSUPPORTED,
                   "%s: the model ships no chat template (no chat_template.jinja, no chat_template in "
                   "tokenizer_config.json) and no built-in renderer accepts it", dir);
}

/* A special token from tokenizer_config.json: a string or an AddedToken object. */
static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static int set_special_tokens(ms_jinja_vars *vars, const cJSON *tc, ms_err *err) {
    int rc = MS_OK;
    if (!tc) return rc;
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                                        "cls_token", "mask_token", NULL};
    for (int i = 0; names[i] && !rc; i++) {
        const char *t = token_text(cJSON_GetObjectItemCaseSensitive(tc, names[i]));
        if (t) rc = ms_jinja_vars_set_string(vars, names[i], t, err);
    }
    return rc;
}

static int check_request(const cJSON *req, ms_err *err) {
    if (!cJSON_IsObject(req)) return ms_fail(err, MS_ERR_FORMAT, "request: expected a JSON object");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (!cJSON_IsArray(m)) return ms_fail(err, MS_ERR_FORMAT, "request: \"messages\" must be an array");
    if (!cJSON_GetArraySize(m))
        return ms_fail(err, MS_ERR_FORMAT, "request: \"messages\" is empty (transformers refuses an empty conversation)");
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, m) {
        if (!cJSON_IsObject(it)) return ms_fail(err, MS_ERR_FORMAT, "request: messages[%d] must be an object", i);
        i++;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "tools");
    if (t && !cJSON_IsNull(t) && !cJSON_IsArray(t)) return ms_fail(err, MS_ERR_FORMAT, "request: \"tools\" must be an array");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(req, "add_generation_prompt");
    if (g && !cJSON_IsNull(g) && !cJSON_IsBool(g))
        return ms_fail(err, MS_ERR_FORMAT, "request: \"add_generation_prompt\" must be true or false");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs");
    if (k && !cJSON_IsNull(k)) {
        if (!cJSON_IsObject(k)) return ms_fail(err, MS_ERR_FORMAT, "request: \"chat_template_kwargs\" must be an object");
        static const char *const reserved[] = {"messages", "tools", "documents", "add_generation_prompt", NULL};
        for (int r = 0; reserved[r]; r++)
            if (cJSON_GetObjectItemCaseSensitive(k, reserved[r]))
                return ms_fail(err, MS_ERR_FORMAT, "request: chat_template_kwargs may not set \"%s\"", reserved[r]);
    }
    cJSON_ArrayForEach(it, req) {
        if (strcmp(it->string, "messages") && strcmp(it->string, "tools") && strcmp(it->string, "add_generation_prompt") &&
            strcmp(it->string, "chat_template_kwargs"))
            return ms_fail(err, MS_ERR_FORMAT, "request: unknown member \"%s\"", it->string);
    }
    return MS_OK;
}

static int render_jinja(const char *tpl_text, const char *origin, const cJSON *tok_config, const cJSON *req,
                        const char *json, size_t len, char **out, size_t *out_len, ms_err *err) {
    ms_jinja_tpl *tpl = NULL;
    int rc = ms_jinja_parse(tpl_text, strlen(tpl_text), &tpl, err);
    if (rc) return ms_wrap(err, "chat template from %s", origin);
    ms_jinja_vars *vars = ms_jinja_vars_new(NULL);
    if (!vars) { ms_jinja_free(tpl); return ms_fail(err, MS_ERR_NOMEM, "out of memory"); }
    int found = 0;
    rc = set_special_tokens(vars, tok_config, err);
    if (!rc) rc = ms_jinja_vars_set_json(vars, "messages", json, len, "messages", &found, err);
    if (!rc) rc = ms_jinja_vars_set_json(vars, "tools", json, len, "tools", &found, err);
    if (!rc && !found) rc = ms_jinja_vars_set_none(vars, "tools", err);
    if (!rc) rc = ms_jinja_vars_set_none(vars, "documents", err);
    if (!rc) {
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(req, "add_generation_prompt");
        rc = ms_jinja_vars_set_bool(vars, "add_generation_prompt", cJSON_IsTrue(g), err);
    }
    if (!rc) rc = ms_jinja_vars_set_json(vars, NULL, json, len, "chat_template_kwargs", &found, err);
    if (!rc) rc = ms_jinja_render(tpl, vars, out, out_len, err);
    ms_jinja_vars_free(vars);
    ms_jinja_free(tpl);
    return rc;
}

int ms_chat_render_jinja(const char *template_text, const cJSON *tokenizer_config, const char *request_json,
                         size_t len, char **out, size_t *out_len, ms_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    cJSON *req = NULL;
    int rc = ms_json_parse(request_json, len, "request", &req, err);
    if (rc) return rc;
    rc = check_request(req, err);
    if (!rc) rc = render_jinja(template_text, "the caller", tokenizer_config, req, request_json, len, out, out_len, err);
    cJSON_Delete(req);
    return rc;
}

int ms_chat_render(const char *dir, const char *request_json, size_t len, char **out, size_t *out_len, ms_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    cJSON *req = NULL;
    int rc = ms_json_parse(request_json, len, "request", &req, err);
    if (rc) return rc;
    rc = check_request(req, err);
    if (rc) { cJSON_Delete(req); return rc; }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
    ms_chat_source src;
    rc = ms_chat_pick(dir, tools && !cJSON_IsNull(tools), &src, err);
    if (!rc) {
        if (src.template_text) {
            cJSON *tc = NULL;
            rc = load_json_file(dir, "tokenizer_config.json", &tc, err);
            if (!rc) rc = render_jinja(src.template_text, src.template_origin, tc, req, request_json, len, out, out_len, err);
            if (rc && !strstr(err->msg, dir)) ms_wrap(err, "%s", dir);
            cJSON_Delete(tc);
        }
        else {
            size_t n = 0;
            rc = src.builtin->render(dir, req, request_json, len, out, &n, err);
            if (out_len) *out_len = n;
            if (rc) ms_wrap(err, "%s: built-in renderer %s", dir, src.builtin->name);
        }
    }
    ms_chat_source_free(&src);
    cJSON_Delete(req);
    return rc;
}
