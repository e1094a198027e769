/* api_constrain.c — constrained decoding for the API: response_format / text.format
 * (json_object, json_schema) and forced tool calls (tool_choice required or named) as grammars
 * (grammar/grammar.h) in the model family's own tool-call syntax. */
#include <stdarg.h>
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
#define MAX_BINDS 1024

/* A grammar being written: GBNF text and its schema bindings (rule name -> JSON Schema). */
typedef struct tgram {
    sbuf g;
    const ms_tokenizer *tok;
    char *bname[MAX_BINDS], *bjson[MAX_BINDS];
    int nb;
    int nomem;
} tgram;

static void tg_raw(tgram *t, const char *s) { t->nomem |= sb_str(&t->g, s) != 0; }
static void tg_lit(tgram *t, const char *s) { t->nomem |= gbnf_lit(&t->g, s) != 0; }
static void tg_fmt(tgram *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tg_fmt(tgram *t, const char *fmt, ...) {
    char b[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    tg_raw(t, b);
}
/* A frame marker: the token reference <[id]> when the tokenizer has it as one special token
 * (it is never text then), else its text as a literal (Qwen3's <tool_call> is plain text). */
static void tg_mark(tgram *t, const char *text) {
    int32_t id = t->tok ? ms_tok_token_id(t->tok, text) : -1;
    if (id >= 0 && ms_tok_is_special(t->tok, id)) tg_fmt(t, " <[%d]> ", (int)id);
    else {
        tg_raw(t, " ");
        tg_lit(t, text);
        tg_raw(t, " ");
    }
}
/* Bind a new rule to the JSON Schema text json (taken); writes its name into the grammar. */
static void tg_bind(tgram *t, char *json) {
    if (!json || t->nb >= MAX_BINDS) {
        free(json);
        t->nomem = 1;
        return;
    }
    char nm[16];
    snprintf(nm, sizeof nm, "js%d", t->nb);
    t->bname[t->nb] = strdup(nm);
    t->bjson[t->nb] = json;
    if (!t->bname[t->nb]) t->nomem = 1;
    t->nb++;
    tg_fmt(t, " %s ", nm);
}
static void tg_free(tgram *t) {
    for (int i = 0; i < t->nb; i++) free(t->bname[i]), free(t->bjson[i]);
    free(t->g.p);
}
static int tg_compile(tgram *t, const char *param, const char *what, ms_grammar **out, ms_api_error *e) {
    if (t->nomem || sb_add(&t->g, "\n", 1)) return NOMEM();
    ms_err err = {0};
    int grc = ms_grammar_from_gbnf(t->g.p, t->g.n, (const char *const *)t->bname, (const char *const *)t->bjson,
                                   (size_t)t->nb, NULL, out, &err);
    return grc ? grammar_error(param, what, grc, &err, e) : MS_OK;
}

/* XML attribute text (XTML): & and " escaped as the encoder writes them. */
static char *xml_attr(const char *s) {
    sbuf b = {0};
    int bad = sb_add(&b, "", 0);
    for (; *s && !bad; s++)
        bad = *s == '&' ? sb_str(&b, "&amp;") : *s == '"' ? sb_str(&b, "&quot;") : sb_add(&b, s, 1);
    if (bad) free(b.p);
    return bad ? NULL : b.p;
}

/* A property schema as a document of its own: the root's $defs / definitions come along so
 * that "#/$defs/..." references still resolve. */
static char *sub_schema(const cJSON *root, const cJSON *sub) {
    if (!cJSON_IsObject(sub)) return cJSON_PrintUnformatted(sub);
    cJSON *d = cJSON_Duplicate(sub, 1);
    const char *keys[] = {"$defs", "definitions"};
    for (int i = 0; d && i < 2; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (x && !cJSON_GetObjectItemCaseSensitive(d, keys[i])) cJSON_AddItemToObject(d, keys[i], cJSON_Duplicate(x, 1));
    }
    char *o = d ? cJSON_PrintUnformatted(d) : NULL;
    cJSON_Delete(d);
    return o;
}

/* The one JSON type a property schema declares (XTML's type attribute: "string", "number" for
 * number and integer, "boolean", "object", "array", "null"), or NULL when it admits several or
 * says none (a combinator, a $ref, an enum without a type). */
static const char *single_type(const cJSON *s) {
    if (!cJSON_IsObject(s)) return NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type"), *nl = cJSON_GetObjectItemCaseSensitive(s, "nullable");
    if (cJSON_IsTrue(nl)) return NULL;
    if (cJSON_GetObjectItemCaseSensitive(s, "anyOf") || cJSON_GetObjectItemCaseSensitive(s, "oneOf") ||
        cJSON_GetObjectItemCaseSensitive(s, "allOf") || cJSON_GetObjectItemCaseSensitive(s, "$ref"))
        return NULL;
    if (cJSON_IsArray(t) && cJSON_GetArraySize(t) == 1) t = cJSON_GetArrayItem(t, 0);
    if (!cJSON_IsString(t)) return NULL;
    const char *n = t->valuestring;
    if (!strcmp(n, "integer")) return "number";
    static const char *const ok[] = {"string", "number", "boolean", "object", "array", "null"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(n, ok[i])) return ok[i];
    return NULL;
}

/* Can a value of schema s (inside the document root) be a JSON string? Local "#/..."
 * references are followed; anything not understood counts as yes. */
static int may_be_string(const cJSON *root, const cJSON *s, int depth) {
    if (depth > 32) return 1;
    if (cJSON_IsBool(s)) return cJSON_IsTrue(s);
    if (!cJSON_IsObject(s)) return 1;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (cJSON_IsString(ref)) {
        const char *q = ref->valuestring;
        if (q[0] != '#') return 1;
        const cJSON *at = root;
        for (q++; *q == '/' && at;) {
            char seg[128];
            size_t n = strcspn(q + 1, "/");
            if (n >= sizeof seg) return 1;
            memcpy(seg, q + 1, n);
            seg[n] = 0;
            at = cJSON_GetObjectItemCaseSensitive(at, seg);
            q += 1 + n;
        }
        return !at || *q ? 1 : may_be_string(root, at, depth + 1);
    }
    const char *combos[] = {"anyOf", "oneOf", "allOf"};
    for (int i = 0; i < 3; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(s, combos[i]), *x;
        if (!a) continue;
        int any = 0;
        cJSON_ArrayForEach(x, a) any |= may_be_string(root, x, depth + 1);
        return any;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type"), *x;
    if (cJSON_IsString(t)) return !strcmp(t->valuestring, "string");
    if (cJSON_IsArray(t)) {
        int any = 0;
        cJSON_ArrayForEach(x, t) any |= cJSON_IsString(x) && !strcmp(x->valuestring, "string");
        return any;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cn) return cJSON_IsString(cn);
    if (cJSON_IsArray(en)) {
        int any = 0;
        cJSON_ArrayForEach(x, en) any |= cJSON_IsString(x);
        return any;
    }
    return 1;
}

/* A string value written raw (GLM's <arg_value>, XTML's string argument): the characters a
 * JSON string holds without escapes, and no '<' (a raw value cannot hold a frame marker), so
 * the raw text is the JSON string's content exactly. enum / const / format / minLength /
 * maxLength apply; other keywords were refused by the schema check before. */
static void raw_string(tgram *t, const cJSON *s) {
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(s, "const"),
                *fm = cJSON_GetObjectItemCaseSensitive(s, "format");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minLength"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    if (cJSON_IsString(cn)) {
        tg_raw(t, " ( ");
        tg_lit(t, cn->valuestring);
        tg_raw(t, " ) ");
        return;
    }
    if (cJSON_IsArray(en)) {
        int k = 0;
        const cJSON *x;
        tg_raw(t, " ( ");
        cJSON_ArrayForEach(x, en) if (cJSON_IsString(x)) {
            if (k++) tg_raw(t, " | ");
            tg_lit(t, x->valuestring);
        }
        tg_raw(t, k ? " ) " : " \"\" ) "); /* no string in the enum: the schema check refused it already */
        return;
    }
    const char *f = cJSON_IsString(fm) ? ms_grammar_format_gbnf(fm->valuestring) : NULL;
    if (f) {
        tg_fmt(t, " ( %s ) ", f);
        return;
    }
    tg_raw(t, " [^\"\\\\<\\x00-\\x1F]");
    int lo = cJSON_IsNumber(mn) ? (int)mn->valuedouble : 0, hi = cJSON_IsNumber(mx) ? (int)mx->valuedouble : -1;
    if (lo <= 0 && hi < 0) tg_raw(t, "* ");
    else if (hi < 0) tg_fmt(t, "{%d,} ", lo);
    else tg_fmt(t, "{%d,%d} ", lo, hi);
}

/* Key/value arguments (GLM, XTML): each declared property in schema order, the required ones
 * always, the others optional; a string value raw, any other value JSON bound to its schema.
 * Returns 0, or a 400 for a schema this form cannot carry (GLM: a property that may be a string
 * without being declared one, a required name without a property). xtml: write XTML elements
 * (and require single_type), else GLM's. */
static int kv_args(tgram *t, const cJSON *ps, int xtml, const char *fname, const char *param, ms_api_error *e) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(ps, "properties"), *req = cJSON_GetObjectItemCaseSensitive(ps, "required");
    const cJSON *r;
    cJSON_ArrayForEach(r, req) if (!cJSON_IsString(r) || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
        return UNSUPPORTED(param, "'%s': the parameters of '%.64s' require a name that is not in 'properties'; this model "
                                  "family's key/value tool-call syntax needs every argument declared",
                           param, fname);
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        int required = 0;
        cJSON_ArrayForEach(r, req) required |= cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
        const char *ty = single_type(p);
        if (!ty && !xtml && may_be_string(ps, p, 0))
            /* GLM tells strings from JSON by the declared type: a value that may be a string
             * must be declared "type": "string" */
            return UNSUPPORTED(param, "'%s': argument '%.64s' of '%.64s' may be a string without being declared "
                                      "\"type\": \"string\", which GLM's tool-call syntax cannot tell from JSON",
                               param, p->string, fname);
        tg_raw(t, " ( ");
        if (xtml) {
            char *k = xml_attr(p->string);
            if (!k) return NOMEM();
            tg_mark(t, "<|open|>");
            sbuf h = {0};
            int bad = sb_str(&h, "argument key=\"") || sb_str(&h, k) || sb_str(&h, "\" type=\"") || sb_str(&h, ty) || sb_str(&h, "\"");
            free(k);
            if (bad) { free(h.p); return NOMEM(); }
            tg_lit(t, h.p);
            free(h.p);
            tg_mark(t, "<|sep|>");
        } else {
            tg_mark(t, "<arg_key>");
            tg_lit(t, p->string);
            tg_mark(t, "</arg_key>");
            tg_lit(t, "\n");
            tg_mark(t, "<arg_value>");
        }
        if (ty && !strcmp(ty, "string")) raw_string(t, p);
        else tg_bind(t, sub_schema(ps, p));
        if (xtml) {
            tg_mark(t, "<|close|>");
            tg_lit(t, "argument");
            tg_mark(t, "<|sep|>");
        } else {
            tg_mark(t, "</arg_value>");
            tg_lit(t, "\n");
        }
        tg_raw(t, required ? " ) " : " )? ");
    }
    return MS_OK;
}

/* XTML arguments can be written as typed key/value elements: every property has one type. */
static int xtml_kv_ok(const cJSON *ps) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(ps, "properties"), *req = cJSON_GetObjectItemCaseSensitive(ps, "required"), *x;
    cJSON_ArrayForEach(x, props) if (!single_type(x)) return 0;
    cJSON_ArrayForEach(x, req) if (!cJSON_IsString(x) || !cJSON_GetObjectItemCaseSensitive(props, x->valuestring)) return 0;
    return 1;
}

/* One call of function name with parameter schema ps (a JSON Schema object), in fmt's syntax
 * (the frame around the calls is written by tool_grammar). */
static int one_call(tgram *t, ms_outfmt fmt, const char *name, const cJSON *ps, const char *param, ms_api_error *e) {
    int rc = MS_OK;
    char *js = ps ? cJSON_PrintUnformatted(ps) : NULL;
    if (!js) return NOMEM();
    sbuf h = {0};
    switch (fmt) {
    case MS_OUTFMT_QWEN3: {
        cJSON *jn = cJSON_CreateString(name);
        char *q = jn ? cJSON_PrintUnformatted(jn) : NULL;
        cJSON_Delete(jn);
        if (!q || sb_str(&h, "{\"name\": ") || sb_str(&h, q) || sb_str(&h, ", \"arguments\": ")) { free(q); rc = NOMEM(); break; }
        free(q);
        tg_mark(t, "<tool_call>");
        tg_lit(t, "\n");
        tg_lit(t, h.p);
        tg_bind(t, js), js = NULL;
        tg_lit(t, "}\n");
        tg_mark(t, "</tool_call>");
        break;
    }
    case MS_OUTFMT_DEEPSEEK_V3:
        tg_mark(t, "<｜tool▁call▁begin｜>");
        tg_lit(t, "function");
        tg_mark(t, "<｜tool▁sep｜>");
        tg_lit(t, name);
        tg_lit(t, "\n```json\n");
        tg_bind(t, js), js = NULL;
        tg_lit(t, "\n```");
        tg_mark(t, "<｜tool▁call▁end｜>");
        break;
    case MS_OUTFMT_DEEPSEEK_V31:
        tg_mark(t, "<｜tool▁call▁begin｜>");
        tg_lit(t, name);
        tg_mark(t, "<｜tool▁sep｜>");
        tg_bind(t, js), js = NULL;
        tg_mark(t, "<｜tool▁call▁end｜>");
        break;
    case MS_OUTFMT_KIMI_K2:
        if (sb_str(&h, "functions.") || sb_str(&h, name) || sb_str(&h, ":")) { rc = NOMEM(); break; }
        tg_mark(t, "<|tool_call_begin|>");
        tg_lit(t, h.p);
        tg_raw(t, " ( \"0\" | [1-9] [0-9]{0,3} ) "); /* the call's index in the conversation */
        tg_mark(t, "<|tool_call_argument_begin|>");
        tg_bind(t, js), js = NULL;
        tg_mark(t, "<|tool_call_end|>");
        break;
    case MS_OUTFMT_GLM:
        tg_mark(t, "<tool_call>");
        tg_lit(t, name);
        tg_lit(t, "\n");
        rc = kv_args(t, ps, 0, name, param, e);
        tg_mark(t, "</tool_call>");
        break;
    case MS_OUTFMT_HARMONY:
        if (sb_str(&h, "commentary to=functions.") || sb_str(&h, name) || sb_str(&h, " ")) { rc = NOMEM(); break; }
        tg_mark(t, "<|channel|>");
        tg_lit(t, h.p);
        tg_mark(t, "<|constrain|>");
        tg_lit(t, "json");
        tg_mark(t, "<|message|>");
        tg_bind(t, js), js = NULL;
        tg_mark(t, "<|call|>");
        break;
    case MS_OUTFMT_XTML: {
        char *an = xml_attr(name);
        if (!an || sb_str(&h, "call tool=\"") || sb_str(&h, an) || sb_str(&h, "\" index=\"")) { free(an); rc = NOMEM(); break; }
        free(an);
        tg_mark(t, "<|open|>");
        tg_lit(t, h.p);
        tg_raw(t, " [1-9] [0-9]{0,2} \"\\\"\" ");
        tg_mark(t, "<|sep|>");
        if (xtml_kv_ok(ps)) rc = kv_args(t, ps, 1, name, param, e);
        else { /* the encoder's form for arguments it cannot type */
            tg_mark(t, "<|open|>");
            tg_lit(t, "json type=\"object\"");
            tg_mark(t, "<|sep|>");
            tg_bind(t, js), js = NULL;
            tg_mark(t, "<|close|>");
            tg_lit(t, "json");
            tg_mark(t, "<|sep|>");
        }
        tg_mark(t, "<|close|>");
        tg_lit(t, "call");
        tg_mark(t, "<|sep|>");
        break;
    }
    default:
        rc = UNSUPPORTED(param, "'%s' forcing a tool call needs a model family with a tool-call syntax; this server's output "
                                "format (%s) has none: use \"auto\" or --parser",
                         param, ms_outfmt_name(fmt));
    }
    free(js);
    free(h.p);
    return rc;
}

/* XTML: close an opened think element and write the (empty) response element before a
 * tools element (in_reasoning: the prompt ends in <|open|>think<|sep|>, else in
 * <|open|>response<|sep|>, as the K3 encoder's generation prompts do). */
static void xtml_pre(tgram *t, int in_reasoning, int keep_response_open) {
    if (in_reasoning) {
        tg_mark(t, "<|close|>");
        tg_lit(t, "think");
        tg_mark(t, "<|sep|>");
        tg_mark(t, "<|open|>");
        tg_lit(t, "response");
        tg_mark(t, "<|sep|>");
    }
    if (!keep_response_open) {
        tg_mark(t, "<|close|>");
        tg_lit(t, "response");
        tg_mark(t, "<|sep|>");
    }
}

/* tool_choice required / named: one call (or, required with parallel_tool_calls, one or
 * more) of the tools in fmt's own frame, each call's arguments bound to its parameter schema
 * (none: an object without properties). The schemas are compiled alone first, so that an
 * unsupported keyword is named with its pointer inside the parameters. */
static int tool_grammar(const ms_api_request *r, ms_outfmt fmt, const ms_tokenizer *tok, int in_reasoning, ms_grammar **out,
                        ms_api_error *e) {
    const char *param = r->constrain_param ? r->constrain_param : "tool_choice";
    cJSON *tools = r->tools_json ? cJSON_Parse(r->tools_json) : NULL;
    if (!tools || !cJSON_GetArraySize(tools)) {
        cJSON_Delete(tools);
        return BAD(param, "'%s' forces a tool call, but the request has no tools", param);
    }
    tgram t = {.tok = tok};
    int rc = MS_OK, n = 0;
    cJSON *empty = cJSON_Parse("{\"type\":\"object\",\"properties\":{}}");
    if (!empty) rc = NOMEM();
    tg_raw(&t, "call ::= ");
    const cJSON *x;
    cJSON_ArrayForEach(x, tools) {
        if (rc) break;
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(x, "function"), *nm = cJSON_GetObjectItemCaseSensitive(f, "name"),
                    *ps = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (!cJSON_IsString(nm) || (r->forced_tool && strcmp(r->forced_tool, nm->valuestring))) continue;
        if (n >= MAX_FORCED_TOOLS) { rc = UNSUPPORTED(param, "'%s': at most %d tools can be forced", param, MAX_FORCED_TOOLS); break; }
        if (!cJSON_IsObject(ps)) ps = empty;
        char *js = cJSON_PrintUnformatted(ps);
        ms_grammar *chk = NULL;
        ms_err err = {0};
        int grc = js ? ms_grammar_from_schema(js, strlen(js), NULL, &chk, &err) : MS_ERR_NOMEM;
        free(js);
        ms_grammar_free(chk);
        if (grc) {
            char what[160];
            snprintf(what, sizeof what, "the parameters of '%.64s'", nm->valuestring);
            rc = grammar_error(param, what, grc, &err, e);
            break;
        }
        tg_raw(&t, n ? "\n  | ( " : " ( ");
        rc = one_call(&t, fmt, nm->valuestring, ps, param, e);
        tg_raw(&t, " )");
        n++;
    }
    if (!rc && !n)
        rc = BAD(param, "'%s' names the function '%.64s', which is not in 'tools'", param, r->forced_tool ? r->forced_tool : "");
    int many = !r->forced_tool && r->parallel_tool_calls && fmt != MS_OUTFMT_HARMONY; /* harmony: one call per message */
    if (!rc) {
        tg_raw(&t, "\nroot ::= ");
        switch (fmt) {
        case MS_OUTFMT_QWEN3:
        case MS_OUTFMT_GLM: tg_raw(&t, many ? "call ( \"\\n\" call )*" : "call"); break;
        case MS_OUTFMT_DEEPSEEK_V3:
            tg_mark(&t, "<｜tool▁calls▁begin｜>");
            tg_raw(&t, many ? " call ( \"\\n\" call )* " : " call ");
            tg_mark(&t, "<｜tool▁calls▁end｜>");
            break;
        case MS_OUTFMT_DEEPSEEK_V31:
            tg_mark(&t, "<｜tool▁calls▁begin｜>");
            tg_raw(&t, many ? " call+ " : " call ");
            tg_mark(&t, "<｜tool▁calls▁end｜>");
            break;
        case MS_OUTFMT_KIMI_K2:
            tg_mark(&t, "<|tool_calls_section_begin|>");
            tg_raw(&t, many ? " call+ " : " call ");
            tg_mark(&t, "<|tool_calls_section_end|>");
            break;
        case MS_OUTFMT_XTML:
            xtml_pre(&t, in_reasoning, 0);
            tg_mark(&t, "<|open|>");
            tg_lit(&t, "tools");
            tg_mark(&t, "<|sep|>");
            tg_raw(&t, many ? " call+ " : " call ");
            tg_mark(&t, "<|close|>");
            tg_lit(&t, "tools");
            tg_mark(&t, "<|sep|>");
            tg_mark(&t, "<|close|>");
            tg_lit(&t, "message");
            tg_mark(&t, "<|sep|>");
            break;
        default: tg_raw(&t, "call"); break;
        }
        rc = tg_compile(&t, param, "the tool-call grammar", out, e);
    }
    tg_free(&t);
    cJSON_Delete(empty);
    cJSON_Delete(tools);
    return rc;
}

/* response_format for the families whose content sits in a frame of special tokens: harmony's
 * final channel, XTML's response element. schema_json NULL: any JSON object. */
static int framed_format(const char *schema_json, ms_outfmt fmt, const ms_tokenizer *tok, int in_reasoning, const char *param,
                         ms_grammar **out, ms_api_error *e) {
    tgram t = {.tok = tok};
    tg_raw(&t, "root ::= ");
    if (fmt == MS_OUTFMT_HARMONY) {
        tg_mark(&t, "<|channel|>");
        tg_lit(&t, "final");
        tg_mark(&t, "<|message|>");
    } else xtml_pre(&t, in_reasoning, 1);
    char *js = strdup(schema_json ? schema_json : "{\"type\":\"object\"}");
    tg_bind(&t, js);
    if (fmt == MS_OUTFMT_XTML) {
        tg_mark(&t, "<|close|>");
        tg_lit(&t, "response");
        tg_mark(&t, "<|sep|>");
        tg_mark(&t, "<|close|>");
        tg_lit(&t, "message");
        tg_mark(&t, "<|sep|>");
    }
    int rc = tg_compile(&t, param, schema_json ? "the JSON Schema" : "json_object", out, e);
    tg_free(&t);
    return rc;
}

int ms_api_constraint_grammar(const ms_api_request *r, ms_outfmt fmt, const ms_tokenizer *tok, int close_reasoning,
                              ms_grammar **out, const char **lead, ms_api_error *e) {
    *out = NULL;
    *lead = NULL;
    const char *param = r->constrain_param ? r->constrain_param : "response_format";
    ms_err err = {0};
    int rc = MS_OK, framed = fmt == MS_OUTFMT_HARMONY || fmt == MS_OUTFMT_XTML;
    switch (r->constrain) {
    case MS_API_CONSTRAIN_NONE: return MS_OK;
    case MS_API_CONSTRAIN_JSON_OBJECT:
    case MS_API_CONSTRAIN_SCHEMA: {
        const char *sj = r->constrain == MS_API_CONSTRAIN_SCHEMA ? r->schema_json : NULL;
        if (sj && (rc = ms_grammar_from_schema(sj, strlen(sj), NULL, out, &err)))
            return grammar_error(param, "the JSON Schema", rc, &err, e);
        if (!sj && (rc = ms_grammar_json(MS_GRAMMAR_JSON_OBJECT, NULL, out, &err))) return grammar_error(param, "json_object", rc, &err, e);
        if (framed) { /* the same document inside the family's content frame */
            ms_grammar_free(*out);
            *out = NULL;
            if ((rc = framed_format(sj, fmt, tok, close_reasoning, param, out, e))) return rc;
        }
        break;
    }
    case MS_API_CONSTRAIN_TOOL:
        if ((rc = tool_grammar(r, fmt, tok, close_reasoning, out, e))) return rc;
        break;
    default: return BAD(param, "unknown constraint");
    }
    /* a prompt that opened a reasoning block: close it before the constrained text (harmony and
     * XTML frames say it themselves) */
    if (close_reasoning && !framed) *lead = "</think>\n\n";
    return MS_OK;
}

int ms_api_constraint_grammar_cached(ms_grammar_cache *cache, const ms_api_request *r, ms_outfmt fmt, const ms_tokenizer *tok,
                                     int close_reasoning, ms_grammar **out, const char **lead, ms_api_error *e) {
    *out = NULL;
    *lead = NULL;
    if (!cache || r->constrain == MS_API_CONSTRAIN_NONE) return ms_api_constraint_grammar(r, fmt, tok, close_reasoning, out, lead, e);
    sbuf k = {0};
    char head[96];
    snprintf(head, sizeof head, "%d|%d|%d|%d|%d|", r->constrain, (int)fmt, !!close_reasoning, r->parallel_tool_calls,
             r->forced_tool ? 1 : 0);
    const char *parts[] = {head, r->forced_tool ? r->forced_tool : "", "|", r->constrain == MS_API_CONSTRAIN_SCHEMA ? r->schema_json : "",
                           "|", r->constrain == MS_API_CONSTRAIN_TOOL && r->tools_json ? r->tools_json : ""};
    int bad = 0;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) bad |= sb_str(&k, parts[i]) != 0;
    if (bad) {
        free(k.p);
        return NOMEM();
    }
    ms_grammar *g = ms_grammar_cache_get(cache, k.p, k.n);
    int rc = MS_OK;
    if (g) {
        *out = g;
        if (close_reasoning && fmt != MS_OUTFMT_HARMONY && fmt != MS_OUTFMT_XTML) *lead = "</think>\n\n";
    } else if (!(rc = ms_api_constraint_grammar(r, fmt, tok, close_reasoning, out, lead, e)) && *out) {
        ms_grammar_cache_put(cache, k.p, k.n, *out);
    }
    free(k.p);
    return rc;
}
