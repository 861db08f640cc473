/* kube_watch.h - list-then-watch of one collection, the base of an
 * informer: the current objects are delivered as SYNC events and SYNCED
 * once all are, then changes as ADDED, MODIFIED, DELETED, resuming from
 * the last resourceVersion seen (bookmarks included) when the stream ends
 * or breaks, and
 * relisting (a RELIST event, then SYNCs) when the server answers 410 Gone.
 *
 * A watch or list the server answers 429/5xx, a stream ending in an ERROR
 * event other than 410, or one closed at once with nothing in it, backs
 * off: 0.2 s doubling to 30 s, jittered, never sooner than Retry-After.
 *
 * The stream is read through a bounded line assembler (a line over
 * KUBE_WATCH_MAX_LINE bytes is an error, never an unbounded buffer).
 *
 * Ownership: objects passed to the callback are borrowed for the call.
 * Thread-safety: one call per thread; it uses its own curl handle. */
#ifndef KUBE_WATCH_H
#define KUBE_WATCH_H

#include <jansson.h>

#include <stdatomic.h>

#include "kube_client.h"

#define KUBE_WATCH_MAX_LINE (16u << 20)

/* type: "SYNC" (an object of the list), "SYNCED" (the list is complete),
 * "RELIST", "ADDED", "MODIFIED", "DELETED". Return nonzero to stop. obj is
 * NULL for SYNCED and RELIST. */
typedef int (*kube_watch_event_fn)(void *ctx, const char *type, json_t *obj);

/* Runs until fn asks to stop or *stop becomes nonzero (noticed within about
 * a second, even on a quiet stream); each watch request asks the server to
 * end it after timeout_s seconds (then it resumes). LLM_OK when stopped; an error only for what
 * retrying cannot fix (401/403, 404: the resource is not served). */
llm_status kube_watch_run(kube_client *k, kube_config *cfg, const char *path, int timeout_s, kube_watch_event_fn fn,
                           void *ctx, atomic_int *stop, llm_error *err);

#endif
