/* srv.h - llm-server's shared state and the pieces that use it:
 * srv_http.c (routes), srv_api.c (OpenAI request parsing, error bodies,
 * the JSON helpers), srv_load.c (model, backends and engine bring-up),
 * srv_canary.c (a colocated canary), srv_main.c (the process: startup,
 * signals, drain).
 * Thread-safety: phase and active are atomics; the engine is thread-safe;
 * everything else is written before the HTTP threads start or only read. */
#ifndef SRV_H
#define SRV_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "llm/engine.h"
#include "srv_chat.h"
#include "srv_config.h"
#include "api_keys.h"
#include "otlp.h"
#include "srv_lora.h"
#include "srv_metrics.h"

typedef enum srv_phase { SRV_LOADING = 0, SRV_READY = 1, SRV_DRAINING = 2, SRV_FAILED = 3 } srv_phase;

/* A colocated canary revision (srv_canary.c): a second model and engine
 * in this server. users counts the requests on it; it is freed once
 * retired and unused. */
typedef struct srv_rev {
    llm_model *model;
    llm_backend *backends[LLM_MAX_RANKS]; /* one per tensor-parallel rank */
    int n_backends;
    llm_engine *engine;
    srv_chat *chat;
    _Atomic int users;
    char path[4096];
} srv_rev;

/* The canary's state, under mu. */
typedef struct srv_canary {
    pthread_mutex_t mu;
    srv_rev *rev;              /* loaded and taking its weight; NULL: none */
    srv_rev *retired;          /* unloaded, freed once its requests end */
    char path[4096], sha256[72]; /* what was asked for */
    char state[16];            /* none, loading, ready, failed, does_not_fit */
    char message[512];
    int weight, split;         /* share of requests, smooth counter */
    int loading;               /* a loader thread runs */
    int loader_started;        /* a loader thread to join */
    pthread_t loader;
    unsigned long gen;         /* bumped by each request: a stale load is dropped */
    _Atomic int abort;         /* the load in progress should stop (unload, shutdown) */
} srv_canary;

typedef struct srv {
    srv_config cfg;
    struct http_guard *http;   /* the API listener */
    struct http_probe *health; /* the probes' own listener (health_port), or NULL */
    llm_model *model;
    llm_model *draft;          /* speculative draft: the draft model; else NULL */
    llm_backend *backends[LLM_MAX_RANKS]; /* one per tensor-parallel rank */
    int n_backends;
    llm_engine *engine;
    int n_ctx;                 /* tokens one sequence holds (the engine's), set before requests are taken; 0 before */
    _Atomic int phase;
    _Atomic int active;        /* API requests being served */
    _Atomic int refusing;      /* draining and past the shutdown delay: new requests get 503 */
    _Atomic int cutting;       /* past drain_timeout_s: requests still running end with an error now */
    char status[512];          /* load progress or failure, for the probes */
    char model_path[4096];     /* the model's file: cfg.model, or where its source was fetched to */
    struct {                   /* a source's download, for /startupz (written by the loader) */
        _Atomic int on;
        _Atomic unsigned long long done, total, rate;
        _Atomic(const char *) phase; /* a string literal (fetch_progress.phase) */
        double last_log;       /* the loader's own */
        char reason[32];       /* why it failed (fetch_reason_name), "" otherwise: written before phase is failed */
    } dl;
    _Atomic int stopping;      /* SIGTERM: a download in progress stops */
    char name[128];            /* served model name */
    srv_chat *chat;            /* the model's chat renderer */
    llm_pooling embed_pooling; /* /v1/embeddings' default (srv_embed.h) */
    long created;              /* unix time the model was loaded */
    srv_metrics metrics;
    api_keys keys;             /* API keys and their tenants; none: the API is open */
    otlp *traces;              /* the span exporter (otlp.h); NULL: no traces */
    srv_canary canary;         /* colocated canary (admin_token) */
    srv_loras loras;           /* LoRA adapters (srv_lora.h) */
} srv;

/* An API error: HTTP status, OpenAI error type, the parameter at fault. */
typedef struct srv_err {
    int status;
    const char *type;
    char param[64];
    char msg[512];
    int retry_s;               /* 429: when to retry (Retry-After; 0: 1 s); 503: > 0 when the pod, not the
                                * request, is the cause (loading, draining): Retry-After, so routers pass it by */
} srv_err;

void srv_err_set(srv_err *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* srv_err_set, then -1: `return srv_fail(e, 400, "n", "...");` */
int srv_fail(srv_err *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* A library's failure (the text layer's: schema, tools) as the answer, then -1:
 * 503 when memory ran out, else 400; param the field the library named, else
 * the given one. */
int srv_fail_from(srv_err *e, const llm_error *err, const char *param);
/* (Both below may be called from any thread; bodies are read through
 * llm_json_load, so within its depth and memory bounds.)
 * j as compact JSON text (caller frees), or NULL when j is NULL or memory
 * ran out while printing it (never a text with a part missing). */
char *srv_json_text(const json_t *j);
/* The body as JSON of any type (caller owns it), or NULL with e set: 400
 * for malformed JSON (line, column, reason; duplicate keys are malformed),
 * too deep or too costly to hold (llm/json.h's limits, named), 429 with
 * Retry-After while other requests' JSON fills the shared cap, 503 when
 * memory ran out while parsing. */
json_t *srv_json_parse(const char *body, size_t len, srv_err *e);
/* The same, and an object (400 for another type). */
json_t *srv_json_object(const char *body, size_t len, srv_err *e);
/* The OpenAI error body {"error": {...}}; caller frees. */
char *srv_err_body(const srv_err *e);
/* HTTP status for an engine status (429 queue full, 503 shutting down...). */
int srv_status_of(llm_status st);
/* An integer field of o in [lo, hi], or absent (*out unchanged): 0, or -1
 * with e set (400 naming it). */
int srv_int_field(json_t *o, const char *k, long lo, long hi, long *out, srv_err *e);
/* The fields every API body shares: model (the base model's name, an
 * adapter's - *lora gets it held (srv_lora_pin), the caller unpins - or
 * 404), cache_salt (1 to 256 bytes; *cache_salt points into o, NULL when
 * absent) and user (a string). 0, or -1 with e set naming the field. */
int srv_check_envelope(srv *s, json_t *o, const char **cache_salt, srv_lora_ent **lora, srv_err *e);

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
    const char *cache_salt;    /* the body's "cache_salt" (a partition of the prefix cache), or NULL */
    llm_logit_bias *bias;      /* rq.sampling.bias (owned) */
    const char *grammar_param; /* the field rq.grammar came from, for the engine's errors about it */
    char *schema_grammar;      /* rq.grammar made from a JSON schema (owned), or NULL */
    llm_tools tools;           /* chat: the request's tools and how calls come out */
    srv_lora_ent *lora;        /* the adapter "model" names (held), or NULL: the base model */
    srv_loras *lora_table;     /* where lora is held */
    char *tool_prefill;        /* a forced call's opening, appended to the prompt (owned), or NULL */
    int unmetered;             /* the quality gate's reads: kept out of the per-revision latencies a canary is
                                * judged on */
} srv_completion;

/* Parses and validates a /v1/completions (kind SRV_FIELDS_COMPLETIONS),
 * /v1/chat/completions (SRV_FIELDS_CHAT) or /generate (SRV_FIELDS_GENERATE)
 * body; chat messages are rendered with chat (the
 * serving revision's renderer) and, with vocab (the serving
 * revision's), tokenized here: the markup as control tokens, the messages'
 * contents as text (rq.tokens; without vocab rq.text, every control-token
 * text parsed). Errors: 400 naming the field, 404 model. */
int srv_parse_completion(srv *s, const srv_chat *chat, const llm_vocab *vocab, const char *body, size_t len, int kind,
                         srv_completion *c, srv_err *e);
/* Frees c and lets go of its adapter. */
void srv_completion_free(srv_completion *c);
/* The fields of a POST /admin/canary body: model (an absolute path, or
 * null/absent: *path NULL), sha256 (64 hex digits or absent), weight
 * (0..100; absent: -1). The strings point into req. 0, or the status (400
 * naming the field) with e set. */
int srv_parse_admin(json_t *req, const char **path, const char **sha, int *weight, srv_err *e);

/* Starts the API listener (and the health one when health_port is set);
 * 0, or -1 with err naming the port. */
int srv_http_start(srv *s, llm_error *err);

/* srv_http.c, for srv_complete.c: answers and the caller. What is sent when not even an error body can be built: */
#define SRV_OOM_BODY "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}"

struct mg_connection;
/* Sends j (consumed) as the answer; NULL (a body that could not be built) sends 503. Returns the status. */
int srv_http_send_json(struct mg_connection *c, int status, json_t *j);
/* Sends e as an OpenAI error body, with Retry-After or WWW-Authenticate where e calls for one. */
int srv_http_send_err(struct mg_connection *c, const srv_err *e);
/* The key whose standing (priority ceiling, max_inflight) the request
 * has: the one it presents, or for a gateway=1 key naming a tenant in
 * X-LLM-Tenant that tenant's first key here when there is one; NULL
 * without keys or a valid key. */
const api_key *srv_http_caller(const srv *s, struct mg_connection *c);
/* The tenant whose prefix cache partition the request uses: the one a
 * gateway key names, else its key's; NULL without keys. */
const char *srv_http_tenant(const srv *s, struct mg_connection *c);
/* Whether the pod is alive: not failed, and no engine step running past liveness_timeout_s. */
int srv_http_alive(srv *s);

/* srv_complete.c: one completion request (see its file comment). */
/* Streams or collects cp's answer, sent here; *held: the sequences of the
 * tenant's cap the request holds, grown to its n. The HTTP status. */
int srv_complete(srv *s, const srv_rev *rv, struct mg_connection *c, srv_completion *cp, int *held, srv_err *e);
/* The request's prefix-cache partition (0: the common one). */
uint64_t srv_complete_cache_salt(const char *tenant, const char *field);
/* The highest priority key's caller may ask for. */
int srv_complete_priority_ceiling(const srv *s, const api_key *key);
/* Grows a request's share of key's tenant's sequences in flight from held
 * to n: 0, or 400/429 with e set. */
int srv_complete_tenant_take(srv *s, const api_key *key, int n, int held, srv_err *e);

/* srv_load.c: bringing a model up, for the loader thread (srv_main.c)
 * and the canary's loader (srv_canary.c). Each returns LLM_OK or a status
 * with err naming the cause; nothing is left allocated on failure.
 *
 * A model's file is mapped, and what is checked is the mapping:
 * srv_load_model maps each file (a split set: each part) and hashes the
 * mapped bytes against want (hex, any case, one digest per part
 * comma-separated in part order; "" or NULL: no check) before the parser
 * reads them, then loads the model; srv_load_page_in reads every page in
 * and refuses a file whose size, mtime or ctime moved since it was mapped
 * (gguf_unchanged). A file cut short meanwhile raises SIGBUS on the reading
 * thread, which, with srv_load_catch_bus installed, fails the load
 * (LLM_ERR_IO, said) instead of killing the process; a SIGBUS anywhere
 * else (a file cut while served) ends the process with a message.
 * Errors: LLM_ERR_FORMAT (a digest mismatch, both digests whole),
 * LLM_ERR_IO, LLM_ERR_INVALID_ARG (a digest count that is not the part
 * count the name says), LLM_ERR_CANCELLED when *abort (may be NULL)
 * turned nonzero. progress (may be NULL) gets the fraction read. */
int srv_load_catch_bus(void);
llm_status srv_load_model(const char *path, const char *want, void (*progress)(void *ctx, double done), void *ctx,
                          const _Atomic int *abort, llm_model **out, llm_error *err);
llm_status srv_load_page_in(const llm_model *m, void (*progress)(void *ctx, double done), void *ctx,
                            const _Atomic int *abort, llm_error *err);
/* The configured backends (backend, tensor_parallel, device, threads) into
 * out; *n gets their count. Free them with srv_load_close_backends. */
llm_status srv_load_backends(srv *s, llm_backend **out, int *n, llm_error *err);
/* Frees b[0..n) and sets each to NULL. */
void srv_load_close_backends(llm_backend **b, int n);
/* The engine over m and b[0..n) with the configured limits (kv_type,
 * prefix_cache, ...); m, draft and b must outlive it (llm_engine_close).
 * draft: the draft model when speculative is draft; without one (a
 * colocated canary, whose vocabulary may differ) such an engine guesses
 * by n-grams. */
llm_status srv_load_engine(srv *s, llm_model *m, const llm_model *draft, llm_backend *const *b, int n,
                           llm_engine **out, llm_error *err);
/* Opens path after the rules for files a request names: it resolves
 * (symbolic links followed) inside dir (itself resolved), is a regular
 * file with data, and is opened without blocking (a FIFO would block an
 * open); *fd gets it. 0, or 400 with e naming param, the path and the
 * rule (telling nothing of files outside dir, not even whether they exist). */
int srv_load_open_inside(const char *dir, const char *path, const char *param, int *fd, srv_err *e);
/* One token through e before the server turns ready; the engine's error
 * when it cannot run. */
llm_status srv_load_warm_up(llm_engine *e, llm_model *m, llm_error *err);

/* Colocated canary (srv_canary.c). The controller (or an operator) asks
 * through POST /admin/canary {"model": PATH or null, "sha256": HEX,
 * "weight": 0..100} with the bearer admin token (admin_token_file): PATH
 * must resolve to a regular file inside model_dir (else the stable
 * model's directory); the model is loaded in the
 * background next to the stable one when it fits in the memory budget
 * (memory_budget_mb, else the cgroup's limit; "does_not_fit" says by how
 * much otherwise), then takes weight percent of the completion requests
 * (exactly, by a smooth counter; an X-Session-Id keeps its revision).
 * null unloads it once its requests end. Thread-safety: all calls may
 * come from any thread. */
void srv_canary_init(srv *s);
/* Shutting down: a load in progress stops where it can (a digest check). */
void srv_canary_abort(srv *s);
/* After the drain. A load in progress is asked to stop and waited for up
 * to 2 s; 1 when it still runs (then nothing is freed: the caller exits
 * without freeing what the loader may use), else 0. */
int srv_canary_free(srv *s);
/* The canary for this request (its users counted), or NULL for stable. */
srv_rev *srv_canary_pick(srv *s, const char *session);
/* The loaded canary whatever its weight (its users counted), or NULL when
 * none is: the quality gate's reads through the admin routes. */
srv_rev *srv_canary_hold(srv *s);
void srv_canary_release(srv_rev *r);
/* The admin request; the HTTP status, *out the state (new reference). */
int srv_canary_admin(srv *s, json_t *req, json_t **out, srv_err *e);
json_t *srv_canary_state(srv *s);

#endif
