/* api_keys.h - who may call llm-server or llm-router's gateway, and with
 * what standing: API keys, each belonging to a tenant, with a priority
 * ceiling, a request rate and the tenant's limits. One format for both
 * programs (a gateway and the pods behind it may read one Secret).
 *
 * The keys file (llm-server's api_keys_file, else LLM_SERVER_API_KEYS;
 * llm-router's --api-keys-file) has one key per line (or, in the
 * variable, per comma), optionally followed by settings:
 *
 *     sk-team-a-1  tenant=team-a  max_priority=10  rate=5  max_inflight=16  rpm=600  tpm=100000
 *     sk-batch     tenant=batch   max_priority=-5
 *     sk-gw-7f3a   tenant=gateway gateway=1
 *     # a comment; a key alone is its own tenant, max_priority 0, no rate limit
 *     sk-plain
 *
 * tenant: keys of one tenant share its prefix cache partition (and only
 * they); max_priority: a request's "priority" is capped at it (without
 * keys: at max_priority_anonymous); rate: the key's requests per second
 * (a token bucket holding one second's worth, at least 1), 429 above it;
 * max_inflight: sequences (a request's n) the whole tenant may have
 * queued or running at once, 429 above it, so one tenant cannot fill the
 * engine's queue (max_waiting) for all (at a gateway: the tenant's
 * requests in flight). rpm, tpm: the tenant's requests and tokens (prompt
 * and generated, from the answers' usage) per minute, enforced by the
 * gateway (llm-server reads and ignores them). Keys of one tenant may
 * repeat its max_inflight, rpm and tpm but not give others. gateway=1: a
 * gateway's own key at a pod: its requests name their tenant in the
 * X-LLM-Tenant header (no other caller may send that header).
 *
 * Ownership: api_keys is caller-owned; parse/load fill it (strings owned),
 * api_keys_free releases it. Thread-safety: after loading, find is
 * read-only; admit, take and give lock; all may be called from any thread. */
#ifndef API_KEYS_H
#define API_KEYS_H

#include <pthread.h>
#include <stddef.h>

#include "llm/status.h"

#define API_KEYS_MAX 10000      /* keys in a file */
#define API_KEY_MAX_LEN 256     /* bytes of a key or a tenant name */

typedef struct api_key {
    char *key, *tenant;
    int max_priority;
    double rate;                /* requests/s; 0: unlimited */
    int max_inflight;           /* the tenant's (set on its first key, tenant_ix); 0: none given */
    long rpm, tpm;              /* the tenant's, like max_inflight; 0: none given */
    int gateway;                /* a gateway's key: its requests carry their tenant (X-LLM-Tenant) */
    int tenant_ix;              /* index of the tenant's first key: its counters */
    unsigned char digest[32];   /* SHA-256 of key: what a header is compared with */
} api_key;

/* A key's rate bucket (api_keys.bucket[i] for k[i]) and, on a tenant's
 * first key, the tenant's sequences in flight; under mu. */
typedef struct api_bucket {
    double tokens, last;
    int inflight;
} api_bucket;

typedef struct api_keys {
    api_key *k;
    api_bucket *bucket;
    int n, cap;
    pthread_mutex_t mu;
} api_keys;

/* Parses a keys text (sep: the line separators, "\n" or ",\n"). Errors
 * name the line and the setting: LLM_ERR_INVALID_ARG (bad setting, key or
 * tenant too long or with other than printable ASCII, a key twice, more
 * than API_KEYS_MAX), LLM_ERR_NOMEM. Nothing is left allocated on failure. */
llm_status api_keys_parse(const char *text, size_t len, const char *sep, api_keys *out, llm_error *err);
/* From the file path (at most 4 MiB) when path is not empty, else from
 * the environment variable env; none: no keys (the API is open). */
llm_status api_keys_load(const char *path, const char *env, api_keys *out, llm_error *err);
void api_keys_free(api_keys *k); /* NULL: nothing */

/* The key an Authorization header ("Bearer KEY") names, or NULL: the
 * header's digest against every key's, each in constant time. */
const api_key *api_keys_find(const api_keys *k, const char *authorization);
/* The first key of tenant `name` (its settings), or NULL. */
const api_key *api_keys_tenant(const api_keys *k, const char *name);
/* Whether name may be a tenant's (the tenant= rules): 1 or 0. */
int api_keys_tenant_ok(const char *name, size_t n);
/* Takes one request from key's bucket at time now (seconds): 1, or 0 when
 * over its rate (*retry_s: when a request would be let in). */
int api_keys_admit(api_keys *k, const api_key *key, double now, double *retry_s);
/* The max_inflight of key's tenant: its own, else dflt (0: no cap). */
int api_keys_cap(const api_keys *k, const api_key *key, int dflt);
/* Takes n sequences of that cap: 1, or 0 when they would pass it. No
 * key: always 1. Every 1 is given back with api_keys_give. */
int api_keys_take(api_keys *k, const api_key *key, int n, int dflt);
void api_keys_give(api_keys *k, const api_key *key, int n);

#endif
