/* sampler.c - penalties, filters, seeded sampling, logprobs, stop matching.
 *
 * Work is O(n_vocab) per token except when top-p needs an order: then only
 * the candidates that survive top-k / min-p are sorted. */
#include "llm/sampler.h"

#include <math.h>
#include <string.h>

typedef struct cand { int32_t id; float v; } cand;

struct llm_sampler {
    llm_sampling p;
    int n_vocab;
    uint64_t rng[4];
    int32_t *hist;    /* ring of recent tokens */
    int hist_cap, hist_n, hist_at;
    int *counts;      /* occurrences of each id within the ring */
    float *work;      /* penalized logits */
    cand *c;
    llm_logit_bias *bias; /* copied from p (p.bias points here) */
    uint32_t *ban;    /* (n_words) tokens a bias bans; NULL: none */
    uint32_t *mask;   /* (n_words) this step's allowed tokens; NULL until a step needs it */
    int n_words;
};

static int bit_get(const uint32_t *w, int i) { return (int)(w[i >> 5] >> (i & 31)) & 1; }

llm_sampling llm_sampling_default(void)
{
    llm_sampling p = {0};
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.penalty_last_n = 64;
    return p;
}

llm_status llm_sampling_check(const llm_sampling *p, llm_error *err)
{
    if (!(p->temperature >= 0 && p->temperature <= 100))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "temperature %g not in [0, 100]", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "top_p %g not in (0, 1]", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "min_p %g not in [0, 1]", p->min_p);
    if (p->top_k < 0)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "top_k %d is negative", p->top_k);
    if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 10))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "repetition_penalty %g not in (0, 10]", p->repetition_penalty);
    if (!(fabsf(p->presence_penalty) <= 2) || !(fabsf(p->frequency_penalty) <= 2))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "presence/frequency penalties must be in [-2, 2]");
    if (p->penalty_last_n < 0 || p->penalty_last_n > (1 << 20))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "penalty_last_n %d not in [0, 1048576]", p->penalty_last_n);
    if (p->n_logprobs < 0 || p->n_logprobs > LLM_MAX_LOGPROBS)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "logprobs %d not in [0, %d]", p->n_logprobs, LLM_MAX_LOGPROBS);
    if (p->n_bias < 0 || p->n_bias > LLM_MAX_LOGIT_BIAS || (p->n_bias && !p->bias))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%d logit biases (at most %d)", p->n_bias, LLM_MAX_LOGIT_BIAS);
    for (int i = 0; i < p->n_bias; i++)
        if (!(fabsf(p->bias[i].bias) <= 100))
            return llm_errf(err, LLM_ERR_INVALID_ARG, "logit bias %g for token %d not in [-100, 100]", p->bias[i].bias,
                            p->bias[i].id);
    return LLM_OK;
}

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256**: fast, good, and reproducible for a given seed. */
static double rng_uniform(uint64_t *s)
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

/* Copies the biases and marks the banned ids; every id is checked. */
static llm_status bias_init(llm_sampler *s, const llm_sampling *p, llm_error *err)
{
    int n_banned = 0;
    if (!p->n_bias)
        return LLM_OK;
    s->bias = malloc(sizeof *s->bias * (size_t)p->n_bias);
    s->ban = calloc((size_t)s->n_words, sizeof(uint32_t));
    if (!s->bias || !s->ban)
        return llm_errf(err, LLM_ERR_NOMEM, "sampler: no memory for %d logit biases", p->n_bias);
    memcpy(s->bias, p->bias, sizeof *s->bias * (size_t)p->n_bias);
    s->p.bias = s->bias;
    for (int i = 0; i < p->n_bias; i++) {
        int32_t id = s->bias[i].id;
        if (id < 0 || id >= s->n_vocab)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "logit_bias names token %d, not in [0, %d)", id, s->n_vocab);
        if (s->bias[i].bias <= LLM_LOGIT_BIAS_BAN && !bit_get(s->ban, id)) {
            s->ban[id >> 5] |= 1u << (id & 31);
            n_banned++;
        }
    }
    if (n_banned == s->n_vocab)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "logit_bias bans every token of the vocabulary");
    return LLM_OK;
}

llm_status llm_sampler_new(const llm_sampling *p, int n_vocab, llm_sampler **out, llm_error *err)
{
    *out = NULL;
    llm_status st = llm_sampling_check(p, err);
    if (st)
        return st;
    llm_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return llm_errf(err, LLM_ERR_NOMEM, "sampler: no memory");
    s->p = *p;
    s->p.bias = NULL;
    s->n_vocab = n_vocab;
    s->n_words = (n_vocab + 31) / 32;
    s->hist_cap = p->penalty_last_n ? p->penalty_last_n : 4096;
    s->hist = malloc(sizeof(int32_t) * (size_t)s->hist_cap);
    s->counts = calloc((size_t)n_vocab, sizeof(int));
    s->work = malloc(sizeof(float) * (size_t)n_vocab);
    s->c = malloc(sizeof(cand) * (size_t)n_vocab);
    if (!s->hist || !s->counts || !s->work || !s->c) {
        llm_sampler_free(s);
        return llm_errf(err, LLM_ERR_NOMEM, "sampler: no memory for %d-token vocab", n_vocab);
    }
    if ((st = bias_init(s, p, err))) {
        llm_sampler_free(s);
        return st;
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix(&x);
    *out = s;
    return LLM_OK;
}

void llm_sampler_free(llm_sampler *s)
{
    if (!s)
        return;
    free(s->hist);
    free(s->counts);
    free(s->work);
    free(s->c);
    free(s->bias);
    free(s->ban);
    free(s->mask);
    free(s);
}

void llm_sampler_accept(llm_sampler *s, int32_t id)
{
    if (id < 0 || id >= s->n_vocab)
        return;
    if (s->hist_n == s->hist_cap)
        s->counts[s->hist[s->hist_at]]--;
    else
        s->hist_n++;
    s->hist[s->hist_at] = id;
    s->hist_at = (s->hist_at + 1) % s->hist_cap;
    s->counts[id]++;
}

static void apply_penalties(llm_sampler *s)
{
    const llm_sampling *p = &s->p;
    if (p->repetition_penalty == 1 && p->presence_penalty == 0 && p->frequency_penalty == 0)
        return;
    for (int i = 0; i < s->hist_n; i++) {
        int32_t id = s->hist[i];
        if (s->counts[id] < 0)
            continue; /* already done: marked below, restored after */
        float *l = &s->work[id];
        *l = *l > 0 ? *l / p->repetition_penalty : *l * p->repetition_penalty;
        *l -= (float)s->counts[id] * p->frequency_penalty + p->presence_penalty;
        s->counts[id] = -s->counts[id];
    }
    for (int i = 0; i < s->hist_n; i++)
        if (s->counts[s->hist[i]] < 0)
            s->counts[s->hist[i]] = -s->counts[s->hist[i]];
}

/* The lowest id of the largest value among those mask allows (NULL: all;
 * it allows one at least); NaN never wins (as on the device). Callers
 * reject NaN logits first, so this is only consistency. */
static int32_t argmax(const float *v, int n, const uint32_t *mask)
{
    int32_t best = 0;
    while (best < n - 1 && (isnan(v[best]) || (mask && !bit_get(mask, best)))) best++;
    for (int i = best + 1; i < n; i++)
        if (v[i] > v[best] && (!mask || bit_get(mask, i)))
            best = i;
    return best;
}

/* The normalizer of the penalized logits at temperature 1: log-sum-exp,
 * or, when some logits are +inf, how many (they share all the mass). */
typedef struct lnorm {
    double lz;
    int n_inf;
} lnorm;

static lnorm log_norm(const float *v, int n)
{
    float mx = v[argmax(v, n, NULL)];
    lnorm z = {0, 0};
    if (isinf(mx) && mx > 0) {
        for (int i = 0; i < n; i++) z.n_inf += v[i] == mx;
        return z;
    }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)v[i] - mx);
    z.lz = mx + log(sum); /* every logit -inf: -inf, and every logprob the floor */
    return z;
}

/* A logit's log-probability, never below the floor (nor NaN). */
static float logprob_of(float v, lnorm z)
{
    double lp = z.n_inf ? (isinf(v) && v > 0 ? -log((double)z.n_inf) : -INFINITY) : (double)v - z.lz;
    return !(lp >= LLM_LOGPROB_FLOOR) ? LLM_LOGPROB_FLOOR : (float)lp;
}

/* The k most likely of n values v (those mask permits; NULL: all) into
 * top, most likely first, ties by lower id; how many (k, or fewer when
 * fewer are permitted). */
static int top_of(const float *v, int n, const uint32_t *mask, lnorm z, int k, llm_logprob *top)
{
    int n_top = 0;
    for (int i = 0; i < n; i++) {
        if (mask && !bit_get(mask, i))
            continue;
        float lp = logprob_of(v[i], z);
        if (n_top == k && (n_top == 0 || lp <= top[n_top - 1].logprob))
            continue;
        int j = n_top < k ? n_top++ : n_top - 1;
        while (j > 0 && top[j - 1].logprob < lp) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (llm_logprob){i, lp};
    }
    return n_top;
}

static void top_logprobs(const llm_sampler *s, const uint32_t *mask, lnorm z, llm_sample_result *r)
{
    r->n_top = top_of(s->work, s->n_vocab, mask, z, s->p.n_logprobs, r->top);
}

llm_status llm_prompt_logprob_of(const float *logits, int n_vocab, int32_t id, int k, llm_prompt_logprob *out,
                                 llm_error *err)
{
    memset(out, 0, sizeof *out);
    out->id = id;
    if (id < 0 || id >= n_vocab || k < 0 || k > LLM_MAX_LOGPROBS)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "prompt logprob of token %d with %d alternatives (vocabulary %d, "
                        "at most %d alternatives)", (int)id, k, n_vocab, LLM_MAX_LOGPROBS);
    int above = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (isnan(logits[i]))
            return llm_errf(err, LLM_ERR_NUMERIC, "the model produced a NaN logit (token id %d)", i);
        above += logits[i] > logits[id];
    }
    lnorm z = log_norm(logits, n_vocab);
    out->logprob = logprob_of(logits[id], z);
    out->rank = above + 1;
    out->n_top = top_of(logits, n_vocab, NULL, z, k, out->top);
    return LLM_OK;
}

static int cand_desc(const void *a, const void *b)
{
    float x = ((const cand *)a)->v, y = ((const cand *)b)->v;
    return x < y ? 1 : x > y ? -1 : (((const cand *)a)->id - ((const cand *)b)->id);
}

/* a before b in the candidates' order: larger value, then lower id. */
static int cand_before(const cand *a, const cand *b) { return a->v > b->v || (a->v == b->v && a->id < b->id); }

/* Moves the k first candidates in that order to the front (unordered):
 * exactly k, ties at the k-th value broken by the lowest id, as the
 * device sampler breaks them (a quickselect on value alone kept an
 * arbitrary subset of the ties). */
static void select_top(cand *c, int n, int k)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        cand pivot = c[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_before(&c[i], &pivot)) i++;
            while (cand_before(&pivot, &c[j])) j--;
            if (i <= j) { cand t = c[i]; c[i] = c[j]; c[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* The pick among the candidates' weights, or -1 when there is no finite
 * positive total to draw from. */
static int32_t draw(llm_sampler *s, int n, double sum)
{
    if (n < 1 || !(sum > 0) || !isfinite(sum))
        return -1;
    double u = rng_uniform(s->rng) * sum, acc = 0;
    for (int i = 0; i < n; i++)
        if ((acc += s->c[i].v) > u)
            return s->c[i].id;
    return s->c[n - 1].id; /* u rounded up to sum */
}

/* Temperature with top-k, min-p and top-p; the argmax when the scaled
 * logits are not finite (an infinite logit, or logit / T overflowing) or
 * the filters leave nothing to draw from. */
static int32_t sample_filtered(llm_sampler *s, const uint32_t *mask)
{
    const llm_sampling *p = &s->p;
    int n = 0;
    for (int i = 0; i < s->n_vocab; i++)
        if (!mask || bit_get(mask, i))
            s->c[n++] = (cand){i, s->work[i] / p->temperature};
    if (p->top_k > 0 && p->top_k < n) {
        select_top(s->c, n, p->top_k);
        n = p->top_k;
    }
    float mx = s->c[0].v;
    for (int i = 1; i < n; i++) mx = fmaxf(mx, s->c[i].v);
    if (!isfinite(mx))
        return argmax(s->work, s->n_vocab, mask);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (s->c[i].v = expf(s->c[i].v - mx));
    if (p->min_p > 0) { /* keep tokens with p >= min_p * p_max; p_max is exp(0) = 1 */
        int k = 0;
        sum = 0;
        for (int i = 0; i < n; i++)
            if (s->c[i].v >= p->min_p)
                sum += (s->c[k++] = s->c[i]).v;
        n = k;
    }
    if (p->top_p < 1) {
        qsort(s->c, (size_t)n, sizeof(cand), cand_desc);
        double acc = 0;
        int k = 0;
        while (k < n && acc < p->top_p * sum) acc += s->c[k++].v;
        n = k;
        sum = acc;
    }
    int32_t id = draw(s, n, sum);
    return id >= 0 ? id : argmax(s->work, s->n_vocab, mask);
}

static int greedy(const llm_sampling *p) { return !(p->temperature >= LLM_SAMPLING_GREEDY_BELOW); }

int llm_sampler_device_ok(const llm_sampler *s)
{
    const llm_sampling *p = &s->p;
    return p->repetition_penalty == 1 && p->presence_penalty == 0 && p->frequency_penalty == 0 && !p->logprobs &&
           !p->n_logprobs && !p->n_bias;
}

void llm_sampler_device_params(llm_sampler *s, llm_sample_params *out)
{
    const llm_sampling *p = &s->p;
    *out = (llm_sample_params){greedy(p) ? 0.f : p->temperature, p->top_k, p->top_p, p->min_p, 0};
    if (!greedy(p))
        out->u = (float)rng_uniform(s->rng);
    if (out->u >= 1.0f) /* float rounding of a draw just under 1 */
        out->u = 0.99999994f;
}

/* The step's mask: allow and not banned, or NULL when both are absent;
 * -1 when it allows no token. Disallowed logits become -inf, so the
 * normalizer and the log-probabilities are those of the allowed set. */
static int step_mask(llm_sampler *s, const uint32_t *allow, const uint32_t **mask)
{
    *mask = NULL;
    if (!allow && !s->ban)
        return 0;
    if (!s->mask && !(s->mask = malloc(sizeof(uint32_t) * (size_t)s->n_words)))
        return -2;
    int any = 0;
    for (int w = 0; w < s->n_words; w++) {
        uint32_t m = (allow ? allow[w] : ~0u) & (s->ban ? ~s->ban[w] : ~0u);
        if (w == s->n_words - 1 && (s->n_vocab & 31))
            m &= (1u << (s->n_vocab & 31)) - 1;
        any |= m != 0;
        s->mask[w] = m;
    }
    for (int i = 0; i < s->n_vocab; i++)
        if (!bit_get(s->mask, i))
            s->work[i] = -INFINITY;
    *mask = s->mask;
    return any ? 0 : -1;
}

static void apply_bias(llm_sampler *s)
{
    for (int i = 0; i < s->p.n_bias; i++)
        if (s->bias[i].bias > LLM_LOGIT_BIAS_BAN)
            s->work[s->bias[i].id] += s->bias[i].bias;
}

llm_status llm_sampler_sample_masked(llm_sampler *s, const float *logits, const uint32_t *allow, llm_sample_result *r,
                                     llm_error *err)
{
    r->id = 0;
    r->logprob = 0;
    r->n_top = 0;
    for (int i = 0; i < s->n_vocab; i++)
        if (isnan(logits[i]))
            return llm_errf(err, LLM_ERR_NUMERIC, "the model produced a NaN logit (token id %d): no token can be sampled", i);
    memcpy(s->work, logits, sizeof(float) * (size_t)s->n_vocab);
    apply_penalties(s);
    apply_bias(s);
    const uint32_t *mask;
    int m = step_mask(s, allow, &mask);
    if (m == -2)
        return llm_errf(err, LLM_ERR_NOMEM, "sampler: no memory for a token mask");
    if (m < 0)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "no token is allowed at this step (the constraints and biases exclude all)");
    r->id = greedy(&s->p) ? argmax(s->work, s->n_vocab, mask) : sample_filtered(s, mask);
    if (!s->p.logprobs && !s->p.n_logprobs)
        return LLM_OK; /* the normalizer costs as much as the rest: only when asked */
    lnorm z = log_norm(s->work, s->n_vocab);
    r->logprob = logprob_of(s->work[r->id], z);
    if (s->p.n_logprobs)
        top_logprobs(s, mask, z, r);
    return LLM_OK;
}

llm_status llm_sampler_sample(llm_sampler *s, const float *logits, llm_sample_result *r, llm_error *err)
{
    return llm_sampler_sample_masked(s, logits, NULL, r, err);
}

long llm_stop_find(const char *text, size_t len, const char *const *stops, int n_stops, size_t *hold)
{
    long best = -1;
    size_t h = 0;
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        if (sl == 0)
            continue;
        const char *m = memmem(text, len, stops[i], sl);
        if (m && (best < 0 || m - text < best))
            best = m - text;
        for (size_t k = sl - 1; k > h; k--) /* longest proper prefix at the end */
            if (k <= len && !memcmp(text + len - k, stops[i], k)) {
                h = k;
                break;
            }
    }
    if (hold)
        *hold = best >= 0 ? 0 : h;
    return best;
}
