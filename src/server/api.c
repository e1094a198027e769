/* api.c — OpenAI request validation and response building. */
#include "server/api_int.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_template.h"
#include "util/json.h"

int ms_api_fail(ms_api_error *e, int status, const char *type, const char *param, const char *code, const char *fmt,
                ...) {
    e->status = status;
    e->type = type ? type : "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return MS_ERR_ARG;
}

char *ms_api_error_json(const ms_api_error *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    if (!o) { cJSON_Delete(root); return NULL; }
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "server_error");
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ---------------- requests ---------------- */

const char *ms_api_type_name(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

int ms_api_get_number(const cJSON *root, const char *key, double lo, double hi, double *out, int *present,
                      ms_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (present) *present = 0;
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (!cJSON_IsNumber(v)) return BAD(key, "'%s' must be a number, got %s", key, ms_api_type_name(v));
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return BAD(key, "'%s' must be in [%g, %g], got %g", key, lo, hi, v->valuedouble);
    *out = v->valuedouble;
    if (present) *present = 1;
    return MS_OK;
}

int ms_api_get_int(const cJSON *root, const char *key, int64_t lo, int64_t hi, int64_t *out, int *present,
                   ms_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (present) *present = 0;
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return BAD(key, "'%s' must be an integer, got %s", key, cJSON_IsNumber(v) ? "a fraction" : ms_api_type_name(v));
    if (!(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi))
        return BAD(key, "'%s' must be in [%lld, %lld], got %.17g", key, (long long)lo, (long long)hi, v->valuedouble);
    *out = (int64_t)v->valuedouble;
    if (present) *present = 1;
    return MS_OK;
}

int ms_api_get_bool(const cJSON *root, const char *key, int *out, ms_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (!cJSON_IsBool(v)) return BAD(key, "'%s' must be a boolean, got %s", key, ms_api_type_name(v));
    *out = cJSON_IsTrue(v);
    return MS_OK;
}

static int parse_stop(const cJSON *root, ms_api_request *r, ms_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!v || cJSON_IsNull(v)) return MS_OK;
    const cJSON *one[1] = {v};
    int n = 1;
    if (cJSON_IsArray(v)) n = cJSON_GetArraySize(v);
    else if (!cJSON_IsString(v)) return BAD("stop", "'stop' must be a string or an array of strings, got %s", ms_api_type_name(v));
    if (n > MS_STOP_MAX) return BAD("stop", "'stop' has %d strings; at most %d are supported", n, MS_STOP_MAX);
    const cJSON *it = cJSON_IsArray(v) ? v->child : one[0];
    for (int i = 0; i < n; i++, it = it->next) {
        if (!cJSON_IsString(it)) return BAD("stop", "'stop[%d]' must be a string, got %s", i, ms_api_type_name(it));
        size_t l = strlen(it->valuestring);
        if (l == 0 || l > MS_STOP_MAX_LEN)
            return BAD("stop", "'stop[%d]' must have 1 to %d bytes, got %zu", i, MS_STOP_MAX_LEN, l);
        if (!(r->stop[r->n_stop++] = strdup(it->valuestring))) return NOMEM();
    }
    return MS_OK;
}

/* Fields common to both endpoints: model, stream, sampling, stop, limits, and refusals. */
int ms_api_parse_common(const cJSON *root, ms_api_request *r, ms_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) return BAD("model", "'model' must be a string, got %s", ms_api_type_name(v));
        if (!(r->model = strdup(v->valuestring))) return NOMEM();
    }
    int rc;
    if ((rc = ms_api_get_bool(root, "stream", &r->stream, e))) return rc;
    v = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsObject(v)) return BAD("stream_options", "'stream_options' must be an object, got %s", ms_api_type_name(v));
        if (!r->stream) return BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
        if ((rc = ms_api_get_bool(v, "include_usage", &r->include_usage, e))) return rc;
    }
    ms_sampler_params *s = &r->sampling;
    ms_sampler_defaults(s);
    double d;
    int has;
    if ((rc = ms_api_get_number(root, "temperature", 0, 2, &s->temperature, NULL, e))) return rc;
    if ((rc = ms_api_get_number(root, "top_p", 0, 1, &d, &has, e))) return rc;
    if (has) {
        if (d == 0) s->top_k = 1; /* the smallest set with mass >= 0: the most likely token */
        else s->top_p = d;
    }
    if ((rc = ms_api_get_number(root, "min_p", 0, 1, &s->min_p, NULL, e))) return rc;
    if ((rc = ms_api_get_number(root, "presence_penalty", -2, 2, &s->presence_penalty, NULL, e))) return rc;
    if ((rc = ms_api_get_number(root, "frequency_penalty", -2, 2, &s->frequency_penalty, NULL, e))) return rc;
    if ((rc = ms_api_get_number(root, "repetition_penalty", 1e-3, 100, &s->repetition_penalty, NULL, e))) return rc;
    int64_t k;
    if ((rc = ms_api_get_int(root, "top_k", -1, INT32_MAX, &k, &has, e))) return rc;
    if (has && k > 0 && !(s->top_k == 1)) s->top_k = (int)k; /* -1 and 0: off (vLLM's convention) */
    int64_t seed;
    if ((rc = ms_api_get_int(root, "seed", INT64_MIN, INT64_MAX, &seed, &r->has_seed, e))) return rc;
    if (r->has_seed) s->seed = (uint64_t)seed;
    int64_t mt = 0, mct = 0;
    int has_mt, has_mct;
    if ((rc = ms_api_get_int(root, "max_tokens", 1, INT32_MAX, &mt, &has_mt, e))) return rc;
    if ((rc = ms_api_get_int(root, "max_completion_tokens", 1, INT32_MAX, &mct, &has_mct, e))) return rc;
    r->max_tokens = (int)(has_mct ? mct : has_mt ? mt : 0);
    int64_t n = 1;
    if ((rc = ms_api_get_int(root, "n", 1, 128, &n, NULL, e))) return rc;
    if (n != 1) return UNSUPPORTED("n", "'n' must be 1: this server generates one choice per request");
    if ((rc = ms_api_get_int(root, "best_of", 1, 128, &n, &has, e))) return rc;
    if (has && n != 1) return UNSUPPORTED("best_of", "'best_of' must be 1");
    if ((rc = ms_api_parse_logprobs(root, r, e))) return rc;
    if ((rc = ms_api_get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, e))) return rc;
    v = cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) return BAD("reasoning_effort", "'reasoning_effort' must be a string, got %s", ms_api_type_name(v));
        if (!(r->reasoning_effort = strdup(v->valuestring))) return NOMEM();
        r->effort_param = "reasoning_effort";
    }
    return parse_stop(root, r, e);
}

/* Message content: a string, null, or an array of {"type":"text","text":...} parts (joined). */
static int normalize_content(cJSON *msg, int i, ms_api_error *e) {
    cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (!c || cJSON_IsNull(c) || cJSON_IsString(c)) return MS_OK;
    if (!cJSON_IsArray(c)) return BAD(param, "'%s' must be a string, an array of content parts or null, got %s", param, ms_api_type_name(c));
    size_t len = 0;
    const cJSON *p;
    int j = 0;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        if (!cJSON_IsObject(p) || !cJSON_IsString(t))
            return BAD(param, "'%s[%d]' must be an object with a string 'type'", param, j);
        if (strcmp(t->valuestring, "text"))
            return UNSUPPORTED(param, "'%s[%d]': content parts of type '%s' are not supported (text only)", param, j,
                               t->valuestring);
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(tx)) return BAD(param, "'%s[%d].text' must be a string", param, j);
        len += strlen(tx->valuestring);
        j++;
    }
    char *joined = malloc(len + 1), *w = joined;
    if (!joined) return NOMEM();
    cJSON_ArrayForEach(p, c) {
        const char *s = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t l = strlen(s);
        memcpy(w, s, l);
        w += l;
    }
    *w = 0;
    cJSON *ns = cJSON_CreateString(joined);
    free(joined);
    if (!ns) return NOMEM();
    cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", ns);
    return MS_OK;
}

static int check_tool_calls(const cJSON *msg, int i, ms_api_error *e) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    char param[64];
    snprintf(param, sizeof param, "messages[%d].tool_calls", i);
    if (!tc || cJSON_IsNull(tc)) return MS_OK;
    if (!cJSON_IsArray(tc)) return BAD(param, "'%s' must be an array, got %s", param, ms_api_type_name(tc));
    const cJSON *c;
    int j = 0;
    cJSON_ArrayForEach(c, tc) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!cJSON_IsObject(c) || !cJSON_IsObject(f) || !cJSON_IsString(name))
            return BAD(param, "'%s[%d]' must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}",
                       param, j);
        if (args && !cJSON_IsString(args) && !cJSON_IsObject(args))
            return BAD(param, "'%s[%d].function.arguments' must be a JSON string", param, j);
        j++;
    }
    return MS_OK;
}

static int parse_messages(const cJSON *root, cJSON *render, ms_api_error *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs) return BAD("messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return BAD("messages", "'messages' must be an array, got %s", ms_api_type_name(msgs));
    if (!msgs->child) return BAD("messages", "'messages' must not be empty");
    cJSON *copy = cJSON_Duplicate(msgs, 1);
    if (!copy) return NOMEM();
    cJSON_AddItemToObject(render, "messages", copy);
    int i = 0;
    cJSON *m;
    cJSON_ArrayForEach(m, copy) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return BAD(param, "'%s' must be an object, got %s", param, ms_api_type_name(m));
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role)) return BAD(param, "'%s' must be a string", param);
        const char *rs = role->valuestring;
        if (!strcmp(rs, "developer")) { /* OpenAI's newer name for system; templates know "system" */
            cJSON *sys = cJSON_CreateString("system");
            if (!sys) return NOMEM();
            cJSON_ReplaceItemInObjectCaseSensitive(m, "role", sys); /* frees the old string */
            rs = "system";
        } else if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool")) {
            return BAD(param, "'%s' must be one of system, developer, user, assistant, tool; got '%.64s'", param, rs);
        }
        int rc = normalize_content(m, i, e);
        if (rc) return rc;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        int is_asst = !strcmp(rs, "assistant");
        if ((!c || cJSON_IsNull(c)) && !is_asst) {
            snprintf(param, sizeof param, "messages[%d].content", i);
            return BAD(param, "'%s' is required for role '%s'", param, rs);
        }
        if (!c) {
            /* a tool-only assistant turn with no "content": as OpenAI returns it, null (templates test
             * it with "is none"; ms_api_render_chat renders it as "" where a template needs a string) */
            cJSON *none = cJSON_CreateNull();
            if (!none) return NOMEM();
            cJSON_AddItemToObject(m, "content", none);
        }
        if (is_asst && (rc = check_tool_calls(m, i, e))) return rc;
        if (!strcmp(rs, "tool")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
            snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
            if (id && !cJSON_IsString(id)) return BAD(param, "'%s' must be a string", param);
        }
        i++;
    }
    return MS_OK;
}

static int parse_tools(const cJSON *root, cJSON *render, ms_api_request *r, ms_api_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    int use_tools = 1;
    if (choice && !cJSON_IsNull(choice)) {
        if (cJSON_IsString(choice)) {
            if (!strcmp(choice->valuestring, "none")) use_tools = 0;
            else if (!strcmp(choice->valuestring, "required")) {
                r->constrain = MS_API_CONSTRAIN_TOOL;
                r->constrain_param = "tool_choice";
            } else if (strcmp(choice->valuestring, "auto"))
                return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or an object, got \"%.64s\"",
                           choice->valuestring);
        } else if (cJSON_IsObject(choice)) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(choice, "type"), *f = cJSON_GetObjectItemCaseSensitive(choice, "function"),
                        *n = cJSON_GetObjectItemCaseSensitive(f, "name");
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(n))
                return BAD("tool_choice", "'tool_choice' object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
            r->constrain = MS_API_CONSTRAIN_TOOL;
            r->constrain_param = "tool_choice";
            if (!(r->forced_tool = strdup(n->valuestring))) return NOMEM();
        } else {
            return BAD("tool_choice", "'tool_choice' must be a string or an object, got %s", ms_api_type_name(choice));
        }
    }
    return ms_api_set_tools(tools, use_tools, render, r, e);
}

int ms_api_set_tools(const cJSON *tools, int use_tools, cJSON *render, ms_api_request *r, ms_api_error *e) {
    if (!tools || cJSON_IsNull(tools)) return MS_OK;
    if (!cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array, got %s", ms_api_type_name(tools));
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        char param[64];
        snprintf(param, sizeof param, "tools[%d]", i);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return BAD(param, "'%s' must be an object with \"type\": \"function\"", param);
        if (!cJSON_IsObject(f) || !cJSON_IsString(name) || !name->valuestring[0])
            return BAD(param, "'%s.function' must be an object with a non-empty string 'name'", param);
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (ps && !cJSON_IsNull(ps) && !cJSON_IsObject(ps))
            return BAD(param, "'%s.function.parameters' must be a JSON Schema object", param);
        i++;
    }
    if (!i || !use_tools) return MS_OK;
    cJSON *copy = cJSON_Duplicate(tools, 1);
    if (!copy) return NOMEM();
    cJSON_AddItemToObject(render, "tools", copy);
    if (!(r->tools_json = cJSON_PrintUnformatted(tools))) return NOMEM();
    return MS_OK;
}

/* render_json with every null assistant "content" replaced by "" (malloc'd), or NULL when it has none
 * (or on a parse failure / no memory: the caller keeps the first render's error). */
static char *null_contents_emptied(const char *render_json) {
    cJSON *root = cJSON_Parse(render_json);
    const cJSON *msgs = root ? cJSON_GetObjectItemCaseSensitive(root, "messages") : NULL;
    int changed = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant") || !cJSON_IsNull(c)) continue;
        cJSON *empty = cJSON_CreateString("");
        if (!empty || !cJSON_ReplaceItemInObjectCaseSensitive((cJSON *)m, "content", empty)) {
            cJSON_Delete(empty);
            changed = 0;
            break;
        }
        changed = 1;
    }
    char *out = changed ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return out;
}

int ms_api_render_chat(const char *dir, const char *render_json, char **out, size_t *out_len, ms_err *err) {
    int rc = ms_chat_render(dir, render_json, strlen(render_json), out, out_len, err);
    if (rc != MS_ERR_FORMAT) return rc;
    char *alt = null_contents_emptied(render_json);
    if (!alt) return rc;
    ms_err e2 = {0};
    int rc2 = ms_chat_render(dir, alt, strlen(alt), out, out_len, &e2);
    free(alt);
    return rc2 ? rc : MS_OK; /* the first error names the template's complaint about the null */
}

int ms_api_finish_render(cJSON *render, ms_api_request *r, ms_api_error *e) {
    cJSON_AddBoolToObject(render, "add_generation_prompt", 1);
    if (!(r->render_json = cJSON_PrintUnformatted(render))) return NOMEM();
    return MS_OK;
}

static int parse_chat(const cJSON *root, ms_api_request *r, ms_api_error *e) {
    cJSON *render = cJSON_CreateObject();
    if (!render) return NOMEM();
    int rc = parse_messages(root, render, e);
    if (!rc) rc = parse_tools(root, render, r, e);
    if (!rc) {
        const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
        if (rf && !cJSON_IsNull(rf)) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
            if (!cJSON_IsObject(rf) || !cJSON_IsString(ty)) rc = BAD("response_format", "'response_format' must be an object with a string 'type'");
            else rc = ms_api_set_format(rf, "response_format", r, e);
        }
    }
    if (!rc) {
        const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
        if (kw && !cJSON_IsNull(kw)) {
            if (!cJSON_IsObject(kw)) rc = BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
            else {
                cJSON *c = cJSON_Duplicate(kw, 1);
                if (!c) rc = NOMEM();
                else cJSON_AddItemToObject(render, "chat_template_kwargs", c);
            }
        }
    }
    if (!rc) rc = ms_api_finish_render(render, r, e);
    cJSON_Delete(render);
    return rc;
}

static int parse_ids(const cJSON *arr, int64_t vocab, ms_api_request *r, ms_api_error *e) {
    int n = cJSON_GetArraySize(arr);
    if (!n) return BAD("prompt", "'prompt' must not be empty");
    if (!(r->prompt_ids = malloc((size_t)n * sizeof *r->prompt_ids))) return NOMEM();
    const cJSON *x;
    int i = 0;
    cJSON_ArrayForEach(x, arr) {
        if (!ms_json_is_int(x, 0, vocab - 1))
            return BAD("prompt", "'prompt[%d]' must be a token id in [0, %lld)", i, (long long)vocab);
        r->prompt_ids[i++] = (int32_t)x->valuedouble;
    }
    r->n_prompt_ids = n;
    return MS_OK;
}

static int parse_completion(const cJSON *root, int64_t vocab, ms_api_request *r, ms_api_error *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p || cJSON_IsNull(p)) return BAD("prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child; /* a batch of one */
    if (cJSON_IsString(p)) {
        if (!p->valuestring[0]) return BAD("prompt", "'prompt' must not be empty");
        if (!(r->prompt_text = strdup(p->valuestring))) return NOMEM();
    } else if (cJSON_IsArray(p)) {
        if (p->child && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
            return UNSUPPORTED("prompt", "'prompt' with several prompts is not supported: send one per request");
        int rc = parse_ids(p, vocab, r, e);
        if (rc) return rc;
    } else {
        return BAD("prompt", "'prompt' must be a string or an array of token ids, got %s", ms_api_type_name(p));
    }
    int echo = 0, rc;
    if ((rc = ms_api_get_bool(root, "echo", &echo, e))) return rc;
    if (echo) return UNSUPPORTED("echo", "'echo' is not supported by this server");
    const cJSON *sfx = cJSON_GetObjectItemCaseSensitive(root, "suffix");
    if (sfx && !cJSON_IsNull(sfx)) return UNSUPPORTED("suffix", "'suffix' is not supported by this server");
    return MS_OK;
}

/* UTF-8 (RFC 3629: no overlongs, surrogates or code points past U+10FFFF) and nesting depth,
 * before cJSON sees the body: its own limit is 1000 levels and its error says only "invalid". */
int ms_api_check_json(const char *body, size_t len, ms_api_error *e) {
    const unsigned char *b = (const unsigned char *)body;
    for (size_t i = 0; i < len;) {
        unsigned c = b[i];
        size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        int ok = n && i + n <= len && !(n == 2 && c < 0xc2) && !(n == 4 && c > 0xf4);
        for (size_t k = 1; ok && k < n; k++) ok = (b[i + k] & 0xc0) == 0x80;
        if (ok && n == 3) ok = !(c == 0xe0 && b[i + 1] < 0xa0) && !(c == 0xed && b[i + 1] >= 0xa0);
        if (ok && n == 4) ok = !(c == 0xf0 && b[i + 1] < 0x90) && !(c == 0xf4 && b[i + 1] >= 0x90);
        if (!ok || c == 0) return BAD(NULL, c ? "the request body is not valid UTF-8 (byte %zu)" : "the request body has a NUL byte (byte %zu)", i);
        i += n;
    }
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > MS_API_MAX_DEPTH)
                return BAD(NULL, "the request body is nested too deeply (limit %d)", MS_API_MAX_DEPTH);
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return MS_OK;
}

int ms_api_parse_request(ms_api_kind kind, const char *body, size_t len, int64_t vocab, ms_api_request *r,
                         ms_api_error *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->vocab = vocab;
    r->thinking = -1;
    r->parallel_tool_calls = 1;
    r->store = 1;
    if (!body || !len) return BAD(NULL, "the request body is empty: expected a JSON object");
    int rc = ms_api_check_json(body, len, e);
    if (rc) return rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) return BAD(NULL, "the request body is not valid JSON (near byte %td)", end ? end - body : (ptrdiff_t)0);
    size_t at = end ? (size_t)(end - body) : len;
    while (at < len && (body[at] == ' ' || body[at] == '\t' || body[at] == '\n' || body[at] == '\r')) at++;
    if (at < len) {
        cJSON_Delete(root);
        return BAD(NULL, "the request body has %zu trailing bytes after the JSON value (from byte %zu)", len - at, at);
    }
    if (!cJSON_IsObject(root)) rc = BAD(NULL, "the request body must be a JSON object, got %s", ms_api_type_name(root));
    else {
        rc = ms_api_parse_common(root, r, e);
        if (rc) {
        } else if (kind == MS_API_CHAT) rc = parse_chat(root, r, e);
        else if (kind == MS_API_COMPLETION) rc = parse_completion(root, vocab, r, e);
        else if (kind == MS_API_MESSAGES || kind == MS_API_COUNT_TOKENS) rc = ms_api_parse_messages(root, r, e);
        else if (kind == MS_API_RESPONSES) rc = ms_api_parse_responses(root, r, e);
        else rc = BAD(NULL, "unknown request kind");
    }
    cJSON_Delete(root);
    if (rc) ms_api_request_free(r);
    return rc;
}

void ms_api_request_free(ms_api_request *r) {
    free(r->model);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->render_json);
    free(r->tools_json);
    free(r->prompt_text);
    free(r->prompt_ids);
    free(r->reasoning_effort);
    free(r->previous_response_id);
    free(r->input_json);
    free(r->echo_json);
    free(r->schema_json);
    free(r->forced_tool);
    free(r->bias_ids);
    free(r->bias);
    memset(r, 0, sizeof *r);
}

/* ---------------- responses ---------------- */
int ms_api_resp_new(const ms_api_resp_opts *o, ms_api_resp **out, ms_err *err) {
    *out = NULL;
    ms_api_resp *r = calloc(1, sizeof *r);
    if (!r) return ms_fail(err, MS_ERR_NOMEM, "response: out of memory");
    r->o = *o;
    r->id = strdup(o->id ? o->id : "");
    r->model = strdup(o->model ? o->model : "");
    r->o.parse = NULL;
    int rc = (!r->id || !r->model) ? ms_fail(err, MS_ERR_NOMEM, "response: out of memory") : MS_OK;
    if (!rc && MS_API_IS_CHATLIKE(o->kind)) {
        rc = ms_outparse_new(o->fmt, o->parse, &r->parser, err);
        if (!rc && !(r->msg = ms_outmsg_new())) rc = ms_fail(err, MS_ERR_NOMEM, "response: out of memory");
    }
    r->o.echo_json = NULL;
    r->o.previous_response_id = NULL;
    if (!rc && (o->kind == MS_API_MESSAGES || o->kind == MS_API_RESPONSES)) {
        if (!(r->a.items = cJSON_CreateArray())) rc = ms_fail(err, MS_ERR_NOMEM, "response: out of memory");
        if (!rc && o->kind == MS_API_RESPONSES) {
            cJSON *echo = o->echo_json ? cJSON_Parse(o->echo_json) : cJSON_CreateObject();
            if (echo && o->previous_response_id) cJSON_AddStringToObject(echo, "previous_response_id", o->previous_response_id);
            char *es = echo ? cJSON_PrintUnformatted(echo) : NULL;
            cJSON_Delete(echo);
            if (!es) rc = ms_fail(err, MS_ERR_NOMEM, "response: out of memory");
            r->a.echo = es;
        }
    }
    if (rc) {
        ms_api_resp_free(r);
        return rc;
    }
    *out = r;
    return MS_OK;
}

void ms_api_resp_free(ms_api_resp *r) {
    if (!r) return;
    free(r->id);
    free(r->model);
    ms_outparse_free(r->parser);
    ms_outmsg_free(r->msg);
    free(r->text);
    ms_api_agent_free(r);
    ms_api_resp_free_logprobs(r);
    free(r);
}

int ms_api_send_raw(ms_api_resp *r, const char *s, size_t len) {
    int rc = r->sink(r->user, s, len);
    if (rc) r->sink_rc = rc;
    return rc;
}

/* Send `data: JSON\n\n` and free obj. */
static int send_event(ms_api_resp *r, cJSON *obj) {
    if (!obj) return r->sink_rc = MS_ERR_NOMEM;
    char *s = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (!s) return r->sink_rc = MS_ERR_NOMEM;
    size_t l = strlen(s);
    char *buf = malloc(l + 9);
    if (!buf) { free(s); return r->sink_rc = MS_ERR_NOMEM; }
    memcpy(buf, "data: ", 6);
    memcpy(buf + 6, s, l);
    memcpy(buf + 6 + l, "\n\n", 3);
    free(s);
    int rc = r->sink(r->user, buf, l + 8);
    free(buf);
    if (rc) r->sink_rc = rc;
    return rc;
}

/* A chunk skeleton with one choice whose delta/text the caller fills. */
static cJSON *chunk(ms_api_resp *r, cJSON **choice) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", r->id);
    cJSON_AddStringToObject(c, "object", r->o.kind == MS_API_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(c, "created", (double)r->o.created);
    cJSON_AddStringToObject(c, "model", r->model);
    cJSON_AddNullToObject(c, "system_fingerprint");
    cJSON *arr = cJSON_AddArrayToObject(c, "choices");
    if (choice) {
        *choice = cJSON_CreateObject();
        cJSON_AddNumberToObject(*choice, "index", 0);
        cJSON_AddItemToArray(arr, *choice);
    }
    if (r->o.include_usage) cJSON_AddNullToObject(c, "usage");
    return c;
}

static int chat_delta(ms_api_resp *r, cJSON *delta, const char *finish) {
    if (!r->sent_role && r->o.logprobs) {
        /* as OpenAI streams logprobs: the role in a chunk of its own, with empty content and
         * empty logprobs (the SDK's accumulator takes the first chunk's logprobs object as its
         * own and appends that chunk's entries to it: entries there would count twice) */
        cJSON *ch0, *c0 = chunk(r, &ch0), *d0 = cJSON_CreateObject(), *l0 = cJSON_CreateObject();
        cJSON_AddStringToObject(d0, "role", "assistant");
        cJSON_AddStringToObject(d0, "content", "");
        cJSON_AddItemToObject(ch0, "delta", d0);
        cJSON_AddItemToObject(l0, "content", cJSON_CreateArray());
        cJSON_AddNullToObject(l0, "refusal");
        cJSON_AddItemToObject(ch0, "logprobs", l0);
        cJSON_AddNullToObject(ch0, "finish_reason");
        r->sent_role = 1;
        int rc0 = send_event(r, c0);
        if (rc0) {
            cJSON_Delete(delta);
            return rc0;
        }
    }
    cJSON *choice, *c = chunk(r, &choice);
    if (!r->sent_role) {
        cJSON_AddStringToObject(delta, "role", "assistant");
        r->sent_role = 1;
    }
    cJSON_AddItemToObject(choice, "delta", delta);
    ms_api_resp_add_logprobs(r, choice);
    if (finish) cJSON_AddStringToObject(choice, "finish_reason", finish);
    else cJSON_AddNullToObject(choice, "finish_reason");
    if (finish && r->deadline) cJSON_AddTrueToObject(c, "deadline_exceeded");
    return send_event(r, c);
}

cJSON *ms_api_string_n(const char *s, size_t n) {
    char *t = malloc(n + 1);
    if (!t) return NULL;
    memcpy(t, s, n);
    t[n] = 0;
    cJSON *j = cJSON_CreateString(t);
    free(t);
    return j;
}

/* Parser events -> streamed chat chunks. */
static int on_event(void *user, const ms_outev *ev) {
    ms_api_resp *r = user;
    cJSON *d = cJSON_CreateObject();
    if (!d) return r->sink_rc = MS_ERR_NOMEM;
    switch (ev->type) {
    case MS_OUTEV_CONTENT:
    case MS_OUTEV_REASONING:
        if (!ev->len) { cJSON_Delete(d); return 0; }
        cJSON_AddItemToObject(d, ev->type == MS_OUTEV_CONTENT ? "content" : "reasoning_content", ms_api_string_n(ev->text, ev->len));
        break;
    case MS_OUTEV_TOOL_START: {
        r->n_tool_calls++;
        cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls"), *tc = cJSON_CreateObject(), *f = cJSON_CreateObject();
        cJSON_AddNumberToObject(tc, "index", ev->tool_index);
        cJSON_AddStringToObject(tc, "id", ev->tool_id ? ev->tool_id : "");
        cJSON_AddStringToObject(tc, "type", "function");
        cJSON_AddStringToObject(f, "name", ev->tool_name ? ev->tool_name : "");
        cJSON_AddStringToObject(f, "arguments", "");
        cJSON_AddItemToObject(tc, "function", f);
        cJSON_AddItemToArray(arr, tc);
        break;
    }
    case MS_OUTEV_TOOL_ARGS: {
        if (!ev->len) { cJSON_Delete(d); return 0; }
        cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls"), *tc = cJSON_CreateObject(), *f = cJSON_CreateObject();
        cJSON_AddNumberToObject(tc, "index", ev->tool_index);
        cJSON_AddItemToObject(f, "arguments", ms_api_string_n(ev->text, ev->len));
        cJSON_AddItemToObject(tc, "function", f);
        cJSON_AddItemToArray(arr, tc);
        break;
    }
    default:
        cJSON_Delete(d);
        return 0;
    }
    return chat_delta(r, d, NULL);
}

/* Parser events -> collected message, counting tool calls; streamed as chunks (chat) or
 * Anthropic / Responses events. parallel_tool_calls false: calls after the first are dropped. */
static int on_collect(void *user, const ms_outev *ev) {
    ms_api_resp *r = user;
    if (r->o.single_tool_call && (ev->type == MS_OUTEV_TOOL_START || ev->type == MS_OUTEV_TOOL_ARGS ||
                                      ev->type == MS_OUTEV_TOOL_END) && ev->tool_index > 0)
        return 0;
    if (ev->type == MS_OUTEV_TOOL_START) r->n_tool_calls++;
    int rc = ms_outmsg_collect(r->msg, ev);
    if (rc) return rc;
    if (r->o.kind == MS_API_MESSAGES || r->o.kind == MS_API_RESPONSES) return ms_api_agent_event(r, ev);
    if (r->o.stream) {
        if (ev->type == MS_OUTEV_TOOL_START) r->n_tool_calls--; /* on_event counts it */
        return on_event(r, ev);
    }
    return 0;
}

int ms_api_resp_text(ms_api_resp *r, const char *text, size_t len, ms_api_sink sink, void *user, ms_err *err) {
    r->sink = sink;
    r->user = user;
    r->sink_rc = 0;
    if (MS_API_IS_CHATLIKE(r->o.kind)) {
        int rc = ms_outparse_feed(r->parser, text, len, on_collect, r, err);
        if (r->sink_rc) return r->sink_rc;
        return rc;
    }
    if (!len) return MS_OK;
    if (r->o.stream) {
        cJSON *choice, *c = chunk(r, &choice);
        cJSON_AddItemToObject(choice, "text", ms_api_string_n(text, len));
        ms_api_resp_add_logprobs(r, choice);
        cJSON_AddNullToObject(choice, "finish_reason");
        return send_event(r, c);
    }
    if (r->text_len + len + 1 > r->text_cap) {
        size_t cap = r->text_cap ? r->text_cap : 256;
        while (cap < r->text_len + len + 1) cap *= 2;
        char *n = realloc(r->text, cap);
        if (!n) return ms_fail(err, MS_ERR_NOMEM, "response: out of memory");
        r->text = n;
        r->text_cap = cap;
    }
    memcpy(r->text + r->text_len, text, len);
    r->text_len += len;
    r->text[r->text_len] = 0;
    return MS_OK;
}

static cJSON *usage_json(int prompt, int completion, int cached) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", cached);
    return u;
}

int ms_api_resp_finish(ms_api_resp *r, ms_finish finish, int prompt_tokens, int completion_tokens, int cached_tokens,
                       ms_api_sink sink, void *user, ms_err *err) {
    r->sink = sink;
    r->user = user;
    r->sink_rc = 0;
    int rc;
    if (r->parser) {
        rc = ms_outparse_finish(r->parser, on_collect, r, err);
        if (r->sink_rc) return r->sink_rc;
        if (rc) return rc;
    }
    if (r->o.kind == MS_API_MESSAGES || r->o.kind == MS_API_RESPONSES) {
        rc = ms_api_agent_finish(r, finish, prompt_tokens, completion_tokens, cached_tokens);
        if (r->sink_rc) return r->sink_rc;
        return rc ? ms_fail(err, rc, "response: out of memory") : MS_OK;
    }
    const char *fin = finish == MS_FINISH_LENGTH ? "length" : "stop";
    if (r->n_tool_calls && finish == MS_FINISH_STOP) fin = "tool_calls";
    if (r->o.stream) {
        cJSON *choice, *c = chunk(r, &choice);
        if (r->o.kind == MS_API_CHAT) {
            cJSON_Delete(c);
            if ((rc = chat_delta(r, cJSON_CreateObject(), fin))) return rc;
        } else {
            cJSON_AddStringToObject(choice, "text", "");
            ms_api_resp_add_logprobs(r, choice);
            cJSON_AddStringToObject(choice, "finish_reason", fin);
            if (r->deadline) cJSON_AddTrueToObject(c, "deadline_exceeded");
            if ((rc = send_event(r, c))) return rc;
        }
        if (r->o.include_usage) {
            c = chunk(r, NULL);
            cJSON_ReplaceItemInObjectCaseSensitive(c, "usage", usage_json(prompt_tokens, completion_tokens, cached_tokens));
            if ((rc = send_event(r, c))) return rc;
        }
        static const char done[] = "data: [DONE]\n\n";
        return sink(user, done, sizeof done - 1);
    }
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", r->id);
    cJSON_AddStringToObject(c, "object", r->o.kind == MS_API_CHAT ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(c, "created", (double)r->o.created);
    cJSON_AddStringToObject(c, "model", r->model);
    cJSON_AddNullToObject(c, "system_fingerprint");
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddNumberToObject(choice, "index", 0);
    if (r->o.kind == MS_API_CHAT) {
        char *mj;
        if ((rc = ms_outmsg_json(r->msg, &mj, err))) { cJSON_Delete(c); cJSON_Delete(choice); return rc; }
        cJSON *m = cJSON_Parse(mj);
        free(mj);
        if (!m) { cJSON_Delete(c); cJSON_Delete(choice); return ms_fail(err, MS_ERR_NOMEM, "response: out of memory"); }
        cJSON_AddItemToObject(choice, "message", m);
    } else {
        cJSON_AddStringToObject(choice, "text", r->text ? r->text : "");
    }
    ms_api_resp_add_logprobs(r, choice);
    cJSON_AddStringToObject(choice, "finish_reason", fin);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(c, "choices"), choice);
    cJSON_AddItemToObject(c, "usage", usage_json(prompt_tokens, completion_tokens, cached_tokens));
    if (r->deadline) cJSON_AddTrueToObject(c, "deadline_exceeded");
    char *s = cJSON_PrintUnformatted(c);
    cJSON_Delete(c);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "response: out of memory");
    rc = sink(user, s, strlen(s));
    free(s);
    return rc;
}

int ms_api_resp_set_stop_sequence(ms_api_resp *r, const char *stop) {
    free(r->a.stop_sequence);
    r->a.stop_sequence = stop ? strdup(stop) : NULL;
    return stop && !r->a.stop_sequence ? MS_ERR_NOMEM : MS_OK;
}

char *ms_api_resp_message_json(ms_api_resp *r) {
    char *s = NULL;
    ms_err err;
    if (!r->msg || ms_outmsg_json(r->msg, &s, &err)) return NULL;
    return s;
}

const char *ms_api_resp_id(const ms_api_resp *r) { return r->id; }

const char *ms_api_anthropic_error_type(int status) {
    switch (status) {
    case 400: case 415: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: case 405: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
    }
}

char *ms_api_anthropic_error_json(const ms_api_error *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "type", "error");
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    if (!o) { cJSON_Delete(root); return NULL; }
    cJSON_AddStringToObject(o, "type", ms_api_anthropic_error_type(e->status));
    cJSON_AddStringToObject(o, "message", e->message);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

int ms_api_resp_stream_error_kind(ms_api_kind kind, const ms_api_error *e, ms_api_sink sink, void *user) {
    if (kind != MS_API_MESSAGES && kind != MS_API_RESPONSES) return ms_api_resp_stream_error(e, sink, user);
    char *j;
    if (kind == MS_API_MESSAGES) j = ms_api_anthropic_error_json(e);
    else {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "error");
        if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code);
        else cJSON_AddNullToObject(o, "code");
        cJSON_AddStringToObject(o, "message", e->message);
        if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
        else cJSON_AddNullToObject(o, "param");
        cJSON_AddNumberToObject(o, "sequence_number", 0);
        j = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
    }
    if (!j) return MS_ERR_NOMEM;
    size_t l = strlen(j);
    char *buf = malloc(l + 32);
    if (!buf) { free(j); return MS_ERR_NOMEM; }
    int n = snprintf(buf, l + 32, "event: error\ndata: %s\n\n", j);
    free(j);
    int rc = sink(user, buf, (size_t)n);
    free(buf);
    return rc;
}

void ms_api_resp_deadline(ms_api_resp *r) { r->deadline = 1; }

int ms_api_resp_stream_error(const ms_api_error *e, ms_api_sink sink, void *user) {
    char *j = ms_api_error_json(e);
    if (!j) return MS_ERR_NOMEM;
    size_t l = strlen(j);
    char *buf = malloc(l + 32);
    if (!buf) { free(j); return MS_ERR_NOMEM; }
    int n = snprintf(buf, l + 32, "data: %s\n\ndata: [DONE]\n\n", j);
    free(j);
    int rc = sink(user, buf, (size_t)n);
    free(buf);
    return rc;
}

void ms_api_scrub_paths(char *msg, const char *dir) {
    /* the model directory (as given, without trailing slashes) becomes "<model>" */
    size_t dl = dir ? strlen(dir) : 0;
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    if (dl) {
        char *p;
        while ((p = strstr(msg, dir)) && (p[dl] == 0 || p[dl] == '/' || p[dl] == ':' || p[dl] == ' ' || p[dl] == '\'' || p[dl] == '"')) {
            static const char rep[] = "<model>";
            size_t rl = sizeof rep - 1, tail = strlen(p + dl);
            if (rl > dl) break; /* never grows: the message buffer is fixed */
            memcpy(p, rep, rl);
            memmove(p + rl, p + dl, tail + 1);
        }
    }
    /* any other absolute path keeps only its last component */
    for (char *p = msg; *p; p++) {
        if (*p != '/' || (p > msg && p[-1] != ' ' && p[-1] != '\'' && p[-1] != '"' && p[-1] != '(')) continue;
        char *q = p, *last = NULL;
        while (*q && *q != ' ' && *q != ':' && *q != '\'' && *q != '"' && *q != ')' && *q != ',') {
            if (*q == '/') last = q;
            q++;
        }
        if (last && last > p) memmove(p, last + 1, strlen(last + 1) + 1);
    }
}
