/* json.c - JSON text read within bounds; see llm/json.h.
 *
 * The scan keeps the kinds of the open containers as bits of one word
 * (1: object), which is why the depth it checks is at most 64: it needs
 * no stack and no memory. It also counts what the parse will build
 * (containers, strings and their bytes, numbers, members, array items),
 * and the memory budget and the shared cap are held against that
 * estimate before jansson starts: jansson 2.14 cannot be failed part way
 * (when its lexer's buffer cannot grow it reads past the end of it: a
 * 14 KB body crashed it when an allocation was refused mid-parse), so it
 * never is for a budget. The estimate's constants are jansson's measured
 * peak per item (64-bit glibc, 16 bytes of malloc bookkeeping each). The
 * allocator hooks, installed once, process-wide, only count (llm_json_spent)
 * and note a real allocation failure. */
#include "llm/json.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* What a thread's allocations through jansson have come to. */
typedef struct json_tl {
    int on;            /* a parse runs on this thread: its allocations are counted */
    int oom;           /* malloc failed (during a parse or not) */
    size_t spent;      /* what all parses on this thread have allocated (llm_json_spent) */
} json_tl;

static _Thread_local json_tl tl;
static size_t shared_used; /* atomic: bytes of the parses running now, all threads */
static size_t shared_cap = LLM_JSON_SHARED_CAP; /* atomic (llm_json_set_shared_cap) */
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;

/* A chunk's bookkeeping in glibc's allocator, charged with each allocation. */
enum { CHUNK_OVERHEAD = 16 };

static void *json_alloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        tl.oom = 1;
    if (tl.on)
        tl.spent += n + CHUNK_OVERHEAD;
    return p;
}

static void json_release(void *p) { free(p); }

static void hooks_install(void) { json_set_alloc_funcs(json_alloc, json_release); }

void llm_json_init(void) { pthread_once(&hooks_once, hooks_install); }

void llm_json_oom_reset(void)
{
    llm_json_init();
    tl.oom = 0;
}

int llm_json_oom(void) { return tl.oom; }

/* ---- the scan ------------------------------------------------------------------- */

/* JSON's white space, and NUL: jansson passes over a NUL byte between
 * tokens, so the readers do too (they must find what its tree holds). */
static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0; }

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && is_ws(s[i])) i++;
    return i;
}

/* Past the string whose opening quote is at i: the offset after its
 * closing quote, or n + 1 when it does not close. */
static size_t skip_string(const char *s, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return n + 1;
}

/* Past a number or literal at i: the first byte that cannot be in one. */
static size_t skip_scalar(const char *s, size_t n, size_t i)
{
    while (i < n && !is_ws(s[i]) && !memchr(",:[]{}\"", s[i], 7)) i++;
    return i;
}

/* What a parse of a text will build, counted by the scan. */
typedef struct json_shape {
    size_t objects, arrays, items; /* items: values directly in arrays */
    size_t strings, string_bytes;  /* keys too */
    size_t members, numbers;
    size_t longest;                /* the longest string or number, bytes (the lexer's buffer) */
} json_shape;

/* Counts the token at i (a string or a scalar ending at e) into sh. */
static void shape_token(json_shape *sh, const char *s, size_t n, size_t i, size_t e, int in_array)
{
    size_t len = e - i;
    if (!sh)
        return;
    sh->items += in_array;
    sh->longest = len > sh->longest ? len : sh->longest;
    if (s[i] == '"') {
        size_t k = skip_ws(s, n, e);
        sh->strings++;
        sh->string_bytes += len;
        sh->members += k < n && s[k] == ':'; /* a key */
        sh->items -= in_array && k < n && s[k] == ':';
    } else if (s[i] == '-' || (s[i] >= '0' && s[i] <= '9')) {
        sh->numbers++;
    }
}

/* llm_json_scan, counting into sh (may be NULL) what the parse will build. */
static llm_status scan(const char *s, size_t n, int max_depth, size_t *end, json_shape *sh, llm_error *err)
{
    uint64_t kinds = 0; /* bit k: the container at depth k + 1 is an object */
    int depth = 0;
    size_t i = skip_ws(s, n, 0);
    if (max_depth > 64)
        max_depth = 64;
    if (i == n)
        return llm_errf(err, LLM_ERR_FORMAT, "no JSON value");
    while (i < n) {
        char c = s[i];
        int in_array = depth && !(kinds & 1);
        if (c == '"') {
            size_t e = skip_string(s, n, i);
            if (e > n)
                return llm_errf(err, LLM_ERR_FORMAT, "a string does not end");
            shape_token(sh, s, n, i, e, in_array);
            i = e;
        } else if (c == '[' || c == '{') {
            if (depth == max_depth)
                return llm_errf(err, LLM_ERR_TOO_LONG, "JSON nested deeper than %d levels (at byte %zu)", max_depth, i);
            if (sh) {
                sh->items += in_array;
                *(c == '{' ? &sh->objects : &sh->arrays) += 1;
            }
            kinds = kinds << 1 | (c == '{');
            depth++;
            i++;
        } else if (c == ']' || c == '}') {
            if (!depth || (int)(kinds & 1) != (c == '}'))
                return llm_errf(err, LLM_ERR_FORMAT, "'%c' at byte %zu closes nothing open", c, i);
            kinds >>= 1;
            depth--;
            i++;
        } else if (depth && (is_ws(c) || c == ',' || c == ':')) {
            i++;
            continue;
        } else {
            size_t k = skip_scalar(s, n, i);
            if (k > i)
                shape_token(sh, s, n, i, k, in_array);
            i = k > i ? k : i + 1; /* a stray delimiter at the top ends the value */
        }
        if (!depth)
            break;
    }
    if (depth)
        return llm_errf(err, LLM_ERR_FORMAT, "%d bracket%s still open at the end", depth, depth > 1 ? "s" : "");
    if (end)
        *end = i;
    return LLM_OK;
}

llm_status llm_json_scan(const char *s, size_t n, int max_depth, size_t *end, llm_error *err)
{
    return scan(s, n, max_depth, end, NULL, err);
}

/* ---- parsing ---------------------------------------------------------------------- */

/* What jansson 2.14's parse of sh will hold at its peak, bytes (each item
 * measured with its malloc bookkeeping: an object 228, an array 131, a
 * string 80 + its bytes (two allocations, the smallest glibc chunk for a
 * short one), a number 35, a member's pair 38, an array slot 16; the
 * lexer's buffer grows to twice the longest token). Over glibc's own
 * count of what the tree holds (mallinfo2) for 1 MiB texts: [{},...]
 * 1.03x, ["",...] 1.07x, messages 1.21x, tool lists 1.20x, token ids
 * 1.16x, one long string 3x (the lexer's buffer, freed at the end). */
static size_t shape_cost(const json_shape *sh)
{
    return 228 * sh->objects + 131 * sh->arrays + 16 * sh->items + 80 * sh->strings + sh->string_bytes +
           38 * sh->members + 35 * sh->numbers + 2 * sh->longest + 1024;
}

/* The memory budget of a text of n bytes (saturating). */
static size_t budget_of(size_t n)
{
    if (n > (SIZE_MAX - LLM_JSON_COST_FLOOR) / LLM_JSON_COST_PER_BYTE)
        return SIZE_MAX;
    return n * LLM_JSON_COST_PER_BYTE + LLM_JSON_COST_FLOOR;
}

/* Reserves cost bytes of the shared cap: 0, or -1 when others' parses
 * fill it. A parse within LLM_JSON_COST_FLOOR is never refused (small
 * requests never wait on large ones), nor one larger than the cap by
 * itself (bounded by its own budget: no retry would help it), nor one
 * while no other runs. The cap covers parses while they run, not the
 * trees kept after: counting kept trees let one tenant's slow requests
 * refuse everyone else's. */
static int reserve(size_t cost)
{
    size_t cap = __atomic_load_n(&shared_cap, __ATOMIC_RELAXED);
    size_t all = __atomic_add_fetch(&shared_used, cost, __ATOMIC_RELAXED);
    if (all > cap && cost > LLM_JSON_COST_FLOOR && cost <= cap && all > cost) {
        __atomic_sub_fetch(&shared_used, cost, __ATOMIC_RELAXED);
        return -1;
    }
    return 0;
}

/* The error of a parse jansson refused. */
static void parse_error(int oom, const json_error_t *je, llm_error *err)
{
    if (oom || json_error_code(je) == json_error_out_of_memory || !je->text[0])
        llm_errf(err, LLM_ERR_NOMEM, "out of memory while parsing JSON");
    else
        llm_errf(err, LLM_ERR_FORMAT, "invalid JSON at line %d column %d: %s", je->line, je->column, je->text);
}

json_t *llm_json_load(const char *s, size_t n, size_t flags, size_t *used, llm_error *err)
{
    json_shape sh = {0};
    llm_error scan_err = {0};
    /* a fault the scan sees other than depth is left to jansson, whose message gives line and column; it stops at
     * or before it, so it never goes deeper, nor builds more, than the scan counted */
    if (scan(s, n, LLM_JSON_MAX_DEPTH, NULL, &sh, &scan_err) == LLM_ERR_TOO_LONG) {
        llm_errf(err, LLM_ERR_TOO_LONG, "%s", scan_err.msg);
        return NULL;
    }
    size_t cost = shape_cost(&sh);
    int shared = !(flags & LLM_JSON_OWN);
    if (cost > budget_of(n)) {
        llm_errf(err, LLM_ERR_TOO_LONG, "the JSON text of %zu bytes would take about %zu bytes of memory to hold "
                 "(at most %d per byte of text, plus %zu KiB)", n, cost, LLM_JSON_COST_PER_BYTE, LLM_JSON_COST_FLOOR >> 10);
        return NULL;
    }
    if (shared && reserve(cost)) {
        llm_errf(err, LLM_ERR_QUEUE_FULL, "other requests' JSON parses take the %zu MiB they may have at once; retry",
                 __atomic_load_n(&shared_cap, __ATOMIC_RELAXED) >> 20);
        return NULL;
    }
    llm_json_init();
    json_error_t je;
    int oom_before = tl.oom;
    tl.on = 1;
    tl.oom = 0;
    json_t *v = json_loadb(s, n, flags & ~(size_t)LLM_JSON_OWN, &je);
    int oom = tl.oom;
    tl.on = 0;
    tl.oom |= oom_before;
    if (shared) /* the parse is over: its tree is the caller's */
        __atomic_sub_fetch(&shared_used, cost, __ATOMIC_RELAXED);
    if (v && used)
        *used = (size_t)je.position;
    if (!v)
        parse_error(oom, &je, err);
    return v;
}

size_t llm_json_spent(void) { return tl.spent; }

void llm_json_set_shared_cap(size_t bytes) { __atomic_store_n(&shared_cap, bytes, __ATOMIC_RELAXED); }

json_t *llm_json_loads(const char *s, size_t flags, llm_error *err)
{
    return llm_json_load(s, strlen(s), flags, NULL, err);
}

/* ---- reading a few fields ---------------------------------------------------------- */

/* Past the value at i (ws skipped first): its end, or 0 when none is
 * whole. Brackets are counted, not matched, and to any depth: a reader
 * steps over a value nested too deep to parse (and the parse of what it
 * finds checks the rest). */
static size_t value_end(const char *s, size_t n, size_t i)
{
    size_t depth = 0;
    for (i = skip_ws(s, n, i); i < n;) {
        char c = s[i];
        if (c == '"' && (i = skip_string(s, n, i)) > n)
            return 0;
        if (c == '[' || c == '{') {
            depth++;
            i++;
            continue;
        }
        if ((c == ']' || c == '}') && !depth)
            return 0;
        if (c == ']' || c == '}') {
            depth--;
            i++;
        } else if (depth && (is_ws(c) || c == ',' || c == ':')) {
            i++;
            continue;
        } else if (c != '"') {
            size_t k = skip_scalar(s, n, i);
            if (k == i)
                return 0; /* a delimiter where a value should be */
            i = k;
        }
        if (!depth)
            return i;
    }
    return 0;
}

int llm_json_item(llm_json_span arr, size_t *pos, llm_json_span *item)
{
    const char *s = arr.p;
    size_t n = arr.n, i = *pos;
    if (i == 0) { /* the opening bracket */
        i = skip_ws(s, n, 0);
        if (i >= n || s[i] != '[')
            return 0;
        i++;
    } else if ((i = skip_ws(s, n, i)) < n && s[i] == ',') {
        i++;
    } else {
        return 0; /* the end (or no comma: malformed) */
    }
    i = skip_ws(s, n, i);
    size_t e = i < n && s[i] != ']' ? value_end(s, n, i) : 0;
    if (!e)
        return 0;
    *item = (llm_json_span){s + i, e - i};
    *pos = e;
    return 1;
}

static int next_char(llm_json_span v, size_t *i, char b[4]);

/* Whether the string span k (quotes included) decodes to key: compared a
 * piece at a time, so a key of any length and escapes may match. */
static int key_is(llm_json_span k, const char *key)
{
    size_t len = strlen(key), at = 0, i = 1;
    if (!memchr(k.p, '\\', k.n))
        return k.n == len + 2 && !memcmp(k.p + 1, key, len);
    while (i < k.n && k.p[i] != '"') {
        char b[4];
        int n = next_char(k, &i, b);
        if (n < 0 || at + (size_t)n > len || memcmp(key + at, b, (size_t)n))
            return 0;
        at += (size_t)n;
    }
    return at == len;
}

int llm_json_member(llm_json_span obj, const char *key, llm_json_span *val)
{
    const char *s = obj.p;
    size_t n = obj.n, i = skip_ws(s, n, 0);
    if (i >= n || s[i] != '{')
        return 0;
    for (i = skip_ws(s, n, i + 1); i < n && s[i] == '"';) {
        size_t ke = skip_string(s, n, i), vs, ve;
        if (ke > n || (vs = skip_ws(s, n, ke)) >= n || s[vs] != ':' || !(ve = value_end(s, n, vs + 1)))
            return 0;
        if (key_is((llm_json_span){s + i, ke - i}, key)) {
            vs = skip_ws(s, n, vs + 1);
            *val = (llm_json_span){s + vs, ve - vs};
            return 1;
        }
        i = skip_ws(s, n, ve);
        if (i >= n || s[i] != ',')
            return 0;
        i = skip_ws(s, n, i + 1);
    }
    return 0;
}

/* ---- string values -------------------------------------------------------------------- */

static int hex4(const char *p, size_t left, unsigned *out)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = k < (int)left ? p[k] : 0;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v << 4 | (unsigned)d;
    }
    *out = v;
    return 0;
}

/* Code point cp as UTF-8 into b (4 bytes room); its length. */
static int utf8_put(unsigned cp, char *b)
{
    if (cp < 0x80)
        return b[0] = (char)cp, 1;
    if (cp < 0x800)
        return b[0] = (char)(0xC0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return b[0] = (char)(0xE0 | cp >> 12), b[1] = (char)(0x80 | (cp >> 6 & 0x3F)), b[2] = (char)(0x80 | (cp & 0x3F)), 3;
    b[0] = (char)(0xF0 | cp >> 18), b[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    b[2] = (char)(0x80 | (cp >> 6 & 0x3F)), b[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The escape at p[0] == '\\' (left bytes from it) as UTF-8 into b: its
 * length, with *used the escape's bytes; -1 when malformed. A lone
 * surrogate becomes U+FFFD. */
static int unescape(const char *p, size_t left, char *b, size_t *used)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *k = left > 1 && p[1] ? strchr(from, p[1]) : NULL;
    unsigned cp, lo;
    *used = 2;
    if (k)
        return b[0] = to[k - from], 1;
    if (left < 6 || p[1] != 'u' || hex4(p + 2, left - 2, &cp))
        return -1;
    *used = 6;
    if (cp >= 0xD800 && cp < 0xDC00 && left >= 12 && p[6] == '\\' && p[7] == 'u' && !hex4(p + 8, left - 8, &lo) &&
        lo >= 0xDC00 && lo < 0xE000) {
        *used = 12;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xD800 && cp < 0xE000) {
        cp = 0xFFFD;
    }
    return utf8_put(cp, b);
}

/* The length of out[0..k) without a last UTF-8 character that is not whole. */
static size_t utf8_whole(const char *out, size_t k)
{
    size_t st = k;
    while (st && k - st < 4 && ((unsigned char)out[st - 1] & 0xC0) == 0x80) st--;
    if (!st || !((unsigned char)out[st - 1] & 0x80))
        return k; /* ASCII last, or stray continuation bytes (kept as they came) */
    unsigned char lead = (unsigned char)out[st - 1];
    size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    return k - (st - 1) >= want ? k : st - 1;
}

/* The string piece of v at *i (inside its quotes) into b: a raw byte, or
 * an escape decoded to UTF-8; its length (*i moved past it), or -1 when an
 * escape is malformed. */
static int next_char(llm_json_span v, size_t *i, char b[4])
{
    size_t used = 1;
    int len = 1;
    b[0] = v.p[*i];
    if (v.p[*i] == '\\' && (len = unescape(v.p + *i, v.n - *i, b, &used)) < 0)
        return -1;
    *i += used;
    return len;
}

long llm_json_string(llm_json_span v, char *out, size_t cap)
{
    size_t i, k = 0;
    int cut = 0;
    if (!cap || v.n < 2 || v.p[0] != '"')
        return -1;
    for (i = 1; i < v.n && v.p[i] != '"';) {
        char b[4];
        size_t at = i;
        int len = next_char(v, &i, b);
        if (len < 0)
            return -1;
        if (k + (size_t)len >= cap) {
            i = at;
            cut = 1;
            break;
        }
        memcpy(out + k, b, (size_t)len);
        k += (size_t)len;
    }
    if (!cut && i >= v.n)
        return -1; /* no closing quote */
    if (cut)
        k = utf8_whole(out, k);
    out[k] = 0;
    return (long)k;
}
