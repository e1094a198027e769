/* jinja_int.h — internals shared by the Jinja interpreter's files.
 *
 * Memory: everything (tokens, AST, values, output) lives in arenas that are
 * freed as a whole; values are never freed individually. Errors inside the
 * lexer/parser/evaluator longjmp to the public entry point (jinja_try), which
 * turns them into an ms_err; that is safe because nothing outside the arena
 * is allocated in between. */
#ifndef MS_JINJA_INT_H
#define MS_JINJA_INT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "text/jinja.h"
#include "util/err.h"

/* ---- arena + error trap ---- */
typedef struct ja_block {
    struct ja_block *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
} ja_block;

typedef struct jtrap {
    jmp_buf jb;
    ms_err *err;
    int code;
    ja_block *blocks;
    size_t total, cap; /* bytes allocated so far / allowed */
} jtrap;

void *ja_alloc(jtrap *t, size_t n);            /* zeroed, 16-aligned; fails via jfail */
void *ja_grow(jtrap *t, void *p, size_t old, size_t n);
char *ja_strndup(jtrap *t, const char *s, size_t n);
void ja_free_all(jtrap *t);
_Noreturn void jfail(jtrap *t, int code, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* ---- values ---- */
typedef enum { JV_UNDEF = 0, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC, JV_NS, JV_LOOP } jv_type;

typedef struct jstr { size_t len; char s[]; } jstr;
typedef struct jlist { int tuple, group; size_t n, cap; struct jv *v; } jlist; /* group: groupby's (grouper, list) */
typedef struct jdict { size_t n, cap; struct jv *k, *v; } jdict;
struct jfunc;
struct jloop;

typedef struct jv {
    int t;
    union {
        int64_t i; /* BOOL (0/1), INT */
        double f;
        jstr *s;
        jlist *l;
        jdict *d; /* DICT and NS */
        struct jfunc *fn;
        struct jloop *lp;
    };
} jv;

extern const jv JV_UNDEFINED;
static inline jv jv_none(void) { jv v = {.t = JV_NONE}; return v; }
static inline jv jv_bool(int b) { jv v = {.t = JV_BOOL, .i = b ? 1 : 0}; return v; }
static inline jv jv_int(int64_t i) { jv v = {.t = JV_INT, .i = i}; return v; }
static inline jv jv_float(double f) { jv v = {.t = JV_FLOAT, .f = f}; return v; }

jv jv_str(jtrap *t, const char *s, size_t n);
jv jv_cstr(jtrap *t, const char *s);
jv jv_list(jtrap *t, size_t cap);
jv jv_tuple(jtrap *t, size_t cap);
void jl_push(jtrap *t, jlist *l, jv x);
jv jv_dict(jtrap *t);
jv jv_ns(jtrap *t);
/* dict lookup with Python equality (1 == 1.0 == True); NULL if absent */
jv *jd_get(jdict *d, jv key);
jv *jd_gets(jdict *d, const char *key);
void jd_set(jtrap *t, jdict *d, jv key, jv val);

int jv_truthy(jv v);
int jv_is_num(jv v); /* BOOL, INT, FLOAT */
double jv_num(jv v);
int jv_eq(jv a, jv b);
/* Python ordering; returns -1/0/1, or fails (TypeError) via jfail with line. */
int jv_cmp(jtrap *t, int line, jv a, jv b);
const char *jv_type_name(jv v);

/* growable byte buffer in the arena */
typedef struct jbuf { jtrap *t; char *p; size_t n, cap, max; } jbuf;
void jb_init(jbuf *b, jtrap *t, size_t max);
void jb_put(jbuf *b, const char *s, size_t n);
void jb_puts(jbuf *b, const char *s);
void jb_putc(jbuf *b, char c);
jv jb_take(jbuf *b); /* the buffer as a string value */

/* str(v) and repr(v) as Python prints them */
void jv_write_str(jbuf *b, jv v);
void jv_write_repr(jbuf *b, jv v);
jv jv_to_str(jtrap *t, jv v);
void py_float_repr(double f, char *out, size_t cap);
/* json.dumps(v, ensure_ascii, indent (NULL = none), separators, sort_keys) */
typedef struct jjson_opts {
    int ensure_ascii, sort_keys;
    const char *indent; /* NULL: no newlines */
    const char *item_sep, *key_sep;
} jjson_opts;
void jv_write_json(jtrap *t, int line, jbuf *b, jv v, const jjson_opts *o, int level);
/* Parse JSON text into a value (fails via jfail with MS_ERR_FORMAT). */
jv jv_parse_json(jtrap *t, const char *s, size_t n);

/* UTF-8 helpers */
size_t u8_count(const char *s, size_t n);               /* code points */
size_t u8_offset(const char *s, size_t n, size_t cp);   /* byte offset of code point cp (clamped) */
int u8_decode(const char *s, size_t n, size_t *i);      /* next code point, advances *i; bad byte -> 0xFFFD */
void u8_encode(jbuf *b, uint32_t cp);
int py_isspace(uint32_t cp);

/* ---- tokens ---- */
enum {
    T_EOF = 0, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT,
    /* operators */
    T_ADD, T_SUB, T_DIV, T_FLOORDIV, T_MUL, T_MOD, T_POW, T_TILDE, T_LBRACKET, T_RBRACKET, T_LPAREN, T_RPAREN,
    T_LBRACE, T_RBRACE, T_EQ, T_NE, T_GT, T_GTEQ, T_LT, T_LTEQ, T_ASSIGN, T_DOT, T_COLON, T_PIPE, T_COMMA,
    T_SEMICOLON,
};

typedef struct jtok {
    int type, line;
    const char *s; /* NAME/DATA/STRING text (NUL-terminated, arena) */
    size_t len;
    int64_t i;
    double f;
} jtok;

/* Tokenize src into an arena array ending with T_EOF. */
void jinja_lex(jtrap *t, const char *src, size_t len, jtok **out, int *ntok);

/* ---- AST ---- */
enum {
    /* expressions */
    N_CONST = 1, N_NAME, N_LIST, N_TUPLE, N_DICT, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_NOT, N_NEG, N_POS, N_BINOP, N_AND, N_OR, N_COMPARE, N_COND, N_NSREF,
    /* statements */
    S_DATA, S_PRINT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_FILTERBLOCK, S_WITH, S_BREAK,
    S_CONTINUE, S_BODY,
};
/* comparison operators in N_COMPARE ops[] (also N_BINOP op uses token types) */
enum { C_EQ = 1, C_NE, C_LT, C_LE, C_GT, C_GE, C_IN, C_NOTIN };

typedef struct jnode {
    int kind, line, op;
    const char *name;          /* NAME, GETATTR attr, FILTER/TEST name, MACRO name, NSREF attr */
    jv val;                    /* CONST */
    struct jnode *a, *b, *c, *d;
    struct jnode **items;      /* list/tuple/dict keys/call positional args/body */
    int nitems;
    struct jnode **items2;     /* dict values/call kw values/else body/macro defaults */
    int nitems2;
    const char **names;        /* call kw names / macro params / with targets */
    int nnames;
    int *ops;                  /* COMPARE operators, one per items[] */
} jnode;
/* Node layouts:
 *  N_CONST val | N_NAME name | N_LIST/N_TUPLE items | N_DICT items=keys items2=values
 *  N_GETATTR a.name | N_GETITEM a[b] | N_SLICE a:b:c (NULL parts)
 *  N_CALL a(items..., names[i]=items2[i]..., *c, **d)
 *  N_FILTER a|name(args as CALL) (a NULL: the filter-block/set-block body)
 *  N_TEST a is [not: op=1] name(args as CALL)
 *  N_NOT/N_NEG/N_POS a | N_BINOP a op b (op: T_ADD..T_TILDE) | N_AND/N_OR a b
 *  N_COMPARE a ops[i] items[i] ... | N_COND b if a else c | N_NSREF name.attr(=name field a->name)
 *  S_DATA val | S_PRINT a | S_IF a items else items2 | S_FOR for a in b if c: items else items2
 *  S_SET a = b | S_SETBLOCK a = (items | filter chain c)
 *  S_MACRO name(names[i]=items2[i] default or NULL) items
 *  S_CALLBLOCK call a with caller(names = items2 defaults) items
 *  S_FILTERBLOCK chain a over items | S_WITH names[i]=items2[i] items | S_BODY items */

typedef struct jinja_tree {
    jnode **body;
    int nbody;
} jinja_tree;

void jinja_parse_tokens(jtrap *t, jtok *toks, int ntok, jinja_tree *out);

/* ---- evaluation ---- */
typedef struct jframe {
    struct jframe *parent;
    jdict vars;
    int captured; /* a macro/caller closes over this frame: do not reuse it */
} jframe;

enum { JF_MACRO = 1, JF_CALLER, JF_BUILTIN, JF_METHOD };
typedef struct jfunc {
    int kind;
    const char *name;  /* builtin or method name */
    jnode *node;       /* S_MACRO or S_CALLBLOCK */
    jframe *frame;     /* defining frame */
    jv self;           /* method receiver */
} jfunc;

typedef struct jloop {
    int64_t index0, length;
    int depth0;         /* recursive loops: nesting level of loop(...) calls */
    jnode *node;        /* the S_FOR (recursive loops call it again) */
    struct jframe *frame;
    jlist *items;
    int has_last;
    jv last; /* loop.changed() memory */
} jloop;

typedef struct jargs {
    jv *pos;
    int npos;
    const char **kwn;
    jv *kwv;
    int nkw;
} jargs;

typedef struct jctx {
    jtrap *t;
    jbuf *out;
    jdict *vars; /* the render's variables */
    int depth, max_depth;
    int64_t iters, max_iters;
    size_t max_output;
} jctx;

/* argument i (positional) or named kw; returns 1 and sets *out when given */
int jarg(jargs *a, int i, const char *kw, jv *out);
/* fail unless the call has at most npos positional args and only the named keywords */
void jargs_check(jctx *c, int line, const char *fn, jargs *a, int npos, const char *const *kws);

int jinja_filter_known(const char *name);
int jinja_test_known(const char *name);
jv jinja_filter(jctx *c, int line, const char *name, jv in, jargs *a);
int jinja_test(jctx *c, int line, const char *name, jv in, jargs *a);
jv jinja_getattr(jctx *c, int line, jv obj, const char *name);
jv jinja_getitem(jctx *c, int line, jv obj, jv key);
jv jinja_call_method(jctx *c, int line, jv self, const char *name, jargs *a);
jv jinja_call_builtin(jctx *c, int line, const char *name, jargs *a);
/* builtin global functions (range, namespace, dict, raise_exception, strftime_now, ...) */
int jinja_builtin_known(const char *name);
/* the items iterating v yields (list/tuple items, dict keys, string chars); fails if not iterable */
jlist *jinja_iter(jctx *c, int line, jv v);
/* Python binary operators (T_ADD .. T_TILDE); fails on TypeError */
jv jinja_binop(jctx *c, int line, int op, jv a, jv b);
/* Python str % args */
jv jinja_percent_format(jctx *c, int line, jv fmt, jv args);

struct ms_jinja_tpl {
    jtrap trap; /* arena holding tokens and AST */
    jinja_tree tree;
};

#endif
