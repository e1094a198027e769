/* arch.h — architecture descriptors and the weight binder.
 *
 * An architecture file (arch_*.c) says three things, as data as far as C
 * allows: how its config.json maps onto ms_config (configure), and which
 * tensors, with which names and shapes, make up each block (bind). The same
 * bind function drives loading (names looked up in the checkpoint, shapes
 * checked, FP8 scales attached) and `moonshine synth` (the binder records
 * every tensor spec instead). */
#ifndef MS_ARCH_H
#define MS_ARCH_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "io/safetensors.h"
#include "model/config.h"
#include "ops/ops.h"

struct ms_model;
struct ms_attn_res;

/* What a bound tensor is, for synth's choice of dtype and scale. */
typedef enum {
    MS_W_MATRIX = 1,   /* a Linear weight of the static tier */
    MS_W_EXPERT = 2,   /* a routed expert's Linear weight */
    MS_W_EMBED = 3,    /* embedding / lm_head (never quantized) */
    MS_W_NORM = 4,     /* norm weight (synth: near 1) */
    MS_W_VECTOR = 5,   /* bias, router bias, other small vectors */
    MS_W_ROUTER = 6,   /* router weight (kept in the trunk dtype) */
} ms_wkind;

typedef struct ms_tensor_spec {
    char name[160];
    int ndim;
    int64_t shape[4];
    ms_wkind kind;
} ms_tensor_spec;

typedef struct ms_binder {
    const ms_checkpoint *ck;   /* NULL in spec mode */
    const ms_config *cfg;
    /* spec mode: every bound tensor is appended here */
    ms_tensor_spec *specs;
    int n_specs, cap_specs;
    ms_err *err;
    int rc;                    /* first failure; later binds are no-ops */
    char prefix[96];           /* prepended to every name (e.g. "model.language_model.") */
    uint64_t bound_bytes;      /* load mode: bytes of every tensor bound so far */
    uint8_t *bound;            /* load mode, optional: [ck->n_tensors], set to 1 for every tensor bound */
    void **allocs;             /* load mode: every buffer ms_bind_vec allocated (handed to the model) */
    size_t *alloc_bytes;       /* their sizes */
    int n_allocs, cap_allocs;
} ms_binder;

/* Bind a Linear weight "NAME.weight" [rows, cols] (NAME from fmt). For F8_E4M3
 * weights, "NAME.weight_scale_inv" [ceil(rows/b0), ceil(cols/b1)] is required.
 * Without NAME.weight, compressed-tensors MXFP4 is accepted: "NAME.weight_packed"
 * U8 [rows, cols/2] + "NAME.weight_scale" U8 [rows, cols/32], bound as an F4 view;
 * or compressed-tensors pack-quantized INT4: "NAME.weight_packed" I32 [rows, cols/8]
 * + "NAME.weight_scale" [rows, cols/group] + "NAME.weight_shape", an I4 view.
 * On failure records the first error in b and returns it. */
int ms_bind_mat(ms_binder *b, ms_qmat *out, ms_wkind kind, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Bind a 1-D tensor "NAME" of n elements as a malloc'd F32 copy (small vectors
 * only: norms, biases). opt: absent is fine (*out = NULL). */
int ms_bind_vec(ms_binder *b, float **out, ms_wkind kind, int64_t n, int opt, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Bind tensor "NAME" (exact name) of shape[0..ndim) as a [rows, cols] view in
 * its stored dtype (F32, BF16 or F16; rows*cols must equal the element count):
 * conv kernels, per-head parameters. opt: absent is fine (out->data NULL). */
int ms_bind_tensor(ms_binder *b, ms_qmat *out, ms_wkind kind, int ndim, const int64_t *shape, int64_t rows,
                   int64_t cols, int opt, const char *fmt, ...) __attribute__((format(printf, 9, 10)));
/* A buffer of `bytes` the model owns (freed with it), e.g. an F32 copy of a
 * small tensor. NULL (and b->rc set) when out of memory. */
void *ms_bind_alloc(ms_binder *b, size_t bytes);
/* Load mode: the tensor of exactly this (full) name and shape, counted as bound;
 * NULL with the first error recorded in b (missing, or expected vs found shape). */
const ms_tensor *ms_bind_find(ms_binder *b, const char *name, int ndim, const int64_t *shape);
/* True when a tensor exists (always false in spec mode). */
int ms_bind_has(ms_binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef struct ms_arch {
    const char *model_type;
    /* Fill family fields and the per-layer schedule; j is the config object. */
    int (*configure)(const cJSON *j, ms_config *c, const char *where, ms_err *err);
    /* Bind every tensor of the model (trunk, layers, expert tensors). */
    int (*bind)(ms_binder *b, struct ms_model *m);
} ms_arch;

const ms_arch *ms_arch_find(const char *model_type);
/* The family's names for common config keys: pairs {common key, its name} ending with NULL, NULL
 * (transformers' attribute_map: DBRX's d_model for hidden_size), or NULL when it has none; the common
 * parse reads the family's key where the common one is absent. */
const char *const *ms_arch_key_aliases(const ms_arch *a);
/* For a model_type moonshine knows but does not run (a transformers MoE family whose blocks are
 * not there yet): what it needs, as a phrase; NULL otherwise. */
const char *ms_arch_refusal(const char *model_type);
/* Comma-separated supported model_types into buf. */
void ms_arch_list(char *buf, size_t cap);

/* Shared binding blocks (model/blocks_bind.c), used by arch files. */
int ms_bind_trunk(ms_binder *b, struct ms_model *m, const char *embed, const char *final_norm, const char *lm_head);
int ms_bind_gqa(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
int ms_bind_mla(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
/* ms_bind_mla with the attention module's own prefix ("model.layers.3.self_attn.0."). */
int ms_bind_mla_at(ms_binder *b, struct ms_model *m, int layer, const char *apfx);
int ms_bind_mlp(ms_binder *b, struct ms_model *m, int layer, const char *pfx, int64_t inter, const char *gate,
                const char *up, const char *down);
/* Routed experts: names are printf patterns with %d (layer) and %d (expert). */
int ms_bind_experts(ms_binder *b, struct ms_model *m, int layer, const char *gate_fmt, const char *up_fmt,
                    const char *down_fmt);
/* The same with patterns formatted with the expert alone (%d), bound on engine layer `layer`
 * (when a checkpoint's layer numbering is not the engine's: LongCat-Flash's two sublayers). */
int ms_bind_layer_experts(ms_binder *b, struct ms_model *m, int layer, const char *gate_fmt, const char *up_fmt,
                          const char *down_fmt);
int ms_bind_router(ms_binder *b, struct ms_model *m, int layer, const char *weight, const char *bias);
/* Routed experts stored fused per layer (Qwen3-VL-MoE): gate_up "GU" and down "DN"
 * (full names without ".weight"), BF16/F16/F32, in either of two layouts, told
 * apart by DN's shape (hidden != moe_inter):
 *   Linear layout (transformers' modules; what save_pretrained writes):
 *     GU [E, 2*inter, hidden] (gate rows, then up rows), DN [E, hidden, inter];
 *     bound as views, no copy;
 *   transposed (the published Qwen3-VL checkpoints): GU [E, hidden, 2*inter],
 *     DN [E, inter, hidden]; transposed once into a layer-owned buffer in the
 *     stored dtype (resident; the views point there).
 * Spec mode records the published layout. */
int ms_bind_fused_experts(ms_binder *b, struct ms_model *m, int layer, const char *gate_up, const char *down);
/* The DeepSeek-style MoE of layer `layer` under pfx ("model.layers.N."): router
 * mlp.gate (+ e_score_correction_bias when cfg->router_bias), shared experts
 * mlp.shared_experts.* when cfg->shared_inter, routed experts mlp.experts.E.{gate,up,down}_proj. */
int ms_bind_routed_moe(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
/* Routed experts under base ("model.layers.3.mlp.experts"): per expert base.E.{gate,up,down}_proj
 * (the published layout; spec mode records it), or, when the checkpoint has no base.0.gate_proj,
 * fused base.gate_up_proj / base.down_proj as ms_bind_fused_experts binds them (what transformers 5
 * saves for a family without a checkpoint conversion mapping). */
int ms_bind_experts_at(ms_binder *b, struct ms_model *m, int layer, const char *base);
/* The dense SwiGLU MLP mlp.{gate,up,down}_proj of width cfg->inter under pfx. */
int ms_bind_dense_mlp(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
/* DeepSeek's shared experts mlp.shared_experts.{gate,up,down}_proj of width
 * cfg->shared_inter under pfx; nothing when cfg->shared_inter is 0. */
int ms_bind_shared_experts(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
/* Qwen2-MoE's gated shared expert under pfx: mlp.shared_expert.{gate,up,down}_proj
 * of width cfg->shared_inter and its gate mlp.shared_expert_gate [1, hidden];
 * nothing when cfg->shared_inter is 0. */
int ms_bind_gated_shared_expert(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
/* Mixtral's sparse MoE block under pfx: router block_sparse_moe.gate, with
 * block_sparse_moe.<bias> as its correction bias when bias is not NULL, and
 * experts block_sparse_moe.experts.E.{w1,w3,w2} (gate, up, down). */
int ms_bind_sparse_moe(ms_binder *b, struct ms_model *m, int layer, const char *pfx, const char *bias);
/* pfx input_layernorm.weight and post_attention_layernorm.weight [hidden]. */
int ms_bind_layer_norms(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
/* The layer's FFN per cfg->layer_mlp: dense mlp.{gate,up,down}_proj of width
 * cfg->inter, or ms_bind_routed_moe. */
int ms_bind_ffn(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
/* A per-layer binder: binds layer `layer`'s tensors whose names lie below pfx
 * ("model.layers.3."), recording the first error in b; returns b->rc.
 * ms_bind_gqa, ms_bind_mla, ms_bind_ffn and ms_bind_routed_moe are ones. */
typedef int ms_layer_binder(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
/* The decoder-layer loop most families share: for l = 0 .. n_layers-1, with
 * pfx = "<layers>.<l>." (layers e.g. "model.layers"), ms_bind_layer_norms, then
 * attn, then ffn, each with (b, m, l, pfx); stops at the first error. Binds no
 * trunk. Returns b->rc. */
int ms_bind_layers(ms_binder *b, struct ms_model *m, const char *layers, ms_layer_binder *attn, ms_layer_binder *ffn);
/* ms_bind_trunk with model.embed_tokens, model.norm.weight, lm_head, then
 * ms_bind_layers over "model.layers": the whole model of a plain decoder. */
int ms_bind_decoder(ms_binder *b, struct ms_model *m, ms_layer_binder *attn, ms_layer_binder *ffn);
/* Attention Residuals pair "<pfx>norm.weight" [hidden] and "<pfx>proj.weight"
 * [1, hidden] (pfx e.g. "model.layers.3.mlp_res_"), as F32 copies. */
int ms_bind_attn_res(ms_binder *b, struct ms_attn_res *out, const char *pfx);
/* Latent routed-expert projections under pfx ("model.layers.3.block_sparse_moe."):
 * routed_expert_down_proj [expert_hidden, hidden], routed_expert_up_proj
 * [hidden, expert_hidden], routed_expert_norm [expert_hidden] when latent_moe_norm. */
int ms_bind_latent_moe(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
/* A KDA token mixer under pfx ("model.layers.3.self_attn.") (model/kda_bind.c). */
int ms_bind_kda(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
/* A DSA lightning indexer under pfx ("model.layers.3.self_attn.indexer.") and the
 * indexer configuration of a model config (model/dsa_bind.c). */
struct ms_dsa_cfg;
int ms_bind_dsa(ms_binder *b, struct ms_model *m, int layer, const char *pfx);
void ms_dsa_cfg_of(const ms_config *c, struct ms_dsa_cfg *out);

#endif
