/* jinja_parse.c — recursive-descent parser for Jinja2 token streams; the
 * grammar and precedence follow jinja2/parser.py (3.1). */
#include <stdio.h>
#include <string.h>

#include "text/jinja_int.h"

int jinja_filter_known(const char *name);
int jinja_test_known(const char *name);

#define MAX_NEST 200

typedef struct ps {
    jtrap *t;
    jtok *tk;
    int n, i;
    int depth;
} ps;

static jtok *cur(ps *P) { return &P->tk[P->i]; }
static jtok *look(ps *P) { return &P->tk[P->i + 1 < P->n ? P->i + 1 : P->n - 1]; }
static jtok *next(ps *P) {
    jtok *k = &P->tk[P->i];
    if (P->i < P->n - 1) P->i++;
    return k;
}
static int is_name(jtok *k, const char *w) { return k->type == T_NAME && !strcmp(k->s, w); }

static const char *tok_desc(jtok *k) {
    static const char *ops[] = {"+", "-", "/", "//", "*", "%", "**", "~", "[", "]", "(", ")", "{", "}", "==", "!=",
                                ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";"};
    switch (k->type) {
    case T_EOF: return "end of template";
    case T_DATA: return "template data";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "end of print statement";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "end of statement block";
    case T_NAME: return k->s;
    case T_STRING: return "string";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    default: return k->type >= T_ADD && k->type <= T_SEMICOLON ? ops[k->type - T_ADD] : "?";
    }
}

_Noreturn static void perr(ps *P, const char *fmt, const char *a) {
    jfail(P->t, MS_ERR_FORMAT, cur(P)->line, fmt, a);
}

static jtok *expect(ps *P, int type, const char *what) {
    if (cur(P)->type != type) {
        char m[200];
        snprintf(m, sizeof m, "expected %s, got '%s'", what, tok_desc(cur(P)));
        perr(P, "%s", m);
    }
    return next(P);
}

static jnode *mk(ps *P, int kind, int line) {
    jnode *n = ja_alloc(P->t, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

/* growable node-pointer vector */
typedef struct nvec { jnode **v; int n, cap; } nvec;
static void nv_push(ps *P, nvec *a, jnode *x) {
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 4;
        a->v = ja_grow(P->t, a->v, (size_t)a->cap * sizeof(jnode *), (size_t)nc * sizeof(jnode *));
        a->cap = nc;
    }
    a->v[a->n++] = x;
}
typedef struct svec { const char **v; int n, cap; } svec;
static void sv_push(ps *P, svec *a, const char *x) {
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 4;
        a->v = ja_grow(P->t, a->v, (size_t)a->cap * sizeof(char *), (size_t)nc * sizeof(char *));
        a->cap = nc;
    }
    a->v[a->n++] = x;
}

static void enter(ps *P) {
    if (++P->depth > MAX_NEST) jfail(P->t, MS_ERR_LIMIT, cur(P)->line, "template nested deeper than %d", MAX_NEST);
}
static void leave(ps *P) { P->depth--; }

static jnode *parse_expression(ps *P, int with_condexpr);
static jnode *parse_unary(ps *P, int with_filter);
static jnode *parse_primary(ps *P);
static jnode *parse_postfix(ps *P, jnode *node);
static jnode *parse_filter(ps *P, jnode *node, int start_inline);
static jnode **subparse(ps *P, const char **end, int *nout);

static int is_tuple_end(ps *P, const char **extra) {
    int t = cur(P)->type;
    if (t == T_VAR_END || t == T_BLOCK_END || t == T_RPAREN) return 1;
    for (int i = 0; extra && extra[i]; i++)
        if (is_name(cur(P), extra[i])) return 1;
    return 0;
}

/* simplified: primary only (assignment targets); with_condexpr: full expressions */
static jnode *parse_tuple(ps *P, int simplified, int with_condexpr, const char **extra, int explicit_paren) {
    int line = cur(P)->line;
    nvec args = {0};
    int is_tuple = 0;
    for (;;) {
        if (args.n) expect(P, T_COMMA, "','");
        if (is_tuple_end(P, extra)) break;
        jnode *e = simplified ? parse_primary(P) : parse_expression(P, with_condexpr);
        nv_push(P, &args, e);
        if (cur(P)->type == T_COMMA) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_paren) perr(P, "expected an expression, got '%s'", tok_desc(cur(P)));
    }
    jnode *n = mk(P, N_TUPLE, line);
    n->items = args.v;
    n->nitems = args.n;
    return n;
}

static jnode *parse_list(ps *P) {
    jnode *n = mk(P, N_LIST, expect(P, T_LBRACKET, "'['")->line);
    nvec items = {0};
    while (cur(P)->type != T_RBRACKET) {
        if (items.n) expect(P, T_COMMA, "','");
        if (cur(P)->type == T_RBRACKET) break;
        nv_push(P, &items, parse_expression(P, 1));
    }
    expect(P, T_RBRACKET, "']'");
    n->items = items.v;
    n->nitems = items.n;
    return n;
}

static jnode *parse_dict(ps *P) {
    jnode *n = mk(P, N_DICT, expect(P, T_LBRACE, "'{'")->line);
    nvec keys = {0}, vals = {0};
    while (cur(P)->type != T_RBRACE) {
        if (keys.n) expect(P, T_COMMA, "','");
        if (cur(P)->type == T_RBRACE) break;
        nv_push(P, &keys, parse_expression(P, 1));
        expect(P, T_COLON, "':'");
        nv_push(P, &vals, parse_expression(P, 1));
    }
    expect(P, T_RBRACE, "'}'");
    n->items = keys.v;
    n->nitems = keys.n;
    n->items2 = vals.v;
    n->nitems2 = vals.n;
    return n;
}

static jnode *parse_primary(ps *P) {
    jtok *k = cur(P);
    jnode *n;
    enter(P);
    switch (k->type) {
    case T_NAME:
        next(P);
        n = mk(P, N_CONST, k->line);
        if (!strcmp(k->s, "true") || !strcmp(k->s, "True")) n->val = jv_bool(1);
        else if (!strcmp(k->s, "false") || !strcmp(k->s, "False")) n->val = jv_bool(0);
        else if (!strcmp(k->s, "none") || !strcmp(k->s, "None")) n->val = jv_none();
        else { n->kind = N_NAME; n->name = k->s; }
        break;
    case T_STRING: {
        next(P);
        n = mk(P, N_CONST, k->line);
        if (cur(P)->type != T_STRING) { n->val = jv_str(P->t, k->s, k->len); break; }
        jbuf b;
        jb_init(&b, P->t, 0);
        jb_put(&b, k->s, k->len);
        while (cur(P)->type == T_STRING) { jtok *s = next(P); jb_put(&b, s->s, s->len); }
        n->val = jb_take(&b);
        break;
    }
    case T_INT: next(P); n = mk(P, N_CONST, k->line); n->val = jv_int(k->i); break;
    case T_FLOAT: next(P); n = mk(P, N_CONST, k->line); n->val = jv_float(k->f); break;
    case T_LPAREN:
        next(P);
        n = parse_tuple(P, 0, 1, NULL, 1);
        expect(P, T_RPAREN, "')'");
        break;
    case T_LBRACKET: n = parse_list(P); break;
    case T_LBRACE: n = parse_dict(P); break;
    default: perr(P, "unexpected '%s'", tok_desc(k));
    }
    leave(P);
    return n;
}

static void parse_call_args(ps *P, jnode *n) {
    expect(P, T_LPAREN, "'('");
    nvec args = {0}, kwv = {0};
    svec kwn = {0};
    int require_comma = 0;
    while (cur(P)->type != T_RPAREN) {
        if (require_comma) {
            expect(P, T_COMMA, "','");
            if (cur(P)->type == T_RPAREN) break;
        }
        if (cur(P)->type == T_MUL) {
            if (n->c || n->d) perr(P, "%s", "invalid syntax for function call expression");
            next(P);
            n->c = parse_expression(P, 1);
        } else if (cur(P)->type == T_POW) {
            if (n->d) perr(P, "%s", "invalid syntax for function call expression");
            next(P);
            n->d = parse_expression(P, 1);
        } else if (cur(P)->type == T_NAME && look(P)->type == T_ASSIGN) {
            if (n->d) perr(P, "%s", "invalid syntax for function call expression");
            sv_push(P, &kwn, cur(P)->s);
            next(P);
            next(P);
            nv_push(P, &kwv, parse_expression(P, 1));
        } else {
            if (n->c || n->d || kwn.n) perr(P, "%s", "invalid syntax for function call expression");
            nv_push(P, &args, parse_expression(P, 1));
        }
        require_comma = 1;
    }
    expect(P, T_RPAREN, "')'");
    n->items = args.v;
    n->nitems = args.n;
    n->items2 = kwv.v;
    n->nitems2 = kwv.n;
    n->names = kwn.v;
    n->nnames = kwn.n;
}

static jnode *parse_subscribed(ps *P) {
    int line = cur(P)->line;
    jnode *parts[3] = {0};
    if (cur(P)->type == T_COLON) {
        next(P);
    } else {
        jnode *e = parse_expression(P, 1);
        if (cur(P)->type != T_COLON) return e;
        next(P);
        parts[0] = e;
    }
    if (cur(P)->type == T_COLON) {
        /* no stop */
    } else if (cur(P)->type != T_RBRACKET && cur(P)->type != T_COMMA) parts[1] = parse_expression(P, 1);
    if (cur(P)->type == T_COLON) {
        next(P);
        if (cur(P)->type != T_RBRACKET && cur(P)->type != T_COMMA) parts[2] = parse_expression(P, 1);
    }
    jnode *s = mk(P, N_SLICE, line);
    s->a = parts[0];
    s->b = parts[1];
    s->c = parts[2];
    return s;
}

static jnode *parse_subscript(ps *P, jnode *node) {
    jtok *k = next(P);
    if (k->type == T_DOT) {
        jtok *a = next(P);
        if (a->type == T_NAME) {
            jnode *n = mk(P, N_GETATTR, k->line);
            n->a = node;
            n->name = a->s;
            return n;
        }
        if (a->type != T_INT) { P->i--; perr(P, "%s", "expected name or number"); }
        jnode *n = mk(P, N_GETITEM, k->line), *c = mk(P, N_CONST, a->line);
        c->val = jv_int(a->i);
        n->a = node;
        n->b = c;
        return n;
    }
    /* '[' */
    nvec args = {0};
    while (cur(P)->type != T_RBRACKET) {
        if (args.n) expect(P, T_COMMA, "','");
        nv_push(P, &args, parse_subscribed(P));
    }
    expect(P, T_RBRACKET, "']'");
    jnode *n = mk(P, N_GETITEM, k->line);
    n->a = node;
    if (args.n == 1) n->b = args.v[0];
    else {
        jnode *t = mk(P, N_TUPLE, k->line);
        t->items = args.v;
        t->nitems = args.n;
        n->b = t;
    }
    return n;
}

static jnode *parse_call(ps *P, jnode *node) {
    jnode *n = mk(P, N_CALL, cur(P)->line);
    n->a = node;
    parse_call_args(P, n);
    return n;
}

static jnode *parse_postfix(ps *P, jnode *node) {
    for (;;) {
        int t = cur(P)->type;
        if (t == T_DOT || t == T_LBRACKET) node = parse_subscript(P, node);
        else if (t == T_LPAREN) node = parse_call(P, node);
        else break;
    }
    return node;
}

static const char *dotted_name(ps *P) {
    jtok *k = expect(P, T_NAME, "a name");
    if (cur(P)->type != T_DOT) return k->s;
    jbuf b;
    jb_init(&b, P->t, 0);
    jb_puts(&b, k->s);
    while (cur(P)->type == T_DOT) {
        next(P);
        jb_putc(&b, '.');
        jb_puts(&b, expect(P, T_NAME, "a name")->s);
    }
    return b.p;
}

static jnode *parse_filter(ps *P, jnode *node, int start_inline) {
    while (cur(P)->type == T_PIPE || start_inline) {
        if (!start_inline) next(P);
        int line = cur(P)->line;
        const char *name = dotted_name(P);
        if (!jinja_filter_known(name)) jfail(P->t, MS_ERR_FORMAT, line, "no filter named '%s'", name);
        jnode *n = mk(P, N_FILTER, line);
        n->a = node;
        n->name = name;
        if (cur(P)->type == T_LPAREN) parse_call_args(P, n);
        node = n;
        start_inline = 0;
    }
    return node;
}

static jnode *parse_test(ps *P, jnode *node) {
    int line = next(P)->line; /* 'is' */
    int neg = 0;
    if (is_name(cur(P), "not")) { next(P); neg = 1; }
    const char *name = dotted_name(P);
    if (!jinja_test_known(name)) jfail(P->t, MS_ERR_FORMAT, line, "no test named '%s'", name);
    jnode *n = mk(P, N_TEST, line);
    n->a = node;
    n->name = name;
    int t = cur(P)->type;
    if (t == T_LPAREN) parse_call_args(P, n);
    else if ((t == T_NAME || t == T_STRING || t == T_INT || t == T_FLOAT || t == T_LBRACKET || t == T_LBRACE) &&
             !is_name(cur(P), "else") && !is_name(cur(P), "or") && !is_name(cur(P), "and")) {
        if (is_name(cur(P), "is")) perr(P, "%s", "You cannot chain multiple tests with is");
        jnode *arg = parse_postfix(P, parse_primary(P));
        n->items = ja_alloc(P->t, sizeof(jnode *));
        n->items[0] = arg;
        n->nitems = 1;
    }
    if (neg) {
        jnode *x = mk(P, N_NOT, line);
        x->a = n;
        return x;
    }
    return n;
}

static jnode *parse_filter_expr(ps *P, jnode *node) {
    for (;;) {
        if (cur(P)->type == T_PIPE) node = parse_filter(P, node, 0);
        else if (is_name(cur(P), "is")) node = parse_test(P, node);
        else if (cur(P)->type == T_LPAREN) node = parse_call(P, node);
        else break;
    }
    return node;
}

static jnode *parse_unary(ps *P, int with_filter) {
    jnode *node;
    int t = cur(P)->type;
    enter(P);
    if (t == T_SUB || t == T_ADD) {
        int line = next(P)->line;
        node = mk(P, t == T_SUB ? N_NEG : N_POS, line);
        node->a = parse_unary(P, 0);
    } else node = parse_primary(P);
    node = parse_postfix(P, node);
    if (with_filter) node = parse_filter_expr(P, node);
    leave(P);
    return node;
}

static jnode *binop(ps *P, int op, jnode *a, jnode *b, int line) {
    jnode *n = mk(P, N_BINOP, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(ps *P) {
    jnode *l = parse_unary(P, 1);
    while (cur(P)->type == T_POW) {
        int line = next(P)->line;
        l = binop(P, T_POW, l, parse_unary(P, 1), line);
    }
    return l;
}
static jnode *parse_math2(ps *P) {
    jnode *l = parse_pow(P);
    for (;;) {
        int t = cur(P)->type;
        if (t != T_MUL && t != T_DIV && t != T_FLOORDIV && t != T_MOD) break;
        int line = next(P)->line;
        l = binop(P, t, l, parse_pow(P), line);
    }
    return l;
}
static jnode *parse_concat(ps *P) {
    jnode *l = parse_math2(P);
    while (cur(P)->type == T_TILDE) {
        int line = next(P)->line;
        l = binop(P, T_TILDE, l, parse_math2(P), line);
    }
    return l;
}
static jnode *parse_math1(ps *P) {
    jnode *l = parse_concat(P);
    for (;;) {
        int t = cur(P)->type;
        if (t != T_ADD && t != T_SUB) break;
        int line = next(P)->line;
        l = binop(P, t, l, parse_concat(P), line);
    }
    return l;
}
static jnode *parse_compare(ps *P) {
    int line = cur(P)->line;
    jnode *e = parse_math1(P);
    nvec ops = {0};
    int *codes = NULL, nc = 0, cc = 0;
    for (;;) {
        int t = cur(P)->type, code = 0;
        if (t == T_EQ) code = C_EQ;
        else if (t == T_NE) code = C_NE;
        else if (t == T_LT) code = C_LT;
        else if (t == T_LTEQ) code = C_LE;
        else if (t == T_GT) code = C_GT;
        else if (t == T_GTEQ) code = C_GE;
        else if (is_name(cur(P), "in")) code = C_IN;
        else if (is_name(cur(P), "not") && is_name(look(P), "in")) { next(P); code = C_NOTIN; }
        else break;
        next(P);
        nv_push(P, &ops, parse_math1(P));
        if (nc == cc) {
            int ncap = cc ? cc * 2 : 4;
            codes = ja_grow(P->t, codes, (size_t)cc * sizeof(int), (size_t)ncap * sizeof(int));
            cc = ncap;
        }
        codes[nc++] = code;
    }
    if (!nc) return e;
    jnode *n = mk(P, N_COMPARE, line);
    n->a = e;
    n->items = ops.v;
    n->nitems = ops.n;
    n->ops = codes;
    return n;
}
static jnode *parse_not(ps *P) {
    if (is_name(cur(P), "not")) {
        int line = next(P)->line;
        enter(P);
        jnode *n = mk(P, N_NOT, line);
        n->a = parse_not(P);
        leave(P);
        return n;
    }
    return parse_compare(P);
}
static jnode *parse_and(ps *P) {
    jnode *l = parse_not(P);
    while (is_name(cur(P), "and")) {
        int line = next(P)->line;
        jnode *n = mk(P, N_AND, line);
        n->a = l;
        n->b = parse_not(P);
        l = n;
    }
    return l;
}
static jnode *parse_or(ps *P) {
    jnode *l = parse_and(P);
    while (is_name(cur(P), "or")) {
        int line = next(P)->line;
        jnode *n = mk(P, N_OR, line);
        n->a = l;
        n->b = parse_and(P);
        l = n;
    }
    return l;
}
static jnode *parse_condexpr(ps *P) {
    enter(P);
    jnode *e1 = parse_or(P);
    while (is_name(cur(P), "if")) {
        int line = next(P)->line;
        jnode *n = mk(P, N_COND, line);
        n->b = e1;
        n->a = parse_or(P);
        if (is_name(cur(P), "else")) {
            next(P);
            n->c = parse_condexpr(P);
        }
        e1 = n;
    }
    leave(P);
    return e1;
}
static jnode *parse_expression(ps *P, int with_condexpr) {
    return with_condexpr ? parse_condexpr(P) : parse_or(P);
}

/* ---------------- statements ---------------- */

static void check_target(ps *P, jnode *t) {
    if (t->kind == N_NAME) {
        if (!strcmp(t->name, "loop") && 0) perr(P, "%s", "cannot assign to loop");
        return;
    }
    if (t->kind == N_TUPLE) {
        for (int i = 0; i < t->nitems; i++) check_target(P, t->items[i]);
        return;
    }
    jfail(P->t, MS_ERR_FORMAT, t->line, "cannot assign to this expression");
}

static jnode *parse_assign_target(ps *P, int with_tuple, int name_only, const char **extra, int with_ns) {
    if (with_ns && cur(P)->type == T_NAME && look(P)->type == T_DOT) {
        jtok *k = next(P);
        next(P);
        jtok *a = expect(P, T_NAME, "an attribute name");
        jnode *n = mk(P, N_NSREF, k->line);
        n->name = a->s;
        n->a = mk(P, N_NAME, k->line);
        n->a->name = k->s;
        return n;
    }
    jnode *t;
    if (name_only) {
        jtok *k = expect(P, T_NAME, "a name");
        t = mk(P, N_NAME, k->line);
        t->name = k->s;
    } else if (with_tuple) t = parse_tuple(P, 1, 1, extra, 0);
    else t = parse_primary(P);
    check_target(P, t);
    return t;
}

static jnode **parse_statements(ps *P, const char **end, int drop_needle, int *nout) {
    if (cur(P)->type == T_COLON) next(P);
    expect(P, T_BLOCK_END, "end of statement block");
    jnode **body = subparse(P, end, nout);
    if (cur(P)->type == T_EOF) perr(P, "unexpected end of template, expected '%s'", end[0]);
    if (drop_needle) next(P);
    return body;
}

static void parse_signature(ps *P, jnode *n) {
    svec names = {0};
    nvec defs = {0};
    int have_default = 0;
    expect(P, T_LPAREN, "'('");
    while (cur(P)->type != T_RPAREN) {
        if (names.n) expect(P, T_COMMA, "','");
        jtok *k = expect(P, T_NAME, "a parameter name");
        jnode *d = NULL;
        if (cur(P)->type == T_ASSIGN) {
            next(P);
            d = parse_expression(P, 1);
            have_default = 1;
        } else if (have_default) jfail(P->t, MS_ERR_FORMAT, k->line, "non-default argument follows default argument");
        sv_push(P, &names, k->s);
        nv_push(P, &defs, d);
    }
    expect(P, T_RPAREN, "')'");
    n->names = names.v;
    n->nnames = names.n;
    n->items2 = defs.v;
    n->nitems2 = defs.n;
}

static jnode *parse_statement(ps *P) {
    jtok *k = cur(P);
    if (k->type != T_NAME) perr(P, "tag name expected, got '%s'", tok_desc(k));
    int line = k->line;
    enter(P);
    jnode *n = NULL;
    if (is_name(k, "for")) {
        next(P);
        static const char *in_end[] = {"in", NULL};
        static const char *rec_end[] = {"recursive", NULL};
        static const char *e1[] = {"endfor", "else", NULL};
        static const char *e2[] = {"endfor", NULL};
        n = mk(P, S_FOR, line);
        n->a = parse_assign_target(P, 1, 0, in_end, 0);
        if (!is_name(cur(P), "in")) perr(P, "expected 'in', got '%s'", tok_desc(cur(P)));
        next(P);
        n->b = parse_tuple(P, 0, 0, rec_end, 0);
        if (is_name(cur(P), "if")) { next(P); n->c = parse_expression(P, 1); }
        if (is_name(cur(P), "recursive")) { next(P); n->op = 1; }
        n->items = parse_statements(P, e1, 0, &n->nitems);
        if (is_name(next(P), "else")) n->items2 = parse_statements(P, e2, 1, &n->nitems2);
    } else if (is_name(k, "if")) {
        next(P);
        static const char *e1[] = {"elif", "else", "endif", NULL};
        static const char *e2[] = {"endif", NULL};
        jnode *res = n = mk(P, S_IF, line);
        for (;;) {
            n->a = parse_tuple(P, 0, 0, NULL, 0);
            n->items = parse_statements(P, e1, 0, &n->nitems);
            jtok *t = next(P);
            if (is_name(t, "elif")) {
                jnode *m = mk(P, S_IF, cur(P)->line);
                n->items2 = ja_alloc(P->t, sizeof(jnode *));
                n->items2[0] = m;
                n->nitems2 = 1;
                n = m;
                continue;
            }
            if (is_name(t, "else")) n->items2 = parse_statements(P, e2, 1, &n->nitems2);
            break;
        }
        n = res;
    } else if (is_name(k, "set")) {
        next(P);
        n = mk(P, S_SET, line);
        n->a = parse_assign_target(P, 1, 0, NULL, 1);
        if (cur(P)->type == T_ASSIGN) {
            next(P);
            n->b = parse_tuple(P, 0, 1, NULL, 0);
        } else {
            static const char *e[] = {"endset", NULL};
            n->kind = S_SETBLOCK;
            n->c = parse_filter(P, NULL, 0);
            n->items = parse_statements(P, e, 1, &n->nitems);
        }
    } else if (is_name(k, "macro")) {
        next(P);
        static const char *e[] = {"endmacro", NULL};
        n = mk(P, S_MACRO, line);
        n->name = expect(P, T_NAME, "a macro name")->s;
        parse_signature(P, n);
        n->items = parse_statements(P, e, 1, &n->nitems);
    } else if (is_name(k, "call")) {
        next(P);
        static const char *e[] = {"endcall", NULL};
        n = mk(P, S_CALLBLOCK, line);
        if (cur(P)->type == T_LPAREN) parse_signature(P, n);
        n->a = parse_expression(P, 1);
        if (n->a->kind != N_CALL) jfail(P->t, MS_ERR_FORMAT, line, "expected call");
        n->items = parse_statements(P, e, 1, &n->nitems);
    } else if (is_name(k, "filter")) {
        next(P);
        static const char *e[] = {"endfilter", NULL};
        n = mk(P, S_FILTERBLOCK, line);
        n->a = parse_filter(P, NULL, 1);
        n->items = parse_statements(P, e, 1, &n->nitems);
    } else if (is_name(k, "with")) {
        next(P);
        static const char *e[] = {"endwith", NULL};
        n = mk(P, S_WITH, line);
        svec names = {0};
        nvec vals = {0};
        while (cur(P)->type != T_BLOCK_END) {
            if (names.n) expect(P, T_COMMA, "','");
            jtok *t = expect(P, T_NAME, "a name");
            expect(P, T_ASSIGN, "'='");
            sv_push(P, &names, t->s);
            nv_push(P, &vals, parse_expression(P, 1));
        }
        n->names = names.v;
        n->nnames = names.n;
        n->items2 = vals.v;
        n->nitems2 = vals.n;
        n->items = parse_statements(P, e, 1, &n->nitems);
    } else if (is_name(k, "break") || is_name(k, "continue")) {
        next(P);
        n = mk(P, is_name(k, "break") ? S_BREAK : S_CONTINUE, line);
    } else if (is_name(k, "generation")) {
        next(P);
        static const char *e[] = {"endgeneration", NULL};
        n = mk(P, S_BODY, line);
        n->items = parse_statements(P, e, 1, &n->nitems);
    } else if (is_name(k, "print")) {
        next(P);
        n = mk(P, S_PRINT, line);
        n->a = parse_tuple(P, 0, 1, NULL, 0);
    } else if (is_name(k, "include") || is_name(k, "import") || is_name(k, "from") || is_name(k, "extends") ||
               is_name(k, "block") || is_name(k, "autoescape")) {
        jfail(P->t, MS_ERR_UNSUPPORTED, line, "the '%s' tag is not supported in chat templates", k->s);
    } else {
        jfail(P->t, MS_ERR_FORMAT, line, "encountered unknown tag '%s'", k->s);
    }
    leave(P);
    return n;
}

static jnode **subparse(ps *P, const char **end, int *nout) {
    nvec body = {0};
    for (;;) {
        jtok *k = cur(P);
        if (k->type == T_EOF) break;
        if (k->type == T_DATA) {
            next(P);
            jnode *n = mk(P, S_DATA, k->line);
            n->val = jv_str(P->t, k->s, k->len);
            nv_push(P, &body, n);
        } else if (k->type == T_VAR_BEGIN) {
            next(P);
            jnode *n = mk(P, S_PRINT, k->line);
            n->a = parse_tuple(P, 0, 1, NULL, 0);
            expect(P, T_VAR_END, "end of print statement");
            nv_push(P, &body, n);
        } else if (k->type == T_BLOCK_BEGIN) {
            next(P);
            if (end) {
                for (int i = 0; end[i]; i++)
                    if (is_name(cur(P), end[i])) {
                        *nout = body.n;
                        return body.v;
                    }
            }
            nv_push(P, &body, parse_statement(P));
            expect(P, T_BLOCK_END, "end of statement block");
        } else perr(P, "unexpected '%s'", tok_desc(k));
    }
    if (end) perr(P, "unexpected end of template, expected '%s'", end[0]);
    *nout = body.n;
    return body.v;
}

void jinja_parse_tokens(jtrap *t, jtok *toks, int ntok, jinja_tree *out) {
    ps P = {.t = t, .tk = toks, .n = ntok};
    out->body = subparse(&P, NULL, &out->nbody);
}
