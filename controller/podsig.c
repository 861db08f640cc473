/* podsig.c - the pods' signals, read by one thread in rounds; see podsig.h. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl_obs.h"
#include "desired.h"
#include "http_get.h"
#include "kube_client.h"
#include "podsig.h"
#include "reconcile.h"

#define KEY_MAX 320
#define PODS_PER_LLMD 1024 /* pages per LLMDeployment and kind in one round */
#define DIAG_PODS 64       /* /startupz per instance: enough to say why */
#define ROUND_PAGES 4096
#define PAGE_MAX (512u << 10)
#define ROUND_BYTES (16u << 20)
#define LIST_TIMEOUT_MS 10000
#define MIN_GAP_S 0.25
#define APP_NAME "app.kubernetes.io/name"     /* between rounds, however often new needs wake the thread */

typedef struct target {
    char key[KEY_MAX];
    podsig_need need;
    podsig_reading r;
    double done_at;        /* monotonic end of the round r came from; 0: none */
} target;

struct podsig {
    kube_config *cfg;
    char ns[256];
    void (*beat)(void);
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    int started, stopping, wake;
    atomic_int cancel;     /* ends the list request in flight at podsig_free */
    target *t;             /* n of them; index: key -> position */
    size_t n, cap;
    json_t *index;
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static json_t *get2(json_t *o, const char *a, const char *b)
{
    return json_object_get(json_object_get(o, a), b);
}

static int need_empty(const podsig_need *n)
{
    return !n->metric[0] && !n->activity && !n->canary && !n->diag;
}

/* The same reading serves both (every_s aside). */
static int need_same(const podsig_need *a, const podsig_need *b)
{
    return a->port == b->port && !strcmp(a->metric, b->metric) && a->activity == b->activity && a->canary == b->canary &&
           a->diag == b->diag;
}

/* ---- pages -> readings (pure) ---------------------------------------------------------- */

void podsig_add_server_page(podsig_reading *r, const char *text)
{
    int found = 0;
    if (r->need.metric[0]) {
        double v = as_prom_value(text, as_metric_name(r->need.metric), &found);
        if (found) {
            r->signal += v;
            r->signal_pods++;
        }
    }
    if (r->need.canary == 2 && strstr(text, "revision_requests_total{")) {
        cn_sample_add(&r->canary, text);
        r->canary_pods++;
    }
}

void podsig_add_router_page(podsig_reading *r, const char *text)
{
    if (r->need.activity) {
        int f1 = 0, f2 = 0, f3 = 0;
        as_activity *a = &r->activity;
        a->held += as_prom_value(text, "llm_router_held_requests", &f1);
        a->requests += as_prom_value(text, "llm_router_revision_requests_total", &f2) +
                       as_prom_value(text, "llm_router_held_total", &f3);
        a->inflight += as_prom_value(text, "llm_router_backend_inflight", &f3);
        a->routers += f1 && f2;
    }
    if (r->need.canary == 1 && strstr(text, "revision_requests_total{")) {
        cn_sample_add(&r->canary, text);
        r->canary_pods++;
    }
}

/* ---- one round -------------------------------------------------------------------------- */

enum { K_SERVER, K_ROUTER, K_CANARY, K_KINDS }; /* a pod's part: NAME, NAME-router, NAME-canary */
enum { P_METRICS, P_STARTUPZ };

typedef struct snap {          /* a target as the round saw it */
    char key[KEY_MAX];
    podsig_need need;
    podsig_reading r;
    json_t *pods[K_KINDS];     /* for the diagnosis (NAME, NAME-canary) */
    json_t *startupz[K_KINDS]; /* pod name -> parsed body */
    int pages[K_KINDS][2];     /* pages asked, per kind and page */
} snap;

typedef struct page {
    size_t snap;
    int kind, what;
    const char *pod;           /* the pod's name (borrowed from the list) */
    char url[128];
} page;

typedef struct round {
    snap *s;
    size_t n;
    json_t *by_instance;       /* "ns/instance" -> [snap index, kind] */
    page *p;
    size_t np;
    int share;                 /* metrics pages per LLMDeployment and kind: the round's pages shared out */
} round;

static int pod_ready(json_t *pod)
{
    json_t *cs = get2(pod, "status", "conditions");
    for (size_t i = 0; i < json_array_size(cs); i++) {
        json_t *c = json_array_get(cs, i);
        const char *t = json_string_value(json_object_get(c, "type"));
        const char *st = json_string_value(json_object_get(c, "status"));
        if (t && st && !strcmp(t, "Ready"))
            return !strcmp(st, "True");
    }
    return 0;
}

/* The instances of every target: NAME, NAME-router, NAME-canary. */
static int index_instances(round *rd)
{
    if (!(rd->by_instance = json_object()))
        return -1;
    static const char *const suffix[K_KINDS] = {"", "-router", "-canary"};
    for (size_t i = 0; i < rd->n; i++)
        for (int k = 0; k < K_KINDS; k++) {
            char inst[KEY_MAX + 32];
            snprintf(inst, sizeof inst, "%s%s %s", rd->s[i].key, suffix[k], k == K_ROUTER ? "llm-router" : "llm-server");
            if (json_object_set_new(rd->by_instance, inst, json_pack("[I,i]", (json_int_t)i, k)))
                return -1;
        }
    return 0;
}

static void add_page(round *rd, size_t i, int kind, int what, const char *pod, const char *ip, long long port)
{
    snap *s = &rd->s[i];
    int cap = what == P_STARTUPZ ? DIAG_PODS : rd->share;
    if (rd->np >= ROUND_PAGES || s->pages[kind][what] >= cap)
        return;
    page *p = &rd->p[rd->np];
    if (snprintf(p->url, sizeof p->url, "http://%s:%lld/%s", ip, port, what == P_STARTUPZ ? "startupz" : "metrics") >=
        (int)sizeof p->url)
        return;
    p->snap = i, p->kind = kind, p->what = what, p->pod = pod;
    rd->np++;
    s->pages[kind][what]++;
}

/* One pod of the list: kept for its target's diagnosis, its pages asked. */
static void place_pod(round *rd, json_t *pod)
{
    json_t *md = json_object_get(pod, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *inst = json_string_value(get2(md, "labels", REC_INSTANCE));
    const char *app = json_string_value(get2(md, "labels", APP_NAME)); /* NAME-router's routers, or LLMDeployment NAME-router's servers */
    char key[KEY_MAX + 32];
    if (!ns || !inst || !app || snprintf(key, sizeof key, "%s/%s %s", ns, inst, app) >= (int)sizeof key)
        return;
    json_t *at = json_object_get(rd->by_instance, key);
    if (!at)
        return;
    size_t i = (size_t)json_integer_value(json_array_get(at, 0));
    int kind = (int)json_integer_value(json_array_get(at, 1));
    snap *s = &rd->s[i];
    const char *ip = json_string_value(get2(pod, "status", "podIP"));
    const char *name = json_string_value(json_object_get(md, "name"));
    if (s->need.diag && kind != K_ROUTER) {
        if (json_array_size(s->pods[kind]) < PODS_PER_LLMD)
            json_array_append(s->pods[kind], pod);
        if (pod_diag_wants_startupz(pod))
            add_page(rd, i, kind, P_STARTUPZ, name, ip, s->need.port);
    }
    if (!ip || !name || !pod_ready(pod) || json_object_get(md, "deletionTimestamp"))
        return;
    if (kind == K_SERVER && (s->need.metric[0] || s->need.canary == 2))
        add_page(rd, i, kind, P_METRICS, name, ip, s->need.port);
    else if (kind == K_ROUTER && (s->need.activity || s->need.canary == 1))
        add_page(rd, i, kind, P_METRICS, name, ip, DES_ROUTER_PORT);
}

/* Every page at once; each answer added to its target's reading. */
static void read_pages(round *rd)
{
    const char **urls = calloc(rd->np ? rd->np : 1, sizeof *urls);
    long *codes = calloc(rd->np ? rd->np : 1, sizeof *codes);
    char **bodies = calloc(rd->np ? rd->np : 1, sizeof *bodies);
    if (urls && codes && bodies) {
        for (size_t i = 0; i < rd->np; i++) urls[i] = rd->p[i].url;
        size_t each = rd->np && ROUND_BYTES / rd->np < PAGE_MAX ? ROUND_BYTES / rd->np : PAGE_MAX;
        http_get_many(urls, rd->np, PODSIG_BUDGET_MS, each, codes, bodies);
        for (size_t i = 0; i < rd->np; i++) {
            page *p = &rd->p[i];
            snap *s = &rd->s[p->snap];
            ctl_obs_count(codes[i] ? CTL_M_PAGES_ANSWERED : CTL_M_PAGES_UNANSWERED);
            if (codes[i] == 200 && p->what == P_METRICS)
                (p->kind == K_SERVER ? podsig_add_server_page : podsig_add_router_page)(&s->r, bodies[i]);
            else if (codes[i] && p->what == P_STARTUPZ) /* any status: a failed load answers 503 */
                json_object_set_new(s->startupz[p->kind], p->pod, json_loads(bodies[i], 0, NULL) ?: json_null());
            free(bodies[i]);
        }
    }
    free(urls);
    free(codes);
    free(bodies);
}

static void finish(snap *s)
{
    if (s->r.signal_pods)
        s->r.signal /= s->r.signal_pods;
    else
        s->r.signal = -1;
    if (s->need.diag) {
        pod_diag_judge(s->pods[K_SERVER], s->startupz[K_SERVER], &s->r.diag);
        pod_diag_judge(s->pods[K_CANARY], s->startupz[K_CANARY], &s->r.canary_diag);
    }
}

/* The targets' needs, copied under the lock. 0 when there are none. */
static size_t take_snapshot(podsig *ps, round *rd)
{
    pthread_mutex_lock(&ps->mu);
    rd->s = calloc(ps->n ? ps->n : 1, sizeof *rd->s);
    for (size_t i = 0; rd->s && i < ps->n; i++) {
        if (need_empty(&ps->t[i].need)) /* kept for its admin answers alone */
            continue;
        snap *s = &rd->s[rd->n++];
        memcpy(s->key, ps->t[i].key, sizeof s->key);
        s->need = s->r.need = ps->t[i].need;
    }
    pthread_mutex_unlock(&ps->mu);
    for (size_t i = 0; i < rd->n; i++)
        for (int k = 0; k < K_KINDS; k++) {
            rd->s[i].pods[k] = json_array();
            rd->s[i].startupz[k] = json_object();
        }
    return rd->n;
}

/* The readings, for targets whose need is still the one read for. */
static void store(podsig *ps, round *rd)
{
    double now = mono_s();
    pthread_mutex_lock(&ps->mu);
    for (size_t i = 0; i < rd->n; i++) {
        json_t *at = json_object_get(ps->index, rd->s[i].key);
        target *t = at ? &ps->t[json_integer_value(at)] : NULL;
        if (!t || !need_same(&t->need, &rd->s[i].need))
            continue;
        podsig_admin keep = t->r.admin;
        t->r = rd->s[i].r;
        t->r.admin = keep;
        t->done_at = now;
    }
    pthread_mutex_unlock(&ps->mu);
}

static void round_free(round *rd)
{
    for (size_t i = 0; i < rd->n; i++)
        for (int k = 0; k < K_KINDS; k++) {
            json_decref(rd->s[i].pods[k]);
            json_decref(rd->s[i].startupz[k]);
        }
    free(rd->s);
    free(rd->p);
    json_decref(rd->by_instance);
}

static void round_once(podsig *ps, kube_client *k)
{
    round rd = {0};
    json_t *list = NULL;
    char path[512];
    snprintf(path, sizeof path, "/api/v1%s%s/pods?labelSelector=" REC_MANAGED_BY "%%3D" REC_CONTROLLER,
             ps->ns[0] ? "/namespaces/" : "", ps->ns);
    llm_error err = {0};
    if (!take_snapshot(ps, &rd) || index_instances(&rd) || !(rd.p = calloc(ROUND_PAGES, sizeof *rd.p)))
        goto out;
    if (kube_request(k, "GET", path, NULL, NULL, &list, &err)) {
        fprintf(stderr, "llm-controller: cannot list the pods for their signals: %s\n", err.msg);
        goto out; /* the readings age; the planner holds on old or no readings */
    }
    /* a fair share each (a sample of an LLMDeployment's pods still gives its mean signal): one tenant's
     * thousands of pods do not crowd out another's few */
    rd.share = (int)(ROUND_PAGES / rd.n);
    rd.share = rd.share > PODS_PER_LLMD ? PODS_PER_LLMD : rd.share < 4 ? 4 : rd.share;
    json_t *items = json_object_get(list, "items");
    for (size_t i = 0; i < json_array_size(items); i++) place_pod(&rd, json_array_get(items, i));
    read_pages(&rd);
    for (size_t i = 0; i < rd.n; i++) finish(&rd.s[i]);
    store(ps, &rd);
    ctl_obs_count(CTL_M_SIGNAL_ROUNDS);
out:
    json_decref(list);
    round_free(&rd);
}

/* ---- the thread ----------------------------------------------------------------------- */

/* Seconds between rounds: the most frequent need's, 1 to 30; 0: nothing needed. */
static double period_locked(podsig *ps)
{
    double p = 0;
    for (size_t i = 0; i < ps->n; i++) {
        if (need_empty(&ps->t[i].need))
            continue;
        double e = ps->t[i].need.every_s < 1 ? 1 : ps->t[i].need.every_s > 30 ? 30 : ps->t[i].need.every_s;
        p = p == 0 || e < p ? e : p;
    }
    return p;
}

static void *run(void *arg)
{
    podsig *ps = arg;
    kube_client *k = NULL;
    llm_error err = {0};
    if (kube_client_new(ps->cfg, &k, &err)) {
        fprintf(stderr, "llm-controller: the pod signals' thread has no client: %s\n", err.msg);
        return NULL;
    }
    kube_client_set_timeout(k, LIST_TIMEOUT_MS);
    kube_client_set_cancel(k, &ps->cancel);
    double last = 0;
    pthread_mutex_lock(&ps->mu);
    while (!ps->stopping) {
        if (ps->beat)
            ps->beat();
        double p = period_locked(ps), now = mono_s();
        int due = p > 0 && (now - last >= p || (ps->wake && now - last >= MIN_GAP_S));
        if (!due) { /* a second at most: the heartbeat ticks while nothing is needed */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&ps->cv, &ps->mu, &ts);
            continue;
        }
        ps->wake = 0;
        pthread_mutex_unlock(&ps->mu);
        last = mono_s();
        round_once(ps, k);
        pthread_mutex_lock(&ps->mu);
    }
    pthread_mutex_unlock(&ps->mu);
    kube_client_free(k);
    return NULL;
}

llm_status podsig_new(kube_config *cfg, const char *ns, void (*beat)(void), podsig **out, llm_error *err)
{
    podsig *ps = calloc(1, sizeof *ps);
    pthread_condattr_t ca;
    if (!ps || !(ps->index = json_object())) {
        free(ps);
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the pod signals");
    }
    ps->cfg = cfg;
    ps->beat = beat;
    snprintf(ps->ns, sizeof ps->ns, "%s", ns ? ns : "");
    pthread_mutex_init(&ps->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* waits do not jump with the wall clock */
    pthread_cond_init(&ps->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&ps->th, NULL, run, ps)) {
        podsig_free(ps);
        return llm_errf(err, LLM_ERR_INTERNAL, "cannot start the pod signals' thread");
    }
    ps->started = 1;
    *out = ps;
    return LLM_OK;
}

void podsig_free(podsig *ps)
{
    if (!ps)
        return;
    pthread_mutex_lock(&ps->mu);
    ps->stopping = 1;
    pthread_cond_broadcast(&ps->cv);
    pthread_mutex_unlock(&ps->mu);
    atomic_store(&ps->cancel, 1);
    if (ps->started)
        pthread_join(ps->th, NULL);
    pthread_cond_destroy(&ps->cv);
    pthread_mutex_destroy(&ps->mu);
    json_decref(ps->index);
    free(ps->t);
    free(ps);
}

/* ---- targets -------------------------------------------------------------------------- */

static target *find_locked(podsig *ps, const char *key)
{
    json_t *at = json_object_get(ps->index, key);
    return at ? &ps->t[json_integer_value(at)] : NULL;
}

static target *add_locked(podsig *ps, const char *key)
{
    if (strlen(key) >= KEY_MAX)
        return NULL;
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 16;
        target *t = realloc(ps->t, cap * sizeof *t);
        if (!t)
            return NULL;
        ps->t = t;
        ps->cap = cap;
    }
    if (json_object_set_new(ps->index, key, json_integer((json_int_t)ps->n)))
        return NULL;
    target *t = &ps->t[ps->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->key, sizeof t->key, "%s", key);
    return t;
}

static void drop_locked(podsig *ps, const char *key)
{
    json_t *at = json_object_get(ps->index, key);
    if (!at)
        return;
    size_t i = (size_t)json_integer_value(at);
    json_object_del(ps->index, key); /* at is gone with it */
    if (i != --ps->n) { /* the last one takes its place */
        ps->t[i] = ps->t[ps->n];
        json_object_set_new(ps->index, ps->t[i].key, json_integer((json_int_t)i));
    }
}

void podsig_read(podsig *ps, const char *key, podsig_reading *out)
{
    memset(out, 0, sizeof *out);
    out->age_s = -1;
    if (!ps)
        return;
    pthread_mutex_lock(&ps->mu);
    target *t = find_locked(ps, key);
    if (t) {
        *out = t->r;
        out->age_s = t->done_at > 0 ? mono_s() - t->done_at : -1;
    }
    pthread_mutex_unlock(&ps->mu);
}

llm_status podsig_want(podsig *ps, const char *key, const podsig_need *need, llm_error *err)
{
    if (!ps)
        return LLM_OK;
    llm_status st = LLM_OK;
    pthread_mutex_lock(&ps->mu);
    target *t = find_locked(ps, key);
    if (need_empty(need) && !(t && t->r.admin.valid)) { /* answers of an /admin/canary call outlive the need */
        drop_locked(ps, key);
    } else if (!t && !(t = add_locked(ps, key))) {
        st = llm_errf(err, LLM_ERR_NOMEM, "no memory to read the pods of %s", key);
    } else if (!need_same(&t->need, need)) {
        podsig_admin keep = t->r.admin;
        memset(&t->r, 0, sizeof t->r);
        t->r.admin = keep;
        t->need = t->r.need = *need;
        t->done_at = 0;
        ps->wake = 1;
        pthread_cond_broadcast(&ps->cv);
    } else {
        t->need.every_s = need->every_s;
    }
    pthread_mutex_unlock(&ps->mu);
    return st;
}

void podsig_note_admin(podsig *ps, const char *key, const podsig_admin *a)
{
    if (!ps)
        return;
    pthread_mutex_lock(&ps->mu);
    target *t = find_locked(ps, key);
    if (!t)
        t = add_locked(ps, key); /* no memory: the next plan asks again */
    if (t)
        t->r.admin = *a;
    pthread_mutex_unlock(&ps->mu);
}

void podsig_forget(podsig *ps, const char *key)
{
    if (!ps)
        return;
    pthread_mutex_lock(&ps->mu);
    drop_locked(ps, key);
    pthread_mutex_unlock(&ps->mu);
}
