/* verify_choices.h — verify --static-dtype q8|fp8: the discrete choices (routed experts, DSA
 * selections; engine.h ms_choice) of the teacher-forced greedy forwards, recorded from an engine
 * over the stored static tier and from the requantized one, and compared
 * (docs/performance.md "Q8 static tier", rule in cmd_verify.c). */
#ifndef MS_CLI_VERIFY_CHOICES_H
#define MS_CLI_VERIFY_CHOICES_H

#include <stdint.h>

#include "engine/engine.h"
#include "model/model.h"

/* One recorded choice: forward fwd (verify's numbering: 0 = gen_prompt, f = the token of greedy
 * step f - 1), its ids (chosen experts or candidates, sorted) at ids[off..off+n), and its margin
 * and bound (below; only in a log made with margins). */
typedef struct ms_vc_rec {
    int fwd, kind, layer;
    int64_t pos;
    int64_t off;
    int n;
    double margin, bound;
} ms_vc_rec;

/* A log of choices (the ms_choice_fn context). rel: the relative RMS perturbation of a choice's
 * inputs, eps sqrt(M) (cmd_verify.c); margins: 1 to compute each choice's margin and bound. */
typedef struct ms_vc_log {
    const ms_model *m;
    double rel;
    int margins;
    int fwd;      /* set by the caller before each forward */
    ms_vc_rec *r;
    int64_t n, cap;
    int32_t *ids;
    int64_t n_ids, cap_ids;
    float *scratch; /* route replays: logits [W], route scratch [2W], ids / weights [top_k] */
    int oom;        /* an allocation failed: the log is incomplete */
    const struct ms_vc_log *from; /* ms_vc_force_from: the log whose choices are forced, and its index */
    void *from_ix;
    int64_t forced;               /* choices forced */
} ms_vc_log;

/* An empty log for model m. */
void ms_vc_init(ms_vc_log *g, const ms_model *m, double rel, int margins);
void ms_vc_free(ms_vc_log *g);
/* From now on ms_vc_observe on g forces, wherever the engine chose otherwise, the choice of ref
 * in effect at g->fwd for the same (kind, layer, pos) (ref complete and unchanged while g is
 * used). Returns 0, -1 out of memory. */
int ms_vc_force_from(ms_vc_log *g, const ms_vc_log *ref);
/* The ms_choice_fn: records c under g->fwd. With margins:
 *   experts: margin = the smallest B for which the router's choice changes when every chosen
 *     expert's logit is lowered by B/2 and every other one raised by B/2 (the router replayed,
 *     ms_route_host: bias, groups and score functions included; for plain top-k it is the k-th
 *     minus the (k+1)-th logit); bound = 4 rel rms(logits without the Linear bias).
 *   DSA: margin = the lowest selected candidate's score minus the highest unselected one's;
 *     bound = 4 sqrt(F) rel rms(scores): a score is a product of F independently perturbed
 *     projected inputs, F = 3 (the weights, the query, the key; KPool: 4, the pool's gates too). */
int ms_vc_observe(void *ctx, const ms_choice *c, int32_t *force);

/* A choice that differs between ref (with margins) and got: ref's record, and whether it is
 * among the first in causal order (the earliest forward, then the earliest layer, a layer's DSA
 * selection before its experts; with forcing every flip is judged alike, first is reported). */
typedef struct ms_vc_flip {
    ms_vc_rec ref;
    int first;
} ms_vc_flip;

/* Compare the last record of every (fwd, kind, layer, pos) of both logs (a DSA tie replay records
 * a position again). *flips (malloc'ed, caller frees) gets the differing choices in causal order,
 * *unmatched the keys present in only one log, *compared the keys in both. Returns 0, -1 out of
 * memory. The choice compared is each engine's own (before any forcing). */
int ms_vc_compare(const ms_vc_log *ref, const ms_vc_log *got, ms_vc_flip **flips, int *n_flips, int *unmatched,
                  int64_t *compared);

/* The rule (cmd_verify.c): 1 (fail) when a choice of flips[n] has a margin above its bound (or
 * no margin), or unmatched > 0 (a choice only one engine made); else 0. */
int ms_vc_judge(const ms_vc_flip *flips, int n, int unmatched);

#endif
