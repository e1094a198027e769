#include "util/hash.h"

#include <openssl/evp.h>
#include <pthread.h>

static uint32_t g_crc_tab[8][256];
static pthread_once_t g_crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
        g_crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) g_crc_tab[t][i] = (g_crc_tab[t - 1][i] >> 8) ^ g_crc_tab[0][g_crc_tab[t - 1][i] & 0xff];
}

uint32_t ms_crc32c_sw(uint32_t crc, const void *buf, size_t len) {
    pthread_once(&g_crc_once, crc_init);
    const uint8_t *p = buf;
    uint32_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) { c = (c >> 8) ^ g_crc_tab[0][(c ^ *p++) & 0xff]; len--; }
    while (len >= 8) {
        uint64_t v;
        __builtin_memcpy(&v, p, 8);
        v ^= c;
        c = g_crc_tab[7][v & 0xff] ^ g_crc_tab[6][(v >> 8) & 0xff] ^ g_crc_tab[5][(v >> 16) & 0xff] ^
            g_crc_tab[4][(v >> 24) & 0xff] ^ g_crc_tab[3][(v >> 32) & 0xff] ^ g_crc_tab[2][(v >> 40) & 0xff] ^
            g_crc_tab[1][(v >> 48) & 0xff] ^ g_crc_tab[0][v >> 56];
        p += 8;
        len -= 8;
    }
    while (len--) c = (c >> 8) ^ g_crc_tab[0][(c ^ *p++) & 0xff];
    return ~c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t len) {
    const uint8_t *p = buf;
    uint64_t c = (uint32_t)~crc;
    while (len && ((uintptr_t)p & 7)) { c = __builtin_ia32_crc32qi((uint32_t)c, *p++); len--; }
    while (len >= 8) {
        uint64_t a;
        __builtin_memcpy(&a, p, 8);
        c = __builtin_ia32_crc32di(c, a);
        p += 8;
        len -= 8;
    }
    while (len--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

uint32_t ms_crc32c(uint32_t crc, const void *buf, size_t len) {
#if defined(__x86_64__)
    /* libgcc fills the CPU model in a constructor; reading it is a load, no cache needed */
    if (__builtin_cpu_supports("sse4.2")) return crc32c_hw(crc, buf, len);
#endif
    return ms_crc32c_sw(crc, buf, len);
}

int ms_sha256(const void *buf, size_t len, uint8_t out[32]) {
    unsigned int n = 0;
    return EVP_Digest(buf, len, out, &n, EVP_sha256(), NULL) == 1 && n == 32 ? 0 : -1;
}

void ms_hex(const uint8_t *b, size_t n, char *out) {
    static const char k[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = k[b[i] >> 4];
        out[2 * i + 1] = k[b[i] & 15];
    }
    out[2 * n] = 0;
}
