/* XTML renderer: follows encoding_k3.py's build_chat_segments step by step
 * (tool-result reordering, argument normalisation, key sorting, the order of
 * the internal system messages). See xtml.h for the request mapping. */
#include "text/xtml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"

#define XT_OPEN "<|open|>"
#define XT_CLOSE "<|close|>"
#define XT_SEP "<|sep|>"
#define XT_EOM "<|end_of_msg|>"
#define XT_IMAGE "<|kimi_image_placeholder|>"
#define XT_MAX_DEPTH 512
#define XT_MAX_OUT (256u << 20)

typedef struct {
    ms_textbuf *b;
    ms_err *err;
    const ms_py *image_prompts; /* list or NULL */
    size_t image_next;
} xt;

static int nomem(xt *x) {
    if (x->b->failed == MS_ERR_LIMIT)
        return ms_fail(x->err, MS_ERR_LIMIT, "xtml: rendered prompt over %u bytes", XT_MAX_OUT);
    return ms_fail(x->err, MS_ERR_NOMEM, "xtml: out of memory");
}

static const char *type_name(const ms_py *v) {
    static const char *names[] = {"null", "bool", "int", "float", "str", "list", "dict"};
    return v ? names[v->type] : "missing";
}

/* ---- segments ---- */

static void put(xt *x, const char *s) { ms_textbuf_puts(x->b, s); }

/* str(v) with & and " escaped, as _escape_attr_value */
static int attr(xt *x, const char *key, const ms_py *v, const char *what) {
    ms_textbuf t = {0};
    int st = ms_py_str(&t, v, what, x->err);
    if (st) {
        ms_textbuf_free(&t);
        return st;
    }
    put(x, " ");
    put(x, key);
    put(x, "=\"");
    for (size_t i = 0; i < t.len; i++) {
        if (t.data[i] == '&') put(x, "&amp;");
        else if (t.data[i] == '"') put(x, "&quot;");
        else ms_textbuf_append(x->b, t.data + i, 1);
    }
    put(x, "\"");
    ms_textbuf_free(&t);
    return MS_OK;
}

static void attr_int(xt *x, const char *key, size_t v) {
    char t[32];
    snprintf(t, sizeof t, " %s=\"%zu\"", key, v);
    put(x, t);
}

static void open_tag(xt *x, const char *tag) {
    put(x, XT_OPEN);
    put(x, tag);
}
static void close_tag(xt *x, const char *tag) {
    put(x, XT_CLOSE);
    put(x, tag);
    put(x, XT_SEP);
}

static int next_image_prompt(xt *x) {
    if (!x->image_prompts) {
        put(x, XT_IMAGE);
        return MS_OK;
    }
    if (x->image_next >= x->image_prompts->n)
        return ms_fail(x->err, MS_ERR_FORMAT, "xtml: more image placeholders than image prompts");
    return ms_py_str(x->b, x->image_prompts->items[x->image_next++], "xtml: image prompt", x->err);
}

/* _append_text: str(v), with image placeholders replaced when prompts are given */
static int append_text(xt *x, const ms_py *v, const char *what) {
    if (!x->image_prompts || v->type != MS_PY_STR) return ms_py_str(x->b, v, what, x->err);
    const char *s = v->s, *end = v->s + v->slen;
    size_t pl = strlen(XT_IMAGE);
    for (;;) {
        const char *hit = memmem(s, end - s, XT_IMAGE, pl);
        if (!hit) break;
        ms_textbuf_append(x->b, s, hit - s);
        int st = next_image_prompt(x);
        if (st) return st;
        s = hit + pl;
    }
    ms_textbuf_append(x->b, s, end - s);
    return MS_OK;
}

static int content(xt *x, const ms_py *c, size_t mi) {
    char what[64];
    snprintf(what, sizeof what, "xtml: messages[%zu].content", mi);
    if (!c || c->type == MS_PY_NULL) return MS_OK;
    if (c->type == MS_PY_STR) return append_text(x, c, what);
    if (c->type == MS_PY_DICT && c->n == 0) return MS_OK; /* iterating {} renders nothing */
    if (c->type != MS_PY_LIST)
        return ms_fail(x->err, MS_ERR_FORMAT, "%s must be a string, a list of parts or null, not %s",
                       what, type_name(c));
    for (size_t i = 0; i < c->n; i++) {
        const ms_py *part = c->items[i];
        const ms_py *type = ms_py_get(part, "type");
        if (!type)
            return ms_fail(x->err, MS_ERR_FORMAT, "%s[%zu] needs a \"type\"", what, i);
        if (ms_py_str_eq(type, "image") || ms_py_str_eq(type, "image_url")) {
            int st = next_image_prompt(x);
            if (st) return st;
            continue;
        }
        const ms_py *text = ms_py_get(part, "text");
        if (!text)
            return ms_fail(x->err, MS_ERR_FORMAT, "%s[%zu] needs a \"text\"", what, i);
        int st = append_text(x, text, what);
        if (st) return st;
    }
    return MS_OK;
}

static void internal_system(xt *x, const char *type, const char *body) {
    open_tag(x, "message");
    put(x, " role=\"system\" type=\"");
    put(x, type);
    put(x, "\"" XT_SEP);
    put(x, body);
    close_tag(x, "message");
    put(x, XT_EOM);
}

static void tool_declare(xt *x, const ms_py *tools, int dynamic) {
    open_tag(x, "message");
    put(x, " role=\"system\" type=\"tool-declare\"" XT_SEP);
    if (dynamic)
        put(x, "## New Tools Available\n"
               "The system dynamically extends the toolset via lazy-loading.\n"
               "You have access to all existing and extended tools.\n"
               "Here are the specs for the extended tools.\n\n"
               "```json\n");
    else
        put(x, "# Tools\n"
               "Here are the available tools, described in JSONSchema.\n\n"
               "```json\n");
    ms_py_dumps(x->b, tools, 1);
    put(x, "\n```");
    close_tag(x, "message");
    put(x, XT_EOM);
}

/* ---- normalisation (normalize_message, normalize_tool_arguments) ---- */

static void dict_del(ms_py *d, const char *key) {
    size_t kl = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->klens[i] == kl && memcmp(d->keys[i], key, kl) == 0) {
            ms_py_free(d->items[i]);
            free(d->keys[i]);
            memmove(d->items + i, d->items + i + 1, (d->n - i - 1) * sizeof(ms_py *));
            memmove(d->keys + i, d->keys + i + 1, (d->n - i - 1) * sizeof(char *));
            memmove(d->klens + i, d->klens + i + 1, (d->n - i - 1) * sizeof(size_t));
            d->n--;
            return;
        }
}

static int normalize_args(xt *x, ms_py *holder, size_t mi, size_t ci) {
    ms_py *a = ms_py_get(holder, "arguments");
    ms_py *parsed = NULL, *block = NULL;
    if (!a || a->type == MS_PY_NULL) {
        parsed = ms_py_new(MS_PY_DICT);
    } else if (a->type == MS_PY_DICT) {
        dict_del(holder, "_xtml_json_block");
        return MS_OK;
    } else if (a->type == MS_PY_STR) {
        if (!ms_py_str_has_nonspace(a->s, a->slen)) {
            parsed = ms_py_new(MS_PY_DICT);
        } else {
            ms_err e = {0};
            int st = ms_py_parse(a->s, a->slen, XT_MAX_DEPTH, "arguments", &parsed, &e);
            if (st == MS_ERR_FORMAT) {
                parsed = ms_py_new(MS_PY_DICT);
                block = ms_py_new_str(a->s, a->slen);
                if (!block) {
                    ms_py_free(parsed);
                    return nomem(x);
                }
            } else if (st) {
                return ms_fail(x->err, st, "xtml: messages[%zu].tool_calls[%zu] arguments: %s", mi,
                               ci, e.msg);
            } else if (parsed->type != MS_PY_DICT) {
                ms_py_free(parsed);
                return ms_fail(x->err, MS_ERR_FORMAT,
                               "xtml: messages[%zu].tool_calls[%zu]: tool call arguments must be a "
                               "JSON object", mi, ci);
            }
        }
    } else {
        return ms_fail(x->err, MS_ERR_FORMAT,
                       "xtml: messages[%zu].tool_calls[%zu]: tool call arguments must be a dict or "
                       "a JSON object string, not %s", mi, ci, type_name(a));
    }
    if (!parsed) {
        ms_py_free(block);
        return nomem(x);
    }
    if (ms_py_dict_set(holder, "arguments", 9, parsed)) {
        ms_py_free(block);
        return nomem(x);
    }
    /* the marker key: present only for a non-JSON argument string */
    dict_del(holder, "_xtml_json_block");
    if (block && ms_py_dict_set(holder, "_xtml_json_block", 16, block)) return nomem(x);
    return MS_OK;
}

static int normalize_message(xt *x, ms_py *m, size_t mi) {
    ms_py *tools = ms_py_get(m, "tools");
    if (tools && tools->type != MS_PY_NULL) ms_py_deep_sort(tools);
    ms_py *calls = ms_py_get(m, "tool_calls");
    if (!ms_py_truthy(calls)) return MS_OK;
    if (calls->type != MS_PY_LIST)
        return ms_fail(x->err, MS_ERR_FORMAT, "xtml: messages[%zu].tool_calls must be a list, not %s",
                       mi, type_name(calls));
    for (size_t ci = 0; ci < calls->n; ci++) {
        ms_py *tc = calls->items[ci];
        if (tc->type != MS_PY_DICT) continue;
        ms_py *fn = ms_py_get(tc, "function");
        ms_py *holder = fn && fn->type == MS_PY_DICT ? fn : tc;
        int st = normalize_args(x, holder, mi, ci);
        if (st) return st;
    }
    return MS_OK;
}

/* ---- tool-result reordering (normalize_xtml_tool_result_messages) ---- */

typedef struct {
    char *id;          /* str(call id) */
    size_t position;   /* 1-based */
    const ms_py *name; /* function name value, may be NULL (None) */
} call_ref;

static void free_refs(call_ref *r, size_t n) {
    for (size_t i = 0; i < n; i++) free(r[i].id);
    free(r);
}

/* str() of an id value; lists and dicts are unsupported */
static char *id_str(xt *x, const ms_py *v, int *st) {
    ms_textbuf t = {0};
    *st = ms_py_str(&t, v, "xtml: tool call id", x->err);
    if (*st) {
        ms_textbuf_free(&t);
        return NULL;
    }
    if (!t.data) ms_textbuf_append(&t, "", 0);
    if (t.failed) {
        ms_textbuf_free(&t);
        *st = nomem(x);
        return NULL;
    }
    return t.data;
}

static int build_index(xt *x, const ms_py *calls, call_ref **out, size_t *nout) {
    *out = NULL;
    *nout = 0;
    if (!calls || calls->type != MS_PY_LIST) return MS_OK; /* rendering rejects other truthy kinds */
    call_ref *r = calloc(calls->n ? calls->n : 1, sizeof *r);
    if (!r) return nomem(x);
    size_t n = 0;
    for (size_t i = 0; i < calls->n; i++) {
        const ms_py *tc = calls->items[i];
        if (tc->type != MS_PY_DICT) continue;
        const ms_py *id = ms_py_get(tc, "id");
        if (!id || id->type == MS_PY_NULL) continue;
        int st;
        char *key = id_str(x, id, &st);
        if (!key) {
            free_refs(r, n);
            return st;
        }
        int dup = 0;
        for (size_t j = 0; j < n; j++) dup |= strcmp(r[j].id, key) == 0;
        if (dup) {
            free(key);
            continue;
        }
        const ms_py *fn = ms_py_get(tc, "function");
        const ms_py *name = fn && fn->type == MS_PY_DICT ? ms_py_get(fn, "name") : ms_py_get(tc, "name");
        r[n].id = key;
        r[n].position = i + 1;
        r[n].name = name && name->type != MS_PY_NULL ? name : NULL;
        n++;
    }
    *out = r;
    *nout = n;
    return MS_OK;
}

static int is_role(const ms_py *m, const char *role) {
    return m->type == MS_PY_DICT && ms_py_str_eq(ms_py_get(m, "role"), role);
}

/* Fills order[] (a permutation of message indices) */
static int reorder_tool_results(xt *x, ms_py *msgs, size_t *order) {
    call_ref *refs = NULL;
    size_t nrefs = 0, i = 0, n = msgs->n, o = 0;
    size_t *pos = calloc(n ? n : 1, sizeof *pos);
    const ms_py **names = calloc(n ? n : 1, sizeof *names);
    if (!pos || !names) {
        free(pos);
        free(names);
        return nomem(x);
    }
    int st = MS_OK;
    while (i < n) {
        ms_py *m = msgs->items[i];
        if (is_role(m, "assistant")) {
            free_refs(refs, nrefs);
            refs = NULL;
            nrefs = 0;
            ms_py *calls = ms_py_get(m, "tool_calls");
            if (ms_py_truthy(calls) && (st = build_index(x, calls, &refs, &nrefs))) break;
            order[o++] = i++;
            continue;
        }
        if (!is_role(m, "tool")) {
            order[o++] = i++;
            continue;
        }
        size_t start = i;
        int unresolved = 0;
        while (i < n && is_role(msgs->items[i], "tool")) {
            ms_py *tm = msgs->items[i];
            ms_py *cid = ms_py_get(tm, "tool_call_id");
            if (!cid) cid = ms_py_get(tm, "id");
            pos[i] = 0;
            names[i] = NULL;
            if (cid && cid->type != MS_PY_NULL) {
                char *key = id_str(x, cid, &st);
                if (!key) goto done;
                for (size_t j = 0; j < nrefs; j++)
                    if (strcmp(refs[j].id, key) == 0) {
                        pos[i] = refs[j].position;
                        names[i] = refs[j].name;
                        break;
                    }
                free(key);
            }
            if (!pos[i]) unresolved = 1;
            i++;
        }
        if (unresolved) {
            for (size_t k = start; k < i; k++) order[o++] = k;
            continue;
        }
        /* stable sort of [start, i) by position (insertion sort keeps offsets ordered) */
        size_t base = o;
        for (size_t k = start; k < i; k++) {
            size_t j = o++;
            while (j > base && pos[order[j - 1]] > pos[k]) {
                order[j] = order[j - 1];
                j--;
            }
            order[j] = k;
        }
        for (size_t k = start; k < i; k++) {
            if (!names[k]) continue; /* matched call without a name: message kept as is */
            ms_py *tm = msgs->items[k];
            ms_py *c1 = ms_py_copy(names[k]);
            if (!c1 || ms_py_dict_set(tm, "tool", 4, c1)) {
                st = nomem(x);
                goto done;
            }
            if (ms_py_get(tm, "name")) {
                ms_py *c2 = ms_py_copy(names[k]);
                if (!c2 || ms_py_dict_set(tm, "name", 4, c2)) {
                    st = nomem(x);
                    goto done;
                }
            }
        }
    }
done:
    free_refs(refs, nrefs);
    free(pos);
    free(names);
    return st;
}

/* ---- assistant messages ---- */

static const char *xtml_type(const ms_py *v) {
    switch (v->type) {
    case MS_PY_BOOL: return "boolean";
    case MS_PY_NULL: return "null";
    case MS_PY_INT:
    case MS_PY_FLOAT: return "number";
    case MS_PY_STR: return "string";
    case MS_PY_DICT: return "object";
    default: return "array";
    }
}

static int assistant(xt *x, const ms_py *m, size_t mi, int thinking) {
    int st;
    char what[96];
    if (thinking) {
        const ms_py *rc = ms_py_get(m, "reasoning_content");
        if (!ms_py_truthy(rc)) rc = ms_py_get(m, "reasoning");
        open_tag(x, "think");
        put(x, XT_SEP);
        if (rc && rc->type != MS_PY_NULL) {
            snprintf(what, sizeof what, "xtml: messages[%zu] reasoning", mi);
            ms_textbuf t = {0};
            st = ms_py_str(&t, rc, what, x->err);
            int keep = !st && ms_py_str_has_nonspace(t.data ? t.data : "", t.len);
            ms_textbuf_free(&t);
            if (st) return st;
            if (keep && (st = append_text(x, rc, what))) return st;
        }
        close_tag(x, "think");
    }
    open_tag(x, "response");
    put(x, XT_SEP);
    if ((st = content(x, ms_py_get(m, "content"), mi))) return st;
    close_tag(x, "response");

    const ms_py *calls = ms_py_get(m, "tool_calls");
    if (!ms_py_truthy(calls)) return MS_OK;
    if (calls->type != MS_PY_LIST)
        return ms_fail(x->err, MS_ERR_FORMAT, "xtml: messages[%zu].tool_calls must be a list", mi);
    open_tag(x, "tools");
    put(x, XT_SEP);
    for (size_t ci = 0; ci < calls->n; ci++) {
        const ms_py *tc = calls->items[ci];
        if (tc->type != MS_PY_DICT)
            return ms_fail(x->err, MS_ERR_FORMAT, "xtml: messages[%zu].tool_calls[%zu] must be an object",
                           mi, ci);
        const ms_py *fn = ms_py_get(tc, "function");
        if (!fn) fn = tc;
        const ms_py *name = fn->type == MS_PY_DICT ? ms_py_get(fn, "name") : NULL;
        if (!name)
            return ms_fail(x->err, MS_ERR_FORMAT, "xtml: messages[%zu].tool_calls[%zu] has no function name",
                           mi, ci);
        snprintf(what, sizeof what, "xtml: messages[%zu].tool_calls[%zu] name", mi, ci);
        open_tag(x, "call");
        if ((st = attr(x, "tool", name, what))) return st;
        attr_int(x, "index", ci + 1);
        put(x, XT_SEP);
        const ms_py *args = ms_py_get(fn, "arguments");
        const ms_py *block = ms_py_get(fn, "_xtml_json_block");
        snprintf(what, sizeof what, "xtml: messages[%zu].tool_calls[%zu] arguments", mi, ci);
        if (block && block->type != MS_PY_NULL) {
            open_tag(x, "json");
            put(x, " type=\"object\"" XT_SEP);
            if ((st = append_text(x, block, what))) return st;
            close_tag(x, "json");
        } else if (args && args->type == MS_PY_DICT) {
            for (size_t k = 0; k < args->n; k++) {
                const ms_py *v = args->items[k];
                ms_py key = {.type = MS_PY_STR, .s = args->keys[k], .slen = args->klens[k]};
                open_tag(x, "argument");
                if ((st = attr(x, "key", &key, what))) return st;
                put(x, " type=\"");
                put(x, xtml_type(v));
                put(x, "\"" XT_SEP);
                if (v->type == MS_PY_STR) {
                    st = append_text(x, v, what);
                } else {
                    ms_textbuf t = {0};
                    ms_py_dumps(&t, v, 0);
                    if (t.failed) {
                        ms_textbuf_free(&t);
                        return nomem(x);
                    }
                    ms_py s = {.type = MS_PY_STR, .s = t.data ? t.data : "", .slen = t.len};
                    st = append_text(x, &s, what);
                    ms_textbuf_free(&t);
                }
                if (st) return st;
                close_tag(x, "argument");
            }
        }
        close_tag(x, "call");
    }
    close_tag(x, "tools");
    return MS_OK;
}

/* ---- the conversation ---- */

/* extract_response_schema(response_format); returns a borrowed value or NULL (None) */
static const ms_py *response_schema_of(const ms_py *rf) {
    if (!rf || rf->type != MS_PY_DICT) return NULL;
    const ms_py *js = ms_py_get(rf, "json_schema");
    if (!js || js->type == MS_PY_NULL) return NULL;
    if (js->type == MS_PY_DICT) {
        const ms_py *s = ms_py_get(js, "schema");
        if (s) return s;
        s = ms_py_get(js, "json_schema");
        if (s) return s;
        return js;
    }
    return js;
}

static int render(xt *x, ms_py *req) {
    int st;
    if (req->type != MS_PY_DICT)
        return ms_fail(x->err, MS_ERR_FORMAT, "xtml: the request must be a JSON object");
    ms_py *msgs = ms_py_get(req, "messages");
    if (!msgs || msgs->type != MS_PY_LIST)
        return ms_fail(x->err, MS_ERR_FORMAT, "xtml: \"messages\" must be a list, not %s", type_name(msgs));
    if (msgs->n && msgs->items[0]->type == MS_PY_LIST)
        return ms_fail(x->err, MS_ERR_UNSUPPORTED, "xtml: batched conversations are not supported");
    ms_py *kw = ms_py_get(req, "chat_template_kwargs");
    if (kw && kw->type != MS_PY_NULL && kw->type != MS_PY_DICT)
        return ms_fail(x->err, MS_ERR_FORMAT, "xtml: \"chat_template_kwargs\" must be an object");
    if (kw && kw->type == MS_PY_NULL) kw = NULL;
    int add_gen = ms_py_truthy(ms_py_get(req, "add_generation_prompt"));

    int thinking = 1;
    if (ms_py_get(kw, "thinking")) thinking = ms_py_truthy(ms_py_get(kw, "thinking"));
    else if (ms_py_get(kw, "enable_thinking")) thinking = ms_py_truthy(ms_py_get(kw, "enable_thinking"));
    const ms_py *effort = ms_py_get(kw, "thinking_effort");
    ms_py max_effort = {.type = MS_PY_STR, .s = "max", .slen = 3};
    if (!ms_py_get(kw, "thinking_effort")) effort = ms_py_get(kw, "reasoning_effort");
    if (!ms_py_get(kw, "thinking_effort") && !ms_py_get(kw, "reasoning_effort")) effort = &max_effort;
    if (effort && effort->type == MS_PY_NULL) effort = NULL;

    const ms_py *ip = ms_py_get(kw, "image_prompts");
    if (ip && ip->type != MS_PY_NULL) {
        if (ip->type != MS_PY_LIST)
            return ms_fail(x->err, MS_ERR_FORMAT, "xtml: image_prompts must be a list");
        x->image_prompts = ip;
    }

    /* messages = normalize_xtml_tool_result_messages(messages); normalize_conversation */
    size_t *order = calloc(msgs->n ? msgs->n : 1, sizeof *order);
    if (!order) return nomem(x);
    if ((st = reorder_tool_results(x, msgs, order))) goto out;
    for (size_t k = 0; k < msgs->n; k++) {
        ms_py *m = msgs->items[order[k]];
        if (m->type == MS_PY_DICT && (st = normalize_message(x, m, order[k]))) goto out;
    }
    ms_py *tools = ms_py_get(req, "tools");
    if (tools) ms_py_deep_sort(tools);

    /* response_format / response_schema */
    const ms_py *rf = ms_py_get(kw, "response_format");
    const ms_py *schema = NULL;
    if (kw && ms_py_get(kw, "response_schema")) schema = ms_py_get(kw, "response_schema");
    else schema = response_schema_of(rf);
    if (schema && schema->type == MS_PY_NULL) schema = NULL;
    if (schema) ms_py_deep_sort((ms_py *)schema);

    if (ms_py_truthy(tools)) tool_declare(x, tools, 0);

    if (thinking && effort && !ms_py_str_eq(effort, "low") && !ms_py_str_eq(effort, "high") &&
        !ms_py_str_eq(effort, "max")) {
        st = ms_fail(x->err, MS_ERR_FORMAT,
                     "xtml: unsupported thinking_effort; supported values are high, low, max");
        goto out;
    }
    if (thinking && effort) {
        char body[512];
        snprintf(body, sizeof body,
                 "`thinking_effort` guides on how much to think in your thinking channel (not "
                 "including the response channel), supported values include `low`, `medium`, "
                 "`high`, and `max`.\nNow the system is invoked with `thinking_effort=%s`.",
                 effort->s);
        internal_system(x, "thinking-effort", body);
    }

    const ms_py *last_calls = NULL; /* tool_calls of the latest assistant message (None) */
    size_t tool_index = 0;
    char what[96];
    for (size_t k = 0; k < msgs->n; k++) {
        size_t mi = order[k];
        const ms_py *m = msgs->items[mi];
        if (m->type != MS_PY_DICT) continue;
        const ms_py *role = ms_py_get(m, "role");
        if (!role) {
            st = ms_fail(x->err, MS_ERR_FORMAT, "xtml: messages[%zu] has no \"role\"", mi);
            goto out;
        }
        const ms_py *name = ms_py_get(m, "name");
        snprintf(what, sizeof what, "xtml: messages[%zu].name", mi);
        if (ms_py_str_eq(role, "user") ||
            (ms_py_str_eq(role, "system") && !ms_py_truthy(ms_py_get(m, "tools")))) {
            open_tag(x, "message");
            put(x, ms_py_str_eq(role, "user") ? " role=\"user\"" : " role=\"system\"");
            if (ms_py_truthy(name) && (st = attr(x, "name", name, what))) goto out;
            put(x, XT_SEP);
            if ((st = content(x, ms_py_get(m, "content"), mi))) goto out;
            close_tag(x, "message");
            put(x, XT_EOM);
        } else if (ms_py_str_eq(role, "system")) {
            tool_declare(x, ms_py_get(m, "tools"), 1);
        } else if (ms_py_str_eq(role, "tool")) {
            tool_index++;
            const ms_py *tname = ms_py_get(m, "tool");
            if (!tname) tname = name;
            if (tname && tname->type == MS_PY_NULL) tname = NULL;
            if (!tname && last_calls) {
                size_t len;
                if (last_calls->type == MS_PY_LIST || last_calls->type == MS_PY_DICT) len = last_calls->n;
                else if (last_calls->type == MS_PY_STR) len = last_calls->slen;
                else {
                    st = ms_fail(x->err, MS_ERR_FORMAT, "xtml: messages[%zu]: the preceding tool_calls "
                                 "is a %s", mi, type_name(last_calls));
                    goto out;
                }
                if (tool_index <= len && last_calls->type == MS_PY_LIST) {
                    /* a non-list here was already rejected when its assistant message rendered */
                    const ms_py *tc = last_calls->items[tool_index - 1];
                    const ms_py *fn = ms_py_get(tc, "function");
                    if (!fn) fn = tc;
                    tname = fn->type == MS_PY_DICT ? ms_py_get(fn, "name") : NULL;
                    if (!tname) {
                        st = ms_fail(x->err, MS_ERR_FORMAT, "xtml: messages[%zu]: the matching tool "
                                     "call has no function name", mi);
                        goto out;
                    }
                }
            }
            if (!tname) {
                st = ms_fail(x->err, MS_ERR_FORMAT, "xtml: messages[%zu]: tool messages need a resolvable "
                             "tool name: carry tool/name, or match a preceding assistant tool_call by order",
                             mi);
                goto out;
            }
            snprintf(what, sizeof what, "xtml: messages[%zu] tool name", mi);
            open_tag(x, "message");
            put(x, " role=\"tool\"");
            if ((st = attr(x, "tool", tname, what))) goto out;
            attr_int(x, "index", tool_index);
            put(x, XT_SEP);
            if ((st = content(x, ms_py_get(m, "content"), mi))) goto out;
            close_tag(x, "message");
            put(x, XT_EOM);
        } else if (ms_py_str_eq(role, "assistant")) {
            last_calls = ms_py_get(m, "tool_calls");
            tool_index = 0;
            open_tag(x, "message");
            put(x, " role=\"assistant\"");
            if (ms_py_truthy(name) && (st = attr(x, "name", name, what))) goto out;
            put(x, XT_SEP);
            if ((st = assistant(x, m, mi, thinking))) goto out;
            close_tag(x, "message");
            put(x, XT_EOM);
        }
        if (x->b->failed) {
            st = nomem(x);
            goto out;
        }
    }

    const ms_py *tc = ms_py_get(kw, "tool_choice");
    if (ms_py_str_eq(tc, "required"))
        internal_system(x, "tool-choice", "The system is invoked with `tool_choice=required`.\n"
                                          "You MUST call tools in the next message.");
    else if (ms_py_str_eq(tc, "none"))
        internal_system(x, "tool-choice", "The system is invoked with `tool_choice=none`.\n"
                                          "You MUST NOT call any tools in the next message.");

    const ms_py *rf_type = rf;
    if (rf && rf->type == MS_PY_DICT) {
        rf_type = ms_py_get(rf, "type");
        if (!rf_type) rf_type = rf;
    }
    if (ms_py_str_eq(rf_type, "json_object")) {
        internal_system(x, "response-format",
                        "The system is invoked with `response_format=json_object`.\n"
                        "Your response must be raw JSON data without markdown code blocks (```json) "
                        "or any additional formatting.");
    } else if (ms_py_str_eq(rf_type, "json_schema")) {
        ms_textbuf body = {0};
        ms_textbuf_puts(&body, "The system is invoked with `response_format=json_schema`.\n"
                               "Your response must be raw JSON data without markdown code blocks "
                               "(```json) or any additional formatting.\n"
                               "The JSON data must match the following schema:\n```json\n");
        if (schema) ms_py_dumps(&body, schema, 1);
        else ms_textbuf_puts(&body, "null");
        ms_textbuf_puts(&body, "\n```");
        if (body.failed) {
            ms_textbuf_free(&body);
            st = nomem(x);
            goto out;
        }
        internal_system(x, "response-format", body.data);
        ms_textbuf_free(&body);
    }

    if (add_gen) {
        open_tag(x, "message");
        put(x, " role=\"assistant\"" XT_SEP);
        open_tag(x, thinking ? "think" : "response");
        put(x, XT_SEP);
    }
    if (x->image_prompts && x->image_next != x->image_prompts->n) {
        st = ms_fail(x->err, MS_ERR_FORMAT, "xtml: image prompt count %zu != consumed placeholder count %zu",
                     x->image_prompts->n, x->image_next);
        goto out;
    }
    if (x->b->failed) st = nomem(x);
out:
    free(order);
    return st;
}

int ms_xtml_render(const char *request, size_t len, char **out, size_t *out_len, ms_err *err) {
    ms_py *req = NULL;
    *out = NULL;
    if (out_len) *out_len = 0;
    int st = ms_py_parse(request, len, XT_MAX_DEPTH, "xtml request", &req, err);
    if (st) return st;
    ms_textbuf b = {.limit = XT_MAX_OUT};
    xt x = {.b = &b, .err = err};
    st = render(&x, req);
    ms_py_free(req);
    if (!st && ms_textbuf_append(&b, "", 0)) st = nomem(&x);
    if (st) {
        ms_textbuf_free(&b);
        return st;
    }
    *out = b.data;
    if (out_len) *out_len = b.len;
    return MS_OK;
}
