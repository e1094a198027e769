/* conversation.c — chat turns over a generator, and saved conversations. */
#include "session/conversation.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/state.h"
#include "text/chat_template.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/json.h"

#define MAX_EOS 64

struct ms_conv {
    char *dir;
    ms_model *model;
    ms_engine *engine;
    const ms_tokenizer *tok;
    int64_t vocab;
    ms_generator *gen;
    ms_outfmt fmt;
    cJSON *messages;  /* array of message objects; a system message, when set, first */
    cJSON *kwargs;    /* chat_template_kwargs object or NULL */
    int32_t eos[MAX_EOS];
    int n_eos;
    int32_t *last_prompt;
    int n_last_prompt;
    const ms_progress *prefill_progress;
    cJSON *tools;     /* the "tools" array or NULL */
    char *tools_json; /* the same as text (the parser's) */
    ms_conv_constraint_fn cfn;
    void *cuser;
    ms_gvocab *gv;    /* the grammar vocabulary, built on the first constrained turn */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The output format from dir/config.json's model_type. */
static int format_from_config(const char *dir, ms_outfmt *fmt, ms_err *err) {
    char path[4096], *text = NULL;
    size_t len;
    cJSON *j = NULL;
    int rc = ms_path_join(path, sizeof path, dir, "config.json", err);
    if (!rc) rc = ms_read_file(path, 1 << 24, &text, &len, err);
    if (!rc) rc = ms_json_parse(text, len, path, &j, err);
    const char *mt = NULL;
    if (!rc) rc = ms_json_opt_string(j, "model_type", &mt, path, err);
    if (!rc) *fmt = ms_outfmt_for_model_type(mt); /* the server's choice, so both agree */
    cJSON_Delete(j);
    free(text);
    return rc;
}

static cJSON *make_message(const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", content)) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

static int has_system(const ms_conv *c) {
    const cJSON *first = cJSON_GetArrayItem(c->messages, 0);
    const cJSON *role = first ? cJSON_GetObjectItemCaseSensitive(first, "role") : NULL;
    return cJSON_IsString(role) && !strcmp(role->valuestring, "system");
}

int ms_conv_set_system(ms_conv *c, const char *text, ms_err *err) {
    if (text && *text) {
        cJSON *m = make_message("system", text);
        if (!m) return ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
        if (has_system(c)) cJSON_ReplaceItemInArray(c->messages, 0, m);
        else cJSON_InsertItemInArray(c->messages, 0, m);
    } else if (has_system(c)) {
        cJSON_DeleteItemFromArray(c->messages, 0);
    }
    return MS_OK;
}

int ms_conv_new(const ms_conv_opts *o, ms_conv **out, ms_err *err) {
    *out = NULL;
    if (!o || !o->model_dir || !o->model || !o->engine || !o->tok)
        return ms_fail(err, MS_ERR_ARG, "conversation: needs a model directory, model, engine and tokenizer");
    ms_conv *c = calloc(1, sizeof *c);
    if (!c) return ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
    c->model = o->model;
    c->engine = o->engine;
    c->tok = o->tok;
    c->vocab = o->model->cfg.vocab;
    int rc = MS_OK;
    c->dir = strdup(o->model_dir);
    c->messages = cJSON_CreateArray();
    if (!c->dir || !c->messages) rc = ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
    if (!rc && o->parser) rc = ms_outfmt_from_name(o->parser, &c->fmt, err);
    else if (!rc) rc = format_from_config(o->model_dir, &c->fmt, err);
    if (!rc && o->template_kwargs) {
        rc = ms_json_parse(o->template_kwargs, strlen(o->template_kwargs), "chat_template_kwargs", &c->kwargs, err);
        if (!rc && !cJSON_IsObject(c->kwargs)) rc = ms_fail(err, MS_ERR_ARG, "chat_template_kwargs: not a JSON object");
    }
    if (!rc && o->tools_json) {
        rc = ms_json_parse(o->tools_json, strlen(o->tools_json), "tools", &c->tools, err);
        if (!rc && !cJSON_IsArray(c->tools)) rc = ms_fail(err, MS_ERR_ARG, "tools: not a JSON array");
        if (!rc && !(c->tools_json = strdup(o->tools_json))) rc = ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
    }
    c->cfn = o->constraint;
    c->cuser = o->constraint_user;
    if (!rc) rc = ms_gen_eos_ids(o->model_dir, c->vocab, c->eos, MAX_EOS - 1, &c->n_eos, err);
    if (!rc) {
        int32_t te = ms_tok_eos_id(o->tok);
        int dup = 0;
        for (int i = 0; i < c->n_eos; i++) dup |= c->eos[i] == te;
        if (te >= 0 && te < c->vocab && !dup) c->eos[c->n_eos++] = te;
    }
    c->prefill_progress = o->prefill_progress;
    if (!rc) rc = ms_generator_new(o->engine, o->tok, c->vocab, o->snaps, &c->gen, err);
    if (!rc) rc = ms_conv_set_system(c, o->system, err);
    if (rc) {
        ms_conv_free(c);
        return rc;
    }
    *out = c;
    return MS_OK;
}

void ms_conv_free(ms_conv *c) {
    if (!c) return;
    ms_generator_free(c->gen);
    cJSON_Delete(c->messages);
    cJSON_Delete(c->kwargs);
    cJSON_Delete(c->tools);
    free(c->tools_json);
    ms_gvocab_free(c->gv);
    free(c->last_prompt);
    free(c->dir);
    free(c);
}

void ms_conv_turn_free(ms_conv_turn *t) {
    if (!t) return;
    free(t->message_json);
    memset(t, 0, sizeof *t);
}

/* The chat-template request for messages: {"messages", "add_generation_prompt", "chat_template_kwargs"?}. */
static int render_messages(const ms_conv *c, const cJSON *messages, char **out, size_t *len, ms_err *err) {
    cJSON *req = cJSON_CreateObject();
    int ok = req && cJSON_AddItemReferenceToObject(req, "messages", (cJSON *)messages) &&
             cJSON_AddBoolToObject(req, "add_generation_prompt", 1);
    if (ok && c->kwargs) ok = cJSON_AddItemReferenceToObject(req, "chat_template_kwargs", c->kwargs);
    if (ok && c->tools) ok = cJSON_AddItemReferenceToObject(req, "tools", c->tools);
    char *text = ok ? cJSON_PrintUnformatted(req) : NULL;
    cJSON_Delete(req);
    if (!text) return ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory rendering the request");
    int rc = ms_chat_render(c->dir, text, strlen(text), out, len, err);
    free(text);
    return rc;
}

int ms_conv_render(const ms_conv *c, char **out, size_t *len, ms_err *err) {
    return render_messages(c, c->messages, out, len, err);
}

const int32_t *ms_conv_last_prompt(const ms_conv *c, int *n) {
    *n = c->n_last_prompt;
    return c->last_prompt;
}

int ms_conv_messages_json(const ms_conv *c, char **out, ms_err *err) {
    *out = cJSON_PrintUnformatted(c->messages);
    return *out ? MS_OK : ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
}

int ms_conv_n_messages(const ms_conv *c) { return cJSON_GetArraySize(c->messages); }
ms_outfmt ms_conv_format(const ms_conv *c) { return c->fmt; }
int ms_conv_n_past(const ms_conv *c) { return ms_engine_n_past(c->engine); }
int ms_conv_max_ctx(const ms_conv *c) { return ms_generator_max_ctx(c->gen); }

void ms_conv_reset(ms_conv *c) {
    int keep = has_system(c) ? 1 : 0;
    while (cJSON_GetArraySize(c->messages) > keep) cJSON_DeleteItemFromArray(c->messages, keep);
}

/* ---- one turn ---- */

typedef struct {
    ms_conv *c;
    const ms_conv_sink *sink;
    ms_outparse *parser;
    ms_outmsg *msg;
    double t_first;
    int stopped;   /* the sink asked to stop */
    int rc;        /* a parser error inside the callback */
    ms_err perr;
} turn_ctx;

static int on_event(void *user, const ms_outev *ev) {
    turn_ctx *t = user;
    int rc = ms_outmsg_collect(t->msg, ev);
    if (rc) return rc;
    if (t->sink && t->sink->event && t->sink->event(t->sink->user, ev)) t->stopped = 1;
    return 0;
}

static int on_token(void *user, int32_t id, const char *text, size_t len) {
    turn_ctx *t = user;
    if (id >= 0 && t->t_first == 0) t->t_first = now_s();
    if (id >= 0 && t->sink && t->sink->token &&
        t->sink->token(t->sink->user, id, ms_generator_logits(t->c->gen), t->c->vocab))
        t->stopped = 1;
    if (len && !t->rc) {
        t->rc = ms_outparse_feed(t->parser, text, len, on_event, t, &t->perr);
        if (t->rc) return 1;
    }
    return t->stopped;
}

/* The parsed message as the conversation keeps it: content a string, never null. */
static cJSON *assistant_message(const ms_outmsg *m, ms_err *err) {
    char *js = NULL;
    if (ms_outmsg_json(m, &js, err)) return NULL;
    cJSON *o = cJSON_Parse(js);
    free(js);
    if (!o) {
        ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
        return NULL;
    }
    cJSON *content = cJSON_GetObjectItemCaseSensitive(o, "content");
    if (!cJSON_IsString(content)) {
        cJSON *s = cJSON_CreateString("");
        if (!s || !cJSON_ReplaceItemInObjectCaseSensitive(o, "content", s)) {
            cJSON_Delete(s);
            cJSON_Delete(o);
            ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
            return NULL;
        }
    }
    return o;
}

/* A turn after appending message m (taken): render, generate, parse, append the reply. */
static int turn_msg(ms_conv *c, cJSON *um, const ms_sampler_params *sp, int max_tokens, const ms_conv_sink *sink,
                    ms_conv_turn *res, ms_err *err) {
    memset(res, 0, sizeof *res);
    if (max_tokens < 1) {
        cJSON_Delete(um);
        return ms_fail(err, MS_ERR_ARG, "turn: max_tokens must be >= 1, got %d", max_tokens);
    }
    int rc = ms_sampler_check(sp, err);
    if (rc) {
        cJSON_Delete(um);
        return rc;
    }
    cJSON_AddItemToArray(c->messages, um);
    int n_msgs = cJSON_GetArraySize(c->messages);

    char *prompt = NULL;
    size_t plen = 0;
    ms_tok_ids ids = {0};
    turn_ctx t = {.c = c, .sink = sink};
    cJSON *am = NULL;
    double t0 = now_s();
    uint64_t fwd0 = ms_engine_get_stats(c->engine)->tokens;
    if ((rc = ms_conv_render(c, &prompt, &plen, err))) goto fail;
    if ((rc = ms_tok_encode(c->tok, prompt, plen, MS_TOK_ENCODE_SPECIAL, &ids, err))) {
        ms_wrap(err, "tokenizing the rendered conversation");
        goto fail;
    }
    if (ids.n < 1) {
        rc = ms_fail(err, MS_ERR_FORMAT, "the chat template rendered an empty prompt");
        goto fail;
    }
    if (ids.n > (size_t)ms_generator_max_ctx(c->gen)) {
        rc = ms_fail(err, MS_ERR_LIMIT, "the conversation is %zu tokens, the context holds %d (/reset, or a larger --ctx)",
                     ids.n, ms_generator_max_ctx(c->gen));
        goto fail;
    }
    ms_outparse_opts po = {.id_seed = sp->seed, .tools_json = c->tools_json};
    po.start_in_reasoning = ms_outfmt_prompt_opens_reasoning(c->fmt, prompt, plen, NULL);
    if ((rc = ms_outparse_new(c->fmt, &po, &t.parser, err))) goto fail;
    ms_gen_constraint con = {0};
    ms_tok_ids lead_ids = {0};
    if (c->cfn) {
        ms_grammar *gr = NULL;
        const char *lead = NULL;
        if ((rc = c->cfn(c->cuser, c->fmt, po.start_in_reasoning, &gr, &lead, err))) goto fail;
        if (gr && !c->gv && (rc = ms_gvocab_new(c->tok, (uint32_t)c->vocab, c->eos, (size_t)c->n_eos, &c->gv, err))) goto fail;
        if (lead && (rc = ms_tok_encode(c->tok, lead, strlen(lead), MS_TOK_ENCODE_SPECIAL, &lead_ids, err))) goto fail;
        con = (ms_gen_constraint){.grammar = gr, .vocab = c->gv, .prefix_ids = lead_ids.ids, .n_prefix = (int)lead_ids.n};
    }
    if (!(t.msg = ms_outmsg_new())) {
        rc = ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
        goto fail;
    }
    ms_gen_params gp = {.sampling = *sp, .max_tokens = max_tokens, .eos_ids = c->eos, .n_eos = c->n_eos,
                        .prefill_progress = c->prefill_progress,
                        .constraint = con.grammar || con.n_prefix ? &con : NULL};
    ms_gen_result gr;
    rc = ms_generate(c->gen, ids.ids, (int)ids.n, &gp, on_token, &t, &gr, err);
    ms_tok_ids_free(&lead_ids);
    if (!rc && t.rc) {
        rc = t.rc;
        ms_fail(err, rc, "parsing the reply: %s", t.perr.msg);
    }
    if (rc) goto fail;
    if ((rc = ms_outparse_finish(t.parser, on_event, &t, err))) goto fail;
    double t1 = now_s();
    if (!(am = assistant_message(t.msg, err))) {
        rc = err->code ? err->code : MS_ERR_NOMEM;
        goto fail;
    }
    if (!(res->message_json = cJSON_PrintUnformatted(am))) {
        rc = ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
        goto fail;
    }
    int32_t *lp = malloc(ids.n * sizeof *lp);
    if (!lp) {
        rc = ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
        goto fail;
    }
    memcpy(lp, ids.ids, ids.n * sizeof *lp);
    free(c->last_prompt);
    c->last_prompt = lp;
    c->n_last_prompt = (int)ids.n;
    cJSON_AddItemToArray(c->messages, am);
    res->prompt_tokens = gr.prompt_tokens;
    res->cached_tokens = gr.cached_tokens;
    res->completion_tokens = gr.completion_tokens;
    res->finish = gr.finish;
    res->forwarded_tokens = ms_engine_get_stats(c->engine)->tokens - fwd0;
    if (t.t_first == 0) t.t_first = t1;
    res->prefill_s = t.t_first - t0;
    res->decode_s = t1 - t.t_first;
    ms_outparse_free(t.parser);
    ms_outmsg_free(t.msg);
    ms_tok_ids_free(&ids);
    free(prompt);
    return MS_OK;
fail:
    cJSON_Delete(am);
    free(res->message_json);
    res->message_json = NULL;
    if (cJSON_GetArraySize(c->messages) == n_msgs) cJSON_DeleteItemFromArray(c->messages, n_msgs - 1);
    ms_outparse_free(t.parser);
    ms_outmsg_free(t.msg);
    ms_tok_ids_free(&ids);
    free(prompt);
    return rc;
}

int ms_conv_turn_run(ms_conv *c, const char *text, const ms_sampler_params *sp, int max_tokens,
                     const ms_conv_sink *sink, ms_conv_turn *res, ms_err *err) {
    memset(res, 0, sizeof *res);
    if (!text) return ms_fail(err, MS_ERR_ARG, "turn: no user message");
    cJSON *um = make_message("user", text);
    if (!um) return ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
    return turn_msg(c, um, sp, max_tokens, sink, res, err);
}

int ms_conv_tool_turn_run(ms_conv *c, const char *tool_call_id, const char *content, const ms_sampler_params *sp,
                          int max_tokens, const ms_conv_sink *sink, ms_conv_turn *res, ms_err *err) {
    memset(res, 0, sizeof *res);
    if (!content) return ms_fail(err, MS_ERR_ARG, "tool result: no content");
    /* the last assistant message and the tool messages after it */
    int n = cJSON_GetArraySize(c->messages), last = -1;
    for (int i = n - 1; i >= 0 && last < 0; i--) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(c->messages, i), "role");
        if (cJSON_IsString(r) && !strcmp(r->valuestring, "assistant")) last = i;
        else if (!cJSON_IsString(r) || strcmp(r->valuestring, "tool")) break;
    }
    const cJSON *calls = last >= 0 ? cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(c->messages, last), "tool_calls") : NULL;
    if (!cJSON_GetArraySize(calls))
        return ms_fail(err, MS_ERR_ARG, "tool result: the last reply has no tool call to answer");
    const cJSON *pick = NULL, *x;
    cJSON_ArrayForEach(x, calls) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(x, "id");
        if (!cJSON_IsString(id)) continue;
        if (tool_call_id) {
            if (!strcmp(id->valuestring, tool_call_id)) { pick = x; break; }
            continue;
        }
        int answered = 0;
        for (int i = last + 1; i < n; i++) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(c->messages, i), "tool_call_id");
            answered |= cJSON_IsString(t) && !strcmp(t->valuestring, id->valuestring);
        }
        if (!answered) { pick = x; break; }
    }
    if (!pick)
        return tool_call_id ? ms_fail(err, MS_ERR_ARG, "tool result: the last reply has no tool call with id \"%.100s\"", tool_call_id)
                            : ms_fail(err, MS_ERR_ARG, "tool result: every tool call of the last reply is answered");
    cJSON *m = make_message("tool", content);
    if (!m) return ms_fail(err, MS_ERR_NOMEM, "conversation: out of memory");
    cJSON_AddStringToObject(m, "tool_call_id", cJSON_GetObjectItemCaseSensitive(pick, "id")->valuestring);
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pick, "function"), "name");
    if (cJSON_IsString(nm)) cJSON_AddStringToObject(m, "name", nm->valuestring);
    return turn_msg(c, m, sp, max_tokens, sink, res, err);
}

/* ---- saved conversations ---- */

static void tokens_hash(const int32_t *ids, int n, char hex[65]) {
    uint8_t h[32];
    /* little-endian int32 bytes, as the machine stores them (x86-64 / aarch64) */
    ms_sha256(ids ? (const void *)ids : "", (size_t)n * sizeof *ids, h);
    ms_hex(h, 32, hex);
}

/* dir part of path ("." when none) into out. */
static int dir_of(const char *path, char *out, size_t cap, ms_err *err) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 1;
    if (slash && n == 0) n = 1; /* "/file" */
    if (n + 1 > cap) return ms_fail(err, MS_ERR_ARG, "path too long: %s", path);
    memcpy(out, slash ? path : ".", n);
    out[n] = 0;
    return MS_OK;
}

int ms_conv_save(ms_conv *c, const char *path, ms_err *err) {
    char spath[4096];
    if (!path || !*path) return ms_fail(err, MS_ERR_ARG, "save: no file name");
    if ((size_t)snprintf(spath, sizeof spath, "%s.state", path) >= sizeof spath)
        return ms_fail(err, MS_ERR_ARG, "save: path too long: %s", path);
    const char *base = strrchr(spath, '/');
    base = base ? base + 1 : spath;
    uint8_t id[32];
    char idhex[65], thex[65];
    int rc = ms_model_identity(c->model, id, err);
    if (rc) return rc;
    ms_hex(id, 32, idhex);
    int n = 0;
    const int32_t *hist = ms_generator_history(c->gen, &n);
    if ((rc = ms_engine_state_save(c->engine, spath, hist, n, err))) return rc;
    tokens_hash(hist, n, thex);
    cJSON *o = cJSON_CreateObject(), *st = NULL;
    int ok = o && cJSON_AddStringToObject(o, "format", MS_CONV_FORMAT) &&
             cJSON_AddNumberToObject(o, "version", MS_CONV_VERSION) && cJSON_AddStringToObject(o, "model_id", idhex) &&
             cJSON_AddStringToObject(o, "parser", ms_outfmt_name(c->fmt)) &&
             (st = cJSON_AddObjectToObject(o, "state")) && cJSON_AddStringToObject(st, "file", base) &&
             cJSON_AddNumberToObject(st, "tokens", n) && cJSON_AddStringToObject(st, "tokens_sha256", thex) &&
             cJSON_AddItemReferenceToObject(o, "messages", c->messages);
    char *text = ok ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!text) return ms_fail(err, MS_ERR_NOMEM, "save: out of memory");
    rc = ms_write_file_atomic_mode(path, text, strlen(text), 0600, err); /* private: the conversation */
    free(text);
    return rc;
}

static const char *const k_roles[] = {"system", "user", "assistant", "tool", NULL};

/* Validate one saved message. */
static int check_message(const cJSON *m, int i, const char *where, ms_err *err) {
    if (!cJSON_IsObject(m)) return ms_fail(err, MS_ERR_FORMAT, "%s: messages[%d] is not an object", where, i);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    int known = 0;
    for (int k = 0; cJSON_IsString(role) && k_roles[k]; k++) known |= !strcmp(role->valuestring, k_roles[k]);
    if (!known) return ms_fail(err, MS_ERR_FORMAT, "%s: messages[%d].role is not system, user, assistant or tool", where, i);
    if (!strcmp(role->valuestring, "system") && i != 0)
        return ms_fail(err, MS_ERR_FORMAT, "%s: messages[%d] is a system message after the first", where, i);
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsString(content))
        return ms_fail(err, MS_ERR_FORMAT, "%s: messages[%d].content is not a string", where, i);
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
    if (rc && !cJSON_IsString(rc))
        return ms_fail(err, MS_ERR_FORMAT, "%s: messages[%d].reasoning_content is not a string", where, i);
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (tc) {
        if (!cJSON_IsArray(tc)) return ms_fail(err, MS_ERR_FORMAT, "%s: messages[%d].tool_calls is not an array", where, i);
        int k = 0;
        for (const cJSON *call = tc->child; call; call = call->next, k++) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(call, "function");
            const cJSON *name = f ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
            const cJSON *args = f ? cJSON_GetObjectItemCaseSensitive(f, "arguments") : NULL;
            if (!cJSON_IsObject(call) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(call, "id")) ||
                !cJSON_IsObject(f) || !cJSON_IsString(name) || !cJSON_IsString(args))
                return ms_fail(err, MS_ERR_FORMAT,
                               "%s: messages[%d].tool_calls[%d] is not {\"id\", \"function\": {\"name\", \"arguments\"}}",
                               where, i, k);
        }
    }
    for (const cJSON *f = m->child; f; f = f->next)
        if (strcmp(f->string, "role") && strcmp(f->string, "content") && strcmp(f->string, "reasoning_content") &&
            strcmp(f->string, "tool_calls") && strcmp(f->string, "tool_call_id") && strcmp(f->string, "name"))
            return ms_fail(err, MS_ERR_FORMAT, "%s: messages[%d] has an unknown field \"%s\"", where, i, f->string);
    return MS_OK;
}

int ms_conv_load(ms_conv *c, const char *path, ms_err *err) {
    char *text = NULL, spath[4096], dir[4096], idhex[65], thex[65];
    size_t len;
    cJSON *o = NULL, *msgs = NULL;
    int32_t *toks = NULL;
    int n_toks = 0;
    ms_state_info info;
    memset(&info, 0, sizeof info);
    int rc = ms_read_file(path, MS_CONV_MAX_FILE, &text, &len, err);
    if (!rc) rc = ms_json_parse(text, len, path, &o, err);
    if (rc) goto done;
    if (!cJSON_IsObject(o)) { rc = ms_fail(err, MS_ERR_FORMAT, "%s: not a JSON object", path); goto done; }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, MS_CONV_FORMAT)) {
        rc = ms_fail(err, MS_ERR_FORMAT, "%s: not a saved moonshine chat (\"format\" is not \"%s\")", path, MS_CONV_FORMAT);
        goto done;
    }
    int64_t ver = 0;
    if ((rc = ms_json_int(o, "version", 1, 1 << 20, &ver, path, err))) goto done;
    if (ver != MS_CONV_VERSION) {
        rc = ms_fail(err, MS_ERR_UNSUPPORTED, "%s: version %lld, this build reads version %d", path, (long long)ver,
                     MS_CONV_VERSION);
        goto done;
    }
    uint8_t id[32];
    if ((rc = ms_model_identity(c->model, id, err))) goto done;
    ms_hex(id, 32, idhex);
    const cJSON *mid = cJSON_GetObjectItemCaseSensitive(o, "model_id");
    if (!cJSON_IsString(mid) || strlen(mid->valuestring) != 64) {
        rc = ms_fail(err, MS_ERR_FORMAT, "%s: model_id is not 64 hex digits", path);
        goto done;
    }
    if (strcmp(mid->valuestring, idhex)) {
        rc = ms_fail(err, MS_ERR_MISMATCH, "%s was saved with another model (id %.12s..., this model is %.12s...)", path,
                     mid->valuestring, idhex);
        goto done;
    }
    msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!cJSON_IsArray(msgs)) { rc = ms_fail(err, MS_ERR_FORMAT, "%s: messages is not an array", path); goto done; }
    int nm = cJSON_GetArraySize(msgs);
    if (nm > MS_CONV_MAX_MESSAGES) {
        rc = ms_fail(err, MS_ERR_LIMIT, "%s: %d messages, at most %d", path, nm, MS_CONV_MAX_MESSAGES);
        goto done;
    }
    int i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++)
        if ((rc = check_message(m, i, path, err))) goto done;
    if (nm) { /* the messages must render with this model's template */
        char *r = NULL;
        size_t rl;
        if ((rc = render_messages(c, msgs, &r, &rl, err))) {
            ms_wrap(err, "%s: the messages do not render", path);
            goto done;
        }
        free(r);
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "state");
    if (!cJSON_IsObject(st)) { rc = ms_fail(err, MS_ERR_FORMAT, "%s: state is not an object", path); goto done; }
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(st, "file");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(st, "tokens_sha256");
    int64_t sn = 0;
    if (!cJSON_IsString(sf) || !*sf->valuestring || strchr(sf->valuestring, '/') || !strcmp(sf->valuestring, ".") ||
        !strcmp(sf->valuestring, "..")) {
        rc = ms_fail(err, MS_ERR_FORMAT, "%s: state.file is not a plain file name", path);
        goto done;
    }
    if (!cJSON_IsString(sh) || strlen(sh->valuestring) != 64) {
        rc = ms_fail(err, MS_ERR_FORMAT, "%s: state.tokens_sha256 is not 64 hex digits", path);
        goto done;
    }
    if ((rc = ms_json_int(st, "tokens", 0, 1 << 30, &sn, path, err))) goto done;
    if ((rc = dir_of(path, dir, sizeof dir, err)) || (rc = ms_path_join(spath, sizeof spath, dir, sf->valuestring, err)))
        goto done;
    /* the state file must be this conversation's: its token ids hash to the recorded value */
    if ((rc = ms_state_inspect(spath, &info, err))) goto done;
    tokens_hash(info.tokens, (int)info.n_tokens, thex);
    if (info.n_tokens != sn || strcmp(thex, sh->valuestring)) {
        rc = ms_fail(err, MS_ERR_MISMATCH, "%s holds %lld tokens that are not the %lld recorded in %s", spath,
                     (long long)info.n_tokens, (long long)sn, path);
        goto done;
    }
    /* everything checked: the engine (validated again, unchanged on error), then the conversation */
    if ((rc = ms_engine_state_load(c->engine, spath, &toks, &n_toks, err))) goto done;
    if ((rc = ms_generator_adopt(c->gen, toks, n_toks, err))) goto done; /* resets: the conversation still loads */
    cJSON_DetachItemViaPointer(o, msgs);
    cJSON_Delete(c->messages);
    c->messages = msgs;
    msgs = NULL;
    free(c->last_prompt);
    c->last_prompt = NULL;
    c->n_last_prompt = 0;
done:
    ms_state_info_free(&info);
    free(toks);
    cJSON_Delete(o);
    free(text);
    return rc;
}
