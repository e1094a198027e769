/* libFuzzer target: state-file header and section-table parsing
 * (ms_state_parse) on arbitrary bytes. Each input is parsed as is, then again
 * with its checksums recomputed wherever the layout it claims allows, so that
 * mutations reach the structural checks behind the CRC32C comparisons. A
 * parse that succeeds must have promised in-bounds, ordered sections. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/state.h"
#include "util/hash.h"

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

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
    for (int i = 0; i < 8; i++) b[24 + i] = (uint8_t)((uint64_t)size >> (8 * i));
    uint64_t ns = b[12] | (uint64_t)b[13] << 8 | (uint64_t)b[14] << 16 | (uint64_t)b[15] << 24;
    uint64_t nt = rd64(b + 88), hb = rd64(b + 16);
    if (nt <= size / 4 && ns <= size / 72) {
        uint64_t tab = 104 + ((4 * nt + 7) & ~(uint64_t)7);
        for (uint64_t i = 0; i < ns && tab + (i + 1) * 72 <= size; i++) {
            uint8_t *t = b + tab + i * 72;
            uint64_t off = rd64(t + 48), sz = rd64(t + 56);
            if (off <= size && sz <= size - off) wr32(t + 64, ms_crc32c(0, b + off, sz));
        }
    }
    if (hb >= 100 && hb <= size) {
        wr32(b + 96, 0);
        wr32(b + 96, ms_crc32c(0, b, hb));
    }
    check(b, size);
    free(b);
    return 0;
}
