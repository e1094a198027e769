/* Expert cache policy: bookkeeping invariants, and LFU-with-decay against plain
 * LRU on synthetic Zipf-like routing traces (the comparison is printed). */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "io/expert_cache.h"
#include "io/expert_trace.h"
#include "test.h"

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * (1.0 / 9007199254740992.0);
}

/* T tokens x L layers x k distinct experts of E. Per layer a fixed Zipf(s) popularity
 * over a random permutation of experts, drifting (two ranks swap every `drift`
 * tokens), and with probability p_repeat an expert of the previous token is reused. */
static int *make_trace(int T, int L, int E, int k, double s, double p_repeat, int drift) {
    int *tr = malloc(sizeof(int) * (size_t)T * L * k);
    double *cdf = malloc(sizeof(double) * E);
    int *perm = malloc(sizeof(int) * (size_t)L * E);
    double z = 0;
    for (int i = 0; i < E; i++) z += pow(i + 1, -s);
    double acc = 0;
    for (int i = 0; i < E; i++) cdf[i] = (acc += pow(i + 1, -s) / z);
    for (int l = 0; l < L; l++) {
        int *p = perm + l * E;
        for (int i = 0; i < E; i++) p[i] = i;
        for (int i = E - 1; i > 0; i--) {
            int j = (int)(urand() * (i + 1));
            int t = p[i]; p[i] = p[j]; p[j] = t;
        }
    }
    for (int t = 0; t < T; t++)
        for (int l = 0; l < L; l++) {
            int *p = perm + l * E;
            if (drift && t % drift == 0) {
                int a = (int)(urand() * E), b = (int)(urand() * E);
                int x = p[a]; p[a] = p[b]; p[b] = x;
            }
            int *ids = tr + ((size_t)t * L + l) * k;
            for (int j = 0; j < k; j++) {
                int e, dup;
                do {
                    if (t > 0 && urand() < p_repeat) e = tr[((size_t)(t - 1) * L + l) * k + (int)(urand() * k)];
                    else {
                        double u = urand();
                        int lo = 0, hi = E - 1;
                        while (lo < hi) { int m = (lo + hi) / 2; if (cdf[m] < u) lo = m + 1; else hi = m; }
                        e = p[lo];
                    }
                    dup = 0;
                    for (int q = 0; q < j; q++) dup |= ids[q] == e;
                } while (dup);
                ids[j] = e;
            }
        }
    free(cdf);
    free(perm);
    return tr;
}

static double hit_rate(ms_cache_policy pol, const int *tr, int T, int L, int E, int k, int slots) {
    ms_ecache c;
    ms_err e = {0};
    if (ms_ecache_init(&c, pol, slots, L, E, 64, &e)) return -1;
    uint64_t h = ms_ecache_replay(&c, tr, T, k);
    ms_ecache_free(&c);
    return (double)h / ((double)T * L * k);
}

TEST(policy_beats_lru_on_zipf_traces) {
    const int T = 600, L = 8, E = 64, k = 6;
    struct { double s, rep; int drift; } cases[] = {{0.8, 0.0, 0}, {1.0, 0.2, 50}, {1.2, 0.3, 20}, {0.6, 0.1, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        int *tr = make_trace(T, L, E, k, cases[ci].s, cases[ci].rep, cases[ci].drift);
        for (int frac = 1; frac <= 3; frac++) { /* cache 1/8, 2/8, 3/8 of all experts */
            int slots = L * E * frac / 8;
            double lru = hit_rate(MS_CACHE_LRU, tr, T, L, E, k, slots);
            double lfu = hit_rate(MS_CACHE_LFU_DECAY, tr, T, L, E, k, slots);
            printf("zipf s=%.1f repeat=%.1f drift=%d slots=%d/%d: hit rate lru %.3f lfu-decay %.3f\n", cases[ci].s,
                   cases[ci].rep, cases[ci].drift, slots, L * E, lru, lfu);
            CHECK_MSG(lfu >= lru, "lfu-decay %.3f < lru %.3f", lfu, lru);
        }
        free(tr);
    }
}

/* a miss, made ready at once (as the streaming source does when the read completes) */
static int load_ready(ms_ecache *c, int li, int e) {
    int s = -1, r = ms_ecache_request(c, li, e, &s);
    if (r >= 0) c->slots[s].state = MS_SLOT_READY;
    return r < 0 ? -1 : s;
}

TEST(pins_and_demand_victims) {
    ms_ecache c;
    ms_err e = {0};
    CHECK(ms_ecache_init(&c, MS_CACHE_LFU_DECAY, 2, 1, 8, 64, &e) == 0);
    ms_ecache_step(&c, 0);
    int s0, s1 = -1, r0 = ms_ecache_request(&c, 0, 3, &s0);
    CHECK(r0 == 0 && c.slots[s0].state == MS_SLOT_LOADING);
    CHECK(ms_ecache_request(&c, 0, 4, &s1) == 0 && s1 != s0); /* the other, empty slot */
    int s2 = -1;
    CHECK(ms_ecache_request(&c, 0, 5, &s2) == -1); /* both loading: nothing evictable, nothing counted */
    CHECK(c.st.requests == 2 && c.st.misses == 2);
    c.slots[s0].state = c.slots[s1].state = MS_SLOT_READY;
    for (int i = 0; i < 4; i++) CHECK(ms_ecache_request(&c, 0, 3, &s2) == 1 && s2 == s0);
    c.slots[s1].pins = 1;
    for (int t = 0; t < MS_ECACHE_RECENT; t++) ms_ecache_step(&c, 0);
    /* s1 pinned: the victim is s0 although it is hotter */
    CHECK(ms_ecache_victim(&c, 0, 5, 0) == s0);
    /* a prefetch less likely to be used than its victim (measured regret) is refused */
    c.precision = 0.2f;
    CHECK(ms_ecache_prefetch(&c, 0, 5) == -1 && c.st.prefetch_refused == 1);
    c.slots[s1].pins = 0;
    CHECK(ms_ecache_victim(&c, 0, 5, 0) == s1); /* the colder one */
    ms_ecache_drop(&c, s0);
    CHECK(ms_ecache_lookup(&c, 0, 3) == -1 && ms_ecache_victim(&c, 0, 5, 1) == s0);
    CHECK(c.st.hits == 4 && c.st.requests == 6);
    ms_ecache_free(&c);
}

TEST(prefetch_protected_until_its_step_then_stale_first) {
    for (int pol = 0; pol < 2; pol++) {
        ms_ecache c;
        ms_err e = {0};
        CHECK(ms_ecache_init(&c, pol ? MS_CACHE_LRU : MS_CACHE_LFU_DECAY, 4, 2, 8, 64, &e) == 0);
        ms_ecache_step(&c, 0);
        for (int x = 0; x < 2; x++) CHECK(load_ready(&c, 0, x) >= 0);
        /* lookahead for layer 1: two prefetches into the two empty slots */
        int p1 = ms_ecache_prefetch(&c, 1, 6), p2 = ms_ecache_prefetch(&c, 1, 7);
        CHECK(p1 >= 0 && p2 >= 0 && p1 != p2 && c.st.prefetch_issued == 2);
        c.slots[p1].state = c.slots[p2].state = MS_SLOT_READY;
        CHECK(ms_ecache_prefetch(&c, 1, 6) == -1); /* already cached */
        /* the lookahead's own third prefetch and a demand miss of layer 0 must not evict them */
        int v = ms_ecache_victim(&c, 0, 2, 0);
        CHECK(v != p1 && v != p2 && v >= 0);
        /* layer 1's step: 6 was right, 7 was not (requested: 5) */
        ms_ecache_step(&c, 1);
        int s;
        CHECK(ms_ecache_request(&c, 1, 6, &s) == 1 && s == p1 && c.st.prefetch_used == 1);
        float prec_before = c.precision;
        ms_ecache_step(&c, 1); /* 7's step has passed: stale, precision falls */
        CHECK(c.precision < prec_before);
        if (!pol) { /* lfu-decay: the stale prefetch is the first victim */
            CHECK(ms_ecache_victim(&c, 0, 3, 0) == p2);
            CHECK(load_ready(&c, 0, 3) == p2 && c.st.prefetch_wasted == 1);
        }
        ms_ecache_free(&c);
    }
}

TEST(prefetch_admission_weighs_precision_against_measured_regret) {
    ms_ecache c;
    ms_err e = {0};
    CHECK(ms_ecache_init(&c, MS_CACHE_LFU_DECAY, 2, 2, 8, 64, &e) == 0);
    ms_ecache_step(&c, 0);
    int s0 = load_ready(&c, 0, 1), s1 = load_ready(&c, 0, 2);
    for (int t = 0; t < MS_ECACHE_RECENT; t++) ms_ecache_step(&c, 0);
    /* victims of class 1 (cold) came back 8 times in 10 displacements: a 0.5 guess is refused */
    c.displaced[1] = 10, c.regret[1] = 8;
    c.precision = 0.5f;
    CHECK(ms_ecache_victim(&c, 1, 3, 1) == -1 && ms_ecache_victim(&c, 1, 3, 0) >= 0);
    c.precision = 0.9f; /* a 0.9 guess is worth it */
    int p = ms_ecache_prefetch(&c, 1, 3);
    CHECK(p == s0 || p == s1);
    c.slots[p].state = MS_SLOT_READY;
    /* the displaced expert is asked for right away: that counts as a regret of its class */
    int victim_e = p == s0 ? 1 : 2;
    float reg = c.regret[1], dis = c.displaced[1];
    CHECK(dis < 10.0f * 0.99f + 1.01f && dis > 10.0f * 0.99f + 0.99f);
    int s;
    CHECK(ms_ecache_request(&c, 0, victim_e, &s) == 0);
    CHECK(c.regret[1] > reg + 0.99f);
    ms_ecache_free(&c);
    /* refusals are still tried every 16th time, so a class's regret keeps being measured */
    CHECK(ms_ecache_init(&c, MS_CACHE_LFU_DECAY, 40, 2, 64, 64, &e) == 0);
    ms_ecache_step(&c, 0);
    for (int x = 0; x < 40; x++) CHECK(load_ready(&c, 0, x) >= 0);
    for (int t = 0; t < MS_ECACHE_RECENT; t++) ms_ecache_step(&c, 0);
    c.precision = 0.0f;
    int admitted = 0;
    for (int i = 0; i < 32; i++) admitted += ms_ecache_prefetch(&c, 1, i) >= 0;
    CHECK_MSG(admitted == 2, "%d", admitted);
    ms_ecache_free(&c);
}

TEST(demand_read_may_take_a_protected_prefetch_when_nothing_else_is_free) {
    ms_ecache c;
    ms_err e = {0};
    CHECK(ms_ecache_init(&c, MS_CACHE_LFU_DECAY, 2, 2, 8, 64, &e) == 0);
    ms_ecache_step(&c, 0);
    int a = load_ready(&c, 0, 1);
    c.slots[a].pins = 1;
    int p = ms_ecache_prefetch(&c, 1, 5);
    CHECK(p >= 0 && p != a);
    c.slots[p].state = MS_SLOT_READY;
    int s;
    CHECK(ms_ecache_request(&c, 0, 2, &s) == 0 && s == p && c.st.prefetch_wasted == 1);
    ms_ecache_free(&c);
}

static const char *write_trace(const char *name, const char *text) {
    static char path[256];
    mkdir("build/tmp", 0755);
    snprintf(path, sizeof path, "build/tmp/%s", name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

TEST(trace_replay_counts_and_errors) {
    const char *ok = "moonshine-expert-trace 1\nlayers 2 experts 4\n"
                     "a 0 2 0 1\nr 0\np 1 2 2 3\na 1 2 2 1\nr 1\na 0 1 0\nr 0\n";
    const char *path = write_trace("trace_ok.trace", ok);
    for (int pol = 0; pol < 2; pol++)
        for (int nopf = 0; nopf < 2; nopf++) {
            ms_trace_replay_opts o = {.policy = pol ? MS_CACHE_LRU : MS_CACHE_LFU_DECAY, .n_slots = 4, .no_prefetch = nopf};
            ms_trace_replay_result r;
            ms_err e = {0};
            CHECK_MSG(ms_expert_trace_replay(path, &o, &r, &e) == 0, "%s", e.msg);
            CHECK(r.n_layers == 2 && r.n_experts == 4 && r.acquires == 3 && r.st.requests == 5);
            /* with prefetch: layer 1's expert 2 hits, and expert 1 of layer 1 evicts layer 0's expert 0
             * (oldest; the unused prefetch of 3 is protected in its step); without, 4 slots keep all four */
            CHECK(r.st.hits == 1 && r.st.prefetch_issued == (nopf ? 0u : 2u));
            CHECK(r.st.prefetch_used == (nopf ? 0u : 1u) && r.st.misses + r.st.prefetch_issued == (nopf ? 4u : 6u));
            o.skip_acquires = 2; /* only the last acquire */
            CHECK(ms_expert_trace_replay(path, &o, &r, &e) == 0 && r.st.requests == 1);
        }
    struct { const char *text, *want; } bad[] = {
        {"moonshine-expert-trace 2\n", "line 1"},
        {"moonshine-expert-trace 1\nlayers 0 experts 4\n", "line 2"},
        {"moonshine-expert-trace 1\nlayers 2 experts 4\nx 0\n", "line 3"},
        {"moonshine-expert-trace 1\nlayers 2 experts 4\na 2 1 0\n", "line 3"},
        {"moonshine-expert-trace 1\nlayers 2 experts 4\nr 0\na 0 2 0 4\n", "line 4"},
        {"moonshine-expert-trace 1\nlayers 2 experts 4\na 0 3 0 1\n", "line 3"},
        {"moonshine-expert-trace 1\nlayers 2 experts 4\na 0 2 0 1 2\n", "line 3"},
        {"moonshine-expert-trace 1\nlayers 2 experts 4\na 0 3 0 1 2\na 1 2 0 1\n", "pinned"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *bp = write_trace("trace_bad.trace", bad[i].text);
        ms_trace_replay_opts o = {.policy = MS_CACHE_LFU_DECAY, .n_slots = 4};
        ms_trace_replay_result r;
        ms_err e = {0};
        CHECK_MSG(ms_expert_trace_replay(bp, &o, &r, &e) == MS_ERR_FORMAT && strstr(e.msg, bad[i].want),
                  "case %zu: %s", i, e.msg);
    }
    ms_trace_replay_opts o = {.policy = MS_CACHE_LFU_DECAY, .n_slots = 4};
    ms_trace_replay_result r;
    ms_err e = {0};
    CHECK(ms_expert_trace_replay("build/tmp/no_such.trace", &o, &r, &e) == MS_ERR_IO);
}

static ms_ecache_stats replay_stats(const char *path, ms_cache_policy pol, int slots, int no_pf, int skip) {
    ms_trace_replay_opts o = {.policy = pol, .n_slots = slots, .no_prefetch = no_pf, .skip_acquires = skip};
    ms_trace_replay_result r;
    ms_err e = {0};
    if (ms_expert_trace_replay(path, &o, &r, &e)) {
        CHECK_MSG(0, "%s", e.msg);
        memset(&r, 0, sizeof r);
    }
    return r.st;
}

static double hr(const ms_ecache_stats *s) { return s->requests ? (double)s->hits / (double)s->requests : 0; }

/* The default policy against LRU on two recorded decode traces (tests/data/expert-traces):
 * better than plain LRU (no prefetch) on both; against LRU with the same lookahead prefetch,
 * far better where routing is skewed (LRU admits every guess and evicts the hot set) and
 * within noise where routing is uniform (no policy can rank experts there). */
TEST(policy_against_lru_on_recorded_traces) {
    struct { const char *path; int slots, skip; int skewed; } tr[] = {
        {"tests/data/expert-traces/kimi_linear_48b_16l_c605.trace", 605, 15, 0},
        {"tests/data/expert-traces/qwen3_30b_3l_c28.trace", 28, 6, 1},
    };
    for (int i = 0; i < 2; i++) {
        ms_ecache_stats lru0 = replay_stats(tr[i].path, MS_CACHE_LRU, tr[i].slots, 1, tr[i].skip);
        ms_ecache_stats lru = replay_stats(tr[i].path, MS_CACHE_LRU, tr[i].slots, 0, tr[i].skip);
        ms_ecache_stats lfu = replay_stats(tr[i].path, MS_CACHE_LFU_DECAY, tr[i].slots, 0, tr[i].skip);
        printf("%s: hit rate plain lru %.4f, lru + lookahead %.4f (loads %llu, precision %.3f), lfu-decay %.4f "
               "(loads %llu, precision %.3f)\n",
               tr[i].path, hr(&lru0), hr(&lru), (unsigned long long)(lru.misses + lru.prefetch_issued),
               lru.prefetch_issued ? (double)lru.prefetch_used / lru.prefetch_issued : 0, hr(&lfu),
               (unsigned long long)(lfu.misses + lfu.prefetch_issued),
               lfu.prefetch_issued ? (double)lfu.prefetch_used / lfu.prefetch_issued : 0);
        CHECK(lfu.requests == lru.requests && lfu.requests > 0);
        CHECK_MSG(hr(&lfu) > hr(&lru0), "%s: lfu-decay %.4f vs plain lru %.4f", tr[i].path, hr(&lfu), hr(&lru0));
        CHECK(lfu.misses + lfu.prefetch_issued <= lru.misses + lru.prefetch_issued); /* never reads more */
        if (tr[i].skewed) CHECK(hr(&lfu) > 2 * hr(&lru));
        else CHECK_MSG(hr(&lfu) > 4 * hr(&lru0) && hr(&lfu) >= hr(&lru) - 0.01, "%.4f vs %.4f", hr(&lfu), hr(&lru));
    }
}

TEST_MAIN()
