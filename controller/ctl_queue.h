/* ctl_queue.h - the controller's work queue of "namespace/name" keys, as
 * client-go's rate-limited queue does it: a key is queued once however
 * often it is added (the earlier due time wins), handed to one worker at a
 * time, re-queued when added while in flight, and backs off exponentially
 * (0.2 s doubling to 30 s) while its reconciles fail. Keys are found
 * through a hash index and the due ones through a heap by due time, so
 * add, next and forget cost O(log n); a key is forgotten (its back-off
 * too) when its object is deleted, so the queue holds the live objects
 * only. At most max_keys are known: one more is refused
 * (LLM_ERR_QUEUE_FULL), never dropped silently.
 *
 * Times are CLOCK_MONOTONIC. Ownership: the queue copies keys. Thread-
 * safety: every call takes the queue's lock; any thread. */
#ifndef CTL_QUEUE_H
#define CTL_QUEUE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "llm/status.h"

#define CTL_KEY_MAX 320

typedef struct ctl_queue ctl_queue;

/* A queue of at most max_keys keys, inactive; the caller frees it with
 * ctl_queue_free once no thread uses it. */
llm_status ctl_queue_new(size_t max_keys, ctl_queue **out, llm_error *err);
void ctl_queue_free(ctl_queue *q);

/* Queues key to be due in delay_s (an earlier due time already set
 * stands). LLM_ERR_TOO_LONG for a key of CTL_KEY_MAX bytes or more. */
llm_status ctl_queue_add(ctl_queue *q, const char *key, double delay_s, llm_error *err);
/* As ctl_queue_add (at once), unless key's object was queued last with the
 * same fingerprint fp (nonzero): *skipped then, and nothing changes. The
 * LLMDeployment informer passes a hash of the object less its status, so
 * our own status writes do not queue a reconcile that writes it again. */
llm_status ctl_queue_add_changed(ctl_queue *q, const char *key, uint64_t fp, int *skipped, llm_error *err);
/* The object of key is gone: it leaves the queue (once out of flight). */
void ctl_queue_forget(ctl_queue *q, const char *key);
/* Waits for a due key (while active), copies it to key[CTL_KEY_MAX] and
 * marks it in flight; 0 once *stop. tick (may be NULL) is called at least
 * once a second while waiting (the worker's heartbeat), under the queue's
 * lock: it must not call the queue. */
int ctl_queue_next(ctl_queue *q, char *key, atomic_int *stop, void (*tick)(void));
/* How a turn ended: CTL_DONE_OK, CTL_DONE_FAILED (queued again after its
 * back-off: 0.2 s doubling to 30 s with each failure in a row; sooner when
 * added meanwhile), CTL_DONE_GONE (its object is gone: the key is
 * forgotten - unless it was added meanwhile, a new object of the name). */
enum { CTL_DONE_OK, CTL_DONE_FAILED, CTL_DONE_GONE };
/* The worker is done with key; returns the back-off (0 unless failed). */
double ctl_queue_done(ctl_queue *q, const char *key, int outcome);
/* Active (this replica leads): every known key is queued at once;
 * inactive: keys wait. */
void ctl_queue_activate(ctl_queue *q, int active);
/* Wakes a waiting ctl_queue_next (to see *stop). */
void ctl_queue_wake(ctl_queue *q);
/* Known keys and keys waiting for their turn. */
void ctl_queue_stats(ctl_queue *q, size_t *known, size_t *waiting);

#endif
