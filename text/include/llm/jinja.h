/* jinja.h - a Jinja2 template interpreter for chat templates (the GGUF key
 * tokenizer.chat_template). It renders what Python's jinja2 renders in the
 * environment Hugging Face's transformers uses for chat templates
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls,
 * the {% generation %} block, tojson with ensure_ascii off, the globals
 * raise_exception and strftime_now), byte for byte on the templates that
 * popular models publish (tests/integration/test_jinja_oracle.py holds it
 * to jinja2 on ../shared/testdata/chat-templates).
 *
 * Supported: text with whitespace control (-, +, trim/lstrip blocks),
 * comments, raw; if/elif/else, for (unpacking, filter clause, else, loop.*,
 * break, continue), set (names, tuples, namespace attributes, blocks),
 * macros (defaults, keyword arguments), filter blocks, generation blocks;
 * expressions with Python's operators and values (None, bool, int, float,
 * str, list, tuple, dict), attribute and item access, slices, calls,
 * filters, tests, and the str/dict methods templates call (strip, split,
 * startswith, replace, format, get, items, ...). Lists and dicts are
 * immutable, as in the sandbox; anything outside the subset is a compile or
 * render error naming it, never a silent difference.
 *
 * Tenant data: strings made with tenant = 1 (message contents, tool
 * arguments) carry a per-byte mark through every string operation, so the
 * rendered text says which bytes came from the request: those are the spans
 * to tokenize as plain text (llm_tokenize_guarded), never as control tokens.
 *
 * Bounds: a render fails with LLM_ERR_TEMPLATE once it has used more than
 * llm_jinja_limits.max_bytes of memory or max_steps evaluation steps
 * (LLM_ERR_NOMEM is for the system's memory running out), nests macro
 * calls deeper than 64 or values or expressions deeper than 256; the
 * template text is at most LLM_JINJA_MAX_SRC.
 *
 * Ownership: a compiled llm_jinja is immutable and may render from several
 * threads at once. Values live in an llm_jctx (an arena): made there, freed
 * all together by llm_jctx_free; one llm_jctx belongs to one thread. */
#ifndef LLM_JINJA_H
#define LLM_JINJA_H

#include <stddef.h>

#include "llm/status.h"
#include "llm/utf8.h"

#define LLM_JINJA_MAX_SRC ((size_t)1 << 20) /* template text, bytes */

typedef struct llm_jinja llm_jinja;
typedef struct llm_jctx llm_jctx;
typedef struct llm_jv llm_jv;

/* Compiles a template. LLM_ERR_TEMPLATE with the line and the cause, or
 * LLM_ERR_TOO_LONG, LLM_ERR_NOMEM. */
llm_status llm_jinja_compile(const char *src, size_t len, llm_jinja **out, llm_error *err);
void llm_jinja_free(llm_jinja *t);

typedef struct llm_jinja_limits {
    size_t max_bytes; /* memory one render may use (values and text); 0: 64 MiB */
    long max_steps;   /* expression and statement evaluations; 0: 20 million */
    double now;       /* the time strftime_now formats (seconds since 1970, local time); 0: the clock */
} llm_jinja_limits;

/* A context for values and one render; NULL when out of memory. The
 * limits are copied (NULL: defaults). */
llm_jctx *llm_jctx_new(const llm_jinja_limits *limits);
void llm_jctx_free(llm_jctx *c);

/* Values, made in c. Each returns NULL when c's memory is spent (or s is
 * NULL); the functions that take values accept NULL and then fail, so a
 * caller can build a whole tree and check once. tenant marks a string's
 * bytes as request data (see above). */
llm_jv *llm_jv_none(llm_jctx *c);
llm_jv *llm_jv_bool(llm_jctx *c, int b);
llm_jv *llm_jv_int(llm_jctx *c, long long i);
llm_jv *llm_jv_float(llm_jctx *c, double f);
llm_jv *llm_jv_str(llm_jctx *c, const char *s, size_t n, int tenant);
llm_jv *llm_jv_list(llm_jctx *c);
llm_jv *llm_jv_dict(llm_jctx *c);
/* Appends v to list; LLM_ERR_NOMEM (also for a NULL list or v, which is
 * what a failed constructor gave), LLM_ERR_INVALID_ARG for a non-list. */
llm_status llm_jv_append(llm_jctx *c, llm_jv *list, llm_jv *v);
/* Sets dict[key] = v (a key made with llm_jv_str, tenant as given); errors
 * as llm_jv_append (a non-dict is LLM_ERR_INVALID_ARG). */
llm_status llm_jv_set(llm_jctx *c, llm_jv *dict, const char *key, size_t key_len, int tenant, llm_jv *v);

/* Renders t with the variables of vars (a dict). Returns the text
 * (malloc'd, NUL-terminated; *len its length without the NUL) and, when
 * spans is not NULL, *spans (malloc'd, caller frees; NULL when none) the
 * *n_spans byte ranges made of tenant bytes, in order. NULL with err set:
 * LLM_ERR_TEMPLATE (the template raised, or failed: the message says where
 * and why), LLM_ERR_NOMEM, LLM_ERR_INVALID_ARG. c must be fresh or used
 * only to build vars; the render adds to it. */
char *llm_jinja_render(const llm_jinja *t, llm_jctx *c, llm_jv *vars, size_t *len, llm_span **spans, int *n_spans,
                       llm_error *err);

#endif
