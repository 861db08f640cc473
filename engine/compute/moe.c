/* moe.c - mixture-of-experts routing (see moe.h). */
#include "llm/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

llm_status llm_moe_plan_alloc(llm_moe_plan *p, int n_expert, int n_used, int max_rows, llm_error *err)
{
    memset(p, 0, sizeof *p);
    if (n_expert < 1 || n_used < 1 || n_used > n_expert || max_rows < 1)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "moe: %d of %d experts for %d rows", n_used, n_expert, max_rows);
    size_t slots = (size_t)max_rows * (size_t)n_used, ne = (size_t)n_expert;
    p->n_expert = n_expert;
    p->n_used = n_used;
    p->max_rows = max_rows;
    p->off = malloc(sizeof(int32_t) * (ne + 1));
    p->n_first = malloc(sizeof(int32_t) * ne);
    p->rows = malloc(sizeof(int32_t) * slots);
    p->weight = malloc(sizeof(float) * slots);
    p->probs = malloc(sizeof(float) * ne);
    p->sel = malloc(sizeof(int32_t) * slots);
    p->sel_w = malloc(sizeof(float) * slots);
    p->cur = malloc(sizeof(int32_t) * 2 * ne);
    if (!p->off || !p->n_first || !p->rows || !p->weight || !p->probs || !p->sel || !p->sel_w || !p->cur) {
        llm_moe_plan_free(p);
        return llm_errf(err, LLM_ERR_NOMEM, "moe: no memory for a routing plan of %d rows", max_rows);
    }
    return LLM_OK;
}

void llm_moe_plan_free(llm_moe_plan *p)
{
    free(p->off);
    free(p->n_first);
    free(p->rows);
    free(p->weight);
    free(p->probs);
    free(p->sel);
    free(p->sel_w);
    free(p->cur);
    memset(p, 0, sizeof *p);
}

/* The softmax of one row's logits into probs. */
static void softmax(const float *x, int n, float *probs)
{
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += probs[i] = expf(x[i] - mx);
    for (int i = 0; i < n; i++) probs[i] = (float)(probs[i] / sum);
}

/* Whether expert a outranks b (more probable; ties and NaN: the lower id
 * first, so a NaN row still picks k distinct experts). */
static int outranks(const float *probs, int a, int b) { return probs[a] > probs[b] || (!(probs[a] < probs[b]) && a < b); }

/* The k most probable experts of one row in sel (descending) and their
 * renormalised weights in w. k is small (8 of 128 for Qwen3-30B-A3B):
 * k passes of a selection beat a sort of every expert. */
static void top_k(float *probs, int n, int k, float scale, int32_t *sel, float *w)
{
    float sum = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++)
            if (probs[e] != -INFINITY && (best < 0 || outranks(probs, e, best)))
                best = e;
        sel[j] = best;
        sum += w[j] = probs[best];
        probs[best] = -INFINITY; /* taken */
    }
    float norm = sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
    for (int j = 0; j < k; j++) w[j] = w[j] / norm * scale;
}

/* Row t's lowest-id expert. */
static int lowest(const int32_t *sel, int k)
{
    int lo = sel[0];
    for (int j = 1; j < k; j++) lo = sel[j] < lo ? sel[j] : lo;
    return lo;
}

void llm_moe_route(llm_moe_plan *p, const float *logits, int n_rows, float scale)
{
    LLM_ASSERT(n_rows >= 0 && n_rows <= p->max_rows);
    int ne = p->n_expert, k = p->n_used;
    memset(p->off, 0, sizeof(int32_t) * (size_t)(ne + 1));
    memset(p->n_first, 0, sizeof(int32_t) * (size_t)ne);
    for (int t = 0; t < n_rows; t++) {
        int32_t *sel = p->sel + (size_t)t * k;
        softmax(logits + (size_t)t * ne, ne, p->probs);
        top_k(p->probs, ne, k, scale, sel, p->sel_w + (size_t)t * k);
        for (int j = 0; j < k; j++) p->off[sel[j] + 1]++;
        p->n_first[lowest(sel, k)]++;
    }
    for (int e = 0; e < ne; e++) {
        p->off[e + 1] += p->off[e];
        p->cur[2 * e] = p->off[e];                    /* rows whose first expert e is */
        p->cur[2 * e + 1] = p->off[e] + p->n_first[e]; /* then the others */
    }
    for (int t = 0; t < n_rows; t++) { /* rows in ascending order within each group */
        const int32_t *sel = p->sel + (size_t)t * k;
        int lo = lowest(sel, k);
        for (int j = 0; j < k; j++) {
            int32_t at = p->cur[2 * sel[j] + (sel[j] != lo)]++;
            p->rows[at] = t;
            p->weight[at] = p->sel_w[(size_t)t * k + j];
        }
    }
}
