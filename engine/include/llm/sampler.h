/* sampler.h - turns logits into the next token: penalties (repetition,
 * presence, frequency), then greedy or temperature sampling with top-k,
 * top-p and min-p filters, a per-request seeded RNG (same seed, same
 * output), top-N log-probabilities, and stop-sequence matching.
 *
 * Ownership: llm_sampler_new returns a sampler the caller frees with
 * llm_sampler_free (NULL ok). Thread-safety: one sampler per request; it
 * is not shared. */
#ifndef LLM_SAMPLER_H
#define LLM_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "llm/backend.h"
#include "llm/status.h"

#define LLM_MAX_LOGPROBS 20

/* Temperatures below this are greedy: logits / T would overflow to
 * infinity long before T reaches 0, and the distribution is a point mass
 * well before that. */
#define LLM_SAMPLING_GREEDY_BELOW 1e-5f
/* Log-probabilities are reported no lower than this (OpenAI's floor for
 * tokens that cannot be picked; JSON has no -Infinity). */
#define LLM_LOGPROB_FLOOR (-9999.0f)

/* A bias added to one token's logit (OpenAI's logit_bias). At or below
 * LLM_LOGIT_BIAS_BAN the token is banned: never picked, not even as the
 * fallback when nothing else keeps a weight. */
typedef struct llm_logit_bias { int32_t id; float bias; } llm_logit_bias;
#define LLM_LOGIT_BIAS_BAN (-100.0f)
#define LLM_MAX_LOGIT_BIAS 4096

typedef struct llm_sampling {
    float temperature;        /* < LLM_SAMPLING_GREEDY_BELOW: greedy */
    int top_k;                /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repetition_penalty; /* 1: off; > 1 discourages repeats */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    int penalty_last_n;       /* how many recent tokens the penalties see; 0: all */
    uint64_t seed;
    int logprobs;             /* 1: report the chosen token's log-probability (costs a pass over the vocabulary) */
    int n_logprobs;           /* 0..LLM_MAX_LOGPROBS most likely alternatives (implies logprobs) */
    const llm_logit_bias *bias; /* n_bias entries in [-100, 100], borrowed: llm_sampler_new copies them; an
                                 * id may repeat (the biases add up) */
    int n_bias;
} llm_sampling;

typedef struct llm_logprob { int32_t id; float logprob; } llm_logprob;

typedef struct llm_sample_result {
    int32_t id;
    float logprob;                       /* of the chosen token; 0 unless logprobs or n_logprobs */
    int n_top;
    llm_logprob top[LLM_MAX_LOGPROBS];   /* most likely first */
} llm_sample_result;

/* Greedy, no penalties, seed 0. */
llm_sampling llm_sampling_default(void);
/* LLM_OK or LLM_ERR_INVALID_ARG naming the first bad field (bias ids are
 * checked against the vocabulary by llm_sampler_new). */
llm_status llm_sampling_check(const llm_sampling *p, llm_error *err);

typedef struct llm_sampler llm_sampler;
/* LLM_ERR_INVALID_ARG for a bad field, a bias id outside [0, n_vocab) or
 * biases that ban every token; LLM_ERR_NOMEM. */
llm_status llm_sampler_new(const llm_sampling *p, int n_vocab, llm_sampler **out, llm_error *err);
void llm_sampler_free(llm_sampler *s);
/* Records a token (prompt or generated) for the penalties. */
void llm_sampler_accept(llm_sampler *s, int32_t id);
/* Samples from n_vocab logits (not modified); out->id is always in
 * [0, n_vocab). Logits of +/-infinity are allowed: with +inf logits the
 * pick is the lowest id among them (each reports logprob -log(count));
 * when no candidate keeps a finite positive weight after the filters, the
 * pick is the argmax. LLM_ERR_NUMERIC (err names the first NaN's id; the
 * generator is not advanced) when a logit is NaN: no token is sampled
 * from a distribution that does not exist. */
llm_status llm_sampler_sample(llm_sampler *s, const float *logits, llm_sample_result *out, llm_error *err);
/* llm_sampler_sample among the tokens allow permits (bit id % 32 of word
 * id / 32 set; NULL: all) and the biases do not ban: the pick is always
 * one of them, the filters and the fallback work within them, and
 * log-probabilities are those of the distribution restricted to them.
 * LLM_ERR_INVALID_ARG (generator not advanced) when none is left. */
llm_status llm_sampler_sample_masked(llm_sampler *s, const float *logits, const uint32_t *allow, llm_sample_result *out,
                                     llm_error *err);
/* 1 when this sampler's choice needs no host pass over the logits (no
 * penalties, biases or logprobs), so a device may pick the token itself. */
int llm_sampler_device_ok(const llm_sampler *s);
/* For a device pick: *out gets the settings (temperature 0 when greedy)
 * and, unless greedy, the next uniform draw of the generator (consumed). */
void llm_sampler_device_params(llm_sampler *s, llm_sample_params *out);

/* A prompt token's place in the model's distribution after the tokens
 * before it (vLLM's prompt_logprobs): the raw logits' log-softmax, no
 * penalties, biases or temperature. */
typedef struct llm_prompt_logprob {
    int32_t id;                          /* the prompt token */
    float logprob;                       /* its log-probability (floored at LLM_LOGPROB_FLOOR) */
    int32_t rank;                        /* 1 + how many tokens are strictly more likely */
    int n_top;
    llm_logprob top[LLM_MAX_LOGPROBS];   /* most likely first, ties by lower id */
} llm_prompt_logprob;

/* id's entry from a row of n_vocab logits, with its k (0..LLM_MAX_LOGPROBS)
 * most likely tokens. Two passes over the row and a third when k > 0.
 * LLM_ERR_NUMERIC naming the first NaN's id, LLM_ERR_INVALID_ARG for an id
 * outside [0, n_vocab) or a k out of range. */
llm_status llm_prompt_logprob_of(const float *logits, int n_vocab, int32_t id, int k, llm_prompt_logprob *out,
                                 llm_error *err);

/* Stop sequences over generated text. Returns the byte offset where the
 * earliest full match of any stop starts, or -1. *hold gets the number of
 * trailing bytes that are a proper prefix of some stop: a streaming caller
 * must not emit them yet. */
long llm_stop_find(const char *text, size_t len, const char *const *stops, int n_stops, size_t *hold);

#endif
