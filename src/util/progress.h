/* progress.h — how a long library operation reports how far it is (the library prints nothing).
 *
 * The operation calls fn(user, what, done, total) as it goes: what names it ("synth", "static tier",
 * "pack"), done and total count bytes, done never decreases and reaches total at the end (a last
 * call with done == total). The callback may rate-limit, draw or ignore; it must not fail. A NULL
 * ms_progress pointer or fn means nobody asked. */
#ifndef MS_PROGRESS_H
#define MS_PROGRESS_H

#include <stdint.h>

typedef struct ms_progress {
    void (*fn)(void *user, const char *what, uint64_t done, uint64_t total);
    void *user;
} ms_progress;

static inline void ms_progress_report(const ms_progress *p, const char *what, uint64_t done, uint64_t total) {
    if (p && p->fn) p->fn(p->user, what, done, total);
}

#endif
