/* The lookahead prefetch gate (io/prefetch_gate.h) on scripted clocks: closed while
 * warming up by default (open with warm_open), judging and timing all the same; with a measured gap g and read time r it stays open exactly while the
 * guesses' precision is at least 1 - g / r (a run of wrong guesses closes it, a run
 * of right ones, judged while closed, opens it again); a gap longer than the read
 * time keeps it open at any precision; a guess replaced before its layer's acquire
 * is not judged; the counts add up. */
#include "io/prefetch_gate.h"
#include "test.h"

/* n_steps guesses of 8 experts for layer 1, each judged `gap` later by an acquire
 * holding `right` of them (and 8 - right others). Returns the last guess's decision. */
static int steps(ms_pf_gate *g, double *t, int n_steps, int right, double gap) {
    int open = 0;
    for (int s = 0; s < n_steps; s++) {
        int guess[8], got[8];
        for (int i = 0; i < 8; i++) guess[i] = 10 + i, got[i] = i < right ? 10 + i : 100 + i;
        open = ms_pf_gate_guess(g, 1, 8, guess, *t);
        *t += gap;
        ms_pf_gate_judge(g, 1, 8, got, *t);
        *t += 0.001;
    }
    return open;
}

TEST(warmup_then_rule) {
    ms_pf_gate g;
    ms_pf_gate_init(&g);
    g.warm_open = 1; /* the gate's first form: forward until measured */
    double t = 1.0, need = -1;
    CHECK(ms_pf_gate_open(&g, &need) && need == 0);
    /* wrong guesses, but no read time measured yet: open (the behaviour without a gate) */
    CHECK(steps(&g, &t, 12, 0, 0.0002) == 1);
    CHECK(ms_pf_gate_open(&g, NULL));
    /* reads of 4 ms, gap 0.2 ms: the rule needs p >= 0.95; all wrong: closed */
    for (int i = 0; i < 20; i++) ms_pf_gate_read(&g, 0.004);
    CHECK_NEAR(g.read_s, 0.004, 1e-9);
    CHECK(!ms_pf_gate_open(&g, &need));
    CHECK_NEAR(need, 1.0 - 0.0002 / 0.004, 1e-6);
    uint64_t held0 = g.held;
    CHECK(steps(&g, &t, 5, 0, 0.0002) == 0 && g.held == held0 + 40);
    /* right guesses, judged while held back, raise the precision until it reopens */
    int opened_at = -1;
    for (int s = 0; s < 400 && opened_at < 0; s++)
        if (steps(&g, &t, 1, 8, 0.0002) && ms_pf_gate_precision(&g) >= 0.95) opened_at = s;
    CHECK_MSG(opened_at > 0, "reopened at step %d", opened_at);
    CHECK(ms_pf_gate_open(&g, NULL) && ms_pf_gate_precision(&g) >= 0.95);
    /* 7 of 8 right (p = 0.875 < 0.95): closes again */
    CHECK(steps(&g, &t, 300, 7, 0.0002) == 0);
    CHECK_NEAR(ms_pf_gate_precision(&g), 0.875, 0.01);
    CHECK(g.hits <= g.guessed && g.forwarded + g.held == g.guessed);
}

TEST(long_gap_stays_open) {
    ms_pf_gate g;
    ms_pf_gate_init(&g);
    double t = 0;
    ms_pf_gate_read(&g, 0.001);
    /* the compute between guess and acquire (2 ms) hides a whole read (1 ms): wrong guesses
     * cost nothing on the critical path, so the gate never closes */
    CHECK(steps(&g, &t, 100, 0, 0.002) == 1);
    CHECK(ms_pf_gate_precision(&g) < 0.01 && g.held == 64); /* the warm-up's 8 guesses of 8, held */
    CHECK_NEAR(g.gap_s, 0.002, 1e-9);
}

TEST(unjudged_guess_dropped) {
    ms_pf_gate g;
    ms_pf_gate_init(&g);
    int a[3] = {1, 2, 3}, b[2] = {4, 5};
    ms_pf_gate_guess(&g, 2, 3, a, 0.0);
    ms_pf_gate_guess(&g, 3, 2, b, 0.1); /* replaces the guess for layer 2 */
    CHECK(g.guessed == 2 && g.layer == 3);
    ms_pf_gate_judge(&g, 2, 3, a, 0.2); /* not the pending layer: nothing */
    CHECK(g.hits == 0 && g.judged == 0 && g.layer == 3);
    ms_pf_gate_judge(&g, 3, 2, b, 0.3);
    CHECK(g.hits == 2 && g.layer == -1 && ms_pf_gate_precision(&g) == 1.0);
    CHECK_NEAR(g.gap_s, 0.2, 1e-12);
    ms_pf_gate_judge(&g, 3, 2, b, 0.4); /* judged once */
    CHECK(g.hits == 2);
    CHECK(ms_pf_gate_guess(&g, 1, 0, NULL, 0.5) == 0 && g.layer == -1 && g.guessed == 2); /* warming up: held */
}

/* The default warm-up: nothing forwarded until a gap, a read time and 64 judged experts are
 * measured, all of them measured on held guesses; then the rule decides (here p = 1: open). */
TEST(warmup_held_by_default) {
    ms_pf_gate g;
    ms_pf_gate_init(&g);
    double t = 0, need = -1;
    CHECK(!ms_pf_gate_open(&g, &need) && need == 0);
    CHECK(steps(&g, &t, 10, 8, 0.0002) == 0); /* right guesses, but no read time yet: held */
    CHECK(g.forwarded == 0 && g.held == 80 && g.hits == 80 && g.gap_s > 0);
    ms_pf_gate_read(&g, 0.004);
    CHECK(steps(&g, &t, 1, 8, 0.0002) == 1 && ms_pf_gate_open(&g, &need) && need > 0.9);
    CHECK(g.forwarded == 8);
}

TEST_MAIN()
