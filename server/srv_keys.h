/* srv_keys.h - who may call llm-server and with what standing: API keys,
 * each belonging to a tenant, with a priority ceiling and a request rate.
 *
 * The keys file (api_keys_file, else LLM_SERVER_API_KEYS) has one key per
 * line (or, in the variable, per comma), optionally followed by settings:
 *
 *     sk-team-a-1  tenant=team-a  max_priority=10  rate=5  max_inflight=16
 *     sk-batch     tenant=batch   max_priority=-5
 *     # a comment; a key alone is its own tenant, max_priority 0, no rate limit
 *     sk-plain
 *
 * tenant: keys of one tenant share its prefix cache partition (and only
 * they); max_priority: a request's "priority" is capped at it (without
 * keys: at max_priority_anonymous); rate: the key's requests per second
 * (a token bucket holding one second's worth, at least 1), 429 above it;
 * max_inflight: sequences (a request's n) the whole tenant may have
 * queued or running at once, 429 above it, so one tenant cannot fill the
 * engine's queue (max_waiting) for all. Keys of one tenant may repeat
 * its max_inflight but not give another.
 *
 * Ownership: srv_keys is caller-owned; parse/load fill it (strings owned),
 * srv_keys_free releases it. Thread-safety: after loading, find is
 * read-only; admit, take and give lock; all may be called from any thread. */
#ifndef SRV_KEYS_H
#define SRV_KEYS_H

#include <pthread.h>
#include <stddef.h>

#include "llm/status.h"

#define SRV_KEYS_MAX 10000      /* keys in a file */
#define SRV_KEY_MAX_LEN 256     /* bytes of a key or a tenant name */

typedef struct srv_key {
    char *key, *tenant;
    int max_priority;
    double rate;                /* requests/s; 0: unlimited */
    int max_inflight;           /* the tenant's (set on its first key, tenant_ix); 0: none given */
    int tenant_ix;              /* index of the tenant's first key: its counters */
    unsigned char digest[32];   /* SHA-256 of key: what a header is compared with */
} srv_key;

/* A key's rate bucket (srv_keys.bucket[i] for k[i]) and, on a tenant's
 * first key, the tenant's sequences in flight; under mu. */
typedef struct srv_bucket {
    double tokens, last;
    int inflight;
} srv_bucket;

typedef struct srv_keys {
    srv_key *k;
    srv_bucket *bucket;
    int n, cap;
    pthread_mutex_t mu;
} srv_keys;

/* Parses a keys text (sep: the line separators, "\n" or ",\n"). Errors
 * name the line and the setting: LLM_ERR_INVALID_ARG (bad setting, key or
 * tenant too long or with other than printable ASCII, a key twice, more
 * than SRV_KEYS_MAX), LLM_ERR_NOMEM. Nothing is left allocated on failure. */
llm_status srv_keys_parse(const char *text, size_t len, const char *sep, srv_keys *out, llm_error *err);
/* From the file path (at most 4 MiB) when path is not empty, else from
 * the environment variable env; none: no keys (the API is open). */
llm_status srv_keys_load(const char *path, const char *env, srv_keys *out, llm_error *err);
void srv_keys_free(srv_keys *k); /* NULL: nothing */

/* The key an Authorization header ("Bearer KEY") names, or NULL: the
 * header's digest against every key's, each in constant time. */
const srv_key *srv_keys_find(const srv_keys *k, const char *authorization);
/* Takes one request from key's bucket at time now (seconds): 1, or 0 when
 * over its rate (*retry_s: when a request would be let in). */
int srv_keys_admit(srv_keys *k, const srv_key *key, double now, double *retry_s);
/* The max_inflight of key's tenant: its own, else dflt (0: no cap). */
int srv_keys_cap(const srv_keys *k, const srv_key *key, int dflt);
/* Takes n sequences of that cap: 1, or 0 when they would pass it. No
 * key: always 1. Every 1 is given back with srv_keys_give. */
int srv_keys_take(srv_keys *k, const srv_key *key, int n, int dflt);
void srv_keys_give(srv_keys *k, const srv_key *key, int n);

#endif
