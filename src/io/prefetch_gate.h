/* prefetch_gate.h — whether lookahead prefetches pay for the drive time they take,
 * decided from what the run measures.
 *
 * The engine's lookahead guesses layer l+1's experts while layer l computes and
 * prefetches them (engine/moe.c); the guess is judged at layer l+1's acquire.
 * When the drive is the bottleneck:
 *   a right guess starts its read `gap` seconds before the demand read would
 *     have (gap: from the prefetch to the acquire, the compute in between), so it
 *     saves min(gap, t_read) on the critical path;
 *   a wrong guess holds the drive for t_read, of which the gap hides up to gap,
 *     so it delays the demand reads queued behind it by max(0, t_read - gap).
 * Prefetching pays when p min(gap, t_read) >= (1 - p) max(0, t_read - gap), i.e.
 *   p >= 1 - gap / t_read   (always when gap >= t_read),
 * with p the guesses' running precision (right / judged, both decayed per judged
 * step). Guesses are judged whether or not they were forwarded (the engine makes
 * them anyway), so a closed gate keeps measuring p and reopens when the routing
 * becomes predictable; gap and t_read are running means (t_read: seconds a demand
 * read of one expert took at the queue depth the reads ran at).
 *
 * Until MS_PF_GATE_WARMUP guessed experts are judged and a gap and a read time are measured
 * the gate answers warm_open: 0 (the default of ms_pf_gate_init) holds the guesses back, as
 * held guesses are judged too and demand reads time the drive, so nothing needs forwarding
 * to be measured (forwarded unmeasured, the H200's 22% arena run read its first 64 guessed
 * experts of 9 MiB, right 2-14%); 1 forwards them (the behaviour without a gate). Pure bookkeeping: the caller
 * passes the clock, so the decisions are reproducible in tests. One pending guess
 * (the next MoE layer's, as the engine makes them). Not thread-safe. */
#ifndef MS_PREFETCH_GATE_H
#define MS_PREFETCH_GATE_H

#include <stdint.h>

#define MS_PF_GATE_MAX 64    /* experts in one guess (the engine's lookahead top-k bound) */
#define MS_PF_GATE_WARMUP 64 /* judged experts (guessed ones) before the gate may close */

typedef struct ms_pf_gate {
    int layer;                  /* layer of the pending guess, -1 none */
    int n;                      /* experts in it */
    int ids[MS_PF_GATE_MAX];
    double t_issue;             /* clock at the guess */
    double right, judged;       /* decayed counts of judged experts */
    double gap_s, read_s;       /* running means; 0 = not measured yet */
    uint64_t guessed, hits, forwarded, held; /* experts: guessed, guessed right, forwarded, held back */
    int warm_open;              /* the answer until measured (above); 0 after ms_pf_gate_init */
} ms_pf_gate;

void ms_pf_gate_init(ms_pf_gate *g);
/* A guess of n experts (ids[], those the caller would read) for layer at clock now:
 * recorded for judging (replacing an unjudged one); returns 1 when it should be
 * forwarded (read), 0 when the gate holds it back. n is clamped to MS_PF_GATE_MAX. */
int ms_pf_gate_guess(ms_pf_gate *g, int layer, int n, const int *ids, double now);
/* The acquire of layer at clock now asked for ids[0..n): judges a pending guess for
 * that layer (precision and gap); no-op otherwise. */
void ms_pf_gate_judge(ms_pf_gate *g, int layer, int n, const int *ids, double now);
/* A demand read of one expert took seconds (measured by the caller). */
void ms_pf_gate_read(ms_pf_gate *g, double seconds);
/* 1 when the gate is open now (the rule above; warm_open while warming up); *need (may be
 * NULL) gets the precision it requires (0 while warming up). */
int ms_pf_gate_open(const ms_pf_gate *g, double *need);
/* The running precision (0.5 before any judgment). */
double ms_pf_gate_precision(const ms_pf_gate *g);

#endif
