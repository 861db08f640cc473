/* jinja_impl.h - what the Jinja modules share (not an API): the arena, the
 * value and syntax-tree types, the string builder and the evaluator state.
 *   jinja_value.c  arena, values, Python's str()/repr(), JSON, comparisons
 *   jinja_parse.c  lexer (whitespace control) and parser -> jx_node tree
 *   jinja_eval.c   statements and expressions; llm_jinja_render
 *   jinja_lib.c    filters, tests, methods and global functions
 *
 * Errors while rendering unwind with longjmp to llm_jinja_render (and while
 * compiling, to llm_jinja_compile): Jinja's semantics are Python's
 * exceptions, which return codes through every expression would bury, and
 * it is safe here because everything a render allocates lives in the arena
 * it frees at the end. Thread rules: a jx_run and its arena belong to one
 * thread; the compiled tree is read-only while rendering. */
#ifndef LLM_JINJA_IMPL_H
#define LLM_JINJA_IMPL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "llm/jinja.h"

/* How deep values (in str(), repr() and tojson), expressions and blocks
 * (when parsing) may nest, and macro calls at run time. */
#define JX_MAX_DEPTH 256
#define JX_MACRO_DEPTH 64

/* ---- arena ---------------------------------------------------------------- */

typedef struct jx_block jx_block;
struct llm_jctx {
    jx_block *head;
    size_t used, limit;
    int over_budget; /* the last failed allocation hit limit (rather than malloc failing) */
    llm_jinja_limits lim;
    jmp_buf *fail;   /* set while a render or compile runs: where an error unwinds to */
    llm_error *err;
};

/* n bytes (aligned, zeroed) from c, or NULL once c->limit is reached. */
void *jx_alloc_or_null(llm_jctx *c, size_t n);
/* The same, and an out-of-memory error (unwinding) instead of NULL. */
void *jx_alloc(llm_jctx *c, size_t n);
/* Unwinds with LLM_ERR_TEMPLATE and the message. */
_Noreturn void jx_fail(llm_jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- values --------------------------------------------------------------- */

typedef enum jv_kind {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_FUNC
} jv_kind;

typedef struct jx_run jx_run;
typedef struct jx_node jx_node;
typedef struct jx_scope jx_scope;

/* Arguments of a call, evaluated: positional ones, then keyword ones. */
typedef struct jx_args {
    llm_jv **pos;
    int n_pos;
    const char **kw_names;
    llm_jv **kw;
    int n_kw;
} jx_args;

typedef llm_jv *(*jx_builtin)(jx_run *r, llm_jv *self, const jx_args *a);

typedef struct jv_entry {
    llm_jv *key, *val;
} jv_entry;

struct llm_jv {
    jv_kind kind;
    union {
        int b;
        long long i;
        double f;
        struct {
            const char *s;
            size_t n;
            const unsigned char *taint; /* per byte 1 = tenant data; NULL: none is */
            int safe;                   /* markupsafe's Markup (from |safe): what is added to it is escaped */
        } str;
        struct {
            llm_jv **items;
            size_t n, cap;
            int tuple;
            int lazy; /* what jinja2 gives as an iterator: 1 a generator (map, select, ...: no len(), always
                       * true), 2 a dict view (items(), keys(): len() works), 3 a generator whose filter
                       * failed, which raises (undef_name) once iterated; none indexes nor goes to JSON */
        } list;
        struct { /* JV_DICT and JV_NS (a namespace: the same, assignable attributes) */
            jv_entry *e;
            size_t n, cap;
            uint32_t *index; /* open addressing over e, built past 8 entries; 0 = empty, else slot + 1 */
            size_t index_cap;
        } dict;
        struct {
            jx_builtin fn;           /* a builtin (method: self bound) */
            llm_jv *self;
            const jx_node *macro;    /* or a macro */
            jx_scope *closure;
            const char *name;
        } func;
    } u;
    const char *undef_name; /* JV_UNDEF: what was missing, for the error a use of it raises */
};

llm_jv *jv_new(llm_jctx *c, jv_kind k);
llm_jv *jv_undef(llm_jctx *c, const char *what);
llm_jv *jv_bool(llm_jctx *c, int b);
llm_jv *jv_int(llm_jctx *c, long long i);
llm_jv *jv_float(llm_jctx *c, double f);
/* A string copying s; taint NULL: clean, else n per-byte marks copied. */
llm_jv *jv_str(llm_jctx *c, const char *s, size_t n, const unsigned char *taint);
llm_jv *jv_cstr(llm_jctx *c, const char *s);
llm_jv *jv_list(llm_jctx *c, size_t cap);
void jv_push(llm_jctx *c, llm_jv *list, llm_jv *v);
llm_jv *jv_dict(llm_jctx *c);
/* dict[key] = v, replacing an equal key in place (Python's order). */
void jv_dict_set(llm_jctx *c, llm_jv *d, llm_jv *key, llm_jv *v);
/* dict[key] or NULL. */
llm_jv *jv_dict_get(const llm_jv *d, const llm_jv *key);
llm_jv *jv_dict_gets(const llm_jv *d, const char *key);

int jv_truthy(const llm_jv *v);
/* Python's ==. */
int jv_equal(const llm_jv *a, const llm_jv *b);
/* Python's <: -1, 0, 1, or an error for values Python will not order. */
int jv_compare(llm_jctx *c, const llm_jv *a, const llm_jv *b);
const char *jv_type_name(const llm_jv *v);
/* Number of code points of a UTF-8 string. */
size_t jv_utf8_len(const char *s, size_t n);
/* Byte offset of code point i (i <= length). */
size_t jv_utf8_offset(const char *s, size_t n, size_t i);

/* ---- string builder ---------------------------------------------------------- */

typedef struct jx_sb {
    llm_jctx *c;
    char *p;
    unsigned char *taint; /* NULL until a tenant byte arrives */
    size_t n, cap;
} jx_sb;

void jx_sb_init(jx_sb *b, llm_jctx *c);
void jx_sb_put(jx_sb *b, const char *s, size_t n, const unsigned char *taint);
void jx_sb_puts(jx_sb *b, const char *s);
void jx_sb_printf(jx_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends a string value's bytes with their marks. */
void jx_sb_putv(jx_sb *b, const llm_jv *s);
/* The built string as a value. */
llm_jv *jx_sb_value(jx_sb *b);

/* Python's str(v) (for {{ v }}: strings as they are) and repr(v). */
void jv_write_str(jx_sb *b, const llm_jv *v);
void jv_write_repr(jx_sb *b, const llm_jv *v);
llm_jv *jv_to_str(llm_jctx *c, const llm_jv *v);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys). indent < 0: none. */
void jv_write_json(jx_sb *b, const llm_jv *v, int indent, const char *item_sep, const char *key_sep, int sort_keys,
                   int depth);

/* ---- syntax tree --------------------------------------------------------------- */

typedef enum jn_kind {
    /* statements */
    JN_BODY, JN_TEXT, JN_OUTPUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_FILTERBLOCK, JN_BREAK,
    JN_CONTINUE, JN_SCOPE,
    /* expressions */
    JN_LIT, JN_NAME, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST, JN_NEG, JN_POS, JN_NOT, JN_AND, JN_OR,
    JN_BIN, JN_CMP, JN_COND, JN_LIST, JN_TUPLE, JN_DICT
} jn_kind;

/* Binary operators and comparisons (JN_BIN: op; JN_CMP: ops[] per link). */
enum { JO_ADD, JO_SUB, JO_MUL, JO_DIV, JO_FLOORDIV, JO_MOD, JO_POW, JO_CONCAT,
       JO_EQ, JO_NE, JO_LT, JO_LE, JO_GT, JO_GE, JO_IN, JO_NOTIN };

struct jx_node {
    jn_kind kind;
    int line;
    int op;              /* JN_BIN; JN_TEST: 1 = negated; JN_FOR: 1 = recursive */
    const char *name;    /* JN_NAME, JN_ATTR, JN_FILTER, JN_TEST, JN_MACRO */
    llm_jv *lit;         /* JN_LIT, JN_TEXT */
    jx_node *a, *b, *c, *d;
    jx_node **kids;      /* bodies, arguments, list items, comparison operands */
    const char **names;  /* keyword names per kid (NULL: positional), targets, macro parameters */
    int *ops;            /* JN_CMP */
    int n_kids, n_names;
};

struct llm_jinja {
    llm_jctx *arena; /* the tree's memory */
    jx_node *root;
};

/* Parses src (already in c) into a tree; errors unwind. */
jx_node *jx_parse(llm_jctx *c, const char *src, size_t len);

/* ---- evaluation ------------------------------------------------------------------ */

struct jx_scope {
    jx_scope *parent;
    llm_jv *vars; /* a dict */
};

struct jx_run {
    llm_jctx *c;
    jx_scope *root;
    long steps;
    int depth;
    jx_sb *out;
};

/* k, when Python could hash it (a dict key): else an error. */
llm_jv *jx_hashable(jx_run *r, llm_jv *k);
/* A value's attribute (obj.name) and item (obj[key]), Jinja's rules. */
llm_jv *jx_getattr(jx_run *r, llm_jv *obj, const char *name);
llm_jv *jx_getitem(jx_run *r, llm_jv *obj, llm_jv *key);
/* Calls a function value. */
llm_jv *jx_call(jx_run *r, llm_jv *fn, const jx_args *a);
/* A builtin method of self (strip, items, ...) bound as a function, or NULL. */
llm_jv *jx_method(jx_run *r, llm_jv *self, const char *name);
/* Filter and test by name: NULL when there is none. */
jx_builtin jx_filter_fn(const char *name);
jx_builtin jx_test_fn(const char *name);
/* Python's fmt % args for %s %r %d %i %%: other conversions are refused. */
llm_jv *jx_percent_format(jx_run *r, llm_jv *fmt, llm_jv *args);
/* markupsafe.escape(s): & < > " ' as HTML entities, marked safe. */
llm_jv *jx_html_escape(jx_run *r, llm_jv *s);
/* A global function (range, namespace, raise_exception, strftime_now, ...). */
jx_builtin jx_global_fn(const char *name);
/* Iteration: the items of v as a list (dict: keys; str: characters). */
llm_jv *jx_iterable(jx_run *r, llm_jv *v);
/* One evaluation step against the budget. */
void jx_step(jx_run *r);

#endif
