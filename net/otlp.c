/* otlp.c - W3C trace context and an OTLP/HTTP span exporter; see otlp.h.
 * The protobuf is written here, a few fields of opentelemetry-proto's
 * trace.proto by hand: Debian packages no OpenTelemetry C SDK, and
 * protobuf-c would need code generated from .proto files that are not
 * packaged either. The tests decode what this writes with the official
 * opentelemetry-proto Python package. */
#include "otlp.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "llm/prom.h"
#include "llm/strbuf.h"
#include "llm/sync.h"
#include "llm/utf8.h"

#define BATCH_MAX 512
#define ATTRS_MAX 16
#define TEXT_MAX 256 /* bytes of a name or a string attribute kept */

struct otlp {
    otlp_config cfg;
    char endpoint[1024], service[128];
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_t th;
    char **q;                  /* encoded Span messages, a ring of cfg.queue_max */
    size_t *qlen;
    char **batch;              /* the exporter's: BATCH_MAX taken from the ring */
    size_t *blen;
    CURL *h;
    int head, n, stop;
    unsigned long long exported, dropped;
};

/* ---- trace context --------------------------------------------------------------------- */

static int hex_val(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; /* lowercase only (W3C) */
}

/* n bytes from 2n lowercase hex digits; 1 when they are, and not all zero. */
static int hex_bytes(const char *h, uint8_t *out, size_t n)
{
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        int a = hex_val(h[2 * i]), b = hex_val(h[2 * i + 1]);
        if (a < 0 || b < 0)
            return 0;
        out[i] = (uint8_t)(a << 4 | b);
        any |= out[i];
    }
    return any != 0;
}

int otlp_traceparent_parse(const char *h, otlp_ctx *out)
{
    if (!h || strlen(h) != 55 || strncmp(h, "00-", 3) || h[35] != '-' || h[52] != '-')
        return 0;
    int f0 = hex_val(h[53]), f1 = hex_val(h[54]);
    if (f0 < 0 || f1 < 0 || !hex_bytes(h + 3, out->trace_id, 16) || !hex_bytes(h + 36, out->span_id, 8))
        return 0;
    out->sampled = f1 & 1;
    return 1;
}

void otlp_traceparent_format(const otlp_ctx *c, char out[56])
{
    int k = snprintf(out, 56, "00-");
    for (int i = 0; i < 16; i++) k += snprintf(out + k, (size_t)(56 - k), "%02x", c->trace_id[i]);
    k += snprintf(out + k, (size_t)(56 - k), "-");
    for (int i = 0; i < 8; i++) k += snprintf(out + k, (size_t)(56 - k), "%02x", c->span_id[i]);
    snprintf(out + k, (size_t)(56 - k), "-%s", c->sampled ? "01" : "00");
}

/* Random bytes, never all zero (an all-zero id is invalid). */
static void random_id(uint8_t *p, size_t n)
{
    if (getrandom(p, n, 0) != (ssize_t)n) { /* (no entropy: the clock, mixed; ids need not be secret) */
        uint64_t x = otlp_now_ns() ^ (uint64_t)(uintptr_t)p;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            p[i] = (uint8_t)x;
        }
    }
    p[n - 1] |= p[0] ? 0 : 1;
}

void otlp_child(const otlp *o, const otlp_ctx *parent, int has_parent, otlp_ctx *out)
{
    if (parent && has_parent) {
        memcpy(out->trace_id, parent->trace_id, 16);
        out->sampled = parent->sampled && o;
    } else {
        random_id(out->trace_id, 16);
        uint64_t x = 0;
        for (int i = 0; i < 8; i++) x = x << 8 | out->trace_id[i];
        out->sampled = o && (double)(x >> 11) * 0x1p-53 < o->cfg.ratio;
    }
    random_id(out->span_id, 8);
}

uint64_t otlp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void otlp_env_endpoint(char *out, size_t n)
{
    const char *t = getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), *b = getenv("OTEL_EXPORTER_OTLP_ENDPOINT");
    if (t && *t)
        snprintf(out, n, "%s", t);
    else if (b && *b) /* the base: its traces path is added (the spec's rule) */
        snprintf(out, n, "%s%s", b, b[strlen(b) - 1] == '/' ? "v1/traces" : "/v1/traces");
    else if (n)
        out[0] = 0;
}

/* ---- protobuf -------------------------------------------------------------------------- */

static void pb_varint(llm_strbuf *b, uint64_t v)
{
    char x[10];
    int n = 0;
    do {
        x[n++] = (char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    llm_strbuf_append(b, x, (size_t)n);
}

static void pb_len(llm_strbuf *b, int field, const void *p, size_t n)
{
    pb_varint(b, (uint64_t)field << 3 | 2);
    pb_varint(b, n);
    llm_strbuf_append(b, p, n);
}

/* A string field: valid UTF-8 (a collector refuses a batch with one bad
 * string: invalid bytes become U+FFFD), at most TEXT_MAX bytes, cut
 * between characters. */
static void pb_str(llm_strbuf *b, int field, const char *s)
{
    size_t n = strnlen(s, TEXT_MAX), len = 0;
    char *v = llm_utf8_dup_valid(s, n, &len);
    if (!v) {
        b->failed = 1;
        return;
    }
    while (len > TEXT_MAX || (len > 0 && len < strlen(v) && ((unsigned char)v[len] & 0xC0) == 0x80))
        len--; /* (the repair may have grown it: back to a character's start within the bound) */
    pb_len(b, field, v, len);
    free(v);
}

static void pb_fixed64(llm_strbuf *b, int field, uint64_t v)
{
    char x[8];
    for (int i = 0; i < 8; i++) x[i] = (char)(v >> (8 * i));
    pb_varint(b, (uint64_t)field << 3 | 1);
    llm_strbuf_append(b, x, 8);
}

/* A KeyValue (field `field` of its parent). */
static void pb_attr(llm_strbuf *b, int field, const otlp_attr *a)
{
    llm_strbuf v = {0}, kv = {0};
    if (a->s)
        pb_str(&v, 1, a->s); /* AnyValue.string_value */
    else {
        pb_varint(&v, 3 << 3 | 0); /* AnyValue.int_value */
        pb_varint(&v, (uint64_t)a->i);
    }
    pb_str(&kv, 1, a->key);
    pb_len(&kv, 2, v.p ? v.p : "", v.len);
    pb_len(b, field, kv.p ? kv.p : "", kv.len);
    b->failed |= v.failed | kv.failed;
    llm_strbuf_free(&v);
    llm_strbuf_free(&kv);
}

/* ---- the exporter ---------------------------------------------------------------------- */

void otlp_span(otlp *o, const otlp_ctx *ctx, const uint8_t *parent_span, const char *name, int kind, uint64_t start_ns,
               uint64_t end_ns, const otlp_attr *attrs, int n_attrs, int error)
{
    if (!o || !ctx->sampled)
        return;
    llm_strbuf s = {0};
    pb_len(&s, 1, ctx->trace_id, 16);
    pb_len(&s, 2, ctx->span_id, 8);
    if (parent_span)
        pb_len(&s, 4, parent_span, 8);
    pb_str(&s, 5, name);
    pb_varint(&s, 6 << 3 | 0);
    pb_varint(&s, (uint64_t)kind);
    pb_fixed64(&s, 7, start_ns);
    pb_fixed64(&s, 8, end_ns > start_ns ? end_ns : start_ns);
    for (int i = 0; i < n_attrs && i < ATTRS_MAX; i++)
        if (attrs[i].key)
            pb_attr(&s, 9, &attrs[i]);
    if (error) {
        char st[2] = {3 << 3 | 0, 2}; /* Status.code = STATUS_CODE_ERROR */
        pb_len(&s, 15, st, 2);
    }
    pthread_mutex_lock(&o->mu);
    int full = s.failed || o->n >= o->cfg.queue_max;
    if (full) {
        o->dropped++;
    } else {
        int at = (o->head + o->n) % o->cfg.queue_max;
        o->qlen[at] = s.len;
        o->q[at] = llm_strbuf_take(&s);
        o->n++;
        if (o->n >= BATCH_MAX)
            pthread_cond_signal(&o->wake);
    }
    pthread_mutex_unlock(&o->mu);
    llm_strbuf_free(&s);
}

/* The batch's ExportTraceServiceRequest around spans [0, n) of span/len. */
static int encode_batch(const otlp *o, char **span, size_t *len, int n, llm_strbuf *out)
{
    llm_strbuf res = {0}, scope = {0}, ss = {0}, rs = {0};
    otlp_attr svc = {"service.name", o->service, 0};
    pb_attr(&res, 1, &svc);
    pb_str(&scope, 1, "llm-k8s");
    pb_len(&ss, 1, scope.p ? scope.p : "", scope.len);
    for (int i = 0; i < n; i++) pb_len(&ss, 2, span[i], len[i]);
    pb_len(&rs, 1, res.p ? res.p : "", res.len);
    pb_len(&rs, 2, ss.p ? ss.p : "", ss.len);
    pb_len(out, 1, rs.p ? rs.p : "", rs.len);
    int bad = res.failed | scope.failed | ss.failed | rs.failed | out->failed;
    llm_strbuf_free(&res), llm_strbuf_free(&scope), llm_strbuf_free(&ss), llm_strbuf_free(&rs);
    return bad ? -1 : 0;
}

static size_t discard(char *d, size_t sz, size_t n, void *u)
{
    (void)d, (void)u;
    return sz * n;
}

/* POSTs one batch; 1 when the collector took it (2xx). */
static int post(otlp *o, CURL *h, const llm_strbuf *body)
{
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/x-protobuf");
    if (!hdr)
        return 0;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, o->endpoint);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body->p);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body->len);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(o->cfg.timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    long code = 0;
    CURLcode rc = curl_easy_perform(h);
    if (rc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(hdr);
    return rc == CURLE_OK && code >= 200 && code < 300;
}

/* Takes up to BATCH_MAX queued spans into the batch (waiting up to a
 * second for them, or for stop); their count, and *stopping. */
static int take(otlp *o, int *stopping)
{
    pthread_mutex_lock(&o->mu);
    if (o->n < BATCH_MAX && !o->stop) {
        struct timespec until = llm_sync_after_ms(1000);
        pthread_cond_timedwait(&o->wake, &o->mu, &until);
    }
    int n = 0;
    while (o->n && n < BATCH_MAX) {
        o->batch[n] = o->q[o->head], o->blen[n] = o->qlen[o->head];
        o->head = (o->head + 1) % o->cfg.queue_max;
        o->n--, n++;
    }
    *stopping = o->stop;
    pthread_mutex_unlock(&o->mu);
    return n;
}

/* The exporter's thread: a batch at a time; once stopping, the batch taken
 * then is the last sent (a stalled collector must not hold a shutdown for
 * a timeout per batch). */
static void *exporter(void *arg)
{
    otlp *o = arg;
    for (int stopping = 0; !stopping;) {
        int n = take(o, &stopping);
        if (!n)
            continue;
        llm_strbuf body = {0};
        int ok = !encode_batch(o, o->batch, o->blen, n, &body) && post(o, o->h, &body);
        llm_strbuf_free(&body);
        for (int i = 0; i < n; i++) free(o->batch[i]);
        pthread_mutex_lock(&o->mu);
        *(ok ? &o->exported : &o->dropped) += (unsigned long long)n;
        pthread_mutex_unlock(&o->mu);
    }
    return NULL;
}

llm_status otlp_open(const otlp_config *cfg, otlp **out, llm_error *err)
{
    *out = NULL;
    if (!cfg->endpoint || strncmp(cfg->endpoint, "http", 4) || strlen(cfg->endpoint) >= 1024)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "the OTLP endpoint must be an http(s) URL under 1 KiB (got '%.80s')",
                        cfg->endpoint ? cfg->endpoint : "");
    if (!(cfg->ratio >= 0 && cfg->ratio <= 1))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "the trace sample ratio must be within 0..1");
    otlp *o = calloc(1, sizeof *o);
    if (!o)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the trace exporter");
    o->cfg = *cfg;
    o->cfg.queue_max = cfg->queue_max > 0 ? cfg->queue_max : 4096;
    o->cfg.timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 2;
    snprintf(o->endpoint, sizeof o->endpoint, "%s", cfg->endpoint);
    snprintf(o->service, sizeof o->service, "%s", cfg->service ? cfg->service : "llm");
    o->cfg.endpoint = o->endpoint, o->cfg.service = o->service;
    o->q = calloc((size_t)o->cfg.queue_max, sizeof *o->q);
    o->qlen = calloc((size_t)o->cfg.queue_max, sizeof *o->qlen);
    o->batch = calloc(BATCH_MAX, sizeof *o->batch);
    o->blen = calloc(BATCH_MAX, sizeof *o->blen);
    int mu = 0, cv = 0, rc = 0;
    llm_status st = LLM_OK;
    if (!o->q || !o->qlen || !o->batch || !o->blen)
        st = llm_errf(err, LLM_ERR_NOMEM, "no memory for the trace exporter's queue of %d spans", o->cfg.queue_max);
    else if (!(o->h = curl_easy_init()))
        st = llm_errf(err, LLM_ERR_INTERNAL, "the trace exporter: libcurl gave no handle");
    else if (!(mu = !pthread_mutex_init(&o->mu, NULL)) || !(cv = !llm_sync_cond_init(&o->wake)))
        st = llm_errf(err, LLM_ERR_INTERNAL, "the trace exporter: no mutex or condition variable");
    else if ((rc = pthread_create(&o->th, NULL, exporter, o)))
        st = llm_errf(err, LLM_ERR_INTERNAL, "the trace exporter's thread: %s", strerror(rc));
    if (st) {
        if (cv)
            pthread_cond_destroy(&o->wake);
        if (mu)
            pthread_mutex_destroy(&o->mu);
        if (o->h)
            curl_easy_cleanup(o->h);
        free(o->q), free(o->qlen), free(o->batch), free(o->blen), free(o);
        return st;
    }
    *out = o;
    return LLM_OK;
}

llm_status otlp_open_configured(const char *url, const char *service, double ratio, otlp **out, llm_error *err)
{
    char env[1024];
    *out = NULL;
    otlp_env_endpoint(env, sizeof env);
    otlp_config oc = {.endpoint = url && *url ? url : env, .service = service, .ratio = ratio};
    return *oc.endpoint ? otlp_open(&oc, out, err) : LLM_OK;
}

void otlp_close(otlp *o)
{
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    o->stop = 1;
    pthread_cond_signal(&o->wake);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->th, NULL);
    for (int i = 0; i < o->n; i++) free(o->q[(o->head + i) % o->cfg.queue_max]); /* (dropped) */
    pthread_cond_destroy(&o->wake);
    pthread_mutex_destroy(&o->mu);
    curl_easy_cleanup(o->h);
    free(o->q), free(o->qlen), free(o->batch), free(o->blen), free(o);
}

void otlp_metrics(otlp *o, llm_strbuf *out)
{
    unsigned long long sent, dropped;
    if (!o)
        return;
    otlp_stats(o, &sent, &dropped);
    llm_prom_counter(out, "llm_traces_exported_total", "Spans the trace collector took.", NULL, (double)sent);
    llm_prom_counter(out, "llm_traces_dropped_total",
                     "Spans dropped: the queue full, or their batch not taken (collector down or slow).", NULL,
                     (double)dropped);
}

void otlp_stats(otlp *o, unsigned long long *exported, unsigned long long *dropped)
{
    *exported = *dropped = 0;
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    *exported = o->exported, *dropped = o->dropped;
    pthread_mutex_unlock(&o->mu);
}
