#include "io/reader.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct rd_file {
    char *path;
    int fd;        /* buffered */
    int fd_direct; /* O_DIRECT, -1 when the filesystem refuses it */
    uint64_t size;
    const uint8_t *map; /* mmap mode */
} rd_file;

typedef struct rd_req {
    uint64_t tag;
    int file;
    uint64_t off, len;
    int chunks_left;
    int status, err_no;
    int next_free;
} rd_req;

typedef struct rd_chunk {
    int req;
    uint64_t foff;  /* file offset read */
    uint64_t rlen;  /* bytes asked of the kernel */
    uint64_t need;  /* bytes of them that are required (rest may be past EOF) */
    uint8_t *dst;
    int next; /* pending FIFO / free list link */
} rd_chunk;

struct ms_reader {
    ms_io_mode mode;
    int qd;
    uint64_t chunk;
    int n_files;
    rd_file *files;
    /* requests and chunks: pools with free lists (indices) */
    rd_req *reqs;
    int n_reqs, req_free;
    rd_chunk *chunks;
    int n_chunks, chunk_free;
    int pend_head, pend_tail; /* FIFO of chunks not yet handed to the kernel/workers */
    int inflight;             /* chunks handed over */
    int outstanding;          /* requests not yet reaped */
    /* finished requests not yet reaped */
    int *done_q;
    int done_n, done_cap;
    /* uring */
    struct io_uring ring;
    int ring_ok;
    uint8_t *arena;
    uint64_t arena_bytes, iov_bytes;
    int n_iov;
    /* workers (pread/mmap) */
    pthread_t *thr;
    int n_thr;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int stop;
};

const char *ms_io_mode_name(ms_io_mode m) {
    switch (m) {
    case MS_IO_AUTO: return "auto";
    case MS_IO_URING: return "uring";
    case MS_IO_PREAD: return "pread";
    case MS_IO_MMAP: return "mmap";
    }
    return "?";
}

int ms_io_mode_parse(const char *s, ms_io_mode *out, ms_err *err) {
    static const ms_io_mode all[] = {MS_IO_AUTO, MS_IO_URING, MS_IO_PREAD, MS_IO_MMAP};
    for (size_t i = 0; s && i < sizeof all / sizeof *all; i++)
        if (!strcmp(s, ms_io_mode_name(all[i]))) {
            *out = all[i];
            return MS_OK;
        }
    return ms_fail(err, MS_ERR_ARG, "unknown io mode \"%.40s\" (expected auto, uring, pread or mmap)", s ? s : "");
}

ms_io_mode ms_reader_mode(const ms_reader *r) { return r->mode; }
int ms_reader_queue_depth(const ms_reader *r) { return r->qd; }
uint64_t ms_reader_file_size(const ms_reader *r, int file) { return r->files[file].size; }
const char *ms_reader_file_path(const ms_reader *r, int file) { return r->files[file].path; }
int ms_reader_outstanding(const ms_reader *r) { return r->outstanding; }

/* ---- pools (caller holds mu in worker modes) ---- */

static int req_alloc(ms_reader *r) {
    if (r->req_free < 0) {
        int nn = r->n_reqs ? r->n_reqs * 2 : 64;
        rd_req *p = realloc(r->reqs, (size_t)nn * sizeof *p);
        if (!p) return -1;
        r->reqs = p;
        for (int i = nn - 1; i >= r->n_reqs; i--) {
            p[i].next_free = r->req_free;
            r->req_free = i;
        }
        r->n_reqs = nn;
    }
    int i = r->req_free;
    r->req_free = r->reqs[i].next_free;
    return i;
}

static int chunk_alloc(ms_reader *r) {
    if (r->chunk_free < 0) {
        int nn = r->n_chunks ? r->n_chunks * 2 : 256;
        rd_chunk *p = realloc(r->chunks, (size_t)nn * sizeof *p);
        if (!p) return -1;
        r->chunks = p;
        for (int i = nn - 1; i >= r->n_chunks; i--) {
            p[i].next = r->chunk_free;
            r->chunk_free = i;
        }
        r->n_chunks = nn;
    }
    int i = r->chunk_free;
    r->chunk_free = r->chunks[i].next;
    return i;
}

static void chunk_free(ms_reader *r, int c) {
    r->chunks[c].next = r->chunk_free;
    r->chunk_free = c;
}

static int done_push(ms_reader *r, int req) {
    if (r->done_n == r->done_cap) {
        int nc = r->done_cap ? r->done_cap * 2 : 64;
        int *p = realloc(r->done_q, (size_t)nc * sizeof *p);
        if (!p) return -1;
        r->done_q = p;
        r->done_cap = nc;
    }
    r->done_q[r->done_n++] = req;
    return 0;
}

/* A chunk finished with res bytes (or -errno). Marks its request; queues the request when complete. */
static void chunk_finish(ms_reader *r, int c, int64_t res) {
    rd_chunk *ch = &r->chunks[c];
    rd_req *q = &r->reqs[ch->req];
    if (res >= 0 && (uint64_t)res < ch->need) {
        /* short read: finish the rest buffered (rare; e.g. O_DIRECT split at a signal) */
        rd_file *f = &r->files[q->file];
        uint64_t got = (uint64_t)res;
        while (got < ch->need) {
            ssize_t k = pread(f->fd, ch->dst + got, ch->need - got, (off_t)(ch->foff + got));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                res = k < 0 ? -errno : (int64_t)got;
                break;
            }
            got += (uint64_t)k;
        }
        if (got >= ch->need) res = (int64_t)got;
    }
    if (q->status == MS_OK) {
        if (res < 0) {
            q->status = MS_ERR_IO;
            q->err_no = (int)-res;
        } else if ((uint64_t)res < ch->need) {
            q->status = MS_ERR_IO;
            q->err_no = 0;
        }
    }
    chunk_free(r, c);
    if (--q->chunks_left == 0) {
        if (done_push(r, ch->req) != 0) q->status = MS_ERR_IO; /* cannot happen after reserve */
    }
}

/* ---- worker modes ---- */

static void *worker(void *arg) {
    ms_reader *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->pend_head < 0) pthread_cond_wait(&r->work_cv, &r->mu);
        if (r->stop) break;
        int c = r->pend_head;
        r->pend_head = r->chunks[c].next;
        if (r->pend_head < 0) r->pend_tail = -1;
        r->inflight++;
        rd_chunk ch = r->chunks[c];
        rd_file *f = &r->files[r->reqs[ch.req].file];
        pthread_mutex_unlock(&r->mu);
        int64_t res;
        if (r->mode == MS_IO_MMAP) {
            memcpy(ch.dst, f->map + ch.foff, ch.rlen);
            res = (int64_t)ch.rlen;
            /* the copy is the cache: drop the mapped pages from this process (they stay in the
             * page cache) so mapped expert bytes never pile up beyond the memory plan */
            uint64_t pg = 4096, a = ch.foff & ~(pg - 1), b = (ch.foff + ch.rlen + pg - 1) & ~(pg - 1);
            if (b > f->size) b = f->size;
            if (b > a) madvise((void *)(f->map + a), b - a, MADV_DONTNEED);
        } else {
            uint64_t got = 0;
            res = 0;
            while (got < ch.rlen) {
                ssize_t k = pread(f->fd, ch.dst + got, ch.rlen - got, (off_t)(ch.foff + got));
                if (k < 0 && errno == EINTR) continue;
                if (k < 0) { res = -errno; break; }
                if (k == 0) break;
                got += (uint64_t)k;
            }
            if (res == 0) res = (int64_t)got;
        }
        pthread_mutex_lock(&r->mu);
        r->inflight--;
        chunk_finish(r, c, res);
        pthread_cond_broadcast(&r->done_cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- uring ---- */

static int uring_pump(ms_reader *r, ms_err *err) {
    int added = 0;
    while (r->pend_head >= 0 && r->inflight < r->qd) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
        if (!sqe) break;
        int c = r->pend_head;
        rd_chunk *ch = &r->chunks[c];
        r->pend_head = ch->next;
        if (r->pend_head < 0) r->pend_tail = -1;
        rd_file *f = &r->files[r->reqs[ch->req].file];
        int fd = f->fd_direct >= 0 ? f->fd_direct : f->fd;
        int idx = -1;
        if (r->n_iov && ch->dst >= r->arena && ch->dst + ch->rlen <= r->arena + r->arena_bytes) {
            uint64_t o = (uint64_t)(ch->dst - r->arena);
            uint64_t i = o / r->iov_bytes;
            if ((o + ch->rlen - 1) / r->iov_bytes == i && i < (uint64_t)r->n_iov) idx = (int)i;
        }
        if (idx >= 0)
            io_uring_prep_read_fixed(sqe, fd, ch->dst, (unsigned)ch->rlen, ch->foff, idx);
        else
            io_uring_prep_read(sqe, fd, ch->dst, (unsigned)ch->rlen, ch->foff);
        io_uring_sqe_set_data64(sqe, (uint64_t)c);
        r->inflight++;
        added++;
    }
    if (added) {
        int s = io_uring_submit(&r->ring);
        if (s < 0) return ms_fail(err, MS_ERR_IO, "io_uring_submit failed: %s", strerror(-s));
    }
    return MS_OK;
}

static int uring_collect(ms_reader *r, int block, ms_err *err) {
    struct io_uring_cqe *cqe;
    int rc;
    if (block) {
        do rc = io_uring_wait_cqe(&r->ring, &cqe);
        while (rc == -EINTR);
    } else {
        rc = io_uring_peek_cqe(&r->ring, &cqe);
        if (rc == -EAGAIN) return MS_OK;
    }
    if (rc < 0) return ms_fail(err, MS_ERR_IO, "io_uring wait failed: %s", strerror(-rc));
    unsigned head, n = 0;
    io_uring_for_each_cqe(&r->ring, head, cqe) {
        int c = (int)io_uring_cqe_get_data64(cqe);
        r->inflight--;
        chunk_finish(r, c, cqe->res);
        n++;
    }
    io_uring_cq_advance(&r->ring, n);
    return MS_OK;
}

/* ---- open/close ---- */

static void set_why(char *why, size_t cap, const char *fmt, const char *a, const char *b) {
    if (why && cap) snprintf(why, cap, fmt, a, b);
}

int ms_reader_open(const char *const *paths, int n_files, const ms_reader_opts *opts, ms_reader **out, char *why,
                   size_t why_cap, ms_err *err) {
    *out = NULL;
    if (why && why_cap) why[0] = 0;
    ms_reader_opts o = opts ? *opts : (ms_reader_opts){0};
    if (n_files < 1 || n_files > 65536) return ms_fail(err, MS_ERR_ARG, "reader: %d files (1..65536)", n_files);
    if (o.queue_depth == 0) o.queue_depth = 32;
    if (o.queue_depth < 1 || o.queue_depth > 256)
        return ms_fail(err, MS_ERR_ARG, "reader: queue depth %d out of range 1..256", o.queue_depth);
    if (o.chunk_bytes == 0) o.chunk_bytes = 2u << 20;
    if (o.chunk_bytes % MS_IO_ALIGN || o.chunk_bytes > (1u << 30))
        return ms_fail(err, MS_ERR_ARG, "reader: chunk %" PRIu64 " bytes is not a multiple of 4096 up to 1 GiB",
                       o.chunk_bytes);
    ms_reader *r = calloc(1, sizeof *r);
    if (!r) return ms_fail(err, MS_ERR_NOMEM, "reader: out of memory");
    r->qd = o.queue_depth;
    r->chunk = o.chunk_bytes;
    r->req_free = r->chunk_free = -1;
    r->pend_head = r->pend_tail = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->work_cv, NULL);
    pthread_cond_init(&r->done_cv, NULL);
    r->files = calloc((size_t)n_files, sizeof *r->files);
    if (!r->files) { free(r); return ms_fail(err, MS_ERR_NOMEM, "reader: out of memory"); }
    r->n_files = n_files;
    for (int i = 0; i < n_files; i++) r->files[i].fd = r->files[i].fd_direct = -1;
    int rc = MS_OK;
    const char *no_direct = NULL;
    int direct_errno = 0;
    for (int i = 0; i < n_files && !rc; i++) {
        rd_file *f = &r->files[i];
        f->path = strdup(paths[i]);
        if (!f->path) { rc = ms_fail(err, MS_ERR_NOMEM, "reader: out of memory"); break; }
        f->fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        if (f->fd < 0) { rc = ms_fail(err, MS_ERR_IO, "%s: cannot open: %s", paths[i], strerror(errno)); break; }
        struct stat st;
        if (fstat(f->fd, &st) != 0) { rc = ms_fail(err, MS_ERR_IO, "%s: cannot stat: %s", paths[i], strerror(errno)); break; }
        f->size = (uint64_t)st.st_size;
        if (o.mode != MS_IO_PREAD && o.mode != MS_IO_MMAP) {
            f->fd_direct = open(paths[i], O_RDONLY | O_CLOEXEC | O_DIRECT);
            if (f->fd_direct < 0 && !no_direct) { no_direct = f->path; direct_errno = errno; }
        }
    }
    ms_io_mode mode = o.mode;
    char reason[512] = "";
    if (!rc && (mode == MS_IO_AUTO || mode == MS_IO_URING)) {
        if (mode == MS_IO_AUTO && no_direct) {
            snprintf(reason, sizeof reason, "pread (fallback: %s does not open with O_DIRECT: %s)", no_direct,
                     strerror(direct_errno));
            mode = MS_IO_PREAD;
        } else {
            int s = io_uring_queue_init((unsigned)(r->qd < 8 ? 8 : r->qd), &r->ring, 0);
            if (s < 0) {
                if (mode == MS_IO_URING) {
                    rc = ms_fail(err, MS_ERR_UNSUPPORTED, "--io uring: io_uring_queue_init failed: %s", strerror(-s));
                } else {
                    snprintf(reason, sizeof reason, "pread (fallback: io_uring unavailable: %s)", strerror(-s));
                    mode = MS_IO_PREAD;
                }
            } else {
                r->ring_ok = 1;
                mode = MS_IO_URING;
                const char *reg = "unregistered buffers";
                char regbuf[128];
                if (o.arena && o.arena_bytes && o.unit_bytes && o.unit_bytes <= (1u << 30) &&
                    ((uintptr_t)o.arena % MS_IO_ALIGN) == 0) {
                    uint64_t per = ((uint64_t)1 << 30) / o.unit_bytes;
                    uint64_t units = o.arena_bytes / o.unit_bytes;
                    if (per < 1) per = 1;
                    uint64_t n_iov = (units + per - 1) / per;
                    if (n_iov >= 1 && n_iov <= 16384) {
                        struct iovec *iov = calloc(n_iov, sizeof *iov);
                        if (iov) {
                            for (uint64_t k = 0; k < n_iov; k++) {
                                uint64_t u0 = k * per, u1 = u0 + per < units ? u0 + per : units;
                                iov[k].iov_base = (uint8_t *)o.arena + u0 * o.unit_bytes;
                                iov[k].iov_len = (u1 - u0) * o.unit_bytes;
                            }
                            int g = io_uring_register_buffers(&r->ring, iov, (unsigned)n_iov);
                            if (g == 0) {
                                r->arena = o.arena;
                                r->arena_bytes = units * o.unit_bytes;
                                r->iov_bytes = per * o.unit_bytes;
                                r->n_iov = (int)n_iov;
                                snprintf(regbuf, sizeof regbuf, "%d registered buffer group(s)", r->n_iov);
                                reg = regbuf;
                            } else {
                                snprintf(regbuf, sizeof regbuf, "unregistered buffers (register failed: %s)",
                                         strerror(-g));
                                reg = regbuf;
                            }
                            free(iov);
                        }
                    }
                }
                if (no_direct)
                    snprintf(reason, sizeof reason, "uring (forced; buffered: %s does not open with O_DIRECT), %s",
                             no_direct, reg);
                else
                    snprintf(reason, sizeof reason, "uring (O_DIRECT, %s)", reg);
            }
        }
    }
    if (!rc && mode == MS_IO_MMAP) {
        for (int i = 0; i < n_files && !rc; i++) {
            rd_file *f = &r->files[i];
            if (!f->size) continue;
            void *p = mmap(NULL, f->size, PROT_READ, MAP_SHARED, f->fd, 0);
            if (p == MAP_FAILED) rc = ms_fail(err, MS_ERR_IO, "%s: mmap failed: %s", f->path, strerror(errno));
            else f->map = p;
        }
        if (!rc) snprintf(reason, sizeof reason, "mmap%s", o.mode == MS_IO_MMAP ? " (forced)" : "");
    }
    if (!rc && mode == MS_IO_PREAD && !reason[0]) snprintf(reason, sizeof reason, "pread (forced)");
    r->mode = mode;
    if (!rc && (mode == MS_IO_PREAD || mode == MS_IO_MMAP)) {
        int nt = r->qd < 16 ? r->qd : 16;
        r->thr = calloc((size_t)nt, sizeof *r->thr);
        if (!r->thr) rc = ms_fail(err, MS_ERR_NOMEM, "reader: out of memory");
        for (int i = 0; i < nt && !rc; i++) {
            if (pthread_create(&r->thr[i], NULL, worker, r) != 0)
                rc = ms_fail(err, MS_ERR_NOMEM, "reader: cannot start worker thread %d", i);
            else
                r->n_thr++;
        }
    }
    if (rc) {
        ms_reader_close(r);
        return rc;
    }
    set_why(why, why_cap, "%s%s", reason, "");
    *out = r;
    return MS_OK;
}

void ms_reader_close(ms_reader *r) {
    if (!r) return;
    if (r->ring_ok) {
        ms_err e;
        while (r->inflight > 0 && uring_collect(r, 1, &e) == MS_OK) {}
        io_uring_queue_exit(&r->ring);
    }
    if (r->n_thr) {
        pthread_mutex_lock(&r->mu);
        /* drop what was not started, let running chunks finish */
        r->pend_head = r->pend_tail = -1;
        r->stop = 1;
        pthread_cond_broadcast(&r->work_cv);
        pthread_mutex_unlock(&r->mu);
        for (int i = 0; i < r->n_thr; i++) pthread_join(r->thr[i], NULL);
    }
    free(r->thr);
    for (int i = 0; i < r->n_files; i++) {
        rd_file *f = &r->files[i];
        if (f->map) munmap((void *)f->map, f->size);
        if (f->fd >= 0) close(f->fd);
        if (f->fd_direct >= 0) close(f->fd_direct);
        free(f->path);
    }
    free(r->files);
    free(r->reqs);
    free(r->chunks);
    free(r->done_q);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->work_cv);
    pthread_cond_destroy(&r->done_cv);
    free(r);
}

int ms_reader_submit(ms_reader *r, int file, uint64_t off, uint64_t len, void *buf, uint64_t tag, ms_err *err) {
    if (file < 0 || file >= r->n_files) return ms_fail(err, MS_ERR_ARG, "reader: file index %d out of range", file);
    if (((uintptr_t)buf & (MS_IO_ALIGN - 1)) != 0)
        return ms_fail(err, MS_ERR_ARG, "reader: destination buffer is not 4096-byte aligned");
    rd_file *f = &r->files[file];
    if (len == 0 || off > f->size || len > f->size - off)
        return ms_fail(err, MS_ERR_IO,
                       "%s: extent [%" PRIu64 ", +%" PRIu64 ") lies past the end of the file (%" PRIu64
                       " bytes; truncated?)",
                       f->path, off, len, f->size);
    int lock = r->n_thr > 0;
    if (lock) pthread_mutex_lock(&r->mu);
    int rc = MS_OK;
    int q = req_alloc(r);
    /* reserve room in the done queue so completion never allocates */
    if (q < 0 || (r->done_cap < r->outstanding + 1 &&
                  !(r->done_q = realloc(r->done_q, (size_t)(r->done_cap = (r->outstanding + 1) * 2) * sizeof(int))))) {
        if (lock) pthread_mutex_unlock(&r->mu);
        return ms_fail(err, MS_ERR_NOMEM, "reader: out of memory");
    }
    rd_req *rq = &r->reqs[q];
    *rq = (rd_req){.tag = tag, .file = file, .off = off, .len = len, .status = MS_OK};
    int direct = r->mode == MS_IO_URING && f->fd_direct >= 0;
    uint64_t start = direct ? off & ~(uint64_t)(MS_IO_ALIGN - 1) : off;
    uint64_t end = direct ? start + ms_read_span(off, len) : off + len;
    uint8_t *dst = (uint8_t *)buf + (direct ? 0 : (off & (MS_IO_ALIGN - 1)));
    int first = -1, last = -1, n = 0;
    for (uint64_t p = start; p < end; p += r->chunk) {
        int c = chunk_alloc(r);
        if (c < 0) { rc = ms_fail(err, MS_ERR_NOMEM, "reader: out of memory"); break; }
        rd_chunk *ch = &r->chunks[c];
        ch->req = q;
        ch->foff = p;
        ch->rlen = end - p < r->chunk ? end - p : r->chunk;
        uint64_t need_end = off + len;
        ch->need = need_end <= p ? 0 : (need_end - p < ch->rlen ? need_end - p : ch->rlen);
        ch->dst = dst + (p - start);
        ch->next = -1;
        if (last >= 0) r->chunks[last].next = c;
        else first = c;
        last = c;
        n++;
    }
    if (rc) {
        for (int c = first; c >= 0;) {
            int nx = r->chunks[c].next;
            chunk_free(r, c);
            c = nx;
        }
        rq->next_free = r->req_free;
        r->req_free = q;
        if (lock) pthread_mutex_unlock(&r->mu);
        return rc;
    }
    rq->chunks_left = n;
    if (r->pend_tail >= 0) r->chunks[r->pend_tail].next = first;
    else r->pend_head = first;
    r->pend_tail = last;
    r->outstanding++;
    if (lock) {
        pthread_cond_broadcast(&r->work_cv);
        pthread_mutex_unlock(&r->mu);
        return MS_OK;
    }
    return uring_pump(r, err);
}

int ms_reader_reap(ms_reader *r, int min_done, ms_read_done *done, int max, int *n_done, ms_err *err) {
    *n_done = 0;
    if (min_done > r->outstanding) min_done = r->outstanding;
    if (min_done > max) min_done = max;
    int lock = r->n_thr > 0;
    if (lock) {
        pthread_mutex_lock(&r->mu);
        while (r->done_n < min_done) pthread_cond_wait(&r->done_cv, &r->mu);
    } else {
        int rc = uring_collect(r, 0, err);
        while (!rc && r->done_n < min_done) {
            rc = uring_pump(r, err);
            if (!rc) rc = uring_collect(r, 1, err);
        }
        if (!rc) rc = uring_pump(r, err);
        if (rc) return rc;
    }
    int k = r->done_n < max ? r->done_n : max;
    for (int i = 0; i < k; i++) {
        int q = r->done_q[i];
        rd_req *rq = &r->reqs[q];
        done[i] = (ms_read_done){.tag = rq->tag, .status = rq->status, .err_no = rq->err_no, .file = rq->file,
                                 .off = rq->off, .len = rq->len};
        rq->next_free = r->req_free;
        r->req_free = q;
    }
    if (k) memmove(r->done_q, r->done_q + k, (size_t)(r->done_n - k) * sizeof(int));
    r->done_n -= k;
    r->outstanding -= k;
    *n_done = k;
    if (lock) pthread_mutex_unlock(&r->mu);
    return MS_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ms_io_probe_bandwidth(const char *path, uint64_t max_bytes, uint64_t block_bytes, int qd, ms_io_mode mode,
                          double *bytes_per_s, char *why, size_t why_cap, ms_err *err) {
    *bytes_per_s = 0;
    if (block_bytes == 0 || block_bytes % MS_IO_ALIGN || block_bytes > (256u << 20))
        return ms_fail(err, MS_ERR_ARG, "probe: block of %" PRIu64 " bytes (multiple of 4096, at most 256 MiB)",
                       block_bytes);
    if (qd < 1 || qd > 64) return ms_fail(err, MS_ERR_ARG, "probe: queue depth %d (1..64)", qd);
    uint8_t *bufs = NULL;
    if (posix_memalign((void **)&bufs, MS_IO_ALIGN, block_bytes * (uint64_t)qd) != 0)
        return ms_fail(err, MS_ERR_NOMEM, "probe: cannot allocate %d x %" PRIu64 " bytes", qd, block_bytes);
    ms_reader *r;
    ms_reader_opts o = {.mode = mode, .queue_depth = qd, .chunk_bytes = block_bytes, .arena = bufs,
                        .arena_bytes = block_bytes * (uint64_t)qd, .unit_bytes = block_bytes};
    int rc = ms_reader_open(&path, 1, &o, &r, why, why_cap, err);
    if (rc) { free(bufs); return rc; }
    uint64_t size = ms_reader_file_size(r, 0);
    if (max_bytes == 0 || max_bytes > size) max_bytes = size;
    uint64_t nblk = max_bytes / block_bytes;
    if (nblk == 0) {
        ms_reader_close(r);
        free(bufs);
        return ms_fail(err, MS_ERR_ARG, "probe: %s has fewer than %" PRIu64 " bytes", path, block_bytes);
    }
    double t0 = now_s();
    uint64_t next = 0, finished = 0;
    for (int i = 0; i < qd && next < nblk && !rc; i++, next++)
        rc = ms_reader_submit(r, 0, next * block_bytes, block_bytes, bufs + (uint64_t)i * block_bytes, (uint64_t)i, err);
    while (!rc && finished < nblk) {
        ms_read_done d[64];
        int nd;
        rc = ms_reader_reap(r, 1, d, 64, &nd, err);
        for (int i = 0; i < nd && !rc; i++) {
            if (d[i].status) {
                rc = ms_fail(err, MS_ERR_IO, "probe: %s: read at %" PRIu64 " failed: %s", path, d[i].off,
                             d[i].err_no ? strerror(d[i].err_no) : "short read");
                break;
            }
            finished++;
            if (next < nblk) {
                rc = ms_reader_submit(r, 0, next * block_bytes, block_bytes, bufs + d[i].tag * block_bytes, d[i].tag,
                                      err);
                next++;
            }
        }
    }
    double dt = now_s() - t0;
    ms_reader_close(r);
    free(bufs);
    if (!rc) *bytes_per_s = (double)(nblk * block_bytes) / (dt > 1e-9 ? dt : 1e-9);
    return rc;
}

int ms_io_probe_queue_depth(const char *path, uint64_t block_bytes, uint64_t probe_bytes, int *qd, ms_err *err) {
    static const int depths[] = {2, 8, 32, 64};
    *qd = 32;
    if (block_bytes == 0 || block_bytes % MS_IO_ALIGN || block_bytes > (64u << 20))
        return ms_fail(err, MS_ERR_ARG, "queue depth probe: block of %" PRIu64 " bytes", block_bytes);
    uint8_t *bufs = NULL;
    if (posix_memalign((void **)&bufs, MS_IO_ALIGN, block_bytes * 64) != 0)
        return ms_fail(err, MS_ERR_NOMEM, "queue depth probe: out of memory");
    ms_reader *r;
    ms_reader_opts o = {.mode = MS_IO_URING, .queue_depth = 64, .chunk_bytes = block_bytes, .arena = bufs,
                        .arena_bytes = block_bytes * 64, .unit_bytes = block_bytes};
    ms_err e2 = {0};
    if (ms_reader_open(&path, 1, &o, &r, NULL, 0, &e2)) { /* no ring: keep the default */
        free(bufs);
        return MS_OK;
    }
    uint64_t nblk = ms_reader_file_size(r, 0) / block_bytes;
    int rc = MS_OK;
    double best = 0, rate[4] = {0};
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (int di = 0; nblk >= 8 && di < 4 && !rc; di++) {
        int d = depths[di];
        uint64_t want = probe_bytes / block_bytes, sent = 0, done = 0;
        if (want < (uint64_t)d) want = (uint64_t)d;
        double t0 = now_s();
        for (int i = 0; i < d && !rc; i++, sent++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            rc = ms_reader_submit(r, 0, (seed >> 17) % nblk * block_bytes, block_bytes, bufs + (uint64_t)i * block_bytes,
                                  (uint64_t)i, err);
        }
        while (!rc && done < want) {
            ms_read_done dd[64];
            int nd;
            rc = ms_reader_reap(r, 1, dd, 64, &nd, err);
            for (int i = 0; i < nd && !rc; i++) {
                done++;
                if (sent < want) {
                    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                    rc = ms_reader_submit(r, 0, (seed >> 17) % nblk * block_bytes, block_bytes,
                                          bufs + dd[i].tag * block_bytes, dd[i].tag, err);
                    sent++;
                }
            }
        }
        double dt = now_s() - t0;
        rate[di] = (double)(done * block_bytes) / (dt > 1e-9 ? dt : 1e-9);
        if (rate[di] > best) best = rate[di];
    }
    if (!rc && best > 0)
        for (int di = 0; di < 4; di++)
            if (rate[di] >= 0.9 * best) {
                *qd = depths[di];
                break;
            }
    ms_reader_close(r);
    free(bufs);
    return rc;
}
