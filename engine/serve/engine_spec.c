/* engine_spec.c - speculative decoding's guesses and their accounting
 * (engine.h's llm_spec_mode). The checking is in engine_step.c: a step
 * runs the guesses as rows after a sequence's last token and keeps the
 * tokens it picks from them, one pick per row, while each pick equals the
 * guess after it. Everything here runs under the engine's lock on the
 * engine thread. */
#include <string.h>

#include "engine_impl.h"

/* The farthest back a guess is looked for: a step's search costs at most
 * this many places per sequence (each compared over at most
 * spec_ngram_max tokens), whatever the context holds. */
#define SPEC_SCAN 16384

/* Guesses for what follows tokens[0, n): the tokens after the latest
 * earlier place where the longest run of its last tokens (gmax down to
 * gmin of them) occurs; at most k of them into out. Returns how many (0:
 * no match). One backward scan: at each earlier end e, the run that ends
 * there and matches the last tokens, kept when longer than the best so
 * far (so among equals the latest wins); a run of gmax ends the scan. */
static int ngram_guess(const int32_t *tokens, int n, int gmin, int gmax, int k, int32_t *out)
{
    int best = 0, at = -1, lo = n - 1 - SPEC_SCAN > 0 ? n - 1 - SPEC_SCAN : 0;
    for (int e = n - 1; e > lo && best < gmax; e--) {
        int len = 0;
        while (len < gmax && len < e && tokens[e - 1 - len] == tokens[n - 1 - len]) len++;
        if (len > best) {
            best = len;
            at = e;
        }
    }
    if (best < gmin)
        return 0;
    int m = n - at < k ? n - at : k; /* what followed it, up to where we are */
    memcpy(out, tokens + at, sizeof(int32_t) * (size_t)m);
    return m;
}

/* Whether plan item it decodes (its one row samples) and its sequence
 * may guess: nothing per prompt row (prompt logprobs, pooling), its
 * request going on, room left in its answer for a guess and a pick. */
int eng_spec_may_guess(const sched_item *it)
{
    const eng_seq *q = it->seq->user;
    const eng_req *r = q->r;
    return sched_item_decodes(it) && q->res_at && !q->finished && !r->cancelled && !r->failed && !q->held &&
           !q->q.all_logits && r->max_gen - q->n_gen >= 2;
}

int eng_spec_want(const sched_item *it)
{
    eng_seq *q = it->seq->user;
    q->q.n_draft = 0;
    if (!eng_spec_may_guess(it))
        return 0;
    int k = q->spec_k, room = q->r->max_gen - q->n_gen - 1; /* every guess taken and one pick more */
    return k < room ? k : room;
}

int eng_spec_step_guesses(const llm_engine *e)
{
    const llm_engine_config *c = &e->cfg;
    const sched *s = &e->s;
    if (c->speculative == LLM_SPEC_OFF || s->n_rows >= c->max_batch_tokens)
        return 0; /* (no rows left: a prompt fills the step) */
    int decoding = 0;
    for (int i = 0; i < s->n_items; i++) decoding += sched_item_decodes(&s->items[i]);
    return decoding <= c->spec_max_seqs; /* many sequences: the pass reads its weights for all of them already */
}

int eng_spec_propose(llm_engine *e)
{
    const llm_engine_config *c = &e->cfg;
    const sched *s = &e->s;
    int any = 0;
    for (int i = 0; i < s->n_items; i++) {
        eng_seq *q = s->items[i].seq->user;
        int k = eng_spec_want(&s->items[i]);
        if (k < 1)
            continue;
        int32_t *out = q->tokens + q->q.n_tokens;
        int n = c->speculative == LLM_SPEC_CALLER
                    ? c->spec_guess(c->spec_guess_ctx, q->tokens, q->q.n_tokens, q->q.n_prompt, k, out)
                    : ngram_guess(q->tokens, q->q.n_tokens, c->spec_ngram_min, c->spec_ngram_max, k, out);
        n = n < 0 ? 0 : n < k ? n : k;
        for (int j = 0; j < n; j++) /* a caller's id outside the vocabulary would fail the whole pass */
            if (out[j] < 0 || out[j] >= e->m->hp.n_vocab)
                n = j;
        q->q.n_draft = n;
        any |= n > 0;
    }
    return any;
}

void eng_spec_account(llm_engine *e, eng_seq *q, int drafted, int taken)
{
    llm_stats *st = &e->st;
    st->spec_drafts++;
    st->spec_draft_tokens += (uint64_t)drafted;
    st->spec_accepted_tokens += (uint64_t)taken;
    for (int j = 0; j < taken; j++) st->spec_accepted_at[j]++;
    /* all right: ask for more; else one more than it got right (so a miss
     * at the first guess still tries one next time) */
    int k = taken == drafted ? q->spec_k + 2 : taken + 1;
    q->spec_k = k < e->cfg.spec_tokens ? k : e->cfg.spec_tokens;
}
