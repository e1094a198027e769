/* outfmt.c — which output format a model family's replies use. */
#include <string.h>

#include "text/outparse.h"

ms_outfmt ms_outfmt_for_model_type(const char *mt) {
    if (!mt) return MS_OUTFMT_THINK;
    if (!strncmp(mt, "qwen3", 5) || !strncmp(mt, "mimo", 4)) return MS_OUTFMT_QWEN3;
    if (!strcmp(mt, "deepseek_v3")) return MS_OUTFMT_DEEPSEEK_V3;
    if (!strcmp(mt, "deepseek_v32") || !strcmp(mt, "deepseek_v4")) return MS_OUTFMT_DEEPSEEK_V31;
    if (!strcmp(mt, "kimi_linear") || !strcmp(mt, "kimi_k2") || !strcmp(mt, "kimi_k25")) return MS_OUTFMT_KIMI_K2;
    if (!strcmp(mt, "kimi_k3")) return MS_OUTFMT_XTML;
    if (!strncmp(mt, "glm", 3)) return MS_OUTFMT_GLM;
    if (!strcmp(mt, "gpt_oss")) return MS_OUTFMT_HARMONY;
    return MS_OUTFMT_THINK;
}
