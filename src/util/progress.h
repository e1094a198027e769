/* progress.h — how a long library operation reports how far it is (the library prints nothing).
 *
 * The operation calls fn(user, what, unit, done, total) as it goes: what names it ("synth", "static
 * tier", "pack", "prefill"), unit says what done and total count (MS_PROGRESS_BYTES or
 * MS_PROGRESS_TOKENS); done never decreases and reaches total at the end (a last call with
 * done == total). The callback may rate-limit, draw or ignore; it must not fail. A NULL
 * ms_progress pointer or fn means nobody asked. */
#ifndef MS_PROGRESS_H
#define MS_PROGRESS_H

#include <stdint.h>

typedef enum { MS_PROGRESS_BYTES, MS_PROGRESS_TOKENS } ms_progress_unit;

typedef struct ms_progress {
    void (*fn)(void *user, const char *what, ms_progress_unit unit, uint64_t done, uint64_t total);
    void *user;
} ms_progress;

static inline void ms_progress_report(const ms_progress *p, const char *what, ms_progress_unit unit, uint64_t done,
                                      uint64_t total) {
    if (p && p->fn) p->fn(p->user, what, unit, done, total);
}

#endif
