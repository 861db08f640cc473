/* rt_pool.c - backends, breaker and choice; see rt_pool.h. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm/strbuf.h"
#include "rt_pool.h"
#include "llm/clock.h"
#include "llm/prom.h"

#define VNODES 64
#define TRUST_STEP 0.2 /* weight of the latest answer in a backend's trust */
#define N_BUCKETS RT_N_BUCKETS
#define bucket_le rt_pool_bucket_le /* (short, for the loops below) */
/* fine below 0.25 s, where time to first token and inter-token gaps live */
const double rt_pool_bucket_le[RT_N_BUCKETS] = {0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15,
                                           0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

int rt_pool_bucket(double seconds)
{
    int k = 0;
    while (k < N_BUCKETS && seconds > bucket_le[k]) k++;
    return k;
}

typedef struct revstats {
    unsigned long long codes[5], failed;
    uint64_t ttfb[N_BUCKETS + 1], itl[N_BUCKETS + 1];
    double ttfb_sum, itl_sum;
    unsigned long long ttfb_n, itl_n;
} revstats;

typedef struct backend {
    char url[256];
    char name[128];            /* for X-Backend: the pod's name, or the URL as given */
    int rev;                   /* 0 stable, 1 canary */
    int live;                  /* in the current set (slots are kept while requests use them) */
    int inflight;
    double waiting, running, kv; /* polled from its /metrics */
    unsigned int adapters[RT_POOL_MAX_ADAPTERS]; /* hashes of the LoRA adapters it has loaded (polled) */
    int n_adapters;
    char *adapter_names;       /* their names, NUL-separated (NULL: none, or no memory for them) */
    int failures;              /* consecutive */
    double ejected_until;      /* monotonic seconds; 0: closed */
    double busy_until;         /* answered 503 lately: others are picked first until then */
    int trial;                 /* the half-open trial request is out */
    int ejections;
    unsigned long long requests, failed, codes[5]; /* 2xx 3xx 4xx 5xx none */
    unsigned long long dropped;  /* connections it dropped after it had the request (not retried) */
    uint64_t hist[N_BUCKETS + 1];
    double sum;
    rt_prefix_index *ix;       /* cache-aware: the prefixes sent here (made at the first) */
    int cap;                   /* its capacity in links, from the pod's KV cache size (0: default) */
    double trust;              /* 0..1: how far its answers bore out the index (rt_pool.h) */
    double pending;            /* prompt bytes to compute for requests with no answer byte yet (cache-aware) */
    unsigned long long prompt_tokens, cached_tokens; /* as its answers' usage said */
    unsigned long long completion_tokens;
    double predicted_tokens;   /* what the index predicted of those */
    double prompt_counter;     /* its llm_prompt_tokens_total at the last poll (-1: none yet) */
} backend;

typedef struct vnode {
    unsigned int hash;
    int idx;
} vnode;

struct rt_pool {
    pthread_mutex_t mu;
    rt_pool_config c;
    backend *b;                /* cap slots (grown as backends come, at most RT_MAX_BACKENDS): a gateway holds
                                * a pool per deployment, most of them small */
    int n, cap;                /* slots used, allocated */
    unsigned int rr;
    vnode *ring;               /* VNODES per live backend */
    int n_ring, ring_cap;
    int weight;                /* canary share, 0..100 */
    int split;                 /* smooth counter of the split */
    revstats rs[2];
    unsigned int want;         /* during a pick: the adapter's hash the backend must have */
    int want_on;
    double mean_bytes;         /* cache-aware: recent requests' prompt bytes, averaged */
    double hold_s;             /* a gateway's route: how long a request waits while it has no backend */
    int held;                  /* requests waiting for a backend now */
    unsigned long long held_total;
};

/* FNV-1a, then a finaliser so nearby strings spread over the ring. */
static unsigned int hash32(const char *s, int salt)
{
    unsigned int h = 2166136261u ^ (unsigned int)salt * 16777619u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    return h;
}

static int cmp_vnode(const void *a, const void *b)
{
    unsigned int x = ((const vnode *)a)->hash, y = ((const vnode *)b)->hash;
    return x < y ? -1 : x > y;
}

/* Under mu. Without memory for a larger ring it stays empty: sessions
 * then go by the policy (no stickiness, no failure). */
static void build_ring(rt_pool *p)
{
    int want = 0;
    for (int i = 0; i < p->n; i++) want += p->b[i].live * VNODES;
    p->n_ring = 0;
    if (want > p->ring_cap) {
        vnode *r = realloc(p->ring, (size_t)want * sizeof *r);
        if (!r)
            return;
        p->ring = r, p->ring_cap = want;
    }
    for (int i = 0; i < p->n; i++)
        for (int v = 0; p->b[i].live && v < VNODES; v++)
            p->ring[p->n_ring++] = (vnode){hash32(p->b[i].url, v + 1), i};
    if (p->n_ring > 1) /* (no backend: the ring is NULL, and qsort's base must not be) */
        qsort(p->ring, (size_t)p->n_ring, sizeof *p->ring, cmp_vnode);
}

llm_status rt_pool_new(const rt_pool_config *c, rt_pool **out, llm_error *err)
{
    rt_pool *p = calloc(1, sizeof *p);
    if (!p)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the backend pool");
    p->c = *c;
    if (p->c.threshold < 1)
        p->c.threshold = 3;
    if (!(p->c.eject_s > 0))
        p->c.eject_s = 10;
    if (!(p->c.balance > 0))
        p->c.balance = 0.25;
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return LLM_OK;
}

void rt_pool_free(rt_pool *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++) {
        rt_prefix_index_free(p->b[i].ix);
        free(p->b[i].adapter_names);
    }
    free(p->b);
    free(p->ring);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* The URL of entry e ("NAME=URL" or "URL"): e past "NAME=" when what
 * follows is an http(s) URL; the name (NAME, else the URL) into name. */
static const char *entry_url(const char *e, char *name, size_t n)
{
    const char *eq = strchr(e, '=');
    const char *url = eq && (!strncmp(eq + 1, "http://", 7) || !strncmp(eq + 1, "https://", 8)) ? eq + 1 : e;
    snprintf(name, n, "%.*s", (int)(url == e ? strlen(e) : (size_t)(eq - e)), e);
    for (char *c = name; *c; c++) /* it goes into headers and label values: no quote, backslash or control */
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:/-[]", *c))
            *c = '_';
    return url;
}

/* Room for more backends: twice the slots (at most RT_MAX_BACKENDS). 0, or
 * -1 without memory. Under mu (indexes stay valid: they are indexes). */
static int grow(rt_pool *p)
{
    int cap = p->cap ? 2 * p->cap : 4;
    cap = cap > RT_MAX_BACKENDS ? RT_MAX_BACKENDS : cap;
    backend *b = realloc(p->b, (size_t)cap * sizeof *b);
    if (!b)
        return -1;
    p->b = b, p->cap = cap;
    return 0;
}

llm_status rt_pool_set(rt_pool *p, int rev, const char *const *urls, int n, llm_error *err)
{
    char name[128];
    rev = rev ? 1 : 0;
    pthread_mutex_lock(&p->mu);
    /* first those that stay (they keep their breaker and load state)... */
    for (int i = 0; i < p->n; i++) {
        if (p->b[i].rev != rev)
            continue;
        p->b[i].live = 0;
        for (int u = 0; u < n && !p->b[i].live; u++)
            if ((p->b[i].live = !strcmp(p->b[i].url, entry_url(urls[u], name, sizeof name))))
                snprintf(p->b[i].name, sizeof p->b[i].name, "%s", name);
    }
    /* ...then the new ones, in slots no request uses any more */
    llm_status st = LLM_OK;
    for (int u = 0; u < n && !st; u++) {
        int i = 0, slot = -1;
        const char *url = entry_url(urls[u], name, sizeof name);
        while (i < p->n && !(p->b[i].live && p->b[i].rev == rev && !strcmp(p->b[i].url, url))) i++;
        if (i < p->n)
            continue;
        for (int j = 0; j < p->n && slot < 0; j++)
            if (!p->b[j].live && !p->b[j].inflight)
                slot = j;
        if (slot < 0 && p->n == RT_MAX_BACKENDS) {
            st = llm_errf(err, LLM_ERR_TOO_LONG, "more than %d backends", RT_MAX_BACKENDS);
            break;
        }
        if (slot < 0 && p->n == p->cap && grow(p)) {
            st = llm_errf(err, LLM_ERR_NOMEM, "no memory for %d backends", p->n + 1);
            break;
        }
        if (slot < 0)
            p->b[slot = p->n++] = (backend){0}; /* a new slot: its memory is fresh from realloc */
        rt_prefix_index_free(p->b[slot].ix);
        free(p->b[slot].adapter_names);
        memset(&p->b[slot], 0, sizeof p->b[slot]);
        p->b[slot].trust = 1;
        p->b[slot].prompt_counter = -1;
        snprintf(p->b[slot].url, sizeof p->b[slot].url, "%s", url);
        snprintf(p->b[slot].name, sizeof p->b[slot].name, "%s", name);
        p->b[slot].rev = rev;
        p->b[slot].live = 1;
    }
    build_ring(p);
    pthread_mutex_unlock(&p->mu);
    return st;
}

void rt_pool_set_weight(rt_pool *p, int weight)
{
    pthread_mutex_lock(&p->mu);
    p->weight = weight < 0 ? 0 : weight > 100 ? 100 : weight;
    pthread_mutex_unlock(&p->mu);
}

int rt_pool_weight(rt_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int w = p->weight;
    pthread_mutex_unlock(&p->mu);
    return w;
}

void rt_pool_set_hold(rt_pool *p, double seconds)
{
    pthread_mutex_lock(&p->mu);
    p->hold_s = seconds;
    pthread_mutex_unlock(&p->mu);
}

double rt_pool_hold(rt_pool *p)
{
    pthread_mutex_lock(&p->mu);
    double h = p->hold_s;
    pthread_mutex_unlock(&p->mu);
    return h;
}

int rt_pool_held(rt_pool *p, int delta)
{
    pthread_mutex_lock(&p->mu);
    p->held += delta;
    if (delta > 0)
        p->held_total += (unsigned long long)delta;
    int now = p->held;
    pthread_mutex_unlock(&p->mu);
    return now;
}

int rt_pool_size(rt_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int n = 0;
    for (int i = 0; i < p->n; i++) n += p->b[i].live;
    pthread_mutex_unlock(&p->mu);
    return n;
}

static const char *const policy_names[] = {"least-loaded", "round-robin", "prefix-hash", "cache-aware"};

const char *rt_policy_name(rt_policy p)
{
    return (unsigned)p < sizeof policy_names / sizeof *policy_names ? policy_names[p] : "?";
}

int rt_policy_of(const char *name)
{
    for (int k = 0; k < (int)(sizeof policy_names / sizeof *policy_names); k++)
        if (name && !strcmp(name, policy_names[k]))
            return k;
    return -1;
}

/* A backend's load as the choice sees it. Under mu. */
static double load_of(const backend *b) { return b->inflight + b->waiting; }

/* Usable now: live, not avoided, breaker closed or half-open with no
 * trial out. Under mu. */
/* Backend b lists the adapter of hash h. */
static int has_adapter(const backend *b, unsigned int h)
{
    for (int k = 0; k < b->n_adapters; k++)
        if (b->adapters[k] == h)
            return 1;
    return 0;
}

static int usable(rt_pool *p, int i, int rev, const unsigned char *avoid, double now)
{
    backend *b = &p->b[i];
    if (!b->live || b->rev != rev || (avoid && (avoid[i / 8] >> (i % 8) & 1)) || b->busy_until > now ||
        (p->want_on && !has_adapter(b, p->want)))
        return 0;
    if (b->ejected_until == 0)
        return 1;
    return b->ejected_until <= now && !b->trial;
}

static int least_loaded(rt_pool *p, int rev, const unsigned char *avoid, double now)
{
    int best = -1;
    double best_load = 0, best_run = 0;
    for (int k = 0; k < p->n; k++) {
        int i = (int)((p->rr + (unsigned)k) % (unsigned)p->n); /* rotating start: ties spread */
        if (!usable(p, i, rev, avoid, now))
            continue;
        double load = load_of(&p->b[i]), run = p->b[i].running;
        if (best < 0 || load < best_load || (load == best_load && run < best_run)) {
            best = i;
            best_load = load;
            best_run = run;
        }
    }
    p->rr++;
    return best;
}

static int round_robin(rt_pool *p, int rev, const unsigned char *avoid, double now)
{
    for (int k = 0; k < p->n; k++) {
        int i = (int)(p->rr++ % (unsigned)p->n);
        if (usable(p, i, rev, avoid, now))
            return i;
    }
    return -1;
}

/* Consistent hashing with bounded loads (Mirrokni et al.): a session's
 * backend takes it while its load is below SESSION_SPREAD times the
 * average (this request counted) plus SESSION_SLACK, so a session stays
 * put until its backend is well above the others, then moves along the
 * ring; the slack keeps one request's difference from moving sessions
 * when everything is nearly idle. */
#define SESSION_SPREAD 1.25
#define SESSION_SLACK 1.0

static double session_bound(rt_pool *p, int rev, const unsigned char *avoid, double now)
{
    double total = 1;
    int n = 0;
    for (int i = 0; i < p->n; i++)
        if (usable(p, i, rev, avoid, now)) {
            total += load_of(&p->b[i]);
            n++;
        }
    return n ? SESSION_SPREAD * total / n + SESSION_SLACK : 0;
}

static int by_session(rt_pool *p, const char *session, int rev, const unsigned char *avoid, double now)
{
    if (!p->n_ring)
        return -1;
    double bound = session_bound(p, rev, avoid, now);
    int first = -1;
    unsigned int h = hash32(session, 0);
    int lo = 0, hi = p->n_ring;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (p->ring[mid].hash < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int k = 0; k < p->n_ring; k++) {
        int i = p->ring[(lo + k) % p->n_ring].idx;
        if (!usable(p, i, rev, avoid, now))
            continue;
        if (load_of(&p->b[i]) < bound)
            return i;
        if (first < 0)
            first = i;
    }
    return first;
}

/* Under mu: narrows the pick to backends with adapter model when a live
 * one lists it. */
static void want_model(rt_pool *p, const char *model)
{
    p->want_on = 0;
    if (!model || !*model)
        return;
    unsigned int h = hash32(model, 31);
    for (int i = 0; i < p->n && !p->want_on; i++)
        if (p->b[i].live && has_adapter(&p->b[i], h))
            p->want = h, p->want_on = 1;
}

/* The bytes of chain ch (NULL: none) that m links held cover. */
static double held_bytes(const rt_prefix_chain *ch, int m)
{
    double bytes = ch ? (double)ch->bytes : 0, have = (double)m * RT_PREFIX_CHUNK;
    return have < bytes ? have : bytes;
}

/* The prompt bytes backend b would compute of chain ch (NULL: none),
 * holding m of its links. Under mu. */
static double to_compute(const backend *b, const rt_prefix_chain *ch, int m)
{
    return (ch ? (double)ch->bytes : 0) - b->trust * held_bytes(ch, m);
}

/* Cache-aware (rt_pool.h): the lowest load * unit + the bytes it is still
 * computing + the prompt bytes it does not hold, ties to fewer running,
 * then round robin; *held gets the chosen backend's links held. Under mu. */
static int cache_aware(rt_pool *p, int rev, const rt_request *q, double now, int *held)
{
    const rt_prefix_chain *ch = q->chain;
    double unit = p->c.balance * p->mean_bytes, best_cost = 0, best_run = 0;
    int best = -1;
    for (int k = 0; k < p->n; k++) {
        int i = (int)((p->rr + (unsigned)k) % (unsigned)p->n);
        if (!usable(p, i, rev, q->avoid, now))
            continue;
        backend *b = &p->b[i];
        int m = ch && b->ix ? rt_prefix_match(b->ix, ch->link, ch->n) : 0;
        double cost = unit * load_of(b) + b->pending + to_compute(b, ch, m);
        if (best < 0 || cost < best_cost || (cost == best_cost && b->running < best_run)) {
            best = i, best_cost = cost, best_run = b->running;
            *held = m;
        }
    }
    p->rr++;
    return best;
}

/* The chain as sent to backend i: into its index (made at the first; a
 * failed allocation leaves the index as it was: a missed hit, no more).
 * Under mu. */
static void sent_chain(rt_pool *p, backend *b, const rt_prefix_chain *ch)
{
    /* the mean prompt, for the worth of a queued request; a floor of one
     * chunk keeps the load in the cost when prompts are short */
    double bytes = ch->bytes < RT_PREFIX_CHUNK ? RT_PREFIX_CHUNK : (double)ch->bytes;
    p->mean_bytes = p->mean_bytes > 0 ? 0.95 * p->mean_bytes + 0.05 * bytes : bytes;
    if (!ch->n)
        return;
    llm_error err = {0};
    if (!b->ix && rt_prefix_index_new(b->cap ? b->cap : RT_PREFIX_DEFAULT_CAP, &b->ix, &err))
        return;
    rt_prefix_insert(b->ix, ch->link, ch->n);
}

/* The revision of a request: a retry goes to stable first and leaves the
 * split's counter alone; a session keeps its revision. Under mu. */
static int revision_of(rt_pool *p, const rt_request *q)
{
    for (int k = 0; q->avoid && k < RT_MAX_BACKENDS / 8; k++)
        if (q->avoid[k])
            return 0;
    if (q->session && *q->session)
        return (int)(hash32(q->session, 977) % 100) < p->weight;
    p->split += p->weight; /* smooth: exactly weight of every 100 requests */
    if (p->split < 100)
        return 0;
    p->split -= 100;
    return 1;
}

int rt_pool_pick(rt_pool *p, const rt_request *q, char *url, size_t un, rt_pick *out)
{
    double pending = 0;
    pthread_mutex_lock(&p->mu);
    double now = llm_clock_mono_s();
    want_model(p, q->model);
    int has_session = q->session && *q->session, rev = revision_of(p, q), i = -1, held = 0;
    for (int k = 0; k < 2 && i < 0; k++, rev = !rev) /* the other revision when this one has no backend */
        i = has_session ? by_session(p, q->session, rev, q->avoid, now)
            : p->c.policy == RT_ROUND_ROBIN ? round_robin(p, rev, q->avoid, now)
            : p->c.policy == RT_CACHE_AWARE ? cache_aware(p, rev, q, now, &held)
                                            : least_loaded(p, rev, q->avoid, now);
    if (i >= 0) {
        backend *b = &p->b[i];
        b->inflight++;
        if (b->ejected_until != 0)
            b->trial = 1; /* half open: this request decides */
        snprintf(url, un, "%s", b->url);
        if (p->c.policy == RT_CACHE_AWARE && q->chain) {
            if (has_session && b->ix) /* a session chose: what this backend holds of the prompt still counts */
                held = rt_prefix_match(b->ix, q->chain->link, q->chain->n);
            pending = q->streamed ? to_compute(b, q->chain, held) : 0;
            b->pending += pending = pending < RT_POOL_PENDING_MAX ? pending : RT_POOL_PENDING_MAX;
            sent_chain(p, b, q->chain);
        }
    }
    if (out) {
        double bytes = q->chain ? (double)q->chain->bytes : 0;
        out->predicted = bytes > 0 ? held_bytes(q->chain, held) / bytes : 0;
        out->pending = pending;
    }
    p->want_on = 0;
    pthread_mutex_unlock(&p->mu);
    return i;
}

void rt_pool_report_cache(rt_pool *p, int idx, double kv_tokens, double prompt_total)
{
    pthread_mutex_lock(&p->mu);
    if (idx >= 0 && idx < p->n && prompt_total >= 0) {
        backend *b = &p->b[idx];
        if (b->prompt_counter >= 0 && prompt_total < b->prompt_counter && b->ix) { /* a counter that went back: the pod
                                                                                    * restarted, its cache is empty */
            rt_prefix_index_clear(b->ix);
            b->trust = 1;
        }
        b->prompt_counter = prompt_total;
    }
    if (idx >= 0 && idx < p->n && kv_tokens > 0) {
        backend *b = &p->b[idx];
        /* about RT_PREFIX_BYTES_PER_TOKEN bytes of request text per token */
        double links = kv_tokens * RT_PREFIX_BYTES_PER_TOKEN / RT_PREFIX_CHUNK;
        b->cap = links > RT_PREFIX_MAX_CAP ? RT_PREFIX_MAX_CAP : links < RT_PREFIX_MIN_CAP ? RT_PREFIX_MIN_CAP : (int)links;
        if (b->ix)
            rt_prefix_index_set_cap(b->ix, b->cap);
    }
    pthread_mutex_unlock(&p->mu);
}

void rt_pool_report_adapters(rt_pool *p, int idx, const char *const *names, const size_t *lens, int n)
{
    pthread_mutex_lock(&p->mu);
    if (idx >= 0 && idx < p->n) {
        backend *b = &p->b[idx];
        b->n_adapters = 0;
        free(b->adapter_names);
        b->adapter_names = calloc((size_t)(n < RT_POOL_MAX_ADAPTERS ? n : RT_POOL_MAX_ADAPTERS), 256);
        for (size_t k = 0, at = 0; k < (size_t)n && b->n_adapters < RT_POOL_MAX_ADAPTERS; k++) {
            char name[256];
            int len = snprintf(name, sizeof name, "%.*s", (int)(lens[k] < 255 ? lens[k] : 255), names[k]);
            b->adapters[b->n_adapters++] = hash32(name, 31);
            if (b->adapter_names)
                memcpy(b->adapter_names + at, name, (size_t)len + 1), at += (size_t)len + 1;
        }
    }
    pthread_mutex_unlock(&p->mu);
}

void rt_pool_adapters(rt_pool *p, void (*fn)(void *ctx, const char *name), void *ctx)
{
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n; i++) {
        const backend *b = &p->b[i];
        const char *at = b->adapter_names;
        for (int k = 0; b->live && at && k < b->n_adapters; k++, at += strlen(at) + 1) fn(ctx, at);
    }
    pthread_mutex_unlock(&p->mu);
}

int rt_pool_has_adapter(rt_pool *p, const char *model)
{
    unsigned int h = hash32(model, 31);
    int found = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n && !found; i++) found = p->b[i].live && has_adapter(&p->b[i], h);
    pthread_mutex_unlock(&p->mu);
    return found;
}

/* A failure toward the breaker. Under mu. */
static void failed(rt_pool *p, backend *b, double now)
{
    b->failures++;
    if (b->trial || b->failures >= p->c.threshold) {
        if (b->ejected_until == 0 || b->trial)
            b->ejections++;
        b->ejected_until = now + p->c.eject_s;
    }
    b->trial = 0;
}

/* What the answer's usage says of the index's prediction (rt_pool.h:
 * trust). Under mu. */
static void learn(backend *b, const rt_result *res)
{
    if (res->completion_tokens > 0)
        b->completion_tokens += (unsigned long long)res->completion_tokens;
    if (res->prompt_tokens <= 0 || res->cached_tokens < 0)
        return;
    double cached = res->cached_tokens < res->prompt_tokens ? res->cached_tokens : res->prompt_tokens;
    b->prompt_tokens += (unsigned long long)res->prompt_tokens;
    b->cached_tokens += (unsigned long long)cached;
    b->predicted_tokens += res->predicted * res->prompt_tokens;
    if (res->predicted > 0) {
        double seen = cached / res->prompt_tokens / res->predicted;
        b->trust += TRUST_STEP * ((seen < 1 ? seen : 1) - b->trust);
    }
}

/* Backend b computes pending fewer bytes. Under mu. */
static void computed(backend *b, double pending)
{
    b->pending -= pending;
    LLM_ASSERT(b->pending > -1); /* given back twice: a bug (each pick's bytes go back once) */
    if (b->pending < 1 || b->inflight <= 0) /* (sums of doubles: what is left when none is pending is rounding) */
        b->pending = 0;
}

void rt_pool_started(rt_pool *p, int idx, double pending)
{
    pthread_mutex_lock(&p->mu);
    if (idx >= 0 && idx < p->n)
        computed(&p->b[idx], pending);
    pthread_mutex_unlock(&p->mu);
}

void rt_pool_release(rt_pool *p, int idx, const rt_result *res)
{
    pthread_mutex_lock(&p->mu);
    if (idx < 0 || idx >= p->n) {
        pthread_mutex_unlock(&p->mu);
        return;
    }
    backend *b = &p->b[idx];
    double now = llm_clock_mono_s();
    b->inflight--;
    computed(b, res->pending);
    int cls = res->status >= 200 && res->status < 600 ? res->status / 100 - 2 : 4;
    b->requests++;
    b->dropped += res->dropped != 0;
    b->codes[cls]++;
    b->hist[rt_pool_bucket(res->seconds)]++;
    b->sum += res->seconds;
    revstats *r = &p->rs[b->rev];
    r->codes[cls]++;
    r->failed += !res->ok && !res->busy;
    if (res->ttfb >= 0) {
        r->ttfb[rt_pool_bucket(res->ttfb)]++;
        r->ttfb_sum += res->ttfb;
        r->ttfb_n++;
    }
    for (int k = 0; k <= N_BUCKETS; k++) r->itl[k] += res->itl[k];
    r->itl_sum += res->itl_sum;
    r->itl_n += res->itl_n;
    learn(b, res);
    if (res->busy) { /* the breaker is told nothing; picks pass it by for a second */
        b->busy_until = now + 1.0;
    } else if (res->ok) {
        b->failures = 0;
        b->ejected_until = 0;
        b->trial = 0;
    } else {
        b->failed++;
        failed(p, b, now);
    }
    pthread_mutex_unlock(&p->mu);
}

int rt_pool_revision(rt_pool *p, int idx)
{
    pthread_mutex_lock(&p->mu);
    int rev = idx >= 0 && idx < p->n ? p->b[idx].rev : 0;
    pthread_mutex_unlock(&p->mu);
    return rev;
}

/* A load figure a pod reported: 0 .. RT_POOL_MAX_LOAD, 0 for NaN. */
static double clamp_load(double v)
{
    return v > 0 ? (v < RT_POOL_MAX_LOAD ? v : RT_POOL_MAX_LOAD) : 0;
}

void rt_pool_report(rt_pool *p, int idx, int reachable, double waiting, double running, double kv_usage)
{
    pthread_mutex_lock(&p->mu);
    if (idx < 0 || idx >= p->n) {
        pthread_mutex_unlock(&p->mu);
        return;
    }
    backend *b = &p->b[idx];
    if (reachable) { /* a pod's own word: held to what a pod can hold (a pod saying -1e9 would draw every request) */
        b->waiting = clamp_load(waiting);
        b->running = clamp_load(running);
        b->kv = kv_usage >= 0 && kv_usage <= 1 ? kv_usage : kv_usage > 1 ? 1 : 0;
    } else if (b->live && b->ejected_until <= llm_clock_mono_s()) {
        b->trial = 0;
        failed(p, b, llm_clock_mono_s()); /* a dead backend is ejected before a request finds it */
    }
    pthread_mutex_unlock(&p->mu);
}

int rt_pool_name(rt_pool *p, int idx, char *name, size_t n)
{
    pthread_mutex_lock(&p->mu);
    int ok = idx >= 0 && idx < p->n;
    if (ok)
        snprintf(name, n, "%s", p->b[idx].name);
    pthread_mutex_unlock(&p->mu);
    return ok;
}

int rt_pool_url(rt_pool *p, int idx, char *url, size_t un)
{
    pthread_mutex_lock(&p->mu);
    int ok = idx >= 0 && idx < p->n && p->b[idx].live;
    if (ok)
        snprintf(url, un, "%s", p->b[idx].url);
    pthread_mutex_unlock(&p->mu);
    return ok;
}

/* ---- metrics ------------------------------------------------------------------- */

/* Observations in all of a histogram's buckets, the overflow's included. */
static uint64_t hist_count(const uint64_t *h)
{
    uint64_t n = 0;
    for (int k = 0; k <= N_BUCKETS; k++) n += h[k];
    return n;
}

/* The pools of one /metrics answer: each labelled route="NAME" when
 * names is set (a gateway), else unlabelled (one pool). */
typedef struct pools {
    rt_pool *const *p;
    const char *const *names;
    int n;
} pools;

/* Labels of pool k's samples: its route (gateway), then key=val pairs
 * (NULL-terminated). NULL without memory. */
static const char *labels(llm_strbuf *lab, const pools *ps, int k, ...)
{
    va_list ap;
    va_start(ap, k);
    if (ps->names)
        llm_prom_label(lab, "route", ps->names[k]);
    for (const char *key; (key = va_arg(ap, const char *));) llm_prom_label(lab, key, va_arg(ap, const char *));
    va_end(ap);
    return lab->failed ? NULL : lab->p ? lab->p : "";
}

/* One per-revision histogram: time to first byte (itl 0) or between
 * chunks (itl 1). */
static void rev_histogram(llm_strbuf *t, const pools *ps, const char *name, const char *help, int itl)
{
    static const char *const revname[2] = {"stable", "canary"};
    llm_prom_head(t, name, "histogram", help);
    for (int k = 0; k < ps->n; k++) {
        rt_pool *p = ps->p[k];
        pthread_mutex_lock(&p->mu);
        for (int r = 0; r < 2; r++) {
            const uint64_t *h = itl ? p->rs[r].itl : p->rs[r].ttfb;
            llm_strbuf lab = {0};
            const char *l = labels(&lab, ps, k, "revision", revname[r], NULL);
            if (l)
                llm_prom_hist_series(t, name, l, bucket_le, N_BUCKETS, h, hist_count(h),
                                     itl ? p->rs[r].itl_sum : p->rs[r].ttfb_sum);
            llm_strbuf_free(&lab);
        }
        pthread_mutex_unlock(&p->mu);
    }
}

/* A family with one sample per live backend, labelled by its name. */
static void per_backend(llm_strbuf *t, const pools *ps, const char *name, const char *type, const char *help,
                        double (*value)(const backend *b, double now), double now)
{
    llm_prom_head(t, name, type, help);
    for (int k = 0; k < ps->n; k++) {
        rt_pool *p = ps->p[k];
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < p->n; i++) {
            if (!p->b[i].live)
                continue;
            llm_strbuf lab = {0};
            const char *l = labels(&lab, ps, k, "backend", p->b[i].name, NULL);
            if (l)
                llm_prom_sample(t, name, l, value(&p->b[i], now));
            t->failed |= !l; /* a sample without its labels would pass for another series */
            llm_strbuf_free(&lab);
        }
        pthread_mutex_unlock(&p->mu);
    }
}

static double v_failed(const backend *b, double now) { (void)now; return (double)b->failed; }
static double v_dropped(const backend *b, double now) { (void)now; return (double)b->dropped; }
static double v_ejections(const backend *b, double now) { (void)now; return b->ejections; }
static double v_up(const backend *b, double now) { return b->ejected_until == 0 || b->ejected_until <= now; }
static double v_inflight(const backend *b, double now) { (void)now; return b->inflight; }
static double v_trust(const backend *b, double now) { (void)now; return b->trust; }
static double v_links(const backend *b, double now) { (void)now; return b->ix ? rt_prefix_index_size(b->ix) : 0; }
static double v_pending(const backend *b, double now) { (void)now; return b->pending; }
static double v_prompt(const backend *b, double now) { (void)now; return (double)b->prompt_tokens; }
static double v_cached(const backend *b, double now) { (void)now; return (double)b->cached_tokens; }
static double v_completion(const backend *b, double now) { (void)now; return (double)b->completion_tokens; }
static double v_predicted(const backend *b, double now) { (void)now; return b->predicted_tokens; }

static void requests_by_code(llm_strbuf *out, const pools *ps)
{
    static const char *const code[5] = {"2xx", "3xx", "4xx", "5xx", "none"};
    static const char *const revname[2] = {"stable", "canary"};
    llm_prom_head(out, "llm_router_requests_total", "counter", "Requests proxied, by backend and status class.");
    for (int k = 0; k < ps->n; k++) {
        rt_pool *p = ps->p[k];
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < p->n; i++)
            for (int c = 0; p->b[i].live && c < 5; c++) {
                llm_strbuf lab = {0};
                const char *l = labels(&lab, ps, k, "backend", p->b[i].name, "code", code[c], NULL);
                if (l)
                    llm_prom_sample(out, "llm_router_requests_total", l, (double)p->b[i].codes[c]);
                out->failed |= !l;
                llm_strbuf_free(&lab);
            }
        pthread_mutex_unlock(&p->mu);
    }
    llm_prom_head(out, "llm_router_revision_requests_total", "counter", "Requests by revision and status class.");
    for (int k = 0; k < ps->n; k++) {
        rt_pool *p = ps->p[k];
        pthread_mutex_lock(&p->mu);
        for (int r = 0; r < 2; r++)
            for (int c = 0; c < 5; c++) {
                llm_strbuf lab = {0};
                const char *l = labels(&lab, ps, k, "revision", revname[r], "code", code[c], NULL);
                if (l)
                    llm_prom_sample(out, "llm_router_revision_requests_total", l, (double)p->rs[r].codes[c]);
                out->failed |= !l;
                llm_strbuf_free(&lab);
            }
        pthread_mutex_unlock(&p->mu);
    }
}

static void durations_and_weights(llm_strbuf *out, const pools *ps)
{
    llm_prom_head(out, "llm_router_request_duration_seconds", "histogram", "Time from pick to the last byte, by backend.");
    for (int k = 0; k < ps->n; k++) {
        rt_pool *p = ps->p[k];
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < p->n; i++) {
            backend *b = &p->b[i];
            llm_strbuf lab = {0};
            const char *l = b->live ? labels(&lab, ps, k, "backend", b->name, NULL) : NULL;
            if (l)
                llm_prom_hist_series(out, "llm_router_request_duration_seconds", l, bucket_le, N_BUCKETS, b->hist,
                                     hist_count(b->hist), b->sum);
            llm_strbuf_free(&lab);
        }
        pthread_mutex_unlock(&p->mu);
    }
    llm_prom_head(out, "llm_router_canary_weight", "gauge", "Percent of requests sent to the canary revision.");
    for (int k = 0; k < ps->n; k++) {
        llm_strbuf lab = {0};
        const char *l = labels(&lab, ps, k, NULL);
        if (l)
            llm_prom_sample(out, "llm_router_canary_weight", l, rt_pool_weight(ps->p[k]));
        out->failed |= !l;
        llm_strbuf_free(&lab);
    }
}

/* A gateway's requests held per route (scale from zero: llm-controller
 * wakes the route's deployment from them). */
static void held_by_route(llm_strbuf *out, const pools *ps)
{
    static const char *const name[2] = {"llm_router_route_held_requests", "llm_router_route_held_total"};
    static const char *const help[2] = {"Requests waiting for the route's first backend (scale from zero).",
                                        "Requests that waited for the route's first backend."};
    for (int m = 0; m < 2; m++) {
        llm_prom_head(out, name[m], m ? "counter" : "gauge", help[m]);
        for (int k = 0; k < ps->n; k++) {
            llm_strbuf lab = {0};
            const char *l = labels(&lab, ps, k, NULL);
            pthread_mutex_lock(&ps->p[k]->mu);
            double v = m ? (double)ps->p[k]->held_total : ps->p[k]->held;
            pthread_mutex_unlock(&ps->p[k]->mu);
            if (l)
                llm_prom_sample(out, name[m], l, v);
            out->failed |= !l;
            llm_strbuf_free(&lab);
        }
    }
}

void rt_pool_metrics(rt_pool *const *p, const char *const *routes, int n, llm_strbuf *out)
{
    pools ps = {p, routes, n};
    double now = llm_clock_mono_s();
    requests_by_code(out, &ps);
    per_backend(out, &ps, "llm_router_backend_failures_total", "counter",
                "Attempts that failed (no connection, dropped, or a 5xx other than 503 and 504 before any byte).", v_failed, now);
    per_backend(out, &ps, "llm_router_backend_dropped_total", "counter",
                "Attempts the backend dropped after it had the request (answered 502, not retried elsewhere).", v_dropped, now);
    per_backend(out, &ps, "llm_router_backend_ejections_total", "counter", "Times the circuit breaker ejected the backend.",
                v_ejections, now);
    per_backend(out, &ps, "llm_router_backend_up", "gauge", "1 when the breaker lets requests through.", v_up, now);
    per_backend(out, &ps, "llm_router_backend_inflight", "gauge", "Requests the router has in flight to the backend.",
                v_inflight, now);
    per_backend(out, &ps, "llm_router_backend_prompt_tokens_total", "counter",
                "Prompt tokens of the answers that said their usage.", v_prompt, now);
    per_backend(out, &ps, "llm_router_backend_cached_tokens_total", "counter",
                "Of those, the tokens the backend said it had cached (usage.prompt_tokens_details.cached_tokens).",
                v_cached, now);
    per_backend(out, &ps, "llm_router_backend_completion_tokens_total", "counter",
                "Generated tokens of the answers that said their usage.", v_completion, now);
    per_backend(out, &ps, "llm_router_backend_predicted_cached_tokens_total", "counter",
                "Of those, the tokens the router's prefix index expected cached (cache-aware).", v_predicted, now);
    per_backend(out, &ps, "llm_router_backend_cache_trust", "gauge",
                "How far the backend's answers bore out the router's prefix index (0..1).", v_trust, now);
    per_backend(out, &ps, "llm_router_backend_prefix_links", "gauge",
                "Prompt chunks of 256 bytes the router's prefix index holds for the backend.", v_links, now);
    per_backend(out, &ps, "llm_router_backend_pending_prompt_bytes", "gauge",
                "Prompt bytes the backend is believed to compute for requests with no answer byte yet (cache-aware).",
                v_pending, now);
    durations_and_weights(out, &ps);
    if (routes)
        held_by_route(out, &ps);
    rev_histogram(out, &ps, "llm_router_revision_ttfb_seconds",
                  "Time to the first byte of the answer (first token of a stream), by revision.", 0);
    rev_histogram(out, &ps, "llm_router_revision_itl_seconds",
                  "Gaps between successive chunks of a stream (inter-token latency), by revision.", 1);
}
