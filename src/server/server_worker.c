/* server_worker.c — the worker: the job lifecycle (references, wake-ups, the output channel, hang-ups),
 * the response store (Responses' previous_response_id), the slot scheduler's callbacks (tokens,
 * logprobs, a request's end, deadlines) and the worker thread that admits queued jobs and steps. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include "server/server_int.h"

void ms_srv_job_unref(job *j) {
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    ms_api_request_free(&j->req);
    free(j->prompt);
    free(j->buf);
    ms_grammar_free(j->grammar);
    free(j->lead);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* With j->mu held: let a suspended connection see the news (bytes, done, cancelled). */
void ms_srv_job_wake(job *j) {
    if (j->suspended && j->conn) {
        j->suspended = 0;
        MHD_resume_connection(j->conn);
    }
}

/* 1 when the peer closed its end of the socket (a half-close counts: see docs/server.md). */
int ms_srv_peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    char c;
    if (p.revents & POLLIN) return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    return 0;
}

/* Worker -> connection: append body bytes. Returns nonzero when the client is gone. */
static int job_sink(void *user, const char *data, size_t len) {
    job *j = user;
    pthread_mutex_lock(&j->mu);
    int gone = j->cancelled;
    if (!gone && len) {
        if (j->len + len > j->cap) {
            size_t cap = j->cap ? j->cap : 4096;
            while (cap < j->len + len) cap *= 2;
            char *n = realloc(j->buf, cap);
            if (!n) j->nomem = 1;
            else {
                j->buf = n;
                j->cap = cap;
            }
        }
        if (!j->nomem) {
            memcpy(j->buf + j->len, data, len);
            j->len += len;
        }
        if (j->req.stream) ms_srv_job_wake(j);
    }
    pthread_mutex_unlock(&j->mu);
    return gone || j->nomem;
}

/* The worker's view of a hang-up: checked before each token and between prefill pieces. */
static int job_check_cancel(job *j) {
    pthread_mutex_lock(&j->mu);
    if (!j->cancelled && !j->done && ms_srv_peer_gone(j->fd)) {
        j->cancelled = 1;
        ms_srv_job_wake(j);
    }
    int c = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return c;
}

/* ---------------- the worker: the slot scheduler ---------------- */
/* A job in a slot: its response builder and what the scheduler's callbacks need. */
typedef struct run {
    ms_server *s;
    job *j;
    ms_api_resp *resp;
    ms_outparse_opts po;
    ms_err err;
    int rc, slot, n_tok, deadline_hit;
    double t_last, t_admit;
    int32_t last_id;   /* the last sampled id */
    int32_t *ids;      /* sampled ids, kept when a stop string must be identified (MESSAGES with stop sequences) */
    int n_ids, cap_ids;
} run;

/* ---------------- the response store (Responses' previous_response_id) ---------------- */
/* Keep id -> messages (newest first); the oldest go past STORE_MAX entries or STORE_MAX_BYTES. */
static void store_put(ms_server *s, const char *id, char *messages_json) {
    stored *n = calloc(1, sizeof *n);
    if (!n) { free(messages_json); return; }
    snprintf(n->id, sizeof n->id, "%s", id);
    n->messages_json = messages_json;
    n->bytes = strlen(messages_json) + sizeof *n;
    pthread_mutex_lock(&s->rmu);
    n->next = s->store;
    s->store = n;
    s->n_store++;
    s->store_bytes += n->bytes;
    while (s->n_store > STORE_MAX || (s->store_bytes > STORE_MAX_BYTES && s->n_store > 1)) {
        stored **pp = &s->store;
        while ((*pp)->next) pp = &(*pp)->next;
        stored *old = *pp;
        *pp = NULL;
        s->n_store--;
        s->store_bytes -= old->bytes;
        free(old->messages_json);
        free(old);
    }
    pthread_mutex_unlock(&s->rmu);
}

/* A copy of a stored response's messages (malloc'd) or NULL. */
char *ms_srv_store_get(ms_server *s, const char *id) {
    char *out = NULL;
    pthread_mutex_lock(&s->rmu);
    for (stored *n = s->store; n; n = n->next)
        if (!strcmp(n->id, id)) { out = strdup(n->messages_json); break; }
    pthread_mutex_unlock(&s->rmu);
    return out;
}

void ms_srv_store_free(ms_server *s) {
    for (stored *n = s->store, *nx; n; n = nx) {
        nx = n->next;
        free(n->messages_json);
        free(n);
    }
    s->store = NULL;
}

/* The input chain + the produced assistant message, stored under the response's id. */
static void store_response(ms_server *s, job *j, ms_api_resp *resp) {
    char *m = ms_api_resp_message_json(resp);
    cJSON *in = j->req.input_json ? cJSON_Parse(j->req.input_json) : NULL, *msg = m ? cJSON_Parse(m) : NULL;
    free(m);
    if (cJSON_IsArray(in) && msg) {
        /* as the client saw it: text trimmed as in the output items (api_agent.c), content a string */
        const char *keys[2] = {"content", "reasoning_content"};
        for (int k = 0; k < 2; k++) {
            cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, keys[k]);
            if (!cJSON_IsString(c)) {
                if (!k) cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", cJSON_CreateString(""));
                continue;
            }
            const char *t = c->valuestring;
            while (*t && strchr(" \t\r\n", *t)) t++;
            size_t n = strlen(t);
            while (n && strchr(" \t\r\n", t[n - 1])) n--;
            char *tr = strndup(t, n);
            if (tr) cJSON_ReplaceItemInObjectCaseSensitive(msg, keys[k], cJSON_CreateString(tr));
            free(tr);
        }
        cJSON_AddItemToArray(in, msg);
        msg = NULL;
        char *t = cJSON_PrintUnformatted(in);
        if (t) store_put(s, ms_api_resp_id(resp), t);
    }
    cJSON_Delete(in);
    cJSON_Delete(msg);
}

/* The stop string that ended a generation: the earliest match in the decoded output (as the stop
 * matcher chose it), or NULL. */
static const char *which_stop(ms_server *s, job *j, const run *g) {
    if (!j->req.n_stop || !g->n_ids) return NULL;
    for (int i = 0; i < s->o.n_eos; i++)
        if (s->eos[i] == g->last_id) return NULL; /* ended by EOS */
    char *text = NULL;
    size_t tl = 0;
    ms_err err = {0};
    if (ms_tok_decode(s->o.tok, g->ids, (size_t)g->n_ids, 0, &text, &tl, &err)) return NULL;
    const char *best = NULL;
    size_t first = SIZE_MAX;
    for (int i = 0; i < j->req.n_stop; i++) {
        const char *m = memmem(text, tl, j->req.stop[i], strlen(j->req.stop[i]));
        if (m && (size_t)(m - text) < first) { first = (size_t)(m - text); best = j->req.stop[i]; }
    }
    free(text);
    return best;
}

static int j_keeps_ids(const run *g) { return g->j->req.kind == MS_API_MESSAGES && g->j->req.n_stop > 0; }

static int on_token(void *user, int32_t id, const char *text, size_t len) {
    run *g = user;
    if (id >= 0) {
        double t = now_s();
        pthread_mutex_lock(&g->s->mmu);
        if (!g->n_tok) hist_add(&g->s->m.ttft, k_ttft_b, N_TTFT, t - g->j->t_arrive);
        else hist_add(&g->s->m.itl, k_itl_b, N_ITL, t - g->t_last);
        pthread_mutex_unlock(&g->s->mmu);
        g->t_last = t;
        g->n_tok++;
        g->last_id = id;
        if (j_keeps_ids(g)) {
            if (g->n_ids == g->cap_ids) {
                int cap = g->cap_ids ? g->cap_ids * 2 : 256;
                int32_t *n = realloc(g->ids, sizeof *n * (size_t)cap);
                if (n) { g->ids = n; g->cap_ids = cap; }
            }
            if (g->n_ids < g->cap_ids) g->ids[g->n_ids++] = id;
        }
    }
    int rc = ms_api_resp_text(g->resp, text, len, job_sink, g->j, &g->err);
    if (rc) {
        g->rc = rc;
        return 1;
    }
    return job_check_cancel(g->j);
}

/* ms_gen_logprob_fn: the token's logprobs go to the response builder (sent with its text) */
static void on_logprob(void *user, int32_t id, float lp, const int32_t *top, const float *tlp, int n) {
    struct run *g = user;
    if (ms_api_resp_logprob(g->resp, id, lp, top, tlp, n)) g->rc = MS_ERR_NOMEM;
}

static void random_hex(char *out, int n) {
    uint8_t b[32];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)(rand() ^ (int)time(NULL));
    for (int i = 0; i < n; i++) out[i] = "0123456789abcdef"[(b[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[n] = 0;
}

/* The job ends with an error: its JSON body (json, or e's) and status, unless a stream already started:
 * then a `data: {"error":...}` event and [DONE]. */
static void job_error(job *j, const ms_api_error *e, const char *json) {
    pthread_mutex_lock(&j->mu);
    int sse = j->req.stream && j->started;
    if (!sse) {
        j->len = j->off = 0; /* replace a partial body */
        j->status = e->status;
    }
    pthread_mutex_unlock(&j->mu);
    if (sse) {
        ms_api_resp_stream_error_kind(j->req.kind, e, job_sink, j);
        return;
    }
    char *b = json ? NULL : j->req.kind == MS_API_MESSAGES ? ms_api_anthropic_error_json(e) : ms_api_error_json(e);
    const char *t = json ? json : b;
    if (t) job_sink(j, t, strlen(t));
    free(b);
}

/* The job left the worker: counted off, then done and its connection woken, the worker's reference
 * dropped. Counted off first: a client that sees its answer end and sends the next request at once
 * must find the room this one held (else a full queue refuses it with a 503 for a job already over). */
static void job_end(ms_server *s, job *j, int slot) {
    pthread_mutex_lock(&s->mu);
    s->queued--;
    if (slot >= 0) {
        s->slot_job[slot] = NULL;
        s->running--;
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    ms_srv_job_wake(j);
    pthread_mutex_unlock(&j->mu);
    ms_srv_job_unref(j);
}

/* 504: the deadline passed before the first token. evaluated: prompt tokens in the slot's state, of which
 * reused were there before the request; resumes: the same request sent again starts from them. */
static void deadline_error(ms_server *s, job *j, int evaluated, int reused, int resumes) {
    double el = now_s() - j->t_arrive;
    ms_api_error e;
    if (evaluated > 0)
        ms_api_fail(&e, 504, "timeout_error", NULL, "deadline_exceeded",
                    "the request's deadline of %.3g s passed after %.3f s, before the first token: %d of the prompt's %d "
                    "tokens are evaluated (%d reused from earlier requests, %d evaluated for this one); %s",
                    j->deadline_s, el, evaluated, j->n_prompt, reused, evaluated - reused,
                    resumes ? "the same request sent again resumes from them" : "a retry starts over");
    else
        ms_api_fail(&e, 504, "timeout_error", NULL, "deadline_exceeded",
                    "the request's deadline of %.3g s passed after %.3f s while it waited for a slot: no prompt token "
                    "was evaluated",
                    j->deadline_s, el);
    char *b = ms_api_error_json(&e), *out = NULL;
    cJSON *root = b ? cJSON_Parse(b) : NULL, *eo = cJSON_GetObjectItemCaseSensitive(root, "error");
    if (eo) {
        cJSON_AddNumberToObject(eo, "elapsed_s", el);
        cJSON_AddNumberToObject(eo, "deadline_s", j->deadline_s);
        cJSON_AddNumberToObject(eo, "prompt_tokens", j->n_prompt);
        cJSON_AddNumberToObject(eo, "prompt_tokens_evaluated", evaluated);
        cJSON_AddNumberToObject(eo, "prompt_tokens_reused", reused);
        cJSON_AddBoolToObject(eo, "retry_resumes", resumes);
        out = cJSON_PrintUnformatted(root);
    }
    cJSON_Delete(root);
    job_error(j, &e, out ? out : b);
    free(out);
    free(b);
    pthread_mutex_lock(&s->mmu);
    s->m.deadline_first++;
    pthread_mutex_unlock(&s->mmu);
}

/* The scheduler's end of a request (inside ms_sched_step): the response's end, or its error; metrics. */
static void on_done(void *user, int rc, const ms_gen_result *res0, const ms_err *err) {
    run *g = user;
    ms_server *s = g->s;
    job *j = g->j;
    ms_gen_result res = *res0;
    if (rc && !g->err.msg[0] && err) g->err = *err;
    if (!rc && g->rc) rc = g->rc;
    pthread_mutex_lock(&j->mu);
    int cancelled = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    int evaluated = 0;
    ms_generator *gen = ms_sched_generator(s->sched, g->slot);
    if (gen) ms_generator_history(gen, &evaluated);
    if (evaluated > j->n_prompt) evaluated = j->n_prompt;
    ms_sched_stats st;
    ms_sched_get_stats(s->sched, &st);
    int kept = st.kept_prefixes > s->kept_seen; /* this slot's evaluated prefix was just saved as a snapshot */
    s->kept_seen = st.kept_prefixes;
    if (!rc && !cancelled && g->deadline_hit && !g->n_tok) {
        int resumes = evaluated > 0 && (s->o.reuse == MS_SERVER_REUSE_ROLLBACK || kept ||
                                        (s->o.reuse == MS_SERVER_REUSE_SNAPSHOTS && evaluated == j->n_prompt));
        deadline_error(s, j, evaluated, res.cached_tokens, resumes);
    } else if (!rc && !cancelled && (res.finish != MS_FINISH_ABORT || g->deadline_hit)) {
        ms_finish fin = res.finish;
        if (g->deadline_hit && fin == MS_FINISH_ABORT) {
            fin = MS_FINISH_LENGTH;
            ms_api_resp_deadline(g->resp);
            pthread_mutex_lock(&s->mmu);
            s->m.deadline_after++;
            pthread_mutex_unlock(&s->mmu);
        }
        if (fin == MS_FINISH_STOP && j->req.kind == MS_API_MESSAGES)
            rc = ms_api_resp_set_stop_sequence(g->resp, which_stop(s, j, g));
        if (!rc)
            rc = ms_api_resp_finish(g->resp, fin, res.prompt_tokens, res.completion_tokens, res.cached_tokens, job_sink,
                                    j, &g->err);
    }
    pthread_mutex_lock(&j->mu);
    cancelled = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    if (!rc && !cancelled && j->req.kind == MS_API_RESPONSES && j->req.store && res.finish != MS_FINISH_ABORT)
        store_response(s, j, g->resp);
    free(g->ids);
    pthread_mutex_lock(&s->mmu);
    s->m.generations++;
    s->m.prompt_tokens += (uint64_t)res.prompt_tokens;
    s->m.completion_tokens += (uint64_t)res.completion_tokens;
    s->m.cached_tokens += (uint64_t)(res.cached_tokens > 0 ? res.cached_tokens : 0);
    s->m.prefix_hits += res.cached_tokens > 0;
    if (!rc && !cancelled && (res.finish != MS_FINISH_ABORT || g->deadline_hit)) {
        double took = now_s() - g->t_admit;
        s->m.slot_s = s->m.slot_n ? 0.8 * s->m.slot_s + 0.2 * took : took;
        s->m.slot_n++;
    }
    s->m.cancelled += cancelled;
    s->m.failed += rc && !cancelled;
    pthread_mutex_unlock(&s->mmu);
    if (rc && !cancelled) {
        ms_api_error e;
        ms_api_fail(&e, 500, "server_error", NULL, NULL, "generation failed: %s", g->err.msg[0] ? g->err.msg : ms_status_name(rc));
        ms_api_scrub_paths(e.message, s->model_dir);
        job_error(j, &e, NULL);
    }
    ms_api_resp_free(g->resp);
    if (g->slot >= 0) s->slot_run[g->slot] = NULL;
    job_end(s, j, g->slot);
    free(g);
}

/* Put j into a free slot (between steps). */
static void admit(ms_server *s, job *j) {
    run *g = calloc(1, sizeof *g);
    if (!g) {
        ms_api_error e;
        ms_api_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        job_error(j, &e, NULL);
        job_end(s, j, -1);
        return;
    }
    g->s = s;
    g->j = j;
    g->slot = -1;
    g->t_admit = now_s();
    char hex[32], id[48];
    random_hex(hex, 24);
    ms_api_kind kind = j->req.kind;
    snprintf(id, sizeof id, "%s%s", kind == MS_API_CHAT ? "chatcmpl-" : kind == MS_API_MESSAGES ? "msg_" :
                                    kind == MS_API_RESPONSES ? "resp_" : "cmpl-", hex);
    if (!j->req.has_seed) {
        uint64_t seed;
        if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed) seed = (uint64_t)time(NULL);
        j->req.sampling.seed = seed;
    }
    g->po = (ms_outparse_opts){.start_in_reasoning = j->start_in_reasoning, .tools_json = j->req.tools_json};
    if (getrandom(&g->po.id_seed, sizeof g->po.id_seed, 0) != (ssize_t)sizeof g->po.id_seed)
        g->po.id_seed = j->req.sampling.seed ^ 0x5eedULL;
    ms_api_resp_opts ro = {.kind = j->req.kind, .id = id, .model = s->model_name, .created = (int64_t)time(NULL),
                           .stream = j->req.stream, .include_usage = j->req.include_usage, .fmt = s->o.fmt, .parse = &g->po,
                           .prompt_tokens = j->n_prompt, .echo_json = j->req.echo_json,
                           .previous_response_id = j->req.previous_response_id,
                           .single_tool_call = !j->req.parallel_tool_calls, .logprobs = j->req.logprobs, .tok = s->o.tok};
    ms_gen_params gp = {.sampling = j->req.sampling, .max_tokens = j->max_tokens,
                        .stop = (const char *const *)j->req.stop, .n_stop = j->req.n_stop, .eos_ids = s->eos,
                        .n_eos = s->o.n_eos, .forced_ids = s->forced, .n_forced = s->o.n_forced,
                        .constraint = j->grammar ? &j->con : NULL,
                        .logprob_fn = j->req.logprobs ? on_logprob : NULL, .top_logprobs = j->req.top_logprobs};
    int slot = -1;
    int rc = ms_api_resp_new(&ro, &g->resp, &g->err);
    if (!rc) rc = ms_sched_submit(s->sched, j->prompt, j->n_prompt, &gp, on_token, on_done, g, &slot, &g->err);
    if (rc) {
        ms_api_error e;
        int client = rc == MS_ERR_ARG || rc == MS_ERR_LIMIT;
        ms_api_fail(&e, client ? 400 : 500, client ? "invalid_request_error" : "server_error", NULL, NULL, "%s%s",
                    client ? "" : "generation failed: ", g->err.msg[0] ? g->err.msg : ms_status_name(rc));
        ms_api_scrub_paths(e.message, s->model_dir);
        job_error(j, &e, NULL);
        ms_api_resp_free(g->resp);
        free(g);
        pthread_mutex_lock(&s->mmu);
        s->m.failed += !client;
        pthread_mutex_unlock(&s->mmu);
        job_end(s, j, -1);
        return;
    }
    g->slot = slot;
    s->slot_run[slot] = g;
    pthread_mutex_lock(&s->mu);
    s->slot_job[slot] = j;
    s->running++;
    pthread_mutex_unlock(&s->mu);
}

static void sample_engine_stats(ms_server *s) {
    ms_server_engine_stats st = {0};
    if (s->o.stats) s->o.stats(s->o.stats_user, &st);
    ms_sched_stats ss;
    ms_sched_get_stats(s->sched, &ss);
    pthread_mutex_lock(&s->mmu);
    s->m.eng = st;
    s->m.sched = ss;
    pthread_mutex_unlock(&s->mmu);
}

/* /slots' and /metrics' view of the slots, refreshed by the worker after every step. */
static void publish_slots(ms_server *s) {
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_slots; i++) {
        slot_view *v = &s->view[i];
        ms_sched_slot_info(s->sched, i, &v->info);
        job *j = s->slot_job[i];
        v->t_arrive = j ? j->t_arrive : 0;
        v->deadline_s = j ? j->deadline_s : 0;
        v->stream = j ? j->req.stream : 0;
    }
    pthread_mutex_unlock(&s->mu);
}

void *ms_srv_worker_main(void *arg) {
    ms_server *s = arg;
    sample_engine_stats(s);
    job *adm[64];
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->running && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
        if (s->stopping) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        /* join: queued requests take the free slots (in arrival order); queued ones past their deadline (504)
         * or whose client left go too */
        int na = 0, nslot = 0, free_slots = ms_sched_free_slots(s->sched);
        double t = now_s();
        for (job **pp = &s->head; *pp && na < 64;) {
            job *j = *pp;
            pthread_mutex_lock(&j->mu);
            int gone = j->cancelled;
            pthread_mutex_unlock(&j->mu);
            int late = gone || (j->t_deadline > 0 && t >= j->t_deadline);
            if (late || nslot < free_slots) {
                *pp = j->next;
                adm[na++] = j;
                nslot += !late;
            } else {
                pp = &j->next;
            }
        }
        s->tail = s->head;
        while (s->tail && s->tail->next) s->tail = s->tail->next;
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < na; i++) {
            job *j = adm[i];
            pthread_mutex_lock(&j->mu);
            int skip = j->cancelled;
            pthread_mutex_unlock(&j->mu);
            if (skip) job_end(s, j, -1);
            else if (j->t_deadline > 0 && t >= j->t_deadline) {
                deadline_error(s, j, 0, 0, 0);
                job_end(s, j, -1);
            } else admit(s, j);
        }
        if (na) publish_slots(s);
        /* leave at the next step: hang-ups (also mid-prefill), deadlines */
        t = now_s();
        for (int i = 0; i < s->n_slots; i++) {
            run *g = s->slot_run[i];
            if (!g) continue;
            ms_sched_slot info;
            ms_sched_slot_info(s->sched, i, &info);
            if (info.state == MS_SLOT_DONE) continue; /* it ended on its own: leaves as it is */
            if (job_check_cancel(g->j)) ms_sched_cancel(s->sched, i);
            else if (!g->deadline_hit && g->j->t_deadline > 0 && t >= g->j->t_deadline) {
                g->deadline_hit = 1;
                ms_sched_cancel(s->sched, i);
            }
        }
        if (ms_sched_active(s->sched)) {
            ms_err err = {0};
            ms_sched_step(s->sched, &err); /* a failed step ends the requests it concerned, with its error */
        }
        publish_slots(s);
        sample_engine_stats(s);
    }
    /* stopping: every request is cancelled; the slots' requests leave, the queue empties */
    for (int i = 0; i < s->n_slots; i++)
        if (s->slot_run[i]) {
            job *j = s->slot_run[i]->j;
            pthread_mutex_lock(&j->mu);
            j->cancelled = 1;
            ms_srv_job_wake(j);
            pthread_mutex_unlock(&j->mu);
            ms_sched_cancel(s->sched, i);
        }
    if (ms_sched_active(s->sched)) {
        ms_err err = {0};
        ms_sched_step(s->sched, &err);
    }
    for (;;) {
        pthread_mutex_lock(&s->mu);
        job *j = s->head;
        if (j) s->head = j->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        if (!j) break;
        job_end(s, j, -1);
    }
    publish_slots(s);
    return NULL;
}
