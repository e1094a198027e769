/* model.h — a loaded model: config + checkpoint + bound weight views.
 *
 * Matrices are ms_qmat views into the mapped checkpoint (stored dtype);
 * only 1-D vectors (norms, biases) are F32 copies. Routed experts are bound
 * too (views + their tensors' locations) so the resident expert source can
 * serve them and a streaming source can find their bytes. */
#ifndef MS_MODEL_H
#define MS_MODEL_H

#include "core/expert_source.h"
#include "io/safetensors.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/config.h"
#include "ops/dsa.h"
#include "core/backend.h"
#include "util/progress.h"

/* Per expert: gate.weight, gate.scale, gate.zero_point, up.(the same three), down.(the same
 * three); zero_point only for asymmetric INT4. */
#define MS_EXPERT_TENSORS 9

/* One Attention Residuals mixing point (Kimi K3): the depth-softmax score of
 * a candidate v is sum(rmsnorm(v) * norm * proj). F32 copies. */
typedef struct ms_attn_res {
    float *norm;                                 /* [hidden] RMSNorm weight */
    float *proj;                                 /* [hidden] the [1, hidden] Linear weight */
} ms_attn_res;

typedef struct ms_layer {
    float *attn_norm, *ffn_norm;                 /* [hidden] */
    float *attn_post_norm, *ffn_post_norm;       /* [hidden] sublayer output norms (cfg post_norm) */
    float *attn_norm_b, *ffn_norm_b;             /* [hidden] LayerNorm biases (cfg layernorm), optional */
    /* GQA: wq [H*hd, hidden], wk/wv [KV*hd, hidden], wo [hidden, H*hd] (also MLA's o_proj) */
    ms_qmat wq, wk, wv, wo;
    float *bq, *bk, *bv;                         /* optional biases */
    float *q_norm, *k_norm;                      /* [hd] (per head) or [H*hd] (full) */
    float *bo;                                   /* optional o_proj bias [hidden] */
    float *sinks;                                /* optional per-head sink logits [H] */
    /* MLA */
    ms_qmat q_a, q_b;                            /* [q_lora, hidden], [H*qk_head, q_lora]; or wq when q_lora_rank 0 */
    ms_qmat kv_a;                                /* [kv_lora + rope, hidden] */
    ms_qmat kv_b;                                /* [H*(nope+v), kv_lora] */
    float *q_a_norm, *kv_a_norm;                 /* [q_lora], [kv_lora] */
    ms_qmat mla_gate;                            /* [H*v, hidden] output gate g_proj (cfg mla_out_gate) */
    ms_attn_res attn_res, mlp_res;               /* Attention Residuals before each sublayer (cfg attn_res_block) */
    /* KDA (linear attention) */
    ms_kda_weights kda;
    /* gated DeltaNet (linear attention, MS_ATTN_GDN) */
    ms_gdn_weights gdn;
    /* DSA lightning indexer (layer_dsa 1) */
    ms_dsa_weights dsa;
    /* mHC around the attention and the feed-forward (hc_mult > 1): fn [(2+hc)*hc, hc*hidden], base, scale [3] */
    ms_qmat hc_attn_fn, hc_ffn_fn;
    float *hc_attn_base, *hc_attn_scale, *hc_ffn_base, *hc_ffn_scale;
    /* compressed attention (cfg layer_attn MS_ATTN_COMPRESSED); q_a, q_b, q_a_norm, sinks above */
    ms_cattn_weights ca;
    int32_t *hash_ids;                           /* [vocab, top_k] expert ids of a hash-routed MoE layer */
    /* dense MLP (MS_MLP_DENSE) or shared experts (MoE layers, shared_inter > 0) */
    ms_qmat gate, up, down;
    /* MoE */
    ms_qmat router;                              /* [n_experts, hidden] */
    float *router_bias;                          /* [n_experts] e_score_correction_bias */
    float *router_lbias;                         /* [n_experts] router Linear bias (gpt-oss) */
    ms_qmat shared_gate;                         /* [1, hidden] shared_expert_gate (cfg shared_expert_gate) */
    void *owned;                                 /* memory the layer's views point into, if any (freed with the model) */
    /* latent routed experts (cfg latent_moe): experts run at width expert_hidden */
    ms_qmat lat_down, lat_up;                    /* [expert_hidden, hidden], [hidden, expert_hidden] */
    float *lat_norm;                             /* [expert_hidden] routed_expert_norm (cfg latent_moe_norm) */
    ms_expert_view *experts;                     /* [n_experts] resident views */
    const ms_tensor **expert_tensors;            /* [n_experts * MS_EXPERT_TENSORS], NULL entries when absent */
} ms_layer;

typedef struct ms_model {
    ms_config cfg;
    ms_checkpoint ck;
    ms_qmat embed;                               /* [vocab, hidden] */
    ms_qmat lm_head;                             /* [vocab, hidden] (the embedding when tied) */
    float *final_norm;                           /* [hidden] */
    float *final_norm_b;                         /* [hidden] its LayerNorm bias (cfg layernorm), optional */
    float *lm_head_b;                            /* [vocab] lm_head bias (PhiMoE lm_head_bias), optional */
    ms_attn_res out_res;
    ms_qmat hc_head_fn;                          /* [hc, hc*hidden] learned stream collapse (cfg hc_head_weighted) */
    float *hc_head_base, *hc_head_scale;         /* [hc], [1] */                         /* Attention Residuals before the final norm */
    ms_layer *layers;                            /* [n_layers] */
    uint64_t static_bytes, expert_bytes;         /* weight bytes by tier */
    void **allocs;                               /* F32 vector copies made while binding (freed with the model) */
    size_t *alloc_bytes;                         /* [n_allocs] their sizes (ms_model_place finds a vector's length here) */
    uint8_t *tensor_bound;                       /* [ck.n_tensors] 1 for every tensor the architecture bound,
                                                  * 2 once ms_model_requant_static replaced it (bytes no longer read) */
    uint64_t static_copied;                      /* bytes of the static tier moved into anonymous memory (ms_model_static_read) */
    int n_allocs;
    void **quant_allocs;                         /* requantized static matrices (ms_model_requant_static) */
    int n_quant_allocs;
    void *static_store_map;                      /* the packed static tier's mapping (ms_static_store_open) */
    uint64_t static_store_len;
    int static_dtype;                            /* ms_static_dtype the static tier is held in */
    uint64_t static_requant_bytes;               /* bytes of the requantized copies */
    double requant_rel_rms;                      /* the largest ||W_q - W|| / ||W|| of a requantized matrix */
    int requant_uses;                            /* requantized matrix views (a tied head counts twice) */
} ms_model;

/* Load DIR: config.json → description → checkpoint → bound weights. Any
 * missing or mis-shaped tensor fails with expected vs found. */
int ms_model_load(const char *dir, ms_model *m, ms_err *err);
void ms_model_free(ms_model *m);

/* The model's tables without its weights, for the memory plan before a download: DIR needs
 * config.json; when it also holds model.safetensors(.index.json) and the shards' headers
 * (a shard may be its header alone), the tensors come from the headers (ms_checkpoint_open_headers,
 * no payload read: *source HEADERS); otherwise from the architecture's specs with the dtypes the
 * config implies (model.c spec_tensors: BF16, routed experts in the config's format; *source
 * CONFIG). The weights read as zeros; the byte counts (static_bytes, expert_bytes, and
 * ms_model_static_bytes_as) are those of the real checkpoint. Not for running. */
typedef enum { MS_SOURCE_FULL = 0, MS_SOURCE_HEADERS = 1, MS_SOURCE_CONFIG = 2 } ms_model_source;
int ms_model_load_meta(const char *dir, ms_model *m, ms_model_source *source, ms_err *err);

/* Collect the tensor specs of a config (no checkpoint): for synth. Caller frees *specs. */
int ms_model_specs(const ms_config *c, ms_tensor_spec **specs, int *n, ms_err *err);

/* Bytes of weights one decoded token reads: static tier + top_k experts per MoE layer. */
uint64_t ms_model_active_bytes(const ms_model *m);

/* How the static tier (every bound tensor that is not a routed expert's) is
 * served: from the checkpoint's page-cache mapping (MMAP), or read once into
 * anonymous memory advised for 2 MiB huge pages (READ, ms_model_static_read). */
typedef enum { MS_STATIC_MMAP = 0, MS_STATIC_READ = 1 } ms_static_load;
/* Parse "mmap" | "read"; MS_ERR_ARG naming the value otherwise. */
int ms_static_load_parse(const char *s, ms_static_load *out, ms_err *err);

/* Bytes ms_model_static_read would copy: the static tier's tensors, each
 * file's ranges merged and widened to whole 4 KiB pages (a page shared with a
 * routed expert's bytes is copied too). The memory plan's static line in READ
 * mode. */
uint64_t ms_model_static_read_bytes(const ms_model *m);

/* Move the static tier out of the page-cache mapping: each range is copied
 * byte for byte (stored dtype, no conversion) into anonymous memory, advised
 * MADV_HUGEPAGE and placed congruent to its address modulo 2 MiB, made
 * read-only, then moved (mremap) over the very addresses it was mapped at, so
 * every bound view stays valid and no mapping page of those ranges stays in
 * the process; the file's page-cache pages of the ranges are then dropped
 * (POSIX_FADV_DONTNEED), so the bytes are held once. Works in chunks of at
 * most 64 MiB (the transient extra). The memory goes with the mapping when the
 * model is freed. Refuses (MS_ERR_NOMEM, naming the sizes) when the bytes
 * exceed MemAvailable of /proc/meminfo, before copying anything; MS_ERR_IO
 * naming the range when an mmap/mremap fails (ranges already moved stay moved:
 * they hold the same bytes). Call before any other thread reads the model.
 * Sets m->static_copied; calling it again is a no-op. */
int ms_model_static_read(ms_model *m, ms_err *err);
/* The same, reporting the bytes moved so far to progress (util/progress.h; NULL: none). */
int ms_model_static_read_progress(ms_model *m, const ms_progress *progress, ms_err *err);

/* The static tier's matrix dtype (--static-dtype): STORED keeps the checkpoint's;
 * Q8 and FP8 requantize the BF16/F16 matrices of attention (GQA, MLA, and the KDA and
 * gated-DeltaNet projections), dense MLPs, shared experts, latent-MoE projections, the
 * embedding and the head into blocks of
 * MS_Q8_BLOCK along a row with BF16 scales (core/qmat.h: Q8 int8, or FP8 E4M3 with
 * ms_quant_fp8_row's scales). Never requantized: vectors (norms, biases), routers and
 * the shared-expert gate, routed experts, F32 and already-quantized matrices, the short
 * convolutions and parameter vectors of KDA / gated DeltaNet, and the DSA indexer,
 * compressed-attention and mHC weights (host code that reads their dtype itself). */
typedef enum { MS_STATIC_STORED = 0, MS_STATIC_Q8 = 1, MS_STATIC_FP8 = 2 } ms_static_dtype;
/* Parse "stored" | "q8" | "fp8"; MS_ERR_ARG naming the value otherwise. */
int ms_static_dtype_parse(const char *s, ms_static_dtype *out, ms_err *err);
const char *ms_static_dtype_name(ms_static_dtype d);
/* Bytes of the static tier with its matrices in dtype d (m->static_bytes for STORED, or when
 * m is already requantized to d). Counts a matrix viewed twice (a tied head) once. */
uint64_t ms_model_static_bytes_as(const ms_model *m, ms_static_dtype d);
/* Bytes of one [rows, cols] matrix requantized to d (Q8 / FP8; 0 for STORED). */
uint64_t ms_static_dtype_matrix_bytes(ms_static_dtype d, int64_t rows, int64_t cols);
/* Requantize the static tier to d (no-op for STORED): the matrices' rows in tasks of at
 * most 4 MiB (or one row) run on pool (NULL: the caller), each task's stored bytes read
 * with pread into its thread's buffer, never through the mapping, and then dropped from
 * the page cache (POSIX_FADV_DONTNEED), so the process holds the requantized copy and at
 * most one chunk of the source per thread. The result does not depend on the pool. Views
 * of the same bytes (a tied head) share one copy. Updates m->static_bytes and marks the
 * replaced tensors 2 in tensor_bound (ms_model_static_read no longer copies them).
 * Errors: MS_ERR_NOMEM, MS_ERR_IO naming the tensor; MS_ERR_ARG when m is already held
 * in another non-stored dtype. */
int ms_model_requant_static(ms_model *m, ms_static_dtype d, struct ms_pool *pool, ms_err *err);

/* The static store: the static tier as ms_model_requant_static makes it, in one file
 * (MS_STATIC_STORE_FILE in a directory), bound to the checkpoint it was made from.
 * ms_static_store_write writes m's requantized matrices (m requantized, not from a store)
 * atomically: a header (dtype, the view list's size), per checkpoint file its name, size,
 * SHA-256 of its SafeTensors header and of a data sample (as the expert store binds), per
 * matrix its view index, role, shape and CRC32C, then the matrices 4 KiB-aligned in their
 * memory layout. ms_static_store_open maps it and points m's views at it (no
 * requantization; what ms_model_requant_static(m, dtype) would have set, bit for bit):
 * refused naming what differs when the store was packed from another checkpoint (file
 * count, names, sizes, header or sample hashes: MS_ERR_MISMATCH), for another model layout
 * (matrix list), for want != STORED other than its dtype (MS_ERR_ARG), or when corrupt (bad
 * magic, version, extents, header or matrix CRC32C: MS_ERR_FORMAT). Every matrix's CRC is
 * checked at open, which reads the store once (its pages then serve the static tier). */
#define MS_STATIC_STORE_FILE "static-tier.bin"
int ms_static_store_write(ms_model *m, const char *dir, ms_err *err);
int ms_static_store_open(ms_model *m, const char *dir, ms_static_dtype want, ms_err *err);

/* The model's weights placed on backend be (core/backend.h place_qmat / place_vec):
 * *placed is a shallow copy of m (config, checkpoint, host tables) whose matrices,
 * F32 vectors and routed experts' views (layers[l].experts, biases included) are
 * be's placed versions, so an expert source built over it hands out views in be's
 * memory. A tied lm_head is placed once; a vector used twice likewise. The weights
 * belong to be (until be is destroyed); free the copy with ms_model_placed_free
 * (never ms_model_free), before m. Not placed (host views): the KDA, gated
 * DeltaNet, DSA, compressed-attention and mHC weights (no device backend runs
 * those ops yet). Errors: the backend's (MS_ERR_NOMEM, MS_ERR_UNSUPPORTED for a
 * dtype it cannot hold), wrapped with the tensor's name and layer. skip_experts: the
 * routed experts are not placed (layers[l].experts NULL): an expert source brings them
 * (engine/device_experts.h streams them into a device slot arena). */
int ms_model_place(const ms_model *m, ms_backend *be, int skip_experts, ms_model **placed, ms_err *err);
void ms_model_placed_free(ms_model *placed);

/* A part of a multi-device placement (engine/placement.h): the static weights of layers
 * [layer_begin, layer_end), the embedding (embed), the head side (head: final norm, lm_head,
 * output AttnRes, hyper head; a tied lm_head placed as its own copy unless embed is placed
 * too), and the routed experts: with expert_devs ([n_layers * n_experts]) those of every layer
 * whose bit `dev` is set (the others' views zeroed), else those of the part's own layers.
 * Layers outside the range keep the host model's views (never run on be). ms_model_place is
 * the part of everything. Errors as ms_model_place. */
typedef struct ms_place_part {
    int layer_begin, layer_end;
    int embed, head;
    const uint32_t *expert_devs;
    int dev;
    int skip_experts;
} ms_place_part;
int ms_model_place_part(const ms_model *m, ms_backend *be, const ms_place_part *part, ms_model **placed, ms_err *err);
/* What ms_model_place would put on a device, in bytes (the multi-device placement's input):
 * per layer its static weights (layer_static[n_layers]) and one routed expert of it
 * (expert_bytes[n_layers], 0 for a layer without), the embedding, the head side, and whether
 * lm_head is the embedding (*tied). */
void ms_model_place_bytes(const ms_model *m, uint64_t *layer_static, uint64_t *expert_bytes, uint64_t *embed_bytes,
                          uint64_t *head_bytes, int *tied);

#endif
