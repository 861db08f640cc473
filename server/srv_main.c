/* srv_main.c - llm-server: binds the port first (probes and /metrics
 * answer while the model loads), loads the model and starts the engine on a
 * loader thread, and on SIGTERM/SIGINT turns not-ready at once, takes new
 * requests for shutdown_delay_s more, then refuses them and lets those in
 * flight finish within drain_timeout_s, then exits 0. */
#include <civetweb.h>
#include <strings.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llm/heap.h"
#include "llm/json.h"
#include "llm/log.h"
#include "llm/chat.h"
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

static void *loader(void *arg)
{
    srv *s = arg;
    llm_error err = {0};
    snprintf(s->status, sizeof s->status, "loading %s", s->cfg.model);
    logf_("loading %s", s->cfg.model);
    if (s->cfg.model_sha256 && *s->cfg.model_sha256)
        snprintf(s->status, sizeof s->status, "checking the sha256 of %s", s->cfg.model);
    llm_status st = srv_load_verify_sha256(s->cfg.model, s->cfg.model_sha256, NULL, &err);
    if (!st)
        st = llm_model_load(s->cfg.model, &s->model, &err);
    if (!st) {
        llm_model_prefault(s->model, load_progress, s);
        snprintf(s->status, sizeof s->status, "model loaded; starting the engine");
        st = srv_load_backends(s, s->backends, &s->n_backends, &err);
    }
    if (!st)
        st = srv_load_engine(s, s->model, s->backends, s->n_backends, &s->engine, &err);
    if (!st) {
        snprintf(s->status, sizeof s->status, "warming up");
        st = srv_load_warm_up(s->engine, s->model, &err);
        logf_("warm-up done");
    }
    if (st) {
        snprintf(s->status, sizeof s->status, "%s", err.msg);
        logf_("failed: %s", err.msg);
        atomic_store(&s->phase, SRV_FAILED);
        return NULL;
    }
    llm_stats es;
    llm_engine_stats(s->engine, &es);
    s->n_ctx = es.n_ctx;
    snprintf(s->name, sizeof s->name, "%s", s->cfg.model_name[0] ? s->cfg.model_name : s->model->name);
    if (!(s->chat = srv_chat_new(s->model, s->cfg.chat_template, s->cfg.chat_template_file, &err))) {
        snprintf(s->status, sizeof s->status, "%s", err.msg);
        logf_("failed: %s", err.msg);
        atomic_store(&s->phase, SRV_FAILED);
        return NULL;
    }
    logf_("chat template: %s", s->chat->what);
    s->embed_pooling = srv_embed_default_pooling(s->model, s->cfg.embedding_pooling);
    logf_("embeddings: %s pooling", s->embed_pooling == LLM_POOL_MEAN ? "mean" : "last");
    s->created = (long)time(NULL);
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
    srv_metrics_init(&s.metrics);
    srv_canary_init(&s);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    pthread_t th;
    if (srv_keys_load(s.cfg.api_keys_file, "LLM_SERVER_API_KEYS", &s.keys, &err) || srv_http_start(&s, &err) ||
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
    srv_load_close_backends(s.backends, s.n_backends);
    srv_chat_free(s.chat);
    llm_model_free(s.model);
    srv_keys_free(&s.keys);
    srv_metrics_free(&s.metrics);
    srv_config_free(&s.cfg);
    logf_("stopped");
    return 0;
}
