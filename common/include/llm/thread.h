/* thread.h - threads with a stated stack.
 *
 * Code that runs on a client's request or on the model's output (JSON,
 * schemas, patterns, grammars, Jinja, tool calls) recurses, each routine
 * within a depth limit of its own; those limits are sized against this
 * stack (tests/unit run each at its limit on an eighth of it, under ASan
 * too). civetweb's workers have 100 KiB stacks, compiled in; glibc's
 * default follows RLIMIT_STACK, which a container may set to anything. So
 * the threads that run such code are made here, never by default.
 *
 * Thread-safety: any thread. */
#ifndef LLM_THREAD_H
#define LLM_THREAD_H

#include <pthread.h>
#include <stddef.h>

/* The stack of every thread that runs request or model-output code. */
#define LLM_THREAD_STACK ((size_t)8 << 20)

/* pthread_create with a stack of stack bytes (joinable): 0, or the errno
 * value pthread_create gave. */
int llm_thread_create(pthread_t *t, size_t stack, void *(*fn)(void *), void *arg);

#endif
