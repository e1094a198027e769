/* test_placement.c — the multi-device placement (engine/placement.h) for N = 1..8 devices
 * over synthetic byte counts: the pipeline split against an exhaustive search of every
 * contiguous split, the expert shares, replication of the hottest, the ledger's sums, the
 * refusal naming the device and shortfall, and the device-list parser; and the input a real
 * fixture model gives against its own byte counts. */
#include "test.h"

#include "engine/engine.h"
#include "engine/placement.h"

/* The largest device load of the split with stage ends cuts[0..N) (cuts[N-1] = L), computed
 * from the input directly (the reference for the split's optimality). */
static double split_cost(const ms_place_input *in, int N, const int *ends, const uint64_t *fixed,
                         const uint64_t *budget) {
    double worst = 0;
    int b = 0;
    for (int d = 0; d < N; d++) {
        uint64_t t = fixed[d];
        for (int l = b; l < ends[d]; l++) {
            t += in->layer_static[l] + (in->layer_state ? in->layer_state[l] : 0);
            if (in->split == MS_EXPERTS_WITH_LAYER && in->expert_bytes) t += in->expert_bytes[l] * (uint64_t)in->n_experts;
        }
        double c = budget && budget[d] ? (double)t / (double)budget[d] : (double)t;
        if (c > worst) worst = c;
        b = ends[d];
    }
    return worst;
}

/* The best largest load over every split into N non-empty contiguous stages (L >= N), by enumeration. */
static double best_cost(const ms_place_input *in, int N, const uint64_t *fixed, const uint64_t *budget) {
    int L = in->n_layers, ends[MS_MAX_DEVICES];
    double best = -1;
    /* ends[0] < ends[1] < ... < ends[N-1] = L, ends[0] >= 1 */
    for (int d = 0; d < N - 1; d++) ends[d] = d + 1;
    ends[N - 1] = L;
    for (;;) {
        double c = split_cost(in, N, ends, fixed, budget);
        if (best < 0 || c < best) best = c;
        int d = N - 2;
        while (d >= 0 && ends[d] == L - (N - 1 - d)) d--;
        if (d < 0) break;
        ends[d]++;
        for (int k = d + 1; k < N - 1; k++) ends[k] = ends[k - 1] + 1;
    }
    return best;
}

typedef struct {
    uint64_t st[64], state[64], xb[64];
    ms_place_input in;
} synth_in;

/* A synthetic model of L layers and E experts with uneven layer sizes (seeded), a dense first layer. */
static void make_input(synth_in *s, int L, int E, uint64_t seed, ms_expert_split split) {
    memset(s, 0, sizeof *s);
    for (int l = 0; l < L; l++) {
        s->st[l] = (uint64_t)(1 + ms_test_xorshift(&seed) % 97) << 20;
        s->state[l] = (uint64_t)(ms_test_xorshift(&seed) % 13) << 18;
        s->xb[l] = l == 0 || !E ? 0 : (uint64_t)(3 + l % 3) << 20;
    }
    s->in = (ms_place_input){.n_layers = L, .n_experts = E, .layer_static = s->st, .layer_state = s->state,
                             .expert_bytes = s->xb, .embed_bytes = 40ull << 20, .head_bytes = 40ull << 20,
                             .workspace_bytes = 5ull << 20, .overhead_bytes = 64ull << 20, .split = split};
}

/* What each device holds whatever its layers (the reference's fixed part). */
static void fixed_of(const ms_place_input *in, const ms_placement *p, uint64_t *fixed) {
    for (int d = 0; d < p->n_dev; d++) {
        fixed[d] = in->workspace_bytes + in->overhead_bytes + (in->split == MS_EXPERTS_SHARDED ? p->dev[d].expert_bytes : 0);
        if (d == 0) fixed[d] += in->embed_bytes + in->state0_bytes;
        if (d == p->n_dev - 1 && !(in->head_tied && p->n_dev == 1)) fixed[d] += in->head_bytes;
    }
}

/* The invariants of any placement of in over N devices. */
static void check_placement(const ms_place_input *in, int N, const ms_placement *p, const uint64_t *budget) {
    int L = in->n_layers, E = in->n_experts;
    /* stages: contiguous, in device order, covering every layer, non-empty when L >= N */
    int at = 0;
    for (int d = 0; d < N; d++) {
        CHECK(p->dev[d].layer_begin == at);
        CHECK(p->dev[d].layer_end >= at);
        if (L >= N) CHECK(p->dev[d].layer_end > p->dev[d].layer_begin);
        for (int l = p->dev[d].layer_begin; l < p->dev[d].layer_end; l++) CHECK(p->layer_dev[l] == d);
        at = p->dev[d].layer_end;
    }
    CHECK(at == L);
    /* experts: one home each, held there; per layer each device floor or ceil of E / N homes
     * (SHARDED), or the layer's device (WITH_LAYER) */
    uint64_t expert_sum = 0, ref_expert_sum = 0;
    int homes[MS_MAX_DEVICES] = {0};
    for (int l = 0; l < L; l++) {
        int per[MS_MAX_DEVICES] = {0};
        for (int e = 0; e < E; e++) {
            int64_t k = (int64_t)l * E + e;
            if (!in->expert_bytes[l]) {
                CHECK(p->expert_home[k] == -1 && p->expert_devs[k] == 0);
                continue;
            }
            int h = p->expert_home[k];
            CHECK(h >= 0 && h < N);
            if (h < 0 || h >= N) continue;
            CHECK(p->expert_devs[k] & (1u << h));
            CHECK((p->expert_devs[k] >> N) == 0);
            per[h]++, homes[h]++;
            if (in->split == MS_EXPERTS_WITH_LAYER) CHECK(h == p->layer_dev[l] && p->expert_devs[k] == (1u << h));
            ref_expert_sum += in->expert_bytes[l] * (uint64_t)__builtin_popcount(p->expert_devs[k]);
        }
        if (in->expert_bytes[l] && in->split == MS_EXPERTS_SHARDED)
            for (int d = 0; d < N; d++) CHECK(per[d] == E / N || per[d] == E / N + 1);
    }
    if (in->split == MS_EXPERTS_SHARDED) { /* over all layers too: the rotation evens out the remainders */
        int mn = 1 << 30, mx = 0;
        for (int d = 0; d < N; d++) mn = homes[d] < mn ? homes[d] : mn, mx = homes[d] > mx ? homes[d] : mx;
        CHECK_MSG(mx - mn <= 1, "homes differ by %d", mx - mn);
    }
    /* the ledger adds up, device by device and in sum */
    uint64_t total = 0, ref_total = 0;
    for (int d = 0; d < N; d++) {
        const ms_dev_ledger *g = &p->dev[d];
        CHECK(g->total == g->static_bytes + g->expert_bytes + g->state_bytes + g->workspace_bytes + g->overhead_bytes);
        total += g->total;
        expert_sum += g->expert_bytes;
    }
    CHECK(total == p->total);
    CHECK(expert_sum == ref_expert_sum);
    for (int l = 0; l < L; l++) ref_total += in->layer_static[l] + in->layer_state[l];
    ref_total += in->embed_bytes + in->state0_bytes + (in->head_tied && N == 1 ? 0 : in->head_bytes) + ref_expert_sum +
                 (uint64_t)N * (in->workspace_bytes + in->overhead_bytes);
    CHECK_MSG(total == ref_total, "total %llu vs %llu", (unsigned long long)total, (unsigned long long)ref_total);
    /* the split is the best contiguous one (by enumeration) */
    if (L >= N) {
        uint64_t fixed[MS_MAX_DEVICES];
        fixed_of(in, p, fixed);
        int ends[MS_MAX_DEVICES];
        for (int d = 0; d < N; d++) ends[d] = p->dev[d].layer_end;
        double got = split_cost(in, N, ends, fixed, budget), best = best_cost(in, N, fixed, budget);
        CHECK_MSG(got <= best * (1 + 1e-12), "N=%d: largest load %g, best %g", N, got, best);
    }
}

TEST(split_and_shares_1_to_8_devices) {
    for (int N = 1; N <= 8; N++) {
        for (int trial = 0; trial < 3; trial++) {
            synth_in s;
            int L = 9 + trial * 3, E = trial == 1 ? 13 : 16; /* 13: a remainder on most N */
            make_input(&s, L, E, 0x9E3779B97F4A7C15ull + (uint64_t)(N * 7 + trial), MS_EXPERTS_SHARDED);
            ms_placement p;
            ms_err err = {0};
            CHECK_MSG(ms_placement_make(&s.in, N, NULL, &p, &err) == MS_OK, "%s", err.msg);
            check_placement(&s.in, N, &p, NULL);
            CHECK(ms_placement_check(&p, NULL, &err) == MS_OK); /* no budgets: nothing refused */
            ms_placement_free(&p);
            make_input(&s, L, E, 77 + (uint64_t)trial, MS_EXPERTS_WITH_LAYER);
            CHECK_MSG(ms_placement_make(&s.in, N, NULL, &p, &err) == MS_OK, "%s", err.msg);
            check_placement(&s.in, N, &p, NULL);
            ms_placement_free(&p);
        }
    }
}

TEST(one_device_holds_everything) {
    synth_in s;
    make_input(&s, 6, 8, 5, MS_EXPERTS_SHARDED);
    s.in.head_tied = 1;
    ms_placement p;
    ms_err err = {0};
    CHECK(ms_placement_make(&s.in, 1, NULL, &p, &err) == MS_OK);
    CHECK(p.dev[0].layer_begin == 0 && p.dev[0].layer_end == 6);
    uint64_t st = s.in.embed_bytes; /* tied: the head is the embedding, once */
    for (int l = 0; l < 6; l++) st += s.st[l];
    CHECK(p.dev[0].static_bytes == st);
    CHECK(p.dev[0].n_replicas == 0 && p.dev[0].n_experts_home == 5 * 8);
    ms_placement_free(&p);
    /* on two devices the tied head is a copy on the last one */
    CHECK(ms_placement_make(&s.in, 2, NULL, &p, &err) == MS_OK);
    uint64_t both = p.dev[0].static_bytes + p.dev[1].static_bytes;
    CHECK(both == st + s.in.head_bytes);
    ms_placement_free(&p);
}

TEST(budgets_steer_the_split) {
    /* 8 equal layers, no experts: a device with three times the budget takes more layers */
    uint64_t st[8], state[8] = {0}, xb[8] = {0};
    for (int l = 0; l < 8; l++) st[l] = 100ull << 20;
    ms_place_input in = {.n_layers = 8, .layer_static = st, .layer_state = state, .expert_bytes = xb};
    uint64_t budgets[2] = {300ull << 20, 900ull << 20};
    ms_placement p;
    ms_err err = {0};
    CHECK(ms_placement_make(&in, 2, budgets, &p, &err) == MS_OK);
    CHECK_MSG(p.dev[0].layer_end == 2, "device 0 got %d layers", p.dev[0].layer_end);
    CHECK(ms_placement_check(&p, NULL, &err) == MS_OK);
    check_placement(&in, 2, &p, budgets);
    ms_placement_free(&p);
    /* equal budgets: an even split */
    budgets[0] = budgets[1] = 600ull << 20;
    CHECK(ms_placement_make(&in, 2, budgets, &p, &err) == MS_OK);
    CHECK(p.dev[0].layer_end == 4);
    ms_placement_free(&p);
}

TEST(more_devices_than_layers) {
    synth_in s;
    make_input(&s, 3, 16, 11, MS_EXPERTS_SHARDED);
    ms_placement p;
    ms_err err = {0};
    CHECK(ms_placement_make(&s.in, 6, NULL, &p, &err) == MS_OK);
    check_placement(&s.in, 6, &p, NULL);
    /* the experts still spread over all six */
    for (int d = 0; d < 6; d++) CHECK(p.dev[d].n_experts_home > 0);
    ms_placement_free(&p);
}

TEST(replicate_the_hottest) {
    synth_in s;
    int L = 4, E = 8, R = 2;
    make_input(&s, L, E, 3, MS_EXPERTS_SHARDED);
    double heat[4 * 8];
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) heat[l * E + e] = (double)((e * 5 + l) % E); /* a permutation per layer */
    s.in.heat = heat;
    s.in.replicate_hot = R;
    for (int N = 2; N <= 8; N++) {
        ms_placement p;
        ms_err err = {0};
        CHECK(ms_placement_make(&s.in, N, NULL, &p, &err) == MS_OK);
        check_placement(&s.in, N, &p, NULL);
        int replicas = 0;
        for (int d = 0; d < N; d++) replicas += p.dev[d].n_replicas;
        CHECK_MSG(replicas == (L - 1) * R * (N - 1), "N=%d: %d replicas", N, replicas); /* layer 0 is dense */
        for (int l = 1; l < L; l++)
            for (int e = 0; e < E; e++) {
                int hot = heat[l * E + e] >= E - R; /* the R largest heats of the permutation */
                uint32_t all = (1u << N) - 1;
                CHECK((p.expert_devs[l * E + e] == all) == hot || N == 1);
            }
        ms_placement_free(&p);
    }
    /* without heat: lower ids are the hottest */
    s.in.heat = NULL;
    ms_placement p;
    ms_err err = {0};
    CHECK(ms_placement_make(&s.in, 4, NULL, &p, &err) == MS_OK);
    CHECK(p.expert_devs[1 * E + 0] == 0xf && p.expert_devs[1 * E + 1] == 0xf && p.expert_devs[1 * E + 2] != 0xf);
    ms_placement_free(&p);
    s.in.replicate_hot = E + 1;
    CHECK(ms_placement_make(&s.in, 4, NULL, &p, &err) == MS_ERR_ARG);
}

TEST(refused_before_allocating) {
    synth_in s;
    make_input(&s, 8, 16, 21, MS_EXPERTS_SHARDED);
    ms_placement p;
    ms_err err = {0};
    CHECK(ms_placement_make(&s.in, 2, NULL, &p, &err) == MS_OK);
    uint64_t need0 = p.dev[0].total, need1 = p.dev[1].total;
    /* device 1 holds at least its experts, the head, workspace and allowance plus one layer:
     * a budget 1 MiB under that part alone cannot be met by any split */
    uint64_t part1 = p.dev[1].expert_bytes + s.in.head_bytes + s.in.workspace_bytes + s.in.overhead_bytes;
    ms_placement_free(&p);
    uint64_t budgets[2] = {need0 + need1, part1 - (1ull << 20)};
    CHECK(ms_placement_make(&s.in, 2, budgets, &p, &err) == MS_OK);
    const char *names[2] = {"GPU 0", "GPU 1"};
    CHECK(ms_placement_check(&p, names, &err) == MS_ERR_NOMEM);
    CHECK_MSG(strstr(err.msg, "GPU 1 needs") != NULL && strstr(err.msg, "short by") != NULL &&
              !strstr(err.msg, "together"), "%s", err.msg);
    ms_placement_free(&p);
    /* the sum of both short: the message names the sum's shortfall */
    budgets[0] = budgets[1] = (need0 + need1) / 2 - (50ull << 20);
    CHECK(ms_placement_make(&s.in, 2, budgets, &p, &err) == MS_OK);
    CHECK(ms_placement_check(&p, NULL, &err) == MS_ERR_NOMEM);
    CHECK_MSG(strstr(err.msg, "device ") && strstr(err.msg, "all 2 devices together"), "%s", err.msg);
    ms_placement_free(&p);
    /* what fits one device exactly is accepted */
    CHECK(ms_placement_make(&s.in, 1, NULL, &p, &err) == MS_OK);
    uint64_t one = p.dev[0].total;
    ms_placement_free(&p);
    CHECK(ms_placement_make(&s.in, 1, &one, &p, &err) == MS_OK);
    CHECK(ms_placement_check(&p, NULL, &err) == MS_OK);
    ms_placement_free(&p);
    CHECK(ms_placement_make(&s.in, 0, NULL, &p, &err) == MS_ERR_ARG);
    CHECK(ms_placement_make(&s.in, MS_MAX_DEVICES + 1, NULL, &p, &err) == MS_ERR_ARG);
}

TEST(device_lists) {
    int ids[8];
    ms_err err = {0};
    CHECK(ms_parse_device_list("2", ids, 8, &err) == 2 && ids[0] == 0 && ids[1] == 1);
    CHECK(ms_parse_device_list("0,0", ids, 8, &err) == 2 && ids[0] == 0 && ids[1] == 0);
    CHECK(ms_parse_device_list("3,1,2", ids, 8, &err) == 3 && ids[0] == 3 && ids[2] == 2);
    const char *bad[] = {"", "0", "9", "0,", ",1", "a", "0,-1", "1,x", "0,1,2,3,4,5,6,7,0"};
    CHECK(ms_parse_device_list("1", ids, 8, &err) == 1); /* one device is a list too */
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (!strcmp(bad[i], "0")) continue;
        CHECK_MSG(ms_parse_device_list(bad[i], ids, 8, &err) < 0, "%s accepted", bad[i]);
    }
    CHECK(ms_parse_device_list("0", ids, 8, &err) < 0); /* a count of zero */
}

TEST(input_of_a_fixture_model) {
    ms_model m;
    ms_err err = {0};
    if (ms_model_load(MS_TEST_FIXTURES "qwen3_moe", &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    ms_place_input in;
    CHECK(ms_place_input_of(&m, NULL, 64, 8, 1, MS_EXPERTS_SHARDED, 0, &in, &err) == MS_OK);
    uint64_t experts = 0, statics = in.embed_bytes + (in.head_tied ? 0 : in.head_bytes), state = in.state0_bytes;
    for (int l = 0; l < in.n_layers; l++) {
        experts += in.expert_bytes[l] * (uint64_t)in.n_experts;
        statics += in.layer_static[l];
        state += in.layer_state[l];
    }
    CHECK_MSG(experts == m.expert_bytes, "experts %llu vs the model's %llu", (unsigned long long)experts,
              (unsigned long long)m.expert_bytes);
    CHECK(statics > 0 && in.n_layers == m.cfg.n_layers);
    /* the state is the plan's: per token times 64 */
    CHECK_MSG(state == ms_engine_state_bytes_per_token(&m) * 64, "state %llu", (unsigned long long)state);
    for (int N = 1; N <= 8; N++) {
        ms_placement p;
        CHECK(ms_placement_make(&in, N, NULL, &p, &err) == MS_OK);
        check_placement(&in, N, &p, NULL);
        char buf[4096];
        ms_placement_json(&p, buf, sizeof buf);
        CHECK(buf[0] == '[' && buf[strlen(buf) - 1] == ']');
        ms_placement_free(&p);
    }
    ms_place_input_free(&in);
    ms_model_free(&m);
}

TEST_MAIN()
