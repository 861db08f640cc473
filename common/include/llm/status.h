/* status.h - the project-wide status codes and the error-detail buffer
 * (the common library: engine, server, router and controller use it).
 *
 * Every fallible library call returns an llm_status and, when given a non-NULL
 * llm_error, fills it with a message naming the cause (file, field, value).
 * Values are frozen: never renumber, retired values stay as placeholders.
 * Thread-safety: llm_error is caller-owned; nothing here has shared state. */
#ifndef LLM_STATUS_H
#define LLM_STATUS_H

#include <stdio.h>
#include <stdlib.h>

typedef enum llm_status {
    LLM_OK = 0,
    LLM_ERR_NOMEM = 1,       /* an allocation failed */
    LLM_ERR_IO = 2,          /* open/read/mmap/write failed */
    LLM_ERR_FORMAT = 3,      /* malformed input file or data */
    LLM_ERR_UNSUPPORTED = 4, /* valid input we do not implement */
    LLM_ERR_INVALID_ARG = 5, /* caller passed a bad value */
    LLM_ERR_KV_FULL = 6,     /* no KV-cache room left */
    LLM_ERR_QUEUE_FULL = 7,  /* admission queue at its limit */
    LLM_ERR_CANCELLED = 8,   /* request cancelled */
    LLM_ERR_BACKEND = 9,     /* a backend (CPU threads, CUDA) call failed */
    LLM_ERR_INTERNAL = 10,   /* should not happen; message says where */
    LLM_ERR_TOO_LONG = 11,   /* input over a declared size limit */
    LLM_ERR_NOT_FOUND = 12,  /* no such request (finished, cancelled or never there), or a source's repository,
                              * file, revision, bucket or key */
    LLM_ERR_TIMEOUT = 13,    /* nothing happened within the time asked for */
    LLM_ERR_SHUTDOWN = 14,   /* the engine is closing */
    /* 15, 16, 17 and 19 are held for another layer's codes (kube/kube_status.h's
     * KUBE_ERR_*), so they pass through llm_status; a placeholder keeps each taken */
    LLM_STATUS_HELD_15 = 15,
    LLM_STATUS_HELD_16 = 16,
    LLM_STATUS_HELD_17 = 17,
    LLM_ERR_NUMERIC = 18,    /* NaN or infinity where a finite number is needed (logits, weights) */
    LLM_STATUS_HELD_19 = 19,
    LLM_ERR_GRAMMAR = 20,    /* a grammar does not compile, or the output cannot follow it within its bounds */
    LLM_ERR_TEMPLATE = 21,   /* a Jinja template does not compile, or its rendering failed or raised */
} llm_status;

#define LLM_ERROR_MSG_MAX 512

typedef struct llm_error {
    llm_status code;
    char msg[LLM_ERROR_MSG_MAX];
    char field[64]; /* the request field at fault, when a library knows it (llm_errf_at); else "" */
} llm_error;

/* Short constant name of a status ("format error"). Never NULL. */
const char *llm_status_str(llm_status s);

/* Fills err (if non-NULL) with code and a printf-style message; returns code
 * so callers can write `return llm_errf(err, LLM_ERR_FORMAT, "...")`. */
llm_status llm_errf(llm_error *err, llm_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* llm_errf naming the request field at fault (err->field: what an API
 * answers as the error's param). llm_errf itself clears the field. */
llm_status llm_errf_at(llm_error *err, llm_status code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Invariant checks that stay on in release builds: a broken invariant is a
 * bug, not bad input, so it prints file and line and aborts. Never use it for
 * anything a user or a file can trigger. */
#define LLM_ASSERT(x)                                                         \
    do {                                                                      \
        if (!(x)) {                                                           \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__,        \
                    __LINE__, #x);                                            \
            abort();                                                          \
        }                                                                     \
    } while (0)

#endif
