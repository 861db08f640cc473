/* jinja_parse.c - Jinja template text -> a jx_node tree. The lexer applies
 * the whitespace rules of jinja2 with trim_blocks and lstrip_blocks on (and
 * keep_trailing_newline off) as it cuts the text; the parser follows
 * jinja2's grammar and operator precedence. Errors name the line. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"
#include "llm/utf8.h"

/* ---- tokens ----------------------------------------------------------------------- */

typedef enum { T_EOF, T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT,
               T_OP } tok_type;

typedef struct tok {
    tok_type type;
    int line;
    const char *s; /* T_NAME, T_OP: the text (NUL-terminated copy) */
    llm_jv *v;     /* T_TEXT, T_STRING, T_INT, T_FLOAT: the value */
} tok;

typedef struct lexer {
    llm_jctx *c;
    const char *src;
    size_t n, pos;
    int line;
    tok *toks;
    size_t n_toks, cap;
} lexer;

static void emit(lexer *L, tok_type t, const char *s, size_t n, llm_jv *v)
{
    if (L->n_toks == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        tok *nt = jx_alloc(L->c, cap * sizeof *nt);
        if (L->n_toks)
            memcpy(nt, L->toks, L->n_toks * sizeof *nt);
        L->toks = nt;
        L->cap = cap;
    }
    tok *k = &L->toks[L->n_toks++];
    k->type = t;
    k->line = L->line;
    k->v = v;
    k->s = NULL;
    if (s) {
        char *p = jx_alloc(L->c, n + 1);
        memcpy(p, s, n);
        k->s = p;
    }
}

static int count_lines(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

static int is_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

/* Text before a tag at k: the tag's '-' strips all trailing whitespace;
 * lstrip_blocks drops the blanks between a line start and a block or
 * comment tag (not with '+'). */
static void emit_text(lexer *L, size_t from, size_t k, char kind, char mod)
{
    size_t end = k;
    if (mod == '-') {
        while (end > from && is_ws(L->src[end - 1])) end--;
    } else if ((kind == '%' || kind == '#') && mod != '+') {
        size_t ls = end;
        while (ls > from && (L->src[ls - 1] == ' ' || L->src[ls - 1] == '\t')) ls--;
        int line_start = ls > from ? L->src[ls - 1] == '\n' : (from == 0 || L->src[from - 1] == '\n');
        if (line_start)
            end = ls;
    }
    if (end > from)
        emit(L, T_TEXT, NULL, 0, jv_str(L->c, L->src + from, end - from, NULL));
    L->line += count_lines(L->src + from, k - from);
}

/* After a tag ending at e (just past the closing brace): '-' strips the
 * whitespace that follows; trim_blocks drops one newline after a block or
 * comment (not with '+'). */
static size_t after_tag(lexer *L, size_t e, char kind, char mod)
{
    if (mod == '-') {
        while (e < L->n && is_ws(L->src[e])) {
            L->line += L->src[e] == '\n';
            e++;
        }
    } else if ((kind == '%' || kind == '#') && mod != '+' && e < L->n && L->src[e] == '\n') {
        L->line++;
        e++;
    }
    return e;
}

static llm_jv *lex_string(lexer *L)
{
    char q = L->src[L->pos++];
    jx_sb b;
    jx_sb_init(&b, L->c);
    while (L->pos < L->n && L->src[L->pos] != q) {
        char ch = L->src[L->pos++];
        if (ch == '\n')
            L->line++;
        if (ch != '\\' || L->pos >= L->n) {
            jx_sb_put(&b, &ch, 1, NULL);
            continue;
        }
        char e = L->src[L->pos++];
        static const char from[] = "nrtbfva\\'\"", to[] = "\n\r\t\b\f\v\a\\'\"";
        const char *simple = e ? strchr(from, e) : NULL;
        if (simple) {
            jx_sb_put(&b, &to[simple - from], 1, NULL);
            continue;
        }
        if (e == '\n') { /* a backslash-newline continues the line */
            L->line++;
            continue;
        }
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (e >= '0' && e <= '7') { /* octal, up to three digits */
            unsigned v = (unsigned)(e - '0');
            for (int i = 0; i < 2 && L->pos < L->n && L->src[L->pos] >= '0' && L->src[L->pos] <= '7'; i++)
                v = v * 8 + (unsigned)(L->src[L->pos++] - '0');
            char u[4];
            jx_sb_put(&b, u, (size_t)llm_utf8_encode(v, u), NULL);
            continue;
        }
        if (!digits) { /* Python keeps an unknown escape as it is */
            jx_sb_put(&b, "\\", 1, NULL);
            jx_sb_put(&b, &e, 1, NULL);
            continue;
        }
        unsigned long cp = 0;
        for (int i = 0; i < digits; i++) {
            char h = L->pos < L->n ? L->src[L->pos++] : 0;
            if (!isxdigit((unsigned char)h))
                jx_fail(L->c, "line %d: a \\%c escape needs %d hex digits", L->line, e, digits);
            cp = cp * 16 + (unsigned long)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
        }
        if (cp > 0x10FFFF)
            jx_fail(L->c, "line %d: escape beyond U+10FFFF", L->line);
        char u[4];
        jx_sb_put(&b, u, (size_t)llm_utf8_encode((uint32_t)cp, u), NULL);
    }
    if (L->pos >= L->n)
        jx_fail(L->c, "line %d: a string without its closing quote", L->line);
    L->pos++;
    return jx_sb_value(&b);
}

static void lex_number(lexer *L)
{
    char buf[64];
    size_t k = 0;
    int is_float = 0;
    while (L->pos < L->n && k < sizeof buf - 1) {
        char ch = L->src[L->pos];
        if (isdigit((unsigned char)ch))
            buf[k++] = ch;
        else if (ch == '_' && k > 0)
            ;
        else if (ch == '.' && !is_float && L->pos + 1 < L->n && isdigit((unsigned char)L->src[L->pos + 1])) {
            buf[k++] = ch;
            is_float = 1;
        } else if ((ch == 'e' || ch == 'E') && L->pos + 1 < L->n &&
                   (isdigit((unsigned char)L->src[L->pos + 1]) ||
                    ((L->src[L->pos + 1] == '-' || L->src[L->pos + 1] == '+') && L->pos + 2 < L->n &&
                     isdigit((unsigned char)L->src[L->pos + 2])))) {
            buf[k++] = ch;
            buf[k++] = L->src[++L->pos];
            is_float = 1;
        } else
            break;
        L->pos++;
    }
    buf[k] = 0;
    if (is_float) {
        emit(L, T_FLOAT, NULL, 0, jv_float(L->c, strtod(buf, NULL)));
        return;
    }
    errno = 0;
    long long v = strtoll(buf, NULL, 10);
    if (errno == ERANGE || k >= sizeof buf - 1)
        jx_fail(L->c, "line %d: integer %.20s... beyond 64 bits", L->line, buf);
    emit(L, T_INT, NULL, 0, jv_int(L->c, v));
}

static const char *const OPS[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "|", ".", ",",
                                  ":", "(", ")", "[", "]", "{", "}", "=", "<", ">"};

/* The inside of a tag from L->pos to its end marker; returns the position
 * just past the marker and the modifier before it ('-', '+' or 0). */
static size_t lex_tag(lexer *L, char kind, char *mod)
{
    int depth = 0;
    for (;;) {
        while (L->pos < L->n && is_ws(L->src[L->pos])) L->line += L->src[L->pos++] == '\n';
        if (L->pos >= L->n)
            jx_fail(L->c, "line %d: a tag without its end", L->line);
        const char *p = L->src + L->pos;
        size_t left = L->n - L->pos;
        char close = kind == '{' ? '}' : '%';
        if (depth == 0) {
            if (left >= 2 && p[0] == close && p[1] == '}') {
                *mod = 0;
                return L->pos + 2;
            }
            if (left >= 3 && (p[0] == '-' || (p[0] == '+' && kind == '%')) && p[1] == close && p[2] == '}') {
                *mod = p[0];
                return L->pos + 3;
            }
        }
        if (isalpha((unsigned char)*p) || *p == '_') {
            size_t k = 1;
            while (k < left && (isalnum((unsigned char)p[k]) || p[k] == '_')) k++;
            emit(L, T_NAME, p, k, NULL);
            L->pos += k;
        } else if (isdigit((unsigned char)*p)) {
            lex_number(L);
        } else if (*p == '\'' || *p == '"') {
            int line = L->line;
            llm_jv *s = lex_string(L);
            emit(L, T_STRING, NULL, 0, s);
            L->toks[L->n_toks - 1].line = line;
        } else {
            size_t i = 0;
            for (; i < sizeof OPS / sizeof *OPS; i++)
                if (!strncmp(p, OPS[i], strlen(OPS[i])))
                    break;
            if (i == sizeof OPS / sizeof *OPS)
                jx_fail(L->c, "line %d: unexpected character '%c'", L->line, isprint((unsigned char)*p) ? *p : '?');
            if (strchr("([{", OPS[i][0]) && !OPS[i][1])
                depth++;
            if (strchr(")]}", OPS[i][0]) && !OPS[i][1] && --depth < 0)
                jx_fail(L->c, "line %d: unexpected '%s'", L->line, OPS[i]);
            emit(L, T_OP, OPS[i], strlen(OPS[i]), NULL);
            L->pos += strlen(OPS[i]);
        }
    }
}

/* {% raw %}: everything up to {% endraw %} is text. Returns 1 when the
 * block tag at L->pos (just past "{%" and its modifier) opens one. */
static int lex_raw(lexer *L, char mod_open)
{
    size_t p = L->pos;
    while (p < L->n && is_ws(L->src[p])) p++;
    if (L->n - p < 3 || strncmp(L->src + p, "raw", 3))
        return 0;
    p += 3;
    while (p < L->n && is_ws(L->src[p])) p++;
    char mod = 0;
    if (p < L->n && (L->src[p] == '-' || L->src[p] == '+'))
        mod = L->src[p++];
    if (L->n - p < 2 || strncmp(L->src + p, "%}", 2))
        return 0;
    (void)mod_open;
    size_t body = after_tag(L, p + 2, '%', mod);
    for (size_t q = body; q + 1 < L->n; q++) {
        if (L->src[q] != '{' || L->src[q + 1] != '%')
            continue;
        size_t r = q + 2;
        char m2 = 0;
        if (r < L->n && (L->src[r] == '-' || L->src[r] == '+'))
            m2 = L->src[r++];
        while (r < L->n && is_ws(L->src[r])) r++;
        if (L->n - r < 6 || strncmp(L->src + r, "endraw", 6))
            continue;
        r += 6;
        while (r < L->n && is_ws(L->src[r])) r++;
        char m3 = 0;
        if (r < L->n && (L->src[r] == '-' || L->src[r] == '+'))
            m3 = L->src[r++];
        if (L->n - r < 2 || strncmp(L->src + r, "%}", 2))
            continue;
        size_t end = q;
        if (m2 == '-')
            while (end > body && is_ws(L->src[end - 1])) end--;
        if (end > body)
            emit(L, T_TEXT, NULL, 0, jv_str(L->c, L->src + body, end - body, NULL));
        L->line += count_lines(L->src + L->pos, r - L->pos);
        L->pos = after_tag(L, r + 2, '%', m3);
        return 1;
    }
    jx_fail(L->c, "line %d: {%% raw %%} without {%% endraw %%}", L->line);
}

static void lex(lexer *L)
{
    while (L->pos < L->n) {
        const char *open = NULL;
        for (size_t k = L->pos; k + 1 < L->n; k++)
            if (L->src[k] == '{' && (L->src[k + 1] == '{' || L->src[k + 1] == '%' || L->src[k + 1] == '#')) {
                open = L->src + k;
                break;
            }
        if (!open) {
            emit_text(L, L->pos, L->n, 0, 0);
            break;
        }
        size_t k = (size_t)(open - L->src);
        char kind = open[1];
        char mod = k + 2 < L->n && (open[2] == '-' || open[2] == '+') ? open[2] : 0;
        emit_text(L, L->pos, k, kind, mod);
        L->pos = k + 2 + (mod ? 1 : 0);
        if (kind == '#') {
            const char *end = NULL;
            for (size_t q = L->pos; q + 1 < L->n; q++)
                if (L->src[q] == '#' && L->src[q + 1] == '}') {
                    end = L->src + q;
                    break;
                }
            if (!end)
                jx_fail(L->c, "line %d: a comment without its end", L->line);
            char m = end > L->src + L->pos && (end[-1] == '-' || end[-1] == '+') ? end[-1] : 0;
            L->line += count_lines(L->src + L->pos, (size_t)(end - L->src) - L->pos);
            L->pos = after_tag(L, (size_t)(end - L->src) + 2, '#', m);
            continue;
        }
        if (kind == '%' && lex_raw(L, mod))
            continue;
        emit(L, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, NULL, 0, NULL);
        char m = 0;
        size_t e = lex_tag(L, kind, &m);
        emit(L, kind == '{' ? T_VAR_END : T_BLOCK_END, NULL, 0, NULL);
        L->pos = after_tag(L, e, kind, m);
    }
    emit(L, T_EOF, NULL, 0, NULL);
}

/* ---- parser ----------------------------------------------------------------------------------- */

typedef struct parser {
    llm_jctx *c;
    tok *t;
    size_t at;
    int depth;
} parser;

typedef struct nvec {
    jx_node **v;
    const char **names;
    size_t n, cap;
} nvec;

static void nv_push(parser *P, nvec *v, jx_node *n, const char *name)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        jx_node **nn = jx_alloc(P->c, cap * sizeof *nn);
        const char **nm = jx_alloc(P->c, cap * sizeof *nm);
        if (v->n) {
            memcpy(nn, v->v, v->n * sizeof *nn);
            memcpy(nm, v->names, v->n * sizeof *nm);
        }
        v->v = nn;
        v->names = nm;
        v->cap = cap;
    }
    v->v[v->n] = n;
    v->names[v->n++] = name;
}

static tok *cur(parser *P)
{
    return &P->t[P->at];
}

static int is_op(parser *P, const char *op)
{
    return cur(P)->type == T_OP && !strcmp(cur(P)->s, op);
}

static int is_name(parser *P, const char *name)
{
    return cur(P)->type == T_NAME && !strcmp(cur(P)->s, name);
}

static _Noreturn void unexpected(parser *P, const char *what)
{
    tok *k = cur(P);
    const char *got = k->type == T_NAME || k->type == T_OP ? k->s
                      : k->type == T_STRING ? "a string" : k->type == T_INT || k->type == T_FLOAT ? "a number"
                      : k->type == T_EOF ? "the end of the template" : k->type == T_BLOCK_END ? "the end of the tag"
                      : k->type == T_VAR_END ? "'}}'" : "text";
    jx_fail(P->c, "line %d: expected %s, got %s", k->line, what, got);
}

static void expect_op(parser *P, const char *op)
{
    if (!is_op(P, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(P, w);
    }
    P->at++;
}

static const char *expect_name(parser *P)
{
    if (cur(P)->type != T_NAME)
        unexpected(P, "a name");
    return P->t[P->at++].s;
}

static void expect(parser *P, tok_type t, const char *what)
{
    if (cur(P)->type != t)
        unexpected(P, what);
    P->at++;
}

static jx_node *mk(parser *P, jn_kind k)
{
    jx_node *n = jx_alloc(P->c, sizeof *n);
    n->kind = k;
    n->line = cur(P)->line;
    return n;
}

static void set_kids(jx_node *n, nvec *v)
{
    n->kids = v->v;
    n->names = v->names;
    n->n_kids = (int)v->n;
    n->n_names = (int)v->n;
}

static jx_node *parse_expr(parser *P, int with_cond);
static jx_node *parse_or(parser *P);
static jx_node *parse_unary(parser *P, int with_filter);
static jx_node *parse_primary(parser *P);
static jx_node *parse_postfix(parser *P, jx_node *n);

static void enter(parser *P)
{
    if (++P->depth > JX_MAX_DEPTH)
        jx_fail(P->c, "line %d: expressions or blocks nested more than %d deep", cur(P)->line, JX_MAX_DEPTH);
}

/* a, b, c (a tuple when there is a comma); explicit: inside parentheses */
static jx_node *parse_tuple(parser *P, int with_cond, int explicit_parens)
{
    nvec v = {0};
    int line = cur(P)->line, comma = 0;
    for (;;) {
        if (v.n && (explicit_parens ? is_op(P, ")") : cur(P)->type == T_BLOCK_END || cur(P)->type == T_VAR_END ||
                                                          is_name(P, "if") || is_name(P, "recursive")))
            break;
        if (explicit_parens && !v.n && is_op(P, ")"))
            break;
        nv_push(P, &v, parse_expr(P, with_cond), NULL);
        if (!is_op(P, ","))
            break;
        comma = 1;
        P->at++;
    }
    if (v.n == 1 && !comma)
        return v.v[0];
    jx_node *t = mk(P, JN_TUPLE);
    t->line = line;
    set_kids(t, &v);
    return t;
}

static void parse_call_args(parser *P, jx_node *n)
{
    nvec v = {0};
    expect_op(P, "(");
    while (!is_op(P, ")")) {
        if (v.n)
            expect_op(P, ",");
        if (is_op(P, ")"))
            break;
        const char *kw = NULL;
        if (cur(P)->type == T_NAME && P->t[P->at + 1].type == T_OP && !strcmp(P->t[P->at + 1].s, "=")) {
            kw = cur(P)->s;
            P->at += 2;
        } else if (is_op(P, "*") || is_op(P, "**"))
            jx_fail(P->c, "line %d: *args and **kwargs in calls are not supported", cur(P)->line);
        else
            for (size_t i = 0; i < v.n; i++)
                if (v.names[i])
                    jx_fail(P->c, "line %d: a positional argument after a keyword argument", cur(P)->line);
        nv_push(P, &v, parse_expr(P, 1), kw);
    }
    P->at++;
    set_kids(n, &v);
}

static jx_node *parse_subscript(parser *P, jx_node *obj)
{
    jx_node *parts[3] = {0};
    int k = 0, slice = 0;
    for (;;) {
        if (!is_op(P, ":") && !is_op(P, "]"))
            parts[k] = parse_expr(P, 1);
        if (is_op(P, ":") && k < 2) {
            slice = 1;
            k++;
            P->at++;
            continue;
        }
        break;
    }
    expect_op(P, "]");
    jx_node *n = mk(P, slice ? JN_SLICE : JN_ITEM);
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    if (!slice && !n->b)
        jx_fail(P->c, "line %d: an empty subscript", n->line);
    return n;
}

static jx_node *parse_postfix(parser *P, jx_node *n)
{
    for (;;) {
        if (is_op(P, ".")) {
            P->at++;
            if (cur(P)->type == T_INT) {
                jx_node *it = mk(P, JN_ITEM), *lit = mk(P, JN_LIT);
                lit->lit = P->t[P->at++].v;
                it->a = n;
                it->b = lit;
                n = it;
                continue;
            }
            jx_node *a = mk(P, JN_ATTR);
            a->a = n;
            a->name = expect_name(P);
            n = a;
        } else if (is_op(P, "[")) {
            P->at++;
            n = parse_subscript(P, n);
        } else if (is_op(P, "(")) {
            jx_node *c = mk(P, JN_CALL);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else
            return n;
    }
}

static jx_node *parse_filter(parser *P, jx_node *operand)
{
    jx_node *f = mk(P, JN_FILTER);
    f->a = operand;
    f->name = expect_name(P);
    while (is_op(P, ".")) { /* dotted filter names: only the last part matters to us */
        P->at++;
        f->name = expect_name(P);
    }
    if (is_op(P, "("))
        parse_call_args(P, f);
    return f;
}

static jx_node *parse_filter_expr(parser *P, jx_node *n)
{
    for (;;) {
        if (is_op(P, "|")) {
            P->at++;
            n = parse_filter(P, n);
        } else if (is_name(P, "is")) {
            P->at++;
            jx_node *t = mk(P, JN_TEST);
            t->a = n;
            if (is_name(P, "not")) {
                t->op = 1;
                P->at++;
            }
            t->name = expect_name(P);
            tok *k = cur(P);
            if (is_op(P, "("))
                parse_call_args(P, t);
            else if ((k->type == T_NAME || k->type == T_STRING || k->type == T_INT || k->type == T_FLOAT ||
                      is_op(P, "[") || is_op(P, "{")) &&
                     !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and") && !is_name(P, "is")) {
                nvec v = {0};
                nv_push(P, &v, parse_postfix(P, parse_primary(P)), NULL);
                set_kids(t, &v);
            }
            n = t;
        } else if (is_op(P, "(")) {
            jx_node *c = mk(P, JN_CALL);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else
            return n;
    }
}

/* [a, b, ...] or {k: v, ...} (a trailing comma allowed), the opening
 * bracket current; a dict's kids alternate key, value. */
static jx_node *parse_items(parser *P)
{
    int dict = is_op(P, "{");
    const char *close = dict ? "}" : "]";
    nvec v = {0};
    P->at++;
    while (!is_op(P, close)) {
        if (v.n)
            expect_op(P, ",");
        if (is_op(P, close))
            break;
        nv_push(P, &v, parse_expr(P, 1), NULL);
        if (dict) {
            expect_op(P, ":");
            nv_push(P, &v, parse_expr(P, 1), NULL);
        }
    }
    P->at++;
    jx_node *n = mk(P, dict ? JN_DICT : JN_LIST);
    set_kids(n, &v);
    return n;
}

static jx_node *parse_primary(parser *P)
{
    tok *k = cur(P);
    jx_node *n;
    enter(P);
    if (k->type == T_NAME) {
        P->at++;
        n = mk(P, JN_LIT);
        n->line = k->line;
        if (!strcmp(k->s, "true") || !strcmp(k->s, "True"))
            n->lit = jv_bool(P->c, 1);
        else if (!strcmp(k->s, "false") || !strcmp(k->s, "False"))
            n->lit = jv_bool(P->c, 0);
        else if (!strcmp(k->s, "none") || !strcmp(k->s, "None"))
            n->lit = jv_new(P->c, JV_NONE);
        else {
            n->kind = JN_NAME;
            n->name = k->s;
        }
    } else if (k->type == T_STRING) {
        jx_sb b;
        jx_sb_init(&b, P->c);
        while (cur(P)->type == T_STRING) jx_sb_putv(&b, P->t[P->at++].v); /* adjacent literals join */
        n = mk(P, JN_LIT);
        n->line = k->line;
        n->lit = jx_sb_value(&b);
    } else if (k->type == T_INT || k->type == T_FLOAT) {
        P->at++;
        n = mk(P, JN_LIT);
        n->lit = k->v;
    } else if (is_op(P, "(")) {
        P->at++;
        n = parse_tuple(P, 1, 1);
        expect_op(P, ")");
    } else if (is_op(P, "[") || is_op(P, "{")) {
        n = parse_items(P);
    } else
        unexpected(P, "an expression");
    P->depth--;
    return n;
}

static jx_node *parse_unary(parser *P, int with_filter)
{
    jx_node *n;
    enter(P);
    if (is_op(P, "-") || is_op(P, "+")) {
        n = mk(P, is_op(P, "-") ? JN_NEG : JN_POS);
        P->at++;
        n->a = parse_unary(P, 0);
    } else
        n = parse_primary(P);
    n = parse_postfix(P, n);
    if (with_filter)
        n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static jx_node *bin(parser *P, int op, jx_node *a, jx_node *b)
{
    jx_node *n = mk(P, JN_BIN);
    n->op = op;
    n->a = a;
    n->b = b;
    n->line = a->line;
    return n;
}

static jx_node *parse_pow(parser *P)
{
    jx_node *n = parse_unary(P, 1);
    while (is_op(P, "**")) {
        P->at++;
        n = bin(P, JO_POW, n, parse_unary(P, 1));
    }
    return n;
}

static jx_node *parse_math2(parser *P)
{
    jx_node *n = parse_pow(P);
    for (;;) {
        int op = is_op(P, "*") ? JO_MUL : is_op(P, "/") ? JO_DIV : is_op(P, "//") ? JO_FLOORDIV
                 : is_op(P, "%") ? JO_MOD : -1;
        if (op < 0)
            return n;
        P->at++;
        n = bin(P, op, n, parse_pow(P));
    }
}

static jx_node *parse_concat(parser *P)
{
    jx_node *n = parse_math2(P);
    while (is_op(P, "~")) {
        P->at++;
        n = bin(P, JO_CONCAT, n, parse_math2(P));
    }
    return n;
}

static jx_node *parse_math1(parser *P)
{
    jx_node *n = parse_concat(P);
    for (;;) {
        int op = is_op(P, "+") ? JO_ADD : is_op(P, "-") ? JO_SUB : -1;
        if (op < 0)
            return n;
        P->at++;
        n = bin(P, op, n, parse_concat(P));
    }
}

static int cmp_op(parser *P)
{
    static const char *ops[] = {"==", "!=", "<", "<=", ">", ">="};
    static const int codes[] = {JO_EQ, JO_NE, JO_LT, JO_LE, JO_GT, JO_GE};
    for (int i = 0; i < 6; i++)
        if (is_op(P, ops[i])) {
            P->at++;
            return codes[i];
        }
    if (is_name(P, "in")) {
        P->at++;
        return JO_IN;
    }
    if (is_name(P, "not") && P->t[P->at + 1].type == T_NAME && !strcmp(P->t[P->at + 1].s, "in")) {
        P->at += 2;
        return JO_NOTIN;
    }
    return -1;
}

static jx_node *parse_compare(parser *P)
{
    jx_node *first = parse_math1(P);
    int op = cmp_op(P);
    if (op < 0)
        return first;
    nvec v = {0};
    size_t n_ops = 0, cap = 4;
    int *ops = jx_alloc(P->c, cap * sizeof *ops);
    nv_push(P, &v, first, NULL);
    while (op >= 0) {
        if (n_ops == cap) {
            int *o2 = jx_alloc(P->c, cap * 2 * sizeof *o2);
            memcpy(o2, ops, cap * sizeof *o2);
            ops = o2;
            cap *= 2;
        }
        ops[n_ops++] = op;
        nv_push(P, &v, parse_math1(P), NULL);
        op = cmp_op(P);
    }
    jx_node *n = mk(P, JN_CMP);
    n->line = first->line;
    set_kids(n, &v);
    n->ops = ops;
    return n;
}

static jx_node *parse_not(parser *P)
{
    if (is_name(P, "not")) {
        jx_node *n = mk(P, JN_NOT);
        P->at++;
        enter(P);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

/* operand (word operand)*, left-associative: "and", "or" */
static jx_node *parse_logic(parser *P, const char *word, jn_kind kind, jx_node *(*operand)(parser *))
{
    jx_node *n = operand(P);
    while (is_name(P, word)) {
        P->at++;
        jx_node *x = mk(P, kind);
        x->a = n;
        x->b = operand(P);
        n = x;
    }
    return n;
}

static jx_node *parse_and(parser *P)
{
    return parse_logic(P, "and", JN_AND, parse_not);
}

static jx_node *parse_or(parser *P)
{
    return parse_logic(P, "or", JN_OR, parse_and);
}

static jx_node *parse_expr(parser *P, int with_cond)
{
    enter(P);
    jx_node *n = parse_or(P);
    while (with_cond && is_name(P, "if")) {
        P->at++;
        jx_node *c = mk(P, JN_COND);
        c->a = n;
        c->b = parse_or(P);
        if (is_name(P, "else")) {
            P->at++;
            c->c = parse_expr(P, 1);
        }
        n = c;
    }
    P->depth--;
    return n;
}

/* ---- statements ------------------------------------------------------------------------------- */

static jx_node *parse_body(parser *P, const char *const *stops, const char **stopped);

static void end_tag(parser *P)
{
    expect(P, T_BLOCK_END, "the end of the tag ('%}')");
}

/* Parses a body ending at one of stops, and eats "{% <stop>" and, for an
 * end tag, the rest of it. Returns which stop in *stopped. */
static jx_node *body_until(parser *P, const char *const *stops, const char **stopped, const char *opened, int line)
{
    jx_node *b = parse_body(P, stops, stopped);
    if (!*stopped)
        jx_fail(P->c, "line %d: {%% %s %%} without {%% %s %%}", line, opened, stops[0]);
    return b;
}

static jx_node *parse_if(parser *P, int line)
{
    jx_node *n = mk(P, JN_IF);
    n->line = line;
    n->a = parse_expr(P, 1);
    end_tag(P);
    static const char *const stops[] = {"endif", "elif", "else", NULL};
    const char *s;
    n->b = body_until(P, stops, &s, "if", line);
    if (!strcmp(s, "elif")) {
        n->c = parse_if(P, cur(P)->line);
        return n;
    }
    if (!strcmp(s, "else")) {
        end_tag(P);
        static const char *const stops2[] = {"endif", NULL};
        n->c = body_until(P, stops2, &s, "else", line);
    }
    end_tag(P);
    return n;
}

static void parse_targets(parser *P, jx_node *n)
{
    nvec v = {0};
    int paren = is_op(P, "(");
    if (paren)
        P->at++;
    for (;;) {
        nv_push(P, &v, NULL, expect_name(P));
        if (!is_op(P, ","))
            break;
        P->at++;
    }
    if (paren)
        expect_op(P, ")");
    n->names = v.names;
    n->n_names = (int)v.n;
}

static jx_node *parse_for(parser *P, int line)
{
    jx_node *n = mk(P, JN_FOR);
    n->line = line;
    parse_targets(P, n);
    if (!is_name(P, "in"))
        unexpected(P, "'in'");
    P->at++;
    n->a = parse_tuple(P, 0, 0);
    if (is_name(P, "if")) {
        P->at++;
        n->b = parse_expr(P, 1);
    }
    if (is_name(P, "recursive"))
        jx_fail(P->c, "line %d: recursive loops are not supported", line);
    end_tag(P);
    static const char *const stops[] = {"endfor", "else", NULL};
    const char *s;
    n->c = body_until(P, stops, &s, "for", line);
    if (!strcmp(s, "else")) {
        end_tag(P);
        static const char *const stops2[] = {"endfor", NULL};
        n->d = body_until(P, stops2, &s, "for", line);
    }
    end_tag(P);
    return n;
}

/* | f | g ... as a node whose kids are the filters (operands NULL). */
static jx_node *parse_filter_chain(parser *P)
{
    jx_node *n = mk(P, JN_BODY);
    nvec v = {0};
    do {
        if (v.n)
            P->at++;
        nv_push(P, &v, parse_filter(P, NULL), NULL);
    } while (is_op(P, "|"));
    set_kids(n, &v);
    return n;
}

static jx_node *parse_set(parser *P, int line)
{
    const char *first = expect_name(P);
    jx_node *n;
    if (is_op(P, ".")) { /* set ns.attr = value */
        P->at++;
        n = mk(P, JN_SET);
        n->name = expect_name(P);
        n->names = jx_alloc(P->c, sizeof *n->names);
        n->names[0] = first;
        n->n_names = 1;
        expect_op(P, "=");
        n->c = parse_tuple(P, 1, 0);
        end_tag(P);
        n->line = line;
        return n;
    }
    P->at--;
    n = mk(P, JN_SET);
    n->line = line;
    parse_targets(P, n);
    if (is_op(P, "=")) {
        P->at++;
        n->c = parse_tuple(P, 1, 0);
        end_tag(P);
        return n;
    }
    n->kind = JN_SETBLOCK;
    if (n->n_names != 1)
        jx_fail(P->c, "line %d: a block set takes one name", line);
    if (is_op(P, "|")) {
        P->at++;
        n->a = parse_filter_chain(P);
    }
    end_tag(P);
    static const char *const stops[] = {"endset", NULL};
    const char *s;
    n->b = body_until(P, stops, &s, "set", line);
    end_tag(P);
    return n;
}

static jx_node *parse_macro(parser *P, int line)
{
    jx_node *n = mk(P, JN_MACRO);
    n->line = line;
    n->name = expect_name(P);
    expect_op(P, "(");
    nvec v = {0};
    while (!is_op(P, ")")) {
        if (v.n)
            expect_op(P, ",");
        const char *p = expect_name(P);
        jx_node *def = NULL;
        if (is_op(P, "=")) {
            P->at++;
            def = parse_expr(P, 1);
        }
        nv_push(P, &v, def, p);
    }
    P->at++;
    set_kids(n, &v);
    end_tag(P);
    static const char *const stops[] = {"endmacro", NULL};
    const char *s;
    n->b = body_until(P, stops, &s, "macro", line);
    if (cur(P)->type == T_NAME) /* {% endmacro name %} */
        P->at++;
    end_tag(P);
    return n;
}

static jx_node *parse_statement(parser *P)
{
    int line = cur(P)->line;
    const char *kw = expect_name(P);
    const char *s;
    if (!strcmp(kw, "if"))
        return parse_if(P, line);
    if (!strcmp(kw, "for"))
        return parse_for(P, line);
    if (!strcmp(kw, "set"))
        return parse_set(P, line);
    if (!strcmp(kw, "macro"))
        return parse_macro(P, line);
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        jx_node *n = mk(P, kw[0] == 'b' ? JN_BREAK : JN_CONTINUE);
        end_tag(P);
        return n;
    }
    if (!strcmp(kw, "filter")) {
        jx_node *n = mk(P, JN_FILTERBLOCK);
        n->a = parse_filter_chain(P);
        end_tag(P);
        static const char *const stops[] = {"endfilter", NULL};
        n->b = body_until(P, stops, &s, "filter", line);
        end_tag(P);
        return n;
    }
    if (!strcmp(kw, "generation")) { /* transformers' assistant-mask block: renders its body */
        end_tag(P);
        static const char *const stops[] = {"endgeneration", NULL};
        jx_node *n = mk(P, JN_SCOPE); /* a call block in transformers: its sets stay inside */
        n->line = line;
        n->b = body_until(P, stops, &s, "generation", line);
        end_tag(P);
        return n;
    }
    jx_fail(P->c, "line %d: unknown or unsupported tag '%s'", line, kw);
}

static jx_node *parse_body(parser *P, const char *const *stops, const char **stopped)
{
    nvec v = {0};
    *stopped = NULL;
    enter(P);
    for (;;) {
        tok *k = cur(P);
        if (k->type == T_EOF)
            break;
        if (k->type == T_TEXT) {
            jx_node *n = mk(P, JN_TEXT);
            n->lit = k->v;
            P->at++;
            nv_push(P, &v, n, NULL);
        } else if (k->type == T_VAR_BEGIN) {
            P->at++;
            jx_node *n = mk(P, JN_OUTPUT);
            n->a = parse_tuple(P, 1, 0);
            expect(P, T_VAR_END, "'}}'");
            nv_push(P, &v, n, NULL);
        } else if (k->type == T_BLOCK_BEGIN) {
            tok *name = &P->t[P->at + 1];
            int stop = 0;
            for (int i = 0; stops && stops[i] && name->type == T_NAME; i++)
                if (!strcmp(name->s, stops[i])) {
                    *stopped = stops[i];
                    stop = 1;
                }
            if (stop) {
                P->at += 2;
                break;
            }
            P->at++;
            nv_push(P, &v, parse_statement(P), NULL);
        } else
            unexpected(P, "text or a tag");
    }
    P->depth--;
    jx_node *b = mk(P, JN_BODY);
    set_kids(b, &v);
    return b;
}

/* jinja2 refuses an unknown filter or test when it compiles, except under
 * an if statement or a conditional expression, where it fails only when
 * that code runs; the evaluator fails there too. */
static void check_names(llm_jctx *c, const jx_node *n, int soft)
{
    if (!n)
        return;
    if (!soft && n->kind == JN_FILTER && !jx_filter_fn(n->name))
        jx_fail(c, "line %d: no filter named '%s'", n->line, n->name);
    if (!soft && n->kind == JN_TEST && !jx_test_fn(n->name))
        jx_fail(c, "line %d: no test named '%s'", n->line, n->name);
    soft |= n->kind == JN_IF || n->kind == JN_COND;
    check_names(c, n->a, soft);
    check_names(c, n->b, soft);
    check_names(c, n->c, soft);
    check_names(c, n->d, soft);
    for (int i = 0; i < n->n_kids; i++) check_names(c, n->kids[i], soft);
}

jx_node *jx_parse(llm_jctx *c, const char *src, size_t len)
{
    /* newlines as jinja2 normalises them, and its dropped final newline */
    char *s = jx_alloc(c, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else
            s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n')
        n--;
    lexer L = {.c = c, .src = s, .n = n, .line = 1};
    lex(&L);
    parser P = {.c = c, .t = L.toks};
    const char *stopped;
    jx_node *root = parse_body(&P, NULL, &stopped);
    if (cur(&P)->type != T_EOF)
        unexpected(&P, "the end of the template");
    check_names(c, root, 0);
    return root;
}
