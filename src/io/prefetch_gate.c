/* prefetch_gate.c — the lookahead prefetch gate (contract in prefetch_gate.h). */
#include "io/prefetch_gate.h"

#include <string.h>

#define DECAY 0.98 /* per judged step: ~50 steps of memory */
#define ALPHA 0.1  /* running means of gap and read time */

void ms_pf_gate_init(ms_pf_gate *g) {
    memset(g, 0, sizeof *g);
    g->layer = -1;
}

double ms_pf_gate_precision(const ms_pf_gate *g) { return g->judged > 0 ? g->right / g->judged : 0.5; }

int ms_pf_gate_open(const ms_pf_gate *g, double *need) {
    if (need) *need = 0;
    uint64_t judged = g->guessed - (g->layer >= 0 ? (uint64_t)g->n : 0);
    if (judged < MS_PF_GATE_WARMUP || g->read_s <= 0 || g->gap_s <= 0) return g->warm_open;
    if (g->gap_s >= g->read_s) return 1;
    double p_need = 1.0 - g->gap_s / g->read_s;
    if (need) *need = p_need;
    return ms_pf_gate_precision(g) >= p_need;
}

int ms_pf_gate_guess(ms_pf_gate *g, int layer, int n, const int *ids, double now) {
    if (n > MS_PF_GATE_MAX) n = MS_PF_GATE_MAX;
    if (n < 0) n = 0;
    if (g->layer >= 0) g->guessed -= (uint64_t)g->n; /* an unjudged guess is dropped, not counted */
    g->layer = n ? layer : -1;
    g->n = n;
    if (n) memcpy(g->ids, ids, (size_t)n * sizeof *ids);
    g->t_issue = now;
    g->guessed += (uint64_t)n;
    int open = ms_pf_gate_open(g, NULL);
    if (open) g->forwarded += (uint64_t)n;
    else g->held += (uint64_t)n;
    return open;
}

void ms_pf_gate_judge(ms_pf_gate *g, int layer, int n, const int *ids, double now) {
    if (g->layer < 0 || g->layer != layer) return;
    int right = 0;
    for (int i = 0; i < g->n; i++)
        for (int j = 0; j < n; j++)
            if (g->ids[i] == ids[j]) {
                right++;
                break;
            }
    g->hits += (uint64_t)right;
    g->right = g->right * DECAY + right;
    g->judged = g->judged * DECAY + g->n;
    double gap = now - g->t_issue;
    if (gap > 0) g->gap_s = g->gap_s > 0 ? g->gap_s + ALPHA * (gap - g->gap_s) : gap;
    g->layer = -1;
    g->n = 0;
}

void ms_pf_gate_read(ms_pf_gate *g, double seconds) {
    if (seconds <= 0) return;
    g->read_s = g->read_s > 0 ? g->read_s + ALPHA * (seconds - g->read_s) : seconds;
}
