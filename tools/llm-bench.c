/* llm-bench - time prefill and decode of one model, and measure memory
 * bandwidth with a large copy, for `make bench` and tests/gpu/run.sh.
 *   llm-bench -m MODEL.gguf [-p 128] [-n 64] [-t THREADS] [-r REPS]
 *   llm-bench --bandwidth [-t THREADS]
 *   llm-bench -m MODEL.gguf --batch 1,16,64 [--backend cuda] [--tp N] [-p CTX] [-n STEPS] [--prefill 512]
 *             [--loras N [--lora-rank R]]
 *   llm-bench --bandwidth --backend cuda | --gemm [--backend cuda]
 *   llm-bench --peak [-t THREADS]
 * Prints key=value lines (parsed by tests/bench/bench.py and run.sh): the
 * first form the mean and standard deviation over REPS runs after one
 * warm-up run (llama-bench's statistics) of one sequence on the CPU, and
 * the operations a token's matmuls take (a decode step's) and a prompt
 * token's (the output matrix runs once per chunk), the prefills' shares of
 * wall time in matmuls and attention, and the matmuls' own GOP/s (their
 * rate with activation quantizing and the thread hand-off, apart from the
 * rest of a forward pass); --peak the CPU kernel
 * set's int8 multiply-add rate with THREADS threads busy at once; with
 * --batch, one line per batch size of decode steps over that many
 * sequences of CTX tokens each (greedy: ids picked on the device), and the
 * prefill rate of one --prefill-token prompt (--loras: N distinct seeded
 * LoRA adapters of rank R (16) made for the model, sequence i running
 * under adapter i mod N at scale 1, prefill and decode); on a device, --bandwidth is a
 * device-to-device copy (bytes read + written) and --gemm a BF16
 * 8192x8192x4096 matmul through the backend (its cuBLAS rate). */
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "llm/forward.h"
#include "llm/kv_cache.h"
#include "llm/lora.h"
#include "llm/mkmodel.h"
#include "llm/model.h"

/* One thread's share of a bandwidth pass: copy src to dst, or (dst NULL)
 * read src with one load per 64-byte line. */
typedef struct bw_job { char *dst; const char *src; size_t n; uint64_t sum; } bw_job;

static void *bw_worker(void *arg)
{
    bw_job *j = arg;
    if (j->dst) {
        memcpy(j->dst, j->src, j->n);
        return NULL;
    }
    const uint64_t *p = (const uint64_t *)j->src;
    uint64_t s = 0;
    for (size_t i = 0; i < j->n / 8; i += 8) s += p[i];
    j->sum = s;
    return NULL;
}

/* Best of 5 multi-threaded passes over 1 GiB, in GB/s of bytes moved
 * (a copy counts each byte read and written); 0 on failure. */
static double bandwidth(int threads, int copy)
{
    size_t n = (size_t)1 << 30;
    int nt = threads > 64 ? 64 : threads;
    char *a = malloc(n), *b = copy ? malloc(n) : NULL;
    double best = 0;
    if (!a || (copy && !b))
        goto out;
    memset(a, 1, n);
    if (b)
        memset(b, 2, n);
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        bw_job jobs[64];
        int started = 0;
        double t0 = cli_now();
        for (; started < nt; started++) {
            jobs[started] = (bw_job){b ? b + n / nt * started : NULL, a + n / nt * started, n / nt, 0};
            if (pthread_create(&th[started], NULL, bw_worker, &jobs[started]))
                break;
        }
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        if (started < nt)
            goto out;
        double gbs = (copy ? 2.0 : 1.0) * (double)n / (cli_now() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
out:
    free(a);
    free(b);
    return best;
}

/* Mean of v[0..n) and its sample standard deviation. */
static double mean_sd(const double *v, int n, double *sd)
{
    double m = 0, q = 0;
    for (int i = 0; i < n; i++) m += v[i] / n;
    for (int i = 0; i < n; i++) q += (v[i] - m) * (v[i] - m);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
    return m;
}

static llm_kv_type g_kv; /* --kv-type */

/* Billions of operations (a multiply and an add each) a token's matmuls
 * take: every dense matrix, and the experts a token is routed to. */
static double matmul_gop(const llm_model *m)
{
    double macs = (double)m->output.rows * (double)m->output.cols;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const llm_layer *L = &m->layers[l];
        const llm_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->w_router};
        for (size_t i = 0; i < sizeof w / sizeof *w; i++) macs += (double)w[i]->rows * (double)w[i]->cols;
        for (int e = 0; m->hp.n_expert && e < 3; e++) {
            const llm_weight *x = e == 0 ? L->exp_gate : e == 1 ? L->exp_up : L->exp_down;
            macs += (double)m->hp.n_expert_used * (double)x->rows * (double)x->cols;
        }
    }
    return 2 * macs / 1e9;
}

/* BENCH_CHUNK-token chunks of a prompt (run's session max_batch), and the
 * operations of a whole prompt's matmuls per token: a chunk computes the
 * output matrix for its last row only. */
#define BENCH_CHUNK 512
static double prefill_gop_per_token(const llm_model *m, int n_prompt)
{
    double out = 2.0 * (double)m->output.rows * (double)m->output.cols / 1e9;
    int chunks = (n_prompt + BENCH_CHUNK - 1) / BENCH_CHUNK;
    return matmul_gop(m) - out + out * chunks / n_prompt;
}

/* One timed prefill of n tokens from an empty context: its wall seconds,
 * and the nanoseconds spent in the backend's matmuls and attention added to
 * *mm and *at. Negative on an error (in *err). */
static double bench_prefill(llm_session *s, llm_backend *b, const int32_t *toks, int n, uint64_t *mm, uint64_t *at,
                            llm_error *err)
{
    const float *logits;
    uint64_t mm0, at0, mm1, at1;
    llm_session_reset(s);
    llm_backend_cpu_times(b, &mm0, &at0);
    double t0 = cli_now();
    if (llm_session_eval(s, toks, n, &logits, err))
        return -1;
    double wall = cli_now() - t0;
    llm_backend_cpu_times(b, &mm1, &at1);
    *mm += mm1 - mm0;
    *at += at1 - at0;
    return wall;
}

static int run(const char *path, int n_prompt, int n_gen, int threads, int reps)
{
    llm_error err = {0};
    llm_model *m = NULL;
    llm_backend *b = NULL;
    llm_session *s = NULL;
    llm_cpu_config cc = {.n_threads = threads};
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_prompt);
    int rc = 1;
    if (!toks || llm_model_load(path, &m, &err) || llm_backend_cpu_new(&cc, &b, &err) ||
        llm_session_new(m, b, &(llm_session_config){.n_ctx = n_prompt + n_gen + 1, .max_batch = BENCH_CHUNK, .kv_type = (int)g_kv}, &s, &err))
        goto out;
    for (int i = 0; i < n_prompt; i++) toks[i] = (int32_t)((i * 7919 + 13) % m->hp.n_vocab);
    double pp[101], tg[101], pp_wall = 0;
    uint64_t pp_mm = 0, pp_at = 0, warm_mm = 0, warm_at = 0; /* the timed prefills' (runs 1..reps) */
    const float *logits;
    for (int r = 0; r <= reps; r++) { /* run 0 warms caches and pages up, as llama-bench does */
        double wall = bench_prefill(s, b, toks, n_prompt, r ? &pp_mm : &warm_mm, r ? &pp_at : &warm_at, &err);
        if (wall < 0)
            goto out;
        pp_wall += r ? wall : 0;
        /* decode from an empty context, as llama-bench's tg test does */
        llm_session_reset(s);
        double t2 = cli_now();
        for (int i = 0; i < n_gen; i++) {
            int32_t t = toks[i % n_prompt];
            if (llm_session_eval(s, &t, 1, &logits, &err))
                goto out;
        }
        pp[r] = n_prompt / wall;
        tg[r] = n_gen / (cli_now() - t2);
    }
    double pp_sd, tg_sd, pp_mean = mean_sd(pp + 1, reps, &pp_sd), tg_mean = mean_sd(tg + 1, reps, &tg_sd);
    /* a decode step reads one row of the embedding, unless it is also the output */
    size_t emb = (size_t)m->tok_embd.rows * m->tok_embd.row_bytes;
    size_t step = llm_model_weight_bytes(m) - (m->output.data == m->tok_embd.data ? 0 : emb);
    /* the prefill's matmul rate counts only the time inside the backend's matmul calls (activation
     * quantizing and the workers' hand-off included), apart from the rest of a forward pass (attention,
     * norms, rope, the element-wise ops) */
    double mm_s = (double)pp_mm * 1e-9, pgop = prefill_gop_per_token(m, n_prompt);
    printf("model=%s threads=%d kernels=%s weight_bytes=%zu decode_bytes=%zu prefill_tps=%.2f prefill_sd=%.2f "
           "decode_tps=%.2f decode_sd=%.2f matmul_gop_per_token=%.6g prefill_gop_per_token=%.6g "
           "prefill_matmul_share=%.3f prefill_attn_share=%.3f prefill_matmul_gops=%.1f\n", m->name, threads,
           llm_backend_cpu_kernels(b), llm_model_weight_bytes(m), step, pp_mean, pp_sd, tg_mean, tg_sd, matmul_gop(m),
           pgop, mm_s / pp_wall, (double)pp_at * 1e-9 / pp_wall, mm_s > 0 ? pgop * n_prompt * reps / mm_s : 0.0);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "error: %s\n", err.msg[0] ? err.msg : "out of memory");
    free(toks);
    llm_session_free(s);
    llm_backend_free(b);
    llm_model_free(m);
    return rc;
}

/* ---- batched decode through the forward pass (any backend) -------------- */

#define BENCH_MAX_LORAS 64

typedef struct dev_bench {
    llm_model *m;
    llm_backend *b[LLM_MAX_RANKS];
    int n_ranks;
    llm_lora *loras[BENCH_MAX_LORAS]; /* --loras */
    int n_loras;
} dev_bench;

/* --loras N adapters of rank `rank` for d's model (path), written to
 * temporary files, loaded and the files removed. */
static llm_status loras_make(dev_bench *d, const char *path, int n, int rank, llm_error *err)
{
    const char *dir = getenv("TMPDIR");
    for (int i = 0; i < n; i++) {
        char f[512];
        snprintf(f, sizeof f, "%s/llm-bench-lora-%d-%d.gguf", dir ? dir : "/tmp", (int)getpid(), i);
        llm_status st = llm_mklora(path, rank, 2.0f * (float)rank, QT_F32, 1000 + (uint64_t)i, f, err);
        if (!st)
            st = llm_lora_load(f, d->m, 0, &d->loras[i], err);
        remove(f);
        if (st)
            return st;
        d->n_loras++;
    }
    return LLM_OK;
}

/* Sequence i's adapter in sl[i] (handles fl, made for f), or NULL when
 * none are asked for. */
static llm_status loras_attach(dev_bench *d, llm_forward *f, llm_forward_lora **fl, llm_forward_seq_lora *sl, int n_seqs,
                               llm_error *err)
{
    for (int k = 0; k < d->n_loras; k++) {
        llm_status st = llm_forward_lora_add(f, d->loras[k], &fl[k], err);
        if (st)
            return st;
    }
    for (int i = 0; d->n_loras && i < n_seqs; i++) sl[i] = (llm_forward_seq_lora){fl[i % d->n_loras], 1.0f};
    return LLM_OK;
}

/* The seq's K/V for positions [0, ctx): rows of several sequences packed
 * into passes of at most max_rows. */
static llm_status prefill_all(llm_forward *f, kv_cache *kv, kv_seq *s, int n_seqs, int ctx, int max_rows,
                              const int32_t *toks, const llm_forward_seq_lora *sl)
{
    llm_batch_seq *bs = malloc(sizeof *bs * (size_t)n_seqs);
    llm_forward_seq_lora *pl = malloc(sizeof *pl * (size_t)n_seqs);
    if (!bs || !pl) {
        free(bs);
        free(pl);
        return LLM_ERR_NOMEM;
    }
    llm_status st = LLM_OK;
    int i = 0, done = 0; /* sequence i has done tokens in its cache */
    while (i < n_seqs && !st) {
        int rows = 0, n = 0;
        while (i < n_seqs && rows < max_rows) {
            int take = ctx - done < max_rows - rows ? ctx - done : max_rows - rows;
            if (sl)
                pl[n] = sl[i];
            bs[n++] = (llm_batch_seq){rows, take, done, s[i].blocks, s[i].lblocks};
            rows += take;
            if ((done += take) == ctx) {
                i++;
                done = 0;
            }
        }
        int32_t last = rows - 1;
        llm_forward_batch bt = {toks, rows, bs, n, &last, 1, NULL, 0, sl ? pl : NULL};
        const int32_t *ids;
        st = llm_forward_eval_sample(f, &bt, kv_cache_layers(kv), NULL, &ids);
    }
    free(bs);
    free(pl);
    return st;
}

/* Decode steps of n_seqs sequences at context ctx: tokens per second. */
static llm_status decode_rate(dev_bench *d, int n_seqs, int ctx, int steps, double *tps, unsigned long long *ids_hash,
                              double split[2], llm_error *err)
{
    uint64_t mm0 = 0, at0 = 0, mm1, at1;
    const llm_hparams *hp = &d->m->hp;
    int max_rows = n_seqs > 512 ? n_seqs : 512, per = (ctx + steps + KV_DEFAULT_BLOCK - 1) / KV_DEFAULT_BLOCK;
    kv_cache_config kc = {.type = g_kv, .n_blocks = per * n_seqs, .ranks = d->b, .n_ranks = d->n_ranks};
    kv_cache *kv = NULL;
    llm_forward *f = NULL;
    kv_seq *s = calloc((size_t)n_seqs, sizeof *s);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)max_rows);
    llm_batch_seq *bs = malloc(sizeof *bs * (size_t)n_seqs);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)n_seqs);
    llm_forward_seq_lora *sl = calloc((size_t)n_seqs, sizeof *sl);
    llm_forward_lora *fl[BENCH_MAX_LORAS] = {0};
    llm_status st = !s || !toks || !bs || !rows || !sl ? llm_errf(err, LLM_ERR_NOMEM, "bench: no memory") : LLM_OK;
    if (!st)
        st = llm_forward_new_tp(d->m, d->b, d->n_ranks, max_rows, n_seqs, &f, err);
    if (!st)
        st = loras_attach(d, f, fl, sl, n_seqs, err);
    if (!st)
        st = kv_cache_new(&kc, d->b[0], hp->n_layer, hp->n_head_kv / d->n_ranks, hp->head_dim, &kv, err);
    for (int i = 0; !st && i < n_seqs; i++) {
        kv_seq_init(&s[i]);
        st = kv_seq_reserve(kv, &s[i], ctx + steps);
    }
    for (int i = 0; !st && i < max_rows; i++) toks[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
    if (!st)
        st = prefill_all(f, kv, s, n_seqs, ctx, max_rows, toks, d->n_loras ? sl : NULL);
    double t0 = 0;
    for (int step = -2; !st && step < steps; step++) { /* steps -2, -1: warm-up (a graph is captured at the second) */
        if (step == 0) {
            t0 = cli_now();
            llm_backend_cpu_times(d->b[0], &mm0, &at0);
        }
        int p = ctx + (step < 0 ? 0 : step);
        for (int i = 0; i < n_seqs; i++) {
            bs[i] = (llm_batch_seq){i, 1, p, s[i].blocks, s[i].lblocks};
            rows[i] = i;
        }
        llm_forward_batch bt = {toks, n_seqs, bs, n_seqs, rows, n_seqs, NULL, 0, d->n_loras ? sl : NULL};
        const int32_t *ids;
        st = llm_forward_eval_sample(f, &bt, kv_cache_layers(kv), NULL, &ids);
        /* each pick is the next step's token, so every step depends on the
         * last and the hash (in order) shows any difference in any step */
        for (int i = 0; !st && i < n_seqs; i++) {
            if (step >= 0)
                *ids_hash = *ids_hash * 1000003u + (unsigned)ids[i];
            toks[i] = ids[i] >= 0 && ids[i] < hp->n_vocab ? ids[i] : 0;
        }
    }
    if (!st) {
        double wall = cli_now() - t0;
        *tps = (double)n_seqs * steps / wall;
        llm_backend_cpu_times(d->b[0], &mm1, &at1); /* the step's shares in matmuls and attention (CPU) */
        split[0] = (double)(mm1 - mm0) * 1e-9 / wall;
        split[1] = (double)(at1 - at0) * 1e-9 / wall;
    }
    else if (!err->msg[0])
        llm_errf(err, st, "bench: a forward pass of %d sequences failed (%s)", n_seqs, llm_status_str(st));
    for (int i = 0; kv && s && i < n_seqs; i++) kv_seq_release(kv, &s[i]);
    kv_cache_free(kv);
    for (int k = 0; k < d->n_loras; k++) llm_forward_lora_free(f, fl[k]);
    llm_forward_free(f);
    free(s);
    free(toks);
    free(bs);
    free(rows);
    free(sl);
    return st;
}

/* One prompt of n tokens (passes of 512 rows), best of 3 after a warm-up. */
static llm_status prefill_rate(dev_bench *d, int n, double *tps, llm_error *err)
{
    llm_session *s = NULL;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
    llm_session_config sc = {.n_ctx = n + 1, .max_batch = 512, .kv_type = (int)g_kv, .tensor_parallel = d->n_ranks,
                             .tp_backends = d->b};
    llm_status st = toks ? llm_session_new(d->m, d->b[0], &sc, &s, err) : llm_errf(err, LLM_ERR_NOMEM, "bench: no memory");
    for (int i = 0; !st && i < n; i++) toks[i] = (int32_t)((i * 7919 + 13) % d->m->hp.n_vocab);
    *tps = 0;
    for (int r = 0; !st && r < 4; r++) {
        const float *lg;
        llm_session_reset(s);
        double t0 = cli_now();
        if (!(st = llm_session_eval(s, toks, n, &lg, err)) && r > 0 && n / (cli_now() - t0) > *tps)
            *tps = n / (cli_now() - t0);
    }
    llm_session_free(s);
    free(toks);
    return st;
}

static int batch_bench(const char *path, const llm_backend_spec *spec, const char *list, int ctx, int steps,
                       int prefill, int n_loras, int lora_rank)
{
    llm_error err = {0};
    dev_bench d = {.n_ranks = spec->n_ranks > 0 ? spec->n_ranks : 1};
    int rc = 1;
    if (llm_model_load(path, &d.m, &err) || llm_backends_open(spec, d.b, &err) ||
        loras_make(&d, path, n_loras, lora_rank, &err))
        goto out;
    size_t emb = (size_t)d.m->tok_embd.rows * d.m->tok_embd.row_bytes;
    size_t step = llm_model_weight_bytes(d.m) - (d.m->output.data == d.m->tok_embd.data ? 0 : emb);
    double pp = 0;
    if (prefill > 0 && prefill_rate(&d, prefill, &pp, &err))
        goto out;
    double params = (double)d.m->output.rows * d.m->output.cols; /* multiply-adds per token in the matmuls */
    for (int l = 0; l < d.m->hp.n_layer; l++) {
        const llm_layer *L = &d.m->layers[l];
        const llm_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) params += (double)ws[i]->rows * ws[i]->cols;
    }
    const char *base = strrchr(path, '/');
    const char *graphs = getenv("LLM_CUDA_GRAPHS");
    printf("model=%s file=%s graphs=%d type=%s backend=%s tp=%d weight_bytes=%zu decode_bytes=%zu matmul_params=%.0f "
           "prefill_tokens=%d prefill_tps=%.2f\n", d.m->name, base ? base + 1 : path, !graphs || strtol(graphs, NULL, 10) != 0,
           quant_type_name(d.m->layers[0].wq.type), d.b[0]->iface->name, d.n_ranks, llm_model_weight_bytes(d.m), step,
           params, prefill, pp);
    fflush(stdout);
    for (const char *p = list; *p;) {
        char *end;
        long b = strtol(p, &end, 10);
        if (end == p || b < 1 || b > 4096) {
            llm_errf(&err, LLM_ERR_INVALID_ARG, "--batch: '%s' is not a list of sizes 1-4096", list);
            goto out;
        }
        double tps = 0, split[2] = {0, 0};
        unsigned long long ids_hash = 0;
        if (decode_rate(&d, (int)b, ctx, steps, &tps, &ids_hash, split, &err))
            goto out;
        printf("decode_batch=%ld ctx=%d loras=%d decode_tps=%.2f step_ms=%.3f ids_hash=%llu", b, ctx, d.n_loras, tps,
               1e3 * (double)b / tps, ids_hash);
        if (split[0] > 0) /* a CPU backend: where the step went */
            printf(" matmul_share=%.3f attn_share=%.3f other_share=%.3f", split[0], split[1], 1 - split[0] - split[1]);
        printf("\n");
        fflush(stdout);
        p = *end == ',' ? end + 1 : end;
    }
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "error: %s\n", err.msg[0] ? err.msg : "out of memory");
    for (int k = 0; k < d.n_loras; k++) llm_lora_free(d.loras[k]);
    for (int r = 0; r < LLM_MAX_RANKS; r++) llm_backend_free(d.b[r]);
    llm_model_free(d.m);
    return rc;
}

/* ---- device figures through the backend interface ------------------------ */

/* Seconds of fn over a device's queue: the read of 4 bytes waits for it. */
static double timed(llm_backend *b, void (*fn)(void *), void *arg, const void *sync_src)
{
    float x;
    double t0 = cli_now();
    fn(arg);
    return llm_backend_read(b, &x, sync_src, sizeof x) ? -1 : cli_now() - t0;
}

typedef struct copy_arg {
    llm_backend *b;
    llm_kv_layer L;
} copy_arg;

static void do_copy(void *p)
{
    copy_arg *c = p;
    int32_t src = 0, dst = 1;
    llm_backend_kv_copy(c->b, &c->L, 1, &src, &dst, 1);
}

/* Device-to-device copy: 2 x 1 GiB per pass (K and V "blocks"), best of 5,
 * counting bytes read and written. */
static double device_bandwidth(llm_backend *b)
{
    size_t n = (size_t)1 << 30;
    char *k = llm_backend_buffer_alloc(b, 2 * n), *v = llm_backend_buffer_alloc(b, 2 * n);
    double best = 0;
    copy_arg c = {b, {k, v, QT_F32, 1, (int)(n / 4), n}};
    for (int r = 0; k && v && r < 6; r++) {
        double t = timed(b, do_copy, &c, k);
        if (r > 0 && t > 0 && 4.0 * (double)n / t / 1e9 > best)
            best = 4.0 * (double)n / t / 1e9;
    }
    llm_backend_buffer_free(b, k);
    llm_backend_buffer_free(b, v);
    return best;
}

typedef struct gemm_arg {
    llm_backend *b;
    llm_weight w;
    float *x, *y;
    int n_tok;
} gemm_arg;

static void do_gemm(void *p)
{
    gemm_arg *g = p;
    for (int i = 0; i < 10; i++) llm_backend_matmul(g->b, &g->w, g->x, g->n_tok, g->y);
}

/* BF16 weights (8192 x 8192) times 4096 float rows, 10 times: TFLOP/s of
 * the backend's large-batch matmul (cuBLAS on a GPU; on the host a 1024 x
 * 1024 x 256 one, for a figure within seconds). Contents are not
 * initialised on a device: the rate does not depend on the values. */
static double gemm_tflops(llm_backend *b)
{
    int host = llm_backend_host_memory(b), rows = host ? 1024 : 8192, cols = rows, n_tok = host ? 256 : 4096;
    gemm_arg g = {b, {QT_BF16, rows, cols, (size_t)cols * 2, NULL, NULL}, NULL, NULL, n_tok};
    void *w = llm_backend_buffer_alloc(b, (size_t)rows * cols * 2);
    g.x = llm_backend_buffer_alloc(b, (size_t)n_tok * cols * 4);
    g.y = llm_backend_buffer_alloc(b, (size_t)n_tok * rows * 4);
    g.w.data = w;
    double best = 0;
    if (w && g.x && g.y && host) {
        memset(w, 0, (size_t)rows * cols * 2);
        memset(g.x, 0, (size_t)n_tok * cols * 4);
    }
    for (int r = 0; w && g.x && g.y && r < 3; r++) {
        double t = timed(b, do_gemm, &g, g.y);
        if (r > 0 && t > 0 && 10 * 2.0 * rows * cols * n_tok / t / 1e12 > best)
            best = 10 * 2.0 * rows * cols * n_tok / t / 1e12;
    }
    llm_backend_buffer_free(b, w);
    llm_backend_buffer_free(b, g.x);
    llm_backend_buffer_free(b, g.y);
    return best;
}

static int device_figures(const llm_backend_spec *spec, int bw, int gemm)
{
    llm_error err = {0};
    llm_backend *b = NULL;
    llm_backend_spec one = *spec;
    one.n_ranks = 1;
    if (llm_backends_open(&one, &b, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    llm_backend_mem mem;
    llm_backend_mem_stats(b, &mem);
    double gbs = bw ? device_bandwidth(b) : 0, tf = gemm ? gemm_tflops(b) : 0;
    printf("backend=%s device=\"%s\" memory_total=%zu", b->iface->name, mem.device, mem.total);
    if (bw)
        printf(" bandwidth_gbs=%.1f", gbs);
    if (gemm)
        printf(" gemm_bf16_tflops=%.4g", tf);
    printf("\n");
    llm_backend_free(b);
    return (bw && gbs <= 0) || (gemm && tf <= 0);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *batch = NULL;
    long p = 128, n = 64, t = 1, r = 3, tp = 1, prefill = 512, loras = 0, lora_rank = 16;
    int bw = 0, gemm = 0, peak = 0;
    llm_backend_spec spec = {"cpu", 1, {0}, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--bandwidth")) { bw = 1; continue; }
        if (!strcmp(a, "--peak")) { peak = 1; continue; }
        if (!strcmp(a, "--gemm")) { gemm = 1; continue; }
        if (!strcmp(a, "-m") && v) model = v;
        else if (!strcmp(a, "--backend") && v) spec.kind = v;
        else if (!strcmp(a, "--batch") && v) batch = v;
        else if (!strcmp(a, "--tp")) { if (cli_int(a, v, 1, LLM_MAX_RANKS, &tp)) return 2; }
        else if (!strcmp(a, "--prefill")) { if (cli_int(a, v, 0, 1 << 16, &prefill)) return 2; }
        else if (!strcmp(a, "--loras")) { if (cli_int(a, v, 0, BENCH_MAX_LORAS, &loras)) return 2; }
        else if (!strcmp(a, "--lora-rank")) { if (cli_int(a, v, 1, LLM_LORA_MAX_RANK, &lora_rank)) return 2; }
        else if (!strcmp(a, "-p")) { if (cli_int(a, v, 1, 1 << 16, &p)) return 2; }
        else if (!strcmp(a, "-n")) { if (cli_int(a, v, 1, 1 << 16, &n)) return 2; }
        else if (!strcmp(a, "-t")) { if (cli_int(a, v, 1, 1024, &t)) return 2; }
        else if (!strcmp(a, "-r")) { if (cli_int(a, v, 1, 100, &r)) return 2; }
        else if (!strcmp(a, "--kv-type") && v) {
            llm_error err;
            if (llm_kv_type_parse(v, &g_kv, &err)) {
                fprintf(stderr, "error: --kv-type: %s\n", err.msg);
                return 2;
            }
        }
        else {
            fprintf(stderr, "usage: llm-bench -m MODEL.gguf [-p 128] [-n 64] [-t 1] [-r 3] [--kv-type f16|f32|q8_0] | --bandwidth [-t N] | --peak [-t N]\n"
                            "       llm-bench -m MODEL.gguf --batch 1,16,64 [--backend cpu|cuda] [--tp N] [-p CTX] [-n STEPS] [--prefill N]\n"
                            "                 [--loras N [--lora-rank R]]\n"
                            "       llm-bench --backend cuda [--bandwidth] [--gemm]\n");
            return 2;
        }
        i++;
    }
    spec.cpu.n_threads = (int)t;
    spec.n_ranks = (int)tp;
    if (strcmp(spec.kind, "cpu") && strcmp(spec.kind, "cuda")) {
        fprintf(stderr, "error: --backend: '%s' is not cpu or cuda\n", spec.kind);
        return 2;
    }
    if (gemm || (bw && strcmp(spec.kind, "cpu")))
        return device_figures(&spec, bw, gemm);
    if (batch && model)
        return batch_bench(model, &spec, batch, (int)p, (int)n, (int)prefill, (int)loras, (int)lora_rank);
    if (peak) {
        llm_backend *pb = NULL;
        llm_error err = {0};
        if (llm_backend_cpu_new(&spec.cpu, &pb, &err)) {
            fprintf(stderr, "error: %s\n", err.msg);
            return 1;
        }
        printf("int8_peak_gops=%.1f kernels=%s threads=%ld\n", llm_backend_cpu_int8_peak(pb) / 1e9,
               llm_backend_cpu_kernels(pb), t);
        llm_backend_free(pb);
        return 0;
    }
    if (bw) {
        double copy = bandwidth((int)t, 1), rd = bandwidth((int)t, 0);
        if (copy == 0 || rd == 0) {
            fprintf(stderr, "error: bandwidth test failed (no memory or threads)\n");
            return 1;
        }
        printf("bandwidth_gbs=%.2f read_gbs=%.2f threads=%ld\n", copy, rd, t);
        return 0;
    }
    if (!model) {
        fprintf(stderr, "error: -m MODEL.gguf is required\n");
        return 2;
    }
    return run(model, (int)p, (int)n, (int)t, (int)r);
}
