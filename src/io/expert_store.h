/* expert_store.h — where every routed expert's bytes live.
 *
 * An expert store lists, for every MoE layer and expert, the extents
 * (file, offset, length) of all the expert's tensors ("roles": gate, up,
 * down, their scales and biases), with each role's dtype and per-expert
 * shape. It comes either from the original checkpoint (found from the
 * SafeTensors headers through an ms_expert_naming the caller supplies) or
 * from a packed store written by ms_expert_pack: experts rewritten
 * expert-major, one contiguous 4 KiB-aligned record per expert, one file per
 * layer (optionally spread over several directories), and a manifest that
 * binds the store to its source checkpoint (file sizes, SHA-256 of each
 * SafeTensors header) and carries a CRC32C per expert.
 *
 * Reading an expert: its extents are grouped into "pieces" (adjacent tensors
 * of one file merged); piece p is read into buf + piece_base[p] (4 KiB
 * aligned, see ms_expert_place), the role's bytes then start at
 * buf + piece_base + (piece offset % 4096) + role_off. */
#ifndef MS_EXPERT_STORE_H
#define MS_EXPERT_STORE_H

#include <stdint.h>

#include "core/expert_source.h"
#include "io/safetensors.h"
#include "util/err.h"
#include "util/progress.h"

#define MS_EXPERT_MAX_ROLES 12
#define MS_EXPERT_ROLE_NAME 24

/* How one expert tensor is named in a checkpoint. */
typedef struct ms_expert_role_spec {
    char name[MS_EXPERT_ROLE_NAME]; /* the role: "gate", "up", "down", "gate_scale", "down_bias", ... */
    char pattern[200];  /* per-expert: two %d (layer, expert), e.g. "model.layers.%d.mlp.experts.%d.up_proj.weight";
                           fused: one %d (layer), the tensor's dim 0 indexes experts */
    int fused;
    int optional;       /* may be absent (then absent for every expert of the layer) */
} ms_expert_role_spec;

typedef struct ms_expert_naming {
    int n_roles;
    ms_expert_role_spec roles[MS_EXPERT_MAX_ROLES];
} ms_expert_naming;

/* Append a role to a naming; MS_ERR_ARG for a bad pattern (wrong number of %d, any
 * other conversion), too many roles, or a name too long. */
int ms_expert_naming_add(ms_expert_naming *nm, const char *name, const char *pattern, int fused, int optional,
                         ms_err *err);

/* Find which known naming a checkpoint uses (DeepSeek/Qwen/GLM "mlp.experts.%d.{gate,up,down}_proj"
 * with optional FP8 weight_scale_inv, compressed-tensors weight_packed/weight_scale,
 * Mixtral/MiniMax "block_sparse_moe.experts.%d.w1/w3/w2", DeepSeek-V4 "ffn.experts.%d.w1/w3/w2", gpt-oss fused gate_up_proj/down_proj
 * (BF16 or MXFP4 _blocks/_scales, biases) under "model.layers", "model.language_model.layers"
 * or "language_model.model.layers"). MS_ERR_UNSUPPORTED when none matches. The lead's per-
 * architecture model description may instead build its own naming and pass it on. */
int ms_expert_naming_detect(const ms_checkpoint *ck, ms_expert_naming *nm, ms_err *err);

typedef struct ms_expert_role_info {
    char name[MS_EXPERT_ROLE_NAME];
    int present;
    ms_dtype dtype;
    int ndim;
    int64_t shape[MS_MAX_DIMS]; /* one expert's slice (fused: without dim 0) */
    uint64_t nbytes;
} ms_expert_role_info;

typedef struct ms_expert_loc {
    int n_pieces;
    ms_extent piece[MS_EXPERT_MAX_ROLES];
    int8_t role_piece[MS_EXPERT_MAX_ROLES]; /* -1 when the role is absent */
    uint64_t role_off[MS_EXPERT_MAX_ROLES]; /* offset of the role's bytes inside its piece */
    uint32_t crc32c;                         /* packed stores: CRC32C of piece 0 */
} ms_expert_loc;

typedef struct ms_expert_store {
    int packed;           /* 1: files are a packed store's layer files, each expert one piece with a CRC */
    int n_files;
    char **paths;         /* files the extents index into (owned) */
    int n_layers;         /* MoE layers */
    int *layer_id;        /* [n_layers] model layer index of each */
    int n_model_layers;   /* size of store_layer */
    int *store_layer;     /* [n_model_layers] index into the store's layers, -1 for a layer without experts */
    int n_experts;
    int n_roles;
    ms_expert_role_info *roles; /* [n_layers * n_roles] */
    ms_expert_loc *loc;         /* [n_layers * n_experts] */
    uint64_t buf_bytes;   /* aligned buffer one expert needs, max over all experts (a cache slot) */
    uint64_t data_bytes;  /* largest expert's tensor bytes */
    uint64_t total_read_bytes; /* bytes read to load every expert once */
} ms_expert_store;

/* The experts of checkpoint ck under naming nm. Layers probed: 0..n_model_layers-1 (a layer
 * has experts when its first non-optional role exists). n_experts 0: counted from the
 * checkpoint (must be equal in every layer). Errors name the layer/expert/tensor:
 * MS_ERR_SHAPE for a missing tensor or experts of one layer that differ in dtype/shape,
 * MS_ERR_FORMAT for a fused tensor whose dim 0 is not the expert count,
 * MS_ERR_UNSUPPORTED when no layer has experts. */
int ms_expert_store_from_checkpoint(const ms_checkpoint *ck, const ms_expert_naming *nm, int n_model_layers,
                                    int n_experts, ms_expert_store *st, ms_err *err);
void ms_expert_store_free(ms_expert_store *st);

/* Caller-supplied extents: the bytes of role `role` of expert `expert` of model layer
 * `layer`. Return 1 and fill *ext when present, 0 when absent, negative (with err) on error. */
typedef int (*ms_extent_fn)(void *ctx, int layer, int expert, int role, ms_extent *ext, ms_err *err);

/* A store over ck's files from caller-given extents (e.g. the engine's bound expert views):
 * layers L < n_model_layers with is_moe[L] != 0, n_experts each, n_roles roles named
 * role_names (recorded as U8 [nbytes]). A role present for expert 0 of a layer must be
 * present with the same length for every expert of that layer. Errors: MS_ERR_ARG,
 * MS_ERR_SHAPE naming layer/expert/role, MS_ERR_FORMAT for an extent outside its file. */
int ms_expert_store_from_extents(const ms_checkpoint *ck, int n_model_layers, const uint8_t *is_moe, int n_experts,
                                 int n_roles, const char *const *role_names, ms_extent_fn fn, void *ctx,
                                 ms_expert_store *st, ms_err *err);

/* Where the pieces of expert (store layer li, expert e) go in a buffer of st->buf_bytes
 * bytes: piece_base[p] (4 KiB aligned offsets) and, for each role, the offset of its
 * first byte in the buffer (role_at[r], UINT64_MAX when absent). */
void ms_expert_place(const ms_expert_store *st, int li, int e, uint64_t *piece_base, uint64_t *role_at);

static inline const ms_expert_loc *ms_expert_store_loc(const ms_expert_store *st, int li, int e) {
    return &st->loc[(int64_t)li * st->n_experts + e];
}
static inline const ms_expert_role_info *ms_expert_store_role(const ms_expert_store *st, int li, int r) {
    return &st->roles[li * st->n_roles + r];
}

/* ---- packed stores ---- */

#define MS_STORE_MANIFEST "manifest.json"
#define MS_STORE_MAX_MANIFEST (256u << 20)

typedef struct ms_pack_stats {
    uint64_t bytes_written;
    int n_files;
} ms_pack_stats;

/* Rewrite the experts of `src` (a store from checkpoint ck) expert-major into out_dir:
 * per-layer files "experts-L%04d.bin" placed round-robin in dirs[0..n_dirs) (out_dir when
 * n_dirs is 0), each record 4 KiB aligned, roles at 64-byte aligned offsets, then
 * out_dir/manifest.json written atomically. Layer files are written to a temporary
 * name, fsync'd and renamed. Errors: MS_ERR_IO naming the file. */
int ms_expert_pack(const ms_checkpoint *ck, const ms_expert_store *src, const char *out_dir,
                   const char *const *dirs, int n_dirs, ms_pack_stats *stats, ms_err *err);
/* The same, reporting the bytes of records written so far to progress (util/progress.h; NULL: none). */
int ms_expert_pack_progress(const ms_checkpoint *ck, const ms_expert_store *src, const char *out_dir,
                            const char *const *dirs, int n_dirs, const ms_progress *progress, ms_pack_stats *stats,
                            ms_err *err);

/* A parsed manifest: the store (paths resolved against store_dir) plus what it binds to. */
typedef struct ms_store_source_file {
    char name[256];
    uint64_t size;
    char sha256[65];      /* of the SafeTensors header */
    char data_sha256[65]; /* of a sample of the data (ms_checkpoint_data_sample_sha256) */
} ms_store_source_file;

typedef struct ms_store_manifest {
    int n_src;
    ms_store_source_file *src;
    ms_expert_store st;
} ms_store_manifest;

/* Parse manifest text (len bytes; `where` names it in messages). Pure: touches no files.
 * Validates every field with bounds (counts, offsets inside records, records inside the
 * stride, dtype x shape == nbytes). Errors: MS_ERR_FORMAT naming the key. */
int ms_store_manifest_parse(const char *text, size_t len, const char *where, const char *store_dir,
                            ms_store_manifest *m, ms_err *err);
void ms_store_manifest_free(ms_store_manifest *m);

/* Open the packed store in store_dir for checkpoint ck, whose experts (from the checkpoint
 * itself) are `ref`. Refuses (MS_ERR_MISMATCH, naming the file and what differs) a store
 * packed from another checkpoint (file names, sizes, header SHA-256) or whose layers,
 * roles, dtypes or shapes differ from ref; MS_ERR_IO for a missing or truncated layer file. */
int ms_expert_store_open_packed(const char *store_dir, const ms_checkpoint *ck, const ms_expert_store *ref,
                                ms_expert_store *st, ms_err *err);

/* SHA-256 (hex) of the SafeTensors header (first data_start bytes) of checkpoint file i. */
int ms_checkpoint_header_sha256(const ms_checkpoint *ck, int i, char hex[65], ms_err *err);
/* SHA-256 (hex) of a sample of checkpoint file i's data: 16 blocks of 4 KiB (or less)
 * evenly spaced over the data section, so a re-trained checkpoint with the same header
 * and sizes is told apart without reading it all. */
int ms_checkpoint_data_sample_sha256(const ms_checkpoint *ck, int i, char hex[65], ms_err *err);

#endif
