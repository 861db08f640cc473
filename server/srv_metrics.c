/* srv_metrics.c - Prometheus text exposition of the server's metrics. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm/strbuf.h"
#include "srv_metrics.h"

const char *const srv_route_names[SRV_N_ROUTES] = {
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/generate", "/tokenize",
    "/detokenize",     "/metrics",             "/probes",    "/",         "other",
};
static const char *const status_names[6] = {"2xx", "4xx", "429", "499", "5xx", "503"};
static const double bounds[SRV_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                0.5,   1,      2.5,   5,    10,    30,    60,  120};
static const char *const hist_names[H_COUNT][2] = {
    {"llm_time_to_first_token_seconds", "Time from request arrival to its first token"},
    {"llm_inter_token_latency_seconds", "Time between two tokens of a stream"},
    {"llm_queue_time_seconds", "Time from arrival until first scheduled"},
    {"llm_e2e_request_latency_seconds", "Time from arrival to the last token"},
};

void srv_metrics_init(srv_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void srv_metrics_free(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

static int status_class(int status)
{
    if (status == 429) return 2;
    if (status == 499) return 3;
    if (status == 503) return 5;
    return status >= 500 ? 4 : status >= 400 ? 1 : 0;
}

void srv_metrics_connections(srv_metrics *m, const long long conns[4])
{
    pthread_mutex_lock(&m->mu);
    memcpy(m->conns, conns, sizeof m->conns);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_request(srv_metrics *m, int route, int status)
{
    pthread_mutex_lock(&m->mu);
    m->requests[route][status_class(status)]++;
    pthread_mutex_unlock(&m->mu);
}

static void hist_add(srv_hist *h, double s)
{
    int b = 0;
    while (b < SRV_HIST_BUCKETS && s > bounds[b]) b++;
    h->counts[b]++;
    h->sum += s;
    h->n++;
}

void srv_metrics_observe(srv_metrics *m, srv_hist_id h, double s)
{
    pthread_mutex_lock(&m->mu);
    hist_add(&m->hist[h], s);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_revision(srv_metrics *m, int rev, int status)
{
    pthread_mutex_lock(&m->mu);
    m->rev_codes[rev & 1][status >= 200 && status < 600 ? status / 100 - 2 : 3]++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_rev_observe(srv_metrics *m, int rev, int itl, double seconds)
{
    pthread_mutex_lock(&m->mu);
    hist_add(itl ? &m->rev_itl[rev & 1] : &m->rev_ttft[rev & 1], seconds);
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_canary(srv_metrics *m, int loaded, int weight)
{
    pthread_mutex_lock(&m->mu);
    m->canary_loaded = loaded;
    m->canary_weight = weight;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_finished(srv_metrics *m, int reason)
{
    pthread_mutex_lock(&m->mu);
    m->finished[reason]++;
    pthread_mutex_unlock(&m->mu);
}

/* A growing text buffer; on allocation failure it stays NULL. */
static void gauge(llm_strbuf *b, const char *name, const char *help, double v)
{
    llm_strbuf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

static void counter(llm_strbuf *b, const char *name, const char *help, double v)
{
    llm_strbuf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s_total %.17g\n", name, help, name, name, v);
}

long srv_rss_bytes(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = 0;
    if (f)
        fclose(f);
    return rss * sysconf(_SC_PAGESIZE);
}

static void render_http(llm_strbuf *b, const srv_metrics *m)
{
    llm_strbuf_printf(b, "# HELP llm_http_requests HTTP requests by route and status class\n# TYPE llm_http_requests counter\n");
    /* every route's 2xx series always (a scrape racing the first request's
     * count still finds the family); other classes once they happen */
    for (int r = 0; r < SRV_N_ROUTES; r++)
        for (int c = 0; c < 6; c++)
            if (m->requests[r][c] || c == 0)
                llm_strbuf_printf(b, "llm_http_requests_total{route=\"%s\",status=\"%s\"} %llu\n", srv_route_names[r], status_names[c],
                    (unsigned long long)m->requests[r][c]);
    llm_strbuf_printf(b, "# HELP llm_http_connections API connections open\n# TYPE llm_http_connections gauge\n"
                         "llm_http_connections %lld\n", m->conns[0]);
    static const char *const conn_what[3][2] = {{"accepted", "API connections accepted"},
        {"refused", "API connections refused above max_connections (503)"},
        {"cut", "API connections cut when a request body ran past body_timeout_s"}};
    for (int i = 0; i < 3; i++)
        llm_strbuf_printf(b, "# HELP llm_http_connections_%s %s\n# TYPE llm_http_connections_%s counter\n"
                             "llm_http_connections_%s_total %lld\n", conn_what[i][0], conn_what[i][1], conn_what[i][0],
                          conn_what[i][0], m->conns[i + 1]);
    static const char *const why[3] = {"stop", "length", "abort"};
    llm_strbuf_printf(b, "# HELP llm_request_success Finished completions by reason\n# TYPE llm_request_success counter\n");
    for (int i = 0; i < 3; i++)
        llm_strbuf_printf(b, "llm_request_success_total{finished_reason=\"%s\"} %llu\n", why[i], (unsigned long long)m->finished[i]);
    for (int h = 0; h < H_COUNT; h++) {
        const srv_hist *x = &m->hist[h];
        llm_strbuf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", hist_names[h][0], hist_names[h][1], hist_names[h][0]);
        uint64_t acc = 0;
        for (int i = 0; i < SRV_HIST_BUCKETS; i++) {
            acc += x->counts[i];
            llm_strbuf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", hist_names[h][0], bounds[i], (unsigned long long)acc);
        }
        llm_strbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", hist_names[h][0], (unsigned long long)x->n,
            hist_names[h][0], x->sum, hist_names[h][0], (unsigned long long)x->n);
    }
}

/* Per-revision series under llm-router's names (without "router_"), so
 * the controller's canary analysis reads both alike. */
static void render_revisions(llm_strbuf *b, const srv_metrics *m)
{
    static const char *const rev[2] = {"stable", "canary"}, *const code[4] = {"2xx", "3xx", "4xx", "5xx"};
    llm_strbuf_printf(b, "# HELP llm_revision_requests_total Completions by revision (colocated canary) and status class\n"
                         "# TYPE llm_revision_requests_total counter\n");
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 4; c++)
            llm_strbuf_printf(b, "llm_revision_requests_total{revision=\"%s\",code=\"%s\"} %llu\n", rev[r], code[c],
                              (unsigned long long)m->rev_codes[r][c]);
    static const char *const names[2][2] = {{"llm_revision_ttfb_seconds", "Time to the first token, by revision"},
                                            {"llm_revision_itl_seconds", "Time between tokens, by revision"}};
    for (int k = 0; k < 2; k++) {
        llm_strbuf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", names[k][0], names[k][1], names[k][0]);
        for (int r = 0; r < 2; r++) {
            const srv_hist *x = k ? &m->rev_itl[r] : &m->rev_ttft[r];
            uint64_t acc = 0;
            for (int i = 0; i < SRV_HIST_BUCKETS; i++) {
                acc += x->counts[i];
                llm_strbuf_printf(b, "%s_bucket{revision=\"%s\",le=\"%g\"} %llu\n", names[k][0], rev[r], bounds[i],
                                  (unsigned long long)acc);
            }
            llm_strbuf_printf(b, "%s_bucket{revision=\"%s\",le=\"+Inf\"} %llu\n%s_sum{revision=\"%s\"} %.9g\n"
                                 "%s_count{revision=\"%s\"} %llu\n", names[k][0], rev[r], (unsigned long long)x->n,
                              names[k][0], rev[r], x->sum, names[k][0], rev[r], (unsigned long long)x->n);
        }
    }
    gauge(b, "llm_canary_loaded", "1 when a colocated canary model serves beside the stable one", m->canary_loaded);
    gauge(b, "llm_canary_weight", "Percent of completions sent to the colocated canary", m->canary_weight);
}

static void render_engine(llm_strbuf *b, const llm_stats *s)
{
    double usage = s->kv_blocks_total ? (double)s->kv_blocks_used / s->kv_blocks_total : 0;
    gauge(b, "llm_requests_running", "Sequences being decoded", s->running);
    gauge(b, "llm_requests_waiting", "Sequences waiting for admission", s->waiting);
    gauge(b, "llm_kv_cache_usage_ratio", "Share of KV blocks referenced by sequences", usage);
    gauge(b, "llm_kv_cache_blocks", "KV blocks in the pool", s->kv_blocks_total);
    gauge(b, "llm_kv_cache_cached_blocks", "Unreferenced KV blocks kept for prefix reuse", s->kv_blocks_cached);
    gauge(b, "llm_kv_cache_local_blocks", "KV blocks of sliding-window layers (their own pool; 0: none)",
          s->kv_local_blocks_total);
    gauge(b, "llm_kv_cache_local_used_blocks", "Sliding-window layers' KV blocks referenced by sequences",
          s->kv_local_blocks_used);
    counter(b, "llm_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", (double)s->prompt_tokens);
    counter(b, "llm_prefix_cache_hits", "Prompt tokens served from the prefix cache (not those shared by n > 1 siblings)",
            (double)(s->cached_tokens - s->forked_tokens));
    counter(b, "llm_preemptions", "Sequences preempted for KV space", (double)s->preemptions);
    counter(b, "llm_prompt_tokens", "Prompt tokens admitted", (double)s->prompt_tokens);
    counter(b, "llm_generation_tokens", "Tokens generated", (double)s->generated_tokens);
    counter(b, "llm_engine_steps", "Engine steps (batched forward passes)", (double)s->steps);
    gauge(b, "llm_generation_tokens_per_second", "Generated tokens per second over the last seconds", s->gen_tokens_per_s);
    llm_strbuf_printf(b, "# HELP llm_batch_size_tokens Tokens per engine step (one batched forward pass)\n"
           "# TYPE llm_batch_size_tokens histogram\n");
    uint64_t acc = 0;
    for (int i = 0; i < LLM_BATCH_BUCKETS - 1; i++) {
        acc += s->batch_hist[i];
        llm_strbuf_printf(b, "llm_batch_size_tokens_bucket{le=\"%d\"} %llu\n", LLM_BATCH_BUCKET(i), (unsigned long long)acc);
    }
    llm_strbuf_printf(b, "llm_batch_size_tokens_bucket{le=\"+Inf\"} %llu\nllm_batch_size_tokens_sum %llu\nllm_batch_size_tokens_count %llu\n",
        (unsigned long long)s->steps, (unsigned long long)s->computed_tokens, (unsigned long long)s->steps);
    /* the names existing routers and autoscalers read (vLLM's) */
    gauge(b, "vllm:num_requests_running", "Sequences being decoded", s->running);
    gauge(b, "vllm:num_requests_waiting", "Sequences waiting", s->waiting);
    gauge(b, "vllm:kv_cache_usage_perc", "KV cache usage, 0-1", usage);
    llm_strbuf_printf(b, "# HELP vllm:cache_config_info KV cache configuration\n# TYPE vllm:cache_config_info gauge\n"
           "vllm:cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%d\"} 1\n", s->kv_block_size, s->kv_blocks_total);
}

/* Memory of each rank's backend: the device's total and free memory and
 * what this server allocated on it (weights on a GPU, KV, activations). */
static void render_backends(llm_strbuf *b, llm_backend *const *bk, int n)
{
    static const char *const kind[3] = {"used", "total", "free"};
    llm_strbuf_printf(b, "# HELP llm_backend_memory_bytes Memory of each rank's device: allocated by this server (used), "
                         "the device's total and free\n# TYPE llm_backend_memory_bytes gauge\n");
    for (int r = 0; r < n; r++) {
        llm_backend_mem mem;
        llm_backend_mem_stats(bk[r], &mem);
        for (char *c = mem.device; *c; c++)
            if (*c == '"' || *c == '\\' || *c == '\n')
                *c = '_';
        size_t v[3] = {mem.used, mem.total, mem.free};
        for (int k = 0; k < 3; k++)
            llm_strbuf_printf(b, "llm_backend_memory_bytes{rank=\"%d\",backend=\"%s\",device=\"%s\",kind=\"%s\"} %zu\n", r,
                              bk[r]->iface->name, mem.device, kind[k], v[k]);
    }
}

char *srv_metrics_render(srv_metrics *m, llm_engine *e, int phase, llm_backend *const *backends, int n)
{
    llm_strbuf b = {0};
    pthread_mutex_lock(&m->mu);
    render_http(&b, m);
    render_revisions(&b, m);
    pthread_mutex_unlock(&m->mu);
    if (e) {
        llm_stats s;
        llm_engine_stats(e, &s);
        render_engine(&b, &s);
        render_backends(&b, backends, n);
    }
    gauge(&b, "llm_server_phase", "0 loading, 1 ready, 2 draining, 3 failed", phase);
    gauge(&b, "process_resident_memory_bytes", "Resident memory", (double)srv_rss_bytes());
    return llm_strbuf_take(&b);
}
