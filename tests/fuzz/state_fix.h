/* state_fix.h — for the state-file fuzz targets (fuzz_state*.c): rewrite the
 * fields of a mutated state file that a real writer derives from the rest (the
 * file size, each section's CRC32C, the header CRC32C), wherever the layout the
 * bytes claim allows, so that mutations get past those checks to the
 * structural ones behind them. Offsets are the layout of docs/state.md (engine/state.c):
 * a 104-byte fixed header (section count at 12, header bytes at 16, file size
 * at 24, token count at 88, header CRC at 96), the token ids padded to 8
 * bytes, then 72-byte section entries (offset at 48, size at 56, CRC at 64). */
#include <stddef.h>
#include <stdint.h>

#include "util/hash.h"

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* b[0..size), size >= 104: file size, section CRCs (in-bounds entries only), header CRC. */
static void state_fix_derived(uint8_t *b, size_t size) {
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
}
