/* srv.h - llm-server's shared state and the pieces that use it:
 * srv_http.c (routes), srv_api.c (OpenAI request parsing and response
 * bodies), srv_main.c (startup, model loading, drain).
 * Thread-safety: phase and active are atomics; the engine is thread-safe;
 * everything else is written before the HTTP threads start or only read. */
#ifndef SRV_H
#define SRV_H

#include <jansson.h>
#include <stdatomic.h>

#include "llm/engine.h"
#include "srv_config.h"
#include "srv_metrics.h"

typedef enum srv_phase { SRV_LOADING = 0, SRV_READY = 1, SRV_DRAINING = 2, SRV_FAILED = 3 } srv_phase;

typedef struct srv {
    srv_config cfg;
    struct mg_context *mg;
    llm_model *model;
    llm_backend *backend;
    llm_engine *engine;
    _Atomic int phase;
    _Atomic int active;        /* API requests being served */
    _Atomic int refusing;      /* draining and past the shutdown delay: new requests get 503 */
    char status[512];          /* load progress or failure, for the probes */
    char name[128];            /* served model name */
    int chat_tmpl;             /* llm_chat_template of the model */
    long created;              /* unix time the model was loaded */
    srv_metrics metrics;
    char **keys;               /* API keys, NULL when open */
    int n_keys;
} srv;

/* An API error: HTTP status, OpenAI error type, the parameter at fault. */
typedef struct srv_err {
    int status;
    const char *type;
    char param[64];
    char msg[512];
} srv_err;

void srv_err_set(srv_err *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* The OpenAI error body {"error": {...}}; caller frees. */
char *srv_err_body(const srv_err *e);
/* HTTP status for an engine status (429 queue full, 503 shutting down...). */
int srv_status_of(llm_status st);

/* A parsed completion request; strings it points to are owned by it. */
typedef struct srv_completion {
    llm_request rq;
    int stream, include_usage, echo;
    int n_logprobs;            /* completions API: logprobs=N; -1 when not asked */
    int chat;
    int generate;              /* POST /generate: {"text"} in, {"text"} out */
    json_t *root;              /* the parsed body (owns the strings rq points to) */
    char *prompt;              /* chat: the rendered template */
    int32_t *ids;              /* prompt given as token ids */
    const char *stops[LLM_MAX_STOPS];
} srv_completion;

/* Parses and validates a /v1/completions (kind 0), /v1/chat/completions
 * (1) or /generate (2) body. Errors: 400 naming the field, 404 model. */
int srv_parse_completion(const srv *s, const char *body, size_t len, int chat, srv_completion *c, srv_err *e);
void srv_completion_free(srv_completion *c);

int srv_http_start(srv *s, llm_error *err);

#endif
