#include "io/expert_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *ms_cache_policy_name(ms_cache_policy p) { return p == MS_CACHE_LRU ? "lru" : "lfu-decay"; }

int ms_cache_policy_parse(const char *s, ms_cache_policy *out, ms_err *err) {
    if (s && !strcmp(s, "lru")) *out = MS_CACHE_LRU;
    else if (s && (!strcmp(s, "lfu-decay") || !strcmp(s, "lfu"))) *out = MS_CACHE_LFU_DECAY;
    else return ms_fail(err, MS_ERR_ARG, "unknown cache policy \"%.40s\" (lru or lfu-decay)", s ? s : "");
    return MS_OK;
}

int ms_ecache_init(ms_ecache *c, ms_cache_policy policy, int n_slots, int n_layers, int n_experts, double half_life,
                   ms_err *err) {
    memset(c, 0, sizeof *c);
    if (n_slots < 1 || n_layers < 1 || n_experts < 1 || (int64_t)n_layers * n_experts > (1 << 28))
        return ms_fail(err, MS_ERR_ARG, "expert cache: %d slots, %d layers, %d experts", n_slots, n_layers, n_experts);
    if (!(half_life > 0)) half_life = 64;
    size_t nk = (size_t)n_layers * n_experts;
    c->policy = policy;
    c->n_slots = n_slots;
    c->n_layers = n_layers;
    c->n_experts = n_experts;
    c->decay = (float)exp2(-1.0 / half_life);
    c->slots = calloc((size_t)n_slots, sizeof *c->slots);
    c->slot_of = malloc(nk * sizeof *c->slot_of);
    c->score = calloc(nk, sizeof *c->score);
    c->score_t = calloc(nk, sizeof *c->score_t);
    c->layer_t = calloc((size_t)n_layers, sizeof *c->layer_t);
    if (!c->slots || !c->slot_of || !c->score || !c->score_t || !c->layer_t) {
        ms_ecache_free(c);
        return ms_fail(err, MS_ERR_NOMEM, "expert cache: out of memory for %d slots", n_slots);
    }
    for (size_t i = 0; i < nk; i++) c->slot_of[i] = -1;
    for (int s = 0; s < n_slots; s++) c->slots[s].key = -1;
    return MS_OK;
}

void ms_ecache_free(ms_ecache *c) {
    free(c->slots);
    free(c->slot_of);
    free(c->score);
    free(c->score_t);
    free(c->layer_t);
    memset(c, 0, sizeof *c);
}

void ms_ecache_step(ms_ecache *c, int li) { c->layer_t[li]++; }

static float cur_score(const ms_ecache *c, int key) {
    int li = key / c->n_experts;
    uint32_t dt = c->layer_t[li] - c->score_t[key];
    float s = c->score[key];
    if (dt == 0 || s == 0) return s;
    return s * powf(c->decay, (float)dt);
}

void ms_ecache_touch(ms_ecache *c, int slot) {
    ms_ecache_slot *s = &c->slots[slot];
    s->last_use = ++c->tick;
    s->prefetched = 0;
    int key = s->key;
    s->last_step = c->layer_t[key / c->n_experts];
    c->score[key] = cur_score(c, key) + 1.0f;
    c->score_t[key] = c->layer_t[key / c->n_experts];
}

int ms_ecache_victim(const ms_ecache *c, int li, int e, int for_prefetch) {
    int best = -1, best_recent = 1;
    float best_s = 0;
    uint64_t best_t = 0;
    for (int i = 0; i < c->n_slots; i++) {
        const ms_ecache_slot *s = &c->slots[i];
        if (s->pins > 0) continue;
        if (s->key < 0) return i;
        if (s->state != MS_SLOT_READY) continue;
        if (c->policy == MS_CACHE_LRU) {
            if (best < 0 || s->last_use < best_t) { best = i; best_t = s->last_use; }
        } else {
            float sc = cur_score(c, s->key);
            /* an unused prefetched slot counts as never used */
            if (s->prefetched) sc = 0;
            int recent = !s->prefetched && c->layer_t[s->key / c->n_experts] - s->last_step < MS_ECACHE_RECENT;
            if (best < 0 || recent < best_recent ||
                (recent == best_recent && (sc < best_s || (sc == best_s && s->last_use < best_t)))) {
                best = i;
                best_recent = recent;
                best_s = sc;
                best_t = s->last_use;
            }
        }
    }
    if (best >= 0 && for_prefetch && c->policy == MS_CACHE_LFU_DECAY) {
        float cand = cur_score(c, li * c->n_experts + e) + 2.0f * c->prefetch_bonus;
        if (best_s > cand) return -1;
    }
    return best;
}

void ms_ecache_assign(ms_ecache *c, int slot, int li, int e) {
    ms_ecache_slot *s = &c->slots[slot];
    if (s->key >= 0) c->slot_of[s->key] = -1;
    s->key = li * c->n_experts + e;
    s->state = MS_SLOT_LOADING;
    s->prefetched = 0;
    s->last_use = ++c->tick;
    c->slot_of[s->key] = slot;
}

void ms_ecache_drop(ms_ecache *c, int slot) {
    ms_ecache_slot *s = &c->slots[slot];
    if (s->key >= 0) c->slot_of[s->key] = -1;
    s->key = -1;
    s->state = MS_SLOT_EMPTY;
    s->prefetched = 0;
}

uint64_t ms_ecache_replay(ms_ecache *c, const int *trace, int T, int k) {
    uint64_t hits = 0;
    int pinned[256];
    for (int t = 0; t < T; t++)
        for (int l = 0; l < c->n_layers; l++) {
            const int *ids = trace + ((size_t)t * c->n_layers + l) * k;
            ms_ecache_step(c, l);
            int np = 0;
            for (int j = 0; j < k; j++) {
                int s = ms_ecache_lookup(c, l, ids[j]);
                if (s >= 0) hits++;
                else {
                    s = ms_ecache_victim(c, l, ids[j], 0);
                    if (s < 0) continue; /* every slot pinned: not cached this time */
                    ms_ecache_assign(c, s, l, ids[j]);
                    c->slots[s].state = MS_SLOT_READY;
                }
                ms_ecache_touch(c, s);
                c->slots[s].pins++;
                if (np < 256) pinned[np++] = s;
            }
            for (int j = 0; j < np; j++) c->slots[pinned[j]].pins--;
        }
    return hits;
}
