/* test_backend.c - engine/backend/cuda/backend_cuda.c's own paths on the CUDA-on-CPU
 * emulator ($LLM_CUDA_LIB = build/cudasim/libllm_cuda.so): decode steps
 * as CUDA graphs when a step's indices do not fit the graph arena, when
 * stream capture or a graph launch fails (CUSIM_FAIL), and the cuBLAS
 * path of quantized weights (activations beyond half precision's range,
 * the scratch it needs) against the CPU backend; embedding requests
 * beside a generation (steps with hidden rows are never captured);
 * constrained and logit-biased requests beside a free one (their steps
 * are sampled on the host, the others on the device).
 *
 * Each test runs in a child process (the emulator is set up once per
 * process, CUSIM_FAIL with it); the parent never touches CUDA. */
#include <math.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#include "llm/backend.h"
#include "llm/engine.h"
#include "llm/gmatch.h"
#include "llm/grammar.h"
#include "llm/mkmodel.h"
#include "llm/model.h"
#include "llm/quant.h"

static llm_backend *open_cuda(void)
{
    llm_backend *b = NULL;
    llm_error err = {0};
    if (llm_backend_cuda_new(&(llm_cuda_config){0}, &b, &err)) {
        fprintf(stderr, "cuda backend: %s\n", err.msg);
        _exit(2);
    }
    return b;
}

/* Runs fn in a child with the variables `env` (NAME=VALUE strings, NULL
 * ended, or NULL) set; fails the test unless it exits 0. What it wrote to
 * stderr comes back in out (n bytes, NUL-terminated; NULL: not kept). */
static void in_child(int (*fn)(void), const char *const *env, char *out, size_t n)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* not cmocka's handler: a crash ends the child (and the emulator reports it) */
        dup2(fds[1], 2);
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
        exit(fn()); /* exit, not _exit: the emulator prints CUSIM_STATS at exit */
    }
    close(fds[1]);
    char buf[16384];
    size_t got = 0;
    ssize_t r;
    while ((r = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)r; /* until the child closes it */
    buf[got] = 0;
    close(fds[0]);
    fputs(buf, stderr);
    if (out)
        snprintf(out, n, "%s", buf);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status))
        fail_msg("child (%s) ended with status 0x%x", env ? env[0] : "no CUSIM_FAIL", status);
}

/* ---- decode steps and their graphs ---------------------------------------- */

typedef struct steps {
    llm_backend *b;
    int n_rows, max_len;
    llm_kv_layer kv;
    llm_batch_seq *seqs;
    llm_sample_params *params;
    int32_t *ids, table[1];
    float *q, *out, *logits;
} steps;

enum { NH = 8, NKV = 2, HD = 64, BS = 16, NV = 64 };

/* n_rows sequences of one row at position 5 (one KV block, shared); the
 * step is shaped as a decode step of contexts up to max_len (graphs pad
 * every block table to that bucket). */
static void steps_init(steps *s, int n_rows, int max_len)
{
    s->b = open_cuda();
    s->n_rows = n_rows, s->max_len = max_len;
    size_t rb = quant_row_bytes(QT_F16, NKV * HD);
    s->kv = (llm_kv_layer){llm_backend_buffer_alloc(s->b, BS * rb), llm_backend_buffer_alloc(s->b, BS * rb), QT_F16, BS,
                           NKV * HD, rb};
    s->q = llm_backend_buffer_alloc(s->b, sizeof(float) * (size_t)n_rows * NH * HD);
    s->out = llm_backend_buffer_alloc(s->b, sizeof(float) * (size_t)n_rows * NH * HD);
    s->logits = llm_backend_buffer_alloc(s->b, sizeof(float) * (size_t)n_rows * NV);
    s->seqs = calloc((size_t)n_rows, sizeof *s->seqs);
    s->params = calloc((size_t)n_rows, sizeof *s->params);
    s->ids = calloc((size_t)n_rows, sizeof *s->ids);
    if (!s->kv.k || !s->kv.v || !s->q || !s->out || !s->logits || !s->seqs || !s->params || !s->ids)
        _exit(3);
    s->table[0] = 0;
    for (int i = 0; i < n_rows; i++) {
        s->seqs[i] = (llm_batch_seq){i, 1, 5, s->table, NULL};
        s->params[i] = (llm_sample_params){0, 0, 1, 0, 0};
    }
}

static void steps_free(steps *s)
{
    void *bufs[] = {s->kv.k, s->kv.v, s->q, s->out, s->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) llm_backend_buffer_free(s->b, bufs[i]);
    llm_backend_free(s->b);
    free(s->seqs), free(s->params), free(s->ids);
}

/* One step: attention over the cache, then the pick on the device. */
static llm_status step(steps *s)
{
    llm_step_info si = {s->n_rows, s->n_rows, s->n_rows, s->max_len, 1, 1, 0, 0};
    s->b->iface->step_begin(s->b, &si);
    llm_attn_args a = {s->q, s->out, NH, NKV, HD, 0.125f, s->seqs, s->n_rows, &s->kv, 0};
    llm_status st = llm_backend_attention(s->b, &a);
    if (!st)
        st = s->b->iface->sample(s->b, s->logits, s->n_rows, NV, s->params, s->ids);
    return st;
}

/* 512 sequences at a 32768 bucket: their block tables alone take 2^20
 * entries of the graph arena (as many as it has). The shape must run
 * eagerly, every step succeeding, instead of failing the captured one. */
static int big_shape_main(void)
{
    steps s;
    steps_init(&s, 512, 20000);
    for (int i = 0; i < 4; i++)
        if (step(&s)) {
            fprintf(stderr, "step %d of 512 sequences at bucket 32768 failed\n", i);
            return 1;
        }
    steps_free(&s);
    return 0;
}

static void test_shape_too_big_for_a_graph(void **st)
{
    (void)st;
    in_child(big_shape_main, NULL, NULL, 0);
}

/* Six small steps (eager while buffers grow, then captured, then
 * replayed): want_fail failures, none of them in the last two steps. */
static int six_steps(int want_fail)
{
    steps s;
    steps_init(&s, 4, 64);
    int failed = 0, last_failed = -1;
    for (int i = 0; i < 6; i++)
        if (step(&s)) {
            failed++;
            last_failed = i;
        }
    steps_free(&s);
    if (failed != want_fail || last_failed >= 4) {
        fprintf(stderr, "%d step(s) failed (want %d), the last at step %d\n", failed, want_fail, last_failed);
        return 1;
    }
    return 0;
}

static int capture_fails_main(void) { return six_steps(0); }
static int launch_fails_main(void) { return six_steps(1); }

/* A capture that cannot start: the shape runs eagerly, no step fails
 * (and the failure was injected, and no graph ran). */
static void test_capture_refused(void **st)
{
    (void)st;
    static const char *const env[] = {"CUSIM_FAIL=cudaStreamBeginCapture:1", "CUSIM_STATS=1", NULL};
    char err[16384];
    in_child(capture_fails_main, env, err, sizeof err);
    assert_non_null(strstr(err, "call 1 of cudaStreamBeginCapture fails"));
    assert_non_null(strstr(err, "(0 graph launches)"));
}

/* The first graph launch fails: that step fails, the ones after it run
 * (its queued copy of the pinned index arena must not outlive the step:
 * the emulator faults a host write to pinned memory a copy still reads). */
static void test_graph_launch_fails(void **st)
{
    (void)st;
    static const char *const env[] = {"CUSIM_FAIL=cudaGraphLaunch:1", NULL};
    char err[16384];
    in_child(launch_fails_main, env, err, sizeof err);
    assert_non_null(strstr(err, "call 1 of cudaGraphLaunch fails"));
}

/* Without injection the same steps are captured and replayed. */
static void test_graphs_replay(void **st)
{
    (void)st;
    static const char *const env[] = {"CUSIM_STATS=1", NULL};
    char err[16384];
    in_child(capture_fails_main, env, err, sizeof err);
    const char *g = strstr(err, " graph launches)");
    assert_non_null(g);
    while (g > err && g[-1] != '(') g--;
    assert_true(strtol(g, NULL, 10) >= 2);
}

/* ---- the cuBLAS path for quantized weights ---------------------------------- */

/* y = x . W^T on the device for n_tok 16 (the cuBLAS path) with Q8_0
 * weights and some activations beyond half precision's 65504, against
 * float64 sums over the dequantized weights; and the device memory the
 * call took beyond its buffers (the dequantized weights' scratch). */
static int gemm_main(void)
{
    enum { COLS = 2048, NT = 16 };
    const int rows = 17408;    /* as half, 68 MiB of dequantized weights; as float, 136 MiB */
    const float amp = 2e5f;
    size_t rb = quant_row_bytes(QT_Q8_0, COLS);
    float *w = malloc(sizeof(float) * COLS), *x = malloc(sizeof(float) * NT * COLS), *got = malloc(sizeof(float) * NT * rows);
    double *ref = malloc(sizeof(double) * NT * rows);
    unsigned char *q = malloc((size_t)rows * rb);
    if (!w || !x || !ref || !got || !q)
        return 3;
    uint64_t rs = 1;
    for (int i = 0; i < NT * COLS; i++) x[i] = test_randf(&rs) * (i % 97 == 0 ? amp : 1.f);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < COLS; c++) w[c] = test_randf(&rs);
        quant_quantize_row(QT_Q8_0, w, q + (size_t)r * rb, COLS);
        quant_dequantize_row(QT_Q8_0, q + (size_t)r * rb, w, COLS);
        for (int t = 0; t < NT; t++) {
            double acc = 0;
            for (int c = 0; c < COLS; c++) acc += (double)w[c] * x[(size_t)t * COLS + c];
            ref[(size_t)t * rows + r] = acc;
        }
    }
    /* the weights and x on the device: a model of one embedding table (x's
     * rows) and one output matrix (W), uploaded */
    llm_backend *b = open_cuda();
    llm_layer none;
    llm_model m = {0};
    m.hp.n_vocab = NT, m.hp.n_embd = COLS;
    m.layers = &none;
    m.tok_embd = (llm_weight){QT_F32, NT, COLS, sizeof(float) * COLS, x, NULL};
    m.output = (llm_weight){QT_Q8_0, rows, COLS, rb, q, NULL};
    llm_model *dm = NULL;
    llm_error err = {0};
    if (b->iface->model_upload(b, &m, &dm, &err)) {
        fprintf(stderr, "upload: %s\n", err.msg);
        return 5;
    }
    float *dx = llm_backend_buffer_alloc(b, sizeof(float) * NT * COLS),
          *dy = llm_backend_buffer_alloc(b, sizeof(float) * NT * rows);
    if (!dx || !dy)
        return 7;
    int32_t ids[NT];
    for (int i = 0; i < NT; i++) ids[i] = i;
    llm_backend_get_rows(b, &dm->tok_embd, ids, NT, dx);
    llm_backend_mem m0, m1;
    llm_backend_mem_stats(b, &m0);
    llm_status st = llm_backend_matmul(b, &dm->output, dx, NT, dy);
    llm_backend_mem_stats(b, &m1);
    if (st || llm_backend_read(b, got, dy, sizeof(float) * NT * rows)) {
        fprintf(stderr, "device matmul failed (status %d)\n", (int)st);
        return 6;
    }
    double num = 0, den = 0;
    int bad = 0;
    for (int i = 0; i < NT * rows; i++) {
        bad += !isfinite(got[i]);
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    double rel = sqrt(num / den), took = (double)(m0.free - m1.free) / (1 << 20);
    fprintf(stderr, "Q8_0 %dx%d, 16 rows, |x| up to %g: %d non-finite, relative error %.2e, scratch %.1f MiB\n", rows,
            COLS, amp, bad, rel, took);
    llm_backend_buffer_free(b, dx);
    llm_backend_buffer_free(b, dy);
    b->iface->model_release(b, dm);
    llm_backend_free(b);
    free(w), free(x), free(got), free(ref), free(q);
    /* TF32 rounds x to 11 significant bits: a few 1e-4; the scratch is the
     * backend's 64 MiB slab (and its guard), not the 136 MiB matrix */
    return bad || !(rel < 2e-3) || took > 64.5 ? 1 : 0;
}

static void test_quantized_gemm(void **st)
{
    (void)st;
    in_child(gemm_main, NULL, NULL, 0);
}

/* ---- embeddings through the engine ------------------------------------------ */

enum { E_ROUNDS = 4, E_DIM_MAX = 1024 };

/* One engine on b: a 60-token generation and, beside it, E_ROUNDS rounds of
 * two one-token embedding inputs per pooling (steps of one row per
 * sequence: decode-shaped, the shape graphs are made of); vectors into
 * out[round][input] (dim floats). 0, or -1 with the reason on stderr. */
static int embed_run(const llm_model *m, llm_backend *b, float (*out)[4][E_DIM_MAX])
{
    llm_error err = {0};
    llm_engine *e = NULL;
    if (llm_engine_open(&(llm_engine_config){.model = m, .backend = b, .n_ctx = 128}, &e, &err)) {
        fprintf(stderr, "engine: %s\n", err.msg);
        return -1;
    }
    int32_t prompt[5] = {1, 2, 3, 4, 5}, one[4] = {5, 6, 7, 8};
    llm_request gen = {.tokens = prompt, .n_tokens = 5, .sampling = llm_sampling_default(), .max_tokens = 60,
                       .ignore_eos = 1};
    llm_request_id gid, id;
    int rc = llm_engine_submit(e, &gen, &gid, &err) ? -1 : 0;
    for (int r = 0; !rc && r < E_ROUNDS; r++)
        for (int i = 0; !rc && i < 4; i++) {
            llm_request rq = {.tokens = &one[i], .n_tokens = 1, .sampling = llm_sampling_default(),
                              .pooling = i < 2 ? LLM_POOL_LAST : LLM_POOL_MEAN};
            llm_event ev;
            rc = llm_engine_submit(e, &rq, &id, &err) || llm_engine_next(e, id, &ev, 60000) ? -1 : 0;
            if (!rc && (ev.type != LLM_EVENT_DONE || ev.n_embedding != m->hp.n_embd)) {
                fprintf(stderr, "embedding %d.%d: %s\n", r, i, ev.type == LLM_EVENT_ERROR ? ev.error.msg : "no vector");
                rc = -1;
            }
            if (!rc)
                memcpy(out[r][i], ev.embedding, sizeof(float) * (size_t)m->hp.n_embd);
            if (!rc || ev.type)
                llm_event_clear(&ev);
        }
    for (int done = 0; !rc && !done;) {
        llm_event ev;
        if (llm_engine_next(e, gid, &ev, 60000) || ev.type == LLM_EVENT_ERROR) {
            fprintf(stderr, "generation: %s\n", ev.type == LLM_EVENT_ERROR ? ev.error.msg : "lost");
            rc = -1;
        }
        done = !rc && ev.type == LLM_EVENT_DONE;
        llm_event_clear(&ev);
    }
    if (rc && err.msg[0])
        fprintf(stderr, "%s\n", err.msg);
    llm_engine_close(e);
    return rc;
}

/* One-token embedding inputs beside a generation make decode-shaped steps
 * with hidden rows, read back midway: a captured graph refused that read
 * and failed the whole pass, the generation of another tenant with it.
 * Every request succeeds, and the vectors equal the CPU backend's within
 * 1e-3 (F32 weights; unit vectors). */
static int embed_main(void)
{
    test_tiny t;
    llm_backend *cuda = open_cuda();
    static float cpu[E_ROUNDS][4][E_DIM_MAX], dev[E_ROUNDS][4][E_DIM_MAX];
    if (test_tiny_open(&t, "cudasim-embed", QT_F32, 3, 2) || t.m->hp.n_embd > E_DIM_MAX ||
        embed_run(t.m, t.b, cpu) || embed_run(t.m, cuda, dev))
        return 1;
    double worst = 0;
    for (int r = 0; r < E_ROUNDS; r++)
        for (int i = 0; i < 4; i++)
            for (int k = 0; k < t.m->hp.n_embd; k++) worst = fmax(worst, fabs((double)cpu[r][i][k] - dev[r][i][k]));
    fprintf(stderr, "embeddings: cuda - cpu max |difference| %.2e\n", worst);
    llm_backend_free(cuda);
    test_tiny_close(&t);
    return worst <= 1e-3 ? 0 : 1;
}

static void test_embeddings_beside_graphs(void **st)
{
    (void)st;
    in_child(embed_main, NULL, NULL, 0);
}

/* ---- constrained and biased requests on the device backend ----------------- */

enum { C_GEN = 40, C_REQS = 5 };

typedef struct c_out {
    int32_t tok[C_GEN];
    int n;
    char text[4096];
    size_t len;
    llm_finish finish;
} c_out;

/* Reads request id to its end into o. 0, or -1 with the reason on stderr. */
static int c_collect(llm_engine *e, llm_request_id id, c_out *o)
{
    memset(o, 0, sizeof *o);
    for (;;) {
        llm_event ev = {0};
        if (llm_engine_next(e, id, &ev, 60000) || ev.type == LLM_EVENT_ERROR) {
            fprintf(stderr, "request: %s\n", ev.type == LLM_EVENT_ERROR ? ev.error.msg : "lost");
            return -1;
        }
        if (ev.type == LLM_EVENT_TOKEN && o->n < C_GEN)
            o->tok[o->n++] = ev.token;
        if (o->len + ev.text_len < sizeof o->text) {
            memcpy(o->text + o->len, ev.text, ev.text_len);
            o->len += ev.text_len;
        }
        o->finish = ev.finish;
        int done = ev.type == LLM_EVENT_DONE;
        llm_event_clear(&ev);
        if (done)
            return 0;
    }
}

static const char *const C_GRAMMAR = "root ::= [a-z ]{1,30} \".\"\n";

/* Whether o's text is in C_GRAMMAR's language (whole when it stopped). */
static int c_valid(const c_out *o)
{
    llm_grammar *g = NULL;
    llm_gmatch *m = NULL;
    llm_error err = {0};
    int ok = !llm_grammar_compile(C_GRAMMAR, strlen(C_GRAMMAR), NULL, &g, &err) &&
             !llm_gmatch_new(g, NULL, NULL, 0, &m, &err) && !llm_gmatch_feed(m, o->text, o->len, &err) &&
             (o->finish != LLM_FINISH_STOP || llm_gmatch_complete(m));
    if (!ok)
        fprintf(stderr, "constrained text \"%.*s\" is not in the grammar: %s\n", (int)o->len, o->text, err.msg);
    llm_gmatch_free(m);
    llm_grammar_free(g);
    return ok;
}

/* Request k of the mix: 0 free and greedy; 1-3 constrained at temperature
 * 1; 4 greedy with every token of free's answer banned (bias -100), 8
 * tokens long, so the steps after it hold only free and constrained rows. */
static llm_request c_request(int k, const int32_t *prompt, const c_out *free_run, llm_logit_bias *ban)
{
    llm_request rq = {.tokens = prompt, .n_tokens = 5, .sampling = llm_sampling_default(), .max_tokens = C_GEN,
                      .ignore_eos = 1};
    if (k >= 1 && k <= 3) {
        rq.grammar = C_GRAMMAR;
        rq.grammar_len = strlen(C_GRAMMAR);
        rq.sampling.temperature = 1.0f;
        rq.sampling.seed = (uint64_t)k;
    } else if (k == 4) {
        for (int i = 0; i < free_run->n; i++) ban[i] = (llm_logit_bias){free_run->tok[i], -100.0f};
        rq.sampling.bias = ban;
        rq.sampling.n_bias = free_run->n;
        rq.max_tokens = 8;
    }
    return rq;
}

/* On the device backend: the free request alone, then beside constrained
 * and biased ones. The free answer is the same both times (other tenants'
 * grammars and biases move its steps to host sampling, never its tokens),
 * every constrained text is in the grammar, and the biased answer holds
 * none of its banned tokens. */
static int constrained_main(void)
{
    test_tiny t;
    llm_backend *cuda = open_cuda();
    llm_error err = {0};
    llm_engine *e = NULL;
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    static c_out alone, out[C_REQS];
    llm_logit_bias ban[C_GEN];
    llm_request_id ids[C_REQS];
    if (test_tiny_open(&t, "cudasim-constrained", QT_F32, 3, 2) ||
        llm_engine_open(&(llm_engine_config){.model = t.m, .backend = cuda, .n_ctx = 128}, &e, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return 1;
    }
    llm_request rq = c_request(0, prompt, NULL, NULL);
    int rc = llm_engine_submit(e, &rq, &ids[0], &err) || c_collect(e, ids[0], &alone);
    for (int k = 0; !rc && k < C_REQS; k++) {
        rq = c_request(k, prompt, &alone, ban);
        rc = llm_engine_submit(e, &rq, &ids[k], &err) != LLM_OK;
    }
    for (int k = 0; !rc && k < C_REQS; k++) rc = c_collect(e, ids[k], &out[k]);
    if (!rc && (out[0].n != alone.n || memcmp(out[0].tok, alone.tok, sizeof(int32_t) * (size_t)alone.n))) {
        fprintf(stderr, "the free request's answer changed beside constrained ones\n");
        rc = 1;
    }
    for (int k = 1; !rc && k <= 3; k++) rc = !c_valid(&out[k]);
    for (int i = 0; !rc && i < out[4].n; i++)
        for (int j = 0; !rc && j < alone.n; j++)
            if (out[4].tok[i] == alone.tok[j]) {
                fprintf(stderr, "banned token %d was picked\n", alone.tok[j]);
                rc = 1;
            }
    if (rc && err.msg[0])
        fprintf(stderr, "%s\n", err.msg);
    fprintf(stderr, "constrained on the device backend: %s (first text \"%.*s\")\n", rc ? "FAILED" : "ok",
            (int)out[1].len, out[1].text);
    llm_engine_close(e);
    llm_backend_free(cuda);
    test_tiny_close(&t);
    return rc ? 1 : 0;
}

static void test_constrained_beside_free(void **st)
{
    (void)st;
    in_child(constrained_main, NULL, NULL, 0);
}

/* A 40-token prompt chunked into steps of 1 and of 8 rows with nothing
 * decoding beside it: steps without a logit row (which once staged a
 * 0-byte copy to a buffer never allocated and failed the pass, and whose
 * one-row steps look like decode steps a graph could capture) before the
 * first pick; both give the same greedy ids (GEMV either way). */
static int chunked_main(void)
{
    test_tiny t;
    llm_backend *cuda = open_cuda();
    llm_error err = {0};
    int32_t prompt[40];
    static c_out out[2];
    int rc = test_tiny_open(&t, "cudasim-chunked", QT_Q8_0, 5, 2);
    for (int i = 0; i < 40; i++) prompt[i] = (int32_t)((i * 37 + 11) % 512);
    static const int budgets[2] = {1, 8};
    for (int k = 0; !rc && k < 2; k++) {
        llm_engine *e = NULL;
        llm_request_id id;
        llm_request rq = {.tokens = prompt, .n_tokens = 40, .sampling = llm_sampling_default(), .max_tokens = 8,
                          .ignore_eos = 1};
        rq.sampling.temperature = 0;
        rc = llm_engine_open(&(llm_engine_config){.model = t.m, .backend = cuda, .n_ctx = 128, .max_seqs = 1,
                                                  .max_batch_tokens = budgets[k]},
                             &e, &err) ||
             llm_engine_submit(e, &rq, &id, &err) || c_collect(e, id, &out[k]);
        if (e)
            llm_engine_close(e);
    }
    if (!rc && (out[0].n != 8 || out[1].n != 8 || memcmp(out[0].tok, out[1].tok, sizeof(int32_t) * 8))) {
        fprintf(stderr, "chunked prompts: steps of 1 and of 8 rows answered differently\n");
        rc = 1;
    }
    if (rc && err.msg[0])
        fprintf(stderr, "%s\n", err.msg);
    llm_backend_free(cuda);
    test_tiny_close(&t);
    return rc ? 1 : 0;
}

static void test_chunked_prompt_alone(void **st)
{
    (void)st;
    in_child(chunked_main, NULL, NULL, 0);
}

int main(void)
{
    if (!getenv("LLM_CUDA_LIB")) {
        fprintf(stderr, "test_backend: set LLM_CUDA_LIB to the emulated plugin (make cudasim does)\n");
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape_too_big_for_a_graph),
        cmocka_unit_test(test_capture_refused),
        cmocka_unit_test(test_graph_launch_fails),
        cmocka_unit_test(test_graphs_replay),
        cmocka_unit_test(test_quantized_gemm),
        cmocka_unit_test(test_embeddings_beside_graphs),
        cmocka_unit_test(test_constrained_beside_free),
        cmocka_unit_test(test_chunked_prompt_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
