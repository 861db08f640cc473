/* jinja_value.c - the Jinja arena, values and what Python does with them:
 * str() and repr(), json.dumps, truth, equality and ordering. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"
#include "llm/hash.h"

/* ---- arena ------------------------------------------------------------------------ */

#define JX_BLOCK 65536

struct jx_block {
    jx_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *jx_alloc_or_null(llm_jctx *c, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    jx_block *b = c->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > JX_BLOCK / 4 ? n : JX_BLOCK;
        if (c->used + cap + sizeof *b > c->limit && c->used + n + sizeof *b <= c->limit)
            cap = n; /* a small budget: blocks just as big as asked */
        if (c->used + cap + sizeof *b > c->limit) {
            c->over_budget = 1;
            return NULL;
        }
        if (!(b = malloc(sizeof *b + cap)))
            return NULL;
        c->used += cap + sizeof *b;
        b->used = 0;
        b->cap = cap;
        if (cap == n && c->head) { /* a big one goes behind the current block, which keeps its room */
            b->next = c->head->next;
            c->head->next = b;
        } else {
            b->next = c->head;
            c->head = b;
        }
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

_Noreturn void jx_fail(llm_jctx *c, const char *fmt, ...)
{
    if (c->err) {
        va_list ap;
        va_start(ap, fmt);
        char msg[LLM_ERROR_MSG_MAX];
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        llm_errf(c->err, c->err->code == LLM_ERR_NOMEM ? LLM_ERR_NOMEM : LLM_ERR_TEMPLATE, "%s", msg);
    }
    LLM_ASSERT(c->fail); /* only code under a render or compile unwinds */
    longjmp(*c->fail, 1);
}

void *jx_alloc(llm_jctx *c, size_t n)
{
    c->over_budget = 0;
    void *p = jx_alloc_or_null(c, n);
    if (!p) {
        if (!c->over_budget) { /* the system's memory, not the render's budget: no fault of the template */
            if (c->err)
                c->err->code = LLM_ERR_NOMEM;
            jx_fail(c, "out of memory");
        }
        jx_fail(c, "the template used more than its %zu KiB of memory", c->limit >> 10);
    }
    return p;
}

llm_jctx *llm_jctx_new(const llm_jinja_limits *limits)
{
    llm_jctx *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    if (limits)
        c->lim = *limits;
    if (c->lim.max_bytes == 0)
        c->lim.max_bytes = (size_t)64 << 20;
    if (c->lim.max_steps == 0)
        c->lim.max_steps = 20000000;
    c->limit = c->lim.max_bytes;
    return c;
}

void llm_jctx_free(llm_jctx *c)
{
    if (!c)
        return;
    for (jx_block *b = c->head, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    free(c);
}

/* ---- values -------------------------------------------------------------------------- */

llm_jv *jv_new(llm_jctx *c, jv_kind k)
{
    llm_jv *v = jx_alloc(c, sizeof *v);
    v->kind = k;
    return v;
}

llm_jv *jv_undef(llm_jctx *c, const char *what)
{
    llm_jv *v = jv_new(c, JV_UNDEF);
    v->undef_name = what;
    return v;
}

llm_jv *jv_bool(llm_jctx *c, int b)
{
    llm_jv *v = jv_new(c, JV_BOOL);
    v->u.b = !!b;
    return v;
}

llm_jv *jv_int(llm_jctx *c, long long i)
{
    llm_jv *v = jv_new(c, JV_INT);
    v->u.i = i;
    return v;
}

llm_jv *jv_float(llm_jctx *c, double f)
{
    llm_jv *v = jv_new(c, JV_FLOAT);
    v->u.f = f;
    return v;
}

llm_jv *jv_str(llm_jctx *c, const char *s, size_t n, const unsigned char *taint)
{
    llm_jv *v = jv_new(c, JV_STR);
    char *p = jx_alloc(c, n + 1);
    memcpy(p, s, n);
    v->u.str.s = p;
    v->u.str.n = n;
    if (taint && n && memchr(taint, 1, n)) {
        unsigned char *t = jx_alloc(c, n);
        memcpy(t, taint, n);
        v->u.str.taint = t;
    }
    return v;
}

llm_jv *jv_cstr(llm_jctx *c, const char *s)
{
    return jv_str(c, s, strlen(s), NULL);
}

llm_jv *jv_list(llm_jctx *c, size_t cap)
{
    llm_jv *v = jv_new(c, JV_LIST);
    v->u.list.cap = cap ? cap : 4;
    v->u.list.items = jx_alloc(c, v->u.list.cap * sizeof *v->u.list.items);
    return v;
}

void jv_push(llm_jctx *c, llm_jv *l, llm_jv *v)
{
    if (l->u.list.n == l->u.list.cap) {
        size_t cap = l->u.list.cap * 2;
        llm_jv **items = jx_alloc(c, cap * sizeof *items);
        memcpy(items, l->u.list.items, l->u.list.n * sizeof *items);
        l->u.list.items = items;
        l->u.list.cap = cap;
    }
    l->u.list.items[l->u.list.n++] = v;
}

llm_jv *jv_dict(llm_jctx *c)
{
    return jv_new(c, JV_DICT);
}

/* A key's slot hash, keyed per process (llm/hash.h: request JSON picks
 * the keys); equal numbers hash alike, as Python's equality needs. */
static uint64_t jv_hash(const llm_jv *k)
{
    long long i;
    switch (k->kind) {
    case JV_STR: return llm_hash(k->u.str.s, k->u.str.n);
    case JV_INT: i = k->u.i; break;
    case JV_BOOL: i = k->u.b; break;
    case JV_FLOAT:
        if (!(k->u.f == floor(k->u.f) && fabs(k->u.f) < 9.2e18))
            return llm_hash(&k->u.f, sizeof k->u.f);
        i = (long long)k->u.f;
        break;
    default: return (uint64_t)k->kind;
    }
    return llm_hash(&i, sizeof i);
}

static void dict_reindex(llm_jctx *c, llm_jv *d)
{
    size_t cap = 32;
    while (cap < d->u.dict.n * 3) cap *= 2;
    uint32_t *ix = jx_alloc(c, cap * sizeof *ix);
    for (size_t i = 0; i < d->u.dict.n; i++) {
        size_t s = jv_hash(d->u.dict.e[i].key) & (cap - 1);
        while (ix[s]) s = (s + 1) & (cap - 1);
        ix[s] = (uint32_t)i + 1;
    }
    d->u.dict.index = ix;
    d->u.dict.index_cap = cap;
}

static long dict_find(const llm_jv *d, const llm_jv *key)
{
    if (d->u.dict.index) {
        size_t cap = d->u.dict.index_cap, s = jv_hash(key) & (cap - 1);
        for (; d->u.dict.index[s]; s = (s + 1) & (cap - 1))
            if (jv_equal(d->u.dict.e[d->u.dict.index[s] - 1].key, key))
                return d->u.dict.index[s] - 1;
        return -1;
    }
    for (size_t i = 0; i < d->u.dict.n; i++)
        if (jv_equal(d->u.dict.e[i].key, key))
            return (long)i;
    return -1;
}

void jv_dict_set(llm_jctx *c, llm_jv *d, llm_jv *key, llm_jv *v)
{
    long at = dict_find(d, key);
    if (at >= 0) {
        d->u.dict.e[at].val = v;
        return;
    }
    if (d->u.dict.n >= UINT32_MAX - 1)
        jx_fail(c, "a dict of more than 4 billion keys");
    if (d->u.dict.n == d->u.dict.cap) {
        size_t cap = d->u.dict.cap ? d->u.dict.cap * 2 : 4;
        jv_entry *e = jx_alloc(c, cap * sizeof *e);
        if (d->u.dict.n)
            memcpy(e, d->u.dict.e, d->u.dict.n * sizeof *e);
        d->u.dict.e = e;
        d->u.dict.cap = cap;
    }
    d->u.dict.e[d->u.dict.n++] = (jv_entry){key, v};
    if (d->u.dict.n > 8 && (d->u.dict.index == NULL || d->u.dict.n * 2 > d->u.dict.index_cap))
        dict_reindex(c, d);
    else if (d->u.dict.index) {
        size_t cap = d->u.dict.index_cap, s = jv_hash(key) & (cap - 1);
        while (d->u.dict.index[s]) s = (s + 1) & (cap - 1);
        d->u.dict.index[s] = (uint32_t)d->u.dict.n;
    }
}

llm_jv *jv_dict_get(const llm_jv *d, const llm_jv *key)
{
    long at = dict_find(d, key);
    return at >= 0 ? d->u.dict.e[at].val : NULL;
}

llm_jv *jv_dict_gets(const llm_jv *d, const char *key)
{
    llm_jv k = {.kind = JV_STR, .u.str = {key, strlen(key), NULL}};
    return jv_dict_get(d, &k);
}

/* ---- truth, equality, order -------------------------------------------------------------- */

int jv_truthy(const llm_jv *v)
{
    switch (v->kind) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0;
    case JV_STR: return v->u.str.n > 0;
    case JV_LIST: return v->u.list.lazy == 1 || v->u.list.lazy == 3 || v->u.list.n > 0;
    case JV_DICT: return v->u.dict.n > 0;
    default: return 1;
    }
}

static int is_num(const llm_jv *v)
{
    return v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL;
}

static double num_of(const llm_jv *v)
{
    return v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : v->u.b;
}

int jv_equal(const llm_jv *a, const llm_jv *b)
{
    if (is_num(a) && is_num(b)) {
        if (a->kind != JV_FLOAT && b->kind != JV_FLOAT)
            return (a->kind == JV_INT ? a->u.i : a->u.b) == (b->kind == JV_INT ? b->u.i : b->u.b);
        return num_of(a) == num_of(b);
    }
    if (a->kind != b->kind)
        return 0;
    switch (a->kind) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a->u.str.n == b->u.str.n && !memcmp(a->u.str.s, b->u.str.s, a->u.str.n);
    case JV_LIST:
        if (a->u.list.lazy || b->u.list.lazy) /* iterators compare by identity */
            return a == b;
        if (a->u.list.n != b->u.list.n || a->u.list.tuple != b->u.list.tuple)
            return 0;
        for (size_t i = 0; i < a->u.list.n; i++)
            if (!jv_equal(a->u.list.items[i], b->u.list.items[i]))
                return 0;
        return 1;
    case JV_DICT:
        if (a->u.dict.n != b->u.dict.n)
            return 0;
        for (size_t i = 0; i < a->u.dict.n; i++) {
            llm_jv *o = jv_dict_get(b, a->u.dict.e[i].key);
            if (!o || !jv_equal(a->u.dict.e[i].val, o))
                return 0;
        }
        return 1;
    default: return a == b;
    }
}

const char *jv_type_name(const llm_jv *v)
{
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
                                  "Namespace", "function"};
    if (v->kind == JV_LIST && v->u.list.lazy)
        return v->u.list.lazy == 2 ? "dict view" : "generator";
    return v->kind == JV_LIST && v->u.list.tuple ? "tuple" : names[v->kind];
}

int jv_compare(llm_jctx *c, const llm_jv *a, const llm_jv *b)
{
    if (is_num(a) && is_num(b)) {
        if (a->kind == JV_INT && b->kind == JV_INT)
            return (a->u.i > b->u.i) - (a->u.i < b->u.i);
        double x = num_of(a), y = num_of(b);
        return (x > y) - (x < y);
    }
    if (a->kind == JV_STR && b->kind == JV_STR) {
        size_t n = a->u.str.n < b->u.str.n ? a->u.str.n : b->u.str.n;
        int r = memcmp(a->u.str.s, b->u.str.s, n);
        if (r)
            return r < 0 ? -1 : 1;
        return (a->u.str.n > b->u.str.n) - (a->u.str.n < b->u.str.n);
    }
    if (a->kind == JV_LIST && b->kind == JV_LIST && !a->u.list.lazy && !b->u.list.lazy) {
        for (size_t i = 0; i < a->u.list.n && i < b->u.list.n; i++) {
            if (jv_equal(a->u.list.items[i], b->u.list.items[i]))
                continue;
            return jv_compare(c, a->u.list.items[i], b->u.list.items[i]);
        }
        return (a->u.list.n > b->u.list.n) - (a->u.list.n < b->u.list.n);
    }
    jx_fail(c, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a), jv_type_name(b));
}

size_t jv_utf8_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

size_t jv_utf8_offset(const char *s, size_t n, size_t i)
{
    size_t at = 0;
    while (at < n && i > 0) {
        at++;
        while (at < n && ((unsigned char)s[at] & 0xC0) == 0x80) at++;
        i--;
    }
    return at;
}

/* ---- string builder ------------------------------------------------------------------------ */

void jx_sb_init(jx_sb *b, llm_jctx *c)
{
    memset(b, 0, sizeof *b);
    b->c = c;
}

static void sb_room(jx_sb *b, size_t n)
{
    if (b->cap - b->n >= n + 1)
        return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->n < n + 1) {
        if (cap > ((size_t)1 << 40))
            jx_fail(b->c, "a string too long");
        cap *= 2;
    }
    char *p = jx_alloc(b->c, cap);
    if (b->n)
        memcpy(p, b->p, b->n);
    if (b->taint) {
        unsigned char *t = jx_alloc(b->c, cap);
        memcpy(t, b->taint, b->n);
        b->taint = t;
    }
    b->p = p;
    b->cap = cap;
}

void jx_sb_put(jx_sb *b, const char *s, size_t n, const unsigned char *taint)
{
    sb_room(b, n);
    memcpy(b->p + b->n, s, n);
    if (taint && !b->taint) {
        b->taint = jx_alloc(b->c, b->cap); /* zeroed: the bytes so far are clean */
    }
    if (b->taint) {
        if (taint)
            memcpy(b->taint + b->n, taint, n);
        else
            memset(b->taint + b->n, 0, n);
    }
    b->n += n;
    b->p[b->n] = 0;
}

void jx_sb_puts(jx_sb *b, const char *s)
{
    jx_sb_put(b, s, strlen(s), NULL);
}

void jx_sb_printf(jx_sb *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap); /* sized first: a number's digits are never cut */
    va_end(ap);
    if (n <= 0)
        return;
    char *buf = jx_alloc(b->c, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(buf, (size_t)n + 1, fmt, ap);
    va_end(ap);
    jx_sb_put(b, buf, (size_t)n, NULL);
}

void jx_sb_putv(jx_sb *b, const llm_jv *s)
{
    jx_sb_put(b, s->u.str.s, s->u.str.n, s->u.str.taint);
}

llm_jv *jx_sb_value(jx_sb *b)
{
    return jv_str(b->c, b->p ? b->p : "", b->n, b->taint);
}

/* ---- Python's str() and repr() -------------------------------------------------------------- */

/* repr(float): the shortest digits that read back the same, fixed notation
 * for exponents -4..15, else d.ddde+XX. */
static void float_repr(double f, char *out, size_t cap)
{
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int p = 0; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = e[0] == '-';
    const char *q = e + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.')
            digits[nd++] = *q;
    digits[nd] = 0;
    int exp = (int)strtol(q + 1, NULL, 10);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    char *o = out;
    size_t left = cap;
#define PUT(...) do { int k_ = snprintf(o, left, __VA_ARGS__); o += k_; left -= (size_t)k_; } while (0)
    if (neg)
        PUT("-");
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            PUT("0.");
            for (int i = -1; i > exp; i--) PUT("0");
            PUT("%s", digits);
        } else {
            for (int i = 0; i <= exp; i++) PUT("%c", i < nd ? digits[i] : '0');
            PUT(".");
            if (nd > exp + 1)
                PUT("%s", digits + exp + 1);
            else
                PUT("0");
        }
    } else {
        PUT("%c", digits[0]);
        if (nd > 1)
            PUT(".%s", digits + 1);
        PUT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
#undef PUT
}

static void repr_str(jx_sb *b, const llm_jv *v)
{
    const char *s = v->u.str.s;
    size_t n = v->u.str.n;
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    jx_sb_put(b, &q, 1, NULL);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const unsigned char *t = v->u.str.taint ? v->u.str.taint + i : NULL;
        char esc[8];
        if (ch == '\\' || ch == (unsigned char)q)
            snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch == '\n')
            snprintf(esc, sizeof esc, "\\n");
        else if (ch == '\r')
            snprintf(esc, sizeof esc, "\\r");
        else if (ch == '\t')
            snprintf(esc, sizeof esc, "\\t");
        else if (ch < 0x20 || ch == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", ch);
        else if (ch == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 && (unsigned char)s[i + 1] <= 0xA0) {
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned char)s[++i]); /* C1 controls and NBSP are not printable */
        } else {
            jx_sb_put(b, s + i, 1, t);
            continue;
        }
        for (char *e = esc; *e; e++) jx_sb_put(b, e, 1, t);
    }
    jx_sb_put(b, &q, 1, NULL);
}

static void write_container(jx_sb *b, const llm_jv *v, int depth);

static void write_any(jx_sb *b, const llm_jv *v, int repr, int depth)
{
    char num[40];
    switch (v->kind) {
    case JV_UNDEF:
        if (repr) /* inside a container */
            jx_sb_puts(b, "Undefined");
        return;
    case JV_NONE: jx_sb_puts(b, "None"); return;
    case JV_BOOL: jx_sb_puts(b, v->u.b ? "True" : "False"); return;
    case JV_INT: jx_sb_printf(b, "%lld", v->u.i); return;
    case JV_FLOAT:
        float_repr(v->u.f, num, sizeof num);
        jx_sb_puts(b, num);
        return;
    case JV_STR:
        if (repr)
            repr_str(b, v);
        else
            jx_sb_putv(b, v);
        return;
    case JV_FUNC: jx_sb_printf(b, "<function %s>", v->u.func.name ? v->u.func.name : "?"); return;
    default: write_container(b, v, depth); return;
    }
}

static void write_container(jx_sb *b, const llm_jv *v, int depth)
{
    if (depth > JX_MAX_DEPTH)
        jx_fail(b->c, "a value nested more than %d deep", JX_MAX_DEPTH);
    if (v->kind == JV_LIST && v->u.list.lazy == 2) { /* dict_items([...]) */
        llm_jv plain = *v;
        plain.u.list.lazy = 0;
        jx_sb_puts(b, v->undef_name);
        jx_sb_puts(b, "(");
        write_container(b, &plain, depth + 1);
        jx_sb_puts(b, ")");
        return;
    }
    if (v->kind == JV_LIST && v->u.list.lazy) {
        jx_sb_puts(b, "<generator object>");
        return;
    }
    if (v->kind == JV_LIST) {
        jx_sb_puts(b, v->u.list.tuple ? "(" : "[");
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i)
                jx_sb_puts(b, ", ");
            write_any(b, v->u.list.items[i], 1, depth + 1);
        }
        jx_sb_puts(b, v->u.list.tuple ? (v->u.list.n == 1 ? ",)" : ")") : "]");
        return;
    }
    jx_sb_puts(b, v->kind == JV_NS ? "<Namespace {" : "{");
    for (size_t i = 0; i < v->u.dict.n; i++) {
        if (i)
            jx_sb_puts(b, ", ");
        write_any(b, v->u.dict.e[i].key, 1, depth + 1);
        jx_sb_puts(b, ": ");
        write_any(b, v->u.dict.e[i].val, 1, depth + 1);
    }
    jx_sb_puts(b, v->kind == JV_NS ? "}>" : "}");
}

void jv_write_str(jx_sb *b, const llm_jv *v)
{
    write_any(b, v, 0, 0);
}

void jv_write_repr(jx_sb *b, const llm_jv *v)
{
    write_any(b, v, 1, 0);
}

llm_jv *jv_to_str(llm_jctx *c, const llm_jv *v)
{
    if (v->kind == JV_STR)
        return (llm_jv *)v;
    jx_sb b;
    jx_sb_init(&b, c);
    jv_write_str(&b, v);
    return jx_sb_value(&b);
}

/* ---- JSON ---------------------------------------------------------------------------------- */

static void json_str(jx_sb *b, const llm_jv *v)
{
    const unsigned char *all = v->u.str.taint;
    static const unsigned char one = 1;
    const unsigned char *qt = all && v->u.str.n && all[0] ? &one : NULL;
    jx_sb_put(b, "\"", 1, qt);
    for (size_t i = 0; i < v->u.str.n; i++) {
        unsigned char ch = (unsigned char)v->u.str.s[i];
        const unsigned char *t = all ? all + i : NULL;
        char esc[8];
        if (ch == '"' || ch == '\\')
            snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch == '\n')
            snprintf(esc, sizeof esc, "\\n");
        else if (ch == '\r')
            snprintf(esc, sizeof esc, "\\r");
        else if (ch == '\t')
            snprintf(esc, sizeof esc, "\\t");
        else if (ch == '\b')
            snprintf(esc, sizeof esc, "\\b");
        else if (ch == '\f')
            snprintf(esc, sizeof esc, "\\f");
        else if (ch < 0x20)
            snprintf(esc, sizeof esc, "\\u%04x", ch);
        else {
            jx_sb_put(b, (const char *)&v->u.str.s[i], 1, t);
            continue;
        }
        for (char *e = esc; *e; e++) jx_sb_put(b, e, 1, t);
    }
    qt = all && v->u.str.n && all[v->u.str.n - 1] ? &one : NULL;
    jx_sb_put(b, "\"", 1, qt);
}

static void json_newline(jx_sb *b, int indent, int level)
{
    jx_sb_puts(b, "\n");
    for (int i = 0; i < indent * level; i++) jx_sb_puts(b, " ");
}

static void json_key(jx_sb *b, const llm_jv *k)
{
    char num[40];
    switch (k->kind) {
    case JV_STR: json_str(b, k); return;
    case JV_INT: jx_sb_printf(b, "\"%lld\"", k->u.i); return;
    case JV_BOOL: jx_sb_puts(b, k->u.b ? "\"true\"" : "\"false\""); return;
    case JV_NONE: jx_sb_puts(b, "\"null\""); return;
    case JV_FLOAT:
        float_repr(k->u.f, num, sizeof num);
        jx_sb_printf(b, "\"%s\"", num);
        return;
    default: jx_fail(b->c, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

static int key_order(const void *x, const void *y)
{
    const jv_entry *a = x, *b = y;
    size_t n = a->key->u.str.n < b->key->u.str.n ? a->key->u.str.n : b->key->u.str.n;
    int r = memcmp(a->key->u.str.s, b->key->u.str.s, n);
    return r ? r : (a->key->u.str.n > b->key->u.str.n) - (a->key->u.str.n < b->key->u.str.n);
}

static void json_dict(jx_sb *b, const llm_jv *v, int indent, const char *isep, const char *ksep, int sort, int depth)
{
    if (v->u.dict.n == 0) {
        jx_sb_puts(b, "{}");
        return;
    }
    const jv_entry *e = v->u.dict.e;
    if (sort) {
        jv_entry *s = jx_alloc(b->c, v->u.dict.n * sizeof *s);
        memcpy(s, e, v->u.dict.n * sizeof *s);
        for (size_t i = 0; i < v->u.dict.n; i++)
            if (s[i].key->kind != JV_STR)
                jx_fail(b->c, "tojson sort_keys: keys other than strings");
        qsort(s, v->u.dict.n, sizeof *s, key_order);
        e = s;
    }
    jx_sb_puts(b, "{");
    for (size_t i = 0; i < v->u.dict.n; i++) {
        if (i)
            jx_sb_puts(b, isep);
        if (indent >= 0)
            json_newline(b, indent, depth + 1);
        json_key(b, e[i].key);
        jx_sb_puts(b, ksep);
        jv_write_json(b, e[i].val, indent, isep, ksep, sort, depth + 1);
    }
    if (indent >= 0)
        json_newline(b, indent, depth);
    jx_sb_puts(b, "}");
}

void jv_write_json(jx_sb *b, const llm_jv *v, int indent, const char *isep, const char *ksep, int sort, int depth)
{
    char num[40];
    if (depth > JX_MAX_DEPTH)
        jx_fail(b->c, "tojson: a value nested more than %d deep", JX_MAX_DEPTH);
    switch (v->kind) {
    case JV_NONE: jx_sb_puts(b, "null"); return;
    case JV_BOOL: jx_sb_puts(b, v->u.b ? "true" : "false"); return;
    case JV_INT: jx_sb_printf(b, "%lld", v->u.i); return;
    case JV_FLOAT:
        if (isnan(v->u.f) || isinf(v->u.f))
            jx_sb_puts(b, isnan(v->u.f) ? "NaN" : v->u.f < 0 ? "-Infinity" : "Infinity");
        else {
            float_repr(v->u.f, num, sizeof num);
            jx_sb_puts(b, num);
        }
        return;
    case JV_STR: json_str(b, v); return;
    case JV_LIST:
        if (v->u.list.lazy)
            jx_fail(b->c, "Object of type %s is not JSON serializable", jv_type_name(v));
        if (v->u.list.n == 0) {
            jx_sb_puts(b, "[]");
            return;
        }
        jx_sb_puts(b, "[");
        for (size_t i = 0; i < v->u.list.n; i++) {
            if (i)
                jx_sb_puts(b, isep);
            if (indent >= 0)
                json_newline(b, indent, depth + 1);
            jv_write_json(b, v->u.list.items[i], indent, isep, ksep, sort, depth + 1);
        }
        if (indent >= 0)
            json_newline(b, indent, depth);
        jx_sb_puts(b, "]");
        return;
    case JV_DICT: json_dict(b, v, indent, isep, ksep, sort, depth); return;
    default: jx_fail(b->c, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

/* ---- the public constructors: no unwinding past them -------------------------------------------- */

#define JX_GUARD(c, fallback)                                                                                         \
    jmp_buf jb_;                                                                                                      \
    jmp_buf *saved_ = (c)->fail;                                                                                      \
    llm_error *saved_err_ = (c)->err;                                                                                 \
    (c)->fail = &jb_;                                                                                                 \
    (c)->err = NULL;                                                                                                  \
    if (setjmp(jb_)) {                                                                                                \
        (c)->fail = saved_;                                                                                           \
        (c)->err = saved_err_;                                                                                        \
        return fallback;                                                                                              \
    }
#define JX_UNGUARD(c) ((c)->fail = saved_, (c)->err = saved_err_)

llm_jv *llm_jv_none(llm_jctx *c)
{
    JX_GUARD(c, NULL);
    llm_jv *v = jv_new(c, JV_NONE);
    JX_UNGUARD(c);
    return v;
}

llm_jv *llm_jv_bool(llm_jctx *c, int b)
{
    JX_GUARD(c, NULL);
    llm_jv *v = jv_bool(c, b);
    JX_UNGUARD(c);
    return v;
}

llm_jv *llm_jv_int(llm_jctx *c, long long i)
{
    JX_GUARD(c, NULL);
    llm_jv *v = jv_int(c, i);
    JX_UNGUARD(c);
    return v;
}

llm_jv *llm_jv_float(llm_jctx *c, double f)
{
    JX_GUARD(c, NULL);
    llm_jv *v = jv_float(c, f);
    JX_UNGUARD(c);
    return v;
}

llm_jv *llm_jv_str(llm_jctx *c, const char *s, size_t n, int tenant)
{
    if (!s)
        return NULL;
    JX_GUARD(c, NULL);
    llm_jv *v = jv_str(c, s, n, NULL);
    if (tenant && n) {
        unsigned char *t = jx_alloc(c, n);
        memset(t, 1, n);
        v->u.str.taint = t;
    }
    JX_UNGUARD(c);
    return v;
}

llm_jv *llm_jv_list(llm_jctx *c)
{
    JX_GUARD(c, NULL);
    llm_jv *v = jv_list(c, 0);
    JX_UNGUARD(c);
    return v;
}

llm_jv *llm_jv_dict(llm_jctx *c)
{
    JX_GUARD(c, NULL);
    llm_jv *v = jv_dict(c);
    JX_UNGUARD(c);
    return v;
}

llm_status llm_jv_append(llm_jctx *c, llm_jv *list, llm_jv *v)
{
    if (!list || !v || list->kind != JV_LIST)
        return list && v ? LLM_ERR_INVALID_ARG : LLM_ERR_NOMEM;
    JX_GUARD(c, LLM_ERR_NOMEM);
    jv_push(c, list, v);
    JX_UNGUARD(c);
    return LLM_OK;
}

llm_status llm_jv_set(llm_jctx *c, llm_jv *dict, const char *key, size_t key_len, int tenant, llm_jv *v)
{
    if (!dict || !v || !key || dict->kind != JV_DICT)
        return dict && v && key ? LLM_ERR_INVALID_ARG : LLM_ERR_NOMEM;
    llm_jv *k = llm_jv_str(c, key, key_len, tenant);
    if (!k)
        return LLM_ERR_NOMEM;
    JX_GUARD(c, LLM_ERR_NOMEM);
    jv_dict_set(c, dict, k, v);
    JX_UNGUARD(c);
    return LLM_OK;
}
