/* arch_registry.c — the table of supported model_types. */
#include <stdio.h>
#include <string.h>

#include "model/arch.h"

extern const ms_arch ms_arch_gpt_oss, ms_arch_mimo_v2_flash;
extern const ms_arch ms_arch_deepseek_v3, ms_arch_qwen3_moe, ms_arch_glm4_moe, ms_arch_minimax_m2;
extern const ms_arch ms_arch_kimi_linear;
extern const ms_arch ms_arch_deepseek_v32, ms_arch_glm_moe_dsa, ms_arch_glm5_next;
extern const ms_arch ms_arch_kimi_k3;
extern const ms_arch ms_arch_qwen3_next;
extern const ms_arch ms_arch_deepseek_v4;
extern const ms_arch ms_arch_qwen3_5_moe, ms_arch_qwen3_5_moe_text, ms_arch_kimi_k25;
extern const ms_arch ms_arch_glm4_moe_lite, ms_arch_mixtral, ms_arch_qwen2_moe, ms_arch_olmoe;
extern const ms_arch ms_arch_qwen3_vl_moe, ms_arch_longcat_flash;
extern const ms_arch ms_arch_deepseek_v2, ms_arch_dots1, ms_arch_exaone_moe, ms_arch_solar_open;
extern const ms_arch ms_arch_hunyuan_v1_moe, ms_arch_ernie4_5_moe, ms_arch_granitemoe, ms_arch_granitemoeshared;
extern const ms_arch ms_arch_flex_olmo, ms_arch_dbrx, ms_arch_phimoe;
extern const ms_arch ms_arch_hy_v3, ms_arch_mistral4, ms_arch_granitemoe_swa, ms_arch_afmoe;
extern const ms_arch ms_arch_aria_text, ms_arch_aria, ms_arch_qwen3_omni_moe, ms_arch_qwen3_omni_moe_thinker;
extern const ms_arch ms_arch_cohere2_moe, ms_arch_glm4v_moe;

static const ms_arch *const k_archs[] = {
    &ms_arch_deepseek_v3,
    &ms_arch_gpt_oss,
    &ms_arch_mimo_v2_flash,
    &ms_arch_qwen3_moe,
    &ms_arch_glm4_moe,
    &ms_arch_minimax_m2,
    &ms_arch_kimi_linear,
    &ms_arch_deepseek_v32,
    &ms_arch_glm_moe_dsa,
    &ms_arch_glm5_next,
    &ms_arch_kimi_k3,
    &ms_arch_qwen3_next,
    &ms_arch_deepseek_v4,
    &ms_arch_qwen3_5_moe,
    &ms_arch_qwen3_5_moe_text,
    &ms_arch_kimi_k25,
    &ms_arch_glm4_moe_lite,
    &ms_arch_mixtral,
    &ms_arch_qwen2_moe,
    &ms_arch_olmoe,
    &ms_arch_qwen3_vl_moe,
    &ms_arch_longcat_flash,
    &ms_arch_deepseek_v2,
    &ms_arch_dots1,
    &ms_arch_hunyuan_v1_moe,
    &ms_arch_ernie4_5_moe,
    &ms_arch_granitemoe,
    &ms_arch_granitemoeshared,
    &ms_arch_flex_olmo,
    &ms_arch_exaone_moe,
    &ms_arch_solar_open,
    &ms_arch_dbrx,
    &ms_arch_phimoe,
    &ms_arch_hy_v3,
    &ms_arch_mistral4,
    &ms_arch_granitemoe_swa,
    &ms_arch_afmoe,
    &ms_arch_aria_text,
    &ms_arch_aria,
    &ms_arch_qwen3_omni_moe,
    &ms_arch_qwen3_omni_moe_thinker,
    &ms_arch_cohere2_moe,
    &ms_arch_glm4v_moe,
};

extern const char *const ms_dbrx_key_aliases[];

const char *const *ms_arch_key_aliases(const ms_arch *a) { return a == &ms_arch_dbrx ? ms_dbrx_key_aliases : NULL; }

const ms_arch *ms_arch_find(const char *model_type) {
    for (size_t i = 0; i < sizeof k_archs / sizeof *k_archs; i++)
        if (!strcmp(k_archs[i]->model_type, model_type)) return k_archs[i];
    return NULL;
}

/* transformers 5.17 MoE families that need blocks moonshine does not have (issue 16). */
static const struct {
    const char *model_type, *needs;
} k_refused[] = {
    {"llama4", "routed experts whose input is scaled by the router score, chunked attention and "
               "temperature-tuned NoPE layers"},
    {"llama4_text", "routed experts whose input is scaled by the router score, chunked attention and "
                    "temperature-tuned NoPE layers"},
    {"jetmoe", "mixture-of-attention-heads attention (routed query/output heads)"},
    {"minimax", "lightning (linear) attention layers"},
    {"lfm2_moe", "short-convolution token mixers"},
    {"granitemoehybrid", "Mamba-2 token mixers"},
    {"nemotron_h", "Mamba-2 token mixers"},
    {"jamba", "Mamba token mixers"},
    {"hy_v4", "gated MLA with sinks, DSA with shared indexers and hyper-connection streams together"},
    {"step3p7", "per-layer attention head counts and Step's gated attention"},
    {"laguna", "per-layer attention head counts and a softplus per-head output gate"},
    {"minimax_m3_vl", "block-sparse attention picked by an indexer (index_block_size, index_topk_blocks)"},
};

const char *ms_arch_refusal(const char *model_type) {
    for (size_t i = 0; i < sizeof k_refused / sizeof *k_refused; i++)
        if (!strcmp(k_refused[i].model_type, model_type)) return k_refused[i].needs;
    return NULL;
}

void ms_arch_list(char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof k_archs / sizeof *k_archs && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? ", %s" : "%s", k_archs[i]->model_type);
}
