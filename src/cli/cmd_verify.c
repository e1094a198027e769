/* cmd_verify.c — `moonshine verify FIXTURE_DIR`: compare the engine with the
 * transformers references in FIXTURE_DIR/reference.safetensors:
 *   logits      [40, V]  one forward over input_ids (prefill path)
 *   gen_logits  [12, V]  logits choosing each gen_ids token, computed by a
 *                        full recompute; we decode incrementally with the cache. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/verify_choices.h"

#define TOL 1e-3

static const ms_tensor *ref_tensor(const ms_checkpoint *r, const char *name, ms_dtype dt, int ndim, const char *path) {
    const ms_tensor *t = ms_checkpoint_find(r, name);
    if (!t || t->dtype != dt || t->ndim != ndim) {
        fprintf(stderr, "moonshine verify: %s: missing or malformed \"%s\" (%s, %d-D expected)\n", path, name,
                ms_dtype_name(dt), ndim);
        return NULL;
    }
    return t;
}

/* --dump-logits: n floats, little-endian, appended to f. 0 ok. */
static int dump_f32(FILE *f, const float *v, int64_t n) {
    if (!f) return 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        u = __builtin_bswap32(u);
        if (fwrite(&u, 4, 1, f) != 1) return -1;
    }
    return 0;
#else
    return fwrite(v, sizeof *v, (size_t)n, f) == (size_t)n ? 0 : -1;
#endif
}

static int argmax(const float *v, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return (int)b;
}

/* The reference's margin of its choice ref over the best other logit of v[n] (n >= 2). */
static double margin_top2(const float *v, int64_t n, int32_t ref) {
    double best = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (i != ref && v[i] > best) best = v[i];
    return (double)v[ref] - best;
}

/* One greedy step of the comparison: the engine's argmax, the reference's top-1/top-2 margin,
 * and on a flip the reference's margin between its id and the engine's and their error difference. */
typedef struct {
    int32_t got;
    double margin, max_err, pair_margin, pair_err;
} gen_step;

/* --static-dtype: the teacher-forced forwards of gen_prompt and gen_ids[0..n_gen-2] on an engine of the
 * stored static tier (dir opened again with eo, the tier stored), their choices into g (with margins).
 * 0 ok; 1 when the choices cannot be observed there (*why says so); -1 failed (message printed). */
static int stored_choices(const char *dir, const ms_cli_opts *eo, const int32_t *prompt, int n_prompt,
                          const int32_t *ids, int n_gen, ms_vc_log *g, const char **why) {
    ms_cli_opts o = *eo;
    o.static_dtype = MS_STATIC_STORED, o.static_store = NULL;
    o.stream_opts.trace_path = NULL; /* --expert-trace records the requantized engine alone */
    ms_cli_ctx s;
    if (ms_cli_open("verify", dir, &o, &s)) return -1;
    ms_err err = {0};
    int rc = 0;
    if (ms_engine_observe_choices(s.engine, ms_vc_observe, g, &err)) {
        *why = "the engine cannot report its choices (the CPU backend only)";
        rc = 1;
    }
    for (int i = 0; !rc && i < n_gen; i++) {
        g->fwd = i;
        if (ms_engine_forward(s.engine, i ? &ids[i - 1] : prompt, i ? 1 : n_prompt, NULL, 0, &err)) {
            fprintf(stderr, "moonshine verify: stored tier: %s\n", err.msg);
            rc = -1;
        }
    }
    if (!rc && g->oom) {
        fprintf(stderr, "moonshine verify: out of memory recording the stored tier's choices\n");
        rc = -1;
    }
    ms_cli_close(&s);
    return rc;
}

static double max_abs(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

int cmd_verify(int argc, char **argv) {
    if (ms_arg_flag(argc, argv, "--help")) {
        printf("usage: moonshine verify FIXTURE_DIR [--threads N] [--backend cpu|cuda|hip|auto] [--dump-logits FILE]\n"
               "Runs one forward over reference input_ids and a greedy incremental decode from\n"
               "gen_prompt, compares with the reference logits, prints one JSON line and exits 0\n"
               "only when both max errors are <= 1e-3 and the generated ids match.\n"
               "Expert streaming (bit-identical to resident): --expert-cache-mib N (0: top-k slots),\n"
               "--io auto|uring|pread|mmap, --store DIR (moonshine pack), --cache-policy lfu-decay|lru;\n"
               "with --backend cuda|hip, --device-expert-mib N sizes the device slot arena the host cache\n"
               "feeds (default: what the device has free after the weights, state and workspace).\n"
               "--experts-on cpu (or --cpu-moe-layers N) with --backend cuda|hip computes the routed experts\n"
               "(of the first N MoE layers) on the CPU from host memory, the rest on the device; --experts-on\n"
               "auto chooses per layer from measured bandwidths (docs/gpu.md).\n"
               "--dump-logits FILE writes the logits it computed, raw little-endian F32 without a header:\n"
               "the [40, V] prefill logits, then the [12, V] greedy-step logits, in that order (for\n"
               "bit-identity checks: tests/scripts/logits_identical.sh).\n"
               "--static-dtype q8|fp8 requantizes the static tier at load and compares within the tolerance\n"
               "derived from its measured quantization error (tol in the JSON line; docs/performance.md),\n"
               "with the greedy steps run teacher-forced (a flip fails where the reference's top-1/top-2\n"
               "margin exceeds margin_bound = 2 tol; steps within it are listed as near_ties) and\n"
               "free-running, both agreements reported; the routed experts and DSA selections of the\n"
               "teacher-forced steps are compared with a stored-tier engine's and forced to them\n"
               "(choice_flips: one beyond its own margin bound fails).\n"
               "--cpu-activations q8 runs the CPU matmuls of MXFP4/INT4/Q8 weights with int8 activations\n"
               "(per 32, F32 scale; integer dot products), bf16 the BF16 decode matvecs with BF16 activations\n"
               "(vdpbf16ps), q8+bf16 both, q16 (q16+bf16) the MXFP4/INT4/Q8 decode matvecs with 16-bit activations\n"
               "(two int8 planes), under the same 1e-3 tolerance (default q16).\n");
        return 0;
    }
    ms_cli_opts eo;
    if (ms_cli_engine_args(argc, argv, &eo)) return 2;
    const char *dump_path = ms_arg_str(argc, argv, "--dump-logits");
    const char *dir = ms_cli_model_arg("verify", ms_arg_pos(argc, argv, 0));
    if (!dir || ms_args_unknown(argc, argv, "verify")) {
        fprintf(stderr, "usage: moonshine verify FIXTURE_DIR [--threads N] [--backend cpu|cuda|hip|auto] [--dump-logits FILE]\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ms_checkpoint ref;
    ms_err err = {0};
    if (ms_checkpoint_open(path, &ref, &err)) {
        fprintf(stderr, "moonshine verify: %s\n", err.msg);
        return 1;
    }
    ms_cli_ctx x;
    if (ms_cli_open("verify", dir, &eo, &x)) {
        ms_checkpoint_close(&ref);
        return 1;
    }
    int64_t V = x.model.cfg.vocab;
    const ms_tensor *in = ref_tensor(&ref, "input_ids", MS_DT_I32, 1, path);
    const ms_tensor *lg = ref_tensor(&ref, "logits", MS_DT_F32, 2, path);
    const ms_tensor *gp = ref_tensor(&ref, "gen_prompt", MS_DT_I32, 1, path);
    const ms_tensor *gi = ref_tensor(&ref, "gen_ids", MS_DT_I32, 1, path);
    const ms_tensor *gl = ref_tensor(&ref, "gen_logits", MS_DT_F32, 2, path);
    int rc = 1;
    ms_vc_log vc_ref = {0}, vc_got = {0}; /* --static-dtype: the choices (verify_choices.h) */
    ms_vc_flip *vc_flips = NULL;
    int vc_on = 0, n_vc_flips = 0, vc_unmatched = 0;
    int64_t vc_compared = 0;
    const char *vc_why = NULL;
    float *out = NULL;
    gen_step *st = NULL; /* per greedy step */
    FILE *dump = NULL;
    if (!in || !lg || !gp || !gi || !gl) goto done;
    if (lg->shape[0] != in->shape[0] || lg->shape[1] != V || gl->shape[0] != gi->shape[0] || gl->shape[1] != V) {
        fprintf(stderr, "moonshine verify: %s: reference shapes do not match the model (vocab %lld)\n", path, (long long)V);
        goto done;
    }
    int n_in = (int)in->shape[0], n_gp = (int)gp->shape[0], n_gen = (int)gi->shape[0];
    out = malloc((size_t)(n_in > 1 ? n_in : 1) * (size_t)V * sizeof *out);
    if (!out) goto done;
    if (dump_path && !(dump = fopen(dump_path, "wb"))) {
        fprintf(stderr, "moonshine verify: %s: cannot create: %s\n", dump_path, strerror(errno));
        goto done;
    }
    const float *ref_logits = lg->data;
    /* --static-dtype q8|fp8: the requantized tier is judged by a tolerance derived from its measured
     * quantization error (docs/performance.md "Q8 static tier"): each requantized matrix perturbs its
     * output by a relative RMS of at most eps (the largest ||W_q - W|| / ||W||); M such perturbations
     * (requant_uses) on a token's path add up, independent, to an RMS of sigma = eps sqrt(M) times the
     * logits' RMS, whose mean absolute value is 0.8 sigma: the mean abs error must stay within
     * tol = 2 sigma (a factor 2.5 over the prediction, for the tokens whose routed experts or DSA
     * selection flip, whose error is not small). The max abs error is reported, not bounded: one
     * flipped expert moves a row by O(1). Greedy ids: the 12 steps run twice, teacher-forced with the
     * reference ids (every step compares the same context) and free-running (the engine's own ids).
     * A teacher-forced step can change its argmax only when the error difference of two logits
     * exceeds the reference's margin between them; that difference has RMS sqrt(2) sigma, so a
     * margin above bound = 2 tol = 4 sigma (2.8 of its RMS) must keep the reference id: a flip there
     * fails. Steps whose top-1/top-2 margin is within the bound are near ties, listed with their
     * margins whether their ids agree or not.
     * Discrete choices (routed experts, DSA selections: engine.h ms_choice) are outside that
     * derivation: one that flips moves the hidden state by O(1). So the teacher-forced forwards run
     * first over the stored tier (the reference's choices, a second engine), and the requantized
     * engine, reporting each choice it makes, is given the stored tier's instead wherever it
     * differs (forced, as the tokens are): every later step and choice then sees the reference's
     * choices and only the perturbation above (verify_choices.h). A choice's inputs are perturbed
     * by a relative RMS of at most rel = eps sqrt(M) (M: every use on the path, an upper bound on
     * those before it), its scores by rel rms(scores) (DSA: sqrt(F) times that, F perturbed
     * factors), a pair by sqrt(2) of it, so its margin bound is 4 rel rms(scores) (2.8 of the
     * pair's RMS, as for the logits): a choice that differs from the stored tier's with a margin
     * above its bound fails, and every greedy flip is judged by margin_bound as above. */
    const int quant = x.model.static_dtype != MS_STATIC_STORED; /* --static-dtype or --static-store */
    double tol = TOL, rms_ref = 0;
    if (quant) {
        for (int64_t i = 0; i < (int64_t)n_in * V; i++) rms_ref += (double)ref_logits[i] * ref_logits[i];
        rms_ref = sqrt(rms_ref / ((double)n_in * V));
        tol = 2.0 * x.model.requant_rel_rms * sqrt((double)x.model.requant_uses) * rms_ref;
    }
    int pre_agree = 0, gen_agree = 0, bad_flip = 0, bad_choice = 0;
    if (ms_engine_forward(x.engine, in->data, n_in, out, 1, &err)) {
        fprintf(stderr, "moonshine verify: %s\n", err.msg);
        goto done;
    }
    double e1 = max_abs(out, ref_logits, (int64_t)n_in * V);
    double mean_abs = 0;
    for (int64_t i = 0; quant && i < (int64_t)n_in * V; i++) mean_abs += fabs((double)out[i] - ref_logits[i]);
    mean_abs /= (double)n_in * V;
    int pre_far = 0; /* prefill rows whose argmax moved although the reference's margin exceeds the bound */
    for (int t = 0; quant && t < n_in; t++) {
        const int32_t want = argmax(ref_logits + (int64_t)t * V, V);
        if (argmax(out + (int64_t)t * V, V) == want) pre_agree++;
        else if (margin_top2(ref_logits + (int64_t)t * V, V, want) > 2 * tol) pre_far++;
    }
    if (dump_f32(dump, out, (int64_t)n_in * V)) goto dump_err;
    ms_engine_reset(x.engine);
    double e2 = 0;
    int ids_match = 1;
    const int32_t *gen_ref = gi->data;
    const float *gen_logits = gl->data;
    if (quant) { /* the choices of the same teacher-forced forwards over the stored tier, then of these */
        ms_vc_init(&vc_ref, &x.model, x.model.requant_rel_rms * sqrt((double)x.model.requant_uses), 1);
        ms_vc_init(&vc_got, &x.model, 0, 0);
        int r = 1;
        if (x.backend || x.stages) vc_why = "the engine cannot report its choices (the CPU backend only)";
        else if ((r = stored_choices(dir, &eo, gp->data, n_gp, gen_ref, n_gen, &vc_ref, &vc_why)) < 0) goto done;
        if (!r && ms_vc_force_from(&vc_got, &vc_ref)) {
            fprintf(stderr, "moonshine verify: out of memory indexing the stored tier's choices\n");
            goto done;
        }
        if (!r && ms_engine_observe_choices(x.engine, ms_vc_observe, &vc_got, &err)) {
            vc_why = "the engine cannot report its choices (the CPU backend only)";
            r = 1;
        }
        vc_on = !r;
    }
    if (ms_engine_forward(x.engine, gp->data, n_gp, out, 0, &err)) {
        fprintf(stderr, "moonshine verify: %s\n", err.msg);
        goto done;
    }
    const double bound = 2 * tol;
    if (!(st = calloc((size_t)(n_gen > 0 ? n_gen : 1), sizeof *st))) goto done;
    for (int i = 0; i < n_gen; i++) {
        double d = max_abs(out, gen_logits + (int64_t)i * V, V);
        if (d > e2) e2 = d;
        int32_t tok = argmax(out, V);
        const float *gr = gen_logits + (int64_t)i * V;
        st[i] = (gen_step){.got = tok, .margin = margin_top2(gr, V, gen_ref[i]), .max_err = d};
        if (tok != gen_ref[i]) {
            ids_match = 0;
            st[i].pair_margin = (double)gr[gen_ref[i]] - gr[tok];
            st[i].pair_err = ((double)out[tok] - gr[tok]) - ((double)out[gen_ref[i]] - gr[gen_ref[i]]);
            if (!quant && (double)gr[gen_ref[i]] - gr[tok] > 2 * d) bad_flip = 1;
        } else {
            gen_agree++;
        }
        if (quant) tok = gen_ref[i]; /* teacher-forced */
        if (dump_f32(dump, out, V)) goto dump_err;
        vc_got.fwd = i + 1;
        if (i + 1 < n_gen && ms_engine_forward(x.engine, &tok, 1, out, 0, &err)) {
            fprintf(stderr, "moonshine verify: %s\n", err.msg);
            goto done;
        }
    }
    /* free-running (quantized tiers only; the stored tier's loop above already is): the engine's own
     * greedy ids from gen_prompt, agreement with gen_ids and the first step that differs */
    int free_agree = 0, free_first = -1;
    if (vc_on) { /* the choices compared; the rule in the comment at tol */
        ms_engine_observe_choices(x.engine, NULL, NULL, &err);
        if (vc_got.oom || ms_vc_compare(&vc_ref, &vc_got, &vc_flips, &n_vc_flips, &vc_unmatched, &vc_compared)) {
            fprintf(stderr, "moonshine verify: out of memory comparing the choices\n");
            goto done;
        }
        bad_choice = ms_vc_judge(vc_flips, n_vc_flips, vc_unmatched);
    }
    for (int i = 0; quant && i < n_gen; i++) /* a greedy flip beyond the bound fails */
        if (st[i].got != gen_ref[i] && st[i].margin > bound) bad_flip = 1;
    if (quant) {
        ms_engine_reset(x.engine);
        if (ms_engine_forward(x.engine, gp->data, n_gp, out, 0, &err)) {
            fprintf(stderr, "moonshine verify: %s\n", err.msg);
            goto done;
        }
        for (int i = 0; i < n_gen; i++) {
            int32_t tok = argmax(out, V);
            if (tok == gen_ref[i]) free_agree++;
            else if (free_first < 0) free_first = i;
            if (i + 1 < n_gen && ms_engine_forward(x.engine, &tok, 1, out, 0, &err)) {
                fprintf(stderr, "moonshine verify: %s\n", err.msg);
                goto done;
            }
        }
    }
    if (dump) {
        int cerr = fclose(dump);
        dump = NULL;
        if (cerr) goto dump_err;
    }
    const char *name = strrchr(dir, '/');
    name = name && name[1] ? name + 1 : dir;
    int ok = quant ? mean_abs <= tol && !bad_flip && !bad_choice : e1 <= TOL && e2 <= TOL && ids_match;
    if (quant) {
        printf("{\"fixture\":\"%s\",\"arch\":\"%s\",\"static_dtype\":\"%s\",\"logits_max_abs_err\":%.3g,"
               "\"logits_mean_abs_err\":%.3g,\"gen_logits_max_abs_err\":%.3g,\"mean_tol\":%.3g,\"eps\":%.3g,\"uses\":%d,"
               "\"ref_rms\":%.3g,\"prefill_argmax_agree\":\"%d/%d\",\"prefill_flips_outside_bound\":%d,\"gen_ids_agree\":\"%d/%d\","
               "\"free_ids_agree\":\"%d/%d\",\"free_first_diff\":%d,\"margin_bound\":%.3g,\"near_ties\":[",
               name, x.model.cfg.model_type, ms_static_dtype_name((ms_static_dtype)x.model.static_dtype), e1, mean_abs, e2, tol,
               x.model.requant_rel_rms, x.model.requant_uses, rms_ref, pre_agree, n_in, pre_far, gen_agree, n_gen, free_agree, n_gen,
               free_first, bound);
        for (int i = 0, k = 0; i < n_gen; i++)
            if (st[i].margin <= bound)
                printf("%s{\"step\":%d,\"margin\":%.3g,\"agree\":%s}", k++ ? "," : "", i, st[i].margin,
                       st[i].got == gen_ref[i] ? "true" : "false");
        printf("],\"flips\":[");
        for (int i = 0, k = 0; i < n_gen; i++)
            if (st[i].got != gen_ref[i])
                printf("%s{\"step\":%d,\"ref\":%d,\"got\":%d,\"margin\":%.3g,\"pair_margin\":%.3g,\"pair_err\":%.3g,"
                       "\"step_max_err\":%.3g,\"near_tie\":%s}",
                       k++ ? "," : "", i, gen_ref[i], st[i].got, st[i].margin, st[i].pair_margin, st[i].pair_err,
                       st[i].max_err, st[i].margin <= bound ? "true" : "false");
        if (vc_on)
            printf("],\"choices_compared\":%lld,\"choices_unmatched\":%d,\"choices_forced\":%lld,\"choice_flips\":[",
                   (long long)vc_compared, vc_unmatched, (long long)vc_got.forced);
        else printf("],\"choices_compared\":null,\"choices_why\":\"%s\",\"choice_flips\":[", vc_why ? vc_why : "");
        for (int i = 0; i < n_vc_flips; i++) {
            const ms_vc_rec *r = &vc_flips[i].ref;
            printf("%s{\"step\":%d,\"kind\":\"%s\",\"layer\":%d,\"pos\":%lld,\"margin\":%.3g,\"bound\":%.3g,"
                   "\"near_tie\":%s,\"first\":%s}",
                   i ? "," : "", r->fwd, r->kind == MS_CHOICE_DSA ? "dsa" : "experts", r->layer, (long long)r->pos,
                   r->margin, r->bound, r->margin <= r->bound ? "true" : "false", vc_flips[i].first ? "true" : "false");
        }
        printf("],\"ok\":%s}\n", ok ? "true" : "false");
    }
    else {
        char actf[48] = "";
        if (eo.cpu_act != MS_ACT_F32) snprintf(actf, sizeof actf, "\"cpu_activations\":\"%s\",", ms_cpu_act_name((ms_cpu_act)eo.cpu_act));
        printf("{\"fixture\":\"%s\",\"arch\":\"%s\",%s\"logits_max_abs_err\":%.3g,\"gen_logits_max_abs_err\":%.3g,"
               "\"gen_ids_match\":%s,\"ok\":%s}\n",
               name, x.model.cfg.model_type, actf, e1, e2, ids_match ? "true" : "false", ok ? "true" : "false");
    }
    rc = ok ? 0 : 1;
    goto done;
dump_err:
    fprintf(stderr, "moonshine verify: %s: write failed: %s\n", dump_path, strerror(errno));
    rc = 1;
done:
    if (dump) fclose(dump);
    free(out), free(st), free(vc_flips);
    ms_vc_free(&vc_ref), ms_vc_free(&vc_got);
    ms_cli_close(&x);
    ms_checkpoint_close(&ref);
    return rc;
}
