/* test_compressed_attn.c — DeepSeek-V4 compressed attention: the window
 * pooling op against a float64 transcription of transformers' compressor
 * (DeepseekV4HCACompressor / DeepseekV4CSACompressor: the [2*rate, dim] slot
 * layout with zero-kv / -inf-gate slots, softmax over slots, kv_norm), and the
 * engine on paths `moonshine verify` does not take (prefill in small chunks,
 * the prompt fed in pieces, windows and compressed entries crossing chunk
 * boundaries) against the shared deepseek_v4 fixture's references. */
#include "engine/engine.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "ops/compress.h"
#include "fixture.h"
#include "test.h"

static unsigned rng_state = 12345;
static float frand(void) {
    rng_state = rng_state * 1103515245u + 12345u;
    return ((rng_state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* The reference's math in double: slots laid out exactly as new_kv / new_gate. */
static void ref_pool(const float *cur_kv, const float *cur_gate, const float *prev_kv, const float *prev_gate,
                     const float *ape, const float *norm, int rate, int dim, int overlap, double eps, double *out) {
    int w = overlap ? 2 : 1, S = overlap ? 2 * rate : rate;
    double kv[64][32], g[64][32];
    for (int s = 0; s < S; s++)
        for (int c = 0; c < dim; c++) kv[s][c] = 0, g[s][c] = -INFINITY;
    for (int r = 0; r < rate; r++)
        for (int c = 0; c < dim; c++) {
            int slot = overlap ? rate + r : r, off = overlap ? dim : 0;
            kv[slot][c] = cur_kv[r * w * dim + off + c];
            g[slot][c] = (double)cur_gate[r * w * dim + off + c] + ape[r * w * dim + off + c];
            if (overlap && prev_kv) {
                kv[r][c] = prev_kv[r * w * dim + c];
                g[r][c] = (double)prev_gate[r * w * dim + c] + ape[r * w * dim + c];
            }
        }
    double ss = 0;
    for (int c = 0; c < dim; c++) {
        double mx = -INFINITY, den = 0, num = 0;
        for (int s = 0; s < S; s++) mx = g[s][c] > mx ? g[s][c] : mx;
        for (int s = 0; s < S; s++) {
            double p = exp(g[s][c] - mx);
            den += p, num += p * kv[s][c];
        }
        out[c] = num / den;
        ss += out[c] * out[c];
    }
    double r = 1.0 / sqrt(ss / dim + eps);
    for (int c = 0; c < dim; c++) out[c] = out[c] * r * norm[c];
}

TEST(compress_pool_matches_float64_reference) {
    ms_err err = {0};
    for (int trial = 0; trial < 60; trial++) {
        int rate = 1 + trial % 8, dim = 2 + (trial * 7) % 30, overlap = trial % 3 != 0, first = trial % 5 == 0;
        int w = overlap ? 2 : 1;
        float ck[8 * 64], cg[8 * 64], pk[8 * 64], pg[8 * 64], ape[8 * 64], norm[32], out[32];
        for (int i = 0; i < rate * w * dim; i++)
            ck[i] = frand(), cg[i] = 3 * frand(), pk[i] = frand(), pg[i] = 3 * frand(), ape[i] = frand();
        for (int c = 0; c < dim; c++) norm[c] = 1 + 0.5f * frand();
        const float *pkk = overlap && !first ? pk : NULL, *pgg = overlap && !first ? pg : NULL;
        int rc = ms_compress_pool(ck, cg, pkk, pgg, ape, norm, rate, dim, overlap, 1e-6f, out, &err);
        CHECK_MSG(rc == MS_OK, "%s", err.msg);
        double ref[32], m = 0;
        ref_pool(ck, cg, pkk, pgg, ape, norm, rate, dim, overlap, 1e-6, ref);
        for (int c = 0; c < dim; c++) m = fabs(out[c] - ref[c]) > m ? fabs(out[c] - ref[c]) : m;
        CHECK_MSG(m < 1e-5, "trial %d (rate %d dim %d overlap %d): max err %g", trial, rate, dim, overlap, m);
    }
}

TEST(compress_pool_rejects_bad_arguments) {
    ms_err err = {0};
    float a[16] = {0}, o[4];
    CHECK(ms_compress_pool(a, a, NULL, NULL, a, a, 0, 4, 0, 1e-6f, o, &err) == MS_ERR_ARG);
    CHECK(ms_compress_pool(a, a, NULL, NULL, a, a, 2, 0, 0, 1e-6f, o, &err) == MS_ERR_ARG);
    CHECK(ms_compress_pool(a, a, a, a, a, a, 2, 2, 0, 1e-6f, o, &err) == MS_ERR_ARG); /* previous window without overlap */
    CHECK(ms_compress_pool(a, a, a, NULL, a, a, 2, 2, 1, 1e-6f, o, &err) == MS_ERR_ARG);
    CHECK(ms_compress_pool(NULL, a, NULL, NULL, a, a, 2, 2, 1, 1e-6f, o, &err) == MS_ERR_ARG);
}

#define FIX "tests/data/fixtures/models/deepseek_v4"

/* prefill, then the prompt in pieces and decode, against the fixture's references (fixture.h) */
static void run(int max_batch, int threads, int piece) { ms_test_prefill_and_decode(FIX, 96, max_batch, threads, piece); }

TEST(engine_chunks_and_pieces_match_reference) {
    run(256, 1, 1000); /* whole forwards */
    run(3, 2, 7);      /* chunks of 3: windows of 4 and 8 and the sliding window cross chunk boundaries */
    run(5, 1, 1);      /* the prompt token by token */
    run(1, 2, 3);
}

TEST_MAIN()
