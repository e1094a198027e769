/* reader.h — asynchronous extent reads from checkpoint/store files.
 *
 * Three modes, one interface:
 *  uring  io_uring (liburing), O_DIRECT, reads into 4 KiB-aligned buffers
 *         (registered with the ring when the caller hands its arena over),
 *         queue_depth reads in flight across all files.
 *  pread  buffered pread from queue_depth worker threads (no io_uring, or a
 *         filesystem without O_DIRECT such as tmpfs).
 *  mmap   memcpy from a read-only mapping, from the same worker threads.
 * MS_IO_AUTO picks uring when a ring can be set up and every file opens with
 * O_DIRECT, else pread, and says why in one reason string (library code does
 * not print; the caller logs it).
 *
 * Placement is the same in every mode: the bytes [off, off+len) of a request
 * land at buf + (off % MS_IO_ALIGN), where buf is MS_IO_ALIGN-aligned and at
 * least ms_read_span(off, len) bytes (O_DIRECT reads the aligned superset).
 *
 * Thread safety: one thread submits and reaps (the engine's); workers are
 * internal. */
#ifndef MS_READER_H
#define MS_READER_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define MS_IO_ALIGN 4096u

typedef enum ms_io_mode { MS_IO_AUTO = 0, MS_IO_URING, MS_IO_PREAD, MS_IO_MMAP } ms_io_mode;

/* "auto", "uring", "pread", "mmap". */
const char *ms_io_mode_name(ms_io_mode m);
/* Parse a --io value; MS_ERR_ARG naming the value when unknown. */
int ms_io_mode_parse(const char *s, ms_io_mode *out, ms_err *err);

/* Bytes of aligned buffer a read of [off, off+len) needs: round_up(off % 4096 + len, 4096). */
static inline uint64_t ms_read_span(uint64_t off, uint64_t len) {
    return ((off & (MS_IO_ALIGN - 1)) + len + MS_IO_ALIGN - 1) & ~(uint64_t)(MS_IO_ALIGN - 1);
}

typedef struct ms_reader_opts {
    ms_io_mode mode;      /* MS_IO_AUTO or a forced mode */
    int queue_depth;      /* reads in flight, 1..256; 0 = 32 */
    uint64_t chunk_bytes; /* requests are split into pieces of at most this; 0 = 2 MiB (multiple of 4096) */
    /* Optional arena the reads land in, registered with io_uring in groups of whole
     * units (unit_bytes, e.g. a cache slot) so no read straddles two registrations.
     * Registration failure is not an error (reads go unregistered; noted in the reason). */
    void *arena;
    uint64_t arena_bytes, unit_bytes;
} ms_reader_opts;

typedef struct ms_reader ms_reader;

/* Open n_files files (paths copied) for reading in the requested mode. why[why_cap]
 * (may be NULL) receives one line: the mode chosen and, for a fallback, the reason.
 * A forced mode that cannot work (uring without a ring) fails with MS_ERR_UNSUPPORTED;
 * forced uring on a filesystem without O_DIRECT reads buffered through the ring.
 * Errors: MS_ERR_IO naming the file that does not open, MS_ERR_ARG for bad opts. */
int ms_reader_open(const char *const *paths, int n_files, const ms_reader_opts *opts, ms_reader **out, char *why,
                   size_t why_cap, ms_err *err);
void ms_reader_close(ms_reader *r);
ms_io_mode ms_reader_mode(const ms_reader *r);
int ms_reader_queue_depth(const ms_reader *r);
/* Size in bytes of file i as seen at open. */
uint64_t ms_reader_file_size(const ms_reader *r, int file);
const char *ms_reader_file_path(const ms_reader *r, int file);

/* Queue a read of [off, off+len) of file `file` into buf (see placement above);
 * returns at once. `tag` comes back from ms_reader_reap. Errors (nothing queued):
 * MS_ERR_ARG for a bad file index or misaligned buf, MS_ERR_IO when the extent
 * lies past the end of the file (named: path, offset, size; truncated file?). */
int ms_reader_submit(ms_reader *r, int file, uint64_t off, uint64_t len, void *buf, uint64_t tag, ms_err *err);

typedef struct ms_read_done {
    uint64_t tag;
    int status;   /* MS_OK or MS_ERR_IO */
    int err_no;   /* errno of the failure, or 0 (short read: 0) */
    int file;
    uint64_t off, len;
} ms_read_done;

/* Collect finished requests into done[0..max): blocks until at least min_done
 * (clamped to the number outstanding) have finished; min_done 0 never blocks.
 * *n_done gets the count. A failed read is reported in its ms_read_done, not as
 * the return value; the return value is an error only for a broken ring. */
int ms_reader_reap(ms_reader *r, int min_done, ms_read_done *done, int max, int *n_done, ms_err *err);
/* Requests submitted and not yet reaped. */
int ms_reader_outstanding(const ms_reader *r);

/* Sequential read bandwidth of `path` (the first max_bytes, whole file when 0) in
 * bytes/second, reading block_bytes blocks with qd in flight, O_DIRECT through
 * io_uring when possible (else the mode the reader falls back to; why says which).
 * Errors as ms_reader_open; MS_ERR_ARG for a file smaller than one block. */
int ms_io_probe_bandwidth(const char *path, uint64_t max_bytes, uint64_t block_bytes, int qd, ms_io_mode mode,
                          double *bytes_per_s, char *why, size_t why_cap, ms_err *err);

/* The queue depth to use on `path`: random block_bytes-aligned reads (O_DIRECT through
 * io_uring) at depths 2, 8, 32 and 64, about probe_bytes each; the smallest depth within
 * 90% of the best throughput. *qd gets 32 (and MS_OK) when the file is smaller than
 * 8 blocks or io_uring/O_DIRECT is unavailable. */
int ms_io_probe_queue_depth(const char *path, uint64_t block_bytes, uint64_t probe_bytes, int *qd, ms_err *err);

#endif
