#include "io/expert_trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void ms_expert_trace_header(FILE *f, int n_layers, int n_experts) {
    fprintf(f, "moonshine-expert-trace 1\nlayers %d experts %d\n", n_layers, n_experts);
}

void ms_expert_trace_event(FILE *f, char kind, int li, int n, const int *ids) {
    if (kind == 'r') {
        fprintf(f, "r %d\n", li);
        return;
    }
    fprintf(f, "%c %d %d", kind, li, n);
    for (int i = 0; i < n; i++) fprintf(f, " %d", ids[i]);
    fputc('\n', f);
}

/* Parse a non-negative int at *p (skipping blanks); -1 when there is none or it is out of range. */
static long next_int(const char **p, long max) {
    while (**p == ' ' || **p == '\t') (*p)++;
    if (**p < '0' || **p > '9') return -1;
    char *end;
    errno = 0;
    long v = strtol(*p, &end, 10);
    if (errno || v > max) return -1;
    *p = end;
    return v;
}

typedef struct { int li, slot; } pin_t;

int ms_expert_trace_replay(const char *path, const ms_trace_replay_opts *o, ms_trace_replay_result *out, ms_err *err) {
    memset(out, 0, sizeof *out);
    if (o->n_slots < 1) return ms_fail(err, MS_ERR_ARG, "trace replay: %d slots (need >= 1)", o->n_slots);
    FILE *f = fopen(path, "r");
    if (!f) return ms_fail(err, MS_ERR_IO, "cannot open trace %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = MS_OK, L = 0, E = 0, *ids = NULL;
    pin_t *pins = NULL;
    int n_pins = 0;
    ms_ecache c = {0};
    ssize_t len;
    if ((len = getline(&line, &cap, f)) < 0 || strncmp(line, "moonshine-expert-trace 1", 24) ||
        (line[24] != '\n' && line[24] != 0)) {
        rc = ms_fail(err, MS_ERR_FORMAT, "%s: line 1: not a moonshine expert trace (version 1)", path);
        goto done;
    }
    lineno = 1;
    if ((len = getline(&line, &cap, f)) < 0 || sscanf(line, "layers %d experts %d", &L, &E) != 2 || L < 1 ||
        E < 1 || L > 4096 || E > 65536) {
        rc = ms_fail(err, MS_ERR_FORMAT, "%s: line 2: expected \"layers L experts E\" (1..4096, 1..65536)", path);
        goto done;
    }
    lineno = 2;
    out->n_layers = L;
    out->n_experts = E;
    if ((rc = ms_ecache_init(&c, o->policy, o->n_slots, L, E, o->half_life, err))) goto done;
    ids = malloc(sizeof *ids * (size_t)E);
    pins = malloc(sizeof *pins * (size_t)o->n_slots);
    if (!ids || !pins) {
        rc = ms_fail(err, MS_ERR_NOMEM, "trace replay: out of memory");
        goto done;
    }
    ms_ecache_stats base = {0};
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        const char *p = line + 1;
        char kind = line[0];
        long li = next_int(&p, L - 1);
        if ((kind != 'a' && kind != 'p' && kind != 'r') || li < 0) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: line %ld: expected \"a|p|r LAYER ...\" with a layer in [0, %d)", path,
                         lineno, L);
            goto done;
        }
        if (kind == 'r') {
            int k = 0;
            for (int i = 0; i < n_pins; i++) {
                if (pins[i].li == li) c.slots[pins[i].slot].pins--;
                else pins[k++] = pins[i];
            }
            n_pins = k;
            continue;
        }
        long n = next_int(&p, E);
        for (long i = 0; n >= 0 && i < n; i++) {
            long v = next_int(&p, E - 1);
            if (v < 0) { n = -1; break; }
            ids[i] = (int)v;
        }
        while (*p == ' ' || *p == '\t' || *p == '\r') p++;
        if (n < 0 || (*p != '\n' && *p != 0)) {
            rc = ms_fail(err, MS_ERR_FORMAT, "%s: line %ld: expected N then N expert ids in [0, %d)", path, lineno, E);
            goto done;
        }
        if (kind == 'p') {
            if (o->no_prefetch) continue;
            for (long i = 0; i < n; i++) {
                int s = ms_ecache_prefetch(&c, (int)li, ids[i]);
                if (s >= 0) c.slots[s].state = MS_SLOT_READY;
            }
            continue;
        }
        if (out->acquires++ == o->skip_acquires) base = c.st;
        ms_ecache_step(&c, (int)li);
        for (long i = 0; i < n; i++) {
            int s;
            if (ms_ecache_request(&c, (int)li, ids[i], &s) < 0 || n_pins >= o->n_slots) {
                rc = ms_fail(err, MS_ERR_FORMAT, "%s: line %ld: more experts pinned at once than the %d slots", path,
                             lineno, o->n_slots);
                goto done;
            }
            c.slots[s].state = MS_SLOT_READY;
            c.slots[s].pins++;
            pins[n_pins++] = (pin_t){(int)li, s};
        }
    }
    if (out->acquires <= o->skip_acquires) base = c.st;
    /* statistics after the skipped prefix */
    out->st.requests = c.st.requests - base.requests;
    out->st.hits = c.st.hits - base.hits;
    out->st.misses = c.st.misses - base.misses;
    out->st.prefetch_issued = c.st.prefetch_issued - base.prefetch_issued;
    out->st.prefetch_used = c.st.prefetch_used - base.prefetch_used;
    out->st.prefetch_wasted = c.st.prefetch_wasted - base.prefetch_wasted;
    out->st.prefetch_refused = c.st.prefetch_refused - base.prefetch_refused;
    out->st.evictions = c.st.evictions - base.evictions;
done:
    if (ferror(f) && !rc) rc = ms_fail(err, MS_ERR_IO, "%s: read error", path);
    fclose(f);
    free(line);
    free(ids);
    free(pins);
    ms_ecache_free(&c);
    return rc;
}
