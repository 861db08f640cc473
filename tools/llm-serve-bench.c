/* llm-serve-bench - serving-engine benchmarks on the CPU backend, for
 * `make bench` (each result one line of key=value pairs, parsed by
 * tests/bench/bench.py):
 *   --npl 1,4,16,64   aggregate throughput with N concurrent sequences:
 *                     each gets a PP-token prompt and generates TG tokens
 *                     (as llama-batched-bench does); prefill and decode
 *                     tokens/s, mean time to first token
 *   --load N          time to first token of a PP-token request while N
 *                     sequences are decoding, and alone
 *   --prefix P        time to first token with a shared P-token system
 *                     prompt: cold (not cached) and warm (cached)
 *   --grammar json    the --npl requests are constrained to a JSON object
 *                     (the built-in grammar): what masks cost a step
 *   llm-serve-bench -m MODEL.gguf [-t THREADS] [-p 32] [-n 64] [-r REPS]
 *                   [--npl LIST] [--load N] [--prefix P] [--kv-type f16]
 *                   [--grammar json]
 * Medians over REPS repetitions, after one warm-up request. */
#include <string.h>

#include "cli.h"
#include "llm/engine.h"
#include "llm/grammar.h"

typedef struct opts {
    const char *model;
    long threads, pp, tg, reps, load, prefix;
    int npl[16], n_npl;
    llm_kv_type kv;
    int json;          /* --grammar json */
} opts;

static uint64_t g_seed = 1;

static void random_prompt(int32_t *p, int n, int n_vocab)
{
    for (int i = 0; i < n; i++) {
        g_seed = g_seed * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = (int32_t)((g_seed >> 33) % (uint64_t)n_vocab);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Submits a greedy request for p, constrained to a JSON object when json;
 * returns its id or 0 (message printed). */
static llm_request_id submit_json(llm_engine *e, const int32_t *p, int n, int max_tokens, int json)
{
    llm_request rq = {.tokens = p, .n_tokens = n, .sampling = llm_sampling_default(), .max_tokens = max_tokens,
                      .ignore_eos = 1};
    if (json) {
        rq.grammar = llm_gbnf_json;
        rq.grammar_len = strlen(llm_gbnf_json);
        rq.grammar_root = "jsonobject";
    }
    llm_error err = {0};
    llm_request_id id = 0;
    if (llm_engine_submit(e, &rq, &id, &err))
        fprintf(stderr, "error: submit: %s\n", err.msg);
    return id;
}

static llm_request_id submit(llm_engine *e, const int32_t *p, int n, int max_tokens)
{
    return submit_json(e, p, n, max_tokens, 0);
}

/* Reads a request to its end; *u gets its usage. 0 on success. */
static int drain(llm_engine *e, llm_request_id id, llm_usage *u)
{
    for (;;) {
        llm_event ev;
        if (llm_engine_next(e, id, &ev, -1))
            return -1;
        llm_event_clear(&ev);
        if (ev.type == LLM_EVENT_ERROR) {
            fprintf(stderr, "error: %s\n", ev.error.msg);
            return -1;
        }
        if (ev.type == LLM_EVENT_DONE) {
            *u = ev.usage;
            return 0;
        }
    }
}

static llm_engine *open_engine(const llm_model *m, llm_backend *b, const opts *o, int max_seqs, int n_ctx, int prefix)
{
    llm_engine_config c = {.model = m, .backend = b, .n_ctx = n_ctx, .max_seqs = max_seqs, .kv_type = o->kv,
                           .no_prefix_cache = !prefix};
    llm_error err = {0};
    llm_engine *e = NULL;
    if (llm_engine_open(&c, &e, &err))
        fprintf(stderr, "error: %s\n", err.msg);
    return e;
}

static void print_head(const char *mode, const llm_model *m, const opts *o)
{
    printf("mode=%s model=%s threads=%ld kv=%s ", mode, m->name, o->threads, llm_kv_type_name(o->kv));
}

/* One round of npl concurrent requests: prefill and decode tokens/s and
 * the mean time to first token. Decode counts the tokens generated (a
 * grammar may end a completion early) over the time from the last first
 * token to the last token. */
static int npl_round(llm_engine *e, const llm_model *m, const opts *o, int npl, double *pp, double *tg, double *ttft)
{
    int n = (int)o->pp;
    int32_t *p = malloc(sizeof(int32_t) * (size_t)n * (size_t)npl);
    llm_request_id *ids = calloc((size_t)npl, sizeof *ids);
    int rc = !p || !ids;
    for (int k = 0; !rc && k < npl; k++) {
        random_prompt(p + (size_t)k * n, n, m->hp.n_vocab);
        rc = !(ids[k] = submit_json(e, p + (size_t)k * n, n, (int)o->tg, o->json));
    }
    double max_ttft = 0, max_total = 0, sum_ttft = 0, decoded = 0;
    for (int k = 0; !rc && k < npl; k++) {
        llm_usage u = {0};
        rc = drain(e, ids[k], &u);
        max_ttft = u.ttft_ms > max_ttft ? u.ttft_ms : max_ttft;
        max_total = u.total_ms > max_total ? u.total_ms : max_total;
        sum_ttft += u.ttft_ms;
        decoded += u.completion_tokens > 1 ? u.completion_tokens - 1 : 0;
    }
    *pp = npl * (double)n / (max_ttft / 1e3);
    *tg = decoded / ((max_total - max_ttft) / 1e3);
    *ttft = sum_ttft / npl;
    free(p);
    free(ids);
    return rc;
}

static int bench_npl(const llm_model *m, llm_backend *b, const opts *o, int npl)
{
    llm_engine *e = open_engine(m, b, o, npl, (int)(o->pp + o->tg + 1), 0);
    double pp[101], tg[101], ttft[101];
    int rc = !e || npl_round(e, m, o, 1, pp, tg, ttft); /* warm-up */
    for (int r = 0; !rc && r < o->reps; r++) rc = npl_round(e, m, o, npl, &pp[r], &tg[r], &ttft[r]);
    if (!rc) {
        llm_stats st;
        llm_engine_stats(e, &st);
        print_head("npl", m, o);
        printf("npl=%d pp=%ld tg=%ld grammar=%s prefill_tps=%.2f decode_tps=%.2f ttft_ms=%.1f step_ms=%.2f "
               "grammar_step_share=%.4f\n",
               npl, o->pp, o->tg, o->json ? "json" : "none", median(pp, (int)o->reps), median(tg, (int)o->reps),
               median(ttft, (int)o->reps), st.steps ? st.step_ms / (double)st.steps : 0,
               st.step_ms > 0 ? st.grammar_ms / st.step_ms : 0);
    }
    llm_engine_close(e);
    return rc;
}

/* Time to first token of one request of pp tokens (max_tokens 1). */
static int probe(llm_engine *e, const llm_model *m, const opts *o, double *ttft)
{
    int32_t p[4096];
    int n = o->pp < 4096 ? (int)o->pp : 4096;
    random_prompt(p, n, m->hp.n_vocab);
    llm_request_id id = submit(e, p, n, 1);
    llm_usage u = {0};
    if (!id || drain(e, id, &u))
        return -1;
    *ttft = u.ttft_ms;
    return 0;
}

static int bench_load(const llm_model *m, llm_backend *b, const opts *o)
{
    int nb = (int)o->load, gen = 4096 - (int)o->pp - 1;
    if (gen > m->hp.n_ctx_train - (int)o->pp - 1)
        gen = m->hp.n_ctx_train - (int)o->pp - 1;
    llm_engine *e = open_engine(m, b, o, nb + 1, (int)o->pp + gen + 1, 0);
    double alone[101], loaded[101];
    int32_t *p = malloc(sizeof(int32_t) * (size_t)o->pp * (size_t)nb);
    llm_request_id *ids = calloc((size_t)nb, sizeof *ids);
    int rc = !e || !p || !ids || probe(e, m, o, alone);
    for (int r = 0; !rc && r < o->reps; r++) rc = probe(e, m, o, &alone[r]);
    for (int k = 0; !rc && k < nb; k++) {
        random_prompt(p + (size_t)k * o->pp, (int)o->pp, m->hp.n_vocab);
        rc = !(ids[k] = submit(e, p + (size_t)k * o->pp, (int)o->pp, gen));
    }
    for (int k = 0; !rc && k < nb; k++) { /* every background sequence is decoding */
        llm_event ev;
        rc = llm_engine_next(e, ids[k], &ev, -1) != LLM_OK || ev.type != LLM_EVENT_TOKEN;
        llm_event_clear(&ev);
    }
    for (int r = 0; !rc && r < o->reps; r++) rc = probe(e, m, o, &loaded[r]);
    for (int k = 0; k < nb && ids; k++) llm_engine_cancel(e, ids[k]);
    if (!rc) {
        print_head("load", m, o);
        printf("background=%d pp=%ld ttft_alone_ms=%.1f ttft_load_ms=%.1f\n", nb, o->pp, median(alone, (int)o->reps),
               median(loaded, (int)o->reps));
    }
    free(p);
    free(ids);
    llm_engine_close(e);
    return rc;
}

/* Cold and warm time to first token behind a shared system prompt. */
static int prefix_round(llm_engine *e, const llm_model *m, int np, double *cold, double *warm, int *cached)
{
    int32_t *p = malloc(sizeof(int32_t) * (size_t)(np + 16));
    int rc = !p;
    for (int pass = 0; !rc && pass < 2; pass++) {
        if (pass == 0)
            random_prompt(p, np, m->hp.n_vocab); /* a new system prompt: nothing cached */
        random_prompt(p + np, 16, m->hp.n_vocab);
        llm_request_id id = submit(e, p, np + 16, 1);
        llm_usage u = {0};
        rc = !id || drain(e, id, &u);
        *(pass ? warm : cold) = u.ttft_ms;
        *cached = u.cached_tokens;
    }
    free(p);
    return rc;
}

static int bench_prefix(const llm_model *m, llm_backend *b, const opts *o)
{
    int np = (int)o->prefix, cached = 0;
    llm_engine *e = open_engine(m, b, o, 4, np + 16 + 2, 1);
    double cold[101], warm[101];
    int rc = !e || prefix_round(e, m, np, cold, warm, &cached);
    for (int r = 0; !rc && r < o->reps; r++) rc = prefix_round(e, m, np, &cold[r], &warm[r], &cached);
    if (!rc) {
        double c = median(cold, (int)o->reps), w = median(warm, (int)o->reps);
        print_head("prefix", m, o);
        printf("prefix=%d suffix=16 cold_ttft_ms=%.1f warm_ttft_ms=%.1f speedup=%.2f cached_tokens=%d\n", np, c, w, c / w,
               cached);
    }
    llm_engine_close(e);
    return rc;
}

static int parse_list(const char *s, opts *o)
{
    o->n_npl = 0;
    while (s && *s && o->n_npl < 16) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1024)
            return -1;
        o->npl[o->n_npl++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return o->n_npl ? 0 : -1;
}

/* --grammar: only the built-in JSON object grammar is offered. */
static int parse_grammar(const char *v, opts *o)
{
    o->json = !strcmp(v, "json");
    return o->json ? 0 : -1;
}

static int usage(void)
{
    fprintf(stderr, "usage: llm-serve-bench -m MODEL.gguf [-t THREADS] [-p 32] [-n 64] [-r 3] [--npl 1,4,16,64]\n"
                    "       [--load N] [--prefix P] [--kv-type f16|f32|q8_0] [--grammar json]\n");
    return 2;
}

static int parse(int argc, char **argv, opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        llm_error err;
        int bad = 0;
        if (!v)
            return usage();
        if (!strcmp(a, "-m")) o->model = v;
        else if (!strcmp(a, "-t")) bad = cli_int(a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "-p")) bad = cli_int(a, v, 1, 4096, &o->pp);
        else if (!strcmp(a, "-n")) bad = cli_int(a, v, 2, 4096, &o->tg);
        else if (!strcmp(a, "-r")) bad = cli_int(a, v, 1, 100, &o->reps);
        else if (!strcmp(a, "--load")) bad = cli_int(a, v, 1, 1024, &o->load);
        else if (!strcmp(a, "--prefix")) bad = cli_int(a, v, 1, 1 << 16, &o->prefix);
        else if (!strcmp(a, "--npl")) bad = parse_list(v, o);
        else if (!strcmp(a, "--kv-type")) bad = llm_kv_type_parse(v, &o->kv, &err) != LLM_OK;
        else if (!strcmp(a, "--grammar")) bad = parse_grammar(v, o);
        else return usage();
        if (bad)
            return usage();
        i++;
    }
    return o->model ? 0 : usage();
}

int main(int argc, char **argv)
{
    opts o = {.threads = 1, .pp = 32, .tg = 64, .reps = 3};
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc;
    llm_error err = {0};
    llm_model *m = NULL;
    llm_backend *b = NULL;
    llm_cpu_config cc = {.n_threads = (int)o.threads};
    if (llm_model_load(o.model, &m, &err) || llm_backend_cpu_new(&cc, &b, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        llm_model_free(m);
        return 1;
    }
    for (int i = 0; !rc && i < o.n_npl; i++) rc = bench_npl(m, b, &o, o.npl[i]);
    if (!rc && o.load)
        rc = bench_load(m, b, &o);
    if (!rc && o.prefix)
        rc = bench_prefix(m, b, &o);
    llm_backend_free(b);
    llm_model_free(m);
    return rc ? 1 : 0;
}
