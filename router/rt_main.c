/* rt_main.c - llm-router: an inference-aware HTTP router in front of
 * llm-server pods. Backends come from --backend URLs or from a Service's
 * EndpointSlices (watched through the API server); a poller reads each
 * backend's own load (/metrics) for the least-loaded choice and ejects
 * backends that stop answering; requests are proxied by rt_proxy.c.
 * A canary revision's backends (--canary-backend / --canary-service) get
 * --canary-weight percent of the requests, changed at run time through
 * POST /admin/canary (bearer --admin-token) or by the canaryWeight key of
 * a ConfigMap the router watches (--weight-configmap; llm-controller's
 * lever during a canary: declarative, so every router replica, and one
 * that restarts, follows it). See usage() for the flags. */
#include <civetweb.h>
#include <errno.h>
#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "prom_text.h"
#include "http_client.h"
#include "http_guard.h"
#include "http_probe.h"
#include "http_reply.h"
#include "llm/clock.h"
#include "llm/heap.h"
#include "llm/json.h"
#include "llm/prom.h"
#include "llm/strbuf.h"
#include "llm/log.h"
#include "kube_watch.h"
#include "rt_kube.h"
#include "rt_gateway.h"
#include "rt_proxy.h"
#include "rt_quota.h"
#include "rt_routes.h"

#define MAX_SLICES 64

static atomic_int g_stop; /* set by the signal handler (lock-free: async-signal-safe), read by every thread */

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

typedef struct router router;

/* One watched Service: the ready endpoints of its EndpointSlices become
 * the backends of one revision. */
typedef struct disc {
    router *r;
    int rev;
    char ns[254], name[254];
    char slice_names[MAX_SLICES][254];
    char *slice_urls[MAX_SLICES]; /* newline-separated ready endpoints of each slice */
} disc;

/* The quota store's failures as last logged (the poller's; main's at the end). */
typedef struct store_logged {
    unsigned long long errors;
    double at;
} store_logged;

struct router {
    rt_pool *pool;
    rt_proxy px;
    long poll_ms;
    long metrics_port;                   /* --metrics-port: the backends' /metrics (their health port); 0: theirs */
    kube_config cfg;
    int n_disc;
    disc d[2];
    const char *admin_token;             /* --admin-token-file, LLM_ROUTER_ADMIN_TOKEN or --admin-token */
    char admin_buf[256];
    char weight_ns[254], weight_cm[254]; /* --weight-configmap */
    http_guard *http;
    long health_port;                    /* --health-port: probes and /metrics on a listener of their own; 0: none */
    http_probe *health;
    int draining;                        /* SIGTERM came: /readyz fails */
    api_keys keys;                       /* --api-keys-file */
    char upstream_auth[API_KEY_MAX_LEN + 8]; /* "Bearer " and --upstream-key-file's key */
    store_logged store;
};

/* The front door's flags: --api-keys-file and the quota's, the traces'. */
typedef struct edge_flags {
    const char *keys_file, *upstream_file;
    rt_quota_config q;
    const char *otlp;          /* --otlp-endpoint */
    double ratio;              /* --trace-sample-ratio */
} edge_flags;

#define logf_(...) llm_log("llm-router", __VA_ARGS__)

/* ---- backend load ----------------------------------------------------------------- */

/* The adapter names a backend's /metrics lists (llm_lora_loaded), pointing into its text. */
typedef struct adapter_names {
    const char *name[RT_POOL_MAX_ADAPTERS];
    size_t len[RT_POOL_MAX_ADAPTERS];
    int n;
} adapter_names;

static void adapter_seen(void *ctx, const char *v, size_t n)
{
    adapter_names *a = ctx;
    a->name[a->n] = v, a->len[a->n++] = n; /* prom_text_labels calls at most RT_POOL_MAX_ADAPTERS times */
}

/* One round over pool's backends; their /metrics on metrics_port (0: the
 * URL's own port). */
static void poll_pool(CURL *h, rt_pool *pool, long metrics_port)
{
    for (int i = 0; i < RT_MAX_BACKENDS && !g_stop; i++) {
        char base[256], url[300], *text;
        if (!rt_pool_url(pool, i, base, sizeof base))
            continue;
        char *colon = strrchr(base, ':'); /* base is http://IP:PORT */
        if (metrics_port && colon && colon > base + 5)
            snprintf(url, sizeof url, "%.*s:%ld/metrics", (int)(colon - base), base, metrics_port);
        else
            snprintf(url, sizeof url, "%s/metrics", base);
        int ok = http_client_get(h, url, 1000, 4u << 20, &text) == 200, f;
        rt_pool_report(pool, i, ok, ok ? prom_text_value(text, "llm_requests_waiting", &f) : 0,
                       ok ? prom_text_value(text, "llm_requests_running", &f) : 0,
                       ok ? prom_text_value(text, "llm_kv_cache_usage_ratio", &f) : 0);
        int fp = 0;
        double kv_tokens = ok ? prom_text_value(text, "llm_kv_cache_tokens", &f) : 0;
        double prompts = ok ? prom_text_value(text, "llm_prompt_tokens_total", &fp) : 0;
        if (ok)
            rt_pool_report_cache(pool, i, f ? kv_tokens : 0, fp ? prompts : -1);
        adapter_names an = {.n = 0};
        if (ok) { /* an unreachable backend keeps what it listed: it is not picked while ejected anyway */
            prom_text_labels(text, "llm_lora_loaded", "adapter", RT_POOL_MAX_ADAPTERS, adapter_seen, &an);
            rt_pool_report_adapters(pool, i, an.name, an.len, an.n);
        }
        free(text);
    }
}

/* The quota store's failures, logged with their last cause at most once
 * every STORE_LOG_S (a Redis that is down fails every request). */
#define STORE_LOG_S 10

static void store_log(router *r, store_logged *l)
{
    char why[160];
    double now = llm_clock_mono_s();
    unsigned long long e = r->px.quota && now - l->at >= STORE_LOG_S ? rt_quota_last_error(r->px.quota, why, sizeof why) : 0;
    if (e > l->errors) {
        logf_("quota store (Redis): %llu failed calls since the last report; the last: %s", e - l->errors,
              why[0] ? why : "a timeout or a closed connection");
        l->errors = e, l->at = now;
    }
}

static void *poller(void *arg)
{
    router *r = arg;
    r->store.at = -STORE_LOG_S;
    CURL *h = curl_easy_init(); /* one handle: connections to the backends stay open */
    rt_route **routes = r->px.routes ? calloc(RT_MAX_ROUTES, sizeof *routes) : NULL;
    if (!h || (r->px.routes && !routes))
        logf_("no memory for the load poller: backends' load is not read (least-loaded acts as round robin)");
    while (!g_stop && h && (!r->px.routes || routes)) {
        if (!r->px.routes) {
            poll_pool(h, r->pool, r->metrics_port);
        } else { /* a gateway: every route's pods (held: a reload may drop a route meanwhile) */
            int n = rt_routes_list(r->px.routes, routes, RT_MAX_ROUTES);
            for (int k = 0; k < n; k++) {
                int port = rt_route_metrics_port(r->px.routes, routes[k]);
                poll_pool(h, rt_route_pool(routes[k]), port ? port : r->metrics_port);
            }
            for (int k = 0; k < n; k++) rt_routes_put(r->px.routes, routes[k]);
        }
        store_log(r, &r->store);
        usleep((useconds_t)r->poll_ms * 1000);
    }
    free(routes);
    curl_easy_cleanup(h);
    return NULL;
}

/* ---- discovery from EndpointSlices ---------------------------------------------- */

/* The union of all slices' endpoints becomes the revision's backends. */
static void publish(disc *r)
{
    const char *urls[RT_MAX_BACKENDS];
    char *copies[MAX_SLICES] = {0};
    int n = 0;
    for (int s = 0; s < MAX_SLICES; s++) {
        if (!r->slice_urls[s] || !(copies[s] = strdup(r->slice_urls[s])))
            continue;
        for (char *save = NULL, *tok = strtok_r(copies[s], "\n", &save); tok && n < RT_MAX_BACKENDS;
             tok = strtok_r(NULL, "\n", &save))
            urls[n++] = tok;
    }
    llm_error err = {0};
    if (rt_pool_set(r->r->pool, r->rev, urls, n, &err))
        logf_("backends: %s", err.msg);
    logf_("%s backends: %d ready endpoints of %s/%s", r->rev ? "canary" : "stable", n, r->ns, r->name);
    for (int s = 0; s < MAX_SLICES; s++) free(copies[s]);
}

static int on_slice(void *arg, const char *type, json_t *obj)
{
    disc *r = arg;
    if (!strcmp(type, "SYNCED") || !strcmp(type, "RELIST")) {
        if (!strcmp(type, "RELIST"))
            for (int s = 0; s < MAX_SLICES; s++) free(r->slice_urls[s]), r->slice_urls[s] = NULL, r->slice_names[s][0] = 0;
        else
            publish(r);
        return g_stop;
    }
    const char *name = json_string_value(json_object_get(json_object_get(obj, "metadata"), "name"));
    if (!name)
        return g_stop;
    int s = 0, free_slot = -1;
    while (s < MAX_SLICES && strcmp(r->slice_names[s], name)) {
        if (free_slot < 0 && !r->slice_names[s][0])
            free_slot = s;
        s++;
    }
    if (s == MAX_SLICES)
        s = free_slot;
    if (s < 0)
        return g_stop;
    free(r->slice_urls[s]);
    r->slice_urls[s] = NULL;
    r->slice_names[s][0] = 0;
    if (strcmp(type, "DELETED")) {
        snprintf(r->slice_names[s], sizeof r->slice_names[s], "%s", name);
        r->slice_urls[s] = rt_kube_slice_urls(obj);
    }
    if (strcmp(type, "SYNC"))
        publish(r);
    return g_stop;
}

static void *discover(void *arg)
{
    disc *r = arg;
    char path[700];
    snprintf(path, sizeof path, "/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices?labelSelector="
                                "kubernetes.io%%2Fservice-name%%3D%s", r->ns, r->name);
    rt_kube_watch(&r->r->cfg, path, on_slice, r, &g_stop);
    return NULL;
}

/* ---- canary weight from a ConfigMap -------------------------------------------- */

static int on_weight(void *arg, const char *type, json_t *obj)
{
    router *r = arg;
    if (!strcmp(type, "SYNCED") || !strcmp(type, "RELIST"))
        return g_stop;
    const char *v = json_string_value(json_object_get(json_object_get(obj, "data"), "canaryWeight"));
    char *end = NULL;
    long w = v ? strtol(v, &end, 10) : 0;
    if (strcmp(type, "DELETED") && (!v || *end || w < 0 || w > 100)) {
        logf_("ConfigMap %s/%s: canaryWeight %s is not 0..100; weight unchanged", r->weight_ns, r->weight_cm,
              v ? v : "(missing)");
        return g_stop;
    }
    if (!strcmp(type, "DELETED"))
        w = 0; /* no canary any more */
    if (w != rt_pool_weight(r->pool))
        logf_("canary weight %ld%% (ConfigMap %s/%s)", w, r->weight_ns, r->weight_cm);
    rt_pool_set_weight(r->pool, (int)w);
    return g_stop;
}

static void *follow_weight(void *arg)
{
    router *r = arg;
    rt_kube_watch_configmap(&r->cfg, r->weight_ns, r->weight_cm, on_weight, r, &g_stop);
    return NULL;
}

/* ---- HTTP ------------------------------------------------------------------------- */

/* Backends known, both revisions (at a gateway, of every route). */
static int backends_known(router *r)
{
    if (!r->px.routes)
        return rt_pool_size(r->pool);
    rt_route **routes = calloc(RT_MAX_ROUTES, sizeof *routes);
    int n = routes ? rt_routes_list(r->px.routes, routes, RT_MAX_ROUTES) : 0, total = 0;
    for (int k = 0; k < n; k++) {
        total += rt_pool_size(rt_route_pool(routes[k]));
        rt_routes_put(r->px.routes, routes[k]);
    }
    free(routes);
    return total;
}

/* The pools' families (a gateway's labelled by route; only route only's
 * when only is not NULL). */
static void pool_metrics(router *r, const char *only, llm_strbuf *out)
{
    if (!r->px.routes) {
        rt_pool_metrics(&r->pool, NULL, 1, out);
        return;
    }
    rt_route **routes = calloc(RT_MAX_ROUTES, sizeof *routes);
    rt_pool **pools = calloc(RT_MAX_ROUTES, sizeof *pools);
    const char **names = calloc(RT_MAX_ROUTES, sizeof *names);
    int n = routes && pools && names ? rt_routes_list(r->px.routes, routes, RT_MAX_ROUTES) : 0, kept = 0;
    for (int k = 0; k < n; k++)
        if (!only || !strcmp(rt_route_name(routes[k]), only))
            pools[kept] = rt_route_pool(routes[k]), names[kept++] = rt_route_name(routes[k]);
    if (routes && pools && names)
        rt_pool_metrics(pools, names, kept, out);
    else
        out->failed = 1;
    for (int k = 0; k < n; k++) rt_routes_put(r->px.routes, routes[k]);
    free(routes), free(pools), free(names);
}

/* GET /: the page (router/gateway.html, compiled in): every model and
 * adapter behind this endpoint, a chat, and throughput, time to first
 * token and the cache hit rate of the last minutes from /metrics. */
extern const unsigned char rt_gateway_html[];
extern const size_t rt_gateway_html_len;
static int h_page(struct mg_connection *c, void *cb)
{
    (void)cb;
    if (strcmp(mg_get_request_info(c)->request_method, "GET")) /* (the handler is for "/" alone) */
        return http_reply_text(c, 405, "text/plain", "GET it\n", NULL);
    return http_reply(c, 200, "text/html; charset=utf-8", (const char *)rt_gateway_html, rt_gateway_html_len,
                      "Content-Security-Policy: default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
                      "frame-ancestors 'none'\r\nX-Content-Type-Options: nosniff\r\n"); /* (never framed: it asks for a key) */
}

static int h_healthz(struct mg_connection *c, void *cb)
{
    (void)cb;
    return http_reply_text(c, 200, "text/plain", "ok\n", NULL);
}

/* Why /readyz fails, or NULL: ready with a backend to send to, or a hold
 * to offer, and not shutting down. A router that holds requests while it
 * has no backend is ready then too: a request must reach it to wake a
 * deployment scaled to zero (its Service would otherwise list no
 * endpoint) - at a gateway, one with such a route that has listed its
 * endpoints once (rt_routes_wakeable). */
static const char *not_ready(router *r)
{
    if (__atomic_load_n(&r->draining, __ATOMIC_RELAXED))
        return "shutting down\n";
    int can = backends_known(r) > 0 || (r->px.routes ? rt_routes_wakeable(r->px.routes) : r->px.hold_s > 0);
    return can ? NULL : "no backends\n";
}

static int h_readyz(struct mg_connection *c, void *cb)
{
    const char *why = not_ready(cb);
    return http_reply_text(c, why ? 503 : 200, "text/plain", why ? why : "ok\n", NULL);
}

static void quota_metrics(router *r, llm_strbuf *out)
{
    unsigned long long refused[RT_QUOTA_N] = {0}, errors = 0;
    int shared = 0;
    if (r->px.quota)
        rt_quota_stats(r->px.quota, refused, &errors, &shared);
    static const char *const limit[RT_QUOTA_N] = {NULL, "rpm", "tpm", "max_inflight", "store"};
    llm_prom_counter(out, "llm_router_unauthorized_total", "Requests refused for want of a valid API key (401).", NULL,
                     (double)__atomic_load_n(&r->px.unauthorized, __ATOMIC_RELAXED));
    for (int l = 1; l < RT_QUOTA_N; l++) {
        char lab[64];
        snprintf(lab, sizeof lab, "limit=\"%s\"", limit[l]);
        llm_prom_counter(out, "llm_router_tenant_refused_total",
                         "Requests refused by a tenant's limit (429), or for want of the quota store (503, store).", lab,
                         (double)refused[l]);
    }
    llm_prom_counter(out, "llm_router_quota_store_errors_total", "Redis calls that failed (down, slow or junk).", NULL,
                     (double)errors);
    llm_prom_gauge(out, "llm_router_quota_shared", "1: the tenants' limits are counted in Redis; 0: each replica its share.",
                   NULL, shared);
}

/* A metrics page made in page (freed here): 200, or 503 when it could not be made whole. */
static int send_page(struct mg_connection *c, llm_strbuf *page)
{
    int code = page->failed ? http_reply_text(c, 503, "text/plain", "no memory\n", NULL)
                            : http_reply(c, 200, "text/plain; version=0.0.4", page->p ? page->p : "", page->len, NULL);
    llm_strbuf_free(page);
    return code;
}

/* The /metrics page into out (qs: the query, or NULL; health: the health
 * port's page, with its listener's counts - the API port's never reads
 * them, its listener stops first): 200; 400 with why in out.
 * GET /metrics?route=NAME on a gateway gives route NAME's families alone
 * (the controller's read of one LLMDeployment: the whole page of a gateway
 * of many routes outgrows what it reads of a page); a name no route has
 * gets an empty page. */
static int metrics_page(router *r, const char *qs, int health, llm_strbuf *out)
{
    char name[256];
    int n = qs && *qs ? mg_get_var(qs, strlen(qs), "route", name, sizeof name) : -1;
    if (n != -1 && (n < 0 || !r->px.routes)) {
        llm_strbuf_printf(out, "%s", r->px.routes ? "route: at most 255 bytes\n" : "route= is for a gateway (--routes)\n");
        return 400;
    }
    if (n != -1) {
        pool_metrics(r, name, out);
        return 200;
    }
    pool_metrics(r, NULL, out);
    llm_prom_counter(out, "llm_router_no_backend_total", "Requests answered 503 for want of a backend.", NULL,
                     (double)__atomic_load_n(&r->px.no_backend, __ATOMIC_RELAXED));
    llm_prom_gauge(out, "llm_router_held_requests", "Requests held while no backend exists (scale from zero).", NULL,
                   __atomic_load_n(&r->px.held, __ATOMIC_RELAXED));
    llm_prom_counter(out, "llm_router_held_total", "Requests that were held.", NULL,
                     (double)__atomic_load_n(&r->px.held_total, __ATOMIC_RELAXED));
    llm_prom_gauge(out, "llm_router_backends", "Backends known (both revisions, every route).", NULL, backends_known(r));
    if (r->px.routes)
        llm_prom_gauge(out, "llm_router_routes", "Routes in the gateway's table.", NULL, rt_routes_count(r->px.routes));
    if (r->px.keys)
        quota_metrics(r, out);
    otlp_metrics(r->px.traces, out);
    http_guard_stats gs;
    http_guard_stats_get(r->http, &gs);
    llm_prom_gauge(out, "llm_http_connections", "Client connections open.", NULL, (double)gs.open);
    llm_prom_counter(out, "llm_http_connections_refused_total", "Connections refused above --max-connections.", NULL,
                     (double)gs.refused);
    if (health) {
        http_probe_stats ps;
        http_probe_stats_get(r->health, &ps);
        llm_prom_counter(out, "llm_router_health_connections_dropped_total",
                         "Health-port connections closed unanswered (too slow, or making room).", NULL, (double)ps.dropped);
    }
    return 200;
}

/* GET /metrics on the API port. With tenant keys it needs one: the page
 * shows every route's traffic and in-flight prompt sizes, which are
 * other tenants' (the health port serves it to the cluster's scrapers). */
static int h_metrics(struct mg_connection *c, void *cb)
{
    router *r = cb;
    if (r->px.keys && !api_keys_find(r->px.keys, mg_get_header(c, "Authorization"))) {
        __atomic_add_fetch(&r->px.unauthorized, 1, __ATOMIC_RELAXED);
        return http_reply_text(c, 401, "text/plain",
                               r->health ? "/metrics on the API port needs an API key (Authorization: Bearer KEY); "
                                           "the health port serves it without one\n"
                                         : "/metrics needs an API key (Authorization: Bearer KEY); --health-port serves "
                                           "it without one on a port of its own\n", NULL);
    }
    llm_strbuf page = {0};
    int code = metrics_page(r, mg_get_request_info(c)->query_string, 0, &page);
    if (code != 200) {
        code = http_reply_text(c, code, "text/plain", page.p && !page.failed ? page.p : "no memory\n", NULL);
        llm_strbuf_free(&page);
        return code;
    }
    return send_page(c, &page);
}

/* The health port (--health-port): the probes and /metrics (with
 * ?route=) on a listener of their own (http_probe.h), which API traffic
 * and idle connections cannot hold, and without a key: the cluster's
 * scrapers and the controller read it; tenants are not to reach it. */
static int health_answer(void *ctx, const char *path, const char *query, char **body, const char **type)
{
    router *r = ctx;
    *type = "text/plain";
    if (!strcmp(path, "/healthz") || !strcmp(path, "/readyz")) {
        const char *why = !strcmp(path, "/readyz") ? not_ready(r) : NULL;
        *body = strdup(why ? why : "ok\n");
        return !*body ? 503 : why ? 503 : 200;
    }
    if (strcmp(path, "/metrics")) {
        *body = strdup("no such route: this port serves /healthz, /readyz and /metrics\n");
        return 404;
    }
    llm_strbuf page = {0};
    int code = metrics_page(r, query, 1, &page);
    if (page.failed) {
        llm_strbuf_free(&page);
        return 503;
    }
    if (code == 200)
        *type = "text/plain; version=0.0.4";
    *body = llm_strbuf_take(&page);
    return code;
}

/* POST /admin/canary {"weight": N} with the admin bearer token: the
 * canary's share (the controller's lever during a canary). */
static int h_admin(struct mg_connection *c, void *cb)
{
    router *r = cb;
    const char *auth = mg_get_header(c, "Authorization");
    char body[256] = "";
    int code = !r->admin_token || r->px.routes ? 404 : !http_guard_bearer_ok(auth, r->admin_token) ? 401
               : strcmp(mg_get_request_info(c)->request_method, "POST") ? 405 : 0;
    if (!code) { /* only an authorized caller's body is read, and within a deadline */
        http_guard_arm(c, 10);
        int n = mg_read(c, body, sizeof body - 1);
        http_guard_disarm(c);
        body[n > 0 ? n : 0] = 0;
    }
    json_t *j = code ? NULL : llm_json_loads(body, 0, NULL), *w = json_object_get(j, "weight");
    if (!code)
        code = !json_is_integer(w) || json_integer_value(w) < 0 || json_integer_value(w) > 100 ? 400 : 200;
    if (code == 200) {
        rt_pool_set_weight(r->pool, (int)json_integer_value(w));
        logf_("canary weight %d%%", (int)json_integer_value(w));
    }
    json_decref(j);
    const char *msg = code == 200 ? "{\"ok\":true}"
                      : code == 404 && r->px.routes ? "{\"error\":\"a gateway's canary weights come from ConfigMaps\"}"
                      : code == 404 ? "{\"error\":\"admin is off (no --admin-token)\"}"
                      : code == 401 ? "{\"error\":\"admin token required\"}" : code == 405 ? "{\"error\":\"use POST\"}"
                      : "{\"error\":\"weight: an integer 0..100\"}";
    return http_reply_text(c, code, "application/json", msg, NULL);
}

/* ---- main --------------------------------------------------------------------------- */

/* SIGTERM: /readyz fails at once while requests are still taken for
 * delay_s (endpoints take a moment to drop this pod), then answers say
 * Connection: close and requests in flight (streams too) get up to
 * drain_s to finish. */
static void drain(router *r, double delay_s, double drain_s)
{
    __atomic_store_n(&r->draining, 1, __ATOMIC_RELAXED);
    logf_("not ready; still taking requests for %.0f s while endpoints drop this pod", delay_s);
    for (double t = 0; t < delay_s; t += 0.02) usleep(20000);
    http_guard_closing(r->http);
    logf_("draining: %d requests in flight, up to %.0f s", __atomic_load_n(&r->px.active, __ATOMIC_RELAXED), drain_s);
    double t = 0;
    for (; __atomic_load_n(&r->px.active, __ATOMIC_RELAXED) > 0 && t < drain_s; t += 0.02) usleep(20000);
    if (__atomic_load_n(&r->px.active, __ATOMIC_RELAXED) == 0)
        return;
    logf_("drain timeout: %d requests still running are cut off", __atomic_load_n(&r->px.active, __ATOMIC_RELAXED));
    __atomic_store_n(&r->px.cutting, 1, __ATOMIC_RELAXED); /* their transfers end at curl's next progress call */
    for (int ms = 0; __atomic_load_n(&r->px.active, __ATOMIC_RELAXED) > 0 && ms < 3000; ms += 20) usleep(20000);
}

/* A gateway's table: empty (a ConfigMap fills it), or from file. */
static llm_status start_table(router *r, const rt_pool_config *pc, const char *file, llm_error *err)
{
    llm_status st = rt_routes_new(pc, &r->px.routes, err);
    if (!st && !file)
        rt_routes_from_kube(r->px.routes);
    if (st || !file)
        return st;
    FILE *f = fopen(file, "rb");
    if (!f)
        return llm_errf(err, LLM_ERR_IO, "--routes %s: %s", file, strerror(errno));
    size_t cap = 16u << 20; /* RT_MAX_ROUTES routes of 64 names: far less */
    char *text = malloc(cap);
    size_t n = text ? fread(text, 1, cap, f) : 0;
    int too_long = text && n == cap;
    fclose(f);
    if (!text)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory to read --routes %s", file);
    st = too_long ? llm_errf(err, LLM_ERR_TOO_LONG, "--routes %s: over 16 MiB", file) : rt_routes_load(r->px.routes, text, n, err);
    free(text);
    if (st && !too_long) {
        char msg[LLM_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err->msg);
        llm_errf(err, st, "--routes %s: %s", file, msg);
    }
    return st;
}

/* A number flag; 0 when v is not all number. */
static int num(const char *v, double *out)
{
    char *end;
    *out = strtod(v, &end);
    return *v && !*end;
}

/* A front-door flag and its value into t: 1, or 0 when a is none of them
 * (or its value is bad). */
static int edge_flag(const char *a, const char *v, edge_flags *t)
{
    double x;
    if (!strcmp(a, "--api-keys-file"))
        t->keys_file = v;
    else if (!strcmp(a, "--upstream-key-file"))
        t->upstream_file = v;
    else if (!strcmp(a, "--quota-redis") && *v)
        t->q.redis = v;
    else if (!strcmp(a, "--quota-redis-user") && *v)
        t->q.user = v;
    else if (!strcmp(a, "--quota-redis-password-file"))
        t->q.password_file = v;
    else if (!strcmp(a, "--quota-prefix") && *v)
        t->q.prefix = v;
    else if (!strcmp(a, "--quota-fail") && (!strcmp(v, "open") || !strcmp(v, "closed")))
        t->q.fail_open = !strcmp(v, "open");
    else if (!strcmp(a, "--quota-share") && num(v, &x) && x >= 1 && x <= 10000)
        t->q.share = (int)x;
    else if (!strcmp(a, "--quota-timeout-ms") && num(v, &x) && x >= 1 && x <= 60000)
        t->q.timeout_ms = (int)x;
    else if (!strcmp(a, "--otlp-endpoint"))
        t->otlp = v;
    else if (!strcmp(a, "--trace-sample-ratio") && num(v, &x) && x >= 0 && x <= 1)
        t->ratio = x;
    else
        return 0;
    return 1;
}

/* The span exporter: --otlp-endpoint, else the OTEL_ environment; none: no traces. */
static llm_status start_traces(router *r, const edge_flags *t, llm_error *err)
{
    llm_status st = otlp_open_configured(t->otlp, "llm-router", t->ratio, &r->px.traces, err);
    if (!st && r->px.traces) /* (the URL is not logged: it may carry credentials) */
        logf_("traces on (OTLP/HTTP; sampled %.0f%% of new traces)", 100 * t->ratio);
    return st;
}

/* The tenants' limits (rt_quota). */
static llm_status start_quota(router *r, edge_flags *t, llm_error *err)
{
    if ((t->q.password_file || t->q.user) && !t->q.redis)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "--quota-redis-user and --quota-redis-password-file need --quota-redis");
    t->q.keys = &r->keys;
    /* a slot in flight outlives the longest request: its body, its hold, its answer */
    t->q.lease_s = (double)(r->px.retries + 1) * (double)r->px.timeout_s + r->px.body_timeout_s + r->px.hold_s + 30;
    return rt_quota_open(&t->q, &r->px.quota, err);
}

/* The gateway's keys and the tenants' limits, from the front-door flags. */
static llm_status start_tenants(router *r, edge_flags *t, llm_error *err)
{
    if (!t->keys_file)
        return t->upstream_file || t->q.redis || t->q.user || t->q.password_file
                   ? llm_errf(err, LLM_ERR_INVALID_ARG, "--upstream-key-file and the --quota-redis flags need "
                              "--api-keys-file (the tenants)")
                   : LLM_OK;
    char key[API_KEY_MAX_LEN + 1];
    llm_status st = api_keys_load(t->keys_file, NULL, &r->keys, err);
    if (!st && !r->keys.n)
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "--api-keys-file %s: no keys in it", t->keys_file);
    if (!st && t->upstream_file && http_guard_token_file(t->upstream_file, key, sizeof key))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "--upstream-key-file %s: cannot read a key from it (one line, 1-%d "
                      "characters)", t->upstream_file, API_KEY_MAX_LEN);
    for (const char *p = key; !st && t->upstream_file && *p; p++) /* it goes into a header: no CR, no space */
        if (*p <= ' ' || *p > '~')
            st = llm_errf(err, LLM_ERR_INVALID_ARG, "--upstream-key-file %s: a key is printable ASCII without spaces",
                          t->upstream_file);
    for (int i = 0; !st && t->upstream_file && i < r->keys.n; i++) /* a pod refuses key-<hex> names in X-LLM-Tenant */
        if (!api_keys_tenant_ok(r->keys.k[i].tenant, strlen(r->keys.k[i].tenant)))
            st = llm_errf(err, LLM_ERR_INVALID_ARG, "--api-keys-file %s: key %d has no tenant= (with "
                          "--upstream-key-file every key names its tenant: the pods are told it)", t->keys_file, i + 1);
    if (!st && t->upstream_file)
        snprintf(r->upstream_auth, sizeof r->upstream_auth, "Bearer %s", key);
    if (!st)
        st = start_quota(r, t, err);
    if (st)
        return st;
    r->px.keys = &r->keys;
    r->px.upstream_auth = r->upstream_auth[0] ? r->upstream_auth : NULL;
    return LLM_OK;
}

/* The flags, into f. */
static void usage_to(FILE *f)
{
    fprintf(f, "usage: llm-router [--host H] [--port 8000] (--backend URL ... | --service NS/NAME [--kubeconfig F])\n"
                    "                  [--canary-backend URL ... | --canary-service NS/NAME] [--canary-weight 0..100]\n"
                    "                  [--admin-token-file F] [--weight-configmap NS/NAME]  (canaryWeight key)\n"
                    "                  (or LLM_ROUTER_ADMIN_TOKEN; --admin-token T works but shows in ps)\n"
                    "                  [--policy cache-aware|least-loaded|round-robin|prefix-hash] [--cache-balance 0.25]\n"
                    "                  [--affinity-header NAME] [--affinity-user]\n"
                    "                  [--expose-backend false]  (true: answers name their backend in X-Backend)\n"
                    "                  [--retries 2] [--eject-after 3] [--eject-seconds 10] [--poll-ms 500]\n"
                    "                  [--metrics-port P]  (the backends' /metrics on their health port, not the API's)\n"
                    "                  [--health-port P]  (/healthz, /readyz and /metrics here too, on a listener of their\n"
                    "                   own, /metrics without a key; with tenant keys the API port's /metrics needs one)\n"
                    "                  [--max-body-bytes 1048576] [--timeout-s 600] [--max-connections 512]\n"
                    "                  [--header-timeout-s 10] [--body-timeout-s 60] [--keep-alive-s 30] [--send-timeout-s 30]\n"
                    "                  [--shutdown-delay-s 0] [--drain-timeout-s 30]  (SIGTERM: not ready, serve, drain)\n"
                    "                  [--hold-seconds 0] [--hold-max 64]   (scale from zero: hold requests while no backend)\n"
                    "                  [--prefix-affinity BYTES]  (same prompt start -> same pod; prefix-hash: 4096)\n"
                    "                  [--api-keys-file F]  (llm-server's keys format: tenants, rpm, tpm, max_inflight)\n"
                    "                  [--upstream-key-file F]  (the key sent to the pods, with X-LLM-Tenant)\n"
                    "                  [--quota-redis HOST:PORT [--quota-fail closed|open] [--quota-timeout-ms 100]\n"
                    "                   [--quota-prefix NAME] [--quota-redis-user U] [--quota-redis-password-file F]]\n"
                    "                  [--quota-share N]  (without Redis: each replica 1/N)\n"
                    "                  [--otlp-endpoint URL] [--trace-sample-ratio 1]  (or OTEL_EXPORTER_OTLP_ENDPOINT)\n"
                    "   a gateway (several deployments; the body's model chooses, instead of --backend/--service):\n"
                    "       llm-router --routes FILE | --routes-configmap NS/NAME (key routes.json; watched, with the\n"
                    "                  namespace's EndpointSlices and canaryWeight ConfigMaps)  [the flags above]\n");
}

/* An unknown or incomplete flag: the usage on stderr, exit status 2. */
static int usage(void)
{
    usage_to(stderr);
    return 2;
}

/* The command line: where to listen, the backends or routes, the tuning. */
typedef struct opts {
    const char *host, *port, *kubeconfig;
    http_guard_cfg gc;
    double shutdown_delay_s, drain_timeout_s;
    const char *backends[RT_MAX_BACKENDS], *canaries[RT_MAX_BACKENDS], *services[2];
    int nb, nc, weight;
    const char *routes_file, *routes_cm;
    rt_pool_config pc;
    edge_flags tf;
} opts;

/* A flag of what is routed to (backends, services, routes, the canary,
 * the API server): 1 taken, 0 not one of them (or a bad value), -1 a
 * failure said on stderr. */
static int target_flag(router *r, opts *o, const char *a, const char *v)
{
    double x;
    const char *slash = strchr(v, '/');
    int ns_name = slash && slash != v && slash[1];
    if (!strcmp(a, "--backend") && o->nb < RT_MAX_BACKENDS)
        o->backends[o->nb++] = v;
    else if (!strcmp(a, "--canary-backend") && o->nc < RT_MAX_BACKENDS)
        o->canaries[o->nc++] = v;
    else if (!strcmp(a, "--service"))
        o->services[0] = v;
    else if (!strcmp(a, "--canary-service"))
        o->services[1] = v;
    else if (!strcmp(a, "--canary-weight") && num(v, &x) && x >= 0 && x <= 100)
        o->weight = (int)x;
    else if (!strcmp(a, "--admin-token") && *v)
        r->admin_token = v;
    else if (!strcmp(a, "--admin-token-file")) {
        if (http_guard_token_file(v, r->admin_buf, sizeof r->admin_buf)) {
            fprintf(stderr, "llm-router: --admin-token-file %s: cannot read a token from it (one line, 1-255 "
                            "characters)\n", v);
            return -1;
        }
        r->admin_token = r->admin_buf; /* read once: restart the router to rotate it */
    } else if (!strcmp(a, "--weight-configmap") && ns_name && strlen(v) < sizeof r->weight_ns) {
        snprintf(r->weight_ns, sizeof r->weight_ns, "%.*s", (int)(slash - v), v);
        snprintf(r->weight_cm, sizeof r->weight_cm, "%s", slash + 1);
    } else if (!strcmp(a, "--kubeconfig"))
        o->kubeconfig = v;
    else if (!strcmp(a, "--routes"))
        o->routes_file = v;
    else if (!strcmp(a, "--routes-configmap") && ns_name)
        o->routes_cm = v;
    else
        return 0;
    return 1;
}

/* A flag of how requests are chosen, proxied, bounded and drained: 1
 * taken, 0 not one of them (or a bad value). */
static int tuning_flag(router *r, opts *o, const char *a, const char *v)
{
    double x = 0;
    int n = num(v, &x);
    if (!strcmp(a, "--host"))
        o->host = v;
    else if (!strcmp(a, "--port"))
        o->port = v;
    else if (!strcmp(a, "--policy") && rt_policy_of(v) >= 0)
        o->pc.policy = (rt_policy)rt_policy_of(v);
    else if (!strcmp(a, "--cache-balance") && n && x > 0 && x <= 1000)
        o->pc.balance = x;
    else if (!strcmp(a, "--expose-backend") && (!strcmp(v, "true") || !strcmp(v, "false")))
        r->px.expose_backend = !strcmp(v, "true");
    else if (!strcmp(a, "--affinity-header"))
        r->px.affinity_header = *v ? v : NULL;
    else if (!strcmp(a, "--retries") && n && x >= 0 && x <= 10)
        r->px.retries = (int)x;
    else if (!strcmp(a, "--eject-after") && n && x >= 1)
        o->pc.threshold = (int)x;
    else if (!strcmp(a, "--eject-seconds") && n && x > 0)
        o->pc.eject_s = x;
    else if (!strcmp(a, "--metrics-port") && n && x >= 1 && x <= 65535)
        r->metrics_port = (long)x;
    else if (!strcmp(a, "--health-port") && n && x >= 1 && x <= 65535)
        r->health_port = (long)x;
    else if (!strcmp(a, "--poll-ms") && n && x >= 10)
        r->poll_ms = (long)x;
    else if (!strcmp(a, "--max-body-bytes") && n && x >= 1)
        r->px.max_body = (long)x;
    else if (!strcmp(a, "--prefix-affinity") && n && x >= 1 && x <= 4096)
        r->px.prefix_affinity = (int)x;
    else if (!strcmp(a, "--hold-seconds") && n && x >= 0)
        r->px.hold_s = x;
    else if (!strcmp(a, "--hold-max") && n && x >= 1)
        r->px.hold_max = (int)x;
    else if (!strcmp(a, "--timeout-s") && n && x >= 1)
        r->px.timeout_s = (long)x;
    else if (!strcmp(a, "--max-connections") && n && x >= 1 && x <= 16384)
        o->gc.max_connections = (int)x;
    else if (!strcmp(a, "--header-timeout-s") && n && x >= 1 && x <= 3600)
        o->gc.header_timeout_s = x;
    else if (!strcmp(a, "--send-timeout-s") && n && x >= 0 && x <= 3600)
        o->gc.send_timeout_s = x;
    else if (!strcmp(a, "--body-timeout-s") && n && x >= 1 && x <= 3600)
        r->px.body_timeout_s = x;
    else if (!strcmp(a, "--keep-alive-s") && n && x >= 0 && x <= 3600)
        o->gc.keep_alive_s = x;
    else if (!strcmp(a, "--shutdown-delay-s") && n && x >= 0 && x <= 3600)
        o->shutdown_delay_s = x;
    else if (!strcmp(a, "--drain-timeout-s") && n && x >= 0 && x <= 86400)
        o->drain_timeout_s = x;
    else
        return 0;
    return 1;
}

/* The services watched for backends (NS/NAME each). 0, or -1 (usage). */
static int discoveries(router *r, const opts *o)
{
    for (int k = 0; k < 2; k++) {
        const char *svc = o->services[k], *slash = svc ? strchr(svc, '/') : NULL;
        if (!svc)
            continue;
        if (!slash || slash == svc || !slash[1] || (size_t)(slash - svc) >= sizeof r->d[0].ns)
            return -1;
        disc *d = &r->d[r->n_disc++];
        d->r = r;
        d->rev = k;
        snprintf(d->ns, sizeof d->ns, "%.*s", (int)(slash - svc), svc);
        snprintf(d->name, sizeof d->name, "%s", slash + 1);
    }
    return 0;
}

/* The command line into r and o: 0, or the exit status (2: usage). */
static int parse(int argc, char **argv, router *r, opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--affinity-user")) {
            r->px.affinity_user = 1;
            continue;
        }
        if (!v)
            return usage();
        i++;
        int t = edge_flag(a, v, &o->tf) ? 1 : target_flag(r, o, a, v);
        if (t < 0)
            return 2;
        if (!t && !tuning_flag(r, o, a, v))
            return usage();
    }
    if (r->health_port && r->health_port == strtol(o->port, NULL, 10)) {
        fprintf(stderr, "llm-router: --health-port %ld is the API port: it needs a port of its own\n", r->health_port);
        return 2;
    }
    if (!r->admin_token && getenv("LLM_ROUTER_ADMIN_TOKEN") && *getenv("LLM_ROUTER_ADMIN_TOKEN"))
        r->admin_token = getenv("LLM_ROUTER_ADMIN_TOKEN");
    int gateway = o->routes_file || o->routes_cm;
    int single = o->nb || o->nc || o->services[0] || o->services[1] || r->weight_cm[0];
    if (gateway ? single || (o->routes_file && o->routes_cm)
                : (o->nb > 0) == (o->services[0] != NULL) || (o->nc > 0 && o->services[1]) || (o->nb && o->services[1]) ||
                      (o->nc && o->services[0]))
        return usage();
    return discoveries(r, o) ? usage() : 0;
}

/* The backends or routes, the API server's config, the tenants and the
 * traces. */
static llm_status start(router *r, opts *o, llm_error *err)
{
    if (!o->tf.q.prefix) /* a gateway's replicas share its name; another gateway on the same Redis counts apart */
        o->tf.q.prefix = o->routes_cm ? o->routes_cm : "llm-router";
    llm_status st = o->routes_file || o->routes_cm ? start_table(r, &o->pc, o->routes_file, err)
                                                   : rt_pool_new(&o->pc, &r->pool, err);
    if (!st && r->pool && o->nb)
        st = rt_pool_set(r->pool, 0, o->backends, o->nb, err);
    if (!st && r->pool && o->nc)
        st = rt_pool_set(r->pool, 1, o->canaries, o->nc, err);
    if (!st && (r->n_disc || r->weight_cm[0] || o->routes_cm))
        st = kube_config_load(o->kubeconfig, &r->cfg, err);
    if (!st)
        st = start_tenants(r, &o->tf, err);
    if (!st)
        st = start_traces(r, &o->tf, err);
    if (st)
        return st;
    r->px.pool = r->pool;
    r->px.cache_aware = o->pc.policy == RT_CACHE_AWARE;
    if (o->pc.policy == RT_PREFIX_HASH && !r->px.prefix_affinity)
        r->px.prefix_affinity = 4096;
    snprintf(r->cfg.agent, sizeof r->cfg.agent, "llm-router");
    if (r->pool)
        rt_pool_set_weight(r->pool, o->weight);
    return LLM_OK;
}

/* The listener and its routes. */
static llm_status listen_on(router *r, opts *o, char *listen, size_t ln, llm_error *err)
{
    snprintf(listen, ln, "%s:%s", o->host, o->port);
    const char *mg_opts[] = {"listening_ports", listen, NULL};
    o->gc.fds_per_connection = 2; /* the client's and the backend's */
    /* kept-alive backend connections, the poller's, watches; the health port's */
    o->gc.fds_extra = RT_PROXY_KEEP_CONNS + RT_MAX_BACKENDS + 16 + (r->health_port ? HTTP_PROBE_MAX_CONNS : 0);
    llm_status st = http_guard_start(&o->gc, mg_opts, &r->http, err);
    if (!st && r->health_port && (st = http_probe_start(o->host, r->health_port, health_answer, r, &r->health, err))) {
        http_guard_stop(r->http);
        r->http = NULL;
    }
    if (st)
        return st;
    struct mg_context *mg = http_guard_mg(r->http);
    mg_set_request_handler(mg, "/$", h_page, r);
    mg_set_request_handler(mg, "/healthz$", h_healthz, r);
    mg_set_request_handler(mg, "/readyz$", h_readyz, r);
    mg_set_request_handler(mg, "/metrics$", h_metrics, r);
    mg_set_request_handler(mg, "/admin/canary$", h_admin, r);
    /* the proxied routes on a stack sized for request code (civetweb's is 100 KiB; curl and the body checks run
     * there); at most HTTP_GUARD_ROUTES, these four are well within */
    static const char *const proxied[] = {"/v1/", "/generate$", "/tokenize$", "/detokenize$"};
    for (size_t i = 0; i < sizeof proxied / sizeof *proxied; i++)
        http_guard_route(r->http, proxied[i], rt_proxy_handle, &r->px);
    http_guard_serve(r->http);
    return LLM_OK;
}

/* What the router holds, let go at exit. */
static void release(router *r, const opts *o)
{
    for (int k = 0; k < r->n_disc; k++)
        for (int s = 0; s < MAX_SLICES; s++) free(r->d[k].slice_urls[s]);
    if (r->n_disc || r->weight_cm[0] || o->routes_cm)
        kube_config_free(&r->cfg);
    rt_pool_free(r->pool);
    rt_routes_free(r->px.routes);
    rt_quota_close(r->px.quota);
    otlp_close(r->px.traces);
    api_keys_free(&r->keys);
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) { /* asked for: stdout, status 0 */
        usage_to(stdout);
        return 0;
    }
    static router r;
    static opts o = {.host = "0.0.0.0", .port = "8000", .shutdown_delay_s = 0, .drain_timeout_s = 30,
                     .gc = {.max_connections = 512, .header_timeout_s = 10, .keep_alive_s = 30, .send_timeout_s = 30},
                     .pc = {RT_CACHE_AWARE, 3, 10, 0.25}, .tf = {.q = {.share = 1, .timeout_ms = 100}, .ratio = 1}};
    r.px = (rt_proxy){.retries = 2, .max_body = 1 << 20, .timeout_s = 600, .affinity_header = "X-Session-Id",
                      .hold_max = 64, .body_timeout_s = 60};
    r.poll_ms = 500;
    int bad = parse(argc, argv, &r, &o);
    if (bad)
        return bad;
    llm_error err = {0};
    if (llm_heap_tune(&err))
        logf_("%s (memory freed by large requests may stay with the process)", err.msg);
    llm_json_init();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char listen[300];
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    if (start(&r, &o, &err) || listen_on(&r, &o, listen, sizeof listen, &err)) {
        fprintf(stderr, "llm-router: %s\n", err.msg);
        return 1;
    }
    pthread_t poll_th, disc_th[2], weight_th;
    int polling = pthread_create(&poll_th, NULL, poller, &r) == 0, discovering = 0;
    int weighing = r.weight_cm[0] && pthread_create(&weight_th, NULL, follow_weight, &r) == 0;
    while (discovering < r.n_disc && pthread_create(&disc_th[discovering], NULL, discover, &r.d[discovering]) == 0)
        discovering++;
    rt_gateway *gw = NULL;
    int failed = 0;
    if (o.routes_cm) {
        char ns[254];
        snprintf(ns, sizeof ns, "%.*s", (int)(strchr(o.routes_cm, '/') - o.routes_cm), o.routes_cm);
        if (rt_gateway_start(&r.cfg, ns, strchr(o.routes_cm, '/') + 1, r.px.routes, &g_stop, &gw, &err)) {
            logf_("%s", err.msg);
            g_stop = 1;
            failed = 1;
        }
    }
    logf_("listening on %s, policy %s, %s, canary weight %d%%", listen, rt_policy_name(o.pc.policy),
          o.routes_cm ? "a gateway (routes from a ConfigMap)" : o.routes_file ? "a gateway (routes from a file)"
          : r.n_disc ? "backends from EndpointSlices" : "static backends", o.weight);
    while (!g_stop) usleep(50000);
    drain(&r, o.shutdown_delay_s, o.drain_timeout_s);
    http_probe_stop(r.health); /* first: its /metrics reads the API listener's counts and the pools (the API
                                * port's page never reads the probe's) */
    http_guard_stop(r.http);
    if (polling)
        pthread_join(poll_th, NULL);
    r.store.at = -STORE_LOG_S; /* the quota store's failures since the last report, served until the drain's end */
    store_log(&r, &r.store);
    for (int k = 0; k < discovering; k++) pthread_join(disc_th[k], NULL);
    rt_gateway_join(gw);
    if (weighing)
        pthread_join(weight_th, NULL);
    release(&r, &o);
    curl_global_cleanup();
    logf_("stopped");
    return failed;
}
