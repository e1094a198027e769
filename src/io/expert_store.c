#include "io/expert_store.h"

#include "util/progress.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "io/reader.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/json.h"

#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))
/* extents of one expert closer than this in one file are read as one piece */
#define MERGE_GAP (16u << 10)

/* ---- naming ---- */

/* Number of %d in pattern, or -1 when it has any other conversion. */
static int pattern_ints(const char *p) {
    int n = 0;
    for (; *p; p++) {
        if (*p != '%') continue;
        if (p[1] == '%') { p++; continue; }
        if (p[1] == 'd') { n++; p++; continue; }
        return -1;
    }
    return n;
}

static int fmt_name(char *out, size_t cap, const char *pat, int a, int b) {
    int n = snprintf(out, cap, pat, a, b); /* validated: only %d/%% */
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int ms_expert_naming_add(ms_expert_naming *nm, const char *name, const char *pattern, int fused, int optional,
                         ms_err *err) {
    if (nm->n_roles >= MS_EXPERT_MAX_ROLES)
        return ms_fail(err, MS_ERR_ARG, "expert naming: more than %d roles", MS_EXPERT_MAX_ROLES);
    if (!name || !*name || strlen(name) >= MS_EXPERT_ROLE_NAME)
        return ms_fail(err, MS_ERR_ARG, "expert naming: role name \"%.40s\" empty or too long", name ? name : "");
    if (!pattern || strlen(pattern) >= sizeof nm->roles[0].pattern)
        return ms_fail(err, MS_ERR_ARG, "expert naming: role %s: pattern missing or too long", name);
    int k = pattern_ints(pattern);
    if (k != (fused ? 1 : 2))
        return ms_fail(err, MS_ERR_ARG,
                       "expert naming: role %s: pattern \"%s\" must have exactly %d %%d (%s) and no other conversion",
                       name, pattern, fused ? 1 : 2, fused ? "layer" : "layer, expert");
    for (int i = 0; i < nm->n_roles; i++)
        if (!strcmp(nm->roles[i].name, name))
            return ms_fail(err, MS_ERR_ARG, "expert naming: role %s given twice", name);
    ms_expert_role_spec *r = &nm->roles[nm->n_roles++];
    memset(r, 0, sizeof *r);
    strcpy(r->name, name);
    strcpy(r->pattern, pattern);
    r->fused = fused;
    r->optional = optional;
    return MS_OK;
}

static int first_required(const ms_expert_naming *nm) {
    for (int r = 0; r < nm->n_roles; r++)
        if (!nm->roles[r].optional) return r;
    return -1;
}

static const ms_tensor *role_tensor(const ms_checkpoint *ck, const ms_expert_role_spec *rs, int layer, int e) {
    char name[512];
    if (fmt_name(name, sizeof name, rs->pattern, layer, e)) return NULL;
    return ms_checkpoint_find(ck, name);
}

int ms_expert_naming_detect(const ms_checkpoint *ck, ms_expert_naming *nm, ms_err *err) {
    static const char *prefixes[] = {"model.layers", "model.language_model.layers", "language_model.model.layers"};
    /* family: {role name, suffix, fused, optional} ... */
    typedef struct { const char *role, *suffix; int fused, optional; } R;
    static const R fam[][10] = {
        {{"gate", "mlp.experts.%d.gate_proj.weight", 0, 0}, {"up", "mlp.experts.%d.up_proj.weight", 0, 0},
         {"down", "mlp.experts.%d.down_proj.weight", 0, 0},
         {"gate_scale", "mlp.experts.%d.gate_proj.weight_scale_inv", 0, 1},
         {"up_scale", "mlp.experts.%d.up_proj.weight_scale_inv", 0, 1},
         {"down_scale", "mlp.experts.%d.down_proj.weight_scale_inv", 0, 1}},
        /* asymmetric INT4 (compressed-tensors symmetric: false): + weight_zero_point, before the symmetric form */
        {{"gate", "mlp.experts.%d.gate_proj.weight_packed", 0, 0}, {"up", "mlp.experts.%d.up_proj.weight_packed", 0, 0},
         {"down", "mlp.experts.%d.down_proj.weight_packed", 0, 0},
         {"gate_scale", "mlp.experts.%d.gate_proj.weight_scale", 0, 0},
         {"up_scale", "mlp.experts.%d.up_proj.weight_scale", 0, 0},
         {"down_scale", "mlp.experts.%d.down_proj.weight_scale", 0, 0},
         {"gate_zero", "mlp.experts.%d.gate_proj.weight_zero_point", 0, 0},
         {"up_zero", "mlp.experts.%d.up_proj.weight_zero_point", 0, 0},
         {"down_zero", "mlp.experts.%d.down_proj.weight_zero_point", 0, 0}},
        {{"gate", "mlp.experts.%d.gate_proj.weight_packed", 0, 0}, {"up", "mlp.experts.%d.up_proj.weight_packed", 0, 0},
         {"down", "mlp.experts.%d.down_proj.weight_packed", 0, 0},
         {"gate_scale", "mlp.experts.%d.gate_proj.weight_scale", 0, 0},
         {"up_scale", "mlp.experts.%d.up_proj.weight_scale", 0, 0},
         {"down_scale", "mlp.experts.%d.down_proj.weight_scale", 0, 0}},
        {{"gate", "block_sparse_moe.experts.%d.w1.weight", 0, 0}, {"up", "block_sparse_moe.experts.%d.w3.weight", 0, 0},
         {"down", "block_sparse_moe.experts.%d.w2.weight", 0, 0},
         {"gate_scale", "block_sparse_moe.experts.%d.w1.weight_scale_inv", 0, 1},
         {"up_scale", "block_sparse_moe.experts.%d.w3.weight_scale_inv", 0, 1},
         {"down_scale", "block_sparse_moe.experts.%d.w2.weight_scale_inv", 0, 1}},
        {{"gate", "block_sparse_moe.experts.%d.w1.weight_packed", 0, 0},
         {"up", "block_sparse_moe.experts.%d.w3.weight_packed", 0, 0},
         {"down", "block_sparse_moe.experts.%d.w2.weight_packed", 0, 0},
         {"gate_scale", "block_sparse_moe.experts.%d.w1.weight_scale", 0, 0},
         {"up_scale", "block_sparse_moe.experts.%d.w3.weight_scale", 0, 0},
         {"down_scale", "block_sparse_moe.experts.%d.w2.weight_scale", 0, 0}},
        {{"gate", "ffn.experts.%d.w1.weight", 0, 0}, {"up", "ffn.experts.%d.w3.weight", 0, 0},
         {"down", "ffn.experts.%d.w2.weight", 0, 0},
         {"gate_scale", "ffn.experts.%d.w1.weight_scale_inv", 0, 1},
         {"up_scale", "ffn.experts.%d.w3.weight_scale_inv", 0, 1},
         {"down_scale", "ffn.experts.%d.w2.weight_scale_inv", 0, 1}},
        {{"gate_up", "mlp.experts.gate_up_proj", 1, 0}, {"down", "mlp.experts.down_proj", 1, 0},
         {"gate_up_bias", "mlp.experts.gate_up_proj_bias", 1, 1}, {"down_bias", "mlp.experts.down_proj_bias", 1, 1}},
        {{"gate_up", "mlp.experts.gate_up_proj_blocks", 1, 0}, {"gate_up_scale", "mlp.experts.gate_up_proj_scales", 1, 0},
         {"down", "mlp.experts.down_proj_blocks", 1, 0}, {"down_scale", "mlp.experts.down_proj_scales", 1, 0},
         {"gate_up_bias", "mlp.experts.gate_up_proj_bias", 1, 1}, {"down_bias", "mlp.experts.down_proj_bias", 1, 1}},
    };
    for (size_t p = 0; p < sizeof prefixes / sizeof *prefixes; p++)
        for (size_t f = 0; f < sizeof fam / sizeof *fam; f++) {
            ms_expert_naming cand = {0};
            int ok = 1;
            for (int r = 0; r < 10 && fam[f][r].role && ok; r++) {
                char pat[200];
                snprintf(pat, sizeof pat, "%s.%%d.%s", prefixes[p], fam[f][r].suffix);
                ok = ms_expert_naming_add(&cand, fam[f][r].role, pat, fam[f][r].fused, fam[f][r].optional, NULL) == 0;
            }
            if (!ok) continue;
            /* every required role exists for expert 0 of some layer */
            for (int L = 0; L < 1024; L++) {
                int all = 1, any = 0;
                for (int r = 0; r < cand.n_roles; r++) {
                    if (cand.roles[r].optional) continue;
                    int has = role_tensor(ck, &cand.roles[r], L, 0) != NULL;
                    all &= has;
                    any |= has;
                }
                if (all) {
                    *nm = cand;
                    return MS_OK;
                }
                (void)any;
            }
        }
    return ms_fail(err, MS_ERR_UNSUPPORTED,
                   "%s: no known routed-expert tensor naming matches (tried mlp.experts.N.{gate,up,down}_proj, "
                   "block_sparse_moe.experts.N.w1/w2/w3, ffn.experts.N.w1/w2/w3, fused mlp.experts.gate_up_proj)",
                   ck->dir);
}

/* ---- store from checkpoint ---- */

void ms_expert_store_free(ms_expert_store *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) free(st->paths[i]);
    free(st->paths);
    free(st->layer_id);
    free(st->store_layer);
    free(st->roles);
    free(st->loc);
    memset(st, 0, sizeof *st);
}

void ms_expert_place(const ms_expert_store *st, int li, int e, uint64_t *piece_base, uint64_t *role_at) {
    const ms_expert_loc *l = ms_expert_store_loc(st, li, e);
    uint64_t o = 0;
    for (int p = 0; p < l->n_pieces; p++) {
        piece_base[p] = o;
        o += ms_read_span(l->piece[p].offset, l->piece[p].len);
    }
    for (int r = 0; r < st->n_roles; r++) {
        int p = l->role_piece[r];
        role_at[r] = p < 0 ? UINT64_MAX : piece_base[p] + (l->piece[p].offset & (MS_IO_ALIGN - 1)) + l->role_off[r];
    }
}

typedef struct { int role; int file; uint64_t off, len; } ext_t;
static int cmp_ext(const void *a, const void *b) {
    const ext_t *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Group an expert's role extents into pieces; fills loc (not crc). */
static void make_pieces(ext_t *ex, int n, int n_roles, ms_expert_loc *loc) {
    qsort(ex, (size_t)n, sizeof *ex, cmp_ext);
    loc->n_pieces = 0;
    for (int r = 0; r < MS_EXPERT_MAX_ROLES; r++) loc->role_piece[r] = -1;
    (void)n_roles;
    for (int i = 0; i < n; i++) {
        ms_extent *cur = loc->n_pieces ? &loc->piece[loc->n_pieces - 1] : NULL;
        if (cur && cur->file == ex[i].file && ex[i].off >= cur->offset &&
            ex[i].off <= cur->offset + cur->len + MERGE_GAP) {
            uint64_t end = ex[i].off + ex[i].len;
            if (end > cur->offset + cur->len) cur->len = end - cur->offset;
        } else {
            cur = &loc->piece[loc->n_pieces++];
            cur->file = ex[i].file;
            cur->offset = ex[i].off;
            cur->len = ex[i].len;
        }
        loc->role_piece[ex[i].role] = (int8_t)(loc->n_pieces - 1);
        loc->role_off[ex[i].role] = ex[i].off - cur->offset;
    }
}

static int same_shape(const ms_expert_role_info *a, ms_dtype dt, int nd, const int64_t *sh) {
    if (a->dtype != dt || a->ndim != nd) return 0;
    for (int i = 0; i < nd; i++)
        if (a->shape[i] != sh[i]) return 0;
    return 1;
}

static void store_finish_sizes(ms_expert_store *st) {
    st->buf_bytes = st->data_bytes = st->total_read_bytes = 0;
    for (int li = 0; li < st->n_layers; li++) {
        uint64_t data = 0;
        for (int r = 0; r < st->n_roles; r++) {
            const ms_expert_role_info *ri = ms_expert_store_role(st, li, r);
            if (ri->present) data += ri->nbytes;
        }
        if (data > st->data_bytes) st->data_bytes = data;
        for (int e = 0; e < st->n_experts; e++) {
            const ms_expert_loc *l = ms_expert_store_loc(st, li, e);
            uint64_t b = 0;
            for (int p = 0; p < l->n_pieces; p++) {
                b += ms_read_span(l->piece[p].offset, l->piece[p].len);
                st->total_read_bytes += l->piece[p].len;
            }
            if (b > st->buf_bytes) st->buf_bytes = b;
        }
    }
}

static int store_alloc(ms_expert_store *st, int n_layers, int n_model_layers, int n_experts, int n_roles,
                       ms_err *err) {
    st->n_layers = n_layers;
    st->n_model_layers = n_model_layers;
    st->n_experts = n_experts;
    st->n_roles = n_roles;
    st->layer_id = calloc((size_t)n_layers, sizeof *st->layer_id);
    st->store_layer = malloc((size_t)n_model_layers * sizeof *st->store_layer);
    st->roles = calloc((size_t)n_layers * n_roles, sizeof *st->roles);
    st->loc = calloc((size_t)n_layers * n_experts, sizeof *st->loc);
    if (!st->layer_id || !st->store_layer || !st->roles || !st->loc)
        return ms_fail(err, MS_ERR_NOMEM, "expert store: out of memory for %d layers x %d experts", n_layers, n_experts);
    for (int i = 0; i < n_model_layers; i++) st->store_layer[i] = -1;
    return MS_OK;
}

int ms_expert_store_from_checkpoint(const ms_checkpoint *ck, const ms_expert_naming *nm, int n_model_layers,
                                    int n_experts, ms_expert_store *st, ms_err *err) {
    memset(st, 0, sizeof *st);
    int r0 = first_required(nm);
    if (r0 < 0) return ms_fail(err, MS_ERR_ARG, "expert naming has no required role");
    if (n_model_layers < 1 || n_model_layers > 4096)
        return ms_fail(err, MS_ERR_ARG, "expert store: %d model layers (1..4096)", n_model_layers);
    if (n_experts < 0 || n_experts > 65536) return ms_fail(err, MS_ERR_ARG, "expert store: %d experts", n_experts);
    const ms_expert_role_spec *s0 = &nm->roles[r0];
    /* which layers have experts, and how many */
    int n_layers = 0, E = n_experts;
    for (int L = 0; L < n_model_layers; L++) {
        const ms_tensor *t = role_tensor(ck, s0, L, 0);
        if (!t) continue;
        int e_here;
        if (s0->fused) {
            if (t->ndim < 2)
                return ms_fail(err, MS_ERR_FORMAT, "%s: fused expert tensor has %d dims (need [experts, ...])",
                               t->name, t->ndim);
            e_here = (int)(t->shape[0] > 65536 ? 65537 : t->shape[0]);
        } else {
            e_here = 0;
            while (e_here < 65537 && role_tensor(ck, s0, L, e_here)) e_here++;
        }
        if (!E) E = e_here;
        if (e_here != E)
            return ms_fail(err, MS_ERR_SHAPE, "layer %d has %d experts (role %s), expected %d", L, e_here, s0->name, E);
        n_layers++;
    }
    if (!n_layers)
        return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: no layer has routed experts named like \"%s\"", ck->dir,
                       s0->pattern);
    if (E < 1 || E > 65536) return ms_fail(err, MS_ERR_FORMAT, "expert store: %d experts per layer", E);
    int rc = store_alloc(st, n_layers, n_model_layers, E, nm->n_roles, err);
    if (rc) goto fail;
    st->n_files = ck->n_files;
    st->paths = calloc((size_t)ck->n_files, sizeof *st->paths);
    if (!st->paths) { rc = ms_fail(err, MS_ERR_NOMEM, "out of memory"); goto fail; }
    for (int i = 0; i < ck->n_files; i++)
        if (!(st->paths[i] = strdup(ck->files[i].path))) { rc = ms_fail(err, MS_ERR_NOMEM, "out of memory"); goto fail; }
    int li = 0;
    for (int L = 0; L < n_model_layers; L++) {
        if (!role_tensor(ck, s0, L, 0)) continue;
        st->layer_id[li] = L;
        st->store_layer[L] = li;
        for (int r = 0; r < nm->n_roles; r++) {
            const ms_expert_role_spec *rs = &nm->roles[r];
            ms_expert_role_info *ri = &st->roles[li * nm->n_roles + r];
            strcpy(ri->name, rs->name);
            const ms_tensor *t0 = role_tensor(ck, rs, L, 0);
            if (!t0) {
                if (rs->optional) continue;
                char nb[512];
                fmt_name(nb, sizeof nb, rs->pattern, L, 0);
                rc = ms_fail(err, MS_ERR_SHAPE, "layer %d expert 0: tensor \"%s\" (role %s) is missing", L, nb, rs->name);
                goto fail;
            }
            ri->present = 1;
            ri->dtype = t0->dtype;
            if (rs->fused) {
                if (t0->ndim < 1 || t0->shape[0] != E) {
                    rc = ms_fail(err, MS_ERR_FORMAT, "layer %d: fused tensor \"%s\" (role %s): dim 0 is not %d experts",
                                 L, t0->name, rs->name, E);
                    goto fail;
                }
                ri->ndim = t0->ndim - 1;
                for (int d = 1; d < t0->ndim; d++) ri->shape[d - 1] = t0->shape[d];
                ri->nbytes = t0->nbytes / (uint64_t)E;
                if (ri->nbytes * (uint64_t)E != t0->nbytes) {
                    rc = ms_fail(err, MS_ERR_FORMAT, "layer %d: fused tensor \"%s\": %" PRIu64 " bytes do not split "
                                 "into %d experts", L, t0->name, t0->nbytes, E);
                    goto fail;
                }
            } else {
                ri->ndim = t0->ndim;
                memcpy(ri->shape, t0->shape, sizeof ri->shape);
                ri->nbytes = t0->nbytes;
            }
        }
        for (int e = 0; e < E; e++) {
            ext_t ex[MS_EXPERT_MAX_ROLES];
            int n = 0;
            for (int r = 0; r < nm->n_roles; r++) {
                const ms_expert_role_spec *rs = &nm->roles[r];
                ms_expert_role_info *ri = &st->roles[li * nm->n_roles + r];
                const ms_tensor *t = role_tensor(ck, rs, L, rs->fused ? 0 : e);
                if (!t && !ri->present) continue;
                char nb[512];
                fmt_name(nb, sizeof nb, rs->pattern, L, e);
                if (!t || !ri->present) {
                    rc = ms_fail(err, MS_ERR_SHAPE, "layer %d expert %d: tensor \"%s\" (role %s) is %s", L, e, nb,
                                 rs->name, t ? "present but absent for expert 0" : "missing");
                    goto fail;
                }
                if (!rs->fused && !same_shape(ri, t->dtype, t->ndim, t->shape)) {
                    char a[160], b[160];
                    rc = ms_fail(err, MS_ERR_SHAPE, "layer %d expert %d: tensor \"%s\" is %s %s, expert 0 has %s %s", L,
                                 e, nb, ms_dtype_name(t->dtype), ms_shape_str(t->shape, t->ndim, a, sizeof a),
                                 ms_dtype_name(ri->dtype), ms_shape_str(ri->shape, ri->ndim, b, sizeof b));
                    goto fail;
                }
                ex[n].role = r;
                ex[n].file = t->file;
                ex[n].off = t->offset + (rs->fused ? (uint64_t)e * ri->nbytes : 0);
                ex[n].len = ri->nbytes;
                n++;
            }
            make_pieces(ex, n, nm->n_roles, &st->loc[(int64_t)li * E + e]);
        }
        li++;
    }
    store_finish_sizes(st);
    return MS_OK;
fail:
    ms_expert_store_free(st);
    return rc;
}

int ms_expert_store_from_extents(const ms_checkpoint *ck, int n_model_layers, const uint8_t *is_moe, int n_experts,
                                 int n_roles, const char *const *role_names, ms_extent_fn fn, void *ctx,
                                 ms_expert_store *st, ms_err *err) {
    memset(st, 0, sizeof *st);
    if (n_model_layers < 1 || n_model_layers > 4096 || n_experts < 1 || n_experts > 65536 || n_roles < 1 ||
        n_roles > MS_EXPERT_MAX_ROLES)
        return ms_fail(err, MS_ERR_ARG, "expert store: %d layers, %d experts, %d roles", n_model_layers, n_experts,
                       n_roles);
    int n_layers = 0;
    for (int L = 0; L < n_model_layers; L++) n_layers += is_moe[L] != 0;
    if (!n_layers) return ms_fail(err, MS_ERR_UNSUPPORTED, "%s: no layer has routed experts", ck->dir);
    for (int r = 0; r < n_roles; r++)
        if (!role_names[r] || !*role_names[r] || strlen(role_names[r]) >= MS_EXPERT_ROLE_NAME)
            return ms_fail(err, MS_ERR_ARG, "expert store: role %d has no usable name", r);
    int rc = store_alloc(st, n_layers, n_model_layers, n_experts, n_roles, err);
    if (rc) goto fail;
    st->n_files = ck->n_files;
    st->paths = calloc((size_t)ck->n_files, sizeof *st->paths);
    if (!st->paths) { rc = ms_fail(err, MS_ERR_NOMEM, "out of memory"); goto fail; }
    for (int i = 0; i < ck->n_files; i++)
        if (!(st->paths[i] = strdup(ck->files[i].path))) { rc = ms_fail(err, MS_ERR_NOMEM, "out of memory"); goto fail; }
    int li = 0;
    for (int L = 0; L < n_model_layers; L++) {
        if (!is_moe[L]) continue;
        st->layer_id[li] = L;
        st->store_layer[L] = li;
        for (int e = 0; e < n_experts; e++) {
            ext_t ex[MS_EXPERT_MAX_ROLES];
            int n = 0;
            for (int r = 0; r < n_roles; r++) {
                ms_expert_role_info *ri = &st->roles[li * n_roles + r];
                ms_extent x;
                int got = fn(ctx, L, e, r, &x, err);
                if (got < 0) { rc = got; goto fail; }
                if (e == 0) {
                    snprintf(ri->name, sizeof ri->name, "%s", role_names[r]);
                    if (got) {
                        ri->present = 1;
                        ri->dtype = MS_DT_U8;
                        ri->ndim = 1;
                        ri->shape[0] = (int64_t)x.len;
                        ri->nbytes = x.len;
                    }
                }
                if (!got && !ri->present) continue;
                if (!got || !ri->present || x.len != ri->nbytes) {
                    rc = ms_fail(err, MS_ERR_SHAPE, "layer %d expert %d role %s: %s than expert 0", L, e, role_names[r],
                                 !got ? "absent, unlike expert 0" : !ri->present ? "present, unlike expert 0"
                                                                                 : "a different byte length");
                    goto fail;
                }
                if (x.file < 0 || x.file >= ck->n_files || x.len == 0 || x.offset > ck->files[x.file].map.size ||
                    x.len > ck->files[x.file].map.size - x.offset) {
                    rc = ms_fail(err, MS_ERR_FORMAT, "layer %d expert %d role %s: extent outside its file", L, e,
                                 role_names[r]);
                    goto fail;
                }
                ex[n++] = (ext_t){.role = r, .file = x.file, .off = x.offset, .len = x.len};
            }
            if (!n) {
                rc = ms_fail(err, MS_ERR_SHAPE,
                             "layer %d expert %d: no role has bytes in the checkpoint (the experts are not views onto its "
                             "files, e.g. a transposed copy made at load: they cannot be streamed)",
                             L, e);
                goto fail;
            }
            make_pieces(ex, n, n_roles, &st->loc[(int64_t)li * n_experts + e]);
        }
        li++;
    }
    store_finish_sizes(st);
    return MS_OK;
fail:
    ms_expert_store_free(st);
    return rc;
}

/* ---- packing ---- */

int ms_checkpoint_header_sha256(const ms_checkpoint *ck, int i, char hex[65], ms_err *err) {
    const ms_st_file *f = &ck->files[i];
    uint8_t h[32];
    if (!f->map.data || f->data_start > f->map.size)
        return ms_fail(err, MS_ERR_IO, "%s: not mapped, cannot hash its header", f->path);
    if (ms_sha256(f->map.data, f->data_start, h)) return ms_fail(err, MS_ERR_IO, "%s: SHA-256 failed", f->path);
    ms_hex(h, 32, hex);
    return MS_OK;
}

int ms_checkpoint_data_sample_sha256(const ms_checkpoint *ck, int i, char hex[65], ms_err *err) {
    const ms_st_file *f = &ck->files[i];
    if (!f->map.data && f->map.size) return ms_fail(err, MS_ERR_IO, "%s: not mapped, cannot sample it", f->path);
    uint64_t start = f->data_start, n = f->map.size > start ? f->map.size - start : 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    uint8_t h[32];
    unsigned hl = 0;
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1;
    for (int k = 0; k < 16 && ok && n; k++) {
        uint64_t blk = n < 4096 ? n : 4096;
        uint64_t at = start + (n - blk) * (uint64_t)k / 15;
        ok = EVP_DigestUpdate(c, f->map.data + at, blk) == 1;
    }
    ok = ok && EVP_DigestFinal_ex(c, h, &hl) == 1 && hl == 32;
    EVP_MD_CTX_free(c);
    if (!ok) return ms_fail(err, MS_ERR_IO, "%s: SHA-256 failed", f->path);
    ms_hex(h, 32, hex);
    return MS_OK;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* Record layout of a layer in a packed store: role r at off[r] (64-byte aligned). */
static uint64_t record_layout(const ms_expert_store *st, int li, uint64_t *off) {
    uint64_t o = 0;
    for (int r = 0; r < st->n_roles; r++) {
        const ms_expert_role_info *ri = ms_expert_store_role(st, li, r);
        off[r] = UINT64_MAX;
        if (!ri->present) continue;
        o = ALIGN_UP(o, 64);
        off[r] = o;
        o += ri->nbytes;
    }
    return o;
}

int ms_expert_pack(const ms_checkpoint *ck, const ms_expert_store *src, const char *out_dir, const char *const *dirs,
                   int n_dirs, ms_pack_stats *stats, ms_err *err) {
    return ms_expert_pack_progress(ck, src, out_dir, dirs, n_dirs, NULL, stats, err);
}

int ms_expert_pack_progress(const ms_checkpoint *ck, const ms_expert_store *src, const char *out_dir,
                   const char *const *dirs, int n_dirs, const ms_progress *progress, ms_pack_stats *stats,
                            ms_err *err) {
    if (src->packed) return ms_fail(err, MS_ERR_ARG, "pack: the source is already a packed store");
    if (stats) memset(stats, 0, sizeof *stats);
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST)
        return ms_fail(err, MS_ERR_IO, "%s: cannot create: %s", out_dir, strerror(errno));
    for (int d = 0; d < n_dirs; d++)
        if (mkdir(dirs[d], 0755) != 0 && errno != EEXIST)
            return ms_fail(err, MS_ERR_IO, "%s: cannot create: %s", dirs[d], strerror(errno));
    cJSON *root = cJSON_CreateObject(), *srcs = NULL, *layers = NULL;
    int rc = MS_OK;
    uint8_t *rec = NULL;
    if (!root) return ms_fail(err, MS_ERR_NOMEM, "out of memory");
    cJSON_AddStringToObject(root, "format", "moonshine-expert-store");
    cJSON_AddNumberToObject(root, "version", 1);
    srcs = cJSON_AddArrayToObject(root, "source");
    for (int i = 0; i < ck->n_files && !rc; i++) {
        char hex[65], dhex[65];
        rc = ms_checkpoint_header_sha256(ck, i, hex, err);
        if (!rc) rc = ms_checkpoint_data_sample_sha256(ck, i, dhex, err);
        if (rc) break;
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "file", base_name(ck->files[i].path));
        cJSON_AddNumberToObject(f, "size", (double)ck->files[i].map.size);
        cJSON_AddStringToObject(f, "header_sha256", hex);
        cJSON_AddStringToObject(f, "data_sample_sha256", dhex);
        cJSON_AddItemToArray(srcs, f);
    }
    cJSON_AddNumberToObject(root, "n_experts", src->n_experts);
    cJSON_AddNumberToObject(root, "n_model_layers", src->n_model_layers);
    cJSON_AddNumberToObject(root, "record_align", MS_IO_ALIGN);
    cJSON *rn = cJSON_AddArrayToObject(root, "roles");
    for (int r = 0; r < src->n_roles; r++) cJSON_AddItemToArray(rn, cJSON_CreateString(src->roles[r].name));
    layers = cJSON_AddArrayToObject(root, "layers");
    uint64_t all = 0, done = 0;
    for (int li = 0; li < src->n_layers; li++) {
        uint64_t o2[MS_EXPERT_MAX_ROLES];
        all += (uint64_t)src->n_experts * ALIGN_UP(record_layout(src, li, o2), MS_IO_ALIGN);
    }
    for (int li = 0; li < src->n_layers && !rc; li++) {
        uint64_t off[MS_EXPERT_MAX_ROLES];
        uint64_t rb = record_layout(src, li, off), stride = ALIGN_UP(rb, MS_IO_ALIGN);
        char fname[64], path[4096];
        snprintf(fname, sizeof fname, "experts-L%04d.bin", src->layer_id[li]);
        const char *dir = n_dirs ? dirs[li % n_dirs] : out_dir;
        char absdir[PATH_MAX];
        if (n_dirs) { /* the manifest names files outside out_dir by absolute path */
            if (!realpath(dir, absdir)) { rc = ms_fail(err, MS_ERR_IO, "%s: %s", dir, strerror(errno)); break; }
            dir = absdir;
        }
        if ((rc = ms_path_join(path, sizeof path, dir, fname, err))) break;
        free(rec);
        rec = calloc(1, stride);
        if (!rec) { rc = ms_fail(err, MS_ERR_NOMEM, "pack: out of memory for a %" PRIu64 "-byte record", stride); break; }
        ms_atomic_file af;
        if ((rc = ms_atomic_begin(&af, path, err))) break;
        cJSON *crcs = cJSON_CreateArray();
        for (int e = 0; e < src->n_experts && !rc; e++) {
            const ms_expert_loc *l = ms_expert_store_loc(src, li, e);
            memset(rec, 0, stride);
            for (int r = 0; r < src->n_roles; r++) {
                if (l->role_piece[r] < 0) continue;
                const ms_extent *pc = &l->piece[l->role_piece[r]];
                const ms_st_file *f = &ck->files[pc->file];
                uint64_t so = pc->offset + l->role_off[r], n = ms_expert_store_role(src, li, r)->nbytes;
                if (so > f->map.size || n > f->map.size - so) {
                    rc = ms_fail(err, MS_ERR_IO, "%s: layer %d expert %d role %s lies past the end of the file",
                                 f->path, src->layer_id[li], e, src->roles[r].name);
                    break;
                }
                memcpy(rec + off[r], f->map.data + so, n);
            }
            if (rc) break;
            cJSON_AddItemToArray(crcs, cJSON_CreateNumber(ms_crc32c(0, rec, rb)));
            rc = ms_atomic_write(&af, rec, stride, err);
            if (stats) stats->bytes_written += stride;
            if (!rc) ms_progress_report(progress, "pack", MS_PROGRESS_BYTES, done += stride, all);
        }
        if (rc) ms_atomic_abort(&af);
        else rc = ms_atomic_commit(&af, err);
        if (rc) { cJSON_Delete(crcs); break; }
        if (stats) stats->n_files++;
        cJSON *lj = cJSON_CreateObject();
        cJSON_AddNumberToObject(lj, "layer", src->layer_id[li]);
        /* relative to out_dir when it lives there, else absolute as given */
        cJSON_AddStringToObject(lj, "path", n_dirs ? path : fname);
        cJSON_AddNumberToObject(lj, "stride", (double)stride);
        cJSON_AddNumberToObject(lj, "record_bytes", (double)rb);
        cJSON *rj = cJSON_AddArrayToObject(lj, "roles");
        for (int r = 0; r < src->n_roles; r++) {
            const ms_expert_role_info *ri = ms_expert_store_role(src, li, r);
            if (!ri->present) { cJSON_AddItemToArray(rj, cJSON_CreateNull()); continue; }
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "dtype", ms_dtype_name(ri->dtype));
            cJSON *sh = cJSON_AddArrayToObject(o, "shape");
            for (int d = 0; d < ri->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)ri->shape[d]));
            cJSON_AddNumberToObject(o, "offset", (double)off[r]);
            cJSON_AddNumberToObject(o, "nbytes", (double)ri->nbytes);
            cJSON_AddItemToArray(rj, o);
        }
        cJSON_AddItemToObject(lj, "crc32c", crcs);
        cJSON_AddItemToArray(layers, lj);
    }
    free(rec);
    if (!rc) {
        char *text = cJSON_Print(root);
        char mpath[4096];
        if (!text) rc = ms_fail(err, MS_ERR_NOMEM, "out of memory");
        else if (!(rc = ms_path_join(mpath, sizeof mpath, out_dir, MS_STORE_MANIFEST, err)))
            rc = ms_write_file_atomic(mpath, text, strlen(text), err);
        free(text);
    }
    cJSON_Delete(root);
    return rc;
}

/* ---- manifest ---- */

void ms_store_manifest_free(ms_store_manifest *m) {
    free(m->src);
    ms_expert_store_free(&m->st);
    memset(m, 0, sizeof *m);
}

#define MF(...) ms_fail(err, MS_ERR_FORMAT, __VA_ARGS__)

int ms_store_manifest_parse(const char *text, size_t len, const char *where, const char *store_dir,
                            ms_store_manifest *m, ms_err *err) {
    memset(m, 0, sizeof *m);
    cJSON *root = NULL;
    int rc = ms_json_parse(text, len, where, &root, err);
    if (rc) return rc;
    ms_expert_store *st = &m->st;
    const char *fmt = NULL;
    int64_t ver = 0, E = 0, nml = 0, align = 0;
    if (!cJSON_IsObject(root)) { rc = MF("%s: not a JSON object", where); goto out; }
    if ((rc = ms_json_opt_string(root, "format", &fmt, where, err))) goto out;
    if (!fmt || strcmp(fmt, "moonshine-expert-store")) { rc = MF("%s: \"format\" is not \"moonshine-expert-store\"", where); goto out; }
    if ((rc = ms_json_int(root, "version", 1, 1, &ver, where, err)) ||
        (rc = ms_json_int(root, "n_experts", 1, 65536, &E, where, err)) ||
        (rc = ms_json_int(root, "n_model_layers", 1, 4096, &nml, where, err)) ||
        (rc = ms_json_int(root, "record_align", MS_IO_ALIGN, MS_IO_ALIGN, &align, where, err)))
        goto out;
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(root, "source");
    const cJSON *roles = cJSON_GetObjectItemCaseSensitive(root, "roles");
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    if (!cJSON_IsArray(src) || cJSON_GetArraySize(src) < 1 || cJSON_GetArraySize(src) > 65536) {
        rc = MF("%s: \"source\" must be a non-empty array of files", where);
        goto out;
    }
    if (!cJSON_IsArray(roles) || cJSON_GetArraySize(roles) < 1 || cJSON_GetArraySize(roles) > MS_EXPERT_MAX_ROLES) {
        rc = MF("%s: \"roles\" must be an array of 1..%d names", where, MS_EXPERT_MAX_ROLES);
        goto out;
    }
    int nl = cJSON_IsArray(layers) ? cJSON_GetArraySize(layers) : -1;
    if (nl < 1 || nl > nml) { rc = MF("%s: \"layers\" must be an array of 1..n_model_layers layers", where); goto out; }
    m->n_src = cJSON_GetArraySize(src);
    m->src = calloc((size_t)m->n_src, sizeof *m->src);
    if (!m->src) { rc = ms_fail(err, MS_ERR_NOMEM, "out of memory"); goto out; }
    int i = 0;
    for (const cJSON *f = src->child; f; f = f->next, i++) {
        const char *fn = NULL, *h = NULL, *dh = NULL;
        int64_t size = 0;
        char w[128];
        snprintf(w, sizeof w, "%s source[%d]", where, i);
        if (!cJSON_IsObject(f)) { rc = MF("%s: not an object", w); goto out; }
        if ((rc = ms_json_opt_string(f, "file", &fn, w, err)) || (rc = ms_json_opt_string(f, "header_sha256", &h, w, err)) ||
            (rc = ms_json_opt_string(f, "data_sample_sha256", &dh, w, err)) ||
            (rc = ms_json_int(f, "size", 0, INT64_C(1) << 52, &size, w, err)))
            goto out;
        if (!fn || !*fn || strlen(fn) >= sizeof m->src[i].name) { rc = MF("%s: \"file\" missing or too long", w); goto out; }
        if (!h || strlen(h) != 64 || strspn(h, "0123456789abcdef") != 64) {
            rc = MF("%s: \"header_sha256\" is not 64 hex digits", w);
            goto out;
        }
        if (!dh || strlen(dh) != 64 || strspn(dh, "0123456789abcdef") != 64) {
            rc = MF("%s: \"data_sample_sha256\" is not 64 hex digits", w);
            goto out;
        }
        strcpy(m->src[i].name, fn);
        strcpy(m->src[i].sha256, h);
        strcpy(m->src[i].data_sha256, dh);
        m->src[i].size = (uint64_t)size;
    }
    int nr = cJSON_GetArraySize(roles);
    /* each expert of each layer needs a crc32c entry: the text bounds the tables */
    if ((uint64_t)nl * (uint64_t)E > len) {
        rc = MF("%s: %d layers x %lld experts cannot fit in %zu bytes of manifest", where, nl, (long long)E, len);
        goto out;
    }
    if ((rc = store_alloc(st, nl, (int)nml, (int)E, nr, err))) goto out;
    st->packed = 1;
    st->n_files = nl;
    st->paths = calloc((size_t)nl, sizeof *st->paths);
    if (!st->paths) { rc = ms_fail(err, MS_ERR_NOMEM, "out of memory"); goto out; }
    char names[MS_EXPERT_MAX_ROLES][MS_EXPERT_ROLE_NAME];
    i = 0;
    for (const cJSON *r = roles->child; r; r = r->next, i++) {
        if (!cJSON_IsString(r) || !*r->valuestring || strlen(r->valuestring) >= MS_EXPERT_ROLE_NAME) {
            rc = MF("%s: roles[%d] is not a role name", where, i);
            goto out;
        }
        strcpy(names[i], r->valuestring);
    }
    int li = 0;
    for (const cJSON *L = layers->child; L; L = L->next, li++) {
        char w[128];
        snprintf(w, sizeof w, "%s layers[%d]", where, li);
        int64_t lid, stride, rb;
        const char *path = NULL;
        if (!cJSON_IsObject(L)) { rc = MF("%s: not an object", w); goto out; }
        if ((rc = ms_json_int(L, "layer", 0, nml - 1, &lid, w, err)) ||
            (rc = ms_json_int(L, "stride", MS_IO_ALIGN, INT64_C(1) << 40, &stride, w, err)) ||
            (rc = ms_json_int(L, "record_bytes", 1, stride, &rb, w, err)) ||
            (rc = ms_json_opt_string(L, "path", &path, w, err)))
            goto out;
        if (stride % MS_IO_ALIGN) { rc = MF("%s: \"stride\" is not a multiple of 4096", w); goto out; }
        if ((uint64_t)stride * (uint64_t)E > (UINT64_C(1) << 52)) { rc = MF("%s: layer file would exceed 4 PiB", w); goto out; }
        if (st->store_layer[lid] >= 0) { rc = MF("%s: layer %d listed twice", w, (int)lid); goto out; }
        if (!path || !*path || strlen(path) > 4000) { rc = MF("%s: \"path\" missing or too long", w); goto out; }
        st->layer_id[li] = (int)lid;
        st->store_layer[lid] = li;
        char full[4200];
        if (path[0] == '/') snprintf(full, sizeof full, "%s", path);
        else snprintf(full, sizeof full, "%s/%s", store_dir ? store_dir : ".", path);
        if (!(st->paths[li] = strdup(full))) { rc = ms_fail(err, MS_ERR_NOMEM, "out of memory"); goto out; }
        const cJSON *rj = cJSON_GetObjectItemCaseSensitive(L, "roles");
        const cJSON *cj = cJSON_GetObjectItemCaseSensitive(L, "crc32c");
        if (!cJSON_IsArray(rj) || cJSON_GetArraySize(rj) != nr) { rc = MF("%s: \"roles\" must list %d roles", w, nr); goto out; }
        if (!cJSON_IsArray(cj) || cJSON_GetArraySize(cj) != E) { rc = MF("%s: \"crc32c\" must list %d experts", w, (int)E); goto out; }
        uint64_t roff[MS_EXPERT_MAX_ROLES];
        int r = 0, any = 0;
        for (const cJSON *o = rj->child; o; o = o->next, r++) {
            ms_expert_role_info *ri = &st->roles[li * nr + r];
            strcpy(ri->name, names[r]);
            roff[r] = UINT64_MAX;
            if (cJSON_IsNull(o)) continue;
            char w2[512];
            snprintf(w2, sizeof w2, "%s role %s", w, names[r]);
            const char *dt = NULL;
            int64_t off, nb;
            if (!cJSON_IsObject(o)) { rc = MF("%s: not an object or null", w2); goto out; }
            if ((rc = ms_json_opt_string(o, "dtype", &dt, w2, err)) ||
                (rc = ms_json_int(o, "offset", 0, rb, &off, w2, err)) ||
                (rc = ms_json_int(o, "nbytes", 1, rb, &nb, w2, err)))
                goto out;
            if (off + nb > rb) { rc = MF("%s: bytes [%lld, +%lld) leave the %lld-byte record", w2, (long long)off, (long long)nb, (long long)rb); goto out; }
            ri->dtype = dt ? ms_dtype_parse(dt) : MS_DT_INVALID;
            if (ri->dtype == MS_DT_INVALID || ri->dtype == MS_DT_F4) { rc = MF("%s: unknown dtype", w2); goto out; }
            const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
            if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > MS_MAX_DIMS) { rc = MF("%s: \"shape\" must be an array of up to %d dims", w2, MS_MAX_DIMS); goto out; }
            unsigned __int128 ne = 1;
            int d = 0;
            for (const cJSON *x = sh->child; x; x = x->next, d++) {
                if (!ms_json_is_int(x, 0, INT64_C(1) << 40)) { rc = MF("%s: shape[%d] is not a dimension", w2, d); goto out; }
                ri->shape[d] = (int64_t)x->valuedouble;
                ne *= (uint64_t)ri->shape[d];
                if (ne > ((unsigned __int128)1 << 60)) { rc = MF("%s: shape overflows", w2); goto out; }
            }
            ri->ndim = d;
            if ((uint64_t)((ne * (unsigned)ms_dtype_bits(ri->dtype) + 7) / 8) != (uint64_t)nb) {
                rc = MF("%s: shape x %s is not %lld bytes", w2, dt, (long long)nb);
                goto out;
            }
            ri->present = 1;
            ri->nbytes = (uint64_t)nb;
            roff[r] = (uint64_t)off;
            any = 1;
        }
        if (!any) { rc = MF("%s: no role present", w); goto out; }
        int e = 0;
        for (const cJSON *c = cj->child; c; c = c->next, e++) {
            if (!ms_json_is_int(c, 0, UINT32_MAX)) { rc = MF("%s: crc32c[%d] is not a 32-bit value", w, e); goto out; }
            ms_expert_loc *l = &st->loc[(int64_t)li * E + e];
            l->n_pieces = 1;
            l->piece[0] = (ms_extent){.file = li, .offset = (uint64_t)e * (uint64_t)stride, .len = (uint64_t)rb};
            for (int k = 0; k < MS_EXPERT_MAX_ROLES; k++) l->role_piece[k] = -1;
            for (int k = 0; k < nr; k++)
                if (roff[k] != UINT64_MAX) {
                    l->role_piece[k] = 0;
                    l->role_off[k] = roff[k];
                }
            l->crc32c = (uint32_t)c->valuedouble;
        }
    }
    store_finish_sizes(st);
out:
    cJSON_Delete(root);
    if (rc) ms_store_manifest_free(m);
    return rc;
}

int ms_expert_store_open_packed(const char *store_dir, const ms_checkpoint *ck, const ms_expert_store *ref,
                                ms_expert_store *st, ms_err *err) {
    memset(st, 0, sizeof *st);
    char mpath[4096];
    int rc = ms_path_join(mpath, sizeof mpath, store_dir, MS_STORE_MANIFEST, err);
    if (rc) return rc;
    if (!ms_file_exists(mpath))
        return ms_fail(err, MS_ERR_IO, "%s: not a packed expert store (no %s)", store_dir, MS_STORE_MANIFEST);
    char *text;
    size_t len;
    if ((rc = ms_read_file(mpath, MS_STORE_MAX_MANIFEST, &text, &len, err))) return rc;
    ms_store_manifest m;
    rc = ms_store_manifest_parse(text, len, mpath, store_dir, &m, err);
    free(text);
    if (rc) return rc;
    /* binding to the checkpoint */
    if (m.n_src != ck->n_files)
        rc = ms_fail(err, MS_ERR_MISMATCH, "%s was packed from a checkpoint of %d file(s); %s has %d", store_dir, m.n_src,
                     ck->dir, ck->n_files);
    for (int i = 0; i < m.n_src && !rc; i++) {
        const ms_st_file *f = &ck->files[i];
        char hex[65];
        if (strcmp(m.src[i].name, base_name(f->path)))
            rc = ms_fail(err, MS_ERR_MISMATCH, "%s was packed from another checkpoint: source file %d is %s, not %s",
                         store_dir, i, m.src[i].name, f->path);
        else if (m.src[i].size != f->map.size)
            rc = ms_fail(err, MS_ERR_MISMATCH,
                         "%s was packed from another checkpoint: %s is %" PRIu64 " bytes, the store expects %" PRIu64,
                         store_dir, f->path, f->map.size, m.src[i].size);
        else if (!(rc = ms_checkpoint_header_sha256(ck, i, hex, err)) && strcmp(hex, m.src[i].sha256))
            rc = ms_fail(err, MS_ERR_MISMATCH,
                         "%s was packed from another checkpoint: the SafeTensors header of %s differs (sha256 %.12s..., "
                         "store has %.12s...)",
                         store_dir, f->path, hex, m.src[i].sha256);
        else if (!(rc = ms_checkpoint_data_sample_sha256(ck, i, hex, err)) && strcmp(hex, m.src[i].data_sha256))
            rc = ms_fail(err, MS_ERR_MISMATCH,
                         "%s was packed from another checkpoint: the weights in %s differ (data sample sha256 %.12s..., "
                         "store has %.12s...)",
                         store_dir, f->path, hex, m.src[i].data_sha256);
    }
    /* same experts as the checkpoint describes */
    ms_expert_store *p = &m.st;
    if (!rc && (p->n_layers != ref->n_layers || p->n_experts != ref->n_experts || p->n_roles != ref->n_roles))
        rc = ms_fail(err, MS_ERR_MISMATCH, "%s: %d layers x %d experts x %d roles, the checkpoint has %d x %d x %d",
                     store_dir, p->n_layers, p->n_experts, p->n_roles, ref->n_layers, ref->n_experts, ref->n_roles);
    for (int li = 0; li < p->n_layers && !rc; li++) {
        if (p->layer_id[li] != ref->layer_id[li]) {
            rc = ms_fail(err, MS_ERR_MISMATCH, "%s: layer list differs from the checkpoint's (%d vs %d)", store_dir,
                         p->layer_id[li], ref->layer_id[li]);
            break;
        }
        for (int r = 0; r < p->n_roles && !rc; r++) {
            const ms_expert_role_info *a = ms_expert_store_role(p, li, r), *b = ms_expert_store_role(ref, li, r);
            if (strcmp(a->name, b->name) || a->present != b->present ||
                (a->present && (!same_shape(a, b->dtype, b->ndim, b->shape) || a->nbytes != b->nbytes)))
                rc = ms_fail(err, MS_ERR_MISMATCH, "%s: layer %d role %s differs from the checkpoint's (name, dtype or shape)",
                             store_dir, p->layer_id[li], b->name);
        }
    }
    /* layer files exist and hold every record */
    for (int li = 0; li < p->n_layers && !rc; li++) {
        struct stat sb;
        const ms_expert_loc *last = ms_expert_store_loc(p, li, p->n_experts - 1);
        uint64_t need = last->piece[0].offset + last->piece[0].len;
        if (stat(p->paths[li], &sb) != 0)
            rc = ms_fail(err, MS_ERR_IO, "%s: layer %d file %s: %s", store_dir, p->layer_id[li], p->paths[li], strerror(errno));
        else if ((uint64_t)sb.st_size < need)
            rc = ms_fail(err, MS_ERR_IO, "%s: layer %d file %s is %lld bytes, %d experts need %" PRIu64 " (truncated store)",
                         store_dir, p->layer_id[li], p->paths[li], (long long)sb.st_size, p->n_experts, need);
    }
    if (rc) {
        ms_store_manifest_free(&m);
        return rc;
    }
    *st = m.st;
    free(m.src);
    return MS_OK;
}
