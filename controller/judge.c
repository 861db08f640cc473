/* judge.c - the quality gate's reads of two pods; see judge.h. */
#include <curl/curl.h>
#include <openssl/crypto.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_client.h"
#include "judge.h"
#include "llm/clock.h"
#include "llm/json.h"
#include "llm/sync.h"
#include "llm/thread.h"

#define KEY_MAX 320
#define TEXT_IDS_MAX 1024     /* a text's tokens: longer ones cannot be judged (incomparable): an answer's tree
                               * (~16 KiB a position at top 20) stays within the controller's JSON cap */
#define TOKENS_ANSWER_MAX (64u << 10) /* /admin/tokenize's answer: TEXT_IDS_MAX ids and the vocabulary size */
#define ERROR_ANSWER_MAX 4096 /* a refusal's body: its message is all that is read */
#define ENTRY_BYTES 80        /* a prompt_logprobs alternative as llm-server prints it, with room */

typedef struct entry {
    char key[KEY_MAX];
    judge_job job;          /* while queued or running: the job (texts owned) */
    judge_result res;
    unsigned long long seq; /* the queue's order */
} entry;

/* One of the threads that run jobs. */
typedef struct worker {
    struct judge *j;
    atomic_int cancel;      /* ends its request in flight: judge_free (1), or its job's key let go of it (2) */
    unsigned long long running; /* the seq of its job (0: none), under w.mu */
    char ns[KEY_MAX];       /* that job's namespace, under w.mu */
    pthread_t th;
    int started;
} worker;

struct judge {
    llm_sync_worker w;      /* w.mu guards the entries and the workers' running/ns; its thread is worker 0's */
    worker wk[JUDGE_WORKERS];
    pthread_mutex_t parse_mu; /* held while an answer is parsed and read into positions */
    entry *e;
    size_t n;
    unsigned long long seq;
};

/* ---- one request ----------------------------------------------------------------- */

static int aborted(void *p, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)a, (void)b, (void)c, (void)d;
    return atomic_load((atomic_int *)p);
}

/* POSTs body to side's url + path: the body of a 200 (of at most max
 * bytes, malloc'd; parsed() reads it), else NULL with why (the status and the pod's words)
 * and *refused set when the pod refused the request itself as malformed
 * or too large (400, 413, 422: the same request fails again, e.g. a text
 * longer than the model's context). Anything else - 401, 404, 409 (a
 * restarted pod without its colocated canary yet), 5xx, no answer - is a
 * read that may go another time. */
static char *post(worker *j, const judge_job *job, int side, const char *path, json_t *body, size_t max,
                    double deadline, int *refused, char *why, size_t wn)
{
    const judge_side *s = &job->side[side];
    char url[192], auth[100], rev[40], *text = json_dumps(body, JSON_COMPACT);
    double left = deadline - llm_clock_mono_s();
    CURL *c = text && left > 0 ? curl_easy_init() : NULL;
    struct curl_slist *h = NULL, *t;
    snprintf(url, sizeof url, "%s%s", s->url, path);
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", job->token);
    snprintf(rev, sizeof rev, "X-LLM-Revision: %s", s->revision);
    const char *lines[] = {auth, rev, "Content-Type: application/json"};
    int hdrs = 0;
    for (size_t i = 0; c && i < 3; i++)
        if ((t = curl_slist_append(h, lines[i])))
            h = t, hdrs++;
    *refused = 0;
    if (!c || hdrs < 3) { /* (a request without its token or revision would be a wrong one) */
        snprintf(why, wn, "%s", !text || c ? "no memory for a request" : left <= 0 ? "the job's time ran out" : "no curl handle");
        curl_slist_free_all(h);
        if (c)
            curl_easy_cleanup(c);
        free(text);
        return NULL;
    }
    http_client_body b = {.max = max};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROXY, ""); /* the pod directly */
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(left * 1000) + 1);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, http_client_body_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, aborted);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &j->cancel);
    long code = 0;
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    free(text);
    char *out = code == 200 && b.p ? b.p : NULL;
    *refused = code == 400 || code == 413 || code == 422;
    if (!out) {
        json_t *e = code && b.p && b.n <= ERROR_ANSWER_MAX ? llm_json_loads(b.p, 0, NULL) : NULL;
        const char *msg = json_string_value(json_object_get(json_object_get(e, "error"), "message"));
        if (rc != CURLE_OK)
            snprintf(why, wn, "%s %s: %s", s->revision, url, b.over ? "the answer is over its bound" : curl_easy_strerror(rc));
        else
            snprintf(why, wn, "%s %s answered %ld%s%.300s", s->revision, url, code, msg ? ": " : "", msg ? msg : "");
        json_decref(e);
        free(b.p);
    }
    return out;
}

/* body (taken, NULL: nothing) parsed, or NULL with why: a 200 whose
 * answer is not JSON, or one past the controller's shared parse cap. */
static json_t *parsed(char *body, const char *what, char *why, size_t wn)
{
    llm_error err = {0};
    json_t *j = body ? llm_json_loads(body, 0, &err) : NULL;
    if (body && !j)
        snprintf(why, wn, "%s: its answer could not be read (%.300s)", what, err.msg);
    free(body);
    return j;
}

/* ---- the comparison -------------------------------------------------------------- */

int judge_common_suffix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int k = 0;
    while (k < na && k < nb && a[na - 1 - k] == b[nb - 1 - k])
        k++;
    return k;
}

/* The last n positions of an answer's prompt_logprobs, read out (a new
 * array the caller frees; the answer's tree can go), or NULL with why. */
static quality_pos *last_positions(json_t *answer, int n, char *why, size_t wn)
{
    json_t *list = json_object_get(json_array_get(json_object_get(answer, "choices"), 0), "prompt_logprobs");
    size_t len = json_array_size(list);
    quality_pos *out = n > 0 && (size_t)n <= len ? malloc((size_t)n * sizeof *out) : NULL;
    if (!out) {
        snprintf(why, wn, n > 0 && (size_t)n <= len ? "no memory for %d positions"
                                                    : "an answer lacks prompt_logprobs for its last %d positions", n);
        return NULL;
    }
    if (quality_pos_list(list, len - (size_t)n, (size_t)n, out, why, wn)) {
        free(out);
        return NULL;
    }
    return out;
}

int judge_add_answers(quality_sum *s, json_t *stable, json_t *canary, int n, char *why, size_t wn)
{
    quality_pos *a = last_positions(stable, n, why, wn), *b = a ? last_positions(canary, n, why, wn) : NULL;
    int rc = b ? quality_add_pos(s, a, b, (size_t)n, why, wn) : -1;
    free(a);
    free(b);
    return rc;
}

/* A tokenize answer's ids into a new array (*n of them, 2..TEXT_IDS_MAX),
 * or NULL. */
static int32_t *ids_of(json_t *answer, int *n, long *vocab)
{
    json_t *t = json_object_get(answer, "tokens");
    size_t len = json_array_size(t);
    *vocab = json_integer_value(json_object_get(answer, "vocab_size"));
    if (!json_is_array(t) || len < 2 || len > TEXT_IDS_MAX)
        return NULL;
    int32_t *ids = malloc(len * sizeof *ids);
    for (size_t i = 0; ids && i < len; i++) {
        json_int_t v = json_integer_value(json_array_get(t, i));
        if (v < 0 || v >= *vocab) {
            free(ids);
            return NULL;
        }
        ids[i] = (int32_t)v;
    }
    *n = (int)len;
    return ids;
}

/* The completion request scoring ids (a new object), or NULL. */
static json_t *score_request(const int32_t *ids, int n, int top)
{
    json_t *arr = json_array(), *req = NULL;
    for (int i = 0; arr && i < n; i++)
        if (json_array_append_new(arr, json_integer(ids[i])))
            break;
    if (arr && json_array_size(arr) == (size_t)n)
        req = json_pack("{s:O,s:i,s:i,s:i}", "prompt", arr, "max_tokens", 1, "temperature", 0, "prompt_logprobs", top);
    json_decref(arr);
    return req;
}

/* One text's reading on both sides. */
typedef struct reading {
    int32_t *ids[2];
    int n[2];
    long vocab[2];
    int chat;
    int common;                 /* tokens both end with */
} reading;

/* Each side's ids for text: 1, 0 incomparable, -1 a read failed (w why). */
static int tokenize_both(worker *j, const judge_job *job, json_t *text, double deadline, reading *r, char *w, size_t wn)
{
    json_t *msgs = json_object_get(text, "messages");
    json_t *req = msgs ? json_pack("{s:O}", "messages", msgs) : json_pack("{s:O}", "prompt", json_object_get(text, "prompt"));
    int refused = 0, rc = 1;
    r->chat = msgs != NULL;
    if (!req) {
        snprintf(w, wn, "no memory");
        return -1;
    }
    for (int s = 0; s < 2 && rc == 1; s++) {
        json_t *tok = parsed(post(j, job, s, "/admin/tokenize", req, TOKENS_ANSWER_MAX, deadline, &refused, w, wn),
                             "/admin/tokenize", w, wn);
        r->ids[s] = tok ? ids_of(tok, &r->n[s], &r->vocab[s]) : NULL;
        if (tok && !r->ids[s]) /* (the same answer again would not do better) */
            snprintf(w, wn, "a tokenization is not 2 to %d ids of its vocabulary", TEXT_IDS_MAX);
        rc = r->ids[s] ? 1 : !tok && !refused ? -1 : 0;
        json_decref(tok);
    }
    json_decref(req);
    if (rc != 1)
        return rc;
    r->common = judge_common_suffix(r->ids[0], r->n[0], r->ids[1], r->n[1]);
    if (r->vocab[0] != r->vocab[1])
        snprintf(w, wn, "the vocabularies differ (%ld and %ld tokens)", r->vocab[0], r->vocab[1]);
    else if (!r->chat && (r->n[0] != r->n[1] || r->common != r->n[0]))
        snprintf(w, wn, "the revisions tokenize it differently (%d and %d ids)", r->n[0], r->n[1]);
    else if (r->common < 2)
        snprintf(w, wn, "the two renderings of the chat do not end alike (templates differ past comparing)");
    else
        return 1;
    return 0;
}

/* Both sides' distributions over the positions compared, added to sum:
 * 1, 0 refused, -1 a read failed (w why). One answer's tree at a time. */
static int score_both(worker *j, const judge_job *job, const reading *r, double deadline, quality_sum *sum, char *w,
                      size_t wn)
{
    /* the suffix's first token is predicted on both sides only when both have a token before it */
    int cmp = r->common < r->n[0] && r->common < r->n[1] ? r->common : r->common - 1, refused = 0;
    quality_pos *pos[2] = {NULL, NULL};
    for (int s = 0; s < 2; s++) {
        json_t *req = score_request(r->ids[s], r->n[s], job->top);
        size_t max = (size_t)r->n[s] * (size_t)(job->top + 1) * ENTRY_BYTES + (64u << 10);
        char *body = req ? post(j, job, s, "/admin/completions", req, max, deadline, &refused, w, wn) : NULL;
        json_decref(req);
        /* one answer's tree at a time across the workers: a tree is many times its text (tens of MiB at the
         * bound), and the parses share the controller's cap with its API reads */
        pthread_mutex_lock(&j->j->parse_mu);
        json_t *ans = parsed(body, "/admin/completions", w, wn);
        int answered = ans != NULL;
        pos[s] = ans ? last_positions(ans, cmp, w, wn) : NULL;
        json_decref(ans);
        pthread_mutex_unlock(&j->j->parse_mu);
        if (!pos[s]) {
            free(pos[0]);
            return answered || !refused ? -1 : 0;
        }
    }
    int rc = quality_add_pos(sum, pos[0], pos[1], (size_t)cmp, w, wn) ? -1 : 1;
    free(pos[0]);
    free(pos[1]);
    return rc;
}

/* One text on both sides: 1 added, 0 incomparable, -1 a read failed;
 * why says what when not 1. */
static int one_text(worker *j, const judge_job *job, json_t *text, double deadline, quality_sum *sum, char *why, size_t wn)
{
    const char *name = json_string_value(json_object_get(text, "name")) ?: "?";
    reading r = {0};
    char w[400] = "";
    int rc = tokenize_both(j, job, text, deadline, &r, w, sizeof w);
    if (rc == 1)
        rc = score_both(j, job, &r, deadline, sum, w, sizeof w);
    if (rc != 1)
        snprintf(why, wn, "text %.60s: %s", name, w);
    free(r.ids[0]);
    free(r.ids[1]);
    return rc;
}

/* The whole job into r (state and identity aside). */
static void run_job(worker *j, const judge_job *job, judge_result *r)
{
    double deadline = llm_clock_mono_s() + job->timeout_s;
    memset(&r->sum, 0, sizeof r->sum);
    r->texts = 0;
    r->outcome = 1;
    r->message[0] = 0;
    for (size_t i = 0; i < json_array_size(job->texts) && r->outcome == 1; i++) {
        int rc = one_text(j, job, json_array_get(job->texts, i), deadline, &r->sum, r->message, sizeof r->message);
        r->outcome = rc;
        r->texts += rc == 1;
    }
    if (r->outcome == 1 && r->sum.positions < job->min_positions) {
        r->outcome = 0;
        snprintf(r->message, sizeof r->message, "the texts give %ld positions; minPositions is %ld (add texts)",
                 r->sum.positions, job->min_positions);
    } else if (r->outcome == 1) {
        snprintf(r->message, sizeof r->message, "%d texts, %ld positions", r->texts, r->sum.positions);
    }
}

/* ---- the thread ------------------------------------------------------------------ */

/* The job r came from read the pods job names. */
static int same_pods(const judge_result *r, const judge_job *job)
{
    return !strcmp(r->url[0], job->side[0].url) && !strcmp(r->url[1], job->side[1].url);
}

static entry *find(judge *j, const char *key)
{
    for (size_t i = 0; i < j->n; i++)
        if (!strcmp(j->e[i].key, key))
            return &j->e[i];
    return NULL;
}

/* key's namespace (what precedes its '/') is ns. */
static int in_ns(const char *key, const char *ns)
{
    size_t n = strlen(ns);
    return n && !strncmp(key, ns, n) && key[n] == '/';
}

/* Whether a worker runs a job of key's namespace. Under mu. */
static int ns_busy(const judge *j, const char *key)
{
    for (int k = 0; k < JUDGE_WORKERS; k++)
        if (j->wk[k].running && in_ns(key, j->wk[k].ns))
            return 1;
    return 0;
}

/* The oldest queued entry of a namespace no worker is busy with, or NULL.
 * Under mu. (One job per namespace at a time: a tenant's slow pods hold
 * one worker at most, never the others' gates.) */
static entry *next_queued(judge *j)
{
    entry *best = NULL;
    for (size_t i = 0; i < j->n; i++)
        if (j->e[i].res.state == JUDGE_QUEUED && (!best || j->e[i].seq < best->seq) && !ns_busy(j, j->e[i].key))
            best = &j->e[i];
    return best;
}

/* Ends the request in flight of the job e had running, if any: its key
 * let go of it (another job, a refusal, forgotten). Under mu. */
static void entry_cancel(judge *j, const entry *e)
{
    for (int k = 0; e->seq && k < JUDGE_WORKERS; k++)
        if (j->wk[k].running == e->seq)
            atomic_store(&j->wk[k].cancel, 2);
}

/* A new entry for key (cleared: what judge_forget moved out of its slot
 * is not this entry's), or NULL past JUDGE_MAX_KEYS, past
 * JUDGE_KEYS_PER_NS of its namespace (one tenant cannot fill the table),
 * or for a key too long. Under mu. */
static entry *entry_add(judge *j, const char *key)
{
    size_t ns = strcspn(key, "/"), mine = 0;
    for (size_t i = 0; i < j->n; i++) mine += !strncmp(j->e[i].key, key, ns + 1);
    if (j->n >= JUDGE_MAX_KEYS || mine >= JUDGE_KEYS_PER_NS || strlen(key) >= KEY_MAX || !key[ns])
        return NULL; /* (a key is "ns/name": one without a namespace would escape the namespace's limits) */
    entry *e = &j->e[j->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->key, sizeof e->key, "%s", key);
    return e;
}

/* A failed read's result old enough to be tried again. */
static int retry_due(const judge_result *r)
{
    return r->state == JUDGE_DONE && r->outcome < 0 && llm_clock_mono_s() - r->finished_mono >= JUDGE_RETRY_S;
}

/* The result's identity: the job's revision, stage and pods. */
static void result_of(judge_result *r, const judge_job *job)
{
    r->stage = job->stage;
    snprintf(r->rev, sizeof r->rev, "%s", job->rev);
    for (int k = 0; k < 2; k++) memcpy(r->url[k], job->side[k].url, sizeof r->url[k]);
}

/* Runs e's job, the lock let go meanwhile; its result into its entry if
 * that still wants it. Called and returns with mu held. */
static void take(worker *wk, entry *e)
{
    judge *j = wk->j;
    /* the job leaves the entry while it runs (the entry may move or go: judge_forget, a newer want) */
    char key[KEY_MAX];
    judge_job job = e->job;
    unsigned long long seq = e->seq;
    e->job.texts = NULL;
    OPENSSL_cleanse(e->job.token, sizeof e->job.token); /* (the worker's copy is the one in use) */
    e->res.state = JUDGE_RUNNING;
    snprintf(key, sizeof key, "%s", e->key);
    wk->running = seq;
    snprintf(wk->ns, sizeof wk->ns, "%.*s", (int)strcspn(key, "/"), key);
    int was = 2;
    atomic_compare_exchange_strong(&wk->cancel, &was, 0); /* a cancel of the job before, not judge_free's */
    pthread_mutex_unlock(&j->w.mu);
    judge_result r = {.state = JUDGE_DONE};
    result_of(&r, &job);
    run_job(wk, &job, &r);
    r.finished_mono = llm_clock_mono_s();
    json_decref(job.texts);
    OPENSSL_cleanse(job.token, sizeof job.token);
    pthread_mutex_lock(&j->w.mu);
    wk->running = 0;
    if ((e = find(j, key)) && e->seq == seq) /* still the job key wants */
        e->res = r;
    pthread_cond_broadcast(&j->w.cv); /* its namespace's next job may go now, on any worker */
}

static void *loop(void *arg)
{
    worker *wk = arg;
    judge *j = wk->j;
    pthread_mutex_lock(&j->w.mu);
    while (!j->w.stop) {
        entry *e = next_queued(j);
        if (e)
            take(wk, e);
        else
            llm_sync_worker_wait(&j->w, 0);
    }
    pthread_mutex_unlock(&j->w.mu);
    return NULL;
}

/* Ends and joins workers 1.. (worker 0 is the sync worker's thread). */
static void stop_extra(judge *j)
{
    pthread_mutex_lock(&j->w.mu);
    j->w.stop = 1;
    pthread_cond_broadcast(&j->w.cv);
    pthread_mutex_unlock(&j->w.mu);
    for (int k = 1; k < JUDGE_WORKERS; k++)
        if (j->wk[k].started)
            pthread_join(j->wk[k].th, NULL);
}

llm_status judge_new(judge **out, llm_error *err)
{
    judge *j = calloc(1, sizeof *j);
    if (!j || !(j->e = calloc(JUDGE_MAX_KEYS, sizeof *j->e))) {
        free(j);
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the quality judge");
    }
    for (int k = 0; k < JUDGE_WORKERS; k++) j->wk[k].j = j;
    int rc = pthread_mutex_init(&j->parse_mu, NULL);
    if (!rc && (rc = llm_sync_worker_init(&j->w)))
        pthread_mutex_destroy(&j->parse_mu);
    if (rc) {
        free(j->e);
        free(j);
        return llm_errf(err, LLM_ERR_IO, "cannot start the quality judge: %s", strerror(rc));
    }
    for (int k = 1; k < JUDGE_WORKERS && !rc; k++)
        j->wk[k].started = !(rc = llm_thread_create(&j->wk[k].th, LLM_THREAD_STACK, loop, &j->wk[k]));
    if (!rc)
        rc = llm_sync_worker_start(&j->w, LLM_THREAD_STACK, loop, &j->wk[0]);
    if (rc) {
        stop_extra(j);
        llm_sync_worker_free(&j->w);
        pthread_mutex_destroy(&j->parse_mu);
        free(j->e);
        free(j);
        return llm_errf(err, LLM_ERR_IO, "cannot start the quality judge's threads: %s", strerror(rc));
    }
    *out = j;
    return LLM_OK;
}

void judge_free(judge *j)
{
    if (!j)
        return;
    for (int k = 0; k < JUDGE_WORKERS; k++) /* the requests in flight end: the joins wait for no pod */
        atomic_store(&j->wk[k].cancel, 1);
    stop_extra(j);
    llm_sync_worker_stop(&j->w);
    llm_sync_worker_free(&j->w);
    pthread_mutex_destroy(&j->parse_mu);
    for (size_t i = 0; i < j->n; i++)
        json_decref(j->e[i].job.texts);
    OPENSSL_cleanse(j->e, JUDGE_MAX_KEYS * sizeof *j->e); /* (queued jobs' admin tokens) */
    free(j->e);
    free(j);
}

/* Whether job is news for e (NULL: none yet): another revision, stage or
 * pods, or a failed read old enough to try again. Under the lock. */
static int takes(const entry *e, const judge_job *job)
{
    int same = e && e->res.stage == job->stage && !strcmp(e->res.rev, job->rev) && same_pods(&e->res, job);
    return !same || retry_due(&e->res);
}

int judge_wants(judge *j, const char *key, const judge_job *job)
{
    pthread_mutex_lock(&j->w.mu);
    int yes = takes(find(j, key), job);
    pthread_mutex_unlock(&j->w.mu);
    return yes;
}

llm_status judge_want(judge *j, const char *key, judge_job *job, llm_error *err)
{
    llm_status st = LLM_OK;
    pthread_mutex_lock(&j->w.mu);
    entry *e = find(j, key);
    if (!takes(e, job)) {
        json_decref(job->texts);
    } else if (!e && !(e = entry_add(j, key))) {
        json_decref(job->texts);
        st = llm_errf(err, LLM_ERR_NOMEM, "the quality judge holds %d deployments' jobs (%d of a namespace at most): %s "
                      "waits", JUDGE_MAX_KEYS, JUDGE_KEYS_PER_NS, key);
    } else {
        json_decref(e->job.texts);
        entry_cancel(j, e); /* its pods or revision changed: the request in flight ends now */
        e->job = *job;
        e->seq = ++j->seq;
        memset(&e->res, 0, sizeof e->res);
        e->res.state = JUDGE_QUEUED;
        result_of(&e->res, job);
        pthread_cond_broadcast(&j->w.cv); /* (a worker whose namespace is free takes it) */
    }
    job->texts = NULL;
    pthread_mutex_unlock(&j->w.mu);
    return st;
}

void judge_refuse(judge *j, const char *key, const char *rev, int stage, const char *why)
{
    pthread_mutex_lock(&j->w.mu);
    entry *e = find(j, key);
    int fresh = e && e->res.state == JUDGE_DONE && e->res.stage == stage && !strcmp(e->res.rev, rev) &&
                llm_clock_mono_s() - e->res.finished_mono < JUDGE_RETRY_S;
    if (!e)
        e = entry_add(j, key);
    if (e && !fresh) { /* (a fresh refusal keeps its time: the retry is counted from the first) */
        entry_cancel(j, e); /* a job that runs for it is not wanted any more */
        json_decref(e->job.texts);
        e->job.texts = NULL;
        e->seq = ++j->seq;
        e->res = (judge_result){.state = JUDGE_DONE, .stage = stage, .outcome = -1, .finished_mono = llm_clock_mono_s()};
        snprintf(e->res.rev, sizeof e->res.rev, "%s", rev);
        snprintf(e->res.message, sizeof e->res.message, "%s", why);
    }
    pthread_mutex_unlock(&j->w.mu);
}

void judge_read(judge *j, const char *key, judge_result *out)
{
    pthread_mutex_lock(&j->w.mu);
    entry *e = find(j, key);
    if (e)
        *out = e->res;
    else
        memset(out, 0, sizeof *out);
    pthread_mutex_unlock(&j->w.mu);
}

void judge_forget(judge *j, const char *key)
{
    pthread_mutex_lock(&j->w.mu);
    entry *e = find(j, key);
    if (e) {
        entry_cancel(j, e);
        json_decref(e->job.texts);
        /* the last entry fills the hole; its old slot is cleared, so no copy of its texts stays behind */
        entry *last = &j->e[--j->n];
        if (e != last)
            *e = *last;
        memset(last, 0, sizeof *last);
    }
    pthread_mutex_unlock(&j->w.mu);
}
