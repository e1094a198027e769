/* checksum.h — whole-file SHA-256 of a checkpoint's shards and the checksum
 * files `sha256sum` writes (`moonshine inspect DIR --verify-sha256 [SUMS]`). */
#ifndef MS_CHECKSUM_H
#define MS_CHECKSUM_H

#include <stdint.h>

#include "util/err.h"

/* Called after each chunk of a file: bytes of it hashed so far and its size. */
typedef void (*ms_sha_progress)(void *ud, uint64_t done, uint64_t size);

/* SHA-256 of the whole file at path into out[32], read sequentially through one bounded
 * buffer (never mapped, never held whole); *size gets the bytes hashed. progress (may be
 * NULL) is called after every chunk. Fails naming the path on an open or read error, or
 * when the file changes size while it is read. */
int ms_sha256_file(const char *path, uint8_t out[32], uint64_t *size, ms_sha_progress progress, void *ud,
                   ms_err *err);

typedef struct {
    char *name;      /* as the line names it (relative to the checksum file's directory) */
    uint8_t sum[32];
} ms_sum_entry;

typedef struct {
    ms_sum_entry *e;
    int n;
} ms_sums;

/* Parses text[0..len) in the format `sha256sum` writes: per line 64 hex digits, a space,
 * ' ' (text) or '*' (binary), the file name; empty lines are skipped. Refused, naming
 * path:line: another length or non-hex digits, a missing separator or name, a name that
 * is absolute or has a ".." component, escaped names (a leading '\'), a name listed
 * twice, more than 1<<20 lines. On success out owns its entries (ms_sums_free). */
int ms_sums_parse(const char *text, size_t len, const char *path, ms_sums *out, ms_err *err);
void ms_sums_free(ms_sums *s);
/* The entry naming name, else NULL. */
const ms_sum_entry *ms_sums_find(const ms_sums *s, const char *name);

/* The regular files directly in dir whose names end in ".safetensors", sorted by name
 * (bytewise): *names is a malloc'd array of *n malloc'd names (ms_names_free). */
int ms_list_shards(const char *dir, char ***names, int *n, ms_err *err);
void ms_names_free(char **names, int n);

/* Hex digits (either case) to bytes: 2n digits to out[n]; 0, or -1 on a non-hex digit. */
int ms_unhex(const char *s, size_t n, uint8_t *out);

#endif
