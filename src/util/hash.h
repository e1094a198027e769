/* hash.h — checksums: CRC32C (Castagnoli) for expert records, SHA-256 (OpenSSL
 * libcrypto) for binding a packed store to its source checkpoint. */
#ifndef MS_HASH_H
#define MS_HASH_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C of buf[0..len), continuing from crc (start with 0). Uses the SSE4.2
 * crc32 instruction when the CPU has it, else a table. Standard check value:
 * ms_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t ms_crc32c(uint32_t crc, const void *buf, size_t len);
/* The portable table implementation (the twin the fast path is tested against). */
uint32_t ms_crc32c_sw(uint32_t crc, const void *buf, size_t len);

/* SHA-256 of buf[0..len) into out[32]. Returns 0, or -1 if libcrypto failed. */
int ms_sha256(const void *buf, size_t len, uint8_t out[32]);
/* Lower-case hex of n bytes into out (2n+1 chars incl. NUL). */
void ms_hex(const uint8_t *b, size_t n, char *out);

#endif
