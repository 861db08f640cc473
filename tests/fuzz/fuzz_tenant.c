/* fuzz_tenant.c - libFuzzer target for what a tenant or an operator hands
 * llm-server besides completions: the API keys file (api_keys_parse) and
 * the admin route's body (srv_parse_admin). The first byte picks which.
 * Either a result whose fields are in range or an error with a message;
 * never a crash, leak or UB (ASan + UBSan). Admin bodies are nested deep
 * by deep.h's mutator and read on a thread with the production stack. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deep.h"
#include "srv.h"

static void keys(const char *p, size_t n)
{
    api_keys k;
    llm_error err = {0};
    if (api_keys_parse(p, n, n & 1 ? "\n" : ",\n", &k, &err)) {
        if (!err.msg[0] || k.n || k.k)
            abort();
        return;
    }
    for (int i = 0; i < k.n; i++) {
        const api_key *f = &k.k[i];
        if (!f->key[0] || strlen(f->key) > API_KEY_MAX_LEN || !f->tenant[0] || f->rate < 0 ||
            f->max_priority < -1000000 || f->max_priority > 1000000 || f->tenant_ix < 0 || f->tenant_ix > i ||
            strcmp(k.k[f->tenant_ix].tenant, f->tenant) || k.k[f->tenant_ix].tenant_ix != f->tenant_ix ||
            f->max_inflight < 0)
            abort();
    }
    int cap = 0; /* a tenant's in-flight count never passes its cap */
    for (int i = 0; i < k.n; i++)
        if (api_keys_take(&k, &k.k[i], 1, 2) && (cap = api_keys_cap(&k, &k.k[i], 2)) > 0 &&
            k.bucket[k.k[i].tenant_ix].inflight > cap)
            abort();
    double retry = 0;
    if (k.n && !api_keys_admit(&k, &k.k[0], 1.0, &retry) && !(retry > 0))
        abort();
    api_keys_free(&k);
}

static void admin(const char *p, size_t n)
{
    srv_err e = {0};
    json_t *req = srv_json_parse(p, n, &e);
    const char *path, *sha;
    int weight;
    if (req && !srv_parse_admin(req, &path, &sha, &weight, &e)) {
        if ((path && path[0] != '/') || (sha && strlen(sha) != 64) || weight < -1 || weight > 100)
            abort();
    } else if (e.status != 400 && e.status != 503) {
        abort();
    }
    json_decref(req);
}

static void one(const uint8_t *data, size_t size)
{
    if (size < 1)
        return;
    if (data[0] & 1)
        keys((const char *)data + 1, size - 1);
    else
        admin((const char *)data + 1, size - 1);
}

DEEP_FUZZ_TARGET(one)
