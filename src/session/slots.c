/* slots.c — the slot scheduler (session/slots.h). */
#include "session/slots.h"

#include <stdlib.h>
#include <string.h>

#include "engine/state.h"

typedef enum { SLOT_FREE, SLOT_PREFILL, SLOT_DECODE, SLOT_DONE } slot_state;

typedef struct {
    ms_engine *e;
    ms_generator *g;
    ms_gen_run *run;
    slot_state state;
    int32_t *prompt; /* [max_ctx] the request's prompt (copied) */
    int32_t next;    /* DECODE: the id to forward at the next decode step */
    int n_prompt;
    int cancelled, rc;
    ms_err err;
    ms_sched_done_fn done;
    void *user;
} slot;

struct ms_sched {
    int n, chunk, rr;
    int64_t vocab;
    slot *s;
    ms_engine **batch;
    int32_t *tok;
    int *who;
    float *logits; /* [n, vocab] */
    ms_sched_stats st;
    ms_gen_snapshots snaps; /* the generators' hook (zeros: none) */
};

int ms_sched_new(ms_model *m, const ms_sched_opts *o, ms_sched **out, ms_err *err) {
    *out = NULL;
    if (!o || o->n_slots < 1 || o->n_slots > 4096) return ms_fail(err, MS_ERR_ARG, "slots: 1..4096 slots, got %d", o ? o->n_slots : 0);
    ms_sched *s = calloc(1, sizeof *s);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "slots: out of memory");
    s->n = o->n_slots;
    s->chunk = o->chunk > 0 ? o->chunk : 64;
    s->vocab = m->cfg.vocab;
    if (o->snaps) s->snaps = *o->snaps;
    s->s = calloc((size_t)s->n, sizeof *s->s);
    s->batch = calloc((size_t)s->n, sizeof *s->batch);
    s->tok = calloc((size_t)s->n, sizeof *s->tok);
    s->who = calloc((size_t)s->n, sizeof *s->who);
    s->logits = malloc(sizeof(float) * (size_t)s->n * (size_t)s->vocab);
    if (!s->s || !s->batch || !s->tok || !s->who || !s->logits) {
        ms_sched_free(s);
        return ms_fail(err, MS_ERR_NOMEM, "slots: out of memory for %d slots", o->n_slots);
    }
    ms_engine_opts eo = o->engine;
    int need = s->chunk > s->n ? s->chunk : s->n;
    if (eo.max_batch < need) eo.max_batch = need;
    for (int i = 0; i < s->n; i++) {
        slot *sl = &s->s[i];
        eo.weights_from = i ? s->s[0].e : NULL; /* one placement of the weights for every slot */
        int rc = ms_engine_create(m, &eo, &sl->e, err);
        if (!rc) rc = ms_generator_new(sl->e, o->tok, s->vocab, o->snaps, &sl->g, err);
        if (!rc && !(sl->prompt = malloc(sizeof(int32_t) * (size_t)ms_engine_max_ctx(sl->e))))
            rc = ms_fail(err, MS_ERR_NOMEM, "slots: out of memory");
        if (rc) {
            ms_wrap(err, "slot %d of %d", i, s->n);
            ms_sched_free(s);
            return rc;
        }
    }
    *out = s;
    return MS_OK;
}

/* End slot i's request: finish (flush) when it ended normally, then the done callback; the slot is free. */
static void slot_end(ms_sched *s, int i) {
    slot *sl = &s->s[i];
    ms_gen_result res;
    memset(&res, 0, sizeof res);
    int rc = sl->rc;
    ms_err e = sl->err;
    if (sl->cancelled && sl->state == SLOT_PREFILL && s->snaps.save && !ms_engine_can_truncate(sl->e)) {
        /* the prompt stopped mid-prefill: keep what was evaluated, so the same prompt resumes from it
         * (a model that rolls back keeps it in the slot's history anyway) */
        int nh;
        const int32_t *h = ms_generator_history(sl->g, &nh);
        ms_err se = {0};
        if (nh > 0 && nh == ms_engine_n_past(sl->e)) {
            if (s->snaps.save(s->snaps.user, sl->e, h, nh, &se) == MS_OK) s->st.kept_prefixes++;
        }
    }
    if (sl->run) {
        if (!rc) rc = ms_gen_run_finish(sl->run, &res, &e);
        else res = *ms_gen_run_result(sl->run);
        ms_gen_run_free(sl->run);
    }
    if (sl->cancelled && !sl->rc) res.finish = MS_FINISH_ABORT;
    sl->run = NULL;
    sl->state = SLOT_FREE;
    sl->cancelled = 0;
    sl->rc = 0;
    memset(&sl->err, 0, sizeof sl->err);
    if (sl->done) sl->done(sl->user, rc, &res, &e);
    sl->done = NULL;
    sl->user = NULL;
}

void ms_sched_free(ms_sched *s) {
    if (!s) return;
    for (int i = 0; s->s && i < s->n; i++) {
        if (s->s[i].state != SLOT_FREE) {
            s->s[i].cancelled = 1;
            slot_end(s, i);
        }
    }
    for (int i = s->s ? s->n - 1 : -1; i >= 0; i--) { /* backwards: slot 0's engine holds the shared weights */
        ms_generator_free(s->s[i].g);
        ms_engine_destroy(s->s[i].e);
        free(s->s[i].prompt);
    }
    free(s->s);
    free(s->batch);
    free(s->tok);
    free(s->who);
    free(s->logits);
    free(s);
}

/* Cross-slot prefix sharing for engines that roll back: when another slot (busy, so not the free
 * slot just chosen) holds a longer common prefix with the prompt than slot i's own history (mine
 * tokens), slot i takes a copy of that slot's state cut to the common prefix (snapshot, restore,
 * truncate: exact), so two clients with one long system prompt prefill it once. The state is the
 * one the same request would have reused served after the other one in a single slot. Between
 * steps only (the donor's engine is idle then). Any failure leaves slot i to prefill on its own. */
static void share_prefix(ms_sched *s, int i, const int32_t *prompt, int n, int mine) {
    slot *sl = &s->s[i];
    if (!ms_engine_can_truncate(sl->e)) return;
    int donor = -1, best = mine;
    for (int k = 0; k < s->n; k++) {
        if (k == i || s->s[k].state == SLOT_FREE) continue;
        int nh, c = 0;
        const int32_t *h = ms_generator_history(s->s[k].g, &nh);
        if (nh != ms_engine_n_past(s->s[k].e)) continue;
        while (c < nh && c < n - 1 && h[c] == prompt[c]) c++; /* the last prompt token is fed for its logits */
        if (c > best) best = c, donor = k;
    }
    if (donor < 0) return;
    ms_snapshot *snap = NULL;
    ms_err e = {0};
    if (ms_engine_snapshot(s->s[donor].e, &snap, &e) || ms_engine_restore(sl->e, snap, &e) ||
        ms_engine_truncate(sl->e, best, &e) || ms_generator_adopt(sl->g, prompt, best, &e)) {
        ms_generator_reset(sl->g);
    } else {
        s->st.shared_prefixes++;
        s->st.shared_tokens += (uint64_t)best;
    }
    ms_engine_snapshot_free(snap);
}

int ms_sched_submit(ms_sched *s, const int32_t *prompt, int n, const ms_gen_params *p, ms_gen_token_fn fn,
                    ms_sched_done_fn done, void *user, int *slot_out, ms_err *err) {
    /* the free slot whose history shares the longest prefix with the prompt (its state is reused) */
    int i = -1, best = -1;
    for (int k = 0; k < s->n; k++) {
        if (s->s[k].state != SLOT_FREE) continue;
        int nh, c = 0;
        const int32_t *h = ms_generator_history(s->s[k].g, &nh);
        while (c < nh && c < n && h[c] == prompt[c]) c++;
        if (c > best) best = c, i = k;
    }
    if (i < 0) return ms_fail(err, MS_ERR_LIMIT, "every one of the %d slots is busy", s->n);
    slot *sl = &s->s[i];
    if (n < 1) return ms_fail(err, MS_ERR_ARG, "prompt is empty");
    if (n > ms_engine_max_ctx(sl->e))
        return ms_fail(err, MS_ERR_LIMIT, "prompt of %d tokens does not fit the context of %d", n, ms_engine_max_ctx(sl->e));
    share_prefix(s, i, prompt, n, best);
    memcpy(sl->prompt, prompt, sizeof(int32_t) * (size_t)n);
    sl->n_prompt = n;
    int rc = ms_gen_run_new(sl->g, sl->prompt, n, p, fn, user, &sl->run, err);
    if (rc) return rc;
    sl->state = SLOT_PREFILL;
    sl->done = done;
    sl->user = user;
    sl->cancelled = 0;
    sl->rc = 0;
    if (slot_out) *slot_out = i;
    return MS_OK;
}

void ms_sched_cancel(ms_sched *s, int i) {
    if (i >= 0 && i < s->n && s->s[i].state != SLOT_FREE) s->s[i].cancelled = 1;
}

/* A slot's request failed: it ends at the next step with rc. */
static void slot_fail(slot *sl, int rc, const ms_err *e) {
    sl->rc = rc;
    if (e) sl->err = *e;
    sl->state = SLOT_DONE;
}

/* After its prompt or a forwarded token: sample; DECODE with the next id, or DONE. */
static void slot_next(slot *sl) {
    int done = 0;
    ms_err e = {0};
    int rc = ms_gen_run_next(sl->run, &sl->next, &done, &e);
    if (rc) slot_fail(sl, rc, &e);
    else sl->state = done ? SLOT_DONE : SLOT_DECODE;
}

int ms_sched_step(ms_sched *s, ms_err *err) {
    s->st.steps++;
    /* 1. leave: finished, failed or cancelled */
    for (int i = 0; i < s->n; i++) {
        slot *sl = &s->s[i];
        if (sl->state == SLOT_FREE) continue;
        if (sl->state == SLOT_DONE || sl->cancelled) slot_end(s, i);
    }
    /* 2. one prefill chunk, round robin over the prefilling slots */
    for (int j = 0; j < s->n; j++) {
        int i = (s->rr + j) % s->n;
        slot *sl = &s->s[i];
        if (sl->state != SLOT_PREFILL) continue;
        s->rr = (i + 1) % s->n;
        int left = 0;
        ms_err e = {0};
        uint64_t before = (uint64_t)ms_engine_n_past(sl->e);
        int rc = ms_gen_run_prefill(sl->run, s->chunk, &left, &e);
        s->st.prefill_chunks++;
        if (!rc) s->st.prefill_tokens += (uint64_t)ms_engine_n_past(sl->e) - before;
        if (rc) slot_fail(sl, rc, &e);
        else if (!left) slot_next(sl);
        break;
    }
    /* 3. one decode step of every decoding slot together */
    int k = 0;
    for (int i = 0; i < s->n; i++)
        if (s->s[i].state == SLOT_DECODE && !s->s[i].cancelled) {
            s->batch[k] = s->s[i].e;
            s->tok[k] = s->s[i].next;
            s->who[k++] = i;
        }
    int ret = MS_OK;
    if (k == 1 && ms_gen_run_greedy(s->s[s->who[0]].run)) { /* one greedy slot: the engine picks (no logits down) */
        slot *sl = &s->s[s->who[0]];
        ms_err e = {0};
        int rc = ms_generator_decode_greedy(sl->g, s->tok[0], &e);
        s->st.decode_steps++;
        s->st.decode_rows++;
        if (rc) {
            slot_fail(sl, rc, &e);
            if (err) *err = e;
            return rc < 0 ? rc : -rc;
        }
        slot_next(sl);
    } else if (k) {
        ms_err e = {0};
        int rc = ms_engine_decode_batch(s->batch, k, s->tok, s->logits, &e);
        s->st.decode_steps++;
        s->st.decode_rows += (uint64_t)k;
        for (int j = 0; j < k; j++) {
            slot *sl = &s->s[s->who[j]];
            if (rc) { /* the engines' states are undefined: forget them */
                ms_generator_reset(sl->g);
                slot_fail(sl, rc, &e);
                continue;
            }
            ms_err ae = {0};
            int arc = ms_generator_accept(sl->g, s->tok[j], s->logits + (size_t)j * (size_t)s->vocab, &ae);
            if (arc) slot_fail(sl, arc, &ae);
            else slot_next(sl);
        }
        if (rc) {
            if (err) *err = e;
            ret = rc < 0 ? rc : -rc;
        }
    }
    if (ret) return ret;
    return ms_sched_active(s);
}

int ms_sched_active(const ms_sched *s) {
    int a = 0;
    for (int i = 0; i < s->n; i++) a += s->s[i].state != SLOT_FREE;
    return a;
}
int ms_sched_free_slots(const ms_sched *s) { return s->n - ms_sched_active(s); }
int ms_sched_n_slots(const ms_sched *s) { return s->n; }
ms_generator *ms_sched_generator(ms_sched *s, int i) { return i >= 0 && i < s->n ? s->s[i].g : NULL; }
void ms_sched_get_stats(const ms_sched *s, ms_sched_stats *out) { *out = s->st; }

void ms_sched_slot_info(const ms_sched *s, int i, ms_sched_slot *out) {
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= s->n) return;
    const slot *sl = &s->s[i];
    static const ms_sched_slot_state k[] = {MS_SLOT_FREE, MS_SLOT_PREFILL, MS_SLOT_DECODE, MS_SLOT_DONE};
    out->state = k[sl->state];
    ms_generator_history(sl->g, &out->history);
    if (sl->run) {
        const ms_gen_result *r = ms_gen_run_result(sl->run);
        out->prompt_tokens = sl->n_prompt;
        out->cached_tokens = r->cached_tokens;
        out->completion_tokens = r->completion_tokens;
    }
}

const char *ms_sched_slot_state_name(ms_sched_slot_state st) {
    switch (st) {
    case MS_SLOT_FREE: return "idle";
    case MS_SLOT_PREFILL: return "prefill";
    case MS_SLOT_DECODE: return "decode";
    case MS_SLOT_DONE: return "ending";
    }
    return "?";
}
