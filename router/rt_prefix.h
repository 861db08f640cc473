/* rt_prefix.h - what llm-router believes each backend's prefix cache
 * holds, for the cache-aware choice (rt_pool.h).
 *
 * A request's prompt, as the router sees it: bytes read from the body's
 * text, not rendered (the chat template is the pod's business) - the
 * partition first (the model, the Authorization header and the cache_salt
 * field: a pod keeps one prefix cache per tenant and salt, so what one key
 * sent is no hit for another), then the tools, then each message's role
 * and content as the client encoded them, or the completion's prompt.
 * Its chain: one 64-bit link per whole RT_PREFIX_CHUNK bytes from the
 * start, each the keyed hash (llm/hash.h) of the link before and its
 * chunk, so two prompts share link k only when they share their first
 * (k+1) * RT_PREFIX_CHUNK bytes (barring a collision, which misroutes one
 * request and does nothing else). Past RT_PREFIX_MAX_LINKS links the rest
 * is not looked at (cost stays linear and bounded per request).
 *
 * One backend's index: the links of the chains sent to it, in two
 * generations. A link goes into the current one; when that holds half the
 * index's capacity it becomes the previous one and the one before is
 * forgotten; a link found in the previous one is moved to the current one
 * when sent again. So the index forgets the prefixes sent longest ago
 * first, as the pod's cache does, and holds between cap/2 and cap links.
 * A chain is inserted whole, so a link present means the links before it
 * are too: the longest prefix present is found by bisection.
 *
 * Ownership: an index owns its tables; chains are the caller's.
 * Thread-safety: none; rt_pool calls these under its mutex. The chain of a
 * request (rt_prefix_chain_of) touches nothing shared. */
#ifndef RT_PREFIX_H
#define RT_PREFIX_H

#include <stddef.h>
#include <stdint.h>

#include "llm/json.h"
#include "llm/status.h"

#define RT_PREFIX_CHUNK 256
#define RT_PREFIX_MAX_LINKS 1024 /* 256 KiB of prompt: a link array is 8 KiB */
#define RT_PREFIX_MIN_CAP 64
#define RT_PREFIX_MAX_CAP 16384  /* links per backend: 256 KiB of tables */
#define RT_PREFIX_DEFAULT_CAP 4096 /* until the pod says its cache size */
/* Request text per token, about (English in JSON): a pod whose cache holds
 * T tokens holds about T * this / RT_PREFIX_CHUNK links. */
#define RT_PREFIX_BYTES_PER_TOKEN 4

/* A request's chain. */
typedef struct rt_prefix_chain {
    uint64_t link[RT_PREFIX_MAX_LINKS];
    int n;          /* whole chunks (at most RT_PREFIX_MAX_LINKS) */
    size_t bytes;   /* all the prompt bytes read, the last partial chunk's too */
} rt_prefix_chain;

/* The chain of a request: body is its JSON text, auth its Authorization
 * header (NULL: none). A body that is no object gives an empty chain. */
void rt_prefix_chain_of(llm_json_span body, const char *auth, rt_prefix_chain *out);

typedef struct rt_prefix_index rt_prefix_index;

/* A new, empty index of capacity cap links (clamped to
 * RT_PREFIX_MIN_CAP..RT_PREFIX_MAX_CAP); its tables are allocated at the
 * first insert. */
llm_status rt_prefix_index_new(int cap, rt_prefix_index **out, llm_error *err);
void rt_prefix_index_free(rt_prefix_index *x);
/* A new capacity (the pod's cache size changed): applies at the next
 * generation; a smaller one forgets everything now. */
void rt_prefix_index_set_cap(rt_prefix_index *x, int cap);
int rt_prefix_index_cap(const rt_prefix_index *x);
/* Links held now. */
int rt_prefix_index_size(const rt_prefix_index *x);
/* How many of the chain's first links the index holds (0..n). */
int rt_prefix_match(const rt_prefix_index *x, const uint64_t *link, int n);
/* Records the chain as sent to the backend. 0, or -1 when the tables
 * could not be allocated (the index then stays as it was). */
int rt_prefix_insert(rt_prefix_index *x, const uint64_t *link, int n);
/* Forgets everything (the backend restarted). */
void rt_prefix_index_clear(rt_prefix_index *x);

#endif
