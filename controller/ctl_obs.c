/* ctl_obs.c - llm-controller's logs, metrics and health endpoints; see
 * ctl_obs.h. */
#include <civetweb.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl_obs.h"
#include "http_reply.h"
#include "kube_client.h"
#include "llm/prom.h"
#include "llm/strbuf.h"
#include "llm/clock.h"

#define N_BUCKETS 12
static const double bucket_le[N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
#define STUCK_S 60.0

static struct {
    pthread_mutex_t mu;
    unsigned long long counters[CTL_M_COUNTERS];
    uint64_t buckets[N_BUCKETS + 1]; /* the last is +Inf */
    double sum;
    uint64_t n;
    long queue, queue_keys;
    int leader;
    unsigned synced, expected; /* bit per informer */
    double heartbeat; /* monotonic seconds; 0 before the worker starts */
    double signals_beat; /* the pod signals' thread; 0 before it starts */
    struct mg_context *mg;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static ctl_level min_level(void)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    const char *v = getenv("LLM_CONTROLLER_LOG_LEVEL");
    for (int i = 0; v && i < 4; i++)
        if (!strcmp(v, names[i]))
            return (ctl_level)i;
    return CTL_INFO;
}

void ctl_obs_log(ctl_level lvl, const char *msg, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (lvl < min_level())
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    char when[40], stamp[48];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", gmtime_r(&ts.tv_sec, &tm));
    snprintf(stamp, sizeof stamp, "%.20s.%03dZ", when, (int)(ts.tv_nsec / 1000000));
    json_t *o = json_pack("{s:s,s:s,s:s}", "ts", stamp, "level", names[lvl], "msg", msg);
    va_list ap;
    va_start(ap, msg);
    for (const char *k; o && (k = va_arg(ap, const char *));) {
        const char *v = va_arg(ap, const char *);
        json_t *js = v ? json_string(v) : NULL;
        if (v)
            json_object_set_new(o, k, js ? js : json_string("(not UTF-8)"));
    }
    va_end(ap);
    char *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    /* one write per line, so lines from several threads never interleave */
    fprintf(stderr, "%s\n", line ? line : msg);
    free(line);
    json_decref(o);
}

void ctl_obs_count(ctl_counter c)
{
    pthread_mutex_lock(&g.mu);
    g.counters[c]++;
    pthread_mutex_unlock(&g.mu);
}

void ctl_obs_reconcile_seconds(double s)
{
    pthread_mutex_lock(&g.mu);
    int b = 0;
    while (b < N_BUCKETS && s > bucket_le[b]) b++;
    g.buckets[b]++;
    g.sum += s;
    g.n++;
    pthread_mutex_unlock(&g.mu);
}

#define SETTER(fn, type, field)             \
    void fn(type v)                         \
    {                                       \
        pthread_mutex_lock(&g.mu);          \
        g.field = v;                        \
        pthread_mutex_unlock(&g.mu);        \
    }
SETTER(ctl_obs_set_queue, long, queue)
SETTER(ctl_obs_set_queue_keys, long, queue_keys)
SETTER(ctl_obs_set_leader, int, leader)

void ctl_obs_expect_informers(int n)
{
    pthread_mutex_lock(&g.mu);
    g.expected = n >= 32 ? ~0u : (1u << n) - 1;
    pthread_mutex_unlock(&g.mu);
}

void ctl_obs_set_synced(int informer, int synced)
{
    pthread_mutex_lock(&g.mu);
    if (synced)
        g.synced |= 1u << (informer & 31);
    else
        g.synced &= ~(1u << (informer & 31));
    pthread_mutex_unlock(&g.mu);
}

void ctl_obs_heartbeat(void)
{
    double t = llm_clock_mono_s();
    pthread_mutex_lock(&g.mu);
    g.heartbeat = t;
    pthread_mutex_unlock(&g.mu);
}

void ctl_obs_heartbeat_signals(void)
{
    double t = llm_clock_mono_s();
    pthread_mutex_lock(&g.mu);
    g.signals_beat = t;
    pthread_mutex_unlock(&g.mu);
}

/* ---- exposition ---------------------------------------------------------------- */

char *ctl_obs_render(void)
{
    llm_strbuf b = {0};
    char lab[64];
    pthread_mutex_lock(&g.mu);
    llm_prom_head(&b, "llm_controller_reconciles_total", "counter", "Reconciles of LLMDeployments by result.");
    llm_prom_sample(&b, "llm_controller_reconciles_total", "result=\"success\"", (double)g.counters[CTL_M_RECONCILE_OK]);
    llm_prom_sample(&b, "llm_controller_reconciles_total", "result=\"error\"", (double)g.counters[CTL_M_RECONCILE_ERR]);
    llm_prom_counter(&b, "llm_controller_reconcile_errors_total", "Reconciles that failed and were requeued with back-off.",
                     NULL, (double)g.counters[CTL_M_RECONCILE_ERR]);
    llm_prom_hist(&b, "llm_controller_reconcile_duration_seconds", "Time one reconcile took.", NULL, bucket_le, N_BUCKETS,
                  g.buckets, g.n, g.sum);
    llm_prom_gauge(&b, "llm_controller_queue_depth", "Keys waiting in the work queue (due or backing off).", NULL,
                   (double)g.queue);
    llm_prom_gauge(&b, "llm_controller_queue_keys", "Keys the work queue knows (one per live LLMDeployment).", NULL,
                   (double)g.queue_keys);
    llm_prom_counter(&b, "llm_controller_watch_relists_total", "Full relists after a watch expired (410 Gone).", NULL,
                     (double)g.counters[CTL_M_RELISTS]);
    llm_prom_counter(&b, "llm_controller_events_total", "Kubernetes Events posted.", NULL, (double)g.counters[CTL_M_EVENTS]);
    llm_prom_counter(&b, "llm_controller_pod_signal_rounds_total",
                     "Rounds of reading the pods' /metrics and /startupz (off the reconciles' path).", NULL,
                     (double)g.counters[CTL_M_SIGNAL_ROUNDS]);
    llm_prom_head(&b, "llm_controller_pod_pages_total", "counter",
                  "Pod pages those rounds asked for, by whether they answered in time.");
    llm_prom_sample(&b, "llm_controller_pod_pages_total", "result=\"answered\"", (double)g.counters[CTL_M_PAGES_ANSWERED]);
    llm_prom_sample(&b, "llm_controller_pod_pages_total", "result=\"unanswered\"",
                    (double)g.counters[CTL_M_PAGES_UNANSWERED]);
    llm_prom_head(&b, "llm_controller_api_requests_total", "counter",
                  "Requests to the Kubernetes API server (watch streams aside), by method and status class.");
    for (int m = 0; m < KUBE_N_METHODS; m++)
        for (int o = 0; o < KUBE_N_OUTCOMES; o++) {
            snprintf(lab, sizeof lab, "method=\"%s\",code=\"%s\"", kube_client_method_name(m), kube_client_outcome_name(o));
            llm_prom_sample(&b, "llm_controller_api_requests_total", lab, (double)kube_client_request_count(m, o));
        }
    llm_prom_counter(&b, "llm_controller_unreadable_objects_total",
                     "Objects the API server sent that are nested too deep to read (left out of their list, or their "
                     "watch event dropped).", NULL, (double)kube_client_unreadable_count());
    llm_prom_gauge(&b, "llm_controller_leader", "1 while this replica holds the leader lease.", NULL, g.leader);
    pthread_mutex_unlock(&g.mu);
    return llm_strbuf_take(&b);
}

/* ---- HTTP ------------------------------------------------------------------------- */

static int on_healthz(struct mg_connection *c, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g.mu);
    double t = llm_clock_mono_s();
    int worker = g.heartbeat == 0 || t - g.heartbeat < STUCK_S;
    int signals = g.signals_beat == 0 || t - g.signals_beat < STUCK_S;
    pthread_mutex_unlock(&g.mu);
    return http_reply_text(c, worker && signals ? 200 : 503, "text/plain",
                 !worker ? "worker stuck for over 60 s\n" : !signals ? "pod signals' thread stuck for over 60 s\n" : "ok\n",
                 NULL);
}

static int on_readyz(struct mg_connection *c, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g.mu);
    int ok = g.expected && (g.synced & g.expected) == g.expected;
    pthread_mutex_unlock(&g.mu);
    return http_reply_text(c, ok ? 200 : 503, "text/plain", ok ? "ok\n" : "informers have not listed yet\n", NULL);
}

static int on_metrics(struct mg_connection *c, void *arg)
{
    (void)arg;
    char *text = ctl_obs_render();
    int code = http_reply_text(c, text ? 200 : 503, "text/plain; version=0.0.4", text ? text : "no memory\n", NULL);
    free(text);
    return code;
}

llm_status ctl_obs_http_start(const char *addr, llm_error *err)
{
    if (!addr || !*addr)
        return LLM_OK;
    const char *opts[] = {"listening_ports", addr, "num_threads", "2", NULL};
    struct mg_callbacks cb;
    memset(&cb, 0, sizeof cb);
    if (!(g.mg = mg_start(&cb, NULL, opts)))
        return llm_errf(err, LLM_ERR_IO, "cannot serve health and metrics on %s (port in use or bad address?)", addr);
    mg_set_request_handler(g.mg, "/healthz", on_healthz, NULL);
    mg_set_request_handler(g.mg, "/readyz", on_readyz, NULL);
    mg_set_request_handler(g.mg, "/metrics", on_metrics, NULL);
    return LLM_OK;
}

void ctl_obs_http_stop(void)
{
    if (g.mg)
        mg_stop(g.mg);
    g.mg = NULL;
}
