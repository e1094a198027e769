/* libFuzzer target: state-file header and section-table parsing
 * (ms_state_parse) on arbitrary bytes. Each input is parsed as is, then again
 * with its checksums recomputed wherever the layout it claims allows, so that
 * mutations reach the structural checks behind the CRC32C comparisons. A
 * parse that succeeds must have promised in-bounds, ordered sections. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/state.h"
#include "state_fix.h"

static void check(const uint8_t *b, size_t n) {
    ms_state_info in;
    ms_err err;
    if (ms_state_parse(b, n, "fuzz", &in, &err)) return;
    uint64_t prev = in.header_bytes;
    for (int i = 0; i < in.n_sections; i++) {
        const ms_state_section *s = &in.sections[i];
        if (s->offset < prev || s->offset > n || s->size > n - s->offset || s->offset % 8 || !s->name[0]) abort();
        prev = s->offset + s->size;
    }
    if (in.n_tokens != in.n_past || in.header_bytes > n || in.file_bytes != n) abort();
    for (int64_t i = 0; i < in.n_tokens; i++)
        if (in.tokens[i] < 0) abort();
    ms_state_info_free(&in);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check(data, size);
    if (size < 104 || size > (1u << 20)) return 0;
    uint8_t *b = malloc(size);
    if (!b) return 0;
    memcpy(b, data, size);
    /* recompute what the claimed layout allows: file size, section CRCs, header CRC */
    state_fix_derived(b, size);
    check(b, size);
    free(b);
    return 0;
}
