/* jinja_eval.c - runs a jx_node tree: statements write to the output,
 * expressions give values, as jinja2 does (scopes: a for loop's body gets a
 * fresh scope per iteration, macros see the scope they were defined in,
 * if-blocks share the enclosing one). Also the public compile and render. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"

typedef enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE } flow;

static llm_jv *eval(jx_run *r, jx_scope *s, const jx_node *n);
static flow exec(jx_run *r, jx_scope *s, const jx_node *n);

void jx_step(jx_run *r)
{
    if (++r->steps > r->c->lim.max_steps)
        jx_fail(r->c, "the template ran more than %ld steps", r->c->lim.max_steps);
}

static jx_scope *scope_new(jx_run *r, jx_scope *parent)
{
    jx_scope *s = jx_alloc(r->c, sizeof *s);
    s->parent = parent;
    s->vars = jv_dict(r->c);
    return s;
}

static void scope_set(jx_run *r, jx_scope *s, const char *name, llm_jv *v)
{
    jv_dict_set(r->c, s->vars, jv_cstr(r->c, name), v);
}

static llm_jv *lookup(jx_run *r, jx_scope *s, const char *name)
{
    for (; s; s = s->parent) {
        llm_jv *v = jv_dict_gets(s->vars, name);
        if (v)
            return v;
    }
    jx_builtin g = jx_global_fn(name);
    if (g) {
        llm_jv *f = jv_new(r->c, JV_FUNC);
        f->u.func.fn = g;
        f->u.func.name = name;
        return f;
    }
    return jv_undef(r->c, name);
}

static _Noreturn void undefined_use(jx_run *r, const llm_jv *u)
{
    if (u->undef_name && !strncmp(u->undef_name, "access to ", 10))
        jx_fail(r->c, "%s", u->undef_name);
    jx_fail(r->c, "'%s' is undefined", u->undef_name ? u->undef_name : "value");
}

llm_jv *jx_hashable(jx_run *r, llm_jv *k)
{
    int ok = k->kind != JV_DICT && k->kind != JV_NS && (k->kind != JV_LIST || k->u.list.tuple || k->u.list.lazy);
    for (size_t i = 0; ok && k->kind == JV_LIST && i < k->u.list.n; i++) jx_hashable(r, k->u.list.items[i]);
    if (!ok)
        jx_fail(r->c, "unhashable type: '%s'", jv_type_name(k));
    return k;
}

/* ---- attribute and item access -------------------------------------------------------------- */

llm_jv *jx_getattr(jx_run *r, llm_jv *obj, const char *name)
{
    if (obj->kind == JV_UNDEF)
        undefined_use(r, obj);
    if (obj->kind == JV_NS) {
        llm_jv *v = jv_dict_gets(obj, name);
        return v ? v : jv_undef(r->c, name);
    }
    llm_jv *m = jx_method(r, obj, name);
    if (m)
        return m;
    if (obj->kind == JV_DICT) {
        llm_jv *v = jv_dict_gets(obj, name);
        if (v)
            return v;
    }
    return jv_undef(r->c, name);
}

static llm_jv *index_of(jx_run *r, llm_jv *obj, llm_jv *key)
{
    if (key->kind != JV_INT && key->kind != JV_BOOL)
        return NULL;
    if (obj->kind == JV_LIST && obj->u.list.lazy)
        return NULL;
    long long i = key->kind == JV_INT ? key->u.i : key->u.b;
    if (obj->kind == JV_LIST) {
        long long n = (long long)obj->u.list.n;
        if (i < 0)
            i += n;
        return i >= 0 && i < n ? obj->u.list.items[i] : NULL;
    }
    size_t n = jv_utf8_len(obj->u.str.s, obj->u.str.n);
    if (i < 0)
        i += (long long)n;
    if (i < 0 || (size_t)i >= n)
        return NULL;
    size_t a = jv_utf8_offset(obj->u.str.s, obj->u.str.n, (size_t)i);
    size_t b = jv_utf8_offset(obj->u.str.s, obj->u.str.n, (size_t)i + 1);
    return jv_str(r->c, obj->u.str.s + a, b - a, obj->u.str.taint ? obj->u.str.taint + a : NULL);
}

llm_jv *jx_getitem(jx_run *r, llm_jv *obj, llm_jv *key)
{
    if (obj->kind == JV_UNDEF)
        undefined_use(r, obj);
    llm_jv *v = NULL;
    if (obj->kind == JV_DICT || obj->kind == JV_NS)
        v = jv_dict_get(obj, key);
    else if (obj->kind == JV_LIST || obj->kind == JV_STR)
        v = index_of(r, obj, key);
    if (v)
        return v;
    if (key->kind == JV_STR && obj->kind != JV_NS) {
        char *name = jx_alloc(r->c, key->u.str.n + 1);
        memcpy(name, key->u.str.s, key->u.str.n);
        llm_jv *m = jx_method(r, obj, name);
        if (m)
            return m;
        return jv_undef(r->c, name);
    }
    return jv_undef(r->c, "item");
}

/* Python's slice indices for a sequence of n. */
static void slice_bounds(jx_run *r, llm_jv *a, llm_jv *b, llm_jv *st, long long n, long long *start, long long *stop,
                         long long *step)
{
    *step = st && st->kind != JV_NONE ? (st->kind == JV_INT ? st->u.i : 0) : 1;
    if (*step == 0)
        jx_fail(r->c, "slice step cannot be zero");
    long long lo = *step < 0 ? -1 : 0, hi = *step < 0 ? n - 1 : n;
    long long x[2] = {*step < 0 ? hi : lo, *step < 0 ? lo : hi};
    llm_jv *in[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        if (!in[k] || in[k]->kind == JV_NONE)
            continue;
        long long v = in[k]->u.i;
        if (v < 0)
            v += n;
        x[k] = v < lo ? lo : v > hi ? hi : v;
    }
    *start = x[0];
    *stop = x[1];
}

static llm_jv *slice(jx_run *r, llm_jv *obj, llm_jv *a, llm_jv *b, llm_jv *st)
{
    if (obj->kind == JV_UNDEF)
        undefined_use(r, obj);
    /* jinja2 writes a slice as Python's own subscript: no Undefined fallback */
    if (obj->kind == JV_DICT || obj->kind == JV_NS)
        jx_fail(r->c, "unhashable type: 'slice'");
    if ((obj->kind != JV_LIST && obj->kind != JV_STR) || (obj->kind == JV_LIST && obj->u.list.lazy))
        jx_fail(r->c, "'%s' object is not subscriptable", jv_type_name(obj));
    llm_jv *ix[3] = {a, b, st};
    for (int k = 0; k < 3; k++)
        if (ix[k] && ix[k]->kind != JV_NONE && ix[k]->kind != JV_INT && ix[k]->kind != JV_BOOL)
            jx_fail(r->c, "slice indices must be integers or None");
    int is_str = obj->kind == JV_STR;
    long long n = is_str ? (long long)jv_utf8_len(obj->u.str.s, obj->u.str.n) : (long long)obj->u.list.n;
    long long start, stop, step;
    slice_bounds(r, a, b, st, n, &start, &stop, &step);
    if (is_str && step == 1) {
        if (stop < start)
            stop = start;
        size_t x = jv_utf8_offset(obj->u.str.s, obj->u.str.n, (size_t)start);
        size_t y = jv_utf8_offset(obj->u.str.s, obj->u.str.n, (size_t)stop);
        return jv_str(r->c, obj->u.str.s + x, y - x, obj->u.str.taint ? obj->u.str.taint + x : NULL);
    }
    llm_jv *out = is_str ? NULL : jv_list(r->c, 0);
    jx_sb b2;
    jx_sb_init(&b2, r->c);
    llm_jv idx = {.kind = JV_INT};
    for (long long i = start; step > 0 ? i < stop : i > stop; i += step) {
        jx_step(r);
        idx.u.i = i;
        llm_jv *item = index_of(r, obj, &idx);
        if (is_str)
            jx_sb_putv(&b2, item);
        else
            jv_push(r->c, out, item);
    }
    if (out)
        out->u.list.tuple = obj->u.list.tuple;
    return is_str ? jx_sb_value(&b2) : out;
}

/* ---- calls ----------------------------------------------------------------------------------- */

static flow exec_body_captured(jx_run *r, jx_scope *s, const jx_node *body, llm_jv **out)
{
    jx_sb b, *saved = r->out;
    jx_sb_init(&b, r->c);
    r->out = &b;
    flow f = exec(r, s, body);
    r->out = saved;
    *out = jx_sb_value(&b);
    return f;
}

static llm_jv *call_macro(jx_run *r, llm_jv *fn, const jx_args *a)
{
    const jx_node *m = fn->u.func.macro;
    if (a->n_pos > m->n_kids)
        jx_fail(r->c, "macro '%s' takes at most %d arguments (%d given)", m->name, m->n_kids, a->n_pos);
    if (++r->depth > JX_MACRO_DEPTH)
        jx_fail(r->c, "macro calls nested more than %d deep", JX_MACRO_DEPTH);
    jx_scope *s = scope_new(r, fn->u.func.closure);
    for (int i = 0; i < a->n_kw; i++) {
        int k = 0;
        while (k < m->n_kids && strcmp(m->names[k], a->kw_names[i])) k++;
        if (k == m->n_kids)
            jx_fail(r->c, "macro '%s' takes no keyword argument '%s'", m->name, a->kw_names[i]);
        if (k < a->n_pos)
            jx_fail(r->c, "macro '%s' got multiple values for argument '%s'", m->name, a->kw_names[i]);
    }
    for (int k = 0; k < m->n_kids; k++) {
        llm_jv *v = NULL;
        if (k < a->n_pos)
            v = a->pos[k];
        for (int i = 0; !v && i < a->n_kw; i++)
            if (!strcmp(m->names[k], a->kw_names[i]))
                v = a->kw[i];
        if (!v)
            v = m->kids[k] ? eval(r, s, m->kids[k]) : jv_undef(r->c, m->names[k]);
        scope_set(r, s, m->names[k], v);
    }
    llm_jv *out;
    exec_body_captured(r, s, m->b, &out);
    r->depth--;
    return out;
}

llm_jv *jx_call(jx_run *r, llm_jv *fn, const jx_args *a)
{
    if (fn->kind == JV_UNDEF)
        undefined_use(r, fn);
    if (fn->kind != JV_FUNC)
        jx_fail(r->c, "'%s' object is not callable", jv_type_name(fn));
    if (fn->u.func.macro)
        return call_macro(r, fn, a);
    return fn->u.func.fn(r, fn->u.func.self, a);
}

static void eval_args(jx_run *r, jx_scope *s, const jx_node *n, llm_jv *first, jx_args *a)
{
    int n_kw = 0;
    for (int i = 0; i < n->n_kids; i++) n_kw += n->names[i] != NULL;
    int n_pos = n->n_kids - n_kw + (first ? 1 : 0);
    a->pos = jx_alloc(r->c, (size_t)(n_pos + 1) * sizeof *a->pos);
    a->kw = jx_alloc(r->c, (size_t)(n_kw + 1) * sizeof *a->kw);
    a->kw_names = jx_alloc(r->c, (size_t)(n_kw + 1) * sizeof *a->kw_names);
    a->n_pos = a->n_kw = 0;
    if (first)
        a->pos[a->n_pos++] = first;
    for (int i = 0; i < n->n_kids; i++) {
        llm_jv *v = eval(r, s, n->kids[i]);
        if (n->names[i]) {
            a->kw_names[a->n_kw] = n->names[i];
            a->kw[a->n_kw++] = v;
        } else
            a->pos[a->n_pos++] = v;
    }
}

/* jinja2's generator filters run when their result is first iterated, so
 * an error in one stays unseen by code that only tests or prints the
 * result: run it now, and keep a failure in the value (lazy 3). Running
 * out of memory or steps is never deferred. */
static llm_jv *run_generator(jx_run *r, jx_builtin fn, llm_jv *operand, const jx_args *a)
{
    jmp_buf jb, *saved = r->c->fail;
    jx_sb *out = r->out; /* what an error deep inside may have left pointing elsewhere */
    int depth = r->depth;
    r->c->fail = &jb;
    if (setjmp(jb)) {
        r->c->fail = saved;
        r->out = out;
        r->depth = depth;
        if (r->c->err->code == LLM_ERR_NOMEM || r->steps > r->c->lim.max_steps)
            longjmp(*saved, 1);
        llm_jv *g = jv_list(r->c, 1);
        g->u.list.lazy = 3;
        size_t n = strlen(r->c->err->msg);
        char *msg = jx_alloc(r->c, n + 1);
        memcpy(msg, r->c->err->msg, n);
        g->undef_name = msg;
        r->c->err->code = LLM_OK;
        return g;
    }
    llm_jv *v = fn(r, operand, a);
    r->c->fail = saved;
    return v;
}

static int is_generator_filter(const char *name)
{
    static const char *const gen[] = {"map", "select", "reject", "selectattr", "rejectattr", "unique", "items", NULL};
    for (int i = 0; gen[i]; i++)
        if (!strcmp(gen[i], name))
            return 1;
    return 0;
}

static llm_jv *apply_filter(jx_run *r, jx_scope *s, const jx_node *f, llm_jv *operand)
{
    jx_builtin fn = jx_filter_fn(f->name);
    if (!fn)
        jx_fail(r->c, "line %d: no filter named '%s'", f->line, f->name);
    jx_args a;
    eval_args(r, s, f, NULL, &a);
    if (is_generator_filter(f->name))
        return run_generator(r, fn, operand, &a);
    return fn(r, operand, &a);
}

/* ---- operators ------------------------------------------------------------------------------- */

static int is_int(const llm_jv *v)
{
    return v->kind == JV_INT || v->kind == JV_BOOL;
}

static long long int_of(const llm_jv *v)
{
    return v->kind == JV_INT ? v->u.i : v->u.b;
}

static double num(const llm_jv *v)
{
    return v->kind == JV_FLOAT ? v->u.f : (double)int_of(v);
}

static int is_number(const llm_jv *v)
{
    return is_int(v) || v->kind == JV_FLOAT;
}

static _Noreturn void bad_operands(jx_run *r, const char *op, const llm_jv *a, const llm_jv *b)
{
    if (a->kind == JV_UNDEF)
        undefined_use(r, a);
    if (b->kind == JV_UNDEF)
        undefined_use(r, b);
    jx_fail(r->c, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

static llm_jv *repeat(jx_run *r, llm_jv *seq, long long times)
{
    if (times < 0)
        times = 0;
    size_t unit = seq->kind == JV_STR ? seq->u.str.n : seq->u.list.n;
    if (unit == 0) /* nothing to repeat, however many times */
        times = 0;
    if (unit && (unsigned long long)times > r->c->limit / unit)
        jx_fail(r->c, "a repetition larger than the template's memory");
    if (seq->kind == JV_STR) {
        jx_sb b;
        jx_sb_init(&b, r->c);
        for (long long i = 0; i < times; i++) {
            jx_step(r);
            jx_sb_putv(&b, seq);
        }
        return jx_sb_value(&b);
    }
    llm_jv *l = jv_list(r->c, 0);
    for (long long i = 0; i < times; i++) {
        jx_step(r);
        for (size_t k = 0; k < seq->u.list.n; k++) jv_push(r->c, l, seq->u.list.items[k]);
    }
    l->u.list.tuple = seq->u.list.tuple;
    return l;
}

/* x ** y for y >= 0 by squaring (at most 64 rounds, whatever y is), or an
 * overflow error once a value leaves 64 bits. */
static __int128 int_pow(jx_run *r, __int128 x, __int128 y)
{
    __int128 p = 1;
    while (y > 0) {
        if (y & 1)
            p *= x;
        y >>= 1;
        if (p > INT64_MAX || p < INT64_MIN || (y > 0 && (x > 3037000499 || x < -3037000499)))
            jx_fail(r->c, "integer overflow (beyond 64 bits)");
        if (y > 0)
            x *= x;
    }
    return p;
}

static llm_jv *int_result(jx_run *r, __int128 v)
{
    if (v > INT64_MAX || v < INT64_MIN)
        jx_fail(r->c, "integer overflow (beyond 64 bits)");
    return jv_int(r->c, (long long)v);
}

static llm_jv *arith(jx_run *r, int op, llm_jv *a, llm_jv *b)
{
    static const char *names[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (op == JO_ADD && a->kind == JV_STR && b->kind == JV_STR) {
        int safe = a->u.str.safe || b->u.str.safe; /* Markup + str escapes the str */
        if (safe) {
            a = jx_html_escape(r, a);
            b = jx_html_escape(r, b);
        }
        jx_sb s;
        jx_sb_init(&s, r->c);
        jx_sb_putv(&s, a);
        jx_sb_putv(&s, b);
        llm_jv *out = jx_sb_value(&s);
        out->u.str.safe = safe;
        return out;
    }
    if ((a->kind == JV_LIST && a->u.list.lazy) || (b->kind == JV_LIST && b->u.list.lazy))
        bad_operands(r, names[op], a, b);
    if (op == JO_ADD && a->kind == JV_LIST && b->kind == JV_LIST && a->u.list.tuple != b->u.list.tuple)
        jx_fail(r->c, "can only concatenate %s (not \"%s\") to %s", jv_type_name(a), jv_type_name(b), jv_type_name(a));
    if (op == JO_ADD && a->kind == JV_LIST && b->kind == JV_LIST) {
        llm_jv *l = jv_list(r->c, a->u.list.n + b->u.list.n);
        for (size_t i = 0; i < a->u.list.n; i++) jv_push(r->c, l, a->u.list.items[i]);
        for (size_t i = 0; i < b->u.list.n; i++) jv_push(r->c, l, b->u.list.items[i]);
        l->u.list.tuple = a->u.list.tuple;
        return l;
    }
    if (op == JO_MUL && (a->kind == JV_STR || a->kind == JV_LIST) && is_int(b))
        return repeat(r, a, int_of(b));
    if (op == JO_MUL && (b->kind == JV_STR || b->kind == JV_LIST) && is_int(a))
        return repeat(r, b, int_of(a));
    if (op == JO_MOD && a->kind == JV_STR)
        return jx_percent_format(r, a, b);
    if (!is_number(a) || !is_number(b))
        bad_operands(r, names[op], a, b);
    if (is_int(a) && is_int(b) && op != JO_DIV) {
        __int128 x = int_of(a), y = int_of(b);
        switch (op) {
        case JO_ADD: return int_result(r, x + y);
        case JO_SUB: return int_result(r, x - y);
        case JO_MUL: return int_result(r, x * y);
        case JO_FLOORDIV:
        case JO_MOD: {
            if (y == 0)
                jx_fail(r->c, "integer division or modulo by zero");
            __int128 q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return int_result(r, op == JO_MOD ? m : q);
        }
        case JO_POW:
            if (y >= 0)
                return int_result(r, int_pow(r, x, y));
            break;
        }
    }
    double x = num(a), y = num(b);
    switch (op) {
    case JO_ADD: return jv_float(r->c, x + y);
    case JO_SUB: return jv_float(r->c, x - y);
    case JO_MUL: return jv_float(r->c, x * y);
    case JO_DIV:
        if (y == 0)
            jx_fail(r->c, "division by zero");
        return jv_float(r->c, x / y);
    case JO_FLOORDIV:
        if (y == 0)
            jx_fail(r->c, "float floor division by zero");
        return jv_float(r->c, floor(x / y));
    case JO_MOD: {
        if (y == 0)
            jx_fail(r->c, "float modulo");
        double m = fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0)))
            m += y;
        return jv_float(r->c, m);
    }
    default: return jv_float(r->c, pow(x, y));
    }
}

static int contains(jx_run *r, llm_jv *hay, llm_jv *needle)
{
    switch (hay->kind) {
    case JV_UNDEF: return 0;
    case JV_STR:
        if (needle->kind != JV_STR)
            jx_fail(r->c, "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
        if (needle->u.str.n == 0)
            return 1;
        return memmem(hay->u.str.s, hay->u.str.n, needle->u.str.s, needle->u.str.n) != NULL;
    case JV_LIST:
        hay = jx_iterable(r, hay); /* a failed generator raises here */
        for (size_t i = 0; i < hay->u.list.n; i++)
            if (jv_equal(hay->u.list.items[i], needle))
                return 1;
        return 0;
    case JV_DICT:
    case JV_NS:
        jx_hashable(r, needle);
        return jv_dict_get(hay, needle) != NULL;
    default: jx_fail(r->c, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

static int compare(jx_run *r, int op, llm_jv *a, llm_jv *b)
{
    switch (op) {
    case JO_EQ: return jv_equal(a, b);
    case JO_NE: return !jv_equal(a, b);
    case JO_IN: return contains(r, b, a);
    case JO_NOTIN: return !contains(r, b, a);
    default: break;
    }
    if (a->kind == JV_UNDEF)
        undefined_use(r, a);
    if (b->kind == JV_UNDEF)
        undefined_use(r, b);
    int c = jv_compare(r->c, a, b);
    return op == JO_LT ? c < 0 : op == JO_LE ? c <= 0 : op == JO_GT ? c > 0 : c >= 0;
}

/* ---- expressions -------------------------------------------------------------------------------- */

static llm_jv *eval_call(jx_run *r, jx_scope *s, const jx_node *n)
{
    llm_jv *fn = eval(r, s, n->a);
    jx_args a;
    eval_args(r, s, n, NULL, &a);
    return jx_call(r, fn, &a);
}

static llm_jv *eval_container(jx_run *r, jx_scope *s, const jx_node *n)
{
    if (n->kind == JN_DICT) {
        llm_jv *d = jv_dict(r->c);
        for (int i = 0; i + 1 < n->n_kids; i += 2) {
            llm_jv *k = jx_hashable(r, eval(r, s, n->kids[i]));
            jv_dict_set(r->c, d, k, eval(r, s, n->kids[i + 1]));
        }
        return d;
    }
    llm_jv *l = jv_list(r->c, (size_t)n->n_kids);
    for (int i = 0; i < n->n_kids; i++) jv_push(r->c, l, eval(r, s, n->kids[i]));
    l->u.list.tuple = n->kind == JN_TUPLE;
    return l;
}

static llm_jv *eval_test(jx_run *r, jx_scope *s, const jx_node *n)
{
    jx_builtin fn = jx_test_fn(n->name);
    if (!fn)
        jx_fail(r->c, "line %d: no test named '%s'", n->line, n->name);
    llm_jv *v = eval(r, s, n->a);
    jx_args a;
    eval_args(r, s, n, NULL, &a);
    int t = jv_truthy(fn(r, v, &a));
    return jv_bool(r->c, n->op ? !t : t);
}

static llm_jv *eval_cmp(jx_run *r, jx_scope *s, const jx_node *n)
{
    llm_jv *left = eval(r, s, n->kids[0]);
    for (int i = 1; i < n->n_kids; i++) {
        llm_jv *right = eval(r, s, n->kids[i]);
        if (!compare(r, n->ops[i - 1], left, right))
            return jv_bool(r->c, 0);
        left = right;
    }
    return jv_bool(r->c, 1);
}

static llm_jv *eval_bin(jx_run *r, jx_scope *s, const jx_node *n)
{
    llm_jv *a = eval(r, s, n->a), *b = eval(r, s, n->b);
    if (n->op == JO_CONCAT) {
        jx_sb sb;
        jx_sb_init(&sb, r->c);
        jv_write_str(&sb, a);
        jv_write_str(&sb, b);
        return jx_sb_value(&sb);
    }
    return arith(r, n->op, a, b);
}

static llm_jv *eval_unary(jx_run *r, jx_scope *s, const jx_node *n)
{
    llm_jv *v = eval(r, s, n->a);
    if (n->kind == JN_NOT)
        return jv_bool(r->c, !jv_truthy(v));
    if (v->kind == JV_UNDEF)
        undefined_use(r, v);
    if (!is_number(v))
        jx_fail(r->c, "bad operand type for unary %c: '%s'", n->kind == JN_NEG ? '-' : '+', jv_type_name(v));
    if (n->kind == JN_POS)
        return v;
    if (v->kind == JV_FLOAT)
        return jv_float(r->c, -v->u.f);
    return int_result(r, -(__int128)int_of(v));
}

static llm_jv *eval(jx_run *r, jx_scope *s, const jx_node *n)
{
    jx_step(r);
    switch (n->kind) {
    case JN_LIT: return n->lit;
    case JN_NAME: return lookup(r, s, n->name);
    case JN_ATTR: return jx_getattr(r, eval(r, s, n->a), n->name);
    case JN_ITEM: {
        llm_jv *o = eval(r, s, n->a);
        return jx_getitem(r, o, eval(r, s, n->b));
    }
    case JN_SLICE: {
        llm_jv *o = eval(r, s, n->a);
        llm_jv *a = n->b ? eval(r, s, n->b) : NULL, *b = n->c ? eval(r, s, n->c) : NULL;
        return slice(r, o, a, b, n->d ? eval(r, s, n->d) : NULL);
    }
    case JN_CALL: return eval_call(r, s, n);
    case JN_FILTER: return apply_filter(r, s, n, eval(r, s, n->a));
    case JN_TEST: return eval_test(r, s, n);
    case JN_NEG:
    case JN_POS:
    case JN_NOT: return eval_unary(r, s, n);
    case JN_AND: {
        llm_jv *a = eval(r, s, n->a);
        return jv_truthy(a) ? eval(r, s, n->b) : a;
    }
    case JN_OR: {
        llm_jv *a = eval(r, s, n->a);
        return jv_truthy(a) ? a : eval(r, s, n->b);
    }
    case JN_BIN: return eval_bin(r, s, n);
    case JN_CMP: return eval_cmp(r, s, n);
    case JN_COND:
        if (jv_truthy(eval(r, s, n->b)))
            return eval(r, s, n->a);
        return n->c ? eval(r, s, n->c) : jv_undef(r->c, "conditional without else");
    case JN_LIST:
    case JN_TUPLE:
    case JN_DICT: return eval_container(r, s, n);
    default: jx_fail(r->c, "line %d: a statement where an expression belongs", n->line);
    }
}

/* ---- statements --------------------------------------------------------------------------------- */

static void assign(jx_run *r, jx_scope *s, const jx_node *n, llm_jv *v)
{
    if (n->n_names == 1) {
        scope_set(r, s, n->names[0], v);
        return;
    }
    if (v->kind != JV_LIST)
        v = jx_iterable(r, v);
    if ((int)v->u.list.n != n->n_names)
        jx_fail(r->c, "line %d: cannot unpack %zu values into %d names", n->line, v->u.list.n, n->n_names);
    for (int i = 0; i < n->n_names; i++) scope_set(r, s, n->names[i], v->u.list.items[i]);
}

static flow exec_set(jx_run *r, jx_scope *s, const jx_node *n)
{
    llm_jv *v = eval(r, s, n->c);
    if (!n->name) {
        assign(r, s, n, v);
        return FLOW_NORMAL;
    }
    llm_jv *ns = lookup(r, s, n->names[0]);
    if (ns->kind != JV_NS)
        jx_fail(r->c, "line %d: cannot assign attribute on non-namespace object", n->line);
    jv_dict_set(r->c, ns, jv_cstr(r->c, n->name), v);
    return FLOW_NORMAL;
}

static llm_jv *apply_chain(jx_run *r, jx_scope *s, const jx_node *chain, llm_jv *v)
{
    for (int i = 0; chain && i < chain->n_kids; i++) v = apply_filter(r, s, chain->kids[i], v);
    return v;
}

static llm_jv *cycle_fn(jx_run *r, llm_jv *self, const jx_args *a)
{
    if (a->n_pos == 0)
        jx_fail(r->c, "no items for cycling given");
    llm_jv *i0 = jv_dict_gets(self, "index0");
    return a->pos[i0->u.i % a->n_pos];
}

static llm_jv *loop_object(jx_run *r, llm_jv *items, size_t i)
{
    size_t n = items->u.list.n;
    llm_jv *l = jv_dict(r->c);
    struct { const char *k; llm_jv *v; } f[] = {
        {"index", jv_int(r->c, (long long)i + 1)}, {"index0", jv_int(r->c, (long long)i)},
        {"revindex", jv_int(r->c, (long long)(n - i))}, {"revindex0", jv_int(r->c, (long long)(n - i - 1))},
        {"first", jv_bool(r->c, i == 0)}, {"last", jv_bool(r->c, i + 1 == n)},
        {"length", jv_int(r->c, (long long)n)}, {"depth", jv_int(r->c, 1)}, {"depth0", jv_int(r->c, 0)},
        {"previtem", i > 0 ? items->u.list.items[i - 1] : jv_undef(r->c, "previtem")},
        {"nextitem", i + 1 < n ? items->u.list.items[i + 1] : jv_undef(r->c, "nextitem")},
    };
    for (size_t k = 0; k < sizeof f / sizeof *f; k++) jv_dict_set(r->c, l, jv_cstr(r->c, f[k].k), f[k].v);
    llm_jv *cyc = jv_new(r->c, JV_FUNC);
    cyc->u.func.fn = cycle_fn;
    cyc->u.func.self = l;
    cyc->u.func.name = "cycle";
    jv_dict_set(r->c, l, jv_cstr(r->c, "cycle"), cyc);
    return l;
}

static flow exec_for(jx_run *r, jx_scope *s, const jx_node *n)
{
    llm_jv *all = jx_iterable(r, eval(r, s, n->a)), *items = all;
    if (n->b) { /* the filter clause runs before loop.length is known */
        items = jv_list(r->c, 0);
        for (size_t i = 0; i < all->u.list.n; i++) {
            jx_scope *t = scope_new(r, s);
            assign(r, t, n, all->u.list.items[i]);
            if (jv_truthy(eval(r, t, n->b)))
                jv_push(r->c, items, all->u.list.items[i]);
        }
    }
    for (size_t i = 0; i < items->u.list.n; i++) {
        jx_step(r);
        jx_scope *it = scope_new(r, s);
        assign(r, it, n, items->u.list.items[i]);
        scope_set(r, it, "loop", loop_object(r, items, i));
        if (exec(r, it, n->c) == FLOW_BREAK)
            break;
    }
    if (items->u.list.n == 0 && n->d)
        return exec(r, s, n->d);
    return FLOW_NORMAL;
}

static flow exec(jx_run *r, jx_scope *s, const jx_node *n)
{
    jx_step(r);
    switch (n->kind) {
    case JN_BODY:
        for (int i = 0; i < n->n_kids; i++) {
            flow f = exec(r, s, n->kids[i]);
            if (f != FLOW_NORMAL)
                return f;
        }
        return FLOW_NORMAL;
    case JN_TEXT: jx_sb_putv(r->out, n->lit); return FLOW_NORMAL;
    case JN_OUTPUT: jv_write_str(r->out, eval(r, s, n->a)); return FLOW_NORMAL;
    case JN_IF:
        if (jv_truthy(eval(r, s, n->a)))
            return exec(r, s, n->b);
        return n->c ? exec(r, s, n->c) : FLOW_NORMAL;
    case JN_FOR: return exec_for(r, s, n);
    case JN_SET: return exec_set(r, s, n);
    case JN_SETBLOCK: {
        llm_jv *v;
        exec_body_captured(r, s, n->b, &v);
        scope_set(r, s, n->names[0], apply_chain(r, s, n->a, v));
        return FLOW_NORMAL;
    }
    case JN_MACRO: {
        llm_jv *f = jv_new(r->c, JV_FUNC);
        f->u.func.macro = n;
        f->u.func.closure = s;
        f->u.func.name = n->name;
        scope_set(r, s, n->name, f);
        return FLOW_NORMAL;
    }
    case JN_FILTERBLOCK: {
        llm_jv *v;
        exec_body_captured(r, s, n->b, &v);
        jv_write_str(r->out, apply_chain(r, s, n->a, v));
        return FLOW_NORMAL;
    }
    case JN_SCOPE: return exec(r, scope_new(r, s), n->b);
    case JN_BREAK: return FLOW_BREAK;
    case JN_CONTINUE: return FLOW_CONTINUE;
    default: jx_fail(r->c, "line %d: an expression where a statement belongs", n->line);
    }
}

/* ---- public ----------------------------------------------------------------------------------------- */

llm_status llm_jinja_compile(const char *src, size_t len, llm_jinja **out, llm_error *err)
{
    *out = NULL;
    if (!src)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "no template text");
    if (len > LLM_JINJA_MAX_SRC)
        return llm_errf(err, LLM_ERR_TOO_LONG, "a template of %zu bytes (at most %zu)", len, LLM_JINJA_MAX_SRC);
    llm_jinja_limits lim = {.max_bytes = 64u << 20};
    llm_jinja *t = calloc(1, sizeof *t);
    llm_jctx *c = llm_jctx_new(&lim);
    llm_error local = {0};
    if (!t || !c) {
        free(t);
        llm_jctx_free(c);
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for a template");
    }
    jmp_buf jb;
    c->fail = &jb;
    c->err = err ? err : &local;
    c->err->code = LLM_OK;
    if (setjmp(jb)) {
        llm_status st = c->err->code ? c->err->code : LLM_ERR_TEMPLATE;
        llm_jctx_free(c);
        free(t);
        return st;
    }
    t->root = jx_parse(c, src, len);
    c->fail = NULL;
    c->err = NULL;
    t->arena = c;
    *out = t;
    return LLM_OK;
}

void llm_jinja_free(llm_jinja *t)
{
    if (!t)
        return;
    llm_jctx_free(t->arena);
    free(t);
}

/* The output's tenant bytes as spans. */
static int spans_of(const jx_sb *b, llm_span **spans, int *n_spans)
{
    *spans = NULL;
    *n_spans = 0;
    if (!b->taint)
        return 0;
    size_t k = 0, cap = 0;
    for (size_t i = 0; i < b->n;) {
        if (!b->taint[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < b->n && b->taint[j]) j++;
        if (k == cap) {
            cap = cap ? cap * 2 : 16;
            llm_span *ns = realloc(*spans, cap * sizeof *ns); /* lint: realloc checked */
            if (!ns) {
                free(*spans);
                *spans = NULL;
                return -1;
            }
            *spans = ns;
        }
        (*spans)[k++] = (llm_span){i, j};
        i = j;
    }
    *n_spans = (int)k;
    return 0;
}

char *llm_jinja_render(const llm_jinja *t, llm_jctx *c, llm_jv *vars, size_t *len, llm_span **spans, int *n_spans,
                       llm_error *err)
{
    if (spans)
        *spans = NULL;
    if (n_spans)
        *n_spans = 0;
    if (!t || !c || !vars || vars->kind != JV_DICT) {
        llm_errf(err, vars ? LLM_ERR_INVALID_ARG : LLM_ERR_NOMEM, "render: no template, context or variables dict");
        return NULL;
    }
    llm_error local = {0};
    jmp_buf jb;
    c->fail = &jb;
    c->err = err ? err : &local;
    c->err->code = LLM_OK;
    if (setjmp(jb)) {
        c->fail = NULL;
        c->err = NULL;
        return NULL;
    }
    jx_run r = {.c = c};
    jx_scope *ctx = jx_alloc(c, sizeof *ctx);
    ctx->vars = vars;
    r.root = scope_new(&r, ctx);
    jx_sb out;
    jx_sb_init(&out, c);
    r.out = &out;
    exec(&r, r.root, t->root);
    c->fail = NULL;
    c->err = NULL;
    char *text = malloc(out.n + 1);
    if (!text || (spans && spans_of(&out, spans, n_spans))) {
        free(text);
        llm_errf(err, LLM_ERR_NOMEM, "no memory for the rendered template");
        return NULL;
    }
    if (out.n)
        memcpy(text, out.p, out.n);
    text[out.n] = 0;
    if (len)
        *len = out.n;
    return text;
}
