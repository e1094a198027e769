/* arch_common.h — helpers shared by architecture files (config parsing). */
#ifndef MS_ARCH_COMMON_H
#define MS_ARCH_COMMON_H

#include "model/arch.h"
#include "util/json.h"

/* Rotary dims for GQA families: rotary_dim, or head_dim * partial_rotary_factor
 * (top level or in rope_parameters), default head_dim. */
int ms_arch_rotary_dim(const cJSON *j, const ms_config *c, int64_t *out, const char *where, ms_err *err);
/* RoPE of a GQA family over its rotary dims (ms_arch_rotary_dim), in layout,
 * into c->rope (ms_config_rope), and the attention scale 1/sqrt(head_dim). */
int ms_arch_gqa_rope(const cJSON *j, ms_config *c, ms_rope_layout layout, const char *where, ms_err *err);
/* The dense/MoE schedule: mlp_layer_types ("dense" | "sparse", one per layer)
 * when present, else the first first_dense layers dense and the rest MoE, into
 * c->layer_mlp; dense layers need intermediate_size. */
int ms_arch_mlp_layer_types(const cJSON *j, ms_config *c, int64_t first_dense, const char *where, ms_err *err);
/* Check the MoE fields every routed family needs. */
int ms_arch_check_moe(const ms_config *c, const char *where, ms_err *err);
/* Check GQA head fields. */
int ms_arch_check_gqa(const ms_config *c, const char *where, ms_err *err);

/* DSA: index_* fields and the per-layer indexer schedule (indexer_types,
 * index_topk_pattern or index_topk_freq/index_skip_topk_offset) of the layers
 * already marked MS_ATTN_MLA. rope_interleaved: the indexer's RoPE layout;
 * chain_shared: see ms_dsa_share_plan; kpool_default: index_kpool when absent
 * (0: per-token keys). (model/dsa_bind.c) */
int ms_arch_dsa_configure(const cJSON *j, ms_config *c, int rope_interleaved, int chain_shared, int kpool_default,
                          const char *where, ms_err *err);

#endif
