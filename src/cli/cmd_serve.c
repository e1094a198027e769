/* cmd_serve.c — `moonshine serve MODEL_DIR` (also `moonshine-server MODEL_DIR`):
 * the OpenAI-compatible HTTP server (src/server/server.h). */
#include <libgen.h>
#include <sys/resource.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/plan.h"
#include "session/generate.h"
#include "session/prefix_cache.h"
#include "session/slots.h"
#include "server/api.h"
#include "server/server.h"
#include "text/tokenizer.h"
#include "util/fs.h"
#include "util/json.h"

static const char k_usage[] =
    "usage: moonshine serve MODEL_DIR [--host 127.0.0.1] [--port 8000] [--model-name NAME] [--ctx N] [--threads N] [--backend B]\n"
    "                       [--api-key KEY] [--cors-origin ORIGIN] [--parser FORMAT] [--max-queue N]\n"
    "                       [--max-body-mib N] [--max-connections N] [--max-connections-per-ip N]\n"
    "                       [--header-timeout-s S] [--body-timeout-s S]\n"
    "                       [--slots N] [--prefill-chunk N] [--request-deadline-s S]\n"
    "                       [--prefix-cache-entries N] [--prefix-cache-mib M] [--prefix-cache-dir DIR]\n"
    "                       [--prefix-cache-gib G] [--checkpoint-every N] [engine flags]\n";

static void pc_log(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "moonshine serve: %s\n", line);
}

/* The output format from config.json's model_type (or --parser). */
static int pick_format(const char *dir, const char *name, ms_outfmt *fmt) {
    ms_err err = {0};
    if (name) {
        if (ms_outfmt_from_name(name, fmt, &err)) {
            fprintf(stderr, "moonshine serve: --parser: %s\n", err.msg);
            return -1;
        }
        return 0;
    }
    char path[4096], *text = NULL;
    size_t len;
    cJSON *j = NULL;
    const char *mt = NULL;
    if (!ms_path_join(path, sizeof path, dir, "config.json", &err) && !ms_read_file(path, 1 << 24, &text, &len, &err) &&
        !ms_json_parse(text, len, path, &j, &err)) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "model_type");
        if (cJSON_IsString(v)) mt = v->valuestring;
    }
    *fmt = ms_outfmt_for_model_type(mt);
    cJSON_Delete(j);
    free(text);
    return 0;
}

/* Test hook: the tokenization of a file's text, emitted instead of sampled tokens. */
static int load_forced(const ms_tokenizer *t, const char *path, ms_tok_ids *ids) {
    ms_err err = {0};
    char *text;
    size_t len;
    if (ms_read_file(path, 1 << 24, &text, &len, &err)) {
        fprintf(stderr, "moonshine serve: --test-forced-output: %s\n", err.msg);
        return -1;
    }
    int rc = ms_tok_encode(t, text, len, MS_TOK_ENCODE_SPECIAL, ids, &err);
    free(text);
    if (rc) fprintf(stderr, "moonshine serve: --test-forced-output: %s\n", err.msg);
    return rc ? -1 : 0;
}

typedef struct serve_stats {
    ms_sched *sched;
    ms_expert_source *experts;
    ms_prefix_cache *pc;
} serve_stats;

/* /metrics' engine side (called by the server's worker, the engines' only user): summed over the slots. */
static void engine_stats(void *user, ms_server_engine_stats *o) {
    serve_stats *x = user;
    for (int i = 0; i < ms_sched_n_slots(x->sched); i++) {
        const ms_engine_stats *es = ms_engine_get_stats(ms_generator_engine(ms_sched_generator(x->sched, i)));
        if (es) {
            o->tokens_forwarded += es->tokens;
            o->experts_acquired += es->experts_acquired;
        }
    }
    if (x->experts && ms_is_streaming_source(x->experts)) {
        ms_stream_stats ss;
        ms_streaming_stats(x->experts, &ss);
        o->streaming = 1;
        o->expert_acquires = ss.acquires;
        o->expert_hits = ss.hits;
        o->expert_misses = ss.misses;
        o->bytes_read = ss.bytes_read;
        o->expert_reads = ss.reads;
        o->read_wait_s = ss.wait_s;
    }
    if (x->pc) {
        o->prefix_cache = 1;
        o->prefix_cache_entries = ms_prefix_cache_entries(x->pc);
        o->prefix_cache_bytes = ms_prefix_cache_bytes(x->pc);
        ms_prefix_cache_get_stats(x->pc, &o->pc);
        for (int i = 0; i < ms_sched_n_slots(x->sched); i++)
            o->checkpoints += (uint64_t)ms_generator_checkpoints(ms_sched_generator(x->sched, i));
    }
}

/* MemAvailable of /proc/meminfo in bytes (0: unknown). */
static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb << 10;
}

/* The slot count from the memory plan (engine/plan.h): with --memory-mib the whole plan for N slots must
 * fit it; without, the N slots' state and workspace must fit the available memory (the model is mapped
 * already). want 0: what fits, at most 8 (at least 1). A --slots N that does not fit is refused before
 * anything is allocated for it (printed; nonzero). */
static int plan_slots(ms_cli_ctx *x, const ms_cli_opts *eo, int want, int chunk, int *out) {
    int64_t cache = -1;
    if (x->experts) {
        ms_stream_stats ss;
        ms_streaming_stats(x->experts, &ss);
        cache = (int64_t)ss.slot_bytes * ss.n_slots;
    }
    int ctx = ms_engine_max_ctx(x->engine);
    ms_plan_opts po = {.context = ctx, .max_batch = chunk > 8 ? chunk : 8, .threads = x->threads,
                       .expert_cache_bytes = cache, .static_load = x->static_load, .slots = 1};
    ms_plan p;
    ms_err err = {0};
    if (ms_plan_make(&x->model, &po, &p, &err)) {
        fprintf(stderr, "moonshine serve: memory plan: %s\n", err.msg);
        return 1;
    }
    uint64_t per = p.state_bytes + p.workspace_bytes;
    int fit;
    if (eo->memory_mib > 0) {
        fit = ms_plan_max_slots(&x->model, &po, (uint64_t)eo->memory_mib << 20);
        if (want > fit) {
            po.slots = want;
            ms_plan_make(&x->model, &po, &p, &err);
            ms_plan_check(&p, (uint64_t)eo->memory_mib << 20, &err);
            fprintf(stderr, "moonshine serve: --slots %d does not fit --memory-mib %lld (at most %d slot%s fit%s): %s\n",
                    want, (long long)eo->memory_mib, fit, fit == 1 ? "" : "s", fit == 1 ? "s" : "", err.msg);
            return 1;
        }
    } else {
        uint64_t avail = mem_available();
        fit = avail && per ? (int)(avail / per > 4096 ? 4096 : avail / per) : 4096;
        if (want > fit) {
            fprintf(stderr,
                    "moonshine serve: --slots %d does not fit: each slot needs %.1f MiB (causal state for %d tokens "
                    "and workspace), %.1f MiB are available; at most %d fit (--ctx smaller fits more)\n",
                    want, per / 1048576.0, ctx, avail / 1048576.0, fit);
            return 1;
        }
    }
    *out = want > 0 ? want : fit < 1 ? 1 : fit > 8 ? 8 : fit;
    return 0;
}

int cmd_serve(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("%s\nServes the OpenAI API (GET /health, GET /metrics, GET /v1/models, POST /v1/chat/completions,\n"
               "POST /v1/completions, POST /tokenize, POST /detokenize) for the model in MODEL_DIR, which needs\n"
               "a tokenizer and, for chat, a chat template (see docs/server.md). --port 0 picks a free port;\n"
               "the listening address is printed to stderr.\n"
               "--slots N: requests served at once, each in its own slot (own causal state); every step decodes\n"
               "all of them together and prefills one --prefill-chunk (256) of one prompt. Default: what the\n"
               "memory plan fits (--memory-mib, else the available memory), at most 8; a count that does not\n"
               "fit is refused. --max-queue N (64): requests waiting beyond the slots; more get 503 with\n"
               "Retry-After. --request-deadline-s S: a deadline for every request (a request's \"deadline_s\"\n"
               "may shorten it); reached before the first token: 504 (the evaluated prompt is kept, a retry\n"
               "resumes), after it: the reply ends with finish_reason \"length\" and \"deadline_exceeded\": true.\n"
               "--api-key KEY (or MOONSHINE_API_KEY): clients must send 'Authorization: Bearer KEY' (all but\n"
               "/health); a --host other than loopback is refused without one. --cors-origin ORIGIN lets a\n"
               "web page at ORIGIN call the server (\"*\": any); without it cross-origin requests get 403.\n"
               "Limits: --max-body-mib (8), --max-connections (1024; more get 503), --max-connections-per-ip\n"
               "(0: off; one peer address's open connections), --header-timeout-s (10:\n"
               "request line + headers, and keep-alive idle), --body-timeout-s (30).\n"
               "--parser think|qwen3|deepseek_v3|deepseek_v31|kimi_k2|glm|harmony|xtml overrides the\n"
               "reasoning/tool-call format chosen from config.json's model_type.\n"
               "Models that cannot roll back their state (KDA, DeltaNet, DSA, compressed attention) keep\n"
               "snapshots of recent prompts for prefix reuse: --prefix-cache-entries (default 64) and\n"
               "--prefix-cache-mib (default 2048); 0 turns it off. --prefix-cache-dir DIR adds a disk tier (every\n"
               "model): snapshots are written there by a background thread (0700 directory, 0600 files, checked\n"
               "before use) and survive a restart; --prefix-cache-gib G (16) and --prefix-cache-entries bound it.\n"
               "Those models also save checkpoints during prefill: every --checkpoint-every N prompt tokens (default\n"
               "from the state size and the cache's budget) and at each message boundary; 0 turns them off.\n"
               "--test-forced-output FILE (tests only) emits FILE's tokens instead of sampling.\n",
               k_usage);
        return 0;
    }
    ms_cli_opts eo;
    int64_t port = 8000, max_queue = 64, max_body = 8, pc_entries = 64, pc_mib = 2048, pc_gib = 16, max_conn = 1024,
            hto = 10, bto = 30, max_conn_ip = 0;
    int64_t n_slots = 0, chunk = 256, ckpt = -1;
    double deadline = 0;
    if (ms_cli_engine_args(argc, argv, &eo) || ms_arg_int(argc, argv, "--port", 0, 65535, &port) ||
        ms_arg_int(argc, argv, "--max-queue", 1, 1 << 20, &max_queue) ||
        ms_arg_int(argc, argv, "--max-body-mib", 1, 1024, &max_body) ||
        ms_arg_int(argc, argv, "--prefix-cache-entries", 0, 4096, &pc_entries) ||
        ms_arg_int(argc, argv, "--prefix-cache-mib", 0, INT64_C(1) << 30, &pc_mib) ||
        ms_arg_int(argc, argv, "--prefix-cache-gib", 1, INT64_C(1) << 20, &pc_gib) ||
        ms_arg_int(argc, argv, "--max-connections", 1, 1 << 20, &max_conn) ||
        ms_arg_int(argc, argv, "--max-connections-per-ip", 0, 1 << 20, &max_conn_ip) ||
        ms_arg_int(argc, argv, "--header-timeout-s", 1, 3600, &hto) ||
        ms_arg_int(argc, argv, "--body-timeout-s", 1, 3600, &bto) ||
        ms_arg_int(argc, argv, "--slots", 1, 256, &n_slots) || ms_arg_int(argc, argv, "--checkpoint-every", 0, 1 << 24, &ckpt) || ms_arg_int(argc, argv, "--prefill-chunk", 1, 4096, &chunk))
        return 2;
    const char *dl_s = ms_arg_str(argc, argv, "--request-deadline-s");
    if (dl_s) {
        char *end;
        deadline = strtod(dl_s, &end);
        if (end == dl_s || *end || !(deadline > 0) || deadline > 1e6) {
            fprintf(stderr, "moonshine serve: --request-deadline-s wants seconds in (0, 1e6], got \"%s\"\n", dl_s);
            return 2;
        }
    }
    const char *key = ms_arg_str(argc, argv, "--api-key"), *cors = ms_arg_str(argc, argv, "--cors-origin");
    if (!key) key = getenv("MOONSHINE_API_KEY");
    if (key && !key[0]) key = NULL;
    const char *host = ms_arg_str(argc, argv, "--host"), *name = ms_arg_str(argc, argv, "--model-name");
    const char *pc_dir = ms_arg_str(argc, argv, "--prefix-cache-dir");
    const char *parser = ms_arg_str(argc, argv, "--parser"), *forced = ms_arg_str(argc, argv, "--test-forced-output");
    const char *dir = ms_cli_model_arg("serve", ms_arg_pos(argc, argv, 0));
    if (!dir || ms_args_unknown(argc, argv, "serve")) {
        fputs(k_usage, stderr);
        return 2;
    }
    char dircopy[4096];
    snprintf(dircopy, sizeof dircopy, "%s", dir);
    size_t dl = strlen(dircopy);
    while (dl > 1 && dircopy[dl - 1] == '/') dircopy[--dl] = 0;
    if (!name) name = basename(dircopy);
    ms_outfmt fmt;
    if (pick_format(dir, parser, &fmt)) return 2;
    ms_err err = {0};
    ms_tokenizer *tok = NULL;
    if (ms_tok_load_dir(dir, &tok, &err)) {
        fprintf(stderr, "moonshine serve: tokenizer: %s\n", err.msg);
        return 1;
    }
    /* signals are taken by sigwait below: block them before any thread starts */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    ms_cli_ctx x;
    if (ms_cli_open("serve", dir, &eo, &x)) {
        ms_tok_free(tok);
        return 1;
    }
    if (eo.ctx > 0 && (int64_t)eo.ctx > x.model.cfg.max_pos) {
        fprintf(stderr,
                "moonshine serve: --ctx %d is larger than the model's max_position_embeddings (%lld): positions past it "
                "were never trained. Use --ctx %lld or less.\n",
                eo.ctx, (long long)x.model.cfg.max_pos, (long long)x.model.cfg.max_pos);
        ms_cli_close(&x);
        ms_tok_free(tok);
        return 2;
    }
    /* every connection is a file descriptor: make room for --max-connections of them */
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)max_conn + 256) {
        rlim_t want = (rlim_t)max_conn + 256;
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur < (rlim_t)max_conn + 16)
            fprintf(stderr, "moonshine serve: warning: the open-file limit (%llu) is below --max-connections %lld\n",
                    (unsigned long long)rl.rlim_cur, (long long)max_conn);
    }
    int rc = 1;
    int64_t V = x.model.cfg.vocab;
    int32_t eos[64];
    int n_eos = 0;
    ms_generator *gen = NULL;
    ms_sched *sched = NULL;
    ms_server *srv = NULL;
    ms_tok_ids fids = {0};
    ms_prefix_cache *pc = NULL;
    ms_gen_snapshots snaps = {0};
    const char *reuse = "rollback";
    if (ms_gen_eos_ids(dir, V, eos, 63, &n_eos, &err)) goto fail;
    int32_t teos = ms_tok_eos_id(tok);
    int dup = 0;
    for (int i = 0; i < n_eos; i++) dup |= eos[i] == teos;
    if (teos >= 0 && teos < V && !dup) eos[n_eos++] = teos;
    if (forced && load_forced(tok, forced, &fids)) goto done;
    int can_truncate = ms_engine_can_truncate(x.engine);
    ms_server_reuse ru = MS_SERVER_REUSE_ROLLBACK;
    if (!can_truncate || pc_dir) {
        if (!can_truncate) {
            reuse = "reset (no prefix cache)";
            ru = MS_SERVER_REUSE_NONE;
        }
        if (pc_entries > 0 && pc_mib > 0) {
            ms_prefix_cache_opts po = {.max_entries = (int)pc_entries, .max_bytes = (uint64_t)pc_mib << 20, .dir = pc_dir,
                                       .model = &x.model, .disk_entries = (int)pc_entries,
                                       .disk_bytes = (uint64_t)pc_gib << 30, .log = pc_log};
            if (ms_prefix_cache_open(&po, &pc, &err)) goto fail;
            snaps = ms_prefix_cache_snapshots(pc);
            ms_engine_opts co = {.max_ctx = ms_engine_max_ctx(x.engine), .max_batch = (int)chunk};
            snaps.every = ckpt < 0 ? ms_prefix_cache_checkpoint_every(pc, &x.model, &co, (int)chunk) : (int)ckpt;
            snaps.at_boundaries = ckpt != 0;
            reuse = !pc_dir       ? "snapshots shared by the slots"
                    : can_truncate ? "rollback shared across slots + snapshots on disk"
                                   : "snapshots shared by the slots + disk";
            if (!can_truncate) ru = MS_SERVER_REUSE_SNAPSHOTS;
        }
    } else {
        reuse = "rollback, shared across slots";
    }
    int slots = 0;
    if (plan_slots(&x, &eo, (int)n_slots, (int)chunk, &slots)) goto done;
    /* the slots' engines replace the one ms_cli_open made (its memory is given back first) */
    ms_engine_opts seo = {.max_ctx = eo.ctx, .max_batch = (int)chunk, .pool = x.pool,
                          .experts = ms_cli_engine_experts(&x), .mla_form = eo.mla_form, .backend = x.backend,
                          .stages = x.stages, .hybrid = ms_cli_hybrid(&x)};
    ms_engine_destroy(x.engine);
    x.engine = NULL;
    ms_sched_opts sco = {.n_slots = slots, .chunk = (int)chunk, .engine = seo, .tok = tok, .snaps = pc ? &snaps : NULL};
    if (ms_sched_new(&x.model, &sco, &sched, &err)) goto fail;
    gen = ms_sched_generator(sched, 0);
    serve_stats es = {0};
    ms_server_opts so = {.host = host, .port = (int)port, .model_name = name, .model_dir = dir, .sched = sched, .tok = tok,
                         .reuse = ru, .request_deadline_s = deadline,
                         .vocab = V, .eos_ids = eos, .n_eos = n_eos, .fmt = fmt, .max_body = (size_t)max_body << 20,
                         .max_queue = (int)max_queue, .forced_ids = forced ? fids.ids : NULL, .n_forced = (int)fids.n,
                         .api_key = key, .cors_origin = cors, .max_connections = (int)max_conn,
                         .max_connections_per_ip = (int)max_conn_ip,
                         .header_timeout_s = (int)hto, .body_timeout_s = (int)bto,
                         .stats = engine_stats, .stats_user = &es};
    es.sched = sched;
    es.experts = x.experts;
    es.pc = pc;
    if (ms_server_start(&so, &srv, &err)) goto fail;
    if (key) fprintf(stderr, "moonshine serve: API key required (Authorization: Bearer ...) on every endpoint but /health\n");
    if (pc && snaps.at_boundaries && !can_truncate)
        fprintf(stderr, "moonshine serve: prefill checkpoints every %d tokens and at message boundaries\n", snaps.every);
    fprintf(stderr,
            "moonshine serve: listening on http://%s%s%s:%d (model \"%s\", %d slot%s, %d threads, context %d, prefill "
            "chunk %d, parser %s, prefix reuse %s%s%s)\n",
            host && strchr(host, ':') ? "[" : "", host ? host : "127.0.0.1", host && strchr(host, ':') ? "]" : "",
            ms_server_port(srv), name, slots, slots == 1 ? "" : "s", x.threads, ms_generator_max_ctx(gen), (int)chunk,
            ms_outfmt_name(fmt), reuse, deadline > 0 ? ", request deadline " : "", deadline > 0 ? dl_s : "");
    fflush(stderr);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "moonshine serve: signal %d, stopping\n", sig);
    ms_server_stop(srv);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "moonshine serve: %s\n", err.msg);
done:
    ms_sched_free(sched);
    ms_prefix_cache_free(pc);
    ms_tok_ids_free(&fids);
    ms_cli_close(&x);
    ms_tok_free(tok);
    return rc;
}
