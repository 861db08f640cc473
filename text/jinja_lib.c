/* jinja_lib.c - the library a chat template calls: jinja2's filters and
 * tests, the str/dict/list methods Python gives the sandbox, and the
 * globals (range, namespace, raise_exception, strftime_now). Strings keep
 * their tenant marks through every operation that moves bytes. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <locale.h>
#include <pthread.h>
#include <time.h>
#include <wctype.h>

#include "jinja_impl.h"
#include "llm/utf8.h"

#define JX_MAX_RANGE 100000 /* jinja2's sandbox refuses longer ranges */

/* ---- arguments -------------------------------------------------------------------------------- */

/* Positional argument i or the keyword one called name; NULL when absent. */
static llm_jv *arg(const jx_args *a, int i, const char *name)
{
    if (i >= 0 && i < a->n_pos)
        return a->pos[i];
    for (int k = 0; name && k < a->n_kw; k++)
        if (!strcmp(a->kw_names[k], name))
            return a->kw[k];
    return NULL;
}

static int arg_bool(const jx_args *a, int i, const char *name, int dflt)
{
    llm_jv *v = arg(a, i, name);
    return v ? jv_truthy(v) : dflt;
}

static llm_jv *want_str(jx_run *r, llm_jv *v, const char *what)
{
    if (!v || v->kind != JV_STR)
        jx_fail(r->c, "%s: expected a string, got %s", what, v ? jv_type_name(v) : "nothing");
    return v;
}

static llm_jv *sub(jx_run *r, const llm_jv *s, size_t a, size_t b)
{
    return jv_str(r->c, s->u.str.s + a, b - a, s->u.str.taint ? s->u.str.taint + a : NULL);
}

/* ---- Unicode whitespace and code points --------------------------------------------------------- */

static unsigned long cp_at(const char *s, size_t n, size_t i, size_t *len)
{
    unsigned char c0 = (unsigned char)s[i];
    int k = c0 < 0x80 ? 1 : c0 < 0xE0 ? 2 : c0 < 0xF0 ? 3 : 4;
    if (i + (size_t)k > n)
        k = 1;
    unsigned long cp = k == 1 ? c0 : c0 & (0x7F >> k);
    for (int j = 1; j < k; j++) cp = (cp << 6) | ((unsigned char)s[i + (size_t)j] & 0x3F);
    *len = (size_t)k;
    return cp;
}

static int py_space(unsigned long cp)
{
    return (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* Does the code point at i belong to the strip set (NULL: whitespace)? */
static int in_set(const llm_jv *set, unsigned long cp)
{
    if (!set)
        return py_space(cp);
    for (size_t j = 0, l; j < set->u.str.n; j += l)
        if (cp_at(set->u.str.s, set->u.str.n, j, &l) == cp)
            return 1;
    return 0;
}

static llm_jv *strip(jx_run *r, llm_jv *s, llm_jv *chars, int left, int right)
{
    if (chars && chars->kind == JV_NONE)
        chars = NULL;
    if (chars)
        want_str(r, chars, "strip characters");
    size_t a = 0, b = s->u.str.n, l;
    while (left && a < b && in_set(chars, cp_at(s->u.str.s, b, a, &l))) a += l;
    while (right && b > a) {
        size_t p = b - 1;
        while (p > a && ((unsigned char)s->u.str.s[p] & 0xC0) == 0x80) p--;
        if (!in_set(chars, cp_at(s->u.str.s, b, p, &l)))
            break;
        b = p;
    }
    return sub(r, s, a, b);
}

/* ---- str methods --------------------------------------------------------------------------------- */

static llm_jv *m_strip(jx_run *r, llm_jv *s, const jx_args *a) { return strip(r, s, arg(a, 0, "chars"), 1, 1); }
static llm_jv *m_lstrip(jx_run *r, llm_jv *s, const jx_args *a) { return strip(r, s, arg(a, 0, "chars"), 1, 0); }
static llm_jv *m_rstrip(jx_run *r, llm_jv *s, const jx_args *a) { return strip(r, s, arg(a, 0, "chars"), 0, 1); }

static llm_jv *m_split(jx_run *r, llm_jv *s, const jx_args *a)
{
    llm_jv *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
    long long max = mx && mx->kind == JV_INT ? mx->u.i : -1;
    llm_jv *out = jv_list(r->c, 0);
    const char *p = s->u.str.s;
    size_t n = s->u.str.n, at = 0, l;
    if (!sep || sep->kind == JV_NONE) {
        for (;;) {
            while (at < n && py_space(cp_at(p, n, at, &l))) at += l;
            if (at >= n)
                break;
            size_t end = at;
            if (max >= 0 && (long long)out->u.list.n >= max) { /* the rest, trailing blanks and all */
                jv_push(r->c, out, sub(r, s, at, n));
                break;
            }
            while (end < n && !py_space(cp_at(p, n, end, &l))) end += l;
            jv_push(r->c, out, sub(r, s, at, end));
            at = end;
        }
        return out;
    }
    want_str(r, sep, "split separator");
    if (sep->u.str.n == 0)
        jx_fail(r->c, "empty separator");
    for (;;) {
        jx_step(r);
        const char *hit = max >= 0 && (long long)out->u.list.n >= max ? NULL
                          : memmem(p + at, n - at, sep->u.str.s, sep->u.str.n);
        if (!hit) {
            jv_push(r->c, out, sub(r, s, at, n));
            return out;
        }
        size_t h = (size_t)(hit - p);
        jv_push(r->c, out, sub(r, s, at, h));
        at = h + sep->u.str.n;
    }
}

static int affix(jx_run *r, llm_jv *s, llm_jv *x, int end)
{
    if (x && x->kind == JV_LIST) {
        for (size_t i = 0; i < x->u.list.n; i++)
            if (affix(r, s, x->u.list.items[i], end))
                return 1;
        return 0;
    }
    want_str(r, x, end ? "endswith" : "startswith");
    if (x->u.str.n > s->u.str.n)
        return 0;
    return !memcmp(s->u.str.s + (end ? s->u.str.n - x->u.str.n : 0), x->u.str.s, x->u.str.n);
}

static llm_jv *m_startswith(jx_run *r, llm_jv *s, const jx_args *a) { return jv_bool(r->c, affix(r, s, arg(a, 0, NULL), 0)); }
static llm_jv *m_endswith(jx_run *r, llm_jv *s, const jx_args *a) { return jv_bool(r->c, affix(r, s, arg(a, 0, NULL), 1)); }

static llm_jv *replace(jx_run *r, llm_jv *s, llm_jv *old, llm_jv *new_, llm_jv *count)
{
    want_str(r, old, "replace");
    new_ = jv_to_str(r->c, want_str(r, new_, "replace"));
    long long max = count && count->kind == JV_INT ? count->u.i : -1;
    jx_sb b;
    jx_sb_init(&b, r->c);
    size_t at = 0, n = s->u.str.n;
    long long done = 0;
    if (old->u.str.n == 0) { /* Python inserts between every code point */
        size_t l;
        for (;;) {
            if (max < 0 || done < max) {
                jx_sb_putv(&b, new_);
                done++;
            }
            if (at >= n)
                break;
            cp_at(s->u.str.s, n, at, &l);
            jx_sb_put(&b, s->u.str.s + at, l, s->u.str.taint ? s->u.str.taint + at : NULL);
            at += l;
        }
        return jx_sb_value(&b);
    }
    while (at <= n) {
        jx_step(r);
        const char *hit = max >= 0 && done >= max ? NULL : memmem(s->u.str.s + at, n - at, old->u.str.s, old->u.str.n);
        size_t h = hit ? (size_t)(hit - s->u.str.s) : n;
        jx_sb_put(&b, s->u.str.s + at, h - at, s->u.str.taint ? s->u.str.taint + at : NULL);
        if (!hit)
            break;
        jx_sb_putv(&b, new_);
        done++;
        at = h + old->u.str.n;
    }
    return jx_sb_value(&b);
}

static llm_jv *m_replace(jx_run *r, llm_jv *s, const jx_args *a)
{
    return replace(r, s, arg(a, 0, NULL), arg(a, 1, NULL), arg(a, 2, "count"));
}

static locale_t case_loc;

static void case_locale_init(void)
{
    case_loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
}

/* The C.UTF-8 locale, made once; (locale_t)0 when the system lacks it. */
static locale_t case_locale(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, case_locale_init);
    return case_loc;
}

/* The C library's Unicode case mapping (the C.UTF-8 locale: simple
 * mappings, so 'ß' stays one letter where Python writes "SS"); ASCII only
 * when that locale is missing. Each code point keeps its tenant mark. */
static unsigned long map_case(unsigned long cp, int upper)
{
    locale_t loc = case_locale();
    if (cp < 0x80 || !loc)
        return cp < 0x80 ? (unsigned long)(upper ? toupper((int)cp) : tolower((int)cp)) : cp;
    return (unsigned long)(upper ? towupper_l((wint_t)cp, loc) : towlower_l((wint_t)cp, loc));
}

static int is_alnum(unsigned long cp)
{
    locale_t loc = case_locale();
    return cp < 0x80 ? isalnum((int)cp) != 0 : loc ? iswalnum_l((wint_t)cp, loc) != 0 : 1;
}

static int is_cased_letter(unsigned long cp)
{
    return cp < 0x80 ? isalpha((int)cp) != 0 : map_case(cp, 0) != cp || map_case(cp, 1) != cp;
}

/* mode 0 upper, 1 lower, 2 capitalize, 3 Python's str.title */
static llm_jv *recase(jx_run *r, llm_jv *s, int mode)
{
    jx_sb b;
    jx_sb_init(&b, r->c);
    int word_start = 1;
    for (size_t i = 0, l; i < s->u.str.n; i += l) {
        unsigned long cp = cp_at(s->u.str.s, s->u.str.n, i, &l);
        int up = mode == 0 || (mode == 2 && i == 0) || (mode == 3 && word_start);
        unsigned long m = map_case(cp, up);
        word_start = !is_cased_letter(cp);
        char u[4];
        int k = llm_utf8_encode((uint32_t)m, u);
        if (l == 1 && (unsigned char)s->u.str.s[i] >= 0x80) { /* a stray byte stays as it is */
            u[0] = s->u.str.s[i];
            k = 1;
        }
        unsigned char t[4];
        memset(t, s->u.str.taint ? s->u.str.taint[i] : 0, sizeof t);
        jx_sb_put(&b, u, (size_t)k, s->u.str.taint ? t : NULL);
    }
    return jx_sb_value(&b);
}

static llm_jv *m_upper(jx_run *r, llm_jv *s, const jx_args *a) { (void)a; return recase(r, s, 0); }
static llm_jv *m_lower(jx_run *r, llm_jv *s, const jx_args *a) { (void)a; return recase(r, s, 1); }
static llm_jv *m_capitalize(jx_run *r, llm_jv *s, const jx_args *a) { (void)a; return recase(r, s, 2); }
static llm_jv *m_title(jx_run *r, llm_jv *s, const jx_args *a) { (void)a; return recase(r, s, 3); }

/* str.format: {} {0} {name} and {{ }}; format specs are refused. */
static llm_jv *m_format(jx_run *r, llm_jv *s, const jx_args *a)
{
    jx_sb b;
    jx_sb_init(&b, r->c);
    const char *p = s->u.str.s;
    size_t n = s->u.str.n, i = 0;
    int auto_ix = 0;
    while (i < n) {
        if ((p[i] == '{' || p[i] == '}') && i + 1 < n && p[i + 1] == p[i]) {
            jx_sb_put(&b, p + i, 1, s->u.str.taint ? s->u.str.taint + i : NULL);
            i += 2;
            continue;
        }
        if (p[i] == '}')
            jx_fail(r->c, "format: single '}' encountered in format string");
        if (p[i] != '{') {
            jx_sb_put(&b, p + i, 1, s->u.str.taint ? s->u.str.taint + i : NULL);
            i++;
            continue;
        }
        const char *close = memchr(p + i, '}', n - i);
        if (!close)
            jx_fail(r->c, "format: single '{' encountered in format string");
        size_t fl = (size_t)(close - p) - i - 1;
        const char *field = p + i + 1;
        if (memchr(field, ':', fl) || memchr(field, '!', fl) || memchr(field, '.', fl) || memchr(field, '[', fl))
            jx_fail(r->c, "format: conversions and format specs are not supported");
        llm_jv *v = NULL;
        if (fl == 0) {
            v = auto_ix < a->n_pos ? a->pos[auto_ix] : NULL;
            auto_ix++;
        } else if (isdigit((unsigned char)field[0])) {
            long k = strtol(field, NULL, 10);
            v = k < a->n_pos ? a->pos[k] : NULL;
        } else
            for (int k = 0; k < a->n_kw; k++)
                if (strlen(a->kw_names[k]) == fl && !strncmp(a->kw_names[k], field, fl))
                    v = a->kw[k];
        if (!v)
            jx_fail(r->c, "format: no argument for {%.*s}", (int)fl, field);
        jv_write_str(&b, v);
        i += fl + 2;
    }
    return jx_sb_value(&b);
}

static llm_jv *m_join(jx_run *r, llm_jv *s, const jx_args *a)
{
    llm_jv *items = jx_iterable(r, arg(a, 0, NULL) ? arg(a, 0, NULL) : jv_undef(r->c, "iterable"));
    jx_sb b;
    jx_sb_init(&b, r->c);
    for (size_t i = 0; i < items->u.list.n; i++) {
        if (i)
            jx_sb_putv(&b, s);
        jx_sb_putv(&b, want_str(r, items->u.list.items[i], "str.join"));
    }
    return jx_sb_value(&b);
}

static llm_jv *m_find(jx_run *r, llm_jv *s, const jx_args *a)
{
    llm_jv *x = want_str(r, arg(a, 0, NULL), "find");
    const char *hit = x->u.str.n ? memmem(s->u.str.s, s->u.str.n, x->u.str.s, x->u.str.n) : s->u.str.s;
    return jv_int(r->c, hit ? (long long)jv_utf8_len(s->u.str.s, (size_t)(hit - s->u.str.s)) : -1);
}

static llm_jv *m_count(jx_run *r, llm_jv *s, const jx_args *a)
{
    llm_jv *x = arg(a, 0, NULL);
    long long k = 0;
    if (s->kind == JV_LIST) {
        for (size_t i = 0; x && i < s->u.list.n; i++) k += jv_equal(s->u.list.items[i], x);
        return jv_int(r->c, k);
    }
    want_str(r, x, "count");
    if (!x->u.str.n)
        return jv_int(r->c, (long long)jv_utf8_len(s->u.str.s, s->u.str.n) + 1);
    for (const char *p = s->u.str.s, *e = p + s->u.str.n; (p = memmem(p, (size_t)(e - p), x->u.str.s, x->u.str.n));
         p += x->u.str.n)
        k++;
    return jv_int(r->c, k);
}

static llm_jv *m_splitlines(jx_run *r, llm_jv *s, const jx_args *a)
{
    int keep = arg_bool(a, 0, "keepends", 0);
    llm_jv *out = jv_list(r->c, 0);
    size_t at = 0, n = s->u.str.n;
    while (at < n) {
        size_t e = at;
        while (e < n && s->u.str.s[e] != '\n' && s->u.str.s[e] != '\r') e++;
        size_t nl = e < n ? (s->u.str.s[e] == '\r' && e + 1 < n && s->u.str.s[e + 1] == '\n' ? 2 : 1) : 0;
        jv_push(r->c, out, sub(r, s, at, keep ? e + nl : e));
        at = e + nl;
    }
    return out;
}

static llm_jv *classify(jx_run *r, llm_jv *s, int (*f)(int))
{
    if (!s->u.str.n)
        return jv_bool(r->c, 0);
    for (size_t i = 0; i < s->u.str.n; i++)
        if (!f((unsigned char)s->u.str.s[i]))
            return jv_bool(r->c, 0);
    return jv_bool(r->c, 1);
}

static llm_jv *m_isdigit(jx_run *r, llm_jv *s, const jx_args *a) { (void)a; return classify(r, s, isdigit); }
static llm_jv *m_isalpha(jx_run *r, llm_jv *s, const jx_args *a) { (void)a; return classify(r, s, isalpha); }
static llm_jv *m_isalnum(jx_run *r, llm_jv *s, const jx_args *a) { (void)a; return classify(r, s, isalnum); }
static llm_jv *m_isspace(jx_run *r, llm_jv *s, const jx_args *a) { (void)a; return classify(r, s, isspace); }

llm_jv *jx_percent_format(jx_run *r, llm_jv *fmt, llm_jv *args)
{
    llm_jv *one[1] = {args};
    llm_jv **av = one;
    size_t an = 1, used = 0;
    if (args->kind == JV_LIST && args->u.list.tuple) {
        av = args->u.list.items;
        an = args->u.list.n;
    }
    jx_sb b;
    jx_sb_init(&b, r->c);
    const char *p = fmt->u.str.s;
    for (size_t i = 0; i < fmt->u.str.n; i++) {
        if (p[i] != '%') {
            jx_sb_put(&b, p + i, 1, fmt->u.str.taint ? fmt->u.str.taint + i : NULL);
            continue;
        }
        char c = i + 1 < fmt->u.str.n ? p[++i] : 0;
        if (c == '%') { /* keeps the format's mark: a tenant's "%%" stays the tenant's */
            jx_sb_put(&b, "%", 1, fmt->u.str.taint ? fmt->u.str.taint + i : NULL);
            continue;
        }
        if (c != 's' && c != 'r' && c != 'd' && c != 'i')
            jx_fail(r->c, "%% formatting: only %%s %%r %%d %%i and %%%% are supported");
        if (used >= an)
            jx_fail(r->c, "not enough arguments for format string");
        llm_jv *v = av[used++];
        if (c == 's')
            jv_write_str(&b, v);
        else if (c == 'r')
            jv_write_repr(&b, v);
        else if (v->kind == JV_INT || v->kind == JV_BOOL)
            jx_sb_printf(&b, "%lld", v->kind == JV_INT ? v->u.i : v->u.b);
        else if (v->kind == JV_FLOAT && isfinite(v->u.f))
            jx_sb_printf(&b, "%.0f", trunc(v->u.f));
        else
            jx_fail(r->c, "%%d format: a real number is required, not %s", jv_type_name(v));
    }
    /* Python takes any non-tuple with __getitem__ (dict, list, Undefined) as a mapping, which may go unused */
    int mapping = args->kind == JV_DICT || args->kind == JV_UNDEF || (args->kind == JV_LIST && !args->u.list.tuple);
    if (used < an && !mapping)
        jx_fail(r->c, "not all arguments converted during string formatting");
    return jx_sb_value(&b);
}

/* ---- dict and list methods ------------------------------------------------------------------------- */

static llm_jv *m_get(jx_run *r, llm_jv *d, const jx_args *a)
{
    llm_jv *k = arg(a, 0, NULL), *dflt = arg(a, 1, "default");
    if (!k)
        jx_fail(r->c, "get expected at least 1 argument");
    llm_jv *v = jv_dict_get(d, k);
    return v ? v : dflt ? dflt : jv_new(r->c, JV_NONE);
}

static llm_jv *pairs(jx_run *r, llm_jv *d)
{
    llm_jv *out = jv_list(r->c, d->u.dict.n);
    for (size_t i = 0; i < d->u.dict.n; i++) {
        llm_jv *t = jv_list(r->c, 2);
        t->u.list.tuple = 1;
        jv_push(r->c, t, d->u.dict.e[i].key);
        jv_push(r->c, t, d->u.dict.e[i].val);
        jv_push(r->c, out, t);
    }
    return out;
}

static llm_jv *lazy(llm_jv *l, int kind);
static llm_jv *view(llm_jv *l, const char *name)
{
    l->u.list.lazy = 2;
    l->undef_name = name;
    return l;
}

static llm_jv *m_items(jx_run *r, llm_jv *d, const jx_args *a) { (void)a; return view(pairs(r, d), "dict_items"); }

static llm_jv *m_keys(jx_run *r, llm_jv *d, const jx_args *a)
{
    (void)a;
    llm_jv *keys = jx_iterable(r, d);
    return keys == d ? keys : view(keys, "dict_keys");
}

static llm_jv *m_values(jx_run *r, llm_jv *d, const jx_args *a)
{
    (void)a;
    llm_jv *out = jv_list(r->c, d->u.dict.n);
    for (size_t i = 0; i < d->u.dict.n; i++) jv_push(r->c, out, d->u.dict.e[i].val);
    return view(out, "dict_values");
}

static llm_jv *m_index(jx_run *r, llm_jv *l, const jx_args *a)
{
    llm_jv *x = arg(a, 0, NULL);
    for (size_t i = 0; x && i < l->u.list.n; i++)
        if (jv_equal(l->u.list.items[i], x))
            return jv_int(r->c, (long long)i);
    jx_fail(r->c, "list.index(x): x not in list");
}

typedef struct method {
    const char *name;
    jx_builtin fn;
} method;

static const method STR_METHODS[] = {
    {"strip", m_strip}, {"lstrip", m_lstrip}, {"rstrip", m_rstrip}, {"split", m_split},
    {"startswith", m_startswith}, {"endswith", m_endswith}, {"replace", m_replace}, {"upper", m_upper},
    {"lower", m_lower}, {"capitalize", m_capitalize}, {"title", m_title}, {"format", m_format}, {"join", m_join},
    {"find", m_find}, {"count", m_count}, {"splitlines", m_splitlines}, {"isdigit", m_isdigit},
    {"isalpha", m_isalpha}, {"isalnum", m_isalnum}, {"isspace", m_isspace}, {NULL, NULL}};
static const method DICT_METHODS[] = {{"get", m_get}, {"items", m_items}, {"keys", m_keys}, {"values", m_values},
                                      {NULL, NULL}};
static const method LIST_METHODS[] = {{"index", m_index}, {"count", m_count}, {NULL, NULL}};
/* what ImmutableSandboxedEnvironment refuses: the methods that change a list or dict */
static const char *const MUTATORS[] = {"append", "pop", "insert", "extend", "remove", "clear", "sort", "reverse",
                                       "update", "popitem", "setdefault", NULL};

llm_jv *jx_method(jx_run *r, llm_jv *self, const char *name)
{
    const method *t = self->kind == JV_STR ? STR_METHODS : self->kind == JV_DICT ? DICT_METHODS
                      : self->kind == JV_LIST && !self->u.list.lazy ? LIST_METHODS : NULL;
    for (int i = 0; t && t[i].name; i++)
        if (!strcmp(t[i].name, name)) {
            llm_jv *f = jv_new(r->c, JV_FUNC);
            f->u.func.fn = t[i].fn;
            f->u.func.self = self;
            f->u.func.name = t[i].name;
            return f;
        }
    if (self->kind == JV_LIST || self->kind == JV_DICT)
        for (int i = 0; MUTATORS[i]; i++)
            if (!strcmp(MUTATORS[i], name)) {
                char *msg = jx_alloc(r->c, 96);
                snprintf(msg, 96, "access to attribute '%s' of '%s' object is unsafe", name, jv_type_name(self));
                return jv_undef(r->c, msg);
            }
    return NULL;
}

llm_jv *jx_iterable(jx_run *r, llm_jv *v)
{
    switch (v->kind) {
    case JV_UNDEF: return jv_list(r->c, 1);
    case JV_LIST:
        if (v->u.list.lazy == 3)
            jx_fail(r->c, "%s", v->undef_name);
        return v;
    case JV_DICT: {
        llm_jv *out = jv_list(r->c, v->u.dict.n);
        for (size_t i = 0; i < v->u.dict.n; i++) jv_push(r->c, out, v->u.dict.e[i].key);
        return out;
    }
    case JV_STR: {
        llm_jv *out = jv_list(r->c, v->u.str.n);
        for (size_t i = 0, l; i < v->u.str.n; i += l) {
            cp_at(v->u.str.s, v->u.str.n, i, &l);
            jv_push(r->c, out, sub(r, v, i, i + l));
        }
        return out;
    }
    default: jx_fail(r->c, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* l marked as what jinja2 returns lazily (see llm_jv.u.list.lazy). */
static llm_jv *lazy(llm_jv *l, int kind)
{
    l->u.list.lazy = kind;
    return l;
}

/* ---- filters ---------------------------------------------------------------------------------------- */

static llm_jv *f_tojson(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *ind = arg(a, 1, "indent"), *seps = arg(a, 2, "separators");
    int ascii = arg_bool(a, 0, "ensure_ascii", 0), sort = arg_bool(a, 3, "sort_keys", 0);
    int indent = ind && ind->kind == JV_INT ? (int)ind->u.i : -1;
    if (ind && ind->kind != JV_INT && ind->kind != JV_NONE)
        jx_fail(r->c, "tojson: indent must be an integer");
    if (indent > 64)
        jx_fail(r->c, "tojson: indent above 64");
    const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
    if (seps && seps->kind == JV_LIST && seps->u.list.n == 2) {
        llm_jv *x = want_str(r, seps->u.list.items[0], "tojson separators");
        llm_jv *y = want_str(r, seps->u.list.items[1], "tojson separators");
        char *xs = jx_alloc(r->c, x->u.str.n + 1), *ys = jx_alloc(r->c, y->u.str.n + 1);
        memcpy(xs, x->u.str.s, x->u.str.n);
        memcpy(ys, y->u.str.s, y->u.str.n);
        isep = xs;
        ksep = ys;
    }
    jx_sb b;
    jx_sb_init(&b, r->c);
    jv_write_json(&b, v, indent, isep, ksep, sort, 0);
    if (!ascii)
        return jx_sb_value(&b);
    jx_sb o; /* ensure_ascii: code points past 0x7f as \uXXXX (surrogate pairs past 0xffff) */
    jx_sb_init(&o, r->c);
    for (size_t i = 0, l; i < b.n; i += l) {
        unsigned long cp = cp_at(b.p, b.n, i, &l);
        const unsigned char *t = b.taint ? b.taint + i : NULL;
        char e[32];
        if (cp < 0x80) {
            jx_sb_put(&o, b.p + i, 1, t);
            continue;
        }
        if (cp < 0x10000)
            snprintf(e, sizeof e, "\\u%04lx", cp);
        else
            snprintf(e, sizeof e, "\\u%04lx\\u%04lx", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
        for (char *p = e; *p; p++) jx_sb_put(&o, p, 1, t);
    }
    return jx_sb_value(&o);
}

static llm_jv *f_length(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    switch (v->kind) {
    case JV_UNDEF: return jv_int(r->c, 0);
    case JV_STR: return jv_int(r->c, (long long)jv_utf8_len(v->u.str.s, v->u.str.n));
    case JV_LIST:
        if (v->u.list.lazy == 1 || v->u.list.lazy == 3)
            break;
        return jv_int(r->c, (long long)v->u.list.n);
    case JV_DICT:
    case JV_NS: return jv_int(r->c, (long long)v->u.dict.n);
    default: break;
    }
    jx_fail(r->c, "object of type '%s' has no len()", jv_type_name(v));
}

static llm_jv *f_trim(jx_run *r, llm_jv *v, const jx_args *a)
{
    return strip(r, jv_to_str(r->c, v), arg(a, 0, "chars"), 1, 1);
}

static llm_jv *f_string(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    return jv_to_str(r->c, v);
}

static llm_jv *f_default(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *d = arg(a, 0, "default_value");
    int boolean = arg_bool(a, 1, "boolean", 0);
    if (v->kind == JV_UNDEF || (boolean && !jv_truthy(v)))
        return d ? d : jv_cstr(r->c, "");
    return v;
}

/* attribute="a.b" or an index: what jinja2's make_attrgetter reads */
static llm_jv *attr_path(jx_run *r, llm_jv *v, llm_jv *path)
{
    if (path->kind == JV_INT)
        return jx_getitem(r, v, path);
    want_str(r, path, "attribute");
    const char *p = path->u.str.s, *e = p + path->u.str.n;
    while (p <= e) {
        const char *dot = memchr(p, '.', (size_t)(e - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(e - p);
        int all_digits = n > 0;
        for (size_t i = 0; i < n; i++) all_digits &= isdigit((unsigned char)p[i]) != 0;
        llm_jv *key = all_digits ? jv_int(r->c, atoll(p)) : jv_str(r->c, p, n, NULL);
        v = jx_getitem(r, v, key);
        if (!dot)
            break;
        p = dot + 1;
    }
    return v;
}

static llm_jv *f_join(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *sep = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
    llm_jv *items = jx_iterable(r, v);
    jx_sb b;
    jx_sb_init(&b, r->c);
    for (size_t i = 0; i < items->u.list.n; i++) {
        if (i && sep)
            jv_write_str(&b, sep);
        llm_jv *x = items->u.list.items[i];
        jv_write_str(&b, attr ? attr_path(r, x, attr) : x);
    }
    return jx_sb_value(&b);
}

static llm_jv *f_items(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    if (v->kind == JV_UNDEF)
        return lazy(jv_list(r->c, 1), 1);
    if (v->kind != JV_DICT)
        jx_fail(r->c, "items: can only get item pairs from a mapping, not %s", jv_type_name(v));
    return lazy(pairs(r, v), 1);
}

static llm_jv *f_upper(jx_run *r, llm_jv *v, const jx_args *a) { (void)a; return recase(r, jv_to_str(r->c, v), 0); }
static llm_jv *f_lower(jx_run *r, llm_jv *v, const jx_args *a) { (void)a; return recase(r, jv_to_str(r->c, v), 1); }
static llm_jv *f_capitalize(jx_run *r, llm_jv *v, const jx_args *a) { (void)a; return recase(r, jv_to_str(r->c, v), 2); }
/* jinja2's title: words start after '-', whitespace, '(', '{', '[' or '<' */
static llm_jv *f_title(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    llm_jv *s = jv_to_str(r->c, v);
    jx_sb b;
    jx_sb_init(&b, r->c);
    for (size_t i = 0, j; i < s->u.str.n; i = j) {
        j = i;
        while (j < s->u.str.n && (strchr("-({[<", s->u.str.s[j]) || isspace((unsigned char)s->u.str.s[j]))) j++;
        jx_sb_put(&b, s->u.str.s + i, j - i, s->u.str.taint ? s->u.str.taint + i : NULL);
        size_t w = j;
        while (j < s->u.str.n && !strchr("-({[<", s->u.str.s[j]) && !isspace((unsigned char)s->u.str.s[j])) j++;
        if (j > w) { /* item[0].upper() + item[1:].lower() */
            size_t l;
            cp_at(s->u.str.s, s->u.str.n, w, &l);
            if (l > j - w) /* a lead byte whose character the word's end cuts (not UTF-8): the word's bytes only */
                l = j - w;
            jx_sb_putv(&b, recase(r, sub(r, s, w, w + l), 0));
            jx_sb_putv(&b, recase(r, sub(r, s, w + l, j), 1));
        }
    }
    return jx_sb_value(&b);
}

static llm_jv *f_safe(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    llm_jv *s = jv_new(r->c, JV_STR);
    *s = *jv_to_str(r->c, v);
    s->u.str.safe = 1;
    return s;
}

static llm_jv *f_list(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    llm_jv *items = jx_iterable(r, v), *out = jv_list(r->c, items->u.list.n);
    for (size_t i = 0; i < items->u.list.n; i++) jv_push(r->c, out, items->u.list.items[i]);
    return out;
}

static llm_jv *f_replace(jx_run *r, llm_jv *v, const jx_args *a)
{
    return replace(r, jv_to_str(r->c, v), jv_to_str(r->c, arg(a, 0, "old") ? arg(a, 0, "old") : jv_cstr(r->c, "")),
                   arg(a, 1, "new") ? jv_to_str(r->c, arg(a, 1, "new")) : jv_cstr(r->c, ""), arg(a, 2, "count"));
}

/* The value a sort or comparison uses: lower-cased strings unless case-sensitive. */
static llm_jv *sort_key(jx_run *r, llm_jv *v, int case_sensitive)
{
    return !case_sensitive && v->kind == JV_STR ? recase(r, v, 1) : v;
}

typedef struct sort_item {
    llm_jv *key, *val;
} sort_item;


static llm_jv *sorted(jx_run *r, llm_jv *items, int reverse, int case_sensitive, llm_jv *attr, int by_value)
{
    size_t n = items->u.list.n;
    sort_item *s = jx_alloc(r->c, (n + 1) * sizeof *s);
    for (size_t i = 0; i < n; i++) {
        llm_jv *x = items->u.list.items[i];
        llm_jv *k = attr ? attr_path(r, x, attr) : x;
        if (by_value >= 0) /* dictsort: pairs by key (0) or value (1) */
            k = k->u.list.items[by_value];
        s[i] = (sort_item){sort_key(r, k, case_sensitive), x};
    }
    /* a stable sort, as Python's: insertion sort into place (lists in templates are short) */
    for (size_t i = 1; i < n; i++) {
        sort_item t = s[i];
        size_t j = i;
        while (j > 0) {
            jx_step(r);
            int c = jv_compare(r->c, s[j - 1].key, t.key);
            if (reverse ? c >= 0 : c <= 0)
                break;
            s[j] = s[j - 1];
            j--;
        }
        s[j] = t;
    }
    llm_jv *out = jv_list(r->c, n);
    for (size_t i = 0; i < n; i++) jv_push(r->c, out, s[i].val);
    return out;
}

static llm_jv *f_sort(jx_run *r, llm_jv *v, const jx_args *a)
{
    return sorted(r, jx_iterable(r, v), arg_bool(a, 0, "reverse", 0), arg_bool(a, 1, "case_sensitive", 0),
                  arg(a, 2, "attribute"), -1);
}

static llm_jv *f_dictsort(jx_run *r, llm_jv *v, const jx_args *a)
{
    if (v->kind != JV_DICT)
        jx_fail(r->c, "dictsort: a mapping expected, got %s", jv_type_name(v));
    llm_jv *by = arg(a, 1, "by");
    int by_value = by && by->kind == JV_STR && by->u.str.n == 5 && !memcmp(by->u.str.s, "value", 5);
    return sorted(r, pairs(r, v), arg_bool(a, 2, "reverse", 0), arg_bool(a, 0, "case_sensitive", 0), NULL, by_value);
}

static llm_jv *f_unique(jx_run *r, llm_jv *v, const jx_args *a)
{
    int cs = arg_bool(a, 0, "case_sensitive", 0);
    llm_jv *attr = arg(a, 1, "attribute"), *items = jx_iterable(r, v), *out = jv_list(r->c, 0), *seen = jv_dict(r->c);
    for (size_t i = 0; i < items->u.list.n; i++) {
        llm_jv *x = items->u.list.items[i], *k = sort_key(r, attr ? attr_path(r, x, attr) : x, cs);
        if (k->kind == JV_LIST || k->kind == JV_DICT)
            jx_fail(r->c, "unique: unhashable type '%s'", jv_type_name(k));
        if (jv_dict_get(seen, k))
            continue;
        jv_dict_set(r->c, seen, k, k);
        jv_push(r->c, out, x);
    }
    return lazy(out, 1);
}

static llm_jv *extreme(jx_run *r, llm_jv *v, const jx_args *a, int want_max)
{
    int cs = arg_bool(a, 0, "case_sensitive", 0);
    llm_jv *attr = arg(a, 1, "attribute"), *items = jx_iterable(r, v), *best = NULL, *best_k = NULL;
    for (size_t i = 0; i < items->u.list.n; i++) {
        llm_jv *x = items->u.list.items[i], *k = sort_key(r, attr ? attr_path(r, x, attr) : x, cs);
        if (!best || (want_max ? jv_compare(r->c, k, best_k) > 0 : jv_compare(r->c, k, best_k) < 0)) {
            best = x;
            best_k = k;
        }
    }
    return best ? best : jv_undef(r->c, "min or max of an empty sequence");
}

static llm_jv *f_min(jx_run *r, llm_jv *v, const jx_args *a) { return extreme(r, v, a, 0); }
static llm_jv *f_max(jx_run *r, llm_jv *v, const jx_args *a) { return extreme(r, v, a, 1); }

static llm_jv *f_first(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    llm_jv *items = jx_iterable(r, v);
    return items->u.list.n ? items->u.list.items[0] : jv_undef(r->c, "first of an empty sequence");
}

static llm_jv *f_last(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    llm_jv *items = jx_iterable(r, v);
    return items->u.list.n ? items->u.list.items[items->u.list.n - 1] : jv_undef(r->c, "last of an empty sequence");
}

static llm_jv *f_reverse(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    llm_jv *items = jx_iterable(r, v), *out = jv_list(r->c, items->u.list.n);
    for (size_t i = items->u.list.n; i > 0; i--) jv_push(r->c, out, items->u.list.items[i - 1]);
    if (v->kind == JV_LIST && v->u.list.lazy) /* reversed() refuses an iterator: jinja2 makes a list */
        return out;
    if (v->kind != JV_STR)
        return lazy(out, 1);
    jx_sb b;
    jx_sb_init(&b, r->c);
    for (size_t i = 0; i < out->u.list.n; i++) jx_sb_putv(&b, out->u.list.items[i]);
    return jx_sb_value(&b);
}

static llm_jv *f_int(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *d = arg(a, 0, "default");
    if (v->kind == JV_UNDEF) /* int(Undefined) raises, beyond the filter's fallback */
        jx_fail(r->c, "'%s' is undefined", v->undef_name ? v->undef_name : "value");
    if (v->kind == JV_INT)
        return v;
    if (v->kind == JV_BOOL)
        return jv_int(r->c, v->u.b);
    if (v->kind == JV_FLOAT && isfinite(v->u.f) && fabs(v->u.f) < 9.2e18)
        return jv_int(r->c, (long long)v->u.f);
    if (v->kind == JV_STR) {
        char buf[64];
        size_t n = v->u.str.n < sizeof buf - 1 ? v->u.str.n : sizeof buf - 1;
        memcpy(buf, v->u.str.s, n);
        buf[n] = 0;
        char *end;
        long long i = strtoll(buf, &end, 10);
        while (*end && isspace((unsigned char)*end)) end++;
        if (end != buf && !*end)
            return jv_int(r->c, i);
        double f = strtod(buf, &end);
        while (*end && isspace((unsigned char)*end)) end++;
        if (end != buf && !*end && isfinite(f) && fabs(f) < 9.2e18)
            return jv_int(r->c, (long long)f);
    }
    return d ? d : jv_int(r->c, 0);
}

static llm_jv *f_float(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *d = arg(a, 0, "default");
    if (v->kind == JV_UNDEF)
        jx_fail(r->c, "'%s' is undefined", v->undef_name ? v->undef_name : "value");
    if (v->kind == JV_FLOAT)
        return v;
    if (v->kind == JV_INT || v->kind == JV_BOOL)
        return jv_float(r->c, v->kind == JV_INT ? (double)v->u.i : v->u.b);
    if (v->kind == JV_STR) {
        char buf[64];
        size_t n = v->u.str.n < sizeof buf - 1 ? v->u.str.n : sizeof buf - 1;
        memcpy(buf, v->u.str.s, n);
        buf[n] = 0;
        char *end;
        double f = strtod(buf, &end);
        if (end != buf && !*end)
            return jv_float(r->c, f);
    }
    return d ? d : jv_float(r->c, 0);
}

static llm_jv *f_abs(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    if (v->kind == JV_BOOL)
        return jv_int(r->c, v->u.b);
    if (v->kind == JV_INT)
        return v->u.i == INT64_MIN ? (jx_fail(r->c, "integer overflow"), v) : jv_int(r->c, v->u.i < 0 ? -v->u.i : v->u.i);
    if (v->kind == JV_FLOAT)
        return jv_float(r->c, fabs(v->u.f));
    jx_fail(r->c, "bad operand type for abs(): '%s'", jv_type_name(v));
}

static llm_jv *f_round(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *p = arg(a, 0, "precision"), *m = arg(a, 1, "method");
    int prec = p && p->kind == JV_INT ? (int)p->u.i : 0;
    if (prec < -20 || prec > 20)
        jx_fail(r->c, "round: precision out of range");
    double x = v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : (jx_fail(r->c, "round: a number expected"), 0);
    double k = pow(10, prec), y = x * k;
    const char *how = m && m->kind == JV_STR ? m->u.str.s : "common";
    y = !strncmp(how, "floor", 5) ? floor(y) : !strncmp(how, "ceil", 4) ? ceil(y) : round(y);
    return jv_float(r->c, y / k);
}

static llm_jv *f_sum(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *attr = arg(a, 0, "attribute"), *acc = arg(a, 1, "start");
    llm_jv *items = jx_iterable(r, v);
    if (!acc)
        acc = jv_int(r->c, 0);
    for (size_t i = 0; i < items->u.list.n; i++) {
        llm_jv *x = attr ? attr_path(r, items->u.list.items[i], attr) : items->u.list.items[i];
        llm_jv *two[2] = {acc, x};
        for (int k = 0; k < 2; k++)
            if (two[k]->kind != JV_INT && two[k]->kind != JV_FLOAT && two[k]->kind != JV_BOOL)
                jx_fail(r->c, "sum: unsupported operand type(s) for +: '%s' and '%s'", jv_type_name(acc),
                        jv_type_name(x));
        if (acc->kind != JV_FLOAT && x->kind != JV_FLOAT) {
            long long p = acc->kind == JV_INT ? acc->u.i : acc->u.b, q = x->kind == JV_INT ? x->u.i : x->u.b;
            if ((q > 0 && p > INT64_MAX - q) || (q < 0 && p < INT64_MIN - q))
                jx_fail(r->c, "integer overflow (beyond 64 bits)");
            acc = jv_int(r->c, p + q);
        } else
            acc = jv_float(r->c, (acc->kind == JV_FLOAT ? acc->u.f : acc->kind == JV_INT ? (double)acc->u.i : acc->u.b) +
                                     (x->kind == JV_FLOAT ? x->u.f : x->kind == JV_INT ? (double)x->u.i : x->u.b));
    }
    return acc;
}

/* indent(width=4, first=False, blank=False), as jinja2 3.1 does it */
static llm_jv *f_indent(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *w = arg(a, 0, "width");
    int first = arg_bool(a, 1, "first", 0), blank = arg_bool(a, 2, "blank", 0);
    llm_jv *ind;
    if (!w)
        ind = jv_cstr(r->c, "    ");
    else if (w->kind == JV_STR)
        ind = w;
    else if (w->kind == JV_INT && w->u.i >= 0 && w->u.i <= 1024) {
        jx_sb sp;
        jx_sb_init(&sp, r->c);
        for (long long i = 0; i < w->u.i; i++) jx_sb_puts(&sp, " ");
        ind = jx_sb_value(&sp);
    } else
        jx_fail(r->c, "indent: width must be a string or an integer 0..1024");
    if (v->kind != JV_STR) /* jinja2 adds "\n" to the value: only a string takes it */
        jx_fail(r->c, "indent: '%s' object has no attribute 'splitlines'", jv_type_name(v));
    llm_jv *s = v;
    jx_args none = {0};
    jx_sb t;
    jx_sb_init(&t, r->c);
    jx_sb_putv(&t, s);
    jx_sb_puts(&t, "\n");
    llm_jv *lines = m_splitlines(r, jx_sb_value(&t), &none);
    jx_sb b;
    jx_sb_init(&b, r->c);
    if (first)
        jx_sb_putv(&b, ind);
    for (size_t i = 0; i < lines->u.list.n; i++) {
        llm_jv *line = lines->u.list.items[i];
        if (i) {
            jx_sb_puts(&b, "\n");
            if (blank || line->u.str.n)
                jx_sb_putv(&b, ind);
        }
        jx_sb_putv(&b, line);
    }
    return jx_sb_value(&b);
}

static llm_jv *f_escape(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    return jx_html_escape(r, v);
}

llm_jv *jx_html_escape(jx_run *r, llm_jv *v)
{
    llm_jv *s = jv_to_str(r->c, v);
    if (s->u.str.safe)
        return s;
    jx_sb b;
    jx_sb_init(&b, r->c);
    for (size_t i = 0; i < s->u.str.n; i++) {
        const unsigned char *t = s->u.str.taint ? s->u.str.taint + i : NULL;
        const char *e = NULL;
        switch (s->u.str.s[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        }
        if (!e) {
            jx_sb_put(&b, s->u.str.s + i, 1, t);
            continue;
        }
        for (; *e; e++) jx_sb_put(&b, e, 1, t);
    }
    llm_jv *out = jx_sb_value(&b);
    out->u.str.safe = 1;
    return out;
}

static llm_jv *f_attr(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *n = want_str(r, arg(a, 0, "name"), "attr");
    char *name = jx_alloc(r->c, n->u.str.n + 1);
    memcpy(name, n->u.str.s, n->u.str.n);
    return jx_getattr(r, v, name);
}

/* jinja2 counts the runs of \w (letters, digits, '_'; any non-ASCII letter) */
static llm_jv *f_wordcount(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    llm_jv *s = jv_to_str(r->c, v);
    long long k = 0;
    int in_word = 0;
    for (size_t i = 0, l; i < s->u.str.n; i += l) {
        unsigned long cp = cp_at(s->u.str.s, s->u.str.n, i, &l);
        int w = cp < 0x80 ? (isalnum((int)cp) || cp == '_') : is_alnum(cp);
        k += w && !in_word;
        in_word = w;
    }
    return jv_int(r->c, k);
}

/* select/reject/selectattr/rejectattr: keep the items whose test says keep. */
static llm_jv *select_items(jx_run *r, llm_jv *v, const jx_args *a, int with_attr, int keep)
{
    llm_jv *items = jv_truthy(v) ? jx_iterable(r, v) : jv_list(r->c, 1), *out = lazy(jv_list(r->c, 0), 1);
    int at = 0;
    llm_jv *attr = with_attr ? a->pos[at++] : NULL;
    if (with_attr && !attr)
        jx_fail(r->c, "selectattr: an attribute name is needed");
    jx_builtin test = NULL;
    if (at < a->n_pos) {
        llm_jv *tn = want_str(r, a->pos[at++], "select test");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(tn->u.str.n < 63 ? tn->u.str.n : 63), tn->u.str.s);
        if (!(test = jx_test_fn(name)))
            jx_fail(r->c, "no test named '%s'", name);
    }
    jx_args rest = {a->pos + at, a->n_pos - at, a->kw_names, a->kw, a->n_kw};
    for (size_t i = 0; i < items->u.list.n; i++) {
        jx_step(r);
        llm_jv *x = items->u.list.items[i], *y = attr ? attr_path(r, x, attr) : x;
        int t = test ? jv_truthy(test(r, y, &rest)) : jv_truthy(y);
        if (t == keep)
            jv_push(r->c, out, x);
    }
    return out;
}

static llm_jv *f_select(jx_run *r, llm_jv *v, const jx_args *a) { return select_items(r, v, a, 0, 1); }
static llm_jv *f_reject(jx_run *r, llm_jv *v, const jx_args *a) { return select_items(r, v, a, 0, 0); }
static llm_jv *f_selectattr(jx_run *r, llm_jv *v, const jx_args *a) { return select_items(r, v, a, 1, 1); }
static llm_jv *f_rejectattr(jx_run *r, llm_jv *v, const jx_args *a) { return select_items(r, v, a, 1, 0); }

static llm_jv *f_map(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *items = jv_truthy(v) ? jx_iterable(r, v) : jv_list(r->c, 1);
    llm_jv *out = lazy(jv_list(r->c, items->u.list.n), 1);
    llm_jv *attr = arg(a, -1, "attribute"), *dflt = arg(a, -1, "default");
    jx_builtin f = NULL;
    jx_args rest = {0};
    if (!attr) {
        llm_jv *fn = want_str(r, a->n_pos ? a->pos[0] : NULL, "map filter");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(fn->u.str.n < 63 ? fn->u.str.n : 63), fn->u.str.s);
        if (!(f = jx_filter_fn(name)))
            jx_fail(r->c, "no filter named '%s'", name);
        rest = (jx_args){a->pos + 1, a->n_pos - 1, a->kw_names, a->kw, a->n_kw};
    }
    for (size_t i = 0; i < items->u.list.n; i++) {
        jx_step(r);
        llm_jv *x = items->u.list.items[i];
        llm_jv *y = attr ? attr_path(r, x, attr) : f(r, x, &rest);
        if (attr && y->kind == JV_UNDEF && dflt)
            y = dflt;
        jv_push(r->c, out, y);
    }
    return out;
}

typedef struct named_fn {
    const char *name;
    jx_builtin fn;
} named_fn;

static const named_fn FILTERS[] = {
    {"tojson", f_tojson}, {"length", f_length}, {"count", f_length}, {"trim", f_trim}, {"string", f_string},
    {"default", f_default}, {"d", f_default}, {"join", f_join}, {"items", f_items}, {"upper", f_upper},
    {"lower", f_lower}, {"capitalize", f_capitalize}, {"title", f_title}, {"safe", f_safe}, {"list", f_list},
    {"replace", f_replace}, {"dictsort", f_dictsort}, {"sort", f_sort}, {"unique", f_unique}, {"min", f_min},
    {"max", f_max}, {"first", f_first}, {"last", f_last}, {"reverse", f_reverse}, {"int", f_int},
    {"float", f_float}, {"abs", f_abs}, {"round", f_round}, {"sum", f_sum}, {"indent", f_indent},
    {"escape", f_escape}, {"e", f_escape}, {"attr", f_attr}, {"wordcount", f_wordcount}, {"select", f_select},
    {"reject", f_reject}, {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"map", f_map},
    {NULL, NULL}};

/* The function called name in a table ending with {NULL, NULL}, or NULL. */
static jx_builtin find_fn(const named_fn *t, const char *name)
{
    for (int i = 0; t[i].name; i++)
        if (!strcmp(t[i].name, name))
            return t[i].fn;
    return NULL;
}

jx_builtin jx_filter_fn(const char *name)
{
    return find_fn(FILTERS, name);
}

/* ---- tests ----------------------------------------------------------------------------------------- */

#define TEST(name, expr)                                                                                           \
    static llm_jv *name(jx_run *r, llm_jv *v, const jx_args *a)                                                    \
    {                                                                                                              \
        (void)a;                                                                                                   \
        return jv_bool(r->c, (expr));                                                                              \
    }

TEST(t_defined, v->kind != JV_UNDEF)
TEST(t_undefined, v->kind == JV_UNDEF)
TEST(t_none, v->kind == JV_NONE)
TEST(t_string, v->kind == JV_STR)
TEST(t_mapping, v->kind == JV_DICT)
TEST(t_iterable, v->kind == JV_STR || v->kind == JV_LIST || v->kind == JV_DICT || v->kind == JV_UNDEF)
TEST(t_sequence, v->kind == JV_STR || (v->kind == JV_LIST && !v->u.list.lazy) || v->kind == JV_DICT ||
                     v->kind == JV_UNDEF)
TEST(t_number, v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL)
TEST(t_integer, v->kind == JV_INT)
TEST(t_float, v->kind == JV_FLOAT)
TEST(t_boolean, v->kind == JV_BOOL)
TEST(t_true, v->kind == JV_BOOL && v->u.b)
TEST(t_false, v->kind == JV_BOOL && !v->u.b)
TEST(t_callable, v->kind == JV_FUNC)

/* Python's value % m for the numeric tests (bool and float included). */
static double py_mod(jx_run *r, llm_jv *v, llm_jv *m, const char *test)
{
    int num_v = v->kind == JV_INT || v->kind == JV_BOOL || v->kind == JV_FLOAT;
    int num_m = m && (m->kind == JV_INT || m->kind == JV_BOOL || m->kind == JV_FLOAT);
    if (!num_v || !num_m)
        jx_fail(r->c, "%s: numbers expected", test);
    double x = v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : v->u.b;
    double y = m->kind == JV_FLOAT ? m->u.f : m->kind == JV_INT ? (double)m->u.i : m->u.b;
    if (y == 0)
        jx_fail(r->c, "%s: modulo by zero", test);
    if (v->kind != JV_FLOAT && m->kind != JV_FLOAT) {
        long long a = v->kind == JV_INT ? v->u.i : v->u.b, b = m->kind == JV_INT ? m->u.i : m->u.b;
        long long q = a % b;
        return (double)(q != 0 && ((q < 0) != (b < 0)) ? q + b : q);
    }
    double q = fmod(x, y);
    return q != 0 && ((q < 0) != (y < 0)) ? q + y : q;
}

static llm_jv *t_odd(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    llm_jv two = {.kind = JV_INT, .u.i = 2};
    return jv_bool(r->c, py_mod(r, v, &two, "odd") == 1);
}

static llm_jv *t_even(jx_run *r, llm_jv *v, const jx_args *a)
{
    (void)a;
    llm_jv two = {.kind = JV_INT, .u.i = 2};
    return jv_bool(r->c, py_mod(r, v, &two, "even") == 0);
}

static llm_jv *t_divisibleby(jx_run *r, llm_jv *v, const jx_args *a)
{
    return jv_bool(r->c, py_mod(r, v, arg(a, 0, "num"), "divisibleby") == 0);
}

static llm_jv *cmp_test(jx_run *r, llm_jv *v, const jx_args *a, int op)
{
    llm_jv *o = arg(a, 0, "b");
    if (!o)
        jx_fail(r->c, "a comparison test needs its other value");
    if (op == 0)
        return jv_bool(r->c, jv_equal(v, o));
    if (op == 1)
        return jv_bool(r->c, !jv_equal(v, o));
    int c = jv_compare(r->c, v, o);
    return jv_bool(r->c, op == 2 ? c < 0 : op == 3 ? c <= 0 : op == 4 ? c > 0 : c >= 0);
}

static llm_jv *t_eq(jx_run *r, llm_jv *v, const jx_args *a) { return cmp_test(r, v, a, 0); }
static llm_jv *t_ne(jx_run *r, llm_jv *v, const jx_args *a) { return cmp_test(r, v, a, 1); }
static llm_jv *t_lt(jx_run *r, llm_jv *v, const jx_args *a) { return cmp_test(r, v, a, 2); }
static llm_jv *t_le(jx_run *r, llm_jv *v, const jx_args *a) { return cmp_test(r, v, a, 3); }
static llm_jv *t_gt(jx_run *r, llm_jv *v, const jx_args *a) { return cmp_test(r, v, a, 4); }
static llm_jv *t_ge(jx_run *r, llm_jv *v, const jx_args *a) { return cmp_test(r, v, a, 5); }

static llm_jv *t_in(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *seq = arg(a, 0, "seq");
    if (!seq)
        jx_fail(r->c, "in: a sequence expected");
    if (seq->kind == JV_STR && v->kind == JV_STR)
        return jv_bool(r->c, !v->u.str.n || memmem(seq->u.str.s, seq->u.str.n, v->u.str.s, v->u.str.n) != NULL);
    if (seq->kind == JV_DICT)
        return jv_bool(r->c, jv_dict_get(seq, v) != NULL);
    llm_jv *items = jx_iterable(r, seq);
    for (size_t i = 0; i < items->u.list.n; i++)
        if (jv_equal(items->u.list.items[i], v))
            return jv_bool(r->c, 1);
    return jv_bool(r->c, 0);
}

static llm_jv *t_sameas(jx_run *r, llm_jv *v, const jx_args *a)
{
    llm_jv *o = arg(a, 0, "other");
    if (!o)
        jx_fail(r->c, "sameas: a value expected");
    int same = v == o || (v->kind == o->kind && (v->kind == JV_NONE || (v->kind == JV_BOOL && v->u.b == o->u.b)));
    return jv_bool(r->c, same);
}

/* str.islower()/isupper(): some cased letter, none of the other case (ASCII) */
static llm_jv *case_test(jx_run *r, llm_jv *v, int upper)
{
    if (v->kind != JV_STR)
        return jv_bool(r->c, 0);
    int cased = 0;
    for (size_t i = 0; i < v->u.str.n; i++) {
        unsigned char ch = (unsigned char)v->u.str.s[i];
        if (upper ? islower(ch) : isupper(ch))
            return jv_bool(r->c, 0);
        cased |= (upper ? isupper(ch) : islower(ch)) != 0;
    }
    return jv_bool(r->c, cased);
}

static llm_jv *t_lower(jx_run *r, llm_jv *v, const jx_args *a) { (void)a; return case_test(r, v, 0); }
static llm_jv *t_upper(jx_run *r, llm_jv *v, const jx_args *a) { (void)a; return case_test(r, v, 1); }

static const named_fn TESTS[] = {
    {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"string", t_string},
    {"mapping", t_mapping}, {"iterable", t_iterable}, {"sequence", t_sequence}, {"number", t_number},
    {"integer", t_integer}, {"float", t_float}, {"boolean", t_boolean}, {"true", t_true}, {"false", t_false},
    {"callable", t_callable}, {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby},
    {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt}, {"lessthan", t_lt},
    {"<", t_lt}, {"le", t_le}, {"<=", t_le}, {"gt", t_gt}, {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge},
    {">=", t_ge}, {"in", t_in}, {"sameas", t_sameas}, {"lower", t_lower}, {"upper", t_upper}, {NULL, NULL}};

jx_builtin jx_test_fn(const char *name)
{
    return find_fn(TESTS, name);
}

/* ---- globals ---------------------------------------------------------------------------------------- */

static llm_jv *g_range(jx_run *r, llm_jv *self, const jx_args *a)
{
    (void)self;
    long long x[3] = {0, 0, 1};
    if (a->n_pos < 1 || a->n_pos > 3)
        jx_fail(r->c, "range expected 1 to 3 arguments, got %d", a->n_pos);
    for (int i = 0; i < a->n_pos; i++) {
        if (a->pos[i]->kind != JV_INT && a->pos[i]->kind != JV_BOOL)
            jx_fail(r->c, "range: '%s' object cannot be interpreted as an integer", jv_type_name(a->pos[i]));
        x[a->n_pos == 1 ? 1 : i] = a->pos[i]->kind == JV_INT ? a->pos[i]->u.i : a->pos[i]->u.b;
    }
    if (x[2] == 0)
        jx_fail(r->c, "range() arg 3 must not be zero");
    __int128 span = (__int128)x[1] - x[0];
    __int128 n = x[2] > 0 ? (span > 0 ? (span + x[2] - 1) / x[2] : 0) : (span < 0 ? (-span + (-x[2]) - 1) / -x[2] : 0);
    if (n > JX_MAX_RANGE)
        jx_fail(r->c, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", JX_MAX_RANGE);
    llm_jv *out = jv_list(r->c, (size_t)n);
    for (long long i = 0; i < (long long)n; i++) jv_push(r->c, out, jv_int(r->c, x[0] + i * x[2]));
    return out;
}

static llm_jv *g_namespace(jx_run *r, llm_jv *self, const jx_args *a)
{
    (void)self;
    llm_jv *ns = jv_new(r->c, JV_NS);
    for (int i = 0; i < a->n_pos; i++) {
        if (a->pos[i]->kind != JV_DICT)
            jx_fail(r->c, "namespace: positional arguments must be dicts");
        for (size_t k = 0; k < a->pos[i]->u.dict.n; k++)
            jv_dict_set(r->c, ns, a->pos[i]->u.dict.e[k].key, a->pos[i]->u.dict.e[k].val);
    }
    for (int i = 0; i < a->n_kw; i++) jv_dict_set(r->c, ns, jv_cstr(r->c, a->kw_names[i]), a->kw[i]);
    return ns;
}

static llm_jv *g_dict(jx_run *r, llm_jv *self, const jx_args *a)
{
    llm_jv *ns = g_namespace(r, self, a);
    ns->kind = JV_DICT;
    return ns;
}

static llm_jv *g_raise_exception(jx_run *r, llm_jv *self, const jx_args *a)
{
    (void)self;
    llm_jv *m = a->n_pos ? jv_to_str(r->c, a->pos[0]) : jv_cstr(r->c, "");
    jx_fail(r->c, "%.*s", (int)(m->u.str.n > 400 ? 400 : m->u.str.n), m->u.str.s);
}

static llm_jv *g_strftime_now(jx_run *r, llm_jv *self, const jx_args *a)
{
    (void)self;
    llm_jv *f = want_str(r, arg(a, 0, "format"), "strftime_now");
    if (f->u.str.n > 200)
        jx_fail(r->c, "strftime_now: a format over 200 bytes");
    char fmt[256];
    size_t cap = 16384; /* 200 bytes of conversions, each at most a few dozen characters */
    char *out = jx_alloc(r->c, cap);
    memcpy(fmt, f->u.str.s, f->u.str.n);
    fmt[f->u.str.n] = 0;
    time_t now = r->c->lim.now > 0 ? (time_t)r->c->lim.now : time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm))
        jx_fail(r->c, "strftime_now: no local time");
    size_t n = strftime(out, cap, fmt, &tm);
    return jv_str(r->c, out, n, NULL);
}

static const named_fn GLOBALS[] = {{"range", g_range}, {"namespace", g_namespace}, {"dict", g_dict},
                                   {"raise_exception", g_raise_exception}, {"strftime_now", g_strftime_now},
                                   {NULL, NULL}};

jx_builtin jx_global_fn(const char *name)
{
    return find_fn(GLOBALS, name);
}
