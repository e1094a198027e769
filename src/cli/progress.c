/* progress.c — the CLI's progress line (progress.h). */
#include "cli/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/common.h"

/* The ms_progress callback: redraw the line (at most every 0.1 s, always at 100%, which ends it). */
static void draw(void *user, const char *what, ms_progress_unit unit, uint64_t done, uint64_t total) {
    ms_cli_progress *cp = user;
    double now = ms_now();
    int fin = done >= total;
    if (cp->ended && !fin) cp->ended = 0; /* a second operation on the same line keeper */
    if (cp->ended || (!fin && cp->drawn && now - cp->last < 0.1)) return;
    if (!cp->drawn) cp->t0 = now;
    double el = now - cp->t0, rate = el > 0 ? (double)done / el : 0;
    double pct = total ? 100.0 * (double)done / (double)total : 100.0;
    char eta[48] = "";
    if (!fin && rate > 0) {
        double s = (double)(total - done) / rate;
        long sec = s < 1e8 ? (long)(s + 0.5) : 100000000L;
        if (sec < 60) snprintf(eta, sizeof eta, ", ETA %ld s", sec);
        else snprintf(eta, sizeof eta, ", ETA %ld min %02ld s", sec / 60, sec % 60);
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
