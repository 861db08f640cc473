/* podsig.c - the pods' signals, read by one thread in rounds; see podsig.h. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm/json.h"
#include "ctl_obs.h"
#include "desired.h"
#include "gateway.h"
#include "http_client.h"
#include "kube_client.h"
#include "kube_json.h"
#include "podsig.h"
#include "prom_text.h"
#include "llm/clock.h"
#include "llm/sync.h"
#include "llm/thread.h"

#define KEY_MAX 320
#define PODS_PER_LLMD 1024 /* pages per LLMDeployment and kind in one round */
#define DIAG_PODS 64       /* /startupz per instance: enough to say why */
#define ROUND_PAGES 4096
/* pages asked before the fair cut to ROUND_PAGES (by each LLMDeployment's turn): every kind's share */
#define ROUND_ASKED (ROUND_PAGES * K_KINDS)
#define GATEWAY_PAGES 8    /* gateway pods read per LLMDeployment: its route's counters from each */
#define PAGE_MAX (512u << 10)     /* what is kept of a page: a /metrics page's lines the plans read, or a /startupz */
#define PAGE_READ_MAX (64u << 20) /* what is read of a /metrics page (the round's time bounds it too) */
#define ROUND_BYTES (16u << 20)   /* what is kept of every page of a round together */
#define LIST_TIMEOUT_MS 10000
#define LIST_PAGE 500      /* pods per list response */
#define LIST_PAGES_MAX 64  /* 32,000 pods a round at most */
#define MIN_GAP_S 0.25     /* between rounds, however often new needs wake the thread */

typedef struct target {
    char key[KEY_MAX];
    podsig_need need;
    podsig_reading r;
    double done_at;        /* monotonic end of the round r came from; 0: none */
} target;

struct podsig {
    kube_client *k;        /* the thread's own (made before it starts: a failure is podsig_new's) */
    char ns[256];
    void (*beat)(void);
    llm_sync_worker w;          /* the polling loop; w.mu guards the targets and wake */
    int wake;
    atomic_int cancel;     /* ends the list request in flight at podsig_free */
    target *t;             /* n of them; index: key -> position */
    size_t n, cap;
    json_t *index;
};

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
        double v = prom_text_value(text, autoscale_metric_name(r->need.metric), &found);
        if (found) {
            r->signal += v;
            r->signal_pods++;
        }
    }
    if (r->need.canary == 2 && strstr(text, "revision_requests_total{")) {
        canary_sample_add(&r->canary, text);
        r->canary_pods++;
        r->canary_own++;
    }
}

/* A series' sum on one page, never below 0 (the page is a pod's: a
 * negative count must not cancel another page's). */
static double count_of(const char *text, const char *name, const char *route, int *found)
{
    double v = prom_text_value_where(text, name, route ? "route" : NULL, route, found);
    return v > 0 ? v : 0;
}

/* The routers' activity (scale to zero) and canary counters from one
 * page: a router's (route NULL: every series), or a gateway's (the
 * route's series; its held requests are counted per route). */
static void add_routing_page(podsig_reading *r, const char *text, const char *route)
{
    if (r->need.activity) {
        int f1 = 0, f2 = 0, f3 = 0, f4 = 0;
        autoscale_activity *a = &r->activity;
        a->held += count_of(text, route ? "llm_router_route_held_requests" : "llm_router_held_requests", route, &f1);
        a->requests += count_of(text, "llm_router_revision_requests_total", route, &f2) +
                       count_of(text, route ? "llm_router_route_held_total" : "llm_router_held_total", route, &f3);
        a->inflight += count_of(text, "llm_router_backend_inflight", route, &f4);
        a->routers += f1 && f2;
        a->own += f1 && f2 && !route;
    }
    if (r->need.canary == 1 && strstr(text, "revision_requests_total{") && canary_sample_add_route(&r->canary, text, route)) {
        r->canary_pods++;
        r->canary_own += !route;
    }
}

void podsig_add_gateway_page(podsig_reading *r, const char *text, const char *route)
{
    /* (the page asked is the route's alone, but a gateway of an older llm-router answers its whole page: the
     * route's series are still picked out) */
    add_routing_page(r, text, route);
}

void podsig_add_router_page(podsig_reading *r, const char *text)
{
    add_routing_page(r, text, NULL);
}

/* ---- one round -------------------------------------------------------------------------- */

/* a pod's part: NAME, NAME-router, NAME-canary (by instance), a gateway's in NAME's namespace (by app) */
enum { K_SERVER, K_ROUTER, K_CANARY, K_GATEWAY, K_KINDS };
enum { P_METRICS, P_STARTUPZ };

typedef struct snap {          /* a target as the round saw it */
    char key[KEY_MAX];
    podsig_need need;
    podsig_reading r;
    json_t *pods[K_KINDS];     /* for the diagnosis (NAME, NAME-canary) */
    json_t *startupz[K_KINDS]; /* pod name -> parsed body */
    int pages[K_KINDS][2];     /* pages asked, per kind and page */
    int asked;                 /* all of them */
} snap;

typedef struct page {
    size_t snap;
    int kind, what;
    int nth;                   /* its LLMDeployment's nth page this round: pages are asked round-robin */
    const char *pod;           /* the pod's name (borrowed from the list) */
    char url[160];             /* http://[IPv6]:PORT/metrics?route=NAME: 45 + 26 + a name of at most 47 (the CRD's) */
} page;

typedef struct sig_round {
    snap *s;
    size_t n;
    json_t *by_instance;       /* "ns/instance" -> [snap index, kind] */
    page *p;
    size_t np;
    int share;                 /* metrics pages per LLMDeployment and kind: the round's pages shared out */
} sig_round;

int podsig_pod_serving(json_t *pod)
{
    json_t *cs = kube_json_get(pod, "status", "conditions");
    int ready = 0;
    for (size_t i = 0; i < json_array_size(cs); i++) {
        json_t *c = json_array_get(cs, i);
        const char *t = json_string_value(json_object_get(c, "type"));
        const char *st = json_string_value(json_object_get(c, "status"));
        if (t && st && !strcmp(t, "Ready"))
            ready = !strcmp(st, "True");
    }
    return ready && json_is_string(kube_json_get(pod, "status", "podIP")) && !kube_json_get(pod, "metadata", "deletionTimestamp");
}

/* The instances of every target: NAME, NAME-router, NAME-canary. */
static int index_instances(sig_round *rd)
{
    if (!(rd->by_instance = json_object()))
        return -1;
    static const char *const suffix[K_GATEWAY] = {"", "-router", "-canary"};
    /* NAME-canary's own servers and NAME's canary pods share instance and app: the LLMDeployment
     * NAME-canary keeps its own (indexed last, so they win); NAME's canary is then not diagnosed */
    static const int order[K_GATEWAY] = {K_CANARY, K_ROUTER, K_SERVER};
    for (int o = 0; o < K_GATEWAY; o++)
        for (size_t i = 0; i < rd->n; i++) {
            int k = order[o];
            char inst[KEY_MAX + 32];
            snprintf(inst, sizeof inst, "%s%s %s", rd->s[i].key, suffix[k], k == K_ROUTER ? "llm-router" : "llm-server");
            if (json_object_set_new(rd->by_instance, inst, json_pack("[I,i]", (json_int_t)i, k)))
                return -1;
        }
    return 0;
}

/* A target's route at a gateway: its LLMDeployment's name. */
static const char *route_of(const snap *s) { return strchr(s->key, '/') + 1; }

static void add_page(sig_round *rd, size_t i, int kind, int what, const char *pod, const char *ip, long long port)
{
    snap *s = &rd->s[i];
    int cap = what == P_STARTUPZ ? DIAG_PODS : kind == K_GATEWAY ? GATEWAY_PAGES : rd->share;
    if (rd->np >= ROUND_ASKED || s->pages[kind][what] >= cap)
        return;
    page *p = &rd->p[rd->np];
    int v6 = strchr(ip, ':') != NULL;
    /* a gateway's page: the target's route alone (its whole page grows with every route it serves) */
    const char *route = kind == K_GATEWAY ? route_of(s) : NULL;
    if (snprintf(p->url, sizeof p->url, "http://%s%s%s:%lld/%s%s%s", v6 ? "[" : "", ip, v6 ? "]" : "", port,
                 what == P_STARTUPZ ? "startupz" : "metrics", route ? "?route=" : "", route ? route : "") >= (int)sizeof p->url)
        return;
    p->snap = i, p->kind = kind, p->what = what, p->pod = pod;
    p->nth = s->asked++;
    rd->np++;
    s->pages[kind][what]++;
}

/* Whether target s, of namespace ns, reads gateways' pages: its canary
 * is judged from routers' counters, or it scales to zero (a gateway sends
 * to the pods itself, past their own router: its route's counters count
 * too). */
static int reads_gateways(const snap *s, const char *ns)
{
    size_t nl = strlen(ns);
    return (s->need.canary == 1 || s->need.activity) && !strncmp(s->key, ns, nl) && s->key[nl] == '/';
}

/* A gateway's pod: its page of each route (target) of its namespace that
 * reads gateways. */
static void place_gateway(sig_round *rd, json_t *pod, const char *ns)
{
    const char *ip = json_string_value(kube_json_get(pod, "status", "podIP"));
    const char *name = json_string_value(kube_json_get(pod, "metadata", "name"));
    if (!name || !podsig_pod_serving(pod))
        return;
    for (size_t i = 0; i < rd->n; i++)
        if (reads_gateways(&rd->s[i], ns))
            add_page(rd, i, K_GATEWAY, P_METRICS, name, ip, GATEWAY_HEALTH_PORT);
}

/* One pod of the list: kept for its target's diagnosis, its pages asked. */
static void place_pod(sig_round *rd, json_t *pod)
{
    json_t *md = json_object_get(pod, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *inst = json_string_value(kube_json_get(md, "labels", DESIRED_INSTANCE));
    const char *app = json_string_value(kube_json_get(md, "labels", DESIRED_APP)); /* NAME-router's routers, or LLMDeployment NAME-router's servers */
    char key[KEY_MAX + 32];
    if (ns && app && !strcmp(app, GATEWAY_APP)) {
        place_gateway(rd, pod, ns);
        return;
    }
    if (!ns || !inst || !app || snprintf(key, sizeof key, "%s/%s %s", ns, inst, app) >= (int)sizeof key)
        return;
    json_t *at = json_object_get(rd->by_instance, key);
    if (!at)
        return;
    size_t i = (size_t)json_integer_value(json_array_get(at, 0));
    int kind = (int)json_integer_value(json_array_get(at, 1));
    snap *s = &rd->s[i];
    const char *ip = json_string_value(kube_json_get(pod, "status", "podIP"));
    const char *name = json_string_value(json_object_get(md, "name"));
    if (s->need.diag && kind != K_ROUTER) {
        if (json_array_size(s->pods[kind]) < PODS_PER_LLMD)
            json_array_append(s->pods[kind], pod);
        if (pod_diag_wants_startupz(pod))
            add_page(rd, i, kind, P_STARTUPZ, name, ip, s->need.port);
    }
    if (!name || !podsig_pod_serving(pod))
        return;
    if (kind == K_SERVER)
        s->r.serving_pods++;
    if (kind == K_SERVER && (s->need.metric[0] || s->need.canary == 2))
        add_page(rd, i, kind, P_METRICS, name, ip, s->need.port);
    else if (kind == K_ROUTER && (s->need.activity || s->need.canary == 1))
        add_page(rd, i, kind, P_METRICS, name, ip, DESIRED_ROUTER_PORT);
}

static int by_turn(const void *a, const void *b)
{
    const page *x = a, *y = b;
    return x->nth != y->nth ? (x->nth < y->nth ? -1 : 1) : x->snap < y->snap ? -1 : x->snap > y->snap;
}

/* s without a last character that was cut short. */
static void utf8_cut(char *s)
{
    size_t len = strlen(s), i = len;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--; /* back over continuation bytes */
    if (i == 0)
        return;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t want = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (i - 1 + want > len)
        s[i - 1] = 0;
}

/* What the diagnosis reads of a /startupz answer - its phase and detail,
 * cut short - and no more: the page is the pod's, and a parsed tree of a
 * big one is many times its size, so none is kept. */
static json_t *startupz_of(const char *body)
{
    json_t *j = llm_json_loads(body, 0, NULL);
    const char *phase = json_string_value(json_object_get(j, "phase"));
    const char *detail = json_string_value(json_object_get(j, "detail"));
    char d[600];
    if ((size_t)snprintf(d, sizeof d, "%s", detail ? detail : "") >= sizeof d)
        utf8_cut(d); /* json_pack refuses a cut character, and the phase would go with it */
    json_t *out = phase && detail ? json_pack("{s:s%,s:s}", "phase", phase, strlen(phase) < 32 ? strlen(phase) : 32,
                                              "detail", d)
                                  : json_null();
    const char *reason = json_string_value(json_object_get(j, "reason"));
    if (json_is_object(out) && reason && strlen(reason) < 32) /* pod_diag reads only the reasons it knows */
        json_object_set_new(out, "reason", json_string(reason));
    json_decref(j);
    return out ? out : json_null();
}

/* One /metrics page asked for r: a counter page of its canary, a page of
 * its routers' activity. Its own routers' and pods' pages only: a gateway
 * of the namespace may not route to it at all (its page then has none of
 * the series), so gateways add what they answer and are not awaited. */
static void count_asked(podsig_reading *r, int kind)
{
    if ((r->need.canary == 1 && kind == K_ROUTER) || (r->need.canary == 2 && kind == K_SERVER))
        r->canary_asked++;
    if (r->need.activity && kind == K_ROUTER)
        r->activity.asked++;
}

/* The series the plans read (podsig_add_*_page, canary.c, autoscale.c):
 * every other line of a /metrics page is dropped as it is read. */
static const char *const kept_series[] = {
    "llm_requests_waiting", "llm_kv_cache_usage_ratio", "llm_generation_tokens_per_second", /* the signals */
    "llm_revision_", "llm_router_revision_",                 /* the canary's counters (a pod's own, a router's) */
    "llm_router_held_", "llm_router_route_held_", "llm_router_backend_inflight", /* activity (scale to zero) */
    NULL};

/* Every page at once; each answer added to its target's reading.
 * 0, or -1 without memory (nothing read: the round stores nothing). */
static int read_pages(sig_round *rd)
{
    const char **urls = calloc(rd->np ? rd->np : 1, sizeof *urls);
    long *codes = calloc(rd->np ? rd->np : 1, sizeof *codes);
    char **bodies = calloc(rd->np ? rd->np : 1, sizeof *bodies);
    unsigned char *filtered = calloc(rd->np ? rd->np : 1, 1);
    if (urls && codes && bodies && filtered) {
        /* round-robin across LLMDeployments: the connections go to everyone's first pages before anyone's
         * second, so one LLMDeployment's pods that hold them cannot starve the others' */
        qsort(rd->p, rd->np, sizeof *rd->p, by_turn);
        rd->np = rd->np < ROUND_PAGES ? rd->np : ROUND_PAGES; /* the fair cut: everyone's first pages first */
        for (size_t i = 0; i < rd->np; i++) urls[i] = rd->p[i].url;
        size_t each = rd->np && ROUND_BYTES / rd->np < PAGE_MAX ? ROUND_BYTES / rd->np : PAGE_MAX;
        for (size_t i = 0; i < rd->np; i++) filtered[i] = rd->p[i].what == P_METRICS;
        /* a /metrics page is read whole, keeping only the series the plans read: a real page, of any size,
         * costs its kept lines (a few hundred bytes), not its length */
        http_client_get_many_lines(urls, rd->np, PODSIG_BUDGET_MS, each, PAGE_READ_MAX, kept_series, filtered, codes,
                                   bodies);
        for (size_t i = 0; i < rd->np; i++) {
            page *p = &rd->p[i];
            snap *s = &rd->s[p->snap];
            ctl_obs_count(codes[i] ? CTL_M_PAGES_ANSWERED : CTL_M_PAGES_UNANSWERED);
            if (p->what == P_METRICS) /* what was asked, answered or not: the share the plans require */
                count_asked(&s->r, p->kind);
            if (codes[i] == 200 && p->what == P_METRICS && p->kind == K_GATEWAY)
                podsig_add_gateway_page(&s->r, bodies[i], route_of(s));
            else if (codes[i] == 200 && p->what == P_METRICS)
                (p->kind == K_SERVER ? podsig_add_server_page : podsig_add_router_page)(&s->r, bodies[i]);
            else if (codes[i] && p->what == P_STARTUPZ) /* any status: a failed load answers 503 */
                json_object_set_new(s->startupz[p->kind], p->pod, startupz_of(bodies[i]));
            free(bodies[i]);
        }
    }
    int ok = urls && codes && bodies && filtered;
    free(urls);
    free(codes);
    free(bodies);
    free(filtered);
    return ok ? 0 : -1;
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

/* The targets' needs, copied under the lock. 0 when there are none or
 * no memory for them. */
static size_t take_snapshot(podsig *ps, sig_round *rd)
{
    pthread_mutex_lock(&ps->w.mu);
    rd->s = calloc(ps->n ? ps->n : 1, sizeof *rd->s);
    for (size_t i = 0; rd->s && i < ps->n; i++) {
        if (need_empty(&ps->t[i].need)) /* kept for its admin answers alone */
            continue;
        snap *s = &rd->s[rd->n++];
        memcpy(s->key, ps->t[i].key, sizeof s->key);
        s->need = s->r.need = ps->t[i].need;
    }
    pthread_mutex_unlock(&ps->w.mu);
    int bad = 0;
    for (size_t i = 0; i < rd->n; i++)
        for (int k = 0; k < K_KINDS; k++)
            bad |= !(rd->s[i].pods[k] = json_array()) | !(rd->s[i].startupz[k] = json_object());
    return bad ? 0 : rd->n;
}

/* The readings, for targets whose need is still the one read for. */
static void store(podsig *ps, sig_round *rd)
{
    double now = llm_clock_mono_s();
    pthread_mutex_lock(&ps->w.mu);
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
    pthread_mutex_unlock(&ps->w.mu);
}

static void round_free(sig_round *rd)
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

/* Our pods, a page of LIST_PAGE at a time (no one response of every pod
 * there is: anyone may label pods as ours). The pages are kept in *pages
 * (the round borrows their pods); LLM_OK or the failed request's error. */
static llm_status list_pods(podsig *ps, kube_client *k, json_t **pages, llm_error *err)
{
    char path[1024], cont[512] = "";
    if (!(*pages = json_array()))
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the pod list");
    for (int n = 0; n < LIST_PAGES_MAX; n++) {
        json_t *resp = NULL;
        snprintf(path, sizeof path, "/api/v1%s%s/pods?labelSelector=" DESIRED_MANAGED_BY "%%3D" DESIRED_CONTROLLER
                 "&limit=%d%s%s", ps->ns[0] ? "/namespaces/" : "", ps->ns, LIST_PAGE, cont[0] ? "&continue=" : "", cont);
        llm_status st = kube_client_request(k, "GET", path, NULL, NULL, &resp, err);
        if (st)
            return st;
        if (json_array_append_new(*pages, resp)) /* (resp is gone with the failure) */
            return llm_errf(err, LLM_ERR_NOMEM, "no memory for the pod list");
        const char *next = json_string_value(json_object_get(json_object_get(resp, "metadata"), "continue"));
        /* the token goes back in a query: only what it is made of (base64url and '=') */
        if (!next || !*next || strlen(next) >= sizeof cont || strspn(next, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                                        "0123456789-_=") != strlen(next))
            return LLM_OK;
        snprintf(cont, sizeof cont, "%s", next);
    }
    return LLM_OK; /* the rest are not read this round */
}

static void round_once(podsig *ps, kube_client *k)
{
    sig_round rd = {0};
    json_t *pages = NULL;
    llm_error err = {0};
    if (!take_snapshot(ps, &rd) || index_instances(&rd) || !(rd.p = calloc(ROUND_ASKED, sizeof *rd.p)))
        goto out;
    if (list_pods(ps, k, &pages, &err)) {
        ctl_obs_log(CTL_WARN, "cannot list the pods for their signals", "error", err.msg, (const char *)NULL);
        goto out; /* the readings age; the planner holds on old or no readings */
    }
    /* a fair share each (a sample of an LLMDeployment's pods still gives its mean signal): one tenant's
     * thousands of pods do not crowd out another's few */
    rd.share = (int)(ROUND_PAGES / rd.n);
    rd.share = rd.share > PODS_PER_LLMD ? PODS_PER_LLMD : rd.share < 4 ? 4 : rd.share;
    for (size_t p = 0; p < json_array_size(pages); p++) {
        json_t *items = json_object_get(json_array_get(pages, p), "items");
        for (size_t i = 0; i < json_array_size(items); i++) place_pod(&rd, json_array_get(items, i));
    }
    if (read_pages(&rd)) { /* no memory: the readings age rather than read "nothing answered" */
        ctl_obs_log(CTL_ERROR, "no memory to read the pods' pages", (const char *)NULL);
        goto out;
    }
    for (size_t i = 0; i < rd.n; i++) finish(&rd.s[i]);
    store(ps, &rd);
    ctl_obs_count(CTL_M_SIGNAL_ROUNDS);
out:
    json_decref(pages);
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
    kube_client *k = ps->k;
    double last = 0;
    pthread_mutex_lock(&ps->w.mu);
    while (!ps->w.stop) {
        if (ps->beat)
            ps->beat();
        double p = period_locked(ps), now = llm_clock_mono_s();
        int due = p > 0 && (now - last >= p || (ps->wake && now - last >= MIN_GAP_S));
        if (!due) { /* a second at most: the heartbeat ticks while nothing is needed */
            llm_sync_worker_wait(&ps->w, now + 1);
            continue;
        }
        ps->wake = 0;
        pthread_mutex_unlock(&ps->w.mu);
        last = llm_clock_mono_s();
        round_once(ps, k);
        pthread_mutex_lock(&ps->w.mu);
    }
    pthread_mutex_unlock(&ps->w.mu);
    return NULL;
}

llm_status podsig_new(kube_config *cfg, const char *ns, void (*beat)(void), podsig **out, llm_error *err)
{
    podsig *ps = calloc(1, sizeof *ps);
    if (!ps || !(ps->index = json_object())) {
        free(ps);
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the pod signals");
    }
    ps->beat = beat;
    snprintf(ps->ns, sizeof ps->ns, "%s", ns ? ns : "");
    int rc = llm_sync_worker_init(&ps->w);
    if (rc) {
        json_decref(ps->index);
        free(ps);
        return llm_errf(err, LLM_ERR_INTERNAL, "cannot make the pod signals' lock: %s", strerror(rc));
    }
    llm_status st = kube_client_new(cfg, &ps->k, err);
    if (st) {
        podsig_free(ps);
        return st;
    }
    kube_client_set_timeout(ps->k, LIST_TIMEOUT_MS);
    kube_client_set_cancel(ps->k, &ps->cancel);
    if ((rc = llm_sync_worker_start(&ps->w, LLM_THREAD_STACK, run, ps))) {
        podsig_free(ps);
        return llm_errf(err, LLM_ERR_INTERNAL, "cannot start the pod signals' thread: %s", strerror(rc));
    }
    *out = ps;
    return LLM_OK;
}

void podsig_free(podsig *ps)
{
    if (!ps)
        return;
    atomic_store(&ps->cancel, 1); /* ends the list in flight, so the join below waits for no API call */
    llm_sync_worker_stop(&ps->w);
    kube_client_free(ps->k);
    llm_sync_worker_free(&ps->w);
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
    pthread_mutex_lock(&ps->w.mu);
    target *t = find_locked(ps, key);
    if (t) {
        *out = t->r;
        out->age_s = t->done_at > 0 ? llm_clock_mono_s() - t->done_at : -1;
    }
    pthread_mutex_unlock(&ps->w.mu);
}

llm_status podsig_want(podsig *ps, const char *key, const podsig_need *need, llm_error *err)
{
    if (!ps)
        return LLM_OK;
    llm_status st = LLM_OK;
    pthread_mutex_lock(&ps->w.mu);
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
        pthread_cond_broadcast(&ps->w.cv);
    } else {
        t->need.every_s = need->every_s;
    }
    pthread_mutex_unlock(&ps->w.mu);
    return st;
}

void podsig_note_admin(podsig *ps, const char *key, const podsig_admin *a)
{
    if (!ps)
        return;
    pthread_mutex_lock(&ps->w.mu);
    target *t = find_locked(ps, key);
    if (!t)
        t = add_locked(ps, key); /* no memory: the next plan asks again */
    if (t)
        t->r.admin = *a;
    pthread_mutex_unlock(&ps->w.mu);
}

void podsig_forget(podsig *ps, const char *key)
{
    if (!ps)
        return;
    pthread_mutex_lock(&ps->w.mu);
    drop_locked(ps, key);
    pthread_mutex_unlock(&ps->w.mu);
}
