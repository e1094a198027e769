#include "io/expert_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* prefetched states */
enum { PF_NONE = 0, PF_OUTSTANDING = 1, PF_STALE = 2 };

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
    c->precision = 0.5f; /* until prefetches have a record */
    c->slots = calloc((size_t)n_slots, sizeof *c->slots);
    c->slot_of = malloc(nk * sizeof *c->slot_of);
    c->score = calloc(nk, sizeof *c->score);
    c->score_t = calloc(nk, sizeof *c->score_t);
    c->layer_t = calloc((size_t)n_layers, sizeof *c->layer_t);
    c->ghost = calloc(nk, sizeof *c->ghost);
    c->ghost_cls = calloc(nk, 1);
    if (!c->slots || !c->slot_of || !c->score || !c->score_t || !c->layer_t || !c->ghost || !c->ghost_cls) {
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
    free(c->ghost);
    free(c->ghost_cls);
    memset(c, 0, sizeof *c);
}

static void precision_outcome(ms_ecache *c, int used) { c->precision = c->precision * 0.95f + (used ? 0.05f : 0.0f); }

void ms_ecache_step(ms_ecache *c, int li) {
    uint32_t t = ++c->layer_t[li];
    /* prefetches issued for this layer's previous step and not used there were wrong */
    for (int i = 0; i < c->n_slots; i++) {
        ms_ecache_slot *s = &c->slots[i];
        if (s->prefetched == PF_OUTSTANDING && s->key / c->n_experts == li && s->pf_step < t) {
            s->prefetched = PF_STALE;
            precision_outcome(c, 0);
        }
    }
    if (li == 0) { /* a token (or a prefill chunk): measure the slot turnover */
        float d = (float)(c->loads - c->loads_at_step0);
        c->loads_at_step0 = c->loads;
        c->loads_per_token = c->loads_per_token > 0 ? 0.9f * c->loads_per_token + 0.1f * d : d;
    }
}

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
    s->prefetched = PF_NONE;
    int key = s->key;
    s->last_step = c->layer_t[key / c->n_experts];
    c->score[key] = cur_score(c, key) + 1.0f;
    c->score_t[key] = c->layer_t[key / c->n_experts];
}

/* Steps a slot stays resident at the measured turnover (slots / loads per token), capped
 * at ~6 half-lives (beyond, a score says nothing). */
static float resident_steps(const ms_ecache *c) {
    float r = (float)c->n_slots / (c->loads_per_token > 1e-3f ? c->loads_per_token : 1e-3f);
    float horizon = 4.0f / (1.0f - c->decay);
    return r < 1 ? 1 : r > horizon ? horizon : r;
}

/* The policy's victim for loading (li, e), or -1; *cls receives its class:
 * -1 an empty slot, 0 a stale prefetch, 1 cold, 2 used in the layer's last steps
 * (LRU: 1 for every occupied slot). */
static int pick_victim(const ms_ecache *c, int for_demand, int *cls) {
    int best = -1, best_class = 3;
    float best_s = 0;
    uint64_t best_t = 0;
    *cls = -1;
    for (int i = 0; i < c->n_slots; i++) {
        const ms_ecache_slot *s = &c->slots[i];
        if (s->pins > 0) continue;
        if (s->key < 0) return i;
        if (s->state != MS_SLOT_READY || s->prefetched == PF_OUTSTANDING) continue; /* protected until its step */
        if (c->policy == MS_CACHE_LRU) {
            if (best < 0 || s->last_use < best_t) { best = i; best_t = s->last_use; best_class = 1; }
            continue;
        }
        int cls_i = s->prefetched == PF_STALE ? 0 : c->layer_t[s->key / c->n_experts] - s->last_step < MS_ECACHE_RECENT ? 2 : 1;
        float sc = cls_i == 0 ? 0.0f : cur_score(c, s->key);
        if (best < 0 || cls_i < best_class || (cls_i == best_class && (sc < best_s || (sc == best_s && s->last_use < best_t)))) {
            best = i;
            best_class = cls_i;
            best_s = sc;
            best_t = s->last_use;
        }
    }
    if (best < 0 && for_demand) /* only protected prefetches left: a demand read goes first */
        for (int i = 0; i < c->n_slots; i++) {
            const ms_ecache_slot *s = &c->slots[i];
            if (s->pins <= 0 && s->state == MS_SLOT_READY && (best < 0 || s->last_use < best_t)) {
                best = i;
                best_t = s->last_use;
                best_class = 0;
            }
        }
    *cls = best_class;
    return best;
}

/* Chance that a victim of class cls, pushed out by a prefetch, is asked for again while it
 * would have stayed: measured (ghost entries), starting from 1/2. */
static float regret_rate(const ms_ecache *c, int cls) { return (c->regret[cls] + 0.5f) / (c->displaced[cls] + 1.0f); }

/* LFU_DECAY prefetch admission over a victim of class cls (LRU admits every prefetch). */
static int admit_prefetch(const ms_ecache *c, int cls) {
    if (c->policy == MS_CACHE_LRU || cls <= 0) return 1;
    return c->precision >= regret_rate(c, cls);
}

int ms_ecache_victim(const ms_ecache *c, int li, int e, int for_prefetch) {
    (void)li, (void)e;
    int cls, v = pick_victim(c, !for_prefetch, &cls);
    if (v >= 0 && for_prefetch && !admit_prefetch(c, cls)) return -1;
    return v;
}

void ms_ecache_assign(ms_ecache *c, int slot, int li, int e) {
    ms_ecache_slot *s = &c->slots[slot];
    if (s->key >= 0) c->slot_of[s->key] = -1;
    s->key = li * c->n_experts + e;
    s->state = MS_SLOT_LOADING;
    s->prefetched = PF_NONE;
    s->last_use = ++c->tick;
    c->slot_of[s->key] = slot;
}

static void evict_account(ms_ecache *c, int slot) {
    ms_ecache_slot *s = &c->slots[slot];
    if (s->key < 0) return;
    c->st.evictions++;
    if (s->prefetched != PF_NONE) c->st.prefetch_wasted++;
}

int ms_ecache_request(ms_ecache *c, int li, int e, int *slot) {
    int s = ms_ecache_lookup(c, li, e);
    if (s >= 0) {
        c->st.requests++;
        c->st.hits++;
        if (c->slots[s].prefetched != PF_NONE) {
            c->st.prefetch_used++;
            if (c->slots[s].prefetched == PF_OUTSTANDING) precision_outcome(c, 1);
        }
        ms_ecache_touch(c, s);
        *slot = s;
        return 1;
    }
    int cls;
    s = pick_victim(c, 1, &cls);
    if (s < 0) return -1;
    c->st.requests++;
    c->st.misses++;
    int key = li * c->n_experts + e;
    if (c->ghost[key]) { /* a prefetch pushed this one out: was that while it would have stayed? */
        uint32_t gone = c->layer_t[li] - (c->ghost[key] - 1);
        if ((float)gone <= resident_steps(c)) c->regret[c->ghost_cls[key]] += 1.0f;
        c->ghost[key] = 0;
    }
    evict_account(c, s);
    ms_ecache_assign(c, s, li, e);
    ms_ecache_touch(c, s);
    c->loads++;
    *slot = s;
    return 0;
}

int ms_ecache_prefetch(ms_ecache *c, int li, int e) {
    if (ms_ecache_lookup(c, li, e) >= 0) return -1;
    int cls, s = pick_victim(c, 0, &cls);
    /* a refused class is still tried now and then, so its regret rate stays measured */
    if (s < 0 || (!admit_prefetch(c, cls) && ++c->explore % 16)) {
        c->st.prefetch_refused++;
        return -1;
    }
    if (cls > 0 && c->policy == MS_CACHE_LFU_DECAY) { /* remember whom this prefetch displaced */
        int vk = c->slots[s].key;
        c->ghost[vk] = c->layer_t[vk / c->n_experts] + 1;
        c->ghost_cls[vk] = (uint8_t)cls;
        c->displaced[cls] = c->displaced[cls] * 0.99f + 1.0f;
        c->regret[cls] *= 0.99f;
    }
    evict_account(c, s);
    ms_ecache_assign(c, s, li, e);
    c->slots[s].prefetched = PF_OUTSTANDING;
    c->slots[s].pf_step = c->layer_t[li] + 1;
    c->st.prefetch_issued++;
    c->loads++;
    return s;
}

void ms_ecache_drop(ms_ecache *c, int slot) {
    ms_ecache_slot *s = &c->slots[slot];
    if (s->key >= 0) c->slot_of[s->key] = -1;
    if (s->prefetched != PF_NONE) c->st.prefetch_wasted++;
    s->key = -1;
    s->state = MS_SLOT_EMPTY;
    s->prefetched = PF_NONE;
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
                int s, r = ms_ecache_request(c, l, ids[j], &s);
                if (r < 0) continue; /* every slot pinned: not cached this time */
                hits += r == 1;
                c->slots[s].state = MS_SLOT_READY;
                c->slots[s].pins++;
                if (np < 256) pinned[np++] = s;
            }
            for (int j = 0; j < np; j++) c->slots[pinned[j]].pins--;
        }
    return hits;
}
