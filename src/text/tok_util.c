/* tok_util.c — UTF-8 validation (Unicode table 3-7), byte buffers, id arrays. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

/* Valid range of the second byte for a lead byte, and the sequence length. */
static int lead_info(uint8_t c, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c < 0xF0) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c < 0xF5) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

int ms_utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    uint8_t lo, hi;
    int L = lead_info(s[0], &lo, &hi);
    if (L == 0 || (size_t)L > n) return 0;
    if (L == 1) {
        *cp = s[0];
        return 1;
    }
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < L; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    uint32_t c = s[0] & (0x7F >> L);
    for (int i = 1; i < L; i++) c = (c << 6) | (s[i] & 0x3F);
    *cp = c;
    return L;
}

size_t ms_utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int l = ms_utf8_next(s + i, n - i, &cp);
        if (!l) return i;
        i += (size_t)l;
    }
    return n;
}

size_t ms_utf8_bad_len(const uint8_t *s, size_t n, int *need_more) {
    uint8_t lo, hi;
    int L = lead_info(s[0], &lo, &hi);
    if (need_more) *need_more = 0;
    if (L <= 1) return 1;
    size_t k = 1;
    while ((int)k < L && k < n) {
        uint8_t c = s[k];
        if (k == 1 ? (c < lo || c > hi) : ((c & 0xC0) != 0x80)) return k;
        k++;
    }
    if ((int)k < L && need_more) *need_more = 1;
    return k;
}

int ms_utf8_put(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

int ms_buf_reserve(ms_buf *b, size_t extra) {
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int ms_buf_add(ms_buf *b, const void *data, size_t n) {
    if (ms_buf_reserve(b, n + 1)) return -1;
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void ms_buf_free(ms_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int ms_ids_push(ms_tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return -1;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return 0;
}

void ms_tok_ids_free(ms_tok_ids *v) {
    free(v->ids);
    memset(v, 0, sizeof *v);
}

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other
 * 68 map to U+0100.. in byte order. */
static int16_t g_bl_rev[324];
static pthread_once_t g_bl_once = PTHREAD_ONCE_INIT;

static void bl_init(void) {
    for (int i = 0; i < 324; i++) g_bl_rev[i] = -1;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        if (printable) g_bl_rev[b] = (int16_t)b;
        else g_bl_rev[256 + k++] = (int16_t)b;
    }
}

int ms_bytelevel_byte(uint32_t cp) {
    pthread_once(&g_bl_once, bl_init);
    return cp < 324 ? g_bl_rev[cp] : -1;
}

int ms_bytelevel_decode(const uint8_t *s, size_t n, ms_buf *out) {
    if (ms_buf_reserve(out, n + 1)) return -1;
    size_t start = out->n, i = 0;
    while (i < n) {
        uint32_t cp;
        int k = ms_utf8_next(s + i, n - i, &cp);
        int b = k ? ms_bytelevel_byte(cp) : -1;
        if (b < 0) { /* not all byte chars: the token's own bytes */
            out->n = start;
            return ms_buf_add(out, s, n);
        }
        out->p[out->n++] = (uint8_t)b;
        i += (size_t)k;
    }
    out->p[out->n] = 0;
    return 0;
}
