/* jinja_eval.c — statement execution and expression evaluation, scopes,
 * macros and call blocks, loops; plus the public parse/render entry points. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

enum { FLOW_OK = 0, FLOW_BREAK, FLOW_CONTINUE };

static jv eval(jctx *c, jnode *n, jframe *f);
static int exec_body(jctx *c, jnode **body, int n, jframe *f);

static jframe *new_frame(jctx *c, jframe *parent) {
    jframe *f = ja_alloc(c->t, sizeof *f);
    f->parent = parent;
    return f;
}

static void setvar(jctx *c, jframe *f, const char *name, jv v) { jd_set(c->t, &f->vars, jv_cstr(c->t, name), v); }

static int lookup(jctx *c, jframe *f, const char *name, jv *out) {
    for (; f; f = f->parent) {
        jv *p = jd_gets(&f->vars, name);
        if (p) { *out = *p; return 1; }
    }
    jv *p = jd_gets(c->vars, name);
    if (p) { *out = *p; return 1; }
    if (jinja_builtin_known(name)) {
        jfunc *fn = ja_alloc(c->t, sizeof *fn);
        fn->kind = JF_BUILTIN;
        fn->name = name;
        out->t = JV_FUNC;
        out->fn = fn;
        return 1;
    }
    return 0;
}

/* describe an expression for "'x' is undefined" messages */
static void describe(jbuf *b, jnode *n, int depth) {
    if (depth > 8) { jb_puts(b, "..."); return; }
    if (n->kind == N_NAME) jb_puts(b, n->name);
    else if (n->kind == N_GETATTR) { describe(b, n->a, depth + 1); jb_putc(b, '.'); jb_puts(b, n->name); }
    else if (n->kind == N_GETITEM) { describe(b, n->a, depth + 1); jb_puts(b, "[...]"); }
    else if (n->kind == N_CALL) { describe(b, n->a, depth + 1); jb_puts(b, "()"); }
    else jb_puts(b, "value");
}

_Noreturn static void fail_undefined(jctx *c, jnode *n, const char *what) {
    jbuf b;
    jb_init(&b, c->t, 0);
    describe(&b, n, 0);
    jfail(c->t, MS_ERR_FORMAT, n->line, "'%s' is undefined%s", b.p ? b.p : "", what);
}

static void enter(jctx *c, int line) {
    if (++c->depth > c->max_depth) jfail(c->t, MS_ERR_LIMIT, line, "recursion deeper than %d", c->max_depth);
}

static void count_iter(jctx *c, int line) {
    if (++c->iters > c->max_iters)
        jfail(c->t, MS_ERR_LIMIT, line, "more than %lld loop iterations", (long long)c->max_iters);
}

/* ---------------- calls ---------------- */

static void eval_args(jctx *c, jnode *n, jframe *f, jargs *a, int extra_kw) {
    int np = n->nitems, nk = n->nitems2;
    jlist *star = NULL;
    jdict *dstar = NULL;
    if (n->c) {
        jv s = eval(c, n->c, f);
        star = jinja_iter(c, n->line, s);
        np += (int)star->n;
    }
    if (n->d) {
        jv d = eval(c, n->d, f);
        if (d.t != JV_DICT) jfail(c->t, MS_ERR_FORMAT, n->line, "argument after ** must be a mapping, not %s", jv_type_name(d));
        dstar = d.d;
        nk += (int)dstar->n;
    }
    a->pos = ja_alloc(c->t, (size_t)(np + 1) * sizeof(jv));
    a->kwv = ja_alloc(c->t, (size_t)(nk + extra_kw + 1) * sizeof(jv));
    a->kwn = ja_alloc(c->t, (size_t)(nk + extra_kw + 1) * sizeof(char *));
    a->npos = 0;
    a->nkw = 0;
    for (int i = 0; i < n->nitems; i++) a->pos[a->npos++] = eval(c, n->items[i], f);
    if (star)
        for (size_t i = 0; i < star->n; i++) a->pos[a->npos++] = star->v[i];
    for (int i = 0; i < n->nitems2; i++) {
        a->kwn[a->nkw] = n->names[i];
        a->kwv[a->nkw++] = eval(c, n->items2[i], f);
    }
    if (dstar)
        for (size_t i = 0; i < dstar->n; i++) {
            if (dstar->k[i].t != JV_STR) jfail(c->t, MS_ERR_FORMAT, n->line, "keywords must be strings");
            a->kwn[a->nkw] = dstar->k[i].s->s;
            a->kwv[a->nkw++] = dstar->v[i];
        }
}

static jv call_macro(jctx *c, int line, jfunc *fn, jargs *a, jv caller) {
    jnode *m = fn->node;
    enter(c, line);
    jframe *f = new_frame(c, fn->frame);
    int np = m->nnames;
    jv *vals = ja_alloc(c->t, (size_t)(np + 1) * sizeof(jv));
    char *given = ja_alloc(c->t, (size_t)np + 1);
    jv varargs = jv_tuple(c->t, 4), kwargs = jv_dict(c->t);
    for (int i = 0; i < a->npos; i++) {
        if (i < np) { vals[i] = a->pos[i]; given[i] = 1; }
        else jl_push(c->t, varargs.l, a->pos[i]);
    }
    for (int k = 0; k < a->nkw; k++) {
        int hit = -1;
        for (int i = 0; i < np; i++)
            if (!strcmp(m->names[i], a->kwn[k])) { hit = i; break; }
        if (hit >= 0) {
            if (given[hit]) jfail(c->t, MS_ERR_FORMAT, line, "macro '%s' got multiple values for argument '%s'",
                                  m->name ? m->name : "caller", a->kwn[k]);
            vals[hit] = a->kwv[k];
            given[hit] = 1;
        } else if (!strcmp(a->kwn[k], "caller") && fn->kind == JF_MACRO) {
            caller = a->kwv[k];
        } else jd_set(c->t, kwargs.d, jv_cstr(c->t, a->kwn[k]), a->kwv[k]);
    }
    for (int i = 0; i < np; i++) {
        if (given[i]) setvar(c, f, m->names[i], vals[i]);
        else if (m->items2[i]) setvar(c, f, m->names[i], eval(c, m->items2[i], f));
        else setvar(c, f, m->names[i], JV_UNDEFINED);
    }
    setvar(c, f, "varargs", varargs);
    setvar(c, f, "kwargs", kwargs);
    if (caller.t != JV_UNDEF) setvar(c, f, "caller", caller);
    jbuf *saved = c->out, buf;
    jb_init(&buf, c->t, c->max_output);
    c->out = &buf;
    int flow = exec_body(c, m->items, m->nitems, f);
    (void)flow;
    c->out = saved;
    c->depth--;
    return jb_take(&buf);
}

static jv call_loop(jctx *c, int line, jloop *lp, jargs *a);

static jv call_value(jctx *c, int line, jv fnv, jargs *a, jv caller) {
    if (fnv.t == JV_LOOP) return call_loop(c, line, fnv.lp, a);
    if (fnv.t != JV_FUNC) {
        if (fnv.t == JV_UNDEF) jfail(c->t, MS_ERR_FORMAT, line, "'Undefined' object is not callable");
        jfail(c->t, MS_ERR_FORMAT, line, "'%s' object is not callable", jv_type_name(fnv));
    }
    jfunc *fn = fnv.fn;
    switch (fn->kind) {
    case JF_MACRO: case JF_CALLER: return call_macro(c, line, fn, a, caller);
    case JF_BUILTIN:
        if (caller.t != JV_UNDEF) jfail(c->t, MS_ERR_FORMAT, line, "'%s' does not take a caller", fn->name);
        return jinja_call_builtin(c, line, fn->name, a);
    case JF_METHOD: return jinja_call_method(c, line, fn->self, fn->name, a);
    }
    jfail(c->t, MS_ERR_FORMAT, line, "not callable");
}

static jv eval_call(jctx *c, jnode *n, jframe *f, jv caller) {
    jv fnv;
    if (n->a->kind == N_GETATTR) {
        jv obj = eval(c, n->a->a, f);
        if (obj.t == JV_UNDEF) fail_undefined(c, n->a->a, "");
        fnv = jinja_getattr(c, n->line, obj, n->a->name);
        if (fnv.t == JV_UNDEF) {
            jbuf b;
            jb_init(&b, c->t, 0);
            describe(&b, n->a, 0);
            jfail(c->t, MS_ERR_FORMAT, n->line, "'%s' object has no attribute '%s' (in %s)", jv_type_name(obj),
                  n->a->name, b.p);
        }
    } else {
        fnv = eval(c, n->a, f);
        if (fnv.t == JV_UNDEF) fail_undefined(c, n->a, " and cannot be called");
    }
    jargs a;
    eval_args(c, n, f, &a, 0);
    return call_value(c, n->line, fnv, &a, caller);
}

/* ---------------- expressions ---------------- */

static jv slice(jctx *c, int line, jv obj, jv start, jv stop, jv step) {
    int64_t st = 1;
    if (step.t != JV_NONE && step.t != JV_UNDEF) {
        if (step.t != JV_INT && step.t != JV_BOOL) jfail(c->t, MS_ERR_FORMAT, line, "slice indices must be integers");
        st = step.i;
        if (!st) jfail(c->t, MS_ERR_FORMAT, line, "slice step cannot be zero");
    }
    int64_t len;
    if (obj.t == JV_STR) len = (int64_t)u8_count(obj.s->s, obj.s->len);
    else if (obj.t == JV_LIST) len = (int64_t)obj.l->n;
    else if (obj.t == JV_UNDEF) jfail(c->t, MS_ERR_FORMAT, line, "undefined value cannot be sliced");
    else jfail(c->t, MS_ERR_FORMAT, line, "'%s' object is not subscriptable", jv_type_name(obj));
    int64_t lo, hi;
    jv bounds[2] = {start, stop};
    int64_t r[2];
    for (int k = 0; k < 2; k++) {
        jv b = bounds[k];
        if (b.t == JV_NONE || b.t == JV_UNDEF) {
            r[k] = st > 0 ? (k ? len : 0) : (k ? -1 : len - 1);
            continue;
        }
        if (b.t != JV_INT && b.t != JV_BOOL) jfail(c->t, MS_ERR_FORMAT, line, "slice indices must be integers or None");
        int64_t x = b.i;
        if (x < 0) { x += len; if (x < 0) x = st > 0 ? 0 : -1; }
        else if (x >= len) x = st > 0 ? len : len - 1;
        r[k] = x;
    }
    lo = r[0];
    hi = r[1];
    if (obj.t == JV_STR) {
        const char *s = obj.s->s;
        size_t n = obj.s->len;
        if (st == 1) {
            if (hi <= lo) return jv_str(c->t, "", 0);
            size_t a = u8_offset(s, n, (size_t)lo), b = u8_offset(s, n, (size_t)hi);
            return jv_str(c->t, s + a, b - a);
        }
        /* general step: index code points */
        size_t *offs = ja_alloc(c->t, (size_t)(len + 1) * sizeof(size_t));
        size_t i = 0, k = 0;
        while (i < n) { offs[k++] = i; u8_decode(s, n, &i); }
        offs[k] = n;
        jbuf b;
        jb_init(&b, c->t, 0);
        for (int64_t x = lo; st > 0 ? x < hi : x > hi; x += st) jb_put(&b, s + offs[x], offs[x + 1] - offs[x]);
        return jb_take(&b);
    }
    jv out = obj.l->tuple ? jv_tuple(c->t, 4) : jv_list(c->t, 4);
    for (int64_t x = lo; st > 0 ? x < hi : x > hi; x += st) jl_push(c->t, out.l, obj.l->v[x]);
    return out;
}

static int compare(jctx *c, int line, int op, jv a, jv b) {
    switch (op) {
    case C_EQ: return jv_eq(a, b);
    case C_NE: return !jv_eq(a, b);
    case C_IN: case C_NOTIN: {
        int r = 0;
        if (b.t == JV_STR) {
            if (a.t != JV_STR) jfail(c->t, MS_ERR_FORMAT, line, "'in <string>' requires string as left operand, not %s", jv_type_name(a));
            r = a.s->len == 0 || memmem(b.s->s, b.s->len, a.s->s, a.s->len) != NULL;
        } else if (b.t == JV_DICT || b.t == JV_NS) r = jd_get(b.d, a) != NULL;
        else if (b.t == JV_LIST) {
            for (size_t i = 0; i < b.l->n && !r; i++) r = jv_eq(b.l->v[i], a);
        } else if (b.t == JV_UNDEF) r = 0;
        else jfail(c->t, MS_ERR_FORMAT, line, "argument of type '%s' is not iterable", jv_type_name(b));
        return op == C_IN ? r : !r;
    }
    default: {
        if (a.t == JV_UNDEF || b.t == JV_UNDEF) jfail(c->t, MS_ERR_FORMAT, line, "undefined value in comparison");
        int r = jv_cmp(c->t, line, a, b);
        if (r == 2) return 0;
        return op == C_LT ? r < 0 : op == C_LE ? r <= 0 : op == C_GT ? r > 0 : r >= 0;
    }
    }
}

static jv apply_filter(jctx *c, jnode *n, jframe *f, jv input) {
    jv in = n->a ? (n->a->kind == N_FILTER ? apply_filter(c, n->a, f, input) : eval(c, n->a, f)) : input;
    jargs a;
    eval_args(c, n, f, &a, 0);
    return jinja_filter(c, n->line, n->name, in, &a);
}

static jv eval(jctx *c, jnode *n, jframe *f) {
    jv r;
    switch (n->kind) {
    case N_CONST: return n->val;
    case N_NAME:
        if (lookup(c, f, n->name, &r)) return r;
        return JV_UNDEFINED;
    case N_LIST: case N_TUPLE:
        r = n->kind == N_LIST ? jv_list(c->t, (size_t)n->nitems) : jv_tuple(c->t, (size_t)n->nitems);
        for (int i = 0; i < n->nitems; i++) jl_push(c->t, r.l, eval(c, n->items[i], f));
        return r;
    case N_DICT:
        r = jv_dict(c->t);
        for (int i = 0; i < n->nitems; i++) {
            jv k = eval(c, n->items[i], f);
            if (k.t == JV_LIST && !k.l->tuple) jfail(c->t, MS_ERR_FORMAT, n->line, "unhashable type: 'list'");
            if (k.t == JV_DICT) jfail(c->t, MS_ERR_FORMAT, n->line, "unhashable type: 'dict'");
            jd_set(c->t, r.d, k, eval(c, n->items2[i], f));
        }
        return r;
    case N_GETATTR: {
        enter(c, n->line);
        jv o = eval(c, n->a, f);
        if (o.t == JV_UNDEF) fail_undefined(c, n->a, "");
        c->depth--;
        return jinja_getattr(c, n->line, o, n->name);
    }
    case N_GETITEM: {
        enter(c, n->line);
        jv o = eval(c, n->a, f);
        if (o.t == JV_UNDEF) fail_undefined(c, n->a, "");
        if (n->b->kind == N_SLICE) {
            jnode *s = n->b;
            jv a = s->a ? eval(c, s->a, f) : jv_none(), b = s->b ? eval(c, s->b, f) : jv_none(),
               d = s->c ? eval(c, s->c, f) : jv_none();
            c->depth--;
            return slice(c, n->line, o, a, b, d);
        }
        jv k = eval(c, n->b, f);
        c->depth--;
        return jinja_getitem(c, n->line, o, k);
    }
    case N_CALL: {
        enter(c, n->line);
        r = eval_call(c, n, f, JV_UNDEFINED);
        c->depth--;
        return r;
    }
    case N_FILTER: enter(c, n->line); r = apply_filter(c, n, f, JV_UNDEFINED); c->depth--; return r;
    case N_TEST: {
        enter(c, n->line);
        jv in = eval(c, n->a, f);
        jargs a;
        eval_args(c, n, f, &a, 0);
        c->depth--;
        return jv_bool(jinja_test(c, n->line, n->name, in, &a));
    }
    case N_NOT: return jv_bool(!jv_truthy(eval(c, n->a, f)));
    case N_NEG: case N_POS: {
        jv v = eval(c, n->a, f);
        if (v.t == JV_INT || v.t == JV_BOOL) {
            if (n->kind == N_NEG && v.i == INT64_MIN) jfail(c->t, MS_ERR_LIMIT, n->line, "integer overflow");
            return jv_int(n->kind == N_NEG ? -v.i : v.i);
        }
        if (v.t == JV_FLOAT) return jv_float(n->kind == N_NEG ? -v.f : v.f);
        if (v.t == JV_UNDEF) fail_undefined(c, n->a, "");
        jfail(c->t, MS_ERR_FORMAT, n->line, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+', jv_type_name(v));
    }
    case N_BINOP: {
        enter(c, n->line);
        jv a = eval(c, n->a, f), b = eval(c, n->b, f);
        c->depth--;
        return jinja_binop(c, n->line, n->op, a, b);
    }
    case N_AND: {
        jv a = eval(c, n->a, f);
        return jv_truthy(a) ? eval(c, n->b, f) : a;
    }
    case N_OR: {
        jv a = eval(c, n->a, f);
        return jv_truthy(a) ? a : eval(c, n->b, f);
    }
    case N_COMPARE: {
        enter(c, n->line);
        jv a = eval(c, n->a, f);
        for (int i = 0; i < n->nitems; i++) {
            jv b = eval(c, n->items[i], f);
            if (!compare(c, n->line, n->ops[i], a, b)) { c->depth--; return jv_bool(0); }
            a = b;
        }
        c->depth--;
        return jv_bool(1);
    }
    case N_COND:
        if (jv_truthy(eval(c, n->a, f))) return eval(c, n->b, f);
        return n->c ? eval(c, n->c, f) : JV_UNDEFINED;
    default: jfail(c->t, MS_ERR_FORMAT, n->line, "cannot evaluate this node (%d)", n->kind);
    }
}

/* ---------------- statements ---------------- */

static void assign(jctx *c, jframe *f, jnode *target, jv v) {
    if (target->kind == N_NAME) { setvar(c, f, target->name, v); return; }
    if (target->kind == N_TUPLE) {
        jlist *items = jinja_iter(c, target->line, v);
        if ((int)items->n != target->nitems)
            jfail(c->t, MS_ERR_FORMAT, target->line, "%s values to unpack (expected %d, got %zu)",
                  (int)items->n > target->nitems ? "too many" : "not enough", target->nitems, items->n);
        for (int i = 0; i < target->nitems; i++) assign(c, f, target->items[i], items->v[i]);
        return;
    }
    if (target->kind == N_NSREF) {
        jv ns;
        if (!lookup(c, f, target->a->name, &ns) || ns.t != JV_NS)
            jfail(c->t, MS_ERR_FORMAT, target->line, "cannot assign attribute on non-namespace object");
        jd_set(c->t, ns.d, jv_cstr(c->t, target->name), v);
        return;
    }
    jfail(c->t, MS_ERR_FORMAT, target->line, "cannot assign to this expression");
}

static jv render_to_string(jctx *c, jnode **body, int n, jframe *f) {
    jbuf *saved = c->out, buf;
    jb_init(&buf, c->t, c->max_output);
    c->out = &buf;
    exec_body(c, body, n, f);
    c->out = saved;
    return jb_take(&buf);
}

static int exec_for_items(jctx *c, jnode *n, jframe *f, jv it, int depth0) {
    jlist *items = jinja_iter(c, n->line, it);
    if (n->c) { /* loop filter: evaluated with the target bound, before loop.* exists */
        jlist *kept = jv_list(c->t, items->n).l;
        jframe *tf = new_frame(c, f);
        for (size_t i = 0; i < items->n; i++) {
            count_iter(c, n->line);
            tf->vars.n = 0;
            assign(c, tf, n->a, items->v[i]);
            if (jv_truthy(eval(c, n->c, tf))) jl_push(c->t, kept, items->v[i]);
            if (tf->captured) tf = new_frame(c, f);
        }
        items = kept;
    }
    if (!items->n) return exec_body(c, n->items2, n->nitems2, f);
    jloop *lp = ja_alloc(c->t, sizeof *lp);
    lp->items = items;
    lp->length = (int64_t)items->n;
    lp->depth0 = depth0;
    lp->node = n->op ? n : NULL;
    lp->frame = f;
    jv lv = {.t = JV_LOOP, .lp = lp};
    jframe *lf = new_frame(c, f);
    for (size_t i = 0; i < items->n; i++) {
        count_iter(c, n->line);
        lp->index0 = (int64_t)i;
        if (lf->captured) lf = new_frame(c, f);
        lf->vars.n = 0;
        setvar(c, lf, "loop", lv);
        assign(c, lf, n->a, items->v[i]);
        int flow = exec_body(c, n->items, n->nitems, lf);
        if (flow == FLOW_BREAK) break;
        if (lf->captured) {
            /* a macro closed over this iteration: give the next one a fresh loop object */
            jloop *l2 = ja_alloc(c->t, sizeof *l2);
            *l2 = *lp;
            lp = l2;
            lv.lp = lp;
        }
    }
    return FLOW_OK;
}

static int exec_for(jctx *c, jnode *n, jframe *f) { return exec_for_items(c, n, f, eval(c, n->b, f), 0); }

/* loop(items) inside a recursive for: render the loop body over items one level deeper */
static jv call_loop(jctx *c, int line, jloop *lp, jargs *a) {
    if (!lp->node) jfail(c->t, MS_ERR_FORMAT, line, "Tried to call non recursive loop. Maybe you forgot the 'recursive' modifier.");
    if (a->npos != 1 || a->nkw) jfail(c->t, MS_ERR_FORMAT, line, "loop() takes exactly one argument");
    enter(c, line);
    jbuf *saved = c->out, buf;
    jb_init(&buf, c->t, c->max_output);
    c->out = &buf;
    exec_for_items(c, lp->node, lp->frame, a->pos[0], lp->depth0 + 1);
    c->out = saved;
    c->depth--;
    return jb_take(&buf);
}

static jv make_closure(jctx *c, int kind, jnode *node, jframe *f) {
    jfunc *fn = ja_alloc(c->t, sizeof *fn);
    fn->kind = kind;
    fn->node = node;
    fn->frame = f;
    fn->name = node->name;
    f->captured = 1;
    jv v = {.t = JV_FUNC, .fn = fn};
    return v;
}

static int exec_stmt(jctx *c, jnode *n, jframe *f) {
    switch (n->kind) {
    case S_DATA: jb_put(c->out, n->val.s->s, n->val.s->len); return FLOW_OK;
    case S_PRINT: {
        jv v = eval(c, n->a, f);
        jv_write_str(c->out, v);
        return FLOW_OK;
    }
    case S_IF:
        if (jv_truthy(eval(c, n->a, f))) return exec_body(c, n->items, n->nitems, f);
        return exec_body(c, n->items2, n->nitems2, f);
    case S_FOR: {
        enter(c, n->line);
        int r = exec_for(c, n, f);
        c->depth--;
        return r;
    }
    case S_SET: assign(c, f, n->a, eval(c, n->b, f)); return FLOW_OK;
    case S_SETBLOCK: {
        enter(c, n->line);
        jframe *bf = new_frame(c, f);
        jv s = render_to_string(c, n->items, n->nitems, bf);
        if (n->c) s = apply_filter(c, n->c, f, s);
        c->depth--;
        assign(c, f, n->a, s);
        return FLOW_OK;
    }
    case S_MACRO: setvar(c, f, n->name, make_closure(c, JF_MACRO, n, f)); return FLOW_OK;
    case S_CALLBLOCK: {
        enter(c, n->line);
        jv caller = make_closure(c, JF_CALLER, n, f);
        caller.fn->name = "caller";
        jv r = eval_call(c, n->a, f, caller);
        jv_write_str(c->out, r);
        c->depth--;
        return FLOW_OK;
    }
    case S_FILTERBLOCK: {
        enter(c, n->line);
        jframe *bf = new_frame(c, f);
        jv s = render_to_string(c, n->items, n->nitems, bf);
        jv_write_str(c->out, apply_filter(c, n->a, f, s));
        c->depth--;
        return FLOW_OK;
    }
    case S_WITH: {
        enter(c, n->line);
        jframe *wf = new_frame(c, f);
        for (int i = 0; i < n->nnames; i++) setvar(c, wf, n->names[i], eval(c, n->items2[i], f));
        int r = exec_body(c, n->items, n->nitems, wf);
        c->depth--;
        return r;
    }
    case S_BREAK: return FLOW_BREAK;
    case S_CONTINUE: return FLOW_CONTINUE;
    case S_BODY: return exec_body(c, n->items, n->nitems, f);
    }
    jfail(c->t, MS_ERR_FORMAT, n->line, "cannot execute this node (%d)", n->kind);
}

static int exec_body(jctx *c, jnode **body, int n, jframe *f) {
    for (int i = 0; i < n; i++) {
        int r = exec_stmt(c, body[i], f);
        if (r != FLOW_OK) return r;
    }
    return FLOW_OK;
}

/* ---------------- public entry points ---------------- */

void ms_jinja_default_limits(ms_jinja_limits *lim) {
    lim->max_output = (size_t)64 << 20;
    lim->max_memory = (size_t)1 << 30;
    lim->max_iterations = 10 * 1000 * 1000;
    lim->max_depth = 200;
}

int ms_jinja_parse(const char *src, size_t len, ms_jinja_tpl **out, ms_err *err) {
    *out = NULL;
    if (len > ((size_t)16 << 20)) return ms_fail(err, MS_ERR_LIMIT, "template: %zu bytes is more than 16 MiB", len);
    ms_jinja_tpl *tpl = calloc(1, sizeof *tpl);
    if (!tpl) return ms_fail(err, MS_ERR_NOMEM, "template: out of memory");
    tpl->trap.err = err;
    tpl->trap.cap = (size_t)512 << 20;
    if (setjmp(tpl->trap.jb)) {
        int code = tpl->trap.code;
        ja_free_all(&tpl->trap);
        free(tpl);
        return code;
    }
    jtok *toks;
    int ntok;
    jinja_lex(&tpl->trap, src, len, &toks, &ntok);
    jinja_parse_tokens(&tpl->trap, toks, ntok, &tpl->tree);
    tpl->trap.err = NULL;
    *out = tpl;
    return MS_OK;
}

void ms_jinja_free(ms_jinja_tpl *tpl) {
    if (!tpl) return;
    ja_free_all(&tpl->trap);
    free(tpl);
}

struct ms_jinja_vars {
    jtrap trap;
    ms_jinja_limits lim;
    jdict vars;
};

ms_jinja_vars *ms_jinja_vars_new(const ms_jinja_limits *lim) {
    ms_jinja_vars *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    if (lim) v->lim = *lim;
    else ms_jinja_default_limits(&v->lim);
    v->trap.cap = v->lim.max_memory;
    return v;
}

void ms_jinja_vars_free(ms_jinja_vars *v) {
    if (!v) return;
    ja_free_all(&v->trap);
    free(v);
}

#define TRAP_BEGIN(v, e)                  \
    (v)->trap.err = (e);                  \
    if (setjmp((v)->trap.jb)) {           \
        (v)->trap.err = NULL;             \
        return (v)->trap.code;            \
    }

int ms_jinja_vars_set_json(ms_jinja_vars *v, const char *name, const char *json, size_t len, const char *member,
                           int *found, ms_err *err) {
    if (found) *found = 0;
    TRAP_BEGIN(v, err);
    jv x = jv_parse_json(&v->trap, json, len);
    if (member) {
        if (x.t != JV_DICT) jfail(&v->trap, MS_ERR_FORMAT, 0, "JSON: expected an object at the top level");
        jv *m = jd_gets(x.d, member);
        if (!m || m->t == JV_NONE) { v->trap.err = NULL; return MS_OK; }
        x = *m;
    }
    if (found) *found = 1;
    if (name) jd_set(&v->trap, &v->vars, jv_cstr(&v->trap, name), x);
    else {
        if (x.t != JV_DICT) jfail(&v->trap, MS_ERR_FORMAT, 0, "JSON: expected an object to spread into variables, got %s", jv_type_name(x));
        for (size_t i = 0; i < x.d->n; i++) jd_set(&v->trap, &v->vars, x.d->k[i], x.d->v[i]);
    }
    v->trap.err = NULL;
    return MS_OK;
}

int ms_jinja_vars_set_string(ms_jinja_vars *v, const char *name, const char *s, ms_err *err) {
    TRAP_BEGIN(v, err);
    jd_set(&v->trap, &v->vars, jv_cstr(&v->trap, name), jv_cstr(&v->trap, s));
    v->trap.err = NULL;
    return MS_OK;
}
int ms_jinja_vars_set_bool(ms_jinja_vars *v, const char *name, int b, ms_err *err) {
    TRAP_BEGIN(v, err);
    jd_set(&v->trap, &v->vars, jv_cstr(&v->trap, name), jv_bool(b));
    v->trap.err = NULL;
    return MS_OK;
}
int ms_jinja_vars_set_none(ms_jinja_vars *v, const char *name, ms_err *err) {
    TRAP_BEGIN(v, err);
    jd_set(&v->trap, &v->vars, jv_cstr(&v->trap, name), jv_none());
    v->trap.err = NULL;
    return MS_OK;
}
int ms_jinja_vars_has(const ms_jinja_vars *v, const char *name) { return jd_gets((jdict *)&v->vars, name) != NULL; }

int ms_jinja_render(const ms_jinja_tpl *tpl, ms_jinja_vars *v, char **out, size_t *out_len, ms_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    TRAP_BEGIN(v, err);
    jctx c = {.t = &v->trap, .vars = &v->vars, .max_depth = v->lim.max_depth, .max_iters = v->lim.max_iterations,
              .max_output = v->lim.max_output};
    jbuf buf;
    jb_init(&buf, c.t, c.max_output);
    c.out = &buf;
    jframe *root = new_frame(&c, NULL);
    exec_body(&c, tpl->tree.body, tpl->tree.nbody, root);
    char *r = malloc(buf.n + 1);
    if (!r) jfail(c.t, MS_ERR_NOMEM, 0, "out of memory for %zu bytes of output", buf.n);
    if (buf.n) memcpy(r, buf.p, buf.n);
    r[buf.n] = 0;
    *out = r;
    if (out_len) *out_len = buf.n;
    v->trap.err = NULL;
    return MS_OK;
}
