/* gmatch.h - a matcher that walks a compiled grammar (grammar.h) over the
 * bytes one sequence generates, and the per-step token masks the sampler
 * takes (llm_sampler_sample_masked).
 *
 * The matcher's state is a set of stacks of grammar positions (several
 * when the grammar is ambiguous so far) plus a UTF-8 character begun by
 * one token and ended by a later one. A mask is found by walking the
 * vocabulary's pieces in sorted order, so that pieces sharing a prefix
 * share the work for it and a dead prefix rejects all the pieces that
 * start with it; masks are cached per state, since generated text keeps
 * coming back to the same states (inside a string, between fields).
 *
 * Ownership: llm_gmatch_vocab_new and llm_gmatch_new return objects the
 * caller frees (the _free functions accept NULL). A matcher borrows its
 * grammar and vocabulary index: both must outlive it.
 * Thread-safety: a vocabulary index is immutable and may be shared; a
 * matcher belongs to one sequence and one thread at a time. */
#ifndef LLM_GMATCH_H
#define LLM_GMATCH_H

#include <stddef.h>
#include <stdint.h>

#include "llm/grammar.h"
#include "llm/status.h"
#include "llm/tokenizer.h"

/* Bounds: stacks alive at once (an ambiguous grammar), stack depth
 * (nesting in the output), stack nodes alive in one walk, and the work one
 * mask or feed may take (stack operations, about 150 ms of one 2-core
 * EPYC core: on a 151k vocabulary a JSON object's costliest mask takes a
 * fifth of it, some 30 ms). The work bound is per mask; the engine bounds
 * a step's too (llm_engine_config.mask_step_work: masks are found one
 * after another on its thread, and past that budget a pick whose mask
 * must be walked waits for a later step). Past them the call fails with an error naming the bound, never a
 * wrong mask. */
#define LLM_GMATCH_MAX_STACKS 256
#define LLM_GMATCH_MAX_DEPTH 4096
/* rule expansions nested in one push (far above a sane grammar's; each is a
 * level of recursion: tests/unit/test_depth holds it to the request stack) */
#define LLM_GMATCH_MAX_EXPAND 1024
#define LLM_GMATCH_MAX_WORK 20000000L
#define LLM_GMATCH_MAX_NODES (1 << 20) /* stack nodes alive in one mask walk: 24 MiB */

typedef struct llm_gmatch_vocab llm_gmatch_vocab;
typedef struct llm_gmatch llm_gmatch;
typedef struct llm_gmatch_cache llm_gmatch_cache;

/* The vocabulary's pieces sorted for mask walks. Text tokens are those
 * with a non-empty piece that are not control, unused or unknown tokens;
 * end-of-generation tokens are allowed exactly when the output is a whole
 * string of the grammar; other tokens never are. LLM_ERR_NOMEM. */
llm_status llm_gmatch_vocab_new(const llm_vocab *v, llm_gmatch_vocab **out, llm_error *err);
void llm_gmatch_vocab_free(llm_gmatch_vocab *gv);

/* Masks kept for matchers over a vocabulary of n_vocab tokens: at most
 * max_bytes of them (at least 16 masks; a quarter of the bytes hold the
 * token lists that serve budgets, llm_gmatch_set_budget). A mask is found again only for
 * the same compiled grammar (its identity, not a hash of it), the same
 * partition and the very same state (compared in full, not by hash), so no
 * request can plant a mask another one reads. Matchers of requests that
 * share a compiled grammar (the engine compiles each text once while it is
 * in use) keep meeting the same states: one request's walks serve the
 * next. Thread-safety: none; the matchers that share it must run on one
 * thread (the engine's). NULL on no memory. */
llm_gmatch_cache *llm_gmatch_cache_new(int n_vocab, size_t max_bytes);
void llm_gmatch_cache_free(llm_gmatch_cache *c);

/* A matcher at the start of g. gv may be NULL for a matcher that is only
 * fed bytes (llm_gmatch_feed), never asked for a mask. cache (borrowed,
 * NULL: a small one of its own) keeps its masks, apart from those of other
 * partitions (a server gives each tenant its own, as for the prefix
 * cache: whether a state's mask was cached tells nothing across them).
 * LLM_ERR_NOMEM, or the bounds above when g's start already exceeds them. */
llm_status llm_gmatch_new(const llm_grammar *g, const llm_gmatch_vocab *gv, llm_gmatch_cache *cache, uint64_t partition,
                          llm_gmatch **out, llm_error *err);
void llm_gmatch_free(llm_gmatch *m);

/* The tokens that may come next: allow (one bit per token id, (n_vocab +
 * 31) / 32 words, overwritten) gets every text token whose bytes keep the
 * output a prefix of some string of the grammar, and the end-of-generation
 * tokens when the output is already one - of those text tokens, under a
 * binding budget (llm_gmatch_set_budget), only the ones it allows.
 * LLM_ERR_GRAMMAR (no vocabulary index, or a bound exceeded: err says
 * which), LLM_ERR_NOMEM. */
llm_status llm_gmatch_mask(llm_gmatch *m, uint32_t *allow, llm_error *err);

/* Bounds the tokens the output may still take, this mask's pick and the
 * end token included (tokens < 0, the default: no bound). While the
 * output can still be finished within them, a mask allows only the text
 * tokens after which it still can, one token kept for the end: a JSON
 * object closes before max_tokens cuts it. "Finished" is measured in
 * bytes (the fewest that complete the grammar from its state), which
 * bounds the tokens wherever each of those bytes is a token of its own,
 * as in byte-level and byte-fallback vocabularies. Where no text token
 * keeps the bound, a complete output gets only the end tokens and an
 * incomplete one the plain mask; an output already past finishing within
 * the budget is not bent. The cache keeps plain masks with the tokens that
 * leave less or more to finish than their state, so a binding budget is
 * served from it too; a state with more such tokens than a cached mask
 * lists (or whose lists found no room in the cache) is walked afresh
 * while its budget binds. */
void llm_gmatch_set_budget(llm_gmatch *m, long tokens);

/* Advances by token id (an end-of-generation token is accepted when the
 * output is complete and changes nothing). LLM_ERR_GRAMMAR when the
 * token is not allowed here (the state is then unchanged). */
llm_status llm_gmatch_accept(llm_gmatch *m, int32_t id, llm_error *err);

/* Advances by n bytes of output. LLM_ERR_GRAMMAR (state unchanged)
 * when they cannot continue any string of the grammar. */
llm_status llm_gmatch_feed(llm_gmatch *m, const char *bytes, size_t n, llm_error *err);

/* 1 when n more bytes of output would be accepted by llm_gmatch_feed;
 * the state is not changed. -1 on no memory or a bound exceeded. */
int llm_gmatch_viable(llm_gmatch *m, const char *bytes, size_t n);

/* 1 when the output so far is a whole string of the grammar. */
int llm_gmatch_complete(const llm_gmatch *m);
/* 1 when it is, and no byte can follow (only an end may come). */
int llm_gmatch_finished(const llm_gmatch *m);

/* 1 when the next llm_gmatch_mask walks nothing (it is in the cache and
 * serves the budget now set, or the output is finished), so a caller can
 * tell a cheap mask from a costly one beforehand; 0 also for a state too
 * long to cache. Costs a serialisation and a cache lookup. */
int llm_gmatch_mask_cached(llm_gmatch *m);

/* The work (units of LLM_GMATCH_MAX_WORK) the last mask, accept, feed or
 * viable call took: 0 for a mask from the cache. */
long llm_gmatch_work(const llm_gmatch *m);

/* Masks asked for, how many came from the cache, and the most work one
 * took (in the units of LLM_GMATCH_MAX_WORK). */
void llm_gmatch_stats(const llm_gmatch *m, uint64_t *masks, uint64_t *cached, long *max_work);

#endif
