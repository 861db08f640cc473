/* engine_impl.h - the serving engine's state, shared by engine.c (the
 * caller's side: requests, events, open and close) and engine_step.c (the
 * step loop on the engine thread). Private to engine/serve/. Thread rules:
 * the fields of llm_engine and eng_req are under e->mu unless a comment
 * says otherwise (see engine.c's file comment). */
#ifndef ENGINE_IMPL_H
#define ENGINE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "llm/engine.h"
#include "llm/forward.h"
#include "llm/gmatch.h"
#include "llm/kv_cache.h"
#include "llm/scheduler.h"
#include "llm/sync.h"
#include "textout.h"

typedef struct eng_req eng_req;
typedef struct eng_draft eng_draft;

/* An adapter added to the engine (engine_lora.c); slots stay put, so a
 * request points at its own. Under the engine's lock. */
typedef enum eng_lora_state {
    ENG_LORA_FREE = 0,
    ENG_LORA_ADDING,    /* waits for the engine thread */
    ENG_LORA_PREPARING, /* the engine thread makes it ready, the lock released (a device copy takes time) */
    ENG_LORA_READY,
    ENG_LORA_FAILED,
    ENG_LORA_REMOVING   /* freed once refs is 0 (and no longer preparing) */
} eng_lora_state;
typedef struct eng_lora {
    const llm_lora *l;
    llm_forward_lora *fl; /* the pass's handle (made and freed on the engine thread) */
    eng_lora_state state;
    uint64_t uid;         /* never reused: keys its prefix cache */
    int refs;             /* requests naming it, until unlinked */
    llm_error err;        /* FAILED: why */
} eng_lora;

typedef struct ev_node {
    llm_event ev;
    struct ev_node *next;
} ev_node;

/* One completion of a request. */
typedef struct eng_seq {
    sched_seq q;
    eng_req *r;
    int index;
    int32_t *tokens;      /* (cap) prompt, then generated */
    int n_gen, finished;
    llm_sampler *smp;
    llm_gmatch *gm;        /* the request's grammar, this completion's place in it; NULL: unconstrained */
    textout out;
    llm_sample_result res; /* this step's sample (engine thread) */
    llm_error fail;        /* this step's sampling failed (code != 0): the request fails with it */
    double t_first;
    double *pool;          /* an embedding request's (n_embd) sum of hidden rows, or the last row (engine thread) */
    int n_pooled;          /* positions [0, n_pooled) are in pool: a recomputation after preemption skips them */
    int h0, hn;            /* this step's hidden rows of it: [h0, h0 + hn) of the batch's hidden_rows */
    llm_prompt_logprob *plp; /* prompt_logprobs (completion 0): (n_prompt - 1) entries, handed to its DONE */
    int n_plp;             /* entries [0, n_plp) are filled: a recomputation after preemption skips them */
    int l0, ln, ls;        /* this step's logit rows: [l0, l0 + ln) for prompt positions from l_pos, ls its
                            * sampling row (-1: none) */
    int l_pos;
    /* A pick put off because the step's grammar work was spent (engine thread): */
    float *held;           /* (n_vocab) the logits row it will be made from; NULL: no pick is held */
    int picked;            /* in a picks round: it was made */
    uint64_t hold_no;      /* when it was put off: older ones go first */
    /* Speculation (engine_spec.c; engine thread): */
    int spec_k;            /* guesses it asks for next: adapts to how many it gets right */
    int ns;                /* this step's sampling rows: its last token's and one per guess (1: none) */
    int n_out;             /* picks this step made from them, in res_at (0: see res, the one pick) */
    int n_taken;           /* guesses they took (each equal to its pick) */
    int spec_go;           /* this step's first pick equals its first guess: its next row is picked too */
    llm_sample_result *res_at; /* (spec_tokens + 1) a speculating step's picks; NULL: it never guesses */
    kv_seq dkv;            /* its K/V in the draft model's cache (engine_draft.c; under the lock) */
} eng_seq;

struct eng_req {
    llm_request_id id;
    eng_req *next;
    int n, n_done, n_read_done;
    eng_seq *seqs;
    int max_gen, ignore_eos;
    int32_t shown[LLM_MAX_SHOWN]; /* control tokens whose text is in the output text */
    int n_shown;
    llm_pooling pooling;  /* not NONE: an embedding request */
    int prompt_top;       /* prompt_logprobs: alternatives per position (completion 0 has plp) */
    llm_grammar *grammar;  /* compiled at submit (shared through slot, or owned when slot is NULL); NULL: none */
    struct eng_grammar *slot;
    char **stops;
    int n_stops;
    ev_node *head, *tail;
    pthread_cond_t cond;
    int cancelled;        /* the engine skips it; cancel is dropping it */
    int gone;             /* unlinked: the last waiting reader frees it */
    int in_flight;        /* sequences of it in the step being run */
    int readers;          /* threads waiting in llm_engine_next */
    int failed;
    llm_error error;
    double t_submit, t_sched;
    eng_lora *lora;       /* its adapter's slot (holding a ref), or NULL */
    float lora_scale;
};

#define GEN_WINDOW 32 /* (time, generated) samples for tokens/s */
#define ENG_GRAMMARS 32                /* compiled grammars kept for requests that send the same text */
#define ENG_GRAMMAR_SHARE_MAX (64u << 10) /* longer grammar texts are compiled for their request alone */

/* A compiled grammar shared by the requests that send the same text and
 * start rule: they then meet the same states, and the mask cache serves
 * them all. refs counts its requests; one with none is kept until its
 * slot is wanted. Under gv_mu except refs. */
typedef struct eng_grammar {
    char *text;            /* the text, a NUL, the start rule ("" for root) */
    size_t len;            /* of the text */
    uint64_t hash;
    llm_grammar *g;
    _Atomic int refs;
    uint64_t used;         /* when last taken (eng's grammar_clock) */
} eng_grammar;
#define ENG_GRAMMAR_CACHE_BYTES (16u << 20) /* masks kept across constrained requests: ~360 of a 262k vocabulary,
                                              * and 4 MiB of the lists that serve budgets (gmatch.h) */

struct llm_engine {
    llm_engine_config cfg;
    const llm_model *m;
    llm_backend *b;
    kv_cache *kv;
    sched s;
    llm_forward *fwd;
    eng_draft *draft;    /* LLM_SPEC_DRAFT's model, cache and buffers; NULL: no draft model */
    llm_sync_worker w;   /* the engine thread: w.mu is the engine's lock, w.cv "work to do", w.stop closing */
    pthread_cond_t step_done;
    eng_req *reqs;
    int n_reqs;
    llm_request_id next_id;
    /* step buffers (engine thread) */
    int32_t *b_tokens, *b_logit_rows, *cp_src, *cp_dst; /* copies: global pool's, then local pool's */
    int32_t *b_hidden_rows;      /* (max_batch_tokens) rows embedding requests pool */
    int max_logits;              /* logit rows a step may have: max_seqs, prompt_logprobs' and guesses' rows, at
                                  * most max_batch_tokens (b_logit_rows' size) */
    llm_sample_params *b_params; /* (max_seqs) device picks of a step */
    pthread_mutex_t gv_mu;       /* builds gv once, on the first constrained request's thread */
    llm_gmatch_vocab *gv;        /* the vocabulary sorted for grammar masks; NULL until then */
    llm_gmatch_cache *gcache;    /* masks shared by all constrained sequences (engine thread) */
    eng_grammar grammars[ENG_GRAMMARS]; /* under gv_mu */
    uint64_t grammar_clock;
    uint32_t *b_mask;            /* (n_vocab / 32 words) a constrained sequence's mask (engine thread) */
    /* Picks put off to a later step (engine thread): */
    long mask_work;              /* grammar work in this round of picks (units of LLM_GMATCH_MAX_WORK) */
    eng_seq **b_held;            /* (max_seqs) the held picks this round makes, oldest first */
    int n_held;
    int n_holding;               /* sequences holding a pick (at least; 0: none) */
    uint64_t hold_clock, new_holds;
    double grammar_ms;           /* time in masks and accepts, not yet in st */
    double forward_ms;           /* this step's forward pass, not yet in st (engine thread) */
    llm_batch_seq *b_seqs;
    llm_forward_seq_lora *b_loras;       /* (max_seqs) the step's adapters (engine thread) */
    eng_lora *loras;             /* (cfg.max_loras) */
    uint64_t lora_clock;
    int n_copies, n_local_copies;
    llm_stats st;
    double gen_t[GEN_WINDOW];
    uint64_t gen_n[GEN_WINDOW];
    int gen_i;
    double step_t0;       /* start of the step in progress, 0 when idle */
    uint64_t oom_seen;    /* s.stats.oom already acted on */
};

/* Milliseconds on the monotonic clock. */
double eng_now_ms(void);
/* Releases r's sequences from the scheduler (under e->mu). */
void eng_req_drop_seqs(llm_engine *e, eng_req *r);
/* Queues ev for r's readers and wakes them (under e->mu). */
void eng_req_push(eng_req *r, const llm_event *ev);
/* Adapters (engine_lora.c), all under e->mu. The slot of a request's
 * adapter, ready, with a ref taken for r, and r's sequences' salts
 * keyed by it; LLM_ERR_INVALID_ARG when l is not added or is being
 * removed. */
llm_status eng_lora_take(llm_engine *e, eng_req *r, const llm_lora *l, uint64_t cache_salt, llm_error *err);
/* r leaves the engine: its ref goes (and a removal waiting for it is woken). */
void eng_lora_drop(llm_engine *e, eng_req *r);
/* The engine thread makes added adapters ready and frees removed ones
 * nothing names any more; wakes add and remove. */
void eng_lora_service(llm_engine *e);
/* At close: every slot's handle freed. */
void eng_lora_free_all(llm_engine *e);

/* Speculation (engine_spec.c). Under e->mu, after sched_plan: whether
 * this step guesses at all (speculation on, rows left, at most
 * spec_max_seqs sequences decoding). */
int eng_spec_step_guesses(const llm_engine *e);
/* Whether plan item it decodes and its sequence may guess. */
int eng_spec_may_guess(const sched_item *it);
/* How many guesses plan item it's sequence asks for this step (its
 * guess length, within the room its answer has left; 0: none, also when
 * it may not guess); its n_draft is reset to 0 either way. */
int eng_spec_want(const sched_item *it);
/* Under e->mu, between sched_plan and sched_plan_drafts, when
 * eng_spec_step_guesses: each planned sequence that may guess gets its
 * n-gram or caller's guesses (sched_seq.n_draft, written after its
 * tokens). Returns whether any sequence guessed. */
int eng_spec_propose(llm_engine *e);
/* Under e->mu, after the step: q checked `drafted` guesses and took
 * `taken` of them: the counters, and its next guess length. */
void eng_spec_account(llm_engine *e, eng_seq *q, int drafted, int taken);

/* The draft model (engine_draft.c): see its file comment for the thread
 * rules. eng_draft_new checks c->spec_draft_model's vocabulary against
 * c->model's and makes its pass (on b) and its cache (spec_draft_kv_bytes);
 * the models and b are borrowed and must outlive *out, which
 * eng_draft_free frees (NULL ok). Errors: LLM_ERR_INVALID_ARG (no draft,
 * another vocabulary, a context or budget it cannot hold), LLM_ERR_NOMEM. */
llm_status eng_draft_new(const llm_engine_config *c, llm_backend *b, eng_draft **out, llm_error *err);
void eng_draft_free(eng_draft *d);
/* q's draft K/V goes back (d NULL: none); under the lock (see the file
 * comment for the exception). */
void eng_draft_release(eng_draft *d, eng_seq *q);
/* Under the lock, between sched_plan and sched_plan_drafts: the planned
 * sequences that may guess get draft blocks for this step (one that finds
 * the pool full counts in spec_draft_full). Returns how many will guess. */
int eng_draft_begin(llm_engine *e);
/* Without the lock: the draft's passes; each of begin's sequences gets
 * its greedy guesses written after its tokens. */
llm_status eng_draft_run(llm_engine *e);
/* Under the lock again: the true tokens' draft K/V kept, each sequence's
 * n_draft set (none when st failed). Returns whether any sequence guessed. */
int eng_draft_end(llm_engine *e, llm_status st);

/* The engine thread's loop (engine_step.c); arg is the engine. */
void *eng_step_main(void *arg);

#endif
