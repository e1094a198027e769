/* progress.c — the CLI's progress line (progress.h). */
#include "cli/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/common.h"

static void draw(void *user, const char *what, ms_progress_unit unit, uint64_t done, uint64_t total) {
    ms_cli_progress *cp = user;
    double now = ms_now();
    int fin = done >= total;
    if (cp->ended && !fin) cp->ended = 0; /* a second operation on the same line keeper */
    if (cp->ended || (!fin && cp->drawn && now - cp->last < 0.1)) return;
    if (!cp->drawn) cp->t0 = now;
    double el = now - cp->t0, rate = el > 0 ? (double)done / el : 0;
    double pct = total ? 100.0 * (double)done / (double)total : 100.0;
    char eta[32] = "";
    if (!fin && rate > 0) {
        double s = (double)(total - done) / rate;
        if (s < 60) snprintf(eta, sizeof eta, ", ETA %.0f s", s);
        else snprintf(eta, sizeof eta, ", ETA %.0f min %02.0f s", s / 60 < 1e6 ? (double)(int)(s / 60) : 1e6,
                      s - 60.0 * (int)(s / 60));
    }
    if (unit == MS_PROGRESS_TOKENS)
        fprintf(stderr, "\r\033[K%s: %5.1f%%  %llu / %llu tokens  %.1f tok/s%s%s", what, pct, (unsigned long long)done,
                (unsigned long long)total, rate, fin ? "" : eta, fin ? "\n" : "");
    else
        fprintf(stderr, "\r\033[K%s: %5.1f%%  %.1f / %.1f MB  %.1f MB/s%s%s", what, pct, done / 1e6, total / 1e6,
                rate / 1e6, fin ? "" : eta, fin ? "\n" : "");
    fflush(stderr);
    cp->drawn = !fin;
    cp->ended = fin;
    cp->last = now;
}

void ms_cli_progress_init(ms_cli_progress *cp) {
    memset(cp, 0, sizeof *cp);
    const char *np = getenv("NO_PROGRESS"), *term = getenv("TERM");
    if (!isatty(STDERR_FILENO) || (np && *np && strcmp(np, "0")) || (term && !strcmp(term, "dumb"))) return;
    cp->p.fn = draw;
    cp->p.user = cp;
}

void ms_cli_progress_end(ms_cli_progress *cp) {
    if (cp->drawn && !cp->ended) {
        fputs("\n", stderr);
        fflush(stderr);
    }
    cp->drawn = 0;
}
