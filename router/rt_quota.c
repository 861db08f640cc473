/* rt_quota.c - tenants' rpm, tpm and requests in flight at the gateway,
 * alone or shared through Redis; see rt_quota.h. hiredis is the client
 * (the one Debian ships); its blocking calls run with a timeout on the
 * request's own thread, which a gateway request waits on anyway. */
#include "rt_quota.h"

#include <hiredis/hiredis.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "llm/clock.h"
#include "llm/sync.h"
#include "http_guard.h"

#define N RT_QUOTA_SECONDS
#define POOL_MAX 16          /* idle Redis connections kept */
#define CONN_MAX 64          /* open at once: a call beyond waits (its timeout) for one to come back */
#define DOWN_S 1.0           /* after a failure Redis is not tried for this long */

/* A tenant's counters here (on its first key's index): a ring of the
 * last N seconds, slot s % N holding second s when stamp says so. */
typedef struct tenant_count {
    long stamp[N];
    double req[N], tok[N];
    int inflight;
} tenant_count;

struct rt_quota {
    rt_quota_config cfg;
    char host[256], prefix[600];
    char user[RT_QUOTA_USER_MAX + 1], password_file[4096];
    char why[160];           /* the last Redis failure's cause */
    int port;
    pthread_mutex_t mu;      /* counts, pool, down_until, stats */
    pthread_cond_t back;     /* a connection came back to the pool (or closed) */
    int open;                /* connections out of the pool or in it */
    tenant_count **count;    /* keys->n, made when a tenant with limits first calls */
    redisContext *pool[POOL_MAX];
    int pooled;
    double down_until;       /* monotonic */
    unsigned long long refused[RT_QUOTA_N], store_errors, seq;
    unsigned long long id;   /* this replica's, in members */
};

/* KEYS: the tenant's request and token key bases (the second is
 * appended), its in-flight set. ARGV: this second, rpm, tpm,
 * max_inflight, now, the lease's end, the member, the set's TTL, the
 * tokens to reserve. Answers
 * {0} (in), {3} (max_inflight), or {1|2, the 61 seconds' counts}. */
static const char ADMIT_LUA[] =
    "local b = tonumber(ARGV[1])\n"
    "local function window(base)\n"
    "  local ks = {}\n"
    "  for i = 0, 60 do ks[i + 1] = base .. (b - 60 + i) end\n"
    "  local v, sum, out = redis.call('MGET', unpack(ks)), 0, {}\n"
    "  for i = 1, 61 do local x = tonumber(v[i]) or 0; sum = sum + x; out[i] = tostring(x) end\n"
    "  return sum, out\n"
    "end\n"
    "local rpm, tpm, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "if cap > 0 then\n"
    "  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[5])\n"
    "  if redis.call('ZCARD', KEYS[3]) >= cap then return {3} end\n"
    "end\n"
    "if tpm > 0 then\n"
    "  local sum, out = window(KEYS[2])\n"
    "  if sum >= tpm then table.insert(out, 1, 2) return out end\n"
    "end\n"
    "if rpm > 0 then\n"
    "  local sum, out = window(KEYS[1])\n"
    "  if sum + 1 > rpm then table.insert(out, 1, 1) return out end\n"
    "end\n"
    "redis.call('INCR', KEYS[1] .. b)\n"
    "redis.call('EXPIRE', KEYS[1] .. b, 120)\n"
    "if tpm > 0 and tonumber(ARGV[9]) > 0 then\n"
    "  redis.call('INCRBY', KEYS[2] .. b, ARGV[9])\n"
    "  redis.call('EXPIRE', KEYS[2] .. b, 120)\n"
    "end\n"
    "if cap > 0 then\n"
    "  redis.call('ZADD', KEYS[3], ARGV[6], ARGV[7])\n"
    "  redis.call('EXPIRE', KEYS[3], ARGV[8])\n"
    "end\n"
    "return {0}\n";

/* KEYS: the token key base, the in-flight set; ARGV: this second, the
 * member ('' : none), the tokens to add (the used less the reserved: may
 * be negative, and a second's count with it: the window's sum is what
 * counts). */
static const char DONE_LUA[] =
    "if ARGV[2] ~= '' then redis.call('ZREM', KEYS[2], ARGV[2]) end\n"
    "local n = tonumber(ARGV[3])\n"
    "if n ~= 0 then redis.call('INCRBY', KEYS[1] .. ARGV[1], n) redis.call('EXPIRE', KEYS[1] .. ARGV[1], 120) end\n"
    "return 0\n";

double rt_quota_retry(const double c[N], double into, double room)
{
    double sum = 0;
    for (int i = 0; i < N; i++) sum += c[i];
    int k = 0; /* seconds to come: at k the oldest k are out */
    while (k < N && sum > room) sum -= c[k++];
    double s = k - into;
    return s < 1 ? 1 : s;
}

static llm_status parse_addr(rt_quota *q, const char *addr, llm_error *err)
{
    const char *colon = strrchr(addr, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof q->host || *end || port < 1 || port > 65535)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "--quota-redis %s: give HOST:PORT", addr);
    memcpy(q->host, addr, (size_t)(colon - addr));
    q->host[colon - addr] = 0;
    q->port = (int)port;
    return LLM_OK;
}

/* The settings copied into q (the strings into its own buffers). */
static llm_status configure(rt_quota *q, const rt_quota_config *cfg, llm_error *err)
{
    q->cfg = *cfg;
    q->cfg.redis = q->cfg.prefix = q->cfg.user = q->cfg.password_file = NULL; /* copied, not borrowed */
    if (snprintf(q->user, sizeof q->user, "%s", cfg->user ? cfg->user : "") >= (int)sizeof q->user)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "the Redis user: at most %d bytes", RT_QUOTA_USER_MAX);
    if (snprintf(q->password_file, sizeof q->password_file, "%s", cfg->password_file ? cfg->password_file : "") >=
        (int)sizeof q->password_file)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "the Redis password file's path is too long");
    if (q->user[0] && !q->password_file[0])
        return llm_errf(err, LLM_ERR_INVALID_ARG, "a Redis user needs its password");
    char pw[RT_QUOTA_PASSWORD_MAX + 1];
    int bad = q->password_file[0] && http_guard_token_file(q->password_file, pw, sizeof pw);
    explicit_bzero(pw, sizeof pw);
    if (bad)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "the Redis password file %s: cannot read a password from it (one line, "
                        "1-%d characters)", q->password_file, RT_QUOTA_PASSWORD_MAX);
    if (q->cfg.share < 1)
        q->cfg.share = 1;
    if (q->cfg.timeout_ms < 1)
        q->cfg.timeout_ms = 100;
    if (q->cfg.lease_s <= 0)
        q->cfg.lease_s = 600;
    if (snprintf(q->prefix, sizeof q->prefix, "llm-quota:%s", cfg->prefix ? cfg->prefix : "") >= (int)sizeof q->prefix)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "--quota-prefix: at most %zu bytes", sizeof q->prefix - 11);
    return cfg->redis && *cfg->redis ? parse_addr(q, cfg->redis, err) : LLM_OK;
}

llm_status rt_quota_open(const rt_quota_config *cfg, rt_quota **out, llm_error *err)
{
    *out = NULL;
    rt_quota *q = calloc(1, sizeof *q);
    if (!q)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the quotas");
    llm_status st = configure(q, cfg, err);
    q->count = st ? NULL : calloc(cfg->keys->n ? (size_t)cfg->keys->n : 1, sizeof *q->count);
    if (!st && !q->count)
        st = llm_errf(err, LLM_ERR_NOMEM, "no memory for the quotas");
    if (!st && getrandom(&q->id, sizeof q->id, 0) != sizeof q->id)
        st = llm_errf(err, LLM_ERR_IO, "getrandom failed: no id for this replica's requests in Redis");
    int mu = !st && !pthread_mutex_init(&q->mu, NULL);
    if (!st && (!mu || llm_sync_cond_init(&q->back)))
        st = llm_errf(err, LLM_ERR_INTERNAL, "cannot make the quotas' mutex and condition variable");
    if (st) {
        if (mu)
            pthread_mutex_destroy(&q->mu);
        free(q->count);
        free(q);
        return st;
    }
    *out = q;
    return LLM_OK;
}

void rt_quota_close(rt_quota *q)
{
    if (!q)
        return;
    for (int i = 0; i < q->pooled; i++) redisFree(q->pool[i]);
    pthread_cond_destroy(&q->back);
    pthread_mutex_destroy(&q->mu);
    for (int i = 0; i < q->cfg.keys->n; i++) free(q->count[i]);
    free(q->count);
    free(q);
}

/* ---- alone: this replica's counts ------------------------------------------------------ */

/* key's tenant's counters (made on first use: NULL without memory);
 * under mu. */
static tenant_count *count_of(rt_quota *q, const api_key *key)
{
    tenant_count **c = &q->count[key->tenant_ix];
    if (!*c)
        *c = calloc(1, sizeof **c);
    return *c;
}

/* The last N seconds' counts of one series (req or tok), oldest first, as
 * of second now_s; under mu. */
static void window_of(const tenant_count *c, const double *series, long now_s, double out[N])
{
    for (int i = 0; i < N; i++) {
        long sec = now_s - (N - 1) + i;
        out[i] = c->stamp[sec % N] == sec ? series[sec % N] : 0;
    }
}

static double sum_of(const double v[N])
{
    double s = 0;
    for (int i = 0; i < N; i++) s += v[i];
    return s;
}

/* Adds x to second now_s of a series; under mu. */
static void add_at(tenant_count *c, double *series, long now_s, double x)
{
    int slot = (int)(now_s % N);
    if (c->stamp[slot] != now_s) { /* the slot's second is a minute gone: both series start again */
        c->stamp[slot] = now_s;
        c->req[slot] = c->tok[slot] = 0;
    }
    series[slot] += x;
}

/* A limit's share at this replica: limit / share, at least 1 (a limit
 * smaller than the share lets each replica one: the total is then over). */
static double share_of(const rt_quota *q, long limit)
{
    double s = (double)limit / q->cfg.share;
    return s < 1 ? 1 : s;
}

static rt_quota_limit admit_here(rt_quota *q, const api_key *key, const api_key *t, double now, long reserve,
                                 double *retry_s)
{
    long sec = (long)floor(now);
    double into = now - (double)sec, w[N];
    pthread_mutex_lock(&q->mu);
    tenant_count *c = count_of(q, key);
    rt_quota_limit over = RT_QUOTA_OK;
    if (!c) /* no memory for its counts: refused as if the store were down (its limits cannot be held) */
        over = RT_QUOTA_STORE;
    else if (t->max_inflight && c->inflight >= (int)share_of(q, t->max_inflight))
        over = RT_QUOTA_INFLIGHT;
    if (!over && t->tpm && (window_of(c, c->tok, sec, w), sum_of(w) >= share_of(q, t->tpm)))
        over = RT_QUOTA_TPM, *retry_s = rt_quota_retry(w, into, share_of(q, t->tpm) - 1);
    if (!over && t->rpm && (window_of(c, c->req, sec, w), sum_of(w) + 1 > share_of(q, t->rpm)))
        over = RT_QUOTA_RPM, *retry_s = rt_quota_retry(w, into, share_of(q, t->rpm) - 1);
    if (!over) {
        add_at(c, c->req, sec, 1);
        if (t->tpm)
            add_at(c, c->tok, sec, (double)reserve);
        c->inflight++;
    }
    pthread_mutex_unlock(&q->mu);
    return over;
}

/* ---- shared: Redis --------------------------------------------------------------------- */

/* s into out as one printable line (Redis's words go to the log). */
static void printable(char *out, size_t n, const char *s)
{
    size_t k = 0;
    for (; s[k] && k + 1 < n; k++) out[k] = (unsigned char)s[k] < ' ' || s[k] == 0x7f ? '?' : s[k];
    out[k] = 0;
}

/* The connection back after a call: kept when it worked, else closed
 * and Redis marked down for DOWN_S. r NULL: a connect that failed. */
static void conn_give(rt_quota *q, redisContext *r, int ok)
{
    pthread_mutex_lock(&q->mu);
    if (!ok && r && r->err)
        printable(q->why, sizeof q->why, r->errstr);
    if (!ok) {
        q->store_errors++;
        q->down_until = llm_clock_mono_s() + DOWN_S;
    }
    if (ok && r && q->pooled < POOL_MAX) {
        q->pool[q->pooled++] = r;
        r = NULL;
    } else {
        q->open--; /* (a failed connect had its place taken too) */
    }
    pthread_cond_signal(&q->back);
    pthread_mutex_unlock(&q->mu);
    if (r)
        redisFree(r);
}

/* The last failure's cause, for rt_quota_last_error. */
__attribute__((format(printf, 2, 3))) static void causef(rt_quota *q, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&q->mu);
    char why[sizeof q->why];
    vsnprintf(why, sizeof why, fmt, ap);
    printable(q->why, sizeof q->why, why);
    pthread_mutex_unlock(&q->mu);
    va_end(ap);
}

/* A new connection's AUTH (with a password file: read now, wiped after):
 * 1 when Redis said OK. */
static int auth(rt_quota *q, redisContext *r)
{
    if (!q->password_file[0])
        return 1;
    char pw[RT_QUOTA_PASSWORD_MAX + 1];
    if (http_guard_token_file(q->password_file, pw, sizeof pw)) {
        causef(q, "cannot read the password file (one line, 1-%d characters)", RT_QUOTA_PASSWORD_MAX);
        return 0;
    }
    const char *argv[3] = {"AUTH", q->user[0] ? q->user : pw, pw};
    redisReply *rep = redisCommandArgv(r, q->user[0] ? 3 : 2, argv, NULL);
    explicit_bzero(pw, sizeof pw);
    int ok = rep && rep->type == REDIS_REPLY_STATUS && !strcmp(rep->str, "OK");
    if (!ok && !r->err) /* (a failed call's cause is the connection's, taken by conn_give) */
        causef(q, "AUTH refused: %.120s", rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no answer");
    if (rep)
        freeReplyObject(rep);
    return ok;
}

/* A connection for one call: an idle one, else a new one while fewer
 * than CONN_MAX are open, else the first to come back within the call's
 * timeout. NULL when Redis is marked down (unless `anyway`: a release
 * is worth a try) or none could be had (counted). */
static redisContext *conn_take(rt_quota *q, int anyway)
{
    struct timespec until = llm_sync_after_ms(q->cfg.timeout_ms);
    int waited = 0;
    pthread_mutex_lock(&q->mu);
    while (!q->pooled && q->open >= CONN_MAX && !waited)
        waited = pthread_cond_timedwait(&q->back, &q->mu, &until) != 0;
    redisContext *r = q->pooled ? q->pool[--q->pooled] : NULL;
    int down = llm_clock_mono_s() < q->down_until && !anyway, full = !r && q->open >= CONN_MAX;
    if (!r && !down && !full)
        q->open++; /* this call's place, before it connects */
    if (full) {
        q->store_errors++;
        snprintf(q->why, sizeof q->why, "all %d connections to Redis were busy for the call's timeout", CONN_MAX);
    }
    pthread_mutex_unlock(&q->mu);
    if (r || down || full)
        return r;
    struct timeval tv = {q->cfg.timeout_ms / 1000, (q->cfg.timeout_ms % 1000) * 1000};
    r = redisConnectWithTimeout(q->host, q->port, tv);
    if (r && !r->err && redisSetTimeout(r, tv) == REDIS_OK && auth(q, r))
        return r;
    if (!r)
        causef(q, "no memory for a Redis connection");
    conn_give(q, r, 0); /* closed, counted, and Redis marked down */
    return NULL;
}

/* A string reply's number, or -1 when it is not one. */
/* A second's count in the script's answer: NAN when it is not a number.
 * It may be below 0: an answer settled in a later second than its
 * reservation gives back what it did not use there (the window's sum is
 * what counts). */
static double reply_num(const redisReply *e)
{
    if (e->type == REDIS_REPLY_INTEGER)
        return (double)e->integer;
    if (e->type != REDIS_REPLY_STRING || !e->len || e->len > 30)
        return NAN;
    char buf[32], *end;
    memcpy(buf, e->str, e->len);
    buf[e->len] = 0;
    double v = strtod(buf, &end);
    return *end || !isfinite(v) ? NAN : v;
}

/* The admission script's answer: {0}, {3}, or {1|2, N counts} (into w);
 * -1 when it is not of that shape (an impostor or a broken server: junk
 * is a failure). */
static int admit_reply(const redisReply *rep, double w[N])
{
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 1 || rep->element[0]->type != REDIS_REPLY_INTEGER)
        return -1;
    long long code = rep->element[0]->integer;
    if ((code == 0 || code == 3) && rep->elements == 1)
        return (int)code;
    if ((code != 1 && code != 2) || rep->elements != N + 1)
        return -1;
    for (int i = 0; i < N; i++)
        if (isnan(w[i] = reply_num(rep->element[i + 1])))
            return -1;
    return (int)code;
}

/* The tenant's Redis key bases: requests and tokens (a second is
 * appended), and its in-flight set. */
#define KEY_MAX 1024 /* the prefix (600) and a tenant (API_KEY_MAX_LEN) fit whole: no two tenants' keys meet */
static void redis_keys(const rt_quota *q, const api_key *t, char k[3][KEY_MAX])
{
    snprintf(k[0], KEY_MAX, "%s:%s:r:", q->prefix, t->tenant);
    snprintf(k[1], KEY_MAX, "%s:%s:t:", q->prefix, t->tenant);
    snprintf(k[2], KEY_MAX, "%s:%s:c", q->prefix, t->tenant);
}

/* The cause of a call that did not answer as the script does: Redis's
 * error (NOAUTH, a script refused), or junk. (A broken connection's cause
 * is its own: conn_give takes it.) */
static void bad_reply(rt_quota *q, const redisContext *r, const redisReply *rep)
{
    if (r->err)
        return;
    const char *e = rep && rep->type == REDIS_REPLY_ERROR ? rep->str : NULL;
    /* (before AUTH, Redis answers a command as long as the script with "Protocol error: unauthenticated
     * multibulk length", not NOAUTH) */
    int noauth = e && (strstr(e, "NOAUTH") || strstr(e, "unauthenticated"));
    causef(q, "%s%.120s", noauth ? "Redis wants a password (AUTH), and answered: " : e ? "Redis answered: "
           : "an answer not of the script's shape", e ? e : "");
}

/* One admission through Redis: the limit, or -1 when Redis failed. */
static int admit_shared(rt_quota *q, const api_key *t, double now, long reserve, rt_quota_ticket *tk, double *retry_s)
{
    redisContext *r = conn_take(q, 0);
    if (!r)
        return -1;
    long sec = (long)floor(now);
    char k[3][KEY_MAX], a[9][48];
    redis_keys(q, t, k);
    snprintf(a[0], 48, "%ld", sec);
    snprintf(a[1], 48, "%ld", t->rpm);
    snprintf(a[2], 48, "%ld", t->tpm);
    snprintf(a[3], 48, "%d", t->max_inflight);
    snprintf(a[4], 48, "%.3f", now);
    snprintf(a[5], 48, "%.3f", now + q->cfg.lease_s);
    snprintf(a[6], 48, "%s", tk->member);
    snprintf(a[7], 48, "%.0f", q->cfg.lease_s + 60);
    snprintf(a[8], 48, "%ld", reserve);
    const char *argv[15] = {"EVAL", ADMIT_LUA, "3", k[0], k[1], k[2]};
    for (int i = 0; i < 9; i++) argv[6 + i] = a[i];
    redisReply *rep = redisCommandArgv(r, 15, argv, NULL);
    double w[N];
    int code = admit_reply(rep, w);
    if (code < 0)
        bad_reply(q, r, rep);
    if (rep)
        freeReplyObject(rep);
    conn_give(q, r, code >= 0);
    if (code == 1 || code == 2)
        *retry_s = rt_quota_retry(w, now - (double)sec, (double)(code == 1 ? t->rpm : t->tpm) - 1);
    return code == 1 ? RT_QUOTA_RPM : code == 2 ? RT_QUOTA_TPM : code == 3 ? RT_QUOTA_INFLIGHT : code;
}

static void done_shared(rt_quota *q, const rt_quota_ticket *tk, long tokens, double now)
{
    const api_key *t = &q->cfg.keys->k[tk->key->tenant_ix];
    long settle = t->tpm ? tokens - tk->reserved : 0;
    if (!t->max_inflight && !settle)
        return;
    redisContext *r = conn_take(q, 1);
    if (!r) /* (conn_take counted it) the slot stays until its lease ends, the tokens are not counted */
        return;
    char k[3][KEY_MAX], n[32], sec[32];
    redis_keys(q, t, k);
    snprintf(n, sizeof n, "%ld", settle);
    snprintf(sec, sizeof sec, "%ld", (long)floor(now));
    const char *argv[] = {"EVAL", DONE_LUA, "2", k[1], k[2], sec, t->max_inflight ? tk->member : "", n};
    redisReply *rep = redisCommandArgv(r, 8, argv, NULL);
    int ok = rep && rep->type == REDIS_REPLY_INTEGER;
    if (!ok)
        bad_reply(q, r, rep);
    if (rep)
        freeReplyObject(rep);
    conn_give(q, r, ok);
}

/* ---- the API --------------------------------------------------------------------------- */

static const char *const LIMIT_NAME[RT_QUOTA_N] = {"", "rpm", "tpm", "max_inflight", "store"};

static void say(const rt_quota *q, const api_key *t, rt_quota_limit l, int shared, double retry_s, char *msg, size_t n)
{
    const char *where = shared ? "across the gateway's replicas (Redis)"
                               : q->host[0] ? "by this gateway replica alone, Redis being unusable (fail open)"
                                            : "by each gateway replica for its share";
    if (l == RT_QUOTA_STORE && !q->host[0])
        snprintf(msg, n, "the gateway has no memory to count tenant '%s''s limits: retry shortly", t->tenant);
    else if (l == RT_QUOTA_STORE)
        snprintf(msg, n, "the gateway's quota store (Redis %s:%d) cannot be reached; tenant '%s' has limits and the "
                 "gateway fails closed: retry shortly", q->host, q->port, t->tenant);
    else if (l == RT_QUOTA_INFLIGHT)
        snprintf(msg, n, "tenant '%s' has its max_inflight of %d requests running (enforced %s); retry when one ends",
                 t->tenant, t->max_inflight, where);
    else
        snprintf(msg, n, "tenant '%s' is over its %s of %ld %s per minute (enforced %s); retry in %.0f s", t->tenant,
                 LIMIT_NAME[l], l == RT_QUOTA_RPM ? t->rpm : t->tpm, l == RT_QUOTA_RPM ? "requests" : "tokens", where,
                 retry_s);
}

rt_quota_limit rt_quota_admit(rt_quota *q, const api_key *key, double now, long reserve, rt_quota_ticket *tk,
                              double *retry_s, char *msg, size_t msg_n)
{
    memset(tk, 0, sizeof *tk);
    *retry_s = 1;
    const api_key *t = &q->cfg.keys->k[key->tenant_ix];
    if (!t->rpm && !t->tpm && !t->max_inflight)
        return RT_QUOTA_OK; /* no limits: nothing to count */
    pthread_mutex_lock(&q->mu);
    unsigned long long seq = ++q->seq;
    pthread_mutex_unlock(&q->mu);
    snprintf(tk->member, sizeof tk->member, "%016llx-%llu", q->id, seq);
    if (reserve < 0)
        reserve = 0;
    int l = q->host[0] ? admit_shared(q, t, now, reserve, tk, retry_s) : -1;
    int shared = l >= 0;
    if (l < 0 && q->host[0] && !q->cfg.fail_open)
        l = RT_QUOTA_STORE;
    else if (l < 0)
        l = admit_here(q, key, t, now, reserve, retry_s);
    if (l) {
        pthread_mutex_lock(&q->mu);
        q->refused[l]++;
        pthread_mutex_unlock(&q->mu);
        say(q, t, (rt_quota_limit)l, shared, *retry_s, msg, msg_n);
        return (rt_quota_limit)l;
    }
    tk->key = key;
    tk->shared = shared;
    tk->reserved = t->tpm ? reserve : 0;
    return RT_QUOTA_OK;
}

void rt_quota_done(rt_quota *q, rt_quota_ticket *tk, long tokens, double now)
{
    if (!tk->key)
        return;
    if (tk->shared) {
        done_shared(q, tk, tokens, now);
    } else {
        pthread_mutex_lock(&q->mu);
        tenant_count *c = count_of(q, tk->key); /* (made at admission) */
        c->inflight--;
        if (tokens != tk->reserved)
            add_at(c, c->tok, (long)floor(now), (double)(tokens - tk->reserved));
        pthread_mutex_unlock(&q->mu);
    }
    tk->key = NULL;
}

unsigned long long rt_quota_last_error(rt_quota *q, char *why, size_t n)
{
    pthread_mutex_lock(&q->mu);
    unsigned long long e = q->store_errors;
    snprintf(why, n, "%s", q->why);
    pthread_mutex_unlock(&q->mu);
    return e;
}

void rt_quota_stats(rt_quota *q, unsigned long long refused[RT_QUOTA_N], unsigned long long *store_errors, int *shared)
{
    pthread_mutex_lock(&q->mu);
    memcpy(refused, q->refused, sizeof q->refused);
    *store_errors = q->store_errors;
    *shared = q->host[0] && llm_clock_mono_s() >= q->down_until; /* not while Redis is marked down */
    pthread_mutex_unlock(&q->mu);
}
