/* srv_config.c - the settings table and its three sources (see
 * srv_config.h). YAML is read with libyaml's event parser: a flat mapping
 * of scalar keys to scalar values; anything else is an error. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "llm/backend.h"
#include "llm/engine.h"
#include "srv_config.h"

typedef enum { K_STR, K_INT, K_REAL, K_BOOL, K_LIST } key_kind; /* K_LIST: a string; repeated flags add, comma separated */

typedef struct key_def {
    const char *name;
    key_kind kind;
    size_t off;
    double lo, hi;
    const char *def;
    const char *help;
} key_def;

#define F(x) offsetof(srv_config, x)
static const key_def keys[] = {
    {"model", K_STR, F(model), 0, 0, "",
     "GGUF model file (a split set: any part), or a source: hf://ORG/REPO/PATH.gguf[@REV], hf://ORG/REPO:QUANT[@REV], "
     "s3://BUCKET/KEY, https://... (downloaded before loading; tokens from HF_TOKEN, AWS_*, LLM_FETCH_BEARER_TOKEN) "
     "(required; -m)"},
    {"model_sha256", K_STR, F(model_sha256), 0, 0, "",
     "expected SHA-256 of the model file (hex): a local file is checked before loading, a source's download as it "
     "arrives"},
    {"model_cache", K_STR, F(model_cache), 0, 0, "",
     "folder sources are downloaded into (empty: huggingface_hub's: HF_HUB_CACHE, HF_HOME/hub or "
     "~/.cache/huggingface/hub); processes sharing it download a file once"},
    {"model_cache_verify", K_BOOL, F(model_cache_verify), 0, 1, "false",
     "hash a file found in the cache against the source's digest before using it, and download again one that has "
     "none (true for a cache that others can write, e.g. a node's folder)"},
    {"model_name", K_STR, F(model_name), 0, 0, "", "name served in the API (default: the model's general.name)"},
    {"host", K_STR, F(host), 0, 0, "0.0.0.0", "address to listen on"},
    {"port", K_INT, F(port), 1, 65535, "8080", "TCP port"},
    {"backend", K_STR, F(backend), 0, 0, "cpu", "compute backend: cpu or cuda (needs build/lib/libllm_cuda.so and a GPU)"},
    {"tensor_parallel", K_INT, F(tensor_parallel), 1, LLM_MAX_RANKS, "1",
     "ranks the model is split over: GPUs (cuda: devices device..device+N-1) or CPU thread groups"},
    {"device", K_INT, F(device), 0, 63, "0", "first CUDA device"},
    {"threads", K_INT, F(threads), 0, 1024, "0", "CPU threads for inference (0: all; shared among the ranks)"},
    {"cpu_pack", K_STR, F(cpu_pack), 0, 0, "auto",
     "cpu backend: copy the matrices into the kernel set's tiled layout at load: auto (when the copies fit the memory "
     "left), on (or the load fails), off; packed and unpacked answers differ in their last bits"},
    {"max_connections", K_INT, F(max_connections), 1, 16384, "512",
     "API connections held at once (each holds a thread); above it new ones get 503 with Retry-After at once"},
    {"header_timeout_s", K_INT, F(header_timeout_s), 1, 3600, "10", "time a request's headers may take to arrive, in all"},
    {"body_timeout_s", K_INT, F(body_timeout_s), 1, 3600, "60", "time a request's body may take to arrive, in all"},
    {"send_timeout_s", K_INT, F(send_timeout_s), 0, 3600, "30",
     "time a client may take to accept one write of an answer (plus 1 s per 16 KiB); then it is cut (0: no bound)"},
    {"keep_alive_s", K_INT, F(keep_alive_s), 0, 3600, "30", "idle time a connection waits for its next request (0: close after each)"},
    {"cors_origin", K_STR, F(cors_origin), 0, 0, "",
     "origin whose web pages may call the API (CORS; \"*\": any); empty: none (no preflight is answered)"},
    {"health_port", K_INT, F(health_port), 0, 65535, "0",
     "port of a listener of its own for the probes and /metrics, which API traffic cannot delay (0: none)"},
    {"n_ctx", K_INT, F(n_ctx), 0, 1 << 24, "0", "tokens per sequence (0: the model's, at most 4096)"},
    {"max_seqs", K_INT, F(max_seqs), 1, 4096, "64", "sequences decoded together"},
    {"max_batch_tokens", K_INT, F(max_batch_tokens), 1, 65536, "512", "tokens per engine step"},
    {"max_waiting", K_INT, F(max_waiting), 1, 1 << 20, "256", "waiting sequences before 429"},
    {"block_size", K_INT, F(block_size), 1, 256, "16", "KV cache block, tokens"},
    {"kv_type", K_STR, F(kv_type), 0, 0, "f16", "KV cache type: f16, f32, q8_0"},
    {"prefix_cache", K_BOOL, F(prefix_cache), 0, 1, "true",
     "reuse K/V of prompt prefixes already computed (true or false; answers are the same either way)"},
    {"grammar_close", K_BOOL, F(grammar_close), 0, 1, "true",
     "a constrained answer closes within max_tokens where its shortest ending fits (false: llama.cpp's way, cut at the limit)"},
    {"kv_cache_mb", K_INT, F(kv_cache_mb), 0, 1 << 30, "0", "KV cache size in MiB (0: kv_cache_fraction of free memory)"},
    {"kv_cache_fraction", K_REAL, F(kv_cache_fraction), 0.001, 1, "0.25", "share of free memory for the KV cache"},
    {"max_body_bytes", K_INT, F(max_body_bytes), 1024, 1 << 30, "1048576", "largest request body (413 above)"},
    {"chat_template", K_STR, F(chat_template), 0, 0, "auto",
     "chat prompts: auto (the model's Jinja template, or its built-in family when that does not compile) or builtin"},
    {"chat_template_file", K_STR, F(chat_template_file), 0, 0, "",
     "a Jinja chat template file used instead of the model's (it must compile)"},
    {"embedding_pooling", K_STR, F(embedding_pooling), 0, 0, "auto",
     "/v1/embeddings pooling: auto (the GGUF's pooling_type; last without one), mean or last"},
    {"max_answer_bytes", K_INT, F(max_answer_bytes), 1 << 20, 1L << 30, "67108864",
     "largest whole (non-streamed) answer a request may ask for: n x tokens x logprobs, estimated (400 above)"},
    {"shutdown_delay_s", K_INT, F(shutdown_delay_s), 0, 3600, "0",
     "on SIGTERM, keep taking requests this long while /readyz fails (load balancers drop the pod first)"},
    {"drain_timeout_s", K_INT, F(drain_timeout_s), 0, 86400, "30", "on SIGTERM, time for requests in flight"},
    {"request_timeout_s", K_INT, F(request_timeout_s), 1, 86400, "600", "longest a request may run"},
    {"liveness_timeout_s", K_INT, F(liveness_timeout_s), 1, 86400, "60", "engine step time before /livez fails"},
    {"fault_error_ratio", K_REAL, F(fault_error_ratio), 0, 1, "0",
     "testing: share of completion requests answered 500 on purpose (e.g. a canary made to fail)"},
    {"fault_delay_ms", K_INT, F(fault_delay_ms), 0, 600000, "0", "testing: delay added before each completion"},
    {"otlp_endpoint", K_STR, F(otlp_endpoint), 0, 0, "",
     "OTLP/HTTP traces URL (e.g. http://collector:4318/v1/traces); empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else "
     "OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, else no traces"},
    {"trace_sample_ratio", K_REAL, F(trace_sample_ratio), 0, 1, "1",
     "share of new traces recorded (a request with a traceparent follows its sampled flag)"},
    {"api_keys_file", K_STR, F(api_keys_file), 0, 0, "",
     "file of API keys, one per line: KEY [tenant=NAME] [max_priority=N] [rate=R/s] [max_inflight=N] "
     "(or LLM_SERVER_API_KEYS)"},
    {"tenant_max_inflight", K_INT, F(tenant_max_inflight), 0, 1000000, "0",
     "with API keys: sequences a tenant may have queued or running at once when its keys give no max_inflight; "
     "0: no cap"},
    {"max_priority_anonymous", K_INT, F(max_priority_anonymous), -1000000, 1000000, "0",
     "a request's priority is capped at this without API keys (with keys: the key's max_priority)"},
    {"admin_token", K_STR, F(admin_token), 0, 0, "",
     "bearer token of /admin/canary (or LLM_SERVER_ADMIN_TOKEN); prefer admin_token_file; empty: the route is off"},
    {"admin_token_file", K_STR, F(admin_token_file), 0, 0, "",
     "file holding the bearer token of /admin/canary (a mounted Secret; read at each admin request)"},
    {"model_dir", K_STR, F(model_dir), 0, 0, "",
     "directory a colocated canary's model must lie in (symbolic links resolved); empty: the model's own directory"},
    {"memory_budget_mb", K_INT, F(memory_budget_mb), 0, 1 << 30, "0",
     "memory a colocated canary must fit in beside the stable model (0: the cgroup's limit, if any)"},
    {"lora", K_LIST, F(lora), 0, 0, "",
     "LoRA adapters (llama.cpp's GGUF format) loaded at start: NAME=PATH[:SCALE], comma separated or --lora again; "
     "PATH may be an hf://, s3:// or https:// source; a request's model names one"},
    {"lora_file", K_STR, F(lora_file), 0, 0, "",
     "a JSON file of LoRA adapters loaded at start: [{\"name\", \"uri\" or \"path\", \"sha256\", \"scale\"}] "
     "(llm-controller writes spec.adapters there)"},
    {"lora_dir", K_STR, F(lora_dir), 0, 0, "",
     "directory /v1/load_lora_adapter's local lora_path must lie in (symbolic links resolved); empty: sources only"},
    {"max_loras", K_INT, F(max_loras), 1, 1024, "8",
     "LoRA adapters loaded at once; loading another unloads the idle one used least recently"},
    {"max_lora_rank", K_INT, F(max_lora_rank), 1, 1024, "64", "the largest rank a LoRA adapter may have"},
    {"prompt_logprob_rows", K_INT, F(prompt_logprob_rows), -1, 4096, "8",
     "logit rows a step gives prompt_logprobs prompts beyond one per sequence: each adds the output matmul and a "
     "pass over the vocabulary to the steps every request waits on (0 or -1: prompt_logprobs refused)"},
    {"speculative", K_STR, F(speculative), 0, 0, "off",
     "speculative decoding: off, ngram (each step guesses a sequence's next tokens from where its last tokens "
     "occurred before, in its prompt or output, and checks them in the same pass) or draft (a smaller model with the "
     "same vocabulary, spec_draft_model, guesses them); answers are the same either way"},
    {"spec_draft_model", K_STR, F(spec_draft_model), 0, 0, "",
     "speculative draft: the draft model's GGUF file (a local path; its vocabulary must be the model's)"},
    {"spec_draft_kv_mb", K_INT, F(spec_draft_kv_mb), 0, 1 << 30, "0",
     "speculative draft: the draft's KV cache in MiB, at least one full context (0: room for spec_max_seqs "
     "contexts, at most 256 MiB unless one context needs more)"},
    {"spec_tokens", K_INT, F(spec_tokens), 1, LLM_SPEC_MAX_TOKENS, "16",
     "most guessed tokens per sequence and step (each sequence adapts below it to what it gets right)"},
    {"spec_ngram_min", K_INT, F(spec_ngram_min), 1, LLM_SPEC_MAX_NGRAM, "2",
     "shortest run of last tokens a guess is looked up by"},
    {"spec_ngram_max", K_INT, F(spec_ngram_max), 1, LLM_SPEC_MAX_NGRAM, "8",
     "longest run of last tokens a guess is looked up by (tried first)"},
    {"spec_step_rows", K_INT, F(spec_step_rows), 1, LLM_SPEC_MAX_STEP_ROWS, "32",
     "guessed tokens one step checks, all sequences together, from the rows prompts leave (each holds a row of "
     "logits: n_vocab floats)"},
    {"spec_max_seqs", K_INT, F(spec_max_seqs), 1, 4096, "16",
     "a step decoding more sequences than this guesses nothing (its pass no longer waits on reading the weights)"},
};
#define N_KEYS (sizeof keys / sizeof *keys)

static const key_def *find_key(const char *name, size_t n)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        size_t k = 0;
        while (k < n && keys[i].name[k] && (keys[i].name[k] == name[k] || (keys[i].name[k] == '_' && name[k] == '-')))
            k++;
        if (k == n && !keys[i].name[k])
            return &keys[i];
    }
    return NULL;
}

/* Stores text as key's value; errors name the key and the source. */
static llm_status set_value(srv_config *c, const key_def *k, const char *v, const char *src, llm_error *err)
{
    char *end;
    void *field = (char *)c + k->off;
    if (k->kind == K_STR || k->kind == K_LIST) {
        char *dup = strdup(v);
        if (!dup)
            return llm_errf(err, LLM_ERR_NOMEM, "config: no memory");
        free(*(char **)field);
        *(char **)field = dup;
        return LLM_OK;
    }
    if (k->kind == K_BOOL) {
        int t = !strcasecmp(v, "true"), f = !strcasecmp(v, "false");
        if (!t && !f)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "config: %s (from %s): '%s' is not true or false", k->name, src, v);
        *(long *)field = t;
        return LLM_OK;
    }
    errno = 0;
    double d = k->kind == K_INT ? (double)strtol(v, &end, 10) : strtod(v, &end);
    if (!*v || *end || errno || !isfinite(d))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "config: %s (from %s): '%s' is not a %s", k->name, src, v,
                        k->kind == K_INT ? "whole number" : "number");
    if (d < k->lo || d > k->hi)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "config: %s (from %s): %s not in [%g, %g]", k->name, src, v, k->lo,
                        k->hi);
    if (k->kind == K_INT)
        *(long *)field = (long)d;
    else
        *(double *)field = d;
    return LLM_OK;
}

static llm_status set_defaults(srv_config *c, llm_error *err)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < N_KEYS; i++) {
        llm_status st = set_value(c, &keys[i], keys[i].def, "default", err);
        if (st)
            return st;
    }
    return LLM_OK;
}

/* ---- YAML file ------------------------------------------------------------ */

typedef struct yaml_ctx {
    yaml_parser_t p;
    FILE *f;
    const char *path;
} yaml_ctx;

/* The next event; a parse error names the file and line. */
static llm_status next_event(yaml_ctx *y, yaml_event_t *ev, llm_error *err)
{
    if (yaml_parser_parse(&y->p, ev))
        return LLM_OK;
    return llm_errf(err, LLM_ERR_INVALID_ARG, "config: %s line %zu: %s", y->path, y->p.problem_mark.line + 1,
                    y->p.problem ? y->p.problem : "malformed YAML");
}

/* One `key: value` pair, or *done at the end of the mapping. */
static llm_status yaml_pair(yaml_ctx *y, srv_config *c, int *done, llm_error *err)
{
    yaml_event_t k, v;
    llm_status st = next_event(y, &k, err);
    if (st)
        return st;
    if (k.type != YAML_SCALAR_EVENT) {
        *done = k.type == YAML_MAPPING_END_EVENT;
        yaml_event_delete(&k);
        return *done ? LLM_OK
                     : llm_errf(err, LLM_ERR_INVALID_ARG, "config: %s: keys must be plain names", y->path);
    }
    char key[64];
    snprintf(key, sizeof key, "%s", (const char *)k.data.scalar.value);
    size_t line = k.start_mark.line + 1;
    yaml_event_delete(&k);
    const key_def *d = find_key(key, strlen(key));
    if (!d)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "config: %s line %zu: unknown key '%s'", y->path, line, key);
    if ((st = next_event(y, &v, err)))
        return st;
    if (v.type != YAML_SCALAR_EVENT) {
        yaml_event_delete(&v);
        return llm_errf(err, LLM_ERR_INVALID_ARG, "config: %s line %zu: %s must be a single value", y->path, line, key);
    }
    char src[300];
    snprintf(src, sizeof src, "%s line %zu", y->path, line);
    st = set_value(c, d, (const char *)v.data.scalar.value, src, err);
    yaml_event_delete(&v);
    return st;
}

/* Skips stream and document starts; *empty when the file has no mapping. */
static llm_status yaml_open_map(yaml_ctx *y, int *empty, llm_error *err)
{
    for (;;) {
        yaml_event_t ev;
        llm_status st = next_event(y, &ev, err);
        if (st)
            return st;
        yaml_event_type_t t = ev.type;
        yaml_event_delete(&ev);
        if (t == YAML_MAPPING_START_EVENT)
            return LLM_OK;
        if (t == YAML_STREAM_END_EVENT || t == YAML_DOCUMENT_END_EVENT) {
            *empty = 1;
            return LLM_OK;
        }
        if (t != YAML_STREAM_START_EVENT && t != YAML_DOCUMENT_START_EVENT)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "config: %s: the file must be a mapping of key: value", y->path);
    }
}

static llm_status load_file(const char *path, srv_config *c, llm_error *err)
{
    yaml_ctx y = {.path = path};
    if (!(y.f = fopen(path, "rb")))
        return llm_errf(err, LLM_ERR_IO, "config: cannot open %s: %s", path, strerror(errno));
    yaml_parser_initialize(&y.p);
    yaml_parser_set_input_file(&y.p, y.f);
    int empty = 0, done = 0;
    llm_status st = yaml_open_map(&y, &empty, err);
    while (!st && !empty && !done) st = yaml_pair(&y, c, &done, err);
    yaml_parser_delete(&y.p);
    fclose(y.f);
    return st;
}

/* ---- environment and flags ---------------------------------------------------- */

static llm_status load_env(srv_config *c, llm_error *err)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        char name[80];
        int n = snprintf(name, sizeof name, "LLM_SERVER_%s", keys[i].name);
        for (int k = 11; k < n; k++) name[k] = (char)toupper((unsigned char)name[k]);
        const char *v = getenv(name);
        llm_status st = v ? set_value(c, &keys[i], v, name, err) : LLM_OK;
        if (st)
            return st;
    }
    return LLM_OK;
}

/* A list key's flag after its first: v added to the list. */
static llm_status list_add(srv_config *c, const key_def *k, const char *v, llm_error *err)
{
    char **field = (char **)((char *)c + k->off);
    size_t a = strlen(*field), b = strlen(v);
    char *joined = malloc(a + b + 2);
    if (!joined)
        return llm_errf(err, LLM_ERR_NOMEM, "config: no memory");
    snprintf(joined, a + b + 2, "%s%s%s", *field, a && b ? "," : "", v);
    free(*field);
    *field = joined;
    return LLM_OK;
}

/* --key value, --key=value, -m FILE. *cfg_path gets --config's value. */
static llm_status load_flags(int argc, char **argv, srv_config *c, const char **cfg_path, int apply, int *help,
                             llm_error *err)
{
    unsigned char seen[N_KEYS] = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '='), *name = a + 2;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *help = 1;
            return LLM_OK;
        }
        if (!strcmp(a, "-m"))
            name = "model";
        else if (strncmp(a, "--", 2))
            return llm_errf(err, LLM_ERR_INVALID_ARG, "config: unexpected argument '%s' (flags are --key value)", a);
        size_t n = eq ? (size_t)(eq - name) : strlen(name);
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "config: %s needs a value", a);
        if (n == 6 && !strncmp(name, "config", 6)) {
            *cfg_path = v;
            continue;
        }
        const key_def *k = find_key(name, n);
        if (!k)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "config: unknown flag '%.*s'", (int)n + 2, a);
        llm_status st = !apply ? LLM_OK
                        : k->kind == K_LIST && seen[k - keys] ? list_add(c, k, v, err)
                                                              : set_value(c, k, v, "command line", err);
        seen[k - keys] = 1;
        if (st)
            return st;
    }
    return LLM_OK;
}

int srv_config_cpu_pack(const srv_config *c)
{
    static const char *const names[] = {"auto", "off", "on"}; /* llm_cpu_pack's order */
    for (int i = 0; i < 3; i++)
        if (!strcmp(c->cpu_pack, names[i]))
            return i;
    return -1;
}

llm_status srv_config_load(int argc, char **argv, srv_config *c, int *help, llm_error *err)
{
    const char *cfg_path = getenv("LLM_SERVER_CONFIG");
    *help = 0;
    llm_status st = set_defaults(c, err);
    if (!st)
        st = load_flags(argc, argv, c, &cfg_path, 0, help, err); /* find --config and --help first */
    if (!st && !*help && cfg_path && *cfg_path)
        st = load_file(cfg_path, c, err);
    if (!st && !*help)
        st = load_env(c, err);
    if (!st && !*help)
        st = load_flags(argc, argv, c, &cfg_path, 1, help, err);
    if (!st && !*help && !c->model[0])
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "config: model is required (-m FILE.gguf, LLM_SERVER_MODEL or model: in the file)");
    if (!st && !*help && strcmp(c->backend, "cpu") && strcmp(c->backend, "cuda"))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "config: backend '%s' is not cpu or cuda", c->backend);
    if (!st && !*help && srv_config_cpu_pack(c) < 0)
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "config: cpu_pack '%s' is not auto, on or off", c->cpu_pack);
    if (!st && !*help && strcmp(c->chat_template, "auto") && strcmp(c->chat_template, "builtin"))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "config: chat_template '%s' is not auto or builtin", c->chat_template);
    if (!st && !*help && strcmp(c->speculative, "off") && strcmp(c->speculative, "ngram") &&
        strcmp(c->speculative, "draft"))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "config: speculative '%s' is not off, ngram or draft", c->speculative);
    if (!st && !*help && !strcmp(c->speculative, "draft") != !!c->spec_draft_model[0])
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "config: spec_draft_model %s", c->spec_draft_model[0]
                      ? "is set but speculative is not draft" : "is required with speculative draft");
    if (!st && !*help && c->spec_ngram_min > c->spec_ngram_max)
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "config: spec_ngram_min %ld is above spec_ngram_max %ld",
                      c->spec_ngram_min, c->spec_ngram_max);
    if (!st && !*help && strcmp(c->embedding_pooling, "auto") && strcmp(c->embedding_pooling, "mean") &&
        strcmp(c->embedding_pooling, "last"))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "config: embedding_pooling '%s' is not auto, mean or last",
                      c->embedding_pooling);
    if (!st && !*help && c->health_port == c->port)
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "config: health_port %ld is the API port: it needs a port of its own",
                      c->health_port);
    return st;
}

void srv_config_free(srv_config *c)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (keys[i].kind == K_STR || keys[i].kind == K_LIST) {
            char **p = (char **)((char *)c + keys[i].off);
            free(*p);
            *p = NULL;
        }
}

void srv_config_usage(FILE *out)
{
    fprintf(out, "usage: llm-server -m MODEL.gguf [--port 8080] [--config FILE.yaml] [--KEY VALUE ...]\n"
                 "Every key can also be set as LLM_SERVER_<KEY> or in the YAML file (flag > env > file > default):\n");
    for (size_t i = 0; i < N_KEYS; i++)
        fprintf(out, "  --%-20s %s (default: %s)\n", keys[i].name, keys[i].help, *keys[i].def ? keys[i].def : "none");
}
