/* server_metrics.c — request counts by endpoint and status, GET /metrics (Prometheus text) and
 * GET /slots. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

static const char *const k_ep_name[EP_N] = {"/health", "/metrics", "/v1/models", "/v1/chat/completions",
                                            "/v1/completions", "/tokenize", "/detokenize", "/v1/messages",
                                            "/v1/messages/count_tokens", "/v1/responses", "/slots", "/", "other"};

void ms_srv_count_request(ms_server *s, int ep, int status) {
    int k = N_STATUS;
    for (int i = 0; i < N_STATUS; i++)
        if (k_statuses[i] == status) k = i;
    pthread_mutex_lock(&s->mmu);
    s->m.requests[ep][k]++;
    pthread_mutex_unlock(&s->mmu);
}

static void prom_hist(FILE *f, const char *name, const char *help, const hist *h, const double *b, int nb) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < nb; i++) fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, b[i], (unsigned long long)h->b[i]);
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->n, name, h->sum,
            name, (unsigned long long)h->n);
}

#define PROM(f, type, name, help, fmt, v) fprintf(f, "# HELP " name " " help "\n# TYPE " name " " type "\n" name " " fmt "\n", v)

enum MHD_Result ms_srv_handle_metrics(ms_server *s, struct MHD_Connection *c, conn *cn) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return MHD_NO;
    pthread_mutex_lock(&s->mu);
    int queued = s->queued, running = s->running, by_state[4] = {0};
    for (int i = 0; i < s->n_slots; i++) by_state[s->view[i].info.state]++;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->smu);
    int nconn = s->n_socks;
    pthread_mutex_unlock(&s->smu);
    pthread_mutex_lock(&s->mmu);
    metrics m = s->m;
    pthread_mutex_unlock(&s->mmu);
    typedef unsigned long long ull;
    fprintf(f, "# HELP moonshine_requests_total HTTP requests answered, by endpoint and status\n"
               "# TYPE moonshine_requests_total counter\n");
    for (int e = 0; e < EP_N; e++)
        for (int k = 0; k <= N_STATUS; k++)
            if (m.requests[e][k]) {
                if (k < N_STATUS) fprintf(f, "moonshine_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", k_ep_name[e], k_statuses[k], (ull)m.requests[e][k]);
                else fprintf(f, "moonshine_requests_total{endpoint=\"%s\",status=\"other\"} %llu\n", k_ep_name[e], (ull)m.requests[e][k]);
            }
    PROM(f, "counter", "moonshine_generations_total", "generations run by the worker", "%llu", (ull)m.generations);
    PROM(f, "counter", "moonshine_generations_cancelled_total", "generations stopped because the client left", "%llu", (ull)m.cancelled);
    PROM(f, "counter", "moonshine_generations_failed_total", "generations that failed (500)", "%llu", (ull)m.failed);
    PROM(f, "counter", "moonshine_prompt_tokens_total", "prompt tokens of generations", "%llu", (ull)m.prompt_tokens);
    PROM(f, "counter", "moonshine_generation_tokens_total", "tokens generated", "%llu", (ull)m.completion_tokens);
    PROM(f, "counter", "moonshine_prefix_cache_hits_total", "generations that reused a cached prefix", "%llu", (ull)m.prefix_hits);
    PROM(f, "counter", "moonshine_prefix_cached_tokens_total", "prompt tokens reused from a cached prefix", "%llu", (ull)m.cached_tokens);
    prom_hist(f, "moonshine_time_to_first_token_seconds", "arrival to the first generated token", &m.ttft, k_ttft_b, N_TTFT);
    prom_hist(f, "moonshine_inter_token_latency_seconds", "time between generated tokens", &m.itl, k_itl_b, N_ITL);
    PROM(f, "gauge", "moonshine_queue_length", "requests waiting for a slot", "%d", queued - running);
    PROM(f, "gauge", "moonshine_request_slot_seconds_mean", "mean seconds a finished request spent in its slot (EWMA, weight 0.2)", "%.6f",
         m.slot_n ? m.slot_s : 0.0);
    PROM(f, "gauge", "moonshine_retry_after_seconds", "the Retry-After a 503 server_busy would carry now", "%d",
         ms_srv_retry_after(s, queued - running, NULL));
    PROM(f, "gauge", "moonshine_requests_running", "requests in slots", "%d", running);
    PROM(f, "gauge", "moonshine_slots", "parallel slots (--slots)", "%d", s->n_slots);
    PROM(f, "gauge", "moonshine_slots_busy", "slots serving a request", "%d", s->n_slots - by_state[MS_SLOT_FREE]);
    fprintf(f, "# HELP moonshine_slots_state slots by state\n# TYPE moonshine_slots_state gauge\n");
    for (int k = 0; k < 4; k++)
        fprintf(f, "moonshine_slots_state{state=\"%s\"} %d\n", ms_sched_slot_state_name((ms_sched_slot_state)k), by_state[k]);
    PROM(f, "gauge", "moonshine_slot_occupancy", "busy slots / slots", "%.4f", (double)(s->n_slots - by_state[MS_SLOT_FREE]) / s->n_slots);
    PROM(f, "counter", "moonshine_deadline_exceeded_total", "requests whose deadline passed (before the first token: 504)", "%llu",
         (ull)(m.deadline_first + m.deadline_after));
    PROM(f, "counter", "moonshine_deadline_before_first_token_total", "deadlines reached before the first token (504)", "%llu", (ull)m.deadline_first);
    PROM(f, "counter", "moonshine_deadline_after_first_token_total", "deadlines that ended a reply (finish length)", "%llu", (ull)m.deadline_after);
    PROM(f, "counter", "moonshine_sched_steps_total", "scheduler steps", "%llu", (ull)m.sched.steps);
    PROM(f, "counter", "moonshine_sched_decode_steps_total", "batched decode steps", "%llu", (ull)m.sched.decode_steps);
    PROM(f, "counter", "moonshine_sched_decode_rows_total", "sequences decoded, summed over decode steps (rows / steps: the mean batch)", "%llu",
         (ull)m.sched.decode_rows);
    PROM(f, "counter", "moonshine_sched_prefill_tokens_total", "prompt tokens prefilled by the slots", "%llu", (ull)m.sched.prefill_tokens);
    PROM(f, "counter", "moonshine_sched_shared_prefixes_total", "requests that copied their prefix from another slot (rollback models)", "%llu",
         (ull)m.sched.shared_prefixes);
    PROM(f, "counter", "moonshine_sched_shared_tokens_total", "prompt tokens copied from another slot", "%llu", (ull)m.sched.shared_tokens);
    PROM(f, "gauge", "moonshine_open_connections", "open client connections", "%d", nconn);
    PROM(f, "counter", "moonshine_connections_refused_total", "connections opened past --max-connections or --max-connections-per-ip", "%llu", (ull)m.refused_connections);
    PROM(f, "counter", "moonshine_connections_refused_per_ip_total", "of which past --max-connections-per-ip only", "%llu", (ull)m.refused_per_ip);
    PROM(f, "counter", "moonshine_connection_timeouts_total", "connections closed by the header/body deadlines", "%llu", (ull)m.timeouts);
    PROM(f, "counter", "moonshine_engine_tokens_total", "tokens forwarded by the engine (prefill + decode)", "%llu", (ull)m.eng.tokens_forwarded);
    PROM(f, "counter", "moonshine_engine_experts_acquired_total", "unique experts acquired, summed over layers and steps", "%llu", (ull)m.eng.experts_acquired);
    if (m.eng.streaming) {
        PROM(f, "counter", "moonshine_expert_cache_requests_total", "streamed expert requests", "%llu", (ull)m.eng.expert_acquires);
        PROM(f, "counter", "moonshine_expert_cache_hits_total", "streamed expert requests served from the cache", "%llu", (ull)m.eng.expert_hits);
        PROM(f, "counter", "moonshine_expert_cache_misses_total", "streamed expert requests that read", "%llu", (ull)m.eng.expert_misses);
        PROM(f, "gauge", "moonshine_expert_cache_hit_rate", "hits / requests", "%.6f",
             m.eng.expert_acquires ? (double)m.eng.expert_hits / (double)m.eng.expert_acquires : 0.0);
        PROM(f, "counter", "moonshine_expert_read_bytes_total", "bytes read from disk for experts", "%llu", (ull)m.eng.bytes_read);
        PROM(f, "counter", "moonshine_expert_reads_total", "experts loaded", "%llu", (ull)m.eng.expert_reads);
        PROM(f, "counter", "moonshine_expert_read_wait_seconds_total", "time the engine waited on expert reads", "%.6f", m.eng.read_wait_s);
    }
    if (m.eng.prefix_cache) {
        const ms_prefix_cache_stats *pc = &m.eng.pc;
        PROM(f, "gauge", "moonshine_prefix_cache_entries", "state snapshots held (RAM or disk)", "%d", m.eng.prefix_cache_entries);
        PROM(f, "gauge", "moonshine_prefix_cache_bytes", "bytes of state snapshots held in RAM", "%llu", (ull)m.eng.prefix_cache_bytes);
        fprintf(f, "# HELP moonshine_prefix_cache_tier_entries snapshots by tier\n# TYPE moonshine_prefix_cache_tier_entries gauge\n"
                   "moonshine_prefix_cache_tier_entries{tier=\"ram\"} %d\nmoonshine_prefix_cache_tier_entries{tier=\"disk\"} %d\n",
                pc->ram_entries, pc->disk_entries);
        fprintf(f, "# HELP moonshine_prefix_cache_tier_bytes bytes of snapshots by tier\n# TYPE moonshine_prefix_cache_tier_bytes gauge\n"
                   "moonshine_prefix_cache_tier_bytes{tier=\"ram\"} %llu\nmoonshine_prefix_cache_tier_bytes{tier=\"disk\"} %llu\n",
                (ull)pc->ram_bytes, (ull)pc->disk_bytes);
        fprintf(f, "# HELP moonshine_prefix_cache_restores_total snapshot restores by tier\n# TYPE moonshine_prefix_cache_restores_total counter\n"
                   "moonshine_prefix_cache_restores_total{tier=\"ram\"} %llu\nmoonshine_prefix_cache_restores_total{tier=\"disk\"} %llu\n",
                (ull)pc->hits_ram, (ull)pc->hits_disk);
        PROM(f, "counter", "moonshine_prefix_cache_misses_total", "lookups that found no saved prefix", "%llu", (ull)pc->misses);
        PROM(f, "counter", "moonshine_prefix_cache_restored_tokens_total", "tokens of the snapshots restored", "%llu", (ull)pc->restored_tokens);
        PROM(f, "counter", "moonshine_prefix_cache_saves_total", "snapshots saved (new entries)", "%llu", (ull)pc->saves);
        PROM(f, "counter", "moonshine_prefix_cache_checkpoints_total", "of which prefill checkpoints", "%llu", (ull)m.eng.checkpoints);
        fprintf(f, "# HELP moonshine_prefix_cache_evictions_total snapshots evicted by the LRU limits, by tier\n"
                   "# TYPE moonshine_prefix_cache_evictions_total counter\n"
                   "moonshine_prefix_cache_evictions_total{tier=\"ram\"} %llu\nmoonshine_prefix_cache_evictions_total{tier=\"disk\"} %llu\n",
                (ull)pc->evicted_ram, (ull)pc->evicted_disk);
        PROM(f, "counter", "moonshine_prefix_cache_disk_writes_total", "state files written", "%llu", (ull)pc->writes);
        PROM(f, "counter", "moonshine_prefix_cache_disk_write_drops_total", "writes dropped (queue full)", "%llu", (ull)pc->write_drops);
        PROM(f, "counter", "moonshine_prefix_cache_disk_write_errors_total", "writes that failed", "%llu", (ull)pc->write_errors);
        PROM(f, "counter", "moonshine_prefix_cache_disk_removed_total", "files removed as corrupt or foreign", "%llu", (ull)pc->removed);
        PROM(f, "gauge", "moonshine_prefix_cache_disk_queue", "writes waiting for the writer thread", "%d", pc->queued);
    }
    PROM(f, "gauge", "moonshine_uptime_seconds", "seconds since the server started", "%.3f", now_s() - s->t_start);
    fclose(f);
    enum MHD_Result rc = ms_srv_send_body(s, c, cn, 200, buf ? buf : "", len, "text/plain; version=0.0.4; charset=utf-8", NULL);
    free(buf);
    return rc;
}

/* GET /slots: each slot's state, tokens and request age (the worker's view after its last step). */
enum MHD_Result ms_srv_handle_slots(ms_server *s, struct MHD_Connection *c, conn *cn) {
    cJSON *o = cJSON_CreateObject();
    double t = now_s();
    pthread_mutex_lock(&s->mu);
    cJSON_AddNumberToObject(o, "n_slots", s->n_slots);
    cJSON_AddNumberToObject(o, "busy", s->running);
    cJSON_AddNumberToObject(o, "queued", s->queued - s->running);
    cJSON_AddNumberToObject(o, "max_queue", s->o.max_queue > 0 ? s->o.max_queue : 64);
    cJSON_AddStringToObject(o, "prefix_reuse", s->o.reuse == MS_SERVER_REUSE_SNAPSHOTS ? "shared snapshots"
                                               : s->o.reuse == MS_SERVER_REUSE_ROLLBACK ? "rollback, shared across slots" : "none");
    cJSON *arr = cJSON_AddArrayToObject(o, "slots");
    for (int i = 0; i < s->n_slots; i++) {
        const slot_view *v = &s->view[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", i);
        cJSON_AddStringToObject(e, "state", ms_sched_slot_state_name(v->info.state));
        cJSON_AddNumberToObject(e, "n_ctx_tokens", v->info.history);
        if (v->info.state != MS_SLOT_FREE) {
            cJSON_AddNumberToObject(e, "prompt_tokens", v->info.prompt_tokens);
            cJSON_AddNumberToObject(e, "cached_tokens", v->info.cached_tokens);
            cJSON_AddNumberToObject(e, "prompt_tokens_evaluated",
                                    v->info.state == MS_SLOT_PREFILL ? v->info.history : v->info.prompt_tokens);
            cJSON_AddNumberToObject(e, "completion_tokens", v->info.completion_tokens);
            cJSON_AddBoolToObject(e, "stream", v->stream);
            cJSON_AddNumberToObject(e, "age_s", v->t_arrive > 0 ? t - v->t_arrive : 0);
            if (v->deadline_s > 0) cJSON_AddNumberToObject(e, "deadline_s", v->deadline_s);
        }
        cJSON_AddItemToArray(arr, e);
    }
    pthread_mutex_unlock(&s->mu);
    return ms_srv_send_json(s, c, cn, 200, o);
}
