/* srv_config.h - llm-server settings: one table of keys, each settable in
 * a YAML file (a flat mapping), by environment variable LLM_SERVER_<KEY>
 * (upper case) and by command-line flag --key (dashes or underscores).
 * Precedence: flag > environment > file > default. Unknown keys, bad
 * values and out-of-range numbers are errors that name the key and where
 * it came from.
 *
 * Ownership: srv_config_load fills a caller-owned struct whose strings it
 * allocates; srv_config_free releases them. Not thread-safe (startup). */
#ifndef SRV_CONFIG_H
#define SRV_CONFIG_H

#include <stddef.h>

#include "llm/status.h"

typedef struct srv_config {
    char *model;            /* GGUF path or source (hf://, s3://, https://; required) */
    char *model_cache;      /* where sources are cached; "" -> huggingface_hub's folder */
    long model_cache_verify; /* 1: files found in the cache are hashed before use (fetch.h verify_cached) */
    char *model_sha256;     /* expected SHA-256 (hex) of the file; "" skips the check */
    char *model_name;       /* served name; "" -> general.name or the file name */
    char *host;
    long port;
    char *backend;          /* cpu | cuda */
    long tensor_parallel;   /* ranks (1: no split) */
    long device;            /* first CUDA device */
    long threads;           /* CPU threads for the engine; 0: all */
    long max_connections;   /* API connections held at once (http_guard.h) */
    long header_timeout_s, body_timeout_s; /* total time for a request's headers, its body */
    long send_timeout_s;    /* a client's time to accept one write of an answer (+1 s per 16 KiB) */
    long keep_alive_s;      /* idle wait for a connection's next request; 0: no keep-alive */
    char *cors_origin;      /* CORS: the origin allowed to call the API; "": none */
    long health_port;       /* probes and /metrics on a listener of their own; 0: none */
    long n_ctx, max_seqs, max_batch_tokens, max_waiting, block_size;
    char *cpu_pack;         /* auto | on | off (llm_cpu_pack) */
    char *kv_type;          /* f16 | f32 | q8_0 */
    long prefix_cache;      /* 1: reuse cached prompt prefixes (default) */
    long grammar_close;     /* 1: constrained answers close within max_tokens (default; gmatch.h budgets) */
    long kv_cache_mb;       /* 0: kv_cache_fraction of free memory */
    double kv_cache_fraction;
    long max_body_bytes;
    long max_answer_bytes;  /* a whole answer's estimated size (srv_api.c) */
    char *chat_template;    /* auto: the model's Jinja template when it compiles; builtin: the family renderer */
    char *chat_template_file; /* a Jinja template used instead of the model's ("": none) */
    char *embedding_pooling; /* auto | mean | last (srv_embed.h) */
    long shutdown_delay_s;  /* SIGTERM: keep serving while endpoints drop this pod */
    long drain_timeout_s;   /* SIGTERM: how long requests in flight may finish */
    long request_timeout_s; /* a request running longer ends with an error */
    long liveness_timeout_s; /* an engine step hung this long turns /livez 503 */
    double fault_error_ratio; /* testing: share of completions failed on purpose */
    long fault_delay_ms;    /* testing: delay before each completion */
    char *api_keys_file;    /* api_keys.h's format; "" -> LLM_SERVER_API_KEYS or none */
    char *otlp_endpoint;    /* traces (otlp.h); "" -> the OTEL_ environment or none */
    double trace_sample_ratio;
    long max_priority_anonymous; /* priority ceiling without keys */
    long tenant_max_inflight; /* a tenant's sequences in flight when its keys set none; 0: no cap */
    char *admin_token;      /* bearer for /admin/canary; "" -> admin_token_file, LLM_SERVER_ADMIN_TOKEN or off */
    char *admin_token_file; /* the bearer, from a file (a mounted Secret) */
    char *model_dir;        /* a canary's model lies in here; "" -> dirname(model) */
    long memory_budget_mb;  /* a colocated canary must fit in this; 0: the cgroup's limit */
    char *lora;             /* adapters loaded at start: NAME=PATH[:SCALE], comma separated (srv_lora.h); a
                             * repeated --lora adds to the list */
    char *lora_file;        /* adapters loaded at start, as JSON: [{"name", "uri" | "path", "sha256", "scale"}]
                             * (the operator's spec.adapters); "": none */
    char *lora_dir;         /* /v1/load_lora_adapter's local paths lie in here; "": only sources */
    long max_loras;         /* adapters loaded at once */
    long max_lora_rank;     /* the largest rank an adapter may have */
    long prompt_logprob_rows; /* the engine's prompt_logit_rows (0 or -1: prompt_logprobs refused) */
    char *speculative;      /* off | ngram | draft (engine.h's llm_spec_mode) */
    char *spec_draft_model; /* draft: the draft model's GGUF file (the model's vocabulary) */
    long spec_draft_kv_mb;  /* draft: its KV cache (0: the engine's default) */
    long spec_tokens, spec_ngram_min, spec_ngram_max, spec_step_rows, spec_max_seqs; /* the engine's */
} srv_config;

/* Parses argv (argv[0] skipped), the environment and the YAML file named
 * by --config (or LLM_SERVER_CONFIG). LLM_ERR_INVALID_ARG with the key in
 * err->msg; *help set when --help was asked for (nothing else filled). */
llm_status srv_config_load(int argc, char **argv, srv_config *c, int *help, llm_error *err);
void srv_config_free(srv_config *c);

/* cpu_pack as an llm_cpu_pack (backend.h), or -1 when it names none
 * (srv_config_load refuses that). */
int srv_config_cpu_pack(const srv_config *c);
/* The usage text: every key with its default. */
void srv_config_usage(FILE *out);

#endif
