/* quality.c - KL divergence and top-1 agreement of two revisions' listed
 * next-token distributions; see quality.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quality.h"

int quality_pos_from_json(json_t *entry, quality_pos *out)
{
    out->n = 0;
    if (!json_is_object(entry) || json_object_size(entry) > QUALITY_MAX_LIST)
        return -1;
    const char *key;
    json_t *v;
    json_object_foreach(entry, key, v) {
        char *end;
        long id = strtol(key, &end, 10);
        json_t *lp = json_object_get(v, "logprob"), *rank = json_object_get(v, "rank");
        double x = json_number_value(lp);
        long long r = rank ? json_integer_value(rank) : 0;
        if (!*key || *end || id < 0 || id > INT32_MAX || !json_is_number(lp) || !(x <= 0) || !isfinite(x) ||
            (rank && (!json_is_integer(rank) || r < 1 || r > INT32_MAX)))
            return -1;
        out->t[out->n++] = (quality_tok){(int32_t)id, x, (int)r};
    }
    return 0;
}

int32_t quality_top1(const quality_pos *p)
{
    int best = -1;
    for (int i = 0; i < p->n; i++)
        if (best < 0 || p->t[i].logprob > p->t[best].logprob ||
            (p->t[i].logprob == p->t[best].logprob && p->t[i].id < p->t[best].id))
            best = i;
    return best < 0 ? -1 : p->t[best].id;
}

/* q's probability of id, or -1 when q does not list it. */
static double listed(const quality_pos *q, int32_t id)
{
    for (int i = 0; i < q->n; i++)
        if (q->t[i].id == id)
            return exp(q->t[i].logprob);
    return -1;
}

/* p log(p / q), 0 where p is 0. */
static double term(double p, double q)
{
    return p > 0 ? p * log(p / (q > QUALITY_FLOOR ? q : QUALITY_FLOOR)) : 0;
}

/* The most an unlisted token's probability can be: that of rank m, the
 * last of ranks 1..m listed without a gap; without ranks, the smallest
 * listed. */
static double unlisted_bound(const quality_pos *q)
{
    double least = 1, at_m = -1;
    for (int i = 0; i < q->n; i++) {
        double x = exp(q->t[i].logprob);
        least = x < least ? x : least;
    }
    for (int m = 1; m <= q->n; m++) {
        int found = -1;
        for (int i = 0; i < q->n && found < 0; i++)
            if (q->t[i].rank == m)
                found = i;
        if (found < 0)
            break;
        at_m = exp(q->t[found].logprob);
    }
    return at_m >= 0 ? at_m : least;
}

double quality_kl(const quality_pos *p, const quality_pos *q)
{
    double q_listed = 0, q_min = unlisted_bound(q);
    for (int i = 0; i < q->n; i++) q_listed += exp(q->t[i].logprob);
    int missing = 0;
    for (int i = 0; i < p->n; i++) missing += listed(q, p->t[i].id) < 0;
    /* a token of p's list that q does not list: an equal share of q's unlisted mass, at most the bound */
    double unlisted = 1 - q_listed > QUALITY_FLOOR ? 1 - q_listed : QUALITY_FLOOR;
    double share = missing ? unlisted / (missing + 1) : 0; /* (+1: the rest of the vocabulary keeps a share too) */
    share = share < q_min ? share : q_min;
    double kl = 0, p_sum = 0, q_sum = 0;
    for (int i = 0; i < p->n; i++) {
        double pi = exp(p->t[i].logprob), qi = listed(q, p->t[i].id);
        qi = qi < 0 ? share : qi;
        kl += term(pi, qi);
        p_sum += pi, q_sum += qi;
    }
    double p_tail = 1 - p_sum, q_tail = 1 - q_sum;
    kl += term(p_tail > 0 ? p_tail : 0, q_tail);
    return kl > 0 ? kl : 0; /* (rounding of lists that hold nearly all the mass) */
}

/* One position into add: both empty (the first token, nothing precedes
 * it) adds nothing. 0, or -1 when only one side is empty. */
static int add_one(quality_sum *add, const quality_pos *p, const quality_pos *q)
{
    if (!p->n && !q->n)
        return 0;
    if (!p->n || !q->n)
        return -1;
    double kl = quality_kl(p, q);
    add->kl += kl;
    add->kl_max = kl > add->kl_max ? kl : add->kl_max;
    add->positions++;
    add->top1_same += quality_top1(p) == quality_top1(q);
    return 0;
}

static void merge_sum(quality_sum *s, const quality_sum *add)
{
    s->kl += add->kl;
    s->kl_max = add->kl_max > s->kl_max ? add->kl_max : s->kl_max;
    s->positions += add->positions;
    s->top1_same += add->top1_same;
}

int quality_pos_list(json_t *list, size_t from, size_t n, quality_pos *out, char *why, size_t why_n)
{
    if (!json_is_array(list) || from + n < from || from + n > json_array_size(list)) {
        snprintf(why, why_n, "a prompt_logprobs list of %zu positions, not the %zu wanted", json_array_size(list), from + n);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(list, from + i);
        out[i].n = 0;
        if (!json_is_null(e) && quality_pos_from_json(e, &out[i])) {
            snprintf(why, why_n, "position %zu: not a prompt_logprobs entry", from + i);
            return -1;
        }
    }
    return 0;
}

int quality_add_pos(quality_sum *s, const quality_pos *p, const quality_pos *q, size_t n, char *why, size_t why_n)
{
    quality_sum add = {0};
    for (size_t i = 0; i < n; i++)
        if (add_one(&add, &p[i], &q[i])) {
            snprintf(why, why_n, "position %zu: listed on one side only", i);
            return -1;
        }
    merge_sum(s, &add);
    return 0;
}

int quality_add(quality_sum *s, json_t *stable, json_t *canary, char *why, size_t why_n)
{
    size_t n = json_array_size(stable);
    if (!json_is_array(stable) || !json_is_array(canary) || n != json_array_size(canary)) {
        snprintf(why, why_n, "the revisions' lists differ in length (%zu and %zu positions)", n,
                 json_array_size(canary));
        return -1;
    }
    quality_sum add = {0};
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(stable, i), *b = json_array_get(canary, i);
        quality_pos p = {0}, q = {0};
        if ((!json_is_null(a) && quality_pos_from_json(a, &p)) || (!json_is_null(b) && quality_pos_from_json(b, &q)) ||
            add_one(&add, &p, &q)) {
            snprintf(why, why_n, "position %zu: not a prompt_logprobs entry on one side", i);
            return -1;
        }
    }
    merge_sum(s, &add);
    return 0;
}
