/* api_keys.c - API keys with tenants, priority ceilings, rates and
 * limits; see api_keys.h. Our own small line format rather than YAML: one key per
 * line is what the file held before (and what a Secret's value holds
 * naturally), and the settings are a few words after it. */
#include "api_keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

void api_keys_free(api_keys *k)
{
    if (!k)
        return;
    free(k->bucket);
    k->bucket = NULL;
    for (int i = 0; i < k->n; i++) {
        free(k->k[i].key);
        free(k->k[i].tenant);
    }
    free(k->k);
    k->k = NULL;
    k->n = k->cap = 0;
}

/* Printable ASCII without spaces, 1..API_KEY_MAX_LEN bytes. */
static int word_ok(const char *w, size_t n)
{
    if (n < 1 || n > API_KEY_MAX_LEN)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (w[i] <= ' ' || w[i] > '~')
            return 0;
    return 1;
}

/* Whether a tenant name has the form of a key's implicit one (key- and
 * 12 hex digits): an explicit one so would share that key's cap and cache. */
static int implicit_name(const char *t, size_t n)
{
    if (n != 16 || memcmp(t, "key-", 4))
        return 0;
    for (size_t i = 4; i < n; i++)
        if (!strchr("0123456789abcdef", t[i]))
            return 0;
    return 1;
}

/* One "name=value" setting of key k (the word-th after it); 0 or -1 with
 * err naming the line and the setting. */
static int setting(api_key *k, const char *w, size_t n, int line, int word, llm_error *err)
{
    const char *eq = memchr(w, '=', n);
    char val[64];
    size_t nl = eq ? (size_t)(eq - w) : n, nv = eq ? n - nl - 1 : 0;
    char *end;
    if (eq && nv < sizeof val) {
        memcpy(val, eq + 1, nv);
        val[nv] = 0;
    }
    if (eq && nl == 6 && !memcmp(w, "tenant", 6) && word_ok(eq + 1, nv) && !implicit_name(eq + 1, nv)) {
        free(k->tenant);
        return (k->tenant = strndup(eq + 1, nv)) ? 0 : (llm_errf(err, LLM_ERR_NOMEM, "keys: no memory"), -1);
    }
    if (eq && nl == 12 && !memcmp(w, "max_priority", 12) && nv && nv < sizeof val) {
        long p = strtol(val, &end, 10);
        if (!*end && p >= -1000000 && p <= 1000000)
            return k->max_priority = (int)p, 0;
    }
    if (eq && nl == 4 && !memcmp(w, "rate", 4) && nv && nv < sizeof val) {
        double r = strtod(val, &end);
        if (!*end && r >= 0 && r <= 1e6)
            return k->rate = r, 0;
    }
    if (eq && nl == 12 && !memcmp(w, "max_inflight", 12) && nv && nv < sizeof val) {
        long m = strtol(val, &end, 10);
        if (!*end && m >= 1 && m <= 1000000)
            return k->max_inflight = (int)m, 0;
    }
    if (eq && nl == 3 && (!memcmp(w, "rpm", 3) || !memcmp(w, "tpm", 3)) && nv && nv < sizeof val) {
        long m = strtol(val, &end, 10);
        if (!*end && m >= 1 && m <= 1000000000L)
            return *(w[0] == 'r' ? &k->rpm : &k->tpm) = m, 0;
    }
    if (eq && nl == 7 && !memcmp(w, "gateway", 7) && nv == 1 && (*val == '0' || *val == '1'))
        return k->gateway = *val == '1', 0;
    /* the setting's name only: a stray word may be a key (two on one line) that the log must not show */
    static const char *const known[] = {"tenant", "max_priority", "rate", "max_inflight", "rpm", "tpm", "gateway"};
    int named = 0;
    for (size_t i = 0; eq && i < sizeof known / sizeof *known; i++) named |= nl == strlen(known[i]) && !memcmp(w, known[i], nl);
    if (named)
        llm_errf(err, LLM_ERR_INVALID_ARG, "keys: line %d: a bad value for '%.*s' (settings: tenant=NAME, "
                 "max_priority=N (-1e6..1e6), rate=R (0..1e6 requests/s), max_inflight=N (1..1e6 sequences), rpm=N and "
                 "tpm=N (1..1e9 per minute), gateway=0|1)", line,
                 (int)nl, w);
    else
        llm_errf(err, LLM_ERR_INVALID_ARG, "keys: line %d: word %d after the key is no setting (settings: tenant=NAME, "
                 "max_priority=N, rate=R, max_inflight=N, rpm=N, tpm=N, gateway=0|1; one key per line)", line, word);
    return -1;
}

/* One tenant setting of a later key (want; 0: not given) onto the value
 * its tenant's first key keeps (*have): it may repeat it, not differ. */
static int tenant_setting(const char *name, long *have, long want, const api_key *k, int line, llm_error *err)
{
    if (want && *have && want != *have)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "keys: line %d: tenant '%s' has %s=%ld on an earlier line, not %ld",
                        line, k->tenant, name, *have, want), -1;
    if (want)
        *have = want;
    return 0;
}

/* A later key's tenant settings onto its tenant's first key (owner),
 * where they are kept; 0 or -1. */
static int tenant_settings(api_key *owner, const api_key *k, int line, llm_error *err)
{
    long inflight = owner->max_inflight;
    int rc = tenant_setting("max_inflight", &inflight, k->max_inflight, k, line, err);
    if (!rc)
        rc = tenant_setting("rpm", &owner->rpm, k->rpm, k, line, err);
    if (!rc)
        rc = tenant_setting("tpm", &owner->tpm, k->tpm, k, line, err);
    owner->max_inflight = (int)inflight;
    return rc;
}

/* The tenant of a key that names none: "key-" and 12 hex digits of its
 * digest - never the key itself, which error messages would echo. */
static char *implicit_tenant(const unsigned char digest[32])
{
    char *t = malloc(17);
    if (t) {
        memcpy(t, "key-", 4);
        for (int i = 0; i < 6; i++) snprintf(t + 4 + 2 * i, 3, "%02x", digest[i]);
    }
    return t;
}

/* Room for one more key (doubling); 0 or -1. */
static int grow(api_keys *out)
{
    if (out->n < out->cap)
        return 0;
    int cap = out->cap ? 2 * out->cap : 8;
    api_key *k = realloc(out->k, sizeof *k * (size_t)cap);
    if (k)
        out->k = k;
    api_bucket *b = k ? realloc(out->bucket, sizeof *b * (size_t)cap) : NULL;
    if (b)
        out->bucket = b;
    if (!b)
        return -1;
    out->cap = cap;
    return 0;
}

/* One line's key and settings appended to out; 0 or -1. Blank lines and
 * comments add nothing. */
static int parse_line(const char *p, size_t n, int line, api_keys *out, llm_error *err)
{
    api_key k = {0};
    int rc = 0, words = 0;
    for (size_t i = 0; i < n && !rc;) {
        while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r')) i++;
        size_t j = i;
        while (j < n && p[j] != ' ' && p[j] != '\t' && p[j] != '\r') j++;
        if (j == i || (!k.key && p[i] == '#'))
            break;
        if (!k.key && !word_ok(p + i, j - i))
            rc = (llm_errf(err, LLM_ERR_INVALID_ARG, "keys: line %d: a key is 1 to %d printable characters", line,
                           API_KEY_MAX_LEN), -1);
        else if (!k.key)
            rc = (k.key = strndup(p + i, j - i)) ? 0 : (llm_errf(err, LLM_ERR_NOMEM, "keys: no memory"), -1);
        else
            rc = setting(&k, p + i, j - i, line, ++words, err);
        i = j;
    }
    if (!rc && k.key && !EVP_Digest(k.key, strlen(k.key), k.digest, NULL, EVP_sha256(), NULL))
        rc = (llm_errf(err, LLM_ERR_INTERNAL, "keys: SHA-256 failed"), -1);
    if (!rc && k.key && !k.tenant && !(k.tenant = implicit_tenant(k.digest)))
        rc = (llm_errf(err, LLM_ERR_NOMEM, "keys: no memory"), -1);
    k.tenant_ix = out->n;
    for (int i = 0; !rc && k.key && i < out->n; i++) {
        if (!strcmp(out->k[i].key, k.key))
            rc = (llm_errf(err, LLM_ERR_INVALID_ARG, "keys: line %d: a key given twice", line), -1);
        if (k.tenant_ix == out->n && !strcmp(out->k[i].tenant, k.tenant))
            k.tenant_ix = out->k[i].tenant_ix;
    }
    api_key *owner = !rc && k.key && k.tenant_ix < out->n ? &out->k[k.tenant_ix] : NULL;
    if (owner)
        rc = tenant_settings(owner, &k, line, err);
    if (!rc && k.key && out->n >= API_KEYS_MAX)
        rc = (llm_errf(err, LLM_ERR_INVALID_ARG, "keys: more than %d keys", API_KEYS_MAX), -1);
    if (!rc && k.key && grow(out))
        rc = (llm_errf(err, LLM_ERR_NOMEM, "keys: no memory"), -1);
    if (rc || !k.key) {
        free(k.key);
        free(k.tenant);
        return rc;
    }
    out->bucket[out->n] = (api_bucket){.tokens = k.rate > 1 ? k.rate : 1};
    out->k[out->n++] = k;
    return 0;
}

/* An empty set whose lock needs no destroying (a static initializer). */
static void keys_init(api_keys *k)
{
    memset(k, 0, sizeof *k);
    k->mu = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
}

llm_status api_keys_parse(const char *text, size_t len, const char *sep, api_keys *out, llm_error *err)
{
    keys_init(out);
    int line = 1;
    for (size_t i = 0; i <= len; line++) {
        size_t j = i;
        while (j < len && !(text[j] && strchr(sep, text[j]))) j++; /* (a NUL is no separator: a key refuses it) */
        if (parse_line(text + i, j - i, line, out, err)) {
            api_keys_free(out);
            return err->code;
        }
        i = j + 1;
    }
    return LLM_OK;
}

llm_status api_keys_load(const char *path, const char *env, api_keys *out, llm_error *err)
{
    keys_init(out);
    if (!path || !*path) {
        const char *v = getenv(env);
        return v ? api_keys_parse(v, strlen(v), ",\n", out, err) : LLM_OK;
    }
    FILE *f = fopen(path, "r");
    if (!f)
        return llm_errf(err, LLM_ERR_IO, "api_keys_file %s: cannot open it", path);
    size_t cap = 4u << 20;
    char *text = malloc(cap + 1);
    size_t n = text ? fread(text, 1, cap + 1, f) : 0;
    int bad = ferror(f);
    fclose(f);
    llm_status st = !text ? llm_errf(err, LLM_ERR_NOMEM, "keys: no memory")
                    : bad ? llm_errf(err, LLM_ERR_IO, "api_keys_file %s: read error", path)
                    : n > cap ? llm_errf(err, LLM_ERR_TOO_LONG, "api_keys_file %s: over 4 MiB", path)
                              : api_keys_parse(text, n, "\n", out, err);
    free(text);
    return st;
}

const api_key *api_keys_tenant(const api_keys *k, const char *name)
{
    for (int i = 0; name && i < k->n; i++)
        if (k->k[i].tenant_ix == i && !strcmp(k->k[i].tenant, name))
            return &k->k[i];
    return NULL;
}

int api_keys_tenant_ok(const char *name, size_t n)
{
    return word_ok(name, n) && !implicit_name(name, n);
}

const api_key *api_keys_find(const api_keys *k, const char *authorization)
{
    unsigned char d[32];
    if (!authorization || strncmp(authorization, "Bearer ", 7) ||
        !EVP_Digest(authorization + 7, strlen(authorization + 7), d, NULL, EVP_sha256(), NULL))
        return NULL;
    const api_key *found = NULL;
    for (int i = 0; i < k->n; i++) /* all of them: when it matched must not show */
        if (!CRYPTO_memcmp(d, k->k[i].digest, sizeof d))
            found = &k->k[i];
    return found;
}

int api_keys_admit(api_keys *k, const api_key *key, double now, double *retry_s)
{
    if (!key || key->rate <= 0)
        return 1;
    api_bucket *m = &k->bucket[key - k->k];
    double cap = key->rate > 1 ? key->rate : 1;
    pthread_mutex_lock(&k->mu);
    m->tokens += (now - m->last) * key->rate;
    if (m->tokens > cap || m->last == 0)
        m->tokens = cap;
    m->last = now;
    int ok = m->tokens >= 1;
    if (ok)
        m->tokens -= 1;
    else
        *retry_s = (1 - m->tokens) / key->rate;
    pthread_mutex_unlock(&k->mu);
    return ok;
}

int api_keys_cap(const api_keys *k, const api_key *key, int dflt)
{
    int own = key ? k->k[key->tenant_ix].max_inflight : 0;
    return own ? own : dflt;
}

int api_keys_take(api_keys *k, const api_key *key, int n, int dflt)
{
    if (!key)
        return 1;
    int limit = api_keys_cap(k, key, dflt);
    pthread_mutex_lock(&k->mu);
    int *have = &k->bucket[key->tenant_ix].inflight;
    int ok = limit <= 0 || *have + n <= limit;
    if (ok)
        *have += n;
    pthread_mutex_unlock(&k->mu);
    return ok;
}

void api_keys_give(api_keys *k, const api_key *key, int n)
{
    if (!key)
        return;
    pthread_mutex_lock(&k->mu);
    int *have = &k->bucket[key->tenant_ix].inflight;
    LLM_ASSERT(*have >= n); /* every give matches a take */
    *have -= n;
    pthread_mutex_unlock(&k->mu);
}
