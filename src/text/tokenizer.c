/* tokenizer.c — the encode/decode pipeline shared by both formats: added-token
 * extraction (tokenizers' AddedVocabulary::find_matches), normalization,
 * pre-tokenization, BPE; decoding with from_utf8_lossy semantics; streaming. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

/* ---- added-token trie ---- */

static int trie_node(ms_trie *t) {
    if (t->n_nodes == t->nodes_cap) {
        uint32_t cap = t->nodes_cap ? t->nodes_cap * 2 : 64;
        int32_t *p = realloc(t->term, cap * sizeof *p);
        if (!p) return -1;
        t->term = p;
        t->nodes_cap = cap;
    }
    t->term[t->n_nodes] = -1;
    return (int)t->n_nodes++;
}

static uint64_t thash(uint64_t x) {
    x ^= x >> 31;
    x *= 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    return x;
}

static int64_t trie_child(const ms_trie *t, uint32_t node, uint8_t c) {
    if (node == 0) return t->root[c] ? t->root[c] : -1;
    if (!t->cap) return -1;
    uint64_t key = (((uint64_t)node << 8) | c) + 1;
    size_t i = thash(key) & (t->cap - 1);
    while (t->keys[i]) {
        if (t->keys[i] == key) return t->child[i];
        i = (i + 1) & (t->cap - 1);
    }
    return -1;
}

static int trie_set_child(ms_trie *t, uint32_t node, uint8_t c, uint32_t ch) {
    if (node == 0) {
        t->root[c] = (int32_t)ch;
        return 0;
    }
    if ((t->count + 1) * 2 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        uint64_t *k = calloc(cap, sizeof *k);
        uint32_t *v = malloc(cap * sizeof *v);
        if (!k || !v) {
            free(k), free(v);
            return -1;
        }
        for (size_t i = 0; i < t->cap; i++) {
            if (!t->keys[i]) continue;
            size_t j = thash(t->keys[i]) & (cap - 1);
            while (k[j]) j = (j + 1) & (cap - 1);
            k[j] = t->keys[i], v[j] = t->child[i];
        }
        free(t->keys), free(t->child);
        t->keys = k, t->child = v, t->cap = cap;
    }
    uint64_t key = (((uint64_t)node << 8) | c) + 1;
    size_t i = thash(key) & (t->cap - 1);
    while (t->keys[i]) i = (i + 1) & (t->cap - 1);
    t->keys[i] = key, t->child[i] = ch;
    t->count++;
    return 0;
}

int ms_trie_add(ms_trie *t, const uint8_t *s, size_t n, int32_t idx) {
    if (!t->n_nodes && trie_node(t) < 0) return -1;
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t c = trie_child(t, node, s[i]);
        if (c < 0) {
            int nn = trie_node(t);
            if (nn < 0 || trie_set_child(t, node, s[i], (uint32_t)nn)) return -1;
            c = nn;
        }
        node = (uint32_t)c;
    }
    if (t->term[node] < 0) t->term[node] = idx; /* first token with this content wins */
    return 0;
}

void ms_trie_free(ms_trie *t) {
    free(t->keys), free(t->child), free(t->term);
    memset(t, 0, sizeof *t);
}

/* Longest added token starting at s[0]; returns its length (0 none), *idx set. */
static size_t trie_longest(const ms_trie *t, const uint8_t *s, size_t n, int32_t *idx) {
    if (!t->n_nodes) return 0;
    uint32_t node = 0;
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t c = trie_child(t, node, s[i]);
        if (c < 0) break;
        node = (uint32_t)c;
        if (t->term[node] >= 0) best = i + 1, *idx = t->term[node];
    }
    return best;
}

/* ---- Unicode helpers for added-token flags (tokenizers uses Rust regex \s, \w) ---- */

static int is_white_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

static pcre2_code *g_word_re;
static pthread_once_t g_word_once = PTHREAD_ONCE_INIT;
static void word_init(void) {
    int e;
    PCRE2_SIZE eo;
    g_word_re = pcre2_compile((PCRE2_SPTR) "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200c}\\x{200d}]",
                              PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &e, &eo, NULL);
}

static int is_word_at(const uint8_t *s, size_t n) {
    pthread_once(&g_word_once, word_init);
    if (!g_word_re || !n) return 0;
    pcre2_match_data *md = pcre2_match_data_create(2, NULL);
    if (!md) return 0;
    int rc = pcre2_match(g_word_re, s, n, 0, PCRE2_NO_UTF_CHECK, md, NULL);
    pcre2_match_data_free(md);
    return rc > 0;
}

static size_t prev_char_start(const uint8_t *s, size_t end) {
    size_t i = end;
    while (i > 0) {
        i--;
        if ((s[i] & 0xC0) != 0x80) break;
    }
    return i;
}

typedef struct {
    size_t a, b;
    int32_t idx; /* added-token index or -1 for text */
} seg;

typedef struct {
    seg *v;
    size_t n, cap;
} segs;

static int segs_push(segs *s, size_t a, size_t b, int32_t idx) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        seg *v = realloc(s->v, cap * sizeof *v);
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].a = a, s->v[s->n].b = b, s->v[s->n].idx = idx;
    s->n++;
    return 0;
}

/* tokenizers' AddedVocabulary::find_matches over s[0..n). */
static int find_added(const ms_tokenizer *t, const ms_trie *trie, const uint8_t *s, size_t n, int skip_special,
                      segs *out) {
    size_t start_offset = 0, i = 0;
    if (trie->n_nodes) {
        while (i < n) {
            if (!trie->root[s[i]]) {
                i++;
                continue;
            }
            int32_t idx = -1;
            size_t l = trie_longest(trie, s + i, n - i, &idx);
            if (!l) {
                i++;
                continue;
            }
            size_t start = i, stop = i + l;
            i = stop; /* matches do not overlap, even when discarded below */
            const ms_added *a = &t->added[idx];
            if (skip_special && a->special) continue;
            if (a->single_word) {
                int start_space = start == 0 || !is_word_at(s + prev_char_start(s, start), start - prev_char_start(s, start));
                int stop_space = stop == n || !is_word_at(s + stop, n - stop);
                if (!start_space || !stop_space) continue;
            }
            if (a->lstrip) {
                size_t ns = start;
                while (ns > 0) {
                    size_t p = prev_char_start(s, ns);
                    uint32_t cp;
                    if (!ms_utf8_next(s + p, ns - p, &cp) || !is_white_space(cp)) break;
                    ns = p;
                }
                start = ns > start_offset ? ns : start_offset;
            }
            if (a->rstrip) {
                size_t e = stop;
                while (e < n) {
                    uint32_t cp;
                    int k = ms_utf8_next(s + e, n - e, &cp);
                    if (!k || !is_white_space(cp)) break;
                    e += (size_t)k;
                }
                stop = e;
                i = stop;
            }
            if (start_offset < start && segs_push(out, start_offset, start, -1)) return -1;
            if (segs_push(out, start, stop, idx)) return -1;
            start_offset = stop;
        }
    }
    if (start_offset != n && segs_push(out, start_offset, n, -1)) return -1;
    return 0;
}

/* Encode text that holds no added token (of the current pass): pre-tokenize + BPE. */
static int encode_plain(const ms_tokenizer *t, const uint8_t *s, size_t n, ms_tok_ids *out, ms_err *err) {
    if (!n) return MS_OK;
    ms_buf arena = {0};
    ms_pieces pcs = {0};
    int rc = MS_OK;
    if (ms_buf_add(&arena, s, n)) rc = ms_fail(err, MS_ERR_NOMEM, "encode: out of memory");
    if (!rc) rc = ms_pretokenize(t->pre, t->n_pre, &arena, 0, n, &pcs, err);
    for (size_t i = 0; i < pcs.n && !rc; i++)
        rc = ms_bpe_encode_word((ms_bpe *)&t->bpe, arena.p + pcs.v[i].off, pcs.v[i].len, out, err);
    free(pcs.v);
    ms_buf_free(&arena);
    return rc;
}

/* A piece between non-normalized added tokens: normalize, then cut out the
 * normalized added tokens, then encode the rest. */
static int encode_segment(const ms_tokenizer *t, const uint8_t *s, size_t n, int skip_special, ms_tok_ids *out,
                          ms_err *err) {
    ms_buf nb = {0};
    int rc = MS_OK;
    if (t->normalizer == MS_NORM_NFC && !ms_nfc_quick_yes(s, n)) {
        if (ms_nfc(s, n, &nb)) {
            ms_buf_free(&nb);
            return ms_fail(err, MS_ERR_NOMEM, "encode: NFC: out of memory");
        }
        s = nb.p ? nb.p : (const uint8_t *)"";
        n = nb.n;
    }
    segs sg = {0};
    if (find_added(t, &t->trie_norm, s, n, skip_special, &sg)) rc = ms_fail(err, MS_ERR_NOMEM, "encode: out of memory");
    for (size_t i = 0; i < sg.n && !rc; i++) {
        if (sg.v[i].idx >= 0) {
            if (ms_ids_push(out, t->added[sg.v[i].idx].id)) rc = ms_fail(err, MS_ERR_NOMEM, "encode: out of memory");
        } else {
            rc = encode_plain(t, s + sg.v[i].a, sg.v[i].b - sg.v[i].a, out, err);
        }
    }
    free(sg.v);
    ms_buf_free(&nb);
    return rc;
}

static int encode_chunk(const ms_tokenizer *t, const uint8_t *s, size_t n, int skip_special, ms_tok_ids *out,
                        ms_err *err) {
    segs sg = {0};
    int rc = MS_OK;
    if (find_added(t, &t->trie_raw, s, n, skip_special, &sg)) rc = ms_fail(err, MS_ERR_NOMEM, "encode: out of memory");
    for (size_t i = 0; i < sg.n && !rc; i++) {
        if (sg.v[i].idx >= 0) {
            if (ms_ids_push(out, t->added[sg.v[i].idx].id)) rc = ms_fail(err, MS_ERR_NOMEM, "encode: out of memory");
        } else {
            rc = encode_segment(t, s + sg.v[i].a, sg.v[i].b - sg.v[i].a, skip_special, out, err);
        }
    }
    free(sg.v);
    return rc;
}

/* Python's str.isspace (tokenization_kimi.py splits long runs with it). */
static int py_isspace(uint32_t c) { return is_white_space(c) || (c >= 0x1C && c <= 0x1F); }

int ms_tok_encode(const ms_tokenizer *t, const char *text, size_t len, int flags, ms_tok_ids *out, ms_err *err) {
    const uint8_t *s = (const uint8_t *)text;
    size_t ok = ms_utf8_valid_prefix(s, len);
    if (ok != len) return ms_fail(err, MS_ERR_FORMAT, "encode: input is not valid UTF-8 at byte %zu", ok);
    int skip_special = !(flags & MS_TOK_ENCODE_SPECIAL);
    if (!t->max_run_chars) return encode_chunk(t, s, len, skip_special, out, err);
    /* tiktoken path of tokenization_kimi.py: 400,000-character windows, each cut
     * where a run of whitespace or non-whitespace exceeds max_run_chars. */
    size_t win_start = 0;
    while (win_start < len || (len == 0 && win_start == 0)) {
        size_t i = win_start, nchars = 0;
        while (i < len && nchars < 400000) {
            uint32_t cp;
            i += (size_t)ms_utf8_next(s + i, len - i, &cp);
            nchars++;
        }
        size_t win_end = i, slice_start = win_start, run = 0;
        int cur_space = -1;
        for (size_t p = win_start; p < win_end;) {
            uint32_t cp;
            int k = ms_utf8_next(s + p, win_end - p, &cp);
            int sp = py_isspace(cp);
            if (cur_space < 0) cur_space = sp;
            if (sp != cur_space) {
                run = 1;
                cur_space = sp;
            } else if (++run > t->max_run_chars) {
                int rc = encode_chunk(t, s + slice_start, p - slice_start, skip_special, out, err);
                if (rc) return rc;
                slice_start = p;
                run = 1;
            }
            p += (size_t)k;
        }
        int rc = encode_chunk(t, s + slice_start, win_end - slice_start, skip_special, out, err);
        if (rc) return rc;
        if (win_end == len) break;
        win_start = win_end;
    }
    return MS_OK;
}

/* ---- decoding ---- */

const uint8_t *ms_tok_token_bytes(const ms_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || (uint32_t)id >= t->n_vocab) return NULL;
    int32_t a = t->added_of_id[id];
    if (a >= 0) {
        *len = t->added[a].dec_len;
        return t->added[a].dec;
    }
    if ((uint32_t)id >= t->bpe.n_ids || t->bpe.len[id] == UINT32_MAX) return NULL;
    *len = t->bpe.len[id];
    return t->bpe.blob + t->bpe.off[id];
}

/* Append s[0..n) to out replacing ill-formed subsequences with U+FFFD; when
 * !final, stop before an incomplete trailing sequence. Returns bytes consumed
 * (or (size_t)-1 on OOM). */
static size_t lossy_append(ms_buf *out, const uint8_t *s, size_t n, int final) {
    size_t i = 0;
    while (i < n) {
        size_t ok = ms_utf8_valid_prefix(s + i, n - i);
        if (ok && ms_buf_add(out, s + i, ok)) return (size_t)-1;
        i += ok;
        if (i == n) break;
        int more;
        size_t bad = ms_utf8_bad_len(s + i, n - i, &more);
        if (more && !final) break;
        if (ms_buf_add(out, "\xEF\xBF\xBD", 3)) return (size_t)-1;
        i += bad;
    }
    return i;
}

int ms_tok_decode(const ms_tokenizer *t, const int32_t *ids, size_t n, int flags, char **out, size_t *out_len,
                  ms_err *err) {
    ms_buf raw = {0}, res = {0};
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const uint8_t *b = ms_tok_token_bytes(t, ids[i], &l);
        if (!b) {
            ms_buf_free(&raw);
            return ms_fail(err, MS_ERR_ARG, "decode: id %d at position %zu is not in the vocabulary (size %u)",
                           ids[i], i, t->n_vocab);
        }
        if ((flags & MS_TOK_DECODE_SKIP_SPECIAL) && ms_tok_is_special(t, ids[i])) continue;
        if (ms_buf_add(&raw, b, l)) {
            ms_buf_free(&raw);
            return ms_fail(err, MS_ERR_NOMEM, "decode: out of memory");
        }
    }
    if (lossy_append(&res, raw.p, raw.n, 1) == (size_t)-1 || ms_buf_add(&res, "", 0)) {
        ms_buf_free(&raw);
        ms_buf_free(&res);
        return ms_fail(err, MS_ERR_NOMEM, "decode: out of memory");
    }
    ms_buf_free(&raw);
    *out = (char *)res.p;
    *out_len = res.n;
    return MS_OK;
}

/* ---- streaming ---- */

void ms_tok_stream_init(ms_tok_stream *s, const ms_tokenizer *t, int flags) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->flags = flags;
}

static int stream_emit(ms_tok_stream *s, const uint8_t *b, size_t l, int final, const char **text, size_t *n,
                       ms_err *err) {
    ms_buf in = {0}, res = {0};
    if (ms_buf_add(&in, s->pend, s->n_pend) || ms_buf_add(&in, b, l)) {
        ms_buf_free(&in);
        return ms_fail(err, MS_ERR_NOMEM, "decode stream: out of memory");
    }
    res.p = (uint8_t *)s->out;
    res.cap = s->out_cap;
    size_t used = lossy_append(&res, in.p, in.n, final);
    if (used == (size_t)-1 || ms_buf_add(&res, "", 0)) {
        s->out = (char *)res.p;
        s->out_cap = res.cap;
        ms_buf_free(&in);
        return ms_fail(err, MS_ERR_NOMEM, "decode stream: out of memory");
    }
    s->n_pend = in.n - used; /* at most 3 bytes: a proper prefix of one character */
    memcpy(s->pend, in.p + used, s->n_pend);
    ms_buf_free(&in);
    s->out = (char *)res.p;
    s->out_cap = res.cap;
    *text = s->out;
    *n = res.n;
    return MS_OK;
}

int ms_tok_stream_feed(ms_tok_stream *s, int32_t id, const char **text, size_t *n, ms_err *err) {
    size_t l;
    const uint8_t *b = ms_tok_token_bytes(s->t, id, &l);
    if (!b) return ms_fail(err, MS_ERR_ARG, "decode stream: id %d is not in the vocabulary (size %u)", id, s->t->n_vocab);
    if ((s->flags & MS_TOK_DECODE_SKIP_SPECIAL) && ms_tok_is_special(s->t, id)) l = 0;
    return stream_emit(s, b, l, 0, text, n, err);
}

int ms_tok_stream_flush(ms_tok_stream *s, const char **text, size_t *n, ms_err *err) {
    return stream_emit(s, (const uint8_t *)"", 0, 1, text, n, err);
}

void ms_tok_stream_free(ms_tok_stream *s) {
    free(s->out);
    memset(s, 0, sizeof *s);
}

/* ---- lookups ---- */

int32_t ms_tok_token_id(const ms_tokenizer *t, const char *str) {
    size_t n = strlen(str);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, str, n) == 0) return t->added[i].id;
    return ms_bpe_lookup(&t->bpe, (const uint8_t *)str, n);
}

int ms_tok_is_special(const ms_tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->n_vocab) return 0;
    int32_t a = t->added_of_id[id];
    return a >= 0 && t->added[a].special;
}

uint32_t ms_tok_vocab_size(const ms_tokenizer *t) { return t->n_vocab; }
int32_t ms_tok_bos_id(const ms_tokenizer *t) { return t->bos_id; }
int32_t ms_tok_eos_id(const ms_tokenizer *t) { return t->eos_id; }
int32_t ms_tok_pad_id(const ms_tokenizer *t) { return t->pad_id; }
int ms_tok_kind(const ms_tokenizer *t) { return t->kind; }
int ms_tok_adds_bos(const ms_tokenizer *t) { return t->add_bos && t->bos_id >= 0; }
int ms_tok_adds_eos(const ms_tokenizer *t) { return t->add_eos && t->eos_id >= 0; }

/* ---- construction ---- */

int ms_tok_finish(ms_tokenizer *t, ms_err *err) {
    uint32_t nv = t->bpe.n_ids;
    for (size_t i = 0; i < t->n_added; i++)
        if ((uint32_t)t->added[i].id + 1 > nv) nv = (uint32_t)t->added[i].id + 1;
    t->n_vocab = nv;
    t->added_of_id = malloc((nv ? nv : 1) * sizeof *t->added_of_id);
    if (!t->added_of_id) return ms_fail(err, MS_ERR_NOMEM, "tokenizer: out of memory");
    for (uint32_t i = 0; i < nv; i++) t->added_of_id[i] = -1;
    for (size_t i = 0; i < t->n_added; i++) {
        ms_added *a = &t->added[i];
        if (t->added_of_id[a->id] >= 0)
            return ms_fail(err, MS_ERR_FORMAT, "added token %zu (\"%.100s\"): id %d used twice", i, a->content, a->id);
        t->added_of_id[a->id] = (int32_t)i;
        ms_buf db = {0};
        int bad = t->kind == MS_TOK_KIND_HF ? ms_bytelevel_decode((const uint8_t *)a->content, a->len, &db)
                                            : ms_buf_add(&db, a->content, a->len);
        if (bad || ms_buf_add(&db, "", 0)) {
            ms_buf_free(&db);
            return ms_fail(err, MS_ERR_NOMEM, "tokenizer: out of memory");
        }
        a->dec = db.p;
        a->dec_len = db.n;
        if (a->len == 0) continue; /* an empty token can never match */
        ms_trie *tr = &t->trie_raw;
        const uint8_t *pat = (const uint8_t *)a->content;
        size_t pn = a->len;
        ms_buf nb = {0};
        if (a->normalized) {
            tr = &t->trie_norm;
            if (t->normalizer == MS_NORM_NFC) {
                if (ms_nfc(pat, pn, &nb)) return ms_fail(err, MS_ERR_NOMEM, "tokenizer: out of memory");
                pat = nb.p, pn = nb.n;
            }
        }
        bad = ms_trie_add(tr, pat, pn, (int32_t)i);
        ms_buf_free(&nb);
        if (bad) return ms_fail(err, MS_ERR_NOMEM, "tokenizer: out of memory");
    }
    return MS_OK;
}

void ms_tok_free(ms_tokenizer *t) {
    if (!t) return;
    ms_bpe_free(&t->bpe);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content), free(t->added[i].dec);
    free(t->added);
    free(t->added_of_id);
    ms_trie_free(&t->trie_raw);
    ms_trie_free(&t->trie_norm);
    for (int i = 0; i < t->n_pre; i++) ms_regex_free(t->pre[i].re);
    free(t->pre);
    free(t);
}
