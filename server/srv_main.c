/* srv_main.c - llm-server: binds the port first (probes and /metrics
 * answer while the model loads), loads the model and starts the engine on a
 * loader thread, and on SIGTERM/SIGINT turns not-ready at once, takes new
 * requests for shutdown_delay_s more, then refuses them and lets those in
 * flight finish within drain_timeout_s, then exits 0. */
#include <civetweb.h>
#include <curl/curl.h>
#include <strings.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llm/clock.h"
#include "llm/heap.h"
#include "llm/json.h"
#include "llm/log.h"
#include "llm/chat.h"
#include "fetch.h"
#include "http_guard.h"
#include "http_probe.h"
#include "srv.h"
#include "srv_embed.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

#define logf_(...) llm_log("llm-server", __VA_ARGS__)

static void load_progress(void *ctx, double done)
{
    srv *s = ctx;
    snprintf(s->status, sizeof s->status, "paging in the weights: %.0f%%", 100 * done);
    logf_("%s", s->status);
}

/* A source's download, as /startupz and the log say it: the probes read
 * dl (atomics) and status; the log gets a line every 5 s. */
static void fetch_progress_cb(void *ctx, const fetch_progress *p)
{
    srv *s = ctx;
    atomic_store(&s->dl.phase, p->phase);
    atomic_store(&s->dl.done, p->done);
    atomic_store(&s->dl.total, p->total);
    atomic_store(&s->dl.rate, (unsigned long long)p->rate);
    char pct[32] = "";
    if (p->total)
        snprintf(pct, sizeof pct, " (%.0f%%)", 100.0 * (double)p->done / (double)p->total);
    char part[48] = "";
    if (p->n_parts > 1)
        snprintf(part, sizeof part, ", part %d of %d", p->part, p->n_parts);
    snprintf(s->status, sizeof s->status, "%s %.200s%s: %.1f of %.1f MB%s at %.1f MB/s", p->phase, p->file, part,
             (double)p->done / 1e6, (double)p->total / 1e6, pct, p->rate / 1e6);
    double now = llm_clock_mono_s();
    if (now - s->dl.last_log >= 5.0 || !strcmp(p->phase, "done")) {
        s->dl.last_log = now;
        logf_("%s", s->status);
    }
}

static void fetch_log_cb(void *ctx, const char *line)
{
    (void)ctx;
    logf_("%s", line);
}

/* cfg.model into model_path: a source is downloaded (checked against
 * model_sha256 as it arrives); a local file's digest is checked here. */
static llm_status find_model(srv *s, llm_error *err)
{
    if (!fetch_is_remote(s->cfg.model)) {
        snprintf(s->model_path, sizeof s->model_path, "%s", s->cfg.model);
        return LLM_OK; /* its digest is checked on the mapping (srv_load_page_in) */
    }
    fetch_options o = {.cache_dir = s->cfg.model_cache[0] ? s->cfg.model_cache : NULL, .sha256 = s->cfg.model_sha256,
                       .verify_cached = (int)s->cfg.model_cache_verify, .progress = fetch_progress_cb, .log = fetch_log_cb, .ctx = s, .abort = &s->stopping};
    fetch_reason why = FETCH_OK;
    atomic_store(&s->dl.phase, "resolving");
    atomic_store(&s->dl.on, 1);
    llm_status st = fetch_model(s->cfg.model, &o, s->model_path, sizeof s->model_path, &why, err);
    if (st && st != LLM_ERR_CANCELLED) /* a stop is no failure of the source */
        snprintf(s->dl.reason, sizeof s->dl.reason, "%s", fetch_reason_name(why));
    else
        logf_("%s is %s", s->cfg.model, s->model_path);
    atomic_store(&s->dl.on, 0);
    return st;
}

/* The model's file (a source downloaded first), loaded and paged in, the
 * backends, the engine and its warm-up token. */
static llm_status load(srv *s, llm_error *err)
{
    llm_status st = find_model(s, err);
    if (!st) {
        snprintf(s->status, sizeof s->status, "loading %.400s", s->model_path);
        /* a source's digest was checked as it arrived; a local file's is checked here, on what is mapped */
        const char *want = fetch_is_remote(s->cfg.model) ? NULL : s->cfg.model_sha256;
        if (want && *want)
            snprintf(s->status, sizeof s->status, "checking the sha256 of %.400s", s->model_path);
        st = srv_load_model(s->model_path, want, load_progress, s, &s->stopping, &s->model, err);
    }
    if (!st)
        st = srv_load_page_in(s->model, load_progress, s, &s->stopping, err);
    if (!st) {
        snprintf(s->status, sizeof s->status, "model loaded; starting the engine");
        st = srv_load_backends(s, s->backends, &s->n_backends, err);
    }
    if (!st && s->cfg.spec_draft_model[0]) {
        snprintf(s->status, sizeof s->status, "loading the draft model %.400s", s->cfg.spec_draft_model);
        st = srv_load_model(s->cfg.spec_draft_model, NULL, NULL, NULL, &s->stopping, &s->draft, err);
        if (!st)
            st = srv_load_page_in(s->draft, NULL, NULL, &s->stopping, err); /* (a file cut short fails the load here) */
        if (st) {
            llm_error why = *err; /* (not formatted into itself) */
            llm_errf(err, st, "the draft model (spec_draft_model): %s", why.msg);
        }
    }
    if (!st)
        st = srv_load_engine(s, s->model, s->draft, s->backends, s->n_backends, &s->engine, err);
    if (!st) {
        snprintf(s->status, sizeof s->status, "warming up");
        st = srv_load_warm_up(s->engine, s->model, err);
        logf_("warm-up done");
    }
    if (!st && !(s->chat = srv_chat_new(s->model, s->cfg.chat_template, s->cfg.chat_template_file, err)))
        st = err->code ? err->code : LLM_ERR_INTERNAL;
    return st;
}

static void *loader(void *arg)
{
    srv *s = arg;
    llm_error err = {0};
    snprintf(s->status, sizeof s->status, "loading %s", s->cfg.model);
    logf_("loading %s", s->cfg.model);
    if (load(s, &err)) {
        snprintf(s->status, sizeof s->status, "%s", err.msg);
        logf_("failed: %s", err.msg);
        atomic_store(&s->phase, SRV_FAILED);
        return NULL;
    }
    llm_stats es;
    llm_engine_stats(s->engine, &es);
    s->n_ctx = es.n_ctx;
    snprintf(s->name, sizeof s->name, "%s", s->cfg.model_name[0] ? s->cfg.model_name : s->model->name);
    logf_("chat template: %s", s->chat->what);
    s->embed_pooling = srv_embed_default_pooling(s->model, s->cfg.embedding_pooling);
    logf_("embeddings: %s pooling", s->embed_pooling == LLM_POOL_MEAN ? "mean" : "last");
    s->created = (long)time(NULL);
    if ((s->cfg.lora[0] || s->cfg.lora_file[0]) && srv_lora_startup(s, &err)) {
        snprintf(s->status, sizeof s->status, "%s", err.msg);
        logf_("failed: %s", err.msg);
        atomic_store(&s->phase, SRV_FAILED);
        return NULL;
    }
    snprintf(s->status, sizeof s->status, "serving %s", s->name);
    atomic_store(&s->phase, SRV_READY);
    logf_("ready: serving '%s' on %s:%ld", s->name, s->cfg.host, s->cfg.port);
    return NULL;
}

/* SIGTERM: not ready at once; new requests still served for the shutdown
 * delay (endpoints take a moment to drop this pod: requests routed here
 * meanwhile must not fail), then refused; those in flight may finish. */
static void drain(srv *s)
{
    http_guard_closing(s->http); /* answers say Connection: close: clients move to other pods */
    if (atomic_load(&s->phase) == SRV_READY) {
        atomic_store(&s->phase, SRV_DRAINING);
        if (s->cfg.shutdown_delay_s > 0)
            logf_("not ready; still taking requests for %ld s while endpoints drop this pod", s->cfg.shutdown_delay_s);
        for (long ms = 0; ms < s->cfg.shutdown_delay_s * 1000; ms += 20) usleep(20000);
    }
    atomic_store(&s->refusing, 1);
    logf_("draining: %d requests in flight, up to %ld s", atomic_load(&s->active), s->cfg.drain_timeout_s);
    for (long ms = 0; atomic_load(&s->active) > 0 && ms < s->cfg.drain_timeout_s * 1000; ms += 20) usleep(20000);
    if (atomic_load(&s->active) == 0)
        return;
    logf_("drain timeout: %d requests still running are cut off", atomic_load(&s->active));
    atomic_store(&s->cutting, 1); /* each ends at its next event (within 1 s) with an error, not a reset */
    for (int ms = 0; atomic_load(&s->active) > 0 && ms < 3000; ms += 20) usleep(20000);
}

/* The span exporter, when an endpoint is configured or in the environment. */
static llm_status start_traces(srv *s, llm_error *err)
{
    llm_status st = otlp_open_configured(s->cfg.otlp_endpoint, "llm-server", s->cfg.trace_sample_ratio, &s->traces, err);
    if (!st && s->traces) /* (the URL is not logged: it may carry credentials) */
        logf_("traces on (OTLP/HTTP; sampled %.0f%% of new traces)", 100 * s->cfg.trace_sample_ratio);
    return st;
}

int main(int argc, char **argv)
{
    static srv s;
    llm_error err = {0};
    int help = 0;
    llm_json_init();
    if (llm_heap_tune(&err))
        logf_("%s (memory freed by large requests may stay with the process)", err.msg);
    if (srv_config_load(argc, argv, &s.cfg, &help, &err)) {
        fprintf(stderr, "llm-server: %s\n", err.msg);
        srv_config_usage(stderr);
        return 2;
    }
    if (help) {
        srv_config_usage(stdout);
        return 0;
    }
    if (fetch_check(s.cfg.model, &(fetch_options){.sha256 = s.cfg.model_sha256}, &err)) {
        /* a malformed source, or digests that do not fit it, fail here, not after the port is up */
        fprintf(stderr, "llm-server: model: %s\n", err.msg);
        return 2;
    }
    srv_metrics_init(&s.metrics);
    srv_canary_init(&s);
    if (srv_lora_init(&s.loras, (int)s.cfg.max_loras, (int)s.cfg.max_lora_rank)) {
        fprintf(stderr, "llm-server: no memory\n");
        return 1;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
        fprintf(stderr, "llm-server: libcurl does not start\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    if (srv_load_catch_bus()) /* (without it a model file cut short while loading kills the process unexplained) */
        fprintf(stderr, "llm-server: cannot catch SIGBUS: %s\n", strerror(errno));
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    pthread_t th;
    if (api_keys_load(s.cfg.api_keys_file, "LLM_SERVER_API_KEYS", &s.keys, &err) || start_traces(&s, &err) ||
        srv_http_start(&s, &err) ||
        pthread_create(&th, NULL, loader, &s)) {
        fprintf(stderr, "llm-server: %s\n", err.msg[0] ? err.msg : "cannot start the loader thread");
        return 1;
    }
    if (!s.keys.n && s.cfg.tenant_max_inflight)
        logf_("warning: tenant_max_inflight %ld has no effect without API keys (no tenants)", s.cfg.tenant_max_inflight);
    logf_("listening on %s:%ld", s.cfg.host, s.cfg.port);
    if (s.cfg.health_port)
        logf_("probes and /metrics also on %s:%ld", s.cfg.host, s.cfg.health_port);
    while (!g_stop) usleep(50000);
    atomic_store(&s.stopping, 1);
    srv_canary_abort(&s);
    pthread_join(th, NULL); /* a load in progress finishes first */
    drain(&s);
    http_guard_stop(s.http);
    http_probe_stop(s.health);
    if (srv_canary_free(&s)) { /* its loader may still use the engine's settings: leave it all to the exit */
        logf_("stopped");
        return 0;
    }
    llm_engine_close(s.engine);
    srv_lora_free(&s.loras);
    srv_load_close_backends(s.backends, s.n_backends);
    srv_chat_free(s.chat);
    llm_model_free(s.model);
    llm_model_free(s.draft);
    api_keys_free(&s.keys);
    otlp_close(s.traces);
    srv_metrics_free(&s.metrics);
    srv_config_free(&s.cfg);
    logf_("stopped");
    return 0;
}
