/* be_cpu_cattn.c — the CPU backend's DeepSeek V4 compressed-attention ops
 * (core/backend.h compress_append, attn_compressed): the window compressor
 * over ops/compress.c, and the attention core over the key window, the
 * compressed entries and (CSA) the lightning indexer's choice of them.
 * Single-threaded, on thread 0's scratch. */
#include <math.h>
#include <string.h>

#include "backend/cpu/be_cpu.h"
#include "ops/compress.h"

/* RoPE on the trailing r->dim dims of x [d]; sign -1 rotates back. */
static void rope_tail(const ms_rope *r, float *x, int64_t d, int64_t pos, float sign) {
    float cs[512], sn[512];
    ms_rope_cos_sin(r, pos, cs, sn);
    for (int i = 0; i < r->dim / 2; i++) sn[i] *= sign;
    ms_rope_apply(r, x + d - r->dim, cs, sn);
}

int ms_cpu_compress_append(ms_backend *be, const ms_compress_args *a, ms_err *err) {
    const int rate = a->rate, overlap = a->overlap;
    const int64_t dim = a->dim, cw = (overlap ? 2 : 1) * dim;
    float *raw_kv = a->raw_kv, *raw_g = a->raw_g;
    for (int t = 0; t < a->n; t++) {
        int64_t p = a->pos0 + t, slot = p % (2 * rate);
        memcpy(raw_kv + slot * cw, a->kv + (int64_t)t * cw, (size_t)cw * 4);
        memcpy(raw_g + slot * cw, a->g + (int64_t)t * cw, (size_t)cw * 4);
        if ((p + 1) % rate) continue;
        int64_t win = p / rate;
        const float *ck = raw_kv + (win % 2) * rate * cw, *cg = raw_g + (win % 2) * rate * cw;
        const float *pk0 = NULL, *pg0 = NULL;
        if (overlap && win > 0) pk0 = raw_kv + ((win - 1) % 2) * rate * cw, pg0 = raw_g + ((win - 1) % 2) * rate * cw;
        float *out = a->entries + win * dim;
        int rc = ms_compress_pool(ck, cg, pk0, pg0, a->ape, a->norm, rate, (int)dim, overlap, a->eps, out, err);
        if (rc) return rc;
        rope_tail(a->rope, out, dim, win * rate, 1.0f);
    }
    return MS_OK;
}

int ms_cpu_attn_compressed(ms_backend *be, const ms_cattn_args *a, ms_err *err) {
    cpu_backend *b = cpu_of(be);
    const int64_t H = a->H, hd = a->hd, W = a->window, pos0 = a->pos0, rate = a->rate, NC = rate ? a->n_comp : 0;
    const int csa = a->csa;
    /* room: the reserved key window and entries (ms_cpu_cattn_scratch) */
    int64_t max_entries = b->dims.ca_rate ? b->max_ctx / b->dims.ca_rate + 1 : 0;
    if (W > b->dims.ca_window || NC > max_entries || (rate && rate < b->dims.ca_rate))
        return ms_fail(err, MS_ERR_LIMIT, "compressed attention: window %lld / %lld entries beyond the reserved %lld / %lld",
                       (long long)W, (long long)NC, (long long)b->dims.ca_window, (long long)max_entries);
    size_t kcap = (size_t)(b->dims.ca_window + max_entries + 2), ecap = (size_t)max_entries + 2;
    float *base = cpu_thread_buf(b, 0);
    const float **keyw = (const float **)(void *)base;               /* [kcap] */
    ms_dsa_qel *work = (ms_dsa_qel *)(void *)(base + 2 * kcap);      /* [ecap] */
    float *sc = base + 2 * kcap + 2 * ecap;                          /* [kcap] */
    float *isc = sc + kcap;                                          /* [ecap] */
    int32_t *sel = (int32_t *)(isc + ecap);                          /* [ecap] */
    for (int t = 0; t < a->n; t++) {
        int64_t p = pos0 + t, s0 = p - W + 1 > 0 ? p - W + 1 : 0;
        int nk = 0;
        for (int64_t j = s0; j <= p; j++) keyw[nk++] = j >= pos0 ? a->kv + (j - pos0) * hd : a->win + (j % W) * hd;
        if (rate) {
            int64_t vis = (p + 1) / rate < NC ? (p + 1) / rate : NC;
            if (!csa) {
                for (int64_t x = 0; x < vis; x++) keyw[nk++] = a->comp + x * hd;
            } else if (NC > 0) {
                int64_t IH = a->idx_heads, ihd = a->idx_dim;
                float ws = 1.0f / sqrtf((float)IH), ss = 1.0f / sqrtf((float)ihd);
                for (int64_t x = 0; x < vis; x++) {
                    float acc = 0;
                    for (int64_t h = 0; h < IH; h++) {
                        float d = ms_dot(a->iq + ((int64_t)t * IH + h) * ihd, a->icomp + x * ihd, ihd);
                        acc += (d > 0 ? d : 0) * ss * (a->iw[(int64_t)t * IH + h] * ws);
                    }
                    isc[x] = acc;
                }
                /* torch.topk's tie choices depend on the row length: that of the whole forward (fwd_len),
                 * whose later entries are masked for this query anyway */
                int64_t NT = a->fwd_len / rate > NC ? a->fwd_len / rate : NC;
                if (NT > max_entries) NT = max_entries;
                int64_t k = a->topk < NT ? a->topk : NT;
                int64_t cnt = ms_dsa_topk(isc, vis, NT, k, work, sel, NULL);
                for (int64_t i = 0; i < cnt; i++) keyw[nk++] = a->comp + (int64_t)sel[i] * hd;
            }
        }
        for (int64_t h = 0; h < H; h++) {
            const float *qv = a->q + ((int64_t)t * H + h) * hd;
            float mx = a->sinks ? a->sinks[h] : -INFINITY;
            for (int i = 0; i < nk; i++) {
                sc[i] = ms_dot(qv, keyw[i], hd) * a->scale;
                if (sc[i] > mx) mx = sc[i];
            }
            double den = a->sinks ? exp((double)a->sinks[h] - mx) : 0.0;
            for (int i = 0; i < nk; i++) {
                sc[i] = expf(sc[i] - mx);
                den += sc[i];
            }
            float *o = a->out + ((int64_t)t * H + h) * hd;
            memset(o, 0, (size_t)hd * 4);
            for (int i = 0; i < nk; i++) ms_axpy(o, (float)(sc[i] / den), keyw[i], hd);
        }
    }
    return MS_OK;
}
