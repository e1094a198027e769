/* safetensors.h — validated SafeTensors files and sharded checkpoints.
 *
 * A checkpoint is a directory with model.safetensors or
 * model.safetensors.index.json + shards. Every file is mapped read-only;
 * tensors point into the mapping in their stored dtype (never copied).
 * All tensors of all shards are reachable through one name -> tensor table
 * built once at open. */
#ifndef MS_SAFETENSORS_H
#define MS_SAFETENSORS_H

#include <stdint.h>

#include "util/dtype.h"
#include "util/err.h"
#include "util/fs.h"
#include "util/strmap.h"

#define MS_MAX_DIMS 8
/* Headers beyond this are refused (real checkpoints use < 10 MiB). */
#define MS_ST_MAX_HEADER (100u << 20)

typedef struct ms_tensor {
    char *name;
    ms_dtype dtype;
    int ndim;
    int64_t shape[MS_MAX_DIMS];
    uint64_t nelem;
    uint64_t nbytes;
    int file;          /* index into ms_checkpoint.files */
    uint64_t offset;   /* absolute byte offset of the data in that file */
    const void *data;  /* mapped pointer (NULL when the file is not mapped) */
} ms_tensor;

typedef struct ms_st_file {
    char *path;
    ms_mapping map;
    uint64_t data_start; /* 8 + header length */
} ms_st_file;

typedef struct ms_checkpoint {
    char *dir;
    int n_files;
    ms_st_file *files;
    int n_tensors;
    ms_tensor *tensors;
    ms_strmap by_name;
    int headers_only;  /* ms_checkpoint_open_headers / ms_checkpoint_from_tensors: no payload mapped */
} ms_checkpoint;

/* Parse and validate the header of a SafeTensors file whose first bytes are
 * buf[0..buf_len) and whose total size is file_size (buf_len may be smaller
 * than file_size but must cover the header). On success *tensors is a malloc'd
 * array of *n tensors with offsets relative to the file start, data = NULL,
 * file = 0. `where` names the file in messages. Checks: header length bounds,
 * well-formed JSON object, known dtypes, shapes, shape x dtype == byte range,
 * ranges inside the file, no overlaps, unique names. */
int ms_st_parse(const uint8_t *buf, uint64_t buf_len, uint64_t file_size, const char *where,
                ms_tensor **tensors, int *n, uint64_t *data_start, ms_err *err);
void ms_st_free_tensors(ms_tensor *t, int n);

/* Open a checkpoint directory (single file or sharded index), or a single
 * .safetensors file when path names a file. Maps every file. */
int ms_checkpoint_open(const char *path, ms_checkpoint *ck, ms_err *err);
void ms_checkpoint_close(ms_checkpoint *ck);
/* The same tables from the headers alone (the plan before a download): each file's first
 * 8 bytes and its header are read (pread), never the payload, so a shard may be cut short
 * after its header (or be the header alone). Each file's "mapping" is an anonymous read-only
 * reservation of the size its header declares (MAP_NORESERVE: reading it gives zeros and
 * holds no memory), so tensor data pointers are distinct and valid to read (as zeros). */
int ms_checkpoint_open_headers(const char *path, ms_checkpoint *ck, ms_err *err);
/* A headers-only checkpoint of the n tensors ts (names malloc'd; dtype, shape, nbytes set),
 * laid out one after another in one pseudo-file named `where`; takes ownership of ts. */
int ms_checkpoint_from_tensors(ms_checkpoint *ck, const char *dir, const char *where, ms_tensor *ts, int n,
                               ms_err *err);
/* Tensor by exact name, NULL when absent. */
const ms_tensor *ms_checkpoint_find(const ms_checkpoint *ck, const char *name);

/* Describe a tensor's shape as "[a, b, c]" into buf. */
const char *ms_shape_str(const int64_t *shape, int ndim, char *buf, size_t cap);

#endif
