/* srv_embed.h - POST /v1/embeddings: a body's inputs (a string, strings,
 * token ids, or arrays of them) become engine embedding requests
 * (engine.h: pooling mean or last, unit length), run SRV_EMBED_WINDOW at
 * a time so one body cannot fill the engine's queue, and come back as
 * OpenAI's answer: floats, or base64 of little-endian float32.
 *
 * Pooling: the request's "pooling" field (an extension: mean | last), else
 * the server's embedding_pooling setting, where auto is the GGUF's
 * <arch>.pooling_type (1 mean, 3 last) and last for a file without one
 * (a decoder's last position is the one that has read the whole input).
 *
 * Ownership: srv_embed is caller-owned, zeroed before srv_embed_parse;
 * srv_embed_free releases what parse and run stored in it.
 * Thread-safety: each call works on its own srv_embed; the engine is
 * thread-safe. */
#ifndef SRV_EMBED_H
#define SRV_EMBED_H

#include <jansson.h>

#include "llm/engine.h"

#define SRV_EMBED_MAX_INPUTS 2048 /* OpenAI's limit per request */
#define SRV_EMBED_WINDOW 16       /* inputs of one request in the engine at once, at most */
#define SRV_EMBED_VALUE_BYTES 17  /* the most a float takes in the answer: "-1.23456789e-38," */

struct srv;
struct srv_err;
struct mg_connection;

typedef struct srv_embed {
    json_t *root;              /* the parsed body (owns cache_salt) */
    int n;                     /* inputs */
    int32_t **ids;             /* (n) each input's token ids, owned */
    int *n_ids;                /* (n) */
    int base64;                /* encoding_format base64 */
    llm_pooling pooling;
    int priority;
    const char *cache_salt;    /* the body's "cache_salt", or NULL */
    int dim;                   /* the model's embedding size */
    float *vecs;               /* (n, dim) after srv_embed_run */
    long prompt_tokens;        /* after srv_embed_run */
    struct srv_lora_ent *lora; /* the adapter "model" names (held until srv_embed_free), or NULL */
    struct srv_loras *lora_table;
} srv_embed;

/* The pooling a setting names (auto | mean | last) for model m: auto reads
 * the file. LLM_POOL_NONE for any other setting. */
llm_pooling srv_embed_default_pooling(const llm_model *m, const char *setting);

/* Parses and tokenizes a body, every input checked before any runs: 0, or
 * -1 with e set (400 naming the field: no input, an empty one, more than
 * SRV_EMBED_MAX_INPUTS, a token id outside the vocabulary, an input over
 * max_tokens (what one sequence may hold: the context, and the KV pool),
 * an answer over max_answer_bytes, dimensions other than the model's, an
 * unknown encoding_format or pooling; 404 another model's name). */
int srv_embed_parse(struct srv *s, int max_tokens, const char *body, size_t len, srv_embed *q, struct srv_err *e);

/* Runs q's inputs on engine eng, window at a time (1..SRV_EMBED_WINDOW),
 * under prefix-cache partition salt: 0 with q->vecs and q->prompt_tokens
 * filled, or an HTTP status (499: the client left, e untouched; else e set:
 * 504 past request_timeout_s, 503 cut by a shutdown, the engine's refusals
 * as for completions). Every input submitted is read to its end or
 * cancelled before it returns. */
int srv_embed_run(struct srv *s, llm_engine *eng, struct mg_connection *c, srv_embed *q, uint64_t salt, int window,
                  struct srv_err *e);

/* The answer's JSON text (malloc'd; NULL: out of memory), written
 * directly: no JSON tree of n x dim values. */
char *srv_embed_answer(const srv_embed *q, const char *model);

void srv_embed_free(srv_embed *q); /* NULL ok; lets go of its adapter */

#endif
