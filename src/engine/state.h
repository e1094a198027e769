/* state.h — exact causal-state snapshots, state files and rollback of an
 * engine's sequence (see docs/state.md).
 *
 * The causal state of an engine is everything a later forward reads from the
 * earlier ones: per-layer GQA k/v caches and MLA latent caches (the n_past rows
 * in use), KDA / gated-DeltaNet conv tails and recurrent states (whole), DSA
 * index-key caches with their KPool gates / pooled keys, recorded tied top-k
 * selections and token ids, compressed-attention key windows, raw compressor
 * rings and closed entries, and n_past. Activations, mHC streams and
 * Attention-Residual block states live only within one forward and are not
 * part of it.
 *
 * Guarantee: after ms_engine_restore (or ms_engine_state_load) of a state taken
 * at n_past, forwarding tokens gives bit-identical logits to the engine the
 * state was taken from forwarding the same tokens in the same pieces. */
#ifndef MS_STATE_H
#define MS_STATE_H

#include <stdint.h>

#include "engine/engine.h"
#include "util/err.h"

/* ---- in-memory snapshots ---- */

typedef struct ms_snapshot ms_snapshot;

/* Copy e's causal state at its current n_past into a new snapshot (*out,
 * owned by the caller, free with ms_engine_snapshot_free). Only the used part
 * is copied: n_past rows of every cache, whole recurrent states. e is not
 * changed. Errors: MS_ERR_NOMEM (naming the bytes). */
int ms_engine_snapshot(ms_engine *e, ms_snapshot **out, ms_err *err);

/* Put a snapshot back: e's causal state becomes exactly the snapshot's
 * (n_past included). snap must come from an engine of the same model (any
 * max_ctx / max_batch / thread count); the snapshot is not consumed and can
 * be restored any number of times, into any such engine. Everything is
 * checked before e is touched: on error e is unchanged. Errors: MS_ERR_LIMIT
 * (e's context is smaller than the snapshot's n_past), MS_ERR_MISMATCH (the
 * snapshot's sections do not match this engine's state: another model),
 * MS_ERR_NOMEM. */
int ms_engine_restore(ms_engine *e, const ms_snapshot *snap, ms_err *err);

void ms_engine_snapshot_free(ms_snapshot *snap);
/* The n_past the snapshot was taken at. */
int ms_engine_snapshot_n_past(const ms_snapshot *snap);
/* Bytes of state the snapshot holds (payload, without bookkeeping). */
uint64_t ms_engine_snapshot_bytes(const ms_snapshot *snap);

/* ---- rollback ---- */

/* MS_OK when e's state can be rolled back to an earlier position (only
 * per-position caches: GQA k/v, MLA latents, and DSA keys/ties of models
 * without recurrent layers); else MS_ERR_UNSUPPORTED with why naming the first
 * part that cannot (a KDA / gated-DeltaNet recurrent state, compressed-attention
 * rings...). why may be NULL. e is not changed. */
int ms_engine_truncatable(const ms_engine *e, ms_err *why);
/* 1 when ms_engine_truncatable(e) is MS_OK, else 0. */
int ms_engine_can_truncate(const ms_engine *e);

/* Roll e back to its first n_past tokens (0 <= n_past <= current): the state
 * becomes exactly what forwarding only those tokens left (forwarding more then
 * matches an engine fed the same pieces without the detour). n_past 0 is a
 * reset and works for every model. Errors: MS_ERR_ARG (n_past out of range),
 * MS_ERR_UNSUPPORTED (see ms_engine_truncatable; e unchanged: restore a
 * snapshot taken at the prefix instead). */
int ms_engine_truncate(ms_engine *e, int n_past, ms_err *err);

/* ---- state files ---- */

#define MS_STATE_MAGIC "MSSTATE\0"
#define MS_STATE_VERSION 1u
#define MS_STATE_NAME_MAX 48

/* The identity of a model: SHA-256 over its config.json bytes and its
 * tensor table (names sorted, dtype, shape). A state file records it; a file
 * from another model is refused. Errors: MS_ERR_IO (config.json unreadable),
 * MS_ERR_NOMEM. */
int ms_model_identity(const ms_model *m, uint8_t id[32], ms_err *err);

/* Write e's state as a state file at path, atomically (temp file, fsync,
 * rename): tokens[0..n_tokens) are the token ids the state represents and
 * n_tokens must equal ms_engine_n_past(e). Errors: MS_ERR_ARG, MS_ERR_IO,
 * MS_ERR_NOMEM. e is not changed. */
int ms_engine_state_save(ms_engine *e, const char *path, const int32_t *tokens, int n_tokens, ms_err *err);

/* The same from a snapshot (no engine needed: a writer thread saves while the engine
 * serves the next request): model_id is the snapshot's model (ms_model_identity),
 * saved_ctx informational. Files are created 0600. */
int ms_snapshot_save_file(const ms_snapshot *snap, const uint8_t model_id[32], int saved_ctx, const char *path,
                          const int32_t *tokens, int n_tokens, ms_err *err);

/* Load a state file into e. Everything is validated before e is touched
 * (structure, bounds, section table, every section's CRC32C, the model
 * identity, e's context capacity, each section against e's state layout): on
 * any error e is exactly as it was. On success, if tokens is not NULL, *tokens
 * (malloc'd, caller frees) and *n_tokens receive the token ids the state
 * represents (n_tokens == the new n_past). Errors: MS_ERR_IO, MS_ERR_FORMAT
 * (malformed, naming the field), MS_ERR_MISMATCH (checksum, another model),
 * MS_ERR_LIMIT (context too small), MS_ERR_UNSUPPORTED (version), MS_ERR_NOMEM. */
int ms_engine_state_load(ms_engine *e, const char *path, int32_t **tokens, int *n_tokens, ms_err *err);

/* The same from a whole state-file image buf[0..len) (borrowed; where names it
 * in messages). */
int ms_engine_state_load_buffer(ms_engine *e, const uint8_t *buf, uint64_t len, const char *where, int32_t **tokens,
                                int *n_tokens, ms_err *err);

/* One section of a state file. */
typedef struct ms_state_section {
    char name[MS_STATE_NAME_MAX]; /* NUL-terminated */
    uint64_t offset, size;        /* byte range in the file */
    uint32_t crc32c;              /* of those bytes */
} ms_state_section;

/* A state file's header. */
typedef struct ms_state_info {
    uint32_t version;
    uint8_t model_id[32];
    int64_t n_past;      /* positions the state holds */
    int64_t ctx_needed;  /* the smallest engine context it loads into */
    int64_t saved_ctx;   /* the context of the engine that saved it (informational) */
    int64_t n_tokens;
    int32_t *tokens;     /* [n_tokens] malloc'd copy */
    int n_sections;
    ms_state_section *sections; /* [n_sections] malloc'd */
    uint64_t header_bytes, file_bytes;
} ms_state_info;

/* Parse and validate a whole state file image buf[0..len) into info (free with
 * ms_state_info_free): magic, version, sizes, header CRC32C, token ids >= 0,
 * the section table (names, 8-byte aligned ranges in order, inside the file,
 * no overlap, unique names) and every section's CRC32C. where names the file in
 * messages. Errors: MS_ERR_FORMAT, MS_ERR_MISMATCH (checksums),
 * MS_ERR_UNSUPPORTED (version), MS_ERR_NOMEM; info is zeroed on error. */
int ms_state_parse(const uint8_t *buf, uint64_t len, const char *where, ms_state_info *info, ms_err *err);
void ms_state_info_free(ms_state_info *info);
/* Map path and ms_state_parse it. */
int ms_state_inspect(const char *path, ms_state_info *info, ms_err *err);

#endif
