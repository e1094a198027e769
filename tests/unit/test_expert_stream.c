/* Expert store + streaming source: bytes identical to the checkpoint in every io mode,
 * from the checkpoint (unaligned extents, fused layouts) and from a packed store; and the
 * failures (truncated store, corrupt expert, another checkpoint's store, too small a
 * budget, a file truncated under the reader) each a named error. */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/expert_stream.h"
#include "io/expert_trace.h"
#include "test.h"

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static uint64_t xs(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

/* A SafeTensors file with `nl` layers (layer 0 dense), E experts per MoE layer, BF16
 * gate/up [I, H], down [H, I], an odd-sized filler before each expert so extents sit at
 * arbitrary offsets; `salt` changes the weights (and, if header_salt, the header). */
static void write_model(const char *path, int nl, int E, int I, int H, uint64_t salt, int header_salt) {
    char *hdr = malloc(1 << 20);
    size_t hl = 0;
    uint64_t off = 0;
    hl += (size_t)sprintf(hdr + hl, "{\"__metadata__\":{\"format\":\"pt\",\"salt\":\"%d\"}", header_salt);
    hl += (size_t)sprintf(hdr + hl, ",\"model.layers.0.mlp.gate_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],"
                                    "\"data_offsets\":[%llu,%llu]}", I, H, (unsigned long long)off,
                          (unsigned long long)(off + 2ull * I * H));
    off += 2ull * I * H;
    const char *roles[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int L = 1; L < nl; L++)
        for (int e = 0; e < E; e++) {
            int fill = 1 + (int)(xs() % 700);
            hl += (size_t)sprintf(hdr + hl, ",\"model.layers.%d.mlp.experts.%d.filler\":{\"dtype\":\"U8\",\"shape\":[%d],"
                                            "\"data_offsets\":[%llu,%llu]}", L, e, fill, (unsigned long long)off,
                                  (unsigned long long)(off + fill));
            off += fill;
            for (int r = 0; r < 3; r++) {
                int a = r < 2 ? I : H, b = r < 2 ? H : I;
                hl += (size_t)sprintf(hdr + hl, ",\"model.layers.%d.mlp.experts.%d.%s.weight\":{\"dtype\":\"BF16\","
                                                "\"shape\":[%d,%d],\"data_offsets\":[%llu,%llu]}", L, e, roles[r], a, b,
                                      (unsigned long long)off, (unsigned long long)(off + 2ull * a * b));
                off += 2ull * a * b;
            }
        }
    hl += (size_t)sprintf(hdr + hl, "}");
    FILE *f = fopen(path, "wb");
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, hl, f);
    uint64_t x = salt * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i < off; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        fputc((int)(x & 0xff), f);
    }
    fclose(f);
    free(hdr);
}

/* Binder that records the role pointers (to compare raw bytes, fused layouts included). */
typedef struct { const void *data[MS_EXPERT_MAX_ROLES]; int n; } capture;
static capture g_cap[64];
static int g_ncap;
static int bind_capture(void *ctx, const ms_expert_bytes *b, ms_expert_view *v, ms_err *err) {
    memset(v, 0, sizeof *v);
    capture *c = &g_cap[g_ncap++ % 64];
    c->n = b->n_roles;
    for (int r = 0; r < b->n_roles; r++) c->data[r] = b->data[r];
    return 0;
}

/* The checkpoint's own bytes of (layer, expert, role) under naming nm. */
static const uint8_t *ref_bytes(const ms_checkpoint *ck, const ms_expert_naming *nm, const ms_expert_store *st,
                                int li, int L, int e, int r) {
    char name[512];
    snprintf(name, sizeof name, nm->roles[r].pattern, L, e);
    const ms_tensor *t = ms_checkpoint_find(ck, name);
    if (!t) return NULL;
    const ms_expert_role_info *ri = ms_expert_store_role(st, li, r);
    return (const uint8_t *)t->data + (nm->roles[r].fused ? (uint64_t)e * ri->nbytes : 0);
}

/* Acquire every expert of every layer (k at a time) and compare every role's bytes. */
static int check_all(const ms_checkpoint *ck, const ms_expert_naming *nm, const ms_expert_store *st, ms_io_mode mode,
                     uint64_t budget, int k, const char *what) {
    ms_err e = {0};
    ms_expert_source *src;
    char why[600];
    ms_stream_opts o = {.budget_bytes = budget, .min_slots = k, .io = mode, .queue_depth = 4, .verify = 1,
                        .bind = bind_capture};
    int rc = ms_stream_source_create(st, &o, &src, why, sizeof why, &e);
    CHECK_MSG(rc == 0, "%s: %s", what, e.msg);
    if (rc) return 0;
    int bad = 0;
    for (int li = 0; li < st->n_layers; li++) {
        int L = st->layer_id[li];
        for (int e0 = 0; e0 < st->n_experts; e0 += k) {
            int ids[16], n = 0;
            for (int j = 0; j < k && e0 + j < st->n_experts; j++) ids[n++] = (e0 + j * 7) % st->n_experts;
            /* prefetch the next group: exercises prefetch and its accounting */
            int nx[16], nn = 0;
            for (int j = 0; j < k && e0 + k + j < st->n_experts; j++) nx[nn++] = e0 + k + j;
            ms_expert_view v[16];
            g_ncap = 0;
            rc = ms_experts_acquire(src, L, n, ids, v, &e);
            CHECK_MSG(rc == 0, "%s: %s", what, e.msg);
            if (rc) { bad++; break; }
            ms_experts_prefetch(src, L, nn, nx);
            for (int j = 0; j < n; j++)
                for (int r = 0; r < st->n_roles; r++) {
                    const ms_expert_role_info *ri = ms_expert_store_role(st, li, r);
                    const uint8_t *ref = ref_bytes(ck, nm, st, li, L, ids[j], r);
                    if (!ri->present) { bad += g_cap[j].data[r] != NULL; continue; }
                    if (!ref || !g_cap[j].data[r] || memcmp(ref, g_cap[j].data[r], ri->nbytes)) {
                        bad++;
                        fprintf(stderr, "%s: layer %d expert %d role %s differs\n", what, L, ids[j], ri->name);
                    }
                }
            ms_experts_release(src, L);
        }
    }
    ms_stream_stats s;
    ms_stream_source_stats(src, &s);
    CHECK_MSG((int)s.mode == (int)mode || mode == MS_IO_AUTO, "%s: %s", what, why);
    CHECK(s.hits + s.misses == s.acquires && s.bytes_read > 0);
    CHECK(s.prefetch_used <= s.prefetch_issued);
    src->ops->destroy(src);
    CHECK_MSG(bad == 0, "%s: %d mismatches", what, bad);
    return bad == 0;
}

static const ms_io_mode k_modes[] = {MS_IO_URING, MS_IO_PREAD, MS_IO_MMAP};

TEST(synthetic_unaligned_all_modes_and_packed) {
    mkdir("build/tmp", 0755);
    const char *path = "build/tmp/stream_model.safetensors";
    write_model(path, 3, 10, 24, 40, 1, 0);
    ms_checkpoint ck;
    ms_err e = {0};
    CHECK_MSG(ms_checkpoint_open(path, &ck, &e) == 0, "%s", e.msg);
    ms_expert_naming nm;
    CHECK_MSG(ms_expert_naming_detect(&ck, &nm, &e) == 0, "%s", e.msg);
    CHECK(nm.n_roles == 6 && !strcmp(nm.roles[0].name, "gate"));
    ms_expert_store st;
    CHECK_MSG(ms_expert_store_from_checkpoint(&ck, &nm, 3, 0, &st, &e) == 0, "%s", e.msg);
    CHECK(st.n_layers == 2 && st.layer_id[0] == 1 && st.n_experts == 10 && st.store_layer[0] == -1);
    /* gate, up, down of one expert are adjacent: one piece */
    CHECK(ms_expert_store_loc(&st, 0, 3)->n_pieces == 1);
    for (size_t m = 0; m < 3; m++) {
        check_all(&ck, &nm, &st, k_modes[m], 0, 3, ms_io_mode_name(k_modes[m]));
        check_all(&ck, &nm, &st, k_modes[m], st.buf_bytes * 7, 4, ms_io_mode_name(k_modes[m]));
    }
    /* packed: one record per expert, same bytes */
    const char *dirs[2] = {"build/tmp/stream_store_d0", "build/tmp/stream_store_d1"};
    ms_pack_stats ps;
    CHECK_MSG(ms_expert_pack(&ck, &st, "build/tmp/stream_store", dirs, 2, &ps, &e) == 0, "%s", e.msg);
    CHECK(ps.n_files == 2);
    ms_expert_store pk;
    CHECK_MSG(ms_expert_store_open_packed("build/tmp/stream_store", &ck, &st, &pk, &e) == 0, "%s", e.msg);
    CHECK(pk.packed && pk.n_files == 2 && strstr(pk.paths[1], "stream_store_d1"));
    for (size_t m = 0; m < 3; m++) check_all(&ck, &nm, &pk, k_modes[m], 0, 2, "packed");

    /* default binder over a slot: shapes from the roles, bytes from the slot */
    ms_expert_source *src;
    ms_stream_opts o = {.min_slots = 1, .io = MS_IO_AUTO, .verify = 1};
    CHECK(ms_stream_source_create(&pk, &o, &src, NULL, 0, &e) == 0);
    int id = 5;
    ms_expert_view v;
    CHECK_MSG(ms_experts_acquire(src, 2, 1, &id, &v, &e) == 0, "%s", e.msg);
    const ms_tensor *t = ms_checkpoint_find(&ck, "model.layers.2.mlp.experts.5.down_proj.weight");
    CHECK(v.down.dtype == MS_DT_BF16 && v.down.rows == 40 && v.down.cols == 24 && v.gate.rows == 24);
    CHECK(!memcmp(v.down.data, t->data, t->nbytes));
    /* acquiring more than the cache holds is a clear error */
    int two[2] = {1, 2};
    ms_experts_release(src, 2);
    CHECK(ms_experts_acquire(src, 2, 2, two, (ms_expert_view[2]){0}, &e) == MS_ERR_NOMEM && strstr(e.msg, "holds 1"));
    CHECK(ms_experts_acquire(src, 0, 1, &id, &v, &e) == MS_ERR_ARG && strstr(e.msg, "layer 0"));
    id = 10;
    CHECK(ms_experts_acquire(src, 1, 1, &id, &v, &e) == MS_ERR_ARG);
    src->ops->destroy(src);

    /* budget too small for one layer's top-k */
    e = (ms_err){0};
    ms_stream_opts small = {.budget_bytes = pk.buf_bytes * 3, .min_slots = 4};
    CHECK(ms_stream_source_create(&pk, &small, &src, NULL, 0, &e) == MS_ERR_NOMEM);
    CHECK_MSG(strstr(e.msg, "top-4") && strstr(e.msg, "holds 3"), "%s", e.msg);

    /* corrupt expert: flip one byte of layer 2 expert 6's record */
    int fd = open(pk.paths[1], O_RDWR);
    const ms_expert_loc *l = ms_expert_store_loc(&pk, 1, 6);
    uint8_t byte;
    CHECK(pread(fd, &byte, 1, (off_t)(l->piece[0].offset + 100)) == 1);
    byte ^= 0x40;
    CHECK(pwrite(fd, &byte, 1, (off_t)(l->piece[0].offset + 100)) == 1);
    close(fd);
    for (size_t m = 0; m < 3; m++) {
        ms_stream_opts oc = {.min_slots = 2, .io = k_modes[m], .verify = 1};
        CHECK(ms_stream_source_create(&pk, &oc, &src, NULL, 0, &e) == 0);
        int ids[2] = {5, 6};
        e = (ms_err){0};
        int rc = ms_experts_acquire(src, 2, 2, ids, (ms_expert_view[2]){0}, &e);
        CHECK_MSG(rc == MS_ERR_MISMATCH && strstr(e.msg, "layer 2 expert 6") && strstr(e.msg, "checksum") &&
                      strstr(e.msg, "experts-L0002.bin"),
                  "%d %s", rc, e.msg);
        /* the source stays usable */
        ids[1] = 7;
        CHECK(ms_experts_acquire(src, 2, 2, ids, (ms_expert_view[2]){0}, &e) == 0);
        src->ops->destroy(src);
    }
    /* truncated store */
    CHECK(truncate(pk.paths[0], (off_t)(ms_expert_store_loc(&pk, 0, 9)->piece[0].offset + 10)) == 0);
    ms_expert_store pk2;
    e = (ms_err){0};
    CHECK(ms_expert_store_open_packed("build/tmp/stream_store", &ck, &st, &pk2, &e) == MS_ERR_IO);
    CHECK_MSG(strstr(e.msg, "truncated") && strstr(e.msg, "layer 1"), "%s", e.msg);
    ms_expert_store_free(&pk);

    /* a store from another checkpoint: other weights, same header; then another header */
    mkdir("build/tmp/ck2", 0755);
    const char *p2 = "build/tmp/ck2/stream_model.safetensors"; /* same file name, other weights */
    rs = 0x2545F4914F6CDD1Dull;
    write_model(p2, 3, 10, 24, 40, 2, 0);
    rs = 0x2545F4914F6CDD1Dull;
    write_model(path, 3, 10, 24, 40, 1, 0); /* repair the first store's source: repack below */
    ms_checkpoint ck2;
    CHECK(ms_checkpoint_open(p2, &ck2, &e) == 0);
    CHECK(ms_expert_pack(&ck, &st, "build/tmp/stream_store", NULL, 0, &ps, &e) == 0);
    e = (ms_err){0};
    CHECK(ms_expert_store_open_packed("build/tmp/stream_store", &ck2, &st, &pk2, &e) == MS_ERR_MISMATCH);
    CHECK_MSG(strstr(e.msg, "another checkpoint") && strstr(e.msg, "weights"), "%s", e.msg);
    ms_checkpoint_close(&ck2);
    write_model(p2, 3, 10, 24, 40, 1, 7);
    CHECK(ms_checkpoint_open(p2, &ck2, &e) == 0);
    e = (ms_err){0};
    CHECK(ms_expert_store_open_packed("build/tmp/stream_store", &ck2, &st, &pk2, &e) == MS_ERR_MISMATCH);
    CHECK_MSG(strstr(e.msg, "another checkpoint"), "%s", e.msg);
    ms_checkpoint_close(&ck2);
    CHECK(ms_expert_store_open_packed("build/tmp/stream_store", &ck, &st, &pk2, &e) == 0);
    ms_expert_store_free(&pk2);
    ms_expert_store_free(&st);
    ms_checkpoint_close(&ck);
}

/* The trace a live source records, replayed without I/O, reproduces the live cache's
 * bookkeeping (same requests; hits equal up to reads still in flight when a victim was
 * chosen), for both policies, with lookahead-like prefetches that are right 60% of the time. */
TEST(trace_replay_reproduces_live_cache) {
    mkdir("build/tmp", 0755);
    const char *path = "build/tmp/stream_trace_model.safetensors";
    write_model(path, 3, 12, 16, 32, 5, 0);
    ms_checkpoint ck;
    ms_err e = {0};
    CHECK_MSG(ms_checkpoint_open(path, &ck, &e) == 0, "%s", e.msg);
    ms_expert_naming nm;
    ms_expert_store st;
    CHECK(ms_expert_naming_detect(&ck, &nm, &e) == 0 && ms_expert_store_from_checkpoint(&ck, &nm, 3, 0, &st, &e) == 0);
    for (int pol = 0; pol < 2; pol++) {
        const char *tp = "build/tmp/stream_live.trace";
        ms_stream_opts o = {.budget_bytes = st.buf_bytes * 8, .min_slots = 3, .io = MS_IO_PREAD,
                            .policy = pol ? MS_CACHE_LRU : MS_CACHE_LFU_DECAY, .trace_path = tp};
        ms_expert_source *src;
        CHECK_MSG(ms_stream_source_create(&st, &o, &src, NULL, 0, &e) == 0, "%s", e.msg);
        uint64_t x = 12345;
        int next[3] = {0, 1, 2};
        for (int t = 0; t < 300; t++)
            for (int L = 1; L <= 2; L++) {
                int ids[3];
                for (int j = 0; j < 3; j++) { /* skewed: low ids more often; 60% as predicted */
                    int d;
                    do {
                        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                        ids[j] = (x % 10) < 6 && L == 2 ? next[j] : (int)((x >> 8) % 12 * ((x >> 20) % 12) / 12);
                        d = 0;
                        for (int q = 0; q < j; q++) d |= ids[q] == ids[j];
                        if (d) next[j] = (next[j] + 1) % 12;
                    } while (d);
                }
                ms_expert_view v[3];
                CHECK_MSG(ms_experts_acquire(src, L, 3, ids, v, &e) == 0, "%s", e.msg);
                if (L == 1) {
                    for (int j = 0; j < 3; j++) next[j] = (int)((x >> (4 * j + 30)) % 12);
                    if (next[1] == next[0]) next[1] = (next[0] + 1) % 12;
                    while (next[2] == next[0] || next[2] == next[1]) next[2] = (next[2] + 1) % 12;
                    ms_experts_prefetch(src, 2, 3, next);
                }
                ms_experts_release(src, L);
            }
        ms_stream_stats live;
        ms_stream_source_stats(src, &live);
        src->ops->destroy(src);
        ms_trace_replay_opts ro = {.policy = o.policy, .n_slots = 8};
        ms_trace_replay_result r;
        CHECK_MSG(ms_expert_trace_replay(tp, &ro, &r, &e) == 0, "%s", e.msg);
        CHECK(r.acquires == 600 && r.st.requests == live.acquires && live.acquires == 1800);
        double dh = (double)r.st.hits - (double)live.hits;
        CHECK_MSG(fabs(dh) <= 0.03 * (double)live.acquires && live.prefetch_issued > 0,
                  "policy %d: live hits %llu, replay %llu", pol, (unsigned long long)live.hits,
                  (unsigned long long)r.st.hits);
        printf("trace replay (%s): live hits %llu / %llu, prefetch %llu used of %llu; replay hits %llu, prefetch %llu of %llu\n",
               ms_cache_policy_name(o.policy), (unsigned long long)live.hits, (unsigned long long)live.acquires,
               (unsigned long long)live.prefetch_used, (unsigned long long)live.prefetch_issued,
               (unsigned long long)r.st.hits, (unsigned long long)r.st.prefetch_used,
               (unsigned long long)r.st.prefetch_issued);
    }
    ms_expert_store_free(&st);
    ms_checkpoint_close(&ck);
}

TEST(read_error_names_layer_expert_file) {
    const char *path = "build/tmp/stream_trunc.safetensors";
    write_model(path, 2, 6, 32, 64, 3, 0);
    ms_checkpoint ck;
    ms_err e = {0};
    CHECK(ms_checkpoint_open(path, &ck, &e) == 0);
    ms_expert_naming nm;
    ms_expert_store st;
    CHECK(ms_expert_naming_detect(&ck, &nm, &e) == 0);
    CHECK(ms_expert_store_from_checkpoint(&ck, &nm, 2, 0, &st, &e) == 0);
    uint64_t cut = ms_expert_store_loc(&st, 0, 4)->piece[0].offset + 5;
    ms_checkpoint_close(&ck); /* nothing maps it any more */
    for (size_t m = 0; m < 2; m++) { /* uring, pread (mmap would fault on a file shrunk under it) */
        ms_expert_source *src;
        ms_stream_opts o = {.min_slots = 1, .io = k_modes[m]};
        CHECK(ms_stream_source_create(&st, &o, &src, NULL, 0, &e) == 0);
        CHECK(truncate(path, (off_t)cut) == 0);
        int id = 5;
        e = (ms_err){0};
        int rc = ms_experts_acquire(src, 1, 1, &id, (ms_expert_view[1]){0}, &e);
        CHECK_MSG(rc == MS_ERR_IO && strstr(e.msg, "layer 1 expert 5") && strstr(e.msg, path), "%d %s", rc, e.msg);
        src->ops->destroy(src);
    }
    ms_expert_store_free(&st);
}

static int n_layers_of(const ms_checkpoint *ck) { (void)ck; return 64; }

TEST(fixtures_every_layout) {
    const char *names[] = {"qwen3_moe", "deepseek_v3_fp8", "gpt_oss", "gpt_oss_mxfp4", "kimi_k3_mxfp4", "glm5_next",
                           "minimax_m2", "kimi_linear_fp8", "deepseek_v4"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, MS_TEST_FIXTURES "%s", names[i]);
        ms_checkpoint ck;
        ms_err e = {0};
        if (ms_checkpoint_open(dir, &ck, &e)) { CHECK_MSG(0, "%s", e.msg); continue; }
        ms_expert_naming nm;
        int rc = ms_expert_naming_detect(&ck, &nm, &e);
        CHECK_MSG(rc == 0, "%s: %s", names[i], e.msg);
        ms_expert_store st;
        if (!rc) rc = ms_expert_store_from_checkpoint(&ck, &nm, n_layers_of(&ck), 0, &st, &e);
        CHECK_MSG(rc == 0, "%s: %s", names[i], e.msg);
        if (!rc) {
            check_all(&ck, &nm, &st, MS_IO_URING, 0, 2, names[i]);
            check_all(&ck, &nm, &st, MS_IO_MMAP, 0, 2, names[i]);
            char out[256];
            snprintf(out, sizeof out, "build/tmp/store_%s", names[i]);
            ms_expert_store pk;
            CHECK_MSG(ms_expert_pack(&ck, &st, out, NULL, 0, NULL, &e) == 0, "%s", e.msg);
            CHECK_MSG(ms_expert_store_open_packed(out, &ck, &st, &pk, &e) == 0, "%s", e.msg);
            check_all(&ck, &nm, &pk, MS_IO_URING, 0, 3, names[i]);
            ms_expert_store_free(&pk);
            ms_expert_store_free(&st);
        }
        ms_checkpoint_close(&ck);
    }
}

TEST(naming_patterns_validated) {
    ms_expert_naming nm = {0};
    ms_err e = {0};
    CHECK(ms_expert_naming_add(&nm, "gate", "a.%d.b.%d.w", 0, 0, &e) == 0);
    CHECK(ms_expert_naming_add(&nm, "up", "a.%d.b.%s.w", 0, 0, &e) == MS_ERR_ARG);
    CHECK(ms_expert_naming_add(&nm, "up", "a.%d.b.w", 0, 0, &e) == MS_ERR_ARG);
    CHECK(ms_expert_naming_add(&nm, "up", "a.%d.b.%d.%d", 0, 0, &e) == MS_ERR_ARG);
    CHECK(ms_expert_naming_add(&nm, "up", "a.%d.fused", 1, 0, &e) == 0);
    CHECK(ms_expert_naming_add(&nm, "up", "a.%d.other", 1, 0, &e) == MS_ERR_ARG); /* twice */
    CHECK(ms_expert_naming_add(&nm, "pct", "a%%.%d.x", 1, 0, &e) == 0);
}

TEST_MAIN()
