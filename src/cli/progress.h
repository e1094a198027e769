/* progress.h (cli) — a progress line on stderr for ms_progress reports: percent, MB/s (tok/s) and ETA,
 * redrawn in place (\r) at most 10 times a second, ended with a newline at 100%. Silent when
 * stderr is not a terminal (and under NO_PROGRESS=1 or TERM=dumb), so logs and pipes stay clean. */
#ifndef MS_CLI_PROGRESS_H
#define MS_CLI_PROGRESS_H

#include "util/progress.h"

typedef struct ms_cli_progress {
    ms_progress p;      /* pass &cp->p to the library; p.fn is NULL when silent */
    double t0, last;    /* start, last redraw (seconds, ms_now) */
    int drawn, ended;   /* a line is on screen; the 100% line was printed */
} ms_cli_progress;

/* Set *cp up; on a terminal cp->p reports, otherwise cp->p.fn is NULL. */
void ms_cli_progress_init(ms_cli_progress *cp);
/* End a line left unfinished (an error stopped the operation before 100%). */
void ms_cli_progress_end(ms_cli_progress *cp);

#endif
