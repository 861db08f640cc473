/* schema.c - JSON Schema to grammar (llm/schema.h).
 *
 * Every schema node becomes one rule "s<N>" written after the rules it
 * refers to; a $ref's target gets its rule number before its body is
 * built, so recursive schemas become recursive rules. The engine's JSON
 * grammar is appended for the pieces every schema shares (ws, string,
 * number, value). Written here: the C libraries that do this (xgrammar,
 * llama.cpp's json-schema-to-grammar) are C++ and tied to their matchers. */
#include "llm/regex.h"
#include "llm/schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "llm/gbnf.h"
#include "llm/strbuf.h"

#define SG_MAX_REFS 256
#define SG_MAX_DEPTH LLM_SCHEMA_MAX_DEPTH
#define SG_MAX_NODES 20000 /* subschemas converted: bounds the work a request can ask for */

typedef struct sg {
    llm_strbuf out;            /* finished rules */
    json_t *doc;
    int n_rules;
    json_t *ref_node[SG_MAX_REFS];
    int ref_rule[SG_MAX_REFS], n_refs;
    int depth, n_nodes;
    llm_error *err;
    int failed;                /* the first failure is kept (err may be NULL) */
} sg;

/* LLM_ERR_INVALID_ARG naming the cause (the first failure is kept); returns -1. */
static int sg_fail(sg *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sg_fail(sg *g, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!g->failed)
        llm_errf(g->err, LLM_ERR_INVALID_ARG, "%s", msg);
    g->failed = 1;
    return -1;
}

/* LLM_ERR_NOMEM (unless a failure came first); returns -1. */
static int sg_nomem(sg *g)
{
    if (!g->failed)
        llm_errf(g->err, LLM_ERR_NOMEM, "no memory for the schema's grammar");
    g->failed = 1;
    return -1;
}

/* s as a grammar literal: "..." with the grammar's escapes. */
static void sg_lit(llm_strbuf *b, const char *s, size_t n)
{
    llm_strbuf_append(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            llm_strbuf_printf(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            llm_strbuf_printf(b, "\\x%02X", c);
        else
            llm_strbuf_append(b, (const char *)&c, 1);
    }
    llm_strbuf_append(b, "\"", 1);
}

/* A JSON value's compact text as a literal. */
static int sg_json_lit(sg *g, llm_strbuf *b, json_t *v)
{
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t)
        return sg_nomem(g);
    sg_lit(b, t, strlen(t));
    free(t);
    return 0;
}

/* Appends "s<id> ::= body\n" to the finished rules. */
static int sg_rule(sg *g, int id, llm_strbuf *body)
{
    char *t = llm_strbuf_take(body);
    if (!t)
        return sg_nomem(g);
    llm_strbuf_printf(&g->out, "s%d ::= %s\n", id, t);
    free(t);
    if (g->out.len > LLM_GBNF_MAX_BYTES)
        return sg_fail(g, "the schema's grammar exceeds %u bytes", LLM_GBNF_MAX_BYTES);
    return 0;
}

static int sg_node(sg *g, json_t *s);
static int sg_node_as(sg *g, json_t *s, int id);

/* ---- keywords -------------------------------------------------------------------- */

static const char *const sg_annotations[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                             "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL};
static const char *const sg_keywords[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                          "maxItems", "enum", "const", "pattern", "format", "minLength", "maxLength",
                                          "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf",
                                          "allOf", "$ref", "nullable", NULL};

static int sg_in(const char *const *list, const char *k)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], k))
            return 1;
    return 0;
}

static int sg_check_keywords(sg *g, json_t *s)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (!sg_in(sg_keywords, k) && !sg_in(sg_annotations, k))
            return sg_fail(g, "JSON Schema keyword '%.64s' is not supported", k);
    }
    return 0;
}

/* ---- numbers --------------------------------------------------------------------- */

/* 1 when the n characters at s are all c (s need not end in a NUL). */
static int sg_all(const char *s, int n, char c)
{
    for (int i = 0; i < n; i++)
        if (s[i] != c)
            return 0;
    return 1;
}

/* Decimal numerals of [a, b] without leading zeros, all of length len
 * (a and b have that many digits), as an alternation into b. */
static void sg_same_len(llm_strbuf *out, const char *a, const char *b, int len)
{
    if (len == 0)
        return;
    if (a[0] == b[0]) {
        llm_strbuf_printf(out, "\"%c\" ", a[0]);
        if (len > 1) {
            llm_strbuf_append(out, "( ", 2);
            sg_same_len(out, a + 1, b + 1, len - 1);
            llm_strbuf_append(out, ") ", 2);
        }
        return;
    }
    int a_low = sg_all(a + 1, len - 1, '0'), b_high = sg_all(b + 1, len - 1, '9');
    char lo = a_low ? a[0] : (char)(a[0] + 1), hi = b_high ? b[0] : (char)(b[0] - 1);
    int first = 1;
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines), memset(zeros, '0', sizeof zeros);
    if (!a_low) {
        llm_strbuf_printf(out, "\"%c\" ( ", a[0]);
        sg_same_len(out, a + 1, nines, len - 1);
        llm_strbuf_append(out, ") ", 2);
        first = 0;
    }
    if (lo <= hi) {
        llm_strbuf_printf(out, "%s[%c-%c] ", first ? "" : "| ", lo, hi);
        if (len > 1)
            llm_strbuf_printf(out, "[0-9]{%d} ", len - 1);
        first = 0;
    }
    if (!b_high) {
        llm_strbuf_printf(out, "%s\"%c\" ( ", first ? "" : "| ", b[0]);
        sg_same_len(out, zeros, b + 1, len - 1);
        llm_strbuf_append(out, ") ", 2);
    }
}

/* Numerals of [a, b] (b < 0: unbounded), a >= 0, as an alternation. */
static void sg_int_range(llm_strbuf *out, long long a, long long b)
{
    char sa[24], sb[24];
    int la = snprintf(sa, sizeof sa, "%lld", a), first = 1;
    long long p10 = 1;
    for (int i = 1; i < la; i++) p10 *= 10;
    for (int len = la; len <= 19; len++, p10 = len <= 18 ? p10 * 10 : p10) {
        long long lo = len == la ? a : p10, top = len == 19 ? INT64_MAX : p10 * 10 - 1;
        long long hi = b >= 0 && b < top ? b : top;
        if (b >= 0 && lo > b)
            break;
        snprintf(sa, sizeof sa, "%lld", lo), snprintf(sb, sizeof sb, "%lld", hi);
        llm_strbuf_append(out, first ? "( " : "| ( ", first ? 2 : 4);
        sg_same_len(out, sa, sb, len);
        llm_strbuf_append(out, ") ", 2);
        first = 0;
        if (b >= 0 && b <= top)
            return;
        if (b < 0) { /* unbounded: every longer numeral */
            llm_strbuf_printf(out, "| [1-9] [0-9]{%d,} ", len);
            return;
        }
    }
}

typedef struct sg_bound {
    int has, excl;
    double v;
} sg_bound;

static int sg_bound_of(sg *g, json_t *s, const char *incl, const char *excl, sg_bound *b)
{
    json_t *i = json_object_get(s, incl), *x = json_object_get(s, excl);
    if ((i && !json_is_number(i)) || (x && !json_is_number(x)))
        return sg_fail(g, "'%s' must be a number", i && !json_is_number(i) ? incl : excl);
    if (i && x)
        return sg_fail(g, "both '%s' and its exclusive form are given", incl);
    *b = (sg_bound){i || x, x != NULL, json_number_value(i ? i : x)};
    if (b->has && !(fabs(b->v) < 1e15))
        return sg_fail(g, "'%s' is beyond 1e15", incl);
    return 0;
}

/* An integer between the bounds (made inclusive), as a rule body. */
static int sg_integer(sg *g, json_t *s, llm_strbuf *b)
{
    sg_bound lo, hi;
    if (sg_bound_of(g, s, "minimum", "exclusiveMinimum", &lo) || sg_bound_of(g, s, "maximum", "exclusiveMaximum", &hi))
        return -1;
    if (!lo.has && !hi.has) {
        llm_strbuf_printf(b, "%s", "\"0\" | \"-\"? [1-9] [0-9]*"); /* no "-0": one spelling per integer */
        return 0;
    }
    long long l = lo.has ? (long long)(lo.excl ? floor(lo.v) + 1 : ceil(lo.v)) : 0;
    long long h = hi.has ? (long long)(hi.excl ? ceil(hi.v) - 1 : floor(hi.v)) : 0;
    if (lo.has && hi.has && l > h)
        return sg_fail(g, "no integer satisfies the bounds");
    int pos = !hi.has || h >= 0, neg = !lo.has || l < 0;
    if (pos) {
        llm_strbuf_printf(b, "( ");
        sg_int_range(b, lo.has && l > 0 ? l : 0, hi.has ? h : -1);
        llm_strbuf_printf(b, ")");
    }
    if (neg) {
        llm_strbuf_printf(b, "%s\"-\" ( ", pos ? " | " : "");
        sg_int_range(b, hi.has && h < -1 ? -h : 1, lo.has ? -l : -1);
        llm_strbuf_printf(b, ")");
    }
    return 0;
}

/* A non-negative decimal v = ip.frac with lo <= v <= hi (either exclusive
 * or absent), lo and hi whole and >= 0; alternatives appended, *any set
 * when at least one was. */
static void sg_magnitude(llm_strbuf *b, sg_bound lo, sg_bound hi, int *any)
{
    long long l = lo.has ? (long long)lo.v : 0, h = hi.has ? (long long)hi.v : -1;
    long long ip_lo = lo.has && lo.excl ? l + 1 : l, ip_hi = hi.has ? h - 1 : -1;
    const char *frac = "( \".\" [0-9]+ )?";
    if (!hi.has || ip_lo <= ip_hi) { /* whole parts strictly inside: any fraction */
        llm_strbuf_printf(b, "%s( ", *any ? "| " : "");
        sg_int_range(b, ip_lo, ip_hi);
        llm_strbuf_printf(b, ") %s ", frac);
        *any = 1;
    }
    if (lo.has && lo.excl && (!hi.has || l < h)) { /* just above an exclusive lower bound */
        llm_strbuf_printf(b, "%s\"%lld\" \".\" [0-9]* [1-9] [0-9]* ", *any ? "| " : "", l);
        *any = 1;
    }
    if (hi.has && !hi.excl && (!lo.has || h > l || (h == l && !lo.excl))) { /* the upper bound itself */
        llm_strbuf_printf(b, "%s\"%lld\" ( \".\" \"0\"+ )? ", *any ? "| " : "", h);
        *any = 1;
    }
}

/* A number between the bounds as a rule body: the library's number rule
 * when unbounded, else sign and magnitude without exponents. */
static int sg_number(sg *g, json_t *s, llm_strbuf *b)
{
    sg_bound lo, hi;
    if (sg_bound_of(g, s, "minimum", "exclusiveMinimum", &lo) || sg_bound_of(g, s, "maximum", "exclusiveMaximum", &hi))
        return -1;
    if (!lo.has && !hi.has) {
        llm_strbuf_append(b, "number", 6);
        return 0;
    }
    if ((lo.has && lo.v != floor(lo.v)) || (hi.has && hi.v != floor(hi.v)))
        return sg_fail(g, "bounds of a number must be whole numbers (%s)", lo.has && lo.v != floor(lo.v) ? "minimum" : "maximum");
    int any = 0;
    if (!hi.has || hi.v >= 0) { /* v >= 0 */
        sg_bound plo = lo.has && lo.v >= 0 ? lo : (sg_bound){1, 0, 0};
        sg_magnitude(b, plo, hi, &any);
    }
    if (!lo.has || lo.v < 0) { /* v = -w, w > 0 */
        sg_bound wlo = hi.has && hi.v < 0 ? (sg_bound){1, hi.excl, -hi.v} : (sg_bound){1, 1, 0};
        sg_bound whi = lo.has ? (sg_bound){1, lo.excl, -lo.v} : (sg_bound){0, 0, 0};
        llm_strbuf_printf(b, "%s\"-\" ( ", any ? "| " : "");
        int inner = 0;
        sg_magnitude(b, wlo, whi, &inner);
        llm_strbuf_append(b, ") ", 2);
        any |= inner;
    }
    return any ? 0 : sg_fail(g, "no number satisfies the bounds");
}

/* ---- strings --------------------------------------------------------------------- */

static const char *const sg_formats[][2] = {
    {"date", "( [1-9] [0-9]{3} | \"0\" [1-9] [0-9]{2} | \"00\" [1-9] [0-9] | \"000\" [1-9] ) \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | "
             "( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | "
             "\"2\" [0-8] ) )"},
    {"time", "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( \"Z\" | [+-] "
             "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )"},
    {"uuid", "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}"},
};

/* A string as a rule body: format, pattern, or length bounds. */
static int sg_string(sg *g, json_t *s, llm_strbuf *b)
{
    json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    if ((fmt || pat) && (mn || mx))
        return sg_fail(g, "'%s' together with minLength/maxLength is not supported", fmt ? "format" : "pattern");
    if (fmt && pat)
        return sg_fail(g, "'format' together with 'pattern' is not supported");
    llm_strbuf_append(b, "\"\\\"\" ", 5);
    if (fmt) {
        const char *f = json_string_value(fmt);
        int k = -1;
        for (int i = 0; f && i < 3; i++) k = !strcmp(f, sg_formats[i][0]) ? i : k;
        if (f && !strcmp(f, "date-time"))
            llm_strbuf_printf(b, "( %s ) \"T\" ( %s )", sg_formats[0][1], sg_formats[1][1]);
        else if (k >= 0)
            llm_strbuf_printf(b, "( %s )", sg_formats[k][1]);
        else
            return sg_fail(g, "string format '%.64s' is not supported (date, time, date-time, uuid)", f ? f : "?");
    } else if (pat) {
        char why[200];
        if (!json_is_string(pat))
            return sg_fail(g, "'pattern' must be a string");
        if (llm_regex_grammar(json_string_value(pat), json_string_length(pat), b, why, sizeof why))
            return sg_fail(g, "%s", why);
    } else if (mn || mx) {
        long lo = json_is_integer(mn) ? (long)json_integer_value(mn) : 0;
        long hi = json_is_integer(mx) ? (long)json_integer_value(mx) : -1;
        if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)) || lo < 0 || lo > LLM_GBNF_MAX_REPEAT ||
            hi > LLM_GBNF_MAX_REPEAT || (mx && hi < lo))
            return sg_fail(g, "minLength/maxLength must be integers with 0 <= minLength <= maxLength <= %d",
                           LLM_GBNF_MAX_REPEAT);
        /* one element per character: escapes other than \u only, so that
         * each counts as one code point as the schema counts them */
        llm_strbuf_printf(b, "( [^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\/bfnrt] ){%ld,", lo);
        if (hi >= 0)
            llm_strbuf_printf(b, "%ld", hi);
        llm_strbuf_append(b, "}", 1);
    } else {
        llm_strbuf_append(b, "char*", 5);
    }
    llm_strbuf_append(b, " \"\\\"\"", 5);
    return 0;
}

/* ---- objects and arrays ------------------------------------------------------------ */

static int sg_required(json_t *req, const char *key)
{
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v) {
        if (json_is_string(v) && !strcmp(json_string_value(v), key))
            return 1;
    }
    return 0;
}

/* Properties in the listed order, each optional one possibly left out,
 * commas only between those present: rules first_i (nothing written yet)
 * and rest_i (something was) for i = n..0, then the body. */
static int sg_members(sg *g, json_t *props, json_t *req, const char **keys, int n, const char *extra, int first)
{
    int rest = first + n + 1;
    llm_strbuf f = {0}, r = {0};
    if (*extra) { /* after the listed ones: any other key with a value of that rule */
        llm_strbuf_printf(&f, "( string ws \":\" ws %s ( ws \",\" ws string ws \":\" ws %s )* )?", extra, extra);
        llm_strbuf_printf(&r, "( ws \",\" ws string ws \":\" ws %s )*", extra);
    } else {
        llm_strbuf_printf(&f, "\"\"");
        llm_strbuf_printf(&r, "\"\"");
    }
    int bad_first = sg_rule(g, first + n, &f), bad_rest = sg_rule(g, rest + n, &r);
    if (bad_first || bad_rest)
        return -1;
    for (int i = n - 1; i >= 0; i--) {
        int vr = sg_node(g, json_object_get(props, keys[i]));
        if (vr < 0)
            return -1;
        json_t *k = json_string(keys[i]);
        llm_strbuf m = {0};
        int bad = !k || sg_json_lit(g, &m, k);
        json_decref(k);
        llm_strbuf_printf(&m, " ws \":\" ws s%d", vr);
        char *mt = llm_strbuf_take(&m);
        int opt = !sg_required(req, keys[i]);
        if (bad || !mt) {
            free(mt);
            return sg_nomem(g);
        }
        llm_strbuf_printf(&f, "%s s%d", mt, rest + i + 1);
        llm_strbuf_printf(&r, "ws \",\" ws %s s%d", mt, rest + i + 1);
        if (opt)
            llm_strbuf_printf(&f, " | s%d", first + i + 1), llm_strbuf_printf(&r, " | s%d", rest + i + 1);
        free(mt);
        int bad_f = sg_rule(g, first + i, &f), bad_r = sg_rule(g, rest + i, &r); /* both: each takes its buffer */
        if (bad_f || bad_r)
            return -1;
    }
    return 0;
}

static int sg_object(sg *g, json_t *s, llm_strbuf *b)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *add = json_object_get(s, "additionalProperties"), *v;
    if ((props && !json_is_object(props)) || (req && !json_is_array(req)))
        return sg_fail(g, "'%s' has the wrong type", props && !json_is_object(props) ? "properties" : "required");
    size_t i;
    if (json_array_size(req) > json_object_size(props)) /* a name twice; also keeps the checks below linear */
        return sg_fail(g, "'required' lists more names than there are properties");
    json_array_foreach(req, i, v) {
        if (!json_is_string(v) || !json_object_get(props, json_string_value(v)))
            return sg_fail(g, "'required' names '%.64s', which is not among the properties",
                           json_is_string(v) ? json_string_value(v) : "?");
    }
    char extra[32] = ""; /* the rule of additional members' values; "": none (strict mode's default) */
    if (add && !json_is_false(add)) {
        int r = json_is_true(add) ? -2 : sg_node(g, add);
        if (r == -1)
            return -1;
        snprintf(extra, sizeof extra, r == -2 ? "value" : "s%d", r);
    }
    int n = props ? (int)json_object_size(props) : 0, k = 0;
    const char **keys = malloc(sizeof *keys * (size_t)(n + 1)), *key;
    if (!keys)
        return sg_nomem(g);
    json_object_foreach(props, key, v) keys[k++] = key;
    int first = g->n_rules;
    g->n_rules += 2 * (n + 1);
    int rc = sg_members(g, props, req, keys, n, extra, first);
    free(keys);
    if (!rc)
        llm_strbuf_printf(b, "\"{\" ws s%d ws \"}\"", first);
    return rc;
}

/* items, minItems, maxItems as a rule body. */
static int sg_array(sg *g, json_t *s, llm_strbuf *b)
{
    json_t *items = json_object_get(s, "items"), *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    long lo = json_is_integer(mn) ? (long)json_integer_value(mn) : 0, hi = json_is_integer(mx) ? (long)json_integer_value(mx) : -1;
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)) || lo < 0 || lo > LLM_GBNF_MAX_REPEAT ||
        hi > LLM_GBNF_MAX_REPEAT || (mx && hi < lo))
        return sg_fail(g, "minItems/maxItems must be integers with 0 <= minItems <= maxItems <= %d",
                           LLM_GBNF_MAX_REPEAT);
    if (json_is_false(items) || hi == 0) {
        if (lo > 0)
            return sg_fail(g, "no array satisfies minItems");
        llm_strbuf_printf(b, "\"[\" ws \"]\"");
        return 0;
    }
    char it[32] = "value";
    if (items && !json_is_true(items)) {
        int r = sg_node(g, items);
        if (r < 0)
            return -1;
        snprintf(it, sizeof it, "s%d", r);
    }
    llm_strbuf_printf(b, "\"[\" ws %s%s ( ws \",\" ws %s )", lo ? "" : "( ", it, it);
    if (hi < 0)
        llm_strbuf_printf(b, "{%ld,}", lo > 1 ? lo - 1 : 0);
    else
        llm_strbuf_printf(b, "{%ld,%ld}", lo > 1 ? lo - 1 : 0, hi - 1);
    llm_strbuf_printf(b, "%s ws \"]\"", lo ? "" : " )?");
    return 0;
}

/* ---- schema nodes ------------------------------------------------------------------ */

static int sg_ref(sg *g, json_t *ref)
{
    const char *r = json_string_value(ref);
    const char *name = NULL;
    json_t *defs = NULL;
    if (r && !strncmp(r, "#/$defs/", 8))
        defs = json_object_get(g->doc, "$defs"), name = r + 8;
    else if (r && !strncmp(r, "#/definitions/", 14))
        defs = json_object_get(g->doc, "definitions"), name = r + 14;
    else if (r && !strcmp(r, "#"))
        defs = NULL, name = "";
    json_t *target = r && !strcmp(r, "#") ? g->doc : name && *name && !strpbrk(name, "/~") ? json_object_get(defs, name) : NULL;
    if (!target)
        return sg_fail(g, "$ref '%.64s' does not name a definition of this schema (#/$defs/NAME)", r ? r : "?");
    for (int i = 0; i < g->n_refs; i++)
        if (g->ref_node[i] == target)
            return g->ref_rule[i];
    if (g->n_refs == SG_MAX_REFS)
        return sg_fail(g, "more than %d distinct $ref targets", SG_MAX_REFS);
    int id = g->n_rules++;
    g->ref_node[g->n_refs] = target, g->ref_rule[g->n_refs++] = id;
    return sg_node_as(g, target, id) ? -1 : id;
}

static int sg_typed(sg *g, json_t *s, const char *type, llm_strbuf *b)
{
    if (!strcmp(type, "object"))
        return sg_object(g, s, b);
    if (!strcmp(type, "array"))
        return sg_array(g, s, b);
    if (!strcmp(type, "string"))
        return sg_string(g, s, b);
    if (!strcmp(type, "integer"))
        return sg_integer(g, s, b);
    if (!strcmp(type, "number"))
        return sg_number(g, s, b);
    if (!strcmp(type, "boolean") || !strcmp(type, "null")) {
        llm_strbuf_printf(b, "%s", type[0] == 'b' ? "\"true\" | \"false\"" : "\"null\"");
        return 0;
    }
    return sg_fail(g, "type '%.32s' is not a JSON Schema type", type);
}

/* The type a schema without "type" implies by its keywords, or NULL. */
static const char *sg_implied_type(json_t *s)
{
    static const char *const by[][2] = {{"properties", "object"}, {"additionalProperties", "object"},
                                        {"required", "object"},   {"items", "array"},
                                        {"minItems", "array"},    {"maxItems", "array"},
                                        {"pattern", "string"},    {"format", "string"},
                                        {"minLength", "string"},  {"maxLength", "string"},
                                        {"minimum", "number"},    {"maximum", "number"},
                                        {"exclusiveMinimum", "number"}, {"exclusiveMaximum", "number"}};
    for (size_t i = 0; i < sizeof by / sizeof *by; i++)
        if (json_object_get(s, by[i][0]))
            return by[i][1];
    return NULL;
}

/* 1 when JSON value v is of the schema type t. */
static int sg_type_ok(json_t *v, const char *t)
{
    return !strcmp(t, "string") ? json_is_string(v) : !strcmp(t, "integer") ? json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)))
         : !strcmp(t, "number") ? json_is_number(v) : !strcmp(t, "boolean") ? json_is_boolean(v)
         : !strcmp(t, "null") ? json_is_null(v) : !strcmp(t, "object") ? json_is_object(v) : json_is_array(v);
}

/* enum / const: the values as literals, each of the schema's type if it has one. */
static int sg_values(sg *g, json_t *s, json_t *vals, llm_strbuf *b)
{
    json_t *type = json_object_get(s, "type"), *v;
    size_t i;
    if (!json_is_array(vals) || !json_array_size(vals))
        return sg_fail(g, "'enum' must be a non-empty array");
    json_array_foreach(vals, i, v) {
        if (json_is_string(type) && !sg_type_ok(v, json_string_value(type)))
            return sg_fail(g, "an enum or const value is not of the schema's type '%.32s'", json_string_value(type));
        if (i)
            llm_strbuf_append(b, " | ", 3);
        if (sg_json_lit(g, b, v))
            return -1;
    }
    return 0;
}

/* anyOf / oneOf / allOf (one element): the choices' rules as alternatives. */
static int sg_choices(sg *g, json_t *s, llm_strbuf *b)
{
    json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf"), *all = json_object_get(s, "allOf"), *v;
    json_t *arr = any ? any : one ? one : all;
    const char *kw = any ? "anyOf" : one ? "oneOf" : "allOf";
    size_t i;
    if (!json_is_array(arr) || !json_array_size(arr) || (all && json_array_size(arr) != 1) || (!!any + !!one + !!all) > 1)
        return all ? sg_fail(g, "'allOf' with other than one schema is not supported")
                   : sg_fail(g, "'%s' must be a non-empty array (and only one of anyOf/oneOf/allOf)", kw);
    json_array_foreach(arr, i, v) {
        int r = sg_node(g, v);
        if (r < 0)
            return -1;
        llm_strbuf_printf(b, "%ss%d", i ? " | " : "", r);
    }
    return 0;
}

/* 1 when s has a constraining keyword besides those of one kind. */
static int sg_mixed(json_t *s, const char *const *own)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (sg_in(sg_keywords, k) && !sg_in(own, k) && strcmp(k, "nullable"))
            return 1;
    }
    return 0;
}

static int sg_body(sg *g, json_t *s, llm_strbuf *b)
{
    static const char *const refk[] = {"$ref", NULL}, *const choice[] = {"anyOf", "oneOf", "allOf", NULL};
    static const char *const values[] = {"enum", "const", "type", NULL};
    if (json_is_true(s) || (json_is_object(s) && !json_object_size(s))) {
        llm_strbuf_printf(b, "value");
        return 0;
    }
    if (!json_is_object(s))
        return sg_fail(g, "a schema must be an object or true");
    if (sg_check_keywords(g, s))
        return -1;
    json_t *type = json_object_get(s, "type"), *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (json_object_get(s, "$ref")) {
        if (sg_mixed(s, refk))
            return sg_fail(g, "'$ref' alongside other keywords is not supported");
        int r = sg_ref(g, json_object_get(s, "$ref"));
        return r < 0 ? -1 : (llm_strbuf_printf(b, "s%d", r), 0);
    }
    if (json_object_get(s, "anyOf") || json_object_get(s, "oneOf") || json_object_get(s, "allOf"))
        return sg_mixed(s, choice) ? sg_fail(g, "'anyOf/oneOf/allOf' alongside other keywords is not supported")
                                   : sg_choices(g, s, b);
    if (en || cn) {
        if (sg_mixed(s, values) || (en && cn))
            return sg_fail(g, "'%s' alongside keywords other than type is not supported", en ? "enum" : "const");
        if (en)
            return sg_values(g, s, en, b);
        json_t *one = json_pack("[O]", cn);
        int rc = one ? sg_values(g, s, one, b) : sg_nomem(g);
        json_decref(one);
        return rc;
    }
    if (json_is_array(type)) {
        size_t i;
        json_t *t;
        if (!json_array_size(type) || json_array_size(type) > 7)
            return sg_fail(g, "'type' must list 1 to 7 types");
        json_array_foreach(type, i, t) {
            for (size_t k = 0; k < i; k++)
                if (json_equal(json_array_get(type, k), t))
                    return sg_fail(g, "'type' lists a type twice");
            llm_strbuf_printf(b, "%s( ", i ? " | " : "");
            if (!json_is_string(t) || sg_typed(g, s, json_string_value(t), b))
                return json_is_string(t) ? -1 : sg_fail(g, "'type' must list strings");
            llm_strbuf_printf(b, " )");
        }
        return 0;
    }
    if (type && !json_is_string(type))
        return sg_fail(g, "'type' must be a string or a list of strings");
    const char *t = type ? json_string_value(type) : sg_implied_type(s);
    if (!t) {
        llm_strbuf_printf(b, "value");
        return 0;
    }
    return sg_typed(g, s, t, b);
}

static int sg_node_as(sg *g, json_t *s, int id)
{
    if (++g->n_nodes > SG_MAX_NODES)
        return sg_fail(g, "the schema has more than %d subschemas", SG_MAX_NODES);
    if (++g->depth > SG_MAX_DEPTH)
        return sg_fail(g, "the schema is nested deeper than %d", SG_MAX_DEPTH);
    llm_strbuf b = {0};
    int nullable = json_is_object(s) && json_is_true(json_object_get(s, "nullable"));
    if (nullable)
        llm_strbuf_printf(&b, "( ");
    int rc = sg_body(g, s, &b);
    if (nullable)
        llm_strbuf_printf(&b, " ) | \"null\"");
    g->depth--;
    if (rc) {
        llm_strbuf_free(&b);
        return -1;
    }
    return sg_rule(g, id, &b);
}

static int sg_node(sg *g, json_t *s)
{
    int id = g->n_rules++;
    return sg_node_as(g, s, id) ? -1 : id;
}

/* The schema's rules, then the shared JSON rules with their whitespace
 * rule (the last one) as it is or, compact, at most one space per gap. */
static llm_status schema_grammar(json_t *schema, int compact, char **out, llm_error *err)
{
    sg g = {.doc = schema, .err = err, .n_rules = 1, .n_refs = 1};
    g.ref_node[0] = schema, g.ref_rule[0] = 0;
    *out = NULL;
    if (sg_node_as(&g, schema, 0)) {
        llm_strbuf_free(&g.out);
        return err ? err->code : LLM_ERR_INVALID_ARG;
    }
    const char *ws = strstr(llm_gbnf_json, "\nws ");
    int shared = compact && ws ? (int)(ws - llm_gbnf_json) + 1 : (int)strlen(llm_gbnf_json);
    llm_strbuf_printf(&g.out, "root ::= s0\n%.*s%s", shared, llm_gbnf_json,
                      shared < (int)strlen(llm_gbnf_json) ? "ws ::= \" \"?\n" : "");
    if (!(*out = llm_strbuf_take(&g.out)))
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the schema's grammar");
    return LLM_OK;
}

llm_status llm_schema_grammar(json_t *schema, char **out, llm_error *err) { return schema_grammar(schema, 0, out, err); }

llm_status llm_schema_grammar_compact(json_t *schema, char **out, llm_error *err)
{
    return schema_grammar(schema, 1, out, err);
}
