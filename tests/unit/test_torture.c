/* test_torture.c - allocation-failure torture (curl's habit). malloc,
 * calloc, realloc, strdup, aligned_alloc and free of every object linked
 * here are wrapped (ld --wrap, see the Makefile), and jansson allocates
 * through llm_json's hooks (llm_json_init), so through them too.
 * Each scenario first runs clean to count its allocations, then once for
 * every N with the Nth allocation failing (any thread: the engine
 * thread's allocations count too), and once more with every allocation
 * from the Nth on failing. Every run must end with an error or the whole
 * right answer - never a crash, hang, lost event or partial answer -
 * leave no allocation behind (a live count kept by the wrappers; ASan
 * checks the rest in make asan), and leave the engine able to give the
 * same answer again.
 *
 * Scenarios: engine open, submit and the steps of a request (n = 2, stop
 * strings, logprobs, a block table that grows), cancel, a LoRA adapter
 * loaded, added, run and removed, llm-server's
 * request parsing and error bodies, and llm-server's whole HTTP path run
 * in-process (a chat with logprobs, a completion stream with usage, a
 * chat stream). The test itself allocates nothing while a failure is
 * armed. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include <jansson.h>

#include "testutil.h"

#include "llm/chat.h"
#include "llm/engine.h"
#include "llm/json.h"
#include "llm/mkmodel.h"
#include <civetweb.h>

#include "http_guard.h"
#include "srv.h"
#include "llm/schema.h"
#include "llm/gmatch.h"

/* ---- the allocator hook ---------------------------------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t k);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
void __real_free(void *p);

static atomic_long g_count;   /* allocations since arm() */
static atomic_long g_fail_at; /* fail the allocation with this count (1-based); 0: never */
static atomic_int g_sustained; /* 1: fail that one and every later one (memory stays short) */
static atomic_long g_live;    /* our blocks not yet freed */
static atomic_long g_failed;  /* allocations failed on purpose */
static atomic_long g_window;  /* most allocations seen between an arm() and its disarm() */

/* Set while jansson's parser runs: it is not failed there. Debian's
 * jansson 2.14 aborts when its lexer cannot grow its token buffer (the
 * failed growth is ignored, then an assert fires), so a failure inside
 * json_loadb tests jansson, not us. Everything around it is failed. */
static _Thread_local int g_in_jansson_parse;

json_t *__real_json_loadb(const char *b, size_t n, size_t flags, json_error_t *e);
json_t *__wrap_json_loadb(const char *b, size_t n, size_t flags, json_error_t *e)
{
    g_in_jansson_parse = 1;
    json_t *j = __real_json_loadb(b, n, flags, e);
    g_in_jansson_parse = 0;
    return j;
}

static int fail_now(void)
{
    if (g_in_jansson_parse)
        return 0;
    long k = atomic_fetch_add(&g_count, 1) + 1, at = atomic_load(&g_fail_at);
    if (at && (k == at || (k > at && atomic_load(&g_sustained)))) {
        atomic_fetch_add(&g_failed, 1);
        return 1;
    }
    return 0;
}

static void *counted(void *p)
{
    if (p)
        atomic_fetch_add(&g_live, 1);
    return p;
}

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : counted(__real_malloc(n)); }
void *__wrap_calloc(size_t n, size_t k) { return fail_now() ? NULL : counted(__real_calloc(n, k)); }
void *__wrap_aligned_alloc(size_t a, size_t n) { return fail_now() ? NULL : counted(__real_aligned_alloc(a, n)); }

void *__wrap_realloc(void *p, size_t n)
{
    if (fail_now())
        return NULL;
    void *q = __real_realloc(p, n);
    return p ? q : counted(q);
}

void __wrap_free(void *p)
{
    if (p)
        atomic_fetch_sub(&g_live, 1);
    __real_free(p);
}

char *__wrap_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = __wrap_malloc(n);
    return d ? memcpy(d, s, n) : NULL;
}

static void arm(long n)
{
    atomic_store(&g_count, 0);
    atomic_store(&g_fail_at, n);
}

static void disarm(void)
{
    atomic_store(&g_fail_at, 0);
    long k = atomic_load(&g_count);
    if (k > atomic_load(&g_window))
        atomic_store(&g_window, k);
}

/* Runs scenario clean, then with each allocation failing in turn; the live
 * count must come back to where it was every time. */
static void torture(const char *name, void (*scenario)(long n))
{
    scenario(0); /* warm-up: what the backend and libraries keep after first use is not a leak */
    long base = atomic_load(&g_live);
    atomic_store(&g_window, 0);
    scenario(0);
    long total = atomic_load(&g_window), failed0 = atomic_load(&g_failed);
    assert_int_equal(atomic_load(&g_live), base);
    assert_true(total > 0);
    for (long n = 1; n <= total + 2; n++) {
        scenario(n);
        if (atomic_load(&g_live) != base)
            fail_msg("%s: failing allocation %ld of %ld left %ld blocks behind", name, n, total,
                     atomic_load(&g_live) - base);
    }
    print_message("%s: %ld allocations, each failed once (%ld failures seen)\n", name, total,
                  atomic_load(&g_failed) - failed0);
}

/* ---- engine scenarios ------------------------------------------------------ */

static test_tiny g_tiny; /* the model and backend below */
static llm_model *g_m;
static llm_backend *g_b;
/* What a request's completions gave: ids, logprobs, text (with the DONE's). */
typedef struct answer {
    int32_t tok[2][8];
    float lp[2][8];
    char text[2][512];
    size_t len[2];
} answer;
static answer g_ref; /* the request's answer, clean */
static const char *const g_stops[] = {"zq", "the cat"};

/* Block size 4: a sequence's table outgrows its first 8 entries, so the
 * scheduler meets a failed table growth too. */
static llm_engine *open_clean(void)
{
    llm_engine_config c = {.model = g_m, .backend = g_b, .n_ctx = 128, .max_seqs = 4, .max_batch_tokens = 16, .block_size = 4};
    llm_engine *e = NULL;
    llm_error err = {0};
    if (llm_engine_open(&c, &e, &err))
        fail_msg("open: %s", err.msg);
    return e;
}

/* n = 2 seeded completions with logprobs and stop strings; with a 30-token
 * prompt and 4-token blocks the table grows past its first 8 while
 * decoding. */
static llm_request request(const int32_t *prompt, int n)
{
    llm_request rq = {.tokens = prompt, .n_tokens = n, .sampling = llm_sampling_default(), .max_tokens = 8, .n = 2,
                      .stop = g_stops, .n_stop = 2, .ignore_eos = 1};
    rq.sampling.temperature = 0.8f;
    rq.sampling.seed = 7;
    rq.sampling.n_logprobs = 2;
    return rq;
}

static const int32_t P[40] = {5, 9, 200, 31, 7, 7, 400, 12, 99, 3, 18, 250, 77, 1, 64, 300, 8, 42, 19, 128,
                              6, 11, 210, 33, 71, 17, 401, 13, 98, 4, 28, 251, 78, 2, 65, 301, 9, 43, 20, 129};

/* Reads id to its end: 1 when every completion is DONE (tokens into out,
 * when given), 0 on an ERROR event. A wait of 60 s is a lost event. */
static int drain(llm_engine *e, llm_request_id id, answer *out)
{
    int done = 0, n_tok[2] = {0, 0};
    memset(out, 0, sizeof *out);
    while (done < 2) {
        llm_event ev;
        llm_status st = llm_engine_next(e, id, &ev, 60000);
        if (st)
            fail_msg("next: %s (an event was lost)", llm_status_str(st));
        if (ev.type == LLM_EVENT_ERROR) {
            if (!ev.error.msg[0])
                fail_msg("an error event without a message");
            return 0;
        }
        int i = ev.index;
        if (ev.type == LLM_EVENT_TOKEN && n_tok[i] < 8) {
            out->lp[i][n_tok[i]] = ev.sample.logprob;
            out->tok[i][n_tok[i]++] = ev.token;
        }
        if (out->len[i] + ev.text_len < sizeof out->text[i]) {
            memcpy(out->text[i] + out->len[i], ev.text, ev.text_len);
            out->len[i] += ev.text_len;
        }
        done += ev.type == LLM_EVENT_DONE;
        llm_event_clear(&ev);
    }
    return 1;
}

/* The engine still serves: the same request gives the same tokens. */
static void still_serves(llm_engine *e)
{
    llm_request rq = request(P, 30);
    llm_request_id id;
    llm_error err = {0};
    static answer got;
    if (llm_engine_submit(e, &rq, &id, &err))
        fail_msg("submit after the failure: %s", err.msg);
    if (!drain(e, id, &got))
        fail_msg("the request after the failure failed");
    assert_memory_equal(&got, &g_ref, sizeof got);
    llm_stats st;
    llm_engine_stats(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
}

static void sc_open(long n)
{
    llm_engine_config c = {.model = g_m, .backend = g_b, .n_ctx = 128, .max_seqs = 4, .max_batch_tokens = 16, .block_size = 4};
    llm_engine *e = NULL;
    llm_error err = {0};
    arm(n);
    llm_status st = llm_engine_open(&c, &e, &err);
    disarm();
    if (st) {
        assert_null(e);
        assert_true(err.msg[0] != 0);
        return;
    }
    still_serves(e);
    llm_engine_close(e);
}

/* rq submitted and read to its end with the failure anywhere in them: an
 * error, or (ref's) whole right answer; the clean run (n 0) records ref. */
static void submit_and_read(long n, const llm_request *rq, answer *ref)
{
    llm_engine *e = open_clean();
    llm_request_id id;
    llm_error err = {0};
    arm(n);
    llm_status st = llm_engine_submit(e, rq, &id, &err);
    if (st) {
        disarm();
        assert_true(err.msg[0] != 0);
    } else {
        static answer got;
        int ok = drain(e, id, n ? &got : ref);
        disarm();
        if (ok && n)
            assert_memory_equal(&got, ref, sizeof got); /* a success is the whole right answer */
        if (!n && !ok)
            fail_msg("the clean run failed");
    }
    still_serves(e);
    llm_engine_close(e);
}

/* Submit and the steps that follow, with the failure anywhere in them. */
static void sc_request(long n)
{
    llm_request rq = request(P, 30);
    submit_and_read(n, &rq, &g_ref);
}

/* A request cancelled after its first event, the failure anywhere. */
static void sc_cancel(long n)
{
    llm_engine *e = open_clean();
    llm_request rq = request(P, 30);
    llm_request_id id;
    llm_error err = {0};
    arm(n);
    if (!llm_engine_submit(e, &rq, &id, &err)) {
        llm_event ev;
        if (llm_engine_next(e, id, &ev, 60000) == LLM_OK)
            llm_event_clear(&ev);
        llm_engine_cancel(e, id);
    }
    disarm();
    still_serves(e);
    llm_engine_close(e);
}

/* A constrained request (the JSON object grammar, a logit bias): the
 * grammar compiled, the vocabulary index and mask cache built by the first
 * one, masks and the matcher's compactions while decoding. */
static answer g_ref_json;
static llm_logit_bias g_bias[1] = {{11, 2.5f}};

static void sc_constrained(long n)
{
    llm_request rq = request(P, 30);
    rq.grammar = llm_gbnf_json, rq.grammar_len = strlen(llm_gbnf_json), rq.grammar_root = "jsonobject";
    rq.sampling.bias = g_bias, rq.sampling.n_bias = 1;
    rq.n_stop = 0;
    submit_and_read(n, &rq, &g_ref_json);
}

/* An adapter read from its file, added, a request under it, removed and
 * freed, with the failure anywhere in them: each step fails with a
 * message or the request gives its whole clean answer; the engine keeps
 * no adapter and still gives the base's answer. */
static char g_lora_path[256];
static answer g_ref_lora;

static void sc_lora(long n)
{
    llm_engine *e = open_clean();
    llm_lora *l = NULL;
    llm_error err = {0};
    arm(n);
    llm_status st = llm_lora_load(g_lora_path, g_m, 0, &l, &err);
    if (!st && (st = llm_engine_lora_add(e, l, &err))) {
        assert_int_equal(llm_engine_lora_requests(e, l), -1); /* a failed add keeps nothing of it */
        llm_lora_free(l);
        l = NULL;
    }
    if (st) {
        disarm();
        assert_null(l);
        assert_true(err.msg[0] != 0);
        if (!n)
            fail_msg("the clean run failed: %s", err.msg);
    } else {
        llm_request rq = request(P, 30);
        rq.lora = l, rq.lora_scale = 1.0f;
        llm_request_id id;
        if (llm_engine_submit(e, &rq, &id, &err)) {
            assert_true(err.msg[0] != 0);
        } else {
            static answer got;
            int ok = drain(e, id, n ? &got : &g_ref_lora);
            if (ok && n)
                assert_memory_equal(&got, &g_ref_lora, sizeof got);
            if (!n && !ok)
                fail_msg("the clean run failed");
        }
        llm_engine_lora_remove(e, l);
        disarm();
        assert_int_equal(llm_engine_lora_requests(e, l), -1);
        llm_lora_free(l);
    }
    still_serves(e);
    llm_engine_close(e);
}

/* The grammar library alone, and llm-server's JSON Schema conversion. */
static void sc_grammar(long n)
{
    static const char schema_text[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-5,"
                                      "\"maximum\":120},\"b\":{\"type\":\"string\",\"pattern\":\"^[a-z]+\\\\d?$\"},\"c\":{"
                                      "\"$ref\":\"#/$defs/d\"}},\"required\":[\"a\"],\"$defs\":{\"d\":{\"enum\":[1,\"x\"]}}}";
    json_t *schema = json_loads(schema_text, 0, NULL);
    assert_non_null(schema);
    llm_grammar *g = NULL;
    llm_gmatch_vocab *gv = NULL;
    llm_gmatch *m = NULL;
    llm_error err = {0};
    llm_error se = {0};
    uint32_t *allow = __real_malloc(sizeof(uint32_t) * (size_t)(llm_vocab_n(g_m->vocab) + 31) / 32);
    arm(n);
    char *text = NULL;
    llm_schema_grammar(schema, &text, &se);
    llm_status st = text ? llm_grammar_compile(text, strlen(text), NULL, &g, &err) : LLM_ERR_NOMEM;
    if (!st)
        st = llm_gmatch_vocab_new(g_m->vocab, &gv, &err);
    if (!st)
        st = llm_gmatch_new(g, gv, NULL, 0, &m, &err);
    if (!st) /* a binding budget: the cache keeps each mask's token lists (their allocation may fail) */
        llm_gmatch_set_budget(m, 9);
    for (int k = 0; !st && k < 3; k++) {
        st = llm_gmatch_mask(m, allow, &err);
        if (!st)
            st = llm_gmatch_feed(m, k == 0 ? "{" : k == 1 ? "\"a\": " : "12", k == 0 ? 1 : k == 1 ? 5 : 2, &err);
    }
    disarm();
    if (!n && (st || !text))
        fail_msg("the clean run failed: %s %s", err.msg, se.msg);
    if (!text && (se.code != LLM_ERR_NOMEM || !se.msg[0]))
        fail_msg("a failed allocation in the schema conversion gave %s: %s", llm_status_str(se.code), se.msg);
    if (text && st && (st != LLM_ERR_NOMEM || !err.msg[0]))
        fail_msg("a failed allocation gave %s: %s", llm_status_str(st), err.msg);
    llm_gmatch_free(m);
    llm_gmatch_vocab_free(gv);
    llm_grammar_free(g);
    free(text);
    __real_free(allow);
    json_decref(schema);
}

/* ---- llm-server's request path ---------------------------------------------- */

static const char CHAT[] =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":"
    "[{\"type\":\"text\",\"text\":\"hello\"},{\"type\":\"text\",\"text\":\" there\"}]}],\"max_tokens\":5,"
    "\"stop\":[\"a\",\"bc\"],\"logprobs\":true,\"top_logprobs\":2,\"n\":2,\"seed\":3,"
    "\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
static const char COMPL[] = "{\"model\":\"m\",\"prompt\":[1,2,3,4],\"max_tokens\":3,\"logprobs\":2,\"stop\":\"x\"}";

static void sc_parse(long n)
{
    static srv s;
    snprintf(s.name, sizeof s.name, "m");
    s.cfg.max_answer_bytes = 1 << 26;
    static char none[] = "";
    static srv_chat chatml = {.family = LLM_CHAT_CHATML, .bos = none, .eos = none}, jinja = {.bos = none, .eos = none};
    static const char tmpl[] = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                               "<|im_start|>{{ m.role }}\n{{ m.content | trim }}{{ m | tojson }}<|im_end|>\n{% endfor %}"
                               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{{ ns.n }}";
    if (!jinja.tmpl && llm_jinja_compile(tmpl, strlen(tmpl), &jinja.tmpl, NULL))
        fail_msg("the torture template does not compile");
    const char *bodies[] = {CHAT, COMPL, "{\"model\":\"m\",\"prompt\":\"hi\",\"temperature\":7}", CHAT};
    for (int k = 0; k < 4; k++) {
        srv_completion c;
        srv_err e = {0};
        arm(n);
        int rc = srv_parse_completion(&s, k == 3 ? &jinja : &chatml, g_m->vocab, bodies[k], strlen(bodies[k]),
                                      k == 0 || k == 3, &c, &e);
        char *body = rc ? srv_err_body(&e) : NULL;
        disarm();
        if (!n)
            assert_int_equal(rc != 0, k == 2); /* clean: the third is refused (temperature), the others parse */
        if (!n && k == 3)
            assert_non_null(strstr(c.prompt, "<|im_start|>assistant\n"));
        if (rc) {
            assert_true(e.status >= 400 && e.status <= 599 && e.msg[0]);
            if (n && e.status == 400 && k != 2)
                fail_msg("body %d: a failed allocation reported as a bad request: %s", k, e.msg);
        }
        free(body); /* NULL when its own allocation failed: the server then sends a fixed body */
        srv_completion_free(&c);
    }
}

/* ---- llm-server's whole request path, in-process ------------------------------ */

static srv g_srv;

/* A port nobody listens on now (the server binds it right after). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &n))
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void server_start(void)
{
    char port[16];
    snprintf(port, sizeof port, "%d", free_port());
    char *argv[] = {"llm-server", "-m", g_tiny.path, "--host", "127.0.0.1", "--port", port, "--max_connections", "4", NULL};
    int help = 0;
    llm_error err = {0};
    if (srv_config_load(9, argv, &g_srv.cfg, &help, &err))
        fail_msg("config: %s", err.msg);
    srv_metrics_init(&g_srv.metrics);
    srv_canary_init(&g_srv);
    g_srv.model = g_m;
    g_srv.engine = open_clean();
    if (!(g_srv.chat = srv_chat_new(g_m, "auto", NULL, &err)))
        fail_msg("chat: %s", err.msg);
    snprintf(g_srv.name, sizeof g_srv.name, "m");
    atomic_store(&g_srv.phase, SRV_READY);
    if (srv_http_start(&g_srv, &err))
        fail_msg("http: %s", err.msg);
}

static void server_stop(void)
{
    http_guard_stop(g_srv.http);
    srv_canary_free(&g_srv);
    llm_engine_close(g_srv.engine);
    srv_chat_free(g_srv.chat);
    srv_metrics_free(&g_srv.metrics);
    srv_config_free(&g_srv.cfg);
    memset(&g_srv, 0, sizeof g_srv);
}

/* A chunked body (a stream) in place as its plain bytes. */
static void dechunk(char *resp)
{
    char *body = strstr(resp, "\r\n\r\n"), *out, *p;
    if (!body || !strstr(resp, "Transfer-Encoding: chunked") || strstr(resp, "Transfer-Encoding: chunked") > body)
        return;
    for (out = p = body + 4;;) {
        char *end;
        unsigned long n = strtoul(p, &end, 16);
        if (end == p || strncmp(end, "\r\n", 2) || n == 0 || strlen(end + 2) < n + 2)
            break;
        memmove(out, end + 2, n);
        out += n;
        p = end + 2 + n + 2;
    }
    *out = 0;
}

/* POSTs body to path with a plain socket (nothing allocated here) and
 * reads the whole answer into resp (Connection: close). Returns the
 * status, 0 when the exchange failed. */
static int post(const char *path, const char *body, char *resp, size_t cap)
{
    char head[512];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_srv.cfg.port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    int hn = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n", path, strlen(body));
    size_t got = 0;
    if (write(fd, head, (size_t)hn) == hn && write(fd, body, strlen(body)) == (ssize_t)strlen(body))
        for (ssize_t k; got + 1 < cap && (k = read(fd, resp + got, cap - 1 - got)) > 0;) got += (size_t)k;
    close(fd);
    resp[got] = 0;
    dechunk(resp);
    int status = 0;
    return sscanf(resp, "HTTP/1.1 %d", &status) == 1 ? status : 0;
}

static const char HTTP_CHAT[] =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"the cat and the dog\"}],\"max_tokens\":6,"
    "\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2,\"n\":2,\"stop\":[\"zq\"]}";
static const char HTTP_STREAM[] =
    "{\"model\":\"m\",\"prompt\":\"once upon a time\",\"max_tokens\":6,\"temperature\":0,\"stream\":true,"
    "\"stream_options\":{\"include_usage\":true},\"logprobs\":1}";
static const char HTTP_CHAT_STREAM[] =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a dog\"}],\"max_tokens\":5,\"temperature\":0,"
    "\"stream\":true,\"logprobs\":true,\"top_logprobs\":1}";
static const char HTTP_EMBED[] = "{\"model\":\"m\",\"input\":[\"the cat\",[5,6,7]],\"pooling\":\"mean\"}";
static const char HTTP_EMBED64[] = "{\"input\":\"a dog and a cat\",\"encoding_format\":\"base64\"}";
static char g_http_ref[5][32768];

/* The answer without what differs per call: the body without the headers
 * (Content-Length), ids, creation times and cached_tokens (a failed
 * allocation may turn a cache hit into a recompute: same answer). */
static void normalize(const char *resp, char *out, size_t cap)
{
    const char *p = strstr(resp, "\r\n\r\n");
    size_t k = 0;
    for (p = p ? p + 4 : resp; *p && k + 1 < cap;) {
        if (!strncmp(p, "\"id\":\"", 6) || !strncmp(p, "\"created\":", 10) || !strncmp(p, "\"cached_tokens\":", 16)) {
            while (*p && *p != ',' && *p != '}') p++; /* to the field's end */
            p += *p == ',';
            continue;
        }
        out[k++] = *p++;
    }
    out[k] = 0;
}

/* One request with the nth allocation failing: a 503 (an error event in
 * a stream), or exactly the clean answer. k: which request. */
static void http_case(long n, int k, const char *path, const char *body)
{
    static char resp[65536], norm[32768];
    arm(n);
    int st = post(path, body, resp, sizeof resp);
    disarm();
    normalize(resp, norm, sizeof norm);
    if (!n) {
        assert_int_equal(st, 200);
        snprintf(g_http_ref[k], sizeof g_http_ref[k], "%s", norm);
        return;
    }
    if (st == 503 || (st == 200 && strstr(resp, "data: {\"error\"") && strstr(resp, "data: [DONE]\n\n")))
        return; /* failed, and said so */
    if (st != 200 || strcmp(norm, g_http_ref[k])) {
        size_t at = 0;
        while (norm[at] && norm[at] == g_http_ref[k][at]) at++;
        at = at > 200 ? at - 200 : 0;
        fail_msg("request %d: failing allocation %ld gave status %d and another answer (%zu vs %zu bytes); from byte %zu:\n%.400s\nclean:\n%.400s",
                 k, n, st, strlen(norm), strlen(g_http_ref[k]), at, norm + at, g_http_ref[k] + at);
    }
}

static void sc_http(long n)
{
    static char resp[65536], norm[32768];
    http_case(n, 0, "/v1/chat/completions", HTTP_CHAT);
    http_case(n, 1, "/v1/completions", HTTP_STREAM);
    http_case(n, 2, "/v1/chat/completions", HTTP_CHAT_STREAM);
    http_case(n, 3, "/v1/embeddings", HTTP_EMBED);
    http_case(n, 4, "/v1/embeddings", HTTP_EMBED64);
    /* the server still answers right */
    assert_int_equal(post("/v1/chat/completions", HTTP_CHAT, resp, sizeof resp), 200);
    normalize(resp, norm, sizeof norm);
    assert_string_equal(norm, g_http_ref[0]);
}

/* ---- driver ------------------------------------------------------------------ */

static int setup(void **st)
{
    (void)st;
    llm_json_init(); /* jansson allocates through llm_json's hooks, so through the wrapped malloc */
    if (test_tiny_open(&g_tiny, "torture", QT_Q8_0, 5, 2))
        return -1;
    g_m = g_tiny.m;
    g_b = g_tiny.b;
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    test_tiny_close(&g_tiny);
    return 0;
}

static void test_request(void **st)
{
    (void)st;
    torture("submit + steps", sc_request);
}

/* Memory that stays short from the Nth allocation on: the request ends
 * (an error, within drain's wait) rather than waiting for a deadline. */
static void test_request_sustained(void **st)
{
    (void)st;
    atomic_store(&g_sustained, 1);
    torture("submit + steps, memory short from then on", sc_request);
    atomic_store(&g_sustained, 0);
}

static void test_open(void **st)
{
    (void)st;
    torture("engine open", sc_open);
}

static void test_cancel(void **st)
{
    (void)st;
    torture("cancel", sc_cancel);
}

static void test_constrained(void **st)
{
    (void)st;
    torture("constrained request", sc_constrained);
}

static void test_lora(void **st)
{
    (void)st;
    llm_error err = {0};
    test_tmpfile("torture-lora", g_lora_path, sizeof g_lora_path);
    if (llm_mklora(g_tiny.path, 32, 16, QT_F16, 3, g_lora_path, &err))
        fail_msg("mklora: %s", err.msg);
    torture("adapter load, add, request, remove", sc_lora);
    assert_memory_not_equal(&g_ref_lora, &g_ref, sizeof g_ref); /* the adapter changed the answer */
    remove(g_lora_path);
}

static void test_grammar(void **st)
{
    (void)st;
    torture("grammar and schema", sc_grammar);
}

static void test_parse(void **st)
{
    (void)st;
    torture("server request parsing", sc_parse);
}

static void test_http(void **st)
{
    (void)st;
    server_start();
    torture("server request path (HTTP)", sc_http);
    server_stop();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request), /* first: it records the reference tokens */
        cmocka_unit_test(test_request_sustained),
        cmocka_unit_test(test_open),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_constrained),
        cmocka_unit_test(test_grammar),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_http),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
