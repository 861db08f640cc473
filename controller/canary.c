/* canary.c - canary configuration, analysis and decisions; see canary.h. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canary.h"
#include "kube_meta.h"

/* ---- configuration ---------------------------------------------------------------- */

double canary_duration(json_t *v)
{
    if (json_is_integer(v))
        return json_integer_value(v) >= 0 ? (double)json_integer_value(v) : -1;
    const char *s = json_string_value(v);
    if (!s || !*s)
        return -1;
    double total = 0;
    while (*s) {
        char *end;
        if (!isdigit((unsigned char)*s))
            return -1;
        double x = strtod(s, &end);
        double unit = *end == 'h' ? 3600 : *end == 'm' ? 60 : 1;
        if (*end == 'h' || *end == 'm' || *end == 's')
            end++;
        else if (*end)
            return -1;
        total += x * unit;
        s = end;
    }
    return total;
}

/* o's key (under spec.canary.where, for the message) or def. */
static llm_status number(json_t *o, const char *where, const char *key, double def, double lo, double hi, double *out,
                         llm_error *err)
{
    json_t *v = json_object_get(o, key);
    *out = v ? json_number_value(v) : def;
    if (v && (!json_is_number(v) || *out < lo || *out > hi))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.canary.%s.%s: want a number in [%g, %g]", where, key, lo, hi);
    return LLM_OK;
}

static llm_status steps_from_spec(json_t *steps, canary_config *c, llm_error *err)
{
    if (!json_is_array(steps) || json_array_size(steps) == 0 || json_array_size(steps) > CANARY_MAX_STEPS)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.canary.steps: want 1 to %d steps like {weight: 10, pause: 2m}",
                        CANARY_MAX_STEPS);
    int last = 0;
    for (size_t i = 0; i < json_array_size(steps); i++) {
        json_t *s = json_array_get(steps, i), *w = json_object_get(s, "weight");
        double pause = json_object_get(s, "pause") ? canary_duration(json_object_get(s, "pause")) : 0;
        if (!json_is_integer(w) || json_integer_value(w) < 1 || json_integer_value(w) > 100 ||
            json_integer_value(w) < last)
            return llm_errf(err, LLM_ERR_INVALID_ARG,
                            "spec.canary.steps[%zu].weight: want an integer 1..100, not below the step before", i);
        if (pause < 0)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.canary.steps[%zu].pause: want a duration like 90s or 2m", i);
        last = (int)json_integer_value(w);
        c->steps[c->n_steps++] = (canary_step){last, pause};
    }
    return LLM_OK;
}

/* spec.canary.analysis.quality (absent or null: off). */
static llm_status quality_from_spec(json_t *q, canary_quality *c, llm_error *err)
{
    if (!q || json_is_null(q))
        return LLM_OK;
    if (!json_is_object(q))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.canary.analysis.quality: want an object");
    c->enabled = 1;
    double minp = 0, top = 0, timeout = 0;
    json_t *cm = json_object_get(json_object_get(q, "texts"), "configMap");
    const char *on = json_string_value(json_object_get(q, "onIncomparable"));
    llm_status st = number(q, "analysis.quality", "minPositions", 1000, 1, 1e6, &minp, err);
    if (!st)
        st = number(q, "analysis.quality", "maxKLDivergence", 0.1, 0, 100, &c->max_kl, err);
    if (!st)
        st = number(q, "analysis.quality", "minTop1Agreement", 0.8, 0, 1, &c->min_top1, err);
    if (!st)
        st = number(q, "analysis.quality", "topLogprobs", 20, 1, 20, &top, err);
    if (!st)
        st = number(q, "analysis.quality", "timeoutSeconds", 600, 10, 3600, &timeout, err);
    if (!st && cm && (!kube_meta_name_ok(json_string_value(cm)) || strlen(json_string_value(cm)) >= sizeof c->config_map))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "spec.canary.analysis.quality.texts.configMap: want a ConfigMap's name "
                      "(a DNS subdomain: lower-case letters, digits, '-' and '.')");
    if (!st && on && strcmp(on, "hold") && strcmp(on, "fail"))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "spec.canary.analysis.quality.onIncomparable: %s is not hold or fail", on);
    snprintf(c->config_map, sizeof c->config_map, "%s", cm ? json_string_value(cm) ?: "" : "");
    c->min_positions = (long)minp;
    c->top = (int)top;
    c->timeout_s = timeout;
    c->fail_incomparable = on && !strcmp(on, "fail");
    return st;
}

llm_status canary_config_from_spec(json_t *spec, canary_config *c, llm_error *err)
{
    memset(c, 0, sizeof *c);
    json_t *cn = json_object_get(spec, "canary");
    if (!cn || json_is_null(cn))
        return LLM_OK;
    c->enabled = 1;
    const char *mode = json_string_value(json_object_get(cn, "mode"));
    c->colocated = mode && !strcmp(mode, "colocated");
    llm_status st = mode && !c->colocated && strcmp(mode, "pods")
                        ? llm_errf(err, LLM_ERR_INVALID_ARG, "spec.canary.mode: %s is not pods or colocated", mode)
                        : steps_from_spec(json_object_get(cn, "steps"), c, err);
    json_t *iv = json_object_get(cn, "intervalSeconds"), *an = json_object_get(cn, "analysis");
    double min_req = 0;
    c->interval_s = iv ? (double)json_integer_value(iv) : 10;
    if (!st && iv && (!json_is_integer(iv) || c->interval_s < 1 || c->interval_s > 3600))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "spec.canary.intervalSeconds: want an integer 1..3600");
    if (!st)
        st = number(an, "analysis", "maxErrorRatio", 0.05, 0, 1, &c->max_error_ratio, err);
    if (!st)
        st = number(an, "analysis", "maxTTFTRatio", 1.5, 1, 1000, &c->max_ttft_ratio, err);
    if (!st)
        st = number(an, "analysis", "maxITLRatio", 1.5, 1, 1000, &c->max_itl_ratio, err);
    if (!st)
        st = number(an, "analysis", "toleranceSeconds", 0.05, 0, 3600, &c->tolerance_s, err);
    if (!st)
        st = number(an, "analysis", "minRequests", 20, 1, 1e9, &min_req, err);
    c->min_requests = (int)min_req;
    const char *on = json_string_value(json_object_get(an, "onInconclusive"));
    if (!st)
        st = number(an, "analysis", "inconclusiveTimeoutSeconds", 1800, 0, 86400 * 7, &c->inconclusive_s, err);
    if (!st && on && strcmp(on, "pause") && strcmp(on, "rollback"))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "spec.canary.analysis.onInconclusive: %s is not pause or rollback", on);
    c->rollback_inconclusive = on && !strcmp(on, "rollback");
    return st ? st : quality_from_spec(json_object_get(an, "quality"), &c->quality, err);
}

/* ---- samples ----------------------------------------------------------------------- */

/* The value of label key in the {k="v",...} block lb..rb, into out (our
 * routers' label values hold no commas). */
static int label(const char *lb, const char *rb, const char *key, char *out, size_t n)
{
    size_t kn = strlen(key);
    for (const char *q = lb + 1; q && q < rb;) {
        if ((size_t)(rb - q) > kn + 1 && !strncmp(q, key, kn) && q[kn] == '=' && q[kn + 1] == '"') {
            const char *v = q + kn + 2, *e = memchr(v, '"', (size_t)(rb - v));
            if (!e || (size_t)(e - v) >= n)
                return 0;
            memcpy(out, v, (size_t)(e - v));
            out[e - v] = 0;
            return 1;
        }
        q = memchr(q, ',', (size_t)(rb - q));
        q = q ? q + 1 : NULL;
    }
    return 0;
}

/* Index of bucket bound le, added (in order) when new; -1 when full. */
static int le_index(canary_sample *s, double le)
{
    for (int i = 0; i < s->n_le; i++)
        if (s->le[i] == le)
            return i;
    if (s->n_le == CANARY_MAX_BUCKETS)
        return -1;
    int i = s->n_le++;
    while (i > 0 && s->le[i - 1] > le) { /* keep bounds sorted: shift counts with them */
        s->le[i] = s->le[i - 1];
        for (int r = 0; r < 2; r++) s->ttft[r][i] = s->ttft[r][i - 1], s->itl[r][i] = s->itl[r][i - 1];
        i--;
    }
    s->le[i] = le;
    for (int r = 0; r < 2; r++) s->ttft[r][i] = 0, s->itl[r][i] = 0;
    return i;
}

/* One line of a page into s when it is a revision series (of route, when
 * route is given: a gateway's page holds every route's); 1 when taken. */
static int sample_line(canary_sample *s, const char *p, const char *eol, const char *route)
{
    /* llm-router's series, or llm-server's for a colocated canary (the same without "router_") */
    static const char req[] = "revision_requests_total{", ttft[] = "revision_ttfb_seconds_bucket{",
                      itl[] = "revision_itl_seconds_bucket{";
    if (!strncmp(p, "llm_router_", 11))
        p += 11;
    else if (!strncmp(p, "llm_", 4))
        p += 4;
    else
        return 0;
    int kind = !strncmp(p, req, sizeof req - 1) ? 1 : !strncmp(p, ttft, sizeof ttft - 1) ? 2
               : !strncmp(p, itl, sizeof itl - 1) ? 3 : 0;
    const char *lb = kind ? strchr(p, '{') : NULL, *rb = lb ? memchr(lb, '}', (size_t)(eol - lb)) : NULL;
    char rev[16], code[16], le[32], rt[260];
    if (!rb || !label(lb, rb, "revision", rev, sizeof rev) || (strcmp(rev, "stable") && strcmp(rev, "canary")))
        return 0;
    if (route && (!label(lb, rb, "route", rt, sizeof rt) || strcmp(rt, route)))
        return 0;
    int r = !strcmp(rev, "canary");
    char *end;
    double v = strtod(rb + 1, &end);
    if (end == rb + 1 || !isfinite(v))
        return 0;
    if (kind == 1 && label(lb, rb, "code", code, sizeof code)) {
        s->requests[r] += v;
        if (!strcmp(code, "5xx") || !strcmp(code, "none"))
            s->errors[r] += v;
        return 1;
    }
    if (kind == 1 || !label(lb, rb, "le", le, sizeof le))
        return 0;
    double (*h)[CANARY_MAX_BUCKETS + 1] = kind == 2 ? s->ttft : s->itl;
    double bound = strtod(le, &end);
    if (*end || end == le)
        return 0;
    if (!isfinite(bound)) { /* "+Inf" (and other spellings of it) */
        h[r][CANARY_MAX_BUCKETS] += v;
        return 1;
    }
    int i = le_index(s, bound);
    if (i >= 0)
        h[r][i] += v;
    return i >= 0;
}

int canary_sample_add_route(canary_sample *s, const char *text, const char *route)
{
    int taken = 0;
    for (const char *p = text; p && *p;) {
        const char *eol = strchr(p, '\n');
        if (!eol)
            eol = p + strlen(p);
        if (*p != '#')
            taken += sample_line(s, p, eol, route);
        p = *eol ? eol + 1 : NULL;
    }
    return taken;
}

void canary_sample_add(canary_sample *s, const char *text)
{
    canary_sample_add_route(s, text, NULL);
}

int canary_sample_diff(const canary_sample *now, const canary_sample *then, canary_sample *out)
{
    int reset = then->n_le && then->n_le != now->n_le;
    for (int r = 0; r < 2; r++)
        reset |= now->requests[r] < then->requests[r] || now->errors[r] < then->errors[r] ||
                 now->ttft[r][CANARY_MAX_BUCKETS] < then->ttft[r][CANARY_MAX_BUCKETS] ||
                 now->itl[r][CANARY_MAX_BUCKETS] < then->itl[r][CANARY_MAX_BUCKETS];
    *out = *now;
    if (reset)
        return 1;
    for (int r = 0; r < 2; r++) {
        out->requests[r] -= then->requests[r];
        out->errors[r] -= then->errors[r];
        for (int i = 0; i <= CANARY_MAX_BUCKETS; i++) {
            out->ttft[r][i] -= then->ttft[r][i];
            out->itl[r][i] -= then->itl[r][i];
        }
    }
    return 0;
}

static json_t *counts(const double *h, int n_le)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n_le; i++) json_array_append_new(a, json_real(h[i]));
    json_array_append_new(a, json_real(h[CANARY_MAX_BUCKETS]));
    return a;
}

json_t *canary_sample_to_json(const canary_sample *s)
{
    json_t *le = json_array();
    for (int i = 0; le && i < s->n_le; i++) json_array_append_new(le, json_real(s->le[i]));
    return json_pack("{s:[f,f],s:[f,f],s:o,s:[o,o],s:[o,o]}", "requests", s->requests[0], s->requests[1], "errors",
                     s->errors[0], s->errors[1], "le", le, "ttft", counts(s->ttft[0], s->n_le),
                     counts(s->ttft[1], s->n_le), "itl", counts(s->itl[0], s->n_le), counts(s->itl[1], s->n_le));
}

int canary_sample_from_json(json_t *j, canary_sample *s)
{
    memset(s, 0, sizeof *s);
    json_t *le = json_object_get(j, "le");
    if (!json_is_array(le) || json_array_size(le) > CANARY_MAX_BUCKETS)
        return 0;
    s->n_le = (int)json_array_size(le);
    for (int i = 0; i < s->n_le; i++) s->le[i] = json_number_value(json_array_get(le, (size_t)i));
    for (int r = 0; r < 2; r++) {
        s->requests[r] = json_number_value(json_array_get(json_object_get(j, "requests"), (size_t)r));
        s->errors[r] = json_number_value(json_array_get(json_object_get(j, "errors"), (size_t)r));
        json_t *t = json_array_get(json_object_get(j, "ttft"), (size_t)r), *g = json_array_get(json_object_get(j, "itl"), (size_t)r);
        if (json_array_size(t) != (size_t)s->n_le + 1 || json_array_size(g) != (size_t)s->n_le + 1) {
            memset(s, 0, sizeof *s);
            return 0;
        }
        for (int i = 0; i <= s->n_le; i++) {
            int k = i == s->n_le ? CANARY_MAX_BUCKETS : i;
            s->ttft[r][k] = json_number_value(json_array_get(t, (size_t)i));
            s->itl[r][k] = json_number_value(json_array_get(g, (size_t)i));
        }
    }
    return 1;
}

double canary_quantile(const double *le, int n_le, const double *cum, double q)
{
    double total = cum[CANARY_MAX_BUCKETS];
    if (!(total > 0))
        return -1;
    double rank = q * total, below = 0, lo = 0;
    for (int i = 0; i < n_le; i++) {
        if (cum[i] >= rank) {
            double in = cum[i] - below;
            return in > 0 ? lo + (le[i] - lo) * (rank - below) / in : le[i];
        }
        below = cum[i];
        lo = le[i];
    }
    return n_le ? le[n_le - 1] : -1; /* in the +Inf bucket: the highest bound is all one can say */
}

/* ---- analysis ---------------------------------------------------------------------- */

/* Canary latency beyond stable's by both the ratio and the tolerance. */
/* A latency signal fails when the canary's p99 is over ratio x stable's
 * and slower by more than the tolerance; the verdict names it. */
static int latency_fails(const char *signal, const char *what, const double p99[2], double ratio, double tol,
                         canary_analysis *a)
{
    if (!(p99[1] >= 0 && p99[0] >= 0 && p99[1] > p99[0] * ratio && p99[1] - p99[0] > tol))
        return 0;
    a->verdict = CANARY_FAIL;
    snprintf(a->signal, sizeof a->signal, "%s", signal);
    snprintf(a->message, sizeof a->message, "canary p99 %s %.3f s is %.2fx stable's %.3f s (limit %.2fx)", what, p99[1],
             p99[1] / (p99[0] > 0 ? p99[0] : 1e-9), p99[0], ratio);
    return 1;
}

void canary_analyse(const canary_config *c, const canary_sample *w, canary_analysis *a)
{
    memset(a, 0, sizeof *a);
    for (int r = 0; r < 2; r++) {
        a->requests[r] = w->requests[r];
        a->error_ratio[r] = w->requests[r] > 0 ? w->errors[r] / w->requests[r] : -1;
        a->ttft_p99[r] = canary_quantile(w->le, w->n_le, w->ttft[r], 0.99);
        a->itl_p99[r] = canary_quantile(w->le, w->n_le, w->itl[r], 0.99);
    }
    double es = a->error_ratio[0] > 0 ? a->error_ratio[0] : 0;
    if (w->requests[1] < c->min_requests) {
        a->verdict = CANARY_INCONCLUSIVE;
        snprintf(a->message, sizeof a->message, "%.0f of the %d canary requests needed so far", w->requests[1],
                 c->min_requests);
    } else if (a->error_ratio[1] > es + c->max_error_ratio) {
        a->verdict = CANARY_FAIL;
        snprintf(a->signal, sizeof a->signal, "ErrorRatio");
        snprintf(a->message, sizeof a->message,
                 "canary error ratio %.3f (%.0f of %.0f requests) exceeds stable's %.3f by more than %.3f",
                 a->error_ratio[1], w->errors[1], w->requests[1], es, c->max_error_ratio);
    } else if (!latency_fails("TimeToFirstToken", "time to first token", a->ttft_p99, c->max_ttft_ratio,
                              c->tolerance_s, a) &&
               !latency_fails("InterTokenLatency", "inter-token latency", a->itl_p99, c->max_itl_ratio, c->tolerance_s,
                              a)) {
        a->verdict = CANARY_PASS;
        snprintf(a->message, sizeof a->message,
                 "%.0f canary requests: error ratio %.3f (stable %.3f), p99 TTFT %.3f s (stable %.3f s), p99 ITL %.3f s "
                 "(stable %.3f s)", w->requests[1], a->error_ratio[1], es, a->ttft_p99[1], a->ttft_p99[0], a->itl_p99[1],
                 a->itl_p99[0]);
    }
}

canary_action canary_decide(const canary_config *c, int step, double step_age_s, double window_age_s, canary_verdict v,
                            int paused)
{
    if (v == CANARY_FAIL)
        return CANARY_ROLLBACK;
    if (v == CANARY_INCONCLUSIVE && !paused && step >= 0 && c->inconclusive_s > 0 && window_age_s >= c->inconclusive_s)
        return c->rollback_inconclusive ? CANARY_ROLLBACK : CANARY_STALLED;
    if (paused || v != CANARY_PASS || step < 0 || step >= c->n_steps || step_age_s < c->steps[step].pause_s)
        return CANARY_HOLD;
    return step + 1 < c->n_steps ? CANARY_ADVANCE : CANARY_PROMOTE;
}

void canary_split(int total, int weight, int *stable, int *canary)
{
    if (total < 1)
        total = 1;
    int c = (int)ceil(total * weight / 100.0);
    *canary = c < 1 ? 1 : c;
    int s = weight >= 100 ? total : total - total * weight / 100;
    *stable = s < 1 ? 1 : s;
}
