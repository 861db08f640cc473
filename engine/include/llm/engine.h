/* engine.h - the serving engine: many requests share one model; one
 * engine thread runs steps, each a single batched forward pass over the
 * decode tokens of every running sequence plus prefill chunks of new ones
 * (continuous batching, scheduler.h), with K/V in a paged cache with
 * prefix caching (kv_cache.h). Callers submit requests and read each
 * request's events (tokens with text and log-probabilities, then one DONE
 * per completion, or an ERROR).
 *
 * Outputs do not depend on load: a request's tokens are the same alone or
 * batched with others, chunked, preempted and recomputed, or served from
 * the prefix cache (the forward pass is batch-invariant).
 *
 * Ownership: llm_engine_open borrows the model and backend (both must
 * outlive the engine) and owns everything else; llm_engine_close (NULL ok)
 * stops the thread and drops every request. A request belongs to the
 * engine: it is freed when its last event has been read or when it is
 * cancelled. An event's text is owned by the caller: free it with
 * llm_event_clear.
 * Thread-safety: every function but open/close may be called from any
 * thread at any time. No lock is held across a forward pass; cancel waits
 * at most for the step in flight. */
#ifndef LLM_ENGINE_H
#define LLM_ENGINE_H

#include <stdint.h>

#include "llm/kv_cache.h"
#include "llm/lora.h"
#include "llm/model.h"
#include "llm/sampler.h"

#define LLM_MAX_N 16         /* completions per request */
#define LLM_MAX_STOPS 8      /* stop strings per request */
#define LLM_MAX_STOP_LEN 256 /* bytes per stop string */
#define LLM_MAX_SHOWN 8      /* control tokens a request may show as text */

/* Speculative decoding: each step, a decoding sequence's next tokens are
 * guessed, the guesses run as extra rows of the step's one forward pass,
 * and the sequence keeps the tokens it picks from those rows (as it would
 * have, one step each: same sampler, grammar and draws) for as long as
 * each pick equals the guess after it; K/V of the rest is forgotten. So
 * an answer is the same, token for token and seed for seed, with or
 * without it; only the number of steps changes. */
typedef enum llm_spec_mode {
    LLM_SPEC_OFF = 0,
    LLM_SPEC_NGRAM = 1, /* the guesses follow the latest earlier place where the sequence's last n tokens
                         * (prompt and output) occurred: no extra model */
    LLM_SPEC_CALLER = 2, /* the caller's llm_spec_guess_fn guesses (tests feed known answers, right and wrong) */
    LLM_SPEC_DRAFT = 3  /* a draft model with the same vocabulary (spec_draft_model) guesses greedily, from K/V
                         * pages of its own; its passes run without the engine's lock */
} llm_spec_mode;
#define LLM_SPEC_MAX_TOKENS 32      /* guesses per sequence and step, at most */
#define LLM_SPEC_MAX_NGRAM 8        /* the longest run of last tokens a guess is looked up by */
#define LLM_SPEC_MAX_STEP_ROWS 4096 /* guessed tokens one step may check */

/* A caller's guesser: up to k (>= 1) ids into out (room for exactly k)
 * for what follows tokens[0, n) (the first n_prompt the prompt); returns
 * how many (below 0 counts as 0, more than k as k; an id outside the
 * vocabulary ends the guess there). Called on the engine thread with the
 * engine's lock held, once per decoding sequence and step: it must be
 * quick and must not call the engine. */
typedef int (*llm_spec_guess_fn)(void *ctx, const int32_t *tokens, int n, int n_prompt, int k, int32_t *out);

typedef struct llm_engine_config {
    const llm_model *model;  /* borrowed */
    llm_backend *backend;    /* borrowed */
    int n_ctx;               /* tokens per sequence, prompt and output; 0: the model's, at most 4096 */
    int max_seqs;            /* sequences running at once; 0: 64 */
    int max_batch_tokens;    /* tokens per step; 0: 512 */
    int max_waiting;         /* waiting sequences before submit fails with LLM_ERR_QUEUE_FULL; 0: 256 */
    int block_size;          /* KV tokens per block; 0: 16 */
    llm_kv_type kv_type;     /* default F16 */
    size_t kv_cache_bytes;   /* KV pool; 0: kv_cache_fraction of the backend's available memory */
    float kv_cache_fraction; /* 0: 0.25; the pool is capped at max_seqs full contexts either way */
    int aging_ms;            /* waiting this long is worth one priority level; 0: 1000 */
    int no_prefix_cache;     /* 1: do not keep or reuse blocks by content */
    int no_grammar_close;    /* 1: masks take no account of the tokens left (gmatch.h: budgets), so a constrained
                              * answer may be cut at max_tokens; 0: it closes within them where it can */
    int kv_keep_all;         /* 1: one KV pool for every layer, sliding-window layers keeping every position
                              * like the others (tests compare the two layouts) */
    int tensor_parallel;     /* ranks (tp.h); 0 or 1: backend alone */
    llm_backend *const *tp_backends; /* (tensor_parallel) borrowed, [0] == backend; the KV budget is per rank */
    long mask_step_work;     /* grammar work (gmatch.h's units) a step's constrained picks may take; once it is
                              * spent, picks whose mask must be walked wait for a later round (their sequences
                              * only; the oldest waiting pick is always made), so a step takes about this
                              * plus one mask, not one mask per constrained sequence.
                              * 0: LLM_GMATCH_MAX_WORK / 4 */
    int max_loras;           /* LoRA adapters added at once (llm_engine_lora_add); 0: 8, at most 1024 */
    int prompt_logit_rows;   /* logit rows a step has beyond one per sequence (within max_batch_tokens), for
                              * prompt_logprobs requests' prompts: each costs the output matmul and a pass over
                              * the vocabulary, in every step such a prompt runs in (all requests wait on a
                              * step), and a prompt of N tokens takes about N / rows steps; n_vocab floats each
                              * in the logits buffer. 0: 8; -1: none (prompt_logprobs refused) */
    llm_spec_mode speculative; /* default off */
    int spec_tokens;         /* most guesses per sequence and step (each sequence adapts below it to what it gets
                              * right); 0: 16; 1..LLM_SPEC_MAX_TOKENS */
    int spec_ngram_min, spec_ngram_max; /* n-gram sizes matched, the longest first; 0: 2 and 8;
                              * 1..LLM_SPEC_MAX_NGRAM */
    int spec_step_rows;      /* guesses a step checks, all sequences together: rows a step takes beyond one per
                              * sequence, from what prompts leave (within max_batch_tokens), each with a logits
                              * row (n_vocab floats: 1 MiB for a 262k vocabulary, held in the logits buffer);
                              * 0: 32; 1..LLM_SPEC_MAX_STEP_ROWS */
    int spec_max_seqs;       /* a step decoding more sequences than this guesses nothing (its pass is no longer
                              * bound by reading the weights, so extra rows cost time); 0: 16 */
    llm_spec_guess_fn spec_guess; /* LLM_SPEC_CALLER: the guesser (required), with its context */
    void *spec_guess_ctx;
    const llm_model *spec_draft_model; /* LLM_SPEC_DRAFT: the draft (required; borrowed), run on backend; its
                              * vocabulary must be the model's token for token */
    size_t spec_draft_kv_bytes; /* the draft's KV pool (backend memory, kv_type, every position kept), at least one
                              * full context; 0: room for spec_max_seqs full contexts, but at most 256 MiB unless
                              * one context needs more */
} llm_engine_config;

typedef uint64_t llm_request_id;

/* An embedding request's pooling of the final hidden states (after the
 * output norm) over the prompt's positions. */
typedef enum llm_pooling { LLM_POOL_NONE = 0, LLM_POOL_MEAN = 1, LLM_POOL_LAST = 2 } llm_pooling;

typedef struct llm_request {
    const int32_t *tokens;   /* prompt ids, or NULL to tokenize text */
    int n_tokens;
    const char *text;        /* prompt text (BOS added as the vocabulary says; special tokens parsed) */
    llm_sampling sampling;   /* completion i uses seed + i */
    int max_tokens;          /* 0: until the context is full */
    const char *const *stop; /* stop strings: output ends before the first match */
    int n_stop;
    int priority;            /* larger is more urgent; 0 default */
    int n;                   /* completions; 0: 1 */
    int ignore_eos;          /* 1: end-of-generation tokens do not stop */
    int32_t shown[LLM_MAX_SHOWN]; /* control tokens whose text is part of the output text (stop strings see it
                              * too): a tool format whose markers are control tokens. Every other control
                              * token's text is left out */
    int n_shown;
    uint64_t cache_salt;     /* prefix cache partition: cached prefixes are shared only among requests with the same
                              * salt (0: the common one); a server gives each tenant its own */
    const char *grammar;     /* constrained decoding (grammar.h): every completion is a prefix of a string of this
                              * grammar, and ends (finish STOP) when it is a whole one that nothing can extend;
                              * an end-of-generation token comes only where the string is whole (ignore_eos
                              * does not apply). Borrowed: submit compiles it. NULL: none */
    size_t grammar_len;
    const char *grammar_root; /* its start rule; NULL: "root" */
    llm_pooling pooling;     /* not NONE: an embedding request: the prompt (up to the whole context) is run and
                              * nothing is generated; one DONE carries the pooled hidden state, L2-normalised (a
                              * mean pools every position: the prefix cache is not read for it, only written).
                              * n must be 0 or 1, with no grammar; sampling, max_tokens, stops do not apply */
    const llm_lora *lora;    /* an adapter added to the engine (llm_engine_lora_add), or NULL: the base model.
                              * Its prefix cache is its own (and its scale's): K/V under an adapter differ */
    float lora_scale;        /* the adapter's weight (lora.h's scale): finite, |scale| <= 1000; 0 is the base's
                              * answer at the adapter's cost */
    int prompt_logprobs;     /* 1: every prompt token after the first gets its log-probability under the model
                              * (sampler.h's llm_prompt_logprob: the raw logits, whatever the sampling), in
                              * completion 0's DONE. The prompt is computed whole (no prefix cache read), a few
                              * rows per step (llm_engine_config.prompt_logit_rows). Not with pooling */
    int prompt_top;          /* with prompt_logprobs: 0..LLM_MAX_LOGPROBS most likely tokens at each position */
    int no_speculate;        /* 1: no guesses for this request (its answer is the same either way) */
} llm_request;

typedef enum llm_event_type { LLM_EVENT_TOKEN = 1, LLM_EVENT_DONE = 2, LLM_EVENT_ERROR = 3 } llm_event_type;
typedef enum llm_finish { LLM_FINISH_NONE = 0, LLM_FINISH_STOP = 1, LLM_FINISH_LENGTH = 2 } llm_finish;

typedef struct llm_usage {
    int prompt_tokens, completion_tokens;
    int cached_tokens;       /* prompt tokens served from the prefix cache (or shared with a sibling) */
    int preemptions;
    double queue_ms;         /* submit to first scheduled */
    double ttft_ms;          /* submit to first token */
    double total_ms;         /* submit to done */
} llm_usage;

typedef struct llm_event {
    llm_event_type type;
    int index;               /* completion index */
    int32_t token;           /* TOKEN */
    char *text;              /* TOKEN, DONE: new text (may be ""; held back while it could start a stop
                                string or ends inside a UTF-8 character); valid UTF-8 (stray bytes become
                                U+FFFD); NUL-terminated, caller frees */
    size_t text_len;
    llm_sample_result sample; /* TOKEN: logprob and the top alternatives when asked for */
    llm_finish finish;       /* DONE */
    float *embedding;        /* DONE of an embedding request: (n_embedding) floats, unit length; caller frees */
    int n_embedding;
    llm_prompt_logprob *prompt_lp; /* DONE of completion 0 with prompt_logprobs: (n_prompt_lp = prompt tokens - 1)
                              * entries, entry i for prompt token i + 1; caller frees (llm_event_clear) */
    int n_prompt_lp;
    llm_usage usage;         /* DONE */
    llm_error error;         /* ERROR: the request is over; code LLM_ERR_NUMERIC (NaN logits, or a NaN or
                                infinite hidden state to pool), LLM_ERR_NOMEM (an event, its text, an
                                embedding or a sequence's table could not be allocated), LLM_ERR_BACKEND
                                (the forward pass failed, or a device picked an id outside the
                                vocabulary), LLM_ERR_INTERNAL (an embedding missed positions: a bug), ... */
} llm_event;

#define LLM_BATCH_BUCKETS 12
#define LLM_BATCH_BUCKET(i) (1 << (i)) /* 1, 2, 4, ... 1024; the 12th bucket counts larger steps */

typedef struct llm_stats {
    int running, waiting;    /* sequences */
    int requests;            /* requests not yet fully read */
    int kv_blocks_total, kv_blocks_used, kv_blocks_cached, kv_block_size;
    int kv_local_blocks_total, kv_local_blocks_used; /* sliding-window layers' pool (0 without one) */
    int kv_window;           /* the positions that pool keeps per sequence; 0: none */
    int n_ctx;               /* tokens per sequence (the configuration's, resolved) */
    uint64_t steps, preemptions, requests_done;
    uint64_t prompt_tokens;  /* prompt tokens admitted */
    uint64_t cached_tokens;  /* of those, not computed thanks to the prefix cache or a sibling */
    uint64_t forked_tokens;  /* of cached_tokens, shared from a sibling (n > 1), not the prefix cache */
    uint64_t computed_tokens; /* tokens run through the model */
    uint64_t generated_tokens;
    uint64_t held_picks;     /* constrained picks put off to a later round: that step's grammar work was spent */
    double step_ms;          /* time in steps (a pass, its sampling and events) and in rounds of held picks alone */
    double grammar_ms;       /* of that, time finding grammar masks and advancing grammars */
    double forward_ms;       /* of that, time in forward passes (the rest: copies, sampling, events; on a
                              * device backend that samples, its sampling is in the pass) */
    double prefix_hit_rate;  /* cached_tokens / prompt_tokens */
    double gen_tokens_per_s; /* over the last few seconds */
    double step_running_ms;  /* how long the step in progress has run; 0 when idle (liveness) */
    /* speculation (vLLM's spec_decode counters): checks (a sequence's guesses in one step), guessed tokens,
     * guessed tokens taken, and taken ones by their place in the guess */
    int spec_tokens;         /* the most guesses per sequence and step; 0: speculation off */
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    uint64_t spec_accepted_at[LLM_SPEC_MAX_TOKENS];
    double spec_draft_ms;    /* time in the draft model's passes */
    uint64_t spec_draft_failures; /* draft passes the backend failed (those steps guessed nothing) */
    uint64_t spec_draft_full; /* times a sequence found the draft's KV pool full (it guessed nothing that step) */
    /* tokens per step: steps with at most LLM_BATCH_BUCKET(i) tokens, i < LLM_BATCH_BUCKETS (last: any) */
    uint64_t batch_hist[LLM_BATCH_BUCKETS];
} llm_stats;

typedef struct llm_engine llm_engine;

/* Sizes the KV pool, starts the engine thread (named llm-engine). Errors name the setting. */
llm_status llm_engine_open(const llm_engine_config *cfg, llm_engine **out, llm_error *err);
void llm_engine_close(llm_engine *e);

/* Validates and queues a request; *id identifies it for next/cancel. A
 * request's grammar is compiled here; the first constrained request also
 * builds the vocabulary's index for masks (tens of milliseconds for a 150k
 * vocabulary; later submits wait for it, the engine's steps do not).
 * Errors (nothing queued): LLM_ERR_INVALID_ARG (a field, named),
 * LLM_ERR_GRAMMAR (the grammar, with its line and column), LLM_ERR_NOMEM,
 * LLM_ERR_TOO_LONG (prompt plus max_tokens over n_ctx), LLM_ERR_KV_FULL
 * (one sequence would need more blocks than the pool has),
 * LLM_ERR_QUEUE_FULL (too many waiting: retry later), LLM_ERR_SHUTDOWN. */
llm_status llm_engine_submit(llm_engine *e, const llm_request *req, llm_request_id *id, llm_error *err);

/* Next event of a request, waiting up to timeout_ms (< 0: forever).
 * LLM_OK with *ev filled; LLM_ERR_TIMEOUT; LLM_ERR_NOT_FOUND (unknown id,
 * or all its events were read). After the last DONE (one per completion)
 * or an ERROR the request is gone. */
llm_status llm_engine_next(llm_engine *e, llm_request_id id, llm_event *ev, int timeout_ms);
void llm_event_clear(llm_event *ev);

/* Drops a request at once: its blocks are free when this returns (it waits
 * for the step in flight, if the request is in it). Unknown ids are ignored. */
void llm_engine_cancel(llm_engine *e, llm_request_id id);

void llm_engine_stats(llm_engine *e, llm_stats *out);

/* LoRA adapters. add makes l usable by requests (llm_request.lora): the
 * engine thread makes it ready for the backend between two steps, and add
 * returns once it has. l is borrowed until llm_engine_lora_remove returns.
 * Errors (nothing changes): LLM_ERR_INVALID_ARG (already added; checked
 * against a model of another depth), LLM_ERR_QUEUE_FULL (max_loras are
 * added: remove one), LLM_ERR_UNSUPPORTED (the backend runs no adapters,
 * or tensor parallelism), LLM_ERR_NOMEM, LLM_ERR_SHUTDOWN. */
llm_status llm_engine_lora_add(llm_engine *e, const llm_lora *l, llm_error *err);
/* Refuses new requests naming l at once, then waits until none is left
 * (each one's events all read, or cancelled) and the backend's copy is
 * released: then the caller may free l. Unknown l: returns at once. Not
 * to be called from a thread that must read those requests' events. */
void llm_engine_lora_remove(llm_engine *e, const llm_lora *l);
/* Requests naming l not yet over (queued, running, or with events unread);
 * -1 when l is not added. */
int llm_engine_lora_requests(llm_engine *e, const llm_lora *l);
/* For each of the n adapters ls[i], how many requests naming it were
 * scheduled at least once (running[i]: they hold K/V or have run) and how
 * many wait for their first step (waiting[i]); 0 for one not added. One
 * pass over the requests. */
void llm_engine_lora_counts(llm_engine *e, const llm_lora *const *ls, int n, int *running, int *waiting);

#endif
