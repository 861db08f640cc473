/* grammar.c - GBNF-like text to the compiled form of grammar_impl.h.
 *
 * A recursive-descent parser: groups and repetitions become rules of
 * their own (X* is R ::= X R | "", X+ is R ::= X R | X, X? is
 * R ::= X | "", X{m,n} is m copies then a chain of optional ones), so the
 * matcher only ever sees characters, rule references and ends. Then the
 * checks a matcher relies on: every rule defined, and no left recursion
 * (a rule that can reach itself before consuming a character would make
 * the matcher's expansion endless). Written here rather than taken from
 * llama.cpp: its parser is C++ and tied to its sampler. */
#include "grammar_impl.h"
#include "llm/hash.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct gvec {
    gel *v;
    int n, cap;
} gvec;

typedef struct prule {
    const char *name; /* into the text; NULL for a synthesized rule */
    int name_len;
    int defined;
    const char *used_at; /* first reference (a synthesized rule: where it was made), for errors */
    gvec *alts;
    int n_alts, cap_alts;
} prule;

#define GP_NAME_SLOTS (2 * LLM_GRAMMAR_MAX_RULES) /* open addressing, at most half full */

typedef struct gparse {
    const char *text, *end, *at;
    prule *rules;
    int n_rules, cap_rules;
    int32_t *names;  /* (n_slots) named rules by hash of the name, -1 free: a lookup costs no scan */
    int n_slots;
    gclass *cls;
    int n_cls, cap_cls;
    grange *rng;
    int n_rng, cap_rng;
    long n_el;
    int depth;
    llm_error *err;
    llm_status st;
} gparse;

/* ---- errors and growth ------------------------------------------------------------ */

static void gp_where(const gparse *p, const char *at, int *line, int *col)
{
    *line = 1, *col = 1;
    for (const char *c = p->text; c < at && c < p->end; c++) {
        if (*c == '\n')
            ++*line, *col = 1;
        else
            ++*col;
    }
}

/* Records the first failure (the status is returned by the caller). */
static int gp_fail(gparse *p, llm_status st, const char *at, const char *fmt, ...)
{
    if (p->st)
        return -1;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    gp_where(p, at, &line, &col);
    p->st = llm_errf(p->err, st, "grammar: line %d, column %d: %s", line, col, msg);
    return -1;
}

static int gp_nomem(gparse *p) { return gp_fail(p, LLM_ERR_NOMEM, p->at, "no memory"); }

/* grammar_grow, recording the failure. */
static int gp_grow(gparse *p, void **v, int n, int *cap, size_t sz)
{
    return grammar_grow(v, n, cap, sz, 8) ? gp_nomem(p) : 0;
}

static int gvec_push(gparse *p, gvec *a, gel e)
{
    if (++p->n_el > LLM_GRAMMAR_MAX_ELEMENTS)
        return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "more than %d elements once repetitions are expanded",
                       LLM_GRAMMAR_MAX_ELEMENTS);
    if (gp_grow(p, (void **)&a->v, a->n, &a->cap, sizeof *a->v))
        return -1;
    a->v[a->n++] = e;
    return 0;
}

/* ---- rules ------------------------------------------------------------------------ */

static int gp_rule_new(gparse *p, const char *name, int len)
{
    if (p->n_rules >= LLM_GRAMMAR_MAX_RULES)
        return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "more than %d rules (with those groups and repetitions make)",
                       LLM_GRAMMAR_MAX_RULES);
    if (gp_grow(p, (void **)&p->rules, p->n_rules, &p->cap_rules, sizeof *p->rules))
        return -1;
    p->rules[p->n_rules] = (prule){.name = name, .name_len = len, .used_at = name ? NULL : p->at};
    return p->n_rules++;
}

static int gp_rule_id(gparse *p, const char *name, int len)
{
    /* keyed (llm/hash.h): a request's grammar names its rules, and must not pick colliding names */
    uint32_t h = (uint32_t)llm_hash(name, (size_t)len);
    for (uint32_t k = h % (uint32_t)p->n_slots;; k = (k + 1) % (uint32_t)p->n_slots) {
        int32_t r = p->names[k];
        if (r < 0) {
            if ((r = gp_rule_new(p, name, len)) >= 0)
                p->names[k] = r;
            return r;
        }
        if (p->rules[r].name_len == len && !memcmp(p->rules[r].name, name, (size_t)len))
            return r;
    }
}

/* Adds alternative a (taken over) to rule r. */
static int gp_add_alt(gparse *p, int r, gvec *a)
{
    prule *pr = &p->rules[r];
    if (gvec_push(p, a, (gel){GEL_END, 0}) ||
        gp_grow(p, (void **)&pr->alts, pr->n_alts, &pr->cap_alts, sizeof *pr->alts)) {
        free(a->v);
        *a = (gvec){0};
        return -1;
    }
    pr->alts[pr->n_alts++] = *a;
    *a = (gvec){0};
    return 0;
}

/* A synthesized rule whose one alternative is the n elements of a (copied),
 * with an empty second alternative when optional; its index or -1. */
static int gp_rule_of(gparse *p, const gel *a, int n, int optional)
{
    int r = gp_rule_new(p, NULL, 0);
    gvec x = {0}, y = {0};
    if (r < 0)
        return -1;
    for (int i = 0; i < n; i++)
        if (gvec_push(p, &x, a[i])) {
            free(x.v);
            return -1;
        }
    if (gp_add_alt(p, r, &x) || (optional && gp_add_alt(p, r, &y)))
        return -1;
    return r;
}

/* ---- lexing ----------------------------------------------------------------------- */

static void gp_ws(gparse *p)
{
    while (p->at < p->end) {
        if (*p->at == '#') {
            while (p->at < p->end && *p->at != '\n') p->at++;
        } else if (*p->at == ' ' || *p->at == '\t' || *p->at == '\n' || *p->at == '\r') {
            p->at++;
        } else {
            break;
        }
    }
}

static int gp_is_name(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static int gp_name_len(const gparse *p)
{
    int n = 0;
    while (p->at + n < p->end && gp_is_name(p->at[n])) n++;
    return n;
}

/* 1 when the text at p->at is `name ::=` (a new definition). */
static int gp_at_definition(gparse *p)
{
    const char *save = p->at;
    int n = gp_name_len(p);
    p->at += n;
    gp_ws(p);
    int yes = n > 0 && p->end - p->at >= 3 && !memcmp(p->at, "::=", 3);
    p->at = save;
    return yes;
}

static int gp_hex(gparse *p, int digits, uint32_t *cp)
{
    *cp = 0;
    for (int i = 0; i < digits; i++, p->at++) {
        char c = p->at < p->end ? *p->at : 0;
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (v < 0)
            return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "escape needs %d hex digits", digits);
        *cp = *cp * 16 + (uint32_t)v;
    }
    return *cp > 0x10FFFF ? gp_fail(p, LLM_ERR_GRAMMAR, p->at, "code point above U+10FFFF") : 0;
}

/* One UTF-8 character of the grammar text. */
static int gp_utf8(gparse *p, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)p->at;
    int n = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (!n || p->end - p->at < n)
        return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "invalid UTF-8");
    *cp = n == 1 ? s[0] : s[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "invalid UTF-8");
        *cp = (*cp << 6) | (s[i] & 0x3F);
    }
    if (*cp < min[n] || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF))
        return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "invalid UTF-8");
    p->at += n;
    return 0;
}

/* One character of a literal or class, escapes decoded. */
static int gp_char(gparse *p, uint32_t *cp)
{
    if (p->at >= p->end)
        return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "unterminated literal or class");
    if (*p->at != '\\')
        return gp_utf8(p, cp);
    if (++p->at >= p->end)
        return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "unterminated escape");
    char c = *p->at++;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'x': return gp_hex(p, 2, cp);
    case 'u': return gp_hex(p, 4, cp);
    case 'U': return gp_hex(p, 8, cp);
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '.': case '/': *cp = (uint32_t)c; return 0;
    default: return gp_fail(p, LLM_ERR_GRAMMAR, p->at - 2, "unknown escape '\\%c'", c);
    }
}

/* ---- classes ---------------------------------------------------------------------- */

static int grange_cmp(const void *a, const void *b)
{
    uint32_t x = ((const grange *)a)->lo, y = ((const grange *)b)->lo;
    return x < y ? -1 : x > y;
}

/* Whether a class of the k sorted, merged, disjoint ranges r (negated:
 * what they leave out) holds no character: none of U+0000-U+D7FF and
 * U+E000-U+10FFFF. An element that can never match would let a mask allow
 * the token that reaches it, and the next mask then allow no token. (A
 * surrogate escape may still end a range or stand in a negated class, as
 * in [^\uD800-\uDFFF]: only a class of nothing else is refused.) */
static int gp_class_empty(const grange *r, int k, int neg)
{
    int low = 0, high = 0; /* some range meets (neg: covers) [0, D7FF], [E000, 10FFFF] */
    for (int i = 0; i < k; i++) {
        low |= neg ? r[i].lo == 0 && r[i].hi >= 0xD7FF : r[i].lo <= 0xD7FF;
        high |= neg ? r[i].lo <= 0xE000 && r[i].hi >= 0x10FFFF : r[i].hi >= 0xE000;
    }
    return neg ? low && high : !low && !high;
}

/* A class of the n ranges in r (sorted and merged here); its index. */
static int gp_class_add(gparse *p, grange *r, int n, int neg)
{
    if (n > 1)
        qsort(r, (size_t)n, sizeof *r, grange_cmp);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k && r[i].lo <= r[k - 1].hi + 1) {
            if (r[i].hi > r[k - 1].hi)
                r[k - 1].hi = r[i].hi;
        } else {
            r[k++] = r[i];
        }
    }
    if (gp_class_empty(r, k, neg))
        return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "a class that matches no character (UTF-8 has no surrogates)");
    if (gp_grow(p, (void **)&p->cls, p->n_cls, &p->cap_cls, sizeof *p->cls))
        return -1;
    p->cls[p->n_cls] = (gclass){p->n_rng, k, neg};
    for (int i = 0; i < k; i++) {
        if (gp_grow(p, (void **)&p->rng, p->n_rng, &p->cap_rng, sizeof *p->rng))
            return -1;
        p->rng[p->n_rng++] = r[i];
    }
    return p->n_cls++;
}

/* [...] after the '['. */
static int gp_class(gparse *p, gvec *out)
{
    int neg = p->at < p->end && *p->at == '^', n = 0, cap = 0, c = -1;
    grange *r = NULL;
    p->at += neg;
    while (!p->st && (p->at >= p->end || *p->at != ']')) {
        uint32_t lo, hi;
        if (gp_char(p, &lo))
            break;
        hi = lo;
        if (p->end - p->at >= 2 && p->at[0] == '-' && p->at[1] != ']') {
            p->at++;
            if (gp_char(p, &hi))
                break;
            if (hi < lo && gp_fail(p, LLM_ERR_GRAMMAR, p->at, "class range U+%04X-U+%04X is reversed", lo, hi))
                break;
        }
        if (gp_grow(p, (void **)&r, n, &cap, sizeof *r))
            break;
        r[n++] = (grange){lo, hi};
    }
    if (!p->st) {
        p->at++; /* ']' */
        c = gp_class_add(p, r, n, neg);
    }
    free(r);
    return c < 0 ? -1 : gvec_push(p, out, (gel){GEL_CHAR, c});
}

/* "..." after the '"': one element per character. */
static int gp_literal(gparse *p, gvec *out)
{
    while (p->at >= p->end || *p->at != '"') {
        uint32_t cp;
        if (gp_char(p, &cp))
            return -1;
        grange r = {cp, cp};
        int c = gp_class_add(p, &r, 1, 0);
        if (c < 0 || gvec_push(p, out, (gel){GEL_CHAR, c}))
            return -1;
    }
    p->at++;
    return 0;
}

/* ---- sequences and repetitions ------------------------------------------------------ */

static int gp_alternation(gparse *p, int rule);

/* A primary (literal, class, any, group, rule name) appended to out. */
static int gp_primary(gparse *p, gvec *out)
{
    char c = *p->at;
    if (c == '"' || c == '[') {
        p->at++;
        return c == '"' ? gp_literal(p, out) : gp_class(p, out);
    }
    if (c == '.') {
        p->at++;
        int k = gp_class_add(p, NULL, 0, 1);
        return k < 0 ? -1 : gvec_push(p, out, (gel){GEL_CHAR, k});
    }
    if (c == '(') {
        const char *open = p->at++;
        if (++p->depth > LLM_GRAMMAR_MAX_NESTING)
            return gp_fail(p, LLM_ERR_GRAMMAR, open, "groups nested deeper than %d", LLM_GRAMMAR_MAX_NESTING);
        int r = gp_rule_new(p, NULL, 0);
        if (r < 0 || gp_alternation(p, r))
            return -1;
        if (p->at >= p->end || *p->at != ')')
            return gp_fail(p, LLM_ERR_GRAMMAR, open, "'(' is not closed");
        p->at++;
        p->depth--;
        return gvec_push(p, out, (gel){GEL_REF, r});
    }
    int n = gp_name_len(p);
    if (!n)
        return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "unexpected '%c'", c);
    int r = gp_rule_id(p, p->at, n);
    if (r < 0)
        return -1;
    if (!p->rules[r].used_at)
        p->rules[r].used_at = p->at;
    p->at += n;
    return gvec_push(p, out, (gel){GEL_REF, r});
}

static int gp_count(gparse *p, long *v)
{
    char *end;
    if (p->at >= p->end || *p->at < '0' || *p->at > '9')
        return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "repetition needs a count");
    *v = strtol(p->at, &end, 10); /* the text ends in a NUL (compile copies it) */
    if (*v > LLM_GBNF_MAX_REPEAT)
        return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "repetition count above %d", LLM_GBNF_MAX_REPEAT);
    p->at = end;
    return 0;
}

/* {m}, {m,}, {m,n} after the '{': *max -1 for unbounded. */
static int gp_braces(gparse *p, long *min, long *max)
{
    const char *open = p->at - 1;
    gp_ws(p);
    if (gp_count(p, min))
        return -1;
    gp_ws(p);
    *max = *min;
    if (p->at < p->end && *p->at == ',') {
        p->at++;
        gp_ws(p);
        *max = -1;
        if (p->at < p->end && *p->at != '}' && gp_count(p, max))
            return -1;
        gp_ws(p);
    }
    if (p->at >= p->end || *p->at != '}')
        return gp_fail(p, LLM_ERR_GRAMMAR, open, "'{' is not closed");
    p->at++;
    if (*max >= 0 && *max < *min)
        return gp_fail(p, LLM_ERR_GRAMMAR, open, "repetition {%ld,%ld} has max below min", *min, *max);
    return 0;
}

/* u repeated min..max times (max -1: unbounded) appended to out. */
static int gp_repeat(gparse *p, gel u, long min, long max, gvec *out)
{
    for (long i = 0; i < min; i++)
        if (gvec_push(p, out, u))
            return -1;
    if (max < 0) { /* R ::= u R | "" */
        int r = gp_rule_new(p, NULL, 0);
        gel body[2] = {u, {GEL_REF, r}};
        gvec a = {0}, b = {0};
        if (r < 0 || gvec_push(p, &a, body[0]) || gvec_push(p, &a, body[1]) || gp_add_alt(p, r, &a) ||
            gp_add_alt(p, r, &b)) {
            free(a.v);
            return -1;
        }
        return gvec_push(p, out, (gel){GEL_REF, r});
    }
    int prev = -1; /* O_k ::= u O_(k-1) | "" */
    for (long k = 0; k < max - min; k++) {
        gel body[2] = {u, {GEL_REF, prev}};
        if ((prev = gp_rule_of(p, body, prev < 0 ? 1 : 2, 1)) < 0)
            return -1;
    }
    return prev < 0 ? 0 : gvec_push(p, out, (gel){GEL_REF, prev});
}

/* An item: a primary and its postfix operator, if any. */
static int gp_item(gparse *p, gvec *out)
{
    gvec one = {0};
    if (gp_primary(p, &one)) {
        free(one.v);
        return -1;
    }
    const char *save = p->at;
    gp_ws(p);
    char op = p->at < p->end ? *p->at : 0;
    if (op != '*' && op != '+' && op != '?' && op != '{') {
        p->at = save;
        int rc = 0;
        p->n_el -= one.n; /* moved, not made: counted once */
        for (int i = 0; i < one.n && !rc; i++) rc = gvec_push(p, out, one.v[i]);
        free(one.v);
        return rc;
    }
    p->at++;
    gel u = one.n == 1 ? one.v[0] : (gel){GEL_REF, gp_rule_of(p, one.v, one.n, 0)};
    free(one.v);
    long min = op == '+', max = op == '?' ? 1 : -1;
    if (u.arg < 0 || (op == '{' && gp_braces(p, &min, &max)))
        return -1;
    return gp_repeat(p, u, min, max, out);
}

static int gp_sequence(gparse *p, gvec *out)
{
    for (;;) {
        gp_ws(p);
        if (p->at >= p->end || *p->at == '|' || *p->at == ')' || (p->depth == 0 && gp_at_definition(p)))
            return 0;
        if (gp_item(p, out))
            return -1;
    }
}

static int gp_alternation(gparse *p, int rule)
{
    for (;;) {
        gvec seq = {0};
        if (gp_sequence(p, &seq) || gp_add_alt(p, rule, &seq)) {
            free(seq.v);
            return -1;
        }
        if (p->at >= p->end || *p->at != '|')
            return 0;
        p->at++;
    }
}

static int gp_definition(gparse *p)
{
    const char *at = p->at;
    int n = gp_name_len(p);
    int r = gp_rule_id(p, at, n);
    if (r < 0)
        return -1;
    if (p->rules[r].defined)
        return gp_fail(p, LLM_ERR_GRAMMAR, at, "rule '%.*s' is defined twice", n, at);
    p->rules[r].defined = 1;
    p->at += n;
    gp_ws(p);
    p->at += 3; /* "::=" */
    if (gp_alternation(p, r))
        return -1;
    if (p->at < p->end && *p->at == ')')
        return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "')' without '('");
    return 0;
}

static int gp_grammar(gparse *p)
{
    gp_ws(p);
    while (p->at < p->end) {
        if (!gp_at_definition(p))
            return gp_fail(p, LLM_ERR_GRAMMAR, p->at, "expected a rule definition 'name ::= ...'");
        if (gp_definition(p))
            return -1;
        gp_ws(p);
    }
    return 0;
}

/* ---- checks and the compiled form ------------------------------------------------- */

static void gp_free(gparse *p)
{
    for (int i = 0; i < p->n_rules; i++) {
        for (int k = 0; k < p->rules[i].n_alts; k++) free(p->rules[i].alts[k].v);
        free(p->rules[i].alts);
    }
    free(p->rules);
    free(p->names);
    free(p->cls);
    free(p->rng);
}

static int gp_check_defined(gparse *p)
{
    for (int i = 0; i < p->n_rules; i++)
        if (p->rules[i].name && !p->rules[i].defined)
            return gp_fail(p, LLM_ERR_GRAMMAR, p->rules[i].used_at ? p->rules[i].used_at : p->end,
                           "rule '%.*s' is used but never defined", p->rules[i].name_len, p->rules[i].name);
    return 0;
}

/* Moves the parsed rules into g's flat arrays. */
static int gp_flatten(gparse *p, llm_grammar *g)
{
    int n_alt = 0;
    for (int i = 0; i < p->n_rules; i++) n_alt += p->rules[i].n_alts;
    g->el = malloc(sizeof *g->el * (size_t)(p->n_el > 0 ? p->n_el : 1));
    g->alt = malloc(sizeof *g->alt * (size_t)(n_alt ? n_alt : 1));
    g->rule_alt = malloc(sizeof *g->rule_alt * (size_t)(p->n_rules + 1));
    if (!g->el || !g->alt || !g->rule_alt)
        return gp_nomem(p);
    for (int i = 0; i < p->n_rules; i++) {
        g->rule_alt[i] = g->n_alt;
        for (int k = 0; k < p->rules[i].n_alts; k++) {
            const gvec *a = &p->rules[i].alts[k];
            g->alt[g->n_alt++] = g->n_el;
            memcpy(g->el + g->n_el, a->v, sizeof *a->v * (size_t)a->n);
            g->n_el += a->n;
        }
    }
    g->rule_alt[p->n_rules] = g->n_alt;
    g->n_rule = p->n_rules;
    g->cls = p->cls, g->n_cls = p->n_cls, p->cls = NULL;
    g->rng = p->rng, g->n_rng = p->n_rng, p->rng = NULL;
    return 0;
}

/* nullable[r]: rule r can match the empty string. A worklist: each
 * alternative counts its references not yet known nullable, and a rule
 * found nullable decrements the alternatives that mention it, so the work
 * is linear in the elements (a fixed point over all rules is quadratic on
 * a chain of rules). -1 on no memory. */
static int g_nullable(const llm_grammar *g, unsigned char *nullable)
{
    int n_alt = g->n_alt, n_rule = g->n_rule, rc = -1;
    int *cnt = calloc((size_t)n_alt + 1, sizeof(int)), *of = malloc(sizeof(int) * ((size_t)n_alt + 1));
    int *occ_at = calloc((size_t)n_rule + 2, sizeof(int)), *occ = malloc(sizeof(int) * ((size_t)g->n_el + 1));
    int *queue = malloc(sizeof(int) * ((size_t)n_rule + 1)), qh = 0, qt = 0;
    if (!cnt || !of || !occ_at || !occ || !queue)
        goto out;
    for (int r = 0; r < n_rule; r++) /* of[a]: a's rule; cnt[a]: its references, -1 with a character */
        for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            of[a] = r;
            for (int pos = g->alt[a]; g->el[pos].type != GEL_END && cnt[a] >= 0; pos++)
                cnt[a] = g->el[pos].type == GEL_CHAR ? -1 : cnt[a] + 1;
        }
    for (int a = 0; a < n_alt; a++) /* occurrences counted only in alternatives without characters */
        for (int pos = g->alt[a]; cnt[a] > 0 && g->el[pos].type == GEL_REF; pos++) occ_at[g->el[pos].arg + 1]++;
    for (int r = 0; r < n_rule; r++) occ_at[r + 1] += occ_at[r];
    for (int a = 0; a < n_alt; a++) /* occ: the alternatives mentioning each rule, by rule */
        for (int pos = g->alt[a]; cnt[a] > 0 && g->el[pos].type == GEL_REF; pos++) occ[occ_at[g->el[pos].arg]++] = a;
    for (int r = n_rule; r > 0; r--) occ_at[r] = occ_at[r - 1]; /* back to starts */
    occ_at[0] = 0;
    for (int a = 0; a < n_alt; a++)
        if (cnt[a] == 0 && !nullable[of[a]])
            nullable[of[a]] = 1, queue[qt++] = of[a];
    while (qh < qt) {
        int r = queue[qh++];
        for (int k = occ_at[r]; k < occ_at[r + 1]; k++)
            if (--cnt[occ[k]] == 0 && !nullable[of[occ[k]]])
                nullable[of[occ[k]]] = 1, queue[qt++] = of[occ[k]];
    }
    rc = 0;
out:
    free(cnt), free(of), free(occ_at), free(occ), free(queue);
    return rc;
}

/* The rules r can reach before consuming a character, into out; their count. */
static int g_left_edges(const llm_grammar *g, const unsigned char *nullable, int r, int *out)
{
    int n = 0;
    for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
        for (int pos = g->alt[a]; g->el[pos].type == GEL_REF; pos++) {
            out[n++] = g->el[pos].arg;
            if (!nullable[g->el[pos].arg])
                break;
        }
    return n;
}

/* A rule that reaches itself before consuming a character, or -1.
 * Iterative depth-first search (rules may be many: no deep recursion). */
static int g_left_recursive(const llm_grammar *g, const unsigned char *nullable, int *state, int *stack, int *edges,
                            int *edge_at, int *edge_n)
{
    int n_edges = 0;
    for (int r = 0; r < g->n_rule; r++) {
        edge_at[r] = n_edges;
        n_edges += g_left_edges(g, nullable, r, edges + n_edges);
        edge_n[r] = n_edges - edge_at[r];
    }
    for (int s = 0; s < g->n_rule; s++) {
        if (state[s])
            continue;
        int top = 0;
        stack[top++] = s, state[s] = 1;
        while (top) {
            int r = stack[top - 1];
            if (edge_n[r] == 0) {
                state[r] = 2, top--;
                continue;
            }
            int t = edges[edge_at[r] + --edge_n[r]];
            if (state[t] == 1)
                return t;
            if (!state[t])
                stack[top++] = t, state[t] = 1;
        }
    }
    return -1;
}

static int gp_check_left(gparse *p, const llm_grammar *g)
{
    size_t n = (size_t)g->n_rule;
    unsigned char *nullable = calloc(n, 1);
    int *state = calloc(n, sizeof(int)), *stack = malloc(sizeof(int) * n);
    int *edges = malloc(sizeof(int) * (size_t)(g->n_el + 1)), *at = malloc(sizeof(int) * n), *cnt = malloc(sizeof(int) * n);
    int rc = nullable && state && stack && edges && at && cnt ? 0 : gp_nomem(p);
    if (!rc && g_nullable(g, nullable))
        rc = gp_nomem(p);
    if (!rc) {
        int r = g_left_recursive(g, nullable, state, stack, edges, at, cnt);
        const prule *pr = r >= 0 ? &p->rules[r] : NULL;
        if (pr)
            rc = gp_fail(p, LLM_ERR_GRAMMAR, pr->name ? pr->name : pr->used_at ? pr->used_at : p->end,
                         "%s%.*s%s is left-recursive (it can reach itself before matching a character)",
                         pr->name ? "rule '" : "a group or repetition", pr->name ? pr->name_len : 0, pr->name ? pr->name : "",
                         pr->name ? "'" : "");
    }
    free(nullable), free(state), free(stack), free(edges), free(at), free(cnt);
    return rc;
}

llm_status llm_grammar_compile(const char *text, size_t len, const char *root, llm_grammar **out, llm_error *err)
{
    *out = NULL;
    if (len > LLM_GBNF_MAX_BYTES)
        return llm_errf(err, LLM_ERR_GRAMMAR, "grammar: %zu bytes (at most %u)", len, LLM_GBNF_MAX_BYTES);
    char *copy = malloc(len + 1); /* NUL-terminated for strtol */
    llm_grammar *g = calloc(1, sizeof *g);
    if (!copy || !g) {
        free(copy), free(g);
        return llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory");
    }
    memcpy(copy, text, len);
    copy[len] = 0;
    gparse p = {.text = copy, .end = copy + len, .at = copy, .err = err};
    const char *rn = root ? root : "root";
    p.n_slots = len + 64 < GP_NAME_SLOTS ? (int)len + 64 : GP_NAME_SLOTS; /* named rules <= len / 2: at most half full */
    if (!(p.names = malloc(sizeof *p.names * (size_t)p.n_slots)))
        gp_nomem(&p);
    else
        memset(p.names, 0xff, sizeof *p.names * (size_t)p.n_slots);
    if (!p.st && memchr(copy, 0, len))
        gp_fail(&p, LLM_ERR_GRAMMAR, memchr(copy, 0, len), "NUL byte in the grammar");
    g->root = -1;
    if (!p.st && !gp_grammar(&p)) {
        for (int i = 0; i < p.n_rules && g->root < 0; i++)
            if (p.rules[i].name && p.rules[i].name_len == (int)strlen(rn) && !memcmp(p.rules[i].name, rn, strlen(rn)))
                g->root = i;
        if (g->root < 0)
            gp_fail(&p, LLM_ERR_GRAMMAR, p.end, "no rule named '%.64s'", rn);
        else if (!gp_check_defined(&p) && !gp_flatten(&p, g) && !gp_check_left(&p, g) && grammar_cost_build(g))
            p.st = llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory for the cost table of %d positions", g->n_el);
    }
    gp_free(&p);
    free(copy);
    if (p.st) {
        llm_grammar_free(g);
        return p.st;
    }
    static _Atomic uint64_t next_id;
    g->id = atomic_fetch_add(&next_id, 1) + 1;
    *out = g;
    return LLM_OK;
}

void llm_grammar_free(llm_grammar *g)
{
    if (!g)
        return;
    free(g->el);
    free(g->alt);
    free(g->rule_alt);
    free(g->rest);
    free(g->cls);
    free(g->rng);
    free(g);
}
