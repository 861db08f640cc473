/* test_trace.c - the differential trace tester: random request traces
 * against one engine, every completion checked bit for bit against the
 * same request run alone on a fresh engine with the prefix cache off.
 *
 * The engine promises that load changes no answer (engine.h): batching,
 * chunked prefill, preemption and recompute, forks for n > 1, and prefix
 * cache hits give the same token ids, logprobs, text and finish reason as
 * the request alone. A trace mixes everything that could break that
 * promise: multi-turn conversations (each turn's prompt is the previous
 * prompt, its answer and new tokens, growing past many blocks and past
 * block_size^2 tokens), prompts that share a far block's tokens at a near
 * position, n > 1 forks, priorities, a KV pool small enough to preempt and
 * evict, cancellations at random points, stop strings, logprobs, max_tokens
 * 1, small token budgets (chunked prefill), greedy and seeded sampling,
 * penalties, grammars (JSON objects, a short finite language), embedding
 * requests (mean and last pooling: vectors bit for bit), LoRA adapters (a
 * third of the requests run under one of three, at one of four scales, so
 * steps mix rows of several adapters and of none, and a prompt cached under
 * one adapter must not serve another), speculative decoding (half the
 * traces guess with n-grams, random guess lengths and step budgets, some
 * requests opting out; the reference never guesses, so every answer,
 * sampled ones too, must be the same token for token with and without
 * it; a third of the prompts then repeat a piece of themselves, which the
 * guesses find). After each trace:
 * no block referenced, nothing queued, and
 * the stats add up (each admitted sequence's prompt counted once).
 * Odd seeds run on the tiny llama model; seeds divisible by 4 on the tiny
 * gemma3 one, whose local layers attend through a sliding window of 8
 * positions (prompts of hundreds of tokens, prefix hits and preemption all
 * reach past it); the other even seeds on the tiny qwen3moe one (8
 * experts, 2 per token: each expert runs once over the rows routed to it,
 * so a row's experts see different company in a batch than alone).
 *
 *   test_trace                    the fixed seeds (make test), cmocka;
 *                                 LLM_TRACE_SEEDS=N runs seeds 1..N
 *   test_trace --time S [--seed N] random seeds for S seconds (make fuzz)
 *   test_trace --seed N [-v]      one trace, printed
 *
 * A failing seed prints itself; add it to REGRESS below (before_budget 0). */
#include <pthread.h>
#include <time.h>

#include "testutil.h"

#include "llm/engine.h"
#include "llm/grammar.h"
#include "llm/lora.h"
#include "llm/mkmodel.h"

enum { MAX_REQS = 14, MAX_PROMPT = 400, MAX_GEN = 20, N_BASES = 3, MAX_EMBD = 512, N_LORAS = 3 };

/* Seeds that once failed: run first, always, each with the trace it was
 * found with (before_budget: found before mask_budget_make drew a budget,
 * so it runs with none). 3: a far block found at a near position
 * (kv_seq_match counted n_hashed in tokens). 1796424761258126: a JSON
 * string's mask allowed byte 0xED then 0xB8, whose only endings are
 * surrogates, and the next mask allowed no token. 53: a speculating step's
 * first pick was emitted as the grammar's end, because the grammar had
 * already taken the second (the oracle's guesses). */
static const struct {
    uint64_t seed;
    int before_budget;
} REGRESS[] = {{3, 1}, {1796424761258126u, 0}, {53, 0}};
#define N_QUICK 100 /* seeds 1..N_QUICK in make test; $LLM_TRACE_SEEDS overrides (TSan runs fewer) */

typedef struct tr_comp {
    int n_tok;
    int32_t tok[MAX_GEN];
    float lp[MAX_GEN];
    int n_top[MAX_GEN];
    llm_logprob top[MAX_GEN][4];
    char text[MAX_GEN * 64];
    size_t text_len;
    llm_finish finish;
    int done;
    llm_usage usage;
    int n_emb;          /* an embedding request's vector */
    float emb[MAX_EMBD];
    int n_plp;          /* prompt_logprobs: the DONE's entries, and a hash of their bytes */
    uint64_t plp_hash;
} tr_comp;

typedef struct tr_req {
    llm_request rq;
    int32_t prompt[MAX_PROMPT];
    char stop_buf[32];
    const char *stop[1];
    int base;          /* the base its prompt came from */
    int parent;        /* >= 0: a later turn of that request's conversation, submitted after it ends */
    int cancel_after;  /* >= 0: cancel after reading this many events (0: right after submit) */
    int gap;           /* generated tokens (engine-wide) to wait for before submitting */
    /* filled by the run */
    llm_engine *e;
    llm_request_id id;
    pthread_t th;
    int cancelled, events, done;
    int finished;      /* the reader is through (atomic: the driver polls it) */
    llm_error err;
    tr_comp got[LLM_MAX_N], want[LLM_MAX_N];
} tr_req;

typedef struct tr_trace {
    uint64_t seed;
    llm_engine_config cfg;
    int n_req;
    tr_req req[MAX_REQS];
} tr_trace;

typedef struct tr_totals {
    uint64_t traces, requests, completions, steps, preemptions, cached, forked, cancels;
    uint64_t constrained, grammar_ends; /* requests with a grammar; completions it ended (finish STOP) */
    uint64_t embeddings;                /* embedding requests compared with the request alone */
    uint64_t prompt_lps;                /* prompt_logprobs requests compared with the request alone */
    uint64_t held_picks;                /* constrained picks put off to a later step (mask_step_work spent) */
    uint64_t adapted;                   /* requests run under an adapter */
    uint64_t guessed, taken;            /* speculation: guessed tokens checked, and taken */
    uint64_t drafted;                   /* traces guessing with a draft model */
} tr_totals;

static test_tiny g_tiny, g_gemma, g_moe; /* the models (and backends) below take turns by seed */
static llm_lora *g_tiny_l[N_LORAS], *g_gemma_l[N_LORAS], *g_moe_l[N_LORAS]; /* each model's adapters */
static llm_model *g_tiny_d, *g_gemma_d, *g_moe_d; /* each model's draft: its shape and seed, other weight types */
static llm_model *g_m, *g_d;
static llm_backend *g_b;
static llm_lora **g_l;
static int g_verbose;
/* LLM_TRACE_BACKEND=cuda: the models run on the CUDA backend (make cudasim
 * runs it on the emulator). Its batch invariance holds where every matmul
 * takes the GEMV kernels (at most 8 rows a step, the alone run's steps
 * too; more go to cuBLAS) and attention one split per row (contexts of at
 * most 256 positions; the tensor-core prefill needs 16 rows), so the
 * traces stay there; contexts of at most 128 keep a trace to minutes on
 * the emulator. */
static int g_cuda;
#define CUDA_MAX_ROWS 8
#define CUDA_MAX_CTX 128
static tr_totals g_tot;

static uint64_t rnd(uint64_t *s, uint64_t n) { return n ? test_rng(s) % n : 0; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- building a trace ---------------------------------------------------- */

static void config_make(tr_trace *t, uint64_t *s)
{
    static const int bss[] = {2, 4, 8, 16};
    const llm_hparams *hp = &g_m->hp;
    llm_engine_config *c = &t->cfg;
    memset(c, 0, sizeof *c);
    c->model = g_m;
    c->backend = g_b;
    c->block_size = bss[rnd(s, 4)];
    c->n_ctx = 96 + 32 * (int)rnd(s, 10); /* 96..384: past 16 * 16 */
    c->max_seqs = 1 + (int)rnd(s, 6);
    c->max_batch_tokens = c->max_seqs + (int)rnd(s, 3) * (1 + (int)rnd(s, 40));
    c->kv_type = (llm_kv_type)rnd(s, 3);
    c->aging_ms = 1 + (int)rnd(s, 3000);
    if (g_cuda) { /* what the CUDA backend keeps batch-invariant (see g_cuda) */
        c->n_ctx = c->n_ctx > CUDA_MAX_CTX ? CUDA_MAX_CTX : c->n_ctx;
        c->max_batch_tokens = c->max_batch_tokens > CUDA_MAX_ROWS ? CUDA_MAX_ROWS : c->max_batch_tokens;
    }
    /* one full context plus up to two more: small enough to preempt and evict */
    int per_seq = (c->n_ctx + c->block_size - 1) / c->block_size;
    int n_blocks = per_seq + (int)rnd(s, (uint64_t)(2 * per_seq + 1));
    c->kv_cache_bytes =
        (size_t)n_blocks * kv_cache_block_bytes(c->kv_type, c->block_size, hp->n_layer, hp->n_head_kv * hp->head_dim);
}

/* Prompt i from one of the bases: a prefix of it, a prefix with a changed
 * token, or a prefix whose blocks from k on are the base's own far blocks
 * from m on. k is often where an earlier request's prompt ended (what the
 * cache matches), m = k * block_size half the time (where a chain counted
 * in tokens instead of blocks would put them). */
static void prompt_make(tr_trace *t, int i, int32_t base[N_BASES][MAX_PROMPT], uint64_t *s, int n)
{
    tr_req *r = &t->req[i];
    const tr_req *e = i > 0 && rnd(s, 2) ? &t->req[rnd(s, (uint64_t)i)] : NULL;
    int bs = t->cfg.block_size, kind = (int)rnd(s, 4);
    r->base = e ? e->base : (int)rnd(s, N_BASES);
    memcpy(r->prompt, base[r->base], sizeof(int32_t) * (size_t)n);
    if (kind == 1)
        r->prompt[rnd(s, (uint64_t)n)] = (int32_t)rnd(s, (uint64_t)g_m->hp.n_vocab);
    if (kind == 2 && n > 2 * bs) {
        int k = e && e->rq.n_tokens / bs >= 1 && e->rq.n_tokens / bs < n / bs ? e->rq.n_tokens / bs
                                                                              : 1 + (int)rnd(s, (uint64_t)(n / bs - 1));
        int m = rnd(s, 2) ? k * bs : k + 1 + (int)rnd(s, 8);
        for (int j = k * bs; j < n; j++) r->prompt[j] = base[r->base][(j - k * bs + m * bs) % MAX_PROMPT];
    }
    r->rq.n_tokens = n;
}

static void sampling_make(tr_req *r, uint64_t *s)
{
    llm_sampling *sp = &r->rq.sampling;
    *sp = llm_sampling_default();
    if (rnd(s, 2)) {
        static const float temps[] = {0.5f, 0.9f, 1.3f, 1e-30f};
        sp->temperature = temps[rnd(s, 4)];
        sp->top_k = rnd(s, 2) ? 0 : 1 + (int)rnd(s, 50);
        sp->top_p = rnd(s, 2) ? 1.f : 0.8f;
        sp->min_p = rnd(s, 3) ? 0.f : 0.05f;
    }
    if (!rnd(s, 4)) {
        sp->repetition_penalty = 1.3f;
        sp->presence_penalty = 0.4f;
    }
    sp->seed = test_rng(s);
    sp->logprobs = !rnd(s, 2);
    sp->n_logprobs = (int)rnd(s, 5);
    /* the device's draws are not the host's (the same distribution, other picks), and a step is sampled on
     * the device only when every row allows it: asking for logprobs keeps a sampled request's picks on the
     * host whatever its neighbours */
    if (g_cuda && sp->temperature > 0)
        sp->logprobs = 1;
}

/* A quarter of the requests are constrained: the JSON object grammar (it
 * rarely ends within MAX_GEN tokens) or a short finite one (it ends by
 * itself). Drawn from a stream of their own, so that the traces of the
 * seeds before grammars existed stay what they were. Seeds with the least
 * mask budget (mask_budget_make) constrain another quarter with a counted
 * repetition, every count a state of its own: masks the cache has not
 * seen yet, several in a step, so picks are held to later rounds. */
static void grammar_make(const tr_trace *t, int i, tr_req *r)
{
    static const char *const short_g = "root ::= [a-c]{1,5} (\" \" [a-c]{1,3})? \".\"\n";
    static const char *const counted_g = "root ::= [a-z ]{1,40} \".\"\n";
    uint64_t g = t->seed * 0x9e3779b97f4a7c15ull + (uint64_t)i * 7919u + 17;
    uint64_t k = test_rng(&g) % 8;
    if (k > 3 || (k > 1 && t->cfg.mask_step_work != 1))
        return;
    r->rq.grammar = k == 0 ? short_g : k == 1 ? llm_gbnf_json : counted_g;
    r->rq.grammar_len = strlen(r->rq.grammar);
    r->rq.grammar_root = k == 1 ? "jsonobject" : NULL;
}

/* An eighth of the requests are embedding requests (mean or last pooling,
 * one sequence, no grammar), from a stream of their own as grammars are. */
static void embed_make(const tr_trace *t, int i, tr_req *r)
{
    uint64_t g = t->seed * 0xbf58476d1ce4e5b9ull + (uint64_t)i * 104729u + 5;
    uint64_t k = test_rng(&g) % 16;
    if (k > 1)
        return;
    r->rq.pooling = k ? LLM_POOL_LAST : LLM_POOL_MEAN;
    r->rq.n = 1;
    r->rq.grammar = NULL;
    r->rq.grammar_len = 0;
}

/* A third of the requests run under an adapter at one of four scales,
 * from a stream of their own. */
static void lora_make(const tr_trace *t, int i, tr_req *r)
{
    static const float scales[] = {1.0f, 0.5f, -0.7f, 2.0f};
    uint64_t g = t->seed * 0xd6e8feb86659fd93ull + (uint64_t)i * 15485863u + 11;
    uint64_t k = test_rng(&g) % (3 * N_LORAS);
    if (k >= N_LORAS)
        return;
    r->rq.lora = g_l[k];
    r->rq.lora_scale = scales[test_rng(&g) % 4];
}

/* A tenth of the generating requests want prompt logprobs (0 to 4
 * alternatives), from a stream of their own; the regression seeds keep
 * the traces they were found with. */
static void plp_make(const tr_trace *t, int i, tr_req *r)
{
    uint64_t g = t->seed * 0x9e3779b97f4a7c15ull + (uint64_t)i * 7919u + 17;
    for (size_t k = 0; k < sizeof REGRESS / sizeof *REGRESS; k++)
        if (REGRESS[k].seed == t->seed)
            return;
    if (test_rng(&g) % 10 || r->rq.pooling)
        return;
    r->rq.prompt_logprobs = 1;
    r->rq.prompt_top = (int)(test_rng(&g) % 5);
}

/* Adds each of the model's adapters to e; 0, or -1 (printed). */
static int loras_add(const tr_trace *t, llm_engine *e)
{
    llm_error err = {0};
    for (int k = 0; k < N_LORAS; k++)
        if (llm_engine_lora_add(e, g_l[k], &err)) {
            print_message("seed %llu: adapter %d: %s\n", (unsigned long long)t->seed, k, err.msg);
            return -1;
        }
    return 0;
}

/* Request i's fields; a later turn's prompt is filled in by later_turn(). */
static void request_make(tr_trace *t, int i, int32_t base[N_BASES][MAX_PROMPT], uint64_t *s)
{
    tr_req *r = &t->req[i];
    memset(r, 0, sizeof *r);
    r->parent = -1;
    r->cancel_after = -1;
    r->rq.max_tokens = rnd(s, 5) ? 1 + (int)rnd(s, MAX_GEN) : 1;
    int room = t->cfg.n_ctx - r->rq.max_tokens, cap = room < MAX_PROMPT ? room : MAX_PROMPT;
    if (i > 0 && rnd(s, 3) == 0)
        r->parent = (int)rnd(s, (uint64_t)i);
    prompt_make(t, i, base, s, 1 + (int)rnd(s, (uint64_t)cap));
    r->rq.tokens = r->prompt;
    sampling_make(r, s);
    r->rq.n = rnd(s, 4) ? 1 : 2 + (int)rnd(s, 3);
    r->rq.priority = (int)rnd(s, 4) - 1;
    r->rq.cache_salt = rnd(s, 4) ? 0 : 1 + rnd(s, 2); /* partitions: same answers, separate caches */
    r->rq.ignore_eos = (int)rnd(s, 2);
    if (!rnd(s, 4)) { /* a stop string: the text of a random token */
        int n = llm_token_to_piece(g_m->vocab, (int32_t)rnd(s, (uint64_t)g_m->hp.n_vocab), 0, r->stop_buf,
                                   sizeof r->stop_buf - 1);
        if (n > 0 && n < (int)sizeof r->stop_buf) {
            r->stop_buf[n] = 0;
            r->stop[0] = r->stop_buf;
            r->rq.stop = r->stop;
            r->rq.n_stop = strlen(r->stop_buf) > 0;
        }
    }
    if (!rnd(s, 6))
        r->cancel_after = (int)rnd(s, (uint64_t)r->rq.max_tokens + 1);
    r->gap = (int)rnd(s, 24);
    grammar_make(t, i, r);
    embed_make(t, i, r);
    lora_make(t, i, r);
    plp_make(t, i, r);
}

/* Half the seeds give a step's grammar picks the least work budget: every
 * pick past the first whose mask is not cached waits for the next round.
 * Drawn from a stream of its own; the regression seeds keep the traces
 * they were found with. */
static void mask_budget_make(tr_trace *t)
{
    uint64_t g = t->seed * 0x94d049bb133111ebull + 3;
    t->cfg.mask_step_work = test_rng(&g) % 2 ? 1 : 0;
    for (size_t i = 0; i < sizeof REGRESS / sizeof *REGRESS; i++)
        if (REGRESS[i].seed == t->seed && REGRESS[i].before_budget)
            t->cfg.mask_step_work = 0;
}

/* The oracle guesser (LLM_SPEC_CALLER): the request alone's answer
 * after tokens (found by its prompt and the answer so far), each guess
 * made wrong with probability 1/4, so that long runs are taken and
 * refused at every place; nothing when no reference fits (the answer
 * already went astray: the check will say so). */
static int oracle_guess(void *ctx, const int32_t *tok, int n, int n_prompt, int k, int32_t *out)
{
    const tr_trace *t = ctx;
    for (int i = 0; i < t->n_req; i++) {
        const tr_req *r = &t->req[i];
        if (r->rq.n_tokens != n_prompt || memcmp(r->rq.tokens, tok, sizeof(int32_t) * (size_t)n_prompt))
            continue;
        for (int c = 0; c < (r->rq.n ? r->rq.n : 1); c++) {
            const tr_comp *w = &r->want[c];
            int g = n - n_prompt, m = w->n_tok - g < k ? w->n_tok - g : k;
            if (m < 1 || memcmp(w->tok, tok + n_prompt, sizeof(int32_t) * (size_t)g))
                continue;
            uint64_t s = t->seed * 31 + (uint64_t)n * 131 + (uint64_t)tok[n - 1];
            for (int j = 0; j < m; j++)
                out[j] = rnd(&s, 4) ? w->tok[g + j] : (int32_t)((w->tok[g + j] + 1) % g_m->hp.n_vocab);
            return m;
        }
    }
    return 0;
}

/* Half the n-gram traces guess with the model's draft instead, from a
 * stream of their own (the other draws stay what they were); a third of
 * them with a draft pool of one or two full contexts, so that sequences
 * find it full. */
static void draft_make(tr_trace *t)
{
    uint64_t g = t->seed * 0x9e3779b97f4a7c15ull + 11;
    llm_engine_config *c = &t->cfg;
    if (c->speculative != LLM_SPEC_NGRAM || rnd(&g, 2))
        return;
    c->speculative = LLM_SPEC_DRAFT;
    c->spec_draft_model = g_d;
    if (!rnd(&g, 3)) {
        const llm_hparams *hp = &g_d->hp;
        int bs = c->block_size ? c->block_size : KV_DEFAULT_BLOCK;
        size_t per = kv_cache_block_bytes(c->kv_type, bs, hp->n_layer, hp->n_head_kv * hp->head_dim);
        c->spec_draft_kv_bytes = per * (size_t)((c->n_ctx + bs - 1) / bs) * (1 + rnd(&g, 2));
    }
}

/* Half the traces speculate (engine.h's llm_spec_mode), from a stream of
 * their own, so every trace's other draws stay what they were: with
 * n-grams, or (a third of them) with the oracle's guesses. A third of
 * their requests' prompts then end with a copy of a piece of
 * themselves, and a fifth opt out. */
static void spec_make(tr_trace *t)
{
    uint64_t g = t->seed * 0xd1342543de82ef95ull + 5;
    llm_engine_config *c = &t->cfg;
    if (rnd(&g, 2))
        return;
    c->speculative = rnd(&g, 3) ? LLM_SPEC_NGRAM : LLM_SPEC_CALLER;
    c->spec_guess = oracle_guess;
    c->spec_guess_ctx = t;
    c->spec_tokens = 1 + (int)rnd(&g, 8);
    c->spec_ngram_min = 1 + (int)rnd(&g, 3);
    c->spec_ngram_max = c->spec_ngram_min + (int)rnd(&g, 3);
    c->spec_step_rows = 1 + (int)rnd(&g, 24);
    c->spec_max_seqs = 1 + (int)rnd(&g, 16);
    draft_make(t);
    for (int i = 0; i < t->n_req; i++) {
        tr_req *r = &t->req[i];
        r->rq.no_speculate = !rnd(&g, 5);
        int n = r->rq.n_tokens, piece = n / 3;
        if (!rnd(&g, 3) && piece > 0 && !r->rq.pooling && !r->rq.prompt_logprobs) {
            int from = (int)rnd(&g, (uint64_t)(n - piece));
            memmove(r->prompt + n - piece, r->prompt + from, sizeof(int32_t) * (size_t)piece);
        }
    }
}

static void trace_make(tr_trace *t, uint64_t seed)
{
    uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
    static int32_t base[N_BASES][MAX_PROMPT];
    memset(t, 0, sizeof *t);
    t->seed = seed;
    config_make(t, &s);
    mask_budget_make(t);
    /* a small alphabet now and then: the same block content recurs at many positions */
    uint64_t alpha = rnd(&s, 3) ? (uint64_t)g_m->hp.n_vocab : 3;
    for (int b = 0; b < N_BASES; b++)
        for (int i = 0; i < MAX_PROMPT; i++) base[b][i] = (int32_t)rnd(&s, alpha);
    t->n_req = 2 + (int)rnd(&s, MAX_REQS - 1);
    for (int i = 0; i < t->n_req; i++) request_make(t, i, base, &s);
    spec_make(t);
}

/* A later turn: the parent's prompt, the parent's first answer (as the
 * request alone gives it), then this request's own tokens, cut to fit. */
static void later_turn(const tr_trace *t, tr_req *r)
{
    const tr_req *p = &t->req[r->parent];
    int32_t own[MAX_PROMPT];
    int n_own = r->rq.n_tokens < 24 ? r->rq.n_tokens : 24, n = 0;
    memcpy(own, r->prompt, sizeof(int32_t) * (size_t)n_own);
    int cap = t->cfg.n_ctx - r->rq.max_tokens;
    cap = cap < MAX_PROMPT ? cap : MAX_PROMPT;
    for (int i = 0; i < p->rq.n_tokens && n < cap; i++) r->prompt[n++] = p->prompt[i];
    for (int i = 0; i < p->want[0].n_tok && n < cap; i++) r->prompt[n++] = p->want[0].tok[i];
    for (int i = 0; i < n_own && n < cap; i++) r->prompt[n++] = own[i];
    r->rq.n_tokens = n;
    r->rq.cache_salt = p->rq.cache_salt; /* the same conversation, the same tenant */
}

/* ---- running requests ---------------------------------------------------- */

static void comp_add(tr_comp *c, const llm_event *ev)
{
    if (ev->type == LLM_EVENT_TOKEN && c->n_tok < MAX_GEN) {
        int k = c->n_tok++;
        c->tok[k] = ev->token;
        c->lp[k] = ev->sample.logprob;
        c->n_top[k] = ev->sample.n_top < 4 ? ev->sample.n_top : 4;
        memcpy(c->top[k], ev->sample.top, sizeof(llm_logprob) * (size_t)c->n_top[k]);
    }
    if (c->text_len + ev->text_len < sizeof c->text) {
        memcpy(c->text + c->text_len, ev->text, ev->text_len);
        c->text_len += ev->text_len;
    }
    if (ev->type == LLM_EVENT_DONE) {
        c->finish = ev->finish;
        c->usage = ev->usage;
        c->done = 1;
        c->n_emb = ev->embedding && ev->n_embedding <= MAX_EMBD ? ev->n_embedding : 0;
        if (c->n_emb)
            memcpy(c->emb, ev->embedding, sizeof(float) * (size_t)c->n_emb);
        c->n_plp = ev->n_prompt_lp;
        c->plp_hash = 0xcbf29ce484222325ull;
        const unsigned char *b = (const unsigned char *)ev->prompt_lp;
        for (size_t j = 0; b && j < sizeof *ev->prompt_lp * (size_t)ev->n_prompt_lp; j++)
            c->plp_hash = (c->plp_hash ^ b[j]) * 0x100000001b3ull;
    }
}

/* Reads r's events into out until every completion is done, r fails, or
 * (cancel_after >= 0) that many events were read and r is cancelled. */
static void read_events(tr_req *r, tr_comp *out, int cancel_after)
{
    int n = r->rq.n ? r->rq.n : 1;
    while (r->done < n) {
        if (cancel_after >= 0 && r->events >= cancel_after) {
            llm_engine_cancel(r->e, r->id);
            r->cancelled = 1;
            return;
        }
        llm_event ev;
        llm_status st = llm_engine_next(r->e, r->id, &ev, 300000);
        if (st) {
            llm_errf(&r->err, st, "next: %s", llm_status_str(st));
            return;
        }
        if (ev.type == LLM_EVENT_ERROR) {
            r->err = ev.error;
            return;
        }
        r->events++;
        comp_add(&out[ev.index], &ev);
        r->done += ev.type == LLM_EVENT_DONE;
        llm_event_clear(&ev);
    }
}

static void *reader_main(void *arg)
{
    tr_req *r = arg;
    read_events(r, r->got, r->cancel_after);
    __atomic_store_n(&r->finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* One completion alone on a fresh engine, prefix cache off, and on the
 * windowed model one KV pool that keeps every position (so the trace's
 * two pools, with local blocks dropped and matched as twins, are checked
 * against the layout without either): rq (n = 1) read into *out. 0, or -1
 * (printed) when it failed. */
static int alone(const tr_trace *t, const llm_request *rq, tr_comp *out)
{
    llm_engine_config c = {.model = g_m, .backend = g_b, .n_ctx = t->cfg.n_ctx, .block_size = t->cfg.block_size,
                           .kv_type = t->cfg.kv_type, .no_prefix_cache = 1, .max_seqs = 4, .kv_keep_all = 1,
                           .max_batch_tokens = g_cuda ? CUDA_MAX_ROWS : 0};
    llm_error err = {0};
    static tr_req one;
    memset(&one, 0, sizeof one);
    one.rq = *rq;
    if (llm_engine_open(&c, &one.e, &err) || (rq->lora && llm_engine_lora_add(one.e, rq->lora, &err)) ||
        llm_engine_submit(one.e, &one.rq, &one.id, &err)) {
        print_message("seed %llu: reference: %s\n", (unsigned long long)t->seed, err.msg);
        llm_engine_close(one.e);
        return -1;
    }
    read_events(&one, one.want, -1);
    llm_engine_close(one.e);
    if (one.err.code)
        print_message("seed %llu: reference failed: %s\n", (unsigned long long)t->seed, one.err.msg);
    *out = one.want[0];
    return one.err.code ? -1 : 0;
}

/* The reference of r: each completion i as its own n = 1 request with
 * seed + i (what n > 1 promises), so a fork or copy-on-write fault cannot
 * hide in the reference too. */
static int reference(const tr_trace *t, tr_req *r)
{
    int n = r->rq.n ? r->rq.n : 1;
    for (int i = 0; i < n; i++) {
        llm_request one = r->rq;
        one.n = 1;
        one.sampling.seed += (uint64_t)i;
        if (alone(t, &one, &r->want[i]))
            return -1;
    }
    return 0;
}

static uint64_t generated(llm_engine *e)
{
    llm_stats st;
    llm_engine_stats(e, &st);
    return st.generated_tokens;
}

/* Waits for r's turn: its parent is done, or gap more tokens were
 * generated since the previous submit (or everything submitted is done,
 * so no more will be). */
static void wait_turn(tr_trace *t, int i, uint64_t since)
{
    tr_req *r = &t->req[i];
    for (;;) {
        int busy = 0;
        for (int k = 0; k < i; k++) busy += !__atomic_load_n(&t->req[k].finished, __ATOMIC_ACQUIRE);
        if (r->parent >= 0 ? __atomic_load_n(&t->req[r->parent].finished, __ATOMIC_ACQUIRE)
                           : busy == 0 || generated(r->e) >= since + (uint64_t)r->gap)
            return;
        nanosleep(&(struct timespec){0, 200000}, NULL);
    }
}

/* ---- checks -------------------------------------------------------------- */

/* Which of the model's adapters l is (-1: none). */
static int lora_index(const llm_lora *l)
{
    for (int k = 0; l && g_l && k < N_LORAS; k++)
        if (g_l[k] == l)
            return k;
    return -1;
}

static int fail_at(const tr_trace *t, int i, int k, const char *what)
{
    const tr_req *r = &t->req[i];
    print_message("seed %llu: request %d completion %d: %s (prompt %d tokens, n %d, max_tokens %d, T %g, top_k %d, "
                  "top_p %g, min_p %g, logprobs %d/%d, priority %d, stop %d, cancel_after %d, parent %d, adapter %d "
                  "at %g, grammar %d, pooling %d)\n",
                  (unsigned long long)t->seed, i, k, what, r->rq.n_tokens, r->rq.n, r->rq.max_tokens,
                  r->rq.sampling.temperature, r->rq.sampling.top_k, r->rq.sampling.top_p, r->rq.sampling.min_p,
                  r->rq.sampling.logprobs, r->rq.sampling.n_logprobs, r->rq.priority, r->rq.n_stop, r->cancel_after,
                  r->parent, lora_index(r->rq.lora), r->rq.lora ? r->rq.lora_scale : 0.0, r->rq.grammar != NULL,
                  (int)r->rq.pooling);
    return 1;
}

/* got's first n tokens equal want's, bit for bit. */
static int tokens_equal(const tr_comp *got, const tr_comp *want, int n)
{
    for (int j = 0; j < n; j++)
        if (got->tok[j] != want->tok[j] || memcmp(&got->lp[j], &want->lp[j], sizeof(float)) ||
            got->n_top[j] != want->n_top[j] || memcmp(got->top[j], want->top[j], sizeof(llm_logprob) * (size_t)got->n_top[j]))
            return 0;
    return 1;
}

static int check_request(const tr_trace *t, int i)
{
    const tr_req *r = &t->req[i];
    int n = r->rq.n ? r->rq.n : 1, bad = 0;
    if (r->err.code)
        return fail_at(t, i, 0, r->err.msg);
    g_tot.constrained += r->rq.grammar != NULL;
    for (int k = 0; k < n && !bad; k++) {
        const tr_comp *g = &r->got[k], *w = &r->want[k];
        g_tot.grammar_ends += r->rq.grammar && g->done && g->finish == LLM_FINISH_STOP;
        if (r->cancelled && !g->done) { /* what arrived before the cancel is a prefix */
            if (g->n_tok > w->n_tok || !tokens_equal(g, w, g->n_tok))
                bad = fail_at(t, i, k, "tokens before the cancel differ from the request alone");
            continue;
        }
        if (g->n_tok != w->n_tok || !tokens_equal(g, w, w->n_tok)) {
            int j = 0;
            while (j < g->n_tok && j < w->n_tok && tokens_equal(g, w, j + 1)) j++;
            print_message("  first difference at token %d of %d/%d: %d (logprob %.9g) vs alone %d (%.9g)\n", j,
                          g->n_tok, w->n_tok, j < g->n_tok ? g->tok[j] : -1, j < g->n_tok ? g->lp[j] : 0.0,
                          j < w->n_tok ? w->tok[j] : -1, j < w->n_tok ? w->lp[j] : 0.0);
            bad = fail_at(t, i, k, "tokens or logprobs differ from the request alone");
        }
        else if (g->finish != w->finish || g->text_len != w->text_len || memcmp(g->text, w->text, w->text_len))
            bad = fail_at(t, i, k, "finish reason or text differs from the request alone");
        else if (g->usage.prompt_tokens != r->rq.n_tokens || g->usage.completion_tokens != w->usage.completion_tokens)
            bad = fail_at(t, i, k, "usage differs");
        else if (r->rq.pooling &&
                 (!w->n_emb || g->n_emb != w->n_emb || memcmp(g->emb, w->emb, sizeof(float) * (size_t)w->n_emb)))
            bad = fail_at(t, i, k, "the embedding differs from the request alone");
        else if (g->n_plp != (r->rq.prompt_logprobs && k == 0 ? r->rq.n_tokens - 1 : 0) ||
                 (k == 0 && (g->n_plp != w->n_plp || g->plp_hash != w->plp_hash))) /* (alone, completion k is a
                                                                                    * request of its own) */
            bad = fail_at(t, i, k, "the prompt logprobs differ from the request alone");
        else {
            g_tot.embeddings += r->rq.pooling != LLM_POOL_NONE; /* compared and equal */
            g_tot.prompt_lps += r->rq.prompt_logprobs && k == 0;
        }
    }
    g_tot.adapted += !bad && r->rq.lora;
    return bad;
}

/* Nothing referenced or queued, and the stats add up: each admitted
 * sequence's prompt once, cached tokens as the completions report them. */
static int check_engine(const tr_trace *t, llm_engine *e)
{
    llm_stats st;
    for (;;) { /* cancels and last reads release synchronously; a step may still be finishing */
        llm_engine_stats(e, &st);
        if (st.requests == 0 && st.running == 0 && st.waiting == 0)
            break;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    uint64_t lo = 0, hi = 0, cached = 0;
    int cancels = 0;
    for (int i = 0; i < t->n_req; i++) {
        const tr_req *r = &t->req[i];
        int n = r->rq.n ? r->rq.n : 1;
        hi += (uint64_t)(n * r->rq.n_tokens);
        cancels += r->cancelled;
        for (int k = 0; k < n; k++)
            if (r->got[k].done) {
                lo += (uint64_t)r->rq.n_tokens;
                cached += (uint64_t)r->got[k].usage.cached_tokens;
            }
    }
    g_tot.steps += st.steps;
    g_tot.preemptions += st.preemptions;
    g_tot.cached += st.cached_tokens - st.forked_tokens;
    g_tot.forked += st.forked_tokens;
    g_tot.held_picks += st.held_picks;
    g_tot.guessed += st.spec_draft_tokens;
    g_tot.taken += st.spec_accepted_tokens;
    g_tot.drafted += t->cfg.speculative == LLM_SPEC_DRAFT;
    g_tot.cancels += (uint64_t)cancels;
    const char *why = NULL;
    /* tiny gemma3's first layer is local: its pool is sized to the windows,
     * not to the sequences' lengths, and every request still ran within it */
    int w = g_m->layers[0].window;
    size_t need = kv_cache_local_need(w, t->cfg.block_size, t->cfg.max_seqs, t->cfg.max_batch_tokens);
    if (st.kv_blocks_used != 0 || st.kv_local_blocks_used != 0)
        why = "KV blocks still referenced after the trace";
    else if (w > 0 && (st.kv_window != w || (size_t)st.kv_local_blocks_total > need))
        why = "the windowed layers' pool is not the size their windows need";
    else if (st.prompt_tokens < lo || st.prompt_tokens > hi)
        why = "prompt_tokens is not the sum of the admitted sequences' prompts";
    else if (cancels == 0 && (st.prompt_tokens != lo || st.cached_tokens != cached))
        why = "prompt_tokens or cached_tokens differ from the completions' usage";
    else if (st.cached_tokens > st.prompt_tokens)
        why = "more cached than prompt tokens";
    else if (st.spec_accepted_tokens > st.spec_draft_tokens || (!t->cfg.speculative && st.spec_draft_tokens))
        why = "more guesses taken than made, or guesses without speculation";
    else if (st.spec_draft_failures)
        why = "a draft model's pass failed";
    for (int k = 0; k < N_LORAS && !why; k++)
        if (llm_engine_lora_requests(e, g_l[k]) != 0)
            why = "an adapter is still named by a request after the trace";
    if (why)
        print_message("seed %llu: %s (used %d, prompt %llu in [%llu, %llu], cached %llu vs %llu)\n",
                      (unsigned long long)t->seed, why, st.kv_blocks_used, (unsigned long long)st.prompt_tokens,
                      (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)st.cached_tokens,
                      (unsigned long long)cached);
    return why != NULL;
}

/* ---- one trace ----------------------------------------------------------- */

static void trace_print(const tr_trace *t)
{
    const llm_engine_config *c = &t->cfg;
    print_message("seed %llu: n_ctx %d block %d kv %s pool %zu B max_seqs %d budget %d aging %d mask work %ld, "
                  "speculative %d (tokens %d, n-grams %d..%d, rows %d, seqs %d), %d requests\n",
                  (unsigned long long)t->seed, c->n_ctx, c->block_size, llm_kv_type_name(c->kv_type), c->kv_cache_bytes,
                  c->max_seqs, c->max_batch_tokens, c->aging_ms, c->mask_step_work, (int)c->speculative,
                  c->spec_tokens, c->spec_ngram_min, c->spec_ngram_max, c->spec_step_rows, c->spec_max_seqs, t->n_req);
}

/* Runs seed's trace; 0 when every check passed. */
static int trace_run(uint64_t seed)
{
    static tr_trace t;
    const test_tiny *model = seed % 2 ? &g_tiny : seed % 4 ? &g_moe : &g_gemma;
    g_m = model->m;
    g_d = seed % 2 ? g_tiny_d : seed % 4 ? g_moe_d : g_gemma_d;
    g_b = model->b;
    g_l = seed % 2 ? g_tiny_l : seed % 4 ? g_moe_l : g_gemma_l;
    trace_make(&t, seed);
    for (int i = 0; i < t.n_req; i++) {
        if (t.req[i].parent >= 0)
            later_turn(&t, &t.req[i]);
        if (reference(&t, &t.req[i]))
            return 1;
    }
    if (g_verbose)
        trace_print(&t);
    llm_engine *e = NULL;
    llm_error err = {0};
    if (llm_engine_open(&t.cfg, &e, &err)) {
        print_message("seed %llu: open: %s\n", (unsigned long long)seed, err.msg);
        return 1;
    }
    if (loras_add(&t, e)) {
        llm_engine_close(e);
        return 1;
    }
    uint64_t since = 0;
    int bad = 0, started = 0;
    for (int i = 0; i < t.n_req && !bad; i++) {
        tr_req *r = &t.req[i];
        r->e = e;
        wait_turn(&t, i, since);
        since = generated(e);
        if (llm_engine_submit(e, &r->rq, &r->id, &err))
            bad = fail_at(&t, i, 0, err.msg);
        else if (pthread_create(&r->th, NULL, reader_main, r))
            bad = fail_at(&t, i, 0, "cannot start a reader thread");
        else
            started++; /* only threads that exist are joined */
    }
    for (int i = 0; i < started; i++) pthread_join(t.req[i].th, NULL);
    for (int i = 0; i < t.n_req && !bad; i++) bad = check_request(&t, i);
    bad = bad || check_engine(&t, e);
    llm_engine_close(e);
    g_tot.traces++;
    g_tot.requests += (uint64_t)t.n_req;
    if (bad && !g_verbose)
        trace_print(&t);
    return bad;
}

/* ---- drivers --------------------------------------------------------------- */

/* Three adapters of t's model: rank 8 F32 with alpha, rank 4 F16
 * without, rank 32 Q8_0 with alpha 8. 0, or -1 (printed). */
static int loras_make(const test_tiny *t, llm_lora **out)
{
    static const struct {
        int rank;
        float alpha;
        quant_type qt;
    } kinds[N_LORAS] = {{8, 16, QT_F32}, {4, 0, QT_F16}, {32, 8, QT_Q8_0}};
    char path[256];
    llm_error err = {0};
    for (int k = 0; k < N_LORAS; k++) {
        test_tmpfile("trace-lora", path, sizeof path);
        llm_status st = llm_mklora(t->path, kinds[k].rank, kinds[k].alpha, kinds[k].qt, 100 + (uint64_t)k, path, &err);
        if (!st)
            st = llm_lora_load(path, t->m, 0, &out[k], &err);
        remove(path);
        if (st) {
            fprintf(stderr, "trace: adapter %d of %s: %s\n", k, t->path, err.msg);
            return -1;
        }
    }
    return 0;
}

/* With LLM_TRACE_BACKEND=cuda, t's CPU backend replaced by a CUDA one. */
static int backend_pick(test_tiny *t)
{
    const char *want = getenv("LLM_TRACE_BACKEND");
    g_cuda = want && !strcmp(want, "cuda");
    if (!g_cuda)
        return want && strcmp(want, "cpu") ? (fprintf(stderr, "LLM_TRACE_BACKEND: cpu or cuda, not %s\n", want), -1) : 0;
    llm_error err = {0};
    llm_backend_free(t->b);
    if (llm_backend_cuda_new(&(llm_cuda_config){0}, &t->b, &err)) {
        fprintf(stderr, "trace: the CUDA backend: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* A trace model's draft: its shape and seed (23: the same vocabulary and
 * near weights, so its guesses are mostly right), weights of type qt. */
static int draft_open(const char *shape, quant_type qt, llm_model **out)
{
    char path[256];
    llm_error err = {0};
    test_tmpfile("trace-draft", path, sizeof path);
    llm_status st = llm_mkmodel(llm_shape_find(shape), qt, 23, path, &err);
    if (!st)
        st = llm_model_load(path, out, &err);
    remove(path); /* (mapped: the mapping stays) */
    if (st)
        fprintf(stderr, "trace: the draft of %s: %s\n", shape, err.msg);
    return st ? -1 : 0;
}

static int setup(void **st)
{
    (void)st;
    if (draft_open("tiny", QT_Q4_0, &g_tiny_d) || draft_open("tiny-gemma3", QT_Q8_0, &g_gemma_d) ||
        draft_open("tiny-qwen3moe", QT_Q8_0, &g_moe_d) ||
        test_tiny_open(&g_tiny, "trace-tiny", QT_Q8_0, 23, 2) ||
        test_shape_open(&g_gemma, "tiny-gemma3", "trace-gemma3", QT_Q5_0, 23, 2) ||
        test_shape_open(&g_moe, "tiny-qwen3moe", "trace-qwen3moe", QT_Q4_K, 23, 2) || backend_pick(&g_tiny) ||
        backend_pick(&g_gemma) || backend_pick(&g_moe) || loras_make(&g_tiny, g_tiny_l) ||
        loras_make(&g_gemma, g_gemma_l) || loras_make(&g_moe, g_moe_l))
        return -1;
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    for (int k = 0; k < N_LORAS; k++) {
        llm_lora_free(g_tiny_l[k]);
        llm_lora_free(g_gemma_l[k]);
        llm_lora_free(g_moe_l[k]);
    }
    test_tiny_close(&g_tiny);
    test_tiny_close(&g_gemma);
    test_tiny_close(&g_moe);
    llm_model_free(g_tiny_d);
    llm_model_free(g_gemma_d);
    llm_model_free(g_moe_d);
    return 0;
}

static void totals_print(double secs)
{
    print_message("trace: %llu traces, %llu requests, %llu steps, %llu preemptions, %llu prompt tokens from the prefix "
                  "cache, %llu shared by forks, %llu cancels, %llu constrained requests (%llu completions ended by "
                  "their grammar, %llu picks held to a later step), %llu embedding requests, %llu under an adapter, "
                  "%llu with prompt logprobs, %llu guessed tokens checked (%llu taken; %llu traces guessing with a draft model) "
                  "in %.1f s\n",
                  (unsigned long long)g_tot.traces, (unsigned long long)g_tot.requests, (unsigned long long)g_tot.steps,
                  (unsigned long long)g_tot.preemptions, (unsigned long long)g_tot.cached,
                  (unsigned long long)g_tot.forked, (unsigned long long)g_tot.cancels,
                  (unsigned long long)g_tot.constrained, (unsigned long long)g_tot.grammar_ends,
                  (unsigned long long)g_tot.held_picks, (unsigned long long)g_tot.embeddings,
                  (unsigned long long)g_tot.adapted, (unsigned long long)g_tot.prompt_lps,
                  (unsigned long long)g_tot.guessed, (unsigned long long)g_tot.taken,
                  (unsigned long long)g_tot.drafted, secs);
}

static void test_regressions(void **st)
{
    (void)st;
    for (size_t i = 0; i < sizeof REGRESS / sizeof *REGRESS; i++)
        if (trace_run(REGRESS[i].seed))
            fail_msg("regression seed %llu failed", (unsigned long long)REGRESS[i].seed);
}

/* The fixed seeds; the traces must also have exercised what they claim
 * to (preemption, cache hits, cancels), or the test proves nothing. */
static void test_quick_seeds(void **st)
{
    (void)st;
    double t0 = now_s();
    int failed = 0;
    memset(&g_tot, 0, sizeof g_tot);
    const char *env = getenv("LLM_TRACE_SEEDS");
    uint64_t n = env ? strtoull(env, NULL, 10) : N_QUICK;
    for (uint64_t seed = 1; seed <= n; seed++) failed += trace_run(seed);
    totals_print(now_s() - t0);
    assert_int_equal(failed, 0);
    assert_true(g_tot.preemptions > 0);
    assert_true(g_tot.cached > 0); /* prefix cache hits, forks aside */
    assert_true(g_tot.forked > 0);
    assert_true(g_tot.prompt_lps > 0);
    assert_true(g_tot.cancels > 0);
    assert_true(g_tot.constrained > 0 && g_tot.grammar_ends > 0);
    if (n >= N_QUICK) { /* holds need two uncached masks in one step: the 100 quick seeds have ~50, TSan's 8 may
                         * have none; the first draft trace is seed 9 */
        assert_true(g_tot.held_picks > 0);
        assert_true(g_tot.drafted > 0);
    }
    assert_true(g_tot.embeddings > 0);
    assert_true(g_tot.adapted > 0);
    assert_true(g_tot.taken > 0 && g_tot.taken < g_tot.guessed); /* guesses taken, and some refused */
}

/* --time S: random seeds (from --seed, else the clock) until S seconds pass. */
static int fuzz_main(double secs, uint64_t seed, int one)
{
    if (setup(NULL))
        return 2;
    double t0 = now_s();
    int failed = 0;
    uint64_t n = 0;
    do {
        failed += trace_run(seed + n);
        n++;
    } while (!one && now_s() - t0 < secs);
    totals_print(now_s() - t0);
    printf("trace: %llu passed, %d failed\n", (unsigned long long)(n - (uint64_t)failed), failed);
    teardown(NULL);
    return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    double secs = -1;
    uint64_t seed = 0;
    int have_seed = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--time") && i + 1 < argc)
            secs = strtod(argv[++i], NULL);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10), have_seed = 1;
        else if (!strcmp(argv[i], "-v"))
            g_verbose = 1;
        else {
            fprintf(stderr, "usage: %s [--time SECONDS] [--seed N] [-v]\n", argv[0]);
            return 2;
        }
    }
    if (secs >= 0 || have_seed)
        return fuzz_main(secs, have_seed ? seed : (uint64_t)time(NULL) * 1000003u, secs < 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regressions),
        cmocka_unit_test(test_quick_seeds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
