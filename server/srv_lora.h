/* srv_lora.h - LoRA adapters served beside the base model (lora.h):
 * loaded at start from the `lora` setting (NAME=PATH[:SCALE], comma
 * separated; PATH may be a source: hf://, s3://, https://) and at run
 * time through vLLM's routes, POST /v1/load_lora_adapter {"lora_name",
 * "lora_path"[, "scale"]} and POST /v1/unload_lora_adapter {"lora_name"}
 * (the admin token; a local lora_path must resolve inside lora_dir, a
 * source is fetched into model_cache). A request's "model" names the base
 * or an adapter; /v1/models lists each adapter with its parent.
 *
 * At most max_loras are loaded: loading one more unloads the adapter used
 * least recently among those no request holds, or fails (429) when every
 * one is in use. A rank above max_lora_rank is refused. Unloading refuses
 * new requests at once and waits for the ones holding it.
 *
 * Ownership: the table is part of srv (srv.h); entries are freed by
 * unload or srv_lora_free. Thread-safety: every function but init and
 * free may be called from any thread; a request holds its entry between
 * srv_lora_pin and srv_lora_unpin. */
#ifndef SRV_LORA_H
#define SRV_LORA_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "llm/engine.h"
#include "llm/lora.h"
#include "llm/strbuf.h"

#define SRV_LORA_NAME_MAX 128

typedef struct srv_lora_ent {
    char name[SRV_LORA_NAME_MAX + 1];
    char source[4096];      /* as asked for: a path or a source */
    char sha256[65];        /* the digest it was checked against, or "" */
    float scale;
    llm_lora *l;            /* NULL while it loads */
    int pins;               /* requests holding it (under the table's lock) */
    int unloading;          /* no new pins */
    uint64_t used;          /* the table's clock at its last pin */
    _Atomic unsigned long long requests, prompt_tokens, gen_tokens;
} srv_lora_ent;

typedef struct srv_loras {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* an entry's pins fell to 0, or a load ended */
    srv_lora_ent **ents;    /* (max) NULL: free */
    int max, max_rank;
    uint64_t clock;
} srv_loras;

struct srv;
struct srv_err;

/* The table for max adapters of rank at most max_rank; 0, or -1 without memory. */
int srv_lora_init(srv_loras *t, int max, int max_rank);
/* After the engine is closed: every adapter freed. */
void srv_lora_free(srv_loras *t);
/* The `lora` and `lora_file` settings' adapters into the (ready) engine;
 * errors name the entry and the cause (the server does not start). */
llm_status srv_lora_startup(struct srv *s, llm_error *err);

/* The adapter named name, held for a request, or NULL when no adapter has
 * that name, it is still loading, or it is being unloaded. */
srv_lora_ent *srv_lora_pin(srv_loras *t, const char *name);
/* Lets go of p (NULL ok). */
void srv_lora_unpin(srv_loras *t, srv_lora_ent *p);
/* A request that runs on p, counted once (NULL ok; any thread). */
void srv_lora_count_request(srv_lora_ent *p);
/* A finished completion's tokens, counted on p (NULL ok; any thread). */
void srv_lora_count(srv_lora_ent *p, int prompt_tokens, int gen_tokens);

/* POST /v1/load_lora_adapter and /v1/unload_lora_adapter (req: the
 * body; load also takes "sha256", the file's expected digest, and
 * "scale"): 200, or the status with e set (400 naming the field: a bad or
 * taken name, a path outside lora_dir, a file that is not an adapter of
 * this model; 404 no such adapter; 429 every slot holds an adapter in use;
 * 503 out of memory). Unloading returns once no request holds it. */
int srv_lora_load_req(struct srv *s, json_t *req, struct srv_err *e);
int srv_lora_unload_req(struct srv *s, json_t *req, struct srv_err *e);

/* GET /admin/lora: {"adapters": [{"name", "source", "sha256", "scale",
 * "state": loading | ready | unloading, "requests": those holding it}],
 * "max_loras"} (new reference;
 * NULL without memory). */
json_t *srv_lora_state(srv_loras *t);
/* /v1/models entries of the loaded adapters (parent: base), appended to data. */
void srv_lora_models(srv_loras *t, const char *base, long created, json_t *data);
/* vllm:lora_requests_info and the per-adapter counters, in exposition text. */
void srv_lora_metrics(srv_loras *t, llm_engine *e, const char *model_name, llm_strbuf *b);

#endif
