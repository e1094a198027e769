/* Streaming output parsers: one state machine over a buffer of text not yet
 * decided (`pend`). Each step finds the earliest complete marker the current
 * state cares about; text before it is emitted, and a tail that could still
 * grow into a marker is held back. Buffering states (a tool call's head, a
 * GLM value) keep their text in pend until their closing marker arrives. */
#include "text/outparse.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"

#define BLOCK_MAX_DEFAULT ((size_t)64 << 20) /* opts.max_block = 0 */
#define FEED_SLICE 65536 /* input is appended and parsed this much at a time */
#define HEAD_MAX 1024 /* a tool call's head (name, id) longer than this is not one */

/* DeepSeek V3 / V3.1 */
#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALLS_END "<｜tool▁calls▁end｜>"
#define DS_CALL_BEGIN "<｜tool▁call▁begin｜>"
#define DS_CALL_END "<｜tool▁call▁end｜>"
#define DS_SEP "<｜tool▁sep｜>"
/* Kimi K2 */
#define KM_SECTION_BEGIN "<|tool_calls_section_begin|>"
#define KM_SECTION_BEGIN2 "<|tool_call_section_begin|>"
#define KM_SECTION_END "<|tool_calls_section_end|>"
#define KM_SECTION_END2 "<|tool_call_section_end|>"
#define KM_CALL_BEGIN "<|tool_call_begin|>"
#define KM_ARG_BEGIN "<|tool_call_argument_begin|>"
#define KM_CALL_END "<|tool_call_end|>"
/* Qwen3, GLM */
#define TC_OPEN "<tool_call>"
#define TC_CLOSE "</tool_call>"
/* Qwen3's template writes content, then "\n" before the first <tool_call> when
 * the content is not empty: that newline is the template's, not content, so
 * parse(text) rendered again gives text back (session/generate.h's canonical
 * history relies on it). Only one newline: more belong to the content. */
#define QW_NL_OPEN "\n" TC_OPEN
#define GLM_KEY "<arg_key>"
#define GLM_KEY_END "</arg_key>"
#define GLM_VAL "<arg_value>"
#define GLM_VAL_END "</arg_value>"
/* harmony */
#define H_START "<|start|>"
#define H_CHANNEL "<|channel|>"
#define H_MESSAGE "<|message|>"
#define H_END "<|end|>"
#define H_CALL "<|call|>"
#define H_RETURN "<|return|>"
#define H_CONSTRAIN "<|constrain|>"

enum {
    ST_TEXT,      /* content or reasoning (p->reasoning) */
    ST_SECTION,   /* DeepSeek/Kimi: inside the tool-calls section, between calls */
    ST_HEAD,      /* DeepSeek/Kimi: a call's head, buffered until its arguments start */
    ST_ARGS,      /* streaming a call's arguments until its end marker */
    ST_QWEN_HEAD, /* Qwen3: {"name": ..., "arguments": prefix being matched */
    ST_QWEN_ARGS, /* Qwen3: streaming the arguments value */
    ST_QWEN_WHOLE,/* Qwen3: a body in another layout, buffered to </tool_call> */
    ST_GLM_NAME,
    ST_GLM_PAIRS, /* between pairs: waiting for <arg_key> or </tool_call> */
    ST_GLM_KEY,
    ST_GLM_VALWAIT,
    ST_GLM_VALUE,
    ST_H_HEADER,
    ST_H_BODY,
    ST_X_TOP,   /* XTML: between elements */
    ST_X_TEXT,  /* XTML: think/response text (p->h_kind) */
    ST_X_OPEN,  /* XTML: an open tag, buffered to <|sep|> */
    ST_X_CLOSE, /* XTML: a close tag, buffered to <|sep|> */
    ST_X_VALUE, /* XTML: an argument value, buffered to <|close|> */
    ST_X_JSON,  /* XTML: raw JSON arguments, streamed to <|close|> */
};

enum { K_CONTENT, K_REASONING, K_TOOL };

struct ms_outparse {
    ms_outfmt fmt;
    int state, reasoning, skip_ws, failed;
    int plain; /* no markers at all (harmony output that had no harmony header) */
    ms_textbuf pend;
    size_t scan_from; /* buffering states: pend[0..scan_from) holds no complete marker start */
    size_t max_block; /* longest buffered block (find_block) */
    int over_block;   /* find_block failed the parse */
    char *r_open, *r_close;
    uint64_t seed;
    ms_py *tools;
    int ntools;       /* calls started so far */
    int in_call;      /* a TOOL_START without its TOOL_END */
    const char *block_open; /* marker that opened a buffered block (given back on failure) */
    char *name;       /* current call's name */
    ms_textbuf key;   /* GLM: the current argument key */
    int npairs;       /* GLM: pairs emitted in the current call */
    int h_kind;       /* harmony: what the current message body is; XTML: text kind / value type */
    int h_json;       /* XTML: the current call's arguments came as a raw JSON block */
    ms_outev_fn fn;
    void *user;
    ms_err *err;
    int cb_status;
};

/* ---------------- names ---------------- */

static const char *fmt_names[MS_OUTFMT_COUNT] = {"think", "deepseek_v3", "deepseek_v31", "qwen3",
                                                 "kimi_k2", "glm", "harmony", "xtml"};

const char *ms_outfmt_name(ms_outfmt f) { return f < MS_OUTFMT_COUNT ? fmt_names[f] : "?"; }

int ms_outfmt_from_name(const char *name, ms_outfmt *out, ms_err *err) {
    for (int i = 0; i < MS_OUTFMT_COUNT; i++)
        if (name && strcmp(name, fmt_names[i]) == 0) {
            *out = (ms_outfmt)i;
            return MS_OK;
        }
    return ms_fail(err, MS_ERR_ARG, "unknown output format \"%s\" (known: think, deepseek_v3, "
                   "deepseek_v31, qwen3, kimi_k2, glm, harmony, xtml)", name ? name : "(null)");
}

/* ---------------- helpers ---------------- */

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int emit(ms_outparse *p, ms_outev_type t, const char *s, size_t n) {
    if (p->cb_status) return p->cb_status;
    if (!n && (t == MS_OUTEV_CONTENT || t == MS_OUTEV_REASONING || t == MS_OUTEV_TOOL_ARGS)) return 0;
    ms_outev ev = {.type = t, .text = s, .len = n, .tool_index = p->ntools - 1};
    p->cb_status = p->fn ? p->fn(p->user, &ev) : 0;
    return p->cb_status;
}

/* Length of s[0..n) that ends on a UTF-8 character boundary (an unfinished
 * trailing sequence is held back unless final). */
static size_t utf8_cut(const char *s, size_t n, int final) {
    if (final) return n;
    for (size_t k = 1; k <= 4 && k <= n; k++) {
        unsigned char c = s[n - k];
        if (c < 0x80) return n;
        if (c >= 0xC0) {
            size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            return k < need ? n - k : n;
        }
    }
    return n;
}

/* Emit text of kind (content/reasoning); returns bytes used (the rest waits
 * for more input). Honors skip_ws for content. */
static size_t emit_text(ms_outparse *p, int kind, const char *s, size_t n, int final) {
    size_t used = 0;
    if (p->skip_ws) {
        while (used < n && is_ws(s[used])) used++;
        if (used == n) return n;
        p->skip_ws = 0;
    }
    size_t cut = utf8_cut(s + used, n - used, final);
    emit(p, kind == K_REASONING ? MS_OUTEV_REASONING : MS_OUTEV_CONTENT, s + used, cut);
    return used + cut;
}

static size_t emit_args(ms_outparse *p, const char *s, size_t n, int final) {
    size_t cut = utf8_cut(s, n, final);
    emit(p, MS_OUTEV_TOOL_ARGS, s, cut);
    return cut;
}

static void consume(ms_outparse *p, size_t n) {
    if (n > p->pend.len) n = p->pend.len;
    memmove(p->pend.data, p->pend.data + n, p->pend.len - n);
    p->pend.len -= n;
    if (p->pend.data) p->pend.data[p->pend.len] = 0;
    p->scan_from = 0;
}

/* Earliest complete marker in s[from..n), the longest one at that position:
 * returns its index and *pos, or -1. */
static int first_marker(const char *s, size_t n, size_t from, const char *const *m, int nm, size_t *pos) {
    int best = -1;
    size_t bp = 0, bl = 0;
    for (int i = 0; i < nm; i++) {
        size_t ml = strlen(m[i]);
        if (from >= n || n - from < ml) continue;
        const char *h = memmem(s + from, n - from, m[i], ml);
        if (!h) continue;
        size_t ps = h - s;
        if (best < 0 || ps < bp || (ps == bp && ml > bl)) best = i, bp = ps, bl = ml;
    }
    *pos = bp;
    return best;
}

/* Earliest complete marker in s[from..n): returns its index and *pos, or -1.
 * A match is not decided while a longer marker could still complete at the
 * same position, or any marker could still complete at an earlier one. When
 * -1 (or undecided), *safe is how much of s can be released: everything
 * before the earliest position where a marker may still begin. */
static int find_marker(const char *s, size_t n, size_t from, const char *const *m, int nm, size_t *pos,
                       size_t *safe) {
    size_t bp = 0;
    int best = first_marker(s, n, from, m, nm, &bp);
    size_t bl = best >= 0 ? strlen(m[best]) : 0;
    /* the earliest start of a marker that runs past the end of s (incomplete) */
    size_t early = n;
    for (int i = 0; i < nm; i++) {
        size_t ml = strlen(m[i]);
        for (size_t q = n >= ml ? n - ml + 1 : 0; q < early && q < n; q++)
            if (memcmp(m[i], s + q, n - q) == 0) {
                early = q;
                break;
            }
    }
    if (best >= 0) {
        if (early < bp) { /* a marker starting earlier is still incomplete */
            *safe = early;
            return -1;
        }
        for (int i = 0; i < nm; i++) { /* a longer marker still possible here? */
            size_t ml = strlen(m[i]);
            if (ml > bl && n - bp < ml && memcmp(m[i], s + bp, n - bp) == 0) {
                *safe = bp;
                return -1;
            }
        }
        *pos = bp;
        return best;
    }
    *safe = early;
    return -1;
}

/* Buffering lookup: like find_marker, remembering how far pend was searched. */
static int find_buffered(ms_outparse *p, const char *const *m, int nm, size_t *pos) {
    size_t safe = 0;
    int w = find_marker(p->pend.data, p->pend.len, p->scan_from, m, nm, pos, &safe);
    if (w < 0) p->scan_from = safe;
    return w;
}

/* A block buffered to its closing marker (a GLM key or value, a Qwen3 body in
 * another layout, an XTML value): find_buffered, failing with MS_ERR_LIMIT when
 * the block is longer than max_block bytes. Decided on the block's length, not
 * on how much happens to be buffered, so whole and chunked input fail alike. */
static int find_block(ms_outparse *p, const char *const *m, int nm, size_t *pos) {
    int w = find_buffered(p, m, nm, pos);
    if ((w >= 0 && *pos > p->max_block) || (w < 0 && p->scan_from > p->max_block)) {
        p->cb_status = MS_ERR_LIMIT;
        p->over_block = 1;
        return -1;
    }
    return w;
}

/* Head lookup (tool-call head, harmony header, XTML tag): the marker must end
 * within the head's first HEAD_MAX + 1 bytes. Returns the marker's index (*pos
 * set), HEAD_WAIT while fewer bytes are buffered and none is decided, or
 * HEAD_ABSENT once the window is complete without one. The answer depends only
 * on the window's bytes, never on how much is buffered past it, so whole,
 * chunked and byte-by-byte input agree (fuzz_outparse findings). */
#define HEAD_WAIT (-1)
#define HEAD_ABSENT (-2)
static int find_head(ms_outparse *p, const char *const *m, int nm, size_t *pos) {
    if (p->pend.len <= HEAD_MAX) return find_buffered(p, m, nm, pos);
    int w = first_marker(p->pend.data, HEAD_MAX + 1, 0, m, nm, pos);
    return w >= 0 ? w : HEAD_ABSENT;
}

static void trim(const char **s, size_t *n) {
    while (*n && is_ws((*s)[0])) (*s)++, (*n)--;
    while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int start_call(ms_outparse *p, const char *name, size_t nlen, const char *id, size_t idlen) {
    free(p->name);
    p->name = strndup(name, nlen);
    if (!p->name) return p->cb_status = MS_ERR_NOMEM;
    char gen[48];
    char *idcopy = NULL;
    if (!id) {
        uint64_t x = p->seed ^ ((uint64_t)p->ntools * 0xD1B54A32D192ED03ull);
        uint64_t a = splitmix(&x), b = splitmix(&x);
        snprintf(gen, sizeof gen, "call_%016llx%08llx", (unsigned long long)a,
                 (unsigned long long)(b >> 32));
    } else {
        idcopy = strndup(id, idlen);
        if (!idcopy) return p->cb_status = MS_ERR_NOMEM;
    }
    p->ntools++;
    p->in_call = 1;
    p->npairs = 0;
    if (!p->cb_status) {
        ms_outev ev = {.type = MS_OUTEV_TOOL_START, .tool_index = p->ntools - 1,
                       .tool_id = idcopy ? idcopy : gen, .tool_name = p->name};
        p->cb_status = p->fn ? p->fn(p->user, &ev) : 0;
    }
    free(idcopy);
    return p->cb_status;
}

static void end_call(ms_outparse *p) {
    if (!p->in_call) return;
    p->in_call = 0;
    emit(p, MS_OUTEV_TOOL_END, NULL, 0);
}

/* A block that turned out not to be a tool call: give its text back as content. */
static void give_back(ms_outparse *p, size_t n) {
    p->skip_ws = 0;
    if (p->block_open) emit(p, MS_OUTEV_CONTENT, p->block_open, strlen(p->block_open));
    emit_text(p, K_CONTENT, p->pend.data, n, 1);
    consume(p, n);
    p->block_open = NULL;
    p->state = ST_TEXT;
    p->reasoning = 0;
}

/* A head longer than its window: its first HEAD_MAX + 1 bytes go back as
 * content, less a character cut at the window's edge, which stays (with the
 * rest) for the text state, so content deltas end on character boundaries. */
static void give_back_head(ms_outparse *p) { give_back(p, utf8_cut(p->pend.data, HEAD_MAX + 1, 0)); }

/* ---------------- content / reasoning ---------------- */

static int step_text(ms_outparse *p) {
    const char *m[8];
    int nm = 0;
    if (p->plain) {
    } else if (p->reasoning) {
        m[nm++] = p->r_close;
    } else {
        if (p->fmt != MS_OUTFMT_HARMONY) m[nm++] = p->r_open;
        switch (p->fmt) {
        case MS_OUTFMT_DEEPSEEK_V3:
        case MS_OUTFMT_DEEPSEEK_V31:
            m[nm++] = DS_CALLS_BEGIN;
            m[nm++] = DS_CALL_BEGIN;
            break;
        case MS_OUTFMT_KIMI_K2:
            m[nm++] = KM_SECTION_BEGIN;
            m[nm++] = KM_SECTION_BEGIN2;
            m[nm++] = KM_CALL_BEGIN;
            break;
        case MS_OUTFMT_QWEN3:
            m[nm++] = TC_OPEN;
            m[nm++] = QW_NL_OPEN;
            break;
        case MS_OUTFMT_GLM: m[nm++] = TC_OPEN; break;
        default: break;
        }
    }
    size_t pos = 0, safe = 0;
    int w = find_marker(p->pend.data, p->pend.len, 0, m, nm, &pos, &safe);
    int kind = p->reasoning ? K_REASONING : K_CONTENT;
    if (w < 0) {
        size_t used = emit_text(p, kind, p->pend.data, safe, 0);
        consume(p, used);
        return used > 0;
    }
    emit_text(p, kind, p->pend.data, pos, 1);
    const char *mk = m[w];
    consume(p, pos + strlen(mk));
    if (mk == p->r_open) {
        p->reasoning = 1;
        p->skip_ws = 1;
    } else if (mk == p->r_close) {
        p->reasoning = 0;
        p->skip_ws = 1;
    } else if (!strcmp(mk, DS_CALL_BEGIN) || !strcmp(mk, KM_CALL_BEGIN)) {
        p->block_open = mk;
        p->state = ST_HEAD;
    } else if (!strcmp(mk, TC_OPEN) || !strcmp(mk, QW_NL_OPEN)) {
        p->block_open = mk; /* given back whole (newline too) if not a call */
        p->state = p->fmt == MS_OUTFMT_QWEN3 ? ST_QWEN_HEAD : ST_GLM_NAME;
    } else {
        p->state = ST_SECTION;
        p->skip_ws = 1; /* separators between calls are not content */
    }
    return 1;
}

/* ---------------- DeepSeek / Kimi sections ---------------- */

static int step_section(ms_outparse *p) {
    const char *ds[] = {DS_CALL_BEGIN, DS_CALLS_END};
    const char *km[] = {KM_CALL_BEGIN, KM_SECTION_END, KM_SECTION_END2};
    int kimi = p->fmt == MS_OUTFMT_KIMI_K2;
    size_t pos = 0, safe = 0;
    int w = find_marker(p->pend.data, p->pend.len, 0, kimi ? km : ds, kimi ? 3 : 2, &pos, &safe);
    if (w < 0) {
        size_t used = emit_text(p, K_CONTENT, p->pend.data, safe, 0);
        consume(p, used);
        return used > 0;
    }
    emit_text(p, K_CONTENT, p->pend.data, pos, 1);
    const char *mk = kimi ? km[w] : ds[w];
    consume(p, pos + strlen(mk));
    if (w == 0) {
        p->block_open = mk;
        p->state = ST_HEAD;
    } else {
        p->state = ST_TEXT;
        p->skip_ws = 1;
    }
    return 1;
}

static int step_head(ms_outparse *p) {
    const char *v3[] = {"```json\n", "```json", DS_CALL_END};
    const char *v31[] = {DS_SEP, DS_CALL_END};
    const char *km[] = {KM_ARG_BEGIN, KM_CALL_END};
    const char *const *m = p->fmt == MS_OUTFMT_DEEPSEEK_V3 ? v3 : p->fmt == MS_OUTFMT_KIMI_K2 ? km : v31;
    int nm = p->fmt == MS_OUTFMT_DEEPSEEK_V3 ? 3 : 2;
    size_t pos = 0;
    int w = find_head(p, m, nm, &pos);
    if (w == HEAD_ABSENT) { /* not a call: exactly the head's budget goes back */
        give_back_head(p);
        return 1;
    }
    if (w < 0) return 0;
    if (!strcmp(m[w], DS_CALL_END) || !strcmp(m[w], KM_CALL_END)) { /* a call without arguments */
        give_back(p, pos);
        return 1;
    }
    const char *h = p->pend.data;
    size_t hl = pos;
    const char *id = NULL;
    size_t idl = 0;
    if (p->fmt == MS_OUTFMT_DEEPSEEK_V3) { /* "function<｜tool▁sep｜>NAME\n" */
        const char *sep = memmem(h, hl, DS_SEP, strlen(DS_SEP));
        if (sep) {
            hl -= sep + strlen(DS_SEP) - h;
            h = sep + strlen(DS_SEP);
        }
    }
    trim(&h, &hl);
    if (p->fmt == MS_OUTFMT_KIMI_K2) { /* "functions.NAME:IDX" is the id; NAME the name */
        id = h;
        idl = hl;
        if (hl > 10 && !memcmp(h, "functions.", 10)) h += 10, hl -= 10;
        const char *colon = NULL;
        for (size_t i = 0; i < hl; i++)
            if (h[i] == ':') colon = h + i;
        if (colon) {
            int digits = colon + 1 < h + hl;
            for (const char *q = colon + 1; q < h + hl; q++) digits &= *q >= '0' && *q <= '9';
            if (digits) hl = colon - h;
        }
    }
    if (!hl || memchr(h, '\n', hl)) {
        give_back(p, pos);
        return 1;
    }
    if (start_call(p, h, hl, id, idl)) return 0;
    consume(p, pos + strlen(m[w]));
    p->block_open = NULL;
    p->state = ST_ARGS;
    return 1;
}

static int step_args(ms_outparse *p) {
    const char *v3[] = {"\n```" DS_CALL_END, "```" DS_CALL_END, DS_CALL_END, DS_CALLS_END};
    const char *v31[] = {DS_CALL_END, DS_CALLS_END};
    const char *km[] = {KM_CALL_END, KM_SECTION_END, KM_SECTION_END2};
    const char *hm[] = {H_CALL, H_END, H_RETURN, H_START};
    const char *const *m;
    int nm;
    switch (p->fmt) {
    case MS_OUTFMT_DEEPSEEK_V3: m = v3, nm = 4; break;
    case MS_OUTFMT_DEEPSEEK_V31: m = v31, nm = 2; break;
    case MS_OUTFMT_KIMI_K2: m = km, nm = 3; break;
    default: m = hm, nm = 4; break;
    }
    size_t pos = 0, safe = 0;
    int w = find_marker(p->pend.data, p->pend.len, 0, m, nm, &pos, &safe);
    if (w < 0) {
        size_t used = emit_args(p, p->pend.data, safe, 0);
        consume(p, used);
        return used > 0;
    }
    emit_args(p, p->pend.data, pos, 1);
    end_call(p);
    consume(p, pos + strlen(m[w]));
    if (p->fmt == MS_OUTFMT_HARMONY) {
        p->state = ST_H_HEADER;
    } else if (!strcmp(m[w], DS_CALLS_END) || !strcmp(m[w], KM_SECTION_END) ||
               !strcmp(m[w], KM_SECTION_END2)) {
        p->state = ST_TEXT;
        p->skip_ws = 1;
    } else {
        p->state = ST_SECTION;
        p->skip_ws = 1;
    }
    return 1;
}

/* ---------------- Qwen3 ---------------- */

/* Match ws* { ws* "name" ws* : ws* STRING ws* , ws* "arguments" ws* : ws* and
 * the first byte of the value. 1 = matched (*used = prefix length, name
 * decoded into *name), 0 = need more text, -1 = a different layout. */
static int qwen_prefix(const char *s, size_t n, size_t *used, char **name) {
    size_t i = 0;
#define WS() while (i < n && is_ws(s[i])) i++
#define LIT(t)                                                   \
    do {                                                         \
        size_t l_ = strlen(t);                                   \
        size_t a_ = n - i < l_ ? n - i : l_;                     \
        if (memcmp(s + i, t, a_)) return -1;                     \
        if (a_ < l_) return 0;                                   \
        i += l_;                                                 \
    } while (0)
    WS();
    LIT("{");
    WS();
    LIT("\"name\"");
    WS();
    LIT(":");
    WS();
    if (i >= n) return 0;
    if (s[i] != '"') return -1;
    size_t ns = i++;
    while (i < n && s[i] != '"') i += s[i] == '\\' ? 2 : 1;
    if (i >= n) return 0;
    size_t ne = ++i;
    WS();
    LIT(",");
    WS();
    LIT("\"arguments\"");
    WS();
    LIT(":");
    WS();
    if (i >= n) return 0;
#undef WS
#undef LIT
    ms_py *v = NULL;
    if (ms_py_parse(s + ns, ne - ns, 4, "tool name", &v, NULL) || v->type != MS_PY_STR) {
        ms_py_free(v);
        return -1;
    }
    *name = v->s;
    v->s = NULL;
    ms_py_free(v);
    *used = i;
    return 1;
}

/* The streamed layout is recognized only in the body's text before its first
 * </tool_call> and within its first HEAD_MAX + 1 bytes: the decision depends on
 * those positions, never on how much text happens to be buffered, so whole and
 * chunked input agree (fuzz_outparse finding). Anything else is buffered whole. */
static int step_qwen_head(ms_outparse *p) {
    const char *m[] = {TC_CLOSE};
    size_t close = 0;
    int found = find_buffered(p, m, 1, &close) >= 0;
    size_t lim = found ? close : p->scan_from; /* no </tool_call> begins before lim */
    int final = found || lim > HEAD_MAX;      /* the text the decision may see is all here */
    if (lim > HEAD_MAX + 1) lim = HEAD_MAX + 1;
    size_t used = 0;
    char *name = NULL;
    int r = qwen_prefix(p->pend.data, lim, &used, &name);
    if (r == 0 && !final) return 0;
    if (r <= 0) {
        p->state = ST_QWEN_WHOLE;
        return 1;
    }
    int st = start_call(p, name, strlen(name), NULL, 0);
    free(name);
    if (st) return 0;
    consume(p, used);
    p->block_open = NULL;
    p->state = ST_QWEN_ARGS;
    return 1;
}

/* The arguments are the body without its outer closing brace: trailing
 * whitespace, one '}', whitespace. While streaming, only such a tail is held
 * back (the cut only grows as text arrives). */
static size_t qwen_args_cut(const char *s, size_t n) {
    while (n && is_ws(s[n - 1])) n--;
    if (n && s[n - 1] == '}') {
        n--;
        while (n && is_ws(s[n - 1])) n--;
    }
    return n;
}

static int step_qwen_args(ms_outparse *p) {
    const char *m[] = {TC_CLOSE};
    size_t pos = 0, safe = 0;
    int w = find_marker(p->pend.data, p->pend.len, 0, m, 1, &pos, &safe);
    if (w < 0) {
        size_t used = emit_args(p, p->pend.data, qwen_args_cut(p->pend.data, safe), 0);
        consume(p, used);
        return used > 0;
    }
    emit_args(p, p->pend.data, qwen_args_cut(p->pend.data, pos), 1);
    end_call(p);
    consume(p, pos + strlen(TC_CLOSE));
    p->state = ST_TEXT;
    p->skip_ws = 1;
    return 1;
}

static int step_qwen_whole(ms_outparse *p) {
    const char *m[] = {TC_CLOSE};
    size_t pos = 0;
    if (find_block(p, m, 1, &pos) < 0) return 0;
    ms_py *v = NULL;
    const ms_py *name = NULL, *args = NULL;
    if (ms_py_parse(p->pend.data, pos, 64, "tool call", &v, NULL) == MS_OK && v->type == MS_PY_DICT) {
        name = ms_py_get(v, "name");
        args = ms_py_get(v, "arguments");
        if (!args) args = ms_py_get(v, "parameters");
    }
    if (!name || name->type != MS_PY_STR || (args && args->type != MS_PY_DICT && args->type != MS_PY_STR)) {
        ms_py_free(v);
        give_back(p, pos + strlen(TC_CLOSE));
        return 1;
    }
    if (start_call(p, name->s, name->slen, NULL, 0) == MS_OK) {
        if (!args) emit(p, MS_OUTEV_TOOL_ARGS, "{}", 2);
        else if (args->type == MS_PY_STR) emit(p, MS_OUTEV_TOOL_ARGS, args->s, args->slen);
        else {
            ms_textbuf b = {0};
            ms_py_dumps(&b, args, 0);
            if (b.failed) p->cb_status = MS_ERR_NOMEM;
            else emit(p, MS_OUTEV_TOOL_ARGS, b.data, b.len);
            ms_textbuf_free(&b);
        }
        end_call(p);
    }
    ms_py_free(v);
    consume(p, pos + strlen(TC_CLOSE));
    p->block_open = NULL;
    p->state = ST_TEXT;
    p->skip_ws = 1;
    return 1;
}

/* ---------------- GLM ---------------- */

/* Does the tools schema declare NAME's parameter KEY as a string? */
static int glm_is_string_param(const ms_outparse *p, const char *key) {
    if (!p->tools || p->tools->type != MS_PY_LIST) return 0;
    for (size_t i = 0; i < p->tools->n; i++) {
        const ms_py *t = p->tools->items[i];
        const ms_py *f = ms_py_get(t, "function");
        if (!f) f = t;
        if (!ms_py_str_eq(ms_py_get(f, "name"), p->name)) continue;
        const ms_py *ty = ms_py_get(ms_py_get(ms_py_get(ms_py_get(f, "parameters"), "properties"), key), "type");
        return ms_py_str_eq(ty, "string");
    }
    return 0;
}

static void glm_emit_pair(ms_outparse *p, const char *v, size_t vl) {
    ms_textbuf b = {0};
    ms_textbuf_puts(&b, p->npairs ? ", " : "");
    ms_py k = {.type = MS_PY_STR, .s = p->key.data ? p->key.data : "", .slen = p->key.len};
    ms_py_dumps(&b, &k, 0);
    ms_textbuf_puts(&b, ": ");
    ms_py *parsed = NULL;
    const char *t = v;
    size_t tl = vl;
    trim(&t, &tl);
    if (!glm_is_string_param(p, k.s) && ms_py_parse(t, tl, 64, "value", &parsed, NULL) == MS_OK &&
        parsed->type != MS_PY_STR) {
        ms_textbuf_append(&b, t, tl);
    } else {
        ms_py s = {.type = MS_PY_STR, .s = (char *)v, .slen = vl};
        ms_py_dumps(&b, &s, 0);
    }
    ms_py_free(parsed);
    if (b.failed) p->cb_status = MS_ERR_NOMEM;
    else emit(p, MS_OUTEV_TOOL_ARGS, b.data, b.len);
    ms_textbuf_free(&b);
    p->npairs++;
}

static int step_glm(ms_outparse *p) {
    size_t pos = 0;
    int w;
    switch (p->state) {
    case ST_GLM_NAME: {
        const char *m[] = {GLM_KEY, TC_CLOSE};
        w = find_head(p, m, 2, &pos);
        if (w == HEAD_ABSENT) { /* not a call: exactly the head's budget goes back */
            give_back_head(p);
            return 1;
        }
        if (w < 0) return 0;
        const char *h = p->pend.data;
        size_t hl = pos;
        trim(&h, &hl);
        int bad = !hl || hl > 256;
        for (size_t i = 0; i < hl && !bad; i++) bad = is_ws(h[i]) || h[i] == '{' || h[i] == '<';
        if (bad) {
            give_back(p, w == 1 ? pos + strlen(TC_CLOSE) : pos);
            return 1;
        }
        if (start_call(p, h, hl, NULL, 0)) return 0;
        emit(p, MS_OUTEV_TOOL_ARGS, "{", 1);
        consume(p, pos + strlen(m[w]));
        p->block_open = NULL;
        if (w == 1) {
            emit(p, MS_OUTEV_TOOL_ARGS, "}", 1);
            end_call(p);
            p->state = ST_TEXT;
            p->skip_ws = 1;
        } else {
            p->state = ST_GLM_KEY;
        }
        return 1;
    }
    case ST_GLM_PAIRS:
    case ST_GLM_VALWAIT: {
        const char *m[] = {GLM_KEY, TC_CLOSE, GLM_VAL};
        w = find_block(p, m, p->state == ST_GLM_VALWAIT ? 3 : 2, &pos);
        if (w < 0) return 0;
        consume(p, pos + strlen(m[w]));
        if (w == 0) {
            p->state = ST_GLM_KEY;
        } else if (w == 2) {
            p->state = ST_GLM_VALUE;
        } else {
            emit(p, MS_OUTEV_TOOL_ARGS, "}", 1);
            end_call(p);
            p->state = ST_TEXT;
            p->skip_ws = 1;
        }
        return 1;
    }
    case ST_GLM_KEY: {
        const char *m[] = {GLM_KEY_END, TC_CLOSE};
        w = find_block(p, m, 2, &pos);
        if (w < 0) return 0;
        const char *k = p->pend.data;
        size_t kl = pos;
        trim(&k, &kl);
        p->key.len = 0;
        ms_textbuf_append(&p->key, k, kl);
        ms_textbuf_append(&p->key, "", 0);
        if (p->key.failed) return p->cb_status = MS_ERR_NOMEM, 0;
        if (w == 1) { /* key without value: end the call */
            consume(p, pos);
            p->state = ST_GLM_PAIRS;
            return 1;
        }
        consume(p, pos + strlen(GLM_KEY_END));
        p->state = ST_GLM_VALWAIT;
        return 1;
    }
    default: { /* ST_GLM_VALUE */
        const char *m[] = {GLM_VAL_END, TC_CLOSE};
        w = find_block(p, m, 2, &pos);
        if (w < 0) return 0;
        glm_emit_pair(p, p->pend.data, pos);
        consume(p, w == 0 ? pos + strlen(GLM_VAL_END) : pos);
        p->state = ST_GLM_PAIRS;
        return 1;
    }
    }
}

/* ---------------- harmony ---------------- */

static int step_h_header(ms_outparse *p) {
    const char *m[] = {H_MESSAGE};
    size_t pos = 0;
    int w = find_head(p, m, 1, &pos);
    if (w == HEAD_ABSENT) { /* not harmony: plain content from here on */
        p->plain = 1;
        p->state = ST_TEXT;
        return 1;
    }
    if (w < 0) return 0;
    const char *h = p->pend.data;
    size_t hl = pos;
    /* the header of the last message only */
    for (const char *q = h; (q = memmem(q, hl - (q - h), H_START, strlen(H_START)));) {
        q += strlen(H_START);
        hl -= q - h;
        h = q;
    }
    char channel[64] = "", recipient[256] = "";
    const char *c = memmem(h, hl, H_CHANNEL, strlen(H_CHANNEL));
    if (c) {
        c += strlen(H_CHANNEL);
        size_t i = 0;
        while (c + i < h + hl && !is_ws(c[i]) && c[i] != '<' && i < sizeof channel - 1) i++;
        memcpy(channel, c, i);
        channel[i] = 0;
    }
    for (size_t i = 0; i + 3 <= hl; i++)
        if (!memcmp(h + i, "to=", 3) && (i == 0 || is_ws(h[i - 1]) || h[i - 1] == '>')) {
            size_t j = i + 3, k = 0;
            while (j < hl && !is_ws(h[j]) && h[j] != '<' && k < sizeof recipient - 1) recipient[k++] = h[j++];
            recipient[k] = 0;
            break;
        }
    int kind = !strcmp(channel, "analysis") ? K_REASONING : K_CONTENT;
    if (recipient[0] && strncmp(recipient, "assistant", 9) != 0 && strcmp(recipient, "user") != 0)
        kind = K_TOOL;
    if (!c && !recipient[0]) { /* no header at all: its text is content */
        give_back(p, pos);
        p->state = ST_H_HEADER;
        consume(p, strlen(H_MESSAGE));
        p->h_kind = K_CONTENT;
        p->state = ST_H_BODY;
        return 1;
    }
    if (kind == K_TOOL) {
        const char *n = recipient;
        if (!strncmp(n, "functions.", 10)) n += 10;
        if (start_call(p, n, strlen(n), NULL, 0)) return 0;
    }
    p->h_kind = kind;
    consume(p, pos + strlen(H_MESSAGE));
    p->state = ST_H_BODY;
    return 1;
}

static int step_h_body(ms_outparse *p) {
    if (p->h_kind == K_TOOL) return step_args(p);
    const char *m[] = {H_END, H_RETURN, H_CALL, H_START};
    size_t pos = 0, safe = 0;
    int w = find_marker(p->pend.data, p->pend.len, 0, m, 4, &pos, &safe);
    if (w < 0) {
        size_t used = emit_text(p, p->h_kind, p->pend.data, safe, 0);
        consume(p, used);
        return used > 0;
    }
    emit_text(p, p->h_kind, p->pend.data, pos, 1);
    consume(p, pos + strlen(m[w]));
    p->state = ST_H_HEADER;
    return 1;
}

/* ---------------- XTML (Kimi K3) ---------------- */

#define X_OPEN "<|open|>"
#define X_CLOSE "<|close|>"
#define X_SEP "<|sep|>"
#define X_EOM "<|end_of_msg|>"

/* Attribute key="value" of a tag, &quot; and &amp; unescaped, into b; 0 if absent. */
static int x_attr(const char *t, size_t n, const char *key, ms_textbuf *b) {
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl + 3 <= n; i++) {
        if (t[i] != ' ' || memcmp(t + i + 1, key, kl) || t[i + 1 + kl] != '=' || t[i + 2 + kl] != '"') continue;
        size_t j = i + kl + 3;
        b->len = 0;
        while (j < n && t[j] != '"') {
            if (!strncmp(t + j, "&quot;", 6) && j + 6 <= n) ms_textbuf_append(b, "\"", 1), j += 6;
            else if (!strncmp(t + j, "&amp;", 5) && j + 5 <= n) ms_textbuf_append(b, "&", 1), j += 5;
            else ms_textbuf_append(b, t + j++, 1);
        }
        ms_textbuf_append(b, "", 0);
        return j < n;
    }
    return 0;
}

static int x_tag_is(const char *t, size_t n, const char *name) {
    size_t l = strlen(name);
    return n >= l && !memcmp(t, name, l) && (n == l || t[l] == ' ');
}

/* One argument pair: "key": value, the value typed by the element's type. */
static void x_pair(ms_outparse *p, const char *v, size_t vl) {
    ms_textbuf b = {0};
    ms_textbuf_puts(&b, p->npairs ? ", " : "{");
    ms_py k = {.type = MS_PY_STR, .s = p->key.data ? p->key.data : "", .slen = p->key.len};
    ms_py_dumps(&b, &k, 0);
    ms_textbuf_puts(&b, ": ");
    ms_py *parsed = NULL;
    if (p->h_kind != K_CONTENT && ms_py_parse(v, vl, 64, "value", &parsed, NULL) == MS_OK) {
        ms_textbuf_append(&b, v, vl); /* typed and valid JSON: as written */
    } else {
        ms_py s = {.type = MS_PY_STR, .s = (char *)v, .slen = vl};
        ms_py_dumps(&b, &s, 0);
    }
    ms_py_free(parsed);
    if (b.failed) p->cb_status = MS_ERR_NOMEM;
    else emit(p, MS_OUTEV_TOOL_ARGS, b.data, b.len);
    ms_textbuf_free(&b);
    p->npairs++;
}

static void x_end_call(ms_outparse *p) {
    if (p->npairs) emit(p, MS_OUTEV_TOOL_ARGS, "}", 1);
    else if (!p->h_json) emit(p, MS_OUTEV_TOOL_ARGS, "{}", 2);
    end_call(p);
}

/* Between elements, or inside think/response text: text goes out as
 * h_kind (content outside), tags switch state. */
static int step_x_text(ms_outparse *p) {
    const char *m[] = {X_OPEN, X_CLOSE, X_EOM};
    size_t pos = 0, safe = 0;
    int w = find_marker(p->pend.data, p->pend.len, 0, m, 3, &pos, &safe);
    int kind = p->state == ST_X_TEXT ? p->h_kind : K_CONTENT;
    if (w < 0) {
        size_t used = emit_text(p, kind, p->pend.data, safe, 0);
        consume(p, used);
        return used > 0;
    }
    emit_text(p, kind, p->pend.data, pos, 1);
    consume(p, pos + strlen(m[w]));
    p->state = w == 0 ? ST_X_OPEN : w == 1 ? ST_X_CLOSE : ST_X_TOP;
    p->skip_ws = p->state == ST_X_TOP; /* separators between elements are not content */
    return 1;
}

/* The head of a tag opened by `opener` (X_OPEN or X_CLOSE, already consumed): 1 with *pos at its
 * X_SEP; 0 when more text is needed; HEAD_ABSENT when the window holds no X_SEP: then it was not a
 * tag, exactly the head's budget went back as content and the state is ST_X_TOP again. */
static int x_tag_head(ms_outparse *p, const char *opener, size_t *pos) {
    const char *m[] = {X_SEP};
    int w = find_head(p, m, 1, pos);
    if (w == HEAD_ABSENT) {
        p->block_open = opener;
        give_back_head(p);
        p->state = ST_X_TOP;
        return HEAD_ABSENT;
    }
    return w >= 0;
}

static int step_x_open(ms_outparse *p) {
    size_t pos = 0;
    int h = x_tag_head(p, X_OPEN, &pos);
    if (h != 1) return h == HEAD_ABSENT; /* given back: progress; else wait for more */
    const char *t = p->pend.data;
    size_t n = pos;
    ms_textbuf a = {0};
    int next = ST_X_TOP;
    if (x_tag_is(t, n, "think") || x_tag_is(t, n, "response")) {
        p->h_kind = t[0] == 't' ? K_REASONING : K_CONTENT;
        next = ST_X_TEXT;
    } else if (x_tag_is(t, n, "call") && !p->in_call && x_attr(t, n, "tool", &a)) {
        p->h_json = 0;
        if (start_call(p, a.data, a.len, NULL, 0)) {
            ms_textbuf_free(&a);
            return 0;
        }
    } else if (x_tag_is(t, n, "argument") && p->in_call && x_attr(t, n, "key", &a)) {
        p->key.len = 0;
        ms_textbuf_append(&p->key, a.data, a.len);
        ms_textbuf_append(&p->key, "", 0);
        /* h_kind marks the value's type here: K_CONTENT = string */
        p->h_kind = x_attr(t, n, "type", &a) && strcmp(a.data, "string") ? K_TOOL : K_CONTENT;
        next = ST_X_VALUE;
    } else if (x_tag_is(t, n, "json") && p->in_call && !p->npairs) {
        p->h_json = 1;
        next = ST_X_JSON;
    } else if (!(x_tag_is(t, n, "tools") || x_tag_is(t, n, "message"))) {
        ms_textbuf_free(&a);
        p->block_open = X_OPEN; /* not an element of an assistant message: content */
        give_back(p, pos + strlen(X_SEP));
        p->state = ST_X_TOP;
        return 1;
    }
    ms_textbuf_free(&a);
    if (p->key.failed) return p->cb_status = MS_ERR_NOMEM, 0;
    consume(p, pos + strlen(X_SEP));
    p->state = next;
    p->skip_ws = next == ST_X_TOP;
    return 1;
}

static int step_x_close(ms_outparse *p) {
    size_t pos = 0;
    int h = x_tag_head(p, X_CLOSE, &pos);
    if (h != 1) return h == HEAD_ABSENT; /* given back: progress; else wait for more */
    if (x_tag_is(p->pend.data, pos, "call") && p->in_call) x_end_call(p);
    consume(p, pos + strlen(X_SEP));
    p->state = ST_X_TOP;
    p->skip_ws = 1;
    return 1;
}

static int step_x_value(ms_outparse *p) {
    const char *m[] = {X_CLOSE};
    size_t pos = 0;
    if (find_block(p, m, 1, &pos) < 0) return 0;
    x_pair(p, p->pend.data, pos);
    consume(p, pos + strlen(X_CLOSE));
    p->state = ST_X_CLOSE;
    return 1;
}

static int step_x_json(ms_outparse *p) {
    const char *m[] = {X_CLOSE};
    size_t pos = 0, safe = 0;
    int w = find_marker(p->pend.data, p->pend.len, 0, m, 1, &pos, &safe);
    if (w < 0) {
        size_t used = emit_args(p, p->pend.data, safe, 0);
        consume(p, used);
        return used > 0;
    }
    emit_args(p, p->pend.data, pos, 1);
    consume(p, pos + strlen(X_CLOSE));
    p->state = ST_X_CLOSE;
    return 1;
}

/* ---------------- driver ---------------- */

static int step(ms_outparse *p) {
    switch (p->state) {
    case ST_TEXT: return step_text(p);
    case ST_SECTION: return step_section(p);
    case ST_HEAD: return step_head(p);
    case ST_ARGS: return step_args(p);
    case ST_QWEN_HEAD: return step_qwen_head(p);
    case ST_QWEN_ARGS: return step_qwen_args(p);
    case ST_QWEN_WHOLE: return step_qwen_whole(p);
    case ST_H_HEADER: return step_h_header(p);
    case ST_H_BODY: return step_h_body(p);
    case ST_X_TOP:
    case ST_X_TEXT: return step_x_text(p);
    case ST_X_OPEN: return step_x_open(p);
    case ST_X_CLOSE: return step_x_close(p);
    case ST_X_VALUE: return step_x_value(p);
    case ST_X_JSON: return step_x_json(p);
    default: return step_glm(p);
    }
}

static int run(ms_outparse *p) {
    while (p->pend.len && !p->cb_status && step(p)) {
    }
    return p->cb_status;
}

static int bind(ms_outparse *p, ms_outev_fn fn, void *user, ms_err *err) {
    if (p->failed) return ms_fail(err, MS_ERR_ARG, "output parser: used after an error");
    p->fn = fn;
    p->user = user;
    p->err = err;
    return MS_OK;
}

static int done(ms_outparse *p, ms_err *err) {
    if (!p->cb_status) return MS_OK;
    p->failed = 1;
    if (p->cb_status == MS_ERR_NOMEM) return ms_fail(err, MS_ERR_NOMEM, "output parser: out of memory");
    if (p->over_block)
        return ms_fail(err, MS_ERR_LIMIT, "output parser: a tool call's %s is longer than max_block (%zu bytes)",
                       p->state == ST_QWEN_WHOLE ? "body" : p->state == ST_GLM_KEY ? "argument key"
                       : p->state == ST_GLM_PAIRS || p->state == ST_GLM_VALWAIT ? "text between arguments"
                                                                                 : "argument value",
                       p->max_block);
    return ms_fail(err, p->cb_status, "output parser: the event callback stopped the parse (%d)",
                   p->cb_status);
}

int ms_outparse_feed(ms_outparse *p, const char *text, size_t len, ms_outev_fn fn, void *user,
                     ms_err *err) {
    int st = bind(p, fn, user, err);
    if (st) return st;
    /* a slice at a time: what is held back stays bounded by the longest block
     * (or head) plus one slice, however much text comes in one call */
    for (size_t i = 0; i < len && !p->cb_status;) {
        size_t k = len - i < FEED_SLICE ? len - i : FEED_SLICE;
        if (ms_textbuf_append(&p->pend, text + i, k)) {
            p->failed = 1;
            return ms_fail(err, p->pend.failed, "output parser: out of memory holding back %zu bytes",
                           p->pend.len + k);
        }
        i += k;
        run(p);
    }
    return done(p, err);
}

int ms_outparse_finish(ms_outparse *p, ms_outev_fn fn, void *user, ms_err *err) {
    int st = bind(p, fn, user, err);
    if (st) return st;
    run(p);
    /* flush whatever is still undecided, by state */
    for (int guard = 0; guard < 8 && !p->cb_status && (p->pend.len || p->in_call || p->block_open);
         guard++) {
        switch (p->state) {
        case ST_TEXT:
        case ST_SECTION:
            emit_text(p, p->state == ST_TEXT && p->reasoning ? K_REASONING : K_CONTENT, p->pend.data,
                      p->pend.len, 1);
            consume(p, p->pend.len);
            break;
        case ST_ARGS:
            emit_args(p, p->pend.data, p->pend.len, 1);
            consume(p, p->pend.len);
            end_call(p);
            break;
        case ST_QWEN_ARGS:
            emit_args(p, p->pend.data, qwen_args_cut(p->pend.data, p->pend.len), 1);
            consume(p, p->pend.len);
            end_call(p);
            break;
        case ST_H_BODY:
            if (p->h_kind == K_TOOL) {
                p->state = ST_ARGS;
                continue;
            }
            emit_text(p, p->h_kind, p->pend.data, p->pend.len, 1);
            consume(p, p->pend.len);
            break;
        case ST_GLM_PAIRS:
        case ST_GLM_VALWAIT:
        case ST_GLM_KEY:
        case ST_GLM_VALUE:
            if (p->state == ST_GLM_VALUE) glm_emit_pair(p, p->pend.data, p->pend.len);
            consume(p, p->pend.len);
            emit(p, MS_OUTEV_TOOL_ARGS, "}", 1);
            end_call(p);
            p->state = ST_TEXT;
            break;
        case ST_X_TOP:
        case ST_X_TEXT:
            emit_text(p, p->state == ST_X_TEXT ? p->h_kind : K_CONTENT, p->pend.data, p->pend.len, 1);
            consume(p, p->pend.len);
            if (p->in_call) x_end_call(p);
            break;
        case ST_X_JSON:
        case ST_X_VALUE:
        case ST_X_CLOSE:
            if (p->state == ST_X_JSON) emit_args(p, p->pend.data, p->pend.len, 1);
            if (p->state == ST_X_VALUE) x_pair(p, p->pend.data, p->pend.len);
            consume(p, p->pend.len);
            if (p->in_call) x_end_call(p);
            p->state = ST_X_TOP;
            break;
        case ST_X_OPEN:
            if (p->in_call) { /* an unfinished tag inside a call: end the call */
                consume(p, p->pend.len);
                x_end_call(p);
                p->state = ST_X_TOP;
                break;
            }
            give_back(p, p->pend.len);
            break;
        default: /* a head, name or header that never completed */
            give_back(p, p->pend.len);
            break;
        }
    }
    return done(p, err);
}

int ms_outparse_new(ms_outfmt fmt, const ms_outparse_opts *opts, ms_outparse **out, ms_err *err) {
    *out = NULL;
    if ((unsigned)fmt >= MS_OUTFMT_COUNT) return ms_fail(err, MS_ERR_ARG, "output parser: bad format %d", fmt);
    ms_outparse_opts o = {0};
    if (opts) o = *opts;
    const char *ro = o.reasoning_open ? o.reasoning_open : "<think>";
    const char *rc = o.reasoning_close ? o.reasoning_close : "</think>";
    if (!*ro || !*rc || strlen(ro) > 64 || strlen(rc) > 64)
        return ms_fail(err, MS_ERR_ARG, "output parser: reasoning markers must be 1..64 bytes");
    ms_outparse *p = calloc(1, sizeof *p);
    if (!p) return ms_fail(err, MS_ERR_NOMEM, "output parser: out of memory");
    p->fmt = fmt;
    p->max_block = o.max_block ? o.max_block : BLOCK_MAX_DEFAULT;
    /* a backstop only: find_block fails a longer block first */
    p->pend.limit = p->max_block > SIZE_MAX / 2 ? 0 : p->max_block + HEAD_MAX + 4 * FEED_SLICE;
    p->r_open = strdup(ro);
    p->r_close = strdup(rc);
    p->seed = o.id_seed;
    if (!p->r_open || !p->r_close) {
        ms_outparse_free(p);
        return ms_fail(err, MS_ERR_NOMEM, "output parser: out of memory");
    }
    if (o.tools_json) {
        int st = ms_py_parse(o.tools_json, strlen(o.tools_json), 64, "output parser tools", &p->tools, err);
        if (st) {
            ms_outparse_free(p);
            return st;
        }
    }
    if (fmt == MS_OUTFMT_HARMONY) p->state = ST_H_HEADER;
    else if (fmt == MS_OUTFMT_XTML) {
        p->state = o.start_in_reasoning ? ST_X_TEXT : ST_X_TOP;
        p->h_kind = o.start_in_reasoning ? K_REASONING : K_CONTENT;
        p->skip_ws = !o.start_in_reasoning;
    } else p->reasoning = o.start_in_reasoning != 0;
    *out = p;
    return MS_OK;
}

void ms_outparse_free(ms_outparse *p) {
    if (!p) return;
    ms_textbuf_free(&p->pend);
    ms_textbuf_free(&p->key);
    free(p->r_open);
    free(p->r_close);
    free(p->name);
    ms_py_free(p->tools);
    free(p);
}

int ms_outparse_prompt_opens_reasoning(const char *prompt, size_t len, const ms_outparse_opts *opts) {
    const char *ro = opts && opts->reasoning_open ? opts->reasoning_open : "<think>";
    const char *rc = opts && opts->reasoning_close ? opts->reasoning_close : "</think>";
    size_t n = len;
    while (n && is_ws(prompt[n - 1])) n--;
    size_t ol = strlen(ro);
    if (n < ol || memcmp(prompt + n - ol, ro, ol) != 0) return 0;
    (void)rc; /* an open marker last means no close marker follows it */
    return 1;
}

int ms_outfmt_prompt_opens_reasoning(ms_outfmt fmt, const char *prompt, size_t len, const ms_outparse_opts *opts) {
    if (fmt == MS_OUTFMT_HARMONY) return 0;
    if (fmt != MS_OUTFMT_XTML) return ms_outparse_prompt_opens_reasoning(prompt, len, opts);
    ms_outparse_opts x = {.reasoning_open = X_OPEN "think" X_SEP};
    return ms_outparse_prompt_opens_reasoning(prompt, len, &x);
}

/* ---------------- collecting ---------------- */

typedef struct {
    char *id, *name;
    ms_textbuf args;
} out_call;

struct ms_outmsg {
    ms_textbuf content, reasoning;
    out_call *calls;
    int ncalls, cap;
    int nomem;
};

ms_outmsg *ms_outmsg_new(void) { return calloc(1, sizeof(ms_outmsg)); }

void ms_outmsg_free(ms_outmsg *m) {
    if (!m) return;
    ms_textbuf_free(&m->content);
    ms_textbuf_free(&m->reasoning);
    for (int i = 0; i < m->ncalls; i++) {
        free(m->calls[i].id);
        free(m->calls[i].name);
        ms_textbuf_free(&m->calls[i].args);
    }
    free(m->calls);
    free(m);
}

int ms_outmsg_collect(void *user, const ms_outev *ev) {
    ms_outmsg *m = user;
    switch (ev->type) {
    case MS_OUTEV_CONTENT: ms_textbuf_append(&m->content, ev->text, ev->len); break;
    case MS_OUTEV_REASONING: ms_textbuf_append(&m->reasoning, ev->text, ev->len); break;
    case MS_OUTEV_TOOL_START:
        if (m->ncalls == m->cap) {
            int nc = m->cap ? m->cap * 2 : 4;
            out_call *c = realloc(m->calls, nc * sizeof *c);
            if (!c) return MS_ERR_NOMEM;
            m->calls = c;
            m->cap = nc;
        }
        memset(&m->calls[m->ncalls], 0, sizeof *m->calls);
        m->calls[m->ncalls].id = strdup(ev->tool_id);
        m->calls[m->ncalls].name = strdup(ev->tool_name);
        m->ncalls++;
        if (!m->calls[m->ncalls - 1].id || !m->calls[m->ncalls - 1].name) return MS_ERR_NOMEM;
        break;
    case MS_OUTEV_TOOL_ARGS:
        if (ev->tool_index < 0 || ev->tool_index >= m->ncalls) return MS_ERR_ARG;
        ms_textbuf_append(&m->calls[ev->tool_index].args, ev->text, ev->len);
        break;
    case MS_OUTEV_TOOL_END: break;
    }
    if (m->content.failed || m->reasoning.failed) return MS_ERR_NOMEM;
    for (int i = 0; i < m->ncalls; i++)
        if (m->calls[i].args.failed) return MS_ERR_NOMEM;
    return 0;
}

static cJSON *str_n(const char *s, size_t n) {
    /* cJSON strings are NUL-terminated: text with NUL bytes is cut there */
    char *t = strndup(s ? s : "", s ? n : 0);
    if (!t) return NULL;
    cJSON *j = cJSON_CreateString(t);
    free(t);
    return j;
}

int ms_outmsg_json(const ms_outmsg *m, char **out, ms_err *err) {
    cJSON *o = cJSON_CreateObject();
    int ok = o != NULL;
    ok = ok && cJSON_AddStringToObject(o, "role", "assistant");
    if (ok && m->content.len) ok = cJSON_AddItemToObject(o, "content", str_n(m->content.data, m->content.len));
    else if (ok) ok = cJSON_AddNullToObject(o, "content") != NULL;
    if (ok && m->reasoning.len)
        ok = cJSON_AddItemToObject(o, "reasoning_content", str_n(m->reasoning.data, m->reasoning.len));
    if (ok && m->ncalls) {
        cJSON *arr = cJSON_AddArrayToObject(o, "tool_calls");
        ok = arr != NULL;
        for (int i = 0; ok && i < m->ncalls; i++) {
            cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
            ok = c && f && cJSON_AddStringToObject(c, "id", m->calls[i].id) &&
                 cJSON_AddStringToObject(c, "type", "function") && cJSON_AddItemToObject(c, "function", f) &&
                 cJSON_AddStringToObject(f, "name", m->calls[i].name) &&
                 cJSON_AddItemToObject(f, "arguments", str_n(m->calls[i].args.data, m->calls[i].args.len)) &&
                 cJSON_AddItemToArray(arr, c);
            if (!ok) {
                cJSON_Delete(c);
                if (!c) cJSON_Delete(f);
            }
        }
    }
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return ms_fail(err, MS_ERR_NOMEM, "output message: out of memory");
    *out = s;
    return MS_OK;
}

int ms_outparse_all(ms_outfmt fmt, const ms_outparse_opts *opts, const char *text, size_t len,
                    char **json_out, ms_err *err) {
    ms_outparse *p = NULL;
    int st = ms_outparse_new(fmt, opts, &p, err);
    if (st) return st;
    ms_outmsg *m = ms_outmsg_new();
    if (!m) {
        ms_outparse_free(p);
        return ms_fail(err, MS_ERR_NOMEM, "output parser: out of memory");
    }
    st = ms_outparse_feed(p, text, len, ms_outmsg_collect, m, err);
    if (!st) st = ms_outparse_finish(p, ms_outmsg_collect, m, err);
    if (!st) st = ms_outmsg_json(m, json_out, err);
    ms_outmsg_free(m);
    ms_outparse_free(p);
    return st;
}
