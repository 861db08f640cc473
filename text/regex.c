/* regex.c - JSON Schema "pattern"s (llm/regex.h): a recursive-descent
 * parser of the ECMA-262 subset that writes grammar elements as it goes.
 * Characters are written as a JSON string holds them (raw where JSON
 * allows, else escaped), so the elements match the string's text. */
#include "llm/regex.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/gbnf.h"

#define RX_MAX_DEPTH LLM_REGEX_MAX_DEPTH

/* The parser's place in the pattern. */
typedef struct rx {
    const char *p, *end;
    int depth, top_alt;
    char *why;       /* the first failure's message */
    size_t why_n;
} rx;

/* Keeps the first failure's message; returns -1. */
static int rx_failf(rx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rx_failf(rx *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (!r->why[0])
        vsnprintf(r->why, r->why_n, fmt, ap);
    va_end(ap);
    return -1;
}

static int rx_fail(rx *r, const char *what) { return rx_failf(r, "pattern: %s is not supported", what); }

/* s (2 bytes: an escape such as \n) as a grammar literal. */
static void rx_lit(llm_strbuf *b, const char *s)
{
    llm_strbuf_append(b, "\"", 1);
    for (int i = 0; i < 2; i++) {
        if (s[i] == '"' || s[i] == '\\')
            llm_strbuf_append(b, "\\", 1);
        llm_strbuf_append(b, s + i, 1);
    }
    llm_strbuf_append(b, "\"", 1);
}

#define RX_CSET_MAX 64

typedef struct rx_cset {
    uint32_t lo[RX_CSET_MAX], hi[RX_CSET_MAX];
    int n, over;
} rx_cset;

static void cset_add(rx_cset *c, uint32_t lo, uint32_t hi)
{
    if (c->n == RX_CSET_MAX) {
        c->over = 1;
        return;
    }
    c->lo[c->n] = lo, c->hi[c->n++] = hi;
}

/* Sorted, merged. */
static void cset_norm(rx_cset *c)
{
    for (int i = 1; i < c->n; i++) /* insertion sort: a handful of ranges */
        for (int j = i; j > 0 && c->lo[j - 1] > c->lo[j]; j--) {
            uint32_t l = c->lo[j], h = c->hi[j];
            c->lo[j] = c->lo[j - 1], c->hi[j] = c->hi[j - 1];
            c->lo[j - 1] = l, c->hi[j - 1] = h;
        }
    int k = 0;
    for (int i = 0; i < c->n; i++) {
        if (k && c->lo[i] <= c->hi[k - 1] + 1) {
            c->hi[k - 1] = c->hi[i] > c->hi[k - 1] ? c->hi[i] : c->hi[k - 1];
        } else {
            c->lo[k] = c->lo[i], c->hi[k++] = c->hi[i];
        }
    }
    c->n = k;
}

static void cset_complement(rx_cset *c)
{
    rx_cset r = {0};
    uint32_t at = 0;
    cset_norm(c);
    for (int i = 0; i < c->n; i++) {
        if (c->lo[i] > at)
            cset_add(&r, at, c->lo[i] - 1);
        at = c->hi[i] + 1;
    }
    if (at <= 0x10FFFF)
        cset_add(&r, at, 0x10FFFF);
    r.over |= c->over;
    *c = r;
}

static int cset_has(const rx_cset *c, uint32_t cp)
{
    for (int i = 0; i < c->n; i++)
        if (cp >= c->lo[i] && cp <= c->hi[i])
            return 1;
    return 0;
}

/* Adds [lo, hi] minus what a JSON string cannot hold raw (controls, '"'
 * and '\\') and the surrogates, which no JSON text holds as characters
 * (a class left with nothing is refused: it could never match). */
static void cset_add_clean(rx_cset *ok, uint32_t lo, uint32_t hi)
{
    static const uint32_t cut[2] = {'"', '\\'};
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800)
            cset_add_clean(ok, lo, 0xD7FF);
        if (hi > 0xDFFF)
            cset_add_clean(ok, 0xE000, hi);
        return;
    }
    lo = lo < 0x20 ? 0x20 : lo;
    for (int k = 0; k < 2 && lo <= hi; k++)
        if (cut[k] >= lo && cut[k] <= hi) {
            if (cut[k] > lo)
                cset_add(ok, lo, cut[k] - 1);
            lo = cut[k] + 1;
        }
    if (lo <= hi)
        cset_add(ok, lo, hi);
}

/* The characters of c as they appear inside a JSON string: raw where JSON
 * allows, escaped for '"', '\\' and the common control characters (the
 * others cannot be produced: a narrower language, never a wrong one). */
static int rx_emit_cset(rx *r, llm_strbuf *b, rx_cset *c)
{
    static const struct { uint32_t cp; const char *esc; } special[] = {
        {'"', "\\\""}, {'\\', "\\\\"}, {'\n', "\\n"}, {'\t', "\\t"}, {'\r', "\\r"}};
    cset_norm(c);
    if (c->over)
        return rx_failf(r, "pattern: a class has more than %d ranges", RX_CSET_MAX);
    int alts = 0;
    llm_strbuf_append(b, "( ", 2);
    rx_cset ok = {0};
    for (int i = 0; i < c->n; i++) cset_add_clean(&ok, c->lo[i], c->hi[i]);
    if (ok.n) {
        llm_strbuf_append(b, "[", 1);
        for (int i = 0; i < ok.n; i++) llm_strbuf_printf(b, "\\U%08X-\\U%08X", ok.lo[i], ok.hi[i]);
        llm_strbuf_append(b, "] ", 2);
        alts++;
    }
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        if (cset_has(c, special[i].cp)) {
            if (alts++)
                llm_strbuf_append(b, "| ", 2);
            rx_lit(b, special[i].esc);
            llm_strbuf_append(b, " ", 1);
        }
    llm_strbuf_append(b, ")", 1);
    return alts ? 0 : rx_failf(r, "pattern: a class matches no character a JSON string can hold");
}



static int rx_alt(rx *r, llm_strbuf *b);


/* One UTF-8 character of the pattern (jansson gave valid UTF-8). */
static uint32_t rx_utf8(rx *r)
{
    const unsigned char *s = (const unsigned char *)r->p;
    int n = s[0] < 0x80 ? 1 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? s[0] : s[0] & (0x7Fu >> n);
    for (int i = 1; i < n && r->p + i < r->end; i++) cp = (cp << 6) | (s[i] & 0x3F);
    r->p += n;
    return cp;
}

/* c cut to ASCII. \d, \w and \s are ASCII in ECMA-262 but Unicode in
 * Python's re (what validators such as jsonschema run): a complement of
 * them is taken within ASCII, which is inside both readings. */
static void cset_ascii(rx_cset *c)
{
    int k = 0;
    for (int i = 0; i < c->n; i++)
        if (c->lo[i] <= 0x7F)
            c->lo[k] = c->lo[i], c->hi[k++] = c->hi[i] > 0x7F ? 0x7F : c->hi[i];
    c->n = k;
}

/* \d \w \s and their negations into cs: 1 when c was one of them. */
static int rx_class_escape(char c, rx_cset *cs)
{
    rx_cset t = {0};
    char lc = (char)(c | 0x20);
    if (lc == 'd')
        cset_add(&t, '0', '9');
    else if (lc == 'w')
        cset_add(&t, '0', '9'), cset_add(&t, 'A', 'Z'), cset_add(&t, 'a', 'z'), cset_add(&t, '_', '_');
    else if (lc == 's')
        cset_add(&t, '\t', '\r'), cset_add(&t, ' ', ' ');
    else
        return 0;
    if (c != lc)
        cset_complement(&t), cset_ascii(&t);
    for (int i = 0; i < t.n; i++) cset_add(cs, t.lo[i], t.hi[i]);
    return 1;
}

/* Exactly four hex digits at r->p into *v (strtoul would take signs,
 * spaces and 0x). */
static int rx_hex4(rx *r, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++, r->p++) {
        char h = r->p < r->end ? *r->p : 0;
        int d = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
        if (d < 0)
            return rx_fail(r, "a \\u escape without 4 hex digits");
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

/* The character an escape stands for (after the backslash). */
static int rx_escape_char(rx *r, uint32_t *cp)
{
    char c = *r->p++;
    const char *plain = "\\/.-^$*+?()[]{}|";
    if (c == 'n' || c == 't' || c == 'r' || c == 'f' || c == 'v') {
        *cp = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'f' ? '\f' : '\v';
        return 0;
    }
    /* A surrogate stays one: ECMA-262 without the u flag would pair two into a character, Python's re
     * never does, so no text both accept holds one (cset_add_clean drops them). */
    if (c == 'u')
        return rx_hex4(r, cp);
    if (c && (strchr(plain, c) || (c >= 0x20 && c < 0x7f && !((c | 0x20) >= 'a' && (c | 0x20) <= 'z') &&
                                   !(c >= '0' && c <= '9')))) { /* identity escapes of punctuation */
        *cp = (uint32_t)c;
        return 0;
    }
    char what[32];
    snprintf(what, sizeof what, "the escape \\%c", c ? c : '?');
    return rx_fail(r, what);
}

/* [...] after the '['. */
static int rx_class(rx *r, rx_cset *cs)
{
    int neg = r->p < r->end && *r->p == '^', unicode = 0; /* unicode: holds \d, \w or \s (see cset_ascii) */
    r->p += neg;
    while (r->p < r->end && *r->p != ']') {
        uint32_t lo, hi;
        if (*r->p == '\\' && r->p + 1 < r->end && rx_class_escape(r->p[1], cs)) {
            r->p += 2;
            unicode = 1;
            continue;
        }
        if (*r->p == '\\' ? (r->p++, rx_escape_char(r, &lo)) : (lo = rx_utf8(r), 0))
            return -1;
        hi = lo;
        if (r->end - r->p >= 2 && *r->p == '-' && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\' ? (r->p++, rx_escape_char(r, &hi)) : (hi = rx_utf8(r), 0))
                return -1;
            if (hi < lo)
                return rx_fail(r, "a reversed class range");
        }
        cset_add(cs, lo, hi);
    }
    if (r->p >= r->end)
        return rx_fail(r, "an unclosed '['");
    r->p++;
    if (neg)
        cset_complement(cs);
    if (neg && unicode)
        cset_ascii(cs);
    return cs->n ? 0 : rx_fail(r, "an empty class");
}

static int rx_group(rx *r, llm_strbuf *b)
{
    if (r->end - r->p >= 2 && r->p[0] == '?' && r->p[1] == ':')
        r->p += 2;
    else if (r->p < r->end && *r->p == '?')
        return rx_fail(r, "a lookaround or named group");
    if (++r->depth > RX_MAX_DEPTH)
        return rx_failf(r, "pattern: groups nested deeper than %d", RX_MAX_DEPTH);
    llm_strbuf_append(b, "( ", 2);
    if (rx_alt(r, b))
        return -1;
    if (r->p >= r->end || *r->p != ')')
        return rx_fail(r, "an unclosed '('");
    r->p++;
    r->depth--;
    llm_strbuf_append(b, ") ", 2);
    return 0;
}

static int rx_atom(rx *r, llm_strbuf *b)
{
    char c = *r->p;
    rx_cset cs = {0};
    uint32_t cp;
    if (c == '(') {
        r->p++;
        return rx_group(r, b);
    }
    if (strchr("*+?", c) || c == ')' || c == '^' || c == '$')
        return rx_fail(r, c == '^' || c == '$' ? "an anchor inside the pattern" : "a quantifier with nothing to repeat");
    if (c == '[') {
        r->p++;
        if (rx_class(r, &cs))
            return -1;
    } else if (c == '.') {
        r->p++;
        cset_add(&cs, '\n', '\n');
        cset_complement(&cs);
    } else if (c == '\\' && r->p + 1 < r->end && rx_class_escape(r->p[1], &cs)) {
        r->p += 2;
    } else {
        if (c == '\\' ? (r->p++, rx_escape_char(r, &cp)) : (cp = rx_utf8(r), 0))
            return -1;
        cset_add(&cs, cp, cp);
    }
    return rx_emit_cset(r, b, &cs);
}

/* {m}, {m,} or {m,n} at r->p, checked here so that a bad one is named
 * as the pattern's (not as a line of a grammar the client never saw);
 * *hi -1 for unbounded. */
static int rx_braces(rx *r, long *lo, long *hi)
{
    char *end;
    *lo = strtol(r->p + 1, &end, 10);
    *hi = *lo;
    if (end < r->end && *end == ',') {
        end++;
        *hi = -1;
        if (end < r->end && *end >= '0' && *end <= '9')
            *hi = strtol(end, &end, 10);
    }
    if (end >= r->end || *end != '}' || *lo > LLM_GBNF_MAX_REPEAT || *hi > LLM_GBNF_MAX_REPEAT ||
        (*hi >= 0 && *hi < *lo))
        return rx_fail(r, "a {m,n} repetition that is malformed, reversed or above 10000");
    r->p = end + 1;
    return 0;
}

/* A quantifier after an atom, if any. */
static int rx_quant(rx *r, llm_strbuf *b)
{
    if (r->p >= r->end)
        return 0;
    char c = *r->p;
    if (c == '*' || c == '+' || c == '?') {
        r->p++;
        llm_strbuf_append(b, &c, 1);
    } else if (c == '{' && r->p + 1 < r->end && r->p[1] >= '0' && r->p[1] <= '9') {
        long lo, hi;
        if (rx_braces(r, &lo, &hi))
            return -1;
        if (hi < 0)
            llm_strbuf_printf(b, "{%ld,}", lo);
        else
            llm_strbuf_printf(b, "{%ld,%ld}", lo, hi);
    } else {
        return 0;
    }
    if (r->p < r->end && *r->p == '?')
        r->p++; /* lazy: the same strings */
    if (r->p < r->end && (*r->p == '+' || *r->p == '*' || *r->p == '{'))
        return rx_fail(r, "a possessive or doubled quantifier");
    return 0;
}

static int rx_concat(rx *r, llm_strbuf *b)
{
    int n = 0;
    while (r->p < r->end && *r->p != '|' && *r->p != ')') {
        if (rx_atom(r, b) || rx_quant(r, b))
            return -1;
        llm_strbuf_append(b, " ", 1);
        n++;
    }
    if (!n)
        llm_strbuf_append(b, "\"\" ", 3);
    return 0;
}

static int rx_alt(rx *r, llm_strbuf *b)
{
    if (rx_concat(r, b))
        return -1;
    while (r->p < r->end && *r->p == '|') {
        r->p++;
        r->top_alt |= r->depth == 0;
        llm_strbuf_append(b, "| ", 2);
        if (rx_concat(r, b))
            return -1;
    }
    return 0;
}

int llm_regex_grammar(const char *pat, size_t n, llm_strbuf *b, char *why, size_t why_n)
{
    int a0 = n && pat[0] == '^';
    int a1 = n > (size_t)a0 && pat[n - 1] == '$' && !(n >= 2 && pat[n - 2] == '\\');
    rx r = {pat + a0, pat + n - a1, 0, 0, why, why_n};
    why[0] = 0;
    llm_strbuf_printf(b, "%s( ", a0 ? "" : "char* ");
    if (rx_alt(&r, b))
        return -1;
    if (r.p != r.end)
        return rx_fail(&r, "an unmatched ')'");
    if ((a0 || a1) && r.top_alt)
        return rx_fail(&r, "an anchor with a top-level '|'");
    llm_strbuf_printf(b, ")%s", a1 ? "" : " char*");
    return 0;
}
