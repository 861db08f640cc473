/* kube_client.c - see kube_client.h. One curl easy handle, reused (its
 * connection stays open between requests), behind a mutex. */
#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http_client.h" /* http_client_body: the bounded response buffer */
#include "llm/json.h"
#include "kube_client.h"

#define KUBE_MAX_BODY (64u << 20) /* a list of thousands of objects fits */

struct kube_client {
    kube_config *cfg;
    CURL *curl;
    pthread_mutex_t mu;
    long timeout_ms;        /* each request's whole time */
    atomic_int *cancel;     /* set: requests in flight end at once, new ones fail */
    double retry_after_s;   /* the last answer's Retry-After (0 none) */
    const struct kube_cache_set *caches; /* set once, before sharing: read without the lock */
    void (*progress)(void);
};

static const char *const method_names[KUBE_N_METHODS] = {"GET", "POST", "PUT", "PATCH", "DELETE"};
static const char *const outcome_names[KUBE_N_OUTCOMES] = {"2xx", "3xx", "4xx", "5xx", "error"};
static unsigned long long counts[KUBE_N_METHODS][KUBE_N_OUTCOMES];

const char *kube_client_method_name(int m) { return m >= 0 && m < KUBE_N_METHODS ? method_names[m] : "?"; }
const char *kube_client_outcome_name(int o) { return o >= 0 && o < KUBE_N_OUTCOMES ? outcome_names[o] : "?"; }

static unsigned long long unreadable;

unsigned long long kube_client_unreadable_count(void) { return __atomic_load_n(&unreadable, __ATOMIC_RELAXED); }

void kube_client_unreadable(void) { __atomic_add_fetch(&unreadable, 1, __ATOMIC_RELAXED); }

unsigned long long kube_client_request_count(int m, int o)
{
    return m >= 0 && m < KUBE_N_METHODS && o >= 0 && o < KUBE_N_OUTCOMES ? __atomic_load_n(&counts[m][o], __ATOMIC_RELAXED)
                                                                         : 0;
}

/* code 0: no answer (connection, TLS, timeout). */
static void count(const char *method, long code)
{
    int m = 0;
    while (m < KUBE_N_METHODS && strcmp(method_names[m], method)) m++;
    int o = code >= 200 && code < 600 ? (int)(code / 100) - 2 : KUBE_NO_ANSWER;
    if (m < KUBE_N_METHODS)
        __atomic_add_fetch(&counts[m][o], 1, __ATOMIC_RELAXED);
}

static void global_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

llm_status kube_client_new(kube_config *cfg, kube_client **out, llm_error *err)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, global_init);
    kube_client *k = calloc(1, sizeof *k);
    if (!k || !(k->curl = curl_easy_init())) {
        free(k);
        return llm_errf(err, LLM_ERR_NOMEM, "kube client: cannot create a curl handle");
    }
    k->cfg = cfg;
    k->timeout_ms = 60000;
    pthread_mutex_init(&k->mu, NULL);
    *out = k;
    return LLM_OK;
}

void kube_client_set_timeout(kube_client *k, long timeout_ms)
{
    pthread_mutex_lock(&k->mu);
    k->timeout_ms = timeout_ms > 0 ? timeout_ms : 60000;
    pthread_mutex_unlock(&k->mu);
}

void kube_client_set_cancel(kube_client *k, atomic_int *cancel)
{
    pthread_mutex_lock(&k->mu);
    k->cancel = cancel;
    pthread_mutex_unlock(&k->mu);
}

void kube_client_set_progress(kube_client *k, void (*fn)(void))
{
    k->progress = fn;
}

void kube_client_set_caches(kube_client *k, const struct kube_cache_set *caches)
{
    k->caches = caches;
}

const struct kube_cache_set *kube_client_caches(kube_client *k)
{
    return k->caches;
}

double kube_client_retry_after(kube_client *k)
{
    pthread_mutex_lock(&k->mu);
    double v = k->retry_after_s;
    pthread_mutex_unlock(&k->mu);
    return v;
}

double kube_client_retry_after_header(const char *line, size_t n)
{
    static const char name[] = "retry-after:";
    if (n <= sizeof name - 1 || strncasecmp(line, name, sizeof name - 1))
        return -1;
    char v[32];
    size_t i = sizeof name - 1, j = 0;
    while (i < n && (line[i] == ' ' || line[i] == '\t')) i++;
    while (i < n && j + 1 < sizeof v && isdigit((unsigned char)line[i])) v[j++] = line[i++];
    v[j] = 0;
    /* seconds only (the API server sends seconds; an HTTP date is read as none), at most a minute: a
     * proxy's answer must not park a watch for a day */
    double s = j ? strtod(v, NULL) : -1;
    return s < 0 ? -1 : s < 60 ? s : 60;
}

static size_t on_header(char *line, size_t size, size_t n, void *arg)
{
    double v = kube_client_retry_after_header(line, size * n);
    if (v >= 0)
        ((kube_client *)arg)->retry_after_s = v;
    return size * n;
}

static int on_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    kube_client *k = arg;
    (void)a, (void)b, (void)c, (void)d;
    return k->cancel && atomic_load(k->cancel);
}

void kube_client_free(kube_client *k)
{
    if (!k)
        return;
    curl_easy_cleanup(k->curl);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

struct curl_slist *kube_client_curl_login(kube_config *cfg, CURL *c)
{
    if (cfg->ca_pem) {
        struct curl_blob ca = {cfg->ca_pem, cfg->ca_len, CURL_BLOB_COPY};
        curl_easy_setopt(c, CURLOPT_CAINFO_BLOB, &ca);
    }
    if (cfg->cert_pem && cfg->key_pem) {
        struct curl_blob cert = {cfg->cert_pem, cfg->cert_len, CURL_BLOB_COPY};
        struct curl_blob key = {cfg->key_pem, cfg->key_len, CURL_BLOB_COPY};
        curl_easy_setopt(c, CURLOPT_SSLCERT_BLOB, &cert);
        curl_easy_setopt(c, CURLOPT_SSLCERTTYPE, "PEM");
        curl_easy_setopt(c, CURLOPT_SSLKEY_BLOB, &key);
        curl_easy_setopt(c, CURLOPT_SSLKEYTYPE, "PEM");
    }
    curl_easy_setopt(c, CURLOPT_USERAGENT, cfg->agent[0] ? cfg->agent : "llm-k8s");
    struct curl_slist *h = curl_slist_append(NULL, "Accept: application/json");
    char tok[8192];
    if (kube_config_token(cfg, tok, sizeof tok)) {
        char auth[8232];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok);
        h = curl_slist_append(h, auth);
    }
    return h;
}

/* The API's error for an HTTP status, with its Status message. */
static llm_status http_error(long code, const char *method, const char *path, const http_client_body *b, llm_error *err)
{
    json_t *j = b->p ? llm_json_loads(b->p, 0, NULL) : NULL;
    const char *msg = json_string_value(json_object_get(j, "message"));
    llm_status st = code == 404 ? LLM_ERR_NOT_FOUND : code == 409 ? KUBE_ERR_CONFLICT : code == 410 ? KUBE_ERR_GONE
                  : code == 422 || code == 400 ? LLM_ERR_INVALID_ARG : code == 401 || code == 403 ? KUBE_ERR_FORBIDDEN
                  : LLM_ERR_IO;
    llm_errf(err, st, "%s %s: HTTP %ld: %s", method, path, code, msg ? msg : b->p ? b->p : "(no body)");
    json_decref(j);
    return st;
}

static llm_status perform(kube_client *k, const char *method, const char *url, const char *body, const char *ctype,
                          http_client_body *b, long *code, llm_error *err)
{
    CURL *c = k->curl;
    char ct[128];
    if (k->cancel && atomic_load(k->cancel))
        return llm_errf(err, LLM_ERR_CANCELLED, "%s %s: cancelled (this replica stopped leading)", method, url);
    curl_easy_reset(c);
    struct curl_slist *h = kube_client_curl_login(k->cfg, c);
    snprintf(ct, sizeof ct, "Content-Type: %s", ctype ? ctype : "application/json");
    if (body)
        h = curl_slist_append(h, ct);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, http_client_body_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, k->timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, k->timeout_ms < 10000 ? k->timeout_ms : 10000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, k);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, k);
    k->retry_after_s = 0;
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(h);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, code);
    if (rc == CURLE_ABORTED_BY_CALLBACK)
        return llm_errf(err, LLM_ERR_CANCELLED, "%s %s: cancelled (this replica stopped leading)", method, url);
    if (rc != CURLE_OK)
        return llm_errf(err, LLM_ERR_IO, "%s %s: %s%s", method, url, curl_easy_strerror(rc),
                        b->over ? " (response over 64 MiB)" : b->nomem ? " (no memory for the response)" : "");
    return LLM_OK;
}

/* A list read an item at a time (kind, apiVersion, metadata and the items
 * that can be read): one object nested too deep, or too costly to hold,
 * must not hide all the others. Such an item is left out and counted; any
 * other failure (memory, the shared cap) fails the whole list, with err
 * set: an object left out reads as absent, which only its own fault may
 * cause. NULL on failure. */
static json_t *list_by_items(llm_json_span all, llm_error *err)
{
    static const char *const keep[] = {"kind", "apiVersion", "metadata"};
    llm_json_span v, items, item;
    json_t *out = json_object(), *arr = json_array(), *x;
    int bad = !out || !arr, has_items = llm_json_member(all, "items", &items);
    llm_error e = {0};
    if (bad)
        llm_errf(err, LLM_ERR_NOMEM, "no memory for a list");
    for (size_t i = 0; !bad && i < sizeof keep / sizeof *keep; i++)
        if (llm_json_member(all, keep[i], &v) && !(bad = !(x = llm_json_load(v.p, v.n, JSON_DECODE_ANY, NULL, err))))
            bad = json_object_set_new(out, keep[i], x) && llm_errf(err, LLM_ERR_NOMEM, "no memory for a list");
    for (size_t pos = 0; !bad && has_items && llm_json_item(items, &pos, &item);) {
        if (!(x = llm_json_load(item.p, item.n, 0, NULL, &e)) && e.code == LLM_ERR_TOO_LONG)
            kube_client_unreadable();
        else if (!x)
            bad = llm_errf(err, e.code, "a list item: %s", e.msg) != LLM_OK;
        else
            bad = json_array_append_new(arr, x) && llm_errf(err, LLM_ERR_NOMEM, "no memory for a list");
    }
    if (!bad && json_object_set_new(out, "items", arr))
        bad = llm_errf(err, LLM_ERR_NOMEM, "no memory for a list") != LLM_OK;
    else if (bad)
        json_decref(arr);
    if (bad)
        json_decref(out);
    return bad ? NULL : out;
}

/* An API server's answer, within llm_json's bounds (its depth, and memory
 * per byte: a tenant's custom resource is in it, and may hold what the
 * API server takes, 10,000 levels and 70 bytes of tree per byte); a list
 * that does not fit is read an item at a time (list_by_items). */
static json_t *response_json(const char *text, llm_error *err)
{
    size_t n = strlen(text);
    llm_json_span all = {text, n}, items;
    json_t *v = llm_json_load(text, n, 0, NULL, err);
    if (v || err->code != LLM_ERR_TOO_LONG || !llm_json_member(all, "items", &items))
        return v;
    return list_by_items(all, err);
}

llm_status kube_client_request(kube_client *k, const char *method, const char *path, json_t *body, const char *content_type,
                        json_t **out, llm_error *err)
{
    char url[4096];
    snprintf(url, sizeof url, "%s%s", k->cfg->server, path);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    if (body && !text)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory");
    http_client_body b = {.max = KUBE_MAX_BODY};
    long code = 0;
    pthread_mutex_lock(&k->mu);
    llm_status st = perform(k, method, url, text, content_type, &b, &code, err);
    pthread_mutex_unlock(&k->mu);
    if (k->progress)
        k->progress();
    count(method, st ? 0 : code);
    free(text);
    if (!st && (code < 200 || code > 299))
        st = http_error(code, method, path, &b, err);
    if (!st && out) {
        llm_error je = {0};
        if (!(*out = response_json(b.p ? b.p : "{}", &je)))
            st = llm_errf(err, je.code == LLM_ERR_NOMEM ? LLM_ERR_NOMEM : LLM_ERR_FORMAT, "%s %s: response: %s", method,
                          path, je.msg);
    }
    free(b.p);
    return st;
}
