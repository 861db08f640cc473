/* json.h - JSON text from clients, pods and the model, read within
 * bounds: the one way the programs turn JSON text into jansson values.
 *
 * jansson's parser and its dump recurse once per nesting level and its
 * parser allows 2,048 levels: far more than a request thread's stack
 * holds. Its values also cost up to ~70 bytes of memory per byte of text
 * (`[{},{},...]`). So every text is first scanned without recursion or
 * allocation (nesting at most LLM_JSON_MAX_DEPTH, brackets balanced), then
 * parsed under a memory budget (LLM_JSON_COST_PER_BYTE times its length,
 * plus LLM_JSON_COST_FLOOR), counted by jansson's allocator hooks on the
 * parsing thread, and under a cap shared by the parses of every thread
 * running at once (LLM_JSON_SHARED_CAP). A value that came from
 * llm_json_load is at most LLM_JSON_MAX_DEPTH deep, so dumping it (or it
 * inside a few levels of our own) recurses a bounded number of times too.
 * `make lint` keeps jansson's json_load* out of the programs' sources.
 *
 * The scan functions also serve readers that need a few fields of a large
 * body without building it (llm-router): llm_json_member finds a top-level
 * member's value, llm_json_item walks an array, llm_json_string decodes a
 * string value; none allocates more than the string it decodes.
 *
 * Thread-safety: every function may be called from any thread; the
 * budget and the out-of-memory flag are per thread. */
#ifndef LLM_JSON_H
#define LLM_JSON_H

#include <jansson.h>
#include <stddef.h>

#include "llm/status.h"

/* Nesting levels of a value read from a client, a pod or the model (a
 * request body is 1; OpenAI's own schemas allow 10 levels, i.e. ~25 here). */
#define LLM_JSON_MAX_DEPTH 64
/* What one parse may allocate (its tree, and buffers freed on the way):
 * this many times its text, plus the floor. Typical bodies take 1-20
 * (strings 1, token arrays 7, messages 14, small schemas 19); `[{},...]` 70. */
#define LLM_JSON_COST_PER_BYTE 32
#define LLM_JSON_COST_FLOOR ((size_t)64 << 10)
/* What the parses running at once, on all threads, may hold together; a
 * parse within LLM_JSON_COST_FLOOR always may (small bodies never wait on
 * large ones). */
#define LLM_JSON_SHARED_CAP ((size_t)256 << 20)

/* Flags of llm_json_load beside jansson's own (JSON_REJECT_DUPLICATES,
 * JSON_DECODE_ANY):
 *   LLM_JSON_PREFIX  the text may go on after the first value
 *                    (JSON_DISABLE_EOF_CHECK); *used then says where it ended;
 *   LLM_JSON_OWN     outside the shared cap: the model's output, whose work
 *                    is done (its own budget holds). */
#define LLM_JSON_PREFIX JSON_DISABLE_EOF_CHECK
#define LLM_JSON_OWN ((size_t)1 << 29)

/* Parses s[0..n) within the bounds above. The value (the caller's
 * reference), or NULL with err: LLM_ERR_TOO_LONG (nested deeper than
 * LLM_JSON_MAX_DEPTH, or over its memory budget; the message names the
 * limit), LLM_ERR_QUEUE_FULL (other parses running now fill
 * LLM_JSON_SHARED_CAP: try again later), LLM_ERR_FORMAT (not JSON: line,
 * column and reason), LLM_ERR_NOMEM (the process is out of memory). With LLM_JSON_PREFIX,
 * *used (may be NULL) gets the bytes the value took. */
json_t *llm_json_load(const char *s, size_t n, size_t flags, size_t *used, llm_error *err);
/* llm_json_load of a NUL-terminated text. */
json_t *llm_json_loads(const char *s, size_t flags, llm_error *err);
/* What every parse on this thread has allocated (trees and buffers freed
 * on the way), since the thread began: a request on a thread of its own
 * knows what its JSON cost (llm_heap_after trims after a costly one). */
size_t llm_json_spent(void);
/* Sets the shared cap (LLM_JSON_SHARED_CAP by default): for tests, and a
 * program that sizes it to its memory. */
void llm_json_set_shared_cap(size_t bytes);

/* Checks the first JSON value of s[0..n) for nesting at most max_depth
 * (<= 64) and balanced brackets, without recursion or allocation, and
 * puts the offset just past it in *end (may be NULL). Strings and
 * numbers are skipped, not checked (the parser does that).
 * LLM_ERR_TOO_LONG when deeper (the message names the byte),
 * LLM_ERR_FORMAT when the brackets or strings do not close. */
llm_status llm_json_scan(const char *s, size_t n, int max_depth, size_t *end, llm_error *err);

/* A piece of a JSON text: the bytes of one value. */
typedef struct llm_json_span {
    const char *p;
    size_t n;
} llm_json_span;

/* The value of member key of the object in obj (its first, when a key
 * repeats), found with the scan above: 1 and *val, 0 when obj is no
 * object or has no such member (or is deeper than LLM_JSON_MAX_DEPTH or
 * malformed: a reader of a few fields is not the validator). Keys written
 * with escapes are compared as decoded. */
int llm_json_member(llm_json_span obj, const char *key, llm_json_span *val);
/* Array walk: *pos starts at 0; each call puts the next item of the array
 * in arr into *item and returns 1, 0 at its end (or when arr is no array,
 * or malformed). */
int llm_json_item(llm_json_span arr, size_t *pos, llm_json_span *item);
/* The string value v decoded (escapes, surrogate pairs; a lone surrogate
 * as U+FFFD) into out, NUL-terminated: at most cap - 1 bytes, a longer
 * string cut after its last whole UTF-8 character that fits. Its length,
 * or -1 when v is no string or an escape in it is malformed. */
long llm_json_string(llm_json_span v, char *out, size_t cap);

/* Installs the allocator hooks (once; any later call is a no-op). The
 * functions here install them themselves; a program calls this first so
 * that every jansson allocation goes through them, and llm_json_oom sees
 * a failed one anywhere. */
void llm_json_init(void);

/* Whether jansson's allocator failed on this thread since the last
 * llm_json_oom_reset (jansson reports some such failures as syntax
 * errors, and drops an object key it cannot store while dumping). */
void llm_json_oom_reset(void);
int llm_json_oom(void);

#endif
