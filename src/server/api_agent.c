/* api_agent.c — the Anthropic Messages API and the OpenAI Responses API over the chat path.
 *
 * Both requests are converted to the internal OpenAI-style message list (system, user,
 * assistant with reasoning_content and tool_calls, tool) that the chat template renders,
 * so generation, stop strings, prefix reuse and the output parsers are the chat
 * completions' own. Their responses are built from the same parser events by one state
 * machine: a block (Anthropic content block / Responses output item) opens at the first
 * non-whitespace reasoning or content text, or at a tool call's start, and closes when
 * another kind begins or the generation ends. Whitespace the template writes around
 * markers is trimmed from both ends of text and reasoning blocks (a whitespace-only
 * block is dropped), since both APIs report text blocks without it. Non-stream bodies
 * are the list of closed blocks; streams send each open/delta/close as it happens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api_int.h"

/* ---------------- helpers ---------------- */
static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Join a content value (a string, or an array of blocks whose type is in `types`, a
 * NUL-separated list ending in an empty string) into *out (malloc'd). */
static int join_text(const cJSON *c, const char *param, const char *types, const char *sep, char **out,
                     ms_api_error *e) {
    *out = NULL;
    if (cJSON_IsString(c)) return (*out = strdup(c->valuestring)) ? MS_OK : NOMEM();
    if (!c || cJSON_IsNull(c)) return (*out = strdup("")) ? MS_OK : NOMEM();
    if (!cJSON_IsArray(c)) return BAD(param, "'%s' must be a string or an array of text blocks, got %s", param, ms_api_type_name(c));
    size_t len = 0, sl = strlen(sep);
    const cJSON *p;
    int j = 0;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
        if (!cJSON_IsObject(p) || !cJSON_IsString(t)) return BAD(param, "'%s[%d]' must be an object with a string 'type'", param, j);
        int ok = 0;
        for (const char *ty = types; *ty; ty += strlen(ty) + 1) ok |= !strcmp(ty, t->valuestring);
        if (!ok) return UNSUPPORTED(param, "'%s[%d]': blocks of type '%.64s' are not supported here (text only)", param, j, t->valuestring);
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(tx)) return BAD(param, "'%s[%d].text' must be a string", param, j);
        len += strlen(tx->valuestring) + sl;
        j++;
    }
    char *s = malloc(len + 1), *w = s;
    if (!s) return NOMEM();
    j = 0;
    cJSON_ArrayForEach(p, c) {
        if (j++) { memcpy(w, sep, sl); w += sl; }
        const char *tx = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t l = strlen(tx);
        memcpy(w, tx, l);
        w += l;
    }
    *w = 0;
    *out = s;
    return MS_OK;
}

static cJSON *msg_new(const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content ? content : "");
    return m;
}

/* Append text to the assistant message's field (content or reasoning_content). */
static void msg_append(cJSON *m, const char *key, const char *text) {
    if (!text || !text[0]) return;
    cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
    if (!cJSON_IsString(v) || !v->valuestring[0]) {
        cJSON_DeleteItemFromObjectCaseSensitive(m, key);
        cJSON_AddStringToObject(m, key, text);
        return;
    }
    size_t a = strlen(v->valuestring), b = strlen(text);
    char *s = malloc(a + b + 1);
    if (!s) return;
    memcpy(s, v->valuestring, a);
    memcpy(s + a, text, b + 1);
    cJSON_ReplaceItemInObjectCaseSensitive(m, key, cJSON_CreateString(s));
    free(s);
}

static void msg_add_call(cJSON *m, const char *id, const char *name, const char *args) {
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!tc) tc = cJSON_AddArrayToObject(m, "tool_calls");
    cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    cJSON_AddItemToObject(c, "function", f);
    cJSON_AddItemToArray(tc, c);
}

/* tool_choice "required" / a named tool: the call is forced through a grammar in the model
 * family's tool-call syntax (ms_api_constraint_grammar). name NULL: any of the tools. */
static int forced_tool_choice(ms_api_request *r, const char *param, const char *name, ms_api_error *e) {
    r->constrain = MS_API_CONSTRAIN_TOOL;
    r->constrain_param = param;
    free(r->forced_tool);
    r->forced_tool = NULL;
    if (name && !(r->forced_tool = strdup(name))) return NOMEM();
    return MS_OK;
}

/* ---------------- Anthropic Messages ---------------- */
static int parse_stop_sequences(const cJSON *root, ms_api_request *r, ms_api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "stop_sequences");
    if (!v || cJSON_IsNull(v)) return MS_OK;
    if (!cJSON_IsArray(v)) return BAD("stop_sequences", "'stop_sequences' must be an array of strings, got %s", ms_api_type_name(v));
    int n = cJSON_GetArraySize(v);
    if (r->n_stop + n > MS_STOP_MAX) return BAD("stop_sequences", "'stop_sequences' has %d strings; at most %d are supported", n, MS_STOP_MAX);
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsString(it)) return BAD("stop_sequences", "'stop_sequences[%d]' must be a string, got %s", i, ms_api_type_name(it));
        size_t l = strlen(it->valuestring);
        if (l == 0 || l > MS_STOP_MAX_LEN)
            return BAD("stop_sequences", "'stop_sequences[%d]' must have 1 to %d bytes, got %zu", i, MS_STOP_MAX_LEN, l);
        if (!(r->stop[r->n_stop++] = strdup(it->valuestring))) return NOMEM();
        i++;
    }
    return MS_OK;
}

/* One Anthropic message -> internal messages appended to out. */
static int anthropic_message(const cJSON *m, int i, cJSON *out, ms_api_error *e) {
    char param[96];
    snprintf(param, sizeof param, "messages[%d]", i);
    if (!cJSON_IsObject(m)) return BAD(param, "'%s' must be an object, got %s", param, ms_api_type_name(m));
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    snprintf(param, sizeof param, "messages[%d].role", i);
    if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
        return BAD(param, "'%s' must be \"user\" or \"assistant\" (the system prompt is the top-level 'system')", param);
    int asst = !strcmp(role->valuestring, "assistant");
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (cJSON_IsString(c)) {
        cJSON_AddItemToArray(out, msg_new(role->valuestring, c->valuestring));
        return MS_OK;
    }
    if (!cJSON_IsArray(c)) return BAD(param, "'%s' must be a string or an array of content blocks, got %s", param, ms_api_type_name(c));
    cJSON *am = asst ? msg_new("assistant", "") : NULL, *um = NULL;
    const cJSON *b;
    int j = 0, rc = MS_OK;
    cJSON_ArrayForEach(b, c) {
        char bp[128];
        snprintf(bp, sizeof bp, "%s[%d]", param, j++);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "type");
        if (!cJSON_IsObject(b) || !cJSON_IsString(t)) { rc = BAD(bp, "'%s' must be an object with a string 'type'", bp); break; }
        const char *ty = t->valuestring;
        if (!strcmp(ty, "text")) {
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(b, "text");
            if (!cJSON_IsString(tx)) { rc = BAD(bp, "'%s.text' must be a string", bp); break; }
            if (asst) msg_append(am, "content", tx->valuestring);
            else {
                if (!um) um = msg_new("user", "");
                msg_append(um, "content", tx->valuestring);
            }
        } else if (asst && !strcmp(ty, "thinking")) {
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(b, "thinking");
            if (!cJSON_IsString(tx)) { rc = BAD(bp, "'%s.thinking' must be a string", bp); break; }
            msg_append(am, "reasoning_content", tx->valuestring);
        } else if (asst && !strcmp(ty, "redacted_thinking")) {
            /* opaque to us: nothing to render */
        } else if (asst && !strcmp(ty, "tool_use")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id"), *name = cJSON_GetObjectItemCaseSensitive(b, "name"),
                        *input = cJSON_GetObjectItemCaseSensitive(b, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !name->valuestring[0] || (input && !cJSON_IsObject(input))) {
                rc = BAD(bp, "'%s' must be {\"type\": \"tool_use\", \"id\", \"name\", \"input\": {...}}", bp);
                break;
            }
            char *args = input ? cJSON_PrintUnformatted(input) : strdup("{}");
            if (!args) { rc = NOMEM(); break; }
            msg_add_call(am, id->valuestring, name->valuestring, args);
            free(args);
        } else if (!asst && !strcmp(ty, "tool_result")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id");
            if (!cJSON_IsString(id)) { rc = BAD(bp, "'%s.tool_use_id' must be a string", bp); break; }
            char cp[160], *text;
            snprintf(cp, sizeof cp, "%s.content", bp);
            if ((rc = join_text(cJSON_GetObjectItemCaseSensitive(b, "content"), cp, "text\0", "\n", &text, e))) break;
            cJSON *tm = msg_new("tool", text);
            free(text);
            cJSON_AddStringToObject(tm, "tool_call_id", id->valuestring);
            cJSON_AddItemToArray(out, tm); /* tool results first, then the user's text */
        } else {
            rc = UNSUPPORTED(bp, "'%s': content blocks of type '%.64s' are not supported in a%s message", bp, ty,
                             asst ? "n assistant" : " user");
            break;
        }
    }
    if (rc) {
        cJSON_Delete(am);
        cJSON_Delete(um);
        return rc;
    }
    if (am) cJSON_AddItemToArray(out, am);
    if (um) cJSON_AddItemToArray(out, um);
    if (!asst && !um && !j) cJSON_AddItemToArray(out, msg_new("user", ""));
    return MS_OK;
}

/* A tool as chat completions' tools[] holds it (what ms_api_set_tools takes):
 * {"type": "function", "function": {"name", "description" (when d is a string), "parameters" (a
 * copy of params, when it is an object)}}. */
static cJSON *function_tool(const char *name, const cJSON *d, const cJSON *params) {
    cJSON *f = cJSON_CreateObject(), *w = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "name", name);
    if (cJSON_IsString(d)) cJSON_AddStringToObject(f, "description", d->valuestring);
    if (cJSON_IsObject(params)) cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(params, 1));
    cJSON_AddStringToObject(w, "type", "function");
    cJSON_AddItemToObject(w, "function", f);
    return w;
}

static int anthropic_tools(const cJSON *root, cJSON *render, ms_api_request *r, ms_api_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools"), *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    int use = 1, rc;
    if (tc && !cJSON_IsNull(tc)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
        if (!cJSON_IsObject(tc) || !cJSON_IsString(ty))
            return BAD("tool_choice", "'tool_choice' must be an object with a string 'type' (auto, any, tool, none)");
        int dp = 0;
        if ((rc = ms_api_get_bool(tc, "disable_parallel_tool_use", &dp, e))) return rc;
        if (dp) r->parallel_tool_calls = 0;
        const char *t = ty->valuestring;
        if (!strcmp(t, "none")) use = 0;
        else if (!strcmp(t, "any")) {
            if ((rc = forced_tool_choice(r, "tool_choice", NULL, e))) return rc;
        }
        else if (!strcmp(t, "tool")) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(tc, "name");
            if (!cJSON_IsString(n)) return BAD("tool_choice", "'tool_choice' of type \"tool\" needs a string 'name'");
            if ((rc = forced_tool_choice(r, "tool_choice", n->valuestring, e))) return rc;
        } else if (strcmp(t, "auto"))
            return BAD("tool_choice", "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\", got \"%.64s\"", t);
    }
    if (!tools || cJSON_IsNull(tools)) return MS_OK;
    if (!cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array, got %s", ms_api_type_name(tools));
    cJSON *conv = cJSON_CreateArray();
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        char p[64];
        snprintf(p, sizeof p, "tools[%d]", i++);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type"), *n = cJSON_GetObjectItemCaseSensitive(t, "name"),
                    *d = cJSON_GetObjectItemCaseSensitive(t, "description"), *s = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
        if (!cJSON_IsObject(t)) { cJSON_Delete(conv); return BAD(p, "'%s' must be an object", p); }
        if (ty && !cJSON_IsNull(ty) && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "custom"))) {
            cJSON_Delete(conv);
            return UNSUPPORTED(p, "'%s': tools of type '%.64s' are not supported (client tools with 'input_schema' only)", p,
                               cJSON_IsString(ty) ? ty->valuestring : "?");
        }
        if (!cJSON_IsString(n) || !n->valuestring[0] || !cJSON_IsObject(s)) {
            cJSON_Delete(conv);
            return BAD(p, "'%s' must have a non-empty string 'name' and an 'input_schema' object", p);
        }
        cJSON_AddItemToArray(conv, function_tool(n->valuestring, d, s));
    }
    rc = ms_api_set_tools(conv, use, render, r, e);
    cJSON_Delete(conv);
    return rc;
}

int ms_api_parse_messages(const cJSON *root, ms_api_request *r, ms_api_error *e) {
    r->stream_usage = 1;
    if (r->kind == MS_API_MESSAGES && !cJSON_GetObjectItemCaseSensitive(root, "max_tokens"))
        return BAD("max_tokens", "'max_tokens' is required");
    int rc = parse_stop_sequences(root, r, e);
    if (rc) return rc;
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(root, "thinking");
    if (th && !cJSON_IsNull(th)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(th, "type");
        if (!cJSON_IsObject(th) || !cJSON_IsString(ty) || (strcmp(ty->valuestring, "enabled") && strcmp(ty->valuestring, "disabled")))
            return BAD("thinking", "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
        r->thinking = !strcmp(ty->valuestring, "enabled");
    }
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs) return BAD("messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return BAD("messages", "'messages' must be an array, got %s", ms_api_type_name(msgs));
    if (!msgs->child) return BAD("messages", "'messages' must not be empty");
    cJSON *render = cJSON_CreateObject(), *out = cJSON_AddArrayToObject(render, "messages");
    if (!out) { cJSON_Delete(render); return NOMEM(); }
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(root, "system");
    if (sys && !cJSON_IsNull(sys)) {
        char *text;
        if ((rc = join_text(sys, "system", "text\0", "\n", &text, e))) { cJSON_Delete(render); return rc; }
        cJSON_AddItemToArray(out, msg_new("system", text));
        free(text);
    }
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, msgs) {
        if ((rc = anthropic_message(m, i++, out, e))) { cJSON_Delete(render); return rc; }
    }
    if (!(rc = anthropic_tools(root, render, r, e))) rc = ms_api_finish_render(render, r, e);
    cJSON_Delete(render);
    return rc;
}

/* ---------------- OpenAI Responses ---------------- */
static int responses_tools(const cJSON *root, cJSON *render, cJSON *echo, ms_api_request *r, ms_api_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools"), *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    int use = 1, rc;
    if (tc && !cJSON_IsNull(tc)) {
        if (cJSON_IsString(tc)) {
            if (!strcmp(tc->valuestring, "none")) use = 0;
            else if (!strcmp(tc->valuestring, "required")) {
                if ((rc = forced_tool_choice(r, "tool_choice", NULL, e))) return rc;
            }
            else if (strcmp(tc->valuestring, "auto"))
                return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or an object, got \"%.64s\"", tc->valuestring);
        } else if (cJSON_IsObject(tc)) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(tc, "name"), *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(n))
                return BAD("tool_choice", "'tool_choice' object must be {\"type\": \"function\", \"name\": ...}");
            if ((rc = forced_tool_choice(r, "tool_choice", n->valuestring, e))) return rc;
        } else {
            return BAD("tool_choice", "'tool_choice' must be a string or an object, got %s", ms_api_type_name(tc));
        }
        cJSON_AddItemToObject(echo, "tool_choice", cJSON_Duplicate(tc, 1));
    } else {
        cJSON_AddStringToObject(echo, "tool_choice", "auto");
    }
    if (!tools || cJSON_IsNull(tools)) {
        cJSON_AddArrayToObject(echo, "tools");
        return MS_OK;
    }
    if (!cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array, got %s", ms_api_type_name(tools));
    cJSON *conv = cJSON_CreateArray();
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        char p[64];
        snprintf(p, sizeof p, "tools[%d]", i++);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type"), *n = cJSON_GetObjectItemCaseSensitive(t, "name"),
                    *d = cJSON_GetObjectItemCaseSensitive(t, "description"), *ps = cJSON_GetObjectItemCaseSensitive(t, "parameters");
        if (!cJSON_IsObject(t) || !cJSON_IsString(ty)) { cJSON_Delete(conv); return BAD(p, "'%s' must be an object with a string 'type'", p); }
        if (strcmp(ty->valuestring, "function")) {
            cJSON_Delete(conv);
            return UNSUPPORTED(p, "'%s': tools of type '%.64s' are not supported (function tools only)", p, ty->valuestring);
        }
        if (!cJSON_IsString(n) || !n->valuestring[0] || (ps && !cJSON_IsNull(ps) && !cJSON_IsObject(ps))) {
            cJSON_Delete(conv);
            return BAD(p, "'%s' must have a non-empty string 'name' and 'parameters' a JSON Schema object", p);
        }
        cJSON_AddItemToArray(conv, function_tool(n->valuestring, d, ps));
    }
    cJSON_AddItemToObject(echo, "tools", cJSON_Duplicate(tools, 1));
    rc = ms_api_set_tools(conv, use, render, r, e);
    cJSON_Delete(conv);
    return rc;
}

/* Responses input items -> internal messages (appended to out). Assistant-side items in a row
 * (reasoning, an assistant message, function calls) make one assistant message. */
static int responses_items(const cJSON *input, cJSON *out, ms_api_error *e) {
    if (cJSON_IsString(input)) {
        cJSON_AddItemToArray(out, msg_new("user", input->valuestring));
        return MS_OK;
    }
    if (!cJSON_IsArray(input)) return BAD("input", "'input' must be a string or an array of items, got %s", ms_api_type_name(input));
    cJSON *asst = NULL;
    const cJSON *it;
    int i = 0, rc = MS_OK;
#define FLUSH() do { if (asst) { cJSON_AddItemToArray(out, asst); asst = NULL; } } while (0)
    cJSON_ArrayForEach(it, input) {
        char p[64], cp[80];
        snprintf(p, sizeof p, "input[%d]", i);
        snprintf(cp, sizeof cp, "input[%d].content", i);
        i++;
        if (!cJSON_IsObject(it)) { rc = BAD(p, "'%s' must be an object, got %s", p, ms_api_type_name(it)); break; }
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type"), *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const char *t = cJSON_IsString(ty) ? ty->valuestring : role ? "message" : "";
        if (!strcmp(t, "message")) {
            if (!cJSON_IsString(role)) { rc = BAD(p, "'%s.role' must be a string", p); break; }
            const char *rs = role->valuestring;
            if (!strcmp(rs, "developer")) rs = "system";
            if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant")) {
                rc = BAD(p, "'%s.role' must be one of user, assistant, system, developer; got '%.64s'", p, rs);
                break;
            }
            char *text;
            if ((rc = join_text(cJSON_GetObjectItemCaseSensitive(it, "content"), cp, "input_text\0output_text\0text\0refusal\0",
                                "", &text, e)))
                break;
            if (!strcmp(rs, "assistant")) {
                if (!asst) asst = msg_new("assistant", "");
                msg_append(asst, "content", text);
            } else {
                FLUSH();
                cJSON_AddItemToArray(out, msg_new(rs, text));
            }
            free(text);
        } else if (!strcmp(t, "function_call")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id"), *n = cJSON_GetObjectItemCaseSensitive(it, "name"),
                        *a = cJSON_GetObjectItemCaseSensitive(it, "arguments");
            if (!cJSON_IsString(id) || !cJSON_IsString(n) || !cJSON_IsString(a)) {
                rc = BAD(p, "'%s' must be {\"type\": \"function_call\", \"call_id\", \"name\", \"arguments\": a JSON string}", p);
                break;
            }
            if (!asst) asst = msg_new("assistant", "");
            msg_add_call(asst, id->valuestring, n->valuestring, a->valuestring);
        } else if (!strcmp(t, "function_call_output")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
            if (!cJSON_IsString(id)) { rc = BAD(p, "'%s.call_id' must be a string", p); break; }
            char op[80], *text;
            snprintf(op, sizeof op, "%s.output", p);
            if ((rc = join_text(cJSON_GetObjectItemCaseSensitive(it, "output"), op, "input_text\0output_text\0text\0", "", &text, e)))
                break;
            FLUSH();
            cJSON *tm = msg_new("tool", text);
            free(text);
            cJSON_AddStringToObject(tm, "tool_call_id", id->valuestring);
            cJSON_AddItemToArray(out, tm);
        } else if (!strcmp(t, "reasoning")) {
            if (!asst) asst = msg_new("assistant", "");
            const char *keys[2] = {"content", "summary"};
            for (int k = 0; k < 2 && !rc; k++) {
                const cJSON *arr = cJSON_GetObjectItemCaseSensitive(it, keys[k]), *x;
                if (!arr || cJSON_IsNull(arr)) continue;
                if (!cJSON_IsArray(arr)) { rc = BAD(p, "'%s.%s' must be an array", p, keys[k]); break; }
                cJSON_ArrayForEach(x, arr) {
                    const cJSON *tx = cJSON_GetObjectItemCaseSensitive(x, "text");
                    if (!cJSON_IsString(tx)) { rc = BAD(p, "'%s.%s[]' must be objects with a string 'text'", p, keys[k]); break; }
                    msg_append(asst, "reasoning_content", tx->valuestring);
                }
                if (k == 0 && arr && cJSON_GetArraySize(arr)) break; /* the full text is there: the summary repeats it */
            }
            if (rc) break;
        } else {
            rc = UNSUPPORTED(p, "'%s': items of type '%.64s' are not supported (message, function_call, "
                                "function_call_output, reasoning)", p, t[0] ? t : "(none)");
            break;
        }
    }
    if (rc) {
        cJSON_Delete(asst);
        return rc;
    }
    FLUSH();
#undef FLUSH
    return MS_OK;
}

int ms_api_parse_responses(const cJSON *root, ms_api_request *r, ms_api_error *e) {
    r->stream_usage = 1;
    int rc, has;
    int64_t mt;
    if ((rc = ms_api_get_int(root, "max_output_tokens", 1, INT32_MAX, &mt, &has, e))) return rc;
    if (has) r->max_tokens = (int)mt;
    if ((rc = ms_api_get_bool(root, "store", &r->store, e))) return rc;
    int bg = 0;
    if ((rc = ms_api_get_bool(root, "background", &bg, e))) return rc;
    if (bg) return UNSUPPORTED("background", "'background' responses are not supported");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "previous_response_id");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v) || !v->valuestring[0]) return BAD("previous_response_id", "'previous_response_id' must be a string");
        if (!(r->previous_response_id = strdup(v->valuestring))) return NOMEM();
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "reasoning");
    if (v && !cJSON_IsNull(v)) {
        const cJSON *ef = cJSON_GetObjectItemCaseSensitive(v, "effort");
        if (!cJSON_IsObject(v)) return BAD("reasoning", "'reasoning' must be an object");
        if (ef && !cJSON_IsNull(ef)) {
            if (!cJSON_IsString(ef)) return BAD("reasoning.effort", "'reasoning.effort' must be a string");
            free(r->reasoning_effort);
            if (!(r->reasoning_effort = strdup(ef->valuestring))) return NOMEM();
            r->effort_param = "reasoning.effort";
        }
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "text");
    if (v && !cJSON_IsNull(v)) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(v, "format"), *ty = cJSON_GetObjectItemCaseSensitive(f, "type");
        if (!cJSON_IsObject(v)) return BAD("text", "'text' must be an object");
        (void)ty;
        if (f && !cJSON_IsNull(f) && (rc = ms_api_set_format(f, "text.format", r, e))) return rc;
    }
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (!input || cJSON_IsNull(input)) return BAD("input", "'input' is required");
    cJSON *render = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(render, "messages"), *in = cJSON_CreateArray(),
          *echo = cJSON_CreateObject();
    if (!msgs || !in || !echo) rc = NOMEM();
    const cJSON *ins = cJSON_GetObjectItemCaseSensitive(root, "instructions");
    if (!rc && ins && !cJSON_IsNull(ins)) {
        if (!cJSON_IsString(ins)) rc = BAD("instructions", "'instructions' must be a string");
        else {
            cJSON_AddItemToArray(msgs, msg_new("system", ins->valuestring));
            r->n_instructions = 1;
            cJSON_AddStringToObject(echo, "instructions", ins->valuestring);
        }
    } else if (!rc) {
        cJSON_AddNullToObject(echo, "instructions");
    }
    if (!rc) rc = responses_items(input, in, e);
    if (!rc && !in->child) rc = BAD("input", "'input' must not be empty");
    if (!rc) {
        const cJSON *x;
        cJSON_ArrayForEach(x, in) cJSON_AddItemToArray(msgs, cJSON_Duplicate(x, 1));
        rc = responses_tools(root, render, echo, r, e);
    }
    if (!rc) {
        const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
        if (kw && !cJSON_IsNull(kw)) {
            if (!cJSON_IsObject(kw)) rc = BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
            else cJSON_AddItemToObject(render, "chat_template_kwargs", cJSON_Duplicate(kw, 1));
        }
    }
    if (!rc) rc = ms_api_finish_render(render, r, e);
    if (!rc) {
        cJSON_AddBoolToObject(echo, "parallel_tool_calls", r->parallel_tool_calls);
        cJSON_AddNumberToObject(echo, "temperature", r->sampling.temperature);
        cJSON_AddNumberToObject(echo, "top_p", r->sampling.top_p);
        cJSON_AddNumberToObject(echo, "top_logprobs", r->top_logprobs);
        if (r->max_tokens) cJSON_AddNumberToObject(echo, "max_output_tokens", r->max_tokens);
        else cJSON_AddNullToObject(echo, "max_output_tokens");
        cJSON *re = cJSON_AddObjectToObject(echo, "reasoning");
        if (r->reasoning_effort) cJSON_AddStringToObject(re, "effort", r->reasoning_effort);
        else cJSON_AddNullToObject(re, "effort");
        cJSON_AddNullToObject(re, "summary");
        const cJSON *tf = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "text"), "format");
        if (cJSON_IsObject(tf)) cJSON_AddItemToObject(cJSON_AddObjectToObject(echo, "text"), "format", cJSON_Duplicate(tf, 1));
        else cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(echo, "text"), "format"), "type", "text");
        cJSON_AddBoolToObject(echo, "store", r->store);
        cJSON_AddStringToObject(echo, "truncation", "disabled");
        cJSON_AddObjectToObject(echo, "metadata");
        if (!(r->input_json = cJSON_PrintUnformatted(in)) || !(r->echo_json = cJSON_PrintUnformatted(echo))) rc = NOMEM();
    }
    cJSON_Delete(render);
    cJSON_Delete(in);
    cJSON_Delete(echo);
    return rc;
}

int ms_api_prepend_messages(ms_api_request *r, const char *messages_json, ms_api_error *e) {
    cJSON *prev = cJSON_Parse(messages_json), *render = r->render_json ? cJSON_Parse(r->render_json) : NULL,
          *in = r->input_json ? cJSON_Parse(r->input_json) : NULL;
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(render, "messages");
    int rc = MS_OK;
    if (!cJSON_IsArray(prev) || !cJSON_IsArray(msgs) || !cJSON_IsArray(in)) rc = BAD("previous_response_id", "the stored response is malformed");
    else {
        /* render: instructions, the stored conversation, the new input; input_json: stored + new */
        /* built anew: cJSON_InsertItemInArray of Debian's cJSON 1.7.15 loses items */
        cJSON *nm = cJSON_CreateArray(), *ni = cJSON_CreateArray(), *x;
        int k = 0;
        cJSON_ArrayForEach(x, msgs) if (k++ < r->n_instructions) cJSON_AddItemToArray(nm, cJSON_Duplicate(x, 1));
        cJSON_ArrayForEach(x, prev) {
            cJSON_AddItemToArray(nm, cJSON_Duplicate(x, 1));
            cJSON_AddItemToArray(ni, cJSON_Duplicate(x, 1));
        }
        k = 0;
        cJSON_ArrayForEach(x, msgs) if (k++ >= r->n_instructions) cJSON_AddItemToArray(nm, cJSON_Duplicate(x, 1));
        cJSON_ArrayForEach(x, in) cJSON_AddItemToArray(ni, cJSON_Duplicate(x, 1));
        cJSON_ReplaceItemInObjectCaseSensitive(render, "messages", nm);
        cJSON_Delete(in);
        in = ni;
        char *a = cJSON_PrintUnformatted(render), *b = cJSON_PrintUnformatted(in);
        if (!a || !b) {
            free(a);
            free(b);
            rc = NOMEM();
        } else {
            free(r->render_json);
            free(r->input_json);
            r->render_json = a;
            r->input_json = b;
        }
    }
    cJSON_Delete(prev);
    cJSON_Delete(render);
    cJSON_Delete(in);
    return rc;
}

/* ---------------- reasoning switches ---------------- */
ms_api_reasoning ms_api_reasoning_for(ms_outfmt fmt, const char *tpl) {
    if (fmt == MS_OUTFMT_HARMONY) return MS_REASONING_HARMONY;
    if (fmt == MS_OUTFMT_XTML) return MS_REASONING_XTML;
    if (tpl && strstr(tpl, "enable_thinking")) return MS_REASONING_ENABLE_THINKING;
    if (tpl && fmt == MS_OUTFMT_DEEPSEEK_V31 && strstr(tpl, "thinking")) return MS_REASONING_THINKING;
    return MS_REASONING_NO_SWITCH;
}

int ms_api_apply_reasoning(ms_api_request *r, ms_api_reasoning sw, ms_api_error *e) {
    if (!r->reasoning_effort && r->thinking < 0) return MS_OK;
    static const char *const std[] = {"none", "minimal", "low", "medium", "high", NULL};
    const char *ef = r->reasoning_effort, *param = r->effort_param ? r->effort_param : "reasoning_effort";
    int on = r->thinking; /* -1: leave the template's default */
    if (ef) {
        int ok = 0;
        for (int i = 0; std[i]; i++) ok |= !strcmp(ef, std[i]);
        if (sw == MS_REASONING_XTML) ok |= !strcmp(ef, "max");
        if (!ok)
            return BAD(param, "'%s' must be one of none, minimal, low, medium, high%s; got '%.64s'", param,
                       sw == MS_REASONING_XTML ? ", max" : "", ef);
        on = strcmp(ef, "none") && strcmp(ef, "minimal");
    }
    if (sw == MS_REASONING_NO_SWITCH) return MS_OK;
    cJSON *render = cJSON_Parse(r->render_json);
    if (!render) return NOMEM();
    cJSON *kw = cJSON_GetObjectItemCaseSensitive(render, "chat_template_kwargs");
    if (!kw) kw = cJSON_AddObjectToObject(render, "chat_template_kwargs");
#define SET(key, item) do { cJSON *it_ = (item); if (!cJSON_GetObjectItemCaseSensitive(kw, key)) cJSON_AddItemToObject(kw, key, it_); else cJSON_Delete(it_); } while (0)
    switch (sw) {
    case MS_REASONING_ENABLE_THINKING: if (on >= 0) SET("enable_thinking", cJSON_CreateBool(on)); break;
    case MS_REASONING_THINKING: if (on >= 0) SET("thinking", cJSON_CreateBool(on)); break;
    case MS_REASONING_HARMONY: { /* gpt-oss always reasons: off is its lowest effort */
        const char *h = !ef || !on ? (on ? NULL : "low") : !strcmp(ef, "max") ? "high" : ef;
        if (h) SET("reasoning_effort", cJSON_CreateString(h));
        break;
    }
    case MS_REASONING_XTML:
        if (on >= 0) SET("thinking", cJSON_CreateBool(on));
        if (ef && on) SET("thinking_effort", cJSON_CreateString(!strcmp(ef, "medium") ? "high" : ef));
        break;
    default: break;
    }
#undef SET
    char *s = cJSON_PrintUnformatted(render);
    cJSON_Delete(render);
    if (!s) return NOMEM();
    free(r->render_json);
    r->render_json = s;
    return MS_OK;
}

/* ---------------- responses: the block state machine ---------------- */
static int acc_add(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1) c *= 2;
        char *nb = realloc(*b, c);
        if (!nb) return MS_ERR_NOMEM;
        *b = nb;
        *cap = c;
    }
    if (n) memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = 0;
    return MS_OK;
}

#define ANTH(r) ((r)->o.kind == MS_API_MESSAGES)

/* Send `event: NAME\ndata: JSON\n\n` (Responses: with its sequence_number), freeing data. */
static int ev(ms_api_resp *r, const char *name, cJSON *data) {
    if (!data) return r->sink_rc = MS_ERR_NOMEM;
    if (!r->o.stream) { cJSON_Delete(data); return 0; }
    if (!ANTH(r)) cJSON_AddNumberToObject(data, "sequence_number", r->a.seq++);
    char *s = cJSON_PrintUnformatted(data);
    cJSON_Delete(data);
    if (!s) return r->sink_rc = MS_ERR_NOMEM;
    size_t nl = strlen(name), l = strlen(s);
    char *buf = malloc(nl + l + 20);
    if (!buf) { free(s); return r->sink_rc = MS_ERR_NOMEM; }
    int n = snprintf(buf, nl + l + 20, "event: %s\ndata: %s\n\n", name, s);
    free(s);
    int rc = ms_api_send_raw(r, buf, (size_t)n);
    free(buf);
    return rc;
}

static cJSON *typed(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

static void anth_usage(cJSON *u, int in, int out) {
    cJSON_AddNumberToObject(u, "input_tokens", in);
    cJSON_AddNumberToObject(u, "output_tokens", out);
}

/* Anthropic's message object / the Responses response object (status, output so far). */
static cJSON *envelope(ms_api_resp *r, const char *status, int final) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    if (ANTH(r)) {
        cJSON_AddStringToObject(o, "type", "message");
        cJSON_AddStringToObject(o, "role", "assistant");
        cJSON_AddStringToObject(o, "model", r->model);
        cJSON_AddItemToObject(o, "content", final ? cJSON_Duplicate(r->a.items, 1) : cJSON_CreateArray());
        cJSON_AddNullToObject(o, "stop_reason");
        cJSON_AddNullToObject(o, "stop_sequence");
        anth_usage(cJSON_AddObjectToObject(o, "usage"), r->o.prompt_tokens, 0);
        return o;
    }
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)r->o.created);
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddBoolToObject(o, "background", 0);
    cJSON_AddNullToObject(o, "error");
    cJSON_AddNullToObject(o, "incomplete_details");
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON_AddItemToObject(o, "output", final ? cJSON_Duplicate(r->a.items, 1) : cJSON_CreateArray());
    cJSON_AddNullToObject(o, "usage");
    cJSON *echo = r->a.echo ? cJSON_Parse(r->a.echo) : NULL, *x;
    if (echo) {
        while ((x = echo->child)) cJSON_AddItemToObject(o, x->string, cJSON_DetachItemViaPointer(echo, x));
        cJSON_Delete(echo);
    }
    if (!cJSON_GetObjectItemCaseSensitive(o, "previous_response_id")) cJSON_AddNullToObject(o, "previous_response_id");
    return o;
}

static int start(ms_api_resp *r) {
    if (r->a.started) return 0;
    r->a.started = 1;
    int rc;
    if (ANTH(r)) {
        cJSON *d = typed("message_start");
        cJSON_AddItemToObject(d, "message", envelope(r, NULL, 0));
        if ((rc = ev(r, "message_start", d))) return rc;
        return ev(r, "ping", typed("ping"));
    }
    cJSON *d = typed("response.created");
    cJSON_AddItemToObject(d, "response", envelope(r, "in_progress", 0));
    if ((rc = ev(r, "response.created", d))) return rc;
    d = typed("response.in_progress");
    cJSON_AddItemToObject(d, "response", envelope(r, "in_progress", 0));
    return ev(r, "response.in_progress", d);
}

/* Responses logprobs. A token's entry is recorded before its text reaches the output parser
 * (ms_api_resp_logprob); each text delta takes the entries recorded since the previous delta of
 * any kind, so an output_text delta carries the entries of the tokens whose text it is (text the
 * parser held back takes its tokens' entries along when it goes out), and a part's first delta
 * the newest of them that cover its bytes. Entries of reasoning or function-call text, of markup
 * (</think>, <tool_call>) and of whitespace dropped before or after a part are not output text
 * and are not reported. */

/* The open output_text part's entries (what its "logprobs" hold), a copy; [] without logprobs. */
static cJSON *part_logprobs(ms_api_resp *r) {
    return r->o.logprobs && r->a.lp_text ? cJSON_Duplicate(r->a.lp_text, 1) : cJSON_CreateArray();
}

/* The same entries as the streamed events show them (ResponseTextDeltaEvent.Logprob: token,
 * logprob, top_logprobs of token and logprob; no bytes). */
static cJSON *event_logprobs(const cJSON *entries) {
    cJSON *out = cJSON_Duplicate(entries, 1), *x, *t;
    cJSON_ArrayForEach(x, out) {
        cJSON_DeleteItemFromObjectCaseSensitive(x, "bytes");
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(x, "top_logprobs")) cJSON_DeleteItemFromObjectCaseSensitive(t, "bytes");
    }
    return out;
}

/* The item/block as it stands (acc = its text or arguments). */
static cJSON *block(ms_api_resp *r, int done) {
    agent_state *a = &r->a;
    const char *txt = a->acc ? a->acc : "";
    const char *t = done ? txt : "";
    if (ANTH(r)) {
        if (a->open == 1) {
            cJSON *b = typed("thinking");
            cJSON_AddStringToObject(b, "thinking", t);
            cJSON_AddStringToObject(b, "signature", "");
            return b;
        }
        if (a->open == 2) {
            cJSON *b = typed("text");
            cJSON_AddStringToObject(b, "text", t);
            return b;
        }
        cJSON *b = typed("tool_use");
        cJSON_AddStringToObject(b, "id", a->call_id);
        cJSON_AddStringToObject(b, "name", a->name);
        cJSON *in = done ? cJSON_Parse(txt) : NULL;
        if (done && !cJSON_IsObject(in)) { /* arguments that are not a JSON object: keep them visible */
            cJSON_Delete(in);
            in = cJSON_CreateObject();
            if (txt[0]) cJSON_AddStringToObject(in, "arguments", txt);
        }
        cJSON_AddItemToObject(b, "input", in ? in : cJSON_CreateObject());
        return b;
    }
    cJSON *b;
    if (a->open == 1) {
        b = typed("reasoning");
        cJSON_AddStringToObject(b, "id", a->item_id);
        cJSON_AddArrayToObject(b, "summary");
        cJSON *p = typed("reasoning_text");
        cJSON_AddStringToObject(p, "text", t);
        cJSON *arr = cJSON_AddArrayToObject(b, "content");
        if (done) cJSON_AddItemToArray(arr, p);
        else cJSON_Delete(p);
    } else if (a->open == 2) {
        b = typed("message");
        cJSON_AddStringToObject(b, "id", a->item_id);
        cJSON_AddStringToObject(b, "status", done ? "completed" : "in_progress");
        cJSON_AddStringToObject(b, "role", "assistant");
        cJSON *arr = cJSON_AddArrayToObject(b, "content");
        if (done) {
            cJSON *p = typed("output_text");
            cJSON_AddStringToObject(p, "text", t);
            cJSON_AddArrayToObject(p, "annotations");
            cJSON_AddItemToObject(p, "logprobs", part_logprobs(r));
            cJSON_AddItemToArray(arr, p);
        }
    } else {
        b = typed("function_call");
        cJSON_AddStringToObject(b, "id", a->item_id);
        cJSON_AddStringToObject(b, "status", done ? "completed" : "in_progress");
        cJSON_AddStringToObject(b, "call_id", a->call_id);
        cJSON_AddStringToObject(b, "name", a->name);
        cJSON_AddStringToObject(b, "arguments", t);
    }
    return b;
}

static cJSON *part(ms_api_resp *r, int done) {
    cJSON *p = typed(r->a.open == 1 ? "reasoning_text" : "output_text");
    cJSON_AddStringToObject(p, "text", done && r->a.acc ? r->a.acc : "");
    if (r->a.open == 2) {
        cJSON_AddArrayToObject(p, "annotations");
        cJSON_AddItemToObject(p, "logprobs", done ? part_logprobs(r) : cJSON_CreateArray());
    }
    return p;
}

static cJSON *at(ms_api_resp *r, const char *type, int with_part) {
    cJSON *d = typed(type);
    if (ANTH(r)) {
        cJSON_AddNumberToObject(d, "index", r->a.n_items - 1);
        return d;
    }
    cJSON_AddStringToObject(d, "item_id", r->a.item_id);
    cJSON_AddNumberToObject(d, "output_index", r->a.n_items - 1);
    if (with_part) cJSON_AddNumberToObject(d, "content_index", 0);
    return d;
}

static int open_block(ms_api_resp *r, int kind, const ms_outev *e) {
    agent_state *a = &r->a;
    a->open = kind;
    a->acc_len = a->ws_len = 0;
    if (a->acc) a->acc[0] = 0;
    int idx = a->n_items++;
    const char *hex = strchr(r->id, '_') ? strchr(r->id, '_') + 1 : r->id;
    snprintf(a->item_id, sizeof a->item_id, "%s_%.40s%d", kind == 1 ? "rs" : kind == 2 ? "msg" : "fc", hex, idx);
    if (kind == 3) {
        const char *id = e->tool_id ? e->tool_id : "";
        if (ANTH(r) && !strncmp(id, "call_", 5)) snprintf(a->call_id, sizeof a->call_id, "toolu_%.80s", id + 5);
        else snprintf(a->call_id, sizeof a->call_id, "%.90s", id);
        snprintf(a->name, sizeof a->name, "%.250s", e->tool_name ? e->tool_name : "");
        a->n_calls++;
    }
    int rc = start(r);
    if (rc) return rc;
    if (ANTH(r)) {
        cJSON *d = at(r, "content_block_start", 0);
        cJSON_AddItemToObject(d, "content_block", block(r, 0));
        return ev(r, "content_block_start", d);
    }
    cJSON *d = typed("response.output_item.added");
    cJSON_AddNumberToObject(d, "output_index", idx);
    cJSON_AddItemToObject(d, "item", block(r, 0));
    if ((rc = ev(r, "response.output_item.added", d)) || kind == 3) return rc;
    d = at(r, "response.content_part.added", 1);
    cJSON_AddItemToObject(d, "part", part(r, 0));
    return ev(r, "response.content_part.added", d);
}

static int close_block(ms_api_resp *r) {
    agent_state *a = &r->a;
    if (!a->open) return 0;
    cJSON_AddItemToArray(a->items, block(r, 1));
    int rc;
    if (ANTH(r)) {
        rc = ev(r, "content_block_stop", at(r, "content_block_stop", 0));
    } else {
        const char *txt = a->acc ? a->acc : "";
        if (a->open == 3) {
            cJSON *d = at(r, "response.function_call_arguments.done", 0);
            cJSON_AddStringToObject(d, "arguments", txt);
            rc = ev(r, "response.function_call_arguments.done", d);
        } else {
            const char *name = a->open == 1 ? "response.reasoning_text.done" : "response.output_text.done";
            cJSON *d = at(r, name, 1);
            cJSON_AddStringToObject(d, "text", txt);
            if (a->open == 2) {
                cJSON *l = part_logprobs(r);
                cJSON_AddItemToObject(d, "logprobs", event_logprobs(l));
                cJSON_Delete(l);
            }
            rc = ev(r, name, d);
            if (!rc) {
                d = at(r, "response.content_part.done", 1);
                cJSON_AddItemToObject(d, "part", part(r, 1));
                rc = ev(r, "response.content_part.done", d);
            }
        }
        if (!rc) {
            cJSON *d = typed("response.output_item.done");
            cJSON_AddNumberToObject(d, "output_index", a->n_items - 1);
            cJSON_AddItemToObject(d, "item", block(r, 1));
            rc = ev(r, "response.output_item.done", d);
        }
    }
    a->open = 0;
    cJSON_Delete(a->lp_text);
    a->lp_text = NULL;
    return rc;
}

/* Text (reasoning or content) n bytes into the open block: appended and sent as a delta. */
static int delta(ms_api_resp *r, const char *s, size_t n) {
    agent_state *a = &r->a;
    if (!n) return 0;
    if (acc_add(&a->acc, &a->acc_len, &a->acc_cap, s, n)) return r->sink_rc = MS_ERR_NOMEM;
    cJSON *d;
    if (ANTH(r)) {
        d = at(r, "content_block_delta", 0);
        cJSON *x = typed(a->open == 1 ? "thinking_delta" : a->open == 2 ? "text_delta" : "input_json_delta");
        cJSON_AddItemToObject(x, a->open == 1 ? "thinking" : a->open == 2 ? "text" : "partial_json", ms_api_string_n(s, n));
        cJSON_AddItemToObject(d, "delta", x);
        return ev(r, "content_block_delta", d);
    }
    const char *name = a->open == 1 ? "response.reasoning_text.delta" : a->open == 2 ? "response.output_text.delta"
                                                                                   : "response.function_call_arguments.delta";
    d = at(r, name, a->open != 3);
    cJSON_AddItemToObject(d, "delta", ms_api_string_n(s, n));
    cJSON *l = r->o.logprobs ? ms_api_resp_take_logprobs(r) : NULL; /* the entries of this text's tokens */
    if (l && a->open == 2 && !a->lp_text) {
        /* a part's first text: the newest entries whose bytes cover it; older ones were markup
         * (a closing </think>) or whitespace before the part, not its text */
        size_t covered = 0;
        cJSON *keep = l->child ? l->child->prev : NULL; /* cJSON: the first item's prev is the last */
        while (keep && covered + (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(keep, "bytes")) < n &&
               keep != l->child)
            covered += (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(keep, "bytes")), keep = keep->prev;
        while (keep && l->child != keep) cJSON_DeleteItemFromArray(l, 0);
    }
    if (a->open == 2) {
        cJSON_AddItemToObject(d, "logprobs", l ? event_logprobs(l) : cJSON_CreateArray());
        if (l && !a->lp_text) a->lp_text = cJSON_CreateArray();
        cJSON *x;
        while (l && (x = l->child)) cJSON_AddItemToArray(a->lp_text, cJSON_DetachItemViaPointer(l, x));
    }
    cJSON_Delete(l);
    return ev(r, name, d);
}

static int text_event(ms_api_resp *r, int kind, const char *s, size_t n) {
    agent_state *a = &r->a;
    if (a->open != kind) { /* a new block starts at its first non-whitespace byte */
        while (n && is_ws(*s)) s++, n--;
        if (!n) return 0;
        int rc = close_block(r);
        if (!rc) rc = open_block(r, kind, NULL);
        if (rc) return rc;
    }
    size_t last = n;
    while (last && is_ws(s[last - 1])) last--;
    if (!last) /* only whitespace: held until more text comes (dropped at the block's end) */
        return acc_add(&a->ws, &a->ws_len, &a->ws_cap, s, n) ? (r->sink_rc = MS_ERR_NOMEM) : 0;
    int rc = 0;
    if (a->ws_len) {
        rc = delta(r, a->ws, a->ws_len);
        a->ws_len = 0;
    }
    if (!rc) rc = delta(r, s, last);
    if (!rc && last < n && acc_add(&a->ws, &a->ws_len, &a->ws_cap, s + last, n - last)) rc = r->sink_rc = MS_ERR_NOMEM;
    return rc;
}

int ms_api_agent_event(void *user, const ms_outev *e) {
    ms_api_resp *r = user;
    agent_state *a = &r->a;
    int rc = 0;
    switch (e->type) {
    case MS_OUTEV_REASONING: return text_event(r, 1, e->text, e->len);
    case MS_OUTEV_CONTENT: return text_event(r, 2, e->text, e->len);
    case MS_OUTEV_TOOL_START:
        if ((rc = close_block(r))) return rc;
        return open_block(r, 3, e);
    case MS_OUTEV_TOOL_ARGS:
        if (a->open != 3) return 0;
        return delta(r, e->text, e->len);
    case MS_OUTEV_TOOL_END:
        return a->open == 3 ? close_block(r) : 0;
    }
    return 0;
}

int ms_api_agent_finish(ms_api_resp *r, ms_finish finish, int prompt_tokens, int completion_tokens, int cached_tokens) {
    agent_state *a = &r->a;
    int rc = start(r);
    if (!rc) rc = close_block(r);
    if (rc) return rc;
    if (ANTH(r)) {
        const char *reason = finish == MS_FINISH_LENGTH ? "max_tokens" : a->stop_sequence ? "stop_sequence"
                             : a->n_calls ? "tool_use" : "end_turn";
        if (r->o.stream) {
            cJSON *d = typed("message_delta"), *dd = cJSON_AddObjectToObject(d, "delta");
            cJSON_AddStringToObject(dd, "stop_reason", reason);
            if (a->stop_sequence) cJSON_AddStringToObject(dd, "stop_sequence", a->stop_sequence);
            else cJSON_AddNullToObject(dd, "stop_sequence");
            anth_usage(cJSON_AddObjectToObject(d, "usage"), prompt_tokens, completion_tokens);
            if ((rc = ev(r, "message_delta", d))) return rc;
            return ev(r, "message_stop", typed("message_stop"));
        }
        cJSON *o = envelope(r, NULL, 1);
        cJSON_ReplaceItemInObjectCaseSensitive(o, "stop_reason", cJSON_CreateString(reason));
        if (a->stop_sequence) cJSON_ReplaceItemInObjectCaseSensitive(o, "stop_sequence", cJSON_CreateString(a->stop_sequence));
        cJSON *u = cJSON_CreateObject();
        anth_usage(u, prompt_tokens, completion_tokens);
        cJSON_ReplaceItemInObjectCaseSensitive(o, "usage", u);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!s) return MS_ERR_NOMEM;
        rc = ms_api_send_raw(r, s, strlen(s));
        free(s);
        return rc;
    }
    int incomplete = finish == MS_FINISH_LENGTH;
    cJSON *o = envelope(r, incomplete ? "incomplete" : "completed", 1);
    if (incomplete) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
        cJSON_ReplaceItemInObjectCaseSensitive(o, "incomplete_details", d);
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", prompt_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", cached_tokens > 0 ? cached_tokens : 0);
    cJSON_AddNumberToObject(u, "output_tokens", completion_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", 0);
    cJSON_AddNumberToObject(u, "total_tokens", prompt_tokens + completion_tokens);
    cJSON_ReplaceItemInObjectCaseSensitive(o, "usage", u);
    if (r->o.stream) {
        const char *name = incomplete ? "response.incomplete" : "response.completed";
        cJSON *d = typed(name);
        cJSON_AddItemToObject(d, "response", o);
        return ev(r, name, d);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return MS_ERR_NOMEM;
    rc = ms_api_send_raw(r, s, strlen(s));
    free(s);
    return rc;
}

void ms_api_agent_free(ms_api_resp *r) {
    cJSON_Delete(r->a.items);
    free(r->a.acc);
    free(r->a.ws);
    free(r->a.stop_sequence);
    free(r->a.echo);
    cJSON_Delete(r->a.lp_text);
    memset(&r->a, 0, sizeof r->a);
}
