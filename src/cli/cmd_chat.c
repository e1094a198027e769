/* cmd_chat.c — `moonshine chat MODEL_DIR` (also `moonshine-chat MODEL_DIR`): the
 * interactive chat client. A REPL with libedit on a terminal; one message per
 * line (or --prompt) when stdin is not a terminal; --json prints one object per
 * turn. The conversation logic lives in src/session/conversation.h (docs/chat.md). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <editline/readline.h>

#include "server/api.h"
#include "session/conversation.h"
#include "session/prefix_cache.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/progress.h"
#include "engine/streaming.h"
#include "util/fs.h"
#include "util/json.h"

static const char k_usage[] =
    "usage: moonshine chat MODEL_DIR [--system TEXT] [--temperature T] [--top-p P] [--top-k K] [--min-p P]\n"
    "                      [--seed N] [--max-tokens N] [--ctx N] [--threads N] [--backend B] [--prompt TEXT] [--json]\n"
    "                      [--no-color] [--no-history] [--parser FORMAT] [--template-kwargs JSON]\n"
    "                      [--tools FILE] [--json-schema FILE | --grammar FILE]\n"
    "                      [--prefix-cache-entries N] [--prefix-cache-mib M] [--prefix-cache-dir DIR] [--prefix-cache-gib G]\n"
    "                      [engine flags]\n"
    "       moonshine-chat MODEL_DIR ...   (the same)\n";

static void pc_log(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "moonshine chat: %s\n", line);
}

static const char k_help_cmds[] =
    "  /reset          forget the conversation (the system message stays)\n"
    "  /system TEXT    set the system message (no TEXT: remove it)\n"
    "  /save FILE      save the conversation (FILE, JSON) and the engine state (FILE.state)\n"
    "  /load FILE      continue a saved conversation (same model only)\n"
    "  /stats          tokens, prefill/decode speed, context use, expert cache\n"
    "  /tool [@ID] TEXT  answer the last reply's tool call (@ID: the call with that id; else the\n"
    "                  first one not answered yet) with TEXT as the tool's result, then reply\n"
    "  /help           this list\n"
    "  /quit           exit (also Ctrl-D)\n"
    "A line ending in \\ continues on the next line; a line \"\"\" starts and ends a block.\n"
    "Ctrl-C stops the reply being generated.\n";

static volatile sig_atomic_t g_interrupted;
static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

/* --json-schema / --grammar: the grammar of every reply (ms_conv_constraint_fn). A schema is
 * framed as the server frames response_format (harmony's final channel, XTML's response
 * element; after </think> when the prompt opened reasoning); a grammar is the whole reply. */
typedef struct chat_con {
    const ms_tokenizer *tok;
    char *schema;          /* --json-schema's JSON */
    ms_grammar *own;       /* --grammar's */
    ms_grammar *framed[2]; /* the schema's, by "the prompt opened reasoning" */
} chat_con;

static int con_fn(void *user, ms_outfmt fmt, int opens, ms_grammar **g, const char **lead, ms_err *err) {
    chat_con *k = user;
    *g = NULL;
    *lead = NULL;
    if (k->own) {
        *g = k->own;
        if (opens && fmt != MS_OUTFMT_HARMONY && fmt != MS_OUTFMT_XTML) *lead = "</think>\n\n";
        return MS_OK;
    }
    if (!k->schema) return MS_OK;
    opens = !!opens;
    const char *ld = NULL;
    if (!k->framed[opens]) {
        ms_api_request r = {.constrain = MS_API_CONSTRAIN_SCHEMA, .schema_json = k->schema, .constrain_param = "--json-schema"};
        ms_api_error e = {0};
        if (ms_api_constraint_grammar(&r, fmt, k->tok, opens, &k->framed[opens], &ld, &e))
            return ms_fail(err, e.status == 500 ? MS_ERR_NOMEM : MS_ERR_ARG, "%s", e.message);
    }
    *g = k->framed[opens];
    if (opens && fmt != MS_OUTFMT_HARMONY && fmt != MS_OUTFMT_XTML) *lead = "</think>\n\n";
    return MS_OK;
}

typedef struct chat_stats {
    int turns, loaded_turns, loaded_tokens; /* this session's; those of a /load */
    uint64_t prompt, cached, completion, forwarded;
    double prefill_s, decode_s;
    uint64_t prefill_tok, decode_tok;
    ms_conv_turn last;
    int has_last;
} chat_stats;

typedef struct chat {
    ms_cli_ctx x;
    ms_conv *conv;
    ms_sampler_params sp;
    int seed_given;
    int max_tokens;
    int json, color, interactive, stats, with_ids;
    FILE *logits_out;
    chat_stats st;
    /* streaming display state */
    int in_reasoning, printed_any, tool_open;
    cJSON *calls;   /* tool calls of the current turn (display) */
    int first_logits_written;
    int failed;     /* a turn or command failed (the exit status without a terminal) */
    int32_t *ids;   /* sampled ids of the current turn (--json-ids) */
    int n_ids, cap_ids;
} chat;

/* ---- options ---- */

static int arg_double(int argc, char **argv, const char *name, double lo, double hi, double *out) {
    const char *s = ms_arg_str(argc, argv, name);
    if (!s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "moonshine chat: %s expects a number in [%g, %g], got \"%s\"\n", name, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Sampling defaults from generation_config.json (temperature, top_p, top_k), as transformers
 * applies them; absent file or keys keep ms_sampler_defaults. */
static int generation_defaults(const char *dir, ms_sampler_params *sp) {
    char path[4096], *text = NULL;
    size_t len;
    ms_err err = {0};
    if (ms_path_join(path, sizeof path, dir, "generation_config.json", &err) || !ms_file_exists(path)) return 0;
    cJSON *j = NULL;
    int64_t k = sp->top_k;
    int rc = ms_read_file(path, 1 << 20, &text, &len, &err);
    if (!rc) rc = ms_json_parse(text, len, path, &j, &err);
    if (!rc) rc = ms_json_opt_double(j, "temperature", &sp->temperature, path, &err);
    if (!rc) rc = ms_json_opt_double(j, "top_p", &sp->top_p, path, &err);
    if (!rc) rc = ms_json_opt_int(j, "top_k", 0, 1 << 30, &k, path, &err);
    int do_sample = 1;
    if (!rc) rc = ms_json_opt_bool(j, "do_sample", &do_sample, path, &err);
    if (!rc && !do_sample) sp->temperature = 0;
    sp->top_k = (int)k;
    cJSON_Delete(j);
    free(text);
    if (rc) fprintf(stderr, "moonshine chat: %s\n", err.msg);
    return rc ? -1 : 0;
}

/* ---- history file ---- */

/* mkdir -p with mode 0700 for the missing components of dir. */
static int mkdirs(char *dir) {
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int rc = mkdir(dir, 0700);
        *p = '/';
        if (rc && errno != EEXIST) return -1;
    }
    return mkdir(dir, 0700) && errno != EEXIST ? -1 : 0;
}

/* $XDG_STATE_HOME/moonshine/history or ~/.local/state/moonshine/history: the directory
 * made 0700, the file created 0600 without following a link and required to be a regular
 * file of ours. Returns 0 and fills path, or -1 (no history, with a warning). */
static int history_path(char *path, size_t cap) {
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    char dir[4096];
    if (xdg && xdg[0] == '/') snprintf(dir, sizeof dir, "%s/moonshine", xdg);
    else if (home && home[0] == '/') snprintf(dir, sizeof dir, "%s/.local/state/moonshine", home);
    else return -1;
    if (mkdirs(dir)) {
        fprintf(stderr, "moonshine chat: no history: cannot create %s: %s\n", dir, strerror(errno));
        return -1;
    }
    if ((size_t)snprintf(path, cap, "%s/history", dir) >= cap) return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid()) {
        fprintf(stderr, "moonshine chat: no history: %s is not a regular file of this user%s%s\n", path,
                fd < 0 ? ": " : "", fd < 0 ? strerror(errno) : "");
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

/* ---- output ---- */

#define DIM "\033[2m"
#define CYAN "\033[36m"
#define RESET "\033[0m"

static void end_reasoning(chat *c) {
    if (!c->in_reasoning) return;
    c->in_reasoning = 0;
    fputs(c->color ? RESET "\n" : "\n[/thinking]\n", stdout);
}

static int on_event(void *user, const ms_outev *ev) {
    chat *c = user;
    if (ev->type == MS_OUTEV_TOOL_START || ev->type == MS_OUTEV_TOOL_ARGS || ev->type == MS_OUTEV_TOOL_END) {
        /* collected for display at TOOL_END */
        if (!c->calls) c->calls = cJSON_CreateArray();
        cJSON *call = cJSON_GetArrayItem(c->calls, ev->tool_index);
        if (ev->type == MS_OUTEV_TOOL_START) {
            call = cJSON_CreateObject();
            cJSON_AddStringToObject(call, "id", ev->tool_id);
            cJSON_AddStringToObject(call, "name", ev->tool_name);
            cJSON_AddStringToObject(call, "arguments", "");
            cJSON_AddItemToArray(c->calls, call);
        } else if (call && ev->type == MS_OUTEV_TOOL_ARGS) {
            cJSON *a = cJSON_GetObjectItemCaseSensitive(call, "arguments");
            size_t ol = strlen(a->valuestring);
            char *na = malloc(ol + ev->len + 1);
            if (na) {
                memcpy(na, a->valuestring, ol);
                memcpy(na + ol, ev->text, ev->len);
                na[ol + ev->len] = 0;
                cJSON_ReplaceItemInObjectCaseSensitive(call, "arguments", cJSON_CreateString(na));
                free(na);
            }
        } else if (call && ev->type == MS_OUTEV_TOOL_END && !c->json) {
            end_reasoning(c);
            char *s = cJSON_PrintUnformatted(call);
            if (s) printf("%s%s%s%s\n", c->printed_any ? "\n" : "", c->color ? CYAN : "tool call: ", s,
                          c->color ? RESET : "");
            free(s);
            c->printed_any = 0;
        }
        fflush(stdout);
        return 0;
    }
    if (c->json) return 0;
    if (ev->type == MS_OUTEV_REASONING) {
        if (!c->in_reasoning) {
            c->in_reasoning = 1;
            fputs(c->color ? DIM : "[thinking]\n", stdout);
        }
        fwrite(ev->text, 1, ev->len, stdout);
    } else if (ev->type == MS_OUTEV_CONTENT) {
        end_reasoning(c);
        fwrite(ev->text, 1, ev->len, stdout);
        if (ev->len) c->printed_any = 1;
    }
    fflush(stdout);
    return 0;
}

static int on_token(void *user, int32_t id, const float *logits, int64_t vocab) {
    chat *c = user;
    if (c->logits_out && !c->first_logits_written && logits) { /* the first token's: from the prefill, on the host */
        c->first_logits_written = 1;
        if (fwrite(logits, sizeof *logits, (size_t)vocab, c->logits_out) != (size_t)vocab || fflush(c->logits_out))
            fprintf(stderr, "moonshine chat: --logits-out: write failed\n");
    }
    if (c->n_ids == c->cap_ids) {
        int cap = c->cap_ids ? 2 * c->cap_ids : 256;
        int32_t *ni = realloc(c->ids, (size_t)cap * sizeof *ni);
        if (!ni) return 1;
        c->ids = ni;
        c->cap_ids = cap;
    }
    c->ids[c->n_ids++] = id;
    return g_interrupted != 0;
}

static double rate(uint64_t n, double s) { return s > 0 ? (double)n / s : 0.0; }

static void print_turn_json(chat *c, const ms_conv_turn *t, int with_ids) {
    cJSON *msg = cJSON_Parse(t->message_json), *o = cJSON_CreateObject();
    if (!msg || !o) {
        cJSON_Delete(msg);
        cJSON_Delete(o);
        fprintf(stderr, "moonshine chat: out of memory\n");
        return;
    }
    cJSON *content = cJSON_DetachItemFromObjectCaseSensitive(msg, "content");
    cJSON *reasoning = cJSON_DetachItemFromObjectCaseSensitive(msg, "reasoning_content");
    cJSON *calls = cJSON_DetachItemFromObjectCaseSensitive(msg, "tool_calls");
    cJSON_AddItemToObject(o, "content", content ? content : cJSON_CreateString(""));
    cJSON_AddItemToObject(o, "reasoning_content", reasoning ? reasoning : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "tool_calls", calls ? calls : cJSON_CreateArray());
    cJSON_AddStringToObject(o, "finish_reason", ms_finish_name(t->finish));
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", t->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", t->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", t->prompt_tokens + t->completion_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", t->cached_tokens);
    cJSON_AddNumberToObject(u, "forwarded_tokens", (double)t->forwarded_tokens);
    cJSON *tm = cJSON_AddObjectToObject(o, "timings");
    int pf = t->prompt_tokens - t->cached_tokens;
    uint64_t dec = t->forwarded_tokens > (uint64_t)pf ? t->forwarded_tokens - pf : 0;
    cJSON_AddNumberToObject(tm, "prefill_s", t->prefill_s);
    cJSON_AddNumberToObject(tm, "decode_s", t->decode_s);
    cJSON_AddNumberToObject(tm, "prefill_tokens_per_s", rate(pf, t->prefill_s));
    cJSON_AddNumberToObject(tm, "decode_tokens_per_s", rate(dec, t->decode_s));
    if (with_ids) {
        int n;
        const int32_t *ids = ms_conv_last_prompt(c->conv, &n);
        cJSON *a = cJSON_AddArrayToObject(o, "prompt_ids");
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
        a = cJSON_AddArrayToObject(o, "completion_ids");
        for (int i = 0; i < c->n_ids; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(c->ids[i]));
    }
    char *s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
    cJSON_Delete(o);
    cJSON_Delete(msg);
}

/* A slash command's outcome: text, or one JSON object in --json mode. */
static void report(chat *c, const char *cmd, int ok, const char *msg) {
    if (!ok) c->failed = 1;
    if (c->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "command", cmd);
        cJSON_AddBoolToObject(o, "ok", ok);
        if (msg) cJSON_AddStringToObject(o, ok ? "message" : "error", msg);
        char *s = cJSON_PrintUnformatted(o);
        if (s) printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
        fflush(stdout);
    } else if (!ok) {
        fprintf(stderr, "%s: %s\n", cmd, msg);
    } else if (msg) {
        printf("%s\n", msg);
        fflush(stdout);
    }
}

/* --stats: one line on stderr after each turn (the reply on stdout stays clean): the turn's tokens,
 * prefill and decode speed, and the expert cache's hit rate when experts are streamed. */
static void print_turn_stats(chat *c, const ms_conv_turn *t) {
    uint64_t pf = (uint64_t)(t->prompt_tokens - t->cached_tokens);
    fprintf(stderr, "[%d prompt tokens (%d cached), %d generated, %s; prefill %.1f tok/s, decode %.1f tok/s",
            t->prompt_tokens, t->cached_tokens, t->completion_tokens,
            t->finish == MS_FINISH_STOP ? "stopped at end of turn" : t->finish == MS_FINISH_LENGTH ? "max tokens" : "ended",
            rate(pf, t->prefill_s), rate(t->forwarded_tokens > pf ? t->forwarded_tokens - pf : 0, t->decode_s));
    if (c->x.experts) {
        ms_stream_stats ss;
        ms_streaming_stats(c->x.experts, &ss);
        fprintf(stderr, "; experts streamed: hit rate %.3f of %llu, %.1f MiB read",
                ss.acquires ? (double)ss.hits / (double)ss.acquires : 0.0, (unsigned long long)ss.acquires,
                ss.bytes_read / 1048576.0);
    }
    fputs("]\n", stderr);
}

/* One turn: a user message, or (tool) a tool result answering the call tool_id (NULL: the next one). */
static void turn_any(chat *c, const char *text, int with_ids, int tool, const char *tool_id) {
    ms_err err = {0};
    ms_conv_turn t;
    ms_conv_sink sink = {.user = c, .event = on_event, .token = on_token};
    ms_sampler_params sp = c->sp;
    sp.seed = c->sp.seed + (uint64_t)c->st.turns; /* a fixed --seed fixes the whole session */
    c->in_reasoning = c->printed_any = 0;
    c->first_logits_written = 0;
    c->n_ids = 0;
    cJSON_Delete(c->calls);
    c->calls = NULL;
    g_interrupted = 0;
    struct sigaction sa = {.sa_handler = on_sigint}, old;
    sigemptyset(&sa.sa_mask);
    if (!c->interactive) sigaction(SIGINT, &sa, &old); /* interactive: installed for the whole session */
    int rc = tool ? ms_conv_tool_turn_run(c->conv, tool_id, text, &sp, c->max_tokens, &sink, &t, &err)
                  : ms_conv_turn_run(c->conv, text, &sp, c->max_tokens, &sink, &t, &err);
    if (!c->interactive) sigaction(SIGINT, &old, NULL);
    if (!c->json) {
        end_reasoning(c);
        if (!rc && t.finish == MS_FINISH_ABORT) fputs(c->color ? " " DIM "[interrupted]" RESET : " [interrupted]", stdout);
        if (!rc && t.finish == MS_FINISH_LENGTH) fputs(c->color ? " " DIM "[max tokens]" RESET : " [max tokens]", stdout);
        fputs("\n", stdout);
        fflush(stdout);
    }
    if (rc) {
        report(c, tool ? "tool" : "turn", 0, err.msg);
        return;
    }
    if (c->json) print_turn_json(c, &t, with_ids);
    if (c->stats) print_turn_stats(c, &t);
    chat_stats *s = &c->st;
    s->turns++;
    s->prompt += t.prompt_tokens;
    s->cached += t.cached_tokens;
    s->completion += t.completion_tokens;
    s->forwarded += t.forwarded_tokens;
    s->prefill_s += t.prefill_s;
    s->decode_s += t.decode_s;
    uint64_t pf = (uint64_t)(t.prompt_tokens - t.cached_tokens);
    s->prefill_tok += pf;
    s->decode_tok += t.forwarded_tokens > pf ? t.forwarded_tokens - pf : 0;
    ms_conv_turn_free(&s->last);
    s->last = t;
    free(s->last.message_json); /* only the numbers are kept */
    s->last.message_json = NULL;
    s->has_last = 1;
}

static void turn(chat *c, const char *text, int with_ids) { turn_any(c, text, with_ids, 0, NULL); }

static void print_stats(chat *c) {
    const chat_stats *s = &c->st;
    char buf[2048];
    int n = snprintf(buf, sizeof buf,
                     "turns %d; tokens: prompt %llu (cached %llu), generated %llu, forwarded %llu; context %d/%d; "
                     "prefill %.1f tok/s, decode %.1f tok/s",
                     s->turns + s->loaded_turns, (unsigned long long)s->prompt, (unsigned long long)s->cached,
                     (unsigned long long)s->completion, (unsigned long long)s->forwarded, ms_conv_n_past(c->conv),
                     ms_conv_max_ctx(c->conv), rate(s->prefill_tok, s->prefill_s), rate(s->decode_tok, s->decode_s));
    if (s->loaded_turns && n < (int)sizeof buf)
        n += snprintf(buf + n, sizeof buf - n, "; loaded: %d turns, %d tokens of state", s->loaded_turns, s->loaded_tokens);
    if (s->has_last && n < (int)sizeof buf) {
        const ms_conv_turn *t = &s->last;
        uint64_t pf = (uint64_t)(t->prompt_tokens - t->cached_tokens);
        n += snprintf(buf + n, sizeof buf - n, "; last turn: prompt %d (cached %d), generated %d, prefill %.1f tok/s, decode %.1f tok/s",
                      t->prompt_tokens, t->cached_tokens, t->completion_tokens, rate(pf, t->prefill_s),
                      rate(t->forwarded_tokens > pf ? t->forwarded_tokens - pf : 0, t->decode_s));
    }
    if (c->x.experts && n < (int)sizeof buf) {
        ms_stream_stats ss;
        ms_streaming_stats(c->x.experts, &ss);
        snprintf(buf + n, sizeof buf - n,
                 "; experts: %llu acquired, hit rate %.3f, %.1f MiB read, waited %.3f s, prefetch %llu issued / %llu used",
                 (unsigned long long)ss.acquires, ss.acquires ? (double)ss.hits / (double)ss.acquires : 0.0,
                 ss.bytes_read / 1048576.0, ss.wait_s, (unsigned long long)ss.prefetch_issued,
                 (unsigned long long)ss.prefetch_used);
    }
    report(c, "stats", 1, buf);
}

/* Handle a line starting with '/'. Returns 1 to quit. */
static int slash(chat *c, const char *line) {
    char cmd[32];
    size_t k = 0;
    const char *p = line + 1;
    while (*p && *p != ' ' && *p != '\t' && k + 1 < sizeof cmd) cmd[k++] = *p++;
    cmd[k] = 0;
    while (*p == ' ' || *p == '\t') p++;
    char arg[4096];
    snprintf(arg, sizeof arg, "%s", p);
    size_t al = strlen(arg);
    while (al && (arg[al - 1] == ' ' || arg[al - 1] == '\t' || arg[al - 1] == '\n')) arg[--al] = 0;
    ms_err err = {0};
    if (!strcmp(cmd, "quit") || !strcmp(cmd, "exit")) return 1;
    if (!strcmp(cmd, "help")) {
        if (c->json) report(c, "help", 1, k_help_cmds);
        else fputs(k_help_cmds, stdout);
    } else if (!strcmp(cmd, "reset")) {
        ms_conv_reset(c->conv);
        report(c, "reset", 1, c->interactive ? "conversation cleared" : NULL);
    } else if (!strcmp(cmd, "system")) {
        if (ms_conv_set_system(c->conv, arg, &err)) report(c, "system", 0, err.msg);
        else report(c, "system", 1, c->interactive ? (*arg ? "system message set" : "system message removed") : NULL);
    } else if (!strcmp(cmd, "save") || !strcmp(cmd, "load")) {
        int save = cmd[0] == 's';
        if (!*arg) {
            report(c, cmd, 0, "needs a file name");
        } else if (save ? ms_conv_save(c->conv, arg, &err) : ms_conv_load(c->conv, arg, &err)) {
            report(c, cmd, 0, err.msg);
        } else {
            char msg[4200];
            snprintf(msg, sizeof msg, "%s %s (%d messages, %d tokens of state)", save ? "saved" : "loaded", arg,
                     ms_conv_n_messages(c->conv), ms_conv_n_past(c->conv));
            report(c, cmd, 1, msg);
            if (!save) { /* /stats counts the loaded turns */
                char *mj = NULL;
                int nt = 0;
                if (!ms_conv_messages_json(c->conv, &mj, &err)) {
                    for (const char *q = mj; (q = strstr(q, "\"role\":\"assistant\"")); q++) nt++;
                    free(mj);
                }
                c->st.loaded_turns = nt;
                c->st.loaded_tokens = ms_conv_n_past(c->conv);
            }
        }
    } else if (!strcmp(cmd, "stats")) {
        print_stats(c);
    } else if (!strcmp(cmd, "tool")) {
        char id[256] = "", *text = arg;
        if (arg[0] == '@') {
            size_t n = strcspn(arg + 1, " \t");
            snprintf(id, sizeof id, "%.*s", (int)(n < sizeof id - 1 ? n : sizeof id - 1), arg + 1);
            text = arg + 1 + n;
            while (*text == ' ' || *text == '\t') text++;
        }
        turn_any(c, text, c->with_ids, 1, id[0] ? id : NULL);
    } else {
        char msg[128];
        snprintf(msg, sizeof msg, "unknown command /%s (/help lists them)", cmd);
        report(c, "command", 0, msg);
    }
    return 0;
}

/* ---- input ---- */

/* A growable string. */
typedef struct { char *s; size_t n, cap; } sbuf;
static int sb_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) return -1;
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}

/* One raw line (without its newline): readline on a terminal, getline otherwise.
 * Returns malloc'd text, NULL at end of input; *intr set when Ctrl-C cancelled it. */
static char *read_raw(chat *c, const char *prompt, int *intr) {
    *intr = 0;
    if (c->interactive) {
        g_interrupted = 0;
        char *l = readline(prompt);
        if (!l && g_interrupted) *intr = 1;
        return l;
    }
    char *l = NULL;
    size_t cap = 0;
    ssize_t n = getline(&l, &cap, stdin);
    if (n < 0) {
        free(l);
        return NULL;
    }
    while (n && (l[n - 1] == '\n' || l[n - 1] == '\r')) l[--n] = 0;
    return l;
}

static int is_fence(const char *l) {
    while (*l == ' ' || *l == '\t') l++;
    if (strncmp(l, "\"\"\"", 3)) return 0;
    l += 3;
    while (*l == ' ' || *l == '\t') l++;
    return *l == 0;
}

/* One message: a line, lines joined by a trailing backslash, or a """ block.
 * Returns malloc'd text, NULL at end of input ("" after Ctrl-C). */
static char *read_message(chat *c) {
    sbuf b = {0};
    int intr, block = 0, first = 1;
    for (;;) {
        char *l = read_raw(c, first ? "> " : "... ", &intr);
        if (!l) {
            if (intr) {
                if (c->interactive) fputs("^C\n", stdout);
                free(b.s);
                return strdup("");
            }
            if (b.n || block) return b.s ? b.s : strdup(""); /* end of input inside a message: take it */
            free(b.s);
            return NULL;
        }
        size_t n = strlen(l);
        if (first && is_fence(l)) {
            block = 1;
            first = 0;
            free(l);
            continue;
        }
        first = 0;
        if (block) {
            if (is_fence(l)) {
                free(l);
                return b.s ? b.s : strdup("");
            }
            int rc = (b.n && sb_add(&b, "\n", 1)) || sb_add(&b, l, n);
            free(l);
            if (rc) break;
            continue;
        }
        int cont = n && l[n - 1] == '\\';
        if (cont) n--;
        int rc = sb_add(&b, l, n) || (cont && sb_add(&b, "\n", 1));
        free(l);
        if (rc) break;
        if (!cont) return b.s ? b.s : strdup("");
    }
    fprintf(stderr, "moonshine chat: out of memory\n");
    free(b.s);
    return NULL;
}

static int only_space(const char *s) {
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r') return 0;
    return 1;
}

int cmd_chat(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%s\nTalk to the model in MODEL_DIR (it needs a tokenizer and a chat template). Each turn\n"
               "renders the whole conversation with the model's chat template and feeds the engine only\n"
               "the tokens after what it already holds (docs/chat.md). Replies stream as they are\n"
               "generated; reasoning is shown dimmed, tool calls as JSON.\n\n"
               "On a terminal: line editing and history ($XDG_STATE_HOME/moonshine/history, else\n"
               "~/.local/state/moonshine/history; --no-history). Otherwise each line of stdin is one\n"
               "user message (or --prompt TEXT: one turn) and replies are printed; --json prints one\n"
               "object per turn: content, reasoning_content, tool_calls, finish_reason, usage, timings\n"
               "(--json-ids adds prompt_ids and the sampled completion_ids); --stats prints a line to stderr\n"
               "after each turn: tokens, prefill/decode tok/s, expert-cache hit rate. Slash commands work in both modes:\n%s\n"
               "Sampling defaults come from generation_config.json when present; --temperature 0 is\n"
               "greedy. Without --seed a seed is drawn from the clock (turn i samples with seed + i).\n"
               "--max-tokens N (default: until the context is full). --parser names the output format\n"
               "(think|qwen3|deepseek_v3|deepseek_v31|kimi_k2|glm|harmony|xtml; default from config.json).\n"
               "--template-kwargs '{\"enable_thinking\": false}' is passed to the chat template.\n"
               "--tools FILE: an OpenAI \"tools\" array (JSON) the template and the parser see; answer a\n"
               "reply's tool calls with /tool. --json-schema FILE: every reply is a JSON document valid\n"
               "against the schema (docs/grammar.md lists what is supported); --grammar FILE: every reply\n"
               "matches the GBNF grammar (rule root). Both constrain decoding token by token.\n"
               "Engine flags: --threads, --ctx, --backend, --memory-mib, --expert-cache-mib, --io, --store,\n"
               "--cache-policy, --queue-depth, --no-prefetch, --expert-trace (see README).\n"
               "--logits-out FILE (tests) appends each turn's first-token logits (float32) to FILE.\n"
               "Prefix cache (as moonshine serve's): models that cannot roll back keep snapshots in RAM\n"
               "(--prefix-cache-entries 64, --prefix-cache-mib 2048); --prefix-cache-dir DIR (--prefix-cache-gib 16)\n"
               "adds the disk tier, shared with a server on the same model and directory.\n",
               k_usage, k_help_cmds);
        return 0;
    }
    ms_cli_opts eo;
    int64_t top_k = -1, seed = -1, max_tokens = 0, pc_entries = 64, pc_mib = 2048, pc_gib = 16;
    double temp = -1, top_p = -1, min_p = -1;
    if (ms_cli_engine_args(argc, argv, &eo) || arg_double(argc, argv, "--temperature", 0, 100, &temp) ||
        arg_double(argc, argv, "--top-p", 0, 1, &top_p) || arg_double(argc, argv, "--min-p", 0, 1, &min_p) ||
        ms_arg_int(argc, argv, "--top-k", 0, 1 << 30, &top_k) ||
        ms_arg_int(argc, argv, "--seed", 0, INT64_MAX, &seed) ||
        ms_arg_int(argc, argv, "--max-tokens", 1, 1 << 30, &max_tokens) ||
        ms_arg_int(argc, argv, "--prefix-cache-entries", 0, 4096, &pc_entries) ||
        ms_arg_int(argc, argv, "--prefix-cache-mib", 0, INT64_C(1) << 30, &pc_mib) ||
        ms_arg_int(argc, argv, "--prefix-cache-gib", 1, INT64_C(1) << 20, &pc_gib))
        return 2;
    const char *system = ms_arg_str(argc, argv, "--system"), *prompt = ms_arg_str(argc, argv, "--prompt");
    const char *parser = ms_arg_str(argc, argv, "--parser"), *kwargs = ms_arg_str(argc, argv, "--template-kwargs");
    const char *logits_path = ms_arg_str(argc, argv, "--logits-out");
    const char *pc_dir = ms_arg_str(argc, argv, "--prefix-cache-dir");
    int stats = ms_arg_flag(argc, argv, "--stats");
    const char *tools_path = ms_arg_str(argc, argv, "--tools"), *schema_path = ms_arg_str(argc, argv, "--json-schema"),
               *grammar_path = ms_arg_str(argc, argv, "--grammar");
    int json = ms_arg_flag(argc, argv, "--json"), no_color = ms_arg_flag(argc, argv, "--no-color");
    int no_history = ms_arg_flag(argc, argv, "--no-history"), with_ids = ms_arg_flag(argc, argv, "--json-ids");
    const char *dir = ms_cli_model_arg("chat", ms_arg_pos(argc, argv, 0));
    if (!dir || ms_arg_pos(argc, argv, 1) || ms_args_unknown(argc, argv, "chat")) {
        fputs(k_usage, stderr);
        return 2;
    }
    if (schema_path && grammar_path) {
        fputs("moonshine chat: --json-schema and --grammar exclude each other\n", stderr);
        return 2;
    }
    chat *c = calloc(1, sizeof *c);
    if (!c) return 1;
    chat_con con = {0};
    char *tools_json = NULL;
    c->json = json;
    c->stats = stats;
    c->with_ids = with_ids;
    c->interactive = !prompt && isatty(STDIN_FILENO);
    c->color = !no_color && !json && isatty(STDOUT_FILENO) && !(getenv("NO_COLOR") && *getenv("NO_COLOR"));
    ms_sampler_defaults(&c->sp);
    if (generation_defaults(dir, &c->sp)) {
        free(c);
        return 1;
    }
    if (temp >= 0) c->sp.temperature = temp;
    if (top_p >= 0) c->sp.top_p = top_p;
    if (min_p >= 0) c->sp.min_p = min_p;
    if (top_k >= 0) c->sp.top_k = (int)top_k;
    c->sp.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    ms_err err = {0};
    if (ms_sampler_check(&c->sp, &err)) {
        fprintf(stderr, "moonshine chat: %s\n", err.msg);
        free(c);
        return 2;
    }
    if (logits_path && !(c->logits_out = fopen(logits_path, "wb"))) {
        fprintf(stderr, "moonshine chat: --logits-out %s: %s\n", logits_path, strerror(errno));
        free(c);
        return 1;
    }
    ms_tokenizer *tok = NULL;
    if (ms_tok_load_dir(dir, &tok, &err)) {
        fprintf(stderr, "moonshine chat: tokenizer: %s\n", err.msg);
        if (c->logits_out) fclose(c->logits_out);
        free(c);
        return 1;
    }
    int rc = 1;
    con.tok = tok;
    {
        /* --tools / --json-schema / --grammar files, checked before the model loads */
        const char *paths[3] = {tools_path, schema_path, grammar_path};
        char *texts[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3; i++) {
            size_t len = 0;
            if (paths[i] && ms_read_file(paths[i], 64 << 20, &texts[i], &len, &err)) {
                fprintf(stderr, "moonshine chat: %s\n", err.msg);
                for (int k = 0; k < i; k++) free(texts[k]);
                goto out_tok;
            }
        }
        tools_json = texts[0];
        con.schema = texts[1];
        int bad = 0;
        if (texts[1]) { /* compile once now: an unsupported keyword is named before the model loads */
            ms_grammar *g = NULL;
            bad = ms_grammar_from_schema(texts[1], strlen(texts[1]), NULL, &g, &err);
            ms_grammar_free(g);
        }
        if (texts[2]) bad = ms_grammar_from_gbnf(texts[2], strlen(texts[2]), NULL, NULL, 0, NULL, &con.own, &err);
        free(texts[2]);
        if (bad) {
            fprintf(stderr, "moonshine chat: %s: %s\n", texts[1] ? schema_path : grammar_path, err.msg);
            rc = 2;
            goto out_tok;
        }
    }
    if (ms_cli_open("chat", dir, &eo, &c->x)) goto out_tok;
    ms_prefix_cache *pc = NULL;
    ms_gen_snapshots snaps = {0};
    if ((!ms_engine_can_truncate(c->x.engine) || pc_dir) && pc_entries > 0 && pc_mib > 0) {
        ms_prefix_cache_opts po = {.max_entries = (int)pc_entries, .max_bytes = (uint64_t)pc_mib << 20, .dir = pc_dir,
                                   .model = &c->x.model, .disk_entries = (int)pc_entries,
                                   .disk_bytes = (uint64_t)pc_gib << 30, .log = pc_log};
        if (ms_prefix_cache_open(&po, &pc, &err)) {
            fprintf(stderr, "moonshine chat: %s\n", err.msg);
            goto out;
        }
        snaps = ms_prefix_cache_snapshots(pc);
        ms_engine_opts ceo = {.max_ctx = ms_engine_max_ctx(c->x.engine), .max_batch = 256};
        snaps.every = ms_prefix_cache_checkpoint_every(pc, &c->x.model, &ceo, 256); /* as moonshine serve's */
        snaps.at_boundaries = 1;
    }
    ms_cli_progress prog; /* a long prompt's prefill, on a terminal */
    ms_cli_progress_init(&prog);
    ms_conv_opts co = {.model_dir = dir, .model = &c->x.model, .engine = c->x.engine, .tok = tok, .system = system,
                       .parser = parser, .template_kwargs = kwargs, .snaps = pc ? &snaps : NULL,
                       .prefill_progress = &prog.p, .tools_json = tools_json,
                       .constraint = con.schema || con.own ? con_fn : NULL, .constraint_user = &con};
    if (ms_conv_new(&co, &c->conv, &err)) {
        fprintf(stderr, "moonshine chat: %s\n", err.msg);
        goto out;
    }
    c->max_tokens = max_tokens > 0 ? (int)max_tokens : ms_conv_max_ctx(c->conv);
    rc = 0;
    if (prompt) {
        if (prompt[0] == '/') slash(c, prompt);
        else turn(c, prompt, with_ids);
        goto out;
    }
    char hist[4096];
    int have_hist = 0;
    if (c->interactive) {
        struct sigaction sa = {.sa_handler = on_sigint};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL); /* no SA_RESTART: Ctrl-C ends a read at the prompt */
        rl_readline_name = "moonshine";
        using_history();
        stifle_history(2000);
        if (!no_history && !history_path(hist, sizeof hist)) {
            have_hist = 1;
            read_history(hist);
        }
        fprintf(stderr, "moonshine chat: %s (%d threads, context %d, output format %s, seed %llu). /help for commands, Ctrl-D exits.\n",
                dir, c->x.threads, ms_conv_max_ctx(c->conv), ms_outfmt_name(ms_conv_format(c->conv)),
                (unsigned long long)c->sp.seed);
    }
    for (;;) {
        char *msg = read_message(c);
        if (!msg) break;
        if (only_space(msg)) {
            free(msg);
            continue;
        }
        if (c->interactive) {
            add_history(msg);
            if (have_hist && write_history(hist)) have_hist = 0;
        }
        int quit = 0;
        if (msg[0] == '/' && msg[1] != '/') quit = slash(c, msg);
        else turn(c, msg[0] == '/' ? msg + 1 : msg, with_ids); /* "//text" sends "/text" */
        free(msg);
        if (quit) break;
    }
    if (c->interactive) fputs("\n", stdout);
out:
    if (!c->interactive && c->failed) rc = 1;
    ms_conv_free(c->conv);
    ms_prefix_cache_free(pc);
    ms_cli_close(&c->x);
out_tok:
    ms_tok_free(tok);
    free(tools_json);
    free(con.schema);
    ms_grammar_free(con.own);
    ms_grammar_free(con.framed[0]);
    ms_grammar_free(con.framed[1]);
    if (c->logits_out) fclose(c->logits_out);
    cJSON_Delete(c->calls);
    ms_conv_turn_free(&c->st.last);
    free(c->ids);
    free(c);
    return rc;
}
