/* attention.c — GQA (standard KV cache) and MLA (compressed latent cache;
 * absorbed form for decode and short chunks, expanded form for long prefill
 * chunks) attention sublayers, written against the backend (core/backend.h):
 * projections, norms, RoPE and the cache append here, the attention itself
 * one backend op per layer. */
#include <math.h>
#include <string.h>

#include "engine/engine_internal.h"

/* ---------------- GQA ---------------- */

int ms_attn_gqa(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->w->layers[layer];
    ms_backend *be = e->be;
    int64_t H = c->n_heads, KV = c->layer_kv_heads[layer] ? c->layer_kv_heads[layer] : c->n_kv_heads;
    int64_t hd = c->head_dim, vd = c->v_head_dim ? c->v_head_dim : c->head_dim;
    int64_t kd = KV * hd, vtot = KV * vd, qd = H * hd;
    const ms_rope *rope = c->layer_rope[layer] ? &c->rope_alt : &c->rope;
    /* one sequence: keys and values are computed in its cache rows (positions n_past..); several
     * (a batched decode step): in scratch, then copied into each sequence's cache */
    int direct = e->n_seqs == 1 && !e->step_mode; /* the replayable step: scratch, then qkv_at's append */
    ms_engine *s0 = e->seqs[0].e;
    float *q = e->q;
    float *k = direct ? s0->k_cache[layer] + (int64_t)s0->n_past * kd : e->kv;
    float *v = direct ? s0->v_cache[layer] + (int64_t)s0->n_past * vtot : e->kv + (int64_t)n * kd;
    ms_matmul_job qkv[3] = {{q, e->xn, n, &L->wq, 0}, {k, e->xn, n, &L->wk, 0}, {v, e->xn, n, &L->wv, 0}};
    be->ops->matmul_many(be, qkv, 3);
    if (L->bq) be->ops->add_bias(be, q, L->bq, n, c->attn_out_gate ? 2 * qd : qd);
    if (L->bk) be->ops->add_bias(be, k, L->bk, n, kd);
    if (L->bv) be->ops->add_bias(be, v, L->bv, n, vtot);
    if (c->clip_qkv > 0) { /* DBRX: the projections clamped (the gate half of q never exists with it) */
        float lim = (float)c->clip_qkv;
        be->ops->clamp(be, q, -lim, lim, (int64_t)n * qd);
        be->ops->clamp(be, k, -lim, lim, (int64_t)n * kd);
        be->ops->clamp(be, v, -lim, lim, (int64_t)n * vtot);
    }
    if (c->attn_out_gate) { /* rows [query hd, gate hd] per head: gate to gate_buf, queries packed in place */
        be->ops->copy_rows(be, e->gate_buf, hd, q + hd, 2 * hd, n * H, hd);
        be->ops->copy_rows(be, q, hd, q, 2 * hd, n * H, hd);
    }
    float eps = (float)c->rms_eps;
    if (c->v_scale != 0 && c->v_scale != 1) be->ops->scale(be, v, (float)c->v_scale, n * vtot);
    /* norm and RoPE in one op where it can; not after RoPE (Hunyuan) or on a NoPE layer (rotary dims 0) */
    int late = c->qk_norm == MS_QKNORM_HEAD && c->qk_norm_after_rope, rot = rope->dim > 0;
    int fused = c->qk_norm == MS_QKNORM_HEAD && !late && rot && (be->ops->qk_norm_rope || e->step_mode);
    if (!fused && !late && c->qk_norm == MS_QKNORM_HEAD) {
        be->ops->rmsnorm(be, q, q, L->q_norm, n * H, hd, eps);
        be->ops->rmsnorm(be, k, k, L->k_norm, n * KV, hd, eps);
    } else if (!fused && c->qk_norm == MS_QKNORM_FULL) {
        be->ops->rmsnorm(be, q, q, L->q_norm, n, qd, eps);
        be->ops->rmsnorm(be, k, k, L->k_norm, n, kd, eps);
    }
    for (int i = 0; i < e->n_seqs; i++) { /* per sequence: RoPE at its positions, its cache, its attention */
        const ms_fwd_seq *sq = &e->seqs[i];
        ms_engine *se = sq->e;
        int sn = sq->n;
        float *qs = q + (int64_t)sq->row * qd, *ks = k + (int64_t)sq->row * kd, *vs = v + (int64_t)sq->row * vtot;
        if (e->step_mode) { /* one token at the position in e->step: norms, RoPE and the cache rows in one op */
            ms_attn_gqa_args a = {.out = e->att, .q = qs, .k = se->k_cache[layer], .v = se->v_cache[layer], .n = 1,
                                  .n_past = e->step_bound, .H = H, .KV = KV, .hd = hd, .vd = vd,
                                  .window = c->layer_window[layer], .sinks = L->sinks, .scale = (float)c->attn_scale,
                                  .pos_dev = e->step};
            int rc = MS_ERR_UNSUPPORTED;
            ms_err fe = {0};
            if (be->ops->qkv_attn_at) /* both in one op where the backend has it */
                rc = be->ops->qkv_attn_at(be, rope, qs, L->q_norm, ks, L->k_norm, vs, fused, eps, &a, &fe);
            if (rc && rc != MS_ERR_UNSUPPORTED && err) *err = fe;
            if (rc == MS_ERR_UNSUPPORTED) {
                be->ops->qkv_at(be, rope, qs, H, L->q_norm, ks, KV, L->k_norm, vs, vd, se->k_cache[layer],
                                se->v_cache[layer], hd, fused, eps, e->step);
                rc = be->ops->attn_gqa(be, &a, err);
            }
            if (rc) return ms_wrap(err, "layer %d", layer);
            continue;
        }
        if (fused) {
            be->ops->qk_norm_rope(be, rope, qs, H, L->q_norm, ks, KV, L->k_norm, sn, hd, eps, se->n_past);
        } else if (rot) {
            be->ops->rope(be, rope, qs, sn, qd, H, hd, 0, se->n_past, 1.0f);
            be->ops->rope(be, rope, ks, sn, kd, KV, hd, 0, se->n_past, 1.0f);
        }
        if (late) {
            be->ops->rmsnorm(be, qs, qs, L->q_norm, (int64_t)sn * H, hd, eps);
            be->ops->rmsnorm(be, ks, ks, L->k_norm, (int64_t)sn * KV, hd, eps);
        }
        if (!direct) {
            be->ops->copy(be, se->k_cache[layer] + (int64_t)se->n_past * kd, ks, (size_t)(sn * kd) * 4);
            be->ops->copy(be, se->v_cache[layer] + (int64_t)se->n_past * vtot, vs, (size_t)(sn * vtot) * 4);
        }
        ms_attn_gqa_args a = {.out = e->att + (int64_t)sq->row * H * vd, .q = qs, .k = se->k_cache[layer],
                              .v = se->v_cache[layer], .n = sn, .n_past = se->n_past, .H = H, .KV = KV, .hd = hd,
                              .vd = vd, .window = c->layer_window[layer], .sinks = L->sinks,
                              .scale = (float)c->attn_scale};
        int rc = be->ops->attn_gqa(be, &a, err);
        if (rc) return ms_wrap(err, "layer %d", layer);
    }
    if (c->attn_out_gate) be->ops->mul_sigmoid(be, e->att, e->gate_buf, n * H * vd); /* gated attention (Qwen3-Next) */
    if (c->attn_gate_proj) { /* a gate of its own (AFMoE): att *= sigmoid(gate_proj x) */
        be->ops->matmul(be, e->gate_buf, e->xn, n, &L->mla_gate, 0);
        be->ops->mul_sigmoid(be, e->att, e->gate_buf, n * H * vd);
    }
    be->ops->matmul(be, out, e->att, n, &L->wo, 0);
    if (L->bo) be->ops->add_bias(be, out, L->bo, n, c->hidden);
    return MS_OK;
}

/* ---------------- MLA ---------------- */

/* Whether layer's chunk of n tokens (at n_past) runs in the expanded form.
 * Multiply-adds per head, with P = Σ_t keys attended by token t (p + 1, or the
 * DSA selection's size) and T = n_past + n cached positions:
 *   absorbed: n·lora·(nope + vd)       q_lat = W_UKᵀ q_nope and W_UV o_lat, per token
 *           + P·(2·lora + rope)        scores against [c, k_pe] and Σ p·c over the latent width
 *   expanded: T·lora·(nope + vd)       k_nope, v = kv_b c for every cached position
 *           + P·(nope + rope + vd)     scores and Σ p·v at head width
 * With DeepSeek's lora 512, nope/rope/v 128/64/128 a key costs 1088 absorbed
 * vs 320 expanded, but expanded pays (T - n)·131072 more up front: decode
 * (n = 1) always stays absorbed, a prefill from an empty cache always expands
 * (T = n), and a chunk appended to a long context expands once
 * P·768 > (T - n)·131072, i.e. roughly n·(n_past + n/2) > 170·n_past. */
static int mla_choose_expanded(ms_engine *e, int layer, int n) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->w->layers[layer];
    if (e->mla_form == MS_MLA_ABSORBED || n < 2) return 0;
    int64_t lora = c->kv_lora_rank, rope = c->qk_rope_dim, nope = c->qk_nope_dim, vd = c->v_head_dim;
    int64_t dkv = nope + vd, T = e->n_past + n;
    ms_qmat w;
    for (int64_t h = 0; h < c->n_heads; h++) /* block-scaled rows must start at a scale block */
        if (!ms_qmat_row_range(&L->kv_b, h * dkv, dkv, &w)) return 0;
    if (e->mla_form == MS_MLA_EXPANDED) return 1;
    double P = 0;
    for (int t = 0; t < n; t++) {
        int cnt = e->n_past + t + 1;
        if (c->layer_dsa[layer]) ms_dsa_engine_row(e, t, &cnt);
        P += cnt;
    }
    double absorbed = (double)n * lora * dkv + P * (double)(2 * lora + rope);
    double expanded = (double)T * lora * dkv + P * (double)(nope + rope + vd);
    return expanded < absorbed;
}

int ms_attn_mla(ms_engine *e, int layer, int n, float *out, ms_err *err) {
    const ms_config *c = &e->m->cfg;
    const ms_layer *L = &e->w->layers[layer];
    ms_backend *be = e->be;
    int64_t lora = c->kv_lora_rank, rope = c->qk_rope_dim, nope = c->qk_nope_dim, H = c->n_heads;
    int64_t qk = nope + rope, lw = lora + rope, D = c->hidden, vd = c->v_head_dim;
    float eps = (float)(c->mla_norm_eps > 0 ? c->mla_norm_eps : c->rms_eps);
    if (c->q_lora_rank > 0) {
        be->ops->matmul(be, e->kv, e->xn, n, &L->q_a, 0);
        be->ops->rmsnorm(be, e->kv, e->kv, L->q_a_norm, n, c->q_lora_rank, eps);
        be->ops->matmul(be, e->q, e->kv, n, &L->q_b, 0);
        for (int i = 0; c->layer_dsa[layer] && i < e->n_seqs; i++) { /* each sequence's indexer */
            const ms_fwd_seq *sq = &e->seqs[i];
            int rc = ms_dsa_engine_select(sq->e, layer, sq->n, e->kv + (int64_t)sq->row * c->q_lora_rank,
                                          e->xn + (int64_t)sq->row * D, err);
            if (rc) return rc;
        }
    } else {
        be->ops->matmul(be, e->q, e->xn, n, &L->wq, 0);
    }
    be->ops->matmul(be, e->kv, e->xn, n, &L->kv_a, 0);
    for (int i = 0; i < e->n_seqs; i++) { /* per sequence: its latent cache rows, RoPE at its positions, attention */
        const ms_fwd_seq *sq = &e->seqs[i];
        ms_engine *se = sq->e;
        int sn = sq->n;
        const float *kvs = e->kv + (int64_t)sq->row * lw;
        float *qs = e->q + (int64_t)sq->row * H * qk;
        /* the cache rows of positions n_past..: the normalized latent, then the roped k_pe */
        float *dst = e->step_mode ? e->kv + (int64_t)sq->row * lw : se->latent[layer] + (int64_t)se->n_past * lw;
        for (int t = 0; t < sn; t++) be->ops->rmsnorm(be, dst + t * lw, kvs + t * lw, L->kv_a_norm, 1, lora, eps);
        be->ops->copy_rows(be, dst + lora, lw, kvs + lora, lw, sn, rope);
        be->ops->rope(be, &c->rope, dst, sn, lw, 1, 0, lora, se->n_past, 1.0f);
        be->ops->rope(be, &c->rope, qs, sn, H * qk, H, qk, nope, se->n_past, 1.0f);
        if (c->q_pos_beta != 0 && c->q_pos_len > 0) /* Llama 4 scaling: 1 + beta log(1 + floor(pos / len)) per query */
            for (int t = 0; t < sn; t++) {
                int64_t blk = (se->n_past + t) / c->q_pos_len;
                if (blk > 0) be->ops->scale(be, qs + (int64_t)t * H * qk, (float)(1.0 + c->q_pos_beta * log1p((double)blk)), H * qk);
            }
        int expanded = mla_choose_expanded(se, layer, sn);
        se->stats.mla_chunks++;
        se->stats.mla_expanded += (uint64_t)expanded;
        ms_attn_mla_args a = {.out = e->att + (int64_t)sq->row * H * vd, .q = qs, .latent = se->latent[layer],
                              .kv_b = &L->kv_b, .n = sn, .n_past = se->n_past, .H = H, .lora = lora, .rope = rope,
                              .nope = nope, .vd = vd, .scale = (float)c->attn_scale, .expanded = expanded};
        if (e->step_mode) { /* the replayable step (NoPE MLA, one token): the row normalized in place above goes
                             * to the position in e->step; the attention reads it there */
            be->ops->latent_at(be, se->latent[layer], lw, dst, e->step);
            a.n_past = e->step_bound, a.pos_dev = e->step;
        }
        if (c->layer_dsa[layer]) ms_dsa_engine_selection(se, &a.sel, &a.sel_count, &a.sel_width);
        int rc = be->ops->attn_mla(be, &a, err);
        if (rc) return ms_wrap(err, "layer %d", layer);
    }
    if (c->mla_out_gate) { /* gated MLA (Kimi K3): att *= sigmoid(g_proj x) */
        be->ops->matmul(be, e->gate_buf, e->xn, n, &L->mla_gate, 0);
        be->ops->mul_sigmoid(be, e->att, e->gate_buf, n * H * c->v_head_dim);
    }
    be->ops->matmul(be, out, e->att, n, &L->wo, 0);
    return MS_OK;
}
