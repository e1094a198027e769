/* api_constrain.c — constrained decoding for the API: response_format / text.format
 * (json_object, json_schema) and forced tool calls (tool_choice required or named) as grammars
 * (grammar/grammar.h) in the model family's own tool-call syntax. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api_int.h"

/* a growing NUL-terminated string */
typedef struct sbuf { char *p; size_t n, cap; } sbuf;
static int sb_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) return -1;
        b->p = q, b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int ms_api_set_format(const cJSON *f, const char *param, ms_api_request *r, ms_api_error *e) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(f, "type");
    if (!cJSON_IsObject(f) || !cJSON_IsString(ty)) return BAD(param, "'%s' must be an object with a string 'type'", param);
    const char *t = ty->valuestring;
    if (!strcmp(t, "text")) return MS_OK;
    if (!strcmp(t, "json_object")) {
        r->constrain = MS_API_CONSTRAIN_JSON_OBJECT;
        r->constrain_param = param;
        return MS_OK;
    }
    if (strcmp(t, "json_schema"))
        return BAD(param, "'%s.type' must be \"text\", \"json_object\" or \"json_schema\", got \"%.32s\"", param, t);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(f, "json_schema");
    const cJSON *holder = cJSON_IsObject(js) ? js : f; /* chat: json_schema.{name,schema,strict}; Responses: flat */
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(holder, "schema"),
                *strict = cJSON_GetObjectItemCaseSensitive(holder, "strict"),
                *name = cJSON_GetObjectItemCaseSensitive(holder, "name");
    if (js && !cJSON_IsObject(js)) return BAD(param, "'%s.json_schema' must be an object", param);
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict)) return BAD(param, "'%s' strict must be a boolean", param);
    if (name && !cJSON_IsNull(name) && !cJSON_IsString(name)) return BAD(param, "'%s' name must be a string", param);
    if (!schema || cJSON_IsNull(schema)) {
        r->constrain = MS_API_CONSTRAIN_JSON_OBJECT; /* a json_schema without a schema: any JSON object */
        r->constrain_param = param;
        return MS_OK;
    }
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema)) return BAD(param, "'%s' schema must be a JSON Schema object", param);
    free(r->schema_json);
    if (!(r->schema_json = cJSON_PrintUnformatted(schema))) return NOMEM();
    r->constrain = MS_API_CONSTRAIN_SCHEMA;
    r->constrain_param = param;
    return MS_OK;
}

/* A GBNF "literal" of s (bytes; quotes, backslashes and control bytes escaped). */
static int sb_str(sbuf *b, const char *s) { return sb_add(b, s, strlen(s)); }

static int gbnf_lit(sbuf *b, const char *s) {
    int rc = sb_add(b, "\"", 1);
    for (; !rc && *s; s++) {
        unsigned char c = (unsigned char)*s;
        char x[8];
        if (c == '"' || c == '\\') snprintf(x, sizeof x, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) snprintf(x, sizeof x, "\\x%02X", c);
        else x[0] = (char)c, x[1] = 0;
        rc = sb_add(b, x, strlen(x));
    }
    return rc ? rc : sb_add(b, "\"", 1);
}

static int grammar_error(const char *param, const char *what, int rc, const ms_err *err, ms_api_error *e) {
    if (rc == MS_ERR_NOMEM) return NOMEM();
    if (rc == MS_ERR_UNSUPPORTED)
        return UNSUPPORTED(param, "%s: %s", what, err->msg);
    return BAD(param, "%s: %s", what, err->msg);
}

#define MAX_FORCED_TOOLS 64

/* Qwen3 (Hermes style): <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call> */
static int tool_grammar(const ms_api_request *r, ms_outfmt fmt, ms_grammar **out, ms_api_error *e) {
    const char *param = r->constrain_param ? r->constrain_param : "tool_choice";
    if (fmt != MS_OUTFMT_QWEN3)
        return UNSUPPORTED(param, "'%s' forcing a tool call is not supported yet for this model family's tool-call syntax "
                                  "(Qwen3's <tool_call> only); use \"auto\"", param);
    cJSON *tools = r->tools_json ? cJSON_Parse(r->tools_json) : NULL;
    if (!tools || !cJSON_GetArraySize(tools)) {
        cJSON_Delete(tools);
        return BAD(param, "'%s' forces a tool call, but the request has no tools", param);
    }
    sbuf g = {0};
    const char *names[MAX_FORCED_TOOLS], *schemas[MAX_FORCED_TOOLS];
    char *owned[MAX_FORCED_TOOLS], rn[MAX_FORCED_TOOLS][16];
    int n = 0, rc = MS_OK, found = 0, idx = 0;
    rc = sb_add(&g, "root ::= ", 9) ? NOMEM() : MS_OK;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function"), *nm = cJSON_GetObjectItemCaseSensitive(f, "name"),
                    *ps = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        int i = idx++;
        if (rc || !cJSON_IsString(nm)) continue;
        if (r->forced_tool && strcmp(r->forced_tool, nm->valuestring)) continue;
        found = 1;
        if (n >= MAX_FORCED_TOOLS) { rc = UNSUPPORTED(param, "'%s': at most %d tools can be forced", param, MAX_FORCED_TOOLS); break; }
        cJSON *js = cJSON_CreateString(nm->valuestring);
        char *jname = js ? cJSON_PrintUnformatted(js) : NULL;
        cJSON_Delete(js);
        owned[n] = cJSON_IsObject(ps) ? cJSON_PrintUnformatted(ps) : strdup("{\"type\":\"object\",\"properties\":{}}");
        if (!jname || !owned[n]) { free(jname); free(owned[n]); rc = NOMEM(); break; }
        snprintf(rn[n], sizeof rn[n], "args%d", i);
        names[n] = rn[n], schemas[n] = owned[n];
        char head[64];
        int bad = (n && sb_add(&g, " | ", 3)) || sb_str(&g, "\"<tool_call>\\n{\\\"name\\\": \" ") ||
                  gbnf_lit(&g, jname) || sb_str(&g, " \", \\\"arguments\\\": \" ");
        snprintf(head, sizeof head, "%s \"}\\n</tool_call>\"", rn[n]);
        bad = bad || sb_add(&g, head, strlen(head));
        free(jname);
        n++;
        if (bad) { rc = NOMEM(); break; }
    }
    if (!rc && !found)
        rc = BAD(param, "'%s' names the function '%.64s', which is not in 'tools'", param, r->forced_tool ? r->forced_tool : "");
    if (!rc && sb_add(&g, "\n", 1)) rc = NOMEM();
    if (!rc) {
        ms_err err = {0};
        int grc = ms_grammar_from_gbnf(g.p, g.n, names, schemas, (size_t)n, NULL, out, &err);
        if (grc) rc = grammar_error(param, "a tool's parameters", grc, &err, e);
    }
    for (int i = 0; i < n; i++) free(owned[i]);
    free(g.p);
    cJSON_Delete(tools);
    return rc;
}

int ms_api_constraint_grammar(const ms_api_request *r, ms_outfmt fmt, int close_reasoning, ms_grammar **out,
                              const char **lead, ms_api_error *e) {
    *out = NULL;
    *lead = NULL;
    const char *param = r->constrain_param ? r->constrain_param : "response_format";
    ms_err err = {0};
    int rc = MS_OK;
    switch (r->constrain) {
    case MS_API_CONSTRAIN_NONE: return MS_OK;
    case MS_API_CONSTRAIN_JSON_OBJECT:
        if ((rc = ms_grammar_json(MS_GRAMMAR_JSON_OBJECT, NULL, out, &err))) return grammar_error(param, "json_object", rc, &err, e);
        break;
    case MS_API_CONSTRAIN_SCHEMA:
        if ((rc = ms_grammar_from_schema(r->schema_json, strlen(r->schema_json), NULL, out, &err)))
            return grammar_error(param, "the JSON Schema", rc, &err, e);
        break;
    case MS_API_CONSTRAIN_TOOL:
        if ((rc = tool_grammar(r, fmt, out, e))) return rc;
        break;
    default: return BAD(param, "unknown constraint");
    }
    /* a prompt that opened a reasoning block: close it before the constrained text */
    if (close_reasoning && fmt != MS_OUTFMT_HARMONY && fmt != MS_OUTFMT_XTML) *lead = "</think>\n\n";
    return MS_OK;
}
