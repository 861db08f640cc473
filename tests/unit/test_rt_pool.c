/* test_rt_pool.c - llm-router's choice without HTTP: request chains
 * (shared exactly as far as the prompts' bytes are, split by model, key and
 * salt, bounded), the prefix index against an exact LRU of the links sent
 * (it must hold the last cap/2 distinct links and nothing older than the
 * last cap), and the cache-aware pick: a prefix goes back where it was
 * sent, spreads when that pod is busier than a prefill elsewhere costs,
 * and a pod whose answers deny or overstate its cache gains nothing; the
 * gateway's route table. */
#include "testutil.h"

#include <sys/resource.h>

#include "rt_pool.h"
#include "rt_prefix.h"
#include "rt_routes.h"

static rt_prefix_chain g_a, g_b; /* 8 KiB each: off the stack */

static void chain_of(const char *body, const char *auth, rt_prefix_chain *c)
{
    rt_prefix_chain_of((llm_json_span){body, strlen(body)}, auth, c);
}

static int shared_links(const rt_prefix_chain *a, const rt_prefix_chain *b)
{
    int k = 0;
    while (k < a->n && k < b->n && a->link[k] == b->link[k]) k++;
    return k;
}

/* A chat body: a system message of sys_bytes 'S's, then turns user
 * messages of 300 bytes each (turn t's letters differ by t). */
static char *chat(const char *model, int sys_bytes, int turns, const char *salt)
{
    size_t n = (size_t)sys_bytes + (size_t)turns * 360 + 512, k;
    char *b = malloc(n);
    assert_non_null(b);
    k = (size_t)snprintf(b, n, "{\"model\":\"%s\",%s%s%s\"messages\":[{\"role\":\"system\",\"content\":\"", model,
                         salt ? "\"cache_salt\":\"" : "", salt ? salt : "", salt ? "\"," : "");
    memset(b + k, 'S', (size_t)sys_bytes), k += (size_t)sys_bytes;
    k += (size_t)snprintf(b + k, n - k, "\"}");
    for (int t = 0; t < turns; t++) {
        k += (size_t)snprintf(b + k, n - k, ",{\"role\":\"user\",\"content\":\"");
        memset(b + k, 'a' + t % 26, 300), k += 300;
        k += (size_t)snprintf(b + k, n - k, "\"}");
    }
    snprintf(b + k, n - k, "]}");
    return b;
}

static void test_chain(void **st)
{
    (void)st;
    char *one = chat("m", 4000, 1, NULL), *two = chat("m", 4000, 2, NULL);
    chain_of(one, NULL, &g_a);
    chain_of(two, NULL, &g_b);
    /* the prompt's bytes: the messages as written, less the partition */
    assert_true(g_a.bytes > 4300 && g_a.bytes < 4400);
    assert_int_equal(g_a.n, (int)((g_a.bytes + 6) / RT_PREFIX_CHUNK)); /* the partition here: 6 bytes */
    /* a follow-up shares every whole chunk of the first turn's prompt (its
     * messages are the start of the follow-up's) */
    assert_int_equal(shared_links(&g_a, &g_b), g_a.n);
    assert_true(g_b.n > g_a.n);
    /* another model, key or salt: a partition of its own */
    char *other = chat("n", 4000, 1, NULL), *salted = chat("m", 4000, 1, "x");
    chain_of(other, NULL, &g_b);
    assert_int_equal(shared_links(&g_a, &g_b), 0);
    chain_of(one, "Bearer k1", &g_b);
    assert_int_equal(shared_links(&g_a, &g_b), 0);
    chain_of(salted, NULL, &g_b);
    assert_int_equal(shared_links(&g_a, &g_b), 0);
    /* the same request twice: the same chain (the key is per process) */
    chain_of(one, NULL, &g_b);
    assert_int_equal(shared_links(&g_a, &g_b), g_a.n);
    /* a completion's prompt; no prompt at all; no object */
    chain_of("{\"prompt\":\"short\"}", NULL, &g_b);
    assert_int_equal(g_b.n, 0);
    assert_int_equal((int)g_b.bytes, 8); /* its tag and "short" as written */
    chain_of("{\"input\":\"embed me\"}", NULL, &g_b);
    assert_int_equal(g_b.n + (int)g_b.bytes, 0);
    chain_of("[1,2]", NULL, &g_b);
    assert_int_equal(g_b.n + (int)g_b.bytes, 0);
    free(one), free(two), free(other), free(salted);
}

static void test_chain_bounded(void **st)
{
    (void)st;
    char *big = chat("m", 600000, 0, NULL);
    chain_of(big, NULL, &g_a);
    assert_int_equal(g_a.n, RT_PREFIX_MAX_LINKS); /* the rest is not looked at... */
    assert_true(g_a.bytes > 600000);              /* ...but counts as prompt */
    free(big);
}

/* The index against an exact LRU of distinct links: random chains (some
 * sent again) into an index of cap 64; after each, every link among the
 * last cap/2 distinct ones sent is held, and none older than the last cap. */
static void test_index_vs_lru(void **st)
{
    (void)st;
    enum { CAP = 64, OPS = 3000, POOL = 200 };
    rt_prefix_index *x;
    llm_error err = {0};
    assert_int_equal(rt_prefix_index_new(CAP, &x, &err), LLM_OK);
    assert_int_equal(rt_prefix_index_size(x), 0);
    uint64_t lru[4096]; /* most recent first */
    int n_lru = 0;
    uint64_t seed = 7;
    for (int op = 0; op < OPS; op++) {
        /* a chain of 1..6 links from a small universe of chains: repeats happen */
        uint64_t base = test_rng(&seed) % POOL, links[6];
        int n = 1 + (int)(base % 6);
        for (int k = 0; k < n; k++) links[k] = (base << 8 | (uint64_t)k) + 1;
        assert_int_equal(rt_prefix_insert(x, links, n), 0);
        for (int k = n - 1; k >= 0; k--) { /* the LRU: the chain's links, its first most recent (as the index) */
            int at = 0;
            while (at < n_lru && lru[at] != links[k]) at++;
            n_lru += at == n_lru; /* POOL * 6 distinct links at most: lru has room */
            memmove(lru + 1, lru, (size_t)at * sizeof *lru);
            lru[0] = links[k];
        }
        assert_true(rt_prefix_index_size(x) <= CAP);
        for (int i = 0; i < n_lru; i++) {
            int held = rt_prefix_match(x, &lru[i], 1);
            if (i < CAP / 2 && !held)
                fail_msg("op %d: link %d places from the newest is forgotten", op, i);
            if (i >= CAP && held)
                fail_msg("op %d: link %d places from the newest is still held (cap %d)", op, i, CAP);
        }
        /* the chain just sent is held whole */
        assert_int_equal(rt_prefix_match(x, links, n), n);
    }
    rt_prefix_index_clear(x);
    assert_int_equal(rt_prefix_index_size(x), 0);
    rt_prefix_index_set_cap(x, 1 << 30);
    assert_int_equal(rt_prefix_index_cap(x), RT_PREFIX_MAX_CAP);
    rt_prefix_index_free(x);
}

/* A longer chain sent after a shorter one: a request sharing the first k
 * links matches k, bisection or not. */
static void test_index_prefix(void **st)
{
    (void)st;
    rt_prefix_index *x;
    llm_error err = {0};
    assert_int_equal(rt_prefix_index_new(4096, &x, &err), LLM_OK);
    char *two = chat("m", 4000, 3, NULL), *one = chat("m", 4000, 1, NULL);
    chain_of(two, NULL, &g_a);
    chain_of(one, NULL, &g_b);
    assert_int_equal(rt_prefix_match(x, g_a.link, g_a.n), 0);
    assert_int_equal(rt_prefix_insert(x, g_b.link, g_b.n), 0);
    assert_int_equal(rt_prefix_match(x, g_a.link, g_a.n), shared_links(&g_a, &g_b));
    assert_int_equal(rt_prefix_insert(x, g_a.link, g_a.n), 0);
    assert_int_equal(rt_prefix_match(x, g_a.link, g_a.n), g_a.n);
    assert_int_equal(rt_prefix_match(x, g_b.link, g_b.n), g_b.n);
    free(two), free(one);
    rt_prefix_index_free(x);
}

static rt_pool *three_pods(void)
{
    rt_pool *p;
    llm_error err = {0};
    rt_pool_config c = {.policy = RT_CACHE_AWARE};
    assert_int_equal(rt_pool_new(&c, &p, &err), LLM_OK);
    const char *urls[] = {"a=http://10.0.0.1:1", "b=http://10.0.0.2:1", "c=http://10.0.0.3:1"};
    assert_int_equal(rt_pool_set(p, 0, urls, 3, &err), LLM_OK);
    return p;
}

static int pick(rt_pool *p, const rt_prefix_chain *c, rt_pick *pk)
{
    char url[256];
    rt_request q = {.chain = c, .streamed = 1};
    int i = rt_pool_pick(p, &q, url, sizeof url, pk);
    assert_true(i >= 0);
    return i;
}

static void done(rt_pool *p, int i, int prompt, int cached, rt_pick pk)
{
    rt_result r = {.ok = 1, .status = 200, .ttfb = -1, .prompt_tokens = prompt, .cached_tokens = cached,
                   .predicted = pk.predicted, .pending = pk.pending};
    rt_pool_release(p, i, &r);
}

static void test_cache_aware_pick(void **st)
{
    (void)st;
    rt_pool *p = three_pods();
    char *t1 = chat("m", 4000, 1, NULL), *t2 = chat("m", 4000, 2, NULL);
    chain_of(t1, NULL, &g_a);
    chain_of(t2, NULL, &g_b);
    rt_pick pred;
    int first = pick(p, &g_a, &pred);
    assert_true(pred.predicted == 0);
    done(p, first, 1100, 0, pred);
    /* idle pods: the follow-up goes where its first turn went, predicted mostly cached */
    int again = pick(p, &g_b, &pred);
    assert_int_equal(again, first);
    assert_true(pred.predicted > 0.8 && pred.predicted < 1);
    done(p, again, 1200, 1000, pred);
    /* the pod busy (requests in flight there): past a prefill's worth of
     * load (balance 0.25 of the mean prompt each), the prompt goes elsewhere */
    int busy[16], n_busy = 0, moved = -1;
    rt_pick busy_pk[16], moved_pk = {0};
    for (int k = 0; k < 16 && moved < 0; k++) {
        int i = pick(p, &g_b, &pred);
        if (i != first)
            moved = i, moved_pk = pred;
        else
            busy_pk[n_busy] = pred, busy[n_busy++] = i;
    }
    assert_true(moved >= 0);
    assert_true(n_busy >= 3); /* a 4.6 KB prompt is worth several queued requests */
    done(p, moved, 1200, 0, moved_pk);
    for (int k = 0; k < n_busy; k++) done(p, busy[k], 1200, 1100, busy_pk[k]);
    /* now two pods hold it: with loads equal again it goes to one of them */
    for (int k = 0; k < 6; k++) {
        int i = pick(p, &g_b, &pred);
        assert_true(i == first || i == moved);
        done(p, i, 1200, 1150, pred);
    }
    free(t1), free(t2);
    rt_pool_free(p);
}

/* A pod whose answers say it had nothing of what the router predicted
 * (restarted, or lying low): its trust falls and its prefixes stop
 * pulling; one that says more than predicted gains nothing. */
static void test_trust(void **st)
{
    (void)st;
    rt_pool *p = three_pods();
    char *t1 = chat("m", 4000, 1, NULL), *t2 = chat("m", 4000, 2, NULL);
    chain_of(t1, NULL, &g_a);
    chain_of(t2, NULL, &g_b);
    rt_pick pred;
    int pod = pick(p, &g_a, &pred);
    done(p, pod, 1100, 1100, pred); /* says all cached, predicted none: no change */
    llm_strbuf m = {0};
    char series[96];
    snprintf(series, sizeof series, "llm_router_backend_cache_trust{backend=\"%c\"} 1\n", 'a' + pod);
    rt_pool_metrics(&p, NULL, 1, &m);
    assert_non_null(strstr(m.p, series));
    llm_strbuf_free(&m);
    for (int k = 0; k < 12; k++) {
        int i = pick(p, &g_b, &pred);
        assert_int_equal(i, pod); /* loads equal, the prefix pulls... */
        done(p, i, 1200, 0, pred); /* ...but the pod says none of it was cached */
    }
    /* believed barely at all now: the pick weighs the pods by load alone; with this pod one request busier, another takes it */
    char url[256];
    rt_request q = {.chain = &g_b};
    rt_pick held_pk, other_pk;
    int held = rt_pool_pick(p, &q, url, sizeof url, &held_pk), other = pick(p, &g_b, &other_pk);
    assert_int_equal(held, pod);
    assert_int_not_equal(other, pod);
    rt_pool_metrics(&p, NULL, 1, &m);
    snprintf(series, sizeof series, "llm_router_backend_cache_trust{backend=\"%c\"} ", 'a' + pod);
    const char *trust = strstr(m.p, series);
    assert_non_null(trust);
    assert_true(strtod(trust + strlen(series), NULL) < 0.1); /* 0.8^12 */
    llm_strbuf_free(&m);
    done(p, held, -1, -1, held_pk), done(p, other, -1, -1, other_pk);
    free(t1), free(t2);
    rt_pool_free(p);
}

/* A pool grows as backends come (a gateway holds many small ones), up to
 * RT_MAX_BACKENDS; slots of backends gone are reused; two pools' metrics
 * come as one text, each family once, each sample with its route. */
static void test_pool_grows_and_metrics_of_two(void **st)
{
    (void)st;
    rt_pool *p = three_pods(), *q = three_pods();
    llm_error err = {0};
    static char url[RT_MAX_BACKENDS + 1][32];
    const char *urls[RT_MAX_BACKENDS + 1];
    for (int i = 0; i <= RT_MAX_BACKENDS; i++) {
        snprintf(url[i], sizeof url[i], "http://10.1.%d.%d:1", i / 200, i % 200);
        urls[i] = url[i];
    }
    assert_int_equal(rt_pool_set(p, 0, urls, RT_MAX_BACKENDS, &err), LLM_OK);
    assert_int_equal(rt_pool_size(p), RT_MAX_BACKENDS);
    assert_int_equal(rt_pool_set(p, 1, urls + RT_MAX_BACKENDS, 1, &err), LLM_ERR_TOO_LONG);
    assert_int_equal(rt_pool_set(p, 0, urls, 2, &err), LLM_OK);
    assert_int_equal(rt_pool_set(p, 1, urls + 10, 5, &err), LLM_OK); /* into the freed slots */
    assert_int_equal(rt_pool_size(p), 7);
    char got[256];
    rt_request any = {0};
    int i = rt_pool_pick(p, &any, got, sizeof got, NULL);
    assert_true(i >= 0 && i < RT_MAX_BACKENDS);
    done(p, i, -1, -1, (rt_pick){0});
    rt_pool *both[2] = {p, q};
    const char *names[2] = {"base", "tuned"};
    llm_strbuf m = {0};
    rt_pool_metrics(both, names, 2, &m);
    assert_false(m.failed);
    int heads = 0;
    for (const char *at = m.p; (at = strstr(at, "# TYPE llm_router_backend_up ")); at++) heads++;
    assert_int_equal(heads, 1);
    assert_non_null(strstr(m.p, "llm_router_backend_up{route=\"tuned\",backend=\"a\"} 1\n"));
    assert_non_null(strstr(m.p, "llm_router_canary_weight{route=\"base\"} 0\n"));
    assert_non_null(strstr(m.p, "llm_router_revision_ttfb_seconds_count{route=\"tuned\",revision=\"canary\"} 0\n"));
    llm_strbuf_free(&m);
    rt_pool_free(p);
    rt_pool_free(q);
}

/* An empty gateway table of cache-aware pools. */
static rt_routes *new_table(void)
{
    rt_routes *t;
    llm_error err = {0};
    rt_pool_config pc = {.policy = RT_CACHE_AWARE};
    assert_int_equal(rt_routes_new(&pc, &t, &err), LLM_OK);
    return t;
}

static llm_status load(rt_routes *t, const char *json, llm_error *err)
{
    return rt_routes_load(t, json, strlen(json), err);
}

static void adapter_pods(rt_pool *p)
{
    const char *names[] = {"tuned-a", "tuned-b"};
    size_t lens[] = {7, 7};
    rt_pool_report_adapters(p, 0, names, lens, 2);
}

/* The gateway's table from a ConfigMap: a model picks its route by name
 * (the pods' own adapter claims draw nothing); discovery and weight
 * ConfigMaps reach the routes that follow them; a bad table is refused
 * naming the entry and field, and changes nothing; a reload keeps the
 * routes that stay (their pools' state) and a route dropped while a
 * request holds it lives until put. */
static void test_routes(void **st)
{
    (void)st;
    llm_error err = {0};
    rt_routes *t = new_table();
    rt_routes_from_kube(t);
    const char *two = "{\"routes\":[{\"name\":\"base\",\"models\":[\"gemma\",\"gemma-3\"],\"service\":\"gemma\"},"
                      "{\"name\":\"tuned\",\"models\":[\"llama\",\"tuned-a\"],\"service\":\"llama\","
                      "\"canaryService\":\"llama-canary-backends\",\"weightConfigMap\":\"llama-router\"}]}";
    assert_int_equal(load(t, two, &err), LLM_OK);
    assert_int_equal(rt_routes_count(t), 2);
    rt_route *base = rt_routes_find(t, "gemma-3"), *tuned = rt_routes_find(t, "llama");
    assert_non_null(base);
    assert_non_null(tuned);
    assert_string_equal(rt_route_name(base), "base");
    /* discovery and the canary's ConfigMap reach the routes that follow them */
    const char *urls[] = {"pod-1=http://10.0.1.1:1", "pod-2=http://10.0.1.2:1"};
    assert_true(rt_routes_uses_service(t, "llama-canary-backends"));
    assert_false(rt_routes_uses_service(t, "nope"));
    rt_routes_publish(t, "gemma", 0, urls, 1);
    rt_routes_publish(t, "llama", 0, urls, 2);
    rt_routes_publish(t, "llama", 1, urls, 1); /* not its canary service: nothing */
    assert_int_equal(rt_pool_size(rt_route_pool(base)), 1);
    assert_int_equal(rt_pool_size(rt_route_pool(tuned)), 2);
    rt_routes_set_weight(t, "llama-router", 30);
    assert_int_equal(rt_pool_weight(rt_route_pool(tuned)), 30);
    /* a pod claiming an adapter the table does not list draws nothing */
    adapter_pods(rt_route_pool(tuned));
    assert_ptr_equal(rt_routes_find(t, "tuned-a"), tuned), rt_routes_put(t, tuned);
    assert_null(rt_routes_find(t, "tuned-b"));
    char *list = rt_routes_models_json(t);
    assert_non_null(list);
    assert_non_null(strstr(list, "{\"id\":\"gemma-3\",\"object\":\"model\",\"owned_by\":\"base\"}"));
    assert_null(strstr(list, "tuned-b"));
    free(list);
    char msg[512];
    rt_routes_not_served(t, "nope\n", msg, sizeof msg);
    assert_string_equal(msg, "model 'nope?' is not served here; served: gemma, gemma-3, llama, tuned-a");
    /* bad tables: refused, naming where; the table stays */
    static const struct { const char *json, *says; } bad[] = {
        {"[]", "{\"routes\": [...]}"},
        {"{\"routes\":[{\"name\":\"a b\",\"models\":[\"m\"]}]}", "routes[0].name"},
        {"{\"routes\":[{\"name\":\"a\",\"models\":[]}]}", "routes[0] (a).models: 1-64"},
        {"{\"routes\":[{\"name\":\"a\",\"models\":[\"m\\u0001\"]}]}", "no control characters"},
        {"{\"routes\":[{\"name\":\"a\",\"models\":[\"m\"]},{\"name\":\"b\",\"models\":[\"m\"]}]}",
         "routes[1] (b).models[0]: m is served by routes[0] too"},
        {"{\"routes\":[{\"name\":\"a\",\"models\":[\"m\",\"m\"]}]}", "m is served by routes[0] too"},
        {"{\"routes\":[{\"name\":\"a\",\"models\":[\"m\"]},{\"name\":\"a\",\"models\":[\"n\"]}]}", "a is taken"},
        {"{\"routes\":[{\"name\":\"a\",\"models\":[\"m\"],\"service\":\"UPPER\"}]}", "routes[0].service"},
        {"{\"routes\":[{\"name\":\"a\",\"models\":[\"m\"],\"metricsPort\":0}]}", "metricsPort: a port"},
        /* a ConfigMap (anyone who may edit it) cannot point a route at a URL of its choice */
        {"{\"routes\":[{\"name\":\"a\",\"models\":[\"m\"],\"backends\":[\"http://169.254.169.254\"]}]}",
         "a table from a ConfigMap names Services, not backends"},
        {"{\"routes\":[{\"name\":\"a\",\"models\":[\"m\"],\"weight\":5,\"weightConfigMap\":\"c\"}]}",
         "without weightConfigMap"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(load(t, bad[i].json, &err), LLM_ERR_INVALID_ARG);
        if (!strstr(err.msg, bad[i].says))
            fail_msg("%s: error '%s' does not say '%s'", bad[i].json, err.msg, bad[i].says);
        assert_int_equal(rt_routes_count(t), 2);
    }
    /* a reload: tuned stays (its backends and weight with it), base goes while held, a new route comes */
    const char *next = "{\"routes\":[{\"name\":\"tuned\",\"models\":[\"llama\",\"llama-2\"],\"service\":\"llama\","
                       "\"weightConfigMap\":\"llama-router\"},{\"name\":\"new\",\"models\":[\"gemma\"]}]}";
    assert_int_equal(load(t, next, &err), LLM_OK);
    rt_route *again = rt_routes_find(t, "llama-2"), *moved = rt_routes_find(t, "gemma");
    assert_ptr_equal(again, tuned);
    assert_int_equal(rt_pool_size(rt_route_pool(again)), 2);
    assert_int_equal(rt_pool_weight(rt_route_pool(again)), 30);
    assert_string_equal(rt_route_name(moved), "new");
    assert_null(rt_routes_find(t, "gemma-3"));
    assert_int_equal(rt_pool_size(rt_route_pool(base)), 1); /* still usable by its request */
    rt_routes_put(t, base);
    rt_routes_put(t, again), rt_routes_put(t, moved), rt_routes_put(t, tuned);
    rt_routes_free(t);
}

/* A gateway is ready with no backend only where a route holds requests
 * and its Service's endpoints were listed once (found none): not before
 * discovery ran, not for a route that does not hold. */
static void test_routes_wakeable(void **st)
{
    (void)st;
    llm_error err = {0};
    rt_routes *t = new_table();
    rt_routes_from_kube(t);
    assert_int_equal(load(t, "{\"routes\":[{\"name\":\"a\",\"models\":[\"a\"],\"service\":\"a\"},"
                             "{\"name\":\"z\",\"models\":[\"z\"],\"service\":\"z\",\"holdSeconds\":60}]}", &err),
                     LLM_OK);
    assert_false(rt_routes_wakeable(t)); /* nothing listed yet */
    rt_routes_publish(t, "a", 0, NULL, 0);
    assert_false(rt_routes_wakeable(t)); /* a does not hold */
    rt_routes_publish(t, "z", 1, NULL, 0);
    assert_false(rt_routes_wakeable(t)); /* (z's canary Service) */
    rt_routes_publish(t, "z", 0, NULL, 0);
    assert_true(rt_routes_wakeable(t)); /* z listed, none there: it holds and wakes */
    rt_routes_free(t);
}

/* A table from a file: static backends and weights, and the adapters its
 * pods report loaded are served too; Services (nothing follows them) and
 * more than RT_MAX_BACKENDS backends in a route are refused. */
static void test_routes_from_file(void **st)
{
    (void)st;
    llm_error err = {0};
    rt_routes *t = new_table();
    assert_int_equal(load(t, "{\"routes\":[{\"name\":\"base\",\"models\":[\"gemma\"],\"backends\":"
                             "[\"p1=http://10.0.0.1:1\"],\"canaryBackends\":[\"p2=http://10.0.0.2:1\"],\"weight\":20}]}",
                          &err), LLM_OK);
    rt_route *base = rt_routes_find(t, "gemma");
    assert_int_equal(rt_pool_size(rt_route_pool(base)), 2);
    assert_int_equal(rt_pool_weight(rt_route_pool(base)), 20);
    adapter_pods(rt_route_pool(base));
    rt_route *a = rt_routes_find(t, "tuned-b");
    assert_ptr_equal(a, base);
    char *list = rt_routes_models_json(t);
    assert_non_null(strstr(list, "{\"id\":\"tuned-a\",\"object\":\"model\",\"owned_by\":\"base\"}"));
    free(list);
    rt_routes_put(t, a), rt_routes_put(t, base);
    assert_int_equal(load(t, "{\"routes\":[{\"name\":\"a\",\"models\":[\"m\"],\"service\":\"s\"}]}", &err),
                     LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "only a table from a ConfigMap"));
    size_t cap = 64 * (RT_MAX_BACKENDS + 2) + 256, at;
    char *json = malloc(cap);
    assert_non_null(json);
    at = (size_t)snprintf(json, cap, "{\"routes\":[{\"name\":\"a\",\"models\":[\"m\"],\"backends\":[");
    for (int i = 0; i < RT_MAX_BACKENDS; i++)
        at += (size_t)snprintf(json + at, cap - at, "%s\"http://10.2.%d.%d:1\"", i ? "," : "", i / 200, i % 200);
    snprintf(json + at, cap - at, "],\"canaryBackends\":[\"http://10.3.0.1:1\"]}]}");
    assert_int_equal(load(t, json, &err), LLM_ERR_INVALID_ARG); /* one pool holds both revisions */
    assert_non_null(strstr(err.msg, "backends in both revisions"));
    assert_int_equal(rt_routes_count(t), 1);
    free(json);
    rt_routes_free(t);
}

/* A thousand models behind one gateway: RT_MAX_ROUTES routes load, each
 * found, in bounded memory (pools start empty); one more is refused. */
static void test_routes_many(void **st)
{
    (void)st;
    llm_error err = {0};
    rt_routes *t = new_table();
    size_t cap = (size_t)(RT_MAX_ROUTES + 1) * 64 + 32, at = 0;
    char *json = malloc(cap);
    assert_non_null(json);
    for (int n = RT_MAX_ROUTES; n <= RT_MAX_ROUTES + 1; n++) {
        at = (size_t)snprintf(json, cap, "{\"routes\":[");
        for (int i = 0; i < n; i++)
            at += (size_t)snprintf(json + at, cap - at, "%s{\"name\":\"r%d\",\"models\":[\"m%d\"]}", i ? "," : "", i, i);
        snprintf(json + at, cap - at, "]}");
        struct rusage before, after;
        getrusage(RUSAGE_SELF, &before);
        llm_status got = load(t, json, &err);
        getrusage(RUSAGE_SELF, &after);
        if (n == RT_MAX_ROUTES) {
            assert_int_equal(got, LLM_OK);
            assert_true(after.ru_maxrss - before.ru_maxrss < 32 * 1024); /* KiB: under 32 MiB for 1024 routes */
        } else {
            assert_int_equal(got, LLM_ERR_INVALID_ARG);
        }
    }
    assert_int_equal(rt_routes_count(t), RT_MAX_ROUTES);
    for (int i = 0; i < RT_MAX_ROUTES; i += 97) {
        char m[16];
        snprintf(m, sizeof m, "m%d", i);
        rt_route *r = rt_routes_find(t, m);
        assert_non_null(r);
        rt_routes_put(t, r);
    }
    free(json);
    rt_routes_free(t);
}

/* A pod that restarted (its prompt counter went back) has an empty cache:
 * its index is emptied, and the prefix no longer pulls the request there. */
static void test_restart_forgets(void **st)
{
    (void)st;
    rt_pool *p = three_pods();
    char *t1 = chat("m", 4000, 1, NULL);
    chain_of(t1, NULL, &g_a);
    rt_pick pred;
    int pod = pick(p, &g_a, &pred);
    done(p, pod, 1100, 0, pred);
    rt_pool_report_cache(p, pod, 0, 5000);
    assert_int_equal(pick(p, &g_a, &pred), pod); /* the prefix pulls */
    assert_true(pred.predicted > 0.9);
    done(p, pod, 1100, 1090, pred);
    rt_pool_report_cache(p, pod, 0, 6100); /* counting on: same process */
    assert_int_equal(pick(p, &g_a, &pred), pod);
    done(p, pod, 1100, 1090, pred);
    rt_pool_report_cache(p, pod, 0, 40); /* back near 0: restarted */
    llm_strbuf m = {0};
    rt_pool_metrics(&p, NULL, 1, &m);
    char series[96];
    snprintf(series, sizeof series, "llm_router_backend_prefix_links{backend=\"%c\"} 0\n", 'a' + pod);
    assert_non_null(strstr(m.p, series));
    llm_strbuf_free(&m);
    pick(p, &g_a, &pred);
    assert_true(pred.predicted == 0); /* nothing believed held anywhere */
    free(t1);
    rt_pool_free(p);
}

static double pending_of(rt_pool *p, int pod)
{
    llm_strbuf m = {0};
    char series[96];
    rt_pool_metrics(&p, NULL, 1, &m);
    snprintf(series, sizeof series, "llm_router_backend_pending_prompt_bytes{backend=\"%c\"} ", 'a' + pod);
    const char *at = m.p ? strstr(m.p, series) : NULL;
    assert_non_null(at);
    double v = strtod(at + strlen(series), NULL);
    llm_strbuf_free(&m);
    return v;
}

/* A request does not wait behind another's long prefill when a pod with
 * less to compute can take it: P holds a conversation's history, then
 * gets a 16 KB prompt no one holds; the conversation's next turn goes to
 * the other pod (a 4.6 KB prefill there, against 16 KB queued at P) until
 * P's answer starts, then back to P. */
static void test_pending_prefill(void **st)
{
    (void)st;
    rt_pool *p;
    llm_error err = {0};
    rt_pool_config c = {.policy = RT_CACHE_AWARE};
    assert_int_equal(rt_pool_new(&c, &p, &err), LLM_OK);
    const char *urls[] = {"a=http://10.0.0.1:1", "b=http://10.0.0.2:1"};
    assert_int_equal(rt_pool_set(p, 0, urls, 2, &err), LLM_OK);
    static rt_prefix_chain big;
    char *t1 = chat("m", 4000, 1, NULL), *t2 = chat("m", 4000, 2, NULL), *tb = chat("m", 16000, 1, "other");
    chain_of(t1, NULL, &g_a);
    chain_of(t2, NULL, &g_b);
    chain_of(tb, NULL, &big);
    rt_pick first, long_one, next, after;
    int pod = pick(p, &g_a, &first), other = !pod;
    assert_true(first.pending > 4000); /* nothing held: all of it to compute */
    assert_true(pending_of(p, pod) == first.pending);
    rt_pool_started(p, pod, first.pending);
    assert_true(pending_of(p, pod) == 0);
    done(p, pod, 1100, 0, (rt_pick){first.predicted, 0});
    rt_pool_report(p, other, 1, 3, 0, 0); /* the other pod has 3 waiting: the long prompt goes to P */
    assert_int_equal(pick(p, &big, &long_one), pod);
    assert_true(long_one.pending > 16000 && pending_of(p, pod) == long_one.pending);
    /* without the pending bytes P would cost a queued request and 600 bytes; with them, 16 KB more */
    assert_int_equal(pick(p, &g_b, &next), other);
    assert_true(next.pending > 4000);
    rt_pool_started(p, pod, long_one.pending); /* P's long prompt is computed */
    assert_int_equal(pick(p, &g_b, &after), pod);
    assert_true(after.pending < 1000); /* mostly held */
    done(p, pod, 4000, 0, (rt_pick){0});
    assert_true(pending_of(p, pod) == after.pending); /* what is still in flight there */
    done(p, other, 1200, 0, next);
    done(p, pod, 1200, 1000, after);
    assert_true(pending_of(p, pod) == 0 && pending_of(p, other) == 0);
    /* a whole answer's first byte is its last: its bytes never count */
    char url[256];
    rt_request whole = {.chain = &big};
    rt_pick w;
    int i = rt_pool_pick(p, &whole, url, sizeof url, &w);
    assert_true(i >= 0 && w.pending == 0 && pending_of(p, i) == 0);
    done(p, i, 4000, 0, w);
    /* one request counts RT_POOL_PENDING_MAX at most (a prompt of padding) */
    char *huge = chat("m", 300000, 1, "pad");
    static rt_prefix_chain hc;
    chain_of(huge, NULL, &hc);
    i = pick(p, &hc, &w);
    assert_true(w.pending == RT_POOL_PENDING_MAX && pending_of(p, i) == RT_POOL_PENDING_MAX);
    done(p, i, 4000, 0, w);
    free(huge);
    free(t1), free(t2), free(tb);
    rt_pool_free(p);
}

/* The four policies by name, and nothing else. */
static void test_policy_names(void **st)
{
    (void)st;
    const char *names[] = {"least-loaded", "round-robin", "prefix-hash", "cache-aware"};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(rt_policy_of(names[k]), k);
        assert_string_equal(rt_policy_name((rt_policy)k), names[k]);
    }
    assert_int_equal(rt_policy_of("cache"), -1);
    assert_int_equal(rt_policy_of(NULL), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain),          cmocka_unit_test(test_chain_bounded),
        cmocka_unit_test(test_index_vs_lru),   cmocka_unit_test(test_index_prefix),
        cmocka_unit_test(test_cache_aware_pick), cmocka_unit_test(test_trust),
        cmocka_unit_test(test_policy_names),   cmocka_unit_test(test_pool_grows_and_metrics_of_two),
        cmocka_unit_test(test_routes), cmocka_unit_test(test_routes_wakeable), cmocka_unit_test(test_routes_from_file),
        cmocka_unit_test(test_routes_many),    cmocka_unit_test(test_restart_forgets),
        cmocka_unit_test(test_pending_prefill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
