/* quality.h - a canary's next-token distributions judged against the
 * stable revision's over the same token sequence: the mean KL divergence
 * KL(stable || canary) per position and how often the two revisions' most
 * likely tokens agree, estimated from what each revision's
 * prompt_logprobs lists (llm-server's and vLLM's form: at each position
 * the prompt token and the k most likely, with their log-probabilities).
 *
 * The estimate at one position, with P the stable's list and Q the
 * canary's: each token P lists keeps its own probability p_i; the rest of
 * the vocabulary is one bucket, the tail, of mass 1 - sum p_i on P's side.
 * On Q's side a token of P's list has its listed q_i, or, when Q does not
 * list it, an equal share of Q's unlisted mass, at most the probability of
 * the last of Q's ranks listed without a gap (1..m: an unlisted token is
 * less likely than rank m; the prompt token, listed whatever its rank, is
 * no such bound); Q's tail is what is left (at least QUALITY_FLOOR). KL = sum p_i log(p_i / q_i) + p_tail log(p_tail
 * / q_tail). Merging the tail can only lower the divergence (the log-sum
 * inequality); the shares guessed for tokens Q does not list can move it
 * either way; in all it is an underestimate by about the share of mass
 * in the tails (test_quality: 20-30% below the exact KL where the 20
 * listed tokens hold ~80% of the mass). Against llm-perplexity
 * --kl-divergence on a trained model (stories260K, its weights quantized
 * anew to Q8_0, Q5_0 and Q4_0 by gguf-py): 8-16% under, the top-1
 * agreement the same (test_prompt_logprobs).
 *
 * Ownership: nothing allocates; quality_pos_from_json reads a parsed entry
 * (borrowed). Thread-safety: pure functions. */
#ifndef QUALITY_H
#define QUALITY_H

#include <jansson.h>
#include <stdint.h>

#define QUALITY_MAX_LIST 21     /* the prompt token and at most 20 alternatives (prompt_logprobs' limit) */
#define QUALITY_FLOOR 1e-10     /* least probability a tail or a guessed share is given */

typedef struct quality_tok {
    int32_t id;
    double logprob;
    int rank;           /* 1 + how many tokens are more likely; 0: not given */
} quality_tok;

/* What one revision lists at one position: distinct ids, any order. */
typedef struct quality_pos {
    int n;
    quality_tok t[QUALITY_MAX_LIST];
} quality_pos;

/* One entry of a prompt_logprobs list ({"ID": {"logprob": x, ...}, ...})
 * into out: 0, or -1 when it is not one (not an object, more than
 * QUALITY_MAX_LIST tokens, an id that is not a non-negative integer, a
 * logprob that is not a number <= 0, a rank that is not a positive
 * integer; "rank" may be absent). */
int quality_pos_from_json(json_t *entry, quality_pos *out);

/* The estimated KL(p || q) at one position (>= 0); p and q non-empty. */
double quality_kl(const quality_pos *p, const quality_pos *q);

/* The id p lists as most likely (the lowest id among equals); -1 when empty. */
int32_t quality_top1(const quality_pos *p);

/* Sums over the positions compared so far. */
typedef struct quality_sum {
    double kl;          /* sum of the positions' estimates */
    double kl_max;      /* the largest one */
    long positions;
    long top1_same;     /* positions whose most likely tokens agree */
} quality_sum;

/* Adds the positions of one text: stable's and canary's lists (JSON
 * arrays, vLLM's form: null first) over the same token sequence (the
 * caller sends both revisions the same ids). 0, or -1 with why (the
 * lengths differ, an entry is not one); nothing is added on failure. */
int quality_add(quality_sum *s, json_t *stable, json_t *canary, char *why, size_t why_n);

/* The same over positions already read (judge.c keeps these, not the
 * answers' trees): p[i] against q[i], i < n; both empty (n 0) adds
 * nothing. */
int quality_add_pos(quality_sum *s, const quality_pos *p, const quality_pos *q, size_t n, char *why, size_t why_n);
/* Entries from .. from+n-1 of a prompt_logprobs list into out (a null
 * entry: n 0). 0, or -1 with why. */
int quality_pos_list(json_t *list, size_t from, size_t n, quality_pos *out, char *why, size_t why_n);

#endif
