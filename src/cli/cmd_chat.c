/* cmd_chat.c — `moonshine chat MODEL_DIR` (also `moonshine-chat MODEL_DIR`): an
 * interactive chat in the terminal, in-process over engine/generate.h.
 *
 * Lines are read with libedit (history, editing) when stdin is a terminal, else
 * plainly (scripts). Each turn renders the whole conversation with the model's
 * chat template; the generator reuses the engine state of the previous turns'
 * common prefix, so only the new tokens are forwarded. Tokens stream as they
 * come; reasoning is shown dimmed on a terminal. Commands: /reset, /system TEXT,
 * /save FILE (the conversation as {"messages": [...]}), /quit. */
#include <cjson/cJSON.h>
#include <editline/readline.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/generate.h"
#include "server/api.h"
#include "text/chat_template.h"
#include "text/outparse.h"
#include "text/tokenizer.h"
#include "util/fs.h"
#include "util/json.h"

typedef struct chat_out {
    int tty, in_reasoning;
    ms_outparse *p;
    ms_outmsg *msg;
    ms_err err;
} chat_out;

static int on_ev(void *user, const ms_outev *ev) {
    chat_out *o = user;
    ms_outmsg_collect(o->msg, ev);
    if (ev->type == MS_OUTEV_REASONING || ev->type == MS_OUTEV_CONTENT) {
        int r = ev->type == MS_OUTEV_REASONING;
        if (r != o->in_reasoning && o->tty) fputs(r ? "\033[2m" : "\033[0m", stdout);
        o->in_reasoning = r;
        fwrite(ev->text, 1, ev->len, stdout);
    } else if (ev->type == MS_OUTEV_TOOL_START) {
        if (o->in_reasoning && o->tty) fputs("\033[0m", stdout);
        o->in_reasoning = 0;
        printf("\n[tool call %s(", ev->tool_name);
    } else if (ev->type == MS_OUTEV_TOOL_ARGS) {
        fwrite(ev->text, 1, ev->len, stdout);
    } else if (ev->type == MS_OUTEV_TOOL_END) {
        printf(")]\n");
    }
    fflush(stdout);
    return 0;
}

static int on_token(void *user, int32_t id, const char *text, size_t len) {
    chat_out *o = user;
    return ms_outparse_feed(o->p, text, len, on_ev, o, &o->err) ? 1 : 0;
}

static char *read_line(int tty) {
    if (tty) {
        char *l = readline("> ");
        if (l && *l) add_history(l);
        return l;
    }
    size_t cap = 0;
    char *l = NULL;
    ssize_t n = getline(&l, &cap, stdin);
    if (n < 0) { free(l); return NULL; }
    while (n > 0 && (l[n - 1] == '\n' || l[n - 1] == '\r')) l[--n] = 0;
    return l;
}

static void add_msg(cJSON *msgs, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

/* The conversation's messages with an optional system prompt first. */
static cJSON *conversation(const char *system, const cJSON *turns) {
    cJSON *msgs = cJSON_CreateArray();
    if (system) add_msg(msgs, "system", system);
    const cJSON *t;
    cJSON_ArrayForEach(t, turns) cJSON_AddItemToArray(msgs, cJSON_Duplicate(t, 1));
    return msgs;
}

int cmd_chat(int argc, char **argv) {
    const char *usage = "usage: moonshine chat MODEL_DIR [--max-tokens N] [--temperature T] [--seed N] [--parser FORMAT] "
                        "[--ctx N] [--threads N] [engine flags]\n";
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%sAn interactive chat with the model (its chat template and tokenizer). Commands:\n"
               "  /reset          forget the conversation\n"
               "  /system TEXT    set the system prompt (and reset)\n"
               "  /save FILE      write the conversation as {\"messages\": [...]}\n"
               "  /quit           leave (as does end of input)\n"
               "Reasoning is shown dimmed; earlier turns' engine state is reused.\n", usage);
        return 0;
    }
    int threads, ctx;
    int64_t max_tokens = 1024, seed = (int64_t)time(NULL);
    if (ms_cli_engine_args(argc, argv, &threads, &ctx) || ms_arg_int(argc, argv, "--max-tokens", 1, 1 << 24, &max_tokens) ||
        ms_arg_int(argc, argv, "--seed", 0, INT64_MAX, &seed))
        return 2;
    const char *temp_s = ms_arg_str(argc, argv, "--temperature"), *parser = ms_arg_str(argc, argv, "--parser");
    const char *dir = ms_arg_pos(argc, argv, 0);
    if (!dir || ms_args_unknown(argc, argv, "chat")) {
        fputs(usage, stderr);
        return 2;
    }
    ms_sampler_params sp;
    ms_sampler_defaults(&sp);
    sp.temperature = 0.7;
    sp.seed = (uint64_t)seed;
    if (temp_s) {
        char *end;
        sp.temperature = strtod(temp_s, &end);
        if (*end || !(sp.temperature >= 0 && sp.temperature <= 2)) {
            fprintf(stderr, "moonshine chat: --temperature must be a number in [0, 2]\n");
            return 2;
        }
    }
    ms_err err = {0};
    ms_outfmt fmt = MS_OUTFMT_THINK;
    if (parser && ms_outfmt_from_name(parser, &fmt, &err)) {
        fprintf(stderr, "moonshine chat: --parser: %s\n", err.msg);
        return 2;
    }
    if (!parser) {
        char path[4096], *text = NULL;
        size_t len;
        cJSON *j = NULL;
        if (!ms_path_join(path, sizeof path, dir, "config.json", &err) && !ms_read_file(path, 1 << 24, &text, &len, &err) &&
            !ms_json_parse(text, len, path, &j, &err)) {
            const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
            fmt = ms_api_outfmt_for_model_type(cJSON_IsString(mt) ? mt->valuestring : NULL);
        }
        cJSON_Delete(j);
        free(text);
    }
    ms_tokenizer *tok = NULL;
    if (ms_tok_load_dir(dir, &tok, &err)) {
        fprintf(stderr, "moonshine chat: tokenizer: %s\n", err.msg);
        return 1;
    }
    ms_cli_ctx x;
    if (ms_cli_open("chat", dir, threads, ctx, &x)) {
        ms_tok_free(tok);
        return 1;
    }
    int64_t V = x.model.cfg.vocab;
    int32_t eos[64];
    int n_eos = 0, rc = 1;
    ms_generator *gen = NULL;
    cJSON *turns = cJSON_CreateArray();
    char *system = NULL;
    if (ms_gen_eos_ids(dir, V, eos, 63, &n_eos, &err) || ms_generator_new(x.engine, tok, V, NULL, &gen, &err)) goto fail;
    int32_t teos = ms_tok_eos_id(tok);
    if (teos >= 0 && teos < V) eos[n_eos++] = teos;
    int tty = isatty(0) && isatty(1);
    if (tty) fprintf(stderr, "moonshine chat: %s (/reset, /system TEXT, /save FILE, /quit)\n", dir);
    for (;;) {
        char *line = read_line(tty);
        if (!line || !strcmp(line, "/quit")) { free(line); break; }
        if (!line[0]) { free(line); continue; }
        if (!strcmp(line, "/reset") || !strncmp(line, "/system ", 8)) {
            if (line[1] == 's') {
                free(system);
                system = strdup(line + 8);
            }
            cJSON_Delete(turns);
            turns = cJSON_CreateArray();
            printf("(conversation reset)\n");
            free(line);
            continue;
        }
        if (!strncmp(line, "/save ", 6)) {
            cJSON *root = cJSON_CreateObject();
            cJSON_AddItemToObject(root, "messages", conversation(system, turns));
            char *s = cJSON_Print(root);
            cJSON_Delete(root);
            if (!s || ms_write_file_atomic(line + 6, s, strlen(s), &err)) fprintf(stderr, "moonshine chat: /save: %s\n", err.msg);
            else printf("(saved to %s)\n", line + 6);
            free(s);
            free(line);
            continue;
        }
        if (line[0] == '/') {
            printf("(unknown command %s: /reset, /system TEXT, /save FILE, /quit)\n", line);
            free(line);
            continue;
        }
        add_msg(turns, "user", line);
        free(line);
        cJSON *req = cJSON_CreateObject();
        cJSON_AddItemToObject(req, "messages", conversation(system, turns));
        cJSON_AddBoolToObject(req, "add_generation_prompt", 1);
        char *rj = cJSON_PrintUnformatted(req), *prompt = NULL;
        cJSON_Delete(req);
        size_t plen = 0;
        ms_tok_ids ids = {0};
        if (ms_chat_render(dir, rj, strlen(rj), &prompt, &plen, &err) ||
            ms_tok_encode(tok, prompt, plen, MS_TOK_ENCODE_SPECIAL, &ids, &err)) {
            fprintf(stderr, "moonshine chat: %s\n", err.msg);
            free(rj);
            free(prompt);
            ms_tok_ids_free(&ids);
            cJSON_DeleteItemFromArray(turns, cJSON_GetArraySize(turns) - 1);
            continue;
        }
        free(rj);
        ms_outparse_opts po = {.start_in_reasoning = ms_outfmt_prompt_opens_reasoning(fmt, prompt, plen, NULL), .id_seed = sp.seed};
        free(prompt);
        chat_out o = {.tty = tty, .msg = ms_outmsg_new()};
        int room = ms_generator_max_ctx(gen) - (int)ids.n;
        ms_gen_params gp = {.sampling = sp, .max_tokens = room < max_tokens ? room : (int)max_tokens, .eos_ids = eos,
                            .n_eos = n_eos};
        ms_gen_result res;
        int grc = room < 1 ? ms_fail(&err, MS_ERR_LIMIT, "the conversation (%zu tokens) fills the context: /reset", ids.n)
                           : ms_outparse_new(fmt, &po, &o.p, &err);
        if (!grc) grc = ms_generate(gen, ids.ids, (int)ids.n, &gp, on_token, &o, &res, &err);
        if (!grc) grc = ms_outparse_finish(o.p, on_ev, &o, &err);
        if (o.in_reasoning && tty) fputs("\033[0m", stdout);
        printf("\n");
        sp.seed++;
        ms_tok_ids_free(&ids);
        if (grc) {
            fprintf(stderr, "moonshine chat: %s\n", err.msg[0] ? err.msg : o.err.msg);
            cJSON_DeleteItemFromArray(turns, cJSON_GetArraySize(turns) - 1);
        } else {
            char *mj = NULL;
            if (!ms_outmsg_json(o.msg, &mj, &err)) {
                cJSON *m = cJSON_Parse(mj);
                if (m) cJSON_AddItemToArray(turns, m);
            }
            free(mj);
            if (tty) fprintf(stderr, "[%d prompt tokens, %d reused, %d generated, %s]\n", res.prompt_tokens,
                             res.cached_tokens, res.completion_tokens, ms_finish_name(res.finish));
        }
        ms_outparse_free(o.p);
        ms_outmsg_free(o.msg);
        fflush(stdout);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "moonshine chat: %s\n", err.msg);
done:
    free(system);
    cJSON_Delete(turns);
    ms_generator_free(gen);
    ms_cli_close(&x);
    ms_tok_free(tok);
    return rc;
}
