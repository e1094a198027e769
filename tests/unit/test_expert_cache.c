/* Expert cache policy: bookkeeping invariants, and LFU-with-decay against plain
 * LRU on synthetic Zipf-like routing traces (the comparison is printed). */
#include <math.h>
#include <stdint.h>

#include "io/expert_cache.h"
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

TEST(pins_and_prefetch_admission) {
    ms_ecache c;
    ms_err e = {0};
    CHECK(ms_ecache_init(&c, MS_CACHE_LFU_DECAY, 2, 1, 8, 64, &e) == 0);
    ms_ecache_step(&c, 0);
    int s0 = ms_ecache_victim(&c, 0, 3, 0);
    ms_ecache_assign(&c, s0, 0, 3);
    CHECK(ms_ecache_victim(&c, 0, 4, 0) != s0); /* the other, empty slot */
    int s1 = ms_ecache_victim(&c, 0, 4, 0);
    ms_ecache_assign(&c, s1, 0, 4);
    /* both loading: nothing evictable */
    CHECK(ms_ecache_victim(&c, 0, 5, 0) == -1);
    c.slots[s0].state = c.slots[s1].state = MS_SLOT_READY;
    for (int i = 0; i < 5; i++) ms_ecache_touch(&c, s0);
    ms_ecache_touch(&c, s1);
    c.slots[s1].pins = 1;
    /* s1 pinned: the victim is s0 even though it is hotter */
    CHECK(ms_ecache_victim(&c, 0, 5, 0) == s0);
    /* a cold prefetch does not push out the hot s0 */
    CHECK(ms_ecache_victim(&c, 0, 5, 1) == -1);
    c.slots[s1].pins = 0;
    CHECK(ms_ecache_lookup(&c, 0, 3) == s0 && ms_ecache_lookup(&c, 0, 5) == -1);
    ms_ecache_drop(&c, s0);
    CHECK(ms_ecache_lookup(&c, 0, 3) == -1 && ms_ecache_victim(&c, 0, 5, 1) == s0);
    ms_ecache_free(&c);
}

TEST_MAIN()
